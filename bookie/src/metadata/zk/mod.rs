//! The ZooKeeper implementation of [`MetadataStore`] (production and tests).
//!
//! One [`ZkStore`] is one ZooKeeper session, opened by [`ZkStore::connect`] from
//! ZooKeeper's own connect string `host:port[,host:port...][/chroot]` (a missing
//! chroot is created first). It keeps the trait's promises on ZooKeeper's terms:
//! - Versions, CAS and sequential numbering are ZooKeeper's own (`Stat.version`,
//!   the parent's `cversion`); a sequential node's path ends in the 10-digit
//!   counter ZooKeeper appended.
//! - Every call is checked before anything is sent ([`validate_path`],
//!   [`validate_data`]) and bounded by [`ZkOptions::operation_timeout_ms`]
//!   ([`MetadataError::Timeout`]); connecting is bounded by
//!   [`ZkOptions::connect_timeout_ms`]. Nothing hangs.
//! - Reconnection inside the session is the `zookeeper-client` crate's job and is
//!   reported as [`SessionState::Suspended`] / [`SessionState::Connected`]. Expiry
//!   is never hidden: it is reported as [`SessionState::Expired`] and every later
//!   call fails with [`MetadataError::SessionExpired`]; no new session is opened
//!   behind the caller's back.
//! - Watches are ZooKeeper persistent (non-recursive) watches. Their streams also
//!   end when the connection is lost, because ZooKeeper may drop events during a
//!   reconnection (ZOOKEEPER-4698): the consumer re-reads and re-watches.
//!
//! ```no_run
//! use cms_bookie::metadata::zk::{ZkOptions, ZkStore};
//! use cms_bookie::metadata::{CreateMode, MetadataStore};
//! # async fn demo() -> Result<(), cms_bookie::metadata::MetadataError> {
//! let store = ZkStore::connect("127.0.0.1:2181/cms-test", &ZkOptions::default()).await?;
//! store.create("/hello", b"world", CreateMode::Ephemeral).await?;
//! store.close().await; // the ephemeral node goes with the session
//! # Ok(()) }
//! ```

mod convert;
mod watch;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch as tokio_watch;
use zookeeper_client as zk;

use self::convert::{Target, VersionCheck};
use self::watch::WatchKind;
use crate::metadata::{
    CreateMode, Expected, MetadataError, MetadataStore, Result, SessionState, Stat, Version, Watch,
    validate_data, validate_path,
};

/// Timeouts of a ZooKeeper store handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkOptions {
    /// Session timeout asked of the server, in ms (the server clamps it to its
    /// `minSessionTimeout`..`maxSessionTimeout`). Ephemeral nodes of a lost
    /// client vanish about this long after it went silent.
    pub session_timeout_ms: u64,
    /// Longest time [`ZkStore::connect`] may take, chroot creation included, in ms.
    pub connect_timeout_ms: u64,
    /// Longest time one operation may take before it fails with
    /// [`MetadataError::Timeout`], in ms.
    pub operation_timeout_ms: u64,
}

impl Default for ZkOptions {
    fn default() -> Self {
        ZkOptions {
            session_timeout_ms: 4_000,
            connect_timeout_ms: 10_000,
            operation_timeout_ms: 10_000,
        }
    }
}

/// A ZooKeeper session behind the [`MetadataStore`] API.
///
/// Dropping it without [`MetadataStore::close`] also closes the session (in the
/// background).
pub struct ZkStore {
    /// The session; `None` once closed. Each call clones it (a cheap handle).
    client: Mutex<Option<zk::Client>>,
    /// Id and password of the session.
    session: zk::SessionInfo,
    /// Servers, without the chroot.
    hosts: String,
    /// The chroot, if any.
    chroot: Option<String>,
    opts: ZkOptions,
    /// Our view of the session, fed by the crate's state watcher.
    state: Arc<tokio_watch::Sender<SessionState>>,
    /// Set once the owner closed (or dropped) the handle.
    closed_by_owner: Arc<AtomicBool>,
    /// The session timeout the server granted, in milliseconds.
    negotiated_session_timeout_ms: u64,
}

impl fmt::Debug for ZkStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkStore")
            .field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("session_id", &self.session.id())
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

fn ms(d: u64) -> Duration {
    Duration::from_millis(d)
}

/// Sets `state` to `next` unless it is already terminal; returns whether it changed.
fn publish(state: &tokio_watch::Sender<SessionState>, next: SessionState) -> bool {
    state.send_if_modified(|current| {
        if current.is_terminal() || *current == next {
            return false;
        }
        *current = next;
        true
    })
}

/// Forwards the crate's session states into ours until a terminal one, logging
/// each change.
async fn follow_session(
    mut zk_states: zk::StateWatcher,
    state: Arc<tokio_watch::Sender<SessionState>>,
    closed_by_owner: Arc<AtomicBool>,
    session_id: zk::SessionId,
) {
    loop {
        let zk_state = zk_states.changed().await;
        let next = convert::session_state(zk_state, closed_by_owner.load(Ordering::Acquire));
        if publish(&state, next) {
            match next {
                SessionState::Connected => {
                    tracing::info!(session = %session_id, "ZooKeeper session connected again")
                }
                SessionState::Suspended => tracing::warn!(
                    session = %session_id,
                    "ZooKeeper connection lost; session suspended until it reconnects or expires"
                ),
                SessionState::Expired => tracing::warn!(
                    session = %session_id,
                    zk_state = %zk_state,
                    "ZooKeeper session expired; its ephemeral nodes are gone"
                ),
                SessionState::Closed => {
                    tracing::info!(session = %session_id, "ZooKeeper session closed")
                }
            }
        }
        if next.is_terminal() || zk_state.is_terminated() {
            return;
        }
    }
}

impl ZkStore {
    /// Opens a session on the ZooKeeper ensemble named by `connect_string`
    /// (`host:port[,host:port...][/chroot]`). A chroot that does not exist yet is
    /// created, with its ancestors, as empty persistent nodes; all paths of the
    /// store are then relative to it.
    ///
    /// Fails with [`MetadataError::ConnectionLoss`] if no session could be
    /// established within [`ZkOptions::connect_timeout_ms`] (or the crate gave up
    /// first, after about one session timeout).
    pub async fn connect(connect_string: &str, opts: &ZkOptions) -> Result<ZkStore> {
        let parsed = convert::parse_connect_string(connect_string)?;
        let connect_timeout = ms(opts.connect_timeout_ms);
        let deadline = tokio::time::Instant::now() + connect_timeout;
        let connector = zk::Client::connector().with_session_timeout(ms(opts.session_timeout_ms));
        let client = match tokio::time::timeout_at(deadline, connector.connect(&parsed.hosts)).await
        {
            Err(_) => {
                return Err(MetadataError::ConnectionLoss(format!(
                    "no ZooKeeper session with {} within {} ms",
                    parsed.hosts, opts.connect_timeout_ms
                )));
            }
            Ok(Err(e)) => {
                return Err(MetadataError::ConnectionLoss(format!(
                    "cannot open a ZooKeeper session with {}: {e}",
                    parsed.hosts
                )));
            }
            Ok(Ok(client)) => client,
        };
        let client = match &parsed.chroot {
            None => client,
            Some(chroot) => {
                Self::ensure_chroot(&client, chroot, deadline, opts.connect_timeout_ms).await?;
                // Same session, rooted at the chroot.
                client
                    .chroot(chroot.as_str())
                    .map_err(|_| MetadataError::InvalidPath {
                        path: chroot.clone(),
                        reason: "refused as a chroot by the ZooKeeper client".to_string(),
                    })?
            }
        };

        let session = client.session().clone();
        let negotiated_session_timeout_ms = client.session_timeout().as_millis() as u64;
        let zk_states = client.state_watcher();
        let initial = convert::session_state(zk_states.peek_state(), false);
        let (state_tx, _) = tokio_watch::channel(initial);
        let state = Arc::new(state_tx);
        let closed_by_owner = Arc::new(AtomicBool::new(false));
        tracing::info!(
            session = %session.id(),
            hosts = %parsed.hosts,
            chroot = parsed.chroot.as_deref().unwrap_or("/"),
            negotiated_session_timeout_ms = client.session_timeout().as_millis() as u64,
            "ZooKeeper session opened"
        );
        tokio::spawn(follow_session(
            zk_states,
            Arc::clone(&state),
            Arc::clone(&closed_by_owner),
            session.id(),
        ));
        Ok(ZkStore {
            client: Mutex::new(Some(client)),
            session,
            hosts: parsed.hosts,
            chroot: parsed.chroot,
            opts: opts.clone(),
            state,
            closed_by_owner,
            negotiated_session_timeout_ms,
        })
    }

    /// Creates `chroot` and its ancestors through an unrooted client.
    async fn ensure_chroot(
        client: &zk::Client,
        chroot: &str,
        deadline: tokio::time::Instant,
        connect_timeout_ms: u64,
    ) -> Result<()> {
        let target = Target::node(chroot);
        let timed_out = || {
            MetadataError::ConnectionLoss(format!(
                "could not check or create the chroot {chroot} within {connect_timeout_ms} ms"
            ))
        };
        let exists = tokio::time::timeout_at(deadline, client.check_stat(chroot))
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| convert::map_error(&e, &target))?;
        if exists.is_some() {
            return Ok(());
        }
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        tokio::time::timeout_at(deadline, client.mkdir(chroot, &options))
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| convert::map_error(&e, &target))?;
        tracing::info!(chroot, "created the ZooKeeper chroot");
        Ok(())
    }

    /// The session handle for one call, or why there is none.
    fn client(&self) -> Result<zk::Client> {
        if self.closed_by_owner.load(Ordering::Acquire) {
            return Err(MetadataError::Closed);
        }
        if *self.state.borrow() == SessionState::Expired {
            return Err(MetadataError::SessionExpired);
        }
        let client = self
            .client
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
            .ok_or(MetadataError::Closed)?;
        if client.state().is_terminated() {
            // The crate saw it before our follower task did.
            return Err(MetadataError::SessionExpired);
        }
        Ok(client)
    }

    /// Runs one ZooKeeper call, bounded by the operation timeout, with its error
    /// mapped for `target`.
    async fn call<T>(
        &self,
        target: Target<'_>,
        call: impl Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(ms(self.opts.operation_timeout_ms), call).await {
            Err(_) => Err(MetadataError::Timeout(self.opts.operation_timeout_ms)),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(match convert::map_error(&e, &target) {
                MetadataError::Closed if !self.closed_by_owner.load(Ordering::Acquire) => {
                    MetadataError::SessionExpired
                }
                other => other,
            }),
        }
    }

    /// The error for a `set`/`delete` expecting a version no node can have.
    /// The version to send for `expected`, or the error for a version
    /// ZooKeeper cannot hold.
    async fn zk_version(
        &self,
        client: &zk::Client,
        path: &str,
        expected: Expected,
    ) -> Result<Option<i32>> {
        match convert::version_check(expected) {
            VersionCheck::Any => Ok(None),
            VersionCheck::Exact(v) => Ok(Some(v)),
            VersionCheck::Impossible(v) => Err(self.impossible_version(client, path, v).await),
        }
    }

    async fn impossible_version(
        &self,
        client: &zk::Client,
        path: &str,
        expected: Version,
    ) -> MetadataError {
        match self.call(Target::node(path), client.check_stat(path)).await {
            Err(e) => e,
            Ok(None) => MetadataError::NoNode(path.to_string()),
            Ok(Some(_)) => MetadataError::BadVersion {
                path: path.to_string(),
                expected,
            },
        }
    }

    async fn persistent_watch(&self, path: &str, kind: WatchKind) -> Result<Watch> {
        validate_path(path)?;
        let client = self.client()?;
        let watcher = self
            .call(
                Target::node(path),
                client.watch(path, zk::AddWatchMode::Persistent),
            )
            .await?;
        Ok(watch::spawn(kind, path, watcher))
    }
}

impl Drop for ZkStore {
    fn drop(&mut self) {
        // Dropping the client closes the session; report it as closed, not lost.
        self.closed_by_owner.store(true, Ordering::Release);
    }
}

#[async_trait]
impl MetadataStore for ZkStore {
    async fn get(&self, path: &str) -> Result<(Vec<u8>, Stat)> {
        validate_path(path)?;
        let client = self.client()?;
        let (data, stat) = self.call(Target::node(path), client.get_data(path)).await?;
        Ok((data, convert::stat_from_zk(&stat)))
    }

    async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        validate_path(path)?;
        let client = self.client()?;
        let stat = self
            .call(Target::node(path), client.check_stat(path))
            .await?;
        Ok(stat.as_ref().map(convert::stat_from_zk))
    }

    async fn create(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<(String, Stat)> {
        validate_path(path)?;
        validate_data(path, data)?;
        if path == "/" {
            return Err(MetadataError::NodeExists(path.to_string()));
        }
        let client = self.client()?;
        let options = convert::create_mode(mode).with_acls(zk::Acls::anyone_all());
        let (stat, sequence) = self
            .call(Target::create(path), client.create(path, data, &options))
            .await?;
        let created = if mode.is_sequential() {
            format!("{path}{sequence}")
        } else {
            path.to_string()
        };
        Ok((created, convert::stat_from_zk(&stat)))
    }

    async fn set(&self, path: &str, data: &[u8], expected: Expected) -> Result<Stat> {
        validate_path(path)?;
        validate_data(path, data)?;
        let client = self.client()?;
        let version = self.zk_version(&client, path, expected).await?;
        let stat = self
            .call(
                Target::versioned(path, expected),
                client.set_data(path, data, version),
            )
            .await?;
        Ok(convert::stat_from_zk(&stat))
    }

    async fn delete(&self, path: &str, expected: Expected) -> Result<()> {
        validate_path(path)?;
        if path == "/" {
            return Err(MetadataError::InvalidPath {
                path: path.to_string(),
                reason: "the root node cannot be deleted".to_string(),
            });
        }
        let client = self.client()?;
        let version = self.zk_version(&client, path, expected).await?;
        self.call(
            Target::versioned(path, expected),
            client.delete(path, version),
        )
        .await
    }

    async fn children(&self, path: &str) -> Result<Vec<String>> {
        validate_path(path)?;
        let client = self.client()?;
        let mut names = self
            .call(Target::node(path), client.list_children(path))
            .await?;
        if path == "/" && self.chroot.is_none() {
            // ZooKeeper's own subtree is not part of the store (see validate_path).
            names.retain(|n| n != "zookeeper");
        }
        names.sort_unstable();
        Ok(names)
    }

    async fn watch_data(&self, path: &str) -> Result<Watch> {
        self.persistent_watch(path, WatchKind::Data).await
    }

    async fn watch_children(&self, path: &str) -> Result<Watch> {
        self.persistent_watch(path, WatchKind::Children).await
    }

    fn session_events(&self) -> tokio_watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    fn session_id(&self) -> i64 {
        self.session.id().0
    }

    fn negotiated_session_timeout_ms(&self) -> Option<u64> {
        Some(self.negotiated_session_timeout_ms)
    }

    async fn close(&self) {
        self.closed_by_owner.store(true, Ordering::Release);
        let client = self
            .client
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        // The crate closes the session once its last handle is gone (calls still
        // in flight hold one for at most the operation timeout), and reports
        // `Closed` after the server acknowledged: ephemerals are gone by then.
        drop(client);
        let wait_ms = self.opts.operation_timeout_ms + self.opts.session_timeout_ms;
        let mut states = self.state.subscribe();
        let closed = tokio::time::timeout(ms(wait_ms), states.wait_for(|s| s.is_terminal())).await;
        if !matches!(closed, Ok(Ok(_))) {
            tracing::warn!(
                session = %self.session.id(),
                wait_ms,
                "ZooKeeper did not confirm the session close in time; the server will expire it"
            );
            publish(&self.state, SessionState::Closed);
        }
    }
}
