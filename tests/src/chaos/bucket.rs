//! Token bucket for the proxy's bandwidth cap; pure (time is passed in), so it is unit-tested
//! without sleeping.
//!
//! Promise: a bucket created at `t0` hands out at most `rate × (t − t0)` bytes by time `t`
//! (it starts empty), and never holds more than `capacity_bytes` of credit after idling.

use std::time::{Duration, Instant};

/// Bytes-per-second limiter; one per direction of a connection.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    rate_bytes_per_second: u64,
    capacity_bytes: f64,
    /// Smallest grant worth waking up for: about 10 ms of traffic, at least one byte.
    quantum_bytes: f64,
    tokens: f64,
    refilled_at: Instant,
}

impl TokenBucket {
    /// An empty bucket filling at `rate_bytes_per_second` (≥ 1), holding at most
    /// `capacity_bytes` (≥ 1).
    pub(crate) fn new(rate_bytes_per_second: u64, capacity_bytes: usize, now: Instant) -> Self {
        let rate = rate_bytes_per_second.max(1);
        let capacity = (capacity_bytes.max(1)) as f64;
        Self {
            rate_bytes_per_second: rate,
            capacity_bytes: capacity,
            quantum_bytes: (rate as f64 / 100.0).clamp(1.0, capacity),
            tokens: 0.0,
            refilled_at: now,
        }
    }

    /// The rate this bucket was built for.
    pub(crate) fn rate_bytes_per_second(&self) -> u64 {
        self.rate_bytes_per_second
    }

    /// Grants up to `want` bytes now (`Ok(n)`, `1 ≤ n ≤ want`), or says how long to wait before
    /// asking again (`Err(wait)`). `want` must be at least 1.
    pub(crate) fn take(&mut self, want: usize, now: Instant) -> Result<usize, Duration> {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens =
            (self.tokens + elapsed * self.rate_bytes_per_second as f64).min(self.capacity_bytes);
        self.refilled_at = now;
        let want = want.max(1);
        let need = (want as f64).min(self.quantum_bytes);
        if self.tokens >= need {
            // `tokens` ≤ capacity, a small positive number: the cast cannot overflow.
            let grant = (self.tokens.floor() as usize).min(want).max(1);
            self.tokens -= grant as f64;
            Ok(grant)
        } else {
            let missing = need - self.tokens;
            Err(Duration::from_secs_f64(
                missing / self.rate_bytes_per_second as f64,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives the bucket with simulated time until `total` bytes are granted; returns the
    /// simulated time taken.
    fn drain(bucket: &mut TokenBucket, start: Instant, total: usize, chunk: usize) -> Duration {
        let mut now = start;
        let mut left = total;
        let mut steps = 0u32;
        while left > 0 {
            steps += 1;
            assert!(steps < 1_000_000, "bucket never granted");
            match bucket.take(left.min(chunk), now) {
                Ok(n) => {
                    assert!(n >= 1 && n <= left.min(chunk));
                    left -= n;
                }
                Err(wait) => {
                    assert!(wait > Duration::ZERO);
                    now += wait;
                }
            }
        }
        now - start
    }

    #[test]
    fn starts_empty_so_n_bytes_take_at_least_n_over_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10_000, 4096, t0);
        let took = drain(&mut b, t0, 50_000, 4096);
        assert!(took >= Duration::from_secs(5), "{took:?}");
        assert!(took < Duration::from_millis(5_100), "{took:?}");
    }

    #[test]
    fn tiny_rates_grant_single_bytes() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1, 65_536, t0);
        assert!(b.take(100, t0).is_err());
        assert_eq!(b.take(100, t0 + Duration::from_secs(1)), Ok(1));
    }

    #[test]
    fn idle_credit_is_capped_at_capacity() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1_000_000, 1000, t0);
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.take(100_000, later), Ok(1000));
        assert!(b.take(100_000, later).is_err());
    }
}
