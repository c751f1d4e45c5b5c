//! Framing of the Pulsar binary protocol: splitting a byte stream into
//! [`Frame`]s and writing them back, plus the checksummed *entry* format the
//! broker stores in ledgers.
//!
//! Promises:
//! - the declared `totalSize` is checked against the limit before anything is
//!   reserved or allocated for the frame ([`FrameError::TooLarge`]);
//! - a truncated frame is `Ok(None)` (wait for more bytes), never an error;
//! - inconsistent sizes, bad magic numbers, trailing bytes after a simple
//!   command and undecodable protobuf are errors, never panics; the caller
//!   closes that one connection (invariant 9);
//! - [`PayloadFrame::entry`] always holds a checksummed payload section, sliced
//!   from the received frame without copying when the sender put a checksum
//!   on the wire, and rebuilt with a freshly computed CRC32C when it did not.

use std::ops::Range;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use tokio_util::codec::{Decoder, Encoder};

use super::pulsar::{BaseCommand, BrokerEntryMetadata, MessageMetadata, base_command::Type};

/// Largest frame accepted or produced by default: the 5 MiB message size limit
/// plus room for the command and metadata (Pulsar's `MESSAGE_SIZE_FRAME_PADDING`).
pub const FRAME_SIZE_MAX: usize = 5 * 1024 * 1024 + 10 * 1024;

/// Magic number that starts a checksummed payload section.
pub const MAGIC_CRC32C: u16 = 0x0e01;
/// Magic number that starts a broker entry metadata section.
pub const MAGIC_BROKER_ENTRY_METADATA: u16 = 0x0e02;

/// Bytes before the metadata in an entry: magic (2) + CRC32C (4).
const ENTRY_CHECKSUM_HEADER_LEN: usize = 2 + 4;

/// One decoded frame.
///
/// The command is boxed: prost lays out every optional sub-command of
/// `BaseCommand` inline (about 3.8 KiB), and a frame is moved several times
/// on its way through channels and codecs; a box makes each move a pointer.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A command without payload (everything except SEND and MESSAGE).
    Command(Box<BaseCommand>),
    /// SEND (client to broker) or MESSAGE (broker to client) with its payload.
    Payload(PayloadFrame),
}

impl From<BaseCommand> for Frame {
    /// A frame without payload.
    fn from(cmd: BaseCommand) -> Frame {
        Frame::Command(Box::new(cmd))
    }
}

impl Frame {
    /// The command of the frame, payload or not.
    pub fn command(&self) -> &BaseCommand {
        match self {
            Frame::Command(cmd) => cmd,
            Frame::Payload(p) => &p.command,
        }
    }
}

/// A SEND or MESSAGE frame.
#[derive(Debug, Clone, PartialEq)]
pub struct PayloadFrame {
    /// The command (its `send` or `message` sub-message is present), boxed
    /// as in [`Frame::Command`].
    pub command: Box<BaseCommand>,
    /// The encoded [`BrokerEntryMetadata`] of a 0x0e02 section, if the frame
    /// had one (MESSAGE only); without its magic and size prefix.
    pub broker_entry_metadata: Option<Bytes>,
    /// What the sender's checksum said about the payload section.
    pub checksum: ChecksumState,
    /// `0x0e01 ‖ u32 CRC32C ‖ u32 metadataSize ‖ MessageMetadata ‖ payload`:
    /// exactly what the broker stores as a ledger entry and writes verbatim
    /// after a MESSAGE command. When the sender put no checksum on the wire the
    /// decoder computed it and inserted it; on [`ChecksumState::Mismatch`] the
    /// stored CRC is the sender's (wrong) one.
    pub entry: Bytes,
}

impl PayloadFrame {
    /// The decoded broker entry metadata, if the frame had a 0x0e02 section.
    pub fn decode_broker_entry_metadata(&self) -> Result<Option<BrokerEntryMetadata>, FrameError> {
        match &self.broker_entry_metadata {
            None => Ok(None),
            Some(raw) => Ok(Some(BrokerEntryMetadata::decode(raw.clone())?)),
        }
    }
}

/// Checksum of a payload section as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumState {
    /// The sender wrote no checksum (protocol version below 6); the decoder
    /// computed one for [`PayloadFrame::entry`].
    Absent,
    /// The CRC32C on the wire matches the payload section.
    Valid,
    /// The CRC32C on the wire does not match: the broker answers SEND_ERROR
    /// with `ChecksumError`, a client acks with `ChecksumMismatch`.
    Mismatch,
}

/// Why bytes could not be turned into a frame or an entry.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The declared size exceeds the limit; nothing was allocated for it.
    #[error("frame of {size} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Declared (or, when encoding, actual) frame size in bytes.
        size: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// Inconsistent sizes, bad magic, unexpected payload, etc.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A protobuf section did not decode.
    #[error("protobuf decode error: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// An entry's stored CRC32C does not match its content ([`parse_entry`]).
    #[error("entry checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// CRC32C found in the entry.
        stored: u32,
        /// CRC32C computed over the entry's content.
        computed: u32,
    },
    /// The underlying transport failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

fn malformed(msg: impl Into<String>) -> FrameError {
    FrameError::Malformed(msg.into())
}

/// Tokio codec for the Pulsar binary protocol, usable on both sides of a
/// connection.
#[derive(Debug, Clone)]
pub struct PulsarCodec {
    frame_size_max: usize,
}

impl PulsarCodec {
    /// A codec accepting and producing frames of at most `frame_size_max`
    /// bytes (counting the 4-byte `totalSize` prefix too).
    pub fn new(frame_size_max: usize) -> Self {
        Self { frame_size_max }
    }

    /// The frame size limit in bytes.
    pub fn frame_size_max(&self) -> usize {
        self.frame_size_max
    }
}

impl Default for PulsarCodec {
    fn default() -> Self {
        Self::new(FRAME_SIZE_MAX)
    }
}

impl Decoder for PulsarCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if src.len() < 4 {
            return Ok(None);
        }
        let total_size = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
        // Checked before reserving anything for the body.
        let frame_len = total_size.saturating_add(4);
        if frame_len > self.frame_size_max {
            return Err(FrameError::TooLarge {
                size: frame_len,
                max: self.frame_size_max,
            });
        }
        if src.len() < frame_len {
            src.reserve(frame_len - src.len());
            return Ok(None);
        }
        // A frame split off the read buffer would share its allocation, and
        // anything kept from it (a cached payload, a key) would pin the whole
        // buffer: frames smaller than half of it get their own copy.
        let mut frame = if frame_len.saturating_mul(2) < src.capacity() {
            let f = Bytes::copy_from_slice(&src[..frame_len]);
            src.advance(frame_len);
            f
        } else {
            src.split_to(frame_len).freeze()
        };
        frame.advance(4);
        decode_frame_body(frame).map(Some)
    }
}

impl Encoder<Frame> for PulsarCodec {
    type Error = FrameError;

    fn encode(&mut self, item: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        match item {
            Frame::Command(cmd) => {
                let len = 8 + cmd.encoded_len();
                self.check_size(len)?;
                encode_command(&cmd, dst);
            }
            Frame::Payload(p) => {
                let bem_len = p
                    .broker_entry_metadata
                    .as_ref()
                    .map_or(0, |b| 2 + 4 + b.len());
                let len = 8 + p.command.encoded_len() + bem_len + p.entry.len();
                self.check_size(len)?;
                let bem = p.broker_entry_metadata.as_deref();
                encode_payload_header_with(&p.command, bem, p.entry.len(), dst);
                dst.extend_from_slice(&p.entry);
            }
        }
        Ok(())
    }
}

impl PulsarCodec {
    fn check_size(&self, len: usize) -> Result<(), FrameError> {
        if len > self.frame_size_max {
            return Err(FrameError::TooLarge {
                size: len,
                max: self.frame_size_max,
            });
        }
        Ok(())
    }
}

/// Decodes the body of one complete frame: everything after `totalSize`.
/// Used by [`PulsarCodec`]; public for tests and fuzzing.
pub fn decode_frame_body(mut body: Bytes) -> Result<Frame, FrameError> {
    if body.len() < 4 {
        return Err(malformed(format!(
            "totalSize {} leaves no room for commandSize",
            body.len()
        )));
    }
    let command_size = body.get_u32() as usize;
    if command_size > body.len() {
        return Err(malformed(format!(
            "commandSize {command_size} exceeds the {} bytes left in the frame",
            body.len()
        )));
    }
    // Decoded into its box in place (no 3.8 KiB stack copy).
    let mut command = Box::<BaseCommand>::default();
    command.merge(body.split_to(command_size))?;
    if body.is_empty() {
        return Ok(Frame::Command(command));
    }
    // Only SEND and MESSAGE carry a payload.
    let is_message = match Type::try_from(command.r#type) {
        Ok(Type::Send) if command.send.is_some() => false,
        Ok(Type::Message) if command.message.is_some() => true,
        _ => {
            return Err(malformed(format!(
                "{} bytes after a {} command (only SEND and MESSAGE carry a payload, with their sub-message)",
                body.len(),
                super::commands::command_name(&command)
            )));
        }
    };

    let mut broker_entry_metadata = None;
    if peek_u16(&body) == Some(MAGIC_BROKER_ENTRY_METADATA) {
        if !is_message {
            return Err(malformed(
                "broker entry metadata (0x0e02) is only valid on MESSAGE",
            ));
        }
        body.advance(2);
        if body.len() < 4 {
            return Err(malformed("truncated broker entry metadata size"));
        }
        let size = body.get_u32() as usize;
        if size > body.len() {
            return Err(malformed(format!(
                "broker entry metadata size {size} exceeds the {} bytes left",
                body.len()
            )));
        }
        let raw = body.split_to(size);
        // Reject garbage here rather than on the consumer's hot path.
        BrokerEntryMetadata::decode(raw.clone())?;
        broker_entry_metadata = Some(raw);
    }

    let (checksum, entry) = if peek_u16(&body) == Some(MAGIC_CRC32C) {
        if body.len() < ENTRY_CHECKSUM_HEADER_LEN {
            return Err(malformed("truncated checksum"));
        }
        let stored = u32::from_be_bytes([body[2], body[3], body[4], body[5]]);
        let section = &body[ENTRY_CHECKSUM_HEADER_LEN..];
        check_metadata_size(section)?;
        let state = if crc32c::crc32c(section) == stored {
            ChecksumState::Valid
        } else {
            ChecksumState::Mismatch
        };
        (state, body)
    } else {
        check_metadata_size(&body)?;
        (ChecksumState::Absent, checksummed(&body))
    };
    Ok(Frame::Payload(PayloadFrame {
        command,
        broker_entry_metadata,
        checksum,
        entry,
    }))
}

fn peek_u16(b: &[u8]) -> Option<u16> {
    (b.len() >= 2).then(|| u16::from_be_bytes([b[0], b[1]]))
}

/// Checks `u32 metadataSize ‖ MessageMetadata ‖ payload` is consistent.
fn check_metadata_size(section: &[u8]) -> Result<usize, FrameError> {
    if section.len() < 4 {
        return Err(malformed(format!(
            "payload section of {} bytes has no metadataSize",
            section.len()
        )));
    }
    let size = u32::from_be_bytes([section[0], section[1], section[2], section[3]]) as usize;
    if size > section.len() - 4 {
        return Err(malformed(format!(
            "metadataSize {size} exceeds the {} bytes left",
            section.len() - 4
        )));
    }
    Ok(size)
}

/// `0x0e01 ‖ crc32c(section) ‖ section`.
fn checksummed(section: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(ENTRY_CHECKSUM_HEADER_LEN + section.len());
    out.put_u16(MAGIC_CRC32C);
    out.put_u32(crc32c::crc32c(section));
    out.extend_from_slice(section);
    out.freeze()
}

/// Appends a simple command frame: `totalSize ‖ commandSize ‖ BaseCommand`.
/// The caller keeps commands small (they are far below the frame limit).
pub fn encode_command(cmd: &BaseCommand, dst: &mut BytesMut) {
    let cmd_len = cmd.encoded_len();
    dst.reserve(8 + cmd_len);
    dst.put_u32((4 + cmd_len) as u32);
    dst.put_u32(cmd_len as u32);
    // Cannot fail: capacity was reserved above.
    let _ = cmd.encode(dst);
}

/// Appends a payload frame: the command followed by `entry`, which must be a
/// checksummed payload section as in [`PayloadFrame::entry`] (for example a
/// stored ledger entry). The caller checks the size against its limit
/// (`8 + cmd.encoded_len() + entry.len()`).
pub fn encode_payload(cmd: &BaseCommand, entry: &[u8], dst: &mut BytesMut) {
    encode_payload_header(cmd, entry.len(), dst);
    dst.extend_from_slice(entry);
}

/// Appends everything of a payload frame except the entry itself, so a caller
/// can write `header` and the stored entry `Bytes` without copying the entry.
pub fn encode_payload_header(cmd: &BaseCommand, entry_len: usize, dst: &mut BytesMut) {
    encode_payload_header_with(cmd, None, entry_len, dst);
}

/// Like [`encode_payload_header`], with an optional broker entry metadata
/// section (`0x0e02 ‖ u32 size ‖ BrokerEntryMetadata`) before the entry.
pub fn encode_payload_header_with(
    cmd: &BaseCommand,
    broker_entry_metadata: Option<&[u8]>,
    entry_len: usize,
    dst: &mut BytesMut,
) {
    let cmd_len = cmd.encoded_len();
    let bem_len = broker_entry_metadata.map_or(0, |b| 2 + 4 + b.len());
    dst.reserve(8 + cmd_len + bem_len);
    dst.put_u32((4 + cmd_len + bem_len + entry_len) as u32);
    dst.put_u32(cmd_len as u32);
    // Cannot fail: capacity was reserved above.
    let _ = cmd.encode(dst);
    if let Some(bem) = broker_entry_metadata {
        dst.put_u16(MAGIC_BROKER_ENTRY_METADATA);
        dst.put_u32(bem.len() as u32);
        dst.extend_from_slice(bem);
    }
}

/// Builds a checksummed entry (`0x0e01 ‖ CRC32C ‖ metadataSize ‖ metadata ‖
/// payload`) from its parts: what a producer sends and a broker stores.
pub fn entry_from_parts(metadata: &MessageMetadata, payload: &[u8]) -> Bytes {
    let meta_len = metadata.encoded_len();
    let mut out = BytesMut::with_capacity(ENTRY_CHECKSUM_HEADER_LEN + 4 + meta_len + payload.len());
    out.put_u16(MAGIC_CRC32C);
    out.put_u32(0); // patched below
    out.put_u32(meta_len as u32);
    // Cannot fail: capacity was reserved above.
    let _ = metadata.encode(&mut out);
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[ENTRY_CHECKSUM_HEADER_LEN..]);
    out[2..ENTRY_CHECKSUM_HEADER_LEN].copy_from_slice(&crc.to_be_bytes());
    out.freeze()
}

/// A verified entry: its metadata and where its payload lies.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedEntry {
    /// The producer's metadata.
    pub metadata: MessageMetadata,
    /// Byte range of the payload (a batch: `[u32 size ‖ SingleMessageMetadata
    /// ‖ payload]*`, possibly compressed) within the parsed entry.
    pub payload: Range<usize>,
}

impl ParsedEntry {
    /// Messages in the entry: `num_messages_in_batch` for a batch, else 1.
    /// Permits and unacked counts are per message (G11).
    pub fn num_messages(&self) -> u32 {
        // parse_entry rejected values below 1.
        self.metadata
            .num_messages_in_batch
            .map_or(1, |n| n.max(1) as u32)
    }

    /// Whether the entry is a batch (the metadata has `num_messages_in_batch`).
    pub fn is_batch(&self) -> bool {
        self.metadata.num_messages_in_batch.is_some()
    }

    /// The payload bytes of `entry` (the slice this was parsed from).
    pub fn payload<'a>(&self, entry: &'a [u8]) -> &'a [u8] {
        entry.get(self.payload.clone()).unwrap_or(&[])
    }
}

/// Verifies an entry's CRC32C and decodes its metadata. Errors on a missing
/// magic, inconsistent sizes, a checksum mismatch, undecodable metadata or a
/// `num_messages_in_batch` below 1.
pub fn parse_entry(entry: &[u8]) -> Result<ParsedEntry, FrameError> {
    if peek_u16(entry) != Some(MAGIC_CRC32C) {
        return Err(malformed(
            "entry does not start with the 0x0e01 checksum magic",
        ));
    }
    if entry.len() < ENTRY_CHECKSUM_HEADER_LEN {
        return Err(malformed("entry truncated in its checksum"));
    }
    let stored = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
    let section = &entry[ENTRY_CHECKSUM_HEADER_LEN..];
    let meta_len = check_metadata_size(section)?;
    let computed = crc32c::crc32c(section);
    if computed != stored {
        return Err(FrameError::ChecksumMismatch { stored, computed });
    }
    let meta_start = ENTRY_CHECKSUM_HEADER_LEN + 4;
    let meta_end = meta_start + meta_len;
    let metadata = MessageMetadata::decode(&entry[meta_start..meta_end])?;
    if let Some(n) = metadata.num_messages_in_batch
        && n < 1
    {
        return Err(malformed(format!("num_messages_in_batch is {n}")));
    }
    Ok(ParsedEntry {
        metadata,
        payload: meta_end..entry.len(),
    })
}

#[cfg(test)]
mod tests;
