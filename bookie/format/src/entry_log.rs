//! The entry-log record format (the bookie's interleaved entry logs, files
//! `<log id as 8 hex digits>.log`): a 16-byte header ([`LOG_MAGIC`] + log id,
//! big-endian u64) followed by records
//! `[len u32][crc32c u32][ledger u64][entry i64][data]` (big-endian), where
//! `len` counts the bytes after itself and the CRC32C covers ledger, entry
//! and data.
//!
//! Pure encode / decode, no I/O. Promise: [`decode_record`] takes untrusted
//! bytes, checks the length, the CRC and the ids, reports any mismatch as a
//! reason string (the storage turns it into a corruption error, never into
//! "no entry") and never panics.

use bytes::{BufMut, Bytes};

/// Magic bytes at the start of every entry log.
pub const LOG_MAGIC: &[u8; 8] = b"CMSELOG1";
/// Bytes of the log header (magic + log id).
pub const LOG_HEADER_BYTES: u64 = 16;
/// Bytes of a record before its data: len, crc, ledger, entry.
pub const RECORD_PREFIX_BYTES: usize = 24;
/// Bytes a record of `data_len` bytes of data takes.
pub fn record_bytes(data_len: usize) -> usize {
    RECORD_PREFIX_BYTES + data_len
}

fn record_crc(ledger_id: u64, entry_id: i64, data: &[u8]) -> u32 {
    let mut crc = crc32c::crc32c(&ledger_id.to_be_bytes());
    crc = crc32c::crc32c_append(crc, &entry_id.to_be_bytes());
    crc32c::crc32c_append(crc, data)
}

/// Appends one record to `buf`.
pub fn encode_record(buf: &mut Vec<u8>, ledger_id: u64, entry_id: i64, data: &[u8]) {
    let len = (RECORD_PREFIX_BYTES - 4 + data.len()) as u32;
    buf.put_u32(len);
    buf.put_u32(record_crc(ledger_id, entry_id, data));
    buf.put_u64(ledger_id);
    buf.put_i64(entry_id);
    buf.put_slice(data);
}

/// Checks the record in `rec` (exactly one record) and returns its data.
/// `Err(reason)` when it is not a valid record of `(ledger_id, entry_id)`.
pub fn decode_record(rec: &Bytes, ledger_id: u64, entry_id: i64) -> Result<Bytes, String> {
    if rec.len() < RECORD_PREFIX_BYTES {
        return Err(format!(
            "record of {} bytes is shorter than its prefix",
            rec.len()
        ));
    }
    let field = |at: usize| -> [u8; 8] {
        let mut b = [0u8; 8];
        b.copy_from_slice(&rec[at..at + 8]);
        b
    };
    let mut w = [0u8; 4];
    w.copy_from_slice(&rec[0..4]);
    let len = u32::from_be_bytes(w) as usize;
    w.copy_from_slice(&rec[4..8]);
    let stored_crc = u32::from_be_bytes(w);
    if len + 4 != rec.len() {
        return Err(format!(
            "record length field {len} does not match the indexed size {}",
            rec.len()
        ));
    }
    let got_ledger = u64::from_be_bytes(field(8));
    let got_entry = i64::from_be_bytes(field(16));
    let data = rec.slice(RECORD_PREFIX_BYTES..);
    let computed = record_crc(got_ledger, got_entry, &data);
    if computed != stored_crc {
        return Err(format!(
            "record crc mismatch (stored {stored_crc:#010x}, computed {computed:#010x})"
        ));
    }
    if got_ledger != ledger_id || got_entry != entry_id {
        return Err(format!(
            "record holds {got_ledger}:{got_entry}, not {ledger_id}:{entry_id}"
        ));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_any_damage() {
        let mut buf = Vec::new();
        encode_record(&mut buf, 7, 3, b"payload");
        assert_eq!(buf.len(), record_bytes(7));
        let rec = Bytes::from(buf.clone());
        assert_eq!(decode_record(&rec, 7, 3).unwrap(), &b"payload"[..]);
        assert!(decode_record(&rec, 7, 4).is_err());
        assert!(decode_record(&rec, 8, 3).is_err());
        for i in 0..buf.len() {
            let mut b = buf.clone();
            b[i] ^= 0x10;
            assert!(decode_record(&Bytes::from(b), 7, 3).is_err(), "flip at {i}");
        }
        for cut in 0..buf.len() {
            assert!(
                decode_record(&rec.slice(..cut), 7, 3).is_err(),
                "cut at {cut}"
            );
        }
    }
}
