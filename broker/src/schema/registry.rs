//! The schema registry's storage: one metadata node per topic,
//! `/cms/schemas/<tenant>/<ns>/<topic>`, holding its [`SchemaHistory`] as
//! JSON. Partitions share the node of their partitioned topic, and the
//! domain does not count (as Pulsar's schema id `tenant/ns/topic`).
//!
//! Promises: every change is a read-decide-CAS on the node version, retried
//! at most [`CAS_RETRIES_MAX`] times, so two brokers adding schemas at once
//! never lose a version or give one number to two schemas; a node larger
//! than the store's limit is refused before writing; the namespace settings
//! (strategy, auto-update) are read from its policies on every change.

use std::time::{SystemTime, UNIX_EPOCH};

use cms_bookie::metadata::layout::Layout;
use cms_bookie::metadata::{
    CreateMode, Expected, MetadataError, MetadataStore, NODE_DATA_BYTES_MAX, Version, join,
    parent_of,
};
use tracing::info;

use super::{
    Decision, SchemaData, SchemaError, SchemaHistory, SchemaVersion, Settings, Strategy,
    VERSIONS_MAX, check_reader, decide_producer,
};
use crate::topic_name::TopicName;

/// Read-decide-CAS attempts before giving up.
pub const CAS_RETRIES_MAX: usize = 16;

fn meta(e: MetadataError) -> SchemaError {
    SchemaError::Metadata(e.to_string())
}

/// The node of `topic`'s schemas (a partition's is its partitioned topic's).
pub fn schema_path(layout: &Layout, topic: &TopicName) -> String {
    let base = crate::partitioned::partition_of(topic)
        .map(|(b, _)| b)
        .unwrap_or_else(|| topic.clone());
    join(
        &join(&join(&layout.schemas(), &base.tenant), &base.namespace),
        &base.local,
    )
}

/// The registry settings of `topic`'s namespace (defaults if it has none).
pub async fn settings(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
) -> Result<Settings, SchemaError> {
    let p = crate::tenancy::namespace_policies(store, layout, &topic.tenant, &topic.namespace)
        .await
        .map_err(|e| SchemaError::Metadata(e.to_string()))?
        .unwrap_or_default();
    let strategy = match p.schema_compatibility_strategy.as_deref() {
        Some(s) => Strategy::parse(s).map_err(SchemaError::Metadata)?,
        None => Strategy::DEFAULT,
    };
    Ok(Settings {
        strategy,
        allow_auto_update: p.is_allow_auto_update_schema.unwrap_or(true),
    })
}

/// The topic's history and its node version, or None if it never had a schema.
pub async fn load(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
) -> Result<Option<(SchemaHistory, Version)>, SchemaError> {
    let path = schema_path(layout, topic);
    match store.get(&path).await {
        Ok((data, stat)) => {
            let h = serde_json::from_slice(&data)
                .map_err(|e| SchemaError::Metadata(format!("corrupt node {path}: {e}")))?;
            Ok(Some((h, stat.version)))
        }
        Err(MetadataError::NoNode(_)) => Ok(None),
        Err(e) => Err(meta(e)),
    }
}

/// Version `version` (latest when None) of the topic's schema.
pub async fn get(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
    version: Option<u64>,
) -> Result<SchemaVersion, SchemaError> {
    let h = load(store, layout, topic)
        .await?
        .map(|(h, _)| h)
        .unwrap_or_default();
    let found = match version {
        Some(v) => h.get(v),
        None => h.latest(),
    };
    found.cloned().ok_or_else(|| match version {
        Some(v) => SchemaError::NotFound(format!("topic {topic} has no schema version {v}")),
        None => SchemaError::NotFound(format!("topic {topic} has no schema")),
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn hash(s: &SchemaData) -> String {
    let mut buf = s.type_name.as_bytes().to_vec();
    buf.push(0);
    buf.extend_from_slice(&s.bytes());
    format!("{:08x}", crc32c::crc32c(&buf))
}

/// Writes `h` with CAS on `version` (create when None). `Ok(false)` when
/// another writer came first.
async fn write(
    store: &dyn MetadataStore,
    path: &str,
    h: &SchemaHistory,
    version: Option<Version>,
) -> Result<bool, SchemaError> {
    let data = serde_json::to_vec(h).map_err(|e| SchemaError::Metadata(e.to_string()))?;
    if data.len() > NODE_DATA_BYTES_MAX {
        return Err(SchemaError::Invalid(format!(
            "the topic's schema history would take {} bytes, more than the {NODE_DATA_BYTES_MAX} a metadata node holds; delete the schema first",
            data.len()
        )));
    }
    let r = match version {
        Some(v) => store
            .set(path, &data, Expected::Version(v))
            .await
            .map(|_| ()),
        None => {
            if let Some(parent) = parent_of(path) {
                store.create_all(parent).await.map_err(meta)?;
            }
            store
                .create(path, &data, CreateMode::Persistent)
                .await
                .map(|_| ())
        }
    };
    match r {
        Ok(()) => Ok(true),
        Err(
            MetadataError::BadVersion { .. }
            | MetadataError::NodeExists(_)
            | MetadataError::NoNode(_),
        ) => Ok(false),
        Err(e) => Err(meta(e)),
    }
}

/// Adds `schema` to the topic's history if `settings` accept it; returns its
/// version (the existing one for a stored schema).
pub async fn put(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
    schema: &SchemaData,
    settings: Settings,
) -> Result<u64, SchemaError> {
    let path = schema_path(layout, topic);
    for _ in 0..CAS_RETRIES_MAX {
        let (mut h, version) = match load(store, layout, topic).await? {
            Some((h, v)) => (h, Some(v)),
            None => (SchemaHistory::default(), None),
        };
        match decide_producer(&h, schema, settings)? {
            Decision::Existing(v) => return Ok(v),
            Decision::Add => {}
        }
        if h.versions.len() >= VERSIONS_MAX {
            return Err(SchemaError::Invalid(format!(
                "topic {topic} has {VERSIONS_MAX} schema versions already; delete the schema first"
            )));
        }
        let v = h.next_version;
        h.versions.push(SchemaVersion {
            version: v,
            schema: schema.clone(),
            hash: hash(schema),
            timestamp_ms: now_ms(),
        });
        h.next_version = v + 1;
        if write(store, &path, &h, version).await? {
            info!(
                tenant = %topic.tenant,
                namespace = %topic.namespace,
                topic = %topic,
                version = v,
                schema_type = %schema.type_name,
                "schema version added"
            );
            return Ok(v);
        }
    }
    Err(SchemaError::Metadata(format!(
        "schema of {topic} changed concurrently {CAS_RETRIES_MAX} times; retry"
    )))
}

/// A producer's schema: its version, added under the namespace settings.
pub async fn get_or_create(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
    schema: &SchemaData,
) -> Result<u64, SchemaError> {
    let s = settings(store, layout, topic).await?;
    put(store, layout, topic, schema, s).await
}

/// A consumer's schema: registered when the topic has none, else it must be
/// able to read the topic's data. Returns the version when it is stored.
pub async fn check_consumer(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
    schema: &SchemaData,
) -> Result<Option<u64>, SchemaError> {
    let s = settings(store, layout, topic).await?;
    match load(store, layout, topic).await? {
        Some((h, _)) if !h.versions.is_empty() => {
            check_reader(&h, schema, s.strategy)?;
            Ok(h.find(schema).map(|v| v.version))
        }
        _ => put(store, layout, topic, schema, s).await.map(Some),
    }
}

/// Deletes the topic's schema (its version numbers are not reused); returns
/// the latest version deleted, None if there was none.
pub async fn delete(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
) -> Result<Option<u64>, SchemaError> {
    let path = schema_path(layout, topic);
    for _ in 0..CAS_RETRIES_MAX {
        let Some((mut h, version)) = load(store, layout, topic).await? else {
            return Ok(None);
        };
        let Some(latest) = h.latest().map(|v| v.version) else {
            return Ok(None);
        };
        h.versions.clear();
        if write(store, &path, &h, Some(version)).await? {
            info!(tenant = %topic.tenant, namespace = %topic.namespace, topic = %topic, "schema deleted");
            return Ok(Some(latest));
        }
    }
    Err(SchemaError::Metadata(format!(
        "schema of {topic} changed concurrently {CAS_RETRIES_MAX} times; retry"
    )))
}

/// Removes the topic's history node altogether (the topic is deleted: a
/// later schema starts again at version 0); absent is fine.
pub async fn remove(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
) -> Result<(), SchemaError> {
    match store
        .delete(&schema_path(layout, topic), Expected::Any)
        .await
    {
        Ok(()) | Err(MetadataError::NoNode(_)) => Ok(()),
        Err(e) => Err(meta(e)),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use cms_bookie::metadata::embedded::EmbeddedStore;

    use super::*;

    fn avro(fields: &str) -> SchemaData {
        let text = format!(r#"{{"type":"record","name":"R","fields":[{fields}]}}"#);
        SchemaData::new(4, text.as_bytes(), BTreeMap::new()).unwrap()
    }

    async fn env() -> (tempfile::TempDir, Arc<dyn MetadataStore>, Layout, TopicName) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn MetadataStore> =
            Arc::new(EmbeddedStore::open(&dir.path().join("m")).await.unwrap());
        let layout = Layout::new("/cms").unwrap();
        let topic = TopicName::parse("persistent://t/ns/x").unwrap();
        (dir, store, layout, topic)
    }

    #[tokio::test]
    async fn versions_cas_delete_and_partitions_share() {
        let (_d, store, layout, topic) = env().await;
        let s = &*store;
        let v0 = avro(r#"{"name":"a","type":"string"}"#);
        assert_eq!(get_or_create(s, &layout, &topic, &v0).await, Ok(0));
        assert_eq!(get_or_create(s, &layout, &topic, &v0).await, Ok(0));
        // Concurrent compatible additions: each gets its own number.
        let fields = |i: usize| {
            format!(r#"{{"name":"a","type":"string"}},{{"name":"f{i}","type":"int","default":0}}"#)
        };
        let schemas: Vec<SchemaData> = (0..4).map(|i| avro(&fields(i))).collect();
        let adds = schemas.iter().map(|x| {
            put(
                s,
                &layout,
                &topic,
                x,
                Settings {
                    strategy: Strategy::AlwaysCompatible,
                    allow_auto_update: true,
                },
            )
        });
        let mut got: Vec<u64> = futures::future::join_all(adds)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        got.sort_unstable();
        assert_eq!(got, vec![1, 2, 3, 4]);
        // A partition reads the partitioned topic's history.
        let p3 = TopicName::parse("persistent://t/ns/x-partition-3").unwrap();
        assert_eq!(get(s, &layout, &p3, None).await.unwrap().version, 4);
        assert_eq!(get(s, &layout, &topic, Some(0)).await.unwrap().schema, v0);
        assert!(matches!(
            get(s, &layout, &topic, Some(9)).await,
            Err(SchemaError::NotFound(_))
        ));
        // Delete: no schema, numbers not reused.
        assert_eq!(delete(s, &layout, &topic).await, Ok(Some(4)));
        assert!(matches!(
            get(s, &layout, &topic, None).await,
            Err(SchemaError::NotFound(_))
        ));
        assert_eq!(delete(s, &layout, &topic).await, Ok(None));
        assert_eq!(get_or_create(s, &layout, &topic, &v0).await, Ok(5));
        // Removed with the topic: starts again at 0.
        remove(s, &layout, &topic).await.unwrap();
        remove(s, &layout, &topic).await.unwrap();
        assert_eq!(get_or_create(s, &layout, &topic, &v0).await, Ok(0));
    }

    #[tokio::test]
    async fn consumer_registers_then_is_checked() {
        let (_d, store, layout, topic) = env().await;
        let s = &*store;
        let v = avro(r#"{"name":"a","type":"string"},{"name":"b","type":"int","default":0}"#);
        assert_eq!(check_consumer(s, &layout, &topic, &v).await, Ok(Some(0)));
        let reader = avro(r#"{"name":"a","type":"string"}"#);
        assert_eq!(check_consumer(s, &layout, &topic, &reader).await, Ok(None));
        let bad = avro(r#"{"name":"c","type":"int"}"#);
        assert!(matches!(
            check_consumer(s, &layout, &topic, &bad).await,
            Err(SchemaError::Incompatible(_))
        ));
    }
}
