//! `/admin/v2/queues/{tenant}/{namespace}/{queue}` (DESIGN §6): a queue is a
//! persistent topic (optionally partitioned) with a durable Shared
//! subscription [`QUEUE_SUBSCRIPTION`] created and managed with it, so its
//! backlog exists from creation and consumers only need the queue's name.
//!
//! The queue node `/cms/admin/queues/<t>/<ns>/<queue>` holds [`QueueInfo`]:
//! the topic, the subscription, the partition count, and the options a
//! consumer applies (`maxRedeliveries`, `deadLetterTopic` — Pulsar's dead
//! letter policy is client-side) plus a `retention` that is stored only
//! (retention is enforced per namespace today).
//!
//! Promises: create answers 409 if the queue or its topic exists and leaves
//! nothing behind when it fails; list and stats report the subscription's
//! backlog summed over partitions; purge clears it; delete removes the
//! topic (409 while clients are connected unless `force=true`) and the
//! queue node.

use axum::extract::State;
use cms_bookie::metadata::{Expected, MetadataError, join, parent_of};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::admin::namespaces::read_policies;
use crate::admin::topics::{
    create_topic_node, delete_stored_topic, load_here as load, open_subscription,
    partitioned_error, stored, within_many,
};
use crate::admin::{
    AdminError, AdminResult, Body, Params, QueryParams, St, names, no_content, ok_json, store,
};
use crate::consumers::message_counter;
use crate::managed_ledger::InitialPosition;
use crate::managed_ledger::io::SeekTarget;
use crate::partitioned::{self, PARTITIONS_MAX};
use crate::service::BrokerState;
use crate::subscriptions::OpenAs;
use crate::tenancy::RetentionPolicies;
use crate::topic_name::{Domain, TopicName};

/// Name of the managed subscription of every queue.
pub const QUEUE_SUBSCRIPTION: &str = "queue";
/// Largest `maxRedeliveries`.
pub const MAX_REDELIVERIES_MAX: u32 = 1_000;
/// Most queues listed with their backlog in one answer.
pub const QUEUES_LIST_MAX: usize = 1_000;

/// Content of a queue node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct QueueInfo {
    /// The topic (full name).
    pub topic: String,
    /// The managed subscription.
    pub subscription: String,
    /// Partitions (0 = non-partitioned).
    pub partitions: u32,
    /// Retention asked for (stored only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionPolicies>,
    /// Deliveries after which a consumer sends a message to the DLQ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_redeliveries: Option<u32>,
    /// The dead-letter topic (full name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_topic: Option<String>,
}

/// The create body.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueOptions {
    /// Partitions (0 or absent = non-partitioned).
    #[serde(default)]
    pub partitions: u32,
    /// Retention (stored only).
    #[serde(default)]
    pub retention: Option<RetentionPolicies>,
    /// Deliveries before the DLQ.
    #[serde(default)]
    pub max_redeliveries: Option<u32>,
    /// DLQ topic (default `<queue>-queue-DLQ` when `maxRedeliveries` is set).
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
}

/// The queue node of `topic` built from `o`, validated. Pure.
pub fn queue_info(topic: &TopicName, o: &QueueOptions) -> Result<QueueInfo, AdminError> {
    if o.partitions > PARTITIONS_MAX {
        return Err(AdminError::BadRequest(format!(
            "partitions must be in 0..={PARTITIONS_MAX}"
        )));
    }
    if let Some(r) = &o.retention {
        r.validate().map_err(AdminError::BadRequest)?;
    }
    if let Some(n) = o.max_redeliveries
        && !(1..=MAX_REDELIVERIES_MAX).contains(&n)
    {
        return Err(AdminError::BadRequest(format!(
            "maxRedeliveries must be in 1..={MAX_REDELIVERIES_MAX}"
        )));
    }
    let dlq = match (&o.dead_letter_topic, o.max_redeliveries) {
        (Some(name), _) => {
            let t = TopicName::parse(name).map_err(|e| AdminError::BadRequest(e.to_string()))?;
            if t.domain != Domain::Persistent {
                return Err(AdminError::BadRequest(
                    "deadLetterTopic must be persistent".into(),
                ));
            }
            if t == *topic {
                return Err(AdminError::BadRequest(
                    "deadLetterTopic must differ from the queue".into(),
                ));
            }
            Some(t.to_string())
        }
        (None, Some(_)) => {
            let mut t = topic.clone();
            t.local = format!("{}-{QUEUE_SUBSCRIPTION}-DLQ", topic.local);
            Some(t.to_string())
        }
        (None, None) => None,
    };
    Ok(QueueInfo {
        topic: topic.to_string(),
        subscription: QUEUE_SUBSCRIPTION.to_string(),
        partitions: o.partitions,
        retention: o.retention,
        max_redeliveries: o.max_redeliveries,
        dead_letter_topic: dlq,
    })
}

/// The folder of the queue nodes of `t/ns`.
pub(crate) fn queues_dir(s: &BrokerState, t: &str, ns: &str) -> String {
    let admin = parent_of(&s.layout.tenants()).unwrap_or("/").to_string();
    join(&join(&join(&admin, "queues"), t), ns)
}

fn queue_params(p: &Params) -> Result<(TopicName, String), AdminError> {
    let (t, ns, q) = (p.get("tenant")?, p.get("namespace")?, p.get("queue")?);
    names::check("queue", q)?;
    let topic = names::topic(Domain::Persistent, t, ns, q)?;
    Ok((topic, q.to_string()))
}

/// The topics holding the queue's messages (its partitions, or itself).
fn queue_topics(topic: &TopicName, info: &QueueInfo) -> Vec<TopicName> {
    if info.partitions == 0 {
        vec![topic.clone()]
    } else {
        (0..info.partitions)
            .map(|i| partitioned::partition_name(topic, i))
            .collect()
    }
}

async fn read_queue(s: &BrokerState, topic: &TopicName) -> Result<(String, QueueInfo), AdminError> {
    let path = join(
        &queues_dir(s, &topic.tenant, &topic.namespace),
        &topic.local,
    );
    match store::read::<QueueInfo>(&*s.store, &path).await? {
        Some((info, _)) => Ok((path, info)),
        None => Err(AdminError::NotFound(format!(
            "queue {topic} does not exist"
        ))),
    }
}

/// Creates the queue's topic(s) and subscription(s).
async fn create_backing(
    s: &BrokerState,
    topic: &TopicName,
    info: &QueueInfo,
) -> Result<(), AdminError> {
    if stored(s, topic).await?
        || partitioned::partitions(&*s.store, &s.layout, topic)
            .await
            .map_err(partitioned_error)?
            .is_some()
    {
        return Err(AdminError::Conflict(format!(
            "topic {topic} already exists"
        )));
    }
    if info.partitions > 0 {
        partitioned::create(&*s.store, &s.layout, topic, info.partitions)
            .await
            .map_err(partitioned_error)?;
    }
    for t in queue_topics(topic, info) {
        match create_topic_node(s, &t).await {
            Ok(()) | Err(AdminError::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
        let loaded = load(s, &t).await?;
        loaded
            .subscriptions
            .get_or_open(
                &loaded.ml,
                QUEUE_SUBSCRIPTION,
                OpenAs::Durable(InitialPosition::Earliest),
                message_counter(),
                crate::consumers::subscription_config(s, &t, QUEUE_SUBSCRIPTION).await,
            )
            .await
            .map_err(|e| {
                AdminError::Unavailable(format!("creating the subscription of {t}: {e}"))
            })?;
    }
    Ok(())
}

async fn remove_backing(
    s: &BrokerState,
    topic: &TopicName,
    info: &QueueInfo,
    force: bool,
) -> Result<(), AdminError> {
    for t in queue_topics(topic, info) {
        if stored(s, &t).await? {
            delete_stored_topic(s, &t, force)
                .await
                .map_err(|e| within_many(&t, e))?;
        }
    }
    if info.partitions > 0 {
        match partitioned::delete(&*s.store, &s.layout, topic).await {
            Ok(()) | Err(partitioned::PartitionedError::NotFound(_)) => {}
            Err(e) => return Err(partitioned_error(e)),
        }
    }
    Ok(())
}

/// `PUT /queues/{tenant}/{namespace}/{queue}` with optional options.
pub async fn create(State(s): St, p: Params, body: Body) -> AdminResult {
    let (topic, _) = queue_params(&p)?;
    let options: QueueOptions = body.json_or_default()?;
    let info = queue_info(&topic, &options)?;
    read_policies(&s, &topic.tenant, &topic.namespace).await?;
    crate::quota_io::check_new_queue(&*s.store, &s.layout, &topic.tenant, &topic.namespace)
        .await
        .map_err(AdminError::Conflict)?;
    let path = join(
        &queues_dir(&s, &topic.tenant, &topic.namespace),
        &topic.local,
    );
    store::create(&*s.store, &path, &info, || {
        format!("queue {topic} already exists")
    })
    .await?;
    if let Err(e) = create_backing(&s, &topic, &info).await {
        // Leave nothing behind: what was created goes again.
        if !matches!(e, AdminError::Conflict(_))
            && let Err(undo) = remove_backing(&s, &topic, &info, true).await
        {
            warn!(queue = %topic, error = %undo, "undoing a failed queue creation");
        }
        if let Err(undo) = s.store.delete(&path, Expected::Any).await {
            warn!(queue = %topic, error = %undo, "removing the queue node of a failed creation");
        }
        return Err(e);
    }
    info!(tenant = %topic.tenant, namespace = %topic.namespace, queue = %topic, partitions = info.partitions, "queue created");
    Ok(no_content())
}

async fn queue_stats(
    s: &BrokerState,
    topic: &TopicName,
    info: &QueueInfo,
) -> Result<Value, AdminError> {
    let mut backlog = 0u64;
    let mut consumers = 0usize;
    let mut parts = Vec::new();
    for t in queue_topics(topic, info) {
        let loaded = load(s, &t).await?;
        let sub = open_subscription(s, &t, &loaded, &info.subscription).await?;
        let st = sub.stats();
        backlog += st.msg_backlog;
        consumers += st.dispatcher.consumers.len();
        parts.push(json!({
            "topic": t.to_string(),
            "msgBacklog": st.msg_backlog,
            "unackedMessages": st.dispatcher.unacked_messages,
            "consumers": st.dispatcher.consumers.len(),
        }));
    }
    Ok(json!({
        "queue": info,
        "msgBacklog": backlog,
        "consumers": consumers,
        "partitions": parts,
    }))
}

/// `GET /queues/{tenant}/{namespace}`: `[{"name","topic","msgBacklog"}]`.
pub async fn list(State(s): St, p: Params) -> AdminResult {
    let (t, ns) = (p.get("tenant")?, p.get("namespace")?);
    names::check("tenant", t)?;
    names::check("namespace", ns)?;
    read_policies(&s, t, ns).await?;
    let names = store::children(&*s.store, &queues_dir(&s, t, ns)).await?;
    let mut out = Vec::new();
    for q in names.into_iter().take(QUEUES_LIST_MAX) {
        let topic = names::topic(Domain::Persistent, t, ns, &q)?;
        let Ok((_, info)) = read_queue(&s, &topic).await else {
            continue;
        };
        let stats = queue_stats(&s, &topic, &info).await?;
        out.push(json!({
            "name": q,
            "topic": info.topic,
            "msgBacklog": stats["msgBacklog"],
        }));
    }
    Ok(ok_json(json!(out)))
}

/// `GET /queues/{tenant}/{namespace}/{queue}`: the queue node.
pub async fn get(State(s): St, p: Params) -> AdminResult {
    let (topic, _) = queue_params(&p)?;
    let (_, info) = read_queue(&s, &topic).await?;
    Ok(ok_json(json!(info)))
}

/// `GET /queues/{tenant}/{namespace}/{queue}/stats`.
pub async fn stats(State(s): St, p: Params) -> AdminResult {
    let (topic, _) = queue_params(&p)?;
    let (_, info) = read_queue(&s, &topic).await?;
    Ok(ok_json(queue_stats(&s, &topic, &info).await?))
}

/// `POST /queues/{tenant}/{namespace}/{queue}/purge`: clears the backlog.
pub async fn purge(State(s): St, p: Params) -> AdminResult {
    let (topic, _) = queue_params(&p)?;
    let (_, info) = read_queue(&s, &topic).await?;
    for t in queue_topics(&topic, &info) {
        let loaded = load(&s, &t).await?;
        let sub = open_subscription(&s, &t, &loaded, &info.subscription).await?;
        sub.seek(SeekTarget::Latest)
            .await
            .map_err(|e| AdminError::Unavailable(format!("purging {t}: {e}")))?;
    }
    info!(queue = %topic, "queue purged");
    Ok(no_content())
}

/// `DELETE /queues/{tenant}/{namespace}/{queue}` (`?force=true`).
pub async fn delete(State(s): St, p: Params, q: QueryParams) -> AdminResult {
    let (topic, _) = queue_params(&p)?;
    let force = q.flag("force")?;
    let (path, info) = read_queue(&s, &topic).await?;
    remove_backing(&s, &topic, &info, force).await?;
    match s.store.delete(&path, Expected::Any).await {
        Ok(()) | Err(MetadataError::NoNode(_)) => {}
        Err(e) => return Err(e.into()),
    }
    info!(queue = %topic, force, "queue deleted");
    Ok(no_content())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(json: &str) -> QueueOptions {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn queue_options_are_validated_and_defaulted() {
        let t = TopicName::parse("persistent://a/b/jobs").unwrap();
        let info = queue_info(&t, &QueueOptions::default()).unwrap();
        assert_eq!(info.subscription, QUEUE_SUBSCRIPTION);
        assert_eq!((info.partitions, info.dead_letter_topic), (0, None));
        let info = queue_info(&t, &opts(r#"{"partitions":3,"maxRedeliveries":5}"#)).unwrap();
        assert_eq!(
            info.dead_letter_topic.as_deref(),
            Some("persistent://a/b/jobs-queue-DLQ")
        );
        let info = queue_info(
            &t,
            &opts(r#"{"maxRedeliveries":2,"deadLetterTopic":"a/b/dead"}"#),
        )
        .unwrap();
        assert_eq!(
            info.dead_letter_topic.as_deref(),
            Some("persistent://a/b/dead")
        );
        for bad in [
            r#"{"partitions":100000}"#,
            r#"{"maxRedeliveries":0}"#,
            r#"{"deadLetterTopic":"a/b/jobs"}"#,
            r#"{"deadLetterTopic":"non-persistent://a/b/d"}"#,
            r#"{"deadLetterTopic":"x y"}"#,
            r#"{"retention":{"retentionTimeInMinutes":-3,"retentionSizeInMB":1}}"#,
        ] {
            assert!(
                matches!(queue_info(&t, &opts(bad)), Err(AdminError::BadRequest(_))),
                "{bad} accepted"
            );
        }
        assert!(serde_json::from_str::<QueueOptions>(r#"{"partitionz":1}"#).is_err());
    }
}
