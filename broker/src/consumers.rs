//! The consumers of one connection and the consumer-side commands:
//! SUBSCRIBE, FLOW, ACK, REDELIVER_UNACKNOWLEDGED_MESSAGES, SEEK,
//! UNSUBSCRIBE, CLOSE_CONSUMER, CONSUMER_STATS, GET_LAST_MESSAGE_ID, carried
//! out on the topic's [`Subscription`]s.
//!
//! Promises:
//! - SUCCESS for a SUBSCRIBE is queued before anything else for that
//!   consumer (deliveries are forwarded only after it); nothing is
//!   delivered before FLOW (the subscription's promise);
//! - a MESSAGE is the stored entry verbatim after the command (zero
//!   re-encoding; batches and compression pass through);
//! - an ACK with a `request_id` gets an ACK_RESPONSE, after the cursor
//!   snapshot the ack made due (if any) is durable; an ACK without one
//!   leaves a due snapshot to a background task, so the connection does not
//!   stop reading (its producers' SENDs among them) for a bookie round
//!   trip; a partial batch ack (an `ack_set`) never acknowledges the entry;
//! - CLOSE_CONSUMER is idempotent (SUCCESS for unknown ids, G8); when the
//!   topic is unloaded the consumer gets CLOSE_CONSUMER (G13);
//! - after a successful SEEK the consumer gets CLOSE_CONSUMER and
//!   subscribes again (Pulsar's behaviour, which the C++ client expects);
//! - Exclusive / Failover / Shared / Key_Shared (AUTO_SPLIT or STICKY with
//!   the client's `keySharedMeta`; conflicting ranges answer
//!   ConsumerAssignError); seek by publish time is refused with a clear ERROR.

use std::collections::HashMap;
use std::sync::Arc;

use cms_client::proto::commands;
use cms_client::proto::frame::{ChecksumState, Frame, PayloadFrame, parse_entry};
use cms_client::proto::pulsar::{
    BaseCommand, CommandConsumerStatsResponse, CommandSubscribe, KeySharedMeta, MessageIdData,
    ServerError, base_command::Type, command_ack::AckType, command_subscribe,
};
use tokio::sync::mpsc;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::connection::{CloseReason, Conn, ConnEvent, ErrorReply, Outbound, wait_true};
use crate::dispatch::key_shared::validate_ranges;
use crate::dispatch::{
    ConsumerId, DispatchError, DispatchLimits, KeySharedError, KeySharedMode, KeySharedSpec,
    SubType,
};
use crate::managed_ledger::io::{Persist, SeekTarget};
use crate::managed_ledger::{InitialPosition, Position};
use crate::subscription::{
    ConsumerSpec, Delivery, MessageCounter, ReadBudget, StartPosition, SubError, Subscription,
    SubscriptionConfig,
};
use crate::subscriptions::OpenAs;
use crate::topics::Topic;

/// Deliveries queued towards one consumer's forwarder (a full queue pauses
/// that consumer in the subscription).
pub const CONSUMER_QUEUE_MAX: usize = 1_000;

/// Longest subscription name, in bytes.
pub const SUBSCRIPTION_NAME_BYTES_MAX: usize = 255;

struct ConsumerEntry {
    topic: Arc<Topic>,
    sub: Subscription,
    id: ConsumerId,
    generation: u64,
    name: String,
    sub_type: SubType,
    /// Its place in the tenant's and namespace's counts.
    _quota: crate::quota_io::Admission,
}

/// The consumers of one connection.
#[derive(Default)]
pub struct Consumers {
    by_id: HashMap<u64, ConsumerEntry>,
}

impl std::fmt::Debug for Consumers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumers")
            .field("count", &self.by_id.len())
            .finish()
    }
}

impl Consumers {
    /// Consumers on the connection.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// No consumer.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Whether `consumer_id` is one of them.
    pub fn contains(&self, consumer_id: u64) -> bool {
        self.by_id.contains_key(&consumer_id)
    }
}

/// Messages in a stored entry (a batch counts its messages, G11); 1 if the
/// entry cannot be parsed.
pub fn message_counter() -> MessageCounter {
    Arc::new(|entry: &[u8]| parse_entry(entry).map_or(1, |p| p.num_messages().max(1)))
}

fn sub_error_reply(e: &SubError) -> ErrorReply {
    match e {
        SubError::Dispatch(
            DispatchError::ConsumerBusy { .. }
            | DispatchError::SubTypeMismatch { .. }
            | DispatchError::TooManyConsumers { .. }
            | DispatchError::DuplicateConsumer(_),
        ) => (ServerError::ConsumerBusy, e.to_string()),
        SubError::Dispatch(DispatchError::UnknownConsumer(_)) => {
            (ServerError::ConsumerNotFound, e.to_string())
        }
        SubError::Dispatch(DispatchError::CumulativeAckOnShared) => {
            (ServerError::NotAllowedError, e.to_string())
        }
        SubError::Dispatch(DispatchError::KeyShared(KeySharedError::ModeMismatch { .. })) => {
            (ServerError::ConsumerBusy, e.to_string())
        }
        SubError::Dispatch(DispatchError::KeyShared(_)) => {
            (ServerError::ConsumerAssignError, e.to_string())
        }
        SubError::OtherConsumersConnected { .. } => (ServerError::NotAllowedError, e.to_string()),
        SubError::Closed(_) => (
            ServerError::ServiceNotReady,
            format!("{e}: the topic is being unloaded"),
        ),
        SubError::Ml(_) => (ServerError::PersistenceError, e.to_string()),
        #[allow(unreachable_patterns, reason = "future variants")]
        _ => (ServerError::UnknownError, e.to_string()),
    }
}

fn check_subscription_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("subscription name must not be empty".into());
    }
    if name.len() > SUBSCRIPTION_NAME_BYTES_MAX {
        return Err(format!(
            "subscription name longer than {SUBSCRIPTION_NAME_BYTES_MAX} bytes"
        ));
    }
    if name == "." || name == ".." || name.chars().any(|c| c.is_control() || c == '/') {
        return Err(format!("invalid subscription name {name:?}"));
    }
    Ok(())
}

/// The Key_Shared settings a SUBSCRIBE asks for (no `keySharedMeta`:
/// AUTO_SPLIT, ordered).
fn key_shared_spec(
    id: ConsumerId,
    meta: Option<&KeySharedMeta>,
) -> Result<KeySharedSpec, KeySharedError> {
    let Some(m) = meta else {
        return Ok(KeySharedSpec::default());
    };
    let sticky = m.key_shared_mode == cms_client::proto::pulsar::KeySharedMode::Sticky as i32;
    let ranges = if sticky {
        let declared: Vec<(i64, i64)> = m
            .hash_ranges
            .iter()
            .map(|r| (i64::from(r.start), i64::from(r.end)))
            .collect();
        validate_ranges(id, &declared)?
    } else {
        Vec::new()
    };
    Ok(KeySharedSpec {
        mode: if sticky {
            KeySharedMode::Sticky
        } else {
            KeySharedMode::AutoSplit
        },
        ranges,
        allow_out_of_order: m.allow_out_of_order_delivery.unwrap_or(false),
    })
}

fn position_of(id: &MessageIdData) -> Position {
    // Entry ids travel as u64; -1 (none) wraps and is restored here.
    Position::new(id.ledger_id, id.entry_id as i64)
}

fn message_id_of(p: Position) -> MessageIdData {
    commands::message_id(p.ledger_id, p.entry_id as u64)
}

/// Handles one consumer-side command.
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
    if crate::non_persistent::conn::claims(conn, ty, cmd) {
        return crate::non_persistent::conn::on_command(conn, ty, cmd).await;
    }
    match ty {
        Type::Subscribe => {
            let c = cmd.subscribe.as_ref().ok_or_else(missing)?;
            on_subscribe(conn, c).await;
        }
        Type::Flow => {
            let c = cmd.flow.as_ref().ok_or_else(missing)?;
            if let Some(e) = conn.consumers.by_id.get(&c.consumer_id)
                && let Err(err) = e.sub.flow(e.id, c.message_permits)
            {
                debug!(consumer_id = c.consumer_id, error = %err, "FLOW refused");
            }
        }
        Type::Ack => {
            let c = cmd.ack.as_ref().ok_or_else(missing)?;
            let result = match conn.consumers.by_id.get(&c.consumer_id) {
                None => Err((
                    ServerError::ConsumerNotFound,
                    format!("consumer {} not found", c.consumer_id),
                )),
                Some(e) => {
                    // Only an ack whose receipt the client waits for waits
                    // for a due cursor snapshot; otherwise the snapshot is
                    // written in the background and this connection goes
                    // on reading (its producers' SENDs among them).
                    let persist = if c.request_id.is_some() {
                        Persist::Wait
                    } else {
                        Persist::Background
                    };
                    // A partial batch (ack_set) never acknowledges the entry
                    // cumulatively; individually it is a batch-index ack.
                    let positions: Vec<Position> = c
                        .message_id
                        .iter()
                        .filter(|m| m.ack_set.is_empty())
                        .map(position_of)
                        .collect();
                    let mut batch_err = None;
                    if c.ack_type != AckType::Cumulative as i32 {
                        for m in c.message_id.iter().filter(|m| !m.ack_set.is_empty()) {
                            if let Err(err) = e
                                .sub
                                .ack_batch_index(e.id, position_of(m), &m.ack_set, persist)
                                .await
                            {
                                batch_err.get_or_insert(err);
                            }
                        }
                    }
                    let r = if c.ack_type == AckType::Cumulative as i32 {
                        match positions.last() {
                            Some(p) => e.sub.ack_cumulative(e.id, *p, persist).await,
                            None => Ok(()),
                        }
                    } else {
                        e.sub.ack_individual(e.id, &positions, persist).await
                    };
                    let r = match batch_err {
                        Some(err) if r.is_ok() => Err(err),
                        _ => r,
                    };
                    r.map_err(|err| sub_error_reply(&err))
                }
            };
            if let Some(request_id) = c.request_id {
                conn.send(commands::ack_response(
                    c.consumer_id,
                    request_id,
                    result.err(),
                ))
                .await;
            } else if let Err((_, m)) = result {
                debug!(consumer_id = c.consumer_id, error = %m, "ACK refused");
            }
        }
        Type::RedeliverUnacknowledgedMessages => {
            let c = cmd
                .redeliver_unacknowledged_messages
                .as_ref()
                .ok_or_else(missing)?;
            if let Some(e) = conn.consumers.by_id.get(&c.consumer_id) {
                let ids = if c.message_ids.is_empty() {
                    None
                } else {
                    Some(c.message_ids.iter().map(position_of).collect())
                };
                if let Err(err) = e.sub.redeliver(e.id, ids) {
                    debug!(consumer_id = c.consumer_id, error = %err, "REDELIVER refused");
                }
            }
        }
        Type::Seek => {
            let c = cmd.seek.as_ref().ok_or_else(missing)?;
            let reply = match conn.consumers.by_id.get(&c.consumer_id) {
                None => Err((
                    ServerError::ConsumerNotFound,
                    format!("consumer {} not found", c.consumer_id),
                )),
                Some(e) => match (&c.message_id, c.message_publish_time) {
                    (Some(id), _) => {
                        let target = if id.ledger_id as i64 == -1 {
                            SeekTarget::Earliest
                        } else if id.ledger_id >= i64::MAX as u64 {
                            SeekTarget::Latest
                        } else {
                            SeekTarget::Position(position_of(id))
                        };
                        e.sub
                            .seek(target)
                            .await
                            .map_err(|err| sub_error_reply(&err))
                    }
                    (None, Some(ts)) => e
                        .sub
                        .seek_publish_time(ts, |entry| {
                            cms_client::proto::frame::parse_entry(entry)
                                .ok()
                                .map(|p| p.metadata.publish_time)
                        })
                        .await
                        .map(|found| {
                            debug!(
                                consumer_id = c.consumer_id,
                                publish_time = ts,
                                ?found,
                                "seek by publish time"
                            );
                        })
                        .map_err(|err| sub_error_reply(&err)),
                    (None, None) => Err((
                        ServerError::NotAllowedError,
                        "SEEK needs a message id".to_string(),
                    )),
                },
            };
            match reply {
                Ok(()) => {
                    // As Pulsar does: the seeking consumer is disconnected
                    // (before the seek is answered, so the client takes the
                    // answer during its reconnection and resubscribes from
                    // the seek target; pulsar-client-cpp drops what arrives
                    // between the seek and its reconnection). A reader's
                    // subscription is kept for its resubscribe, which finds
                    // the moved cursor (Pulsar's
                    // `removeConsumer(.., isResetCursor)`).
                    detach_for_seek(conn, c.consumer_id).await;
                    conn.send(commands::close_consumer(c.consumer_id, 0)).await;
                    conn.send(commands::success(c.request_id)).await;
                }
                Err(r) => conn.send_error(c.request_id, r).await,
            }
        }
        Type::Unsubscribe => {
            let c = cmd.unsubscribe.as_ref().ok_or_else(missing)?;
            let reply = match conn.consumers.by_id.get(&c.consumer_id) {
                None => Err((
                    ServerError::ConsumerNotFound,
                    format!("consumer {} not found", c.consumer_id),
                )),
                Some(e) => match e.sub.unsubscribe(Some(e.id)).await {
                    Ok(()) => {
                        e.topic.subscriptions.forget(&e.sub).await;
                        Ok(())
                    }
                    Err(err) => Err(sub_error_reply(&err)),
                },
            };
            match reply {
                Ok(()) => {
                    if conn.consumers.by_id.remove(&c.consumer_id).is_some() {
                        conn.state.metrics.consumers.dec();
                    }
                    conn.send(commands::success(c.request_id)).await;
                }
                Err(r) => conn.send_error(c.request_id, r).await,
            }
        }
        Type::CloseConsumer => {
            let c = cmd.close_consumer.as_ref().ok_or_else(missing)?;
            remove_consumer(conn, c.consumer_id).await;
            conn.send(commands::success(c.request_id)).await;
        }
        Type::ConsumerStats => {
            let c = cmd.consumer_stats.as_ref().ok_or_else(missing)?;
            let mut resp = CommandConsumerStatsResponse {
                request_id: c.request_id,
                ..Default::default()
            };
            match conn.consumers.by_id.get(&c.consumer_id) {
                None => {
                    resp.error_code = Some(ServerError::ConsumerNotFound as i32);
                    resp.error_message = Some(format!("consumer {} not found", c.consumer_id));
                }
                Some(e) => {
                    let stats = e.sub.stats();
                    resp.consumer_name = Some(e.name.clone());
                    resp.r#type = Some(e.sub_type.to_string());
                    resp.msg_backlog = Some(stats.msg_backlog);
                    if let Some(cs) = stats.dispatcher.consumers.iter().find(|x| x.id == e.id) {
                        resp.available_permits = Some(u64::try_from(cs.permits).unwrap_or(0));
                        resp.unacked_messages = Some(cs.unacked_messages);
                        resp.blocked_consumer_on_unacked_msgs = Some(cs.blocked);
                    }
                    resp.msg_rate_out = Some(0.0);
                    resp.msg_throughput_out = Some(0.0);
                    resp.msg_rate_redeliver = Some(0.0);
                }
            }
            let mut out = commands::base(Type::ConsumerStatsResponse);
            out.consumer_stats_response = Some(resp);
            conn.send(out).await;
        }
        Type::GetLastMessageId => {
            let c = cmd.get_last_message_id.as_ref().ok_or_else(missing)?;
            match conn.consumers.by_id.get(&c.consumer_id) {
                None => {
                    conn.send_error(
                        c.request_id,
                        (
                            ServerError::ConsumerNotFound,
                            format!("consumer {} not found", c.consumer_id),
                        ),
                    )
                    .await
                }
                Some(e) => {
                    let last = e.topic.ml.last_confirmed();
                    let mark = e.sub.stats().mark_delete;
                    conn.send(commands::get_last_message_id_response(
                        c.request_id,
                        message_id_of(last),
                        Some(message_id_of(mark)),
                    ))
                    .await
                }
            }
        }
        _ => {
            conn.send_error(
                crate::connection::request_id_of(cmd),
                (
                    ServerError::NotAllowedError,
                    format!("{} is not a consumer command", commands::command_name(cmd)),
                ),
            )
            .await
        }
    }
    Ok(())
}

/// The checks of a SUBSCRIBE before its topic is touched (handle limit,
/// subscription name, type, Key_Shared settings), shared with
/// [`crate::non_persistent`]: its type and Key_Shared settings.
pub(crate) fn check_subscribe(
    conn: &Conn,
    c: &CommandSubscribe,
    id: ConsumerId,
) -> Result<(SubType, Option<KeySharedSpec>), ErrorReply> {
    if conn.handles() >= conn.state.config.handles_per_connection_max {
        return Err((
            ServerError::NotAllowedError,
            format!(
                "connection reached {} producers and consumers",
                conn.state.config.handles_per_connection_max
            ),
        ));
    }
    check_subscription_name(&c.subscription).map_err(|m| (ServerError::NotAllowedError, m))?;
    let sub_type = match command_subscribe::SubType::try_from(c.sub_type) {
        Ok(command_subscribe::SubType::Exclusive) => SubType::Exclusive,
        Ok(command_subscribe::SubType::Shared) => SubType::Shared,
        Ok(command_subscribe::SubType::Failover) => SubType::Failover,
        Ok(command_subscribe::SubType::KeyShared) => SubType::KeyShared,
        Err(_) => {
            return Err((
                ServerError::NotAllowedError,
                format!("unknown subscription type {}", c.sub_type),
            ));
        }
    };
    let key_shared = if sub_type == SubType::KeyShared {
        Some(
            key_shared_spec(id, c.key_shared_meta.as_ref())
                .map_err(|e| (ServerError::ConsumerAssignError, e.to_string()))?,
        )
    } else {
        None
    };
    Ok((sub_type, key_shared))
}

/// The Pulsar error for a refused consumer (shared with
/// [`crate::non_persistent`]).
pub(crate) fn dispatch_error_reply(e: &DispatchError) -> ErrorReply {
    sub_error_reply(&SubError::Dispatch(e.clone()))
}

async fn on_subscribe(conn: &mut Conn, c: &CommandSubscribe) {
    if let Some(existing) = conn.consumers.by_id.get(&c.consumer_id) {
        // A retry of a request that already succeeded (G8).
        let same = existing.sub.name() == c.subscription
            && crate::topic_name::TopicName::parse(&c.topic).ok().as_ref()
                == Some(&existing.topic.name);
        if same {
            conn.send(commands::success(c.request_id)).await;
        } else {
            conn.send_error(
                c.request_id,
                (
                    ServerError::ConsumerBusy,
                    format!("consumer id {} is already in use", c.consumer_id),
                ),
            )
            .await;
        }
        return;
    }
    let id = ConsumerId::new(conn.id, c.consumer_id);
    let (sub_type, key_shared) = match check_subscribe(conn, c, id) {
        Ok(v) => v,
        Err(e) => {
            conn.send_error(c.request_id, e).await;
            return;
        }
    };
    let topic = match conn
        .load_topic(&c.topic, c.force_topic_creation.unwrap_or(true))
        .await
    {
        Ok(t) => t,
        Err(e) => {
            conn.send_error(c.request_id, e).await;
            return;
        }
    };
    if let Err(e) =
        crate::schema::wire::consumer_schema(&conn.state, &topic.name, c.schema.as_ref()).await
    {
        conn.send_error(c.request_id, e).await;
        return;
    }
    let quota = {
        let subs = topic.subscriptions.try_open_now().unwrap_or_default();
        let on_topic: usize = subs.iter().map(|s| s.consumer_count()).sum();
        let on_sub = subs
            .iter()
            .find(|s| s.name() == c.subscription)
            .map_or(0, |s| s.consumer_count());
        let new_sub = !topic.subscriptions.contains(&c.subscription).await
            && !topic.ml.has_cursor(&c.subscription);
        match conn
            .state
            .quota
            .admit(
                conn.id,
                &topic.name,
                crate::quota_io::Kind::Consumer,
                on_topic as u64,
                Some((on_sub as u64, new_sub, subs.len() as u64)),
            )
            .await
        {
            Ok(a) => a,
            Err(e) => {
                info!(tenant = %topic.name.tenant, namespace = %topic.name.namespace, topic = %topic.name, reason = %e.1, "consumer refused by a quota");
                conn.state.metrics.quota_refusals.inc();
                conn.send_error(c.request_id, e).await;
                return;
            }
        }
    };
    let initial = match c
        .initial_position
        .map(command_subscribe::InitialPosition::try_from)
    {
        Some(Ok(command_subscribe::InitialPosition::Earliest)) => InitialPosition::Earliest,
        _ => InitialPosition::Latest,
    };
    debug!(durable = ?c.durable, start = ?c.start_message_id, subscription = %c.subscription, "SUBSCRIBE start position");
    let open_as = if c.durable.unwrap_or(true) {
        OpenAs::Durable(initial)
    } else {
        let start = match &c.start_message_id {
            Some(id) if id.ledger_id as i64 == -1 => StartPosition::Earliest,
            Some(id) if id.ledger_id >= i64::MAX as u64 => StartPosition::Latest,
            Some(id) => StartPosition::At(position_of(id)),
            None => match initial {
                InitialPosition::Earliest => StartPosition::Earliest,
                InitialPosition::Latest => StartPosition::Latest,
            },
        };
        OpenAs::Reader(start)
    };
    let config = subscription_config(&conn.state, &topic.name, &c.subscription).await;
    let sub = match topic
        .subscriptions
        .get_or_open(
            &topic.ml,
            &c.subscription,
            open_as,
            message_counter(),
            config,
        )
        .await
    {
        Ok(s) => s,
        Err(e) => {
            conn.send_error(c.request_id, sub_error_reply(&e)).await;
            return;
        }
    };
    let name = c
        .consumer_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("consumer-{}-{}", conn.id, c.consumer_id));
    let (sink, deliveries) = mpsc::channel(CONSUMER_QUEUE_MAX);
    if let Err(e) = sub.add_consumer(ConsumerSpec {
        id,
        name: name.clone(),
        priority: c.priority_level.unwrap_or(0),
        sub_type,
        key_shared,
        sink,
    }) {
        topic.subscriptions.consumer_left(&sub).await;
        conn.send_error(c.request_id, sub_error_reply(&e)).await;
        return;
    }
    let generation = conn.next_generation();
    // SUCCESS is queued before the forwarder starts: nothing for this
    // consumer can precede it.
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
            topic.clone(),
            c.subscription.clone(),
            (c.consumer_id, generation),
            deliveries,
            conn.out.clone(),
            conn.events_tx.clone(),
        )
        .instrument(span),
    );
    conn.state.metrics.consumers.inc();
    info!(topic = %topic.name, subscription = %c.subscription, consumer = %name,
        sub_type = %sub_type, "consumer created");
    conn.consumers.by_id.insert(
        c.consumer_id,
        ConsumerEntry {
            topic,
            sub,
            id,
            generation,
            name,
            sub_type,
            _quota: quota,
        },
    );
}

/// The settings a subscription of `topic` named `sub` opens with (on a
/// SUBSCRIBE or through the admin API): the broker's consumer bound and,
/// under a dispatch-rate quota, a read budget of `dispatch_read_budget_ms`
/// (default a tenth of a second) of the tightest byte rate (as Pulsar's
/// dispatchers read no more than the rate limiter's available permits), so
/// a rate-limited catch-up reader pulls its backlog through the bookies and
/// the broker in small, steady pieces instead of several MiB at once. The
/// budget follows quota changes.
pub(crate) async fn subscription_config(
    state: &crate::service::BrokerState,
    topic: &crate::topic_name::TopicName,
    sub: &str,
) -> SubscriptionConfig {
    let buckets = state.quota.dispatch_buckets_for(topic, sub).await;
    let slice_ms = state.config.dispatch_read_budget_ms;
    SubscriptionConfig {
        limits: DispatchLimits {
            consumers_max: state.config.consumers_per_subscription_max,
            ..DispatchLimits::default()
        },
        read_budget: ReadBudget(Arc::new(move || {
            crate::quota_io::QuotaService::read_budget(&buckets, slice_ms)
        })),
        ..SubscriptionConfig::default()
    }
}

/// Forwards one consumer's deliveries to the socket until the subscription
/// drops its sink or the topic unloads.
async fn forward(
    state: Arc<crate::service::BrokerState>,
    topic: Arc<Topic>,
    subscription: String,
    (consumer_id, generation): (u64, u64),
    mut deliveries: mpsc::Receiver<Delivery>,
    out: Outbound,
    events: mpsc::Sender<ConnEvent>,
) {
    let mut closing = topic.closing();
    // One future for the task's life: a new one per delivery would register
    // with (and leave) the watch channel's waiters each time.
    let closing = wait_true(&mut closing);
    tokio::pin!(closing);
    let dispatch_buckets = state
        .quota
        .dispatch_buckets_for(&topic.name, &subscription)
        .await;
    loop {
        let d = tokio::select! {
            // Closing first: an unload both sets it and drops the sink, and
            // either way the client must be told.
            biased;
            _ = &mut closing => None,
            d = deliveries.recv() => d,
        };
        let Some(d) = d else {
            // The topic unloads, or the subscription dropped this consumer's
            // sink: the connection tells the client to resubscribe (a no-op
            // when the connection removed the consumer itself). Returning
            // silently here once left a consumer attached to nothing.
            let _ = events
                .send(ConnEvent::ConsumerClosed {
                    consumer_id,
                    generation,
                })
                .await;
            return;
        };
        let frame = match d {
            Delivery::Message {
                position,
                redelivery_count,
                messages,
                entry,
                ack_set,
                ..
            } => {
                let mut command = commands::message(
                    consumer_id,
                    position.ledger_id,
                    position.entry_id as u64,
                    redelivery_count,
                );
                if let Some(m) = command.message.as_mut() {
                    // Batch-index acks: the client skips the acked messages.
                    m.ack_set = ack_set;
                }
                let msgs = u64::from(messages);
                let bytes = u64::try_from(entry.len()).unwrap_or(u64::MAX);
                // Dispatch-rate quotas: this consumer waits (its queue
                // fills, the subscription stops giving it entries).
                let mut owed = state
                    .quota
                    .on_dispatch(&topic.name, &dispatch_buckets, msgs, bytes);
                while let Some(w) = crate::quota_io::pay(&mut owed) {
                    tokio::time::sleep(w.max(std::time::Duration::from_millis(1))).await;
                }
                state.metrics.messages_out.inc_by(msgs);
                topic.counters.record_out(msgs, bytes);
                if redelivery_count > 0 {
                    state.metrics.messages_redelivered.inc_by(msgs);
                }
                state
                    .metrics
                    .bytes_out
                    .inc_by(u64::try_from(entry.len()).unwrap_or(u64::MAX));
                Frame::Payload(PayloadFrame {
                    command: Box::new(command),
                    broker_entry_metadata: None,
                    checksum: ChecksumState::Valid,
                    entry,
                })
            }
            Delivery::ActiveChanged { is_active, .. } => {
                Frame::from(commands::active_consumer_change(consumer_id, is_active))
            }
        };
        if out.send(frame).await.is_err() {
            return;
        }
    }
}

async fn remove_consumer(conn: &mut Conn, consumer_id: u64) {
    let Some(e) = conn.consumers.by_id.remove(&consumer_id) else {
        return;
    };
    conn.state.metrics.consumers.dec();
    if let Err(err) = e.sub.remove_consumer(e.id) {
        debug!(consumer_id, error = %err, "removing the consumer");
    }
    e.topic.subscriptions.consumer_left(&e.sub).await;
    debug!(consumer_id, "consumer closed");
}

/// After a SEEK: the consumer leaves its subscription, but a reader's
/// subscription (non-durable: its moved cursor is all there is) stays open
/// for the client's resubscribe, for at most
/// [`crate::subscriptions::SEEK_RESUBSCRIBE_GRACE_MS`] without a consumer.
async fn detach_for_seek(conn: &mut Conn, consumer_id: u64) {
    let Some(e) = conn.consumers.by_id.remove(&consumer_id) else {
        return;
    };
    conn.state.metrics.consumers.dec();
    if let Err(err) = e.sub.remove_consumer(e.id) {
        debug!(consumer_id, error = %err, "removing the consumer");
    }
    if e.sub.is_durable() {
        e.topic.subscriptions.consumer_left(&e.sub).await;
    } else {
        let topic = e.topic.clone();
        let sub = e.sub.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(
                crate::subscriptions::SEEK_RESUBSCRIBE_GRACE_MS,
            ))
            .await;
            topic.subscriptions.consumer_left(&sub).await;
        });
    }
    debug!(consumer_id, "consumer detached for seek");
}

/// The broker closed a consumer (its topic unloaded): forget it, tell the client.
pub(crate) async fn on_closed_by_broker(conn: &mut Conn, consumer_id: u64, generation: u64) {
    if conn
        .consumers
        .by_id
        .get(&consumer_id)
        .is_some_and(|e| e.generation == generation)
    {
        remove_consumer(conn, consumer_id).await;
        conn.send(commands::close_consumer(consumer_id, 0)).await;
        warn!(
            consumer_id,
            "consumer closed by the broker (topic unloaded)"
        );
    }
}

/// The connection ends: every consumer leaves its subscription (its
/// unacknowledged messages go to the others or wait for the next consumer).
pub(crate) async fn remove_all(conn: &mut Conn) {
    crate::non_persistent::conn::remove_all(conn);
    let ids: Vec<u64> = conn.consumers.by_id.keys().copied().collect();
    for id in ids {
        remove_consumer(conn, id).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_names() {
        for ok in ["sub", "my-sub_1", "reader-abc123", "a.b"] {
            assert!(check_subscription_name(ok).is_ok(), "{ok}");
        }
        let long = "s".repeat(SUBSCRIPTION_NAME_BYTES_MAX + 1);
        for bad in ["", ".", "..", "a/b", "a\nb", long.as_str()] {
            assert!(check_subscription_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn message_ids_round_trip_including_none() {
        for p in [
            Position::new(3, 0),
            Position::new(7, 12),
            Position::new(5, -1),
        ] {
            assert_eq!(position_of(&message_id_of(p)), p);
        }
    }
}
