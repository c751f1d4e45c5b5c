//! Fuzz target for the Pulsar frame decoder (`cms_client::proto::frame`).
//!
//! For any input: decoding never panics and never buffers more than the frame
//! limit; every decoded frame re-encodes to bytes that decode and re-encode
//! to the same bytes; `parse_entry` never panics on a decoded entry or on the
//! raw input.

#![no_main]

use bytes::BytesMut;
use cms_client::proto::frame::{Frame, PulsarCodec, parse_entry};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::{Decoder, Encoder};

/// Small enough that random inputs reach the size checks often.
const FRAME_LIMIT: usize = 64 * 1024;

fn encode(frame: Frame) -> Option<BytesMut> {
    let mut out = BytesMut::new();
    // A re-encoded command may legitimately grow (packed vs unpacked
    // repeated fields), so re-encode with the default limit.
    PulsarCodec::default().encode(frame, &mut out).ok()?;
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let _ = parse_entry(data);
    let mut codec = PulsarCodec::new(FRAME_LIMIT);
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = codec.decode(&mut buf) {
        if let Frame::Payload(p) = &frame {
            let _ = parse_entry(&p.entry);
            let _ = p.decode_broker_entry_metadata();
        }
        let Some(first) = encode(frame) else { continue };
        let mut again = first.clone();
        let decoded = PulsarCodec::default()
            .decode(&mut again)
            .expect("a re-encoded frame decodes")
            .expect("a re-encoded frame is complete");
        assert!(again.is_empty(), "re-encoded frame has trailing bytes");
        let second = encode(decoded).expect("re-encodes");
        assert_eq!(first, second, "encoding is not stable");
    }
    assert!(buf.capacity() <= FRAME_LIMIT.max(2 * data.len()) + 64);
});
