//! Producer de-duplication, the pure part (Pulsar's `MessageDeduplication`):
//! per producer name, the highest sequence id *pushed* (appended, maybe not
//! durable yet) and the highest *persisted* (durable), and the decision for
//! each SEND.
//!
//! Rules:
//! - a message whose id is at or below the persisted id of its producer name
//!   is a duplicate: acknowledged (with the id it carries) without being
//!   stored;
//! - one at or below the pushed id but above the persisted one may be a
//!   duplicate of a message still in flight: it waits for the original's
//!   outcome ([`DedupState::resolve`]) and is never acknowledged before the
//!   original is durable — acknowledged as a duplicate if the original was
//!   persisted, refused if it failed (the client resends);
//! - anything above the pushed id is stored, and becomes the pushed id.
//!
//! Sequence ids are opaque (G5): a batch is compared by the id the client
//! put on it (`highest_sequence_id` when it is set and not below
//! `sequence_id`, else `sequence_id`), see [`effective_id`].
//!
//! Bound: at most `producers_max` producer names are tracked; tracking one
//! more forgets the least recently used name (its next message is stored
//! whatever its id — the same trade-off as Pulsar's inactive-producer
//! expiry). Pure: no I/O, no clock.

use std::collections::{BTreeMap, HashMap};

/// Name of the system cursor that holds a topic's de-duplication snapshot
/// (its mark-delete properties: producer name → last persisted id; its
/// mark-delete position: the last entry the snapshot covers).
pub const DEDUP_CURSOR: &str = "pulsar.dedup";

/// Settings of de-duplication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupConfig {
    /// Broker default when the namespace policy does not say.
    pub enabled_default: bool,
    /// Snapshot after this many stored entries (checked every topic tick).
    pub snapshot_entries: u64,
    /// Snapshot at least this often when anything was stored (ms).
    pub snapshot_interval_ms: u64,
    /// Producer names tracked per topic at most.
    pub producers_max: usize,
}

impl Default for DedupConfig {
    fn default() -> Self {
        Self {
            enabled_default: false,
            snapshot_entries: 1000,
            snapshot_interval_ms: 120_000,
            producers_max: 10_000,
        }
    }
}

/// The id a SEND (or a stored entry's metadata) is de-duplicated by, as a
/// signed id (ids above `i64::MAX` saturate).
pub fn effective_id(sequence_id: u64, highest_sequence_id: Option<u64>) -> i64 {
    let id = match highest_sequence_id {
        Some(h) if h >= sequence_id => h,
        _ => sequence_id,
    };
    i64::try_from(id).unwrap_or(i64::MAX)
}

/// What to do with one SEND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Store it; `prev_pushed` is what to restore with
    /// [`DedupState::unpush`] if the message is refused before the append.
    Store {
        /// The pushed id before this message.
        prev_pushed: i64,
    },
    /// Already durable: acknowledge without storing.
    Duplicate,
    /// The original may still be in flight: wait for
    /// [`DedupState::resolve`] to say.
    WaitForOriginal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seqs {
    pushed: i64,
    persisted: i64,
    used: u64,
}

/// The de-duplication state of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DedupState {
    producers_max: usize,
    seqs: HashMap<String, Seqs>,
    /// `used` tick → name, for least-recently-used eviction.
    lru: BTreeMap<u64, String>,
    clock: u64,
}

impl DedupState {
    /// Nothing tracked; at most `producers_max` names (at least 1).
    pub fn new(producers_max: usize) -> Self {
        Self {
            producers_max: producers_max.max(1),
            seqs: HashMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
        }
    }

    /// A state whose persisted (and pushed) ids are `snapshot`'s.
    pub fn restore(snapshot: &BTreeMap<String, i64>, producers_max: usize) -> Self {
        let mut s = Self::new(producers_max);
        for (name, id) in snapshot {
            s.persisted(name, *id);
        }
        s
    }

    /// Names tracked.
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// No name tracked.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    fn touch(&mut self, name: &str) -> &mut Seqs {
        self.clock += 1;
        let clock = self.clock;
        if !self.seqs.contains_key(name) {
            while self.seqs.len() >= self.producers_max {
                let Some((_, oldest)) = self.lru.pop_first() else {
                    break;
                };
                self.seqs.remove(&oldest);
            }
            self.seqs.insert(
                name.to_string(),
                Seqs {
                    pushed: -1,
                    persisted: -1,
                    used: clock,
                },
            );
        }
        let Some(s) = self.seqs.get_mut(name) else {
            unreachable!("inserted above")
        };
        self.lru.remove(&s.used);
        s.used = clock;
        self.lru.insert(clock, name.to_string());
        s
    }

    /// Decides for a SEND of `name` with effective id `id`; a stored one
    /// becomes the pushed id.
    pub fn check(&mut self, name: &str, id: i64) -> Decision {
        let s = self.touch(name);
        if id <= s.persisted {
            Decision::Duplicate
        } else if id <= s.pushed {
            Decision::WaitForOriginal
        } else {
            let prev_pushed = s.pushed;
            s.pushed = id;
            Decision::Store { prev_pushed }
        }
    }

    /// The message `id` of `name` is durable (also used to replay stored
    /// entries and to restore snapshots).
    pub fn persisted(&mut self, name: &str, id: i64) {
        let s = self.touch(name);
        s.persisted = s.persisted.max(id);
        s.pushed = s.pushed.max(id);
    }

    /// A stored message of `name` was refused before its append (it was
    /// the last one pushed): the pushed id goes back to `prev_pushed`.
    pub fn unpush(&mut self, name: &str, id: i64, prev_pushed: i64) {
        if let Some(s) = self.seqs.get_mut(name)
            && s.pushed == id
        {
            s.pushed = prev_pushed.max(s.persisted);
        }
    }

    /// An append of `name` failed: what was pushed but is not durable will
    /// be resent, so the pushed id falls back to the persisted one.
    pub fn failed(&mut self, name: &str) {
        if let Some(s) = self.seqs.get_mut(name) {
            s.pushed = s.persisted;
        }
    }

    /// The outcome of a message that waits for its original
    /// ([`Decision::WaitForOriginal`]): `Some(true)` once the original is
    /// durable (acknowledge as a duplicate), `Some(false)` once it failed
    /// (or the name was forgotten: refuse, the client resends), `None`
    /// while it is in flight.
    pub fn resolve(&self, name: &str, id: i64) -> Option<bool> {
        match self.seqs.get(name) {
            None => Some(false),
            Some(s) if id <= s.persisted => Some(true),
            Some(s) if id > s.pushed => Some(false),
            Some(_) => None,
        }
    }

    /// The last persisted id of `name` (−1 when unknown): PRODUCER_SUCCESS's
    /// `last_sequence_id`.
    pub fn last_persisted(&self, name: &str) -> i64 {
        self.seqs.get(name).map_or(-1, |s| s.persisted)
    }

    /// The persisted ids (≥ 0) by name: what a snapshot stores.
    pub fn snapshot(&self) -> BTreeMap<String, i64> {
        self.seqs
            .iter()
            .filter(|(_, s)| s.persisted >= 0)
            .map(|(n, s)| (n.clone(), s.persisted))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn effective_id_prefers_a_consistent_highest_id() {
        assert_eq!(effective_id(5, None), 5);
        assert_eq!(effective_id(5, Some(9)), 9);
        // Unset highest ids arrive as 0 from some clients: ignored.
        assert_eq!(effective_id(5, Some(0)), 5);
        assert_eq!(effective_id(u64::MAX, None), i64::MAX);
    }

    /// Steps: ("check"|"ok"|"fail", id) and the expected decision of checks.
    #[test]
    fn decision_table() {
        #[derive(Debug, Clone, Copy)]
        enum Op {
            Check(i64, Decision),
            Ok(i64),
            Fail,
            Resolve(i64, Option<bool>),
            Last(i64),
        }
        use Decision::*;
        use Op::*;
        let cases: Vec<(&str, Vec<Op>)> = vec![
            (
                "fresh ids are stored",
                vec![
                    Last(-1),
                    Check(0, Store { prev_pushed: -1 }),
                    Check(1, Store { prev_pushed: 0 }),
                    Ok(0),
                    Ok(1),
                    Last(1),
                ],
            ),
            (
                "persisted ids are duplicates",
                vec![
                    Check(0, Store { prev_pushed: -1 }),
                    Ok(0),
                    Check(0, Duplicate),
                ],
            ),
            (
                "in-flight ids wait, then are duplicates",
                vec![
                    Check(3, Store { prev_pushed: -1 }),
                    Check(3, WaitForOriginal),
                    Check(2, WaitForOriginal),
                    Resolve(3, None),
                    Ok(3),
                    Resolve(3, Some(true)),
                    Resolve(2, Some(true)),
                    Check(3, Duplicate),
                ],
            ),
            (
                "a failed original refuses the waiter and is stored on resend",
                vec![
                    Check(0, Store { prev_pushed: -1 }),
                    Ok(0),
                    Check(1, Store { prev_pushed: 0 }),
                    Check(1, WaitForOriginal),
                    Fail,
                    Resolve(1, Some(false)),
                    Check(1, Store { prev_pushed: 0 }),
                    Last(0),
                ],
            ),
            (
                "gaps are fine and lower ids after a gap are duplicates",
                vec![
                    Check(10, Store { prev_pushed: -1 }),
                    Ok(10),
                    Check(5, Duplicate),
                    Check(11, Store { prev_pushed: 10 }),
                ],
            ),
        ];
        for (what, ops) in cases {
            let mut s = DedupState::new(10);
            for (i, op) in ops.iter().enumerate() {
                match *op {
                    Check(id, want) => assert_eq!(s.check("p", id), want, "{what}: step {i}"),
                    Ok(id) => s.persisted("p", id),
                    Fail => s.failed("p"),
                    Resolve(id, want) => assert_eq!(s.resolve("p", id), want, "{what}: step {i}"),
                    Last(want) => assert_eq!(s.last_persisted("p"), want, "{what}: step {i}"),
                }
            }
        }
    }

    #[test]
    fn unpush_restores_only_its_own_push() {
        let mut s = DedupState::new(10);
        assert_eq!(s.check("p", 4), Decision::Store { prev_pushed: -1 });
        let Decision::Store { prev_pushed } = s.check("p", 5) else {
            panic!()
        };
        s.unpush("p", 5, prev_pushed);
        assert_eq!(s.check("p", 4), Decision::WaitForOriginal);
        assert_eq!(s.check("p", 5), Decision::Store { prev_pushed: 4 });
        // Not the last pushed: nothing changes.
        s.unpush("p", 4, -1);
        assert_eq!(s.check("p", 5), Decision::WaitForOriginal);
    }

    #[test]
    fn least_recently_used_names_are_forgotten() {
        let mut s = DedupState::new(2);
        s.persisted("a", 1);
        s.persisted("b", 1);
        // Using "a" makes "b" the oldest.
        assert_eq!(s.check("a", 1), Decision::Duplicate);
        s.persisted("c", 1);
        assert_eq!(s.len(), 2);
        assert_eq!(s.last_persisted("b"), -1);
        assert_eq!(s.last_persisted("a"), 1);
        assert_eq!(s.last_persisted("c"), 1);
        assert_eq!(s.resolve("b", 1), Some(false));
        assert_eq!(s.lru.len(), 2);
    }

    #[test]
    fn snapshot_round_trips_persisted_ids() {
        let mut s = DedupState::new(10);
        s.persisted("a", 3);
        s.check("a", 7);
        s.check("b", 0);
        let snap = s.snapshot();
        assert_eq!(snap, BTreeMap::from([("a".to_string(), 3)]));
        let r = DedupState::restore(&snap, 10);
        assert_eq!(r.last_persisted("a"), 3);
        assert_eq!(r.last_persisted("b"), -1);
    }

    /// Random interleavings of sends, completions and failures against a
    /// model: a message is stored at most once per id as long as ids are
    /// not forgotten, nothing is acknowledged as a duplicate before its
    /// original is durable, and every id is eventually stored or refused.
    #[test]
    fn random_sequences_match_a_model() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        for round in 0..300 {
            let mut s = DedupState::new(100);
            // Model: ids durable, ids in flight (in append order), ids
            // waiting for their original.
            let mut durable: BTreeMap<i64, u32> = BTreeMap::new();
            let mut in_flight: std::collections::VecDeque<i64> = Default::default();
            let mut waiting: Vec<i64> = Vec::new();
            for _ in 0..200 {
                match rng.random_range(0..10) {
                    0..=4 => {
                        let id = rng.random_range(0..30);
                        match s.check("p", id) {
                            Decision::Store { .. } => {
                                assert!(
                                    !durable.contains_key(&id),
                                    "round {round}: {id} stored twice"
                                );
                                assert!(
                                    !in_flight.contains(&id),
                                    "round {round}: {id} in flight twice"
                                );
                                assert!(in_flight.back().is_none_or(|b| *b < id));
                                in_flight.push_back(id);
                            }
                            Decision::Duplicate => {
                                let max = durable.keys().next_back().copied().unwrap_or(-1);
                                assert!(
                                    id <= max,
                                    "round {round}: {id} acked before anything durable above it"
                                );
                            }
                            Decision::WaitForOriginal => {
                                assert!(
                                    !in_flight.is_empty(),
                                    "round {round}: waits with nothing in flight"
                                );
                                waiting.push(id);
                            }
                        }
                    }
                    5..=7 => {
                        if let Some(id) = in_flight.pop_front() {
                            s.persisted("p", id);
                            *durable.entry(id).or_default() += 1;
                        }
                    }
                    8 => {
                        if !in_flight.is_empty() {
                            in_flight.clear();
                            s.failed("p");
                        }
                    }
                    _ => {
                        waiting.retain(|id| match s.resolve("p", *id) {
                            Some(true) => {
                                let max = durable.keys().next_back().copied().unwrap_or(-1);
                                assert!(*id <= max, "round {round}: waiter {id} acked early");
                                false
                            }
                            Some(false) => false,
                            None => {
                                assert!(!in_flight.is_empty(), "round {round}: waiter {id} stuck");
                                true
                            }
                        });
                    }
                }
            }
            assert!(durable.values().all(|n| *n == 1), "round {round}");
            assert_eq!(
                s.last_persisted("p"),
                durable.keys().next_back().copied().unwrap_or(-1)
            );
        }
    }
}
