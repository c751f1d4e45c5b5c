//! The ledger client's async I/O driver: the protocol core of [`crate::client`]
//! wired to real bookies ([`BookieClient`]) and a real metadata store.
//!
//! [`LedgerClient`] is the entry point (cheap to clone, `Send + Sync`):
//! - it mirrors the registered bookies ([`registry`]) and keeps one connection
//!   per bookie, replacing closed ones with a bounded reconnect backoff;
//! - [`LedgerClient::create_ledger`] validates E ≥ Qw ≥ Qa ≥ 1, takes a fresh
//!   ledger id from the sequential id generator (ids never repeat: the
//!   sequence node's counter only grows), places E bookies ([`placement`]),
//!   stores the metadata node at [`Layout::ledger`] and returns a
//!   [`WriteHandle`] whose single task drives the core's `Writer`;
//! - [`LedgerClient::open_ledger`] returns a [`ReadHandle`]: without recovery
//!   it never reads past the LAC (DESIGN §4 invariant 4); with recovery it
//!   first runs the core's `Recovery` to completion (fence, read forward,
//!   write back, close), retrying a recovery that gave up;
//! - every metadata update is the core's [`MetadataOp`] run as a
//!   read-modify-CAS loop ([`LedgerClient`] never writes metadata otherwise);
//! - a ledger the writer keeps writing without some bookie is reported under
//!   `<root>/underreplicated/<same suffix as the ledger node>` (persistent,
//!   idempotent) for autorecovery.

pub mod metrics;
pub mod placement;
mod read;
pub(crate) mod registry;
mod write;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

pub use read::{LedgerEntry, ReadHandle};
pub use write::{PendingAdd, WriteHandle};

use self::placement::{BookieInfo, PlacementError, choose_ensemble, choose_replacements};
use self::registry::{Pool, PoolConfig, Registry};
use super::metadata::{MetadataOp, NewLedger, Update, UpdateError, new_ledger};
use super::quorum::{QuorumError, QuorumSpec};
use super::reader::ReadError;
use super::recovery::{RecoveryConfig, RecoveryError};
use super::writer::{AddError, WriterConfig, WriterError};
use super::{BookieId, EnsembleChangeRequest, Replacement};
use crate::bookie_client::{ClientError, ClientOptions};
use crate::metadata::layout::Layout;
use crate::metadata::{CreateMode, Expected, MetadataError, MetadataStore, join, parent_of};
use crate::proto::metadata::LedgerMetadata;

/// Options of a [`LedgerClient`].
#[derive(Debug, Clone)]
pub struct LedgerClientOptions {
    /// Bounds and timers of every write handle.
    pub writer: WriterConfig,
    /// Bounds and timers of a recovery.
    pub recovery: RecoveryConfig,
    /// Options of each bookie connection.
    pub bookie: ClientOptions,
    /// Period of the timer that drives the cores' `tick`, in milliseconds.
    pub tick_interval_ms: u64,
    /// Adds queued towards a write handle's task before `add` waits.
    pub add_queue_max: usize,
    /// First reconnect backoff after a failed connect, in milliseconds.
    pub reconnect_backoff_ms_min: u64,
    /// Largest reconnect backoff, in milliseconds.
    pub reconnect_backoff_ms_max: u64,
    /// Bookies connected at once at most.
    pub bookie_connections_max: usize,
    /// Read-modify-CAS rounds (version conflicts, connection losses) before a
    /// metadata update fails.
    pub metadata_attempts_max: u32,
    /// A read unanswered this long gets a speculative read to another replica.
    pub speculative_read_timeout_ms: u64,
    /// Entries read concurrently by one `read` call.
    pub read_parallelism_max: usize,
    /// When every bookie holds every entry (E = Qw), ask one bookie per
    /// ledger first for all its entries, so its read-ahead serves a
    /// sequential read ([`crate::client::reader`]); default on.
    pub sticky_reads: bool,
    /// Recoveries started for one `open_ledger(id, true)` before it fails.
    pub recovery_attempts_max: u32,
    /// Bookie id → `host:port` that wins over the registered endpoint (tests
    /// route a bookie through the chaos proxy with it).
    pub endpoint_overrides: HashMap<BookieId, String>,
    /// Add and read latency histograms (none: not measured).
    pub metrics: Option<metrics::ClientMetrics>,
}

impl Default for LedgerClientOptions {
    fn default() -> Self {
        LedgerClientOptions {
            writer: WriterConfig::default(),
            recovery: RecoveryConfig::default(),
            bookie: ClientOptions::default(),
            tick_interval_ms: 10,
            add_queue_max: 1024,
            reconnect_backoff_ms_min: 100,
            reconnect_backoff_ms_max: 5_000,
            bookie_connections_max: 1024,
            metadata_attempts_max: 20,
            speculative_read_timeout_ms: 500,
            read_parallelism_max: 64,
            sticky_reads: true,
            recovery_attempts_max: 3,
            endpoint_overrides: HashMap::new(),
            metrics: None,
        }
    }
}

/// Why a ledger client call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// E, Qw, Qa are not E ≥ Qw ≥ Qa ≥ 1.
    #[error(transparent)]
    InvalidQuorum(#[from] QuorumError),
    /// Fewer writable bookies than the ensemble needs.
    #[error("not enough bookies: {wanted} wanted, {available} writable")]
    NotEnoughBookies {
        /// Bookies needed.
        wanted: usize,
        /// Writable bookies available.
        available: usize,
    },
    /// No metadata node for this ledger.
    #[error("no ledger {0}")]
    NoSuchLedger(u64),
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Metadata(MetadataError),
    /// A ledger's metadata node cannot be decoded or is invalid.
    #[error("ledger {ledger_id}: bad metadata: {reason}")]
    BadMetadata {
        /// The ledger.
        ledger_id: u64,
        /// What is wrong.
        reason: String,
    },
    /// A node of the id generator without a sequence number.
    #[error("id generator node {0:?} has no sequence number")]
    BadIdNode(String),
    /// The writer stopped.
    #[error(transparent)]
    Writer(WriterError),
    /// An add was refused.
    #[error(transparent)]
    Add(AddError),
    /// A read failed.
    #[error(transparent)]
    Read(ReadError),
    /// Recovery failed `recovery_attempts_max` times; the last error.
    #[error(transparent)]
    Recovery(RecoveryError),
    /// A metadata update failed.
    #[error(transparent)]
    Update(UpdateError),
    /// A bookie call failed.
    #[error(transparent)]
    Bookie(ClientError),
    /// The write handle's task is gone (the handle was closed).
    #[error("write handle closed")]
    HandleClosed,
}

impl From<PlacementError> for LedgerError {
    fn from(e: PlacementError) -> Self {
        match e {
            PlacementError::NotEnoughBookies { wanted, available } => {
                LedgerError::NotEnoughBookies { wanted, available }
            }
        }
    }
}

/// Shared state of a client and its handles.
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn MetadataStore>,
    pub(crate) layout: Layout,
    pub(crate) options: LedgerClientOptions,
    pub(crate) registry: Arc<Registry>,
    pub(crate) pool: Pool,
    /// Dropped with the last clone: stops the registry watch.
    _stop_watch: oneshot::Sender<()>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("layout", &self.layout)
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

/// The ledger client (see the module doc). Cheap to clone; every clone shares
/// the bookie registry and connections.
#[derive(Debug, Clone)]
pub struct LedgerClient {
    inner: Arc<Inner>,
}

pub(crate) fn decode_metadata(ledger_id: u64, data: &[u8]) -> Result<LedgerMetadata, LedgerError> {
    LedgerMetadata::decode(data).map_err(|e| LedgerError::BadMetadata {
        ledger_id,
        reason: e.to_string(),
    })
}

fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn retryable(e: &MetadataError) -> bool {
    matches!(
        e,
        MetadataError::ConnectionLoss(_) | MetadataError::Timeout(_)
    )
}

impl Inner {
    /// The path `<root>/underreplicated/<suffix of Layout::ledger(id)>`.
    pub(crate) fn underreplicated_path(&self, ledger_id: u64) -> String {
        let ledger = self.layout.ledger(ledger_id);
        let suffix = ledger
            .strip_prefix(&self.layout.ledgers())
            .unwrap_or(&ledger);
        format!("{}{suffix}", self.layout.underreplicated())
    }

    /// Records `ledger_id` as under-replicated (idempotent).
    pub(crate) async fn report_underreplicated(&self, ledger_id: u64, bookies: &[BookieId]) {
        let path = self.underreplicated_path(ledger_id);
        let data = bookies.join(",");
        for _ in 0..self.options.metadata_attempts_max.max(1) {
            let res = self
                .store
                .create(&path, data.as_bytes(), CreateMode::Persistent)
                .await;
            match res {
                Ok(_) | Err(MetadataError::NodeExists(_)) => {
                    info!(ledger = ledger_id, ?bookies, path = %path, "ledger reported under-replicated");
                    return;
                }
                Err(MetadataError::NoNode(_)) => {
                    if let Some(parent) = parent_of(&path)
                        && let Err(e) = self.store.create_all(parent).await
                    {
                        warn!(ledger = ledger_id, error = %e, "creating under-replicated parents");
                    }
                }
                Err(e) if retryable(&e) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    warn!(ledger = ledger_id, error = %e, "reporting under-replication failed");
                    return;
                }
            }
        }
    }

    /// Reads a ledger's metadata and its node version.
    pub(crate) async fn read_metadata(
        &self,
        ledger_id: u64,
    ) -> Result<(LedgerMetadata, i64), LedgerError> {
        let path = self.layout.ledger(ledger_id);
        match self.store.get(&path).await {
            Ok((data, stat)) => Ok((decode_metadata(ledger_id, &data)?, stat.version)),
            Err(MetadataError::NoNode(_)) => Err(LedgerError::NoSuchLedger(ledger_id)),
            Err(e) => Err(LedgerError::Metadata(e)),
        }
    }

    /// Runs `op` as a read-modify-CAS loop on the ledger's node.
    pub(crate) async fn update_metadata(
        &self,
        ledger_id: u64,
        op: &MetadataOp,
    ) -> Result<LedgerMetadata, UpdateError> {
        let path = self.layout.ledger(ledger_id);
        let mut last = String::from("no attempt");
        for _ in 0..self.options.metadata_attempts_max.max(1) {
            let (data, stat) = match self.store.get(&path).await {
                Ok(x) => x,
                Err(e) if retryable(&e) => {
                    last = e.to_string();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(e) => return Err(UpdateError::Store(e.to_string())),
            };
            let md = LedgerMetadata::decode(data.as_slice())
                .map_err(|e| UpdateError::Store(format!("undecodable metadata: {e}")))?;
            match op.apply(&md)? {
                Update::Unchanged => return Ok(md),
                Update::Write(new) => {
                    match self
                        .store
                        .set(&path, &new.encode_to_vec(), Expected::Version(stat.version))
                        .await
                    {
                        Ok(_) => return Ok(new),
                        Err(MetadataError::BadVersion { .. }) => {
                            debug!(ledger = ledger_id, "metadata version conflict; re-reading");
                            last = "version conflict".into();
                        }
                        Err(e) if retryable(&e) => {
                            last = e.to_string();
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => return Err(UpdateError::Store(e.to_string())),
                    }
                }
            }
        }
        Err(UpdateError::Store(format!(
            "metadata update gave up after {} attempts: {last}",
            self.options.metadata_attempts_max
        )))
    }

    /// Placement's answer to an ensemble-change request.
    pub(crate) fn choose_replacements(&self, req: &EnsembleChangeRequest) -> Vec<Replacement> {
        let bookies = self.registry.snapshot();
        let exclude = self.pool.quarantined();
        let mut rng = rand::rng();
        choose_replacements(&bookies, &req.ensemble, &req.failed, &exclude, &mut rng)
    }

    fn choose_ensemble(&self, n: usize) -> Result<Vec<BookieId>, PlacementError> {
        let bookies: Vec<BookieInfo> = self.registry.snapshot();
        let exclude: BTreeSet<BookieId> = self.pool.quarantined();
        let mut rng = rand::rng();
        choose_ensemble(&bookies, n, &exclude, &mut rng)
    }

    /// A fresh ledger id from the sequential id generator.
    async fn next_ledger_id(&self) -> Result<u64, LedgerError> {
        let dir = self.layout.ledger_idgen();
        let prefix = join(&dir, "ID-");
        let mut created = None;
        for _ in 0..self.options.metadata_attempts_max.max(1) {
            match self
                .store
                .create(&prefix, &[], CreateMode::PersistentSequential)
                .await
            {
                Ok((path, _)) => {
                    created = Some(path);
                    break;
                }
                Err(MetadataError::NoNode(_)) => self
                    .store
                    .create_all(&dir)
                    .await
                    .map_err(LedgerError::Metadata)?,
                Err(e) if retryable(&e) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => return Err(LedgerError::Metadata(e)),
            }
        }
        let Some(path) = created else {
            return Err(LedgerError::Metadata(MetadataError::Timeout(0)));
        };
        let id = path
            .rsplit('-')
            .next()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| LedgerError::BadIdNode(path.clone()))?;
        // The counter lives in the parent: deleting the node never lets an id repeat.
        if let Err(e) = self.store.delete(&path, Expected::Any).await {
            warn!(path = %path, error = %e, "could not delete id generator node");
        }
        Ok(id)
    }
}

impl LedgerClient {
    /// Connects: reads the bookie registrations under `layout` and starts
    /// watching them.
    pub async fn connect(
        store: Arc<dyn MetadataStore>,
        layout: Layout,
        options: LedgerClientOptions,
    ) -> Result<LedgerClient, LedgerError> {
        let registry = Arc::new(Registry::new(
            store.clone(),
            layout.clone(),
            options.endpoint_overrides.clone(),
        ));
        registry.refresh().await.map_err(LedgerError::Metadata)?;
        let (stop_tx, stop_rx) = oneshot::channel();
        tokio::spawn(
            registry
                .clone()
                .watch(stop_rx, options.reconnect_backoff_ms_min.max(10)),
        );
        let pool = Pool::new(
            registry.clone(),
            PoolConfig {
                client: options.bookie.clone(),
                reconnect_backoff_ms_min: options.reconnect_backoff_ms_min,
                reconnect_backoff_ms_max: options.reconnect_backoff_ms_max,
                bookie_connections_max: options.bookie_connections_max,
            },
        );
        Ok(LedgerClient {
            inner: Arc::new(Inner {
                store,
                layout,
                options,
                registry,
                pool,
                _stop_watch: stop_tx,
            }),
        })
    }

    /// The largest payload one add accepts (the writers'
    /// `entry_payload_bytes_max`): a larger add is refused with
    /// [`AddError::TooLarge`].
    pub fn entry_payload_bytes_max(&self) -> usize {
        self.inner.options.writer.entry_payload_bytes_max
    }

    /// The bookies known now (writable and read-only), sorted by id.
    pub fn bookies(&self) -> Vec<BookieInfo> {
        let mut b = self.inner.registry.snapshot();
        b.sort_by(|x, y| x.id.cmp(&y.id));
        b
    }

    /// Re-reads the bookie registrations now (the watch does it on changes).
    pub async fn refresh_bookies(&self) -> Result<(), LedgerError> {
        self.inner
            .registry
            .refresh()
            .await
            .map_err(LedgerError::Metadata)
    }

    /// Creates a ledger of `ensemble` bookies, `write_quorum` copies per
    /// entry, `ack_quorum` acks per add, and returns its writer.
    pub async fn create_ledger(
        &self,
        ensemble: usize,
        write_quorum: usize,
        ack_quorum: usize,
        password: &[u8],
        custom: HashMap<String, Bytes>,
    ) -> Result<WriteHandle, LedgerError> {
        let quorum = QuorumSpec::new(ensemble, write_quorum, ack_quorum)?;
        let chosen = match self.inner.choose_ensemble(ensemble) {
            Ok(c) => c,
            Err(_) => {
                self.refresh_bookies().await?;
                self.inner.choose_ensemble(ensemble)?
            }
        };
        let ledger_id = self.inner.next_ledger_id().await?;
        let md = new_ledger(NewLedger {
            ledger_id,
            quorum,
            ensemble: chosen,
            password: Bytes::copy_from_slice(password),
            custom,
            ctime_ms: now_unix_ms(),
        })
        .map_err(|e| LedgerError::BadMetadata {
            ledger_id,
            reason: e.to_string(),
        })?;
        let path = self.inner.layout.ledger(ledger_id);
        if let Some(parent) = parent_of(&path) {
            self.inner
                .store
                .create_all(parent)
                .await
                .map_err(LedgerError::Metadata)?;
        }
        self.inner
            .store
            .create(&path, &md.encode_to_vec(), CreateMode::Persistent)
            .await
            .map_err(LedgerError::Metadata)?;
        info!(ledger = ledger_id, ensemble = ?md.segments.first().map(|s| &s.ensemble), "ledger created");
        WriteHandle::start(self.inner.clone(), md)
    }

    /// Opens ledger `ledger_id` for reading. Without `recovery` the reader
    /// never reads past the LAC; with it, the ledger is first fenced,
    /// recovered and closed.
    pub async fn open_ledger(
        &self,
        ledger_id: u64,
        recovery: bool,
    ) -> Result<ReadHandle, LedgerError> {
        if recovery {
            read::recover(self.inner.clone(), ledger_id).await?;
        }
        let (md, _) = self.inner.read_metadata(ledger_id).await?;
        ReadHandle::new(self.inner.clone(), md)
    }

    /// Deletes a ledger's metadata node (bookies garbage-collect its data)
    /// and its under-replication mark, if any.
    pub async fn delete_ledger(&self, ledger_id: u64) -> Result<(), LedgerError> {
        let path = self.inner.layout.ledger(ledger_id);
        match self.inner.store.delete(&path, Expected::Any).await {
            Ok(()) => {}
            Err(MetadataError::NoNode(_)) => return Err(LedgerError::NoSuchLedger(ledger_id)),
            Err(e) => return Err(LedgerError::Metadata(e)),
        }
        let ur = self.inner.underreplicated_path(ledger_id);
        match self.inner.store.delete(&ur, Expected::Any).await {
            Ok(()) | Err(MetadataError::NoNode(_)) => {}
            Err(e) => {
                warn!(ledger = ledger_id, error = %e, "could not delete under-replication mark")
            }
        }
        info!(ledger = ledger_id, "ledger deleted");
        Ok(())
    }

    /// The current metadata of a ledger.
    pub async fn ledger_metadata(&self, ledger_id: u64) -> Result<LedgerMetadata, LedgerError> {
        Ok(self.inner.read_metadata(ledger_id).await?.0)
    }

    /// The under-replication mark's path for `ledger_id`.
    pub fn underreplicated_path(&self, ledger_id: u64) -> String {
        self.inner.underreplicated_path(ledger_id)
    }
}

#[cfg(test)]
mod tests;
