//! The metadata store: one async API over ZooKeeper (production, tests) and an
//! embedded single-process store persisted to a local file (standalone).
//!
//! Everything in CMS that keeps coordination state — ledger metadata, bookie
//! registration, cookies, ownership, cursors' pointers, tenants — goes through
//! [`MetadataStore`], so it is written once for both backends (DESIGN §3).
//!
//! # What the trait promises (both implementations)
//! - **Versions and compare-and-set.** Every node has a data version that starts
//!   at 0 and grows by one on each `set`. `set` and `delete` take an expected
//!   version ([`Expected::Version`]) and fail with [`MetadataError::BadVersion`]
//!   if the node moved on; read-modify-CAS loops are built on that.
//! - **Sequential numbering never repeats** under one parent, across deletes of
//!   the children and restarts of the store: the counter is the parent's,
//!   persisted with it (ZooKeeper's `cversion`). Ledger ids come from it.
//! - **Ephemeral nodes** belong to the session of the store handle that created
//!   them and vanish when that session closes or expires. An expired session is
//!   never hidden: [`MetadataStore::session_events`] reports
//!   [`SessionState::Expired`], and every later call fails with
//!   [`MetadataError::SessionExpired`].
//! - **Watches** are persistent streams ([`Watch`]): they keep delivering events in
//!   the order the changes happened until dropped. Register the watch first, then
//!   read, and no change is missed. A watch whose consumer falls more than
//!   [`WATCH_EVENTS_MAX`] events behind, or whose session ends, is closed: the
//!   stream ends, and the consumer re-reads and re-watches.
//! - **Bounds.** Node data is at most [`NODE_DATA_BYTES_MAX`] bytes
//!   ([`MetadataError::TooLarge`] before anything is sent); paths are checked by
//!   [`validate_path`] ([`MetadataError::InvalidPath`]).
//!
//! # Example
//! ```no_run
//! use cms_bookie::metadata::{CreateMode, Expected, MetadataStore};
//! # async fn demo(store: &dyn MetadataStore) -> Result<(), cms_bookie::metadata::MetadataError> {
//! store.create("/cms/example", b"v1", CreateMode::Persistent).await?;
//! let (data, stat) = store.get("/cms/example").await?;
//! assert_eq!(data, b"v1");
//! // Compare-and-set: fails with BadVersion if someone else wrote in between.
//! store.set("/cms/example", b"v2", Expected::Version(stat.version)).await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};

pub mod connect;
pub mod embedded;
pub mod layout;
pub mod metered;
pub mod zk;

/// Largest node payload either backend accepts, in bytes. ZooKeeper's default
/// `jute.maxbuffer` is 1 MiB − 1 for a whole packet; this leaves room for the
/// path and the framing so a too-large write is refused here, clearly, instead of
/// making the server drop the connection.
pub const NODE_DATA_BYTES_MAX: usize = 1_000_000;

/// Longest path accepted, in bytes.
pub const PATH_BYTES_MAX: usize = 4_096;

/// Events a watch buffers for a slow consumer before it is closed.
pub const WATCH_EVENTS_MAX: usize = 1_024;

/// A node's data version (ZooKeeper's `Stat.version`): 0 on create, +1 per `set`.
pub type Version = i64;

/// What `set` / `delete` expect the node's current version to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// Apply whatever the current version is.
    Any,
    /// Apply only if the node's version is exactly this one.
    Version(Version),
}

/// How a node is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateMode {
    /// Lives until deleted.
    Persistent,
    /// Deleted when the creating session closes or expires.
    Ephemeral,
    /// Persistent; the parent's counter is appended to the name as 10 digits.
    PersistentSequential,
    /// Ephemeral and sequential.
    EphemeralSequential,
}

impl CreateMode {
    /// True for the modes whose nodes die with their session.
    pub fn is_ephemeral(self) -> bool {
        matches!(
            self,
            CreateMode::Ephemeral | CreateMode::EphemeralSequential
        )
    }
    /// True for the modes that append the parent's counter to the name.
    pub fn is_sequential(self) -> bool {
        matches!(
            self,
            CreateMode::PersistentSequential | CreateMode::EphemeralSequential
        )
    }
}

/// What a node looks like, besides its data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stat {
    /// Data version: 0 on create, +1 per `set`.
    pub version: Version,
    /// Creation time, milliseconds since the Unix epoch.
    pub ctime_ms: i64,
    /// Last modification time, milliseconds since the Unix epoch.
    pub mtime_ms: i64,
    /// Session that owns this ephemeral node, 0 for persistent nodes.
    pub ephemeral_owner: i64,
    /// Number of children.
    pub num_children: usize,
    /// Length of the data, in bytes.
    pub data_len: usize,
}

/// State of the session behind a store handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Connected; ephemeral nodes are held.
    Connected,
    /// Connection lost; the session may still be alive and may come back
    /// ([`SessionState::Connected`]) or expire. Owners of leases must stop acting
    /// on them until it is connected again.
    Suspended,
    /// The session is gone and so are its ephemeral nodes. Terminal.
    Expired,
    /// The handle was closed by its owner. Terminal.
    Closed,
}

impl SessionState {
    /// True if no further state will follow.
    pub fn is_terminal(self) -> bool {
        matches!(self, SessionState::Expired | SessionState::Closed)
    }
}

/// One change seen by a [`Watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// The watched node was created.
    Created(String),
    /// The watched node's data was set.
    DataChanged(String),
    /// The watched node was deleted.
    Deleted(String),
    /// A child of the watched node was created or deleted.
    ChildrenChanged(String),
}

impl WatchEvent {
    /// The path the event is about.
    pub fn path(&self) -> &str {
        match self {
            WatchEvent::Created(p)
            | WatchEvent::DataChanged(p)
            | WatchEvent::Deleted(p)
            | WatchEvent::ChildrenChanged(p) => p,
        }
    }
}

/// A persistent watch: a stream of [`WatchEvent`]s in the order the changes
/// happened. It ends (`None`) when the session ends or the consumer fell more
/// than [`WATCH_EVENTS_MAX`] events behind; then re-read and re-watch.
/// Dropping it removes the watch.
pub struct Watch {
    rx: mpsc::Receiver<WatchEvent>,
    // Kept alive for as long as the watch; dropping it tells the backend to stop.
    _guard: Option<Box<dyn Send + Sync>>,
}

impl Watch {
    /// A watch fed by `rx`; `guard` is dropped with the watch (backends use it to
    /// unregister).
    pub fn new(rx: mpsc::Receiver<WatchEvent>, guard: Option<Box<dyn Send + Sync>>) -> Self {
        Watch { rx, _guard: guard }
    }

    /// The next event, or `None` once the watch has ended.
    pub async fn recv(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

impl futures::Stream for Watch {
    type Item = WatchEvent;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WatchEvent>> {
        self.rx.poll_recv(cx)
    }
}

/// Errors callers can branch on. Both backends map their failures onto these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// The node does not exist.
    #[error("no node at {0}")]
    NoNode(String),
    /// The node already exists.
    #[error("node already exists at {0}")]
    NodeExists(String),
    /// The expected version did not match.
    #[error("version mismatch at {path}: expected {expected}")]
    BadVersion {
        /// Node path.
        path: String,
        /// The version the caller expected.
        expected: Version,
    },
    /// `delete` of a node that still has children.
    #[error("node {0} has children")]
    NotEmpty(String),
    /// An ephemeral node cannot have children.
    #[error("ephemeral node {0} cannot have children")]
    NoChildrenForEphemerals(String),
    /// The session is gone, and with it every ephemeral node it held.
    #[error("metadata session expired")]
    SessionExpired,
    /// The handle was closed.
    #[error("metadata store handle closed")]
    Closed,
    /// No connection right now; the outcome of the call is unknown, and the
    /// session may still be alive.
    #[error("metadata store connection lost: {0}")]
    ConnectionLoss(String),
    /// The operation did not finish in time; its outcome is unknown.
    #[error("metadata operation timed out after {0} ms")]
    Timeout(u64),
    /// Data over [`NODE_DATA_BYTES_MAX`].
    #[error("node data at {path} is {len} bytes, over the limit of {max} bytes")]
    TooLarge {
        /// Node path.
        path: String,
        /// Size of the refused data.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A path that [`validate_path`] refuses.
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath {
        /// The refused path.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The local file of the embedded store could not be read or written.
    #[error("metadata storage error: {0}")]
    Storage(String),
    /// Anything else the backend reported.
    #[error("metadata backend error: {0}")]
    Backend(String),
}

/// Result alias for metadata operations.
pub type Result<T, E = MetadataError> = std::result::Result<T, E>;

/// Checks a node path: absolute, `/`-separated, no empty, `.` or `..` components,
/// no trailing `/` (except the root itself), no control characters, at most
/// [`PATH_BYTES_MAX`] bytes.
pub fn validate_path(path: &str) -> Result<()> {
    let bad = |reason: &str| {
        Err(MetadataError::InvalidPath {
            path: path.to_string(),
            reason: reason.to_string(),
        })
    };
    if path.is_empty() {
        return bad("empty path");
    }
    if path.len() > PATH_BYTES_MAX {
        return bad("longer than 4096 bytes");
    }
    if !path.starts_with('/') {
        return bad("must start with '/'");
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return bad("must not end with '/'");
    }
    if path.chars().any(|c| c.is_control()) {
        return bad("contains a control character");
    }
    for component in path[1..].split('/') {
        match component {
            "" => return bad("empty component ('//')"),
            "." | ".." => return bad("'.' and '..' are not allowed"),
            _ => {}
        }
    }
    if path == "/zookeeper" || path.starts_with("/zookeeper/") {
        return bad("'/zookeeper' is reserved");
    }
    Ok(())
}

/// Checks data against [`NODE_DATA_BYTES_MAX`].
pub fn validate_data(path: &str, data: &[u8]) -> Result<()> {
    if data.len() > NODE_DATA_BYTES_MAX {
        return Err(MetadataError::TooLarge {
            path: path.to_string(),
            len: data.len(),
            max: NODE_DATA_BYTES_MAX,
        });
    }
    Ok(())
}

/// The parent of a valid path, `None` for the root.
pub fn parent_of(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&path[..i]),
        None => None,
    }
}

/// Joins a parent path and a child name.
pub fn join(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// One session on a metadata store. Cheap to share behind an `Arc`; every method
/// can be called concurrently.
#[async_trait]
pub trait MetadataStore: Send + Sync + 'static {
    /// Data and stat of a node.
    async fn get(&self, path: &str) -> Result<(Vec<u8>, Stat)>;

    /// Stat of a node, or `None` if it does not exist.
    async fn exists(&self, path: &str) -> Result<Option<Stat>>;

    /// Creates a node. The parent must exist. Returns the created path (with the
    /// sequence number appended for sequential modes) and the stat.
    async fn create(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<(String, Stat)>;

    /// Sets a node's data if its version is as expected; returns the new stat.
    async fn set(&self, path: &str, data: &[u8], expected: Expected) -> Result<Stat>;

    /// Deletes a node without children if its version is as expected.
    async fn delete(&self, path: &str, expected: Expected) -> Result<()>;

    /// Names (not paths) of a node's children, sorted.
    async fn children(&self, path: &str) -> Result<Vec<String>>;

    /// A persistent watch on a node's data: `Created`, `DataChanged`, `Deleted`.
    /// The node need not exist yet.
    async fn watch_data(&self, path: &str) -> Result<Watch>;

    /// A persistent watch on a node's children: `ChildrenChanged` (and `Deleted`
    /// when the node itself goes).
    async fn watch_children(&self, path: &str) -> Result<Watch>;

    /// The session's state now and every change after; the last value is always
    /// current, and a terminal state is never replaced.
    fn session_events(&self) -> watch::Receiver<SessionState>;

    /// The session id (ephemeral owner) of this handle.
    fn session_id(&self) -> i64;

    /// The session timeout the server granted, in milliseconds, for backends
    /// with one (ZooKeeper); `None` when sessions cannot expire (embedded).
    /// Lease holders count their safe window from it (ownership: 2/3 of it).
    fn negotiated_session_timeout_ms(&self) -> Option<u64> {
        None
    }

    /// Ends the session: its ephemeral nodes are deleted, its watches end, and
    /// every later call fails with [`MetadataError::Closed`].
    async fn close(&self);

    /// Creates `path` and any missing ancestors as empty persistent nodes;
    /// succeeds if it already exists.
    async fn create_all(&self, path: &str) -> Result<()> {
        validate_path(path)?;
        if path == "/" {
            return Ok(());
        }
        let mut prefix = String::new();
        for component in path[1..].split('/') {
            prefix.push('/');
            prefix.push_str(component);
            match self.exists(&prefix).await? {
                Some(_) => continue,
                None => match self.create(&prefix, b"", CreateMode::Persistent).await {
                    Ok(_) | Err(MetadataError::NodeExists(_)) => {}
                    Err(e) => return Err(e),
                },
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_paths_pass() {
        for p in [
            "/",
            "/cms",
            "/zookeeperx",
            "/cms/ledgers/00/0000/L0001",
            "/a-b_c.d/e:f",
        ] {
            assert_eq!(validate_path(p), Ok(()), "{p}");
        }
    }

    #[test]
    fn invalid_paths_are_refused_with_a_reason() {
        let long = format!("/{}", "x".repeat(PATH_BYTES_MAX));
        for p in [
            "",
            "cms",
            "/cms/",
            "//cms",
            "/cms//x",
            "/cms/./x",
            "/cms/../x",
            "/cms/\u{0}x",
            "/cms/\nx",
            "/zookeeper",
            "/zookeeper/quota",
            "/cms/x/",
            long.as_str(),
        ] {
            match validate_path(p) {
                Err(MetadataError::InvalidPath { path, reason }) => {
                    assert_eq!(path, p);
                    assert!(!reason.is_empty());
                }
                other => panic!("{p:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn oversized_data_is_too_large() {
        let data = vec![0u8; NODE_DATA_BYTES_MAX + 1];
        assert!(matches!(
            validate_data("/x", &data),
            Err(MetadataError::TooLarge { len, .. }) if len == NODE_DATA_BYTES_MAX + 1
        ));
        assert_eq!(validate_data("/x", &data[..NODE_DATA_BYTES_MAX]), Ok(()));
    }

    #[test]
    fn parents_and_joins() {
        assert_eq!(parent_of("/"), None);
        assert_eq!(parent_of("/a"), Some("/"));
        assert_eq!(parent_of("/a/b/c"), Some("/a/b"));
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
    }
}
