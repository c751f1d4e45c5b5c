//! Configuration of `cms-broker serve` and `cms-broker standalone`: one struct
//! that is at once the clap flags (defaults and units in `--help`), the TOML
//! keys and the `CMS_BROKER_*` environment keys (see `cms_common::config`).
//!
//! The same struct serves both modes so that one file and one environment
//! work for either: `metadata_url` is used by `serve` only (standalone keeps
//! its embedded store under `data_dir`), `data_dir` and the `standalone_*`
//! keys by `standalone` only. Replication settings of 0 mean "the mode's
//! default": E/Qw/Qa = 3/3/2 in a cluster, 1/1/1 standalone.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use cms_bookie::metadata::connect::MetadataUrl;
use cms_bookie::metadata::zk::ZkOptions;

/// Largest message payload accepted by default (Pulsar's 5 MiB).
pub const MESSAGE_BYTES_MAX_DEFAULT: usize = 5 * 1024 * 1024;
/// Room for the command and metadata around the largest message in a frame
/// (Pulsar's `MESSAGE_SIZE_FRAME_PADDING`).
pub const FRAME_PADDING_BYTES: usize = 10 * 1024;
/// Largest `message_size_max` accepted: the bookie's entry limit (7 MiB)
/// minus the padding.
pub const MESSAGE_BYTES_MAX_LIMIT: usize = 7 * 1024 * 1024 - FRAME_PADDING_BYTES;

/// Options of `cms-broker serve` and `cms-broker standalone`.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Threads of the async runtime (connections, dispatch, the admin API);
    /// 0 = one per CPU the process may use, 1 = a single-threaded runtime on
    /// the main thread. Where the broker shares few
    /// cores with other servers, fewer threads switch less.
    #[arg(long, default_value_t = 0)]
    pub worker_threads: usize,
    /// Metadata store URL (`serve` only): `zk://host:port[,host:port...][/chroot]`.
    #[arg(long, default_value = "zk://127.0.0.1:2181")]
    pub metadata_url: String,
    /// Root node of the CMS layout inside the store.
    #[arg(long, default_value = "/cms")]
    pub metadata_root: String,
    /// ZooKeeper session timeout, in milliseconds.
    #[arg(long, default_value_t = 6000)]
    pub metadata_session_timeout_ms: u64,
    /// Timeout of one metadata operation and of connecting, in milliseconds.
    #[arg(long, default_value_t = 10000)]
    pub metadata_operation_timeout_ms: u64,
    /// Period of the broker's load report in `/cms/brokers/<id>`, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub load_report_interval_ms: u64,
    /// Automatic bundle split: a bundle whose owner serves more loaded
    /// topics than this is split in two (Pulsar's
    /// `loadBalancerNamespaceBundleMaxTopics`); 0 = never split automatically.
    #[arg(long, default_value_t = 1000)]
    pub bundle_split_topics_max: u64,
    /// How often each broker checks its bundles' topic counts, in milliseconds.
    #[arg(long, default_value_t = 60000)]
    pub bundle_split_check_interval_ms: u64,
    /// Automatic split stops when a namespace has this many bundles (Pulsar's
    /// `loadBalancerNamespaceMaximumBundles`); admin splits go up to 1024.
    #[arg(long, default_value_t = 128)]
    pub bundle_split_bundles_max: u32,

    /// Pulsar binary protocol listen address; empty = plaintext off (only
    /// with `broker_tls_bind`).
    #[arg(long, default_value = "0.0.0.0:6650")]
    pub broker_bind: String,
    /// HTTP listen address (`/health`, `/ready`, `/metrics`, `/admin/v2`);
    /// empty = plaintext off (only with `https_bind`).
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub http_bind: String,
    /// Host clients are told to connect to (LOOKUP answers); empty = the bind
    /// host (127.0.0.1 for 0.0.0.0). Set it behind Docker or Kubernetes.
    #[arg(long, default_value = "")]
    pub advertised_address: String,

    /// Ensemble size E of new ledgers; 0 = the mode's default (3 cluster, 1 standalone).
    #[arg(long, default_value_t = 0)]
    pub ensemble_size: usize,
    /// Write quorum Qw; 0 = the mode's default (3 cluster, 1 standalone).
    #[arg(long, default_value_t = 0)]
    pub write_quorum: usize,
    /// Ack quorum Qa; 0 = the mode's default (2 cluster, 1 standalone).
    #[arg(long, default_value_t = 0)]
    pub ack_quorum: usize,
    /// Sticky reads: when every bookie of a ledger's ensemble holds every
    /// entry (E = Qw), read all of the ledger's entries from one bookie
    /// first, so that bookie's read-ahead serves a catch-up read instead of
    /// every bookie reading the whole range (Pulsar's
    /// `bookkeeperEnableStickyReads`). Another replica takes over on errors.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub sticky_reads: bool,
    /// An idle ledger's writer sends its LAC to the bookies after this many
    /// milliseconds, for readers in other processes that tail an open
    /// ledger (Pulsar's `bookkeeperExplicitLacIntervalInMills`; 0 = never,
    /// the default there and here: the broker reads its own open ledgers
    /// up to the LAC its writer knows). Each one costs a `WriteLac` call
    /// per bookie per idle ledger (BENCHMARKS.md, W4).
    #[arg(long, default_value_t = 0)]
    pub explicit_lac_interval_ms: u64,

    /// Largest message (metadata + payload) accepted, in bytes; told to
    /// clients in CONNECTED, capped there by what one ledger entry holds (a
    /// message over that bound is refused alone with SEND_ERROR NotAllowed).
    #[arg(long, default_value_t = MESSAGE_BYTES_MAX_DEFAULT)]
    pub message_bytes_max: usize,
    /// Publishes in flight (received, not yet receipted) per connection; the
    /// connection stops reading beyond it.
    #[arg(long, default_value_t = 1000)]
    pub pending_publishes_per_connection_max: usize,
    /// Producers on one topic.
    #[arg(long, default_value_t = 1000)]
    pub producers_per_topic_max: usize,
    /// Consumers on one subscription.
    #[arg(long, default_value_t = 1000)]
    pub consumers_per_subscription_max: usize,
    /// Open connections from one client IP address.
    #[arg(long, default_value_t = 1000)]
    pub connections_per_ip_max: usize,
    /// Open connections in total.
    #[arg(long, default_value_t = 20_000)]
    pub connections_max: usize,
    /// Producers plus consumers on one connection.
    #[arg(long, default_value_t = 10_000)]
    pub handles_per_connection_max: usize,
    /// Keep-alive: the broker pings an idle connection after this long and
    /// closes it if nothing arrived for twice this long, in seconds.
    #[arg(long, default_value_t = 30)]
    pub keep_alive_interval_s: u64,
    /// Commands queued towards one connection's socket before the sender waits.
    #[arg(long, default_value_t = 1000)]
    pub outbound_queue_max: usize,
    /// Create topics (and subscriptions) on first use.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_auto_topic_creation: bool,
    /// What auto-creation creates when a client asks for a missing topic's
    /// partitions: `non-partitioned` or `partitioned` (namespaces may
    /// override with `autoTopicCreationOverride`).
    #[arg(long, value_enum, default_value_t = crate::tenancy::AutoTopicType::NonPartitioned)]
    pub allow_auto_topic_creation_type: crate::tenancy::AutoTopicType,
    /// Partitions of an auto-created partitioned topic.
    #[arg(long, default_value_t = 1)]
    pub default_num_partitions: u32,
    /// Most bytes one cursor read asks the bookies for, read-ahead included
    /// (Pulsar's `dispatcherMaxReadSizeBytes`); smaller reads spread a
    /// catch-up reader's load into smaller bursts (docs/isolation.md).
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub dispatch_read_bytes_max: usize,
    /// A subscription under a byte dispatch rate reads new entries in
    /// pieces of this many milliseconds of its tightest byte rate, at most
    /// the rate bucket's tenth of a second (docs/quotas.md): smaller pieces
    /// keep each read's work on the shared threads short.
    #[arg(long, default_value_t = 100)]
    pub dispatch_read_budget_ms: u64,
    /// Broker-wide entry cache (tailing reads), in bytes.
    #[arg(long, default_value_t = 128 * 1024 * 1024)]
    pub entry_cache_bytes_max: usize,
    /// Dispatch reads (cache misses sent to the bookies) in flight over all
    /// tenants (docs/isolation.md).
    #[arg(long, default_value_t = 32)]
    pub dispatch_reads_in_flight_max: usize,
    /// Dispatch reads in flight for one tenant; its further reads wait for
    /// its own budget.
    #[arg(long, default_value_t = 8)]
    pub dispatch_reads_per_tenant_in_flight_max: usize,
    /// Estimated bytes of dispatch reads in flight for one tenant.
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    pub dispatch_read_bytes_per_tenant_in_flight_max: u64,
    /// Dispatch reads queued for one tenant; beyond, a read fails at once
    /// (retried by the subscription after a backoff).
    #[arg(long, default_value_t = 10_000)]
    pub dispatch_read_queue_requests_per_tenant_max: usize,
    /// Estimated bytes of dispatch reads queued for one tenant.
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    pub dispatch_read_queue_bytes_per_tenant_max: u64,
    /// Topics loaded at once at most.
    #[arg(long, default_value_t = 10_000)]
    pub topics_loaded_max: usize,
    /// Period of each topic's background work (cursor snapshots, trimming), in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub topic_tick_interval_ms: u64,
    /// `/metrics` exports per-topic and per-subscription series (labels
    /// tenant, namespace, topic[, subscription]). Off: the same names summed
    /// per namespace (labels tenant, namespace), so the series count follows
    /// the namespaces, not the topics (Pulsar's
    /// `exposeTopicLevelMetricsInPrometheus`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics_topic_level: bool,
    /// Producer de-duplication on topics whose namespace policy does not
    /// say (Pulsar's `brokerDeduplicationEnabled`).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub broker_deduplication_enabled: bool,
    /// De-duplication snapshot after this many stored entries.
    #[arg(long, default_value_t = 1000)]
    pub dedup_snapshot_entries: u64,
    /// De-duplication snapshot at least this often when anything was stored, in seconds.
    #[arg(long, default_value_t = 120)]
    pub dedup_snapshot_interval_s: u64,
    /// Producer names whose sequence ids a topic remembers at most (least recently used forgotten).
    #[arg(long, default_value_t = 10_000)]
    pub dedup_producers_max: usize,

    /// Require token authentication even without a key flag (the broker
    /// then refuses to start: fail closed). Giving `auth_secret_key` or
    /// `auth_public_key` turns authentication and authorization on.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub authentication_enabled: bool,
    /// HMAC secret key file (raw bytes, `cms-broker tokens create-secret-key`);
    /// empty = none.
    #[arg(long, default_value = "")]
    pub auth_secret_key: String,
    /// Public key file (PEM, RSA or EC; `tokens create-key-pair`); empty = none.
    #[arg(long, default_value = "")]
    pub auth_public_key: String,
    /// Audience tokens must carry (`aud`); empty = not checked.
    #[arg(long, default_value = "")]
    pub auth_audience: String,
    /// Clock skew tolerated on token `exp` / `nbf`, in seconds (at most 600).
    #[arg(long, default_value_t = 0)]
    pub auth_clock_skew_s: u64,
    /// A connection whose token expired is sent AUTH_CHALLENGE and closed
    /// if no valid AUTH_RESPONSE arrives within this long, in seconds.
    #[arg(long, default_value_t = 60)]
    pub auth_refresh_timeout_s: u64,
    /// Superuser roles, comma-separated.
    #[arg(long, default_value = "")]
    pub superuser_roles: String,

    /// Pulsar protocol over TLS (`pulsar+ssl://`) listen address, e.g.
    /// `0.0.0.0:6651`; empty = off. Needs `tls_cert_file` and `tls_key_file`.
    #[arg(long, default_value = "")]
    pub broker_tls_bind: String,
    /// HTTPS listen address (admin API, lookup, health), e.g. `0.0.0.0:8443`;
    /// empty = off. Needs `tls_cert_file` and `tls_key_file`.
    #[arg(long, default_value = "")]
    pub https_bind: String,
    /// TLS certificate chain file (PEM); reloaded when it changes.
    #[arg(long, default_value = "")]
    pub tls_cert_file: String,
    /// TLS private key file (PEM); reloaded when it changes.
    #[arg(long, default_value = "")]
    pub tls_key_file: String,
    /// CA file (PEM) client certificates must chain to when a client offers
    /// one; empty = client certificates are not requested.
    #[arg(long, default_value = "")]
    pub tls_trust_certs_file: String,
    /// How often the TLS files are checked for changes, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub tls_reload_interval_ms: u64,

    /// Standalone only: directory of all data (metadata store, journal, ledgers).
    #[arg(long, default_value = "data/standalone")]
    pub data_dir: PathBuf,
    /// Standalone only: cluster name created on first start.
    #[arg(long, default_value = "standalone")]
    pub standalone_cluster_name: String,
    /// Standalone only: disk use (fraction) above which the in-process bookie
    /// turns read-only.
    #[arg(long, default_value_t = 0.95)]
    pub standalone_disk_usage_threshold: f64,
}

/// A configuration value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config key `{key}`: {reason}")]
pub struct InvalidConfig {
    /// The key.
    pub key: String,
    /// Why.
    pub reason: String,
}

fn parse_optional_addr(key: &str, v: &str) -> Result<Option<SocketAddr>, InvalidConfig> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    v.parse()
        .map(Some)
        .map_err(|e| invalid(key, format!("{v:?} is not host:port: {e}")))
}

fn invalid(key: &str, reason: impl Into<String>) -> InvalidConfig {
    InvalidConfig {
        key: key.into(),
        reason: reason.into(),
    }
}

/// Which process the configuration runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `cms-broker serve`: ZooKeeper and real bookies.
    Cluster,
    /// `cms-broker standalone`: everything in one process.
    Standalone,
}

/// E, Qw, Qa of new ledgers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replication {
    /// Ensemble size.
    pub ensemble: usize,
    /// Write quorum.
    pub write_quorum: usize,
    /// Ack quorum.
    pub ack_quorum: usize,
}

impl BrokerConfig {
    /// The TLS files when a TLS port is configured.
    pub fn tls_files(&self) -> Option<crate::tls::TlsFiles> {
        if self.broker_tls_bind.trim().is_empty() && self.https_bind.trim().is_empty() {
            return None;
        }
        let trust = self.tls_trust_certs_file.trim();
        Some(crate::tls::TlsFiles {
            cert: PathBuf::from(self.tls_cert_file.trim()),
            key: PathBuf::from(self.tls_key_file.trim()),
            trust: (!trust.is_empty()).then(|| PathBuf::from(trust)),
        })
    }

    /// The `pulsar+ssl://` listen address, if any.
    pub fn broker_tls_addr(&self) -> Result<Option<SocketAddr>, InvalidConfig> {
        parse_optional_addr("broker_tls_bind", &self.broker_tls_bind)
    }

    /// The HTTPS listen address, if any.
    pub fn https_addr(&self) -> Result<Option<SocketAddr>, InvalidConfig> {
        parse_optional_addr("https_bind", &self.https_bind)
    }

    /// The authentication settings (paths and roles as configured).
    pub fn auth_settings(&self) -> crate::auth::AuthSettings {
        let path = |s: &str| (!s.trim().is_empty()).then(|| PathBuf::from(s.trim()));
        crate::auth::AuthSettings {
            enabled: self.authentication_enabled,
            secret_key: path(&self.auth_secret_key),
            public_key: path(&self.auth_public_key),
            audience: (!self.auth_audience.trim().is_empty())
                .then(|| self.auth_audience.trim().to_string()),
            clock_skew_s: self.auth_clock_skew_s,
            superuser_roles: self
                .superuser_roles
                .split(',')
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }

    /// Checks values that parse but cannot work in `mode`.
    pub fn validate(&self, mode: Mode) -> Result<(), InvalidConfig> {
        self.broker_addr_opt()?;
        self.http_addr_opt()?;
        if self.worker_threads > 1024 {
            return Err(invalid(
                "worker_threads",
                "must be at most 1024 (0 = one per CPU)",
            ));
        }
        if self.dispatch_read_bytes_max < 1024 {
            return Err(invalid("dispatch_read_bytes_max", "must be at least 1024"));
        }
        if !(1..=100).contains(&self.dispatch_read_budget_ms) {
            return Err(invalid(
                "dispatch_read_budget_ms",
                "must be between 1 and 100 (a rate bucket holds a tenth of a second)",
            ));
        }
        if mode == Mode::Cluster {
            self.metadata_url()?;
        }
        let r = self.replication(mode);
        if !(r.ensemble >= r.write_quorum && r.write_quorum >= r.ack_quorum && r.ack_quorum >= 1) {
            return Err(invalid(
                "ack_quorum",
                format!(
                    "need ensemble_size >= write_quorum >= ack_quorum >= 1, got {}/{}/{}",
                    r.ensemble, r.write_quorum, r.ack_quorum
                ),
            ));
        }
        if !(2..=crate::ownership::bundles::BUNDLES_MAX).contains(&self.bundle_split_bundles_max) {
            return Err(invalid(
                "bundle_split_bundles_max",
                format!(
                    "must be within 2..={}",
                    crate::ownership::bundles::BUNDLES_MAX
                ),
            ));
        }
        if self.message_bytes_max == 0 || self.message_bytes_max > MESSAGE_BYTES_MAX_LIMIT {
            return Err(invalid(
                "message_bytes_max",
                format!("must be within 1..={MESSAGE_BYTES_MAX_LIMIT}"),
            ));
        }
        for (key, v) in [
            (
                "pending_publishes_per_connection_max",
                self.pending_publishes_per_connection_max,
            ),
            ("producers_per_topic_max", self.producers_per_topic_max),
            (
                "consumers_per_subscription_max",
                self.consumers_per_subscription_max,
            ),
            ("connections_per_ip_max", self.connections_per_ip_max),
            ("connections_max", self.connections_max),
            (
                "handles_per_connection_max",
                self.handles_per_connection_max,
            ),
            ("outbound_queue_max", self.outbound_queue_max),
            ("topics_loaded_max", self.topics_loaded_max),
            ("dedup_producers_max", self.dedup_producers_max),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if self.default_num_partitions == 0
            || self.default_num_partitions > crate::partitioned::PARTITIONS_MAX
        {
            return Err(invalid(
                "default_num_partitions",
                format!("must be within 1..={}", crate::partitioned::PARTITIONS_MAX),
            ));
        }
        if self.dedup_snapshot_entries == 0 {
            return Err(invalid("dedup_snapshot_entries", "must be at least 1"));
        }
        if self.dedup_snapshot_interval_s == 0 {
            return Err(invalid("dedup_snapshot_interval_s", "must be at least 1"));
        }
        self.broker_tls_addr()?;
        self.https_addr()?;
        if let Some(files) = self.tls_files() {
            if files.cert.as_os_str().is_empty() || files.key.as_os_str().is_empty() {
                return Err(invalid(
                    "tls_cert_file",
                    "a TLS port is configured: tls_cert_file and tls_key_file are needed",
                ));
            }
            crate::tls::server_config(&files)
                .map_err(|e| invalid("tls_cert_file", e.to_string()))?;
        }
        if self.tls_reload_interval_ms == 0 {
            return Err(invalid("tls_reload_interval_ms", "must be at least 1"));
        }
        if self.auth_refresh_timeout_s == 0 {
            return Err(invalid("auth_refresh_timeout_s", "must be at least 1"));
        }
        if let Err(e) = crate::auth::Authenticator::from_settings(&self.auth_settings()) {
            let key = if self.auth_clock_skew_s > crate::auth::CLOCK_SKEW_S_MAX {
                "auth_clock_skew_s"
            } else if !self.auth_public_key.is_empty() {
                "auth_public_key"
            } else {
                "auth_secret_key"
            };
            return Err(invalid(key, e.to_string()));
        }
        if self.keep_alive_interval_s == 0 {
            return Err(invalid("keep_alive_interval_s", "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.standalone_disk_usage_threshold) {
            return Err(invalid(
                "standalone_disk_usage_threshold",
                "must be within 0.0..=1.0",
            ));
        }
        Ok(())
    }

    /// The per-tenant dispatch read queues' settings.
    pub fn dispatch_read_config(&self) -> cms_bookie::fair::SchedConfig {
        cms_bookie::fair::SchedConfig {
            in_flight_max: self.dispatch_reads_in_flight_max,
            key_in_flight_max: self.dispatch_reads_per_tenant_in_flight_max,
            key_in_flight_bytes_max: self.dispatch_read_bytes_per_tenant_in_flight_max,
            key_queue_requests_max: self.dispatch_read_queue_requests_per_tenant_max,
            key_queue_bytes_max: self.dispatch_read_queue_bytes_per_tenant_max,
            ..crate::managed_ledger::io::DispatchReads::default_config()
        }
    }

    /// Producer de-duplication settings of topics.
    pub fn dedup_config(&self) -> crate::dedup::DedupConfig {
        crate::dedup::DedupConfig {
            enabled_default: self.broker_deduplication_enabled,
            snapshot_entries: self.dedup_snapshot_entries,
            snapshot_interval_ms: self.dedup_snapshot_interval_s.saturating_mul(1000),
            producers_max: self.dedup_producers_max,
        }
    }

    /// E/Qw/Qa with the mode's defaults filled in for zeros.
    pub fn replication(&self, mode: Mode) -> Replication {
        let (e, w, a) = match mode {
            Mode::Cluster => (3, 3, 2),
            Mode::Standalone => (1, 1, 1),
        };
        let pick = |v: usize, d: usize| if v == 0 { d } else { v };
        Replication {
            ensemble: pick(self.ensemble_size, e),
            write_quorum: pick(self.write_quorum, w),
            ack_quorum: pick(self.ack_quorum, a),
        }
    }

    /// The metadata store URL of `serve`.
    pub fn metadata_url(&self) -> Result<MetadataUrl, InvalidConfig> {
        self.metadata_url
            .parse()
            .map_err(|reason: String| invalid("metadata_url", reason))
    }

    /// The ZooKeeper session and operation timeouts.
    pub fn zk_options(&self) -> ZkOptions {
        ZkOptions {
            session_timeout_ms: self.metadata_session_timeout_ms,
            connect_timeout_ms: self.metadata_operation_timeout_ms,
            operation_timeout_ms: self.metadata_operation_timeout_ms,
        }
    }

    /// The plaintext Pulsar listen address; None when `broker_bind` is
    /// empty (allowed only with `broker_tls_bind`: plaintext off).
    pub fn broker_addr_opt(&self) -> Result<Option<SocketAddr>, InvalidConfig> {
        if self.broker_bind.trim().is_empty() {
            if self.broker_tls_bind.trim().is_empty() {
                return Err(invalid(
                    "broker_bind",
                    "may be empty (plaintext off) only when broker_tls_bind is set",
                ));
            }
            return Ok(None);
        }
        self.broker_addr().map(Some)
    }

    /// The plaintext HTTP listen address; None when `http_bind` is empty
    /// (allowed only with `https_bind`: plaintext off).
    pub fn http_addr_opt(&self) -> Result<Option<SocketAddr>, InvalidConfig> {
        if self.http_bind.trim().is_empty() {
            if self.https_bind.trim().is_empty() {
                return Err(invalid(
                    "http_bind",
                    "may be empty (plaintext off) only when https_bind is set",
                ));
            }
            return Ok(None);
        }
        self.http_addr().map(Some)
    }

    /// The Pulsar protocol listen address.
    pub fn broker_addr(&self) -> Result<SocketAddr, InvalidConfig> {
        self.broker_bind
            .parse()
            .map_err(|e| invalid("broker_bind", format!("{:?}: {e}", self.broker_bind)))
    }

    /// The HTTP listen address.
    pub fn http_addr(&self) -> Result<SocketAddr, InvalidConfig> {
        self.http_bind
            .parse()
            .map_err(|e| invalid("http_bind", format!("{:?}: {e}", self.http_bind)))
    }

    /// The host clients are told to use, given the bound address.
    pub fn advertised_host(&self, bound: SocketAddr) -> String {
        if !self.advertised_address.is_empty() {
            return self.advertised_address.clone();
        }
        if bound.ip().is_unspecified() {
            "127.0.0.1".into()
        } else {
            bound.ip().to_string()
        }
    }

    /// Largest frame accepted from a client: the message limit plus padding.
    pub fn frame_bytes_max(&self) -> usize {
        self.message_bytes_max.saturating_add(FRAME_PADDING_BYTES)
    }

    /// Absolute data directory (standalone).
    pub fn data_dir_abs(&self) -> PathBuf {
        absolute(&self.data_dir)
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Command, FromArgMatches};

    fn defaults() -> BrokerConfig {
        let m = BrokerConfig::augment_args(Command::new("t"))
            .try_get_matches_from(["t"])
            .unwrap();
        BrokerConfig::from_arg_matches(&m).unwrap()
    }

    #[test]
    fn plaintext_ports_may_be_off_only_with_their_tls_twin() {
        let mut c = defaults();
        c.broker_bind = String::new();
        assert_eq!(c.validate(Mode::Standalone).unwrap_err().key, "broker_bind");
        c.broker_tls_bind = "127.0.0.1:6651".into();
        assert_eq!(c.broker_addr_opt(), Ok(None));
        let mut c = defaults();
        c.http_bind = String::new();
        assert_eq!(c.validate(Mode::Standalone).unwrap_err().key, "http_bind");
        c.https_bind = "127.0.0.1:8443".into();
        assert_eq!(c.http_addr_opt(), Ok(None));
    }

    #[test]
    fn defaults_are_valid_in_both_modes() {
        let c = defaults();
        c.validate(Mode::Cluster).unwrap();
        c.validate(Mode::Standalone).unwrap();
        assert_eq!(c.broker_addr().unwrap().port(), 6650);
        assert_eq!(c.http_addr().unwrap().port(), 8080);
        assert_eq!(c.message_bytes_max, 5 * 1024 * 1024);
        assert_eq!(c.keep_alive_interval_s, 30);
    }

    #[test]
    fn replication_defaults_depend_on_the_mode() {
        let mut c = defaults();
        let r = |e, w, a| Replication {
            ensemble: e,
            write_quorum: w,
            ack_quorum: a,
        };
        assert_eq!(c.replication(Mode::Cluster), r(3, 3, 2));
        assert_eq!(c.replication(Mode::Standalone), r(1, 1, 1));
        c.ensemble_size = 5;
        assert_eq!(c.replication(Mode::Cluster), r(5, 3, 2));
        c.ack_quorum = 4;
        let e = c.validate(Mode::Cluster).unwrap_err();
        assert_eq!(e.key, "ack_quorum");
    }

    #[test]
    fn bad_values_name_their_key() {
        type Edit = Box<dyn Fn(&mut BrokerConfig)>;
        let table: Vec<(&str, Edit)> = vec![
            ("broker_bind", Box::new(|c| c.broker_bind = "nope".into())),
            ("http_bind", Box::new(|c| c.http_bind = "1.2.3.4".into())),
            ("metadata_url", Box::new(|c| c.metadata_url = "x://".into())),
            ("message_bytes_max", Box::new(|c| c.message_bytes_max = 0)),
            (
                "message_bytes_max",
                Box::new(|c| c.message_bytes_max = 8 * 1024 * 1024),
            ),
            (
                "pending_publishes_per_connection_max",
                Box::new(|c| c.pending_publishes_per_connection_max = 0),
            ),
            (
                "keep_alive_interval_s",
                Box::new(|c| c.keep_alive_interval_s = 0),
            ),
            ("worker_threads", Box::new(|c| c.worker_threads = 1025)),
            (
                "dispatch_read_bytes_max",
                Box::new(|c| c.dispatch_read_bytes_max = 1023),
            ),
            (
                "dispatch_read_budget_ms",
                Box::new(|c| c.dispatch_read_budget_ms = 0),
            ),
            (
                "dispatch_read_budget_ms",
                Box::new(|c| c.dispatch_read_budget_ms = 101),
            ),
        ];
        for (key, f) in table {
            let mut c = defaults();
            f(&mut c);
            assert_eq!(c.validate(Mode::Cluster).unwrap_err().key, key);
        }
    }

    #[test]
    fn advertised_host_defaults_to_the_bind_host() {
        let mut c = defaults();
        assert_eq!(
            c.advertised_host("0.0.0.0:6650".parse().unwrap()),
            "127.0.0.1"
        );
        assert_eq!(
            c.advertised_host("10.1.2.3:6650".parse().unwrap()),
            "10.1.2.3"
        );
        c.advertised_address = "broker-0.example".into();
        assert_eq!(
            c.advertised_host("0.0.0.0:6650".parse().unwrap()),
            "broker-0.example"
        );
    }
}
