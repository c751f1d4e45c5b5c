//! [`Consumer`]: receives messages of one topic through a subscription.
//!
//! Flow control: the consumer grants `receiver_queue_size` permits on
//! (re)subscribe and grants more as the application takes messages (half a
//! queue at a time), so at most a queue's worth of messages is buffered.
//! Batches are unpacked and decompressed on receipt; a batch entry is
//! acknowledged once all its messages are. When the connection drops the
//! consumer re-subscribes with backoff; messages buffered but not yet handed
//! out are dropped then (the broker redelivers them).

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
use super::message::{Message, MessageId, ProducerMessage, unpack};
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
    /// Dead-letter policy: (max redeliveries, DLQ topic).
    dead_letter: Option<(u32, Option<String>)>,
    /// Readers: a non-durable cursor starting at `start`.
    reader: bool,
}

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
    subscription: String,
    opts: Options,
}

impl ConsumerBuilder {
    pub(crate) fn new(client: Client, topic: String, subscription: String) -> Self {
        ConsumerBuilder {
            client,
            topic,
            subscription,
            opts: Options {
                sub_type: SubType::Exclusive,
                initial_position: InitialPosition::Latest,
                receiver_queue: 1000,
                name: None,
                nack_delay: Duration::from_secs(1),
                ack_timeout: None,
                dead_letter: None,
                reader: false,
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

    /// Subscribes.
    pub async fn subscribe(self) -> Result<Consumer> {
        self.subscribe_at(None).await
    }

    async fn subscribe_at(self, start: Option<MessageId>) -> Result<Consumer> {
        let ConsumerBuilder {
            client,
            topic,
            subscription,
            opts,
        } = self;
        let dlq = match &opts.dead_letter {
            Some((max, t)) => {
                let t = t
                    .clone()
                    .unwrap_or_else(|| format!("{topic}-{subscription}-DLQ"));
                // Boxed: keeps the subscribe future small.
                Some((*max, Box::pin(client.producer(t).create()).await?))
            }
            None => None,
        };
        let n = client.partitions(&topic).await?;
        if n > 0 && opts.reader {
            return Err(Error::Unsupported(format!(
                "readers of partitioned topics ({topic} has {n} partitions)"
            )));
        }
        let names: Vec<(String, i32)> = if n == 0 {
            vec![(topic.clone(), -1)]
        } else {
            (0..n)
                .map(|i| (format!("{topic}-partition-{i}"), i as i32))
                .collect()
        };
        let parts_n = names.len();
        let (tx, rx) = mpsc::channel((opts.receiver_queue as usize + 64) * parts_n);
        let mut parts: Vec<Arc<Shared>> = Vec::with_capacity(parts_n);
        for (index, (part_topic, partition)) in names.into_iter().enumerate() {
            let shared = Arc::new(Shared {
                id: client.next_id(),
                client: client.clone(),
                topic: part_topic,
                index,
                partition,
                subscription: subscription.clone(),
                opts: opts.clone(),
                closed: AtomicBool::new(false),
                reconnecting: AtomicBool::new(false),
                conn: Mutex::new(None),
                epoch: AtomicU64::new(0),
                generations: AtomicU64::new(0),
                tx: tx.clone(),
                batches: Mutex::new(HashMap::new()),
                start: Mutex::new(start),
                last_delivered: Mutex::new(None),
                unacked: Mutex::new(HashMap::new()),
            });
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
            topic,
            dlq,
            rx,
            local: VecDeque::new(),
            delivered: vec![0; parts_n],
            flow_epoch: vec![0; parts_n],
            parts,
        })
    }
}

struct Shared {
    client: Client,
    /// The topic this part subscribes to (a partition of a partitioned topic).
    topic: String,
    /// Index among the consumer's parts.
    index: usize,
    /// Partition number, -1 for a non-partitioned topic.
    partition: i32,
    subscription: String,
    id: u64,
    opts: Options,
    closed: AtomicBool,
    reconnecting: AtomicBool,
    conn: Mutex<Option<Connection>>,
    /// Generation of the current subscription (one per successful
    /// subscribe); messages of older generations are dropped.
    epoch: AtomicU64,
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
                .send_frame(Frame::Command(commands::redeliver_unacknowledged(
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
    /// One subscription per partition (one for a non-partitioned topic).
    parts: Vec<Arc<Shared>>,
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
            .field("subscription", &self.parts[0].subscription)
            .finish()
    }
}

impl Consumer {
    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
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

    /// The part that holds message `id`.
    fn part(&self, id: &MessageId) -> &Arc<Shared> {
        let i = usize::try_from(id.partition).unwrap_or(0);
        self.parts.get(i).unwrap_or(&self.parts[0])
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
            if self.parts.iter().any(|p| p.closed.load(Ordering::Acquire)) {
                return Poll::Ready(Err(Error::Closed));
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
            parsed.payload(&frame.entry),
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
                && c.try_send_frame(Frame::Command(commands::flow(part.id, self.delivered[i])))
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

    /// Acknowledges one message. A message of a batch acknowledges its entry
    /// once every message of the batch is acknowledged.
    pub async fn ack(&self, id: &MessageId) -> Result<()> {
        ack_part(self.part(id), id).await
    }

    /// Acknowledges every message up to and including `id` (of its
    /// partition, on a partitioned topic).
    pub async fn ack_cumulative(&self, id: &MessageId) -> Result<()> {
        let part = self.part(id);
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
        c.send_frame(Frame::Command(commands::ack(
            part.id,
            AckType::Cumulative,
            vec![target.to_data()],
            None,
        )))
        .await
    }

    /// Asks for redelivery of `id` (its whole entry) after the negative-ack delay.
    pub fn negative_ack(&self, id: &MessageId) {
        let part = self.part(id);
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
                    .send_frame(Frame::Command(commands::redeliver_unacknowledged(
                        s.id,
                        vec![data],
                    )))
                    .await;
            }
        });
    }

    /// Removes the subscription (from every partition).
    pub async fn unsubscribe(&self) -> Result<()> {
        for part in &self.parts {
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
        if let Some((_, p)) = &self.dlq {
            let _ = p.close().await;
        }
        for part in &self.parts {
            if let Err(e) = close_part(part).await {
                result = Err(e);
            }
        }
        result
    }
}

/// Individual ack of `id` on `part` (a batch entry once all its messages are).
async fn ack_part(part: &Shared, id: &MessageId) -> Result<()> {
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
    let c = Consumer::conn_of(part)?;
    c.send_frame(Frame::Command(commands::ack(
        part.id,
        AckType::Individual,
        vec![id.to_data()],
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
        let generation = self.generations.fetch_add(1, Ordering::AcqRel) + 1;
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
        conn.send_frame(Frame::Command(commands::flow(
            self.id,
            self.opts.receiver_queue,
        )))
        .await?;
        tracing::debug!(topic = %self.topic, subscription = %self.subscription, "subscribed");
        Ok(())
    }

    async fn reconnect(self: Arc<Self>) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let o = self.client.opts();
        let mut backoff = Backoff::new(o.backoff_initial, o.backoff_max);
        while !self.closed.load(Ordering::Acquire) {
            tokio::time::sleep(backoff.next_jittered()).await;
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
        tokio::spawn(s.reconnect());
    }
}
