//! Subscription dispatch as plain state machines (issue 7 item 9, issue 8
//! item 1; STYLE §2): who may consume (Exclusive, Failover, Shared,
//! Key_Shared), which consumer gets each entry (round-robin over consumers
//! with permits, the active consumer, the owner of the entry's key hash),
//! flow-control permits counted in messages (a batch entry counts its
//! messages, pulsar.md G11), unacknowledged tracking with per-consumer and
//! per-subscription limits, and redelivery with per-position counts.
//!
//! Promises: nothing here does I/O, spawns, sleeps or reads a clock. The
//! caller ([`crate::subscription`]) asks [`Dispatcher::next_read`] what to
//! read, reads it from the managed cursor, feeds the entries back with
//! [`Dispatcher::read_done`] and sends what comes out; acks, flow permits,
//! consumer changes and redelivery requests are inputs too.
//!
//! - Nothing is assigned to a consumer without permits (> 0 before the
//!   entry); an entry of `n` messages takes `n` permits (permits may go
//!   negative, as in Pulsar).
//! - An entry is assigned to at most one consumer at a time: it is either
//!   pending (delivered, unacked), queued for replay, being read, or behind
//!   the cursor's read position (never read or rewound).
//! - Redelivery (replay) is dispatched before new entries, in position order;
//!   single-active subscriptions redeliver by rewinding the read position
//!   to the mark-delete, so their order is the topic order.
//! - A message delivered and taken back (redelivery request, consumer gone,
//!   active consumer change, rewind) has its redelivery count raised by one;
//!   counts are kept per position until it is acked or the subscription seeks.
//!
//! Bounds (all in [`DispatchLimits`]): consumers per subscription
//! (`consumers_max`); pending (unacked) messages per consumer and per
//! subscription (`unacked_messages_per_*_max`: over it, a consumer is blocked
//! until it falls to half, the subscription stops dispatching until it falls
//! to half); so pending entries ≤ the subscription limit + one read; the
//! replay set ≤ pending + one read (new entries are read only while it is
//! empty); entries per read (`read_entries_max`); redelivery counts kept
//! (`redelivery_counts_max`: beyond it an increment for a new position is
//! dropped and counted in [`DispatcherStats::redelivery_counts_dropped`]).
//!
//! Key_Shared ([`key_shared`] for the hash and the selector): an entry goes
//! to the consumer owning its sticky key hash, only if that consumer has
//! permits; otherwise it waits in the replay set and later entries of the
//! same hash wait behind it (per-key order), while other keys go on. Ordering
//! across joins ("draining hashes", Pulsar 4 / PIP-379): while a consumer
//! holds delivered, unacked entries of a hash, no other consumer gets an
//! entry of that hash (unless `allowOutOfOrderDelivery`), so a newcomer that
//! takes a hash over starts after the previous owner's acks. A consumer that
//! leaves hands its unacked entries back; they are redelivered in position
//! order to the new owners, before newer entries of those hashes. While every
//! waiting entry is held back, new entries are still read (lookahead) up to
//! `key_shared_lookahead_max` waiting entries.
//!
//! Delayed delivery (issue 8): Shared and Key_Shared hold an entry whose
//! `deliver_at_ms` is later than the caller's clock
//! ([`Dispatcher::advance_clock`]) in a tracker ordered by due time; it takes
//! no permits and blocks nothing behind it; when due it is queued for
//! replay. Exclusive / Failover deliver at once (a single-active consumer
//! joining after Shared ones rewinds, so held entries come in topic order).
//! Bound: `delayed_entries_max` held entries; at it no new entries are read.

mod dispatcher;
mod failover;
pub mod key_shared;
mod types;

pub use dispatcher::{
    Assignment, ConsumerStats, Dispatcher, DispatcherStats, Event, ReadEntry, ReadPlan, ReadTicket,
};
pub use failover::select_active;
pub use key_shared::{HashRange, KeySharedError, KeySharedMode, KeySharedSpec};
pub use types::{
    ConsumerId, ConsumerInfo, DispatchError, DispatchLimits, SubType, check_admission,
};
