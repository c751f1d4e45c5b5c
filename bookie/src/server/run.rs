//! The bookie's lifecycle: start (cookies, storage, journal replay, limbo,
//! servers, registration), background work (checkpoints, disk watch, GC, the
//! integrity check of limbo ledgers, and with `--autorecovery` the auditor
//! and re-replication worker) and a draining shutdown.
//!
//! Start order matters: the cookie check runs before any data file is opened;
//! the journal is replayed into ledger storage before any request is served;
//! limbo ledgers are journalled (and fenced) before the bookie registers; the
//! gRPC port answers only after all of that.
//!
//! Checkpoints run every `checkpoint_interval_ms` (writes spread over a
//! quarter of it), at once when adds wait for room in the write cache, and
//! after every journal rotation (so finished journal files are recycled rather
//! than new ones filled with zeros under a sustained load).
//!
//! Shutdown (SIGTERM): stop taking adds, deregister, finish in-flight
//! requests, checkpoint (flush storage, persist the journal mark), close the
//! journal and storage, write the clean-shutdown marker, exit 0.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::config::BookieConfig;
use super::cookie::{BookieDirs, check_cookies};
use super::core::{BookieCore, BookieMode, apply_replayed};
use super::grpc::{BookieService, DiskProbe, GRPC_MESSAGE_BYTES_MAX};
use super::http::{HttpState, router};
use super::metrics::ServerMetrics;
use super::registration::Registrar;
use crate::fs::{FaultyFs, RealFs, SharedFs};
use crate::journal::{Journal, JournalMetrics, SyncPolicy};
use crate::metadata::connect::{MetadataUrl, connect};
use crate::metadata::layout::Layout;
use crate::metadata::{MetadataError, MetadataStore};
use crate::proto::bookie::bookie_server::BookieServer;
use crate::proto::metadata::{BookieRegistration, LedgerMetadata, LedgerStatus};
use crate::storage::{LedgerStorage, StorageMetrics};

/// Marker file in the ledger directory written at the end of a clean shutdown.
pub const CLEAN_SHUTDOWN_FILE: &str = "CLEAN_SHUTDOWN";
/// Marker file in the ledger directory: the limbo scan of this incarnation is done.
pub const LIMBO_SCANNED_FILE: &str = "LIMBO_SCANNED";

/// Why the bookie could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A configuration value cannot work.
    #[error(transparent)]
    Config(#[from] super::config::InvalidConfig),
    /// The cookie check refused the directories.
    #[error(transparent)]
    Cookie(#[from] super::cookie::CookieError),
    /// Metadata store failure.
    #[error("metadata store: {0}")]
    Metadata(String),
    /// Journal failure (open, replay, corruption).
    #[error("journal: {0}")]
    Journal(String),
    /// Ledger storage failure.
    #[error("ledger storage: {0}")]
    Storage(String),
    /// Network or other I/O failure.
    #[error("{0}")]
    Io(String),
}

fn md(e: impl std::fmt::Display) -> ServerError {
    ServerError::Metadata(e.to_string())
}

/// Ports actually bound (useful with port 0).
#[derive(Debug, Clone)]
pub struct BoundPorts {
    /// gRPC address.
    pub grpc: std::net::SocketAddr,
    /// HTTP address.
    pub http: std::net::SocketAddr,
}

/// Runs a bookie until `shutdown` resolves, then drains and returns.
pub async fn run(
    cfg: BookieConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    cfg.validate()?;
    let url: MetadataUrl = cfg.metadata_url.parse().map_err(|reason: String| {
        ServerError::Config(super::config::InvalidConfig {
            key: "metadata_url".into(),
            reason,
        })
    })?;
    let layout = Layout::new(&cfg.metadata_root).map_err(md)?;
    let grpc_listener = TcpListener::bind(cfg.grpc_addr()?)
        .await
        .map_err(|e| ServerError::Io(format!("binding gRPC {}: {e}", cfg.grpc_bind)))?;
    let http_listener = TcpListener::bind(cfg.http_addr()?)
        .await
        .map_err(|e| ServerError::Io(format!("binding HTTP {}: {e}", cfg.http_bind)))?;
    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(|e| ServerError::Io(e.to_string()))?;
    let http_addr = http_listener
        .local_addr()
        .map_err(|e| ServerError::Io(e.to_string()))?;
    let host = cfg.advertised_host(grpc_addr);
    let bookie_id = cfg.bookie_id(&host, grpc_addr.port());
    let span = tracing::info_span!("bookie", bookie = %bookie_id);
    let _enter = span.enter();

    let opts = cfg.zk_options();
    let store = connect(&url, &opts).await.map_err(md)?;
    let dirs = BookieDirs {
        journal_dir: cfg.journal_dir_abs(),
        ledger_dirs: vec![cfg.ledger_dir_abs()],
    };
    let cookie = check_cookies(store.as_ref(), &layout, &bookie_id, &dirs).await?;
    let incarnation = cookie.cookie.incarnation;
    info!(incarnation, created = cookie.created, "cookie check passed");

    // Was the previous stop clean? Read and remove the marker before opening.
    let ledger_dir = cfg.ledger_dir_abs();
    let clean_marker = ledger_dir.join(CLEAN_SHUTDOWN_FILE);
    let was_clean = clean_marker.exists();
    if was_clean {
        std::fs::remove_file(&clean_marker)
            .map_err(|e| ServerError::Io(format!("removing {}: {e}", clean_marker.display())))?;
        sync_dir(&ledger_dir)?;
    }

    let faults = cfg.fault_injection.then(FaultyFs::new);
    let fs: SharedFs = match &faults {
        Some(f) => {
            warn!("TEST MODE: storage runs on the fault-injecting file system");
            Arc::new(f.clone())
        }
        None => Arc::new(RealFs),
    };
    let registry = prometheus::Registry::new();
    let storage = Arc::new(
        LedgerStorage::open(
            fs.clone(),
            cfg.storage(),
            StorageMetrics::new(&registry).map_err(|e| ServerError::Storage(e.to_string()))?,
        )
        .map_err(|e| ServerError::Storage(e.to_string()))?,
    );
    let mut replayed = 0u64;
    let journal = {
        let storage = storage.clone();
        Journal::open(
            fs.clone(),
            cfg.journal(),
            JournalMetrics::new(&registry).map_err(|e| ServerError::Journal(e.to_string()))?,
            &mut |rec| {
                replayed += 1;
                apply_replayed(&storage, rec)
            },
        )
        .map_err(|e| ServerError::Journal(e.to_string()))?
    };
    info!(records = replayed, "journal replayed");
    let metrics = ServerMetrics::new(&registry).map_err(|e| ServerError::Io(e.to_string()))?;
    let ar_metrics = crate::autorecovery::AutorecoveryMetrics::new(&registry)
        .map_err(|e| ServerError::Io(e.to_string()))?;
    let core = Arc::new(BookieCore::new(
        journal,
        storage.clone(),
        cfg.core_limits(),
        metrics,
    ));

    // Limbo (DESIGN §4.3): only a bookie that may have lost acknowledged data.
    let limbo_marker = ledger_dir.join(format!("{LIMBO_SCANNED_FILE}-{incarnation}"));
    let new_incarnation = incarnation > 1 && !limbo_marker.exists();
    let relaxed_unclean =
        cfg.sync_policy == SyncPolicy::RelaxedAckBeforeFsync && !was_clean && !cookie.created;
    if new_incarnation || relaxed_unclean {
        let n = limbo_scan(store.as_ref(), &layout, &bookie_id, &core).await?;
        warn!(
            ledgers = n,
            new_incarnation, relaxed_unclean, "ledgers naming this bookie put in limbo"
        );
    }
    if !limbo_marker.exists() {
        std::fs::write(&limbo_marker, b"")
            .map_err(|e| ServerError::Io(format!("writing {}: {e}", limbo_marker.display())))?;
        sync_dir(&ledger_dir)?;
    }

    // Servers.
    let disk = DiskProbe::new(fs.clone(), ledger_dir.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let service = BookieService::new(
        core.clone(),
        bookie_id.clone(),
        incarnation,
        cfg.grpc_limits(),
        crate::fair::FairMetrics::new(&registry, "cms_bookie_read_sched")
            .map_err(|e| ServerError::Io(e.to_string()))?,
        disk.clone(),
        stop_rx.clone(),
    );
    let grpc_stop = wait_true(stop_rx.clone());
    let incoming = grpc_incoming(grpc_listener);
    let grpc = tokio::spawn(
        tonic::transport::Server::builder()
            .timeout(Duration::from_millis(cfg.request_timeout_ms))
            .initial_stream_window_size(crate::bookie_client::HTTP2_WINDOW_BYTES)
            .initial_connection_window_size(crate::bookie_client::HTTP2_WINDOW_BYTES)
            .add_service(
                BookieServer::new(service)
                    .max_decoding_message_size(GRPC_MESSAGE_BYTES_MAX)
                    .max_encoding_message_size(GRPC_MESSAGE_BYTES_MAX),
            )
            .serve_with_incoming_shutdown(incoming, grpc_stop),
    );
    let registrar = Arc::new(Registrar::new(
        store.clone(),
        url.clone(),
        opts.clone(),
        layout.clone(),
        BookieRegistration {
            bookie_id: bookie_id.clone(),
            incarnation,
            endpoint: format!("{host}:{}", grpc_addr.port()),
            http_endpoint: format!("{host}:{}", http_addr.port()),
            rack: cfg.rack.clone(),
            total_bytes: 0,
            free_bytes: 0,
            writable: true,
        },
    ));
    let http_state = HttpState {
        core: core.clone(),
        registered: registrar.registered_flag(),
        registry: registry.clone(),
        faults: faults.clone(),
    };
    let http_stop = wait_true(stop_rx.clone());
    let http = tokio::spawn(async move {
        axum::serve(http_listener, router(http_state))
            .with_graceful_shutdown(http_stop)
            .await
    });

    // Register, then keep registered and watch the disk.
    let space = {
        let disk = disk.clone();
        move || {
            disk.space()
                .map(|s| (s.total_bytes, s.available_bytes))
                .unwrap_or((0, 0))
        }
    };
    check_disk(&cfg, &core, &disk);
    let (total, free) = space();
    registrar
        .register(core.mode() == BookieMode::Writable, total, free)
        .await
        .map_err(md)?;
    info!(grpc = %grpc_addr, http = %http_addr, "bookie serving");

    let mut tasks = Vec::new();
    tasks.push(tokio::spawn({
        let registrar = registrar.clone();
        let core = core.clone();
        let space = space.clone();
        async move {
            let writable = || core.mode() == BookieMode::Writable;
            registrar.keep_registered(writable, space).await;
        }
    }));
    tasks.push(tokio::spawn(disk_loop(
        cfg.clone(),
        core.clone(),
        disk.clone(),
        registrar.clone(),
        stop_rx.clone(),
    )));
    tasks.push(tokio::spawn(super::metrics::run_lag_probe(
        core.metrics().runtime_lag.clone(),
        stop_rx.clone(),
    )));
    tasks.push(tokio::spawn(checkpoint_loop(
        Duration::from_millis(cfg.checkpoint_interval_ms.max(1)),
        core.clone(),
        stop_rx.clone(),
    )));
    tasks.push(tokio::spawn(gc_loop(
        cfg.clone(),
        core.clone(),
        registrar.clone(),
        layout.clone(),
        stop_rx.clone(),
    )));

    // Integrity check (DESIGN §4.3): ledgers in limbo leave it once this
    // bookie holds again every entry it should.
    tasks.push(tokio::spawn(integrity_loop(
        cfg.clone(),
        core.clone(),
        registrar.clone(),
        layout.clone(),
        crate::client::driver::placement::BookieInfo {
            id: bookie_id.clone(),
            endpoint: format!("{host}:{}", grpc_addr.port()),
            incarnation,
            rack: cfg.rack.clone(),
            writable: true,
        },
        ar_metrics.clone(),
        stop_rx.clone(),
    )));
    if cfg.autorecovery {
        let ar_store = connect(&url, &opts).await.map_err(md)?;
        let ar = cfg.autorecovery_config(&bookie_id);
        let (ar_layout, ar_stop) = (layout.clone(), stop_rx.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) =
                crate::autorecovery::run_standalone(ar_store, ar_layout, ar, ar_metrics, ar_stop)
                    .await
            {
                error!(error = %e, "autorecovery stopped");
            }
        }));
    }

    shutdown.await;
    info!("shutting down: draining");
    core.set_mode(BookieMode::Draining);
    // A paced checkpoint running now finishes at full speed.
    core.storage().hurry_flush();
    registrar.deregister().await;
    let _ = stop_tx.send(true);
    // In-flight requests finish (long polls are bounded by long_poll_ms_max);
    // past the drain bound the servers are dropped.
    let drain = Duration::from_millis(cfg.long_poll_ms_max + 2_000);
    match tokio::time::timeout(drain, grpc).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => warn!(error = %e, "gRPC server ended with an error"),
        Ok(Err(e)) => warn!(error = %e, "gRPC server task failed"),
        Err(_) => warn!(
            drain_ms = drain.as_millis() as u64,
            "gRPC connections still open after the drain bound"
        ),
    }
    let _ = tokio::time::timeout(drain, http).await;
    for t in tasks {
        t.abort();
    }
    let mut clean = true;
    if let Err(e) = checkpoint(&core) {
        error!(error = %e, "final checkpoint failed");
        clean = false;
    }
    if let Err(e) = core.journal().close() {
        error!(error = %e, "closing the journal failed");
        clean = false;
    }
    if let Err(e) = storage.close() {
        error!(error = %e, "closing ledger storage failed");
        clean = false;
    }
    if clean && !core.journal().is_failed() {
        std::fs::write(&clean_marker, b"")
            .map_err(|e| ServerError::Io(format!("writing {}: {e}", clean_marker.display())))?;
        sync_dir(&ledger_dir)?;
    }
    registrar.store().await.close().await;
    info!("bookie stopped");
    Ok(())
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

fn sync_dir(dir: &Path) -> Result<(), ServerError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ServerError::Io(format!("syncing {}: {e}", dir.display())))
}

/// One checkpoint: take the journal's synced mark, flush ledger storage, then
/// let the journal persist the mark and recycle older files.
pub fn checkpoint(core: &BookieCore) -> Result<(), String> {
    checkpoint_spread(core, None)
}

/// A checkpoint whose storage flush is spread over about `spread`
/// ([`crate::storage::LedgerStorage::flush_spread`]) when given.
fn checkpoint_spread(core: &BookieCore, spread: Option<Duration>) -> Result<(), String> {
    let mark = core.journal().synced_mark();
    match spread {
        Some(over) => core.storage().flush_spread(over),
        None => core.storage().flush(),
    }
    .map_err(|e| e.to_string())?;
    core.journal()
        .checkpoint_complete(mark)
        .map_err(|e| e.to_string())
}

async fn checkpoint_loop(every: Duration, core: Arc<BookieCore>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut last_rotation = Instant::now();
    loop {
        // A periodic checkpoint spreads its writes over a quarter of the
        // period (it has the whole period); one that adds wait for (a full
        // write cache) goes at once; one after a journal rotation (so the
        // finished file is recycled before the preallocator, half way through
        // the new file, would fill one with zeros) spreads over a quarter of
        // the time the finished file took, at most a quarter period.
        let spread = tokio::select! {
            _ = tick.tick() => Some(every / 4),
            _ = core.flush_wanted() => None,
            _ = core.journal().rotated() => {
                let file_took = std::mem::replace(&mut last_rotation, Instant::now()).elapsed();
                Some(rotation_spread(every, file_took))
            }
            _ = stop.wait_for(|v| *v) => return,
        };
        let c = core.clone();
        let started = Instant::now();
        match tokio::task::spawn_blocking(move || checkpoint_spread(&c, spread)).await {
            Ok(Ok(())) => {
                core.checkpoint_done();
                tracing::debug!(took_ms = started.elapsed().as_millis() as u64, "checkpoint");
            }
            Ok(Err(e)) => error!(error = %e, "checkpoint failed"),
            Err(e) => error!(error = %e, "checkpoint task failed"),
        }
    }
}

/// How long a checkpoint after a journal rotation spreads its writes: a
/// quarter of the time the finished file took to fill, at most a quarter of
/// the checkpoint period.
fn rotation_spread(every: Duration, file_took: Duration) -> Duration {
    (file_took / 4).min(every / 4)
}

/// Updates the mode from the disk use (with hysteresis); returns the mode.
fn check_disk(cfg: &BookieConfig, core: &BookieCore, disk: &DiskProbe) -> BookieMode {
    match disk.space() {
        Ok(space) => {
            let used = space.used_fraction();
            core.metrics()
                .disk_total_bytes
                .set(space.total_bytes as i64);
            core.metrics()
                .disk_used_bytes
                .set(space.total_bytes.saturating_sub(space.available_bytes) as i64);
            let low_space = space.available_bytes < cfg.reserved_bytes;
            match core.mode() {
                BookieMode::Writable
                    if low_space
                        && core.transition(BookieMode::Writable, BookieMode::ReadOnlyDisk) =>
                {
                    warn!(
                        available = space.available_bytes,
                        reserved = cfg.reserved_bytes,
                        "free space below the compaction reserve: turning read-only"
                    );
                }
                BookieMode::Writable
                    if used >= cfg.disk_usage_threshold
                        && core.transition(BookieMode::Writable, BookieMode::ReadOnlyDisk) =>
                {
                    warn!(
                        used,
                        threshold = cfg.disk_usage_threshold,
                        "disk full: turning read-only"
                    );
                }
                BookieMode::ReadOnlyDisk
                    if used < cfg.disk_usage_lwm
                        && !low_space
                        && core.transition(BookieMode::ReadOnlyDisk, BookieMode::Writable) =>
                {
                    info!(
                        used,
                        lwm = cfg.disk_usage_lwm,
                        "disk below the low-water mark: writable again"
                    );
                }
                _ => {}
            }
        }
        Err(e) => warn!(error = %e, "disk check failed"),
    }
    core.mode()
}

async fn disk_loop(
    cfg: BookieConfig,
    core: Arc<BookieCore>,
    disk: DiskProbe,
    registrar: Arc<Registrar>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.disk_check_interval_ms.max(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut registered_writable = core.mode() == BookieMode::Writable;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        let mode = check_disk(&cfg, &core, &disk);
        if mode == BookieMode::Draining {
            return;
        }
        let writable = mode == BookieMode::Writable;
        if writable != registered_writable {
            let (total, free) = disk
                .space()
                .map(|s| (s.total_bytes, s.available_bytes))
                .unwrap_or((0, 0));
            match registrar.register(writable, total, free).await {
                Ok(()) => registered_writable = writable,
                Err(e) => warn!(error = %e, "moving the registration failed; retrying"),
            }
        }
    }
}

/// Ledgers this bookie holds in limbo.
fn limbo_ledgers(core: &BookieCore) -> Vec<u64> {
    let ids = match core.storage().ledger_ids() {
        Ok(ids) => ids,
        Err(e) => {
            warn!(error = %e, "integrity check: listing ledgers failed");
            return Vec::new();
        }
    };
    ids.into_iter()
        .filter(|id| {
            core.storage()
                .ledger_state(*id)
                .ok()
                .flatten()
                .is_some_and(|s| s.limbo)
        })
        .collect()
}

/// Restores every ledger in limbo from its other replicas, ledger by ledger,
/// and takes each out of limbo when done; failures are retried every
/// `autorecovery_interval_ms`.
async fn integrity_loop(
    cfg: BookieConfig,
    core: Arc<BookieCore>,
    registrar: Arc<Registrar>,
    layout: Layout,
    me: crate::client::driver::placement::BookieInfo,
    metrics: crate::autorecovery::AutorecoveryMetrics,
    mut stop: watch::Receiver<bool>,
) {
    let mut pending = limbo_ledgers(&core);
    if pending.is_empty() {
        return;
    }
    info!(ledgers = pending.len(), "integrity check starting");
    let store = registrar.store().await;
    let client = loop {
        match crate::client::driver::LedgerClient::connect(
            store.clone(),
            layout.clone(),
            crate::client::driver::LedgerClientOptions::default(),
        )
        .await
        {
            Ok(c) => break c,
            Err(e) => warn!(error = %e, "integrity check: ledger client"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(cfg.autorecovery_interval_ms.max(10))) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
    };
    let mut worker =
        crate::autorecovery::Worker::new(store, layout, client, cfg.autorecovery_config(&me.id))
            .with_metrics(metrics);
    while !pending.is_empty() {
        let mut left = Vec::new();
        for id in pending {
            match worker.restore_own(&me, id).await {
                Ok(copied) => {
                    let s = core.set_limbo(id, false, false).await;
                    if s == crate::proto::bookie::StatusCode::Ok {
                        info!(
                            ledger = id,
                            copied, "integrity check: ledger restored, out of limbo"
                        );
                    } else {
                        warn!(ledger = id, status = ?s, "integrity check: leaving limbo failed");
                        left.push(id);
                    }
                }
                Err(e) => {
                    warn!(ledger = id, error = %e, "integrity check: ledger not restored yet");
                    left.push(id);
                }
            }
        }
        pending = left;
        if pending.is_empty() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(cfg.autorecovery_interval_ms.max(10))) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
    }
    info!("integrity check done: no ledger in limbo");
}

/// Lists every ledger whose metadata names `bookie_id` in a segment, and puts
/// each in limbo (fenced unless closed). Returns how many.
async fn limbo_scan(
    store: &dyn MetadataStore,
    layout: &Layout,
    bookie_id: &str,
    core: &BookieCore,
) -> Result<usize, ServerError> {
    let mut n = 0;
    let mut stack = vec![(layout.ledgers(), 0usize)];
    while let Some((path, depth)) = stack.pop() {
        if depth == 5 {
            let Some(id) = layout.ledger_id_of(&path) else {
                continue;
            };
            let data = match store.get(&path).await {
                Ok((d, _)) => d,
                Err(MetadataError::NoNode(_)) => continue,
                Err(e) => return Err(md(e)),
            };
            let meta = LedgerMetadata::decode(data.as_slice())
                .map_err(|e| ServerError::Metadata(format!("ledger {id} metadata: {e}")))?;
            let names_us = meta
                .segments
                .iter()
                .any(|s| s.ensemble.iter().any(|b| b == bookie_id));
            if names_us {
                let closed = meta.status == LedgerStatus::LedgerClosed as i32;
                let s = core.set_limbo(id, true, !closed).await;
                if s != crate::proto::bookie::StatusCode::Ok {
                    return Err(ServerError::Journal(format!(
                        "journalling limbo of ledger {id}: {}",
                        s.as_str_name()
                    )));
                }
                n += 1;
            }
            continue;
        }
        let children = match store.children(&path).await {
            Ok(c) => c,
            Err(MetadataError::NoNode(_)) => continue,
            Err(e) => return Err(md(e)),
        };
        for c in children {
            if depth == 0 && c == "idgen" {
                continue;
            }
            stack.push((crate::metadata::join(&path, &c), depth + 1));
        }
    }
    Ok(n)
}

/// Periodic GC: a ledger's data is deleted only after a `get` of its metadata
/// node answered NoNode in every pass over at least `gc_grace_ms` (never on a
/// listing, an error or a timeout); then entry logs are reclaimed.
async fn gc_loop(
    cfg: BookieConfig,
    core: Arc<BookieCore>,
    registrar: Arc<Registrar>,
    layout: Layout,
    mut stop: watch::Receiver<bool>,
) {
    let mut missing_since: HashMap<u64, Instant> = HashMap::new();
    let grace = Duration::from_millis(cfg.gc_grace_ms);
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.gc_interval_ms.max(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        let ids = match core.storage().ledger_ids() {
            Ok(ids) => ids,
            Err(e) => {
                warn!(error = %e, "GC: listing ledgers failed");
                continue;
            }
        };
        let store = registrar.store().await;
        let mut seen_missing = HashMap::new();
        for id in ids {
            match store.get(&layout.ledger(id)).await {
                Err(MetadataError::NoNode(_)) => {
                    let since = missing_since.get(&id).copied().unwrap_or_else(Instant::now);
                    seen_missing.insert(id, since);
                }
                Ok(_) => {}
                Err(e) => {
                    // Unknown is not absent: keep every candidate as it was.
                    warn!(error = %e, "GC: metadata unavailable; pass abandoned");
                    seen_missing = missing_since.clone();
                    break;
                }
            }
        }
        missing_since = seen_missing;
        let due: Vec<u64> = missing_since
            .iter()
            .filter(|(_, since)| since.elapsed() >= grace)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            match core.storage().delete_ledger(id) {
                Ok(()) => {
                    core.forget(id);
                    missing_since.remove(&id);
                    info!(ledger = id, "GC: deleted a ledger whose metadata is gone");
                }
                Err(e) => warn!(ledger = id, error = %e, "GC: delete failed"),
            }
        }
        let c = core.clone();
        match tokio::task::spawn_blocking(move || c.storage().gc_and_compact()).await {
            Ok(Ok(bytes)) if bytes > 0 => info!(bytes, "GC: reclaimed entry-log space"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(error = %e, "GC: compaction failed"),
            Err(e) => warn!(error = %e, "GC task failed"),
        }
    }
}

/// Absolute paths of the bookie's directories (for tools and tests).
pub fn data_dirs(cfg: &BookieConfig) -> (PathBuf, PathBuf) {
    (cfg.journal_dir_abs(), cfg.ledger_dir_abs())
}

/// The gRPC server's accepted connections, with `TCP_NODELAY` set on each.
/// The server builder's `tcp_nodelay` is ignored by `serve_with_incoming*`;
/// without it, Nagle held a lone add's answer until the client's delayed ACK
/// (≈ 40 ms on Linux) whenever the connection was otherwise idle: a broker's
/// cursor-snapshot add once a second took 40 ms.
fn grpc_incoming(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    #[tokio::test]
    async fn accepted_grpc_connections_have_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = super::grpc_incoming(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.nodelay().unwrap());
    }

    #[test]
    fn a_rotation_checkpoint_spreads_over_a_quarter_of_the_file_time_at_most_a_quarter_period() {
        use std::time::Duration;
        let every = Duration::from_secs(10);
        // W3-like: a 64 MiB file in 1.6 s.
        assert_eq!(
            super::rotation_spread(every, Duration::from_millis(1600)),
            Duration::from_millis(400)
        );
        // A slow journal: the periodic checkpoint's spread.
        assert_eq!(
            super::rotation_spread(every, Duration::from_secs(60)),
            Duration::from_millis(2500)
        );
    }
}
