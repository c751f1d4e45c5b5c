//! The events a history holds: what producers, consumers, the admin API and
//! the fault injector observed, each stamped with a total-order index.
//!
//! Events are plain serde data so a history can be written as JSON lines and
//! re-checked offline. Topic and subscription names are compared as opaque
//! strings: producers and consumers of one topic must log the same topic
//! string (for a partitioned topic, log the parent topic and let
//! [`MessageId::partition`] tell partitions apart, or log partition topics on
//! both sides).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::message_id::MessageId;

/// One observation, with its place in the total order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the total order of the history (0, 1, 2, …): the order in
    /// which the recorder accepted the events.
    pub index: u64,
    /// Monotonic nanoseconds since the history started.
    pub at_ns: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What an [`Event`] observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// A producer invoked a send, or learned its outcome.
    Send(SendEvent),
    /// A consumer handed a message to the application.
    Receive(ReceiveEvent),
    /// A consumer acknowledged a message (log it before issuing the ack).
    Ack(AckEvent),
    /// The admin API reported a subscription's mark-delete position.
    CursorPosition(CursorPositionEvent),
    /// Something that legitimately makes the broker redeliver a subscription's
    /// unacked messages: a consumer reconnected, was recreated, joined or left
    /// a Failover / Key_Shared subscription, sent a negative ack, had its ack
    /// timeout fire, or seeked.
    RedeliveryTrigger(RedeliveryTriggerEvent),
    /// A fault was injected or healed anywhere in the cluster (kill, stop,
    /// partition, restart). Any subscription may see redeliveries after it,
    /// including of messages whose acks had not been persisted yet.
    Fault(FaultEvent),
}

/// The steps of one send attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum SendOp {
    /// The application called send (log it right before the call, from the
    /// task that calls it, so invocation order is send order).
    Invoked,
    /// The broker's receipt arrived: the message is durable at `message_id`.
    Acked {
        /// Where the broker stored the message.
        message_id: MessageId,
    },
    /// The send failed with an error that says it was not stored.
    Failed {
        /// The error, for humans.
        reason: String,
    },
    /// The outcome is unknown (timeout, connection lost): it may or may not
    /// have been stored.
    Unknown {
        /// Why the outcome is unknown, for humans.
        reason: String,
    },
}

/// A producer's send attempt or its outcome. A payload sent twice (a retry)
/// has two `Invoked` events; each outcome belongs to the oldest attempt of
/// the same producer, topic and payload that has no outcome yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendEvent {
    /// Producer name (unique within a test).
    pub producer: String,
    /// Topic sent to.
    pub topic: String,
    /// Partition key or ordering key, if any.
    #[serde(default)]
    pub key: Option<String>,
    /// The unique id the test put in the payload.
    pub payload_id: String,
    /// Which step of the attempt this is.
    #[serde(flatten)]
    pub op: SendOp,
}

/// Pulsar subscription types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubType {
    /// One consumer; ordered.
    Exclusive,
    /// One active consumer at a time; ordered.
    Failover,
    /// Round-robin across consumers; no order.
    Shared,
    /// Messages of one key go to one consumer; ordered per key.
    KeyShared,
}

impl SubType {
    /// Whether the subscription promises order (per partition, or per key
    /// for Key_Shared).
    pub fn is_ordered(self) -> bool {
        !matches!(self, SubType::Shared)
    }
}

impl fmt::Display for SubType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SubType::Exclusive => "Exclusive",
            SubType::Failover => "Failover",
            SubType::Shared => "Shared",
            SubType::KeyShared => "Key_Shared",
        })
    }
}

/// A consumer handed a message to the application.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiveEvent {
    /// Consumer name.
    pub consumer: String,
    /// Subscription name.
    pub subscription: String,
    /// Subscription type the consumer subscribed with.
    pub sub_type: SubType,
    /// Topic received from.
    pub topic: String,
    /// The message's key, if any.
    #[serde(default)]
    pub key: Option<String>,
    /// The payload id found in the message.
    pub payload_id: String,
    /// The message's id.
    pub message_id: MessageId,
    /// `CommandMessage.redelivery_count`.
    #[serde(default)]
    pub redelivery_count: u32,
}

/// A consumer acknowledged a message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckEvent {
    /// Consumer name.
    pub consumer: String,
    /// Subscription name.
    pub subscription: String,
    /// Topic.
    pub topic: String,
    /// The acked message (for a cumulative ack: everything up to it).
    pub message_id: MessageId,
    /// The payload id, for humans reading the history (the checker matches
    /// acks by message id).
    #[serde(default)]
    pub payload_id: Option<String>,
    /// Cumulative (everything up to `message_id`) rather than individual.
    #[serde(default)]
    pub cumulative: bool,
}

/// A subscription's mark-delete position as the admin stats reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorPositionEvent {
    /// Topic (with the partition in `mark_delete.partition` if partitioned).
    pub topic: String,
    /// Subscription name.
    pub subscription: String,
    /// Every entry at or before this position is deleted from the backlog.
    pub mark_delete: MessageId,
}

/// See [`EventKind::RedeliveryTrigger`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedeliveryTriggerEvent {
    /// Consumer name.
    pub consumer: String,
    /// Subscription name.
    pub subscription: String,
    /// Topic.
    pub topic: String,
    /// What happened (reconnect, negative ack, …), for humans.
    pub reason: String,
}

/// See [`EventKind::Fault`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultEvent {
    /// What was done, for humans.
    pub description: String,
}

/// A subscription of a topic (subscription names are per topic).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SubscriptionRef {
    /// Topic.
    pub topic: String,
    /// Subscription name.
    pub subscription: String,
}

impl SubscriptionRef {
    /// `subscription` of `topic`.
    pub fn new(topic: impl Into<String>, subscription: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            subscription: subscription.into(),
        }
    }
}

impl fmt::Display for SubscriptionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` on `{}`", self.subscription, self.topic)
    }
}
