//! Namespace and tenant policies in Pulsar's admin JSON shapes
//! (`TenantInfo`, namespace `Policies` and their parts): what the admin REST
//! API accepts as bodies and what the metadata store holds. Each part has a
//! `validate` that names the bad value; the broker checks it before storing.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Largest partition count of a partitioned topic.
pub const PARTITIONS_MAX: u32 = 1024;

/// Schema compatibility strategy names the broker accepts (upper case;
/// `UNDEFINED` = the broker default).
pub const SCHEMA_STRATEGIES: [&str; 9] = [
    "UNDEFINED",
    "ALWAYS_COMPATIBLE",
    "ALWAYS_INCOMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
];

/// `s` (any case) as one of [`SCHEMA_STRATEGIES`], or why not.
pub fn schema_strategy_name(s: &str) -> Result<&'static str, String> {
    let upper = s.to_ascii_uppercase();
    SCHEMA_STRATEGIES
        .iter()
        .find(|n| **n == upper)
        .copied()
        .ok_or_else(|| format!("unknown schema compatibility strategy {upper:?}"))
}

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
    pub quotas: Option<crate::quotas::Quotas>,
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
    pub quotas: Option<crate::quotas::Quotas>,
    /// Permissions (Pulsar's `auth_policies`): grants of produce / consume
    /// per role on the namespace and per topic, subscription restrictions.
    #[serde(default, skip_serializing_if = "AuthPolicies::is_empty")]
    pub auth_policies: AuthPolicies,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
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
            schema_strategy_name(s)?;
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

/// Largest bundle count of a namespace.
pub const BUNDLES_MAX: u32 = 1024;

impl AutoTopicCreationOverride {
    /// `defaultNumPartitions`, when set, in `1..=PARTITIONS_MAX`.
    pub fn validate(&self) -> Result<(), String> {
        match self.default_num_partitions {
            Some(n) if !(1..=PARTITIONS_MAX).contains(&n) => Err(format!(
                "defaultNumPartitions must be in 1..={}",
                PARTITIONS_MAX
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

/// Pulsar's `auth_policies` of a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AuthPolicies {
    /// role → actions on every topic of the namespace.
    #[serde(default)]
    pub namespace_auth: BTreeMap<String, BTreeSet<String>>,
    /// topic (full name) → role → actions.
    #[serde(default)]
    pub destination_auth: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// subscription → the only roles that may consume from it.
    #[serde(default)]
    pub subscription_auth_roles: BTreeMap<String, BTreeSet<String>>,
}

impl AuthPolicies {
    /// Whether nothing is granted.
    pub fn is_empty(&self) -> bool {
        self.namespace_auth.is_empty()
            && self.destination_auth.is_empty()
            && self.subscription_auth_roles.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_in_pulsar_shapes_and_validate() {
        let p: NamespacePolicies = serde_json::from_str(
            r#"{"persistence":{"bookkeeperEnsemble":3,"bookkeeperWriteQuorum":3,
                "bookkeeperAckQuorum":2},"schema_compatibility_strategy":"backward"}"#,
        )
        .unwrap();
        assert_eq!(p.validate(), Ok(()));
        let bad: NamespacePolicies =
            serde_json::from_str(r#"{"schema_compatibility_strategy":"sideways"}"#).unwrap();
        assert!(bad.validate().unwrap_err().contains("SIDEWAYS"));
        let q: PersistencePolicies = serde_json::from_str(
            r#"{"bookkeeperEnsemble":2,"bookkeeperWriteQuorum":3,"bookkeeperAckQuorum":2}"#,
        )
        .unwrap();
        assert!(q.validate().is_err());
        assert!(serde_json::from_str::<RetentionPolicies>("[1, 2").is_err());
    }

    #[test]
    fn schema_strategy_names_are_case_insensitive_and_closed() {
        assert_eq!(
            schema_strategy_name("full_transitive"),
            Ok("FULL_TRANSITIVE")
        );
        assert_eq!(schema_strategy_name("Undefined"), Ok("UNDEFINED"));
        assert!(schema_strategy_name("").is_err());
    }
}
