//! Ledger recovery (open with recovery), as a sans-I/O state machine,
//! following the reference's step list (§1.6) with the later fixes.
//!
//! Steps and what each promises:
//! 1. **Mark**: CAS OPEN → IN_RECOVERY ([`MetadataOp::MarkInRecovery`]); the old
//!    writer's metadata updates fail from then on. A CLOSED ledger needs
//!    nothing; an IN_RECOVERY one (a concurrent recovery) is recovered again.
//! 2. **Fence**: every bookie of the last segment gets a fencing read of entry
//!    −1 (plus its LAC), re-sent on errors and timeouts, until ensemble
//!    coverage ([`QuorumSpec::ensemble_covered`]): no ack quorum can then form
//!    without a fenced bookie. The highest LAC answered is kept.
//! 3. **Clamp**: start = max(LAC, first entry of the last segment − 1); earlier
//!    segments are immutable (BookKeeper #2615).
//! 4. **Read forward** from start + 1, one entry at a time, from its write set,
//!    **with the FENCE flag** (BookKeeper #2614/#2616): present on any
//!    digest-valid copy, absent only on Qw − Qa + 1 explicit negatives; any
//!    other outcome is retried up to a bound, then recovery aborts — never
//!    "absent" (DESIGN §4 invariant 3). Reads always use the ensemble the old
//!    writer used (the metadata as marked), never recovery's own replacements:
//!    a replacement's "no entry" proves nothing about what the writer acked.
//! 5. **Write back** each present entry with RECOVERY_ADD to its write set,
//!    until Qa of the write set acked. A failing bookie may be replaced
//!    (ensemble change); the new segments are only *proposed* and published
//!    atomically with the close, after the entries they hold reached Qa on
//!    them, so a concurrent recovery never reads a segment missing data.
//! 6. **Close** at the last present entry with its length, in one CAS with the
//!    proposed segments. If another recovery closed the ledger first, its
//!    result is adopted: concurrent recoveries converge on what the metadata
//!    says.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use tracing::{info, warn};

use super::lac::decode_explicit_lac;
use super::master_key::master_key;
use super::metadata::{
    EnsembleChange, MetadataError, MetadataOp, Update, UpdateError, Updater, change_ensemble,
    last_segment, status, validate, write_set_bookies,
};
use super::quorum::{QuorumSpec, ReadAnswer, ReadDecision, fence_answer_known};
use super::replicate::{ReplEvent, ReplFatal, Replicator};
use super::{BookieId, BookieStatus, EnsembleChangeRequest, EntryId, Replacement};
use crate::entry::Entry;
use crate::proto::metadata::{LedgerMetadata, LedgerStatus};

/// Bounds and timers of a recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// A fence or read unanswered for this long counts as a timeout.
    pub read_timeout_ms: u64,
    /// Rounds of re-sending a fence to one bookie, or reads of one entry,
    /// before recovery gives up (it is then retried from the start).
    pub attempts_max: u32,
    /// A write-back add unanswered this long fails its bookie.
    pub add_timeout_ms: u64,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            read_timeout_ms: 5000,
            attempts_max: 5,
            add_timeout_ms: 5000,
        }
    }
}

/// A bookie's answer to a fence: the fencing read's status, and what it knows
/// of the LAC (from `ReadLac`: the explicit LAC body and its last entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceAnswer {
    /// Status of the fencing read.
    pub status: BookieStatus,
    /// The bookie's last stored entry, if any (its header carries the LAC).
    pub last_entry: Option<Bytes>,
    /// The explicit LAC body, if any.
    pub explicit_lac: Option<Bytes>,
}

/// How a recovery ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// The ledger's last entry as closed (−1 = empty).
    pub last_entry_id: EntryId,
    /// Its length.
    pub length: u64,
    /// False when the ledger was already closed (by its writer or another
    /// recovery) and that result was adopted.
    pub closed_by_us: bool,
}

/// Why a recovery gave up (the driver may start a new one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    /// The metadata is unusable.
    #[error("invalid metadata: {0}")]
    InvalidMetadata(MetadataError),
    /// A metadata update failed.
    #[error("metadata update failed: {0}")]
    Metadata(UpdateError),
    /// A bookie refused the master key.
    #[error("bookie {0} refused the master key")]
    Unauthorized(BookieId),
    /// Fencing could not reach ensemble coverage within its attempts.
    #[error("fencing did not reach ensemble coverage")]
    FenceIncomplete,
    /// An entry was neither found nor proven absent within the attempts.
    #[error("entry {0} neither found nor proven absent")]
    ReadUndecided(EntryId),
    /// An entry at or below the LAC was proven absent: data was lost.
    #[error("entry {0} at or below the LAC is missing")]
    AckedEntryMissing(EntryId),
    /// Write-back could not reach an ack quorum.
    #[error("write-back cannot reach an ack quorum")]
    WriteBackFailed,
}

/// What the driver must do next; perform in the order polled.
#[derive(Debug, Clone, PartialEq)]
pub enum RecoveryAction {
    /// Run this read-modify-CAS; answer with [`Recovery::metadata_result`].
    UpdateMetadata(MetadataOp),
    /// Fence the ledger on `bookie` (read entry −1 with FENCE and the master
    /// key) and read its LAC; answer with [`Recovery::fence_response`].
    SendFence {
        /// Target bookie.
        bookie: BookieId,
    },
    /// Read one entry (with FENCE and the master key when `fence`); answer
    /// with [`Recovery::read_response`].
    SendRead {
        /// Target bookie.
        bookie: BookieId,
        /// The entry.
        entry_id: EntryId,
        /// Set the FENCE flag.
        fence: bool,
    },
    /// Add with the RECOVERY_ADD flag; answer with [`Recovery::add_response`].
    SendAdd {
        /// Target bookie.
        bookie: BookieId,
        /// The entry.
        entry_id: EntryId,
        /// Entry bytes exactly as read.
        body: Bytes,
    },
    /// Ask placement for replacements; answer with
    /// [`Recovery::replacements_chosen`].
    ChooseReplacements(EnsembleChangeRequest),
    /// Recovery is over.
    Finished(Result<Recovered, RecoveryError>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Marking,
    Fencing,
    Reading,
    Closing,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FenceState {
    Pending { sent_ms: u64 },
    Known,
    Unknown,
}

#[derive(Debug)]
struct FenceSlot {
    bookie: BookieId,
    state: FenceState,
    attempts: u32,
}

#[derive(Debug)]
struct EntryRead {
    entry_id: EntryId,
    /// Only the length of this entry is wanted (the start entry, at or below
    /// the LAC): it is not written back, and absence is data loss.
    probe: bool,
    bookies: Vec<BookieId>,
    answers: Vec<Option<ReadAnswer>>,
    sent_ms: Vec<u64>,
    attempts: u32,
    found: Option<Bytes>,
}

/// The recovery state machine (see the module doc).
#[derive(Debug)]
pub struct Recovery {
    ledger_id: u64,
    master_key: Bytes,
    config: RecoveryConfig,
    md: LedgerMetadata,
    spec: QuorumSpec,
    /// The metadata as marked IN_RECOVERY: the ensemble the writer used.
    read_md: Option<LedgerMetadata>,
    phase: Phase,
    fence: Vec<FenceSlot>,
    max_lac: EntryId,
    /// Lengths learned from fence answers' last entries.
    known_lengths: BTreeMap<EntryId, u64>,
    start: EntryId,
    reading: Option<EntryRead>,
    last_present: EntryId,
    last_present_length: u64,
    end_found: bool,
    repl: Option<Replicator>,
    changes: Vec<EnsembleChange>,
    fence_reads: bool,
    now_ms: u64,
    out: VecDeque<RecoveryAction>,
}

impl Recovery {
    /// A recovery of the ledger with this metadata (as just read).
    pub fn new(md: LedgerMetadata, config: RecoveryConfig) -> Result<Recovery, RecoveryError> {
        let spec = validate(&md).map_err(RecoveryError::InvalidMetadata)?;
        Ok(Recovery {
            ledger_id: md.ledger_id,
            master_key: master_key(&md.password),
            config,
            md,
            spec,
            read_md: None,
            phase: Phase::Idle,
            fence: Vec::new(),
            max_lac: -1,
            known_lengths: BTreeMap::new(),
            start: -1,
            reading: None,
            last_present: -1,
            last_present_length: 0,
            end_found: false,
            repl: None,
            changes: Vec::new(),
            fence_reads: true,
            now_ms: 0,
            out: VecDeque::new(),
        })
    }

    /// Test-only knob: read forward WITHOUT the FENCE flag, the behaviour
    /// before BookKeeper #2616, to show the simulation catches #2614.
    #[cfg(test)]
    pub(crate) fn disable_read_fence_for_test(&mut self) {
        self.fence_reads = false;
    }

    /// The ledger.
    pub fn ledger_id(&self) -> u64 {
        self.ledger_id
    }

    /// The master key to send with fences, fencing reads and recovery adds.
    pub fn master_key(&self) -> &Bytes {
        &self.master_key
    }

    /// Whether recovery is over.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The next action to perform, if any.
    pub fn poll_action(&mut self) -> Option<RecoveryAction> {
        self.out.pop_front()
    }

    /// Starts: marks the ledger IN_RECOVERY (or finishes at once if closed).
    pub fn start(&mut self) {
        if self.phase != Phase::Idle {
            return;
        }
        if status(&self.md).ok() == Some(LedgerStatus::LedgerClosed) {
            let (last_entry_id, length) = (self.md.last_entry_id, self.md.length);
            self.finish(Ok(Recovered {
                last_entry_id,
                length,
                closed_by_us: false,
            }));
            return;
        }
        self.phase = Phase::Marking;
        self.out
            .push_back(RecoveryAction::UpdateMetadata(MetadataOp::MarkInRecovery));
    }

    /// The outcome of the last [`RecoveryAction::UpdateMetadata`].
    pub fn metadata_result(&mut self, result: Result<LedgerMetadata, UpdateError>) {
        match (self.phase, result) {
            (Phase::Marking, Ok(md)) => match validate(&md) {
                Ok(spec) if status(&md).ok() == Some(LedgerStatus::LedgerInRecovery) => {
                    self.spec = spec;
                    self.md = md.clone();
                    self.read_md = Some(md);
                    self.begin_fencing();
                }
                Ok(_) => self.finish(Err(RecoveryError::Metadata(UpdateError::NotInRecovery))),
                Err(e) => self.finish(Err(RecoveryError::InvalidMetadata(e))),
            },
            (Phase::Closing, Ok(md)) => {
                let ours = md.last_entry_id == self.last_present;
                info!(
                    ledger = self.ledger_id,
                    last_entry = md.last_entry_id,
                    "ledger recovered and closed"
                );
                self.finish(Ok(Recovered {
                    last_entry_id: md.last_entry_id,
                    length: md.length,
                    closed_by_us: ours,
                }));
            }
            (
                Phase::Marking | Phase::Closing,
                Err(
                    UpdateError::Closed {
                        last_entry_id,
                        length,
                    }
                    | UpdateError::ClosedDifferently {
                        last_entry_id,
                        length,
                    },
                ),
            ) => {
                if self.phase == Phase::Closing {
                    warn!(
                        ledger = self.ledger_id,
                        ours = self.last_present,
                        theirs = last_entry_id,
                        "ledger closed by another client first; adopting its end"
                    );
                }
                self.finish(Ok(Recovered {
                    last_entry_id,
                    length,
                    closed_by_us: false,
                }));
            }
            (Phase::Marking | Phase::Closing, Err(e)) => {
                self.finish(Err(RecoveryError::Metadata(e)))
            }
            _ => {}
        }
    }

    /// A bookie's answer to [`RecoveryAction::SendFence`].
    pub fn fence_response(&mut self, bookie: &str, answer: FenceAnswer) {
        if self.phase != Phase::Fencing {
            return;
        }
        let Some(i) = self.fence.iter().position(|s| s.bookie == bookie) else {
            return;
        };
        if !matches!(self.fence[i].state, FenceState::Pending { .. }) {
            return;
        }
        if answer.status == BookieStatus::Unauthorized {
            self.finish(Err(RecoveryError::Unauthorized(bookie.to_string())));
            return;
        }
        if fence_answer_known(answer.status) {
            self.fence[i].state = FenceState::Known;
            if answer.status == BookieStatus::Ok {
                self.learn_lac(&answer);
            }
        } else {
            self.fence[i].state = FenceState::Unknown;
            self.fence[i].attempts += 1;
            if self.fence[i].attempts < self.config.attempts_max {
                self.fence[i].state = FenceState::Pending {
                    sent_ms: self.now_ms,
                };
                self.out.push_back(RecoveryAction::SendFence {
                    bookie: bookie.to_string(),
                });
            }
        }
        self.check_fencing();
    }

    /// A bookie's answer to [`RecoveryAction::SendRead`]; `body` is the entry
    /// bytes of an `Ok` answer.
    pub fn read_response(
        &mut self,
        bookie: &str,
        entry_id: EntryId,
        status: BookieStatus,
        body: Option<Bytes>,
    ) {
        if self.phase != Phase::Reading {
            return;
        }
        let ledger_id = self.ledger_id;
        let Some(r) = self.reading.as_mut() else {
            return;
        };
        if r.entry_id != entry_id {
            return;
        }
        let Some(i) = r.bookies.iter().position(|b| b == bookie) else {
            return;
        };
        if r.answers[i].is_some() {
            return;
        }
        if status == BookieStatus::Unauthorized {
            self.finish(Err(RecoveryError::Unauthorized(bookie.to_string())));
            return;
        }
        let valid = match (status, &body) {
            (BookieStatus::Ok, Some(b)) => {
                match Entry::decode_expected(b.clone(), ledger_id, entry_id) {
                    Ok(_) => true,
                    Err(e) => {
                        warn!(ledger = ledger_id, bookie, entry = entry_id, error = %e, "corrupt copy ignored");
                        false
                    }
                }
            }
            _ => false,
        };
        r.answers[i] = Some(ReadAnswer::classify(status, valid));
        if valid && r.found.is_none() {
            r.found = body;
        }
        self.check_read();
    }

    /// A bookie's answer to a write-back [`RecoveryAction::SendAdd`].
    pub fn add_response(&mut self, bookie: &str, entry_id: EntryId, status: BookieStatus) {
        if let Some(r) = self.repl.as_mut() {
            r.add_response(bookie, entry_id, status);
        }
        self.pump();
    }

    /// A bookie failed (connection broken): pending requests to it are
    /// timeouts.
    pub fn bookie_failed(&mut self, bookie: &str) {
        match self.phase {
            Phase::Fencing => self.fence_response(
                bookie,
                FenceAnswer {
                    status: BookieStatus::Timeout,
                    last_entry: None,
                    explicit_lac: None,
                },
            ),
            Phase::Reading => {
                if let Some(e) = self.reading.as_ref().map(|r| r.entry_id) {
                    self.read_response(bookie, e, BookieStatus::Timeout, None);
                }
                if let Some(r) = self.repl.as_mut() {
                    r.bookie_failed(bookie);
                }
                self.pump();
            }
            _ => {}
        }
    }

    /// Placement's answer to [`RecoveryAction::ChooseReplacements`]. The
    /// change is applied to recovery's proposed metadata only; it is
    /// published with the close.
    pub fn replacements_chosen(&mut self, replacements: Vec<Replacement>) {
        let Some(repl) = self.repl.as_mut() else {
            return;
        };
        let Some(req) = repl.change_in_flight().cloned() else {
            return;
        };
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
            repl.no_replacement(&unplaced);
        } else {
            let change = EnsembleChange {
                first_entry_id: req.first_entry_id,
                replacements: placed,
            };
            match change_ensemble(repl.metadata(), &change, Updater::Recovery) {
                Ok(Update::Write(md)) => {
                    self.changes.push(change);
                    repl.ensemble_changed(md);
                }
                Ok(Update::Unchanged) => {
                    let md = repl.metadata().clone();
                    repl.ensemble_changed(md);
                }
                Err(e) => {
                    self.finish(Err(RecoveryError::Metadata(e)));
                    return;
                }
            }
            if !unplaced.is_empty() {
                repl.no_replacement(&unplaced);
            }
        }
        self.pump();
    }

    /// Advances time: fences and reads unanswered for `read_timeout_ms` are
    /// timeouts; write-back adds time out their bookie.
    pub fn tick(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        let now = self.now_ms;
        let timeout = self.config.read_timeout_ms;
        if timeout > 0 && self.phase == Phase::Fencing {
            let late: Vec<BookieId> = self
                .fence
                .iter()
                .filter(|s| {
                    matches!(s.state, FenceState::Pending { sent_ms } if now.saturating_sub(sent_ms) >= timeout)
                })
                .map(|s| s.bookie.clone())
                .collect();
            for b in late {
                self.fence_response(
                    &b,
                    FenceAnswer {
                        status: BookieStatus::Timeout,
                        last_entry: None,
                        explicit_lac: None,
                    },
                );
            }
        }
        if self.phase == Phase::Reading {
            if timeout > 0
                && let Some(r) = self.reading.as_ref()
            {
                let e = r.entry_id;
                let late: Vec<BookieId> = r
                    .bookies
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| {
                        r.answers[*i].is_none() && now.saturating_sub(r.sent_ms[*i]) >= timeout
                    })
                    .map(|(_, b)| b.clone())
                    .collect();
                for b in late {
                    self.read_response(&b, e, BookieStatus::Timeout, None);
                }
            }
            if let Some(r) = self.repl.as_mut() {
                r.tick(now);
            }
            self.pump();
        }
    }

    fn finish(&mut self, result: Result<Recovered, RecoveryError>) {
        if self.phase == Phase::Done {
            return;
        }
        if let Err(e) = &result {
            warn!(ledger = self.ledger_id, error = %e, "recovery failed");
        }
        self.phase = Phase::Done;
        self.reading = None;
        self.out.push_back(RecoveryAction::Finished(result));
    }

    fn learn_lac(&mut self, answer: &FenceAnswer) {
        if let Some(body) = &answer.last_entry {
            match Entry::decode(body.clone()) {
                Ok(e) if e.header.ledger_id == self.ledger_id => {
                    self.max_lac = self.max_lac.max(e.header.lac);
                    self.known_lengths
                        .insert(e.header.entry_id, e.header.length);
                }
                Ok(_) | Err(_) => {
                    warn!(
                        ledger = self.ledger_id,
                        "unusable last entry in a LAC answer ignored"
                    )
                }
            }
        }
        if let Some(body) = &answer.explicit_lac
            && let Ok(lac) = decode_explicit_lac(self.ledger_id, body)
        {
            self.max_lac = self.max_lac.max(lac);
        }
    }

    fn begin_fencing(&mut self) {
        self.phase = Phase::Fencing;
        let ensemble = self
            .read_md
            .as_ref()
            .and_then(last_segment)
            .map(|s| s.ensemble.clone())
            .unwrap_or_default();
        self.fence = ensemble
            .into_iter()
            .map(|bookie| FenceSlot {
                bookie,
                state: FenceState::Pending {
                    sent_ms: self.now_ms,
                },
                attempts: 0,
            })
            .collect();
        for s in &self.fence {
            self.out.push_back(RecoveryAction::SendFence {
                bookie: s.bookie.clone(),
            });
        }
    }

    fn check_fencing(&mut self) {
        if self.phase != Phase::Fencing {
            return;
        }
        let known: Vec<bool> = self
            .fence
            .iter()
            .map(|s| s.state == FenceState::Known)
            .collect();
        if self.spec.ensemble_covered(&known) {
            self.begin_reading();
        } else if !self
            .fence
            .iter()
            .any(|s| matches!(s.state, FenceState::Pending { .. }))
        {
            self.finish(Err(RecoveryError::FenceIncomplete));
        }
    }

    fn begin_reading(&mut self) {
        let Some(read_md) = self.read_md.clone() else {
            return;
        };
        self.phase = Phase::Reading;
        let last_first = last_segment(&read_md).map_or(0, |s| s.first_entry_id);
        self.start = self.max_lac.max(last_first - 1);
        info!(
            ledger = self.ledger_id,
            lac = self.max_lac,
            start = self.start,
            "fenced; reading forward"
        );
        self.repl = Some(Replicator::new(
            read_md,
            self.spec,
            self.start,
            true,
            self.config.add_timeout_ms,
            self.now_ms,
        ));
        self.last_present = self.start;
        if self.start < 0 {
            self.last_present_length = 0;
            self.read_entry(self.start + 1, false);
        } else if let Some(len) = self.known_lengths.get(&self.start) {
            self.last_present_length = *len;
            self.read_entry(self.start + 1, false);
        } else {
            self.read_entry(self.start, true);
        }
    }

    fn read_entry(&mut self, entry_id: EntryId, probe: bool) {
        let Some(read_md) = self.read_md.as_ref() else {
            return;
        };
        let bookies = write_set_bookies(read_md, &self.spec, entry_id);
        let n = bookies.len();
        for b in &bookies {
            self.out.push_back(RecoveryAction::SendRead {
                bookie: b.clone(),
                entry_id,
                fence: self.fence_reads,
            });
        }
        self.reading = Some(EntryRead {
            entry_id,
            probe,
            bookies,
            answers: vec![None; n],
            sent_ms: vec![self.now_ms; n],
            attempts: 0,
            found: None,
        });
    }

    fn check_read(&mut self) {
        let Some(r) = self.reading.as_mut() else {
            return;
        };
        let entry_id = r.entry_id;
        match self.spec.read_decision(&r.answers) {
            ReadDecision::Pending => {}
            ReadDecision::Undecided => {
                r.attempts += 1;
                if r.attempts >= self.config.attempts_max {
                    self.finish(Err(RecoveryError::ReadUndecided(entry_id)));
                    return;
                }
                for i in 0..r.bookies.len() {
                    if r.answers[i] == Some(ReadAnswer::Unknown) {
                        r.answers[i] = None;
                        r.sent_ms[i] = self.now_ms;
                        self.out.push_back(RecoveryAction::SendRead {
                            bookie: r.bookies[i].clone(),
                            entry_id,
                            fence: self.fence_reads,
                        });
                    }
                }
            }
            ReadDecision::Absent => {
                if r.probe {
                    self.finish(Err(RecoveryError::AckedEntryMissing(entry_id)));
                    return;
                }
                info!(
                    ledger = self.ledger_id,
                    entry = entry_id,
                    "end of ledger found"
                );
                self.reading = None;
                self.end_found = true;
                self.maybe_close();
            }
            ReadDecision::Present => {
                let probe = r.probe;
                let Some(body) = r.found.clone() else {
                    return;
                };
                let Ok(header) = Entry::peek_header(&body) else {
                    return;
                };
                self.reading = None;
                if probe {
                    self.last_present_length = header.length;
                } else {
                    self.last_present = entry_id;
                    self.last_present_length = header.length;
                    if let Some(repl) = self.repl.as_mut() {
                        repl.submit(entry_id, body, header.length);
                    }
                    self.pump();
                    if self.phase != Phase::Reading {
                        return;
                    }
                }
                self.read_entry(entry_id + 1, false);
            }
        }
    }

    fn pump(&mut self) {
        while let Some(ev) = self.repl.as_mut().and_then(Replicator::poll) {
            match ev {
                ReplEvent::Send {
                    bookie,
                    entry_id,
                    body,
                } => self.out.push_back(RecoveryAction::SendAdd {
                    bookie,
                    entry_id,
                    body,
                }),
                ReplEvent::Completed { .. } => {}
                ReplEvent::NeedReplacements(req) => {
                    self.out.push_back(RecoveryAction::ChooseReplacements(req))
                }
                ReplEvent::UnderReplicated(bookies) => {
                    warn!(
                        ledger = self.ledger_id,
                        ?bookies,
                        "write-back without a replacement"
                    )
                }
                ReplEvent::Fatal(ReplFatal::Unauthorized) => {
                    self.finish(Err(RecoveryError::Unauthorized(String::new())))
                }
                ReplEvent::Fatal(_) => self.finish(Err(RecoveryError::WriteBackFailed)),
            }
        }
        self.maybe_close();
    }

    fn maybe_close(&mut self) {
        if self.phase != Phase::Reading || !self.end_found {
            return;
        }
        let Some(repl) = self.repl.as_ref() else {
            return;
        };
        if repl.last_completed() < self.last_present || repl.change_in_flight().is_some() {
            return;
        }
        self.phase = Phase::Closing;
        self.out
            .push_back(RecoveryAction::UpdateMetadata(MetadataOp::Close {
                last_entry_id: self.last_present,
                length: self.last_present_length,
                by: Updater::Recovery,
                ensemble_changes: self.changes.clone(),
            }));
    }
}

#[cfg(test)]
mod tests;
