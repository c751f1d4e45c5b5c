//! Read-ahead claims: which entries an entry-log read may bring into the read
//! cache, so that concurrent misses do not read the same range again.
//!
//! A catch-up reader asks for many consecutive entries at once (the ledger
//! client keeps up to 64 reads in flight, the bookie runs 16 of one key at a
//! time). Before claims, each of those concurrent misses found the read cache
//! empty and read its own `read_ahead_*_max` span: up to 16 overlapping spans
//! for one span's worth of entries (`scripts/bench-w5` measured the bookies
//! reading 5 to 13 times the bytes the reader consumed).
//!
//! Promises: a read-ahead range is claimed before its read and released
//! (guard drop) after its entries are in the cache; a miss inside a claimed
//! range reads only its own entry; a new read-ahead stops before the first
//! entry another claim covers. A claim never delays a read: nothing waits.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Claimed read-ahead ranges `(first, last)` per ledger.
#[derive(Debug, Default)]
pub(crate) struct ReadAheadClaims {
    ranges: Mutex<HashMap<u64, Vec<(i64, i64)>>>,
}

/// Removes its range when dropped.
#[derive(Debug)]
pub(crate) struct Claim<'a> {
    claims: &'a ReadAheadClaims,
    ledger_id: u64,
    range: (i64, i64),
}

/// How many of `span` (consecutive entry ids, the missed entry first) to
/// read, given the ranges other reads have claimed: only the missed entry if
/// a claim covers it, else up to the first entry a claim covers. Pure.
pub(crate) fn keep(claimed: &[(i64, i64)], span: &[i64]) -> usize {
    let covered = |e: i64| claimed.iter().any(|&(a, b)| a <= e && e <= b);
    match span.first() {
        None => 0,
        Some(&e) if covered(e) => 1,
        Some(_) => span.iter().position(|&e| covered(e)).unwrap_or(span.len()),
    }
}

impl ReadAheadClaims {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Vec<(i64, i64)>>> {
        self.ranges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Trims `span` (see [`keep`]) and claims what it reads ahead (all but
    /// the first entry), if anything.
    pub(crate) fn claim<T>(&self, ledger_id: u64, span: &mut Vec<(i64, T)>) -> Option<Claim<'_>> {
        let mut ranges = self.lock();
        let ids: Vec<i64> = span.iter().map(|(e, _)| *e).collect();
        let n = keep(ranges.get(&ledger_id).map_or(&[], |v| v.as_slice()), &ids);
        span.truncate(n.max(1));
        if span.len() < 2 {
            return None;
        }
        let range = (span[1].0, span[span.len() - 1].0);
        ranges.entry(ledger_id).or_default().push(range);
        Some(Claim {
            claims: self,
            ledger_id,
            range,
        })
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut ranges = self.claims.lock();
        if let Some(v) = ranges.get_mut(&self.ledger_id) {
            if let Some(i) = v.iter().position(|r| *r == self.range) {
                v.swap_remove(i);
            }
            if v.is_empty() {
                ranges.remove(&self.ledger_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_inside_a_claim_reads_alone_and_others_stop_before_it() {
        let claimed = [(10, 20)];
        assert_eq!(keep(&claimed, &[12, 13, 14]), 1);
        assert_eq!(keep(&claimed, &[5, 6, 7, 8, 9, 10, 11]), 5);
        assert_eq!(keep(&claimed, &[21, 22]), 2);
        assert_eq!(keep(&[], &[1, 2, 3]), 3);
        assert_eq!(keep(&claimed, &[]), 0);
    }

    #[test]
    fn claims_trim_concurrent_spans_and_are_released_on_drop() {
        let claims = ReadAheadClaims::default();
        let span = |a: i64, b: i64| (a..=b).map(|e| (e, ())).collect::<Vec<_>>();

        let mut first = span(0, 9);
        let c1 = claims.claim(7, &mut first).expect("reads ahead");
        assert_eq!(first.len(), 10);
        // A concurrent miss inside 1..=9 reads only its entry, claims nothing.
        let mut inside = span(3, 12);
        assert!(claims.claim(7, &mut inside).is_none());
        assert_eq!(inside.len(), 1);
        // Another ledger is not affected.
        let mut other = span(3, 12);
        let c2 = claims.claim(8, &mut other).expect("other ledger");
        assert_eq!(other.len(), 10);
        // Released: the same miss reads ahead again.
        drop(c1);
        let mut again = span(3, 12);
        let c3 = claims.claim(7, &mut again).expect("released");
        assert_eq!(again.len(), 10);
        drop((c2, c3));
        assert!(claims.ranges.lock().unwrap().is_empty());
    }
}
