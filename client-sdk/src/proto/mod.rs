//! The Pulsar binary protocol, shared by the broker and the SDK (STYLE §3):
//! nothing else in CMS defines Pulsar wire bytes.
//!
//! # Wire format
//! All integers are big-endian. A frame is `u32 totalSize` (bytes after
//! itself) followed by
//! - a simple command: `u32 commandSize ‖ BaseCommand`, or
//! - a payload command (SEND, MESSAGE): `u32 commandSize ‖ BaseCommand ‖
//!   [0x0e02 ‖ u32 size ‖ BrokerEntryMetadata] ‖ [0x0e01 ‖ u32 CRC32C] ‖
//!   u32 metadataSize ‖ MessageMetadata ‖ payload`. The broker entry metadata
//!   section appears only on MESSAGE; the CRC32C covers everything from
//!   `metadataSize` to the end and is optional on the wire (protocol < 6).
//!
//! The checksummed tail `0x0e01 ‖ CRC32C ‖ metadataSize ‖ MessageMetadata ‖
//! payload` is an *entry*: the broker stores a SEND's entry verbatim in a
//! ledger and writes it verbatim after a MESSAGE command, so payloads
//! (batches, compressed data) pass through untouched.
//!
//! # Modules
//! - [`pulsar`]: the prost types generated from `proto/pulsar_api.proto`, our
//!   own proto2 definition with the wire's field numbers, labels and defaults.
//!   Required fields are always encoded (G1), including zero values.
//! - [`frame`]: [`frame::PulsarCodec`] (tokio `Decoder`/`Encoder` of
//!   [`frame::Frame`]s) and the entry helpers ([`frame::entry_from_parts`],
//!   [`frame::parse_entry`]).
//! - [`batch`]: the batch payload format (`[u32 size ‖ SingleMessageMetadata
//!   ‖ payload]*`), [`batch::parse_batch`] and [`batch::encode_batched`].
//! - [`commands`]: constructors for every command the broker sends and the
//!   requests a client sends, plus [`commands::command_name`].
//!
//! # Promises
//! Declared sizes are checked against the frame limit ([`frame::FRAME_SIZE_MAX`]
//! by default) before any allocation; truncated input waits for more bytes;
//! any malformed input is a [`frame::FrameError`], never a panic, and the
//! caller closes only that connection (invariant 9).

pub mod batch;
pub mod commands;
pub mod frame;
pub mod pulsar;

pub use frame::{
    ChecksumState, FRAME_SIZE_MAX, Frame, FrameError, ParsedEntry, PayloadFrame, PulsarCodec,
};
