//! The batch payload format (Pulsar's exact layout): a batch entry's
//! uncompressed payload is `[u32 size ‖ SingleMessageMetadata ‖ payload]*`,
//! one group per message, `num_messages_in_batch` groups in all.
//!
//! Pure encode / decode, no I/O, no decompression (that is the SDK's
//! `compression` module). Promise: [`parse_batch`] takes untrusted bytes,
//! checks every size against the bytes present, never panics, and allocates
//! at most a bounded `Vec` of slices of its input (payloads share the input
//! buffer).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message as _;

use super::pulsar::SingleMessageMetadata;

/// Messages a batch may declare; above it the batch is rejected before
/// parsing (Pulsar's `maxNumMessagesInBatch` default is 1000).
pub const BATCH_MESSAGES_MAX: usize = 100_000;

/// One message of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchedMessage {
    /// Its metadata.
    pub metadata: SingleMessageMetadata,
    /// Its payload (shares the batch buffer).
    pub payload: Bytes,
}

/// Why bytes are not a valid batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// `num_messages_in_batch` is negative or above [`BATCH_MESSAGES_MAX`].
    #[error("batch size {0} out of range 0..={BATCH_MESSAGES_MAX}")]
    Count(i64),
    /// The bytes end before message `index`'s size field.
    #[error("batch truncated at message {index} of {count}")]
    Truncated {
        /// The message.
        index: usize,
        /// Messages declared.
        count: usize,
    },
    /// Message `index`'s metadata size exceeds the bytes left.
    #[error("batch metadata {0} truncated")]
    MetadataTruncated(usize),
    /// Message `index`'s metadata does not decode.
    #[error("batch metadata {index}: {reason}")]
    Metadata {
        /// The message.
        index: usize,
        /// The protobuf error.
        reason: String,
    },
    /// Message `index`'s `payload_size` is negative or exceeds the bytes left.
    #[error("batch payload {index} size {size}")]
    PayloadSize {
        /// The message.
        index: usize,
        /// The declared size.
        size: i32,
    },
}

/// Appends one message (`u32 size ‖ metadata ‖ payload`) to a batch.
/// `metadata.payload_size` is set to `payload.len()`.
pub fn encode_batched(buf: &mut BytesMut, metadata: &SingleMessageMetadata, payload: &[u8]) {
    let mut metadata = metadata.clone();
    metadata.payload_size = i32::try_from(payload.len()).unwrap_or(i32::MAX);
    buf.put_u32(metadata.encoded_len() as u32);
    // Cannot fail: BytesMut grows.
    let _ = metadata.encode(buf);
    buf.extend_from_slice(payload);
}

/// Splits an uncompressed batch payload into its `count` messages
/// (`count` = the entry's `num_messages_in_batch`). Trailing bytes after the
/// last message are ignored, as Pulsar's clients do.
pub fn parse_batch(data: Bytes, count: i32) -> Result<Vec<BatchedMessage>, BatchError> {
    let n = usize::try_from(count)
        .ok()
        .filter(|n| *n <= BATCH_MESSAGES_MAX)
        .ok_or(BatchError::Count(i64::from(count)))?;
    let mut buf = data;
    // Every message takes at least its 4-byte size: never reserve more
    // slots than the input can fill.
    let mut out = Vec::with_capacity(n.min(buf.len() / 4));
    for index in 0..n {
        if buf.remaining() < 4 {
            return Err(BatchError::Truncated { index, count: n });
        }
        let len = buf.get_u32() as usize;
        if buf.remaining() < len {
            return Err(BatchError::MetadataTruncated(index));
        }
        let metadata =
            SingleMessageMetadata::decode(buf.split_to(len)).map_err(|e| BatchError::Metadata {
                index,
                reason: e.to_string(),
            })?;
        let size = usize::try_from(metadata.payload_size)
            .ok()
            .filter(|s| *s <= buf.remaining())
            .ok_or(BatchError::PayloadSize {
                index,
                size: metadata.payload_size,
            })?;
        let payload = buf.split_to(size);
        out.push(BatchedMessage { metadata, payload });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: usize) -> Bytes {
        let mut buf = BytesMut::new();
        for i in 0..n {
            let m = SingleMessageMetadata {
                partition_key: Some(format!("k{i}")),
                sequence_id: Some(i as u64),
                ..Default::default()
            };
            encode_batched(&mut buf, &m, format!("payload {i}").as_bytes());
        }
        buf.freeze()
    }

    #[test]
    fn round_trips() {
        let got = parse_batch(batch(3), 3).unwrap();
        assert_eq!(got.len(), 3);
        for (i, m) in got.iter().enumerate() {
            assert_eq!(m.payload, format!("payload {i}").as_bytes());
            assert_eq!(m.metadata.partition_key, Some(format!("k{i}")));
            assert_eq!(m.metadata.sequence_id, Some(i as u64));
        }
        assert!(parse_batch(batch(0), 0).unwrap().is_empty());
    }

    #[test]
    fn every_truncation_and_bad_count_is_an_error() {
        let b = batch(2);
        for cut in 0..b.len() {
            assert!(parse_batch(b.slice(..cut), 2).is_err(), "cut {cut}");
        }
        assert_eq!(parse_batch(b.clone(), -1), Err(BatchError::Count(-1)));
        assert_eq!(
            parse_batch(b.clone(), i32::MAX),
            Err(BatchError::Count(i64::from(i32::MAX)))
        );
        assert!(matches!(
            parse_batch(b, 3),
            Err(BatchError::Truncated { index: 2, count: 3 })
        ));
    }

    #[test]
    fn negative_payload_size_is_an_error() {
        let mut buf = BytesMut::new();
        let m = SingleMessageMetadata {
            payload_size: -5,
            ..Default::default()
        };
        buf.put_u32(m.encoded_len() as u32);
        m.encode(&mut buf).unwrap();
        assert!(matches!(
            parse_batch(buf.freeze(), 1),
            Err(BatchError::PayloadSize { index: 0, size: -5 })
        ));
    }
}
