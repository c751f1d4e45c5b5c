//! A subscription's read task: asks the dispatcher what to read, reads it
//! from the cursor (under the subscription's I/O lock, so a seek never
//! overlaps a read), hands the entries back and carries out the sends.
//!
//! Promises: one read at a time; it waits (bounded by `tail_wait_ms`, woken
//! early by any input) when there is nothing to do, tails new entries with
//! the managed ledger's wait, retries failed reads with a doubling delay
//! (at most `read_retry_delay_ms_max`), and stops when the subscription
//! closes, when every handle is dropped, or when the managed ledger is
//! terminal (the reason shows in the stats). It holds only a weak reference
//! between steps.
//!
//! Delayed delivery's timer lives here: every step gives the dispatcher the
//! wall clock ([`Dispatcher::advance_clock`](crate::dispatch::Dispatcher::advance_clock)),
//! and an idle or tailing wait ends no later than the earliest held entry's
//! due time (no polling while nothing is due).

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{Notify, mpsc};
use tracing::{debug, warn};

use super::{Delivery, Inner, detach, lock};
use crate::dispatch::{ConsumerId, ReadEntry, ReadPlan, ReadTicket, SubType};
use crate::managed_ledger::Position;
use crate::managed_ledger::io::{Entry, MlError};

enum Step {
    /// Made progress: look again at once.
    Again,
    /// Nothing to do until an input arrives.
    Idle,
    /// Read everything: wait for an entry after this position.
    Tail(Position),
    /// A read failed; try again later.
    Retry(MlError),
    /// Closed or terminal.
    Stop,
}

fn is_terminal(e: &MlError) -> bool {
    matches!(
        e,
        MlError::Fenced(_) | MlError::Closed(_) | MlError::NoCursor(_)
    )
}

/// The wall clock, Unix ms (delayed delivery compares it with
/// `deliver_at_time`, which clients set from their wall clock).
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How long until the earliest held delayed entry is due (`None`: none held).
fn until_due(inner: &Inner) -> Option<Duration> {
    let due = lock(&inner.state).d.next_delayed_due()?;
    Some(Duration::from_millis(due.saturating_sub(now_ms()).max(1)))
}

pub(super) async fn run(weak: Weak<Inner>, wake: Arc<Notify>) {
    let mut retry_ms = 0u64;
    loop {
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let tail = Duration::from_millis(inner.config.tail_wait_ms.max(1));
        match step(&inner).await {
            Step::Again => retry_ms = 0,
            Step::Idle => {
                let wait = until_due(&inner).map_or(tail, |d| d.min(tail));
                drop(inner);
                let _ = tokio::time::timeout(wait, wake.notified()).await;
            }
            Step::Tail(pos) => {
                let ml = inner.ml.clone();
                let tail_ms = inner.config.tail_wait_ms.max(1);
                let due = until_due(&inner).unwrap_or(tail);
                drop(inner);
                tokio::select! {
                    r = ml.wait_for_entry_after(pos, tail_ms) => {
                        if let Err(e) = r {
                            fail(&weak, e);
                            return;
                        }
                    }
                    () = wake.notified() => {}
                    () = tokio::time::sleep(due) => {}
                }
            }
            Step::Retry(e) => {
                retry_ms = (retry_ms * 2).clamp(10, inner.config.read_retry_delay_ms_max.max(10));
                warn!(topic = %inner.topic, subscription = %inner.name, error = %e, retry_ms, "subscription read failed; retrying");
                drop(inner);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(retry_ms)) => {}
                    () = wake.notified() => {}
                }
            }
            Step::Stop => return,
        }
    }
}

fn fail(weak: &Weak<Inner>, e: MlError) {
    if let Some(inner) = weak.upgrade() {
        warn!(topic = %inner.topic, subscription = %inner.name, error = %e, "subscription stops: managed ledger unusable");
        lock(&inner.state).failed = Some(e);
    }
}

async fn step(inner: &Arc<Inner>) -> Step {
    let _io = inner.io.lock().await;
    let ticket = {
        let mut st = lock(&inner.state);
        if st.closed || st.failed.is_some() {
            return Step::Stop;
        }
        st.d.advance_clock(now_ms());
        st.d.next_read()
    };
    let Some(ticket) = ticket else {
        return Step::Idle;
    };
    let result = match ticket.plan().clone() {
        ReadPlan::Rewind => inner.cursor.rewind().map(|()| (Vec::new(), true)),
        ReadPlan::Replay(positions) => read_positions(inner, &positions).await.map(|v| (v, true)),
        ReadPlan::Next { entries_max } => {
            let before = inner.cursor.read_position();
            let budget = inner.config.read_budget.get();
            inner
                .cursor
                .read_next_within(entries_max, budget)
                .await
                .map(|v| {
                    let moved = !v.is_empty() || inner.cursor.read_position() != before;
                    (v, moved)
                })
        }
    };
    match result {
        Ok((entries, progressed)) => {
            deliver(inner, ticket, entries);
            if progressed {
                Step::Again
            } else {
                match inner.cursor.read_position() {
                    Ok(p) => Step::Tail(p),
                    Err(e) => {
                        lock(&inner.state).failed = Some(e);
                        Step::Stop
                    }
                }
            }
        }
        Err(e) => {
            let mut st = lock(&inner.state);
            st.d.read_failed(ticket);
            if is_terminal(&e) {
                warn!(topic = %inner.topic, subscription = %inner.name, error = %e, "subscription stops: managed ledger unusable");
                st.failed = Some(e);
                Step::Stop
            } else {
                Step::Retry(e)
            }
        }
    }
}

/// Reads exactly `positions` (ascending), in contiguous runs, leaving out
/// acknowledged ones.
async fn read_positions(inner: &Inner, positions: &[Position]) -> Result<Vec<Entry>, MlError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < positions.len() {
        let mut j = i + 1;
        while j < positions.len()
            && positions[j].ledger_id == positions[i].ledger_id
            && positions[j].entry_id == positions[j - 1].entry_id + 1
        {
            j += 1;
        }
        let run = &positions[i..j];
        let got = inner.ml.read(run[0], run.len()).await?;
        out.extend(got.into_iter().filter(|e| {
            run.binary_search(&e.position).is_ok()
                && !inner.cursor.is_acked(e.position).unwrap_or(true)
        }));
        i = j;
    }
    Ok(out)
}

fn deliver(inner: &Arc<Inner>, ticket: ReadTicket, entries: Vec<Entry>) {
    let mut st = lock(&inner.state);
    // Only Key_Shared routes by key: the other types' dispatchers never look
    // at an entry's key hash, so it is not computed for them (one parse of
    // the entry less). Decided under the lock `read_done` runs under, so the
    // type cannot change in between; entries that wait for a replay are read
    // again, and hashed then if the type changed meanwhile.
    let hash_keys = !matches!(
        st.d.sub_type(),
        Some(SubType::Shared | SubType::Exclusive | SubType::Failover)
    );
    let read: Vec<ReadEntry<Bytes>> = entries
        .into_iter()
        .map(|e| ReadEntry {
            position: e.position,
            messages: messages_left(inner, e.position, &e.payload),
            key_hash: if hash_keys {
                inner.config.key_hasher.hash(&e.payload)
            } else {
                0
            },
            deliver_at_ms: inner.config.deliver_at.deliver_at_ms(&e.payload),
            payload: e.payload,
        })
        .collect();
    st.d.advance_clock(now_ms());
    let sends = st.d.read_done(ticket, read);
    let mut paused: HashSet<ConsumerId> = HashSet::new();
    let mut gone: Vec<ConsumerId> = Vec::new();
    for s in sends {
        if paused.contains(&s.consumer) || gone.contains(&s.consumer) {
            st.d.send_failed(&s);
            continue;
        }
        let Some(sink) = st.sinks.get(&s.consumer).cloned() else {
            st.d.send_failed(&s);
            continue;
        };
        let d = Delivery::Message {
            consumer_id: s.consumer,
            position: s.position,
            redelivery_count: s.redelivery_count,
            messages: s.messages.max(1),
            entry: s.payload.clone(),
            ack_set: inner
                .cursor
                .batch_unacked(s.position)
                .ok()
                .flatten()
                .unwrap_or_default(),
        };
        match sink.try_send(d) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                st.d.send_failed(&s);
                paused.insert(s.consumer);
                debug!(topic = %inner.topic, subscription = %inner.name, consumer = %s.consumer, "consumer sink full; paused");
                resume_when_writable(Arc::downgrade(inner), s.consumer, sink);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                st.d.send_failed(&s);
                gone.push(s.consumer);
            }
        }
    }
    for id in gone {
        debug!(topic = %inner.topic, subscription = %inner.name, consumer = %id, "consumer sink closed; detaching");
        let _ = detach(inner, &mut st, id);
    }
}

/// The messages of an entry still to deliver: a batch with batch-index
/// acks counts only its unacked messages (the permits of the acked ones are
/// not taken, pulsar.md G11).
fn messages_left(inner: &Inner, position: Position, payload: &[u8]) -> u32 {
    let all = (inner.counter)(payload);
    match inner.cursor.batch_unacked(position) {
        Ok(Some(bits)) => {
            let left: u32 = bits.iter().map(|w| w.count_ones()).sum();
            all.min(left).max(1)
        }
        _ => all,
    }
}

/// Waits for room in a paused consumer's sink, then lets it receive again
/// (or detaches it if the sink closed).
fn resume_when_writable(weak: Weak<Inner>, id: ConsumerId, sink: mpsc::Sender<Delivery>) {
    tokio::spawn(async move {
        let open = sink.reserve().await.is_ok();
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let mut st = lock(&inner.state);
        if !st.sinks.get(&id).is_some_and(|s| s.same_channel(&sink)) {
            return;
        }
        if open {
            let _ = st.d.set_writable(id, true);
        } else {
            let _ = detach(&inner, &mut st, id);
        }
        drop(st);
        inner.wake.notify_one();
    });
}
