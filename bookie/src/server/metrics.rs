//! Prometheus metrics of the bookie server (the journal and ledger storage
//! register their own in the same registry): add latency and outcomes, reads,
//! bytes, mode, cached ledgers, disk use, and the runtime's lag
//! ([`run_lag_probe`], which the broker runs too).

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
    /// How late the runtime lag probe's timer fired, in seconds
    /// ([`run_lag_probe`]).
    pub runtime_lag: Histogram,
}

/// How often [`run_lag_probe`] asks to be woken.
pub const LAG_PROBE_INTERVAL: Duration = Duration::from_millis(10);

/// A histogram for [`run_lag_probe`] named `name`, with buckets from 1 ms
/// to 5 s.
pub fn runtime_lag_histogram(name: &str, help: &str) -> Result<Histogram, prometheus::Error> {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(vec![
        0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    ]))
}

/// Records, every [`LAG_PROBE_INTERVAL`], how much later than asked a
/// sleeping task was woken and polled on this runtime, until `stop` turns
/// true (or its sender is gone). The timer's own resolution is 1 ms, so
/// lags under about 1 ms are the timer's; longer ones are time when every
/// runtime thread was busy elsewhere (or the process had no CPU).
pub async fn run_lag_probe(lag: Histogram, mut stop: tokio::sync::watch::Receiver<bool>) {
    // One stop future and one timer, reset each round: a probe 100 times a
    // second should cost the runtime next to nothing.
    let stop = stop.wait_for(|v| *v);
    tokio::pin!(stop);
    let sleep = tokio::time::sleep(LAG_PROBE_INTERVAL);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            () = &mut sleep => {
                let due = sleep.deadline();
                lag.observe(due.elapsed().as_secs_f64());
                sleep.as_mut().reset(tokio::time::Instant::now() + LAG_PROBE_INTERVAL);
            }
        }
    }
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
        registry.register(Box::new(m.runtime_lag.clone()))?;
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
            runtime_lag: runtime_lag_histogram(
                "cms_bookie_runtime_lag_seconds",
                "How late a 10 ms timer task was polled on the bookie's runtime \
                 (every runtime thread busy, or no CPU for the process)",
            )
            .unwrap_or_else(|e| unreachable_metric("cms_bookie_runtime_lag_seconds", &e)),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A task that holds the only runtime thread for 60 ms shows up as one
    /// lag of at least that long; the probe stops when told to.
    #[tokio::test(flavor = "current_thread")]
    async fn the_lag_probe_sees_a_blocked_runtime_thread() {
        let lag = runtime_lag_histogram("lag_seconds", "test").unwrap();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let probe = tokio::spawn(run_lag_probe(lag.clone(), stop_rx));
        // Let the probe run a while, then block the thread past its due time.
        tokio::time::sleep(Duration::from_millis(25)).await;
        let (count0, sum0) = (lag.get_sample_count(), lag.get_sample_sum());
        std::thread::sleep(Duration::from_millis(60));
        // One thread: the probe's next sample is the one that waited for the block.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while lag.get_sample_count() == count0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the probe never recorded"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(lag.get_sample_count(), count0 + 1);
        let took = lag.get_sample_sum() - sum0;
        assert!(took >= 0.045, "lag {took} s after a 60 ms block");
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), probe)
            .await
            .expect("the probe stops when told")
            .unwrap();
    }

    #[test]
    fn server_metrics_register_once_with_the_lag_histogram() {
        let r = Registry::new();
        let m = ServerMetrics::new(&r).unwrap();
        m.runtime_lag.observe(0.003);
        assert!(
            r.gather()
                .iter()
                .any(|f| f.name() == "cms_bookie_runtime_lag_seconds")
        );
        assert!(ServerMetrics::new(&r).is_err());
    }
}
