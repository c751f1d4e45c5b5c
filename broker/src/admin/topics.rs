//! `/admin/v2/{persistent,non-persistent}/...`: topics and subscriptions.
//!
//! Topics: create (non-partitioned), partitioned create / update / get /
//! delete (through [`crate::partitioned`]), list, delete (`force=true` also
//! when producers or consumers are connected: they are disconnected),
//! stats, internal stats, unload. Subscriptions: list (the stored durable
//! cursors), create, delete, skip all, reset to a message id.
//!
//! Promises: a topic that does not exist answers 404 and is not created by a
//! read; a delete without `force` answers 409 while producers or consumers
//! are connected; non-persistent topics are listed and have stats while in
//! use ([`crate::non_persistent`]), other operations on them answer 412 —
//! their partitioned metadata works. Stats report what the broker tracks today (sizes,
//! backlogs, producers, consumers); per-topic rates are not tracked yet and
//! are left out rather than reported as zero.

use std::sync::Arc;

use axum::extract::State;
use axum::response::IntoResponse;
use cms_bookie::metadata::{CreateMode, MetadataError};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::info;

use crate::admin::namespaces::{read_policies, stored_topics};
use crate::admin::{
    AdminError, AdminResult, Body, Params, QueryParams, St, names, no_content, ok_json, store,
};
use crate::consumers::{message_counter, subscription_config};
use crate::managed_ledger::io::SeekTarget;
use crate::managed_ledger::io::managed_ledger::node_path;
use crate::managed_ledger::{
    InitialPosition, LedgerList, Position, PublishTimeSearch, SearchResult, SearchStep,
};
use crate::ownership::LookupAnswer;
use crate::partitioned::{self, PartitionedError};
use crate::service::BrokerState;
use crate::subscription::{SubError, Subscription};
use crate::subscriptions::OpenAs;
use crate::topic_name::{Domain, TopicName};
use crate::topics::{Topic, TopicError};

/// A partitioned-metadata error as an HTTP answer.
pub fn partitioned_error(e: PartitionedError) -> AdminError {
    match e {
        PartitionedError::AlreadyExists(_) => AdminError::Conflict(e.to_string()),
        PartitionedError::NotFound(_) => AdminError::NotFound(e.to_string()),
        PartitionedError::Invalid(_) => AdminError::BadRequest(e.to_string()),
        PartitionedError::Conflict(_) => AdminError::Conflict(e.to_string()),
        PartitionedError::Metadata(m) => m.into(),
        PartitionedError::Corrupt { .. } => AdminError::Internal(e.to_string()),
    }
}

fn topic_error(e: TopicError) -> AdminError {
    match e {
        TopicError::NotFound(m) => AdminError::NotFound(m),
        TopicError::NotAllowed(m) => AdminError::PreconditionFailed(m),
        TopicError::ServiceNotReady(m) | TopicError::Persistence(m) => AdminError::Unavailable(m),
    }
}

fn sub_error(e: SubError) -> AdminError {
    match e {
        SubError::OtherConsumersConnected { .. } => AdminError::PreconditionFailed(e.to_string()),
        SubError::Closed(_) => AdminError::Unavailable(e.to_string()),
        SubError::Dispatch(_) => AdminError::PreconditionFailed(e.to_string()),
        SubError::Ml(_) => AdminError::Unavailable(e.to_string()),
    }
}

fn domain_of(p: &Params) -> Result<Domain, AdminError> {
    names::domain(p.get("domain")?)
}

fn topic_of(p: &Params) -> Result<TopicName, AdminError> {
    names::topic(
        domain_of(p)?,
        p.get("tenant")?,
        p.get("namespace")?,
        p.get("topic")?,
    )
}

fn persistent_only(t: &TopicName) -> Result<(), AdminError> {
    if t.domain != Domain::Persistent {
        return Err(AdminError::PreconditionFailed(format!(
            "{t}: this operation is not supported on non-persistent topics"
        )));
    }
    Ok(())
}

fn ml_path(s: &BrokerState, t: &TopicName) -> Result<String, AdminError> {
    node_path(&s.layout, &t.managed_ledger_name())
        .map_err(|e| AdminError::BadRequest(e.to_string()))
}

pub(crate) async fn stored(s: &BrokerState, t: &TopicName) -> Result<bool, AdminError> {
    if t.domain != Domain::Persistent {
        return Ok(false);
    }
    Ok(s.store.exists(&ml_path(s, t)?).await?.is_some())
}

/// The loaded topic, loading it if it is stored (never creates one); a
/// topic another broker owns answers [`AdminError::Redirect`] (307 there).
pub(crate) async fn load(s: &BrokerState, t: &TopicName) -> Result<Arc<Topic>, AdminError> {
    persistent_only(t)?;
    if !stored(s, t).await? {
        return Err(AdminError::NotFound(format!("topic {t} does not exist")));
    }
    match s.ownership.lookup(t, false).await {
        Ok(LookupAnswer::Connect) => {}
        Ok(LookupAnswer::Redirect {
            http_url,
            http_url_tls,
            ..
        }) => return Err(AdminError::Redirect(http_url, http_url_tls)),
        Err(e) => return Err(AdminError::Unavailable(format!("ownership of {t}: {e}"))),
    }
    s.topics.get_or_load(t, false).await.map_err(topic_error)
}

/// A redirect of one topic inside a request spanning several topics
/// becomes 503 naming the owner (the request cannot move as a whole).
pub(crate) fn within_many(t: &TopicName, e: AdminError) -> AdminError {
    match e {
        AdminError::Redirect(owner, _) => {
            AdminError::Unavailable(format!("{t} is served by {owner}; ask that broker"))
        }
        other => other,
    }
}

/// As [`load`], for requests that span several topics (they cannot be
/// redirected as a whole): a topic owned elsewhere answers 503 naming the
/// owner.
pub(crate) async fn load_here(s: &BrokerState, t: &TopicName) -> Result<Arc<Topic>, AdminError> {
    load(s, t).await.map_err(|e| within_many(t, e))
}

fn partition_count_body(body: &Body) -> Result<u32, AdminError> {
    let v: Value = body.json()?;
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            AdminError::BadRequest(format!("partition count must be an integer, got {v}"))
        })
}

/// `GET /{domain}/{tenant}/{namespace}`: topics of the namespace (stored
/// persistent topics, partitions included).
pub async fn list(State(s): St, p: Params) -> AdminResult {
    let d = domain_of(&p)?;
    let (t, ns) = (p.get("tenant")?, p.get("namespace")?);
    names::check("tenant", t)?;
    names::check("namespace", ns)?;
    read_policies(&s, t, ns).await?;
    let list: Vec<String> = if d == Domain::Persistent {
        stored_topics(&s, t, ns)
            .await?
            .iter()
            .map(ToString::to_string)
            .collect()
    } else {
        // Non-persistent topics exist while they are in use on this broker.
        s.topics
            .non_persistent()
            .names()
            .iter()
            .filter(|n| n.tenant == t && n.namespace == ns)
            .map(ToString::to_string)
            .collect()
    };
    Ok(ok_json(json!(list)))
}

/// `GET /{domain}/{tenant}/{namespace}/partitioned`.
pub async fn list_partitioned(State(s): St, p: Params) -> AdminResult {
    let d = domain_of(&p)?;
    let (t, ns) = (p.get("tenant")?, p.get("namespace")?);
    names::check("tenant", t)?;
    names::check("namespace", ns)?;
    read_policies(&s, t, ns).await?;
    let list: Vec<String> = partitioned::list(&*s.store, &s.layout, t, ns, d)
        .await
        .map_err(partitioned_error)?
        .iter()
        .map(ToString::to_string)
        .collect();
    Ok(ok_json(json!(list)))
}

/// `PUT /{domain}/{tenant}/{namespace}/{topic}`: a non-partitioned topic.
pub async fn create(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    read_policies(&s, &t.tenant, &t.namespace).await?;
    persistent_only(&t)?;
    if partitioned::partitions(&*s.store, &s.layout, &t)
        .await
        .map_err(partitioned_error)?
        .is_some()
    {
        return Err(AdminError::Conflict(format!(
            "{t} exists as a partitioned topic"
        )));
    }
    if !stored(&s, &t).await? {
        crate::quota_io::check_new_topic(&*s.store, &s.layout, &t.tenant, &t.namespace)
            .await
            .map_err(AdminError::Conflict)?;
    }
    create_topic_node(&s, &t).await?;
    info!(tenant = %t.tenant, namespace = %t.namespace, topic = %t, "topic created");
    Ok(no_content())
}

/// Stores topic `t` (an empty ledger list: the first load starts a
/// ledger); 409 if it exists.
pub(crate) async fn create_topic_node(s: &BrokerState, t: &TopicName) -> Result<(), AdminError> {
    let path = ml_path(s, t)?;
    if let Some(parent) = cms_bookie::metadata::parent_of(&path) {
        s.store.create_all(parent).await?;
    }
    match s.store.create(&path, b"", CreateMode::Persistent).await {
        Ok(_) => Ok(()),
        Err(MetadataError::NodeExists(_)) => {
            Err(AdminError::Conflict(format!("topic {t} already exists")))
        }
        Err(e) => Err(e.into()),
    }
}

/// Deletes stored topic `t`: 409 while producers or consumers are connected
/// unless `force` (they are disconnected by the unload).
pub async fn delete_stored_topic(
    s: &BrokerState,
    t: &TopicName,
    force: bool,
) -> Result<(), AdminError> {
    let topic = load(s, t).await?;
    if !force {
        let producers = topic.producer_count();
        let consumers: usize = topic
            .subscriptions
            .open_now()
            .await
            .iter()
            .map(Subscription::consumer_count)
            .sum();
        if producers + consumers > 0 {
            return Err(AdminError::Conflict(format!(
                "topic {t} has {producers} producer(s) and {consumers} consumer(s) connected; use force=true"
            )));
        }
    }
    // Delete while still loaded (the managed ledger turns terminal, so a
    // client reconnecting meanwhile cannot reopen the old data), then
    // unload: producers and consumers are told to close.
    let deleted = topic.ml.delete().await;
    s.topics.unload(&topic, "deleted by admin").await;
    deleted.map_err(|e| AdminError::Unavailable(format!("deleting {t}: {e}")))?;
    info!(tenant = %t.tenant, namespace = %t.namespace, topic = %t, force, "topic deleted");
    Ok(())
}

/// `DELETE /{domain}/{tenant}/{namespace}/{topic}` (`?force=true`).
pub async fn delete(State(s): St, p: Params, q: QueryParams) -> AdminResult {
    let t = topic_of(&p)?;
    let force = q.flag("force")?;
    delete_stored_topic(&s, &t, force).await?;
    // A partition shares its partitioned topic's schema: only a whole topic
    // takes its schema with it (as Pulsar).
    if partitioned::partition_of(&t).is_none() {
        crate::admin::schemas::remove_with_topic(&s, &t).await?;
    }
    Ok(no_content())
}

/// `PUT .../{topic}/partitions` with the count.
pub async fn create_partitioned(State(s): St, p: Params, body: Body) -> AdminResult {
    let t = topic_of(&p)?;
    let n = partition_count_body(&body)?;
    read_policies(&s, &t.tenant, &t.namespace).await?;
    if stored(&s, &t).await? {
        return Err(AdminError::Conflict(format!(
            "{t} exists as a non-partitioned topic"
        )));
    }
    partitioned::create(&*s.store, &s.layout, &t, n)
        .await
        .map_err(partitioned_error)?;
    info!(tenant = %t.tenant, namespace = %t.namespace, topic = %t, partitions = n, "partitioned topic created");
    Ok(no_content())
}

/// `POST .../{topic}/partitions` with the new (larger) count.
pub async fn update_partitioned(State(s): St, p: Params, body: Body) -> AdminResult {
    let t = topic_of(&p)?;
    let n = partition_count_body(&body)?;
    partitioned::update(&*s.store, &s.layout, &t, n)
        .await
        .map_err(partitioned_error)?;
    info!(tenant = %t.tenant, namespace = %t.namespace, topic = %t, partitions = n, "partitioned topic updated");
    Ok(no_content())
}

/// `GET .../{topic}/partitions`: `{"partitions": n}` (0 when not
/// partitioned, as Pulsar answers).
pub async fn get_partitioned(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    read_policies(&s, &t.tenant, &t.namespace).await?;
    let n = partitioned::partitions(&*s.store, &s.layout, &t)
        .await
        .map_err(partitioned_error)?
        .unwrap_or(0);
    Ok(ok_json(json!({ "partitions": n })))
}

/// `DELETE .../{topic}/partitions` (`?force=true`): its stored partitions,
/// then the partitioned-topic node.
pub async fn delete_partitioned(State(s): St, p: Params, q: QueryParams) -> AdminResult {
    let t = topic_of(&p)?;
    let force = q.flag("force")?;
    let Some(n) = partitioned::partitions(&*s.store, &s.layout, &t)
        .await
        .map_err(partitioned_error)?
    else {
        return Err(AdminError::NotFound(format!(
            "partitioned topic {t} does not exist"
        )));
    };
    for i in 0..n {
        let part = partitioned::partition_name(&t, i);
        if stored(&s, &part).await? {
            delete_stored_topic(&s, &part, force)
                .await
                .map_err(|e| within_many(&part, e))?;
        }
    }
    partitioned::delete(&*s.store, &s.layout, &t)
        .await
        .map_err(partitioned_error)?;
    crate::admin::schemas::remove_with_topic(&s, &t).await?;
    info!(tenant = %t.tenant, namespace = %t.namespace, topic = %t, "partitioned topic deleted");
    Ok(no_content())
}

fn position_json(p: Position) -> String {
    format!("{}:{}", p.ledger_id, p.entry_id)
}

/// The stored durable subscriptions of `t` (its cursor nodes, less the
/// de-duplication system cursor), sorted.
async fn stored_subscriptions(s: &BrokerState, t: &TopicName) -> Result<Vec<String>, AdminError> {
    let mut names = store::children(&*s.store, &ml_path(s, t)?).await?;
    names.retain(|n| n != crate::dedup::DEDUP_CURSOR);
    Ok(names)
}

/// Opens stored subscription `name` of a loaded topic (404 if not stored).
pub(crate) async fn open_subscription(
    s: &BrokerState,
    t: &TopicName,
    topic: &Topic,
    name: &str,
) -> Result<Subscription, AdminError> {
    names::check("subscription", name)?;
    if !topic.subscriptions.contains(name).await
        && !stored_subscriptions(s, t).await?.iter().any(|n| n == name)
    {
        return Err(AdminError::NotFound(format!(
            "subscription {name} of {t} does not exist"
        )));
    }
    topic
        .subscriptions
        .get_or_open(
            &topic.ml,
            name,
            OpenAs::Durable(InitialPosition::Latest),
            message_counter(),
            subscription_config(s, t, name).await,
        )
        .await
        .map_err(sub_error)
}

/// `GET .../{topic}/stats`: Pulsar `TopicStats` (the parts tracked).
pub async fn stats(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    if t.domain == Domain::NonPersistent {
        return Ok(ok_json(non_persistent_stats(&s, &t)?));
    }
    Ok(ok_json(topic_stats(&s, &t).await?))
}

/// The stats of a loaded non-persistent topic (404 when not in use): per
/// subscription its type, consumers and the messages delivered and dropped
/// since it was created (counts, not rates).
fn non_persistent_stats(s: &BrokerState, t: &TopicName) -> Result<Value, AdminError> {
    let Some(topic) = s.topics.non_persistent().get(t) else {
        return Err(AdminError::NotFound(format!(
            "non-persistent topic {t} is not in use on this broker"
        )));
    };
    let mut subs = serde_json::Map::new();
    for st in topic.subscription_stats() {
        subs.insert(
            st.name.clone(),
            json!({
                "type": st.sub_type.map(|x| x.to_string()),
                "consumersCount": st.consumers.len(),
                "consumers": st.consumers.iter().map(|(name, permits)| json!({
                    "consumerName": name,
                    "availablePermits": permits,
                })).collect::<Vec<_>>(),
                "msgDeliveredCount": st.delivered,
                "msgDropCount": st.dropped,
            }),
        );
    }
    Ok(json!({
        "entriesPublishedCount": topic.last_entry_id().map_or(0, |e| e + 1),
        "subscriptions": subs,
    }))
}

/// The `TopicStats` JSON of stored topic `t`.
async fn topic_stats(s: &BrokerState, t: &TopicName) -> Result<Value, AdminError> {
    let topic = load(s, t).await?;
    let ledgers = topic.ml.ledgers();
    let storage: u64 = ledgers.ledgers().iter().map(|l| l.size_bytes).sum();
    let publishers: Vec<Value> = topic
        .producers_connected()
        .into_iter()
        .map(|(name, mode)| json!({"producerName": name, "accessMode": format!("{mode:?}")}))
        .collect();
    let mut subs = serde_json::Map::new();
    for name in stored_subscriptions(s, t).await? {
        if names::check("subscription", &name).is_ok() {
            // Opening restores the stored cursor; it does not move it.
            let _ = open_subscription(s, t, &topic, &name).await?;
        }
    }
    for sub in topic.subscriptions.open_now().await {
        let st = sub.stats();
        let consumers: Vec<Value> = st
            .dispatcher
            .consumers
            .iter()
            .map(|c| {
                json!({
                    "consumerName": c.name,
                    "availablePermits": c.permits,
                    "unackedMessages": c.unacked_messages,
                    "blockedConsumerOnUnackedMsgs": c.blocked,
                })
            })
            .collect();
        subs.insert(
            st.name.clone(),
            json!({
                "type": st.dispatcher.sub_type.map(|t| t.to_string()),
                "msgBacklog": st.msg_backlog,
                "unackedMessages": st.dispatcher.unacked_messages,
                "blockedSubscriptionOnUnackedMsgs": st.dispatcher.blocked,
                "isDurable": st.durable,
                "consumers": consumers,
            }),
        );
    }
    let (n, r) = topic.counters.sample(std::time::Instant::now());
    Ok(json!({
        "msgRateIn": r.msgs_in,
        "msgThroughputIn": r.bytes_in,
        "msgRateOut": r.msgs_out,
        "msgThroughputOut": r.bytes_out,
        "msgInCounter": n.msgs_in,
        "bytesInCounter": n.bytes_in,
        "msgOutCounter": n.msgs_out,
        "bytesOutCounter": n.bytes_out,
        "averageMsgSize": if n.msgs_in == 0 { 0.0 } else { n.bytes_in as f64 / n.msgs_in as f64 },
        "storageSize": storage,
        "publishers": publishers,
        "subscriptions": subs,
        "deduplicationStatus": if topic.dedup.is_some() { "Enabled" } else { "Disabled" },
    }))
}

/// Adds `part` (a `TopicStats`) into `sum`: sizes and counts added,
/// publishers appended, subscriptions merged by name. Pure.
pub fn merge_stats(sum: &mut Value, part: &Value) {
    let add = |a: &Value, b: &Value| json!(a.as_u64().unwrap_or(0) + b.as_u64().unwrap_or(0));
    sum["storageSize"] = add(&sum["storageSize"], &part["storageSize"]);
    for k in [
        "msgInCounter",
        "bytesInCounter",
        "msgOutCounter",
        "bytesOutCounter",
    ] {
        sum[k] = add(&sum[k], &part[k]);
    }
    for k in [
        "msgRateIn",
        "msgThroughputIn",
        "msgRateOut",
        "msgThroughputOut",
    ] {
        sum[k] = json!(sum[k].as_f64().unwrap_or(0.0) + part[k].as_f64().unwrap_or(0.0));
    }
    let (msgs, bytes) = (
        sum["msgInCounter"].as_u64().unwrap_or(0),
        sum["bytesInCounter"].as_u64().unwrap_or(0),
    );
    sum["averageMsgSize"] = json!(if msgs == 0 {
        0.0
    } else {
        bytes as f64 / msgs as f64
    });
    let mut publishers = sum["publishers"].as_array().cloned().unwrap_or_default();
    publishers.extend(part["publishers"].as_array().cloned().unwrap_or_default());
    sum["publishers"] = json!(publishers);
    if !sum["subscriptions"].is_object() {
        sum["subscriptions"] = json!({});
    }
    if let Some(subs) = part["subscriptions"].as_object() {
        for (name, st) in subs {
            let into = &mut sum["subscriptions"][name.as_str()];
            if into.is_null() {
                *into = st.clone();
                continue;
            }
            for k in ["msgBacklog", "unackedMessages"] {
                into[k] = add(&into[k], &st[k]);
            }
            let mut consumers = into["consumers"].as_array().cloned().unwrap_or_default();
            consumers.extend(st["consumers"].as_array().cloned().unwrap_or_default());
            into["consumers"] = json!(consumers);
        }
    }
}

/// `GET .../{topic}/partitioned-stats` (`?perPartition=true` adds each
/// partition's stats): the partitions' stats summed. Partitions never used
/// (not stored yet) count as empty.
pub async fn partitioned_stats(State(s): St, p: Params, q: QueryParams) -> AdminResult {
    let t = topic_of(&p)?;
    let per_partition = q.flag("perPartition")?;
    let Some(n) = partitioned::partitions(&*s.store, &s.layout, &t)
        .await
        .map_err(partitioned_error)?
    else {
        return Err(AdminError::NotFound(format!(
            "partitioned topic {t} does not exist"
        )));
    };
    persistent_only(&t)?;
    let mut sum = json!({"storageSize": 0, "publishers": [], "subscriptions": {}});
    let mut parts = serde_json::Map::new();
    for i in 0..n {
        let part = partitioned::partition_name(&t, i);
        if !stored(&s, &part).await? {
            continue;
        }
        let st = topic_stats(&s, &part)
            .await
            .map_err(|e| within_many(&part, e))?;
        merge_stats(&mut sum, &st);
        if per_partition {
            parts.insert(part.to_string(), st);
        }
    }
    sum["metadata"] = json!({ "partitions": n });
    if per_partition {
        sum["partitions"] = Value::Object(parts);
    }
    Ok(ok_json(sum))
}

/// `GET .../{topic}/lastMessageId`: the last stored entry
/// (`{"ledgerId","entryId","partitionIndex":-1}`).
pub async fn last_message_id(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    let topic = load(&s, &t).await?;
    let last = topic.ml.last_confirmed();
    Ok(ok_json(json!({
        "ledgerId": last.ledger_id,
        "entryId": last.entry_id,
        "partitionIndex": -1,
    })))
}

/// `GET .../{topic}/internalStats`: ledgers and cursors.
pub async fn internal_stats(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    let topic = load(&s, &t).await?;
    let list = topic.ml.ledgers();
    let ledgers: Vec<Value> = list
        .ledgers()
        .iter()
        .map(|l| json!({"ledgerId": l.ledger_id, "entries": l.entries, "size": l.size_bytes, "offloaded": false}))
        .collect();
    let current = list.current_ledger_id();
    let current_meta = current.and_then(|id| list.ledger(id));
    let mut cursors = serde_json::Map::new();
    for sub in topic.subscriptions.open_now().await {
        let st = sub.stats();
        cursors.insert(
            st.name.clone(),
            json!({
                "markDeletePosition": position_json(st.mark_delete),
                "readPosition": position_json(st.read_position),
                "numberOfEntriesSinceFirstNotAckedMessage": st.msg_backlog,
                "state": if st.failed.is_some() { "Failed" } else { "Open" },
            }),
        );
    }
    Ok(ok_json(json!({
        "numberOfEntries": list.ledgers().iter().map(|l| l.entries).sum::<u64>(),
        "totalSize": list.ledgers().iter().map(|l| l.size_bytes).sum::<u64>(),
        "currentLedgerEntries": current_meta.map_or(0, |l| l.entries),
        "currentLedgerSize": current_meta.map_or(0, |l| l.size_bytes),
        "lastConfirmedEntry": position_json(topic.ml.last_confirmed()),
        "state": if topic.ml.terminal_error().is_some() { "Closed" } else { "LedgerOpened" },
        "ledgers": ledgers,
        "cursors": cursors,
        "appliedPolicies": applied_policies(&s, &topic),
    })))
}

/// The managed-ledger settings the loaded topic runs with (its namespace
/// policies at load over the broker defaults).
fn applied_policies(s: &BrokerState, topic: &Topic) -> Value {
    let c = crate::tenancy::ml_config_for(&s.topics.context().ml_config, &topic.policies);
    json!({
        "bookkeeperEnsemble": c.ensemble_size,
        "bookkeeperWriteQuorum": c.write_quorum,
        "bookkeeperAckQuorum": c.ack_quorum,
        "retentionTimeInMinutes": c.retention.time_minutes,
        "retentionSizeInMB": c.retention.size_mb,
        "messageTtlInSeconds": c.message_ttl_seconds,
    })
}

/// `GET .../{topic}/subscriptions`: the stored durable subscriptions.
pub async fn subscriptions(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    persistent_only(&t)?;
    if !stored(&s, &t).await? {
        return Err(AdminError::NotFound(format!("topic {t} does not exist")));
    }
    Ok(ok_json(json!(stored_subscriptions(&s, &t).await?)))
}

/// `PUT .../{topic}/unload`: closes the topic here (clients reconnect).
pub async fn unload(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    persistent_only(&t)?;
    if !stored(&s, &t).await? {
        return Err(AdminError::NotFound(format!("topic {t} does not exist")));
    }
    if let Some(topic) = s.topics.get_loaded(&t) {
        s.topics.unload(&topic, "unloaded by admin").await;
    }
    Ok(no_content())
}

/// Pulsar's `MessageId` JSON (`ledgerId`, `entryId`; others ignored).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageIdBody {
    ledger_id: i64,
    entry_id: i64,
}

fn seek_target(id: &MessageIdBody) -> Result<SeekTarget, AdminError> {
    if id.ledger_id == -1 && id.entry_id == -1 {
        return Ok(SeekTarget::Earliest);
    }
    if id.ledger_id == i64::MAX && id.entry_id == i64::MAX {
        return Ok(SeekTarget::Latest);
    }
    let ledger = u64::try_from(id.ledger_id)
        .map_err(|_| AdminError::BadRequest(format!("invalid ledgerId {}", id.ledger_id)))?;
    if id.entry_id < -1 {
        return Err(AdminError::BadRequest(format!(
            "invalid entryId {}",
            id.entry_id
        )));
    }
    Ok(SeekTarget::Position(Position::new(ledger, id.entry_id)))
}

/// `PUT .../{topic}/subscription/{subscription}` with an optional
/// `MessageId` start position (default: latest); 409 if it exists.
pub async fn create_subscription(State(s): St, p: Params, body: Body) -> AdminResult {
    let t = topic_of(&p)?;
    let name = p.get("subscription")?;
    names::check("subscription", name)?;
    let target = if body.is_empty() {
        SeekTarget::Latest
    } else {
        seek_target(&body.json()?)?
    };
    let topic = load(&s, &t).await?;
    if topic.subscriptions.contains(name).await
        || stored_subscriptions(&s, &t)
            .await?
            .iter()
            .any(|n| n == name)
    {
        return Err(AdminError::Conflict(format!(
            "subscription {name} of {t} already exists"
        )));
    }
    let initial = if target == SeekTarget::Earliest {
        InitialPosition::Earliest
    } else {
        InitialPosition::Latest
    };
    let sub = topic
        .subscriptions
        .get_or_open(
            &topic.ml,
            name,
            OpenAs::Durable(initial),
            message_counter(),
            subscription_config(&s, &t, name).await,
        )
        .await
        .map_err(sub_error)?;
    if let SeekTarget::Position(_) = target {
        sub.seek(target).await.map_err(sub_error)?;
    }
    info!(topic = %t, subscription = name, "subscription created");
    Ok(no_content())
}

/// `DELETE .../{topic}/subscription/{subscription}`: 412 while consumers
/// are connected.
pub async fn delete_subscription(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    let name = p.get("subscription")?;
    let topic = load(&s, &t).await?;
    let sub = open_subscription(&s, &t, &topic, name).await?;
    sub.unsubscribe(None).await.map_err(sub_error)?;
    topic.subscriptions.forget(&sub).await;
    info!(topic = %t, subscription = name, "subscription deleted");
    Ok(no_content())
}

/// `POST .../subscription/{subscription}/skip_all`: clears the backlog.
pub async fn skip_all(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    let name = p.get("subscription")?;
    let topic = load(&s, &t).await?;
    let sub = open_subscription(&s, &t, &topic, name).await?;
    sub.seek(SeekTarget::Latest).await.map_err(sub_error)?;
    info!(topic = %t, subscription = name, "backlog skipped");
    Ok(no_content())
}

/// The `k`-th entry after `after` (k >= 1), skipping empty, trimmed and
/// missing ledgers; None when fewer than `k` entries follow. Pure.
pub fn nth_entry_after(list: &LedgerList, after: Position, k: u64) -> Option<Position> {
    let first = list.next_valid_position(after)?;
    let mut left = k.checked_sub(1)?;
    let mut at = first;
    for l in list.ledgers() {
        if l.ledger_id < at.ledger_id || l.entries == 0 {
            continue;
        }
        let start = if l.ledger_id == at.ledger_id {
            at.entry_id
        } else {
            0
        };
        let room = l.entries.saturating_sub(start.unsigned_abs());
        if left < room {
            let entry = start.checked_add(i64::try_from(left).ok()?)?;
            return Some(Position::new(l.ledger_id, entry));
        }
        left -= room;
        at = Position::new(l.ledger_id.saturating_add(1), 0);
    }
    None
}

fn count_param(p: &Params, name: &str) -> Result<u64, AdminError> {
    let v = p.get(name)?;
    v.parse::<u64>().map_err(|_| {
        AdminError::BadRequest(format!("{name} must be a non-negative integer, got {v:?}"))
    })
}

/// `POST .../subscription/{subscription}/skip/{count}`: acknowledges the
/// next `count` entries after the mark-delete (all of them if fewer).
pub async fn skip(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    let name = p.get("subscription")?;
    let n = count_param(&p, "count")?;
    let topic = load(&s, &t).await?;
    let sub = open_subscription(&s, &t, &topic, name).await?;
    if n > 0 {
        let md = sub.stats().mark_delete;
        let target = match nth_entry_after(&topic.ml.ledgers(), md, n.saturating_add(1)) {
            Some(p) => SeekTarget::Position(p),
            None => SeekTarget::Latest,
        };
        sub.seek(target).await.map_err(sub_error)?;
    }
    info!(topic = %t, subscription = name, count = n, "entries skipped");
    Ok(no_content())
}

/// `POST .../all_subscription/expireMessages/{seconds}`: every durable
/// subscription acknowledges the entries older than `seconds`.
pub async fn expire_all(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    let secs = count_param(&p, "seconds")?;
    if secs == 0 {
        return Err(AdminError::BadRequest("seconds must be >= 1".into()));
    }
    let topic = load(&s, &t).await?;
    // Durable subscriptions stored but not open yet get their cursors
    // opened, so they expire too.
    for name in stored_subscriptions(&s, &t).await? {
        if names::check("subscription", &name).is_ok() {
            let _ = open_subscription(&s, &t, &topic, &name).await?;
        }
    }
    let moved = topic
        .ml
        .expire_messages(secs)
        .await
        .map_err(|e| AdminError::Unavailable(format!("expiring messages of {t}: {e}")))?;
    info!(topic = %t, seconds = secs, subscriptions = ?moved, "messages expired");
    Ok(no_content())
}

fn publish_time(entry: &[u8]) -> Option<u64> {
    cms_client::proto::frame::parse_entry(entry)
        .ok()
        .map(|p| p.metadata.publish_time)
}

/// `POST .../subscription/{subscription}/expireMessages/{seconds}`: the
/// subscription acknowledges the entries after its mark-delete published
/// more than `seconds` ago (found by a publish-time search; the cursor only
/// moves forward).
pub async fn expire(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    let name = p.get("subscription")?;
    let secs = count_param(&p, "seconds")?;
    if secs == 0 {
        return Err(AdminError::BadRequest("seconds must be >= 1".into()));
    }
    let topic = load(&s, &t).await?;
    let sub = open_subscription(&s, &t, &topic, name).await?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let cutoff = now_ms.saturating_sub(secs.saturating_mul(1000));
    let md = sub.stats().mark_delete;
    let list = topic.ml.ledgers();
    let mut search = PublishTimeSearch::after(&list, md, cutoff);
    let mut step = search.step();
    let result = loop {
        match step {
            SearchStep::Read(at) => {
                let e = topic
                    .ml
                    .read(at, 1)
                    .await
                    .map_err(|e| AdminError::Unavailable(format!("reading {t}: {e}")))?;
                let entry = e.into_iter().find(|e| e.position == at).ok_or_else(|| {
                    AdminError::Unavailable(format!(
                        "entry {} of {t} not readable",
                        position_json(at)
                    ))
                })?;
                // An entry without a readable publish time counts as new.
                let ts = publish_time(&entry.payload).unwrap_or(u64::MAX);
                step = search
                    .feed(at, ts)
                    .map_err(|e| AdminError::Internal(e.to_string()))?;
            }
            SearchStep::Done(r) => break r,
        }
    };
    let target = match result {
        SearchResult::Found(at) if Some(at) == list.next_valid_position(md) => None,
        SearchResult::Found(at) => Some(SeekTarget::Position(at)),
        SearchResult::NoneAtOrAfter => Some(SeekTarget::Latest),
    };
    if let Some(target) = target {
        sub.seek(target).await.map_err(sub_error)?;
    }
    info!(topic = %t, subscription = name, seconds = secs, ?target, "messages expired");
    Ok(no_content())
}

/// `GET .../subscription/{subscription}/position/{n}` (peek): the `n`-th
/// entry after the mark-delete (n >= 1), as Pulsar answers it: the payload
/// bytes with `X-Pulsar-*` headers.
pub async fn peek(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    let name = p.get("subscription")?;
    let n = count_param(&p, "position")?;
    if n == 0 {
        return Err(AdminError::BadRequest("position starts at 1".into()));
    }
    let topic = load(&s, &t).await?;
    let sub = open_subscription(&s, &t, &topic, name).await?;
    let md = sub.stats().mark_delete;
    let Some(pos) = nth_entry_after(&topic.ml.ledgers(), md, n) else {
        return Err(AdminError::NotFound(format!(
            "subscription {name} of {t} has fewer than {n} entries in its backlog"
        )));
    };
    let entries = topic
        .ml
        .read(pos, 1)
        .await
        .map_err(|e| AdminError::Unavailable(format!("reading {t} at {pos:?}: {e}")))?;
    let Some(entry) = entries.into_iter().find(|e| e.position == pos) else {
        return Err(AdminError::Unavailable(format!(
            "entry {} of {t} not readable",
            position_json(pos)
        )));
    };
    let parsed = cms_client::proto::frame::parse_entry(&entry.payload).map_err(|e| {
        AdminError::Internal(format!("stored entry {} of {t}: {e}", position_json(pos)))
    })?;
    let payload = entry.payload.slice(parsed.payload.clone());
    let m = &parsed.metadata;
    let mut headers = axum::http::HeaderMap::new();
    let mut put = |k: &'static str, v: String| {
        if let Ok(v) = axum::http::HeaderValue::from_str(&v) {
            headers.insert(k, v);
        }
    };
    put("X-Pulsar-Message-ID", position_json(pos));
    put("X-Pulsar-publish-time", m.publish_time.to_string());
    put("X-Pulsar-producer-name", m.producer_name.clone());
    put("X-Pulsar-sequence-id", m.sequence_id.to_string());
    put(
        "X-Pulsar-num-batch-message",
        parsed.num_messages().to_string(),
    );
    if let Some(k) = &m.partition_key {
        put("X-Pulsar-partition-key", k.clone());
    }
    for kv in &m.properties {
        if kv
            .key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            headers.insert(
                match axum::http::HeaderName::from_bytes(
                    format!("X-Pulsar-PROPERTY-{}", kv.key).as_bytes(),
                ) {
                    Ok(h) => h,
                    Err(_) => continue,
                },
                match axum::http::HeaderValue::from_str(&kv.value) {
                    Ok(v) => v,
                    Err(_) => continue,
                },
            );
        }
    }
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/octet-stream"),
    );
    Ok((axum::http::StatusCode::OK, headers, payload).into_response())
}

/// `POST .../subscription/{subscription}/resetcursor/{timestamp}`: moves
/// the cursor to the first entry published at or after `timestamp` (ms
/// since the epoch; the end if none is).
pub async fn reset_cursor_time(State(s): St, p: Params) -> AdminResult {
    let t = topic_of(&p)?;
    let name = p.get("subscription")?;
    let ts = p.get("timestamp")?;
    let ts = ts.parse::<u64>().map_err(|_| {
        AdminError::BadRequest(format!("timestamp must be ms since the epoch, got {ts:?}"))
    })?;
    let topic = load(&s, &t).await?;
    let sub = open_subscription(&s, &t, &topic, name).await?;
    let found = sub
        .seek_publish_time(ts, |entry| {
            cms_client::proto::frame::parse_entry(entry)
                .ok()
                .map(|p| p.metadata.publish_time)
        })
        .await
        .map_err(sub_error)?;
    info!(topic = %t, subscription = name, timestamp = ts, ?found, "cursor reset by time");
    Ok(no_content())
}

/// `POST .../subscription/{subscription}/resetcursor` with a `MessageId`.
pub async fn reset_cursor_id(State(s): St, p: Params, body: Body) -> AdminResult {
    let t = topic_of(&p)?;
    let name = p.get("subscription")?;
    let target = seek_target(&body.json()?)?;
    let topic = load(&s, &t).await?;
    let sub = open_subscription(&s, &t, &topic, name).await?;
    sub.seek(target).await.map_err(sub_error)?;
    info!(topic = %t, subscription = name, ?target, "cursor reset");
    Ok(no_content())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(spec: &[(u64, u64)]) -> LedgerList {
        let mut l = LedgerList::new();
        for &(id, entries) in spec {
            l.add_ledger(id, 0).unwrap();
            for e in 0..entries {
                l.record_add(id, e as i64, 10).unwrap();
            }
            l.record_closed(id, entries, entries * 10, 1).unwrap();
        }
        l
    }

    #[test]
    fn partition_stats_add_up() {
        let mut sum = json!({"storageSize": 0, "publishers": [], "subscriptions": {}});
        let p0 = json!({"storageSize": 10, "publishers": [{"producerName": "a"}],
            "msgInCounter": 4, "bytesInCounter": 400, "msgRateIn": 1.5, "msgRateOut": 0.5,
            "subscriptions": {"s": {"msgBacklog": 2, "unackedMessages": 1, "consumers": [{"consumerName": "x"}]}}});
        let p1 = json!({"storageSize": 5, "publishers": [],
            "msgInCounter": 6, "bytesInCounter": 100, "msgRateIn": 2.0, "msgOutCounter": 3,
            "subscriptions": {"s": {"msgBacklog": 3, "unackedMessages": 0, "consumers": [{"consumerName": "y"}]},
                              "t": {"msgBacklog": 7, "unackedMessages": 0, "consumers": []}}});
        merge_stats(&mut sum, &p0);
        merge_stats(&mut sum, &p1);
        assert_eq!(sum["storageSize"], 15);
        assert_eq!(sum["msgInCounter"], 10);
        assert_eq!(sum["msgOutCounter"], 3);
        assert_eq!(sum["msgRateIn"], 3.5);
        assert_eq!(sum["msgRateOut"], 0.5);
        assert_eq!(sum["averageMsgSize"], 50.0);
        assert_eq!(sum["publishers"].as_array().unwrap().len(), 1);
        assert_eq!(sum["subscriptions"]["s"]["msgBacklog"], 5);
        assert_eq!(sum["subscriptions"]["s"]["unackedMessages"], 1);
        assert_eq!(
            sum["subscriptions"]["s"]["consumers"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(sum["subscriptions"]["t"]["msgBacklog"], 7);
    }

    #[test]
    fn nth_entry_after_walks_across_ledgers() {
        let l = list(&[(3, 2), (5, 0), (7, 3)]);
        let p = Position::new;
        let cases = [
            (p(3, -1), 1, Some(p(3, 0))),
            (p(3, -1), 2, Some(p(3, 1))),
            (p(3, -1), 3, Some(p(7, 0))),
            (p(3, 0), 4, Some(p(7, 2))),
            (p(3, 0), 5, None),
            (p(3, 1), 1, Some(p(7, 0))),
            (p(7, 2), 1, None),
            (p(0, -1), 1, Some(p(3, 0))),
            (p(3, -1), 0, None),
        ];
        for (after, k, want) in cases {
            assert_eq!(nth_entry_after(&l, after, k), want, "{after:?} {k}");
        }
    }
}
