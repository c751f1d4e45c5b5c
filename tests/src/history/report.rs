//! The checker's verdict: typed [`Violation`]s with their evidence (payload
//! ids, message ids, event indexes) and counts, readable in a test failure.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use super::event::SubType;
use super::message_id::MessageId;

/// Violations listed by [`Report`]'s `Display` (and so by
/// [`Report::assert_ok`]) unless the options say otherwise.
pub const VIOLATIONS_SHOWN_MAX_DEFAULT: usize = 20;

/// The kind of a [`Violation`], for tests that assert on kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ViolationKind {
    /// See [`Violation::LostAck`].
    LostAck,
    /// See [`Violation::UnexpectedDuplicate`].
    UnexpectedDuplicate,
    /// See [`Violation::Reorder`].
    Reorder,
    /// See [`Violation::CursorPastUnacked`].
    CursorPastUnacked,
    /// See [`Violation::Phantom`].
    Phantom,
    /// See [`Violation::Divergence`].
    Divergence,
    /// See [`Violation::Truncated`].
    Truncated,
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Why a second receipt of a payload is not explained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DuplicateReason {
    /// The same message id arrived again, but its redelivery count did not
    /// grow and no redelivery trigger or fault happened since the earlier
    /// receipt.
    NotRedelivered,
    /// The message had been acked by the subscription (at event
    /// `ack_index`) and no redelivery trigger or fault happened since: an
    /// acked message came back.
    AfterAck {
        /// The ack that should have removed it.
        ack_index: u64,
    },
    /// The payload arrived under a second message id although the producer
    /// invoked its send only once: it was stored twice.
    StoredTwice,
    /// Strict mode: any second receipt in one subscription.
    Strict,
}

impl fmt::Display for DuplicateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DuplicateReason::NotRedelivered => f.write_str(
                "not a redelivery: redelivery_count did not grow and no redelivery trigger or fault happened since the earlier receipt",
            ),
            DuplicateReason::AfterAck { ack_index } => write!(
                f,
                "it had been acked at event #{ack_index} and no redelivery trigger or fault happened since"
            ),
            DuplicateReason::StoredTwice => f.write_str(
                "stored under a second message id although the producer sent it only once",
            ),
            DuplicateReason::Strict => {
                f.write_str("strict mode allows one receipt per payload and subscription")
            }
        }
    }
}

/// Which order a [`Violation::Reorder`] broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReorderRule {
    /// A message id was delivered for the first time after a later id of
    /// the same group (partition, or key and partition for Key_Shared) had
    /// already been delivered to the subscription.
    FirstDeliveryAfterLater {
        /// Subscription name.
        subscription: String,
        /// Its type.
        sub_type: SubType,
        /// The ordered group: `partition N` or `key K, partition N`.
        group: String,
    },
    /// One producer's acked sends are stored in a different order than it
    /// invoked them.
    SendOrder {
        /// Producer name.
        producer: String,
    },
}

/// One item of evidence: an event and the message it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    /// Event index.
    pub index: u64,
    /// Payload id.
    pub payload_id: String,
    /// Message id.
    pub message_id: MessageId,
}

impl fmt::Display for Sighting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` ({}) at event #{}",
            self.payload_id, self.message_id, self.index
        )
    }
}

/// One receipt, as evidence of a duplicate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiptEvidence {
    /// Event index.
    pub index: u64,
    /// Consumer name.
    pub consumer: String,
    /// Message id received.
    pub message_id: MessageId,
    /// Its redelivery count.
    pub redelivery_count: u32,
}

impl fmt::Display for ReceiptEvidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "event #{} (consumer `{}`, id {}, redelivery_count {})",
            self.index, self.consumer, self.message_id, self.redelivery_count
        )
    }
}

/// Something the history shows that the system must not do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// An acked send that a subscription required to be complete never
    /// received (by any of its consumers).
    LostAck {
        /// Topic.
        topic: String,
        /// The subscription that missed it.
        subscription: String,
        /// Payload id.
        payload_id: String,
        /// Producer.
        producer: String,
        /// Where the broker said it stored it.
        message_id: MessageId,
        /// The event carrying the receipt.
        ack_index: u64,
    },
    /// A payload received more than once by one subscription without an
    /// explanation (see [`DuplicateReason`]).
    UnexpectedDuplicate {
        /// Topic.
        topic: String,
        /// Subscription.
        subscription: String,
        /// Payload id.
        payload_id: String,
        /// The earlier receipt.
        earlier: ReceiptEvidence,
        /// The unexplained receipt.
        later: ReceiptEvidence,
        /// Why it is not explained.
        reason: DuplicateReason,
    },
    /// An order the subscription type (or the producer) promises was broken.
    Reorder {
        /// Topic.
        topic: String,
        /// Which order.
        rule: ReorderRule,
        /// The message that should have come first (delivered or stored
        /// first although it is later).
        ahead: Sighting,
        /// The message that came too late.
        behind: Sighting,
    },
    /// A mark-delete observation covers a message the subscription had not
    /// acked when the observation was made.
    CursorPastUnacked {
        /// Topic.
        topic: String,
        /// Subscription.
        subscription: String,
        /// The observation event.
        observation_index: u64,
        /// The observed mark-delete position.
        mark_delete: MessageId,
        /// The lowest covered unacked message.
        message_id: MessageId,
        /// Its payload.
        payload_id: String,
        /// Whether the subscription ever received it.
        received: bool,
        /// How many covered messages were unacked.
        unacked_covered: usize,
    },
    /// A received payload that no producer sent to that topic.
    Phantom {
        /// Topic.
        topic: String,
        /// Subscription.
        subscription: String,
        /// Consumer.
        consumer: String,
        /// Payload id.
        payload_id: String,
        /// Message id it came with.
        message_id: MessageId,
        /// The receive event.
        index: u64,
    },
    /// One message id of a topic carries two different payloads: readers do
    /// not see one linear history.
    Divergence {
        /// Topic.
        topic: String,
        /// The id.
        message_id: MessageId,
        /// The first payload seen at this id.
        first: Sighting,
        /// The conflicting one.
        second: Sighting,
    },
    /// The recorder dropped events beyond its bound; the verdict is unreliable.
    Truncated {
        /// Events not kept.
        events_dropped: u64,
        /// The bound.
        events_max: usize,
    },
}

impl Violation {
    /// This violation's kind.
    pub fn kind(&self) -> ViolationKind {
        match self {
            Violation::LostAck { .. } => ViolationKind::LostAck,
            Violation::UnexpectedDuplicate { .. } => ViolationKind::UnexpectedDuplicate,
            Violation::Reorder { .. } => ViolationKind::Reorder,
            Violation::CursorPastUnacked { .. } => ViolationKind::CursorPastUnacked,
            Violation::Phantom { .. } => ViolationKind::Phantom,
            Violation::Divergence { .. } => ViolationKind::Divergence,
            Violation::Truncated { .. } => ViolationKind::Truncated,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.kind())?;
        match self {
            Violation::LostAck {
                topic,
                subscription,
                payload_id,
                producer,
                message_id,
                ack_index,
            } => write!(
                f,
                "payload `{payload_id}` from producer `{producer}` was acked as {message_id} at event #{ack_index}, but subscription `{subscription}` on `{topic}` never received it"
            ),
            Violation::UnexpectedDuplicate {
                topic,
                subscription,
                payload_id,
                earlier,
                later,
                reason,
            } => write!(
                f,
                "subscription `{subscription}` on `{topic}` received payload `{payload_id}` again at {later}, after {earlier}: {reason}"
            ),
            Violation::Reorder {
                topic,
                rule,
                ahead,
                behind,
            } => match rule {
                ReorderRule::FirstDeliveryAfterLater {
                    subscription,
                    sub_type,
                    group,
                } => write!(
                    f,
                    "subscription `{subscription}` ({sub_type}) on `{topic}`, {group}: {behind} was delivered for the first time after the later {ahead}"
                ),
                ReorderRule::SendOrder { producer } => write!(
                    f,
                    "producer `{producer}` on `{topic}` invoked the send of `{}` (event #{}) before `{}` (event #{}), but the log stores them the other way round ({} after {})",
                    behind.payload_id,
                    behind.index,
                    ahead.payload_id,
                    ahead.index,
                    behind.message_id,
                    ahead.message_id
                ),
            },
            Violation::CursorPastUnacked {
                topic,
                subscription,
                observation_index,
                mark_delete,
                message_id,
                payload_id,
                received,
                unacked_covered,
            } => write!(
                f,
                "subscription `{subscription}` on `{topic}`: mark-delete {mark_delete} observed at event #{observation_index} is at or past {message_id} (payload `{payload_id}`), which the subscription {} ({unacked_covered} unacked message(s) covered)",
                if *received {
                    "received but had not acked"
                } else {
                    "never received"
                }
            ),
            Violation::Phantom {
                topic,
                subscription,
                consumer,
                payload_id,
                message_id,
                index,
            } => write!(
                f,
                "consumer `{consumer}` of `{subscription}` on `{topic}` received payload `{payload_id}` ({message_id}) at event #{index}, but no producer sent it to this topic"
            ),
            Violation::Divergence {
                topic,
                message_id,
                first,
                second,
            } => write!(
                f,
                "on `{topic}`, message id {message_id} carries payload {first} and payload {second}"
            ),
            Violation::Truncated {
                events_dropped,
                events_max,
            } => write!(
                f,
                "the recorder dropped {events_dropped} event(s) beyond events_max = {events_max}; this verdict is unreliable"
            ),
        }
    }
}

/// What the history contained. Payload counts are per (topic, payload id).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// All events.
    pub events: usize,
    /// `Invoked` send events (attempts, retries included).
    pub sends_invoked: usize,
    /// Distinct payloads sent.
    pub sent: usize,
    /// Payloads with at least one acked attempt.
    pub acked: usize,
    /// Payloads not acked whose attempts all failed definitely.
    pub failed: usize,
    /// Payloads not acked with an unknown outcome, or with an attempt that
    /// never got an outcome.
    pub unknown: usize,
    /// Receive events.
    pub received: usize,
    /// Distinct (topic, subscription, payload) receipts.
    pub unique_received: usize,
    /// Ack events.
    pub acks: usize,
    /// Subscriptions seen in receives.
    pub subscriptions: usize,
}

/// The checker's verdict.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Violations in the order found (kept up to the options' bound).
    pub violations: Vec<Violation>,
    /// Violations found beyond the bound and not kept.
    pub violations_dropped: usize,
    /// What the history contained.
    pub counts: Counts,
    /// How many violations `Display` lists.
    pub violations_shown_max: usize,
    /// Where the history is on disk, if it was recorded to a file.
    pub history_file: Option<PathBuf>,
}

impl Report {
    /// Whether the history shows no violation.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty() && self.violations_dropped == 0
    }

    /// Panics with a readable summary (the first violations, counts, the
    /// history file) unless the history is clean.
    #[track_caller]
    pub fn assert_ok(&self) {
        assert!(self.is_ok(), "{self}");
    }

    /// Number of kept violations per kind.
    pub fn kinds(&self) -> BTreeMap<ViolationKind, usize> {
        let mut kinds = BTreeMap::new();
        for v in &self.violations {
            *kinds.entry(v.kind()).or_insert(0) += 1;
        }
        kinds
    }

    /// Kept violations of one kind.
    pub fn of_kind(&self, kind: ViolationKind) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(move |v| v.kind() == kind)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.violations.len() + self.violations_dropped;
        if total == 0 {
            write!(f, "history check passed")?;
        } else {
            write!(f, "history check FAILED: {total} violation(s) [")?;
            for (i, (kind, n)) in self.kinds().iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{kind}: {n}")?;
            }
            f.write_str("]")?;
        }
        let c = &self.counts;
        write!(
            f,
            "\n  counts: {} events; {} payloads sent in {} attempts (acked {}, failed {}, unknown {}); {} receives ({} unique per subscription) over {} subscription(s); {} acks",
            c.events,
            c.sent,
            c.sends_invoked,
            c.acked,
            c.failed,
            c.unknown,
            c.received,
            c.unique_received,
            c.subscriptions,
            c.acks
        )?;
        if let Some(path) = &self.history_file {
            write!(f, "\n  history file: {}", path.display())?;
        }
        for (i, v) in self
            .violations
            .iter()
            .take(self.violations_shown_max)
            .enumerate()
        {
            write!(f, "\n  {}. {v}", i + 1)?;
        }
        let hidden = total.saturating_sub(self.violations_shown_max.min(self.violations.len()));
        if hidden > 0 {
            write!(f, "\n  … and {hidden} more")?;
        }
        Ok(())
    }
}
