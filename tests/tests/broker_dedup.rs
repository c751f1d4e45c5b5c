//! Producer de-duplication against `cms-broker standalone` with the official
//! Python client (pulsar-client 3.13): with the namespace policy on, a
//! sequence id re-sent by a producer of the same name is stored once, before
//! and after a `kill -9` of the broker, and PRODUCER_SUCCESS announces the
//! last persisted id; with the policy off the same sends are stored twice
//! and −1 is announced; turning the policy on applies to a loaded topic.
//! Both also in cluster mode (ZooKeeper, three bookies, broker).
//! On the raw protocol (broker default on): a duplicate sent right behind
//! its original is acknowledged only after it, with message id (-1, -1).

use std::time::{Duration, Instant};

use bytes::Bytes;
use cms_client::proto::commands;
use cms_client::proto::frame::{ChecksumState, Frame, PayloadFrame, entry_from_parts};
use cms_client::proto::pulsar::MessageMetadata;
use cms_tests::cluster::{
    BrokerCluster, BrokerNode, PYTHON_TIMEOUT_MS, RawPulsarClient, run_python,
};
use futures::SinkExt;

/// Bound on the policy change reaching a loaded topic.
const POLICY_APPLIED_WITHIN: Duration = Duration::from_secs(30);

async fn admin(broker: &BrokerNode, method: reqwest::Method, path: &str, body: Option<&str>) {
    broker.admin_ok(method, path, body).await
}

/// Sends `m-<id>` for ids `first..=last` (≥ 1: the Python client treats an
/// explicit 0 as "assign one") with a producer named `name`; returns the
/// `last_sequence_id` announced when it was created.
async fn send(url: &str, topic: &str, name: &str, first: i64, last: i64) -> i64 {
    let (f, l) = (first.to_string(), last.to_string());
    let run = run_python(
        "dedup_send.py",
        &[
            "--url", url, "--topic", topic, "--name", name, "--first", &f, "--last", &l,
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "dedup_send failed: {} / {}", run.json, run.stderr);
    run.json["announced_last"]
        .as_i64()
        .unwrap_or_else(|| panic!("no announced_last in {}", run.json))
}

/// Every payload stored on `topic`, read by a new subscription from the
/// start without acknowledging (so every subscription holds the whole log
/// back from trimming and later new subscriptions still see all of it).
async fn stored(url: &str, topic: &str, sub: &str) -> Vec<String> {
    let run = run_python(
        "consume.py",
        &[
            "--url",
            url,
            "--topic",
            topic,
            "--sub",
            sub,
            "--count",
            "1000",
            "--drain",
            "--no-ack",
            "--timeout-ms",
            "2000",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "consume failed: {} / {}", run.json, run.stderr);
    run.json["received"]
        .as_array()
        .unwrap_or_else(|| panic!("no received in {}", run.json))
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_string())
        .collect()
}

fn payloads(ids: impl IntoIterator<Item = i64>) -> Vec<String> {
    ids.into_iter().map(|i| format!("m-{i}")).collect()
}

/// Snapshots every 4 entries: a restart restores a snapshot and replays the
/// entries after it.
const SNAPSHOT_EVERY_4: &str = "--dedup-snapshot-entries=4";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resent_sequence_ids_are_stored_once_across_a_kill_9() {
    let mut broker = BrokerNode::start_standalone(&[SNAPSHOT_EVERY_4]).await;
    stored_once_across_a_kill_9(&mut broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_policy_off_resends_are_stored_twice_until_it_is_turned_on() {
    let broker = BrokerNode::start_standalone(&[]).await;
    stored_twice_until_turned_on(&broker).await;
}

/// Both cases in cluster mode (ZooKeeper, 3 bookies, broker as processes):
/// after the `kill -9` the restarted broker takes the topic over once the
/// dead one's ZooKeeper session has expired, and recovers its ledgers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_stores_resends_once_with_the_policy_and_twice_without() {
    let mut c = BrokerCluster::start(&[SNAPSHOT_EVERY_4]).await;
    stored_once_across_a_kill_9(&mut c.broker).await;
    stored_twice_until_turned_on(&c.broker).await;
}

async fn stored_once_across_a_kill_9(broker: &mut BrokerNode) {
    admin(
        broker,
        reqwest::Method::PUT,
        "/admin/v2/namespaces/public/dd",
        None,
    )
    .await;
    admin(
        broker,
        reqwest::Method::POST,
        "/admin/v2/namespaces/public/dd/deduplication",
        Some("true"),
    )
    .await;
    let topic = "persistent://public/dd/orders";
    let url = broker.service_url();

    assert_eq!(
        send(&url, topic, "p1", 1, 10).await,
        -1,
        "new producer name"
    );
    // Same name again (as after a client restart): 6..=10 are duplicates.
    assert_eq!(send(&url, topic, "p1", 6, 15).await, 10);
    // Another name has its own sequence.
    assert_eq!(send(&url, topic, "other", 1, 3).await, -1);
    let want: Vec<String> = payloads(1..=15)
        .into_iter()
        .chain(payloads(1..=3))
        .collect();
    assert_eq!(stored(&url, topic, "s1").await, want);

    // Let a snapshot be taken for part of the log, then kill -9.
    broker.kill_and_restart().await;
    let url = broker.service_url();
    assert_eq!(
        send(&url, topic, "p1", 11, 20).await,
        15,
        "last persisted id after kill -9"
    );
    assert_eq!(send(&url, topic, "other", 1, 4).await, 3);
    let want: Vec<String> = payloads(1..=15)
        .into_iter()
        .chain(payloads(1..=3))
        .chain(payloads(16..=20))
        .chain(payloads(4..=4))
        .collect();
    assert_eq!(stored(&url, topic, "s2").await, want);

    // Once more, after a clean restart (snapshot written on the way).
    broker.restart().await;
    let url = broker.service_url();
    assert_eq!(send(&url, topic, "p1", 1, 21).await, 20);
    let mut want = want;
    want.push("m-21".into());
    assert_eq!(stored(&url, topic, "s3").await, want);

    // Stats: de-duplication on, and its system cursor is no subscription.
    let (status, body) = cms_tests::harness::http::get(
        &cms_tests::harness::http::client(),
        broker.http(),
        "/admin/v2/persistent/public/dd/orders/stats",
    )
    .await
    .expect("stats");
    assert_eq!(status, 200, "{body}");
    let stats: serde_json::Value = serde_json::from_str(&body).expect("stats JSON");
    assert_eq!(stats["deduplicationStatus"], "Enabled", "{stats}");
    let mut subs: Vec<&String> = stats["subscriptions"]
        .as_object()
        .unwrap_or_else(|| panic!("subscriptions in {stats}"))
        .keys()
        .collect();
    subs.sort();
    assert_eq!(subs, ["s1", "s2", "s3"], "{stats}");
}

async fn stored_twice_until_turned_on(broker: &BrokerNode) {
    admin(
        broker,
        reqwest::Method::PUT,
        "/admin/v2/namespaces/public/plain",
        None,
    )
    .await;
    let topic = "persistent://public/plain/events";
    let url = broker.service_url();
    assert_eq!(send(&url, topic, "p1", 1, 5).await, -1);
    assert_eq!(
        send(&url, topic, "p1", 1, 5).await,
        -1,
        "off: nothing announced"
    );
    let twice: Vec<String> = payloads(1..=5).into_iter().chain(payloads(1..=5)).collect();
    assert_eq!(stored(&url, topic, "s1").await, twice);

    // Turn it on while the topic is loaded: the broker reloads the topic;
    // poll until a fresh producer name's resend is recognised.
    admin(
        broker,
        reqwest::Method::POST,
        "/admin/v2/namespaces/public/plain/deduplication",
        Some("true"),
    )
    .await;
    let deadline = Instant::now() + POLICY_APPLIED_WITHIN;
    let mut extra = Vec::new();
    let mut round = 0;
    loop {
        round += 1;
        let name = format!("probe-{round}");
        send(&url, topic, &name, 1, 1).await;
        extra.push("m-1".to_string());
        if send(&url, topic, &name, 1, 1).await == 1 {
            break;
        }
        extra.push("m-1".to_string());
        assert!(
            Instant::now() < deadline,
            "de-duplication not in force within {POLICY_APPLIED_WITHIN:?}"
        );
    }
    let mut want = twice;
    want.extend(extra);
    assert_eq!(stored(&url, topic, "s2").await, want);
}

/// PRODUCER on `c` named `name`; returns the announced `last_sequence_id`.
async fn raw_producer(c: &mut RawPulsarClient, topic: &str, id: u64, name: &str) -> i64 {
    c.send(commands::producer(topic, id, 100 + id, Some(name)))
        .await;
    let got = c.recv().await.expect("PRODUCER_SUCCESS");
    let ps = got
        .producer_success
        .clone()
        .unwrap_or_else(|| panic!("PRODUCER_SUCCESS, got {got:?}"));
    ps.last_sequence_id.unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_right_behind_its_original_is_acked_after_it() {
    let broker = BrokerNode::start_standalone(&["--broker-deduplication-enabled=true"]).await;
    let topic = "persistent://public/default/raw-dedup";
    let mut c = RawPulsarClient::connected(broker.pulsar()).await;
    assert_eq!(raw_producer(&mut c, topic, 1, "raw-p").await, -1);
    // Pipelined: 1, 1 again (its original in flight or just durable), 2,
    // then 1 once more.
    let seqs = [1u64, 1, 2, 1];
    for seq in seqs {
        let md = MessageMetadata {
            producer_name: "raw-p".into(),
            sequence_id: seq,
            publish_time: 1,
            ..Default::default()
        };
        c.framed
            .send(Frame::Payload(PayloadFrame {
                command: Box::new(commands::send(1, seq, 1)),
                broker_entry_metadata: None,
                checksum: ChecksumState::Valid,
                entry: Bytes::from(entry_from_parts(&md, format!("r{seq}").as_bytes()).to_vec()),
            }))
            .await
            .expect("send");
    }
    let mut stored = Vec::new();
    for (i, seq) in seqs.iter().enumerate() {
        let got = c.recv().await.expect("receipt");
        let r = got
            .send_receipt
            .clone()
            .unwrap_or_else(|| panic!("SEND_RECEIPT #{i}, got {got:?}"));
        assert_eq!(r.sequence_id, *seq, "receipts in send order");
        let id = r.message_id.expect("message id");
        let duplicate = id.ledger_id == u64::MAX && id.entry_id == u64::MAX;
        assert_eq!(duplicate, i == 1 || i == 3, "receipt #{i}: {id:?}");
        if !duplicate {
            stored.push((id.ledger_id, id.entry_id));
        }
    }
    assert_eq!(stored.len(), 2);
    c.send(commands::close_producer(1, 7)).await;
    let got = c.recv().await.expect("SUCCESS");
    assert!(got.success.is_some(), "{got:?}");
    // The next producer of that name learns the last persisted id.
    assert_eq!(raw_producer(&mut c, topic, 2, "raw-p").await, 2);
}
