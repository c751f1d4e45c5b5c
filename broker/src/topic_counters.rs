//! Messages and bytes in and out of one loaded topic: the counters and
//! rates of the admin topic stats (`msgInCounter`, `msgRateIn`, ...) and the
//! `cms_topic_*_total` series.
//!
//! Promises: counting is four relaxed atomic adds per publish or delivery
//! (no lock on the hot path); counts start at 0 when the topic is loaded on
//! this broker (a move or unload restarts them, as Pulsar's per-broker topic
//! stats do); a rate is the change of a counter between two samples divided
//! by the time between them, sampled at most once per
//! [`RATE_SAMPLE_MIN`] (closer calls return the previous rates), so it is
//! never computed over a zero interval.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Shortest interval a rate is computed over.
pub const RATE_SAMPLE_MIN: Duration = Duration::from_secs(1);

/// A snapshot of the four counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Messages published (each message of a batch counted).
    pub msgs_in: u64,
    /// Entry bytes published.
    pub bytes_in: u64,
    /// Messages delivered to consumers (redeliveries included).
    pub msgs_out: u64,
    /// Entry bytes delivered to consumers.
    pub bytes_out: u64,
}

/// Per-second rates of [`Counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    /// Messages in per second.
    pub msgs_in: f64,
    /// Bytes in per second.
    pub bytes_in: f64,
    /// Messages out per second.
    pub msgs_out: f64,
    /// Bytes out per second.
    pub bytes_out: f64,
}

/// The rates between two snapshots `dt` apart (pure; a counter that went
/// down counts as 0).
pub fn rates(before: Counts, after: Counts, dt: Duration) -> Rates {
    let secs = dt.as_secs_f64();
    if secs <= 0.0 {
        return Rates::default();
    }
    let r = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
    Rates {
        msgs_in: r(before.msgs_in, after.msgs_in),
        bytes_in: r(before.bytes_in, after.bytes_in),
        msgs_out: r(before.msgs_out, after.msgs_out),
        bytes_out: r(before.bytes_out, after.bytes_out),
    }
}

/// The counters of one topic.
#[derive(Debug)]
pub struct TopicCounters {
    msgs_in: AtomicU64,
    bytes_in: AtomicU64,
    msgs_out: AtomicU64,
    bytes_out: AtomicU64,
    sample: Mutex<(Instant, Counts, Rates)>,
}

impl Default for TopicCounters {
    fn default() -> Self {
        Self {
            msgs_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            msgs_out: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            sample: Mutex::new((Instant::now(), Counts::default(), Rates::default())),
        }
    }
}

impl TopicCounters {
    /// A publish of `msgs` messages in `bytes` entry bytes.
    pub fn record_in(&self, msgs: u64, bytes: u64) {
        self.msgs_in.fetch_add(msgs, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A delivery of `msgs` messages in `bytes` entry bytes.
    pub fn record_out(&self, msgs: u64, bytes: u64) {
        self.msgs_out.fetch_add(msgs, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn counts(&self) -> Counts {
        Counts {
            msgs_in: self.msgs_in.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            msgs_out: self.msgs_out.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
        }
    }

    /// The counters and the rates since the previous sample (taken at load
    /// or by an earlier call at least [`RATE_SAMPLE_MIN`] ago).
    pub fn sample(&self, now: Instant) -> (Counts, Rates) {
        let counts = self.counts();
        let mut s = self.sample.lock().unwrap_or_else(|e| e.into_inner());
        let dt = now.saturating_duration_since(s.0);
        if dt >= RATE_SAMPLE_MIN {
            let r = rates(s.1, counts, dt);
            *s = (now, counts, r);
        }
        (counts, s.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_deltas_over_the_interval() {
        let a = Counts {
            msgs_in: 100,
            bytes_in: 1000,
            msgs_out: 50,
            bytes_out: 500,
        };
        let b = Counts {
            msgs_in: 300,
            bytes_in: 5000,
            msgs_out: 40,
            bytes_out: 900,
        };
        let r = rates(a, b, Duration::from_secs(2));
        assert_eq!(
            r,
            Rates {
                msgs_in: 100.0,
                bytes_in: 2000.0,
                msgs_out: 0.0,
                bytes_out: 200.0
            }
        );
        assert_eq!(rates(a, b, Duration::ZERO), Rates::default());
    }

    #[test]
    fn samples_closer_than_the_minimum_keep_the_previous_rates() {
        let c = TopicCounters::default();
        let t0 = c.sample.lock().unwrap().0;
        c.record_in(10, 100);
        c.record_out(4, 40);
        let (counts, r) = c.sample(t0 + Duration::from_millis(500));
        assert_eq!((counts.msgs_in, counts.bytes_out), (10, 40));
        assert_eq!(r, Rates::default(), "too soon for a rate");
        let (_, r) = c.sample(t0 + Duration::from_secs(2));
        assert_eq!((r.msgs_in, r.bytes_in, r.msgs_out), (5.0, 50.0, 2.0));
        c.record_in(10, 100);
        let (_, again) = c.sample(t0 + Duration::from_millis(2500));
        assert_eq!(again, r, "within a second of the last sample");
        let (_, r) = c.sample(t0 + Duration::from_secs(4));
        assert_eq!((r.msgs_in, r.msgs_out), (5.0, 0.0));
    }
}
