//! Replication of a run of entries to their write sets, shared by the writer
//! (normal adds) and recovery (RECOVERY_ADD write-back).
//!
//! Promises (DESIGN §4 invariant 1, BookKeeper #4651):
//! - entry `e` completes only when Qa bookies of its write set **in the current
//!   metadata view** acknowledged it and every earlier entry completed, so
//!   completions are dense and in order;
//! - acks from a bookie that failed, or that an ensemble change removed from
//!   the entry's write set, never count;
//! - after an ensemble change every pending entry is re-sent to the bookies
//!   new to its write set;
//! - a failure asks for a replacement; without one, writing continues while
//!   every write set still has Qa live bookies (reported as under-replicated),
//!   and fails only when one cannot;
//! - after a fatal error nothing completes any more.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use tracing::{debug, warn};

use super::metadata::{last_segment, write_set_bookies, write_set_iter};
use super::quorum::QuorumSpec;
use super::{BookieId, BookieStatus, EnsembleChangeRequest, EntryId};
use crate::proto::metadata::LedgerMetadata;

/// Why replication stopped for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplFatal {
    /// A bookie answered FENCED to a normal add.
    Fenced,
    /// A bookie refused the master key.
    Unauthorized,
    /// Some write set can no longer gather Qa live bookies.
    NotEnoughBookies,
}

/// What the replicator asks its owner to do or report.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ReplEvent {
    /// Send entry bytes to a bookie.
    Send {
        bookie: BookieId,
        entry_id: EntryId,
        body: Bytes,
    },
    /// The entry completed (in order).
    Completed { entry_id: EntryId, length: u64 },
    /// Replacements are needed for the request's failed bookies.
    NeedReplacements(EnsembleChangeRequest),
    /// Writing continues without these failed bookies.
    UnderReplicated(Vec<BookieId>),
    /// Replication stopped.
    Fatal(ReplFatal),
}

#[derive(Debug)]
struct Pending {
    body: Bytes,
    length: u64,
    acked: BTreeSet<BookieId>,
    /// Bookie → time (ms) the entry was last sent to it.
    sent: BTreeMap<BookieId, u64>,
}

/// The replication engine (see the module doc).
#[derive(Debug)]
pub(crate) struct Replicator {
    ledger_id: u64,
    spec: QuorumSpec,
    md: LedgerMetadata,
    /// RECOVERY_ADD write-back: a FENCED answer is a bookie error, not fatal.
    recovery: bool,
    last_completed: EntryId,
    pending: BTreeMap<EntryId, Pending>,
    failed: BTreeSet<BookieId>,
    unreplaceable: BTreeSet<BookieId>,
    reported_under_replicated: BTreeSet<BookieId>,
    change_in_flight: Option<EnsembleChangeRequest>,
    fatal: Option<ReplFatal>,
    add_timeout_ms: u64,
    now_ms: u64,
    out: VecDeque<ReplEvent>,
}

impl Replicator {
    pub(crate) fn new(
        md: LedgerMetadata,
        spec: QuorumSpec,
        last_completed: EntryId,
        recovery: bool,
        add_timeout_ms: u64,
        now_ms: u64,
    ) -> Replicator {
        Replicator {
            ledger_id: md.ledger_id,
            spec,
            md,
            recovery,
            last_completed,
            pending: BTreeMap::new(),
            failed: BTreeSet::new(),
            unreplaceable: BTreeSet::new(),
            reported_under_replicated: BTreeSet::new(),
            change_in_flight: None,
            fatal: None,
            add_timeout_ms,
            now_ms,
            out: VecDeque::new(),
        }
    }

    pub(crate) fn metadata(&self) -> &LedgerMetadata {
        &self.md
    }

    pub(crate) fn last_completed(&self) -> EntryId {
        self.last_completed
    }

    /// The last entry handed to `submit` (or `last_completed`).
    pub(crate) fn last_submitted(&self) -> EntryId {
        self.pending
            .keys()
            .next_back()
            .copied()
            .unwrap_or(self.last_completed)
    }

    pub(crate) fn pending_len(&self) -> usize {
        self.pending.len()
    }

    pub(crate) fn change_in_flight(&self) -> Option<&EnsembleChangeRequest> {
        self.change_in_flight.as_ref()
    }

    /// Bookies of the current ensemble that are not failed.
    pub(crate) fn live_ensemble(&self) -> Vec<BookieId> {
        last_segment(&self.md)
            .map(|s| {
                s.ensemble
                    .iter()
                    .filter(|b| !self.failed.contains(*b))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(crate) fn poll(&mut self) -> Option<ReplEvent> {
        self.out.pop_front()
    }

    /// Replicates the next entry (`last_submitted() + 1`).
    pub(crate) fn submit(&mut self, entry_id: EntryId, body: Bytes, length: u64) {
        if self.fatal.is_some() {
            return;
        }
        debug_assert_eq!(entry_id, self.last_submitted() + 1, "entries are dense");
        let mut p = Pending {
            body,
            length,
            acked: BTreeSet::new(),
            sent: BTreeMap::new(),
        };
        for bookie in write_set_bookies(&self.md, &self.spec, entry_id) {
            if !self.failed.contains(&bookie) {
                p.sent.insert(bookie.clone(), self.now_ms);
                self.out.push_back(ReplEvent::Send {
                    bookie,
                    entry_id,
                    body: p.body.clone(),
                });
            }
        }
        self.pending.insert(entry_id, p);
        // With Qa live bookies the entry may only complete on acks; nothing to
        // check here, except a write set that cannot reach Qa (degraded).
        self.check_failures();
    }

    /// A bookie's answer to an add.
    pub(crate) fn add_response(&mut self, bookie: &str, entry_id: EntryId, status: BookieStatus) {
        if self.fatal.is_some() {
            return;
        }
        match status {
            BookieStatus::Ok => {
                if self.failed.contains(bookie) {
                    return;
                }
                let in_write_set =
                    write_set_iter(&self.md, &self.spec, entry_id).any(|b| b == bookie);
                if let Some(p) = self.pending.get_mut(&entry_id)
                    && in_write_set
                {
                    p.acked.insert(bookie.to_string());
                    self.try_complete();
                }
            }
            BookieStatus::Fenced if !self.recovery => {
                warn!(
                    ledger = self.ledger_id,
                    bookie,
                    entry = entry_id,
                    "add refused: ledger fenced"
                );
                self.fail(ReplFatal::Fenced);
            }
            BookieStatus::Unauthorized => {
                warn!(
                    ledger = self.ledger_id,
                    bookie,
                    entry = entry_id,
                    "add refused: master key mismatch"
                );
                self.fail(ReplFatal::Unauthorized);
            }
            other => {
                debug!(ledger = self.ledger_id, bookie, entry = entry_id, status = ?other, "add failed");
                self.bookie_failed(bookie);
            }
        }
    }

    /// A bookie of the ensemble is unusable (error, timeout, broken connection).
    pub(crate) fn bookie_failed(&mut self, bookie: &str) {
        if self.fatal.is_some() || self.failed.contains(bookie) {
            return;
        }
        let in_ensemble =
            last_segment(&self.md).is_some_and(|s| s.ensemble.iter().any(|b| b == bookie));
        if !in_ensemble {
            return;
        }
        warn!(ledger = self.ledger_id, bookie, "bookie failed");
        self.failed.insert(bookie.to_string());
        self.check_failures();
    }

    /// The ensemble change asked for is in `md` (published by the writer, or
    /// proposed by recovery).
    pub(crate) fn ensemble_changed(&mut self, md: LedgerMetadata) {
        self.change_in_flight = None;
        if self.fatal.is_some() {
            return;
        }
        self.md = md;
        let ensemble: Vec<BookieId> = last_segment(&self.md)
            .map(|s| s.ensemble.clone())
            .unwrap_or_default();
        self.failed.retain(|b| ensemble.contains(b));
        self.unreplaceable.retain(|b| ensemble.contains(b));
        self.reported_under_replicated
            .retain(|b| ensemble.contains(b));
        let now = self.now_ms;
        for (entry_id, p) in self.pending.iter_mut() {
            let ws = write_set_bookies(&self.md, &self.spec, *entry_id);
            // Acks and sends of bookies no longer in the write set are void.
            p.acked.retain(|b| ws.contains(b));
            p.sent.retain(|b, _| ws.contains(b));
            for bookie in ws {
                if !self.failed.contains(&bookie) && !p.sent.contains_key(&bookie) {
                    p.sent.insert(bookie.clone(), now);
                    self.out.push_back(ReplEvent::Send {
                        bookie,
                        entry_id: *entry_id,
                        body: p.body.clone(),
                    });
                }
            }
        }
        self.check_failures();
        self.try_complete();
    }

    /// No replacement was found for these bookies: keep going without them.
    pub(crate) fn no_replacement(&mut self, bookies: &[BookieId]) {
        self.change_in_flight = None;
        self.unreplaceable.extend(bookies.iter().cloned());
        self.check_failures();
        self.try_complete();
    }

    /// Advances time; adds unanswered for `add_timeout_ms` fail their bookie.
    pub(crate) fn tick(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        if self.fatal.is_some() || self.add_timeout_ms == 0 {
            return;
        }
        let mut late = BTreeSet::new();
        for p in self.pending.values() {
            for (b, t) in &p.sent {
                if !p.acked.contains(b)
                    && !self.failed.contains(b)
                    && self.now_ms.saturating_sub(*t) >= self.add_timeout_ms
                {
                    late.insert(b.clone());
                }
            }
        }
        for b in late {
            self.bookie_failed(&b);
        }
    }

    fn fail(&mut self, why: ReplFatal) {
        if self.fatal.is_none() {
            self.fatal = Some(why);
            self.out.push_back(ReplEvent::Fatal(why));
        }
    }

    /// After the failed set changed: ask for replacements, or go on degraded,
    /// or stop when some write set cannot reach Qa.
    fn check_failures(&mut self) {
        if self.fatal.is_some() || self.change_in_flight.is_some() || self.failed.is_empty() {
            return;
        }
        let Some(seg) = last_segment(&self.md) else {
            return;
        };
        let to_replace: Vec<BookieId> = seg
            .ensemble
            .iter()
            .filter(|b| self.failed.contains(*b) && !self.unreplaceable.contains(*b))
            .cloned()
            .collect();
        if !to_replace.is_empty() {
            let req = EnsembleChangeRequest {
                first_entry_id: self.last_completed + 1,
                ensemble: seg.ensemble.clone(),
                failed: to_replace,
            };
            self.change_in_flight = Some(req.clone());
            self.out.push_back(ReplEvent::NeedReplacements(req));
            return;
        }
        let live: Vec<bool> = seg
            .ensemble
            .iter()
            .map(|b| !self.failed.contains(b))
            .collect();
        if !self.spec.every_write_set_can_ack(&live) {
            warn!(ledger = self.ledger_id, "ack quorum can no longer be met");
            self.fail(ReplFatal::NotEnoughBookies);
            return;
        }
        if self.reported_under_replicated != self.failed {
            self.reported_under_replicated = self.failed.clone();
            self.out.push_back(ReplEvent::UnderReplicated(
                self.failed.iter().cloned().collect(),
            ));
        }
    }

    fn try_complete(&mut self) {
        while self.fatal.is_none() {
            let next = self.last_completed + 1;
            let Some(p) = self.pending.get(&next) else {
                break;
            };
            let acks = write_set_iter(&self.md, &self.spec, next)
                .filter(|b| p.acked.contains(*b) && !self.failed.contains(*b))
                .count();
            if !self.spec.ack_quorum_met(acks) {
                break;
            }
            let length = p.length;
            self.pending.remove(&next);
            self.last_completed = next;
            self.out.push_back(ReplEvent::Completed {
                entry_id: next,
                length,
            });
        }
    }
}
