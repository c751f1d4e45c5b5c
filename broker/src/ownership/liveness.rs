//! Session liveness as the ownership layer sees it (pure: time is an input).
//!
//! ZooKeeper expires a session `session_timeout` after the server last
//! heard from the client; the client's `Disconnected` event comes late. So
//! the broker keeps its own clock: a heartbeat request is sent regularly,
//! and when its reply arrives the *send* instant is recorded as "last heard"
//! (the server saw the request no earlier than that, so the session's
//! expiry is at least `session_timeout` after it). When more than
//! [`LivenessClock::SAFE_FRACTION`] (2/3) of the session timeout has passed
//! since the last reply, the broker must assume its ephemeral ownership
//! nodes may be gone and stop serving its bundles.
//!
//! Promise: [`LivenessClock::is_fresh`] is false from `last_heard + 2/3 ×
//! timeout` on, on a monotonic clock (`std::time::Instant`, which keeps
//! counting while the process is stopped), and "last heard" never moves
//! back.

use std::time::{Duration, Instant};

/// The last reply from the metadata store and the deadline it implies.
#[derive(Debug, Clone)]
pub struct LivenessClock {
    session_timeout: Duration,
    last_heard: Option<Instant>,
}

impl LivenessClock {
    /// Fraction of the session timeout after which ownership is given up.
    pub const SAFE_FRACTION: (u32, u32) = (2, 3);

    /// A clock that has heard nothing yet (not fresh).
    pub fn new(session_timeout: Duration) -> Self {
        Self {
            session_timeout,
            last_heard: None,
        }
    }

    /// The session timeout in use.
    pub fn session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// The safe window: 2/3 of the session timeout.
    pub fn safe_window(&self) -> Duration {
        self.session_timeout * Self::SAFE_FRACTION.0 / Self::SAFE_FRACTION.1
    }

    /// A reply arrived to a request sent at `sent_at`.
    pub fn heard(&mut self, sent_at: Instant) {
        if self.last_heard.is_none_or(|l| sent_at > l) {
            self.last_heard = Some(sent_at);
        }
    }

    /// Forget everything (session ended): never fresh again until heard.
    pub fn reset(&mut self) {
        self.last_heard = None;
    }

    /// Whether the session can still be trusted at `now`.
    pub fn is_fresh(&self, now: Instant) -> bool {
        match self.last_heard {
            None => false,
            Some(l) => now.saturating_duration_since(l) < self.safe_window(),
        }
    }

    /// Time since the last reply, if any.
    pub fn silence(&self, now: Instant) -> Option<Duration> {
        self.last_heard.map(|l| now.saturating_duration_since(l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_until_two_thirds_of_the_timeout() {
        let t0 = Instant::now();
        let mut c = LivenessClock::new(Duration::from_millis(4000));
        assert!(!c.is_fresh(t0), "nothing heard yet");
        c.heard(t0);
        assert!(c.is_fresh(t0));
        assert!(c.is_fresh(t0 + Duration::from_millis(2666)));
        assert!(!c.is_fresh(t0 + Duration::from_millis(2667)));
        assert!(!c.is_fresh(t0 + Duration::from_secs(60)));
    }

    #[test]
    fn last_heard_never_moves_back() {
        let t0 = Instant::now();
        let mut c = LivenessClock::new(Duration::from_millis(3000));
        c.heard(t0 + Duration::from_millis(1000));
        // A late reply to an older request does not extend the lease.
        c.heard(t0);
        assert!(!c.is_fresh(t0 + Duration::from_millis(3000)));
        assert!(c.is_fresh(t0 + Duration::from_millis(2999)));
        c.reset();
        assert!(!c.is_fresh(t0 + Duration::from_millis(1000)));
        assert_eq!(c.silence(t0), None);
    }
}
