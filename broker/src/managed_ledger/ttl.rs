//! Message TTL: how far a cursor's mark-delete may be moved because its
//! entries are older than the namespace's message TTL (issue 6 item 4).
//!
//! Two sources of age, chosen by the driver:
//! - **publish time** (exact): the caller supplies a function reading an
//!   entry's publish time from its bytes (the broker parses the Pulsar
//!   message metadata); the driver runs a [`super::PublishTimeSearch`] for
//!   the TTL cutoff and [`target_from_search`] turns its answer into the
//!   position to expire up to;
//! - **ledger close time** (conservative, no payload reads): without such a
//!   function, [`target_by_close_time`] expires whole ledgers closed before
//!   the cutoff — every entry of a ledger was appended before its close, so
//!   no entry younger than the TTL is ever expired; entries of the current
//!   (open) ledger expire only once it is rolled over (by size, entries, or
//!   age, also when idle).
//!
//! Promises: pure functions; the target is never past the last confirmed
//! position, so expiry only moves a mark-delete over entries that exist
//! and deletes nothing (invariant 6: expiry is an ack of old entries; data is
//! removed only by trimming, behind every cursor and within retention).

use super::ledger_list::LedgerList;
use super::position::Position;
use super::publish_time::SearchResult;

/// The position to expire up to when entries closed before `cutoff_ms`
/// expire: the last entry of the last ledger closed strictly before the
/// cutoff, among the leading closed ledgers; `None` if none.
pub fn target_by_close_time(ledgers: &LedgerList, cutoff_ms: u64) -> Option<Position> {
    let mut target = None;
    for l in ledgers.ledgers() {
        match l.closed_ms {
            Some(closed) if closed < cutoff_ms => {
                if let Some(last) = l.last_entry() {
                    target = Some(last);
                }
            }
            _ => break,
        }
    }
    target
}

/// The position to expire up to given a publish-time search for the cutoff
/// over `ledgers`: the entry before the first entry at or after the cutoff
/// (`None` if there is none: nothing is old), or the last confirmed position
/// if every entry is older.
pub fn target_from_search(ledgers: &LedgerList, result: SearchResult) -> Option<Position> {
    match result {
        SearchResult::Found(p) if p.entry_id > 0 => Some(p.prev_in_ledger()),
        // The last entry of an earlier ledger, if any.
        SearchResult::Found(p) => ledgers
            .ledgers()
            .iter()
            .take_while(|l| l.ledger_id < p.ledger_id)
            .filter_map(|l| l.last_entry())
            .last(),
        SearchResult::NoneAtOrAfter => Some(ledgers.last_confirmed_position()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(l: u64, e: i64) -> Position {
        Position::new(l, e)
    }

    /// Ledgers `(id, entries, closed at ms)`; closed 0 = open (current).
    fn ledgers(spec: &[(u64, u64, u64)]) -> LedgerList {
        let mut list = LedgerList::new();
        for &(id, entries, closed) in spec {
            list.add_ledger(id, 0).unwrap();
            for e in 0..entries {
                list.record_add(id, e as i64, 10).unwrap();
            }
            if closed > 0 {
                list.record_closed(id, entries, entries * 10, closed)
                    .unwrap();
            }
        }
        list
    }

    #[test]
    fn close_time_expires_only_ledgers_closed_before_the_cutoff() {
        // (ledgers, cutoff, expected)
        type Case<'a> = (&'a [(u64, u64, u64)], u64, Option<Position>);
        let cases: &[Case] = &[
            (&[], 1_000, None),
            (&[(1, 5, 0)], u64::MAX, None),
            (&[(1, 5, 100), (2, 5, 0)], 100, None),
            (&[(1, 5, 100), (2, 5, 0)], 101, Some(p(1, 4))),
            (&[(1, 5, 100), (2, 5, 200), (3, 5, 0)], 201, Some(p(2, 4))),
            (&[(1, 5, 100), (2, 5, 200), (3, 5, 0)], 150, Some(p(1, 4))),
            // An empty closed ledger moves nothing by itself.
            (&[(1, 5, 100), (2, 0, 120), (3, 5, 0)], 130, Some(p(1, 4))),
            (&[(1, 0, 100), (2, 0, 0)], 130, None),
            // Closed ledgers after an open one are not considered.
            (&[(1, 5, 0), (2, 5, 100)], 500, None),
        ];
        for (spec, cutoff, want) in cases {
            assert_eq!(
                target_by_close_time(&ledgers(spec), *cutoff),
                *want,
                "{spec:?} cutoff {cutoff}"
            );
        }
    }

    #[test]
    fn a_search_answer_becomes_the_position_before_it() {
        let list = ledgers(&[(1, 3, 100), (2, 0, 110), (3, 4, 0)]);
        // (answer, expected)
        let cases = [
            (SearchResult::Found(p(3, 2)), Some(p(3, 1))),
            (SearchResult::Found(p(3, 0)), Some(p(1, 2))),
            (SearchResult::Found(p(1, 1)), Some(p(1, 0))),
            (SearchResult::Found(p(1, 0)), None),
            (SearchResult::NoneAtOrAfter, Some(p(3, 3))),
        ];
        for (answer, want) in cases {
            let got = target_from_search(&list, answer);
            assert_eq!(got, want, "{answer:?}");
            assert!(got.is_none_or(|g| g <= list.last_confirmed_position()));
        }
    }
}
