//! `cms-bookie`: the BookKeeper core of CMS.
//!
//! Today it holds the metadata-store layer ([`metadata`]): one async API over
//! ZooKeeper and an embedded single-file store, with the `/cms` layout and
//! `init-cluster` ([`metadata::layout`]). The bookie wire protocol, storage
//! engine, bookie server and ledger client come next (see `ARCHITECTURE.md`).
//! This crate knows nothing of topics or Pulsar.

pub mod bookie_client;
pub mod client;
pub mod entry;
pub mod fs;
pub mod journal;
pub mod metadata;
pub mod proto;
pub mod server;
pub mod storage;
