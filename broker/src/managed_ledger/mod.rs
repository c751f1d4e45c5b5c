//! The managed ledger's and cursor's pure core (issue 6, item 5; STYLE §2): a
//! topic as an ordered list of ledgers, cursors as a mark-delete position plus
//! a bounded set of individually acknowledged ranges, and the decisions taken
//! over them (rollover, trimming, persistence rate, publish-time search,
//! close-and-resend after a ledger write failure).
//!
//! Promises: nothing here does I/O, spawns, sleeps or reads a clock. Time is
//! an input in milliseconds; the async driver reads and writes ledgers and the
//! metadata store, feeds the results in and carries out what comes back. The
//! record formats persisted by that driver are the prost types in [`proto`].
//!
//! Invariants enforced here (DESIGN §4): 6 (an entry leaves a cursor's backlog
//! only by an ack, a cumulative ack, or a TTL expiry that moves the
//! mark-delete; a bounded snapshot drops acks, never unacked entries) and 7
//! (trimming deletes only ledgers every durable cursor has passed and that
//! retention allows, never the current or last ledger).

pub mod cursor;
pub mod ledger_list;
pub mod metrics;
pub mod position;
pub mod publish_time;
pub mod range_set;
pub mod resend;
pub mod rollover;
pub mod trim;
pub mod ttl;

pub mod io;

pub use cursor::{
    AckOutcome, Cursor, CursorConfig, CursorError, CursorLedgerRollover, InitialPosition, Snapshot,
    WallAnchor, newest_snapshot, ttl_cutoff_ms,
};
pub use ledger_list::{LedgerList, LedgerListError, LedgerMeta};
pub use metrics::{MlMetrics, MlMetricsSnapshot};
pub use position::Position;
pub use publish_time::{PublishTimeSearch, SearchError, SearchResult, SearchStep};
pub use range_set::{PersistedRanges, RangeSet};
pub use resend::{ResendError, ResendPlan, RetryPolicy, plan_resend};
pub use rollover::{RolloverDecision, RolloverPolicy, RolloverReason};
pub use trim::{RetentionPolicy, deletable_ledgers};

/// Records of `broker/proto/cms/broker/v1/managed_ledger.proto` (prost): the
/// managed-ledger list, the cursor node and cursor snapshots.
pub mod proto {
    #![allow(
        missing_docs,
        reason = "generated code; the .proto documents every field"
    )]
    #![allow(clippy::all, reason = "generated code")]
    include!(concat!(env!("OUT_DIR"), "/cms.broker.v1.rs"));
}
