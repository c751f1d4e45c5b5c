//! Bounds and flow control of the broker's connection layer, against a
//! standalone broker with small limits: publishes beyond the per-connection
//! bound pause reading but every receipt arrives, in order; connections per
//! IP are bounded; the broker pings an idle connection and closes one that
//! stays silent (G9); WaitForExclusive producers get `producer_ready=false`
//! and then a second PRODUCER_SUCCESS when the exclusive one leaves (G12);
//! the topic epoch is stored, so an unloaded topic still fences producers of
//! older epochs.

use bytes::Bytes;
use cms_client::proto::commands;
use cms_client::proto::frame::{ChecksumState, Frame, PayloadFrame, entry_from_parts};
use cms_client::proto::pulsar::{MessageMetadata, ProducerAccessMode, base_command::Type};
use cms_tests::cluster::{BrokerNode, RawPulsarClient};
use futures::SinkExt;

fn entry(seq: u64) -> Bytes {
    let md = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: seq,
        publish_time: 1,
        ..Default::default()
    };
    entry_from_parts(&md, format!("payload-{seq}").as_bytes())
}

async fn create_producer(c: &mut RawPulsarClient, topic: &str, producer_id: u64, request_id: u64) {
    c.send(commands::producer(topic, producer_id, request_id, None))
        .await;
    let got = c.recv().await.expect("PRODUCER_SUCCESS");
    let ps = got
        .producer_success
        .unwrap_or_else(|| panic!("PRODUCER_SUCCESS expected, got {:?}", got.error));
    assert_eq!(ps.request_id, request_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_publishes_pause_reads_without_dropping_receipts() {
    let broker = BrokerNode::start_standalone(&["--pending-publishes-per-connection-max=4"]).await;
    let mut c = RawPulsarClient::connected(broker.pulsar()).await;
    create_producer(&mut c, "bounded-publishes", 1, 1).await;
    // 300 SENDs written back to back: the broker reads at most 4 ahead of
    // its receipts, so this also exercises the paused reads.
    const N: u64 = 300;
    let writer = async {
        for seq in 0..N {
            c.framed
                .feed(Frame::Payload(PayloadFrame {
                    command: Box::new(commands::send(1, seq, 1)),
                    broker_entry_metadata: None,
                    checksum: ChecksumState::Valid,
                    entry: entry(seq),
                }))
                .await
                .expect("send");
        }
        c.framed.flush().await.expect("flush");
    };
    writer.await;
    let mut last = None;
    for seq in 0..N {
        let got = c.recv().await.expect("receipt");
        let r = got
            .send_receipt
            .clone()
            .unwrap_or_else(|| panic!("SEND_RECEIPT #{seq}, got {got:?}"));
        assert_eq!(r.sequence_id, seq, "receipts in order, none dropped");
        let id = r.message_id.expect("id");
        if let Some((l, e)) = last {
            assert!((id.ledger_id, id.entry_id) > (l, e));
        }
        last = Some((id.ledger_id, id.entry_id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_ip_are_bounded() {
    let broker = BrokerNode::start_standalone(&["--connections-per-ip-max=2"]).await;
    let addr = broker.pulsar();
    let a = RawPulsarClient::connected(addr).await;
    let _b = RawPulsarClient::connected(addr).await;
    let mut third = RawPulsarClient::open(addr).await;
    third.send(commands::connect("third", 20)).await;
    third.expect_closed("third connection from one IP").await;
    drop(a);
    // The slot comes back once the broker notices the close.
    let ok = cms_tests::harness::wait::within(5_000, || async {
        let mut c = RawPulsarClient::open(addr).await;
        c.send(commands::connect("again", 20)).await;
        matches!(c.recv_within(1_000).await, Some(Some(cmd)) if cmd.r#type == Type::Connected as i32)
    })
    .await;
    assert!(ok.is_some(), "a connection slot was not released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_pinged_then_closed() {
    let broker = BrokerNode::start_standalone(&["--keep-alive-interval-s=1"]).await;
    let addr = broker.pulsar();
    // Silent client: a PING within ~1-2 s, then the close after ~2-3 s.
    let mut silent = RawPulsarClient::connected(addr).await;
    let got = silent.recv().await.expect("PING");
    assert_eq!(got.r#type, Type::Ping as i32, "{got:?}");
    silent.expect_closed("silent connection").await;
    // A client that answers pings stays connected across several intervals.
    let mut polite = RawPulsarClient::connected(addr).await;
    let mut pings = 0;
    while pings < 3 {
        let got = polite.recv().await.expect("still connected");
        if got.r#type == Type::Ping as i32 {
            pings += 1;
            polite.send(commands::pong()).await;
        }
    }
    polite.send(commands::ping()).await;
    let got = polite.recv().await.expect("PONG");
    assert_eq!(got.r#type, Type::Pong as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_exclusive_producer_is_granted_when_the_holder_leaves() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let addr = broker.pulsar();
    let mut holder = RawPulsarClient::connected(addr).await;
    let mut cmd = commands::producer("excl-wait", 1, 1, None);
    if let Some(p) = cmd.producer.as_mut() {
        p.producer_access_mode = Some(ProducerAccessMode::Exclusive as i32);
    }
    holder.send(cmd).await;
    let first = holder
        .recv()
        .await
        .expect("success")
        .producer_success
        .expect("ps");
    assert_eq!(first.topic_epoch, Some(1));

    let mut waiter = RawPulsarClient::connected(addr).await;
    let mut cmd = commands::producer("excl-wait", 7, 9, None);
    if let Some(p) = cmd.producer.as_mut() {
        p.producer_access_mode = Some(ProducerAccessMode::WaitForExclusive as i32);
    }
    waiter.send(cmd).await;
    let pending = waiter
        .recv()
        .await
        .expect("first")
        .producer_success
        .expect("ps");
    assert_eq!(
        (pending.request_id, pending.producer_ready),
        (9, Some(false))
    );
    assert_eq!(waiter.recv_within(500).await, None, "nothing until granted");

    holder.send(commands::close_producer(1, 2)).await;
    assert!(holder.recv().await.expect("SUCCESS").success.is_some());
    let granted = waiter
        .recv()
        .await
        .expect("second")
        .producer_success
        .expect("ps");
    assert_eq!(granted.request_id, 9);
    assert_eq!(granted.producer_ready, Some(true));
    assert_eq!(granted.topic_epoch, Some(2));

    // The granted producer publishes.
    waiter
        .framed
        .send(Frame::Payload(PayloadFrame {
            command: Box::new(commands::send(7, 0, 1)),
            broker_entry_metadata: None,
            checksum: ChecksumState::Valid,
            entry: entry(0),
        }))
        .await
        .expect("send");
    let r = waiter
        .recv()
        .await
        .expect("receipt")
        .send_receipt
        .expect("receipt");
    assert_eq!((r.producer_id, r.sequence_id), (7, 0));
}

/// An exclusive producer on `topic` (presenting `epoch`, if any); the answer.
async fn exclusive_producer(
    c: &mut RawPulsarClient,
    topic: &str,
    producer_id: u64,
    request_id: u64,
    epoch: Option<u64>,
) -> cms_client::proto::pulsar::BaseCommand {
    let mut cmd = commands::producer(topic, producer_id, request_id, None);
    if let Some(p) = cmd.producer.as_mut() {
        p.producer_access_mode = Some(ProducerAccessMode::Exclusive as i32);
        p.topic_epoch = epoch;
    }
    c.send(cmd).await;
    c.recv().await.expect("an answer to PRODUCER")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_epoch_survives_unloads_and_fences_older_exclusive_producers() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let topic = "persistent://public/default/excl-epoch";
    let unload = "/admin/v2/persistent/public/default/excl-epoch/unload";
    let mut c = RawPulsarClient::connected(broker.pulsar()).await;

    let first = exclusive_producer(&mut c, topic, 1, 1, None).await;
    assert_eq!(first.producer_success.expect("ps").topic_epoch, Some(1));
    c.send(commands::close_producer(1, 2)).await;
    assert!(c.recv().await.expect("SUCCESS").success.is_some());
    broker.admin_ok(reqwest::Method::PUT, unload, None).await;

    // Reloaded from the managed ledger's properties: the next grant is 2,
    // not 1 again.
    let second = exclusive_producer(&mut c, topic, 2, 3, None).await;
    assert_eq!(second.producer_success.expect("ps").topic_epoch, Some(2));
    c.send(commands::close_producer(2, 4)).await;
    assert!(c.recv().await.expect("SUCCESS").success.is_some());
    broker.admin_ok(reqwest::Method::PUT, unload, None).await;

    // A producer of epoch 1 comes back after the topic moved: fenced.
    let stale = exclusive_producer(&mut c, topic, 3, 5, Some(1)).await;
    let err = stale.error.expect("ERROR for a stale epoch");
    assert_eq!(
        err.error,
        cms_client::proto::pulsar::ServerError::ProducerFenced as i32,
        "{err:?}"
    );
    // The current one reconnects with its epoch and is granted the next.
    let current = exclusive_producer(&mut c, topic, 4, 6, Some(2)).await;
    assert_eq!(current.producer_success.expect("ps").topic_epoch, Some(3));
}
