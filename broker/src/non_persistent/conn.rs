//! The connection side of non-persistent topics: PRODUCER / SEND and the
//! consumer commands for `non-persistent://` topics, on a [`Conn`].
//!
//! Promises:
//! - SEND gets its SEND_RECEIPT as soon as the entry is handed out (nothing
//!   waits for storage or for consumers); a checksum mismatch gets
//!   SEND_ERROR ChecksumError and an entry over `message_bytes_max`
//!   SEND_ERROR NotAllowed, for that message alone;
//! - only Shared producers (Pulsar's default access mode) are accepted;
//! - ACK / REDELIVER are accepted and ignored (nothing is kept to
//!   redeliver); SEEK is refused with NotAllowed; CLOSE_* are idempotent;
//! - every producer and consumer releases its topic hold when it closes or
//!   the connection ends;
//! - quotas apply as on persistent topics (docs/quotas.md): producers and
//!   consumers are admitted by [`crate::quota_io::QuotaService::admit`]
//!   (tenant / namespace counts and connections), SENDs pay the publish-rate
//!   buckets (the connection stops being read, no error) and deliveries the
//!   dispatch-rate buckets (a consumer that waits fills its queue, and
//!   further messages are dropped for it, as any slow non-persistent
//!   consumer's are). Per-topic counts and backlog quotas do not apply
//!   (nothing is stored).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use cms_client::proto::commands;
use cms_client::proto::frame::{ChecksumState, Frame, PayloadFrame};
use cms_client::proto::pulsar::{
    BaseCommand, CommandConsumerStatsResponse, CommandProducer, CommandSend, CommandSubscribe,
    ProducerAccessMode, ServerError, base_command::Type,
};
use tokio::sync::mpsc;
use tracing::{Instrument, debug, info, info_span};

use super::{AttachError, NP_CONSUMER_QUEUE_MAX, NpDelivery, NpSubscription, NpTopic};
use crate::connection::{CloseReason, Conn, ErrorReply, Outbound};
use crate::dispatch::{ConsumerId, ConsumerInfo, SubType};
use crate::topic_name::{Domain, TopicName};
use crate::topics::TopicError;

struct NpProducer {
    topic: Arc<NpTopic>,
    name: String,
    /// Publish-rate buckets (tenant / namespace quotas, Pulsar's per-topic
    /// `publishMaxMessageRate`), as for persistent topics.
    buckets: Vec<Arc<crate::quota_io::Bucket>>,
    /// Its place in the tenant's and namespace's counts.
    _quota: crate::quota_io::Admission,
}

struct NpConsumer {
    topic: Arc<NpTopic>,
    sub: Arc<NpSubscription>,
    id: ConsumerId,
    name: String,
    sub_type: SubType,
    /// Its place in the tenant's and namespace's counts.
    _quota: crate::quota_io::Admission,
}

/// A connection's producers and consumers on non-persistent topics.
#[derive(Default)]
pub struct NpHandles {
    producers: HashMap<u64, NpProducer>,
    consumers: HashMap<u64, NpConsumer>,
}

impl std::fmt::Debug for NpHandles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NpHandles")
            .field("producers", &self.producers.len())
            .field("consumers", &self.consumers.len())
            .finish()
    }
}

impl NpHandles {
    /// Producers and consumers held.
    pub fn len(&self) -> usize {
        self.producers.len() + self.consumers.len()
    }

    /// None held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `producer_id` is a non-persistent producer here.
    pub fn has_producer(&self, producer_id: u64) -> bool {
        self.producers.contains_key(&producer_id)
    }

    /// Whether `consumer_id` is a non-persistent consumer here.
    pub fn has_consumer(&self, consumer_id: u64) -> bool {
        self.consumers.contains_key(&consumer_id)
    }
}

/// Whether `topic` names a non-persistent topic.
pub fn is_non_persistent(topic: &str) -> bool {
    TopicName::parse(topic).is_ok_and(|n| n.domain == Domain::NonPersistent)
}

fn attach_reply(e: &TopicError) -> ErrorReply {
    crate::connection::topic_error_reply(e)
}

impl From<AttachError> for TopicError {
    fn from(e: AttachError) -> Self {
        match e {
            AttachError::TooManyTopics { .. } => TopicError::ServiceNotReady(e.to_string()),
            AttachError::NotFound(_) => TopicError::NotFound(e.to_string()),
        }
    }
}

async fn attach(conn: &Conn, topic: &str, create: bool) -> Result<Arc<NpTopic>, ErrorReply> {
    let name =
        TopicName::parse(topic).map_err(|e| (ServerError::InvalidTopicName, e.to_string()))?;
    {
        let ctx = conn.state.topics.context();
        crate::topic_discovery::check_use(&*ctx.store, &ctx.layout, &name).await?;
    }
    conn.state
        .topics
        .attach_non_persistent(&name, create)
        .await
        .map_err(|e| attach_reply(&e))
}

/// The quota admission of a producer or consumer on `topic` (tenant and
/// namespace counts, connections); a refusal is logged and counted.
async fn admit(
    conn: &Conn,
    topic: &NpTopic,
    kind: crate::quota_io::Kind,
) -> Result<crate::quota_io::Admission, ErrorReply> {
    let r = conn
        .state
        .quota
        .admit(conn.id, &topic.name, kind, 0, None)
        .await;
    if let Err(e) = &r {
        info!(tenant = %topic.name.tenant, namespace = %topic.name.namespace, topic = %topic.name,
            reason = %e.1, ?kind, "non-persistent handle refused by a quota");
        conn.state.metrics.quota_refusals.inc();
    }
    r
}

/// PRODUCER on a non-persistent topic.
pub(crate) async fn on_producer(conn: &mut Conn, c: &CommandProducer) {
    if let Some(existing) = conn.np.producers.get(&c.producer_id)
        && TopicName::parse(&c.topic).ok().as_ref() == Some(&existing.topic.name)
    {
        // A retry of a request that already succeeded (G8).
        let name = existing.name.clone();
        conn.send(commands::producer_success(
            c.request_id,
            &name,
            -1,
            true,
            None,
        ))
        .await;
        return;
    }
    if conn.np.producers.contains_key(&c.producer_id) || conn.has_producer_id(c.producer_id) {
        conn.send_error(
            c.request_id,
            (
                ServerError::ProducerBusy,
                format!("producer id {} is already in use", c.producer_id),
            ),
        )
        .await;
        return;
    }
    if conn.handles() >= conn.state.config.handles_per_connection_max {
        conn.send_error(
            c.request_id,
            (
                ServerError::NotAllowedError,
                format!(
                    "connection reached {} producers and consumers",
                    conn.state.config.handles_per_connection_max
                ),
            ),
        )
        .await;
        return;
    }
    match c.producer_access_mode.map(ProducerAccessMode::try_from) {
        None | Some(Ok(ProducerAccessMode::Shared)) => {}
        Some(other) => {
            conn.send_error(
                c.request_id,
                (
                    ServerError::NotAllowedError,
                    format!(
                        "producer access mode {other:?} is not supported on non-persistent topics"
                    ),
                ),
            )
            .await;
            return;
        }
    }
    let topic = match attach(conn, &c.topic, true).await {
        Ok(t) => t,
        Err(e) => {
            conn.send_error(c.request_id, e).await;
            return;
        }
    };
    let quota = match admit(conn, &topic, crate::quota_io::Kind::Producer).await {
        Ok(a) => a,
        Err(e) => {
            conn.state.topics.non_persistent().detach(&topic);
            conn.send_error(c.request_id, e).await;
            return;
        }
    };
    let buckets = conn.state.quota.buckets_for(&topic.name).await;
    let name = match c.producer_name.as_deref() {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => conn.state.next_producer_name(),
    };
    conn.send(commands::producer_success(
        c.request_id,
        &name,
        -1,
        true,
        None,
    ))
    .await;
    conn.state.metrics.producers.inc();
    info!(tenant = %topic.name.tenant, namespace = %topic.name.namespace, topic = %topic.name,
        producer = %name, producer_id = c.producer_id, "non-persistent producer created");
    conn.np.producers.insert(
        c.producer_id,
        NpProducer {
            topic,
            name,
            buckets,
            _quota: quota,
        },
    );
}

/// SEND from a non-persistent producer: fan out, then SEND_RECEIPT.
pub(crate) async fn on_send(
    conn: &mut Conn,
    c: &CommandSend,
    checksum: ChecksumState,
    entry: Bytes,
) {
    let Some(p) = conn.np.producers.get(&c.producer_id) else {
        return;
    };
    let topic = p.topic.clone();
    let buckets = p.buckets.clone();
    if checksum == ChecksumState::Mismatch {
        conn.send(commands::send_error(
            c.producer_id,
            c.sequence_id,
            ServerError::ChecksumError,
            "checksum of the payload does not match",
        ))
        .await;
        return;
    }
    let max = conn.state.config.message_bytes_max;
    if entry.len() > max {
        conn.send(commands::send_error(
            c.producer_id,
            c.sequence_id,
            ServerError::NotAllowedError,
            format!(
                "message of {} bytes is over message_bytes_max ({max})",
                entry.len()
            ),
        ))
        .await;
        return;
    }
    let messages = u32::try_from(c.num_messages.unwrap_or(1).max(1)).unwrap_or(1);
    // Publish-rate quotas: the connection pays after this SEND (its reads
    // pause until the buckets refill).
    let charges = conn.state.quota.on_publish(
        &topic.name,
        &buckets,
        u64::from(messages),
        u64::try_from(entry.len()).unwrap_or(u64::MAX),
    );
    conn.owed.extend(charges);
    conn.state.metrics.messages_in.inc_by(u64::from(messages));
    conn.state
        .metrics
        .bytes_in
        .inc_by(u64::try_from(entry.len()).unwrap_or(u64::MAX));
    let published = topic.publish(&entry, messages);
    let mut cmd = commands::send_receipt(c.producer_id, c.sequence_id, 0, published.entry_id);
    if let Some(r) = cmd.send_receipt.as_mut() {
        r.highest_sequence_id = c.highest_sequence_id;
    }
    conn.send(cmd).await;
}

/// CLOSE_PRODUCER (or the connection's end): `true` if it was ours.
pub(crate) fn remove_producer(conn: &mut Conn, producer_id: u64) -> bool {
    let Some(p) = conn.np.producers.remove(&producer_id) else {
        return false;
    };
    conn.state.topics.non_persistent().detach(&p.topic);
    conn.state.metrics.producers.dec();
    debug!(producer_id, "non-persistent producer closed");
    true
}

/// Whether a consumer command belongs here (a SUBSCRIBE to a
/// non-persistent topic or any command for a non-persistent consumer).
pub(crate) fn claims(conn: &Conn, ty: Type, cmd: &BaseCommand) -> bool {
    let consumer_id = match ty {
        Type::Subscribe => {
            return cmd.subscribe.as_ref().is_some_and(|c| {
                is_non_persistent(&c.topic) || conn.np.consumers.contains_key(&c.consumer_id)
            });
        }
        Type::Flow => cmd.flow.as_ref().map(|c| c.consumer_id),
        Type::Ack => cmd.ack.as_ref().map(|c| c.consumer_id),
        Type::RedeliverUnacknowledgedMessages => cmd
            .redeliver_unacknowledged_messages
            .as_ref()
            .map(|c| c.consumer_id),
        Type::Seek => cmd.seek.as_ref().map(|c| c.consumer_id),
        Type::Unsubscribe => cmd.unsubscribe.as_ref().map(|c| c.consumer_id),
        Type::CloseConsumer => cmd.close_consumer.as_ref().map(|c| c.consumer_id),
        Type::ConsumerStats => cmd.consumer_stats.as_ref().map(|c| c.consumer_id),
        Type::GetLastMessageId => cmd.get_last_message_id.as_ref().map(|c| c.consumer_id),
        _ => None,
    };
    consumer_id.is_some_and(|id| conn.np.consumers.contains_key(&id))
}

/// A consumer command claimed by [`claims`].
pub(crate) async fn on_command(
    conn: &mut Conn,
    ty: Type,
    cmd: &BaseCommand,
) -> Result<(), CloseReason> {
    let missing = || {
        CloseReason::BadInput(format!(
            "{} without its sub-message",
            commands::command_name(cmd)
        ))
    };
    match ty {
        Type::Subscribe => {
            let c = cmd.subscribe.as_ref().ok_or_else(missing)?;
            on_subscribe(conn, c).await;
        }
        Type::Flow => {
            let c = cmd.flow.as_ref().ok_or_else(missing)?;
            if let Some(e) = conn.np.consumers.get(&c.consumer_id)
                && let Err(err) = e.sub.flow(e.id, c.message_permits)
            {
                debug!(consumer_id = c.consumer_id, error = %err, "FLOW refused");
            }
        }
        Type::Ack => {
            // Nothing is kept: acknowledgements have nothing to remove.
            let c = cmd.ack.as_ref().ok_or_else(missing)?;
            if let Some(request_id) = c.request_id {
                conn.send(commands::ack_response(c.consumer_id, request_id, None))
                    .await;
            }
        }
        Type::RedeliverUnacknowledgedMessages => {}
        Type::Seek => {
            let c = cmd.seek.as_ref().ok_or_else(missing)?;
            conn.send_error(
                c.request_id,
                (
                    ServerError::NotAllowedError,
                    "seek is not supported on non-persistent topics".into(),
                ),
            )
            .await;
        }
        Type::Unsubscribe => {
            let c = cmd.unsubscribe.as_ref().ok_or_else(missing)?;
            remove_consumer(conn, c.consumer_id);
            conn.send(commands::success(c.request_id)).await;
        }
        Type::CloseConsumer => {
            let c = cmd.close_consumer.as_ref().ok_or_else(missing)?;
            remove_consumer(conn, c.consumer_id);
            conn.send(commands::success(c.request_id)).await;
        }
        Type::ConsumerStats => {
            let c = cmd.consumer_stats.as_ref().ok_or_else(missing)?;
            let mut resp = CommandConsumerStatsResponse {
                request_id: c.request_id,
                ..Default::default()
            };
            if let Some(e) = conn.np.consumers.get(&c.consumer_id) {
                resp.consumer_name = Some(e.name.clone());
                resp.r#type = Some(e.sub_type.to_string());
                resp.msg_backlog = Some(0);
                resp.available_permits = e.sub.permits(e.id).map(|p| u64::try_from(p).unwrap_or(0));
                resp.unacked_messages = Some(0);
                resp.blocked_consumer_on_unacked_msgs = Some(false);
                resp.msg_rate_out = Some(0.0);
                resp.msg_throughput_out = Some(0.0);
                resp.msg_rate_redeliver = Some(0.0);
            }
            let mut out = commands::base(Type::ConsumerStatsResponse);
            out.consumer_stats_response = Some(resp);
            conn.send(out).await;
        }
        Type::GetLastMessageId => {
            let c = cmd.get_last_message_id.as_ref().ok_or_else(missing)?;
            if let Some(e) = conn.np.consumers.get(&c.consumer_id) {
                // No entry yet: entry id -1 (wrapped, as the wire carries it).
                let last = e.topic.last_entry_id().unwrap_or(u64::MAX);
                conn.send(commands::get_last_message_id_response(
                    c.request_id,
                    commands::message_id(0, last),
                    None,
                ))
                .await;
            }
        }
        _ => {}
    }
    Ok(())
}

async fn on_subscribe(conn: &mut Conn, c: &CommandSubscribe) {
    if let Some(existing) = conn.np.consumers.get(&c.consumer_id) {
        // A retry of a request that already succeeded (G8).
        let same = existing.sub.name() == c.subscription
            && TopicName::parse(&c.topic).ok().as_ref() == Some(&existing.topic.name);
        let reply = if same {
            Ok(())
        } else {
            Err((
                ServerError::ConsumerBusy,
                format!("consumer id {} is already in use", c.consumer_id),
            ))
        };
        match reply {
            Ok(()) => conn.send(commands::success(c.request_id)).await,
            Err(e) => conn.send_error(c.request_id, e).await,
        }
        return;
    }
    if conn.has_consumer_id(c.consumer_id) {
        conn.send_error(
            c.request_id,
            (
                ServerError::ConsumerBusy,
                format!("consumer id {} is already in use", c.consumer_id),
            ),
        )
        .await;
        return;
    }
    let id = ConsumerId::new(conn.id, c.consumer_id);
    let (sub_type, key_shared) = match crate::consumers::check_subscribe(conn, c, id) {
        Ok(v) => v,
        Err(e) => {
            conn.send_error(c.request_id, e).await;
            return;
        }
    };
    let topic = match attach(conn, &c.topic, c.force_topic_creation.unwrap_or(true)).await {
        Ok(t) => t,
        Err(e) => {
            conn.send_error(c.request_id, e).await;
            return;
        }
    };
    let quota = match admit(conn, &topic, crate::quota_io::Kind::Consumer).await {
        Ok(a) => a,
        Err(e) => {
            conn.state.topics.non_persistent().detach(&topic);
            conn.send_error(c.request_id, e).await;
            return;
        }
    };
    let dispatch_buckets = conn
        .state
        .quota
        .dispatch_buckets_for(&topic.name, &c.subscription)
        .await;
    let name = c
        .consumer_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("consumer-{}-{}", conn.id, c.consumer_id));
    let (sink, deliveries) = mpsc::channel(NP_CONSUMER_QUEUE_MAX);
    let info = ConsumerInfo {
        id,
        name: name.clone(),
        priority: c.priority_level.unwrap_or(0),
        sub_type,
        key_shared,
    };
    // SUCCESS must precede any ACTIVE_CONSUMER_CHANGE or message: the
    // forwarder starts after it is queued, and deliveries wait in `sink`.
    let sub = match topic.subscribe(
        &c.subscription,
        info,
        sink,
        conn.state.config.consumers_per_subscription_max,
    ) {
        Ok(s) => s,
        Err(e) => {
            conn.state.topics.non_persistent().detach(&topic);
            conn.send_error(c.request_id, crate::consumers::dispatch_error_reply(&e))
                .await;
            return;
        }
    };
    conn.send(commands::success(c.request_id)).await;
    let span = info_span!(
        "consumer",
        tenant = %topic.name.tenant,
        namespace = %topic.name.namespace,
        topic = %topic.name,
        subscription = %c.subscription,
        consumer_id = c.consumer_id
    );
    tokio::spawn(
        forward(
            conn.state.clone(),
            topic.name.clone(),
            dispatch_buckets,
            c.consumer_id,
            deliveries,
            conn.out.clone(),
        )
        .instrument(span),
    );
    conn.state.metrics.consumers.inc();
    info!(topic = %topic.name, subscription = %c.subscription, consumer = %name,
        sub_type = %sub_type, "non-persistent consumer created");
    conn.np.consumers.insert(
        c.consumer_id,
        NpConsumer {
            topic,
            sub,
            id,
            name,
            sub_type,
            _quota: quota,
        },
    );
}

/// Forwards one consumer's deliveries to the socket until its subscription
/// drops the sink (the consumer closed).
async fn forward(
    state: Arc<crate::service::BrokerState>,
    topic: TopicName,
    dispatch_buckets: Vec<Arc<crate::quota_io::Bucket>>,
    consumer_id: u64,
    mut deliveries: mpsc::Receiver<NpDelivery>,
    out: Outbound,
) {
    let counter = crate::consumers::message_counter();
    while let Some(d) = deliveries.recv().await {
        let frame = match d {
            NpDelivery::Message { entry_id, entry } => {
                let msgs = u64::from(counter(&entry));
                // Dispatch-rate quotas: this consumer waits.
                let mut owed = state.quota.on_dispatch(
                    &topic,
                    &dispatch_buckets,
                    msgs,
                    u64::try_from(entry.len()).unwrap_or(u64::MAX),
                );
                while let Some(w) = crate::quota_io::pay(&mut owed) {
                    tokio::time::sleep(w.max(std::time::Duration::from_millis(1))).await;
                }
                state.metrics.messages_out.inc_by(msgs);
                state
                    .metrics
                    .bytes_out
                    .inc_by(u64::try_from(entry.len()).unwrap_or(u64::MAX));
                Frame::Payload(PayloadFrame {
                    command: Box::new(commands::message(consumer_id, 0, entry_id, 0)),
                    broker_entry_metadata: None,
                    checksum: ChecksumState::Valid,
                    entry,
                })
            }
            NpDelivery::ActiveChanged(is_active) => {
                Frame::from(commands::active_consumer_change(consumer_id, is_active))
            }
        };
        if out.send(frame).await.is_err() {
            return;
        }
    }
}

fn remove_consumer(conn: &mut Conn, consumer_id: u64) {
    let Some(e) = conn.np.consumers.remove(&consumer_id) else {
        return;
    };
    e.topic.unsubscribe(&e.sub, e.id);
    conn.state.topics.non_persistent().detach(&e.topic);
    conn.state.metrics.consumers.dec();
    debug!(consumer_id, "non-persistent consumer closed");
}

/// The connection ends: every non-persistent producer and consumer leaves.
pub(crate) fn remove_all(conn: &mut Conn) {
    let ids: Vec<u64> = conn.np.producers.keys().copied().collect();
    for id in ids {
        remove_producer(conn, id);
    }
    let ids: Vec<u64> = conn.np.consumers.keys().copied().collect();
    for id in ids {
        remove_consumer(conn, id);
    }
}
