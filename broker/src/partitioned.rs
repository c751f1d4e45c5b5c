//! Partitioned topics in the metadata store (DESIGN §3,
//! `/cms/admin/partitioned/<tenant>/<ns>/<domain>/<topic>`).
//!
//! A partitioned topic `T` with `n` partitions is a metadata node holding
//! `{"partitions": n}` (Pulsar's `PartitionedTopicMetadata` JSON shape) and
//! `n` ordinary topics `T-partition-0 .. T-partition-(n-1)`, each its own
//! managed ledger, created on first use.
//!
//! Promises:
//! - the partition count is in `1..=PARTITIONS_MAX`; a count can only grow
//!   (shrinking would orphan stored partitions, as in Pulsar);
//! - every change is a create or a compare-and-set on the node version, so
//!   two admins racing on one topic cannot both win;
//! - a name that is itself a partition (`...-partition-<i>`) cannot be made
//!   partitioned.

use cms_bookie::metadata::layout::Layout;
use cms_bookie::metadata::{CreateMode, Expected, MetadataError, MetadataStore, join};
use serde::{Deserialize, Serialize};

use crate::topic_name::{Domain, TopicName};

/// Largest partition count accepted.
pub use cms_admin_types::policies::PARTITIONS_MAX;

/// The suffix Pulsar puts between a partitioned topic's name and the index.
pub const PARTITION_SUFFIX: &str = "-partition-";

/// Content of a partitioned-topic node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionedTopicMetadata {
    /// Number of partitions.
    pub partitions: u32,
}

/// Why a partitioned-topic operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PartitionedError {
    /// The topic is already partitioned.
    #[error("partitioned topic {0} already exists")]
    AlreadyExists(String),
    /// The topic is not partitioned.
    #[error("partitioned topic {0} does not exist")]
    NotFound(String),
    /// The count or name is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// Another update won the race; read again and retry.
    #[error("partitioned topic {0} was changed concurrently")]
    Conflict(String),
    /// The store failed.
    #[error("metadata store: {0}")]
    Metadata(#[from] MetadataError),
    /// A stored node does not decode.
    #[error("corrupt node {path}: {reason}")]
    Corrupt {
        /// The node.
        path: String,
        /// Why.
        reason: String,
    },
}

/// `(base name, index)` if `topic` is a partition `<base>-partition-<i>`.
pub fn partition_of(topic: &TopicName) -> Option<(TopicName, u32)> {
    let at = topic.local.rfind(PARTITION_SUFFIX)?;
    let digits = &topic.local[at + PARTITION_SUFFIX.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let index: u32 = digits.parse().ok()?;
    let mut base = topic.clone();
    base.local = topic.local[..at].to_string();
    if base.local.is_empty() {
        return None;
    }
    Some((base, index))
}

/// The name of partition `index` of `topic`.
pub fn partition_name(topic: &TopicName, index: u32) -> TopicName {
    let mut t = topic.clone();
    t.local = format!("{}{PARTITION_SUFFIX}{index}", topic.local);
    t
}

/// Node path of a partitioned topic.
pub fn partitioned_path(layout: &Layout, topic: &TopicName) -> String {
    let ns = join(
        &join(&layout.partitioned(), &topic.tenant),
        &topic.namespace,
    );
    join(&join(&ns, topic.domain.as_str()), &topic.local)
}

fn check_count(topic: &TopicName, partitions: u32) -> Result<(), PartitionedError> {
    if partitions == 0 || partitions > PARTITIONS_MAX {
        return Err(PartitionedError::Invalid(format!(
            "partition count of {topic} must be in 1..={PARTITIONS_MAX}, got {partitions}"
        )));
    }
    Ok(())
}

fn decode(path: &str, data: &[u8]) -> Result<PartitionedTopicMetadata, PartitionedError> {
    serde_json::from_slice(data).map_err(|e| PartitionedError::Corrupt {
        path: path.to_string(),
        reason: e.to_string(),
    })
}

fn encode(partitions: u32) -> Vec<u8> {
    // A struct of one integer always serialises.
    serde_json::to_vec(&PartitionedTopicMetadata { partitions }).unwrap_or_default()
}

/// The partition count of `topic`, or None if it is not partitioned.
pub async fn partitions(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
) -> Result<Option<u32>, PartitionedError> {
    let path = partitioned_path(layout, topic);
    match store.get(&path).await {
        Ok((data, _)) => Ok(Some(decode(&path, &data)?.partitions)),
        Err(MetadataError::NoNode(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Makes `topic` partitioned with `partitions` partitions.
pub async fn create(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
    partitions: u32,
) -> Result<(), PartitionedError> {
    check_count(topic, partitions)?;
    if partition_of(topic).is_some() {
        return Err(PartitionedError::Invalid(format!(
            "{topic} is a partition name and cannot itself be partitioned"
        )));
    }
    let path = partitioned_path(layout, topic);
    if let Some(parent) = cms_bookie::metadata::parent_of(&path) {
        store.create_all(parent).await?;
    }
    match store
        .create(&path, &encode(partitions), CreateMode::Persistent)
        .await
    {
        Ok(_) => Ok(()),
        Err(MetadataError::NodeExists(_)) => {
            Err(PartitionedError::AlreadyExists(topic.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// Raises the partition count of `topic` to `partitions` (never lowers it).
pub async fn update(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
    partitions: u32,
) -> Result<(), PartitionedError> {
    check_count(topic, partitions)?;
    let path = partitioned_path(layout, topic);
    let (data, stat) = match store.get(&path).await {
        Ok(x) => x,
        Err(MetadataError::NoNode(_)) => return Err(PartitionedError::NotFound(topic.to_string())),
        Err(e) => return Err(e.into()),
    };
    let current = decode(&path, &data)?.partitions;
    if partitions < current {
        return Err(PartitionedError::Invalid(format!(
            "{topic} has {current} partitions; the count can only grow (asked {partitions})"
        )));
    }
    if partitions == current {
        return Ok(());
    }
    match store
        .set(&path, &encode(partitions), Expected::Version(stat.version))
        .await
    {
        Ok(_) => Ok(()),
        Err(MetadataError::BadVersion { .. }) => Err(PartitionedError::Conflict(topic.to_string())),
        Err(MetadataError::NoNode(_)) => Err(PartitionedError::NotFound(topic.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// Removes the partitioned-topic node of `topic` (the partitions' managed
/// ledgers are the caller's to delete first).
pub async fn delete(
    store: &dyn MetadataStore,
    layout: &Layout,
    topic: &TopicName,
) -> Result<(), PartitionedError> {
    match store
        .delete(&partitioned_path(layout, topic), Expected::Any)
        .await
    {
        Ok(()) => Ok(()),
        Err(MetadataError::NoNode(_)) => Err(PartitionedError::NotFound(topic.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// The partitioned topics of namespace `tenant/namespace` in `domain`, as
/// full names, sorted.
pub async fn list(
    store: &dyn MetadataStore,
    layout: &Layout,
    tenant: &str,
    namespace: &str,
    domain: Domain,
) -> Result<Vec<TopicName>, PartitionedError> {
    let dir = join(
        &join(&join(&layout.partitioned(), tenant), namespace),
        domain.as_str(),
    );
    let mut names = match store.children(&dir).await {
        Ok(c) => c,
        Err(MetadataError::NoNode(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    names.sort();
    Ok(names
        .into_iter()
        .map(|local| TopicName {
            domain,
            tenant: tenant.to_string(),
            namespace: namespace.to_string(),
            local,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cms_bookie::metadata::embedded::EmbeddedStore;

    fn t(name: &str) -> TopicName {
        TopicName::parse(name).unwrap()
    }

    #[test]
    fn partition_names_round_trip() {
        let base = t("persistent://a/b/orders");
        let p = partition_name(&base, 7);
        assert_eq!(p.to_string(), "persistent://a/b/orders-partition-7");
        assert_eq!(partition_of(&p), Some((base.clone(), 7)));
        assert_eq!(partition_of(&base), None);
        assert_eq!(partition_of(&t("persistent://a/b/x-partition-")), None);
        assert_eq!(partition_of(&t("persistent://a/b/x-partition-1a")), None);
        assert_eq!(partition_of(&t("persistent://a/b/-partition-1")), None);
    }

    #[tokio::test]
    async fn create_update_list_delete() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("m.redb"))
            .await
            .unwrap();
        let layout = Layout::new("/cms").unwrap();
        let topic = t("persistent://a/b/orders");
        assert_eq!(partitions(&store, &layout, &topic).await.unwrap(), None);
        assert!(matches!(
            create(&store, &layout, &topic, 0).await,
            Err(PartitionedError::Invalid(_))
        ));
        assert!(matches!(
            create(&store, &layout, &topic, PARTITIONS_MAX + 1).await,
            Err(PartitionedError::Invalid(_))
        ));
        assert!(matches!(
            create(&store, &layout, &partition_name(&topic, 1), 2).await,
            Err(PartitionedError::Invalid(_))
        ));
        create(&store, &layout, &topic, 3).await.unwrap();
        assert!(matches!(
            create(&store, &layout, &topic, 3).await,
            Err(PartitionedError::AlreadyExists(_))
        ));
        assert_eq!(partitions(&store, &layout, &topic).await.unwrap(), Some(3));
        assert!(matches!(
            update(&store, &layout, &topic, 2).await,
            Err(PartitionedError::Invalid(_))
        ));
        update(&store, &layout, &topic, 5).await.unwrap();
        assert_eq!(partitions(&store, &layout, &topic).await.unwrap(), Some(5));
        assert!(matches!(
            update(&store, &layout, &t("persistent://a/b/none"), 5).await,
            Err(PartitionedError::NotFound(_))
        ));
        create(&store, &layout, &t("persistent://a/b/alpha"), 1)
            .await
            .unwrap();
        create(&store, &layout, &t("non-persistent://a/b/np"), 2)
            .await
            .unwrap();
        let listed = list(&store, &layout, "a", "b", Domain::Persistent)
            .await
            .unwrap();
        assert_eq!(
            listed.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
            vec!["persistent://a/b/alpha", "persistent://a/b/orders"]
        );
        assert_eq!(
            list(&store, &layout, "a", "nope", Domain::Persistent)
                .await
                .unwrap(),
            Vec::<TopicName>::new()
        );
        delete(&store, &layout, &topic).await.unwrap();
        assert!(matches!(
            delete(&store, &layout, &topic).await,
            Err(PartitionedError::NotFound(_))
        ));
        assert_eq!(partitions(&store, &layout, &topic).await.unwrap(), None);
    }
}
