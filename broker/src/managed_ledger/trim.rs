//! Trimming: which ledgers of a managed ledger may be deleted now
//! (invariant 7: nothing is deleted that a cursor or retention still needs).
//!
//! Promises: the answer is a prefix of the ledger list (oldest first) in which
//! every ledger
//! - is wholly at or before the slowest durable cursor's mark-delete (with no
//!   durable cursor, every entry counts as consumed, as in Pulsar);
//! - is closed with final counts (a ledger a previous owner may still write
//!   is never deleted);
//! - is neither the current ledger nor the last listed one (the last confirmed
//!   position stays known);
//! - is allowed by retention: its retention time has passed since it was
//!   closed, OR the topic stays at or above the retention size without it.
//!   Retention time / size: 0 = no retention on that axis, −1 (any negative)
//!   = infinite. Both −1 keeps everything; Pulsar rejects (0, >0) and (>0, 0)
//!   as invalid — here a 0 on either axis lets consumed ledgers go at once.
//!
//! The driver must take the mark-delete of every durable cursor (non-durable
//! reader cursors do not hold data back) and feeds the minimum.

use super::ledger_list::LedgerList;
use super::position::Position;

/// Retention of consumed data (namespace policy; Pulsar's
/// `defaultRetentionTimeInMinutes=0`, `defaultRetentionSizeInMB=0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionPolicy {
    /// Keep consumed ledgers this many minutes after their close; 0 = none,
    /// −1 = forever.
    pub time_minutes: i64,
    /// Keep at least this many MiB of the newest data; 0 = none, −1 = no limit.
    pub size_mb: i64,
}

const MIB: u64 = 1024 * 1024;

impl RetentionPolicy {
    /// True if retention lets a ledger closed at `closed_ms` go at `now_ms`,
    /// given that `remaining_bytes` stay in the topic after deleting it.
    fn allows(&self, closed_ms: u64, now_ms: u64, remaining_bytes: u64) -> bool {
        let time_passed = u64::try_from(self.time_minutes)
            .is_ok_and(|m| now_ms.saturating_sub(closed_ms) >= m.saturating_mul(60_000));
        let size_kept =
            u64::try_from(self.size_mb).is_ok_and(|mb| remaining_bytes >= mb.saturating_mul(MIB));
        time_passed || size_kept
    }
}

/// Ids of the ledgers that may be deleted now, oldest first (see the module
/// doc). `slowest_mark_delete` is the minimum mark-delete over the durable
/// cursors, `None` when there is none.
pub fn deletable_ledgers(
    ledgers: &LedgerList,
    slowest_mark_delete: Option<Position>,
    retention: &RetentionPolicy,
    now_ms: u64,
) -> Vec<u64> {
    let list = ledgers.ledgers();
    let mut remaining_bytes = ledgers.total_size_bytes();
    let mut out = Vec::new();
    for l in list.iter().take(list.len().saturating_sub(1)) {
        if ledgers.current_ledger_id() == Some(l.ledger_id) {
            break;
        }
        let Some(closed_ms) = l.closed_ms else {
            break;
        };
        let last = Position::new(
            l.ledger_id,
            i64::try_from(l.entries).unwrap_or(i64::MAX) - 1,
        );
        if slowest_mark_delete.is_some_and(|md| last > md) {
            break;
        }
        remaining_bytes = remaining_bytes.saturating_sub(l.size_bytes);
        if !retention.allows(closed_ms, now_ms, remaining_bytes) {
            break;
        }
        out.push(l.ledger_id);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managed_ledger::ledger_list::LedgerList;

    const MIN: u64 = 60_000;

    /// Ledgers `(id, entries, size MiB, closed at minute)`; closed at 0 = open.
    fn ledgers(spec: &[(u64, u64, u64, u64)], current: bool) -> LedgerList {
        let mut l = LedgerList::new();
        for (i, &(id, entries, mb, closed_min)) in spec.iter().enumerate() {
            l.add_ledger(id, 0).unwrap();
            let is_current = current && i + 1 == spec.len();
            if closed_min > 0 && !is_current {
                l.record_closed(id, entries, mb * MIB, closed_min * MIN)
                    .unwrap();
            } else {
                for e in 0..entries {
                    l.record_add(id, e as i64, if e == 0 { mb * MIB } else { 0 })
                        .unwrap();
                }
            }
        }
        l
    }

    fn p(l: u64, e: i64) -> Position {
        Position::new(l, e)
    }

    /// RELIABILITY P1-12: however far the clock jumps (forward to the end of
    /// time, or backward to 0), retention never deletes a ledger holding an
    /// entry after the slowest mark-delete: unacked data is never removed.
    #[test]
    fn clock_jumps_never_delete_a_ledger_with_unacked_entries() {
        let spec: &[(u64, u64, u64, u64)] = &[
            (1, 10, 50, 10),
            (2, 10, 50, 20),
            (3, 10, 50, 30),
            (4, 3, 1, 0),
        ];
        let list = ledgers(spec, true);
        let none = RetentionPolicy {
            time_minutes: 0,
            size_mb: 0,
        };
        let hour = RetentionPolicy {
            time_minutes: 60,
            size_mb: -1,
        };
        // Mark-delete inside ledger 2: ledgers 2.. hold unacked entries.
        for now in [0, 1, 20 * MIN, u64::MAX / 2, u64::MAX] {
            for retention in [&none, &hour] {
                let got = deletable_ledgers(&list, Some(p(2, 4)), retention, now);
                assert!(
                    got.iter().all(|id| *id < 2),
                    "now {now}: deleted {got:?} past the mark-delete"
                );
            }
        }
    }

    #[test]
    fn table() {
        const NONE: RetentionPolicy = RetentionPolicy {
            time_minutes: 0,
            size_mb: 0,
        };
        const INFINITE: RetentionPolicy = RetentionPolicy {
            time_minutes: -1,
            size_mb: -1,
        };
        const HOUR: RetentionPolicy = RetentionPolicy {
            time_minutes: 60,
            size_mb: -1,
        };
        const MB_100: RetentionPolicy = RetentionPolicy {
            time_minutes: -1,
            size_mb: 100,
        };
        // Four closed 50-MiB ledgers of 10 entries closed at minutes 10..40,
        // then the current ledger 5 with 3 entries.
        let std: &[(u64, u64, u64, u64)] = &[
            (1, 10, 50, 10),
            (2, 10, 50, 20),
            (3, 10, 50, 30),
            (4, 10, 50, 40),
            (5, 3, 1, 0),
        ];
        let with_gap: &[(u64, u64, u64, u64)] = &[
            (1, 10, 50, 10),
            (2, 10, 50, 0),
            (3, 10, 50, 30),
            (4, 3, 1, 0),
        ];
        // (name, ledgers, current?, slowest mark-delete, retention, now minute, deletable)
        type Case<'a> = (
            &'a str,
            &'a [(u64, u64, u64, u64)],
            bool,
            Option<Position>,
            RetentionPolicy,
            u64,
            &'a [u64],
        );
        let cases: &[Case] = &[
            (
                "no cursors, no retention: all but current",
                std,
                true,
                None,
                NONE,
                50,
                &[1, 2, 3, 4],
            ),
            (
                "no cursors, infinite retention: nothing",
                std,
                true,
                None,
                INFINITE,
                9_999,
                &[],
            ),
            (
                "cursor in ledger 3 keeps 3 onwards",
                std,
                true,
                Some(p(3, 4)),
                NONE,
                50,
                &[1, 2],
            ),
            (
                "cursor at last entry of 3 frees 3",
                std,
                true,
                Some(p(3, 9)),
                NONE,
                50,
                &[1, 2, 3],
            ),
            (
                "cursor before ledger 3 frees 1 and 2",
                std,
                true,
                Some(p(3, -1)),
                NONE,
                50,
                &[1, 2],
            ),
            (
                "cursor at start keeps everything",
                std,
                true,
                Some(p(1, -1)),
                NONE,
                50,
                &[],
            ),
            (
                "cursor past everything: never the current",
                std,
                true,
                Some(p(5, 2)),
                NONE,
                50,
                &[1, 2, 3, 4],
            ),
            (
                "retention keeps acked data younger than 1 h",
                std,
                true,
                Some(p(5, 2)),
                HOUR,
                60,
                &[],
            ),
            (
                "retention time passed for the two oldest",
                std,
                true,
                Some(p(5, 2)),
                HOUR,
                80,
                &[1, 2],
            ),
            (
                "retention time passed for all",
                std,
                true,
                Some(p(5, 2)),
                HOUR,
                1000,
                &[1, 2, 3, 4],
            ),
            (
                "retention keeps the newest 100 MiB",
                std,
                true,
                Some(p(5, 2)),
                MB_100,
                50,
                &[1, 2],
            ),
            (
                "size retention still behind the slowest cursor",
                std,
                true,
                Some(p(1, 9)),
                MB_100,
                50,
                &[1],
            ),
            (
                "time OR size: size lets the oldest go",
                std,
                true,
                Some(p(5, 2)),
                RetentionPolicy {
                    time_minutes: 60,
                    size_mb: 150,
                },
                50,
                &[1],
            ),
            (
                "no current ledger: the last stays",
                &std[..4],
                false,
                None,
                NONE,
                50,
                &[1, 2, 3],
            ),
            (
                "an unclosed ledger stops trimming",
                with_gap,
                true,
                None,
                NONE,
                50,
                &[1],
            ),
            ("empty list", &[], false, None, NONE, 50, &[]),
        ];
        for (name, spec, current, md, retention, now_min, want) in cases {
            let l = ledgers(spec, *current);
            assert_eq!(
                deletable_ledgers(&l, *md, retention, now_min * MIN),
                want.to_vec(),
                "{name}"
            );
        }
    }
}
