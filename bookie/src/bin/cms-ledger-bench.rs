//! `cms-ledger-bench`: ledger client benchmarks against a running cluster
//! (`scripts/bench-ledger` starts ZooKeeper and the bookies).
//!
//! Modes (one JSON line each on stdout, a human summary on stderr):
//! - `floor`: the ack-quorum fsync floor of this disk in the same run: three
//!   pre-filled files each get a `--size` write + `fdatasync` at once (three
//!   threads), the sample is the time until the **second** finished (what an
//!   E3/Qw3/Qa2 add waits for at best); p50/p99/p99.9;
//! - `sync`: one add at a time on one E/Qw/Qa ledger, `--count` adds after a
//!   warm-up; p50/p99/p99.9/max of the add latency;
//! - `throughput`: `--ledgers` ledgers, each with `--window` adds in flight,
//!   for `--seconds`; entries/s and MiB/s;
//! - `stall`: one ledger with `--window` adds in flight for `--seconds`;
//!   halfway, SIGKILL the process of one bookie of its ensemble
//!   (`--bookie-pid id=pid`, repeated); reports the longest add latency and
//!   the longest gap between two completions, and whether the ensemble changed;
//! - `rate`: open loop, one ledger, `--rate` adds/s for `--seconds`, each add
//!   sent at its intended time (at most `--window` in flight); latency from
//!   the **intended** send time (no coordinated omission), as BENCH.md's W2;
//! - `fill`: writes `--ledgers` ledgers of `--count` entries (`--window` in
//!   flight), closes and keeps them (data for re-replication runs).

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use cms_bookie::client::driver::{LedgerClient, LedgerClientOptions, WriteHandle};
use cms_bookie::metadata::connect::{MetadataUrl, connect};
use cms_bookie::metadata::layout::Layout;
use cms_bookie::metadata::zk::ZkOptions;
use hdrhistogram::Histogram;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Floor,
    Sync,
    Throughput,
    Stall,
    Rate,
    Fill,
}

/// Ledger client benchmarks.
#[derive(Debug, Parser)]
#[command(name = "cms-ledger-bench", version, about)]
struct Cli {
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Mode::Sync)]
    mode: Mode,
    /// Metadata store URL.
    #[arg(long, default_value = "zk://127.0.0.1:2181")]
    metadata_url: String,
    /// Metadata root.
    #[arg(long, default_value = "/cms")]
    root: String,
    /// Ensemble size.
    #[arg(long, default_value_t = 3)]
    ensemble: usize,
    /// Write quorum.
    #[arg(long, default_value_t = 3)]
    write_quorum: usize,
    /// Ack quorum.
    #[arg(long, default_value_t = 2)]
    ack_quorum: usize,
    /// Payload bytes per entry.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Samples (sync and floor modes), after the warm-up.
    #[arg(long, default_value_t = 20_000)]
    count: u64,
    /// Warm-up samples not counted.
    #[arg(long, default_value_t = 500)]
    warmup: u64,
    /// Adds in flight per ledger (throughput and stall modes).
    #[arg(long, default_value_t = 256)]
    window: usize,
    /// Ledgers written at once (throughput mode).
    #[arg(long, default_value_t = 1)]
    ledgers: usize,
    /// Duration (throughput and stall modes), in seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Directory for the floor files (floor mode).
    #[arg(long, default_value = ".")]
    floor_dir: PathBuf,
    /// `bookie-id=pid` of each bookie process (stall mode).
    #[arg(long)]
    bookie_pid: Vec<String>,
    /// Adds per second (rate mode).
    #[arg(long, default_value_t = 2_000)]
    rate: u64,
}

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
    Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).context("creating a histogram")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let out = match cli.mode {
        Mode::Floor => floor(&cli)?,
        Mode::Sync => sync(&cli).await?,
        Mode::Throughput => throughput(&cli).await?,
        Mode::Stall => stall(&cli).await?,
        Mode::Rate => rate(&cli).await?,
        Mode::Fill => fill(&cli).await?,
    };
    println!("{out}");
    std::io::stdout().flush().ok();
    Ok(())
}

fn floor(cli: &Cli) -> anyhow::Result<serde_json::Value> {
    let samples = cli.count + cli.warmup;
    let block = cli.size.div_ceil(4096).max(1) * 4096;
    let data = vec![0xA5u8; cli.size];
    let mut workers = Vec::new();
    let (done_tx, done_rx) = std_mpsc::channel::<anyhow::Result<Instant>>();
    let mut paths = Vec::new();
    for k in 0..3 {
        let path = cli
            .floor_dir
            .join(format!("cms-quorum-floor-{}-{k}.tmp", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let zero = vec![0u8; block];
        for i in 0..samples {
            file.write_all_at(&zero, i * block as u64)?;
        }
        file.sync_all()?;
        paths.push(path);
        let (go_tx, go_rx) = std_mpsc::channel::<u64>();
        let done = done_tx.clone();
        let data = data.clone();
        let handle = std::thread::spawn(move || {
            for i in go_rx {
                let r = file
                    .write_all_at(&data, i * block as u64)
                    .and_then(|()| file.sync_data())
                    .map(|()| Instant::now())
                    .map_err(anyhow::Error::from);
                if done.send(r).is_err() {
                    return;
                }
            }
        });
        workers.push((go_tx, handle));
    }
    let mut h = new_hist()?;
    for i in 0..samples {
        let start = Instant::now();
        for (go, _) in &workers {
            go.send(i).context("floor worker gone")?;
        }
        let mut ends = Vec::with_capacity(3);
        for _ in 0..3 {
            ends.push(done_rx.recv().context("floor worker gone")??);
        }
        ends.sort();
        if i >= cli.warmup {
            h.record(micros(ends[1].duration_since(start)))?;
        }
    }
    for (go, handle) in workers {
        drop(go);
        handle.join().ok();
    }
    for p in paths {
        std::fs::remove_file(&p).ok();
    }
    let s = summary(&h);
    eprintln!(
        "ack-quorum fsync floor (2nd of 3 files, {} B + fdatasync): {s}",
        cli.size
    );
    Ok(serde_json::json!({"mode": "floor", "size": cli.size, "latency": s}))
}

async fn client(cli: &Cli) -> anyhow::Result<LedgerClient> {
    let url: MetadataUrl = cli
        .metadata_url
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let store = connect(&url, &ZkOptions::default()).await?;
    let layout = Layout::new(&cli.root)?;
    let mut o = LedgerClientOptions::default();
    o.writer.outstanding_adds_max = o.writer.outstanding_adds_max.max(cli.window);
    Ok(LedgerClient::connect(store, layout, o).await?)
}

async fn create(cli: &Cli, c: &LedgerClient) -> anyhow::Result<WriteHandle> {
    Ok(c.create_ledger(
        cli.ensemble,
        cli.write_quorum,
        cli.ack_quorum,
        b"cms-ledger-bench",
        HashMap::new(),
    )
    .await?)
}

fn quorum(cli: &Cli) -> String {
    format!(
        "E{}/Qw{}/Qa{}",
        cli.ensemble, cli.write_quorum, cli.ack_quorum
    )
}

async fn sync(cli: &Cli) -> anyhow::Result<serde_json::Value> {
    let c = client(cli).await?;
    let w = create(cli, &c).await?;
    let payload = Bytes::from(vec![0x5Au8; cli.size]);
    let mut h = new_hist()?;
    for i in 0..(cli.warmup + cli.count) {
        let t = Instant::now();
        w.add(payload.clone()).await?;
        if i >= cli.warmup {
            h.record(micros(t.elapsed()))?;
        }
    }
    w.close().await?;
    c.delete_ledger(w.ledger_id()).await?;
    let s = summary(&h);
    eprintln!("sync adds of {} B, {}: {s}", cli.size, quorum(cli));
    Ok(serde_json::json!({"mode": "sync", "size": cli.size, "quorum": quorum(cli), "latency": s}))
}

/// What one pipelined writer saw.
struct Run {
    adds: u64,
    latency: Histogram<u64>,
    longest_gap: Duration,
}

/// Adds with `window` in flight until `deadline`; `at_half` runs once halfway.
async fn pipelined(
    w: WriteHandle,
    size: usize,
    window: usize,
    seconds: u64,
    at_half: Option<Box<dyn FnOnce() + Send>>,
) -> anyhow::Result<Run> {
    let payload = Bytes::from(vec![0x5Au8; size]);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let half = start + Duration::from_secs(seconds) / 2;
    let mut at_half = at_half;
    let mut pending = VecDeque::with_capacity(window);
    let mut latency = new_hist()?;
    let mut adds = 0u64;
    let mut last_completion = Instant::now();
    let mut longest_gap = Duration::ZERO;
    loop {
        let now = Instant::now();
        if now >= half
            && let Some(f) = at_half.take()
        {
            f();
        }
        if now < deadline && pending.len() < window.max(1) {
            pending.push_back((Instant::now(), w.add_pipelined(payload.clone()).await?));
            continue;
        }
        let Some((t, p)) = pending.pop_front() else {
            break;
        };
        p.await?;
        let done = Instant::now();
        latency.record(micros(done.duration_since(t)))?;
        longest_gap = longest_gap.max(done.duration_since(last_completion));
        last_completion = done;
        adds += 1;
    }
    Ok(Run {
        adds,
        latency,
        longest_gap,
    })
}

async fn throughput(cli: &Cli) -> anyhow::Result<serde_json::Value> {
    let c = client(cli).await?;
    let mut handles = Vec::new();
    let mut writers = Vec::new();
    for _ in 0..cli.ledgers.max(1) {
        writers.push(create(cli, &c).await?);
    }
    let started = Instant::now();
    for w in &writers {
        handles.push(tokio::spawn(pipelined(
            w.clone(),
            cli.size,
            cli.window,
            cli.seconds,
            None,
        )));
    }
    let mut adds = 0u64;
    let mut h = new_hist()?;
    for j in handles {
        let r = j.await??;
        adds += r.adds;
        h.add(&r.latency)?;
    }
    let secs = started.elapsed().as_secs_f64();
    for w in writers {
        w.close().await?;
        c.delete_ledger(w.ledger_id()).await?;
    }
    let rate = adds as f64 / secs;
    let mib = rate * cli.size as f64 / (1024.0 * 1024.0);
    let s = summary(&h);
    eprintln!(
        "pipelined {} B, {}, {} ledger(s) x {} in flight: {rate:.0} entries/s, {mib:.1} MiB/s; latency {s}",
        cli.size,
        quorum(cli),
        cli.ledgers,
        cli.window
    );
    Ok(serde_json::json!({
        "mode": "throughput", "size": cli.size, "quorum": quorum(cli),
        "ledgers": cli.ledgers, "window": cli.window,
        "entries_per_s": rate, "mib_per_s": mib, "latency": s,
    }))
}

async fn rate(cli: &Cli) -> anyhow::Result<serde_json::Value> {
    let c = client(cli).await?;
    let w = create(cli, &c).await?;
    let payload = Bytes::from(vec![0x5Au8; cli.size]);
    let rate = cli.rate.max(1);
    let total = rate.saturating_mul(cli.seconds);
    let (tx, mut rx) = tokio::sync::mpsc::channel(cli.window.max(1));
    // Completions are in add order, so one task awaits them in order.
    let collector = tokio::spawn(async move {
        let mut h = new_hist()?;
        while let Some((intended, pending)) = rx.recv().await {
            let pending: cms_bookie::client::driver::PendingAdd = pending;
            pending.await?;
            h.record(micros(Instant::now().saturating_duration_since(intended)))?;
        }
        Ok::<_, anyhow::Error>(h)
    });
    let start = Instant::now() + Duration::from_millis(10);
    for i in 0..total {
        let intended = start + Duration::from_secs_f64(i as f64 / rate as f64);
        tokio::time::sleep_until(intended.into()).await;
        let pending = w.add_pipelined(payload.clone()).await?;
        if tx.send((intended, pending)).await.is_err() {
            break;
        }
    }
    drop(tx);
    let h = collector.await??;
    w.close().await?;
    c.delete_ledger(w.ledger_id()).await?;
    let s = summary(&h);
    eprintln!(
        "open loop {rate}/s for {} s, {} B, {}: latency from the intended send time {s}",
        cli.seconds,
        cli.size,
        quorum(cli)
    );
    Ok(serde_json::json!({
        "mode": "rate", "size": cli.size, "quorum": quorum(cli), "rate": rate,
        "seconds": cli.seconds, "latency": s,
    }))
}

async fn fill(cli: &Cli) -> anyhow::Result<serde_json::Value> {
    let c = client(cli).await?;
    let payload = Bytes::from(vec![0x5Au8; cli.size]);
    let mut ids = Vec::new();
    for _ in 0..cli.ledgers.max(1) {
        let w = create(cli, &c).await?;
        let mut pending = VecDeque::with_capacity(cli.window.max(1));
        for _ in 0..cli.count {
            if pending.len() >= cli.window.max(1)
                && let Some(p) = pending.pop_front()
            {
                let p: cms_bookie::client::driver::PendingAdd = p;
                p.await?;
            }
            pending.push_back(w.add_pipelined(payload.clone()).await?);
        }
        for p in pending {
            p.await?;
        }
        w.close().await?;
        ids.push(w.ledger_id());
    }
    eprintln!(
        "filled {} ledger(s) x {} entries of {} B, {}",
        ids.len(),
        cli.count,
        cli.size,
        quorum(cli)
    );
    Ok(serde_json::json!({
        "mode": "fill", "size": cli.size, "quorum": quorum(cli), "entries": cli.count,
        "ledgers": ids,
    }))
}

async fn stall(cli: &Cli) -> anyhow::Result<serde_json::Value> {
    let mut pids: HashMap<String, i32> = HashMap::new();
    for kv in &cli.bookie_pid {
        let Some((id, pid)) = kv.split_once('=') else {
            bail!("--bookie-pid wants id=pid, got {kv:?}");
        };
        pids.insert(id.to_string(), pid.parse().context("pid")?);
    }
    let c = client(cli).await?;
    let w = create(cli, &c).await?;
    let md = c.ledger_metadata(w.ledger_id()).await?;
    let victim = md
        .segments
        .first()
        .and_then(|s| s.ensemble.first())
        .cloned()
        .context("ledger without ensemble")?;
    let Some(&pid) = pids.get(&victim) else {
        bail!("no --bookie-pid for ensemble bookie {victim}");
    };
    let killed_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let k = killed_at.clone();
    let kill: Box<dyn FnOnce() + Send> = Box::new(move || {
        let r = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        if let Err(e) = r {
            eprintln!("kill -9 {pid}: {e}");
        }
        if let Ok(mut g) = k.lock() {
            *g = Some(Instant::now());
        }
    });
    let r = pipelined(w.clone(), cli.size, cli.window, cli.seconds, Some(kill)).await?;
    w.close().await?;
    let md = c.ledger_metadata(w.ledger_id()).await?;
    c.delete_ledger(w.ledger_id()).await?;
    let s = summary(&r.latency);
    let gap_ms = r.longest_gap.as_secs_f64() * 1000.0;
    eprintln!(
        "stall: killed {victim} (pid {pid}) mid-stream; longest add {} ms, longest gap between completions {gap_ms:.1} ms; {} segment(s)",
        s["max_ms"],
        md.segments.len()
    );
    Ok(serde_json::json!({
        "mode": "stall", "size": cli.size, "quorum": quorum(cli), "window": cli.window,
        "killed": victim, "segments": md.segments.len(),
        "longest_add_ms": s["max_ms"], "longest_gap_ms": gap_ms, "adds": r.adds, "latency": s,
    }))
}
