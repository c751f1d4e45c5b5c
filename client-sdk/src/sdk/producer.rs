//! [`Producer`]: publishes messages to one topic.
//!
//! Sequence ids are assigned in call order; entries are written in sequence
//! order and kept in a pending queue until their SEND_RECEIPT arrives. The
//! pending queue is bounded by `max_pending_messages` (a semaphore of
//! messages): a full queue blocks the caller or fails with
//! [`Error::ProducerQueueFull`], as configured. With batching, messages
//! collect into one entry until `batching_max_messages`, `batching_max_bytes`
//! or `batching_max_delay` is reached. When the connection drops, the
//! producer looks the topic up again with backoff, re-creates itself under
//! the same name and resends every pending entry with its original sequence
//! ids (so broker deduplication can drop repeats).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, oneshot};

use super::backoff::Backoff;
use super::client::Client;
use super::connection::{Connection, ProducerSink};
use super::error::{Error, Result};
use super::message::{MessageId, ProducerMessage, batch_entry_parts, single_entry_parts};
use super::routing::{self, RoutingMode};
use crate::proto::commands;
use crate::proto::frame::{ChecksumState, FRAME_SIZE_MAX, Frame, PayloadFrame, entry_from_parts};
use crate::proto::pulsar::{
    CommandSendError, CommandSendReceipt, CompressionType, ProducerAccessMode,
};

/// Largest entry a producer sends (room left for the command header).
const ENTRY_MAX: usize = FRAME_SIZE_MAX - 10 * 1024;

/// Producer options.
#[derive(Debug, Clone)]
struct Options {
    name: Option<String>,
    compression: CompressionType,
    batching: bool,
    batch_max_messages: usize,
    batch_max_bytes: usize,
    batch_max_delay: Duration,
    max_pending: usize,
    block_if_full: bool,
    access_mode: ProducerAccessMode,
    routing: RoutingMode,
}

/// Builds a [`Producer`]; see [`Client::producer`].
#[derive(Debug)]
pub struct ProducerBuilder {
    client: Client,
    topic: String,
    opts: Options,
}

impl ProducerBuilder {
    pub(crate) fn new(client: Client, topic: String) -> Self {
        ProducerBuilder {
            client,
            topic,
            opts: Options {
                name: None,
                compression: CompressionType::None,
                batching: false,
                batch_max_messages: 1000,
                batch_max_bytes: 128 * 1024,
                batch_max_delay: Duration::from_millis(1),
                max_pending: 1000,
                block_if_full: true,
                access_mode: ProducerAccessMode::Shared,
                routing: RoutingMode::RoundRobin,
            },
        }
    }
    /// Producer name (the broker assigns one if unset); kept across reconnects.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.opts.name = Some(name.into());
        self
    }
    /// Payload compression (default none).
    pub fn compression(mut self, c: CompressionType) -> Self {
        self.opts.compression = c;
        self
    }
    /// Enables batching (default off).
    pub fn batching(mut self, on: bool) -> Self {
        self.opts.batching = on;
        self
    }
    /// A batch is sent when it holds this many messages (default 1000).
    pub fn batching_max_messages(mut self, n: usize) -> Self {
        self.opts.batch_max_messages = n.max(1);
        self
    }
    /// A batch is sent when it holds this many payload bytes (default 128 KiB).
    pub fn batching_max_bytes(mut self, n: usize) -> Self {
        self.opts.batch_max_bytes = n.clamp(1, ENTRY_MAX / 2);
        self
    }
    /// A batch is sent at most this long after its first message (default 1 ms).
    pub fn batching_max_delay(mut self, d: Duration) -> Self {
        self.opts.batch_max_delay = d.max(Duration::from_micros(100));
        self
    }
    /// Messages awaiting a receipt, at most (default 1000).
    pub fn max_pending_messages(mut self, n: usize) -> Self {
        self.opts.max_pending = n.clamp(1, Semaphore::MAX_PERMITS);
        self
    }
    /// When the pending queue is full: wait (true, default) or fail with
    /// [`Error::ProducerQueueFull`] (false).
    pub fn block_if_queue_full(mut self, block: bool) -> Self {
        self.opts.block_if_full = block;
        self
    }
    /// Access mode (default Shared).
    pub fn access_mode(mut self, m: ProducerAccessMode) -> Self {
        self.opts.access_mode = m;
        self
    }

    /// Partitioned topics: where keyless messages go (keyed ones go by key hash).
    pub fn routing_mode(mut self, m: RoutingMode) -> Self {
        self.opts.routing = m;
        self
    }

    /// Asks for the topic's partitions, then creates one producer per
    /// partition (or one for a non-partitioned topic): lookup, PRODUCER, and
    /// the batch timer.
    pub async fn create(self) -> Result<Producer> {
        let ProducerBuilder {
            client,
            topic,
            opts,
        } = self;
        let n = client.partitions(&topic).await?;
        let mut parts = Vec::new();
        if n == 0 {
            parts
                .push(Box::pin(create_one(client.clone(), topic.clone(), -1, opts.clone())).await?);
        } else {
            for i in 0..n {
                let t = format!("{topic}-partition-{i}");
                match Box::pin(create_one(client.clone(), t, i as i32, opts.clone())).await {
                    Ok(p) => parts.push(p),
                    Err(e) => {
                        for p in &parts {
                            let _ = p.close().await;
                        }
                        return Err(e);
                    }
                }
            }
        }
        Ok(Producer {
            parts: parts.into(),
            topic: topic.into(),
            routing: opts.routing,
            counter: Arc::new(AtomicUsize::new(0)),
            fixed: rand::random::<u32>() as usize,
        })
    }
}

async fn create_one(
    client: Client,
    topic: String,
    partition: i32,
    opts: Options,
) -> Result<Arc<Shared>> {
    {
        let shared = Arc::new(Shared {
            partition,
            id: client.next_id(),
            permits: Arc::new(Semaphore::new(opts.max_pending)),
            client,
            topic,
            opts,
            closed: AtomicBool::new(false),
            reconnecting: AtomicBool::new(false),
            state: Mutex::new(State {
                conn: None,
                name: None,
                next_seq: 0,
                first_connect: true,
                failed: None,
                pending: VecDeque::new(),
                batch: Vec::new(),
                batch_bytes: 0,
                batch_started: None,
            }),
        });
        shared.clone().connect_once().await?;
        if shared.opts.batching {
            let weak = Arc::downgrade(&shared);
            let delay = shared.opts.batch_max_delay;
            tokio::spawn(batch_timer(weak, delay));
        }
        Ok(shared)
    }
}

async fn batch_timer(weak: Weak<Shared>, delay: Duration) {
    let mut tick = tokio::time::interval(delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(s) = weak.upgrade() else { return };
        if s.closed.load(Ordering::Acquire) {
            return;
        }
        let mut st = s.state.lock().await;
        if st.batch_started.is_some_and(|t| t.elapsed() >= delay) {
            s.flush_batch(&mut st).await;
        }
    }
}

type Waiter = (oneshot::Sender<Result<MessageId>>, OwnedSemaphorePermit);

struct PendingEntry {
    seq: u64,
    highest: u64,
    num: i32,
    entry: Bytes,
    batch: bool,
    waiters: Vec<Waiter>,
}

struct State {
    conn: Option<Connection>,
    name: Option<String>,
    next_seq: u64,
    first_connect: bool,
    failed: Option<String>,
    pending: VecDeque<PendingEntry>,
    batch: Vec<(ProducerMessage, Waiter)>,
    batch_bytes: usize,
    batch_started: Option<Instant>,
}

struct Shared {
    client: Client,
    topic: String,
    /// Partition index, -1 for a non-partitioned topic.
    partition: i32,
    id: u64,
    opts: Options,
    permits: Arc<Semaphore>,
    closed: AtomicBool,
    reconnecting: AtomicBool,
    state: Mutex<State>,
}

/// Publishes messages to one topic (all its partitions if it is
/// partitioned). Cheap to clone (clones share the producer).
#[derive(Clone)]
pub struct Producer {
    parts: Arc<[Arc<Shared>]>,
    topic: Arc<str>,
    routing: RoutingMode,
    counter: Arc<AtomicUsize>,
    fixed: usize,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("topic", &self.topic)
            .field("partitions", &self.parts.len())
            .finish()
    }
}

/// Completes with the message id once the broker has persisted the message.
pub struct SendFuture(oneshot::Receiver<Result<MessageId>>);

impl std::future::Future for SendFuture {
    type Output = Result<MessageId>;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.0
            .poll_unpin(cx)
            .map(|r| r.unwrap_or(Err(Error::Closed)))
    }
}

impl Producer {
    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Number of partitions written to (1 for a non-partitioned topic).
    pub fn partitions(&self) -> usize {
        self.parts.len()
    }

    /// The producer name (assigned by the broker if not set; of the first
    /// partition's producer on a partitioned topic).
    pub async fn name(&self) -> Option<String> {
        self.parts[0].state.lock().await.name.clone()
    }

    /// Publishes `msg` and waits for the broker's receipt.
    pub async fn send(&self, msg: impl Into<ProducerMessage>) -> Result<MessageId> {
        self.send_async(msg).await?.await
    }

    /// Queues `msg` and returns at once with a future of its receipt. Waits
    /// (or fails, per [`ProducerBuilder::block_if_queue_full`]) while
    /// `max_pending_messages` messages await receipts.
    pub async fn send_async(&self, msg: impl Into<ProducerMessage>) -> Result<SendFuture> {
        let msg = msg.into();
        let counter = self.counter.fetch_add(1, Ordering::Relaxed);
        let n = self.parts.len();
        let i = routing::choose(msg.key.as_deref(), n, self.routing, counter, self.fixed);
        self.parts[i].send_async(msg).await
    }

    /// Sends the current batches now.
    pub async fn flush(&self) -> Result<()> {
        for p in self.parts.iter() {
            let mut st = p.state.lock().await;
            p.flush_batch(&mut st).await;
        }
        Ok(())
    }

    /// Flushes, waits (at most the operation timeout) for outstanding
    /// receipts, then closes the producer on the broker; sends still without
    /// a receipt fail with [`Error::Closed`].
    pub async fn close(&self) -> Result<()> {
        let mut result = Ok(());
        for p in self.parts.iter() {
            if let Err(e) = p.close().await {
                result = Err(e);
            }
        }
        result
    }
}

impl Shared {
    async fn send_async(&self, msg: ProducerMessage) -> Result<SendFuture> {
        let s = self;
        if s.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if msg.payload.len() > ENTRY_MAX {
            return Err(Error::Payload(format!(
                "message of {} bytes exceeds the limit of {ENTRY_MAX}",
                msg.payload.len()
            )));
        }
        let permit = if s.opts.block_if_full {
            s.permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| Error::Closed)?
        } else {
            s.permits
                .clone()
                .try_acquire_owned()
                .map_err(|_| Error::ProducerQueueFull)?
        };
        let (tx, rx) = oneshot::channel();
        let mut st = s.state.lock().await;
        if let Some(f) = &st.failed {
            return Err(Error::Protocol(format!("producer failed: {f}")));
        }
        // Delayed messages go alone: a batch has one deliver_at.
        if s.opts.batching && msg.deliver_at.is_none() {
            let len = msg.payload.len();
            if !st.batch.is_empty() && st.batch_bytes + len > s.opts.batch_max_bytes {
                s.flush_batch(&mut st).await;
            }
            st.batch_bytes += len;
            st.batch.push((msg, (tx, permit)));
            if st.batch_started.is_none() {
                st.batch_started = Some(Instant::now());
            }
            if st.batch.len() >= s.opts.batch_max_messages
                || st.batch_bytes >= s.opts.batch_max_bytes
            {
                s.flush_batch(&mut st).await;
            }
        } else {
            if !st.batch.is_empty() {
                s.flush_batch(&mut st).await;
            }
            let seq = st.next_seq;
            let name = st.name.clone().unwrap_or_default();
            match single_entry_parts(&msg, &name, seq, s.opts.compression) {
                Ok((meta, payload)) => {
                    st.next_seq += 1;
                    let entry = PendingEntry {
                        seq,
                        highest: seq,
                        num: 1,
                        entry: entry_from_parts(&meta, &payload),
                        batch: false,
                        waiters: vec![(tx, permit)],
                    };
                    s.write(&st, &entry).await;
                    st.pending.push_back(entry);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        }
        Ok(SendFuture(rx))
    }

    async fn close(&self) -> Result<()> {
        let s = self;
        {
            let mut st = s.state.lock().await;
            s.flush_batch(&mut st).await;
        }
        // Give in-flight messages their receipts, within the operation timeout.
        let deadline = Instant::now() + s.client.opts().operation_timeout;
        while !s.state.lock().await.pending.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let conn = {
            let mut st = s.state.lock().await;
            s.flush_batch(&mut st).await;
            s.closed.store(true, Ordering::Release);
            for e in st.pending.drain(..) {
                for (tx, _) in e.waiters {
                    let _ = tx.send(Err(Error::Closed));
                }
            }
            st.conn.take()
        };
        s.permits.close();
        if let Some(conn) = conn {
            conn.unregister_producer(s.id);
            let rid = s.client.next_id();
            conn.request(rid, commands::close_producer(s.id, rid))
                .await?;
        }
        Ok(())
    }
}

impl Shared {
    /// Writes an entry if connected (otherwise it is resent after reconnect).
    async fn write(&self, st: &State, e: &PendingEntry) {
        if let Some(conn) = &st.conn {
            let mut cmd = commands::send(self.id, e.seq, e.num);
            if let Some(send) = cmd.send.as_mut()
                && e.batch
            {
                send.highest_sequence_id = Some(e.highest);
            }
            let frame = Frame::Payload(PayloadFrame {
                command: Box::new(cmd),
                broker_entry_metadata: None,
                checksum: ChecksumState::Valid,
                entry: e.entry.clone(),
            });
            // A closed connection is noticed by the reader; reconnect resends.
            let _ = conn.send_frame(frame).await;
        }
    }

    async fn flush_batch(&self, st: &mut State) {
        st.batch_started = None;
        st.batch_bytes = 0;
        if st.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut st.batch);
        let seq = st.next_seq;
        let name = st.name.clone().unwrap_or_default();
        let msgs: Vec<&ProducerMessage> = batch.iter().map(|(m, _)| m).collect();
        match batch_entry_parts(&msgs, &name, seq, self.opts.compression) {
            Ok((meta, payload)) => {
                let n = batch.len();
                st.next_seq += n as u64;
                let entry = PendingEntry {
                    seq,
                    highest: seq + n as u64 - 1,
                    num: n as i32,
                    entry: entry_from_parts(&meta, &payload),
                    batch: true,
                    waiters: batch.into_iter().map(|(_, w)| w).collect(),
                };
                self.write(st, &entry).await;
                st.pending.push_back(entry);
            }
            Err(e) => {
                for (_, (tx, _)) in batch {
                    let _ = tx.send(Err(Error::Payload(e.to_string())));
                }
            }
        }
    }

    /// One attempt to (re-)create the producer on the topic's broker and
    /// resend everything pending.
    async fn connect_once(self: Arc<Self>) -> Result<()> {
        let conn = self.client.lookup_connection(&self.topic).await?;
        let rid = self.client.next_id();
        let name = {
            let st = self.state.lock().await;
            st.name.clone().or_else(|| self.opts.name.clone())
        };
        let mut cmd = commands::producer(&self.topic, self.id, rid, name.as_deref());
        if let Some(p) = cmd.producer.as_mut() {
            p.producer_access_mode = Some(self.opts.access_mode as i32);
            p.user_provided_producer_name = Some(self.opts.name.is_some());
        }
        let resp = conn.request(rid, cmd).await?;
        let ps = resp
            .producer_success
            .ok_or_else(|| Error::Protocol("PRODUCER answered without PRODUCER_SUCCESS".into()))?;
        let mut st = self.state.lock().await;
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        st.name = Some(ps.producer_name.clone());
        if st.first_connect {
            st.first_connect = false;
            if let Some(last) = ps.last_sequence_id.filter(|l| *l >= 0) {
                st.next_seq = st.next_seq.max(last as u64 + 1);
            }
        }
        conn.register_producer(self.id, Arc::new(Sink(Arc::downgrade(&self))));
        st.conn = Some(conn);
        tracing::debug!(topic = %self.topic, producer = %ps.producer_name, resend = st.pending.len(), "producer ready");
        for e in &st.pending {
            self.write(&st, e).await;
        }
        Ok(())
    }

    /// Reconnects with backoff until it succeeds, the producer is closed, or
    /// the broker refuses for good (then every pending send fails).
    async fn reconnect(self: Arc<Self>) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let o = self.client.opts();
        let mut backoff = Backoff::new(o.backoff_initial, o.backoff_max);
        loop {
            if self.closed.load(Ordering::Acquire) {
                break;
            }
            tokio::time::sleep(backoff.next_jittered()).await;
            match self.clone().connect_once().await {
                Ok(()) => break,
                Err(e) if e.is_retriable() => {
                    tracing::info!(topic = %self.topic, error = %e, "producer reconnect failed, retrying");
                }
                Err(e) => {
                    tracing::warn!(topic = %self.topic, error = %e, "producer cannot reconnect");
                    let mut st = self.state.lock().await;
                    st.failed = Some(e.to_string());
                    for p in st.pending.drain(..) {
                        for (tx, _) in p.waiters {
                            let _ = tx.send(Err(Error::Protocol(format!("producer failed: {e}"))));
                        }
                    }
                    break;
                }
            }
        }
        self.reconnecting.store(false, Ordering::Release);
    }
}

struct Sink(Weak<Shared>);

impl ProducerSink for Sink {
    fn receipt(&self, r: CommandSendReceipt) -> BoxFuture<'static, ()> {
        let weak = self.0.clone();
        async move {
            let Some(s) = weak.upgrade() else { return };
            let mut st = s.state.lock().await;
            let Some(front) = st.pending.front() else {
                return;
            };
            if r.sequence_id < front.seq {
                return; // duplicate receipt after a resend
            }
            if r.sequence_id != front.seq {
                tracing::warn!(topic = %s.topic, got = r.sequence_id, expected = front.seq, "receipt out of order");
                return;
            }
            let Some(e) = st.pending.pop_front() else { return };
            let id = r.message_id.unwrap_or_default();
            for (i, (tx, _permit)) in e.waiters.into_iter().enumerate() {
                let (bi, bs) = if e.batch { (i as i32, e.num) } else { (-1, 0) };
                let mut mid = MessageId::from_data(&id, bi, bs);
                if s.partition >= 0 {
                    mid.partition = s.partition;
                }
                let _ = tx.send(Ok(mid));
            }
        }
        .boxed()
    }

    fn send_error(&self, err: CommandSendError) -> BoxFuture<'static, ()> {
        let weak = self.0.clone();
        async move {
            let Some(s) = weak.upgrade() else { return };
            let mut st = s.state.lock().await;
            if let Some(pos) = st.pending.iter().position(|e| e.seq == err.sequence_id)
                && let Some(e) = st.pending.remove(pos)
            {
                for (tx, _) in e.waiters {
                    let _ = tx.send(Err(Error::server(Some(err.error), err.message.clone())));
                }
            }
        }
        .boxed()
    }

    fn disconnected(&self, conn_id: u64) {
        let Some(s) = self.0.upgrade() else { return };
        tokio::spawn(async move {
            {
                let mut st = s.state.lock().await;
                match &st.conn {
                    Some(c) if c.id() == conn_id => st.conn = None,
                    _ => return,
                }
            }
            tracing::info!(topic = %s.topic, "producer disconnected, reconnecting");
            s.reconnect().await;
        });
    }
}
