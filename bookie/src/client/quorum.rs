//! Quorum arithmetic of a ledger segment (reference §1.1, §1.5).
//!
//! Promises:
//! - a [`QuorumSpec`] exists only for E ≥ Qw ≥ Qa ≥ 1;
//! - the write set of entry `e` is the Qw consecutive ensemble slots starting at
//!   `e mod E`, wrapping around;
//! - [`QuorumSpec::read_decision`] calls an entry absent **only** on
//!   Qw − Qa + 1 explicit negatives from its write set; timeouts, errors,
//!   unknown state and corrupt copies never count (DESIGN §4 invariant 3);
//! - [`QuorumSpec::ensemble_covered`] is BookKeeper's code form of ensemble
//!   coverage: for every write set, fewer than Qa members are unknown, so no
//!   ack quorum can form without a bookie that answered.
//!
//! The rules are table-tested from `testdata/quorum.txt`.

use super::BookieStatus;

/// Why E, Qw, Qa are not a valid quorum configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuorumError {
    /// Not E ≥ Qw ≥ Qa ≥ 1.
    #[error(
        "invalid quorum: ensemble {ensemble_size}, write quorum {write_quorum}, ack quorum {ack_quorum} (need E >= Qw >= Qa >= 1)"
    )]
    Invalid {
        /// E.
        ensemble_size: usize,
        /// Qw.
        write_quorum: usize,
        /// Qa.
        ack_quorum: usize,
    },
}

/// E, Qw, Qa of a ledger, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuorumSpec {
    ensemble_size: usize,
    write_quorum: usize,
    ack_quorum: usize,
}

/// What one bookie of an entry's write set said to a recovery read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAnswer {
    /// A digest-valid copy of the entry.
    Found,
    /// An explicit NoEntry / NoLedger.
    Missing,
    /// Anything else: timeout, error, unknown state, a corrupt copy.
    Unknown,
}

impl ReadAnswer {
    /// Classifies a read's status; `digest_ok` tells whether an `Ok` answer's
    /// bytes decoded as the expected entry.
    pub fn classify(status: BookieStatus, digest_ok: bool) -> ReadAnswer {
        match status {
            BookieStatus::Ok if digest_ok => ReadAnswer::Found,
            s if s.is_negative() => ReadAnswer::Missing,
            _ => ReadAnswer::Unknown,
        }
    }
}

/// The outcome of a recovery read of one entry so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadDecision {
    /// Some bookie returned a valid copy.
    Present,
    /// Qw − Qa + 1 explicit negatives: the entry can never have been acked.
    Absent,
    /// Not decided yet; some answers are still outstanding.
    Pending,
    /// Every member answered and neither rule holds: retry the unknown ones.
    Undecided,
}

impl QuorumSpec {
    /// Validates E ≥ Qw ≥ Qa ≥ 1.
    pub fn new(
        ensemble_size: usize,
        write_quorum: usize,
        ack_quorum: usize,
    ) -> Result<QuorumSpec, QuorumError> {
        if ack_quorum >= 1 && write_quorum >= ack_quorum && ensemble_size >= write_quorum {
            Ok(QuorumSpec {
                ensemble_size,
                write_quorum,
                ack_quorum,
            })
        } else {
            Err(QuorumError::Invalid {
                ensemble_size,
                write_quorum,
                ack_quorum,
            })
        }
    }

    /// E.
    pub fn ensemble_size(&self) -> usize {
        self.ensemble_size
    }

    /// Qw.
    pub fn write_quorum(&self) -> usize {
        self.write_quorum
    }

    /// Qa.
    pub fn ack_quorum(&self) -> usize {
        self.ack_quorum
    }

    /// First slot of entry `entry_id`'s write set (`e mod E`; negative ids wrap
    /// like positive ones so the function is total).
    fn first_slot(&self, entry_id: i64) -> usize {
        // rem_euclid of a positive modulus is in 0..E, so the cast is exact.
        entry_id.rem_euclid(self.ensemble_size as i64) as usize
    }

    /// The ensemble slots of entry `entry_id`'s write set, in write-set order.
    pub fn write_set(&self, entry_id: i64) -> Vec<usize> {
        self.write_set_slots(entry_id).collect()
    }

    /// [`write_set`](Self::write_set) without allocating (the per-add paths
    /// of the replicator take it once per answer).
    pub fn write_set_slots(&self, entry_id: i64) -> impl Iterator<Item = usize> + use<> {
        let first = self.first_slot(entry_id);
        let e = self.ensemble_size;
        (0..self.write_quorum).map(move |i| (first + i) % e)
    }

    /// Whether ensemble slot `slot` is in entry `entry_id`'s write set.
    pub fn in_write_set(&self, entry_id: i64, slot: usize) -> bool {
        if slot >= self.ensemble_size {
            return false;
        }
        let first = self.first_slot(entry_id);
        (slot + self.ensemble_size - first) % self.ensemble_size < self.write_quorum
    }

    /// Whether `acks` acknowledgements from an entry's write set complete it.
    pub fn ack_quorum_met(&self, acks: usize) -> bool {
        acks >= self.ack_quorum
    }

    /// Qw − Qa + 1: explicit negatives from a write set that prove an entry
    /// was never acked (quorum coverage).
    pub fn absence_quorum(&self) -> usize {
        self.write_quorum - self.ack_quorum + 1
    }

    /// The recovery-read rule for one entry. `answers[i]` is the answer of the
    /// i-th member of the entry's write set (`None` while outstanding).
    pub fn read_decision(&self, answers: &[Option<ReadAnswer>]) -> ReadDecision {
        if answers.contains(&Some(ReadAnswer::Found)) {
            return ReadDecision::Present;
        }
        let missing = answers
            .iter()
            .filter(|a| **a == Some(ReadAnswer::Missing))
            .count();
        if missing >= self.absence_quorum() {
            return ReadDecision::Absent;
        }
        if answers.iter().any(Option::is_none) {
            ReadDecision::Pending
        } else {
            ReadDecision::Undecided
        }
    }

    /// Ensemble coverage in BookKeeper's code form: `known[slot]` tells
    /// whether that slot's bookie answered OK / NoEntry / NoLedger; covered
    /// when every write set has fewer than Qa unknown members.
    pub fn ensemble_covered(&self, known: &[bool]) -> bool {
        if known.len() != self.ensemble_size {
            return false;
        }
        (0..self.ensemble_size).all(|first| {
            let unknown = (0..self.write_quorum)
                .filter(|i| !known[(first + i) % self.ensemble_size])
                .count();
            unknown < self.ack_quorum
        })
    }

    /// Whether a write set can still gather Qa acks when `live[slot]` tells
    /// which slots' bookies are usable: for every write set at least Qa live.
    pub fn every_write_set_can_ack(&self, live: &[bool]) -> bool {
        known_len_ok(live, self.ensemble_size)
            && (0..self.ensemble_size).all(|first| {
                (0..self.write_quorum)
                    .filter(|i| live[(first + i) % self.ensemble_size])
                    .count()
                    >= self.ack_quorum
            })
    }
}

fn known_len_ok(v: &[bool], e: usize) -> bool {
    v.len() == e
}

/// Whether a fence answer makes the bookie "known" for ensemble coverage.
pub fn fence_answer_known(status: BookieStatus) -> bool {
    status == BookieStatus::Ok || status.is_negative()
}

#[cfg(test)]
mod tests {
    //! Table-driven: every line of `testdata/quorum.txt` is one case.
    use super::*;

    const TESTDATA: &str = include_str!("testdata/quorum.txt");

    fn spec(words: &[&str]) -> QuorumSpec {
        let n: Vec<usize> = words.iter().map(|w| w.parse().unwrap()).collect();
        QuorumSpec::new(n[0], n[1], n[2]).unwrap()
    }

    fn bools(list: &str) -> Vec<bool> {
        list.chars()
            .map(|c| match c {
                'k' => true,
                '?' => false,
                _ => panic!("bad mask char {c}"),
            })
            .collect()
    }

    fn answers(list: &str) -> Vec<Option<ReadAnswer>> {
        list.split(',')
            .map(|a| match a {
                "found" => Some(ReadAnswer::Found),
                "missing" => Some(ReadAnswer::Missing),
                "unknown" => Some(ReadAnswer::Unknown),
                "-" => None,
                _ => panic!("bad answer {a}"),
            })
            .collect()
    }

    #[test]
    fn quorum_rules_match_the_testdata_table() {
        let mut cases = 0;
        for (no, line) in TESTDATA.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (input, want) = line.split_once("->").unwrap();
            let want = want.trim();
            let w: Vec<&str> = input.split_whitespace().collect();
            let at = format!("testdata/quorum.txt:{}: {line}", no + 1);
            match w[0] {
                "valid" => {
                    let n: Vec<usize> = w[1..4].iter().map(|x| x.parse().unwrap()).collect();
                    let got = QuorumSpec::new(n[0], n[1], n[2]).is_ok();
                    assert_eq!(got.to_string(), want, "{at}");
                }
                "writeset" => {
                    let s = spec(&w[1..4]);
                    let e: i64 = w[4].parse().unwrap();
                    let got: Vec<String> = s.write_set(e).iter().map(|x| x.to_string()).collect();
                    assert_eq!(got.join(","), want, "{at}");
                    for slot in 0..s.ensemble_size() {
                        assert_eq!(
                            s.in_write_set(e, slot),
                            s.write_set(e).contains(&slot),
                            "{at} slot {slot}"
                        );
                    }
                }
                "acked" => {
                    let s = spec(&w[1..4]);
                    let acks: usize = w[4].parse().unwrap();
                    assert_eq!(s.ack_quorum_met(acks).to_string(), want, "{at}");
                }
                "read" => {
                    let s = spec(&w[1..4]);
                    let got = match s.read_decision(&answers(w[4])) {
                        ReadDecision::Present => "present",
                        ReadDecision::Absent => "absent",
                        ReadDecision::Pending => "pending",
                        ReadDecision::Undecided => "undecided",
                    };
                    assert_eq!(got, want, "{at}");
                }
                "covered" => {
                    let s = spec(&w[1..4]);
                    assert_eq!(s.ensemble_covered(&bools(w[4])).to_string(), want, "{at}");
                }
                "canack" => {
                    let s = spec(&w[1..4]);
                    assert_eq!(
                        s.every_write_set_can_ack(&bools(w[4])).to_string(),
                        want,
                        "{at}"
                    );
                }
                other => panic!("{at}: unknown command {other}"),
            }
            cases += 1;
        }
        assert!(cases > 40, "only {cases} cases read");
    }

    #[test]
    fn only_valid_digest_ok_is_found_and_only_explicit_negatives_are_missing() {
        use BookieStatus::*;
        assert_eq!(ReadAnswer::classify(Ok, true), ReadAnswer::Found);
        assert_eq!(ReadAnswer::classify(Ok, false), ReadAnswer::Unknown);
        assert_eq!(ReadAnswer::classify(NoEntry, false), ReadAnswer::Missing);
        assert_eq!(ReadAnswer::classify(NoLedger, false), ReadAnswer::Missing);
        for s in [Fenced, Unauthorized, UnknownState, Error, Timeout] {
            assert_eq!(ReadAnswer::classify(s, false), ReadAnswer::Unknown, "{s:?}");
            assert!(!fence_answer_known(s), "{s:?}");
        }
        assert!(fence_answer_known(Ok) && fence_answer_known(NoLedger));
    }

    #[test]
    fn write_sets_are_e_distinct_stripes_for_every_shape() {
        for e in 1..=6 {
            for qw in 1..=e {
                for qa in 1..=qw {
                    let s = QuorumSpec::new(e, qw, qa).unwrap();
                    for entry in 0..(3 * e as i64) {
                        let ws = s.write_set(entry);
                        assert_eq!(ws.len(), qw);
                        assert_eq!(ws[0], entry as usize % e);
                        let mut d = ws.clone();
                        d.sort();
                        d.dedup();
                        assert_eq!(d.len(), qw, "duplicate slot in {ws:?}");
                        assert_eq!(s.write_set(entry + e as i64), ws);
                    }
                }
            }
        }
    }
}
