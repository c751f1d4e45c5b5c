//! History recorder and checker for fault tests.
//!
//! Producers and consumers log every operation into a [`History`] (sends
//! invoked / acked / failed / unknown, receives, acks, cursor positions read
//! from the admin API, redelivery triggers and injected faults). After the
//! faults heal and consumers drain, [`check`] judges the history and returns
//! a [`Report`] of typed [`Violation`]s: lost acked messages, unexplained
//! duplicates, reordering, cursors moved past unacked messages, phantom
//! messages and diverging message ids. The exact rules are in the
//! [`checker`] module doc. Pure logic: the only I/O is the optional
//! JSON-lines file.
//!
//! ```
//! use cms_tests::history::{CheckOptions, History, MessageId, SubType};
//!
//! let history = History::new(100_000);
//! let producer = history.producer("p1", "persistent://t/ns/orders");
//! let consumer = history.consumer("c1", "persistent://t/ns/orders", "audit", SubType::Exclusive);
//!
//! producer.invoked(None, "order-1");
//! producer.acked("order-1", MessageId::new(7, 0));
//! consumer.received(None, "order-1", MessageId::new(7, 0), 0);
//! consumer.acked(MessageId::new(7, 0), Some("order-1"));
//!
//! let options = CheckOptions::at_least_once().require_complete("persistent://t/ns/orders", "audit");
//! history.check(&options).assert_ok();
//! ```

pub mod checker;
pub mod event;
pub mod message_id;
pub mod recorder;
pub mod report;

pub use checker::{CheckOptions, DuplicatePolicy, check};
pub use event::{
    AckEvent, CursorPositionEvent, Event, EventKind, FaultEvent, ReceiveEvent,
    RedeliveryTriggerEvent, SendEvent, SendOp, SubType, SubscriptionRef,
};
pub use message_id::MessageId;
pub use recorder::{ConsumerRecorder, History, HistoryError, ProducerRecorder, load_jsonl};
pub use report::{
    Counts, DuplicateReason, ReceiptEvidence, ReorderRule, Report, Sighting, Violation,
    ViolationKind,
};
