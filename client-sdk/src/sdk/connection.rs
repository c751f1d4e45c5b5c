//! One TCP (or TLS over TCP) connection to one broker, shared by every producer and consumer
//! of a [`super::Client`] that talks to that broker.
//!
//! A writer task drains a bounded queue of frames (batching writes before a
//! flush); a reader task decodes frames and dispatches them: request answers
//! to the waiting caller by `request_id` (a bounded map; a full map fails the
//! request), send receipts to the producer by `producer_id`, messages to the
//! consumer by `consumer_id`, PING answered with PONG. A keep-alive task
//! sends PING every interval and closes the connection when nothing arrived
//! for two intervals. When the connection ends every waiting request fails
//! with [`Error::Disconnected`] and every registered producer and consumer is
//! told, so it can reconnect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::rustls::ClientConfig;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::error::{Error, Result};
use super::url::BrokerAddr;
use crate::proto::commands;
use crate::proto::frame::{Frame, PayloadFrame, PulsarCodec};
use crate::proto::pulsar::base_command::Type;
use crate::proto::pulsar::{BaseCommand, CommandSendError, CommandSendReceipt};

/// Protocol version announced in CONNECT (the broker clamps to its own).
pub const PROTOCOL_VERSION: i32 = 19;
/// Frames queued for the writer before senders wait.
const WRITE_QUEUE: usize = 4096;
/// Requests awaiting an answer on one connection.
const PENDING_REQUESTS_MAX: usize = 50_000;

/// What a connection tells a producer.
pub(crate) trait ProducerSink: Send + Sync {
    /// SEND_RECEIPT for this producer.
    fn receipt(&self, r: CommandSendReceipt) -> futures::future::BoxFuture<'static, ()>;
    /// SEND_ERROR for this producer.
    fn send_error(&self, e: CommandSendError) -> futures::future::BoxFuture<'static, ()>;
    /// The connection closed or the broker closed the producer.
    fn disconnected(&self, conn_id: u64);
}

/// What a connection tells a consumer.
pub(crate) trait ConsumerSink: Send + Sync {
    /// A MESSAGE for this consumer; waits while the consumer's queue is full.
    fn message(&self, conn_id: u64, frame: PayloadFrame)
    -> futures::future::BoxFuture<'static, ()>;
    /// The connection closed or the broker closed the consumer.
    fn disconnected(&self, conn_id: u64);
}

struct Shared {
    id: u64,
    addr: String,
    closed: AtomicBool,
    pending: Mutex<HashMap<u64, oneshot::Sender<Result<BaseCommand>>>>,
    producers: Mutex<HashMap<u64, Arc<dyn ProducerSink>>>,
    consumers: Mutex<HashMap<u64, Arc<dyn ConsumerSink>>>,
    last_seen: Mutex<Instant>,
}

/// A live connection; cheap to clone.
#[derive(Clone)]
pub(crate) struct Connection {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Frame>,
    op_timeout: Duration,
    token: Option<Arc<str>>,
}

static CONN_IDS: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Connection {
    /// Connects (with a TLS handshake when `broker.tls`, using `tls`),
    /// performs the CONNECT handshake and starts the tasks.
    pub(crate) async fn connect(
        broker: &BrokerAddr,
        tls: Option<&Arc<ClientConfig>>,
        connect_timeout: Duration,
        op_timeout: Duration,
        keep_alive: Duration,
        token: Option<String>,
    ) -> Result<Connection> {
        let shown = broker.to_string();
        let addr = shown.as_str();
        let io_err = |source| Error::Io {
            addr: addr.to_owned(),
            source,
        };
        let stream = tokio::time::timeout(connect_timeout, TcpStream::connect(&broker.addr))
            .await
            .map_err(|_| Error::Timeout(format!("connecting to {addr}")))?
            .map_err(io_err)?;
        let _ = stream.set_nodelay(true);
        let (r, w): (BoxRead, BoxWrite) = if broker.tls {
            let config = tls.ok_or_else(|| Error::Tls {
                addr: addr.to_owned(),
                reason: "a pulsar+ssl:// broker URL but the client has no TLS settings \
                         (use a pulsar+ssl:// service URL)"
                    .into(),
            })?;
            let name = super::tls::server_name(broker.host())?;
            let connector = tokio_rustls::TlsConnector::from(config.clone());
            let s = tokio::time::timeout(connect_timeout, connector.connect(name, stream))
                .await
                .map_err(|_| Error::Timeout(format!("TLS handshake with {addr}")))?
                .map_err(|e| tls_error(addr, e))?;
            let (r, w) = tokio::io::split(s);
            (Box::new(r), Box::new(w))
        } else {
            let (r, w) = stream.into_split();
            (Box::new(r), Box::new(w))
        };
        let mut reader = FramedRead::new(r, PulsarCodec::default());
        let mut writer = FramedWrite::new(w, PulsarCodec::default());
        let handshake = async {
            writer
                .send(Frame::from(connect_command(token.as_deref())))
                .await?;
            match reader.next().await {
                Some(Ok(f)) => {
                    let cmd = f.command();
                    match cmd.r#type() {
                        Type::Connected => Ok(()),
                        Type::Error => {
                            let e = cmd.error.clone().unwrap_or_default();
                            Err(Error::server(Some(e.error), e.message))
                        }
                        other => Err(Error::Protocol(format!(
                            "expected CONNECTED, got {other:?}"
                        ))),
                    }
                }
                Some(Err(e)) => Err(e.into()),
                None => Err(Error::Disconnected(addr.to_owned())),
            }
        };
        tokio::time::timeout(op_timeout, handshake)
            .await
            .map_err(|_| Error::Timeout(format!("CONNECT handshake with {addr}")))?
            .map_err(|e| match e {
                Error::Frame(crate::proto::FrameError::Io(source)) => io_err(source),
                other => other,
            })?;

        let shared = Arc::new(Shared {
            id: CONN_IDS.fetch_add(1, Ordering::Relaxed),
            addr: addr.to_owned(),
            closed: AtomicBool::new(false),
            pending: Mutex::new(HashMap::new()),
            producers: Mutex::new(HashMap::new()),
            consumers: Mutex::new(HashMap::new()),
            last_seen: Mutex::new(Instant::now()),
        });
        let (tx, mut rx) = mpsc::channel::<Frame>(WRITE_QUEUE);
        let conn = Connection {
            shared: shared.clone(),
            tx: tx.clone(),
            op_timeout,
            token: token.map(Arc::from),
        };
        tracing::debug!(addr, conn_id = shared.id, "connected");

        // Writer: feed everything queued, then flush once.
        let wshared = shared.clone();
        tokio::spawn(async move {
            while let Some(f) = rx.recv().await {
                if writer.feed(f).await.is_err() {
                    break;
                }
                let mut ok = true;
                while let Ok(f) = rx.try_recv() {
                    if writer.feed(f).await.is_err() {
                        ok = false;
                        break;
                    }
                }
                if !ok || writer.flush().await.is_err() || wshared.closed.load(Ordering::Acquire) {
                    break;
                }
            }
            close(&wshared);
        });

        // Reader: dispatch until the socket ends.
        let rconn = conn.clone();
        tokio::spawn(async move {
            while let Some(item) = reader.next().await {
                match item {
                    Ok(frame) => {
                        *lock(&rconn.shared.last_seen) = Instant::now();
                        rconn.dispatch(frame).await;
                    }
                    Err(e) => {
                        tracing::warn!(addr = %rconn.shared.addr, error = %e, "bad frame from broker, closing");
                        break;
                    }
                }
                if rconn.shared.closed.load(Ordering::Acquire) {
                    break;
                }
            }
            close(&rconn.shared);
            // Wake the writer so it exits too.
            let _ = rconn.tx.try_send(Frame::from(commands::ping()));
        });

        // Keep-alive.
        let kconn = conn.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(keep_alive);
            tick.tick().await;
            loop {
                tick.tick().await;
                if kconn.is_closed() {
                    break;
                }
                let idle = lock(&kconn.shared.last_seen).elapsed();
                if idle > keep_alive * 2 {
                    tracing::warn!(addr = %kconn.shared.addr, ?idle, "broker silent, closing connection");
                    close(&kconn.shared);
                    let _ = kconn.tx.try_send(Frame::from(commands::ping()));
                    break;
                }
                let _ = kconn.tx.try_send(Frame::from(commands::ping()));
            }
        });
        Ok(conn)
    }

    /// Connection id (changes on every reconnect).
    pub(crate) fn id(&self) -> u64 {
        self.shared.id
    }

    /// Whether the connection has ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire) || self.tx.is_closed()
    }

    /// Queues a frame; waits while the write queue is full.
    pub(crate) async fn send_frame(&self, f: Frame) -> Result<()> {
        if self.is_closed() {
            return Err(Error::Disconnected(self.shared.addr.clone()));
        }
        self.tx
            .send(f)
            .await
            .map_err(|_| Error::Disconnected(self.shared.addr.clone()))
    }

    /// Queues a frame if the write queue has room; false otherwise.
    pub(crate) fn try_send_frame(&self, f: Frame) -> bool {
        !self.is_closed() && self.tx.try_send(f).is_ok()
    }

    /// Sends a request carrying `request_id` and waits for its answer (within
    /// the operation timeout). An `ERROR` answer becomes [`Error::Server`].
    pub(crate) async fn request(&self, request_id: u64, cmd: BaseCommand) -> Result<BaseCommand> {
        let (tx, rx) = oneshot::channel();
        {
            let mut p = lock(&self.shared.pending);
            if p.len() >= PENDING_REQUESTS_MAX {
                return Err(Error::Protocol(format!(
                    "{PENDING_REQUESTS_MAX} requests already pending on {}",
                    self.shared.addr
                )));
            }
            p.insert(request_id, tx);
        }
        if self.is_closed() {
            lock(&self.shared.pending).remove(&request_id);
            return Err(Error::Disconnected(self.shared.addr.clone()));
        }
        let what = commands::command_name(&cmd);
        self.send_frame(Frame::from(cmd)).await?;
        match tokio::time::timeout(self.op_timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Error::Disconnected(self.shared.addr.clone())),
            Err(_) => {
                lock(&self.shared.pending).remove(&request_id);
                Err(Error::Timeout(format!("{what} to {}", self.shared.addr)))
            }
        }
    }

    pub(crate) fn register_producer(&self, id: u64, sink: Arc<dyn ProducerSink>) {
        lock(&self.shared.producers).insert(id, sink);
    }
    pub(crate) fn unregister_producer(&self, id: u64) {
        lock(&self.shared.producers).remove(&id);
    }
    pub(crate) fn register_consumer(&self, id: u64, sink: Arc<dyn ConsumerSink>) {
        lock(&self.shared.consumers).insert(id, sink);
    }
    pub(crate) fn unregister_consumer(&self, id: u64) {
        lock(&self.shared.consumers).remove(&id);
    }

    /// Closes the connection (tests, client shutdown).
    pub(crate) fn close(&self) {
        close(&self.shared);
        let _ = self.tx.try_send(Frame::from(commands::ping()));
    }

    async fn dispatch(&self, frame: Frame) {
        let cmd = match frame {
            Frame::Payload(p) => {
                if let Some(m) = &p.command.message {
                    let sink = lock(&self.shared.consumers).get(&m.consumer_id).cloned();
                    match sink {
                        Some(s) => s.message(self.shared.id, p).await,
                        None => tracing::debug!(
                            consumer_id = m.consumer_id,
                            "message for unknown consumer"
                        ),
                    }
                }
                return;
            }
            Frame::Command(c) => c,
        };
        let request_id = match cmd.r#type() {
            Type::Ping => {
                let _ = self.tx.try_send(Frame::from(commands::pong()));
                return;
            }
            Type::Pong | Type::ActiveConsumerChange => return,
            Type::AuthChallenge => {
                let data = self
                    .token
                    .as_deref()
                    .map(|t| bytes::Bytes::copy_from_slice(t.as_bytes()));
                let resp = BaseCommand {
                    auth_response: Some(crate::proto::pulsar::CommandAuthResponse {
                        client_version: Some(
                            concat!("cms-client-", env!("CARGO_PKG_VERSION")).to_owned(),
                        ),
                        response: Some(crate::proto::pulsar::AuthData {
                            auth_method_name: Some(
                                if data.is_some() { "token" } else { "none" }.to_owned(),
                            ),
                            auth_data: data,
                        }),
                        protocol_version: Some(PROTOCOL_VERSION),
                    }),
                    ..commands::base(Type::AuthResponse)
                };
                let _ = self.tx.try_send(Frame::from(resp));
                return;
            }
            Type::SendReceipt => {
                if let Some(r) = cmd.send_receipt {
                    let sink = lock(&self.shared.producers).get(&r.producer_id).cloned();
                    if let Some(s) = sink {
                        s.receipt(r).await;
                    }
                }
                return;
            }
            Type::SendError => {
                if let Some(e) = cmd.send_error {
                    let sink = lock(&self.shared.producers).get(&e.producer_id).cloned();
                    if let Some(s) = sink {
                        s.send_error(e).await;
                    }
                }
                return;
            }
            Type::CloseProducer => {
                if let Some(c) = cmd.close_producer {
                    let sink = lock(&self.shared.producers).remove(&c.producer_id);
                    if let Some(s) = sink {
                        s.disconnected(self.shared.id);
                    }
                }
                return;
            }
            Type::CloseConsumer => {
                if let Some(c) = cmd.close_consumer {
                    let sink = lock(&self.shared.consumers).remove(&c.consumer_id);
                    if let Some(s) = sink {
                        s.disconnected(self.shared.id);
                    }
                }
                return;
            }
            Type::Success => cmd.success.as_ref().map(|c| c.request_id),
            Type::Error => cmd.error.as_ref().map(|c| c.request_id),
            Type::ProducerSuccess => {
                // Not ready yet (queued behind an exclusive producer, G12):
                // the real answer comes later with the same request id.
                match &cmd.producer_success {
                    Some(ps) if ps.producer_ready == Some(false) => return,
                    Some(ps) => Some(ps.request_id),
                    None => None,
                }
            }
            Type::LookupResponse => cmd.lookup_topic_response.as_ref().map(|c| c.request_id),
            Type::PartitionedMetadataResponse => cmd
                .partition_metadata_response
                .as_ref()
                .map(|c| c.request_id),
            Type::GetLastMessageIdResponse => cmd
                .get_last_message_id_response
                .as_ref()
                .map(|c| c.request_id),
            Type::AckResponse => cmd.ack_response.as_ref().and_then(|c| c.request_id),
            Type::GetTopicsOfNamespaceResponse => cmd
                .get_topics_of_namespace_response
                .as_ref()
                .map(|c| c.request_id),
            Type::GetSchemaResponse => cmd.get_schema_response.as_ref().map(|c| c.request_id),
            other => {
                tracing::debug!(command = ?other, "ignoring command from broker");
                return;
            }
        };
        let Some(request_id) = request_id else {
            tracing::warn!(
                command = commands::command_name(&cmd),
                "answer without its body"
            );
            return;
        };
        let waiter = lock(&self.shared.pending).remove(&request_id);
        if let Some(w) = waiter {
            let result = if cmd.r#type() == Type::Error {
                let e = cmd.error.clone().unwrap_or_default();
                Err(Error::server(Some(e.error), e.message))
            } else {
                Ok(*cmd)
            };
            let _ = w.send(result);
        }
    }
}

type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// A failed TLS handshake: a certificate or protocol refusal is
/// [`Error::Tls`] (with rustls' reason); a socket error stays [`Error::Io`].
fn tls_error(addr: &str, e: std::io::Error) -> Error {
    let tls_reason = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<tokio_rustls::rustls::Error>())
        .map(ToString::to_string);
    match tls_reason {
        Some(reason) => Error::Tls {
            addr: addr.to_owned(),
            reason: format!("handshake refused: {reason}"),
        },
        None if e.kind() == std::io::ErrorKind::InvalidData => Error::Tls {
            addr: addr.to_owned(),
            reason: format!("handshake failed (is it a TLS port?): {e}"),
        },
        None => Error::Io {
            addr: addr.to_owned(),
            source: e,
        },
    }
}

/// CONNECT, with token authentication if a token is given.
pub(crate) fn connect_command(token: Option<&str>) -> BaseCommand {
    let mut cmd = commands::connect(
        concat!("cms-client-", env!("CARGO_PKG_VERSION")),
        PROTOCOL_VERSION,
    );
    if let (Some(t), Some(c)) = (token, cmd.connect.as_mut()) {
        c.auth_method_name = Some("token".to_owned());
        c.auth_data = Some(bytes::Bytes::copy_from_slice(t.as_bytes()));
    }
    cmd
}

fn close(shared: &Arc<Shared>) {
    if shared.closed.swap(true, Ordering::AcqRel) {
        return;
    }
    tracing::debug!(addr = %shared.addr, conn_id = shared.id, "connection closed");
    let pending: Vec<_> = lock(&shared.pending).drain().collect();
    for (_, w) in pending {
        let _ = w.send(Err(Error::Disconnected(shared.addr.clone())));
    }
    let producers: Vec<_> = lock(&shared.producers).drain().map(|(_, s)| s).collect();
    for p in producers {
        p.disconnected(shared.id);
    }
    let consumers: Vec<_> = lock(&shared.consumers).drain().map(|(_, s)| s).collect();
    for c in consumers {
        c.disconnected(shared.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_carries_the_token_only_when_given() {
        let plain = connect_command(None);
        let c = plain.connect.unwrap();
        assert_eq!(c.auth_method_name.as_deref(), Some("none"));
        assert!(c.auth_data.is_none());
        let with = connect_command(Some("abc.def"));
        let c = with.connect.unwrap();
        assert_eq!(c.auth_method_name.as_deref(), Some("token"));
        assert_eq!(c.auth_data.as_deref(), Some(&b"abc.def"[..]));
        assert_eq!(c.protocol_version, Some(PROTOCOL_VERSION));
    }
}
