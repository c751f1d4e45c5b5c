//! Rendering of command results: `--output table` (columns fitted to the
//! terminal's width, plain whitespace-separated when piped), `json` (the
//! server's JSON as is, pretty-printed: stable for scripts) and `yaml` (the
//! same document as YAML).
//!
//! A command hands back a [`Shown`]: the JSON value plus a [`View`] saying
//! how a table of it looks. Writes hand back a message, printed only in
//! table mode (JSON / YAML print nothing for a write; the exit code says it
//! worked).

use comfy_table::{ContentArrangement, Table, presets};
use serde_json::Value;

/// The output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Human-readable table.
    Table,
    /// Pretty JSON: the REST API's shape.
    Json,
    /// YAML of the same document.
    Yaml,
}

/// How a value looks as a table.
#[derive(Debug, Clone)]
pub enum View {
    /// An array of strings: one column with this header.
    List(&'static str),
    /// An array of objects: one row each, these (header, JSON key) columns.
    Rows(Vec<(&'static str, &'static str)>),
    /// An object: KEY / VALUE rows, nested values as compact JSON.
    Object,
    /// An object of objects (`{name: {...}}`): a NAME column then these
    /// (header, key) columns.
    Map(&'static str, Vec<(&'static str, &'static str)>),
    /// Several sections, each a title and a view of one member (`""` = the
    /// whole value, [`SCALARS`] = its scalar members).
    Sections(Vec<(&'static str, &'static str, View)>),
}

/// The [`View::Sections`] key of an object's scalar members.
pub const SCALARS: &str = "@scalars";

/// What a command shows.
#[derive(Debug, Clone)]
pub enum Shown {
    /// A document and its table view.
    Value(Value, View),
    /// A write's confirmation: printed in table mode only.
    Done(String),
}

/// The text to print for `shown` in `format` (empty: print nothing).
pub fn render(shown: &Shown, format: Format) -> String {
    match (shown, format) {
        (Shown::Done(msg), Format::Table) => msg.clone(),
        (Shown::Done(_), _) => String::new(),
        (Shown::Value(v, _), Format::Json) => {
            serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
        }
        (Shown::Value(v, _), Format::Yaml) => serde_norway::to_string(v)
            .unwrap_or_else(|_| v.to_string())
            .trim_end()
            .to_string(),
        (Shown::Value(v, view), Format::Table) => table(v, view),
    }
}

/// A cell's text: strings bare, null and empty strings as `-` (columns stay
/// splittable on whitespace), the rest compact JSON.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) if s.is_empty() => "-".to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    }
}

fn new_table(header: Vec<String>) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    t
}

/// Looks `key` up, a dotted path for nested members (`a.b`).
fn member<'a>(v: &'a Value, key: &str) -> &'a Value {
    key.split('.')
        .fold(v, |v, k| v.get(k).unwrap_or(&Value::Null))
}

fn finish(t: Table) -> String {
    t.to_string()
        .lines()
        .map(str::trim_end)
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

fn table(v: &Value, view: &View) -> String {
    match view {
        View::List(header) => {
            let mut t = new_table(vec![header.to_string()]);
            for x in v.as_array().into_iter().flatten() {
                t.add_row(vec![cell(x)]);
            }
            finish(t)
        }
        View::Rows(cols) => {
            let mut t = new_table(cols.iter().map(|(h, _)| h.to_string()).collect());
            for x in v.as_array().into_iter().flatten() {
                t.add_row(
                    cols.iter()
                        .map(|(_, k)| cell(member(x, k)))
                        .collect::<Vec<_>>(),
                );
            }
            finish(t)
        }
        View::Object => {
            let mut t = new_table(vec!["KEY".into(), "VALUE".into()]);
            match v.as_object() {
                Some(o) => {
                    for (k, x) in o {
                        t.add_row(vec![k.clone(), cell(x)]);
                    }
                }
                None => {
                    t.add_row(vec!["value".to_string(), cell(v)]);
                }
            }
            finish(t)
        }
        View::Map(name, cols) => {
            let mut header = vec![name.to_string()];
            header.extend(cols.iter().map(|(h, _)| h.to_string()));
            let mut t = new_table(header);
            for (k, x) in v.as_object().into_iter().flatten() {
                let mut row = vec![k.clone()];
                row.extend(cols.iter().map(|(_, c)| cell(member(x, c))));
                t.add_row(row);
            }
            finish(t)
        }
        View::Sections(parts) => parts
            .iter()
            .map(|(title, key, view)| {
                let text = match *key {
                    "" => table(v, view),
                    SCALARS => table(&scalars(v), view),
                    k => table(member(v, k), view),
                };
                format!("{title}:\n{text}")
            })
            .collect::<Vec<_>>()
            .join("\n\n"),
    }
}

/// The scalar members of an object (what [`View::Object`] shows best as a
/// summary next to sections for the nested ones).
pub fn scalars(v: &Value) -> Value {
    match v.as_object() {
        Some(o) => Value::Object(
            o.iter()
                .filter(|(_, x)| !x.is_object() && !x.is_array())
                .map(|(k, x)| (k.clone(), x.clone()))
                .collect(),
        ),
        None => v.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_render_one_column_with_a_header() {
        let s = Shown::Value(json!(["a", "bb"]), View::List("TENANT"));
        let out = render(&s, Format::Table);
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        assert_eq!(lines, vec!["TENANT", "a", "bb"]);
    }

    #[test]
    fn rows_pick_columns_and_show_null_as_dash() {
        let v = json!([{"id": "b1", "rack": null, "state": "available", "x": 1}]);
        let s = Shown::Value(
            v,
            View::Rows(vec![("ID", "id"), ("RACK", "rack"), ("STATE", "state")]),
        );
        let out = render(&s, Format::Table);
        let rows: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            vec![vec!["ID", "RACK", "STATE"], vec!["b1", "-", "available"]]
        );
    }

    #[test]
    fn maps_and_nested_members() {
        let v = json!({"s1": {"type": "Shared", "c": {"n": 2}}});
        let s = Shown::Value(
            v,
            View::Map("SUBSCRIPTION", vec![("TYPE", "type"), ("N", "c.n")]),
        );
        let out = render(&s, Format::Table);
        let rows: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            vec![vec!["SUBSCRIPTION", "TYPE", "N"], vec!["s1", "Shared", "2"]]
        );
    }

    #[test]
    fn json_is_the_document_and_writes_print_nothing() {
        let v = json!({"b": 1, "a": [1, 2]});
        let out = render(&Shown::Value(v.clone(), View::Object), Format::Json);
        assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), v);
        assert_eq!(render(&Shown::Done("ok".into()), Format::Json), "");
        assert_eq!(render(&Shown::Done("ok".into()), Format::Table), "ok");
    }

    #[test]
    fn yaml_round_trips() {
        let v = json!({"adminRoles": ["r"], "allowedClusters": []});
        let out = render(&Shown::Value(v.clone(), View::Object), Format::Yaml);
        let back: Value = serde_norway::from_str(&out).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn cells() {
        assert_eq!(cell(&json!(null)), "-");
        assert_eq!(cell(&json!("")), "-");
        assert_eq!(cell(&json!(["a", "b"])), "a,b");
        assert_eq!(cell(&json!({"k": 1})), r#"{"k":1}"#);
        assert_eq!(cell(&json!(5)), "5");
    }
}
