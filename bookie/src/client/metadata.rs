//! Pure functions over [`LedgerMetadata`]: lookups, validation, and the
//! "modify" step of every read-modify-CAS update (reference §1.3, §1.6, §1.7).
//!
//! Promises:
//! - [`validate`] accepts only metadata whose every segment is usable: E ≥ Qw ≥
//!   Qa ≥ 1, segments start at 0 and strictly increase, each has E distinct
//!   bookies, and a closed ledger's last segment starts at most one past its
//!   last entry;
//! - every [`MetadataOp::apply`] is a pure function of the metadata just read,
//!   so the driver's CAS loop re-applies it after a version conflict and the
//!   conflict rules live here, not in the driver:
//!   - a writer's update of a ledger that is no longer OPEN fails with
//!     [`UpdateError::Fenced`] (it was fenced or closed by someone else);
//!   - a close of an already CLOSED ledger with the same last entry and length
//!     is [`Update::Unchanged`] (success), with another last entry an error;
//!   - a new segment below the last segment's first entry is refused
//!     (BookKeeper #2615); one at the same first entry replaces the last.

use std::collections::HashMap;

use bytes::Bytes;

use super::quorum::{QuorumError, QuorumSpec};
use super::{BookieId, EntryId, Replacement};
use crate::proto::metadata::{DigestType, LedgerMetadata, LedgerStatus, Segment};

/// Why metadata is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// E, Qw, Qa are not E ≥ Qw ≥ Qa ≥ 1.
    #[error(transparent)]
    Quorum(#[from] QuorumError),
    /// A status number this code does not know.
    #[error("unknown ledger status {0}")]
    UnknownStatus(i32),
    /// A digest type this code does not know.
    #[error("unknown digest type {0}")]
    UnknownDigest(i32),
    /// No segment at all.
    #[error("ledger has no segment")]
    NoSegments,
    /// The first segment does not start at entry 0.
    #[error("first segment starts at entry {0}, not 0")]
    FirstSegmentNotAtZero(EntryId),
    /// Segment first entries do not strictly increase.
    #[error("segment at entry {next} does not follow segment at entry {previous}")]
    SegmentsNotIncreasing {
        /// First entry of the earlier segment.
        previous: EntryId,
        /// First entry of the later one.
        next: EntryId,
    },
    /// A segment's ensemble is not E bookies.
    #[error("segment at entry {first_entry_id} has {got} bookies, ensemble size is {want}")]
    EnsembleSize {
        /// The segment.
        first_entry_id: EntryId,
        /// Bookies it has.
        got: usize,
        /// E.
        want: usize,
    },
    /// A bookie twice in one ensemble, or an empty id.
    #[error("segment at entry {first_entry_id} names bookie {bookie:?} twice or empty")]
    BadBookie {
        /// The segment.
        first_entry_id: EntryId,
        /// The bookie id.
        bookie: BookieId,
    },
    /// A closed ledger whose last segment starts past its end.
    #[error("closed at entry {last_entry_id} but last segment starts at {first_entry_id}")]
    SegmentPastEnd {
        /// The ledger's last entry.
        last_entry_id: EntryId,
        /// The last segment's first entry.
        first_entry_id: EntryId,
    },
    /// A closed ledger's last entry below −1.
    #[error("closed at entry {0}")]
    BadLastEntry(EntryId),
}

/// Who performs an update; the allowed source states differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Updater {
    /// The ledger's writer: requires OPEN.
    Writer,
    /// A recovery client: requires IN_RECOVERY.
    Recovery,
}

/// Why an update cannot be applied to the metadata just read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    /// A writer's update, but the ledger is no longer OPEN: it was fenced by a
    /// recovery or closed by someone else.
    #[error("ledger is {status:?}: the writer was fenced")]
    Fenced {
        /// The state found.
        status: LedgerStatus,
    },
    /// A recovery update on a ledger that is OPEN (never marked in recovery).
    #[error("ledger is not in recovery")]
    NotInRecovery,
    /// The ledger is already closed (at this entry and length).
    #[error("ledger already closed at entry {last_entry_id}")]
    Closed {
        /// Its last entry.
        last_entry_id: EntryId,
        /// Its length.
        length: u64,
    },
    /// A close, but the ledger is already closed at another entry or length.
    #[error("ledger already closed at entry {last_entry_id} (length {length})")]
    ClosedDifferently {
        /// The last entry it was closed with.
        last_entry_id: EntryId,
        /// The length it was closed with.
        length: u64,
    },
    /// A new segment would start below the last segment (BookKeeper #2615).
    #[error(
        "new segment at entry {first_entry_id} is below the last segment at {last_first_entry_id}"
    )]
    SegmentBelowLastKey {
        /// The new segment's first entry.
        first_entry_id: EntryId,
        /// The last segment's first entry.
        last_first_entry_id: EntryId,
    },
    /// A replaced bookie is not in the last segment.
    #[error("bookie {0} is not in the last segment")]
    BookieNotInEnsemble(BookieId),
    /// A replacement is already in the last segment.
    #[error("replacement bookie {0} is already in the last segment")]
    ReplacementInEnsemble(BookieId),
    /// The stored metadata (or the result) is not valid.
    #[error(transparent)]
    Invalid(#[from] MetadataError),
    /// The driver could not finish the CAS loop (metadata store unavailable
    /// past its retry bound); reported by the driver, never by `apply`.
    #[error("metadata store: {0}")]
    Store(String),
}

/// A new segment from `first_entry_id` with some bookies of the last segment
/// replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsembleChange {
    /// First entry of the new segment.
    pub first_entry_id: EntryId,
    /// Bookies replaced.
    pub replacements: Vec<Replacement>,
}

/// A metadata update, to run as a read-modify-CAS loop (see [`MetadataOp::apply`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataOp {
    /// OPEN → IN_RECOVERY (first step of recovery).
    MarkInRecovery,
    /// A writer's ensemble change.
    ChangeEnsemble(EnsembleChange),
    /// Close at `last_entry_id` with `length`; a recovery first applies its
    /// `ensemble_changes` (made while writing back) in the same CAS.
    Close {
        /// Last entry (−1 = empty).
        last_entry_id: EntryId,
        /// Ledger length in payload bytes.
        length: u64,
        /// Who closes.
        by: Updater,
        /// Recovery's ensemble changes, applied in order before closing.
        ensemble_changes: Vec<EnsembleChange>,
    },
}

/// What a modify step decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// Write this metadata with the read version as the expected version.
    Write(LedgerMetadata),
    /// Nothing to write: the update is already in place (success).
    Unchanged,
}

impl MetadataOp {
    /// The modify step: what to write given the metadata just read. A driver's
    /// loop: read `(md, version)`; `apply(&md)`; on `Write(new)` CAS it with
    /// `version`, and on a version conflict start again; on `Unchanged` the
    /// result is `md`; on `Err` stop and report the error.
    pub fn apply(&self, current: &LedgerMetadata) -> Result<Update, UpdateError> {
        match self {
            MetadataOp::MarkInRecovery => mark_in_recovery(current),
            MetadataOp::ChangeEnsemble(c) => change_ensemble(current, c, Updater::Writer),
            MetadataOp::Close {
                last_entry_id,
                length,
                by,
                ensemble_changes,
            } => close(current, *last_entry_id, *length, *by, ensemble_changes),
        }
    }
}

/// What a new ledger is created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLedger {
    /// Id from the metadata id generator.
    pub ledger_id: u64,
    /// E, Qw, Qa.
    pub quorum: QuorumSpec,
    /// E bookies chosen by placement.
    pub ensemble: Vec<BookieId>,
    /// The ledger password (the master key derives from it).
    pub password: Bytes,
    /// Application key/values.
    pub custom: HashMap<String, Bytes>,
    /// Creation time, ms since the Unix epoch (an input: the core reads no clock).
    pub ctime_ms: i64,
}

/// The metadata of a new, OPEN, empty ledger (validated).
pub fn new_ledger(n: NewLedger) -> Result<LedgerMetadata, MetadataError> {
    let md = LedgerMetadata {
        ledger_id: n.ledger_id,
        ensemble_size: count_u32(n.quorum.ensemble_size()),
        write_quorum: count_u32(n.quorum.write_quorum()),
        ack_quorum: count_u32(n.quorum.ack_quorum()),
        status: LedgerStatus::LedgerOpen as i32,
        last_entry_id: -1,
        length: 0,
        segments: vec![Segment {
            first_entry_id: 0,
            ensemble: n.ensemble,
        }],
        digest_type: DigestType::DigestCrc32c as i32,
        password: n.password.to_vec(),
        custom: n.custom.into_iter().map(|(k, v)| (k, v.to_vec())).collect(),
        ctime_ms: n.ctime_ms,
    };
    validate(&md)?;
    Ok(md)
}

fn count_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// E, Qw, Qa of the metadata.
pub fn quorum_spec(md: &LedgerMetadata) -> Result<QuorumSpec, MetadataError> {
    Ok(QuorumSpec::new(
        md.ensemble_size as usize,
        md.write_quorum as usize,
        md.ack_quorum as usize,
    )?)
}

/// The ledger's state.
pub fn status(md: &LedgerMetadata) -> Result<LedgerStatus, MetadataError> {
    LedgerStatus::try_from(md.status).map_err(|_| MetadataError::UnknownStatus(md.status))
}

/// The last segment (the one being written while OPEN).
pub fn last_segment(md: &LedgerMetadata) -> Option<&Segment> {
    md.segments.last()
}

/// The segment holding entry `entry_id`: the last one starting at or below it.
pub fn segment_for_entry(md: &LedgerMetadata, entry_id: EntryId) -> Option<&Segment> {
    md.segments
        .iter()
        .rev()
        .find(|s| s.first_entry_id <= entry_id)
}

/// The ensemble of the segment holding `entry_id`.
pub fn ensemble_for_entry(md: &LedgerMetadata, entry_id: EntryId) -> Option<&[BookieId]> {
    segment_for_entry(md, entry_id).map(|s| s.ensemble.as_slice())
}

/// The bookies of entry `entry_id`'s write set, in write-set order.
pub fn write_set_bookies(
    md: &LedgerMetadata,
    spec: &QuorumSpec,
    entry_id: EntryId,
) -> Vec<BookieId> {
    write_set_iter(md, spec, entry_id).cloned().collect()
}

/// [`write_set_bookies`] borrowed from `md`, without allocating.
pub fn write_set_iter<'a>(
    md: &'a LedgerMetadata,
    spec: &QuorumSpec,
    entry_id: EntryId,
) -> impl Iterator<Item = &'a BookieId> + use<'a> {
    // No segment holds the entry: an empty ensemble, so no bookies.
    let ens = ensemble_for_entry(md, entry_id).unwrap_or(&[]);
    spec.write_set_slots(entry_id)
        .filter_map(move |slot| ens.get(slot))
}

/// Checks the whole metadata; returns its quorum spec.
pub fn validate(md: &LedgerMetadata) -> Result<QuorumSpec, MetadataError> {
    let spec = quorum_spec(md)?;
    let st = status(md)?;
    DigestType::try_from(md.digest_type)
        .map_err(|_| MetadataError::UnknownDigest(md.digest_type))?;
    let first = md.segments.first().ok_or(MetadataError::NoSegments)?;
    if first.first_entry_id != 0 {
        return Err(MetadataError::FirstSegmentNotAtZero(first.first_entry_id));
    }
    for pair in md.segments.windows(2) {
        if pair[1].first_entry_id <= pair[0].first_entry_id {
            return Err(MetadataError::SegmentsNotIncreasing {
                previous: pair[0].first_entry_id,
                next: pair[1].first_entry_id,
            });
        }
    }
    for s in &md.segments {
        if s.ensemble.len() != spec.ensemble_size() {
            return Err(MetadataError::EnsembleSize {
                first_entry_id: s.first_entry_id,
                got: s.ensemble.len(),
                want: spec.ensemble_size(),
            });
        }
        for (i, b) in s.ensemble.iter().enumerate() {
            if b.is_empty() || s.ensemble[..i].contains(b) {
                return Err(MetadataError::BadBookie {
                    first_entry_id: s.first_entry_id,
                    bookie: b.clone(),
                });
            }
        }
    }
    if st == LedgerStatus::LedgerClosed {
        if md.last_entry_id < -1 {
            return Err(MetadataError::BadLastEntry(md.last_entry_id));
        }
        let last_first = md.segments.last().map_or(0, |s| s.first_entry_id);
        if last_first > md.last_entry_id + 1 {
            return Err(MetadataError::SegmentPastEnd {
                last_entry_id: md.last_entry_id,
                first_entry_id: last_first,
            });
        }
    }
    Ok(spec)
}

/// OPEN → IN_RECOVERY; already IN_RECOVERY (a concurrent recovery) is
/// unchanged; CLOSED is [`UpdateError::Closed`] (nothing to recover).
pub fn mark_in_recovery(md: &LedgerMetadata) -> Result<Update, UpdateError> {
    validate(md)?;
    match status(md)? {
        LedgerStatus::LedgerOpen => {
            let mut new = md.clone();
            new.status = LedgerStatus::LedgerInRecovery as i32;
            Ok(Update::Write(new))
        }
        LedgerStatus::LedgerInRecovery => Ok(Update::Unchanged),
        LedgerStatus::LedgerClosed => Err(UpdateError::Closed {
            last_entry_id: md.last_entry_id,
            length: md.length,
        }),
    }
}

fn check_updater(md: &LedgerMetadata, by: Updater) -> Result<(), UpdateError> {
    let st = status(md)?;
    match (by, st) {
        (Updater::Writer, LedgerStatus::LedgerOpen) => Ok(()),
        (Updater::Writer, status) => Err(UpdateError::Fenced { status }),
        (Updater::Recovery, LedgerStatus::LedgerInRecovery) => Ok(()),
        (Updater::Recovery, LedgerStatus::LedgerOpen) => Err(UpdateError::NotInRecovery),
        (Updater::Recovery, LedgerStatus::LedgerClosed) => Err(UpdateError::Closed {
            last_entry_id: md.last_entry_id,
            length: md.length,
        }),
    }
}

/// Applies an ensemble change to `md` in place (no state check).
fn apply_change(md: &mut LedgerMetadata, change: &EnsembleChange) -> Result<bool, UpdateError> {
    let last = md.segments.last().ok_or(MetadataError::NoSegments)?;
    if change.first_entry_id < last.first_entry_id {
        return Err(UpdateError::SegmentBelowLastKey {
            first_entry_id: change.first_entry_id,
            last_first_entry_id: last.first_entry_id,
        });
    }
    // Already applied (a CAS that succeeded but whose answer was lost, then
    // retried): same first entry, every replacement in place.
    if change.first_entry_id == last.first_entry_id
        && change
            .replacements
            .iter()
            .all(|r| last.ensemble.contains(&r.new) && !last.ensemble.contains(&r.old))
    {
        return Ok(false);
    }
    let mut ensemble = last.ensemble.clone();
    for r in &change.replacements {
        if ensemble.contains(&r.new) {
            return Err(UpdateError::ReplacementInEnsemble(r.new.clone()));
        }
        let slot = ensemble
            .iter()
            .position(|b| *b == r.old)
            .ok_or_else(|| UpdateError::BookieNotInEnsemble(r.old.clone()))?;
        ensemble[slot] = r.new.clone();
    }
    let seg = Segment {
        first_entry_id: change.first_entry_id,
        ensemble,
    };
    if change.first_entry_id == last.first_entry_id {
        if let Some(l) = md.segments.last_mut() {
            *l = seg;
        }
    } else {
        md.segments.push(seg);
    }
    Ok(true)
}

/// An ensemble change by `by`: a new segment from `change.first_entry_id` (the
/// first entry not yet completed), replacing the last segment if it starts
/// at the same entry; refused below the last segment.
pub fn change_ensemble(
    md: &LedgerMetadata,
    change: &EnsembleChange,
    by: Updater,
) -> Result<Update, UpdateError> {
    validate(md)?;
    check_updater(md, by)?;
    let mut new = md.clone();
    if !apply_change(&mut new, change)? {
        return Ok(Update::Unchanged);
    }
    validate(&new)?;
    Ok(Update::Write(new))
}

/// Close at `last_entry_id` with `length` (after applying a recovery's
/// `ensemble_changes`). A writer needs OPEN, a recovery IN_RECOVERY; a ledger
/// already CLOSED at the same entry and length is unchanged (success), at
/// another is [`UpdateError::ClosedDifferently`].
pub fn close(
    md: &LedgerMetadata,
    last_entry_id: EntryId,
    length: u64,
    by: Updater,
    ensemble_changes: &[EnsembleChange],
) -> Result<Update, UpdateError> {
    validate(md)?;
    if status(md)? == LedgerStatus::LedgerClosed {
        return if md.last_entry_id == last_entry_id && md.length == length {
            Ok(Update::Unchanged)
        } else {
            Err(UpdateError::ClosedDifferently {
                last_entry_id: md.last_entry_id,
                length: md.length,
            })
        };
    }
    check_updater(md, by)?;
    let mut new = md.clone();
    for c in ensemble_changes {
        apply_change(&mut new, c)?;
    }
    new.status = LedgerStatus::LedgerClosed as i32;
    new.last_entry_id = last_entry_id;
    new.length = length;
    validate(&new)?;
    Ok(Update::Write(new))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<BookieId> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn open_ledger() -> LedgerMetadata {
        new_ledger(NewLedger {
            ledger_id: 5,
            quorum: QuorumSpec::new(3, 3, 2).unwrap(),
            ensemble: ids(&["b1", "b2", "b3"]),
            password: Bytes::from_static(b"pw"),
            custom: HashMap::from([("topic".to_string(), Bytes::from_static(b"t"))]),
            ctime_ms: 1000,
        })
        .unwrap()
    }

    fn written(u: Result<Update, UpdateError>) -> LedgerMetadata {
        match u {
            Ok(Update::Write(md)) => md,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    fn change(first: EntryId, old: &str, new: &str) -> EnsembleChange {
        EnsembleChange {
            first_entry_id: first,
            replacements: vec![Replacement {
                old: old.into(),
                new: new.into(),
            }],
        }
    }

    #[test]
    fn new_ledger_is_open_empty_and_validated() {
        let md = open_ledger();
        assert_eq!(status(&md).unwrap(), LedgerStatus::LedgerOpen);
        assert_eq!(md.last_entry_id, -1);
        assert_eq!(md.segments.len(), 1);
        assert_eq!(md.custom["topic"], b"t".to_vec());
        let bad = new_ledger(NewLedger {
            ledger_id: 1,
            quorum: QuorumSpec::new(3, 2, 2).unwrap(),
            ensemble: ids(&["b1", "b2"]),
            password: Bytes::new(),
            custom: HashMap::new(),
            ctime_ms: 0,
        });
        assert_eq!(
            bad,
            Err(MetadataError::EnsembleSize {
                first_entry_id: 0,
                got: 2,
                want: 3
            })
        );
        let dup = new_ledger(NewLedger {
            ledger_id: 1,
            quorum: QuorumSpec::new(2, 2, 2).unwrap(),
            ensemble: ids(&["b1", "b1"]),
            password: Bytes::new(),
            custom: HashMap::new(),
            ctime_ms: 0,
        });
        assert!(matches!(dup, Err(MetadataError::BadBookie { .. })));
    }

    #[test]
    fn validation_refuses_bad_quorums_segments_and_states() {
        let good = open_ledger();
        type Mutation = Box<dyn Fn(&mut LedgerMetadata)>;
        let cases: Vec<(&str, Mutation, bool)> = vec![
            ("qa above qw", Box::new(|m| m.ack_quorum = 4), false),
            ("qw above e", Box::new(|m| m.write_quorum = 4), false),
            ("zero qa", Box::new(|m| m.ack_quorum = 0), false),
            ("unknown status", Box::new(|m| m.status = 9), false),
            ("unknown digest", Box::new(|m| m.digest_type = 3), false),
            ("no segments", Box::new(|m| m.segments.clear()), false),
            (
                "first not at zero",
                Box::new(|m| m.segments[0].first_entry_id = 1),
                false,
            ),
            (
                "not increasing",
                Box::new(|m| {
                    let s = m.segments[0].clone();
                    m.segments.push(s)
                }),
                false,
            ),
            (
                "empty bookie id",
                Box::new(|m| m.segments[0].ensemble[1].clear()),
                false,
            ),
            (
                "closed with segment past end",
                Box::new(|m| {
                    m.status = LedgerStatus::LedgerClosed as i32;
                    m.last_entry_id = 3;
                    m.segments.push(Segment {
                        first_entry_id: 5,
                        ensemble: ids(&["b1", "b2", "b4"]),
                    });
                }),
                false,
            ),
            (
                "closed with segment just past end",
                Box::new(|m| {
                    m.status = LedgerStatus::LedgerClosed as i32;
                    m.last_entry_id = 4;
                    m.segments.push(Segment {
                        first_entry_id: 5,
                        ensemble: ids(&["b1", "b2", "b4"]),
                    });
                }),
                true,
            ),
            (
                "closed empty",
                Box::new(|m| {
                    m.status = LedgerStatus::LedgerClosed as i32;
                    m.last_entry_id = -1;
                }),
                true,
            ),
            (
                "closed below -1",
                Box::new(|m| {
                    m.status = LedgerStatus::LedgerClosed as i32;
                    m.last_entry_id = -2;
                }),
                false,
            ),
        ];
        for (name, f, ok) in cases {
            let mut md = good.clone();
            f(&mut md);
            assert_eq!(validate(&md).is_ok(), ok, "{name}: {:?}", validate(&md));
        }
    }

    #[test]
    fn entries_map_to_the_last_segment_starting_at_or_below_them() {
        let mut md = open_ledger();
        md.segments.push(Segment {
            first_entry_id: 10,
            ensemble: ids(&["b1", "b4", "b3"]),
        });
        let spec = validate(&md).unwrap();
        assert_eq!(ensemble_for_entry(&md, 0).unwrap()[1], "b2");
        assert_eq!(ensemble_for_entry(&md, 9).unwrap()[1], "b2");
        assert_eq!(ensemble_for_entry(&md, 10).unwrap()[1], "b4");
        assert_eq!(ensemble_for_entry(&md, 99).unwrap()[1], "b4");
        assert!(ensemble_for_entry(&md, -1).is_none());
        assert_eq!(last_segment(&md).unwrap().first_entry_id, 10);
        assert_eq!(write_set_bookies(&md, &spec, 11), ids(&["b3", "b1", "b4"]));
        // Slot (e mod E + i) mod E of the entry's segment, i < Qw; none
        // before the first segment.
        for e in 0..25i64 {
            let ens = ensemble_for_entry(&md, e).unwrap();
            let want: Vec<&BookieId> = (0..3).map(|i| &ens[(e as usize + i) % 3]).collect();
            let got: Vec<&BookieId> = write_set_iter(&md, &spec, e).collect();
            assert_eq!(got, want, "entry {e}");
        }
        assert_eq!(write_set_iter(&md, &spec, -1).count(), 0);
        assert!(write_set_bookies(&md, &spec, -1).is_empty());
    }

    #[test]
    fn writer_ensemble_change_appends_replaces_at_same_entry_and_refuses_below() {
        let md = open_ledger();
        let m1 = written(MetadataOp::ChangeEnsemble(change(4, "b2", "b4")).apply(&md));
        assert_eq!(m1.segments.len(), 2);
        assert_eq!(m1.segments[1].first_entry_id, 4);
        assert_eq!(m1.segments[1].ensemble, ids(&["b1", "b4", "b3"]));
        // Same first entry: the last segment is replaced, not duplicated.
        let m2 = written(MetadataOp::ChangeEnsemble(change(4, "b4", "b5")).apply(&m1));
        assert_eq!(m2.segments.len(), 2);
        assert_eq!(m2.segments[1].ensemble, ids(&["b1", "b5", "b3"]));
        // Below the last key: refused (BookKeeper #2615).
        assert_eq!(
            MetadataOp::ChangeEnsemble(change(3, "b1", "b6")).apply(&m2),
            Err(UpdateError::SegmentBelowLastKey {
                first_entry_id: 3,
                last_first_entry_id: 4
            })
        );
        // Replaying an applied change (lost CAS answer) is unchanged.
        assert_eq!(
            MetadataOp::ChangeEnsemble(change(4, "b4", "b5")).apply(&m2),
            Ok(Update::Unchanged)
        );
        assert_eq!(
            MetadataOp::ChangeEnsemble(change(6, "b9", "b7")).apply(&m2),
            Err(UpdateError::BookieNotInEnsemble("b9".into()))
        );
        assert_eq!(
            MetadataOp::ChangeEnsemble(change(6, "b1", "b3")).apply(&m2),
            Err(UpdateError::ReplacementInEnsemble("b3".into()))
        );
    }

    #[test]
    fn writer_updates_after_fencing_fail_with_fenced() {
        let md = open_ledger();
        let rec = written(MetadataOp::MarkInRecovery.apply(&md));
        assert_eq!(status(&rec).unwrap(), LedgerStatus::LedgerInRecovery);
        assert_eq!(
            MetadataOp::ChangeEnsemble(change(1, "b1", "b4")).apply(&rec),
            Err(UpdateError::Fenced {
                status: LedgerStatus::LedgerInRecovery
            })
        );
        let writer_close = MetadataOp::Close {
            last_entry_id: 3,
            length: 30,
            by: Updater::Writer,
            ensemble_changes: vec![],
        };
        assert_eq!(
            writer_close.apply(&rec),
            Err(UpdateError::Fenced {
                status: LedgerStatus::LedgerInRecovery
            })
        );
    }

    #[test]
    fn close_is_idempotent_at_the_same_entry_and_refused_at_another() {
        let md = open_ledger();
        let op = |last, length, by| MetadataOp::Close {
            last_entry_id: last,
            length,
            by,
            ensemble_changes: vec![],
        };
        let closed = written(op(3, 30, Updater::Writer).apply(&md));
        assert_eq!(status(&closed).unwrap(), LedgerStatus::LedgerClosed);
        assert_eq!((closed.last_entry_id, closed.length), (3, 30));
        assert_eq!(
            op(3, 30, Updater::Writer).apply(&closed),
            Ok(Update::Unchanged)
        );
        assert_eq!(
            op(3, 30, Updater::Recovery).apply(&closed),
            Ok(Update::Unchanged)
        );
        assert_eq!(
            op(4, 40, Updater::Recovery).apply(&closed),
            Err(UpdateError::ClosedDifferently {
                last_entry_id: 3,
                length: 30
            })
        );
        assert_eq!(
            op(3, 30, Updater::Recovery).apply(&md),
            Err(UpdateError::NotInRecovery)
        );
        assert_eq!(
            MetadataOp::MarkInRecovery.apply(&closed),
            Err(UpdateError::Closed {
                last_entry_id: 3,
                length: 30
            })
        );
    }

    #[test]
    fn concurrent_mark_in_recovery_is_unchanged_and_recovery_close_applies_its_changes() {
        let md = written(MetadataOp::MarkInRecovery.apply(&open_ledger()));
        assert_eq!(MetadataOp::MarkInRecovery.apply(&md), Ok(Update::Unchanged));
        let closed = written(
            MetadataOp::Close {
                last_entry_id: 5,
                length: 50,
                by: Updater::Recovery,
                ensemble_changes: vec![change(2, "b3", "b4"), change(4, "b1", "b5")],
            }
            .apply(&md),
        );
        assert_eq!(closed.segments.len(), 3);
        assert_eq!(closed.segments[2].ensemble, ids(&["b5", "b2", "b4"]));
        // A recovery change below the last segment is refused (#2615).
        let mut two = md.clone();
        two.segments.push(Segment {
            first_entry_id: 5,
            ensemble: ids(&["b1", "b2", "b4"]),
        });
        let below = MetadataOp::Close {
            last_entry_id: 6,
            length: 60,
            by: Updater::Recovery,
            ensemble_changes: vec![change(0, "b1", "b6")],
        };
        assert!(matches!(
            below.apply(&two),
            Err(UpdateError::SegmentBelowLastKey { .. })
        ));
    }
}
