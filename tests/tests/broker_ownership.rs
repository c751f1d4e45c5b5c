//! Bundle ownership across brokers (issue 9): ZooKeeper (tickTime 1 s),
//! three bookies and two `cms-broker serve` processes with a 4 s session
//! timeout; the official Python client with a service URL listing both
//! brokers.
//!
//! - lookups place topics on both brokers (redirects followed), and a
//!   `kill -9` of an owner moves its topics to the survivor with every
//!   acknowledged message consumed and no error surfaced to the producer;
//! - a SIGSTOPped owner (RELIABILITY P0-1) loses its bundles once its
//!   session expires; the other broker takes over and accepts publishes; on
//!   SIGCONT the old owner cannot acknowledge anything more (it stops), and
//!   consumers see one linear history with every acknowledged message;
//! - SIGTERM of an owner releases its bundles after closing its topics:
//!   clients move with no error and no loss;
//! - an owner cut off from ZooKeeper (chaos proxy, P0-5) stops
//!   acknowledging before its session can expire and another broker takes
//!   over; one gap-free history;
//! - bundles split automatically past a topic count and by admin request
//!   (307 to the owner), and bundle and namespace unloads (forwarded to the
//!   other owner) move topics, all under live producers: no client error,
//!   no loss.
//!
//! Debugging aids: `OWN_DEBUG=1` prints the survivor's log and the
//! producer's stderr in the kill test; `OWN_CLIENT_LOG=1` makes the Python
//! client log to stderr.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cms_tests::cluster::{BookieNode, BrokerNode, python, repo_root, start_bookies};
use cms_tests::harness::zookeeper::ZooKeeper;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// Bound on one client script, in milliseconds.
const SCRIPT_TIMEOUT_MS: u64 = 120_000;

struct Cluster {
    _zk: ZooKeeper,
    _bookies: Vec<BookieNode>,
    brokers: Vec<BrokerNode>,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Cluster {
        Self::start_with(&[]).await
    }

    /// As [`Cluster::start`], both brokers with `extra` arguments.
    async fn start_with(extra: &[&str]) -> Cluster {
        let zk = ZooKeeper::start().await;
        let zks = zk.connect_string();
        let bookies = start_bookies(&zks, 3).await;
        let a = BrokerNode::start_cluster("broker-a", &zks, extra).await;
        let mut process = BrokerNode::cluster_builder("broker-b", &zks, extra).spawn();
        let http = process.addr("http");
        process.wait_ready(http).await;
        let b = BrokerNode { process };
        Cluster {
            _zk: zk,
            _bookies: bookies,
            brokers: vec![a, b],
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// `pulsar://127.0.0.1:p1,127.0.0.1:p2`.
    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .brokers
            .iter()
            .map(|b| b.pulsar().to_string())
            .collect();
        format!("pulsar://{}", hosts.join(","))
    }

    fn stop_file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn index_of(&self, service_url: &str) -> usize {
        self.brokers
            .iter()
            .position(|b| b.service_url() == service_url)
            .unwrap_or_else(|| panic!("{service_url} is none of the brokers"))
    }
}

/// The owner's `brokerUrl` of `topic` (in `public/default`) through the
/// HTTP lookup of the broker at `http`, following its 307 redirect.
async fn http_lookup(http: std::net::SocketAddr, topic: &str) -> Result<String, String> {
    http_lookup_with(http, topic, true).await
}

/// As [`http_lookup`]; without `follow`, a redirect is an error.
async fn http_lookup_with(
    http: std::net::SocketAddr,
    topic: &str,
    follow: bool,
) -> Result<String, String> {
    let policy = if follow {
        reqwest::redirect::Policy::limited(5)
    } else {
        reqwest::redirect::Policy::none()
    };
    let client = reqwest::Client::builder()
        .redirect(policy)
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let resp = client
        .get(format!(
            "http://{http}/lookup/v2/topic/persistent/public/default/{topic}"
        ))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {body}"));
    }
    body["brokerUrl"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("no brokerUrl in {body}"))
}

/// A Python client script whose stdout lines are collected as they come.
struct Script {
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Script {
    fn spawn(args: &[&str]) -> Script {
        let path = repo_root().join("tests/python/ownership_clients.py");
        let mut child = tokio::process::Command::new(python())
            .arg(&path)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", path.display()));
        let stdout = child.stdout.take().expect("stdout piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = tokio::spawn(async move {
            let mut r = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = r.next_line().await {
                sink.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((Instant::now(), l));
            }
        });
        Script {
            child,
            lines,
            reader,
        }
    }

    fn snapshot(&self) -> Vec<(Instant, String)> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Polls until `pred` holds on the lines so far, or panics after `ms`.
    async fn wait_until(&self, what: &str, ms: u64, pred: impl Fn(&[(Instant, String)]) -> bool) {
        let deadline = Instant::now() + Duration::from_millis(ms);
        loop {
            if pred(&self.snapshot()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {ms} ms waiting for {what}; last lines: {:?}",
                self.snapshot().iter().rev().take(5).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for the exit; returns (success, lines, final JSON, stderr).
    async fn finish(mut self) -> (bool, Vec<String>, serde_json::Value, String) {
        let mut stderr = self.child.stderr.take();
        let status =
            tokio::time::timeout(Duration::from_millis(SCRIPT_TIMEOUT_MS), self.child.wait())
                .await
                .unwrap_or_else(|_| {
                    panic!("client script did not finish in {SCRIPT_TIMEOUT_MS} ms")
                })
                .expect("waiting for the client script");
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.reader).await;
        let mut err = String::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_string(&mut err).await;
        }
        let lines: Vec<String> = self
            .lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(_, l)| l.clone())
            .collect();
        let json = lines
            .iter()
            .rev()
            .find(|l| l.starts_with('{'))
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(serde_json::Value::Null);
        (status.success(), lines, json, err)
    }
}

fn count_prefix(lines: &[(Instant, String)], prefix: &str) -> usize {
    lines.iter().filter(|(_, l)| l.starts_with(prefix)).count()
}

/// `(topic, payload)` of every line starting with `kind` (`ACK` / `REC`).
fn pairs(lines: &[String], kind: &str) -> Vec<(String, String)> {
    lines
        .iter()
        .filter_map(|l| {
            let mut it = l.split(' ');
            (it.next() == Some(kind)).then(|| {
                let t = it.next().unwrap_or_default().to_string();
                let p = it.next().unwrap_or_default().to_string();
                (t, p)
            })
        })
        .collect()
}

/// Every acknowledged message was consumed; per topic and producer tag the
/// first deliveries come in send order (one linear history).
fn check_history(acked: &[(String, String)], received: &[(String, String)]) {
    let got: HashSet<&(String, String)> = received.iter().collect();
    let lost: Vec<&(String, String)> = acked.iter().filter(|a| !got.contains(a)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged messages were never consumed, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    let mut seen = HashSet::new();
    let mut last: HashMap<(String, String), u64> = HashMap::new();
    for (topic, payload) in received {
        if !seen.insert((topic.clone(), payload.clone())) {
            continue; // a redelivery
        }
        let (tag, i) = payload.rsplit_once('-').expect("payload <tag>-<i>");
        let i: u64 = i.parse().expect("payload index");
        let key = (topic.clone(), tag.to_string());
        if let Some(prev) = last.insert(key, i) {
            assert!(
                i > prev,
                "{topic}: {payload} delivered after {tag}-{prev}: not one linear history"
            );
        }
    }
}

fn acks_after(lines: &[(Instant, String)], topic: &str, t: Instant) -> Option<Instant> {
    lines
        .iter()
        .find(|(at, l)| *at > t && l.starts_with(&format!("ACK {topic} ")))
        .map(|(at, _)| *at)
}

async fn owners(c: &Cluster, via: usize, topics: &[String]) -> Vec<usize> {
    let mut out = Vec::new();
    for t in topics {
        let url = http_lookup(c.brokers[via].http(), t)
            .await
            .unwrap_or_else(|e| panic!("HTTP lookup of {t}: {e}"));
        out.push(c.index_of(&url));
    }
    out
}

/// A consumer script, then (once it is subscribed) a producer script on
/// the comma-separated `list` of topics, both stopping at `stop`; returns
/// once `acks` sends are acknowledged.
async fn start_clients(url: &str, list: &str, stop: &str, acks: usize) -> (Script, Script) {
    let consumer = Script::spawn(&[
        "consume",
        "--url",
        url,
        "--topics",
        list,
        "--stop-file",
        stop,
    ]);
    consumer
        .wait_until("consumer ready", 60_000, |l| count_prefix(l, "READY") == 1)
        .await;
    let producer = Script::spawn(&[
        "produce",
        "--url",
        url,
        "--topics",
        list,
        "--stop-file",
        stop,
    ]);
    producer
        .wait_until(&format!("{acks} acks"), 60_000, |l| {
            count_prefix(l, "ACK ") >= acks
        })
        .await;
    (consumer, producer)
}

fn touch(p: &Path) {
    std::fs::write(p, b"stop").expect("writing the stop file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_spread_topics_and_kill_9_of_an_owner_loses_nothing() {
    let c = Cluster::start().await;
    let url = c.url();
    // Bad HTTP lookups are clear 4xx JSON errors.
    for (path, status) in [
        ("persistent/public/nope/t", 404),
        ("persistent/public/default/bad%2Fname", 400),
        ("nonsense/public/default/t", 400),
    ] {
        let resp = reqwest::get(format!(
            "http://{}/lookup/v2/topic/{path}",
            c.brokers[0].http()
        ))
        .await
        .expect("HTTP lookup");
        assert_eq!(resp.status().as_u16(), status, "{path}");
        let body: serde_json::Value = resp.json().await.expect("JSON error body");
        assert!(body["reason"].is_string(), "{path}: {body}");
    }
    let topics: Vec<String> = (0..8).map(|i| format!("own-{i}")).collect();
    let list = topics.join(",");
    let stop = c.stop_file("stop");
    let stop_s = stop.to_string_lossy().to_string();
    let (consumer, producer) = start_clients(&url, &list, &stop_s, 160).await;

    // Both brokers own some of the topics; either broker's HTTP lookup
    // agrees (the other one redirects).
    let by_a = owners(&c, 0, &topics).await;
    let by_b = owners(&c, 1, &topics).await;
    assert_eq!(by_a, by_b, "the two brokers disagree on owners");
    assert!(
        by_a.contains(&0) && by_a.contains(&1),
        "all topics on one broker: {by_a:?}"
    );

    let victim = by_a[0];
    let moved: Vec<String> = topics
        .iter()
        .zip(&by_a)
        .filter(|(_, o)| **o == victim)
        .map(|(t, _)| t.clone())
        .collect();
    let mut c = c;
    let killed_at = Instant::now();
    c.brokers[victim].process.kill();
    if std::env::var("OWN_DEBUG").is_ok() {
        println!("killed at {:?}", std::time::SystemTime::now());
    }
    // Producers resume on the survivor.
    let moved2 = moved.clone();
    producer
        .wait_until("acks of every moved topic after the kill", 60_000, |l| {
            moved2.iter().all(|t| acks_after(l, t, killed_at).is_some())
        })
        .await;
    let resumed = moved
        .iter()
        .filter_map(|t| acks_after(&producer.snapshot(), t, killed_at))
        .max()
        .expect("resumed");
    println!(
        "producers resumed {} ms after kill -9 of the owner ({} topics moved)",
        resumed.duration_since(killed_at).as_millis(),
        moved.len()
    );
    let n = count_prefix(&producer.snapshot(), "ACK ");
    producer
        .wait_until("more acks", 30_000, |l| count_prefix(l, "ACK ") >= n + 80)
        .await;
    let survivor = 1 - victim;
    if std::env::var("OWN_DEBUG").is_ok() {
        println!("{}", c.brokers[survivor].process.log_tail(300));
    }
    let now_owned = owners(&c, survivor, &topics).await;
    assert!(now_owned.iter().all(|o| *o == survivor), "{now_owned:?}");

    touch(&stop);
    let (ok, plines, pjson, perr) = producer.finish().await;
    assert!(ok, "producer failed: {pjson} {perr}");
    assert_eq!(
        pjson["errors"],
        serde_json::json!([]),
        "errors surfaced to the producer"
    );
    let (ok, clines, cjson, cerr) = consumer.finish().await;
    assert!(ok, "consumer failed: {cjson} {cerr}");
    check_history(&pairs(&plines, "ACK"), &pairs(&clines, "REC"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_owner_is_replaced_and_cannot_acknowledge_after_it_resumes() {
    let mut c = Cluster::start().await;
    let url = c.url();
    let topic = "zombie-0".to_string();
    let stop = c.stop_file("stop");
    let stop_s = stop.to_string_lossy().to_string();
    // The subscription exists from the start (without one, retention 0 lets
    // the new owner trim the recovered ledger).
    let now = c.stop_file("now");
    touch(&now);
    let now_s = now.to_string_lossy().to_string();
    let sub = Script::spawn(&[
        "consume",
        "--url",
        &url,
        "--topics",
        &topic,
        "--stop-file",
        &now_s,
        "--idle-ms",
        "0",
    ]);
    let (ok, _, json, err) = sub.finish().await;
    assert!(ok, "subscribing failed: {json} {err}");
    let p1 = Script::spawn(&[
        "produce",
        "--url",
        &url,
        "--topics",
        &topic,
        "--tag",
        "a",
        "--stop-file",
        &stop_s,
    ]);
    p1.wait_until("20 acks", 60_000, |l| count_prefix(l, "ACK ") >= 20)
        .await;
    let owner = owners(&c, 0, std::slice::from_ref(&topic)).await[0];
    let other = 1 - owner;

    let paused_at = Instant::now();
    c.brokers[owner].process.pause();
    // The other broker takes the bundle once the owner's session expired
    // (4 s); a lookup through it assigns it to itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match http_lookup_with(c.brokers[other].http(), &topic, false).await {
            Ok(u) if u == c.brokers[other].service_url() => break,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "the other broker never took the bundle"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let taken_after = paused_at.elapsed();
    assert!(
        taken_after >= Duration::from_millis(2_500),
        "taken over after {taken_after:?}, before the old session could have expired"
    );
    // The new owner accepts publishes while the old one is still stopped.
    let other_url = c.brokers[other].service_url();
    let p2 = Script::spawn(&[
        "produce", "--url", &other_url, "--topics", &topic, "--tag", "b", "--count", "20",
    ]);
    let (ok, p2lines, p2json, p2err) = p2.finish().await;
    assert!(ok, "producer on the new owner failed: {p2json} {p2err}");
    assert_eq!(pairs(&p2lines, "ACK").len(), 20);

    let acked_before_resume = count_prefix(&p1.snapshot(), "ACK ");
    let resumed_at = Instant::now();
    c.brokers[owner].process.resume();
    // The old owner finds its session expired and stops; the first
    // producer carries on through the new owner.
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.brokers[owner].process.is_running() {
        assert!(
            Instant::now() < deadline,
            "the old owner kept running after its session expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = c.brokers[owner].process.log_tail(400);
    assert!(log.contains("session expired"), "old owner's log: {log}");
    p1.wait_until("producer a resumes", 60_000, |l| {
        count_prefix(l, "ACK ") >= acked_before_resume + 20
    })
    .await;
    println!(
        "zombie: taken over {} ms after SIGSTOP; old owner stopped {} ms after SIGCONT",
        taken_after.as_millis(),
        resumed_at.elapsed().as_millis()
    );
    touch(&stop);
    let (ok, p1lines, p1json, p1err) = p1.finish().await;
    assert!(ok, "producer a failed: {p1json} {p1err}");
    assert_eq!(p1json["errors"], serde_json::json!([]));

    let consumer = Script::spawn(&[
        "consume",
        "--url",
        &url,
        "--topics",
        &topic,
        "--stop-file",
        &stop_s,
    ]);
    let (ok, clines, cjson, cerr) = consumer.finish().await;
    assert!(ok, "consumer failed: {cjson} {cerr}");
    let mut acked = pairs(&p1lines, "ACK");
    acked.extend(pairs(&p2lines, "ACK"));
    check_history(&acked, &pairs(&clines, "REC"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_an_owner_moves_its_topics_without_client_errors() {
    let mut c = Cluster::start().await;
    let url = c.url();
    let topics: Vec<String> = (0..4).map(|i| format!("term-{i}")).collect();
    let list = topics.join(",");
    let stop = c.stop_file("stop");
    let stop_s = stop.to_string_lossy().to_string();
    let (consumer, producer) = start_clients(&url, &list, &stop_s, 80).await;
    let own = owners(&c, 0, &topics).await;
    let victim = own[0];
    let moved: Vec<String> = topics
        .iter()
        .zip(&own)
        .filter(|(_, o)| **o == victim)
        .map(|(t, _)| t.clone())
        .collect();
    let t0 = Instant::now();
    let status = c.brokers[victim].process.stop().await;
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM exit: {status:?}; log: {}",
        c.brokers[victim].process.log_tail(50)
    );
    let moved2 = moved.clone();
    producer
        .wait_until("acks of the moved topics", 60_000, |l| {
            moved2.iter().all(|t| acks_after(l, t, t0).is_some())
        })
        .await;
    let resumed = moved
        .iter()
        .filter_map(|t| acks_after(&producer.snapshot(), t, t0))
        .max()
        .expect("resumed");
    println!(
        "producers resumed {} ms after SIGTERM of the owner",
        resumed.duration_since(t0).as_millis()
    );
    let n = count_prefix(&producer.snapshot(), "ACK ");
    producer
        .wait_until("more acks", 30_000, |l| count_prefix(l, "ACK ") >= n + 40)
        .await;
    touch(&stop);
    let (ok, plines, pjson, perr) = producer.finish().await;
    assert!(ok, "producer failed: {pjson} {perr}");
    assert_eq!(
        pjson["errors"],
        serde_json::json!([]),
        "errors surfaced to the producer"
    );
    let (ok, clines, cjson, cerr) = consumer.finish().await;
    assert!(ok, "consumer failed: {cjson} {cerr}");
    check_history(&pairs(&plines, "ACK"), &pairs(&clines, "REC"));
}

/// RELIABILITY P0-5: the owner reaches bookies and clients but not
/// ZooKeeper (a chaos proxy in front of ZooKeeper swallows its traffic). It
/// stops acknowledging within 2/3 of the session timeout, before its session
/// can expire; only then does the other broker take over. One gap-free
/// history, and the cut-off broker stops once it learns its session expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_from_zookeeper_stops_acknowledging_before_another_takes_over() {
    use cms_tests::chaos::{ChaosProxy, Faults};
    let zk = ZooKeeper::start().await;
    let zks = zk.connect_string();
    let _bookies = start_bookies(&zks, 3).await;
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("address");
    let proxy = ChaosProxy::start(any, zk.addr())
        .await
        .expect("chaos proxy");
    let a = BrokerNode::start_cluster("broker-a", &proxy.local_addr().to_string(), &[]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let topic = "cut-0".to_string();
    // A owns the topic's bundle (it is the only broker yet); the
    // subscription exists from the start.
    let now = dir.path().join("now");
    touch(&now);
    let now_s = now.to_string_lossy().to_string();
    let a_url = a.service_url();
    let sub = Script::spawn(&[
        "consume",
        "--url",
        &a_url,
        "--topics",
        &topic,
        "--stop-file",
        &now_s,
        "--idle-ms",
        "0",
    ]);
    let (ok, _, json, err) = sub.finish().await;
    assert!(ok, "subscribing failed: {json} {err}");
    let mut process = BrokerNode::cluster_builder("broker-b", &zks, &[]).spawn();
    let http = process.addr("http");
    process.wait_ready(http).await;
    let mut c = Cluster {
        _zk: zk,
        _bookies: Vec::new(),
        brokers: vec![a, BrokerNode { process }],
        dir,
    };
    assert_eq!(owners(&c, 1, std::slice::from_ref(&topic)).await, vec![0]);

    let url = c.url();
    let stop = c.stop_file("stop");
    let stop_s = stop.to_string_lossy().to_string();
    let p = Script::spawn(&[
        "produce",
        "--url",
        &url,
        "--topics",
        &topic,
        "--stop-file",
        &stop_s,
        "--pause-ms",
        "5",
    ]);
    p.wait_until("40 acks", 60_000, |l| count_prefix(l, "ACK ") >= 40)
        .await;

    let cut_at = Instant::now();
    proxy
        .set_faults(Faults {
            black_hole: true,
            ..Faults::none()
        })
        .expect("black hole");
    // Producers resume on the other broker.
    p.wait_until("acks after the takeover", 60_000, |l| {
        l.iter()
            .filter(|(at, l)| *at > cut_at + Duration::from_secs(6) && l.starts_with("ACK "))
            .count()
            >= 20
    })
    .await;
    let lines = p.snapshot();
    let acks: Vec<Duration> = lines
        .iter()
        .filter(|(at, l)| *at > cut_at && l.starts_with("ACK "))
        .map(|(at, _)| at.duration_since(cut_at))
        .collect();
    // The old owner gave up at 2/3 of the 4 s session timeout; nobody can
    // own the bundle before its session expired (>= 4 s after its last
    // contact, which was at most ~0.5 s before the cut). So no
    // acknowledgement falls in between.
    let (quiet_from, quiet_to) = (Duration::from_millis(3_000), Duration::from_millis(3_400));
    let in_gap: Vec<&Duration> = acks
        .iter()
        .filter(|d| **d >= quiet_from && **d <= quiet_to)
        .collect();
    assert!(
        in_gap.is_empty(),
        "acknowledgements {in_gap:?} after the cut: the cut-off owner kept acknowledging"
    );
    let resumed = acks.iter().find(|d| **d > quiet_to).copied();
    let last_before = acks.iter().filter(|d| **d < quiet_from).max().copied();
    println!(
        "cut off from ZooKeeper: last acknowledgement {last_before:?} after the cut, producers resumed {resumed:?} after it"
    );
    let log = c.brokers[0].process.log_tail(400);
    assert!(
        log.contains("giving up bundle ownership"),
        "cut-off broker's log: {log}"
    );

    // Healed: the old owner learns its session expired and stops.
    proxy.clear_faults();
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.brokers[0].process.is_running() {
        assert!(
            Instant::now() < deadline,
            "the cut-off broker kept running after its session expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    touch(&stop);
    let (ok, plines, pjson, perr) = p.finish().await;
    assert!(ok, "producer failed: {pjson} {perr}");
    assert_eq!(pjson["errors"], serde_json::json!([]));
    let b_url = c.brokers[1].service_url();
    let consumer = Script::spawn(&[
        "consume",
        "--url",
        &b_url,
        "--topics",
        &topic,
        "--stop-file",
        &stop_s,
    ]);
    let (ok, clines, cjson, cerr) = consumer.finish().await;
    assert!(ok, "consumer failed: {cjson} {cerr}");
    check_history(&pairs(&plines, "ACK"), &pairs(&clines, "REC"));
    drop(proxy);
}

/// A JSON admin call with a 30 s bound; `follow`: follow 307 redirects.
async fn admin(
    http: std::net::SocketAddr,
    method: reqwest::Method,
    path: &str,
    body: Option<&str>,
    follow: bool,
) -> (u16, serde_json::Value, Option<String>) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(if follow {
            reqwest::redirect::Policy::limited(3)
        } else {
            reqwest::redirect::Policy::none()
        })
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client");
    let mut req = client.request(method.clone(), format!("http://{http}{path}"));
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let status = resp.status().as_u16();
    let location = resp
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        location,
    )
}

/// The stored bundle layout of `public/split`.
async fn split_layout(http: std::net::SocketAddr) -> cms_broker::ownership::bundles::Bundles {
    let (status, v, _) = admin(
        http,
        reqwest::Method::GET,
        "/admin/v2/namespaces/public/split/bundles",
        None,
        true,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let b: Vec<String> = serde_json::from_value(v["boundaries"].clone()).expect("boundaries");
    let layout = cms_broker::ownership::bundles::Bundles::from_policy(Some(&b), None)
        .unwrap_or_else(|e| panic!("layout {v}: {e}"));
    assert_eq!(v["numBundles"], layout.ranges().len(), "{v}");
    layout
}

/// The most topics of `topics` in one bundle of `layout`, and that bundle.
fn fullest(
    layout: &cms_broker::ownership::bundles::Bundles,
    topics: &[String],
) -> (usize, cms_broker::ownership::bundles::BundleRange) {
    let mut counts: HashMap<_, usize> = HashMap::new();
    for t in topics {
        *counts.entry(layout.bundle_of_topic(t)).or_default() += 1;
    }
    let (r, n) = counts
        .into_iter()
        .max_by_key(|(r, n)| (*n, *r))
        .expect("topics");
    (n, r)
}

/// Issue 9 item 5: a bundle that grows past the topic-count threshold
/// splits by itself; an admin split (asked of either broker) and bundle and
/// namespace unloads move topics; producers and consumers ride through all
/// of it with no error surfaced and no acknowledged message lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bundles_split_and_unload_under_load_without_client_errors() {
    use reqwest::Method;
    let c = Cluster::start_with(&[
        "--bundle-split-topics-max=3",
        "--bundle-split-check-interval-ms=300",
    ])
    .await;
    let (ha, hb) = (c.brokers[0].http(), c.brokers[1].http());
    let (status, v, _) = admin(
        ha,
        Method::PUT,
        "/admin/v2/namespaces/public/split",
        Some(r#"{"bundles":{"numBundles":1}}"#),
        true,
    )
    .await;
    assert_eq!(status, 204, "{v}");
    assert_eq!(split_layout(hb).await.ranges().len(), 1);

    let url = c.url();
    let topics: Vec<String> = (0..8)
        .map(|i| format!("persistent://public/split/s-{i}"))
        .collect();
    let list = topics.join(",");
    let stop = c.stop_file("stop");
    let stop_s = stop.to_string_lossy().to_string();
    let (consumer, producer) = start_clients(&url, &list, &stop_s, 80).await;

    // Automatic split: 8 loaded topics in one bundle, threshold 3: the
    // owner splits until no bundle serves more than 3 of them.
    let deadline = Instant::now() + Duration::from_secs(60);
    let layout = loop {
        let layout = split_layout(ha).await;
        if fullest(&layout, &topics).0 <= 3 {
            break layout;
        }
        assert!(
            Instant::now() < deadline,
            "no automatic split to <= 3 topics per bundle in 60 s: {:?}",
            layout.boundaries()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(layout.ranges().len() >= 3, "{:?}", layout.boundaries());
    // Both brokers read the same layout.
    assert_eq!(split_layout(hb).await, layout);
    let t_auto = Instant::now();
    producer
        .wait_until(
            "acks on every topic after the automatic splits",
            60_000,
            |l| topics.iter().all(|t| acks_after(l, t, t_auto).is_some()),
        )
        .await;

    // Bad split requests are clear 4xx answers.
    let base = "/admin/v2/namespaces/public/split";
    for (path, want) in [
        (format!("{base}/0x00000000_0x00000010/split"), 404),
        (format!("{base}/not-a-bundle/split"), 400),
        (format!("{base}/0x00000000_0x00000010/unload"), 404),
        ("/admin/v2/namespaces/public/absent/unload".to_string(), 404),
        (
            format!(
                "{base}/{}/split?splitAlgorithmName=topic_count_equally_divide",
                layout.ranges()[0]
            ),
            412,
        ),
    ] {
        let (status, v, _) = admin(ha, Method::PUT, &path, None, true).await;
        assert_eq!(status, want, "PUT {path}: {v}");
        assert!(v["reason"].is_string(), "PUT {path}: {v}");
    }

    // Admin split of the fullest bundle, asked of the broker that does not
    // own it: 307 to the owner, which splits it.
    let (_, target) = fullest(&layout, &topics);
    let (_, own, _) = admin(ha, Method::GET, &format!("{base}/ownership"), None, true).await;
    let owner_url = own
        .as_array()
        .expect("ownership list")
        .iter()
        .find(|b| b["bundle"] == target.to_string())
        .and_then(|b| b["webServiceUrl"].as_str())
        .unwrap_or_else(|| panic!("bundle {target} has no owner: {own}"))
        .to_string();
    let other = if owner_url.ends_with(&ha.port().to_string()) {
        hb
    } else {
        ha
    };
    let split_path = format!("{base}/{target}/split");
    let (status, v, location) = admin(other, Method::PUT, &split_path, None, false).await;
    assert_eq!(status, 307, "{v}");
    assert_eq!(
        location.as_deref(),
        Some(format!("{owner_url}{split_path}").as_str())
    );
    let (status, v, _) = admin(other, Method::PUT, &split_path, None, true).await;
    assert_eq!(status, 204, "{v}");
    let after = split_layout(hb).await;
    assert_eq!(after.ranges().len(), layout.ranges().len() + 1);
    assert!(!after.contains_range(&target));
    let (status, _, _) = admin(ha, Method::PUT, &split_path, None, true).await;
    assert_eq!(status, 404, "the split bundle is gone");

    // Unload one bundle, then the whole namespace (through the other
    // broker: the bundles it does not own are forwarded to their owner).
    let t_unload = Instant::now();
    let one = after.bundle_of_topic(&topics[0]);
    let (status, v, _) = admin(ha, Method::PUT, &format!("{base}/{one}/unload"), None, true).await;
    assert_eq!(status, 204, "{v}");
    let (status, v, _) = admin(hb, Method::PUT, &format!("{base}/unload"), None, true).await;
    assert_eq!(status, 204, "{v}");
    producer
        .wait_until("acks on every topic after the unloads", 60_000, |l| {
            topics.iter().all(|t| acks_after(l, t, t_unload).is_some())
        })
        .await;

    touch(&stop);
    let (ok, plines, pjson, perr) = producer.finish().await;
    assert!(ok, "producer failed: {pjson} {perr}");
    assert_eq!(
        pjson["errors"],
        serde_json::json!([]),
        "errors surfaced to the producer"
    );
    let (ok, clines, cjson, cerr) = consumer.finish().await;
    assert!(ok, "consumer failed: {cjson} {cerr}");
    check_history(&pairs(&plines, "ACK"), &pairs(&clines, "REC"));
}
