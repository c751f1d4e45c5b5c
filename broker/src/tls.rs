//! TLS for the broker's `pulsar+ssl://` port and its `https://` port
//! (rustls through tokio-rustls, aws-lc-rs provider).
//!
//! [`ReloadingTls`] holds the server configuration built from the
//! certificate chain and key files (PEM) and, when a trust file is given,
//! verifies client certificates that are offered (clients without one are
//! still accepted; one signed by another CA is refused). A task polls the
//! files' modification time and size every `tls_reload_interval_ms` and
//! swaps in a new configuration when they change, so new connections get
//! the new certificate without a restart; a file that does not load keeps
//! the previous configuration (logged). Handshakes are bounded by
//! [`HANDSHAKE_TIMEOUT_MS`] and run in their own tasks, so a slow or
//! plaintext client never stalls the accept loop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;
use tracing::{debug, info, warn};

/// Longest a TLS handshake may take, in milliseconds.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Handshaken HTTPS connections waiting for the HTTP server.
const HTTPS_ACCEPT_QUEUE: usize = 128;

/// Why TLS cannot be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TLS: {0}")]
pub struct TlsError(pub String);

/// The certificate, key and optional client trust files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain (PEM).
    pub cert: PathBuf,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates client certificates must chain to (PEM), if any.
    pub trust: Option<PathBuf>,
}

type Stamp = Vec<Option<(SystemTime, u64)>>;

fn stamp(files: &TlsFiles) -> Stamp {
    let one = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())))
    };
    let mut v = vec![one(&files.cert), one(&files.key)];
    if let Some(t) = &files.trust {
        v.push(one(t));
    }
    v
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Builds the server configuration from `files`.
pub fn server_config(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError(format!("certificate file {}: {e}", files.cert.display())))?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "certificate file {} holds no certificate",
            files.cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| TlsError(format!("key file {}: {e}", files.key.display())))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?;
    let builder = match &files.trust {
        Some(t) => {
            let mut roots = rustls::RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(t)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| TlsError(format!("trust file {}: {e}", t.display())))?;
            for ca in cas {
                roots
                    .add(ca)
                    .map_err(|e| TlsError(format!("trust file {}: {e}", t.display())))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.into(),
                provider(),
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError(format!("trust file {}: {e}", t.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError(format!("certificate and key do not fit: {e}")))
}

/// A server configuration reloaded when its files change.
#[derive(Debug)]
pub struct ReloadingTls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
    stamp: Mutex<Stamp>,
}

impl ReloadingTls {
    /// Loads `files` (an error if they do not load: the broker refuses to start).
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let st = stamp(&files);
        let config = server_config(&files)?;
        Ok(Arc::new(ReloadingTls {
            files,
            current: RwLock::new(Arc::new(config)),
            stamp: Mutex::new(st),
        }))
    }

    /// An acceptor with the current configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        let c = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        TlsAcceptor::from(c)
    }

    /// Reloads when a file's modification time or size changed; Ok(true)
    /// when a new configuration is in use.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamp(&self.files);
        {
            let mut last = self
                .stamp
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *last == now {
                return Ok(false);
            }
            // Remember the new stamp even if loading fails: a half-written
            // pair is retried when it changes again.
            *last = now;
        }
        let config = server_config(&self.files)?;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
        Ok(true)
    }

    /// Polls the files every `interval` until `shutdown`.
    pub fn spawn_reloader(
        self: &Arc<Self>,
        interval: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = crate::connection::wait_true(&mut shutdown) => return,
                    _ = tick.tick() => {}
                }
                match me.reload_if_changed() {
                    Ok(true) => info!(cert = %me.files.cert.display(), "TLS certificate reloaded"),
                    Ok(false) => {}
                    Err(e) => {
                        warn!(error = %e, "TLS files changed but do not load; keeping the previous certificate")
                    }
                }
            }
        });
    }
}

/// The server side of a handshake on `tcp`, bounded in time.
pub async fn handshake(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
) -> Result<TlsStream<TcpStream>, String> {
    match tokio::time::timeout(
        Duration::from_millis(HANDSHAKE_TIMEOUT_MS),
        acceptor.accept(tcp),
    )
    .await
    {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no TLS handshake within {HANDSHAKE_TIMEOUT_MS} ms")),
    }
}

/// An axum listener serving HTTPS: TCP accepts and handshakes run in a
/// background task; `accept` hands out finished TLS streams.
#[derive(Debug)]
pub struct HttpsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl HttpsListener {
    /// Starts accepting on `tcp` with `tls`.
    pub fn new(tcp: TcpListener, tls: Arc<ReloadingTls>) -> std::io::Result<HttpsListener> {
        let local = tcp.local_addr()?;
        let (tx, rx) = mpsc::channel(HTTPS_ACCEPT_QUEUE);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        warn!(error = %e, "HTTPS accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let acceptor = tls.acceptor();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match handshake(acceptor, stream).await {
                        Ok(s) => {
                            let _ = tx.send((s, peer)).await;
                        }
                        Err(e) => debug!(peer = %peer, error = %e, "HTTPS handshake failed"),
                    }
                });
            }
        });
        Ok(HttpsListener { rx, local })
    }
}

impl axum::serve::Listener for HttpsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept task only ends with the runtime.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> TlsFiles {
        let kp = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&kp)
            .unwrap();
        let files = TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            trust: None,
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, kp.serialize_pem()).unwrap();
        files
    }

    #[test]
    fn loads_and_reloads_on_change_and_keeps_the_old_on_bad_files() {
        let d = tempfile::tempdir().unwrap();
        let files = write_pair(d.path(), "one.test");
        let tls = ReloadingTls::load(files.clone()).unwrap();
        assert_eq!(tls.reload_if_changed(), Ok(false));
        // A new pair (different size at least: different name length).
        write_pair(d.path(), "a-much-longer-name.test");
        assert_eq!(tls.reload_if_changed(), Ok(true));
        std::fs::write(&files.key, "garbage").unwrap();
        assert!(tls.reload_if_changed().is_err());
        let _still = tls.acceptor();
    }

    #[test]
    fn bad_files_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            cert: d.path().join("missing.pem"),
            key: d.path().join("missing.key"),
            trust: None,
        };
        assert!(ReloadingTls::load(files).is_err());
    }
}
