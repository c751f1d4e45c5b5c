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

use std::collections::BTreeMap;

use cms_bookie::metadata::layout::{InitOutcome, Layout, LayoutError, init_cluster as init_layout};
use cms_bookie::metadata::{CreateMode, MetadataError, MetadataStore, join};
use serde::{Deserialize, Serialize};

use crate::managed_ledger::io::ManagedLedgerConfig;
use crate::managed_ledger::trim::RetentionPolicy;

/// Tenant of the default namespace.
pub const PUBLIC_TENANT: &str = "public";
/// The default namespace (local part).
pub const DEFAULT_NAMESPACE: &str = "default";

/// Content of `/cms/admin/tenants/<t>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct TenantInfo {
    /// Roles allowed to administer the tenant.
    #[serde(default)]
    pub admin_roles: Vec<String>,
    /// Clusters the tenant may use.
    #[serde(default)]
    pub allowed_clusters: Vec<String>,
    /// CMS: the tenant's quotas (docs/quotas.md; cluster-wide), set through
    /// `/admin/v2/tenants/{t}/quotas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<crate::quota::Quotas>,
}

/// Content of `/cms/admin/namespaces/<t>/<ns>`: Pulsar's namespace
/// `Policies` JSON shape (keys as Pulsar spells them, snake_case and
/// camelCase mixed). Absent / `null` = the broker default. What each policy
/// does today (enforced or stored only) is in `docs/admin-api.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NamespacePolicies {
    /// Legacy CMS key: whether topics are created on first use (None =
    /// broker default). Kept in step with `autoTopicCreationOverride`.
    #[serde(
        rename = "allowAutoTopicCreation",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_auto_topic_creation: Option<bool>,
    /// Auto topic creation override (`autoTopicCreationOverride`).
    #[serde(
        rename = "autoTopicCreationOverride",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub auto_topic_creation_override: Option<AutoTopicCreationOverride>,
    /// Bundles (hash ranges) of the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundles: Option<BundlesData>,
    /// E / Qw / Qa of new ledgers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence: Option<PersistencePolicies>,
    /// Retention of acknowledged messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policies: Option<RetentionPolicies>,
    /// Backlog quotas by type (`destination_storage`, `message_age`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backlog_quota_map: BTreeMap<String, BacklogQuota>,
    /// Message TTL in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_ttl_in_seconds: Option<u32>,
    /// Producer de-duplication.
    #[serde(
        rename = "deduplicationEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub deduplication_enabled: Option<bool>,
    /// Publish rate per cluster name.
    #[serde(
        rename = "publishMaxMessageRate",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub publish_max_message_rate: BTreeMap<String, PublishRate>,
    /// Topic dispatch rate per cluster name.
    #[serde(
        rename = "topicDispatchRate",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub topic_dispatch_rate: BTreeMap<String, DispatchRate>,
    /// Subscription dispatch rate per cluster name.
    #[serde(
        rename = "subscriptionDispatchRate",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub subscription_dispatch_rate: BTreeMap<String, DispatchRate>,
    /// Producers per topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_producers_per_topic: Option<u32>,
    /// Consumers per topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_consumers_per_topic: Option<u32>,
    /// Consumers per subscription.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_consumers_per_subscription: Option<u32>,
    /// Topics in the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_topics_per_namespace: Option<u32>,
    /// Subscriptions per topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_subscriptions_per_topic: Option<u32>,
    /// Clusters the namespace is replicated to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replication_clusters: Vec<String>,
    /// Schema compatibility strategy (`FULL`, `BACKWARD`, ...; None or
    /// `UNDEFINED` = the broker default FULL), see [`crate::schema`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_compatibility_strategy: Option<String>,
    /// Whether producers may add schema versions (Pulsar default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_allow_auto_update_schema: Option<bool>,
    /// CMS: the namespace's quotas (docs/quotas.md), set through
    /// `/admin/v2/namespaces/{t}/{ns}/quotas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<crate::quota::Quotas>,
    /// Permissions (Pulsar's `auth_policies`): grants of produce / consume
    /// per role on the namespace and per topic, subscription restrictions.
    #[serde(default, skip_serializing_if = "crate::auth::AuthPolicies::is_empty")]
    pub auth_policies: crate::auth::AuthPolicies,
}

/// Pulsar's `AutoTopicCreationOverride` (JSON
/// `{"allowAutoTopicCreation", "topicType", "defaultNumPartitions"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoTopicCreationOverride {
    /// Whether topics are created on first use.
    pub allow_auto_topic_creation: bool,
    /// `"partitioned"` or `"non-partitioned"`.
    #[serde(default)]
    pub topic_type: AutoTopicType,
    /// Partitions of an auto-created partitioned topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_num_partitions: Option<u32>,
}

/// What an auto-created topic is (Pulsar `TopicType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AutoTopicType {
    /// An ordinary topic (Pulsar's default).
    #[default]
    NonPartitioned,
    /// A partitioned topic with the default partition count.
    Partitioned,
}

/// How topics of a namespace are auto-created, after policy and broker
/// defaults are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoCreation {
    /// Created on first use at all.
    pub allowed: bool,
    /// As what.
    pub topic_type: AutoTopicType,
    /// Partitions when partitioned (at least 1).
    pub partitions: u32,
}

/// `bundles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundlesData {
    /// Hash-range boundaries (`0x00000000` .. `0xffffffff`).
    #[serde(default)]
    pub boundaries: Vec<String>,
    /// Number of bundles.
    pub num_bundles: u32,
}

/// `persistence`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistencePolicies {
    /// Ensemble size E.
    pub bookkeeper_ensemble: u32,
    /// Write quorum Qw.
    pub bookkeeper_write_quorum: u32,
    /// Ack quorum Qa.
    pub bookkeeper_ack_quorum: u32,
    /// Mark-delete rate bound (per second, 0 = unbounded).
    #[serde(default)]
    pub managed_ledger_max_mark_delete_rate: f64,
}

/// `retention_policies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPolicies {
    /// Minutes acknowledged data is kept (-1 = forever).
    pub retention_time_in_minutes: i64,
    /// Megabytes of acknowledged data kept (-1 = unbounded).
    #[serde(rename = "retentionSizeInMB")]
    pub retention_size_in_mb: i64,
}

/// One entry of `backlog_quota_map`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BacklogQuota {
    /// Backlog bytes (-1 = unbounded).
    #[serde(default = "minus_one")]
    pub limit_size: i64,
    /// Backlog age in seconds (-1 = unbounded).
    #[serde(default = "minus_one")]
    pub limit_time: i64,
    /// `producer_request_hold`, `producer_exception` or
    /// `consumer_backlog_eviction`.
    pub policy: String,
}

fn minus_one() -> i64 {
    -1
}

/// A publish rate (`publishMaxMessageRate` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishRate {
    /// Messages per second (-1 / 0 = unbounded).
    #[serde(default = "minus_one")]
    pub publish_throttling_rate_in_msg: i64,
    /// Bytes per second (-1 / 0 = unbounded).
    #[serde(default = "minus_one")]
    pub publish_throttling_rate_in_byte: i64,
}

/// A dispatch rate (topic or subscription).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DispatchRate {
    /// Messages per period (-1 / 0 = unbounded).
    #[serde(default = "minus_one")]
    pub dispatch_throttling_rate_in_msg: i64,
    /// Bytes per period (-1 / 0 = unbounded).
    #[serde(default = "minus_one")]
    pub dispatch_throttling_rate_in_byte: i64,
    /// The period, in seconds.
    #[serde(default = "one")]
    pub rate_period_in_second: u32,
    /// Whether the rate is relative to the publish rate.
    #[serde(default)]
    pub relative_to_publish_rate: bool,
}

fn one() -> u32 {
    1
}

/// Backlog quota types Pulsar knows.
pub const BACKLOG_QUOTA_TYPES: [&str; 2] = ["destination_storage", "message_age"];
/// Backlog quota policies Pulsar knows.
pub const BACKLOG_QUOTA_POLICIES: [&str; 3] = [
    "producer_request_hold",
    "producer_exception",
    "consumer_backlog_eviction",
];
/// Largest ensemble accepted in a persistence policy.
pub const PERSISTENCE_ENSEMBLE_MAX: u32 = 64;

impl NamespacePolicies {
    /// The effective auto-creation: `autoTopicCreationOverride` if set, else
    /// `allow_auto_topic_creation` with the broker's type and count, else
    /// the broker's defaults.
    pub fn auto_creation(&self, broker: AutoCreation) -> AutoCreation {
        match &self.auto_topic_creation_override {
            Some(o) => AutoCreation {
                allowed: o.allow_auto_topic_creation,
                topic_type: o.topic_type,
                partitions: o.default_num_partitions.unwrap_or(broker.partitions).max(1),
            },
            None => AutoCreation {
                allowed: self.allow_auto_topic_creation.unwrap_or(broker.allowed),
                ..broker
            },
        }
    }

    /// Checks every value set; the error names the bad one.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(o) = &self.auto_topic_creation_override {
            o.validate()?;
        }
        if let Some(p) = &self.persistence {
            p.validate()?;
        }
        if let Some(r) = &self.retention_policies {
            r.validate()?;
        }
        for (kind, q) in &self.backlog_quota_map {
            if !BACKLOG_QUOTA_TYPES.contains(&kind.as_str()) {
                return Err(format!(
                    "backlog quota type {kind:?} is not one of {BACKLOG_QUOTA_TYPES:?}"
                ));
            }
            q.validate()?;
        }
        for r in self.publish_max_message_rate.values() {
            r.validate()?;
        }
        for r in self
            .topic_dispatch_rate
            .values()
            .chain(self.subscription_dispatch_rate.values())
        {
            r.validate()?;
        }
        if let Some(s) = &self.schema_compatibility_strategy {
            crate::schema::Strategy::parse(s)?;
        }
        if let Some(q) = &self.quotas {
            q.validate()?;
        }
        if let Some(b) = &self.bundles
            && (b.num_bundles == 0 || b.num_bundles > BUNDLES_MAX)
        {
            return Err(format!("numBundles must be in 1..={BUNDLES_MAX}"));
        }
        Ok(())
    }
}

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

/// Largest bundle count of a namespace.
pub const BUNDLES_MAX: u32 = 1024;

impl AutoTopicCreationOverride {
    /// `defaultNumPartitions`, when set, in `1..=PARTITIONS_MAX`.
    pub fn validate(&self) -> Result<(), String> {
        match self.default_num_partitions {
            Some(n) if !(1..=crate::partitioned::PARTITIONS_MAX).contains(&n) => Err(format!(
                "defaultNumPartitions must be in 1..={}",
                crate::partitioned::PARTITIONS_MAX
            )),
            _ => Ok(()),
        }
    }
}

impl PersistencePolicies {
    /// `E >= Qw >= Qa >= 1`, `E <= PERSISTENCE_ENSEMBLE_MAX`, rate >= 0.
    pub fn validate(&self) -> Result<(), String> {
        let (e, w, a) = (
            self.bookkeeper_ensemble,
            self.bookkeeper_write_quorum,
            self.bookkeeper_ack_quorum,
        );
        if !(a >= 1 && w >= a && e >= w && e <= PERSISTENCE_ENSEMBLE_MAX) {
            return Err(format!(
                "persistence needs {PERSISTENCE_ENSEMBLE_MAX} >= bookkeeperEnsemble >= \
                 bookkeeperWriteQuorum >= bookkeeperAckQuorum >= 1, got {e}/{w}/{a}"
            ));
        }
        if !self.managed_ledger_max_mark_delete_rate.is_finite()
            || self.managed_ledger_max_mark_delete_rate < 0.0
        {
            return Err("managedLedgerMaxMarkDeleteRate must be >= 0".into());
        }
        Ok(())
    }
}

impl RetentionPolicies {
    /// Each bound is -1 (unbounded) or >= 0.
    pub fn validate(&self) -> Result<(), String> {
        if self.retention_time_in_minutes < -1 || self.retention_size_in_mb < -1 {
            return Err(
                "retentionTimeInMinutes and retentionSizeInMB must be -1 (unbounded) or >= 0"
                    .into(),
            );
        }
        Ok(())
    }
}

impl BacklogQuota {
    /// Known policy; limits -1 or >= 0.
    pub fn validate(&self) -> Result<(), String> {
        if !BACKLOG_QUOTA_POLICIES.contains(&self.policy.as_str()) {
            return Err(format!(
                "backlog quota policy {:?} is not one of {BACKLOG_QUOTA_POLICIES:?}",
                self.policy
            ));
        }
        if self.limit_size < -1 || self.limit_time < -1 {
            return Err("limitSize and limitTime must be -1 (unbounded) or >= 0".into());
        }
        Ok(())
    }
}

impl PublishRate {
    /// Rates -1 or >= 0.
    pub fn validate(&self) -> Result<(), String> {
        if self.publish_throttling_rate_in_msg < -1 || self.publish_throttling_rate_in_byte < -1 {
            return Err("publish rates must be -1 (unbounded) or >= 0".into());
        }
        Ok(())
    }
}

impl DispatchRate {
    /// Rates -1 or >= 0, period >= 1.
    pub fn validate(&self) -> Result<(), String> {
        if self.dispatch_throttling_rate_in_msg < -1 || self.dispatch_throttling_rate_in_byte < -1 {
            return Err("dispatch rates must be -1 (unbounded) or >= 0".into());
        }
        if self.rate_period_in_second == 0 {
            return Err("ratePeriodInSecond must be >= 1".into());
        }
        Ok(())
    }
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
