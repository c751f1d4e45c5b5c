//! Embedded metadata store (standalone): one process, one local file, the same
//! semantics as ZooKeeper.
//!
//! [`EmbeddedBackend`] is one open redb file. It keeps the whole tree in memory
//! for reads and writes every change to a persistent node durably (fsync)
//! before the call returns; one writer thread orders all mutations and
//! group-commits whatever queued up while the previous fsync ran (see
//! `writer.rs`). [`EmbeddedStore`] is one session on it: its own session id,
//! ephemeral nodes and watches.
//!
//! What it promises, beyond the [`MetadataStore`] contract:
//! - **Acknowledged = durable.** `create` / `set` / `delete` of a persistent
//!   node return only after the change is fsynced; a `kill -9` loses none.
//! - **Serial results.** Each mutation is decided in arrival order against the
//!   tree as left by the previous one, exactly as if applied one by one.
//! - **Readers never see an unsynced change**, and watch events are fired in the
//!   order the changes were applied, once they are durable.
//! - **Ephemeral nodes are never written to disk.** They end with their session:
//!   [`MetadataStore::close`], drop of the handle's last clone,
//!   [`EmbeddedStore::expire_session_for_test`], or the end of the process.
//! - **One backend per file per process.** [`EmbeddedBackend::open`] on a file
//!   this process already has open returns the same backend (the standalone
//!   broker and its in-process bookies share it); another process opening the
//!   file fails at once with [`MetadataError::Storage`] ("already in use by
//!   another process"). A corrupt file fails with a clear Storage error.
//!
//! ```no_run
//! use cms_bookie::metadata::embedded::EmbeddedBackend;
//! use cms_bookie::metadata::{CreateMode, MetadataStore};
//! # async fn demo() -> Result<(), cms_bookie::metadata::MetadataError> {
//! let backend = EmbeddedBackend::open(std::path::Path::new("/var/lib/cms/metadata.redb"))?;
//! let broker = backend.session();
//! let bookie = backend.session(); // its own session id and ephemerals
//! broker.create("/brokers", b"", CreateMode::Persistent).await?;
//! bookie.create("/brokers/b1", b"up", CreateMode::Ephemeral).await?;
//! bookie.close().await; // /brokers/b1 is gone
//! # Ok(()) }
//! ```

mod disk;
mod shared;
mod tree;
mod writer;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tracing::{info, warn};

use super::{
    CreateMode, Expected, MetadataError, MetadataStore, Result, SessionState, Stat, Watch,
    validate_data, validate_path,
};
use shared::{SessionCore, Shared, WatchGuard, WatchKind, lock};
use writer::{Op, OpOutput, Released, Request, Writer};

/// Tuning of an [`EmbeddedBackend`]. The first opener of a file in a process
/// decides it; later opens of the same file share that backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedConfig {
    /// Most mutations decided and written in one write transaction (one fsync).
    pub commit_batch_ops_max: usize,
    /// Most mutations queued or in flight at once; callers wait beyond it.
    pub pending_ops_max: usize,
    /// redb page cache, in bytes.
    pub cache_bytes_max: usize,
    /// How long an open waits for this process's previous backend on the same
    /// file to finish closing, in milliseconds.
    pub reopen_wait_ms_max: u64,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        EmbeddedConfig {
            commit_batch_ops_max: 1_024,
            pending_ops_max: 16_384,
            cache_bytes_max: 64 * 1024 * 1024,
            reopen_wait_ms_max: 30_000,
        }
    }
}

/// How long `close` waits for an end already requested by another clone or by
/// expiry, in milliseconds.
const CLOSE_WAIT_MS_MAX: u64 = 30_000;

/// One backend per canonical path in this process.
struct Slot {
    backend: Weak<EmbeddedBackend>,
    released: Arc<Released>,
}

fn registry() -> &'static Mutex<HashMap<PathBuf, Slot>> {
    static REGISTRY: OnceLock<Mutex<HashMap<PathBuf, Slot>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Session ids: unique in the process, and different across restarts (seeded
/// with the clock) so an id from a previous run never names a new session.
fn next_session_id() -> i64 {
    static BASE: OnceLock<i64> = OnceLock::new();
    static NEXT: AtomicI64 = AtomicI64::new(1);
    let base = *BASE.get_or_init(|| (writer::now_ms() & ((1 << 41) - 1)) << 20);
    base + NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The path as the registry knows it: the canonical directory plus the file
/// name (the file may not exist yet).
fn canonical(path: &Path) -> Result<PathBuf> {
    let io = |e: std::io::Error| {
        MetadataError::Storage(format!("metadata file {}: {e}", path.display()))
    };
    if path.exists() {
        return std::fs::canonicalize(path).map_err(io);
    }
    let name = path.file_name().ok_or_else(|| {
        MetadataError::Storage(format!("metadata file {}: no file name", path.display()))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Ok(std::fs::canonicalize(dir).map_err(io)?.join(name))
}

/// One open metadata file: the in-memory tree, the writer thread, the watches.
/// Make sessions with [`EmbeddedBackend::session`]. Dropping the last `Arc`
/// (every session holds one) finishes the queued writes and closes the file.
pub struct EmbeddedBackend {
    path: PathBuf,
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Request>,
    permits: Arc<Semaphore>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for EmbeddedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedBackend")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl EmbeddedBackend {
    /// Opens the file (creating it if needed) with the default config, or
    /// returns this process's backend already open on it.
    pub fn open(path: &Path) -> Result<Arc<EmbeddedBackend>> {
        Self::open_with(path, EmbeddedConfig::default())
    }

    /// As [`EmbeddedBackend::open`], with `config` if this call opens the file.
    /// Blocking (file I/O); from async code prefer [`EmbeddedStore::open`] or
    /// `spawn_blocking`.
    pub fn open_with(path: &Path, config: EmbeddedConfig) -> Result<Arc<EmbeddedBackend>> {
        let key = canonical(path)?;
        let mut reg = lock(registry());
        if let Some(slot) = reg.get(&key) {
            if let Some(backend) = slot.backend.upgrade() {
                return Ok(backend);
            }
            // Our previous backend on this file is closing: wait for its file
            // lock to go, or the open below would fail as "another process".
            let released = Arc::clone(&slot.released);
            if !released.wait(Duration::from_millis(config.reopen_wait_ms_max)) {
                return Err(MetadataError::Storage(format!(
                    "metadata file {}: the previous store on it did not close within {} ms",
                    key.display(),
                    config.reopen_wait_ms_max
                )));
            }
            reg.remove(&key);
        }
        let (disk, tree) = disk::Disk::open(&key, config.cache_bytes_max, writer::now_ms())?;
        info!(path = %key.display(), nodes = tree.len(), "embedded metadata store opened");
        let shared = Arc::new(Shared::new(tree.clone()));
        let (tx, rx) = mpsc::unbounded_channel();
        let released = Arc::new(Released::default());
        let w = Writer::new(tree, Arc::clone(&shared), config.commit_batch_ops_max);
        let thread_released = Arc::clone(&released);
        let thread = std::thread::Builder::new()
            .name("cms-metadata-writer".to_string())
            .spawn(move || w.run(disk, rx, thread_released))
            .map_err(|e| MetadataError::Storage(format!("starting the metadata writer: {e}")))?;
        let backend = Arc::new(EmbeddedBackend {
            path: key.clone(),
            shared,
            tx,
            permits: Arc::new(Semaphore::new(config.pending_ops_max.max(1))),
            thread: Mutex::new(Some(thread)),
        });
        reg.insert(
            key,
            Slot {
                backend: Arc::downgrade(&backend),
                released,
            },
        );
        Ok(backend)
    }

    /// A new session: its own id, ephemeral nodes, watches and session events.
    pub fn session(self: &Arc<Self>) -> EmbeddedStore {
        let core = Arc::new(SessionCore::new(next_session_id()));
        EmbeddedStore {
            inner: Arc::new(SessionHandle {
                backend: Arc::clone(self),
                core,
            }),
        }
    }

    /// The canonical path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write transactions (fsyncs) committed since the file was opened. Group
    /// commit keeps this far below the number of mutations under load.
    pub fn commits(&self) -> u64 {
        self.shared.commits.load(Ordering::Relaxed)
    }

    fn send(&self, req: Request) -> Result<()> {
        self.tx
            .send(req)
            .map_err(|_| MetadataError::Storage("the metadata writer has stopped".to_string()))
    }
}

impl Drop for EmbeddedBackend {
    fn drop(&mut self) {
        // Everything queued before this is still written; then the file closes.
        let _ = self.tx.send(Request::Shutdown);
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            warn!(path = %self.path.display(), "the metadata writer thread panicked");
        }
    }
}

/// One session's handle; shared by the clones of an [`EmbeddedStore`].
struct SessionHandle {
    backend: Arc<EmbeddedBackend>,
    core: Arc<SessionCore>,
}

impl Drop for SessionHandle {
    fn drop(&mut self) {
        if self.core.begin_end(false) {
            let req = Request::EndSession {
                session: Arc::clone(&self.core),
                reply: None,
            };
            if self.backend.send(req).is_err() {
                self.core.publish_end();
            }
        }
    }
}

/// One session on an [`EmbeddedBackend`]. Clones share the session; it closes
/// (ephemerals deleted) when [`MetadataStore::close`] is called or the last
/// clone is dropped.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<SessionHandle>,
}

impl fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("path", &self.inner.backend.path)
            .field("session_id", &self.inner.core.id)
            .finish()
    }
}

impl EmbeddedStore {
    /// Opens (or joins this process's backend on) the file and starts a session.
    pub async fn open(path: &Path) -> Result<EmbeddedStore> {
        let path = path.to_path_buf();
        let backend = tokio::task::spawn_blocking(move || EmbeddedBackend::open(&path))
            .await
            .map_err(|e| MetadataError::Storage(format!("opening the metadata file: {e}")))??;
        Ok(backend.session())
    }

    /// The backend this session lives on.
    pub fn backend(&self) -> &Arc<EmbeddedBackend> {
        &self.inner.backend
    }

    /// Fault injection for tests: the session expires now. Every later call
    /// fails with [`MetadataError::SessionExpired`]; its ephemeral nodes are
    /// deleted (firing watch events) and then [`SessionState::Expired`] is
    /// published on [`MetadataStore::session_events`].
    pub fn expire_session_for_test(&self) {
        self.end(true, None);
    }

    /// Requests the end of the session; false if it was already requested.
    fn end(&self, expired: bool, reply: Option<oneshot::Sender<()>>) -> bool {
        let core = &self.inner.core;
        if !core.begin_end(expired) {
            return false;
        }
        let req = Request::EndSession {
            session: Arc::clone(core),
            reply,
        };
        if self.inner.backend.send(req).is_err() {
            core.publish_end();
        }
        true
    }

    async fn submit(&self, op: Op) -> Result<OpOutput> {
        self.inner.core.check_live()?;
        let permit = Arc::clone(&self.inner.backend.permits)
            .acquire_owned()
            .await
            .map_err(|_| MetadataError::Storage("the metadata writer has stopped".to_string()))?;
        let (reply, rx) = oneshot::channel();
        self.inner.backend.send(Request::Op {
            session: Arc::clone(&self.inner.core),
            op,
            reply,
            _permit: permit,
        })?;
        rx.await.map_err(|_| {
            MetadataError::Storage("the metadata writer stopped before answering".to_string())
        })?
    }

    fn read<T>(&self, path: &str, f: impl FnOnce(&tree::Tree) -> Result<T>) -> Result<T> {
        validate_path(path)?;
        self.inner.core.check_live()?;
        let committed = lock(&self.inner.backend.shared.committed);
        f(&committed.tree)
    }

    fn watch(&self, path: &str, kind: WatchKind) -> Result<Watch> {
        validate_path(path)?;
        let shared = &self.inner.backend.shared;
        let mut committed = lock(&shared.committed);
        // Under the lock: a session end applied before this is seen here.
        self.inner.core.check_live()?;
        let (id, rx) = committed.add_watch(kind, path, self.inner.core.id);
        let guard = WatchGuard {
            shared: Arc::clone(shared),
            kind,
            path: path.to_string(),
            id,
        };
        Ok(Watch::new(rx, Some(Box::new(guard))))
    }
}

#[async_trait]
impl MetadataStore for EmbeddedStore {
    async fn get(&self, path: &str) -> Result<(Vec<u8>, Stat)> {
        self.read(path, |t| {
            t.get(path)
                .map(|n| (n.data.to_vec(), n.stat()))
                .ok_or_else(|| MetadataError::NoNode(path.to_string()))
        })
    }

    async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        self.read(path, |t| Ok(t.get(path).map(|n| n.stat())))
    }

    async fn create(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<(String, Stat)> {
        validate_path(path)?;
        validate_data(path, data)?;
        let op = Op::Create {
            path: path.to_string(),
            data: Bytes::copy_from_slice(data),
            mode,
        };
        match self.submit(op).await? {
            OpOutput::Created(p, stat) => Ok((p, stat)),
            other => Err(MetadataError::Backend(format!("create answered {other:?}"))),
        }
    }

    async fn set(&self, path: &str, data: &[u8], expected: Expected) -> Result<Stat> {
        validate_path(path)?;
        validate_data(path, data)?;
        let op = Op::Set {
            path: path.to_string(),
            data: Bytes::copy_from_slice(data),
            expected,
        };
        match self.submit(op).await? {
            OpOutput::Set(stat) => Ok(stat),
            other => Err(MetadataError::Backend(format!("set answered {other:?}"))),
        }
    }

    async fn delete(&self, path: &str, expected: Expected) -> Result<()> {
        validate_path(path)?;
        let op = Op::Delete {
            path: path.to_string(),
            expected,
        };
        match self.submit(op).await? {
            OpOutput::Deleted => Ok(()),
            other => Err(MetadataError::Backend(format!("delete answered {other:?}"))),
        }
    }

    async fn children(&self, path: &str) -> Result<Vec<String>> {
        self.read(path, |t| {
            t.get(path)
                .map(|n| n.children.iter().cloned().collect())
                .ok_or_else(|| MetadataError::NoNode(path.to_string()))
        })
    }

    async fn watch_data(&self, path: &str) -> Result<Watch> {
        self.watch(path, WatchKind::Data)
    }

    async fn watch_children(&self, path: &str) -> Result<Watch> {
        self.watch(path, WatchKind::Children)
    }

    fn session_events(&self) -> watch::Receiver<SessionState> {
        self.inner.core.subscribe()
    }

    fn session_id(&self) -> i64 {
        self.inner.core.id
    }

    async fn close(&self) {
        let (reply, rx) = oneshot::channel();
        if self.end(false, Some(reply)) {
            let _ = rx.await;
            return;
        }
        // Already ending (another clone, or expiry): wait until it is done.
        let mut events = self.session_events();
        let waited = tokio::time::timeout(
            Duration::from_millis(CLOSE_WAIT_MS_MAX),
            events.wait_for(|s| s.is_terminal()),
        )
        .await;
        if waited.is_err() {
            warn!(
                session = self.inner.core.id,
                "session end still pending after {CLOSE_WAIT_MS_MAX} ms"
            );
        }
    }
}

#[cfg(test)]
mod tests;
