//! Quota enforcement on a broker (docs/quotas.md): the I/O side of
//! [`crate::quota`].
//!
//! - **Counts** (producers, consumers, connections per tenant and
//!   namespace; Pulsar's per-topic / per-subscription policies) are checked
//!   at creation against this broker's live count plus what the other
//!   brokers reported; an admitted handle holds an [`Admission`] that gives
//!   its place back on drop. Topics and queues are counted in the store at
//!   creation ([`check_new_topic`], [`check_new_queue`]).
//! - **Publish rates** are token buckets ([`governor`]) per tenant, per
//!   namespace (our quotas, this broker's share of them) and per topic
//!   (Pulsar's `publishMaxMessageRate`): a connection that published more
//!   than its buckets allow stops reading its socket until they refill
//!   ([`pay`]), so producers slow down without an error.
//! - **Usage sharing**: every [`REPORT_INTERVAL_MS`] the broker writes its
//!   per-tenant and per-namespace usage to the ephemeral node
//!   `<root>/quota-usage/<broker id>`, reads the other brokers' nodes and
//!   resizes its buckets to its share ([`crate::quota::allocate`], every
//!   broker with a fresh report taking part, idle ones at the floor), so
//!   the sum over brokers stays within the quota from the first interval.
//! - **Backlog quota** (Pulsar's `backlog_quota_map.destination_storage`)
//!   and `storageBytes`: checked every interval on loaded topics;
//!   `producer_request_hold` pauses the producers' connections,
//!   `producer_exception` disconnects them (the topic is unloaded, G13) and
//!   refuses their re-creation with ProducerBlockedQuotaExceededException,
//!   `consumer_backlog_eviction` moves the slowest cursor past its oldest
//!   entries until the backlog fits. The `message_age` backlog quota is
//!   checked on the same interval against the publish time of the oldest
//!   unacknowledged message ([`crate::quota::age_over`]): hold and exception
//!   as above, eviction expires the messages over the age.
//! - **Dispatch rates**: buckets per tenant, namespace, topic
//!   (`topicDispatchRate`) and subscription (`subscriptionDispatchRate`);
//!   a consumer's forwarder pays all of them before each delivery.
//!
//! Promises: no refusal is a SEND_ERROR (G6); every refusal names the
//! quota and its value; the aggregate publish rate of a tenant over all
//! brokers stays within its quota (shares sum to at most the quota, buckets
//! start empty when resized).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cms_bookie::metadata::layout::Layout;
use cms_bookie::metadata::{CreateMode, Expected, MetadataError, MetadataStore, join};
use cms_client::proto::pulsar::ServerError;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota as GQuota, RateLimiter};
use tracing::{debug, info, warn};

use crate::quota::{Quotas, Scope, Usage, UsageReport, check_count, check_size};
use crate::tenancy::{NamespacePolicies, TenantInfo, namespace_path, tenant_path};
use crate::topic_name::TopicName;
use crate::topics::{Topic, Topics};

/// Period of usage reports and bucket resizing, in milliseconds.
pub const REPORT_INTERVAL_MS: u64 = 1_000;

/// Separates the topic from the subscription in the key of a
/// subscription dispatch bucket (`ds:<topic><SEP><subscription>`); neither
/// name holds a control character.
const SUB_SEP: char = '\u{1}';

/// A refusal: the Pulsar error class and the message.
pub type Refusal = (ServerError, String);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

struct Limiter {
    limiter: DefaultDirectRateLimiter,
    burst: u32,
}

impl Limiter {
    /// A bucket of `rate` per second holding a tenth of a second, empty at
    /// start (a resize never hands out a fresh burst).
    fn new(rate: u64) -> Limiter {
        let r = NonZeroU32::new(u32::try_from(rate).unwrap_or(u32::MAX).max(1))
            .unwrap_or(NonZeroU32::MIN);
        let burst = (r.get() / 10).max(1);
        let b = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        let limiter = RateLimiter::direct(GQuota::per_second(r).allow_burst(b));
        let _ = limiter.check_n(b);
        Limiter { limiter, burst }
    }

    /// Takes up to `*owed`; Some(wait) when the bucket is empty.
    fn take(&self, owed: &mut u64) -> Option<Duration> {
        while *owed > 0 {
            let chunk = u32::try_from(*owed).unwrap_or(u32::MAX).min(self.burst);
            let n = NonZeroU32::new(chunk).unwrap_or(NonZeroU32::MIN);
            match self.limiter.check_n(n) {
                Ok(Ok(())) => *owed -= u64::from(chunk),
                Ok(Err(not_until)) => {
                    return Some(not_until.wait_time_from(DefaultClock::default().now()));
                }
                Err(_) => *owed = 0,
            }
        }
        None
    }
}

#[derive(Default)]
struct Limiters {
    rate: (Option<u64>, Option<u64>),
    msgs: Option<Limiter>,
    bytes: Option<Limiter>,
}

/// A publish-rate bucket (messages and bytes per second) whose rates can
/// change; shared by every producer of its tenant / namespace / topic.
#[derive(Default)]
pub struct Bucket {
    inner: Mutex<Arc<Limiters>>,
}

impl Bucket {
    /// Sets the rates (None = unlimited); a change starts empty buckets.
    pub fn set(&self, msgs: Option<u64>, bytes: Option<u64>) {
        let mut g = lock(&self.inner);
        if g.rate == (msgs, bytes) {
            return;
        }
        *g = Arc::new(Limiters {
            rate: (msgs, bytes),
            msgs: msgs.map(Limiter::new),
            bytes: bytes.map(Limiter::new),
        });
    }

    /// The rates now.
    pub fn rates(&self) -> (Option<u64>, Option<u64>) {
        lock(&self.inner).rate
    }

    fn current(&self) -> Arc<Limiters> {
        lock(&self.inner).clone()
    }
}

/// What one SEND still owes one bucket.
pub struct Charge {
    bucket: Arc<Bucket>,
    msgs: u64,
    bytes: u64,
}

/// Pays what `charges` owe; the paid ones are removed. Some(wait) when a
/// bucket is empty: the connection reads nothing until then and pays again.
pub fn pay(charges: &mut Vec<Charge>) -> Option<Duration> {
    while let Some(c) = charges.first_mut() {
        let l = c.bucket.current();
        if let Some(m) = &l.msgs
            && let Some(w) = m.take(&mut c.msgs)
        {
            return Some(w);
        }
        c.msgs = 0;
        if let Some(b) = &l.bytes
            && let Some(w) = b.take(&mut c.bytes)
        {
            return Some(w);
        }
        charges.remove(0);
    }
    None
}

#[derive(Default)]
struct Counters {
    producers: u64,
    consumers: u64,
    /// Connection id → handles of this scope on it.
    conns: HashMap<u64, u32>,
    published_msgs: u64,
    published_bytes: u64,
    dispatched_msgs: u64,
    dispatched_bytes: u64,
    last: [u64; 4],
    rates: [u64; 4],
    storage_bytes: u64,
}

impl Counters {
    fn usage(&self) -> Usage {
        Usage {
            publish_rate_in_msgs: self.rates[0],
            publish_rate_in_bytes: self.rates[1],
            dispatch_rate_in_msgs: self.rates[2],
            dispatch_rate_in_bytes: self.rates[3],
            storage_bytes: self.storage_bytes,
            max_producers: self.producers,
            max_consumers: self.consumers,
            max_connections: self.conns.len() as u64,
            ..Usage::default()
        }
    }

    fn idle(&self) -> bool {
        self.producers == 0 && self.consumers == 0 && self.conns.is_empty() && self.rates == [0; 4]
    }
}

impl Inner {
    /// Applies `f` to the usage counters of `topic`'s tenant and of its
    /// namespace, creating them on first use.
    fn count(&mut self, topic: &TopicName, f: impl Fn(&mut Counters)) {
        apply(&mut self.tenants, &topic.tenant, &f);
        let key = &mut self.key_buf;
        key.clear();
        key.push_str(&topic.tenant);
        key.push('/');
        key.push_str(&topic.namespace);
        apply(&mut self.namespaces, key, &f);
    }
}

/// Applies `f` to the counters under `key`, inserted (default) when absent;
/// the key is copied only then.
fn apply(map: &mut HashMap<String, Counters>, key: &str, f: &impl Fn(&mut Counters)) {
    match map.get_mut(key) {
        Some(c) => f(c),
        None => f(map.entry(key.to_owned()).or_default()),
    }
}

/// Backlog-quota state of a loaded topic.
#[derive(Debug, Clone)]
pub struct Blocked {
    /// `producer_request_hold` or `producer_exception`.
    pub policy: String,
    /// Why (names the quota and its value).
    pub reason: String,
}

#[derive(Default)]
struct Inner {
    tenants: HashMap<String, Counters>,
    namespaces: HashMap<String, Counters>,
    /// Reused to build `tenant/namespace` lookup keys: counting a publish
    /// or a dispatch allocates nothing once its tenant and namespace have
    /// counters (it runs once per message).
    key_buf: String,
    /// Fresh reports of every broker (this one included), by broker id.
    reports: BTreeMap<String, UsageReport>,
    /// `t:<tenant>`, `n:<tenant/ns>`, `p:<topic>`.
    buckets: HashMap<String, Arc<Bucket>>,
    blocked: HashMap<String, Blocked>,
    /// Loaded topic → its `producer_request_hold` backlog limit (None
    /// stored when the policy is something else or unset).
    hold_limits: HashMap<TopicName, Option<u64>>,
    /// Scopes over `storageBytes` (`t:..` / `n:..`) → reason.
    storage_over: HashMap<String, String>,
    /// Loaded topics over a `message_age` quota with the
    /// `producer_request_hold` policy (measured every interval).
    age_held: HashSet<TopicName>,
    /// Topic → (oldest unacknowledged position, its publish time in ms):
    /// the entry is read again only when the position moves.
    age_cache: HashMap<String, (crate::managed_ledger::Position, Option<u64>)>,
}

/// How a `consumer_backlog_eviction` drops the oldest backlog.
enum Evict {
    /// Move `cursor` (mark-delete at the position) past about this many
    /// bytes (`destination_storage`).
    Size(String, crate::managed_ledger::Position, u64),
    /// Expire every subscription's messages older than this many seconds
    /// (`message_age`).
    Age(u64),
}

/// The broker's quota state (one per broker, in `BrokerState`).
pub struct QuotaService {
    broker_id: String,
    store: Arc<dyn MetadataStore>,
    layout: Layout,
    inner: Mutex<Inner>,
    node_created: AtomicBool,
}

impl std::fmt::Debug for QuotaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaService")
            .field("broker_id", &self.broker_id)
            .finish_non_exhaustive()
    }
}

/// Which handle an [`Admission`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A producer.
    Producer,
    /// A consumer.
    Consumer,
}

/// A producer's or consumer's place in its tenant's and namespace's counts;
/// given back on drop.
pub struct Admission {
    svc: Arc<QuotaService>,
    tenant: String,
    namespace: String,
    conn: u64,
    kind: Kind,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("namespace", &self.namespace)
            .field("kind", &self.kind)
            .finish()
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut g = lock(&self.svc.inner);
        let g = &mut *g;
        for c in [
            g.tenants.get_mut(&self.tenant),
            g.namespaces.get_mut(&self.namespace),
        ]
        .into_iter()
        .flatten()
        {
            match self.kind {
                Kind::Producer => c.producers = c.producers.saturating_sub(1),
                Kind::Consumer => c.consumers = c.consumers.saturating_sub(1),
            }
            if let Some(n) = c.conns.get_mut(&self.conn) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    c.conns.remove(&self.conn);
                }
            }
        }
    }
}

/// The quotas of tenant `t` (None if it has none or does not exist).
pub async fn tenant_quotas(
    store: &dyn MetadataStore,
    layout: &Layout,
    t: &str,
) -> Result<Quotas, MetadataError> {
    match store.get(&tenant_path(layout, t)).await {
        Ok((d, _)) if d.is_empty() => Ok(Quotas::default()),
        Ok((d, _)) => Ok(serde_json::from_slice::<TenantInfo>(&d)
            .ok()
            .and_then(|i| i.quotas)
            .unwrap_or_default()),
        Err(MetadataError::NoNode(_)) => Ok(Quotas::default()),
        Err(e) => Err(e),
    }
}

/// The policies of namespace `t/ns` (default if absent).
pub async fn ns_policies(
    store: &dyn MetadataStore,
    layout: &Layout,
    t: &str,
    ns: &str,
) -> Result<NamespacePolicies, MetadataError> {
    match store.get(&namespace_path(layout, t, ns)).await {
        Ok((d, _)) if d.is_empty() => Ok(NamespacePolicies::default()),
        Ok((d, _)) => Ok(serde_json::from_slice(&d).unwrap_or_default()),
        Err(MetadataError::NoNode(_)) => Ok(NamespacePolicies::default()),
        Err(e) => Err(e),
    }
}

async fn count_children(store: &dyn MetadataStore, path: &str) -> Result<u64, MetadataError> {
    match store.children(path).await {
        Ok(c) => Ok(c.len() as u64),
        Err(MetadataError::NoNode(_)) => Ok(0),
        Err(e) => Err(e),
    }
}

async fn namespaces_of(
    store: &dyn MetadataStore,
    layout: &Layout,
    t: &str,
) -> Result<Vec<String>, MetadataError> {
    match store.children(&join(&layout.namespaces(), t)).await {
        Ok(c) => Ok(c),
        Err(MetadataError::NoNode(_)) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

fn topics_dir(layout: &Layout, t: &str, ns: &str) -> String {
    join(&join(&join(&layout.managed_ledgers(), t), ns), "persistent")
}

/// Queues folder of namespace `t/ns` (as `admin::queues` stores them).
pub fn queues_dir(layout: &Layout, t: &str, ns: &str) -> String {
    let admin = cms_bookie::metadata::parent_of(&layout.tenants())
        .unwrap_or("/")
        .to_string();
    join(&join(&join(&admin, "queues"), t), ns)
}

/// Children of `dir(layout, t, ns)` for `t/ns` and summed over tenant `t`'s
/// namespaces.
async fn counts_in(
    store: &dyn MetadataStore,
    layout: &Layout,
    t: &str,
    ns: &str,
    dir: fn(&Layout, &str, &str) -> String,
) -> Result<(u64, u64), MetadataError> {
    let mut tenant = 0;
    let mut mine = 0;
    for n in namespaces_of(store, layout, t).await? {
        let c = count_children(store, &dir(layout, t, &n)).await?;
        tenant += c;
        if n == ns {
            mine = c;
        }
    }
    Ok((mine, tenant))
}

/// Stored topics of `t/ns` and of tenant `t`.
pub async fn topic_counts(
    store: &dyn MetadataStore,
    layout: &Layout,
    t: &str,
    ns: &str,
) -> Result<(u64, u64), MetadataError> {
    counts_in(store, layout, t, ns, topics_dir).await
}

/// Queues of `t/ns` and of tenant `t`.
pub async fn queue_counts(
    store: &dyn MetadataStore,
    layout: &Layout,
    t: &str,
    ns: &str,
) -> Result<(u64, u64), MetadataError> {
    counts_in(store, layout, t, ns, queues_dir).await
}

/// Whether one more topic may be created in `t/ns`: the namespace's
/// `maxTopics` and Pulsar `max_topics_per_namespace`, the tenant's
/// `maxTopics`. The error names the quota.
pub async fn check_new_topic(
    store: &dyn MetadataStore,
    layout: &Layout,
    t: &str,
    ns: &str,
) -> Result<(), String> {
    let fail = |e: MetadataError| format!("checking topic quotas: {e}");
    let tq = tenant_quotas(store, layout, t).await.map_err(fail)?;
    let p = ns_policies(store, layout, t, ns).await.map_err(fail)?;
    let nq = p.quotas.unwrap_or_default();
    if tq.max_topics.is_none() && nq.max_topics.is_none() && p.max_topics_per_namespace.is_none() {
        return Ok(());
    }
    let (in_ns, in_tenant) = topic_counts(store, layout, t, ns).await.map_err(fail)?;
    let nsname = format!("{t}/{ns}");
    check_count(Scope::Namespace(&nsname), "maxTopics", nq.max_topics, in_ns)?;
    // Pulsar's policy; 0 means unlimited there.
    check_count(
        Scope::Namespace(&nsname),
        "maxTopicsPerNamespace",
        p.max_topics_per_namespace.filter(|&m| m > 0),
        in_ns,
    )?;
    check_count(Scope::Tenant(t), "maxTopics", tq.max_topics, in_tenant)
}

/// Whether one more queue may be created in `t/ns` (`maxQueues`).
pub async fn check_new_queue(
    store: &dyn MetadataStore,
    layout: &Layout,
    t: &str,
    ns: &str,
) -> Result<(), String> {
    let fail = |e: MetadataError| format!("checking queue quotas: {e}");
    let tq = tenant_quotas(store, layout, t).await.map_err(fail)?;
    let nq = ns_policies(store, layout, t, ns)
        .await
        .map_err(fail)?
        .quotas
        .unwrap_or_default();
    if tq.max_queues.is_none() && nq.max_queues.is_none() {
        return Ok(());
    }
    let (in_ns, in_tenant) = queue_counts(store, layout, t, ns).await.map_err(fail)?;
    check_count(
        Scope::Namespace(&format!("{t}/{ns}")),
        "maxQueues",
        nq.max_queues,
        in_ns,
    )?;
    check_count(Scope::Tenant(t), "maxQueues", tq.max_queues, in_tenant)
}

impl QuotaService {
    /// A service for broker `broker_id`.
    pub fn new(broker_id: String, store: Arc<dyn MetadataStore>, layout: Layout) -> Arc<Self> {
        Arc::new(QuotaService {
            broker_id,
            store,
            layout,
            inner: Mutex::new(Inner::default()),
            node_created: AtomicBool::new(false),
        })
    }

    fn usage_dir(&self) -> String {
        join(self.layout.root(), "quota-usage")
    }

    /// Other brokers' reported usage of one scope (own report left out).
    fn remote(&self, g: &Inner, pick: impl Fn(&UsageReport) -> Option<Usage>) -> Usage {
        let now = now_ms();
        let mut sum = Usage::default();
        for (id, r) in &g.reports {
            if *id == self.broker_id || now.saturating_sub(r.at_ms) > crate::quota::REPORT_STALE_MS
            {
                continue;
            }
            if let Some(u) = pick(r) {
                sum.add(&u);
            }
        }
        sum
    }

    /// Cluster-wide usage of tenant `t` (counts from the reports, own live
    /// counts; topics and queues from the store).
    pub async fn tenant_usage(&self, t: &str) -> Result<Usage, MetadataError> {
        let mut u = {
            let g = lock(&self.inner);
            let mut u = self.remote(&g, |r| r.tenants.get(t).copied());
            if let Some(c) = g.tenants.get(t) {
                u.add(&c.usage());
            }
            u
        };
        for n in namespaces_of(&*self.store, &self.layout, t).await? {
            u.max_topics += count_children(&*self.store, &topics_dir(&self.layout, t, &n)).await?;
            u.max_queues += count_children(&*self.store, &queues_dir(&self.layout, t, &n)).await?;
        }
        Ok(u)
    }

    /// Cluster-wide usage of namespace `t/ns`.
    pub async fn namespace_usage(&self, t: &str, ns: &str) -> Result<Usage, MetadataError> {
        let key = format!("{t}/{ns}");
        let mut u = {
            let g = lock(&self.inner);
            let mut u = self.remote(&g, |r| r.namespaces.get(&key).copied());
            if let Some(c) = g.namespaces.get(&key) {
                u.add(&c.usage());
            }
            u
        };
        u.max_topics = count_children(&*self.store, &topics_dir(&self.layout, t, ns)).await?;
        u.max_queues = count_children(&*self.store, &queues_dir(&self.layout, t, ns)).await?;
        Ok(u)
    }

    /// Admits a producer (`kind` Producer) or consumer on connection `conn`
    /// for `topic`: tenant / namespace counts, connections, storage and
    /// backlog quotas, Pulsar's per-topic policies (`per_topic`: the
    /// topic's current producers or consumers, `per_sub`: consumers of the
    /// subscription and whether it is new with the subscription count).
    pub async fn admit(
        self: &Arc<Self>,
        conn: u64,
        topic: &TopicName,
        kind: Kind,
        per_topic: u64,
        per_sub: Option<(u64, bool, u64)>,
    ) -> Result<Admission, Refusal> {
        let (t, ns) = (topic.tenant.as_str(), topic.namespace.as_str());
        let unavailable = |e: MetadataError| {
            (
                ServerError::ServiceNotReady,
                format!("checking quotas: {e}"),
            )
        };
        let tq = tenant_quotas(&*self.store, &self.layout, t)
            .await
            .map_err(unavailable)?;
        let p = ns_policies(&*self.store, &self.layout, t, ns)
            .await
            .map_err(unavailable)?;
        let nq = p.quotas.unwrap_or_default();
        let key = format!("{t}/{ns}");
        let not_allowed = |m: String| (ServerError::NotAllowedError, m);
        // Pulsar's per-topic policies (0 = unlimited there).
        match kind {
            Kind::Producer => {
                if let Err(m) = check_count(
                    Scope::Namespace(&key),
                    "maxProducersPerTopic",
                    p.max_producers_per_topic.filter(|&m| m > 0),
                    per_topic,
                ) {
                    return Err((ServerError::ProducerBusy, format!("topic {topic}: {m}")));
                }
                let g = lock(&self.inner);
                if let Some(b) = g.blocked.get(&topic.to_string()) {
                    // Pulsar: ...Error for hold, ...Exception for
                    // producer_exception; both final at creation (G7).
                    let code = if b.policy == "producer_request_hold" {
                        ServerError::ProducerBlockedQuotaExceededError
                    } else {
                        ServerError::ProducerBlockedQuotaExceededException
                    };
                    return Err((code, b.reason.clone()));
                }
                for (scope, k) in [("t:", t.to_string()), ("n:", key.clone())] {
                    if let Some(r) = g.storage_over.get(&format!("{scope}{k}")) {
                        return Err((
                            ServerError::ProducerBlockedQuotaExceededException,
                            r.clone(),
                        ));
                    }
                }
            }
            Kind::Consumer => {
                if let Err(m) = check_count(
                    Scope::Namespace(&key),
                    "maxConsumersPerTopic",
                    p.max_consumers_per_topic.filter(|&m| m > 0),
                    per_topic,
                ) {
                    return Err((ServerError::ConsumerBusy, format!("topic {topic}: {m}")));
                }
                if let Some((on_sub, new_sub, subs)) = per_sub {
                    if let Err(m) = check_count(
                        Scope::Namespace(&key),
                        "maxConsumersPerSubscription",
                        p.max_consumers_per_subscription.filter(|&m| m > 0),
                        on_sub,
                    ) {
                        return Err((ServerError::ConsumerBusy, format!("topic {topic}: {m}")));
                    }
                    if new_sub
                        && let Err(m) = check_count(
                            Scope::Namespace(&key),
                            "maxSubscriptionsPerTopic",
                            p.max_subscriptions_per_topic.filter(|&m| m > 0),
                            subs,
                        )
                    {
                        return Err(not_allowed(format!("topic {topic}: {m}")));
                    }
                }
            }
        }
        let mut g = lock(&self.inner);
        let remote_t = self.remote(&g, |r| r.tenants.get(t).copied());
        let remote_n = self.remote(&g, |r| r.namespaces.get(&key).copied());
        let field = match kind {
            Kind::Producer => "maxProducers",
            Kind::Consumer => "maxConsumers",
        };
        let checks: [(Scope<'_>, &Quotas, Usage, Option<&Counters>); 2] = [
            (Scope::Tenant(t), &tq, remote_t, g.tenants.get(t)),
            (
                Scope::Namespace(&key),
                &nq,
                remote_n,
                g.namespaces.get(&key),
            ),
        ];
        for (scope, q, remote, local) in checks {
            let (lp, lc, lconn, has_conn) = local.map_or((0, 0, 0, false), |c| {
                (
                    c.producers,
                    c.consumers,
                    c.conns.len() as u64,
                    c.conns.contains_key(&conn),
                )
            });
            let (limit, in_use) = match kind {
                Kind::Producer => (q.max_producers, lp + remote.max_producers),
                Kind::Consumer => (q.max_consumers, lc + remote.max_consumers),
            };
            check_count(scope, field, limit, in_use).map_err(not_allowed)?;
            if !has_conn {
                check_count(
                    scope,
                    "maxConnections",
                    q.max_connections,
                    lconn + remote.max_connections,
                )
                .map_err(not_allowed)?;
            }
        }
        let g = &mut *g;
        for c in [
            g.tenants.entry(t.to_string()).or_default(),
            g.namespaces.entry(key.clone()).or_default(),
        ] {
            match kind {
                Kind::Producer => c.producers += 1,
                Kind::Consumer => c.consumers += 1,
            }
            *c.conns.entry(conn).or_default() += 1;
        }
        Ok(Admission {
            svc: self.clone(),
            tenant: t.to_string(),
            namespace: key,
            conn,
            kind,
        })
    }

    /// The buckets a producer on `topic` pays into.
    pub async fn buckets_for(&self, topic: &TopicName) -> Vec<Arc<Bucket>> {
        self.buckets(vec![
            format!("t:{}", topic.tenant),
            format!("n:{}/{}", topic.tenant, topic.namespace),
            format!("p:{topic}"),
        ])
        .await
    }

    /// Charges for one SEND of `msgs` messages and `bytes` bytes, counted
    /// in the usage of `topic`'s tenant and namespace.
    pub fn on_publish(
        &self,
        topic: &TopicName,
        buckets: &[Arc<Bucket>],
        msgs: u64,
        bytes: u64,
    ) -> Vec<Charge> {
        lock(&self.inner).count(topic, |c| {
            c.published_msgs += msgs;
            c.published_bytes += bytes;
        });
        buckets
            .iter()
            .filter(|b| b.rates() != (None, None))
            .map(|b| Charge {
                bucket: b.clone(),
                msgs,
                bytes,
            })
            .collect()
    }

    /// The buckets a consumer of subscription `sub` on `topic` pays into
    /// for dispatch: tenant, namespace, Pulsar's per-topic
    /// `topicDispatchRate` and per-subscription `subscriptionDispatchRate`
    /// (one bucket per subscription, shared by its consumers on this broker).
    pub async fn dispatch_buckets_for(&self, topic: &TopicName, sub: &str) -> Vec<Arc<Bucket>> {
        self.buckets(vec![
            format!("dt:{}", topic.tenant),
            format!("dn:{}/{}", topic.tenant, topic.namespace),
            format!("dp:{topic}"),
            format!("ds:{topic}{SUB_SEP}{sub}"),
        ])
        .await
    }

    /// The byte budget of one cursor read of a subscription paying into
    /// `buckets` ([`crate::subscription::ReadBudget`]): `slice_ms`
    /// milliseconds of the tightest byte rate among them (the broker's
    /// `dispatch_read_budget_ms`, at most the tenth of a second each bucket
    /// lets through at once, see `Limiter::new`), at least 1 KiB; `None`
    /// when none has a byte rate.
    pub fn read_budget(buckets: &[Arc<Bucket>], slice_ms: u64) -> Option<usize> {
        buckets
            .iter()
            .filter_map(|b| b.rates().1)
            .min()
            .map(|rate| {
                let bytes = u128::from(rate) * u128::from(slice_ms.clamp(1, 100)) / 1000;
                usize::try_from(bytes).unwrap_or(usize::MAX).max(1024)
            })
    }

    /// Counts a dispatch (for usage) and returns what it owes `buckets`.
    pub fn on_dispatch(
        &self,
        topic: &TopicName,
        buckets: &[Arc<Bucket>],
        msgs: u64,
        bytes: u64,
    ) -> Vec<Charge> {
        self.count_dispatch(topic, msgs, bytes);
        buckets
            .iter()
            .filter(|b| b.rates() != (None, None))
            .map(|b| Charge {
                bucket: b.clone(),
                msgs,
                bytes,
            })
            .collect()
    }

    fn count_dispatch(&self, topic: &TopicName, msgs: u64, bytes: u64) {
        lock(&self.inner).count(topic, |c| {
            c.dispatched_msgs += msgs;
            c.dispatched_bytes += bytes;
        });
    }

    /// Whether `topic`'s producers are held (`producer_request_hold`),
    /// measured now: the backlog of its slowest subscription against the
    /// limit last read from the namespace policies (or the policies the
    /// topic was loaded with, before the first interval).
    pub fn is_held(&self, topic: &Topic) -> bool {
        let (limit, age_held) = {
            let g = lock(&self.inner);
            (
                g.hold_limits.get(&topic.name).copied(),
                g.age_held.contains(&topic.name),
            )
        };
        if age_held {
            return true;
        }
        let limit = match limit {
            Some(l) => l,
            None => topic
                .policies
                .backlog_quota_map
                .get("destination_storage")
                .filter(|q| q.policy == "producer_request_hold")
                .and_then(|q| u64::try_from(q.limit_size).ok()),
        };
        let Some(limit) = limit else {
            return false;
        };
        topic
            .ml
            .slowest_cursor_backlog()
            .is_some_and(|(_, bytes, _)| bytes > limit)
    }

    /// One interval: rates, storage, backlog quotas, the report, the other
    /// brokers' reports, bucket sizes.
    pub async fn tick(&self, topics: &Topics, elapsed: Duration) {
        let secs = elapsed.as_secs_f64().max(0.001);
        let loaded: Vec<Arc<Topic>> = topics
            .loaded()
            .iter()
            .filter_map(|n| topics.get_loaded(n))
            .collect();
        // Storage per scope on this broker.
        let mut storage_t: HashMap<String, u64> = HashMap::new();
        let mut storage_n: HashMap<String, u64> = HashMap::new();
        for t in &loaded {
            let size: u64 = t.ml.ledgers().ledgers().iter().map(|l| l.size_bytes).sum();
            *storage_t.entry(t.name.tenant.clone()).or_default() += size;
            *storage_n
                .entry(format!("{}/{}", t.name.tenant, t.name.namespace))
                .or_default() += size;
        }
        let report = {
            let mut g = lock(&self.inner);
            let g = &mut *g;
            let mut report = UsageReport {
                at_ms: now_ms(),
                ..UsageReport::default()
            };
            for (map, storage, out) in [
                (&mut g.tenants, &storage_t, &mut report.tenants),
                (&mut g.namespaces, &storage_n, &mut report.namespaces),
            ] {
                for (k, c) in map.iter_mut() {
                    let now = [
                        c.published_msgs,
                        c.published_bytes,
                        c.dispatched_msgs,
                        c.dispatched_bytes,
                    ];
                    for ((rate, n), last) in c.rates.iter_mut().zip(now).zip(c.last) {
                        *rate = (n.saturating_sub(last) as f64 / secs).round() as u64;
                    }
                    c.last = now;
                    c.storage_bytes = storage.get(k).copied().unwrap_or(0);
                }
                for (k, s) in storage {
                    map.entry(k.clone()).or_default().storage_bytes = *s;
                }
                map.retain(|_, c| !c.idle() || c.storage_bytes > 0);
                for (k, c) in map.iter() {
                    out.insert(k.clone(), c.usage());
                }
            }
            report
        };
        self.publish(&report).await;
        self.read_reports(report).await;
        self.resize_buckets(&loaded).await;
        self.backlog(topics, &loaded).await;
    }

    async fn publish(&self, report: &UsageReport) {
        let Ok(data) = serde_json::to_vec(report) else {
            return;
        };
        let path = join(&self.usage_dir(), &self.broker_id);
        if !self.node_created.load(Ordering::Acquire) {
            if let Err(e) = self.store.create_all(&self.usage_dir()).await {
                warn!(error = %e, "creating the quota usage folder");
                return;
            }
            match self.store.create(&path, &data, CreateMode::Ephemeral).await {
                Ok(_) | Err(MetadataError::NodeExists(_)) => {
                    self.node_created.store(true, Ordering::Release);
                }
                Err(e) => {
                    warn!(error = %e, "creating the quota usage node");
                    return;
                }
            }
        }
        match self.store.set(&path, &data, Expected::Any).await {
            Ok(_) => {}
            Err(MetadataError::NoNode(_)) => self.node_created.store(false, Ordering::Release),
            Err(e) => debug!(error = %e, "writing the quota usage node"),
        }
    }

    async fn read_reports(&self, own: UsageReport) {
        let mut reports = BTreeMap::new();
        if let Ok(ids) = self.store.children(&self.usage_dir()).await {
            for id in ids {
                if id == self.broker_id {
                    continue;
                }
                if let Ok((d, _)) = self.store.get(&join(&self.usage_dir(), &id)).await
                    && let Ok(r) = serde_json::from_slice::<UsageReport>(&d)
                {
                    reports.insert(id, r);
                }
            }
        }
        reports.insert(self.broker_id.clone(), own);
        lock(&self.inner).reports = reports;
    }

    async fn resize_buckets(&self, loaded: &[Arc<Topic>]) {
        let keys: Vec<String> = lock(&self.inner).buckets.keys().cloned().collect();
        self.resize(keys).await;
        // Forget topic buckets of topics no longer loaded.
        let live: HashSet<String> = loaded.iter().map(|t| t.name.to_string()).collect();
        lock(&self.inner).buckets.retain(|k, b| {
            let topic = k
                .strip_prefix("p:")
                .or_else(|| k.strip_prefix("dp:"))
                .or_else(|| {
                    k.strip_prefix("ds:")
                        .map(|r| r.split_once(SUB_SEP).map_or(r, |(t, _)| t))
                });
            topic.is_none_or(|t| live.contains(t)) || Arc::strong_count(b) > 1
        });
    }

    /// Sizes the buckets `keys` from the stored quotas and the reports.
    async fn resize(&self, keys: Vec<String>) {
        let mut tq_cache: HashMap<String, Quotas> = HashMap::new();
        let mut np_cache: HashMap<String, NamespacePolicies> = HashMap::new();
        let now = now_ms();
        for k in keys {
            // `d` prefixes the dispatch buckets of the same scopes.
            let dispatch = k.starts_with('d');
            let scope = k.strip_prefix('d').unwrap_or(&k);
            let (msgs, bytes) = if let Some(t) = scope.strip_prefix("t:") {
                let q = match tq_cache.get(t) {
                    Some(q) => *q,
                    None => match tenant_quotas(&*self.store, &self.layout, t).await {
                        Ok(q) => {
                            tq_cache.insert(t.to_string(), q);
                            q
                        }
                        Err(_) => continue,
                    },
                };
                let g = lock(&self.inner);
                crate::quota::rate_shares(&q, dispatch, &g.reports, now, &self.broker_id, |r| {
                    r.tenants.get(t)
                })
            } else if let Some(n) = scope.strip_prefix("n:") {
                let Some((t, ns)) = n.split_once('/') else {
                    continue;
                };
                let p = match np_cache.get(n) {
                    Some(p) => p.clone(),
                    None => match ns_policies(&*self.store, &self.layout, t, ns).await {
                        Ok(p) => {
                            np_cache.insert(n.to_string(), p.clone());
                            p
                        }
                        Err(_) => continue,
                    },
                };
                let q = p.quotas.unwrap_or_default();
                let g = lock(&self.inner);
                crate::quota::rate_shares(&q, dispatch, &g.reports, now, &self.broker_id, |r| {
                    r.namespaces.get(n)
                })
            } else if let Some((name, per_sub)) =
                scope.strip_prefix("p:").map(|n| (n, false)).or_else(|| {
                    scope
                        .strip_prefix("s:")
                        .and_then(|r| r.split_once(SUB_SEP))
                        .map(|(n, _)| (n, true))
                })
            {
                // Pulsar's per-topic publish / dispatch rate and
                // per-subscription dispatch rate of the namespace policy.
                let Ok(tn) = TopicName::parse(name) else {
                    continue;
                };
                let n = format!("{}/{}", tn.tenant, tn.namespace);
                let p = match np_cache.get(&n) {
                    Some(p) => p.clone(),
                    None => {
                        match ns_policies(&*self.store, &self.layout, &tn.tenant, &tn.namespace)
                            .await
                        {
                            Ok(p) => {
                                np_cache.insert(n.clone(), p.clone());
                                p
                            }
                            Err(_) => continue,
                        }
                    }
                };
                let pos = |v: i64| u64::try_from(v).ok().filter(|&v| v > 0);
                if dispatch {
                    // Per period; spread evenly over its seconds.
                    let rates = if per_sub {
                        &p.subscription_dispatch_rate
                    } else {
                        &p.topic_dispatch_rate
                    };
                    let r = rates.values().next().copied();
                    let per_s = |v: i64, r: &crate::tenancy::DispatchRate| {
                        pos(v).map(|v| (v / u64::from(r.rate_period_in_second.max(1))).max(1))
                    };
                    (
                        r.and_then(|r| per_s(r.dispatch_throttling_rate_in_msg, &r)),
                        r.and_then(|r| per_s(r.dispatch_throttling_rate_in_byte, &r)),
                    )
                } else {
                    let r = p.publish_max_message_rate.values().next().copied();
                    (
                        r.and_then(|r| pos(r.publish_throttling_rate_in_msg)),
                        r.and_then(|r| pos(r.publish_throttling_rate_in_byte)),
                    )
                }
            } else {
                continue;
            };
            let bucket = lock(&self.inner).buckets.get(&k).cloned();
            if let Some(b) = bucket {
                if b.rates() != (msgs, bytes) {
                    debug!(scope = %k, ?msgs, ?bytes, "publish bucket resized");
                }
                b.set(msgs, bytes);
            }
        }
    }

    /// The buckets of `keys`, new ones sized at once (not at the next
    /// interval: a producer never starts unthrottled).
    async fn buckets(&self, keys: Vec<String>) -> Vec<Arc<Bucket>> {
        let (buckets, new) = {
            let mut g = lock(&self.inner);
            let mut new = Vec::new();
            let buckets = keys
                .iter()
                .map(|k| {
                    g.buckets
                        .entry(k.clone())
                        .or_insert_with(|| {
                            new.push(k.clone());
                            Arc::default()
                        })
                        .clone()
                })
                .collect();
            (buckets, new)
        };
        if !new.is_empty() {
            self.resize(new).await;
        }
        buckets
    }

    async fn backlog(&self, topics: &Topics, loaded: &[Arc<Topic>]) {
        let mut blocked = HashMap::new();
        let mut hold_limits = HashMap::new();
        let mut age_held = HashSet::new();
        let mut np_cache: HashMap<String, NamespacePolicies> = HashMap::new();
        for t in loaded {
            let n = format!("{}/{}", t.name.tenant, t.name.namespace);
            let p = match np_cache.get(&n) {
                Some(p) => p.clone(),
                None => match ns_policies(
                    &*self.store,
                    &self.layout,
                    &t.name.tenant,
                    &t.name.namespace,
                )
                .await
                {
                    Ok(p) => {
                        np_cache.insert(n.clone(), p.clone());
                        p
                    }
                    Err(_) => continue,
                },
            };
            let q = p.backlog_quota_map.get("destination_storage");
            hold_limits.insert(
                t.name.clone(),
                q.filter(|q| q.policy == "producer_request_hold")
                    .and_then(|q| u64::try_from(q.limit_size).ok()),
            );
            // Over `destination_storage`: (policy, reason, eviction).
            let mut over: Vec<(String, String, Evict)> = Vec::new();
            if let Some(q) = q
                && let Ok(limit) = u64::try_from(q.limit_size)
                && let Some((cursor, bytes, md)) = t.ml.slowest_cursor_backlog()
                && bytes > limit
            {
                let reason = format!(
                    "topic {}: backlog quota destination_storage limitSize={limit} exceeded \
                     ({bytes} bytes behind subscription {cursor}), policy {}",
                    t.name, q.policy
                );
                over.push((
                    q.policy.clone(),
                    reason,
                    Evict::Size(cursor, md, bytes - limit),
                ));
            }
            if let Some(q) = p.backlog_quota_map.get("message_age")
                && q.limit_time > 0
                && let Some((cursor, age)) = self.oldest_age(t, q.limit_time).await
            {
                let reason = format!(
                    "topic {}: backlog quota message_age limitTime={} exceeded (oldest \
                     unacknowledged message of subscription {cursor} is {age} s old), policy {}",
                    t.name, q.limit_time, q.policy
                );
                if q.policy == "producer_request_hold" {
                    age_held.insert(t.name.clone());
                }
                over.push((
                    q.policy.clone(),
                    reason,
                    Evict::Age(u64::try_from(q.limit_time).unwrap_or(u64::MAX)),
                ));
            }
            for (policy, reason, how) in over {
                match policy.as_str() {
                    "consumer_backlog_eviction" => match how {
                        Evict::Size(cursor, md, excess) => evict(t, &cursor, md, excess).await,
                        Evict::Age(limit_s) => evict_older(t, limit_s).await,
                    },
                    "producer_exception" => {
                        blocked.insert(
                            t.name.to_string(),
                            Blocked {
                                policy,
                                reason: reason.clone(),
                            },
                        );
                        if t.producers_connected().is_empty() {
                            continue;
                        }
                        info!(tenant = %t.name.tenant, namespace = %t.name.namespace, topic = %t.name, %reason, "backlog quota: disconnecting producers");
                        topics.unload(t, "backlog quota exceeded").await;
                        break;
                    }
                    _ => {
                        blocked
                            .entry(t.name.to_string())
                            .or_insert(Blocked { policy, reason });
                    }
                }
            }
        }
        // Unloaded blocked topics stay blocked until they load again and
        // are measured: a producer's re-creation loads the topic first.
        {
            let mut g = lock(&self.inner);
            let live: HashSet<String> = loaded.iter().map(|t| t.name.to_string()).collect();
            let keep: Vec<(String, Blocked)> = g
                .blocked
                .iter()
                .filter(|(k, b)| !live.contains(*k) && b.policy == "producer_exception")
                .map(|(k, b)| (k.clone(), b.clone()))
                .collect();
            blocked.extend(keep);
            g.blocked = blocked;
            g.hold_limits = hold_limits;
            g.age_held = age_held;
            g.age_cache.retain(|k, _| live.contains(k));
        }
        self.storage_quotas().await;
    }

    /// The subscription holding `t`'s oldest unacknowledged message and
    /// that message's age in seconds, when it is older than `limit_time`
    /// seconds (`message_age` quota). The publish time is read from the
    /// entry (once per position: cached while the position stays).
    async fn oldest_age(&self, t: &Arc<Topic>, limit_time: i64) -> Option<(String, u64)> {
        let (cursor, pos) = t.ml.oldest_unacked()?;
        let name = t.name.to_string();
        let cached = lock(&self.inner)
            .age_cache
            .get(&name)
            .filter(|(p, _)| *p == pos)
            .map(|(_, ms)| *ms);
        let published = match cached {
            Some(ms) => ms,
            None => match t.ml.publish_time_of(pos).await {
                Ok(ms) => {
                    lock(&self.inner).age_cache.insert(name, (pos, ms));
                    ms
                }
                Err(e) => {
                    debug!(topic = %t.name, position = %pos, error = %e, "message_age quota: reading the oldest entry");
                    return None;
                }
            },
        };
        crate::quota::age_over(limit_time, published, now_ms()).map(|age| (cursor, age))
    }

    /// Recomputes which tenants / namespaces are over `storageBytes`
    /// (cluster-wide, from the reports).
    async fn storage_quotas(&self) {
        let scopes: Vec<(String, String)> = {
            let g = lock(&self.inner);
            let mut s: HashSet<(String, String)> = HashSet::new();
            for r in g.reports.values() {
                for k in r.tenants.keys() {
                    s.insert(("t".into(), k.clone()));
                }
                for k in r.namespaces.keys() {
                    s.insert(("n".into(), k.clone()));
                }
            }
            s.into_iter().collect()
        };
        let mut over = HashMap::new();
        let now = now_ms();
        for (kind, k) in scopes {
            let limit = if kind == "t" {
                tenant_quotas(&*self.store, &self.layout, &k)
                    .await
                    .ok()
                    .and_then(|q| q.storage_bytes)
            } else {
                let Some((t, ns)) = k.split_once('/') else {
                    continue;
                };
                ns_policies(&*self.store, &self.layout, t, ns)
                    .await
                    .ok()
                    .and_then(|p| p.quotas)
                    .and_then(|q| q.storage_bytes)
            };
            let Some(limit) = limit else { continue };
            let used: u64 = {
                let g = lock(&self.inner);
                crate::quota::usage_by_broker(&g.reports, now, |r| {
                    if kind == "t" {
                        r.tenants.get(&k)
                    } else {
                        r.namespaces.get(&k)
                    }
                    .map(|u| u.storage_bytes)
                })
                .values()
                .sum()
            };
            let scope = if kind == "t" {
                Scope::Tenant(&k)
            } else {
                Scope::Namespace(&k)
            };
            if let Err(m) = check_size(scope, "storageBytes", Some(limit), used) {
                over.insert(format!("{kind}:{k}"), m);
            }
        }
        lock(&self.inner).storage_over = over;
    }
}

/// `consumer_backlog_eviction`: moves `cursor` of `t` past its oldest
/// entries, about `excess` bytes of them.
async fn evict(t: &Arc<Topic>, cursor: &str, md: crate::managed_ledger::Position, excess: u64) {
    let list = t.ml.ledgers();
    let (entries, size): (u64, u64) = list
        .ledgers()
        .iter()
        .fold((0, 0), |(e, s), l| (e + l.entries, s + l.size_bytes));
    let per_entry = size.checked_div(entries).unwrap_or(1).max(1);
    let k = excess.div_ceil(per_entry).max(1);
    let target = match crate::admin::topics::nth_entry_after(&list, md, k.saturating_add(1)) {
        Some(p) => crate::managed_ledger::io::SeekTarget::Position(p),
        None => crate::managed_ledger::io::SeekTarget::Latest,
    };
    let sub = t
        .subscriptions
        .get_or_open(
            &t.ml,
            cursor,
            crate::subscriptions::OpenAs::Durable(crate::managed_ledger::InitialPosition::Latest),
            crate::consumers::message_counter(),
            crate::subscription::SubscriptionConfig::default(),
        )
        .await;
    match sub {
        Ok(s) => match s.seek(target).await {
            Ok(()) => {
                info!(tenant = %t.name.tenant, namespace = %t.name.namespace, topic = %t.name, subscription = cursor, entries = k, "backlog quota: oldest backlog evicted")
            }
            Err(e) => warn!(topic = %t.name, subscription = cursor, error = %e, "backlog eviction"),
        },
        Err(e) => {
            warn!(topic = %t.name, subscription = cursor, error = %e, "backlog eviction: opening the subscription")
        }
    }
}

/// `consumer_backlog_eviction` of a `message_age` quota: every
/// subscription's messages older than `limit_s` seconds are expired (the
/// mark-delete moves past them, as the message TTL does).
async fn evict_older(t: &Arc<Topic>, limit_s: u64) {
    match t.ml.expire_messages(limit_s).await {
        Ok(moved) if !moved.is_empty() => {
            info!(tenant = %t.name.tenant, namespace = %t.name.namespace, topic = %t.name, subscriptions = ?moved, limit_time = limit_s, "backlog quota: messages over the age limit evicted")
        }
        Ok(_) => {}
        Err(e) => warn!(topic = %t.name, error = %e, "backlog eviction by age"),
    }
}

/// Runs [`QuotaService::tick`] every [`REPORT_INTERVAL_MS`] until shutdown.
pub async fn run(
    svc: Arc<QuotaService>,
    topics: Arc<Topics>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut interval = tokio::time::interval(Duration::from_millis(REPORT_INTERVAL_MS));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = crate::connection::wait_true(&mut shutdown) => return,
        }
        let now = tokio::time::Instant::now();
        svc.tick(&topics, now - last).await;
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(b: &Arc<Bucket>, msgs: u64, bytes: u64) -> Charge {
        Charge {
            bucket: b.clone(),
            msgs,
            bytes,
        }
    }

    #[test]
    fn usage_counts_go_to_the_topics_tenant_and_namespace() {
        let mut inner = Inner::default();
        let a = TopicName::parse("persistent://t1/ns1/a").unwrap();
        let b = TopicName::parse("persistent://t1/ns2/b").unwrap();
        // c: a's namespace again; d: a tenant and namespace whose names
        // run together ("t" + "1ns1") as a's do ("t1" + "ns1").
        let c = TopicName::parse("persistent://t1/ns1/c").unwrap();
        let d = TopicName::parse("persistent://t/1ns1/d").unwrap();
        for (t, n) in [(&a, 2), (&b, 3), (&c, 5), (&a, 7), (&d, 11)] {
            inner.count(t, |c| c.published_msgs += n);
        }
        inner.count(&b, |c| c.dispatched_msgs += 1);
        let msgs = |m: &HashMap<String, Counters>, k: &str| {
            m.get(k).map(|c| (c.published_msgs, c.dispatched_msgs))
        };
        assert_eq!(msgs(&inner.tenants, "t1"), Some((17, 1)));
        assert_eq!(msgs(&inner.tenants, "t"), Some((11, 0)));
        assert_eq!(msgs(&inner.namespaces, "t1/ns1"), Some((14, 0)));
        assert_eq!(msgs(&inner.namespaces, "t1/ns2"), Some((3, 1)));
        assert_eq!(msgs(&inner.namespaces, "t/1ns1"), Some((11, 0)));
        assert_eq!(inner.tenants.len(), 2);
        assert_eq!(inner.namespaces.len(), 3);
    }

    #[test]
    fn the_read_budget_is_a_slice_of_the_tightest_byte_rate() {
        let (tenant, sub, msgs_only) = (
            Arc::new(Bucket::default()),
            Arc::new(Bucket::default()),
            Arc::new(Bucket::default()),
        );
        assert_eq!(
            QuotaService::read_budget(&[tenant.clone(), sub.clone()], 100),
            None
        );
        msgs_only.set(Some(100), None);
        assert_eq!(
            QuotaService::read_budget(std::slice::from_ref(&msgs_only), 100),
            None
        );
        tenant.set(None, Some(8 << 20));
        sub.set(None, Some(32 << 20));
        let all = [tenant.clone(), sub.clone(), msgs_only];
        assert_eq!(QuotaService::read_budget(&all, 100), Some((8 << 20) / 10));
        assert_eq!(QuotaService::read_budget(&all, 20), Some((8 << 20) / 50));
        // The slice is at most what a bucket holds (a tenth of a second).
        assert_eq!(QuotaService::read_budget(&all, 1000), Some((8 << 20) / 10));
        // It follows quota changes, and is never below 1 KiB.
        tenant.set(None, Some(100));
        assert_eq!(QuotaService::read_budget(&all, 100), Some(1024));
        tenant.set(None, None);
        assert_eq!(QuotaService::read_budget(&all, 100), Some((32 << 20) / 10));
        tenant.set(None, Some(u64::MAX));
        sub.set(None, Some(u64::MAX));
        assert!(QuotaService::read_budget(&all, 100).is_some());
    }

    #[test]
    fn an_unlimited_bucket_never_waits() {
        let b = Arc::new(Bucket::default());
        let mut owed = vec![charge(&b, 1_000_000, 1 << 30)];
        assert_eq!(pay(&mut owed), None);
        assert!(owed.is_empty());
    }

    #[test]
    fn a_bucket_starts_empty_and_charges_batches_in_chunks() {
        // Empty at start: the first message already waits (up to 1 s at 1/s).
        let slow = Arc::new(Bucket::default());
        slow.set(Some(1), None);
        let mut owed = vec![charge(&slow, 1, 0)];
        let w = pay(&mut owed).expect("a fresh bucket is empty");
        assert!(w <= Duration::from_secs(1), "{w:?}");
        assert_eq!(owed.len(), 1);
        let b = Arc::new(Bucket::default());
        b.set(Some(100), None);
        // A batch larger than the burst (10) is paid in chunks: still owed
        // after one wait, never refused as too large.
        std::thread::sleep(Duration::from_millis(150));
        let mut owed = vec![charge(&b, 50, 0)];
        assert!(pay(&mut owed).is_some());
        assert!(owed[0].msgs < 50 && owed[0].msgs > 0, "{}", owed[0].msgs);
    }

    #[test]
    fn a_resize_replaces_the_rate_and_keeps_no_burst() {
        let b = Arc::new(Bucket::default());
        b.set(Some(1000), Some(1_000_000));
        assert_eq!(b.rates(), (Some(1000), Some(1_000_000)));
        std::thread::sleep(Duration::from_millis(200));
        b.set(Some(1), Some(1_000_000));
        let mut owed = vec![charge(&b, 1, 0)];
        assert!(pay(&mut owed).is_some(), "a resized bucket starts empty");
        // The same rates again change nothing.
        b.set(Some(1), Some(1_000_000));
        assert_eq!(b.rates(), (Some(1), Some(1_000_000)));
        b.set(None, None);
        let mut owed = vec![charge(&b, 1_000, 1_000)];
        assert_eq!(pay(&mut owed), None);
    }

    #[test]
    fn bytes_are_charged_after_messages() {
        let b = Arc::new(Bucket::default());
        b.set(None, Some(1000));
        std::thread::sleep(Duration::from_millis(150));
        // 100 bytes fit the refilled 0.1 s burst; 10,000 more must wait.
        let mut owed = vec![charge(&b, 5, 100)];
        assert_eq!(pay(&mut owed), None);
        let mut owed = vec![charge(&b, 5, 10_000)];
        assert!(pay(&mut owed).is_some());
    }
}
