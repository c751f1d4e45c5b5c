//! [`FaultyFs`]: a fault-injecting [`Fs`] over [`RealFs`] for power-loss and
//! fsync-error tests (RELIABILITY P0-3, P0-10).
//!
//! `kill -9` keeps the page cache, so it cannot show that an acknowledged
//! write was never synced. `FaultyFs` can: it remembers, per file, the bytes
//! every unsynced `write_at` / `set_len` overwrote (their pre-images) and the
//! length at the last successful `sync_data`, and the directory entries
//! created or renamed since the last `sync_dir` of their directory.
//! [`FaultyFs::power_cut`] undoes all of that on the real files, then turns the
//! "machine" off: every later operation on this `FaultyFs` and on the files it
//! opened fails. A fresh [`RealFs`] or `FaultyFs` over the same directory sees
//! the post-crash state.
//!
//! Promises and limits of the model:
//! - data is lost at write granularity (a whole unsynced `write_at` is undone;
//!   no partially torn write — torn records are tested by truncating bytes);
//! - `remove_file` is treated as durable at once (its undo would need the
//!   removed content);
//! - directories made by `create_dir_all` are treated as durable.
//!
//! [`FaultyFs::fail_next_sync`] makes the next `sync_data` of any file fail
//! with `EIO` without syncing; [`FaultyFs::sync_count`] counts successful ones.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{DiskSpace, Fs, FsFile, OpenMode, RealFs};

/// A [`RealFs`] that can lose unsynced writes on demand and fail a sync.
/// Clones share one state.
#[derive(Debug, Clone, Default)]
pub struct FaultyFs {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    real: RealFs,
    state: Mutex<State>,
    /// The next `sync_data` fails with EIO.
    fail_next_sync: AtomicBool,
    /// Successful `sync_data` calls.
    syncs: AtomicU64,
    /// Set by `power_cut`: every operation fails.
    off: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Files opened through this fs, by current path.
    files: HashMap<PathBuf, Arc<Mutex<Track>>>,
    /// Directory changes not yet made durable by `sync_dir`, in order.
    dir_ops: Vec<DirOp>,
}

/// What is not yet durable in one file.
#[derive(Debug)]
struct Track {
    /// A handle on the real file (survives renames).
    real: Arc<dyn FsFile>,
    /// Length at the last successful sync (or when first opened).
    synced_len: u64,
    /// Bytes overwritten since the last sync: (offset, old bytes), in order.
    preimages: Vec<(u64, Vec<u8>)>,
}

/// A directory change that `power_cut` undoes unless its directory was synced.
#[derive(Debug)]
enum DirOp {
    /// A file was created at this path.
    Create(PathBuf),
    /// `from` was renamed to `to`; `replaced` is what `to` held before, if anything.
    Rename {
        from: PathBuf,
        to: PathBuf,
        replaced: Option<Vec<u8>>,
    },
}

impl DirOp {
    fn dir(&self) -> Option<&Path> {
        match self {
            DirOp::Create(p) => p.parent(),
            DirOp::Rename { to, .. } => to.parent(),
        }
    }
}

fn powered_off() -> io::Error {
    io::Error::other("FaultyFs: the power was cut")
}

impl FaultyFs {
    /// A fault-free `FaultyFs` over the operating system's files.
    pub fn new() -> Self {
        Self::default()
    }

    /// Loses every write, `set_len`, create and rename not yet made durable,
    /// then fails every later operation (see the module doc).
    pub fn power_cut(&self) {
        let mut st = self.lock();
        if self.inner.off.swap(true, Ordering::SeqCst) {
            return;
        }
        for (path, track) in &st.files {
            let mut t = lock_track(track);
            if let Err(e) = undo_track(&mut t) {
                tracing::warn!(file = %path.display(), error = %e, "FaultyFs: undo of unsynced writes failed");
            }
        }
        let ops = std::mem::take(&mut st.dir_ops);
        for op in ops.into_iter().rev() {
            let res = match op {
                DirOp::Create(p) => match std::fs::remove_file(&p) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    r => r,
                },
                DirOp::Rename { from, to, replaced } => {
                    std::fs::rename(&to, &from).and_then(|()| match replaced {
                        Some(bytes) => std::fs::write(&to, bytes),
                        None => Ok(()),
                    })
                }
            };
            if let Err(e) = res {
                tracing::warn!(error = %e, "FaultyFs: undo of an unsynced directory change failed");
            }
        }
        st.files.clear();
    }

    /// Makes the next `sync_data` (of any file) fail with `EIO` without syncing.
    pub fn fail_next_sync(&self) {
        self.inner.fail_next_sync.store(true, Ordering::SeqCst);
    }

    /// Number of successful `sync_data` calls so far.
    pub fn sync_count(&self) -> u64 {
        self.inner.syncs.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock()
    }

    fn check_on(&self) -> io::Result<()> {
        self.inner.check_on()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_on(&self) -> io::Result<()> {
        if self.off.load(Ordering::SeqCst) {
            Err(powered_off())
        } else {
            Ok(())
        }
    }
}

fn lock_track(t: &Mutex<Track>) -> MutexGuard<'_, Track> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

/// Restores pre-images newest first, then the length at the last sync.
fn undo_track(t: &mut Track) -> io::Result<()> {
    for (offset, old) in t.preimages.drain(..).rev() {
        t.real.write_at(&old, offset)?;
    }
    t.real.set_len(t.synced_len)?;
    t.real.sync_data()
}

/// Reads the current bytes of `[offset, offset + len)` that exist.
fn preimage(real: &dyn FsFile, offset: u64, len: u64) -> io::Result<Option<(u64, Vec<u8>)>> {
    let cur = real.len()?;
    if offset >= cur || len == 0 {
        return Ok(None);
    }
    let n = (cur - offset).min(len);
    let mut old = vec![0u8; usize::try_from(n).map_err(io::Error::other)?];
    real.read_exact_at(&mut old, offset)?;
    Ok(Some((offset, old)))
}

/// A file opened through a [`FaultyFs`].
#[derive(Debug)]
struct FaultyFile {
    fs: Arc<Inner>,
    track: Arc<Mutex<Track>>,
    /// Whether this handle may write.
    writable: bool,
}

impl FsFile for FaultyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.fs.check_on()?;
        let t = lock_track(&self.track);
        t.real.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "read-only handle",
            ));
        }
        let _st = self.fs.lock();
        self.fs.check_on()?;
        let mut t = lock_track(&self.track);
        if let Some(p) = preimage(t.real.as_ref(), offset, buf.len() as u64)? {
            t.preimages.push(p);
        }
        t.real.write_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        let _st = self.fs.lock();
        self.fs.check_on()?;
        if self.fs.fail_next_sync.swap(false, Ordering::SeqCst) {
            return Err(io::Error::from(nix::errno::Errno::EIO));
        }
        let mut t = lock_track(&self.track);
        t.real.sync_data()?;
        t.preimages.clear();
        t.synced_len = t.real.len()?;
        self.fs.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        self.fs.check_on()?;
        lock_track(&self.track).real.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "read-only handle",
            ));
        }
        let _st = self.fs.lock();
        self.fs.check_on()?;
        let mut t = lock_track(&self.track);
        if let Some(p) = preimage(t.real.as_ref(), len, u64::MAX - len)? {
            t.preimages.push(p);
        }
        t.real.set_len(len)
    }
}

impl Fs for FaultyFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FsFile>> {
        let mut st = self.lock();
        self.check_on()?;
        let existed = path.exists();
        // The tracking handle always writes (undo needs it); the caller's
        // handle honours `mode`.
        let real_mode = match mode {
            OpenMode::Read => OpenMode::ReadWrite,
            m => m,
        };
        let track = match st.files.get(path) {
            Some(t) => {
                // Still check that the caller's mode is satisfiable.
                if mode == OpenMode::CreateNew {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("open {}: exists", path.display()),
                    ));
                }
                t.clone()
            }
            None => {
                let real = self.inner.real.open(path, real_mode)?;
                let synced_len = real.len()?;
                let t = Arc::new(Mutex::new(Track {
                    real,
                    synced_len,
                    preimages: Vec::new(),
                }));
                st.files.insert(path.to_path_buf(), t.clone());
                t
            }
        };
        if !existed {
            st.dir_ops.push(DirOp::Create(path.to_path_buf()));
            // A file that did not exist before holds nothing durable.
            lock_track(&track).synced_len = 0;
        }
        Ok(Arc::new(FaultyFile {
            fs: self.inner.clone(),
            track,
            writable: mode != OpenMode::Read,
        }))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.check_on()?;
        self.inner.real.create_dir_all(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        self.check_on()?;
        self.inner.real.read_dir(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        self.check_on()?;
        self.inner.real.remove_file(path)?;
        st.files.remove(path);
        st.dir_ops
            .retain(|op| !matches!(op, DirOp::Create(p) if p == path));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.lock();
        self.check_on()?;
        let replaced = if to.exists() {
            Some(std::fs::read(to)?)
        } else {
            None
        };
        self.inner.real.rename(from, to)?;
        st.files.remove(to);
        if let Some(t) = st.files.remove(from) {
            st.files.insert(to.to_path_buf(), t);
        }
        st.dir_ops.push(DirOp::Rename {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
            replaced,
        });
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        self.check_on()?;
        self.inner.real.sync_dir(path)?;
        st.dir_ops.retain(|op| op.dir() != Some(path));
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        !self.inner.off.load(Ordering::SeqCst) && self.inner.real.exists(path)
    }

    fn space(&self, path: &Path) -> io::Result<DiskSpace> {
        self.check_on()?;
        self.inner.real.space(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(path: &Path) -> Vec<u8> {
        std::fs::read(path).unwrap()
    }

    #[test]
    fn power_cut_keeps_synced_bytes_and_loses_unsynced_writes() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultyFs::new();
        let path = dir.path().join("f");
        let f = fs.open(&path, OpenMode::CreateNew).unwrap();
        fs.sync_dir(dir.path()).unwrap();
        f.write_at(b"aaaa", 0).unwrap();
        f.sync_data().unwrap();
        f.write_at(b"bb", 1).unwrap();
        f.write_at(b"cccc", 4).unwrap();
        f.set_len(20).unwrap();
        assert_eq!(read_all(&path).len(), 20);
        fs.power_cut();
        assert_eq!(read_all(&path), b"aaaa");
        assert_eq!(fs.sync_count(), 1);
    }

    #[test]
    fn power_cut_undoes_a_shrinking_set_len() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultyFs::new();
        let path = dir.path().join("f");
        let f = fs.open(&path, OpenMode::CreateNew).unwrap();
        fs.sync_dir(dir.path()).unwrap();
        f.write_at(b"0123456789", 0).unwrap();
        f.sync_data().unwrap();
        f.set_len(3).unwrap();
        f.write_at(b"xy", 5).unwrap();
        fs.power_cut();
        assert_eq!(read_all(&path), b"0123456789");
    }

    #[test]
    fn power_cut_removes_files_created_since_the_dir_sync_and_undoes_renames() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultyFs::new();
        let kept = dir.path().join("kept");
        let lost = dir.path().join("lost");
        let target = dir.path().join("target");
        let moved = dir.path().join("moved");
        fs.open(&kept, OpenMode::CreateNew).unwrap();
        let t = fs.open(&target, OpenMode::CreateNew).unwrap();
        t.write_at(b"old", 0).unwrap();
        t.sync_data().unwrap();
        fs.sync_dir(dir.path()).unwrap();
        let l = fs.open(&lost, OpenMode::CreateNew).unwrap();
        l.write_at(b"new", 0).unwrap();
        l.sync_data().unwrap();
        fs.rename(&lost, &target).unwrap();
        fs.rename(&kept, &moved).unwrap();
        fs.power_cut();
        assert!(kept.exists());
        assert!(!moved.exists());
        assert!(
            !lost.exists(),
            "the created file is gone with its rename undone"
        );
        assert_eq!(read_all(&target), b"old");
    }

    #[test]
    fn synced_rename_survives_power_cut() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultyFs::new();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        let f = fs.open(&a, OpenMode::CreateNew).unwrap();
        f.write_at(b"data", 0).unwrap();
        f.sync_data().unwrap();
        fs.rename(&a, &b).unwrap();
        fs.sync_dir(dir.path()).unwrap();
        // An unsynced write through the handle after the rename is still lost.
        f.write_at(b"XX", 0).unwrap();
        fs.power_cut();
        assert!(!a.exists());
        assert_eq!(read_all(&b), b"data");
    }

    #[test]
    fn everything_fails_after_power_cut_and_a_fresh_fs_sees_the_crash_state() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultyFs::new();
        let path = dir.path().join("f");
        let f = fs.open(&path, OpenMode::CreateNew).unwrap();
        f.write_at(b"abc", 0).unwrap();
        f.sync_data().unwrap();
        fs.sync_dir(dir.path()).unwrap();
        fs.power_cut();
        assert!(f.write_at(b"x", 0).is_err());
        assert!(f.sync_data().is_err());
        let mut buf = [0u8; 1];
        assert!(f.read_at(&mut buf, 0).is_err());
        assert!(fs.open(&path, OpenMode::Read).is_err());
        assert!(fs.read_dir(dir.path()).is_err());
        assert!(!fs.exists(&path));
        let fresh = FaultyFs::new();
        let g = fresh.open(&path, OpenMode::Read).unwrap();
        let mut all = [0u8; 3];
        g.read_exact_at(&mut all, 0).unwrap();
        assert_eq!(&all, b"abc");
    }

    #[test]
    fn fail_next_sync_fails_once_with_eio_and_does_not_sync() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultyFs::new();
        let path = dir.path().join("f");
        let f = fs.open(&path, OpenMode::CreateNew).unwrap();
        fs.sync_dir(dir.path()).unwrap();
        f.write_at(b"abc", 0).unwrap();
        fs.fail_next_sync();
        let err = f.sync_data().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::errno::Errno::EIO as i32));
        assert_eq!(fs.sync_count(), 0);
        // The failed sync did not make the write durable.
        let g = fs.open(&dir.path().join("g"), OpenMode::CreateNew).unwrap();
        g.sync_data().unwrap();
        assert_eq!(fs.sync_count(), 1);
        fs.power_cut();
        assert_eq!(read_all(&path), b"");
    }

    #[test]
    fn read_handle_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultyFs::new();
        let path = dir.path().join("f");
        fs.open(&path, OpenMode::CreateNew).unwrap();
        let r = fs.open(&path, OpenMode::Read).unwrap();
        assert!(r.write_at(b"x", 0).is_err());
        assert!(fs.open(&path, OpenMode::CreateNew).is_err());
    }
}
