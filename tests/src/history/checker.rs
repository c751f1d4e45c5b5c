//! The checker: judges a finished history (after faults healed and
//! consumers drained) and returns a [`Report`].
//!
//! The rules, precisely. "Subscription" means a (topic, subscription name)
//! pair; all its consumers count together. A *redelivery window* for a
//! receipt opens at any [`EventKind::RedeliveryTrigger`] of the same
//! subscription or any [`EventKind::Fault`].
//!
//! * **LostAck** — for every subscription listed in
//!   [`CheckOptions::complete`], every payload with an acked send to its
//!   topic was received at least once (by any consumer).
//! * **UnexpectedDuplicate** — a payload received again by a subscription.
//!   In [`DuplicatePolicy::Strict`] every second receipt is one. In
//!   [`DuplicatePolicy::AtLeastOnce`] a second receipt is explained when:
//!   it carries a message id the subscription already received, that id was
//!   not acked by the subscription before (or a redelivery window opened
//!   after the ack: acks in flight or not yet persisted may be lost), and
//!   either its redelivery count is greater than at the previous receipt of
//!   that id or a redelivery window opened since that receipt; or it
//!   carries a new message id (a second stored copy) and the producer
//!   invoked the send of that payload at least twice (a retry after a
//!   failed or unknown outcome).
//! * **Reorder** — (a) in Exclusive and Failover subscriptions (grouped by
//!   partition) and Key_Shared subscriptions (grouped by key and partition),
//!   the *first* delivery of every message id must have a greater id than
//!   every id of its group the subscription received before. Redeliveries
//!   (an id received again) are never reorders: a redelivered sequence may
//!   restart from any earlier point, and its internal order is not checked
//!   (Pulsar does not order nack redeliveries); they are judged by the
//!   duplicate rule instead. Since ids follow the log, this covers every
//!   producer's send order for that subscription. (b) Each producer's acked
//!   sends, per topic and partition, are stored (acked ids) in the order
//!   their sends were invoked.
//! * **CursorPastUnacked** — at a [`EventKind::CursorPosition`] observation,
//!   every message covered by the mark-delete position (same partition,
//!   entry at or before it) that the subscription received — or, for a
//!   subscription listed as complete, any message of the topic the history
//!   knows (acked sends, any receipt) — was acked (individually, or by a
//!   cumulative ack covering it) by an event before the observation.
//! * **Phantom** — a receipt whose payload was never sent to its topic.
//!   Phantom receipts are excluded from every other rule.
//! * **Divergence** — one message id of a topic seen with two payloads
//!   (acked sends and receipts of any subscription).
//!
//! Sends that failed or have an unknown outcome may or may not be delivered;
//! neither is a violation. An acked send whose receipt carries no position
//! (`-1:-1`, [`MessageId::is_unknown_position`]: the broker recognised a
//! resend as a duplicate of a copy it stored earlier) counts as acked for
//! LostAck; it takes no part in Divergence and in rule (b) of Reorder.

use std::collections::{HashMap, HashSet};

use super::event::{Event, EventKind, ReceiveEvent, SendOp, SubType, SubscriptionRef};
use super::message_id::MessageId;
use super::report::{
    Counts, DuplicateReason, ReceiptEvidence, ReorderRule, Report, Sighting,
    VIOLATIONS_SHOWN_MAX_DEFAULT, Violation,
};

/// Violations kept in a report before further ones are only counted.
pub const VIOLATIONS_MAX_DEFAULT: usize = 10_000;

/// How second receipts of a payload are judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DuplicatePolicy {
    /// At-least-once: duplicates allowed when explained by a redelivery or a
    /// retried send (see the module doc).
    #[default]
    AtLeastOnce,
    /// Exactly one receipt per payload and subscription.
    Strict,
}

/// What the checker demands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckOptions {
    /// Subscriptions that must have received every acked send of their topic.
    pub complete: Vec<SubscriptionRef>,
    /// How duplicates are judged.
    pub duplicates: DuplicatePolicy,
    /// Whether the order rules run (turn off for Key_Shared with
    /// `allowOutOfOrderDelivery`).
    pub check_order: bool,
    /// Violations kept in the report; more are only counted.
    pub violations_max: usize,
    /// Violations the report's `Display` lists.
    pub violations_shown_max: usize,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self::at_least_once()
    }
}

impl CheckOptions {
    /// At-least-once duplicates, order checked, no subscription required complete.
    pub fn at_least_once() -> Self {
        Self {
            complete: Vec::new(),
            duplicates: DuplicatePolicy::AtLeastOnce,
            check_order: true,
            violations_max: VIOLATIONS_MAX_DEFAULT,
            violations_shown_max: VIOLATIONS_SHOWN_MAX_DEFAULT,
        }
    }

    /// Like [`CheckOptions::at_least_once`] with strict duplicates.
    pub fn strict() -> Self {
        Self {
            duplicates: DuplicatePolicy::Strict,
            ..Self::at_least_once()
        }
    }

    /// Requires `subscription` of `topic` to receive every acked send.
    pub fn require_complete(
        mut self,
        topic: impl Into<String>,
        subscription: impl Into<String>,
    ) -> Self {
        self.complete
            .push(SubscriptionRef::new(topic, subscription));
        self
    }

    /// Sets whether the order rules run.
    pub fn with_order_check(mut self, check_order: bool) -> Self {
        self.check_order = check_order;
        self
    }
}

/// Judges `events` (any order; they are sorted by index) against `options`.
pub fn check(events: &[Event], options: &CheckOptions) -> Report {
    let mut ordered: Vec<&Event> = events.iter().collect();
    ordered.sort_by_key(|e| e.index);
    let mut checker = Checker::new(options);
    checker.counts.events = ordered.len();
    checker.index_sends(&ordered);
    checker.walk(&ordered);
    checker.check_send_order();
    checker.check_lost_acks();
    checker.check_cursors();
    checker.finish()
}

#[derive(Clone, Copy)]
enum Outcome {
    Acked { message_id: MessageId, index: u64 },
    Failed,
    Unknown,
}

struct Attempt<'a> {
    producer: &'a str,
    invoked_index: u64,
    outcome: Option<Outcome>,
}

struct SendInfo<'a> {
    producer: &'a str,
    attempts: Vec<Attempt<'a>>,
    invocations: usize,
}

impl SendInfo<'_> {
    /// The first acked attempt: (message id, receipt event index).
    fn acked(&self) -> Option<(MessageId, u64)> {
        self.attempts.iter().find_map(|a| match a.outcome {
            Some(Outcome::Acked { message_id, index }) => Some((message_id, index)),
            _ => None,
        })
    }
}

#[derive(Clone, Copy)]
struct Receipt<'a> {
    index: u64,
    consumer: &'a str,
    message_id: MessageId,
    redelivery_count: u32,
}

impl Receipt<'_> {
    fn evidence(&self) -> ReceiptEvidence {
        ReceiptEvidence {
            index: self.index,
            consumer: self.consumer.to_owned(),
            message_id: self.message_id,
            redelivery_count: self.redelivery_count,
        }
    }
}

/// (producer, topic, partition).
type ProducerPartition<'a> = (&'a str, &'a str, i32);
/// (invocation event index, acked id, payload).
type AckedSend<'a> = (u64, MessageId, &'a str);

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Group<'a> {
    Partition(i32),
    Key(Option<&'a str>, i32),
}

impl Group<'_> {
    fn describe(&self) -> String {
        match self {
            Group::Partition(p) => format!("partition {p}"),
            Group::Key(Some(k), p) => format!("key `{k}`, partition {p}"),
            Group::Key(None, p) => format!("no key, partition {p}"),
        }
    }
}

#[derive(Default)]
struct SubState<'a> {
    /// Last receipt of each payload.
    by_payload: HashMap<&'a str, Receipt<'a>>,
    /// Last receipt of each message id.
    by_id: HashMap<MessageId, Receipt<'a>>,
    /// Highest id delivered per ordered group, with its receipt and payload.
    high: HashMap<Group<'a>, (Receipt<'a>, &'a str)>,
    /// First individual ack of each id.
    acked: HashMap<MessageId, u64>,
    /// Per partition: cumulative acks that raised the acked prefix, as
    /// (event index, id), increasing in both.
    cumulative: HashMap<i32, Vec<(u64, MessageId)>>,
    /// Last redelivery trigger of this subscription.
    last_trigger: Option<u64>,
}

impl SubState<'_> {
    /// Index of the earliest ack of `id` before event `before`, if any.
    fn acked_before(&self, id: &MessageId, before: u64) -> Option<u64> {
        let individual = self.acked.get(id).copied().filter(|&i| i < before);
        let cumulative = self.cumulative.get(&id.partition).and_then(|list| {
            let first_covering = list.partition_point(|(_, a)| !a.covers(id));
            list.get(first_covering)
                .map(|&(i, _)| i)
                .filter(|&i| i < before)
        });
        match (individual, cumulative) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

struct Checker<'a> {
    options: &'a CheckOptions,
    sends: HashMap<(&'a str, &'a str), SendInfo<'a>>,
    send_order: Vec<(&'a str, &'a str)>,
    bindings: HashMap<(&'a str, MessageId), (&'a str, u64)>,
    diverged: HashSet<(&'a str, MessageId, &'a str)>,
    subs: HashMap<(&'a str, &'a str), SubState<'a>>,
    last_fault: Option<u64>,
    cursors: Vec<(u64, &'a str, &'a str, MessageId)>,
    violations: Vec<Violation>,
    violations_dropped: usize,
    counts: Counts,
}

impl<'a> Checker<'a> {
    fn new(options: &'a CheckOptions) -> Self {
        Self {
            options,
            sends: HashMap::new(),
            send_order: Vec::new(),
            bindings: HashMap::new(),
            diverged: HashSet::new(),
            subs: HashMap::new(),
            last_fault: None,
            cursors: Vec::new(),
            violations: Vec::new(),
            violations_dropped: 0,
            counts: Counts::default(),
        }
    }

    fn violation(&mut self, v: Violation) {
        if self.violations.len() < self.options.violations_max {
            self.violations.push(v);
        } else {
            self.violations_dropped += 1;
        }
    }

    fn is_complete(&self, topic: &str, subscription: &str) -> bool {
        self.options
            .complete
            .iter()
            .any(|s| s.topic == topic && s.subscription == subscription)
    }

    /// Binds `id` of `topic` to `payload`; reports a conflicting binding.
    fn bind(&mut self, topic: &'a str, id: MessageId, payload: &'a str, index: u64) {
        match self.bindings.get(&(topic, id)) {
            None => {
                self.bindings.insert((topic, id), (payload, index));
            }
            Some(&(first, first_index)) if first != payload => {
                if self.diverged.insert((topic, id, payload)) {
                    self.violation(Violation::Divergence {
                        topic: topic.to_owned(),
                        message_id: id,
                        first: Sighting {
                            index: first_index,
                            payload_id: first.to_owned(),
                            message_id: id,
                        },
                        second: Sighting {
                            index,
                            payload_id: payload.to_owned(),
                            message_id: id,
                        },
                    });
                }
            }
            Some(_) => {}
        }
    }

    /// Pass 1: every send attempt and its outcome.
    fn index_sends(&mut self, events: &[&'a Event]) {
        for event in events {
            let EventKind::Send(s) = &event.kind else {
                continue;
            };
            let key = (s.topic.as_str(), s.payload_id.as_str());
            let info = self.sends.entry(key).or_insert_with(|| SendInfo {
                producer: &s.producer,
                attempts: Vec::new(),
                invocations: 0,
            });
            if info.attempts.is_empty() && info.invocations == 0 {
                self.send_order.push(key);
            }
            let outcome = match &s.op {
                SendOp::Invoked => {
                    info.invocations += 1;
                    info.attempts.push(Attempt {
                        producer: &s.producer,
                        invoked_index: event.index,
                        outcome: None,
                    });
                    continue;
                }
                SendOp::Acked { message_id } => Outcome::Acked {
                    message_id: *message_id,
                    index: event.index,
                },
                SendOp::Failed { .. } => Outcome::Failed,
                SendOp::Unknown { .. } => Outcome::Unknown,
            };
            match info
                .attempts
                .iter_mut()
                .find(|a| a.producer == s.producer && a.outcome.is_none())
            {
                Some(attempt) => attempt.outcome = Some(outcome),
                // An outcome without a logged invocation: treat it as
                // invoked where the outcome was logged.
                None => info.attempts.push(Attempt {
                    producer: &s.producer,
                    invoked_index: event.index,
                    outcome: Some(outcome),
                }),
            }
            if let Outcome::Acked { message_id, index } = outcome
                && !message_id.is_unknown_position()
            {
                self.bind(key.0, message_id, key.1, index);
            }
        }
        self.counts.sent = self.sends.len();
        for info in self.sends.values() {
            self.counts.sends_invoked += info.invocations;
            if info.acked().is_some() {
                self.counts.acked += 1;
            } else if info
                .attempts
                .iter()
                .all(|a| matches!(a.outcome, Some(Outcome::Failed)))
            {
                self.counts.failed += 1;
            } else {
                self.counts.unknown += 1;
            }
        }
    }

    fn window_opened_after(&self, sub: &SubState<'_>, index: u64) -> bool {
        sub.last_trigger.is_some_and(|t| t > index) || self.last_fault.is_some_and(|f| f > index)
    }

    /// Pass 2: receipts, acks and markers in order.
    fn walk(&mut self, events: &[&'a Event]) {
        for event in events {
            match &event.kind {
                EventKind::Send(_) => {}
                EventKind::Receive(r) => self.receive(event.index, r),
                EventKind::Ack(a) => {
                    self.counts.acks += 1;
                    let sub = self.subs.entry((&a.topic, &a.subscription)).or_default();
                    if a.cumulative {
                        let list = sub.cumulative.entry(a.message_id.partition).or_default();
                        if list
                            .last()
                            .is_none_or(|(_, last)| !last.covers(&a.message_id))
                        {
                            list.push((event.index, a.message_id));
                        }
                    } else {
                        sub.acked.entry(a.message_id).or_insert(event.index);
                    }
                }
                EventKind::CursorPosition(c) => {
                    self.cursors
                        .push((event.index, &c.topic, &c.subscription, c.mark_delete));
                }
                EventKind::RedeliveryTrigger(t) => {
                    self.subs
                        .entry((&t.topic, &t.subscription))
                        .or_default()
                        .last_trigger = Some(event.index);
                }
                EventKind::Fault(_) => self.last_fault = Some(event.index),
            }
        }
        self.counts.subscriptions = self
            .subs
            .values()
            .filter(|s| !s.by_payload.is_empty())
            .count();
        self.counts.unique_received = self.subs.values().map(|s| s.by_payload.len()).sum();
    }

    fn receive(&mut self, index: u64, r: &'a ReceiveEvent) {
        self.counts.received += 1;
        let topic = r.topic.as_str();
        let payload = r.payload_id.as_str();
        let id = r.message_id;
        let Some(invocations) = self.sends.get(&(topic, payload)).map(|s| s.invocations) else {
            self.violation(Violation::Phantom {
                topic: r.topic.clone(),
                subscription: r.subscription.clone(),
                consumer: r.consumer.clone(),
                payload_id: r.payload_id.clone(),
                message_id: id,
                index,
            });
            return;
        };
        self.bind(topic, id, payload, index);
        let receipt = Receipt {
            index,
            consumer: &r.consumer,
            message_id: id,
            redelivery_count: r.redelivery_count,
        };
        let key = (topic, r.subscription.as_str());
        let sub = self.subs.remove(&key).unwrap_or_default();
        let mut sub = sub;

        // Duplicates.
        let mut unexplained = None;
        if let Some(previous) = sub.by_payload.get(payload).copied() {
            let verdict = match self.options.duplicates {
                DuplicatePolicy::Strict => Some((previous, DuplicateReason::Strict)),
                DuplicatePolicy::AtLeastOnce => match sub.by_id.get(&id).copied() {
                    Some(same_id) => match sub.acked_before(&id, index) {
                        Some(ack_index) if !self.window_opened_after(&sub, ack_index) => {
                            Some((same_id, DuplicateReason::AfterAck { ack_index }))
                        }
                        _ if r.redelivery_count > same_id.redelivery_count
                            || self.window_opened_after(&sub, same_id.index) =>
                        {
                            None
                        }
                        _ => Some((same_id, DuplicateReason::NotRedelivered)),
                    },
                    None if invocations >= 2 => None,
                    None => Some((previous, DuplicateReason::StoredTwice)),
                },
            };
            unexplained = verdict;
        }
        let flagged = unexplained.is_some();
        if let Some((earlier, reason)) = unexplained {
            self.violation(Violation::UnexpectedDuplicate {
                topic: r.topic.clone(),
                subscription: r.subscription.clone(),
                payload_id: r.payload_id.clone(),
                earlier: earlier.evidence(),
                later: receipt.evidence(),
                reason,
            });
        }

        // Order of first deliveries.
        if self.options.check_order && r.sub_type.is_ordered() {
            let group = match r.sub_type {
                SubType::KeyShared => Group::Key(r.key.as_deref(), id.partition),
                _ => Group::Partition(id.partition),
            };
            let first_delivery = !sub.by_id.contains_key(&id);
            let high = sub.high.get(&group).copied();
            if let Some((h, h_payload)) = high
                && first_delivery
                && !flagged
                && id < h.message_id
            {
                self.violation(Violation::Reorder {
                    topic: r.topic.clone(),
                    rule: ReorderRule::FirstDeliveryAfterLater {
                        subscription: r.subscription.clone(),
                        sub_type: r.sub_type,
                        group: group.describe(),
                    },
                    ahead: Sighting {
                        index: h.index,
                        payload_id: h_payload.to_owned(),
                        message_id: h.message_id,
                    },
                    behind: Sighting {
                        index,
                        payload_id: r.payload_id.clone(),
                        message_id: id,
                    },
                });
            }
            if high.is_none_or(|(h, _)| id > h.message_id) {
                sub.high.insert(group, (receipt, payload));
            }
        }

        sub.by_payload.insert(payload, receipt);
        sub.by_id.insert(id, receipt);
        self.subs.insert(key, sub);
    }

    /// Rule (b) of Reorder: a producer's acked sends are stored in invocation order.
    fn check_send_order(&mut self) {
        let mut per_producer: HashMap<ProducerPartition<'a>, Vec<AckedSend<'a>>> = HashMap::new();
        for &(topic, payload) in &self.send_order {
            let Some(info) = self.sends.get(&(topic, payload)) else {
                continue;
            };
            for attempt in &info.attempts {
                if let Some(Outcome::Acked { message_id, .. }) = attempt.outcome
                    && !message_id.is_unknown_position()
                {
                    per_producer
                        .entry((attempt.producer, topic, message_id.partition))
                        .or_default()
                        .push((attempt.invoked_index, message_id, payload));
                }
            }
        }
        let mut keys: Vec<_> = per_producer.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            let Some(mut acked) = per_producer.remove(&key) else {
                continue;
            };
            acked.sort_by_key(|&(invoked, _, _)| invoked);
            let mut max: Option<(u64, MessageId, &str)> = None;
            for (invoked, id, payload) in acked {
                match max {
                    Some((m_invoked, m_id, m_payload)) if id < m_id => {
                        self.violation(Violation::Reorder {
                            topic: key.1.to_owned(),
                            rule: ReorderRule::SendOrder {
                                producer: key.0.to_owned(),
                            },
                            ahead: Sighting {
                                index: invoked,
                                payload_id: payload.to_owned(),
                                message_id: id,
                            },
                            behind: Sighting {
                                index: m_invoked,
                                payload_id: m_payload.to_owned(),
                                message_id: m_id,
                            },
                        });
                    }
                    Some((_, m_id, _)) if id <= m_id => {}
                    _ => max = Some((invoked, id, payload)),
                }
            }
        }
    }

    fn check_lost_acks(&mut self) {
        let empty = SubState::default();
        let mut lost = Vec::new();
        for required in &self.options.complete {
            let sub = self
                .subs
                .get(&(required.topic.as_str(), required.subscription.as_str()))
                .unwrap_or(&empty);
            for &(topic, payload) in &self.send_order {
                if topic != required.topic || sub.by_payload.contains_key(payload) {
                    continue;
                }
                let Some(info) = self.sends.get(&(topic, payload)) else {
                    continue;
                };
                if let Some((message_id, ack_index)) = info.acked() {
                    lost.push(Violation::LostAck {
                        topic: topic.to_owned(),
                        subscription: required.subscription.clone(),
                        payload_id: payload.to_owned(),
                        producer: info.producer.to_owned(),
                        message_id,
                        ack_index,
                    });
                }
            }
        }
        for v in lost {
            self.violation(v);
        }
    }

    fn check_cursors(&mut self) {
        let empty = SubState::default();
        let mut found = Vec::new();
        for &(obs_index, topic, subscription, md) in &self.cursors {
            let sub = self.subs.get(&(topic, subscription)).unwrap_or(&empty);
            let mut candidates: Vec<(MessageId, &str, bool)> = sub
                .by_id
                .keys()
                .filter_map(|id| {
                    self.bindings
                        .get(&(topic, *id))
                        .map(|&(payload, _)| (*id, payload, true))
                })
                .collect();
            if self.is_complete(topic, subscription) {
                candidates.extend(
                    self.bindings
                        .iter()
                        .filter(|((t, id), _)| *t == topic && !sub.by_id.contains_key(id))
                        .map(|((_, id), &(payload, _))| (*id, payload, false)),
                );
            }
            let mut unacked: Vec<_> = candidates
                .into_iter()
                .filter(|(id, _, _)| {
                    md.mark_delete_covers(id) && sub.acked_before(id, obs_index).is_none()
                })
                .collect();
            if unacked.is_empty() {
                continue;
            }
            unacked.sort_by_key(|&(id, _, _)| id);
            let (id, payload, received) = unacked[0];
            found.push(Violation::CursorPastUnacked {
                topic: topic.to_owned(),
                subscription: subscription.to_owned(),
                observation_index: obs_index,
                mark_delete: md,
                message_id: id,
                payload_id: payload.to_owned(),
                received,
                unacked_covered: unacked.len(),
            });
        }
        for v in found {
            self.violation(v);
        }
    }

    fn finish(self) -> Report {
        Report {
            violations: self.violations,
            violations_dropped: self.violations_dropped,
            counts: self.counts,
            violations_shown_max: self.options.violations_shown_max,
            history_file: None,
        }
    }
}
