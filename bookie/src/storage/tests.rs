//! Behaviour of the ledger storage: round trips through the write cache, the
//! entry logs and a restart; corruption reported as corruption; idempotent
//! replay; ranges; read-ahead; GC and compaction (also with only the reserved
//! space free); the write-cache bound; many ledger states across a restart.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;
use crate::fs::{DiskSpace, Fs, FsFile, OpenMode, RealFs};

/// `RealFs` with a configurable free space and an injectable entry-log sync failure.
#[derive(Debug, Default)]
struct TestFs {
    /// `u64::MAX` = report the real free space.
    available_bytes: AtomicU64,
    fail_next_log_sync: Arc<AtomicBool>,
}

impl TestFs {
    fn new() -> Arc<TestFs> {
        Arc::new(TestFs {
            available_bytes: AtomicU64::new(u64::MAX),
            fail_next_log_sync: Arc::new(AtomicBool::new(false)),
        })
    }
}

#[derive(Debug)]
struct TestFile {
    inner: Arc<dyn FsFile>,
    fail_sync: Option<Arc<AtomicBool>>,
}

impl FsFile for TestFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn write_out(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_out(offset, len)
    }
    fn sync_data(&self) -> io::Result<()> {
        if let Some(flag) = &self.fail_sync
            && flag.swap(false, Ordering::SeqCst)
        {
            return Err(io::Error::other("injected fdatasync failure"));
        }
        self.inner.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

impl Fs for TestFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FsFile>> {
        let is_log = path.extension().is_some_and(|e| e == "log");
        Ok(Arc::new(TestFile {
            inner: RealFs.open(path, mode)?,
            fail_sync: is_log.then(|| self.fail_next_log_sync.clone()),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        RealFs.create_dir_all(path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        RealFs.read_dir(path)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealFs.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealFs.rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        RealFs.sync_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        RealFs.exists(path)
    }
    fn space(&self, path: &Path) -> io::Result<DiskSpace> {
        let real = RealFs.space(path)?;
        let available = self.available_bytes.load(Ordering::SeqCst);
        if available == u64::MAX {
            return Ok(real);
        }
        Ok(DiskSpace {
            total_bytes: real.total_bytes,
            available_bytes: available,
        })
    }
}

fn config(dir: &Path) -> StorageConfig {
    StorageConfig {
        ledger_dir: dir.to_path_buf(),
        entry_log_bytes_max: 64 << 10,
        write_cache_bytes_max: 1 << 20,
        read_cache_bytes_max: 1 << 20,
        index_cache_bytes_max: 16 << 20,
        read_ahead_entries_max: 100,
        read_ahead_bytes_max: 1 << 20,
        // Small pieces: every read-ahead below goes to the disk in several.
        read_io_bytes_max: 8 << 10,
        read_io_class: ReadIoClass::Idle,
        compaction_threshold: 0.5,
        reserved_bytes: 256 << 10,
    }
}

fn open_with(fs: SharedFs, cfg: &StorageConfig) -> LedgerStorage {
    LedgerStorage::open(fs, cfg.clone(), StorageMetrics::unregistered()).unwrap()
}

fn open(cfg: &StorageConfig) -> LedgerStorage {
    open_with(Arc::new(RealFs), cfg)
}

/// Distinct, recognisable bytes for `(ledger, entry)`, `len` long.
fn data(ledger_id: u64, entry_id: i64, len: usize) -> Bytes {
    let tag = format!("ledger {ledger_id} entry {entry_id};");
    Bytes::from(
        tag.bytes()
            .cycle()
            .take(len.max(tag.len()))
            .collect::<Vec<u8>>(),
    )
}

fn log_ids(dir: &Path) -> Vec<u32> {
    LogFiles::new(Arc::new(RealFs), dir.join("current"))
        .list()
        .unwrap()
}

fn log_bytes(dir: &Path) -> u64 {
    log_ids(dir)
        .iter()
        .map(|id| {
            let path = entry_log::log_path(&dir.join("current"), *id);
            std::fs::metadata(path).unwrap().len()
        })
        .sum()
}

#[test]
fn entries_round_trip_through_write_cache_logs_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let s = open(&cfg);
    for l in 1..=3u64 {
        for e in 0..5i64 {
            s.put_entry(l, e, data(l, e, 300)).unwrap();
        }
    }
    // From the write cache (tailing read), before any flush.
    assert_eq!(s.get_entry(2, 4).unwrap(), Some(data(2, 4, 300)));
    assert_eq!(s.metrics.read_cache_misses.get(), 0);
    assert_eq!(s.last_entry_id(2).unwrap(), Some(4));
    s.flush().unwrap();
    assert_eq!(s.metrics.write_cache_bytes.get(), 0);
    // From the entry logs.
    for l in 1..=3u64 {
        for e in 0..5i64 {
            assert_eq!(s.get_entry(l, e).unwrap(), Some(data(l, e, 300)));
        }
    }
    assert_eq!(s.get_entry(2, 5).unwrap(), None);
    assert_eq!(s.get_entry(9, 0).unwrap(), None);
    s.close().unwrap();
    assert_eq!(s.get_entry(1, 0), Err(StorageError::Closed));
    drop(s);
    // After a restart.
    let s = open(&cfg);
    for l in 1..=3u64 {
        for e in 0..5i64 {
            assert_eq!(s.get_entry(l, e).unwrap(), Some(data(l, e, 300)));
        }
        assert_eq!(s.last_entry_id(l).unwrap(), Some(4));
    }
    assert_eq!(s.ledger_ids().unwrap(), vec![1, 2, 3]);
    assert_eq!(s.last_entry_id(9).unwrap(), None);
}

#[test]
fn entries_not_flushed_are_gone_after_restart_and_come_back_by_replay() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let s = open(&cfg);
    s.put_entry(1, 0, data(1, 0, 10)).unwrap();
    s.flush().unwrap();
    s.put_entry(1, 1, data(1, 1, 10)).unwrap();
    drop(s); // crash: no flush
    let s = open(&cfg);
    assert_eq!(s.get_entry(1, 0).unwrap(), Some(data(1, 0, 10)));
    assert_eq!(s.get_entry(1, 1).unwrap(), None);
    // Journal replay.
    s.put_entry(1, 0, data(1, 0, 10)).unwrap();
    s.put_entry(1, 1, data(1, 1, 10)).unwrap();
    s.flush().unwrap();
    assert_eq!(s.get_entry(1, 1).unwrap(), Some(data(1, 1, 10)));
}

#[test]
fn a_replay_writes_only_the_entries_not_yet_indexed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let s = open(&cfg);
    let written = |s: &LedgerStorage| s.metrics.entry_log_bytes_written.get();
    for e in [0, 2, 4] {
        s.put_entry(1, e, data(1, e, 100)).unwrap();
    }
    s.put_entry(2, 1, data(2, 1, 100)).unwrap();
    s.flush().unwrap();
    let record = written(&s) / 4;
    assert!(record >= 100);
    // A journal replay re-adds them among new entries, indexed ones first,
    // last and in between, over several ledgers.
    for e in 0..6 {
        s.put_entry(1, e, data(1, e, 100)).unwrap();
    }
    for e in 0..3 {
        s.put_entry(2, e, data(2, e, 100)).unwrap();
    }
    s.put_entry(3, 0, data(3, 0, 100)).unwrap();
    let before = written(&s);
    s.flush().unwrap();
    // New: ledger 1's 1, 3, 5; ledger 2's 0, 2; ledger 3's 0.
    assert_eq!(written(&s) - before, 6 * record);
    drop(s);
    let s = open(&cfg);
    for (l, n) in [(1, 6), (2, 3), (3, 1)] {
        for e in 0..n {
            assert_eq!(s.get_entry(l, e).unwrap(), Some(data(l, e, 100)), "{l}/{e}");
        }
    }
}

fn flip_byte(path: &Path, offset: u64) {
    let f = RealFs.open(path, OpenMode::ReadWrite).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x40;
    f.write_at(&b, offset).unwrap();
    f.sync_data().unwrap();
}

#[test]
fn flipped_byte_in_entry_log_is_corrupt_never_absent() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let s = open(&cfg);
    s.put_entry(5, 0, data(5, 0, 100)).unwrap();
    s.put_entry(5, 1, data(5, 1, 100)).unwrap();
    s.close().unwrap();
    drop(s);
    let logs = log_ids(dir.path());
    assert_eq!(logs.len(), 1);
    let path = entry_log::log_path(&dir.path().join("current"), logs[0]);
    // A byte of entry 0's data.
    flip_byte(
        &path,
        LOG_HEADER_BYTES + entry_log::RECORD_PREFIX_BYTES as u64 + 7,
    );
    let s = open(&cfg);
    assert!(matches!(
        s.get_entry(5, 0),
        Err(StorageError::Corrupt {
            ledger_id: 5,
            entry_id: 0,
            ..
        })
    ));
    assert!(matches!(
        s.get_range(5, 0, 10, 1 << 20),
        Err(StorageError::Corrupt { .. })
    ));
    // The neighbour is intact (its own record CRC).
    assert_eq!(s.get_entry(5, 1).unwrap(), Some(data(5, 1, 100)));
}

#[test]
fn truncated_or_missing_entry_log_is_corrupt_never_absent() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let s = open(&cfg);
    s.put_entry(5, 0, data(5, 0, 100)).unwrap();
    s.close().unwrap();
    drop(s);
    let path = entry_log::log_path(&dir.path().join("current"), log_ids(dir.path())[0]);
    RealFs
        .open(&path, OpenMode::ReadWrite)
        .unwrap()
        .set_len(LOG_HEADER_BYTES + 30)
        .unwrap();
    let s = open(&cfg);
    assert!(matches!(
        s.get_entry(5, 0),
        Err(StorageError::Corrupt { .. })
    ));
    drop(s);
    std::fs::remove_file(&path).unwrap();
    let s = open(&cfg);
    assert!(matches!(
        s.get_entry(5, 0),
        Err(StorageError::Corrupt { .. })
    ));
}

#[test]
fn re_put_after_reopen_keeps_one_copy() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let s = open(&cfg);
    for e in 0..10 {
        s.put_entry(3, e, data(3, e, 200)).unwrap();
    }
    s.close().unwrap();
    drop(s);
    let s = open(&cfg);
    let before = log_bytes(dir.path());
    // Journal replay of the same entries after a restart.
    for e in 0..10 {
        s.put_entry(3, e, data(3, e, 200)).unwrap();
    }
    s.flush().unwrap();
    assert_eq!(
        s.metrics.entry_log_bytes_written.get(),
        0,
        "replayed entries were written again"
    );
    assert_eq!(log_bytes(dir.path()), before);
    assert_eq!(s.get_range(3, 0, 100, 1 << 20).unwrap().len(), 10);
    assert_eq!(s.get_entry(3, 9).unwrap(), Some(data(3, 9, 200)));
}

#[test]
fn get_range_stops_at_the_first_gap_and_at_the_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&config(dir.path()));
    for e in [0i64, 1, 2, 3, 5, 6] {
        s.put_entry(1, e, data(1, e, 100)).unwrap();
    }
    s.put_entry(2, 4, data(2, 4, 100)).unwrap();
    for flushed in [false, true] {
        if flushed {
            s.flush().unwrap();
        }
        let all = s.get_range(1, 0, 100, 1 << 20).unwrap();
        assert_eq!(all, (0..4).map(|e| data(1, e, 100)).collect::<Vec<_>>());
        assert_eq!(s.get_range(1, 1, 2, 1 << 20).unwrap().len(), 2);
        // Byte bound: two entries fit in 250 bytes, not three.
        assert_eq!(s.get_range(1, 0, 100, 250).unwrap().len(), 2);
        // At least one entry even if it alone exceeds the byte bound.
        assert_eq!(s.get_range(1, 0, 100, 1).unwrap().len(), 1);
        assert!(s.get_range(1, 4, 100, 1 << 20).unwrap().is_empty());
        assert_eq!(s.get_range(1, 5, 100, 1 << 20).unwrap().len(), 2);
        assert!(s.get_range(1, 0, 0, 1 << 20).unwrap().is_empty());
    }
}

#[test]
fn read_ahead_after_one_miss_serves_the_next_entries_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.read_ahead_entries_max = 5;
    let s = open(&cfg);
    for l in [1u64, 2] {
        for e in 0..20 {
            s.put_entry(l, e, data(l, e, 100)).unwrap();
        }
    }
    s.flush().unwrap();
    let m = &s.metrics;
    assert_eq!(s.get_entry(1, 0).unwrap(), Some(data(1, 0, 100)));
    assert_eq!((m.read_cache_misses.get(), m.read_cache_hits.get()), (1, 0));
    // Entries 1..=5 read ahead: data plus the per-entry overhead each.
    assert_eq!(
        m.read_cache_bytes.get(),
        5 * (100 + read_cache::ENTRY_OVERHEAD_BYTES as i64)
    );
    let read_once = m.entry_log_bytes_read.get();
    for e in 1..=5 {
        assert_eq!(s.get_entry(1, e).unwrap(), Some(data(1, e, 100)));
    }
    assert_eq!((m.read_cache_misses.get(), m.read_cache_hits.get()), (1, 5));
    assert_eq!(
        m.entry_log_bytes_read.get(),
        read_once,
        "read-ahead hits read no log"
    );
    // Past the read-ahead bound: a new miss, which reads ahead again.
    s.get_entry(1, 6).unwrap();
    s.get_entry(1, 7).unwrap();
    assert_eq!((m.read_cache_misses.get(), m.read_cache_hits.get()), (2, 6));
    // Read-ahead never crosses into another ledger.
    assert_eq!(s.get_entry(1, 19).unwrap(), Some(data(1, 19, 100)));
    s.get_entry(2, 0).unwrap();
    assert_eq!(m.read_cache_misses.get(), 4);
    // Deleting a ledger drops its cached entries from the gauge too.
    let before = m.read_cache_bytes.get();
    s.delete_ledger(2).unwrap();
    assert!(
        m.read_cache_bytes.get() < before,
        "read cache gauge after a delete"
    );
}

#[test]
fn read_ahead_is_bounded_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.read_ahead_bytes_max = 2 * (100 + entry_log::RECORD_PREFIX_BYTES);
    let s = open(&cfg);
    for e in 0..10 {
        s.put_entry(1, e, data(1, e, 100)).unwrap();
    }
    s.flush().unwrap();
    for e in 0..4 {
        s.get_entry(1, e).unwrap();
    }
    let m = &s.metrics;
    assert_eq!((m.read_cache_misses.get(), m.read_cache_hits.get()), (2, 2));
}

/// Puts `ledgers` ledgers × `entries` entries, one flush per entry id (so every
/// log interleaves all ledgers), closes, and reopens (the logs written become
/// eligible for GC: the reopened storage appends to a new log).
fn fill(
    cfg: &StorageConfig,
    ledgers: std::ops::RangeInclusive<u64>,
    entries: i64,
    len: usize,
) -> LedgerStorage {
    let s = open(cfg);
    for e in 0..entries {
        for l in ledgers.clone() {
            s.put_entry(l, e, data(l, e, len)).unwrap();
            s.set_ledger_state(
                l,
                LedgerState {
                    master_key: Bytes::from_static(b"key"),
                    ..LedgerState::default()
                },
            )
            .unwrap();
        }
        s.flush().unwrap();
    }
    s.close().unwrap();
    drop(s);
    open(cfg)
}

#[test]
fn gc_removes_logs_whose_ledgers_are_all_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let s = fill(&cfg, 1..=4, 40, 1000);
    let logs = log_ids(dir.path());
    assert!(logs.len() >= 2, "want several logs, got {logs:?}");
    // Nothing deleted: nothing reclaimed, every log kept.
    assert_eq!(s.gc_and_compact().unwrap(), 0);
    assert_eq!(log_ids(dir.path()), logs);
    let before = s.disk_bytes().unwrap();
    for l in 1..=4 {
        s.delete_ledger(l).unwrap();
    }
    assert_eq!(s.ledger_state(1).unwrap(), None);
    assert_eq!(s.get_entry(1, 0).unwrap(), None);
    assert!(s.ledger_ids().unwrap().is_empty());
    let reclaimed = s.gc_and_compact().unwrap();
    assert!(log_ids(dir.path()).is_empty());
    assert_eq!(s.disk_bytes().unwrap(), before - reclaimed);
    assert!(reclaimed > 160_000);
}

#[test]
fn compaction_keeps_live_ledgers_byte_identical_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let s = fill(&cfg, 1..=8, 30, 500);
    let old_logs = log_ids(dir.path());
    assert!(old_logs.len() >= 2, "want several logs, got {old_logs:?}");
    let before = s.disk_bytes().unwrap();
    // 6 of 8 ledgers deleted: every log is 25 % live, below the 0.5 threshold.
    for l in 1..=6 {
        s.delete_ledger(l).unwrap();
    }
    let reclaimed = s.gc_and_compact().unwrap();
    assert!(reclaimed > 0);
    let after = s.disk_bytes().unwrap();
    assert!(after < before, "disk {before} -> {after}");
    let new_logs = log_ids(dir.path());
    assert!(
        new_logs.iter().all(|id| !old_logs.contains(id)),
        "old logs {old_logs:?} still there: {new_logs:?}"
    );
    // A second pass has nothing left to do on the old logs.
    assert_eq!(s.gc_and_compact().unwrap(), 0);
    s.close().unwrap();
    drop(s);
    let s = open(&cfg);
    for l in 7..=8u64 {
        for e in 0..30 {
            assert_eq!(s.get_entry(l, e).unwrap(), Some(data(l, e, 500)), "{l}:{e}");
        }
        assert!(s.ledger_state(l).unwrap().is_some());
    }
    assert_eq!(s.ledger_ids().unwrap(), vec![7, 8]);
}

#[test]
fn compaction_works_with_only_the_reserved_space_free() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let fs = TestFs::new();
    drop(fill(&cfg, 1..=8, 30, 500));
    let s = open_with(fs.clone(), &cfg);
    let old_logs = log_ids(dir.path());
    for l in 1..=6 {
        s.delete_ledger(l).unwrap();
    }
    // The disk is "full" but for the reserved space.
    fs.available_bytes
        .store(cfg.reserved_bytes, Ordering::SeqCst);
    assert!(s.gc_and_compact().unwrap() > 0);
    assert!(log_ids(dir.path()).iter().all(|id| !old_logs.contains(id)));
    for l in 7..=8u64 {
        for e in 0..30 {
            assert_eq!(s.get_entry(l, e).unwrap(), Some(data(l, e, 500)));
        }
    }
}

#[test]
fn compaction_skips_a_log_whose_live_data_does_not_fit_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let fs = TestFs::new();
    drop(fill(&cfg, 1..=8, 30, 500));
    let s = open_with(fs.clone(), &cfg);
    let old_logs = log_ids(dir.path());
    for l in 1..=6 {
        s.delete_ledger(l).unwrap();
    }
    fs.available_bytes.store(100, Ordering::SeqCst);
    assert_eq!(s.gc_and_compact().unwrap(), 0);
    assert_eq!(log_ids(dir.path()), old_logs);
    for e in 0..30 {
        assert_eq!(s.get_entry(8, e).unwrap(), Some(data(8, e, 500)));
    }
}

#[test]
fn compaction_keeps_a_log_holding_a_corrupt_live_entry() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let s = open(&cfg);
    for l in 1..=4u64 {
        s.put_entry(l, 0, data(l, 0, 100)).unwrap();
    }
    s.close().unwrap();
    drop(s);
    let logs = log_ids(dir.path());
    let path = entry_log::log_path(&dir.path().join("current"), logs[0]);
    // Ledger 4's record is the last one: flip a byte of its data.
    let len = RealFs.open(&path, OpenMode::Read).unwrap().len().unwrap();
    flip_byte(&path, len - 5);
    let s = open(&cfg);
    for l in 1..=3 {
        s.delete_ledger(l).unwrap();
    }
    assert_eq!(s.gc_and_compact().unwrap(), 0);
    assert_eq!(log_ids(dir.path()), logs);
    assert!(matches!(
        s.get_entry(4, 0),
        Err(StorageError::Corrupt { .. })
    ));
}

#[test]
fn write_cache_full_at_the_bound_then_flush_makes_room() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    let cost = 100 + write_cache::ENTRY_OVERHEAD_BYTES;
    cfg.write_cache_bytes_max = 4 * cost;
    let s = open(&cfg);
    for e in 0..4 {
        s.put_entry(1, e, data(1, e, 100)).unwrap();
    }
    assert_eq!(
        s.put_entry(1, 4, data(1, 4, 100)),
        Err(StorageError::WriteCacheFull)
    );
    assert_eq!(
        s.put_entry(1, 5, Bytes::from(vec![0u8; 2 * cost])),
        Err(StorageError::TooLarge(2 * cost))
    );
    // Both halves readable while full.
    assert_eq!(s.get_entry(1, 0).unwrap(), Some(data(1, 0, 100)));
    assert_eq!(s.get_entry(1, 3).unwrap(), Some(data(1, 3, 100)));
    s.flush().unwrap();
    assert_eq!(s.metrics.write_cache_bytes.get(), 0);
    s.put_entry(1, 4, data(1, 4, 100)).unwrap();
    s.close().unwrap();
    drop(s);
    let s = open(&cfg);
    assert_eq!(s.get_range(1, 0, 100, 1 << 20).unwrap().len(), 5);
}

#[test]
fn a_spread_flush_is_paced_and_keeps_every_entry() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.write_cache_bytes_max = 16 << 20;
    cfg.entry_log_bytes_max = 1 << 30;
    let s = open(&cfg);
    // About 3 MiB of records: three full write buffers and a rest, each
    // followed by a wait until its bytes are due.
    let n = 3 * 1024;
    for e in 0..n {
        s.put_entry(7, e, data(7, e, 1000)).unwrap();
    }
    let started = Instant::now();
    // Asked to take an hour: the floor rate applies instead.
    s.flush_spread(std::time::Duration::from_secs(3600))
        .unwrap();
    let took = started.elapsed().as_secs_f64();
    let written = (n * 1000) as f64;
    assert!(
        took >= 0.99 * written / FLUSH_BYTES_PER_S_MIN,
        "a paced flush of {written} bytes at 16 MiB/s took only {took} s"
    );
    assert_eq!(s.metrics.write_cache_bytes.get(), 0);
    s.close().unwrap();
    drop(s);
    let s = open(&cfg);
    let got = s.get_range(7, 0, n as usize, 1 << 30).unwrap();
    assert_eq!(got.len(), n as usize);
    assert_eq!(got[1234], data(7, 1234, 1000));
}

#[test]
fn failed_log_sync_fails_the_flush_and_keeps_entries_for_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let fs = TestFs::new();
    let s = open_with(fs.clone(), &cfg);
    s.put_entry(1, 0, data(1, 0, 100)).unwrap();
    fs.fail_next_log_sync.store(true, Ordering::SeqCst);
    assert!(matches!(s.flush(), Err(StorageError::Io(_))));
    // Not indexed, still served from the write cache.
    assert_eq!(s.get_entry(1, 0).unwrap(), Some(data(1, 0, 100)));
    s.flush().unwrap();
    s.close().unwrap();
    drop(s);
    let s = open(&cfg);
    assert_eq!(s.get_entry(1, 0).unwrap(), Some(data(1, 0, 100)));
    // The log whose sync failed is not trusted: the retry went to a new log,
    // and GC removes the abandoned one (no live data).
    assert_eq!(log_ids(dir.path()).len(), 2);
    s.gc_and_compact().unwrap();
    assert_eq!(log_ids(dir.path()).len(), 1);
    assert_eq!(s.get_entry(1, 0).unwrap(), Some(data(1, 0, 100)));
}

#[test]
fn thousand_ledger_states_survive_flush_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let state = |l: u64| LedgerState {
        master_key: Bytes::from(l.to_be_bytes().repeat(3)),
        fenced: l.is_multiple_of(2),
        explicit_lac: l.is_multiple_of(3).then(|| Bytes::from(format!("lac {l}"))),
        limbo: l.is_multiple_of(5),
    };
    let s = open(&cfg);
    for l in 1..=1000u64 {
        s.set_ledger_state(l, state(l)).unwrap();
    }
    assert_eq!(s.ledger_state(500).unwrap(), Some(state(500)));
    s.flush().unwrap();
    assert_eq!(s.metrics.ledger_count.get(), 1000);
    // Replaced after the flush, then made durable by the next.
    s.set_ledger_state(
        7,
        LedgerState {
            fenced: true,
            ..state(7)
        },
    )
    .unwrap();
    s.flush().unwrap();
    s.close().unwrap();
    drop(s);
    let s = open(&cfg);
    for l in 1..=1000u64 {
        let want = if l == 7 {
            LedgerState {
                fenced: true,
                ..state(7)
            }
        } else {
            state(l)
        };
        assert_eq!(s.ledger_state(l).unwrap(), Some(want), "ledger {l}");
    }
    assert_eq!(s.ledger_state(1001).unwrap(), None);
    assert_eq!(s.ledger_ids().unwrap(), (1..=1000).collect::<Vec<_>>());
    assert_eq!(s.metrics.ledger_count.get(), 1000);
}

#[test]
fn ledger_ids_include_ledgers_with_only_entries_or_only_state() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&config(dir.path()));
    s.put_entry(30, 0, data(30, 0, 10)).unwrap();
    s.set_ledger_state(10, LedgerState::default()).unwrap();
    s.put_entry(u64::MAX, 0, data(u64::MAX, 0, 10)).unwrap();
    assert_eq!(s.ledger_ids().unwrap(), vec![10, 30, u64::MAX]);
    s.flush().unwrap();
    s.put_entry(20, 0, data(20, 0, 10)).unwrap();
    assert_eq!(s.ledger_ids().unwrap(), vec![10, 20, 30, u64::MAX]);
}

#[test]
fn state_encoding_round_trips_and_rejects_garbage() {
    let st = LedgerState {
        master_key: Bytes::from_static(&[9; 20]),
        fenced: true,
        explicit_lac: Some(Bytes::new()),
        limbo: false,
    };
    assert_eq!(index::decode_state(1, &encode_state(&st)).unwrap(), st);
    let mut raw = encode_state(&st);
    raw.truncate(raw.len() - 1);
    raw[6] = 200;
    assert!(matches!(
        index::decode_state(1, &raw),
        Err(StorageError::Corrupt { .. })
    ));
    assert!(matches!(
        index::decode_state(1, &[]),
        Err(StorageError::Corrupt { .. })
    ));
}

#[test]
fn entry_logs_without_their_index_refuse_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let s = open(&cfg);
    s.put_entry(1, 0, data(1, 0, 10)).unwrap();
    s.close().unwrap();
    drop(s);
    std::fs::remove_file(dir.path().join("index").join(index::INDEX_FILE)).unwrap();
    let got = LedgerStorage::open(Arc::new(RealFs), cfg, StorageMetrics::unregistered());
    assert!(matches!(got, Err(StorageError::Io(m)) if m.contains("missing")));
}

#[test]
fn storage_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<LedgerStorage>();
}

#[test]
fn an_entry_once_put_stays_readable_while_flushes_and_compaction_run() {
    const ENTRIES: i64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.compaction_threshold = 0.9;
    let s = open(&cfg);
    let reclaimed = AtomicU64::new(0);
    let put_upto = AtomicU64::new(0); // entries [0, put_upto) were put
    let done = AtomicBool::new(false);
    let rounds = AtomicU64::new(0); // flush + delete + GC rounds completed
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for e in 0..ENTRIES {
                if e % 50 == 0 {
                    // Make every 50 puts overlap at least one flush/GC round.
                    let seen = rounds.load(Ordering::SeqCst);
                    while rounds.load(Ordering::SeqCst) == seen {
                        std::thread::yield_now();
                    }
                }
                s.put_entry(1, e, data(1, e, 100)).unwrap();
                // Short-lived ledgers, deleted as we go, give GC and compaction work.
                let short = 100 + (e / 50) as u64;
                s.put_entry(short, e, data(short, e, 100)).unwrap();
                put_upto.store(e as u64 + 1, Ordering::SeqCst);
            }
            done.store(true, Ordering::SeqCst);
        });
        scope.spawn(|| {
            let mut deleted_upto = 100u64;
            while !done.load(Ordering::SeqCst) {
                // Groups complete before the flush are on disk after it.
                let complete = 100 + put_upto.load(Ordering::SeqCst) / 50;
                s.flush().unwrap();
                while deleted_upto < complete {
                    s.delete_ledger(deleted_upto).unwrap();
                    deleted_upto += 1;
                }
                reclaimed.fetch_add(s.gc_and_compact().unwrap(), Ordering::SeqCst);
                rounds.fetch_add(1, Ordering::SeqCst);
            }
        });
        scope.spawn(|| {
            let mut e = 0u64;
            while !done.load(Ordering::SeqCst) || e < ENTRIES as u64 {
                let upto = put_upto.load(Ordering::SeqCst);
                if upto == 0 {
                    std::thread::yield_now();
                    continue;
                }
                let id = (e * 7919) % upto;
                assert_eq!(
                    s.get_entry(1, id as i64).unwrap(),
                    Some(data(1, id as i64, 100)),
                    "entry {id}"
                );
                e += 1;
            }
        });
    });
    assert!(rounds.load(Ordering::SeqCst) >= (ENTRIES / 50) as u64);
    assert!(
        reclaimed.load(Ordering::SeqCst) > 0,
        "GC never removed a log"
    );
    s.flush().unwrap();
    assert_eq!(
        s.get_range(1, 0, usize::MAX, usize::MAX).unwrap().len(),
        ENTRIES as usize
    );
    assert!(
        s.metrics.entry_log_bytes_written.get() > (ENTRIES * 2 * 124) as u64,
        "nothing was compacted"
    );
}
