//! One client connection of the Pulsar binary protocol: the handshake,
//! keep-alive, lookups, producers and their publish path, and (through
//! [`crate::consumers`]) consumers.
//!
//! Structure: one task reads frames and handles commands in order; one task
//! writes the frames queued on a bounded channel (responses, receipts,
//! messages; once it has a frame it yields once, so frames queued by tasks
//! woken together, such as an entry's receipt and its dispatch, leave in one
//! write); each producer has an append task (SEND → managed-ledger
//! append, in order) and a receipt task (waits for each append to be durable,
//! in order, then queues SEND_RECEIPT). Events from those tasks (a producer
//! closed by the broker, a waiting producer granted) come back to the reader
//! task on a channel.
//!
//! Promises:
//! - nothing but CONNECT is accepted before CONNECTED; a decode error, a
//!   command before CONNECT, a second CONNECT, a command without its
//!   sub-message or a type that is not a Pulsar command closes this
//!   connection only (invariant 9); a known command we do not serve gets an
//!   ERROR naming it, and we only ever send commands pulsar-client-cpp
//!   handles (G2);
//! - SEND_RECEIPT only after the durable append, in order per producer,
//!   echoing `sequence_id` / `highest_sequence_id` (G4); a checksum mismatch
//!   gets SEND_ERROR `ChecksumError` in the same order; receipts are never
//!   dropped — when `pending_publishes_per_connection_max` publishes are in
//!   flight the connection stops reading the socket until one completes;
//! - CLOSE_PRODUCER / CLOSE_CONSUMER are idempotent: SUCCESS for unknown ids (G8);
//! - keep-alive: PING after `keep_alive_interval_s` without input, close
//!   after twice that (never while reads are paused for backpressure);
//! - when the connection ends, its producers and consumers leave their
//!   topics and subscriptions;
//! - with authentication on ([`crate::auth`]), CONNECT must carry a valid
//!   token (method `token`) or the connection gets ERROR
//!   `AuthenticationError` and is closed; LOOKUP, PARTITIONED_METADATA,
//!   PRODUCER, SUBSCRIBE, GET_TOPICS_OF_NAMESPACE and the schema commands
//!   are each authorized for the connection's role (denied:
//!   `AuthorizationError`, the connection stays open); once the token
//!   expires the broker sends AUTH_CHALLENGE and closes the connection if
//!   no valid AUTH_RESPONSE (same role) arrives within
//!   `auth_refresh_timeout_s`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cms_client::proto::commands;
use cms_client::proto::frame::{ChecksumState, Frame, FrameError, PulsarCodec};
use cms_client::proto::pulsar::{
    BaseCommand, CommandLookupTopic, CommandPartitionedTopicMetadata, CommandProducer,
    ProducerAccessMode, ServerError, base_command::Type,
};
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::consumers::Consumers;
use crate::dedup::{Decision, effective_id};
use crate::managed_ledger::io::MlError;
use crate::managed_ledger::io::managed_ledger::PendingAppend;
use crate::ownership::{LookupAnswer, OwnershipError};
use crate::producers::{AccessMode, ProducerRefusal, ProducerRequest};
use crate::service::BrokerState;
use crate::topic_name::TopicName;
use crate::topics::{ProducerAdmission, Topic, TopicError};

/// Highest protocol version this broker speaks.
pub const PROTOCOL_VERSION_MAX: i32 = 20;
/// Longest a topic load may take for one request, in milliseconds.
pub const TOPIC_LOAD_TIMEOUT_MS: u64 = 30_000;
/// Server version reported in CONNECTED.
pub const SERVER_VERSION: &str = concat!("CMS-", env!("CARGO_PKG_VERSION"));

/// The error code and message of an ERROR answer.
pub type ErrorReply = (ServerError, String);

/// Maps a topic error to the Pulsar error the client understands (G7).
pub fn topic_error_reply(e: &TopicError) -> ErrorReply {
    match e {
        TopicError::NotFound(m) => (ServerError::TopicNotFound, m.clone()),
        TopicError::NotAllowed(m) => (ServerError::NotAllowedError, m.clone()),
        // "is being unloaded" keeps the client's connection open (G7).
        TopicError::ServiceNotReady(m) => (ServerError::ServiceNotReady, m.clone()),
        TopicError::Persistence(m) => (ServerError::PersistenceError, m.clone()),
    }
}

/// Maps an ownership error to the Pulsar error of a failed lookup.
pub fn ownership_error_reply(e: &OwnershipError) -> ErrorReply {
    match e {
        OwnershipError::NoNamespace(_) => (ServerError::TopicNotFound, e.to_string()),
        OwnershipError::BadPolicy { .. } | OwnershipError::Metadata(_) => {
            (ServerError::MetadataError, e.to_string())
        }
        // Retryable; "is being unloaded" keeps the connection (G7). A
        // lookup never splits, but a bundle it chose can be split meanwhile.
        OwnershipError::Unavailable(_)
        | OwnershipError::NoBundle(_)
        | OwnershipError::Refused(_) => (ServerError::ServiceNotReady, e.to_string()),
    }
}

/// Parses a topic name and checks its namespace exists.
pub async fn check_topic_name(state: &BrokerState, topic: &str) -> Result<TopicName, ErrorReply> {
    let name =
        TopicName::parse(topic).map_err(|e| (ServerError::InvalidTopicName, e.to_string()))?;
    let ctx = state.topics.context();
    match crate::tenancy::namespace_policies(
        &*ctx.store,
        &ctx.layout,
        &name.tenant,
        &name.namespace,
    )
    .await
    {
        Ok(Some(_)) => Ok(name),
        Ok(None) => Err((
            ServerError::TopicNotFound,
            format!("namespace {} does not exist", name.namespace_name()),
        )),
        Err(e) => Err((ServerError::MetadataError, e.to_string())),
    }
}

/// Lookups answered at once per connection.
pub const LOOKUPS_PER_CONNECTION_MAX: usize = 64;
/// How often a connection held by a backlog quota checks it again, in ms.
pub const HOLD_RECHECK_MS: u64 = 100;

/// The LOOKUP_RESPONSE for `c`: Connect, authoritative Redirect (G10) or Failed.
async fn lookup_reply(state: &BrokerState, c: &CommandLookupTopic) -> BaseCommand {
    match check_topic_name(state, &c.topic).await {
        Ok(name) => {
            let authoritative = c.authoritative.unwrap_or(false);
            match state.ownership.lookup(&name, authoritative).await {
                Ok(LookupAnswer::Connect) => {
                    let mut r =
                        commands::lookup_response_connect(c.request_id, &state.service_url, true);
                    if let (Some(l), Some(tls)) =
                        (r.lookup_topic_response.as_mut(), &state.service_url_tls)
                    {
                        l.broker_service_url_tls = Some(tls.clone());
                    }
                    r
                }
                Ok(LookupAnswer::Redirect {
                    service_url,
                    service_url_tls,
                    ..
                }) => {
                    let mut r =
                        commands::lookup_response_redirect(c.request_id, &service_url, true);
                    // A client on pulsar+ssl:// follows this one (Pulsar's
                    // clients pick brokerServiceUrlTls when they use TLS).
                    if let (Some(l), Some(tls)) =
                        (r.lookup_topic_response.as_mut(), service_url_tls)
                    {
                        l.broker_service_url_tls = Some(tls);
                    }
                    r
                }
                Err(e) => {
                    let (code, msg) = ownership_error_reply(&e);
                    commands::lookup_response_failed(c.request_id, code, msg)
                }
            }
        }
        Err((code, msg)) => commands::lookup_response_failed(c.request_id, code, msg),
    }
}

/// Frames queued towards the socket.
pub type Outbound = mpsc::Sender<Frame>;

/// What producer and consumer tasks tell the reader task.
#[derive(Debug)]
pub enum ConnEvent {
    /// The broker closed this producer (its topic unloaded or failed): send
    /// CLOSE_PRODUCER and forget it.
    ProducerClosed {
        /// Producer id.
        producer_id: u64,
        /// Which registration (ids can be reused after a close).
        generation: u64,
    },
    /// The broker closed this consumer (its topic unloaded).
    ConsumerClosed {
        /// Consumer id.
        consumer_id: u64,
        /// Which registration.
        generation: u64,
    },
}

struct SendItem {
    sequence_id: u64,
    highest_sequence_id: Option<u64>,
    num_messages: u64,
    checksum: ChecksumState,
    entry: Bytes,
    received: Instant,
    _permit: OwnedSemaphorePermit,
}

enum Pending {
    Append(SendItem, PendingAppend),
    /// De-duplication: already durable, acknowledged without storing.
    Duplicate(SendItem),
    /// De-duplication: its original (this id) may be in flight.
    WaitForOriginal(SendItem, i64),
    Refused(SendItem, ServerError, String),
    Failed(SendItem, String),
}

struct ProducerEntry {
    topic: Arc<Topic>,
    name: String,
    generation: u64,
    ready: Arc<AtomicBool>,
    sends: mpsc::Sender<SendItem>,
    /// The schema version PRODUCER_SUCCESS carried (None without a schema).
    schema_version: Option<Bytes>,
    /// Its place in the tenant's and namespace's counts.
    _quota: crate::quota_io::Admission,
    /// The publish-rate buckets it pays into.
    buckets: Vec<Arc<crate::quota_io::Bucket>>,
}

/// `cmd` (a PRODUCER_SUCCESS) carrying the producer's schema version.
fn with_schema_version(mut cmd: BaseCommand, version: &Option<Bytes>) -> BaseCommand {
    if let Some(ps) = cmd.producer_success.as_mut() {
        ps.schema_version.clone_from(version);
    }
    cmd
}

/// Per-connection state owned by the reader task.
pub struct Conn {
    /// Broker-wide state.
    pub state: Arc<BrokerState>,
    /// Connection id.
    pub id: u64,
    /// Frames towards the socket.
    pub out: Outbound,
    /// Events from this connection's tasks.
    pub events_tx: mpsc::Sender<ConnEvent>,
    protocol_version: i32,
    connected: bool,
    producers: HashMap<u64, ProducerEntry>,
    /// This connection's consumers.
    pub consumers: Consumers,
    /// This connection's producers and consumers on non-persistent topics.
    pub np: crate::non_persistent::conn::NpHandles,
    generation: u64,
    publish_permits: Arc<Semaphore>,
    lookup_permits: Arc<Semaphore>,
    /// What received SENDs still owe the publish-rate buckets.
    pub(crate) owed: Vec<crate::quota_io::Charge>,
    /// A topic whose backlog quota holds its producers
    /// (`producer_request_hold`).
    held: Option<Arc<Topic>>,
    /// Socket reads pause until then (publish rate or backlog hold).
    throttle_until: Option<Instant>,
    /// The authenticated role (None while authentication is off).
    role: Option<String>,
    /// Expiry of the connection's token (seconds since the epoch).
    auth_exp: Option<u64>,
    /// When an AUTH_CHALLENGE went out unanswered.
    challenged_at: Option<Instant>,
}

/// Why the reader task stops.
pub(crate) enum CloseReason {
    /// The peer closed or the socket failed.
    Gone,
    /// Bad input: counted, logged, closed.
    BadInput(String),
    /// Keep-alive timeout.
    Idle,
    /// Broker shutdown.
    Shutdown,
    /// Authentication refused or not refreshed.
    AuthFailed(String),
}

/// Serves one accepted connection until it closes.
pub async fn serve(state: Arc<BrokerState>, stream: TcpStream, peer: SocketAddr) {
    let id = state.next_connection_id();
    let span = info_span!("connection", conn = id, peer = %peer);
    let (rd, wr) = stream.into_split();
    serve_inner(state, rd, wr, id).instrument(span).await
}

/// Serves one accepted TLS connection (`pulsar+ssl://`) until it closes.
pub async fn serve_tls(
    state: Arc<BrokerState>,
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    peer: SocketAddr,
) {
    let id = state.next_connection_id();
    let span = info_span!("connection", conn = id, peer = %peer, tls = true);
    let (rd, wr) = tokio::io::split(stream);
    serve_inner(state, rd, wr, id).instrument(span).await
}

async fn serve_inner<R, W>(state: Arc<BrokerState>, rd: R, wr: W, id: u64)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let frame_max = state.config.frame_bytes_max();
    let mut reader = FramedRead::new(rd, PulsarCodec::new(frame_max));
    let writer = FramedWrite::new(wr, PulsarCodec::new(frame_max));
    let (out, out_rx) = mpsc::channel::<Frame>(state.config.outbound_queue_max);
    let write_task = tokio::spawn(write_frames(writer, out_rx).in_current_span());
    let (events_tx, mut events_rx) = mpsc::channel(1024);
    let mut conn = Conn {
        state: state.clone(),
        id,
        out: out.clone(),
        events_tx,
        protocol_version: 0,
        connected: false,
        producers: HashMap::new(),
        consumers: Consumers::default(),
        np: crate::non_persistent::conn::NpHandles::default(),
        generation: 0,
        publish_permits: Arc::new(Semaphore::new(
            state.config.pending_publishes_per_connection_max,
        )),
        lookup_permits: Arc::new(Semaphore::new(LOOKUPS_PER_CONNECTION_MAX)),
        owed: Vec::new(),
        held: None,
        throttle_until: None,
        role: None,
        auth_exp: None,
        challenged_at: None,
    };
    let keep_alive = Duration::from_secs(state.config.keep_alive_interval_s);
    // Checked four times per interval so a PING goes out within a quarter
    // interval of the threshold, and the close as well.
    let mut ticker = tokio::time::interval((keep_alive / 4).max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut last_rx = Instant::now();
    let mut pinged_at: Option<Instant> = None;
    let mut shutdown = state.shutdown_signal();
    // One future for the whole loop: a new one per turn would register with
    // (and leave) the watch channel's waiters at every frame.
    let shutdown = wait_true(&mut shutdown);
    tokio::pin!(shutdown);
    let mut reserved: Option<OwnedSemaphorePermit> = None;

    let close = loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => break CloseReason::Shutdown,
            Some(ev) = events_rx.recv() => conn.on_event(ev).await,
            permit = conn.publish_permits.clone().acquire_owned(), if reserved.is_none() => {
                match permit {
                    Ok(p) => reserved = Some(p),
                    Err(_) => break CloseReason::Gone,
                }
            }
            _ = tokio::time::sleep_until(conn.throttle_until.unwrap_or_else(Instant::now).into()),
                if conn.throttle_until.is_some() => conn.update_throttle(),
            frame = reader.next(), if reserved.is_some() && conn.throttle_until.is_none() => {
                last_rx = Instant::now();
                match frame {
                    None => break CloseReason::Gone,
                    Some(Err(FrameError::Io(e))) => {
                        debug!(error = %e, "read failed");
                        break CloseReason::Gone;
                    }
                    Some(Err(e)) => break CloseReason::BadInput(e.to_string()),
                    Some(Ok(frame)) => {
                        if let Err(why) = conn.on_frame(frame, &mut reserved).await {
                            break why;
                        }
                        conn.update_throttle();
                    }
                }
            }
            _ = ticker.tick() => {
                if let Err(why) = conn.check_auth_expiry() {
                    break why;
                }
                let idle = last_rx.elapsed();
                let reading = reserved.is_some() && conn.throttle_until.is_none();
                if reading && idle >= keep_alive * 2 {
                    break CloseReason::Idle;
                }
                // One PING per silent period.
                let pinged_since_rx = pinged_at.is_some_and(|p| p >= last_rx);
                if conn.connected && idle >= keep_alive && !pinged_since_rx {
                    let _ = conn.out.try_send(Frame::from(commands::ping()));
                    pinged_at = Some(Instant::now());
                }
            }
        }
    };
    match &close {
        CloseReason::Gone => debug!("connection closed by the peer"),
        CloseReason::BadInput(why) => {
            state.metrics.connections_bad_input.inc();
            warn!(reason = %why, "closing the connection: bad input");
        }
        CloseReason::Idle => info!("closing the connection: no keep-alive answer"),
        CloseReason::Shutdown => debug!("closing the connection: broker shutdown"),
        CloseReason::AuthFailed(why) => {
            state.metrics.connections_bad_input.inc();
            warn!(reason = %why, "closing the connection: authentication");
        }
    }
    conn.cleanup().await;
    drop(conn);
    drop(out);
    // The writer ends once every sender is gone; bound the wait.
    let _ = tokio::time::timeout(Duration::from_secs(5), write_task).await;
}

/// The connection's writer: sends the frames queued for it, in order, until
/// every sender is gone, then closes the stream. Once it has taken a frame it
/// yields once, so the tasks that are ready now queue theirs first, and then
/// flushes everything queued as one write: an entry's receipt and its
/// dispatch to a consumer on the same connection are woken together, and so
/// go out in one write (one wake-up of the client) instead of two.
async fn write_frames<W>(mut writer: FramedWrite<W, PulsarCodec>, mut out_rx: mpsc::Receiver<Frame>)
where
    W: tokio::io::AsyncWrite + Unpin,
{
    while let Some(frame) = out_rx.recv().await {
        if let Err(e) = writer.feed(frame).await {
            debug!(error = %e, "write failed");
            return;
        }
        tokio::task::yield_now().await;
        while let Ok(frame) = out_rx.try_recv() {
            if let Err(e) = writer.feed(frame).await {
                debug!(error = %e, "write failed");
                return;
            }
        }
        if let Err(e) = writer.flush().await {
            debug!(error = %e, "flush failed");
            return;
        }
    }
    let _ = writer.close().await;
}

/// The request id of a command that has one (for ERROR answers).
pub(crate) fn request_id_of(cmd: &BaseCommand) -> u64 {
    cmd.producer
        .as_ref()
        .map(|c| c.request_id)
        .or(cmd.subscribe.as_ref().map(|c| c.request_id))
        .or(cmd.lookup_topic.as_ref().map(|c| c.request_id))
        .or(cmd.partition_metadata.as_ref().map(|c| c.request_id))
        .or(cmd.unsubscribe.as_ref().map(|c| c.request_id))
        .or(cmd.seek.as_ref().map(|c| c.request_id))
        .or(cmd.close_producer.as_ref().map(|c| c.request_id))
        .or(cmd.close_consumer.as_ref().map(|c| c.request_id))
        .or(cmd.consumer_stats.as_ref().map(|c| c.request_id))
        .or(cmd.get_last_message_id.as_ref().map(|c| c.request_id))
        .or(cmd.get_topics_of_namespace.as_ref().map(|c| c.request_id))
        .or(cmd.get_schema.as_ref().map(|c| c.request_id))
        .or(cmd.get_or_create_schema.as_ref().map(|c| c.request_id))
        .unwrap_or(0)
}

/// Whether `t` is a command type of the Pulsar protocol at all (known to our
/// definition, or one of the transaction / topic-list-watch commands we do
/// not define).
fn is_pulsar_command_type(t: i32) -> bool {
    Type::try_from(t).is_ok() || (50..=67).contains(&t)
}

/// Resolves once `rx` holds `true` (or its sender is gone).
pub async fn wait_true(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

fn missing(what: &str) -> CloseReason {
    CloseReason::BadInput(format!("{what} command without its sub-message"))
}

impl Conn {
    /// Queues a frame towards the socket (waits when the queue is full).
    pub async fn send(&self, cmd: BaseCommand) {
        let _ = self.out.send(Frame::from(cmd)).await;
    }

    /// Queues an ERROR answer.
    pub async fn send_error(&self, request_id: u64, (code, message): ErrorReply) {
        self.send(commands::error(request_id, code, message)).await;
    }

    /// A new registration generation (producer and consumer ids may be reused).
    pub fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    /// Pays what SENDs owe the publish-rate buckets and checks a backlog
    /// hold; sets when socket reads may resume (None: now).
    fn update_throttle(&mut self) {
        // Released when the backlog fits again or the topic goes (its
        // producers are closed with it).
        if let Some(t) = &self.held
            && (!self.state.quota.is_held(t) || *t.closing().borrow())
        {
            self.held = None;
        }
        let wait = crate::quota_io::pay(&mut self.owed);
        let pause = match (wait, &self.held) {
            (Some(w), _) => Some(w.max(Duration::from_millis(1))),
            (None, Some(_)) => Some(Duration::from_millis(HOLD_RECHECK_MS)),
            (None, None) => None,
        };
        self.state
            .metrics
            .record_throttle(self.throttle_until.is_some(), pause);
        self.throttle_until = pause.map(|p| Instant::now() + p);
    }

    /// Producers plus consumers on this connection.
    pub fn handles(&self) -> usize {
        self.producers.len() + self.consumers.len() + self.np.len()
    }

    /// Whether `producer_id` is a (persistent-topic) producer here.
    pub fn has_producer_id(&self, producer_id: u64) -> bool {
        self.producers.contains_key(&producer_id)
    }

    /// Whether `consumer_id` is a (persistent-topic) consumer here.
    pub fn has_consumer_id(&self, consumer_id: u64) -> bool {
        self.consumers.contains(consumer_id)
    }

    async fn on_frame(
        &mut self,
        frame: Frame,
        reserved: &mut Option<OwnedSemaphorePermit>,
    ) -> Result<(), CloseReason> {
        let (cmd, payload) = match frame {
            Frame::Command(c) => (c, None),
            Frame::Payload(p) => (p.command, Some((p.checksum, p.entry))),
        };
        let ty = Type::try_from(cmd.r#type);
        if !self.connected {
            return match ty {
                Ok(Type::Connect) => self.on_connect(&cmd).await,
                _ => Err(CloseReason::BadInput(format!(
                    "{} before CONNECT",
                    commands::command_name(&cmd)
                ))),
            };
        }
        let Ok(ty) = ty else {
            if is_pulsar_command_type(cmd.r#type) {
                self.send_error(
                    request_id_of(&cmd),
                    (
                        ServerError::NotAllowedError,
                        format!(
                            "command type {} is not supported by this broker",
                            cmd.r#type
                        ),
                    ),
                )
                .await;
                return Ok(());
            }
            return Err(CloseReason::BadInput(format!(
                "unknown command type {}",
                cmd.r#type
            )));
        };
        if let Err(denied) = self.authorize(ty, &cmd).await {
            self.send(denied).await;
            return Ok(());
        }
        match ty {
            Type::Connect => Err(CloseReason::BadInput("second CONNECT".into())),
            Type::Ping => {
                self.send(commands::pong()).await;
                Ok(())
            }
            Type::Pong => Ok(()),
            Type::Lookup => {
                let c = cmd.lookup_topic.as_ref().ok_or_else(|| missing("LOOKUP"))?;
                self.on_lookup(c).await;
                Ok(())
            }
            Type::PartitionedMetadata => {
                let c = cmd
                    .partition_metadata
                    .as_ref()
                    .ok_or_else(|| missing("PARTITIONED_METADATA"))?;
                self.on_partitioned_metadata(c).await;
                Ok(())
            }
            Type::Producer => {
                let c = cmd.producer.as_ref().ok_or_else(|| missing("PRODUCER"))?;
                self.on_producer(c).await;
                Ok(())
            }
            Type::Send => {
                let Some((checksum, entry)) = payload else {
                    return Err(CloseReason::BadInput("SEND without a payload".into()));
                };
                let c = cmd.send.as_ref().ok_or_else(|| missing("SEND"))?;
                if self.np.has_producer(c.producer_id) {
                    // Handled at once: the publish permit stays reserved.
                    crate::non_persistent::conn::on_send(self, c, checksum, entry).await;
                    return Ok(());
                }
                let item_permit = reserved.take();
                let Some(permit) = item_permit else {
                    return Err(CloseReason::BadInput(
                        "internal: SEND without a permit".into(),
                    ));
                };
                self.on_send(
                    c.producer_id,
                    SendItem {
                        sequence_id: c.sequence_id,
                        highest_sequence_id: c.highest_sequence_id,
                        num_messages: u64::try_from(c.num_messages.unwrap_or(1).max(1))
                            .unwrap_or(1),
                        checksum,
                        entry,
                        received: Instant::now(),
                        _permit: permit,
                    },
                );
                Ok(())
            }
            Type::CloseProducer => {
                let c = cmd
                    .close_producer
                    .as_ref()
                    .ok_or_else(|| missing("CLOSE_PRODUCER"))?;
                if !crate::non_persistent::conn::remove_producer(self, c.producer_id) {
                    self.remove_producer(c.producer_id);
                }
                self.send(commands::success(c.request_id)).await;
                Ok(())
            }
            Type::Subscribe
            | Type::Flow
            | Type::Ack
            | Type::RedeliverUnacknowledgedMessages
            | Type::Seek
            | Type::Unsubscribe
            | Type::CloseConsumer
            | Type::ConsumerStats
            | Type::GetLastMessageId => crate::consumers::on_command(self, ty, &cmd).await,
            Type::GetTopicsOfNamespace => {
                let c = cmd
                    .get_topics_of_namespace
                    .as_ref()
                    .ok_or_else(|| missing("GET_TOPICS_OF_NAMESPACE"))?;
                self.on_get_topics_of_namespace(c).await;
                Ok(())
            }
            Type::GetSchema => {
                let c = cmd
                    .get_schema
                    .as_ref()
                    .ok_or_else(|| missing("GET_SCHEMA"))?;
                self.send(crate::schema::wire::get_schema_reply(&self.state, c).await)
                    .await;
                Ok(())
            }
            Type::GetOrCreateSchema => {
                let c = cmd
                    .get_or_create_schema
                    .as_ref()
                    .ok_or_else(|| missing("GET_OR_CREATE_SCHEMA"))?;
                self.send(crate::schema::wire::get_or_create_reply(&self.state, c).await)
                    .await;
                Ok(())
            }
            Type::AuthResponse => self.on_auth_response(&cmd).await,
            // Broker-to-client commands sent by a client.
            _ => {
                self.send_error(
                    request_id_of(&cmd),
                    (
                        ServerError::NotAllowedError,
                        format!(
                            "{} is not a client-to-broker command",
                            commands::command_name(&cmd)
                        ),
                    ),
                )
                .await;
                Ok(())
            }
        }
    }

    async fn on_connect(&mut self, cmd: &BaseCommand) -> Result<(), CloseReason> {
        let c = cmd.connect.as_ref().ok_or_else(|| missing("CONNECT"))?;
        let client = c.protocol_version.unwrap_or(0);
        self.protocol_version = client.clamp(0, PROTOCOL_VERSION_MAX);
        if let Some(auth) = self.state.auth.clone() {
            let token = match c.auth_method_name.as_deref() {
                Some(crate::auth::TOKEN_METHOD) => c.auth_data.as_deref().unwrap_or_default(),
                Some("none") | None => &[][..],
                Some(other) => {
                    return self
                        .refuse_auth(format!(
                            "authentication method {other:?} is not supported; use \"token\""
                        ))
                        .await;
                }
            };
            let token = String::from_utf8_lossy(token);
            match auth.authenticate(&token) {
                Ok(id) => {
                    debug!(role = %id.role, "authenticated");
                    self.role = Some(id.role);
                    self.auth_exp = id.exp;
                }
                Err(e) => return self.refuse_auth(e.to_string()).await,
            }
        }
        self.connected = true;
        // What one ledger entry holds, less the frame padding the message
        // metadata may use: a client keeps its payloads within this, so a
        // `message_bytes_max` above the storage bound is not advertised.
        let storage_max = self
            .state
            .client
            .entry_payload_bytes_max()
            .saturating_sub(crate::config::FRAME_PADDING_BYTES);
        let max =
            i32::try_from(self.state.config.message_bytes_max.min(storage_max)).unwrap_or(i32::MAX);
        debug!(
            client_version = %c.client_version,
            protocol_version = self.protocol_version,
            "connected"
        );
        self.send(commands::connected(
            SERVER_VERSION,
            self.protocol_version,
            max,
        ))
        .await;
        Ok(())
    }

    /// ERROR `AuthenticationError` (request id 0) and close this connection.
    async fn refuse_auth(&self, reason: String) -> Result<(), CloseReason> {
        self.send_error(0, (ServerError::AuthenticationError, reason.clone()))
            .await;
        Err(CloseReason::AuthFailed(reason))
    }

    /// On a tick: challenge an expired token, close when unanswered.
    fn check_auth_expiry(&mut self) -> Result<(), CloseReason> {
        let Some(auth) = self.state.auth.as_ref() else {
            return Ok(());
        };
        if !self.connected || !auth.expired(self.auth_exp, crate::auth::now_s()) {
            return Ok(());
        }
        let timeout = Duration::from_secs(self.state.config.auth_refresh_timeout_s);
        match self.challenged_at {
            None => {
                let challenge = BaseCommand {
                    r#type: Type::AuthChallenge as i32,
                    auth_challenge: Some(cms_client::proto::pulsar::CommandAuthChallenge {
                        server_version: Some(SERVER_VERSION.to_string()),
                        challenge: Some(cms_client::proto::pulsar::AuthData {
                            auth_method_name: Some(crate::auth::TOKEN_METHOD.to_string()),
                            auth_data: Some(Bytes::from_static(b"refresh")),
                        }),
                        protocol_version: Some(self.protocol_version),
                    }),
                    ..Default::default()
                };
                let _ = self.out.try_send(Frame::from(challenge));
                self.challenged_at = Some(Instant::now());
                debug!("token expired: AUTH_CHALLENGE sent");
                Ok(())
            }
            Some(at) if at.elapsed() >= timeout => Err(CloseReason::AuthFailed(format!(
                "token expired and no valid AUTH_RESPONSE within {} s",
                timeout.as_secs()
            ))),
            Some(_) => Ok(()),
        }
    }

    /// AUTH_RESPONSE: a refreshed token for the same role.
    async fn on_auth_response(&mut self, cmd: &BaseCommand) -> Result<(), CloseReason> {
        let c = cmd
            .auth_response
            .as_ref()
            .ok_or_else(|| missing("AUTH_RESPONSE"))?;
        let Some(auth) = self.state.auth.clone() else {
            self.send_error(
                0,
                (
                    ServerError::NotAllowedError,
                    "authentication is not enabled on this broker".into(),
                ),
            )
            .await;
            return Ok(());
        };
        let token = c
            .response
            .as_ref()
            .and_then(|r| r.auth_data.as_deref())
            .unwrap_or_default();
        match auth.authenticate(&String::from_utf8_lossy(token)) {
            Ok(id) if Some(&id.role) == self.role.as_ref() => {
                self.auth_exp = id.exp;
                self.challenged_at = None;
                debug!("token refreshed");
                Ok(())
            }
            Ok(id) => {
                self.refuse_auth(format!(
                    "refreshed token is for role {}, the connection's is {}",
                    id.role,
                    self.role.as_deref().unwrap_or("")
                ))
                .await
            }
            Err(e) => self.refuse_auth(e.to_string()).await,
        }
    }

    /// Authorizes a command for this connection's role; Err(the answer).
    async fn authorize(&self, ty: Type, cmd: &BaseCommand) -> Result<(), BaseCommand> {
        use crate::auth::{NamespaceOp, TopicOp};
        let (Some(auth), Some(role)) = (self.state.auth.clone(), self.role.as_deref()) else {
            return Ok(());
        };
        let topic_op = match ty {
            Type::Lookup => cmd
                .lookup_topic
                .as_ref()
                .map(|c| (c.topic.as_str(), TopicOp::Lookup)),
            Type::PartitionedMetadata => cmd
                .partition_metadata
                .as_ref()
                .map(|c| (c.topic.as_str(), TopicOp::Lookup)),
            Type::Producer => cmd
                .producer
                .as_ref()
                .map(|c| (c.topic.as_str(), TopicOp::Produce)),
            Type::Subscribe => cmd.subscribe.as_ref().map(|c| {
                (
                    c.topic.as_str(),
                    TopicOp::Consume {
                        subscription: Some(c.subscription.clone()),
                    },
                )
            }),
            Type::GetSchema => cmd
                .get_schema
                .as_ref()
                .map(|c| (c.topic.as_str(), TopicOp::Lookup)),
            Type::GetOrCreateSchema => cmd
                .get_or_create_schema
                .as_ref()
                .map(|c| (c.topic.as_str(), TopicOp::Produce)),
            _ => None,
        };
        let request_id = request_id_of(cmd);
        let result = if let Some((topic, op)) = topic_op {
            match TopicName::parse(topic) {
                Ok(name) => crate::auth::check_topic(&self.state, &auth, role, &name, &op)
                    .await
                    .map_err(|m| (ServerError::AuthorizationError, m)),
                Err(e) => Err((ServerError::InvalidTopicName, e.to_string())),
            }
        } else if ty == Type::GetTopicsOfNamespace
            && let Some(c) = cmd.get_topics_of_namespace.as_ref()
        {
            match c.namespace.split_once('/') {
                Some((tenant, ns)) if !ns.contains('/') => crate::auth::check_namespace(
                    &self.state,
                    &auth,
                    role,
                    tenant,
                    ns,
                    NamespaceOp::ListTopics,
                )
                .await
                .map_err(|m| (ServerError::AuthorizationError, m)),
                _ => Err((
                    ServerError::MetadataError,
                    format!("bad namespace name {:?}", c.namespace),
                )),
            }
        } else {
            Ok(())
        };
        let Err((code, msg)) = result else {
            return Ok(());
        };
        if code == ServerError::AuthorizationError {
            info!(role = %role, command = commands::command_name(cmd), reason = %msg, "denied");
        }
        Err(match ty {
            Type::Lookup => commands::lookup_response_failed(request_id, code, msg),
            Type::PartitionedMetadata => {
                commands::partitioned_metadata_failed(request_id, code, msg)
            }
            _ => commands::error(request_id, code, msg),
        })
    }

    /// Answers a LOOKUP in its own task (it may wait for a dead owner's
    /// session to expire, and must not stall this connection's publishes);
    /// at most [`LOOKUPS_PER_CONNECTION_MAX`] at once, beyond that
    /// TooManyRequests (the client retries).
    async fn on_lookup(&self, c: &CommandLookupTopic) {
        let Ok(permit) = self.lookup_permits.clone().try_acquire_owned() else {
            self.send(commands::lookup_response_failed(
                c.request_id,
                ServerError::TooManyRequests,
                format!(
                    "more than {LOOKUPS_PER_CONNECTION_MAX} lookups in flight on this connection"
                ),
            ))
            .await;
            return;
        };
        let state = self.state.clone();
        let out = self.out.clone();
        let c = c.clone();
        tokio::spawn(async move {
            let reply = lookup_reply(&state, &c).await;
            let _ = out.send(Frame::from(reply)).await;
            drop(permit);
        });
    }

    async fn on_partitioned_metadata(&self, c: &CommandPartitionedTopicMetadata) {
        let count = match TopicName::parse(&c.topic) {
            Ok(name) => {
                let ctx = self.state.topics.context();
                let cfg = &self.state.config;
                // `metadata_auto_creation_enabled=false` (PIP-344): never create here.
                let broker_auto = crate::tenancy::AutoCreation {
                    allowed: cfg.allow_auto_topic_creation,
                    topic_type: cfg.allow_auto_topic_creation_type,
                    partitions: cfg.default_num_partitions,
                };
                crate::topic_discovery::partition_count(
                    &*ctx.store,
                    &ctx.layout,
                    &name,
                    broker_auto,
                    c.metadata_auto_creation_enabled.unwrap_or(true),
                )
                .await
            }
            Err(e) => Err((ServerError::InvalidTopicName, e.to_string())),
        };
        match count {
            Ok(n) => {
                self.send(commands::partitioned_metadata_response(c.request_id, n))
                    .await
            }
            Err((code, msg)) => {
                self.send(commands::partitioned_metadata_failed(
                    c.request_id,
                    code,
                    msg,
                ))
                .await
            }
        }
    }

    async fn on_get_topics_of_namespace(
        &self,
        c: &cms_client::proto::pulsar::CommandGetTopicsOfNamespace,
    ) {
        let ctx = self.state.topics.context();
        let np_in_use = self.state.topics.non_persistent().names();
        let r = crate::topic_discovery::topics_of_namespace_with(
            &*ctx.store,
            &ctx.layout,
            &c.namespace,
            crate::topic_discovery::ListMode::from_wire(c.mode),
            c.topics_pattern.as_deref(),
            c.topics_hash.as_deref(),
            &np_in_use,
        )
        .await;
        match r {
            Ok(list) => {
                let mut out = commands::get_topics_of_namespace_response(c.request_id, list.topics);
                if let Some(resp) = out.get_topics_of_namespace_response.as_mut() {
                    resp.filtered = Some(list.filtered);
                    resp.topics_hash = Some(list.hash);
                    resp.changed = Some(list.changed);
                }
                self.send(out).await
            }
            Err(e) => self.send_error(c.request_id, e).await,
        }
    }

    /// Parses a topic name and checks its namespace exists.
    pub async fn check_topic(&self, topic: &str) -> Result<TopicName, ErrorReply> {
        check_topic_name(&self.state, topic).await
    }

    /// Loads (or finds) a topic for a request, bounded in time.
    pub async fn load_topic(&self, topic: &str, create: bool) -> Result<Arc<Topic>, ErrorReply> {
        let name =
            TopicName::parse(topic).map_err(|e| (ServerError::InvalidTopicName, e.to_string()))?;
        {
            let ctx = self.state.topics.context();
            crate::topic_discovery::check_use(&*ctx.store, &ctx.layout, &name).await?;
        }
        // Only the bundle's owner serves a topic (invariant 5); the client
        // looks the topic up again on ServiceNotReady.
        let owned = || async {
            self.state
                .ownership
                .check_owned(&name)
                .await
                .map_err(|m| (ServerError::ServiceNotReady, m))
        };
        // (`get_or_load` checks ownership before loading as well.)
        let load = self.state.topics.get_or_load(&name, create);
        match tokio::time::timeout(Duration::from_millis(TOPIC_LOAD_TIMEOUT_MS), load).await {
            Ok(Ok(t)) => {
                // Ownership may have been lost while the topic loaded.
                if let Err(e) = owned().await {
                    self.state.topics.unload(&t, "bundle not owned").await;
                    return Err(e);
                }
                Ok(t)
            }
            Ok(Err(e)) => Err(topic_error_reply(&e)),
            Err(_) => Err((
                ServerError::ServiceNotReady,
                format!("loading topic {name} took longer than {TOPIC_LOAD_TIMEOUT_MS} ms"),
            )),
        }
    }

    async fn on_producer(&mut self, c: &CommandProducer) {
        if crate::non_persistent::conn::is_non_persistent(&c.topic)
            || self.np.has_producer(c.producer_id)
        {
            crate::non_persistent::conn::on_producer(self, c).await;
            return;
        }
        if let Some(existing) = self.producers.get(&c.producer_id) {
            // A retry of a request that already succeeded (G8).
            if existing.topic.name.to_string()
                == TopicName::parse(&c.topic)
                    .map(|t| t.to_string())
                    .unwrap_or_default()
                && existing.ready.load(Ordering::Acquire)
            {
                let name = existing.name.clone();
                let schema_version = existing.schema_version.clone();
                self.send(with_schema_version(
                    commands::producer_success(c.request_id, &name, -1, true, None),
                    &schema_version,
                ))
                .await;
            } else {
                self.send_error(
                    c.request_id,
                    (
                        ServerError::ProducerBusy,
                        format!("producer id {} is already in use", c.producer_id),
                    ),
                )
                .await;
            }
            return;
        }
        if self.handles() >= self.state.config.handles_per_connection_max {
            self.send_error(
                c.request_id,
                (
                    ServerError::NotAllowedError,
                    format!(
                        "connection reached {} producers and consumers",
                        self.state.config.handles_per_connection_max
                    ),
                ),
            )
            .await;
            return;
        }
        let mode = match c.producer_access_mode.map(ProducerAccessMode::try_from) {
            None | Some(Ok(ProducerAccessMode::Shared)) => AccessMode::Shared,
            Some(Ok(ProducerAccessMode::Exclusive)) => AccessMode::Exclusive,
            Some(Ok(ProducerAccessMode::WaitForExclusive)) => AccessMode::WaitForExclusive,
            Some(other) => {
                self.send_error(
                    c.request_id,
                    (
                        ServerError::NotAllowedError,
                        format!("producer access mode {other:?} is not supported"),
                    ),
                )
                .await;
                return;
            }
        };
        let topic = match self.load_topic(&c.topic, true).await {
            Ok(t) => t,
            Err(e) => {
                self.send_error(c.request_id, e).await;
                return;
            }
        };
        let schema_version =
            match crate::schema::wire::producer_schema(&self.state, &topic.name, c.schema.as_ref())
                .await
            {
                Ok(v) => v,
                Err(e) => {
                    self.send_error(c.request_id, e).await;
                    return;
                }
            };
        let quota = match self
            .state
            .quota
            .admit(
                self.id,
                &topic.name,
                crate::quota_io::Kind::Producer,
                topic.producers_connected().len() as u64,
                None,
            )
            .await
        {
            Ok(a) => a,
            Err(e) => {
                info!(tenant = %topic.name.tenant, namespace = %topic.name.namespace, topic = %topic.name, reason = %e.1, "producer refused by a quota");
                self.state.metrics.quota_refusals.inc();
                self.send_error(c.request_id, e).await;
                return;
            }
        };
        let buckets = self.state.quota.buckets_for(&topic.name).await;
        let name = match c.producer_name.as_deref() {
            Some(n) if !n.is_empty() && c.user_provided_producer_name.unwrap_or(true) => {
                n.to_string()
            }
            Some(n) if !n.is_empty() => n.to_string(),
            _ => self.state.next_producer_name(),
        };
        let key = (self.id, c.producer_id);
        let admission = topic.add_producer(ProducerRequest {
            key,
            name: name.clone(),
            mode,
            topic_epoch: c.topic_epoch,
        });
        let generation = self.next_generation();
        let ready = Arc::new(AtomicBool::new(false));
        match admission {
            Err(ProducerRefusal::Busy(m)) => {
                self.send_error(c.request_id, (ServerError::ProducerBusy, m))
                    .await;
                return;
            }
            Err(ProducerRefusal::Fenced(m)) => {
                self.send_error(c.request_id, (ServerError::ProducerFenced, m))
                    .await;
                return;
            }
            // Retryable: the client creates the producer again, on the topic
            // loaded with the new settings.
            Err(ProducerRefusal::Unloading(m)) => {
                self.send_error(c.request_id, (ServerError::ServiceNotReady, m))
                    .await;
                return;
            }
            Ok(ProducerAdmission::Ready(g)) => {
                if let Some(epoch) = g.topic_epoch
                    && let Err(e) = topic.store_topic_epoch(epoch).await
                {
                    warn!(topic = %topic.name, producer = %g.name, epoch, error = %e, "storing the topic epoch failed; producer refused");
                    topic.remove_producer(key);
                    self.send_error(c.request_id, topic_error_reply(&e.into()))
                        .await;
                    return;
                }
                ready.store(true, Ordering::Release);
                self.send(with_schema_version(
                    commands::producer_success(
                        c.request_id,
                        &g.name,
                        last_sequence_id(&topic, &g.name),
                        true,
                        g.topic_epoch,
                    ),
                    &schema_version,
                ))
                .await;
            }
            Ok(ProducerAdmission::Waiting(rx)) => {
                self.send(commands::producer_success(
                    c.request_id,
                    &name,
                    -1,
                    false,
                    None,
                ))
                .await;
                let out = self.out.clone();
                let ready = ready.clone();
                let request_id = c.request_id;
                let t = topic.clone();
                let schema_version = schema_version.clone();
                let events = self.events_tx.clone();
                let producer_id = c.producer_id;
                tokio::spawn(
                    async move {
                        if let Ok(g) = rx.await {
                            if let Some(epoch) = g.topic_epoch
                                && let Err(e) = t.store_topic_epoch(epoch).await
                            {
                                // The client re-creates the producer after
                                // CLOSE_PRODUCER and waits again.
                                warn!(topic = %t.name, producer = %g.name, epoch, error = %e, "storing the topic epoch failed; producer closed");
                                let _ = events
                                    .send(ConnEvent::ProducerClosed {
                                        producer_id,
                                        generation,
                                    })
                                    .await;
                                return;
                            }
                            ready.store(true, Ordering::Release);
                            let _ = out
                                .send(Frame::from(with_schema_version(
                                    commands::producer_success(
                                        request_id,
                                        &g.name,
                                        last_sequence_id(&t, &g.name),
                                        true,
                                        g.topic_epoch,
                                    ),
                                    &schema_version,
                                )))
                                .await;
                        }
                    }
                    .in_current_span(),
                );
            }
        }
        let (sends_tx, sends_rx) = mpsc::channel(
            self.state
                .config
                .pending_publishes_per_connection_max
                .max(1),
        );
        let (done_tx, done_rx) = mpsc::channel(
            self.state
                .config
                .pending_publishes_per_connection_max
                .max(1),
        );
        let span = info_span!(
            "producer",
            tenant = %topic.name.tenant,
            namespace = %topic.name.namespace,
            topic = %topic.name,
            producer = %name,
            producer_id = c.producer_id
        );
        tokio::spawn(
            append_task(topic.clone(), name.clone(), sends_rx, done_tx).instrument(span.clone()),
        );
        tokio::spawn(
            receipt_task(
                self.state.clone(),
                topic.clone(),
                ReceiptFor {
                    name: name.clone(),
                    producer_id: c.producer_id,
                    generation,
                },
                done_rx,
                self.out.clone(),
                self.events_tx.clone(),
            )
            .instrument(span),
        );
        self.state.metrics.producers.inc();
        info!(topic = %topic.name, producer = %name, producer_id = c.producer_id, "producer created");
        self.producers.insert(
            c.producer_id,
            ProducerEntry {
                topic,
                name,
                generation,
                ready,
                sends: sends_tx,
                schema_version,
                _quota: quota,
                buckets,
            },
        );
    }

    fn on_send(&mut self, producer_id: u64, item: SendItem) {
        let Some(p) = self.producers.get(&producer_id) else {
            // Raced with a close (ours or the broker's): the client resends
            // after re-creating the producer; no receipt for this one.
            debug!(producer_id, "SEND for an unknown producer ignored");
            return;
        };
        if !p.ready.load(Ordering::Acquire) {
            debug!(producer_id, "SEND before the producer is ready ignored");
            return;
        }
        self.state.metrics.messages_in.inc_by(item.num_messages);
        p.topic.counters.record_in(
            item.num_messages,
            u64::try_from(item.entry.len()).unwrap_or(u64::MAX),
        );
        let charges = self.state.quota.on_publish(
            &p.topic.name,
            &p.buckets,
            item.num_messages,
            u64::try_from(item.entry.len()).unwrap_or(u64::MAX),
        );
        self.owed.extend(charges);
        if self.state.quota.is_held(&p.topic) {
            self.held = Some(p.topic.clone());
        }
        self.state
            .metrics
            .bytes_in
            .inc_by(u64::try_from(item.entry.len()).unwrap_or(u64::MAX));
        // The channel holds as many items as there are publish permits, so
        // this never waits; a full or closed channel means the producer's
        // tasks ended (its topic failed) and the close is on its way.
        if p.sends.try_send(item).is_err() {
            debug!(producer_id, "SEND for a closing producer ignored");
        }
    }

    fn remove_producer(&mut self, producer_id: u64) {
        if let Some(p) = self.producers.remove(&producer_id) {
            p.topic.remove_producer((self.id, producer_id));
            self.state.metrics.producers.dec();
            debug!(producer_id, "producer closed");
        }
    }

    async fn on_event(&mut self, ev: ConnEvent) {
        match ev {
            ConnEvent::ProducerClosed {
                producer_id,
                generation,
            } => {
                if self
                    .producers
                    .get(&producer_id)
                    .is_some_and(|p| p.generation == generation)
                {
                    self.remove_producer(producer_id);
                    self.send(commands::close_producer(producer_id, 0)).await;
                }
            }
            ConnEvent::ConsumerClosed {
                consumer_id,
                generation,
            } => crate::consumers::on_closed_by_broker(self, consumer_id, generation).await,
        }
    }

    async fn cleanup(&mut self) {
        let ids: Vec<u64> = self.producers.keys().copied().collect();
        for id in ids {
            self.remove_producer(id);
        }
        crate::consumers::remove_all(self).await;
    }
}

/// SEND_RECEIPT for `item` at (`ledger_id`, `entry_id`), echoing its
/// sequence ids (G4).
fn receipt(producer_id: u64, item: &SendItem, ledger_id: u64, entry_id: u64) -> BaseCommand {
    let mut cmd = commands::send_receipt(producer_id, item.sequence_id, ledger_id, entry_id);
    if let Some(r) = cmd.send_receipt.as_mut() {
        r.highest_sequence_id = item.highest_sequence_id;
    }
    cmd
}

/// PRODUCER_SUCCESS's `last_sequence_id`: the last persisted id of the
/// producer name with de-duplication on, else −1 (G5).
fn last_sequence_id(topic: &Topic, name: &str) -> i64 {
    topic.dedup.as_ref().map_or(-1, |d| d.last_persisted(name))
}

async fn append_task(
    topic: Arc<Topic>,
    name: String,
    mut sends: mpsc::Receiver<SendItem>,
    done: mpsc::Sender<Pending>,
) {
    while let Some(item) = sends.recv().await {
        let pending = match item.checksum {
            ChecksumState::Mismatch => Pending::Refused(
                item,
                ServerError::ChecksumError,
                "checksum of the payload does not match".into(),
            ),
            ChecksumState::Valid | ChecksumState::Absent => {
                let id = effective_id(item.sequence_id, item.highest_sequence_id);
                let decision = topic.dedup.as_ref().map(|d| d.check(&name, id));
                match decision {
                    Some(Decision::Duplicate) => Pending::Duplicate(item),
                    Some(Decision::WaitForOriginal) => Pending::WaitForOriginal(item, id),
                    None | Some(Decision::Store { .. }) => {
                        match topic.ml.append_pipelined(item.entry.clone()).await {
                            Ok(p) => Pending::Append(item, p),
                            // Only this message: the topic and the producer stay.
                            Err(e @ MlError::EntryTooLarge { .. }) => {
                                if let (Some(d), Some(Decision::Store { prev_pushed })) =
                                    (&topic.dedup, decision)
                                {
                                    d.unpush(&name, id, prev_pushed);
                                }
                                Pending::Refused(item, ServerError::NotAllowedError, e.to_string())
                            }
                            Err(e) => {
                                if let Some(d) = &topic.dedup {
                                    d.failed(&name);
                                }
                                Pending::Failed(item, e.to_string())
                            }
                        }
                    }
                }
            }
        };
        let failed = matches!(pending, Pending::Failed(..));
        if done.send(pending).await.is_err() || failed {
            return;
        }
    }
}

/// Who a receipt task answers for.
struct ReceiptFor {
    /// Producer name (de-duplication key).
    name: String,
    producer_id: u64,
    generation: u64,
}

async fn receipt_task(
    state: Arc<BrokerState>,
    topic: Arc<Topic>,
    who: ReceiptFor,
    mut done: mpsc::Receiver<Pending>,
    out: Outbound,
    events: mpsc::Sender<ConnEvent>,
) {
    let ReceiptFor {
        name,
        producer_id,
        generation,
    } = who;
    let mut closing = topic.closing();
    // One future for the task's life (see `serve`'s shutdown).
    let closing = wait_true(&mut closing);
    tokio::pin!(closing);
    // Once the connection is gone nothing is sent, but the outcome of every
    // append still in flight is recorded for de-duplication (a resend on a
    // new connection waits for it).
    let mut gone = false;
    let failure = loop {
        let next = tokio::select! {
            n = done.recv() => n,
            _ = &mut closing => break Some("topic unloaded".to_string()),
        };
        let Some(pending) = next else {
            // The producer was closed by the client: nothing more to do.
            return;
        };
        let cmd = match pending {
            Pending::Append(item, p) => match p.wait().await {
                Ok(pos) => {
                    if let Some(d) = &topic.dedup {
                        d.persisted(
                            &name,
                            effective_id(item.sequence_id, item.highest_sequence_id),
                        );
                    }
                    state
                        .metrics
                        .publish_latency
                        .observe(item.received.elapsed().as_secs_f64());
                    receipt(
                        producer_id,
                        &item,
                        pos.ledger_id,
                        // Entry ids of stored entries are never negative.
                        u64::try_from(pos.entry_id).unwrap_or(0),
                    )
                }
                Err(e) => {
                    if let Some(d) = &topic.dedup {
                        d.failed(&name);
                    }
                    break Some(e.to_string());
                }
            },
            // Pulsar acknowledges duplicates with message id (-1, -1).
            Pending::Duplicate(item) => receipt(producer_id, &item, u64::MAX, u64::MAX),
            Pending::WaitForOriginal(item, id) => {
                let Some(d) = &topic.dedup else {
                    break Some("de-duplication turned off".to_string());
                };
                let durable = tokio::select! {
                    ok = d.wait_for_original(&name, id) => ok,
                    _ = &mut closing => break Some("topic unloaded".to_string()),
                };
                if durable {
                    receipt(producer_id, &item, u64::MAX, u64::MAX)
                } else {
                    // The client resends it after re-creating the producer.
                    commands::send_error(
                        producer_id,
                        item.sequence_id,
                        ServerError::PersistenceError,
                        "the original of this possible duplicate was not persisted",
                    )
                }
            }
            Pending::Refused(item, code, message) => {
                commands::send_error(producer_id, item.sequence_id, code, message)
            }
            Pending::Failed(item, e) => {
                drop(item);
                break Some(e);
            }
        };
        if !gone && out.send(Frame::from(cmd)).await.is_err() {
            gone = true;
        }
    };
    if let Some(why) = failure {
        // No receipt for anything pending: the client resends it after it
        // re-creates the producer (G13).
        warn!(producer_id, reason = %why, "closing the producer");
        if topic.ml.terminal_error().is_some() && !topic.is_closing() {
            let topics = state.topics.clone();
            let t = topic.clone();
            tokio::spawn(async move { topics.unload(&t, "managed ledger failed").await });
        }
        let _ = events
            .send(ConnEvent::ProducerClosed {
                producer_id,
                generation,
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::task::{Context, Poll};

    use super::*;

    /// Records the size of every write the connection's writer makes.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<usize>>>);

    impl tokio::io::AsyncWrite for Writes {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.0.lock().unwrap().push(buf.len());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A connection writer on a fresh queue, writing into a recorder.
    fn spawn_writer() -> (Writes, mpsc::Sender<Frame>, tokio::task::JoinHandle<()>) {
        let writes = Writes::default();
        let (out, rx) = mpsc::channel::<Frame>(16);
        let writer = tokio::spawn(write_frames(
            FramedWrite::new(writes.clone(), PulsarCodec::new(1 << 20)),
            rx,
        ));
        (writes, out, writer)
    }

    fn frame_len(cmd: BaseCommand) -> usize {
        let mut buf = bytes::BytesMut::new();
        tokio_util::codec::Encoder::encode(
            &mut PulsarCodec::new(1 << 20),
            Frame::from(cmd),
            &mut buf,
        )
        .unwrap();
        buf.len()
    }

    /// Two tasks woken together by a third (an entry's receipt and its
    /// dispatch, woken by the managed ledger's completion) each queue a
    /// frame: they leave in one write, not in two. On the
    /// broker's runtime (multi-thread) the last task woken runs next, so the
    /// first frame wakes the writer ahead of the other task: without the
    /// writer's yield that is two writes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn frames_queued_by_tasks_woken_together_leave_in_one_write() {
        let (writes, out, writer) = spawn_writer();
        let (go_tx, go_rx) = tokio::sync::watch::channel(());
        let (ready_tx, mut ready_rx) = mpsc::channel::<()>(2);
        let mut tasks = Vec::new();
        for cmd in [commands::send_receipt(1, 7, 3, 9), commands::ping()] {
            let (out, mut go, ready) = (out.clone(), go_rx.clone(), ready_tx.clone());
            tasks.push(tokio::spawn(async move {
                let mut changed = std::pin::pin!(go.changed());
                // Registered as a waiter before the test is told it is.
                assert!(futures::poll!(&mut changed).is_pending());
                ready.send(()).await.unwrap();
                changed.await.unwrap();
                out.send(Frame::from(cmd)).await.unwrap();
            }));
        }
        for _ in 0..2 {
            ready_rx.recv().await.unwrap();
        }
        // Wake both at once from a task on the runtime's worker, as the
        // completion task does.
        tokio::spawn(async move { go_tx.send(()).unwrap() })
            .await
            .unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        drop(out);
        writer.await.unwrap();
        let expected = frame_len(commands::send_receipt(1, 7, 3, 9)) + frame_len(commands::ping());
        assert_eq!(*writes.0.lock().unwrap(), vec![expected]);
    }

    /// A lone frame is written without waiting for another one.
    #[tokio::test(flavor = "current_thread")]
    async fn a_lone_frame_is_written_at_once() {
        let (writes, out, writer) = spawn_writer();
        out.send(Frame::from(commands::ping())).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while writes.0.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the frame was never written");
            tokio::task::yield_now().await;
        }
        assert_eq!(*writes.0.lock().unwrap(), vec![frame_len(commands::ping())]);
        drop(out);
        writer.await.unwrap();
    }
}
