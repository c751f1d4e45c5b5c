//! The ledger client against real processes: a harness ZooKeeper and 3–4
//! `cms-bookie serve` bookies. Bookie loss (kill -9) and freeze (SIGSTOP),
//! writer death before close (a real writer process, SIGKILLed), concurrent
//! recoveries, and a delayed bookie during recovery (the BookKeeper #2614
//! shape through the chaos proxy). Every check is against the history of
//! acked entry ids.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic is the test failing"
)]

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use cms_bookie::client::EntryId;
use cms_bookie::client::driver::{LedgerClient, LedgerError, WriteHandle};
use cms_bookie::client::writer::WriterError;
use cms_bookie::proto::metadata::LedgerStatus;
use cms_tests::chaos::{ChaosProxy, DirectionFaults, Faults};
use cms_tests::cluster::{
    BookieNode, init_store, ledger_client, ledger_client_options, ledger_payload, start_bookies,
};
use cms_tests::harness::process::ProcessBuilder;
use cms_tests::harness::wait::eventually;
use cms_tests::harness::zookeeper::{ZkConfig, ZooKeeper};
use tokio::task::JoinHandle;

const SIZE: usize = 700;

type Acked = Arc<Mutex<Vec<EntryId>>>;

async fn zk() -> ZooKeeper {
    ZooKeeper::start_with(ZkConfig::with_tick_time_ms(1_000)).await
}

fn acked_len(a: &Acked) -> usize {
    a.lock().unwrap().len()
}

/// Adds entries 0..count (0 = until the writer fails), `window` in flight,
/// recording each acked id in order. Ends with the first add error.
fn spawn_writer(
    w: WriteHandle,
    count: i64,
    window: usize,
) -> (Acked, JoinHandle<Result<(), LedgerError>>) {
    spawn_writer_from(w, Arc::new(Mutex::new(Vec::new())), count, window)
}

/// [`spawn_writer`] going on after the entries already in `acked`.
fn spawn_writer_from(
    w: WriteHandle,
    acked: Acked,
    count: i64,
    window: usize,
) -> (Acked, JoinHandle<Result<(), LedgerError>>) {
    let a = acked.clone();
    let first = acked_len(&acked) as i64;
    let task = tokio::spawn(async move {
        let mut pending = VecDeque::new();
        let mut next = first;
        loop {
            if (count == 0 || next < count) && pending.len() < window {
                pending.push_back(w.add_pipelined(ledger_payload(next, SIZE)).await?);
                next += 1;
                continue;
            }
            let Some(p) = pending.pop_front() else {
                return Ok(());
            };
            let id = p.await?;
            a.lock().unwrap().push(id);
        }
    });
    (acked, task)
}

/// Acked ids are exactly 0, 1, ... in order.
fn assert_acked_in_order(acked: &[EntryId]) {
    for (i, e) in acked.iter().enumerate() {
        assert_eq!(*e, i as EntryId, "acks out of order: {acked:?}");
    }
}

/// Opens the (closed) ledger from a fresh client and checks every entry up to
/// its last: all acked entries are there, byte for byte.
async fn assert_all_readable(client: &LedgerClient, ledger_id: u64, acked: &[EntryId]) -> EntryId {
    let r = client.open_ledger(ledger_id, false).await.unwrap();
    assert!(r.is_closed(), "ledger {ledger_id} not closed");
    let last = r.last_readable();
    let max_acked = acked.iter().copied().max().unwrap_or(-1);
    assert!(
        last >= max_acked,
        "ledger {ledger_id} closed at {last}, below acked entry {max_acked}"
    );
    let entries = r.read(0, last).await.unwrap();
    assert_eq!(entries.len() as i64, last + 1);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.entry_id, i as EntryId);
        assert_eq!(
            e.payload.as_ref(),
            ledger_payload(e.entry_id, SIZE).as_slice(),
            "entry {} differs",
            e.entry_id
        );
    }
    last
}

fn bookie<'a>(bookies: &'a mut [BookieNode], id: &str) -> &'a mut BookieNode {
    bookies.iter_mut().find(|b| b.id == id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_an_ensemble_bookie_changes_the_ensemble_and_loses_no_acked_entry() {
    let zk = zk().await;
    let mut bookies = start_bookies(&zk.connect_string(), 4).await;
    let client = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let w = client
        .create_ledger(3, 3, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    let id = w.ledger_id();
    let md = client.ledger_metadata(id).await.unwrap();
    let victim = md.segments[0].ensemble[1].clone();
    let (acked, task) = spawn_writer(w.clone(), 1_500, 64);
    eventually("300 entries acked", 20_000, || {
        let n = acked_len(&acked);
        async move { n >= 300 }
    })
    .await;
    bookie(&mut bookies, &victim).process.kill();
    task.await.unwrap().unwrap();
    let last = w.close().await.unwrap();
    assert_eq!(last, 1_499);
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), 1_500);
    assert_acked_in_order(&acked);
    let md = client.ledger_metadata(id).await.unwrap();
    assert!(md.segments.len() >= 2, "no ensemble change: {md:?}");
    assert!(
        !md.segments.last().unwrap().ensemble.contains(&victim),
        "killed bookie {victim} still in the last ensemble"
    );
    let reader = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    assert_all_readable(&reader, id, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_three_bookies_a_lost_bookie_leaves_writes_on_two_and_marks_the_ledger_under_replicated()
 {
    let zk = zk().await;
    let mut bookies = start_bookies(&zk.connect_string(), 3).await;
    let store = init_store(&zk.connect_string()).await;
    let client = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let w = client
        .create_ledger(3, 3, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    let id = w.ledger_id();
    let (acked, task) = spawn_writer(w.clone(), 1_000, 64);
    eventually("200 entries acked", 20_000, || {
        let n = acked_len(&acked);
        async move { n >= 200 }
    })
    .await;
    bookies[2].process.kill();
    task.await.unwrap().unwrap();
    let path = client.underreplicated_path(id);
    eventually("the ledger is marked under-replicated", 10_000, || {
        let (store, path) = (store.clone(), path.clone());
        async move { store.exists(&path).await.unwrap().is_some() }
    })
    .await;
    let (data, _) = store.get(&path).await.unwrap();
    assert_eq!(data, b"b3");
    let last = w.close().await.unwrap();
    assert_eq!(last, 999);
    let acked = acked.lock().unwrap().clone();
    assert_acked_in_order(&acked);
    // The ensemble is unchanged: there was no bookie to replace b3 with.
    let md = client.ledger_metadata(id).await.unwrap();
    assert_eq!(md.segments.len(), 1);
    assert_all_readable(&client, id, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_bookie_does_not_stop_writes_on_the_ack_quorum() {
    let zk = zk().await;
    let bookies = start_bookies(&zk.connect_string(), 3).await;
    let client = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let w = client
        .create_ledger(3, 3, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    let id = w.ledger_id();
    let (acked, task) = spawn_writer(w.clone(), 100, 16);
    task.await.unwrap().unwrap();
    bookies[0].process.pause();
    // Every add completes on the two live bookies while b1 is frozen (it is
    // resumed only after they all completed).
    let (acked, task) = spawn_writer_from(w.clone(), acked, 1_000, 64);
    let r = tokio::time::timeout(std::time::Duration::from_secs(20), task).await;
    bookies[0].process.resume();
    r.expect("writes stalled behind a paused bookie")
        .unwrap()
        .unwrap();
    let last = w.close().await.unwrap();
    assert_eq!(last, 999);
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), 1_000);
    assert_acked_in_order(&acked);
    assert_all_readable(&client, id, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_before_close_is_recovered_with_every_acked_entry_in_order() {
    let zk = zk().await;
    let _bookies = start_bookies(&zk.connect_string(), 3).await;
    let mut writer = ProcessBuilder::new("cms-test-ledger-writer")
        .name("ledger-writer")
        .arg(format!("--zk={}", zk.connect_string()))
        .arg(format!("--size={SIZE}"))
        .arg("--window=32")
        .env("RUST_LOG", "warn")
        .spawn();
    let log = writer.log_path().to_path_buf();
    let lines = move || std::fs::read_to_string(&log).unwrap_or_default();
    eventually("the writer acked 400 entries", 30_000, || {
        let n = lines().lines().filter(|l| l.starts_with("ACKED ")).count();
        async move { n >= 400 }
    })
    .await;
    writer.kill();
    let text = lines();
    let ledger_id: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("LEDGER "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // A line may be cut by the kill: only whole numbers count.
    let acked: Vec<EntryId> = text
        .lines()
        .filter_map(|l| l.strip_prefix("ACKED "))
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    assert_acked_in_order(&acked);
    let client = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let r = client.open_ledger(ledger_id, true).await.unwrap();
    assert!(r.is_closed());
    let md = client.ledger_metadata(ledger_id).await.unwrap();
    assert_eq!(md.status, LedgerStatus::LedgerClosed as i32);
    assert_all_readable(&client, ledger_id, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_recoveries_converge_on_the_same_last_entry() {
    let zk = zk().await;
    let _bookies = start_bookies(&zk.connect_string(), 3).await;
    let writer = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let w = writer
        .create_ledger(3, 2, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    let id = w.ledger_id();
    // Writes keep going while two other clients recover the ledger.
    let (acked, task) = spawn_writer(w, 0, 32);
    eventually("300 entries acked", 20_000, || {
        let n = acked_len(&acked);
        async move { n >= 300 }
    })
    .await;
    let c1 = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let c2 = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let (r1, r2) = tokio::join!(c1.open_ledger(id, true), c2.open_ledger(id, true));
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert!(r1.is_closed() && r2.is_closed());
    assert_eq!(r1.last_readable(), r2.last_readable());
    // The writer is fenced out.
    let err = task.await.unwrap().unwrap_err();
    assert_eq!(err, LedgerError::Writer(WriterError::Fenced));
    let acked = acked.lock().unwrap().clone();
    assert_acked_in_order(&acked);
    let last = assert_all_readable(&c1, id, &acked).await;
    assert_eq!(last, r1.last_readable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_bookie_during_recovery_truncates_no_acked_entry() {
    let zk = zk().await;
    let bookies = start_bookies(&zk.connect_string(), 3).await;
    let writer = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let w = writer
        .create_ledger(3, 3, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    let id = w.ledger_id();
    let md = writer.ledger_metadata(id).await.unwrap();
    // The recovering client reaches one bookie of the ensemble through the proxy.
    let slow = md.segments[0].ensemble[0].clone();
    let upstream = bookies.iter().find(|b| b.id == slow).unwrap().grpc();
    let proxy = ChaosProxy::start("127.0.0.1:0".parse().unwrap(), upstream)
        .await
        .unwrap();
    let mut options = ledger_client_options();
    options
        .endpoint_overrides
        .insert(slow.clone(), proxy.local_addr().to_string());
    let recoverer = ledger_client(&zk.connect_string(), options).await;
    // The writer keeps adding (and acking) while recovery runs: its acks
    // after recovery read an entry's absence would be the #2614 loss.
    let (acked, task) = spawn_writer(w, 0, 32);
    eventually("200 entries acked", 20_000, || {
        let n = acked_len(&acked);
        async move { n >= 200 }
    })
    .await;
    proxy
        .set_faults(Faults {
            seed: 2614,
            to_upstream: DirectionFaults {
                delay_ms: 400,
                jitter_ms: 200,
                ..Default::default()
            },
            to_client: DirectionFaults {
                delay_ms: 400,
                jitter_ms: 200,
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
    let r = recoverer.open_ledger(id, true).await.unwrap();
    assert!(
        proxy.connections() >= 1,
        "recovery did not go through the proxy"
    );
    proxy.clear_faults();
    let err = task.await.unwrap().unwrap_err();
    assert_eq!(err, LedgerError::Writer(WriterError::Fenced));
    let acked = acked.lock().unwrap().clone();
    assert_acked_in_order(&acked);
    let ids: BTreeSet<EntryId> = acked.iter().copied().collect();
    assert!(ids.iter().all(|e| *e <= r.last_readable()));
    assert_all_readable(&recoverer, id, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_an_open_ledger_stops_at_the_lac_and_tails_with_the_long_poll() {
    let zk = zk().await;
    let _bookies = start_bookies(&zk.connect_string(), 3).await;
    let client = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let w = client
        .create_ledger(3, 2, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    let id = w.ledger_id();
    for e in 0..10 {
        assert_eq!(w.add(ledger_payload(e, SIZE)).await.unwrap(), e);
    }
    let reader = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    let r = reader.open_ledger(id, false).await.unwrap();
    assert!(!r.is_closed());
    // Entry 9's LAC only reaches the bookies with the idle writer's explicit LAC.
    eventually("the reader sees LAC 9", 10_000, || {
        let r = r.clone();
        async move { r.read_lac().await.unwrap() == 9 }
    })
    .await;
    let entries = r.read(0, 9).await.unwrap();
    assert_eq!(entries.len(), 10);
    assert!(matches!(
        r.read(10, 10).await,
        Err(LedgerError::Read(
            cms_bookie::client::reader::ReadError::PastEnd { .. }
        ))
    ));
    // Tail: the long poll returns once more is confirmed.
    let tail = {
        let r = r.clone();
        tokio::spawn(async move { r.wait_lac_above(9, 10_000).await.unwrap() })
    };
    for e in 10..12 {
        w.add(ledger_payload(e, SIZE)).await.unwrap();
    }
    let lac = tail.await.unwrap();
    assert!(lac >= 10, "tail returned {lac}");
    let more = r.read(10, lac).await.unwrap();
    for e in more {
        assert_eq!(
            e.payload.as_ref(),
            ledger_payload(e.entry_id, SIZE).as_slice()
        );
    }
    assert_eq!(w.close().await.unwrap(), 11);
    assert_all_readable(&reader, id, &(0..12).collect::<Vec<_>>()).await;
}
