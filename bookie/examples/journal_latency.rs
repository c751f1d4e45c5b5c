//! Sync append latency of the journal: one writer, 1 KiB entries, each append
//! awaited before the next (fsync before ack), then the same with concurrent
//! appenders to show group commit.
//!
//! `cargo run --release -p cms-bookie --example journal_latency -- [dir] [appends]`
//! (`dir`: where the journal goes, default `.`, on the disk to measure).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cms_bookie::fs::RealFs;
use cms_bookie::journal::{Journal, JournalConfig, JournalMetrics, JournalRecord};

const WARMUP_APPENDS: usize = 200;
const PAYLOAD_BYTES: usize = 1024;
const CONCURRENT_APPENDERS: usize = 64;

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

fn entry(i: usize) -> JournalRecord {
    JournalRecord::Entry {
        ledger_id: 1,
        entry_id: i as i64,
        data: Bytes::from(vec![(i % 251) as u8; PAYLOAD_BYTES]),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let base = args.get(1).cloned().unwrap_or_else(|| ".".into());
    let n: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(2000);
    let dir = tempfile::tempdir_in(&base)?;
    let cfg = JournalConfig::new(dir.path().to_path_buf());
    let j = Journal::open(
        Arc::new(RealFs),
        cfg,
        JournalMetrics::unregistered(),
        &mut |_| Ok(()),
    )?;

    for i in 0..WARMUP_APPENDS {
        j.append(entry(i)).await?;
    }
    let mut lat = Vec::with_capacity(n);
    let started = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        j.append(entry(WARMUP_APPENDS + i)).await?;
        lat.push(t.elapsed());
    }
    let elapsed = started.elapsed();
    lat.sort();
    println!(
        "lone 1 KiB appends, fsync before ack: n={n} p50={:.3} ms p99={:.3} ms p99.9={:.3} ms max={:.3} ms ({:.0} appends/s)",
        pct(&lat, 0.50),
        pct(&lat, 0.99),
        pct(&lat, 0.999),
        pct(&lat, 1.0),
        n as f64 / elapsed.as_secs_f64()
    );

    // Group commit: CONCURRENT_APPENDERS appends in flight at all times.
    let total = n * 10;
    let started = Instant::now();
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let mut next = 0;
    let mut done = 0;
    use futures::StreamExt;
    while done < total {
        while in_flight.len() < CONCURRENT_APPENDERS && next < total {
            in_flight.push(j.append(entry(next)));
            next += 1;
        }
        if let Some(r) = in_flight.next().await {
            r?;
            done += 1;
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{CONCURRENT_APPENDERS} appends in flight: {total} appends in {:.2} s = {:.0} appends/s ({:.1} MiB/s)",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        (total * PAYLOAD_BYTES) as f64 / elapsed.as_secs_f64() / (1024.0 * 1024.0)
    );
    j.close()?;
    Ok(())
}
