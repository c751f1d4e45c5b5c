//! `cms-perf`: the load generator. Modes `produce`, `consume` and
//! `end-to-end` against one topic through the SDK.
//!
//! Latency is measured from the **intended** send time: with `--rate R > 0`
//! message `i` is due at `start + i/R` and its latency counts from then, even
//! if the producer was blocked (no coordinated omission). Sends are released
//! at their due times by a pacer task that waits on a `timerfd` (the OS's
//! high-resolution timer) in the runtime's own epoll: tokio's timer has
//! millisecond granularity, and at 2,000 msg/s waking up to 1 ms after the
//! due time would be counted as publish latency. How late the pacer released
//! each send is reported as the `pace_late_*` keys, so a figure can be
//! checked for the tool's own delay. The timer is set `--pace-spin-us`
//! (default 60) before the due time and the pacer then yields in a loop
//! until it: a timer interrupt reaches a halted vCPU of a VM about 50 µs
//! late, which would otherwise count as publish latency (BENCHMARKS.md).
//! `--max-pending 1` waits for each receipt before the next send (W1).
//! `--duration S` (produce) ends the timed phase after S seconds or
//! `--messages`, whichever comes first (W3 runs for 10 s).
//! Every sample goes into an HDR histogram (microseconds). `--json` prints
//! one JSON object with `msgs`, `msg_per_s`, `mib_per_s`, `p50_ms`,
//! `p99_ms`, `p999_ms`, `max_ms`, `mean_ms` (publish latency) and, for `end-to-end` and `consume`, the `e2e_*` keys
//! (publish to receive). A progress bar is drawn only on a terminal.
//! `--histogram-out FILE` also writes the histograms' buckets, so several
//! runs can be pooled into one histogram.
//! `--io-threads N` sets the threads of the tool's async runtime (default
//! 1, as `pulsar-perf`'s; 0 = one per CPU; `io_threads` in the JSON).
//!
//! Scale: `--topics N` uses topics `<topic>-0` .. `<topic>-(N-1)` (just
//! `<topic>` when N is 1), `--producers P` spreads producers over them
//! round robin (the messages and the rate are split among producers, and
//! in open loop producer `p` starts `p / rate` after the first, so the
//! run's sends are evenly spaced rather than one burst per producer round),
//! `--consumers C` does the same for consumers (each consumer takes its
//! topics with one multi-topic consumer; more consumers than topics need a
//! non-exclusive `--sub-type`). Histograms are merged, so the JSON keys are
//! the same as with one of each; `producers`, `consumers` and `topics` are
//! added.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value, json};

use cms_client::{Client, CompressionType, InitialPosition, ProducerMessage, SubType};

/// Producers created at the same time before a run (each is a lookup and a
/// PRODUCER command; the broker loads the topic for it).
const CREATE_CONCURRENCY: usize = 64;

#[derive(Parser, Debug)]
#[command(name = "cms-perf", about = "CMS load generator (Pulsar protocol)")]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Publish N messages and report publish latency and throughput.
    Produce(Common),
    /// Receive N messages and report throughput and publish-to-receive latency.
    Consume(Common),
    /// Publish and receive on one topic: publish and end-to-end latency.
    EndToEnd(Common),
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Compression {
    None,
    Lz4,
    Zlib,
    Zstd,
    Snappy,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Sub {
    Exclusive,
    Shared,
    Failover,
    KeyShared,
}

#[derive(clap::Args, Debug, Clone)]
struct Common {
    /// `pulsar://host:port`, or `pulsar+ssl://host:port` for TLS (several
    /// hosts: `pulsar://h1:6650,h2:6650`).
    #[arg(long, default_value = "pulsar://127.0.0.1:6650")]
    service_url: String,
    /// `pulsar+ssl://`: PEM file of the CAs the brokers' certificates must
    /// chain to (default: the system's roots).
    #[arg(long, alias = "tls-trust-cert-file")]
    tls_trust_cert: Option<std::path::PathBuf>,
    /// `pulsar+ssl://`: accept any broker certificate (testing only).
    #[arg(long)]
    tls_allow_insecure: bool,
    /// `pulsar+ssl://`: do not check that the certificate names the host.
    #[arg(long)]
    tls_no_hostname_verification: bool,
    /// Token for token authentication (prefer `--auth-token-file`: a flag
    /// is visible to other local users).
    #[arg(long, conflicts_with = "auth_token_file")]
    auth_token: Option<String>,
    /// File holding the token (e.g. from `cms-broker tokens create`).
    #[arg(long)]
    auth_token_file: Option<std::path::PathBuf>,
    /// Topic.
    #[arg(long)]
    topic: String,
    /// Message size in bytes (at least 16 in end-to-end mode: it carries a timestamp).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Messages to publish / receive.
    #[arg(long, default_value_t = 10_000)]
    messages: u64,
    /// `produce` only: stop sending after this many seconds, even if fewer
    /// than `--messages` went out (`--messages` stays the upper bound);
    /// `msgs` and the rates count what was sent. 0 = no time limit.
    #[arg(long, default_value_t = 0.0)]
    duration: f64,
    /// Messages per second (0 = as fast as receipts allow).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Messages awaiting a receipt at most (1 = wait for each receipt).
    #[arg(long, default_value_t = 1000)]
    max_pending: usize,
    /// Batch messages into entries.
    #[arg(long)]
    batching: bool,
    /// Longest a batch waits, in milliseconds.
    #[arg(long, default_value_t = 1)]
    batch_max_delay_ms: u64,
    /// Payload compression.
    #[arg(long, value_enum, default_value = "none")]
    compression: Compression,
    /// Subscription name (consume, end-to-end).
    #[arg(long, default_value = "cms-perf")]
    subscription: String,
    /// Subscription type.
    #[arg(long, value_enum, default_value = "exclusive")]
    sub_type: Sub,
    /// Consumer receiver queue size.
    #[arg(long, default_value_t = 1000)]
    receiver_queue: u32,
    /// Consumers send their acks in groups at most this many milliseconds
    /// apart (the SDK's and Pulsar's default, 100; 0 = each ack at once).
    #[arg(long, default_value_t = 100)]
    ack_group_ms: u64,
    /// Also write the run's latency histograms to this file: one JSON
    /// object with `unit` ("us") and, per histogram (`publish`, `e2e`),
    /// its recorded buckets as `[value_us, count]` pairs, so runs can be
    /// pooled exactly (scripts/bench-w5 pools its rounds this way).
    #[arg(long)]
    histogram_out: Option<std::path::PathBuf>,
    /// Also write every publish sample to this file, one line per message
    /// in receipt order: `due_us latency_us`, the intended send time (µs
    /// after the timed phase started) and the publish latency (µs), to see
    /// where in a run the tail falls. Kept in memory until the end (16
    /// bytes a message, bounded by `--messages`).
    #[arg(long)]
    samples_out: Option<std::path::PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Producers (spread over the topics; created at most
    /// `CREATE_CONCURRENCY` at a time before the timed phase starts).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10000))]
    producers: u32,
    /// Consumers (spread over the topics).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    consumers: u32,
    /// Topics: `<topic>-0` .. `<topic>-(N-1)` when more than 1.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10000))]
    topics: u32,
    /// Threads of the tool's async runtime, which run the SDK's connections,
    /// producers and consumers (0 = one per CPU). Like `pulsar-perf
    /// --num-io-threads`, and with its default of 1: the pacer is a task
    /// on this runtime, and on one thread its release of a send wakes no
    /// other thread (W2 and W3 on a 2-vCPU machine shared with the
    /// servers were as fast or faster than with two: BENCHMARKS.md).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(0..=1024))]
    io_threads: u16,
    /// Open loop: the pacer's timer fires this many µs before a send is
    /// due, and the pacer then yields to the runtime's other tasks in a
    /// loop until the due time (0 = the timer alone). In a VM the timer
    /// interrupt of a halted vCPU comes about 50 µs late, and that delay
    /// would count as publish latency; the early wake-up trades it for at
    /// most this much CPU per send.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=1000))]
    pace_spin_us: u64,
}

impl Common {
    fn topic_names(&self) -> Vec<String> {
        if self.topics <= 1 {
            vec![self.topic.clone()]
        } else {
            (0..self.topics)
                .map(|i| format!("{}-{i}", self.topic))
                .collect()
        }
    }
}

/// `total` split into `parts` shares differing by at most one.
fn share(total: u64, parts: u32, i: u32) -> u64 {
    let (q, r) = (total / u64::from(parts), total % u64::from(parts));
    q + u64::from(u64::from(i) < r)
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 1 h with 3 significant digits; new_with_bounds cannot fail for these.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static histogram bounds are valid")
}

fn latency_keys(prefix: &str, h: &Histogram<u64>, out: &mut Map<String, Value>) {
    let ms = |us: u64| us as f64 / 1000.0;
    out.insert(
        format!("{prefix}p50_ms"),
        json!(ms(h.value_at_quantile(0.50))),
    );
    out.insert(
        format!("{prefix}p99_ms"),
        json!(ms(h.value_at_quantile(0.99))),
    );
    out.insert(
        format!("{prefix}p999_ms"),
        json!(ms(h.value_at_quantile(0.999))),
    );
    out.insert(format!("{prefix}max_ms"), json!(ms(h.max())));
    // The mean splits into the layers' means (scripts/bench-w1-breakdown).
    out.insert(format!("{prefix}mean_ms"), json!(h.mean() / 1000.0));
}

/// The publish latency keys, and the pacer's lateness in open loop.
fn publish_keys(run: &Produced, out: &mut Map<String, Value>) {
    latency_keys("", &run.latency, out);
    if !run.late.is_empty() {
        latency_keys("pace_late_", &run.late, out);
    }
}

/// A histogram's recorded buckets as `[value_us, count]` pairs (each
/// bucket named by the highest value it holds), in value order.
fn buckets(h: &Histogram<u64>) -> Value {
    let pairs: Vec<Value> = h
        .iter_recorded()
        .map(|v| {
            json!([
                h.highest_equivalent(v.value_iterated_to()),
                v.count_at_value()
            ])
        })
        .collect();
    Value::Array(pairs)
}

/// The progress bar, or nothing when stderr is not a terminal: even a hidden
/// `ProgressBar` updates its rate estimate on every `inc` (about 1,500
/// instructions, 4 % of the tool's work per W2 message), which a run in CI
/// or under a script has no use for.
#[derive(Clone)]
struct Progress(Option<ProgressBar>);

impl Progress {
    fn inc(&self, n: u64) {
        if let Some(pb) = &self.0 {
            pb.inc(n);
        }
    }

    fn finish_and_clear(&self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}

fn progress(n: u64, what: &str) -> Progress {
    if !std::io::stderr().is_terminal() {
        return Progress(None);
    }
    let pb = ProgressBar::new(n);
    if let Ok(style) =
        ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} {per_sec} eta {eta}")
    {
        pb.set_style(style);
    }
    pb.set_message(what.to_owned());
    Progress(Some(pb))
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn compression(c: Compression) -> CompressionType {
    match c {
        Compression::None => CompressionType::None,
        Compression::Lz4 => CompressionType::Lz4,
        Compression::Zlib => CompressionType::Zlib,
        Compression::Zstd => CompressionType::Zstd,
        Compression::Snappy => CompressionType::Snappy,
    }
}

fn sub_type(s: Sub) -> SubType {
    match s {
        Sub::Exclusive => SubType::Exclusive,
        Sub::Shared => SubType::Shared,
        Sub::Failover => SubType::Failover,
        Sub::KeyShared => SubType::KeyShared,
    }
}

/// Publishes with every producer; returns their merged measurements.
async fn produce(client: &Client, a: &Common, stamp: bool) -> anyhow::Result<Produced> {
    let topics = a.topic_names();
    // Every producer exists before the first timed send: creating 10,000
    // at once (W4) would only measure lookups queueing behind each other
    // and run into the client's operation timeout.
    let permits = Arc::new(tokio::sync::Semaphore::new(CREATE_CONCURRENCY));
    let mut creating = Vec::with_capacity(a.producers as usize);
    for p in 0..a.producers {
        let topic = topics[p as usize % topics.len()].clone();
        let (client, a, permits) = (client.clone(), a.clone(), permits.clone());
        creating.push(tokio::spawn(async move {
            let _permit = permits.acquire_owned().await?;
            create_producer(&client, &a, &topic).await
        }));
    }
    let mut producers = Vec::with_capacity(creating.len());
    for c in creating {
        producers.push(c.await??);
    }
    let pb = progress(a.messages, "produce");
    let rate = a.rate / f64::from(a.producers);
    let start = Instant::now();
    let firsts = phase_starts(start, a.producers, a.rate);
    let plans: Vec<(Instant, u64, f64)> = (0..a.producers)
        .map(|p| (firsts[p as usize], share(a.messages, a.producers, p), rate))
        .collect();
    let releases = if rate > 0.0 {
        spawn_pacer(plans.clone(), Duration::from_micros(a.pace_spin_us))?
            .into_iter()
            .map(Some)
            .collect()
    } else {
        vec![None; plans.len()]
    };
    let shared = Arc::new(RunShared {
        hists: std::sync::Mutex::new(Recorded {
            latency: histogram(),
            late: histogram(),
            samples: a.samples_out.as_ref().map(|_| Vec::new()),
        }),
        pb: pb.clone(),
    });
    let mut tasks = Vec::new();
    for ((producer, (first, n, rate)), release) in producers.into_iter().zip(plans).zip(releases) {
        let (a, shared) = (a.clone(), shared.clone());
        let pace = release.map(|r| Pace {
            first,
            rate,
            release: r,
        });
        tasks.push(tokio::spawn(async move {
            produce_one(producer, &a, start, n, pace, stamp, shared).await
        }));
    }
    let (mut errors, mut sent, mut elapsed) = (0, 0, Duration::ZERO);
    for t in tasks {
        let one = t.await??;
        errors += one.errors;
        sent += one.sent;
        elapsed = elapsed.max(one.elapsed);
    }
    pb.finish_and_clear();
    let recorded = shared.hists();
    if let (Some(path), Some(samples)) = (&a.samples_out, &recorded.samples) {
        write_samples(path, samples)?;
    }
    Ok(Produced {
        latency: recorded.latency.clone(),
        late: recorded.late.clone(),
        errors,
        sent,
        elapsed,
    })
}

/// Writes `--samples-out`: one `due_us latency_us` line per sample.
fn write_samples(path: &std::path::Path, samples: &[(u64, u64)]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let f = std::fs::File::create(path)
        .with_context(|| format!("creating --samples-out {}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    for (due, us) in samples {
        writeln!(w, "{due} {us}")?;
    }
    w.flush()
        .with_context(|| format!("writing --samples-out {}", path.display()))
}

/// What a run of producers measured.
struct Produced {
    /// Publish latency (µs) from the intended send time.
    latency: Histogram<u64>,
    /// Open loop only: how long after its due time the pacer released each
    /// send (µs); empty in closed loop.
    late: Histogram<u64>,
    errors: u64,
    /// Messages sent (fewer than asked when `--duration` ended the run).
    sent: u64,
    /// From the start until the last receipt.
    elapsed: Duration,
}

/// Open-loop pacing of one producer: message `i` is due at
/// `first + i / rate`, and the pacer adds one permit to `release` then.
struct Pace {
    first: Instant,
    rate: f64,
    release: Arc<tokio::sync::Semaphore>,
}

/// When message `i` of a producer sending at `rate` from `first` is due.
fn due_at(first: Instant, i: u64, rate: f64) -> Instant {
    first + Duration::from_secs_f64(i as f64 / rate)
}

/// When each of `producers` open-loop producers sends its first message,
/// for `total_rate` messages per second over all of them: producer `p`
/// starts `p / total_rate` after `start`, so the producers' sends
/// interleave evenly. (All starting at once would send the run's rate as
/// one burst of `producers` messages every `producers / total_rate`
/// seconds: with W4's 10,000 producers at 2,000 msg/s in total, 10,000
/// sends every 5 s.) Closed loop (`total_rate` 0): all at `start`.
fn phase_starts(start: Instant, producers: u32, total_rate: f64) -> Vec<Instant> {
    (0..producers)
        .map(|p| {
            if total_rate > 0.0 {
                start + Duration::from_secs_f64(f64::from(p) / total_rate)
            } else {
                start
            }
        })
        .collect()
}

/// Starts the pacer for producers with the given (first due time,
/// messages, rate) plans: a task on the runtime that keeps one heap slot
/// per producer, so it needs no queue of pending releases: a producer that
/// falls behind finds its permits waiting (and their lateness counts, as it
/// should). It stops after the last release, or skips a producer whose
/// semaphore nobody else holds any more (its task ended early). It waits
/// with a [`PaceTimer`] set `spin` before each due time, then yields until
/// it; must be called within the runtime.
fn spawn_pacer(
    plans: Vec<(Instant, u64, f64)>,
    spin: Duration,
) -> anyhow::Result<Vec<Arc<tokio::sync::Semaphore>>> {
    use std::cmp::Reverse;
    let releases: Vec<_> = plans
        .iter()
        .map(|_| Arc::new(tokio::sync::Semaphore::new(0)))
        .collect();
    let mut heap: std::collections::BinaryHeap<Reverse<(Instant, usize, u64)>> = plans
        .iter()
        .enumerate()
        .filter(|(_, (_, n, rate))| *n > 0 && *rate > 0.0)
        .map(|(p, (first, _, _))| Reverse((*first, p, 0)))
        .collect();
    let mine = releases.clone();
    let timer = PaceTimer::new().context("creating the pacer's timer")?;
    tokio::spawn(async move {
        while let Some(Reverse((at, p, i))) = heap.pop() {
            if Arc::strong_count(&mine[p]) == 1 {
                continue;
            }
            if let Err(e) = timer.sleep_until(at.checked_sub(spin).unwrap_or(at)).await {
                // The producers waiting for permits then end with "pacer".
                eprintln!("cms-perf: the pacer's timer failed: {e}");
                for r in &mine {
                    r.close();
                }
                return;
            }
            // The last stretch: yield (other tasks still run) until due.
            while Instant::now() < at {
                tokio::task::yield_now().await;
            }
            mine[p].add_permits(1);
            let (first, n, rate) = plans[p];
            if i + 1 < n {
                heap.push(Reverse((due_at(first, i + 1, rate), p, i + 1)));
            }
        }
    });
    Ok(releases)
}

/// The pacer's high-resolution sleep. On Linux a `timerfd` in the runtime's
/// own epoll: the runtime thread wakes when a send is due, within
/// microseconds, and nothing else is woken (tokio's timer has millisecond
/// granularity; the thread this replaced slept in `nanosleep` and then had
/// to wake the runtime thread: two wake-ups per message, about a fifth of
/// the tool's CPU in W2). Elsewhere tokio's timer.
struct PaceTimer {
    #[cfg(target_os = "linux")]
    fd: tokio::io::unix::AsyncFd<TimerFdRaw>,
}

/// `AsyncFd` wants `AsRawFd`; nix's `TimerFd` has `AsFd`.
#[cfg(target_os = "linux")]
struct TimerFdRaw(nix::sys::timerfd::TimerFd);

#[cfg(target_os = "linux")]
impl std::os::fd::AsRawFd for TimerFdRaw {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

impl PaceTimer {
    #[cfg(target_os = "linux")]
    fn new() -> std::io::Result<PaceTimer> {
        use nix::sys::timerfd::{ClockId, TimerFd, TimerFlags};
        let fd = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        // SAFETY: `TimerFdRaw` owns the descriptor (an `OwnedFd` inside
        // `TimerFd`), so it stays open and the same for as long as the
        // `AsyncFd` holds it, and `as_raw_fd` always returns it.
        #[allow(
            unsafe_code,
            reason = "tokio's AsyncFd registration is unsafe (I/O safety)"
        )]
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                TimerFdRaw(fd),
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(|e| e.into_parts().1)?;
        Ok(PaceTimer { fd })
    }

    #[cfg(not(target_os = "linux"))]
    fn new() -> std::io::Result<PaceTimer> {
        Ok(PaceTimer {})
    }

    /// Returns at `at` or just after, never before.
    #[cfg(target_os = "linux")]
    async fn sleep_until(&self, at: Instant) -> std::io::Result<()> {
        use nix::sys::time::TimeSpec;
        use nix::sys::timerfd::{Expiration, TimerSetTimeFlags};
        loop {
            let now = Instant::now();
            if at <= now {
                return Ok(());
            }
            // Relative: std's Instant is CLOCK_MONOTONIC but does not expose
            // its value. An early wake-up (none expected) just loops.
            self.fd.get_ref().0.set(
                Expiration::OneShot(TimeSpec::from_duration(at - now)),
                TimerSetTimeFlags::empty(),
            )?;
            // `try_io` clears the readiness when the read would block. After
            // a read that took the expiration it is cleared too: the timer is
            // one-shot and not armed again yet, so nothing can be left to
            // read, and the next wait would otherwise start with a read that
            // fails (one wasted system call per send).
            loop {
                let mut ready = self.fd.readable().await?;
                if let Ok(r) =
                    ready.try_io(|fd| fd.get_ref().0.wait().map_err(std::io::Error::from))
                {
                    r?;
                    ready.clear_ready();
                    break;
                }
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    async fn sleep_until(&self, at: Instant) -> std::io::Result<()> {
        tokio::time::sleep_until(at.into()).await;
        Ok(())
    }
}

/// A producer on `topic` with the run's settings.
async fn create_producer(
    client: &Client,
    a: &Common,
    topic: &str,
) -> anyhow::Result<cms_client::Producer> {
    client
        .producer(topic)
        .batching(a.batching)
        .batching_max_delay(Duration::from_millis(a.batch_max_delay_ms))
        .compression(compression(a.compression))
        .max_pending_messages(a.max_pending.max(1))
        .block_if_queue_full(true)
        .create()
        .await
        .with_context(|| format!("creating the producer of {topic}"))
}

/// One producer: `n` messages, released by `pace` (open loop) or as fast
/// as the `max_pending` window allows; `start` is the run's (for its
/// elapsed time and `--duration`).
async fn produce_one(
    producer: cms_client::Producer,
    a: &Common,
    start: Instant,
    n: u64,
    pace: Option<Pace>,
    stamp: bool,
    run: Arc<RunShared>,
) -> anyhow::Result<ProducerRun> {
    type InFlight = (
        Instant,
        cms_client::SendFuture,
        Option<tokio::sync::OwnedSemaphorePermit>,
    );
    let (tx, mut rx) = tokio::sync::mpsc::channel::<InFlight>(a.max_pending.max(1) + 1);
    // Closed loop (no rate): a message's latency starts when the window of
    // `max_pending` lets it go, not when the loop reached it (with
    // `--max-pending 1` the loop reaches message i+1 as soon as message i is
    // sent, so timing from there counted message i's round trip twice).
    let window = pace
        .is_none()
        .then(|| Arc::new(tokio::sync::Semaphore::new(a.max_pending.max(1))));
    let run2 = run.clone();
    let collector = tokio::spawn(async move {
        let mut errors = 0u64;
        while let Some((intended, f, slot)) = rx.recv().await {
            match f.await {
                Ok(_) => {
                    let us = (intended.elapsed().as_micros() as u64).max(1);
                    let mut h = run2.hists();
                    let _ = h.latency.record(us);
                    if let Some(s) = h.samples.as_mut() {
                        let due = intended.saturating_duration_since(start).as_micros() as u64;
                        s.push((due, us));
                    }
                }
                Err(_) => errors += 1,
            }
            drop(slot);
            run2.pb.inc(1);
        }
        errors
    });
    let base = vec![b'x'; a.size];
    let deadline = (a.duration > 0.0).then(|| start + Duration::from_secs_f64(a.duration));
    let mut sent = 0u64;
    for i in 0..n {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let slot = match &window {
            Some(w) => Some(w.clone().acquire_owned().await.context("send window")?),
            None => None,
        };
        let intended = match &pace {
            Some(p) => {
                p.release.acquire().await.context("pacer")?.forget();
                let due = due_at(p.first, i, p.rate);
                let us = (due.elapsed().as_micros() as u64).max(1);
                let _ = run.hists().late.record(us);
                due
            }
            None => Instant::now(),
        };
        let mut payload = base.clone();
        if stamp && payload.len() >= 8 {
            payload[..8].copy_from_slice(&now_us().to_be_bytes());
        }
        let f = producer
            .send_async(ProducerMessage::new(payload))
            .await
            .context("send")?;
        if tx.send((intended, f, slot)).await.is_err() {
            bail!("receipt collector stopped");
        }
        sent += 1;
    }
    drop(tx);
    producer.flush().await?;
    let errors = collector.await?;
    let elapsed = start.elapsed();
    producer.close().await?;
    Ok(ProducerRun {
        errors,
        sent,
        elapsed,
    })
}

/// What one producer of a run counted (its samples are in [`RunShared`]).
struct ProducerRun {
    errors: u64,
    sent: u64,
    elapsed: Duration,
}

/// The histograms every producer of a run records into. One set for all:
/// a full-range histogram is about 180 KiB, so one per producer (two with
/// the pacer's) cost W4's 10,000 producers gigabytes, and allocating them as
/// the producers started made the first sends of the run late.
struct Recorded {
    latency: Histogram<u64>,
    late: Histogram<u64>,
    /// `--samples-out`: (intended send µs after the start, latency µs).
    samples: Option<Vec<(u64, u64)>>,
}

/// What the producers of a run share: the histograms and the progress bar.
struct RunShared {
    hists: std::sync::Mutex<Recorded>,
    pb: Progress,
}

impl RunShared {
    fn hists(&self) -> std::sync::MutexGuard<'_, Recorded> {
        // A panic while recording leaves the counts usable.
        self.hists
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Subscribes every consumer (topics spread round robin).
async fn subscribe_all(client: &Client, a: &Common) -> anyhow::Result<Vec<cms_client::Consumer>> {
    let topics = a.topic_names();
    let c = a.consumers as usize;
    if c > topics.len() && matches!(a.sub_type, Sub::Exclusive) {
        bail!(
            "--consumers {c} over {} topic(s) needs --sub-type shared, failover or key-shared",
            topics.len()
        );
    }
    let mut out = Vec::with_capacity(c);
    for i in 0..c {
        let mine: Vec<String> = if c >= topics.len() {
            vec![topics[i % topics.len()].clone()]
        } else {
            topics.iter().skip(i).step_by(c).cloned().collect()
        };
        let consumer = client
            .consumer_topics(mine, &a.subscription)
            .sub_type(sub_type(a.sub_type))
            .initial_position(InitialPosition::Earliest)
            .receiver_queue_size(a.receiver_queue)
            .ack_group_time(Duration::from_millis(a.ack_group_ms))
            .subscribe()
            .await
            .context("subscribing")?;
        out.push(consumer);
    }
    Ok(out)
}

/// Receives `n` messages over all consumers; returns (merged end-to-end
/// histogram, elapsed from the first message, bytes).
async fn consume(
    consumers: Vec<cms_client::Consumer>,
    n: u64,
    stamped: bool,
) -> anyhow::Result<(Histogram<u64>, Duration, u64)> {
    let pb = progress(n, "consume");
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let first = std::sync::Arc::new(std::sync::OnceLock::<Instant>::new());
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let done_tx = std::sync::Arc::new(done_tx);
    // One histogram for all consumers, as for the producers (a full-range
    // histogram is about 180 KiB: one per consumer cost W4-sized runs
    // gigabytes).
    let shared = std::sync::Arc::new(std::sync::Mutex::new(histogram()));
    let mut tasks = Vec::new();
    for consumer in consumers {
        let (count, first, pb) = (count.clone(), first.clone(), pb.clone());
        let (done_tx, mut done_rx) = (done_tx.clone(), done_rx.clone());
        let h = shared.clone();
        tasks.push(tokio::spawn(async move {
            let mut consumer = consumer;
            let mut bytes = 0u64;
            loop {
                let m = tokio::select! {
                    m = consumer.receive() => m.context("receive")?,
                    _ = done_rx.wait_for(|d| *d) => break,
                };
                first.get_or_init(Instant::now);
                let k = count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                if k >= n {
                    break; // another consumer got the last one
                }
                bytes += m.payload.len() as u64;
                let sent_us = if stamped && m.payload.len() >= 8 {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&m.payload[..8]);
                    u64::from_be_bytes(b)
                } else {
                    m.publish_time * 1000
                };
                let us = now_us().saturating_sub(sent_us).max(1);
                // A panic while recording leaves the counts usable.
                let _ = h
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .record(us);
                consumer.ack(&m.id).await.context("ack")?;
                pb.inc(1);
                if k + 1 == n {
                    let _ = done_tx.send(true);
                    break;
                }
            }
            let _ = consumer.close().await;
            anyhow::Ok(bytes)
        }));
    }
    let mut bytes = 0u64;
    for t in tasks {
        bytes += t.await??;
    }
    pb.finish_and_clear();
    let elapsed = first.get().map_or(Duration::ZERO, |s| s.elapsed());
    let h = shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    Ok((h, elapsed, bytes))
}

fn rates(out: &mut Map<String, Value>, msgs: u64, bytes: u64, elapsed: Duration) {
    let secs = elapsed.as_secs_f64().max(1e-9);
    out.insert("msgs".into(), json!(msgs));
    out.insert("elapsed_s".into(), json!(secs));
    out.insert("msg_per_s".into(), json!(msgs as f64 / secs));
    out.insert(
        "mib_per_s".into(),
        json!(bytes as f64 / secs / (1024.0 * 1024.0)),
    );
}

async fn run(cli: Cli) -> anyhow::Result<Map<String, Value>> {
    let (mode, a) = match &cli.mode {
        Mode::Produce(a) => ("produce", a),
        Mode::Consume(a) => ("consume", a),
        Mode::EndToEnd(a) => ("end-to-end", a),
    };
    let mut builder = Client::builder(&a.service_url)
        .operation_timeout(Duration::from_secs(30))
        .tls_allow_insecure_connection(a.tls_allow_insecure)
        .tls_validate_hostname(!a.tls_no_hostname_verification);
    if let Some(ca) = &a.tls_trust_cert {
        builder = builder.tls_trust_certs_file(ca);
    }
    let token = match (&a.auth_token, &a.auth_token_file) {
        (Some(t), _) => Some(t.trim().to_string()),
        (None, Some(p)) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("reading --auth-token-file {}: {e}", p.display()))?
                .trim()
                .to_string(),
        ),
        (None, None) => None,
    };
    if let Some(t) = token {
        builder = builder.auth_token(t);
    }
    let duration_ok =
        matches!(cli.mode, Mode::Produce(_)) && a.duration.is_finite() && a.duration > 0.0;
    if a.duration != 0.0 && !duration_ok {
        bail!(
            "--duration takes a positive number of seconds and applies to `produce` only (the consumers of `end-to-end` wait for --messages)"
        );
    }
    let client = builder.build()?;
    let mut out = Map::new();
    out.insert("mode".into(), json!(mode));
    out.insert("topic".into(), json!(a.topic));
    out.insert("size".into(), json!(a.size));
    out.insert("rate".into(), json!(a.rate));
    out.insert("max_pending".into(), json!(a.max_pending));
    if a.duration > 0.0 {
        out.insert("duration_s".into(), json!(a.duration));
    }
    out.insert("batching".into(), json!(a.batching));
    out.insert(
        "compression".into(),
        json!(format!("{:?}", a.compression).to_lowercase()),
    );
    out.insert("producers".into(), json!(a.producers));
    out.insert("consumers".into(), json!(a.consumers));
    out.insert("topics".into(), json!(a.topics));
    out.insert("io_threads".into(), json!(a.io_threads));
    out.insert("pace_spin_us".into(), json!(a.pace_spin_us));
    let mut hists = Map::new();
    hists.insert("unit".into(), json!("us"));
    match cli.mode {
        Mode::Produce(_) => {
            let run = produce(&client, a, false).await?;
            hists.insert("publish".into(), buckets(&run.latency));
            let ok = run.sent - run.errors;
            rates(&mut out, ok, ok * a.size as u64, run.elapsed);
            out.insert("errors".into(), json!(run.errors));
            publish_keys(&run, &mut out);
        }
        Mode::Consume(_) => {
            let consumers = subscribe_all(&client, a).await?;
            let (e2e, elapsed, bytes) = consume(consumers, a.messages, false).await?;
            hists.insert("e2e".into(), buckets(&e2e));
            rates(&mut out, a.messages, bytes, elapsed);
            latency_keys("e2e_", &e2e, &mut out);
        }
        Mode::EndToEnd(_) => {
            if a.size < 8 {
                bail!(
                    "--size must be at least 8 in end-to-end mode (the payload carries the send time)"
                );
            }
            let consumers = subscribe_all(&client, a).await?;
            let n = a.messages;
            let receiver = tokio::spawn(consume(consumers, n, true));
            let run = produce(&client, a, true).await?;
            if run.errors > 0 {
                bail!(
                    "{} sends failed; the consumer would wait for them forever",
                    run.errors
                );
            }
            let (e2e, _, _) = receiver.await??;
            hists.insert("publish".into(), buckets(&run.latency));
            hists.insert("e2e".into(), buckets(&e2e));
            rates(&mut out, n, n * a.size as u64, run.elapsed);
            out.insert("errors".into(), json!(run.errors));
            publish_keys(&run, &mut out);
            latency_keys("e2e_", &e2e, &mut out);
        }
    }
    client.close().await;
    if let Some(path) = &a.histogram_out {
        std::fs::write(path, Value::Object(hists).to_string())
            .with_context(|| format!("writing --histogram-out {}", path.display()))?;
    }
    Ok(out)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The SDK's logs (reconnects, redirects) on stderr only when asked for
    // with RUST_LOG: a benchmark's output stays its JSON.
    if std::env::var_os("RUST_LOG").is_some() {
        let args = cms_common::logging::LogArgs {
            log_format: cms_common::logging::LogFormat::Text,
            log_level: "warn".into(),
        };
        if let Err(e) = cms_common::logging::init_logging(&args) {
            eprintln!("cms-perf: {e}");
            return std::process::ExitCode::from(2);
        }
    }
    let (json_out, io_threads) = match &cli.mode {
        Mode::Produce(a) | Mode::Consume(a) | Mode::EndToEnd(a) => (a.json, a.io_threads),
    };
    cms_common::run_main_with(usize::from(io_threads), async move {
        let out = run(cli).await?;
        if json_out {
            println!("{}", Value::Object(out));
        } else {
            for (k, v) in &out {
                println!("{k:>12}: {v}");
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every producer gets exactly its messages' permits, none before its
    /// due time, and a producer whose task ended does not stop the others.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_pacer_releases_each_send_once_and_never_early() {
        let start = Instant::now();
        let plans = vec![
            (start, 40, 2_000.0),
            (start + Duration::from_millis(3), 25, 1_000.0),
            (start, 10, 500.0),
        ];
        let releases = spawn_pacer(plans.clone(), Duration::from_micros(200)).unwrap();
        let mut releases = releases.into_iter();
        let first = releases.next().unwrap();
        let second = releases.next().unwrap();
        drop(releases); // the third producer is gone before it starts
        let mut tasks = Vec::new();
        for ((from, n, rate), release) in plans.into_iter().zip([first, second]) {
            tasks.push(tokio::spawn(async move {
                for i in 0..n {
                    release.acquire().await.unwrap().forget();
                    let due = due_at(from, i, rate);
                    assert!(Instant::now() >= due, "message {i} released early");
                }
                // Nothing beyond the plan arrives (the pacer has stopped
                // adding permits for this producer).
                assert_eq!(release.available_permits(), 0);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }

    /// Open-loop producers start one total-rate interval apart, so the
    /// run's sends are evenly spaced instead of one burst per round.
    #[test]
    fn open_loop_producers_start_evenly_spread_over_one_interval() {
        let start = Instant::now();
        let firsts = phase_starts(start, 4, 400.0);
        let offsets: Vec<u128> = firsts.iter().map(|t| (*t - start).as_micros()).collect();
        assert_eq!(offsets, vec![0, 2_500, 5_000, 7_500]);
        // All sends of all producers (each at 100 msg/s) in the first
        // second: 400, one every 2.5 ms.
        let mut dues: Vec<u128> = firsts
            .iter()
            .flat_map(|f| (0..100).map(move |i| (due_at(*f, i, 100.0) - start).as_micros()))
            .collect();
        dues.sort_unstable();
        for (k, w) in dues.windows(2).enumerate() {
            assert_eq!(w[1] - w[0], 2_500, "sends {k} and {}", k + 1);
        }
        // Closed loop: everyone at the start.
        assert!(phase_starts(start, 3, 0.0).iter().all(|t| *t == start));
    }

    /// The buckets written by `--histogram-out` rebuild the histogram:
    /// the same count and the same percentiles, so pooled runs are exact.
    #[test]
    fn histogram_buckets_rebuild_the_same_percentiles() {
        let mut h = histogram();
        for v in (1..=5_000u64).map(|i| i * 7 % 9_973 + 100) {
            h.record(v).unwrap();
        }
        h.record_n(250_000, 3).unwrap();
        let Value::Array(pairs) = buckets(&h) else {
            panic!("buckets are an array")
        };
        let mut back = histogram();
        for p in &pairs {
            let (v, n) = (p[0].as_u64().unwrap(), p[1].as_u64().unwrap());
            back.record_n(v, n).unwrap();
        }
        assert_eq!(back.len(), h.len());
        for q in [0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(back.value_at_quantile(q), h.value_at_quantile(q), "q {q}");
        }
        let values: Vec<u64> = pairs.iter().map(|p| p[0].as_u64().unwrap()).collect();
        assert!(values.windows(2).all(|w| w[0] < w[1]), "in value order");
    }

    #[test]
    fn samples_out_writes_one_line_per_sample_in_order() {
        let dir = std::env::temp_dir().join(format!("cms-perf-samples-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("samples.txt");
        write_samples(&path, &[(0, 412), (500, 1_933), (1_000, 388)]).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        let err = write_samples(&dir.join("no/such/dir"), &[]).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(written, "0 412\n500 1933\n1000 388\n");
        assert!(err.to_string().contains("--samples-out"), "{err}");
    }

    #[test]
    fn shares_differ_by_at_most_one_and_sum_to_the_total() {
        let parts: Vec<u64> = (0..3).map(|i| share(10, 3, i)).collect();
        assert_eq!(parts, vec![4, 3, 3]);
    }
}
