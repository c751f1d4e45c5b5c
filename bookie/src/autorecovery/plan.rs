//! Pure decisions of autorecovery, without I/O: which bookies count as lost
//! ([`LostTracker`]), which ledgers the auditor marks ([`ledgers_to_mark`]),
//! which entries a worker copies ([`copy_plan`]) and the metadata swap that
//! follows a complete copy ([`replace_in_segment`]).
//!
//! Promises:
//! - a bookie is lost only after it has been missing from the registrations
//!   for at least the grace period, counted from the first time it was seen
//!   missing; it stops being lost as soon as it registers again;
//! - a copy plan names, for every segment holding a lost bookie, exactly the
//!   entries whose write set includes that bookie's slot (entries
//!   `first_entry_id..=last` of the segment, none past the ledger's last entry),
//!   each with the surviving replicas to read it from;
//! - [`replace_in_segment`] changes one bookie of one segment and nothing else,
//!   is unchanged (`Ok(None)`) when already done, and refuses a replacement
//!   already in that segment.

use std::collections::{BTreeMap, BTreeSet};

use crate::client::metadata::{MetadataError, quorum_spec};
use crate::client::{BookieId, EntryId};
use crate::proto::metadata::LedgerMetadata;

/// Tracks since when each bookie has been missing (monotonic ms).
#[derive(Debug, Clone, Default)]
pub struct LostTracker {
    missing_since_ms: BTreeMap<BookieId, u64>,
}

impl LostTracker {
    /// A tracker that has seen nothing missing.
    pub fn new() -> LostTracker {
        LostTracker::default()
    }

    /// Records what is `live` at `now_ms` among the `named` bookies (those
    /// some ledger names) and returns the named bookies missing for at least
    /// `grace_ms`.
    pub fn observe(
        &mut self,
        now_ms: u64,
        named: &BTreeSet<BookieId>,
        live: &BTreeSet<BookieId>,
        grace_ms: u64,
    ) -> BTreeSet<BookieId> {
        self.missing_since_ms
            .retain(|b, _| named.contains(b) && !live.contains(b));
        for b in named.iter().filter(|b| !live.contains(*b)) {
            self.missing_since_ms.entry(b.clone()).or_insert(now_ms);
        }
        self.missing_since_ms
            .iter()
            .filter(|(_, since)| now_ms.saturating_sub(**since) >= grace_ms)
            .map(|(b, _)| b.clone())
            .collect()
    }
}

/// Every bookie some segment of `md` names.
pub fn bookies_named(md: &LedgerMetadata) -> BTreeSet<BookieId> {
    md.segments
        .iter()
        .flat_map(|s| s.ensemble.iter().cloned())
        .collect()
}

/// The ledgers with a segment naming a `lost` bookie, each with the lost
/// bookies it names (sorted), in ledger id order.
pub fn ledgers_to_mark(
    ledgers: &[(u64, LedgerMetadata)],
    lost: &BTreeSet<BookieId>,
) -> Vec<(u64, Vec<BookieId>)> {
    let mut out: Vec<(u64, Vec<BookieId>)> = ledgers
        .iter()
        .filter_map(|(id, md)| {
            let hit: Vec<BookieId> = bookies_named(md).intersection(lost).cloned().collect();
            (!hit.is_empty()).then_some((*id, hit))
        })
        .collect();
    out.sort_by_key(|(id, _)| *id);
    out
}

/// One entry to copy and where to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryCopy {
    /// The entry.
    pub entry_id: EntryId,
    /// Surviving replicas of it (its write set minus lost bookies), in write-set order.
    pub sources: Vec<BookieId>,
}

/// The copy work of one lost bookie in one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentCopy {
    /// The segment's first entry (its key in the metadata).
    pub first_entry_id: EntryId,
    /// The segment's ensemble as planned (the replacement is chosen outside it).
    pub ensemble: Vec<BookieId>,
    /// The lost bookie.
    pub lost: BookieId,
    /// Entries the lost bookie held, in id order.
    pub entries: Vec<EntryCopy>,
}

/// Why no plan can be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The metadata is not valid.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// An entry has no surviving replica: it cannot be re-replicated.
    #[error("entry {entry_id} has no surviving replica")]
    NoSource {
        /// The entry.
        entry_id: EntryId,
    },
}

/// The copies that restore every segment naming a `lost` bookie of a ledger
/// whose last entry is `md.last_entry_id` (the ledger must be closed: the
/// caller recovers an open one first).
pub fn copy_plan(
    md: &LedgerMetadata,
    lost: &BTreeSet<BookieId>,
) -> Result<Vec<SegmentCopy>, PlanError> {
    let spec = quorum_spec(md)?;
    let mut out = Vec::new();
    for (i, seg) in md.segments.iter().enumerate() {
        let end = md
            .segments
            .get(i + 1)
            .map_or(md.last_entry_id, |n| n.first_entry_id - 1)
            .min(md.last_entry_id);
        for (slot, bookie) in seg.ensemble.iter().enumerate() {
            if !lost.contains(bookie) {
                continue;
            }
            let mut entries = Vec::new();
            let mut e = seg.first_entry_id;
            while e <= end {
                let ws = spec.write_set(e);
                if ws.contains(&slot) {
                    let sources: Vec<BookieId> = ws
                        .iter()
                        .filter_map(|s| seg.ensemble.get(*s))
                        .filter(|b| !lost.contains(*b))
                        .cloned()
                        .collect();
                    if sources.is_empty() {
                        return Err(PlanError::NoSource { entry_id: e });
                    }
                    entries.push(EntryCopy {
                        entry_id: e,
                        sources,
                    });
                }
                e += 1;
            }
            out.push(SegmentCopy {
                first_entry_id: seg.first_entry_id,
                ensemble: seg.ensemble.clone(),
                lost: bookie.clone(),
                entries,
            });
        }
    }
    Ok(out)
}

/// The reads of the auditor's sampled integrity check of one closed ledger:
/// `(entry, bookie)` pairs, every bookie of the entry's write set. Per
/// segment it samples the first `E` entries (so every ensemble slot is read at
/// least once), the segment's last entry, and `random_per_segment` more
/// entries picked by `pick(n)` (a number in `0..n`; the caller seeds it).
/// Empty for a ledger that is not closed (entries past the LAC of an open
/// ledger may legitimately be missing).
pub fn sample_reads(
    md: &LedgerMetadata,
    random_per_segment: usize,
    mut pick: impl FnMut(u64) -> u64,
) -> Result<Vec<(EntryId, BookieId)>, PlanError> {
    if md.status != crate::proto::metadata::LedgerStatus::LedgerClosed as i32 {
        return Ok(Vec::new());
    }
    let spec = quorum_spec(md)?;
    let mut out = Vec::new();
    for (i, seg) in md.segments.iter().enumerate() {
        let end = md
            .segments
            .get(i + 1)
            .map_or(md.last_entry_id, |n| n.first_entry_id - 1)
            .min(md.last_entry_id);
        if end < seg.first_entry_id {
            continue;
        }
        let len = u64::try_from(end - seg.first_entry_id + 1).unwrap_or(0);
        let mut entries: BTreeSet<EntryId> = (seg.first_entry_id..=end)
            .take(spec.ensemble_size())
            .collect();
        entries.insert(end);
        for _ in 0..random_per_segment {
            let off = i64::try_from(pick(len) % len.max(1)).unwrap_or(0);
            entries.insert(seg.first_entry_id + off);
        }
        for e in entries {
            for slot in spec.write_set(e) {
                if let Some(b) = seg.ensemble.get(slot) {
                    out.push((e, b.clone()));
                }
            }
        }
    }
    Ok(out)
}

/// Why a swap cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwapError {
    /// No segment starts at this entry.
    #[error("no segment starts at entry {0}")]
    NoSegment(EntryId),
    /// The old bookie is not in the segment (and the new one is not either).
    #[error("bookie {0} is not in the segment")]
    NotInSegment(BookieId),
    /// The replacement already holds another slot of the segment.
    #[error("replacement {0} is already in the segment")]
    AlreadyInSegment(BookieId),
}

/// `md` with `old` replaced by `new` in the segment starting at
/// `first_entry_id`; `Ok(None)` if that was already done.
pub fn replace_in_segment(
    md: &LedgerMetadata,
    first_entry_id: EntryId,
    old: &str,
    new: &str,
) -> Result<Option<LedgerMetadata>, SwapError> {
    let seg = md
        .segments
        .iter()
        .position(|s| s.first_entry_id == first_entry_id)
        .ok_or(SwapError::NoSegment(first_entry_id))?;
    let ensemble = &md.segments[seg].ensemble;
    let Some(slot) = ensemble.iter().position(|b| b == old) else {
        return if ensemble.iter().any(|b| b == new) {
            Ok(None)
        } else {
            Err(SwapError::NotInSegment(old.to_string()))
        };
    };
    if ensemble.iter().any(|b| b == new) {
        return Err(SwapError::AlreadyInSegment(new.to_string()));
    }
    let mut out = md.clone();
    out.segments[seg].ensemble[slot] = new.to_string();
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is the test failing")]

    use super::*;
    use crate::proto::metadata::{LedgerStatus, Segment};

    fn set(b: &[&str]) -> BTreeSet<BookieId> {
        b.iter().map(|s| s.to_string()).collect()
    }

    fn md(e: u32, qw: u32, qa: u32, last: i64, segs: &[(i64, &[&str])]) -> LedgerMetadata {
        LedgerMetadata {
            ledger_id: 7,
            ensemble_size: e,
            write_quorum: qw,
            ack_quorum: qa,
            status: LedgerStatus::LedgerClosed as i32,
            last_entry_id: last,
            length: 0,
            segments: segs
                .iter()
                .map(|(f, b)| Segment {
                    first_entry_id: *f,
                    ensemble: b.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_bookie_is_lost_only_after_the_grace_and_recovers_when_it_returns() {
        let mut t = LostTracker::new();
        let named = set(&["b1", "b2", "b3"]);
        assert!(t.observe(0, &named, &set(&["b1", "b2"]), 100).is_empty());
        assert!(t.observe(99, &named, &set(&["b1", "b2"]), 100).is_empty());
        assert_eq!(
            t.observe(100, &named, &set(&["b1", "b2"]), 100),
            set(&["b3"])
        );
        // b3 comes back: no longer lost; leaving again restarts the grace.
        assert!(t.observe(150, &named, &named, 100).is_empty());
        assert!(t.observe(160, &named, &set(&["b1", "b2"]), 100).is_empty());
        assert_eq!(
            t.observe(260, &named, &set(&["b1", "b2"]), 100),
            set(&["b3"])
        );
    }

    #[test]
    fn only_ledgers_naming_a_lost_bookie_in_some_segment_are_marked() {
        let ledgers = vec![
            (3, md(2, 2, 2, 9, &[(0, &["b1", "b2"])])),
            (1, md(2, 2, 2, 9, &[(0, &["b3", "b4"]), (5, &["b1", "b4"])])),
            (2, md(2, 2, 2, 9, &[(0, &["b2", "b4"])])),
        ];
        assert_eq!(
            ledgers_to_mark(&ledgers, &set(&["b1"])),
            vec![(1, vec!["b1".to_string()]), (3, vec!["b1".to_string()])]
        );
        assert!(ledgers_to_mark(&ledgers, &set(&["b9"])).is_empty());
    }

    #[test]
    fn a_plan_copies_exactly_the_entries_of_the_lost_slot_with_surviving_sources() {
        // E=3 Qw=2: entry e goes to slots e%3 and (e+1)%3.
        let m = md(3, 2, 2, 5, &[(0, &["b1", "b2", "b3"])]);
        let p = copy_plan(&m, &set(&["b2"])).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].lost, "b2");
        let ids: Vec<EntryId> = p[0].entries.iter().map(|c| c.entry_id).collect();
        // slot 1 is in the write sets of entries 0 (0,1), 1 (1,2), 3, 4.
        assert_eq!(ids, vec![0, 1, 3, 4]);
        assert_eq!(p[0].entries[0].sources, vec!["b1".to_string()]);
        assert_eq!(p[0].entries[1].sources, vec!["b3".to_string()]);
    }

    #[test]
    fn a_plan_respects_segment_bounds_and_the_ledger_end() {
        let m = md(
            2,
            2,
            2,
            6,
            &[(0, &["b1", "b2"]), (4, &["b1", "b3"]), (7, &["b4", "b3"])],
        );
        let p = copy_plan(&m, &set(&["b1", "b3"])).unwrap_err();
        // Entries 4..=6 have both replicas lost.
        assert_eq!(p, PlanError::NoSource { entry_id: 4 });
        let p = copy_plan(&m, &set(&["b3"])).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].first_entry_id, 4);
        assert_eq!(
            p[0].entries.iter().map(|c| c.entry_id).collect::<Vec<_>>(),
            vec![4, 5, 6]
        );
        // The empty last segment still names b3: swapped with nothing to copy.
        assert_eq!(p[1].first_entry_id, 7);
        assert!(p[1].entries.is_empty());
    }

    #[test]
    fn a_swap_changes_one_slot_of_one_segment_and_is_idempotent() {
        let m = md(2, 2, 2, 9, &[(0, &["b1", "b2"]), (5, &["b1", "b3"])]);
        let n = replace_in_segment(&m, 0, "b1", "b4").unwrap().unwrap();
        assert_eq!(n.segments[0].ensemble, vec!["b4", "b2"]);
        assert_eq!(n.segments[1].ensemble, vec!["b1", "b3"]);
        assert_eq!(replace_in_segment(&n, 0, "b1", "b4").unwrap(), None);
        assert_eq!(
            replace_in_segment(&m, 0, "b1", "b2"),
            Err(SwapError::AlreadyInSegment("b2".into()))
        );
        assert_eq!(
            replace_in_segment(&m, 3, "b1", "b4"),
            Err(SwapError::NoSegment(3))
        );
        assert_eq!(
            replace_in_segment(&m, 0, "b9", "b8"),
            Err(SwapError::NotInSegment("b9".into()))
        );
    }

    #[test]
    fn sample_reads_cover_every_slot_of_every_segment_and_each_segment_end() {
        // E=3 Qw=2: segment 0 holds entries 0..=9, segment 1 10..=20.
        let m = md(
            3,
            2,
            2,
            20,
            &[(0, &["a", "b", "c"]), (10, &["a", "d", "c"])],
        );
        let reads = sample_reads(&m, 2, |n| n - 1).unwrap();
        let bookies: BTreeSet<&str> = reads.iter().map(|(_, b)| b.as_str()).collect();
        assert_eq!(bookies, ["a", "b", "c", "d"].into());
        for (e, b) in &reads {
            let seg = if *e < 10 { 0 } else { 1 };
            let slot = m.segments[seg]
                .ensemble
                .iter()
                .position(|x| x == b)
                .unwrap();
            assert!(
                quorum_spec(&m).unwrap().in_write_set(*e, slot),
                "{b} is in the write set of {e}"
            );
        }
        let entries: BTreeSet<i64> = reads.iter().map(|(e, _)| *e).collect();
        // First E of each segment, each segment's last entry, and the picks (last).
        assert_eq!(entries, [0, 1, 2, 9, 10, 11, 12, 20].into());
    }

    #[test]
    fn sample_reads_skip_open_ledgers_and_empty_segments() {
        let mut open = md(3, 3, 2, -1, &[(0, &["a", "b", "c"])]);
        open.status = LedgerStatus::LedgerOpen as i32;
        assert!(sample_reads(&open, 3, |_| 0).unwrap().is_empty());
        let empty = md(3, 3, 2, -1, &[(0, &["a", "b", "c"])]);
        assert!(sample_reads(&empty, 3, |_| 0).unwrap().is_empty());
    }
}
