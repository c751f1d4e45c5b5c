//! Simulation runs: scripted BookKeeper bug shapes (#2614, #2615), thousands of
//! random seeds, and proof that the checker catches a real bug.

use std::time::Instant;

use bytes::Bytes;

use super::world::{Addr, LEDGER_ID, Msg, Rule, RuleAction};
use super::{SimConfig, World};
use crate::client::EntryId;
use crate::client::master_key::master_key;
use crate::client::metadata::{NewLedger, new_ledger};
use crate::client::quorum::QuorumSpec;
use crate::entry::{Entry, EntryHeader};
use crate::proto::metadata::Segment;

/// Seeds run by default (CI); `CMS_SIM_SEEDS` runs more.
const DEFAULT_SEEDS: u64 = 10_000;

fn run_seed(seed: u64, fence_reads: bool) -> (Result<(), String>, String) {
    let (r, summary, _) = run_seed_stats(seed, fence_reads, false);
    (r, summary)
}

/// What a run exercised, summed over seeds to show the runs are not vacuous.
#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    acked_entries: u64,
    runs_with_acks: u64,
    writer_fenced_or_failed: u64,
    ensemble_changes: u64,
    under_replicated: u64,
    recovered_entries_beyond_acked: u64,
    concurrent_recoveries: u64,
    recovery_retries: u64,
    reader_reads: u64,
    events: u64,
}

fn run_seed_stats(
    seed: u64,
    fence_reads: bool,
    lost_fence_shape: bool,
) -> (Result<(), String>, String, Coverage) {
    let mut cfg = SimConfig::random(seed);
    cfg.fence_reads = fence_reads;
    if lost_fence_shape {
        // Bias towards #2614: a live writer, one bookie whose fences are lost
        // and whose adds arrive late.
        cfg.writer_dies_ms = None;
        let b = (seed % cfg.ensemble as u64) as usize;
        cfg.slow_fence = Some((b, None));
        cfg.slow_adds = Some((b, 50 + seed % 200));
    }
    let mut w = World::new(cfg);
    let r = w.run();
    let h = &w.history;
    let acked = h.acked.len() as u64;
    let cov = Coverage {
        acked_entries: acked,
        runs_with_acks: u64::from(acked > 0),
        writer_fenced_or_failed: u64::from(h.writer_failed_at.is_some()),
        ensemble_changes: h.ensemble_changes as u64,
        under_replicated: h.under_replicated as u64,
        recovered_entries_beyond_acked: (w.meta.0.last_entry_id + 1).max(0) as u64
            - acked.min((w.meta.0.last_entry_id + 1).max(0) as u64),
        concurrent_recoveries: u64::from(w.cfg.recoveries.len() > 1),
        recovery_retries: h.recoveries.iter().filter(|r| r.is_err()).count() as u64,
        reader_reads: h.reads.len() as u64,
        events: w.events_run,
    };
    (r, w.summary(), cov)
}

fn scripted(fence_reads: bool) -> SimConfig {
    let mut cfg = SimConfig::random(0);
    cfg.ensemble = 3;
    cfg.write_quorum = 3;
    cfg.ack_quorum = 2;
    cfg.bookies = 3;
    cfg.entries = 1;
    cfg.latency_ms = (1, 1);
    cfg.drop_per_mille = 0;
    cfg.heal_ms = 0;
    cfg.crashes = vec![];
    cfg.writer_dies_ms = None;
    cfg.slow_fence = None;
    cfg.slow_adds = None;
    cfg.writer_closes = false;
    cfg.recoveries = vec![10];
    cfg.readers = 0;
    cfg.fence_reads = fence_reads;
    cfg.add_timeout_ms = 10_000;
    cfg.read_timeout_ms = 1_000;
    cfg
}

fn rule(f: impl Fn(Addr, Addr, &Msg) -> bool + 'static, action: RuleAction) -> Rule {
    Rule {
        matches: Box::new(f),
        action,
        until_ms: u64::MAX,
    }
}

/// BookKeeper #2614 (RELIABILITY P0-2), by construction: Qw3/Qa2; the old
/// writer's entry 0 reached b0 only (Qa − 1), its copy to b2 is in flight and
/// the one to b1 lost; recovery's fence to b2 is lost, and b0 answers reads
/// slowly. b1 and b2 answer "no entry" (two = Qw − Qa + 1) and recovery closes
/// the ledger empty; then the writer's copy lands on b2.
fn bk2614_world(fence_reads: bool) -> World {
    let mut w = World::new(scripted(fence_reads));
    w.rules.push(rule(
        |from, to, m| from == Addr::Writer && to == Addr::Bookie(1) && matches!(m, Msg::Add { .. }),
        RuleAction::Drop,
    ));
    w.rules.push(rule(
        |from, to, m| from == Addr::Writer && to == Addr::Bookie(2) && matches!(m, Msg::Add { .. }),
        RuleAction::DelayMs(300),
    ));
    w.rules.push(rule(
        |_, to, m| to == Addr::Bookie(2) && matches!(m, Msg::Fence { .. }),
        RuleAction::Drop,
    ));
    w.rules.push(rule(
        |_, to, m| to == Addr::Bookie(0) && matches!(m, Msg::Read { .. }),
        RuleAction::DelayMs(500),
    ));
    w
}

#[test]
fn bk2614_a_lost_fence_with_the_writer_at_qa_minus_one_never_truncates_an_ack() {
    let mut w = bk2614_world(true);
    let r = w.run();
    assert_eq!(r, Ok(()), "{}", w.summary());
    assert_eq!(w.meta.0.last_entry_id, -1, "recovery proved entry 0 absent");
    assert!(
        w.history.acked.is_empty(),
        "the late copy was refused: {}",
        w.summary()
    );
    assert!(
        w.history.writer_failed_at.is_some(),
        "the writer learnt it was fenced"
    );
}

#[test]
fn bk2614_is_caught_by_the_checker_when_recovery_reads_do_not_fence() {
    let mut w = bk2614_world(false);
    let r = w.run();
    let err = r.expect_err("without fencing reads the ack must be truncated");
    assert!(err.contains("truncated"), "{err}");
}

/// Builds the BookKeeper #2615 state by hand: segment 0 = b0 b1 b2 holds
/// entries 0..=4 (acked); segment 5 = b3 b4 b5; the writer died right after
/// the ensemble change. `entry5_on_b3`: entry 5 reached b3 only.
fn bk2615_world(ack_quorum: usize, entry5_on_b3: bool, down: &[usize]) -> World {
    let mut cfg = scripted(true);
    cfg.ack_quorum = ack_quorum;
    cfg.bookies = 7;
    cfg.entries = 6;
    cfg.recoveries = vec![0];
    cfg.add_timeout_ms = 40;
    cfg.read_timeout_ms = 40;
    let mut w = World::bare(cfg);
    let mut md = new_ledger(NewLedger {
        ledger_id: LEDGER_ID,
        quorum: QuorumSpec::new(3, 3, ack_quorum).unwrap(),
        ensemble: vec!["b0".into(), "b1".into(), "b2".into()],
        password: Bytes::from_static(b"sim"),
        custom: Default::default(),
        ctime_ms: 0,
    })
    .unwrap();
    md.segments.push(Segment {
        first_entry_id: 5,
        ensemble: vec!["b3".into(), "b4".into(), "b5".into()],
    });
    w.meta = (md, 1);
    let key = master_key(b"sim");
    let mut length = 0;
    for e in 0..6 {
        let payload = Bytes::from(format!("entry-{e}"));
        length += payload.len() as u64;
        let body = Entry::encode(
            EntryHeader {
                ledger_id: LEDGER_ID,
                entry_id: e,
                lac: e - 1,
                length,
            },
            &payload,
        );
        w.history.payloads.push(payload);
        let holders: &[usize] = match (e, entry5_on_b3) {
            (0..=4, _) => &[0, 1, 2],
            (_, true) => &[3],
            (_, false) => &[],
        };
        for &b in holders {
            let st = &mut w.bookies[b].durable;
            st.known = true;
            st.master_key = Some(key.clone());
            st.entries.insert(e, body.clone());
        }
        if e <= 4 {
            w.history.acked.push((e as EntryId, 0));
        }
    }
    for b in &mut w.bookies {
        b.visible = b.durable.clone();
    }
    for &b in down {
        w.bookies[b].crash();
    }
    w.schedule_common();
    w
}

#[test]
fn bk2615_recovery_with_an_empty_last_segment_never_rereads_the_old_one() {
    // The last segment reports LAC -1; b2 of the old segment is down, so a
    // write-back into the old segment would need an ensemble change below the
    // last key. With the clamp, recovery starts at 4 and closes at 4.
    let mut w = bk2615_world(2, false, &[2]);
    let r = w.run();
    assert_eq!(r, Ok(()), "{}", w.summary());
    assert_eq!(w.meta.0.last_entry_id, 4);
    assert_eq!(w.meta.0.segments.len(), 2, "no invalid segment");
    assert!(
        w.history.recovery_reads.iter().all(|e| *e >= 4),
        "reads below the clamp: {:?}",
        w.history.recovery_reads
    );
}

#[test]
fn bk2615_an_ensemble_change_during_recovery_replaces_the_last_segment() {
    // Qa = Qw = 3; entry 5 is on b3 only and b4 is down: the write-back of
    // entry 5 needs a replacement for b4, proposed at entry 5 (the last
    // segment's first entry, so it replaces that segment) and published with
    // the close.
    let mut w = bk2615_world(3, true, &[4]);
    let r = w.run();
    assert_eq!(r, Ok(()), "{}", w.summary());
    let md = &w.meta.0;
    assert_eq!(md.last_entry_id, 5);
    assert_eq!(md.segments.len(), 2, "replaced, not appended below");
    assert_eq!(md.segments[1].first_entry_id, 5);
    assert!(!md.segments[1].ensemble.contains(&"b4".to_string()));
    assert!(w.history.recovery_reads.iter().all(|e| *e >= 4));
}

#[test]
fn one_seed_replays_the_same_run() {
    for seed in [1, 77, 4242] {
        let (r1, s1) = run_seed(seed, true);
        let (r2, s2) = run_seed(seed, true);
        assert_eq!((r1, s1), (r2, s2));
    }
}

/// Replays one seed with a message trace: `CMS_SIM_SEED=n CMS_SIM_TRACE=1`.
#[test]
fn replay_one_seed_from_env() {
    let Some(seed) = std::env::var("CMS_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    else {
        return;
    };
    let fence = std::env::var("CMS_SIM_NO_READ_FENCE").is_err();
    let (r, summary) = run_seed(seed, fence);
    eprintln!("{summary}\n{r:?}");
    assert_eq!(r, Ok(()));
}

fn seeds_from_env() -> u64 {
    std::env::var("CMS_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SEEDS)
}

#[test]
fn random_seeds_never_lose_an_acked_entry() {
    let seeds = seeds_from_env();
    let threads = 2;
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                let mut runs = 0u64;
                let mut cov = Coverage::default();
                let mut seed = t;
                while seed < seeds {
                    let (r, summary, c) = run_seed_stats(seed, true, false);
                    runs += 1;
                    cov.acked_entries += c.acked_entries;
                    cov.runs_with_acks += c.runs_with_acks;
                    cov.writer_fenced_or_failed += c.writer_fenced_or_failed;
                    cov.ensemble_changes += c.ensemble_changes;
                    cov.under_replicated += c.under_replicated;
                    cov.recovered_entries_beyond_acked += c.recovered_entries_beyond_acked;
                    cov.concurrent_recoveries += c.concurrent_recoveries;
                    cov.recovery_retries += c.recovery_retries;
                    cov.reader_reads += c.reader_reads;
                    cov.events += c.events;
                    if let Err(e) = r {
                        failures.push(format!("seed {seed}: {e}\n    {summary}"));
                    }
                    seed += threads;
                }
                (failures, runs, cov)
            })
        })
        .collect();
    let mut failures = Vec::new();
    let mut runs = 0;
    let mut total = Coverage::default();
    for h in handles {
        let (f, n, c) = h.join().unwrap();
        runs += n;
        failures.extend(f);
        total.acked_entries += c.acked_entries;
        total.runs_with_acks += c.runs_with_acks;
        total.writer_fenced_or_failed += c.writer_fenced_or_failed;
        total.ensemble_changes += c.ensemble_changes;
        total.under_replicated += c.under_replicated;
        total.recovered_entries_beyond_acked += c.recovered_entries_beyond_acked;
        total.concurrent_recoveries += c.concurrent_recoveries;
        total.recovery_retries += c.recovery_retries;
        total.reader_reads += c.reader_reads;
        total.events += c.events;
    }
    eprintln!(
        "simulation: {runs} seeds in {:.1} s; {total:?}",
        started.elapsed().as_secs_f64()
    );
    // The runs must exercise the protocol, not just pass.
    assert!(runs < 1000 || total.runs_with_acks * 2 > runs, "{total:?}");
    assert!(
        runs < 1000 || total.ensemble_changes > 0 && total.writer_fenced_or_failed > 0,
        "{total:?}"
    );
    assert!(
        runs < 1000 || total.recovered_entries_beyond_acked > 0 && total.reader_reads > 0,
        "{total:?}"
    );
    assert!(
        failures.is_empty(),
        "{} of {runs} seeds failed (rerun one with World::new(SimConfig::random(seed))):\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}

#[test]
fn random_seeds_find_a_loss_when_recovery_reads_do_not_fence() {
    let started = Instant::now();
    let found = (0..20_000u64).find(|seed| run_seed_stats(*seed, false, true).0.is_err());
    let Some(seed) = found else {
        panic!("no seed found the #2614 loss: the checker or the scenarios are vacuous");
    };
    let (r, summary, _) = run_seed_stats(seed, false, true);
    eprintln!(
        "without fencing reads seed {seed} fails after {:.1} s: {:?}\n    {summary}",
        started.elapsed().as_secs_f64(),
        r
    );
    assert!(
        run_seed_stats(seed, true, true).0.is_ok(),
        "the same seed passes with the fix"
    );
}
