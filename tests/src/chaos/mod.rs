//! Chaos proxy: an in-repo TCP proxy that system tests put between two CMS processes
//! (client ↔ broker, broker ↔ bookie, anything ↔ ZooKeeper) to inject network faults at run
//! time. `tc netem` does not exist on our kernels; this is how we delay, jitter, drop, black-hole,
//! reset, throttle and cut links.
//!
//! ```no_run
//! # async fn demo(upstream: std::net::SocketAddr) -> Result<(), cms_tests::chaos::ChaosError> {
//! use cms_tests::chaos::{ChaosProxy, DirectionFaults, Faults};
//!
//! let proxy = ChaosProxy::start("127.0.0.1:0".parse().unwrap(), upstream).await?;
//! // Point the client at `proxy.local_addr()` instead of `upstream`, then:
//! proxy.set_faults(Faults {
//!     seed: 7,
//!     to_client: DirectionFaults { delay_ms: 50, jitter_ms: 20, ..Default::default() },
//!     ..Default::default()
//! })?;
//! proxy.reset_all(); // RST every live connection
//! proxy.set_faults(Faults::none())?;
//! proxy.stop().await;
//! # Ok(()) }
//! ```
//!
//! What it promises:
//! - Fault semantics are those documented on [`Faults`] and [`DirectionFaults`]; a change applies
//!   to live and new connections at once (bytes already stamped with a delay keep it).
//! - Byte order within a connection is always kept; a connection is either forwarded intact or
//!   reset — the proxy never silently removes bytes from the middle of a stream.
//! - Random choices come from a generator seeded by [`Faults::seed`]: the same seed, connection
//!   order and chunking give the same refusals, resets and jitter.
//! - Bounded: at most [`ProxyConfig::connections_max`] connections (more are reset at accept);
//!   per connection and direction at most `chunk_bytes_max × (in_flight_chunks_max + 1)` bytes
//!   are buffered.
//! - [`ChaosProxy::stop`] or dropping the proxy closes the listener and every connection.
//!
//! The `cms-chaos-proxy` binary runs one proxy with the HTTP control API of [`http`], so faults
//! can be driven from another process ([`remote::RemoteChaosProxy`]).

mod bucket;
mod connection;
pub mod faults;
pub mod http;
pub mod remote;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{Instrument, debug, info, warn};

pub use faults::{DELAY_MS_MAX, Direction, DirectionFaults, Faults};

/// Errors of the chaos proxy.
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// A [`Faults`] value failed validation; the current faults are unchanged.
    #[error("invalid faults: {0}")]
    InvalidFaults(String),
    /// A [`ProxyConfig`] value is out of range.
    #[error("invalid proxy config: {0}")]
    InvalidConfig(String),
    /// The listening socket could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A request to a remote proxy's control API failed.
    #[error("chaos proxy control API: {0}")]
    Remote(String),
}

/// Bounds and timeouts of a proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Largest chunk read at once from a socket, in bytes; also the bandwidth bucket's burst.
    pub chunk_bytes_max: usize,
    /// Chunks buffered per direction of a connection between reading and forwarding (they wait
    /// there for their delay, a cut to heal, or bandwidth).
    pub in_flight_chunks_max: usize,
    /// Live connections at most; further connections are reset at accept.
    pub connections_max: usize,
    /// Time allowed to connect to the upstream, in milliseconds; then the client is reset.
    pub upstream_connect_timeout_ms: u64,
    /// Pause after a failed `accept` (e.g. out of file descriptors), in milliseconds.
    pub accept_error_backoff_ms: u64,
    /// Time [`ChaosProxy::stop`] waits for connections to close before abandoning them, in
    /// milliseconds.
    pub shutdown_wait_ms: u64,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            chunk_bytes_max: 16 * 1024,
            in_flight_chunks_max: 64,
            connections_max: 1024,
            upstream_connect_timeout_ms: 5_000,
            accept_error_backoff_ms: 50,
            shutdown_wait_ms: 1_000,
        }
    }
}

impl ProxyConfig {
    fn validate(&self) -> Result<(), ChaosError> {
        let positive = [
            ("chunk_bytes_max", self.chunk_bytes_max),
            ("in_flight_chunks_max", self.in_flight_chunks_max),
            ("connections_max", self.connections_max),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(ChaosError::InvalidConfig(format!(
                    "{name} must be at least 1"
                )));
            }
        }
        Ok(())
    }
}

/// What every task of a proxy watches.
#[derive(Clone, Debug)]
pub(crate) struct Control {
    pub(crate) faults: Faults,
    /// Bumped by [`ChaosProxy::reset_all`]; a connection accepted at an older epoch is reset.
    pub(crate) reset_epoch: u64,
    pub(crate) shutdown: bool,
}

/// A running proxy. Dropping it stops it and closes every connection.
#[derive(Debug)]
pub struct ChaosProxy {
    local_addr: SocketAddr,
    upstream: SocketAddr,
    control: watch::Sender<Control>,
    connections: Arc<AtomicUsize>,
    accept_task: Option<JoinHandle<()>>,
}

impl ChaosProxy {
    /// Listens on `listen` (port 0 picks a free port) and forwards to `upstream`, with no fault
    /// and [`ProxyConfig::default`]. Must be called inside a tokio runtime.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> Result<Self, ChaosError> {
        Self::start_with(listen, upstream, ProxyConfig::default()).await
    }

    /// [`ChaosProxy::start`] with explicit bounds.
    pub async fn start_with(
        listen: SocketAddr,
        upstream: SocketAddr,
        config: ProxyConfig,
    ) -> Result<Self, ChaosError> {
        config.validate()?;
        let bind_error = |source| ChaosError::Bind {
            addr: listen,
            source,
        };
        let listener = TcpListener::bind(listen).await.map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        let (control, control_rx) = watch::channel(Control {
            faults: Faults::none(),
            reset_epoch: 0,
            shutdown: false,
        });
        let connections = Arc::new(AtomicUsize::new(0));
        let span = tracing::info_span!("chaos_proxy", listen = %local_addr, upstream = %upstream);
        let accept_task = tokio::spawn(
            accept_loop(listener, upstream, config, control_rx, connections.clone())
                .instrument(span),
        );
        info!(listen = %local_addr, %upstream, "chaos proxy started");
        Ok(Self {
            local_addr,
            upstream,
            control,
            connections,
            accept_task: Some(accept_task),
        })
    }

    /// The address clients should connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Replaces the faults; applies to live and new connections at once. An invalid value is
    /// refused and the current faults stay.
    pub fn set_faults(&self, faults: Faults) -> Result<(), ChaosError> {
        faults.validate()?;
        info!(?faults, "chaos faults set");
        self.control.send_modify(|c| c.faults = faults);
        Ok(())
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        self.control.borrow().faults.clone()
    }

    /// Clears every fault (keeps the seed): traffic flows untouched again.
    pub fn clear_faults(&self) {
        self.control.send_modify(|c| {
            c.faults = Faults {
                seed: c.faults.seed,
                ..Faults::none()
            }
        });
    }

    /// Resets (RST to both peers) every connection live now; later connections are not
    /// affected. Returns how many connections were live.
    pub fn reset_all(&self) -> usize {
        let live = self.connections();
        info!(live, "chaos reset_all");
        self.control.send_modify(|c| c.reset_epoch += 1);
        live
    }

    /// Connections accepted and not yet closed (including black-holed ones).
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Stops accepting, closes every connection, and waits (at most
    /// [`ProxyConfig::shutdown_wait_ms`]) for them to be gone.
    pub async fn stop(mut self) {
        self.control.send_modify(|c| c.shutdown = true);
        if let Some(task) = self.accept_task.take() {
            // The task never panics by design; a panic or abort is already logged by tokio.
            let _ = task.await;
        }
    }
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        self.control.send_modify(|c| c.shutdown = true);
        if let Some(task) = self.accept_task.take() {
            // Aborting drops the task's `JoinSet`, which aborts every connection task and
            // closes their sockets, even if the runtime never polls them again.
            task.abort();
        }
    }
}

/// Decrements the live-connection count when a connection task ends, however it ends.
struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Closes a fresh connection with RST.
fn refuse(stream: TcpStream, why: &'static str) {
    debug!(why, peer = ?stream.peer_addr().ok(), "connection refused");
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    config: ProxyConfig,
    mut control: watch::Receiver<Control>,
    connections: Arc<AtomicUsize>,
) {
    let mut tasks = JoinSet::new();
    let mut seed_in_use = control.borrow().faults.seed;
    let mut rng = StdRng::seed_from_u64(seed_in_use);
    let mut next_id: u64 = 0;
    loop {
        while tasks.try_join_next().is_some() {}
        tokio::select! {
            changed = control.changed() => {
                if changed.is_err() || control.borrow_and_update().shutdown {
                    break;
                }
            }
            accepted = listener.accept() => match accepted {
                Err(e) => {
                    warn!(error = %e, "accept failed; backing off");
                    tokio::time::sleep(Duration::from_millis(config.accept_error_backoff_ms)).await;
                }
                Ok((stream, peer)) => {
                    let (faults, start_epoch) = {
                        let c = control.borrow();
                        (c.faults.clone(), c.reset_epoch)
                    };
                    if faults.seed != seed_in_use {
                        seed_in_use = faults.seed;
                        rng = StdRng::seed_from_u64(seed_in_use);
                    }
                    // Both draws happen for every connection, so the choices made for the n-th
                    // connection depend only on the seed and n.
                    let refused = faults.refuse_probability > 0.0
                        && rng.random_bool(faults.refuse_probability);
                    let seed: u64 = rng.random();
                    let id = next_id;
                    next_id += 1;
                    if faults.reset {
                        refuse(stream, "reset fault");
                    } else if refused {
                        refuse(stream, "refuse_probability");
                    } else if connections.load(Ordering::SeqCst) >= config.connections_max {
                        warn!(connections_max = config.connections_max, "connection limit reached");
                        refuse(stream, "connections_max");
                    } else {
                        let _ = stream.set_nodelay(true);
                        debug!(id, %peer, "connection accepted");
                        connections.fetch_add(1, Ordering::SeqCst);
                        let guard = LiveGuard(connections.clone());
                        let conn = connection::Connection {
                            id,
                            upstream,
                            config,
                            control: control.clone(),
                            seed,
                            start_epoch,
                        };
                        tasks.spawn(
                            async move {
                                let _guard = guard;
                                connection::run(stream, conn).await;
                            }
                            .in_current_span(),
                        );
                    }
                }
            },
        }
    }
    drop(listener);
    let wait = Duration::from_millis(config.shutdown_wait_ms);
    let drained =
        tokio::time::timeout(wait, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        warn!(
            left = tasks.len(),
            "connections still open at shutdown; aborting them"
        );
    }
    info!("chaos proxy stopped");
}
