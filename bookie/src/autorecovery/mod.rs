//! Autorecovery: restores the replicas of lost bookies (reference §5, DESIGN §3).
//!
//! Two loops share one metadata session ([`run`]):
//! - the **auditor**, one at a time cluster-wide, elected by creating the
//!   ephemeral `<root>/autorecovery/auditor`; every `audit_interval_ms` (and on
//!   registration changes) it lists the live bookies (available + read-only)
//!   and all ledgers, and once a bookie some ledger names has been missing
//!   for `lost_bookie_grace_ms` it marks each such ledger under
//!   `<root>/underreplicated/<hierarchical id>` (persistent, idempotent; the
//!   node's data lists the lost bookies, comma-separated);
//! - the **worker** takes one marked ledger at a time under the ephemeral lock
//!   `<root>/autorecovery/locks/<ledger id>`. An OPEN ledger is left alone for
//!   `open_ledger_grace_ms` after it was first seen, then recovery-opened
//!   (fencing its writer). For each segment naming a lost bookie it chooses a
//!   replacement outside the segment's ensemble, copies every entry the lost
//!   bookie held from a surviving replica, digest-verified, to the replacement
//!   with RECOVERY_ADD, and only when every copy of that segment was
//!   acknowledged CASes the replacement into the segment. The mark is deleted
//!   when no segment names a lost bookie any more.
//!
//! The bookie's **integrity check** ([`Worker::restore_own`], run by
//! `serve` for the ledgers it holds in limbo, DESIGN §4.3) copies the entries
//! a formatted bookie should hold back to it from the other replicas, ledger
//! by ledger, once each ledger is closed; the bookie leaves limbo for a
//! ledger only after that succeeded.
//!
//! The pure decisions live in [`plan`]. Copies are throttled by a token bucket
//! ([`Throttle`]) in entries/s and bytes/s. A worker killed mid-copy leaves the
//! metadata untouched (copies are idempotent RECOVERY_ADDs) and its lock goes
//! with its session, so another worker starts the ledger over.

pub mod metrics;
pub mod plan;

pub use metrics::AutorecoveryMetrics;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use prost::Message;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use self::plan::{LostTracker, SegmentCopy, bookies_named, copy_plan, ledgers_to_mark};
use crate::bookie_client::{BookieClient, ClientOptions, read_status};
use crate::client::driver::placement::{BookieInfo, choose_replacements};
use crate::client::driver::{LedgerClient, LedgerError};
use crate::client::master_key::master_key;
use crate::client::metadata::status;
use crate::client::{BookieId, Replacement};
use crate::entry::Entry;
use crate::metadata::layout::Layout;
use crate::metadata::{CreateMode, Expected, MetadataError, MetadataStore, join, parent_of};
use crate::proto::bookie::StatusCode;
use crate::proto::metadata::{LedgerMetadata, LedgerStatus};

/// Options of autorecovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutorecoveryConfig {
    /// Name written into the auditor and lock nodes (who holds them).
    pub name: String,
    /// A bookie missing this long is lost, in milliseconds.
    pub lost_bookie_grace_ms: u64,
    /// An OPEN ledger is recovery-opened only after this long, in milliseconds.
    pub open_ledger_grace_ms: u64,
    /// Period of the auditor's full check and of the worker's scan, in milliseconds.
    pub audit_interval_ms: u64,
    /// Entries copied per second at most (0 = unlimited).
    pub replication_entries_per_s_max: u64,
    /// Entry bytes copied per second at most (0 = unlimited).
    pub replication_bytes_per_s_max: u64,
    /// Period of the auditor's sampled integrity check of closed ledgers, in
    /// milliseconds (0 = off).
    pub sample_check_interval_ms: u64,
    /// Random entries read per segment by the sampled check, besides the
    /// first E and the last of each segment.
    pub sample_reads_per_segment: usize,
    /// Run the auditor election (false: worker only).
    pub auditor: bool,
    /// Run the worker.
    pub worker: bool,
}

impl Default for AutorecoveryConfig {
    fn default() -> Self {
        AutorecoveryConfig {
            name: "autorecovery".into(),
            lost_bookie_grace_ms: 300_000,
            open_ledger_grace_ms: 30_000,
            audit_interval_ms: 5_000,
            replication_entries_per_s_max: 5_000,
            replication_bytes_per_s_max: 50 * 1024 * 1024,
            sample_check_interval_ms: 3_600_000,
            sample_reads_per_segment: 4,
            auditor: true,
            worker: true,
        }
    }
}

/// Why one ledger's re-replication failed (it is retried later).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicationError {
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Metadata(#[from] MetadataError),
    /// The ledger client failed (recovery, metadata).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// No plan could be made.
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    /// No writable bookie outside the ensemble.
    #[error("no replacement for bookie {0}")]
    NoReplacement(BookieId),
    /// An entry could not be read, digest-verified, from any source.
    #[error("entry {entry_id}: no readable replica")]
    Unreadable {
        /// The entry.
        entry_id: i64,
    },
    /// The replacement refused or failed a copy.
    #[error("entry {entry_id}: copy to {bookie} failed: {reason}")]
    CopyFailed {
        /// The entry.
        entry_id: i64,
        /// The replacement.
        bookie: BookieId,
        /// Why.
        reason: String,
    },
    /// The ledger is not closed yet (integrity check: retried later).
    #[error("ledger not closed yet")]
    NotClosed,
    /// Swapping the replacement into the metadata failed.
    #[error("swap: {0}")]
    Swap(String),
}

/// Longest idle time a [`Throttle`] banks as credit, in milliseconds.
pub const THROTTLE_BURST_MS: u64 = 100;

/// A token bucket over entries and bytes per second (0 = unlimited).
#[derive(Debug)]
pub struct Throttle {
    entries_per_s_max: u64,
    bytes_per_s_max: u64,
    start: Instant,
    entries: u64,
    bytes: u64,
}

impl Throttle {
    /// A bucket allowing `entries_per_s_max` and `bytes_per_s_max`.
    pub fn new(entries_per_s_max: u64, bytes_per_s_max: u64) -> Throttle {
        Throttle {
            entries_per_s_max,
            bytes_per_s_max,
            start: Instant::now(),
            entries: 0,
            bytes: 0,
        }
    }

    /// How long to wait after `elapsed` has passed with `entries`, `bytes`
    /// already admitted (pure: the rate over the whole run stays under both bounds).
    pub fn delay(&self, elapsed: Duration) -> Duration {
        let need = |done: u64, rate: u64| {
            if rate == 0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(done as f64 / rate as f64)
            }
        };
        let due =
            need(self.entries, self.entries_per_s_max).max(need(self.bytes, self.bytes_per_s_max));
        due.saturating_sub(elapsed)
    }

    /// Counts `bytes` copied (their delay applies at the next [`Throttle::admit`]).
    pub fn charge_bytes(&mut self, bytes: u64) {
        self.bytes += bytes;
    }

    /// Admits one entry of `bytes`, sleeping as needed.
    pub async fn admit(&mut self, bytes: u64) {
        // Idle time banks no credit beyond THROTTLE_BURST_MS: an idle worker
        // does not get to burst through a backlog at full speed.
        let elapsed = self.start.elapsed();
        // The time the work admitted so far is due at, from `start`.
        let due = self.delay(Duration::ZERO);
        if elapsed > due + Duration::from_millis(THROTTLE_BURST_MS) {
            self.start = Instant::now();
            self.entries = 0;
            self.bytes = 0;
        }
        self.entries += 1;
        self.bytes += bytes;
        let d = self.delay(self.start.elapsed());
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }
}

/// Runs the auditor and the worker (as configured) until `shutdown` turns true.
pub async fn run(
    store: Arc<dyn MetadataStore>,
    layout: Layout,
    client: LedgerClient,
    config: AutorecoveryConfig,
    metrics: AutorecoveryMetrics,
    shutdown: watch::Receiver<bool>,
) {
    info!(name = %config.name, auditor = config.auditor, worker = config.worker, "autorecovery starting");
    let a = config.auditor.then(|| {
        tokio::spawn(auditor_loop(
            store.clone(),
            layout.clone(),
            client.clone(),
            config.clone(),
            metrics.clone(),
            shutdown.clone(),
        ))
    });
    let w = config.worker.then(|| {
        tokio::spawn(worker_loop(
            store.clone(),
            layout.clone(),
            client,
            config.clone(),
            metrics.clone(),
            shutdown.clone(),
        ))
    });
    if let Some(a) = a {
        let _ = a.await;
    }
    if let Some(w) = w {
        let _ = w.await;
    }
    info!("autorecovery stopped");
}

/// [`run`] with its own ledger client on `store` (default client options);
/// closes `store` when done. What `cms-bookie autorecovery` and
/// `serve --autorecovery` run.
pub async fn run_standalone(
    store: Arc<dyn MetadataStore>,
    layout: Layout,
    config: AutorecoveryConfig,
    metrics: AutorecoveryMetrics,
    shutdown: watch::Receiver<bool>,
) -> Result<(), LedgerError> {
    let client = LedgerClient::connect(
        store.clone(),
        layout.clone(),
        crate::client::driver::LedgerClientOptions::default(),
    )
    .await?;
    run(store.clone(), layout, client, config, metrics, shutdown).await;
    store.close().await;
    Ok(())
}

async fn wait_or_shutdown(shutdown: &mut watch::Receiver<bool>, ms: u64) -> bool {
    if *shutdown.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(ms)) => *shutdown.borrow(),
        _ = shutdown.changed() => true,
    }
}

/// Names of the children of `path`, empty if it does not exist.
async fn children_or_empty(
    store: &dyn MetadataStore,
    path: &str,
) -> Result<Vec<String>, MetadataError> {
    match store.children(path).await {
        Ok(c) => Ok(c),
        Err(MetadataError::NoNode(_)) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The live bookies: registered available or read-only.
pub async fn live_bookies(
    store: &dyn MetadataStore,
    layout: &Layout,
) -> Result<BTreeSet<BookieId>, MetadataError> {
    let mut live: BTreeSet<BookieId> = children_or_empty(store, &layout.bookies_available())
        .await?
        .into_iter()
        .collect();
    live.extend(children_or_empty(store, &layout.bookies_readonly()).await?);
    Ok(live)
}

/// Paths of the leaves `depth` levels below `root` (the hierarchical id layout).
async fn leaves(
    store: &dyn MetadataStore,
    root: &str,
    depth: usize,
) -> Result<Vec<String>, MetadataError> {
    let mut level = vec![root.to_string()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for p in &level {
            for c in children_or_empty(store, p).await? {
                next.push(join(p, &c));
            }
        }
        level = next;
    }
    Ok(level)
}

/// Every ledger's id and metadata (undecodable nodes are skipped with a warning).
pub async fn all_ledgers(
    store: &dyn MetadataStore,
    layout: &Layout,
) -> Result<Vec<(u64, LedgerMetadata)>, MetadataError> {
    let mut out = Vec::new();
    for path in leaves(store, &layout.ledgers(), 5).await? {
        let Some(id) = layout.ledger_id_of(&path) else {
            continue;
        };
        match store.get(&path).await {
            Ok((data, _)) => match LedgerMetadata::decode(data.as_slice()) {
                Ok(md) => out.push((id, md)),
                Err(e) => warn!(ledger = id, error = %e, "undecodable ledger metadata"),
            },
            Err(MetadataError::NoNode(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The ids of the ledgers marked under-replicated, sorted, with the node data.
pub async fn list_underreplicated(
    store: &dyn MetadataStore,
    layout: &Layout,
) -> Result<Vec<(u64, String)>, MetadataError> {
    let root = layout.underreplicated();
    let mut out = Vec::new();
    for path in leaves(store, &root, 5).await? {
        let as_ledger = format!("{}{}", layout.ledgers(), &path[root.len()..]);
        let Some(id) = layout.ledger_id_of(&as_ledger) else {
            continue;
        };
        match store.get(&path).await {
            Ok((data, _)) => out.push((id, String::from_utf8_lossy(&data).into_owned())),
            Err(MetadataError::NoNode(_)) => {}
            Err(e) => return Err(e),
        }
    }
    out.sort();
    Ok(out)
}

fn underreplicated_path(layout: &Layout, ledger_id: u64) -> String {
    let ledger = layout.ledger(ledger_id);
    let suffix = &ledger[layout.ledgers().len()..];
    format!("{}{suffix}", layout.underreplicated())
}

/// Marks `ledger_id` under-replicated by `bookies` (idempotent).
pub async fn mark_underreplicated(
    store: &dyn MetadataStore,
    layout: &Layout,
    ledger_id: u64,
    bookies: &[BookieId],
) -> Result<bool, MetadataError> {
    let path = underreplicated_path(layout, ledger_id);
    let data = bookies.join(",");
    for _ in 0..2 {
        match store
            .create(&path, data.as_bytes(), CreateMode::Persistent)
            .await
        {
            Ok(_) => return Ok(true),
            Err(MetadataError::NodeExists(_)) => return Ok(false),
            Err(MetadataError::NoNode(_)) => {
                if let Some(parent) = parent_of(&path) {
                    store.create_all(parent).await?;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

async fn auditor_loop(
    store: Arc<dyn MetadataStore>,
    layout: Layout,
    client: LedgerClient,
    config: AutorecoveryConfig,
    metrics: AutorecoveryMetrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let path = layout.auditor();
    loop {
        if *shutdown.borrow() {
            return;
        }
        if let Some(parent) = parent_of(&path)
            && let Err(e) = store.create_all(parent).await
        {
            warn!(error = %e, "creating the autorecovery node");
        }
        match store
            .create(&path, config.name.as_bytes(), CreateMode::Ephemeral)
            .await
        {
            Ok(_) => {
                info!(name = %config.name, "elected auditor");
                metrics.is_auditor.set(1);
                audit(&store, &layout, &client, &config, &metrics, &mut shutdown).await;
                metrics.is_auditor.set(0);
                let _ = store.delete(&path, Expected::Any).await;
                return;
            }
            Err(MetadataError::NodeExists(_)) => {
                debug!("another auditor is elected; waiting");
            }
            Err(e) => warn!(error = %e, "auditor election"),
        }
        if wait_or_shutdown(&mut shutdown, config.audit_interval_ms.min(1_000)).await {
            return;
        }
    }
}

/// The auditor's duty while elected: returns at shutdown or when the session ends.
async fn audit(
    store: &Arc<dyn MetadataStore>,
    layout: &Layout,
    client: &LedgerClient,
    config: &AutorecoveryConfig,
    metrics: &AutorecoveryMetrics,
    shutdown: &mut watch::Receiver<bool>,
) {
    let start = Instant::now();
    let mut tracker = LostTracker::new();
    let mut session = store.session_events();
    let mut marked: BTreeSet<u64> = BTreeSet::new();
    let mut last_sample_check = Instant::now();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
    loop {
        if session.borrow_and_update().is_terminal() {
            warn!("auditor session ended");
            return;
        }
        if config.sample_check_interval_ms > 0
            && last_sample_check.elapsed() >= Duration::from_millis(config.sample_check_interval_ms)
        {
            last_sample_check = Instant::now();
            match sample_check(store.as_ref(), layout, client, config, &mut rng).await {
                Ok(found) => {
                    for (id, bookies) in found {
                        metrics.ledgers_marked.inc();
                        info!(ledger = id, bookies = ?bookies, "sampled check: replica missing entries; marked under-replicated");
                    }
                }
                Err(e) => warn!(error = %e, "sampled integrity check failed"),
            }
        }
        match audit_once(store.as_ref(), layout, config, &mut tracker, start).await {
            Ok(newly) => {
                for id in newly {
                    if marked.insert(id) {
                        metrics.ledgers_marked.inc();
                        info!(ledger = id, "auditor marked ledger under-replicated");
                    }
                }
            }
            Err(e) => warn!(error = %e, "audit failed"),
        }
        // Poll at least every grace/4 so a loss is acted on soon after the grace.
        let ms = config
            .audit_interval_ms
            .min((config.lost_bookie_grace_ms / 4).max(50));
        if wait_or_shutdown(shutdown, ms).await {
            return;
        }
    }
}

async fn audit_once(
    store: &dyn MetadataStore,
    layout: &Layout,
    config: &AutorecoveryConfig,
    tracker: &mut LostTracker,
    start: Instant,
) -> Result<Vec<u64>, MetadataError> {
    let live = live_bookies(store, layout).await?;
    let ledgers = all_ledgers(store, layout).await?;
    let named: BTreeSet<BookieId> = ledgers
        .iter()
        .flat_map(|(_, md)| bookies_named(md))
        .collect();
    let now = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    let lost = tracker.observe(now, &named, &live, config.lost_bookie_grace_ms);
    if lost.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (id, bookies) in ledgers_to_mark(&ledgers, &lost) {
        if mark_underreplicated(store, layout, id, &bookies).await? {
            out.push(id);
        }
    }
    Ok(out)
}

/// The auditor's sampled integrity check (reference §5, BookKeeper's
/// periodic check): for every CLOSED ledger, reads the entries
/// [`plan::sample_reads`] picks from every live bookie of their write sets
/// (no fence), and marks under-replicated — naming the bookie — each ledger
/// whose replica answered NO_ENTRY or NO_LEDGER. Timeouts, errors, limbo
/// (UNKNOWN_LEDGER_STATE) and missing bookies prove nothing here and are
/// skipped (lost bookies are the grace-period path's). Returns the ledgers
/// marked by this pass with the bookies named.
pub async fn sample_check(
    store: &dyn MetadataStore,
    layout: &Layout,
    client: &LedgerClient,
    config: &AutorecoveryConfig,
    rng: &mut impl rand::Rng,
) -> Result<Vec<(u64, BTreeSet<BookieId>)>, ReplicationError> {
    client.refresh_bookies().await?;
    let live: HashMap<BookieId, BookieInfo> = client
        .bookies()
        .into_iter()
        .map(|b| (b.id.clone(), b))
        .collect();
    let opts = ClientOptions {
        connect_timeout_ms: 2_000,
        request_timeout_ms: 5_000,
        add_queue_max: 16,
    };
    let mut conns: HashMap<BookieId, Option<BookieClient>> = HashMap::new();
    let mut out = Vec::new();
    for (id, md) in all_ledgers(store, layout).await? {
        let reads = plan::sample_reads(&md, config.sample_reads_per_segment, |n| {
            rng.random_range(0..n.max(1))
        })?;
        let mut missing: BTreeSet<BookieId> = BTreeSet::new();
        for (entry_id, bookie) in reads {
            if missing.contains(&bookie) {
                continue;
            }
            let Some(info) = live.get(&bookie) else {
                continue;
            };
            if !conns.contains_key(&bookie) {
                let c =
                    BookieClient::connect(&info.id, info.incarnation, &info.endpoint, opts.clone())
                        .await
                        .ok();
                conns.insert(bookie.clone(), c);
            }
            let Some(Some(c)) = conns.get(&bookie) else {
                continue;
            };
            match c.read(id, entry_id, None, crate::fair::AUDIT_KEY).await {
                Ok(r) => match read_status(&r) {
                    StatusCode::NoEntry | StatusCode::NoLedger => {
                        debug!(ledger = id, entry = entry_id, bookie = %bookie, "sampled read: missing");
                        missing.insert(bookie);
                    }
                    StatusCode::Ok if Entry::decode_expected(r.body, id, entry_id).is_err() => {
                        warn!(ledger = id, entry = entry_id, bookie = %bookie, "sampled read: bad digest");
                        missing.insert(bookie);
                    }
                    _ => {}
                },
                Err(e) => debug!(ledger = id, bookie = %bookie, error = %e, "sampled read failed"),
            }
        }
        if !missing.is_empty() {
            let names: Vec<BookieId> = missing.iter().cloned().collect();
            if mark_underreplicated(store, layout, id, &names).await? {
                out.push((id, missing));
            }
        }
    }
    Ok(out)
}

async fn worker_loop(
    store: Arc<dyn MetadataStore>,
    layout: Layout,
    client: LedgerClient,
    config: AutorecoveryConfig,
    metrics: AutorecoveryMetrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut worker = Worker::new(store, layout, client, config.clone()).with_metrics(metrics);
    loop {
        if *shutdown.borrow() {
            return;
        }
        if let Err(e) = worker.scan_once().await {
            warn!(error = %e, "worker scan failed");
        }
        if wait_or_shutdown(&mut shutdown, config.audit_interval_ms.min(1_000)).await {
            return;
        }
    }
}

/// The worker (see the module doc); public so tests and tools can run one
/// pass without the loop.
pub struct Worker {
    store: Arc<dyn MetadataStore>,
    layout: Layout,
    client: LedgerClient,
    config: AutorecoveryConfig,
    conns: HashMap<(BookieId, u64), BookieClient>,
    first_seen_open: BTreeMap<u64, Instant>,
    throttle: Throttle,
    metrics: AutorecoveryMetrics,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.config.name)
            .finish_non_exhaustive()
    }
}

/// What one ledger's attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Fully replicated; the mark was deleted.
    Done {
        /// Entries copied.
        entries_copied: u64,
    },
    /// Locked by another worker.
    Locked,
    /// Open and within its grace period.
    Deferred,
}

impl Worker {
    /// A worker on `store` with its own throttle.
    pub fn new(
        store: Arc<dyn MetadataStore>,
        layout: Layout,
        client: LedgerClient,
        config: AutorecoveryConfig,
    ) -> Worker {
        let throttle = Throttle::new(
            config.replication_entries_per_s_max,
            config.replication_bytes_per_s_max,
        );
        Worker {
            store,
            layout,
            client,
            config,
            conns: HashMap::new(),
            first_seen_open: BTreeMap::new(),
            throttle,
            metrics: AutorecoveryMetrics::unregistered(),
        }
    }

    /// Reports into `metrics` (default: unregistered metrics).
    pub fn with_metrics(mut self, metrics: AutorecoveryMetrics) -> Worker {
        self.metrics = metrics;
        self
    }

    /// One pass over the marked ledgers; returns how many were finished.
    pub async fn scan_once(&mut self) -> Result<usize, MetadataError> {
        let marked = list_underreplicated(self.store.as_ref(), &self.layout).await?;
        self.metrics
            .underreplicated_ledgers
            .set(i64::try_from(marked.len()).unwrap_or(i64::MAX));
        let mut done = 0;
        for (id, data) in marked {
            match self.replicate_ledger(id, &data).await {
                Ok(Outcome::Done { entries_copied }) => {
                    info!(ledger = id, entries_copied, "ledger re-replicated");
                    self.metrics.ledgers_replicated.inc();
                    done += 1;
                }
                Ok(o) => debug!(ledger = id, outcome = ?o, "ledger not replicated now"),
                Err(e) => {
                    self.metrics.worker_errors.inc();
                    warn!(ledger = id, error = %e, "re-replication failed; will retry")
                }
            }
        }
        Ok(done)
    }

    /// Takes the lock of `ledger_id` and re-replicates it (`reported`: the
    /// mark's data, bookies named lost).
    pub async fn replicate_ledger(
        &mut self,
        ledger_id: u64,
        reported: &str,
    ) -> Result<Outcome, ReplicationError> {
        let locks = self.layout.autorecovery_locks();
        self.store.create_all(&locks).await?;
        let lock = join(&locks, &ledger_id.to_string());
        match self
            .store
            .create(&lock, self.config.name.as_bytes(), CreateMode::Ephemeral)
            .await
        {
            Ok(_) => {}
            Err(MetadataError::NodeExists(_)) => return Ok(Outcome::Locked),
            Err(e) => return Err(e.into()),
        }
        let res = self.replicate_locked(ledger_id, reported).await;
        if let Err(e) = self.store.delete(&lock, Expected::Any).await {
            warn!(ledger = ledger_id, error = %e, "releasing the replication lock");
        }
        res
    }

    async fn replicate_locked(
        &mut self,
        ledger_id: u64,
        reported: &str,
    ) -> Result<Outcome, ReplicationError> {
        let mark = underreplicated_path(&self.layout, ledger_id);
        let md = match self.client.ledger_metadata(ledger_id).await {
            Ok(md) => md,
            Err(LedgerError::NoSuchLedger(_)) => {
                self.delete_mark(&mark).await?;
                return Ok(Outcome::Done { entries_copied: 0 });
            }
            Err(e) => return Err(e.into()),
        };
        let st = status(&md).map_err(|e| ReplicationError::Swap(e.to_string()))?;
        let md = if st == LedgerStatus::LedgerClosed {
            md
        } else {
            let seen = *self
                .first_seen_open
                .entry(ledger_id)
                .or_insert_with(Instant::now);
            if st == LedgerStatus::LedgerOpen
                && seen.elapsed() < Duration::from_millis(self.config.open_ledger_grace_ms)
            {
                return Ok(Outcome::Deferred);
            }
            info!(
                ledger = ledger_id,
                "recovery-opening an open under-replicated ledger"
            );
            self.client.open_ledger(ledger_id, true).await?;
            self.first_seen_open.remove(&ledger_id);
            self.client.ledger_metadata(ledger_id).await?
        };
        self.client.refresh_bookies().await?;
        let bookies = self.client.bookies();
        let live: BTreeSet<BookieId> = bookies.iter().map(|b| b.id.clone()).collect();
        let mut lost: BTreeSet<BookieId> = bookies_named(&md)
            .into_iter()
            .filter(|b| !live.contains(b))
            .collect();
        lost.extend(
            reported
                .split(',')
                .map(str::trim)
                .filter(|b| !b.is_empty() && bookies_named(&md).contains(*b))
                .map(str::to_string),
        );
        let mut copied = 0;
        for seg in copy_plan(&md, &lost)? {
            copied += self.restore_segment(ledger_id, &md, &seg, &bookies).await?;
        }
        self.delete_mark(&mark).await?;
        Ok(Outcome::Done {
            entries_copied: copied,
        })
    }

    async fn delete_mark(&self, mark: &str) -> Result<(), MetadataError> {
        match self.store.delete(mark, Expected::Any).await {
            Ok(()) | Err(MetadataError::NoNode(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn conn(&mut self, info: &BookieInfo) -> Result<BookieClient, String> {
        let key = (info.id.clone(), info.incarnation);
        if let Some(c) = self.conns.get(&key)
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        let opts = ClientOptions {
            connect_timeout_ms: 2_000,
            request_timeout_ms: 5_000,
            add_queue_max: 1_000,
        };
        let c = BookieClient::connect(&info.id, info.incarnation, &info.endpoint, opts)
            .await
            .map_err(|e| e.to_string())?;
        self.conns.insert(key, c.clone());
        Ok(c)
    }

    /// The integrity check of one ledger for bookie `me` (DESIGN §4.3): every
    /// entry `me`'s slots should hold that it does not return digest-verified
    /// is copied to it from another replica with RECOVERY_ADD. A ledger not
    /// yet closed is [`ReplicationError::NotClosed`] (retry later: this check
    /// never fences a writer itself). Returns the
    /// entries copied; `Ok` means `me` holds all of them and may leave limbo.
    pub async fn restore_own(
        &mut self,
        me: &BookieInfo,
        ledger_id: u64,
    ) -> Result<u64, ReplicationError> {
        let md = match self.client.ledger_metadata(ledger_id).await {
            Ok(md) => md,
            Err(LedgerError::NoSuchLedger(_)) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        if !bookies_named(&md).contains(&me.id) {
            return Ok(0);
        }
        if !status(&md).is_ok_and(|s| s == LedgerStatus::LedgerClosed) {
            // Its writer, a reader's recovery or the autorecovery worker
            // closes it; until then which entries exist is not settled.
            return Err(ReplicationError::NotClosed);
        }
        self.client.refresh_bookies().await?;
        let bookies = self.client.bookies();
        let lost: BTreeSet<BookieId> = [me.id.clone()].into();
        let target = self
            .conn(me)
            .await
            .map_err(|reason| ReplicationError::CopyFailed {
                entry_id: -1,
                bookie: me.id.clone(),
                reason,
            })?;
        let key = master_key(&md.password);
        let mut copied = 0;
        for seg in copy_plan(&md, &lost)? {
            for c in &seg.entries {
                let have = target
                    .read(ledger_id, c.entry_id, None, crate::fair::AUTORECOVERY_KEY)
                    .await
                    .ok()
                    .filter(|r| read_status(r) == StatusCode::Ok)
                    .is_some_and(|r| Entry::decode_expected(r.body, ledger_id, c.entry_id).is_ok());
                if have {
                    continue;
                }
                let body = self
                    .read_verified(ledger_id, c.entry_id, &c.sources, &bookies)
                    .await?;
                let len = body.len() as u64;
                self.throttle.admit(len).await;
                let st = target
                    .add(ledger_id, c.entry_id, key.clone(), true, body)
                    .await
                    .map_err(|e| ReplicationError::CopyFailed {
                        entry_id: c.entry_id,
                        bookie: me.id.clone(),
                        reason: e.to_string(),
                    })?;
                if st != StatusCode::Ok {
                    return Err(ReplicationError::CopyFailed {
                        entry_id: c.entry_id,
                        bookie: me.id.clone(),
                        reason: format!("{st:?}"),
                    });
                }
                self.metrics.entries_copied.inc();
                self.metrics.bytes_copied.inc_by(len);
                copied += 1;
            }
        }
        Ok(copied)
    }

    /// Copies one segment's entries to a replacement, then swaps it in.
    async fn restore_segment(
        &mut self,
        ledger_id: u64,
        md: &LedgerMetadata,
        seg: &SegmentCopy,
        bookies: &[BookieInfo],
    ) -> Result<u64, ReplicationError> {
        let chosen: Vec<Replacement> = {
            let mut rng = rand::rng();
            choose_replacements(
                bookies,
                &seg.ensemble,
                std::slice::from_ref(&seg.lost),
                &BTreeSet::new(),
                &mut rng,
            )
        };
        let Some(rep) = chosen.into_iter().next() else {
            return Err(ReplicationError::NoReplacement(seg.lost.clone()));
        };
        let Some(target_info) = bookies.iter().find(|b| b.id == rep.new).cloned() else {
            return Err(ReplicationError::NoReplacement(seg.lost.clone()));
        };
        info!(ledger = ledger_id, segment = seg.first_entry_id, lost = %seg.lost, replacement = %rep.new,
            entries = seg.entries.len(), "copying segment");
        let target =
            self.conn(&target_info)
                .await
                .map_err(|reason| ReplicationError::CopyFailed {
                    entry_id: seg.entries.first().map_or(-1, |e| e.entry_id),
                    bookie: rep.new.clone(),
                    reason,
                })?;
        let key = master_key(&md.password);
        // Connections to every surviving replica of the segment, made once.
        let mut sources: HashMap<BookieId, BookieClient> = HashMap::new();
        for b in seg.ensemble.iter().filter(|b| **b != seg.lost) {
            if let Some(info) = bookies.iter().find(|x| &x.id == b).cloned()
                && let Ok(c) = self.conn(&info).await
            {
                sources.insert(b.clone(), c);
            }
        }
        let sources = Arc::new(sources);
        let mut in_flight = FuturesUnordered::new();
        let mut next = seg.entries.iter();
        loop {
            while in_flight.len() < COPIES_IN_FLIGHT_MAX {
                let Some(c) = next.next() else { break };
                self.throttle.admit(0).await;
                in_flight.push(copy_entry(
                    sources.clone(),
                    c.sources.clone(),
                    target.clone(),
                    key.clone(),
                    ledger_id,
                    c.entry_id,
                ));
            }
            let Some(done) = in_flight.next().await else {
                break;
            };
            let bytes = done.map_err(|e| match e {
                ReplicationError::CopyFailed {
                    entry_id, reason, ..
                } => ReplicationError::CopyFailed {
                    entry_id,
                    bookie: rep.new.clone(),
                    reason,
                },
                other => other,
            })?;
            self.throttle.charge_bytes(bytes);
            self.metrics.entries_copied.inc();
            self.metrics.bytes_copied.inc_by(bytes);
        }
        self.swap(ledger_id, seg.first_entry_id, &seg.lost, &rep.new)
            .await?;
        info!(ledger = ledger_id, segment = seg.first_entry_id, lost = %seg.lost, replacement = %rep.new, "segment restored");
        Ok(seg.entries.len() as u64)
    }

    /// Reads entry `entry_id` from the first source that returns it with a
    /// good digest.
    async fn read_verified(
        &mut self,
        ledger_id: u64,
        entry_id: i64,
        sources: &[BookieId],
        bookies: &[BookieInfo],
    ) -> Result<Bytes, ReplicationError> {
        for s in sources {
            let Some(info) = bookies.iter().find(|b| &b.id == s).cloned() else {
                continue;
            };
            let Ok(c) = self.conn(&info).await else {
                continue;
            };
            match c
                .read(ledger_id, entry_id, None, crate::fair::AUTORECOVERY_KEY)
                .await
            {
                Ok(r) if read_status(&r) == StatusCode::Ok => {
                    match Entry::decode_expected(r.body.clone(), ledger_id, entry_id) {
                        Ok(_) => return Ok(r.body),
                        Err(e) => {
                            warn!(ledger = ledger_id, entry = entry_id, bookie = %s, error = %e, "bad replica")
                        }
                    }
                }
                Ok(r) => {
                    debug!(ledger = ledger_id, entry = entry_id, bookie = %s, status = ?read_status(&r), "read refused")
                }
                Err(e) => {
                    debug!(ledger = ledger_id, entry = entry_id, bookie = %s, error = %e, "read failed")
                }
            }
        }
        Err(ReplicationError::Unreadable { entry_id })
    }

    /// CASes `new` in place of `old` in the segment at `first_entry_id`.
    async fn swap(
        &self,
        ledger_id: u64,
        first_entry_id: i64,
        old: &str,
        new: &str,
    ) -> Result<(), ReplicationError> {
        let path = self.layout.ledger(ledger_id);
        for _ in 0..20 {
            let (data, stat) = self.store.get(&path).await?;
            let md = LedgerMetadata::decode(data.as_slice())
                .map_err(|e| ReplicationError::Swap(e.to_string()))?;
            let Some(next) = plan::replace_in_segment(&md, first_entry_id, old, new)
                .map_err(|e| ReplicationError::Swap(e.to_string()))?
            else {
                return Ok(());
            };
            match self
                .store
                .set(
                    &path,
                    &next.encode_to_vec(),
                    Expected::Version(stat.version),
                )
                .await
            {
                Ok(_) => return Ok(()),
                Err(MetadataError::BadVersion { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(ReplicationError::Swap("too many version conflicts".into()))
    }
}

/// Why a decommission cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecommissionError {
    /// The bookie is still registered: stop it first.
    #[error("bookie {0} is still registered (available or read-only): stop it first")]
    StillRegistered(BookieId),
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Metadata(#[from] MetadataError),
}

/// One step of decommissioning a stopped `bookie`: marks every ledger that
/// still names it under-replicated (without waiting for the auditor's grace)
/// and returns those ledgers' ids. Empty: the bookie holds no needed replica.
pub async fn decommission_step(
    store: &dyn MetadataStore,
    layout: &Layout,
    bookie: &str,
) -> Result<Vec<u64>, DecommissionError> {
    if live_bookies(store, layout).await?.contains(bookie) {
        return Err(DecommissionError::StillRegistered(bookie.to_string()));
    }
    let lost: BTreeSet<BookieId> = [bookie.to_string()].into();
    let ledgers = all_ledgers(store, layout).await?;
    let mut out = Vec::new();
    for (id, bookies) in ledgers_to_mark(&ledgers, &lost) {
        mark_underreplicated(store, layout, id, &bookies).await?;
        out.push(id);
    }
    Ok(out)
}

/// Which of its entries one replica of one segment holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaPresence {
    /// The bookie.
    pub bookie: BookieId,
    /// False when it is not registered or not reachable.
    pub reachable: bool,
    /// Entries its write sets give it in the segment.
    pub expected: u64,
    /// Of those, entries it returned (status OK; the digest is not checked).
    pub present: u64,
    /// The first entries it lacks (at most 10).
    pub missing: Vec<i64>,
}

/// Per-replica presence of one segment's entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentPresence {
    /// The segment's first entry.
    pub first_entry_id: i64,
    /// Its last entry (below the first when empty).
    pub last_entry_id: i64,
    /// One row per ensemble bookie, in ensemble order.
    pub replicas: Vec<ReplicaPresence>,
}

/// Asks every replica of every segment of `md` for each entry it should hold
/// up to `last_entry_id`.
pub async fn replica_presence(
    client: &LedgerClient,
    md: &LedgerMetadata,
    last_entry_id: i64,
) -> Result<Vec<SegmentPresence>, ReplicationError> {
    let spec = crate::client::metadata::quorum_spec(md)
        .map_err(|e| ReplicationError::Swap(e.to_string()))?;
    let bookies = client.bookies();
    let mut conns: HashMap<BookieId, Option<BookieClient>> = HashMap::new();
    let mut out = Vec::new();
    for (i, seg) in md.segments.iter().enumerate() {
        let end = md
            .segments
            .get(i + 1)
            .map_or(last_entry_id, |n| n.first_entry_id - 1)
            .min(last_entry_id);
        let mut replicas = Vec::new();
        for (slot, b) in seg.ensemble.iter().enumerate() {
            if !conns.contains_key(b) {
                let c = match bookies.iter().find(|x| &x.id == b) {
                    Some(info) => BookieClient::connect(
                        &info.id,
                        info.incarnation,
                        &info.endpoint,
                        ClientOptions {
                            connect_timeout_ms: 2_000,
                            request_timeout_ms: 5_000,
                            add_queue_max: 16,
                        },
                    )
                    .await
                    .ok(),
                    None => None,
                };
                conns.insert(b.clone(), c);
            }
            let conn = conns.get(b).cloned().flatten();
            let mut row = ReplicaPresence {
                bookie: b.clone(),
                reachable: conn.is_some(),
                expected: 0,
                present: 0,
                missing: Vec::new(),
            };
            let mut e = seg.first_entry_id;
            while e <= end {
                if spec.in_write_set(e, slot) {
                    row.expected += 1;
                    let ok = match &conn {
                        Some(c) => c
                            .read(md.ledger_id, e, None, crate::fair::AUTORECOVERY_KEY)
                            .await
                            .is_ok_and(|r| read_status(&r) == StatusCode::Ok),
                        None => false,
                    };
                    if ok {
                        row.present += 1;
                    } else if row.missing.len() < 10 {
                        row.missing.push(e);
                    }
                }
                e += 1;
            }
            replicas.push(row);
        }
        out.push(SegmentPresence {
            first_entry_id: seg.first_entry_id,
            last_entry_id: end,
            replicas,
        });
    }
    Ok(out)
}

/// A human-readable report of a ledger: metadata and per-replica presence
/// (what `cms-bookie ledger <id>` prints).
pub async fn describe_ledger(
    client: &LedgerClient,
    ledger_id: u64,
) -> Result<String, ReplicationError> {
    use std::fmt::Write as _;
    let md = client.ledger_metadata(ledger_id).await?;
    let st = status(&md).map_or_else(|e| e.to_string(), |s| format!("{s:?}"));
    let last = if status(&md).is_ok_and(|s| s == LedgerStatus::LedgerClosed) {
        md.last_entry_id
    } else {
        let r = client.open_ledger(ledger_id, false).await?;
        r.read_lac().await.unwrap_or(-1)
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ledger {ledger_id}: {st}, last entry {} (probed to {last}), length {} bytes, E={} Qw={} Qa={}",
        md.last_entry_id, md.length, md.ensemble_size, md.write_quorum, md.ack_quorum
    );
    for seg in replica_presence(client, &md, last).await? {
        let _ = writeln!(
            out,
            "segment from entry {} to {}:",
            seg.first_entry_id, seg.last_entry_id
        );
        for r in seg.replicas {
            let state = if !r.reachable {
                "UNAVAILABLE".to_string()
            } else if r.present == r.expected {
                "complete".to_string()
            } else {
                format!("MISSING (first: {:?})", r.missing)
            };
            let _ = writeln!(
                out,
                "  {}: {}/{} entries, {state}",
                r.bookie, r.present, r.expected
            );
        }
    }
    Ok(out)
}

/// Entry copies of one segment in flight at once (reads and RECOVERY_ADDs
/// pipelined, so the replacement's group commit batches them).
pub const COPIES_IN_FLIGHT_MAX: usize = 64;

/// Reads `entry_id` from the first of `order` (among `conns`) that returns it
/// with a good digest, and writes it to `target` with RECOVERY_ADD; the
/// entry's byte size on success.
async fn copy_entry(
    conns: Arc<HashMap<BookieId, BookieClient>>,
    order: Vec<BookieId>,
    target: BookieClient,
    key: Bytes,
    ledger_id: u64,
    entry_id: i64,
) -> Result<u64, ReplicationError> {
    let mut body = None;
    for s in &order {
        let Some(c) = conns.get(s) else { continue };
        match c
            .read(ledger_id, entry_id, None, crate::fair::AUTORECOVERY_KEY)
            .await
        {
            Ok(r) if read_status(&r) == StatusCode::Ok => {
                match Entry::decode_expected(r.body.clone(), ledger_id, entry_id) {
                    Ok(_) => {
                        body = Some(r.body);
                        break;
                    }
                    Err(e) => {
                        warn!(ledger = ledger_id, entry = entry_id, bookie = %s, error = %e, "bad replica")
                    }
                }
            }
            Ok(r) => {
                debug!(ledger = ledger_id, entry = entry_id, bookie = %s, status = ?read_status(&r), "read refused")
            }
            Err(e) => {
                debug!(ledger = ledger_id, entry = entry_id, bookie = %s, error = %e, "read failed")
            }
        }
    }
    let Some(body) = body else {
        return Err(ReplicationError::Unreadable { entry_id });
    };
    let len = body.len() as u64;
    let fail = |reason: String| ReplicationError::CopyFailed {
        entry_id,
        bookie: target.bookie_id().to_string(),
        reason,
    };
    match target.add(ledger_id, entry_id, key, true, body).await {
        Ok(StatusCode::Ok) => Ok(len),
        Ok(st) => Err(fail(format!("{st:?}"))),
        Err(e) => Err(fail(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is the test failing")]

    use super::*;

    #[test]
    fn the_throttle_delays_to_the_slower_of_its_two_bounds() {
        let mut t = Throttle::new(100, 1_000);
        t.entries = 10;
        t.bytes = 100;
        // 10 entries at 100/s = 100 ms; 100 bytes at 1000/s = 100 ms.
        assert_eq!(t.delay(Duration::ZERO), Duration::from_millis(100));
        t.bytes = 500;
        assert_eq!(
            t.delay(Duration::from_millis(200)),
            Duration::from_millis(300)
        );
        assert_eq!(t.delay(Duration::from_secs(1)), Duration::ZERO);
        // Idle time banks at most THROTTLE_BURST_MS of credit.
        let mut idle = Throttle::new(10, 0);
        idle.start = Instant::now() - Duration::from_secs(5);
        idle.entries = 1;
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(idle.admit(0));
        assert_eq!(idle.entries, 1, "the idle bank was reset");
        assert!(
            idle.start.elapsed() < Duration::from_secs(1),
            "the bank restarted now"
        );
        let u = Throttle {
            entries: 1_000_000,
            bytes: 1 << 40,
            ..Throttle::new(0, 0)
        };
        assert_eq!(u.delay(Duration::ZERO), Duration::ZERO);
    }
}
