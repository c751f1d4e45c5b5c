//! `cms-bookie` binary: `init-cluster`, `serve` (the bookie server, with
//! `--autorecovery` also the auditor and re-replication worker), `format`
//! (start a new incarnation), `autorecovery` (auditor + worker alone),
//! `decommission <bookie>` (drain a stopped bookie, with progress lines),
//! `list-underreplicated`, `ledger <id>` (metadata and per-replica presence)
//! and `readonly <bookie> on|off` (the operator's read-only switch of a
//! running bookie, through its HTTP port).

use std::process::ExitCode;

use anyhow::Context;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use cms_bookie::metadata::connect::{MetadataUrl, connect};
use cms_bookie::metadata::layout::{InitOutcome, Layout, init_cluster};
use cms_bookie::metadata::zk::ZkOptions;
use cms_bookie::server::BookieConfig;
use cms_bookie::server::cookie::{BookieDirs, format};
use cms_common::config::{ConfigError, exit_config_error, to_toml};
use cms_common::{
    ConfigFileArgs, LogArgs, init_logging, load_config_or_exit, run_main, run_main_with,
    shutdown_signal,
};
use serde::{Deserialize, Serialize};

/// Environment variables `CMS_BOOKIE_<KEY>` override the config file.
const ENV_PREFIX: &str = "CMS_BOOKIE_";

/// CMS bookie: durable entry storage and the BookKeeper-style ledger protocol.
#[derive(Debug, Parser)]
#[command(name = "cms-bookie", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the metadata layout (DESIGN §3) and the cluster node; idempotent.
    InitCluster {
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        config: InitClusterConfig,
    },
    /// Run a bookie server.
    Serve {
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        config: Box<BookieConfig>,
    },
    /// Start a new incarnation of a bookie: delete its data, bump the
    /// incarnation in its cookies. Run it only while the bookie is stopped.
    Format {
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        config: Box<BookieConfig>,
        /// Required: say yes to deleting the bookie's data.
        #[arg(long)]
        yes: bool,
    },
    /// Run autorecovery alone: the auditor election and a re-replication
    /// worker (uses the metadata and `--lost-bookie-grace-ms`,
    /// `--open-ledger-grace-ms`, `--replication-*` options of `serve`).
    Autorecovery {
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        config: Box<BookieConfig>,
    },
    /// Drain a stopped bookie: mark every ledger naming it under-replicated
    /// now, and report progress until no ledger needs it (autorecovery must
    /// be running to copy its replicas elsewhere).
    Decommission {
        /// The bookie id.
        bookie: String,
        /// Give up after this long, in seconds.
        #[arg(long, default_value_t = 3600)]
        timeout_s: u64,
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        config: InitClusterConfig,
    },
    /// List the ledgers marked under-replicated (id and the bookies named lost).
    ListUnderreplicated {
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        config: InitClusterConfig,
    },
    /// Turn a running bookie read-only (`on`: it refuses new adds, serves
    /// reads, and moves to `readonly/` so no new ensemble picks it) or
    /// writable again (`off`). Waits until the registration has moved. Not
    /// kept across a restart of the bookie.
    Readonly {
        /// The bookie id.
        bookie: String,
        /// `on` or `off`.
        #[arg(value_parser = ["on", "off"])]
        state: String,
        /// Give up waiting for the registration to move after this long, in seconds.
        #[arg(long, default_value_t = 30)]
        timeout_s: u64,
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        config: InitClusterConfig,
    },
    /// Show a ledger's metadata and, per segment, which replicas hold their entries.
    Ledger {
        /// The ledger id.
        id: u64,
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        config: InitClusterConfig,
    },
}

/// Options of `cms-bookie init-cluster`.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct InitClusterConfig {
    /// Metadata store URL: `zk://host:port[,host:port...][/chroot]` (ZooKeeper) or
    /// `file:///abs/path/metadata.redb` (embedded, single process).
    #[arg(long, default_value = "zk://127.0.0.1:2181")]
    metadata_url: String,
    /// Root node of the CMS layout inside the store.
    #[arg(long, default_value = "/cms")]
    metadata_root: String,
    /// Name of the cluster; a store serves one cluster only.
    #[arg(long, default_value = "local")]
    cluster_name: String,
    /// ZooKeeper session timeout, in milliseconds (ZooKeeper clamps it to 2–20 ticks).
    #[arg(long, default_value_t = 4000)]
    metadata_session_timeout_ms: u64,
    /// Timeout of one metadata operation and of connecting, in milliseconds.
    #[arg(long, default_value_t = 10000)]
    metadata_operation_timeout_ms: u64,
}

impl InitClusterConfig {
    fn zk_options(&self) -> ZkOptions {
        ZkOptions {
            session_timeout_ms: self.metadata_session_timeout_ms,
            connect_timeout_ms: self.metadata_operation_timeout_ms,
            operation_timeout_ms: self.metadata_operation_timeout_ms,
        }
    }

    fn url(&self) -> Result<MetadataUrl, ConfigError> {
        self.metadata_url
            .parse()
            .map_err(|reason| ConfigError::Invalid {
                key: "metadata_url".into(),
                reason,
            })
    }
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if let Err(e) = init_logging(&cli.log) {
        exit_config_error(&e);
    }
    let sub = matches.subcommand().map(|(_, m)| m);
    match cli.command {
        Command::InitCluster { file, .. } => {
            let sub = sub.unwrap_or(&matches);
            run_main(run_init_cluster(sub, &file))
        }
        Command::Serve { file, .. } => {
            let sub = sub.unwrap_or(&matches);
            // Read first: the config says how many runtime threads to start.
            let Some(config) = load_bookie_config(sub, &file) else {
                return ExitCode::SUCCESS;
            };
            run_main_with(config.worker_threads, run_serve(config))
        }
        Command::Format { file, yes, .. } => {
            let sub = sub.unwrap_or(&matches);
            run_main(run_format(sub, &file, yes))
        }
        Command::Autorecovery { file, .. } => {
            let sub = sub.unwrap_or(&matches);
            run_main(run_autorecovery(sub, &file))
        }
        Command::Decommission {
            bookie,
            timeout_s,
            file,
            ..
        } => {
            let sub = sub.unwrap_or(&matches);
            run_main(run_decommission(sub, &file, bookie, timeout_s))
        }
        Command::ListUnderreplicated { file, .. } => {
            let sub = sub.unwrap_or(&matches);
            run_main(run_list_underreplicated(sub, &file))
        }
        Command::Readonly {
            bookie,
            state,
            timeout_s,
            file,
            ..
        } => {
            let sub = sub.unwrap_or(&matches);
            run_main(run_readonly(sub, &file, bookie, state == "on", timeout_s))
        }
        Command::Ledger { id, file, .. } => {
            let sub = sub.unwrap_or(&matches);
            run_main(run_ledger(sub, &file, id))
        }
    }
}

async fn run_init_cluster(matches: &ArgMatches, file: &ConfigFileArgs) -> anyhow::Result<()> {
    let config: InitClusterConfig =
        load_config_or_exit(matches, file.config.as_deref(), ENV_PREFIX);
    let url = config.url().unwrap_or_else(|e| exit_config_error(&e));
    let layout = Layout::new(&config.metadata_root).unwrap_or_else(|e| {
        exit_config_error(&ConfigError::Invalid {
            key: "metadata_root".into(),
            reason: e.to_string(),
        })
    });
    if file.print_config {
        print!("{}", to_toml(&config));
        return Ok(());
    }
    let opts = config.zk_options();
    let store = connect(&url, &opts)
        .await
        .with_context(|| format!("connecting to the metadata store {url}"))?;
    let outcome = init_cluster(store.as_ref(), &layout, &config.cluster_name).await;
    store.close().await;
    match outcome.context("initialising the cluster")? {
        InitOutcome::Created {
            cluster,
            nodes_created,
        } => println!(
            "initialised cluster {:?} (instance {}) at {url}{}: {nodes_created} nodes created",
            cluster.name,
            cluster.instance_id,
            layout.root()
        ),
        InitOutcome::AlreadyInitialised {
            cluster,
            nodes_created,
        } => println!(
            "cluster {:?} (instance {}) is already initialised at {url}{}; {}",
            cluster.name,
            cluster.instance_id,
            layout.root(),
            if nodes_created == 0 {
                "nothing to do".to_string()
            } else {
                format!("completed a partial layout: {nodes_created} nodes created")
            }
        ),
    }
    Ok(())
}

fn load_bookie_config(matches: &ArgMatches, file: &ConfigFileArgs) -> Option<BookieConfig> {
    let config: BookieConfig = load_config_or_exit(matches, file.config.as_deref(), ENV_PREFIX);
    if let Err(e) = config.validate() {
        exit_config_error(&ConfigError::Invalid {
            key: e.key,
            reason: e.reason,
        });
    }
    if file.print_config {
        print!("{}", to_toml(&config));
        return None;
    }
    Some(config)
}

async fn run_serve(config: BookieConfig) -> anyhow::Result<()> {
    cms_bookie::server::run(config, shutdown_signal())
        .await
        .context("bookie")
}

async fn run_format(matches: &ArgMatches, file: &ConfigFileArgs, yes: bool) -> anyhow::Result<()> {
    let Some(config) = load_bookie_config(matches, file) else {
        return Ok(());
    };
    if !yes {
        anyhow::bail!(
            "format deletes all data of this bookie and starts a new incarnation; \
             pass --yes to confirm"
        );
    }
    if config.bookie_id.is_empty() {
        anyhow::bail!("format needs --bookie-id (the id is not derived from an address here)");
    }
    let (store, layout) = connect_bookie_metadata(&config).await?;
    let dirs = BookieDirs {
        journal_dir: config.journal_dir_abs(),
        ledger_dirs: vec![config.ledger_dir_abs()],
    };
    let result = format(store.as_ref(), &layout, &config.bookie_id, &dirs).await;
    store.close().await;
    let cookie = result.context("formatting")?;
    println!(
        "bookie {} formatted: incarnation {} (its ledgers go into limbo at the next start)",
        cookie.bookie_id, cookie.incarnation
    );
    Ok(())
}

async fn run_autorecovery(matches: &ArgMatches, file: &ConfigFileArgs) -> anyhow::Result<()> {
    let Some(config) = load_bookie_config(matches, file) else {
        return Ok(());
    };
    let (store, layout) = connect_bookie_metadata(&config).await?;
    let name = format!("autorecovery-{}", std::process::id());
    let ar = config.autorecovery_config(&name);
    let registry = prometheus::Registry::new();
    let metrics = cms_bookie::autorecovery::AutorecoveryMetrics::new(&registry)
        .context("registering metrics")?;
    let http = tokio::net::TcpListener::bind(&config.http_bind)
        .await
        .with_context(|| format!("binding the HTTP port {}", config.http_bind))?;
    tracing::info!(http = %config.http_bind, "autorecovery: /health and /metrics");
    tokio::spawn(async move {
        let router = cms_bookie::server::http::autorecovery_router(registry);
        if let Err(e) = axum::serve(http, router).await {
            tracing::error!(error = %e, "HTTP server stopped");
        }
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    cms_bookie::autorecovery::run_standalone(store, layout, ar, metrics, stop_rx)
        .await
        .context("autorecovery")
}

/// The metadata store and layout a `serve`-style configuration names.
async fn connect_bookie_metadata(
    config: &BookieConfig,
) -> anyhow::Result<(
    std::sync::Arc<dyn cms_bookie::metadata::MetadataStore>,
    Layout,
)> {
    let url = config.metadata_url().map_err(|e| anyhow::anyhow!("{e}"))?;
    let layout = Layout::new(&config.metadata_root).context("metadata_root")?;
    let store = connect(&url, &config.zk_options())
        .await
        .with_context(|| format!("connecting to the metadata store {url}"))?;
    Ok((store, layout))
}

async fn connect_metadata(
    config: &InitClusterConfig,
) -> anyhow::Result<(
    std::sync::Arc<dyn cms_bookie::metadata::MetadataStore>,
    Layout,
)> {
    let url = config.url().map_err(|e| anyhow::anyhow!("{e}"))?;
    let layout = Layout::new(&config.metadata_root).context("metadata_root")?;
    let opts = config.zk_options();
    let store = connect(&url, &opts)
        .await
        .with_context(|| format!("connecting to the metadata store {url}"))?;
    Ok((store, layout))
}

async fn run_list_underreplicated(
    matches: &ArgMatches,
    file: &ConfigFileArgs,
) -> anyhow::Result<()> {
    let config: InitClusterConfig =
        load_config_or_exit(matches, file.config.as_deref(), ENV_PREFIX);
    if file.print_config {
        print!("{}", to_toml(&config));
        return Ok(());
    }
    let (store, layout) = connect_metadata(&config).await?;
    let res = cms_bookie::autorecovery::list_underreplicated(store.as_ref(), &layout).await;
    store.close().await;
    let list = res.context("listing under-replicated ledgers")?;
    if list.is_empty() {
        println!("no under-replicated ledger");
    }
    for (id, bookies) in list {
        println!("{id}\tlost: {bookies}");
    }
    Ok(())
}

/// Where a bookie is registered: (writable, registration).
async fn find_registration(
    store: &dyn cms_bookie::metadata::MetadataStore,
    layout: &Layout,
    bookie: &str,
) -> anyhow::Result<Option<(bool, cms_bookie::proto::metadata::BookieRegistration)>> {
    use prost::Message;
    for (writable, parent) in [
        (true, layout.bookies_available()),
        (false, layout.bookies_readonly()),
    ] {
        let node = cms_bookie::metadata::join(&parent, bookie);
        match store.get(&node).await {
            Ok((data, _)) => {
                let reg = cms_bookie::proto::metadata::BookieRegistration::decode(data.as_slice())
                    .with_context(|| format!("decoding {node}"))?;
                return Ok(Some((writable, reg)));
            }
            Err(cms_bookie::metadata::MetadataError::NoNode(_)) => {}
            Err(e) => return Err(e).with_context(|| format!("reading {node}")),
        }
    }
    Ok(None)
}

async fn run_readonly(
    matches: &ArgMatches,
    file: &ConfigFileArgs,
    bookie: String,
    on: bool,
    timeout_s: u64,
) -> anyhow::Result<()> {
    let config: InitClusterConfig =
        load_config_or_exit(matches, file.config.as_deref(), ENV_PREFIX);
    if file.print_config {
        print!("{}", to_toml(&config));
        return Ok(());
    }
    let (store, layout) = connect_metadata(&config).await?;
    let result = readonly_switch(store.as_ref(), &layout, &bookie, on, timeout_s).await;
    store.close().await;
    result
}

async fn readonly_switch(
    store: &dyn cms_bookie::metadata::MetadataStore,
    layout: &Layout,
    bookie: &str,
    on: bool,
    timeout_s: u64,
) -> anyhow::Result<()> {
    let Some((_, reg)) = find_registration(store, layout, bookie).await? else {
        anyhow::bail!(
            "bookie {bookie} is not registered (not running, or another id): \
             the switch acts on a running bookie"
        );
    };
    if reg.http_endpoint.is_empty() {
        anyhow::bail!("bookie {bookie} registered no HTTP endpoint");
    }
    let url = format!("http://{}/admin/readonly", reg.http_endpoint);
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .context("HTTP client")?;
    let resp = http
        .put(&url)
        .json(&serde_json::json!({ "readonly": on }))
        .send()
        .await
        .with_context(|| format!("PUT {url}"))?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap_or(serde_json::Value::Null);
    if !status.is_success() {
        let reason = body
            .get("reason")
            .and_then(|r| r.as_str())
            .unwrap_or("no reason given");
        anyhow::bail!("bookie {bookie} refused: {status}: {reason}");
    }
    let want_writable = !on;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(timeout_s);
    loop {
        match find_registration(store, layout, bookie).await? {
            Some((writable, _)) if writable == want_writable => break,
            _ if tokio::time::Instant::now() >= deadline => anyhow::bail!(
                "bookie {bookie} accepted the switch but its registration did not move to \
                 {} within {timeout_s} s (mode {})",
                if want_writable {
                    "available/"
                } else {
                    "readonly/"
                },
                body.get("mode").and_then(|m| m.as_str()).unwrap_or("?")
            ),
            _ => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
    println!(
        "bookie {bookie} is {}",
        if on {
            "read-only (registered under readonly/)"
        } else {
            "writable (registered under available/)"
        }
    );
    Ok(())
}

async fn run_ledger(matches: &ArgMatches, file: &ConfigFileArgs, id: u64) -> anyhow::Result<()> {
    let config: InitClusterConfig =
        load_config_or_exit(matches, file.config.as_deref(), ENV_PREFIX);
    if file.print_config {
        print!("{}", to_toml(&config));
        return Ok(());
    }
    let (store, layout) = connect_metadata(&config).await?;
    let client = cms_bookie::client::driver::LedgerClient::connect(
        store.clone(),
        layout,
        cms_bookie::client::driver::LedgerClientOptions::default(),
    )
    .await
    .context("ledger client")?;
    let res = cms_bookie::autorecovery::describe_ledger(&client, id).await;
    drop(client);
    store.close().await;
    print!("{}", res.context("describing the ledger")?);
    Ok(())
}

async fn run_decommission(
    matches: &ArgMatches,
    file: &ConfigFileArgs,
    bookie: String,
    timeout_s: u64,
) -> anyhow::Result<()> {
    let config: InitClusterConfig =
        load_config_or_exit(matches, file.config.as_deref(), ENV_PREFIX);
    if file.print_config {
        print!("{}", to_toml(&config));
        return Ok(());
    }
    let (store, layout) = connect_metadata(&config).await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout_s);
    let result = loop {
        match cms_bookie::autorecovery::decommission_step(store.as_ref(), &layout, &bookie).await {
            Ok(left) if left.is_empty() => {
                println!("bookie {bookie} decommissioned: no ledger needs it");
                break Ok(());
            }
            Ok(left) => println!(
                "bookie {bookie}: {} ledgers still name it (marked under-replicated): {:?}",
                left.len(),
                left.iter().take(10).collect::<Vec<_>>()
            ),
            Err(e) => break Err(anyhow::anyhow!("{e}")),
        }
        if std::time::Instant::now() >= deadline {
            break Err(anyhow::anyhow!(
                "bookie {bookie} still needed after {timeout_s} s; is autorecovery running?"
            ));
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    };
    store.close().await;
    result
}
