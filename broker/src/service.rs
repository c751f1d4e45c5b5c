//! The broker service: shared state ([`BrokerState`]), start-up (metadata,
//! ledger client, registration under `/cms/brokers`), the TCP accept loop
//! of the Pulsar port with its connection limits, the HTTP server, and the
//! orderly shutdown (stop accepting, close topics so cursors are persisted,
//! deregister).
//!
//! Promises: a connection over `connections_max` or over
//! `connections_per_ip_max` for its address is closed at once and counted;
//! one connection's failure never touches another (each runs in its own
//! task, invariant 9); on shutdown every loaded topic is closed before
//! `run` returns.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cms_bookie::client::driver::{LedgerClient, LedgerClientOptions};
use cms_bookie::metadata::layout::{Layout, read_cluster};
use cms_bookie::metadata::{CreateMode, Expected, MetadataStore, join};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{BrokerConfig, Mode, Replication};
use crate::managed_ledger::io::{EntryCache, ManagedLedgerConfig};
use crate::metrics::BrokerMetrics;
use crate::ownership::load::Registration;
use crate::ownership::{Ownership, OwnershipConfig};
use crate::topics::{TopicContext, Topics};

/// Bound on releasing this broker's bundles at shutdown, in milliseconds.
pub const DRAIN_TIMEOUT_MS: u64 = 30_000;

/// Why the broker could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A configuration value cannot work.
    #[error(transparent)]
    Config(#[from] crate::config::InvalidConfig),
    /// The metadata store failed or is not initialised.
    #[error("metadata store: {0}")]
    Metadata(String),
    /// The ledger client could not start.
    #[error("ledger client: {0}")]
    Ledger(String),
    /// Binding or serving failed.
    #[error("{0}")]
    Io(String),
}

/// What every connection and handler of the broker shares.
pub struct BrokerState {
    /// Configuration.
    pub config: BrokerConfig,
    /// Cluster or standalone.
    pub mode: Mode,
    /// E/Qw/Qa of new ledgers.
    pub replication: Replication,
    /// The metadata layout.
    pub layout: Layout,
    /// The metadata store.
    pub store: Arc<dyn MetadataStore>,
    /// The ledger client.
    pub client: LedgerClient,
    /// Loaded topics.
    pub topics: Arc<Topics>,
    /// Bundle ownership (a no-op in standalone).
    pub ownership: Arc<Ownership>,
    /// Metrics.
    pub metrics: BrokerMetrics,
    /// Tenant / namespace quotas (docs/quotas.md).
    pub quota: Arc<crate::quota_io::QuotaService>,
    /// The registry behind `/metrics`.
    pub registry: prometheus::Registry,
    /// Cluster name (from `/cms/cluster`).
    pub cluster_name: String,
    /// `pulsar://<advertised host>:<port>`: what LOOKUP answers.
    pub service_url: String,
    /// `http://<advertised host>:<port>`.
    pub http_url: String,
    /// `pulsar+ssl://<advertised host>:<port>` when the TLS port is on.
    pub service_url_tls: Option<String>,
    /// `https://<advertised host>:<port>` when the HTTPS port is on.
    pub http_url_tls: Option<String>,
    /// Token authentication and authorization; None = off (everyone may do
    /// everything, as before security was configured).
    pub auth: Option<Arc<crate::auth::Authenticator>>,
    producer_name_prefix: String,
    producer_seq: AtomicU64,
    conn_seq: AtomicU64,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    open_connections: AtomicU64,
    serving: AtomicBool,
    shutdown: watch::Sender<bool>,
}

impl std::fmt::Debug for BrokerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerState")
            .field("service_url", &self.service_url)
            .finish_non_exhaustive()
    }
}

impl BrokerState {
    /// A new producer name unique in the cluster: `<cluster>-<broker incarnation>-<n>`.
    pub fn next_producer_name(&self) -> String {
        let n = self.producer_seq.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.producer_name_prefix)
    }

    /// A new connection id (process-unique).
    pub fn next_connection_id(&self) -> u64 {
        self.conn_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether the broker accepts work (started, not shutting down).
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// A receiver that turns `true` when the broker shuts down.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    fn lock_ips(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.per_ip.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection from `ip` under the limits.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ConnectionSlot> {
        let total = self.open_connections.load(Ordering::Acquire);
        if total >= self.config.connections_max as u64 {
            return None;
        }
        let mut ips = self.lock_ips();
        let n = ips.entry(ip).or_insert(0);
        if *n >= self.config.connections_per_ip_max {
            return None;
        }
        *n += 1;
        self.open_connections.fetch_add(1, Ordering::AcqRel);
        self.metrics.connections.inc();
        Some(ConnectionSlot {
            state: self.clone(),
            ip,
        })
    }
}

/// A connection's place under the limits; released on drop.
pub struct ConnectionSlot {
    state: Arc<BrokerState>,
    ip: IpAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut ips = self.state.lock_ips();
        if let Some(n) = ips.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                ips.remove(&self.ip);
            }
        }
        drop(ips);
        self.state.open_connections.fetch_sub(1, Ordering::AcqRel);
        self.state.metrics.connections.dec();
    }
}

/// The ledger client options of the broker.
pub fn ledger_client_options() -> LedgerClientOptions {
    LedgerClientOptions::default()
}

/// Addresses actually bound (useful with port 0).
#[derive(Debug, Clone, Copy)]
pub struct BoundAddrs {
    /// Pulsar protocol.
    pub broker: SocketAddr,
    /// HTTP.
    pub http: SocketAddr,
}

/// Runs the broker over `store` until `shutdown` resolves, then closes every
/// topic and returns. `on_bound` is told the bound addresses once serving.
pub async fn run(
    config: BrokerConfig,
    mode: Mode,
    store: Arc<dyn MetadataStore>,
    shutdown: impl Future<Output = ()> + Send,
    on_bound: impl FnOnce(BoundAddrs) + Send,
) -> Result<(), BrokerError> {
    config.validate(mode)?;
    let layout =
        Layout::new(&config.metadata_root).map_err(|e| BrokerError::Metadata(e.to_string()))?;
    let auth = crate::auth::Authenticator::from_settings(&config.auth_settings())
        .map_err(|e| {
            BrokerError::Config(crate::config::InvalidConfig {
                key: "auth_secret_key".into(),
                reason: e.to_string(),
            })
        })?
        .map(Arc::new);
    // Every metadata call of this broker (ownership, policies, ledger
    // metadata through the ledger client) is timed: cms_metadata_store_*.
    let registry = prometheus::Registry::new();
    let store = cms_bookie::metadata::metered::MeteredStore::wrap(
        store,
        cms_bookie::metadata::metered::StoreMetrics::new(&registry)
            .map_err(|e| BrokerError::Io(e.to_string()))?,
    );
    let cluster = read_cluster(&*store, &layout).await.map_err(|e| {
        BrokerError::Metadata(format!(
            "{e} (run `cms-broker init-cluster` against this store first)"
        ))
    })?;
    // An empty plaintext bind (allowed only with its TLS twin) = port off.
    let broker_listener = match config.broker_addr_opt()? {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .map_err(|e| BrokerError::Io(format!("binding {}: {e}", config.broker_bind)))?,
        ),
        None => None,
    };
    let http_listener = match config.http_addr_opt()? {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .map_err(|e| BrokerError::Io(format!("binding HTTP {}: {e}", config.http_bind)))?,
        ),
        None => None,
    };
    let tls = match config.tls_files() {
        Some(files) => Some(crate::tls::ReloadingTls::load(files).map_err(|e| {
            BrokerError::Config(crate::config::InvalidConfig {
                key: "tls_cert_file".into(),
                reason: e.to_string(),
            })
        })?),
        None => None,
    };
    let broker_tls_listener = match config.broker_tls_addr()? {
        Some(a) => Some(TcpListener::bind(a).await.map_err(|e| {
            BrokerError::Io(format!("binding TLS {}: {e}", config.broker_tls_bind))
        })?),
        None => None,
    };
    let https_listener =
        match config.https_addr()? {
            Some(a) => Some(TcpListener::bind(a).await.map_err(|e| {
                BrokerError::Io(format!("binding HTTPS {}: {e}", config.https_bind))
            })?),
            None => None,
        };
    let addr_of = |l: &Option<TcpListener>| -> Result<Option<SocketAddr>, BrokerError> {
        l.as_ref()
            .map(|l| l.local_addr().map_err(|e| BrokerError::Io(e.to_string())))
            .transpose()
    };
    // The primary address of each protocol: plaintext when on, else TLS
    // (validation guarantees one of each).
    let (broker_addr, broker_scheme) =
        match (addr_of(&broker_listener)?, addr_of(&broker_tls_listener)?) {
            (Some(a), _) => (a, "pulsar"),
            (None, Some(a)) => (a, "pulsar+ssl"),
            (None, None) => {
                return Err(BrokerError::Io("no Pulsar protocol port configured".into()));
            }
        };
    let (http_addr, http_scheme) = match (addr_of(&http_listener)?, addr_of(&https_listener)?) {
        (Some(a), _) => (a, "http"),
        (None, Some(a)) => (a, "https"),
        (None, None) => return Err(BrokerError::Io("no HTTP port configured".into())),
    };
    let host = config.advertised_host(broker_addr);
    let service_url = format!("{broker_scheme}://{host}:{}", broker_addr.port());
    let http_url = format!(
        "{http_scheme}://{}:{}",
        config.advertised_host(http_addr),
        http_addr.port()
    );

    // The TLS twins, advertised in the registration and in lookups.
    let service_url_tls = addr_of(&broker_tls_listener)?
        .map(|a| format!("pulsar+ssl://{}:{}", config.advertised_host(a), a.port()));
    let http_url_tls = addr_of(&https_listener)?
        .map(|a| format!("https://{}:{}", config.advertised_host(a), a.port()));

    let defaults = ledger_client_options();
    let client_options = LedgerClientOptions {
        sticky_reads: config.sticky_reads,
        writer: cms_bookie::client::writer::WriterConfig {
            explicit_lac_interval_ms: config.explicit_lac_interval_ms,
            ..defaults.writer.clone()
        },
        metrics: Some(
            cms_bookie::client::driver::metrics::ClientMetrics::new(&registry)
                .map_err(|e| BrokerError::Io(e.to_string()))?,
        ),
        ..defaults
    };
    let client = LedgerClient::connect(store.clone(), layout.clone(), client_options)
        .await
        .map_err(|e| BrokerError::Ledger(e.to_string()))?;

    // Registration: an ephemeral sequential node; its number makes producer
    // names unique across broker restarts.
    let reg = serde_json::to_string(&Registration {
        service_url: service_url.clone(),
        web_service_url: http_url.clone(),
        service_url_tls: service_url_tls.clone(),
        web_service_url_tls: http_url_tls.clone(),
        cluster: cluster.name.clone(),
        ..Registration::default()
    })
    .map_err(|e| BrokerError::Io(e.to_string()))?;
    store
        .create_all(&layout.brokers())
        .await
        .map_err(|e| BrokerError::Metadata(e.to_string()))?;
    let (reg_path, _) = store
        .create(
            &join(
                &layout.brokers(),
                &format!("{host}:{}-", broker_addr.port()),
            ),
            reg.as_bytes(),
            CreateMode::EphemeralSequential,
        )
        .await
        .map_err(|e| BrokerError::Metadata(format!("registering the broker: {e}")))?;
    let incarnation = reg_path
        .rsplit('-')
        .next()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);

    let metrics = BrokerMetrics::new(&registry).map_err(|e| BrokerError::Io(e.to_string()))?;
    let replication = config.replication(mode);
    let ml_config = ManagedLedgerConfig {
        ensemble_size: replication.ensemble,
        write_quorum: replication.write_quorum,
        ack_quorum: replication.ack_quorum,
        read_ahead_bytes_max: config.dispatch_read_bytes_max,
        dispatch_reads: crate::managed_ledger::io::DispatchReads::new(
            config.dispatch_read_config(),
            cms_bookie::fair::FairMetrics::new(&registry, "cms_broker_dispatch_read")
                .map_err(|e| BrokerError::Io(e.to_string()))?,
        ),
        ..ManagedLedgerConfig::default()
    };
    let topics = Topics::new(TopicContext {
        client: client.clone(),
        store: store.clone(),
        layout: layout.clone(),
        ml_config,
        cache: EntryCache::new(config.entry_cache_bytes_max),
        metrics: metrics.clone(),
        allow_auto_topic_creation: config.allow_auto_topic_creation,
        producers_per_topic_max: config.producers_per_topic_max,
        topics_loaded_max: config.topics_loaded_max,
        tick_interval_ms: config.topic_tick_interval_ms,
        dedup: config.dedup_config(),
    });
    registry
        .register(Box::new(
            crate::topic_metrics::TopicCollector::new(topics.clone(), config.metrics_topic_level)
                .map_err(|e| BrokerError::Io(e.to_string()))?,
        ))
        .map_err(|e| BrokerError::Io(e.to_string()))?;
    let broker_id = reg_path.rsplit('/').next().unwrap_or_default().to_string();
    let ownership = Ownership::new(
        OwnershipConfig {
            enabled: mode == Mode::Cluster,
            broker_id: broker_id.clone(),
            registration_path: reg_path.clone(),
            service_url: service_url.clone(),
            http_url: http_url.clone(),
            service_url_tls: service_url_tls.clone(),
            http_url_tls: http_url_tls.clone(),
            cluster: cluster.name.clone(),
            // The granted timeout can be lower than the requested one.
            session_timeout_ms: store
                .negotiated_session_timeout_ms()
                .map_or(config.metadata_session_timeout_ms, |n| {
                    n.min(config.metadata_session_timeout_ms)
                }),
            load_report_interval_ms: config.load_report_interval_ms,
            split_topics_max: config.bundle_split_topics_max,
            split_check_interval_ms: config.bundle_split_check_interval_ms,
            split_bundles_max: config.bundle_split_bundles_max,
        },
        store.clone(),
        layout.clone(),
        topics.clone(),
        metrics.clone(),
    );
    topics.set_ownership(&ownership);
    ownership.start();
    let mut fatal = ownership.fatal_signal();
    let quota = crate::quota_io::QuotaService::new(broker_id, store.clone(), layout.clone());
    let state = Arc::new(BrokerState {
        config,
        mode,
        replication,
        layout,
        store: store.clone(),
        client,
        topics: topics.clone(),
        ownership: ownership.clone(),
        metrics,
        quota,
        registry,
        cluster_name: cluster.name.clone(),
        service_url: service_url.clone(),
        http_url: http_url.clone(),
        service_url_tls,
        http_url_tls,
        auth,
        producer_name_prefix: format!("{}-{incarnation}", cluster.name),
        producer_seq: AtomicU64::new(0),
        conn_seq: AtomicU64::new(1),
        per_ip: Mutex::new(HashMap::new()),
        open_connections: AtomicU64::new(0),
        serving: AtomicBool::new(false),
        shutdown: watch::channel(false).0,
    });

    tokio::spawn(crate::policy_refresh::run(
        topics.clone(),
        store.clone(),
        state.layout.clone(),
        state.shutdown_signal(),
    ));

    tokio::spawn(crate::quota_io::run(
        state.quota.clone(),
        topics.clone(),
        state.shutdown_signal(),
    ));

    tokio::spawn(crate::metrics::run_lag_probe(
        state.metrics.runtime_lag.clone(),
        state.shutdown_signal(),
    ));

    let mut stop_http = state.shutdown_signal();
    let router = crate::http::router(state.clone());
    let http = tokio::spawn(async move {
        match http_listener {
            Some(l) => {
                axum::serve(l, router)
                    .with_graceful_shutdown(async move {
                        let _ = stop_http.wait_for(|s| *s).await;
                    })
                    .await
            }
            None => Ok(()),
        }
    });

    let mut https = None;
    if let Some(tls) = &tls {
        tls.spawn_reloader(
            Duration::from_millis(state.config.tls_reload_interval_ms),
            state.shutdown_signal(),
        );
        if let Some(l) = https_listener {
            let addr = l.local_addr().map_err(|e| BrokerError::Io(e.to_string()))?;
            let listener = crate::tls::HttpsListener::new(l, tls.clone())
                .map_err(|e| BrokerError::Io(e.to_string()))?;
            // Requests over HTTPS are marked so redirects stay on HTTPS.
            let router =
                crate::http::router(state.clone()).layer(axum::Extension(crate::http::OverTls));
            let mut stop = state.shutdown_signal();
            info!(https = %addr, "HTTPS serving");
            https = Some(tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await
            }));
        }
        if let Some(l) = broker_tls_listener {
            if let Ok(a) = l.local_addr() {
                info!(broker_tls = %a, "Pulsar protocol over TLS serving");
            }
            tokio::spawn(tls_accept_loop(state.clone(), l, tls.clone()));
        }
    }

    state.serving.store(true, Ordering::Release);
    info!(
        broker = %broker_addr,
        http = %http_addr,
        service_url = %service_url,
        cluster = %cluster.name,
        mode = ?mode,
        "broker serving"
    );
    on_bound(BoundAddrs {
        broker: broker_addr,
        http: http_addr,
    });

    let accept = async {
        match broker_listener {
            Some(l) => accept_loop(state.clone(), l).await,
            // Plaintext off: only the TLS accept loop serves.
            None => std::future::pending().await,
        }
    };
    tokio::pin!(accept);
    let mut expired = false;
    tokio::select! {
        _ = shutdown => info!("shutting down: releasing bundles, closing topics"),
        r = &mut accept => warn!(result = ?r, "accept loop ended"),
        _ = fatal.wait_for(|f| *f) => {
            expired = true;
            warn!("metadata session expired: shutting down");
        }
    }
    state.serving.store(false, Ordering::Release);
    // Bundles first (clients are told to reconnect while this broker still
    // answers their lookups with "being unloaded"), then the rest.
    if tokio::time::timeout(Duration::from_millis(DRAIN_TIMEOUT_MS), ownership.drain())
        .await
        .is_err()
    {
        warn!(
            "releasing bundles took longer than {DRAIN_TIMEOUT_MS} ms; the rest go with the session"
        );
    }
    state.shutdown.send_replace(true);
    topics.close_all().await;
    ownership.stop();
    if let Err(e) = store.delete(&reg_path, Expected::Any).await {
        warn!(error = %e, "deregistering the broker");
    }
    if let Some(h) = https
        && tokio::time::timeout(Duration::from_secs(5), h)
            .await
            .is_err()
    {
        warn!("HTTPS server did not stop in 5 s");
    }
    match tokio::time::timeout(Duration::from_secs(5), http).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => warn!(error = %e, "HTTP server"),
        Ok(Err(e)) => warn!(error = %e, "HTTP task"),
        Err(_) => warn!("HTTP server did not stop in 5 s"),
    }
    info!("broker stopped");
    if expired {
        return Err(BrokerError::Metadata(
            "the metadata session expired; ownership was given up".into(),
        ));
    }
    Ok(())
}

/// The `pulsar+ssl://` accept loop: same connection limits as the
/// plaintext port; each handshake (bounded) runs in the connection's task.
async fn tls_accept_loop(
    state: Arc<BrokerState>,
    listener: TcpListener,
    tls: Arc<crate::tls::ReloadingTls>,
) {
    let mut stop = state.shutdown_signal();
    loop {
        let (stream, peer) = tokio::select! {
            _ = crate::connection::wait_true(&mut stop) => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warn!(error = %e, "TLS accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        state.metrics.connections_opened.inc();
        let Some(slot) = state.admit(peer.ip()) else {
            state.metrics.connections_refused.inc();
            warn!(peer = %peer, "TLS connection refused: connection limit reached");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let acceptor = tls.acceptor();
        tokio::spawn(async move {
            match crate::tls::handshake(acceptor, stream).await {
                Ok(s) => crate::connection::serve_tls(state, s, peer).await,
                Err(e) => {
                    state.metrics.connections_bad_input.inc();
                    info!(peer = %peer, error = %e, "TLS handshake failed");
                }
            }
            drop(slot);
        });
    }
}

async fn accept_loop(state: Arc<BrokerState>, listener: TcpListener) -> std::io::Result<()> {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        state.metrics.connections_opened.inc();
        let Some(slot) = state.admit(peer.ip()) else {
            state.metrics.connections_refused.inc();
            warn!(peer = %peer, "connection refused: connection limit reached");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            crate::connection::serve(state, stream, peer).await;
            drop(slot);
        });
    }
}
