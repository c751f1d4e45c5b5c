//! "The first entry published at or after time T" as a binary search driven
//! from outside: the machine says which entry to read, the driver reads it and
//! feeds back its publish time, until the machine has the answer.
//!
//! Promises: with publish times non-decreasing in append order, the result is
//! the first entry whose publish time is `>= T` among the entries after the
//! search's start (or "none": every entry is older); the machine asks for at
//! most `ceil(log2(n + 1))` reads for `n` entries and never for a position
//! outside the snapshot of the ledger list it was built from; feeding an
//! answer for another position than the one asked is refused. With
//! out-of-order publish times (clock skew between producers) the answer is
//! still an entry at or after T whose predecessor is before T.

use super::ledger_list::LedgerList;
use super::position::Position;

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchStep {
    /// Read this entry and feed its publish time to [`PublishTimeSearch::feed`].
    Read(Position),
    /// The search is over.
    Done(SearchResult),
}

/// The answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchResult {
    /// The first entry with publish time at or after T.
    Found(Position),
    /// Every entry searched was published before T (or there was none).
    NoneAtOrAfter,
}

/// Errors of feeding the machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    /// The answer was for another position than the one asked for.
    #[error("fed position {fed}, expected {expected:?}")]
    UnexpectedPosition {
        /// The position fed.
        fed: Position,
        /// The position asked for, if any (none when the search is done).
        expected: Option<Position>,
    },
}

/// The binary-search state machine.
#[derive(Debug, Clone)]
pub struct PublishTimeSearch {
    target_ms: u64,
    /// Non-empty ledgers as (ledger id, first entry id searched, entries searched).
    segments: Vec<(u64, i64, u64)>,
    /// Cumulative entries before each segment.
    starts: Vec<u64>,
    lo: u64,
    hi: u64,
}

impl PublishTimeSearch {
    /// Searches every entry of `ledgers` for the first published at or after
    /// `target_ms`.
    pub fn new(ledgers: &LedgerList, target_ms: u64) -> Self {
        Self::after(ledgers, Position::before_ledger(0), target_ms)
    }

    /// Searches the entries after `start` (e.g. a cursor's mark-delete, for TTL).
    pub fn after(ledgers: &LedgerList, start: Position, target_ms: u64) -> Self {
        let mut segments = Vec::new();
        let mut starts = Vec::new();
        let mut total = 0u64;
        for l in ledgers.ledgers() {
            let first = if l.ledger_id == start.ledger_id {
                start.entry_id.saturating_add(1).max(0)
            } else if l.ledger_id > start.ledger_id {
                0
            } else {
                continue;
            };
            let first_u = first.unsigned_abs();
            if first_u >= l.entries {
                continue;
            }
            let n = l.entries - first_u;
            segments.push((l.ledger_id, first, n));
            starts.push(total);
            total += n;
        }
        Self {
            target_ms,
            segments,
            starts,
            lo: 0,
            hi: total,
        }
    }

    /// The position of the `i`-th searched entry.
    fn position(&self, i: u64) -> Option<Position> {
        let s = self
            .starts
            .partition_point(|&start| start <= i)
            .checked_sub(1)?;
        let (ledger_id, first, n) = self.segments[s];
        let offset = i - self.starts[s];
        (offset < n).then(|| {
            Position::new(
                ledger_id,
                first.saturating_add(i64::try_from(offset).unwrap_or(i64::MAX)),
            )
        })
    }

    /// What to do now.
    pub fn step(&self) -> SearchStep {
        if self.lo < self.hi {
            let mid = self.lo + (self.hi - self.lo) / 2;
            if let Some(pos) = self.position(mid) {
                return SearchStep::Read(pos);
            }
        }
        match self.position(self.lo) {
            Some(pos) => SearchStep::Done(SearchResult::Found(pos)),
            None => SearchStep::Done(SearchResult::NoneAtOrAfter),
        }
    }

    /// Feeds the publish time of the entry asked for; returns the next step.
    pub fn feed(&mut self, pos: Position, publish_time_ms: u64) -> Result<SearchStep, SearchError> {
        let expected = match self.step() {
            SearchStep::Read(p) => p,
            SearchStep::Done(_) => {
                return Err(SearchError::UnexpectedPosition {
                    fed: pos,
                    expected: None,
                });
            }
        };
        if pos != expected {
            return Err(SearchError::UnexpectedPosition {
                fed: pos,
                expected: Some(expected),
            });
        }
        let mid = self.lo + (self.hi - self.lo) / 2;
        if publish_time_ms >= self.target_ms {
            self.hi = mid;
        } else {
            self.lo = mid + 1;
        }
        Ok(self.step())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managed_ledger::ledger_list::tests::list;

    /// Runs the search with publish time = `time(pos)`; returns result and reads.
    fn run(mut s: PublishTimeSearch, time: impl Fn(Position) -> u64) -> (SearchResult, usize) {
        let mut reads = 0;
        loop {
            match s.step() {
                SearchStep::Done(r) => return (r, reads),
                SearchStep::Read(pos) => {
                    reads += 1;
                    s.feed(pos, time(pos)).unwrap();
                }
            }
        }
    }

    #[test]
    fn finds_first_entry_at_or_after_target_across_ledgers() {
        // Ledgers 1 (5 entries), 2 (empty), 3 (4); publish time = 100 * global index.
        let l = list(&[(1, 5), (2, 0), (3, 4)], true);
        let time = |p: Position| -> u64 {
            let idx = if p.ledger_id == 1 {
                p.entry_id
            } else {
                5 + p.entry_id
            };
            100 * idx as u64
        };
        let pos = Position::new;
        // (target, expected)
        let cases = [
            (0, SearchResult::Found(pos(1, 0))),
            (1, SearchResult::Found(pos(1, 1))),
            (400, SearchResult::Found(pos(1, 4))),
            (401, SearchResult::Found(pos(3, 0))),
            (800, SearchResult::Found(pos(3, 3))),
            (801, SearchResult::NoneAtOrAfter),
        ];
        for (target, want) in cases {
            let (got, reads) = run(PublishTimeSearch::new(&l, target), time);
            assert_eq!(got, want, "target {target}");
            assert!(
                reads <= 4,
                "9 entries need at most ceil(log2 10) = 4 reads, got {reads}"
            );
        }
    }

    #[test]
    fn search_after_a_start_position_skips_earlier_entries() {
        let l = list(&[(1, 5), (3, 4)], true);
        let time = |_: Position| 0;
        let (got, _) = run(PublishTimeSearch::after(&l, Position::new(1, 2), 0), time);
        assert_eq!(got, SearchResult::Found(Position::new(1, 3)));
        let (got, _) = run(PublishTimeSearch::after(&l, Position::new(1, 4), 0), time);
        assert_eq!(got, SearchResult::Found(Position::new(3, 0)));
        let (got, reads) = run(PublishTimeSearch::after(&l, Position::new(3, 3), 0), time);
        assert_eq!((got, reads), (SearchResult::NoneAtOrAfter, 0));
    }

    #[test]
    fn empty_topic_needs_no_read() {
        let l = list(&[(1, 0)], true);
        assert_eq!(
            PublishTimeSearch::new(&l, 5).step(),
            SearchStep::Done(SearchResult::NoneAtOrAfter)
        );
    }

    #[test]
    fn wrong_answers_are_refused() {
        let l = list(&[(1, 3)], true);
        let mut s = PublishTimeSearch::new(&l, 5);
        assert_eq!(s.step(), SearchStep::Read(Position::new(1, 1)));
        assert_eq!(
            s.feed(Position::new(1, 0), 1),
            Err(SearchError::UnexpectedPosition {
                fed: Position::new(1, 0),
                expected: Some(Position::new(1, 1))
            })
        );
        let mut done = PublishTimeSearch::new(&LedgerList::new(), 5);
        assert!(done.feed(Position::new(1, 0), 1).is_err());
    }

    #[test]
    fn matches_a_linear_scan_for_every_size_and_target() {
        for n in 0..40u64 {
            let l = list(&[(7, n / 2), (9, n - n / 2)], true);
            let entries: Vec<Position> = (0..n / 2)
                .map(|e| Position::new(7, e as i64))
                .chain((0..n - n / 2).map(|e| Position::new(9, e as i64)))
                .collect();
            // Publish times with duplicates: 10 * (index / 2).
            let time_of = |p: Position| {
                let i = entries.iter().position(|q| *q == p).unwrap() as u64;
                10 * (i / 2)
            };
            for target in 0..(10 * n / 2 + 12) {
                let want = entries
                    .iter()
                    .find(|p| time_of(**p) >= target)
                    .map_or(SearchResult::NoneAtOrAfter, |p| SearchResult::Found(*p));
                let (got, reads) = run(PublishTimeSearch::new(&l, target), time_of);
                assert_eq!(got, want, "n {n} target {target}");
                let bound = (n + 1).next_power_of_two().trailing_zeros() as usize;
                assert!(reads <= bound, "n {n}: {reads} reads > {bound}");
            }
        }
    }
}
