//! The read side: which replica to ask for an entry, and how far a reader may
//! read.
//!
//! Promises:
//! - **never past LAC** (DESIGN §4 invariant 4): a [`Reader`] of an open ledger
//!   refuses to start a read above the highest LAC it has seen (LACs only come
//!   from digest-checked entry headers and explicit-LAC bodies, so each is a
//!   LAC the writer really had); a closed ledger is readable to its last
//!   entry;
//! - replicas are tried in write-set order, bookies known to have failed
//!   last; a digest failure, an error or a "no entry" moves to the next one;
//!   after a timeout input a second, speculative read goes to the next
//!   replica while the first may still answer; the first valid copy wins;
//! - **sticky reads** (opt-out, [`Reader::set_sticky_reads`]): when every
//!   bookie of the ensemble holds every entry (E = Qw), all entries of the
//!   ledger are asked of the same bookie first (its slot is the ledger id
//!   modulo E, so ledgers spread over the bookies) instead of the write set's
//!   first, which rotates per entry. One bookie then serves a catch-up read
//!   from its read-ahead instead of every bookie reading (and caching) the
//!   whole range from disk. A failed sticky bookie is tried last, as above,
//!   so the next one in that fixed order takes over. Pulsar's
//!   `bookkeeperEnableStickyReads`, on by default there too.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::lac::decode_explicit_lac;
use super::metadata::{MetadataError, status, validate, write_set_bookies};
use super::quorum::QuorumSpec;
use super::{BookieId, BookieStatus, EntryId};
use crate::entry::Entry;
use crate::proto::metadata::{LedgerMetadata, LedgerStatus};

/// Why a read cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// Above what this reader may read (the LAC of an open ledger, or the
    /// last entry of a closed one).
    #[error("entry {entry_id} is past the readable end {last_readable}")]
    PastEnd {
        /// Entry asked for.
        entry_id: EntryId,
        /// The highest readable entry now.
        last_readable: EntryId,
    },
    /// Every replica was tried without a valid copy.
    #[error("entry {0}: no replica returned a valid copy")]
    NoValidReplica(EntryId),
    /// The metadata is unusable.
    #[error("invalid metadata: {0}")]
    InvalidMetadata(MetadataError),
}

/// A read handle's decisions (see the module doc).
#[derive(Debug, Clone)]
pub struct Reader {
    ledger_id: u64,
    md: LedgerMetadata,
    spec: QuorumSpec,
    lac: EntryId,
    failed: BTreeSet<BookieId>,
    sticky: bool,
}

impl Reader {
    /// A reader over this metadata (open without recovery, or closed).
    pub fn new(md: LedgerMetadata) -> Result<Reader, ReadError> {
        let spec = validate(&md).map_err(ReadError::InvalidMetadata)?;
        Ok(Reader {
            ledger_id: md.ledger_id,
            md,
            spec,
            lac: -1,
            failed: BTreeSet::new(),
            sticky: false,
        })
    }

    /// The highest LAC seen.
    pub fn lac(&self) -> EntryId {
        self.lac
    }

    /// Whether the metadata says closed.
    pub fn is_closed(&self) -> bool {
        status(&self.md).ok() == Some(LedgerStatus::LedgerClosed)
    }

    /// The highest entry a read may ask for now.
    pub fn last_readable(&self) -> EntryId {
        if self.is_closed() {
            self.md.last_entry_id
        } else {
            self.lac
        }
    }

    /// Newer metadata (after an ensemble change or a close).
    pub fn update_metadata(&mut self, md: LedgerMetadata) -> Result<(), ReadError> {
        self.spec = validate(&md).map_err(ReadError::InvalidMetadata)?;
        self.md = md;
        Ok(())
    }

    /// Learns a LAC from a bookie's `ReadLac` answer (or a long-poll answer):
    /// the last entry's piggybacked LAC and the explicit LAC, each only if
    /// its digest checks.
    pub fn observe_lac_answer(&mut self, last_entry: Option<&Bytes>, explicit_lac: Option<&Bytes>) {
        if let Some(b) = last_entry
            && let Ok(e) = Entry::decode(b.clone())
            && e.header.ledger_id == self.ledger_id
        {
            self.lac = self.lac.max(e.header.lac);
        }
        if let Some(b) = explicit_lac
            && let Ok(lac) = decode_explicit_lac(self.ledger_id, b)
        {
            self.lac = self.lac.max(lac);
        }
    }

    /// Learns the LAC from this ledger's writer in the same process: the
    /// entries it saw acknowledged by an ack quorum (what an explicit LAC
    /// from the bookies would carry, without waiting for one).
    pub fn observe_writer_lac(&mut self, lac: EntryId) {
        self.lac = self.lac.max(lac);
    }

    /// Learns the LAC piggybacked on an entry this reader decoded.
    pub fn observe_entry(&mut self, entry: &Entry) {
        if entry.header.ledger_id == self.ledger_id {
            self.lac = self.lac.max(entry.header.lac);
        }
    }

    /// A bookie failed: it is tried last from now on.
    pub fn bookie_failed(&mut self, bookie: &str) {
        self.failed.insert(bookie.to_string());
    }

    /// A bookie answered well again.
    pub fn bookie_recovered(&mut self, bookie: &str) {
        self.failed.remove(bookie);
    }

    /// Sticky reads on or off (see the module doc; off for a new reader).
    pub fn set_sticky_reads(&mut self, on: bool) {
        self.sticky = on;
    }

    /// Starts a read of `entry_id`, refused past [`Reader::last_readable`].
    pub fn read(&self, entry_id: EntryId) -> Result<EntryRead, ReadError> {
        let last_readable = self.last_readable();
        if entry_id < 0 || entry_id > last_readable {
            return Err(ReadError::PastEnd {
                entry_id,
                last_readable,
            });
        }
        let mut ws = write_set_bookies(&self.md, &self.spec, entry_id);
        let n = ws.len() as u64;
        if self.sticky && n > 0 && self.spec.write_quorum() == self.spec.ensemble_size() {
            // ws[k] is ensemble slot (entry + k) mod n; put slot
            // (ledger + k) mod n at k instead: one order for every entry.
            let entry = entry_id as u64 % n;
            ws.rotate_left(((self.ledger_id % n + n - entry) % n) as usize);
        }
        let (healthy, failed): (Vec<_>, Vec<_>) =
            ws.into_iter().partition(|b| !self.failed.contains(b));
        let candidates: Vec<BookieId> = healthy.into_iter().chain(failed).collect();
        let n = candidates.len();
        Ok(EntryRead {
            ledger_id: self.ledger_id,
            entry_id,
            candidates,
            state: vec![Try::Untried; n],
            done: false,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Try {
    Untried,
    InFlight,
    Failed,
}

/// What to do after an input to an [`EntryRead`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadStep {
    /// The entry, digest-checked.
    Done(Entry),
    /// Send the read to this bookie.
    Send(BookieId),
    /// Wait for an answer already asked for.
    Wait,
    /// No replica is left.
    Failed(ReadError),
}

/// The replica choice for one entry.
#[derive(Debug, Clone)]
pub struct EntryRead {
    ledger_id: u64,
    entry_id: EntryId,
    candidates: Vec<BookieId>,
    state: Vec<Try>,
    done: bool,
}

impl EntryRead {
    /// The entry.
    pub fn entry_id(&self) -> EntryId {
        self.entry_id
    }

    /// The first request to send.
    pub fn start(&mut self) -> ReadStep {
        self.next()
    }

    fn next(&mut self) -> ReadStep {
        if self.done {
            return ReadStep::Wait;
        }
        if let Some(i) = self.state.iter().position(|s| *s == Try::Untried) {
            self.state[i] = Try::InFlight;
            return ReadStep::Send(self.candidates[i].clone());
        }
        if self.state.contains(&Try::InFlight) {
            ReadStep::Wait
        } else {
            self.done = true;
            ReadStep::Failed(ReadError::NoValidReplica(self.entry_id))
        }
    }

    /// The speculative-read timer fired: ask one more replica while the
    /// outstanding ones may still answer.
    pub fn speculative_timeout(&mut self) -> ReadStep {
        if self.done || !self.state.contains(&Try::Untried) {
            return ReadStep::Wait;
        }
        self.next()
    }

    /// A replica's answer (`body` with `Ok`).
    pub fn response(
        &mut self,
        bookie: &str,
        status: BookieStatus,
        body: Option<Bytes>,
    ) -> ReadStep {
        if self.done {
            return ReadStep::Wait;
        }
        let Some(i) = self
            .candidates
            .iter()
            .zip(&self.state)
            .position(|(b, s)| b == bookie && *s == Try::InFlight)
        else {
            return ReadStep::Wait;
        };
        if status == BookieStatus::Ok
            && let Some(b) = body
            && let Ok(e) = Entry::decode_expected(b, self.ledger_id, self.entry_id)
        {
            self.done = true;
            return ReadStep::Done(e);
        }
        self.state[i] = Try::Failed;
        self.next()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::client::lac::encode_explicit_lac;
    use crate::client::metadata::{NewLedger, new_ledger};
    use crate::entry::EntryHeader;

    fn md() -> LedgerMetadata {
        md_with(QuorumSpec::new(3, 2, 2).unwrap())
    }

    fn md_with(quorum: QuorumSpec) -> LedgerMetadata {
        new_ledger(NewLedger {
            ledger_id: 4,
            quorum,
            ensemble: vec!["b1".into(), "b2".into(), "b3".into()],
            password: Bytes::new(),
            custom: HashMap::new(),
            ctime_ms: 0,
        })
        .unwrap()
    }

    fn entry(id: EntryId, lac: EntryId) -> Bytes {
        Entry::encode(
            EntryHeader {
                ledger_id: 4,
                entry_id: id,
                lac,
                length: 1,
            },
            b"x",
        )
    }

    #[test]
    fn an_open_ledger_is_readable_only_up_to_the_highest_valid_lac_seen() {
        let mut r = Reader::new(md()).unwrap();
        assert_eq!(
            r.read(0).unwrap_err(),
            ReadError::PastEnd {
                entry_id: 0,
                last_readable: -1
            }
        );
        r.observe_lac_answer(Some(&entry(5, 4)), None);
        assert_eq!(r.last_readable(), 4, "the entry's LAC, not its id");
        r.observe_lac_answer(None, Some(&encode_explicit_lac(4, 6)));
        assert_eq!(r.lac(), 6);
        // Corrupt or foreign answers teach nothing; LAC never goes back.
        let mut bad = entry(9, 9).to_vec();
        bad[20] ^= 1;
        r.observe_lac_answer(Some(&Bytes::from(bad)), Some(&encode_explicit_lac(5, 9)));
        r.observe_lac_answer(None, Some(&encode_explicit_lac(4, 2)));
        assert_eq!(r.lac(), 6);
        assert!(r.read(6).is_ok());
        assert!(matches!(r.read(7), Err(ReadError::PastEnd { .. })));
        let mut closed = md();
        closed.status = LedgerStatus::LedgerClosed as i32;
        closed.last_entry_id = 9;
        r.update_metadata(closed).unwrap();
        assert!(r.read(9).is_ok() && r.read(10).is_err());
    }

    #[test]
    fn replicas_are_tried_in_write_set_order_failed_bookies_last() {
        let mut r = Reader::new(md()).unwrap();
        r.observe_lac_answer(Some(&entry(3, 3)), None);
        let mut rd = r.read(1).unwrap();
        assert_eq!(rd.start(), ReadStep::Send("b2".into()));
        // A corrupt copy moves on, and so does "no entry".
        let mut bad = entry(1, 0).to_vec();
        bad[36] ^= 1;
        assert_eq!(
            rd.response("b2", BookieStatus::Ok, Some(Bytes::from(bad))),
            ReadStep::Send("b3".into())
        );
        assert_eq!(
            rd.response("b3", BookieStatus::NoEntry, None),
            ReadStep::Failed(ReadError::NoValidReplica(1))
        );
        r.bookie_failed("b2");
        let mut rd = r.read(1).unwrap();
        assert_eq!(rd.start(), ReadStep::Send("b3".into()));
    }

    /// The writer's LAC makes entries readable at once and never moves the
    /// LAC back.
    #[test]
    fn the_writer_lac_makes_entries_readable_and_never_lowers_the_lac() {
        let mut r = Reader::new(md()).unwrap();
        assert!(matches!(r.read(2), Err(ReadError::PastEnd { .. })));
        r.observe_writer_lac(2);
        assert_eq!(r.last_readable(), 2);
        assert!(r.read(2).is_ok());
        r.observe_writer_lac(1);
        r.observe_lac_answer(Some(&entry(2, 0)), None);
        assert_eq!(r.last_readable(), 2);
    }

    fn order(r: &Reader, entry_id: EntryId) -> Vec<BookieId> {
        r.read(entry_id).unwrap().candidates
    }

    #[test]
    fn sticky_reads_ask_one_bookie_first_for_every_entry_when_each_holds_all() {
        let mut r = Reader::new(md_with(QuorumSpec::new(3, 3, 2).unwrap())).unwrap();
        r.observe_lac_answer(Some(&entry(9, 9)), None);
        // Off: the write set's order, rotating with the entry.
        assert_eq!(order(&r, 0), ["b1", "b2", "b3"]);
        assert_eq!(order(&r, 1), ["b2", "b3", "b1"]);
        r.set_sticky_reads(true);
        // On: ledger 4, E = 3: slot 4 mod 3 = 1 first for every entry.
        for e in 0..=9 {
            assert_eq!(order(&r, e), ["b2", "b3", "b1"], "entry {e}");
        }
        // A failed sticky bookie goes last; the next takes over for all.
        r.bookie_failed("b2");
        for e in 0..=9 {
            assert_eq!(order(&r, e), ["b3", "b1", "b2"], "entry {e}");
        }
        r.bookie_recovered("b2");
        assert_eq!(order(&r, 5), ["b2", "b3", "b1"]);
    }

    #[test]
    fn sticky_reads_keep_the_write_set_when_bookies_hold_stripes() {
        // E3 / Qw2: a bookie holds only two entries in three, so the write
        // set (the replicas that have the entry) decides.
        let mut r = Reader::new(md()).unwrap();
        r.observe_lac_answer(Some(&entry(9, 9)), None);
        r.set_sticky_reads(true);
        assert_eq!(order(&r, 0), ["b1", "b2"]);
        assert_eq!(order(&r, 1), ["b2", "b3"]);
        assert_eq!(order(&r, 2), ["b3", "b1"]);
    }

    #[test]
    fn a_speculative_read_goes_to_the_next_replica_and_the_first_valid_copy_wins() {
        let mut r = Reader::new(md()).unwrap();
        r.observe_lac_answer(Some(&entry(3, 3)), None);
        let mut rd = r.read(2).unwrap();
        assert_eq!(rd.start(), ReadStep::Send("b3".into()));
        assert_eq!(rd.speculative_timeout(), ReadStep::Send("b1".into()));
        assert_eq!(rd.speculative_timeout(), ReadStep::Wait, "no replica left");
        assert_eq!(
            rd.response("b1", BookieStatus::Timeout, None),
            ReadStep::Wait
        );
        let got = rd.response("b3", BookieStatus::Ok, Some(entry(2, 1)));
        assert!(matches!(got, ReadStep::Done(e) if e.header.entry_id == 2));
        assert_eq!(
            rd.response("b1", BookieStatus::Ok, Some(entry(2, 1))),
            ReadStep::Wait
        );
    }
}
