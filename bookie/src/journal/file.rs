//! Journal files on disk: naming (`<dir>/current/<file_seq:016x>.jnl`), the
//! checkpoint file (`<dir>/current/checkpoint`, written to a temporary name,
//! fsynced, renamed, directory fsynced), starting a file (recycling a spare,
//! taking a pre-filled `prealloc-<n>.zero` file, or creating one pre-filled
//! with zeros), and the pool of spare files.
//!
//! Files are pre-filled with zeros once (write + `fdatasync`) and then only
//! overwritten in place: syncing into merely `fallocate`d space makes every
//! `fdatasync` commit file-system metadata (BENCH.md "Floors"). A reused file is
//! never re-zeroed; its new header gives it a new `file_seq`, which is also the
//! generation stamped on its records, so its old records are recognisably old.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::JournalError;
use super::record::{self, FILE_HEADER_BYTES, FileHeader};
use crate::fs::{FsFile, OpenMode, SharedFs};

/// Name of the checkpoint file in `current/`.
const CHECKPOINT_NAME: &str = "checkpoint";
/// Temporary name the checkpoint is written under before the rename.
const CHECKPOINT_TMP_NAME: &str = "checkpoint.tmp";
/// Suffix of journal files.
const FILE_SUFFIX: &str = ".jnl";
/// Suffix of files pre-filled ahead of need.
const PREALLOC_SUFFIX: &str = ".zero";
/// Bytes of zeros written per call when pre-filling a file.
const ZERO_FILL_CHUNK_BYTES: usize = 1024 * 1024;

/// The path of journal file `seq`.
pub(crate) fn file_path(current: &Path, seq: u64) -> PathBuf {
    current.join(format!("{seq:016x}{FILE_SUFFIX}"))
}

/// The `file_seq` a journal file's name carries, if it is one.
pub(crate) fn parse_seq(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let hex = name.strip_suffix(FILE_SUFFIX)?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Maps an io error on `path` to [`JournalError::Io`].
pub(crate) fn io_err(what: &str, path: &Path, e: io::Error) -> JournalError {
    JournalError::Io(format!("{what} {}: {e}", path.display()))
}

/// The journal files in `current`, sorted by `file_seq`.
pub(crate) fn list_files(
    fs: &SharedFs,
    current: &Path,
) -> Result<Vec<(u64, PathBuf)>, JournalError> {
    let mut out: Vec<(u64, PathBuf)> = fs
        .read_dir(current)
        .map_err(|e| io_err("list", current, e))?
        .into_iter()
        .filter_map(|p| parse_seq(&p).map(|s| (s, p)))
        .collect();
    out.sort();
    Ok(out)
}

/// Reads the persisted checkpoint mark `(file_seq, offset)`, if any.
/// A damaged checkpoint file is corruption: replaying from the wrong place
/// could skip records.
pub(crate) fn read_checkpoint(
    fs: &SharedFs,
    current: &Path,
) -> Result<Option<(u64, u64)>, JournalError> {
    let path = current.join(CHECKPOINT_NAME);
    if !fs.exists(&path) {
        return Ok(None);
    }
    let f = fs
        .open(&path, OpenMode::Read)
        .map_err(|e| io_err("open", &path, e))?;
    let len = f.len().map_err(|e| io_err("stat", &path, e))?;
    let corrupt = |reason: &str| JournalError::Corrupt {
        file: path.display().to_string(),
        offset: 0,
        reason: reason.to_string(),
    };
    if len != record::CHECKPOINT_BYTES as u64 {
        return Err(corrupt("checkpoint file has the wrong length"));
    }
    let mut b = vec![0u8; record::CHECKPOINT_BYTES];
    f.read_exact_at(&mut b, 0)
        .map_err(|e| io_err("read", &path, e))?;
    record::decode_checkpoint(&b)
        .map(Some)
        .ok_or_else(|| corrupt("checkpoint file fails its CRC"))
}

/// Persists the checkpoint mark: temporary file written and fsynced, renamed
/// over the old one, directory fsynced.
pub(crate) fn write_checkpoint(
    fs: &SharedFs,
    current: &Path,
    file_seq: u64,
    offset: u64,
) -> Result<(), JournalError> {
    let tmp = current.join(CHECKPOINT_TMP_NAME);
    let path = current.join(CHECKPOINT_NAME);
    let f = fs
        .open(&tmp, OpenMode::CreateOrOpen)
        .map_err(|e| io_err("open", &tmp, e))?;
    f.set_len(0).map_err(|e| io_err("truncate", &tmp, e))?;
    f.write_at(&record::encode_checkpoint(file_seq, offset), 0)
        .map_err(|e| io_err("write", &tmp, e))?;
    f.sync_data().map_err(|e| io_err("fdatasync", &tmp, e))?;
    drop(f);
    fs.rename(&tmp, &path)
        .map_err(|e| io_err("rename", &tmp, e))?;
    fs.sync_dir(current)
        .map_err(|e| io_err("sync dir", current, e))
}

/// A rate limit on a zero fill: at most `bytes_per_s`, waiting on `stop`,
/// whose disconnection (the journal closing) ends the fill with
/// `ErrorKind::Interrupted`.
pub(crate) struct FillPace<'a> {
    pub(crate) bytes_per_s: f64,
    pub(crate) stop: &'a std::sync::mpsc::Receiver<()>,
}

/// Writes zeros over `[from, to)` of `f` (no sync), paced when asked.
fn zero_fill(f: &dyn FsFile, from: u64, to: u64, pace: Option<&FillPace<'_>>) -> io::Result<()> {
    let zeros = vec![0u8; ZERO_FILL_CHUNK_BYTES];
    let started = std::time::Instant::now();
    let mut at = from;
    while at < to {
        if let Some(p) = pace {
            while let Some(wait) = crate::fs::pace_wait(at - from, p.bytes_per_s, started.elapsed())
            {
                if let Err(std::sync::mpsc::RecvTimeoutError::Disconnected) =
                    p.stop.recv_timeout(wait)
                {
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        "the journal is closing",
                    ));
                }
            }
        }
        let n = (to - at).min(ZERO_FILL_CHUNK_BYTES as u64) as usize;
        f.write_at(&zeros[..n], at)?;
        // Write-behind, so the fill reaches the disk in chunks the journal's
        // syncs can slip between (FsFile::write_out).
        f.write_out(at, n as u64)?;
        at += n as u64;
    }
    Ok(())
}

/// Files ready to become the next journal file.
#[derive(Debug, Default)]
pub(crate) struct SparePool {
    /// Recycled journal files (their records are of older generations),
    /// oldest first; at most `spare_files_max`.
    pub(crate) recycled: VecDeque<PathBuf>,
    /// Files pre-filled with zeros ahead of need by the preallocator.
    pub(crate) zeroed: VecDeque<PathBuf>,
}

impl SparePool {
    /// The next file to use: a recycled one first.
    fn take(&mut self) -> Option<PathBuf> {
        self.recycled
            .pop_front()
            .or_else(|| self.zeroed.pop_front())
    }

    /// Whether no file is ready.
    pub(crate) fn is_empty(&self) -> bool {
        self.recycled.is_empty() && self.zeroed.is_empty()
    }
}

/// The path of pre-filled file `n` (not a journal file until renamed).
pub(crate) fn prealloc_path(current: &Path, n: u64) -> PathBuf {
    current.join(format!("prealloc-{n:016x}{PREALLOC_SUFFIX}"))
}

/// Whether `path` is a pre-filled file (left over ones are removed on open).
pub(crate) fn is_prealloc(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("prealloc-") && n.ends_with(PREALLOC_SUFFIX))
}

/// Creates `path` pre-filled with `file_bytes` zeros (paced when asked),
/// fsynced, its directory fsynced.
pub(crate) fn create_zeroed(
    fs: &SharedFs,
    current: &Path,
    path: &Path,
    file_bytes: u64,
    pace: Option<&FillPace<'_>>,
) -> Result<(), JournalError> {
    let f = fs
        .open(path, OpenMode::CreateNew)
        .map_err(|e| io_err("create", path, e))?;
    zero_fill(f.as_ref(), 0, file_bytes, pace).map_err(|e| io_err("zero-fill", path, e))?;
    f.sync_data().map_err(|e| io_err("fdatasync", path, e))?;
    fs.sync_dir(current)
        .map_err(|e| io_err("sync dir", current, e))
}

/// Starts journal file `seq`: takes a recycled spare (renamed, header
/// rewritten, not re-zeroed) or a pre-filled file from `pool`, or creates one
/// pre-filled with zeros, then
/// writes and fsyncs the header and fsyncs the directory. The caller holds the
/// pool lock, so a checkpoint never sees a spare half-renamed.
pub(crate) fn start_file(
    fs: &SharedFs,
    current: &Path,
    pool: &mut SparePool,
    header: FileHeader,
    file_bytes: u64,
) -> Result<Arc<dyn FsFile>, JournalError> {
    let path = file_path(current, header.file_seq);
    let f = match pool.take() {
        Some(spare) => {
            fs.rename(&spare, &path)
                .map_err(|e| io_err("rename spare", &spare, e))?;
            let f = fs
                .open(&path, OpenMode::ReadWrite)
                .map_err(|e| io_err("open", &path, e))?;
            let len = f.len().map_err(|e| io_err("stat", &path, e))?;
            if len < file_bytes {
                zero_fill(f.as_ref(), len, file_bytes, None)
                    .map_err(|e| io_err("zero-fill", &path, e))?;
            }
            tracing::debug!(file = %path.display(), from = %spare.display(), "journal file recycled");
            f
        }
        None => {
            let f = fs
                .open(&path, OpenMode::CreateNew)
                .map_err(|e| io_err("create", &path, e))?;
            zero_fill(f.as_ref(), 0, file_bytes, None)
                .map_err(|e| io_err("zero-fill", &path, e))?;
            tracing::debug!(file = %path.display(), file_bytes, "journal file created and zero-filled");
            f
        }
    };
    f.write_at(&header.encode(), 0)
        .map_err(|e| io_err("write header", &path, e))?;
    f.sync_data()
        .map_err(|e| JournalError::SyncFailed(format!("fdatasync {}: {e}", path.display())))?;
    fs.sync_dir(current)
        .map_err(|e| io_err("sync dir", current, e))?;
    debug_assert!(FILE_HEADER_BYTES < file_bytes);
    Ok(f)
}

/// Puts the files in `candidates` into the pool up to `spare_files_max`
/// recycled spares and removes the rest.
pub(crate) fn recycle(
    fs: &SharedFs,
    current: &Path,
    pool: &mut SparePool,
    candidates: Vec<PathBuf>,
    spare_files_max: usize,
) -> Result<(), JournalError> {
    let mut removed = false;
    for path in candidates {
        if pool.recycled.contains(&path) {
            continue;
        }
        if pool.recycled.len() < spare_files_max {
            tracing::debug!(file = %path.display(), "journal file kept as a spare");
            pool.recycled.push_back(path);
        } else {
            fs.remove_file(&path)
                .map_err(|e| io_err("remove", &path, e))?;
            tracing::debug!(file = %path.display(), "journal file removed");
            removed = true;
        }
    }
    if removed {
        fs.sync_dir(current)
            .map_err(|e| io_err("sync dir", current, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{Fs, RealFs};

    #[test]
    fn a_paced_fill_stops_when_the_journal_closes_and_a_free_one_fills_it_all() {
        let dir = tempfile::tempdir().unwrap();
        let f = RealFs
            .open(&dir.path().join("z"), OpenMode::CreateNew)
            .unwrap();
        let len = 3 * ZERO_FILL_CHUNK_BYTES as u64;
        // One byte a second: the first chunk is due at once, then it waits,
        // and the gone sender (a closed journal) ends the wait.
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
        drop(tx);
        let pace = FillPace {
            bytes_per_s: 1.0,
            stop: &rx,
        };
        let err = zero_fill(f.as_ref(), 0, len, Some(&pace)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Interrupted);
        assert_eq!(f.len().unwrap(), ZERO_FILL_CHUNK_BYTES as u64);
        // Unpaced: the whole range.
        zero_fill(f.as_ref(), 0, len, None).unwrap();
        assert_eq!(f.len().unwrap(), len);
    }

    #[test]
    fn file_names_round_trip_and_others_are_ignored() {
        let p = file_path(Path::new("/j/current"), 0x1f);
        assert_eq!(p, Path::new("/j/current/000000000000001f.jnl"));
        assert_eq!(parse_seq(&p), Some(0x1f));
        assert_eq!(parse_seq(Path::new("/j/current/checkpoint")), None);
        assert_eq!(parse_seq(Path::new("/j/current/1f.jnl")), None);
        assert_eq!(
            parse_seq(Path::new("/j/current/zzzzzzzzzzzzzzzz.jnl")),
            None
        );
    }
}
