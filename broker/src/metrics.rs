//! The broker's Prometheus metrics (served on `/metrics`): connections,
//! producers, consumers, messages and bytes in and out, redeliveries, publish latency,
//! topics loaded, connections closed for bad input, publish throttling by
//! tenant / namespace quotas, and the runtime's lag (how late a 10 ms timer
//! fires: a task that holds a runtime thread delays every other one,
//! socket reads included, and no per-request histogram shows it).
//!
//! Promise: every metric is registered once in the process registry at
//! start; updating one never blocks or allocates per call. Per-topic series
//! (labels tenant / namespace / topic) are in [`crate::topic_metrics`];
//! admin requests are counted by [`crate::admin`].

use std::time::Duration;

use prometheus::{Counter, Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry};

/// Every broker metric.
#[derive(Debug, Clone)]
pub struct BrokerMetrics {
    /// Open client connections.
    pub connections: IntGauge,
    /// Payload bytes held by the entry cache (set when `/metrics` is read).
    pub entry_cache_bytes: IntGauge,
    /// Connections accepted since start.
    pub connections_opened: IntCounter,
    /// Connections refused (limits) since start.
    pub connections_refused: IntCounter,
    /// Connections closed because of bad input (decode error, protocol violation).
    pub connections_bad_input: IntCounter,
    /// Producers and consumers refused by a quota or a count policy.
    pub quota_refusals: IntCounter,
    /// Times a connection stopped reading because of a publish-rate quota or
    /// a backlog hold (counted when a pause starts, not per recheck).
    pub publish_throttles: IntCounter,
    /// Seconds connections spent paused by those quotas, summed over
    /// connections.
    pub publish_throttled_seconds: Counter,
    /// Connected producers.
    pub producers: IntGauge,
    /// Connected consumers.
    pub consumers: IntGauge,
    /// Messages received from producers (batch messages counted one by one).
    pub messages_in: IntCounter,
    /// Entry bytes received from producers.
    pub bytes_in: IntCounter,
    /// Messages dispatched to consumers.
    pub messages_out: IntCounter,
    /// Entry bytes dispatched to consumers.
    pub bytes_out: IntCounter,
    /// Messages dispatched again after a negative acknowledgement, an ack
    /// timeout or a consumer's departure (part of `messages_out`).
    pub messages_redelivered: IntCounter,
    /// From SEND received to SEND_RECEIPT queued, in seconds.
    pub publish_latency: Histogram,
    /// Topics loaded (managed ledger open, or non-persistent in use).
    pub topics_loaded: IntGauge,
    /// Non-persistent messages dropped (no consumer, no permits or a full
    /// consumer queue), counted once per subscription.
    pub nonpersistent_dropped: IntCounter,
    /// How late the runtime lag probe's timer fired, in seconds
    /// ([`run_lag_probe`]).
    pub runtime_lag: Histogram,
}

pub use cms_bookie::server::metrics::run_lag_probe;

fn reg<T: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    c: T,
) -> Result<T, prometheus::Error> {
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

impl BrokerMetrics {
    /// Creates and registers every metric in `r`.
    pub fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let gauge = |name: &str, help: &str| IntGauge::with_opts(Opts::new(name, help));
        let counter = |name: &str, help: &str| IntCounter::with_opts(Opts::new(name, help));
        Ok(Self {
            connections: reg(
                r,
                gauge("cms_broker_connections", "Open client connections")?,
            )?,
            entry_cache_bytes: reg(
                r,
                gauge(
                    "cms_broker_entry_cache_bytes",
                    "Payload bytes held by the managed-ledger entry cache",
                )?,
            )?,
            connections_opened: reg(
                r,
                counter(
                    "cms_broker_connections_opened_total",
                    "Client connections accepted",
                )?,
            )?,
            connections_refused: reg(
                r,
                counter(
                    "cms_broker_connections_refused_total",
                    "Client connections refused by a connection limit",
                )?,
            )?,
            connections_bad_input: reg(
                r,
                counter(
                    "cms_broker_connections_bad_input_total",
                    "Connections closed because of malformed input or a protocol violation",
                )?,
            )?,
            quota_refusals: reg(
                r,
                counter(
                    "cms_broker_quota_refusals_total",
                    "Producers and consumers refused by a tenant / namespace quota or count policy",
                )?,
            )?,
            publish_throttles: reg(
                r,
                counter(
                    "cms_broker_publish_throttles_total",
                    "Times a connection's reads were paused by a publish-rate quota or a backlog \
                     hold",
                )?,
            )?,
            publish_throttled_seconds: reg(
                r,
                Counter::with_opts(Opts::new(
                    "cms_broker_publish_throttled_seconds_total",
                    "Seconds connections spent paused by a publish-rate quota or a backlog hold, \
                     summed over connections",
                ))?,
            )?,
            producers: reg(r, gauge("cms_broker_producers", "Connected producers")?)?,
            consumers: reg(r, gauge("cms_broker_consumers", "Connected consumers")?)?,
            messages_in: reg(
                r,
                counter(
                    "cms_broker_messages_in_total",
                    "Messages published (each message of a batch counted)",
                )?,
            )?,
            bytes_in: reg(
                r,
                counter("cms_broker_bytes_in_total", "Entry bytes published")?,
            )?,
            messages_out: reg(
                r,
                counter(
                    "cms_broker_messages_out_total",
                    "Messages dispatched to consumers",
                )?,
            )?,
            bytes_out: reg(
                r,
                counter("cms_broker_bytes_out_total", "Entry bytes dispatched")?,
            )?,
            messages_redelivered: reg(
                r,
                counter(
                    "cms_broker_messages_redelivered_total",
                    "Messages dispatched again (redelivery count above 0); included in \
                     messages_out_total",
                )?,
            )?,
            publish_latency: reg(
                r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "cms_broker_publish_latency_seconds",
                        "From SEND received to SEND_RECEIPT sent (durable append)",
                    )
                    .buckets(vec![
                        0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                    ]),
                )?,
            )?,
            topics_loaded: reg(
                r,
                gauge("cms_broker_topics_loaded", "Topics loaded on this broker")?,
            )?,
            nonpersistent_dropped: reg(
                r,
                counter(
                    "cms_nonpersistent_messages_dropped_total",
                    "Non-persistent messages dropped on a subscription (no consumer, no permits \
                     or a full consumer queue)",
                )?,
            )?,
            runtime_lag: reg(
                r,
                cms_bookie::server::metrics::runtime_lag_histogram(
                    "cms_broker_runtime_lag_seconds",
                    "How late a 10 ms timer task was polled on the broker's runtime \
                     (every runtime thread busy, or no CPU for the process)",
                )?,
            )?,
        })
    }
}

impl BrokerMetrics {
    /// Records one throttle decision of a connection: it was `was_paused`
    /// and now pauses for `pause` (None: reads again). A pause that starts
    /// counts once; every pause's length adds to the seconds.
    pub fn record_throttle(&self, was_paused: bool, pause: Option<Duration>) {
        if let Some(p) = pause {
            if !was_paused {
                self.publish_throttles.inc();
            }
            self.publish_throttled_seconds.inc_by(p.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, TextEncoder};

    #[test]
    fn metrics_render() {
        let r = Registry::new();
        let m = BrokerMetrics::new(&r).unwrap();
        m.connections.inc();
        m.publish_latency.observe(0.003);
        let mut buf = Vec::new();
        TextEncoder::new().encode(&r.gather(), &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(text.contains("cms_broker_connections 1"), "{text}");
        assert!(text.contains("cms_broker_publish_latency_seconds_bucket"));
        assert!(
            text.contains("cms_broker_publish_throttles_total 0"),
            "{text}"
        );
        // Registering twice in one registry is refused, not silently doubled.
        assert!(BrokerMetrics::new(&r).is_err());
    }

    #[test]
    fn a_throttle_counts_once_per_pause_and_sums_its_length() {
        let r = Registry::new();
        let m = BrokerMetrics::new(&r).unwrap();
        m.record_throttle(false, None);
        assert_eq!(m.publish_throttles.get(), 0);
        m.record_throttle(false, Some(Duration::from_millis(100)));
        m.record_throttle(true, Some(Duration::from_millis(50)));
        assert_eq!(m.publish_throttles.get(), 1);
        m.record_throttle(true, None);
        m.record_throttle(false, Some(Duration::from_millis(10)));
        assert_eq!(m.publish_throttles.get(), 2);
        let secs = m.publish_throttled_seconds.get();
        assert!((secs - 0.16).abs() < 1e-9, "{secs}");
    }
}
