//! The journal writer thread: group commit, `fdatasync` before ack, rotation.
//!
//! It takes the first queued append, then everything else already queued,
//! encoding each into one group buffer, until the queue is empty, the group
//! holds `group_commit_bytes_max` bytes, or the group's first record has
//! waited `group_commit_delay_us_max`. It then pads the group to
//! [`ALIGN_BYTES`](super::record::ALIGN_BYTES), writes it, and under
//! [`SyncPolicy::FsyncBeforeAck`] calls `fdatasync` **before** completing any
//! append of the group. With `direct_io` (the default) the write and its sync
//! are one call, [`FsFile::write_durable_at`]. Every group write covers whole
//! pages (but in a file whose size is not a page multiple): it starts with
//! the bytes already in the group's first page (the writer keeps them) and
//! runs on with zeros to its last page's end, so it can bypass the page
//! cache. Any I/O error is fatal: the group's appends get the error, the
//! shared state is marked failed and the thread exits (queued appends then
//! fail too). Nothing is retried.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::file::{self, io_err};
use super::record::{self, FILE_HEADER_BYTES, FileHeader};
use super::{JournalError, JournalMark, JournalRecord, Msg, Shared, SyncPolicy, lock};
use crate::fs::FsFile;

type Done = oneshot::Sender<Result<(), JournalError>>;

/// The page size group writes are extended to (zeros to the page's end).
pub(crate) const PAGE_BYTES: u64 = 4096;

/// The writer's state; lives on its thread.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    rx: Receiver<Msg>,
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
    /// Wakes the preallocator after a rotation.
    prealloc_wake: SyncSender<()>,
}

impl Writer {
    pub(crate) fn new(
        shared: Arc<Shared>,
        rx: Receiver<Msg>,
        file: Arc<dyn FsFile>,
        seq: u64,
        prealloc_wake: SyncSender<()>,
    ) -> Self {
        let cap = shared.cfg.group_commit_bytes_max.min(16 * 1024 * 1024);
        Self {
            shared,
            rx,
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
            prealloc_wake,
        }
    }

    fn path(&self) -> std::path::PathBuf {
        file::file_path(&self.shared.current, self.seq)
    }

    /// Runs until closed or failed.
    pub(crate) fn run(mut self) {
        if let Err(e) = self.run_loop() {
            self.shared.fail(e.clone());
            for w in self.waiters.drain(..) {
                let _ = w.send(Err(e.clone()));
            }
        }
        // Dropping `rx` makes every still-queued append fail with the
        // terminal error (failed) or Closed.
    }

    /// Bytes of records in the group being built.
    fn group_len(&self) -> usize {
        self.buf.len() - self.head_len
    }

    /// Loads the bytes of `write_pos`'s page before it (a new file's header)
    /// as the head of `buf`; the group is empty.
    fn load_head(&mut self) -> Result<(), JournalError> {
        let page_start = self.write_pos - self.write_pos % PAGE_BYTES;
        self.head_len = (self.write_pos - page_start) as usize;
        self.buf.clear();
        self.buf.resize(self.head_len, 0);
        if let Err(e) = self.file.read_exact_at(&mut self.buf, page_start) {
            return Err(io_err("read page head", &self.path(), e));
        }
        Ok(())
    }

    fn run_loop(&mut self) -> Result<(), JournalError> {
        self.load_head()?;
        let relaxed = self.shared.cfg.sync_policy == SyncPolicy::RelaxedAckBeforeFsync;
        let delay = Duration::from_micros(self.shared.cfg.group_commit_delay_us_max);
        let bytes_max = self.shared.cfg.group_commit_bytes_max;
        let interval = Duration::from_millis(self.shared.cfg.relaxed_sync_interval_ms);
        loop {
            let first = if relaxed && self.synced_pos < self.write_pos {
                let wait = interval.saturating_sub(self.last_sync.elapsed());
                match self.rx.recv_timeout(wait) {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => {
                        self.sync()?;
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match self.rx.recv() {
                    Ok(m) => m,
                    Err(_) => break,
                }
            };
            let mut closing = false;
            match first {
                Msg::Append { rec, done } => self.add(rec, done)?,
                Msg::Close => closing = true,
            }
            while !closing && self.group_len() < bytes_max && self.group_started.elapsed() < delay {
                match self.rx.try_recv() {
                    Ok(Msg::Append { rec, done }) => self.add(rec, done)?,
                    Ok(Msg::Close) | Err(TryRecvError::Disconnected) => closing = true,
                    Err(TryRecvError::Empty) => break,
                }
            }
            self.flush_group()?;
            if relaxed && self.last_sync.elapsed() >= interval && self.synced_pos < self.write_pos {
                self.sync()?;
            }
            if closing {
                break;
            }
        }
        self.flush_group()?;
        if self.synced_pos < self.write_pos {
            self.sync()?;
        }
        tracing::debug!(file = %self.path().display(), offset = self.write_pos, "journal writer stopped");
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
        self.last_start = record::encode_into(&mut self.buf, &rec, self.seq, self.synced_pos);
        self.waiters.push(done);
        Ok(())
    }

    /// Writes the group (padded), syncs it under fsync-before-ack, then
    /// completes its appends.
    fn flush_group(&mut self) -> Result<(), JournalError> {
        if self.group_len() == 0 {
            return Ok(());
        }
        record::mark_last_in_group(&mut self.buf, self.last_start);
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
        let _ = self.prealloc_wake.try_send(());
        self.shared.rotated.notify_one();
        Ok(())
    }
}
