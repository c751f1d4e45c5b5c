//! Fair admission of reads by an opaque key: [`FairReads`] is the async face
//! of the deficit-round-robin [`sched::Scheduler`]. The bookie uses it for
//! every storage read (keyed by the request's `fairness_key`, which it does
//! not interpret); the broker uses another instance for its dispatch reads
//! (keyed by tenant).
//!
//! Promises:
//! - [`FairReads::admit`] either returns a [`ReadPermit`] once the scheduler
//!   grants the read, or refuses at once with [`ReadRefused`] when the key's
//!   queue is full (bounded memory: nothing waits beyond the per-key bounds);
//! - a permit is released when dropped, and the bytes the read actually
//!   moved ([`ReadPermit::set_bytes`]) correct the key's charge; a caller
//!   that gives up while queued (its future dropped) costs nothing: the grant
//!   that finds it gone is returned at once;
//! - the metrics ([`FairMetrics`]) are per scheduler, never per key.

pub mod sched;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry};
use tokio::sync::oneshot;

pub use sched::{Grant, OVERFLOW_KEY, SchedConfig, SchedStats, Scheduler};

/// Fairness key of autorecovery's re-replication reads (low weight by
/// default). Keys the broker sends are tenant names, which cannot contain `@`.
pub const AUTORECOVERY_KEY: &str = "@autorecovery";
/// Fairness key of the auditor's sampled integrity reads (low weight by default).
pub const AUDIT_KEY: &str = "@autorecovery-audit";
/// Fairness key of ledger recovery's reads (fence, read forward): normal
/// weight, a topic waits on them when it moves.
pub const RECOVERY_KEY: &str = "@recovery";

/// A read refused because its key's queue is full.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "read queue of this fairness key is full ({queued_requests} requests, {queued_bytes} bytes queued)"
)]
pub struct ReadRefused {
    /// Requests queued for the key.
    pub queued_requests: usize,
    /// Estimated bytes queued for the key.
    pub queued_bytes: u64,
}

/// Metrics of one scheduler (no per-key labels).
#[derive(Debug, Clone)]
pub struct FairMetrics {
    /// Estimated bytes queued.
    pub queued_bytes: IntGauge,
    /// Requests queued.
    pub queued_requests: IntGauge,
    /// Reads granted and running.
    pub in_flight: IntGauge,
    /// Keys with queued requests.
    pub active_keys: IntGauge,
    /// Reads that had to wait in a queue.
    pub waits: IntCounter,
    /// Reads refused (queue full).
    pub refused: IntCounter,
    /// Time from admission request to grant, seconds.
    pub wait_seconds: Histogram,
}

impl FairMetrics {
    /// Metrics named `<prefix>_queued_bytes` etc., not registered.
    pub fn unregistered(prefix: &str) -> Self {
        let g = |n: &str, h: &str| {
            IntGauge::with_opts(Opts::new(format!("{prefix}_{n}"), h)).expect("valid gauge")
        };
        let c = |n: &str, h: &str| {
            IntCounter::with_opts(Opts::new(format!("{prefix}_{n}"), h)).expect("valid counter")
        };
        FairMetrics {
            queued_bytes: g(
                "queued_bytes",
                "Estimated bytes of reads queued for fair admission.",
            ),
            queued_requests: g("queued_requests", "Reads queued for fair admission."),
            in_flight: g("in_flight", "Reads admitted and running."),
            active_keys: g("active_keys", "Fairness keys with queued reads."),
            waits: c("waits_total", "Reads that waited in a fairness queue."),
            refused: c(
                "refused_total",
                "Reads refused because their key's queue was full.",
            ),
            wait_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    format!("{prefix}_wait_seconds"),
                    "Time a read waited for fair admission, seconds.",
                )
                .buckets(crate::server::metrics::latency_buckets()),
            )
            .expect("valid histogram"),
        }
    }

    /// Metrics named after `prefix`, registered in `registry`.
    pub fn new(registry: &Registry, prefix: &str) -> Result<Self, prometheus::Error> {
        let m = Self::unregistered(prefix);
        registry.register(Box::new(m.queued_bytes.clone()))?;
        registry.register(Box::new(m.queued_requests.clone()))?;
        registry.register(Box::new(m.in_flight.clone()))?;
        registry.register(Box::new(m.active_keys.clone()))?;
        registry.register(Box::new(m.waits.clone()))?;
        registry.register(Box::new(m.refused.clone()))?;
        registry.register(Box::new(m.wait_seconds.clone()))?;
        Ok(m)
    }
}

type Waker = oneshot::Sender<GrantInfo>;

#[derive(Debug)]
struct GrantInfo {
    key: String,
    cost: u64,
    entries: u32,
}

/// Fair admission of reads (see the module doc). Share it in an [`Arc`].
#[derive(Debug)]
pub struct FairReads {
    sched: Mutex<Scheduler<Waker>>,
    metrics: FairMetrics,
}

/// A granted read; dropping it releases the grant.
#[derive(Debug)]
pub struct ReadPermit {
    fair: Arc<FairReads>,
    key: String,
    cost: u64,
    entries: u32,
    bytes: Option<u64>,
}

impl ReadPermit {
    /// Records the bytes the read moved (charged instead of the estimate).
    pub fn set_bytes(&mut self, bytes: u64) {
        self.bytes = Some(bytes);
    }

    /// The key the read was charged to.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for ReadPermit {
    fn drop(&mut self) {
        let mut s = self.fair.lock();
        // A read that did not report its bytes is charged its estimate.
        let actual = self.bytes.or(Some(self.cost));
        s.complete(&self.key, self.cost, self.entries, actual);
        self.fair.pump(&mut s);
    }
}

impl FairReads {
    /// A scheduler with `cfg`, counting into `metrics`.
    pub fn new(cfg: SchedConfig, metrics: FairMetrics) -> Self {
        FairReads {
            sched: Mutex::new(Scheduler::new(cfg)),
            metrics,
        }
    }

    /// The metrics.
    pub fn metrics(&self) -> &FairMetrics {
        &self.metrics
    }

    /// Current figures.
    pub fn stats(&self) -> SchedStats {
        self.lock().stats()
    }

    fn lock(&self) -> MutexGuard<'_, Scheduler<Waker>> {
        self.sched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Grants what may run now, then updates the gauges.
    fn pump(&self, s: &mut Scheduler<Waker>) {
        while let Some(g) = s.next_grant() {
            let Grant {
                key,
                cost,
                entries,
                item,
            } = g;
            if let Err(info) = item.send(GrantInfo { key, cost, entries }) {
                // The reader gave up while queued: nothing was read.
                s.complete(&info.key, info.cost, info.entries, None);
            }
        }
        let st = s.stats();
        self.metrics
            .queued_bytes
            .set(i64::try_from(st.queued_bytes).unwrap_or(i64::MAX));
        self.metrics
            .queued_requests
            .set(i64::try_from(st.queued_requests).unwrap_or(i64::MAX));
        self.metrics
            .in_flight
            .set(i64::try_from(st.in_flight).unwrap_or(i64::MAX));
        self.metrics
            .active_keys
            .set(i64::try_from(st.active_keys).unwrap_or(i64::MAX));
    }

    /// Waits for the scheduler to grant a read of up to `entries` entries
    /// and `bytes_max` bytes (0 = unbounded) for `key`; refused at once when
    /// the key's queue is full.
    pub async fn admit(
        self: &Arc<Self>,
        key: &str,
        entries: u32,
        bytes_max: u64,
    ) -> Result<ReadPermit, ReadRefused> {
        let started = Instant::now();
        let (tx, mut rx) = oneshot::channel();
        {
            let mut s = self.lock();
            if let Err(r) = s.enqueue(key, entries, bytes_max, tx) {
                self.metrics.refused.inc();
                return Err(ReadRefused {
                    queued_requests: r.queued_requests,
                    queued_bytes: r.queued_bytes,
                });
            }
            self.pump(&mut s);
        }
        let info = match rx.try_recv() {
            Ok(info) => info,
            Err(_) => {
                self.metrics.waits.inc();
                // The sender lives in the scheduler until granted; it is
                // dropped only with the scheduler itself.
                rx.await.map_err(|_| ReadRefused {
                    queued_requests: 0,
                    queued_bytes: 0,
                })?
            }
        };
        self.metrics
            .wait_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(ReadPermit {
            fair: self.clone(),
            key: info.key,
            cost: info.cost,
            entries: info.entries,
            bytes: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fair(cfg: SchedConfig) -> Arc<FairReads> {
        Arc::new(FairReads::new(cfg, FairMetrics::unregistered("test")))
    }

    #[tokio::test]
    async fn one_key_cannot_take_every_read_slot() {
        let f = fair(SchedConfig {
            in_flight_max: 4,
            key_in_flight_max: 2,
            ..SchedConfig::default()
        });
        let a1 = f.admit("a", 1, 0).await.unwrap();
        let a2 = f.admit("a", 1, 0).await.unwrap();
        // A third read of "a" waits although global slots are free...
        let f2 = f.clone();
        let third = tokio::spawn(async move { f2.admit("a", 1, 0).await.map(|_| ()) });
        // ... (it is queued: the condition, not a sleep) ...
        while f.stats().queued_requests == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!third.is_finished());
        // ...while another key is admitted at once.
        let b = f.admit("b", 1, 0).await.unwrap();
        assert_eq!(f.metrics().waits.get(), 1);
        drop((a1, b));
        tokio::time::timeout(Duration::from_secs(10), third)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        drop(a2);
        assert_eq!(f.stats().in_flight, 0);
    }

    #[tokio::test]
    async fn a_full_key_queue_is_refused_and_a_dropped_waiter_costs_nothing() {
        let f = fair(SchedConfig {
            in_flight_max: 1,
            key_queue_requests_max: 1,
            ..SchedConfig::default()
        });
        let held = f.admit("a", 1, 0).await.unwrap();
        // One queued waiter for "a", then the queue is full.
        let f2 = f.clone();
        let waiter = tokio::spawn(async move { f2.admit("a", 1, 0).await.map(|_| ()) });
        while f.stats().queued_requests == 0 {
            tokio::task::yield_now().await;
        }
        let e = f.admit("a", 1, 0).await.unwrap_err();
        assert_eq!(e.queued_requests, 1);
        assert_eq!(f.metrics().refused.get(), 1);
        // The waiter gives up; releasing the slot skips it.
        waiter.abort();
        let _ = waiter.await;
        drop(held);
        assert_eq!(f.stats().in_flight, 0);
        assert_eq!(f.stats().queued_requests, 0);
        f.admit("a", 1, 0).await.unwrap();
    }

    #[tokio::test]
    async fn key_tracking_is_bounded() {
        let f = fair(SchedConfig {
            in_flight_max: 8,
            keys_max: 3,
            ..SchedConfig::default()
        });
        let mut held = Vec::new();
        for k in ["a", "b", "c", "d", "e"] {
            held.push(f.admit(k, 1, 0).await.unwrap());
        }
        assert!(f.stats().keys <= 4);
        assert!(held.iter().any(|p| p.key() == OVERFLOW_KEY));
    }
}
