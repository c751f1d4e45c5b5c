//! The managed ledger's ledger list: the topic as an ordered list of ledgers
//! (`ManagedLedgerInfo` in the metadata store) and the position arithmetic
//! over it.
//!
//! Promises: ledger ids are strictly ascending along the list; the current
//! ledger (open for appends), if any, is the last one and is not closed;
//! appends are recorded in entry order only; a ledger's final entry count is
//! never below what was confirmed for it; a list decoded from the metadata
//! store is validated before use ([`LedgerList::from_proto`]). Positions that
//! fall in trimmed or missing ledgers are handled (they are simply not
//! entries), so a cursor's mark-delete may point into a ledger already gone.

use std::collections::BTreeMap;

use super::position::Position;
use super::proto;

/// One ledger of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerMeta {
    /// Ledger id.
    pub ledger_id: u64,
    /// Number of entries (last entry id + 1); for the current ledger, the
    /// entries confirmed so far.
    pub entries: u64,
    /// Payload bytes of those entries.
    pub size_bytes: u64,
    /// Creation time, ms since the Unix epoch.
    pub ctime_ms: u64,
    /// Close time with final counts, ms since the Unix epoch; `None` = open.
    pub closed_ms: Option<u64>,
}

impl LedgerMeta {
    /// The last entry of this ledger, if it has any.
    pub fn last_entry(&self) -> Option<Position> {
        entry_id(self.entries)
            .filter(|_| self.entries > 0)
            .map(|n| Position::new(self.ledger_id, n - 1))
    }

    /// True if `pos` is an entry of this ledger.
    pub fn contains_entry(&self, pos: Position) -> bool {
        pos.ledger_id == self.ledger_id
            && pos.entry_id >= 0
            && u64::try_from(pos.entry_id).is_ok_and(|e| e < self.entries)
    }
}

/// Errors of ledger-list updates and of decoding a stored list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerListError {
    /// A new ledger's id is not above the last listed one.
    #[error("ledger {ledger_id} is not after the last listed ledger {last_ledger_id}")]
    NotAscending {
        /// The ledger being added.
        ledger_id: u64,
        /// The last ledger already listed.
        last_ledger_id: u64,
    },
    /// The ledger is not in the list.
    #[error("ledger {0} is not in the list")]
    UnknownLedger(u64),
    /// An append was recorded for a ledger that is not the current one.
    #[error("ledger {0} is not the current ledger")]
    NotCurrent(u64),
    /// An append was recorded out of entry order.
    #[error("append to ledger {ledger_id} out of order: expected entry {expected}, got {got}")]
    OutOfOrderAdd {
        /// The current ledger.
        ledger_id: u64,
        /// The entry id the next append must have.
        expected: u64,
        /// The entry id recorded.
        got: i64,
    },
    /// A close reported fewer entries than were confirmed (would lose acked data).
    #[error("ledger {ledger_id} closed with {closed} entries but {confirmed} were confirmed")]
    ClosedBelowConfirmed {
        /// The ledger.
        ledger_id: u64,
        /// Entries confirmed before the close.
        confirmed: u64,
        /// Entries the close reported.
        closed: u64,
    },
    /// The ledger was already closed with other final counts.
    #[error("ledger {0} is already closed with other final counts")]
    AlreadyClosed(u64),
    /// The current ledger cannot be removed.
    #[error("ledger {0} is the current ledger and cannot be removed")]
    RemoveCurrent(u64),
    /// A stored list breaks the list's invariants.
    #[error("corrupt managed-ledger info: {0}")]
    Corrupt(String),
}

/// The ledger list of one managed ledger plus its topic properties.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerList {
    ledgers: Vec<LedgerMeta>,
    properties: BTreeMap<String, String>,
    current_ledger_id: Option<u64>,
}

/// `entries` as an entry id count, if it fits an `i64` (it always does for
/// real ledgers; a corrupt count is rejected at decode).
fn entry_id(entries: u64) -> Option<i64> {
    i64::try_from(entries).ok()
}

impl LedgerList {
    /// An empty list (a topic that has never had a ledger).
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes and validates a stored list.
    pub fn from_proto(info: &proto::ManagedLedgerInfo) -> Result<Self, LedgerListError> {
        let mut ledgers: Vec<LedgerMeta> = Vec::with_capacity(info.ledgers.len());
        for l in &info.ledgers {
            if let Some(last) = ledgers.last()
                && l.ledger_id <= last.ledger_id
            {
                return Err(LedgerListError::Corrupt(format!(
                    "ledger {} listed after ledger {}",
                    l.ledger_id, last.ledger_id
                )));
            }
            if entry_id(l.entries).is_none() {
                return Err(LedgerListError::Corrupt(format!(
                    "ledger {} has an impossible entry count {}",
                    l.ledger_id, l.entries
                )));
            }
            ledgers.push(LedgerMeta {
                ledger_id: l.ledger_id,
                entries: l.entries,
                size_bytes: l.size_bytes,
                ctime_ms: l.ctime_ms,
                closed_ms: (l.closed_ms != 0).then_some(l.closed_ms),
            });
        }
        if let Some(current) = info.current_ledger_id {
            match ledgers.last() {
                Some(last) if last.ledger_id == current && last.closed_ms.is_none() => {}
                _ => {
                    return Err(LedgerListError::Corrupt(format!(
                        "current ledger {current} is not the last, open ledger of the list"
                    )));
                }
            }
        }
        Ok(Self {
            ledgers,
            properties: info.properties.clone(),
            current_ledger_id: info.current_ledger_id,
        })
    }

    /// The record to store in the metadata store.
    pub fn to_proto(&self) -> proto::ManagedLedgerInfo {
        proto::ManagedLedgerInfo {
            ledgers: self
                .ledgers
                .iter()
                .map(|l| proto::LedgerInfo {
                    ledger_id: l.ledger_id,
                    entries: l.entries,
                    size_bytes: l.size_bytes,
                    ctime_ms: l.ctime_ms,
                    closed_ms: l.closed_ms.unwrap_or(0),
                })
                .collect(),
            properties: self.properties.clone(),
            current_ledger_id: self.current_ledger_id,
        }
    }

    /// The ledgers, oldest first.
    pub fn ledgers(&self) -> &[LedgerMeta] {
        &self.ledgers
    }

    /// The ledger with this id.
    pub fn ledger(&self, ledger_id: u64) -> Option<&LedgerMeta> {
        self.index_of(ledger_id).map(|i| &self.ledgers[i])
    }

    /// The ledger open for appends, if any.
    pub fn current_ledger_id(&self) -> Option<u64> {
        self.current_ledger_id
    }

    /// Ledgers listed but not closed (the current one included): on open, every
    /// one of them is recovery-opened and recorded closed before a new ledger is
    /// added, so no previous owner can still append (invariant 5).
    pub fn unclosed_ledger_ids(&self) -> Vec<u64> {
        self.ledgers
            .iter()
            .filter(|l| l.closed_ms.is_none())
            .map(|l| l.ledger_id)
            .collect()
    }

    /// Topic properties.
    pub fn properties(&self) -> &BTreeMap<String, String> {
        &self.properties
    }

    /// Topic properties, for update.
    pub fn properties_mut(&mut self) -> &mut BTreeMap<String, String> {
        &mut self.properties
    }

    fn index_of(&self, ledger_id: u64) -> Option<usize> {
        self.ledgers
            .binary_search_by_key(&ledger_id, |l| l.ledger_id)
            .ok()
    }

    /// Appends a newly created ledger, which becomes the current one. The
    /// previous current ledger stays listed with the counts recorded so far
    /// until [`Self::record_closed`] gives its final ones.
    pub fn add_ledger(&mut self, ledger_id: u64, ctime_ms: u64) -> Result<(), LedgerListError> {
        if let Some(last) = self.ledgers.last()
            && ledger_id <= last.ledger_id
        {
            return Err(LedgerListError::NotAscending {
                ledger_id,
                last_ledger_id: last.ledger_id,
            });
        }
        self.ledgers.push(LedgerMeta {
            ledger_id,
            entries: 0,
            size_bytes: 0,
            ctime_ms,
            closed_ms: None,
        });
        self.current_ledger_id = Some(ledger_id);
        Ok(())
    }

    /// Records a confirmed append of `entry_id` (`size_bytes` of payload) to the
    /// current ledger; entries must be recorded in order. Returns its position.
    pub fn record_add(
        &mut self,
        ledger_id: u64,
        entry_id: i64,
        size_bytes: u64,
    ) -> Result<Position, LedgerListError> {
        if self.current_ledger_id != Some(ledger_id) {
            return Err(LedgerListError::NotCurrent(ledger_id));
        }
        let i = self
            .index_of(ledger_id)
            .ok_or(LedgerListError::UnknownLedger(ledger_id))?;
        let l = &mut self.ledgers[i];
        if u64::try_from(entry_id).ok() != Some(l.entries) {
            return Err(LedgerListError::OutOfOrderAdd {
                ledger_id,
                expected: l.entries,
                got: entry_id,
            });
        }
        l.entries += 1;
        l.size_bytes = l.size_bytes.saturating_add(size_bytes);
        Ok(Position::new(ledger_id, entry_id))
    }

    /// Records a ledger's close (by this owner, or by recovery) with its final
    /// entry count and size. Closing the current ledger leaves no current one.
    /// Idempotent for the same final counts.
    pub fn record_closed(
        &mut self,
        ledger_id: u64,
        entries: u64,
        size_bytes: u64,
        closed_ms: u64,
    ) -> Result<(), LedgerListError> {
        let i = self
            .index_of(ledger_id)
            .ok_or(LedgerListError::UnknownLedger(ledger_id))?;
        let l = &mut self.ledgers[i];
        if l.closed_ms.is_some() {
            return if l.entries == entries && l.size_bytes == size_bytes {
                Ok(())
            } else {
                Err(LedgerListError::AlreadyClosed(ledger_id))
            };
        }
        if entries < l.entries {
            return Err(LedgerListError::ClosedBelowConfirmed {
                ledger_id,
                confirmed: l.entries,
                closed: entries,
            });
        }
        if entry_id(entries).is_none() {
            return Err(LedgerListError::Corrupt(format!(
                "ledger {ledger_id} closed with an impossible entry count {entries}"
            )));
        }
        l.entries = entries;
        l.size_bytes = size_bytes;
        // 0 means "open" in the stored record: a close at time 0 is stored as 1.
        l.closed_ms = Some(closed_ms.max(1));
        if self.current_ledger_id == Some(ledger_id) {
            self.current_ledger_id = None;
        }
        Ok(())
    }

    /// Removes a ledger from the list (after trimming decided it may go).
    pub fn remove_ledger(&mut self, ledger_id: u64) -> Result<LedgerMeta, LedgerListError> {
        if self.current_ledger_id == Some(ledger_id) {
            return Err(LedgerListError::RemoveCurrent(ledger_id));
        }
        let i = self
            .index_of(ledger_id)
            .ok_or(LedgerListError::UnknownLedger(ledger_id))?;
        Ok(self.ledgers.remove(i))
    }

    /// The first entry of the topic (first entry of the first non-empty ledger).
    pub fn first_position(&self) -> Option<Position> {
        self.ledgers
            .iter()
            .find(|l| l.entries > 0)
            .map(|l| Position::new(l.ledger_id, 0))
    }

    /// The last entry of the topic (last entry of the last non-empty ledger).
    pub fn last_entry(&self) -> Option<Position> {
        self.ledgers.iter().rev().find_map(LedgerMeta::last_entry)
    }

    /// The last confirmed position: the last entry of the last listed ledger,
    /// or `(last ledger, -1)` if that ledger is empty (or `(0, -1)` with no
    /// ledger). Every entry of the topic is at or before it and every future
    /// one after it; a cursor may be moved up to it, never past it.
    pub fn last_confirmed_position(&self) -> Position {
        self.ledgers.last().map_or(Position::before_ledger(0), |l| {
            Position::new(l.ledger_id, entry_id(l.entries).unwrap_or(i64::MAX) - 1)
        })
    }

    /// The position before the first entry of the topic: a mark-delete there
    /// means nothing is consumed.
    pub fn earliest_mark_delete(&self) -> Position {
        Position::before_ledger(self.ledgers.first().map_or(0, |l| l.ledger_id))
    }

    /// True if `pos` is an entry of a listed ledger.
    pub fn contains_entry(&self, pos: Position) -> bool {
        self.ledger_of(pos).is_some()
    }

    /// The ledger holding the entry at `pos`, if `pos` is an entry.
    pub fn ledger_of(&self, pos: Position) -> Option<&LedgerMeta> {
        self.ledger(pos.ledger_id).filter(|l| l.contains_entry(pos))
    }

    /// The first entry after `pos`, skipping empty, trimmed and missing
    /// ledgers; `None` if no entry follows `pos` yet.
    pub fn next_valid_position(&self, pos: Position) -> Option<Position> {
        let start = self
            .ledgers
            .partition_point(|l| l.ledger_id < pos.ledger_id);
        for l in &self.ledgers[start..] {
            if l.ledger_id == pos.ledger_id {
                let next = pos.next_in_ledger();
                if l.contains_entry(next) {
                    return Some(next);
                }
            } else if l.entries > 0 {
                return Some(Position::new(l.ledger_id, 0));
            }
        }
        None
    }

    /// Entry ids `[lo, hi]` of `l` inside the open-closed interval
    /// `(after, up_to]`, if any.
    fn entries_in(l: &LedgerMeta, after: Position, up_to: Position) -> Option<(i64, i64)> {
        let last = l.last_entry()?.entry_id;
        let lo = match l.ledger_id.cmp(&after.ledger_id) {
            std::cmp::Ordering::Less => return None,
            std::cmp::Ordering::Equal => after.entry_id.saturating_add(1).max(0),
            std::cmp::Ordering::Greater => 0,
        };
        let hi = match l.ledger_id.cmp(&up_to.ledger_id) {
            std::cmp::Ordering::Greater => return None,
            std::cmp::Ordering::Equal => up_to.entry_id.min(last),
            std::cmp::Ordering::Less => last,
        };
        (lo <= hi).then_some((lo, hi))
    }

    /// Number of entries `p` with `after < p <= up_to`.
    pub fn count_entries(&self, after: Position, up_to: Position) -> u64 {
        self.ledgers
            .iter()
            .filter_map(|l| Self::entries_in(l, after, up_to))
            .map(|(lo, hi)| (hi - lo + 1).unsigned_abs())
            .sum()
    }

    /// Estimated payload bytes of the entries `p` with `after < p <= up_to`
    /// (each ledger's size spread evenly over its entries).
    pub fn estimate_size_bytes(&self, after: Position, up_to: Position) -> u64 {
        self.ledgers
            .iter()
            .filter_map(|l| {
                let (lo, hi) = Self::entries_in(l, after, up_to)?;
                let n = u128::from((hi - lo + 1).unsigned_abs());
                let est = u128::from(l.size_bytes) * n / u128::from(l.entries.max(1));
                Some(u64::try_from(est).unwrap_or(u64::MAX))
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Entries of all listed ledgers.
    pub fn total_entries(&self) -> u64 {
        self.ledgers.iter().map(|l| l.entries).sum()
    }

    /// Payload bytes of all listed ledgers.
    pub fn total_size_bytes(&self) -> u64 {
        self.ledgers
            .iter()
            .map(|l| l.size_bytes)
            .fold(0u64, u64::saturating_add)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A list of closed ledgers `(id, entries)`, each entry 10 bytes, ctime =
    /// id, closed at id + 1000; the last one stays current if `last_open`.
    pub(crate) fn list(ledgers: &[(u64, u64)], last_open: bool) -> LedgerList {
        let mut list = LedgerList::new();
        for (i, &(id, entries)) in ledgers.iter().enumerate() {
            list.add_ledger(id, id).unwrap();
            for e in 0..entries {
                list.record_add(id, e as i64, 10).unwrap();
            }
            if !(last_open && i + 1 == ledgers.len()) {
                list.record_closed(id, entries, entries * 10, id + 1000)
                    .unwrap();
            }
        }
        list
    }

    fn p(l: u64, e: i64) -> Position {
        Position::new(l, e)
    }

    #[test]
    fn first_and_last_positions_skip_empty_ledgers() {
        // (ledgers, first, last entry, last confirmed)
        type Case<'a> = (
            &'a [(u64, u64)],
            Option<Position>,
            Option<Position>,
            Position,
        );
        let cases: &[Case] = &[
            (&[], None, None, p(0, -1)),
            (&[(5, 0)], None, None, p(5, -1)),
            (
                &[(1, 0), (2, 3), (3, 0)],
                Some(p(2, 0)),
                Some(p(2, 2)),
                p(3, -1),
            ),
            (&[(1, 4), (2, 3)], Some(p(1, 0)), Some(p(2, 2)), p(2, 2)),
        ];
        for (ledgers, first, last, lac) in cases {
            let l = list(ledgers, true);
            assert_eq!(l.first_position(), *first, "{ledgers:?}");
            assert_eq!(l.last_entry(), *last, "{ledgers:?}");
            assert_eq!(l.last_confirmed_position(), *lac, "{ledgers:?}");
        }
    }

    #[test]
    fn next_valid_position_skips_empty_and_missing_ledgers() {
        let l = list(&[(2, 2), (3, 0), (5, 1)], true);
        let cases = [
            (p(0, -1), Some(p(2, 0))),
            (p(1, 7), Some(p(2, 0))),
            (p(2, -1), Some(p(2, 0))),
            (p(2, 0), Some(p(2, 1))),
            (p(2, 1), Some(p(5, 0))),
            (p(3, -1), Some(p(5, 0))),
            (p(4, 100), Some(p(5, 0))),
            (p(5, 0), None),
            (p(9, -1), None),
        ];
        for (from, want) in cases {
            assert_eq!(l.next_valid_position(from), want, "after {from}");
        }
    }

    #[test]
    fn count_entries_is_open_closed_and_spans_ledgers() {
        let l = list(&[(1, 3), (2, 0), (3, 4)], true);
        let cases = [
            (p(0, -1), p(9, 0), 7),
            (p(1, -1), p(1, 2), 3),
            (p(1, 0), p(1, 2), 2),
            (p(1, 2), p(3, 0), 1),
            (p(1, 1), p(3, 3), 5),
            (p(3, 3), p(3, 3), 0),
            (p(3, 2), p(1, 0), 0),
            (p(2, -1), p(3, 1), 2),
        ];
        for (after, up_to, want) in cases {
            assert_eq!(l.count_entries(after, up_to), want, "({after}, {up_to}]");
            assert_eq!(l.estimate_size_bytes(after, up_to), want * 10);
        }
    }

    #[test]
    fn ledger_of_finds_only_real_entries() {
        let l = list(&[(1, 3), (3, 1)], true);
        assert_eq!(l.ledger_of(p(1, 2)).map(|m| m.ledger_id), Some(1));
        assert!(l.ledger_of(p(1, 3)).is_none());
        assert!(l.ledger_of(p(1, -1)).is_none());
        assert!(l.ledger_of(p(2, 0)).is_none());
        assert_eq!(l.ledger_of(p(3, 0)).map(|m| m.ledger_id), Some(3));
    }

    #[test]
    fn updates_refuse_what_would_break_the_list() {
        let mut l = list(&[(1, 2), (4, 1)], true);
        assert_eq!(
            l.add_ledger(3, 0),
            Err(LedgerListError::NotAscending {
                ledger_id: 3,
                last_ledger_id: 4
            })
        );
        assert_eq!(l.record_add(1, 2, 1), Err(LedgerListError::NotCurrent(1)));
        assert_eq!(
            l.record_add(4, 5, 1),
            Err(LedgerListError::OutOfOrderAdd {
                ledger_id: 4,
                expected: 1,
                got: 5
            })
        );
        assert_eq!(l.remove_ledger(4), Err(LedgerListError::RemoveCurrent(4)));
        assert_eq!(
            l.record_closed(4, 0, 0, 9),
            Err(LedgerListError::ClosedBelowConfirmed {
                ledger_id: 4,
                confirmed: 1,
                closed: 0
            })
        );
        assert_eq!(l.record_closed(1, 2, 20, 5), Ok(()), "idempotent");
        assert_eq!(
            l.record_closed(1, 3, 30, 5),
            Err(LedgerListError::AlreadyClosed(1))
        );
        assert_eq!(
            l.record_closed(7, 0, 0, 5),
            Err(LedgerListError::UnknownLedger(7))
        );
    }

    #[test]
    fn rollover_keeps_old_counts_until_close_and_recovery_may_find_more() {
        let mut l = list(&[(1, 2)], true);
        l.add_ledger(2, 50).unwrap();
        assert_eq!(l.current_ledger_id(), Some(2));
        assert_eq!(l.unclosed_ledger_ids(), vec![1, 2]);
        // Recovery of ledger 1 finds an entry whose ack was still in flight.
        l.record_closed(1, 3, 30, 60).unwrap();
        assert_eq!(l.ledger(1).map(|m| m.entries), Some(3));
        assert_eq!(l.unclosed_ledger_ids(), vec![2]);
        l.record_closed(2, 0, 0, 70).unwrap();
        assert_eq!(l.current_ledger_id(), None);
        assert_eq!(l.total_entries(), 3);
        assert_eq!(l.total_size_bytes(), 30);
        assert_eq!(l.remove_ledger(1).map(|m| m.ledger_id), Ok(1));
        assert_eq!(l.first_position(), None);
    }

    #[test]
    fn proto_round_trip_and_validation() {
        let mut l = list(&[(1, 2), (2, 0), (3, 5)], true);
        l.properties_mut().insert("k".into(), "v".into());
        let back = LedgerList::from_proto(&l.to_proto()).unwrap();
        assert_eq!(back, l);

        let mut bad = l.to_proto();
        bad.ledgers.swap(0, 1);
        assert!(matches!(
            LedgerList::from_proto(&bad),
            Err(LedgerListError::Corrupt(_))
        ));
        let mut bad = l.to_proto();
        bad.current_ledger_id = Some(1);
        assert!(matches!(
            LedgerList::from_proto(&bad),
            Err(LedgerListError::Corrupt(_))
        ));
        let mut bad = l.to_proto();
        bad.ledgers[0].entries = u64::MAX;
        assert!(matches!(
            LedgerList::from_proto(&bad),
            Err(LedgerListError::Corrupt(_))
        ));
    }
}
