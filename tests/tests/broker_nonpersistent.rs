//! Non-persistent topics through the official Python client against a
//! standalone broker (and, for fan-out and partitions, in cluster mode):
//! every subscription receives (Shared spread over two consumers,
//! Exclusive), a consumer that does not receive loses messages
//! (counted in `/metrics`) without slowing the producer, a late subscriber
//! gets nothing published before it, nothing is stored (no managed-ledger
//! node: the admin topic list stays empty) and nothing comes back after a
//! restart. A partitioned non-persistent topic (created through the admin
//! REST) spreads its messages over its partitions. While in use a
//! non-persistent topic is listed and has stats in the admin REST.

use cms_tests::cluster::{
    BrokerCluster, BrokerNode, PYTHON_TIMEOUT_MS, finish_python, metric_value, run_python,
    spawn_python,
};
use cms_tests::harness::http;

fn strs(v: &serde_json::Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key:?} in {v}"))
        .iter()
        .map(|x| x.as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_persistent_fan_out_drops_and_stores_nothing() {
    let mut broker = BrokerNode::start_standalone(&[]).await;
    fan_out_drops_and_stores_nothing(&mut broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_non_persistent_topic_uses_every_partition() {
    let broker = BrokerNode::start_standalone(&[]).await;
    partitioned_uses_every_partition(&broker).await;
}

/// Both in cluster mode (ZooKeeper, 3 bookies, broker as processes):
/// bookies are never written for a non-persistent topic either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_non_persistent_fan_out_and_partitions() {
    let mut c = BrokerCluster::start(&[]).await;
    fan_out_drops_and_stores_nothing(&mut c.broker).await;
    partitioned_uses_every_partition(&c.broker).await;
}

async fn fan_out_drops_and_stores_nothing(broker: &mut BrokerNode) {
    let url = broker.service_url();
    let topic = "non-persistent://public/default/np-fanout";
    let count = 200usize;
    let count_arg = count.to_string();
    let run = run_python(
        "nonpersistent.py",
        &[
            "--url", &url, "--topic", topic, "--mode", "fanout", "--count", &count_arg, "--after",
            "5",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "fanout failed: {} / {}", run.json, run.stderr);
    let j = &run.json;
    let expected: Vec<String> = (0..count).map(|i| format!("msg-{i}")).collect();
    let after: Vec<String> = (0..5).map(|i| format!("after-{i}")).collect();

    // Every subscription got everything: Shared spread over its two
    // consumers, Exclusive all in order.
    assert_eq!(strs(j, "shared_all"), expected, "{j}");
    let shared_counts: Vec<u64> = j["shared_counts"]
        .as_array()
        .expect("shared_counts")
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .collect();
    assert!(
        shared_counts.iter().all(|&n| n > 0),
        "both Shared consumers receive: {shared_counts:?}"
    );
    assert_eq!(strs(j, "excl"), expected, "{j}");
    assert_eq!(strs(j, "excl_after"), after, "{j}");
    // Receipts carry ids from the topic's counter (no ledger).
    assert_eq!(
        j["receipt_ids"],
        serde_json::json!([[0, 0], [0, 1], [0, 2]])
    );

    // The late subscriber got nothing of the earlier messages, then the
    // later ones.
    assert_eq!(strs(j, "late_before"), Vec::<String>::new(), "{j}");
    assert_eq!(strs(j, "late_after"), after, "{j}");

    // The consumer with a queue of one lost most messages; the producer was
    // not held back by it (200 sends well within the timeout).
    let slow = j["slow_received"].as_u64().expect("slow_received");
    assert!(slow <= 3, "slow consumer received {slow}");
    let dropped = metric_value(broker.http(), "cms_nonpersistent_messages_dropped_total")
        .await
        .expect("cms_nonpersistent_messages_dropped_total in /metrics");
    let total = (count + 5) as f64;
    assert!(
        dropped >= total - 3.0 - slow as f64,
        "dropped {dropped} of {total} for the slow consumer"
    );
    let send_seconds = j["send_seconds"].as_f64().expect("send_seconds");
    assert!(send_seconds < 10.0, "sending took {send_seconds} s");

    // Nothing stored: no topic (managed-ledger node) of that name.
    let c = http::client();
    let (status, body) = http::get(&c, broker.http(), "/admin/v2/persistent/public/default")
        .await
        .expect("topic list");
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("np-fanout"), "stored topics: {body}");

    // After a restart nothing comes back.
    broker.restart().await;
    let url = broker.service_url();
    let run = run_python(
        "nonpersistent.py",
        &[
            "--url",
            &url,
            "--topic",
            topic,
            "--mode",
            "after-restart",
            "--wait-ms",
            "1500",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(
        run.ok,
        "after-restart failed: {} / {}",
        run.json, run.stderr
    );
    assert_eq!(
        strs(&run.json, "received"),
        Vec::<String>::new(),
        "{}",
        run.json
    );
    let (_, body) = http::get(&c, broker.http(), "/admin/v2/persistent/public/default")
        .await
        .expect("topic list");
    assert!(!body.contains("np-fanout"), "stored topics: {body}");
}

async fn partitioned_uses_every_partition(broker: &BrokerNode) {
    let c = http::client();
    let response = c
        .put(format!(
            "http://{}/admin/v2/non-persistent/public/default/np-parted/partitions",
            broker.http()
        ))
        .header("content-type", "application/json")
        .body("3")
        .send()
        .await
        .expect("create partitioned");
    assert!(
        response.status().is_success(),
        "create partitioned: {}",
        response.status()
    );
    let url = broker.service_url();
    let run = run_python(
        "nonpersistent.py",
        &[
            "--url",
            &url,
            "--topic",
            "non-persistent://public/default/np-parted",
            "--mode",
            "partitioned",
            "--count",
            "60",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "partitioned failed: {} / {}", run.json, run.stderr);
    let topics = strs(&run.json, "topics");
    assert_eq!(
        topics,
        (0..3)
            .map(|i| format!("non-persistent://public/default/np-parted-partition-{i}"))
            .collect::<Vec<_>>(),
        "{}",
        run.json
    );
    // Nothing stored for any partition.
    let (_, body) = http::get(&c, broker.http(), "/admin/v2/persistent/public/default")
        .await
        .expect("topic list");
    assert!(!body.contains("np-parted"), "stored topics: {body}");
    // Not in use any more: not listed, no stats.
    let (_, body) = http::get(&c, broker.http(), "/admin/v2/non-persistent/public/default")
        .await
        .expect("non-persistent list");
    assert_eq!(body.trim(), "[]", "{body}");
    let (status, _) = http::get(
        &c,
        broker.http(),
        "/admin/v2/non-persistent/public/default/np-parted-partition-0/stats",
    )
    .await
    .expect("stats");
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_persistent_topic_in_use_is_listed_with_stats() {
    use tokio::io::AsyncBufReadExt;
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    let topic = "non-persistent://public/default/np-watched";
    let mut child = spawn_python(
        "consume.py",
        &[
            "--url",
            &url,
            "--topic",
            topic,
            "--sub",
            "watch",
            "--sub-type",
            "Shared",
            "--count",
            "3",
            "--timeout-ms",
            "30000",
        ],
    );
    let stdout = child.stdout.take().expect("stdout");
    let lines = tokio::io::BufReader::new(stdout).lines();
    let c = http::client();
    // Poll until the consumer has subscribed and given permits (the topic
    // is then in use; earlier messages would be dropped).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let stats = loop {
        let (_, body) = http::get(&c, broker.http(), "/admin/v2/non-persistent/public/default")
            .await
            .expect("non-persistent list");
        if body.contains(topic) {
            let (status, body) = http::get(
                &c,
                broker.http(),
                "/admin/v2/non-persistent/public/default/np-watched/stats",
            )
            .await
            .expect("stats");
            assert_eq!(status, 200, "{body}");
            let stats: serde_json::Value = serde_json::from_str(&body).expect("json");
            let permits = stats["subscriptions"]["watch"]["consumers"][0]["availablePermits"]
                .as_i64()
                .unwrap_or(0);
            if permits > 0 {
                break stats;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{topic} never in use with permits: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(stats["subscriptions"]["watch"]["type"], "Shared", "{stats}");
    assert_eq!(
        stats["subscriptions"]["watch"]["consumersCount"], 1,
        "{stats}"
    );

    let run = run_python(
        "produce.py",
        &["--url", &url, "--topic", topic, "--count", "3"],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    let consumed = finish_python(child, lines, PYTHON_TIMEOUT_MS).await;
    assert!(
        consumed.ok,
        "consume failed: {} / {}",
        consumed.json, consumed.stderr
    );
    assert_eq!(
        strs(&consumed.json, "received"),
        vec!["msg-0", "msg-1", "msg-2"],
        "{}",
        consumed.json
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_persistent_protocol_answers() {
    use cms_client::proto::commands;
    use cms_client::proto::frame::{ChecksumState, Frame, PayloadFrame, entry_from_parts};
    use cms_client::proto::pulsar::command_subscribe::{InitialPosition, SubType};
    use cms_client::proto::pulsar::{
        MessageMetadata, ProducerAccessMode, ServerError, base_command::Type,
    };
    use cms_tests::cluster::RawPulsarClient;
    use futures::SinkExt;

    let broker = BrokerNode::start_standalone(&[]).await;
    let topic = "non-persistent://public/default/np-raw";
    let mut c = RawPulsarClient::connected(broker.pulsar()).await;

    // A producer, and a retry of the same request: both succeed, same name.
    c.send(commands::producer(topic, 1, 1, Some("np-p"))).await;
    let a = c.recv().await.expect("PRODUCER answer");
    assert_eq!(a.r#type, Type::ProducerSuccess as i32, "{a:?}");
    c.send(commands::producer(topic, 1, 2, Some("np-p"))).await;
    let b = c.recv().await.expect("PRODUCER retry answer");
    assert_eq!(
        b.producer_success
            .as_ref()
            .map(|p| p.producer_name.as_str()),
        Some("np-p"),
        "{b:?}"
    );
    // Exclusive producers are refused on non-persistent topics.
    let mut excl = commands::producer(topic, 2, 3, None);
    if let Some(p) = excl.producer.as_mut() {
        p.producer_access_mode = Some(ProducerAccessMode::Exclusive as i32);
    }
    c.send(excl).await;
    let e = c.recv().await.expect("exclusive PRODUCER answer");
    assert_eq!(
        e.error.as_ref().map(|x| x.error),
        Some(ServerError::NotAllowedError as i32),
        "{e:?}"
    );

    // A consumer with permits gets what is published, with the receipt's id.
    c.send(commands::subscribe(
        topic,
        "raw-sub",
        SubType::Exclusive,
        7,
        4,
        InitialPosition::Latest,
    ))
    .await;
    let ok = c.recv().await.expect("SUBSCRIBE answer");
    assert_eq!(ok.r#type, Type::Success as i32, "{ok:?}");
    c.send(commands::flow(7, 10)).await;
    let md = MessageMetadata {
        producer_name: "np-p".into(),
        sequence_id: 0,
        publish_time: 1,
        ..Default::default()
    };
    c.framed
        .send(Frame::Payload(PayloadFrame {
            command: Box::new(commands::send(1, 0, 1)),
            broker_entry_metadata: None,
            checksum: ChecksumState::Valid,
            entry: entry_from_parts(&md, b"hello"),
        }))
        .await
        .expect("send");
    let mut receipt = None;
    let mut message = None;
    for _ in 0..2 {
        let got = c.recv().await.expect("receipt or message");
        if let Some(r) = got.send_receipt {
            receipt = r.message_id.map(|m| (m.ledger_id, m.entry_id));
        } else if let Some(m) = got.message {
            message = Some((m.message_id.ledger_id, m.message_id.entry_id));
        } else {
            panic!("unexpected {got:?}");
        }
    }
    assert_eq!(receipt, Some((0, 0)));
    assert_eq!(message, Some((0, 0)));

    // Seek is refused; a close is idempotent.
    c.send(commands::seek(7, 5, commands::message_id(0, 0)))
        .await;
    let s = c.recv().await.expect("SEEK answer");
    assert_eq!(
        s.error.as_ref().map(|x| x.error),
        Some(ServerError::NotAllowedError as i32),
        "{s:?}"
    );
    c.send(commands::close_consumer(7, 6)).await;
    let a = c.recv().await.expect("CLOSE_CONSUMER answer");
    assert_eq!(a.r#type, Type::Success as i32, "{a:?}");
    c.send(commands::close_consumer(7, 7)).await;
    let a = c.recv().await.expect("second CLOSE_CONSUMER answer");
    assert_eq!(a.r#type, Type::Success as i32, "{a:?}");
}
