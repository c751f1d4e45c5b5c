//! [`Dispatcher`]: one subscription's dispatch state (see the module doc for
//! its promises and bounds). The caller drives it:
//!
//! 1. inputs: [`Dispatcher::add_consumer`] / [`Dispatcher::remove_consumer`]
//!    (returning Failover's [`Event`]s), [`Dispatcher::flow`],
//!    [`Dispatcher::ack`], [`Dispatcher::ack_cumulative`],
//!    [`Dispatcher::redeliver`], [`Dispatcher::reset`] (after a seek);
//! 2. [`Dispatcher::next_read`] says what to read now, if anything: rewind
//!    the cursor's read position, re-read given positions, or read new
//!    entries; at most one read is outstanding;
//! 3. [`Dispatcher::read_done`] (or [`Dispatcher::read_failed`]) with what was
//!    read returns the [`Assignment`]s to carry out; a send that cannot be carried
//!    out goes back with [`Dispatcher::send_failed`].
//!
//! A read answered after a rewind or reset was requested (its ticket is from
//! an older epoch) is dropped whole: the rewind or seek re-reads it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::failover::select_active;
use super::key_shared::Selector;
use super::types::{
    ConsumerId, ConsumerInfo, DispatchError, DispatchLimits, SubType, check_admission,
};
use crate::managed_ledger::Position;

/// Something the caller must tell consumers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Failover: the consumer is now (not) the active one.
    ActiveChanged {
        /// Who to tell.
        consumer: ConsumerId,
        /// Whether it is the active consumer.
        is_active: bool,
    },
}

/// What to read next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadPlan {
    /// Move the cursor's read position back to its mark-delete (nothing is
    /// read); answer with no entries.
    Rewind,
    /// Read exactly these positions (ascending), skipping acknowledged ones.
    Replay(Vec<Position>),
    /// Read up to `entries_max` new entries after the cursor's read position.
    Next {
        /// Entries at most.
        entries_max: usize,
    },
}

/// An outstanding read: hand it back to [`Dispatcher::read_done`] or
/// [`Dispatcher::read_failed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadTicket {
    epoch: u64,
    plan: ReadPlan,
}

impl ReadTicket {
    /// What to read.
    pub fn plan(&self) -> &ReadPlan {
        &self.plan
    }
}

/// An entry read, with the number of messages it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadEntry<T> {
    /// Its position.
    pub position: Position,
    /// Messages in it (a batch counts its messages; 0 is taken as 1).
    pub messages: u32,
    /// Its sticky key hash (Key_Shared; see [`super::key_shared`]).
    pub key_hash: u16,
    /// Delayed delivery: not before this time (Unix ms, Pulsar
    /// `deliver_at_time`); honoured on Shared and Key_Shared only.
    pub deliver_at_ms: Option<u64>,
    /// The caller's payload, passed through.
    pub payload: T,
}

/// An entry to send to a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment<T> {
    /// To whom.
    pub consumer: ConsumerId,
    /// The entry's position.
    pub position: Position,
    /// Messages in it (permits taken).
    pub messages: u32,
    /// Times it was delivered and taken back before.
    pub redelivery_count: u32,
    /// The caller's payload.
    pub payload: T,
}

/// One consumer's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Its identity.
    pub id: ConsumerId,
    /// Its name.
    pub name: String,
    /// Its priority level.
    pub priority: i32,
    /// Permits left (messages; negative after a batch larger than them).
    pub permits: i64,
    /// Messages delivered and not acknowledged.
    pub unacked_messages: u64,
    /// Blocked on its unacked limit.
    pub blocked: bool,
    /// False while its sink is full.
    pub writable: bool,
    /// The active consumer (single-active types).
    pub is_active: bool,
}

/// The dispatcher's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatcherStats {
    /// The type of the attached consumers (`None` without consumers).
    pub sub_type: Option<SubType>,
    /// The active consumer (single-active types).
    pub active: Option<ConsumerId>,
    /// Messages delivered and not acknowledged.
    pub unacked_messages: u64,
    /// Entries delivered and not acknowledged.
    pub pending_entries: usize,
    /// Dispatching stopped on the subscription's unacked limit.
    pub blocked: bool,
    /// Entries waiting for redelivery.
    pub replay_entries: usize,
    /// Positions with a redelivery count.
    pub redelivery_counts: usize,
    /// Key_Shared: hashes with delivered, unacked entries (each blocks
    /// delivery of its hash to any other consumer until acked).
    pub draining_hashes: usize,
    /// Count increments dropped at `redelivery_counts_max`.
    pub redelivery_counts_dropped: u64,
    /// Delayed entries read and held until their delivery time.
    pub delayed_entries: usize,
    /// Per consumer, in join order.
    pub consumers: Vec<ConsumerStats>,
}

#[derive(Debug)]
struct Consumer {
    info: ConsumerInfo,
    permits: i64,
    unacked: u64,
    blocked: bool,
    writable: bool,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    consumer: ConsumerId,
    messages: u32,
}

/// One subscription's dispatch state machine.
#[derive(Debug)]
pub struct Dispatcher {
    limits: DispatchLimits,
    sub_type: Option<SubType>,
    /// Join order = round-robin order.
    consumers: Vec<Consumer>,
    active: Option<ConsumerId>,
    rr_next: usize,
    rr_given: u32,
    pending: BTreeMap<Position, Pending>,
    unacked_total: u64,
    blocked: bool,
    replay: BTreeSet<Position>,
    counts: BTreeMap<Position, u32>,
    counts_dropped: u64,
    read_in_flight: bool,
    /// Replay positions of the outstanding read (an ack removes them).
    reading_replay: BTreeSet<Position>,
    rewind_requested: bool,
    epoch: u64,
    /// Key_Shared: who owns each hash.
    selector: Selector,
    /// Key_Shared: the hash of every pending or replay entry.
    hashes: HashMap<Position, u16>,
    /// Key_Shared (ordered): hash -> the consumer holding delivered, unacked
    /// entries of it, and how many.
    draining: HashMap<u16, (ConsumerId, u32)>,
    /// The caller's clock (Unix ms), as of the last [`Dispatcher::advance_clock`].
    now_ms: u64,
    /// Delayed delivery: entries read but not due, by (due time, position).
    delayed: BTreeSet<(u64, Position)>,
    /// Delayed delivery: position -> due time (the same entries as `delayed`).
    delayed_at: HashMap<Position, u64>,
    /// Running mean of messages per entry read (batches hold many), so a
    /// read asks for about as many entries as the permits (counted in
    /// messages) can take: Pulsar's `avgMessagesPerEntry`. Entries read
    /// beyond the permits go to the replay set and are read again.
    messages_per_entry: f64,
}

impl Dispatcher {
    /// An empty dispatcher.
    pub fn new(limits: DispatchLimits) -> Self {
        Self {
            limits,
            sub_type: None,
            consumers: Vec::new(),
            active: None,
            rr_next: 0,
            rr_given: 0,
            pending: BTreeMap::new(),
            unacked_total: 0,
            blocked: false,
            replay: BTreeSet::new(),
            counts: BTreeMap::new(),
            counts_dropped: 0,
            read_in_flight: false,
            reading_replay: BTreeSet::new(),
            rewind_requested: false,
            epoch: 0,
            selector: Selector::new(),
            hashes: HashMap::new(),
            draining: HashMap::new(),
            now_ms: 0,
            delayed: BTreeSet::new(),
            delayed_at: HashMap::new(),
            messages_per_entry: 1.0,
        }
    }

    /// Sets the clock (Unix ms) the delayed-delivery tracker compares with;
    /// entries now due are queued for delivery (replay, position order).
    pub fn advance_clock(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        while let Some(&(at, pos)) = self.delayed.first() {
            if at > now_ms {
                break;
            }
            self.delayed.pop_first();
            self.delayed_at.remove(&pos);
            self.replay.insert(pos);
        }
    }

    /// The earliest due time (Unix ms) of a held delayed entry: the caller's
    /// timer should call [`Self::advance_clock`] then.
    pub fn next_delayed_due(&self) -> Option<u64> {
        self.delayed.first().map(|(at, _)| *at)
    }

    /// Delayed entries held now.
    pub fn delayed_len(&self) -> usize {
        self.delayed.len()
    }

    fn forget_delayed(&mut self) {
        self.delayed.clear();
        self.delayed_at.clear();
    }

    fn untrack_delayed(&mut self, pos: Position) {
        if let Some(at) = self.delayed_at.remove(&pos) {
            self.delayed.remove(&(at, pos));
        }
    }

    /// Whether new entries may be read: not while the delayed tracker is at
    /// its bound (entries already held still come due and go out).
    fn may_read_new(&self) -> bool {
        self.delayed.len() < self.limits.delayed_entries_max
    }

    /// Its limits.
    pub fn limits(&self) -> &DispatchLimits {
        &self.limits
    }

    /// The type of the attached consumers.
    pub fn sub_type(&self) -> Option<SubType> {
        self.sub_type
    }

    /// The active consumer (Exclusive: the consumer; Failover: the chosen one).
    pub fn active(&self) -> Option<ConsumerId> {
        self.active
    }

    /// True if `id` is attached.
    pub fn has_consumer(&self, id: ConsumerId) -> bool {
        self.idx(id).is_ok()
    }

    /// Attached consumers, in join order.
    pub fn consumer_ids(&self) -> Vec<ConsumerId> {
        self.consumers.iter().map(|c| c.info.id).collect()
    }

    /// The redelivery count of `pos`.
    pub fn redelivery_count(&self, pos: Position) -> u32 {
        self.counts.get(&pos).copied().unwrap_or(0)
    }

    fn idx(&self, id: ConsumerId) -> Result<usize, DispatchError> {
        self.consumers
            .iter()
            .position(|c| c.info.id == id)
            .ok_or(DispatchError::UnknownConsumer(id))
    }

    /// Attaches a consumer (with no permits). Exclusive refuses a second
    /// consumer; a type other than the attached consumers' is refused.
    pub fn add_consumer(&mut self, info: ConsumerInfo) -> Result<Vec<Event>, DispatchError> {
        check_admission(
            self.sub_type,
            self.consumers.iter().map(|c| &c.info),
            self.limits.consumers_max,
            &info,
        )?;
        if info.sub_type == SubType::KeyShared {
            let spec = info.key_shared.clone().unwrap_or_default();
            self.selector.add(info.id, &info.name, &spec)?;
        }
        let id = info.id;
        if info.sub_type.is_single_active() && !self.delayed.is_empty() {
            // Exclusive / Failover ignore delivery times: what was held is
            // read again, in topic order.
            self.request_rewind();
        }
        self.sub_type = Some(info.sub_type);
        self.consumers.push(Consumer {
            info,
            permits: 0,
            unacked: 0,
            blocked: false,
            writable: true,
        });
        Ok(self.update_active(Some(id)))
    }

    /// Detaches a consumer: Shared re-queues its unacked entries for the
    /// others; single-active types rewind (every unacked entry is redelivered).
    pub fn remove_consumer(&mut self, id: ConsumerId) -> Result<Vec<Event>, DispatchError> {
        let i = self.idx(id)?;
        let gone = self.consumers.remove(i);
        if i < self.rr_next {
            self.rr_next -= 1;
        } else if i == self.rr_next {
            self.rr_given = 0;
        }
        if self.rr_next >= self.consumers.len() {
            self.rr_next = 0;
        }
        self.selector.remove(id);
        match self.sub_type {
            Some(SubType::Shared | SubType::KeyShared) => {
                // Key_Shared: redelivered in position order to the new owners
                // of their hashes, before newer entries of those hashes.
                let mine: Vec<Position> = self
                    .pending
                    .iter()
                    .filter(|(_, p)| p.consumer == id)
                    .map(|(pos, _)| *pos)
                    .collect();
                for pos in mine {
                    self.take_back(pos);
                    self.bump_count(pos);
                    self.replay.insert(pos);
                }
            }
            Some(_) if gone.unacked > 0 => self.request_rewind(),
            _ => {}
        }
        if self.consumers.is_empty() {
            self.sub_type = None;
        }
        Ok(self.update_active(None))
    }

    fn update_active(&mut self, joined: Option<ConsumerId>) -> Vec<Event> {
        let new = match self.sub_type {
            Some(SubType::Failover) => select_active(self.consumers.iter().map(|c| &c.info)),
            Some(SubType::Exclusive) => self.consumers.first().map(|c| c.info.id),
            Some(SubType::Shared | SubType::KeyShared) | None => None,
        };
        let failover = self.sub_type == Some(SubType::Failover);
        let mut events = Vec::new();
        if new != self.active {
            let had_active = self.active.is_some();
            self.active = new;
            if had_active && !self.pending.is_empty() {
                // The old active consumer's unacked entries go to the new one.
                self.request_rewind();
            }
            if failover {
                events.extend(self.consumers.iter().map(|c| Event::ActiveChanged {
                    consumer: c.info.id,
                    is_active: Some(c.info.id) == new,
                }));
            }
        } else if failover && let Some(j) = joined {
            events.push(Event::ActiveChanged {
                consumer: j,
                is_active: Some(j) == new,
            });
        }
        events
    }

    /// Adds `permits` messages to a consumer's permits.
    pub fn flow(&mut self, id: ConsumerId, permits: u32) -> Result<(), DispatchError> {
        let i = self.idx(id)?;
        let c = &mut self.consumers[i];
        c.permits = c.permits.saturating_add(i64::from(permits));
        Ok(())
    }

    /// Marks a consumer's sink (not) able to take more.
    pub fn set_writable(&mut self, id: ConsumerId, writable: bool) -> Result<(), DispatchError> {
        let i = self.idx(id)?;
        self.consumers[i].writable = writable;
        Ok(())
    }

    /// Individual acks from consumer `id` (of whichever consumer's entries;
    /// unknown positions are ignored: the cursor holds the truth).
    pub fn ack(&mut self, id: ConsumerId, positions: &[Position]) -> Result<(), DispatchError> {
        self.idx(id)?;
        for &pos in positions {
            self.take_back(pos);
            self.replay.remove(&pos);
            self.reading_replay.remove(&pos);
            self.counts.remove(&pos);
            self.hashes.remove(&pos);
            self.untrack_delayed(pos);
        }
        Ok(())
    }

    /// A cumulative ack up to `pos` (refused on Shared).
    pub fn ack_cumulative(&mut self, id: ConsumerId, pos: Position) -> Result<(), DispatchError> {
        self.idx(id)?;
        if self.sub_type.is_some_and(|t| !t.allows_cumulative_ack()) {
            return Err(DispatchError::CumulativeAckOnShared);
        }
        let done: Vec<Position> = self.pending.range(..=pos).map(|(p, _)| *p).collect();
        for p in done {
            self.take_back(p);
        }
        self.replay.retain(|p| *p > pos);
        self.reading_replay.retain(|p| *p > pos);
        self.counts.retain(|p, _| *p > pos);
        self.hashes.retain(|p, _| *p > pos);
        self.delayed.retain(|(_, p)| *p > pos);
        self.delayed_at.retain(|p, _| *p > pos);
        Ok(())
    }

    /// REDELIVER_UNACKNOWLEDGED_MESSAGES from consumer `id`. Shared: the
    /// listed positions it holds (all it holds without a list) are queued
    /// for redelivery. Single-active types: a request from the active
    /// consumer rewinds everything unacked (order is kept; a list is
    /// treated as "all", as Pulsar does).
    pub fn redeliver(
        &mut self,
        id: ConsumerId,
        positions: Option<&[Position]>,
    ) -> Result<(), DispatchError> {
        self.idx(id)?;
        match self.sub_type {
            Some(SubType::Shared | SubType::KeyShared) => {
                let mine: Vec<Position> = match positions {
                    Some(list) => list
                        .iter()
                        .filter(|p| self.pending.get(p).is_some_and(|x| x.consumer == id))
                        .copied()
                        .collect(),
                    None => self
                        .pending
                        .iter()
                        .filter(|(_, p)| p.consumer == id)
                        .map(|(pos, _)| *pos)
                        .collect(),
                };
                for pos in mine {
                    self.take_back(pos);
                    self.bump_count(pos);
                    self.replay.insert(pos);
                }
            }
            Some(_) if self.active == Some(id) => self.request_rewind(),
            _ => {}
        }
        Ok(())
    }

    /// After the cursor was moved (seek): forgets every delivery, replay,
    /// redelivery count and outstanding read. Permits stay.
    pub fn reset(&mut self) {
        self.pending.clear();
        self.replay.clear();
        self.reading_replay.clear();
        self.counts.clear();
        self.hashes.clear();
        self.draining.clear();
        self.forget_delayed();
        self.unacked_total = 0;
        self.blocked = false;
        for c in &mut self.consumers {
            c.unacked = 0;
            c.blocked = false;
        }
        self.rewind_requested = false;
        self.epoch += 1;
    }

    fn request_rewind(&mut self) {
        let positions: Vec<Position> = self.pending.keys().copied().collect();
        for pos in positions {
            self.bump_count(pos);
        }
        self.pending.clear();
        self.hashes.clear();
        self.draining.clear();
        self.forget_delayed();
        self.unacked_total = 0;
        self.blocked = false;
        for c in &mut self.consumers {
            c.unacked = 0;
            c.blocked = false;
        }
        // Everything after the mark-delete is read again.
        self.replay.clear();
        self.reading_replay.clear();
        self.rewind_requested = true;
        self.epoch += 1;
    }

    fn bump_count(&mut self, pos: Position) {
        if let Some(n) = self.counts.get_mut(&pos) {
            *n = n.saturating_add(1);
        } else if self.counts.len() < self.limits.redelivery_counts_max {
            self.counts.insert(pos, 1);
        } else {
            self.counts_dropped += 1;
        }
    }

    /// Removes `pos` from the pending entries, releasing its unacked counts.
    fn take_back(&mut self, pos: Position) -> Option<Pending> {
        let p = self.pending.remove(&pos)?;
        if let Some(h) = self.hashes.get(&pos)
            && let Some((holder, count)) = self.draining.get_mut(h)
            && *holder == p.consumer
        {
            *count -= 1;
            if *count == 0 {
                self.draining.remove(h);
            }
        }
        let n = u64::from(p.messages);
        self.unacked_total = self.unacked_total.saturating_sub(n);
        if self.blocked
            && self.unacked_total <= self.limits.unacked_messages_per_subscription_max / 2
        {
            self.blocked = false;
        }
        let half = self.limits.unacked_messages_per_consumer_max / 2;
        if let Some(c) = self.consumers.iter_mut().find(|c| c.info.id == p.consumer) {
            c.unacked = c.unacked.saturating_sub(n);
            if c.blocked && c.unacked <= half {
                c.blocked = false;
            }
        }
        Some(p)
    }

    fn eligible(c: &Consumer) -> bool {
        c.permits > 0 && !c.blocked && c.writable
    }

    fn active_idx(&self) -> Option<usize> {
        let a = self.active?;
        self.consumers.iter().position(|c| c.info.id == a)
    }

    /// Permits (messages) dispatch may use now.
    fn usable_permits(&self) -> i64 {
        match self.sub_type {
            Some(SubType::Shared | SubType::KeyShared) => self
                .consumers
                .iter()
                .filter(|c| Self::eligible(c))
                .map(|c| c.permits)
                .fold(0i64, i64::saturating_add),
            Some(_) => self
                .active_idx()
                .map(|i| &self.consumers[i])
                .filter(|c| Self::eligible(c))
                .map_or(0, |c| c.permits),
            None => 0,
        }
    }

    /// What to read now, if anything (nothing while a read is outstanding,
    /// without usable permits, or while blocked on the subscription limit).
    pub fn next_read(&mut self) -> Option<ReadTicket> {
        if self.read_in_flight {
            return None;
        }
        let plan = if self.rewind_requested {
            ReadPlan::Rewind
        } else {
            if self.blocked {
                return None;
            }
            let permits = self.usable_permits();
            if permits <= 0 {
                return None;
            }
            let room = self
                .limits
                .unacked_messages_per_subscription_max
                .saturating_sub(self.unacked_total);
            // Permits and room count messages; a read counts entries.
            // (A float-to-integer `as` saturates.)
            let entries_for =
                |messages: u64| (messages as f64 / self.messages_per_entry).ceil() as usize;
            let n = self
                .limits
                .read_entries_max
                .min(entries_for(u64::try_from(permits).unwrap_or(u64::MAX)))
                .min(entries_for(room))
                .max(1);
            if self.replay.is_empty() {
                if !self.may_read_new() {
                    return None;
                }
                ReadPlan::Next { entries_max: n }
            } else if self.sub_type == Some(SubType::KeyShared) {
                // Replay what can go now; while everything waiting is held
                // back (ordering, no owner with permits), look ahead at new
                // entries, up to the lookahead bound.
                let positions: Vec<Position> = self
                    .replay
                    .iter()
                    .filter(|p| self.replay_dispatchable(**p))
                    .take(n)
                    .copied()
                    .collect();
                if positions.is_empty() {
                    if self.replay.len() >= self.limits.key_shared_lookahead_max
                        || !self.may_read_new()
                    {
                        return None;
                    }
                    ReadPlan::Next { entries_max: n }
                } else {
                    for p in &positions {
                        self.replay.remove(p);
                    }
                    self.reading_replay = positions.iter().copied().collect();
                    ReadPlan::Replay(positions)
                }
            } else {
                let positions: Vec<Position> = self.replay.iter().take(n).copied().collect();
                for p in &positions {
                    self.replay.remove(p);
                }
                self.reading_replay = positions.iter().copied().collect();
                ReadPlan::Replay(positions)
            }
        };
        self.read_in_flight = true;
        Some(ReadTicket {
            epoch: self.epoch,
            plan,
        })
    }

    /// The outstanding read failed: its replay positions are queued again
    /// (unless a rewind or reset covers them) and a rewind stays requested.
    pub fn read_failed(&mut self, ticket: ReadTicket) {
        self.read_in_flight = false;
        let reading = std::mem::take(&mut self.reading_replay);
        if ticket.epoch == self.epoch {
            self.replay.extend(reading);
        }
    }

    /// The outstanding read's entries (in position order, acknowledged ones
    /// left out): returns the sends to carry out, in entry order. Entries no
    /// consumer can take now are queued for replay.
    pub fn read_done<T>(
        &mut self,
        ticket: ReadTicket,
        mut entries: Vec<ReadEntry<T>>,
    ) -> Vec<Assignment<T>> {
        self.read_in_flight = false;
        let reading = std::mem::take(&mut self.reading_replay);
        if ticket.epoch != self.epoch {
            return Vec::new();
        }
        match ticket.plan {
            ReadPlan::Rewind => {
                self.rewind_requested = false;
                return Vec::new();
            }
            // Acked while being read: left out.
            ReadPlan::Replay(positions) => {
                entries.retain(|e| reading.contains(&e.position));
                // Positions that did not come back are acked: forget them.
                for p in positions {
                    if !entries.iter().any(|e| e.position == p) {
                        self.hashes.remove(&p);
                    }
                }
            }
            ReadPlan::Next { .. } => {}
        }
        for e in &entries {
            // Weight 1/16: follows a change of batch size within a few reads.
            self.messages_per_entry +=
                (f64::from(e.messages.max(1)) - self.messages_per_entry) / 16.0;
        }
        let entries = self.hold_delayed(entries);
        self.assign(entries)
    }

    /// Shared / Key_Shared: entries whose delivery time has not come are
    /// held in the delayed tracker (they take no permits and block nothing
    /// behind them); the others are returned. Exclusive / Failover deliver
    /// at once, as in Pulsar.
    fn hold_delayed<T>(&mut self, entries: Vec<ReadEntry<T>>) -> Vec<ReadEntry<T>> {
        if !self.sub_type.is_some_and(SubType::is_multi) {
            return entries;
        }
        let now = self.now_ms;
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            match e.deliver_at_ms {
                Some(at) if at > now && !self.pending.contains_key(&e.position) => {
                    if self.delayed_at.insert(e.position, at).is_none() {
                        self.delayed.insert((at, e.position));
                    }
                }
                _ => out.push(e),
            }
        }
        out
    }

    /// Key_Shared: whether the consumer owning `hash` may take an entry of
    /// it now (it has permits and room, and no other consumer holds
    /// unacked entries of it unless out-of-order delivery is allowed).
    fn key_shared_target(&self, hash: u16) -> Option<usize> {
        let owner = self.selector.select(hash)?;
        if !self.selector.allow_out_of_order()
            && let Some((holder, _)) = self.draining.get(&hash)
            && *holder != owner
        {
            return None;
        }
        let i = self.consumers.iter().position(|c| c.info.id == owner)?;
        Self::eligible(&self.consumers[i]).then_some(i)
    }

    fn replay_dispatchable(&self, pos: Position) -> bool {
        self.hashes
            .get(&pos)
            .is_none_or(|h| self.key_shared_target(*h).is_some())
    }

    fn assign<T>(&mut self, entries: Vec<ReadEntry<T>>) -> Vec<Assignment<T>> {
        if self.sub_type == Some(SubType::KeyShared) {
            return self.assign_key_shared(entries);
        }
        let mut out = Vec::new();
        let mut entries = entries.into_iter();
        while let Some(e) = entries.next() {
            if self.pending.contains_key(&e.position) {
                continue;
            }
            let target = if self.blocked { None } else { self.select() };
            let Some(i) = target else {
                self.replay.insert(e.position);
                self.replay.extend(entries.map(|e| e.position));
                break;
            };
            out.push(self.give(i, e));
        }
        out
    }

    /// Key_Shared: each entry goes to the owner of its hash if it can take
    /// it now and no earlier entry of that hash waits for redelivery;
    /// otherwise it waits in the replay set (later entries still go).
    fn assign_key_shared<T>(&mut self, entries: Vec<ReadEntry<T>>) -> Vec<Assignment<T>> {
        let mut waiting: HashMap<u16, Position> = HashMap::new();
        for p in &self.replay {
            if let Some(h) = self.hashes.get(p) {
                waiting.entry(*h).or_insert(*p);
            }
        }
        let mut out = Vec::new();
        let mut entries = entries.into_iter();
        while let Some(e) = entries.next() {
            if self.pending.contains_key(&e.position) {
                continue;
            }
            self.hashes.insert(e.position, e.key_hash);
            if self.blocked {
                self.replay.insert(e.position);
                for rest in entries.by_ref() {
                    self.hashes.insert(rest.position, rest.key_hash);
                    self.replay.insert(rest.position);
                }
                break;
            }
            let earlier_waits = waiting.get(&e.key_hash).is_some_and(|p| *p < e.position);
            let target = if earlier_waits {
                None
            } else {
                self.key_shared_target(e.key_hash)
            };
            let Some(i) = target else {
                self.replay.insert(e.position);
                let w = waiting.entry(e.key_hash).or_insert(e.position);
                *w = (*w).min(e.position);
                continue;
            };
            if !self.selector.allow_out_of_order() {
                let holder = self.consumers[i].info.id;
                let d = self.draining.entry(e.key_hash).or_insert((holder, 0));
                d.1 += 1;
            }
            out.push(self.give(i, e));
        }
        out
    }

    /// Delivers `e` to consumer `i`: permits, unacked counts, pending.
    fn give<T>(&mut self, i: usize, e: ReadEntry<T>) -> Assignment<T> {
        {
            let messages = e.messages.max(1);
            let n = u64::from(messages);
            let c = &mut self.consumers[i];
            c.permits = c.permits.saturating_sub(i64::from(messages));
            c.unacked = c.unacked.saturating_add(n);
            if c.unacked >= self.limits.unacked_messages_per_consumer_max {
                c.blocked = true;
            }
            let consumer = c.info.id;
            self.unacked_total = self.unacked_total.saturating_add(n);
            if self.unacked_total >= self.limits.unacked_messages_per_subscription_max {
                self.blocked = true;
            }
            self.pending
                .insert(e.position, Pending { consumer, messages });
            Assignment {
                consumer,
                position: e.position,
                messages,
                redelivery_count: self.redelivery_count(e.position),
                payload: e.payload,
            }
        }
    }

    fn select(&mut self) -> Option<usize> {
        match self.sub_type? {
            SubType::Shared => self.select_shared(),
            // Key_Shared selects per entry (assign_key_shared).
            SubType::KeyShared => None,
            SubType::Exclusive | SubType::Failover => self
                .active_idx()
                .filter(|&i| Self::eligible(&self.consumers[i])),
        }
    }

    /// Round-robin: the current consumer keeps its turn for up to
    /// `round_robin_entries_max` entries while it is eligible.
    fn select_shared(&mut self) -> Option<usize> {
        let n = self.consumers.len();
        if n == 0 {
            return None;
        }
        let batch = self.limits.round_robin_entries_max.max(1);
        if self.rr_next < n
            && self.rr_given < batch
            && Self::eligible(&self.consumers[self.rr_next])
        {
            self.rr_given += 1;
            return Some(self.rr_next);
        }
        for step in 1..=n {
            let i = (self.rr_next + step) % n;
            if Self::eligible(&self.consumers[i]) {
                self.rr_next = i;
                self.rr_given = 1;
                return Some(i);
            }
        }
        None
    }

    /// A send could not be carried out (the consumer's sink is full): the
    /// entry is queued for replay, its permits returned, and the consumer is
    /// not writable until [`Self::set_writable`].
    pub fn send_failed<T>(&mut self, send: &Assignment<T>) {
        if self
            .pending
            .get(&send.position)
            .is_some_and(|p| p.consumer == send.consumer)
        {
            self.take_back(send.position);
            self.replay.insert(send.position);
            if let Ok(i) = self.idx(send.consumer) {
                let c = &mut self.consumers[i];
                c.permits = c.permits.saturating_add(i64::from(send.messages));
                c.writable = false;
            }
        }
    }

    /// Current figures.
    pub fn stats(&self) -> DispatcherStats {
        DispatcherStats {
            sub_type: self.sub_type,
            active: self.active,
            unacked_messages: self.unacked_total,
            pending_entries: self.pending.len(),
            blocked: self.blocked,
            replay_entries: self.replay.len() + self.reading_replay.len(),
            redelivery_counts: self.counts.len(),
            draining_hashes: self.draining.len(),
            redelivery_counts_dropped: self.counts_dropped,
            delayed_entries: self.delayed.len(),
            consumers: self
                .consumers
                .iter()
                .map(|c| ConsumerStats {
                    id: c.info.id,
                    name: c.info.name.clone(),
                    priority: c.info.priority,
                    permits: c.permits,
                    unacked_messages: c.unacked,
                    blocked: c.blocked,
                    writable: c.writable,
                    is_active: self.active == Some(c.info.id),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests;
