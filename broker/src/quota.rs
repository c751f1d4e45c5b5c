//! Tenant and namespace quotas, the pure part (STYLE §2: no I/O, time is an
//! input): the stored shape ([`Quotas`], docs/quotas.md), usage in the same
//! field names ([`Usage`]), the count checks with the refusal message that
//! names the quota and its value ([`check_count`]), and the allocation of a
//! cluster-wide rate quota across brokers from their reported usage
//! ([`allocate`]).
//!
//! Promises: [`allocate`] never hands out more than the quota in total over
//! the brokers it is given (so the aggregate stays within the quota whatever
//! the reports say), gives every broker at least a floor so a new broker can
//! start, and moves unused share to the brokers that use theirs; every refusal
//! message names the scope, the quota field and its value.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use cms_admin_types::quotas::Quotas;

/// Current usage, in the field names of [`Quotas`] (rates per second over
/// the last report interval; counts now).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Messages published per second.
    #[serde(default)]
    pub publish_rate_in_msgs: u64,
    /// Bytes published per second.
    #[serde(default)]
    pub publish_rate_in_bytes: u64,
    /// Messages dispatched per second.
    #[serde(default)]
    pub dispatch_rate_in_msgs: u64,
    /// Bytes dispatched per second.
    #[serde(default)]
    pub dispatch_rate_in_bytes: u64,
    /// Stored bytes.
    #[serde(default)]
    pub storage_bytes: u64,
    /// Topics.
    #[serde(default)]
    pub max_topics: u64,
    /// Queues.
    #[serde(default)]
    pub max_queues: u64,
    /// Producers.
    #[serde(default)]
    pub max_producers: u64,
    /// Consumers.
    #[serde(default)]
    pub max_consumers: u64,
    /// Connections.
    #[serde(default)]
    pub max_connections: u64,
}

impl Usage {
    /// Adds `o` field by field (saturating).
    pub fn add(&mut self, o: &Usage) {
        self.publish_rate_in_msgs = self
            .publish_rate_in_msgs
            .saturating_add(o.publish_rate_in_msgs);
        self.publish_rate_in_bytes = self
            .publish_rate_in_bytes
            .saturating_add(o.publish_rate_in_bytes);
        self.dispatch_rate_in_msgs = self
            .dispatch_rate_in_msgs
            .saturating_add(o.dispatch_rate_in_msgs);
        self.dispatch_rate_in_bytes = self
            .dispatch_rate_in_bytes
            .saturating_add(o.dispatch_rate_in_bytes);
        self.storage_bytes = self.storage_bytes.saturating_add(o.storage_bytes);
        self.max_topics = self.max_topics.saturating_add(o.max_topics);
        self.max_queues = self.max_queues.saturating_add(o.max_queues);
        self.max_producers = self.max_producers.saturating_add(o.max_producers);
        self.max_consumers = self.max_consumers.saturating_add(o.max_consumers);
        self.max_connections = self.max_connections.saturating_add(o.max_connections);
    }
}

/// What one broker reports every interval: per tenant and per namespace
/// (`tenant/ns`) usage on that broker, and when (wall clock, ms).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    /// Wall-clock time of the report, in milliseconds since the epoch.
    pub at_ms: u64,
    /// Usage per tenant.
    #[serde(default)]
    pub tenants: BTreeMap<String, Usage>,
    /// Usage per namespace (`tenant/ns`).
    #[serde(default)]
    pub namespaces: BTreeMap<String, Usage>,
}

/// Reports older than this are ignored (a broker that stopped reporting).
pub const REPORT_STALE_MS: u64 = 5_000;

/// Who a quota belongs to, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// A tenant.
    Tenant(&'a str),
    /// A namespace `tenant/ns`.
    Namespace(&'a str),
}

impl std::fmt::Display for Scope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Tenant(t) => write!(f, "tenant {t}"),
            Scope::Namespace(n) => write!(f, "namespace {n}"),
        }
    }
}

/// Refuses adding one more when `in_use` already reaches `limit` (None =
/// unlimited). The message names the scope, the quota field and its value.
pub fn check_count(
    scope: Scope<'_>,
    field: &str,
    limit: Option<u32>,
    in_use: u64,
) -> Result<(), String> {
    match limit {
        Some(l) if in_use >= u64::from(l) => Err(format!(
            "{scope} quota {field}={l} reached ({in_use} in use)"
        )),
        _ => Ok(()),
    }
}

/// Refuses when `in_use` exceeds `limit` (for sizes: storage).
pub fn check_size(
    scope: Scope<'_>,
    field: &str,
    limit: Option<u64>,
    in_use: u64,
) -> Result<(), String> {
    match limit {
        Some(l) if in_use >= l => Err(format!(
            "{scope} quota {field}={l} exceeded ({in_use} in use)"
        )),
        _ => Ok(()),
    }
}

/// This broker's share of a cluster-wide rate `quota` (per second).
///
/// `usage` holds the rate each broker using the quota reported over the
/// last interval (this broker included, keyed by broker id; `me` is this
/// broker). Shares are proportional to usage plus a floor of
/// `quota / (10 · brokers)`, so they sum to at most `quota`, a broker that
/// just started gets a tenth of an even share at once, a saturated broker
/// whose peers use less than their share grows into the unused part within
/// a few intervals, and saturated brokers drift towards equal shares. At
/// least 1 per second is always given (a zero rate would never let a
/// message through).
pub fn allocate(quota: u64, me: &str, usage: &BTreeMap<String, u64>) -> u64 {
    let n = usage.len() as u128 + u128::from(!usage.contains_key(me));
    if n <= 1 {
        return quota.max(1);
    }
    let q = u128::from(quota);
    // Weights scaled by 10·n to keep the floor integral: w_i = 10·n·u_i + q.
    let scale = 10 * n;
    let mine = u128::from(usage.get(me).copied().unwrap_or(0));
    let total: u128 = usage
        .values()
        .map(|&u| scale * u128::from(u) + q)
        .sum::<u128>()
        + if usage.contains_key(me) { 0 } else { q };
    let w = scale * mine + q;
    if total == 0 {
        return 1;
    }
    u64::try_from(q * w / total).unwrap_or(u64::MAX).max(1)
}

/// Per-broker usage of one quantity from `reports` (stale ones left out),
/// keyed by broker id; `value` picks the quantity from a report.
pub fn usage_by_broker(
    reports: &BTreeMap<String, UsageReport>,
    now_ms: u64,
    value: impl Fn(&UsageReport) -> Option<u64>,
) -> BTreeMap<String, u64> {
    reports
        .iter()
        .filter(|(_, r)| now_ms.saturating_sub(r.at_ms) <= REPORT_STALE_MS)
        .filter_map(|(id, r)| value(r).map(|v| (id.clone(), v)))
        .collect()
}

/// This broker's shares (messages, bytes per second) of the rate quotas in
/// `q` (dispatch rates if `dispatch`, else publish rates), split by
/// [`allocate`] over the brokers' fresh reports of the scope's usage
/// (`usage_of` picks the scope's entry of a report). Pure.
pub fn rate_shares(
    q: &Quotas,
    dispatch: bool,
    reports: &BTreeMap<String, UsageReport>,
    now_ms: u64,
    me: &str,
    usage_of: impl Fn(&UsageReport) -> Option<&Usage>,
) -> (Option<u64>, Option<u64>) {
    let share = |quota: Option<u64>, f: fn(&Usage) -> u64| {
        quota.map(|quota| {
            let u = usage_by_broker(reports, now_ms, |r| Some(usage_of(r).map_or(0, f)));
            allocate(quota, me, &u)
        })
    };
    if dispatch {
        (
            share(q.dispatch_rate_in_msgs, |u| u.dispatch_rate_in_msgs),
            share(q.dispatch_rate_in_bytes, |u| u.dispatch_rate_in_bytes),
        )
    } else {
        (
            share(q.publish_rate_in_msgs, |u| u.publish_rate_in_msgs),
            share(q.publish_rate_in_bytes, |u| u.publish_rate_in_bytes),
        )
    }
}

/// A `message_age` backlog quota's verdict: the age in whole seconds of
/// the oldest unacknowledged message (published at `oldest_publish_ms`)
/// when it is older than `limit_time` seconds at `now_ms`; None when within
/// the limit, without a limit (`limit_time` < 1, Pulsar's -1) or with
/// nothing unacknowledged.
pub fn age_over(limit_time: i64, oldest_publish_ms: Option<u64>, now_ms: u64) -> Option<u64> {
    let limit = u64::try_from(limit_time).ok().filter(|&l| l > 0)?;
    let age_ms = now_ms.saturating_sub(oldest_publish_ms?);
    (age_ms > limit.saturating_mul(1000)).then_some(age_ms / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn json_shape_is_camel_case_and_absent_means_unlimited() {
        let q: Quotas =
            serde_json::from_str(r#"{"publishRateInMsgs":100,"maxTopics":null}"#).unwrap();
        assert_eq!(q.publish_rate_in_msgs, Some(100));
        assert_eq!(q.max_topics, None);
        assert_eq!(serde_json::to_string(&Quotas::default()).unwrap(), "{}");
        assert_eq!(
            serde_json::to_value(q).unwrap(),
            serde_json::json!({"publishRateInMsgs": 100})
        );
        assert!(serde_json::from_str::<Quotas>(r#"{"bogus":1}"#).is_err());
        assert!(serde_json::from_str::<Quotas>(r#"{"maxTopics":-1}"#).is_err());
        let zero: Quotas = serde_json::from_str(r#"{"publishRateInBytes":0}"#).unwrap();
        assert!(zero.validate().unwrap_err().contains("publishRateInBytes"));
        let counts: Quotas = serde_json::from_str(r#"{"maxProducers":0}"#).unwrap();
        assert_eq!(counts.validate(), Ok(()));
    }

    #[test]
    fn count_refusal_names_quota_and_value() {
        assert_eq!(
            check_count(Scope::Tenant("a"), "maxProducers", None, 99),
            Ok(())
        );
        assert_eq!(
            check_count(Scope::Tenant("a"), "maxProducers", Some(3), 2),
            Ok(())
        );
        let e = check_count(Scope::Namespace("a/b"), "maxTopics", Some(3), 3).unwrap_err();
        assert_eq!(e, "namespace a/b quota maxTopics=3 reached (3 in use)");
        let e = check_size(Scope::Tenant("a"), "storageBytes", Some(10), 11).unwrap_err();
        assert!(e.contains("storageBytes=10"), "{e}");
    }

    #[test]
    fn message_age_is_over_only_past_the_limit() {
        // No limit, nothing unacknowledged: never over.
        assert_eq!(age_over(-1, Some(0), 1_000_000), None);
        assert_eq!(age_over(0, Some(0), 1_000_000), None);
        assert_eq!(age_over(10, None, 1_000_000), None);
        // Exactly at the limit is within it; a millisecond more is over.
        assert_eq!(age_over(10, Some(5_000), 15_000), None);
        assert_eq!(age_over(10, Some(5_000), 15_001), Some(10));
        assert_eq!(age_over(10, Some(0), 42_500), Some(42));
        // A publish time in the future (clock skew) is age 0.
        assert_eq!(age_over(1, Some(9_000), 1_000), None);
    }

    #[test]
    fn one_broker_gets_the_whole_quota() {
        assert_eq!(allocate(1000, "a", &m(&[])), 1000);
        assert_eq!(allocate(1000, "a", &m(&[("a", 5)])), 1000);
        assert_eq!(allocate(0, "a", &m(&[])), 1);
    }

    #[test]
    fn shares_never_sum_above_the_quota() {
        for (ua, ub, uc) in [
            (0, 0, 0),
            (1000, 0, 0),
            (500, 500, 0),
            (1, 2, 3),
            (10_000, 1, 7),
        ] {
            let u = m(&[("a", ua), ("b", ub), ("c", uc)]);
            let sum: u64 = ["a", "b", "c"]
                .iter()
                .map(|me| allocate(1000, me, &u))
                .sum();
            assert!(sum <= 1000, "{ua} {ub} {uc}: {sum}");
            assert!(sum >= 997, "rounding only: {sum}");
        }
    }

    #[test]
    fn unused_share_moves_to_the_busy_broker() {
        // a is saturated at its share, b uses little: iterate the feedback
        // loop (usage next interval = min(demand, share)).
        let demand = [("a", 10_000u64), ("b", 100u64)];
        let mut share: BTreeMap<String, u64> = m(&[("a", 500), ("b", 500)]);
        for _ in 0..20 {
            let usage: BTreeMap<String, u64> = demand
                .iter()
                .map(|(id, d)| (id.to_string(), (*d).min(share[*id])))
                .collect();
            share = demand
                .iter()
                .map(|(id, _)| (id.to_string(), allocate(1000, id, &usage)))
                .collect();
        }
        assert!(share["a"] >= 850, "{share:?}");
        assert!(share["a"] + share["b"] <= 1000, "{share:?}");
        // b still gets at least its floor and what it uses.
        assert!(share["b"] >= 100, "{share:?}");
    }

    #[test]
    fn saturated_brokers_converge_to_equal_shares() {
        let mut share: BTreeMap<String, u64> = m(&[("a", 900), ("b", 100)]);
        for _ in 0..200 {
            let usage = share.clone();
            share = ["a", "b"]
                .iter()
                .map(|id| (id.to_string(), allocate(1000, id, &usage)))
                .collect();
        }
        assert!(share["a"].abs_diff(share["b"]) <= 20, "{share:?}");
    }

    #[test]
    fn a_new_broker_gets_a_floor_at_once() {
        let u = m(&[("a", 1000)]);
        let newcomer = allocate(1000, "b", &u);
        assert!(newcomer >= 40, "{newcomer}");
        assert!(newcomer + allocate(1000, "a", &m(&[("a", 1000), ("b", 0)])) <= 1000);
    }

    #[test]
    fn stale_reports_are_left_out() {
        let mut reports = BTreeMap::new();
        let mut fresh = UsageReport {
            at_ms: 10_000,
            ..UsageReport::default()
        };
        fresh.tenants.insert(
            "t".into(),
            Usage {
                publish_rate_in_msgs: 7,
                ..Usage::default()
            },
        );
        reports.insert("a".to_string(), fresh);
        let mut old = UsageReport {
            at_ms: 1_000,
            ..UsageReport::default()
        };
        old.tenants.insert(
            "t".into(),
            Usage {
                publish_rate_in_msgs: 9,
                ..Usage::default()
            },
        );
        reports.insert("b".to_string(), old);
        let u = usage_by_broker(&reports, 10_500, |r| {
            r.tenants.get("t").map(|u| u.publish_rate_in_msgs)
        });
        assert_eq!(u, m(&[("a", 7)]));
    }
}
