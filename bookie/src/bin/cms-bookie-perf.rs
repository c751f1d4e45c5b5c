//! `cms-bookie-perf`: load generator for one bookie (issue "bookie" benchmarks).
//!
//! Modes:
//! - `sync`: one add at a time (await each answer), `--count` adds of
//!   `--size` bytes; reports p50 / p99 / p99.9 / max of the add latency from an
//!   HDR histogram of every sample;
//! - `throughput`: `--concurrency` adds in flight for `--seconds`; reports
//!   adds/s and MiB/s;
//! - `floor`: the fdatasync floor of this disk in the same run: 4 KiB writes
//!   into a pre-filled file in `--floor-dir`, each followed by `fdatasync`.
//!
//! Every run prints one JSON line (machine-readable, for BENCHMARKS.md) and a
//! human summary on stderr. Runs are bounded by count or time.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use cms_bookie::bookie_client::{BookieClient, ClientOptions};
use cms_bookie::entry::{Entry, EntryHeader};
use cms_bookie::proto::bookie::StatusCode;
use hdrhistogram::Histogram;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Sync,
    Throughput,
    Floor,
}

/// Load generator for one bookie.
#[derive(Debug, Parser)]
#[command(name = "cms-bookie-perf", version, about)]
struct Cli {
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Mode::Sync)]
    mode: Mode,
    /// Bookie gRPC address, host:port.
    #[arg(long, default_value = "127.0.0.1:3181")]
    endpoint: String,
    /// Bookie id.
    #[arg(long, default_value = "bookie-1")]
    bookie_id: String,
    /// Bookie incarnation.
    #[arg(long, default_value_t = 1)]
    incarnation: u64,
    /// Payload bytes per entry.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Adds (sync and floor modes), after the warm-up.
    #[arg(long, default_value_t = 20_000)]
    count: u64,
    /// Warm-up adds not counted.
    #[arg(long, default_value_t = 500)]
    warmup: u64,
    /// Adds in flight (throughput mode).
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Duration of the throughput mode, in seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Ledgers the adds are spread over (throughput mode).
    #[arg(long, default_value_t = 8)]
    ledgers: u64,
    /// First ledger id used (pick a fresh range per run).
    #[arg(long, default_value_t = 1_000_000)]
    first_ledger: u64,
    /// Directory for the fdatasync floor file (floor mode).
    #[arg(long, default_value = ".")]
    floor_dir: PathBuf,
}

const KEY: &[u8; 20] = b"cms-bookie-perf-key!";

fn summary(h: &Histogram<u64>) -> serde_json::Value {
    let ms = |v: u64| v as f64 / 1000.0;
    serde_json::json!({
        "samples": h.len(),
        "p50_ms": ms(h.value_at_quantile(0.50)),
        "p99_ms": ms(h.value_at_quantile(0.99)),
        "p999_ms": ms(h.value_at_quantile(0.999)),
        "max_ms": ms(h.max()),
        "mean_ms": h.mean() / 1000.0,
    })
}

fn new_hist() -> anyhow::Result<Histogram<u64>> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).context("creating a histogram")
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let out = match cli.mode {
        Mode::Floor => floor(&cli)?,
        Mode::Sync => sync(&cli).await?,
        Mode::Throughput => throughput(&cli).await?,
    };
    println!("{out}");
    std::io::stdout().flush().ok();
    Ok(())
}

fn floor(cli: &Cli) -> anyhow::Result<serde_json::Value> {
    let path = cli
        .floor_dir
        .join(format!("cms-fsync-floor-{}.tmp", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let block = vec![0u8; 4096];
    let blocks = cli.count + cli.warmup;
    // Pre-fill and sync once, as the journal does: later syncs overwrite in place.
    for i in 0..blocks {
        file.write_all_at(&block, i * 4096)?;
    }
    file.sync_all()?;
    let mut h = new_hist()?;
    let data = vec![0xA5u8; 4096];
    for i in 0..blocks {
        let t = Instant::now();
        file.write_all_at(&data, i * 4096)?;
        file.sync_data()?;
        if i >= cli.warmup {
            h.record(t.elapsed().as_micros().max(1) as u64)?;
        }
    }
    drop(file);
    std::fs::remove_file(&path).ok();
    let s = summary(&h);
    eprintln!("fdatasync floor (4 KiB, pre-filled file): {s}");
    Ok(serde_json::json!({"mode": "floor", "latency": s}))
}

async fn connect(cli: &Cli) -> anyhow::Result<BookieClient> {
    BookieClient::connect(
        &cli.bookie_id,
        cli.incarnation,
        &cli.endpoint,
        ClientOptions::default(),
    )
    .await
    .context("connecting to the bookie")
}

fn entry(ledger: u64, entry_id: i64, payload: &[u8]) -> Bytes {
    Entry::encode(
        EntryHeader {
            ledger_id: ledger,
            entry_id,
            lac: entry_id - 1,
            length: (entry_id as u64 + 1) * payload.len() as u64,
        },
        payload,
    )
}

async fn sync(cli: &Cli) -> anyhow::Result<serde_json::Value> {
    let c = connect(cli).await?;
    let payload = vec![0x5Au8; cli.size];
    let ledger = cli.first_ledger;
    let mut h = new_hist()?;
    let key = Bytes::from_static(KEY);
    for i in 0..(cli.warmup + cli.count) {
        let body = entry(ledger, i as i64, &payload);
        let t = Instant::now();
        let s = c.add(ledger, i as i64, key.clone(), false, body).await?;
        let took = t.elapsed();
        if s != StatusCode::Ok {
            bail!("add {i} answered {}", s.as_str_name());
        }
        if i >= cli.warmup {
            h.record(took.as_micros().max(1) as u64)?;
        }
    }
    let s = summary(&h);
    eprintln!("sync adds of {} B: {s}", cli.size);
    Ok(serde_json::json!({"mode": "sync", "size": cli.size, "latency": s}))
}

async fn throughput(cli: &Cli) -> anyhow::Result<serde_json::Value> {
    if cli.concurrency == 0
        || cli.ledgers == 0
        || !(cli.concurrency as u64).is_multiple_of(cli.ledgers)
    {
        bail!("--concurrency must be a positive multiple of --ledgers");
    }
    let c = connect(cli).await?;
    let payload = Arc::new(vec![0x5Au8; cli.size]);
    let stop = Arc::new(AtomicBool::new(false));
    let adds = Arc::new(AtomicU64::new(0));
    let key = Bytes::from_static(KEY);
    let ledgers = cli.ledgers;
    let stride = cli.concurrency as u64 / ledgers;
    let mut workers = Vec::new();
    let started = Instant::now();
    for w in 0..cli.concurrency {
        let (c, payload, stop, adds, key) = (
            c.clone(),
            payload.clone(),
            stop.clone(),
            adds.clone(),
            key.clone(),
        );
        let ledger = cli.first_ledger + (w as u64 % ledgers);
        let lane = w as u64 / ledgers;
        workers.push(tokio::spawn(async move {
            let mut hist = new_hist()?;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let entry_id = (n * stride + lane) as i64;
                let body = entry(ledger, entry_id, &payload);
                let t = Instant::now();
                let s = c.add(ledger, entry_id, key.clone(), false, body).await?;
                if s != StatusCode::Ok {
                    bail!("add answered {}", s.as_str_name());
                }
                hist.record(t.elapsed().as_micros().max(1) as u64)?;
                adds.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            anyhow::Ok(hist)
        }));
    }
    tokio::time::sleep(Duration::from_secs(cli.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut h = new_hist()?;
    for w in workers {
        h.add(w.await??)?;
    }
    let secs = started.elapsed().as_secs_f64();
    let n = adds.load(Ordering::Relaxed);
    let rate = n as f64 / secs;
    let mib = rate * cli.size as f64 / (1024.0 * 1024.0);
    let s = summary(&h);
    eprintln!(
        "throughput: {rate:.0} adds/s, {mib:.1} MiB/s ({} B, {} in flight); latency {s}",
        cli.size, cli.concurrency
    );
    Ok(serde_json::json!({
        "mode": "throughput", "size": cli.size, "concurrency": cli.concurrency,
        "adds_per_s": rate, "mib_per_s": mib, "latency": s
    }))
}
