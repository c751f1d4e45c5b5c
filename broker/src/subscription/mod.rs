//! Subscriptions (issue 7 item 4): the async layer that carries out a
//! [`Dispatcher`] over a managed cursor. One [`Subscription`] per (topic,
//! subscription name), durable (a stored cursor) or not (a reader); it owns
//! the cursor and the dispatcher and runs one read task.
//!
//! Usable without any codec: entries are opaque `Bytes`; the number of
//! messages in an entry comes from the caller's [`MessageCounter`]; consumers
//! are bounded `mpsc` sinks of [`Delivery`] owned by their connections.
//!
//! Promises:
//! - nothing is sent before FLOW, and nothing beyond a consumer's permits
//!   (an entry needs permits > 0 and takes its message count);
//! - the read task reads only when some consumer can take entries, at most
//!   `read_entries_max` entries per read, from the cursor (new entries,
//!   tailing with the managed ledger's wait) or exactly the positions to
//!   redeliver; it is the only writer of the cursor's read position except
//!   [`Subscription::seek`], and the two never overlap (one I/O lock);
//! - an ack reaches the cursor before the call returns (its persistence is
//!   rate-bounded by the managed-ledger layer; invariant 6: only acks move
//!   the mark-delete);
//! - a full sink pauses that consumer (its entry goes back for redelivery,
//!   permits returned) until the sink has room again; a closed sink
//!   detaches the consumer; nothing blocks on one slow connection;
//! - opening a subscription object rewinds its cursor: every unacknowledged
//!   entry is delivered again (at-least-once after a reconnect);
//! - the cursor is active (keeps what is appended in the broker's entry
//!   cache) exactly while consumers are attached, as Pulsar's are.
//!
//! - delayed delivery (Shared, Key_Shared): the read task gives the
//!   dispatcher the wall clock and wakes when the earliest held entry is
//!   due; held entries stay unacked in the cursor, so a reopened
//!   subscription re-reads and holds them again.
//!
//! Not yet: Failover's `activeConsumerFailoverDelayTimeMillis` (the switch is
//! immediate), dispatch rate limits.

mod read_loop;
mod types;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, mpsc};
use tracing::{debug, info, warn};

pub use types::{
    ConsumerSpec, DeliverAt, Delivery, KeyHasher, MessageCounter, ReadBudget, StartPosition,
    SubError, SubscriptionConfig, SubscriptionStats,
};

use crate::dispatch::{ConsumerId, ConsumerInfo, Dispatcher, Event};
use crate::managed_ledger::io::{ManagedCursor, ManagedLedger, MlError, Persist, SeekTarget};
use crate::managed_ledger::{InitialPosition, Position};

struct State {
    d: Dispatcher,
    sinks: HashMap<ConsumerId, mpsc::Sender<Delivery>>,
    closed: bool,
    failed: Option<MlError>,
}

struct Inner {
    topic: String,
    name: String,
    durable: bool,
    ml: ManagedLedger,
    cursor: ManagedCursor,
    counter: MessageCounter,
    config: SubscriptionConfig,
    state: Mutex<State>,
    wake: Arc<Notify>,
    /// Held by the read task around cursor reads and by seek.
    io: tokio::sync::Mutex<()>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One subscription of a topic (cheap to clone; clones share it). Dropping
/// every clone stops its read task within `tail_wait_ms`; [`Self::close`]
/// also persists the cursor.
#[derive(Clone)]
pub struct Subscription {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("topic", &self.inner.topic)
            .field("name", &self.inner.name)
            .field("durable", &self.inner.durable)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// Opens durable subscription `name` of `ml` (restoring its cursor, or
    /// creating it at `initial`) and starts its read task. Every entry not
    /// acknowledged is delivered again.
    pub async fn open_durable(
        ml: &ManagedLedger,
        name: &str,
        initial: InitialPosition,
        counter: MessageCounter,
        config: SubscriptionConfig,
    ) -> Result<Self, SubError> {
        let cursor = ml.open_cursor(name, initial).await?;
        cursor.rewind()?;
        Ok(Self::start(ml, cursor, true, counter, config))
    }

    /// Opens non-durable subscription (reader) `name` of `ml` at `start`
    /// and starts its read task. The name must not be used by another
    /// cursor of `ml` (readers get generated names).
    pub async fn open_non_durable(
        ml: &ManagedLedger,
        name: &str,
        start: StartPosition,
        counter: MessageCounter,
        config: SubscriptionConfig,
    ) -> Result<Self, SubError> {
        let initial = match start {
            StartPosition::Earliest => InitialPosition::Earliest,
            StartPosition::Latest | StartPosition::At(_) => InitialPosition::Latest,
        };
        let cursor = ml.open_non_durable_cursor(name, initial);
        if let StartPosition::At(p) = start
            && let Err(e) = cursor.seek(SeekTarget::Position(p)).await
        {
            ml.delete_cursor(name).await?;
            return Err(e.into());
        }
        Ok(Self::start(ml, cursor, false, counter, config))
    }

    fn start(
        ml: &ManagedLedger,
        cursor: ManagedCursor,
        durable: bool,
        counter: MessageCounter,
        config: SubscriptionConfig,
    ) -> Self {
        let wake = Arc::new(Notify::new());
        let inner = Arc::new(Inner {
            topic: ml.name().to_string(),
            name: cursor.name().to_string(),
            durable,
            ml: ml.clone(),
            cursor,
            counter,
            state: Mutex::new(State {
                d: Dispatcher::new(config.limits.clone()),
                sinks: HashMap::new(),
                closed: false,
                failed: None,
            }),
            config,
            wake: wake.clone(),
            io: tokio::sync::Mutex::new(()),
            task: Mutex::new(None),
        });
        // No consumers yet: the cursor holds nothing in the entry cache.
        inner.sync_active(&lock(&inner.state));
        let task = tokio::spawn(read_loop::run(Arc::downgrade(&inner), wake));
        *lock(&inner.task) = Some(task);
        info!(topic = %inner.topic, subscription = %inner.name, durable, "subscription opened");
        Self { inner }
    }

    /// Whether `other` is a clone of this very subscription object.
    pub fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The subscription name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The topic (managed ledger name).
    pub fn topic(&self) -> &str {
        &self.inner.topic
    }

    /// Durable (stored cursor) or a reader.
    pub fn is_durable(&self) -> bool {
        self.inner.durable
    }

    /// Consumers attached now.
    pub fn consumer_count(&self) -> usize {
        lock(&self.inner.state).d.consumer_ids().len()
    }

    fn state(&self) -> Result<MutexGuard<'_, State>, SubError> {
        let st = lock(&self.inner.state);
        if st.closed {
            return Err(SubError::Closed(self.inner.name.clone()));
        }
        Ok(st)
    }

    /// Attaches a consumer (no permits until [`Self::flow`]). Refused:
    /// a second consumer on Exclusive, another type than the attached
    /// consumers', an attached id, over the consumer limit.
    pub fn add_consumer(&self, spec: ConsumerSpec) -> Result<(), SubError> {
        let mut st = self.state()?;
        let events = st.d.add_consumer(ConsumerInfo {
            id: spec.id,
            name: spec.name.clone(),
            priority: spec.priority,
            sub_type: spec.sub_type,
            key_shared: spec.key_shared.clone(),
        })?;
        st.sinks.insert(spec.id, spec.sink);
        emit(&st, events);
        self.inner.sync_active(&st);
        drop(st);
        info!(topic = %self.inner.topic, subscription = %self.inner.name, consumer = %spec.id,
            name = %spec.name, sub_type = %spec.sub_type, "consumer attached");
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Detaches a consumer; its unacknowledged entries are redelivered.
    pub fn remove_consumer(&self, id: ConsumerId) -> Result<(), SubError> {
        let mut st = self.state()?;
        detach(&self.inner, &mut st, id)?;
        drop(st);
        info!(topic = %self.inner.topic, subscription = %self.inner.name, consumer = %id, "consumer detached");
        self.inner.wake.notify_one();
        Ok(())
    }

    /// FLOW: `permits` more messages for the consumer.
    pub fn flow(&self, id: ConsumerId, permits: u32) -> Result<(), SubError> {
        self.state()?.d.flow(id, permits)?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Individual acks. Every position is acked on the cursor (positions at
    /// or before the mark-delete are no-ops); the first error is returned
    /// after trying them all. A due cursor snapshot is written as `persist`
    /// says (a connection passes `Background` unless the client asked for
    /// an ack receipt).
    pub async fn ack_individual(
        &self,
        id: ConsumerId,
        positions: &[Position],
        persist: Persist,
    ) -> Result<(), SubError> {
        if !self.state()?.d.has_consumer(id) {
            return Err(crate::dispatch::DispatchError::UnknownConsumer(id).into());
        }
        let mut first_err = None;
        for &p in positions {
            if let Err(e) = self.inner.cursor.ack(p, persist).await {
                debug!(topic = %self.inner.topic, subscription = %self.inner.name, position = %p, error = %e, "ack refused");
                first_err.get_or_insert(e);
            }
        }
        {
            let mut st = lock(&self.inner.state);
            // The consumer may have left meanwhile: the cursor has the acks.
            let _ = st.d.ack(id, positions);
        }
        self.inner.wake.notify_one();
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// A batch-index ack: some messages of the batch entry at `position`
    /// (`ack_set`: Pulsar's bit set, 1 = left unacked). When none is left
    /// the entry is acked like [`Self::ack_individual`].
    pub async fn ack_batch_index(
        &self,
        id: ConsumerId,
        position: Position,
        ack_set: &[i64],
        persist: Persist,
    ) -> Result<(), SubError> {
        if !self.state()?.d.has_consumer(id) {
            return Err(crate::dispatch::DispatchError::UnknownConsumer(id).into());
        }
        self.inner
            .cursor
            .ack_batch_index(position, ack_set, persist)
            .await?;
        if self.inner.cursor.is_acked(position)? {
            let mut st = lock(&self.inner.state);
            let _ = st.d.ack(id, &[position]);
            drop(st);
            self.inner.wake.notify_one();
        }
        Ok(())
    }

    /// A cumulative ack up to `position` (refused on Shared).
    pub async fn ack_cumulative(
        &self,
        id: ConsumerId,
        position: Position,
        persist: Persist,
    ) -> Result<(), SubError> {
        {
            let st = self.state()?;
            if !st.d.has_consumer(id) {
                return Err(crate::dispatch::DispatchError::UnknownConsumer(id).into());
            }
            if st.d.sub_type().is_some_and(|t| !t.allows_cumulative_ack()) {
                return Err(crate::dispatch::DispatchError::CumulativeAckOnShared.into());
            }
        }
        self.inner.cursor.ack_cumulative(position, persist).await?;
        {
            let mut st = lock(&self.inner.state);
            let _ = st.d.ack_cumulative(id, position);
        }
        self.inner.wake.notify_one();
        Ok(())
    }

    /// REDELIVER_UNACKNOWLEDGED_MESSAGES: Shared re-queues the listed
    /// positions the consumer holds (all without a list); Exclusive and
    /// Failover rewind every unacknowledged entry. Counts rise by one.
    pub fn redeliver(
        &self,
        id: ConsumerId,
        positions: Option<Vec<Position>>,
    ) -> Result<(), SubError> {
        self.state()?.d.redeliver(id, positions.as_deref())?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Moves the cursor (forgetting individual acks) and rewinds the
    /// consumers: deliveries in flight are forgotten, redelivery counts
    /// reset; permits stay.
    pub async fn seek(&self, target: SeekTarget) -> Result<(), SubError> {
        drop(self.state()?);
        let _io = self.inner.io.lock().await;
        self.inner.cursor.seek(target).await?;
        lock(&self.inner.state).d.reset();
        info!(topic = %self.inner.topic, subscription = %self.inner.name, ?target, "subscription seeked");
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Moves the cursor to the first entry published at or after
    /// `target_ms` (`publish_time_ms` reads an entry's publish time; the end
    /// when none is), like [`Self::seek`]. Returns the position found.
    pub async fn seek_publish_time(
        &self,
        target_ms: u64,
        publish_time_ms: impl Fn(&[u8]) -> Option<u64>,
    ) -> Result<Option<Position>, SubError> {
        drop(self.state()?);
        let _io = self.inner.io.lock().await;
        let found = self
            .inner
            .cursor
            .seek_publish_time(target_ms, publish_time_ms)
            .await?;
        lock(&self.inner.state).d.reset();
        info!(topic = %self.inner.topic, subscription = %self.inner.name, target_ms, ?found, "subscription seeked by publish time");
        self.inner.wake.notify_one();
        Ok(found)
    }

    /// Deletes the subscription (its cursor) and closes it. Refused while a
    /// consumer other than `requester` is attached.
    pub async fn unsubscribe(&self, requester: Option<ConsumerId>) -> Result<(), SubError> {
        {
            let mut st = self.state()?;
            let others =
                st.d.consumer_ids()
                    .into_iter()
                    .filter(|c| Some(*c) != requester)
                    .count();
            if others > 0 {
                return Err(SubError::OtherConsumersConnected {
                    subscription: self.inner.name.clone(),
                    others,
                });
            }
            st.closed = true;
        }
        self.stop().await;
        self.inner.ml.delete_cursor(&self.inner.name).await?;
        info!(topic = %self.inner.topic, subscription = %self.inner.name, "unsubscribed");
        Ok(())
    }

    /// Closes: stops the read task, detaches every consumer, and persists the
    /// cursor (a reader's cursor is dropped). Idempotent.
    pub async fn close(&self) -> Result<(), SubError> {
        {
            let mut st = lock(&self.inner.state);
            if st.closed {
                return Ok(());
            }
            st.closed = true;
        }
        self.stop().await;
        if self.inner.durable {
            let _ = self.inner.cursor.set_active(false);
            self.inner.cursor.persist().await?;
        } else {
            self.inner.ml.delete_cursor(&self.inner.name).await?;
        }
        info!(topic = %self.inner.topic, subscription = %self.inner.name, "subscription closed");
        Ok(())
    }

    async fn stop(&self) {
        self.inner.wake.notify_one();
        let task = lock(&self.inner.task).take();
        if let Some(task) = task
            && let Err(e) = task.await
        {
            warn!(topic = %self.inner.topic, subscription = %self.inner.name, error = %e, "read task ended abnormally");
        }
        let mut st = lock(&self.inner.state);
        for id in st.d.consumer_ids() {
            let _ = st.d.remove_consumer(id);
        }
        st.sinks.clear();
    }

    /// Current figures.
    pub fn stats(&self) -> SubscriptionStats {
        let c = &self.inner.cursor;
        let (dispatcher, failed) = {
            let st = lock(&self.inner.state);
            (st.d.stats(), st.failed.as_ref().map(ToString::to_string))
        };
        SubscriptionStats {
            name: self.inner.name.clone(),
            durable: self.inner.durable,
            msg_backlog: c.backlog_entries().unwrap_or(0),
            mark_delete: c.mark_delete().unwrap_or(Position::new(0, -1)),
            read_position: c.read_position().unwrap_or(Position::new(0, -1)),
            dispatcher,
            failed,
        }
    }
}

/// Detaches `id` and tells the others what changed.
fn detach(inner: &Inner, st: &mut State, id: ConsumerId) -> Result<(), SubError> {
    let events = st.d.remove_consumer(id)?;
    st.sinks.remove(&id);
    emit(st, events);
    inner.sync_active(st);
    Ok(())
}

impl Inner {
    /// The cursor is active (holds tailing entries in the broker's entry
    /// cache) exactly while consumers are attached (Pulsar's active
    /// cursors). A closed cursor's error is moot here.
    fn sync_active(&self, st: &State) {
        let _ = self
            .cursor
            .set_active(!st.closed && !st.d.consumer_ids().is_empty());
    }
}

/// Sends Failover notifications (queued behind a full sink, never dropped
/// while the sink is open).
fn emit(st: &State, events: Vec<Event>) {
    for Event::ActiveChanged {
        consumer,
        is_active,
    } in events
    {
        let Some(sink) = st.sinks.get(&consumer) else {
            continue;
        };
        let d = Delivery::ActiveChanged {
            consumer_id: consumer,
            is_active,
        };
        if let Err(mpsc::error::TrySendError::Full(d)) = sink.try_send(d) {
            let sink = sink.clone();
            tokio::spawn(async move {
                let _ = sink.send(d).await;
            });
        }
    }
}
