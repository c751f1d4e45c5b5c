//! Protocol robustness against a standalone broker (invariant 9): random
//! bytes, truncated frames, a huge declared size, commands before CONNECT,
//! an unknown command type, a command without its sub-message — each closes
//! only its own connection, while an established connection keeps working
//! and new ones are accepted. Also: the handshake answers what the C++
//! client requires, unsupported known commands get an ERROR without a
//! close, and SEND receipts echo sequence ids in order.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use cms_client::proto::commands;
use cms_client::proto::frame::{ChecksumState, Frame, PayloadFrame, PulsarCodec, entry_from_parts};
use cms_client::proto::pulsar::{BaseCommand, MessageMetadata, base_command::Type};
use cms_tests::cluster::BrokerNode;
use futures::{SinkExt, StreamExt};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

/// Bound on each expected answer or close, in milliseconds.
const ANSWER_TIMEOUT_MS: u64 = 5_000;

struct RawClient {
    framed: Framed<TcpStream, PulsarCodec>,
}

impl RawClient {
    async fn open(addr: SocketAddr) -> RawClient {
        let stream = TcpStream::connect(addr).await.expect("connect");
        RawClient {
            framed: Framed::new(stream, PulsarCodec::default()),
        }
    }

    async fn connected(addr: SocketAddr) -> RawClient {
        let mut c = Self::open(addr).await;
        c.send(commands::connect("raw-test", 20)).await;
        let got = c.recv().await.expect("CONNECTED");
        assert_eq!(got.r#type, Type::Connected as i32, "{got:?}");
        c
    }

    async fn send(&mut self, cmd: BaseCommand) {
        self.framed.send(Frame::Command(cmd)).await.expect("send");
    }

    /// The next command, or None if the broker closed the connection.
    async fn recv(&mut self) -> Option<BaseCommand> {
        match tokio::time::timeout(Duration::from_millis(ANSWER_TIMEOUT_MS), self.framed.next())
            .await
        {
            Ok(Some(Ok(f))) => Some(f.command().clone()),
            Ok(Some(Err(_))) | Ok(None) => None,
            Err(_) => panic!("no answer and no close within {ANSWER_TIMEOUT_MS} ms"),
        }
    }

    /// Asserts the broker closes the connection (answers are skipped).
    async fn expect_closed(&mut self, what: &str) {
        for _ in 0..4 {
            if self.recv().await.is_none() {
                return;
            }
        }
        panic!("{what}: the broker kept the connection open");
    }
}

/// Writes raw bytes on a fresh socket and asserts the broker closes it.
async fn raw_bytes_close(addr: SocketAddr, bytes: &[u8], half_close: bool, what: &str) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    if half_close {
        s.shutdown().await.expect("shutdown");
    }
    let mut buf = vec![0u8; 64 * 1024];
    let closed = tokio::time::timeout(Duration::from_millis(ANSWER_TIMEOUT_MS), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "{what}: connection not closed within {ANSWER_TIMEOUT_MS} ms"
    );
}

fn frame_bytes(cmd: &BaseCommand) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    cms_client::proto::frame::encode_command(cmd, &mut b);
    b.to_vec()
}

async fn assert_alive(c: &mut RawClient) {
    c.send(commands::ping()).await;
    let got = c.recv().await.expect("PONG on the healthy connection");
    assert_eq!(got.r#type, Type::Pong as i32, "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_closes_only_its_own_connection() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let addr = broker.pulsar();

    // The handshake: server_version present, protocol negotiated down, max size.
    let mut good = RawClient::open(addr).await;
    good.send(commands::connect("raw-test", 99)).await;
    let c = good.recv().await.expect("CONNECTED");
    let connected = c.connected.expect("connected sub-message");
    assert!(
        connected.server_version.starts_with("CMS-"),
        "{connected:?}"
    );
    assert_eq!(connected.protocol_version, Some(20));
    assert_eq!(connected.max_message_size, Some(5 * 1024 * 1024));

    // Lookup and partitioned metadata (G3, G10).
    good.send(commands::lookup("robust-topic", 1, false)).await;
    let l = good.recv().await.expect("LOOKUP_RESPONSE");
    let l = l.lookup_topic_response.expect("lookup response");
    assert_eq!(l.request_id, 1);
    assert_eq!(
        l.broker_service_url.as_deref(),
        Some(broker.service_url().as_str())
    );
    assert_eq!(l.response, Some(1), "Connect");
    assert_eq!(l.authoritative, Some(true));
    good.send(commands::partitioned_metadata(
        "persistent://public/default/x",
        2,
    ))
    .await;
    let p = good.recv().await.expect("PARTITIONED_METADATA_RESPONSE");
    let p = p.partition_metadata_response.expect("response");
    assert_eq!(
        (p.request_id, p.partitions, p.response),
        (2, Some(0), Some(0))
    );
    // A bad name: Failed with InvalidTopicName, the connection stays.
    good.send(commands::lookup("persistent://a/b", 3, false))
        .await;
    let l = good
        .recv()
        .await
        .expect("LOOKUP_RESPONSE")
        .lookup_topic_response
        .expect("r");
    assert_eq!(l.response, Some(2), "Failed");
    assert_eq!(l.error, Some(17), "InvalidTopicName");
    // A missing namespace.
    good.send(commands::lookup("persistent://nope/nope/x", 4, false))
        .await;
    let l = good
        .recv()
        .await
        .expect("LOOKUP_RESPONSE")
        .lookup_topic_response
        .expect("r");
    assert_eq!(l.response, Some(2), "Failed");
    // A known command we do not serve: ERROR naming it, connection kept.
    let mut get_schema = commands::base(Type::GetSchema);
    get_schema.get_schema = Some(cms_client::proto::pulsar::CommandGetSchema {
        request_id: 5,
        topic: "persistent://public/default/x".into(),
        schema_version: None,
    });
    good.send(get_schema).await;
    let e = good.recv().await.expect("ERROR").error.expect("error");
    assert_eq!(e.request_id, 5);
    assert!(e.message.contains("GET_SCHEMA"), "{e:?}");
    // CLOSE_PRODUCER / CLOSE_CONSUMER of unknown ids: SUCCESS (G8).
    good.send(commands::close_producer(77, 6)).await;
    assert_eq!(
        good.recv()
            .await
            .expect("SUCCESS")
            .success
            .expect("s")
            .request_id,
        6
    );
    good.send(commands::close_consumer(78, 7)).await;
    assert_eq!(
        good.recv()
            .await
            .expect("SUCCESS")
            .success
            .expect("s")
            .request_id,
        7
    );
    assert_alive(&mut good).await;

    // Random bytes (seeded), several shapes.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for i in 0..5 {
        let mut junk = vec![0u8; 2048];
        rng.fill(&mut junk[..]);
        if i % 2 == 0 {
            // A plausible small size so the body is parsed as garbage.
            junk[..4].copy_from_slice(&1000u32.to_be_bytes());
        }
        raw_bytes_close(addr, &junk, false, &format!("random bytes #{i}")).await;
    }
    // A huge declared size: refused before any allocation, closed at once.
    raw_bytes_close(
        addr,
        &0xFFFF_FFF0u32.to_be_bytes(),
        false,
        "huge declared size",
    )
    .await;
    // A frame size larger than the limit by one byte.
    let over = u32::try_from(5 * 1024 * 1024 + 10 * 1024 - 4 + 1).expect("fits");
    raw_bytes_close(
        addr,
        &over.to_be_bytes(),
        false,
        "declared size over the limit",
    )
    .await;
    // A truncated frame followed by end of stream.
    let mut trunc = frame_bytes(&commands::connect("x", 20));
    trunc.truncate(trunc.len() - 3);
    raw_bytes_close(addr, &trunc, true, "truncated frame").await;
    // commandSize larger than totalSize.
    let mut bad = 8u32.to_be_bytes().to_vec();
    bad.extend_from_slice(&100u32.to_be_bytes());
    bad.extend_from_slice(&[0, 0, 0, 0]);
    raw_bytes_close(addr, &bad, false, "commandSize > totalSize").await;

    // Commands before CONNECT.
    for cmd in [
        commands::ping(),
        commands::lookup("t", 1, false),
        commands::producer("t", 1, 1, None),
    ] {
        let mut c = RawClient::open(addr).await;
        c.send(cmd).await;
        c.expect_closed("command before CONNECT").await;
    }

    // After CONNECT: an unknown command type, a second CONNECT, a command
    // without its sub-message.
    let mut c = RawClient::connected(addr).await;
    c.send(BaseCommand {
        r#type: 999,
        ..Default::default()
    })
    .await;
    c.expect_closed("unknown command type").await;
    let mut c = RawClient::connected(addr).await;
    c.send(commands::connect("again", 20)).await;
    c.expect_closed("second CONNECT").await;
    let mut c = RawClient::connected(addr).await;
    c.send(commands::base(Type::Producer)).await;
    c.expect_closed("PRODUCER without its sub-message").await;

    // The established connection and new connections still work.
    assert_alive(&mut good).await;
    let mut fresh = RawClient::connected(addr).await;
    assert_alive(&mut fresh).await;

    // Publishing on the healthy connection: receipts echo sequence ids in
    // order, a corrupted checksum gets SEND_ERROR ChecksumError in its place.
    good.send(commands::producer("robust-topic", 1, 10, None))
        .await;
    let ps = good.recv().await.expect("PRODUCER_SUCCESS");
    let ps = ps.producer_success.expect("producer success");
    assert_eq!(ps.request_id, 10);
    assert!(!ps.producer_name.is_empty());
    let md = MessageMetadata {
        producer_name: ps.producer_name.clone(),
        sequence_id: 0,
        publish_time: 1,
        ..Default::default()
    };
    for seq in 0..5u64 {
        let mut entry = entry_from_parts(&md, format!("m{seq}").as_bytes()).to_vec();
        let checksum = if seq == 3 {
            entry[3] ^= 0xff; // corrupt the CRC
            ChecksumState::Mismatch
        } else {
            ChecksumState::Valid
        };
        good.framed
            .send(Frame::Payload(PayloadFrame {
                command: commands::send(1, seq, 1),
                broker_entry_metadata: None,
                checksum,
                entry: Bytes::from(entry),
            }))
            .await
            .expect("send");
    }
    let mut last_entry = None;
    for seq in 0..5u64 {
        let got = good.recv().await.expect("receipt");
        if seq == 3 {
            let e = got
                .send_error
                .expect("SEND_ERROR for the corrupted message");
            assert_eq!((e.sequence_id, e.error), (3, 9), "ChecksumError");
            continue;
        }
        let r = got
            .send_receipt
            .clone()
            .unwrap_or_else(|| panic!("SEND_RECEIPT, got {got:?}"));
        assert_eq!(r.sequence_id, seq);
        let id = r.message_id.expect("message id");
        if let Some(prev) = last_entry {
            assert!(id.entry_id > prev, "receipts in entry order");
        }
        last_entry = Some(id.entry_id);
    }

    // Bad input was counted.
    let (status, metrics) = cms_tests::harness::http::get(
        &cms_tests::harness::http::client(),
        broker.http(),
        "/metrics",
    )
    .await
    .expect("metrics");
    assert_eq!(status, 200);
    let bad_inputs: f64 = metrics
        .lines()
        .find(|l| l.starts_with("cms_broker_connections_bad_input_total "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("bad input counter");
    assert!(
        bad_inputs >= 14.0,
        "bad input connections counted: {bad_inputs}"
    );
}
