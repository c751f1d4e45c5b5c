//! `cms-test-ephemeral-holder`: a test helper process that holds one ephemeral
//! node in ZooKeeper through the project's metadata store ([`ZkStore`]), so
//! system tests can pause, kill and resume a real session owner.
//!
//! It connects, creates the node's missing ancestors (persistent) and the node
//! itself (ephemeral), and serves HTTP on `127.0.0.1:<--http-port>`:
//! - `GET /ready` — 200 once the node was created and while the session is not
//!   over; 503 before and after;
//! - `GET /session` — the current session state as text (`Connected`,
//!   `Suspended`, `Expired`, `Closed`; `Connecting` before the first session).
//!
//! Every session state change is logged to stdout as
//! `session state changed to <State>`. It never opens a new session: after
//! expiry it keeps answering `/session` with `Expired` until it is stopped.
//! SIGTERM or SIGINT closes the session (deleting the node) and exits 0.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use clap::Parser;
use cms_bookie::metadata::zk::{ZkOptions, ZkStore};
use cms_bookie::metadata::{CreateMode, MetadataStore, SessionState, parent_of};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// Holds one ephemeral ZooKeeper node and reports its session over HTTP.
#[derive(Debug, Parser)]
#[command(name = "cms-test-ephemeral-holder", version)]
struct Args {
    /// ZooKeeper connect string, `host:port[,host:port...][/chroot]`.
    #[arg(long)]
    zk: String,
    /// Path of the ephemeral node to hold.
    #[arg(long)]
    path: String,
    /// Loopback port of the HTTP server (`/ready`, `/session`).
    #[arg(long)]
    http_port: u16,
    /// Session timeout asked of ZooKeeper, in milliseconds.
    #[arg(long, default_value_t = 4_000)]
    session_timeout_ms: u64,
    /// Data written into the node.
    #[arg(long, default_value = "held")]
    data: String,
}

#[derive(Clone)]
struct AppState {
    /// The session's state; `None` until connected.
    session: watch::Receiver<Option<SessionState>>,
    node_created: Arc<AtomicBool>,
}

async fn ready(State(app): State<AppState>) -> (StatusCode, &'static str) {
    let session = *app.session.borrow();
    let live = session.is_some_and(|s| !s.is_terminal());
    if app.node_created.load(Ordering::Acquire) && live {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn session(State(app): State<AppState>) -> String {
    match *app.session.borrow() {
        Some(state) => format!("{state:?}"),
        None => "Connecting".to_string(),
    }
}

/// Copies the store's session states into `out` and logs every change, until a
/// terminal one.
async fn follow_session(
    mut session: watch::Receiver<SessionState>,
    out: watch::Sender<Option<SessionState>>,
) {
    let mut last = *session.borrow_and_update();
    out.send_replace(Some(last));
    tracing::info!(state = ?last, "session state is {last:?}");
    while session.changed().await.is_ok() {
        let now = *session.borrow_and_update();
        out.send_replace(Some(now));
        if now != last {
            tracing::info!(from = ?last, to = ?now, "session state changed to {now:?}");
            last = now;
        }
        if now.is_terminal() {
            return;
        }
    }
}

async fn shutdown_signal() -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stdout)
        .with_ansi(false)
        .init();
    let args = Args::parse();

    let http_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, args.http_port));
    let listener = tokio::net::TcpListener::bind(http_addr)
        .await
        .with_context(|| format!("bind the HTTP port {http_addr}"))?;

    let (session_tx, session_rx) = watch::channel(None);
    let node_created = Arc::new(AtomicBool::new(false));
    let app = AppState {
        session: session_rx,
        node_created: node_created.clone(),
    };
    let router = Router::new()
        .route("/ready", get(ready))
        .route("/session", get(session))
        .with_state(app);
    tracing::info!(%http_addr, "serving HTTP");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                // Fired (or dropped) only on shutdown.
                let _ = stop_rx.await;
            })
            .await
    });

    let opts = ZkOptions {
        session_timeout_ms: args.session_timeout_ms,
        ..ZkOptions::default()
    };
    let store = ZkStore::connect(&args.zk, &opts)
        .await
        .with_context(|| format!("connect to ZooKeeper at {}", args.zk))?;
    tracing::info!(zk = %args.zk, session = store.session_id(), "connected to ZooKeeper");
    tokio::spawn(follow_session(store.session_events(), session_tx));

    if let Some(parent) = parent_of(&args.path) {
        store
            .create_all(parent)
            .await
            .with_context(|| format!("create the parents of {}", args.path))?;
    }
    store
        .create(&args.path, args.data.as_bytes(), CreateMode::Ephemeral)
        .await
        .with_context(|| format!("create the ephemeral node {}", args.path))?;
    node_created.store(true, Ordering::Release);
    tracing::info!(path = %args.path, "ephemeral node created");

    shutdown_signal().await?;
    store.close().await;
    // The receiver may be gone if the server already ended; nothing to do then.
    let _ = stop_tx.send(());
    server
        .await
        .context("join the HTTP server task")?
        .context("serve HTTP")?;
    tracing::info!("stopped");
    Ok(())
}
