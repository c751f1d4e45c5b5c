//! `cms-bookie` binary: `init-cluster` today; `serve` and `autorecovery` say
//! they are not built yet and exit non-zero.

use std::process::ExitCode;

use anyhow::Context;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use cms_bookie::metadata::connect::{MetadataUrl, connect};
use cms_bookie::metadata::layout::{InitOutcome, Layout, init_cluster};
use cms_bookie::metadata::zk::ZkOptions;
use cms_common::config::{ConfigError, exit_config_error, to_toml};
use cms_common::{ConfigFileArgs, LogArgs, init_logging, load_config_or_exit};
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
    /// Run a bookie server (not built yet).
    Serve,
    /// Run autorecovery alone (not built yet).
    Autorecovery,
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
            run(run_init_cluster(sub, &file))
        }
        Command::Serve => not_built("serve", "the bookie server (storage engine, gRPC protocol)"),
        Command::Autorecovery => not_built("autorecovery", "autorecovery"),
    }
}

fn not_built(command: &str, what: &str) -> ExitCode {
    eprintln!(
        "cms-bookie {command}: {what} is not built yet; only `cms-bookie init-cluster` works so far"
    );
    ExitCode::from(1)
}

fn run(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
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
    let opts = ZkOptions {
        session_timeout_ms: config.metadata_session_timeout_ms,
        connect_timeout_ms: config.metadata_operation_timeout_ms,
        operation_timeout_ms: config.metadata_operation_timeout_ms,
    };
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
