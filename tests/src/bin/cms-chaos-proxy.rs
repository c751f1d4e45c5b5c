//! `cms-chaos-proxy`: one [`ChaosProxy`] in its own process, with the HTTP control API of
//! `cms_tests::chaos::http`, so faults between two processes can be driven from a third.
//!
//! Once both sockets listen it prints one line to stdout,
//! `cms-chaos-proxy ready listen=<addr> control=<addr>`, so a parent that passed port 0 learns
//! the ports. It runs until SIGTERM or SIGINT.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use cms_common::{LogArgs, init_logging};
use cms_tests::chaos::{ChaosProxy, Faults, ProxyConfig, http};
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

/// TCP proxy with run-time network faults (delay, jitter, refuse, reset, black hole, cut,
/// bandwidth), controlled over HTTP.
#[derive(Debug, Parser)]
#[command(name = "cms-chaos-proxy", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    /// Address clients connect to (port 0 picks a free port).
    #[arg(long)]
    listen: SocketAddr,
    /// Address the proxy forwards to.
    #[arg(long)]
    upstream: SocketAddr,
    /// Port of the HTTP control API (0 picks a free port).
    #[arg(long, default_value_t = 0)]
    control_port: u16,
    /// Address the control API binds to.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    control_host: IpAddr,
    /// Initial faults, as the JSON body of `PUT /faults`.
    #[arg(long)]
    faults: Option<String>,
    /// Live connections at most; further ones are reset at accept.
    #[arg(long, default_value_t = ProxyConfig::default().connections_max)]
    connections_max: usize,
    /// Largest chunk read at once, in bytes.
    #[arg(long, default_value_t = ProxyConfig::default().chunk_bytes_max)]
    chunk_bytes_max: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(&cli.log).map_err(anyhow::Error::msg)?;
    let config = ProxyConfig {
        connections_max: cli.connections_max,
        chunk_bytes_max: cli.chunk_bytes_max,
        ..ProxyConfig::default()
    };
    let proxy = ChaosProxy::start_with(cli.listen, cli.upstream, config)
        .await
        .context("start the proxy")?;
    if let Some(json) = &cli.faults {
        let faults: Faults = serde_json::from_str(json).context("parse --faults")?;
        proxy.set_faults(faults).context("apply --faults")?;
    }
    let proxy = Arc::new(proxy);
    let control_addr = SocketAddr::new(cli.control_host, cli.control_port);
    let control = tokio::net::TcpListener::bind(control_addr)
        .await
        .with_context(|| format!("bind the control API on {control_addr}"))?;
    let control_addr = control.local_addr().context("read the control address")?;
    let mut stdout = tokio::io::stdout();
    let ready = format!(
        "cms-chaos-proxy ready listen={} control={}\n",
        proxy.local_addr(),
        control_addr
    );
    stdout
        .write_all(ready.as_bytes())
        .await
        .context("print the ready line")?;
    stdout.flush().await.context("flush the ready line")?;
    info!(listen = %proxy.local_addr(), upstream = %cli.upstream, control = %control_addr, "ready");

    let mut terminate = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        info!("shutting down");
    };
    axum::serve(control, http::router(proxy.clone()))
        .with_graceful_shutdown(shutdown)
        .await
        .context("serve the control API")?;
    Ok(())
}
