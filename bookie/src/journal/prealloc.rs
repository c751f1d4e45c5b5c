//! The preallocator: a background thread that keeps one file pre-filled with
//! zeros ready, so a rotation with no recycled spare renames a ready file
//! instead of stalling appends while `file_bytes` of zeros are written and
//! synced (≈ 0.25 s for 64 MiB on these disks).
//!
//! It is woken after each rotation; it does nothing if a file is ready or
//! `spare_files_max` is 0. Its errors are logged, never fatal: the writer then
//! creates the file itself (and fails on error there).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;

use super::file;
use super::{JournalError, Shared, lock};

/// Makes one pre-filled file if none is ready.
pub(crate) fn top_up(shared: &Shared) -> Result<(), JournalError> {
    if shared.cfg.spare_files_max == 0 || !lock(&shared.pool).is_empty() {
        return Ok(());
    }
    let n = shared.prealloc_seq.fetch_add(1, Ordering::SeqCst);
    let path = file::prealloc_path(&shared.current, n);
    file::create_zeroed(&shared.fs, &shared.current, &path, shared.cfg.file_bytes)?;
    tracing::debug!(file = %path.display(), "journal file pre-filled");
    lock(&shared.pool).zeroed.push_back(path);
    Ok(())
}

/// Starts the thread; it runs until every sender of `wake` is dropped.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    wake: Receiver<()>,
) -> Result<JoinHandle<()>, JournalError> {
    std::thread::Builder::new()
        .name("journal-prealloc".into())
        .spawn(move || {
            while wake.recv().is_ok() {
                if shared.failed.load(Ordering::SeqCst) {
                    break;
                }
                if let Err(e) = top_up(&shared) {
                    tracing::warn!(error = %e, "journal preallocation failed; rotation will create the file");
                }
            }
        })
        .map_err(|e| JournalError::Io(format!("spawn journal preallocator: {e}")))
}
