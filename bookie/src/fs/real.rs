//! [`RealFs`]: the production [`Fs`] over `std::fs`, with `fdatasync` for
//! [`FsFile::sync_data`] and an `fsync` of the directory for [`Fs::sync_dir`].

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{DiskSpace, Fs, FsFile, OpenMode};

/// The operating system's files.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

#[derive(Debug)]
struct RealFile {
    file: File,
    /// The handle of [`FsFile::write_durable_at`], opened on its first use.
    direct: std::sync::Mutex<Direct>,
}

impl RealFile {
    fn new(file: File) -> Self {
        Self {
            file,
            direct: std::sync::Mutex::new(Direct::Untried),
        }
    }

    /// The default durable write: `pwrite`, then `fdatasync`.
    fn write_then_sync(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)?;
        self.file.sync_data()
    }
}

/// The state of a file's direct (`O_DIRECT | O_DSYNC`) handle.
#[derive(Debug)]
enum Direct {
    /// Not opened yet.
    Untried,
    /// Open. Direct I/O needs its memory aligned as well: the bytes are
    /// copied to the aligned part of `scratch` first.
    On { file: File, scratch: Vec<u8> },
    /// The file system refused direct I/O: durable writes are `pwrite` then
    /// `fdatasync`.
    Off,
}

/// Scratch memory above this is given back after the write that needed it.
const DIRECT_SCRATCH_KEEP_BYTES: usize = 4 << 20;

/// Opens a second, direct handle on the open file `file`: through
/// `/proc/self/fd`, so it is the same inode even if the path was renamed
/// since. `Off` when the file system (tmpfs, some FUSE) or the platform
/// refuses.
#[cfg(target_os = "linux")]
fn open_direct(file: &File) -> Direct {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(&proc_path)
    {
        Ok(file) => Direct::On {
            file,
            scratch: Vec::new(),
        },
        Err(e) => {
            tracing::info!(error = %e, "direct I/O refused: durable writes are write + fdatasync");
            Direct::Off
        }
    }
}

impl FsFile for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// One `pwrite` on an `O_DIRECT | O_DSYNC` handle: the bytes go from
    /// our memory to the disk and the device's cache is flushed (or the
    /// write is FUA) before the call returns, as `fdatasync` would, without
    /// the page cache, its writeback and a second system call. Unaligned
    /// writes, and files whose file system refuses direct I/O, take the
    /// `pwrite` + `fdatasync` pair.
    #[cfg(target_os = "linux")]
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let align = super::DIRECT_IO_ALIGN_BYTES;
        if buf.is_empty()
            || !offset.is_multiple_of(align)
            || !(buf.len() as u64).is_multiple_of(align)
        {
            return self.write_then_sync(buf, offset);
        }
        let mut d = self.direct.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*d, Direct::Untried) {
            *d = open_direct(&self.file);
        }
        let Direct::On { file, scratch } = &mut *d else {
            drop(d);
            return self.write_then_sync(buf, offset);
        };
        let align = align as usize;
        if scratch.len() < buf.len() + align {
            scratch.resize(buf.len() + align, 0);
        }
        let at = scratch.as_ptr().align_offset(align);
        let aligned = &mut scratch[at..at + buf.len()];
        aligned.copy_from_slice(buf);
        let r = file.write_all_at(aligned, offset);
        if scratch.len() > DIRECT_SCRATCH_KEEP_BYTES {
            *scratch = Vec::new();
        }
        match r {
            // EINVAL: the device wants a larger alignment than a page (or a
            // short write left an unaligned rest). The bytes may be partly
            // written; writing all of them again the buffered way is the
            // same result, and later writes go that way too.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(error = %e, "direct write refused: durable writes are write + fdatasync");
                *d = Direct::Off;
                drop(d);
                self.write_then_sync(buf, offset)
            }
            r => r,
        }
    }

    #[cfg(target_os = "linux")]
    #[allow(
        unsafe_code,
        reason = "sync_file_range has no safe wrapper in std or nix 0.30"
    )]
    fn write_out(&self, offset: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Ok(());
        };
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        let mut at = offset;
        let end = offset.saturating_add(len);
        while at < end {
            let n = (end - at).min(super::WRITE_OUT_CHUNK_BYTES as i64);
            // SAFETY: the descriptor is ours and open for the call; the
            // syscall takes integers only and touches no memory of ours.
            let r = unsafe { libc::sync_file_range(self.file.as_raw_fd(), at, n, flags) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            at += n;
        }
        Ok(())
    }

    #[cfg(target_os = "linux")]
    fn advise_random(&self) -> io::Result<()> {
        nix::fcntl::posix_fadvise(
            &self.file,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM,
        )
        .map_err(io::Error::from)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
}

impl Fs for RealFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FsFile>> {
        let mut opts = OpenOptions::new();
        opts.read(true);
        match mode {
            OpenMode::Read => {}
            OpenMode::ReadWrite => {
                opts.write(true);
            }
            OpenMode::CreateOrOpen => {
                opts.write(true).create(true);
            }
            OpenMode::CreateNew => {
                opts.write(true).create_new(true);
            }
        }
        let file = opts.open(path).map_err(|e| with_path(e, "open", path))?;
        Ok(Arc::new(RealFile::new(file)))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path).map_err(|e| with_path(e, "create dir", path))
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(path).map_err(|e| with_path(e, "read dir", path))? {
            out.push(entry?.path());
        }
        Ok(out)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path).map_err(|e| with_path(e, "remove", path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to).map_err(|e| with_path(e, "rename", from))
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)
            .and_then(|d| d.sync_all())
            .map_err(|e| with_path(e, "sync dir", path))
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn space(&self, path: &Path) -> io::Result<DiskSpace> {
        let st = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
        let frag = st.fragment_size() as u64;
        Ok(DiskSpace {
            total_bytes: st.blocks() as u64 * frag,
            available_bytes: st.blocks_available() as u64 * frag,
        })
    }
}

/// Keeps the error kind and adds what was done to which path.
fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes this thread has had read from storage (`/proc/thread-self/io`).
    #[cfg(target_os = "linux")]
    fn thread_disk_read_bytes() -> Option<u64> {
        let io = std::fs::read_to_string("/proc/thread-self/io").ok()?;
        io.lines()
            .find_map(|l| l.strip_prefix("read_bytes: "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Drops the file's cached pages (they are clean: written and synced).
    #[cfg(target_os = "linux")]
    fn evict(path: &Path) {
        let f = File::open(path).unwrap();
        nix::fcntl::posix_fadvise(
            &f,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
        .unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_handle_advised_random_reads_from_the_disk_only_the_bytes_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = RealFs.open(&path, OpenMode::CreateNew).unwrap();
        let data: Vec<u8> = (0..16usize << 20).map(|i| (i % 253) as u8).collect();
        f.write_at(&data, 0).unwrap();
        f.sync_data().unwrap();
        drop(f);
        // 16 reads of 4 KiB one after the other (64 KiB): the bytes the disk
        // was asked for.
        const PIECE: usize = 4096;
        const PIECES: usize = 16;
        let read_64k = |advise: bool, at: usize| -> Option<u64> {
            evict(&path);
            let h = RealFs.open(&path, OpenMode::Read).unwrap();
            if advise {
                h.advise_random().unwrap();
            }
            let before = thread_disk_read_bytes()?;
            let mut buf = vec![0u8; PIECE];
            for i in 0..PIECES {
                let off = at + i * PIECE;
                h.read_exact_at(&mut buf, off as u64).unwrap();
                assert_eq!(buf[..], data[off..off + PIECE]);
            }
            Some(thread_disk_read_bytes()? - before)
        };
        let (Some(plain), Some(random)) = (read_64k(false, 0), read_64k(true, 8 << 20)) else {
            eprintln!("skipped: no per-thread I/O accounting here");
            return;
        };
        // The control: without the advice the kernel reads ahead of
        // sequential reads (tmpfs, or read-ahead turned off, cannot show the
        // difference).
        let asked = (PIECE * PIECES) as u64;
        if plain < 2 * asked {
            eprintln!("skipped: no read-ahead seen on this file system ({plain} bytes)");
            return;
        }
        assert!(
            random <= asked + 16 * 1024,
            "64 KiB read on a handle advised random took {random} bytes from the disk \
             (without the advice: {plain})"
        );
    }

    #[test]
    fn write_out_succeeds_over_several_chunks_and_leaves_the_bytes_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let f = RealFs
            .open(&dir.path().join("f"), OpenMode::CreateNew)
            .unwrap();
        // Unaligned start, a length over two chunk boundaries.
        let len = 2 * super::super::WRITE_OUT_CHUNK_BYTES as usize + 12_345;
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        f.write_at(&data, 100).unwrap();
        f.write_out(100, len as u64).unwrap();
        // Nothing to write, a range past the end, a huge length: all fine.
        f.write_out(0, 0).unwrap();
        f.write_out(10 << 20, 4096).unwrap();
        f.write_out(0, u64::MAX).unwrap();
        let mut back = vec![0u8; len];
        f.read_exact_at(&mut back, 100).unwrap();
        assert_eq!(back, data);
        assert_eq!(f.len().unwrap(), 100 + len as u64);
    }

    /// Whether the file system under `dir` takes `O_DIRECT` at all.
    #[cfg(target_os = "linux")]
    fn takes_direct_io(dir: &Path) -> bool {
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new()
            .write(true)
            .create(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.join("probe"))
            .is_ok()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn durable_writes_read_back_as_written_aligned_or_not_and_after_a_rename() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        let f = RealFile::new(opened);
        let page = super::super::DIRECT_IO_ALIGN_BYTES as usize;
        // Buffered bytes first (as a journal file's zeros and header are),
        // then durable writes over them.
        f.write_at(&vec![0xEEu8; 4 * page], 0).unwrap();
        let a: Vec<u8> = (0..2 * page).map(|i| (i % 251) as u8).collect();
        f.write_durable_at(&a, page as u64).unwrap();
        let direct_taken = matches!(*f.direct.lock().unwrap(), Direct::On { .. });
        assert_eq!(
            direct_taken,
            takes_direct_io(dir.path()),
            "an aligned durable write uses direct I/O exactly where the file system takes it"
        );
        // Unaligned offset and length: the write + fdatasync pair.
        f.write_durable_at(b"unaligned", 3 * page as u64 + 5)
            .unwrap();
        // The path moves on (a journal file recycled under a new name): the
        // direct handle still writes the file it was opened on.
        let moved = dir.path().join("g");
        std::fs::rename(&path, &moved).unwrap();
        let b = vec![0x5Au8; page];
        f.write_durable_at(&b, 0).unwrap();
        let mut want = vec![0xEEu8; 4 * page];
        want[..page].copy_from_slice(&b);
        want[page..3 * page].copy_from_slice(&a);
        want[3 * page + 5..3 * page + 14].copy_from_slice(b"unaligned");
        // Through the buffered handle and through a fresh open of the file.
        let mut back = vec![0u8; 4 * page];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back == want, "the handle reads what was written");
        assert!(std::fs::read(&moved).unwrap() == want, "the file holds it");
        assert!(!path.exists());
    }

    #[test]
    fn write_read_sync_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let fs = RealFs;
        let path = dir.path().join("f");
        let f = fs.open(&path, OpenMode::CreateNew).unwrap();
        f.write_at(b"hello", 0).unwrap();
        f.write_at(b"world", 10).unwrap();
        f.sync_data().unwrap();
        assert_eq!(f.len().unwrap(), 15);
        let mut buf = [0u8; 15];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"hello\0\0\0\0\0world");
        let mut big = [0u8; 16];
        assert_eq!(
            f.read_exact_at(&mut big, 0).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert!(fs.open(&path, OpenMode::CreateNew).is_err());
        fs.sync_dir(dir.path()).unwrap();
        assert_eq!(fs.read_dir(dir.path()).unwrap(), vec![path.clone()]);
        let space = fs.space(dir.path()).unwrap();
        assert!(space.total_bytes > 0);
        assert!((0.0..=1.0).contains(&space.used_fraction()));
    }

    /// A file that records the length of every `read_at` it passes on.
    #[derive(Debug)]
    struct Recording {
        inner: Arc<dyn FsFile>,
        reads: std::sync::Mutex<Vec<usize>>,
    }

    impl FsFile for Recording {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            self.reads.lock().unwrap().push(buf.len());
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.inner.write_at(buf, offset)
        }
        fn sync_data(&self) -> io::Result<()> {
            self.inner.sync_data()
        }
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.inner.set_len(len)
        }
    }

    #[test]
    fn reads_in_pieces_ask_for_at_most_a_piece_and_return_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let f = Recording {
            inner: RealFs.open(&path, OpenMode::CreateNew).unwrap(),
            reads: Default::default(),
        };
        f.write_at(&data, 0).unwrap();
        let mut back = vec![0u8; 90_000];
        f.read_exact_in_pieces(&mut back, 7, 16 * 1024).unwrap();
        assert_eq!(back, data[7..90_007]);
        let reads = f.reads.lock().unwrap().clone();
        assert_eq!(reads.len(), 6, "{reads:?}");
        assert!(reads.iter().all(|&n| n <= 16 * 1024), "{reads:?}");
        // Past the end: the short piece fails as `read_exact_at` does.
        let mut over = vec![0u8; 40_000];
        assert_eq!(
            f.read_exact_in_pieces(&mut over, 70_000, 16 * 1024)
                .unwrap_err()
                .kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
