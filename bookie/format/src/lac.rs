//! The explicit-LAC body an idle writer sends with `WriteLac` (reference §1.2).
//!
//! `[ledger id: u64 BE][lac: i64 BE][CRC32C over the 16 bytes: u32 BE]`. The
//! bookie stores it opaquely and returns it from `ReadLac`; readers and
//! recovery verify it like an entry, so a corrupt body is ignored, never
//! trusted.

use bytes::{BufMut, Bytes, BytesMut};

/// An entry id (−1 = none), as in the ledger client.
pub type EntryId = i64;

/// Bytes of an explicit-LAC body.
pub const EXPLICIT_LAC_BYTES: usize = 20;

/// Why bytes are not a valid explicit-LAC body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LacError {
    /// Not exactly [`EXPLICIT_LAC_BYTES`] long.
    #[error("explicit LAC body of {0} bytes (want {EXPLICIT_LAC_BYTES})")]
    BadLength(usize),
    /// Digest mismatch.
    #[error("explicit LAC body digest mismatch")]
    DigestMismatch,
    /// A valid body for another ledger.
    #[error("explicit LAC body of ledger {got}, expected {expected}")]
    WrongLedger {
        /// The ledger asked for.
        expected: u64,
        /// The ledger in the body.
        got: u64,
    },
}

/// Builds the body for `lac` of `ledger_id`.
pub fn encode_explicit_lac(ledger_id: u64, lac: EntryId) -> Bytes {
    let mut b = BytesMut::with_capacity(EXPLICIT_LAC_BYTES);
    b.put_u64(ledger_id);
    b.put_i64(lac);
    let crc = crc32c::crc32c(&b[..16]);
    b.put_u32(crc);
    b.freeze()
}

/// Verifies a body and returns its LAC.
pub fn decode_explicit_lac(ledger_id: u64, body: &[u8]) -> Result<EntryId, LacError> {
    if body.len() != EXPLICIT_LAC_BYTES {
        return Err(LacError::BadLength(body.len()));
    }
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&body[16..20]);
    if u32::from_be_bytes(crc) != crc32c::crc32c(&body[..16]) {
        return Err(LacError::DigestMismatch);
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&body[..8]);
    let got = u64::from_be_bytes(id);
    if got != ledger_id {
        return Err(LacError::WrongLedger {
            expected: ledger_id,
            got,
        });
    }
    let mut lac = [0u8; 8];
    lac.copy_from_slice(&body[8..16]);
    Ok(i64::from_be_bytes(lac))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_lac_round_trips_and_refuses_corruption_and_other_ledgers() {
        let b = encode_explicit_lac(9, 41);
        assert_eq!(decode_explicit_lac(9, &b), Ok(41));
        assert_eq!(decode_explicit_lac(9, &encode_explicit_lac(9, -1)), Ok(-1));
        assert_eq!(
            decode_explicit_lac(8, &b),
            Err(LacError::WrongLedger {
                expected: 8,
                got: 9
            })
        );
        assert_eq!(
            decode_explicit_lac(9, &b[..19]),
            Err(LacError::BadLength(19))
        );
        for i in 0..b.len() {
            let mut bad = b.to_vec();
            bad[i] ^= 1;
            assert_eq!(
                decode_explicit_lac(9, &bad),
                Err(LacError::DigestMismatch),
                "byte {i}"
            );
        }
    }
}
