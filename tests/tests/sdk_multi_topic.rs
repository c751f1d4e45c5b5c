//! The SDK's multi-topic, pattern and retry-letter consumers against a
//! standalone `cms-broker`: one consumer over three topics gets every
//! message with its topic and its acks stick across a broker restart; a
//! pattern consumer picks up a topic created after it subscribed; a message
//! reconsumed twice through the retry topic (delays honoured) goes to the
//! DLQ on the third; `cms-perf` with several topics, producers and consumers
//! prints its JSON keys; the Python client produces on two topics and one
//! SDK multi-topic consumer receives both.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic is the test failing"
)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cms_client::sdk::consumer::retry_props;
use cms_client::{Client, InitialPosition, SubType};
use cms_tests::cluster::{BrokerNode, run_python};

fn topic(case: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
        % 1_000_000_000_000;
    format!(
        "persistent://public/default/mt-{case}-{}-{nanos}",
        std::process::id()
    )
}

fn client(url: &str) -> Client {
    Client::builder(url)
        .operation_timeout(Duration::from_secs(10))
        .backoff(Duration::from_millis(50), Duration::from_secs(1))
        .build()
        .unwrap_or_else(|e| panic!("client for {url}: {e}"))
}

/// Bounded receive: fails the test instead of hanging.
async fn recv(c: &mut cms_client::Consumer) -> cms_client::Message {
    tokio::time::timeout(Duration::from_secs(20), c.receive())
        .await
        .expect("no message within 20 s")
        .expect("receive failed")
}

/// Asserts nothing arrives within `d`.
async fn assert_quiet(c: &mut cms_client::Consumer, d: Duration) {
    if let Ok(r) = tokio::time::timeout(d, c.receive()).await {
        panic!("unexpected message: {r:?}");
    }
}

async fn produce(client: &Client, topic: &str, msgs: impl IntoIterator<Item = String>) {
    let p = client.producer(topic).create().await.unwrap();
    for m in msgs {
        p.send(m).await.unwrap();
    }
    p.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_topic_consumer_gets_every_topic_and_acks_stick_across_restart() {
    let mut broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    let c = client(&url);
    let topics: Vec<String> = (0..3).map(|i| topic(&format!("t{i}"))).collect();
    let mut consumer = c
        .consumer_topics(topics.clone(), "multi")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .receiver_queue_size(7)
        .subscribe()
        .await
        .unwrap();
    assert_eq!(consumer.topics().len(), 3);
    const PER: usize = 20;
    for t in &topics {
        produce(&c, t, (0..PER).map(|i| format!("{t}|{i}"))).await;
    }
    let mut got: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for _ in 0..3 * PER {
        let m = recv(&mut consumer).await;
        let text = std::str::from_utf8(&m.payload).unwrap().to_owned();
        let (t, i) = text.split_once('|').unwrap();
        assert_eq!(m.topic, t, "a message carries its topic");
        got.entry(t.to_owned())
            .or_default()
            .push(i.parse().unwrap());
        consumer.ack(&m.id).await.unwrap();
    }
    for t in &topics {
        let mut v = got.remove(t).unwrap_or_default();
        v.sort_unstable();
        assert_eq!(v, (0..PER).collect::<Vec<_>>(), "{t}");
    }
    consumer.close().await.unwrap();
    c.close().await;

    // Acks are on the broker: after a restart only new messages come.
    broker.restart().await;
    let c = client(&url);
    let mut consumer = c
        .consumer_topics(topics.clone(), "multi")
        .sub_type(SubType::Shared)
        .subscribe()
        .await
        .unwrap();
    for t in &topics {
        produce(&c, t, [format!("{t}|new")]).await;
    }
    let mut seen = Vec::new();
    for _ in 0..3 {
        let m = recv(&mut consumer).await;
        let text = std::str::from_utf8(&m.payload).unwrap().to_owned();
        assert!(text.ends_with("|new"), "redelivered after ack: {text}");
        seen.push(m.topic.clone());
        consumer.ack(&m.id).await.unwrap();
    }
    seen.sort();
    let mut want = topics.clone();
    want.sort();
    assert_eq!(seen, want);
    assert_quiet(&mut consumer, Duration::from_millis(1500)).await;
    consumer.close().await.unwrap();
    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pattern_consumer_picks_up_a_topic_created_after_subscribe() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let c = client(&broker.service_url());
    let base = topic("pat");
    let (a, b) = (format!("{base}-a"), format!("{base}-b"));
    produce(&c, &a, ["a0".to_string()]).await;
    let other = topic("other");
    produce(&c, &other, ["x".to_string()]).await;
    let mut consumer = c
        .consumer_pattern(format!("{base}-.*"), "pat-sub")
        .initial_position(InitialPosition::Earliest)
        .pattern_auto_discovery_period(Duration::from_millis(300))
        .subscribe()
        .await
        .unwrap();
    assert_eq!(consumer.topics(), vec![a.clone()]);
    let m = recv(&mut consumer).await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), (a.as_str(), &b"a0"[..]));
    consumer.ack(&m.id).await.unwrap();

    // A topic created now is found by the next rediscovery (bounded wait).
    produce(&c, &b, ["b0".to_string()]).await;
    let m = recv(&mut consumer).await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), (b.as_str(), &b"b0"[..]));
    consumer.ack(&m.id).await.unwrap();
    let mut t = consumer.topics();
    t.sort();
    assert_eq!(t, vec![a.clone(), b.clone()]);
    // The non-matching topic's message never comes.
    assert_quiet(&mut consumer, Duration::from_millis(1000)).await;
    consumer.close().await.unwrap();
    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconsume_later_retries_twice_with_delays_then_dead_letters() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let c = client(&broker.service_url());
    let t = topic("retry");
    let sub = "retry-sub";
    let mut dlq = c
        .consumer(format!("{t}-{sub}-DLQ"), "dlq-reader")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let mut consumer = c
        .consumer(&t, sub)
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .enable_retry(true)
        .dead_letter(2, None)
        .subscribe()
        .await
        .unwrap();
    assert!(consumer.topics().contains(&format!("{t}-{sub}-RETRY")));
    produce(&c, &t, ["job".to_string()]).await;
    let first = recv(&mut consumer).await;
    assert_eq!(first.topic, t);
    let delay = Duration::from_millis(1200);
    let mut m = first.clone();
    for n in 1..=2u32 {
        let asked = Instant::now();
        consumer.reconsume_later(&m, delay).await.unwrap();
        m = recv(&mut consumer).await;
        let waited = asked.elapsed();
        // deliver_at has millisecond resolution: allow 5 ms of rounding.
        assert!(
            waited + Duration::from_millis(5) >= delay,
            "retry {n} came after {waited:?}, asked {delay:?}"
        );
        assert_eq!(m.topic, format!("{t}-{sub}-RETRY"));
        assert_eq!(&m.payload[..], b"job");
        assert_eq!(
            m.properties.get(retry_props::RECONSUMETIMES),
            Some(&n.to_string())
        );
        assert_eq!(
            m.properties.get(retry_props::DELAY_TIME),
            Some(&delay.as_millis().to_string())
        );
        assert_eq!(m.properties.get(retry_props::REAL_TOPIC), Some(&t));
        assert_eq!(
            m.properties.get(retry_props::ORIGIN_MESSAGE_ID),
            Some(&first.id.to_string())
        );
    }
    // The third reconsume exceeds max 2: the message goes to the DLQ.
    consumer.reconsume_later(&m, delay).await.unwrap();
    let d = recv(&mut dlq).await;
    assert_eq!(&d.payload[..], b"job");
    assert_eq!(
        d.properties.get(retry_props::RECONSUMETIMES),
        Some(&"3".to_string())
    );
    assert_eq!(d.properties.get(retry_props::REAL_TOPIC), Some(&t));
    dlq.ack(&d.id).await.unwrap();
    assert_quiet(&mut consumer, delay + Duration::from_millis(800)).await;
    consumer.close().await.unwrap();
    dlq.close().await.unwrap();
    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cms_perf_with_three_topics_producers_and_consumers_prints_its_json_keys() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    let t = topic("perf");
    let v = cms_tests::harness::perf::json(
        &[
            "end-to-end",
            "--service-url",
            &url,
            "--topic",
            &t,
            "--size",
            "128",
            "--messages",
            "900",
            "--topics",
            "3",
            "--producers",
            "3",
            "--consumers",
            "3",
            "--batching",
        ],
        Duration::from_secs(90),
    )
    .await;
    for k in [
        "msgs",
        "msg_per_s",
        "mib_per_s",
        "p50_ms",
        "p99_ms",
        "p999_ms",
        "max_ms",
        "e2e_p50_ms",
        "e2e_p99_ms",
        "e2e_p999_ms",
        "e2e_max_ms",
    ] {
        assert!(v[k].is_number(), "key {k} in {v}");
    }
    assert_eq!(v["msgs"], 900);
    assert_eq!(v["topics"], 3);
    assert_eq!(v["producers"], 3);
    assert_eq!(v["consumers"], 3);
    // Every topic got its share: 300 messages each.
    let c = client(&url);
    for i in 0..3 {
        let mut r = c
            .reader(format!("{t}-{i}"))
            .start_message_id(cms_client::MessageId::EARLIEST)
            .create()
            .await
            .unwrap();
        let mut n = 0;
        while r.has_message_available().await.unwrap() {
            let m = tokio::time::timeout(Duration::from_secs(20), r.read_next())
                .await
                .expect("read within 20 s")
                .unwrap();
            n += 1;
            assert!(n <= 300, "{m:?}");
        }
        assert_eq!(n, 300, "topic {i}");
        r.close().await.unwrap();
    }
    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_produces_on_two_topics_sdk_multi_topic_consumer_gets_both() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    let c = client(&url);
    let topics = [topic("py0"), topic("py1")];
    let mut consumer = c
        .consumer_topics(topics.clone(), "py-multi")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    const N: usize = 25;
    for t in &topics {
        let n = N.to_string();
        let r = run_python(
            "sdk/py_produce.py",
            &["--url", &url, "--topic", t, "--count", &n, "--batching"],
            60_000,
        )
        .await;
        assert!(r.ok, "python produce failed: {} {}", r.json, r.stderr);
    }
    let mut got: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for _ in 0..2 * N {
        let m = recv(&mut consumer).await;
        let i: usize = m.properties["i"].parse().unwrap();
        assert_eq!(
            std::str::from_utf8(&m.payload).unwrap(),
            format!("py-{i}-{}", "abc".repeat(i * 37 % 400))
        );
        got.entry(m.topic.clone()).or_default().push(i);
        consumer.ack(&m.id).await.unwrap();
    }
    for t in &topics {
        assert_eq!(got[t], (0..N).collect::<Vec<_>>(), "{t} in order");
    }
    consumer.close().await.unwrap();
    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_topic_consumer_expands_partitioned_topics_and_routes_nacks_and_acks() {
    let broker = BrokerNode::start_standalone(&[
        "--allow-auto-topic-creation-type=partitioned",
        "--default-num-partitions=3",
    ])
    .await;
    let c = client(&broker.service_url());
    let topics = [topic("pa"), topic("pb")];
    let mut producers = Vec::new();
    for t in &topics {
        let p = c.producer(t).create().await.unwrap();
        assert_eq!(p.partitions(), 3);
        producers.push(p);
    }
    let subscribe = || {
        c.consumer_topics(topics.clone(), "parts")
            .sub_type(SubType::Shared)
            .initial_position(InitialPosition::Earliest)
            .negative_ack_delay(Duration::from_millis(100))
            .subscribe()
    };
    let mut consumer = subscribe().await.unwrap();
    assert_eq!(consumer.topics().len(), 6, "{:?}", consumer.topics());
    const PER: usize = 15;
    for (t, p) in topics.iter().zip(&producers) {
        for i in 0..PER {
            p.send(format!("{t}|{i}")).await.unwrap();
        }
    }
    let mut got: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut nacked = None;
    while got.values().map(Vec::len).sum::<usize>() < 2 * PER {
        let m = recv(&mut consumer).await;
        let text = std::str::from_utf8(&m.payload).unwrap().to_owned();
        let (t, i) = text.split_once('|').unwrap();
        let suffix = m
            .topic
            .strip_prefix(&format!("{t}-partition-"))
            .unwrap_or_else(|| panic!("{} is not a partition of {t}", m.topic));
        assert_eq!(suffix.parse::<i32>().unwrap(), m.id.partition);
        if nacked.is_none() {
            // The first message goes back once through its own partition.
            nacked = Some(text.clone());
            consumer.negative_ack(&m.id);
            continue;
        }
        if Some(&text) == nacked.as_ref() {
            assert_eq!(m.redelivery_count, 1, "{text}");
        }
        got.entry(t.to_owned())
            .or_default()
            .push(i.parse().unwrap());
        consumer.ack(&m.id).await.unwrap();
    }
    for t in &topics {
        let mut v = got.remove(t).unwrap_or_default();
        v.sort_unstable();
        assert_eq!(v, (0..PER).collect::<Vec<_>>(), "{t}");
    }
    consumer.close().await.unwrap();
    // Every ack reached its partition: nothing comes back.
    let mut again = subscribe().await.unwrap();
    assert_quiet(&mut again, Duration::from_millis(1500)).await;
    again.close().await.unwrap();
    for p in producers {
        p.close().await.unwrap();
    }
    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pattern_consumer_drops_a_deleted_topic_and_keeps_consuming_the_rest() {
    // Without auto-creation a reconnecting consumer cannot re-create the
    // deleted topic.
    let broker = BrokerNode::start_standalone(&["--allow-auto-topic-creation=false"]).await;
    let c = client(&broker.service_url());
    let base = topic("del");
    let (a, b) = (format!("{base}-a"), format!("{base}-b"));
    for t in [&a, &b] {
        let path = format!("/admin/v2/{}", t.replace("://", "/"));
        broker.admin_ok(reqwest::Method::PUT, &path, None).await;
    }
    let mut consumer = c
        .consumer_pattern(format!("{base}-.*"), "del-sub")
        .initial_position(InitialPosition::Earliest)
        .pattern_auto_discovery_period(Duration::from_millis(300))
        .subscribe()
        .await
        .unwrap();
    let mut t = consumer.topics();
    t.sort();
    assert_eq!(t, vec![a.clone(), b.clone()]);
    let path = format!("/admin/v2/{}?force=true", b.replace("://", "/"));
    broker.admin_ok(reqwest::Method::DELETE, &path, None).await;
    // Receiving drives the rediscovery; bounded wait for `b` to go.
    let deadline = Instant::now() + Duration::from_secs(20);
    while consumer.topics() != vec![a.clone()] {
        assert!(
            Instant::now() < deadline,
            "still subscribed to {:?}",
            consumer.topics()
        );
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(200), consumer.receive()).await {
            panic!("unexpected message or error: {r:?}");
        }
    }
    produce(&c, &a, ["a1".to_string()]).await;
    let m = recv(&mut consumer).await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), (a.as_str(), &b"a1"[..]));
    consumer.ack(&m.id).await.unwrap();
    consumer.close().await.unwrap();
    c.close().await;
}
