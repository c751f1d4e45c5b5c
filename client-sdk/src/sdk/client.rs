//! [`Client`]: the entry point. Holds the service URL, the options, one
//! [`Connection`] per broker (re-created when it closes) and the id counters.
//! Cheap to clone; `Send + Sync`. Lookups follow redirects (at most
//! [`REDIRECTS_MAX`]) and answer the broker that owns a topic.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::connection::Connection;
use super::consumer::{ConsumerBuilder, ReaderBuilder};
use super::error::{Error, Result};
use super::producer::ProducerBuilder;
use super::url::{ServiceUrl, broker_addr};
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
    /// Reconnect backoff: first delay and cap. Default 100 ms .. 30 s.
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
    /// Validates the URL and builds the client (no I/O yet).
    pub fn build(self) -> Result<Client> {
        let url = ServiceUrl::parse(&self.url)?;
        Ok(Client {
            inner: Arc::new(Inner {
                url,
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
    opts: Options,
    conns: tokio::sync::Mutex<HashMap<String, Connection>>,
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
                backoff_max: Duration::from_secs(30),
                token: None,
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

    /// The shared connection to `addr` (`host:port`), opened if needed.
    pub(crate) async fn connection(&self, addr: &str) -> Result<Connection> {
        let mut conns = self.inner.conns.lock().await;
        if let Some(c) = conns.get(addr)
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        let o = &self.inner.opts;
        let c = Connection::connect(
            addr,
            o.connection_timeout,
            o.operation_timeout,
            o.keep_alive,
            o.token.as_ref().map(|t| t.0.clone()),
        )
        .await?;
        conns.insert(addr.to_owned(), c.clone());
        Ok(c)
    }

    /// A connection to one of the service URL's hosts (rotating on failure).
    pub(crate) async fn service_connection(&self) -> Result<Connection> {
        let hosts = &self.inner.url.hosts;
        let mut last = None;
        for _ in 0..hosts.len() {
            let i = self.inner.next_host.load(Ordering::Relaxed) % hosts.len();
            match self.connection(&hosts[i]).await {
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
            let url = r.broker_service_url.clone().unwrap_or_default();
            match r.response.and_then(|t| LookupType::try_from(t).ok()) {
                Some(LookupType::Connect) => {
                    if r.proxy_through_service_url == Some(true) || url.is_empty() {
                        return Ok(conn);
                    }
                    return self.connection(&broker_addr(&url)?).await;
                }
                Some(LookupType::Redirect) => {
                    authoritative = r.authoritative.unwrap_or(false);
                    conn = self.connection(&broker_addr(&url)?).await?;
                }
                _ => return Err(Error::server(r.error, r.message.unwrap_or_default())),
            }
        }
        Err(Error::TooManyRedirects(topic.to_owned()))
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
    fn client_is_send_sync_clone_and_checks_url() {
        assert_send_sync::<Client>();
        assert!(Client::new("pulsar://a:1,b:2").is_ok());
        assert!(matches!(
            Client::new("http://x"),
            Err(Error::InvalidUrl { .. })
        ));
    }
}
