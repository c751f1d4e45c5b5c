//! `deploy/local/cluster.sh` (issue 15 item 4), the Grafana dashboard's
//! queries (item 5) and the quick form of `scripts/bench-suite` (issue 13),
//! run as a user runs them, with the debug binaries (`CMS_BIN_DIR`):
//! - `up` starts ZooKeeper, 3 bookies and 2 brokers; `status` prints one
//!   tab-separated `role id pid service_url admin_url` line each, with live
//!   PIDs; a second `up` on the running DIR is refused; messages published
//!   through one broker are consumed through the other; `logs` shows every
//!   process; every metric named by `deploy/grafana/cms-dashboard.json` is
//!   exposed by the brokers' or bookies' `/metrics` after that traffic;
//!   `down` leaves none of the PIDs running;
//! - bad arguments are refused before anything starts, and a process that
//!   fails to start makes `up` print its log tail, stop what it started and
//!   exit non-zero;
//! - `scripts/bench-suite --quick --workloads W1` writes a JSON line with the
//!   latency, rate and peak-RSS fields and prints the table.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cms_client::{Client, InitialPosition, ProducerMessage, SubType};
use cms_tests::cluster::repo_root;
use cms_tests::harness::bins;
use serde_json::Value;

/// Bound on one `cluster.sh` / `bench-suite` invocation.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(150);
/// Bound on a process's exit after `down` returned (it should be at once).
const GONE_TIMEOUT: Duration = Duration::from_secs(5);

fn bin_dir() -> PathBuf {
    let broker = bins::find("cms-broker").unwrap_or_else(|e| panic!("{e}"));
    broker
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("{} has no directory", broker.display()))
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs a script of the repository with `args`, bounded by [`SCRIPT_TIMEOUT`].
async fn run(script: &str, args: &[&str]) -> Out {
    let mut cmd = tokio::process::Command::new(repo_root().join(script));
    cmd.args(args)
        .env("CMS_BIN_DIR", bin_dir())
        // The bookies' read-only disk threshold near 1.0, as the harness sets
        // it (BOOKIE_TEST_CONFIG): test disks are shared, and at the default
        // 0.95 a 96 %-full CI disk made every bookie read-only. cluster.sh
        // and bench-suite pass their environment on to the bookies.
        .env("CMS_BOOKIE_DISK_USAGE_THRESHOLD", "0.999")
        .env("CMS_BOOKIE_DISK_USAGE_LWM", "0.998")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(SCRIPT_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{script} {args:?} did not finish in {SCRIPT_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn cluster(args: &[&str]) -> Out {
    run("deploy/local/cluster.sh", args).await
}

/// Stops the cluster in its directory if the test ends early, then removes
/// the directory.
struct Down(tempfile::TempDir);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = std::process::Command::new(repo_root().join("deploy/local/cluster.sh"))
            .arg("down")
            .arg(self.0.path().join("c"))
            .output();
    }
}

#[derive(Debug)]
struct Line {
    role: String,
    id: String,
    pid: u32,
    service: String,
    admin: String,
}

fn parse_status(text: &str) -> Vec<Line> {
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(
                f.len(),
                5,
                "status line {l:?} has not 5 tab-separated fields"
            );
            Line {
                role: f[0].to_string(),
                id: f[1].to_string(),
                pid: f[2].parse().unwrap_or_else(|e| panic!("pid in {l:?}: {e}")),
                service: f[3].to_string(),
                admin: f[4].to_string(),
            }
        })
        .collect()
}

/// Whether `pid` runs (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(") ").map(|(_, r)| r.chars().next());
            !matches!(state, Some(Some('Z' | 'X')))
        }
        Err(_) => false,
    }
}

/// Every `expr` string anywhere in the dashboard JSON.
fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
        _ => {}
    }
}

/// The metric names in a PromQL expression: identifiers starting `cms_`
/// (every metric of ours does; no label or function name does).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b':')
            {
                i += 1;
            }
            // Not inside a string literal or after `$` (a Grafana variable).
            let prev = start.checked_sub(1).map(|p| bytes[p]);
            let ident = &expr[start..i];
            if ident.starts_with("cms_") && prev != Some(b'$') {
                out.insert(ident.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Series names a `/metrics` text exposes: each `# TYPE` family, and for a
/// histogram its `_bucket`, `_sum` and `_count` series.
fn exposed(text: &str, out: &mut BTreeSet<String>) {
    for l in text.lines() {
        let mut f = l.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (f.next(), f.next(), f.next(), f.next())
        {
            out.insert(name.to_string());
            if kind == "histogram" || kind == "summary" {
                for s in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{s}"));
                }
            }
        }
    }
}

fn dashboard() -> Value {
    let path = repo_root().join("deploy/grafana/cms-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

#[test]
fn the_dashboard_is_importable_and_every_query_names_a_metric() {
    let d = dashboard();
    assert!(
        d["title"].is_string() && d["uid"].is_string(),
        "title / uid"
    );
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    assert!(
        vars.iter().any(|v| v["type"] == "datasource"
            && v["name"] == "datasource"
            && v["query"] == "prometheus"),
        "a Prometheus datasource variable"
    );
    let panels = d["panels"].as_array().expect("panels");
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {} uses the variable",
            p["title"]
        );
        let mut es = Vec::new();
        exprs(p, &mut es);
        assert!(!es.is_empty(), "panel {} has no query", p["title"]);
        for e in es {
            assert!(!metric_names(&e).is_empty(), "{e:?} names no cms_ metric");
        }
    }
    // The extractor itself.
    let names = metric_names(
        "histogram_quantile(0.99, sum by (le, instance) (rate(cms_a_bucket[$__rate_interval]))) / cms_b",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["cms_a_bucket", "cms_b"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_sh_up_status_traffic_dashboard_metrics_down() {
    let guard = Down(tempfile::tempdir().expect("temp dir"));
    let dir = guard.0.path().join("c");
    let dir_s = dir.to_str().expect("utf-8 temp path");

    let up = cluster(&["up", dir_s]).await;
    assert_eq!(up.code, Some(0), "up failed:\n{}\n{}", up.stdout, up.stderr);

    let st = cluster(&["status", dir_s]).await;
    assert_eq!(st.code, Some(0), "status: {}", st.stderr);
    assert_eq!(st.stdout, up.stdout, "up prints the status lines");
    let lines = parse_status(&st.stdout);
    let roles: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l.role.as_str(), l.id.as_str()))
        .collect();
    assert_eq!(
        roles,
        [
            ("zookeeper", "zk1"),
            ("bookie", "b1"),
            ("bookie", "b2"),
            ("bookie", "b3"),
            ("broker", "broker1"),
            ("broker", "broker2")
        ]
    );
    for l in &lines {
        assert!(alive(l.pid), "{l:?} is not running");
        let (scheme, admin) = match l.role.as_str() {
            "zookeeper" => ("zk://127.0.0.1:", false),
            "bookie" => ("grpc://127.0.0.1:", true),
            _ => ("pulsar://127.0.0.1:", true),
        };
        assert!(l.service.starts_with(scheme), "{l:?}");
        if admin {
            assert!(l.admin.starts_with("http://127.0.0.1:"), "{l:?}");
            let r = reqwest::get(format!("{}/ready", l.admin))
                .await
                .expect("GET /ready");
            assert!(r.status().is_success(), "{l:?} not ready");
        } else {
            assert_eq!(l.admin, "-");
        }
    }

    let again = cluster(&["up", dir_s]).await;
    assert_ne!(
        again.code,
        Some(0),
        "a second up on a running DIR must fail"
    );
    assert!(again.stderr.contains("running"), "{}", again.stderr);

    // Publish through broker1, consume through broker2 (lookup redirects).
    let brokers: Vec<&Line> = lines.iter().filter(|l| l.role == "broker").collect();
    let topic = "persistent://public/default/local-cluster";
    let c2 = Client::builder(&brokers[1].service)
        .operation_timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let mut consumer = c2
        .consumer(topic, "s")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .expect("subscribe");
    let c1 = Client::builder(&brokers[0].service)
        .operation_timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let producer = c1.producer(topic).create().await.expect("producer");
    const N: usize = 20;
    for i in 0..N {
        producer
            .send(ProducerMessage::new(format!("m{i}")))
            .await
            .unwrap_or_else(|e| panic!("send {i}: {e}"));
    }
    let mut got = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < N {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = tokio::time::timeout(left, consumer.receive())
            .await
            .unwrap_or_else(|_| panic!("received only {got:?} within 30 s"))
            .expect("receive");
        got.insert(String::from_utf8_lossy(&m.payload).into_owned());
        consumer.ack(&m.id).await.expect("ack");
    }
    assert_eq!(
        got,
        (0..N).map(|i| format!("m{i}")).collect::<BTreeSet<_>>()
    );
    producer.close().await.expect("close producer");
    consumer.close().await.expect("close consumer");
    c1.close().await;
    c2.close().await;

    // Every metric the dashboard names is exposed after this traffic.
    let mut have = BTreeSet::new();
    for l in lines.iter().filter(|l| l.role != "zookeeper") {
        let text = reqwest::get(format!("{}/metrics", l.admin))
            .await
            .and_then(|r| r.error_for_status())
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics body");
        exposed(&text, &mut have);
    }
    let mut es = Vec::new();
    exprs(&dashboard(), &mut es);
    let named: BTreeSet<String> = es.iter().flat_map(|e| metric_names(e)).collect();
    assert!(named.len() >= 15, "{named:?}");
    let missing: Vec<&String> = named.difference(&have).collect();
    assert!(
        missing.is_empty(),
        "dashboard names metrics /metrics does not expose: {missing:?}"
    );

    let logs = cluster(&["logs", dir_s]).await;
    assert_eq!(logs.code, Some(0), "{}", logs.stderr);
    for l in &lines {
        assert!(
            logs.stdout.contains(&format!("==> {} {} (", l.role, l.id)),
            "logs of {}",
            l.id
        );
    }
    let one = cluster(&["logs", dir_s, "nope"]).await;
    assert_ne!(one.code, Some(0), "logs of an unknown id must fail");

    let down = cluster(&["down", dir_s]).await;
    assert_eq!(down.code, Some(0), "down: {}", down.stderr);
    let deadline = Instant::now() + GONE_TIMEOUT;
    for l in &lines {
        while alive(l.pid) {
            assert!(Instant::now() < deadline, "{l:?} still running after down");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_suite_quick_w1_writes_a_json_line_with_the_fields() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let out_file = tmp.path().join("suite.jsonl");
    let started = Instant::now();
    let r = run(
        "scripts/bench-suite",
        &[
            "--quick",
            "--workloads",
            "W1",
            "--out",
            out_file.to_str().expect("utf-8"),
        ],
    )
    .await;
    assert_eq!(
        r.code,
        Some(0),
        "bench-suite failed:\n{}\n{}",
        r.stdout,
        r.stderr
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "quick W1 took {:?}",
        started.elapsed()
    );
    let text = std::fs::read_to_string(&out_file).expect("output file");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    let l = &lines[0];
    assert_eq!(l["workload"], "W1");
    assert_eq!(l["run"], 1);
    assert_eq!(l["quick"], true);
    assert_eq!(l["msgs"], 500, "{l}");
    assert_eq!(l["max_pending"], 1, "W1 waits for each receipt: {l}");
    assert_eq!(l["worker_threads"], 1, "the suite's default: {l}");
    assert!(
        l["cpu_model"].as_str().is_some(),
        "the host's CPU model is recorded: {l}"
    );
    assert!(
        l["guest_halt_poll_ns"].is_u64() || l["guest_halt_poll_ns"].is_null(),
        "the guest's halt polling is recorded (null where absent): {l}"
    );
    for k in [
        "msg_per_s",
        "p50_ms",
        "p99_ms",
        "p999_ms",
        "max_ms",
        "broker_rss_peak_kib",
        "bookie_rss_peak_kib",
    ] {
        let v = l[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {l}"));
        assert!(v > 0.0, "{k} = {v} in {l}");
    }
    assert!(l["p50_ms"].as_f64() <= l["p99_ms"].as_f64(), "{l}");
    assert_eq!(
        l["bookie_rss_peak_kib_each"].as_object().map(|m| m.len()),
        Some(3),
        "{l}"
    );
    for k in ["commit", "topology", "profile", "time"] {
        assert!(l[k].is_string(), "{k} missing in {l}");
    }
    assert!(r.stdout.contains("| W1 | 1/1 |"), "table:\n{}", r.stdout);
    // Nothing left behind: the suite removed its cluster directory.
    assert!(!r.stderr.contains("survived"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_sh_refuses_bad_input_and_cleans_up_after_a_failed_start() {
    let guard = Down(tempfile::tempdir().expect("temp dir"));
    let dir = guard.0.path().join("c");
    let dir_s = dir.to_str().expect("utf-8 temp path");

    // Quorums larger than the bookies: refused before anything starts.
    let r = cluster(&["up", dir_s, "--bookies", "2", "--ensemble", "3"]).await;
    assert_ne!(r.code, Some(0));
    assert!(
        r.stderr.contains("ensemble (3) <= bookies (2)"),
        "{}",
        r.stderr
    );
    assert!(!dir.join("cluster.tsv").exists(), "nothing was started");
    let r = cluster(&["up", dir_s, "--brokers", "x"]).await;
    assert_ne!(r.code, Some(0));
    assert!(r.stderr.contains("'x' is not a count"), "{}", r.stderr);
    let r = cluster(&["status", dir_s]).await;
    assert_ne!(r.code, Some(0), "status of no cluster fails");

    // A broker that cannot start: up prints its log tail, stops the
    // ZooKeeper and bookie it started, and fails.
    let bad = guard.0.path().join("bad-broker.toml");
    std::fs::write(&bad, "no_such_key = 1\n").expect("write config");
    let r = cluster(&[
        "up",
        dir_s,
        "--bookies",
        "1",
        "--brokers",
        "1",
        "--broker-config",
        bad.to_str().expect("utf-8"),
    ])
    .await;
    assert_ne!(r.code, Some(0), "up with a broken broker config must fail");
    assert!(r.stderr.contains("broker1"), "{}", r.stderr);
    assert!(
        r.stderr.contains("no_such_key"),
        "the log tail names the bad key: {}",
        r.stderr
    );
    let tsv = std::fs::read_to_string(dir.join("cluster.tsv")).expect("cluster.tsv");
    let lines = parse_status(&tsv);
    assert_eq!(lines.len(), 3, "zk, bookie, broker were started: {tsv}");
    let deadline = Instant::now() + GONE_TIMEOUT;
    for l in &lines {
        while alive(l.pid) {
            assert!(
                Instant::now() < deadline,
                "{l:?} still running after the failed up"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // A DIR holding a stopped cluster is refused too.
    let r = cluster(&["up", dir_s]).await;
    assert_ne!(r.code, Some(0));
    assert!(r.stderr.contains("stopped cluster"), "{}", r.stderr);
}
