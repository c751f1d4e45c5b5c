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
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc;

use super::backoff::Backoff;
use super::client::Client;
use super::connection::{Connection, ConsumerSink};
use super::error::{Error, Result};
use super::message::{Message, MessageId, unpack};
use crate::proto::commands;
use crate::proto::frame::{Frame, PayloadFrame, parse_entry};
use crate::proto::pulsar::command_ack::AckType;
use crate::proto::pulsar::command_subscribe::{InitialPosition, SubType};

#[derive(Debug, Clone)]
struct Options {
    sub_type: SubType,
    initial_position: InitialPosition,
    receiver_queue: u32,
    name: Option<String>,
    nack_delay: Duration,
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

    /// Subscribes.
    pub async fn subscribe(self) -> Result<Consumer> {
        let ConsumerBuilder {
            client,
            topic,
            subscription,
            opts,
        } = self;
        let (tx, rx) = mpsc::channel(opts.receiver_queue as usize + 64);
        let shared = Arc::new(Shared {
            id: client.next_id(),
            client,
            topic,
            subscription,
            opts,
            closed: AtomicBool::new(false),
            reconnecting: AtomicBool::new(false),
            conn: Mutex::new(None),
            epoch: AtomicU64::new(0),
            tx,
            batches: Mutex::new(HashMap::new()),
        });
        shared.clone().subscribe_once().await?;
        Ok(Consumer {
            shared,
            rx,
            local: VecDeque::new(),
            delivered: 0,
            flow_epoch: 0,
        })
    }
}

struct Shared {
    client: Client,
    topic: String,
    subscription: String,
    id: u64,
    opts: Options,
    closed: AtomicBool,
    reconnecting: AtomicBool,
    conn: Mutex<Option<Connection>>,
    /// Id of the connection the current subscription lives on.
    epoch: AtomicU64,
    tx: mpsc::Sender<(u64, PayloadFrame)>,
    /// Batch entries with messages not yet acknowledged: remaining count.
    batches: Mutex<HashMap<(u64, u64), i32>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Receives messages; also a `Stream` of `Result<Message>`.
pub struct Consumer {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<(u64, PayloadFrame)>,
    local: VecDeque<(u64, Message)>,
    delivered: u32,
    flow_epoch: u64,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("topic", &self.shared.topic)
            .field("subscription", &self.shared.subscription)
            .finish()
    }
}

impl Consumer {
    /// The topic.
    pub fn topic(&self) -> &str {
        &self.shared.topic
    }

    /// Waits for the next message.
    pub async fn receive(&mut self) -> Result<Message> {
        futures::future::poll_fn(|cx| self.poll_message(cx)).await
    }

    fn poll_message(&mut self, cx: &mut Context<'_>) -> Poll<Result<Message>> {
        loop {
            if self.shared.closed.load(Ordering::Acquire) {
                return Poll::Ready(Err(Error::Closed));
            }
            let epoch = self.shared.epoch.load(Ordering::Acquire);
            if let Some((e, m)) = self.local.pop_front() {
                if e != epoch {
                    continue;
                }
                self.after_deliver(epoch);
                return Poll::Ready(Ok(m));
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some((e, frame))) => {
                    if e != epoch {
                        continue;
                    }
                    if let Err(err) = self.take_entry(e, &frame) {
                        tracing::warn!(topic = %self.shared.topic, error = %err, "dropping undecodable entry");
                        return Poll::Ready(Err(err));
                    }
                }
                Poll::Ready(None) => return Poll::Ready(Err(Error::Closed)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn take_entry(&mut self, epoch: u64, frame: &PayloadFrame) -> Result<()> {
        let m = frame
            .command
            .message
            .as_ref()
            .ok_or_else(|| Error::Protocol("payload frame without MESSAGE".into()))?;
        let parsed = parse_entry(&frame.entry)?;
        let msgs = unpack(
            &self.shared.topic,
            &m.message_id,
            &parsed.metadata,
            parsed.payload(&frame.entry),
            m.redelivery_count.unwrap_or(0),
        );
        let msgs = match msgs {
            Ok(v) => v,
            Err(e) => {
                // Permits were spent on it: count them so flow continues.
                self.delivered += parsed.num_messages();
                return Err(e);
            }
        };
        if parsed.is_batch() {
            lock(&self.shared.batches).insert(
                (m.message_id.ledger_id, m.message_id.entry_id),
                msgs.len() as i32,
            );
        }
        self.local.extend(msgs.into_iter().map(|m| (epoch, m)));
        Ok(())
    }

    fn after_deliver(&mut self, epoch: u64) {
        if self.flow_epoch != epoch {
            self.flow_epoch = epoch;
            self.delivered = 0;
        }
        self.delivered += 1;
        let half = (self.shared.opts.receiver_queue / 2).max(1);
        if self.delivered >= half {
            let conn = lock(&self.shared.conn).clone();
            if let Some(c) = conn
                && c.try_send_frame(Frame::Command(commands::flow(
                    self.shared.id,
                    self.delivered,
                )))
            {
                self.delivered = 0;
            }
        }
    }

    fn conn(&self) -> Result<Connection> {
        lock(&self.shared.conn)
            .clone()
            .ok_or_else(|| Error::Disconnected(self.shared.topic.clone()))
    }

    /// Acknowledges one message. A message of a batch acknowledges its entry
    /// once every message of the batch is acknowledged.
    pub async fn ack(&self, id: &MessageId) -> Result<()> {
        if id.batch_size > 0 {
            let mut b = lock(&self.shared.batches);
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
        let c = self.conn()?;
        c.send_frame(Frame::Command(commands::ack(
            self.shared.id,
            AckType::Individual,
            vec![id.to_data()],
            None,
        )))
        .await
    }

    /// Acknowledges every message up to and including `id`.
    pub async fn ack_cumulative(&self, id: &MessageId) -> Result<()> {
        let mut target = *id;
        if id.batch_size > 0 && id.batch_index < id.batch_size - 1 {
            // Part of a batch: only the entries before it are complete.
            if id.entry_id == 0 {
                return Ok(());
            }
            target.entry_id -= 1;
        }
        let c = self.conn()?;
        c.send_frame(Frame::Command(commands::ack(
            self.shared.id,
            AckType::Cumulative,
            vec![target.to_data()],
            None,
        )))
        .await
    }

    /// Asks for redelivery of `id` (its whole entry) after the negative-ack delay.
    pub fn negative_ack(&self, id: &MessageId) {
        let shared = Arc::downgrade(&self.shared);
        let data = id.to_data();
        let delay = self.shared.opts.nack_delay;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let Some(s) = shared.upgrade() else { return };
            lock(&s.batches).remove(&(data.ledger_id, data.entry_id));
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

    /// Removes the subscription.
    pub async fn unsubscribe(&self) -> Result<()> {
        let c = self.conn()?;
        let rid = self.shared.client.next_id();
        c.request(rid, commands::unsubscribe(self.shared.id, rid))
            .await?;
        self.shared.closed.store(true, Ordering::Release);
        c.unregister_consumer(self.shared.id);
        Ok(())
    }

    /// Closes the consumer (the subscription stays).
    pub async fn close(&self) -> Result<()> {
        self.shared.closed.store(true, Ordering::Release);
        let conn = lock(&self.shared.conn).take();
        if let Some(c) = conn {
            c.unregister_consumer(self.shared.id);
            let rid = self.shared.client.next_id();
            c.request(rid, commands::close_consumer(self.shared.id, rid))
                .await?;
        }
        Ok(())
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
        }
        // Registered first: the sink ignores nothing, and no message flows
        // before FLOW anyway.
        conn.register_consumer(self.id, Arc::new(Sink(Arc::downgrade(&self))));
        if let Err(e) = conn.request(rid, cmd).await {
            conn.unregister_consumer(self.id);
            return Err(e);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.epoch.store(conn.id(), Ordering::Release);
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

struct Sink(Weak<Shared>);

impl ConsumerSink for Sink {
    fn message(&self, conn_id: u64, frame: PayloadFrame) -> BoxFuture<'static, ()> {
        let weak = self.0.clone();
        async move {
            let Some(s) = weak.upgrade() else { return };
            let tx = s.tx.clone();
            drop(s);
            let _ = tx.send((conn_id, frame)).await;
        }
        .boxed()
    }

    fn disconnected(&self, conn_id: u64) {
        let Some(s) = self.0.upgrade() else { return };
        if s.epoch.load(Ordering::Acquire) != conn_id || s.closed.load(Ordering::Acquire) {
            return;
        }
        *lock(&s.conn) = None;
        tracing::info!(topic = %s.topic, "consumer disconnected, re-subscribing");
        tokio::spawn(s.reconnect());
    }
}
