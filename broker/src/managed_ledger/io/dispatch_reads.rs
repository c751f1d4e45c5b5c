//! The broker's per-tenant dispatch read queues: every read a managed ledger
//! sends to the bookies for a cursor or dispatcher (catch-up reads that miss
//! the entry cache) is admitted by one broker-wide
//! [`cms_bookie::fair::FairReads`] keyed by the tenant (docs/isolation.md).
//!
//! Promises:
//! - a tenant has at most `key_in_flight_max` bookie reads and
//!   `key_in_flight_bytes_max` estimated bytes in flight (its budget); its
//!   further catch-up reads wait for its own budget, not for other tenants';
//! - among tenants with reads waiting, slots go by deficit round robin by
//!   bytes, so a tenant replaying a large backlog cannot delay another
//!   tenant's reads by more than a round;
//! - every queue is bounded: a read over its tenant's queue bound fails at
//!   once with [`super::MlError::ReadsBusy`] (retryable; the subscription
//!   read loop backs off), never buffered without bound;
//! - the same tenant is the `fairness_key` of every bookie read of the
//!   managed ledger, so bookies schedule by tenant too (DESIGN §2).

use std::sync::Arc;

use cms_bookie::fair::{FairMetrics, FairReads, ReadPermit, ReadRefused, SchedConfig};

/// Broker-wide fair admission of dispatch reads (cheap to clone; clones
/// share the queues). [`Default`] makes a fresh one with
/// [`DispatchReads::default_config`] and unregistered metrics.
#[derive(Clone)]
pub struct DispatchReads(Arc<FairReads>);

impl std::fmt::Debug for DispatchReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchReads")
            .field("stats", &self.0.stats())
            .finish()
    }
}

/// Two handles are equal when they share the queues.
impl PartialEq for DispatchReads {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for DispatchReads {}

impl Default for DispatchReads {
    fn default() -> Self {
        DispatchReads::new(
            Self::default_config(),
            FairMetrics::unregistered("cms_broker_dispatch_read"),
        )
    }
}

impl DispatchReads {
    /// The broker's defaults: 32 bookie reads in flight, a tenant at most 8
    /// of them and 16 MiB, queues of 10,000 reads / 256 MiB per tenant.
    pub fn default_config() -> SchedConfig {
        SchedConfig {
            in_flight_max: 32,
            key_in_flight_max: 8,
            key_in_flight_bytes_max: 16 * 1024 * 1024,
            key_queue_requests_max: 10_000,
            key_queue_bytes_max: 256 * 1024 * 1024,
            keys_max: 10_000,
            quantum_bytes: 64 * 1024,
            weight_default: 1,
            weights: Default::default(),
            entry_bytes_initial: 1024,
        }
    }

    /// Queues with `cfg`, counting into `metrics`.
    pub fn new(cfg: SchedConfig, metrics: FairMetrics) -> Self {
        DispatchReads(Arc::new(FairReads::new(cfg, metrics)))
    }

    /// Waits for `tenant`'s turn to read `entries` entries from the bookies.
    pub async fn admit(&self, tenant: &str, entries: u32) -> Result<ReadPermit, ReadRefused> {
        self.0.admit(tenant, entries, 0).await
    }

    /// Current figures (all tenants).
    pub fn stats(&self) -> cms_bookie::fair::SchedStats {
        self.0.stats()
    }
}

/// The tenant of managed ledger `name` (`tenant/namespace/topic`).
pub fn tenant_of(name: &str) -> &str {
    name.split('/').next().unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tenant_is_the_first_part() {
        assert_eq!(tenant_of("acme/ns/t"), "acme");
        assert_eq!(tenant_of("x"), "x");
    }

    #[tokio::test]
    async fn a_tenant_waits_for_its_own_budget_not_others() {
        let d = DispatchReads::new(
            SchedConfig {
                in_flight_max: 4,
                key_in_flight_max: 2,
                ..DispatchReads::default_config()
            },
            FairMetrics::unregistered("t"),
        );
        let _a1 = d.admit("a", 100).await.unwrap();
        let a2 = d.admit("a", 100).await.unwrap();
        let d2 = d.clone();
        let a3 = tokio::spawn(async move { d2.admit("a", 100).await.map(|_| ()) });
        while d.stats().queued_requests == 0 {
            tokio::task::yield_now().await;
        }
        // Tenant b is admitted although a is waiting.
        let _b = d.admit("b", 1).await.unwrap();
        assert!(!a3.is_finished());
        drop(a2);
        a3.await.unwrap().unwrap();
        assert_eq!(d, d.clone());
    }
}
