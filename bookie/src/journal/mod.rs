//! The bookie journal: the write-ahead log every add, fence, explicit LAC,
//! master key and limbo mark goes through before it is acknowledged
//! (DESIGN §5, reference/bookkeeper.md §3.2–3.3).
//!
//! Promises:
//! - **Durable before ack.** Under [`SyncPolicy::FsyncBeforeAck`] (the default)
//!   the future of [`Journal::append`] resolves `Ok` only after `fdatasync`
//!   of the group holding the record returned `Ok` (DESIGN §4.1).
//! - **Group commit without a fixed wait.** A group is everything queued,
//!   flushed (write + `fdatasync`) when the queue drains, when the group's
//!   first record has waited `group_commit_delay_us_max`, or when the group
//!   reaches `group_commit_bytes_max`; a lone append is synced at once.
//! - **Who writes.** While the journal is idle, a small group (at most 4
//!   records and 64 KiB, no rotation) is written by the runtime thread that
//!   appended, in a flush task that runs after the runtime's other ready work
//!   has queued its appends (`inline_writes`, default on under
//!   fsync-before-ack): no thread hand-off, two wake-ups fewer per group.
//!   Anything larger, a rotation, an append made outside a tokio runtime,
//!   everything while the writer thread is busy, and every group for a
//!   second after a runtime-thread write slower than 10 ms go to the writer
//!   thread. Either way one writer at a time, in queue order.
//! - **An fsync error is fatal.** Nothing in that group is acknowledged, every
//!   later append fails, [`Journal::is_failed`] turns true; never retried
//!   (STYLE §7, RELIABILITY P0-10).
//! - **Replay finds exactly the durable prefix.** Records are CRC32C'd and
//!   stamped with their file's generation and the offset already synced; a torn
//!   tail is cut, a damaged record that a later record says was synced is
//!   [`JournalError::Corrupt`] and the journal refuses to open (P0-8); nothing is
//!   ever truncated, the writer always continues in a new or recycled file.
//! - **Bounded.** The append queue (`queue_records_max`), a group
//!   (`group_commit_bytes_max`, or one record), a record
//!   ([`RECORD_DATA_BYTES_MAX`]), files (`file_bytes`, `spare_files_max`).
//!
//! Layout: `record` (formats), `file` (files, checkpoint, spares),
//! `writer` (the queue, the writer thread and inline flushes), `replay`
//! (recovery).
//!
//! ```no_run
//! # async fn demo() -> Result<(), cms_bookie::journal::JournalError> {
//! use std::sync::Arc;
//! use cms_bookie::fs::RealFs;
//! use cms_bookie::journal::{Journal, JournalConfig, JournalMetrics, JournalRecord};
//!
//! let cfg = JournalConfig::new("/data/journal".into());
//! let journal = Journal::open(Arc::new(RealFs), cfg, JournalMetrics::unregistered(), &mut |rec| {
//!     // re-apply `rec` to ledger storage
//!     Ok(())
//! })?;
//! journal
//!     .append(JournalRecord::Fence { ledger_id: 7 })
//!     .await?; // durable now
//! let mark = journal.synced_mark();
//! // ... flush ledger storage ...
//! journal.checkpoint_complete(mark)?;
//! journal.close()?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry};
use tokio::sync::oneshot;

use crate::fs::SharedFs;

mod file;
mod prealloc;
use cms_bookie_format::journal as record;
mod replay;
mod writer;

#[cfg(test)]
mod tests;

pub use record::{JournalRecord, RECORD_DATA_BYTES_MAX};

/// The smallest journal file (`file_bytes`) that holds one entry record of
/// `data_bytes` bytes: the file header plus the aligned record.
pub fn file_bytes_min_for(data_bytes: usize) -> u64 {
    record::FILE_HEADER_BYTES
        + record::align_up((record::RECORD_HEADER_BYTES + 17 + data_bytes) as u64)
}

/// When an append is acknowledged relative to `fdatasync` (STYLE §7).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum SyncPolicy {
    /// Default: an append completes only after fdatasync of the group holding it.
    #[default]
    FsyncBeforeAck,
    /// Relaxed, opt-in: an append completes after write(); fdatasync every
    /// `relaxed_sync_interval_ms`. A power cut loses acknowledged records.
    RelaxedAckBeforeFsync,
}

/// Journal settings.
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// Journal directory; files live in `<dir>/current/`.
    pub dir: PathBuf,
    /// Size of each preallocated, zero-filled file (default 64 MiB).
    pub file_bytes: u64,
    /// A group is flushed once its first record has waited this long in it
    /// (default 500 µs); it is flushed earlier when the queue drains.
    pub group_commit_delay_us_max: u64,
    /// A group is flushed once it holds this many bytes (default 512 KiB).
    pub group_commit_bytes_max: usize,
    /// Bound of the append queue, in records (default 10,000).
    pub queue_records_max: usize,
    /// When appends are acknowledged (default fsync before ack).
    pub sync_policy: SyncPolicy,
    /// Sync period under [`SyncPolicy::RelaxedAckBeforeFsync`] (default 100 ms).
    pub relaxed_sync_interval_ms: u64,
    /// Recycled files kept ready for reuse (default 2); older ones are removed.
    pub spare_files_max: usize,
    /// Under fsync-before-ack, write each group with
    /// [`FsFile::write_durable_at`](crate::fs::FsFile::write_durable_at)
    /// (default true): on Linux one `O_DIRECT | O_DSYNC` write that bypasses
    /// the page cache, instead of a buffered write and an `fdatasync`. The
    /// same durability either way (an append completes only once its bytes
    /// are durable); it saves CPU and a system call per group. File systems
    /// without direct I/O (tmpfs) get the write + `fdatasync` pair anyway.
    pub direct_io: bool,
    /// Under fsync-before-ack, let the runtime thread that appended write a
    /// small group itself (default true) when the writer thread is idle:
    /// a flush task runs once the runtime's other ready work has queued its
    /// appends, and writes them as one group, saving the two thread
    /// hand-offs (wake the writer, wake the appender) per group. Groups of
    /// more than 4 records or 64 KiB, groups that need a rotation, and the
    /// second after such a write that took over 10 ms go to the writer
    /// thread, as does everything while it is busy. The same durability
    /// either way. An append must not block its runtime thread while it
    /// waits (none in the bookie does): the flush task needs that thread.
    pub inline_writes: bool,
}

impl JournalConfig {
    /// The defaults, with files in `<dir>/current/`.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            file_bytes: 64 * 1024 * 1024,
            group_commit_delay_us_max: 500,
            group_commit_bytes_max: 512 * 1024,
            queue_records_max: 10_000,
            sync_policy: SyncPolicy::FsyncBeforeAck,
            relaxed_sync_interval_ms: 100,
            spare_files_max: 2,
            direct_io: true,
            inline_writes: true,
        }
    }
}

/// A position in the journal: byte `offset` of file `file_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JournalMark {
    /// The journal file's sequence number.
    pub file_seq: u64,
    /// Byte offset in that file.
    pub offset: u64,
}

/// Why a journal operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// A file operation failed (the message names the file); fatal for the
    /// writer when it happens while writing.
    #[error("journal I/O error: {0}")]
    Io(String),
    /// `fdatasync` failed: the group is not durable and the journal accepts no
    /// more writes.
    #[error("journal fdatasync failed, the journal accepts no more writes: {0}")]
    SyncFailed(String),
    /// The journal holds a damaged record that was once durable: refuse to start.
    #[error("journal corrupt: {file} at offset {offset}: {reason}")]
    Corrupt {
        /// The file.
        file: String,
        /// Byte offset of the damage.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The append queue is at `queue_records_max`.
    #[error("journal queue is full")]
    QueueFull,
    /// The journal was closed.
    #[error("journal is closed")]
    Closed,
    /// The record's data (bytes) exceeds [`RECORD_DATA_BYTES_MAX`] or a file.
    #[error("journal record of {0} data bytes is too large")]
    TooLarge(usize),
}

/// Prometheus metrics of one journal.
#[derive(Debug, Clone)]
pub struct JournalMetrics {
    /// Time of each `fdatasync`, seconds; with direct I/O, of each group's
    /// durable write.
    fsync_seconds: Histogram,
    /// Time of each group's buffered data write (`pwrite`, before its
    /// sync), seconds; direct writes are timed in `fsync_seconds`.
    /// A write into the page cache is usually microseconds; a long one
    /// waited in the kernel (the file system's own journal, a page under
    /// writeback), and every append of the group and behind it waited too.
    write_seconds: Histogram,
    /// Records per flushed group.
    group_records: Histogram,
    /// Bytes written (padding included).
    written_bytes: IntCounter,
    /// Records waiting in the append queue.
    queue_records: IntGauge,
}

impl JournalMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self::build()?;
        registry.register(Box::new(m.fsync_seconds.clone()))?;
        registry.register(Box::new(m.write_seconds.clone()))?;
        registry.register(Box::new(m.group_records.clone()))?;
        registry.register(Box::new(m.written_bytes.clone()))?;
        registry.register(Box::new(m.queue_records.clone()))?;
        Ok(m)
    }

    /// Metrics registered nowhere (tests, tools).
    pub fn unregistered() -> Self {
        #[allow(
            clippy::expect_used,
            reason = "the metric names, help texts and buckets are constants known to be valid"
        )]
        Self::build().expect("constant metric options are valid")
    }

    fn build() -> Result<Self, prometheus::Error> {
        Ok(Self {
            fsync_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "cms_journal_fsync_seconds",
                    "Time of each journal fdatasync (with direct I/O: of each group's write, durable when it returns)",
                )
                .buckets(prometheus::exponential_buckets(50e-6, 2.0, 16)?),
            )?,
            write_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "cms_journal_write_seconds",
                    "Time of each journal group's buffered data write, before its fdatasync (direct I/O writes are timed as syncs)",
                )
                .buckets(prometheus::exponential_buckets(50e-6, 2.0, 16)?),
            )?,
            group_records: Histogram::with_opts(
                HistogramOpts::new(
                    "cms_journal_group_records",
                    "Records per journal group commit",
                )
                .buckets(prometheus::exponential_buckets(1.0, 2.0, 14)?),
            )?,
            written_bytes: IntCounter::new(
                "cms_journal_written_bytes_total",
                "Bytes written to journal files",
            )?,
            queue_records: IntGauge::new(
                "cms_journal_queue_records",
                "Records waiting in the journal append queue",
            )?,
        })
    }
}

/// State shared by the handles and the writer thread.
#[derive(Debug)]
struct Shared {
    fs: SharedFs,
    /// `<dir>/current`.
    current: PathBuf,
    cfg: JournalConfig,
    metrics: JournalMetrics,
    /// Set on the first fatal writer error.
    failed: AtomicBool,
    /// The error every append gets once `failed`.
    failure: OnceLock<JournalError>,
    /// Everything before it is durable.
    synced: Mutex<JournalMark>,
    /// The persisted checkpoint mark.
    checkpoint: Mutex<JournalMark>,
    /// Files ready for reuse.
    pool: Mutex<file::SparePool>,
    /// Number of the next pre-filled file.
    prealloc_seq: AtomicU64,
    /// Notified by the writer after each rotation (see [`Journal::rotated`]).
    rotated: tokio::sync::Notify,
}

impl Shared {
    /// The error an append gets when the writer is gone.
    fn terminal_error(&self) -> JournalError {
        match self.failure.get() {
            Some(e) if self.is_failed() => e.clone(),
            _ => JournalError::Closed,
        }
    }

    /// True after a fatal writer error.
    fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Records a fatal error: no more writes.
    fn fail(&self, e: JournalError) {
        let _ = self.failure.set(e.clone());
        if !self.failed.swap(true, Ordering::SeqCst) {
            tracing::error!(error = %e, "journal failed: the bookie must stop accepting writes");
        }
    }

    fn set_synced(&self, mark: JournalMark) {
        *lock(&self.synced) = mark;
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The journal: `Send + Sync`, cheap to clone (all clones share one writer).
#[derive(Debug, Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

#[cfg(test)]
impl Journal {
    /// See `writer::Core::inline_ready`.
    pub(crate) fn inline_ready(&self) -> bool {
        self.inner.core.inline_ready()
    }
}

struct Inner {
    shared: Arc<Shared>,
    core: Arc<writer::Core>,
    closed: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Wakes the preallocator; dropped (with the writer's) to stop it.
    prealloc_wake: Mutex<Option<SyncSender<()>>>,
    prealloc_thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.shared.cfg.dir)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Replays, in order, every record after the persisted checkpoint mark (cutting a torn tail, refusing
    /// corruption with JournalError::Corrupt), then starts the writer thread. `replay` may return Err to abort.
    pub fn open(
        fs: SharedFs,
        cfg: JournalConfig,
        metrics: JournalMetrics,
        replay: &mut dyn FnMut(JournalRecord) -> Result<(), String>,
    ) -> Result<Journal, JournalError> {
        let min_file_bytes = record::FILE_HEADER_BYTES + 2 * record::ALIGN_BYTES;
        if cfg.file_bytes < min_file_bytes {
            return Err(JournalError::Io(format!(
                "journal file_bytes {} is below the minimum {min_file_bytes}",
                cfg.file_bytes
            )));
        }
        let current = cfg.dir.join("current");
        fs.create_dir_all(&current)
            .map_err(|e| file::io_err("create dir", &current, e))?;
        fs.sync_dir(&cfg.dir)
            .map_err(|e| file::io_err("sync dir", &cfg.dir, e))?;
        let started = Instant::now();
        let mark = file::read_checkpoint(&fs, &current)?.unwrap_or((0, 0));
        let outcome = replay::replay(&fs, &current, mark, replay)?;
        tracing::info!(
            dir = %cfg.dir.display(),
            records = outcome.records,
            checkpoint_file = mark.0,
            checkpoint_offset = mark.1,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "journal replayed"
        );
        let mut pool = file::SparePool::default();
        file::recycle(
            &fs,
            &current,
            &mut pool,
            outcome.unused,
            cfg.spare_files_max,
        )?;
        // Pre-filled files left by a previous run may be incomplete.
        for p in fs
            .read_dir(&current)
            .map_err(|e| file::io_err("list", &current, e))?
            .into_iter()
            .filter(|p| file::is_prealloc(p))
        {
            fs.remove_file(&p)
                .map_err(|e| file::io_err("remove", &p, e))?;
        }
        let (prev_seq, prev_end) = outcome.last.unwrap_or((0, 0));
        let header = record::FileHeader {
            file_seq: outcome.next_seq,
            prev_seq,
            prev_end,
        };
        let first = file::start_file(&fs, &current, &mut pool, header, cfg.file_bytes)?;
        let synced = JournalMark {
            file_seq: outcome.next_seq,
            offset: record::FILE_HEADER_BYTES,
        };
        let shared = Arc::new(Shared {
            fs,
            current,
            metrics,
            failed: AtomicBool::new(false),
            failure: OnceLock::new(),
            synced: Mutex::new(synced),
            checkpoint: Mutex::new(JournalMark {
                file_seq: mark.0,
                offset: mark.1,
            }),
            pool: Mutex::new(pool),
            prealloc_seq: AtomicU64::new(0),
            rotated: tokio::sync::Notify::new(),
            cfg,
        });
        // One file ready before the first rotation; later ones in background.
        prealloc::top_up(&shared, None)?;
        let (wake, woken) = mpsc::sync_channel(1);
        let prealloc_thread = prealloc::spawn(shared.clone(), woken)?;
        let mut w = writer::Writer::new(shared.clone(), first, outcome.next_seq, wake.clone());
        w.load_head()?;
        let core = writer::Core::new(shared.clone(), w);
        let thread_core = core.clone();
        let thread = std::thread::Builder::new()
            .name("journal-writer".into())
            .spawn(move || thread_core.run_thread())
            .map_err(|e| JournalError::Io(format!("spawn journal writer: {e}")))?;
        Ok(Journal {
            inner: Arc::new(Inner {
                shared,
                core,
                closed: AtomicBool::new(false),
                thread: Mutex::new(Some(thread)),
                prealloc_wake: Mutex::new(Some(wake)),
                prealloc_thread: Mutex::new(Some(prealloc_thread)),
            }),
        })
    }

    /// Queues a record; resolves once it is durable (per the sync policy). QueueFull if the queue is at its bound
    /// (never blocks the caller), SyncFailed if the group's fdatasync failed (and every later append fails too).
    pub fn append(
        &self,
        rec: JournalRecord,
    ) -> impl Future<Output = Result<(), JournalError>> + Send + 'static {
        let queued = self.enqueue(rec);
        let shared = self.inner.shared.clone();
        async move {
            let rx = queued?;
            match rx.await {
                Ok(r) => r,
                Err(_) => Err(shared.terminal_error()),
            }
        }
    }

    /// Puts `rec` on the queue (synchronously, so appends keep call order).
    fn enqueue(
        &self,
        rec: JournalRecord,
    ) -> Result<oneshot::Receiver<Result<(), JournalError>>, JournalError> {
        // Failed and closed journals are refused by `push`, under its lock.
        let shared = &self.inner.shared;
        let data = record::data_len(&rec);
        let fits_file = record::align_up(record::record_len(&rec) as u64)
            <= shared.cfg.file_bytes - record::FILE_HEADER_BYTES;
        if data > RECORD_DATA_BYTES_MAX || !fits_file {
            return Err(JournalError::TooLarge(data));
        }
        let (done, rx) = oneshot::channel();
        if let writer::Queued::SpawnFlush(h) = self.inner.core.push(rec, done)? {
            h.spawn(self.inner.core.flush_task());
        }
        Ok(rx)
    }

    /// Resolves after the writer moved to a new file (at once if it did since
    /// the last call). The server checkpoints then: the finished file is
    /// recycled as the next spare, instead of the preallocator writing a new
    /// file of zeros (under a sustained load of tens of MiB/s a file fills in
    /// a second or two, far sooner than the periodic checkpoint comes).
    pub async fn rotated(&self) {
        self.inner.shared.rotated.notified().await;
    }

    /// Every record appended before this mark is durable (fsync-before-ack) — used as the checkpoint mark.
    pub fn synced_mark(&self) -> JournalMark {
        *lock(&self.inner.shared.synced)
    }

    /// Ledger storage has been flushed up to `mark`: persist it (a small CRC'd file, written + fsynced + renamed,
    /// dir synced) so replay starts there, and recycle files wholly before it. The mark never moves backwards.
    pub fn checkpoint_complete(&self, mark: JournalMark) -> Result<(), JournalError> {
        let shared = &self.inner.shared;
        let mut persisted = lock(&shared.checkpoint);
        let synced = self.synced_mark();
        let mark = if mark > synced {
            tracing::warn!(
                file_seq = mark.file_seq,
                offset = mark.offset,
                "checkpoint mark beyond the synced mark: clamped"
            );
            synced
        } else {
            mark
        };
        if mark <= *persisted {
            return Ok(());
        }
        file::write_checkpoint(&shared.fs, &shared.current, mark.file_seq, mark.offset)?;
        *persisted = mark;
        // Hold the pool while listing, so no spare is half-renamed by the writer.
        let mut pool = lock(&shared.pool);
        let old: Vec<PathBuf> = file::list_files(&shared.fs, &shared.current)?
            .into_iter()
            .filter(|(seq, _)| *seq < mark.file_seq)
            .map(|(_, p)| p)
            .collect();
        file::recycle(
            &shared.fs,
            &shared.current,
            &mut pool,
            old,
            shared.cfg.spare_files_max,
        )
    }

    /// True after an fdatasync error: the bookie must stop accepting writes.
    pub fn is_failed(&self) -> bool {
        self.inner.shared.is_failed()
    }

    /// Drains the queue, syncs, stops the writer thread. Idempotent.
    pub fn close(&self) -> Result<(), JournalError> {
        self.inner.close()
    }
}

impl Inner {
    fn close(&self) -> Result<(), JournalError> {
        let mut thread = lock(&self.thread);
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.core.close();
        }
        if let Some(t) = thread.take()
            && t.join().is_err()
        {
            self.shared
                .fail(JournalError::Io("journal writer thread panicked".into()));
        }
        // The writer thread dropped its sender; dropping ours stops the preallocator.
        lock(&self.prealloc_wake).take();
        if let Some(t) = lock(&self.prealloc_thread).take()
            && t.join().is_err()
        {
            tracing::warn!("journal preallocator thread panicked");
        }
        if self.shared.is_failed() {
            return Err(self.shared.terminal_error());
        }
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
