//! `cms-broker standalone`: the embedded metadata store, one in-process
//! bookie and the broker in one process, all data under `--data-dir`.
//!
//! Layout of the data directory:
//! - `metadata/metadata.redb` — the embedded metadata store (fsync per commit);
//! - `bookie/journal`, `bookie/ledgers` — the bookie's journal and ledger storage.
//!
//! Start: the store is opened and initialised (cluster, `public/default`;
//! idempotent), the bookie starts (fixed id [`STANDALONE_BOOKIE_ID`], gRPC and
//! HTTP on loopback ephemeral ports) and registers, then the broker serves
//! 6650 / 8080 with ledgers 1/1/1. Durability is the bookie's: an entry is
//! acknowledged once fsynced in its journal, so `kill -9` loses nothing
//! acknowledged. Shutdown (SIGTERM): the broker closes its topics (cursors
//! persisted) first, then the bookie drains and checkpoints.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Command, FromArgMatches};
use cms_bookie::fs::Fs;
use cms_bookie::metadata::MetadataStore;
use cms_bookie::metadata::connect::{MetadataUrl, connect};
use cms_bookie::metadata::layout::Layout;
use cms_bookie::metadata::{MetadataError, join};
use cms_bookie::server::BookieConfig;
use tokio::sync::oneshot;
use tracing::info;

use crate::config::{BrokerConfig, Mode};
use crate::service::{BoundAddrs, BrokerError};

/// Id of the in-process bookie (stable across restarts: its cookie and the
/// ledgers' ensembles name it).
pub const STANDALONE_BOOKIE_ID: &str = "standalone-bookie";

/// Longest wait for the in-process bookie to register, in milliseconds.
pub const BOOKIE_START_TIMEOUT_MS: u64 = 30_000;

/// The in-process bookie's configuration for `data_dir`.
pub fn bookie_config(
    config: &BrokerConfig,
    metadata_url: &str,
) -> Result<BookieConfig, BrokerError> {
    let matches = BookieConfig::augment_args(Command::new("bookie"))
        .try_get_matches_from(["bookie"])
        .map_err(|e| BrokerError::Io(format!("bookie defaults: {e}")))?;
    let mut b = BookieConfig::from_arg_matches(&matches)
        .map_err(|e| BrokerError::Io(format!("bookie defaults: {e}")))?;
    let dir = config.data_dir_abs();
    b.metadata_url = metadata_url.to_string();
    b.metadata_root = config.metadata_root.clone();
    b.bookie_id = STANDALONE_BOOKIE_ID.to_string();
    b.grpc_bind = "127.0.0.1:0".into();
    b.http_bind = "127.0.0.1:0".into();
    b.advertised_host = "127.0.0.1".into();
    b.journal_dir = dir.join("bookie/journal");
    b.ledger_dir = dir.join("bookie/ledgers");
    // Sized for a development machine.
    b.journal_file_bytes = 16 * 1024 * 1024;
    b.entry_log_bytes_max = 128 * 1024 * 1024;
    b.write_cache_bytes_max = 64 * 1024 * 1024;
    b.read_cache_bytes_max = 32 * 1024 * 1024;
    b.reserved_bytes = 64 * 1024 * 1024;
    b.disk_usage_threshold = config.standalone_disk_usage_threshold;
    b.disk_usage_lwm = (config.standalone_disk_usage_threshold - 0.05).max(0.0);
    b.validate()
        .map_err(|e| BrokerError::Io(format!("in-process bookie: {e}")))?;
    Ok(b)
}

/// The error for an in-process bookie that registered read-only: its disk is
/// fuller than the threshold, and a standalone with no writable bookie
/// cannot store anything.
fn read_only_error(config: &BrokerConfig) -> BrokerError {
    let dir = config.data_dir_abs();
    let used = cms_bookie::fs::RealFs
        .space(&dir)
        .map(|s| format!("{:.1} %", s.used_fraction() * 100.0))
        .unwrap_or_else(|e| format!("unknown ({e})"));
    BrokerError::Io(format!(
        "the in-process bookie is read-only: the disk of {} is {used} used, at or above \
         standalone_disk_usage_threshold {}; free space or raise the threshold \
         (--standalone-disk-usage-threshold)",
        dir.display(),
        config.standalone_disk_usage_threshold
    ))
}

async fn wait_for_bookie(
    store: &Arc<dyn MetadataStore>,
    layout: &Layout,
    config: &BrokerConfig,
    bookie: &mut tokio::task::JoinHandle<Result<(), cms_bookie::server::ServerError>>,
) -> Result<(), BrokerError> {
    let path = join(&layout.bookies_available(), STANDALONE_BOOKIE_ID);
    let readonly = join(&layout.bookies_readonly(), STANDALONE_BOOKIE_ID);
    let deadline = Instant::now() + Duration::from_millis(BOOKIE_START_TIMEOUT_MS);
    loop {
        match store.exists(&path).await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) | Err(MetadataError::NoNode(_)) => {}
            Err(e) => return Err(BrokerError::Metadata(e.to_string())),
        }
        match store.exists(&readonly).await {
            Ok(Some(_)) => return Err(read_only_error(config)),
            Ok(None) | Err(MetadataError::NoNode(_)) => {}
            Err(e) => return Err(BrokerError::Metadata(e.to_string())),
        }
        if bookie.is_finished() {
            return match bookie.await {
                Ok(Ok(())) => Err(BrokerError::Io("the in-process bookie stopped".into())),
                Ok(Err(e)) => Err(BrokerError::Io(format!("in-process bookie: {e}"))),
                Err(e) => Err(BrokerError::Io(format!("in-process bookie task: {e}"))),
            };
        }
        if Instant::now() >= deadline {
            return Err(BrokerError::Io(format!(
                "the in-process bookie did not register within {BOOKIE_START_TIMEOUT_MS} ms"
            )));
        }
        // Registration is a few metadata writes away; poll briefly.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs standalone until `shutdown` resolves.
pub async fn run(
    config: BrokerConfig,
    shutdown: impl Future<Output = ()> + Send,
    on_bound: impl FnOnce(BoundAddrs) + Send,
) -> Result<(), BrokerError> {
    config.validate(Mode::Standalone)?;
    let dir = config.data_dir_abs();
    std::fs::create_dir_all(&dir)
        .map_err(|e| BrokerError::Io(format!("creating {}: {e}", dir.display())))?;
    let metadata_url = format!("file://{}", dir.join("metadata/metadata.redb").display());
    let url: MetadataUrl = metadata_url
        .parse()
        .map_err(|e: String| BrokerError::Metadata(e))?;
    let layout =
        Layout::new(&config.metadata_root).map_err(|e| BrokerError::Metadata(e.to_string()))?;
    let store = connect(&url, &config.zk_options())
        .await
        .map_err(|e| BrokerError::Metadata(e.to_string()))?;
    let outcome = crate::tenancy::init_cluster(&*store, &layout, &config.standalone_cluster_name)
        .await
        .map_err(|e| BrokerError::Metadata(e.to_string()))?;
    info!(
        data_dir = %dir.display(),
        tenancy_nodes_created = outcome.tenancy_nodes_created,
        cluster = %outcome.layout.cluster().name,
        "standalone metadata ready"
    );

    let bookie_cfg = bookie_config(&config, &metadata_url)?;
    let (stop_bookie, bookie_stop_rx) = oneshot::channel::<()>();
    let mut bookie = tokio::spawn(cms_bookie::server::run(bookie_cfg, async move {
        let _ = bookie_stop_rx.await;
    }));
    wait_for_bookie(&store, &layout, &config, &mut bookie).await?;
    info!("in-process bookie registered");

    let broker = crate::service::run(config, Mode::Standalone, store.clone(), shutdown, on_bound);
    let result = tokio::select! {
        r = broker => r,
        r = &mut bookie => {
            // The bookie stopped under the broker: nothing can be stored.
            let why = match r {
                Ok(Ok(())) => "the in-process bookie stopped".to_string(),
                Ok(Err(e)) => format!("in-process bookie: {e}"),
                Err(e) => format!("in-process bookie task: {e}"),
            };
            return Err(BrokerError::Io(why));
        }
    };
    let _ = stop_bookie.send(());
    match tokio::time::timeout(Duration::from_secs(30), bookie).await {
        Ok(Ok(Ok(()))) => info!("in-process bookie stopped"),
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "in-process bookie stopped with an error"),
        Ok(Err(e)) => tracing::warn!(error = %e, "in-process bookie task failed"),
        Err(_) => tracing::warn!("in-process bookie did not stop within 30 s"),
    }
    store.close().await;
    result
}
