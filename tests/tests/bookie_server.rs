//! The bookie server as a real process against a real ZooKeeper: durability
//! across kill -9 and power cuts, fencing, master keys, cookies, bounds,
//! read-only mode, fsync failure, limbo.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic is the test failing"
)]

use std::time::Duration;

use bytes::Bytes;
use cms_bookie::bookie_client::{BookieClient, ClientOptions, read_status};
use cms_bookie::entry::{Entry, EntryHeader};
use cms_bookie::metadata::CreateMode;
use cms_bookie::metadata::layout::Layout;
use cms_bookie::proto::bookie::StatusCode;
use cms_bookie::proto::metadata::{LedgerMetadata, LedgerStatus, Segment};
use cms_tests::cluster::{BOOKIE_TEST_CONFIG, BookieNode, ROOT, init_store};
use cms_tests::harness::wait::eventually;
use cms_tests::harness::zookeeper::{ZkConfig, ZooKeeper};
use prost::Message;

const KEY: &[u8; 20] = b"0123456789abcdefghij";

fn key() -> Bytes {
    Bytes::from_static(KEY)
}

fn payload(ledger: u64, entry: i64) -> Vec<u8> {
    format!("ledger {ledger} entry {entry} ")
        .repeat(1 + (entry as usize % 7))
        .into_bytes()
}

fn entry(ledger: u64, entry_id: i64) -> Bytes {
    let p = payload(ledger, entry_id);
    Entry::encode(
        EntryHeader {
            ledger_id: ledger,
            entry_id,
            lac: entry_id - 1,
            length: 0,
        },
        &p,
    )
}

async fn add(c: &BookieClient, ledger: u64, entry_id: i64) -> StatusCode {
    c.add(ledger, entry_id, key(), false, entry(ledger, entry_id))
        .await
        .unwrap()
}

async fn assert_reads_back(c: &BookieClient, ledger: u64, n: i64) {
    for e in 0..n {
        let r = c.read(ledger, e, None, "t").await.unwrap();
        assert_eq!(read_status(&r), StatusCode::Ok, "ledger {ledger} entry {e}");
        assert_eq!(
            r.body,
            entry(ledger, e),
            "ledger {ledger} entry {e} differs"
        );
    }
}

/// Waits until bookie `id` is registered under `readonly/` and not under `available/`.
async fn wait_registered_read_only(
    store: &std::sync::Arc<dyn cms_bookie::metadata::MetadataStore>,
    id: &str,
) {
    let layout = Layout::new(ROOT).unwrap();
    let ro = format!("{}/{id}", layout.bookies_readonly());
    let av = format!("{}/{id}", layout.bookies_available());
    eventually("the bookie registers under readonly/ only", 30_000, || {
        let store = store.clone();
        let (ro, av) = (ro.clone(), av.clone());
        async move {
            let ro = store.exists(&ro).await.ok().flatten().is_some();
            let av = store.exists(&av).await.ok().flatten().is_some();
            ro && !av
        }
    })
    .await;
}

async fn zk() -> ZooKeeper {
    ZooKeeper::start_with(ZkConfig::with_tick_time_ms(1_000)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_entries_survive_kill_9_byte_identical() {
    let zk = zk().await;
    init_store(&zk.connect_string()).await;
    let mut b = BookieNode::start("b1", &zk.connect_string(), &[]).await;
    let c = b.client().await;
    // Pipelined adds on several ledgers.
    let mut pending = Vec::new();
    for ledger in 1..=4u64 {
        for e in 0..200i64 {
            let c = c.clone();
            pending.push(tokio::spawn(async move { add(&c, ledger, e).await }));
        }
    }
    for p in pending {
        assert_eq!(p.await.unwrap(), StatusCode::Ok);
    }
    b.kill_and_restart().await;
    let c = b.client().await;
    for ledger in 1..=4u64 {
        assert_reads_back(&c, ledger, 200).await;
    }
    // The entry after the last is absent, explicitly.
    let r = c.read(1, 200, None, "t").await.unwrap();
    assert_eq!(read_status(&r), StatusCode::NoEntry);
    let r = c.read(999, 0, None, "t").await.unwrap();
    assert_eq!(read_status(&r), StatusCode::NoLedger);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_refuses_adds_but_not_recovery_adds_and_checks_the_key() {
    let zk = zk().await;
    init_store(&zk.connect_string()).await;
    let b = BookieNode::start("b1", &zk.connect_string(), &[]).await;
    let c = b.client().await;
    assert_eq!(add(&c, 5, 0).await, StatusCode::Ok);
    // Wrong master key.
    let wrong = Bytes::from_static(b"xxxxxxxxxxxxxxxxxxxx");
    assert_eq!(
        c.add(5, 1, wrong.clone(), false, entry(5, 1))
            .await
            .unwrap(),
        StatusCode::Unauthorized
    );
    let r = c.read(5, 0, Some(wrong), "t").await.unwrap();
    assert_eq!(read_status(&r), StatusCode::Unauthorized);
    // Fence with the right key: the read answers and later adds are refused.
    let r = c.read(5, 0, Some(key()), "t").await.unwrap();
    assert_eq!(read_status(&r), StatusCode::Ok);
    assert_eq!(r.body, entry(5, 0));
    assert_eq!(add(&c, 5, 1).await, StatusCode::Fenced);
    assert_eq!(
        c.add(5, 1, key(), true, entry(5, 1)).await.unwrap(),
        StatusCode::Ok,
        "a recovery add is accepted on a fenced ledger"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_of_an_unknown_ledger_survives_a_restart() {
    let zk = zk().await;
    init_store(&zk.connect_string()).await;
    let mut b = BookieNode::start("b1", &zk.connect_string(), &[]).await;
    let c = b.client().await;
    let r = c.read(77, 0, Some(key()), "t").await.unwrap();
    assert_eq!(
        read_status(&r),
        StatusCode::NoEntry,
        "fenced, nothing stored"
    );
    b.kill_and_restart().await;
    let c = b.client().await;
    assert_eq!(
        add(&c, 77, 0).await,
        StatusCode::Fenced,
        "the old writer's delayed first add is refused after a restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_entry_is_bad_request_and_the_stream_lives_on() {
    let zk = zk().await;
    init_store(&zk.connect_string()).await;
    let b = BookieNode::start("b1", &zk.connect_string(), &["--entry-bytes-max=65536"]).await;
    let c = b.client().await;
    let big = Entry::encode(
        EntryHeader {
            ledger_id: 3,
            entry_id: 0,
            lac: -1,
            length: 0,
        },
        &vec![7u8; 70_000],
    );
    assert_eq!(
        c.add(3, 0, key(), false, big).await.unwrap(),
        StatusCode::BadRequest
    );
    // A body whose header names another entry is refused too.
    assert_eq!(
        c.add(3, 1, key(), false, entry(3, 0)).await.unwrap(),
        StatusCode::BadRequest
    );
    // The same stream still works, for this and other ledgers.
    assert_eq!(add(&c, 3, 0).await, StatusCode::Ok);
    assert_eq!(add(&c, 4, 0).await, StatusCode::Ok);
    assert_reads_back(&c, 3, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_over_the_stream_bound_are_refused_at_once_and_the_stream_lives_on() {
    let zk = zk().await;
    init_store(&zk.connect_string()).await;
    let b = BookieNode::start(
        "b1",
        &zk.connect_string(),
        &["--adds-in-flight-per-stream-max=1"],
    )
    .await;
    let c = b.client().await;
    // 64 adds at once on the one stream: the first waits for its fsync, so
    // the ones read meanwhile are over the bound of 1.
    const N: i64 = 64;
    let all = futures::future::join_all((0..N).map(|e| add(&c, 5, e))).await;
    let ok = all.iter().filter(|s| **s == StatusCode::Ok).count();
    let refused = all
        .iter()
        .filter(|s| **s == StatusCode::TooManyRequests)
        .count();
    assert_eq!(
        ok + refused,
        N as usize,
        "every add answered Ok or TooManyRequests: {all:?}"
    );
    assert!(ok >= 1 && refused >= 1, "{ok} ok, {refused} refused");
    // The stream goes on: each refused add succeeds when retried alone.
    for (e, s) in all.iter().enumerate() {
        if *s == StatusCode::TooManyRequests {
            assert_eq!(add(&c, 5, e as i64).await, StatusCode::Ok, "retry of {e}");
        }
    }
    assert_reads_back(&c, 5, N).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_for_another_bookie_or_incarnation_are_refused() {
    let zk = zk().await;
    init_store(&zk.connect_string()).await;
    let b = BookieNode::start("b1", &zk.connect_string(), &[]).await;
    let connect = |id: &'static str, incarnation: u64| {
        let addr = b.grpc().to_string();
        async move {
            BookieClient::connect(id, incarnation, &addr, ClientOptions::default())
                .await
                .map(|_| ())
                .unwrap_err()
                .to_string()
        }
    };
    let stale = connect("b1", 2).await;
    assert!(stale.contains("not b1 incarnation 2"), "{stale}");
    let other = connect("b9", 1).await;
    assert!(other.contains("not b9 incarnation 1"), "{other}");
    // The right target is served.
    let info = b.client().await.info().await.unwrap();
    assert_eq!((info.bookie_id.as_str(), info.incarnation), ("b1", 1));
    assert!(info.writable && info.total_bytes > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_data_dir_refuses_to_start() {
    let zk = zk().await;
    init_store(&zk.connect_string()).await;
    let mut b = BookieNode::start("b1", &zk.connect_string(), &[]).await;
    let c = b.client().await;
    assert_eq!(add(&c, 1, 0).await, StatusCode::Ok);
    let status = b.process.stop().await.expect("it was running");
    assert!(status.success(), "SIGTERM drains and exits 0: {status}");
    std::fs::remove_dir_all(b.process.dir().join("ledgers")).unwrap();
    b.process.restart().await;
    eventually("the bookie refuses to start", 30_000, || {
        let exited = b.process.try_exit_status().is_some();
        async move { exited }
    })
    .await;
    let log = b.process.log_tail(50);
    assert!(
        log.contains("has no cookie") && log.contains("wiped"),
        "the refusal says what differs:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_disk_threshold_writes_are_refused_reads_served_and_the_node_moves() {
    let zk = zk().await;
    let store = init_store(&zk.connect_string()).await;
    let layout = Layout::new(ROOT).unwrap();
    let mut b = BookieNode::start("b1", &zk.connect_string(), &[]).await;
    let c = b.client().await;
    assert_eq!(add(&c, 1, 0).await, StatusCode::Ok);
    let ro = format!("{}/b1", layout.bookies_readonly());
    let av = format!("{}/b1", layout.bookies_available());
    assert!(store.exists(&av).await.unwrap().is_some());
    // Any disk is over a threshold of 0: restarted so, the bookie is read-only.
    b.set_config("disk_usage_threshold = 0.0\ndisk_usage_lwm = 0.0\n");
    b.process.restart().await;
    wait_registered_read_only(&store, "b1").await;
    let c = b.client().await;
    assert_eq!(add(&c, 1, 1).await, StatusCode::ReadOnly);
    assert_eq!(add(&c, 2, 0).await, StatusCode::ReadOnly);
    assert_reads_back(&c, 1, 1).await;
    let info = c.info().await.unwrap();
    assert!(!info.writable);
    // Back under the low-water mark: writable, registered under available/.
    b.set_config(BOOKIE_TEST_CONFIG);
    b.restart().await;
    assert!(store.exists(&av).await.unwrap().is_some());
    assert!(store.exists(&ro).await.unwrap().is_none());
    let c = b.client().await;
    assert_eq!(add(&c, 1, 1).await, StatusCode::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_after_acks_loses_no_acked_entry() {
    let zk = zk().await;
    init_store(&zk.connect_string()).await;
    let mut b = BookieNode::start("b1", &zk.connect_string(), &["--fault-injection"]).await;
    let c = b.client().await;
    let mut pending = Vec::new();
    for e in 0..300i64 {
        let c = c.clone();
        pending.push(tokio::spawn(async move { (e, add(&c, 9, e).await) }));
    }
    let mut acked = Vec::new();
    for p in pending {
        let (e, s) = p.await.unwrap();
        assert_eq!(s, StatusCode::Ok);
        acked.push(e);
    }
    // Power cut: every write not yet fdatasync'ed is discarded; the process aborts.
    let _ = b.post("/test/power-cut").await;
    eventually("the bookie dies at the power cut", 10_000, || {
        let gone = b.process.try_exit_status().is_some();
        async move { gone }
    })
    .await;
    b.process.restart().await;
    b.wait_ready().await;
    let c = b.client().await;
    assert_reads_back(&c, 9, acked.len() as i64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_failure_acks_nothing_of_its_group_and_stops_writes() {
    let zk = zk().await;
    let store = init_store(&zk.connect_string()).await;
    let b = BookieNode::start("b1", &zk.connect_string(), &["--fault-injection"]).await;
    let c = b.client().await;
    assert_eq!(add(&c, 1, 0).await, StatusCode::Ok);
    assert_eq!(b.post("/test/fail-next-sync").await, Some(200));
    assert_eq!(
        add(&c, 1, 1).await,
        StatusCode::IoError,
        "the add whose group failed to sync is not acked"
    );
    assert_eq!(
        add(&c, 1, 2).await,
        StatusCode::ReadOnly,
        "no retry-and-trust"
    );
    assert_eq!(add(&c, 2, 0).await, StatusCode::ReadOnly);
    // Reads are still served, and the registration moves to readonly/.
    assert_reads_back(&c, 1, 1).await;
    wait_registered_read_only(&store, "b1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_incarnation_answers_unknown_state_for_its_ledgers_and_kill_9_does_not() {
    let zk = zk().await;
    let store = init_store(&zk.connect_string()).await;
    // Ledger 42's metadata names b1 (as the ledger client will write it).
    create_ledger_metadata(&store, 42, &["b1"]).await;
    let mut b = BookieNode::start("b1", &zk.connect_string(), &[]).await;
    let c = b.client().await;
    for e in 0..3 {
        assert_eq!(add(&c, 42, e).await, StatusCode::Ok);
    }
    // A plain kill -9 restart under fsync-before-ack: nothing in limbo.
    b.kill_and_restart().await;
    let c = b.client().await;
    assert_reads_back(&c, 42, 3).await;
    let r = c.read(42, 3, None, "t").await.unwrap();
    assert_eq!(read_status(&r), StatusCode::NoEntry);
    // Format: a new incarnation that lost everything.
    b.process.stop().await;
    let dir = b.process.dir().to_path_buf();
    let out = std::process::Command::new(cms_tests::harness::bins::find("cms-bookie").unwrap())
        .current_dir(&dir)
        .args([
            "format",
            "--yes",
            &format!("--metadata-url=zk://{}", zk.connect_string()),
            "--bookie-id=b1",
            "--journal-dir=journal",
            "--ledger-dir=ledgers",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    b.process.restart().await;
    b.wait_ready().await;
    let c = b.client_for(2).await;
    for e in 0..4 {
        let r = c.read(42, e, None, "t").await.unwrap();
        assert_eq!(
            read_status(&r),
            StatusCode::UnknownLedgerState,
            "entry {e}: limbo is neither present nor absent"
        );
    }
    // The open ledger was fenced before the bookie registered.
    assert_eq!(
        c.add(42, 3, key(), false, entry(42, 3)).await.unwrap(),
        StatusCode::Fenced
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// Writes ledger `id`'s metadata node naming `bookies`.
async fn create_ledger_metadata(
    store: &std::sync::Arc<dyn cms_bookie::metadata::MetadataStore>,
    id: u64,
    bookies: &[&str],
) {
    let layout = Layout::new(ROOT).unwrap();
    let meta = LedgerMetadata {
        ledger_id: id,
        ensemble_size: bookies.len() as u32,
        write_quorum: bookies.len() as u32,
        ack_quorum: 1,
        status: LedgerStatus::LedgerOpen as i32,
        last_entry_id: -1,
        length: 0,
        segments: vec![Segment {
            first_entry_id: 0,
            ensemble: bookies.iter().map(|b| b.to_string()).collect(),
        }],
        digest_type: 0,
        password: b"pw".to_vec(),
        custom: Default::default(),
        ctime_ms: 0,
    };
    let path = layout.ledger(id);
    store
        .create_all(cms_bookie::metadata::parent_of(&path).unwrap())
        .await
        .unwrap();
    store
        .create(&path, &meta.encode_to_vec(), CreateMode::Persistent)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_deletes_only_ledgers_whose_metadata_is_gone_and_only_after_the_grace() {
    let zk = zk().await;
    let store = init_store(&zk.connect_string()).await;
    create_ledger_metadata(&store, 1, &["b1"]).await;
    let b = BookieNode::start(
        "b1",
        &zk.connect_string(),
        &[
            "--gc-interval-ms=200",
            "--gc-grace-ms=3000",
            "--checkpoint-interval-ms=200",
        ],
    )
    .await;
    let c = b.client().await;
    for e in 0..5 {
        assert_eq!(add(&c, 1, e).await, StatusCode::Ok);
        assert_eq!(add(&c, 2, e).await, StatusCode::Ok);
    }
    // Ledger 2 has no metadata, but it is younger than the grace period.
    assert_reads_back(&c, 2, 5).await;
    eventually(
        "GC deletes ledger 2 (no metadata) after the grace",
        30_000,
        || {
            let c = c.clone();
            async move {
                let r = c.read(2, 0, None, "t").await.unwrap();
                read_status(&r) == StatusCode::NoLedger
            }
        },
    )
    .await;
    // Ledger 1 (metadata present) is untouched.
    assert_reads_back(&c, 1, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_entry_log_is_an_io_error_never_no_entry() {
    let zk = zk().await;
    init_store(&zk.connect_string()).await;
    let mut b = BookieNode::start("b1", &zk.connect_string(), &[]).await;
    let c = b.client().await;
    for e in 0..50 {
        assert_eq!(add(&c, 6, e).await, StatusCode::Ok);
    }
    // SIGTERM checkpoints: the entries are in an entry log, the journal trimmed.
    assert!(b.process.stop().await.unwrap().success());
    let logs: Vec<_> = std::fs::read_dir(b.process.dir().join("ledgers/current"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    let mut flipped = 0;
    for log in &logs {
        let mut bytes = std::fs::read(log).unwrap();
        if bytes.len() < 4096 {
            continue;
        }
        // Flip bytes spread over the records, past any file header.
        for at in (bytes.len() / 4..bytes.len()).step_by(bytes.len() / 8) {
            bytes[at] ^= 0xFF;
            flipped += 1;
        }
        std::fs::write(log, bytes).unwrap();
    }
    assert!(flipped > 0, "no entry log with data found in {logs:?}");
    b.process.restart().await;
    b.wait_ready().await;
    let c = b.client().await;
    let (mut ok, mut io) = (0, 0);
    for e in 0..50 {
        let r = c.read(6, e, None, "t").await.unwrap();
        match read_status(&r) {
            StatusCode::Ok => {
                assert_eq!(r.body, entry(6, e), "an OK read is byte-identical");
                ok += 1;
            }
            StatusCode::IoError => io += 1,
            other => panic!("entry {e}: corruption answered {other:?}, not IO_ERROR"),
        }
    }
    assert!(io > 0, "the flipped bytes were detected ({ok} ok)");
}

/// Invariant 8 on the bookie: one fairness key floods range reads until its
/// queue is full (reads refused TOO_MANY_REQUESTS), and meanwhile adds keep
/// completing (the journal path never waits on a read slot) and another key's
/// small read is served. Judged by outcomes and the scheduler's counters, not
/// by latency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_and_other_keys_go_on_while_one_key_saturates_the_read_queue() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let zk = zk().await;
    init_store(&zk.connect_string()).await;
    let b = BookieNode::start(
        "b1",
        &zk.connect_string(),
        &[
            "--reads-in-flight-max=1",
            "--reads-per-key-in-flight-max=1",
            "--read-queue-requests-per-key-max=4",
        ],
    )
    .await;
    let c = b.client().await;
    // Ledger 1: 16 entries of 16 KiB for the flood; ledger 3: one small entry.
    let big = vec![b'x'; 16 * 1024];
    for e in 0..16i64 {
        let body = Entry::encode(
            EntryHeader {
                ledger_id: 1,
                entry_id: e,
                lac: e - 1,
                length: 0,
            },
            &big,
        );
        assert_eq!(
            c.add(1, e, key(), false, body).await.unwrap(),
            StatusCode::Ok
        );
    }
    assert_eq!(add(&c, 3, 0).await, StatusCode::Ok);

    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let mut flooders = Vec::new();
    for _ in 0..8 {
        let (c, stop, served) = (c.clone(), stop.clone(), served.clone());
        flooders.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = c.read_range(1, 0, 16, 1 << 20, "flood").await.unwrap();
                match StatusCode::try_from(r.status) {
                    Ok(StatusCode::Ok) => {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(StatusCode::TooManyRequests) => {
                        // Paces the retry; correctness does not depend on it.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    other => panic!("flood read answered {other:?}"),
                }
            }
        }));
    }
    let refused = |addr| async move {
        cms_tests::cluster::metric_value(addr, "cms_bookie_read_sched_refused_total")
            .await
            .unwrap_or(0.0)
    };
    let http = b.http();
    eventually(
        "the flood key's queue is full (reads refused)",
        30_000,
        || async move { refused(http).await > 0.0 },
    )
    .await;
    let refused_before = refused(http).await;

    // Adds, one after another (each waits for its fsync), while flooded.
    for e in 0..100i64 {
        assert_eq!(add(&c, 2, e).await, StatusCode::Ok, "add {e} while flooded");
    }
    // Another key's small read is served while the flood key is saturated.
    let r = c.read(3, 0, None, "tail").await.unwrap();
    assert_eq!(read_status(&r), StatusCode::Ok);
    assert_eq!(r.body, entry(3, 0));
    let refused_after = refused(http).await;
    assert!(
        refused_after > refused_before,
        "the flood key stayed saturated during the adds ({refused_before} -> {refused_after})"
    );
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.await.unwrap();
    }
    assert!(
        served.load(Ordering::Relaxed) > 0,
        "the flood key progressed"
    );
    assert_reads_back(&c, 2, 100).await;
}
