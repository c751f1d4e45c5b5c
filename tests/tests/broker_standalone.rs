//! `cms-broker standalone` as a process: it starts and is ready quickly,
//! answers `/health`, `/ready`, `/metrics`, and the official Python client
//! (pulsar-client 3.13, C++ 4.2) produces to it and consumes from it; data
//! acknowledged before a restart or a `kill -9` is still there after it.

use std::time::Instant;

use cms_tests::cluster::{BrokerNode, PYTHON_TIMEOUT_MS, run_python};
use cms_tests::harness::http;

fn strs(v: &serde_json::Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key:?} in {v}"))
        .iter()
        .map(|x| x.as_str().unwrap_or_default().to_string())
        .collect()
}

fn expected(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_starts_and_the_python_client_produces() {
    let started = Instant::now();
    let broker = BrokerNode::start_standalone(&[]).await;
    let took = started.elapsed();
    assert!(took.as_secs() < 10, "standalone ready after {took:?}");

    let c = http::client();
    let (status, body) = http::get(&c, broker.http(), "/health")
        .await
        .expect("health");
    assert_eq!(status, 200, "{body}");
    let (status, body) = http::get(&c, broker.http(), "/ready").await.expect("ready");
    assert_eq!(status, 200, "{body}");
    let ready: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(ready["writable_bookies"], 1, "{body}");
    let (status, body) = http::get(&c, broker.http(), "/nope").await.expect("404");
    assert_eq!(status, 404);
    assert!(body.contains("reason"), "{body}");

    let url = broker.service_url();
    let run = run_python(
        "produce.py",
        &[
            "--url",
            &url,
            "--topic",
            "standalone-produce",
            "--count",
            "20",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    assert_eq!(run.json["sent"], 20);
    let ids = strs(&run.json, "ids");
    assert_eq!(ids.len(), 20);
    let name = run.json["producer_name"].as_str().unwrap_or_default();
    assert!(
        name.starts_with("standalone-"),
        "assigned producer name {name}"
    );

    let (_, metrics) = http::get(&c, broker.http(), "/metrics")
        .await
        .expect("metrics");
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from /metrics"))
    };
    assert!(value("cms_broker_messages_in_total") >= 20.0);
    assert!(value("cms_broker_topics_loaded") >= 1.0);
    assert!(value("cms_broker_publish_latency_seconds_count") >= 20.0);

    // Subscribe first, then produce and consume back in order.
    let run = run_python(
        "produce_consume.py",
        &[
            "--url",
            &url,
            "--topic",
            "standalone-roundtrip",
            "--count",
            "50",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "round trip failed: {} / {}", run.json, run.stderr);
    assert_eq!(strs(&run.json, "received"), expected("msg-", 50));
    // The 20 messages produced before any subscription, from the earliest position.
    let run = consume(&url, "standalone-produce", "late-sub", 20, false).await;
    assert_eq!(strs(&run, "received"), expected("msg-", 20));
}

async fn produce(url: &str, topic: &str, n: usize) {
    let count = n.to_string();
    let run = run_python(
        "produce.py",
        &["--url", url, "--topic", topic, "--count", &count],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
}

/// Receives (and acks) `n` messages on `sub`, or with `drain` until none
/// arrives for 2 s; the JSON result.
async fn consume(url: &str, topic: &str, sub: &str, n: usize, drain: bool) -> serde_json::Value {
    let count = n.to_string();
    let mut args = vec![
        "--url", url, "--topic", topic, "--sub", sub, "--count", &count,
    ];
    if drain {
        args.extend(["--drain", "--timeout-ms", "2000"]);
    }
    let run = run_python("consume.py", &args, PYTHON_TIMEOUT_MS).await;
    assert!(run.ok, "consume failed: {} / {}", run.json, run.stderr);
    run.json
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_messages_and_cursors() {
    let mut broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    produce(&url, "restart-topic", 20).await;
    // Consume and ack the first 10 on a durable subscription.
    let first = consume(&url, "restart-topic", "resume", 10, false).await;
    assert_eq!(strs(&first, "received"), expected("msg-", 10));

    // SIGTERM: topics closed, cursors persisted.
    broker.restart().await;
    let url = broker.service_url();
    // Every message is still stored (the "resume" cursor holds them back
    // from trimming: no retention beyond the slowest cursor).
    let all = consume(&url, "restart-topic", "fresh", 20, false).await;
    assert_eq!(strs(&all, "received"), expected("msg-", 20));
    let rest = consume(&url, "restart-topic", "resume", 20, true).await;
    assert_eq!(
        strs(&rest, "received"),
        (10..20).map(|i| format!("msg-{i}")).collect::<Vec<_>>(),
        "the subscription resumes after its last ack"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_keeps_acknowledged_messages() {
    let mut broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    produce(&url, "kill-topic", 30).await;
    let first = consume(&url, "kill-topic", "resume", 10, false).await;
    assert_eq!(strs(&first, "received"), expected("msg-", 10));

    broker.kill_and_restart().await;
    let url = broker.service_url();
    // Every acknowledged publish survived.
    let all = consume(&url, "kill-topic", "fresh", 30, false).await;
    assert_eq!(strs(&all, "received"), expected("msg-", 30));
    // At-least-once: the acked subscription may redeliver its unpersisted
    // window, but skips nothing that was not acknowledged.
    let rest = strs(
        &consume(&url, "kill-topic", "resume", 40, true).await,
        "received",
    );
    let first_again = rest.first().cloned().unwrap_or_default();
    let start: usize = first_again
        .strip_prefix("msg-")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first message {first_again:?} in {rest:?}"));
    assert!(
        start <= 10,
        "acked messages may repeat, none may be skipped: {rest:?}"
    );
    assert_eq!(
        rest,
        (start..30).map(|i| format!("msg-{i}")).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_features_work_against_standalone() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    let run = run_python(
        "features.py",
        &["--url", &url, "--topic", "feat"],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(
        run.ok,
        "feature checks failed: {}\n{}",
        run.json, run.stderr
    );
}

/// A producer and a consumer of the official client keep running while the
/// broker is killed (-9) and restarted under them: every acknowledged send
/// is received (at least once), nothing unknown is received, and the
/// clients reconnect on their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_ride_through_a_kill_9_without_losing_acknowledged_messages() {
    use tokio::io::AsyncBufReadExt;
    let mut broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    let mut child = cms_tests::cluster::spawn_python(
        "produce_consume_through_restart.py",
        &[
            "--url",
            &url,
            "--topic",
            "through-kill",
            "--count",
            "400",
            "--interval-ms",
            "5",
        ],
    );
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    // Kill once the clients are well under way.
    let progressed = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line == "progress 100" {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(progressed, Ok(true), "the clients did not get going");
    broker.kill_and_restart().await;
    let run = cms_tests::cluster::finish_python(child, lines, 60_000).await;
    assert!(
        run.ok,
        "script failed: {}\n{}",
        run.json,
        run.stderr.chars().rev().take(3000).collect::<String>()
    );
    let acked = strs(&run.json, "acked");
    let failed = strs(&run.json, "failed");
    let received = strs(&run.json, "received");
    assert_eq!(run.json["producer_done"], true);
    eprintln!(
        "through kill -9: {} acked, {} failed, {} received",
        acked.len(),
        failed.len(),
        received.len()
    );
    assert!(acked.len() >= 100, "acked {}", acked.len());
    let got: std::collections::HashSet<&String> = received.iter().collect();
    let lost: Vec<&String> = acked.iter().filter(|a| !got.contains(a)).collect();
    assert!(
        lost.is_empty(),
        "acknowledged sends never received: {lost:?}"
    );
    let known: std::collections::HashSet<&String> = acked.iter().chain(failed.iter()).collect();
    let phantoms: Vec<&String> = received.iter().filter(|r| !known.contains(r)).collect();
    assert!(
        phantoms.is_empty(),
        "received messages never sent: {phantoms:?}"
    );
}

/// A standalone whose in-process bookie comes up read-only (its disk is at or
/// above the threshold; 0.0 makes any disk so) exits at once with an error
/// that names the disk's usage and the setting, instead of waiting 30 s for
/// a writable bookie that cannot come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_on_a_full_disk_exits_naming_the_threshold() {
    let bin = cms_tests::harness::bins::find("cms-broker").expect("cms-broker binary");
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tokio::process::Command::new(&bin)
            .args([
                "standalone",
                "--standalone-disk-usage-threshold=0.0",
                &format!("--data-dir={}", dir.path().join("data").display()),
                "--broker-bind=127.0.0.1:0",
                "--http-bind=127.0.0.1:0",
            ])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("exit within 30 s")
    .expect("run cms-broker");
    let took = started.elapsed();
    assert!(!out.status.success(), "started with a read-only bookie");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("in-process bookie is read-only")
            && stderr.contains("% used")
            && stderr.contains("--standalone-disk-usage-threshold"),
        "{stderr}"
    );
    assert!(
        took.as_secs() < 15,
        "exited after {took:?}: it should not wait out the registration timeout"
    );
}
