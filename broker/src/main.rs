//! `cms-broker` binary: `init-cluster` (metadata layout, cluster node,
//! tenant `public` and namespace `public/default`; idempotent), `serve` (the
//! broker against ZooKeeper and real bookies) and `standalone` (embedded
//! metadata store + in-process bookie + broker, data under `--data-dir`).

use std::process::ExitCode;

use anyhow::Context;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use cms_bookie::metadata::connect::{MetadataUrl, connect};
use cms_bookie::metadata::layout::{InitOutcome, Layout};
use cms_bookie::metadata::zk::ZkOptions;
use cms_broker::config::{BrokerConfig, Mode};
use cms_common::config::{ConfigError, exit_config_error, to_toml};
use cms_common::{
    ConfigFileArgs, LogArgs, init_logging, load_config_or_exit, run_main, shutdown_signal,
};
use serde::{Deserialize, Serialize};

/// Environment variables `CMS_BROKER_<KEY>` override the config file.
const ENV_PREFIX: &str = "CMS_BROKER_";

/// CMS broker: Pulsar-compatible messaging over replicated ledgers.
#[derive(Debug, Parser)]
#[command(name = "cms-broker", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the metadata layout, the cluster node, tenant `public` and
    /// namespace `public/default`; idempotent.
    InitCluster {
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        config: InitClusterConfig,
    },
    /// Run a broker against ZooKeeper and the registered bookies.
    Serve {
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        config: Box<BrokerConfig>,
    },
    /// Run broker + bookie + embedded metadata store in one process, data
    /// under `--data-dir` (ports 6650 and 8080 by default).
    Standalone {
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        config: Box<BrokerConfig>,
    },
}

/// Options of `cms-broker init-cluster`.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct InitClusterConfig {
    /// Metadata store URL: `zk://host:port[,host:port...][/chroot]` or
    /// `file:///abs/path/metadata.redb`.
    #[arg(long, default_value = "zk://127.0.0.1:2181")]
    metadata_url: String,
    /// Root node of the CMS layout inside the store.
    #[arg(long, default_value = "/cms")]
    metadata_root: String,
    /// Name of the cluster; a store serves one cluster only.
    #[arg(long, default_value = "local")]
    cluster_name: String,
    /// ZooKeeper session timeout, in milliseconds.
    #[arg(long, default_value_t = 4000)]
    metadata_session_timeout_ms: u64,
    /// Timeout of one metadata operation and of connecting, in milliseconds.
    #[arg(long, default_value_t = 10000)]
    metadata_operation_timeout_ms: u64,
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
    let sub = matches.subcommand().map(|(_, m)| m).unwrap_or(&matches);
    match cli.command {
        Command::InitCluster { file, .. } => run_main(run_init_cluster(sub, &file)),
        Command::Serve { file, .. } => run_main(run_broker(sub, &file, Mode::Cluster)),
        Command::Standalone { file, .. } => run_main(run_broker(sub, &file, Mode::Standalone)),
    }
}

async fn run_init_cluster(matches: &ArgMatches, file: &ConfigFileArgs) -> anyhow::Result<()> {
    let config: InitClusterConfig =
        load_config_or_exit(matches, file.config.as_deref(), ENV_PREFIX);
    let url: MetadataUrl = config.metadata_url.parse().unwrap_or_else(|reason| {
        exit_config_error(&ConfigError::Invalid {
            key: "metadata_url".into(),
            reason,
        })
    });
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
    let outcome =
        cms_broker::tenancy::init_cluster(store.as_ref(), &layout, &config.cluster_name).await;
    store.close().await;
    let outcome = outcome.context("initialising the cluster")?;
    match &outcome.layout {
        InitOutcome::Created { cluster, .. } => println!(
            "initialised cluster {:?} (instance {}) at {url}{} with tenant public and namespace public/default",
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
            if *nodes_created + outcome.tenancy_nodes_created == 0 {
                "nothing to do".to_string()
            } else {
                format!(
                    "completed a partial layout: {} nodes created",
                    nodes_created + outcome.tenancy_nodes_created
                )
            }
        ),
    }
    Ok(())
}

async fn run_broker(matches: &ArgMatches, file: &ConfigFileArgs, mode: Mode) -> anyhow::Result<()> {
    let config: BrokerConfig = load_config_or_exit(matches, file.config.as_deref(), ENV_PREFIX);
    if let Err(e) = config.validate(mode) {
        exit_config_error(&ConfigError::Invalid {
            key: e.key,
            reason: e.reason,
        });
    }
    if file.print_config {
        print!("{}", to_toml(&config));
        return Ok(());
    }
    let on_bound = |_| {};
    match mode {
        Mode::Standalone => cms_broker::standalone::run(config, shutdown_signal(), on_bound)
            .await
            .context("standalone"),
        Mode::Cluster => {
            let url = config.metadata_url().map_err(|e| anyhow::anyhow!("{e}"))?;
            let store = connect(&url, &config.zk_options())
                .await
                .with_context(|| format!("connecting to the metadata store {url}"))?;
            let r =
                cms_broker::service::run(config, mode, store.clone(), shutdown_signal(), on_bound)
                    .await
                    .context("broker");
            store.close().await;
            r
        }
    }
}
