//! [`Client`]: the entry point. Holds the service URL, the options, one
//! [`Connection`] per broker (re-created when it closes) and the id counters.
//! Cheap to clone; `Send + Sync`. Lookups follow redirects (at most
//! [`REDIRECTS_MAX`]) and answer the broker that owns a topic. With a
//! `pulsar+ssl://` service URL every connection is TLS and lookups follow
//! the brokers' `brokerServiceUrlTls`, as Pulsar clients do.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::connection::Connection;
use super::consumer::{ConsumerBuilder, ReaderBuilder};
use super::error::{Error, Result};
use super::producer::ProducerBuilder;
use super::tls::TlsOptions;
use super::url::{BrokerAddr, ServiceUrl, broker_addr};
use crate::proto::commands;
use crate::proto::pulsar::command_lookup_topic_response::LookupType;
use crate::proto::pulsar::command_partitioned_topic_metadata_response::LookupType as PmLookupType;

/// Most lookup redirects followed for one topic.
pub const REDIRECTS_MAX: usize = 20;

/// Client options (see [`ClientBuilder`]).
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) operation_timeout: Duration,
    pub(crate) connection_timeout: Duration,
    pub(crate) keep_alive: Duration,
    pub(crate) backoff_initial: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) token: Option<Secret>,
    pub(crate) tls: TlsOptions,
}

/// A credential that `Debug` does not print.
#[derive(Clone)]
pub(crate) struct Secret(pub(crate) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: String,
    opts: Options,
}

impl ClientBuilder {
    /// Timeout of each request (lookup, create producer, subscribe...). Default 30 s.
    pub fn operation_timeout(mut self, d: Duration) -> Self {
        self.opts.operation_timeout = d;
        self
    }
    /// TCP connect timeout. Default 10 s.
    pub fn connection_timeout(mut self, d: Duration) -> Self {
        self.opts.connection_timeout = d;
        self
    }
    /// PING interval; a connection silent for two intervals is closed. Default 30 s.
    pub fn keep_alive(mut self, d: Duration) -> Self {
        self.opts.keep_alive = d.max(Duration::from_millis(100));
        self
    }
    /// Reconnect backoff of producers and consumers: first delay and cap,
    /// each delay doubling from the first and jittered into its upper half.
    /// Default 100 ms .. 1 s (as Kafka's clients; Pulsar's use 60 s): after
    /// a broker dies its topics move once its metadata session expires, and
    /// a producer whose tries failed fast meanwhile waits at most the cap
    /// before the next (with a 30 s cap the doubling reaches 3.2-6.4 s
    /// within a 4 s session). Raise it to spread a very large fleet's
    /// reconnects more thinly.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.opts.backoff_initial = initial;
        self.opts.backoff_max = max;
        self
    }
    /// Token authentication: CONNECT carries `auth_method_name = "token"`
    /// and the token (also the answer to an AUTH_CHALLENGE).
    pub fn auth_token(mut self, token: impl Into<String>) -> Self {
        self.opts.token = Some(Secret(token.into()));
        self
    }
    /// `pulsar+ssl://`: the PEM file of the CAs the brokers' certificates
    /// must chain to (Pulsar's `tlsTrustCertsFilePath`). Without it, the
    /// system's trusted roots.
    pub fn tls_trust_certs_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.opts.tls.trust_certs_file = Some(path.into());
        self
    }
    /// `pulsar+ssl://`: accept any broker certificate (Pulsar's
    /// `tlsAllowInsecureConnection`). Off by default; for tests only.
    pub fn tls_allow_insecure_connection(mut self, allow: bool) -> Self {
        self.opts.tls.allow_insecure_connection = allow;
        self
    }
    /// `pulsar+ssl://`: the broker's certificate must name the host
    /// connected to (Pulsar's `tlsValidateHostname`). On by default.
    pub fn tls_validate_hostname(mut self, validate: bool) -> Self {
        self.opts.tls.validate_hostname = validate;
        self
    }
    /// Validates the URL (and, for `pulsar+ssl://`, loads the trust file)
    /// and builds the client (no network I/O yet).
    pub fn build(self) -> Result<Client> {
        let url = ServiceUrl::parse(&self.url)?;
        let tls = if url.tls {
            Some(super::tls::client_config(&self.opts.tls)?)
        } else {
            None
        };
        Ok(Client {
            inner: Arc::new(Inner {
                url,
                tls,
                opts: self.opts,
                conns: tokio::sync::Mutex::new(HashMap::new()),
                next_host: AtomicUsize::new(0),
                ids: AtomicU64::new(1),
            }),
        })
    }
}

struct Inner {
    url: ServiceUrl,
    /// The rustls configuration (`pulsar+ssl://` only).
    tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
    opts: Options,
    conns: tokio::sync::Mutex<HashMap<BrokerAddr, Connection>>,
    next_host: AtomicUsize,
    ids: AtomicU64,
}

impl Drop for Inner {
    /// The last handle (client, producer or consumer) is gone: close the
    /// connections so their tasks end.
    fn drop(&mut self) {
        for (_, c) in self.conns.get_mut().drain() {
            c.close();
        }
    }
}

/// A Pulsar client: creates producers and consumers.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("hosts", &self.inner.url.hosts)
            .finish()
    }
}

impl Client {
    /// A builder for `service_url` (`pulsar://host:port[,host2:port]`).
    pub fn builder(service_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: service_url.into(),
            opts: Options {
                operation_timeout: Duration::from_secs(30),
                connection_timeout: Duration::from_secs(10),
                keep_alive: Duration::from_secs(30),
                backoff_initial: Duration::from_millis(100),
                backoff_max: Duration::from_secs(1),
                token: None,
                tls: TlsOptions::default(),
            },
        }
    }

    /// A client with default options.
    pub fn new(service_url: impl Into<String>) -> Result<Client> {
        Self::builder(service_url).build()
    }

    /// Starts building a producer on `topic`.
    pub fn producer(&self, topic: impl Into<String>) -> ProducerBuilder {
        ProducerBuilder::new(self.clone(), topic.into())
    }

    /// Starts building a consumer on `topic` with `subscription`.
    pub fn consumer(
        &self,
        topic: impl Into<String>,
        subscription: impl Into<String>,
    ) -> ConsumerBuilder {
        ConsumerBuilder::new(self.clone(), topic.into(), subscription.into())
    }

    /// Starts building a reader of `topic` (non-durable, nothing to ack).
    pub fn reader(&self, topic: impl Into<String>) -> ReaderBuilder {
        ReaderBuilder::new(self.clone(), topic.into())
    }

    /// Number of partitions of `topic` (0: not partitioned).
    pub async fn partitions(&self, topic: &str) -> Result<u32> {
        let conn = self.service_connection().await?;
        let rid = self.next_id();
        let r = conn
            .request(rid, commands::partitioned_metadata(topic, rid))
            .await?;
        let r = r
            .partition_metadata_response
            .ok_or_else(|| Error::Protocol("PARTITIONED_METADATA_RESPONSE without body".into()))?;
        if r.response == Some(PmLookupType::Success as i32) {
            Ok(r.partitions.unwrap_or(0))
        } else {
            Err(Error::server(r.error, r.message.unwrap_or_default()))
        }
    }

    /// Closes every connection.
    pub async fn close(&self) {
        let conns: Vec<_> = self
            .inner
            .conns
            .lock()
            .await
            .drain()
            .map(|(_, c)| c)
            .collect();
        for c in conns {
            c.close();
        }
    }

    pub(crate) fn opts(&self) -> &Options {
        &self.inner.opts
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.inner.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// The shared connection to `addr`, opened if needed.
    pub(crate) async fn connection(&self, addr: &BrokerAddr) -> Result<Connection> {
        let mut conns = self.inner.conns.lock().await;
        if let Some(c) = conns.get(addr)
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        let o = &self.inner.opts;
        let c = Connection::connect(
            addr,
            self.inner.tls.as_ref(),
            o.connection_timeout,
            o.operation_timeout,
            o.keep_alive,
            o.token.as_ref().map(|t| t.0.clone()),
        )
        .await?;
        conns.insert(addr.clone(), c.clone());
        Ok(c)
    }

    /// A connection to one of the service URL's hosts (rotating on failure).
    pub(crate) async fn service_connection(&self) -> Result<Connection> {
        let hosts = &self.inner.url.hosts;
        let mut last = None;
        for _ in 0..hosts.len() {
            let i = self.inner.next_host.load(Ordering::Relaxed) % hosts.len();
            let addr = BrokerAddr {
                addr: hosts[i].clone(),
                tls: self.inner.url.tls,
            };
            match self.connection(&addr).await {
                Ok(c) => return Ok(c),
                Err(e) => {
                    self.inner.next_host.fetch_add(1, Ordering::Relaxed);
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or(Error::Closed))
    }

    /// Looks up the broker owning `topic`, following redirects, and returns
    /// the connection to it.
    pub(crate) async fn lookup_connection(&self, topic: &str) -> Result<Connection> {
        let mut conn = self.service_connection().await?;
        let mut authoritative = false;
        for _ in 0..REDIRECTS_MAX {
            let rid = self.next_id();
            let r = conn
                .request(rid, commands::lookup(topic, rid, authoritative))
                .await?;
            let r = r
                .lookup_topic_response
                .ok_or_else(|| Error::Protocol("LOOKUP_RESPONSE without body".into()))?;
            let url = self.lookup_url(&r);
            match r.response.and_then(|t| LookupType::try_from(t).ok()) {
                Some(LookupType::Connect) => {
                    if r.proxy_through_service_url == Some(true) || url.is_empty() {
                        return Ok(conn);
                    }
                    return self.connection(&self.answered_addr(&url)?).await;
                }
                Some(LookupType::Redirect) => {
                    authoritative = r.authoritative.unwrap_or(false);
                    conn = self.connection(&self.answered_addr(&url)?).await?;
                }
                _ => return Err(Error::server(r.error, r.message.unwrap_or_default())),
            }
        }
        Err(Error::TooManyRedirects(topic.to_owned()))
    }

    /// The URL a lookup answer points at: `brokerServiceUrlTls` for a TLS
    /// client (falling back to `brokerServiceUrl` when that one is already
    /// `pulsar+ssl://`, as a broker without a plaintext port answers),
    /// `brokerServiceUrl` otherwise. Empty when the answer names none.
    fn lookup_url(&self, r: &crate::proto::pulsar::CommandLookupTopicResponse) -> String {
        let plain = r.broker_service_url.clone().unwrap_or_default();
        if !self.inner.url.tls {
            return plain;
        }
        match r.broker_service_url_tls.as_deref() {
            Some(t) if !t.is_empty() => t.to_owned(),
            _ => plain,
        }
    }

    /// The broker a lookup answer's `url` names; a TLS client refuses a
    /// plaintext URL rather than silently dropping TLS.
    fn answered_addr(&self, url: &str) -> Result<BrokerAddr> {
        let addr = broker_addr(url)?;
        if self.inner.url.tls && !addr.tls {
            return Err(Error::Tls {
                addr: url.to_owned(),
                reason: "the lookup answered no brokerServiceUrlTls: the broker has no TLS port"
                    .into(),
            });
        }
        Ok(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + Clone>() {}

    #[test]
    fn token_is_not_in_debug_output() {
        let b = Client::builder("pulsar://a:1").auth_token("s3cret-token");
        assert!(!format!("{b:?}").contains("s3cret"));
    }

    #[test]
    fn tls_clients_follow_the_tls_lookup_url_and_never_drop_tls() {
        use crate::proto::pulsar::CommandLookupTopicResponse;
        let tls = Client::builder("pulsar+ssl://a:6651")
            .tls_allow_insecure_connection(true)
            .build()
            .unwrap();
        let plain = Client::new("pulsar://a:6650").unwrap();
        let both = CommandLookupTopicResponse {
            broker_service_url: Some("pulsar://b:6650".into()),
            broker_service_url_tls: Some("pulsar+ssl://b:6651".into()),
            ..Default::default()
        };
        assert_eq!(tls.lookup_url(&both), "pulsar+ssl://b:6651");
        assert_eq!(plain.lookup_url(&both), "pulsar://b:6650");
        let tls_only = CommandLookupTopicResponse {
            broker_service_url: Some("pulsar+ssl://b:6651".into()),
            ..Default::default()
        };
        assert_eq!(tls.lookup_url(&tls_only), "pulsar+ssl://b:6651");
        let plain_only = CommandLookupTopicResponse {
            broker_service_url: Some("pulsar://b:6650".into()),
            ..Default::default()
        };
        let url = tls.lookup_url(&plain_only);
        assert!(matches!(tls.answered_addr(&url), Err(Error::Tls { .. })));
        assert!(tls.answered_addr("pulsar+ssl://b:6651").unwrap().tls);
    }

    #[test]
    fn client_is_send_sync_clone_and_checks_url() {
        assert_send_sync::<Client>();
        assert!(Client::new("pulsar://a:1,b:2").is_ok());
        assert!(matches!(
            Client::new("http://x"),
            Err(Error::InvalidUrl { .. })
        ));
    }
}
