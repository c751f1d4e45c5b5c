//! The subscriptions of one topic, by name: each a
//! [`crate::subscription::Subscription`] opened once (durable ones restore
//! their cursor; readers get a non-durable cursor) and kept while the topic
//! is loaded.
//!
//! Promises: one subscription object per name at a time (opens of one name
//! are serialised); a reader's subscription is closed (its cursor dropped)
//! when its last consumer leaves, except after a SEEK, when it waits up to
//! [`SEEK_RESUBSCRIBE_GRACE_MS`] for the client's resubscribe (which reuses
//! it and its moved cursor, as Pulsar does); closing the topic closes every
//! subscription, which persists the durable cursors.

use std::collections::HashMap;

use tracing::warn;

use crate::managed_ledger::InitialPosition;
use crate::managed_ledger::io::ManagedLedger;
use crate::subscription::{
    MessageCounter, StartPosition, SubError, Subscription, SubscriptionConfig,
};

/// How long a reader's subscription stays open without a consumer after a
/// SEEK (the client resubscribes at once and must find the moved cursor);
/// after it, it is closed like any reader without consumers.
pub const SEEK_RESUBSCRIBE_GRACE_MS: u64 = 30_000;

/// How a subscription is opened when it is not open yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenAs {
    /// A durable subscription starting at this position when new.
    Durable(InitialPosition),
    /// A reader starting here.
    Reader(StartPosition),
}

/// The subscriptions of one topic.
#[derive(Debug, Default)]
pub struct Subscriptions {
    subs: tokio::sync::Mutex<HashMap<String, Subscription>>,
}

impl Subscriptions {
    /// The subscription `name`, opened first if needed.
    pub async fn get_or_open(
        &self,
        ml: &ManagedLedger,
        name: &str,
        open_as: OpenAs,
        counter: MessageCounter,
        config: SubscriptionConfig,
    ) -> Result<Subscription, SubError> {
        let mut subs = self.subs.lock().await;
        if let Some(s) = subs.get(name) {
            return Ok(s.clone());
        }
        let s = match open_as {
            OpenAs::Durable(initial) => {
                Subscription::open_durable(ml, name, initial, counter, config).await?
            }
            OpenAs::Reader(start) => {
                Subscription::open_non_durable(ml, name, start, counter, config).await?
            }
        };
        subs.insert(name.to_string(), s.clone());
        Ok(s)
    }

    /// The subscriptions open now, by name (admin stats).
    pub async fn open_now(&self) -> Vec<Subscription> {
        let mut v: Vec<Subscription> = self.subs.lock().await.values().cloned().collect();
        v.sort_by(|a, b| a.name().cmp(b.name()));
        v
    }

    /// As [`Self::open_now`] without waiting: None while the set is busy
    /// (metrics scrapes must not block).
    pub fn try_open_now(&self) -> Option<Vec<Subscription>> {
        let subs = self.subs.try_lock().ok()?;
        let mut v: Vec<Subscription> = subs.values().cloned().collect();
        v.sort_by(|a, b| a.name().cmp(b.name()));
        Some(v)
    }

    /// Whether `name` is open now.
    pub async fn contains(&self, name: &str) -> bool {
        self.subs.lock().await.contains_key(name)
    }

    /// Forgets `name` if it is `sub` (after an unsubscribe).
    pub async fn forget(&self, sub: &Subscription) {
        let mut subs = self.subs.lock().await;
        if subs.get(sub.name()).is_some() {
            subs.remove(sub.name());
        }
    }

    /// A consumer left `sub`: a reader without consumers is closed.
    pub async fn consumer_left(&self, sub: &Subscription) {
        if sub.is_durable() || sub.consumer_count() > 0 {
            return;
        }
        let mut subs = self.subs.lock().await;
        // Only this very object (a later reader of the same name stays).
        if sub.consumer_count() == 0
            && subs.get(sub.name()).is_some_and(|s| s.same_as(sub))
            && subs.remove(sub.name()).is_some()
        {
            drop(subs);
            if let Err(e) = sub.close().await {
                warn!(subscription = sub.name(), error = %e, "closing a reader");
            }
        }
    }

    /// Closes every subscription (topic unload).
    pub async fn close_all(&self) {
        let all: Vec<Subscription> = self.subs.lock().await.drain().map(|(_, s)| s).collect();
        for s in all {
            if let Err(e) = s.close().await {
                warn!(subscription = s.name(), error = %e, "closing a subscription");
            }
        }
    }
}
