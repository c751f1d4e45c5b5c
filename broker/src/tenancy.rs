//! Tenants and namespaces in the metadata store (DESIGN §3,
//! `/cms/admin/tenants/<t>` and `/cms/admin/namespaces/<t>/<ns>`), and the
//! broker's `init-cluster`: the bookie layout plus tenant `public` and
//! namespace `public/default`.
//!
//! Node contents are JSON in Pulsar's admin shapes (`TenantInfo`:
//! `adminRoles`, `allowedClusters`; namespace `Policies`), so
//! the admin REST API can serve them as stored. Promise: `init_cluster` is
//! idempotent (existing nodes are left as they are) and refuses a store
//! initialised for another cluster name.

use cms_bookie::metadata::layout::{InitOutcome, Layout, LayoutError, init_cluster as init_layout};
use cms_bookie::metadata::{CreateMode, MetadataError, MetadataStore, join};

use crate::managed_ledger::io::ManagedLedgerConfig;
use crate::managed_ledger::trim::RetentionPolicy;

/// Tenant of the default namespace.
pub const PUBLIC_TENANT: &str = "public";
/// The default namespace (local part).
pub const DEFAULT_NAMESPACE: &str = "default";

pub use cms_admin_types::policies::*;

/// The managed-ledger settings of a topic of a namespace with policies `p`:
/// `base` (the broker's) with the namespace's persistence (E/Qw/Qa),
/// retention and message TTL when set. Pure.
pub fn ml_config_for(base: &ManagedLedgerConfig, p: &NamespacePolicies) -> ManagedLedgerConfig {
    let mut c = base.clone();
    if let Some(pp) = &p.persistence {
        c.ensemble_size = pp.bookkeeper_ensemble as usize;
        c.write_quorum = pp.bookkeeper_write_quorum as usize;
        c.ack_quorum = pp.bookkeeper_ack_quorum as usize;
    }
    if let Some(r) = &p.retention_policies {
        c.retention = RetentionPolicy {
            time_minutes: r.retention_time_in_minutes,
            size_mb: r.retention_size_in_mb,
        };
    }
    if let Some(ttl) = p.message_ttl_in_seconds {
        c.message_ttl_seconds = u64::from(ttl);
    }
    c
}

/// Whether `a` and `b` differ in what [`ml_config_for`] takes (persistence,
/// retention, message TTL): a topic loaded with `a` must be reloaded to run
/// with `b`. Pure.
pub fn ml_policies_differ(a: &NamespacePolicies, b: &NamespacePolicies) -> bool {
    a.persistence != b.persistence
        || a.retention_policies != b.retention_policies
        || a.message_ttl_in_seconds != b.message_ttl_in_seconds
}

/// Why a tenancy operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TenancyError {
    /// The layout could not be created.
    #[error(transparent)]
    Layout(#[from] LayoutError),
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

/// Path of tenant `t`.
pub fn tenant_path(layout: &Layout, tenant: &str) -> String {
    join(&layout.tenants(), tenant)
}

/// Path of namespace `t/ns`.
pub fn namespace_path(layout: &Layout, tenant: &str, namespace: &str) -> String {
    join(&join(&layout.namespaces(), tenant), namespace)
}

/// What `init_cluster` did.
#[derive(Debug)]
pub struct BrokerInitOutcome {
    /// The layout part.
    pub layout: InitOutcome,
    /// Tenant and namespace nodes created by this run.
    pub tenancy_nodes_created: usize,
}

async fn create_if_absent(
    store: &dyn MetadataStore,
    path: &str,
    data: &[u8],
) -> Result<bool, MetadataError> {
    if store.exists(path).await?.is_some() {
        return Ok(false);
    }
    if let Some(parent) = cms_bookie::metadata::parent_of(path) {
        store.create_all(parent).await?;
    }
    match store.create(path, data, CreateMode::Persistent).await {
        Ok(_) => Ok(true),
        Err(MetadataError::NodeExists(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates the layout and cluster node (as `cms-bookie init-cluster`), tenant
/// `public` allowed on `cluster_name`, and namespace `public/default`.
pub async fn init_cluster(
    store: &dyn MetadataStore,
    layout: &Layout,
    cluster_name: &str,
) -> Result<BrokerInitOutcome, TenancyError> {
    let outcome = init_layout(store, layout, cluster_name).await?;
    let tenant = TenantInfo {
        admin_roles: Vec::new(),
        allowed_clusters: vec![cluster_name.to_string()],
        quotas: None,
    };
    let tenant_json = serde_json::to_vec(&tenant).map_err(|e| TenancyError::Corrupt {
        path: tenant_path(layout, PUBLIC_TENANT),
        reason: e.to_string(),
    })?;
    let ns_json =
        serde_json::to_vec(&NamespacePolicies::default()).map_err(|e| TenancyError::Corrupt {
            path: namespace_path(layout, PUBLIC_TENANT, DEFAULT_NAMESPACE),
            reason: e.to_string(),
        })?;
    let mut created = 0;
    if create_if_absent(store, &tenant_path(layout, PUBLIC_TENANT), &tenant_json).await? {
        created += 1;
    }
    if create_if_absent(
        store,
        &namespace_path(layout, PUBLIC_TENANT, DEFAULT_NAMESPACE),
        &ns_json,
    )
    .await?
    {
        created += 1;
    }
    Ok(BrokerInitOutcome {
        layout: outcome,
        tenancy_nodes_created: created,
    })
}

/// The policies of namespace `t/ns`, or None if it does not exist.
pub async fn namespace_policies(
    store: &dyn MetadataStore,
    layout: &Layout,
    tenant: &str,
    namespace: &str,
) -> Result<Option<NamespacePolicies>, TenancyError> {
    let path = namespace_path(layout, tenant, namespace);
    match store.get(&path).await {
        Ok((data, _)) => {
            if data.is_empty() {
                return Ok(Some(NamespacePolicies::default()));
            }
            serde_json::from_slice(&data)
                .map(Some)
                .map_err(|e| TenancyError::Corrupt {
                    path,
                    reason: e.to_string(),
                })
        }
        Err(MetadataError::NoNode(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_creation_override_uses_pulsar_json_and_beats_broker_defaults() {
        let broker = AutoCreation {
            allowed: true,
            topic_type: AutoTopicType::NonPartitioned,
            partitions: 1,
        };
        let p: NamespacePolicies = serde_json::from_str(
            r#"{"autoTopicCreationOverride":{"allowAutoTopicCreation":true,
                "topicType":"partitioned","defaultNumPartitions":4}}"#,
        )
        .unwrap();
        assert_eq!(
            p.auto_creation(broker),
            AutoCreation {
                allowed: true,
                topic_type: AutoTopicType::Partitioned,
                partitions: 4
            }
        );
        let off: NamespacePolicies = serde_json::from_str(
            r#"{"autoTopicCreationOverride":{"allowAutoTopicCreation":false}}"#,
        )
        .unwrap();
        assert!(!off.auto_creation(broker).allowed);
        assert_eq!(NamespacePolicies::default().auto_creation(broker), broker);
        let legacy = NamespacePolicies {
            allow_auto_topic_creation: Some(false),
            ..NamespacePolicies::default()
        };
        assert!(!legacy.auto_creation(broker).allowed);
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains(r#""topicType":"partitioned""#), "{json}");
        assert!(serde_json::from_str::<NamespacePolicies>(
            r#"{"autoTopicCreationOverride":{"allowAutoTopicCreation":true,"topicType":"bogus"}}"#
        )
        .is_err());
    }
    use cms_bookie::metadata::embedded::EmbeddedStore;

    #[tokio::test]
    async fn init_creates_public_default_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("m.redb"))
            .await
            .unwrap();
        let layout = Layout::new("/cms").unwrap();
        let first = init_cluster(&store, &layout, "c1").await.unwrap();
        assert_eq!(first.tenancy_nodes_created, 2);
        let again = init_cluster(&store, &layout, "c1").await.unwrap();
        assert_eq!(again.tenancy_nodes_created, 0);
        assert!(init_cluster(&store, &layout, "other").await.is_err());
        let p = namespace_policies(&store, &layout, "public", "default")
            .await
            .unwrap();
        assert_eq!(p, Some(NamespacePolicies::default()));
        assert_eq!(
            namespace_policies(&store, &layout, "public", "nope")
                .await
                .unwrap(),
            None
        );
        let (data, _) = store.get(&tenant_path(&layout, "public")).await.unwrap();
        let t: TenantInfo = serde_json::from_slice(&data).unwrap();
        assert_eq!(t.allowed_clusters, vec!["c1".to_string()]);
    }

    #[test]
    fn policies_keep_the_legacy_key_and_read_pulsar_keys() {
        let legacy: NamespacePolicies =
            serde_json::from_str(r#"{"allowAutoTopicCreation":false}"#).unwrap();
        let broker = AutoCreation {
            allowed: true,
            topic_type: AutoTopicType::NonPartitioned,
            partitions: 1,
        };
        assert!(!legacy.auto_creation(broker).allowed);
        assert_eq!(
            serde_json::to_value(&legacy).unwrap(),
            serde_json::json!({"allowAutoTopicCreation": false})
        );
        let p: NamespacePolicies = serde_json::from_str(
            r#"{"retention_policies":{"retentionTimeInMinutes":60,"retentionSizeInMB":-1},
                "message_ttl_in_seconds":30,
                "backlog_quota_map":{"destination_storage":{"limitSize":10,"policy":"producer_exception"}},
                "autoTopicCreationOverride":{"allowAutoTopicCreation":true,"topicType":"non-partitioned"},
                "allowAutoTopicCreation":false,
                "persistence":{"bookkeeperEnsemble":3,"bookkeeperWriteQuorum":2,"bookkeeperAckQuorum":2},
                "auth_policies":{"ignored":true}}"#,
        )
        .unwrap();
        assert_eq!(p.validate(), Ok(()));
        // The override wins over the legacy key.
        assert!(p.auto_creation(broker).allowed);
        assert_eq!(p.backlog_quota_map["destination_storage"].limit_time, -1);
        let back = serde_json::to_value(&p).unwrap();
        assert_eq!(back["retention_policies"]["retentionSizeInMB"], -1);
        assert_eq!(back["persistence"]["bookkeeperAckQuorum"], 2);
    }

    #[test]
    fn policies_shape_the_managed_ledger_config() {
        let base = ManagedLedgerConfig::default();
        assert_eq!(
            ml_config_for(&base, &NamespacePolicies::default()).ensemble_size,
            base.ensemble_size
        );
        let p: NamespacePolicies = serde_json::from_str(
            r#"{"persistence":{"bookkeeperEnsemble":2,"bookkeeperWriteQuorum":2,"bookkeeperAckQuorum":1},
                "retention_policies":{"retentionTimeInMinutes":-1,"retentionSizeInMB":10},
                "message_ttl_in_seconds":90}"#,
        )
        .unwrap();
        let c = ml_config_for(&base, &p);
        assert_eq!((c.ensemble_size, c.write_quorum, c.ack_quorum), (2, 2, 1));
        assert_eq!(c.retention.time_minutes, -1);
        assert_eq!(c.retention.size_mb, 10);
        assert_eq!(c.message_ttl_seconds, 90);
        assert_eq!(c.rollover, base.rollover);
        assert!(ml_policies_differ(&NamespacePolicies::default(), &p));
        let mut same = p.clone();
        same.max_producers_per_topic = Some(3);
        same.deduplication_enabled = Some(true);
        assert!(!ml_policies_differ(&p, &same));
        same.message_ttl_in_seconds = Some(91);
        assert!(ml_policies_differ(&p, &same));
    }

    #[test]
    fn policy_validation_names_the_bad_value() {
        let bad = |json: &str| {
            let p: NamespacePolicies = serde_json::from_str(json).unwrap();
            p.validate().unwrap_err()
        };
        assert!(bad(r#"{"persistence":{"bookkeeperEnsemble":1,"bookkeeperWriteQuorum":2,"bookkeeperAckQuorum":1}}"#).contains("bookkeeperEnsemble"));
        assert!(bad(r#"{"persistence":{"bookkeeperEnsemble":2,"bookkeeperWriteQuorum":2,"bookkeeperAckQuorum":0}}"#).contains("bookkeeperAckQuorum"));
        assert!(
            bad(r#"{"retention_policies":{"retentionTimeInMinutes":-2,"retentionSizeInMB":1}}"#)
                .contains("retention")
        );
        assert!(
            bad(r#"{"backlog_quota_map":{"nope":{"policy":"producer_exception"}}}"#)
                .contains("type")
        );
        assert!(
            bad(r#"{"backlog_quota_map":{"message_age":{"policy":"drop"}}}"#).contains("policy")
        );
        assert!(bad(r#"{"autoTopicCreationOverride":{"allowAutoTopicCreation":true,"topicType":"partitioned","defaultNumPartitions":0}}"#).contains("defaultNumPartitions"));
        assert!(
            bad(r#"{"topicDispatchRate":{"c":{"ratePeriodInSecond":0}}}"#)
                .contains("ratePeriodInSecond")
        );
        assert!(
            bad(r#"{"publishMaxMessageRate":{"c":{"publishThrottlingRateInMsg":-5}}}"#)
                .contains("publish")
        );
        assert!(bad(r#"{"bundles":{"boundaries":[],"numBundles":0}}"#).contains("numBundles"));
    }
}
