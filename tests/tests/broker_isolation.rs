//! Tenant isolation (DESIGN invariant 8; RELIABILITY P1-15, behaviour part)
//! against `cms-broker standalone` with the Rust SDK: tenant A floods a topic
//! far above its namespace publish-rate policy and replays a large backlog on
//! three subscriptions while tenant B publishes and consumes. Judged by counts:
//! every message of B arrives, nothing of B is refused, A's flood is held to
//! its rate, and A's replays read the whole backlog (they progress, they are
//! not starved either). Each application has its own client connection.
//!
//! The entry cache is made tiny so A's replays are catch-up reads that go
//! through the broker's per-tenant dispatch read queues and the bookie's
//! fair read scheduler (A may have one bookie read in flight at a time, so
//! its three replays queue behind each other). CI form: a 16 MiB backlog;
//! `CMS_TEST_LONG=1`: 256 MiB.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic is the test failing"
)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cms_client::{Client, InitialPosition, SubType};
use cms_tests::cluster::{BrokerNode, metric_value};

/// Payload bytes of one backlog message.
const BACKLOG_MSG_BYTES: usize = 1024;

fn long() -> bool {
    std::env::var("CMS_TEST_LONG").is_ok_and(|v| v == "1")
}

async fn admin(broker: &BrokerNode, method: reqwest::Method, path: &str, body: Option<&str>) {
    broker.admin_ok(method, path, body).await
}

fn backlog_payload(i: u64) -> Vec<u8> {
    let mut p = format!("a-backlog-{i:09}-").into_bytes();
    p.resize(BACKLOG_MSG_BYTES, b'.');
    p
}

/// Replays `topic` from the start on subscription `sub` until `n` messages
/// arrived (acknowledging as it goes); returns how many arrived.
async fn replay(client: Client, topic: String, sub: String, n: u64, bound: Duration) -> u64 {
    let mut c = client
        .consumer(&topic, &sub)
        .sub_type(SubType::Exclusive)
        .initial_position(InitialPosition::Earliest)
        .receiver_queue_size(1000)
        .subscribe()
        .await
        .unwrap_or_else(|e| panic!("subscribing {sub}: {e}"));
    let mut got = 0u64;
    let deadline = tokio::time::Instant::now() + bound;
    while got < n {
        let m = match tokio::time::timeout_at(deadline, c.receive()).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => panic!("replay {sub}: {e}"),
            Err(_) => break,
        };
        got += 1;
        if got.is_multiple_of(500) || got == n {
            c.ack_cumulative(&m.id).await.unwrap();
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noisy_tenant_cannot_refuse_or_lose_another_tenants_messages() {
    let (backlog_msgs, b_msgs): (u64, u64) = if long() {
        (256 * 1024, 10_000)
    } else {
        (16 * 1024, 1_000)
    };
    let broker = BrokerNode::start_standalone(&[
        // Replays miss the cache: every read goes through the fair queues.
        "--entry-cache-bytes-max=1048576",
        "--dispatch-reads-per-tenant-in-flight-max=1",
    ])
    .await;
    use reqwest::Method;
    for t in ["a", "b"] {
        admin(
            &broker,
            Method::PUT,
            &format!("/admin/v2/tenants/{t}"),
            Some("{}"),
        )
        .await;
        admin(
            &broker,
            Method::PUT,
            &format!("/admin/v2/namespaces/{t}/ns"),
            None,
        )
        .await;
    }
    // Each tenant is its own application with its own client (connection):
    // the broker throttles a publisher over its rate by not reading its
    // connection, which must not slow another tenant's connection.
    let client = Client::new(broker.service_url()).unwrap();
    let b_client = Client::new(broker.service_url()).unwrap();
    // A's replays run in another of A's applications: a throttled
    // connection is not read at all, so its consumers' FLOW and ACK
    // commands would wait with its sends (as in Pulsar).
    let replay_client = Client::new(broker.service_url()).unwrap();

    // A's backlog, written before A's rate policy is set.
    let backlog = "persistent://a/ns/backlog".to_string();
    {
        let p = client
            .producer(&backlog)
            .batching(true)
            .batching_max_messages(100)
            .create()
            .await
            .unwrap();
        let mut receipts = Vec::new();
        for i in 0..backlog_msgs {
            receipts.push(p.send_async(backlog_payload(i)).await.unwrap());
        }
        for r in receipts {
            r.await.unwrap();
        }
        p.close().await.unwrap();
    }
    // A's namespace: 100 msg/s, 100 KiB/s. A floods far above it below.
    admin(
        &broker,
        Method::POST,
        "/admin/v2/namespaces/a/ns/publishRate",
        Some(r#"{"publishThrottlingRateInMsg":100,"publishThrottlingRateInByte":102400}"#),
    )
    .await;

    // A floods (as fast as receipts allow; counted, never judged by time).
    let flood_acked = Arc::new(AtomicU64::new(0));
    let flood_started = std::time::Instant::now();
    let flood = {
        let (client, acked) = (client.clone(), flood_acked.clone());
        tokio::spawn(async move {
            let p = client
                .producer("persistent://a/ns/flood")
                .batching(false)
                .create()
                .await
                .unwrap();
            let mut pending = std::collections::VecDeque::new();
            for i in 0u64.. {
                pending.push_back(
                    p.send_async(vec![b'f'; 1024 + (i % 7) as usize])
                        .await
                        .unwrap(),
                );
                if pending.len() >= 500 && pending.pop_front().unwrap().await.is_ok() {
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    // A replays its backlog on three subscriptions.
    let replay_bound = Duration::from_secs(if long() { 900 } else { 60 });
    let replays: Vec<_> = ["r1", "r2", "r3"]
        .into_iter()
        .map(|s| {
            tokio::spawn(replay(
                replay_client.clone(),
                backlog.clone(),
                s.to_string(),
                backlog_msgs,
                replay_bound,
            ))
        })
        .collect();

    // B publishes and consumes meanwhile.
    let b_topic = "persistent://b/ns/orders";
    let mut b_consumer = b_client
        .consumer(b_topic, "b-sub")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .expect("tenant B's subscription is refused");
    let b_producer = b_client
        .producer(b_topic)
        .create()
        .await
        .expect("tenant B's producer is refused");
    let receiver = tokio::spawn(async move {
        let mut seen = BTreeSet::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while (seen.len() as u64) < b_msgs {
            match tokio::time::timeout_at(deadline, b_consumer.receive()).await {
                Ok(Ok(m)) => {
                    b_consumer.ack(&m.id).await.unwrap();
                    seen.insert(String::from_utf8(m.payload.to_vec()).unwrap());
                }
                Ok(Err(e)) => panic!("tenant B's consumer failed: {e}"),
                Err(_) => break,
            }
        }
        seen
    });
    let mut receipts = Vec::new();
    let mut pace = tokio::time::interval(Duration::from_millis(5));
    for i in 0..b_msgs {
        pace.tick().await;
        receipts.push(b_producer.send_async(format!("b-{i:06}")).await.unwrap());
    }
    let mut refused = Vec::new();
    for (i, r) in receipts.into_iter().enumerate() {
        if let Err(e) = r.await {
            refused.push(format!("b-{i:06}: {e}"));
        }
    }
    assert!(refused.is_empty(), "tenant B's sends refused: {refused:?}");
    let seen = receiver.await.unwrap();
    let want: BTreeSet<String> = (0..b_msgs).map(|i| format!("b-{i:06}")).collect();
    let missing: Vec<_> = want.difference(&seen).take(10).collect();
    assert!(
        missing.is_empty(),
        "tenant B lost {} messages, e.g. {missing:?}",
        want.len() - seen.len().min(want.len())
    );

    // A's replays progressed to the end; A's flood was served too.
    for (r, name) in replays.into_iter().zip(["r1", "r2", "r3"]) {
        let got = r.await.unwrap();
        assert_eq!(got, backlog_msgs, "tenant A's replay {name} stalled");
    }
    flood.abort();
    let _ = flood.await;
    // A was throttled to its 100 msg/s (plus the burst the bucket allows and
    // the publishes already read off the socket when a pause starts).
    let flood_secs = flood_started.elapsed().as_secs_f64();
    let flood_bound = (100.0 * flood_secs) as u64 + 2_000;
    let acked = flood_acked.load(Ordering::Relaxed);
    assert!(
        acked <= flood_bound,
        "tenant A's flood was not throttled: {acked} acked in {flood_secs:.1} s (bound {flood_bound})"
    );
    let http = broker.http();
    let admitted = metric_value(http, "cms_broker_dispatch_read_wait_seconds_count").await;
    let waits = metric_value(http, "cms_broker_dispatch_read_waits_total").await;
    eprintln!(
        "A flood acked {}, broker dispatch reads admitted {admitted:?}, waited {waits:?}",
        flood_acked.load(Ordering::Relaxed)
    );
    assert!(
        admitted.is_some_and(|n| n > 0.0),
        "A's replays went through the broker's dispatch read queues ({admitted:?})"
    );
    client.close().await;
    b_client.close().await;
    replay_client.close().await;
}
