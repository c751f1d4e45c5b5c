//! The bookie server: where "acknowledged" becomes true.
//!
//! - [`core`] — the request logic without the network (adds, fencing reads,
//!   long polls, LAC), over the [`crate::journal`] and [`crate::storage`];
//! - [`ledger`] — the cached per-ledger state (master key, fenced, limbo, LAC);
//! - [`grpc`] — the `Bookie` gRPC service, target checks, stream bounds, fair reads;
//! - `add_stream` — one add stream driven by its own response polling (no task hop);
//! - [`cookie`] — identity checks of every data directory against the metadata store;
//! - [`registration`] — the ephemeral `available/` / `readonly/` node;
//! - [`http`] — `/health`, `/ready`, `/metrics` (and test-only fault triggers);
//! - [`run`] — start order, checkpoints, disk watch, GC, draining shutdown;
//! - [`config`] — `cms-bookie serve` options.
//!
//! Promise: an add is answered `OK` only when its journal record is durable
//! under the sync policy (fsync-before-ack by default), and a fence is answered
//! only when it is durable (DESIGN §4, invariants 1–3).

mod add_stream;
pub mod config;
pub mod cookie;
pub mod core;
pub mod grpc;
pub mod http;
pub mod ledger;
pub mod metrics;
pub mod registration;
pub mod run;

pub use config::BookieConfig;
pub use run::{ServerError, run};
