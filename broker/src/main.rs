//! `cms-broker` binary: `init-cluster` (metadata layout, cluster node,
//! tenant `public` and namespace `public/default`; idempotent), `serve` (the
//! broker against ZooKeeper and real bookies) and `standalone` (embedded
//! metadata store + in-process bookie + broker, data under `--data-dir`) and
//! `tokens` (keys and JWT tokens for authentication, as `pulsar tokens`).

use std::process::ExitCode;

use anyhow::Context;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use cms_bookie::metadata::connect::{MetadataUrl, connect};
use cms_bookie::metadata::layout::{InitOutcome, Layout};
use cms_bookie::metadata::zk::ZkOptions;
use cms_broker::config::{BrokerConfig, Mode};
use cms_common::config::{ConfigError, exit_config_error, to_toml};
use cms_common::{
    ConfigFileArgs, LogArgs, init_logging, load_config_or_exit, run_main, run_main_with,
    shutdown_signal,
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
    /// Keys and tokens for authentication (see docs/security.md).
    Tokens {
        #[command(subcommand)]
        command: TokensCommand,
    },
}

/// `cms-broker tokens ...`.
#[derive(Debug, Subcommand)]
enum TokensCommand {
    /// Write a new random HMAC secret key (32 raw bytes, mode 0600).
    CreateSecretKey {
        /// File to write.
        #[arg(long)]
        output: std::path::PathBuf,
    },
    /// Write a new key pair: private key (PEM PKCS#8, mode 0600) for
    /// `tokens create --private-key`, public key (PEM) for `--auth-public-key`.
    CreateKeyPair {
        /// Private key file to write.
        #[arg(long)]
        output_private_key: std::path::PathBuf,
        /// Public key file to write.
        #[arg(long)]
        output_public_key: std::path::PathBuf,
        /// Signature algorithm of the tokens.
        #[arg(long, value_enum, default_value = "rs256")]
        algorithm: cms_broker::auth::KeyPairAlgorithm,
    },
    /// Print a new token for a role.
    Create {
        /// HMAC secret key file (HS256).
        #[arg(
            long,
            conflicts_with = "private_key",
            required_unless_present = "private_key"
        )]
        secret_key: Option<String>,
        /// Private key file (RS256 / ES256).
        #[arg(long)]
        private_key: Option<String>,
        /// The role (`sub`).
        #[arg(long)]
        subject: String,
        /// Lifetime, e.g. `30m`, `1h`, `7d`; none = the token never expires.
        #[arg(long)]
        expiry: Option<String>,
        /// Audience (`aud`).
        #[arg(long)]
        audience: Option<String>,
    },
}

fn write_private(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// `file:///x` or `/x`.
fn key_path(s: &str) -> &str {
    s.strip_prefix("file://").unwrap_or(s)
}

fn run_tokens(cmd: TokensCommand) -> anyhow::Result<()> {
    use cms_broker::auth;
    match cmd {
        TokensCommand::CreateSecretKey { output } => {
            write_private(&output, &auth::new_secret_key())?;
            eprintln!("secret key written to {}", output.display());
        }
        TokensCommand::CreateKeyPair {
            output_private_key,
            output_public_key,
            algorithm,
        } => {
            let (private, public) = auth::new_key_pair(algorithm)?;
            write_private(&output_private_key, private.as_bytes())?;
            std::fs::write(&output_public_key, public.as_bytes())
                .with_context(|| format!("writing {}", output_public_key.display()))?;
            eprintln!(
                "private key written to {}, public key to {}",
                output_private_key.display(),
                output_public_key.display()
            );
        }
        TokensCommand::Create {
            secret_key,
            private_key,
            subject,
            expiry,
            audience,
        } => {
            if subject.is_empty() {
                anyhow::bail!("--subject must not be empty");
            }
            let key = match (secret_key, private_key) {
                (Some(p), _) => auth::SigningKey::Secret(
                    std::fs::read(key_path(&p)).with_context(|| format!("reading {p}"))?,
                ),
                (None, Some(p)) => auth::SigningKey::Private(
                    std::fs::read(key_path(&p)).with_context(|| format!("reading {p}"))?,
                ),
                (None, None) => anyhow::bail!("give --secret-key or --private-key"),
            };
            let exp = match expiry {
                Some(e) => Some(
                    auth::now_s()
                        + auth::parse_duration_s(&e)
                            .map_err(|m| anyhow::anyhow!("--expiry: {m}"))?,
                ),
                None => None,
            };
            let token = auth::create_token(
                &key,
                &auth::Claims {
                    sub: subject,
                    exp,
                    nbf: None,
                    aud: audience,
                },
            )?;
            println!("{token}");
        }
    }
    Ok(())
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
    if let Command::Tokens { command } = cli.command {
        return match run_tokens(command) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    if let Err(e) = init_logging(&cli.log) {
        exit_config_error(&e);
    }
    let sub = matches.subcommand().map(|(_, m)| m).unwrap_or(&matches);
    match cli.command {
        Command::InitCluster { file, .. } => run_main(run_init_cluster(sub, &file)),
        Command::Serve { file, .. } => serve(sub, &file, Mode::Cluster),
        Command::Standalone { file, .. } => serve(sub, &file, Mode::Standalone),
        Command::Tokens { .. } => ExitCode::SUCCESS,
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

/// `serve` and `standalone`: the config is read before the runtime starts,
/// since it says how many threads the runtime has.
fn serve(matches: &ArgMatches, file: &ConfigFileArgs, mode: Mode) -> ExitCode {
    let config: BrokerConfig = load_config_or_exit(matches, file.config.as_deref(), ENV_PREFIX);
    if let Err(e) = config.validate(mode) {
        exit_config_error(&ConfigError::Invalid {
            key: e.key,
            reason: e.reason,
        });
    }
    if file.print_config {
        print!("{}", to_toml(&config));
        return ExitCode::SUCCESS;
    }
    run_main_with(config.worker_threads, run_broker(config, mode))
}

async fn run_broker(config: BrokerConfig, mode: Mode) -> anyhow::Result<()> {
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
