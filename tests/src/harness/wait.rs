//! Bounded waiting on conditions: the only way tests wait for something.
//!
//! [`eventually`] polls a condition every [`POLL_INTERVAL_MS`] until it holds or
//! its deadline passes, and then panics naming the condition. No fixed sleeps.

use std::future::Future;
use std::time::{Duration, Instant};

/// Pause between two checks of a condition, in milliseconds.
pub const POLL_INTERVAL_MS: u64 = 50;

/// Polls `check` until it returns `true`, at most `timeout_ms` milliseconds.
/// Returns how long it took.
///
/// # Panics
/// With `what` in the message when the deadline passes first.
pub async fn eventually<F, Fut>(what: &str, timeout_ms: u64, check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    match within(timeout_ms, check).await {
        Some(took) => took,
        None => panic!("timed out after {timeout_ms} ms waiting until {what}"),
    }
}

/// Like [`eventually`] but returns `None` instead of panicking at the deadline.
pub async fn within<F, Fut>(timeout_ms: u64, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    let deadline = start + Duration::from_millis(timeout_ms);
    loop {
        if check().await {
            return Some(start.elapsed());
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_condition_that_holds_returns_at_once() {
        let took = eventually("true is true", 1_000, || async { true }).await;
        assert!(took < Duration::from_millis(500));
    }

    #[tokio::test]
    async fn a_condition_that_never_holds_times_out() {
        assert_eq!(within(200, || async { false }).await, None);
    }

    #[tokio::test]
    #[should_panic(expected = "waiting until the moon is cheese")]
    async fn eventually_panics_with_the_condition() {
        eventually("the moon is cheese", 100, || async { false }).await;
    }
}
