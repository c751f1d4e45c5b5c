//! Avro schema parsing and Avro schema-resolution ("can a reader with schema
//! R read data written with schema W?") for the compatibility checks of the
//! schema registry.
//!
//! Promises: [`parse`] accepts the Avro JSON forms Pulsar clients send
//! (primitive names, records, enums, arrays, maps, unions, fixed, named
//! references, logical types read as their underlying type) and refuses
//! anything else with a message; [`can_read`] follows the Avro
//! specification's resolution rules: same primitive or a promotion
//! (int→long/float/double, long→float/double, float→double,
//! string↔bytes); records with the same unqualified name, where each reader
//! field is found in the writer (by name or alias) with a readable type or
//! has a default; enums whose writer symbols the reader knows (or the reader
//! has a default symbol); fixed of the same name and size; arrays and maps by
//! their items; unions branch by branch. Recursive types terminate.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// Deepest nesting of a schema definition accepted.
const DEPTH_MAX: usize = 64;

/// A parsed Avro schema: a root and the named types it defines.
#[derive(Debug, Clone, PartialEq)]
pub struct AvroSchema {
    root: Node,
    named: HashMap<String, Named>,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Array(Box<Node>),
    Map(Box<Node>),
    Union(Vec<Node>),
    /// A record, enum or fixed, by full name.
    Ref(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Named {
    Record {
        short: String,
        fields: Vec<Field>,
    },
    Enum {
        short: String,
        symbols: Vec<String>,
        default: Option<String>,
    },
    Fixed {
        short: String,
        size: u64,
    },
}

#[derive(Debug, Clone, PartialEq)]
struct Field {
    name: String,
    aliases: Vec<String>,
    ty: Node,
    has_default: bool,
}

/// Parses an Avro schema definition (JSON text).
pub fn parse(text: &[u8]) -> Result<AvroSchema, String> {
    let v: Value =
        serde_json::from_slice(text).map_err(|e| format!("not a JSON Avro definition: {e}"))?;
    let mut named = HashMap::new();
    let root = parse_node(&v, None, &mut named, 0)?;
    // Every reference must be defined somewhere in the definition.
    let mut refs = Vec::new();
    collect_refs(&root, &mut refs);
    for n in named.values() {
        if let Named::Record { fields, .. } = n {
            for f in fields {
                collect_refs(&f.ty, &mut refs);
            }
        }
    }
    if let Some(r) = refs.iter().find(|r| !named.contains_key(*r)) {
        return Err(format!("unknown type name {r:?}"));
    }
    Ok(AvroSchema { root, named })
}

fn collect_refs(n: &Node, out: &mut Vec<String>) {
    match n {
        Node::Array(i) | Node::Map(i) => collect_refs(i, out),
        Node::Union(bs) => bs.iter().for_each(|b| collect_refs(b, out)),
        Node::Ref(r) => out.push(r.clone()),
        _ => {}
    }
}

fn primitive(name: &str) -> Option<Node> {
    Some(match name {
        "null" => Node::Null,
        "boolean" => Node::Boolean,
        "int" => Node::Int,
        "long" => Node::Long,
        "float" => Node::Float,
        "double" => Node::Double,
        "bytes" => Node::Bytes,
        "string" => Node::String,
        _ => return None,
    })
}

fn full_name(name: &str, namespace: Option<&str>) -> String {
    match namespace {
        _ if name.contains('.') => name.to_string(),
        Some(ns) if !ns.is_empty() => format!("{ns}.{name}"),
        _ => name.to_string(),
    }
}

fn short_name(full: &str) -> String {
    full.rsplit('.').next().unwrap_or(full).to_string()
}

fn parse_node(
    v: &Value,
    ns: Option<&str>,
    named: &mut HashMap<String, Named>,
    depth: usize,
) -> Result<Node, String> {
    if depth > DEPTH_MAX {
        return Err(format!("schema nested deeper than {DEPTH_MAX} levels"));
    }
    match v {
        Value::String(s) => Ok(primitive(s).unwrap_or_else(|| {
            let full = full_name(s, ns);
            // A short reference inside a namespace may name a type of the
            // null namespace; resolved at the end if the qualified one is absent.
            if named.contains_key(&full) || !named.contains_key(s.as_str()) {
                Node::Ref(full)
            } else {
                Node::Ref(s.clone())
            }
        })),
        Value::Array(branches) => {
            let mut out = Vec::with_capacity(branches.len());
            for b in branches {
                let n = parse_node(b, ns, named, depth + 1)?;
                if matches!(n, Node::Union(_)) {
                    return Err("a union cannot directly contain a union".into());
                }
                out.push(n);
            }
            Ok(Node::Union(out))
        }
        Value::Object(o) => {
            let ty = o
                .get("type")
                .ok_or_else(|| "a schema object without \"type\"".to_string())?;
            let Value::String(ty) = ty else {
                // {"type": {...}} or {"type": [...]}: the nested schema.
                return parse_node(ty, ns, named, depth + 1);
            };
            if let Some(p) = primitive(ty) {
                // Logical types are read as their underlying type.
                return Ok(p);
            }
            match ty.as_str() {
                "array" => {
                    let items = o.get("items").ok_or("an array without \"items\"")?;
                    Ok(Node::Array(Box::new(parse_node(
                        items,
                        ns,
                        named,
                        depth + 1,
                    )?)))
                }
                "map" => {
                    let values = o.get("values").ok_or("a map without \"values\"")?;
                    Ok(Node::Map(Box::new(parse_node(
                        values,
                        ns,
                        named,
                        depth + 1,
                    )?)))
                }
                "record" | "error" | "enum" | "fixed" => {
                    let name = o
                        .get("name")
                        .and_then(Value::as_str)
                        .filter(|n| !n.is_empty())
                        .ok_or_else(|| format!("a {ty} without a \"name\""))?;
                    let own_ns = o.get("namespace").and_then(Value::as_str).or(ns);
                    let full = full_name(name, own_ns);
                    let inner_ns = full.rsplit_once('.').map(|(n, _)| n.to_string());
                    if named.contains_key(&full) {
                        return Err(format!("type {full:?} defined twice"));
                    }
                    let short = short_name(&full);
                    match ty.as_str() {
                        "enum" => {
                            let symbols = o
                                .get("symbols")
                                .and_then(Value::as_array)
                                .ok_or("an enum without \"symbols\"")?
                                .iter()
                                .map(|s| {
                                    s.as_str()
                                        .map(str::to_string)
                                        .ok_or_else(|| "an enum symbol is not a string".to_string())
                                })
                                .collect::<Result<Vec<_>, _>>()?;
                            let default =
                                o.get("default").and_then(Value::as_str).map(String::from);
                            named.insert(
                                full.clone(),
                                Named::Enum {
                                    short,
                                    symbols,
                                    default,
                                },
                            );
                        }
                        "fixed" => {
                            let size = o
                                .get("size")
                                .and_then(Value::as_u64)
                                .ok_or("a fixed without a numeric \"size\"")?;
                            named.insert(full.clone(), Named::Fixed { short, size });
                        }
                        _ => {
                            // Insert first so fields may refer to the record itself.
                            named.insert(
                                full.clone(),
                                Named::Record {
                                    short: short.clone(),
                                    fields: Vec::new(),
                                },
                            );
                            let raw = o
                                .get("fields")
                                .and_then(Value::as_array)
                                .ok_or("a record without \"fields\"")?;
                            let mut fields = Vec::with_capacity(raw.len());
                            let mut seen = HashSet::new();
                            for f in raw {
                                let fname = f
                                    .get("name")
                                    .and_then(Value::as_str)
                                    .ok_or("a record field without a \"name\"")?;
                                if !seen.insert(fname.to_string()) {
                                    return Err(format!("field {fname:?} defined twice"));
                                }
                                let fty = f
                                    .get("type")
                                    .ok_or_else(|| format!("field {fname:?} without \"type\""))?;
                                let ty = parse_node(fty, inner_ns.as_deref(), named, depth + 1)?;
                                let aliases = f
                                    .get("aliases")
                                    .and_then(Value::as_array)
                                    .map(|a| {
                                        a.iter()
                                            .filter_map(Value::as_str)
                                            .map(String::from)
                                            .collect()
                                    })
                                    .unwrap_or_default();
                                fields.push(Field {
                                    name: fname.to_string(),
                                    aliases,
                                    ty,
                                    has_default: f.get("default").is_some(),
                                });
                            }
                            named.insert(full.clone(), Named::Record { short, fields });
                        }
                    }
                    Ok(Node::Ref(full))
                }
                other => Ok(parse_node(
                    &Value::String(other.to_string()),
                    ns,
                    named,
                    depth + 1,
                )?),
            }
        }
        other => Err(format!("not an Avro schema: {other}")),
    }
}

/// Whether data written with `writer` can be read with `reader`; on `Err`,
/// the first reason it cannot.
pub fn can_read(reader: &AvroSchema, writer: &AvroSchema) -> Result<(), String> {
    let mut cx = Cx {
        r: reader,
        w: writer,
        assumed: HashSet::new(),
    };
    cx.check(&reader.root, &writer.root, "")
}

struct Cx<'a> {
    r: &'a AvroSchema,
    w: &'a AvroSchema,
    /// Named pairs under check (a recursive type is assumed readable inside itself).
    assumed: HashSet<(String, String)>,
}

fn describe(n: &Node) -> String {
    match n {
        Node::Null => "null".into(),
        Node::Boolean => "boolean".into(),
        Node::Int => "int".into(),
        Node::Long => "long".into(),
        Node::Float => "float".into(),
        Node::Double => "double".into(),
        Node::Bytes => "bytes".into(),
        Node::String => "string".into(),
        Node::Array(_) => "array".into(),
        Node::Map(_) => "map".into(),
        Node::Union(_) => "union".into(),
        Node::Ref(r) => r.clone(),
    }
}

impl Cx<'_> {
    fn check(&mut self, r: &Node, w: &Node, at: &str) -> Result<(), String> {
        let here = if at.is_empty() { "the root" } else { at };
        match (r, w) {
            (_, Node::Union(wb)) => {
                for b in wb {
                    self.check(r, b, at)?;
                }
                Ok(())
            }
            (Node::Union(rb), _) => {
                for b in rb {
                    let saved = self.assumed.clone();
                    if self.check(b, w, at).is_ok() {
                        return Ok(());
                    }
                    self.assumed = saved;
                }
                Err(format!(
                    "at {here}: no branch of the reader's union can read the writer's {}",
                    describe(w)
                ))
            }
            (Node::Null, Node::Null)
            | (Node::Boolean, Node::Boolean)
            | (Node::Int, Node::Int)
            | (Node::Long, Node::Long | Node::Int)
            | (Node::Float, Node::Float | Node::Long | Node::Int)
            | (Node::Double, Node::Double | Node::Float | Node::Long | Node::Int)
            | (Node::Bytes, Node::Bytes | Node::String)
            | (Node::String, Node::String | Node::Bytes) => Ok(()),
            (Node::Array(ri), Node::Array(wi)) => self.check(ri, wi, &format!("{at}[]")),
            (Node::Map(rv), Node::Map(wv)) => self.check(rv, wv, &format!("{at}{{}}")),
            (Node::Ref(rn), Node::Ref(wn)) => self.check_named(rn, wn, at),
            _ => Err(format!(
                "at {here}: the writer's {} cannot be read as {}",
                describe(w),
                describe(r)
            )),
        }
    }

    fn check_named(&mut self, rn: &str, wn: &str, at: &str) -> Result<(), String> {
        let here = if at.is_empty() { "the root" } else { at };
        if !self.assumed.insert((rn.to_string(), wn.to_string())) {
            return Ok(());
        }
        let (Some(rd), Some(wd)) = (self.r.named.get(rn), self.w.named.get(wn)) else {
            return Err(format!("at {here}: undefined type {rn} or {wn}"));
        };
        match (rd, wd) {
            (
                Named::Record {
                    short: rs,
                    fields: rf,
                },
                Named::Record {
                    short: ws,
                    fields: wf,
                },
            ) => {
                if rs != ws {
                    return Err(format!(
                        "at {here}: record {ws} cannot be read as record {rs}"
                    ));
                }
                for f in rf {
                    let found = wf
                        .iter()
                        .find(|x| x.name == f.name)
                        .or_else(|| wf.iter().find(|x| f.aliases.contains(&x.name)));
                    let path = if at.is_empty() {
                        f.name.clone()
                    } else {
                        format!("{at}.{}", f.name)
                    };
                    match found {
                        Some(x) => self.check(&f.ty, &x.ty, &path)?,
                        None if f.has_default => {}
                        None => {
                            return Err(format!(
                                "field {path:?} is missing from the writer's record {ws} and has no default in the reader's"
                            ));
                        }
                    }
                }
                Ok(())
            }
            (
                Named::Enum {
                    short: rs,
                    symbols: rsym,
                    default,
                },
                Named::Enum {
                    short: ws,
                    symbols: wsym,
                    ..
                },
            ) => {
                if rs != ws {
                    return Err(format!("at {here}: enum {ws} cannot be read as enum {rs}"));
                }
                if default.is_none()
                    && let Some(s) = wsym.iter().find(|s| !rsym.contains(s))
                {
                    return Err(format!(
                        "at {here}: the reader's enum {rs} lacks the writer's symbol {s:?} and has no default"
                    ));
                }
                Ok(())
            }
            (
                Named::Fixed {
                    short: rs,
                    size: rz,
                },
                Named::Fixed {
                    short: ws,
                    size: wz,
                },
            ) => {
                if rs != ws || rz != wz {
                    return Err(format!(
                        "at {here}: fixed {ws}({wz}) cannot be read as fixed {rs}({rz})"
                    ));
                }
                Ok(())
            }
            _ => Err(format!(
                "at {here}: the writer's {wn} cannot be read as {rn}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(fields: &str) -> String {
        format!(r#"{{"type":"record","name":"User","namespace":"ex","fields":[{fields}]}}"#)
    }

    fn ok(reader: &str, writer: &str) -> bool {
        let r = parse(reader.as_bytes()).expect("reader parses");
        let w = parse(writer.as_bytes()).expect("writer parses");
        can_read(&r, &w).is_ok()
    }

    #[test]
    fn resolution_table() {
        let name = r#"{"name":"name","type":"string"}"#;
        let age = r#"{"name":"age","type":"int"}"#;
        let age_long = r#"{"name":"age","type":"long"}"#;
        let age_str = r#"{"name":"age","type":"string"}"#;
        let age_def = r#"{"name":"age","type":"int","default":0}"#;
        let age_opt = r#"{"name":"age","type":["null","int"],"default":null}"#;
        let v1 = rec(name);
        let cases: Vec<(&str, String, String, bool)> = vec![
            ("same record", v1.clone(), v1.clone(), true),
            (
                "reader adds a field with default",
                rec(&format!("{name},{age_def}")),
                v1.clone(),
                true,
            ),
            (
                "reader adds a field without default",
                rec(&format!("{name},{age}")),
                v1.clone(),
                false,
            ),
            (
                "reader drops a field",
                v1.clone(),
                rec(&format!("{name},{age}")),
                true,
            ),
            ("int promoted to long", rec(age_long), rec(age), true),
            ("long not demoted to int", rec(age), rec(age_long), false),
            ("int to string refused", rec(age_str), rec(age), false),
            ("optional reader of int", rec(age_opt), rec(age), true),
            (
                "int reader of optional writer",
                rec(age),
                rec(age_opt),
                false,
            ),
            (
                "other record name",
                v1.clone(),
                v1.replace("\"User\"", "\"Person\""),
                false,
            ),
            (
                "enum symbol added in writer",
                r#"{"type":"enum","name":"E","symbols":["A","B"]}"#.into(),
                r#"{"type":"enum","name":"E","symbols":["A","B","C"]}"#.into(),
                false,
            ),
            (
                "enum with default",
                r#"{"type":"enum","name":"E","symbols":["A","B"],"default":"A"}"#.into(),
                r#"{"type":"enum","name":"E","symbols":["A","B","C"]}"#.into(),
                true,
            ),
            (
                "string reads bytes",
                r#""string""#.into(),
                r#""bytes""#.into(),
                true,
            ),
            (
                "array of int read as array of double",
                r#"{"type":"array","items":"double"}"#.into(),
                r#"{"type":"array","items":"int"}"#.into(),
                true,
            ),
            (
                "map of string read as map of int",
                r#"{"type":"map","values":"int"}"#.into(),
                r#"{"type":"map","values":"string"}"#.into(),
                false,
            ),
            (
                "fixed size differs",
                r#"{"type":"fixed","name":"F","size":16}"#.into(),
                r#"{"type":"fixed","name":"F","size":8}"#.into(),
                false,
            ),
            (
                "logical type read as its base",
                r#"{"type":"long","logicalType":"timestamp-millis"}"#.into(),
                r#""int""#.into(),
                true,
            ),
        ];
        for (what, r, w, expect) in cases {
            assert_eq!(ok(&r, &w), expect, "{what}");
        }
    }

    #[test]
    fn recursive_record_terminates() {
        let s = r#"{"type":"record","name":"Node","fields":[
            {"name":"v","type":"int"},
            {"name":"next","type":["null","Node"],"default":null}]}"#;
        assert!(ok(s, s));
    }

    #[test]
    fn bad_definitions_are_refused() {
        for bad in [
            "not json",
            r#"{"type":"record","fields":[]}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":"Missing"}]}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"a","type":"int"}]}"#,
            r#"{"type":"array"}"#,
            "42",
        ] {
            assert!(parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn error_names_the_field() {
        let r = parse(rec(r#"{"name":"age","type":"int"}"#).as_bytes()).unwrap();
        let w = parse(rec(r#"{"name":"name","type":"string"}"#).as_bytes()).unwrap();
        let e = can_read(&r, &w).unwrap_err();
        assert!(e.contains("\"age\""), "{e}");
    }
}
