//! [`Consumer`]: receives messages through a subscription: of one topic, of
//! a partitioned topic (one inner subscription per partition), of a list of
//! topics ([`Client::consumer_topics`]) or of every topic of a namespace
//! matching a pattern ([`Client::consumer_pattern`], rediscovered
//! periodically). Each received [`Message`] carries its topic, and its id
//! remembers which inner subscription delivered it, so ack, negative ack and
//! `reconsume_later` go to the right one.
//!
//! Retry-letter topic (Pulsar's `enableRetry` / `reconsumeLater`):
//! [`Consumer::reconsume_later`] republishes a message to the retry topic
//! (default `<topic>-<subscription>-RETRY`) with `deliver_after`, the
//! properties `RECONSUMETIMES`, `DELAY_TIME`, `REAL_TOPIC` and
//! `ORIGIN_MESSAGE_ID`, and acknowledges the original; the consumer also
//! subscribes to the retry topic. A message reconsumed more than the
//! dead-letter policy's maximum (default 16) goes to the DLQ instead.
//!
//! Flow control: the consumer grants `receiver_queue_size` permits on
//! (re)subscribe and grants more as the application takes messages (half a
//! queue at a time), so at most a queue's worth of messages is buffered.
//! Batches are unpacked and decompressed on receipt; a batch entry is
//! acknowledged once all its messages are. When the connection drops the
//! consumer re-subscribes with backoff; messages buffered but not yet handed
//! out are dropped then (the broker redelivers them).
//!
//! Acknowledgements are grouped as in Pulsar's clients
//! ([`ConsumerBuilder::ack_group_time`], default 100 ms / 1,000 acks): one
//! ACK command carries a group. Queued acks are sent before a re-subscribe's
//! FLOW (so the broker does not send those messages again) and before a
//! close; acks queued when the process dies are lost and their messages come
//! again (at-least-once).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc;

use super::backoff::Backoff;
use super::client::Client;
use super::connection::{Connection, ConsumerSink};
use super::error::{Error, Result};
use super::message::{Message, MessageId, ProducerMessage, Route, unpack};
use super::pattern::{Pattern, PatternMode, partition_of};
use super::producer::Producer;
use crate::proto::commands;
use crate::proto::frame::{Frame, PayloadFrame, parse_entry};
use crate::proto::pulsar::MessageIdData;
use crate::proto::pulsar::command_ack::AckType;
use crate::proto::pulsar::command_subscribe::{InitialPosition, SubType};

#[derive(Debug, Clone)]
struct Options {
    sub_type: SubType,
    initial_position: InitialPosition,
    receiver_queue: u32,
    name: Option<String>,
    nack_delay: Duration,
    ack_timeout: Option<Duration>,
    /// Individual acks are sent in groups: at most this long after the
    /// first of a group (zero: each at once).
    ack_group_time: Duration,
    /// ... or as soon as this many are collected.
    ack_group_max: usize,
    /// Dead-letter policy: (max redeliveries, DLQ topic).
    dead_letter: Option<(u32, Option<String>)>,
    /// Readers: a non-durable cursor starting at `start`.
    reader: bool,
    /// Retry-letter topic: `Some(None)` = on, with the default name.
    retry: Option<Option<String>>,
    /// Pattern consumers: topics mode and rediscovery period.
    pattern_mode: PatternMode,
    pattern_period: Duration,
    /// Most topics (partitions count one each) a consumer subscribes to.
    max_topics: usize,
}

/// Property names of Pulsar's retry-letter and dead-letter messages.
pub mod retry_props {
    /// How many times the message was reconsumed (1 on the first retry).
    pub const RECONSUMETIMES: &str = "RECONSUMETIMES";
    /// The delay asked for, in milliseconds.
    pub const DELAY_TIME: &str = "DELAY_TIME";
    /// The topic the message was first consumed from.
    pub const REAL_TOPIC: &str = "REAL_TOPIC";
    /// The message's id on that topic.
    pub const ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";
}

/// Pulsar's default for the most reconsumes before the DLQ when retry is
/// on and no dead-letter policy is set.
pub const RECONSUME_TIMES_MAX_DEFAULT: u32 = 16;

/// Default of [`ConsumerBuilder::ack_group_time`] (Pulsar's).
pub const ACK_GROUP_TIME_DEFAULT: Duration = Duration::from_millis(100);
/// Default of [`ConsumerBuilder::ack_group_max_size`] (Pulsar's).
pub const ACK_GROUP_MAX_DEFAULT: usize = 1000;
/// Upper bound of [`ConsumerBuilder::ack_group_max_size`]; also the most
/// acks kept queued while the consumer is disconnected (older ones are
/// dropped, so those messages come again).
pub const ACK_GROUP_MAX_LIMIT: usize = 100_000;

/// Default of [`ConsumerBuilder::max_topics`].
pub const MAX_TOPICS_DEFAULT: usize = 10_000;

/// Limits of [`Consumer::batch_receive`] (Pulsar's `BatchReceivePolicy`):
/// a batch ends at `max_messages` messages, at `max_bytes` bytes of payload
/// or when `timeout` has passed since the call, whichever comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchReceivePolicy {
    /// Most messages in one batch (at least 1).
    pub max_messages: usize,
    /// A batch ends once its payload bytes reach this.
    pub max_bytes: usize,
    /// Longest wait for a batch.
    pub timeout: Duration,
}

impl Default for BatchReceivePolicy {
    /// Pulsar's defaults for bytes and timeout (10 MiB, 100 ms), 100 messages.
    fn default() -> Self {
        BatchReceivePolicy {
            max_messages: 100,
            max_bytes: 10 * 1024 * 1024,
            timeout: Duration::from_millis(100),
        }
    }
}

/// Builds a [`Consumer`]; see [`Client::consumer`].
#[derive(Debug)]
pub struct ConsumerBuilder {
    client: Client,
    topic: String,
    /// More topics (multi-topic consumer).
    topics: Vec<String>,
    pattern: Option<String>,
    subscription: String,
    opts: Options,
}

impl Client {
    /// Starts building one consumer over several topics (Pulsar's
    /// `topics(...)`); a partitioned topic among them counts as its partitions.
    pub fn consumer_topics<I, S>(
        &self,
        topics: I,
        subscription: impl Into<String>,
    ) -> ConsumerBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ConsumerBuilder::new(self.clone(), String::new(), subscription.into()).topics(topics)
    }

    /// Starts building a consumer over every topic of a namespace matching
    /// `pattern` (`persistent://tenant/ns/<regex>`, Pulsar's
    /// `topicsPattern`); topics created or deleted later are picked up or
    /// dropped at each rediscovery (see
    /// [`ConsumerBuilder::pattern_auto_discovery_period`]).
    pub fn consumer_pattern(
        &self,
        pattern: impl Into<String>,
        subscription: impl Into<String>,
    ) -> ConsumerBuilder {
        ConsumerBuilder::new(self.clone(), String::new(), subscription.into())
            .topics_pattern(pattern)
    }
}

impl ConsumerBuilder {
    pub(crate) fn new(client: Client, topic: String, subscription: String) -> Self {
        ConsumerBuilder {
            client,
            topic,
            topics: Vec::new(),
            pattern: None,
            subscription,
            opts: Options {
                sub_type: SubType::Exclusive,
                initial_position: InitialPosition::Latest,
                receiver_queue: 1000,
                name: None,
                nack_delay: Duration::from_secs(1),
                ack_timeout: None,
                ack_group_time: ACK_GROUP_TIME_DEFAULT,
                ack_group_max: ACK_GROUP_MAX_DEFAULT,
                dead_letter: None,
                reader: false,
                retry: None,
                pattern_mode: PatternMode::Persistent,
                pattern_period: Duration::from_secs(60),
                max_topics: MAX_TOPICS_DEFAULT,
            },
        }
    }
    /// Subscription type (default Exclusive).
    pub fn sub_type(mut self, t: SubType) -> Self {
        self.opts.sub_type = t;
        self
    }
    /// Where a new subscription starts (default Latest).
    pub fn initial_position(mut self, p: InitialPosition) -> Self {
        self.opts.initial_position = p;
        self
    }
    /// Messages buffered ahead of the application (default 1000).
    pub fn receiver_queue_size(mut self, n: u32) -> Self {
        self.opts.receiver_queue = n.clamp(1, 100_000);
        self
    }
    /// Consumer name.
    pub fn name(mut self, n: impl Into<String>) -> Self {
        self.opts.name = Some(n.into());
        self
    }
    /// Delay before a negatively acknowledged message is redelivered (default 1 s).
    pub fn negative_ack_delay(mut self, d: Duration) -> Self {
        self.opts.nack_delay = d;
        self
    }

    /// Groups individual acknowledgements (Pulsar's
    /// `acknowledgmentGroupTime`): [`Consumer::ack`] queues the ack and
    /// returns, and the queued acks go to the broker in one command at most
    /// `d` after the first of them, or at once when
    /// [`ack_group_max_size`](Self::ack_group_max_size) are queued, and
    /// before the consumer closes or re-subscribes. Default 100 ms, as
    /// Pulsar's clients; zero sends each ack at once. An ack still queued
    /// when the process dies is lost, so its message comes again
    /// (at-least-once); an application that needs each ack on the wire
    /// before it goes on sets zero.
    pub fn ack_group_time(mut self, d: Duration) -> Self {
        self.opts.ack_group_time = d.min(Duration::from_secs(60));
        self
    }

    /// Most acks one group holds before it is sent (default 1,000, at least 1).
    pub fn ack_group_max_size(mut self, n: usize) -> Self {
        self.opts.ack_group_max = n.clamp(1, ACK_GROUP_MAX_LIMIT);
        self
    }

    /// Messages not acknowledged within `d` (at least 1 s) are redelivered.
    /// Default: never.
    pub fn ack_timeout(mut self, d: Duration) -> Self {
        self.opts.ack_timeout = Some(d.max(Duration::from_secs(1)));
        self
    }

    /// Dead-letter policy: a message delivered more than `max_redeliveries`
    /// times again is published to `topic` (default
    /// `<topic>-<subscription>-DLQ`) and acknowledged instead of handed out.
    /// This happens as the application receives (the message arrives, is
    /// dead-lettered, and `receive` waits for the next one).
    pub fn dead_letter(mut self, max_redeliveries: u32, topic: Option<String>) -> Self {
        self.opts.dead_letter = Some((max_redeliveries, topic));
        self
    }

    /// Adds topics: one consumer receives from all of them (Pulsar's
    /// `topics(...)`). Partitioned topics count as their partitions.
    pub fn topics<I, S>(mut self, topics: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.topics.extend(topics.into_iter().map(Into::into));
        self
    }

    /// Also subscribes to every topic of the pattern's namespace matching
    /// `pattern` (`[persistent://]tenant/namespace/<regex>`, full match).
    pub fn topics_pattern(mut self, pattern: impl Into<String>) -> Self {
        self.pattern = Some(pattern.into());
        self
    }

    /// Which topics a pattern considers (default persistent only).
    pub fn pattern_mode(mut self, m: PatternMode) -> Self {
        self.opts.pattern_mode = m;
        self
    }

    /// How often a pattern consumer lists its namespace again (default 60 s
    /// as Pulsar, at least 100 ms).
    pub fn pattern_auto_discovery_period(mut self, d: Duration) -> Self {
        self.opts.pattern_period = d.max(Duration::from_millis(100));
        self
    }

    /// Most topics (each partition counts) the consumer subscribes to
    /// (default [`MAX_TOPICS_DEFAULT`]). More at subscribe time is an error;
    /// more found by a pattern's rediscovery are left out (logged).
    pub fn max_topics(mut self, n: usize) -> Self {
        self.opts.max_topics = n.max(1);
        self
    }

    /// Enables the retry-letter topic with the default name
    /// `<topic>-<subscription>-RETRY` (Pulsar's `enableRetry`): see
    /// [`Consumer::reconsume_later`]. Delays need a Shared or Key_Shared
    /// subscription (the broker ignores them otherwise, as Pulsar).
    pub fn enable_retry(mut self, on: bool) -> Self {
        self.opts.retry = on.then_some(None);
        self
    }

    /// Enables the retry-letter topic under this name.
    pub fn retry_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.opts.retry = Some(Some(topic.into()));
        self
    }

    /// Subscribes.
    pub async fn subscribe(self) -> Result<Consumer> {
        self.subscribe_at(None).await
    }

    async fn subscribe_at(self, start: Option<MessageId>) -> Result<Consumer> {
        let ConsumerBuilder {
            client,
            topic,
            topics,
            pattern,
            subscription,
            mut opts,
        } = self;
        let mut list: Vec<String> = Vec::new();
        for t in std::iter::once(topic).chain(topics) {
            if !t.is_empty() && !list.contains(&t) {
                list.push(t);
            }
        }
        let mut discovery = None;
        if let Some(p) = pattern {
            let p = Pattern::parse(&p, opts.pattern_mode)?;
            let (found, hash) = Box::pin(p.list(&client, None)).await?;
            let found = found.unwrap_or_default();
            let first_named = list.len();
            for t in found {
                if !list.contains(&t) {
                    list.push(t);
                }
            }
            discovery = Some(Discovery {
                pattern: Arc::new(p),
                hash,
                period: opts.pattern_period,
                pending: Mutex::new(None),
                first_discovered: first_named,
            });
        }
        // Retry and dead-letter topics are named after the first named topic
        // (Pulsar's topicFirst); a pattern alone names them in its namespace.
        let named = discovery
            .as_ref()
            .map_or(list.len(), |d| d.first_discovered);
        let first = match (list.first(), &discovery) {
            (Some(t), _) if named > 0 => format!("{t}-{subscription}"),
            (_, Some(d)) => format!("persistent://{}/{subscription}", d.pattern.namespace),
            _ => {
                return Err(Error::Unsupported(
                    "a consumer needs a topic, a list of topics or a pattern".into(),
                ));
            }
        };
        let retry_topic = opts
            .retry
            .clone()
            .map(|t| t.unwrap_or_else(|| format!("{first}-RETRY")));
        if retry_topic.is_some() && opts.dead_letter.is_none() {
            opts.dead_letter = Some((RECONSUME_TIMES_MAX_DEFAULT, None));
        }
        let dlq = match &opts.dead_letter {
            Some((max, t)) => {
                let t = t.clone().unwrap_or_else(|| format!("{first}-DLQ"));
                // Boxed: keeps the subscribe future small.
                Some((*max, Box::pin(client.producer(t).create()).await?))
            }
            None => None,
        };
        let retry = match &retry_topic {
            Some(t) => {
                if !list.contains(t) {
                    list.push(t.clone());
                }
                Some(Box::pin(client.producer(t.clone()).create()).await?)
            }
            None => None,
        };
        // Partitioned topics become their partitions.
        let mut names: Vec<(String, i32, bool)> = Vec::new();
        let discovered_from = discovery
            .as_ref()
            .map_or(usize::MAX, |d| d.first_discovered);
        for (k, t) in list.iter().enumerate() {
            let discovered = k >= discovered_from && Some(t) != retry_topic.as_ref();
            let n = if discovered {
                0
            } else {
                client.partitions(t).await?
            };
            if n > 0 && opts.reader {
                return Err(Error::Unsupported(format!(
                    "readers of partitioned topics ({t} has {n} partitions)"
                )));
            }
            if n == 0 {
                names.push((t.clone(), partition_of(t), discovered));
            } else {
                names.extend((0..n).map(|i| (format!("{t}-partition-{i}"), i as i32, false)));
            }
            if names.len() > opts.max_topics {
                return Err(Error::Unsupported(format!(
                    "more than {} topics (max_topics)",
                    opts.max_topics
                )));
            }
        }
        if opts.reader && names.len() != 1 {
            return Err(Error::Unsupported(
                "a reader reads exactly one topic".into(),
            ));
        }
        let parts_n = names.len();
        let slots = if discovery.is_some() {
            opts.max_topics
        } else {
            parts_n.max(1)
        };
        let (tx, rx) = mpsc::channel((opts.receiver_queue as usize + 64).saturating_mul(slots));
        let proto = PartProto {
            client: client.clone(),
            subscription: subscription.clone(),
            opts: opts.clone(),
            tx,
        };
        let mut parts: Vec<Arc<Shared>> = Vec::with_capacity(parts_n);
        for (index, (part_topic, partition, discovered)) in names.into_iter().enumerate() {
            let shared = proto.part(part_topic, index, partition, discovered, start);
            if let Err(e) = Box::pin(shared.clone().subscribe_once()).await {
                for p in &parts {
                    let _ = close_part(p).await;
                }
                return Err(e);
            }
            if let Some(timeout) = shared.opts.ack_timeout {
                tokio::spawn(ack_timer(Arc::downgrade(&shared), timeout));
            }
            parts.push(shared);
        }
        Ok(Consumer {
            topic: list.first().cloned().unwrap_or_default(),
            dlq,
            retry,
            rx,
            local: VecDeque::new(),
            delivered: vec![0; parts_n],
            flow_epoch: vec![0; parts_n],
            parts,
            proto,
            discovery,
            closed: AtomicBool::new(false),
        })
    }
}

/// What every inner subscription of a consumer shares (to create new ones
/// when a pattern finds a topic).
struct PartProto {
    client: Client,
    subscription: String,
    opts: Options,
    tx: mpsc::Sender<(usize, u64, PayloadFrame)>,
}

impl PartProto {
    fn part(
        &self,
        topic: String,
        index: usize,
        partition: i32,
        discovered: bool,
        start: Option<MessageId>,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            id: self.client.next_id(),
            client: self.client.clone(),
            topic,
            index,
            partition,
            discovered,
            retired: AtomicBool::new(false),
            subscription: self.subscription.clone(),
            opts: self.opts.clone(),
            closed: AtomicBool::new(false),
            reconnecting: AtomicBool::new(false),
            conn: Mutex::new(None),
            epoch: AtomicU64::new(0),
            generations: AtomicU64::new(0),
            tx: self.tx.clone(),
            batches: Mutex::new(HashMap::new()),
            start: Mutex::new(start),
            last_delivered: Mutex::new(None),
            unacked: Mutex::new(HashMap::new()),
            pending_acks: Mutex::new(PendingAcks::default()),
        })
    }
}

type Listing = Result<(Option<Vec<String>>, Option<String>)>;

/// A pattern consumer's rediscovery state.
struct Discovery {
    pattern: Arc<Pattern>,
    /// The broker's topics hash of the last list.
    hash: Option<String>,
    period: Duration,
    /// The running "sleep a period, then list" future (in a mutex only so
    /// that the consumer stays `Sync`; it is used through `&mut`).
    pending: Mutex<Option<BoxFuture<'static, Listing>>>,
    /// Index of the first discovered topic in the initial list.
    first_discovered: usize,
}

struct Shared {
    client: Client,
    /// The topic this part subscribes to (a partition of a partitioned topic).
    topic: String,
    /// Index among the consumer's parts (its slot).
    index: usize,
    /// Partition number, -1 for a non-partitioned topic.
    partition: i32,
    /// Found by a pattern (dropped when the topic no longer matches).
    discovered: bool,
    /// Dropped by a pattern's rediscovery; its slot may be reused.
    retired: AtomicBool,
    subscription: String,
    id: u64,
    opts: Options,
    closed: AtomicBool,
    reconnecting: AtomicBool,
    conn: Mutex<Option<Connection>>,
    /// Generation of the current subscription (a client-unique number per
    /// subscribe, so a reused slot never matches an old one's messages);
    /// messages of older generations are dropped.
    epoch: AtomicU64,
    /// Subscribes so far.
    generations: AtomicU64,
    tx: mpsc::Sender<(usize, u64, PayloadFrame)>,
    /// Batch entries with messages not yet acknowledged: remaining count.
    batches: Mutex<HashMap<(u64, u64), i32>>,
    /// Readers: where the cursor starts (set by `seek`).
    start: Mutex<Option<MessageId>>,
    /// Readers: the last message handed out (resume point after reconnect).
    last_delivered: Mutex<Option<MessageId>>,
    /// With an ack timeout: entries handed out and not yet acknowledged,
    /// with when (at most [`UNACKED_TRACKED_MAX`]).
    unacked: Mutex<HashMap<(u64, u64), Instant>>,
    /// Individual acks queued for the next group.
    pending_acks: Mutex<PendingAcks>,
}

/// Acks waiting to be sent together.
#[derive(Default)]
struct PendingAcks {
    ids: Vec<MessageIdData>,
    /// A flush timer is running for these.
    timer: bool,
}

/// Most entries an ack-timeout tracker remembers per partition.
const UNACKED_TRACKED_MAX: usize = 1_000_000;

/// Redelivers entries unacknowledged for longer than `timeout`.
async fn ack_timer(weak: Weak<Shared>, timeout: Duration) {
    let mut tick = tokio::time::interval(timeout / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(s) = weak.upgrade() else { return };
        if s.closed.load(Ordering::Acquire) {
            return;
        }
        let expired: Vec<MessageIdData> = {
            let mut u = lock(&s.unacked);
            let old: Vec<(u64, u64)> = u
                .iter()
                .filter(|(_, t)| t.elapsed() >= timeout)
                .map(|(k, _)| *k)
                .collect();
            old.into_iter()
                .map(|k| {
                    u.remove(&k);
                    lock(&s.batches).remove(&k);
                    MessageIdData {
                        ledger_id: k.0,
                        entry_id: k.1,
                        partition: (s.partition >= 0).then_some(s.partition),
                        ..Default::default()
                    }
                })
                .collect()
        };
        if expired.is_empty() {
            continue;
        }
        let conn = lock(&s.conn).clone();
        if let Some(c) = conn {
            tracing::debug!(topic = %s.topic, n = expired.len(), "ack timeout: asking for redelivery");
            let _ = c
                .send_frame(Frame::from(commands::redeliver_unacknowledged(
                    s.id, expired,
                )))
                .await;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Receives messages; also a `Stream` of `Result<Message>`.
pub struct Consumer {
    topic: String,
    /// Dead-letter policy: max redeliveries and the DLQ producer.
    dlq: Option<(u32, Producer)>,
    /// Retry-letter topic producer.
    retry: Option<Producer>,
    /// One subscription per topic or partition (slots of retired pattern
    /// topics are reused).
    parts: Vec<Arc<Shared>>,
    proto: PartProto,
    discovery: Option<Discovery>,
    closed: AtomicBool,
    /// Messages of every part: (part index, generation, entry).
    rx: mpsc::Receiver<(usize, u64, PayloadFrame)>,
    local: VecDeque<(usize, u64, Message)>,
    delivered: Vec<u32>,
    flow_epoch: Vec<u64>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("topic", &self.topic)
            .field("subscription", &self.proto.subscription)
            .finish()
    }
}

impl Consumer {
    /// The topic (the first one of a multi-topic consumer; empty for a
    /// pattern consumer that started with no topics).
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Every topic (or partition) the consumer is subscribed to now.
    pub fn topics(&self) -> Vec<String> {
        self.parts
            .iter()
            .filter(|p| !p.retired.load(Ordering::Acquire))
            .map(|p| p.topic.clone())
            .collect()
    }

    /// How many times this consumer subscribed, over all its partitions
    /// (1 per partition after `subscribe`, +1 per reconnect). Acks sent just
    /// before a reconnect may be lost, and the broker then redelivers: a
    /// change of this number tells the application (or a test's history)
    /// that redeliveries may follow.
    pub fn subscriptions(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| p.generations.load(Ordering::Acquire))
            .sum()
    }

    /// The part that delivered message `id`: by its route; an id without
    /// one (built by hand) by its partition. `None` if that part is gone
    /// (a pattern dropped its topic).
    fn part(&self, id: &MessageId) -> Option<&Arc<Shared>> {
        let r = id.route;
        if r.consumer != 0 {
            return self
                .parts
                .get(r.slot as usize)
                .filter(|p| p.id == r.consumer && !p.retired.load(Ordering::Acquire));
        }
        let i = usize::try_from(id.partition).unwrap_or(0);
        self.parts.get(i).or(self.parts.first())
    }

    fn part_or_closed(&self, id: &MessageId) -> Result<&Arc<Shared>> {
        self.part(id).ok_or(Error::Closed)
    }

    /// Waits for the next message.
    pub async fn receive(&mut self) -> Result<Message> {
        futures::future::poll_fn(|cx| self.poll_message(cx)).await
    }

    /// Receives a batch of messages: waits until `policy.max_messages`
    /// messages or `policy.max_bytes` payload bytes are collected, or
    /// `policy.timeout` has passed since the call, and returns what it has
    /// (empty when nothing arrived in time). Each message is acknowledged
    /// as usual. An error is returned only if no message was collected
    /// before it.
    pub async fn batch_receive(&mut self, policy: BatchReceivePolicy) -> Result<Vec<Message>> {
        let deadline = tokio::time::Instant::now() + policy.timeout;
        let max = policy.max_messages.max(1);
        let mut out = Vec::with_capacity(max.min(1024));
        let mut bytes = 0usize;
        while out.len() < max && bytes < policy.max_bytes {
            // `receive` is cancel-safe: a message is only taken from the
            // queue in the poll that returns it.
            match tokio::time::timeout_at(deadline, self.receive()).await {
                Err(_elapsed) => break,
                Ok(Ok(m)) => {
                    bytes += m.payload.len();
                    out.push(m);
                }
                Ok(Err(e)) if out.is_empty() => return Err(e),
                Ok(Err(_)) => break,
            }
        }
        Ok(out)
    }

    fn poll_message(&mut self, cx: &mut Context<'_>) -> Poll<Result<Message>> {
        loop {
            if self.closed.load(Ordering::Acquire)
                || (self.discovery.is_none()
                    && self.parts.iter().any(|p| p.closed.load(Ordering::Acquire)))
            {
                return Poll::Ready(Err(Error::Closed));
            }
            if self.poll_discovery(cx) {
                continue;
            }
            if let Some((i, e, m)) = self.local.pop_front() {
                let epoch = self.parts[i].epoch.load(Ordering::Acquire);
                if e != epoch {
                    continue;
                }
                if let Some((max, producer)) = &self.dlq
                    && m.redelivery_count > *max
                {
                    let (producer, part) = (producer.clone(), self.parts[i].clone());
                    self.after_deliver(i, epoch);
                    tokio::spawn(dead_letter(producer, part, m));
                    continue;
                }
                if self.parts[0].opts.reader {
                    let mut last = lock(&self.parts[0].last_delivered);
                    if last.is_some_and(|l| position(&m.id) <= position(&l)) {
                        continue; // already handed out before a reconnect
                    }
                    *last = Some(m.id);
                }
                if self.parts[i].opts.ack_timeout.is_some() {
                    let mut u = lock(&self.parts[i].unacked);
                    if u.len() < UNACKED_TRACKED_MAX {
                        u.entry((m.id.ledger_id, m.id.entry_id))
                            .or_insert_with(Instant::now);
                    }
                }
                self.after_deliver(i, epoch);
                let mut m = m;
                m.id.route = Route {
                    slot: i as u32,
                    consumer: self.parts[i].id,
                };
                return Poll::Ready(Ok(m));
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some((i, e, frame))) => {
                    if self
                        .parts
                        .get(i)
                        .is_none_or(|p| p.epoch.load(Ordering::Acquire) != e)
                    {
                        continue;
                    }
                    if let Err(err) = self.take_entry(i, e, &frame) {
                        tracing::warn!(topic = %self.parts[0].topic, error = %err, "dropping undecodable entry");
                        return Poll::Ready(Err(err));
                    }
                }
                Poll::Ready(None) => return Poll::Ready(Err(Error::Closed)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn take_entry(&mut self, i: usize, epoch: u64, frame: &PayloadFrame) -> Result<()> {
        let part = self.parts[i].clone();
        let m = frame
            .command
            .message
            .as_ref()
            .ok_or_else(|| Error::Protocol("payload frame without MESSAGE".into()))?;
        let parsed = parse_entry(&frame.entry)?;
        let msgs = unpack(
            &part.topic,
            &m.message_id,
            &parsed.metadata,
            frame.entry.slice(parsed.payload.clone()),
            m.redelivery_count.unwrap_or(0),
        );
        let mut msgs = match msgs {
            Ok(v) => v,
            Err(e) => {
                // Permits were spent on it: count them so flow continues.
                self.delivered[i] += parsed.num_messages();
                return Err(e);
            }
        };
        if part.partition >= 0 {
            for m in &mut msgs {
                m.id.partition = part.partition;
            }
        }
        if parsed.is_batch() {
            lock(&part.batches).insert(
                (m.message_id.ledger_id, m.message_id.entry_id),
                msgs.len() as i32,
            );
        }
        self.local.extend(msgs.into_iter().map(|m| (i, epoch, m)));
        Ok(())
    }

    fn after_deliver(&mut self, i: usize, epoch: u64) {
        if self.flow_epoch[i] != epoch {
            self.flow_epoch[i] = epoch;
            self.delivered[i] = 0;
        }
        self.delivered[i] += 1;
        let part = &self.parts[i];
        let half = (part.opts.receiver_queue / 2).max(1);
        if self.delivered[i] >= half {
            let conn = lock(&part.conn).clone();
            if let Some(c) = conn
                && c.try_send_frame(Frame::from(commands::flow(part.id, self.delivered[i])))
            {
                self.delivered[i] = 0;
            }
        }
    }

    fn conn_of(part: &Shared) -> Result<Connection> {
        lock(&part.conn)
            .clone()
            .ok_or_else(|| Error::Disconnected(part.topic.clone()))
    }

    fn conn(&self) -> Result<Connection> {
        Self::conn_of(&self.parts[0])
    }

    /// Polls the pattern rediscovery (if any); true when the topic set
    /// changed (the caller loops again).
    fn poll_discovery(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(d) = self.discovery.as_mut() else {
            return false;
        };
        let pending = d
            .pending
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fut = pending.get_or_insert_with(|| {
            let (client, pattern, hash, period) = (
                self.proto.client.clone(),
                d.pattern.clone(),
                d.hash.clone(),
                d.period,
            );
            async move {
                tokio::time::sleep(period).await;
                pattern.list(&client, hash.as_deref()).await
            }
            .boxed()
        });
        let Poll::Ready(r) = fut.as_mut().poll(cx) else {
            return false;
        };
        *pending = None;
        match r {
            Ok((list, hash)) => {
                d.hash = hash;
                if let Some(list) = list {
                    self.apply_topics(list);
                }
            }
            Err(e) => {
                tracing::warn!(pattern = %d.pattern.text, error = %e, "topic rediscovery failed");
            }
        }
        true
    }

    /// A pattern's new topic list: subscribes to new topics (in the
    /// background, with retries) and drops topics no longer listed.
    fn apply_topics(&mut self, list: Vec<String>) {
        let wanted: std::collections::BTreeSet<&str> = list.iter().map(String::as_str).collect();
        for i in 0..self.parts.len() {
            let p = &self.parts[i];
            if p.discovered
                && !p.retired.load(Ordering::Acquire)
                && !wanted.contains(p.topic.as_str())
            {
                tracing::info!(topic = %p.topic, "pattern consumer: topic gone, unsubscribing");
                p.retired.store(true, Ordering::Release);
                self.local.retain(|(j, _, _)| *j != i);
                let p = p.clone();
                tokio::spawn(async move {
                    let _ = close_part(&p).await;
                });
            }
        }
        let active: std::collections::BTreeSet<String> = self
            .parts
            .iter()
            .filter(|p| !p.retired.load(Ordering::Acquire))
            .map(|p| p.topic.clone())
            .collect();
        let mut count = active.len();
        for t in list {
            if active.contains(&t) {
                continue;
            }
            if count >= self.proto.opts.max_topics {
                tracing::warn!(topic = %t, max = self.proto.opts.max_topics, "pattern consumer: max_topics reached, topic left out");
                continue;
            }
            count += 1;
            let slot = self
                .parts
                .iter()
                .position(|p| p.retired.load(Ordering::Acquire))
                .unwrap_or(self.parts.len());
            let partition = partition_of(&t);
            tracing::info!(topic = %t, "pattern consumer: new topic, subscribing");
            let part = self.proto.part(t, slot, partition, true, None);
            if slot == self.parts.len() {
                self.parts.push(part.clone());
                self.delivered.push(0);
                self.flow_epoch.push(0);
            } else {
                self.parts[slot] = part.clone();
                self.delivered[slot] = 0;
                self.flow_epoch[slot] = 0;
            }
            if let Some(timeout) = part.opts.ack_timeout {
                tokio::spawn(ack_timer(Arc::downgrade(&part), timeout));
            }
            tokio::spawn(part.reconnect(false));
        }
    }

    /// Acknowledges one message. A message of a batch acknowledges its entry
    /// once every message of the batch is acknowledged.
    pub async fn ack(&self, id: &MessageId) -> Result<()> {
        ack_part(self.part_or_closed(id)?, id).await
    }

    /// Retry later (Pulsar's `reconsumeLater`): publishes `msg` to the
    /// retry-letter topic to be delivered again after `delay` (to this
    /// subscription, which also reads the retry topic), then acknowledges
    /// it. The copy carries `RECONSUMETIMES` (1, 2, ...), `DELAY_TIME` (ms)
    /// and, from the first retry on, `REAL_TOPIC` and `ORIGIN_MESSAGE_ID`.
    /// When `RECONSUMETIMES` would exceed the dead-letter policy's maximum,
    /// the message goes to the dead-letter topic instead. Needs
    /// [`ConsumerBuilder::enable_retry`] or `retry_letter_topic`.
    pub async fn reconsume_later(&self, msg: &Message, delay: Duration) -> Result<()> {
        let Some(retry) = &self.retry else {
            return Err(Error::Unsupported(
                "reconsume_later needs enable_retry or retry_letter_topic".into(),
            ));
        };
        let times = msg
            .properties
            .get(retry_props::RECONSUMETIMES)
            .and_then(|v| v.parse::<u32>().ok())
            .map_or(1, |n| n.saturating_add(1));
        let mut out = ProducerMessage::new(msg.payload.clone());
        out.key = msg.key.clone();
        out.event_time = msg.event_time;
        out.properties = msg.properties.clone();
        if !out.properties.contains_key(retry_props::REAL_TOPIC) {
            out.properties
                .insert(retry_props::REAL_TOPIC.into(), msg.topic.clone());
            out.properties
                .insert(retry_props::ORIGIN_MESSAGE_ID.into(), msg.id.to_string());
        }
        out.properties
            .insert(retry_props::RECONSUMETIMES.into(), times.to_string());
        out.properties.insert(
            retry_props::DELAY_TIME.into(),
            delay.as_millis().to_string(),
        );
        match &self.dlq {
            Some((max, dlq)) if times > *max => {
                dlq.send(out).await?;
            }
            _ => {
                retry.send(out.deliver_after(delay)).await?;
            }
        }
        self.ack(&msg.id).await
    }

    /// Acknowledges every message up to and including `id` (of its
    /// partition, on a partitioned topic).
    pub async fn ack_cumulative(&self, id: &MessageId) -> Result<()> {
        let part = self.part_or_closed(id)?;
        let mut target = *id;
        if id.batch_size > 0 && id.batch_index < id.batch_size - 1 {
            // Part of a batch: only the entries before it are complete.
            if id.entry_id == 0 {
                return Ok(());
            }
            target.entry_id -= 1;
        }
        lock(&part.unacked).retain(|k, _| *k > (target.ledger_id, target.entry_id));
        let c = Self::conn_of(part)?;
        c.send_frame(Frame::from(commands::ack(
            part.id,
            AckType::Cumulative,
            vec![target.to_data()],
            None,
        )))
        .await
    }

    /// Asks for redelivery of `id` (its whole entry) after the negative-ack delay.
    pub fn negative_ack(&self, id: &MessageId) {
        let Some(part) = self.part(id) else { return };
        let shared = Arc::downgrade(part);
        let data = id.to_data();
        let delay = part.opts.nack_delay;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let Some(s) = shared.upgrade() else { return };
            lock(&s.batches).remove(&(data.ledger_id, data.entry_id));
            lock(&s.unacked).remove(&(data.ledger_id, data.entry_id));
            let conn = lock(&s.conn).clone();
            if let Some(c) = conn {
                let _ = c
                    .send_frame(Frame::from(commands::redeliver_unacknowledged(
                        s.id,
                        vec![data],
                    )))
                    .await;
            }
        });
    }

    /// Removes the subscription (from every partition).
    pub async fn unsubscribe(&self) -> Result<()> {
        self.closed.store(true, Ordering::Release);
        for part in &self.parts {
            if part.retired.load(Ordering::Acquire) {
                continue;
            }
            let c = Self::conn_of(part)?;
            let rid = part.client.next_id();
            c.request(rid, commands::unsubscribe(part.id, rid)).await?;
            part.closed.store(true, Ordering::Release);
            c.unregister_consumer(part.id);
        }
        Ok(())
    }

    /// Closes the consumer (the subscription stays).
    pub async fn close(&self) -> Result<()> {
        let mut result = Ok(());
        self.closed.store(true, Ordering::Release);
        if let Some((_, p)) = &self.dlq {
            let _ = p.close().await;
        }
        if let Some(p) = &self.retry {
            let _ = p.close().await;
        }
        for part in &self.parts {
            if part.retired.load(Ordering::Acquire) {
                continue;
            }
            if let Err(e) = close_part(part).await {
                result = Err(e);
            }
        }
        result
    }
}

/// Individual ack of `id` on `part` (a batch entry once all its messages are).
async fn ack_part(part: &Arc<Shared>, id: &MessageId) -> Result<()> {
    if id.batch_size > 0 {
        let mut b = lock(&part.batches);
        let key = (id.ledger_id, id.entry_id);
        match b.get_mut(&key) {
            Some(n) if *n > 1 => {
                *n -= 1;
                return Ok(());
            }
            _ => {
                b.remove(&key);
            }
        }
    }
    lock(&part.unacked).remove(&(id.ledger_id, id.entry_id));
    if part.opts.ack_group_time.is_zero() {
        return send_individual_acks(part, vec![id.to_data()]).await;
    }
    if part.closed.load(Ordering::Acquire) {
        return Err(Error::Closed);
    }
    let (full, start_timer) = {
        let mut p = lock(&part.pending_acks);
        p.ids.push(id.to_data());
        let full = p.ids.len() >= part.opts.ack_group_max;
        let start_timer = !full && !p.timer;
        p.timer |= start_timer;
        (full, start_timer)
    };
    if full {
        // A send that fails keeps the group queued for the re-subscribe;
        // the ack itself is accepted.
        let _ = flush_acks(part).await;
    } else if start_timer {
        let part = part.clone();
        let wait = part.opts.ack_group_time;
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            lock(&part.pending_acks).timer = false;
            if let Err(e) = flush_acks(&part).await {
                tracing::debug!(topic = %part.topic, error = %e, "ack group kept for the re-subscribe");
            }
        });
    }
    Ok(())
}

/// Sends the queued acks of `part` in one ACK command. When there is no
/// connection or the send fails they stay queued (the re-subscribe sends
/// them), at most [`ACK_GROUP_MAX_LIMIT`] of them.
async fn flush_acks(part: &Shared) -> Result<()> {
    let ids = std::mem::take(&mut lock(&part.pending_acks).ids);
    if ids.is_empty() || part.closed.load(Ordering::Acquire) {
        return Ok(());
    }
    let sent = send_individual_acks(part, ids.clone()).await;
    if sent.is_err() {
        let mut p = lock(&part.pending_acks);
        let newer = std::mem::replace(&mut p.ids, ids);
        p.ids.extend(newer);
        let over = p.ids.len().saturating_sub(ACK_GROUP_MAX_LIMIT);
        p.ids.drain(..over);
    }
    sent
}

/// One ACK command (individual) of `ids` on `part`'s current connection.
async fn send_individual_acks(part: &Shared, ids: Vec<MessageIdData>) -> Result<()> {
    Consumer::conn_of(part)?
        .send_frame(Frame::from(commands::ack(
            part.id,
            AckType::Individual,
            ids,
            None,
        )))
        .await
}

/// Publishes `m` to the dead-letter topic, then acknowledges it; if the
/// publish fails the message stays unacknowledged (and comes back).
async fn dead_letter(producer: Producer, part: Arc<Shared>, m: Message) {
    let mut out = ProducerMessage::new(m.payload.clone());
    out.key = m.key.clone();
    out.properties = m.properties.clone();
    out.properties
        .insert("REAL_TOPIC".into(), part.topic.clone());
    out.properties
        .insert("ORIGIN_MESSAGE_ID".into(), m.id.to_string());
    out.event_time = m.event_time;
    match producer.send(out).await {
        Ok(_) => {
            if let Err(e) = ack_part(&part, &m.id).await {
                tracing::warn!(topic = %part.topic, error = %e, "ack after dead-lettering failed");
            }
        }
        Err(e) => tracing::warn!(topic = %part.topic, error = %e, "dead-letter publish failed"),
    }
}

async fn close_part(part: &Shared) -> Result<()> {
    // Queued acks go out before the close (best effort: a failed send
    // leaves those messages to come again).
    let _ = flush_acks(part).await;
    part.closed.store(true, Ordering::Release);
    let conn = lock(&part.conn).take();
    if let Some(c) = conn {
        c.unregister_consumer(part.id);
        let rid = part.client.next_id();
        c.request(rid, commands::close_consumer(part.id, rid))
            .await?;
    }
    Ok(())
}

/// Order of message ids within a topic: ledger, entry, batch index.
fn position(id: &MessageId) -> (u64, u64, i32) {
    (id.ledger_id, id.entry_id, id.batch_index)
}

/// Builds a [`Reader`]; see [`Client::reader`].
#[derive(Debug)]
pub struct ReaderBuilder {
    inner: ConsumerBuilder,
    start: MessageId,
}

impl ReaderBuilder {
    pub(crate) fn new(client: Client, topic: String) -> Self {
        let sub = format!("reader-{:016x}", rand::random::<u64>());
        let mut inner = ConsumerBuilder::new(client, topic, sub);
        inner.opts.reader = true;
        ReaderBuilder {
            inner,
            start: MessageId::LATEST,
        }
    }
    /// Where to start: [`MessageId::EARLIEST`], [`MessageId::LATEST`]
    /// (default) or a message id (that message included).
    pub fn start_message_id(mut self, id: MessageId) -> Self {
        self.start = id;
        self
    }
    /// Messages buffered ahead of the application (default 1000).
    pub fn receiver_queue_size(mut self, n: u32) -> Self {
        self.inner = self.inner.receiver_queue_size(n);
        self
    }
    /// Opens the reader.
    pub async fn create(self) -> Result<Reader> {
        let consumer = self.inner.subscribe_at(Some(self.start)).await?;
        Ok(Reader { consumer })
    }
}

/// Reads a topic from a position without a durable subscription; nothing
/// to acknowledge. Also a `Stream` of `Result<Message>`.
#[derive(Debug)]
pub struct Reader {
    consumer: Consumer,
}

impl Reader {
    /// The next message.
    pub async fn read_next(&mut self) -> Result<Message> {
        self.consumer.receive().await
    }

    /// Whether a message after the last one read exists on the topic.
    pub async fn has_message_available(&mut self) -> Result<bool> {
        let epoch = self.consumer.parts[0].epoch.load(Ordering::Acquire);
        if self.consumer.local.iter().any(|(_, e, _)| *e == epoch) || !self.consumer.rx.is_empty() {
            return Ok(true);
        }
        let c = self.consumer.conn()?;
        let rid = self.consumer.parts[0].client.next_id();
        let r = c
            .request(
                rid,
                commands::get_last_message_id(self.consumer.parts[0].id, rid),
            )
            .await?;
        let last = r
            .get_last_message_id_response
            .ok_or_else(|| Error::Protocol("GET_LAST_MESSAGE_ID_RESPONSE without body".into()))?
            .last_message_id;
        if (last.ledger_id as i64) < 0 || (last.entry_id as i64) < 0 {
            return Ok(false); // empty topic
        }
        let last = (last.ledger_id, last.entry_id);
        let delivered = *lock(&self.consumer.parts[0].last_delivered);
        Ok(match delivered {
            Some(d) => {
                last > (d.ledger_id, d.entry_id)
                    || (last == (d.ledger_id, d.entry_id)
                        && d.batch_size > 0
                        && d.batch_index < d.batch_size - 1)
            }
            None => match *lock(&self.consumer.parts[0].start) {
                Some(s) if s == MessageId::LATEST => false,
                Some(s) if s == MessageId::EARLIEST => true,
                Some(s) => last >= (s.ledger_id, s.entry_id),
                None => true,
            },
        })
    }

    /// Moves the reader to `id` (included; [`MessageId::EARLIEST`] or
    /// [`MessageId::LATEST`] work too). The broker then closes the reader's
    /// consumer and it re-subscribes at the new position.
    pub async fn seek(&mut self, id: MessageId) -> Result<()> {
        let data = MessageIdData {
            ledger_id: id.ledger_id,
            entry_id: id.entry_id,
            ..Default::default()
        };
        self.seek_with(Some(id), |consumer_id, rid| {
            commands::seek(consumer_id, rid, data)
        })
        .await
    }

    /// Moves the reader to the first message published at or after `time`
    /// (the producer's publish time, millisecond resolution). The broker
    /// moves the reader's cursor; the reader re-subscribes and finds it.
    pub async fn seek_time(&mut self, time: std::time::SystemTime) -> Result<()> {
        let ms = time
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        // The position is the broker's to find: as far as the reader knows,
        // anything from the earliest on may follow.
        self.seek_with(Some(MessageId::EARLIEST), |consumer_id, rid| {
            commands::seek_publish_time(consumer_id, rid, ms)
        })
        .await
    }

    async fn seek_with(
        &mut self,
        start: Option<MessageId>,
        cmd: impl FnOnce(u64, u64) -> crate::proto::pulsar::BaseCommand,
    ) -> Result<()> {
        let s = self.consumer.parts[0].clone();
        let c = self.consumer.conn()?;
        *lock(&s.start) = start;
        *lock(&s.last_delivered) = None;
        let rid = s.client.next_id();
        let before = s.epoch.load(Ordering::Acquire);
        c.request(rid, cmd(s.id, rid)).await?;
        // Everything the broker sent before its SUCCESS is queued by now:
        // drop it, then wait (bounded) for the re-subscription at `id`.
        self.consumer.local.clear();
        while self.consumer.rx.try_recv().is_ok() {}
        let deadline = std::time::Instant::now() + s.client.opts().operation_timeout;
        while s.epoch.load(Ordering::Acquire) == before {
            if std::time::Instant::now() > deadline || s.closed.load(Ordering::Acquire) {
                return Err(Error::Timeout(format!(
                    "re-subscribing {} after seek",
                    s.topic
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// Closes the reader.
    pub async fn close(&self) -> Result<()> {
        self.consumer.close().await
    }
}

impl futures::Stream for Reader {
    type Item = Result<Message>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().consumer.poll_message(cx).map(Some)
    }
}

impl futures::Stream for Consumer {
    type Item = Result<Message>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_message(cx).map(Some)
    }
}

impl Shared {
    async fn subscribe_once(self: Arc<Self>) -> Result<()> {
        let conn = self.client.lookup_connection(&self.topic).await?;
        let rid = self.client.next_id();
        let mut cmd = commands::subscribe(
            &self.topic,
            &self.subscription,
            self.opts.sub_type,
            self.id,
            rid,
            self.opts.initial_position,
        );
        if let Some(s) = cmd.subscribe.as_mut() {
            s.consumer_name = self.opts.name.clone();
            if self.opts.reader {
                s.durable = Some(false);
                let last = *lock(&self.last_delivered);
                let start = match last {
                    // Resume at the entry after the last one handed out
                    // (the same entry if a batch was left half-read).
                    Some(l) if l.batch_size > 0 && l.batch_index < l.batch_size - 1 => Some(l),
                    Some(mut l) => {
                        l.entry_id += 1;
                        Some(l)
                    }
                    None => *lock(&self.start),
                };
                s.start_message_id = start.map(|m| MessageIdData {
                    ledger_id: m.ledger_id,
                    entry_id: m.entry_id,
                    ..Default::default()
                });
            }
        }
        // Registered first: the sink ignores nothing, and no message flows
        // before FLOW anyway.
        self.generations.fetch_add(1, Ordering::AcqRel);
        let generation = self.client.next_id();
        conn.register_consumer(self.id, Arc::new(Sink(Arc::downgrade(&self), generation)));
        if let Err(e) = conn.request(rid, cmd).await {
            conn.unregister_consumer(self.id);
            return Err(e);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.epoch.store(generation, Ordering::Release);
        *lock(&self.conn) = Some(conn.clone());
        lock(&self.batches).clear();
        // Acks queued across a reconnect reach the broker before FLOW, so it
        // does not dispatch those messages again.
        if let Err(e) = flush_acks(&self).await {
            tracing::debug!(topic = %self.topic, error = %e, "queued acks not sent on re-subscribe");
        }
        conn.send_frame(Frame::from(commands::flow(
            self.id,
            self.opts.receiver_queue,
        )))
        .await?;
        tracing::debug!(topic = %self.topic, subscription = %self.subscription, "subscribed");
        Ok(())
    }

    /// Subscribes again (`wait`: after a first backoff delay) until it
    /// works, the error is permanent, or the part is closed.
    async fn reconnect(self: Arc<Self>, wait: bool) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let o = self.client.opts();
        let mut backoff = Backoff::new(o.backoff_initial, o.backoff_max);
        let mut first = true;
        while !self.closed.load(Ordering::Acquire) {
            if wait || !first {
                tokio::time::sleep(backoff.next_jittered()).await;
            }
            first = false;
            match self.clone().subscribe_once().await {
                Ok(()) => break,
                Err(e) if e.is_retriable() => {
                    tracing::info!(topic = %self.topic, error = %e, "consumer reconnect failed, retrying");
                }
                Err(e) => {
                    tracing::warn!(topic = %self.topic, error = %e, "consumer cannot re-subscribe");
                    self.closed.store(true, Ordering::Release);
                    break;
                }
            }
        }
        self.reconnecting.store(false, Ordering::Release);
    }
}

struct Sink(Weak<Shared>, u64);

impl ConsumerSink for Sink {
    fn message(&self, _conn_id: u64, frame: PayloadFrame) -> BoxFuture<'static, ()> {
        let weak = self.0.clone();
        let generation = self.1;
        async move {
            let Some(s) = weak.upgrade() else { return };
            let tx = s.tx.clone();
            let index = s.index;
            drop(s);
            let _ = tx.send((index, generation, frame)).await;
        }
        .boxed()
    }

    fn disconnected(&self, _conn_id: u64) {
        let Some(s) = self.0.upgrade() else { return };
        if s.epoch.load(Ordering::Acquire) != self.1 || s.closed.load(Ordering::Acquire) {
            return;
        }
        *lock(&s.conn) = None;
        tracing::info!(topic = %s.topic, "consumer disconnected, re-subscribing");
        tokio::spawn(s.reconnect(true));
    }
}
