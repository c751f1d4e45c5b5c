//! The fault suite's shared parts (RELIABILITY.md, issue 16): a full cluster
//! ([`FaultCluster`]: ZooKeeper, four bookies on the fault-injecting storage,
//! two brokers in cluster mode, optionally autorecovery and chaos proxies in
//! front of every bookie and broker), a produce-and-consume [`Workload`]
//! through the Rust SDK that records every operation into a
//! [`crate::history::History`] and measures the longest stall, process
//! resource sampling ([`ProcStats`]) and the suite's knobs (seed, minutes).
//!
//! Promises: every wait is bounded (a fault that wedges the cluster fails
//! the test, it does not hang it); the load is paced so six test processes
//! on two cores stay responsive; nothing here judges a result — the tests
//! do, through the history checker.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cms_client::{Client, InitialPosition, ProducerMessage, SubType as SdkSubType};

use crate::chaos::{ChaosProxy, Faults};
use crate::cluster::{BookieNode, BrokerNode, autorecovery_process, init_store};
use crate::harness::process::Process;
use crate::harness::zookeeper::ZooKeeper;
use crate::history::{History, MessageId, SubType};

/// Environment variable: minutes of the kill storm and the lossy-network soak.
pub const MINUTES_ENV: &str = "CMS_FAULT_MINUTES";
/// Environment variable: the seed of the randomised cases (printed by each run).
pub const SEED_ENV: &str = "CMS_FAULT_SEED";

/// Duration of the long-running cases: `$CMS_FAULT_MINUTES` minutes, else 60
/// with `CMS_TEST_LONG=1`, else `ci_minutes`.
pub fn fault_duration(ci_minutes: f64) -> Duration {
    let minutes = std::env::var(MINUTES_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|m| *m > 0.0)
        .unwrap_or(if std::env::var_os("CMS_TEST_LONG").is_some() {
            60.0
        } else {
            ci_minutes
        });
    Duration::from_secs_f64(minutes * 60.0)
}

/// The seed: `$CMS_FAULT_SEED`, else derived from the clock (print it).
pub fn fault_seed() -> u64 {
    std::env::var(SEED_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// What a [`FaultCluster`] starts.
#[derive(Clone, Debug, Default)]
pub struct ClusterOptions {
    /// Bookies run on the fault-injecting storage (`--fault-injection`).
    pub fault_injection: bool,
    /// Run `cms-bookie autorecovery` with this lost-bookie grace (ms).
    pub autorecovery_grace_ms: Option<u64>,
    /// Put a chaos proxy in front of every bookie (brokers reach bookies
    /// through it) and every broker (clients reach brokers through it).
    pub proxies: bool,
    /// Extra broker flags.
    pub broker_extra: Vec<String>,
    /// Extra bookie flags.
    pub bookie_extra: Vec<String>,
    /// `broker-1` reaches ZooKeeper only through a chaos proxy
    /// ([`FaultCluster::zk_proxy`]), so a test can cut it off (P0-5).
    pub zk_proxy_for_broker_1: bool,
}

/// ZooKeeper, four bookies and two brokers (cluster mode, E/Qw/Qa 3/3/2,
/// de-duplication on), as processes.
#[derive(Debug)]
pub struct FaultCluster {
    /// ZooKeeper.
    pub zk: ZooKeeper,
    /// `b1..b4`.
    pub bookies: Vec<BookieNode>,
    /// `broker-1`, `broker-2`.
    pub brokers: Vec<BrokerNode>,
    /// The autorecovery process, when asked for.
    pub autorecovery: Option<Process>,
    /// Chaos proxies in front of the bookies (same order), when asked for.
    pub bookie_proxies: Vec<ChaosProxy>,
    /// Chaos proxies in front of the brokers (same order), when asked for.
    pub broker_proxies: Vec<ChaosProxy>,
    /// The proxy between `broker-1` and ZooKeeper, when asked for.
    pub zk_proxy: Option<ChaosProxy>,
}

/// Bookies in a fault cluster.
pub const BOOKIES: usize = 4;
/// Brokers in a fault cluster.
pub const BROKERS: usize = 2;

/// Loopback host a proxied bookie advertises (its proxy listens there on the
/// bookie's own port).
const BOOKIE_PROXY_HOST: &str = "127.0.0.2";
/// Loopback host a proxied broker advertises.
const BROKER_PROXY_HOST: &str = "127.0.0.3";

impl FaultCluster {
    /// Starts everything and waits until every process is ready.
    pub async fn start(options: ClusterOptions) -> FaultCluster {
        let zk = ZooKeeper::start().await;
        let zks = zk.connect_string();
        init_store(&zks).await.close().await;
        let mut bookies = Vec::with_capacity(BOOKIES);
        let mut bookie_proxies = Vec::new();
        for i in 1..=BOOKIES {
            let id = format!("b{i}");
            let mut extra: Vec<String> = Vec::new();
            if options.fault_injection {
                extra.push("--fault-injection".into());
            }
            if options.proxies {
                extra.push(format!("--advertised-host={BOOKIE_PROXY_HOST}"));
            }
            extra.extend(options.bookie_extra.iter().cloned());
            let refs: Vec<&str> = extra.iter().map(String::as_str).collect();
            let mut process = BookieNode::builder(&id, &zks, &refs).spawn();
            if options.proxies {
                let grpc = process.addr("grpc");
                bookie_proxies.push(proxy_for(BOOKIE_PROXY_HOST, grpc).await);
            }
            let http = process.addr("http");
            process.wait_ready(http).await;
            bookies.push(BookieNode { process, id });
        }
        let mut broker_extra = vec!["--broker-deduplication-enabled=true".to_string()];
        if options.proxies {
            broker_extra.push(format!("--advertised-address={BROKER_PROXY_HOST}"));
        }
        broker_extra.extend(options.broker_extra.iter().cloned());
        let refs: Vec<&str> = broker_extra.iter().map(String::as_str).collect();
        let mut brokers = Vec::with_capacity(BROKERS);
        let mut broker_proxies = Vec::new();
        let zk_proxy = if options.zk_proxy_for_broker_1 {
            let any: SocketAddr = "127.0.0.1:0"
                .parse()
                .unwrap_or_else(|e| panic!("address: {e}"));
            Some(
                ChaosProxy::start(any, zk.addr())
                    .await
                    .unwrap_or_else(|e| panic!("ZooKeeper proxy: {e}")),
            )
        } else {
            None
        };
        for i in 1..=BROKERS {
            let name = format!("broker-{i}");
            let broker = if i == 1 {
                let via = zk_proxy
                    .as_ref()
                    .map_or(zks.clone(), |p| p.local_addr().to_string());
                BrokerNode::start_cluster(&name, &via, &refs).await
            } else {
                let mut process = BrokerNode::cluster_builder(&name, &zks, &refs).spawn();
                let http = process.addr("http");
                process.wait_ready(http).await;
                BrokerNode { process }
            };
            if options.proxies {
                broker_proxies.push(proxy_for(BROKER_PROXY_HOST, broker.pulsar()).await);
            }
            brokers.push(broker);
        }
        let autorecovery = options
            .autorecovery_grace_ms
            .map(|grace| autorecovery_process(&zks, grace, &[]));
        FaultCluster {
            zk,
            bookies,
            brokers,
            autorecovery,
            bookie_proxies,
            broker_proxies,
            zk_proxy,
        }
    }

    /// Sets infinite retention (time and size) on `public/default`, where the
    /// workload's topics live, so a catch-up reader started later still
    /// finds every acked message: without it, ledgers that every
    /// subscription consumed are deleted once they roll (Pulsar's
    /// semantics), and an hour-long run rolls them.
    pub async fn retain_everything(&self) {
        self.brokers[0]
            .admin_ok(
                reqwest::Method::POST,
                "/admin/v2/namespaces/public/default/retention",
                Some(r#"{"retentionTimeInMinutes":-1,"retentionSizeInMB":-1}"#),
            )
            .await;
    }

    /// The service URL listing every broker (through its proxy, if any).
    pub fn service_url(&self) -> String {
        let hosts: Vec<String> = if self.broker_proxies.is_empty() {
            self.brokers
                .iter()
                .map(|b| b.pulsar().to_string())
                .collect()
        } else {
            self.broker_proxies
                .iter()
                .map(|p| p.local_addr().to_string())
                .collect()
        };
        format!("pulsar://{}", hosts.join(","))
    }

    /// Every proxy (bookies first).
    pub fn proxies(&self) -> impl Iterator<Item = &ChaosProxy> {
        self.bookie_proxies.iter().chain(self.broker_proxies.iter())
    }

    /// Sets `faults` on every proxy.
    pub fn set_proxy_faults(&self, faults: &Faults) {
        for p in self.proxies() {
            p.set_faults(faults.clone())
                .unwrap_or_else(|e| panic!("proxy faults: {e}"));
        }
    }

    /// Name, pid and `/metrics` address (bookies, brokers, autorecovery) of
    /// every server process (ZooKeeper too), for resource sampling.
    pub fn processes(&self) -> Vec<(String, u32, Option<SocketAddr>)> {
        let mut out = Vec::new();
        if let Some(p) = self.zk.pid() {
            out.push(("zookeeper".to_string(), p, None));
        }
        for b in &self.bookies {
            if let Some(p) = b.process.pid() {
                out.push((b.id.clone(), p, Some(b.http())));
            }
        }
        for b in &self.brokers {
            if let Some(p) = b.process.pid() {
                out.push((b.process.name().to_string(), p, Some(b.http())));
            }
        }
        if let Some(a) = &self.autorecovery
            && let Some(p) = a.pid()
        {
            out.push(("autorecovery".to_string(), p, Some(a.addr("http"))));
        }
        out
    }

    /// The last `lines` of every server log, for failure messages.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for b in &self.bookies {
            out.push_str(&format!(
                "---- {} ----\n{}\n",
                b.id,
                b.process.log_tail(lines)
            ));
        }
        for b in &self.brokers {
            out.push_str(&format!(
                "---- {} ----\n{}\n",
                b.process.name(),
                b.process.log_tail(lines)
            ));
        }
        out
    }
}

async fn proxy_for(host: &str, upstream: SocketAddr) -> ChaosProxy {
    let listen: SocketAddr = format!("{host}:{}", upstream.port())
        .parse()
        .unwrap_or_else(|e| panic!("proxy address: {e}"));
    ChaosProxy::start(listen, upstream)
        .await
        .unwrap_or_else(|e| panic!("chaos proxy {listen} -> {upstream}: {e}"))
}

/// What a [`Workload`] runs.
#[derive(Clone, Debug)]
pub struct WorkloadOptions {
    /// Topics (each gets one producer and one Exclusive subscription `audit`).
    pub topics: usize,
    /// Sends per second per topic at most.
    pub rate_per_topic: u32,
    /// Bound on one send before its outcome is "unknown" and the producer is
    /// recreated.
    pub send_timeout: Duration,
    /// A tag making topic names unique.
    pub tag: String,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        Self {
            topics: 4,
            rate_per_topic: 50,
            send_timeout: Duration::from_secs(30),
            tag: "faults".into(),
        }
    }
}

/// Counters and stall tracking shared by a workload's tasks.
#[derive(Debug, Default)]
struct Shared {
    stop_producing: AtomicBool,
    stop_consuming: AtomicBool,
    sends_acked: AtomicU64,
    sends_unknown: AtomicU64,
    receipts: AtomicU64,
    /// Per topic: acked payloads, received payloads.
    acked: Mutex<HashMap<String, HashSet<String>>>,
    received: Mutex<HashMap<String, HashSet<String>>>,
    /// Per topic: last ack instant and the longest gap between acks.
    stalls: Mutex<HashMap<String, (Instant, Duration)>>,
}

impl Shared {
    fn note_ack(&self, topic: &str, payload: &str) {
        self.sends_acked.fetch_add(1, Ordering::Relaxed);
        lock(&self.acked)
            .entry(topic.to_string())
            .or_default()
            .insert(payload.to_string());
        let now = Instant::now();
        let mut s = lock(&self.stalls);
        let e = s.entry(topic.to_string()).or_insert((now, Duration::ZERO));
        let gap = now - e.0;
        e.0 = now;
        e.1 = e.1.max(gap);
    }

    fn missing(&self, topic: &str) -> usize {
        let acked = lock(&self.acked);
        let received = lock(&self.received);
        let Some(a) = acked.get(topic) else { return 0 };
        let empty = HashSet::new();
        let r = received.get(topic).unwrap_or(&empty);
        a.iter().filter(|p| !r.contains(*p)).count()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Produce-and-consume load recorded into a history.
#[derive(Debug)]
pub struct Workload {
    /// The history every task records into.
    pub history: History,
    /// Full topic names.
    pub topics: Vec<String>,
    shared: Arc<Shared>,
    producers: Vec<tokio::task::JoinHandle<()>>,
    consumers: Vec<tokio::task::JoinHandle<()>>,
    started: Instant,
}

/// What a finished workload did.
#[derive(Clone, Debug)]
pub struct WorkloadSummary {
    /// Sends acknowledged by the broker.
    pub sends_acked: u64,
    /// Sends with an unknown outcome (timed out or failed).
    pub sends_unknown: u64,
    /// Messages handed to consumers (redeliveries included).
    pub receipts: u64,
    /// Longest time any topic went without an acknowledged send while the
    /// producers ran.
    pub longest_stall: Duration,
    /// Acked payloads never received when draining ended.
    pub undelivered: usize,
    /// How long the workload ran.
    pub elapsed: Duration,
}

impl std::fmt::Display for WorkloadSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} sends acked, {} unknown, {} receipts, longest stall {:.1} s, {} acked undelivered, {:.0} s",
            self.sends_acked,
            self.sends_unknown,
            self.receipts,
            self.longest_stall.as_secs_f64(),
            self.undelivered,
            self.elapsed.as_secs_f64()
        )
    }
}

/// The client every workload task uses: short operation timeout, fast
/// reconnect backoff.
pub fn fault_client(url: &str) -> Client {
    Client::builder(url)
        .operation_timeout(Duration::from_secs(10))
        .connection_timeout(Duration::from_secs(5))
        .backoff(Duration::from_millis(100), Duration::from_secs(2))
        .build()
        .unwrap_or_else(|e| panic!("client for {url}: {e}"))
}

fn history_id(id: &cms_client::MessageId) -> MessageId {
    let mut m = MessageId::new(id.ledger_id, id.entry_id);
    if id.batch_index >= 0 {
        m = m.with_batch_index(id.batch_index);
    }
    if id.partition >= 0 {
        m = m.with_partition(id.partition);
    }
    m
}

impl Workload {
    /// Starts one producer and one consumer task per topic against `url`.
    /// Consumers subscribe before the producers start.
    pub async fn start(url: &str, options: WorkloadOptions) -> Workload {
        let history = History::new(5_000_000);
        let shared = Arc::new(Shared::default());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() % 1_000_000_000)
            .unwrap_or(0);
        let topics: Vec<String> = (0..options.topics)
            .map(|i| {
                format!(
                    "persistent://public/default/{}-{}-{nanos}-t{i}",
                    options.tag,
                    std::process::id()
                )
            })
            .collect();
        let mut producers = Vec::new();
        let mut consumers = Vec::new();
        for (i, topic) in topics.iter().enumerate() {
            let client = fault_client(url);
            // Subscribe first so the subscription covers every send.
            let consumer = subscribe_retrying(&client, topic, Duration::from_secs(60)).await;
            consumers.push(tokio::spawn(consume(
                client.clone(),
                Some(consumer),
                topic.clone(),
                format!("c{i}"),
                history.clone(),
                shared.clone(),
            )));
            producers.push(tokio::spawn(produce(
                client,
                topic.clone(),
                format!("p{i}"),
                history.clone(),
                shared.clone(),
                options.clone(),
            )));
        }
        Workload {
            history,
            topics,
            shared,
            producers,
            consumers,
            started: Instant::now(),
        }
    }

    /// Sends acknowledged so far.
    pub fn sends_acked(&self) -> u64 {
        self.shared.sends_acked.load(Ordering::Relaxed)
    }

    /// Waits until `n` more sends than now are acknowledged (panics after `timeout_ms`).
    pub async fn wait_for_acks(&self, n: u64, timeout_ms: u64) {
        let target = self.sends_acked() + n;
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        while self.sends_acked() < target {
            assert!(
                Instant::now() < deadline,
                "only {} of {target} sends acked within {timeout_ms} ms",
                self.sends_acked()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Records an injected fault (opens a redelivery window in the checker).
    pub fn fault(&self, description: impl Into<String>) {
        let d = description.into();
        println!("fault: {d}");
        self.history.fault(d);
    }

    /// Resets the per-topic stall clocks (call when the faults start, so the
    /// ramp-up does not count).
    pub fn reset_stall_clock(&self) {
        let now = Instant::now();
        for v in lock(&self.shared.stalls).values_mut() {
            *v = (now, Duration::ZERO);
        }
    }

    /// The longest gap between acked sends of any topic so far.
    pub fn longest_stall(&self) -> Duration {
        let now = Instant::now();
        lock(&self.shared.stalls)
            .values()
            .map(|(last, longest)| (*longest).max(now - *last))
            .max()
            .unwrap_or_default()
    }

    /// Stops producing, lets consumers drain until every acked payload was
    /// received (or `drain_timeout` passes), stops them and summarises.
    pub async fn finish(&mut self, drain_timeout: Duration) -> WorkloadSummary {
        self.shared.stop_producing.store(true, Ordering::SeqCst);
        let longest_stall = self.longest_stall();
        // Every send settles (acked, or unknown after its timeout) before the
        // drain is judged.
        for t in std::mem::take(&mut self.producers) {
            let _ = tokio::time::timeout(Duration::from_secs(60), t).await;
        }
        let deadline = Instant::now() + drain_timeout;
        loop {
            let missing: usize = self.topics.iter().map(|t| self.shared.missing(t)).sum();
            if missing == 0 || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.shared.stop_consuming.store(true, Ordering::SeqCst);
        for t in std::mem::take(&mut self.consumers) {
            let _ = tokio::time::timeout(Duration::from_secs(40), t).await;
        }
        let undelivered = self.topics.iter().map(|t| self.shared.missing(t)).sum();
        WorkloadSummary {
            sends_acked: self.shared.sends_acked.load(Ordering::Relaxed),
            sends_unknown: self.shared.sends_unknown.load(Ordering::Relaxed),
            receipts: self.shared.receipts.load(Ordering::Relaxed),
            longest_stall,
            undelivered,
            elapsed: self.started.elapsed(),
        }
    }

    /// A catch-up reader: a new Exclusive subscription `sub` from the
    /// earliest message on every topic, recorded into the history, reading
    /// until it saw every acked payload or `within` passed. Returns the acked
    /// payloads it never saw (the checker judges them too, when `sub` is
    /// required complete).
    pub async fn catch_up(&self, url: &str, sub: &str, within: Duration) -> usize {
        let started = Instant::now();
        let deadline = started + within;
        let client = fault_client(url);
        let mut missing_total = 0;
        for topic in &self.topics {
            let acked: HashSet<String> = lock(&self.shared.acked)
                .get(topic)
                .cloned()
                .unwrap_or_default();
            let topic_started = Instant::now();
            // Acked payloads not seen yet, kept as a count so the loop's test
            // is O(1) rather than a scan of the acked set per message.
            let mut left = acked.len();
            let mut seen = HashSet::new();
            let mut received = 0u64;
            let mut generation = 0;
            'outer: while Instant::now() < deadline && left > 0 {
                generation += 1;
                let Ok(Ok(mut c)) = tokio::time::timeout(
                    Duration::from_secs(15),
                    client
                        .consumer(topic.as_str(), sub)
                        .sub_type(SdkSubType::Exclusive)
                        .initial_position(InitialPosition::Earliest)
                        .subscribe(),
                )
                .await
                else {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue;
                };
                let rec = self.history.consumer(
                    format!("{sub}-g{generation}"),
                    topic,
                    sub,
                    SubType::Exclusive,
                );
                rec.redelivery_triggered("catch-up reader subscribed");
                let mut subscriptions = c.subscriptions();
                while Instant::now() < deadline && left > 0 {
                    match tokio::time::timeout(Duration::from_secs(1), c.receive()).await {
                        Ok(Ok(m)) => {
                            if c.subscriptions() != subscriptions {
                                subscriptions = c.subscriptions();
                                rec.redelivery_triggered("the SDK resubscribed");
                            }
                            received += 1;
                            let payload = String::from_utf8_lossy(&m.payload).to_string();
                            let id = history_id(&m.id);
                            rec.received(m.key.as_deref(), &payload, id, m.redelivery_count);
                            rec.acked(id, Some(&payload));
                            if acked.contains(&payload) && seen.insert(payload) {
                                left -= 1;
                            }
                            let _ =
                                tokio::time::timeout(Duration::from_secs(10), c.ack(&m.id)).await;
                        }
                        Ok(Err(_)) => {
                            let _ = tokio::time::timeout(Duration::from_secs(5), c.close()).await;
                            continue 'outer;
                        }
                        Err(_) => {}
                    }
                }
                let _ = tokio::time::timeout(Duration::from_secs(5), c.close()).await;
            }
            let secs = topic_started.elapsed().as_secs_f64();
            println!(
                "catch-up {sub} {topic}: {} of {} acked seen, {received} received in {secs:.1} s \
                 ({:.0} msg/s), {generation} subscription(s)",
                acked.len() - left,
                acked.len(),
                received as f64 / secs.max(0.001),
            );
            missing_total += left;
        }
        println!(
            "catch-up {sub}: {missing_total} missing after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        client.close().await;
        missing_total
    }

    /// Every acked message id's (ledger, entry).
    pub fn acked_entries(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self
            .history
            .events()
            .iter()
            .filter_map(|e| match &e.kind {
                crate::history::EventKind::Send(s) => match &s.op {
                    crate::history::SendOp::Acked { message_id } => {
                        Some(message_id.entry_position())
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Checker options: every topic's `audit` subscription must be complete.
    pub fn check_options(&self) -> crate::history::CheckOptions {
        let mut o = crate::history::CheckOptions::at_least_once();
        for t in &self.topics {
            o = o.require_complete(t.clone(), "audit");
        }
        o
    }
}

async fn subscribe_retrying(
    client: &Client,
    topic: &str,
    within: Duration,
) -> cms_client::Consumer {
    let deadline = Instant::now() + within;
    loop {
        let attempt = tokio::time::timeout(
            Duration::from_secs(15),
            client
                .consumer(topic, "audit")
                .sub_type(SdkSubType::Exclusive)
                .initial_position(InitialPosition::Earliest)
                .receiver_queue_size(200)
                .subscribe(),
        )
        .await;
        match attempt {
            Ok(Ok(c)) => return c,
            Ok(Err(e)) if Instant::now() < deadline => {
                tracing::info!(topic, error = %e, "subscribe failed, retrying");
            }
            Err(_) if Instant::now() < deadline => {
                tracing::info!(topic, "subscribe timed out, retrying");
            }
            other => panic!("subscribing to {topic} within {within:?}: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn produce(
    client: Client,
    topic: String,
    name: String,
    history: History,
    shared: Arc<Shared>,
    options: WorkloadOptions,
) {
    let pace = Duration::from_secs_f64(1.0 / f64::from(options.rate_per_topic.max(1)));
    let mut seq = 0u64;
    let mut generation = 0u32;
    while !shared.stop_producing.load(Ordering::SeqCst) {
        generation += 1;
        let pname = format!("{name}-{}-g{generation}", std::process::id());
        let created = tokio::time::timeout(
            Duration::from_secs(15),
            client.producer(topic.as_str()).name(pname.clone()).create(),
        )
        .await;
        let producer = match created {
            Ok(Ok(p)) => p,
            _ => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
        };
        let rec = history.producer(&pname, &topic);
        while !shared.stop_producing.load(Ordering::SeqCst) {
            let started = Instant::now();
            let payload = format!("{name}-{seq}");
            seq += 1;
            rec.invoked(None, &payload);
            match tokio::time::timeout(
                options.send_timeout,
                producer.send(ProducerMessage::new(payload.clone())),
            )
            .await
            {
                Ok(Ok(id)) => {
                    rec.acked(&payload, history_id(&id));
                    shared.note_ack(&topic, &payload);
                }
                Ok(Err(e)) => {
                    rec.unknown(&payload, e.to_string());
                    shared.sends_unknown.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(_) => {
                    rec.unknown(&payload, "send timed out");
                    shared.sends_unknown.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
            if let Some(rest) = pace.checked_sub(started.elapsed()) {
                tokio::time::sleep(rest).await;
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), producer.close()).await;
    }
}

async fn consume(
    client: Client,
    mut first: Option<cms_client::Consumer>,
    topic: String,
    name: String,
    history: History,
    shared: Arc<Shared>,
) {
    let mut generation = 0u32;
    while !shared.stop_consuming.load(Ordering::SeqCst) {
        generation += 1;
        let mut consumer = match first.take() {
            Some(c) => c,
            None => {
                match tokio::time::timeout(
                    Duration::from_secs(15),
                    client
                        .consumer(topic.as_str(), "audit")
                        .sub_type(SdkSubType::Exclusive)
                        .initial_position(InitialPosition::Earliest)
                        .receiver_queue_size(200)
                        .subscribe(),
                )
                .await
                {
                    Ok(Ok(c)) => c,
                    _ => {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        continue;
                    }
                }
            }
        };
        let rec = history.consumer(
            format!("{name}-g{generation}"),
            &topic,
            "audit",
            SubType::Exclusive,
        );
        rec.redelivery_triggered("consumer subscribed");
        let mut subscriptions = consumer.subscriptions();
        while !shared.stop_consuming.load(Ordering::SeqCst) {
            match tokio::time::timeout(Duration::from_millis(500), consumer.receive()).await {
                Ok(Ok(m)) => {
                    // The SDK reconnects silently; acks in flight at that
                    // moment may be lost and redelivered.
                    let now = consumer.subscriptions();
                    if now != subscriptions {
                        subscriptions = now;
                        rec.redelivery_triggered("the SDK resubscribed");
                    }
                    let payload = String::from_utf8_lossy(&m.payload).to_string();
                    let id = history_id(&m.id);
                    rec.received(m.key.as_deref(), &payload, id, m.redelivery_count);
                    shared.receipts.fetch_add(1, Ordering::Relaxed);
                    lock(&shared.received)
                        .entry(topic.clone())
                        .or_default()
                        .insert(payload.clone());
                    rec.acked(id, Some(&payload));
                    match tokio::time::timeout(Duration::from_secs(10), consumer.ack(&m.id)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            // The ack never left: the broker will redeliver.
                            rec.redelivery_triggered(format!("ack not sent: {e}"));
                        }
                        Err(_) => {
                            rec.redelivery_triggered("ack timed out");
                            break;
                        }
                    }
                }
                Ok(Err(e)) => {
                    tracing::info!(topic, error = %e, "receive failed; resubscribing");
                    break;
                }
                Err(_) => {}
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), consumer.close()).await;
    }
}

/// One sample of a process's resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcSample {
    /// Resident set size in KiB.
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// What the process's bounded caches held, in KiB, as its `/metrics`
    /// reported them right after the `/proc` read ([`CACHE_GAUGES`]; 0 for
    /// processes without them).
    pub cache_kib: u64,
}

impl ProcSample {
    /// RSS less the caches: what a leak would grow.
    pub fn uncached_kib(&self) -> u64 {
        self.rss_kib.saturating_sub(self.cache_kib)
    }
}

/// The gauges of bounded in-memory caches (bytes), summed into
/// [`ProcSample::cache_kib`]: bookie write and read caches, broker entry cache.
pub const CACHE_GAUGES: [&str; 3] = [
    "cms_bookie_storage_write_cache_bytes",
    "cms_bookie_storage_read_cache_bytes",
    "cms_broker_entry_cache_bytes",
];

/// The sum of [`CACHE_GAUGES`] in a Prometheus text exposition, in bytes.
pub fn cache_bytes(metrics: &str) -> u64 {
    CACHE_GAUGES
        .iter()
        .filter_map(|g| crate::cluster::metric_in(metrics, g))
        .map(|v| v.max(0.0) as u64)
        .sum()
}

/// A process's resources from `/proc`, None if it is gone.
pub fn sample_process(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(ProcSample {
        rss_kib,
        fds,
        cache_kib: 0,
    })
}

/// Resource samples of named processes over time.
#[derive(Clone, Debug, Default)]
pub struct ProcStats {
    /// Per process name: (pid, sample) in time order.
    pub samples: HashMap<String, Vec<(u32, ProcSample)>>,
}

impl ProcStats {
    /// Samples every `(name, pid)`; the caches of those with a `/metrics`
    /// address are read from it (a failed scrape counts them as empty).
    pub async fn sample(&mut self, procs: &[(String, u32, Option<SocketAddr>)]) {
        let http = crate::harness::http::client();
        for (name, pid, metrics) in procs {
            let Some(mut s) = sample_process(*pid) else {
                continue;
            };
            if let Some(addr) = metrics
                && let Ok((200, body)) = crate::harness::http::get(&http, *addr, "/metrics").await
            {
                s.cache_kib = cache_bytes(&body) / 1024;
            }
            self.samples
                .entry(name.clone())
                .or_default()
                .push((*pid, s));
        }
    }

    /// Processes whose last-quarter median grew beyond the first-quarter
    /// median by more than `rss_factor` plus `rss_slack_kib` (RSS less the
    /// bounded caches, [`ProcSample::uncached_kib`]: caches filling to their
    /// configured bounds is no leak) or `fd_slack` descriptors, compared
    /// within one pid (a restart starts a new series); one line each.
    pub fn growth(&self, rss_factor: f64, rss_slack_kib: u64, fd_slack: u64) -> Vec<String> {
        let mut out = Vec::new();
        for (name, series) in &self.samples {
            let Some(&(last_pid, _)) = series.last() else {
                continue;
            };
            let own: Vec<ProcSample> = series
                .iter()
                .filter(|(p, _)| *p == last_pid)
                .map(|(_, s)| *s)
                .collect();
            if own.len() < 8 {
                continue;
            }
            let q = own.len() / 4;
            let median = |v: &[ProcSample], f: fn(&ProcSample) -> u64| {
                let mut x: Vec<u64> = v.iter().map(f).collect();
                x.sort_unstable();
                x[x.len() / 2]
            };
            let (rss0, rss1) = (
                median(&own[..q], ProcSample::uncached_kib),
                median(&own[own.len() - q..], ProcSample::uncached_kib),
            );
            let (fd0, fd1) = (
                median(&own[..q], |s| s.fds),
                median(&own[own.len() - q..], |s| s.fds),
            );
            if rss1 as f64 > rss0 as f64 * rss_factor + rss_slack_kib as f64 {
                out.push(format!("{name}: RSS less caches {rss0} KiB -> {rss1} KiB"));
            }
            if fd1 > fd0 + fd_slack {
                out.push(format!("{name}: fds {fd0} -> {fd1}"));
            }
        }
        out.sort();
        out
    }

    /// One line per process: first and last sample.
    pub fn summary(&self) -> String {
        let mut names: Vec<&String> = self.samples.keys().collect();
        names.sort();
        names
            .into_iter()
            .map(|n| {
                let s = &self.samples[n];
                let (a, b) = (s[0].1, s[s.len() - 1].1);
                // RSS less caches at the end of each eighth of the run: growth
                // that levels off (a bound being reached) or keeps on (a leak).
                let eighths: Vec<String> = (1..=8)
                    .map(|i| {
                        (s[(s.len() * i / 8).saturating_sub(1)].1.uncached_kib() / 1024).to_string()
                    })
                    .collect();
                format!(
                    "{n}: RSS {} -> {} KiB (caches {} -> {} KiB), fds {} -> {} ({} samples); \
                     RSS less caches by eighths: {} MiB",
                    a.rss_kib,
                    b.rss_kib,
                    a.cache_kib,
                    b.cache_kib,
                    a.fds,
                    b.fds,
                    s.len(),
                    eighths.join(" ")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_bytes_sums_the_cache_gauges_only() {
        let text = "# HELP cms_bookie_storage_read_cache_bytes x\n\
                    # TYPE cms_bookie_storage_read_cache_bytes gauge\n\
                    cms_bookie_storage_read_cache_bytes 2048\n\
                    cms_bookie_storage_write_cache_bytes 1024\n\
                    cms_bookie_storage_write_cache_bytes_other 99\n\
                    cms_broker_connections 7\n";
        assert_eq!(cache_bytes(text), 3072);
        assert_eq!(cache_bytes(""), 0);
    }

    fn series(points: &[(u64, u64)]) -> ProcStats {
        let mut s = ProcStats::default();
        s.samples.insert(
            "b1".into(),
            points
                .iter()
                .map(|&(rss_kib, cache_kib)| {
                    (
                        1,
                        ProcSample {
                            rss_kib,
                            fds: 10,
                            cache_kib,
                        },
                    )
                })
                .collect(),
        );
        s
    }

    #[test]
    fn caches_filling_are_no_growth_but_the_rest_growing_is() {
        // RSS 20 -> 80 MiB, all of it cache: flat.
        let filled: Vec<(u64, u64)> = (0..16).map(|i| (20_480 + i * 4_096, i * 4_096)).collect();
        assert!(series(&filled).growth(1.5, 1_024, 50).is_empty());
        // The same RSS with empty caches: growth.
        let leaked: Vec<(u64, u64)> = (0..16).map(|i| (20_480 + i * 4_096, 0)).collect();
        let g = series(&leaked).growth(1.5, 1_024, 50);
        assert_eq!(g.len(), 1, "{g:?}");
        assert!(g[0].starts_with("b1: RSS less caches"), "{g:?}");
    }
}
