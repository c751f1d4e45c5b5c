//! A connection to one bookie: the client side of the `Bookie` gRPC service.
//!
//! [`BookieClient`] names its target (bookie id + incarnation) on every call,
//! keeps one add stream open and matches its out-of-order answers to the adds
//! by request id, so many adds of many ledgers are pipelined on one HTTP/2
//! connection. It knows nothing of quorums: the ledger client builds those on
//! top of it.
//!
//! Bounds: adds in flight on the stream are limited by the caller's use; an
//! add whose stream broke resolves to [`ClientError::Disconnected`], never
//! hangs; every unary call has the configured deadline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use crate::proto::bookie::bookie_client::BookieClient as RawClient;
use crate::proto::bookie::{
    AddFlag, AddRequest, GetBookieInfoRequest, GetBookieInfoResponse, ReadFlag, ReadLacRequest,
    ReadLacResponse, ReadNextRequest, ReadNextResponse, ReadRangeRequest, ReadRangeResponse,
    ReadRequest, ReadResponse, StatusCode, WriteLacRequest,
};
use crate::server::grpc::{BOOKIE_ID_HEADER, GRPC_MESSAGE_BYTES_MAX, INCARNATION_HEADER};

/// HTTP/2 stream and connection flow-control window of bookie connections.
pub const HTTP2_WINDOW_BYTES: u32 = 16 * 1024 * 1024;

/// Why a call did not get a bookie status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Connecting failed.
    #[error("connecting to bookie {bookie} at {endpoint}: {reason}")]
    Connect {
        /// Bookie id.
        bookie: String,
        /// Address.
        endpoint: String,
        /// The error.
        reason: String,
    },
    /// The call failed at the gRPC level (deadline, refused target, reset).
    #[error("bookie {bookie}: {code:?}: {message}")]
    Rpc {
        /// Bookie id.
        bookie: String,
        /// gRPC code.
        code: tonic::Code,
        /// Message.
        message: String,
    },
    /// The add stream ended before this add was answered.
    #[error("bookie {0}: add stream disconnected")]
    Disconnected(String),
}

/// Options of a bookie connection.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Deadline of connecting, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Deadline of one unary call, in milliseconds.
    pub request_timeout_ms: u64,
    /// Adds buffered towards the stream before `add` waits.
    pub add_queue_max: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout_ms: 5_000,
            request_timeout_ms: 10_000,
            add_queue_max: 10_000,
        }
    }
}

#[derive(Clone)]
struct Target {
    id: MetadataValue<tonic::metadata::Ascii>,
    incarnation: MetadataValue<tonic::metadata::Ascii>,
}

impl Interceptor for Target {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert(BOOKIE_ID_HEADER, self.id.clone());
        req.metadata_mut()
            .insert(INCARNATION_HEADER, self.incarnation.clone());
        Ok(req)
    }
}

type Raw = RawClient<tonic::service::interceptor::InterceptedService<Channel, Target>>;
type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<StatusCode>>>>;

/// One bookie's connection. Clones share it (and are cheap: the ledger
/// client takes one per add it sends).
#[derive(Clone)]
pub struct BookieClient {
    inner: Arc<Shared>,
}

struct Shared {
    bookie_id: String,
    raw: Raw,
    opts: ClientOptions,
    adds: mpsc::Sender<AddRequest>,
    waiters: Waiters,
    next_id: AtomicU64,
    closed: Arc<AtomicBool>,
}

impl std::fmt::Debug for BookieClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BookieClient")
            .field("bookie_id", &self.inner.bookie_id)
            .finish_non_exhaustive()
    }
}

fn lock(w: &Waiters) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<StatusCode>>> {
    match w.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn status_of(code: i32) -> StatusCode {
    StatusCode::try_from(code).unwrap_or(StatusCode::BadRequest)
}

impl BookieClient {
    /// Connects to bookie `bookie_id` / `incarnation` at `endpoint` (`host:port`)
    /// and opens its add stream.
    pub async fn connect(
        bookie_id: &str,
        incarnation: u64,
        endpoint: &str,
        opts: ClientOptions,
    ) -> Result<BookieClient, ClientError> {
        let connect_err = |reason: String| ClientError::Connect {
            bookie: bookie_id.to_string(),
            endpoint: endpoint.to_string(),
            reason,
        };
        let target = Target {
            id: bookie_id
                .parse()
                .map_err(|e| connect_err(format!("bad bookie id: {e}")))?,
            incarnation: incarnation
                .to_string()
                .parse()
                .map_err(|e| connect_err(format!("bad incarnation: {e}")))?,
        };
        let channel = Endpoint::from_shared(format!("http://{endpoint}"))
            .map_err(|e| connect_err(e.to_string()))?
            .connect_timeout(Duration::from_millis(opts.connect_timeout_ms))
            .tcp_nodelay(true)
            // Many adds in flight on one stream: a 64 KiB HTTP/2 window would
            // make throughput wait on window updates.
            .initial_stream_window_size(HTTP2_WINDOW_BYTES)
            .initial_connection_window_size(HTTP2_WINDOW_BYTES)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| connect_err(format!("{e:?}")))?;
        let raw = RawClient::with_interceptor(channel, target)
            .max_decoding_message_size(GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(GRPC_MESSAGE_BYTES_MAX);
        let (tx, rx) = mpsc::channel(opts.add_queue_max.max(1));
        let waiters: Waiters = Arc::new(Mutex::new(HashMap::new()));
        let mut stream_client = raw.clone();
        let responses = stream_client
            .add(ReceiverStream::new(rx))
            .await
            .map_err(|s| ClientError::Rpc {
                bookie: bookie_id.to_string(),
                code: s.code(),
                message: s.message().to_string(),
            })?;
        let mut responses = responses.into_inner();
        let w = waiters.clone();
        let closed = Arc::new(AtomicBool::new(false));
        let closed_flag = closed.clone();
        let id = bookie_id.to_string();
        tokio::spawn(async move {
            while let Some(next) = responses.next().await {
                match next {
                    Ok(resp) => {
                        if let Some(tx) = lock(&w).remove(&resp.request_id) {
                            let _ = tx.send(status_of(resp.status));
                        }
                    }
                    Err(e) => {
                        tracing::debug!(bookie = %id, error = %e, "add stream ended");
                        break;
                    }
                }
            }
            // Every add still waiting learns the stream is gone (its sender drops).
            closed_flag.store(true, Ordering::Release);
            lock(&w).clear();
        });
        Ok(BookieClient {
            inner: Arc::new(Shared {
                bookie_id: bookie_id.to_string(),
                raw,
                opts,
                adds: tx,
                waiters,
                next_id: AtomicU64::new(1),
                closed,
            }),
        })
    }

    /// Whether the add stream has ended (the connection must be replaced).
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// The bookie's id.
    pub fn bookie_id(&self) -> &str {
        &self.inner.bookie_id
    }

    fn rpc_err(&self, s: Status) -> ClientError {
        ClientError::Rpc {
            bookie: self.inner.bookie_id.clone(),
            code: s.code(),
            message: s.message().to_string(),
        }
    }

    fn deadline<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        r.set_timeout(Duration::from_millis(self.inner.opts.request_timeout_ms));
        r
    }

    /// Sends one add on the stream; resolves with the bookie's answer.
    pub async fn add(
        &self,
        ledger_id: u64,
        entry_id: i64,
        master_key: Bytes,
        recovery: bool,
        body: Bytes,
    ) -> Result<StatusCode, ClientError> {
        let request_id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.inner.waiters).insert(request_id, tx);
        let req = AddRequest {
            request_id,
            ledger_id,
            entry_id,
            master_key,
            flags: if recovery {
                AddFlag::RecoveryAdd as u32
            } else {
                0
            },
            body,
        };
        if self.inner.adds.send(req).await.is_err() || self.inner.closed.load(Ordering::Acquire) {
            lock(&self.inner.waiters).remove(&request_id);
            return Err(ClientError::Disconnected(self.inner.bookie_id.clone()));
        }
        rx.await
            .map_err(|_| ClientError::Disconnected(self.inner.bookie_id.clone()))
    }

    /// Reads one entry; with `fence_key`, fences the ledger first.
    pub async fn read(
        &self,
        ledger_id: u64,
        entry_id: i64,
        fence_key: Option<Bytes>,
        fairness_key: &str,
    ) -> Result<ReadResponse, ClientError> {
        let req = ReadRequest {
            ledger_id,
            entry_id,
            flags: if fence_key.is_some() {
                ReadFlag::Fence as u32
            } else {
                0
            },
            master_key: fence_key.unwrap_or_default(),
            fairness_key: fairness_key.to_string(),
        };
        self.inner
            .raw
            .clone()
            .read(self.deadline(req))
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.rpc_err(s))
    }

    /// Reads consecutive entries from `first`.
    pub async fn read_range(
        &self,
        ledger_id: u64,
        first: i64,
        count_max: u32,
        bytes_max: u64,
        fairness_key: &str,
    ) -> Result<ReadRangeResponse, ClientError> {
        let req = ReadRangeRequest {
            ledger_id,
            first_entry_id: first,
            count_max,
            bytes_max,
            flags: 0,
            master_key: Bytes::new(),
            fairness_key: fairness_key.to_string(),
        };
        self.inner
            .raw
            .clone()
            .read_range(self.deadline(req))
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.rpc_err(s))
    }

    /// Long-poll read of the entry after `previous_lac`.
    pub async fn read_next(
        &self,
        ledger_id: u64,
        previous_lac: i64,
        timeout_ms: u32,
        fairness_key: &str,
    ) -> Result<ReadNextResponse, ClientError> {
        let req = ReadNextRequest {
            ledger_id,
            previous_lac,
            timeout_ms,
            fairness_key: fairness_key.to_string(),
        };
        let mut r = Request::new(req);
        r.set_timeout(Duration::from_millis(
            self.inner.opts.request_timeout_ms + u64::from(timeout_ms),
        ));
        self.inner
            .raw
            .clone()
            .read_next(r)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.rpc_err(s))
    }

    /// What the bookie knows of a ledger's LAC.
    pub async fn read_lac(&self, ledger_id: u64) -> Result<ReadLacResponse, ClientError> {
        self.inner
            .raw
            .clone()
            .read_lac(self.deadline(ReadLacRequest { ledger_id }))
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.rpc_err(s))
    }

    /// Writes an explicit LAC.
    pub async fn write_lac(
        &self,
        ledger_id: u64,
        master_key: Bytes,
        lac: i64,
        body: Bytes,
    ) -> Result<StatusCode, ClientError> {
        let req = WriteLacRequest {
            ledger_id,
            master_key,
            lac,
            body,
        };
        self.inner
            .raw
            .clone()
            .write_lac(self.deadline(req))
            .await
            .map(|r| status_of(r.into_inner().status))
            .map_err(|s| self.rpc_err(s))
    }

    /// The bookie's identity, mode and space.
    pub async fn info(&self) -> Result<GetBookieInfoResponse, ClientError> {
        self.inner
            .raw
            .clone()
            .get_bookie_info(self.deadline(GetBookieInfoRequest {}))
            .await
            .map(|r| r.into_inner())
            .map_err(|s| self.rpc_err(s))
    }
}

/// The status of a read answer.
pub fn read_status(r: &ReadResponse) -> StatusCode {
    status_of(r.status)
}
