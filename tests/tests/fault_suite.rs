//! The fault suite (RELIABILITY.md, issue 16): each case starts a full
//! cluster — ZooKeeper, four bookies, two brokers in cluster mode
//! (E/Qw/Qa 3/3/2, de-duplication on) — runs produce-and-consume load through
//! the Rust SDK (`cms_tests::faults::Workload`), injects its fault, heals,
//! drains and judges the recorded history with the history checker (every
//! acked message delivered, no unexplained duplicate, no reorder in the
//! Exclusive subscriptions, no phantom, no divergence).
//!
//! Knobs: `CMS_FAULT_MINUTES` (kill storm and lossy soak; CI 3 and 2),
//! `CMS_TEST_LONG=1` (60 minutes each), `CMS_FAULT_SEED` (replays the storm's
//! and the proxies' random choices; every run prints its seed).
//! `scripts/fault-suite [--minutes N]` runs the whole binary.

use std::time::{Duration, Instant};

use cms_bookie::autorecovery::plan::bookies_named;
use cms_bookie::bookie_client::read_status;
use cms_bookie::client::metadata::{quorum_spec, write_set_bookies};
use cms_bookie::entry::Entry;
use cms_bookie::proto::bookie::StatusCode;
use cms_tests::chaos::{DirectionFaults, Faults};
use cms_tests::cluster::{ledger_client, ledger_client_options};
use cms_tests::faults::{
    ClusterOptions, FaultCluster, ProcStats, Workload, WorkloadOptions, fault_duration, fault_seed,
};
use cms_tests::harness::wait::eventually;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Bound on the drain after the faults heal.
const DRAIN: Duration = Duration::from_secs(120);

/// Bound on the longest time any topic may go without an acked send while
/// faults are injected ("no lasting stall"): a broker's session timeout
/// (4 s), bundle hand-over, ledger recovery and client backoff fit well inside.
const STALL_MAX: Duration = Duration::from_secs(60);

fn options(tag: &str) -> WorkloadOptions {
    WorkloadOptions {
        tag: tag.to_string(),
        ..WorkloadOptions::default()
    }
}

/// Finishes `w`, checks its history (plus `extra` subscriptions required
/// complete) and prints the summary; panics with the report on a violation.
async fn finish_and_check(
    case: &str,
    w: &mut Workload,
    c: &FaultCluster,
    extra_complete: &[&str],
) -> cms_tests::faults::WorkloadSummary {
    let summary = w.finish(DRAIN).await;
    let mut opts = w.check_options();
    for sub in extra_complete {
        for t in &w.topics {
            opts = opts.require_complete(t.clone(), *sub);
        }
    }
    let report = w.history.check(&opts);
    println!("{case}: {summary}\n{report}");
    assert!(
        report.is_ok(),
        "{case}: the history checker found violations:\n{report}\n{}",
        c.log_tails(30)
    );
    assert!(summary.sends_acked > 0, "{case}: nothing was acked");
    summary
}

async fn wait_exited(node: &mut cms_tests::cluster::BookieNode, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while node.process.try_exit_status().is_none() {
        assert!(Instant::now() < deadline, "{what}: {} did not die", node.id);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET /admin/readonly` of a bookie: its `readonly` flag.
async fn bookie_read_only(node: &cms_tests::cluster::BookieNode) -> Option<bool> {
    let body: serde_json::Value = cms_tests::harness::http::client()
        .get(format!("http://{}/admin/readonly", node.http()))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    body["readonly"].as_bool()
}

/// RELIABILITY P0-3: a power cut (the fault-injecting storage drops every
/// write not yet fsynced, then the process aborts) of one bookie, then of two
/// at once, under load; after restart and recovery every acked message is
/// delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_of_bookies_under_load_loses_no_acked_message() {
    let mut c = FaultCluster::start(ClusterOptions {
        fault_injection: true,
        ..ClusterOptions::default()
    })
    .await;
    let mut w = Workload::start(&c.service_url(), options("p03")).await;
    w.wait_for_acks(300, 60_000).await;
    w.reset_stall_clock();

    w.fault("power cut of b1");
    let _ = c.bookies[0].post("/test/power-cut").await;
    wait_exited(&mut c.bookies[0], "power cut").await;
    w.fault("b1 is off");
    w.wait_for_acks(200, 90_000).await;
    c.bookies[0].process.restart().await;
    c.bookies[0].wait_ready().await;
    w.wait_for_acks(200, 90_000).await;

    w.fault("power cut of b2 and b3 at once");
    let (_, _) = tokio::join!(
        c.bookies[1].post("/test/power-cut"),
        c.bookies[2].post("/test/power-cut")
    );
    wait_exited(&mut c.bookies[1], "power cut").await;
    wait_exited(&mut c.bookies[2], "power cut").await;
    w.fault("b2 and b3 are off");
    for b in &mut c.bookies[1..3] {
        b.process.restart().await;
        b.wait_ready().await;
    }
    w.wait_for_acks(300, 120_000).await;
    let stall = w.longest_stall();
    let summary = finish_and_check("P0-3", &mut w, &c, &[]).await;
    println!("P0-3: longest stall {:.1} s", stall.as_secs_f64());
    assert!(summary.undelivered == 0);
}

/// RELIABILITY P0-10: one injected fsync failure on a bookie under load:
/// nothing of the failed batch is acknowledged (the history has no lost
/// acked message), the bookie turns read-only for good, and writes go on
/// through the other bookies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_error_acks_nothing_of_its_batch_and_the_bookie_stops_taking_writes() {
    let c = FaultCluster::start(ClusterOptions {
        fault_injection: true,
        ..ClusterOptions::default()
    })
    .await;
    let mut w = Workload::start(&c.service_url(), options("p10")).await;
    w.wait_for_acks(300, 60_000).await;
    w.reset_stall_clock();
    assert_eq!(bookie_read_only(&c.bookies[0]).await, Some(false));
    w.fault("fsync error on b1");
    assert_eq!(c.bookies[0].post("/test/fail-next-sync").await, Some(200));
    eventually("b1 turns read-only after its fsync error", 30_000, || {
        let b = &c.bookies[0];
        async move { bookie_read_only(b).await == Some(true) }
    })
    .await;
    w.wait_for_acks(400, 120_000).await;
    assert_eq!(
        bookie_read_only(&c.bookies[0]).await,
        Some(true),
        "b1 must stay read-only (no retry-and-trust)"
    );
    // Nothing new was written to b1 after the failure: new ledgers avoid it
    // and the broker's writers replaced it in their ensembles.
    finish_and_check("P0-10", &mut w, &c, &[]).await;
    println!(
        "P0-10: longest stall {:.1} s",
        w.longest_stall().as_secs_f64()
    );
}

/// Flips bytes in the middle of every entry log file under `dir`; returns
/// how many files were changed.
fn flip_entry_log_bytes(dir: &std::path::Path) -> usize {
    let mut changed = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if !name.ends_with(".log") {
                continue;
            }
            let mut bytes = std::fs::read(&p).unwrap_or_default();
            if bytes.len() < 4096 {
                continue;
            }
            // Every 512th byte of the middle half: several entries each.
            let (from, to) = (bytes.len() / 4, bytes.len() * 3 / 4);
            for i in (from..to).step_by(512) {
                bytes[i] ^= 0x5a;
            }
            std::fs::write(&p, &bytes).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
            changed += 1;
        }
    }
    changed
}

/// Tears the newest journal file under `dir` mid-record: the last 7
/// written (non-zero) bytes of its last record are zeroed, as a write cut
/// off by a crash leaves a pre-allocated file. Returns the file.
fn tear_journal_tail(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().and_then(|x| x.to_str()) == Some("jnl") {
                files.push(p);
            }
        }
    }
    files.sort_by_key(|p| p.file_name().map(|n| n.to_os_string()));
    let last = files.pop()?;
    let mut bytes = std::fs::read(&last).ok()?;
    let end = bytes.iter().rposition(|b| *b != 0)?;
    for b in &mut bytes[end.saturating_sub(6)..=end] {
        *b = 0;
    }
    std::fs::write(&last, &bytes).ok()?;
    Some(last)
}

/// RELIABILITY P0-8: a bookie's journal is torn mid-record and bytes of its
/// entry logs are flipped while it is down. It restarts (the torn tail cut);
/// reading it directly, every corrupt entry is an I/O error (CRC) — never
/// "no entry" and never wrong data; through the brokers, a catch-up reader
/// (broker caches emptied by restarts) gets every acked message from the
/// replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_entry_logs_and_a_torn_journal_are_detected_and_served_from_replicas() {
    let mut c = FaultCluster::start(ClusterOptions::default()).await;
    let url = c.service_url();
    let mut w = Workload::start(&url, options("p08")).await;
    w.wait_for_acks(1_500, 120_000).await;
    finish_and_check("P0-8 before the corruption", &mut w, &c, &[]).await;

    // The victim: the bookie whose write sets hold the most acked entries.
    // Ensembles are placed at random, 3 of 4 bookies, so any given bookie
    // may hold none of them.
    let client = ledger_client(&c.zk.connect_string(), ledger_client_options()).await;
    let mut mds = std::collections::HashMap::new();
    let mut held = vec![0usize; c.bookies.len()];
    let acked = w.acked_entries();
    for &(ledger, entry) in &acked {
        if let std::collections::hash_map::Entry::Vacant(slot) = mds.entry(ledger) {
            let md = client
                .ledger_metadata(ledger)
                .await
                .unwrap_or_else(|e| panic!("metadata of {ledger}: {e}"));
            slot.insert(md);
        }
        let md = &mds[&ledger];
        let spec = quorum_spec(md).unwrap_or_else(|e| panic!("{e}"));
        let set = write_set_bookies(md, &spec, entry as i64);
        for (i, b) in c.bookies.iter().enumerate() {
            held[i] += usize::from(set.contains(&b.id));
        }
    }
    let v = (0..held.len()).max_by_key(|i| held[*i]).unwrap();
    let vid = c.bookies[v].id.clone();
    assert!(held[v] > 0, "no bookie holds an acked entry: {held:?}");

    // It stops cleanly (its write cache flushed to the entry logs), then is
    // damaged on disk.
    w.fault(format!(
        "{vid} stopped; journal torn; entry log bytes flipped"
    ));
    c.bookies[v].process.stop().await;
    let dir = c.bookies[v].process.dir().to_path_buf();
    let torn = tear_journal_tail(&dir.join("journal"));
    let flipped = flip_entry_log_bytes(&dir.join("ledgers"));
    println!(
        "P0-8: {vid} holds {} acked entries; torn {torn:?}, flipped bytes in {flipped} entry log(s)",
        held[v]
    );
    assert!(
        flipped > 0,
        "no entry log file to corrupt under {}",
        dir.display()
    );
    c.bookies[v].process.restart().await;
    c.bookies[v].wait_ready().await;

    // Read it directly: every entry of its write sets is intact or an error.
    let bc = c.bookies[v].client().await;
    let (mut ok, mut detected, mut absent) = (0, 0, Vec::new());
    for &(ledger, entry) in &acked {
        let md = &mds[&ledger];
        let spec = quorum_spec(md).unwrap_or_else(|e| panic!("{e}"));
        if !write_set_bookies(md, &spec, entry as i64).contains(&vid) {
            continue;
        }
        let r = bc
            .read(ledger, entry as i64, None, "fault-suite")
            .await
            .unwrap_or_else(|e| panic!("reading {ledger}/{entry} from {vid}: {e}"));
        match read_status(&r) {
            StatusCode::Ok => {
                Entry::decode_expected(r.body, ledger, entry as i64).unwrap_or_else(|e| {
                    panic!("{vid} served {ledger}/{entry} as OK but it does not verify: {e}")
                });
                ok += 1;
            }
            StatusCode::IoError => detected += 1,
            other => absent.push(format!("{ledger}/{entry}: {other:?}")),
        }
    }
    println!("P0-8: {vid} read back {ok} entries intact, {detected} detected corrupt");
    assert!(
        absent.is_empty(),
        "{vid} reported {} acked entries as absent instead of corrupt: {:?}",
        absent.len(),
        &absent[..absent.len().min(10)]
    );
    assert!(
        detected > 0,
        "no corruption detected: the flipped bytes hit no entry ({ok} intact)"
    );

    // Through the brokers, with their caches emptied: every acked message.
    w.fault("brokers restarted");
    for b in &mut c.brokers {
        b.restart().await;
    }
    let missing = w.catch_up(&url, "catchup", Duration::from_secs(120)).await;
    let mut opts = w.check_options();
    for t in &w.topics {
        opts = opts.require_complete(t.clone(), "catchup");
    }
    let report = w.history.check(&opts);
    println!("P0-8 catch-up: {missing} missing\n{report}");
    assert!(
        report.is_ok(),
        "P0-8 catch-up:\n{report}\n{}",
        c.log_tails(30)
    );
    assert_eq!(missing, 0);
}

/// RELIABILITY P0-9: a bookie's disk is wiped and it is restarted with the
/// same identity: the cookie check refuses to start it; autorecovery
/// re-replicates its ledgers to the others; every acked message is still
/// delivered to a catch-up reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_bookie_refuses_to_start_and_autorecovery_restores_its_replicas() {
    let mut c = FaultCluster::start(ClusterOptions {
        autorecovery_grace_ms: Some(3_000),
        ..ClusterOptions::default()
    })
    .await;
    let url = c.service_url();
    c.retain_everything().await;
    let mut w = Workload::start(&url, options("p09")).await;
    w.wait_for_acks(800, 120_000).await;
    finish_and_check("P0-9 before the wipe", &mut w, &c, &[]).await;

    w.fault("b1 killed and its disk wiped");
    let victim = c.bookies[0].id.clone();
    c.bookies[0].process.kill();
    let dir = c.bookies[0].process.dir().to_path_buf();
    for sub in ["journal", "ledgers"] {
        let p = dir.join(sub);
        std::fs::remove_dir_all(&p).unwrap_or_else(|e| panic!("wiping {}: {e}", p.display()));
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("{e}"));
    }
    // Same identity, empty disk: the cookie check refuses.
    c.bookies[0].process.restart().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = c.bookies[0].process.try_exit_status() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the wiped bookie kept running: {}",
            c.bookies[0].process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success(), "the wiped bookie exited with {status}");
    let log = c.bookies[0].process.log_tail(40).to_lowercase();
    assert!(
        log.contains("cookie"),
        "refusal does not name the cookie: {log}"
    );

    // Autorecovery replaces b1 in every ledger the workload wrote.
    let client = ledger_client(&c.zk.connect_string(), ledger_client_options()).await;
    let ledgers: std::collections::BTreeSet<u64> =
        w.acked_entries().iter().map(|(l, _)| *l).collect();
    eventually("no ledger names the wiped bookie", 120_000, || {
        let client = &client;
        let ledgers = &ledgers;
        let victim = &victim;
        async move {
            for l in ledgers {
                match client.ledger_metadata(*l).await {
                    Ok(md) if !bookies_named(&md).contains(victim) => {}
                    _ => return false,
                }
            }
            true
        }
    })
    .await;
    // Every replica holds what the metadata says: read b2..b4 directly.
    for l in &ledgers {
        let md = client
            .ledger_metadata(*l)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let spec = quorum_spec(&md).unwrap_or_else(|e| panic!("{e}"));
        for e in 0..=md.last_entry_id {
            for b in write_set_bookies(&md, &spec, e) {
                let node = c
                    .bookies
                    .iter()
                    .find(|n| n.id == b)
                    .unwrap_or_else(|| panic!("{b} is not a bookie"));
                let r = node
                    .client()
                    .await
                    .read(*l, e, None, "fault-suite")
                    .await
                    .unwrap_or_else(|err| panic!("{l}/{e} from {b}: {err}"));
                assert_eq!(read_status(&r), StatusCode::Ok, "{l}/{e} on {b}");
            }
        }
    }
    let missing = w.catch_up(&url, "catchup", Duration::from_secs(120)).await;
    let mut opts = w.check_options();
    for t in &w.topics {
        opts = opts.require_complete(t.clone(), "catchup");
    }
    let report = w.history.check(&opts);
    println!("P0-9 catch-up: {missing} missing\n{report}");
    assert!(report.is_ok(), "P0-9 catch-up:\n{report}");
}

/// RELIABILITY P0-4: for `CMS_FAULT_MINUTES` (CI 3), every 5–20 s a random
/// bookie or broker is killed with SIGKILL and restarted, under load; no
/// acked message is lost, duplicates only where explained, and no topic goes
/// longer than `STALL_MAX` without an acked send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_storm_of_bookies_and_brokers_loses_no_acked_message_and_does_not_stall() {
    let duration = fault_duration(3.0);
    let seed = fault_seed();
    println!(
        "P0-4: kill storm for {:.1} min, seed {seed} (replay: CMS_FAULT_SEED={seed})",
        duration.as_secs_f64() / 60.0
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = FaultCluster::start(ClusterOptions::default()).await;
    let mut w = Workload::start(&c.service_url(), options("p04")).await;
    w.wait_for_acks(300, 60_000).await;
    w.reset_stall_clock();
    let end = Instant::now() + duration;
    let mut kills = 0;
    let mut longest_stall = Duration::ZERO;
    while Instant::now() < end {
        let wait = Duration::from_millis(rng.random_range(5_000..=20_000));
        let until = Instant::now() + wait;
        while Instant::now() < until {
            longest_stall = longest_stall.max(w.longest_stall());
            assert!(
                longest_stall < STALL_MAX,
                "P0-4 (seed {seed}): a topic made no progress for {:.0} s\n{}",
                longest_stall.as_secs_f64(),
                c.log_tails(30)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if Instant::now() >= end {
            break;
        }
        let victim = rng.random_range(0..c.bookies.len() + c.brokers.len());
        let down_ms = rng.random_range(0..3_000);
        kills += 1;
        if victim < c.bookies.len() {
            let b = &mut c.bookies[victim];
            w.fault(format!("kill -9 {} (down {down_ms} ms)", b.id));
            b.process.kill();
            w.fault(format!("{} killed", b.id));
            tokio::time::sleep(Duration::from_millis(down_ms)).await;
            b.process.restart().await;
            b.wait_ready().await;
            w.fault(format!("{} back", b.id));
        } else {
            let b = &mut c.brokers[victim - c.bookies.len()];
            w.fault(format!("kill -9 {} (down {down_ms} ms)", b.process.name()));
            b.process.kill();
            w.fault(format!("{} killed", b.process.name()));
            tokio::time::sleep(Duration::from_millis(down_ms)).await;
            b.process.restart().await;
            b.wait_ready().await;
            w.fault(format!("{} back", b.process.name()));
        }
    }
    let summary = finish_and_check("P0-4", &mut w, &c, &[]).await;
    println!(
        "P0-4 result: seed {seed}, {kills} kills in {:.1} min; {} acked, lost 0, \
         longest stall {:.1} s",
        duration.as_secs_f64() / 60.0,
        summary.sends_acked,
        longest_stall.as_secs_f64()
    );
}

/// RELIABILITY P1-11: for `CMS_FAULT_MINUTES` (CI 2), every connection
/// between brokers and bookies and between clients and brokers goes through
/// a chaos proxy adding delay and jitter and refusing 5% of new
/// connections, while every 0.5–4 s (seeded) all connections through one
/// proxy are reset mid-stream, under load, with a catch-up reader halfway;
/// no safety violation, and the memory (RSS) and open file descriptors of
/// every process stay flat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_network_soak_keeps_every_acked_message_and_flat_resources() {
    let duration = fault_duration(2.0);
    let seed = fault_seed();
    println!(
        "P1-11: lossy network for {:.1} min, seed {seed} (replay: CMS_FAULT_SEED={seed})",
        duration.as_secs_f64() / 60.0
    );
    // The resource check subtracts the caches that report their size
    // (`ProcStats::growth`); the bookies' index page cache does not, so it
    // is kept small here: what grows beyond it is not a cache filling.
    let c = FaultCluster::start(ClusterOptions {
        proxies: true,
        bookie_extra: vec![format!("--index-cache-bytes-max={}", 8 << 20)],
        ..ClusterOptions::default()
    })
    .await;
    let url = c.service_url();
    c.retain_everything().await;
    let mut w = Workload::start(&url, options("p11")).await;
    w.wait_for_acks(300, 60_000).await;
    let lossy = DirectionFaults {
        delay_ms: 1,
        jitter_ms: 4,
        ..DirectionFaults::default()
    };
    let faults = Faults {
        seed,
        refuse_probability: 0.05,
        to_upstream: lossy.clone(),
        to_client: lossy,
        ..Faults::none()
    };
    c.set_proxy_faults(&faults);
    w.fault("lossy network on");
    w.reset_stall_clock();
    let mut stats = ProcStats::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let end = Instant::now() + duration;
    let proxies: Vec<&cms_tests::chaos::ChaosProxy> = c.proxies().collect();
    let soak = async {
        let mut longest = Duration::ZERO;
        let mut resets = 0usize;
        let mut next_sample = Instant::now();
        while Instant::now() < end {
            // Connection resets come from the test, seeded, so the history
            // records each one as a fault right around it (a reset may lose
            // acks in flight: the checker then allows their redelivery).
            let p = proxies[rng.random_range(0..proxies.len())];
            w.fault(format!("reset every connection through {}", p.local_addr()));
            resets += p.reset_all();
            w.fault("connections reset");
            if Instant::now() >= next_sample {
                stats.sample(&c.processes()).await;
                next_sample = Instant::now() + Duration::from_secs(2);
            }
            longest = longest.max(w.longest_stall());
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..=4_000))).await;
        }
        (longest, resets)
    };
    let reader = async {
        tokio::time::sleep(duration / 2).await;
        w.catch_up(&url, "catchup", duration / 2 + Duration::from_secs(60))
            .await
    };
    let ((longest, resets), missing) = tokio::join!(soak, reader);
    c.set_proxy_faults(&Faults::none());
    w.fault("lossy network off");
    let summary = finish_and_check("P1-11", &mut w, &c, &[]).await;
    // The catch-up reader started halfway: it must have seen every message
    // acked before it started (later ones are judged through `audit`).
    assert_eq!(
        missing, 0,
        "P1-11: the catch-up reader missed acked messages"
    );
    println!(
        "P1-11 result: seed {seed}, {:.1} min; {resets} connections reset; {} acked, lost 0, \
         longest stall {:.1} s, catch-up reader complete\n{}",
        duration.as_secs_f64() / 60.0,
        summary.sends_acked,
        longest.as_secs_f64(),
        stats.summary()
    );
    // Our processes (ZooKeeper's JVM heap is sampled and reported, not judged).
    let growth: Vec<String> = stats
        .growth(1.5, 16 * 1024, 50)
        .into_iter()
        .filter(|g| !g.starts_with("zookeeper"))
        .collect();
    assert!(
        growth.is_empty(),
        "P1-11: resources grew: {growth:?}\n{}",
        stats.summary()
    );
    assert!(
        longest < STALL_MAX,
        "P1-11: stalled {:.0} s",
        longest.as_secs_f64()
    );
}

/// Waits `d` while a fault lasts, recording it as ongoing every 200 ms: its
/// consequences (session expiry, takeover, clients moving) come at moments
/// the test does not see, and any of them may lose acks in flight, so the
/// checker's redelivery window stays open for the whole fault.
async fn fault_ongoing(w: &Workload, what: &str, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
        w.history.fault(format!("{what} (ongoing)"));
    }
}

/// A broker whose ZooKeeper session expired (paused past it, or cut off)
/// stops itself rather than serve as a zombie; waits (at most 20 s) for
/// that, restarts it, and waits until it is ready. One that kept running is
/// only waited for.
async fn revive_after_session_loss(b: &mut cms_tests::cluster::BrokerNode, case: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(status) = b.process.try_exit_status() {
            println!(
                "{case}: {} stopped itself ({status}); restarting it",
                b.process.name()
            );
            b.process.restart().await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.wait_ready().await;
}

/// The earlier cases re-run against the full cluster under the suite's
/// load and judged by the history checker, one after the other:
/// - P0-1 zombie owner: `broker-1` is SIGSTOPped past its ZooKeeper session
///   (4 s), the other broker takes its topics, then SIGCONT;
/// - P0-5 cut off from ZooKeeper: `broker-1` reaches bookies and clients but
///   its ZooKeeper connection is black-holed for 12 s, then healed;
/// - P0-6 ensemble change + writer crash: a bookie is killed mid-write and,
///   before the ledgers close, both brokers (the writers) are killed too;
///   everything restarts and the ledgers are recovered;
/// - P0-7 cursor durability: the broker kills of P0-6 land while consumers
///   acknowledge; with every `audit` subscription required complete and in
///   order, nothing acked is lost or skipped.
///
/// One linear history per topic: no acked message lost, no reorder in the
/// Exclusive subscriptions, no divergence (two brokers acknowledging for one
/// topic would show as one of these).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_owner_zookeeper_cut_off_and_writer_crash_keep_one_linear_history() {
    let mut c = FaultCluster::start(ClusterOptions {
        zk_proxy_for_broker_1: true,
        ..ClusterOptions::default()
    })
    .await;
    let mut w = Workload::start(&c.service_url(), options("p0x")).await;
    w.wait_for_acks(300, 60_000).await;
    w.reset_stall_clock();

    // P0-1.
    w.fault("SIGSTOP broker-1 for 10 s");
    c.brokers[0].process.pause();
    w.fault("broker-1 stopped");
    fault_ongoing(&w, "broker-1 stopped", Duration::from_secs(10)).await;
    c.brokers[0].process.resume();
    w.fault("SIGCONT broker-1");
    revive_after_session_loss(&mut c.brokers[0], "P0-1").await;
    w.fault("broker-1 back");
    w.wait_for_acks(300, 120_000).await;

    // P0-5.
    let zk_proxy = c
        .zk_proxy
        .as_ref()
        .unwrap_or_else(|| panic!("no ZooKeeper proxy"));
    w.fault("broker-1 cut off from ZooKeeper for 12 s");
    zk_proxy
        .set_faults(Faults {
            black_hole: true,
            ..Faults::none()
        })
        .unwrap_or_else(|e| panic!("black hole: {e}"));
    w.fault("broker-1's ZooKeeper connection black-holed");
    fault_ongoing(
        &w,
        "broker-1 cut off from ZooKeeper",
        Duration::from_secs(12),
    )
    .await;
    zk_proxy.clear_faults();
    w.fault("broker-1 reaches ZooKeeper again");
    revive_after_session_loss(&mut c.brokers[0], "P0-5").await;
    w.fault("broker-1 back");
    w.wait_for_acks(300, 120_000).await;

    // P0-6 and P0-7.
    w.fault("kill -9 b2, then both brokers before their ledgers close");
    c.bookies[1].process.kill();
    w.wait_for_acks(50, 60_000).await;
    for b in &mut c.brokers {
        b.process.kill();
    }
    // Acks issued up to the kill may be lost with the cursor: the window of
    // allowed redeliveries opens here, after them.
    w.fault("b2, broker-1 and broker-2 killed");
    c.bookies[1].process.restart().await;
    c.bookies[1].wait_ready().await;
    for b in &mut c.brokers {
        b.process.restart().await;
        b.wait_ready().await;
    }
    w.wait_for_acks(300, 120_000).await;
    let stall = w.longest_stall();
    finish_and_check("P0-1/5/6/7", &mut w, &c, &[]).await;
    println!("P0-1/5/6/7: longest stall {:.1} s", stall.as_secs_f64());
    assert!(stall < STALL_MAX, "stalled {:.0} s", stall.as_secs_f64());
}
