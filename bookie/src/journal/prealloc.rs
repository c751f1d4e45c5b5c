//! The preallocator: a background thread that keeps one file pre-filled with
//! zeros ready, so a rotation with no recycled spare renames a ready file
//! instead of stalling appends while `file_bytes` of zeros are written and
//! synced (≈ 0.25 s for 64 MiB on these disks).
//!
//! It is woken after each rotation; it does nothing if a file is ready or
//! `spare_files_max` is 0. Its errors are logged, never fatal: the writer then
//! creates the file itself (and fails on error there).
//!
//! It waits until the journal is half way through its file before filling:
//! a checkpoint usually recycles an older file by then, and a recycled file
//! needs no zeros (with checkpoints every 10 s and W2's load, no file is ever
//! filled after start-up). Then it fills at [`FILL_RATE_FACTOR`] times the rate the journal wrote the last
//! file (at least [`FILL_BYTES_PER_S_MIN`]), and writes each chunk back as it
//! goes ([`crate::fs::FsFile::write_out`]): the file is ready long before the
//! journal needs it, and the journal's syncs on the same disk never wait
//! behind a 64 MiB burst of zeros (which stalled W2's adds 20–200 ms when
//! three bookies on one disk rotated together). Closing the journal stops a
//! paced fill at once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::file;
use super::{JournalError, Shared, lock};

/// The fill never goes slower than this (bytes a second).
pub(crate) const FILL_BYTES_PER_S_MIN: f64 = 16.0 * 1024.0 * 1024.0;
/// How many times faster than the journal was written the fill goes.
pub(crate) const FILL_RATE_FACTOR: f64 = 4.0;

/// Makes one pre-filled file if none is ready (paced when asked).
pub(crate) fn top_up(
    shared: &Shared,
    pace: Option<&file::FillPace<'_>>,
) -> Result<(), JournalError> {
    if shared.cfg.spare_files_max == 0 || !lock(&shared.pool).is_empty() {
        return Ok(());
    }
    let n = shared.prealloc_seq.fetch_add(1, Ordering::SeqCst);
    let path = file::prealloc_path(&shared.current, n);
    file::create_zeroed(
        &shared.fs,
        &shared.current,
        &path,
        shared.cfg.file_bytes,
        pace,
    )?;
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
            let mut last = (Instant::now(), shared.metrics.written_bytes.get());
            while wake.recv().is_ok() {
                let now = (Instant::now(), shared.metrics.written_bytes.get());
                let pace = fill_pace(now.1.saturating_sub(last.1), now.0 - last.0);
                last = now;
                if !wait_until_needed(&shared, &wake) {
                    break;
                }
                if shared.is_failed() {
                    break;
                }
                let pace = file::FillPace {
                    bytes_per_s: pace,
                    stop: &wake,
                };
                if let Err(e) = top_up(&shared, Some(&pace)) {
                    // Closing (the fill stopped): the partial file is removed
                    // at the next open.
                    if let Err(TryRecvError::Disconnected) = wake.try_recv() {
                        break;
                    }
                    tracing::warn!(error = %e, "journal preallocation failed; rotation will create the file");
                }
            }
        })
        .map_err(|e| JournalError::Io(format!("spawn journal preallocator: {e}")))
}

/// Returns once a file should be filled: the journal is at least half way
/// through its current file, or a spare is ready (then `top_up` does
/// nothing). False when the journal is closing.
fn wait_until_needed(shared: &Shared, wake: &Receiver<()>) -> bool {
    loop {
        if shared.is_failed() || !lock(&shared.pool).is_empty() {
            return true;
        }
        if lock(&shared.synced).offset >= shared.cfg.file_bytes / 2 {
            return true;
        }
        match wake.recv_timeout(Duration::from_millis(50)) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return false,
        }
    }
}

/// The fill rate after the journal wrote `written` bytes in `took`.
pub(crate) fn fill_pace(written: u64, took: Duration) -> f64 {
    let rate = written as f64 / took.as_secs_f64().max(1e-3);
    (rate * FILL_RATE_FACTOR).max(FILL_BYTES_PER_S_MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fill_goes_faster_than_the_journal_and_never_below_the_floor() {
        // W2-like: 64 MiB in 6.4 s (10 MiB/s) -> 40 MiB/s.
        let mib = 1024.0 * 1024.0;
        let p = fill_pace(64 << 20, Duration::from_millis(6400));
        assert!((p - 40.0 * mib).abs() < 1.0, "{p}");
        // A slow journal: the floor.
        assert_eq!(
            fill_pace(1 << 20, Duration::from_secs(60)),
            FILL_BYTES_PER_S_MIN
        );
        // A fast one (W3): 4 x 200 MiB/s.
        let p = fill_pace(64 << 20, Duration::from_millis(320));
        assert!((p - 800.0 * mib).abs() < 1.0, "{p}");
        // No time elapsed: no division by zero, just very fast.
        assert!(fill_pace(1 << 20, Duration::ZERO).is_finite());
    }
}
