//! Loaded topics: one [`Topic`] (a managed ledger, its producers and its
//! subscriptions) per topic name, loaded once.
//!
//! Promises:
//! - a topic's managed ledger is opened at most once at a time on this
//!   broker: concurrent loads of one name coalesce on one open, and a failed
//!   open leaves nothing behind (the next caller retries);
//! - a topic is loaded only if its namespace exists, and created only if
//!   auto-creation allows (broker default, overridden by the namespace
//!   policy); at most `topics_loaded_max` topics are loaded;
//! - a topic whose managed ledger turns terminal (fenced by another owner,
//!   failed) is unloaded: its producers and consumers are told to close
//!   (CLOSE_PRODUCER / CLOSE_CONSUMER, G13) and the next use loads it again;
//! - each loaded topic runs its periodic work (de-duplication and cursor
//!   snapshots, trimming) every `topic_tick_interval_ms` until unloaded;
//! - a topic of a namespace with de-duplication on is usable only once its
//!   de-duplication state is restored ([`crate::dedup_io`]);
//! - once an [`Ownership`] is attached ([`Topics::set_ownership`], cluster
//!   mode), a topic is loaded only if this broker owns its bundle (else
//!   `ServiceNotReady`): loading opens the managed ledger, which would fence
//!   the real owner (invariant 5);
//! - non-persistent topics are held in [`crate::non_persistent::NpTopics`]
//!   (no managed ledger) and count against `topics_loaded_max` too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use cms_bookie::client::driver::LedgerClient;
use cms_bookie::metadata::layout::Layout;
use cms_bookie::metadata::{MetadataError, MetadataStore};
use tokio::sync::{OnceCell, oneshot, watch};
use tracing::{info, warn};

use crate::managed_ledger::io::managed_ledger::node_path;
use crate::managed_ledger::io::{EntryCache, ManagedLedger, ManagedLedgerConfig, MlError};
use crate::metrics::BrokerMetrics;
use crate::ownership::Ownership;
use crate::producers::{
    AddOutcome, Grant, ProducerKey, ProducerRefusal, ProducerRequest, Producers,
};
use crate::subscriptions::Subscriptions;
use crate::tenancy::{TenancyError, namespace_policies};
use crate::topic_name::{Domain, TopicName};

/// Why a topic could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// The namespace does not exist, or the topic does not and may not be
    /// created.
    #[error("{0}")]
    NotFound(String),
    /// Not served by this broker (non-persistent topics).
    #[error("{0}")]
    NotAllowed(String),
    /// Too many topics loaded, or the broker is shutting down.
    #[error("{0}")]
    ServiceNotReady(String),
    /// Storage (metadata store, bookies) failed.
    #[error("{0}")]
    Persistence(String),
}

impl From<MlError> for TopicError {
    fn from(e: MlError) -> Self {
        match e {
            MlError::Fenced(_) | MlError::Closed(_) => {
                TopicError::ServiceNotReady(format!("topic is being unloaded: {e}"))
            }
            other => TopicError::Persistence(other.to_string()),
        }
    }
}

/// What loading topics needs.
#[derive(Clone)]
pub struct TopicContext {
    /// Ledger client.
    pub client: LedgerClient,
    /// Metadata store.
    pub store: Arc<dyn MetadataStore>,
    /// Layout.
    pub layout: Layout,
    /// Managed-ledger settings of new topics.
    pub ml_config: ManagedLedgerConfig,
    /// The broker's entry cache.
    pub cache: EntryCache,
    /// Metrics.
    pub metrics: BrokerMetrics,
    /// Broker default for auto-creation.
    pub allow_auto_topic_creation: bool,
    /// Producers per topic.
    pub producers_per_topic_max: usize,
    /// Topics loaded at once.
    pub topics_loaded_max: usize,
    /// Period of each topic's background work.
    pub tick_interval_ms: u64,
    /// Producer de-duplication settings (broker default, snapshots).
    pub dedup: crate::dedup::DedupConfig,
}

/// One loaded topic.
pub struct Topic {
    /// Its name.
    pub name: TopicName,
    /// Its managed ledger.
    pub ml: ManagedLedger,
    producers: Mutex<Producers>,
    waiters: Mutex<HashMap<ProducerKey, oneshot::Sender<Grant>>>,
    /// The subscriptions of this topic.
    pub subscriptions: Subscriptions,
    /// The namespace policies the topic was loaded with (see
    /// [`crate::policy_refresh`]).
    pub policies: crate::tenancy::NamespacePolicies,
    /// Producer de-duplication, when the namespace policy (or the broker
    /// default) turns it on.
    pub dedup: Option<Arc<crate::dedup_io::TopicDedup>>,
    /// Messages and bytes in and out since it was loaded here.
    pub counters: crate::topic_counters::TopicCounters,
    closing: watch::Sender<bool>,
}

impl std::fmt::Debug for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topic").field("name", &self.name).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The managed-ledger property that holds the topic epoch (the last one
/// granted to an exclusive producer).
pub const TOPIC_EPOCH_PROPERTY: &str = "cms.topic.epoch";

/// The topic epoch stored in `ml`'s properties (0 if none). An unreadable
/// value is logged and read as 0.
fn stored_topic_epoch(ml: &ManagedLedger, name: &TopicName) -> u64 {
    let Some(v) = ml.property(TOPIC_EPOCH_PROPERTY) else {
        return 0;
    };
    v.parse().unwrap_or_else(|_| {
        warn!(tenant = %name.tenant, namespace = %name.namespace, topic = %name, value = %v, "unreadable stored topic epoch; starting from 0");
        0
    })
}

/// A producer's place on a topic, as granted by [`Topic::add_producer`].
#[derive(Debug)]
pub enum ProducerAdmission {
    /// Connected.
    Ready(Grant),
    /// Waiting for exclusive access; the receiver fires when granted (and
    /// is dropped if the topic closes first).
    Waiting(oneshot::Receiver<Grant>),
}

impl Topic {
    /// A receiver that turns `true` when the topic is being unloaded.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Whether the topic is being unloaded.
    pub fn is_closing(&self) -> bool {
        *self.closing.borrow()
    }

    /// A producer asks to join (see [`Producers::add`]).
    pub fn add_producer(&self, req: ProducerRequest) -> Result<ProducerAdmission, ProducerRefusal> {
        if self.is_closing() {
            return Err(ProducerRefusal::Unloading(format!(
                "topic {} is being unloaded; retry",
                self.name
            )));
        }
        let key = req.key;
        let mut p = lock(&self.producers);
        match p.add(req)? {
            AddOutcome::Ready(g) => Ok(ProducerAdmission::Ready(g)),
            AddOutcome::Waiting => {
                let (tx, rx) = oneshot::channel();
                lock(&self.waiters).insert(key, tx);
                Ok(ProducerAdmission::Waiting(rx))
            }
        }
    }

    /// A producer leaves; a waiting producer granted because of it is told.
    pub fn remove_producer(&self, key: ProducerKey) {
        let granted = {
            let mut p = lock(&self.producers);
            p.remove(key)
        };
        lock(&self.waiters).remove(&key);
        if let Some(g) = granted {
            let tx = lock(&self.waiters).remove(&g.key);
            match tx {
                Some(tx) => {
                    if let Err(g) = tx.send(g) {
                        // The waiter went away meanwhile: free the topic again.
                        self.remove_producer(g.key);
                    }
                }
                None => self.remove_producer(g.key),
            }
        }
    }

    /// Connected producers.
    pub fn producer_count(&self) -> usize {
        lock(&self.producers).len()
    }

    /// Names and access modes of the connected producers (admin stats).
    pub fn producers_connected(&self) -> Vec<(String, crate::producers::AccessMode)> {
        lock(&self.producers).connected()
    }

    /// The current topic epoch.
    pub fn topic_epoch(&self) -> u64 {
        lock(&self.producers).topic_epoch()
    }

    /// Stores a granted topic epoch in the managed ledger's properties
    /// (never lowering the stored one); the producer hears of its grant only
    /// after this, so a reloaded topic, here or on another broker, still
    /// fences producers of older epochs.
    pub async fn store_topic_epoch(&self, epoch: u64) -> Result<(), MlError> {
        self.ml
            .update_properties(|props| {
                let stored = props
                    .get(TOPIC_EPOCH_PROPERTY)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                if stored >= epoch {
                    return false;
                }
                props.insert(TOPIC_EPOCH_PROPERTY.to_string(), epoch.to_string());
                true
            })
            .await
    }

    fn mark_closing(&self) {
        self.closing.send_replace(true);
        lock(&self.waiters).clear();
    }
}

/// The loaded topics of this broker.
pub struct Topics {
    ctx: TopicContext,
    slots: Mutex<HashMap<TopicName, Arc<OnceCell<Arc<Topic>>>>>,
    shutting_down: std::sync::atomic::AtomicBool,
    ownership: OnceLock<Weak<Ownership>>,
    non_persistent: crate::non_persistent::NpTopics,
}

impl std::fmt::Debug for Topics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topics").finish_non_exhaustive()
    }
}

impl Topics {
    /// No topic loaded yet.
    pub fn new(ctx: TopicContext) -> Arc<Self> {
        let non_persistent = crate::non_persistent::NpTopics::new(
            ctx.metrics.nonpersistent_dropped.clone(),
            ctx.metrics.topics_loaded.clone(),
        );
        Arc::new(Self {
            ctx,
            slots: Mutex::new(HashMap::new()),
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            ownership: OnceLock::new(),
            non_persistent,
        })
    }

    /// Attaches the ownership gate (once; later calls are ignored).
    pub fn set_ownership(&self, ownership: &Arc<Ownership>) {
        let _ = self.ownership.set(Arc::downgrade(ownership));
    }

    /// The loaded non-persistent topics.
    pub fn non_persistent(&self) -> &crate::non_persistent::NpTopics {
        &self.non_persistent
    }

    /// Takes a hold on non-persistent topic `name` for one producer or
    /// consumer (release it with [`crate::non_persistent::NpTopics::detach`]):
    /// the same checks as loading a persistent topic (shutdown, ownership,
    /// namespace, auto-creation, `topics_loaded_max` counting both kinds),
    /// without storage.
    pub async fn attach_non_persistent(
        &self,
        name: &TopicName,
        create: bool,
    ) -> Result<Arc<crate::non_persistent::NpTopic>, TopicError> {
        if self
            .shutting_down
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(TopicError::ServiceNotReady(
                "broker is shutting down".into(),
            ));
        }
        if let Some(o) = self.ownership.get().and_then(Weak::upgrade) {
            o.check_owned(name)
                .await
                .map_err(TopicError::ServiceNotReady)?;
        }
        let ctx = &self.ctx;
        let policies = namespace_policies(&*ctx.store, &ctx.layout, &name.tenant, &name.namespace)
            .await
            .map_err(|e| TopicError::Persistence(e.to_string()))?;
        let Some(policies) = policies else {
            return Err(TopicError::NotFound(format!(
                "namespace {} does not exist",
                name.namespace_name()
            )));
        };
        let auto = policies
            .auto_creation(crate::tenancy::AutoCreation {
                allowed: ctx.allow_auto_topic_creation,
                topic_type: crate::tenancy::AutoTopicType::NonPartitioned,
                partitions: 1,
            })
            .allowed;
        let persistent_loaded = lock(&self.slots).len();
        Ok(self.non_persistent.attach(
            name,
            create && auto,
            persistent_loaded,
            ctx.topics_loaded_max,
        )?)
    }

    /// The context (store, layout, ...).
    pub fn context(&self) -> &TopicContext {
        &self.ctx
    }

    /// Names of the topics loaded now.
    pub fn loaded(&self) -> Vec<TopicName> {
        lock(&self.slots)
            .iter()
            .filter(|(_, c)| c.initialized())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The topic if it is loaded.
    pub fn get_loaded(&self, name: &TopicName) -> Option<Arc<Topic>> {
        lock(&self.slots).get(name).and_then(|c| c.get().cloned())
    }

    /// The topic, loading it first if needed (`create`: the client asked for
    /// creation on first use, e.g. `force_topic_creation`).
    pub async fn get_or_load(
        self: &Arc<Self>,
        name: &TopicName,
        create: bool,
    ) -> Result<Arc<Topic>, TopicError> {
        if name.domain != Domain::Persistent {
            return Err(TopicError::NotAllowed(format!(
                "{name}: non-persistent topics have no managed ledger \
                 (see Topics::attach_non_persistent)"
            )));
        }
        if self
            .shutting_down
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(TopicError::ServiceNotReady(
                "broker is shutting down".into(),
            ));
        }
        if let Some(o) = self.ownership.get().and_then(Weak::upgrade) {
            o.check_owned(name)
                .await
                .map_err(TopicError::ServiceNotReady)?;
        }
        let cell = {
            let mut slots = lock(&self.slots);
            if let Some(c) = slots.get(name) {
                c.clone()
            } else {
                let loaded = slots.len() + self.non_persistent.len();
                if loaded >= self.ctx.topics_loaded_max {
                    return Err(TopicError::ServiceNotReady(format!(
                        "broker has {loaded} topics loaded (topics_loaded_max)"
                    )));
                }
                let c = Arc::new(OnceCell::new());
                slots.insert(name.clone(), c.clone());
                c
            }
        };
        let result = cell
            .get_or_try_init(|| self.load(name.clone(), create))
            .await
            .cloned();
        if result.is_err() {
            // Drop the empty slot (unless someone else filled it meanwhile).
            let mut slots = lock(&self.slots);
            if slots
                .get(name)
                .is_some_and(|c| Arc::ptr_eq(c, &cell) && !c.initialized())
            {
                slots.remove(name);
            }
        }
        result
    }

    async fn load(
        self: &Arc<Self>,
        name: TopicName,
        create: bool,
    ) -> Result<Arc<Topic>, TopicError> {
        let ctx = &self.ctx;
        let policies = namespace_policies(&*ctx.store, &ctx.layout, &name.tenant, &name.namespace)
            .await
            .map_err(|e| match e {
                TenancyError::Metadata(m) => TopicError::Persistence(m.to_string()),
                other => TopicError::Persistence(other.to_string()),
            })?;
        let Some(policies) = policies else {
            return Err(TopicError::NotFound(format!(
                "namespace {} does not exist",
                name.namespace_name()
            )));
        };
        let ml_name = name.managed_ledger_name();
        let auto = policies
            .auto_creation(crate::tenancy::AutoCreation {
                allowed: ctx.allow_auto_topic_creation,
                topic_type: crate::tenancy::AutoTopicType::NonPartitioned,
                partitions: 1,
            })
            .allowed;
        if auto && create {
            // A topic created now counts against maxTopics.
            let path = node_path(&ctx.layout, &ml_name)
                .map_err(|e| TopicError::NotFound(e.to_string()))?;
            if matches!(ctx.store.exists(&path).await, Ok(None)) {
                crate::quota_io::check_new_topic(
                    &*ctx.store,
                    &ctx.layout,
                    &name.tenant,
                    &name.namespace,
                )
                .await
                .map_err(TopicError::NotAllowed)?;
            }
        }
        if !auto || !create {
            let path = node_path(&ctx.layout, &ml_name)
                .map_err(|e| TopicError::NotFound(e.to_string()))?;
            match ctx.store.exists(&path).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(TopicError::NotFound(format!(
                        "topic {name} does not exist and auto-creation is off"
                    )));
                }
                Err(MetadataError::NoNode(_)) => {
                    return Err(TopicError::NotFound(format!("topic {name} does not exist")));
                }
                Err(e) => return Err(TopicError::Persistence(e.to_string())),
            }
        }
        let ml = ManagedLedger::open(
            ctx.client.clone(),
            ctx.store.clone(),
            &ctx.layout,
            &ml_name,
            crate::tenancy::ml_config_for(&ctx.ml_config, &policies),
            ctx.cache.clone(),
        )
        .await?;
        // TTL expiry (namespace policy, admin expireMessages) finds entry
        // ages by the producer's publish time in the stored metadata.
        ml.set_publish_time_fn(Arc::new(|entry: &[u8]| {
            cms_client::proto::frame::parse_entry(entry)
                .ok()
                .map(|p| p.metadata.publish_time)
        }));
        let dedup = if policies
            .deduplication_enabled
            .unwrap_or(ctx.dedup.enabled_default)
        {
            match crate::dedup_io::TopicDedup::open(&ml, ctx.dedup).await {
                Ok(d) => Some(d),
                Err(e) => {
                    if let Err(e) = ml.close().await {
                        warn!(topic = %name, error = %e, "closing the managed ledger");
                    }
                    return Err(e.into());
                }
            }
        } else {
            // Like Pulsar: turning de-duplication off drops its cursor, so
            // it no longer holds entries back from trimming.
            if ml.has_cursor(crate::dedup::DEDUP_CURSOR)
                && let Err(e) = ml.delete_cursor(crate::dedup::DEDUP_CURSOR).await
            {
                warn!(topic = %name, error = %e, "deleting the de-duplication cursor");
            }
            None
        };
        let topic_epoch = stored_topic_epoch(&ml, &name);
        let topic = Arc::new(Topic {
            name: name.clone(),
            ml,
            producers: Mutex::new(Producers::with_epoch(
                ctx.producers_per_topic_max,
                topic_epoch,
            )),
            waiters: Mutex::new(HashMap::new()),
            subscriptions: Subscriptions::default(),
            policies,
            dedup,
            counters: crate::topic_counters::TopicCounters::default(),
            closing: watch::channel(false).0,
        });
        ctx.metrics.topics_loaded.inc();
        info!(tenant = %name.tenant, namespace = %name.namespace, topic = %name, "topic loaded");
        tokio::spawn(tick_loop(
            Arc::downgrade(self),
            Arc::downgrade(&topic),
            ctx.tick_interval_ms.max(10),
        ));
        Ok(topic)
    }

    /// Unloads `topic` if it is still the loaded one: tells its producers
    /// and consumers to close and forgets it (its managed ledger is closed
    /// if it is not terminal already).
    pub async fn unload(&self, topic: &Arc<Topic>, reason: &str) {
        let removed = {
            let mut slots = lock(&self.slots);
            let current = slots
                .get(&topic.name)
                .is_some_and(|c| c.get().is_some_and(|t| Arc::ptr_eq(t, topic)));
            if current {
                slots.remove(&topic.name);
            }
            current
        };
        if !removed {
            return;
        }
        warn!(topic = %topic.name, reason, "unloading topic");
        topic.mark_closing();
        topic.subscriptions.close_all().await;
        // A last de-duplication snapshot shortens the next load's replay.
        if topic.ml.terminal_error().is_none()
            && let Some(d) = &topic.dedup
            && let Err(e) = d.snapshot().await
        {
            warn!(topic = %topic.name, error = %e, "de-duplication snapshot on unload");
        }
        if topic.ml.terminal_error().is_none()
            && let Err(e) = topic.ml.close().await
        {
            warn!(topic = %topic.name, error = %e, "closing the managed ledger");
        }
        self.ctx.metrics.topics_loaded.dec();
    }

    /// Shutdown: refuses new loads, then closes every topic (cursors
    /// persisted, ledgers closed).
    pub async fn close_all(&self) {
        self.shutting_down
            .store(true, std::sync::atomic::Ordering::Release);
        let topics: Vec<Arc<Topic>> = lock(&self.slots)
            .values()
            .filter_map(|c| c.get().cloned())
            .collect();
        for t in topics {
            self.unload(&t, "broker shutting down").await;
        }
    }
}

async fn tick_loop(topics: Weak<Topics>, topic: Weak<Topic>, interval_ms: u64) {
    let mut interval = tokio::time::interval(Duration::from_millis(interval_ms));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        let mut closing = match topic.upgrade() {
            Some(t) => t.closing(),
            None => return,
        };
        tokio::select! {
            _ = interval.tick() => {}
            _ = crate::connection::wait_true(&mut closing) => return,
        }
        let (Some(t), Some(ts)) = (topic.upgrade(), topics.upgrade()) else {
            return;
        };
        if t.is_closing() {
            return;
        }
        if let Some(e) = t.ml.terminal_error() {
            ts.unload(&t, &e.to_string()).await;
            return;
        }
        if let Some(d) = &t.dedup
            && let Err(e) = d.snapshot_if_due().await
        {
            warn!(topic = %t.name, error = %e, "de-duplication snapshot failed");
        }
        if let Err(e) = t.ml.tick().await {
            warn!(topic = %t.name, error = %e, "topic periodic work failed");
            if t.ml.terminal_error().is_some() {
                ts.unload(&t, &e.to_string()).await;
                return;
            }
        }
    }
}
