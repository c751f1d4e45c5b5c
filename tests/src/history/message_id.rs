//! Pulsar message ids as the history records them, with a total order.
//!
//! A [`MessageId`] is Pulsar's `MessageIdData`: ledger id, entry id, batch
//! index (−1 for a message that is not part of a batch) and partition index
//! (−1 for a non-partitioned topic). Ids order the way Pulsar's Java client
//! orders them (`ledger_id`, then `entry_id`, then `partition`, then
//! `batch_index`), which within one partition is the log order: ledger ids of
//! one managed ledger only grow, and entry ids grow within a ledger.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The "absent" value of [`MessageId::batch_index`] and [`MessageId::partition`].
pub const NONE_INDEX: i32 = -1;

fn none_index() -> i32 {
    NONE_INDEX
}

/// One message's position in a topic: Pulsar's `MessageIdData`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MessageId {
    /// The BookKeeper ledger holding the entry.
    pub ledger_id: u64,
    /// The entry inside the ledger.
    pub entry_id: u64,
    /// Index inside a batch entry, or −1 when the entry holds one message.
    #[serde(default = "none_index")]
    pub batch_index: i32,
    /// Partition index, or −1 for a non-partitioned topic.
    #[serde(default = "none_index")]
    pub partition: i32,
}

impl MessageId {
    /// A non-batched message of a non-partitioned topic.
    pub fn new(ledger_id: u64, entry_id: u64) -> Self {
        Self {
            ledger_id,
            entry_id,
            batch_index: NONE_INDEX,
            partition: NONE_INDEX,
        }
    }

    /// The same id with `batch_index` set.
    pub fn with_batch_index(mut self, batch_index: i32) -> Self {
        self.batch_index = batch_index;
        self
    }

    /// The same id with `partition` set.
    pub fn with_partition(mut self, partition: i32) -> Self {
        self.partition = partition;
        self
    }

    /// The id Pulsar puts in the receipt of a send the broker recognised as a
    /// duplicate of one it already stored (de-duplication: `-1:-1`). The
    /// send is acknowledged, but where it is stored is not said.
    pub fn is_unknown_position(&self) -> bool {
        self.ledger_id == u64::MAX && self.entry_id == u64::MAX
    }

    /// The entry this message lives in: `(ledger_id, entry_id)`.
    pub fn entry_position(&self) -> (u64, u64) {
        (self.ledger_id, self.entry_id)
    }

    /// Key under which a cumulative ack covers messages: an id without a batch
    /// index stands for its whole entry.
    fn cover_key(&self) -> (u64, u64, i32) {
        let batch = if self.batch_index < 0 {
            i32::MAX
        } else {
            self.batch_index
        };
        (self.ledger_id, self.entry_id, batch)
    }

    /// Whether a cumulative ack of `self` acknowledges `other`: same partition
    /// and `other` at or before `self` (an id without a batch index covers
    /// every message of its entry).
    pub fn covers(&self, other: &MessageId) -> bool {
        self.partition == other.partition && self.cover_key() >= other.cover_key()
    }

    /// Whether a cursor whose mark-delete position is `self` has deleted
    /// `other`: same partition and `other`'s entry at or before `self`'s entry
    /// (the mark-delete position is an entry position; batch indexes do not
    /// matter).
    pub fn mark_delete_covers(&self, other: &MessageId) -> bool {
        self.partition == other.partition && other.entry_position() <= self.entry_position()
    }
}

impl Ord for MessageId {
    fn cmp(&self, other: &Self) -> Ordering {
        (
            self.ledger_id,
            self.entry_id,
            self.partition,
            self.batch_index,
        )
            .cmp(&(
                other.ledger_id,
                other.entry_id,
                other.partition,
                other.batch_index,
            ))
    }
}

impl PartialOrd for MessageId {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for MessageId {
    /// Pulsar's notation: `ledger:entry:partition`, plus `:batch` for a batch message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.ledger_id, self.entry_id, self.partition)?;
        if self.batch_index >= 0 {
            write!(f, ":{}", self.batch_index)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_order_by_ledger_then_entry_then_batch() {
        let a = MessageId::new(3, 9);
        let b = MessageId::new(4, 0);
        let c = MessageId::new(4, 0).with_batch_index(0);
        let d = MessageId::new(4, 0).with_batch_index(1);
        let e = MessageId::new(4, 1);
        let mut ids = vec![e, d, c, b, a];
        ids.sort();
        assert_eq!(ids, vec![a, b, c, d, e]);
    }

    #[test]
    fn cumulative_cover_is_per_partition_and_entry_wide_without_batch_index() {
        let whole = MessageId::new(4, 0);
        let in_batch = MessageId::new(4, 0).with_batch_index(5);
        assert!(whole.covers(&in_batch));
        assert!(!in_batch.with_batch_index(4).covers(&in_batch));
        assert!(!whole.covers(&MessageId::new(4, 1)));
        assert!(!whole.with_partition(1).covers(&in_batch));
    }

    #[test]
    fn mark_delete_covers_whole_entries() {
        let md = MessageId::new(4, 2);
        assert!(md.mark_delete_covers(&MessageId::new(4, 2).with_batch_index(7)));
        assert!(md.mark_delete_covers(&MessageId::new(3, 100)));
        assert!(!md.mark_delete_covers(&MessageId::new(4, 3)));
    }

    #[test]
    fn display_follows_pulsar_notation() {
        assert_eq!(MessageId::new(7, 3).to_string(), "7:3:-1");
        assert_eq!(
            MessageId::new(7, 3)
                .with_partition(2)
                .with_batch_index(1)
                .to_string(),
            "7:3:2:1"
        );
    }
}
