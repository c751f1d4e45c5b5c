//! Dispatcher tests: tables of rules, and a model topic + cursor (`Sim`)
//! that carries out the dispatcher's read plans the way the async layer does.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::dispatch::{HashRange, KeySharedError, KeySharedMode, KeySharedSpec};

fn pos(e: i64) -> Position {
    Position::new(1, e)
}

fn cid(i: u64) -> ConsumerId {
    ConsumerId::new(1, i)
}

fn info(i: u64, name: &str, priority: i32, sub_type: SubType) -> ConsumerInfo {
    ConsumerInfo {
        id: cid(i),
        name: name.to_string(),
        priority,
        sub_type,
        key_shared: None,
    }
}

/// One delivery: (consumer, entry id, redelivery count).
type Got = (u64, i64, u32);

/// A model topic (ledger 1, entry i holds `topic[i]` messages) and cursor.
struct Sim {
    d: Dispatcher,
    topic: Vec<u32>,
    read_after: i64,
    mark_delete: i64,
    acked: BTreeSet<i64>,
    /// Key_Shared: entry id -> sticky key hash (absent: 0).
    keys: BTreeMap<i64, u16>,
    /// Delayed delivery: entry id -> deliver-at time (absent: none).
    delays: BTreeMap<i64, u64>,
}

impl Sim {
    fn new(limits: DispatchLimits, topic: Vec<u32>) -> Self {
        Self {
            d: Dispatcher::new(limits),
            topic,
            read_after: -1,
            mark_delete: -1,
            acked: BTreeSet::new(),
            keys: BTreeMap::new(),
            delays: BTreeMap::new(),
        }
    }

    fn hash_of(&self, e: i64) -> u16 {
        self.keys.get(&e).copied().unwrap_or(0)
    }

    fn add(&mut self, i: u64, t: SubType) -> Vec<Event> {
        self.d
            .add_consumer(info(i, &format!("c{i}"), 0, t))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn flow(&mut self, i: u64, n: u32) {
        self.d.flow(cid(i), n).unwrap_or_else(|e| panic!("{e}"));
    }

    fn is_acked(&self, e: i64) -> bool {
        e <= self.mark_delete || self.acked.contains(&e)
    }

    fn entry(&self, e: i64) -> ReadEntry<()> {
        ReadEntry {
            position: pos(e),
            messages: self.topic[usize::try_from(e).unwrap_or(0)],
            key_hash: self.hash_of(e),
            deliver_at_ms: self.delays.get(&e).copied(),
            payload: (),
        }
    }

    /// Carries out read plans until there is nothing to do; returns the
    /// deliveries in order.
    fn pump(&mut self) -> Vec<Got> {
        let mut out = Vec::new();
        for _ in 0..10_000 {
            let Some(t) = self.d.next_read() else {
                return out;
            };
            let entries = match t.plan().clone() {
                ReadPlan::Rewind => {
                    self.read_after = self.mark_delete;
                    Vec::new()
                }
                ReadPlan::Replay(ps) => ps
                    .iter()
                    .map(|p| p.entry_id)
                    .filter(|e| !self.is_acked(*e))
                    .map(|e| self.entry(e))
                    .collect(),
                ReadPlan::Next { entries_max } => {
                    let mut v = Vec::new();
                    let last = i64::try_from(self.topic.len()).unwrap_or(0) - 1;
                    while v.len() < entries_max && self.read_after < last {
                        self.read_after += 1;
                        if !self.is_acked(self.read_after) {
                            v.push(self.entry(self.read_after));
                        }
                    }
                    if v.is_empty() {
                        // Tailing: nothing new; the async layer would wait.
                        let sends = self.d.read_done(t, v);
                        assert!(sends.is_empty());
                        return out;
                    }
                    v
                }
            };
            for s in self.d.read_done(t, entries) {
                out.push((s.consumer.consumer, s.position.entry_id, s.redelivery_count));
            }
        }
        panic!("pump does not settle");
    }

    fn ack(&mut self, i: u64, entries: &[i64]) {
        let ps: Vec<Position> = entries.iter().map(|e| pos(*e)).collect();
        self.d.ack(cid(i), &ps).unwrap_or_else(|e| panic!("{e}"));
        self.acked.extend(entries);
        while self.acked.remove(&(self.mark_delete + 1)) {
            self.mark_delete += 1;
        }
    }

    fn ack_cumulative(&mut self, i: u64, e: i64) {
        self.d
            .ack_cumulative(cid(i), pos(e))
            .unwrap_or_else(|e| panic!("{e}"));
        self.mark_delete = self.mark_delete.max(e);
        self.acked.retain(|a| *a > e);
        while self.acked.remove(&(self.mark_delete + 1)) {
            self.mark_delete += 1;
        }
    }
}

fn consumers_of(got: &[Got]) -> Vec<u64> {
    got.iter().map(|g| g.0).collect()
}

fn entries_of(got: &[Got]) -> Vec<i64> {
    got.iter().map(|g| g.1).collect()
}

#[test]
fn shared_is_round_robin_over_consumers_with_permits() {
    struct Case {
        name: &'static str,
        rr: u32,
        permits: &'static [u32],
        topic: &'static [u32],
        want: &'static [u64],
    }
    let cases = [
        Case {
            name: "alternates",
            rr: 1,
            permits: &[10, 10],
            topic: &[1, 1, 1, 1],
            want: &[1, 2, 1, 2],
        },
        Case {
            name: "turns of two entries",
            rr: 2,
            permits: &[10, 10],
            topic: &[1, 1, 1, 1, 1],
            want: &[1, 1, 2, 2, 1],
        },
        Case {
            name: "a consumer out of permits is skipped",
            rr: 1,
            permits: &[1, 10],
            topic: &[1, 1, 1, 1],
            want: &[1, 2, 2, 2],
        },
        Case {
            name: "nothing before flow",
            rr: 1,
            permits: &[0, 0],
            topic: &[1, 1, 1],
            want: &[],
        },
        Case {
            name: "a batch takes its messages, permits may go negative",
            rr: 1,
            permits: &[2, 0],
            topic: &[3, 1],
            want: &[1],
        },
        Case {
            name: "three consumers one permit each",
            rr: 1,
            permits: &[1, 1, 1],
            topic: &[1, 1, 1, 1, 1],
            want: &[1, 2, 3],
        },
        Case {
            name: "batches spread by permits",
            rr: 1,
            permits: &[4, 4],
            topic: &[2, 2, 2, 2, 2],
            want: &[1, 2, 1, 2],
        },
    ];
    for c in cases {
        let limits = DispatchLimits {
            round_robin_entries_max: c.rr,
            ..DispatchLimits::default()
        };
        let mut sim = Sim::new(limits, c.topic.to_vec());
        for (i, p) in c.permits.iter().enumerate() {
            let id = u64::try_from(i).unwrap_or(0) + 1;
            sim.add(id, SubType::Shared);
            sim.flow(id, *p);
        }
        let got = sim.pump();
        assert_eq!(consumers_of(&got), c.want, "{}", c.name);
        // In order, each entry once.
        let want_entries: Vec<i64> = (0..i64::try_from(c.want.len()).unwrap_or(0)).collect();
        assert_eq!(entries_of(&got), want_entries, "{}", c.name);
    }
}

#[test]
fn who_may_join_a_subscription() {
    use SubType::{Exclusive, Failover, Shared};
    // (attached consumers' type and count, new consumer's type, result)
    let busy = Err(DispatchError::ConsumerBusy { existing: cid(1) });
    type Case = (Option<(SubType, u64)>, SubType, Result<(), DispatchError>);
    let cases: Vec<Case> = vec![
        (None, Exclusive, Ok(())),
        (Some((Exclusive, 1)), Exclusive, busy),
        (
            Some((Exclusive, 1)),
            Shared,
            Err(DispatchError::SubTypeMismatch {
                current: Exclusive,
                requested: Shared,
            }),
        ),
        (Some((Shared, 2)), Shared, Ok(())),
        (Some((Failover, 2)), Failover, Ok(())),
        (
            Some((Shared, 1)),
            Failover,
            Err(DispatchError::SubTypeMismatch {
                current: Shared,
                requested: Failover,
            }),
        ),
        (
            Some((Shared, 3)),
            Shared,
            Err(DispatchError::TooManyConsumers { max: 3 }),
        ),
    ];
    for (existing, t, want) in cases {
        let mut d = Dispatcher::new(DispatchLimits {
            consumers_max: 3,
            ..DispatchLimits::default()
        });
        if let Some((et, n)) = existing {
            for i in 1..=n {
                d.add_consumer(info(i, "x", 0, et))
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        let got = d.add_consumer(info(9, "y", 0, t)).map(|_| ());
        assert_eq!(got, want, "{existing:?} + {t}");
    }
    // The same id twice; a type change once everyone left.
    let mut d = Dispatcher::new(DispatchLimits::default());
    d.add_consumer(info(1, "a", 0, Shared))
        .map(|_| ())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        d.add_consumer(info(1, "a", 0, Shared)).map(|_| ()),
        Err(DispatchError::DuplicateConsumer(cid(1)))
    );
    d.remove_consumer(cid(1))
        .map(|_| ())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.sub_type(), None);
    assert!(d.add_consumer(info(2, "b", 0, Exclusive)).is_ok());
    assert_eq!(
        d.remove_consumer(cid(7)).map(|_| ()),
        Err(DispatchError::UnknownConsumer(cid(7)))
    );
}

#[test]
fn failover_tells_consumers_when_the_active_one_changes() {
    enum Op {
        Add(u64, &'static str, i32),
        Remove(u64),
    }
    use Op::{Add, Remove};
    let on = |i| Event::ActiveChanged {
        consumer: cid(i),
        is_active: true,
    };
    let off = |i| Event::ActiveChanged {
        consumer: cid(i),
        is_active: false,
    };
    // (operation, events expected, active consumer after)
    let steps: Vec<(Op, Vec<Event>, Option<u64>)> = vec![
        (Add(1, "m", 0), vec![on(1)], Some(1)),
        // Lower in the order: only the newcomer hears (inactive).
        (Add(2, "z", 0), vec![off(2)], Some(1)),
        // A smaller name wins at equal priority: everyone hears.
        (Add(3, "a", 0), vec![off(1), off(2), on(3)], Some(3)),
        // A better priority wins over the name.
        (
            Add(4, "zz", -1),
            vec![off(1), off(2), off(3), on(4)],
            Some(4),
        ),
        // An inactive one leaving changes nothing.
        (Remove(2), vec![], Some(4)),
        // The active one leaving: the next in the order takes over.
        (Remove(4), vec![off(1), on(3)], Some(3)),
        (Remove(3), vec![on(1)], Some(1)),
        (Remove(1), vec![], None),
    ];
    let mut d = Dispatcher::new(DispatchLimits::default());
    for (i, (op, events, active)) in steps.into_iter().enumerate() {
        let got = match op {
            Add(id, name, prio) => d.add_consumer(info(id, name, prio, SubType::Failover)),
            Remove(id) => d.remove_consumer(cid(id)),
        }
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, events, "step {i}");
        assert_eq!(d.active(), active.map(cid), "step {i}");
    }
}

#[test]
fn only_the_active_failover_consumer_receives() {
    let mut sim = Sim::new(DispatchLimits::default(), vec![1; 6]);
    sim.d
        .add_consumer(info(1, "b", 0, SubType::Failover))
        .unwrap_or_else(|e| panic!("{e}"));
    sim.d
        .add_consumer(info(2, "a", 0, SubType::Failover))
        .unwrap_or_else(|e| panic!("{e}"));
    sim.flow(1, 100);
    assert!(
        sim.pump().is_empty(),
        "the inactive consumer's permits do not count"
    );
    sim.flow(2, 3);
    let got = sim.pump();
    assert_eq!(got, vec![(2, 0, 0), (2, 1, 0), (2, 2, 0)]);
}

#[test]
fn a_consumer_over_its_unacked_limit_waits_until_half_is_acked() {
    let limits = DispatchLimits {
        unacked_messages_per_consumer_max: 4,
        round_robin_entries_max: 1,
        ..DispatchLimits::default()
    };
    let mut sim = Sim::new(limits, vec![1; 20]);
    sim.add(1, SubType::Shared);
    sim.flow(1, 100);
    let got = sim.pump();
    assert_eq!(entries_of(&got), vec![0, 1, 2, 3], "blocked at 4 unacked");
    assert!(sim.d.stats().consumers[0].blocked);
    sim.ack(1, &[0]);
    assert!(sim.pump().is_empty(), "3 unacked is above half");
    sim.ack(1, &[1]);
    assert!(!sim.d.stats().consumers[0].blocked);
    let got = sim.pump();
    assert_eq!(
        entries_of(&got),
        vec![4, 5],
        "unblocked at 2, blocked again at 4"
    );
    // A second consumer is not held up by the first one's limit.
    sim.add(2, SubType::Shared);
    sim.flow(2, 2);
    assert_eq!(sim.pump(), vec![(2, 6, 0), (2, 7, 0)]);
}

#[test]
fn the_subscription_over_its_unacked_limit_stops_until_half_is_acked() {
    let limits = DispatchLimits {
        unacked_messages_per_subscription_max: 6,
        round_robin_entries_max: 1,
        ..DispatchLimits::default()
    };
    // Entry 2 is a batch of 3 messages.
    let mut sim = Sim::new(limits, vec![1, 1, 3, 1, 1, 1, 1, 1, 1, 1]);
    sim.add(1, SubType::Shared);
    sim.add(2, SubType::Shared);
    sim.flow(1, 100);
    sim.flow(2, 100);
    let got = sim.pump();
    assert_eq!(entries_of(&got), vec![0, 1, 2, 3], "1+1+3+1 = 6 messages");
    let s = sim.d.stats();
    assert!(s.blocked);
    assert_eq!(s.unacked_messages, 6);
    sim.ack(1, &[0]);
    assert!(sim.pump().is_empty(), "5 unacked is above half of 6");
    sim.ack(1, &[2]);
    assert!(!sim.d.stats().blocked);
    let got = sim.pump();
    assert_eq!(entries_of(&got), vec![4, 5, 6, 7]);
}

#[test]
fn shared_redelivery_comes_first_in_order_with_counts() {
    let limits = DispatchLimits {
        round_robin_entries_max: 1,
        ..DispatchLimits::default()
    };
    let mut sim = Sim::new(limits, vec![1; 6]);
    sim.add(1, SubType::Shared);
    sim.add(2, SubType::Shared);
    sim.flow(1, 2);
    sim.flow(2, 2);
    let got = sim.pump();
    assert_eq!(got, vec![(1, 0, 0), (2, 1, 0), (1, 2, 0), (2, 3, 0)]);
    // Consumer 1 nacks 2 and 0; a position it does not hold is ignored.
    sim.d
        .redeliver(cid(1), Some(&[pos(2), pos(0), pos(1)]))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sim.d.redelivery_count(pos(1)), 0);
    sim.flow(2, 3);
    let got = sim.pump();
    assert_eq!(got, vec![(2, 0, 1), (2, 2, 1), (2, 4, 0)]);
    // Again: the count keeps rising until acked.
    sim.d
        .redeliver(cid(2), Some(&[pos(0)]))
        .unwrap_or_else(|e| panic!("{e}"));
    sim.flow(1, 1);
    assert_eq!(sim.pump(), vec![(1, 0, 2)]);
    sim.ack(1, &[0]);
    assert_eq!(sim.d.redelivery_count(pos(0)), 0);
    assert_eq!(
        sim.d.stats().redelivery_counts,
        1,
        "entry 2 keeps its count"
    );
}

#[test]
fn a_shared_consumer_leaving_hands_its_unacked_to_the_others() {
    let limits = DispatchLimits {
        round_robin_entries_max: 1,
        ..DispatchLimits::default()
    };
    let mut sim = Sim::new(limits, vec![1; 4]);
    sim.add(1, SubType::Shared);
    sim.add(2, SubType::Shared);
    sim.flow(1, 2);
    sim.flow(2, 1);
    assert_eq!(sim.pump(), vec![(1, 0, 0), (2, 1, 0), (1, 2, 0)]);
    sim.ack(1, &[0]);
    sim.d
        .remove_consumer(cid(1))
        .unwrap_or_else(|e| panic!("{e}"));
    sim.flow(2, 10);
    assert_eq!(sim.pump(), vec![(2, 2, 1), (2, 3, 0)]);
    assert_eq!(sim.d.stats().unacked_messages, 3);
}

#[test]
fn exclusive_redelivery_rewinds_every_unacked_in_order() {
    let mut sim = Sim::new(DispatchLimits::default(), vec![1; 5]);
    sim.add(1, SubType::Exclusive);
    sim.flow(1, 4);
    assert_eq!(entries_of(&sim.pump()), vec![0, 1, 2, 3]);
    sim.ack(1, &[1]);
    // Without ids (what the C++ client sends on Exclusive/Failover).
    sim.d
        .redeliver(cid(1), None)
        .unwrap_or_else(|e| panic!("{e}"));
    sim.flow(1, 10);
    assert_eq!(
        sim.pump(),
        vec![(1, 0, 1), (1, 2, 1), (1, 3, 1), (1, 4, 0)],
        "acked 1 skipped, new 4 after the rewound ones"
    );
    // With ids it still rewinds everything (order is kept).
    sim.d
        .redeliver(cid(1), Some(&[pos(3)]))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sim.pump(), vec![(1, 0, 2), (1, 2, 2), (1, 3, 2), (1, 4, 1)]);
}

#[test]
fn a_failover_switch_redelivers_the_old_active_ones_unacked_to_the_new_one() {
    let mut sim = Sim::new(DispatchLimits::default(), vec![1; 4]);
    sim.d
        .add_consumer(info(1, "a", 0, SubType::Failover))
        .unwrap_or_else(|e| panic!("{e}"));
    sim.d
        .add_consumer(info(2, "b", 0, SubType::Failover))
        .unwrap_or_else(|e| panic!("{e}"));
    sim.flow(1, 3);
    sim.flow(2, 10);
    assert_eq!(entries_of(&sim.pump()), vec![0, 1, 2]);
    sim.ack_cumulative(1, 0);
    let events = sim
        .d
        .remove_consumer(cid(1))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        events,
        vec![Event::ActiveChanged {
            consumer: cid(2),
            is_active: true
        }]
    );
    assert_eq!(sim.pump(), vec![(2, 1, 1), (2, 2, 1), (2, 3, 0)]);
    // A higher-priority consumer joining takes over, with a rewind.
    sim.d
        .add_consumer(info(3, "c", -1, SubType::Failover))
        .unwrap_or_else(|e| panic!("{e}"));
    sim.flow(3, 10);
    assert_eq!(sim.pump(), vec![(3, 1, 2), (3, 2, 2), (3, 3, 1)]);
}

#[test]
fn cumulative_acks() {
    // (sub type, delivered entries, cumulative ack at, result, unacked after)
    let cases = [
        (SubType::Exclusive, 5, 2, Ok(()), 2),
        (SubType::Exclusive, 5, 4, Ok(()), 0),
        (SubType::Failover, 3, 0, Ok(()), 2),
        (
            SubType::Shared,
            3,
            1,
            Err(DispatchError::CumulativeAckOnShared),
            3,
        ),
    ];
    for (t, n, at, want, unacked) in cases {
        let mut sim = Sim::new(DispatchLimits::default(), vec![1; n]);
        sim.add(1, t);
        sim.flow(1, 100);
        assert_eq!(sim.pump().len(), n);
        assert_eq!(sim.d.ack_cumulative(cid(1), pos(at)), want, "{t}");
        assert_eq!(sim.d.stats().unacked_messages, unacked, "{t}");
    }
}

#[test]
fn a_read_answered_after_a_rewind_was_requested_is_dropped() {
    let mut sim = Sim::new(DispatchLimits::default(), vec![1; 4]);
    sim.add(1, SubType::Exclusive);
    sim.flow(1, 2);
    assert_eq!(entries_of(&sim.pump()), vec![0, 1]);
    sim.flow(1, 10);
    let t = sim.d.next_read().unwrap_or_else(|| panic!("a read"));
    assert_eq!(t.plan(), &ReadPlan::Next { entries_max: 10 });
    assert_eq!(sim.d.next_read(), None, "one read at a time");
    sim.d
        .redeliver(cid(1), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let late = vec![sim.entry(2), sim.entry(3)];
    sim.read_after = 3;
    assert!(sim.d.read_done(t, late).is_empty(), "stale read dropped");
    let t = sim.d.next_read().unwrap_or_else(|| panic!("a rewind"));
    assert_eq!(t.plan(), &ReadPlan::Rewind);
    sim.d.read_failed(t);
    let t = sim
        .d
        .next_read()
        .unwrap_or_else(|| panic!("the rewind again"));
    assert_eq!(t.plan(), &ReadPlan::Rewind);
    sim.read_after = sim.mark_delete;
    assert!(sim.d.read_done::<()>(t, Vec::new()).is_empty());
    assert_eq!(sim.pump(), vec![(1, 0, 1), (1, 1, 1), (1, 2, 0), (1, 3, 0)]);
}

#[test]
fn acks_during_a_replay_read_are_not_redelivered() {
    let mut sim = Sim::new(DispatchLimits::default(), vec![1; 3]);
    sim.add(1, SubType::Shared);
    sim.flow(1, 3);
    assert_eq!(sim.pump().len(), 3);
    sim.d
        .redeliver(cid(1), Some(&[pos(0), pos(1)]))
        .unwrap_or_else(|e| panic!("{e}"));
    sim.flow(1, 3);
    let t = sim.d.next_read().unwrap_or_else(|| panic!("a read"));
    assert_eq!(t.plan(), &ReadPlan::Replay(vec![pos(0), pos(1)]));
    // The entries were read before the ack reached the cursor.
    let read = vec![sim.entry(0), sim.entry(1)];
    sim.d
        .ack(cid(1), &[pos(0)])
        .unwrap_or_else(|e| panic!("{e}"));
    let sends = sim.d.read_done(t, read);
    let got: Vec<i64> = sends.iter().map(|s| s.position.entry_id).collect();
    assert_eq!(got, vec![1]);
}

#[test]
fn a_failed_read_is_retried_and_a_full_sink_gets_its_entries_later() {
    let limits = DispatchLimits {
        round_robin_entries_max: 1,
        ..DispatchLimits::default()
    };
    let mut sim = Sim::new(limits, vec![1; 4]);
    sim.add(1, SubType::Shared);
    sim.add(2, SubType::Shared);
    sim.flow(1, 10);
    sim.flow(2, 10);
    let t = sim.d.next_read().unwrap_or_else(|| panic!("a read"));
    let entries: Vec<ReadEntry<()>> = (0..4).map(|e| sim.entry(e)).collect();
    sim.read_after = 3;
    let sends = sim.d.read_done(t, entries);
    assert_eq!(sends.len(), 4);
    // Consumer 2's sink is full: its entries go back, permits returned.
    for s in sends.iter().filter(|s| s.consumer == cid(2)) {
        sim.d.send_failed(s);
    }
    let st = sim.d.stats();
    assert_eq!(
        (st.consumers[1].permits, st.consumers[1].writable),
        (10, false)
    );
    assert_eq!(st.replay_entries, 2);
    // Consumer 1 takes them (count unchanged: they were never delivered).
    let t = sim.d.next_read().unwrap_or_else(|| panic!("a replay"));
    assert_eq!(t.plan(), &ReadPlan::Replay(vec![pos(1), pos(3)]));
    sim.d.read_failed(t);
    assert_eq!(sim.pump(), vec![(1, 1, 0), (1, 3, 0)]);
}

#[test]
fn a_reset_forgets_deliveries_and_counts_but_keeps_permits() {
    let mut sim = Sim::new(DispatchLimits::default(), vec![1; 3]);
    sim.add(1, SubType::Shared);
    sim.flow(1, 10);
    assert_eq!(sim.pump().len(), 3);
    sim.d
        .redeliver(cid(1), None)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sim.d.stats().redelivery_counts, 3);
    sim.d.reset();
    sim.read_after = -1;
    let s = sim.d.stats();
    assert_eq!(
        (s.redelivery_counts, s.replay_entries, s.unacked_messages),
        (0, 0, 0)
    );
    assert_eq!(s.consumers[0].permits, 7);
    assert_eq!(sim.pump(), vec![(1, 0, 0), (1, 1, 0), (1, 2, 0)]);
}

#[test]
fn redelivery_counts_are_bounded() {
    let limits = DispatchLimits {
        redelivery_counts_max: 2,
        ..DispatchLimits::default()
    };
    let mut sim = Sim::new(limits, vec![1; 3]);
    sim.add(1, SubType::Shared);
    sim.flow(1, 10);
    assert_eq!(sim.pump().len(), 3);
    sim.d
        .redeliver(cid(1), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let s = sim.d.stats();
    assert_eq!((s.redelivery_counts, s.redelivery_counts_dropped), (2, 1));
    assert_eq!(sim.pump(), vec![(1, 0, 1), (1, 1, 1), (1, 2, 0)]);
}

#[test]
fn reads_are_bounded_by_permits_the_batch_limit_and_the_subscription_room() {
    // (read_entries_max, sub max, permits, expected entries_max)
    let cases = [
        (100, 200_000, 1000, 100),
        (100, 200_000, 7, 7),
        (100, 5, 1000, 5),
    ];
    for (read_max, sub_max, permits, want) in cases {
        let mut d = Dispatcher::new(DispatchLimits {
            read_entries_max: read_max,
            unacked_messages_per_subscription_max: sub_max,
            ..DispatchLimits::default()
        });
        d.add_consumer(info(1, "a", 0, SubType::Exclusive))
            .unwrap_or_else(|e| panic!("{e}"));
        d.flow(cid(1), permits).unwrap_or_else(|e| panic!("{e}"));
        let t = d.next_read().unwrap_or_else(|| panic!("a read"));
        assert_eq!(t.plan(), &ReadPlan::Next { entries_max: want });
    }
}

#[test]
fn reads_of_batched_entries_ask_for_about_as_many_entries_as_the_permits_take() {
    let mut d = Dispatcher::new(DispatchLimits::default());
    d.add_consumer(info(1, "a", 0, SubType::Exclusive))
        .unwrap_or_else(|e| panic!("{e}"));
    d.flow(cid(1), 1000).unwrap_or_else(|e| panic!("{e}"));
    let batch = |e: i64| ReadEntry {
        position: pos(e),
        messages: 100,
        key_hash: 0,
        deliver_at_ms: None,
        payload: (),
    };
    let mut next = 0i64;
    let mut asked = Vec::new();
    // Entries of 100 messages each: the consumer's 1,000 permits take 10.
    // Whatever is given is acked at once and its permits come back.
    for _ in 0..100 {
        let t = d.next_read().unwrap_or_else(|| panic!("a read"));
        let entries: Vec<ReadEntry<()>> = match t.plan().clone() {
            ReadPlan::Next { entries_max } => {
                asked.push(entries_max);
                (next..next + entries_max as i64).map(batch).collect()
            }
            // Read beyond the permits before: read again.
            ReadPlan::Replay(ps) => ps.iter().map(|p| batch(p.entry_id)).collect(),
            ReadPlan::Rewind => panic!("no rewind here"),
        };
        next = next.max(
            entries
                .iter()
                .map(|e| e.position.entry_id + 1)
                .max()
                .unwrap_or(next),
        );
        let given = d.read_done(t, entries);
        let got: u32 = given.iter().map(|a| a.messages).sum();
        let positions: Vec<Position> = given.iter().map(|a| a.position).collect();
        d.ack(cid(1), &positions).unwrap_or_else(|e| panic!("{e}"));
        d.flow(cid(1), got).unwrap_or_else(|e| panic!("{e}"));
    }
    // The first read knows nothing of batches (100 entries); the estimate
    // then converges on 100 messages per entry: reads of about 10 entries.
    assert_eq!(asked[0], 100);
    let last = asked[asked.len() - 1];
    assert!((10..=12).contains(&last), "asked {asked:?}");
}

/// Random consumers, permits, acks, nacks and departures on a model topic:
/// no entry is ever held by two consumers, nothing goes to a consumer
/// without permits, and once everyone acks everything every entry was
/// delivered and nothing is left pending.
#[test]
fn random_schedules_deliver_every_entry_and_hold_each_by_one_consumer() {
    for seed in 0..200u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let t = match rng.random_range(0..4) {
            0 => SubType::Shared,
            1 => SubType::Failover,
            2 => SubType::KeyShared,
            _ => SubType::Exclusive,
        };
        let n = rng.random_range(1..40usize);
        let topic: Vec<u32> = (0..n).map(|_| rng.random_range(1..4)).collect();
        let key_count = rng.random_range(1..6u16);
        let limits = DispatchLimits {
            unacked_messages_per_consumer_max: rng.random_range(2..20),
            unacked_messages_per_subscription_max: rng.random_range(4..40),
            read_entries_max: rng.random_range(1..8),
            round_robin_entries_max: rng.random_range(1..4),
            ..DispatchLimits::default()
        };
        let mut sim = Sim::new(limits, topic);
        for e in 0..n {
            let e = i64::try_from(e).unwrap_or(0);
            sim.keys.insert(e, rng.random_range(0..key_count));
        }
        let mut next_id = 1u64;
        let mut held: BTreeMap<i64, u64> = BTreeMap::new();
        let mut delivered: BTreeSet<i64> = BTreeSet::new();
        let mut permits: BTreeMap<u64, i64> = BTreeMap::new();
        for _ in 0..rng.random_range(5..60) {
            let ids = sim.d.consumer_ids();
            match rng.random_range(0..10) {
                0 | 1 if t != SubType::Exclusive || ids.is_empty() => {
                    let prio = rng.random_range(0..3);
                    sim.d
                        .add_consumer(info(
                            next_id,
                            &format!("c{}", rng.random_range(0..5)),
                            prio,
                            t,
                        ))
                        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                    permits.insert(next_id, 0);
                    next_id += 1;
                }
                2 if !ids.is_empty() => {
                    let id = ids[rng.random_range(0..ids.len())];
                    sim.d.remove_consumer(id).unwrap_or_else(|e| panic!("{e}"));
                    held.retain(|_, c| *c != id.consumer);
                    permits.remove(&id.consumer);
                }
                3..=5 if !ids.is_empty() => {
                    let id = ids[rng.random_range(0..ids.len())];
                    let p = rng.random_range(1..10);
                    sim.flow(id.consumer, p);
                    *permits.entry(id.consumer).or_default() += i64::from(p);
                }
                6 | 7 => {
                    let mine: Vec<(i64, u64)> = held.iter().map(|(e, c)| (*e, *c)).collect();
                    if let Some(&(e, c)) = mine.get(rng.random_range(0..mine.len().max(1))) {
                        sim.ack(c, &[e]);
                        held.remove(&e);
                    }
                }
                8 if !ids.is_empty() => {
                    let id = ids[rng.random_range(0..ids.len())];
                    sim.d.redeliver(id, None).unwrap_or_else(|e| panic!("{e}"));
                    if t.is_multi() {
                        held.retain(|_, c| *c != id.consumer);
                    } else if sim.d.active() == Some(id) {
                        held.clear();
                    }
                }
                _ => {}
            }
            if !t.is_multi() && sim.d.stats().pending_entries == 0 {
                held.clear();
            }
            for (c, e, _) in sim.pump() {
                let p = permits.entry(c).or_default();
                assert!(*p > 0, "seed {seed}: entry {e} to {c} without permits");
                *p -= i64::from(sim.topic[usize::try_from(e).unwrap_or(0)]);
                assert!(!sim.is_acked(e), "seed {seed}: acked entry {e} delivered");
                if t == SubType::KeyShared {
                    // Per-key order: every earlier entry of the key is acked
                    // or held by this same consumer.
                    let h = sim.hash_of(e);
                    for q in 0..e {
                        if sim.hash_of(q) == h && !sim.is_acked(q) {
                            assert_eq!(
                                held.get(&q),
                                Some(&c),
                                "seed {seed}: entry {e} of hash {h} to {c} before entry {q}"
                            );
                        }
                    }
                }
                if t.is_multi() {
                    assert!(
                        held.insert(e, c).is_none(),
                        "seed {seed}: entry {e} held twice"
                    );
                } else {
                    held.insert(e, c);
                }
                delivered.insert(e);
            }
        }
        // Drain: one consumer with plenty of permits acks everything.
        for id in sim.d.consumer_ids() {
            sim.d.remove_consumer(id).unwrap_or_else(|e| panic!("{e}"));
        }
        sim.d
            .add_consumer(info(1000, "drain", 0, t))
            .unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..1000 {
            sim.flow(1000, 1000);
            let got = sim.pump();
            if got.is_empty()
                && sim.acked.len() + usize::try_from(sim.mark_delete + 1).unwrap_or(0) == n
            {
                break;
            }
            for (_, e, _) in got {
                delivered.insert(e);
                sim.ack(1000, &[e]);
            }
        }
        assert_eq!(delivered.len(), n, "seed {seed}: every entry delivered");
        assert_eq!(
            sim.mark_delete + 1,
            i64::try_from(n).unwrap_or(0),
            "seed {seed}"
        );
        let s = sim.d.stats();
        assert_eq!(
            (s.pending_entries, s.unacked_messages),
            (0, 0),
            "seed {seed}"
        );
    }
}

// ---- Key_Shared ----

fn key_shared_sim(limits: DispatchLimits, n: usize, keys: &[&str]) -> Sim {
    let mut sim = Sim::new(limits, vec![1; n]);
    for e in 0..n {
        let k = keys[e % keys.len()];
        let e = i64::try_from(e).unwrap_or(0);
        sim.keys.insert(
            e,
            crate::dispatch::key_shared::sticky_key_hash(k.as_bytes()),
        );
    }
    sim
}

fn add_key_shared(sim: &mut Sim, i: u64, name: &str, spec: Option<KeySharedSpec>) {
    sim.d
        .add_consumer(ConsumerInfo {
            key_shared: spec,
            ..info(i, name, 0, SubType::KeyShared)
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Keys whose hashes the selector gives to consumers with these names.
fn owner_by_key(names: &[(u64, &str)], keys: &[String]) -> BTreeMap<String, u64> {
    let mut s = crate::dispatch::key_shared::Selector::new();
    for (i, n) in names {
        s.add(cid(*i), n, &KeySharedSpec::default())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    keys.iter()
        .map(|k| {
            let h = crate::dispatch::key_shared::sticky_key_hash(k.as_bytes());
            let c = s.select(h).unwrap_or_else(|| panic!("no owner"));
            (k.clone(), c.consumer)
        })
        .collect()
}

#[test]
fn key_shared_sends_each_key_to_one_consumer_in_order() {
    let keys: Vec<String> = (0..30).map(|k| format!("key-{k}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut sim = key_shared_sim(DispatchLimits::default(), 300, &key_refs);
    for (i, n) in [(1, "a"), (2, "b"), (3, "c")] {
        add_key_shared(&mut sim, i, n, None);
        sim.flow(i, 1_000);
    }
    let got = sim.pump();
    assert_eq!(got.len(), 300);
    let owners = owner_by_key(&[(1, "a"), (2, "b"), (3, "c")], &keys);
    let mut last: BTreeMap<usize, i64> = BTreeMap::new();
    for (c, e, count) in &got {
        let k = usize::try_from(*e).unwrap_or(0) % keys.len();
        assert_eq!(owners[&keys[k]], *c, "entry {e} of {}", keys[k]);
        assert!(
            last.insert(k, *e).is_none_or(|p| p < *e),
            "order of {}",
            keys[k]
        );
        assert_eq!(*count, 0);
    }
    let used: BTreeSet<u64> = consumers_of(&got).into_iter().collect();
    assert_eq!(used.len(), 3, "every consumer gets keys");
    // Cumulative acks and a Shared consumer are refused.
    assert_eq!(
        sim.d.ack_cumulative(cid(1), pos(5)),
        Err(DispatchError::CumulativeAckOnShared)
    );
    assert!(matches!(
        sim.d.add_consumer(info(9, "s", 0, SubType::Shared)),
        Err(DispatchError::SubTypeMismatch { .. })
    ));
}

#[test]
fn key_shared_waits_for_permits_of_the_owner_without_stalling_other_keys() {
    // Two keys, owned by different consumers; one consumer has no permits.
    let keys = ["k0".to_string(), "k1".to_string()];
    let names = [(1, "a"), (2, "b")];
    let owners = owner_by_key(&names, &keys);
    let (k_a, k_b): (Vec<_>, Vec<_>) = (0..40)
        .map(|i| (format!("x{i}"), i))
        .map(|(k, _)| k)
        .partition(|k| owner_by_key(&names, std::slice::from_ref(k))[k] == 1);
    assert!(!k_a.is_empty() && !k_b.is_empty(), "{owners:?}");
    let key_refs = [k_a[0].as_str(), k_b[0].as_str()];
    let mut sim = key_shared_sim(DispatchLimits::default(), 10, &key_refs);
    add_key_shared(&mut sim, 1, "a", None);
    add_key_shared(&mut sim, 2, "b", None);
    sim.flow(2, 100);
    let got = sim.pump();
    // b's key (odd entries) flows; a's key waits.
    assert_eq!(entries_of(&got), vec![1, 3, 5, 7, 9]);
    sim.flow(1, 100);
    let got = sim.pump();
    assert_eq!(entries_of(&got), vec![0, 2, 4, 6, 8]);
    assert_eq!(consumers_of(&got), vec![1; 5]);
}

/// Entry ids and keys for draining tests: keys that `a` owns alone and
/// that `b` takes over when it joins.
fn taken_over_key(names_before: &[(u64, &str)], names_after: &[(u64, &str)]) -> (String, String) {
    let cands: Vec<String> = (0..500).map(|i| format!("key-{i}")).collect();
    let before = owner_by_key(names_before, &cands);
    let after = owner_by_key(names_after, &cands);
    let moved = cands
        .iter()
        .find(|k| before[*k] != after[*k])
        .unwrap_or_else(|| panic!("no key moves"))
        .clone();
    let kept = cands
        .iter()
        .find(|k| before[*k] == after[*k])
        .unwrap_or_else(|| panic!("no key stays"))
        .clone();
    (moved, kept)
}

#[test]
fn a_joining_consumer_gets_a_taken_hash_only_after_the_old_deliveries_are_acked() {
    for allow_out_of_order in [false, true] {
        let (moved, kept) = taken_over_key(&[(1, "a")], &[(1, "a"), (2, "b")]);
        // Entries 0..4 before the join, 4..8 after; even: moved, odd: kept.
        let mut sim = key_shared_sim(
            DispatchLimits::default(),
            4,
            &[moved.as_str(), kept.as_str()],
        );
        let spec = KeySharedSpec {
            allow_out_of_order,
            ..KeySharedSpec::default()
        };
        add_key_shared(&mut sim, 1, "a", Some(spec.clone()));
        sim.flow(1, 100);
        assert_eq!(entries_of(&sim.pump()), vec![0, 1, 2, 3]);
        add_key_shared(&mut sim, 2, "b", Some(spec));
        sim.flow(2, 100);
        sim.topic.extend([1, 1, 1, 1]);
        for e in 4..8 {
            let k = if e % 2 == 0 { &moved } else { &kept };
            sim.keys.insert(
                e,
                crate::dispatch::key_shared::sticky_key_hash(k.as_bytes()),
            );
        }
        let got = sim.pump();
        if allow_out_of_order {
            assert_eq!(got, vec![(2, 4, 0), (1, 5, 0), (2, 6, 0), (1, 7, 0)]);
            continue;
        }
        // The moved key waits for a's acks of 0 and 2; the kept key flows.
        assert_eq!(got, vec![(1, 5, 0), (1, 7, 0)]);
        assert_eq!(sim.d.stats().draining_hashes, 2);
        sim.ack(1, &[0]);
        assert_eq!(sim.pump(), vec![]);
        sim.ack(1, &[2]);
        assert_eq!(sim.pump(), vec![(2, 4, 0), (2, 6, 0)]);
    }
}

#[test]
fn a_leaving_consumer_s_unacked_go_to_the_new_owner_in_order_before_newer_ones() {
    let (moved, _) = taken_over_key(&[(1, "a")], &[(1, "a"), (2, "b")]);
    // Every entry has the key b owns while both are attached.
    let mut sim = key_shared_sim(DispatchLimits::default(), 6, &[moved.as_str()]);
    add_key_shared(&mut sim, 2, "b", None);
    sim.flow(2, 3);
    assert_eq!(entries_of(&sim.pump()), vec![0, 1, 2]);
    add_key_shared(&mut sim, 1, "a", None);
    sim.flow(1, 100);
    // a does not own the key: nothing for it; b has no permits left.
    assert_eq!(sim.pump(), vec![]);
    sim.ack(2, &[1]);
    sim.d
        .remove_consumer(cid(2))
        .unwrap_or_else(|e| panic!("{e}"));
    // a owns it now: 0 and 2 again (count 1), then the newer 3..6 in order.
    assert_eq!(
        sim.pump(),
        vec![(1, 0, 1), (1, 2, 1), (1, 3, 0), (1, 4, 0), (1, 5, 0)]
    );
}

#[test]
fn sticky_consumers_get_their_declared_ranges_only() {
    let h = |k: &str| crate::dispatch::key_shared::sticky_key_hash(k.as_bytes());
    let (lo, hi) = (0..100)
        .map(|i| format!("s{i}"))
        .fold((None, None), |(lo, hi), k| {
            if h(&k) < 32_768 {
                (lo.or(Some(k)), hi)
            } else {
                (lo, hi.or(Some(k)))
            }
        });
    let (lo, hi) = (lo.unwrap_or_default(), hi.unwrap_or_default());
    let mut sim = key_shared_sim(DispatchLimits::default(), 6, &[lo.as_str(), hi.as_str()]);
    let sticky = |r: (u16, u16)| KeySharedSpec {
        mode: KeySharedMode::Sticky,
        ranges: vec![HashRange {
            start: r.0,
            end: r.1,
        }],
        allow_out_of_order: false,
    };
    add_key_shared(&mut sim, 1, "low", Some(sticky((0, 32_767))));
    sim.flow(1, 100);
    // The upper half has no consumer: its entries wait, the rest flows.
    assert_eq!(sim.pump(), vec![(1, 0, 0), (1, 2, 0), (1, 4, 0)]);
    let clash = sim.d.add_consumer(ConsumerInfo {
        key_shared: Some(sticky((30_000, 40_000))),
        ..info(3, "clash", 0, SubType::KeyShared)
    });
    assert!(
        matches!(
            clash,
            Err(DispatchError::KeyShared(
                KeySharedError::RangeConflict { .. }
            ))
        ),
        "{clash:?}"
    );
    let auto = sim.d.add_consumer(info(4, "auto", 0, SubType::KeyShared));
    assert!(
        matches!(
            auto,
            Err(DispatchError::KeyShared(
                KeySharedError::ModeMismatch { .. }
            ))
        ),
        "{auto:?}"
    );
    add_key_shared(&mut sim, 2, "high", Some(sticky((32_768, 65_535))));
    sim.flow(2, 100);
    assert_eq!(sim.pump(), vec![(2, 1, 0), (2, 3, 0), (2, 5, 0)]);
}

#[test]
fn key_shared_lookahead_is_bounded() {
    // One key, its owner without permits... but another consumer with
    // permits keeps reads going: at most `key_shared_lookahead_max` wait.
    let keys: Vec<String> = (0..500).map(|i| format!("key-{i}")).collect();
    let owners = owner_by_key(&[(1, "a"), (2, "b")], &keys);
    let a_key = keys
        .iter()
        .find(|k| owners[*k] == 1)
        .unwrap_or_else(|| panic!("no key for a"));
    let limits = DispatchLimits {
        key_shared_lookahead_max: 5,
        read_entries_max: 2,
        ..DispatchLimits::default()
    };
    let mut sim = key_shared_sim(limits, 50, &[a_key.as_str()]);
    add_key_shared(&mut sim, 1, "a", None);
    add_key_shared(&mut sim, 2, "b", None);
    sim.flow(2, 100);
    assert_eq!(sim.pump(), vec![]);
    let s = sim.d.stats();
    assert!(
        (5..=6).contains(&s.replay_entries),
        "waiting {}",
        s.replay_entries
    );
    assert!(sim.read_after < 10, "read on to {}", sim.read_after);
}

// ---- delayed delivery (issue 8 item 4) ----

fn delayed_sim(t: SubType, read_entries_max: usize, delayed_max: usize) -> Sim {
    let limits = DispatchLimits {
        read_entries_max,
        delayed_entries_max: delayed_max,
        ..DispatchLimits::default()
    };
    let mut sim = Sim::new(limits, vec![1; 6]);
    sim.delays.insert(1, 100);
    sim.delays.insert(3, 50);
    sim.add(1, t);
    sim.flow(1, 100);
    sim
}

#[test]
fn shared_holds_delayed_entries_until_due_and_the_rest_go_on() {
    for t in [SubType::Shared, SubType::KeyShared] {
        let mut sim = delayed_sim(t, 100, 1_000);
        sim.d.advance_clock(10);
        assert_eq!(entries_of(&sim.pump()), vec![0, 2, 4, 5], "{t}");
        assert_eq!(sim.d.stats().delayed_entries, 2, "{t}");
        assert_eq!(sim.d.next_delayed_due(), Some(50), "{t}");
        // Held entries took no permits.
        assert_eq!(sim.d.stats().consumers[0].permits, 96, "{t}");
        sim.d.advance_clock(49);
        assert!(sim.pump().is_empty(), "{t}: nothing is early");
        sim.d.advance_clock(50);
        assert_eq!(sim.pump(), vec![(1, 3, 0)], "{t}");
        assert_eq!(sim.d.next_delayed_due(), Some(100), "{t}");
        sim.d.advance_clock(500);
        assert_eq!(sim.pump(), vec![(1, 1, 0)], "{t}");
        assert_eq!(sim.d.next_delayed_due(), None, "{t}");
        assert_eq!(sim.d.stats().delayed_entries, 0, "{t}");
    }
}

#[test]
fn exclusive_and_failover_deliver_delayed_entries_at_once() {
    for t in [SubType::Exclusive, SubType::Failover] {
        let mut sim = delayed_sim(t, 100, 1_000);
        sim.d.advance_clock(10);
        assert_eq!(entries_of(&sim.pump()), vec![0, 1, 2, 3, 4, 5], "{t}");
        assert_eq!(sim.d.next_delayed_due(), None, "{t}");
    }
}

#[test]
fn a_full_delayed_tracker_stops_reading_ahead_until_entries_come_due() {
    // One entry per read; room for one held entry.
    let mut sim = delayed_sim(SubType::Shared, 1, 1);
    sim.d.advance_clock(10);
    // 0 goes, 1 is held; the tracker is full: 2.. are not read.
    assert_eq!(entries_of(&sim.pump()), vec![0]);
    assert_eq!(sim.d.stats().delayed_entries, 1);
    assert!(sim.d.next_read().is_none(), "no read past the bound");
    sim.d.advance_clock(100);
    // 1 is due; reading resumes: 2 goes, 3 (due at 50 < now) goes too.
    assert_eq!(entries_of(&sim.pump()), vec![1, 2, 3, 4, 5]);
}

#[test]
fn acking_a_held_entry_or_seeking_forgets_it() {
    let mut sim = delayed_sim(SubType::Shared, 100, 1_000);
    sim.d.advance_clock(10);
    assert_eq!(entries_of(&sim.pump()), vec![0, 2, 4, 5]);
    sim.ack(1, &[3]);
    assert_eq!(sim.d.next_delayed_due(), Some(100));
    sim.d.reset();
    assert_eq!(sim.d.next_delayed_due(), None);
    assert_eq!(sim.d.stats().delayed_entries, 0);
}

#[test]
fn an_exclusive_consumer_after_shared_ones_gets_the_held_entries_in_order() {
    let mut sim = delayed_sim(SubType::Shared, 100, 1_000);
    sim.d.advance_clock(10);
    let got = sim.pump();
    assert_eq!(entries_of(&got), vec![0, 2, 4, 5]);
    sim.ack(1, &[0, 2, 4, 5]);
    sim.d
        .remove_consumer(cid(1))
        .unwrap_or_else(|e| panic!("{e}"));
    sim.add(2, SubType::Exclusive);
    sim.flow(2, 100);
    assert_eq!(entries_of(&sim.pump()), vec![1, 3]);
}
