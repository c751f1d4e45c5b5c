//! The entry format shared by the ledger client and the bookie (DESIGN §2).
//!
//! An entry is built by the writer and stored by bookies exactly as received:
//!
//! | offset | field | bytes |
//! |---|---|---|
//! | 0 | ledger id (big-endian u64) | 8 |
//! | 8 | entry id (big-endian i64) | 8 |
//! | 16 | last add confirmed, piggybacked (big-endian i64, −1 = none) | 8 |
//! | 24 | cumulative ledger length including this entry (big-endian u64) | 8 |
//! | 32 | CRC32C over bytes 0..32 and the payload (big-endian u32) | 4 |
//! | 36 | payload | n |
//!
//! Bookies never verify the digest on write (as BookKeeper's BP-31 decided);
//! readers verify it with [`Entry::decode`], so a corrupted replica is found and
//! another is tried.

use bytes::{BufMut, Bytes, BytesMut};

/// Bytes of the fixed header before the digest.
pub const HEADER_BYTES: usize = 32;
/// Bytes of the CRC32C digest.
pub const DIGEST_BYTES: usize = 4;
/// Bytes before the payload.
pub const PREFIX_BYTES: usize = HEADER_BYTES + DIGEST_BYTES;

/// An entry's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHeader {
    /// The ledger.
    pub ledger_id: u64,
    /// The entry's id in its ledger (0, 1, ...).
    pub entry_id: i64,
    /// The writer's last add confirmed when it built this entry (−1 = none).
    pub lac: i64,
    /// Ledger length in bytes of payload, this entry included.
    pub length: u64,
}

/// A decoded, digest-checked entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its header.
    pub header: EntryHeader,
    /// The payload (shares the encoded buffer).
    pub payload: Bytes,
}

/// Why bytes are not a valid entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Fewer bytes than the header and digest.
    #[error("entry of {0} bytes is shorter than its {PREFIX_BYTES}-byte prefix")]
    TooShort(usize),
    /// The CRC32C does not match: the bytes were corrupted.
    #[error(
        "entry {ledger_id}:{entry_id} digest mismatch (stored {stored:#010x}, computed {computed:#010x})"
    )]
    DigestMismatch {
        /// Ledger id as read from the (possibly corrupt) header.
        ledger_id: u64,
        /// Entry id as read from the (possibly corrupt) header.
        entry_id: i64,
        /// Digest stored in the entry.
        stored: u32,
        /// Digest computed over the bytes.
        computed: u32,
    },
    /// A valid entry, but not the one asked for.
    #[error("expected entry {expected_ledger}:{expected_entry}, got {ledger_id}:{entry_id}")]
    WrongEntry {
        /// Ledger asked for.
        expected_ledger: u64,
        /// Entry asked for.
        expected_entry: i64,
        /// Ledger in the entry.
        ledger_id: u64,
        /// Entry in the entry.
        entry_id: i64,
    },
}

impl Entry {
    /// Builds the stored bytes of an entry.
    pub fn encode(header: EntryHeader, payload: &[u8]) -> Bytes {
        let mut buf = BytesMut::with_capacity(PREFIX_BYTES + payload.len());
        buf.put_u64(header.ledger_id);
        buf.put_i64(header.entry_id);
        buf.put_i64(header.lac);
        buf.put_u64(header.length);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&buf[..HEADER_BYTES]), payload);
        buf.put_u32(crc);
        buf.put_slice(payload);
        buf.freeze()
    }

    /// Reads the header without checking the digest (what a bookie may do).
    pub fn peek_header(bytes: &[u8]) -> Result<EntryHeader, EntryError> {
        if bytes.len() < PREFIX_BYTES {
            return Err(EntryError::TooShort(bytes.len()));
        }
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[i..i + 8]);
            u64::from_be_bytes(b)
        };
        Ok(EntryHeader {
            ledger_id: u64_at(0),
            entry_id: u64_at(8) as i64,
            lac: u64_at(16) as i64,
            length: u64_at(24),
        })
    }

    /// Checks the digest and splits header and payload.
    pub fn decode(bytes: Bytes) -> Result<Entry, EntryError> {
        let header = Self::peek_header(&bytes)?;
        let mut d = [0u8; 4];
        d.copy_from_slice(&bytes[HEADER_BYTES..PREFIX_BYTES]);
        let stored = u32::from_be_bytes(d);
        let computed = crc32c::crc32c_append(
            crc32c::crc32c(&bytes[..HEADER_BYTES]),
            &bytes[PREFIX_BYTES..],
        );
        if stored != computed {
            return Err(EntryError::DigestMismatch {
                ledger_id: header.ledger_id,
                entry_id: header.entry_id,
                stored,
                computed,
            });
        }
        Ok(Entry {
            header,
            payload: bytes.slice(PREFIX_BYTES..),
        })
    }

    /// [`Entry::decode`], and checks that it is entry `entry_id` of `ledger_id`.
    pub fn decode_expected(
        bytes: Bytes,
        ledger_id: u64,
        entry_id: i64,
    ) -> Result<Entry, EntryError> {
        let e = Self::decode(bytes)?;
        if e.header.ledger_id != ledger_id || e.header.entry_id != entry_id {
            return Err(EntryError::WrongEntry {
                expected_ledger: ledger_id,
                expected_entry: entry_id,
                ledger_id: e.header.ledger_id,
                entry_id: e.header.entry_id,
            });
        }
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> EntryHeader {
        EntryHeader {
            ledger_id: 7,
            entry_id: 3,
            lac: 2,
            length: 100,
        }
    }

    #[test]
    fn round_trip_keeps_header_and_payload() {
        let bytes = Entry::encode(header(), b"payload");
        assert_eq!(bytes.len(), PREFIX_BYTES + 7);
        let e = Entry::decode_expected(bytes, 7, 3).unwrap();
        assert_eq!(e.header, header());
        assert_eq!(&e.payload[..], b"payload");
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let bytes = Entry::encode(header(), b"some payload bytes");
        for i in 0..bytes.len() {
            let mut bad = bytes.to_vec();
            bad[i] ^= 0x40;
            let err = Entry::decode(Bytes::from(bad)).unwrap_err();
            assert!(
                matches!(err, EntryError::DigestMismatch { .. }),
                "byte {i}: {err:?}"
            );
        }
    }

    #[test]
    fn short_and_misaddressed_entries_are_refused() {
        assert_eq!(
            Entry::decode(Bytes::from_static(b"abc")).unwrap_err(),
            EntryError::TooShort(3)
        );
        let bytes = Entry::encode(header(), b"x");
        assert!(matches!(
            Entry::decode_expected(bytes, 7, 4).unwrap_err(),
            EntryError::WrongEntry { .. }
        ));
    }
}
