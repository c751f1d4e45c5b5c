//! Replay: reads every record after the checkpoint mark, in order, and decides
//! where the log ends.
//!
//! Rules (RELIABILITY P0-8):
//! - only files at or after the mark's file, with a valid header naming the
//!   same `file_seq` as the file name, hold records; a record counts only if
//!   it carries its file's generation (older ones are from before a reuse);
//! - each valid file links to its predecessor (`prev_seq`, `prev_end`); the
//!   predecessor's records must then reach exactly `prev_end` — they were
//!   synced before the successor was started — else the journal is corrupt;
//! - in the last file, the scan stops at the first invalid record. If a later
//!   valid record (searched at aligned offsets) says the file was synced past
//!   that point, the bad record was durable once: corruption, refuse to start.
//!   Otherwise it is a torn tail (never acknowledged): cut, with a warning;
//! - a file with a damaged header is left out unless a later file names it as
//!   its predecessor (then corruption).
//!
//! Nothing is truncated or rewritten here: the writer always continues in a
//! fresh or recycled file.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::file::{self, io_err};
use super::record::{self, FILE_HEADER_BYTES, FileHeader};
use super::{JournalError, JournalRecord};
use crate::fs::{OpenMode, SharedFs};

/// What replay learnt about the files.
#[derive(Debug)]
pub(crate) struct ReplayOutcome {
    /// The last valid file and where its records end: the new file's predecessor.
    pub(crate) last: Option<(u64, u64)>,
    /// A `file_seq` above every file present.
    pub(crate) next_seq: u64,
    /// Files holding nothing to replay (before the mark, or damaged headers
    /// nobody links to), oldest first: spares or to be removed.
    pub(crate) unused: Vec<PathBuf>,
    /// Records replayed.
    pub(crate) records: u64,
}

struct ValidFile {
    seq: u64,
    path: PathBuf,
    header: FileHeader,
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> JournalError {
    JournalError::Corrupt {
        file: path.display().to_string(),
        offset,
        reason: reason.into(),
    }
}

/// Replays `current` from `mark` (`(0, 0)` = from the first file).
pub(crate) fn replay(
    fs: &SharedFs,
    current: &Path,
    mark: (u64, u64),
    cb: &mut dyn FnMut(JournalRecord) -> Result<(), String>,
) -> Result<ReplayOutcome, JournalError> {
    let files = file::list_files(fs, current)?;
    let next_seq = files.last().map_or(1, |(s, _)| s + 1);
    let mut unused = Vec::new();
    let mut valid: Vec<ValidFile> = Vec::new();
    let mut damaged: HashSet<u64> = HashSet::new();
    let mut damaged_paths = Vec::new();
    for (seq, path) in files {
        if seq < mark.0 {
            unused.push(path);
            continue;
        }
        let f = fs
            .open(&path, OpenMode::Read)
            .map_err(|e| io_err("open", &path, e))?;
        let mut h = vec![0u8; FILE_HEADER_BYTES as usize];
        let header = match f.read_exact_at(&mut h, 0) {
            Ok(()) => FileHeader::decode(&h).filter(|h| h.file_seq == seq),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => None,
            Err(e) => return Err(io_err("read header", &path, e)),
        };
        match header {
            Some(header) => valid.push(ValidFile { seq, path, header }),
            None => {
                damaged.insert(seq);
                damaged_paths.push((seq, path));
            }
        }
    }
    if mark.0 != 0 && valid.first().map(|v| v.seq) != Some(mark.0) {
        return Err(corrupt(
            &file::file_path(current, mark.0),
            0,
            "the checkpoint names this journal file, which is missing or has a damaged header",
        ));
    }
    for (i, v) in valid.iter().enumerate() {
        if damaged.contains(&v.header.prev_seq) {
            return Err(corrupt(
                &file::file_path(current, v.header.prev_seq),
                0,
                format!("damaged header, but file {:016x} follows it", v.seq),
            ));
        }
        if i > 0 && v.header.prev_seq != valid[i - 1].seq {
            return Err(corrupt(
                &v.path,
                0,
                format!(
                    "follows file {:016x}, but the previous file present is {:016x}",
                    v.header.prev_seq,
                    valid[i - 1].seq
                ),
            ));
        }
    }
    for (seq, path) in damaged_paths {
        tracing::warn!(file = %path.display(), file_seq = seq, "journal file with a damaged header (a rotation cut by a crash): nothing replayed from it");
        unused.push(path);
    }

    let mut records = 0u64;
    let mut last = None;
    for (i, v) in valid.iter().enumerate() {
        let start = if v.seq == mark.0 {
            mark.1.max(FILE_HEADER_BYTES)
        } else {
            FILE_HEADER_BYTES
        };
        let successor_end = valid.get(i + 1).map(|n| n.header.prev_end);
        let end = replay_file(fs, v, start, successor_end, cb, &mut records)?;
        last = Some((v.seq, end));
    }
    Ok(ReplayOutcome {
        last,
        next_seq,
        unused,
        records,
    })
}

/// Replays one file from `start`; returns where its valid records end.
/// `successor_end`: where the next file says this one ends.
fn replay_file(
    fs: &SharedFs,
    v: &ValidFile,
    start: u64,
    successor_end: Option<u64>,
    cb: &mut dyn FnMut(JournalRecord) -> Result<(), String>,
    records: &mut u64,
) -> Result<u64, JournalError> {
    let path = &v.path;
    let f = fs
        .open(path, OpenMode::Read)
        .map_err(|e| io_err("open", path, e))?;
    let len = f.len().map_err(|e| io_err("stat", path, e))?;
    // The whole file is read at once: memory bounded by the file size
    // (`file_bytes`), one file at a time.
    let mut buf =
        vec![
            0u8;
            usize::try_from(len).map_err(|e| io_err("size", path, std::io::Error::other(e)))?
        ];
    f.read_exact_at(&mut buf, 0)
        .map_err(|e| io_err("read", path, e))?;
    let out =
        record::scan_file(&buf, start as usize, v.seq, successor_end, cb).map_err(|e| match e {
            record::ScanError::Corrupt { offset, reason } => corrupt(path, offset, reason),
            record::ScanError::Callback { offset, reason } => JournalError::Io(format!(
                "replay aborted by the caller at {} offset {offset}: {reason}",
                path.display()
            )),
        })?;
    *records += out.records;
    if let Some(reason) = out.torn_tail {
        tracing::warn!(
            file = %path.display(),
            offset = out.end,
            reason,
            "journal tail cut: records from here on were never synced"
        );
    }
    Ok(out.end)
}
