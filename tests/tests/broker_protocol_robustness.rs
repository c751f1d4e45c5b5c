//! Protocol robustness against a standalone broker (invariant 9): random
//! bytes, truncated frames, a huge declared size, commands before CONNECT,
//! an unknown command type, a command without its sub-message — each closes
//! only its own connection, while an established connection keeps working
//! and new ones are accepted. Also: the handshake answers what the C++
//! client requires, unsupported known commands get an ERROR without a
//! close, and SEND receipts echo sequence ids in order. And memory stays
//! bounded under a storm of oversized, cut-short and garbage frames.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use cms_client::proto::commands;
use cms_client::proto::frame::{ChecksumState, Frame, PayloadFrame, entry_from_parts};
use cms_client::proto::pulsar::{BaseCommand, MessageMetadata, base_command::Type};
use cms_tests::cluster::{BrokerNode, RAW_ANSWER_TIMEOUT_MS, RawPulsarClient};
use futures::SinkExt;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ANSWER_TIMEOUT_MS: u64 = RAW_ANSWER_TIMEOUT_MS;
type RawClient = RawPulsarClient;

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
    // A Pulsar command type we do not serve (50 = NEW_TXN, transactions):
    // ERROR naming it, connection kept.
    let mut txn = commands::base(Type::Ping);
    txn.r#type = 50;
    good.send(txn).await;
    let e = good.recv().await.expect("ERROR").error.expect("error");
    assert!(e.message.contains("command type 50"), "{e:?}");
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
                command: Box::new(commands::send(1, seq, 1)),
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

/// Resident and peak resident memory of process `pid`, in bytes
/// (`VmRSS`, `VmHWM` of `/proc/<pid>/status`).
fn memory_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} missing in /proc/{pid}/status"))
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Subscribes (from the end), publishes one message and receives it, on one
/// fresh connection.
async fn produce_and_consume(addr: SocketAddr, topic: &str, body: &[u8]) {
    use cms_client::proto::pulsar::command_subscribe::{InitialPosition, SubType};
    use futures::StreamExt;
    let mut c = RawClient::connected(addr).await;
    c.send(commands::subscribe(
        topic,
        "mem-sub",
        SubType::Exclusive,
        1,
        1,
        InitialPosition::Latest,
    ))
    .await;
    let ok = c.recv().await.expect("SUBSCRIBE answer");
    assert_eq!(ok.r#type, Type::Success as i32, "{ok:?}");
    c.send(commands::producer(topic, 1, 2, None)).await;
    let ps = c.recv().await.expect("PRODUCER answer");
    let ps = ps
        .producer_success
        .clone()
        .unwrap_or_else(|| panic!("PRODUCER_SUCCESS, got {ps:?}"));
    let md = MessageMetadata {
        producer_name: ps.producer_name,
        sequence_id: 0,
        publish_time: 1,
        ..Default::default()
    };
    c.framed
        .send(Frame::Payload(PayloadFrame {
            command: Box::new(commands::send(1, 0, 1)),
            broker_entry_metadata: None,
            checksum: ChecksumState::Valid,
            entry: entry_from_parts(&md, body),
        }))
        .await
        .expect("send");
    let r = c.recv().await.expect("receipt");
    let id = r
        .send_receipt
        .and_then(|r| r.message_id)
        .unwrap_or_else(|| panic!("SEND_RECEIPT"));
    c.send(commands::flow(1, 10)).await;
    let got = tokio::time::timeout(Duration::from_millis(ANSWER_TIMEOUT_MS), async {
        loop {
            match c.framed.next().await {
                Some(Ok(Frame::Payload(p))) => return p,
                Some(Ok(_)) => {}
                other => panic!("connection ended before the MESSAGE: {other:?}"),
            }
        }
    })
    .await
    .expect("MESSAGE within the bound");
    let m = got.command.message.as_ref().expect("MESSAGE");
    assert_eq!(m.message_id.ledger_id, id.ledger_id);
    assert_eq!(m.message_id.entry_id, id.entry_id);
    let parsed = cms_client::proto::frame::parse_entry(&got.entry).expect("entry");
    assert_eq!(parsed.payload(&got.entry), body);
}

/// Issue 7: memory stays bounded under a storm of bad frames. Bounded
/// rounds over many concurrent connections of (a) frames declaring a size
/// over the limit followed by megabytes of body, (b) legal-size frames
/// declaring 5 MiB but cut short and held open, (c) random garbage. The
/// broker's peak resident memory (`VmHWM`, reset after warm-up) may not grow
/// by 64 MiB or more: buffering what the oversized frames carry (8 MiB × 32
/// connections × a round) or filling the declared sizes of the cut frames
/// (5 MiB × 32) would. Afterwards `VmRSS` is within the bound too, and a
/// normal produce / consume works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_under_a_storm_of_bad_frames() {
    const CONNECTIONS: usize = 32;
    const ROUNDS: usize = 3;
    const OVERSIZED_BODY_BYTES: usize = 8 << 20;
    const HELD_BYTES: usize = 256 << 10;
    const GROWTH_MAX: u64 = 64 << 20;

    let broker = BrokerNode::start_standalone(&[]).await;
    let addr = broker.pulsar();
    let pid = broker.process.pid().expect("broker pid");
    // Warm up the normal path first, so its allocations are in the baseline.
    produce_and_consume(addr, "persistent://public/default/mem-warm", b"warm").await;
    // Reset the peak to the current resident size (Linux ≥ 4.0); if not
    // allowed, the peak so far is the baseline.
    let reset = std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok();
    let (rss_before, hwm_before) = memory_of(pid);
    let baseline = if reset { rss_before } else { hwm_before };

    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for round in 0..ROUNDS {
        // (a) Over the limit, then megabytes of body: closed after the size.
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..CONNECTIONS {
            tasks.spawn(async move {
                let mut s = TcpStream::connect(addr).await.expect("connect");
                let declared = 64u32 << 20;
                let chunk = vec![0xA5u8; 64 << 10];
                let mut sent = 0;
                if s.write_all(&declared.to_be_bytes()).await.is_ok() {
                    while sent < OVERSIZED_BODY_BYTES {
                        if s.write_all(&chunk).await.is_err() {
                            break;
                        }
                        sent += chunk.len();
                    }
                }
                let mut buf = vec![0u8; 4096];
                tokio::time::timeout(Duration::from_millis(ANSWER_TIMEOUT_MS), async {
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    }
                })
                .await
                .is_ok()
            });
        }
        let mut not_closed = 0;
        while let Some(r) = tasks.join_next().await {
            not_closed += usize::from(!r.expect("oversized task"));
        }
        // Memory first: a broker that buffered these frames fails here.
        let (_, hwm) = memory_of(pid);
        assert!(
            hwm.saturating_sub(baseline) < GROWTH_MAX,
            "round {round}: peak {hwm} B after {CONNECTIONS} oversized frames, baseline {baseline} B"
        );
        assert_eq!(not_closed, 0, "round {round}: oversized frames not closed");

        // (b) Legal declared size, cut short, held open while we measure.
        let mut held = Vec::with_capacity(CONNECTIONS);
        for _ in 0..CONNECTIONS {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            let declared = 5u32 << 20;
            let mut bytes = declared.to_be_bytes().to_vec();
            bytes.extend(std::iter::repeat_n(0x5Au8, HELD_BYTES));
            s.write_all(&bytes).await.expect("write the cut frame");
            held.push(s);
        }
        let (_, hwm_held) = memory_of(pid);
        assert!(
            hwm_held.saturating_sub(baseline) < GROWTH_MAX,
            "round {round}: peak {hwm_held} B with {CONNECTIONS} cut frames held, baseline {baseline} B"
        );
        drop(held);

        // (c) Garbage, half of it with a plausible small size.
        for i in 0..CONNECTIONS {
            let mut junk = vec![0u8; 64 << 10];
            rng.fill(&mut junk[..]);
            if i % 2 == 0 {
                junk[..4].copy_from_slice(&1000u32.to_be_bytes());
            }
            // A random size may be legal and larger than what follows: the
            // end of stream then cuts that frame short.
            let half_close = i % 2 == 1;
            raw_bytes_close(addr, &junk, half_close, &format!("garbage #{round}.{i}")).await;
        }
    }

    let (_, hwm_after) = memory_of(pid);
    assert!(
        hwm_after.saturating_sub(baseline) < GROWTH_MAX,
        "peak {hwm_after} B after the storm, baseline {baseline} B (reset: {reset})"
    );
    // Resident memory settles within the bound (the allocator may keep
    // freed memory for a moment).
    cms_tests::harness::wait::eventually("resident memory within the bound", 5_000, || {
        let rss = memory_of(pid).0;
        async move { rss.saturating_sub(baseline) < GROWTH_MAX }
    })
    .await;
    eprintln!(
        "baseline {baseline} B (reset {reset}), peak {hwm_after} B, resident {} B",
        memory_of(pid).0
    );
    // And it still serves.
    produce_and_consume(
        addr,
        "persistent://public/default/mem-after",
        b"after the storm",
    )
    .await;
}

/// A `message_bytes_max` above what one ledger entry holds: CONNECTED
/// advertises the storage bound instead (a client keeps its payloads within
/// it), and a message that reaches the managed ledger over the entry bound
/// anyway gets SEND_ERROR NotAllowed naming the bound, alone: the producer,
/// the connection and the topic keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_above_the_storage_bound_is_refused_alone() {
    let broker = BrokerNode::start_standalone(&["--message-bytes-max=7000000"]).await;
    let addr = broker.pulsar();
    let entry_max = cms_bookie::client::writer::WriterConfig::default().entry_payload_bytes_max;
    let storage_max = entry_max - 10 * 1024;

    let mut c = RawClient::open(addr).await;
    // Frames above the default client limit go out on this connection.
    *c.framed.codec_mut() = cms_client::proto::PulsarCodec::new(8 << 20);
    c.send(commands::connect("raw-test", 20)).await;
    let connected = c
        .recv()
        .await
        .expect("CONNECTED")
        .connected
        .expect("connected");
    assert_eq!(
        connected.max_message_size,
        Some(i32::try_from(storage_max).expect("fits")),
        "the storage bound, not the configured 7000000"
    );
    c.send(commands::producer(
        "persistent://public/default/big",
        1,
        1,
        None,
    ))
    .await;
    let ps = c.recv().await.expect("PRODUCER answer");
    let ps = ps
        .producer_success
        .clone()
        .unwrap_or_else(|| panic!("PRODUCER_SUCCESS, got {ps:?}"));
    let md = MessageMetadata {
        producer_name: ps.producer_name,
        sequence_id: 0,
        publish_time: 1,
        ..Default::default()
    };
    for (seq, size) in [(0u64, 1usize << 10), (1, 6 << 20), (2, 1 << 10)] {
        c.framed
            .send(Frame::Payload(PayloadFrame {
                command: Box::new(commands::send(1, seq, 1)),
                broker_entry_metadata: None,
                checksum: ChecksumState::Valid,
                entry: entry_from_parts(&md, &vec![b'x'; size]),
            }))
            .await
            .expect("send");
    }
    let first = c.recv().await.expect("receipt 0");
    assert_eq!(first.send_receipt.expect("SEND_RECEIPT 0").sequence_id, 0);
    let refused = c.recv().await.expect("answer to the 6 MiB message");
    let e = refused
        .send_error
        .clone()
        .unwrap_or_else(|| panic!("SEND_ERROR, got {refused:?}"));
    assert_eq!(e.sequence_id, 1);
    assert_eq!(
        e.error,
        cms_client::proto::pulsar::ServerError::NotAllowedError as i32
    );
    assert!(e.message.contains("entry bound"), "{e:?}");
    let last = c.recv().await.expect("receipt 2");
    assert_eq!(last.send_receipt.expect("SEND_RECEIPT 2").sequence_id, 2);
    assert_alive(&mut c).await;
    // The topic was not dropped: it still takes and delivers messages.
    produce_and_consume(addr, "persistent://public/default/big", b"still here").await;
}
