//! Fuzz target for the bookie protocol: every request and response message
//! (prost, `cms_bookie_format::proto::bookie`), the entry format inside them
//! (32-byte header + CRC32C, `cms_bookie_format::entry`) and the explicit-LAC
//! body (`cms_bookie_format::lac`).
//!
//! Input: byte 0 picks the message type, the rest is its encoding. For any
//! input: decoding never panics; a decoded message re-encodes to bytes that
//! decode to an equal message; every body it carries goes through the entry
//! and LAC decoders, and a valid entry re-encodes to the same bytes.

#![no_main]

use bytes::Bytes;
use cms_bookie_format::entry::Entry;
use cms_bookie_format::lac::{decode_explicit_lac, encode_explicit_lac};
use cms_bookie_format::proto::bookie::{
    AddRequest, AddResponse, GetBookieInfoResponse, ReadLacRequest, ReadLacResponse,
    ReadNextRequest, ReadNextResponse, ReadRangeRequest, ReadRangeResponse, ReadRequest,
    ReadResponse, WriteLacRequest, WriteLacResponse,
};
use cms_bookie_format::proto::metadata::{Cookie, LedgerMetadata};
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// Decodes `T`, checks the re-encoding is stable, returns the message.
fn round_trip<T: Message + Default + PartialEq>(bytes: &[u8]) -> Option<T> {
    let m = T::decode(bytes).ok()?;
    let again = T::decode(m.encode_to_vec().as_slice()).expect("a re-encoded message decodes");
    assert!(again == m, "re-encoded message differs");
    Some(m)
}

/// The entry decoder on `body` (as a reader does with a read's body).
fn entry(body: &Bytes, ledger_id: u64, entry_id: i64) {
    let _ = Entry::peek_header(body);
    let _ = Entry::decode_expected(body.clone(), ledger_id, entry_id);
    if let Ok(e) = Entry::decode(body.clone()) {
        let again = Entry::encode(e.header, &e.payload);
        assert_eq!(&again[..], &body[..], "entry does not re-encode to itself");
    }
}

fn lac(body: &[u8], ledger_id: u64) {
    if let Ok(l) = decode_explicit_lac(ledger_id, body) {
        assert_eq!(&encode_explicit_lac(ledger_id, l)[..], body);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    match kind % 16 {
        0 => {
            if let Some(m) = round_trip::<AddRequest>(rest) {
                entry(&m.body, m.ledger_id, m.entry_id);
            }
        }
        1 => drop(round_trip::<AddResponse>(rest)),
        2 => drop(round_trip::<ReadRequest>(rest)),
        3 => {
            if let Some(m) = round_trip::<ReadResponse>(rest) {
                entry(&m.body, m.ledger_id, m.entry_id);
            }
        }
        4 => drop(round_trip::<ReadRangeRequest>(rest)),
        5 => {
            if let Some(m) = round_trip::<ReadRangeResponse>(rest) {
                for (i, b) in m.bodies.iter().enumerate() {
                    entry(b, m.ledger_id, m.first_entry_id.saturating_add(i as i64));
                }
            }
        }
        6 => drop(round_trip::<ReadNextRequest>(rest)),
        7 => {
            if let Some(m) = round_trip::<ReadNextResponse>(rest) {
                entry(&m.body, m.ledger_id, m.entry_id);
            }
        }
        8 => drop(round_trip::<ReadLacRequest>(rest)),
        9 => {
            if let Some(m) = round_trip::<ReadLacResponse>(rest) {
                lac(&m.lac_body, m.ledger_id);
                entry(&m.last_entry_body, m.ledger_id, 0);
            }
        }
        10 => {
            if let Some(m) = round_trip::<WriteLacRequest>(rest) {
                lac(&m.body, m.ledger_id);
            }
        }
        11 => drop(round_trip::<WriteLacResponse>(rest)),
        12 => drop(round_trip::<GetBookieInfoResponse>(rest)),
        13 => drop(round_trip::<LedgerMetadata>(rest)),
        14 => drop(round_trip::<Cookie>(rest)),
        _ => {
            let body = Bytes::copy_from_slice(rest);
            let id = |at: usize| rest.get(at..at + 8).map(|b| b.try_into().unwrap_or([0; 8]));
            let ledger_id = id(0).map_or(0, u64::from_be_bytes);
            let entry_id = id(8).map_or(0, i64::from_be_bytes);
            entry(&body, ledger_id, entry_id);
            lac(rest, ledger_id);
        }
    }
});
