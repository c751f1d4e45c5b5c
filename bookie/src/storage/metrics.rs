//! Prometheus metrics of the ledger storage (`cms_bookie_storage_*`).

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry};

/// Counters and gauges of one [`super::LedgerStorage`]. Cheap to clone handles.
#[derive(Debug, Clone)]
pub struct StorageMetrics {
    /// Reads served from the read cache.
    pub read_cache_hits: IntCounter,
    /// Reads that missed the write and read caches and went to the index.
    pub read_cache_misses: IntCounter,
    /// Bytes charged in the write cache (both halves).
    pub write_cache_bytes: IntGauge,
    /// Bytes charged in the read cache (data plus per-entry overhead).
    pub read_cache_bytes: IntGauge,
    /// Record bytes appended to entry logs (flushes and compaction).
    pub entry_log_bytes_written: IntCounter,
    /// Bytes read from entry logs (requested entries and read-ahead).
    pub entry_log_bytes_read: IntCounter,
    /// Ledgers with a stored state, as of the last flush.
    pub ledger_count: IntGauge,
    /// Duration of checkpoint flushes.
    pub flush_seconds: Histogram,
}

impl StorageMetrics {
    /// Metrics registered in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self::unregistered();
        registry.register(Box::new(m.read_cache_hits.clone()))?;
        registry.register(Box::new(m.read_cache_misses.clone()))?;
        registry.register(Box::new(m.write_cache_bytes.clone()))?;
        registry.register(Box::new(m.read_cache_bytes.clone()))?;
        registry.register(Box::new(m.entry_log_bytes_written.clone()))?;
        registry.register(Box::new(m.entry_log_bytes_read.clone()))?;
        registry.register(Box::new(m.ledger_count.clone()))?;
        registry.register(Box::new(m.flush_seconds.clone()))?;
        Ok(m)
    }

    /// Metrics registered nowhere (tests, tools).
    pub fn unregistered() -> Self {
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid counter");
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid gauge");
        let flush_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "cms_bookie_storage_flush_seconds",
                "Duration of ledger storage checkpoint flushes",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0,
            ]),
        )
        .expect("valid histogram");
        StorageMetrics {
            read_cache_hits: counter(
                "cms_bookie_storage_read_cache_hits_total",
                "Entry reads served from the read cache",
            ),
            read_cache_misses: counter(
                "cms_bookie_storage_read_cache_misses_total",
                "Entry reads that missed the write and read caches",
            ),
            write_cache_bytes: gauge(
                "cms_bookie_storage_write_cache_bytes",
                "Bytes held in the write cache",
            ),
            read_cache_bytes: gauge(
                "cms_bookie_storage_read_cache_bytes",
                "Bytes held in the read cache (data plus per-entry overhead)",
            ),
            entry_log_bytes_written: counter(
                "cms_bookie_storage_entry_log_written_bytes_total",
                "Record bytes appended to entry logs",
            ),
            entry_log_bytes_read: counter(
                "cms_bookie_storage_entry_log_read_bytes_total",
                "Bytes read from entry logs",
            ),
            ledger_count: gauge("cms_bookie_storage_ledgers", "Ledgers with a stored state"),
            flush_seconds,
        }
    }
}
