//! Producer de-duplication of one loaded topic: the live
//! [`DedupState`] behind a lock, the wait of possible duplicates for their
//! original, and the durable snapshot in the topic's system cursor
//! [`DEDUP_CURSOR`] (`pulsar.dedup`).
//!
//! Durability: the snapshot is *derived from the log*, never from the live
//! state. A snapshot step reads (through the cursor) every entry stored
//! after the previous snapshot position, folds each entry's
//! `producer_name` / sequence id into the snapshot map, then stores that
//! map as the cursor's mark-delete properties and moves its mark-delete to
//! the last entry read. So the snapshot at position P covers exactly the
//! entries up to P, whatever the order in which producers' receipts
//! completed, and the cursor keeps every entry after P from trimming.
//! Opening the topic restores the map from the cursor and replays the
//! entries after P the same way: the state survives `kill -9`.
//!
//! Promises: a snapshot step runs when [`DedupConfig::snapshot_entries`]
//! entries were stored since the last one, or [`DedupConfig::snapshot_interval_ms`]
//! passed with anything stored (checked on every topic tick); a waiting
//! duplicate waits at most [`ORIGINAL_WAIT_MS`], then is refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cms_client::proto::frame::parse_entry;
use tokio::sync::watch;
use tracing::{debug, info};

use crate::dedup::{DEDUP_CURSOR, Decision, DedupConfig, DedupState, effective_id};
use crate::managed_ledger::InitialPosition;
use crate::managed_ledger::io::{ManagedCursor, ManagedLedger, MlError, Persist};

/// How long a possible duplicate waits for its original's outcome (ms).
pub const ORIGINAL_WAIT_MS: u64 = 30_000;

/// Entries read at once when replaying or snapshotting.
const REPLAY_BATCH: usize = 256;

struct Snapshotter {
    /// The map of the entries up to the cursor's read position.
    state: DedupState,
    last: Instant,
}

/// De-duplication of one topic (present only when the policy is on).
pub struct TopicDedup {
    config: DedupConfig,
    state: Mutex<DedupState>,
    changed: watch::Sender<u64>,
    cursor: ManagedCursor,
    snap: tokio::sync::Mutex<Snapshotter>,
    stored_since_snapshot: AtomicU64,
}

impl std::fmt::Debug for TopicDedup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicDedup")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads every entry after `cursor`'s read position and folds producer
/// names and sequence ids into `state`. Returns the entries read.
async fn fold_entries(cursor: &ManagedCursor, state: &mut DedupState) -> Result<u64, MlError> {
    let mut n = 0u64;
    loop {
        let before = cursor.read_position()?;
        let entries = cursor.read_next(REPLAY_BATCH).await?;
        for e in &entries {
            // Entries are what producers sent (checked on the way in);
            // anything unparsable carries no producer to remember.
            if let Ok(p) = parse_entry(&e.payload) {
                let m = &p.metadata;
                if !m.producer_name.is_empty() {
                    state.persisted(
                        &m.producer_name,
                        effective_id(m.sequence_id, m.highest_sequence_id),
                    );
                }
            }
        }
        n += entries.len() as u64;
        if cursor.read_position()? == before {
            return Ok(n);
        }
    }
}

impl TopicDedup {
    /// Opens (or creates, at the end of the log) the topic's `pulsar.dedup`
    /// cursor, restores its snapshot and replays the entries after it.
    pub async fn open(ml: &ManagedLedger, config: DedupConfig) -> Result<Arc<Self>, MlError> {
        let cursor = ml
            .open_cursor(DEDUP_CURSOR, InitialPosition::Latest)
            .await?;
        // Nobody tails through it: it holds nothing in the entry cache
        // (Pulsar: `setAlwaysInactive`).
        cursor.set_active(false)?;
        let snapshot = cursor.properties()?;
        let mut state = DedupState::restore(&snapshot, config.producers_max);
        let replayed = fold_entries(&cursor, &mut state).await?;
        info!(
            managed_ledger = ml.name(),
            producers = state.len(),
            snapshot_producers = snapshot.len(),
            replayed,
            "de-duplication state restored"
        );
        Ok(Arc::new(Self {
            config,
            state: Mutex::new(state.clone()),
            changed: watch::channel(0).0,
            cursor,
            snap: tokio::sync::Mutex::new(Snapshotter {
                state,
                last: Instant::now(),
            }),
            stored_since_snapshot: AtomicU64::new(replayed),
        }))
    }

    /// Decides for a SEND of producer `name` ([`DedupState::check`]).
    pub fn check(&self, name: &str, id: i64) -> Decision {
        lock(&self.state).check(name, id)
    }

    /// A stored message was refused before its append ([`DedupState::unpush`]).
    pub fn unpush(&self, name: &str, id: i64, prev_pushed: i64) {
        lock(&self.state).unpush(name, id, prev_pushed);
        self.changed.send_modify(|v| *v += 1);
    }

    /// A stored message is durable.
    pub fn persisted(&self, name: &str, id: i64) {
        lock(&self.state).persisted(name, id);
        self.stored_since_snapshot.fetch_add(1, Ordering::Relaxed);
        self.changed.send_modify(|v| *v += 1);
    }

    /// An append of producer `name` failed ([`DedupState::failed`]).
    pub fn failed(&self, name: &str) {
        lock(&self.state).failed(name);
        self.changed.send_modify(|v| *v += 1);
    }

    /// The last persisted id of `name` (−1 when unknown).
    pub fn last_persisted(&self, name: &str) -> i64 {
        lock(&self.state).last_persisted(name)
    }

    /// Waits for the outcome of the original of a possible duplicate:
    /// `true` once it is durable, `false` if it failed or the wait exceeded
    /// [`ORIGINAL_WAIT_MS`].
    pub async fn wait_for_original(&self, name: &str, id: i64) -> bool {
        let mut rx = self.changed.subscribe();
        let wait = async {
            loop {
                if let Some(ok) = lock(&self.state).resolve(name, id) {
                    return ok;
                }
                if rx.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(Duration::from_millis(ORIGINAL_WAIT_MS), wait)
            .await
            .unwrap_or(false)
    }

    /// Takes a snapshot if one is due (see the module doc). Returns whether
    /// one was written.
    pub async fn snapshot_if_due(&self) -> Result<bool, MlError> {
        let stored = self.stored_since_snapshot.load(Ordering::Relaxed);
        let elapsed = {
            let s = self.snap.lock().await;
            s.last.elapsed() >= Duration::from_millis(self.config.snapshot_interval_ms)
        };
        if stored >= self.config.snapshot_entries.max(1) || (stored > 0 && elapsed) {
            self.snapshot().await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Folds the entries stored since the last snapshot into the snapshot
    /// map and writes it durably with the cursor's mark-delete at the last
    /// of them.
    pub async fn snapshot(&self) -> Result<(), MlError> {
        let mut s = self.snap.lock().await;
        let stored = self.stored_since_snapshot.load(Ordering::Relaxed);
        let read = fold_entries(&self.cursor, &mut s.state).await?;
        let pos = self.cursor.read_position()?;
        if pos > self.cursor.mark_delete()? {
            self.cursor.set_properties(s.state.snapshot())?;
            self.cursor.ack_cumulative(pos, Persist::Wait).await?;
            self.cursor.persist().await?;
            debug!(cursor = DEDUP_CURSOR, position = %pos, entries = read, "de-duplication snapshot written");
        }
        // Only increments happen meanwhile: this never goes below zero.
        self.stored_since_snapshot
            .fetch_sub(stored, Ordering::Relaxed);
        s.last = Instant::now();
        Ok(())
    }
}
