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
//! range first waits for that range's release ([`ReadAheadClaims::wait_released`],
//! at most a bound) and is then served from the cache, and if the entry is
//! still missing reads only its own entry; a new read-ahead stops before the
//! first entry another claim covers.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Claimed read-ahead ranges `(first, last)` per ledger.
#[derive(Debug, Default)]
pub(crate) struct ReadAheadClaims {
    ranges: Mutex<HashMap<u64, Vec<(i64, i64)>>>,
    /// Notified whenever a claim is released.
    released: Condvar,
}

fn covered(claimed: &[(i64, i64)], e: i64) -> bool {
    claimed.iter().any(|&(a, b)| a <= e && e <= b)
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
    match span.first() {
        None => 0,
        Some(&e) if covered(claimed, e) => 1,
        Some(_) => span
            .iter()
            .position(|&e| covered(claimed, e))
            .unwrap_or(span.len()),
    }
}

impl ReadAheadClaims {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Vec<(i64, i64)>>> {
        self.ranges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// If a claim covers `entry_id` of `ledger_id`, waits until no claim
    /// covers it any more or `wait_max` passed; true if it waited (the entry
    /// is then likely in the read cache). Blocks the calling thread: call it
    /// where disk reads are made (the blocking pool).
    pub(crate) fn wait_released(&self, ledger_id: u64, entry_id: i64, wait_max: Duration) -> bool {
        let deadline = Instant::now() + wait_max;
        let mut ranges = self.lock();
        let mut waited = false;
        while ranges.get(&ledger_id).is_some_and(|v| covered(v, entry_id)) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            waited = true;
            ranges = self
                .released
                .wait_timeout(ranges, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        waited
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
        drop(ranges);
        self.claims.released.notify_all();
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

    #[test]
    fn a_miss_inside_a_claim_waits_for_its_release_and_no_longer() {
        let claims = std::sync::Arc::new(ReadAheadClaims::default());
        let mut span: Vec<(i64, ())> = (0..=9).map(|e| (e, ())).collect();
        // Not claimed: no wait.
        assert!(!claims.wait_released(7, 5, Duration::from_secs(5)));
        let c = claims.claim(7, &mut span).expect("reads ahead");
        // Entry 0 is the claimant's own (not in the claim); 10 is outside.
        assert!(!claims.wait_released(7, 0, Duration::from_secs(5)));
        assert!(!claims.wait_released(7, 10, Duration::from_secs(5)));
        // Bounded: the claim outlives the wait.
        let t = Instant::now();
        assert!(claims.wait_released(7, 5, Duration::from_millis(50)));
        assert!(t.elapsed() >= Duration::from_millis(50));
        // Released by another thread: the waiter wakes then, well before
        // its bound.
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let claims = claims.clone();
            std::thread::spawn(move || {
                tx.send(()).unwrap();
                let t = Instant::now();
                let waited = claims.wait_released(7, 5, Duration::from_secs(30));
                (waited, t.elapsed())
            })
        };
        rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        drop(c);
        // Blocked on the claim or not yet, it returns right after the
        // release, never at its 30 s bound.
        let (_, took) = waiter.join().unwrap();
        assert!(took < Duration::from_secs(10), "{took:?}");
    }
}
