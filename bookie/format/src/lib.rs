//! `cms-bookie-format`: every byte format the bookie reads from the network
//! or from disk, as pure encode / decode functions with no I/O and few
//! dependencies (bytes, crc32c, prost), so they can be fuzzed on their own.
//!
//! | module | what it is |
//! |---|---|
//! | [`entry`] | the entry format (32-byte header, CRC32C, payload; DESIGN §2) |
//! | [`journal`] | journal records, file header, checkpoint, and the replay's scan of one file |
//! | [`entry_log`] | entry-log records |
//! | [`lac`] | the explicit-LAC body (`WriteLac` / `ReadLac`) |
//! | [`proto`] | the bookie protocol and metadata messages, generated from `proto/` |
//!
//! Promise: every decoder takes untrusted bytes, never panics, and never
//! allocates more than its input (plus a bounded constant); bad bytes are an
//! error value. The `cms-bookie` crate re-exports these modules under their
//! old paths (`cms_bookie::entry`, `cms_bookie::proto`).

pub mod entry;
pub mod entry_log;
pub mod journal;
pub mod lac;
pub mod proto;
