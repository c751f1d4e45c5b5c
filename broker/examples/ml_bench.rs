//! `ml_bench`: managed-ledger benchmarks against a running cluster
//! (`scripts/bench-ml` starts ZooKeeper and 3 bookies). One JSON line per
//! mode on stdout, a human summary on stderr.
//!
//! Modes:
//! - `append`: in one run, `--count` sync appends (one at a time, after a
//!   warm-up) straight on a ledger (the raw ledger client) and through a
//!   managed ledger, then `--seconds` of pipelined appends (`--window` in
//!   flight) on each; p50/p99/p99.9/max and entries/s side by side, and the
//!   managed ledger's overhead in %;
//! - `cursor`: acks at `--ack-rate` per second for `--seconds` on one durable
//!   cursor over a pre-written backlog, first with persistence at most once a
//!   second (the default), then with persistence off (only on close); cursor
//!   snapshots per second, snapshot bytes per second, and process CPU of
//!   each phase (`/proc/self/stat`, clock ticks of 10 ms);
//! - `topics`: opens `--topics` managed ledgers with one durable cursor each
//!   (`--concurrency` at once) and reports the RSS growth per idle topic
//!   (`/proc/self/status` VmRSS before and after).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use cms_bookie::client::driver::{LedgerClient, LedgerClientOptions};
use cms_bookie::metadata::MetadataStore;
use cms_bookie::metadata::connect::{MetadataUrl, connect};
use cms_bookie::metadata::layout::Layout;
use cms_bookie::metadata::zk::ZkOptions;
use cms_broker::managed_ledger::io::{EntryCache, ManagedLedger, ManagedLedgerConfig, Persist};
use cms_broker::managed_ledger::{CursorConfig, InitialPosition, MlMetrics};
use hdrhistogram::Histogram;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Append,
    Cursor,
    Topics,
}

/// Managed-ledger benchmarks.
#[derive(Debug, Parser)]
#[command(name = "ml_bench", about)]
struct Cli {
    /// What to measure.
    #[arg(long, value_enum)]
    mode: Mode,
    /// Metadata store URL.
    #[arg(long, default_value = "zk://127.0.0.1:2181")]
    metadata_url: String,
    /// Payload bytes per entry.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Sync appends measured (append mode), after the warm-up.
    #[arg(long, default_value_t = 10_000)]
    count: u64,
    /// Warm-up appends not counted.
    #[arg(long, default_value_t = 500)]
    warmup: u64,
    /// Appends in flight (pipelined phase).
    #[arg(long, default_value_t = 1_000)]
    window: usize,
    /// Duration of a timed phase, seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Acks per second (cursor mode).
    #[arg(long, default_value_t = 10_000)]
    ack_rate: u64,
    /// Topics to open (topics mode).
    #[arg(long, default_value_t = 1_000)]
    topics: usize,
    /// Topic opens at once (topics mode).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Name prefix of the topics (unique per run).
    #[arg(long, default_value = "bench")]
    prefix: String,
}

struct Env {
    client: LedgerClient,
    store: Arc<dyn MetadataStore>,
    layout: Layout,
}

async fn env(cli: &Cli) -> anyhow::Result<Env> {
    let url: MetadataUrl = cli
        .metadata_url
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let store = connect(&url, &ZkOptions::default()).await?;
    let layout = Layout::new("/cms")?;
    let mut o = LedgerClientOptions::default();
    o.writer.outstanding_adds_max = o.writer.outstanding_adds_max.max(cli.window);
    let client = LedgerClient::connect(store.clone(), layout.clone(), o).await?;
    Ok(Env {
        client,
        store,
        layout,
    })
}

fn hist() -> anyhow::Result<Histogram<u64>> {
    Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).context("histogram")
}

fn summary(h: &Histogram<u64>) -> serde_json::Value {
    let ms = |us: u64| us as f64 / 1000.0;
    serde_json::json!({
        "samples": h.len(),
        "p50_ms": ms(h.value_at_quantile(0.50)),
        "p99_ms": ms(h.value_at_quantile(0.99)),
        "p999_ms": ms(h.value_at_quantile(0.999)),
        "max_ms": ms(h.max()),
    })
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn ml_config(metrics: &MlMetrics) -> ManagedLedgerConfig {
    ManagedLedgerConfig {
        metrics: metrics.clone(),
        ..ManagedLedgerConfig::default()
    }
}

async fn open(
    env: &Env,
    name: &str,
    config: ManagedLedgerConfig,
    cache: EntryCache,
) -> anyhow::Result<ManagedLedger> {
    Ok(ManagedLedger::open(
        env.client.clone(),
        env.store.clone(),
        &env.layout,
        name,
        config,
        cache,
    )
    .await?)
}

async fn append_mode(cli: &Cli, env: &Env) -> anyhow::Result<serde_json::Value> {
    let body = bytes::Bytes::from(vec![7u8; cli.size]);
    let raw = env
        .client
        .create_ledger(3, 3, 2, b"bench", Default::default())
        .await?;
    let metrics = MlMetrics::new();
    let ml = open(
        env,
        &format!("bench/ns/{}-append", cli.prefix),
        ml_config(&metrics),
        EntryCache::new(64 << 20),
    )
    .await?;
    // Sync: raw, then managed.
    let mut h_raw = hist()?;
    for i in 0..cli.warmup + cli.count {
        let t = Instant::now();
        raw.add(body.clone()).await?;
        if i >= cli.warmup {
            h_raw.record(micros(t.elapsed()))?;
        }
    }
    let mut h_ml = hist()?;
    for i in 0..cli.warmup + cli.count {
        let t = Instant::now();
        ml.append(body.clone()).await?;
        if i >= cli.warmup {
            h_ml.record(micros(t.elapsed()))?;
        }
    }
    // Pipelined: raw, then managed.
    let secs = Duration::from_secs(cli.seconds);
    let t = Instant::now();
    let mut n_raw = 0u64;
    let mut pending = VecDeque::new();
    while t.elapsed() < secs {
        pending.push_back(raw.add_pipelined(body.clone()).await?);
        if pending.len() >= cli.window
            && let Some(p) = pending.pop_front()
        {
            p.await?;
            n_raw += 1;
        }
    }
    for p in pending {
        p.await?;
        n_raw += 1;
    }
    let rate_raw = n_raw as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut n_ml = 0u64;
    let mut pending = VecDeque::new();
    while t.elapsed() < secs {
        pending.push_back(ml.append_pipelined(body.clone()).await?);
        if pending.len() >= cli.window
            && let Some(p) = pending.pop_front()
        {
            p.wait().await?;
            n_ml += 1;
        }
    }
    for p in pending {
        p.wait().await?;
        n_ml += 1;
    }
    let rate_ml = n_ml as f64 / t.elapsed().as_secs_f64();
    ml.close().await?;
    let p50 = |h: &Histogram<u64>| h.value_at_quantile(0.5) as f64;
    let p99 = |h: &Histogram<u64>| h.value_at_quantile(0.99) as f64;
    let overhead = |a: f64, b: f64| (b / a - 1.0) * 100.0;
    eprintln!(
        "sync p50 raw {:.3} ms / managed {:.3} ms ({:+.1} %); p99 {:.3} / {:.3} ms; pipelined raw {rate_raw:.0} / managed {rate_ml:.0} entries/s ({:+.1} %)",
        p50(&h_raw) / 1000.0,
        p50(&h_ml) / 1000.0,
        overhead(p50(&h_raw), p50(&h_ml)),
        p99(&h_raw) / 1000.0,
        p99(&h_ml) / 1000.0,
        overhead(rate_ml, rate_raw),
    );
    Ok(serde_json::json!({
        "mode": "append", "size": cli.size, "window": cli.window, "seconds": cli.seconds,
        "sync_raw": summary(&h_raw), "sync_managed": summary(&h_ml),
        "sync_p50_overhead_pct": overhead(p50(&h_raw), p50(&h_ml)),
        "pipelined_raw_per_s": rate_raw, "pipelined_managed_per_s": rate_ml,
        "pipelined_throughput_loss_pct": (1.0 - rate_ml / rate_raw) * 100.0,
    }))
}

/// Process CPU time (user + system) in seconds, from `/proc/self/stat`
/// (clock ticks of 10 ms: `CLK_TCK` is 100 on Linux).
fn cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after = stat
        .rsplit_once(')')
        .map(|(_, a)| a)
        .context("/proc/self/stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the line; `after` starts at field 3.
    let ticks: u64 =
        f.get(11).context("utime")?.parse::<u64>()? + f.get(12).context("stime")?.parse::<u64>()?;
    Ok(ticks as f64 / 100.0)
}

fn rss_bytes() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb * 1024)
}

async fn cursor_phase(
    cli: &Cli,
    env: &Env,
    persist_interval_ms: u64,
    tag: &str,
) -> anyhow::Result<serde_json::Value> {
    let metrics = MlMetrics::new();
    let config = ManagedLedgerConfig {
        cursor: CursorConfig {
            persist_interval_ms,
            ..CursorConfig::default()
        },
        ..ml_config(&metrics)
    };
    let ml = open(
        env,
        &format!("bench/ns/{}-cursor-{tag}", cli.prefix),
        config,
        EntryCache::new(0),
    )
    .await?;
    let sub = ml.open_cursor("sub", InitialPosition::Earliest).await?;
    let n = cli.ack_rate * cli.seconds;
    let body = bytes::Bytes::from(vec![7u8; 100]);
    let mut positions = Vec::new();
    let mut pending = VecDeque::new();
    for _ in 0..n {
        pending.push_back(ml.append_pipelined(body.clone()).await?);
        if pending.len() >= 1_000
            && let Some(p) = pending.pop_front()
        {
            positions.push(p.wait().await?);
        }
    }
    for p in pending {
        positions.push(p.wait().await?);
    }
    // Ack in order, but every 50th entry only 25 entries later, so the
    // cursor carries individually acked ranges as a consumer's would.
    let mut order = Vec::with_capacity(positions.len());
    let mut late = VecDeque::new();
    for (i, p) in positions.iter().enumerate() {
        if i % 50 == 0 {
            late.push_back((i + 25, *p));
        } else {
            order.push(*p);
        }
        while late.front().is_some_and(|(due, _)| *due <= i) {
            if let Some((_, p)) = late.pop_front() {
                order.push(p);
            }
        }
    }
    order.extend(late.into_iter().map(|(_, p)| p));
    let before = metrics.snapshot();
    let cpu0 = cpu_seconds()?;
    let t = Instant::now();
    for (i, p) in order.iter().enumerate() {
        let due =
            Duration::from_micros(u64::try_from(i).unwrap_or(u64::MAX) * 1_000_000 / cli.ack_rate);
        if let Some(wait) = due.checked_sub(t.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        sub.ack(*p, Persist::Wait).await?;
        if i % 1_000 == 0 {
            ml.tick().await?;
        }
    }
    let took = t.elapsed().as_secs_f64();
    let cpu = cpu_seconds()? - cpu0;
    let after = metrics.snapshot();
    ml.close().await?;
    let persists = after.cursor_persists - before.cursor_persists;
    let bytes = after.cursor_persist_bytes - before.cursor_persist_bytes;
    let out = serde_json::json!({
        "persist_interval_ms": persist_interval_ms,
        "acks": order.len(), "seconds": took, "acks_per_s": order.len() as f64 / took,
        "persists_per_s": persists as f64 / took, "persist_bytes_per_s": bytes as f64 / took,
        "bytes_per_snapshot": bytes.checked_div(persists).unwrap_or(0),
        "cpu_seconds": cpu, "cpu_pct_of_one_core": cpu / took * 100.0,
    });
    eprintln!("cursor ({tag}): {out}");
    Ok(out)
}

async fn cursor_mode(cli: &Cli, env: &Env) -> anyhow::Result<serde_json::Value> {
    let on = cursor_phase(cli, env, 1_000, "persist").await?;
    let off = cursor_phase(cli, env, u64::MAX, "nopersist").await?;
    Ok(
        serde_json::json!({"mode": "cursor", "ack_rate": cli.ack_rate, "with_persistence": on, "without_persistence": off}),
    )
}

async fn topics_mode(cli: &Cli, env: &Env) -> anyhow::Result<serde_json::Value> {
    let cache = EntryCache::new(64 << 20);
    let metrics = MlMetrics::new();
    // Warm up allocator and connections with a few topics first.
    let mut held = Vec::new();
    for i in 0..8 {
        let ml = open(
            env,
            &format!("bench/ns/{}-warm-{i}", cli.prefix),
            ml_config(&metrics),
            cache.clone(),
        )
        .await?;
        held.push((ml.open_cursor("sub", InitialPosition::Latest).await?, ml));
    }
    let rss0 = rss_bytes()?;
    let t = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(cli.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..cli.topics {
        let permit = sem.clone().acquire_owned().await?;
        let (client, store, layout) = (env.client.clone(), env.store.clone(), env.layout.clone());
        let (cache, config) = (cache.clone(), ml_config(&metrics));
        let name = format!("bench/ns/{}-{i}", cli.prefix);
        tasks.spawn(async move {
            let _permit = permit;
            let ml = ManagedLedger::open(client, store, &layout, &name, config, cache).await?;
            let c = ml.open_cursor("sub", InitialPosition::Latest).await?;
            anyhow::Ok((c, ml))
        });
    }
    while let Some(r) = tasks.join_next().await {
        held.push(r??);
    }
    let open_s = t.elapsed().as_secs_f64();
    let rss1 = rss_bytes()?;
    let per_topic = rss1.saturating_sub(rss0) as f64 / cli.topics as f64;
    let out = serde_json::json!({
        "mode": "topics", "topics": cli.topics, "open_seconds": open_s,
        "opens_per_s": cli.topics as f64 / open_s,
        "rss_before_mib": rss0 as f64 / 1048576.0, "rss_after_mib": rss1 as f64 / 1048576.0,
        "rss_bytes_per_topic": per_topic,
        "projected_10000_topics_mib": per_topic * 10_000.0 / 1048576.0 + rss0 as f64 / 1048576.0,
    });
    eprintln!("topics: {out}");
    Ok(out)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let env = env(&cli).await?;
    let out = match cli.mode {
        Mode::Append => append_mode(&cli, &env).await?,
        Mode::Cursor => cursor_mode(&cli, &env).await?,
        Mode::Topics => topics_mode(&cli, &env).await?,
    };
    println!("{out}");
    Ok(())
}
