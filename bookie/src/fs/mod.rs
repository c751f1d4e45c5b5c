//! The storage seam: every byte the journal and the entry logs write to disk goes
//! through [`Fs`] and [`FsFile`], so tests can run the real bookie on a
//! fault-injecting implementation (RELIABILITY P0-3 power loss, P0-10 fsync
//! error) instead of the operating system's files.
//!
//! The API is positional (`read_at` / `write_at`) and synchronous: the journal
//! and the entry logger each run on their own thread, and positional I/O lets a
//! reader share a file with the writer without seeking.
//!
//! Promises of every implementation:
//! - data written with [`FsFile::write_at`] is durable only after a later
//!   [`FsFile::sync_data`] on that file returned `Ok`;
//! - a file created (or renamed, or removed) is durable in its directory only
//!   after [`Fs::sync_dir`] of that directory returned `Ok`;
//! - an error from `sync_data` means the unsynced data may be lost: callers treat
//!   it as fatal for that data and never retry and trust (STYLE §7).
//!
//! [`RealFs`] is the production implementation over `std::fs`; [`FaultyFs`]
//! wraps it to lose unsynced writes on a simulated power cut or fail a sync.

use std::fmt::Debug;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod faulty;
mod real;

pub use faulty::FaultyFs;
pub use real::RealFs;

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    ReadWrite,
    /// Read and write; created empty if missing, kept as it is if present.
    CreateOrOpen,
    /// Read and write; the file must not exist yet.
    CreateNew,
}

/// The most bytes [`FsFile::write_out`] has in flight at a time: a journal
/// write behind it waits for about 1 ms of disk (at ≈ 270 MB/s).
pub const WRITE_OUT_CHUNK_BYTES: u64 = 256 * 1024;

/// The alignment (file offset and length) [`FsFile::write_durable_at`]
/// needs to bypass the page cache: a memory page, which is also the largest
/// logical block size Linux allows, so it suits any device.
pub const DIRECT_IO_ALIGN_BYTES: u64 = 4096;

/// The default of the most bytes one entry-log read asks the disk for at a
/// time ([`FsFile::read_exact_in_pieces`]; `cms-bookie serve
/// --read-io-bytes-max`): about 2 ms of disk at ≈ 270 MB/s.
pub const READ_PIECE_BYTES: usize = 512 * 1024;

/// A file opened through an [`Fs`]. Positional I/O; shared between threads.
pub trait FsFile: Send + Sync + Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read
    /// (0 at or past the end of the file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Writes all of `buf` at `offset`, extending the file if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Makes every write so far durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;

    /// Writes all of `buf` at `offset` and makes those bytes durable before
    /// returning: `Ok` promises what [`FsFile::write_at`] then
    /// [`FsFile::sync_data`] promise for them, and an error means they may
    /// be lost (fatal for them, as a `sync_data` error is). Other unsynced
    /// writes to the file are not necessarily made durable. The default is
    /// exactly that pair of calls; [`RealFs`] does it in one `pwrite` that
    /// bypasses the page cache (`O_DIRECT | O_DSYNC`) when `offset` and
    /// `buf.len()` are multiples of [`DIRECT_IO_ALIGN_BYTES`] and the file
    /// system takes direct I/O, and falls back to the pair otherwise.
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
        self.sync_data()
    }

    /// Writes `[offset, offset + len)` back to the disk and waits for it, in
    /// pieces of [`WRITE_OUT_CHUNK_BYTES`] one after the other, without a
    /// device cache flush and without making anything durable
    /// (`sync_file_range(2)` on Linux). Background writers (checkpoints, the
    /// journal's pre-filled files) call it after each chunk they write, so
    /// their data reaches the disk in small pieces that a journal sync on the
    /// same disk waits behind at most one of, instead of one burst at their
    /// final `fdatasync`. A no-op where unsupported; durability still comes
    /// only from [`FsFile::sync_data`].
    fn write_out(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }

    /// Tells the OS that this handle's reads are random, so it reads exactly
    /// the bytes asked for and nothing ahead of them
    /// (`posix_fadvise(POSIX_FADV_RANDOM)` on Linux). The bookie's entry-log
    /// readers do their own read-ahead; the kernel's own, on top, turns one
    /// read into large background reads that a journal sync on the same disk
    /// waits behind (docs/isolation.md). Advice only: a no-op where
    /// unsupported, and reads return the same bytes either way.
    fn advise_random(&self) -> io::Result<()> {
        Ok(())
    }

    /// The file's current length in bytes.
    fn len(&self) -> io::Result<u64>;

    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Truncates or extends (with zeros) the file to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Reads exactly `buf.len()` bytes at `offset`, or fails with
    /// `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "short read: {done} of {} bytes at offset {offset}",
                        buf.len()
                    ),
                ));
            }
            done += n;
        }
        Ok(())
    }

    /// [`FsFile::read_exact_at`] in reads of at most `piece` bytes, one after
    /// the other. One large read is one request at the disk, and a journal
    /// write or flush that arrives behind it waits for all of it (several
    /// ms for a few MiB); in pieces it waits for one piece at most, and the
    /// disk scheduler puts it before the next piece when the reads run in
    /// the idle I/O class (as [`FsFile::write_out`] does for background
    /// writes; docs/isolation.md).
    fn read_exact_in_pieces(&self, buf: &mut [u8], offset: u64, piece: usize) -> io::Result<()> {
        let mut at = offset;
        for chunk in buf.chunks_mut(piece.max(1)) {
            self.read_exact_at(chunk, at)?;
            at += chunk.len() as u64;
        }
        Ok(())
    }
}

/// A file system: the operations the bookie's storage needs on paths.
pub trait Fs: Send + Sync + Debug {
    /// Opens `path` as `mode` says.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FsFile>>;

    /// Creates `path` and its missing parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// The entries of directory `path` (full paths), in no particular order.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>>;

    /// Removes the file `path`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Renames `from` to `to`, replacing `to` if it exists.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Makes the directory's entries (creates, renames, removes) durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;

    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> bool;

    /// Total and available bytes of the file system holding `path`.
    fn space(&self, path: &Path) -> io::Result<DiskSpace>;
}

/// Space on one file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSpace {
    /// Capacity, in bytes.
    pub total_bytes: u64,
    /// Bytes an unprivileged writer can still use.
    pub available_bytes: u64,
}

impl DiskSpace {
    /// Fraction of the capacity in use, 0.0..=1.0.
    pub fn used_fraction(&self) -> f64 {
        if self.total_bytes == 0 {
            return 1.0;
        }
        1.0 - (self.available_bytes as f64 / self.total_bytes as f64)
    }
}

/// How long a writer that paces itself to `bytes_per_s` waits before its
/// next write, having written `written` bytes in `elapsed` since it started:
/// the time those bytes are due at that rate minus the time spent, `None`
/// when it is not ahead (or the rate is not a positive number). Both paced
/// background writers (journal pre-fill, entry-log flush) use it.
pub(crate) fn pace_wait(written: u64, bytes_per_s: f64, elapsed: Duration) -> Option<Duration> {
    if bytes_per_s.is_nan() || bytes_per_s <= 0.0 {
        return None;
    }
    // A rate so low that the due time overflows a Duration waits "forever"
    // (the callers' waits are bounded or interruptible).
    Duration::try_from_secs_f64(written as f64 / bytes_per_s)
        .unwrap_or(Duration::MAX)
        .checked_sub(elapsed)
        .filter(|w| !w.is_zero())
}

/// The file system type every storage component takes.
pub type SharedFs = Arc<dyn Fs>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_wait_is_the_time_due_at_the_rate_minus_the_time_spent() {
        let ms = Duration::from_millis;
        // 1 MiB at 10 MiB/s is due at 100 ms.
        let mib = 1 << 20;
        let rate = 10.0 * mib as f64;
        assert_eq!(pace_wait(mib, rate, ms(40)), Some(ms(60)));
        assert_eq!(pace_wait(mib, rate, ms(100)), None, "on time: no wait");
        assert_eq!(pace_wait(mib, rate, ms(250)), None, "behind: no wait");
        assert_eq!(pace_wait(0, rate, Duration::ZERO), None);
        for no_rate in [0.0, -1.0, f64::NAN] {
            assert_eq!(pace_wait(mib, no_rate, Duration::ZERO), None, "{no_rate}");
        }
        // A due time beyond a Duration's range is a long wait, not a panic.
        assert_eq!(
            pace_wait(u64::MAX, 1e-300, ms(1)),
            Some(Duration::MAX - ms(1))
        );
    }
}
