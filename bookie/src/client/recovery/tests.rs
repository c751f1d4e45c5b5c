//! Recovery behaviour driven by hand: fencing to coverage, the start clamp
//! (BookKeeper #2615), absence only from explicit negatives, write-back and
//! close, adoption of a concurrent close.

use std::collections::HashMap;

use super::*;
use crate::client::metadata::{NewLedger, new_ledger};
use crate::entry::EntryHeader;
use crate::proto::metadata::Segment;

fn ids(v: &[&str]) -> Vec<BookieId> {
    v.iter().map(|s| s.to_string()).collect()
}

fn open_md(e: usize, qw: usize, qa: usize, bookies: &[&str]) -> LedgerMetadata {
    new_ledger(NewLedger {
        ledger_id: 3,
        quorum: QuorumSpec::new(e, qw, qa).unwrap(),
        ensemble: ids(bookies),
        password: Bytes::from_static(b"pw"),
        custom: HashMap::new(),
        ctime_ms: 0,
    })
    .unwrap()
}

fn entry(id: EntryId, lac: EntryId, length: u64) -> Bytes {
    Entry::encode(
        EntryHeader {
            ledger_id: 3,
            entry_id: id,
            lac,
            length,
        },
        b"p",
    )
}

fn drain(r: &mut Recovery) -> Vec<RecoveryAction> {
    std::iter::from_fn(|| r.poll_action()).collect()
}

fn config() -> RecoveryConfig {
    RecoveryConfig {
        read_timeout_ms: 100,
        attempts_max: 3,
        add_timeout_ms: 100,
    }
}

/// Starts a recovery and answers the mark CAS; returns the fence sends.
fn marked(md: LedgerMetadata) -> (Recovery, Vec<RecoveryAction>) {
    let mut r = Recovery::new(md.clone(), config()).unwrap();
    r.start();
    let op = match drain(&mut r).as_slice() {
        [RecoveryAction::UpdateMetadata(op)] => op.clone(),
        other => panic!("{other:?}"),
    };
    let md = match op.apply(&md).unwrap() {
        Update::Write(m) => m,
        Update::Unchanged => md,
    };
    r.metadata_result(Ok(md));
    let a = drain(&mut r);
    (r, a)
}

fn fence_ok(r: &mut Recovery, bookie: &str, last: Option<Bytes>) {
    r.fence_response(
        bookie,
        FenceAnswer {
            status: BookieStatus::Ok,
            last_entry: last,
            explicit_lac: None,
        },
    );
}

fn reads(a: &[RecoveryAction]) -> Vec<(String, EntryId, bool)> {
    a.iter()
        .filter_map(|x| match x {
            RecoveryAction::SendRead {
                bookie,
                entry_id,
                fence,
            } => Some((bookie.clone(), *entry_id, *fence)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_closed_ledger_needs_no_recovery() {
    let mut md = open_md(3, 3, 2, &["b1", "b2", "b3"]);
    md.status = LedgerStatus::LedgerClosed as i32;
    md.last_entry_id = 4;
    md.length = 40;
    let mut r = Recovery::new(md, config()).unwrap();
    r.start();
    assert_eq!(
        drain(&mut r),
        vec![RecoveryAction::Finished(Ok(Recovered {
            last_entry_id: 4,
            length: 40,
            closed_by_us: false
        }))]
    );
}

#[test]
fn fencing_waits_for_ensemble_coverage_then_reads_from_the_max_lac_with_fence() {
    let (mut r, a) = marked(open_md(3, 3, 2, &["b1", "b2", "b3"]));
    assert_eq!(
        a.iter()
            .filter(|x| matches!(x, RecoveryAction::SendFence { .. }))
            .count(),
        3
    );
    fence_ok(&mut r, "b1", Some(entry(4, 3, 50)));
    assert!(
        drain(&mut r).is_empty(),
        "one answer is not coverage for Qa=2"
    );
    // b2 knows a higher LAC (5) from its last entry 6.
    fence_ok(&mut r, "b2", Some(entry(6, 5, 70)));
    let a = drain(&mut r);
    // Start = 5, whose length is not known from the answers: probe it.
    assert_eq!(
        reads(&a),
        vec![
            ("b3".into(), 5, true),
            ("b1".into(), 5, true),
            ("b2".into(), 5, true)
        ]
    );
}

#[test]
fn the_start_is_clamped_to_the_last_segment_bk2615() {
    let mut md = open_md(3, 3, 2, &["b1", "b2", "b3"]);
    md.segments.push(Segment {
        first_entry_id: 5,
        ensemble: ids(&["b4", "b5", "b6"]),
    });
    let (mut r, a) = marked(md);
    let fenced: Vec<_> = a
        .iter()
        .filter_map(|x| match x {
            RecoveryAction::SendFence { bookie } => Some(bookie.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        fenced,
        ids(&["b4", "b5", "b6"]),
        "only the last segment is fenced"
    );
    // The new segment's bookies hold nothing: the LAC they report is -1.
    for b in ["b4", "b5"] {
        r.fence_response(
            b,
            FenceAnswer {
                status: BookieStatus::NoLedger,
                last_entry: None,
                explicit_lac: None,
            },
        );
    }
    let a = reads(&drain(&mut r));
    assert!(
        a.iter().all(|(_, e, _)| *e >= 4),
        "recovery must not re-read the immutable segment: {a:?}"
    );
    assert_eq!(a[0].1, 4, "probe of the start entry (length)");
}

#[test]
fn only_explicit_negatives_prove_absence_and_unknown_answers_are_retried_then_abort() {
    let (mut r, _) = marked(open_md(3, 3, 2, &["b1", "b2", "b3"]));
    for b in ["b1", "b2", "b3"] {
        fence_ok(&mut r, b, None);
    }
    let a = reads(&drain(&mut r));
    assert_eq!(a.len(), 3);
    assert!(a.iter().all(|(_, e, f)| *e == 0 && *f));
    r.read_response("b1", 0, BookieStatus::NoEntry, None);
    r.read_response("b2", 0, BookieStatus::UnknownState, None);
    r.read_response("b3", 0, BookieStatus::Error, None);
    // One negative of the two needed: the unknown ones are asked again.
    let again = reads(&drain(&mut r));
    assert_eq!(again, vec![("b2".into(), 0, true), ("b3".into(), 0, true)]);
    // Timeouts never count: after attempts_max rounds recovery gives up.
    r.tick(100);
    let again = reads(&drain(&mut r));
    assert_eq!(again.len(), 2);
    r.tick(200);
    assert_eq!(
        drain(&mut r),
        vec![RecoveryAction::Finished(Err(RecoveryError::ReadUndecided(
            0
        )))]
    );
}

#[test]
fn a_corrupt_copy_is_not_presence_nor_absence() {
    let (mut r, _) = marked(open_md(3, 3, 2, &["b1", "b2", "b3"]));
    for b in ["b1", "b2", "b3"] {
        fence_ok(&mut r, b, None);
    }
    drain(&mut r);
    let mut bad = entry(0, -1, 1).to_vec();
    bad[36] ^= 1;
    r.read_response("b1", 0, BookieStatus::Ok, Some(Bytes::from(bad)));
    r.read_response("b2", 0, BookieStatus::NoEntry, None);
    assert!(drain(&mut r).is_empty(), "pending on b3");
    r.read_response("b3", 0, BookieStatus::NoEntry, None);
    // Two explicit negatives (= Qw - Qa + 1): absent; nothing recovered.
    let a = drain(&mut r);
    assert_eq!(
        a,
        vec![RecoveryAction::UpdateMetadata(MetadataOp::Close {
            last_entry_id: -1,
            length: 0,
            by: Updater::Recovery,
            ensemble_changes: vec![]
        })]
    );
}

#[test]
fn present_entries_are_written_back_with_recovery_add_before_the_close() {
    let md = open_md(3, 3, 2, &["b1", "b2", "b3"]);
    let (mut r, _) = marked(md.clone());
    for b in ["b1", "b2", "b3"] {
        fence_ok(&mut r, b, None);
    }
    drain(&mut r);
    // Entry 0 on b2 only (the writer had Qa-1 acks): present.
    r.read_response("b2", 0, BookieStatus::Ok, Some(entry(0, -1, 1)));
    let a = drain(&mut r);
    let adds: Vec<_> = a
        .iter()
        .filter_map(|x| match x {
            RecoveryAction::SendAdd {
                bookie, entry_id, ..
            } => Some((bookie.clone(), *entry_id)),
            _ => None,
        })
        .collect();
    assert_eq!(
        adds,
        vec![("b1".into(), 0), ("b2".into(), 0), ("b3".into(), 0)]
    );
    assert!(reads(&a).iter().all(|(_, e, _)| *e == 1), "reads on");
    for b in ["b1", "b2"] {
        r.read_response(b, 1, BookieStatus::NoEntry, None);
    }
    assert!(
        drain(&mut r).is_empty(),
        "end found, but the write-back is not at Qa yet"
    );
    r.add_response("b1", 0, BookieStatus::Ok);
    r.add_response("b3", 0, BookieStatus::Ok);
    let a = drain(&mut r);
    let op = match a.as_slice() {
        [RecoveryAction::UpdateMetadata(op)] => op.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        op,
        MetadataOp::Close {
            last_entry_id: 0,
            length: 1,
            by: Updater::Recovery,
            ensemble_changes: vec![]
        }
    );
    // Another recovery closed at -1 first: its end is adopted.
    r.metadata_result(Err(UpdateError::ClosedDifferently {
        last_entry_id: -1,
        length: 0,
    }));
    assert_eq!(
        drain(&mut r),
        vec![RecoveryAction::Finished(Ok(Recovered {
            last_entry_id: -1,
            length: 0,
            closed_by_us: false
        }))]
    );
}

#[test]
fn a_write_back_failure_proposes_a_replacement_published_with_the_close() {
    let (mut r, _) = marked(open_md(3, 3, 2, &["b1", "b2", "b3"]));
    for b in ["b1", "b2", "b3"] {
        fence_ok(&mut r, b, None);
    }
    drain(&mut r);
    r.read_response("b1", 0, BookieStatus::Ok, Some(entry(0, -1, 1)));
    drain(&mut r);
    r.add_response("b3", 0, BookieStatus::Error);
    let a = drain(&mut r);
    assert!(matches!(
        a.as_slice(),
        [RecoveryAction::ChooseReplacements(req)] if req.failed == ids(&["b3"]) && req.first_entry_id == 0
    ));
    r.replacements_chosen(vec![Replacement {
        old: "b3".into(),
        new: "b4".into(),
    }]);
    let a = drain(&mut r);
    assert!(a.contains(&RecoveryAction::SendAdd {
        bookie: "b4".into(),
        entry_id: 0,
        body: entry(0, -1, 1)
    }));
    for b in ["b1", "b2"] {
        r.read_response(b, 1, BookieStatus::NoLedger, None);
    }
    r.add_response("b1", 0, BookieStatus::Ok);
    r.add_response("b4", 0, BookieStatus::Ok);
    let a = drain(&mut r);
    let op = match a.as_slice() {
        [RecoveryAction::UpdateMetadata(op)] => op.clone(),
        other => panic!("{other:?}"),
    };
    let MetadataOp::Close {
        ensemble_changes, ..
    } = &op
    else {
        panic!("{op:?}")
    };
    assert_eq!(ensemble_changes.len(), 1);
    assert_eq!(ensemble_changes[0].first_entry_id, 0);
}
