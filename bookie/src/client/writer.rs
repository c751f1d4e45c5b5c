//! The write handle of one ledger, as a sans-I/O state machine.
//!
//! The driver feeds inputs ([`Writer::add`], [`Writer::add_response`],
//! [`Writer::bookie_failed`], [`Writer::replacements_chosen`],
//! [`Writer::metadata_result`], [`Writer::close`], [`Writer::tick`]) and drains
//! [`Writer::poll_action`] after each, performing the [`WriterAction`]s in order.
//!
//! Promises:
//! - **ordered acks** (DESIGN §4 invariant 1): [`WriterAction::Completed`] for
//!   entry `e` comes only after Qa bookies of `e`'s write set in the current
//!   metadata acknowledged it, and after the completion of every earlier entry;
//! - **ensemble change** (reference §1.3, BookKeeper #4651): a failed or timed
//!   out bookie is replaced by a new segment starting at the first entry not
//!   yet completed; acks from the replaced bookie stop counting from there on,
//!   and pending entries are re-sent to the replacement. Without a replacement
//!   the writer goes on while every write set can still reach Qa
//!   ([`WriterAction::UnderReplicated`]) and fails only when one cannot;
//! - **fencing** (invariant 2): after a FENCED answer, or a metadata update
//!   showing the ledger is no longer OPEN, every outstanding add fails and no
//!   entry ever completes again;
//! - **bounded**: at most `outstanding_adds_max` adds and
//!   `outstanding_bytes_max` payload bytes in flight; beyond, `add` answers
//!   [`AddError::Backpressure`];
//! - every entry is built with [`Entry::encode`] with the LAC and cumulative
//!   length piggybacked; an idle writer sends its LAC explicitly.

use std::collections::VecDeque;

use bytes::Bytes;
use tracing::{info, warn};

use super::lac::encode_explicit_lac;
use super::master_key::master_key;
use super::metadata::{
    EnsembleChange, MetadataError, MetadataOp, UpdateError, Updater, last_segment, status, validate,
};
use super::replicate::{ReplEvent, ReplFatal, Replicator};
use super::{BookieId, BookieStatus, EnsembleChangeRequest, EntryId, Replacement};
use crate::entry::{Entry, EntryHeader};
use crate::proto::metadata::{LedgerMetadata, LedgerStatus};

/// Bounds and timers of a writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterConfig {
    /// Adds in flight (sent, not completed) before `add` pushes back.
    pub outstanding_adds_max: usize,
    /// Payload bytes in flight before `add` pushes back.
    pub outstanding_bytes_max: u64,
    /// Largest payload of one add (the bookie protocol's frame bound).
    pub entry_payload_bytes_max: usize,
    /// An add unanswered by a bookie for this long fails that bookie
    /// (0 = never; the driver then reports failures itself).
    pub add_timeout_ms: u64,
    /// An idle writer sends its LAC explicitly after this long (0 = never).
    pub explicit_lac_interval_ms: u64,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            outstanding_adds_max: 1000,
            outstanding_bytes_max: 64 * 1024 * 1024,
            // What a bookie accepts by default, less the entry header and
            // digest: a Pulsar message of the default 5 MiB plus its metadata
            // and frame padding fits.
            entry_payload_bytes_max: crate::server::core::ENTRY_BYTES_MAX_DEFAULT
                - crate::entry::PREFIX_BYTES,
            add_timeout_ms: 5000,
            explicit_lac_interval_ms: 1000,
        }
    }
}

/// Why the writer stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriterError {
    /// The ledger was fenced (a bookie answered FENCED, or its metadata is no
    /// longer OPEN): another client is recovering or closed it.
    #[error("ledger fenced: another client recovered or closed it")]
    Fenced,
    /// A bookie refused the master key.
    #[error("a bookie refused the ledger's master key")]
    Unauthorized,
    /// Some write set can no longer gather an ack quorum and no replacement
    /// bookie is available.
    #[error("not enough bookies to reach the ack quorum")]
    NotEnoughBookies,
    /// A metadata update failed for another reason.
    #[error("metadata update failed: {0}")]
    Metadata(UpdateError),
    /// The metadata handed to [`Writer::new`] is unusable.
    #[error("invalid metadata: {0}")]
    InvalidMetadata(MetadataError),
    /// [`Writer::new`] needs an OPEN, empty ledger.
    #[error("ledger is not open and empty")]
    NotWritable,
}

/// Why one add was refused (nothing was sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddError {
    /// Too many adds or bytes in flight: retry after completions.
    #[error("backpressure: {outstanding_adds} adds / {outstanding_bytes} bytes outstanding")]
    Backpressure {
        /// Adds in flight.
        outstanding_adds: usize,
        /// Payload bytes in flight.
        outstanding_bytes: u64,
    },
    /// The payload is above `entry_payload_bytes_max`.
    #[error("payload of {bytes} bytes above the {max}-byte bound")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The bound.
        max: usize,
    },
    /// `close` was called.
    #[error("writer is closing")]
    Closing,
    /// The writer failed.
    #[error(transparent)]
    Failed(WriterError),
}

/// What the driver must do next; perform in the order polled.
#[derive(Debug, Clone, PartialEq)]
pub enum WriterAction {
    /// Send an add (no RECOVERY_ADD flag) with [`Writer::master_key`]; feed the
    /// answer to [`Writer::add_response`].
    SendAdd {
        /// Target bookie.
        bookie: BookieId,
        /// The entry.
        entry_id: EntryId,
        /// Entry bytes ([`Entry::encode`]).
        body: Bytes,
    },
    /// Send an explicit LAC (`WriteLac`); the answer needs no feedback.
    SendWriteLac {
        /// Target bookie.
        bookie: BookieId,
        /// The LAC.
        lac: EntryId,
        /// Body from [`encode_explicit_lac`].
        body: Bytes,
    },
    /// Entry `entry_id` is durable on an ack quorum, as is every earlier
    /// entry: complete the application's add. Comes in entry order.
    Completed {
        /// The entry.
        entry_id: EntryId,
        /// Ledger length in payload bytes up to and including it.
        length: u64,
    },
    /// Ask placement for replacements of `failed`; answer with
    /// [`Writer::replacements_chosen`].
    ChooseReplacements(EnsembleChangeRequest),
    /// Run this read-modify-CAS; answer with [`Writer::metadata_result`].
    UpdateMetadata(MetadataOp),
    /// Writing goes on without these bookies of the ensemble: record the
    /// ledger as under-replicated for autorecovery.
    UnderReplicated {
        /// Failed bookies left in the ensemble.
        bookies: Vec<BookieId>,
    },
    /// The ledger is closed.
    Closed {
        /// Its last entry (−1 = empty).
        last_entry_id: EntryId,
        /// Its length.
        length: u64,
    },
    /// The writer stopped: adds `first_entry_id..=last_entry_id` (possibly an
    /// empty range) fail with `error`; nothing completes after this.
    Failed {
        /// Why.
        error: WriterError,
        /// First failed add.
        first_entry_id: EntryId,
        /// Last failed add.
        last_entry_id: EntryId,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Open,
    /// `close` called; waiting for outstanding adds.
    Closing,
    /// Close CAS sent.
    CloseInFlight,
    Closed,
    Failed(WriterError),
}

/// The write handle (see the module doc).
#[derive(Debug)]
pub struct Writer {
    ledger_id: u64,
    master_key: Bytes,
    config: WriterConfig,
    repl: Replicator,
    next_entry_id: EntryId,
    /// Payload bytes of every submitted entry.
    submitted_length: u64,
    /// Ledger length at the last completed entry.
    completed_length: u64,
    outstanding_bytes: u64,
    /// Payload size of each outstanding entry, oldest first.
    outstanding_sizes: VecDeque<u64>,
    state: State,
    metadata_in_flight: Option<MetadataOp>,
    /// Failed bookies placement found no replacement for, applied after the
    /// ensemble change of the others lands.
    unplaced_after_change: Vec<BookieId>,
    explicit_lac_sent: EntryId,
    last_activity_ms: u64,
    now_ms: u64,
    out: VecDeque<WriterAction>,
}

impl Writer {
    /// A writer for a freshly created (OPEN, empty) ledger.
    pub fn new(md: LedgerMetadata, config: WriterConfig) -> Result<Writer, WriterError> {
        let spec = validate(&md).map_err(WriterError::InvalidMetadata)?;
        if status(&md).ok() != Some(LedgerStatus::LedgerOpen) || md.segments.len() != 1 {
            return Err(WriterError::NotWritable);
        }
        let key = master_key(&md.password);
        Ok(Writer {
            ledger_id: md.ledger_id,
            master_key: key,
            repl: Replicator::new(md, spec, -1, false, config.add_timeout_ms, 0),
            config,
            next_entry_id: 0,
            submitted_length: 0,
            completed_length: 0,
            outstanding_bytes: 0,
            outstanding_sizes: VecDeque::new(),
            state: State::Open,
            metadata_in_flight: None,
            unplaced_after_change: Vec::new(),
            explicit_lac_sent: -1,
            last_activity_ms: 0,
            now_ms: 0,
            out: VecDeque::new(),
        })
    }

    /// The ledger.
    pub fn ledger_id(&self) -> u64 {
        self.ledger_id
    }

    /// The master key to send with every add and explicit LAC.
    pub fn master_key(&self) -> &Bytes {
        &self.master_key
    }

    /// Last add confirmed: the highest completed entry (−1 = none).
    pub fn lac(&self) -> EntryId {
        self.repl.last_completed()
    }

    /// Ledger length at the LAC.
    pub fn length(&self) -> u64 {
        self.completed_length
    }

    /// The writer's current view of the metadata.
    pub fn metadata(&self) -> &LedgerMetadata {
        self.repl.metadata()
    }

    /// Adds in flight.
    pub fn outstanding_adds(&self) -> usize {
        self.repl.pending_len()
    }

    /// Why the writer stopped, if it did.
    pub fn error(&self) -> Option<&WriterError> {
        match &self.state {
            State::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the ledger was closed by this writer.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// The next action to perform, if any.
    pub fn poll_action(&mut self) -> Option<WriterAction> {
        self.out.pop_front()
    }

    /// Appends `payload` as the next entry; returns its id. Its completion is
    /// reported later by [`WriterAction::Completed`].
    pub fn add(&mut self, payload: &[u8]) -> Result<EntryId, AddError> {
        match &self.state {
            State::Open => {}
            State::Failed(e) => return Err(AddError::Failed(e.clone())),
            State::Closing | State::CloseInFlight | State::Closed => return Err(AddError::Closing),
        }
        if payload.len() > self.config.entry_payload_bytes_max {
            return Err(AddError::TooLarge {
                bytes: payload.len(),
                max: self.config.entry_payload_bytes_max,
            });
        }
        let bytes = payload.len() as u64;
        if self.repl.pending_len() >= self.config.outstanding_adds_max
            || (self.outstanding_bytes > 0
                && self.outstanding_bytes + bytes > self.config.outstanding_bytes_max)
        {
            return Err(AddError::Backpressure {
                outstanding_adds: self.repl.pending_len(),
                outstanding_bytes: self.outstanding_bytes,
            });
        }
        let entry_id = self.next_entry_id;
        self.next_entry_id += 1;
        self.submitted_length += bytes;
        self.outstanding_bytes += bytes;
        self.outstanding_sizes.push_back(bytes);
        let body = Entry::encode(
            EntryHeader {
                ledger_id: self.ledger_id,
                entry_id,
                lac: self.repl.last_completed(),
                length: self.submitted_length,
            },
            payload,
        );
        self.last_activity_ms = self.now_ms;
        self.repl.submit(entry_id, body, self.submitted_length);
        self.pump();
        Ok(entry_id)
    }

    /// A bookie's answer to an add of `entry_id`.
    pub fn add_response(&mut self, bookie: &str, entry_id: EntryId, status: BookieStatus) {
        self.repl.add_response(bookie, entry_id, status);
        self.pump();
    }

    /// A bookie of the ensemble failed (connection broken, timeout the driver
    /// measured itself).
    pub fn bookie_failed(&mut self, bookie: &str) {
        self.repl.bookie_failed(bookie);
        self.pump();
    }

    /// Placement's answer to [`WriterAction::ChooseReplacements`]: one
    /// replacement per failed bookie it could place (possibly none).
    pub fn replacements_chosen(&mut self, replacements: Vec<Replacement>) {
        let Some(req) = self.repl.change_in_flight().cloned() else {
            return;
        };
        if !matches!(self.state, State::Open | State::Closing) {
            return;
        }
        let placed: Vec<Replacement> = replacements
            .into_iter()
            .filter(|r| req.failed.contains(&r.old) && !req.ensemble.contains(&r.new))
            .collect();
        let unplaced: Vec<BookieId> = req
            .failed
            .iter()
            .filter(|b| !placed.iter().any(|r| &r.old == *b))
            .cloned()
            .collect();
        if placed.is_empty() {
            warn!(ledger = self.ledger_id, ?unplaced, "no replacement bookie");
            self.repl.no_replacement(&unplaced);
        } else {
            let op = MetadataOp::ChangeEnsemble(EnsembleChange {
                first_entry_id: req.first_entry_id,
                replacements: placed,
            });
            if !unplaced.is_empty() {
                // Remember them as unplaceable once the change lands.
                self.unplaced_after_change = unplaced;
            }
            self.metadata_in_flight = Some(op.clone());
            self.out.push_back(WriterAction::UpdateMetadata(op));
        }
        self.pump();
    }

    /// The outcome of the last [`WriterAction::UpdateMetadata`]: the metadata
    /// as stored after it, or why it failed.
    pub fn metadata_result(&mut self, result: Result<LedgerMetadata, UpdateError>) {
        let Some(op) = self.metadata_in_flight.take() else {
            return;
        };
        match (op, result) {
            (MetadataOp::ChangeEnsemble(_), Ok(md)) => {
                info!(
                    ledger = self.ledger_id,
                    first_entry = last_segment(&md).map_or(-1, |s| s.first_entry_id),
                    "ensemble changed"
                );
                let unplaced = std::mem::take(&mut self.unplaced_after_change);
                self.repl.ensemble_changed(md);
                if !unplaced.is_empty() {
                    self.repl.no_replacement(&unplaced);
                }
            }
            (MetadataOp::Close { .. }, Ok(md)) => {
                self.state = State::Closed;
                info!(
                    ledger = self.ledger_id,
                    last_entry = md.last_entry_id,
                    "ledger closed"
                );
                self.out.push_back(WriterAction::Closed {
                    last_entry_id: md.last_entry_id,
                    length: md.length,
                });
            }
            (_, Err(e)) => {
                let error = match e {
                    UpdateError::Fenced { .. }
                    | UpdateError::Closed { .. }
                    | UpdateError::ClosedDifferently { .. }
                    | UpdateError::NotInRecovery => WriterError::Fenced,
                    other => WriterError::Metadata(other),
                };
                self.fail(error);
            }
            (MetadataOp::MarkInRecovery, Ok(_)) => {}
        }
        self.pump();
    }

    /// Closes the ledger once every outstanding add completed (or fails them
    /// if the writer fails meanwhile). New adds are refused from now on.
    pub fn close(&mut self) {
        if self.state == State::Open {
            self.state = State::Closing;
            self.pump();
        }
    }

    /// Advances time: add timeouts and the explicit LAC of an idle writer.
    pub fn tick(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        self.repl.tick(self.now_ms);
        self.pump();
        let lac = self.repl.last_completed();
        if self.state == State::Open
            && self.config.explicit_lac_interval_ms > 0
            && self.repl.pending_len() == 0
            && lac > self.explicit_lac_sent
            && self.now_ms.saturating_sub(self.last_activity_ms)
                >= self.config.explicit_lac_interval_ms
        {
            self.explicit_lac_sent = lac;
            let body = encode_explicit_lac(self.ledger_id, lac);
            for bookie in self.repl.live_ensemble() {
                self.out.push_back(WriterAction::SendWriteLac {
                    bookie,
                    lac,
                    body: body.clone(),
                });
            }
        }
    }

    fn fail(&mut self, error: WriterError) {
        if matches!(self.state, State::Failed(_) | State::Closed) {
            return;
        }
        warn!(ledger = self.ledger_id, %error, "writer failed");
        self.state = State::Failed(error.clone());
        self.out.push_back(WriterAction::Failed {
            error,
            first_entry_id: self.repl.last_completed() + 1,
            last_entry_id: self.next_entry_id - 1,
        });
    }

    /// Moves replicator events to actions and advances closing.
    fn pump(&mut self) {
        while let Some(ev) = self.repl.poll() {
            if matches!(self.state, State::Failed(_)) {
                continue;
            }
            match ev {
                ReplEvent::Send {
                    bookie,
                    entry_id,
                    body,
                } => self.out.push_back(WriterAction::SendAdd {
                    bookie,
                    entry_id,
                    body,
                }),
                ReplEvent::Completed { entry_id, length } => {
                    self.completed_length = length;
                    if let Some(b) = self.outstanding_sizes.pop_front() {
                        self.outstanding_bytes -= b;
                    }
                    self.last_activity_ms = self.now_ms;
                    self.out
                        .push_back(WriterAction::Completed { entry_id, length });
                }
                ReplEvent::NeedReplacements(req) => {
                    self.out.push_back(WriterAction::ChooseReplacements(req))
                }
                ReplEvent::UnderReplicated(bookies) => self
                    .out
                    .push_back(WriterAction::UnderReplicated { bookies }),
                ReplEvent::Fatal(f) => self.fail(match f {
                    ReplFatal::Fenced => WriterError::Fenced,
                    ReplFatal::Unauthorized => WriterError::Unauthorized,
                    ReplFatal::NotEnoughBookies => WriterError::NotEnoughBookies,
                }),
            }
        }
        if self.state == State::Closing
            && self.repl.pending_len() == 0
            && self.repl.change_in_flight().is_none()
            && self.metadata_in_flight.is_none()
        {
            self.state = State::CloseInFlight;
            let op = MetadataOp::Close {
                last_entry_id: self.repl.last_completed(),
                length: self.completed_length,
                by: Updater::Writer,
                ensemble_changes: Vec::new(),
            };
            self.metadata_in_flight = Some(op.clone());
            self.out.push_back(WriterAction::UpdateMetadata(op));
        }
    }
}

#[cfg(test)]
mod tests;
