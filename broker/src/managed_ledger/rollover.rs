//! The managed ledger's rollover policy: when the current ledger is replaced
//! by a new one.
//!
//! Promises: a pure decision over (entries, bytes, ledger creation time, now);
//! a ledger is rolled only if it holds at least one entry, is at least
//! `age_ms_min` old, and has reached any of `age_ms_max`, `entries_max` or
//! `size_bytes_max` (Pulsar's `managedLedgerMinLedgerRolloverTimeMinutes=10`,
//! `managedLedgerMaxLedgerRolloverTimeMinutes=240`,
//! `managedLedgerMaxEntriesPerLedger=50000`, `managedLedgerMaxSizePerLedgerMbytes=2048`).
//! A clock that went backwards counts as age 0, never as a huge age.

use super::ledger_list::LedgerList;

/// Rollover thresholds (per broker, overridable per namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloverPolicy {
    /// No rollover before the ledger is this old, in ms (default 10 min).
    pub age_ms_min: u64,
    /// Roll once the ledger is this old, in ms (default 240 min).
    pub age_ms_max: u64,
    /// Roll once the ledger holds this many entries (default 50,000).
    pub entries_max: u64,
    /// Roll once the ledger holds this many payload bytes (default 2048 MiB).
    pub size_bytes_max: u64,
}

impl Default for RolloverPolicy {
    fn default() -> Self {
        Self {
            age_ms_min: 10 * 60 * 1000,
            age_ms_max: 240 * 60 * 1000,
            entries_max: 50_000,
            size_bytes_max: 2048 * 1024 * 1024,
        }
    }
}

/// Why a ledger is rolled (for logs and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloverReason {
    /// `entries_max` reached.
    Entries,
    /// `size_bytes_max` reached.
    Size,
    /// `age_ms_max` reached.
    Age,
}

/// The rollover decision for the current ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloverDecision {
    /// Keep appending to the current ledger.
    Keep,
    /// Create a new ledger, for this reason.
    Roll(RolloverReason),
}

impl RolloverPolicy {
    /// The decision for a current ledger holding `entries` entries and
    /// `size_bytes` bytes, created at `ctime_ms`, at `now_ms`.
    pub fn decide(
        &self,
        entries: u64,
        size_bytes: u64,
        ctime_ms: u64,
        now_ms: u64,
    ) -> RolloverDecision {
        let age_ms = now_ms.saturating_sub(ctime_ms);
        if entries == 0 || age_ms < self.age_ms_min {
            return RolloverDecision::Keep;
        }
        if entries >= self.entries_max {
            RolloverDecision::Roll(RolloverReason::Entries)
        } else if size_bytes >= self.size_bytes_max {
            RolloverDecision::Roll(RolloverReason::Size)
        } else if age_ms >= self.age_ms_max {
            RolloverDecision::Roll(RolloverReason::Age)
        } else {
            RolloverDecision::Keep
        }
    }

    /// The decision for the current ledger of `ledgers` at `now_ms`
    /// (`Keep` when no ledger is open for appends).
    pub fn decide_current(&self, ledgers: &LedgerList, now_ms: u64) -> RolloverDecision {
        ledgers
            .current_ledger_id()
            .and_then(|id| ledgers.ledger(id))
            .map_or(RolloverDecision::Keep, |l| {
                self.decide(l.entries, l.size_bytes, l.ctime_ms, now_ms)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60 * 1000;
    const MIB: u64 = 1024 * 1024;

    #[test]
    fn rolls_after_min_age_when_any_limit_is_reached() {
        use RolloverDecision::{Keep, Roll};
        use RolloverReason::{Age, Entries, Size};
        let p = RolloverPolicy::default();
        // (entries, bytes, age ms, decision)
        let cases = [
            (0, 0, 0, Keep),
            (1, 1, 5 * MIN, Keep),
            (50_000, 1, 5 * MIN, Keep), // full but younger than min
            (50_000, 1, 10 * MIN - 1, Keep),
            (50_000, 1, 10 * MIN, Roll(Entries)),
            (49_999, 2048 * MIB, 11 * MIN, Roll(Size)),
            (49_999, 2048 * MIB - 1, 11 * MIN, Keep),
            (1, 1, 240 * MIN - 1, Keep),
            (1, 1, 240 * MIN, Roll(Age)),
            (0, 0, 1000 * MIN, Keep), // never roll an empty ledger
        ];
        for (entries, bytes, age, want) in cases {
            assert_eq!(
                p.decide(entries, bytes, 1_000, 1_000 + age),
                want,
                "{entries} {bytes} {age}"
            );
        }
    }

    #[test]
    fn thresholds_are_configurable_and_clock_skew_is_age_zero() {
        let p = RolloverPolicy {
            age_ms_min: 0,
            age_ms_max: 100,
            entries_max: 3,
            size_bytes_max: 10,
        };
        assert_eq!(
            p.decide(3, 0, 0, 0),
            RolloverDecision::Roll(RolloverReason::Entries)
        );
        assert_eq!(p.decide(1, 0, 500, 0), RolloverDecision::Keep);
        let d = RolloverPolicy::default();
        assert_eq!(d.decide(50_000, 0, 10_000_000, 0), RolloverDecision::Keep);
    }

    #[test]
    fn decides_on_the_current_ledger_only() {
        let p = RolloverPolicy {
            age_ms_min: 0,
            entries_max: 2,
            ..RolloverPolicy::default()
        };
        let mut l = LedgerList::new();
        assert_eq!(p.decide_current(&l, 0), RolloverDecision::Keep);
        l.add_ledger(1, 0).unwrap();
        l.record_add(1, 0, 1).unwrap();
        assert_eq!(p.decide_current(&l, 0), RolloverDecision::Keep);
        l.record_add(1, 1, 1).unwrap();
        assert_eq!(
            p.decide_current(&l, 0),
            RolloverDecision::Roll(RolloverReason::Entries)
        );
        l.record_closed(1, 2, 2, 5).unwrap();
        assert_eq!(p.decide_current(&l, 0), RolloverDecision::Keep);
    }
}
