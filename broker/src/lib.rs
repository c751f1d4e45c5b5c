//! `cms-broker`: managed ledgers, cursors, subscriptions and dispatch, tenancy
//! and quotas, the Pulsar protocol service, the admin REST API, metrics,
//! ownership and standalone mode.
//!
//! Map:
//! - [`managed_ledger`] — topics as ledger lists and cursors (pure core and
//!   its async I/O layer over the ledger client);
//! - [`config`] — `cms-broker serve` / `standalone` options;
//! - [`topic_name`], [`tenancy`] — names, tenants, namespaces, `init-cluster`;
//! - [`partitioned`] — partitioned-topic metadata (partition counts);
//! - [`policy_refresh`] — namespace policy changes applied to loaded topics;
//! - [`topic_discovery`] — PARTITIONED_METADATA (with partitioned
//!   auto-creation), GET_TOPICS_OF_NAMESPACE, which names clients may use;
//! - [`dispatch`], [`subscription`] — dispatch state machines (pure) and
//!   subscriptions over a managed cursor;
//! - [`producers`] — access modes and producer bounds of a topic (pure);
//! - [`topics`] — loaded topics (one managed ledger each, loads coalesced);
//! - [`service`], [`connection`], [`consumers`], [`subscriptions`] — the
//!   Pulsar protocol port: accept loop with connection limits, one task per
//!   connection, consumer commands on the topic's subscriptions;
//! - [`http`], [`metrics`], [`topic_metrics`] — `/health`, `/ready`,
//!   `/metrics` (per-topic series with tenant / namespace / topic labels),
//!   HTTP lookup;
//! - [`ownership`] — namespace bundles, ownership nodes, lookup decisions,
//!   load reports and placement;
//! - [`admin`] — the admin REST API (`/admin/v2`);
//! - [`quota`], [`quota_io`] — tenant / namespace quotas: the pure model and
//!   allocation, and their enforcement (rates, counts, backlog policies,
//!   usage shared across brokers);
//! - [`auth`] — token authentication, authorization, `cms-broker tokens`;
//! - [`tls`] — TLS for the `pulsar+ssl` and `https` ports, reloaded on change;
//! - [`standalone`] — embedded store + in-process bookie + broker.

pub mod admin;
pub mod auth;
pub mod config;
pub mod connection;
pub mod consumers;
pub mod dedup;
pub mod dedup_io;
pub mod dispatch;
pub mod http;
pub mod managed_ledger;
pub mod metrics;
pub mod non_persistent;
pub mod ownership;
pub mod partitioned;
pub mod policy_refresh;
pub mod producers;
pub mod quota;
pub mod quota_io;
pub mod schema;
pub mod service;
pub mod standalone;
pub mod subscription;
pub mod subscriptions;
pub mod tenancy;
pub mod tls;
pub mod topic_counters;
pub mod topic_discovery;
pub mod topic_metrics;
pub mod topic_name;
pub mod topics;
