//! Exact broker metrics after a known workload (issue 10, metrics): N
//! messages of S payload bytes published without batching to one topic, all
//! delivered to one consumer, M acknowledged and K negatively acknowledged
//! and redelivered. `/metrics` must then report exactly: messages in = N,
//! out = N + K, bytes in = N·E and out = (N + K)·E (E: the size of one entry,
//! every entry the same size here), the publish-latency histogram's count =
//! N, one producer and one consumer, the topic's N entries, the
//! subscription's backlog of N − M entries and K unacknowledged messages,
//! K redeliveries, the ledger client's and the metadata store's latency
//! histograms filled. A second test turns the topic level off and checks the
//! per-namespace sums and that no series carries a topic label.

use std::time::Duration;

use cms_client::{Client, InitialPosition, SubType};
use cms_tests::cluster::BrokerNode;

const N: u64 = 20;
const S: usize = 100;
const M: u64 = 15;
const K: u64 = N - M;

/// The `/metrics` text of the broker.
async fn scrape(broker: &BrokerNode) -> String {
    cms_tests::harness::http::client()
        .get(format!("http://{}/metrics", broker.http()))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body")
}

/// The value of the sample `name` whose labels include every `labels` pair
/// (`key="value"`); None if there is none.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, v) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name && labels.iter().all(|p| rest.contains(p)))
            .then(|| v.trim().parse().ok())
            .flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_a_known_workload_exactly() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let topic = "persistent://public/default/metrics-exact";
    let client = Client::new(broker.service_url()).expect("client");
    // The topic is loaded by the subscribe below, not before this instant.
    let before_load = std::time::Instant::now();
    let mut consumer = client
        .consumer(topic, "s")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .negative_ack_delay(Duration::from_millis(100))
        .subscribe()
        .await
        .expect("subscribe");
    let producer = client
        .producer(topic)
        .batching(false)
        .create()
        .await
        .expect("producer");
    for i in 0..N {
        let mut payload = format!("m{i:03}").into_bytes();
        payload.resize(S, b'.');
        producer
            .send_async(payload)
            .await
            .expect("send")
            .await
            .expect("receipt");
    }
    let mut ids = Vec::new();
    for _ in 0..N {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.receive())
            .await
            .expect("a message within 30 s")
            .expect("receive");
        ids.push(m.id);
    }
    for id in &ids[..M as usize] {
        consumer.ack(id).await.expect("ack");
    }
    for id in &ids[M as usize..] {
        consumer.negative_ack(id);
    }
    for _ in 0..K {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.receive())
            .await
            .expect("a redelivery within 30 s")
            .expect("receive");
        assert!(
            ids[M as usize..].contains(&m.id),
            "redelivered an acknowledged or unknown message"
        );
    }
    // The counters are updated before the frames go out, the gauges from
    // the topics at each scrape; acks are applied asynchronously, so the
    // backlog is polled (bounded) before the exact comparison.
    let topic_l = format!("topic=\"{topic}\"");
    let sub_labels = [topic_l.as_str(), "subscription=\"s\""];
    let settled = cms_tests::harness::wait::within(10_000, || async {
        let t = scrape(&broker).await;
        sample(&t, "cms_subscription_backlog_entries", &sub_labels) == Some(K as f64)
    })
    .await;
    let text = scrape(&broker).await;
    assert!(settled.is_some(), "backlog never reached {K}:\n{text}");
    let get =
        |name: &str| sample(&text, name, &[]).unwrap_or_else(|| panic!("{name} missing:\n{text}"));
    assert_eq!(get("cms_broker_messages_in_total"), N as f64);
    assert_eq!(get("cms_broker_messages_out_total"), (N + K) as f64);
    assert_eq!(get("cms_broker_messages_redelivered_total"), K as f64);
    // Every entry of the topic went through the ledger client (cursor
    // updates do too, so at least N adds), and the broker used the store.
    assert!(get("cms_ledger_client_add_seconds_count") >= N as f64);
    assert_eq!(
        sample(&text, "cms_ledger_client_errors_total", &["op=\"add\""]).unwrap_or(0.0),
        0.0
    );
    assert!(
        sample(
            &text,
            "cms_metadata_store_op_seconds_count",
            &["op=\"create\""]
        )
        .is_some_and(|n| n >= 1.0),
        "no metadata-store create measured:\n{text}"
    );
    let bytes_in = get("cms_broker_bytes_in_total");
    let entry = bytes_in / N as f64;
    assert_eq!(entry.fract(), 0.0, "entries of unequal size: {bytes_in}");
    assert!(
        entry > S as f64 && entry < S as f64 + 200.0,
        "entry size {entry} for a {S}-byte payload"
    );
    assert_eq!(get("cms_broker_bytes_out_total"), (N + K) as f64 * entry);
    // The entry cache holds at most the topic's entries (payload bytes).
    let cached = get("cms_broker_entry_cache_bytes");
    assert!(
        cached <= N as f64 * entry,
        "entry cache {cached} bytes for {N} entries of {entry}"
    );
    assert_eq!(get("cms_broker_publish_latency_seconds_count"), N as f64);
    assert_eq!(get("cms_broker_producers"), 1.0);
    assert_eq!(get("cms_broker_consumers"), 1.0);
    assert_eq!(
        sample(&text, "cms_topic_entries", &[topic_l.as_str()]),
        Some(N as f64)
    );
    assert_eq!(
        sample(&text, "cms_topic_producers", &[topic_l.as_str()]),
        Some(1.0)
    );
    // Per topic: the same traffic as the broker-wide counters (one topic).
    for (name, want) in [
        ("cms_topic_messages_in_total", N as f64),
        ("cms_topic_bytes_in_total", bytes_in),
        ("cms_topic_messages_out_total", (N + K) as f64),
        ("cms_topic_bytes_out_total", (N + K) as f64 * entry),
    ] {
        assert_eq!(
            sample(&text, name, &[topic_l.as_str()]),
            Some(want),
            "{name}"
        );
    }
    // The admin stats carry the same counters, and rates over the time
    // since the topic was loaded (at least the 1 s sampling minimum, so all
    // N messages in at most N per second, and more than nothing).
    let since_load = before_load.elapsed();
    if since_load < Duration::from_millis(1100) {
        tokio::time::sleep(Duration::from_millis(1100) - since_load).await;
    }
    let (status, stats) = broker
        .admin_call(
            reqwest::Method::GET,
            "/admin/v2/persistent/public/default/metrics-exact/stats",
            None,
        )
        .await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["msgInCounter"], N, "{stats}");
    assert_eq!(stats["msgOutCounter"], N + K, "{stats}");
    assert_eq!(stats["bytesInCounter"].as_f64(), Some(bytes_in), "{stats}");
    assert_eq!(stats["averageMsgSize"].as_f64(), Some(entry), "{stats}");
    assert!(
        stats["msgRateIn"]
            .as_f64()
            .is_some_and(|r| r > 0.0 && r <= N as f64),
        "{stats}"
    );
    assert_eq!(
        sample(&text, "cms_subscription_consumers", &sub_labels),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "cms_subscription_unacked_messages", &sub_labels),
        Some(K as f64)
    );
    producer.close().await.expect("close producer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_level_off_sums_per_namespace() {
    let broker = BrokerNode::start_standalone(&["--metrics-topic-level=false"]).await;
    let client = Client::new(broker.service_url()).expect("client");
    let mut producers = Vec::new();
    let mut consumers = Vec::new();
    for name in ["ns-sum-a", "ns-sum-b"] {
        let topic = format!("persistent://public/default/{name}");
        consumers.push(
            client
                .consumer(&topic, "s")
                .subscribe()
                .await
                .expect("subscribe"),
        );
        let p = client
            .producer(&topic)
            .batching(false)
            .create()
            .await
            .expect("producer");
        for _ in 0..3 {
            p.send_async(b"x".to_vec())
                .await
                .expect("send")
                .await
                .expect("receipt");
        }
        producers.push(p);
    }
    let ns = ["tenant=\"public\"", "namespace=\"default\""];
    let settled = cms_tests::harness::wait::within(10_000, || async {
        let t = scrape(&broker).await;
        sample(&t, "cms_topic_entries", &ns) == Some(6.0)
            && sample(&t, "cms_subscription_backlog_entries", &ns) == Some(6.0)
    })
    .await;
    let text = scrape(&broker).await;
    assert!(settled.is_some(), "namespace sums never reached 6:\n{text}");
    assert_eq!(sample(&text, "cms_topic_producers", &ns), Some(2.0));
    assert_eq!(sample(&text, "cms_subscription_consumers", &ns), Some(2.0));
    let labelled: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("cms_topic_") || l.starts_with("cms_subscription_"))
        .filter(|l| l.contains("topic=") || l.contains("subscription="))
        .collect();
    assert!(
        labelled.is_empty(),
        "per-topic series with topic level off: {labelled:?}"
    );
    for p in producers {
        p.close().await.expect("close producer");
    }
    drop(consumers);
}
