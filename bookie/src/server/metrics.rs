//! Prometheus metrics of the bookie server (the journal and ledger storage
//! register their own in the same registry): add latency and outcomes, reads,
//! bytes, mode, cached ledgers, disk use.

use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::proto::bookie::StatusCode;

/// Latency buckets from 50 µs to 10 s, in seconds.
pub fn latency_buckets() -> Vec<f64> {
    vec![
        0.000_05, 0.000_1, 0.000_2, 0.000_3, 0.000_5, 0.000_75, 0.001, 0.002, 0.005, 0.01, 0.025,
        0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
    ]
}

/// The server's metrics.
#[derive(Debug, Clone)]
pub struct ServerMetrics {
    /// Add latency (request to durable answer), seconds, successful adds.
    pub add_seconds: Histogram,
    /// Adds answered, by status.
    pub adds: IntCounterVec,
    /// Entry bytes added.
    pub add_bytes: IntCounter,
    /// Reads answered, by status.
    pub reads: IntCounterVec,
    /// Entry bytes read.
    pub read_bytes: IntCounter,
    /// 0 writable, 1 read-only (disk), 2 read-only (journal failed), 3 draining.
    pub mode: IntGauge,
    /// Ledgers with cached state.
    pub ledgers: IntGauge,
    /// Bytes in use on the ledger directory's file system.
    pub disk_used_bytes: IntGauge,
    /// Capacity of the ledger directory's file system.
    pub disk_total_bytes: IntGauge,
    /// Adds in flight over all connections.
    pub adds_in_flight: IntGauge,
}

impl ServerMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self::unregistered();
        registry.register(Box::new(m.add_seconds.clone()))?;
        registry.register(Box::new(m.adds.clone()))?;
        registry.register(Box::new(m.add_bytes.clone()))?;
        registry.register(Box::new(m.reads.clone()))?;
        registry.register(Box::new(m.read_bytes.clone()))?;
        registry.register(Box::new(m.mode.clone()))?;
        registry.register(Box::new(m.ledgers.clone()))?;
        registry.register(Box::new(m.disk_used_bytes.clone()))?;
        registry.register(Box::new(m.disk_total_bytes.clone()))?;
        registry.register(Box::new(m.adds_in_flight.clone()))?;
        Ok(m)
    }

    /// Metrics registered nowhere (tests).
    pub fn unregistered() -> Self {
        let hist = |name: &str, help: &str| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(latency_buckets()))
                .unwrap_or_else(|e| unreachable_metric(name, &e))
        };
        let counter = |name: &str, help: &str| {
            IntCounter::new(name, help).unwrap_or_else(|e| unreachable_metric(name, &e))
        };
        let gauge = |name: &str, help: &str| {
            IntGauge::new(name, help).unwrap_or_else(|e| unreachable_metric(name, &e))
        };
        let by_status = |name: &str, help: &str| {
            IntCounterVec::new(Opts::new(name, help), &["status"])
                .unwrap_or_else(|e| unreachable_metric(name, &e))
        };
        ServerMetrics {
            add_seconds: hist(
                "cms_bookie_add_seconds",
                "Add latency until the durable answer, successful adds, seconds",
            ),
            adds: by_status("cms_bookie_adds_total", "Adds answered, by status"),
            add_bytes: counter("cms_bookie_add_bytes_total", "Entry bytes added"),
            reads: by_status("cms_bookie_reads_total", "Entry reads answered, by status"),
            read_bytes: counter("cms_bookie_read_bytes_total", "Entry bytes read"),
            mode: gauge(
                "cms_bookie_mode",
                "0 writable, 1 read-only (disk), 2 read-only (journal failed), 3 draining",
            ),
            ledgers: gauge("cms_bookie_cached_ledgers", "Ledgers with cached state"),
            disk_used_bytes: gauge(
                "cms_bookie_disk_used_bytes",
                "Bytes in use on the ledger directory's file system",
            ),
            disk_total_bytes: gauge(
                "cms_bookie_disk_total_bytes",
                "Capacity of the ledger directory's file system",
            ),
            adds_in_flight: gauge("cms_bookie_adds_in_flight", "Adds in flight"),
        }
    }

    /// Records one add's outcome.
    pub fn observe_add(&self, status: StatusCode, took: Duration) {
        self.adds.with_label_values(&[status.as_str_name()]).inc();
        if status == StatusCode::Ok {
            self.add_seconds.observe(took.as_secs_f64());
        }
    }

    /// Records one read's outcome.
    pub fn observe_read(&self, status: StatusCode, bytes: usize) {
        self.reads.with_label_values(&[status.as_str_name()]).inc();
        self.read_bytes.inc_by(bytes as u64);
    }
}

/// Metric definitions are constants; a failure is a programming error caught
/// by every test that builds the metrics.
#[allow(clippy::panic, reason = "constant metric definitions")]
fn unreachable_metric(name: &str, e: &prometheus::Error) -> ! {
    panic!("metric {name} is malformed: {e}")
}
