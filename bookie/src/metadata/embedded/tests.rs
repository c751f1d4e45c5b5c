//! Embedded-only behaviour: persistence across reopen, ephemerals never on disk,
//! one backend per file per process, group commit, clear errors for a corrupt
//! or locked file, and no acknowledged write lost to `kill -9`. The behaviour
//! shared with ZooKeeper is in `cms-tests`' conformance suite.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::metadata::WatchEvent;

/// Env var that turns a test of this binary into the child half of a
/// two-process test: `<role>:<file path>`.
const CHILD_ENV: &str = "CMS_EMBEDDED_TEST_CHILD";
const CHILD_WAIT_MS_MAX: u64 = 60_000;

fn open(path: &Path) -> Arc<EmbeddedBackend> {
    EmbeddedBackend::open(path).unwrap()
}

/// Drops the backend and waits until the file is closed (the Weak is dead and
/// the writer thread joined: `Drop` joins it).
fn shut(backend: Arc<EmbeddedBackend>) {
    let weak = Arc::downgrade(&backend);
    drop(backend);
    assert!(
        weak.upgrade().is_none(),
        "a session still holds the backend"
    );
}

#[tokio::test]
async fn persistent_nodes_versions_and_counters_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("meta.redb");
    let backend = open(&file);
    let s = backend.session();
    s.create("/a", b"one", CreateMode::Persistent)
        .await
        .unwrap();
    s.set("/a", b"two", Expected::Version(0)).await.unwrap();
    s.create("/a/b", b"", CreateMode::Persistent).await.unwrap();
    let (first, _) = s
        .create("/a/n-", b"", CreateMode::PersistentSequential)
        .await
        .unwrap();
    s.delete(&first, Expected::Any).await.unwrap();
    s.create("/gone", b"x", CreateMode::Persistent)
        .await
        .unwrap();
    s.delete("/gone", Expected::Version(0)).await.unwrap();
    drop(s);
    shut(backend);

    let backend = open(&file);
    let s = backend.session();
    let (data, stat) = s.get("/a").await.unwrap();
    assert_eq!(data, b"two");
    assert_eq!(stat.version, 1);
    assert_eq!(stat.num_children, 1);
    assert_eq!(s.children("/a").await.unwrap(), vec!["b".to_string()]);
    assert_eq!(s.exists("/gone").await.unwrap(), None);
    let (next, _) = s
        .create("/a/n-", b"", CreateMode::PersistentSequential)
        .await
        .unwrap();
    assert_eq!(first, "/a/n-0000000000");
    assert_eq!(
        next, "/a/n-0000000001",
        "the counter never repeats across restarts"
    );
}

#[tokio::test]
async fn ephemerals_are_never_persisted_but_their_sequence_numbers_are() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("meta.redb");
    let backend = open(&file);
    let s = backend.session();
    s.create("/p", b"", CreateMode::Persistent).await.unwrap();
    s.create("/p/e", b"", CreateMode::Ephemeral).await.unwrap();
    let (seq, _) = s
        .create("/p/s-", b"", CreateMode::EphemeralSequential)
        .await
        .unwrap();
    assert_eq!(seq, "/p/s-0000000000");
    // Kept alive across the reopen would share the backend: end it by drop.
    drop(s);
    shut(backend);

    let backend = open(&file);
    let s = backend.session();
    assert!(s.children("/p").await.unwrap().is_empty());
    let (seq, _) = s
        .create("/p/s-", b"", CreateMode::EphemeralSequential)
        .await
        .unwrap();
    assert_eq!(seq, "/p/s-0000000001");
}

#[tokio::test]
async fn opening_the_same_file_twice_in_a_process_shares_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("meta.redb");
    let a = open(&file);
    let b = open(&dir.path().join(".").join("meta.redb"));
    assert!(Arc::ptr_eq(&a, &b));
    let s1 = a.session();
    let s2 = EmbeddedStore::open(&file).await.unwrap();
    assert!(Arc::ptr_eq(&a, s2.backend()));
    assert_ne!(s1.session_id(), s2.session_id());
    s1.create("/x", b"1", CreateMode::Ephemeral).await.unwrap();
    let (_, stat) = s2.get("/x").await.unwrap();
    assert_eq!(stat.ephemeral_owner, s1.session_id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_share_fsyncs() {
    const CREATES: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let backend = open(&dir.path().join("meta.redb"));
    let s = backend.session();
    s.create("/g", b"", CreateMode::Persistent).await.unwrap();
    let before = backend.commits();
    let tasks: Vec<_> = (0..CREATES)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                s.create(&format!("/g/n{i}"), b"v", CreateMode::Persistent)
                    .await
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let commits = backend.commits() - before;
    assert_eq!(s.children("/g").await.unwrap().len(), CREATES);
    assert!(commits >= 2, "at least two batches: {commits}");
    assert!(
        (commits as usize) <= CREATES / 4,
        "{CREATES} concurrent creates took {commits} commits; group commit is not batching"
    );
}

#[tokio::test]
async fn a_batch_is_bounded_by_commit_batch_ops_max() {
    let dir = tempfile::tempdir().unwrap();
    let config = EmbeddedConfig {
        commit_batch_ops_max: 1,
        ..EmbeddedConfig::default()
    };
    let backend = EmbeddedBackend::open_with(&dir.path().join("meta.redb"), config).unwrap();
    let s = backend.session();
    let before = backend.commits();
    let futs: Vec<_> = (0..20)
        .map(|i| {
            let s = s.clone();
            async move {
                s.create(&format!("/n{i}"), b"", CreateMode::Persistent)
                    .await
            }
        })
        .collect();
    for r in futures::future::join_all(futs).await {
        r.unwrap();
    }
    assert_eq!(backend.commits() - before, 20);
}

#[tokio::test]
async fn a_corrupt_file_is_a_clear_storage_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("garbage.redb");
    std::fs::write(&file, vec![0xA5u8; 64 * 1024]).unwrap();
    match EmbeddedBackend::open(&file) {
        Err(MetadataError::Storage(msg)) => {
            assert!(msg.contains("garbage.redb"), "{msg}");
            assert!(msg.contains("corrupt"), "{msg}");
        }
        other => panic!("expected a Storage error, got {other:?}"),
    }

    // A valid file in a format this build does not read.
    let file = dir.path().join("future.redb");
    shut(open(&file));
    {
        let db = redb::Database::open(&file).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let meta: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("meta");
            let mut t = txn.open_table(meta).unwrap();
            t.insert("format", 99).unwrap();
        }
        txn.commit().unwrap();
    }
    match EmbeddedBackend::open(&file) {
        Err(MetadataError::Storage(msg)) => assert!(msg.contains("format 99"), "{msg}"),
        other => panic!("expected a Storage error, got {other:?}"),
    }
}

#[tokio::test]
async fn dropping_the_last_clone_ends_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(&dir.path().join("meta.redb"));
    let owner = backend.session();
    let observer = backend.session();
    owner
        .create("/e", b"", CreateMode::Ephemeral)
        .await
        .unwrap();
    let mut events = owner.session_events();
    let mut watch = observer.watch_data("/e").await.unwrap();
    let clone = owner.clone();
    drop(owner);
    assert!(
        observer.exists("/e").await.unwrap().is_some(),
        "a clone still holds the session"
    );
    drop(clone);
    let ev = tokio::time::timeout(Duration::from_secs(10), watch.recv())
        .await
        .unwrap();
    assert_eq!(ev, Some(WatchEvent::Deleted("/e".into())));
    assert_eq!(observer.exists("/e").await.unwrap(), None);
    tokio::time::timeout(
        Duration::from_secs(10),
        events.wait_for(|s| *s == SessionState::Closed),
    )
    .await
    .unwrap()
    .unwrap();
}

#[tokio::test]
async fn expiry_deletes_ephemerals_then_reports_expired() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(&dir.path().join("meta.redb"));
    let s = backend.session();
    let other = backend.session();
    s.create("/e", b"", CreateMode::Ephemeral).await.unwrap();
    let mut mine = s.watch_data("/x").await.unwrap();
    let mut events = s.session_events();
    s.expire_session_for_test();
    assert_eq!(s.get("/").await, Err(MetadataError::SessionExpired));
    assert_eq!(
        s.create("/y", b"", CreateMode::Persistent).await,
        Err(MetadataError::SessionExpired)
    );
    tokio::time::timeout(
        Duration::from_secs(10),
        events.wait_for(|s| *s == SessionState::Expired),
    )
    .await
    .unwrap()
    .unwrap();
    // Expired is published only after the ephemerals are gone.
    assert_eq!(other.exists("/e").await.unwrap(), None);
    assert_eq!(mine.recv().await, None, "the expired session's watches end");
    // Closing an expired session does not hang and changes nothing.
    s.close().await;
    assert_eq!(*s.session_events().borrow(), SessionState::Expired);
}

#[tokio::test]
async fn a_slow_watch_consumer_is_cut_off_and_dropping_a_watch_unregisters_it() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(&dir.path().join("meta.redb"));
    let s = backend.session();
    s.create("/w", b"", CreateMode::Persistent).await.unwrap();
    let mut slow = s.watch_data("/w").await.unwrap();
    let dropped = s.watch_data("/w").await.unwrap();
    assert_eq!(lock(&backend.shared.committed).watch_count(), 2);
    drop(dropped);
    assert_eq!(lock(&backend.shared.committed).watch_count(), 1);
    for _ in 0..super::super::WATCH_EVENTS_MAX + 1 {
        s.set("/w", b"", Expected::Any).await.unwrap();
    }
    let mut seen = 0;
    while let Some(ev) = slow.recv().await {
        assert_eq!(ev, WatchEvent::DataChanged("/w".into()));
        seen += 1;
    }
    assert_eq!(seen, super::super::WATCH_EVENTS_MAX);
    assert_eq!(lock(&backend.shared.committed).watch_count(), 0);
}

/// Runs `test` of this binary again as a child process with `CHILD_ENV` set.
fn spawn_child(test: &str, role: &str, file: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{role}:{}", file.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn child_role() -> Option<(String, PathBuf)> {
    let v = std::env::var(CHILD_ENV).ok()?;
    let (role, path) = v.split_once(':')?;
    Some((role.to_string(), PathBuf::from(path)))
}

/// Waits for the child with a deadline; kills it if it overruns.
fn wait_child(mut child: std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_millis(CHILD_WAIT_MS_MAX);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child process did not finish within {CHILD_WAIT_MS_MAX} ms (hang?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_process_is_refused_at_once_with_a_clear_error() {
    const TEST: &str =
        "metadata::embedded::tests::a_second_process_is_refused_at_once_with_a_clear_error";
    if let Some((role, file)) = child_role() {
        assert_eq!(role, "lock");
        match EmbeddedBackend::open(&file) {
            Err(MetadataError::Storage(msg)) => {
                println!("child-error {msg}");
                assert!(msg.contains("already in use by another process"), "{msg}");
            }
            other => panic!("second process opened the file: {other:?}"),
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("meta.redb");
    let backend = open(&file);
    let child = spawn_child(TEST, "lock", &file);
    let status = wait_child(child);
    assert!(status.success(), "child saw no clear refusal: {status}");
    drop(backend);
}

#[test]
fn kill_9_loses_no_acknowledged_write() {
    const TEST: &str = "metadata::embedded::tests::kill_9_loses_no_acknowledged_write";
    const WRITERS: usize = 8;
    const ACKS_BEFORE_KILL: usize = 400;
    if let Some((role, file)) = child_role() {
        assert_eq!(role, "crash");
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let s = EmbeddedStore::open(&file).await.unwrap();
            s.create_all("/crash").await.unwrap();
            let tasks: Vec<_> = (0..WRITERS)
                .map(|w| {
                    let s = s.clone();
                    tokio::spawn(async move {
                        for i in 0u64.. {
                            let path = format!("/crash/w{w}-{i}");
                            s.create(&path, path.as_bytes(), CreateMode::Persistent)
                                .await
                                .unwrap();
                            let mut out = std::io::stdout().lock();
                            writeln!(out, "ack {path}").unwrap();
                            out.flush().unwrap();
                        }
                    })
                })
                .collect();
            for t in tasks {
                let _ = t.await;
            }
        });
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("meta.redb");
    let mut child = spawn_child(TEST, "crash", &file);
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(path) = line.strip_prefix("ack ")
                && tx.send(path.to_string()).is_err()
            {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_millis(CHILD_WAIT_MS_MAX);
    let mut acked = Vec::new();
    while acked.len() < ACKS_BEFORE_KILL {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(p) => acked.push(p),
            Err(e) => {
                let _ = child.kill();
                panic!(
                    "child stopped acknowledging after {} writes: {e}",
                    acked.len()
                );
            }
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap();
    // Acks printed between our last read and the kill count too.
    acked.extend(rx.try_iter());

    let backend = open(&file);
    let s = backend.session();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for path in &acked {
            let (data, _) = s
                .get(path)
                .await
                .unwrap_or_else(|e| panic!("acknowledged {path} lost after kill -9: {e}"));
            assert_eq!(data, path.as_bytes());
        }
    });
}
