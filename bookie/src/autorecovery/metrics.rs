//! Prometheus metrics of autorecovery: how many ledgers are marked
//! under-replicated, how much the workers copied, how often they failed, and
//! whether this process is the auditor. The copy rate is the rate of
//! `cms_autorecovery_entries_copied_total` / `..._bytes_copied_total`.
//!
//! In `serve --autorecovery` they are registered in the bookie's registry
//! (its `/metrics`); `cms-bookie autorecovery` serves them on its own
//! `--http-bind` address.

use prometheus::{IntCounter, IntGauge, Opts, Registry};

/// Autorecovery's metrics; cloning shares the same series.
#[derive(Debug, Clone)]
pub struct AutorecoveryMetrics {
    /// Ledgers marked under `/underreplicated/` at the worker's last scan.
    pub underreplicated_ledgers: IntGauge,
    /// Ledgers the auditor marked (newly) under-replicated.
    pub ledgers_marked: IntCounter,
    /// Ledgers a worker finished (every lost replica restored, mark deleted).
    pub ledgers_replicated: IntCounter,
    /// Entries copied, digest-verified, by workers and the integrity check.
    pub entries_copied: IntCounter,
    /// Entry bytes copied.
    pub bytes_copied: IntCounter,
    /// Ledger attempts that failed (retried at a later scan).
    pub worker_errors: IntCounter,
    /// 1 while this process is the elected auditor.
    pub is_auditor: IntGauge,
}

impl AutorecoveryMetrics {
    /// Metrics not registered anywhere (tests, tools).
    pub fn unregistered() -> Self {
        let gauge = |n: &str, h: &str| IntGauge::with_opts(Opts::new(n, h)).expect("valid name");
        let counter =
            |n: &str, h: &str| IntCounter::with_opts(Opts::new(n, h)).expect("valid name");
        AutorecoveryMetrics {
            underreplicated_ledgers: gauge(
                "cms_autorecovery_underreplicated_ledgers",
                "Ledgers marked under-replicated at the worker's last scan",
            ),
            ledgers_marked: counter(
                "cms_autorecovery_ledgers_marked_total",
                "Ledgers the auditor marked under-replicated",
            ),
            ledgers_replicated: counter(
                "cms_autorecovery_ledgers_replicated_total",
                "Ledgers fully re-replicated by a worker",
            ),
            entries_copied: counter(
                "cms_autorecovery_entries_copied_total",
                "Entries copied (digest-verified) to a replacement or a formatted bookie",
            ),
            bytes_copied: counter(
                "cms_autorecovery_bytes_copied_total",
                "Entry bytes copied to a replacement or a formatted bookie",
            ),
            worker_errors: counter(
                "cms_autorecovery_worker_errors_total",
                "Ledger re-replication attempts that failed (retried later)",
            ),
            is_auditor: gauge(
                "cms_autorecovery_is_auditor",
                "1 while this process is the elected auditor",
            ),
        }
    }

    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self::unregistered();
        registry.register(Box::new(m.underreplicated_ledgers.clone()))?;
        registry.register(Box::new(m.ledgers_marked.clone()))?;
        registry.register(Box::new(m.ledgers_replicated.clone()))?;
        registry.register(Box::new(m.entries_copied.clone()))?;
        registry.register(Box::new(m.bytes_copied.clone()))?;
        registry.register(Box::new(m.worker_errors.clone()))?;
        registry.register(Box::new(m.is_auditor.clone()))?;
        Ok(m)
    }
}

impl Default for AutorecoveryMetrics {
    fn default() -> Self {
        Self::unregistered()
    }
}
