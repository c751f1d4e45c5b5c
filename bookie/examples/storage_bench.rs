//! End-to-end measurement of `cms_bookie::storage::LedgerStorage` at the STORAGE
//! benchmark target: 1,000,000 ledgers × 4 entries (100-byte entries by default).
//!
//! ```text
//! cargo run --release -p cms-bookie --example storage_bench -- [ledgers] [entry_bytes] [dir]
//! ```
//!
//! Puts every entry (ledger states included), flushing at each 25 % of the write
//! cache like checkpoints; closes; reopens (restart time); lists the ledgers; then
//! 100,000 random `get_entry` calls (seeded) on the reopened storage, caches cold
//! but the OS page cache warm; one GC pass; RSS from `/proc/self/status`.

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark binary: failing loudly is the point"
)]
#![allow(missing_docs, reason = "example binary")]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cms_bookie::fs::RealFs;
use cms_bookie::storage::{LedgerState, LedgerStorage, StorageConfig, StorageMetrics};
use rand::{Rng, SeedableRng};

const ENTRIES_PER_LEDGER: i64 = 4;
const LOOKUPS: usize = 100_000;

fn proc_status_mib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p) as usize].as_secs_f64() * 1e6
}

fn entry(ledger: u64, entry: i64, len: usize) -> Bytes {
    let mut v = vec![(ledger as u8) ^ (entry as u8); len];
    v[..8].copy_from_slice(&ledger.to_be_bytes());
    Bytes::from(v)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ledgers: u64 = args.get(1).map(|s| s.parse().unwrap()).unwrap_or(1_000_000);
    let entry_bytes: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(100);
    let dir: PathBuf = args
        .get(3)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("cms-storage-bench"));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = StorageConfig::new(dir.clone());
    let flush_bytes = cfg.write_cache_bytes_max / 4;

    let s = LedgerStorage::open(
        Arc::new(RealFs),
        cfg.clone(),
        StorageMetrics::unregistered(),
    )
    .unwrap();
    let start = Instant::now();
    let mut since_flush = 0usize;
    let mut flush_time = Duration::ZERO;
    for l in 0..ledgers {
        s.set_ledger_state(
            l,
            LedgerState {
                master_key: Bytes::from(vec![7u8; 20]),
                ..LedgerState::default()
            },
        )
        .unwrap();
        for e in 0..ENTRIES_PER_LEDGER {
            s.put_entry(l, e, entry(l, e, entry_bytes)).unwrap();
            since_flush += entry_bytes + 48;
        }
        if since_flush >= flush_bytes {
            let t = Instant::now();
            s.flush().unwrap();
            flush_time += t.elapsed();
            since_flush = 0;
        }
    }
    s.flush().unwrap();
    let write = start.elapsed();
    let disk = s.disk_bytes().unwrap();
    let rss_write = proc_status_mib("VmRSS:");
    s.close().unwrap();
    drop(s);

    let start = Instant::now();
    let s = LedgerStorage::open(Arc::new(RealFs), cfg, StorageMetrics::unregistered()).unwrap();
    let restart = start.elapsed();
    let start = Instant::now();
    let ids = s.ledger_ids().unwrap();
    let list = start.elapsed();
    assert_eq!(ids.len() as u64, ledgers);

    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut samples = Vec::with_capacity(LOOKUPS);
    for _ in 0..LOOKUPS {
        let l = rng.random_range(0..ledgers);
        let e = rng.random_range(0..ENTRIES_PER_LEDGER);
        let t = Instant::now();
        let got = s.get_entry(l, e).unwrap();
        samples.push(t.elapsed());
        assert_eq!(got, Some(entry(l, e, entry_bytes)));
    }
    samples.sort();
    println!(
        "ledgers={ledgers} entries/ledger={ENTRIES_PER_LEDGER} entry_bytes={entry_bytes} (defaults: 256 MiB write + read cache, 256 MiB index cache)"
    );
    println!(
        "write: {:.1} s for {} entries ({:.0}/s), of which flush {:.1} s; disk {:.0} MiB; RSS after writes {} MiB",
        write.as_secs_f64(),
        ledgers * ENTRIES_PER_LEDGER as u64,
        (ledgers * ENTRIES_PER_LEDGER as u64) as f64 / write.as_secs_f64(),
        flush_time.as_secs_f64(),
        disk as f64 / (1 << 20) as f64,
        rss_write
    );
    println!(
        "restart (open): {:.1} ms; ledger_ids() of {} ledgers: {:.0} ms",
        restart.as_secs_f64() * 1e3,
        ids.len(),
        list.as_secs_f64() * 1e3
    );
    println!(
        "random get_entry ({LOOKUPS}): p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        pct(&samples, 0.5),
        pct(&samples, 0.99),
        pct(&samples, 1.0)
    );
    println!(
        "rss: {} MiB now, {} MiB peak",
        proc_status_mib("VmRSS:"),
        proc_status_mib("VmHWM:")
    );
    let start = Instant::now();
    let reclaimed = s.gc_and_compact().unwrap();
    println!(
        "gc_and_compact with nothing deleted: {:.0} ms (reclaimed {reclaimed} bytes)",
        start.elapsed().as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(&dir);
}
