//! Behaviour of the history checker: clean histories pass, each planted
//! fault is reported as exactly its violation kind, legitimate redeliveries
//! and uncertain sends pass, and seeded random correct histories pass until
//! one fault is planted.

// The generator and planting helpers are test code outside `#[test]` fns,
// where `allow-unwrap-in-tests` does not reach; a panic there is a test failure.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use cms_tests::history::{
    CheckOptions, ConsumerRecorder, DuplicateReason, Event, EventKind, History, MessageId,
    ProducerRecorder, ReceiveEvent, Report, SubType, Violation, ViolationKind, check,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const T: &str = "persistent://tenant/ns/topic";
const EVENTS_MAX: usize = 1_000_000;

fn id(ledger: u64, entry: u64) -> MessageId {
    MessageId::new(ledger, entry)
}

fn kinds(report: &Report) -> BTreeSet<ViolationKind> {
    report.kinds().into_keys().collect()
}

fn only(report: &Report, kind: ViolationKind) {
    assert_eq!(kinds(report), BTreeSet::from([kind]), "{report}");
}

/// The report holds exactly one violation, an unexpected duplicate for `reason`.
fn only_duplicate(report: &Report, reason: DuplicateReason) {
    only(report, ViolationKind::UnexpectedDuplicate);
    assert_eq!(report.violations.len(), 1, "{report}");
    match &report.violations[0] {
        Violation::UnexpectedDuplicate { reason: got, .. } => assert_eq!(got, &reason, "{report}"),
        other => panic!("not a duplicate: {other}"),
    }
}

/// Sends `payload` from `p` and acks it at `mid`.
fn send_acked(p: &ProducerRecorder, key: Option<&str>, payload: &str, mid: MessageId) {
    p.invoked(key, payload);
    p.acked(payload, mid);
}

/// A history with producer `p1` on [`T`] and consumer `c1` on its
/// subscription `sub`, of type `sub_type`.
fn producer_and_consumer(sub_type: SubType) -> (History, ProducerRecorder, ConsumerRecorder) {
    let h = History::new(EVENTS_MAX);
    let p = h.producer("p1", T);
    let c = h.consumer("c1", T, "sub", sub_type);
    (h, p, c)
}

fn complete(sub: &str) -> CheckOptions {
    CheckOptions::at_least_once().require_complete(T, sub)
}

#[test]
fn clean_exclusive_history_passes() {
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    for i in 0..5 {
        send_acked(&p, None, &format!("m{i}"), id(1, i));
    }
    for i in 0..5 {
        c.received(None, &format!("m{i}"), id(1, i), 0);
        c.acked(id(1, i), Some(&format!("m{i}")));
    }
    h.cursor_position(T, "sub", id(1, 4));
    let report = h.check(&complete("sub"));
    report.assert_ok();
    assert_eq!(report.counts.sent, 5);
    assert_eq!(report.counts.acked, 5);
    assert_eq!(report.counts.received, 5);
    assert_eq!(report.counts.unique_received, 5);
}

#[test]
fn lost_acked_message_is_flagged() {
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    send_acked(&p, None, "m0", id(1, 0));
    send_acked(&p, None, "m1", id(1, 1));
    c.received(None, "m0", id(1, 0), 0);
    let report = h.check(&complete("sub"));
    only(&report, ViolationKind::LostAck);
    let text = report.violations[0].to_string();
    assert!(text.contains("`m1`") && text.contains("1:1:-1"), "{text}");
    // A subscription not required to be complete may miss it.
    h.check(&CheckOptions::at_least_once()).assert_ok();
}

/// Found by the fault suite's lossy-network soak: a resend after a reset
/// connection that the broker de-duplicates is acked with `-1:-1` (Pulsar's
/// receipt for a duplicate). Acked, so it must still be delivered; but its
/// position is unknown, so it neither diverges from nor reorders against
/// other sends.
#[test]
fn deduplicated_resend_acked_without_position_counts_only_for_lost_acks() {
    let dup = MessageId::new(u64::MAX, u64::MAX);
    assert!(dup.is_unknown_position());
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    send_acked(&p, None, "m0", id(1, 0));
    send_acked(&p, None, "m1", dup);
    send_acked(&p, None, "m2", id(1, 2));
    send_acked(&p, None, "m3", dup);
    for (i, m) in ["m0", "m1", "m2"].iter().enumerate() {
        c.received(None, m, id(1, i as u64), 0);
        c.acked(id(1, i as u64), Some(m));
    }
    // m3 was acked (as a duplicate of a stored copy) but never delivered.
    let report = h.check(&complete("sub"));
    only(&report, ViolationKind::LostAck);
    assert!(
        report.violations[0].to_string().contains("`m3`"),
        "{report}"
    );
    c.received(None, "m3", id(1, 3), 0);
    h.check(&complete("sub")).assert_ok();
}

#[test]
fn duplicate_without_redelivery_is_flagged() {
    let (h, p, c) = producer_and_consumer(SubType::Shared);
    send_acked(&p, None, "m0", id(1, 0));
    c.received(None, "m0", id(1, 0), 0);
    c.received(None, "m0", id(1, 0), 0);
    let report = h.check(&complete("sub"));
    only_duplicate(&report, DuplicateReason::NotRedelivered);
}

#[test]
fn redelivery_of_an_acked_message_is_flagged_even_with_a_redelivery_count() {
    let (h, p, c) = producer_and_consumer(SubType::Shared);
    send_acked(&p, None, "m0", id(1, 0));
    c.received(None, "m0", id(1, 0), 0);
    let ack = c.acked(id(1, 0), Some("m0"));
    c.received(None, "m0", id(1, 0), 1);
    let report = h.check(&complete("sub"));
    only_duplicate(&report, DuplicateReason::AfterAck { ack_index: ack });
}

#[test]
fn acked_message_redelivered_after_a_fault_passes() {
    // The cursor may not have persisted the ack before the broker died.
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    send_acked(&p, None, "m0", id(1, 0));
    c.received(None, "m0", id(1, 0), 0);
    c.acked(id(1, 0), Some("m0"));
    h.fault("kill -9 broker-1");
    c.received(None, "m0", id(1, 0), 0);
    h.check(&complete("sub")).assert_ok();
}

#[test]
fn redelivery_duplicates_pass_at_least_once_and_fail_strict() {
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    for i in 0..3 {
        send_acked(&p, None, &format!("m{i}"), id(1, i));
    }
    c.received(None, "m0", id(1, 0), 0);
    c.received(None, "m1", id(1, 1), 0);
    // Redelivery count grew: a nack redelivery.
    c.received(None, "m1", id(1, 1), 1);
    c.received(None, "m2", id(1, 2), 0);
    // A reconnect rewinds everything unacked, counts unchanged.
    c.redelivery_triggered("reconnect");
    c.received(None, "m0", id(1, 0), 0);
    c.received(None, "m1", id(1, 1), 1);
    c.received(None, "m2", id(1, 2), 0);
    // A fault anywhere opens a window too.
    h.fault("SIGSTOP broker-1");
    c.received(None, "m2", id(1, 2), 0);
    h.check(&complete("sub")).assert_ok();
    let strict = h.check(&CheckOptions::strict().require_complete(T, "sub"));
    only(&strict, ViolationKind::UnexpectedDuplicate);
    assert_eq!(strict.violations.len(), 5);
}

#[test]
fn redelivered_sequence_may_restart_from_an_earlier_point() {
    let (h, p, c) = producer_and_consumer(SubType::Failover);
    for i in 0..6 {
        send_acked(&p, None, &format!("m{i}"), id(1, i));
    }
    for i in 0..4 {
        c.received(None, &format!("m{i}"), id(1, i), 0);
    }
    c.acked(id(1, 0), None);
    c.acked(id(1, 2), None);
    c.redelivery_triggered("negative ack");
    // Restart at 1, skipping the individually acked 2, then new messages.
    c.received(None, "m1", id(1, 1), 1);
    c.received(None, "m3", id(1, 3), 1);
    c.received(None, "m4", id(1, 4), 0);
    c.received(None, "m5", id(1, 5), 0);
    h.check(&complete("sub")).assert_ok();
}

#[test]
fn reorder_in_an_exclusive_subscription_is_flagged() {
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    for i in 0..3 {
        send_acked(&p, None, &format!("m{i}"), id(1, i));
    }
    c.received(None, "m0", id(1, 0), 0);
    c.received(None, "m2", id(1, 2), 0);
    c.received(None, "m1", id(1, 1), 0);
    let report = h.check(&complete("sub"));
    only(&report, ViolationKind::Reorder);
    let text = report.violations[0].to_string();
    assert!(
        text.contains("`m1`") && text.contains("`m2`") && text.contains("Exclusive"),
        "{text}"
    );
}

#[test]
fn first_delivery_behind_a_later_one_is_a_reorder_even_after_a_fault() {
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    for i in 0..3 {
        send_acked(&p, None, &format!("m{i}"), id(1, i));
    }
    c.received(None, "m0", id(1, 0), 0);
    c.received(None, "m2", id(1, 2), 0);
    h.fault("restart broker-1");
    c.received(None, "m1", id(1, 1), 0);
    c.received(None, "m2", id(1, 2), 0);
    only(&h.check(&complete("sub")), ViolationKind::Reorder);
}

#[test]
fn reorder_within_a_key_is_flagged_for_key_shared() {
    let (h, p, c) = producer_and_consumer(SubType::KeyShared);
    send_acked(&p, Some("a"), "a0", id(1, 0));
    send_acked(&p, Some("a"), "a1", id(1, 1));
    c.received(Some("a"), "a1", id(1, 1), 0);
    c.received(Some("a"), "a0", id(1, 0), 0);
    let report = h.check(&complete("sub"));
    only(&report, ViolationKind::Reorder);
    assert!(report.violations[0].to_string().contains("key `a`"));
}

#[test]
fn interleaved_keys_in_order_per_key_pass_for_key_shared() {
    let h = History::new(EVENTS_MAX);
    let p = h.producer("p1", T);
    let ca = h.consumer("ca", T, "sub", SubType::KeyShared);
    let cb = h.consumer("cb", T, "sub", SubType::KeyShared);
    for i in 0..6 {
        let key = if i % 2 == 0 { "a" } else { "b" };
        send_acked(&p, Some(key), &format!("{key}{i}"), id(1, i));
    }
    // Key b's messages all arrive before key a's: out of id order across
    // keys, in order within each key.
    for i in [1, 3, 5] {
        cb.received(Some("b"), &format!("b{i}"), id(1, i), 0);
    }
    for i in [0, 2, 4] {
        ca.received(Some("a"), &format!("a{i}"), id(1, i), 0);
    }
    h.check(&complete("sub")).assert_ok();
    // The same receipts in an Exclusive subscription are a reorder.
    let mut events = h.events();
    for e in &mut events {
        if let EventKind::Receive(r) = &mut e.kind {
            r.sub_type = SubType::Exclusive;
        }
    }
    only(&check(&events, &complete("sub")), ViolationKind::Reorder);
}

#[test]
fn shared_subscription_split_across_two_consumers_is_complete() {
    let h = History::new(EVENTS_MAX);
    let p = h.producer("p1", T);
    let c1 = h.consumer("c1", T, "sub", SubType::Shared);
    let c2 = h.consumer("c2", T, "sub", SubType::Shared);
    for i in 0..6 {
        send_acked(&p, None, &format!("m{i}"), id(1, i));
    }
    // Round robin, and out of order across consumers: Shared promises none.
    for i in [1, 0, 3, 2, 5, 4] {
        let c = if i % 2 == 0 { &c1 } else { &c2 };
        c.received(None, &format!("m{i}"), id(1, i), 0);
        c.acked(id(1, i), None);
    }
    h.cursor_position(T, "sub", id(1, 5));
    let report = h.check(&complete("sub"));
    report.assert_ok();
    assert_eq!(report.counts.unique_received, 6);
}

#[test]
fn cursor_past_a_received_but_unacked_message_is_flagged() {
    let (h, p, c) = producer_and_consumer(SubType::Shared);
    for i in 0..3 {
        send_acked(&p, None, &format!("m{i}"), id(1, i));
        c.received(None, &format!("m{i}"), id(1, i), 0);
    }
    c.acked(id(1, 0), None);
    c.acked(id(1, 2), None);
    h.cursor_position(T, "sub", id(1, 0));
    h.check(&complete("sub")).assert_ok();
    h.cursor_position(T, "sub", id(1, 2));
    let report = h.check(&complete("sub"));
    only(&report, ViolationKind::CursorPastUnacked);
    assert!(matches!(
        &report.violations[0],
        Violation::CursorPastUnacked { payload_id, received: true, unacked_covered: 1, .. } if payload_id == "m1"
    ));
}

#[test]
fn cursor_past_a_never_received_message_is_flagged_for_a_complete_subscription() {
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    send_acked(&p, None, "m0", id(1, 0));
    send_acked(&p, None, "m1", id(1, 1));
    c.received(None, "m1", id(1, 1), 0);
    c.acked(id(1, 1), Some("m1"));
    h.cursor_position(T, "sub", id(1, 1));
    let report = h.check(&complete("sub"));
    assert_eq!(
        kinds(&report),
        BTreeSet::from([ViolationKind::LostAck, ViolationKind::CursorPastUnacked]),
        "{report}"
    );
    // The cumulative ack covers m0 once an ack of it precedes the observation.
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    send_acked(&p, None, "m0", id(1, 0));
    send_acked(&p, None, "m1", id(1, 1));
    c.received(None, "m0", id(1, 0), 0);
    c.received(None, "m1", id(1, 1), 0);
    c.acked_cumulative(id(1, 1));
    h.cursor_position(T, "sub", id(1, 1));
    h.check(&complete("sub")).assert_ok();
}

#[test]
fn phantom_message_is_flagged() {
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    send_acked(&p, None, "m0", id(1, 0));
    c.received(None, "m0", id(1, 0), 0);
    c.received(None, "ghost", id(1, 1), 0);
    // Sent to another topic does not count.
    h.producer("p2", "persistent://tenant/ns/other")
        .invoked(None, "elsewhere");
    c.received(None, "elsewhere", id(1, 2), 0);
    let report = h.check(&complete("sub"));
    only(&report, ViolationKind::Phantom);
    assert_eq!(report.violations.len(), 2);
}

#[test]
fn unknown_outcome_sends_pass_delivered_or_not() {
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    p.invoked(None, "delivered");
    p.unknown("delivered", "timeout");
    p.invoked(None, "vanished");
    p.unknown("vanished", "connection reset");
    p.invoked(None, "failed-but-stored");
    p.failed("failed-but-stored", "producer closed");
    p.invoked(None, "failed");
    p.failed("failed", "producer closed");
    p.invoked(None, "pending");
    c.received(None, "delivered", id(1, 0), 0);
    c.received(None, "failed-but-stored", id(1, 1), 0);
    let report = h.check(&complete("sub"));
    report.assert_ok();
    assert_eq!(
        (
            report.counts.acked,
            report.counts.failed,
            report.counts.unknown
        ),
        (0, 2, 3)
    );
}

#[test]
fn retried_send_stored_twice_passes_at_least_once_and_fails_strict() {
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    p.invoked(None, "m0");
    p.unknown("m0", "timeout");
    p.invoked(None, "m0");
    p.acked("m0", id(1, 1));
    c.received(None, "m0", id(1, 0), 0);
    c.received(None, "m0", id(1, 1), 0);
    h.check(&complete("sub")).assert_ok();
    only(
        &h.check(&CheckOptions::strict().require_complete(T, "sub")),
        ViolationKind::UnexpectedDuplicate,
    );
}

#[test]
fn payload_stored_twice_without_a_retry_is_flagged() {
    let (h, p, c) = producer_and_consumer(SubType::Exclusive);
    send_acked(&p, None, "m0", id(1, 0));
    c.received(None, "m0", id(1, 0), 0);
    c.received(None, "m0", id(1, 1), 0);
    let report = h.check(&complete("sub"));
    only_duplicate(&report, DuplicateReason::StoredTwice);
}

#[test]
fn log_order_different_from_send_order_is_a_reorder() {
    let h = History::new(EVENTS_MAX);
    let p = h.producer("p1", T);
    p.invoked(None, "first");
    p.invoked(None, "second");
    p.acked("first", id(1, 1));
    p.acked("second", id(1, 0));
    let report = h.check(&CheckOptions::at_least_once());
    only(&report, ViolationKind::Reorder);
    assert!(report.violations[0].to_string().contains("producer `p1`"));
}

#[test]
fn one_message_id_with_two_payloads_is_a_divergence() {
    let h = History::new(EVENTS_MAX);
    let p = h.producer("p1", T);
    let c = h.consumer("c1", T, "other-reader", SubType::Exclusive);
    send_acked(&p, None, "m0", id(1, 0));
    p.invoked(None, "m1");
    p.unknown("m1", "fenced");
    c.received(None, "m1", id(1, 0), 0);
    only(
        &h.check(&CheckOptions::at_least_once()),
        ViolationKind::Divergence,
    );
}

#[test]
#[should_panic(expected = "LostAck: payload `m0`")]
fn assert_ok_panics_with_a_readable_summary() {
    let h = History::new(EVENTS_MAX);
    send_acked(&h.producer("p1", T), None, "m0", id(1, 0));
    h.check(&complete("sub")).assert_ok();
}

#[test]
fn report_lists_at_most_the_configured_number_of_violations() {
    let h = History::new(EVENTS_MAX);
    let p = h.producer("p1", T);
    for i in 0..30 {
        send_acked(&p, None, &format!("m{i}"), id(1, i));
    }
    let report = h.check(&complete("sub"));
    assert_eq!(report.violations.len(), 30);
    let text = report.to_string();
    assert!(text.contains("LostAck: 30"), "{text}");
    assert!(
        text.contains("20. LostAck") && !text.contains("21. LostAck"),
        "{text}"
    );
    assert!(text.contains("and 10 more"), "{text}");
}

// ---------------------------------------------------------------------------
// Seeded random histories.

const SEEDS: u64 = 30;
const STEPS: usize = 400;

#[derive(Clone)]
struct LogMsg {
    id: MessageId,
    payload: String,
    key: String,
}

enum Fate {
    Acked(MessageId),
    UnknownStored,
    UnknownLost,
    Failed,
}

struct Producer {
    rec: ProducerRecorder,
    pending: VecDeque<(String, String, Fate)>,
}

struct Sub {
    name: &'static str,
    sub_type: SubType,
    consumers: Vec<ConsumerRecorder>,
    read_pos: usize,
    redeliver: BTreeSet<usize>,
    /// Delivered and not acked: log index → consumer.
    unacked: BTreeMap<usize, usize>,
    acked: HashSet<usize>,
    counts: HashMap<usize, u32>,
    recent_individual_acks: Vec<usize>,
}

struct Sim {
    rng: StdRng,
    history: History,
    log: Vec<LogMsg>,
    ledger: u64,
    entry: u64,
    producers: Vec<Producer>,
    retry_pool: Vec<(usize, String, String)>,
    subs: Vec<Sub>,
    next_payload: usize,
}

const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];

impl Sim {
    fn new(seed: u64) -> Self {
        let history = History::new(EVENTS_MAX);
        let producers = (0..3)
            .map(|i| Producer {
                rec: history.producer(format!("p{i}"), T),
                pending: VecDeque::new(),
            })
            .collect();
        let sub = |name: &'static str, sub_type: SubType, n: usize| Sub {
            name,
            sub_type,
            consumers: (0..n)
                .map(|i| history.consumer(format!("{name}-c{i}"), T, name, sub_type))
                .collect(),
            read_pos: 0,
            redeliver: BTreeSet::new(),
            unacked: BTreeMap::new(),
            acked: HashSet::new(),
            counts: HashMap::new(),
            recent_individual_acks: Vec::new(),
        };
        let subs = vec![
            sub("ex", SubType::Exclusive, 1),
            sub("fo", SubType::Failover, 2),
            sub("sh", SubType::Shared, 2),
            sub("ks", SubType::KeyShared, 2),
        ];
        Self {
            rng: StdRng::seed_from_u64(seed),
            history,
            log: Vec::new(),
            ledger: 3,
            entry: 0,
            producers,
            retry_pool: Vec::new(),
            subs,
            next_payload: 0,
        }
    }

    fn options() -> CheckOptions {
        ["ex", "fo", "sh", "ks"]
            .into_iter()
            .fold(CheckOptions::at_least_once(), |o, s| {
                o.require_complete(T, s)
            })
    }

    /// Appends one entry holding `n` messages; returns their ids.
    fn append_entry(&mut self, n: usize) -> Vec<MessageId> {
        let base = MessageId::new(self.ledger, self.entry);
        self.entry += 1;
        if self.rng.random_bool(0.1) {
            self.ledger += self.rng.random_range(1..4);
            self.entry = 0;
        }
        if n == 1 {
            vec![base]
        } else {
            (0..n).map(|b| base.with_batch_index(b as i32)).collect()
        }
    }

    fn send(&mut self) {
        let pi = self.rng.random_range(0..self.producers.len());
        if !self.retry_pool.is_empty() && self.rng.random_bool(0.3) {
            let i = self.rng.random_range(0..self.retry_pool.len());
            let (pi, payload, key) = self.retry_pool.swap_remove(i);
            self.producers[pi].rec.invoked(Some(&key), &payload);
            let mid = self.append_entry(1)[0];
            self.log.push(LogMsg {
                id: mid,
                payload: payload.clone(),
                key: key.clone(),
            });
            self.producers[pi]
                .pending
                .push_back((payload, key, Fate::Acked(mid)));
            return;
        }
        let batch = if self.rng.random_bool(0.15) {
            self.rng.random_range(2..4)
        } else {
            1
        };
        let mut msgs = Vec::new();
        for _ in 0..batch {
            let payload = format!("m{}", self.next_payload);
            self.next_payload += 1;
            let key = KEYS[self.rng.random_range(0..KEYS.len())].to_owned();
            self.producers[pi].rec.invoked(Some(&key), &payload);
            msgs.push((payload, key));
        }
        let roll = self.rng.random_range(0..100);
        let stored = batch > 1 || roll < 85;
        let ids = if stored {
            self.append_entry(batch)
        } else {
            Vec::new()
        };
        for (i, (payload, key)) in msgs.into_iter().enumerate() {
            let fate = if batch > 1 || roll < 80 {
                Fate::Acked(ids[i])
            } else if roll < 85 {
                Fate::UnknownStored
            } else if roll < 93 {
                Fate::UnknownLost
            } else {
                Fate::Failed
            };
            if let Some(&mid) = ids.get(i) {
                self.log.push(LogMsg {
                    id: mid,
                    payload: payload.clone(),
                    key: key.clone(),
                });
            }
            self.producers[pi].pending.push_back((payload, key, fate));
        }
    }

    fn complete_send(&mut self, pi: usize, retry: bool) {
        let Some((payload, key, fate)) = self.producers[pi].pending.pop_front() else {
            return;
        };
        let rec = &self.producers[pi].rec;
        match fate {
            Fate::Acked(mid) => {
                rec.acked(&payload, mid);
                return;
            }
            Fate::UnknownStored | Fate::UnknownLost => {
                rec.unknown(&payload, "timeout");
            }
            Fate::Failed => {
                rec.failed(&payload, "producer fenced");
            }
        }
        if retry && self.rng.random_bool(0.5) {
            self.retry_pool.push((pi, payload, key));
        }
    }

    fn deliver(&mut self, si: usize) -> bool {
        let sub = &mut self.subs[si];
        let li = if let Some(&li) = sub.redeliver.first() {
            sub.redeliver.remove(&li);
            li
        } else if sub.read_pos < self.log.len() {
            sub.read_pos += 1;
            sub.read_pos - 1
        } else {
            return false;
        };
        let msg = &self.log[li];
        let ci = match sub.sub_type {
            SubType::Exclusive | SubType::Failover => 0,
            SubType::Shared => self.rng.random_range(0..sub.consumers.len()),
            SubType::KeyShared => {
                KEYS.iter().position(|k| *k == msg.key).unwrap_or(0) % sub.consumers.len()
            }
        };
        let count = sub.counts.get(&li).copied().unwrap_or(0);
        sub.consumers[ci].received(Some(&msg.key), &msg.payload, msg.id, count);
        sub.unacked.insert(li, ci);
        true
    }

    fn ack(&mut self, si: usize) {
        let sub = &mut self.subs[si];
        if sub.unacked.is_empty() {
            return;
        }
        if sub.sub_type == SubType::Exclusive && self.rng.random_bool(0.3) {
            let (&top, &ci) = sub.unacked.last_key_value().unwrap();
            sub.consumers[ci].acked_cumulative(self.log[top].id);
            for li in 0..=top {
                sub.acked.insert(li);
                sub.unacked.remove(&li);
                sub.redeliver.remove(&li);
            }
            sub.recent_individual_acks.clear();
            return;
        }
        let keys: Vec<usize> = sub.unacked.keys().copied().collect();
        let li = keys[self.rng.random_range(0..keys.len())];
        let ci = sub.unacked.remove(&li).unwrap();
        let msg = &self.log[li];
        sub.consumers[ci].acked(msg.id, Some(&msg.payload));
        sub.acked.insert(li);
        sub.recent_individual_acks.push(li);
    }

    fn nack(&mut self, si: usize) {
        let sub = &mut self.subs[si];
        if sub.unacked.is_empty() {
            return;
        }
        let keys: Vec<usize> = sub.unacked.keys().copied().collect();
        match sub.sub_type {
            SubType::Exclusive | SubType::Failover => {
                sub.consumers[0].redelivery_triggered("negative ack: rewind unacked");
                for li in keys {
                    sub.unacked.remove(&li);
                    *sub.counts.entry(li).or_insert(0) += 1;
                    sub.redeliver.insert(li);
                }
            }
            SubType::Shared | SubType::KeyShared => {
                let li = keys[self.rng.random_range(0..keys.len())];
                sub.unacked.remove(&li);
                *sub.counts.entry(li).or_insert(0) += 1;
                sub.redeliver.insert(li);
            }
        }
    }

    fn fault(&mut self) {
        self.history.fault("kill -9 the topic owner");
        for sub in &mut self.subs {
            let unacked: Vec<usize> = std::mem::take(&mut sub.unacked).into_keys().collect();
            sub.redeliver.extend(unacked);
            // Acks not yet persisted come back.
            let undo = self
                .rng
                .random_range(0..=sub.recent_individual_acks.len().min(3));
            for _ in 0..undo {
                if let Some(li) = sub.recent_individual_acks.pop() {
                    sub.acked.remove(&li);
                    sub.redeliver.insert(li);
                }
            }
            sub.recent_individual_acks.clear();
            // Redelivery counts live in broker memory.
            sub.counts.clear();
        }
    }

    fn observe_cursor(&mut self, si: usize) {
        let sub = &self.subs[si];
        // Highest entry such that it and everything before it is acked.
        let mut mark: Option<(u64, u64)> = None;
        let mut li = 0;
        while li < self.log.len() {
            let entry = self.log[li].id.entry_position();
            let mut end = li;
            while end < self.log.len() && self.log[end].id.entry_position() == entry {
                end += 1;
            }
            if (li..end).all(|i| sub.acked.contains(&i)) {
                mark = Some(entry);
                li = end;
            } else {
                break;
            }
        }
        if let Some((ledger, entry)) = mark {
            self.history
                .cursor_position(T, sub.name, MessageId::new(ledger, entry));
        }
    }

    fn run(mut self) -> Vec<Event> {
        for _ in 0..STEPS {
            let si = self.rng.random_range(0..self.subs.len());
            match self.rng.random_range(0..100) {
                0..25 => self.send(),
                25..40 => {
                    let pi = self.rng.random_range(0..self.producers.len());
                    self.complete_send(pi, true);
                }
                40..70 => {
                    self.deliver(si);
                }
                70..88 => self.ack(si),
                88..94 => self.nack(si),
                94..97 => self.observe_cursor(si),
                _ => {
                    if self.rng.random_bool(0.3) {
                        self.fault();
                    }
                }
            }
        }
        // Faults heal; producers learn every outcome; consumers drain.
        for pi in 0..self.producers.len() {
            while !self.producers[pi].pending.is_empty() {
                self.complete_send(pi, false);
            }
        }
        for si in 0..self.subs.len() {
            while self.deliver(si) {}
            while !self.subs[si].unacked.is_empty() {
                self.ack(si);
            }
            self.observe_cursor(si);
        }
        self.history.events()
    }
}

fn reindex(events: &mut [Event]) {
    for (i, e) in events.iter_mut().enumerate() {
        e.index = i as u64;
    }
}

fn receive(e: &Event) -> Option<&ReceiveEvent> {
    match &e.kind {
        EventKind::Receive(r) => Some(r),
        _ => None,
    }
}

/// Positions of receipts that deliver their message id to their
/// subscription for the first time.
fn first_deliveries(events: &[Event]) -> Vec<usize> {
    let mut seen = HashSet::new();
    events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let r = receive(e)?;
            seen.insert((r.subscription.clone(), r.message_id))
                .then_some(i)
        })
        .collect()
}

fn plant_loss(events: &[Event], rng: &mut StdRng) -> Vec<Event> {
    let mut invoked: HashMap<&str, usize> = HashMap::new();
    let mut acked = Vec::new();
    for e in events {
        if let EventKind::Send(s) = &e.kind {
            match s.op {
                cms_tests::history::SendOp::Invoked => {
                    *invoked.entry(&s.payload_id).or_insert(0) += 1
                }
                cms_tests::history::SendOp::Acked { .. } => acked.push(s.payload_id.clone()),
                _ => {}
            }
        }
    }
    acked.retain(|p| invoked.get(p.as_str()) == Some(&1));
    let payload = &acked[rng.random_range(0..acked.len())];
    let sub = ["ex", "fo", "sh", "ks"][rng.random_range(0..4)];
    let mut out: Vec<Event> = events
        .iter()
        .filter(|e| !receive(e).is_some_and(|r| r.subscription == sub && &r.payload_id == payload))
        .cloned()
        .collect();
    reindex(&mut out);
    out
}

fn plant_duplicate(events: &[Event], rng: &mut StdRng) -> Vec<Event> {
    let receipts: Vec<usize> = (0..events.len())
        .filter(|&i| receive(&events[i]).is_some())
        .collect();
    let at = receipts[rng.random_range(0..receipts.len())];
    let mut out = events.to_vec();
    out.insert(at + 1, events[at].clone());
    reindex(&mut out);
    out
}

fn plant_reorder(events: &[Event], rng: &mut StdRng) -> Option<Vec<Event>> {
    let sub = if rng.random_bool(0.5) { "ex" } else { "ks" };
    let firsts: HashSet<usize> = first_deliveries(events).into_iter().collect();
    // Consecutive receipts of one ordered group, both first deliveries.
    let mut last_in_group: HashMap<Option<String>, usize> = HashMap::new();
    let mut pairs = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let Some(r) = receive(e).filter(|r| r.subscription == sub) else {
            continue;
        };
        let group = (sub == "ks").then(|| r.key.clone().unwrap_or_default());
        if let Some(prev) = last_in_group.insert(group, i)
            && firsts.contains(&prev)
            && firsts.contains(&i)
        {
            pairs.push((prev, i));
        }
    }
    if pairs.is_empty() {
        return None;
    }
    let (a, b) = pairs[rng.random_range(0..pairs.len())];
    let mut out = events.to_vec();
    out.swap(a, b);
    reindex(&mut out);
    Some(out)
}

fn plant_cursor_past_unacked(events: &[Event], rng: &mut StdRng) -> Vec<Event> {
    let firsts = first_deliveries(events);
    let at = firsts[rng.random_range(0..firsts.len())];
    let r = receive(&events[at]).unwrap();
    let (ledger, entry) = r.message_id.entry_position();
    let observation = Event {
        index: 0,
        at_ns: events[at].at_ns,
        kind: EventKind::CursorPosition(cms_tests::history::CursorPositionEvent {
            topic: r.topic.clone(),
            subscription: r.subscription.clone(),
            mark_delete: MessageId::new(ledger, entry),
        }),
    };
    let mut out = events.to_vec();
    out.insert(at + 1, observation);
    reindex(&mut out);
    out
}

fn plant_phantom(events: &[Event], rng: &mut StdRng) -> Vec<Event> {
    let receipts: Vec<usize> = (0..events.len())
        .filter(|&i| receive(&events[i]).is_some())
        .collect();
    let at = receipts[rng.random_range(0..receipts.len())];
    let mut phantom = events[at].clone();
    if let EventKind::Receive(r) = &mut phantom.kind {
        r.payload_id = "never-sent".to_owned();
        r.message_id = MessageId::new(999_999, 0);
    }
    let mut out = events.to_vec();
    out.insert(at + 1, phantom);
    reindex(&mut out);
    out
}

#[test]
fn seeded_random_correct_histories_pass_and_each_planted_fault_is_found_alone() {
    let options = Sim::options();
    let mut reorders_planted = 0;
    for seed in 0..SEEDS {
        let events = Sim::new(seed).run();
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        let clean = check(&events, &options);
        assert!(
            clean.is_ok(),
            "seed {seed}: correct history rejected\n{clean}"
        );
        assert!(
            clean.counts.acked > 10,
            "seed {seed}: history too small\n{clean}"
        );

        let mut planted = vec![
            (
                "loss",
                plant_loss(&events, &mut rng),
                ViolationKind::LostAck,
            ),
            (
                "duplicate",
                plant_duplicate(&events, &mut rng),
                ViolationKind::UnexpectedDuplicate,
            ),
            (
                "cursor",
                plant_cursor_past_unacked(&events, &mut rng),
                ViolationKind::CursorPastUnacked,
            ),
            (
                "phantom",
                plant_phantom(&events, &mut rng),
                ViolationKind::Phantom,
            ),
        ];
        if let Some(reordered) = plant_reorder(&events, &mut rng) {
            reorders_planted += 1;
            planted.push(("reorder", reordered, ViolationKind::Reorder));
        }
        for (name, bad, kind) in planted {
            let report = check(&bad, &options);
            assert_eq!(
                kinds(&report),
                BTreeSet::from([kind]),
                "seed {seed}: planted {name}, expected only {kind}\n{report}"
            );
        }
    }
    assert!(
        reorders_planted >= SEEDS / 2,
        "only {reorders_planted} reorders could be planted"
    );
}
