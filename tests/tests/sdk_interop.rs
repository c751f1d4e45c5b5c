//! The Rust SDK (`cms-client`) against a standalone `cms-broker`, and against
//! the official Python client (`pulsar-client` 3.13) on the same topics:
//! Rust produces and Python consumes, Python produces and Rust consumes,
//! with batching and each compression type (NONE, LZ4, ZLIB, ZSTD, SNAPPY);
//! an SDK producer and consumer through a `kill -9` and restart of the
//! broker with no acknowledged message lost; grouped acks go out when a
//! group is full, before a re-subscribe asks for messages, on close and
//! after the group time; `cms-perf` produce and end-to-end runs print their
//! JSON keys; batch receive ends at its message, byte or time limit.

use std::collections::BTreeSet;
use std::time::Duration;

use cms_client::{
    BatchReceivePolicy, Client, CompressionType, InitialPosition, ProducerMessage, SubType,
};
use cms_tests::cluster::{BrokerNode, run_python};
use cms_tests::harness::perf;

/// Bound on one Python script run, in milliseconds.
const PY_TIMEOUT_MS: u64 = 60_000;
/// Messages per interop case.
const COUNT: usize = 60;

const COMPRESSIONS: [(&str, CompressionType); 5] = [
    ("NONE", CompressionType::None),
    ("LZ4", CompressionType::Lz4),
    ("ZLIB", CompressionType::Zlib),
    ("ZSTD", CompressionType::Zstd),
    ("SNAPPY", CompressionType::Snappy),
];

fn topic(case: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
        % 1_000_000_000_000;
    format!(
        "persistent://public/default/sdk-{case}-{}-{nanos}",
        std::process::id()
    )
}

fn payload(i: usize) -> String {
    format!("rs-{i}-{}", "xyz".repeat(i * 37 % 400))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_produces_python_consumes_with_batching_and_each_compression() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    let client = client(&url);
    for (name, kind) in COMPRESSIONS {
        for batching in [false, true] {
            let t = topic(&format!("r2p-{name}-{batching}"));
            let producer = client
                .producer(&t)
                .batching(batching)
                .batching_max_messages(16)
                .batching_max_delay(Duration::from_millis(20))
                .compression(kind)
                .create()
                .await
                .unwrap();
            let mut receipts = Vec::new();
            for i in 0..COUNT {
                let m = ProducerMessage::new(payload(i))
                    .key(format!("k{i}"))
                    .property("i", i.to_string());
                receipts.push(producer.send_async(m).await.unwrap());
            }
            producer.flush().await.unwrap();
            let mut ids = Vec::new();
            for r in receipts {
                ids.push(r.await.unwrap());
            }
            if batching {
                assert!(
                    ids.iter().any(|id| id.batch_index > 0),
                    "{name}: batching happened"
                );
            }
            producer.close().await.unwrap();
            let count = COUNT.to_string();
            let r = run_python(
                "sdk/py_consume.py",
                &["--url", &url, "--topic", &t, "--count", &count],
                PY_TIMEOUT_MS,
            )
            .await;
            assert!(
                r.ok,
                "{name}/{batching}: python consume failed: {} {}",
                r.json, r.stderr
            );
            let want: Vec<String> = (0..COUNT).map(payload).collect();
            let got: Vec<String> = serde_json::from_value(r.json["payloads"].clone()).unwrap();
            assert_eq!(got, want, "{name}/{batching}: payloads in order");
            let keys: Vec<String> = serde_json::from_value(r.json["keys"].clone()).unwrap();
            let props: Vec<String> = serde_json::from_value(r.json["props"].clone()).unwrap();
            for i in 0..COUNT {
                assert_eq!(keys[i], format!("k{i}"));
                assert_eq!(props[i], i.to_string());
            }
            if batching {
                let bi: Vec<i64> = serde_json::from_value(r.json["batch_indexes"].clone()).unwrap();
                assert!(bi.iter().any(|b| *b > 0), "{name}: python saw batches");
            }
        }
    }
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_produces_rust_consumes_with_batching_and_each_compression() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    let client = client(&url);
    for (name, _) in COMPRESSIONS {
        for batching in [false, true] {
            let t = topic(&format!("p2r-{name}-{batching}"));
            let mut consumer = client
                .consumer(&t, "rs-sub")
                .initial_position(InitialPosition::Earliest)
                .receiver_queue_size(20)
                .subscribe()
                .await
                .unwrap();
            let count = COUNT.to_string();
            let mut args = vec![
                "--url",
                &url,
                "--topic",
                &t,
                "--count",
                &count,
                "--compression",
                name,
            ];
            if batching {
                args.push("--batching");
            }
            let r = run_python("sdk/py_produce.py", &args, PY_TIMEOUT_MS).await;
            assert!(
                r.ok,
                "{name}/{batching}: python produce failed: {} {}",
                r.json, r.stderr
            );
            let mut saw_batch = false;
            for i in 0..COUNT {
                let m = recv(&mut consumer).await;
                let want = format!("py-{i}-{}", "abc".repeat(i * 37 % 400));
                assert_eq!(
                    std::str::from_utf8(&m.payload).unwrap(),
                    want,
                    "{name}/{batching} #{i}"
                );
                assert_eq!(m.key.as_deref(), Some(format!("k{i}").as_str()));
                assert_eq!(m.properties.get("i"), Some(&i.to_string()));
                saw_batch |= m.id.batch_index > 0;
                consumer.ack(&m.id).await.unwrap();
            }
            assert_eq!(saw_batch, batching, "{name}: batch ids iff batching");
            consumer.close().await.unwrap();
        }
    }
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_survives_broker_kill_and_restart_without_losing_acked_messages() {
    let mut broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    let client = client(&url);
    let t = topic("restart");
    let mut consumer = client
        .consumer(&t, "restart-sub")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let producer = client
        .producer(&t)
        .name("restart-producer")
        .batching(true)
        .batching_max_delay(Duration::from_millis(2))
        .max_pending_messages(200)
        .create()
        .await
        .unwrap();
    const N: usize = 600;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let acked2 = acked.clone();
    let sender = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(3));
        let mut waits = tokio::task::JoinSet::new();
        for i in 0..N {
            tick.tick().await;
            let f = producer.send_async(format!("m-{i}")).await.unwrap();
            let acked = acked2.clone();
            waits.spawn(async move {
                if f.await.is_ok() {
                    acked.lock().unwrap().insert(format!("m-{i}"));
                }
            });
        }
        while waits.join_next().await.is_some() {}
        producer.close().await.ok();
    });
    // Kill once a good part is acknowledged.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while acked.lock().unwrap().len() < N / 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no receipts before the kill"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = acked.lock().unwrap().len();
    broker.kill_and_restart().await;
    eprintln!("killed and restarted the broker after {before} receipts");
    tokio::time::timeout(Duration::from_secs(90), sender)
        .await
        .expect("sends did not complete after the restart")
        .unwrap();
    let acked: BTreeSet<String> = acked.lock().unwrap().clone();
    assert!(
        acked.len() > N / 2,
        "most sends acknowledged after reconnect: {}",
        acked.len()
    );
    let mut received = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !acked.is_subset(&received) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "lost acknowledged messages: {:?}",
            acked.difference(&received).take(10).collect::<Vec<_>>()
        );
        let m = recv(&mut consumer).await;
        received.insert(String::from_utf8(m.payload.to_vec()).unwrap());
        consumer.ack(&m.id).await.ok();
    }
    eprintln!(
        "acked {} of {N}, received {} distinct before the last acked one arrived",
        acked.len(),
        received.len()
    );
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cms_perf_produce_and_end_to_end_print_their_json_keys() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    let dir = tempfile::tempdir().unwrap();
    for (mode, extra) in [
        ("produce", vec!["--max-pending", "1"]),
        (
            "produce",
            vec!["--rate", "2000", "--batching", "--compression", "lz4"],
        ),
        (
            "end-to-end",
            vec![
                "--rate",
                "1000",
                "--max-pending",
                "100",
                "--io-threads",
                "0",
                "--pace-spin-us",
                "0",
            ],
        ),
    ] {
        let t = topic(&format!("perf-{mode}"));
        let hist_path = dir.path().join(format!("{mode}-{}.json", extra.len()));
        let hist = hist_path.to_str().unwrap();
        let mut args = vec![
            mode,
            "--service-url",
            &url,
            "--topic",
            &t,
            "--size",
            "256",
            "--messages",
            "500",
            "--histogram-out",
            hist,
        ];
        args.extend(&extra);
        let v = perf::json(&args, Duration::from_secs(60)).await;
        let mut keys = vec![
            "msgs",
            "msg_per_s",
            "mib_per_s",
            "p50_ms",
            "p99_ms",
            "p999_ms",
            "max_ms",
            "mean_ms",
        ];
        if extra.contains(&"--rate") {
            // Open loop: how late the pacer released the sends.
            keys.extend(["pace_late_p50_ms", "pace_late_p99_ms", "pace_late_max_ms"]);
        }
        if mode == "end-to-end" {
            keys.extend([
                "e2e_p50_ms",
                "e2e_p99_ms",
                "e2e_p999_ms",
                "e2e_max_ms",
                "e2e_mean_ms",
            ]);
        }
        for k in keys {
            assert!(v[k].is_number(), "{mode}: key {k} in {v}");
        }
        assert_eq!(v["msgs"], 500);
        // The runtime's threads: 0 (one per CPU) where asked, else the
        // default of 1; the pacer's early wake-up: off where asked, else 60 µs.
        let (io_threads, spin) = if extra.contains(&"--io-threads") {
            (0, 0)
        } else {
            (1, 60)
        };
        assert_eq!(v["io_threads"], io_threads, "{mode}: {v}");
        assert_eq!(v["pace_spin_us"], spin, "{mode}: {v}");
        assert!(v["msg_per_s"].as_f64().unwrap() > 0.0);
        assert!(v["p50_ms"].as_f64().unwrap() <= v["max_ms"].as_f64().unwrap());
        assert!(v["mean_ms"].as_f64().unwrap() <= v["max_ms"].as_f64().unwrap());
        // `--histogram-out`: every sample in the buckets, the largest
        // bucket at the reported max.
        let h: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&hist_path).unwrap()).unwrap();
        assert_eq!(h["unit"], "us");
        let hists: &[(&str, &str)] = if mode == "end-to-end" {
            &[("publish", ""), ("e2e", "e2e_")]
        } else {
            &[("publish", "")]
        };
        for (name, prefix) in hists {
            let pairs = h[*name]
                .as_array()
                .unwrap_or_else(|| panic!("{name} in {h}"));
            let count: u64 = pairs.iter().map(|p| p[1].as_u64().unwrap()).sum();
            assert_eq!(count, 500, "{mode} {name}");
            let top_ms = pairs.last().unwrap()[0].as_f64().unwrap() / 1000.0;
            assert_eq!(top_ms, v[format!("{prefix}max_ms")].as_f64().unwrap());
        }
    }

    // `--duration` ends a produce run by time: at 200 msg/s for 1 s about
    // 200 of the 100,000 messages go out, `msgs` counts them, and the
    // broker took exactly that many.
    let t = topic("perf-duration");
    let args = |mode: &'static str, t: &str| -> Vec<String> {
        [
            mode,
            "--service-url",
            &url,
            "--topic",
            t,
            "--messages",
            "100000",
            "--rate",
            "200",
            "--duration",
            "1",
        ]
        .map(String::from)
        .to_vec()
    };
    let a = args("produce", &t);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let v = perf::json(&a, Duration::from_secs(60)).await;
    let msgs = v["msgs"].as_u64().unwrap();
    assert!((100..=202).contains(&msgs), "{v}");
    assert_eq!(v["duration_s"], 1.0, "{v}");
    let path = format!(
        "/admin/v2/persistent/{}/stats",
        t.trim_start_matches("persistent://")
    );
    let (status, stats) = broker.admin_call(reqwest::Method::GET, &path, None).await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["msgInCounter"].as_u64(), Some(msgs), "{stats}");
    // The consumers of end-to-end wait for --messages, so a time limit is
    // refused there, with a message that says so.
    let a = args("end-to-end", &topic("perf-duration-e2e"));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let out = perf::run(&a, Duration::from_secs(60)).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--duration"), "{stderr}");
}

/// The subscription's backlog in the broker's topic stats.
async fn backlog(broker: &BrokerNode, t: &str, sub: &str) -> i64 {
    let path = format!(
        "/admin/v2/persistent/{}/stats",
        t.trim_start_matches("persistent://")
    );
    let (status, stats) = broker.admin_call(reqwest::Method::GET, &path, None).await;
    assert_eq!(status, 200, "{path}: {stats}");
    stats["subscriptions"][sub]["msgBacklog"]
        .as_i64()
        .unwrap_or_else(|| panic!("no backlog for {sub}: {stats}"))
}

/// Polls the backlog until `done` holds (at most 20 s); returns it.
async fn backlog_until(broker: &BrokerNode, t: &str, sub: &str, done: impl Fn(i64) -> bool) -> i64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let b = backlog(broker, t, sub).await;
        if done(b) {
            return b;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "backlog still {b} after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_acks_go_out_when_a_group_is_full_on_resubscribe_on_close_and_after_the_group_time()
{
    let broker = BrokerNode::start_standalone(&[]).await;
    let client = client(&broker.service_url());
    let t = topic("ack-groups");
    // A group time far beyond the test: only size, re-subscribe and close
    // can send these acks.
    let mut consumer = client
        .consumer(&t, "grouped")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_group_time(Duration::from_secs(60))
        .ack_group_max_size(10)
        .subscribe()
        .await
        .unwrap();
    let producer = client.producer(&t).create().await.unwrap();
    for i in 0..25 {
        producer.send(format!("g-{i}")).await.unwrap();
    }
    for i in 0..25 {
        let m = recv(&mut consumer).await;
        assert_eq!(m.payload.as_ref(), format!("g-{i}").as_bytes());
        consumer.ack(&m.id).await.unwrap();
    }
    // Two full groups of 10 went out; the last 5 acks are still queued.
    let b = backlog_until(&broker, &t, "grouped", |b| b <= 5).await;
    assert_eq!(b, 5, "two groups of ten acknowledged, five queued");

    // The topic is unloaded: the consumer re-subscribes and sends its
    // queued acks before asking for messages, so none of them comes again.
    broker
        .admin_ok(
            reqwest::Method::PUT,
            &format!(
                "/admin/v2/persistent/{}/unload",
                t.trim_start_matches("persistent://")
            ),
            None,
        )
        .await;
    backlog_until(&broker, &t, "grouped", |b| b == 0).await;
    producer.send("after").await.unwrap();
    let m = recv(&mut consumer).await;
    assert_eq!(
        m.payload.as_ref(),
        b"after",
        "an acknowledged message came again"
    );
    consumer.ack(&m.id).await.unwrap();
    assert_eq!(
        backlog(&broker, &t, "grouped").await,
        1,
        "the ack is queued"
    );

    // Close sends the queued ack before it returns.
    consumer.close().await.unwrap();
    assert_eq!(backlog(&broker, &t, "grouped").await, 0);

    // The group time: 26 acks, under the default group size, reach the
    // broker with no close, re-subscribe or full group.
    let mut timed = client
        .consumer(&t, "timed")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_group_time(Duration::from_millis(300))
        .subscribe()
        .await
        .unwrap();
    for _ in 0..26 {
        let m = recv(&mut timed).await;
        timed.ack(&m.id).await.unwrap();
    }
    backlog_until(&broker, &t, "timed", |b| b == 0).await;
    timed.close().await.unwrap();
    producer.close().await.unwrap();
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_nack_ack_timeout_cumulative_ack_and_reader_seek() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let client = client(&broker.service_url());
    let t = topic("features");
    let producer = client.producer(&t).create().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(producer.send(format!("c-{i}")).await.unwrap());
    }
    let text = |m: &cms_client::Message| String::from_utf8(m.payload.to_vec()).unwrap();

    // Negative ack: the message comes back with a redelivery count.
    let mut shared = client
        .consumer(&t, "nack-sub")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .negative_ack_delay(Duration::from_millis(100))
        .subscribe()
        .await
        .unwrap();
    let first = recv(&mut shared).await;
    assert_eq!(text(&first), "c-0");
    assert_eq!(first.redelivery_count, 0);
    shared.negative_ack(&first.id);
    let mut redelivered = None;
    for _ in 0..10 {
        let m = recv(&mut shared).await;
        if text(&m) == "c-0" {
            redelivered = Some(m);
            break;
        }
        shared.ack(&m.id).await.unwrap();
    }
    let again = redelivered.expect("c-0 redelivered after its negative ack");
    assert!(
        again.redelivery_count >= 1,
        "redelivery count {}",
        again.redelivery_count
    );
    shared.ack(&again.id).await.unwrap();
    shared.close().await.unwrap();

    // Ack timeout: an unacknowledged message comes back by itself.
    let mut timed = client
        .consumer(&t, "timeout-sub")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_timeout(Duration::from_secs(1))
        .subscribe()
        .await
        .unwrap();
    let kept = recv(&mut timed).await;
    assert_eq!(text(&kept), "c-0");
    for _ in 1..10 {
        let m = recv(&mut timed).await;
        timed.ack(&m.id).await.unwrap();
    }
    let back = recv(&mut timed).await;
    assert_eq!(text(&back), "c-0", "the unacked message is redelivered");
    assert!(back.redelivery_count >= 1);
    timed.ack(&back.id).await.unwrap();
    timed.close().await.unwrap();

    // Dead-letter policy: after two redeliveries the message moves to the DLQ.
    let dlq_topic = format!("{t}-dlq");
    let mut dlq_reader = client
        .consumer(&dlq_topic, "dlq-check")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let mut dl = client
        .consumer(&t, "dl-sub")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .negative_ack_delay(Duration::from_millis(50))
        .dead_letter(2, Some(dlq_topic.clone()))
        .subscribe()
        .await
        .unwrap();
    let mut counts = Vec::new();
    for _ in 0..30 {
        let m = recv(&mut dl).await;
        if text(&m) == "c-0" {
            counts.push(m.redelivery_count);
            dl.negative_ack(&m.id);
            if counts.len() == 3 {
                break;
            }
        } else {
            dl.ack(&m.id).await.unwrap();
        }
    }
    assert_eq!(counts, vec![0, 1, 2], "handed out until the limit");
    // Receiving drives dead-lettering: the fourth delivery is not handed out.
    let again = tokio::time::timeout(Duration::from_millis(1500), dl.receive()).await;
    assert!(
        again.is_err(),
        "dead-lettered message not handed out again: {again:?}"
    );
    let dead = recv(&mut dlq_reader).await;
    assert_eq!(text(&dead), "c-0");
    assert_eq!(dead.properties.get("REAL_TOPIC"), Some(&t));
    dl.close().await.unwrap();
    dlq_reader.close().await.unwrap();

    // Cumulative ack survives a new consumer on the subscription.
    let mut excl = client
        .consumer(&t, "cum-sub")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let mut fifth = None;
    for i in 0..10 {
        let m = recv(&mut excl).await;
        assert_eq!(text(&m), format!("c-{i}"));
        if i == 4 {
            fifth = Some(m.id);
        }
    }
    excl.ack_cumulative(&fifth.unwrap()).await.unwrap();
    excl.close().await.unwrap();
    let mut excl = client.consumer(&t, "cum-sub").subscribe().await.unwrap();
    assert_eq!(
        text(&recv(&mut excl).await),
        "c-5",
        "acked up to c-4 cumulatively"
    );
    excl.close().await.unwrap();

    // Reader from the earliest message, has_message_available, seek.
    let mut reader = client
        .reader(&t)
        .start_message_id(cms_client::MessageId::EARLIEST)
        .create()
        .await
        .unwrap();
    assert!(reader.has_message_available().await.unwrap());
    for i in 0..10 {
        let m = tokio::time::timeout(Duration::from_secs(20), reader.read_next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(text(&m), format!("c-{i}"));
    }
    assert!(!reader.has_message_available().await.unwrap(), "all read");
    reader.seek(ids[3]).await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(20), reader.read_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(text(&m), "c-3", "seek moves the reader");
    reader.close().await.unwrap();

    // Reader from the latest position sees only what comes after.
    let mut latest = client.reader(&t).create().await.unwrap();
    assert!(!latest.has_message_available().await.unwrap());
    producer.send("after").await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(20), latest.read_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(text(&m), "after");
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_producer_routes_by_key_hash_and_round_robin_and_consumer_reads_all_partitions()
{
    let broker = BrokerNode::start_standalone(&[
        "--allow-auto-topic-creation-type=partitioned",
        "--default-num-partitions=3",
    ])
    .await;
    let client = client(&broker.service_url());
    let t = topic("partitioned");
    let producer = client.producer(&t).batching(true).create().await.unwrap();
    assert_eq!(producer.partitions(), 3);
    // Subscribed first: a partitioned consumer subscribes to every partition.
    let mut consumer = client
        .consumer(&t, "all-partitions")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let mut key_partition = std::collections::BTreeMap::new();
    let mut keyless = BTreeSet::new();
    let mut sent_to = std::collections::BTreeMap::new();
    let mut receipts = Vec::new();
    for i in 0..60 {
        let m = if i % 2 == 0 {
            ProducerMessage::new(format!("p-{i}")).key(format!("key-{}", i % 10))
        } else {
            ProducerMessage::new(format!("p-{i}"))
        };
        receipts.push((i, producer.send_async(m).await.unwrap()));
    }
    for (i, r) in receipts {
        let id = r.await.unwrap();
        assert!((0..3).contains(&id.partition), "partition of {id}");
        sent_to.insert(format!("p-{i}"), id.partition);
        if i % 2 == 0 {
            let p = *key_partition.entry(i % 10).or_insert(id.partition);
            assert_eq!(p, id.partition, "key-{} sticks to one partition", i % 10);
        } else {
            keyless.insert(id.partition);
        }
    }
    assert_eq!(keyless.len(), 3, "keyless messages go round robin");
    producer.close().await.unwrap();
    // The partitioned consumer gets all 60, each from the partition its
    // receipt named, and acks go back to that partition.
    let mut received = std::collections::BTreeMap::new();
    for _ in 0..60 {
        let m = recv(&mut consumer).await;
        assert!(
            m.topic.ends_with(&format!("-partition-{}", m.id.partition)),
            "{}",
            m.topic
        );
        received.insert(
            String::from_utf8(m.payload.to_vec()).unwrap(),
            m.id.partition,
        );
        consumer.ack(&m.id).await.unwrap();
    }
    assert_eq!(received, sent_to);
    consumer.close().await.unwrap();
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_receive_stops_at_max_messages_max_bytes_or_timeout() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let client = client(&broker.service_url());
    let t = topic("batch-receive");
    let mut consumer = client
        .consumer(&t, "batch-sub")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let producer = client.producer(&t).batching(true).create().await.unwrap();
    let mut receipts = Vec::new();
    for i in 0..25 {
        receipts.push(
            producer
                .send_async(format!("b-{i:02}-{}", "x".repeat(90)))
                .await
                .unwrap(),
        );
    }
    for r in receipts {
        r.await.unwrap();
    }
    let policy = |max_messages, max_bytes, timeout_ms| BatchReceivePolicy {
        max_messages,
        max_bytes,
        timeout: Duration::from_millis(timeout_ms),
    };
    let text = |m: &cms_client::Message| String::from_utf8(m.payload[..4].to_vec()).unwrap();
    let mut got = Vec::new();
    // Max messages: exactly 10 (the timeout is far away).
    let b = consumer
        .batch_receive(policy(10, usize::MAX, 20_000))
        .await
        .unwrap();
    assert_eq!(b.len(), 10);
    got.extend(b);
    // Max bytes: each payload is 95 bytes, so 300 bytes end it at 4.
    let b = consumer
        .batch_receive(policy(100, 300, 20_000))
        .await
        .unwrap();
    assert_eq!(
        b.len(),
        4,
        "payload bytes {:?}",
        b.iter().map(|m| m.payload.len()).collect::<Vec<_>>()
    );
    got.extend(b);
    // Timeout: only 11 remain, so a batch of up to 100 ends at the timeout
    // with all of them (waited on the condition, bounded by 20 s).
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    while rest.len() < 11 && started.elapsed() < Duration::from_secs(20) {
        rest.extend(
            consumer
                .batch_receive(policy(100, usize::MAX, 300))
                .await
                .unwrap(),
        );
    }
    assert_eq!(rest.len(), 11);
    got.extend(rest);
    let names: Vec<String> = got.iter().map(text).collect();
    let want: Vec<String> = (0..25).map(|i| format!("b-{i:02}")).collect();
    assert_eq!(names, want, "every message once, in order");
    for m in &got {
        consumer.ack(&m.id).await.unwrap();
    }
    // Nothing left: an empty batch after about the timeout.
    let started = std::time::Instant::now();
    let b = consumer
        .batch_receive(policy(100, usize::MAX, 200))
        .await
        .unwrap();
    assert!(b.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(200));
    producer.close().await.unwrap();
    consumer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_seek_by_publish_time_moves_to_the_first_message_at_or_after_it() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let client = client(&broker.service_url());
    let t = topic("seek-time");
    let producer = client.producer(&t).create().await.unwrap();
    let ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    for i in 0..5 {
        producer.send(format!("t-{i}")).await.unwrap();
    }
    // Publish times have millisecond resolution: wait (bounded) until the
    // clock has moved past the last one, then take the cut.
    let last = ms();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ms() <= last + 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "clock did not advance"
        );
        tokio::task::yield_now().await;
    }
    let cut = std::time::SystemTime::now();
    for i in 5..10 {
        producer.send(format!("t-{i}")).await.unwrap();
    }
    let text = |m: &cms_client::Message| String::from_utf8(m.payload.to_vec()).unwrap();
    let mut reader = client
        .reader(&t)
        .start_message_id(cms_client::MessageId::EARLIEST)
        .create()
        .await
        .unwrap();
    for i in 0..3 {
        let m = tokio::time::timeout(Duration::from_secs(20), reader.read_next())
            .await
            .expect("read within 20 s")
            .unwrap();
        assert_eq!(text(&m), format!("t-{i}"));
    }
    reader.seek_time(cut).await.unwrap();
    for i in 5..10 {
        let m = tokio::time::timeout(Duration::from_secs(20), reader.read_next())
            .await
            .expect("read within 20 s")
            .unwrap();
        assert_eq!(text(&m), format!("t-{i}"), "after seeking to the cut");
    }
    // Back before everything: the first message again.
    reader
        .seek_time(std::time::UNIX_EPOCH + Duration::from_secs(1))
        .await
        .unwrap();
    let m = tokio::time::timeout(Duration::from_secs(20), reader.read_next())
        .await
        .expect("read within 20 s")
        .unwrap();
    assert_eq!(text(&m), "t-0");
    reader.close().await.unwrap();
    producer.close().await.unwrap();
}
