//! The vocabulary of dispatch: consumer identity, subscription types, the
//! limits every dispatcher enforces and the errors it answers with.

use std::fmt;

use super::key_shared::{KeySharedError, KeySharedSpec};

/// A consumer: the connection it came on and the consumer id the client chose
/// on that connection (Pulsar consumer ids are per connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConsumerId {
    /// Broker-assigned connection id.
    pub connection: u64,
    /// The client's consumer id on that connection.
    pub consumer: u64,
}

impl ConsumerId {
    /// Consumer `consumer` of connection `connection`.
    pub const fn new(connection: u64, consumer: u64) -> Self {
        Self {
            connection,
            consumer,
        }
    }
}

impl fmt::Display for ConsumerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.connection, self.consumer)
    }
}

/// Subscription type (Pulsar `CommandSubscribe.subType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubType {
    /// One consumer; a second one is refused.
    Exclusive,
    /// Every consumer gets a share of the entries (round-robin by permits).
    Shared,
    /// Many consumers, one active (priority, then name) receives everything.
    Failover,
    /// Every key (sticky key hash) goes to one consumer at a time, in order
    /// (see [`super::key_shared`]).
    KeyShared,
}

impl SubType {
    /// True for the types where one consumer receives everything in order.
    pub const fn is_single_active(self) -> bool {
        matches!(self, Self::Exclusive | Self::Failover)
    }

    /// True for the types that spread entries over many consumers.
    pub const fn is_multi(self) -> bool {
        matches!(self, Self::Shared | Self::KeyShared)
    }

    /// Whether cumulative acks are allowed (not on Shared / Key_Shared).
    pub const fn allows_cumulative_ack(self) -> bool {
        self.is_single_active()
    }
}

impl fmt::Display for SubType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Exclusive => "Exclusive",
            Self::Shared => "Shared",
            Self::Failover => "Failover",
            Self::KeyShared => "Key_Shared",
        })
    }
}

/// A consumer as the dispatcher sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerInfo {
    /// Its identity.
    pub id: ConsumerId,
    /// Consumer name (Failover orders by it after priority).
    pub name: String,
    /// Priority level: lower is preferred (Pulsar `priority_level`, 0 = top).
    pub priority: i32,
    /// The subscription type it asked for.
    pub sub_type: SubType,
    /// Key_Shared settings (`None` = AUTO_SPLIT, ordered); ignored for
    /// other types.
    pub key_shared: Option<KeySharedSpec>,
}

/// The bounds of one dispatcher (Pulsar defaults where Pulsar has one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchLimits {
    /// Unacked messages of one consumer before it is blocked (until it falls
    /// to half). Pulsar `maxUnackedMessagesPerConsumer=50000`.
    pub unacked_messages_per_consumer_max: u64,
    /// Unacked messages of the subscription before dispatching stops (until
    /// it falls to half). Pulsar `maxUnackedMessagesPerSubscription=200000`.
    pub unacked_messages_per_subscription_max: u64,
    /// Consumers attached at once.
    pub consumers_max: usize,
    /// Entries asked for in one read.
    pub read_entries_max: usize,
    /// Consecutive entries one Shared consumer gets before the next one's
    /// turn. Pulsar `dispatcherMaxRoundRobinBatchSize=20`.
    pub round_robin_entries_max: u32,
    /// Positions whose redelivery count is kept.
    pub redelivery_counts_max: usize,
    /// Key_Shared: entries waiting for redelivery (held back by ordering or
    /// without a consumer that can take them) beyond which no new entries
    /// are read. Pulsar
    /// `keySharedLookAheadMsgInReplayThresholdPerSubscription=20000`.
    pub key_shared_lookahead_max: usize,
    /// Delayed delivery: entries held until their delivery time, at most.
    /// At the bound no new entries are read (only redeliveries and entries
    /// coming due go out) until some are delivered; the held ones stay
    /// unacked in the cursor, so nothing is lost. Pulsar keeps them in an
    /// unbounded in-memory (or bucketed on-ledger) tracker.
    pub delayed_entries_max: usize,
}

impl Default for DispatchLimits {
    fn default() -> Self {
        Self {
            unacked_messages_per_consumer_max: 50_000,
            unacked_messages_per_subscription_max: 200_000,
            consumers_max: 1_000,
            read_entries_max: 100,
            round_robin_entries_max: 20,
            redelivery_counts_max: 400_000,
            key_shared_lookahead_max: 20_000,
            delayed_entries_max: 100_000,
        }
    }
}

/// Why the dispatcher refused an input. `ConsumerBusy`, `SubTypeMismatch`
/// and `TooManyConsumers` are Pulsar's `ConsumerBusy` class on the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// An Exclusive subscription already has its consumer.
    #[error("Exclusive consumer is already connected ({existing})")]
    ConsumerBusy {
        /// The consumer holding it.
        existing: ConsumerId,
    },
    /// The subscription has consumers of another type.
    #[error("Subscription is of different type: it is {current}, {requested} was asked for")]
    SubTypeMismatch {
        /// The type of the connected consumers.
        current: SubType,
        /// The type asked for.
        requested: SubType,
    },
    /// The consumer limit is reached.
    #[error("too many consumers on the subscription (at most {max})")]
    TooManyConsumers {
        /// The limit.
        max: usize,
    },
    /// The consumer id is already attached.
    #[error("consumer {0} is already attached")]
    DuplicateConsumer(ConsumerId),
    /// No such consumer is attached.
    #[error("consumer {0} is not attached")]
    UnknownConsumer(ConsumerId),
    /// Cumulative ack on a Shared or Key_Shared subscription.
    #[error("cumulative ack is not allowed on a Shared or Key_Shared subscription")]
    CumulativeAckOnShared,
    /// A Key_Shared consumer's settings were refused (mode mismatch, range
    /// conflict); Pulsar's `ConsumerAssignError` / `ConsumerBusy` on the wire.
    #[error(transparent)]
    KeyShared(#[from] KeySharedError),
}

/// The checks every subscription (persistent or not) makes before attaching
/// `info` to the consumers already `attached` under `sub_type`: no duplicate
/// id, one subscription type, one consumer on Exclusive, at most
/// `consumers_max` consumers.
pub fn check_admission<'a>(
    sub_type: Option<SubType>,
    attached: impl ExactSizeIterator<Item = &'a ConsumerInfo> + Clone,
    consumers_max: usize,
    info: &ConsumerInfo,
) -> Result<(), DispatchError> {
    if attached.clone().any(|c| c.id == info.id) {
        return Err(DispatchError::DuplicateConsumer(info.id));
    }
    if let Some(current) = sub_type {
        if current != info.sub_type {
            return Err(DispatchError::SubTypeMismatch {
                current,
                requested: info.sub_type,
            });
        }
        if current == SubType::Exclusive
            && let Some(c) = attached.clone().next()
        {
            return Err(DispatchError::ConsumerBusy { existing: c.id });
        }
    }
    if attached.len() >= consumers_max {
        return Err(DispatchError::TooManyConsumers { max: consumers_max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_active_types_allow_cumulative_acks() {
        for (t, single) in [
            (SubType::Exclusive, true),
            (SubType::Failover, true),
            (SubType::Shared, false),
            (SubType::KeyShared, false),
        ] {
            assert_eq!(t.is_single_active(), single, "{t}");
            assert_eq!(t.allows_cumulative_ack(), single, "{t}");
        }
    }

    #[test]
    fn errors_say_what_pulsar_says() {
        let e = DispatchError::SubTypeMismatch {
            current: SubType::Shared,
            requested: SubType::Exclusive,
        };
        assert!(
            e.to_string()
                .starts_with("Subscription is of different type")
        );
        let e = DispatchError::ConsumerBusy {
            existing: ConsumerId::new(1, 2),
        };
        assert_eq!(
            e.to_string(),
            "Exclusive consumer is already connected (1/2)"
        );
    }
}
