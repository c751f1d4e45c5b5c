//! Writer behaviour, driven by hand: ordered completion, ensemble change
//! (BookKeeper #4651), degraded writing, fencing, backpressure, timers.

use std::collections::HashMap;

use super::*;
use crate::client::metadata::{NewLedger, Update, new_ledger};
use crate::client::quorum::QuorumSpec;

fn ids(v: &[&str]) -> Vec<BookieId> {
    v.iter().map(|s| s.to_string()).collect()
}

fn ledger(e: usize, qw: usize, qa: usize, bookies: &[&str]) -> LedgerMetadata {
    new_ledger(NewLedger {
        ledger_id: 7,
        quorum: QuorumSpec::new(e, qw, qa).unwrap(),
        ensemble: ids(bookies),
        password: Bytes::from_static(b"pw"),
        custom: HashMap::new(),
        ctime_ms: 0,
    })
    .unwrap()
}

fn writer(e: usize, qw: usize, qa: usize, bookies: &[&str]) -> Writer {
    Writer::new(
        ledger(e, qw, qa, bookies),
        WriterConfig {
            explicit_lac_interval_ms: 0,
            ..WriterConfig::default()
        },
    )
    .unwrap()
}

fn drain(w: &mut Writer) -> Vec<WriterAction> {
    std::iter::from_fn(|| w.poll_action()).collect()
}

fn completed(actions: &[WriterAction]) -> Vec<EntryId> {
    actions
        .iter()
        .filter_map(|a| match a {
            WriterAction::Completed { entry_id, .. } => Some(*entry_id),
            _ => None,
        })
        .collect()
}

fn sends(actions: &[WriterAction]) -> Vec<(String, EntryId)> {
    actions
        .iter()
        .filter_map(|a| match a {
            WriterAction::SendAdd {
                bookie, entry_id, ..
            } => Some((bookie.clone(), *entry_id)),
            _ => None,
        })
        .collect()
}

/// Runs an ensemble change with placement choosing `new` for the failed bookie,
/// applying the CAS to the writer's own metadata view.
fn replace(w: &mut Writer, actions: &[WriterAction], new: &str) -> Vec<WriterAction> {
    let req = actions
        .iter()
        .find_map(|a| match a {
            WriterAction::ChooseReplacements(r) => Some(r.clone()),
            _ => None,
        })
        .expect("an ensemble change request");
    w.replacements_chosen(vec![Replacement {
        old: req.failed[0].clone(),
        new: new.into(),
    }]);
    let op = match drain(w).as_slice() {
        [WriterAction::UpdateMetadata(op)] => op.clone(),
        other => panic!("expected one metadata update, got {other:?}"),
    };
    let md = match op.apply(w.metadata()).unwrap() {
        Update::Write(md) => md,
        Update::Unchanged => w.metadata().clone(),
    };
    w.metadata_result(Ok(md));
    drain(w)
}

#[test]
fn entries_complete_in_order_only_after_an_ack_quorum_of_their_write_set() {
    let mut w = writer(3, 3, 2, &["b1", "b2", "b3"]);
    assert_eq!(w.add(b"a").unwrap(), 0);
    assert_eq!(w.add(b"bb").unwrap(), 1);
    let a = drain(&mut w);
    assert_eq!(sends(&a).len(), 6);
    // Entry 1 reaches Qa first: nothing completes before entry 0 does.
    w.add_response("b1", 1, BookieStatus::Ok);
    w.add_response("b2", 1, BookieStatus::Ok);
    assert!(completed(&drain(&mut w)).is_empty());
    w.add_response("b3", 0, BookieStatus::Ok);
    assert!(completed(&drain(&mut w)).is_empty(), "Qa-1 acks");
    // A duplicate ack from the same bookie is not a second ack.
    w.add_response("b3", 0, BookieStatus::Ok);
    assert!(completed(&drain(&mut w)).is_empty());
    w.add_response("b1", 0, BookieStatus::Ok);
    let a = drain(&mut w);
    assert_eq!(completed(&a), vec![0, 1]);
    assert!(a.contains(&WriterAction::Completed {
        entry_id: 1,
        length: 3
    }));
    assert_eq!(w.lac(), 1);
    assert_eq!(w.length(), 3);
}

#[test]
fn entries_carry_piggybacked_lac_and_cumulative_length() {
    let mut w = writer(2, 2, 1, &["b1", "b2"]);
    w.add(b"xyz").unwrap();
    drain(&mut w);
    w.add_response("b1", 0, BookieStatus::Ok);
    drain(&mut w);
    w.add(b"12345").unwrap();
    let a = drain(&mut w);
    let body = a
        .iter()
        .find_map(|x| match x {
            WriterAction::SendAdd { body, .. } => Some(body.clone()),
            _ => None,
        })
        .unwrap();
    let e = Entry::decode_expected(body, 7, 1).unwrap();
    assert_eq!(e.header.lac, 0);
    assert_eq!(e.header.length, 8);
    assert_eq!(&e.payload[..], b"12345");
}

#[test]
fn writes_stripe_over_the_ensemble() {
    let mut w = writer(4, 2, 2, &["b1", "b2", "b3", "b4"]);
    for _ in 0..4 {
        w.add(b"x").unwrap();
    }
    let s = sends(&drain(&mut w));
    assert_eq!(
        s,
        vec![
            ("b1".into(), 0),
            ("b2".into(), 0),
            ("b2".into(), 1),
            ("b3".into(), 1),
            ("b3".into(), 2),
            ("b4".into(), 2),
            ("b4".into(), 3),
            ("b1".into(), 3),
        ]
    );
}

#[test]
fn adds_beyond_the_outstanding_bounds_are_pushed_back() {
    let mut w = Writer::new(
        ledger(3, 3, 2, &["b1", "b2", "b3"]),
        WriterConfig {
            outstanding_adds_max: 2,
            outstanding_bytes_max: 10,
            entry_payload_bytes_max: 8,
            ..WriterConfig::default()
        },
    )
    .unwrap();
    assert_eq!(w.add(&[0; 9]), Err(AddError::TooLarge { bytes: 9, max: 8 }));
    w.add(&[0; 6]).unwrap();
    assert_eq!(
        w.add(&[0; 5]),
        Err(AddError::Backpressure {
            outstanding_adds: 1,
            outstanding_bytes: 6
        })
    );
    w.add(&[0; 4]).unwrap();
    assert!(matches!(w.add(&[]), Err(AddError::Backpressure { .. })));
    drain(&mut w);
    for b in ["b1", "b2"] {
        w.add_response(b, 0, BookieStatus::Ok);
    }
    assert_eq!(completed(&drain(&mut w)), vec![0]);
    assert_eq!(w.add(&[0; 5]).unwrap(), 2, "room again after a completion");
}

#[test]
fn a_failed_bookie_is_replaced_from_the_first_uncompleted_entry_and_pending_entries_resent() {
    let mut w = writer(3, 3, 2, &["b1", "b2", "b3"]);
    for _ in 0..3 {
        w.add(b"x").unwrap();
    }
    drain(&mut w);
    for b in ["b1", "b2"] {
        w.add_response(b, 0, BookieStatus::Ok);
    }
    assert_eq!(completed(&drain(&mut w)), vec![0]);
    w.add_response("b2", 1, BookieStatus::Error);
    let a = drain(&mut w);
    assert_eq!(
        a,
        vec![WriterAction::ChooseReplacements(EnsembleChangeRequest {
            first_entry_id: 1,
            ensemble: ids(&["b1", "b2", "b3"]),
            failed: ids(&["b2"]),
        })]
    );
    let a = replace(&mut w, &a, "b4");
    assert_eq!(sends(&a), vec![("b4".into(), 1), ("b4".into(), 2)]);
    let md = w.metadata();
    assert_eq!(md.segments.len(), 2);
    assert_eq!(md.segments[1].first_entry_id, 1);
    assert_eq!(md.segments[1].ensemble, ids(&["b1", "b4", "b3"]));
    for b in ["b1", "b4"] {
        w.add_response(b, 1, BookieStatus::Ok);
        w.add_response(b, 2, BookieStatus::Ok);
    }
    assert_eq!(completed(&drain(&mut w)), vec![1, 2]);
}

#[test]
fn acks_of_a_replaced_bookie_stop_counting_from_the_new_segment_bk4651() {
    let mut w = writer(3, 3, 2, &["b1", "b2", "b3"]);
    w.add(b"x").unwrap();
    w.add(b"y").unwrap();
    drain(&mut w);
    // b1 acks entry 0, then fails on entry 1: the change starts at entry 0.
    w.add_response("b1", 0, BookieStatus::Ok);
    w.add_response("b1", 1, BookieStatus::Timeout);
    let a = drain(&mut w);
    // While the change is in flight b1's ack no longer counts: b2 alone is Qa-1.
    w.add_response("b2", 0, BookieStatus::Ok);
    assert!(completed(&drain(&mut w)).is_empty());
    let a = replace(&mut w, &a, "b4");
    assert_eq!(w.metadata().segments.len(), 1, "same first entry: replaced");
    assert!(completed(&a).is_empty(), "b1's ack must not count: {a:?}");
    // A late ack from b1 is ignored too.
    w.add_response("b1", 0, BookieStatus::Ok);
    assert!(completed(&drain(&mut w)).is_empty());
    w.add_response("b4", 0, BookieStatus::Ok);
    assert_eq!(completed(&drain(&mut w)), vec![0]);
}

#[test]
fn without_a_replacement_writing_goes_on_while_qa_can_be_met_then_fails() {
    let mut w = writer(3, 3, 2, &["b1", "b2", "b3"]);
    w.add(b"x").unwrap();
    drain(&mut w);
    w.bookie_failed("b3");
    assert!(matches!(
        drain(&mut w).as_slice(),
        [WriterAction::ChooseReplacements(_)]
    ));
    w.replacements_chosen(vec![]);
    assert_eq!(
        drain(&mut w),
        vec![WriterAction::UnderReplicated {
            bookies: ids(&["b3"])
        }]
    );
    for b in ["b1", "b2"] {
        w.add_response(b, 0, BookieStatus::Ok);
    }
    assert_eq!(completed(&drain(&mut w)), vec![0]);
    w.add(b"y").unwrap();
    assert_eq!(
        sends(&drain(&mut w)),
        vec![("b2".into(), 1), ("b1".into(), 1)],
        "no send to the failed bookie"
    );
    w.add_response("b2", 1, BookieStatus::Error);
    assert!(matches!(
        drain(&mut w).as_slice(),
        [WriterAction::ChooseReplacements(_)]
    ));
    w.replacements_chosen(vec![]);
    assert_eq!(
        drain(&mut w),
        vec![WriterAction::Failed {
            error: WriterError::NotEnoughBookies,
            first_entry_id: 1,
            last_entry_id: 1
        }]
    );
    assert_eq!(
        w.add(b"z"),
        Err(AddError::Failed(WriterError::NotEnoughBookies))
    );
}

#[test]
fn a_fenced_answer_fails_every_outstanding_add_and_nothing_completes_after() {
    let mut w = writer(3, 3, 2, &["b1", "b2", "b3"]);
    w.add(b"x").unwrap();
    w.add(b"y").unwrap();
    drain(&mut w);
    w.add_response("b1", 0, BookieStatus::Ok);
    w.add_response("b2", 0, BookieStatus::Fenced);
    assert_eq!(
        drain(&mut w),
        vec![WriterAction::Failed {
            error: WriterError::Fenced,
            first_entry_id: 0,
            last_entry_id: 1
        }]
    );
    for b in ["b1", "b2", "b3"] {
        w.add_response(b, 0, BookieStatus::Ok);
        w.add_response(b, 1, BookieStatus::Ok);
    }
    assert!(drain(&mut w).is_empty(), "a fenced writer never acks again");
    assert_eq!(w.add(b"z"), Err(AddError::Failed(WriterError::Fenced)));
    assert_eq!(w.error(), Some(&WriterError::Fenced));
}

#[test]
fn an_ensemble_change_cas_finding_the_ledger_in_recovery_fails_the_writer_as_fenced() {
    let mut w = writer(3, 3, 2, &["b1", "b2", "b3"]);
    w.add(b"x").unwrap();
    drain(&mut w);
    w.bookie_failed("b1");
    drain(&mut w);
    w.replacements_chosen(vec![Replacement {
        old: "b1".into(),
        new: "b4".into(),
    }]);
    let op = match drain(&mut w).as_slice() {
        [WriterAction::UpdateMetadata(op)] => op.clone(),
        other => panic!("{other:?}"),
    };
    // Meanwhile a recovery marked the ledger: the modify step refuses.
    let mut fenced = w.metadata().clone();
    fenced.status = LedgerStatus::LedgerInRecovery as i32;
    let err = op.apply(&fenced).unwrap_err();
    w.metadata_result(Err(err));
    assert!(matches!(
        drain(&mut w).as_slice(),
        [WriterAction::Failed {
            error: WriterError::Fenced,
            ..
        }]
    ));
}

#[test]
fn an_unanswered_add_times_out_its_bookie_into_an_ensemble_change() {
    let mut w = Writer::new(
        ledger(3, 3, 2, &["b1", "b2", "b3"]),
        WriterConfig {
            add_timeout_ms: 100,
            explicit_lac_interval_ms: 0,
            ..WriterConfig::default()
        },
    )
    .unwrap();
    w.tick(1000);
    w.add(b"x").unwrap();
    drain(&mut w);
    w.add_response("b1", 0, BookieStatus::Ok);
    w.add_response("b2", 0, BookieStatus::Ok);
    assert_eq!(completed(&drain(&mut w)), vec![0]);
    w.add(b"y").unwrap();
    drain(&mut w);
    w.add_response("b1", 1, BookieStatus::Ok);
    w.add_response("b3", 1, BookieStatus::Ok);
    drain(&mut w);
    w.add(b"z").unwrap();
    drain(&mut w);
    w.add_response("b1", 2, BookieStatus::Ok);
    w.tick(1099);
    assert!(drain(&mut w).is_empty());
    w.tick(1100);
    let a = drain(&mut w);
    // b2 and b3 each still owe an answer (for entry 1 b2, for entry 2 both);
    // b2 is the first found late, b3 follows after the first change.
    assert!(
        matches!(a.as_slice(), [WriterAction::ChooseReplacements(r)] if r.first_entry_id == 2),
        "{a:?}"
    );
}

#[test]
fn an_idle_writer_sends_its_lac_explicitly_once_per_change() {
    let mut w = Writer::new(
        ledger(3, 2, 2, &["b1", "b2", "b3"]),
        WriterConfig {
            explicit_lac_interval_ms: 50,
            ..WriterConfig::default()
        },
    )
    .unwrap();
    w.tick(10);
    w.add(b"x").unwrap();
    drain(&mut w);
    w.add_response("b1", 0, BookieStatus::Ok);
    w.add_response("b2", 0, BookieStatus::Ok);
    drain(&mut w);
    w.tick(40);
    assert!(drain(&mut w).is_empty(), "not idle long enough");
    w.tick(60);
    let a = drain(&mut w);
    let lacs: Vec<_> = a
        .iter()
        .filter_map(|x| match x {
            WriterAction::SendWriteLac { bookie, lac, body } => {
                assert_eq!(crate::client::lac::decode_explicit_lac(7, body), Ok(0));
                Some((bookie.clone(), *lac))
            }
            _ => None,
        })
        .collect();
    assert_eq!(lacs.len(), 3, "{a:?}");
    w.tick(500);
    assert!(drain(&mut w).is_empty(), "LAC unchanged: not sent again");
}

#[test]
fn close_waits_for_outstanding_adds_then_closes_at_the_lac() {
    let mut w = writer(3, 3, 2, &["b1", "b2", "b3"]);
    w.add(b"abc").unwrap();
    drain(&mut w);
    w.close();
    assert!(drain(&mut w).is_empty());
    assert_eq!(w.add(b"x"), Err(AddError::Closing));
    w.add_response("b1", 0, BookieStatus::Ok);
    w.add_response("b3", 0, BookieStatus::Ok);
    let a = drain(&mut w);
    let op = match a.as_slice() {
        [
            WriterAction::Completed { entry_id: 0, .. },
            WriterAction::UpdateMetadata(op),
        ] => op.clone(),
        other => panic!("{other:?}"),
    };
    let Update::Write(md) = op.apply(w.metadata()).unwrap() else {
        panic!("expected a write")
    };
    assert_eq!((md.last_entry_id, md.length), (0, 3));
    w.metadata_result(Ok(md));
    assert_eq!(
        drain(&mut w),
        vec![WriterAction::Closed {
            last_entry_id: 0,
            length: 3
        }]
    );
    assert!(w.is_closed());
}

#[test]
fn a_writer_needs_an_open_empty_ledger() {
    let mut md = ledger(3, 3, 2, &["b1", "b2", "b3"]);
    md.status = LedgerStatus::LedgerClosed as i32;
    assert_eq!(
        Writer::new(md, WriterConfig::default()).unwrap_err(),
        WriterError::NotWritable
    );
}
