//! Index-engine measurement for the bookie's shared ledger index (STORAGE task):
//! 1,000,000 ledgers × 4 entries, the key/value layout of `cms_bookie::storage`.
//!
//! Run one engine per process (RSS is per process):
//!
//! ```text
//! cargo run --release -p cms-bookie --example index_bench -- redb  [ledgers] [dir]
//! cargo run --release -p cms-bookie --example index_bench --features bench-fjall -- fjall [ledgers] [dir]
//! ```
//!
//! What it does: inserts `ledgers × 4` locations (key = ledger u64 BE ‖ entry i64,
//! value = location u64 ‖ size u32) plus one 30-byte ledger state per ledger, in
//! sorted batches of 100,000 entries, one durable commit per batch (as checkpoints
//! do); then reports the on-disk size, the time to reopen and read one key, the
//! p50/p99/max of 100,000 random lookups (seeded), and the process RSS (VmRSS) and
//! peak (VmHWM) from `/proc/self/status`.

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark binary: failing loudly is the point"
)]
#![allow(missing_docs, reason = "example binary")]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

const ENTRIES_PER_LEDGER: u64 = 4;
const BATCH_ENTRIES: u64 = 100_000;
const LOOKUPS: usize = 100_000;
/// Cache given to each engine (same for both, so RSS compares fairly).
const CACHE_BYTES: usize = 64 << 20;

trait Engine {
    /// One durable batch: locations (ledger, entry, location, size) and states.
    fn commit_batch(&mut self, locs: &[(u64, i64, u64, u32)], states: &[(u64, [u8; 30])]);
    fn get(&self, ledger: u64, entry: i64) -> Option<(u64, u32)>;
}

fn location_of(ledger: u64, entry: i64) -> (u64, u32) {
    (ledger.wrapping_mul(31).wrapping_add(entry as u64), 100)
}

mod redb_engine {
    use super::*;
    use redb::{Database, ReadableDatabase, TableDefinition};

    const LOCATIONS: TableDefinition<(u64, i64), (u64, u32)> = TableDefinition::new("locations");
    const LEDGERS: TableDefinition<u64, &[u8]> = TableDefinition::new("ledgers");

    pub struct Redb {
        db: Database,
    }

    impl Redb {
        pub fn open(dir: &Path) -> Redb {
            std::fs::create_dir_all(dir).unwrap();
            let db = redb::Builder::new()
                .set_cache_size(CACHE_BYTES)
                .create(dir.join("index.redb"))
                .unwrap();
            Redb { db }
        }
    }

    impl Engine for Redb {
        fn commit_batch(&mut self, locs: &[(u64, i64, u64, u32)], states: &[(u64, [u8; 30])]) {
            let txn = self.db.begin_write().unwrap();
            {
                let mut t = txn.open_table(LOCATIONS).unwrap();
                for &(l, e, loc, size) in locs {
                    t.insert((l, e), (loc, size)).unwrap();
                }
                let mut s = txn.open_table(LEDGERS).unwrap();
                for (l, st) in states {
                    s.insert(*l, st.as_slice()).unwrap();
                }
            }
            txn.commit().unwrap();
        }

        fn get(&self, ledger: u64, entry: i64) -> Option<(u64, u32)> {
            let txn = self.db.begin_read().unwrap();
            let t = txn.open_table(LOCATIONS).unwrap();
            t.get((ledger, entry)).unwrap().map(|v| v.value())
        }
    }
}

#[cfg(feature = "bench-fjall")]
mod fjall_engine {
    use super::*;
    use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

    pub struct Fjall {
        db: Database,
        locations: Keyspace,
        ledgers: Keyspace,
    }

    fn key(l: u64, e: i64) -> [u8; 16] {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&l.to_be_bytes());
        k[8..].copy_from_slice(&((e as u64) ^ (1 << 63)).to_be_bytes());
        k
    }

    impl Fjall {
        pub fn open(dir: &Path) -> Fjall {
            let db = Database::builder(dir)
                .cache_size(CACHE_BYTES as u64)
                .open()
                .unwrap();
            let locations = db
                .keyspace("locations", KeyspaceCreateOptions::default)
                .unwrap();
            let ledgers = db
                .keyspace("ledgers", KeyspaceCreateOptions::default)
                .unwrap();
            Fjall {
                db,
                locations,
                ledgers,
            }
        }
    }

    impl Engine for Fjall {
        fn commit_batch(&mut self, locs: &[(u64, i64, u64, u32)], states: &[(u64, [u8; 30])]) {
            let mut b = self.db.batch();
            for &(l, e, loc, size) in locs {
                let mut v = [0u8; 12];
                v[..8].copy_from_slice(&loc.to_be_bytes());
                v[8..].copy_from_slice(&size.to_be_bytes());
                b.insert(&self.locations, key(l, e), v);
            }
            for (l, st) in states {
                b.insert(&self.ledgers, l.to_be_bytes(), st.as_slice());
            }
            b.commit().unwrap();
            self.db.persist(PersistMode::SyncAll).unwrap();
        }

        fn get(&self, ledger: u64, entry: i64) -> Option<(u64, u32)> {
            self.locations.get(key(ledger, entry)).unwrap().map(|v| {
                let loc = u64::from_be_bytes(v[..8].try_into().unwrap());
                let size = u32::from_be_bytes(v[8..12].try_into().unwrap());
                (loc, size)
            })
        }
    }
}

fn open_engine(name: &str, dir: &Path) -> Box<dyn Engine> {
    match name {
        "redb" => Box::new(redb_engine::Redb::open(dir)),
        #[cfg(feature = "bench-fjall")]
        "fjall" => Box::new(fjall_engine::Fjall::open(dir)),
        other => panic!("unknown engine {other} (fjall needs --features bench-fjall)"),
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let md = e.metadata().unwrap();
        total += if md.is_dir() {
            dir_bytes(&e.path())
        } else {
            md.len()
        };
    }
    total
}

fn proc_status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p) as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let engine = args
        .get(1)
        .map(String::as_str)
        .unwrap_or("redb")
        .to_string();
    let ledgers: u64 = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(1_000_000);
    let dir: PathBuf = args
        .get(3)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("cms-index-bench-{engine}")));
    let _ = std::fs::remove_dir_all(&dir);

    let total_entries = ledgers * ENTRIES_PER_LEDGER;
    let mut db = open_engine(&engine, &dir);
    let start = Instant::now();
    let mut next = 0u64;
    while next < total_entries {
        let end = (next + BATCH_ENTRIES).min(total_entries);
        let mut locs = Vec::with_capacity((end - next) as usize);
        let mut states = Vec::new();
        for i in next..end {
            let (l, e) = (i / ENTRIES_PER_LEDGER, (i % ENTRIES_PER_LEDGER) as i64);
            let (loc, size) = location_of(l, e);
            locs.push((l, e, loc, size));
            if e == 0 {
                let mut st = [0u8; 30];
                st[..8].copy_from_slice(&l.to_be_bytes());
                states.push((l, st));
            }
        }
        db.commit_batch(&locs, &states);
        next = end;
    }
    let insert = start.elapsed();
    drop(db);
    let size = dir_bytes(&dir);

    let start = Instant::now();
    let db = open_engine(&engine, &dir);
    assert_eq!(db.get(0, 0), Some(location_of(0, 0)));
    let open = start.elapsed();

    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut samples = Vec::with_capacity(LOOKUPS);
    for _ in 0..LOOKUPS {
        let l = rng.random_range(0..ledgers);
        let e = rng.random_range(0..ENTRIES_PER_LEDGER) as i64;
        let t = Instant::now();
        let got = db.get(l, e);
        samples.push(t.elapsed());
        assert_eq!(got, Some(location_of(l, e)));
    }
    samples.sort();
    println!(
        "engine={engine} ledgers={ledgers} entries={total_entries} batch={BATCH_ENTRIES} cache={}MiB",
        CACHE_BYTES >> 20
    );
    println!(
        "insert: {:.2} s ({:.0} entries/s, {} durable commits)",
        insert.as_secs_f64(),
        total_entries as f64 / insert.as_secs_f64(),
        total_entries.div_ceil(BATCH_ENTRIES)
    );
    println!("disk: {:.1} MiB", size as f64 / (1 << 20) as f64);
    println!("reopen + first get: {:.1} ms", open.as_secs_f64() * 1e3);
    println!(
        "random get ({LOOKUPS}, page cache warm): p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        pct(&samples, 0.5).as_secs_f64() * 1e6,
        pct(&samples, 0.99).as_secs_f64() * 1e6,
        samples[samples.len() - 1].as_secs_f64() * 1e6
    );
    println!(
        "rss: {} MiB now, {} MiB peak",
        proc_status_kib("VmRSS:") / 1024,
        proc_status_kib("VmHWM:") / 1024
    );
    let _ = std::fs::remove_dir_all(&dir);
}
