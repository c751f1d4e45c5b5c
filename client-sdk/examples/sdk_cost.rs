//! The SDK's per-message CPU cost without the network (issue 13: "the SDK
//! itself must not be the bottleneck"). Runs each case `--iters` times and
//! prints one JSON line per case with nanoseconds per message (best of 5
//! rounds). Cases: encode a SEND frame for one 1 KiB message (metadata,
//! CRC32C, frame) with and without LZ4; build and encode a batch of 100
//! such messages; decode a MESSAGE frame (checksum, metadata, decompress,
//! unbatch) for the same. Under `valgrind --tool=callgrind` use
//! `--rounds 1` and divide the instruction count by the messages printed.
//!
//! `cargo run --release -p cms-client --example sdk_cost -- --iters 20000`

use std::time::Instant;

use bytes::BytesMut;
use cms_client::sdk::cost;
use cms_client::{CompressionType, ProducerMessage};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn only() -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--case")
        .and_then(|i| args.get(i + 1).cloned())
}

/// Best-of-`rounds` nanoseconds per message of `f` (which handles
/// `per_call` messages per call).
fn measure(name: &str, iters: u64, rounds: u64, per_call: u64, mut f: impl FnMut()) {
    if only().is_some_and(|c| c != name) {
        return;
    }
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        let ns = t.elapsed().as_nanos() as f64 / (iters * per_call) as f64;
        best = best.min(ns);
    }
    println!(
        "{{\"case\":\"{name}\",\"ns_per_msg\":{best:.1},\"msgs\":{}}}",
        iters * per_call * rounds
    );
}

fn main() {
    let iters = arg("--iters", 20_000);
    let rounds = arg("--rounds", 5).max(1);
    // Payload of 1 KiB, somewhat compressible (as text would be).
    let payload: Vec<u8> = (0..1024u32)
        .map(|i| b"abcdefgh"[(i % 7) as usize] ^ (i / 64) as u8)
        .collect();
    let msg = ProducerMessage::new(payload.clone()).property("source", "bench");
    let batch: Vec<ProducerMessage> = (0..100).map(|_| msg.clone()).collect();
    let refs: Vec<&ProducerMessage> = batch.iter().collect();
    let mut buf = BytesMut::with_capacity(256 * 1024);
    for (label, c) in [
        ("none", CompressionType::None),
        ("lz4", CompressionType::Lz4),
    ] {
        measure(&format!("send_single_1k_{label}"), iters, rounds, 1, || {
            buf.clear();
            cost::encode_single(&msg, 1, c, &mut buf).expect("encode");
        });
        measure(
            &format!("send_batch100_1k_{label}"),
            iters / 100 + 1,
            rounds,
            100,
            || {
                buf.clear();
                cost::encode_batch(&refs, 1, c, &mut buf).expect("encode");
            },
        );
        let mut one = BytesMut::new();
        cost::encode_single(&msg, 1, c, &mut one).expect("encode");
        let one = cost::as_message_frame(&one)
            .expect("message frame")
            .freeze();
        measure(
            &format!("receive_single_1k_{label}"),
            iters,
            rounds,
            1,
            || {
                let mut src = BytesMut::from(&one[..]);
                let m = cost::decode_message(&mut src).expect("decode");
                assert_eq!(m.len(), 1);
            },
        );
        let mut many = BytesMut::new();
        cost::encode_batch(&refs, 1, c, &mut many).expect("encode");
        let many = cost::as_message_frame(&many)
            .expect("message frame")
            .freeze();
        measure(
            &format!("receive_batch100_1k_{label}"),
            iters / 100 + 1,
            rounds,
            100,
            || {
                let mut src = BytesMut::from(&many[..]);
                let m = cost::decode_message(&mut src).expect("decode");
                assert_eq!(m.len(), 100);
            },
        );
    }
}
