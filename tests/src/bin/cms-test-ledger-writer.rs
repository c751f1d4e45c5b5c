//! `cms-test-ledger-writer`: a test helper process that writes one ledger and
//! never closes it, so a test can SIGKILL a real writer mid-stream and recover
//! its ledger from another process.
//!
//! It creates a ledger (E/Qw/Qa from the flags) through the ledger client,
//! prints `LEDGER <id>` on stdout, then adds entries `0, 1, ...` with
//! [`cms_tests::cluster::ledger_payload`] payloads, up to `--window` adds in
//! flight, and prints `ACKED <entry id>` (flushed) after each completion, in
//! entry order. After `--count` entries (0 = unbounded) it waits forever
//! without closing the ledger.

use std::collections::VecDeque;
use std::io::Write as _;

use clap::Parser;
use cms_tests::cluster::{ledger_client, ledger_client_options, ledger_payload};

/// Writes one ledger, reporting each acked entry, and never closes it.
#[derive(Debug, Parser)]
#[command(name = "cms-test-ledger-writer", version)]
struct Args {
    /// ZooKeeper `host:port`.
    #[arg(long)]
    zk: String,
    /// Ensemble size.
    #[arg(long, default_value_t = 3)]
    ensemble: usize,
    /// Write quorum.
    #[arg(long, default_value_t = 3)]
    write_quorum: usize,
    /// Ack quorum.
    #[arg(long, default_value_t = 2)]
    ack_quorum: usize,
    /// Entries to add (0 = until killed).
    #[arg(long, default_value_t = 0)]
    count: u64,
    /// Payload bytes per entry.
    #[arg(long, default_value_t = 512)]
    size: usize,
    /// Adds in flight at most.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Ledger password.
    #[arg(long, default_value = "pw")]
    password: String,
}

fn say(line: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let client = ledger_client(&args.zk, ledger_client_options()).await;
    let w = client
        .create_ledger(
            args.ensemble,
            args.write_quorum,
            args.ack_quorum,
            args.password.as_bytes(),
            Default::default(),
        )
        .await?;
    say(&format!("LEDGER {}", w.ledger_id()))?;
    let mut pending = VecDeque::new();
    let mut next: i64 = 0;
    loop {
        let more = args.count == 0 || (next as u64) < args.count;
        if more && pending.len() < args.window.max(1) {
            pending.push_back(w.add_pipelined(ledger_payload(next, args.size)).await?);
            next += 1;
            continue;
        }
        match pending.pop_front() {
            Some(p) => {
                let id = p.await?;
                say(&format!("ACKED {id}"))?;
            }
            None => break,
        }
    }
    say("DONE")?;
    // Never close: the test kills this process.
    std::future::pending::<()>().await;
    Ok(())
}
