//! `cms-test-ml-consumer`: a test helper process that owns one managed ledger
//! with one durable cursor, produces into it and consumes and acks from it
//! until it is killed, journaling everything, so a test can SIGKILL a real
//! owner at random points (RELIABILITY P0-7) and judge what survived.
//!
//! It opens managed ledger `--topic` (recovering it), opens durable cursor
//! `--subscription` (restoring it) and journals the restored state, then runs
//! a producer task (appends `<--tag>-<n>` payloads, `--window` in flight) and
//! one sequential consumer loop (reads through the cursor, acks what it read
//! in a seeded random order, sometimes holding an entry back or acking
//! cumulatively, and calls `tick` every `--tick-ms`).
//!
//! Journal lines (one `write` each, unbuffered: a kill -9 of this process
//! loses no completed line; the file is also fsynced after every `PERSISTED`
//! line and every `--fsync-every` lines so it survives more than a process
//! kill):
//! - `RESTORED <md> <ranges>` — the cursor as restored (`md` = `ledger:entry`,
//!   ranges `l:a-l:b,...` or `-`), then `READY`;
//! - `SEND <payload>` before an append, `SENT <payload> <l:e>` after its ack;
//! - `RECV <payload> <l:e>` when the consumer reads an entry;
//! - `ACK <l:e>` / `ACKC <l:e>` before an individual / cumulative ack is issued;
//! - `PERSISTED` once the cursor's durable snapshot count grew across a call:
//!   every `ACK`/`ACKC` line before it is persisted.
//!
//! A consumer loop is sequential (reads, acks and ticks never overlap), which
//! is what makes the `PERSISTED` rule exact.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write as _;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use clap::Parser;
use cms_broker::managed_ledger::io::{
    EntryCache, ManagedCursor, ManagedLedger, ManagedLedgerConfig, Persist,
};
use cms_broker::managed_ledger::{
    CursorConfig, CursorLedgerRollover, InitialPosition, Position, RetentionPolicy, RolloverPolicy,
};
use cms_tests::cluster::managed_ledger_env;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Owns a managed ledger, produces, consumes and acks through a durable
/// cursor, journaling every step, until killed.
#[derive(Debug, Parser)]
#[command(name = "cms-test-ml-consumer", version)]
struct Args {
    /// ZooKeeper `host:port`.
    #[arg(long)]
    zk: String,
    /// Managed ledger name, `tenant/ns/topic`.
    #[arg(long)]
    topic: String,
    /// Durable cursor name.
    #[arg(long, default_value = "sub")]
    subscription: String,
    /// Journal file (created; must not exist).
    #[arg(long)]
    journal: String,
    /// Prefix of the payloads produced by this process (unique per run).
    #[arg(long)]
    tag: String,
    /// Seed of the ack order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// At most one cursor snapshot per this many ms.
    #[arg(long, default_value_t = 100)]
    persist_interval_ms: u64,
    /// `tick` every this many ms.
    #[arg(long, default_value_t = 50)]
    tick_ms: u64,
    /// Entries per data ledger before a rollover.
    #[arg(long, default_value_t = 200)]
    entries_per_ledger: u64,
    /// Snapshots per cursor ledger before it rolls over.
    #[arg(long, default_value_t = 20)]
    snapshots_per_cursor_ledger: u64,
    /// Appends in flight at most.
    #[arg(long, default_value_t = 16)]
    window: usize,
    /// Appends per second at most (0 = unbounded).
    #[arg(long, default_value_t = 1_000)]
    rate: u64,
    /// fsync the journal every this many lines (besides `PERSISTED`).
    #[arg(long, default_value_t = 256)]
    fsync_every: u64,
}

/// The journal: one unbuffered `write` per line.
struct Journal {
    file: Mutex<(File, u64)>,
    fsync_every: u64,
}

impl Journal {
    fn line(&self, text: &str, sync: bool) -> anyhow::Result<()> {
        let mut g = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let (file, lines) = &mut *g;
        file.write_all(format!("{text}\n").as_bytes())?;
        *lines += 1;
        if sync || (*lines).is_multiple_of(self.fsync_every.max(1)) {
            file.sync_data()?;
        }
        Ok(())
    }
}

fn pos(p: Position) -> String {
    format!("{}:{}", p.ledger_id, p.entry_id)
}

async fn produce(
    ml: ManagedLedger,
    journal: Arc<Journal>,
    tag: String,
    window: usize,
    rate: u64,
) -> anyhow::Result<()> {
    let start = tokio::time::Instant::now();
    let mut pending = VecDeque::new();
    for n in 0u64.. {
        // Pace: append n no earlier than n / rate seconds after start.
        if let Some(ms) = (n * 1_000).checked_div(rate) {
            tokio::time::sleep_until(start + std::time::Duration::from_millis(ms)).await;
        }
        let payload = format!("{tag}-{n}");
        journal.line(&format!("SEND {payload}"), false)?;
        pending.push_back((payload.clone(), ml.append_pipelined(payload).await?));
        while pending.len() >= window.max(1) {
            if let Some((payload, p)) = pending.pop_front() {
                let at = p.wait().await?;
                journal.line(&format!("SENT {payload} {}", pos(at)), false)?;
            }
        }
    }
    Ok(())
}

async fn consume(
    ml: ManagedLedger,
    cursor: ManagedCursor,
    journal: Arc<Journal>,
    seed: u64,
    tick_ms: u64,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut held: Vec<(Position, f64)> = Vec::new();
    let mut written = cursor.snapshots_written()?;
    let mut persisted = |cursor: &ManagedCursor, journal: &Journal| -> anyhow::Result<()> {
        let now = cursor.snapshots_written()?;
        if now > written {
            written = now;
            journal.line("PERSISTED", true)?;
        }
        Ok(())
    };
    let mut last_tick = tokio::time::Instant::now();
    loop {
        if last_tick.elapsed().as_millis() >= u128::from(tick_ms) {
            ml.tick().await?;
            persisted(&cursor, &journal)?;
            last_tick = tokio::time::Instant::now();
        }
        let entries = cursor.read_next(32).await?;
        if entries.is_empty() {
            let at = cursor.read_position()?;
            ml.wait_for_entry_after(at, tick_ms.max(1)).await?;
            continue;
        }
        // Ack in a random order. A new entry is acked in this round with
        // probability 0.75, held back briefly (released with probability
        // 0.25 per round) with 0.2, and held for long (0.01 per round) with
        // 0.05: acked ranges after the mark-delete exist most of the time and
        // unacked entries sit behind acked ones for seconds.
        let mut now: Vec<Position> = Vec::new();
        held.retain(|(p, release)| {
            let keep = !rng.random_bool(*release);
            if !keep {
                now.push(*p);
            }
            keep
        });
        for e in &entries {
            let payload = String::from_utf8_lossy(&e.payload);
            journal.line(&format!("RECV {payload} {}", pos(e.position)), false)?;
            let x: f64 = rng.random();
            if x < 0.05 {
                held.push((e.position, 0.01));
            } else if x < 0.25 {
                held.push((e.position, 0.25));
            } else {
                now.push(e.position);
            }
        }
        for i in (1..now.len()).rev() {
            now.swap(i, rng.random_range(0..=i));
        }
        for p in now {
            journal.line(&format!("ACK {}", pos(p)), false)?;
            cursor.ack(p, Persist::Wait).await?;
            persisted(&cursor, &journal)?;
        }
        // Now and then a cumulative ack up to the last entry read: covers
        // every held-back entry too.
        if rng.random_bool(0.01)
            && let Some(last) = entries.last()
        {
            journal.line(&format!("ACKC {}", pos(last.position)), false)?;
            cursor.ack_cumulative(last.position, Persist::Wait).await?;
            held.clear();
            persisted(&cursor, &journal)?;
        }
    }
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
    let file = File::options()
        .write(true)
        .create_new(true)
        .open(&args.journal)
        .with_context(|| format!("journal {}", args.journal))?;
    let journal = Arc::new(Journal {
        file: Mutex::new((file, 0)),
        fsync_every: args.fsync_every,
    });
    let (client, store, layout) = managed_ledger_env(&args.zk).await;
    let config = ManagedLedgerConfig {
        rollover: RolloverPolicy {
            age_ms_min: 0,
            entries_max: args.entries_per_ledger,
            ..RolloverPolicy::default()
        },
        cursor: CursorConfig {
            persist_interval_ms: args.persist_interval_ms,
            ..CursorConfig::default()
        },
        cursor_ledger_rollover: CursorLedgerRollover {
            entries_max: args.snapshots_per_cursor_ledger,
            ..CursorLedgerRollover::default()
        },
        // Keep every ledger: the test reads the whole log afterwards.
        retention: RetentionPolicy {
            time_minutes: -1,
            size_mb: -1,
        },
        ..ManagedLedgerConfig::default()
    };
    let ml = ManagedLedger::open(
        client,
        store,
        &layout,
        &args.topic,
        config,
        EntryCache::new(8 << 20),
    )
    .await?;
    let cursor = ml
        .open_cursor(&args.subscription, InitialPosition::Earliest)
        .await?;
    let ranges: Vec<String> = cursor
        .acked_ranges()?
        .into_iter()
        .map(|(a, b)| format!("{}-{}", pos(a), pos(b)))
        .collect();
    let ranges = if ranges.is_empty() {
        "-".to_string()
    } else {
        ranges.join(",")
    };
    journal.line(
        &format!("RESTORED {} {ranges}", pos(cursor.mark_delete()?)),
        true,
    )?;
    journal.line("READY", true)?;
    let producer = tokio::spawn(produce(
        ml.clone(),
        journal.clone(),
        args.tag.clone(),
        args.window,
        args.rate,
    ));
    let consumer = tokio::spawn(consume(ml, cursor, journal, args.seed, args.tick_ms));
    // Runs until killed; an error in either task ends the process with it.
    tokio::select! {
        r = producer => r?.context("producer")?,
        r = consumer => r?.context("consumer")?,
    }
    anyhow::bail!("a task ended without an error")
}
