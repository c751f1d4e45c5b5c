//! Tenants and namespaces in the metadata store (DESIGN §3,
//! `/cms/admin/tenants/<t>` and `/cms/admin/namespaces/<t>/<ns>`), and the
//! broker's `init-cluster`: the bookie layout plus tenant `public` and
//! namespace `public/default`.
//!
//! Node contents are JSON in Pulsar's admin shapes (`TenantInfo`:
//! `adminRoles`, `allowedClusters`; namespace `Policies`, empty for now), so
//! the admin REST API can serve them as stored. Promise: `init_cluster` is
//! idempotent (existing nodes are left as they are) and refuses a store
//! initialised for another cluster name.

use cms_bookie::metadata::layout::{InitOutcome, Layout, LayoutError, init_cluster as init_layout};
use cms_bookie::metadata::{CreateMode, MetadataError, MetadataStore, join};
use serde::{Deserialize, Serialize};

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
}

/// Content of `/cms/admin/namespaces/<t>/<ns>` (policies; more fields come
/// with the admin API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NamespacePolicies {
    /// Whether topics are created on first use (None = broker default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_auto_topic_creation: Option<bool>,
    /// Pulsar's `autoTopicCreationOverride`: whether, and as what, topics
    /// are created on first use (None = broker defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_topic_creation_override: Option<AutoTopicCreationOverride>,
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
}
