//! `cms-broker`: managed ledgers, cursors, subscriptions and dispatch, tenancy
//! and quotas, the Pulsar protocol service, the admin REST API, metrics,
//! ownership and standalone mode.
//!
//! Built so far: the pure core of managed ledgers and cursors
//! ([`managed_ledger`]: positions, range sets, the cursor state machine, the
//! ledger list, rollover, trimming and publish-time search, with their metadata
//! records) — plain state machines without I/O. The I/O layer over the ledger
//! client, the Pulsar protocol and the rest are not built yet: the binary says
//! so and exits non-zero.

pub mod managed_ledger;
