//! The durable cursor of a subscription as a state machine: a mark-delete
//! position, the individually acknowledged ranges after it, and properties;
//! plus the decisions around persisting it (rate limit, snapshots, restore,
//! cursor-ledger rollover) and TTL expiry.
//!
//! Promises (invariant 6):
//! - an entry counts as acknowledged only after `ack`, `ack_cumulative` or
//!   `expire_up_to` covered it; nothing else moves the mark-delete forward, and
//!   no move goes past the last confirmed position of the ledger list;
//! - after every operation the mark-delete has absorbed every acknowledged
//!   range contiguous with it (across ledger boundaries and empty ledgers), so
//!   the first entry after the mark-delete is always unacknowledged;
//! - a snapshot holds the full state (bounded: the ranges nearest the
//!   mark-delete); restoring it never marks an unacknowledged entry as acked,
//!   the bound only makes dropped acks redelivered;
//! - [`Cursor::should_persist`] allows at most one snapshot per
//!   `persist_interval_ms`, and only when something changed;
//! - TTL expiry moves the mark-delete and deletes nothing.
//! - batch-index acks (Pulsar's `batchDeletedIndexes`): an entry of which
//!   only some messages are acked keeps the bit set of those still unacked
//!   (at most [`BATCH_DELETED_ENTRIES_MAX`] entries; past it a partial ack of
//!   another entry is dropped, so that entry is redelivered whole); when every
//!   bit is cleared the entry is acked. The sets are in the snapshots.

use std::collections::BTreeMap;

use super::ledger_list::LedgerList;
use super::position::Position;
use super::proto;
use super::range_set::RangeSet;

/// Where a new cursor starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialPosition {
    /// Before the first entry still stored: the whole topic is backlog.
    Earliest,
    /// After the last confirmed entry: only new entries are backlog.
    Latest,
}

/// Partly acknowledged batch entries kept (and persisted) per cursor.
/// Pulsar: `managedLedgerMaxBatchDeletedIndexToPersist=10000`.
pub const BATCH_DELETED_ENTRIES_MAX: usize = 10_000;

/// Cursor persistence settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorConfig {
    /// At most one snapshot per this many ms (Pulsar:
    /// `managedLedgerDefaultMarkDeleteRateLimit=1.0`, i.e. 1000 ms).
    pub persist_interval_ms: u64,
    /// Acked ranges kept in a cursor-ledger snapshot (Pulsar:
    /// `managedLedgerMaxUnackedRangesToPersist=10000`).
    pub ledger_ranges_max: usize,
    /// Acked ranges kept in the metadata-store snapshot (Pulsar:
    /// `managedLedgerMaxUnackedRangesToPersistInMetadataStore=1000`).
    pub metadata_ranges_max: usize,
}

impl Default for CursorConfig {
    fn default() -> Self {
        Self {
            persist_interval_ms: 1_000,
            ledger_ranges_max: 10_000,
            metadata_ranges_max: 1_000,
        }
    }
}

/// When the cursor's own ledger is replaced by a new one (Pulsar:
/// `managedLedgerCursorMaxEntriesPerLedger=50000`,
/// `managedLedgerCursorRolloverTimeInSeconds=14400`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorLedgerRollover {
    /// Roll once the cursor ledger holds this many snapshots.
    pub entries_max: u64,
    /// Roll once the cursor ledger is this old, in ms.
    pub age_ms_max: u64,
}

impl Default for CursorLedgerRollover {
    fn default() -> Self {
        Self {
            entries_max: 50_000,
            age_ms_max: 14_400_000,
        }
    }
}

impl CursorLedgerRollover {
    /// True if a cursor ledger with `entries` snapshots, created at
    /// `ctime_ms`, should be replaced before the next snapshot is written.
    pub fn should_roll(&self, entries: u64, ctime_ms: u64, now_ms: u64) -> bool {
        entries >= self.entries_max || now_ms.saturating_sub(ctime_ms) >= self.age_ms_max
    }
}

/// Errors of cursor operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    /// The position is not an entry of the managed ledger.
    #[error("position {0} is not an entry of this managed ledger")]
    NotAnEntry(Position),
    /// The move would pass the last confirmed position (skip future entries).
    #[error("position {position} is past the last confirmed position {last_confirmed}")]
    PastLastConfirmed {
        /// The requested position.
        position: Position,
        /// The ledger list's last confirmed position.
        last_confirmed: Position,
    },
    /// A stored snapshot breaks the cursor's invariants.
    #[error("corrupt cursor snapshot: {0}")]
    CorruptSnapshot(String),
}

/// What an acknowledgement changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckOutcome {
    /// False if everything acked was acknowledged already.
    pub newly_acked: bool,
    /// True if the mark-delete moved forward.
    pub mark_delete_moved: bool,
}

/// A snapshot ready to persist and what its range bound dropped (for the
/// `ranges dropped` metric; dropped acks are redelivered after a restore).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The record to write.
    pub snapshot: proto::CursorSnapshot,
    /// Acked ranges left out by the bound.
    pub ranges_dropped: u64,
    /// Acked entries in those ranges.
    pub entries_dropped: u64,
}

/// Of two stored snapshots of one cursor, the newer (higher sequence).
pub fn newest_snapshot<'a>(
    a: Option<&'a proto::CursorSnapshot>,
    b: Option<&'a proto::CursorSnapshot>,
) -> Option<&'a proto::CursorSnapshot> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y.sequence > x.sequence { y } else { x }),
        (x, y) => x.or(y),
    }
}

/// The publish time before which entries are expired by a TTL of
/// `ttl_seconds` at `now_ms`; `None` when the TTL is 0 (disabled). The driver
/// finds the first entry at or after it ([`super::PublishTimeSearch`]) and
/// calls [`Cursor::expire_up_to`] with the position before that entry.
pub fn ttl_cutoff_ms(now_ms: u64, ttl_seconds: u64) -> Option<u64> {
    (ttl_seconds > 0).then(|| now_ms.saturating_sub(ttl_seconds.saturating_mul(1000)))
}

/// A wall clock that never runs ahead of the monotonic clock (RELIABILITY
/// P1-12): TTL expiry reads "now" through it, so a forward jump of the
/// system clock cannot expire unacked messages early. A backward jump is
/// followed (expiry then happens later, never earlier); a clock that was
/// behind when the anchor was taken and is corrected forward later lags by
/// that correction until the process restarts (again: later, never earlier).
#[derive(Debug, Clone, Copy)]
pub struct WallAnchor {
    wall_ms: u64,
    at: std::time::Instant,
}

impl WallAnchor {
    /// Anchors wall time `wall_ms` (Unix ms) at monotonic instant `at`.
    pub fn new(wall_ms: u64, at: std::time::Instant) -> Self {
        Self { wall_ms, at }
    }

    /// `wall_now_ms`, but at most the anchor's wall time plus the monotonic
    /// time elapsed since it (at `now`).
    pub fn bounded_now_ms(&self, wall_now_ms: u64, now: std::time::Instant) -> u64 {
        let elapsed =
            u64::try_from(now.saturating_duration_since(self.at).as_millis()).unwrap_or(u64::MAX);
        wall_now_ms.min(self.wall_ms.saturating_add(elapsed))
    }
}

/// A durable cursor.
#[derive(Debug, Clone, PartialEq)]
pub struct Cursor {
    name: String,
    config: CursorConfig,
    mark_delete: Position,
    acked: RangeSet,
    properties: BTreeMap<String, i64>,
    cursor_properties: BTreeMap<String, String>,
    /// Batch-index acks: entry -> bits of its messages still unacked.
    batch_deleted: BTreeMap<Position, Vec<i64>>,
    /// Sequence of the last snapshot produced.
    sequence: u64,
    /// Changed since the last snapshot taken for the cursor ledger.
    dirty: bool,
    last_persist_ms: Option<u64>,
}

impl Cursor {
    /// A new cursor at `initial` of `ledgers`; it needs a first persist.
    pub fn new(
        name: impl Into<String>,
        initial: InitialPosition,
        ledgers: &LedgerList,
        config: CursorConfig,
    ) -> Self {
        let mark_delete = match initial {
            InitialPosition::Earliest => ledgers.earliest_mark_delete(),
            InitialPosition::Latest => ledgers.last_confirmed_position(),
        };
        Self {
            name: name.into(),
            config,
            mark_delete,
            acked: RangeSet::new(),
            properties: BTreeMap::new(),
            cursor_properties: BTreeMap::new(),
            batch_deleted: BTreeMap::new(),
            sequence: 0,
            dirty: true,
            last_persist_ms: None,
        }
    }

    /// Restores a cursor from a snapshot (the last entry of its cursor
    /// ledger, or the metadata fallback), validating it.
    pub fn restore(
        name: impl Into<String>,
        snapshot: &proto::CursorSnapshot,
        config: CursorConfig,
    ) -> Result<Self, CursorError> {
        let mark_delete: Position = snapshot
            .mark_delete
            .ok_or_else(|| CursorError::CorruptSnapshot("no mark-delete position".into()))?
            .into();
        if mark_delete.entry_id < -1 {
            return Err(CursorError::CorruptSnapshot(format!(
                "mark-delete {mark_delete} has a negative entry id"
            )));
        }
        let mut acked = RangeSet::new();
        let mut prev_last = mark_delete;
        for r in &snapshot.acked_ranges {
            let first = Position::new(r.ledger_id, r.first_entry_id);
            let last = Position::new(r.ledger_id, r.last_entry_id);
            if first.entry_id < 0 || first > last || first <= prev_last {
                return Err(CursorError::CorruptSnapshot(format!(
                    "range {first}..={last} is not an ascending range after {prev_last}"
                )));
            }
            acked.insert_range(first, last);
            prev_last = last;
        }
        let mut batch_deleted = BTreeMap::new();
        for b in snapshot
            .batch_deleted_indexes
            .iter()
            .take(BATCH_DELETED_ENTRIES_MAX)
        {
            let pos: Position = b
                .position
                .ok_or_else(|| CursorError::CorruptSnapshot("batch ack without position".into()))?
                .into();
            if pos <= mark_delete || acked.contains(pos) || b.ack_set.iter().all(|w| *w == 0) {
                return Err(CursorError::CorruptSnapshot(format!(
                    "batch ack of {pos} is at or before the mark-delete, acked, or empty"
                )));
            }
            batch_deleted.insert(pos, b.ack_set.clone());
        }
        Ok(Self {
            name: name.into(),
            config,
            mark_delete,
            acked,
            properties: snapshot.properties.clone(),
            cursor_properties: BTreeMap::new(),
            batch_deleted,
            sequence: snapshot.sequence,
            dirty: false,
            last_persist_ms: None,
        })
    }

    /// Restores a cursor from its metadata node's snapshot and properties.
    pub fn restore_from_info(
        name: impl Into<String>,
        info: &proto::CursorInfo,
        config: CursorConfig,
    ) -> Result<Self, CursorError> {
        let snapshot = info
            .last_snapshot
            .as_ref()
            .ok_or_else(|| CursorError::CorruptSnapshot("cursor node without snapshot".into()))?;
        let mut cursor = Self::restore(name, snapshot, config)?;
        cursor.cursor_properties = info.properties.clone();
        Ok(cursor)
    }

    /// The cursor (subscription) name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The mark-delete position: everything at or before it is acknowledged.
    pub fn mark_delete(&self) -> Position {
        self.mark_delete
    }

    /// The individually acknowledged ranges after the mark-delete.
    pub fn acked_ranges(&self) -> &RangeSet {
        &self.acked
    }

    /// Mark-delete properties (persisted in every snapshot).
    pub fn properties(&self) -> &BTreeMap<String, i64> {
        &self.properties
    }

    /// Replaces the mark-delete properties.
    pub fn set_properties(&mut self, properties: BTreeMap<String, i64>) {
        self.properties = properties;
        self.dirty = true;
    }

    /// Cursor (subscription) properties, kept in the metadata node.
    pub fn cursor_properties(&self) -> &BTreeMap<String, String> {
        &self.cursor_properties
    }

    /// Cursor properties, for update (persisted with the next [`Self::cursor_info`]).
    pub fn cursor_properties_mut(&mut self) -> &mut BTreeMap<String, String> {
        &mut self.cursor_properties
    }

    /// True if the entry at `pos` is acknowledged.
    pub fn is_acked(&self, pos: Position) -> bool {
        pos <= self.mark_delete || self.acked.contains(pos)
    }

    /// The first unacknowledged entry, if any (where a reader of this cursor
    /// starts after a restore).
    pub fn first_unacked(&self, ledgers: &LedgerList) -> Option<Position> {
        ledgers.next_valid_position(self.mark_delete)
    }

    /// Individually acknowledges the entry at `pos`.
    pub fn ack(&mut self, pos: Position, ledgers: &LedgerList) -> Result<AckOutcome, CursorError> {
        if pos <= self.mark_delete {
            return Ok(AckOutcome {
                newly_acked: false,
                mark_delete_moved: false,
            });
        }
        if !ledgers.contains_entry(pos) {
            return Err(CursorError::NotAnEntry(pos));
        }
        let newly_acked = self.acked.insert(pos);
        self.batch_deleted.remove(&pos);
        let mark_delete_moved = self.advance(ledgers);
        self.dirty |= newly_acked;
        Ok(AckOutcome {
            newly_acked,
            mark_delete_moved,
        })
    }

    /// Acknowledges some messages of the batch entry at `pos`: `ack_set`
    /// is Pulsar's bit set with a 1 for every message this ack leaves
    /// unacknowledged. The messages unacked after it are those unacked in
    /// both the stored set and `ack_set`; when none is left the entry is
    /// acked ([`Self::ack`]). An empty `ack_set` acks the entry. At the
    /// [`BATCH_DELETED_ENTRIES_MAX`] bound a partial ack of a new entry is
    /// dropped (the entry is redelivered whole: at-least-once).
    pub fn ack_batch_index(
        &mut self,
        pos: Position,
        ack_set: &[i64],
        ledgers: &LedgerList,
    ) -> Result<AckOutcome, CursorError> {
        let unchanged = AckOutcome {
            newly_acked: false,
            mark_delete_moved: false,
        };
        if self.is_acked(pos) {
            return Ok(unchanged);
        }
        if !ledgers.contains_entry(pos) {
            return Err(CursorError::NotAnEntry(pos));
        }
        let remaining: Vec<i64> = match self.batch_deleted.get(&pos) {
            Some(old) => old
                .iter()
                .enumerate()
                .map(|(i, w)| w & ack_set.get(i).copied().unwrap_or(0))
                .collect(),
            None => ack_set.to_vec(),
        };
        if remaining.iter().all(|w| *w == 0) {
            return self.ack(pos, ledgers);
        }
        if !self.batch_deleted.contains_key(&pos)
            && self.batch_deleted.len() >= BATCH_DELETED_ENTRIES_MAX
        {
            return Ok(unchanged);
        }
        let changed = self.batch_deleted.get(&pos) != Some(&remaining);
        self.batch_deleted.insert(pos, remaining);
        self.dirty |= changed;
        Ok(AckOutcome {
            newly_acked: changed,
            mark_delete_moved: false,
        })
    }

    /// The bit set (1 = unacked) of a partly acknowledged batch entry, or
    /// `None` when no message of it was acked on its own.
    pub fn batch_unacked(&self, pos: Position) -> Option<&[i64]> {
        self.batch_deleted.get(&pos).map(Vec::as_slice)
    }

    /// Acknowledges every entry at or before `pos` (an entry). A position at or
    /// before the mark-delete changes nothing.
    pub fn ack_cumulative(
        &mut self,
        pos: Position,
        ledgers: &LedgerList,
    ) -> Result<AckOutcome, CursorError> {
        if pos <= self.mark_delete {
            return Ok(AckOutcome {
                newly_acked: false,
                mark_delete_moved: false,
            });
        }
        if !ledgers.contains_entry(pos) {
            return Err(CursorError::NotAnEntry(pos));
        }
        self.move_mark_delete(pos, ledgers);
        Ok(AckOutcome {
            newly_acked: true,
            mark_delete_moved: true,
        })
    }

    /// TTL expiry: acknowledges everything at or before `pos`, which may be any
    /// position up to the last confirmed one (e.g. `(L, -1)`). Moves the
    /// mark-delete only; deletes nothing. Returns whether it moved.
    pub fn expire_up_to(
        &mut self,
        pos: Position,
        ledgers: &LedgerList,
    ) -> Result<bool, CursorError> {
        if pos <= self.mark_delete {
            return Ok(false);
        }
        let last_confirmed = ledgers.last_confirmed_position();
        if pos > last_confirmed {
            return Err(CursorError::PastLastConfirmed {
                position: pos,
                last_confirmed,
            });
        }
        self.move_mark_delete(pos, ledgers);
        Ok(true)
    }

    /// Resets the cursor so the next entry delivered is the first entry at or
    /// after `pos` (backwards or forwards): the mark-delete becomes the position
    /// before `pos` and every individual ack is forgotten.
    pub fn reset_to(&mut self, pos: Position, ledgers: &LedgerList) -> Result<(), CursorError> {
        let mark_delete = pos.prev_in_ledger();
        let last_confirmed = ledgers.last_confirmed_position();
        if mark_delete > last_confirmed {
            return Err(CursorError::PastLastConfirmed {
                position: pos,
                last_confirmed,
            });
        }
        self.mark_delete = mark_delete;
        self.acked.clear();
        self.batch_deleted.clear();
        self.advance(ledgers);
        self.dirty = true;
        Ok(())
    }

    fn move_mark_delete(&mut self, pos: Position, ledgers: &LedgerList) {
        self.mark_delete = pos;
        self.acked.remove_up_to(pos);
        self.advance(ledgers);
        self.dirty = true;
    }

    /// Absorbs acked ranges contiguous with the mark-delete.
    fn advance(&mut self, ledgers: &LedgerList) -> bool {
        let mut moved = false;
        while let Some(next) = ledgers.next_valid_position(self.mark_delete) {
            let Some((_, last)) = self.acked.range_containing(next) else {
                break;
            };
            self.mark_delete = last;
            self.acked.remove_up_to(last);
            moved = true;
        }
        self.drop_batch_acks_up_to_mark_delete();
        moved
    }

    fn drop_batch_acks_up_to_mark_delete(&mut self) {
        while let Some((p, _)) = self.batch_deleted.first_key_value() {
            if *p > self.mark_delete {
                break;
            }
            self.batch_deleted.pop_first();
        }
    }

    /// Entries after the mark-delete up to the last confirmed position, minus
    /// the individually acknowledged ones.
    pub fn backlog_entries(&self, ledgers: &LedgerList) -> u64 {
        let total = ledgers.count_entries(self.mark_delete, ledgers.last_confirmed_position());
        total.saturating_sub(self.acked_entries_in(ledgers))
    }

    /// Estimated payload bytes of the backlog (ledger sizes spread evenly over
    /// their entries).
    pub fn backlog_size_bytes_estimate(&self, ledgers: &LedgerList) -> u64 {
        let total =
            ledgers.estimate_size_bytes(self.mark_delete, ledgers.last_confirmed_position());
        let acked = self
            .acked
            .iter()
            .map(|(f, l)| ledgers.estimate_size_bytes(f.prev_in_ledger(), l))
            .fold(0u64, u64::saturating_add);
        total.saturating_sub(acked)
    }

    /// Individually acked positions that are entries of `ledgers`.
    fn acked_entries_in(&self, ledgers: &LedgerList) -> u64 {
        self.acked
            .iter()
            .filter_map(|(f, l)| {
                let meta = ledgers.ledger(f.ledger_id)?;
                let last = meta.last_entry()?.entry_id.min(l.entry_id);
                (last >= f.entry_id).then(|| (last - f.entry_id).unsigned_abs() + 1)
            })
            .sum()
    }

    /// True if a snapshot should be written now: something changed and the
    /// last one was taken at least `persist_interval_ms` ago.
    pub fn should_persist(&self, now_ms: u64) -> bool {
        self.dirty
            && self
                .last_persist_ms
                .is_none_or(|t| now_ms.saturating_sub(t) >= self.config.persist_interval_ms)
    }

    /// True if closing must write a final snapshot (regardless of the rate).
    pub fn needs_persist_on_close(&self) -> bool {
        self.dirty
    }

    fn build_snapshot(&mut self, ranges_max: usize) -> Snapshot {
        self.sequence += 1;
        let persisted = self.acked.to_persisted(ranges_max);
        let snapshot = proto::CursorSnapshot {
            mark_delete: Some(self.mark_delete.into()),
            acked_ranges: persisted
                .ranges
                .iter()
                .map(|(f, l)| proto::PositionRange {
                    ledger_id: f.ledger_id,
                    first_entry_id: f.entry_id,
                    last_entry_id: l.entry_id,
                })
                .collect(),
            properties: self.properties.clone(),
            sequence: self.sequence,
            ranges_dropped: persisted.ranges_dropped,
            batch_deleted_indexes: self
                .batch_deleted
                .iter()
                .filter(|(p, _)| !self.acked.contains(**p))
                .take(BATCH_DELETED_ENTRIES_MAX)
                .map(|(p, bits)| proto::BatchDeletedIndexes {
                    position: Some((*p).into()),
                    ack_set: bits.clone(),
                })
                .collect(),
        };
        Snapshot {
            snapshot,
            ranges_dropped: persisted.ranges_dropped,
            entries_dropped: persisted.entries_dropped,
        }
    }

    /// Takes the snapshot to append to the cursor ledger now (call when
    /// [`Self::should_persist`] or on close): the state is then clean until the
    /// next change. If the write fails, call [`Self::persist_failed`].
    pub fn take_snapshot(&mut self, now_ms: u64) -> Snapshot {
        self.dirty = false;
        self.last_persist_ms = Some(now_ms);
        self.build_snapshot(self.config.ledger_ranges_max)
    }

    /// The snapshot write failed: the state is dirty again (retried at the
    /// next allowed time).
    pub fn persist_failed(&mut self) {
        self.dirty = true;
    }

    /// The cursor's metadata node: `cursor_ledger_id` (`None` = no cursor
    /// ledger, the snapshot here is authoritative) and a snapshot bounded by
    /// `metadata_ranges_max`, with its own sequence number.
    pub fn cursor_info(&mut self, cursor_ledger_id: Option<u64>) -> (proto::CursorInfo, Snapshot) {
        let snap = self.build_snapshot(self.config.metadata_ranges_max);
        let info = proto::CursorInfo {
            cursor_ledger_id: cursor_ledger_id
                .and_then(|id| i64::try_from(id).ok())
                .unwrap_or(-1),
            last_snapshot: Some(snap.snapshot.clone()),
            properties: self.cursor_properties.clone(),
        };
        (info, snap)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::managed_ledger::ledger_list::tests::list;

    fn p(l: u64, e: i64) -> Position {
        Position::new(l, e)
    }

    fn cursor(ledgers: &LedgerList) -> Cursor {
        Cursor::new(
            "sub",
            InitialPosition::Earliest,
            ledgers,
            CursorConfig::default(),
        )
    }

    #[test]
    fn individual_acks_advance_the_mark_delete_when_contiguous() {
        // (acks in order, expected mark-delete, expected ranges)
        let ledgers = list(&[(1, 3), (2, 0), (3, 3)], true);
        type Case<'a> = (&'a [(u64, i64)], Position, usize);
        let cases: &[Case] = &[
            (&[(1, 1)], p(1, -1), 1),
            (&[(1, 1), (1, 0)], p(1, 1), 0),
            (&[(1, 2), (1, 1), (1, 0)], p(1, 2), 0),
            // Across an empty ledger into the next one.
            (&[(3, 0), (1, 0), (1, 1), (1, 2)], p(3, 0), 0),
            (&[(3, 0), (3, 2), (1, 0), (1, 1), (1, 2)], p(3, 0), 1),
        ];
        for (acks, md, ranges) in cases {
            let mut c = cursor(&ledgers);
            for &(l, e) in *acks {
                c.ack(p(l, e), &ledgers).unwrap();
            }
            assert_eq!(c.mark_delete(), *md, "{acks:?}");
            assert_eq!(c.acked_ranges().range_count(), *ranges, "{acks:?}");
        }
    }

    #[test]
    fn acks_outside_the_ledger_list_are_refused_and_old_acks_ignored() {
        let ledgers = list(&[(1, 3)], true);
        let mut c = cursor(&ledgers);
        assert_eq!(
            c.ack(p(1, 3), &ledgers),
            Err(CursorError::NotAnEntry(p(1, 3)))
        );
        assert_eq!(
            c.ack(p(2, 0), &ledgers),
            Err(CursorError::NotAnEntry(p(2, 0)))
        );
        assert_eq!(
            c.ack_cumulative(p(1, 7), &ledgers),
            Err(CursorError::NotAnEntry(p(1, 7)))
        );
        c.ack_cumulative(p(1, 1), &ledgers).unwrap();
        let again = c.ack(p(1, 0), &ledgers).unwrap();
        assert!(!again.newly_acked && !again.mark_delete_moved);
        let stale = c.ack_cumulative(p(1, 0), &ledgers).unwrap();
        assert!(!stale.mark_delete_moved);
        assert_eq!(c.mark_delete(), p(1, 1));
    }

    #[test]
    fn cumulative_ack_absorbs_ranges_it_reaches() {
        let ledgers = list(&[(1, 10)], true);
        let mut c = cursor(&ledgers);
        for e in [3, 4, 6, 8] {
            c.ack(p(1, e), &ledgers).unwrap();
        }
        c.ack_cumulative(p(1, 2), &ledgers).unwrap();
        assert_eq!(c.mark_delete(), p(1, 4));
        assert_eq!(
            c.acked_ranges().iter().collect::<Vec<_>>(),
            vec![(p(1, 6), p(1, 6)), (p(1, 8), p(1, 8))]
        );
        assert!(c.is_acked(p(1, 0)) && c.is_acked(p(1, 6)) && !c.is_acked(p(1, 5)));
        assert_eq!(c.first_unacked(&ledgers), Some(p(1, 5)));
    }

    #[test]
    fn backlog_counts_entries_after_mark_delete_minus_individual_acks() {
        let ledgers = list(&[(1, 5), (2, 0), (3, 5)], true);
        // (cumulative ack, individual acks, backlog)
        type Case<'a> = (Option<Position>, &'a [(u64, i64)], u64);
        let cases: &[Case] = &[
            (None, &[], 10),
            (Some(p(1, 4)), &[], 5),
            (Some(p(1, 1)), &[(1, 3), (3, 0), (3, 4)], 5),
            (Some(p(3, 4)), &[], 0),
        ];
        for (cum, acks, want) in cases {
            let mut c = cursor(&ledgers);
            if let Some(pos) = cum {
                c.ack_cumulative(*pos, &ledgers).unwrap();
            }
            for &(l, e) in *acks {
                c.ack(p(l, e), &ledgers).unwrap();
            }
            assert_eq!(c.backlog_entries(&ledgers), *want, "{cum:?} {acks:?}");
            assert_eq!(c.backlog_size_bytes_estimate(&ledgers), want * 10);
        }
    }

    #[test]
    fn latest_cursor_has_no_backlog_and_sees_new_entries() {
        let mut ledgers = list(&[(1, 5), (2, 2)], true);
        let c = Cursor::new(
            "s",
            InitialPosition::Latest,
            &ledgers,
            CursorConfig::default(),
        );
        assert_eq!(c.backlog_entries(&ledgers), 0);
        ledgers.record_add(2, 2, 10).unwrap();
        assert_eq!(c.backlog_entries(&ledgers), 1);
        assert_eq!(c.first_unacked(&ledgers), Some(p(2, 2)));
    }

    #[test]
    fn reset_moves_either_way_and_forgets_individual_acks() {
        let ledgers = list(&[(1, 5), (2, 5)], true);
        let mut c = cursor(&ledgers);
        c.ack_cumulative(p(2, 1), &ledgers).unwrap();
        c.ack(p(2, 3), &ledgers).unwrap();
        c.reset_to(p(1, 2), &ledgers).unwrap();
        assert_eq!(c.mark_delete(), p(1, 1));
        assert!(c.acked_ranges().is_empty());
        assert_eq!(c.backlog_entries(&ledgers), 8);
        c.reset_to(p(2, 5), &ledgers).unwrap();
        assert_eq!(c.backlog_entries(&ledgers), 0);
        assert_eq!(
            c.reset_to(p(2, 7), &ledgers),
            Err(CursorError::PastLastConfirmed {
                position: p(2, 7),
                last_confirmed: p(2, 4)
            })
        );
    }

    #[test]
    fn ttl_expiry_moves_mark_delete_only_forward_and_never_past_the_end() {
        let ledgers = list(&[(1, 5), (2, 5)], true);
        let mut c = cursor(&ledgers);
        c.ack(p(2, 1), &ledgers).unwrap();
        // First unexpired entry is (2, 0): expire up to the position before it.
        assert_eq!(c.expire_up_to(p(2, -1), &ledgers), Ok(true));
        assert_eq!(c.mark_delete(), p(2, -1));
        assert_eq!(
            c.expire_up_to(p(1, 3), &ledgers),
            Ok(false),
            "never backwards"
        );
        assert_eq!(
            c.expire_up_to(p(3, -1), &ledgers),
            Err(CursorError::PastLastConfirmed {
                position: p(3, -1),
                last_confirmed: p(2, 4)
            })
        );
        assert_eq!(ttl_cutoff_ms(10_000, 0), None);
        assert_eq!(ttl_cutoff_ms(10_000, 3), Some(7_000));
        assert_eq!(ttl_cutoff_ms(1_000, 3), Some(0));
    }

    /// RELIABILITY P1-12: a simulated system clock jumping a day forward
    /// does not move the TTL cutoff past what monotonic time allows; one
    /// jumping backward is followed (expiring less, never more).
    #[test]
    fn ttl_now_ignores_forward_clock_jumps_and_follows_backward_ones() {
        let t0 = std::time::Instant::now();
        let anchor = WallAnchor::new(10_000_000, t0);
        let t1 = t0 + std::time::Duration::from_secs(5);
        // Forward by a day: bounded to anchor + 5 s.
        assert_eq!(
            anchor.bounded_now_ms(10_000_000 + 86_400_000, t1),
            10_005_000
        );
        // So a 60 s TTL expires only what was published 55 s before the anchor.
        let cutoff = ttl_cutoff_ms(anchor.bounded_now_ms(10_000_000 + 86_400_000, t1), 60);
        assert_eq!(cutoff, Some(9_945_000));
        // Backward by an hour: followed.
        assert_eq!(anchor.bounded_now_ms(6_405_000, t1), 6_405_000);
        // No jump: unchanged.
        assert_eq!(anchor.bounded_now_ms(10_005_000, t1), 10_005_000);
    }

    #[test]
    fn persistence_is_rate_limited_and_only_when_changed() {
        let ledgers = list(&[(1, 10)], true);
        let mut c = cursor(&ledgers);
        // (time ms, ack entry or none, expected should_persist, then take?)
        let steps: &[(u64, Option<i64>, bool)] = &[
            (0, None, true), // a new cursor needs its first persist
            (10, Some(0), false),
            (999, Some(1), false),
            (1_000, None, true),
            (1_500, None, false), // nothing changed since 1000
            (1_600, Some(5), false),
            (2_000, None, true),
        ];
        for &(now, ack, want) in steps {
            if let Some(e) = ack {
                c.ack(p(1, e), &ledgers).unwrap();
            }
            assert_eq!(c.should_persist(now), want, "at {now}");
            if want {
                c.take_snapshot(now);
            }
        }
        assert!(!c.needs_persist_on_close());
        c.ack(p(1, 7), &ledgers).unwrap();
        assert!(
            c.needs_persist_on_close(),
            "close persists whatever changed"
        );
        c.take_snapshot(2_100);
        c.persist_failed();
        assert!(c.needs_persist_on_close() && c.should_persist(3_100));
    }

    #[test]
    fn snapshot_restores_the_full_state_and_the_bound_drops_only_acks() {
        let ledgers = list(&[(1, 100)], true);
        let config = CursorConfig {
            ledger_ranges_max: 2,
            metadata_ranges_max: 1,
            ..CursorConfig::default()
        };
        let mut c = Cursor::new("s", InitialPosition::Earliest, &ledgers, config.clone());
        c.ack_cumulative(p(1, 4), &ledgers).unwrap();
        for e in [10, 11, 20, 30, 31, 32] {
            c.ack(p(1, e), &ledgers).unwrap();
        }
        c.set_properties(BTreeMap::from([("k".to_string(), 7)]));
        c.cursor_properties_mut().insert("a".into(), "b".into());
        let snap = c.take_snapshot(5);
        assert_eq!((snap.ranges_dropped, snap.entries_dropped), (1, 3));
        let r = Cursor::restore("s", &snap.snapshot, config.clone()).unwrap();
        assert_eq!(r.mark_delete(), p(1, 4));
        assert_eq!(r.properties(), c.properties());
        assert!(r.is_acked(p(1, 11)) && r.is_acked(p(1, 20)));
        assert!(!r.is_acked(p(1, 30)), "dropped ack is redelivered");
        assert_eq!(r.backlog_entries(&ledgers), c.backlog_entries(&ledgers) + 3);

        let (info, meta) = c.cursor_info(Some(42));
        assert_eq!(info.cursor_ledger_id, 42);
        assert_eq!(meta.ranges_dropped, 2);
        assert!(meta.snapshot.sequence > snap.snapshot.sequence);
        let r2 = Cursor::restore_from_info("s", &info, config).unwrap();
        assert_eq!(r2.cursor_properties(), c.cursor_properties());
        assert_eq!(
            newest_snapshot(Some(&snap.snapshot), info.last_snapshot.as_ref()),
            info.last_snapshot.as_ref()
        );
        assert_eq!(c.cursor_info(None).0.cursor_ledger_id, -1);
    }

    #[test]
    fn corrupt_snapshots_are_refused() {
        let range = |l, f, t| proto::PositionRange {
            ledger_id: l,
            first_entry_id: f,
            last_entry_id: t,
        };
        let md = Some(proto::Position::from(p(1, 5)));
        let cases = [
            proto::CursorSnapshot::default(),
            proto::CursorSnapshot {
                mark_delete: md,
                acked_ranges: vec![range(1, 3, 7)],
                ..Default::default()
            },
            proto::CursorSnapshot {
                mark_delete: md,
                acked_ranges: vec![range(1, 9, 8)],
                ..Default::default()
            },
            proto::CursorSnapshot {
                mark_delete: md,
                acked_ranges: vec![range(2, 3, 4), range(1, 9, 9)],
                ..Default::default()
            },
            proto::CursorSnapshot {
                mark_delete: Some(proto::Position::from(p(1, -2))),
                ..Default::default()
            },
        ];
        for snap in cases {
            assert!(
                matches!(
                    Cursor::restore("s", &snap, CursorConfig::default()),
                    Err(CursorError::CorruptSnapshot(_))
                ),
                "{snap:?}"
            );
        }
        assert!(matches!(
            Cursor::restore_from_info("s", &proto::CursorInfo::default(), CursorConfig::default()),
            Err(CursorError::CorruptSnapshot(_))
        ));
    }

    #[test]
    fn cursor_ledger_rolls_by_entries_or_age() {
        let r = CursorLedgerRollover::default();
        let cases = [
            (0, 0, 0, false),
            (49_999, 0, 14_399_999, false),
            (50_000, 0, 1, true),
            (1, 100, 14_400_100, true),
            (1, 500, 100, false), // clock went backwards: no roll
        ];
        for (entries, ctime, now, want) in cases {
            assert_eq!(
                r.should_roll(entries, ctime, now),
                want,
                "{entries} {ctime} {now}"
            );
        }
    }

    /// Random acks against a model: a set of acked entries.
    #[test]
    fn random_ack_sequences_match_a_naive_model() {
        for seed in 0..1_000u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let shape: Vec<(u64, u64)> = (1..=rng.random_range(1..=4u64))
                .map(|id| (id * 2, rng.random_range(0..15u64)))
                .collect();
            let ledgers = list(&shape, true);
            let entries: Vec<Position> = shape
                .iter()
                .flat_map(|&(l, n)| (0..n as i64).map(move |e| p(l, e)))
                .collect();
            let mut c = cursor(&ledgers);
            let mut model: BTreeSet<Position> = BTreeSet::new();
            if entries.is_empty() {
                assert_eq!(c.backlog_entries(&ledgers), 0);
                continue;
            }
            for _ in 0..rng.random_range(1..60) {
                let pos = entries[rng.random_range(0..entries.len())];
                if rng.random_range(0..10) == 0 {
                    c.ack_cumulative(pos, &ledgers).unwrap();
                    model.extend(entries.iter().filter(|q| **q <= pos));
                } else {
                    c.ack(pos, &ledgers).unwrap();
                    model.insert(pos);
                }
                for q in &entries {
                    assert_eq!(c.is_acked(*q), model.contains(q), "seed {seed} {q}");
                }
                let first_unacked = entries.iter().find(|q| !model.contains(q)).copied();
                assert_eq!(c.first_unacked(&ledgers), first_unacked, "seed {seed}");
                let want = (entries.len() - model.len()) as u64;
                assert_eq!(c.backlog_entries(&ledgers), want, "seed {seed}");
            }
            // A bounded snapshot never acks what the model has not acked, and
            // keeps everything up to the mark-delete.
            let bound = rng.random_range(0..3usize);
            let mut bounded = c.clone();
            bounded.config.ledger_ranges_max = bound;
            let snap = bounded.take_snapshot(0);
            let r = Cursor::restore("s", &snap.snapshot, CursorConfig::default()).unwrap();
            for q in &entries {
                if r.is_acked(*q) {
                    assert!(
                        model.contains(q),
                        "seed {seed}: {q} acked only after restore"
                    );
                }
                if *q <= c.mark_delete() {
                    assert!(r.is_acked(*q));
                }
            }
            assert_eq!(
                r.backlog_entries(&ledgers),
                c.backlog_entries(&ledgers) + snap.entries_dropped,
                "seed {seed}"
            );
        }
    }

    #[test]
    fn batch_index_acks_accumulate_persist_and_ack_the_entry_when_complete() {
        let ledgers = list(&[(1, 5)], true);
        let mut c = cursor(&ledgers);
        // A batch of 10 (bits 0..9 set = unacked); ack 1, then 3 and 5.
        let all: i64 = (1 << 10) - 1;
        c.ack_batch_index(p(1, 0), &[all & !(1 << 1)], &ledgers)
            .unwrap_or_else(|e| panic!("{e}"));
        c.ack_batch_index(p(1, 0), &[all & !(1 << 3) & !(1 << 5)], &ledgers)
            .unwrap_or_else(|e| panic!("{e}"));
        let left = all & !(1 << 1) & !(1 << 3) & !(1 << 5);
        assert_eq!(c.batch_unacked(p(1, 0)), Some(&[left][..]));
        assert!(!c.is_acked(p(1, 0)));
        // Survives a snapshot and restore.
        let snap = c.take_snapshot(1).snapshot;
        let mut r = Cursor::restore("sub", &snap, CursorConfig::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.batch_unacked(p(1, 0)), Some(&[left][..]));
        // The rest acked one call at a time: the entry is acked, the set gone.
        for i in [0, 2, 4, 6, 7, 8, 9] {
            assert!(!r.is_acked(p(1, 0)), "before {i}");
            r.ack_batch_index(p(1, 0), &[all & !(1 << i)], &ledgers)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert!(r.is_acked(p(1, 0)));
        assert_eq!(r.mark_delete(), p(1, 0));
        assert_eq!(r.batch_unacked(p(1, 0)), None);
        // An ack of the whole entry forgets its set; a seek forgets all.
        r.ack_batch_index(p(1, 2), &[all & !1], &ledgers)
            .unwrap_or_else(|e| panic!("{e}"));
        r.ack(p(1, 2), &ledgers).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.batch_unacked(p(1, 2)), None);
        r.ack_batch_index(p(1, 3), &[all & !1], &ledgers)
            .unwrap_or_else(|e| panic!("{e}"));
        r.reset_to(p(1, 0), &ledgers)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.batch_unacked(p(1, 3)), None);
    }

    #[test]
    fn a_snapshot_with_an_empty_or_stale_batch_ack_is_corrupt() {
        let md = Some(proto::Position::from(p(1, 5)));
        for (pos, bits) in [(p(1, 6), vec![0_i64]), (p(1, 5), vec![1_i64])] {
            let snap = proto::CursorSnapshot {
                mark_delete: md,
                batch_deleted_indexes: vec![proto::BatchDeletedIndexes {
                    position: Some(pos.into()),
                    ack_set: bits,
                }],
                ..Default::default()
            };
            assert!(matches!(
                Cursor::restore("s", &snap, CursorConfig::default()),
                Err(CursorError::CorruptSnapshot(_))
            ));
        }
    }

    #[test]
    fn batch_index_acks_are_bounded_and_extra_partial_acks_are_dropped() {
        let n = i64::try_from(BATCH_DELETED_ENTRIES_MAX).unwrap_or(i64::MAX);
        let entries = u64::try_from(n).unwrap_or(u64::MAX) + 2;
        let ledgers = list(&[(1, entries)], true);
        let mut c = cursor(&ledgers);
        // Entry 0 stays unacked so nothing is absorbed by the mark-delete.
        for e in 1..=n {
            c.ack_batch_index(p(1, e), &[0b10], &ledgers)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let over = c
            .ack_batch_index(p(1, n + 1), &[0b10], &ledgers)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!over.newly_acked, "past the bound a partial ack is dropped");
        assert_eq!(c.batch_unacked(p(1, n + 1)), None);
        // A complete ack still goes through, and frees a slot.
        c.ack_batch_index(p(1, 1), &[0], &ledgers)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(c.is_acked(p(1, 1)));
        c.ack_batch_index(p(1, n + 1), &[0b10], &ledgers)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.batch_unacked(p(1, n + 1)), Some(&[0b10_i64][..]));
        let snap = c.take_snapshot(1).snapshot;
        assert_eq!(snap.batch_deleted_indexes.len(), BATCH_DELETED_ENTRIES_MAX);
    }
}
