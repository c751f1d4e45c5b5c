//! Managed-ledger metrics (issue 6 item 5): counters, gauges and an append
//! latency histogram as plain atomics, shared by every managed ledger of a
//! broker (pass one [`MlMetrics`] in each `ManagedLedgerConfig`); the broker
//! reads them with [`MlMetrics::snapshot`] and exports them (Prometheus or
//! admin stats).
//!
//! Promises: updating is lock-free and allocation-free; every counter only
//! grows (wrapping at `u64::MAX`); a snapshot reads each value once (values
//! of one snapshot may be a few updates apart); the histogram buckets are
//! cumulative upper bounds in microseconds, the last one `+Inf`.
//!
//! What is counted:
//! - `appends`, `append_bytes`: appends completed (acked on an ack quorum);
//!   `append_failures`: appends completed with an error (fenced, closed,
//!   ledger error); `append_latency`: submit → completion of each success;
//! - `rollovers`: data ledgers replaced by a new one (any reason);
//! - `ledger_write_failures`: data ledgers whose writer failed (not fenced)
//!   and that were recovered and closed; `appends_resent`: pending appends
//!   sent again on a new ledger after such a failure;
//! - `cursor_persists`, `cursor_persist_bytes`: cursor snapshots durably
//!   written to cursor ledgers and their encoded bytes;
//!   `cursor_persist_failures`: snapshot writes that failed;
//! - `acks_not_persisted`: individually acked entries left out of a written
//!   snapshot by the range bound (they are redelivered after a crash, never
//!   lost), summed over snapshots; `snapshots_with_dropped_ranges`: snapshots
//!   that left any out;
//! - `cache_hits`, `cache_misses`: entries read from the entry cache vs from
//!   bookies; `bookie_reads`: read requests sent for the misses (the cache size is [`super::io::EntryCache::size_bytes`] and
//!   [`super::io::EntryCache::len`], gauges read from the cache itself);
//! - `ledgers_trimmed`, `ttl_expiries` (cursor mark-deletes moved by TTL).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (µs) of the append latency buckets; one more bucket is +Inf.
pub const LATENCY_BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// A fixed-bucket latency histogram of atomics.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Non-cumulative counts per bucket (the last is +Inf).
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl LatencyHistogram {
    /// Records one sample of `us` microseconds.
    pub fn record_us(&self, us: u64) {
        let i = LATENCY_BUCKETS_US.partition_point(|b| *b < us);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Cumulative `(upper bound µs, count)` pairs; `None` = +Inf.
    pub fn cumulative(&self) -> Vec<(Option<u64>, u64)> {
        let mut total = 0;
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                total += b.load(Ordering::Relaxed);
                (LATENCY_BUCKETS_US.get(i).copied(), total)
            })
            .collect()
    }

    /// Sum of all samples, µs.
    pub fn sum_us(&self) -> u64 {
        self.sum_us.load(Ordering::Relaxed)
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// The counters (see the module doc for what each counts).
#[derive(Debug, Default)]
#[allow(missing_docs, reason = "each field is documented in the module doc")]
pub struct MlMetricsInner {
    pub appends: AtomicU64,
    pub append_bytes: AtomicU64,
    pub append_failures: AtomicU64,
    pub append_latency: LatencyHistogram,
    pub rollovers: AtomicU64,
    pub ledger_write_failures: AtomicU64,
    pub appends_resent: AtomicU64,
    pub cursor_persists: AtomicU64,
    pub cursor_persist_bytes: AtomicU64,
    pub cursor_persist_failures: AtomicU64,
    pub acks_not_persisted: AtomicU64,
    pub snapshots_with_dropped_ranges: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub bookie_reads: AtomicU64,
    pub ledgers_trimmed: AtomicU64,
    pub ttl_expiries: AtomicU64,
}

/// A handle on one set of metrics (cheap to clone; clones share it). Two
/// handles are equal when they share the same set.
#[derive(Debug, Clone, Default)]
pub struct MlMetrics(Arc<MlMetricsInner>);

impl PartialEq for MlMetrics {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for MlMetrics {}

impl std::ops::Deref for MlMetrics {
    type Target = MlMetricsInner;
    fn deref(&self) -> &MlMetricsInner {
        &self.0
    }
}

/// Adds `n` to counter `c`.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Plain values of every counter at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[allow(missing_docs, reason = "each field is documented in the module doc")]
pub struct MlMetricsSnapshot {
    pub appends: u64,
    pub append_bytes: u64,
    pub append_failures: u64,
    /// Cumulative `(upper bound µs, count)`; `None` = +Inf.
    pub append_latency_buckets: Vec<(Option<u64>, u64)>,
    pub append_latency_sum_us: u64,
    pub rollovers: u64,
    pub ledger_write_failures: u64,
    pub appends_resent: u64,
    pub cursor_persists: u64,
    pub cursor_persist_bytes: u64,
    pub cursor_persist_failures: u64,
    pub acks_not_persisted: u64,
    pub snapshots_with_dropped_ranges: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub bookie_reads: u64,
    pub ledgers_trimmed: u64,
    pub ttl_expiries: u64,
}

impl MlMetrics {
    /// A new, zeroed set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads every value.
    pub fn snapshot(&self) -> MlMetricsSnapshot {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MlMetricsSnapshot {
            appends: r(&self.appends),
            append_bytes: r(&self.append_bytes),
            append_failures: r(&self.append_failures),
            append_latency_buckets: self.append_latency.cumulative(),
            append_latency_sum_us: self.append_latency.sum_us(),
            rollovers: r(&self.rollovers),
            ledger_write_failures: r(&self.ledger_write_failures),
            appends_resent: r(&self.appends_resent),
            cursor_persists: r(&self.cursor_persists),
            cursor_persist_bytes: r(&self.cursor_persist_bytes),
            cursor_persist_failures: r(&self.cursor_persist_failures),
            acks_not_persisted: r(&self.acks_not_persisted),
            snapshots_with_dropped_ranges: r(&self.snapshots_with_dropped_ranges),
            cache_hits: r(&self.cache_hits),
            cache_misses: r(&self.cache_misses),
            bookie_reads: r(&self.bookie_reads),
            ledgers_trimmed: r(&self.ledgers_trimmed),
            ttl_expiries: r(&self.ttl_expiries),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_samples_land_in_cumulative_buckets() {
        let h = LatencyHistogram::default();
        // (sample µs) → bucket upper bound it counts under first.
        for us in [0, 100, 101, 999, 1_000, 2_000_000] {
            h.record_us(us);
        }
        let c = h.cumulative();
        assert_eq!(c.len(), LATENCY_BUCKETS_US.len() + 1);
        assert_eq!(c[0], (Some(100), 2), "0 and 100 are <= 100");
        assert_eq!(c[1], (Some(250), 3));
        assert_eq!(c[3], (Some(1_000), 5));
        assert_eq!(c[11], (Some(1_000_000), 5));
        assert_eq!(c[12], (None, 6));
        assert_eq!(h.count(), 6);
        assert_eq!(h.sum_us(), 100 + 101 + 999 + 1_000 + 2_000_000);
    }

    #[test]
    fn clones_share_and_compare_equal_fresh_sets_do_not() {
        let a = MlMetrics::new();
        let b = a.clone();
        add(&b.appends, 3);
        assert_eq!(a.snapshot().appends, 3);
        assert_eq!(a, b);
        assert_ne!(a, MlMetrics::new());
    }
}
