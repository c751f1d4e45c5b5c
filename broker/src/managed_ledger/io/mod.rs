//! The managed ledger's async I/O driver (issue 6, part 2): the pure core of
//! [`crate::managed_ledger`] carried out over the ledger client
//! ([`cms_bookie::client::driver::LedgerClient`]) and the metadata store.
//!
//! Promises (DESIGN §4):
//! - invariant 5: opening recovery-opens (fences and closes) every listed
//!   ledger that is not closed, and a new ledger is in the stored list (CAS)
//!   before its first write; a `Fenced` ledger error or a version conflict on
//!   the list makes the managed ledger terminal: every pending and later
//!   append fails with [`MlError::Fenced`];
//! - invariant 1: appends complete in submission order across rollovers and
//!   across close-and-resend, each with its position;
//! - close-and-resend: any other ledger write error recovery-opens the failed
//!   ledger, completes the pending appends it holds, and resends the rest in
//!   order on a new ledger (stored in the list first; ledgers of a rollover
//!   in flight are abandoned, so nothing is stored twice). Retries back off
//!   within `ledger_failure_retry.window_ms`; appends not placed by then fail
//!   with [`MlError::Unavailable`] and are not stored (the handle stays
//!   usable); a ledger not recovered by then is terminal (what it holds is
//!   unknown: the next owner's open recovers it);
//! - invariant 6: cursors are persisted as full snapshots in their own ledger
//!   (at most once per `persist_interval_ms`, and on close) and restored from
//!   its last entry, else from the cursor node; nothing unacknowledged is
//!   ever restored as acknowledged;
//! - invariant 7: trimming deletes only what [`crate::managed_ledger::deletable_ledgers`]
//!   allows, after the list without them is stored.
//!
//! Decisions (rollover, persistence rate, trimming, publish-time search) stay
//! in the core; this module only reads, writes and sequences. It starts no
//! timer: the owner calls [`ManagedLedger::tick`] periodically (idle
//! rollover, TTL expiry, due cursor snapshots, trimming).
//!
//! Catch-up reads bypass the shared cache and read ahead into a bounded
//! per-cursor buffer. Every bookie read waits for its tenant's turn in the
//! broker-wide [`DispatchReads`] queues and carries the tenant as its
//! fairness key (invariant 8).

pub mod cache;
mod cursor_io;
pub mod dispatch_reads;
pub mod managed_ledger;

pub use cache::EntryCache;
pub use dispatch_reads::DispatchReads;
pub use managed_ledger::{
    Entry, ManagedCursor, ManagedLedger, ManagedLedgerConfig, MlError, Persist, PublishTimeFn,
    SeekTarget,
};
