//! Fuzz target for the batch payload format (`cms_client::proto::batch`) and
//! the entry parser in front of it (`parse_entry`).
//!
//! Input: byte 0..4 = the declared message count (`num_messages_in_batch`),
//! the rest = the uncompressed batch payload. For any input: parsing never
//! panics, returns exactly the declared count on success, every payload lies
//! within the input, and a parsed batch re-encodes to bytes that parse to the
//! same messages. The whole input is also parsed as an entry.

#![no_main]

use bytes::{Bytes, BytesMut};
use cms_client::proto::batch::{encode_batched, parse_batch};
use cms_client::proto::frame::parse_entry;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entry) = parse_entry(data) {
        let payload = Bytes::copy_from_slice(entry.payload(data));
        if let Some(n) = entry.metadata.num_messages_in_batch {
            let _ = parse_batch(payload, n);
        }
    }
    let Some((count, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    // Small counts most of the time, so the parser gets past the count check.
    let count = i32::from_be_bytes(*count) % 64;
    let input = Bytes::copy_from_slice(rest);
    let Ok(msgs) = parse_batch(input.clone(), count) else {
        return;
    };
    assert_eq!(msgs.len() as i32, count);
    let mut again = BytesMut::new();
    for m in &msgs {
        assert!(m.payload.len() <= input.len());
        encode_batched(&mut again, &m.metadata, &m.payload);
    }
    let reparsed = parse_batch(again.freeze(), count).expect("a re-encoded batch parses");
    assert_eq!(reparsed, msgs, "re-encoded batch differs");
});
