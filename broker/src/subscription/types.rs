//! What the subscription layer takes and gives: consumer specs with their
//! sinks, deliveries, settings, errors and figures.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::dispatch::key_shared::{sticky_key, sticky_key_hash};
use crate::dispatch::{
    ConsumerId, DispatchError, DispatchLimits, DispatcherStats, KeySharedSpec, SubType,
};
use crate::managed_ledger::Position;
use crate::managed_ledger::io::MlError;

/// The number of messages in an entry (a batch counts its messages,
/// pulsar.md G11), read from the stored bytes by the caller's codec. A
/// result of 0 is taken as 1.
pub type MessageCounter = Arc<dyn Fn(&[u8]) -> u32 + Send + Sync>;

/// A function from stored entry bytes to its sticky key hash.
pub type KeyHashFn = dyn Fn(&[u8]) -> u16 + Send + Sync;

/// The sticky key hash of a stored entry (Key_Shared), `0..65536`.
#[derive(Clone)]
pub struct KeyHasher(pub Arc<KeyHashFn>);

impl KeyHasher {
    /// Pulsar's rule on a stored Pulsar entry (`[magic, crc, metadata,
    /// payload]`): the hash of the metadata's ordering key, else partition
    /// key, else `NONE_KEY` (also for an entry that does not parse).
    pub fn pulsar() -> Self {
        Self(Arc::new(|entry: &[u8]| {
            let parsed = cms_client::proto::frame::parse_entry(entry).ok();
            let m = parsed.as_ref().map(|p| &p.metadata);
            let key = sticky_key(
                m.and_then(|m| m.ordering_key.as_deref()),
                m.and_then(|m| m.partition_key.as_deref()),
                m.and_then(|m| m.partition_key_b64_encoded).unwrap_or(false),
            );
            sticky_key_hash(&key)
        }))
    }

    /// The hash of `entry`.
    pub fn hash(&self, entry: &[u8]) -> u16 {
        (self.0)(entry)
    }
}

impl Default for KeyHasher {
    fn default() -> Self {
        Self::pulsar()
    }
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher")
    }
}

impl PartialEq for KeyHasher {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for KeyHasher {}

/// A function giving the byte budget of the next cursor read.
pub type ReadBudgetFn = dyn Fn() -> Option<usize> + Send + Sync;

/// The byte budget of one cursor read, asked before each read of new
/// entries (`None`: no budget; the managed ledger's read-ahead applies).
/// The broker gives a subscription under a dispatch-rate quota a tenth of a
/// second of its tightest byte rate (see `crate::consumers`), so its bookie
/// reads come in pieces its rate drains within that time.
#[derive(Clone)]
pub struct ReadBudget(pub Arc<ReadBudgetFn>);

impl ReadBudget {
    /// The budget of the next read.
    pub fn get(&self) -> Option<usize> {
        (self.0)()
    }
}

impl Default for ReadBudget {
    fn default() -> Self {
        Self(Arc::new(|| None))
    }
}

impl std::fmt::Debug for ReadBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadBudget({:?})", self.get())
    }
}

impl PartialEq for ReadBudget {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ReadBudget {}

/// A function from stored entry bytes to its delivery time (Unix ms).
pub type DeliverAtFn = dyn Fn(&[u8]) -> Option<u64> + Send + Sync;

/// Delayed delivery: when a stored entry may be delivered (Shared and
/// Key_Shared only; see [`crate::dispatch`]).
#[derive(Clone)]
pub struct DeliverAt(pub Arc<DeliverAtFn>);

impl DeliverAt {
    /// Pulsar's rule on a stored Pulsar entry: the metadata's
    /// `deliver_at_time` (set by `deliverAfter` / `deliverAt`), if positive;
    /// an entry that does not parse is delivered at once.
    pub fn pulsar() -> Self {
        Self(Arc::new(|entry: &[u8]| {
            let parsed = cms_client::proto::frame::parse_entry(entry).ok()?;
            let at = parsed.metadata.deliver_at_time?;
            u64::try_from(at).ok().filter(|at| *at > 0)
        }))
    }

    /// The delivery time of `entry`, if it has one.
    pub fn deliver_at_ms(&self, entry: &[u8]) -> Option<u64> {
        (self.0)(entry)
    }
}

impl Default for DeliverAt {
    fn default() -> Self {
        Self::pulsar()
    }
}

impl std::fmt::Debug for DeliverAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeliverAt")
    }
}

impl PartialEq for DeliverAt {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for DeliverAt {}

/// What a subscription sends to a consumer's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// An entry (a message or a batch) for the consumer.
    Message {
        /// The consumer.
        consumer_id: ConsumerId,
        /// The entry's position (ledger id, entry id).
        position: Position,
        /// Times it was delivered and taken back before.
        redelivery_count: u32,
        /// The messages it delivers (the consumer's permits it took): a
        /// batch's messages, less those acked on their own. What the broker
        /// counts as sent (metrics, dispatch-rate quotas), so the entry need
        /// not be parsed again for it.
        messages: u32,
        /// The stored entry bytes, untouched.
        entry: Bytes,
        /// Batch-index acks: the bit set (1 = unacked) of the batch's
        /// messages when some were acked on their own (the client skips the
        /// others); empty otherwise. Goes out as `CommandMessage.ack_set`.
        ack_set: Vec<i64>,
    },
    /// Failover: the consumer became (in)active.
    ActiveChanged {
        /// The consumer.
        consumer_id: ConsumerId,
        /// Whether it is the active consumer now.
        is_active: bool,
    },
}

/// A consumer to attach.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// Its identity.
    pub id: ConsumerId,
    /// Its name (Failover orders by priority, then name).
    pub name: String,
    /// Priority level: lower is preferred.
    pub priority: i32,
    /// The subscription type asked for.
    pub sub_type: SubType,
    /// Key_Shared settings (`None`: AUTO_SPLIT, ordered).
    pub key_shared: Option<KeySharedSpec>,
    /// Where its deliveries go (bounded; owned by the connection). A full
    /// sink pauses deliveries to this consumer; a closed one detaches it.
    pub sink: mpsc::Sender<Delivery>,
}

/// Where a non-durable subscription (a reader) starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPosition {
    /// At the first stored entry.
    Earliest,
    /// After the last confirmed entry.
    Latest,
    /// At the first entry at or after this position.
    At(Position),
}

/// Settings of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionConfig {
    /// The dispatcher's bounds.
    pub limits: DispatchLimits,
    /// Longest single wait for new entries (or any other wake-up) before the
    /// read task looks again, ms.
    pub tail_wait_ms: u64,
    /// Longest delay between retries of a failed read, ms (doubling from
    /// 10 ms).
    pub read_retry_delay_ms_max: u64,
    /// Key_Shared: the sticky key hash of an entry (default: Pulsar's rule
    /// on a stored Pulsar entry). Called only while the subscription is
    /// Key_Shared or has no consumers (the other types never use it).
    pub key_hasher: KeyHasher,
    /// Delayed delivery: an entry's delivery time (default: Pulsar's
    /// `deliver_at_time` of a stored Pulsar entry).
    pub deliver_at: DeliverAt,
    /// The byte budget of each read of new entries (default: none).
    pub read_budget: ReadBudget,
}

impl Default for SubscriptionConfig {
    fn default() -> Self {
        Self {
            limits: DispatchLimits::default(),
            tail_wait_ms: 1_000,
            read_retry_delay_ms_max: 5_000,
            key_hasher: KeyHasher::default(),
            deliver_at: DeliverAt::default(),
            read_budget: ReadBudget::default(),
        }
    }
}

/// Why a subscription call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubError {
    /// The dispatcher refused (consumer busy, type mismatch, unknown
    /// consumer, cumulative ack on Shared, ...).
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
    /// The managed ledger or cursor failed.
    #[error(transparent)]
    Ml(#[from] MlError),
    /// Unsubscribe while other consumers are attached.
    #[error("subscription {subscription} has {others} other consumer(s) connected")]
    OtherConsumersConnected {
        /// The subscription.
        subscription: String,
        /// How many other consumers are attached.
        others: usize,
    },
    /// The subscription was closed or unsubscribed.
    #[error("subscription {0} is closed")]
    Closed(String),
}

/// A subscription's figures (Pulsar's subscription stats, in part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionStats {
    /// Subscription name.
    pub name: String,
    /// Durable (a stored cursor) or a reader.
    pub durable: bool,
    /// Unacknowledged entries after the mark-delete (`msgBacklog`, counted
    /// in entries: a batch counts once).
    pub msg_backlog: u64,
    /// The cursor's mark-delete position.
    pub mark_delete: Position,
    /// The cursor's read position.
    pub read_position: Position,
    /// Unacked messages, blocked flags, per-consumer permits and unacked.
    pub dispatcher: DispatcherStats,
    /// Why the read task stopped, if it stopped on an error.
    pub failed: Option<String>,
}
