//! The schema registry (Pulsar's `SchemaRegistry`): per-topic schema
//! versions stored under `/cms/schemas/<tenant>/<ns>/<topic>` (DESIGN §3),
//! and the compatibility rules that decide whether a new schema may become a
//! new version.
//!
//! Layout: [`avro`] parses Avro definitions and checks Avro resolution;
//! this file holds the data model ([`SchemaData`], [`SchemaVersion`],
//! [`SchemaHistory`]), the strategies ([`Strategy`]) and the pure decisions
//! ([`decide_producer`], [`check_reader`]); [`registry`] reads and CAS-updates
//! the metadata node.
//!
//! Promises:
//! - a topic (all partitions of a partitioned topic share one) has versions
//!   0, 1, 2, ... that never change once written; the same type and data get
//!   the version they already have;
//! - a new schema becomes a version only when the namespace strategy
//!   (default FULL) accepts it against the latest version (all versions for
//!   the `_TRANSITIVE` strategies) and auto-update is allowed; otherwise
//!   [`SchemaError::Incompatible`] with the reason;
//! - AVRO and JSON (Avro-format definitions, as Pulsar clients send) follow
//!   Avro resolution; PROTOBUF and other types with data are stored opaquely
//!   (a change of their data is accepted unless the strategy is
//!   ALWAYS_INCOMPATIBLE); a change of type is refused unless the strategy
//!   is ALWAYS_COMPATIBLE;
//! - bounded: schema data at most [`SCHEMA_DATA_BYTES_MAX`], at most
//!   [`VERSIONS_MAX`] versions, the stored node at most the store's node limit.

pub mod avro;
pub mod registry;
pub mod wire;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Largest schema definition accepted, in bytes.
pub const SCHEMA_DATA_BYTES_MAX: usize = 64 * 1024;
/// Most versions a topic's schema history keeps.
pub const VERSIONS_MAX: usize = 100;
/// Most properties of one schema.
pub const PROPERTIES_MAX: usize = 64;

/// Why a schema operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The schema is not compatible, or not valid (Pulsar `IncompatibleSchema`).
    #[error("incompatible schema: {0}")]
    Incompatible(String),
    /// A bound was hit or the input is malformed.
    #[error("{0}")]
    Invalid(String),
    /// No schema (or no such version).
    #[error("{0}")]
    NotFound(String),
    /// The metadata store failed or holds corrupt data.
    #[error("schema metadata: {0}")]
    Metadata(String),
}

/// Schema types by their Pulsar names (the protocol's `Schema.Type` numbers).
pub const TYPE_NAMES: [(&str, i32); 21] = [
    ("NONE", 0),
    ("STRING", 1),
    ("JSON", 2),
    ("PROTOBUF", 3),
    ("AVRO", 4),
    ("BOOLEAN", 5),
    ("INT8", 6),
    ("INT16", 7),
    ("INT32", 8),
    ("INT64", 9),
    ("FLOAT", 10),
    ("DOUBLE", 11),
    ("DATE", 12),
    ("TIME", 13),
    ("TIMESTAMP", 14),
    ("KEY_VALUE", 15),
    ("INSTANT", 16),
    ("LOCAL_DATE", 17),
    ("LOCAL_TIME", 18),
    ("LOCAL_DATE_TIME", 19),
    ("PROTOBUF_NATIVE", 20),
];

/// The Pulsar name of protocol schema type `t`.
pub fn type_name(t: i32) -> Option<&'static str> {
    TYPE_NAMES.iter().find(|(_, n)| *n == t).map(|(s, _)| *s)
}

/// The protocol number of a Pulsar schema type name (`BYTES` is `NONE`).
pub fn type_number(name: &str) -> Option<i32> {
    let up = name.to_ascii_uppercase();
    if up == "BYTES" {
        return Some(0);
    }
    TYPE_NAMES.iter().find(|(s, _)| *s == up).map(|(_, n)| *n)
}

/// A schema as a client or admin gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaData {
    /// Pulsar type name (`AVRO`, `JSON`, `STRING`, ...).
    #[serde(rename = "type")]
    pub type_name: String,
    /// The definition (UTF-8 text for AVRO / JSON; hex in `data_hex` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Non-UTF-8 definitions, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_hex: Option<String>,
    /// Schema properties.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

impl SchemaData {
    /// A schema from the protocol's parts, checked against the bounds.
    pub fn new(
        type_number: i32,
        data: &[u8],
        properties: BTreeMap<String, String>,
    ) -> Result<SchemaData, SchemaError> {
        let type_name = type_name(type_number)
            .ok_or_else(|| SchemaError::Invalid(format!("unknown schema type {type_number}")))?;
        if data.len() > SCHEMA_DATA_BYTES_MAX {
            return Err(SchemaError::Invalid(format!(
                "schema data of {} bytes is larger than {SCHEMA_DATA_BYTES_MAX}",
                data.len()
            )));
        }
        if properties.len() > PROPERTIES_MAX {
            return Err(SchemaError::Invalid(format!(
                "more than {PROPERTIES_MAX} schema properties"
            )));
        }
        let (data, data_hex) = match std::str::from_utf8(data) {
            Ok(s) => (Some(s.to_string()), None),
            Err(_) => (
                None,
                Some(data.iter().map(|b| format!("{b:02x}")).collect()),
            ),
        };
        Ok(SchemaData {
            type_name: type_name.to_string(),
            data,
            data_hex,
            properties,
        })
    }

    /// The protocol type number.
    pub fn type_number(&self) -> i32 {
        type_number(&self.type_name).unwrap_or(0)
    }

    /// The definition's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        if let Some(d) = &self.data {
            return d.as_bytes().to_vec();
        }
        let hex = self.data_hex.as_deref().unwrap_or("");
        (0..hex.len() / 2)
            .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
            .collect()
    }

    /// Same type and same definition (properties do not count, as in Pulsar).
    pub fn same_as(&self, other: &SchemaData) -> bool {
        self.type_number() == other.type_number() && self.bytes() == other.bytes()
    }

    /// Whether this is "no schema" (NONE / BYTES).
    pub fn is_bytes(&self) -> bool {
        self.type_number() == 0
    }
}

/// One stored version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaVersion {
    /// Version number (0, 1, ...).
    pub version: u64,
    /// The schema.
    #[serde(flatten)]
    pub schema: SchemaData,
    /// CRC32C of type and data, hex (for display).
    pub hash: String,
    /// When it was stored, ms since the epoch.
    pub timestamp_ms: u64,
}

/// A topic's schema history, as stored in its metadata node.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SchemaHistory {
    /// The version the next new schema gets (survives a delete, as in Pulsar).
    pub next_version: u64,
    /// Live versions, oldest first (empty after a delete).
    pub versions: Vec<SchemaVersion>,
}

impl SchemaHistory {
    /// The latest version.
    pub fn latest(&self) -> Option<&SchemaVersion> {
        self.versions.last()
    }

    /// Version `v`.
    pub fn get(&self, v: u64) -> Option<&SchemaVersion> {
        self.versions.iter().find(|x| x.version == v)
    }

    /// The version holding the same schema, if any.
    pub fn find(&self, s: &SchemaData) -> Option<&SchemaVersion> {
        self.versions.iter().find(|x| x.schema.same_as(s))
    }
}

/// Pulsar's `SchemaCompatibilityStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Any new schema is accepted.
    AlwaysCompatible,
    /// No new schema is accepted.
    AlwaysIncompatible,
    /// The new schema reads data of the latest.
    Backward,
    /// The latest reads data of the new schema.
    Forward,
    /// Both.
    Full,
    /// Backward against every version.
    BackwardTransitive,
    /// Forward against every version.
    ForwardTransitive,
    /// Full against every version.
    FullTransitive,
}

impl Strategy {
    /// The broker default (Pulsar's `schemaCompatibilityStrategy=FULL`).
    pub const DEFAULT: Strategy = Strategy::Full;

    /// Parses a Pulsar strategy name; `UNDEFINED` is the default.
    pub fn parse(s: &str) -> Result<Strategy, String> {
        // One list of names, shared with the policy validation.
        Ok(match cms_admin_types::policies::schema_strategy_name(s)? {
            "UNDEFINED" => Strategy::DEFAULT,
            "ALWAYS_COMPATIBLE" => Strategy::AlwaysCompatible,
            "ALWAYS_INCOMPATIBLE" => Strategy::AlwaysIncompatible,
            "BACKWARD" => Strategy::Backward,
            "FORWARD" => Strategy::Forward,
            "FULL" => Strategy::Full,
            "BACKWARD_TRANSITIVE" => Strategy::BackwardTransitive,
            "FORWARD_TRANSITIVE" => Strategy::ForwardTransitive,
            "FULL_TRANSITIVE" => Strategy::FullTransitive,
            other => return Err(format!("unknown schema compatibility strategy {other:?}")),
        })
    }

    fn transitive(self) -> bool {
        matches!(
            self,
            Strategy::BackwardTransitive | Strategy::ForwardTransitive | Strategy::FullTransitive
        )
    }

    fn backward(self) -> bool {
        matches!(
            self,
            Strategy::Backward
                | Strategy::Full
                | Strategy::BackwardTransitive
                | Strategy::FullTransitive
        )
    }

    fn forward(self) -> bool {
        matches!(
            self,
            Strategy::Forward
                | Strategy::Full
                | Strategy::ForwardTransitive
                | Strategy::FullTransitive
        )
    }
}

/// The namespace settings the registry obeys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Compatibility strategy.
    pub strategy: Strategy,
    /// Whether a producer may add a new version (`is_allow_auto_update_schema`).
    pub allow_auto_update: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            strategy: Strategy::DEFAULT,
            allow_auto_update: true,
        }
    }
}

/// Whether data written with `writer` can be read with `reader` (both of the
/// same type), `Err` with the reason if not.
pub fn readable(reader: &SchemaData, writer: &SchemaData) -> Result<(), String> {
    if reader.type_number() != writer.type_number() {
        return Err(format!(
            "schema type {} cannot read data of type {}",
            reader.type_name, writer.type_name
        ));
    }
    match reader.type_name.as_str() {
        "AVRO" | "JSON" => {
            let r = avro::parse(&reader.bytes());
            let w = avro::parse(&writer.bytes());
            match (r, w) {
                (Ok(r), Ok(w)) => avro::can_read(&r, &w),
                // A JSON schema that is not an Avro definition (old clients):
                // compared as opaque text.
                (Err(e), _) | (_, Err(e)) if reader.type_name == "AVRO" => {
                    Err(format!("invalid Avro schema: {e}"))
                }
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// What a producer's schema gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// It is stored already: this version.
    Existing(u64),
    /// It is accepted as a new version.
    Add,
}

/// Decides a producer's (or admin upload's) schema against the history.
pub fn decide_producer(
    history: &SchemaHistory,
    new: &SchemaData,
    settings: Settings,
) -> Result<Decision, SchemaError> {
    if let Some(v) = history.find(new) {
        return Ok(Decision::Existing(v.version));
    }
    if new.type_name == "AVRO" {
        avro::parse(&new.bytes())
            .map_err(|e| SchemaError::Incompatible(format!("invalid Avro schema: {e}")))?;
    }
    let Some(latest) = history.latest() else {
        return Ok(Decision::Add);
    };
    if !settings.allow_auto_update {
        return Err(SchemaError::Incompatible(format!(
            "the schema differs from version {} and schema auto-update is disabled for the namespace",
            latest.version
        )));
    }
    let strategy = settings.strategy;
    match strategy {
        Strategy::AlwaysCompatible => return Ok(Decision::Add),
        Strategy::AlwaysIncompatible => {
            return Err(SchemaError::Incompatible(format!(
                "the schema differs from version {} and the strategy is ALWAYS_INCOMPATIBLE",
                latest.version
            )));
        }
        _ => {}
    }
    let against: Vec<&SchemaVersion> = if strategy.transitive() {
        history.versions.iter().rev().collect()
    } else {
        vec![latest]
    };
    for old in against {
        if strategy.backward() {
            readable(new, &old.schema).map_err(|e| {
                SchemaError::Incompatible(format!(
                    "the new schema cannot read data written with version {} ({strategy:?}): {e}",
                    old.version
                ))
            })?;
        }
        if strategy.forward() {
            readable(&old.schema, new).map_err(|e| {
                SchemaError::Incompatible(format!(
                    "version {} cannot read data written with the new schema ({strategy:?}): {e}",
                    old.version
                ))
            })?;
        }
    }
    Ok(Decision::Add)
}

/// Checks a consumer's schema can read the topic's data: the latest version
/// (every version for the `_TRANSITIVE` strategies); a stored schema is
/// always accepted.
pub fn check_reader(
    history: &SchemaHistory,
    reader: &SchemaData,
    strategy: Strategy,
) -> Result<(), SchemaError> {
    if history.find(reader).is_some() || strategy == Strategy::AlwaysCompatible {
        return Ok(());
    }
    let against: Vec<&SchemaVersion> = if strategy.transitive() {
        history.versions.iter().rev().collect()
    } else {
        history.latest().into_iter().collect()
    };
    for old in against {
        readable(reader, &old.schema).map_err(|e| {
            SchemaError::Incompatible(format!(
                "the consumer's schema cannot read data written with version {}: {e}",
                old.version
            ))
        })?;
    }
    Ok(())
}

/// A version number as the protocol carries it (8 bytes, big-endian, as Pulsar).
pub fn version_bytes(v: u64) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

/// The version number of protocol bytes (8 bytes big-endian; shorter is
/// read as a big-endian number too).
pub fn version_from_bytes(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 8 {
        return None;
    }
    Some(b.iter().fold(0u64, |acc, x| (acc << 8) | u64::from(*x)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avro(fields: &str) -> SchemaData {
        let text = format!(r#"{{"type":"record","name":"R","fields":[{fields}]}}"#);
        SchemaData::new(4, text.as_bytes(), BTreeMap::new()).unwrap()
    }

    fn history(schemas: &[SchemaData]) -> SchemaHistory {
        SchemaHistory {
            next_version: schemas.len() as u64,
            versions: schemas
                .iter()
                .enumerate()
                .map(|(i, s)| SchemaVersion {
                    version: i as u64,
                    schema: s.clone(),
                    hash: String::new(),
                    timestamp_ms: 0,
                })
                .collect(),
        }
    }

    const A: &str = r#"{"name":"a","type":"string"}"#;
    const B_DEF: &str = r#"{"name":"b","type":"int","default":1}"#;
    const B: &str = r#"{"name":"b","type":"int"}"#;
    const C: &str = r#"{"name":"c","type":"int"}"#;

    fn with(s: Strategy) -> Settings {
        Settings {
            strategy: s,
            allow_auto_update: true,
        }
    }

    #[test]
    fn strategy_table() {
        use Strategy::*;
        let v1 = avro(A);
        let added_def = avro(&format!("{A},{B_DEF}"));
        let added_no_def = avro(&format!("{A},{B}"));
        let a_int = avro(r#"{"name":"a","type":"int"}"#);
        let rows: Vec<(&str, Strategy, SchemaData, bool)> = vec![
            ("FULL: added with default", Full, added_def.clone(), true),
            (
                "FULL: added without default",
                Full,
                added_no_def.clone(),
                false,
            ),
            ("FULL: type changed", Full, a_int.clone(), false),
            (
                "BACKWARD: added without default",
                Backward,
                added_no_def.clone(),
                false,
            ),
            (
                "FORWARD: added without default",
                Forward,
                added_no_def.clone(),
                true,
            ),
            (
                "ALWAYS_COMPATIBLE: type changed",
                AlwaysCompatible,
                a_int.clone(),
                true,
            ),
            (
                "ALWAYS_INCOMPATIBLE: added with default",
                AlwaysIncompatible,
                added_def.clone(),
                false,
            ),
            (
                "FULL: other type",
                Full,
                SchemaData::new(1, b"", BTreeMap::new()).unwrap(),
                false,
            ),
        ];
        for (what, s, new, expect) in rows {
            let r = decide_producer(&history(std::slice::from_ref(&v1)), &new, with(s));
            assert_eq!(r.is_ok(), expect, "{what}: {r:?}");
            if let Err(e) = r {
                assert!(matches!(e, SchemaError::Incompatible(_)), "{what}");
            }
        }
    }

    #[test]
    fn transitive_checks_every_version() {
        // v0 {a}, v1 {a, b=1}: new {a, c} without default... use {a, b(no default)}:
        // readable from v1 (has b) but not from v0.
        let h = history(&[avro(A), avro(&format!("{A},{B_DEF}"))]);
        let new = avro(&format!("{A},{B}"));
        assert!(decide_producer(&h, &new, with(Strategy::Backward)).is_ok());
        assert!(decide_producer(&h, &new, with(Strategy::BackwardTransitive)).is_err());
        let _ = C;
    }

    #[test]
    fn same_schema_gets_its_version_and_first_is_added() {
        let v1 = avro(A);
        let h = history(&[v1.clone(), avro(&format!("{A},{B_DEF}"))]);
        assert_eq!(
            decide_producer(&h, &v1, with(Strategy::AlwaysIncompatible)),
            Ok(Decision::Existing(0))
        );
        assert_eq!(
            decide_producer(&SchemaHistory::default(), &v1, Settings::default()),
            Ok(Decision::Add)
        );
    }

    #[test]
    fn auto_update_disabled_refuses_new_versions() {
        let h = history(&[avro(A)]);
        let s = Settings {
            strategy: Strategy::AlwaysCompatible,
            allow_auto_update: false,
        };
        assert!(matches!(
            decide_producer(&h, &avro(&format!("{A},{B_DEF}")), s),
            Err(SchemaError::Incompatible(_))
        ));
    }

    #[test]
    fn invalid_avro_is_refused() {
        let bad = SchemaData::new(4, b"{not avro", BTreeMap::new()).unwrap();
        assert!(decide_producer(&SchemaHistory::default(), &bad, Settings::default()).is_err());
    }

    #[test]
    fn consumer_reader_check() {
        let h = history(&[avro(&format!("{A},{B_DEF}"))]);
        assert!(check_reader(&h, &avro(A), Strategy::Full).is_ok());
        assert!(check_reader(&h, &avro(&format!("{A},{C}")), Strategy::Full).is_err());
        assert!(check_reader(&h, &avro(&format!("{A},{C}")), Strategy::AlwaysCompatible).is_ok());
    }

    #[test]
    fn bounds_and_encoding() {
        let big = vec![b'x'; SCHEMA_DATA_BYTES_MAX + 1];
        assert!(SchemaData::new(4, &big, BTreeMap::new()).is_err());
        assert!(SchemaData::new(99, b"", BTreeMap::new()).is_err());
        let bin = SchemaData::new(3, &[0xff, 0x00, 0x10], BTreeMap::new()).unwrap();
        assert_eq!(bin.bytes(), vec![0xff, 0x00, 0x10]);
        assert_eq!(version_from_bytes(&version_bytes(7)), Some(7));
        assert_eq!(version_from_bytes(&[]), None);
        assert_eq!(type_number("bytes"), Some(0));
        assert_eq!(
            Strategy::parse("full_transitive"),
            Ok(Strategy::FullTransitive)
        );
        assert!(Strategy::parse("nope").is_err());
    }
}
