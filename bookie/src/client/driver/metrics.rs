//! Latency of the ledger client as its user sees it:
//! `cms_ledger_client_add_seconds` (an add from submission to durability on
//! an ack quorum, queueing behind the writer's backpressure included) and
//! `cms_ledger_client_read_seconds` (one `ReadHandle::read` call, whatever
//! its entry count), plus `cms_ledger_client_errors_total{op}`.
//!
//! Promise: measuring never changes a result; recording is two atomic
//! operations per call (no lock, no allocation); the label set is fixed.

use std::time::Instant;

use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};

/// Buckets, seconds: a journal fsync on a fast disk (~100 µs) to a stalled
/// ensemble change.
const BUCKETS: [f64; 16] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.003, 0.005, 0.007_5, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 5.0,
];

/// The ledger client's metrics; give one to [`super::LedgerClientOptions`].
#[derive(Debug, Clone)]
pub struct ClientMetrics {
    add: Histogram,
    read: Histogram,
    errors: IntCounterVec,
}

impl ClientMetrics {
    /// Creates the metric families and registers them in `registry`.
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let add = Histogram::with_opts(
            HistogramOpts::new(
                "cms_ledger_client_add_seconds",
                "Ledger adds from submission to durability on an ack quorum, seconds",
            )
            .buckets(BUCKETS.to_vec()),
        )?;
        let read = Histogram::with_opts(
            HistogramOpts::new(
                "cms_ledger_client_read_seconds",
                "Ledger reads (one call, one or more entries), seconds",
            )
            .buckets(BUCKETS.to_vec()),
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                "cms_ledger_client_errors_total",
                "Ledger adds and reads that failed, by operation",
            ),
            &["op"],
        )?;
        registry.register(Box::new(add.clone()))?;
        registry.register(Box::new(read.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        // Every series exists from the start (0 until something fails), so
        // dashboards and alerts see it before the first error.
        for op in ["add", "read"] {
            errors.with_label_values(&[op]);
        }
        Ok(Self { add, read, errors })
    }

    /// Records an add that started at `started`.
    pub(crate) fn add_done(&self, started: Instant, ok: bool) {
        if ok {
            self.add.observe(started.elapsed().as_secs_f64());
        } else {
            self.errors.with_label_values(&["add"]).inc();
        }
    }

    /// Records a read call that started at `started`.
    pub(crate) fn read_done(&self, started: Instant, ok: bool) {
        if ok {
            self.read.observe(started.elapsed().as_secs_f64());
        } else {
            self.errors.with_label_values(&["read"]).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_latency_and_errors_separately() {
        let r = Registry::new();
        let m = ClientMetrics::new(&r).unwrap();
        let t = Instant::now();
        m.add_done(t, true);
        m.add_done(t, true);
        m.add_done(t, false);
        m.read_done(t, true);
        m.read_done(t, false);
        assert_eq!(m.add.get_sample_count(), 2);
        assert_eq!(m.read.get_sample_count(), 1);
        assert_eq!(m.errors.with_label_values(&["add"]).get(), 1);
        assert_eq!(m.errors.with_label_values(&["read"]).get(), 1);
        // Registered once: a second registration of the same names fails.
        assert!(ClientMetrics::new(&r).is_err());
    }
}
