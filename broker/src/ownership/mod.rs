//! Namespace bundles and broker ownership (issue 9, DESIGN §6 "Ownership",
//! invariant 5).
//!
//! - [`bundles`] (pure) — a namespace's hash range split into bundles and a
//!   topic's bundle (CRC-32 of the full name, as Pulsar);
//! - [`load`] (pure) — broker registration and load report JSON, and the
//!   least-loaded placement choice;
//! - [`liveness`] (pure) — the "last heard from the metadata store" clock
//!   that decides when ownership must be given up (2/3 of the session
//!   timeout);
//! - [`manager`] — the I/O: ownership nodes `/cms/ownership/<t>/<ns>/<range>`,
//!   lookups, the watchdog, load reports, unload and drain.
//!
//! Promise: in cluster mode a broker serves a topic only while it holds the
//! ownership node of its bundle with a fresh session; in standalone every
//! topic is owned by the one broker.

pub mod bundles;
pub mod liveness;
pub mod load;
pub mod manager;

pub use manager::{
    BundleKey, LookupAnswer, Ownership, OwnershipConfig, OwnershipError, SplitOutcome,
};
