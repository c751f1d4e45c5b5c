//! `/admin/v2/namespaces`: create, list, get and delete namespaces, and the
//! per-policy endpoints (`/namespaces/{t}/{ns}/{policy}`, Pulsar's names:
//! `retention`, `messageTTL`, `backlogQuota` / `backlogQuotaMap`,
//! `deduplication`, `autoTopicCreation`, `maxProducersPerTopic`,
//! `maxConsumersPerTopic`, `maxConsumersPerSubscription`,
//! `maxTopicsPerNamespace`, `maxSubscriptionsPerTopic`, `publishRate`,
//! `dispatchRate`, `subscriptionDispatchRate`, `persistence`,
//! `schemaCompatibilityStrategy`, `isAllowAutoUpdateSchema`,
//! `replication`).
//!
//! Policies are stored as Pulsar `Policies` JSON in
//! `/cms/admin/namespaces/<t>/<ns>`; every change is a read-modify-CAS.
//! [`policy_get`] and [`policy_apply`] are pure (no I/O) and unit-tested.
//! Promises: a namespace is created only under an existing tenant; delete
//! answers 409 while the namespace has topics or queues unless `force=true`
//! (then its topics and queues are deleted first); a value is validated before it is stored.

use axum::extract::State;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tracing::info;

use crate::admin::{
    AdminError, AdminResult, Body, Params, QueryParams, St, names, no_content, ok_json, store,
    topics,
};
use crate::partitioned;
use crate::service::BrokerState;
use crate::tenancy::{
    AutoTopicCreationOverride, BacklogQuota, DispatchRate, NamespacePolicies, PersistencePolicies,
    PublishRate, RetentionPolicies, TenantInfo, namespace_path, tenant_path,
};
use crate::topic_name::{Domain, TopicName};

/// A change to one policy.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyOp {
    /// Set it to this JSON body.
    Set(Value),
    /// Back to the broker default.
    Clear,
}

/// Where a policy change applies beyond its body.
#[derive(Debug, Clone, Copy)]
pub struct PolicyScope<'a> {
    /// The cluster (rate maps are keyed by cluster name).
    pub cluster: &'a str,
    /// `backlogQuotaType` of backlog-quota changes.
    pub backlog_quota_type: &'a str,
}

fn unknown(policy: &str) -> AdminError {
    AdminError::NotFound(format!("no such namespace policy endpoint: {policy}"))
}

fn parse<T: DeserializeOwned>(policy: &str, v: Value) -> Result<T, AdminError> {
    serde_json::from_value(v).map_err(|e| AdminError::BadRequest(format!("invalid {policy}: {e}")))
}

fn count(policy: &str, v: Value) -> Result<u32, AdminError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            AdminError::BadRequest(format!(
                "{policy} must be an integer in 0..={}, got {v}",
                u32::MAX
            ))
        })
}

fn checked(r: Result<(), String>) -> Result<(), AdminError> {
    r.map_err(AdminError::BadRequest)
}

/// The JSON value of `policy` (`null` when unset). Pure.
pub fn policy_get(
    p: &NamespacePolicies,
    policy: &str,
    scope: PolicyScope<'_>,
) -> Result<Value, AdminError> {
    let c = scope.cluster;
    Ok(match policy {
        "retention" => json!(p.retention_policies),
        "messageTTL" => json!(p.message_ttl_in_seconds),
        "backlogQuota" | "backlogQuotaMap" => json!(p.backlog_quota_map),
        "deduplication" => json!(p.deduplication_enabled),
        "autoTopicCreation" => json!(p.auto_topic_creation_override),
        "maxProducersPerTopic" => json!(p.max_producers_per_topic),
        "maxConsumersPerTopic" => json!(p.max_consumers_per_topic),
        "maxConsumersPerSubscription" => json!(p.max_consumers_per_subscription),
        "maxTopicsPerNamespace" => json!(p.max_topics_per_namespace),
        "maxSubscriptionsPerTopic" => json!(p.max_subscriptions_per_topic),
        "publishRate" => json!(p.publish_max_message_rate.get(c)),
        "dispatchRate" => json!(p.topic_dispatch_rate.get(c)),
        "subscriptionDispatchRate" => json!(p.subscription_dispatch_rate.get(c)),
        "persistence" => json!(p.persistence),
        "replication" => json!(p.replication_clusters),
        "schemaCompatibilityStrategy" => json!(
            p.schema_compatibility_strategy
                .as_deref()
                .unwrap_or("UNDEFINED")
        ),
        "isAllowAutoUpdateSchema" => json!(p.is_allow_auto_update_schema.unwrap_or(true)),
        other => return Err(unknown(other)),
    })
}

/// Applies `op` to `policy` of `p`, validating the value. Pure.
pub fn policy_apply(
    p: &mut NamespacePolicies,
    policy: &str,
    op: PolicyOp,
    scope: PolicyScope<'_>,
) -> Result<(), AdminError> {
    let c = scope.cluster.to_string();
    let set = match op {
        PolicyOp::Set(v) => Some(v),
        PolicyOp::Clear => None,
    };
    match (policy, set) {
        ("retention", Some(v)) => {
            let r: RetentionPolicies = parse(policy, v)?;
            checked(r.validate())?;
            p.retention_policies = Some(r);
        }
        ("retention", None) => p.retention_policies = None,
        ("messageTTL", Some(v)) => p.message_ttl_in_seconds = Some(count(policy, v)?),
        ("messageTTL", None) => p.message_ttl_in_seconds = None,
        ("backlogQuota", Some(v)) => {
            let kind = scope.backlog_quota_type;
            if !crate::tenancy::BACKLOG_QUOTA_TYPES.contains(&kind) {
                return Err(AdminError::BadRequest(format!(
                    "backlogQuotaType {kind:?} is not one of {:?}",
                    crate::tenancy::BACKLOG_QUOTA_TYPES
                )));
            }
            let q: BacklogQuota = parse(policy, v)?;
            checked(q.validate())?;
            p.backlog_quota_map.insert(kind.to_string(), q);
        }
        ("backlogQuota", None) => {
            p.backlog_quota_map.remove(scope.backlog_quota_type);
        }
        ("deduplication", Some(v)) => {
            p.deduplication_enabled = Some(v.as_bool().ok_or_else(|| {
                AdminError::BadRequest(format!("deduplication must be true or false, got {v}"))
            })?);
        }
        ("deduplication", None) => p.deduplication_enabled = None,
        ("autoTopicCreation", Some(v)) => {
            let o: AutoTopicCreationOverride = parse(policy, v)?;
            checked(o.validate())?;
            p.allow_auto_topic_creation = Some(o.allow_auto_topic_creation);
            p.auto_topic_creation_override = Some(o);
        }
        ("autoTopicCreation", None) => {
            p.allow_auto_topic_creation = None;
            p.auto_topic_creation_override = None;
        }
        ("maxProducersPerTopic", v) => {
            p.max_producers_per_topic = v.map(|v| count(policy, v)).transpose()?
        }
        ("maxConsumersPerTopic", v) => {
            p.max_consumers_per_topic = v.map(|v| count(policy, v)).transpose()?
        }
        ("maxConsumersPerSubscription", v) => {
            p.max_consumers_per_subscription = v.map(|v| count(policy, v)).transpose()?
        }
        ("maxTopicsPerNamespace", v) => {
            p.max_topics_per_namespace = v.map(|v| count(policy, v)).transpose()?
        }
        ("maxSubscriptionsPerTopic", v) => {
            p.max_subscriptions_per_topic = v.map(|v| count(policy, v)).transpose()?
        }
        ("publishRate", Some(v)) => {
            let r: PublishRate = parse(policy, v)?;
            checked(r.validate())?;
            p.publish_max_message_rate.insert(c, r);
        }
        ("publishRate", None) => {
            p.publish_max_message_rate.remove(&c);
        }
        ("dispatchRate", Some(v)) => {
            let r: DispatchRate = parse(policy, v)?;
            checked(r.validate())?;
            p.topic_dispatch_rate.insert(c, r);
        }
        ("dispatchRate", None) => {
            p.topic_dispatch_rate.remove(&c);
        }
        ("subscriptionDispatchRate", Some(v)) => {
            let r: DispatchRate = parse(policy, v)?;
            checked(r.validate())?;
            p.subscription_dispatch_rate.insert(c, r);
        }
        ("subscriptionDispatchRate", None) => {
            p.subscription_dispatch_rate.remove(&c);
        }
        ("persistence", Some(v)) => {
            let r: PersistencePolicies = parse(policy, v)?;
            checked(r.validate())?;
            p.persistence = Some(r);
        }
        ("persistence", None) => p.persistence = None,
        ("replication", Some(v)) => {
            let list: Vec<String> = parse(policy, v)?;
            for name in &list {
                names::check("cluster", name)?;
                if *name != c {
                    return Err(AdminError::PreconditionFailed(format!(
                        "cluster {name} does not exist (this cluster is {c})"
                    )));
                }
            }
            p.replication_clusters = list;
        }
        ("replication", None) => p.replication_clusters.clear(),
        ("schemaCompatibilityStrategy", Some(v)) => {
            let name = v.as_str().ok_or_else(|| {
                AdminError::BadRequest(format!(
                    "schemaCompatibilityStrategy must be a strategy name, got {v}"
                ))
            })?;
            checked(crate::schema::Strategy::parse(name).map(|_| ()))?;
            p.schema_compatibility_strategy = Some(name.to_ascii_uppercase());
        }
        ("schemaCompatibilityStrategy", None) => p.schema_compatibility_strategy = None,
        ("isAllowAutoUpdateSchema", Some(v)) => {
            p.is_allow_auto_update_schema = Some(v.as_bool().ok_or_else(|| {
                AdminError::BadRequest(format!(
                    "isAllowAutoUpdateSchema must be true or false, got {v}"
                ))
            })?);
        }
        ("isAllowAutoUpdateSchema", None) => p.is_allow_auto_update_schema = None,
        (other, _) => return Err(unknown(other)),
    }
    checked(p.validate())
}

pub(crate) fn ns_params(p: &Params) -> Result<(String, String), AdminError> {
    let t = p.get("tenant")?;
    let ns = p.get("namespace")?;
    names::check("tenant", t)?;
    names::check("namespace", ns)?;
    Ok((t.to_string(), ns.to_string()))
}

async fn require_tenant(s: &BrokerState, t: &str) -> Result<(), AdminError> {
    match store::read::<TenantInfo>(&*s.store, &tenant_path(&s.layout, t)).await? {
        Some(_) => Ok(()),
        None => Err(AdminError::NotFound(format!("tenant {t} does not exist"))),
    }
}

/// The policies of `t/ns`, 404 if it does not exist.
pub async fn read_policies(
    s: &BrokerState,
    t: &str,
    ns: &str,
) -> Result<NamespacePolicies, AdminError> {
    match store::read::<NamespacePolicies>(&*s.store, &namespace_path(&s.layout, t, ns)).await? {
        Some((p, _)) => Ok(p),
        None => Err(AdminError::NotFound(format!(
            "namespace {t}/{ns} does not exist"
        ))),
    }
}

/// `GET /namespaces/{tenant}`: `["t/ns", ...]`.
pub async fn list(State(s): St, p: Params) -> AdminResult {
    let t = p.get("tenant")?;
    names::check("tenant", t)?;
    require_tenant(&s, t).await?;
    let dir = cms_bookie::metadata::join(&s.layout.namespaces(), t);
    let list: Vec<String> = store::children(&*s.store, &dir)
        .await?
        .into_iter()
        .map(|ns| format!("{t}/{ns}"))
        .collect();
    Ok(ok_json(json!(list)))
}

/// `GET /namespaces/{tenant}/{namespace}`: the full policies.
pub async fn get(State(s): St, p: Params) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let policies = read_policies(&s, &t, &ns).await?;
    Ok(ok_json(json!(policies)))
}

/// `PUT /namespaces/{tenant}/{namespace}` with optional policies.
pub async fn create(State(s): St, p: Params, body: Body) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let policies: NamespacePolicies = body.json_or_default()?;
    checked(policies.validate())?;
    require_tenant(&s, &t).await?;
    store::create(
        &*s.store,
        &namespace_path(&s.layout, &t, &ns),
        &policies,
        || format!("namespace {t}/{ns} already exists"),
    )
    .await?;
    info!(tenant = %t, namespace = %ns, "namespace created");
    Ok(no_content())
}

/// Persistent topics stored in `t/ns` (managed ledgers), sorted, full names.
pub async fn stored_topics(
    s: &BrokerState,
    t: &str,
    ns: &str,
) -> Result<Vec<TopicName>, AdminError> {
    let dir = format!("{}/{t}/{ns}/persistent", s.layout.managed_ledgers());
    Ok(store::children(&*s.store, &dir)
        .await?
        .into_iter()
        .map(|local| TopicName {
            domain: Domain::Persistent,
            tenant: t.to_string(),
            namespace: ns.to_string(),
            local,
        })
        .collect())
}

/// `DELETE /namespaces/{tenant}/{namespace}` (`?force=true` deletes its
/// topics first).
pub async fn delete(State(s): St, p: Params, q: QueryParams) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let force = q.flag("force")?;
    read_policies(&s, &t, &ns).await?;
    let stored = stored_topics(&s, &t, &ns).await?;
    let mut part = Vec::new();
    for d in [Domain::Persistent, Domain::NonPersistent] {
        part.extend(
            partitioned::list(&*s.store, &s.layout, &t, &ns, d)
                .await
                .map_err(topics::partitioned_error)?,
        );
    }
    let queues_dir = crate::admin::queues::queues_dir(&s, &t, &ns);
    let queues = store::children(&*s.store, &queues_dir).await?;
    if !force && !queues.is_empty() {
        return Err(AdminError::Conflict(format!(
            "namespace {t}/{ns} still has {} queue(s); delete them or use force=true",
            queues.len()
        )));
    }
    if !force && (!stored.is_empty() || !part.is_empty()) {
        return Err(AdminError::Conflict(format!(
            "namespace {t}/{ns} still has {} topic(s) and {} partitioned topic(s); delete them or use force=true",
            stored.len(),
            part.len()
        )));
    }
    for topic in &stored {
        topics::delete_stored_topic(&s, topic, true)
            .await
            .map_err(|e| topics::within_many(topic, e))?;
    }
    for q in &queues {
        match s
            .store
            .delete(
                &cms_bookie::metadata::join(&queues_dir, q),
                cms_bookie::metadata::Expected::Any,
            )
            .await
        {
            Ok(()) | Err(cms_bookie::metadata::MetadataError::NoNode(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for topic in &part {
        match partitioned::delete(&*s.store, &s.layout, topic).await {
            Ok(()) | Err(partitioned::PartitionedError::NotFound(_)) => {}
            Err(e) => return Err(topics::partitioned_error(e)),
        }
    }
    match s
        .store
        .delete(
            &namespace_path(&s.layout, &t, &ns),
            cms_bookie::metadata::Expected::Any,
        )
        .await
    {
        Ok(()) => {}
        Err(cms_bookie::metadata::MetadataError::NoNode(_)) => {
            return Err(AdminError::NotFound(format!(
                "namespace {t}/{ns} does not exist"
            )));
        }
        Err(e) => return Err(e.into()),
    }
    info!(tenant = %t, namespace = %ns, force, "namespace deleted");
    Ok(no_content())
}

/// `GET /namespaces/{tenant}/{namespace}/topics`: persistent topics (full
/// names, partitions included).
pub async fn topics(State(s): St, p: Params) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    read_policies(&s, &t, &ns).await?;
    let names: Vec<String> = stored_topics(&s, &t, &ns)
        .await?
        .iter()
        .map(ToString::to_string)
        .collect();
    Ok(ok_json(json!(names)))
}

/// `GET /namespaces/{tenant}/{namespace}/ownership`: every bundle of the
/// namespace with its owner (`null` while no broker owns it), in hash order.
pub async fn ownership(State(s): St, p: Params) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    read_policies(&s, &t, &ns).await?;
    let owners = s
        .ownership
        .bundle_owners(&t, &ns)
        .await
        .map_err(crate::admin::bundles::own_err)?;
    let out: Vec<Value> = owners
        .into_iter()
        .map(|(range, owner)| {
            json!({
                "bundle": range.to_string(),
                "owner": owner.as_ref().map(|o| o.broker_id.clone()),
                "serviceUrl": owner.as_ref().map(|o| o.service_url.clone()),
                "webServiceUrl": owner.as_ref().map(|o| o.http_url.clone()),
            })
        })
        .collect();
    Ok(ok_json(json!(out)))
}

fn scope<'a>(s: &'a BrokerState, q: &'a QueryParams) -> PolicyScope<'a> {
    PolicyScope {
        cluster: &s.cluster_name,
        backlog_quota_type: q
            .0
            .get("backlogQuotaType")
            .map_or("destination_storage", String::as_str),
    }
}

/// `GET /namespaces/{tenant}/{namespace}/{policy}`.
pub async fn get_policy(State(s): St, p: Params, q: QueryParams) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let policy = p.get("policy")?;
    // Unknown policy names are 404 before any store access.
    policy_get(&NamespacePolicies::default(), policy, scope(&s, &q))?;
    let policies = read_policies(&s, &t, &ns).await?;
    Ok(ok_json(policy_get(&policies, policy, scope(&s, &q))?))
}

async fn change_policy(s: &BrokerState, p: &Params, q: &QueryParams, op: PolicyOp) -> AdminResult {
    let (t, ns) = ns_params(p)?;
    let policy = p.get("policy")?.to_string();
    // Validate against an empty value first: a bad body is 400 even for a
    // namespace that does not exist.
    policy_apply(
        &mut NamespacePolicies::default(),
        &policy,
        op.clone(),
        scope(s, q),
    )?;
    store::update::<NamespacePolicies, _>(
        &*s.store,
        &namespace_path(&s.layout, &t, &ns),
        || format!("namespace {t}/{ns} does not exist"),
        |cur| policy_apply(cur, &policy, op.clone(), scope(s, q)),
    )
    .await?;
    info!(tenant = %t, namespace = %ns, policy, "namespace policy changed");
    Ok(no_content())
}

/// `POST /namespaces/{tenant}/{namespace}/{policy}` with the value.
pub async fn set_policy(State(s): St, p: Params, q: QueryParams, body: Body) -> AdminResult {
    if body.is_empty() {
        return Err(AdminError::BadRequest("missing request body".into()));
    }
    let v: Value = body.json()?;
    change_policy(&s, &p, &q, PolicyOp::Set(v)).await
}

/// `DELETE /namespaces/{tenant}/{namespace}/{policy}`: back to the default.
pub async fn clear_policy(State(s): St, p: Params, q: QueryParams) -> AdminResult {
    change_policy(&s, &p, &q, PolicyOp::Clear).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCOPE: PolicyScope<'static> = PolicyScope {
        cluster: "c1",
        backlog_quota_type: "destination_storage",
    };

    fn set(p: &mut NamespacePolicies, policy: &str, v: Value) -> Result<(), AdminError> {
        policy_apply(p, policy, PolicyOp::Set(v), SCOPE)
    }

    #[test]
    fn set_get_clear_round_trip_for_every_policy() {
        let cases = [
            (
                "retention",
                json!({"retentionTimeInMinutes": 10, "retentionSizeInMB": 100}),
            ),
            ("messageTTL", json!(60)),
            ("deduplication", json!(true)),
            (
                "autoTopicCreation",
                json!({"allowAutoTopicCreation": false, "topicType": "non-partitioned"}),
            ),
            ("maxProducersPerTopic", json!(5)),
            ("maxConsumersPerTopic", json!(6)),
            ("maxConsumersPerSubscription", json!(7)),
            ("maxTopicsPerNamespace", json!(8)),
            ("maxSubscriptionsPerTopic", json!(9)),
            (
                "publishRate",
                json!({"publishThrottlingRateInMsg": 10, "publishThrottlingRateInByte": -1}),
            ),
            (
                "dispatchRate",
                json!({"dispatchThrottlingRateInMsg": 1, "dispatchThrottlingRateInByte": 2, "ratePeriodInSecond": 1, "relativeToPublishRate": false}),
            ),
            (
                "subscriptionDispatchRate",
                json!({"dispatchThrottlingRateInMsg": 3, "dispatchThrottlingRateInByte": 4, "ratePeriodInSecond": 2, "relativeToPublishRate": false}),
            ),
            (
                "persistence",
                json!({"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2, "managedLedgerMaxMarkDeleteRate": 0.0}),
            ),
            ("replication", json!(["c1"])),
        ];
        for (policy, value) in cases {
            let mut p = NamespacePolicies::default();
            set(&mut p, policy, value.clone()).unwrap_or_else(|e| panic!("{policy}: {e}"));
            let mut got = policy_get(&p, policy, SCOPE).unwrap();
            if policy == "autoTopicCreation" {
                got.as_object_mut().unwrap().remove("defaultNumPartitions");
            }
            assert_eq!(got, value, "{policy}");
            policy_apply(&mut p, policy, PolicyOp::Clear, SCOPE).unwrap();
            let cleared = policy_get(&p, policy, SCOPE).unwrap();
            assert!(
                cleared.is_null() || cleared == json!([]),
                "{policy}: {cleared}"
            );
            assert_eq!(
                p,
                NamespacePolicies::default(),
                "{policy} left something behind"
            );
        }
    }

    #[test]
    fn backlog_quota_is_keyed_by_type() {
        let mut p = NamespacePolicies::default();
        let q = json!({"limitSize": 1000, "limitTime": -1, "policy": "producer_exception"});
        set(&mut p, "backlogQuota", q.clone()).unwrap();
        let age = PolicyScope {
            backlog_quota_type: "message_age",
            ..SCOPE
        };
        let q2 = json!({"limitSize": -1, "limitTime": 60, "policy": "producer_request_hold"});
        policy_apply(&mut p, "backlogQuota", PolicyOp::Set(q2.clone()), age).unwrap();
        assert_eq!(
            policy_get(&p, "backlogQuotaMap", SCOPE).unwrap(),
            json!({"destination_storage": q, "message_age": q2})
        );
        policy_apply(&mut p, "backlogQuota", PolicyOp::Clear, age).unwrap();
        assert_eq!(p.backlog_quota_map.len(), 1);
        let bad = PolicyScope {
            backlog_quota_type: "nope",
            ..SCOPE
        };
        assert!(matches!(
            policy_apply(
                &mut p,
                "backlogQuota",
                PolicyOp::Set(json!({"policy": "producer_exception"})),
                bad
            ),
            Err(AdminError::BadRequest(_))
        ));
    }

    #[test]
    fn bad_values_are_refused_and_leave_the_policies_alone() {
        let bad = [
            (
                "retention",
                json!({"retentionTimeInMinutes": -5, "retentionSizeInMB": 1}),
            ),
            ("retention", json!("ten")),
            ("messageTTL", json!(-1)),
            ("messageTTL", json!(1.5)),
            ("messageTTL", json!(u64::from(u32::MAX) + 1)),
            ("deduplication", json!("yes")),
            (
                "autoTopicCreation",
                json!({"allowAutoTopicCreation": true, "topicType": "partitioned", "defaultNumPartitions": 0}),
            ),
            ("maxProducersPerTopic", json!(-3)),
            ("publishRate", json!({"publishThrottlingRateInMsg": -2})),
            ("dispatchRate", json!({"ratePeriodInSecond": 0})),
            (
                "persistence",
                json!({"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 1}),
            ),
            (
                "backlogQuota",
                json!({"limitSize": 1, "policy": "drop_everything"}),
            ),
        ];
        for (policy, value) in bad {
            let mut p = NamespacePolicies::default();
            let before = p.clone();
            let r = set(&mut p, policy, value.clone());
            assert!(
                matches!(r, Err(AdminError::BadRequest(_))),
                "{policy} {value}: {r:?}"
            );
            assert_eq!(p, before, "{policy}: a refused value changed the policies");
        }
        let mut p = NamespacePolicies::default();
        assert!(matches!(
            set(&mut p, "replication", json!(["other"])),
            Err(AdminError::PreconditionFailed(_))
        ));
        assert!(matches!(
            set(&mut p, "nope", json!(1)),
            Err(AdminError::NotFound(_))
        ));
        assert!(matches!(
            policy_get(&p, "nope", SCOPE),
            Err(AdminError::NotFound(_))
        ));
    }
}
