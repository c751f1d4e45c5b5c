//! Exponential reconnect backoff with jitter: starts at `initial`, doubles up
//! to `max`, each delay jittered into `[d/2, d]` so clients do not reconnect
//! in lockstep. Pure: the jitter source is passed in.

use std::time::Duration;

/// Reconnect delays.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A backoff starting at `initial` and capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
        }
    }

    /// The next delay; `unit` in `[0, 1)` chooses where in `[d/2, d]` it lands.
    pub fn next_delay(&mut self, unit: f64) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        let unit = unit.clamp(0.0, 1.0);
        d / 2 + d.mul_f64(unit / 2.0)
    }

    /// The next delay with random jitter.
    pub fn next_jittered(&mut self) -> Duration {
        self.next_delay(rand::random::<f64>())
    }

    /// Back to the initial delay (after a successful reconnect).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        assert_eq!(b.next_delay(1.0), Duration::from_millis(100));
        assert_eq!(b.next_delay(1.0), Duration::from_millis(200));
        assert_eq!(b.next_delay(0.0), Duration::from_millis(200));
        assert_eq!(b.next_delay(1.0), Duration::from_millis(500));
        assert_eq!(b.next_delay(1.0), Duration::from_millis(500));
        b.reset();
        assert_eq!(b.next_delay(0.0), Duration::from_millis(50));
        for _ in 0..100 {
            let d = b.next_jittered();
            assert!(d >= Duration::from_millis(50) && d <= Duration::from_millis(500));
        }
    }
}
