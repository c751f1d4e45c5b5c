//! `cms-bookie`: the BookKeeper core of CMS — a replicated, single-writer
//! log (a *ledger*) whose acknowledged entries survive bookie, writer and disk
//! failures. It knows nothing of topics or Pulsar; used on its own it is a
//! standalone write-ahead log.
//!
//! # A standalone WAL
//!
//! Connect to the metadata store, create a ledger on three bookies (every
//! entry written to 3, acknowledged once 2 have it on disk), append, let a
//! standby read up to the last add confirmed (LAC), and — when the writer
//! dies — recover the ledger: it is fenced (the old writer can no longer
//! add), every acknowledged entry is kept, and it is closed.
//!
//! ```no_run
//! # async fn wal() -> Result<(), Box<dyn std::error::Error>> {
//! use std::collections::HashMap;
//!
//! use bytes::Bytes;
//! use cms_bookie::client::driver::{LedgerClient, LedgerClientOptions};
//! use cms_bookie::metadata::connect::{MetadataUrl, connect};
//! use cms_bookie::metadata::layout::Layout;
//! use cms_bookie::metadata::zk::ZkOptions;
//!
//! let url: MetadataUrl = "zk://127.0.0.1:2181".parse()?;
//! let store = connect(&url, &ZkOptions::default()).await?;
//! let client =
//!     LedgerClient::connect(store, Layout::new("/cms")?, LedgerClientOptions::default()).await?;
//!
//! // The writer: E = 3, Qw = 3, Qa = 2.
//! let log = client.create_ledger(3, 3, 2, b"wal-password", HashMap::new()).await?;
//! let ledger_id = log.ledger_id();
//! let first = log.add(Bytes::from_static(b"edit 1")).await?; // durable on 2 bookies
//! assert_eq!(first, 0);
//! // Pipelined: ids follow the submission order, completions come in order.
//! let mut pending = Vec::new();
//! for i in 2..=100 {
//!     pending.push(log.add_pipelined(format!("edit {i}").into_bytes()).await?);
//! }
//! for p in pending {
//!     p.await?;
//! }
//!
//! // A standby tails the log; it never reads past the LAC.
//! let standby = client.open_ledger(ledger_id, false).await?;
//! let lac = standby.read_lac().await?;
//! for entry in standby.read(0, lac).await? {
//!     let _edit: Bytes = entry.payload; // apply it
//! }
//! let _newer = standby.wait_lac_above(lac, 1_000).await?; // long poll
//!
//! // The writer dies without closing; the standby takes over.
//! drop(log);
//! let recovered = client.open_ledger(ledger_id, true).await?; // fence, recover, close
//! assert!(recovered.is_closed());
//! let tail = recovered.read(lac + 1, recovered.last_readable()).await?;
//! # let _ = tail;
//! // ... and starts its own ledger for new edits.
//! let _next = client.create_ledger(3, 3, 2, b"wal-password", HashMap::new()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What is here
//!
//! | module | what it is |
//! |---|---|
//! | [`metadata`] | one async API over ZooKeeper and an embedded single-file store; the `/cms` layout and `init-cluster` |
//! | [`proto`] | the wire (bookie gRPC) and metadata records, generated from `bookie/format/proto` |
//! | [`entry`] | the entry format (header with LAC and length, CRC32C) shared by writer, bookie and reader (in `cms-bookie-format`, with the journal and entry-log record formats and the protocol messages) |
//! | [`fs`] | the storage seam every journal and entry-log byte goes through |
//! | [`journal`] | the bookie's write-ahead log (group commit, fsync before ack) |
//! | [`storage`] | ledger storage: write cache, entry logs, one redb index, read cache, GC |
//! | [`server`] | the bookie server: fencing, master keys, limbo, long poll, registration, HTTP health and metrics |
//! | [`bookie_client`] | one gRPC connection to one bookie (pipelined add stream) |
//! | [`client`] | the ledger client: a sans-I/O protocol core (writer, recovery, reader, quorums), tested in deterministic simulation, and its async [`client::driver`] ([`client::driver::LedgerClient`]) |
//!
//! Binaries: `cms-bookie` (`serve`, `init-cluster`, `format`, ...),
//! `cms-bookie-perf` (single-bookie benchmarks) and `cms-ledger-bench`
//! (ledger client benchmarks, `scripts/bench-ledger`).

pub mod autorecovery;
pub mod bookie_client;
pub mod client;
pub use cms_bookie_format::entry;
pub mod fair;
pub mod fs;
pub mod journal;
pub mod metadata;
pub mod proto;
pub mod server;
pub mod storage;
