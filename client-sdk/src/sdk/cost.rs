//! The SDK's per-message work without the network, for the CPU-cost
//! benchmark (`examples/sdk_cost.rs`, issue 13): exactly the calls the
//! producer and consumer make for one entry. Hidden from the docs; not a
//! stable API.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

use super::error::{Error, Result};
use super::message::{Message, ProducerMessage, batch_entry_parts, single_entry_parts, unpack};
use crate::proto::commands;
use crate::proto::frame::{
    ChecksumState, Frame, PayloadFrame, PulsarCodec, entry_from_parts, parse_entry,
};
use crate::proto::pulsar::CompressionType;

/// Producer side, one message alone: metadata, compression, checksummed
/// entry, SEND command, frame bytes appended to `dst`.
pub fn encode_single(
    msg: &ProducerMessage,
    seq: u64,
    compression: CompressionType,
    dst: &mut BytesMut,
) -> Result<()> {
    let (meta, payload) = single_entry_parts(msg, "bench", seq, compression)?;
    let entry = entry_from_parts(&meta, &payload);
    frame(commands::send(1, seq, 1), entry, dst)
}

/// Producer side, a batch: batch payload, compression, entry, SEND frame.
pub fn encode_batch(
    msgs: &[&ProducerMessage],
    seq: u64,
    compression: CompressionType,
    dst: &mut BytesMut,
) -> Result<()> {
    let (meta, payload) = batch_entry_parts(msgs, "bench", seq, compression)?;
    let entry = entry_from_parts(&meta, &payload);
    let n = i32::try_from(msgs.len()).unwrap_or(i32::MAX);
    frame(commands::send(1, seq, n), entry, dst)
}

fn frame(
    cmd: crate::proto::pulsar::BaseCommand,
    entry: bytes::Bytes,
    dst: &mut BytesMut,
) -> Result<()> {
    let f = Frame::Payload(PayloadFrame {
        command: Box::new(cmd),
        broker_entry_metadata: None,
        checksum: ChecksumState::Valid,
        entry,
    });
    PulsarCodec::default().encode(f, dst)?;
    Ok(())
}

/// Turns the SEND frame bytes made by [`encode_single`] / [`encode_batch`]
/// into the MESSAGE frame bytes a broker would deliver (same entry).
pub fn as_message_frame(send: &[u8]) -> Result<BytesMut> {
    let mut src = BytesMut::from(send);
    let Some(Frame::Payload(p)) = PulsarCodec::default().decode(&mut src)? else {
        return Err(Error::Protocol("not a payload frame".into()));
    };
    let mut out = BytesMut::new();
    frame(commands::message(1, 7, 9, 0), p.entry, &mut out)?;
    Ok(out)
}

/// Consumer side: decodes one MESSAGE frame (checksum verified), parses
/// the entry, decompresses and unpacks it into messages.
pub fn decode_message(src: &mut BytesMut) -> Result<Vec<Message>> {
    let Some(Frame::Payload(p)) = PulsarCodec::default().decode(src)? else {
        return Err(Error::Protocol("not a payload frame".into()));
    };
    let m = p
        .command
        .message
        .as_ref()
        .ok_or_else(|| Error::Protocol("payload frame without MESSAGE".into()))?;
    let parsed = parse_entry(&p.entry)?;
    unpack(
        "persistent://public/default/bench",
        &m.message_id,
        &parsed.metadata,
        p.entry.slice(parsed.payload.clone()),
        0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_frames_decode_back_to_the_messages() {
        let msgs: Vec<ProducerMessage> = (0..10)
            .map(|i| ProducerMessage::new(vec![i as u8; 100]).key(format!("k{i}")))
            .collect();
        let refs: Vec<&ProducerMessage> = msgs.iter().collect();
        for c in [
            CompressionType::None,
            CompressionType::Lz4,
            CompressionType::Zstd,
        ] {
            let mut send = BytesMut::new();
            encode_batch(&refs, 5, c, &mut send).unwrap();
            let mut m = as_message_frame(&send).unwrap();
            let out = decode_message(&mut m).unwrap();
            assert_eq!(out.len(), 10);
            assert_eq!(&out[3].payload[..], &[3u8; 100][..]);
            assert_eq!(out[3].key.as_deref(), Some("k3"));
            let mut one = BytesMut::new();
            encode_single(&msgs[2], 1, c, &mut one).unwrap();
            let out = decode_message(&mut as_message_frame(&one).unwrap()).unwrap();
            assert_eq!(&out[0].payload[..], &[2u8; 100][..]);
        }
    }
}
