//! Journal behaviour: durability before ack across a power cut, relaxed mode,
//! torn tails, corruption refusal, generations of reused files, group commit,
//! fsync failure, rotation with checkpoints and recycling, queue bounds; groups
//! written by the appender's runtime thread (inline) or by the writer thread.
//!
//! Timing is never hoped for: where a test needs the writer to be busy, a
//! gate in the storage seam holds its `fdatasync` until the test opens it.
//! Tests that hold a sync at the gate run on a multi-thread runtime, so an
//! inline flush task can block at the gate on a worker while the test goes on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::record::{self, FILE_HEADER_BYTES};
use super::*;
use crate::fs::{DiskSpace, FaultyFs, Fs, FsFile, OpenMode, RealFs};

fn cfg(dir: &Path) -> JournalConfig {
    JournalConfig {
        file_bytes: 1024 * 1024,
        ..JournalConfig::new(dir.to_path_buf())
    }
}

/// Entry `i` of ledger 1, 100 bytes of data derived from `i`.
fn entry(i: i64) -> JournalRecord {
    let data: Vec<u8> = (0..100u8)
        .map(|b| b.wrapping_mul(31).wrapping_add(i as u8))
        .collect();
    JournalRecord::Entry {
        ledger_id: 1,
        entry_id: i,
        data: Bytes::from(data),
    }
}

fn open_with(
    fs: SharedFs,
    cfg: JournalConfig,
) -> Result<(Journal, Vec<JournalRecord>), JournalError> {
    let mut seen = Vec::new();
    let j = Journal::open(fs, cfg, JournalMetrics::unregistered(), &mut |r| {
        seen.push(r);
        Ok(())
    })?;
    Ok((j, seen))
}

/// Opens, returns what replayed, and closes.
fn replayed(cfg: JournalConfig) -> Result<Vec<JournalRecord>, JournalError> {
    let (j, seen) = open_with(Arc::new(FaultyFs::new()), cfg)?;
    j.close()?;
    Ok(seen)
}

fn journal_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("current"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| file::parse_seq(p).is_some())
        .collect();
    v.sort();
    v
}

/// Holds every `sync_data` while closed, so a test can keep the writer busy.
#[derive(Debug, Default)]
struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    closed: bool,
    /// Syncs waiting at the gate.
    waiting: usize,
    /// The name of the thread of each sync that reached the gate.
    threads: Vec<String>,
}

impl Gate {
    fn set_closed(&self, closed: bool) {
        self.state.lock().unwrap().closed = closed;
        self.cv.notify_all();
    }

    fn pass(&self) {
        let mut st = self.state.lock().unwrap();
        let name = std::thread::current().name().unwrap_or("").to_string();
        st.threads.push(name);
        st.waiting += 1;
        self.cv.notify_all();
        while st.closed {
            st = self.cv.wait(st).unwrap();
        }
        st.waiting -= 1;
    }

    /// The thread name of the last sync that reached the gate.
    fn last_thread(&self) -> String {
        self.state
            .lock()
            .unwrap()
            .threads
            .last()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until `n` syncs are held at the gate. The deadline only turns
    /// a writer that never syncs into a failure instead of a hang.
    fn wait_held(&self, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut st = self.state.lock().unwrap();
        while st.waiting < n {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "the writer never reached fdatasync");
            st = self.cv.wait_timeout(st, left).unwrap().0;
        }
    }
}

/// Opens the gate when dropped: declared after the journal, it lets a
/// failing test's journal close (and the test end) instead of hanging.
struct OpenOnDrop(Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.set_closed(false);
    }
}

/// A [`FaultyFs`] whose syncs pass through a [`Gate`].
#[derive(Debug)]
struct GateFs {
    inner: FaultyFs,
    gate: Arc<Gate>,
}

#[derive(Debug)]
struct GateFile {
    inner: Arc<dyn FsFile>,
    gate: Arc<Gate>,
}

impl FsFile for GateFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.gate.pass();
        self.inner.sync_data()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
}

impl Fs for GateFs {
    fn open(&self, path: &Path, mode: OpenMode) -> std::io::Result<Arc<dyn FsFile>> {
        Ok(Arc::new(GateFile {
            inner: self.inner.open(path, mode)?,
            gate: self.gate.clone(),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn read_dir(&self, path: &Path) -> std::io::Result<Vec<PathBuf>> {
        self.inner.read_dir(path)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        self.inner.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
        self.inner.sync_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn space(&self, path: &Path) -> std::io::Result<DiskSpace> {
        self.inner.space(path)
    }
}

fn gated() -> (FaultyFs, Arc<Gate>, SharedFs) {
    let faulty = FaultyFs::new();
    let gate = Arc::new(Gate::default());
    let fs: SharedFs = Arc::new(GateFs {
        inner: faulty.clone(),
        gate: gate.clone(),
    });
    (faulty, gate, fs)
}

/// The fsync-before-ack test (STYLE §7). `power_cut` undoes every write not
/// followed by a successful `sync_data`. If the writer's `self.sync()` in
/// `flush_group` were removed, the appends would resolve with their groups
/// unsynced, the power cut would erase them and the replay would be empty
/// (checked by hand: with the sync commented out this fails with `left: []`).
/// If the sync were moved after completing the waiters, the second half
/// fails: the append would be complete while its sync is still held.
#[tokio::test]
async fn appended_record_survives_power_cut_once_its_append_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let (j, seen) = open_with(Arc::new(fs.clone()), cfg(dir.path())).unwrap();
    assert!(seen.is_empty());
    j.append(JournalRecord::MasterKey {
        ledger_id: 1,
        master_key: Bytes::from_static(b"k"),
    })
    .await
    .unwrap();
    j.append(entry(0)).await.unwrap();
    j.append(JournalRecord::Fence { ledger_id: 1 })
        .await
        .unwrap();
    fs.power_cut();
    drop(j);
    let after = replayed(cfg(dir.path())).unwrap();
    assert_eq!(
        after,
        vec![
            JournalRecord::MasterKey {
                ledger_id: 1,
                master_key: Bytes::from_static(b"k"),
            },
            entry(0),
            JournalRecord::Fence { ledger_id: 1 },
        ]
    );
}

/// No ack while the group's fdatasync is in progress, whoever writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_append_resolves_while_its_group_sync_is_in_progress() {
    for inline in [false, true] {
        no_ack_before_sync(inline).await;
    }
}

async fn no_ack_before_sync(inline: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (faulty, gate, fs) = gated();
    let c = JournalConfig {
        inline_writes: inline,
        ..cfg(dir.path())
    };
    let (j, _) = open_with(fs, c).unwrap();
    let _open = OpenOnDrop(gate.clone());
    gate.set_closed(true);
    let mut pending = Box::pin(j.append(entry(1)));
    gate.wait_held(1);
    assert!(
        futures::poll!(&mut pending).is_pending(),
        "acknowledged before its fdatasync returned"
    );
    faulty.power_cut();
    gate.set_closed(false);
    assert!(matches!(pending.await, Err(JournalError::SyncFailed(_))));
    drop(j);
    assert_eq!(replayed(cfg(dir.path())).unwrap(), vec![]);
}

#[tokio::test]
async fn relaxed_mode_acks_without_a_sync_per_group_and_is_opt_in() {
    assert_eq!(SyncPolicy::default(), SyncPolicy::FsyncBeforeAck);
    assert_eq!(
        JournalConfig::new(PathBuf::from("/x")).sync_policy,
        SyncPolicy::FsyncBeforeAck
    );

    let dir = tempfile::tempdir().unwrap();
    let strict = FaultyFs::new();
    let (j, _) = open_with(Arc::new(strict.clone()), cfg(dir.path())).unwrap();
    let base = strict.sync_count();
    for i in 0..20 {
        j.append(entry(i)).await.unwrap();
    }
    assert_eq!(strict.sync_count() - base, 20, "one sync per lone append");
    j.close().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let relaxed = FaultyFs::new();
    let rcfg = JournalConfig {
        sync_policy: SyncPolicy::RelaxedAckBeforeFsync,
        relaxed_sync_interval_ms: 3_600_000,
        ..cfg(dir.path())
    };
    let (j, _) = open_with(Arc::new(relaxed.clone()), rcfg.clone()).unwrap();
    let base = relaxed.sync_count();
    for i in 0..20 {
        j.append(entry(i)).await.unwrap();
    }
    assert_eq!(relaxed.sync_count(), base, "no sync before these acks");
    // The price of the opt-in: acknowledged records die with the power.
    relaxed.power_cut();
    drop(j);
    assert_eq!(replayed(rcfg.clone()).unwrap(), vec![]);

    // Closing syncs what relaxed mode acknowledged.
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let rcfg = JournalConfig {
        dir: dir.path().to_path_buf(),
        ..rcfg
    };
    let (j, _) = open_with(Arc::new(fs.clone()), rcfg.clone()).unwrap();
    j.append(entry(7)).await.unwrap();
    j.close().unwrap();
    fs.power_cut();
    assert_eq!(replayed(rcfg).unwrap(), vec![entry(7)]);
}

/// Writes `n` lone appends (one group each) into a fresh journal of small
/// files; returns the journal file's bytes and where the last record starts.
async fn journal_with_lone_appends(dir: &Path, n: i64) -> (PathBuf, Vec<u8>, u64) {
    let (j, _) = open_with(Arc::new(FaultyFs::new()), small_cfg(dir)).unwrap();
    let mut last_start = 0;
    for i in 0..n {
        last_start = j.synced_mark().offset;
        j.append(entry(i)).await.unwrap();
    }
    j.close().unwrap();
    let files = journal_files(dir);
    assert_eq!(files.len(), 1);
    let bytes = std::fs::read(&files[0]).unwrap();
    (files[0].clone(), bytes, last_start)
}

fn small_cfg(dir: &Path) -> JournalConfig {
    JournalConfig {
        file_bytes: 16 * 1024,
        // No pre-filled spare: fewer syncs per open in the many-opens tests.
        spare_files_max: 0,
        ..JournalConfig::new(dir.to_path_buf())
    }
}

/// Copies a journal file into a fresh journal directory.
fn fresh_dir_with(name: &Path, bytes: &[u8]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("current")).unwrap();
    std::fs::write(
        d.path().join("current").join(name.file_name().unwrap()),
        bytes,
    )
    .unwrap();
    d
}

#[tokio::test]
async fn torn_tail_at_every_byte_of_the_last_record_replays_all_earlier_records() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes, start) = journal_with_lone_appends(dir.path(), 5).await;
    let len = record::record_len(&entry(4)) as u64;
    let expected: Vec<JournalRecord> = (0..4).map(entry).collect();
    for cut in start..start + len {
        let cut_at = cut as usize;
        // The tail never reached the disk: unwritten (zero) bytes.
        let mut zeroed = bytes.clone();
        zeroed[cut_at..(start + len) as usize].fill(0);
        let d = fresh_dir_with(&path, &zeroed);
        assert_eq!(
            replayed(small_cfg(d.path())).unwrap(),
            expected,
            "zeroed from {cut}"
        );
        // The file itself was cut short.
        let d = fresh_dir_with(&path, &bytes[..cut_at]);
        assert_eq!(
            replayed(small_cfg(d.path())).unwrap(),
            expected,
            "truncated at {cut}"
        );
    }
    // Control: intact, all five replay.
    let d = fresh_dir_with(&path, &bytes);
    assert_eq!(
        replayed(small_cfg(d.path())).unwrap(),
        (0..5).map(entry).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_damaged_record_that_later_records_say_was_synced_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes, _) = journal_with_lone_appends(dir.path(), 5).await;
    // Lone appends: one 512-byte group each, after the header.
    let third = FILE_HEADER_BYTES + 2 * record::ALIGN_BYTES;
    let mut flipped = bytes.clone();
    flipped[third as usize + 60] ^= 0x10;
    let d = fresh_dir_with(&path, &flipped);
    let err = replayed(small_cfg(d.path())).unwrap_err();
    let JournalError::Corrupt {
        file,
        offset,
        reason,
    } = err
    else {
        panic!("expected Corrupt, got {err:?}");
    };
    assert!(file.ends_with(path.file_name().unwrap().to_str().unwrap()));
    assert_eq!(offset, third);
    assert!(reason.contains("CRC32C"), "{reason}");

    // A damaged checkpoint file is refused too.
    let d = fresh_dir_with(&path, &bytes);
    std::fs::write(d.path().join("current").join("checkpoint"), b"garbage").unwrap();
    assert!(matches!(
        replayed(small_cfg(d.path())).unwrap_err(),
        JournalError::Corrupt { .. }
    ));
}

#[tokio::test]
async fn a_damaged_last_record_of_an_earlier_file_is_corruption_not_a_tail() {
    let dir = tempfile::tempdir().unwrap();
    let c = JournalConfig {
        file_bytes: 4096,
        ..JournalConfig::new(dir.path().to_path_buf())
    };
    let (j, _) = open_with(Arc::new(FaultyFs::new()), c.clone()).unwrap();
    for i in 0..10 {
        j.append(entry(i)).await.unwrap();
    }
    j.close().unwrap();
    let files = journal_files(dir.path());
    assert_eq!(files.len(), 2, "7 groups of 512 bytes fit a 4 KiB file");
    let mut first = std::fs::read(&files[0]).unwrap();
    // Its last group: nothing later in the file vouches for it, the next
    // file's header does.
    first[4096 - 512 + 40] ^= 1;
    std::fs::write(&files[0], &first).unwrap();
    let err = replayed(c).unwrap_err();
    assert!(
        matches!(&err, JournalError::Corrupt { offset: 3584, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn records_of_an_older_generation_in_a_reused_file_are_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let c = JournalConfig {
        file_bytes: 4096,
        spare_files_max: 2,
        ..JournalConfig::new(dir.path().to_path_buf())
    };
    let (j, _) = open_with(Arc::new(FaultyFs::new()), c.clone()).unwrap();
    for i in 0..20 {
        j.append(entry(i)).await.unwrap();
    }
    let mark = j.synced_mark();
    j.checkpoint_complete(mark).unwrap();
    let files_before = journal_files(dir.path()).len();
    // Fill the checkpoint's file, then one record into the next, recycled file.
    let mut i = 20;
    while j.synced_mark().file_seq == mark.file_seq {
        j.append(entry(i)).await.unwrap();
        i += 1;
    }
    assert_eq!(
        journal_files(dir.path()).len(),
        files_before,
        "the next file was a recycled spare, not a new one"
    );
    j.close().unwrap();
    // The recycled file holds one new record, then a file of old records.
    let (j, seen) = open_with(Arc::new(FaultyFs::new()), c).unwrap();
    assert_eq!(seen, (20..i).map(entry).collect::<Vec<_>>());
    j.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_share_syncs_and_a_lone_append_never_waits_for_the_delay() {
    for inline in [false, true] {
        concurrent_appends_share_syncs(inline).await;
    }
}

async fn concurrent_appends_share_syncs(inline: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (faulty, gate, fs) = gated();
    let c = JournalConfig {
        // Only a drained queue can end a group here: any fixed wait would hang.
        group_commit_delay_us_max: 3_600_000_000,
        inline_writes: inline,
        ..cfg(dir.path())
    };
    let (j, _) = open_with(fs, c).unwrap();
    let _open = OpenOnDrop(gate.clone());

    // A lone append completes at once, with exactly one sync.
    let base = faulty.sync_count();
    tokio::time::timeout(Duration::from_secs(60), j.append(entry(0)))
        .await
        .expect("a lone append waited for the group-commit delay")
        .unwrap();
    assert_eq!(faulty.sync_count() - base, 1);

    // 100 concurrent appends: the first group's sync is held while the other
    // 99 queue up; they then go out as one group.
    let base = faulty.sync_count();
    gate.set_closed(true);
    let first = tokio::spawn(j.append(entry(1)));
    gate.wait_held(1);
    let rest: Vec<_> = (2..101).map(|i| j.append(entry(i))).collect();
    gate.set_closed(false);
    first.await.unwrap().unwrap();
    for r in futures::future::join_all(rest).await {
        r.unwrap();
    }
    assert_eq!(
        faulty.sync_count() - base,
        2,
        "100 appends, 2 groups, 2 syncs"
    );
    j.close().unwrap();
    let seen = replayed(cfg(dir.path())).unwrap();
    assert_eq!(seen, (0..101).map(entry).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_fdatasync_fails_its_group_and_every_later_append() {
    for inline in [false, true] {
        failed_sync_fails_all(inline).await;
    }
}

async fn failed_sync_fails_all(inline: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (faulty, gate, fs) = gated();
    let c = JournalConfig {
        inline_writes: inline,
        ..cfg(dir.path())
    };
    let (j, _) = open_with(fs, c).unwrap();
    let _open = OpenOnDrop(gate.clone());
    j.append(entry(0)).await.unwrap();

    gate.set_closed(true);
    let first = tokio::spawn(j.append(entry(1)));
    gate.wait_held(1);
    let queued: Vec<_> = (2..12).map(|i| j.append(entry(i))).collect();
    faulty.fail_next_sync();
    gate.set_closed(false);
    assert!(matches!(
        first.await.unwrap(),
        Err(JournalError::SyncFailed(_))
    ));
    for r in futures::future::join_all(queued).await {
        assert!(matches!(r, Err(JournalError::SyncFailed(_))), "{r:?}");
    }
    assert!(j.is_failed());
    assert!(matches!(
        j.append(entry(99)).await,
        Err(JournalError::SyncFailed(_))
    ));
    assert!(matches!(j.close(), Err(JournalError::SyncFailed(_))));
    // Nothing of the failed group was acknowledged, and it is not durable.
    faulty.power_cut();
    drop(j);
    assert_eq!(replayed(cfg(dir.path())).unwrap(), vec![entry(0)]);
}

#[tokio::test]
async fn rotation_checkpoints_and_recycling_keep_files_bounded_and_replay_from_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let c = JournalConfig {
        file_bytes: 4096,
        spare_files_max: 2,
        ..JournalConfig::new(dir.path().to_path_buf())
    };
    let fs = FaultyFs::new();
    let (j, _) = open_with(Arc::new(fs.clone()), c.clone()).unwrap();
    let mut marks = Vec::new();
    for i in 0..200 {
        j.append(entry(i)).await.unwrap();
        if i % 20 == 19 {
            let m = j.synced_mark();
            j.checkpoint_complete(m).unwrap();
            marks.push((i, m));
            // Files since the mark (at most 4: 20 groups, 7 per file) plus spares.
            let n = journal_files(dir.path()).len();
            assert!(n <= 4 + c.spare_files_max, "{n} journal files");
        }
    }
    assert!(
        marks.last().unwrap().1.file_seq > 20,
        "rotated through many files"
    );
    let (last_i, last_mark) = *marks.last().unwrap();
    // The mark never moves backwards.
    j.checkpoint_complete(marks[0].1).unwrap();
    for i in 200..205 {
        j.append(entry(i)).await.unwrap();
    }
    fs.power_cut();
    drop(j);
    let (j, seen) = open_with(Arc::new(FaultyFs::new()), c.clone()).unwrap();
    assert_eq!(seen, ((last_i + 1)..205).map(entry).collect::<Vec<_>>());
    assert!(j.synced_mark() > last_mark);
    j.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_fails_fast_at_the_queue_bound_and_for_oversized_records() {
    for inline in [false, true] {
        queue_bound_and_oversized(inline).await;
    }
}

async fn queue_bound_and_oversized(inline: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (_faulty, gate, fs) = gated();
    let c = JournalConfig {
        queue_records_max: 4,
        inline_writes: inline,
        ..cfg(dir.path())
    };
    let (j, _) = open_with(fs, c).unwrap();
    let _open = OpenOnDrop(gate.clone());
    gate.set_closed(true);
    let first = tokio::spawn(j.append(entry(0)));
    gate.wait_held(1);
    let queued: Vec<_> = (1..5).map(|i| j.append(entry(i))).collect();
    assert_eq!(j.append(entry(5)).await, Err(JournalError::QueueFull));
    gate.set_closed(false);
    first.await.unwrap().unwrap();
    for r in futures::future::join_all(queued).await {
        r.unwrap();
    }

    let big = JournalRecord::Entry {
        ledger_id: 1,
        entry_id: 9,
        data: Bytes::from(vec![0u8; RECORD_DATA_BYTES_MAX + 1]),
    };
    assert_eq!(
        j.append(big).await,
        Err(JournalError::TooLarge(RECORD_DATA_BYTES_MAX + 1))
    );
    // Bigger than a 1 MiB file.
    let big = JournalRecord::Entry {
        ledger_id: 1,
        entry_id: 9,
        data: Bytes::from(vec![0u8; 1024 * 1024]),
    };
    assert_eq!(
        j.append(big).await,
        Err(JournalError::TooLarge(1024 * 1024))
    );
    j.close().unwrap();
    j.close().unwrap();
    assert_eq!(j.append(entry(6)).await, Err(JournalError::Closed));
}

#[tokio::test]
async fn a_record_of_the_largest_size_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let c = JournalConfig {
        file_bytes: 8 * 1024 * 1024,
        ..JournalConfig::new(dir.path().to_path_buf())
    };
    let rec = JournalRecord::ExplicitLac {
        ledger_id: 3,
        lac: 41,
        data: Bytes::from(vec![7u8; RECORD_DATA_BYTES_MAX]),
    };
    let (j, _) = open_with(Arc::new(FaultyFs::new()), c.clone()).unwrap();
    j.append(entry(0)).await.unwrap();
    j.append(rec.clone()).await.unwrap();
    j.append(JournalRecord::Limbo {
        ledger_id: 3,
        in_limbo: true,
    })
    .await
    .unwrap();
    j.close().unwrap();
    let seen = replayed(c).unwrap();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[1], rec);
}

#[tokio::test]
async fn replay_errors_from_the_caller_abort_open() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open_with(Arc::new(FaultyFs::new()), cfg(dir.path())).unwrap();
    j.append(entry(0)).await.unwrap();
    j.close().unwrap();
    let err = Journal::open(
        Arc::new(FaultyFs::new()),
        cfg(dir.path()),
        JournalMetrics::unregistered(),
        &mut |_| Err("storage full".into()),
    )
    .unwrap_err();
    assert!(
        matches!(&err, JournalError::Io(m) if m.contains("storage full")),
        "{err:?}"
    );
}

#[test]
fn metrics_register_once_per_registry() {
    let reg = prometheus::Registry::new();
    let m = JournalMetrics::new(&reg).unwrap();
    m.fsync_seconds.observe(0.001);
    m.write_seconds.observe(0.001);
    assert_eq!(reg.gather().len(), 5);
    assert!(JournalMetrics::new(&reg).is_err());
}

#[tokio::test]
async fn rotation_uses_the_file_pre_filled_at_open_and_leftovers_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let current = dir.path().join("current");
    std::fs::create_dir_all(&current).unwrap();
    let leftover = file::prealloc_path(&current, 0xff);
    std::fs::write(&leftover, b"half-filled").unwrap();
    let c = JournalConfig {
        file_bytes: 4096,
        ..JournalConfig::new(dir.path().to_path_buf())
    };
    let (j, _) = open_with(Arc::new(FaultyFs::new()), c).unwrap();
    assert!(
        !leftover.exists(),
        "an incomplete pre-filled file is removed"
    );
    let ready = file::prealloc_path(&current, 0);
    assert_eq!(std::fs::metadata(&ready).unwrap().len(), 4096);
    for i in 0..8 {
        j.append(entry(i)).await.unwrap();
    }
    assert_eq!(j.synced_mark().file_seq, 2, "rotated once");
    assert!(!ready.exists(), "the rotation renamed the pre-filled file");
    assert_eq!(journal_files(dir.path()).len(), 2);
    j.close().unwrap();
}

/// The server checkpoints on `rotated()`; the checkpoint recycles the finished
/// file, and the next rotation takes it instead of a file of zeros.
#[tokio::test]
async fn a_rotation_is_announced_and_a_checkpoint_then_recycles_the_finished_file() {
    let dir = tempfile::tempdir().unwrap();
    let c = JournalConfig {
        file_bytes: record::FILE_HEADER_BYTES + 8 * record::ALIGN_BYTES,
        spare_files_max: 1,
        ..JournalConfig::new(dir.path().to_path_buf())
    };
    let (j, _) = open_with(Arc::new(RealFs), c).unwrap();
    // Take the file pre-filled at open out of the pool: from here on a spare
    // only comes from recycling (or the preallocator, past half way).
    let mut i = 0;
    while j.synced_mark().file_seq < 2 {
        j.append(entry(i)).await.unwrap();
        i += 1;
    }
    tokio::time::timeout(std::time::Duration::from_secs(10), j.rotated())
        .await
        .expect("the rotation is announced");
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(50), j.rotated())
            .await
            .is_err(),
        "announced once per rotation"
    );
    assert!(
        lock(&j.inner.shared.pool).is_empty(),
        "the rotation took the pre-filled file; the preallocator waits for half way"
    );
    j.checkpoint_complete(j.synced_mark()).unwrap();
    assert!(
        !lock(&j.inner.shared.pool).is_empty(),
        "file 1 is a spare now"
    );
    assert_eq!(journal_files(dir.path()).len(), 2, "file 2 and the spare");
    j.close().unwrap();
}

#[tokio::test]
async fn after_a_rotation_a_file_is_pre_filled_only_once_the_journal_is_half_way_through() {
    let dir = tempfile::tempdir().unwrap();
    let current = dir.path().join("current");
    // Eight one-record groups (512 bytes each) per file.
    let c = JournalConfig {
        file_bytes: record::FILE_HEADER_BYTES + 8 * record::ALIGN_BYTES,
        ..JournalConfig::new(dir.path().to_path_buf())
    };
    let half = c.file_bytes / 2;
    let (j, _) = open_with(Arc::new(RealFs), c.clone()).unwrap();
    let next = file::prealloc_path(&current, 1);
    let mut i = 0;
    while j.synced_mark().file_seq < 2 {
        j.append(entry(i)).await.unwrap();
        i += 1;
    }
    // In the new file's first half, with no spare: nothing is filled (the
    // preallocator was woken by the rotation and is waiting).
    while j.synced_mark().offset + record::ALIGN_BYTES < half {
        j.append(entry(i)).await.unwrap();
        i += 1;
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        !next.exists(),
        "filled while the journal was in its first half"
    );
    // Past half way: the file is filled (bounded wait) and the next rotation
    // takes it.
    j.append(entry(i)).await.unwrap();
    i += 1;
    assert!(j.synced_mark().offset >= half);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while lock(&j.inner.shared.pool).is_empty() {
        assert!(std::time::Instant::now() < deadline, "no file filled");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(std::fs::metadata(&next).unwrap().len(), c.file_bytes);
    while j.synced_mark().file_seq < 3 {
        j.append(entry(i)).await.unwrap();
        i += 1;
    }
    assert!(!next.exists(), "the rotation renamed the filled file");
    j.close().unwrap();
}

/// A group's write runs on with zeros to the end of the page it ends in, and
/// no further: the kernel then never reads a journal page from the disk to
/// merge a partial write (a recycled or evicted page), and nothing past that
/// page is touched. The file's bytes after the header are first set to 0xAB,
/// as a recycled file's old records would be.
#[tokio::test]
async fn a_group_write_runs_with_zeros_to_the_end_of_its_page() {
    for direct_io in [true, false] {
        group_write_runs_with_zeros_to_the_end_of_its_page(direct_io).await;
    }
}

async fn group_write_runs_with_zeros_to_the_end_of_its_page(direct_io: bool) {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let cfg = |d: &Path| JournalConfig {
        direct_io,
        ..cfg(d)
    };
    let (j, _) = open_with(Arc::new(RealFs), cfg(dir.path())).unwrap();
    let mark = j.synced_mark();
    let path = file::file_path(&dir.path().join("current"), mark.file_seq);
    let len = std::fs::metadata(&path).unwrap().len();
    let old = vec![0xABu8; (len - mark.offset) as usize];
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&old, mark.offset).unwrap();
    drop(f);
    let page = super::writer::PAGE_BYTES;
    let mut pages_crossed = 0;
    for i in 0..20 {
        j.append(entry(i)).await.unwrap();
        let end = j.synced_mark().offset;
        let page_end = end.next_multiple_of(page);
        let bytes = std::fs::read(&path).unwrap();
        let (end, page_end) = (end as usize, page_end as usize);
        assert!(
            bytes[end..page_end].iter().all(|b| *b == 0),
            "group {i}: the rest of its page is zeros"
        );
        assert!(
            bytes[page_end..page_end + page as usize]
                .iter()
                .all(|b| *b == 0xAB),
            "group {i}: nothing past its page is written"
        );
        if end % page as usize == 0 {
            pages_crossed += 1;
        }
    }
    assert!(pages_crossed >= 2, "the groups filled whole pages too");
    j.close().unwrap();
    // What the journal holds replays as written.
    let seen = replayed(cfg(dir.path())).unwrap();
    assert_eq!(seen, (0..20).map(entry).collect::<Vec<_>>());
}

/// Direct group writes start at their first page's start and rewrite the
/// bytes already there: the same appends leave byte for byte the same
/// journal files with direct I/O as with buffered writes + `fdatasync`,
/// across pages, a rotation and a reopen, and replay returns every record.
#[tokio::test]
async fn direct_and_buffered_journals_write_the_same_bytes() {
    async fn write(direct_io: bool) -> (tempfile::TempDir, Vec<Vec<u8>>) {
        let dir = tempfile::tempdir().unwrap();
        let c = JournalConfig {
            file_bytes: 64 * 1024,
            direct_io,
            ..JournalConfig::new(dir.path().to_path_buf())
        };
        for round in 0..2 {
            let (j, _) = open_with(Arc::new(RealFs), c.clone()).unwrap();
            for i in 0..300 {
                // Lone appends (one group each), of sizes that end groups
                // anywhere in a page.
                let data = Bytes::from(vec![i as u8; 50 + (i as usize * 37) % 900]);
                j.append(JournalRecord::Entry {
                    ledger_id: round,
                    entry_id: i,
                    data,
                })
                .await
                .unwrap();
            }
            j.close().unwrap();
        }
        let files = journal_files(dir.path())
            .iter()
            .map(|p| std::fs::read(p).unwrap())
            .collect();
        (dir, files)
    }
    let (direct_dir, direct) = write(true).await;
    let (_buffered_dir, buffered) = write(false).await;
    assert!(
        direct.len() >= 3,
        "the appends rotated: {} files",
        direct.len()
    );
    assert_eq!(direct.len(), buffered.len());
    for (i, (d, b)) in direct.iter().zip(&buffered).enumerate() {
        assert!(
            d == b,
            "journal file {i} differs between direct and buffered writes"
        );
    }
    let c = JournalConfig {
        file_bytes: 64 * 1024,
        ..JournalConfig::new(direct_dir.path().to_path_buf())
    };
    let seen = replayed(c).unwrap();
    assert_eq!(seen.len(), 600, "both rounds' records replay");
}

/// Under a runtime, a lone append's group is written by the appender's
/// thread (no hand-off); with `inline_writes` off, or with no runtime, by the
/// writer thread. Appends queued in one runtime turn share one group.
#[tokio::test]
async fn groups_are_written_inline_by_the_runtime_or_by_the_writer_thread() {
    for inline in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (faulty, gate, fs) = gated();
        let c = JournalConfig {
            inline_writes: inline,
            ..cfg(dir.path())
        };
        let (j, _) = open_with(fs, c.clone()).unwrap();
        let base = faulty.sync_count();
        j.append(entry(0)).await.unwrap();
        assert_eq!(faulty.sync_count() - base, 1);
        let writer = gate.last_thread() == "journal-writer";
        assert_eq!(
            writer,
            !inline,
            "inline {inline}: synced on {}",
            gate.last_thread()
        );

        // As many appends as a runtime thread writes, queued before the
        // runtime turns: one group when the runtime writes it (its flush task
        // runs after this turn). The writer thread runs beside this one and
        // may take the first append before the others are queued (a loaded
        // machine preempts this thread between them), so there: 1 to n.
        let base = faulty.sync_count();
        let n = super::writer::INLINE_RECORDS_MAX as i64;
        let all: Vec<_> = (1..=n).map(|i| j.append(entry(i))).collect();
        for r in futures::future::join_all(all).await {
            r.unwrap();
        }
        let groups = faulty.sync_count() - base;
        if inline {
            assert_eq!(groups, 1, "inline: one group");
        } else {
            assert!(
                (1..=n as u64).contains(&groups),
                "writer thread: {groups} groups"
            );
        }
        assert_eq!(gate.last_thread() == "journal-writer", !inline);

        // Outside a runtime the writer thread takes it.
        let j2 = j.clone();
        let name = std::thread::spawn(move || {
            futures::executor::block_on(j2.append(entry(n + 1))).unwrap();
        });
        name.join().unwrap();
        assert_eq!(gate.last_thread(), "journal-writer");
        j.close().unwrap();
        assert_eq!(
            replayed(c).unwrap(),
            (0..n + 2).map(entry).collect::<Vec<_>>()
        );
    }
}

/// A group over the inline bounds (bytes or records) is the writer thread's;
/// so is a group that needs a rotation. Replay returns everything in append order.
#[tokio::test]
async fn large_groups_and_rotations_go_to_the_writer_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (_faulty, gate, fs) = gated();
    let c = JournalConfig {
        file_bytes: 256 * 1024,
        ..cfg(dir.path())
    };
    let (j, _) = open_with(fs, c.clone()).unwrap();
    let big = |i: i64| JournalRecord::Entry {
        ledger_id: 2,
        entry_id: i,
        data: Bytes::from(vec![i as u8; 20 * 1024]),
    };
    // 4 × 20 KiB queued in one turn: over 64 KiB.
    let all: Vec<_> = (0..4).map(|i| j.append(big(i))).collect();
    for r in futures::future::join_all(all).await {
        r.unwrap();
    }
    assert_eq!(gate.last_thread(), "journal-writer");
    // More records than a runtime thread writes, however small.
    let n = super::writer::INLINE_RECORDS_MAX as i64 + 1;
    let all: Vec<_> = (0..n).map(|i| j.append(entry(i))).collect();
    for r in futures::future::join_all(all).await {
        r.unwrap();
    }
    assert_eq!(gate.last_thread(), "journal-writer");
    // Lone 20 KiB appends go inline until one needs the next file. Each
    // waits until an inline write is possible: the writer thread may still
    // be marked busy after its last group completed, and a write slower
    // than INLINE_SLOW (a loaded disk) pauses inline writes for a while;
    // either sends an append to the thread without a rotation.
    let mut threads = Vec::new();
    for i in 4..16 {
        let deadline = std::time::Instant::now() + super::writer::INLINE_PAUSE * 5;
        while !j.inline_ready() {
            assert!(
                std::time::Instant::now() < deadline,
                "the journal never became ready for an inline write"
            );
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        j.append(big(i)).await.unwrap();
        threads.push(gate.last_thread());
    }
    let on_writer = threads.iter().filter(|t| *t == "journal-writer").count();
    assert!(
        (1..threads.len()).contains(&on_writer),
        "rotations on the writer thread, the rest inline: {threads:?}"
    );
    j.close().unwrap();
    let mut want: Vec<_> = (0..4).map(big).collect();
    want.extend((0..n).map(entry));
    want.extend((4..16).map(big));
    assert_eq!(replayed(c).unwrap(), want);
}

/// An inline write slower than `INLINE_SLOW` sends the next groups to the
/// writer thread, so a slow disk blocks that thread, not the runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_inline_write_pauses_inline_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (_faulty, gate, fs) = gated();
    let (j, _) = open_with(fs, cfg(dir.path())).unwrap();
    let _open = OpenOnDrop(gate.clone());
    gate.set_closed(true);
    let first = tokio::spawn(j.append(entry(0)));
    gate.wait_held(1);
    assert_ne!(gate.last_thread(), "journal-writer");
    // Held past the bound: the write is slow by construction.
    std::thread::sleep(super::writer::INLINE_SLOW * 2);
    gate.set_closed(false);
    first.await.unwrap().unwrap();
    j.append(entry(1)).await.unwrap();
    assert_eq!(gate.last_thread(), "journal-writer");
    j.close().unwrap();
}

/// A flush task dropped before it ran (its runtime shut down) hands the queue
/// to the writer thread: the append still completes.
#[test]
fn a_flush_task_dropped_unrun_hands_the_group_to_the_writer_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (_faulty, gate, fs) = gated();
    let (j, _) = open_with(fs, cfg(dir.path())).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let pending = {
        let _in_rt = rt.enter();
        j.append(entry(0)) // spawns the flush task on `rt`, which never runs it
    };
    drop(rt);
    futures::executor::block_on(pending).unwrap();
    assert_eq!(gate.last_thread(), "journal-writer");
    j.close().unwrap();
    assert_eq!(replayed(cfg(dir.path())).unwrap(), vec![entry(0)]);
}
