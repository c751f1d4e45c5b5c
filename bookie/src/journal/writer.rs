//! The journal's writers: group commit, `fdatasync` before ack, rotation.
//!
//! Appends go into one queue ([`Core`]). A group is written by whoever holds
//! the writer state, which takes records from the queue's head only while
//! holding it, so groups keep the queue's order:
//! - **inline**: while the writer thread is idle, an append under a tokio
//!   runtime schedules a flush task there. The task first yields (so the
//!   runtime's other ready tasks, and the socket reads its I/O driver finds,
//!   queue their appends too), then writes the queue as one group on that
//!   thread if it is small ([`INLINE_RECORDS_MAX`], [`INLINE_BYTES_MAX`]) and
//!   fits the current file. No hand-off to another thread and back: in W2
//!   that was two of a bookie add's four wake-ups.
//! - **the writer thread** takes everything else: larger groups, rotations,
//!   appends made outside a runtime, relaxed mode, and every append while
//!   it is active (it keeps flushing until it finds the queue empty; appends
//!   meanwhile only queue, no wake-up). An inline write slower than
//!   [`INLINE_SLOW`] hands the next [`INLINE_PAUSE`] to it, so a slow disk
//!   stalls that thread and not the runtime's reads.
//!
//! A group takes the first queued append, then everything else queued, until
//! the queue is empty, the group holds `group_commit_bytes_max` bytes, or the
//! group's first record has waited `group_commit_delay_us_max`. It is padded
//! to [`ALIGN_BYTES`](super::record::ALIGN_BYTES), written, and under
//! [`SyncPolicy::FsyncBeforeAck`] synced **before** any append of the group
//! completes. With `direct_io` (the default) the write and its sync are one
//! call, [`FsFile::write_durable_at`]. Every group write covers whole pages
//! (but in a file whose size is not a page multiple): it starts with the
//! bytes already in the group's first page (the writer keeps them) and runs
//! on with zeros to its last page's end, so it can bypass the page cache. Any
//! I/O error is fatal: the group's appends and every queued one get the
//! error, the shared state is marked failed, later appends fail, and the
//! thread exits. Nothing is retried.

use std::collections::VecDeque;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, TryLockError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::file::{self, io_err};
use super::record::{self, FILE_HEADER_BYTES, FileHeader};
use super::{JournalError, JournalMark, JournalRecord, Shared, SyncPolicy, lock};
use crate::fs::FsFile;

pub(crate) type Done = oneshot::Sender<Result<(), JournalError>>;

/// The page size group writes are extended to (zeros to the page's end).
pub(crate) const PAGE_BYTES: u64 = 4096;

/// The largest group a runtime thread writes itself; a larger one goes to
/// the writer thread (a large write would hold the runtime too long, and a
/// large group means the journal is busy, where the thread's pipelining pays).
pub(crate) const INLINE_BYTES_MAX: u64 = 64 * 1024;
/// The most records a runtime thread writes as one group; more go to the
/// writer thread (many records queued at once mean a busy journal).
pub(crate) const INLINE_RECORDS_MAX: usize = 4;
/// A runtime thread's group write slower than this pauses inline writes for
/// [`INLINE_PAUSE`]: a slow disk then blocks only the writer thread, and the
/// runtime goes on serving reads and other requests.
pub(crate) const INLINE_SLOW: Duration = Duration::from_millis(10);
/// See [`INLINE_SLOW`].
pub(crate) const INLINE_PAUSE: Duration = Duration::from_secs(1);

/// The append queue and who flushes it.
#[derive(Default)]
struct Queue {
    items: VecDeque<(JournalRecord, Done)>,
    /// The writer thread flushes until it finds the queue empty; appends
    /// meanwhile only queue (no wake-up: the thread looks before it sleeps).
    thread_active: bool,
    /// A flush task is scheduled on the appender's runtime.
    inline_pending: bool,
    /// `close` was called: no more appends; the thread drains and stops.
    closing: bool,
    /// Inline writes are paused until then (see [`INLINE_SLOW`]).
    inline_paused_until: Option<Instant>,
}

/// What the appender must do after queueing.
#[must_use]
pub(crate) enum Queued {
    /// Nothing: a flush is already due.
    Nothing,
    /// Spawn [`Core::flush_task`] on this runtime.
    SpawnFlush(tokio::runtime::Handle),
}

/// The queue and the writer state, shared by the journal handles, the writer
/// thread and flush tasks. Whoever holds `writer` writes, and takes records
/// from the head of the queue only while holding it, so groups keep the
/// queue's order. Lock order: a thread that holds `queue` only ever
/// `try_lock`s `writer`.
pub(crate) struct Core {
    pub(crate) shared: Arc<Shared>,
    queue: Mutex<Queue>,
    /// Wakes the writer thread.
    cv: Condvar,
    writer: Mutex<Writer>,
}

impl Core {
    pub(crate) fn new(shared: Arc<Shared>, writer: Writer) -> Arc<Self> {
        Arc::new(Self {
            shared,
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            writer: Mutex::new(writer),
        })
    }

    /// Queues an append (in call order). Fails fast when closed, failed or
    /// at the queue's bound.
    pub(crate) fn push(&self, rec: JournalRecord, done: Done) -> Result<Queued, JournalError> {
        let shared = &self.shared;
        let mut q = lock(&self.queue);
        // Checked under the queue lock: `close` and `fail_all` drain it under
        // the same lock, so nothing is queued after they looked. A failure
        // is reported before a close.
        if shared.is_failed() {
            return Err(shared.terminal_error());
        }
        if q.closing {
            return Err(JournalError::Closed);
        }
        if q.items.len() >= shared.cfg.queue_records_max.max(1) {
            return Err(JournalError::QueueFull);
        }
        shared.metrics.queue_records.inc();
        q.items.push_back((rec, done));
        if q.thread_active || q.inline_pending {
            return Ok(Queued::Nothing);
        }
        let inline = shared.cfg.inline_writes
            && shared.cfg.sync_policy == SyncPolicy::FsyncBeforeAck
            && q.inline_paused_until.is_none_or(|t| Instant::now() >= t);
        if inline && let Ok(h) = tokio::runtime::Handle::try_current() {
            q.inline_pending = true;
            return Ok(Queued::SpawnFlush(h));
        }
        q.thread_active = true;
        self.cv.notify_one();
        Ok(Queued::Nothing)
    }

    /// Whether the next lone append would be written inline: the writer
    /// thread is not busy, no flush task is pending and inline writes are
    /// not paused. For tests that must not race the writer thread's return
    /// to idle (a loaded machine may keep it marked busy a while after its
    /// last group completed) or a pause after a slow write.
    #[cfg(test)]
    pub(crate) fn inline_ready(&self) -> bool {
        let q = lock(&self.queue);
        !q.thread_active
            && !q.inline_pending
            && q.inline_paused_until.is_none_or(|t| Instant::now() >= t)
    }

    /// A task that lets the runtime's other ready work (and the socket
    /// reads the I/O driver finds) queue their appends first, then writes
    /// the group on this thread ([`Core::flush_inline`]). Dropped unrun (the
    /// runtime shutting down), it hands the queue to the writer thread.
    pub(crate) fn flush_task(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        let mut guard = FlushGuard(Some(Arc::downgrade(self)));
        async move {
            tokio::task::yield_now().await;
            if let Some(core) = guard.0.take().and_then(|w| w.upgrade()) {
                core.flush_inline();
            }
        }
    }

    /// Writes everything queued on the calling thread if it is a small
    /// group (at most [`INLINE_RECORDS_MAX`] records and [`INLINE_BYTES_MAX`]
    /// bytes) that fits the current file and nobody else is writing;
    /// otherwise hands the queue to the writer thread.
    fn flush_inline(&self) {
        let mut q = lock(&self.queue);
        q.inline_pending = false;
        if q.thread_active || q.closing || q.items.is_empty() {
            return; // the thread has it (closing: it drains), or nothing to do
        }
        let mut w = match self.writer.try_lock() {
            Ok(w) => w,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return self.hand_off(q),
        };
        if self.shared.is_failed() {
            return; // fail_all drained the queue
        }
        let small = q.items.len() <= INLINE_RECORDS_MAX && {
            let bytes: u64 = q
                .items
                .iter()
                .map(|(r, _)| record::record_len(r) as u64)
                .sum();
            bytes <= INLINE_BYTES_MAX.min(self.shared.cfg.group_commit_bytes_max as u64)
                && w.fits(bytes)
        };
        if !small {
            drop(w);
            return self.hand_off(q);
        }
        let items = std::mem::take(&mut q.items);
        drop(q);
        let t = Instant::now();
        let r = items
            .into_iter()
            .try_for_each(|(rec, done)| w.add(rec, done))
            .and_then(|()| w.flush_group());
        if let Err(e) = r {
            return self.fail_all(&mut w, e);
        }
        if t.elapsed() > INLINE_SLOW {
            tracing::warn!(
                elapsed_us = t.elapsed().as_micros() as u64,
                "slow journal write on a runtime thread: the writer thread takes the next second's groups"
            );
            lock(&self.queue).inline_paused_until = Some(Instant::now() + INLINE_PAUSE);
        }
    }

    /// The writer thread takes over the queue.
    fn hand_off(&self, mut q: std::sync::MutexGuard<'_, Queue>) {
        if !q.thread_active && !q.items.is_empty() {
            q.thread_active = true;
            self.cv.notify_one();
        }
    }

    /// A fatal error: the writer's group and every queued append get it, no
    /// more appends are taken, the writer thread stops.
    fn fail_all(&self, w: &mut Writer, e: JournalError) {
        // `failed` is set before the queue is drained under its lock, so an
        // append either queued before (drained here) or sees `failed`.
        self.shared.fail(e.clone());
        for d in w.waiters.drain(..) {
            let _ = d.send(Err(e.clone()));
        }
        let mut q = lock(&self.queue);
        for (_, d) in q.items.drain(..) {
            self.shared.metrics.queue_records.dec();
            let _ = d.send(Err(e.clone()));
        }
        self.cv.notify_all();
    }

    /// Stops taking appends; the writer thread drains the queue and stops.
    pub(crate) fn close(&self) {
        let mut q = lock(&self.queue);
        q.closing = true;
        self.cv.notify_all();
    }

    /// The writer thread: flushes while it is handed the queue, runs relaxed
    /// mode's periodic sync, drains the queue on close. Returns when closed
    /// or failed.
    pub(crate) fn run_thread(self: Arc<Self>) {
        let relaxed = self.shared.cfg.sync_policy == SyncPolicy::RelaxedAckBeforeFsync;
        let interval = Duration::from_millis(self.shared.cfg.relaxed_sync_interval_ms);
        let r = (|| -> Result<(), JournalError> {
            loop {
                // Only the thread syncs in relaxed mode, so this stays true
                // until it acts on it.
                let sync_in = if relaxed {
                    let w = lock(&self.writer);
                    (w.synced_pos < w.write_pos)
                        .then(|| interval.saturating_sub(w.last_sync.elapsed()))
                } else {
                    None
                };
                let mut q = lock(&self.queue);
                let closing = loop {
                    if self.shared.is_failed() {
                        return Ok(());
                    }
                    if q.closing {
                        break true;
                    }
                    if q.thread_active {
                        if !q.items.is_empty() {
                            break false;
                        }
                        q.thread_active = false;
                    }
                    match sync_in {
                        Some(d) if d.is_zero() => break false,
                        Some(d) => {
                            let (g, t) = self
                                .cv
                                .wait_timeout(q, d)
                                .unwrap_or_else(|p| p.into_inner());
                            q = g;
                            if t.timed_out() {
                                break false;
                            }
                        }
                        None => q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner()),
                    }
                };
                drop(q);
                let mut w = lock(&self.writer);
                if self.shared.is_failed() {
                    return Ok(()); // a flush task failed while we waited
                }
                let r = if closing {
                    w.drain_and_sync(&self.queue)
                } else {
                    w.take_and_flush(&self.queue).and_then(|()| {
                        if relaxed
                            && w.last_sync.elapsed() >= interval
                            && w.synced_pos < w.write_pos
                        {
                            w.sync()?;
                        }
                        Ok(())
                    })
                };
                if let Err(e) = r {
                    self.fail_all(&mut w, e.clone());
                    return Err(e);
                }
                if closing {
                    return Ok(());
                }
            }
        })();
        let mut w = lock(&self.writer);
        // With the thread gone, nothing rotates: let the preallocator stop.
        w.prealloc_wake.take();
        if r.is_ok() {
            tracing::debug!(file = %w.path().display(), offset = w.write_pos, "journal writer stopped");
        }
    }
}

/// See [`Core::flush_task`].
struct FlushGuard(Option<Weak<Core>>);

impl Drop for FlushGuard {
    fn drop(&mut self) {
        if let Some(core) = self.0.take().and_then(|w| w.upgrade()) {
            let mut q = lock(&core.queue);
            q.inline_pending = false;
            core.hand_off(q);
        }
    }
}

/// The writer's state: the file, the group being built, its waiters.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    /// The file being written.
    file: Arc<dyn FsFile>,
    /// Its `file_seq` (= generation of its records).
    seq: u64,
    /// Where the next group goes (aligned).
    write_pos: u64,
    /// The file is durable up to here.
    synced_pos: u64,
    /// The group being built, after `head_len` bytes that are the file's
    /// bytes from the start of `write_pos`'s page up to `write_pos` (already
    /// written): `buf` is the file from `write_pos - head_len` on, so a
    /// group write starts on a page boundary.
    buf: Vec<u8>,
    /// Bytes of `buf` before the group (see `buf`).
    head_len: usize,
    /// Start of the last record in `buf`.
    last_start: usize,
    /// Appends waiting on the group in `buf`.
    waiters: Vec<Done>,
    /// When the group's first record was taken.
    group_started: Instant,
    /// Last successful sync (relaxed mode's timer).
    last_sync: Instant,
    /// Wakes the preallocator after a rotation; taken when the thread stops.
    prealloc_wake: Option<SyncSender<()>>,
}

impl Writer {
    pub(crate) fn new(
        shared: Arc<Shared>,
        file: Arc<dyn FsFile>,
        seq: u64,
        prealloc_wake: SyncSender<()>,
    ) -> Self {
        let cap = shared.cfg.group_commit_bytes_max.min(16 * 1024 * 1024);
        Self {
            shared,
            file,
            seq,
            write_pos: FILE_HEADER_BYTES,
            synced_pos: FILE_HEADER_BYTES,
            buf: Vec::with_capacity(cap + PAGE_BYTES as usize),
            head_len: 0,
            last_start: 0,
            waiters: Vec::new(),
            group_started: Instant::now(),
            last_sync: Instant::now(),
            prealloc_wake: Some(prealloc_wake),
        }
    }

    fn path(&self) -> std::path::PathBuf {
        file::file_path(&self.shared.current, self.seq)
    }

    /// Bytes of records in the group being built.
    fn group_len(&self) -> usize {
        self.buf.len() - self.head_len
    }

    /// Whether `bytes` more of records fit in the current file (no rotation).
    fn fits(&self, bytes: u64) -> bool {
        record::align_up(self.write_pos + self.group_len() as u64 + bytes)
            <= self.shared.cfg.file_bytes
    }

    /// Loads the bytes of `write_pos`'s page before it (a new file's header)
    /// as the head of `buf`; the group is empty.
    pub(crate) fn load_head(&mut self) -> Result<(), JournalError> {
        let page_start = self.write_pos - self.write_pos % PAGE_BYTES;
        self.head_len = (self.write_pos - page_start) as usize;
        self.buf.clear();
        self.buf.resize(self.head_len, 0);
        if let Err(e) = self.file.read_exact_at(&mut self.buf, page_start) {
            return Err(io_err("read page head", &self.path(), e));
        }
        Ok(())
    }

    /// Takes the queue's first record, then more while the queue has them,
    /// the group is under `group_commit_bytes_max` and its first record has
    /// waited less than `group_commit_delay_us_max`; writes the group.
    fn take_and_flush(&mut self, queue: &Mutex<Queue>) -> Result<(), JournalError> {
        let delay = Duration::from_micros(self.shared.cfg.group_commit_delay_us_max);
        let bytes_max = self.shared.cfg.group_commit_bytes_max;
        let mut first = true;
        loop {
            if !first && (self.group_len() >= bytes_max || self.group_started.elapsed() >= delay) {
                break;
            }
            let Some((rec, done)) = lock(queue).items.pop_front() else {
                break;
            };
            first = false;
            self.add(rec, done)?;
        }
        self.flush_group()
    }

    /// Writes every queued record, in groups, then syncs what is unsynced.
    fn drain_and_sync(&mut self, queue: &Mutex<Queue>) -> Result<(), JournalError> {
        while !lock(queue).items.is_empty() {
            self.take_and_flush(queue)?;
        }
        self.flush_group()?;
        if self.synced_pos < self.write_pos {
            self.sync()?;
        }
        Ok(())
    }

    /// Encodes `rec` into the group, flushing and rotating first if the file
    /// has no room for it.
    fn add(&mut self, rec: JournalRecord, done: Done) -> Result<(), JournalError> {
        self.shared.metrics.queue_records.dec();
        let len = record::record_len(&rec) as u64;
        let end = record::align_up(self.write_pos + self.group_len() as u64 + len);
        if end > self.shared.cfg.file_bytes {
            self.flush_group()?;
            self.rotate()?;
        }
        if self.group_len() == 0 {
            self.group_started = Instant::now();
        }
        // Each record's CRC is computed once: the group's previous record is
        // sealed now that it is not the last; the last one in flush_group.
        if self.group_len() > 0 {
            record::seal(&mut self.buf, self.last_start, false);
        }
        self.last_start = record::encode_unsealed(&mut self.buf, &rec, self.seq, self.synced_pos);
        self.waiters.push(done);
        Ok(())
    }

    /// Writes the group (padded), syncs it under fsync-before-ack, then
    /// completes its appends.
    fn flush_group(&mut self) -> Result<(), JournalError> {
        if self.group_len() == 0 {
            return Ok(());
        }
        record::seal(&mut self.buf, self.last_start, true);
        let padded = record::align_up(self.group_len() as u64) as usize;
        // The write goes on with zeros to the end of the page the group ends
        // in (within the file): it then covers every page it starts whole,
        // so the kernel never reads a page from the disk to merge a partial
        // write into it. A recycled or evicted journal page would otherwise
        // cost a synchronous read per new page, queued behind whatever else
        // the disk is reading. The next group starts at `write_pos` as
        // always and overwrites these zeros; zeros past the last group are
        // what a pre-filled file holds anyway (replay's clean end).
        // The write starts at the page's start (the head: bytes written
        // before, rewritten unchanged), so it covers whole pages but in the
        // file's last page.
        let start = self.write_pos - self.head_len as u64;
        let end = self.write_pos + padded as u64;
        let file_end = self.shared.cfg.file_bytes.max(end);
        let page_end = end.next_multiple_of(PAGE_BYTES).min(file_end);
        self.buf.resize((page_end - start) as usize, 0);
        let records = self.waiters.len();
        let durable_write =
            self.shared.cfg.sync_policy == SyncPolicy::FsyncBeforeAck && self.shared.cfg.direct_io;
        let t = Instant::now();
        if durable_write {
            // THE durability point (direct I/O): the write returns once its
            // bytes are on the disk past its cache; no append of the group
            // completes before (DESIGN §4.1).
            if let Err(e) = self.file.write_durable_at(&self.buf, start) {
                let path = self.path();
                tracing::error!(file = %path.display(), offset = start, error = %e, "journal durable write failed");
                return Err(JournalError::SyncFailed(format!(
                    "durable write {}: {e}",
                    path.display()
                )));
            }
            self.shared
                .metrics
                .fsync_seconds
                .observe(t.elapsed().as_secs_f64());
        } else {
            if let Err(e) = self.file.write_at(&self.buf, start) {
                return Err(io_err("write", &self.path(), e));
            }
            self.shared
                .metrics
                .write_seconds
                .observe(t.elapsed().as_secs_f64());
        }
        self.write_pos = end;
        // The new head: the bytes of the page `write_pos` is now in.
        let keep_from = (end - end % PAGE_BYTES - start) as usize;
        self.buf.truncate((end - start) as usize);
        self.buf.drain(..keep_from);
        self.head_len = self.buf.len();
        let m = &self.shared.metrics;
        m.written_bytes.inc_by(padded as u64);
        m.group_records.observe(records as f64);
        if durable_write {
            self.mark_synced();
        } else if self.shared.cfg.sync_policy == SyncPolicy::FsyncBeforeAck {
            // THE durability point: no append of this group completes before
            // its bytes are fdatasynced (DESIGN §4.1).
            self.sync()?;
        }
        for w in self.waiters.drain(..) {
            let _ = w.send(Ok(()));
        }
        Ok(())
    }

    /// `fdatasync` of the current file; advances the synced mark.
    fn sync(&mut self) -> Result<(), JournalError> {
        let t = Instant::now();
        if let Err(e) = self.file.sync_data() {
            let path = self.path();
            tracing::error!(file = %path.display(), offset = self.write_pos, error = %e, "journal fdatasync failed");
            return Err(JournalError::SyncFailed(format!(
                "fdatasync {}: {e}",
                path.display()
            )));
        }
        self.shared
            .metrics
            .fsync_seconds
            .observe(t.elapsed().as_secs_f64());
        self.mark_synced();
        Ok(())
    }

    /// Everything written so far is durable.
    fn mark_synced(&mut self) {
        self.last_sync = Instant::now();
        self.synced_pos = self.write_pos;
        self.shared.set_synced(JournalMark {
            file_seq: self.seq,
            offset: self.synced_pos,
        });
    }

    /// Moves to the next file. The old one is synced first: the new file's
    /// header says where the old one ends, and replay holds us to it.
    fn rotate(&mut self) -> Result<(), JournalError> {
        if self.synced_pos < self.write_pos {
            self.sync()?;
        }
        let header = FileHeader {
            file_seq: self.seq + 1,
            prev_seq: self.seq,
            prev_end: self.write_pos,
        };
        let started = Instant::now();
        let f = {
            let mut pool = lock(&self.shared.pool);
            file::start_file(
                &self.shared.fs,
                &self.shared.current,
                &mut pool,
                header,
                self.shared.cfg.file_bytes,
            )?
        };
        tracing::info!(
            from = self.seq,
            to = header.file_seq,
            elapsed_us = started.elapsed().as_micros() as u64,
            "journal rotated"
        );
        self.file = f;
        self.seq = header.file_seq;
        self.write_pos = FILE_HEADER_BYTES;
        self.synced_pos = FILE_HEADER_BYTES;
        self.load_head()?;
        self.shared.set_synced(JournalMark {
            file_seq: self.seq,
            offset: self.synced_pos,
        });
        // After the mark moved: the preallocator reads how far into the new
        // file we are. Full means a wake-up is already pending.
        if let Some(w) = &self.prealloc_wake {
            let _ = w.try_send(());
        }
        self.shared.rotated.notify_one();
        Ok(())
    }
}
