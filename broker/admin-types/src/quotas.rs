//! Quotas of a tenant or a namespace (docs/quotas.md): the JSON body of
//! `/admin/v2/tenants/{t}/quotas` and `/admin/v2/namespaces/{t}/{ns}/quotas`,
//! with its validation. The broker enforces them (`cms_broker::quota`).

use serde::{Deserialize, Serialize};

/// Quotas of a tenant or a namespace (JSON camelCase, every field optional,
/// absent or `null` = unlimited; rates per second).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Quotas {
    /// Messages published per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_rate_in_msgs: Option<u64>,
    /// Bytes published per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_rate_in_bytes: Option<u64>,
    /// Messages dispatched per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_rate_in_msgs: Option<u64>,
    /// Bytes dispatched per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_rate_in_bytes: Option<u64>,
    /// Stored bytes (sum of the topics' storage sizes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_bytes: Option<u64>,
    /// Topics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_topics: Option<u32>,
    /// Queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queues: Option<u32>,
    /// Producers connected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_producers: Option<u32>,
    /// Consumers connected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_consumers: Option<u32>,
    /// Client connections with at least one producer or consumer here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
}

impl Quotas {
    /// Rates must be at least 1 (absent = unlimited); counts may be 0.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("publishRateInMsgs", self.publish_rate_in_msgs),
            ("publishRateInBytes", self.publish_rate_in_bytes),
            ("dispatchRateInMsgs", self.dispatch_rate_in_msgs),
            ("dispatchRateInBytes", self.dispatch_rate_in_bytes),
        ] {
            if v == Some(0) {
                return Err(format!(
                    "{name} must be >= 1 (leave it out or null for unlimited)"
                ));
            }
        }
        Ok(())
    }

    /// Whether no quota is set.
    pub fn is_empty(&self) -> bool {
        *self == Quotas::default()
    }
}
