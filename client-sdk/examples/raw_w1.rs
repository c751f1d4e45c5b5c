//! W1 (one message in flight, each SEND awaiting its receipt) through a bare
//! protocol client: one connection, one thread, no SDK tasks in between.
//! Run beside `cms-perf produce --max-pending 1` on the same broker, the
//! difference between the two is the SDK's own share of W1's latency
//! (issue 13). Prints one JSON line: messages, mean, p50, p99, max in ms.
//!
//! `cargo run --release -p cms-client --example raw_w1 -- --addr 127.0.0.1:6650 --messages 20000`

use std::time::{Duration, Instant};

use bytes::Bytes;
use cms_client::proto::commands;
use cms_client::proto::frame::{ChecksumState, Frame, PayloadFrame, entry_from_parts};
use cms_client::proto::pulsar::MessageMetadata;
use cms_client::proto::pulsar::base_command::Type;
use futures::{SinkExt, StreamExt};
use tokio_util::codec::Framed;

/// Bound on each answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

type Conn = Framed<tokio::net::TcpStream, cms_client::proto::PulsarCodec>;

async fn next(c: &mut Conn) -> anyhow::Result<cms_client::proto::pulsar::BaseCommand> {
    match tokio::time::timeout(ANSWER_TIMEOUT, c.next()).await {
        Ok(Some(Ok(f))) => Ok(f.command().clone()),
        Ok(Some(Err(e))) => anyhow::bail!("bad frame: {e}"),
        Ok(None) => anyhow::bail!("the broker closed the connection"),
        Err(_) => anyhow::bail!("no answer within {ANSWER_TIMEOUT:?}"),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let addr = arg("--addr").unwrap_or_else(|| "127.0.0.1:6650".into());
    let topic = arg("--topic").unwrap_or_else(|| "persistent://public/default/raw-w1".into());
    let messages: u64 = arg("--messages").map_or(Ok(20_000), |v| v.parse())?;
    let warmup: u64 = arg("--warmup").map_or(Ok(500), |v| v.parse())?;
    let size: usize = arg("--size").map_or(Ok(1024), |v| v.parse())?;

    let stream = tokio::net::TcpStream::connect(&addr).await?;
    stream.set_nodelay(true)?;
    let mut c = Framed::new(stream, cms_client::proto::PulsarCodec::default());
    c.send(Frame::from(commands::connect("raw-w1", 19))).await?;
    let got = next(&mut c).await?;
    anyhow::ensure!(got.r#type() == Type::Connected, "CONNECT: {got:?}");
    // The lookup makes the broker own the topic's bundle (one broker: it
    // answers with itself).
    c.send(Frame::from(commands::lookup(&topic, 1, false)))
        .await?;
    let got = next(&mut c).await?;
    anyhow::ensure!(
        got.lookup_topic_response
            .as_ref()
            .is_some_and(|r| r.error.is_none()),
        "LOOKUP: {got:?}"
    );
    c.send(Frame::from(commands::producer(&topic, 1, 2, None)))
        .await?;
    let got = next(&mut c).await?;
    let name = got
        .producer_success
        .map(|p| p.producer_name)
        .ok_or_else(|| anyhow::anyhow!("PRODUCER: {:?}", got.error))?;

    let payload = vec![b'x'; size];
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut sum_ns: u128 = 0;
    for seq in 0..warmup + messages {
        let md = MessageMetadata {
            producer_name: name.clone(),
            sequence_id: seq,
            publish_time: 1,
            ..Default::default()
        };
        let frame = Frame::Payload(PayloadFrame {
            command: Box::new(commands::send(1, seq, 1)),
            broker_entry_metadata: None,
            checksum: ChecksumState::Valid,
            entry: Bytes::from(entry_from_parts(&md, &payload).to_vec()),
        });
        let t = Instant::now();
        c.send(frame).await?;
        let got = next(&mut c).await?;
        let ns = t.elapsed().as_nanos();
        anyhow::ensure!(got.send_receipt.is_some(), "SEND #{seq}: {got:?}");
        if seq >= warmup {
            sum_ns += ns;
            hist.record(u64::try_from(ns / 1_000).unwrap_or(u64::MAX).max(1))?;
        }
    }
    let ms = |us: u64| us as f64 / 1_000.0;
    println!(
        "{{\"client\":\"raw_w1\",\"messages\":{messages},\"mean_ms\":{:.3},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3}}}",
        sum_ns as f64 / messages.max(1) as f64 / 1e6,
        ms(hist.value_at_quantile(0.5)),
        ms(hist.value_at_quantile(0.99)),
        ms(hist.max())
    );
    Ok(())
}
