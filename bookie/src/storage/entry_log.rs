//! Entry logs: append-only files under `<ledger_dir>/current/` that interleave the
//! entries of every ledger (BookKeeper's entry logger, reference §3.4).
//!
//! File `<log id as 8 hex digits>.log` = a 16-byte header (`CMSELOG1` + log id,
//! big-endian u64) followed by records
//! `[len u32][crc32c u32][ledger u64][entry i64][data]` (big-endian), where `len`
//! counts the bytes after itself and the CRC32C covers ledger, entry and data.
//!
//! Promises: a record is read back only through [`decode_record`], which checks the
//! length, the CRC and the ids and reports any mismatch as a reason string (the
//! storage turns it into `StorageError::Corrupt`, never into "no entry"); every
//! write goes through [`crate::fs`]; [`LogWriter::sync`] makes every record
//! appended so far durable, including the directory entries of logs it created.
//! Each buffered write is written back as it goes ([`FsFile::write_out`]), and
//! with a [`Pace`] the writes are spread over time, so a checkpoint does not
//! hit the disk in one burst that journal syncs queue behind.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::BufMut;

#[cfg(test)]
pub(crate) use cms_bookie_format::entry_log::RECORD_PREFIX_BYTES;
pub(crate) use cms_bookie_format::entry_log::{
    LOG_HEADER_BYTES, LOG_MAGIC, decode_record, encode_record, record_bytes,
};

use crate::fs::{FsFile, OpenMode, SharedFs};

/// Appends are gathered in memory up to this many bytes before one `write_at`.
pub(crate) const WRITE_BUFFER_BYTES_MAX: usize = 1 << 20;

/// Where a record lives: its log, the offset of its first byte, its total size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    /// Entry log id.
    pub log_id: u32,
    /// Offset of the record's `len` field in the log.
    pub offset: u32,
    /// Record size in bytes, prefix included.
    pub size: u32,
}

impl Location {
    /// `(log_id << 32 | offset, size)`, the form kept in the index.
    pub(crate) fn to_index(self) -> (u64, u32) {
        (
            (u64::from(self.log_id) << 32) | u64::from(self.offset),
            self.size,
        )
    }

    /// Inverse of [`Location::to_index`].
    pub(crate) fn from_index((packed, size): (u64, u32)) -> Location {
        Location {
            log_id: (packed >> 32) as u32,
            offset: packed as u32,
            size,
        }
    }

    /// Offset just past the record.
    pub(crate) fn end(self) -> u64 {
        u64::from(self.offset) + u64::from(self.size)
    }
}

/// Path of log `log_id` in `dir`.
pub(crate) fn log_path(dir: &Path, log_id: u32) -> PathBuf {
    dir.join(format!("{log_id:08x}.log"))
}

/// The log id of a path named like [`log_path`] makes, if it is one.
pub(crate) fn parse_log_name(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let hex = name.strip_suffix(".log")?;
    if hex.len() != 8 {
        return None;
    }
    u32::from_str_radix(hex, 16).ok()
}

/// Open log files shared by readers, the writer and GC.
#[derive(Debug)]
pub(crate) struct LogFiles {
    fs: SharedFs,
    dir: PathBuf,
    open: RwLock<HashMap<u32, Arc<dyn FsFile>>>,
}

impl LogFiles {
    /// Logs of `dir`, opened lazily.
    pub(crate) fn new(fs: SharedFs, dir: PathBuf) -> LogFiles {
        LogFiles {
            fs,
            dir,
            open: RwLock::new(HashMap::new()),
        }
    }

    /// The directory of the logs.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file system.
    pub(crate) fn fs(&self) -> &SharedFs {
        &self.fs
    }

    /// The file of log `log_id` for entry reads, opened read-only if not yet
    /// open. Shared handles are advised random ([`FsFile::advise_random`]):
    /// entry reads bring in their own read-ahead, so the kernel reads no more
    /// than they ask for.
    pub(crate) fn get(&self, log_id: u32) -> io::Result<Arc<dyn FsFile>> {
        if let Some(f) = self.open.read().map_err(poisoned)?.get(&log_id) {
            return Ok(f.clone());
        }
        let file = self.fs.open(&log_path(&self.dir, log_id), OpenMode::Read)?;
        advise_random(log_id, file.as_ref());
        let mut open = self.open.write().map_err(poisoned)?;
        Ok(open.entry(log_id).or_insert(file).clone())
    }

    /// A handle of its own on log `log_id` for a scan from start to end
    /// (compaction): not shared, so the kernel's read-ahead serves it.
    pub(crate) fn open_for_scan(&self, log_id: u32) -> io::Result<Arc<dyn FsFile>> {
        self.fs.open(&log_path(&self.dir, log_id), OpenMode::Read)
    }

    /// Registers a file the writer created (entry reads use it too).
    pub(crate) fn insert(&self, log_id: u32, file: Arc<dyn FsFile>) -> io::Result<()> {
        advise_random(log_id, file.as_ref());
        self.open.write().map_err(poisoned)?.insert(log_id, file);
        Ok(())
    }

    /// Forgets and removes log `log_id` (the caller made sure nothing points into it).
    pub(crate) fn remove(&self, log_id: u32) -> io::Result<()> {
        self.open.write().map_err(poisoned)?.remove(&log_id);
        let path = log_path(&self.dir, log_id);
        if self.fs.exists(&path) {
            self.fs.remove_file(&path)?;
        }
        self.fs.sync_dir(&self.dir)
    }

    /// Ids of every log file in the directory, ascending.
    pub(crate) fn list(&self) -> io::Result<Vec<u32>> {
        let mut ids: Vec<u32> = self
            .fs
            .read_dir(&self.dir)?
            .iter()
            .filter_map(|p| parse_log_name(p))
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }
}

/// Advice only: a failure is logged and the file is used as it is.
fn advise_random(log_id: u32, file: &dyn FsFile) {
    if let Err(e) = file.advise_random() {
        tracing::debug!(log_id, error = %e, "entry log: random-read advice refused");
    }
}

fn poisoned<T>(_: T) -> io::Error {
    io::Error::other("entry log table lock poisoned")
}

/// The single appender of entry logs (flush and compaction, serialised by the
/// storage's flush lock).
#[derive(Debug)]
pub(crate) struct LogWriter {
    files: Arc<LogFiles>,
    /// Roll to a new log before a record would end past this offset.
    log_bytes_max: u64,
    /// Id the next created log gets.
    next_log_id: u32,
    /// The log being appended, with the offset of its next byte.
    current: Option<(u32, Arc<dyn FsFile>, u64)>,
    /// Records not yet written to `current`, starting at its offset.
    buf: Vec<u8>,
    /// Logs written to since the last sync (rolled ones included).
    unsynced: Vec<Arc<dyn FsFile>>,
    /// A log was created since the last sync: the directory needs a sync.
    dir_dirty: bool,
    /// Spreads writes over time while set.
    pace: Option<Pace>,
}

/// A rate limit on [`LogWriter`]'s writes: at most `bytes_per_s` on average
/// since it was set, until `hurry` turns true (a full write cache: adds wait
/// for this flush, so it goes as fast as it can).
#[derive(Debug)]
pub(crate) struct Pace {
    bytes_per_s: f64,
    started: Instant,
    written: u64,
    hurry: Arc<AtomicBool>,
}

impl Pace {
    /// A pace of `bytes_per_s` from now on, dropped when `hurry` turns true.
    pub(crate) fn new(bytes_per_s: f64, hurry: Arc<AtomicBool>) -> Pace {
        Pace {
            bytes_per_s,
            started: Instant::now(),
            written: 0,
            hurry,
        }
    }

    /// Counts `bytes` written; returns how long to wait before the next write.
    pub(crate) fn after(&mut self, bytes: u64) -> Option<Duration> {
        self.after_at(bytes, Instant::now())
    }

    /// [`Pace::after`] at time `now`.
    fn after_at(&mut self, bytes: u64, now: Instant) -> Option<Duration> {
        self.written += bytes;
        if self.hurry.load(Ordering::Acquire) {
            return None;
        }
        crate::fs::pace_wait(
            self.written,
            self.bytes_per_s,
            now.saturating_duration_since(self.started),
        )
        .map(|w| w.min(PACE_WAIT_MAX))
    }
}

/// The longest single wait of a paced writer: it waits in such steps, so it
/// notices `hurry` soon.
const PACE_WAIT_MAX: Duration = Duration::from_millis(100);

impl LogWriter {
    /// A writer whose first log will be `next_log_id`.
    pub(crate) fn new(files: Arc<LogFiles>, log_bytes_max: u64, next_log_id: u32) -> LogWriter {
        LogWriter {
            files,
            log_bytes_max,
            next_log_id,
            current: None,
            buf: Vec::new(),
            unsynced: Vec::new(),
            dir_dirty: false,
            pace: None,
        }
    }

    /// Sets or clears the pace of the writes that follow.
    pub(crate) fn set_pace(&mut self, pace: Option<Pace>) {
        self.pace = pace;
    }

    /// Id of the log being appended (or the next one to be created): GC never
    /// touches logs with this id or above.
    pub(crate) fn active_log_id(&self) -> u32 {
        match &self.current {
            Some((id, _, _)) => *id,
            None => self.next_log_id,
        }
    }

    /// Appends one record; returns where it will be once written.
    pub(crate) fn append(
        &mut self,
        ledger_id: u64,
        entry_id: i64,
        data: &[u8],
    ) -> io::Result<Location> {
        let size = record_bytes(data.len());
        let size32 = u32::try_from(size).map_err(|_| io::Error::other("record over 4 GiB"))?;
        let needs_roll = match &self.current {
            None => true,
            Some((_, _, offset)) => {
                let end = offset + self.buf.len() as u64 + size as u64;
                offset + self.buf.len() as u64 > LOG_HEADER_BYTES
                    && (end > self.log_bytes_max || end > u64::from(u32::MAX))
            }
        };
        if needs_roll {
            self.roll()?;
        }
        let Some((log_id, _, offset)) = &self.current else {
            return Err(io::Error::other("no current entry log after roll"));
        };
        let at = offset + self.buf.len() as u64;
        let loc = Location {
            log_id: *log_id,
            offset: u32::try_from(at)
                .map_err(|_| io::Error::other("entry log offset over 4 GiB"))?,
            size: size32,
        };
        encode_record(&mut self.buf, ledger_id, entry_id, data);
        if self.buf.len() >= WRITE_BUFFER_BYTES_MAX {
            self.write_buffer()?;
        }
        Ok(loc)
    }

    fn write_buffer(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let Some((_, file, offset)) = &mut self.current else {
            return Err(io::Error::other("buffered records without an entry log"));
        };
        file.write_at(&self.buf, *offset)?;
        // Write-behind: this chunk goes to the disk now, not in one burst
        // with the rest at the checkpoint's fdatasync (FsFile::write_out).
        file.write_out(*offset, self.buf.len() as u64)?;
        *offset += self.buf.len() as u64;
        let mut wait = self
            .pace
            .as_mut()
            .and_then(|p| p.after(self.buf.len() as u64));
        self.buf.clear();
        // In steps of at most PACE_WAIT_MAX, each re-checking `hurry`.
        while let Some(w) = wait {
            std::thread::sleep(w);
            wait = self.pace.as_mut().and_then(|p| p.after(0));
        }
        Ok(())
    }

    /// Closes the current log (its data stays pending a sync) and creates the next.
    pub(crate) fn roll(&mut self) -> io::Result<()> {
        self.write_buffer()?;
        if let Some((_, file, _)) = self.current.take() {
            self.unsynced.push(file);
        }
        let log_id = self.next_log_id;
        self.next_log_id = log_id
            .checked_add(1)
            .ok_or_else(|| io::Error::other("entry log ids exhausted"))?;
        let path = log_path(self.files.dir(), log_id);
        let file = self.files.fs().open(&path, OpenMode::CreateNew)?;
        let mut header = Vec::with_capacity(LOG_HEADER_BYTES as usize);
        header.extend_from_slice(LOG_MAGIC);
        header.put_u64(u64::from(log_id));
        file.write_at(&header, 0)?;
        self.files.insert(log_id, file.clone())?;
        self.dir_dirty = true;
        tracing::debug!(log_id, file = %path.display(), "entry log created");
        self.current = Some((log_id, file, LOG_HEADER_BYTES));
        Ok(())
    }

    /// Writes and `fdatasync`s everything appended so far (and the directory if a
    /// log was created). An error leaves the writer needing [`LogWriter::abandon`].
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        self.write_buffer()?;
        for file in self.unsynced.drain(..) {
            file.sync_data()?;
        }
        if let Some((_, file, _)) = &self.current {
            file.sync_data()?;
        }
        if self.dir_dirty {
            self.files.fs().sync_dir(self.files.dir())?;
            self.dir_dirty = false;
        }
        Ok(())
    }

    /// After a failed write or sync: drop buffered records and move on to a new
    /// log next time, so nothing is trusted from a file whose sync failed.
    pub(crate) fn abandon(&mut self) {
        self.buf.clear();
        self.unsynced.clear();
        self.current = None;
    }
}

#[cfg(test)]
mod pace_tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_pace_waits_until_the_bytes_written_are_due_never_longer_than_the_cap() {
        let hurry = Arc::new(AtomicBool::new(false));
        let mut p = Pace::new(4.0 * MIB as f64, hurry);
        let t0 = p.started;
        // 1 MiB at 4 MiB/s is due at 250 ms: at t0 that is a wait, capped.
        assert_eq!(p.after_at(MIB, t0), Some(PACE_WAIT_MAX));
        // At 200 ms, 50 ms are left.
        let w = p.after_at(0, t0 + Duration::from_millis(200)).unwrap();
        assert!((w.as_secs_f64() - 0.05).abs() < 1e-6, "{w:?}");
        // Behind schedule: no wait.
        assert_eq!(p.after_at(0, t0 + Duration::from_millis(300)), None);
        // 2 MiB are due at 500 ms.
        let w = p.after_at(MIB, t0 + Duration::from_millis(450)).unwrap();
        assert!((w.as_secs_f64() - 0.05).abs() < 1e-6, "{w:?}");
    }

    #[test]
    fn hurry_or_no_rate_means_no_wait() {
        let hurry = Arc::new(AtomicBool::new(false));
        let mut p = Pace::new(MIB as f64, hurry.clone());
        let t0 = p.started;
        assert!(p.after_at(MIB, t0).is_some());
        hurry.store(true, Ordering::Release);
        assert_eq!(p.after_at(MIB, t0), None);
        for rate in [0.0, -1.0, f64::NAN] {
            let mut p = Pace::new(rate, Arc::new(AtomicBool::new(false)));
            let t0 = p.started;
            assert_eq!(p.after_at(MIB, t0), None, "rate {rate}");
        }
    }
}
