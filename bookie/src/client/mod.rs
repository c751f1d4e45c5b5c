//! The ledger client's protocol core, without I/O (STYLE §2).
//!
//! Everything here is a plain state machine in the style of raft-rs's
//! `RawNode`: the caller (the async driver, or the simulator in tests) feeds it
//! inputs — an add, a bookie's answer, a metadata update's result, the time —
//! and drains the actions it asks for — send these bytes to that bookie, run
//! this read-modify-CAS on the ledger's metadata, complete entry 7. Nothing in
//! this module opens a socket, reads a clock or spawns a task, so every rule
//! can be driven by one seed ([`sim`](self) in tests).
//!
//! | module | what it decides |
//! |---|---|
//! | [`quorum`] | write sets, ack quorum, the recovery predicates (absence, ensemble coverage) |
//! | [`metadata`] | pure helpers and the "modify" step of every read-modify-CAS of `LedgerMetadata` |
//! | [`writer`] | the write handle: ordered completion, ensemble change, fencing of the writer |
//! | [`recovery`] | fencing, read-forward, write-back and close of a ledger whose writer is gone |
//! | [`reader`] | which replica to read next, and the LAC a non-recovery reader may not pass |
//! | [`lac`] | the explicit-LAC body written by an idle writer |
//! | [`master_key`] | the key sent with adds and fences, derived from the ledger password |
//!
//! The one exception to "no I/O" is [`driver`]: the async driver that runs
//! these cores against real bookies and a real metadata store
//! ([`driver::LedgerClient`], the public entry point).
//!
//! # How a driver uses it
//!
//! 1. Create: [`metadata::new_ledger`] builds the metadata of a new ledger; the
//!    driver stores it and hands it to [`writer::Writer::new`].
//! 2. Loop: call an input method (`add`, `add_response`, `tick`, ...), then drain
//!    `poll_action` until it returns `None`, performing each action. Actions
//!    are plain data; their order within one drain is the order to perform
//!    them in. Time only enters through `tick(now_ms)` (monotonic ms): call it
//!    periodically (timeouts fire there) and before feeding other inputs, as
//!    requests the core sends are stamped with the last time it was given.
//! 3. Metadata: an action carrying a [`metadata::MetadataOp`] asks for a
//!    read-modify-CAS loop: read the node, call [`metadata::MetadataOp::apply`]
//!    on what was read, write the result with the version read as the expected
//!    version, on a version conflict read again and re-apply. Feed the final
//!    outcome back (`metadata_result`).
//! 4. Replacements: an action carrying an [`EnsembleChangeRequest`] asks the
//!    driver's placement policy for bookies outside the current ensemble; feed
//!    the choice back with `replacements_chosen` (an empty list when none is
//!    available: the core then keeps writing while the ack quorum can be met).
//!
//! Invariants of DESIGN §4 enforced here: 1 (ack = Qa of the entry's current
//! write set and every earlier entry completed: [`writer`]), 2 (a fenced writer
//! stops: [`writer`]), 3 (absence only from explicit negatives of fenced
//! bookies, recovery starts at max(LAC, first entry of the last segment − 1):
//! [`quorum`], [`recovery`]), 4 (readers stop at LAC: [`reader`]).

pub mod driver;
pub use cms_bookie_format::lac;
pub mod master_key;
pub mod metadata;
pub mod quorum;
pub mod reader;
pub mod recovery;
mod replicate;
pub mod writer;

#[cfg(test)]
mod sim;

use crate::proto::bookie::StatusCode;

/// A bookie's id as the metadata names it (opaque; not an address).
pub type BookieId = String;

/// An entry id in a ledger: 0, 1, ...; −1 means "none" (an empty ledger, no LAC).
pub type EntryId = i64;

/// The core's view of a bookie's answer to one request.
///
/// The wire codes of [`StatusCode`] map onto it with [`BookieStatus::from_wire`];
/// `Timeout` is never sent by a bookie: the driver reports it when a request
/// got no answer in time (or the connection broke).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BookieStatus {
    /// Success.
    Ok,
    /// The ledger is known but this entry is not stored (an explicit negative).
    NoEntry,
    /// The bookie holds nothing of this ledger (an explicit negative).
    NoLedger,
    /// The ledger is fenced: a normal add was refused.
    Fenced,
    /// The master key does not match.
    Unauthorized,
    /// The bookie may have lost this ledger (limbo): neither present nor absent.
    UnknownState,
    /// Any other failure (I/O, bad request, read-only, too many requests).
    Error,
    /// No answer in time, or the connection broke.
    Timeout,
}

impl BookieStatus {
    /// Maps a wire status code onto the core's answer.
    pub fn from_wire(code: StatusCode) -> BookieStatus {
        match code {
            StatusCode::Ok => BookieStatus::Ok,
            StatusCode::NoEntry => BookieStatus::NoEntry,
            StatusCode::NoLedger => BookieStatus::NoLedger,
            StatusCode::Fenced => BookieStatus::Fenced,
            StatusCode::Unauthorized => BookieStatus::Unauthorized,
            StatusCode::UnknownLedgerState => BookieStatus::UnknownState,
            StatusCode::BadRequest
            | StatusCode::IoError
            | StatusCode::ReadOnly
            | StatusCode::TooManyRequests => BookieStatus::Error,
        }
    }

    /// An explicit "not here" (NoEntry or NoLedger): the only answers that may
    /// count as absence (DESIGN §4 invariant 3).
    pub fn is_negative(self) -> bool {
        matches!(self, BookieStatus::NoEntry | BookieStatus::NoLedger)
    }
}

/// One bookie of an ensemble replaced by another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    /// The bookie leaving the ensemble.
    pub old: BookieId,
    /// The bookie taking its slot.
    pub new: BookieId,
}

/// A request to the driver's placement policy: choose a replacement for each
/// of `failed`, outside `ensemble` (and outside `failed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsembleChangeRequest {
    /// The first entry the new ensemble would hold (the first entry not yet
    /// completed).
    pub first_entry_id: EntryId,
    /// The current ensemble (of the last segment).
    pub ensemble: Vec<BookieId>,
    /// Bookies of `ensemble` that failed and should be replaced.
    pub failed: Vec<BookieId>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_codes_map_to_core_answers_and_only_no_entry_and_no_ledger_are_negative() {
        let cases = [
            (StatusCode::Ok, BookieStatus::Ok, false),
            (StatusCode::NoEntry, BookieStatus::NoEntry, true),
            (StatusCode::NoLedger, BookieStatus::NoLedger, true),
            (StatusCode::Fenced, BookieStatus::Fenced, false),
            (StatusCode::Unauthorized, BookieStatus::Unauthorized, false),
            (
                StatusCode::UnknownLedgerState,
                BookieStatus::UnknownState,
                false,
            ),
            (StatusCode::IoError, BookieStatus::Error, false),
            (StatusCode::BadRequest, BookieStatus::Error, false),
            (StatusCode::ReadOnly, BookieStatus::Error, false),
            (StatusCode::TooManyRequests, BookieStatus::Error, false),
        ];
        for (wire, core, negative) in cases {
            assert_eq!(BookieStatus::from_wire(wire), core, "{wire:?}");
            assert_eq!(core.is_negative(), negative, "{wire:?}");
        }
        assert!(!BookieStatus::Timeout.is_negative());
    }
}
