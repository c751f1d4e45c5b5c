//! Non-persistent topics (`non-persistent://tenant/ns/topic`): best-effort
//! fan-out in memory, Pulsar's `NonPersistentTopic`.
//!
//! Promises:
//! - nothing is stored: no managed ledger, no bookie write, no metadata
//!   node; a published entry is handed to each subscription's chosen
//!   consumer (see [`router::Router`]) at once and forgotten;
//! - SEND_RECEIPT is sent right away with message id `(0, n)`, `n` from a
//!   per-topic counter; consumers receive the same id;
//! - a message is dropped for a subscription (and counted, per subscription
//!   and in `cms_nonpersistent_messages_dropped_total`) when it has no
//!   consumer, the chosen consumer has no permits, or that consumer's
//!   outbound queue ([`NP_CONSUMER_QUEUE_MAX`] entries) is full: the
//!   producer is never slowed down by a consumer;
//! - a subscription lives while it has consumers, a topic while it has
//!   producers or consumers: a late subscriber gets nothing published
//!   before it subscribed, and nothing survives a broker restart;
//! - loaded non-persistent topics count against `topics_loaded_max`
//!   together with persistent ones (checked by [`crate::topics::Topics`]).

pub(crate) mod conn;
pub mod router;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use prometheus::IntCounter;
use tokio::sync::mpsc;
use tracing::{debug, info};

use crate::dispatch::{ConsumerId, ConsumerInfo, DispatchError, Event, SubType};
use crate::topic_name::TopicName;
use router::{DropReason, Route, Router};

/// Entries queued towards one non-persistent consumer's connection; when
/// full, further messages for that consumer are dropped.
pub const NP_CONSUMER_QUEUE_MAX: usize = 1_000;

/// What a non-persistent consumer's forwarder sends.
#[derive(Debug, Clone)]
pub enum NpDelivery {
    /// A message (entry) with its id `(0, entry_id)`.
    Message {
        /// Per-topic counter.
        entry_id: u64,
        /// The entry as published (metadata and payload).
        entry: Bytes,
    },
    /// Failover: this consumer became (in)active.
    ActiveChanged(bool),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug)]
struct SubState {
    router: Router,
    sinks: HashMap<ConsumerId, mpsc::Sender<NpDelivery>>,
    delivered: u64,
    dropped: u64,
}

/// One non-persistent subscription: its consumers and counters.
#[derive(Debug)]
pub struct NpSubscription {
    name: String,
    state: Mutex<SubState>,
}

/// A subscription's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpSubscriptionStats {
    /// Subscription name.
    pub name: String,
    /// Type of the attached consumers.
    pub sub_type: Option<SubType>,
    /// Attached consumers: name and permits left, in join order.
    pub consumers: Vec<(String, i64)>,
    /// Messages handed to consumers.
    pub delivered: u64,
    /// Messages dropped.
    pub dropped: u64,
}

impl NpSubscription {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds permits to a consumer.
    pub fn flow(&self, id: ConsumerId, permits: u32) -> Result<(), DispatchError> {
        lock(&self.state).router.flow(id, permits)
    }

    /// Permits left of a consumer.
    pub fn permits(&self, id: ConsumerId) -> Option<i64> {
        lock(&self.state).router.permits(id)
    }

    /// Its figures.
    pub fn stats(&self) -> NpSubscriptionStats {
        let s = lock(&self.state);
        NpSubscriptionStats {
            name: self.name.clone(),
            sub_type: s.router.sub_type(),
            consumers: s
                .router
                .consumers()
                .into_iter()
                .map(|(_, name, permits)| (name, permits))
                .collect(),
            delivered: s.delivered,
            dropped: s.dropped,
        }
    }
}

/// Tells consumers about Failover activity changes (best effort: a full
/// queue loses the notice, as it would lose a message).
fn notify(sinks: &HashMap<ConsumerId, mpsc::Sender<NpDelivery>>, events: Vec<Event>) {
    for Event::ActiveChanged {
        consumer,
        is_active,
    } in events
    {
        if let Some(s) = sinks.get(&consumer) {
            let _ = s.try_send(NpDelivery::ActiveChanged(is_active));
        }
    }
}

/// What one publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The entry id given to it.
    pub entry_id: u64,
    /// Subscriptions it was handed to.
    pub delivered: usize,
    /// Subscriptions it was dropped on.
    pub dropped: usize,
}

/// One loaded non-persistent topic.
#[derive(Debug)]
pub struct NpTopic {
    /// Its name.
    pub name: TopicName,
    next_entry: AtomicU64,
    subs: Mutex<HashMap<String, Arc<NpSubscription>>>,
    dropped_metric: IntCounter,
    key_hasher: crate::subscription::KeyHasher,
}

impl NpTopic {
    fn new(name: TopicName, dropped_metric: IntCounter) -> Self {
        Self {
            name,
            next_entry: AtomicU64::new(0),
            subs: Mutex::new(HashMap::new()),
            dropped_metric,
            key_hasher: crate::subscription::KeyHasher::pulsar(),
        }
    }

    /// Hands `entry` (holding `messages` messages) to every subscription's
    /// chosen consumer, dropping it where it cannot go now.
    pub fn publish(&self, entry: &Bytes, messages: u32) -> Published {
        let entry_id = self.next_entry.fetch_add(1, Ordering::Relaxed);
        let subs: Vec<Arc<NpSubscription>> = lock(&self.subs).values().cloned().collect();
        let mut key_hash: Option<u16> = None;
        let mut out = Published {
            entry_id,
            delivered: 0,
            dropped: 0,
        };
        let messages_u64 = u64::from(messages.max(1));
        for sub in subs {
            let mut s = lock(&sub.state);
            let hash = if s.router.sub_type() == Some(SubType::KeyShared) {
                *key_hash.get_or_insert_with(|| self.key_hasher.hash(entry))
            } else {
                0
            };
            let reason = match s.router.route(messages, hash) {
                Route::Deliver(id) => {
                    let sent = s.sinks.get(&id).is_some_and(|sink| {
                        sink.try_send(NpDelivery::Message {
                            entry_id,
                            entry: entry.clone(),
                        })
                        .is_ok()
                    });
                    if sent {
                        s.delivered += messages_u64;
                        out.delivered += 1;
                        continue;
                    }
                    s.router.not_sent(id, messages);
                    DropReason::QueueFull
                }
                Route::Drop(r) => r,
            };
            s.dropped += messages_u64;
            out.dropped += 1;
            self.dropped_metric.inc_by(messages_u64);
            debug!(topic = %self.name, subscription = %sub.name, ?reason, "message dropped");
        }
        out
    }

    /// The last entry id given, if any.
    pub fn last_entry_id(&self) -> Option<u64> {
        self.next_entry.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Attaches a consumer to subscription `name` (created if new).
    pub fn subscribe(
        &self,
        name: &str,
        info: ConsumerInfo,
        sink: mpsc::Sender<NpDelivery>,
        consumers_max: usize,
    ) -> Result<Arc<NpSubscription>, DispatchError> {
        let mut subs = lock(&self.subs);
        let sub = subs
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(NpSubscription {
                    name: name.to_string(),
                    state: Mutex::new(SubState {
                        router: Router::new(consumers_max),
                        sinks: HashMap::new(),
                        delivered: 0,
                        dropped: 0,
                    }),
                })
            })
            .clone();
        let mut s = lock(&sub.state);
        let id = info.id;
        match s.router.add_consumer(info) {
            Ok(events) => {
                s.sinks.insert(id, sink);
                notify(&s.sinks, events);
                drop(s);
                Ok(sub)
            }
            Err(e) => {
                let empty = s.router.is_empty();
                drop(s);
                if empty {
                    subs.remove(name);
                }
                Err(e)
            }
        }
    }

    /// Detaches a consumer; the subscription goes away with its last one.
    pub fn unsubscribe(&self, sub: &Arc<NpSubscription>, id: ConsumerId) {
        let mut subs = lock(&self.subs);
        let mut s = lock(&sub.state);
        s.sinks.remove(&id);
        if let Ok(events) = s.router.remove_consumer(id) {
            notify(&s.sinks, events);
        }
        let empty = s.router.is_empty();
        drop(s);
        if empty
            && subs
                .get(sub.name())
                .is_some_and(|current| Arc::ptr_eq(current, sub))
        {
            subs.remove(sub.name());
        }
    }

    /// Figures of every subscription, by name.
    pub fn subscription_stats(&self) -> Vec<NpSubscriptionStats> {
        let mut v: Vec<NpSubscriptionStats> =
            lock(&self.subs).values().map(|s| s.stats()).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }
}

/// The loaded non-persistent topics of this broker, each with the number of
/// producers and consumers holding it.
#[derive(Debug)]
pub struct NpTopics {
    topics: Mutex<HashMap<TopicName, (Arc<NpTopic>, usize)>>,
    dropped_metric: IntCounter,
    loaded_metric: prometheus::IntGauge,
}

/// Why a non-persistent topic could not be attached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    /// Loading one more topic would exceed `topics_loaded_max`.
    #[error("broker has {loaded} topics loaded (topics_loaded_max)")]
    TooManyTopics {
        /// Topics loaded now.
        loaded: usize,
    },
    /// The topic is not loaded and may not be created.
    #[error("topic {0} does not exist and auto-creation is off")]
    NotFound(String),
}

impl NpTopics {
    /// None loaded; drops are counted in `dropped_metric`, loaded topics in
    /// `loaded_metric`.
    pub fn new(dropped_metric: IntCounter, loaded_metric: prometheus::IntGauge) -> Self {
        Self {
            topics: Mutex::new(HashMap::new()),
            dropped_metric,
            loaded_metric,
        }
    }

    /// Topics loaded.
    pub fn len(&self) -> usize {
        lock(&self.topics).len()
    }

    /// None loaded.
    pub fn is_empty(&self) -> bool {
        lock(&self.topics).is_empty()
    }

    /// The topic if loaded.
    pub fn get(&self, name: &TopicName) -> Option<Arc<NpTopic>> {
        lock(&self.topics).get(name).map(|(t, _)| t.clone())
    }

    /// Names of the loaded topics, sorted.
    pub fn names(&self) -> Vec<TopicName> {
        let mut v: Vec<TopicName> = lock(&self.topics).keys().cloned().collect();
        v.sort_by_key(|n| n.to_string());
        v
    }

    /// Takes a hold on `name` for one producer or consumer, loading it if
    /// needed (`create`: creation allowed; `others_loaded`: persistent topics
    /// loaded, counted against `loaded_max`).
    pub fn attach(
        &self,
        name: &TopicName,
        create: bool,
        others_loaded: usize,
        loaded_max: usize,
    ) -> Result<Arc<NpTopic>, AttachError> {
        let mut topics = lock(&self.topics);
        if let Some((t, holds)) = topics.get_mut(name) {
            *holds += 1;
            return Ok(t.clone());
        }
        if !create {
            return Err(AttachError::NotFound(name.to_string()));
        }
        let loaded = topics.len() + others_loaded;
        if loaded >= loaded_max {
            return Err(AttachError::TooManyTopics { loaded });
        }
        let t = Arc::new(NpTopic::new(name.clone(), self.dropped_metric.clone()));
        topics.insert(name.clone(), (t.clone(), 1));
        self.loaded_metric.inc();
        info!(tenant = %name.tenant, namespace = %name.namespace, topic = %name,
            "non-persistent topic loaded");
        Ok(t)
    }

    /// Releases one hold; the topic is unloaded with its last one.
    pub fn detach(&self, topic: &Arc<NpTopic>) {
        let mut topics = lock(&self.topics);
        let Some((t, holds)) = topics.get_mut(&topic.name) else {
            return;
        };
        if !Arc::ptr_eq(t, topic) {
            return;
        }
        *holds = holds.saturating_sub(1);
        if *holds == 0 {
            topics.remove(&topic.name);
            self.loaded_metric.dec();
            info!(topic = %topic.name, "non-persistent topic unloaded (no producer or consumer)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics() -> NpTopics {
        NpTopics::new(
            IntCounter::new("d", "d").unwrap(),
            prometheus::IntGauge::new("l", "l").unwrap(),
        )
    }

    fn name(s: &str) -> TopicName {
        TopicName::parse(&format!("non-persistent://t/ns/{s}")).unwrap()
    }

    fn info(i: u64, t: SubType) -> ConsumerInfo {
        ConsumerInfo {
            id: ConsumerId::new(1, i),
            name: format!("c{i}"),
            priority: 0,
            sub_type: t,
            key_shared: None,
        }
    }

    #[test]
    fn topics_live_while_held_and_count_against_the_limit() {
        let ts = topics();
        let a = ts.attach(&name("a"), true, 0, 2).unwrap();
        let a2 = ts.attach(&name("a"), false, 0, 2).unwrap();
        assert!(Arc::ptr_eq(&a, &a2));
        assert_eq!(
            ts.attach(&name("b"), true, 1, 2).err(),
            Some(AttachError::TooManyTopics { loaded: 2 })
        );
        assert_eq!(
            ts.attach(&name("c"), false, 0, 9).err(),
            Some(AttachError::NotFound(name("c").to_string()))
        );
        ts.detach(&a);
        assert_eq!(ts.len(), 1);
        ts.detach(&a2);
        assert!(ts.is_empty());
        assert_eq!(ts.loaded_metric.get(), 0);
    }

    #[test]
    fn fan_out_to_every_subscription_and_drop_without_permits() {
        let ts = topics();
        let t = ts.attach(&name("f"), true, 0, 10).unwrap();
        let (tx1, mut rx1) = mpsc::channel(10);
        let (tx2, mut rx2) = mpsc::channel(10);
        let s1 = t
            .subscribe("s1", info(1, SubType::Exclusive), tx1, 10)
            .unwrap();
        let s2 = t
            .subscribe("s2", info(2, SubType::Shared), tx2, 10)
            .unwrap();
        s1.flow(ConsumerId::new(1, 1), 10).unwrap();
        let p = t.publish(&Bytes::from_static(b"x"), 1);
        assert_eq!(
            p,
            Published {
                entry_id: 0,
                delivered: 1,
                dropped: 1
            }
        );
        assert!(matches!(
            rx1.try_recv(),
            Ok(NpDelivery::Message { entry_id: 0, .. })
        ));
        assert!(rx2.try_recv().is_err());
        assert_eq!(s2.stats().dropped, 1);
        assert_eq!(ts.dropped_metric.get(), 1);
        // Nothing is replayed to a late subscriber.
        let (tx3, mut rx3) = mpsc::channel(10);
        let s3 = t
            .subscribe("s3", info(3, SubType::Shared), tx3, 10)
            .unwrap();
        s3.flow(ConsumerId::new(1, 3), 10).unwrap();
        assert!(rx3.try_recv().is_err());
        assert_eq!(t.last_entry_id(), Some(0));
    }

    #[test]
    fn a_full_consumer_queue_drops_and_keeps_permits() {
        let ts = topics();
        let t = ts.attach(&name("q"), true, 0, 10).unwrap();
        let (tx, _rx) = mpsc::channel(1);
        let id = ConsumerId::new(1, 1);
        let s = t
            .subscribe("s", info(1, SubType::Exclusive), tx, 10)
            .unwrap();
        s.flow(id, 5).unwrap();
        assert_eq!(t.publish(&Bytes::from_static(b"a"), 1).delivered, 1);
        assert_eq!(t.publish(&Bytes::from_static(b"b"), 1).dropped, 1);
        assert_eq!(s.permits(id), Some(4));
        assert_eq!(s.stats().dropped, 1);
    }

    #[test]
    fn subscriptions_go_away_with_their_last_consumer() {
        let ts = topics();
        let t = ts.attach(&name("u"), true, 0, 10).unwrap();
        let (tx, _rx) = mpsc::channel(1);
        let s = t
            .subscribe("s", info(1, SubType::Exclusive), tx.clone(), 10)
            .unwrap();
        // A refused consumer leaves the existing subscription alone.
        assert!(
            t.subscribe("s", info(2, SubType::Exclusive), tx.clone(), 10)
                .is_err()
        );
        assert_eq!(t.subscription_stats().len(), 1);
        t.unsubscribe(&s, ConsumerId::new(1, 1));
        assert!(t.subscription_stats().is_empty());
        // A refused first consumer leaves no subscription behind.
        assert!(t.subscribe("z", info(3, SubType::Shared), tx, 0).is_err());
        assert!(t.subscription_stats().is_empty());
    }
}
