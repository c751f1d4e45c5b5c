//! `cms-broker`: managed ledgers, cursors, subscriptions and dispatch, tenancy
//! and quotas, the Pulsar protocol service, the admin REST API, metrics,
//! ownership and standalone mode.
//!
//! Built so far: managed ledgers and cursors ([`managed_ledger`]): the pure
//! core (positions, range sets, the cursor state machine, the ledger list,
//! rollover, trimming and publish-time search, with their metadata records) and
//! its async I/O layer over the ledger client ([`managed_ledger::io`]);
//! dispatch as a pure state machine ([`dispatch`]) and subscriptions over
//! managed cursors ([`subscription`]). The Pulsar protocol and the rest are
//! not built yet: the binary says so and exits non-zero.

pub mod dispatch;
pub mod managed_ledger;
pub mod subscription;
