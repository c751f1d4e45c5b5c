//! Fuzz target for the bookie's entry-log record parser
//! (`cms_bookie_format::entry_log::decode_record`).
//!
//! Input: bytes 0..8 = the ledger id asked for, 8..16 = the entry id, the
//! rest = the record as read from an index location. For any input: decoding
//! never panics; on success the record holds exactly the ids asked for and
//! re-encodes to the same bytes (a CRC-checked format has one encoding).

#![no_main]

use bytes::Bytes;
use cms_bookie_format::entry_log::{decode_record, encode_record, record_bytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((ids, rec)) = data.split_first_chunk::<16>() else {
        return;
    };
    let ledger_id = u64::from_be_bytes(ids[0..8].try_into().unwrap_or_default());
    let entry_id = i64::from_be_bytes(ids[8..16].try_into().unwrap_or_default());
    // Also try the ids the record itself names, so the CRC path is reached.
    let named = rec.get(8..24).map(|b| {
        (
            u64::from_be_bytes(b[0..8].try_into().unwrap_or_default()),
            i64::from_be_bytes(b[8..16].try_into().unwrap_or_default()),
        )
    });
    let rec = Bytes::copy_from_slice(rec);
    for (l, e) in std::iter::once((ledger_id, entry_id)).chain(named) {
        if let Ok(payload) = decode_record(&rec, l, e) {
            assert_eq!(record_bytes(payload.len()), rec.len());
            let mut again = Vec::new();
            encode_record(&mut again, l, e, &payload);
            assert_eq!(&again[..], &rec[..], "record does not re-encode to itself");
        }
    }
});
