//! Autorecovery against real processes: a harness ZooKeeper, 4 `cms-bookie
//! serve` bookies and a `cms-bookie autorecovery` process. A bookie killed for
//! good is replaced in every ledger naming it, with every entry it held copied
//! to the replacement (checked entry by entry, digest-verified, on every
//! replica); an open ledger is fenced and recovered first, so its writer's
//! next add fails as fenced.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic is the test failing"
)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use cms_bookie::autorecovery::{list_underreplicated, plan::bookies_named};
use cms_bookie::client::driver::{LedgerClient, LedgerError};
use cms_bookie::client::writer::WriterError;
use cms_bookie::metadata::layout::Layout;
use cms_bookie::proto::metadata::LedgerStatus;
use cms_tests::cluster::{
    ROOT, autorecovery_process, init_store, ledger_client, ledger_client_options, ledger_payload,
    metric_value, replica_mismatches, start_bookies,
};
use cms_tests::harness::wait::eventually;
use cms_tests::harness::zookeeper::{ZkConfig, ZooKeeper};

const SIZE: usize = 300;

async fn zk() -> ZooKeeper {
    ZooKeeper::start_with(ZkConfig::with_tick_time_ms(1_000)).await
}

fn payload(e: i64) -> Vec<u8> {
    ledger_payload(e, SIZE)
}

/// True when no ledger of `ids` names `dead` and every entry is on every
/// replica of its write set.
async fn fully_replicated(
    client: &LedgerClient,
    bookies: &[cms_tests::cluster::BookieNode],
    ids: &[u64],
    dead: &str,
) -> bool {
    for id in ids {
        let Ok(md) = client.ledger_metadata(*id).await else {
            return false;
        };
        if bookies_named(&md).contains(dead) {
            return false;
        }
        if !replica_mismatches(client, bookies, *id, payload)
            .await
            .is_empty()
        {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bookie_lost_for_good_is_replaced_in_every_ledger_with_every_entry_copied() {
    let zk = zk().await;
    let mut bookies = start_bookies(&zk.connect_string(), 4).await;
    let client = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let w = client
            .create_ledger(3, 2, 2, b"pw", HashMap::new())
            .await
            .unwrap();
        for e in 0..40 {
            assert_eq!(w.add(payload(e)).await.unwrap(), e);
        }
        w.close().await.unwrap();
        ids.push(w.ledger_id());
    }
    let first = client.ledger_metadata(ids[0]).await.unwrap();
    let dead = first.segments[0].ensemble[0].clone();
    let naming: Vec<u64> = {
        let mut v = Vec::new();
        for id in &ids {
            if bookies_named(&client.ledger_metadata(*id).await.unwrap()).contains(&dead) {
                v.push(*id);
            }
        }
        v
    };
    assert!(!naming.is_empty());
    for id in &ids {
        assert!(
            replica_mismatches(&client, &bookies, *id, payload)
                .await
                .is_empty()
        );
    }

    let _ar = autorecovery_process(&zk.connect_string(), 2_000, &[]);
    bookies
        .iter_mut()
        .find(|b| b.id == dead)
        .unwrap()
        .process
        .kill();

    eventually(
        "every ledger is fully replicated without the dead bookie",
        40_000,
        || fully_replicated(&client, &bookies, &ids, &dead),
    )
    .await;
    let store = init_store(&zk.connect_string()).await;
    let layout = Layout::new(ROOT).unwrap();
    eventually("no ledger is left marked under-replicated", 10_000, || {
        let store = store.clone();
        let layout = layout.clone();
        async move {
            list_underreplicated(store.as_ref(), &layout)
                .await
                .unwrap()
                .is_empty()
        }
    })
    .await;
    // Ledgers that never named the dead bookie were left as they were.
    for id in ids.iter().filter(|id| !naming.contains(id)) {
        let md = client.ledger_metadata(*id).await.unwrap();
        assert_eq!(md.segments.len(), 1);
    }
    // The autorecovery process's metrics tell the same story.
    let http = _ar.addr("http");
    let metric = |name: &'static str| async move {
        metric_value(http, name)
            .await
            .unwrap_or_else(|| panic!("{name} missing from /metrics"))
    };
    assert_eq!(metric("cms_autorecovery_is_auditor").await, 1.0);
    assert!(metric("cms_autorecovery_ledgers_marked_total").await >= naming.len() as f64);
    assert!(metric("cms_autorecovery_ledgers_replicated_total").await >= naming.len() as f64);
    // Each ledger naming the dead bookie had at least one of its 40 entries on it.
    assert!(metric("cms_autorecovery_entries_copied_total").await >= naming.len() as f64);
    assert!(metric("cms_autorecovery_bytes_copied_total").await > 0.0);
    eventually("the under-replicated gauge falls to 0", 10_000, || async {
        metric("cms_autorecovery_underreplicated_ledgers").await == 0.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_ledger_is_fenced_recovered_and_re_replicated_and_its_writer_is_fenced() {
    let zk = zk().await;
    let mut bookies = start_bookies(&zk.connect_string(), 4).await;
    let client = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let w = client
        .create_ledger(3, 2, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    let id = w.ledger_id();
    for e in 0..30 {
        assert_eq!(w.add(payload(e)).await.unwrap(), e);
    }
    let dead = client.ledger_metadata(id).await.unwrap().segments[0].ensemble[1].clone();
    // The writer keeps writing through the loss until it is fenced.
    let acked = Arc::new(AtomicI64::new(29));
    let writer = {
        let w = w.clone();
        let acked = acked.clone();
        tokio::spawn(async move {
            let mut next = 30;
            loop {
                match w.add(payload(next)).await {
                    Ok(e) => {
                        acked.store(e, Ordering::SeqCst);
                        next += 1;
                    }
                    Err(err) => return err,
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
    };

    let _ar = autorecovery_process(&zk.connect_string(), 2_000, &[]);
    bookies
        .iter_mut()
        .find(|b| b.id == dead)
        .unwrap()
        .process
        .kill();

    let ids: &[u64] = &[id];
    let err = tokio::time::timeout(std::time::Duration::from_secs(40), writer)
        .await
        .expect("the writer was never fenced")
        .unwrap();
    assert_eq!(err, LedgerError::Writer(WriterError::Fenced));
    eventually(
        "the ledger is fully replicated without the dead bookie",
        30_000,
        || fully_replicated(&client, &bookies, ids, &dead),
    )
    .await;
    let md = client.ledger_metadata(id).await.unwrap();
    assert_eq!(md.status, LedgerStatus::LedgerClosed as i32);
    assert!(
        md.last_entry_id >= acked.load(Ordering::SeqCst),
        "closed at {} below acked {}",
        md.last_entry_id,
        acked.load(Ordering::SeqCst)
    );
    // The writer's next add fails as fenced, too.
    assert_eq!(
        w.add(payload(md.last_entry_id + 1)).await.unwrap_err(),
        LedgerError::Writer(WriterError::Fenced)
    );
}

/// Runs `cms-bookie args...` to completion (bounded); exit code and stdout.
async fn cms_bookie(args: &[&str]) -> (Option<i32>, String) {
    let binary = cms_tests::harness::bins::find("cms-bookie").unwrap();
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tokio::process::Command::new(&binary)
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_and_list_underreplicated_commands_show_replicas_and_marks() {
    let zk = zk().await;
    let mut bookies = start_bookies(&zk.connect_string(), 3).await;
    let client = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let w = client
        .create_ledger(3, 2, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    for e in 0..9 {
        w.add(payload(e)).await.unwrap();
    }
    w.close().await.unwrap();
    let id = w.ledger_id();
    let url = format!("--metadata-url=zk://{}", zk.connect_string());
    let (code, out) = cms_bookie(&["ledger", &id.to_string(), &url]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("LedgerClosed, last entry 8"), "{out}");
    // E=3 Qw=2, 9 entries: each bookie holds 6.
    assert_eq!(out.matches("6/6 entries, complete").count(), 3, "{out}");

    let (code, out) = cms_bookie(&["list-underreplicated", &url]).await;
    assert_eq!(code, Some(0));
    assert!(out.contains("no under-replicated ledger"), "{out}");

    bookies[2].process.kill();
    let store = init_store(&zk.connect_string()).await;
    let layout = Layout::new(ROOT).unwrap();
    cms_bookie::autorecovery::mark_underreplicated(
        store.as_ref(),
        &layout,
        id,
        &[bookies[2].id.clone()],
    )
    .await
    .unwrap();
    let (code, out) = cms_bookie(&["list-underreplicated", &url]).await;
    assert_eq!(code, Some(0));
    assert_eq!(
        out.trim(),
        format!("{id}\tlost: {}", bookies[2].id),
        "{out}"
    );
    let (code, out) = cms_bookie(&["ledger", &id.to_string(), &url]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("{}: 0/6 entries, UNAVAILABLE", bookies[2].id)),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_copy_leaves_the_metadata_alone_and_another_finishes() {
    let zk = zk().await;
    let mut bookies = start_bookies(&zk.connect_string(), 4).await;
    let client = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let w = client
        .create_ledger(3, 2, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    for e in 0..60 {
        w.add(payload(e)).await.unwrap();
    }
    w.close().await.unwrap();
    let id = w.ledger_id();
    let before = client.ledger_metadata(id).await.unwrap();
    let dead = before.segments[0].ensemble[0].clone();
    bookies
        .iter_mut()
        .find(|b| b.id == dead)
        .unwrap()
        .process
        .kill();
    // 10 entries/s: the 40 entries the dead bookie held take ~4 s to copy.
    let mut slow = autorecovery_process(
        &zk.connect_string(),
        500,
        &["--replication-entries-per-s-max=10"],
    );
    let store = init_store(&zk.connect_string()).await;
    let layout = Layout::new(ROOT).unwrap();
    let lock = format!("{}/{id}", layout.autorecovery_locks());
    eventually("the slow worker holds the ledger's lock", 20_000, || {
        let store = store.clone();
        let lock = lock.clone();
        async move { store.exists(&lock).await.unwrap().is_some() }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
    slow.kill();
    // Mid-copy: nothing was swapped in.
    assert_eq!(client.ledger_metadata(id).await.unwrap(), before);
    assert_eq!(
        list_underreplicated(store.as_ref(), &layout)
            .await
            .unwrap()
            .len(),
        1
    );
    // The killed worker's lock goes with its session; another worker finishes.
    let _ar = autorecovery_process(&zk.connect_string(), 500, &[]);
    let ids: &[u64] = &[id];
    eventually("another worker re-replicated the ledger", 40_000, || {
        fully_replicated(&client, &bookies, ids, &dead)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookies_serving_with_autorecovery_replace_a_dead_bookie_even_if_it_was_the_auditor() {
    let zk = zk().await;
    let zks = zk.connect_string();
    init_store(&zks).await.close().await;
    let flags = [
        "--autorecovery",
        "--lost-bookie-grace-ms=1000",
        "--open-ledger-grace-ms=1000",
        "--autorecovery-interval-ms=200",
    ];
    let mut bookies = Vec::new();
    for i in 1..=4 {
        bookies.push(cms_tests::cluster::BookieNode::start(&format!("b{i}"), &zks, &flags).await);
    }
    let client = ledger_client(&zks, ledger_client_options()).await;
    let store = init_store(&zks).await;
    let layout = Layout::new(ROOT).unwrap();
    // The auditor is the first bookie to win the election; kill that one.
    let mut auditor = String::new();
    eventually("an auditor is elected", 10_000, || {
        let store = store.clone();
        let path = layout.auditor();
        async move { store.exists(&path).await.unwrap().is_some() }
    })
    .await;
    let (data, _) = store.get(&layout.auditor()).await.unwrap();
    auditor.push_str(&String::from_utf8(data).unwrap());
    let w = client
        .create_ledger(4, 3, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    for e in 0..30 {
        w.add(payload(e)).await.unwrap();
    }
    w.close().await.unwrap();
    let id = w.ledger_id();
    // E=4 on 4 bookies: the ledger names the auditor; without a spare bookie
    // a fifth one must join to take its place.
    bookies
        .iter_mut()
        .find(|b| b.id == auditor)
        .unwrap()
        .process
        .kill();
    bookies.push(cms_tests::cluster::BookieNode::start("b5", &zks, &flags).await);
    let ids: &[u64] = &[id];
    eventually(
        "the ledger is fully replicated without the dead auditor",
        45_000,
        || fully_replicated(&client, &bookies, ids, &auditor),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_formatted_bookie_restores_its_entries_from_replicas_and_leaves_limbo() {
    use cms_bookie::bookie_client::read_status;
    use cms_bookie::entry::Entry;
    use cms_bookie::proto::bookie::StatusCode;

    let zk = zk().await;
    let zks = zk.connect_string();
    let mut bookies = start_bookies(&zks, 3).await;
    let client = ledger_client(&zks, ledger_client_options()).await;
    let w = client
        .create_ledger(3, 3, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    for e in 0..25 {
        w.add(payload(e)).await.unwrap();
    }
    w.close().await.unwrap();
    let id = w.ledger_id();

    let b3 = &mut bookies[2];
    b3.process.stop().await;
    let dir = b3.process.dir().to_path_buf();
    let (code, out) = cms_bookie(&[
        "format",
        "--yes",
        &format!("--metadata-url=zk://{zks}"),
        "--bookie-id=b3",
        &format!("--journal-dir={}", dir.join("journal").display()),
        &format!("--ledger-dir={}", dir.join("ledgers").display()),
    ])
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("incarnation 2"), "{out}");
    b3.restart().await;
    let c = b3.client_for(2).await;
    eventually(
        "b3 holds every entry again and the ledger left limbo",
        30_000,
        || {
            let c = c.clone();
            async move {
                for e in 0..25 {
                    let Ok(r) = c.read(id, e, None, "test").await else {
                        return false;
                    };
                    if read_status(&r) != StatusCode::Ok {
                        return false;
                    }
                    let entry = Entry::decode_expected(r.body, id, e).unwrap();
                    assert_eq!(entry.payload.as_ref(), payload(e).as_slice());
                }
                // Out of limbo: a missing entry is NO_ENTRY again, not UNKNOWN_LEDGER_STATE.
                let r = c.read(id, 1_000, None, "test").await.unwrap();
                read_status(&r) == StatusCode::NoEntry
            }
        },
    )
    .await;
}

/// Light write load for the decommission test: ledgers of E=3 Qw=2 Qa=2, 50
/// entries each, about 100 adds/s, until `stop`; a ledger fenced by
/// autorecovery (or failing otherwise) is abandoned for a new one, as a
/// managed ledger would roll over. Returns every acknowledged (ledger, entry).
async fn light_write_load(
    client: LedgerClient,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<(u64, i64)> {
    let mut acked = Vec::new();
    'ledgers: while !*stop.borrow() {
        let w = match client.create_ledger(3, 2, 2, b"pw", HashMap::new()).await {
            Ok(w) => w,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        for e in 0..50 {
            if *stop.borrow() {
                let _ = w.close().await;
                break 'ledgers;
            }
            match w.add(payload(e)).await {
                Ok(id) => acked.push((w.ledger_id(), id)),
                Err(_) => continue 'ledgers,
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = w.close().await;
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decommission_drains_a_stopped_bookie_and_reports_done() {
    let zk = zk().await;
    let zks = zk.connect_string();
    let mut bookies = start_bookies(&zks, 4).await;
    let client = ledger_client(&zks, ledger_client_options()).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let w = client
            .create_ledger(3, 2, 2, b"pw", HashMap::new())
            .await
            .unwrap();
        for e in 0..20 {
            w.add(payload(e)).await.unwrap();
        }
        w.close().await.unwrap();
        ids.push(w.ledger_id());
    }
    let victim = client.ledger_metadata(ids[0]).await.unwrap().segments[0].ensemble[0].clone();
    let url = format!("--metadata-url=zk://{zks}");
    // A running bookie is refused.
    let (code, _) = cms_bookie(&["decommission", &victim, &url, "--timeout-s=5"]).await;
    assert_eq!(code, Some(1));
    // The auditor's grace is far away: only the decommission marks ledgers.
    let _ar = autorecovery_process(&zks, 600_000, &[]);
    // Light write load throughout: it starts on all four bookies, so its open
    // ledger may name the victim when it stops.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let load = tokio::spawn(light_write_load(
        ledger_client(&zks, ledger_client_options()).await,
        stop_rx,
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    bookies
        .iter_mut()
        .find(|b| b.id == victim)
        .unwrap()
        .process
        .stop()
        .await;
    let (code, out) = cms_bookie(&["decommission", &victim, &url, "--timeout-s=60"]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("still name it"), "{out}");
    assert!(out.contains("decommissioned: no ledger needs it"), "{out}");
    assert!(fully_replicated(&client, &bookies, &ids, &victim).await);
    stop_tx.send(true).unwrap();
    let acked = tokio::time::timeout(Duration::from_secs(20), load)
        .await
        .expect("the load stops")
        .unwrap();
    assert!(
        acked.len() > 50,
        "the load kept writing: {} acked",
        acked.len()
    );
    // Every acknowledged entry of the load is readable with its bytes (its
    // open ledger may have been fenced by the drain: nothing acked was lost).
    let mut by_ledger: std::collections::BTreeMap<u64, Vec<i64>> = Default::default();
    for (l, e) in &acked {
        by_ledger.entry(*l).or_default().push(*e);
    }
    for (l, entries) in &by_ledger {
        let r = client.open_ledger(*l, true).await.unwrap();
        let last = *entries.iter().max().unwrap();
        let got = r.read(0, last).await.unwrap();
        assert_eq!(
            got.len() as i64,
            last + 1,
            "ledger {l}: every acked entry is there"
        );
        for (e, entry) in got.iter().enumerate() {
            assert_eq!(
                entry.payload.as_ref(),
                payload(e as i64).as_slice(),
                "ledger {l} entry {e}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sampled_check_finds_a_live_replica_missing_entries_and_it_is_replaced() {
    use bytes::Bytes;
    use cms_bookie::client::master_key::master_key;
    use cms_bookie::client::metadata::{NewLedger, new_ledger};
    use cms_bookie::client::quorum::QuorumSpec;
    use cms_bookie::entry::EntryHeader;
    use cms_bookie::metadata::CreateMode;
    use cms_bookie::proto::bookie::StatusCode;
    use prost::Message;
    const LAST: i64 = 11;
    let zk = zk().await;
    let zks = zk.connect_string();
    let bookies = start_bookies(&zks, 4).await;
    let store = init_store(&zks).await;
    let layout = Layout::new(ROOT).unwrap();
    let client = ledger_client(&zks, ledger_client_options()).await;
    // A closed ledger E=3 Qw=3 Qa=2 on bookies 0, 1, 2 whose entries only
    // bookies 0 and 1 hold: bookie 2 is alive but silently lacks them (as
    // after a lost disk write the writer never noticed).
    let id = 900_000_001;
    let key = master_key(b"pw");
    let mut length = 0;
    for e in 0..=LAST {
        let p = payload(e);
        length += p.len() as u64;
        let body = cms_bookie::entry::Entry::encode(
            EntryHeader {
                ledger_id: id,
                entry_id: e,
                lac: e - 1,
                length,
            },
            &p,
        );
        for b in &bookies[..2] {
            let st = b
                .client()
                .await
                .add(id, e, key.clone(), false, body.clone())
                .await
                .unwrap();
            assert_eq!(st, StatusCode::Ok);
        }
    }
    let mut md = new_ledger(NewLedger {
        ledger_id: id,
        quorum: QuorumSpec::new(3, 3, 2).unwrap(),
        ensemble: bookies[..3].iter().map(|b| b.id.clone()).collect(),
        password: Bytes::from_static(b"pw"),
        custom: HashMap::new(),
        ctime_ms: 0,
    })
    .unwrap();
    md.status = LedgerStatus::LedgerClosed as i32;
    md.last_entry_id = LAST;
    md.length = length;
    let node = layout.ledger(id);
    store
        .create_all(cms_bookie::metadata::parent_of(&node).unwrap())
        .await
        .unwrap();
    store
        .create(&node, &md.encode_to_vec(), CreateMode::Persistent)
        .await
        .unwrap();
    assert!(
        !replica_mismatches(&client, &bookies, id, payload)
            .await
            .is_empty(),
        "bookie 2 lacks the entries before the check"
    );

    // No bookie is ever lost (grace 10 min): only the sampled check can find it.
    let ar = autorecovery_process(&zks, 600_000, &["--sample-check-interval-ms=300"]);
    let lacking = bookies[2].id.clone();
    let ids = [id];
    eventually(
        "the ledger no longer names the lacking bookie and every replica holds every entry",
        30_000,
        || fully_replicated(&client, &bookies, &ids, &lacking),
    )
    .await;
    let marked = metric_value(ar.addr("http"), "cms_autorecovery_ledgers_marked_total")
        .await
        .unwrap();
    assert!(marked >= 1.0, "the sampled check marked it: {marked}");
}

/// Measurement (ignored; run with `--ignored --nocapture`): re-replication
/// rate of one worker, unthrottled and at the default throttle, for a ledger
/// of 4000 entries of 1 KiB (E=3 Qw=2) that lost one bookie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement"]
async fn measure_re_replication_rate() {
    use cms_bookie::autorecovery::{AutorecoveryConfig, Outcome, Worker, mark_underreplicated};
    const N: i64 = 4_000;
    const BYTES: usize = 1024;
    let zk = zk().await;
    let zks = zk.connect_string();
    let mut bookies = start_bookies(&zks, 5).await;
    let client = ledger_client(&zks, ledger_client_options()).await;
    let store = init_store(&zks).await;
    let layout = Layout::new(ROOT).unwrap();
    for (label, entries_max, bytes_max) in [
        ("unthrottled", 0, 0),
        ("default throttle", 5_000, 50 * 1024 * 1024),
    ] {
        let w = client
            .create_ledger(3, 2, 2, b"pw", HashMap::new())
            .await
            .unwrap();
        let mut pending = std::collections::VecDeque::new();
        for e in 0..N {
            pending.push_back(w.add_pipelined(ledger_payload(e, BYTES)).await.unwrap());
            if pending.len() >= 256 {
                pending.pop_front().unwrap().await.unwrap();
            }
        }
        for p in pending {
            p.await.unwrap();
        }
        w.close().await.unwrap();
        let id = w.ledger_id();
        let md = client.ledger_metadata(id).await.unwrap();
        let victim = md.segments[0].ensemble[0].clone();
        bookies
            .iter_mut()
            .find(|b| b.id == victim)
            .unwrap()
            .process
            .stop()
            .await;
        mark_underreplicated(store.as_ref(), &layout, id, std::slice::from_ref(&victim))
            .await
            .unwrap();
        let mut worker = Worker::new(
            store.clone(),
            layout.clone(),
            client.clone(),
            AutorecoveryConfig {
                replication_entries_per_s_max: entries_max,
                replication_bytes_per_s_max: bytes_max,
                ..AutorecoveryConfig::default()
            },
        );
        let t = std::time::Instant::now();
        let out = worker.replicate_ledger(id, &victim).await.unwrap();
        let secs = t.elapsed().as_secs_f64();
        let Outcome::Done { entries_copied } = out else {
            panic!("{out:?}")
        };
        let mib = entries_copied as f64 * (BYTES + 36) as f64 / (1024.0 * 1024.0);
        eprintln!(
            "re-replication {label}: {entries_copied} entries in {secs:.2} s = {:.0} entries/s, {:.2} MiB/s",
            entries_copied as f64 / secs,
            mib / secs
        );
        // Restart the victim so the next round has a spare bookie again.
        bookies
            .iter_mut()
            .find(|b| b.id == victim)
            .unwrap()
            .restart()
            .await;
    }
}
