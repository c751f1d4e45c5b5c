//! The SDK's one error type. Broker `ServerError` codes map to
//! [`Error::Server`]; malformed server input is an error, never a panic.

use crate::proto::FrameError;
use crate::proto::pulsar::ServerError;

/// Everything an SDK call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The service URL could not be parsed.
    #[error("invalid service URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A feature this SDK does not support (for example `pulsar+ssl://`).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// TLS could not be set up: a trust file that does not load, or a
    /// handshake refused (an untrusted certificate, a certificate that does
    /// not name the host, a plaintext server). Not retried.
    #[error("TLS with {addr}: {reason}")]
    Tls {
        /// The broker address (or the file) concerned.
        addr: String,
        /// What failed.
        reason: String,
    },
    /// TCP connect or socket I/O failed.
    #[error("I/O error talking to {addr}: {source}")]
    Io {
        /// The broker address.
        addr: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The server sent bytes that do not decode.
    #[error("malformed data from the server: {0}")]
    Frame(#[from] FrameError),
    /// The broker answered with a `ServerError`.
    #[error("server error {code:?}: {message}")]
    Server {
        /// The broker's error code.
        code: ServerError,
        /// The broker's message.
        message: String,
    },
    /// The broker answered something this request did not expect.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The operation did not complete within the operation timeout.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The connection closed before the request completed.
    #[error("connection to {0} closed")]
    Disconnected(String),
    /// The producer's pending queue is full and the producer fails fast.
    #[error("producer queue is full")]
    ProducerQueueFull,
    /// The producer, consumer or client was closed.
    #[error("already closed")]
    Closed,
    /// Lookup redirected more times than allowed.
    #[error("too many lookup redirects for {0}")]
    TooManyRedirects(String),
    /// A payload could not be (de)compressed or a batch could not be split.
    #[error("payload error: {0}")]
    Payload(String),
}

impl Error {
    /// Builds [`Error::Server`] from the wire's `i32` code and message.
    pub fn server(code: Option<i32>, message: impl Into<String>) -> Self {
        let code = code
            .and_then(|c| ServerError::try_from(c).ok())
            .unwrap_or(ServerError::UnknownError);
        Error::Server {
            code,
            message: message.into(),
        }
    }

    /// Whether retrying on a new connection may succeed (the broker moved,
    /// restarted, or is not ready yet).
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Io { .. } | Error::Disconnected(_) | Error::Timeout(_) | Error::Frame(_) => true,
            Error::Server { code, .. } => matches!(
                code,
                ServerError::ServiceNotReady
                    | ServerError::MetadataError
                    | ServerError::PersistenceError
                    | ServerError::TooManyRequests
                    | ServerError::ProducerBusy
                    | ServerError::ConsumerBusy
                    | ServerError::UnknownError
            ),
            Error::TooManyRedirects(_) => true,
            _ => false,
        }
    }
}

/// Result with the SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
