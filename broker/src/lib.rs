//! `cms-broker`: managed ledgers, cursors, subscriptions and dispatch, tenancy
//! and quotas, the Pulsar protocol service, the admin REST API, metrics,
//! ownership and standalone mode.
//!
//! Nothing of this is built yet: the binary says so and exits non-zero. The
//! foundation it will stand on (configuration, logging, the metadata store) is
//! in `cms-common` and `cms-bookie`.

pub mod managed_ledger;
