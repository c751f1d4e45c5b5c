//! A minimal fake broker for checking the codec against a real Pulsar client
//! and recording fixtures: it answers the produce / consume handshake of one
//! client at a time and prints every frame it receives or sends as hex.
//!
//! `cargo run -p cms-client --example wire_capture -- 127.0.0.1:6650`, then
//! point a client at `pulsar://127.0.0.1:6650`. Not a broker: one topic, no
//! storage, each SEND is answered and each FLOW gets one MESSAGE.

use futures::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_util::codec::{Encoder, Framed};

use cms_client::proto::commands;
use cms_client::proto::frame::{
    ChecksumState, Frame, PayloadFrame, PulsarCodec, entry_from_parts, parse_entry,
};
use cms_client::proto::pulsar::{MessageMetadata, base_command::Type};

fn hex(frame: &Frame) -> String {
    let mut buf = bytes::BytesMut::new();
    let _ = PulsarCodec::default().encode(frame.clone(), &mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:6650".into());
    let listener = TcpListener::bind(&addr).await?;
    let url = format!("pulsar://{addr}");
    loop {
        let (sock, peer) = listener.accept().await?;
        eprintln!("connection from {peer}");
        let mut framed = Framed::new(sock, PulsarCodec::default());
        while let Some(frame) = framed.next().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("decode error: {e}");
                    break;
                }
            };
            let cmd = frame.command().clone();
            println!("recv {} {}", commands::command_name(&cmd), hex(&frame));
            if let Frame::Payload(p) = &frame {
                println!(
                    "  checksum {:?}, entry {:?}",
                    p.checksum,
                    parse_entry(&p.entry).map(|e| e.metadata)
                );
            }
            let replies: Vec<Frame> = match Type::try_from(cmd.r#type) {
                Ok(Type::Connect) => {
                    vec![Frame::from(commands::connected("cms-capture", 20, 5 << 20))]
                }
                Ok(Type::PartitionedMetadata) => {
                    let r = cmd.partition_metadata.map_or(0, |c| c.request_id);
                    vec![Frame::from(commands::partitioned_metadata_response(r, 0))]
                }
                Ok(Type::Lookup) => {
                    let r = cmd.lookup_topic.map_or(0, |c| c.request_id);
                    vec![Frame::from(commands::lookup_response_connect(
                        r, &url, false,
                    ))]
                }
                Ok(Type::Producer) => {
                    let r = cmd.producer.map_or(0, |c| c.request_id);
                    vec![Frame::from(commands::producer_success(
                        r,
                        "capture-0",
                        -1,
                        true,
                        None,
                    ))]
                }
                Ok(Type::Send) => {
                    let s = cmd.send.unwrap_or_default();
                    vec![Frame::from(commands::send_receipt(
                        s.producer_id,
                        s.sequence_id,
                        7,
                        0,
                    ))]
                }
                Ok(Type::Subscribe) => {
                    let r = cmd.subscribe.map_or(0, |c| c.request_id);
                    vec![Frame::from(commands::success(r))]
                }
                Ok(Type::Flow) => {
                    let c = cmd.flow.map_or(0, |f| f.consumer_id);
                    let meta = MessageMetadata {
                        producer_name: "capture-0".into(),
                        sequence_id: 0,
                        publish_time: 1_700_000_000_000,
                        ..Default::default()
                    };
                    vec![Frame::Payload(PayloadFrame {
                        command: Box::new(commands::message(c, 7, 0, 0)),
                        broker_entry_metadata: None,
                        checksum: ChecksumState::Valid,
                        entry: entry_from_parts(&meta, b"from-cms"),
                    })]
                }
                Ok(Type::CloseProducer) => {
                    let r = cmd.close_producer.map_or(0, |c| c.request_id);
                    vec![Frame::from(commands::success(r))]
                }
                Ok(Type::CloseConsumer) => {
                    let r = cmd.close_consumer.map_or(0, |c| c.request_id);
                    vec![Frame::from(commands::success(r))]
                }
                Ok(Type::Ping) => vec![Frame::from(commands::pong())],
                _ => vec![],
            };
            for reply in replies {
                println!(
                    "send {} {}",
                    commands::command_name(reply.command()),
                    hex(&reply)
                );
                framed.send(reply).await?;
            }
        }
        eprintln!("connection from {peer} closed");
    }
}
