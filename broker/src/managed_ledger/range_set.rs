//! A set of acknowledged positions as disjoint, merged, ordered closed ranges,
//! each inside one ledger.
//!
//! Promises: after every operation the ranges are ascending, pairwise
//! disjoint, never adjacent inside a ledger (adjacent ones are merged), and
//! each range lies in one ledger; membership equals the set of inserted
//! positions minus removed ones. Adjacency across ledgers is not known here
//! (it depends on the ledger list); the cursor handles it when it advances its
//! mark-delete. [`RangeSet::to_persisted`] keeps the ranges nearest the
//! mark-delete (the lowest) up to a bound and counts what it dropped; dropped
//! acks are redelivered after a restore, never lost.

use std::collections::BTreeMap;

use super::position::Position;

/// Ranges kept for persistence and what the bound left out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PersistedRanges {
    /// The lowest ranges, ascending, as `(first, last)` inclusive.
    pub ranges: Vec<(Position, Position)>,
    /// Ranges left out by the bound.
    pub ranges_dropped: u64,
    /// Acknowledged entries in the ranges left out (redelivered after restore).
    pub entries_dropped: u64,
}

/// Ordered, merged, disjoint closed ranges of positions, each in one ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// first → last (inclusive), same ledger, `first.entry_id <= last.entry_id`.
    ranges: BTreeMap<Position, Position>,
}

/// Entries in the closed range `[first, last]` of one ledger.
fn range_len(first: Position, last: Position) -> u64 {
    (last.entry_id - first.entry_id).unsigned_abs() + 1
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// True if no position is in the set.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Number of ranges.
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// Number of positions in the set.
    pub fn position_count(&self) -> u64 {
        self.iter().map(|(f, l)| range_len(f, l)).sum()
    }

    /// The ranges, ascending, as `(first, last)` inclusive.
    pub fn iter(&self) -> impl Iterator<Item = (Position, Position)> + '_ {
        self.ranges.iter().map(|(f, l)| (*f, *l))
    }

    /// The lowest range.
    pub fn first_range(&self) -> Option<(Position, Position)> {
        self.ranges.first_key_value().map(|(f, l)| (*f, *l))
    }

    /// The range containing `pos`, if any.
    pub fn range_containing(&self, pos: Position) -> Option<(Position, Position)> {
        let (first, last) = self.ranges.range(..=pos).next_back()?;
        (pos <= *last).then_some((*first, *last))
    }

    /// True if `pos` is in the set.
    pub fn contains(&self, pos: Position) -> bool {
        self.range_containing(pos).is_some()
    }

    /// Adds one position; returns false if it was already in the set.
    pub fn insert(&mut self, pos: Position) -> bool {
        if self.contains(pos) {
            return false;
        }
        self.insert_range(pos, pos);
        true
    }

    /// Adds every entry of the closed range `[first, last]`, which must lie in
    /// one ledger with `first.entry_id <= last.entry_id`; a range that does not
    /// is ignored and `false` returned.
    pub fn insert_range(&mut self, first: Position, last: Position) -> bool {
        if first.ledger_id != last.ledger_id || first.entry_id > last.entry_id {
            return false;
        }
        let ledger = first.ledger_id;
        let (mut new_first, mut new_last) = (first, last);
        // A range starting at or before `first` that overlaps or touches it.
        if let Some((&pf, &pl)) = self.ranges.range(..=first).next_back()
            && pl.ledger_id == ledger
            && pl.entry_id.saturating_add(1) >= first.entry_id
        {
            self.ranges.remove(&pf);
            new_first = pf;
            new_last = new_last.max(pl);
        }
        // Ranges starting after `first` that overlap or touch the union so far.
        loop {
            let next = self.ranges.range(new_first..).next().map(|(f, l)| (*f, *l));
            match next {
                Some((nf, nl))
                    if nf.ledger_id == ledger
                        && nf.entry_id <= new_last.entry_id.saturating_add(1) =>
                {
                    self.ranges.remove(&nf);
                    new_last = new_last.max(nl);
                }
                _ => break,
            }
        }
        self.ranges.insert(new_first, new_last);
        true
    }

    /// Removes every position `<= pos` (the part of the set the mark-delete
    /// has passed).
    pub fn remove_up_to(&mut self, pos: Position) {
        while let Some((&first, &last)) = self.ranges.first_key_value() {
            if first > pos {
                break;
            }
            self.ranges.remove(&first);
            if last > pos {
                // `first <= pos < last` inside one ledger: keep the tail.
                self.ranges.insert(pos.next_in_ledger(), last);
                break;
            }
        }
    }

    /// Removes everything.
    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    /// The lowest `ranges_max` ranges (those nearest the mark-delete) and a
    /// count of what the bound drops.
    pub fn to_persisted(&self, ranges_max: usize) -> PersistedRanges {
        let mut out = PersistedRanges::default();
        for (i, (f, l)) in self.iter().enumerate() {
            if i < ranges_max {
                out.ranges.push((f, l));
            } else {
                out.ranges_dropped += 1;
                out.entries_dropped += range_len(f, l);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn p(l: u64, e: i64) -> Position {
        Position::new(l, e)
    }

    fn ranges(s: &RangeSet) -> Vec<(Position, Position)> {
        s.iter().collect()
    }

    #[test]
    fn inserts_merge_adjacent_entries_within_a_ledger_only() {
        // (inserted positions, expected ranges)
        type Case<'a> = (&'a [(u64, i64)], &'a [((u64, i64), (u64, i64))]);
        let cases: &[Case] = &[
            (&[(1, 1), (1, 2), (1, 3)], &[((1, 1), (1, 3))]),
            (&[(1, 3), (1, 1), (1, 2)], &[((1, 1), (1, 3))]),
            (&[(1, 1), (1, 3)], &[((1, 1), (1, 1)), ((1, 3), (1, 3))]),
            (&[(1, 5), (2, 0)], &[((1, 5), (1, 5)), ((2, 0), (2, 0))]),
            (&[(1, 0), (1, 0)], &[((1, 0), (1, 0))]),
        ];
        for (ins, want) in cases {
            let mut s = RangeSet::new();
            for &(l, e) in *ins {
                s.insert(p(l, e));
            }
            let want: Vec<_> = want
                .iter()
                .map(|&((fl, fe), (ll, le))| (p(fl, fe), p(ll, le)))
                .collect();
            assert_eq!(ranges(&s), want, "{ins:?}");
        }
    }

    #[test]
    fn insert_range_swallows_overlapped_and_touching_ranges() {
        let mut s = RangeSet::new();
        for e in [1, 4, 7, 10, 20] {
            s.insert(p(1, e));
        }
        s.insert(p(2, 0));
        assert!(s.insert_range(p(1, 2), p(1, 9)));
        assert_eq!(
            ranges(&s),
            vec![
                (p(1, 1), p(1, 10)),
                (p(1, 20), p(1, 20)),
                (p(2, 0), p(2, 0))
            ]
        );
        assert!(!s.insert_range(p(1, 5), p(2, 1)), "spans ledgers");
        assert!(!s.insert_range(p(1, 5), p(1, 4)), "inverted");
    }

    #[test]
    fn remove_up_to_cuts_a_range_in_the_middle() {
        let mut s = RangeSet::new();
        s.insert_range(p(1, 0), p(1, 9));
        s.insert_range(p(2, 3), p(2, 4));
        s.remove_up_to(p(1, 4));
        assert_eq!(ranges(&s), vec![(p(1, 5), p(1, 9)), (p(2, 3), p(2, 4))]);
        s.remove_up_to(p(2, -1));
        assert_eq!(ranges(&s), vec![(p(2, 3), p(2, 4))]);
        s.remove_up_to(p(9, 0));
        assert!(s.is_empty());
    }

    #[test]
    fn to_persisted_keeps_the_ranges_nearest_the_mark_delete() {
        let mut s = RangeSet::new();
        for e in [0, 2, 4, 6] {
            s.insert_range(p(1, e * 10), p(1, e * 10 + e));
        }
        let out = s.to_persisted(2);
        assert_eq!(out.ranges, vec![(p(1, 0), p(1, 0)), (p(1, 20), p(1, 22))]);
        assert_eq!(out.ranges_dropped, 2);
        assert_eq!(out.entries_dropped, 5 + 7);
        let all = s.to_persisted(10);
        assert_eq!(all.ranges.len(), 4);
        assert_eq!((all.ranges_dropped, all.entries_dropped), (0, 0));
        assert_eq!(s.to_persisted(0).ranges_dropped, 4);
    }

    /// Checks the structural promises and equality with the naive model.
    fn check(s: &RangeSet, model: &BTreeSet<Position>) {
        let rs = ranges(s);
        for (f, l) in &rs {
            assert_eq!(f.ledger_id, l.ledger_id);
            assert!(f.entry_id <= l.entry_id);
        }
        for w in rs.windows(2) {
            let ((_, al), (bf, _)) = (w[0], w[1]);
            assert!(al < bf, "ordered and disjoint");
            if al.ledger_id == bf.ledger_id {
                assert!(al.entry_id + 1 < bf.entry_id, "not merged: {rs:?}");
            }
        }
        let expanded: BTreeSet<Position> = rs
            .iter()
            .flat_map(|(f, l)| (f.entry_id..=l.entry_id).map(move |e| p(f.ledger_id, e)))
            .collect();
        assert_eq!(&expanded, model);
        assert_eq!(s.position_count(), model.len() as u64);
    }

    #[test]
    fn random_ack_sequences_match_a_naive_set() {
        for seed in 0..2_000u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut s = RangeSet::new();
            let mut model = BTreeSet::new();
            let ledgers = rng.random_range(1..=3u64);
            let entries = rng.random_range(1..=40i64);
            for _ in 0..rng.random_range(1..=120) {
                let pos = p(rng.random_range(1..=ledgers), rng.random_range(0..entries));
                match rng.random_range(0..100) {
                    0..70 => assert_eq!(s.insert(pos), model.insert(pos), "seed {seed}"),
                    70..85 => {
                        let last = p(pos.ledger_id, pos.entry_id + rng.random_range(0..6));
                        s.insert_range(pos, last);
                        for e in pos.entry_id..=last.entry_id {
                            model.insert(p(pos.ledger_id, e));
                        }
                    }
                    85..95 => {
                        let cut = p(pos.ledger_id, pos.entry_id - 1);
                        s.remove_up_to(cut);
                        model.retain(|q| *q > cut);
                    }
                    _ => {
                        let probe = p(
                            rng.random_range(1..=ledgers),
                            rng.random_range(-1..entries + 2),
                        );
                        assert_eq!(s.contains(probe), model.contains(&probe), "seed {seed}");
                    }
                }
                check(&s, &model);
            }
            // A bounded persist keeps exactly the lowest ranges and only drops acks.
            let bound = rng.random_range(0..5usize);
            let out = s.to_persisted(bound);
            let mut restored = RangeSet::new();
            for (f, l) in &out.ranges {
                restored.insert_range(*f, *l);
            }
            assert_eq!(
                out.ranges,
                ranges(&s).into_iter().take(bound).collect::<Vec<_>>()
            );
            assert_eq!(
                restored.position_count() + out.entries_dropped,
                model.len() as u64,
                "seed {seed}"
            );
            assert!(
                restored
                    .iter()
                    .all(|(f, l)| model.contains(&f) && model.contains(&l))
            );
        }
    }
}
