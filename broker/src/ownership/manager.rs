//! The ownership manager (I/O): which namespace bundles this broker owns,
//! lookups (connect / redirect / take ownership), the session-liveness
//! watchdog, load reports, bundle unload and draining on shutdown.
//!
//! Promises (cluster mode; in standalone the broker owns everything and
//! every check passes):
//! - this broker serves a topic (PRODUCER, SUBSCRIBE) only while it holds
//!   the ephemeral node `/cms/ownership/<tenant>/<ns>/<bundle range>` for the
//!   topic's bundle *and* its session is fresh (a reply from the metadata
//!   store within 2/3 of the session timeout, [`LivenessClock`]);
//! - when the session goes stale or expires, every owned bundle is dropped
//!   and its topics unloaded (producers and consumers get CLOSE_PRODUCER /
//!   CLOSE_CONSUMER, G13); an expired session also fires
//!   [`Ownership::fatal_signal`] (the broker then shuts down, as Pulsar's
//!   default `zookeeperSessionExpiredPolicy=shutdown`);
//! - a lookup never answers Connect for a bundle another live session
//!   holds: it redirects (authoritative, G10) to the owner's advertised URL;
//!   an unowned bundle goes to the least-loaded live broker
//!   ([`super::load::choose_broker`]); the chosen broker creates the node
//!   (NodeExists: someone else won, re-read and redirect);
//! - safety does not rest on these timings: a new owner opens the topic's
//!   managed ledger, which fences the old owner's ledgers before the first
//!   publish (invariant 5), so a late old owner can only fail;
//! - unload / drain: the bundle is marked unloading (lookups answer
//!   ServiceNotReady "is being unloaded", which clients retry), its topics
//!   are closed cleanly (cursors persisted, CLOSE_PRODUCER / CLOSE_CONSUMER),
//!   then the node is deleted so the next lookup places it elsewhere;
//! - split ([`Ownership::split_bundle`], by admin request or automatically
//!   past a topic count): only the owner splits. It first creates the two
//!   halves' ownership nodes (its own), then writes the new layout to the
//!   namespace node (CAS on its version), then serves the halves and
//!   deletes the parent's node: at no moment can another broker own a range
//!   overlapping one this broker serves. Other brokers see the new layout
//!   within [`BUNDLES_CACHE_TTL`], and never take a bundle that is not in
//!   the *stored* layout: before creating an ownership node they re-read it,
//!   and after creating one they check it again (a split between the two
//!   makes them delete the node and look up again). Topics keep being
//!   served through a split; `unload` moves the halves afterwards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cms_bookie::metadata::layout::Layout;
use cms_bookie::metadata::{
    CreateMode, Expected, MetadataError, MetadataStore, SessionState, join,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use super::bundles::{BundleRange, Bundles};
use super::liveness::LivenessClock;
use super::load::{
    CLOCK_TICKS_PER_SEC, Candidate, LoadReport, Registration, choose_broker, sample_process,
};
use crate::metrics::BrokerMetrics;
use crate::topic_name::TopicName;
use crate::topics::Topics;

/// Watchdog period bound, in milliseconds (it also scales with the timeout).
const WATCHDOG_PERIOD_MS_MAX: u64 = 100;

/// How long a reachability probe of another broker may take, in milliseconds.
const REACHABLE_PROBE_TIMEOUT_MS: u64 = 500;
/// Poll period while waiting for a dead owner's node to expire, in milliseconds.
const OWNER_GONE_POLL_MS: u64 = 100;
/// How long a namespace's cached bundle layout is used before it is read
/// again (a split on another broker is seen within this time; lookups of
/// unowned bundles always read the stored layout).
pub const BUNDLES_CACHE_TTL: Duration = Duration::from_secs(5);
/// Attempts of the namespace-node CAS of a split.
const SPLIT_CAS_ATTEMPTS: usize = 5;
/// Longest a placement decided here is counted against its broker while
/// that broker's load report does not show it yet (bounds clock skew).
const PLACEMENT_MEMORY_MS: u64 = 30_000;

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Adds to each candidate's bundle count the placements decided here that
/// its load report (timestamp) does not reflect yet — Pulsar's
/// "preallocated bundles": without it, a burst of lookups between two load
/// reports sends every new bundle to the same broker. Forgets placements
/// the reports have caught up with, or older than [`PLACEMENT_MEMORY_MS`].
/// Pure.
fn count_pending_placements(
    placed: &mut HashMap<String, (String, u64)>,
    candidates: &mut [Candidate],
    now_ms: u64,
) {
    placed.retain(|_, (broker, at)| {
        now_ms.saturating_sub(*at) < PLACEMENT_MEMORY_MS
            && candidates
                .iter()
                .find(|c| c.id == *broker)
                .is_some_and(|c| c.registration.load.timestamp_ms <= *at)
    });
    for c in candidates.iter_mut() {
        let n = placed.values().filter(|(b, _)| *b == c.id).count();
        c.registration.load.bundles += n as u64;
    }
}

/// Whether `pulsar://host:port` accepts a TCP connection. Only a refused or
/// failed connection counts as unreachable; a timeout (a stopped process
/// still completes handshakes from its backlog, or a slow network) counts as
/// reachable, since it proves nothing.
async fn reachable(service_url: &str) -> bool {
    let Some(addr) = service_url
        .strip_prefix("pulsar://")
        .or_else(|| service_url.strip_prefix("pulsar+ssl://"))
    else {
        return true;
    };
    let addr = addr.trim_end_matches('/').to_string();
    match tokio::time::timeout(
        Duration::from_millis(REACHABLE_PROBE_TIMEOUT_MS),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    {
        Ok(Ok(_)) | Err(_) => true,
        Ok(Err(_)) => false,
    }
}

/// Why an ownership operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipError {
    /// The metadata store failed; the answer is unknown.
    #[error("metadata store: {0}")]
    Metadata(String),
    /// The namespace's `bundles` policy is unusable.
    #[error("namespace {namespace}: bad bundles policy: {reason}")]
    BadPolicy {
        /// `tenant/ns`.
        namespace: String,
        /// What is wrong.
        reason: String,
    },
    /// The namespace does not exist.
    #[error("namespace {0} does not exist")]
    NoNamespace(String),
    /// No broker can serve the bundle now (retry later).
    #[error("{0}")]
    Unavailable(String),
    /// The bundle is not one of the namespace's bundles.
    #[error("{0}")]
    NoBundle(String),
    /// The request cannot be done in this state (a split of an unsplittable
    /// bundle, or past the bundle bound).
    #[error("{0}")]
    Refused(String),
}

/// What a split request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitOutcome {
    /// Split here into these two bundles.
    Split(BundleRange, BundleRange),
    /// Another broker owns the bundle: ask it (its `http://` and `https://`
    /// URLs).
    OwnedBy(String, Option<String>),
}

impl From<MetadataError> for OwnershipError {
    fn from(e: MetadataError) -> Self {
        OwnershipError::Metadata(e.to_string())
    }
}

/// A bundle of a namespace: `tenant/ns/0x.._0x..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BundleKey {
    /// Tenant.
    pub tenant: String,
    /// Namespace (local name).
    pub namespace: String,
    /// Hash range.
    pub range: BundleRange,
}

impl std::fmt::Display for BundleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.tenant, self.namespace, self.range)
    }
}

/// What an ownership node holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OwnerRecord {
    /// The owner's registration node name.
    pub broker_id: String,
    /// Its advertised `pulsar://` URL.
    pub service_url: String,
    /// Its advertised `http://` URL.
    pub http_url: String,
    /// Its advertised `pulsar+ssl://` URL, when its TLS port is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_url_tls: Option<String>,
    /// Its advertised `https://` URL, when its HTTPS port is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_url_tls: Option<String>,
}

/// The answer to a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupAnswer {
    /// This broker serves the topic.
    Connect,
    /// Ask that broker (authoritative).
    Redirect {
        /// `pulsar://` URL.
        service_url: String,
        /// `http://` URL.
        http_url: String,
        /// `pulsar+ssl://` URL (TLS port on).
        service_url_tls: Option<String>,
        /// `https://` URL (HTTPS port on).
        http_url_tls: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BundleState {
    Owned,
    Unloading,
}

/// Static settings of the manager.
#[derive(Debug, Clone)]
pub struct OwnershipConfig {
    /// False in standalone: this broker owns everything.
    pub enabled: bool,
    /// The registration node name (`<host:port>-<n>`), the broker's id.
    pub broker_id: String,
    /// Full path of the registration node.
    pub registration_path: String,
    /// Advertised `pulsar://` URL.
    pub service_url: String,
    /// Advertised `http://` URL.
    pub http_url: String,
    /// Advertised `pulsar+ssl://` URL (TLS port on).
    pub service_url_tls: Option<String>,
    /// Advertised `https://` URL (HTTPS port on).
    pub http_url_tls: Option<String>,
    /// Cluster name (in the registration).
    pub cluster: String,
    /// Metadata session timeout, in milliseconds.
    pub session_timeout_ms: u64,
    /// Period of load reports, in milliseconds.
    pub load_report_interval_ms: u64,
    /// Automatic split: a bundle serving more loaded topics than this is
    /// split in two (0 = never).
    pub split_topics_max: u64,
    /// Automatic split: how often the topic counts are checked, in ms.
    pub split_check_interval_ms: u64,
    /// Automatic split: a namespace with this many bundles is not split
    /// further (admin splits are bounded by [`super::bundles::BUNDLES_MAX`]).
    pub split_bundles_max: u32,
}

/// Bundle ownership of this broker.
pub struct Ownership {
    cfg: OwnershipConfig,
    store: Arc<dyn MetadataStore>,
    layout: Layout,
    topics: Arc<Topics>,
    metrics: BrokerMetrics,
    clock: Mutex<LivenessClock>,
    owned: Mutex<HashMap<BundleKey, BundleState>>,
    namespaces: Mutex<HashMap<String, (Bundles, Instant)>>,
    /// Bundle → (broker chosen here, wall-clock ms) not yet in that
    /// broker's load report; see [`count_pending_placements`].
    placed: Mutex<HashMap<String, (String, u64)>>,
    draining: AtomicBool,
    fatal: watch::Sender<bool>,
    stop: watch::Sender<bool>,
    report_now: Notify,
}

impl std::fmt::Debug for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ownership")
            .field("broker_id", &self.cfg.broker_id)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn not_owned_message(key: &BundleKey) -> String {
    // "is being unloaded" keeps the client's connection open and makes it
    // look the topic up again (G7).
    format!(
        "Namespace bundle {key} is being unloaded or is owned by another broker; look it up again"
    )
}

impl Ownership {
    /// A manager; call [`Ownership::start`] to run its background tasks.
    pub fn new(
        cfg: OwnershipConfig,
        store: Arc<dyn MetadataStore>,
        layout: Layout,
        topics: Arc<Topics>,
        metrics: BrokerMetrics,
    ) -> Arc<Self> {
        let timeout = Duration::from_millis(cfg.session_timeout_ms.max(1));
        let mut clock = LivenessClock::new(timeout);
        // The session was just used to register: it is fresh now.
        clock.heard(Instant::now());
        Arc::new(Self {
            cfg,
            store,
            layout,
            topics,
            metrics,
            clock: Mutex::new(clock),
            owned: Mutex::new(HashMap::new()),
            namespaces: Mutex::new(HashMap::new()),
            placed: Mutex::new(HashMap::new()),
            draining: AtomicBool::new(false),
            fatal: watch::channel(false).0,
            stop: watch::channel(false).0,
            report_now: Notify::new(),
        })
    }

    /// Whether ownership is enforced (cluster mode).
    pub fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    /// This broker's id (registration node name).
    pub fn broker_id(&self) -> &str {
        &self.cfg.broker_id
    }

    /// Turns `true` when the metadata session expired (the broker must stop).
    pub fn fatal_signal(&self) -> watch::Receiver<bool> {
        self.fatal.subscribe()
    }

    /// Whether the metadata session can be trusted now.
    pub fn is_fresh(&self) -> bool {
        !self.cfg.enabled || lock(&self.clock).is_fresh(Instant::now())
    }

    /// Bundles owned now (sorted).
    pub fn owned_bundles(&self) -> Vec<BundleKey> {
        let mut v: Vec<BundleKey> = lock(&self.owned)
            .iter()
            .filter(|(_, s)| **s == BundleState::Owned)
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }

    /// Path of a bundle's ownership node.
    pub fn node_path(&self, key: &BundleKey) -> String {
        join(
            &join(&join(&self.layout.ownership(), &key.tenant), &key.namespace),
            &key.range.to_string(),
        )
    }

    /// The bundles of namespace `tenant/ns` (policy `bundles`, default 4),
    /// from the cache when it is younger than [`BUNDLES_CACHE_TTL`].
    pub async fn bundles(&self, tenant: &str, namespace: &str) -> Result<Bundles, OwnershipError> {
        let ns = format!("{tenant}/{namespace}");
        if let Some((b, at)) = lock(&self.namespaces).get(&ns)
            && at.elapsed() < BUNDLES_CACHE_TTL
        {
            return Ok(b.clone());
        }
        self.stored_bundles(tenant, namespace).await
    }

    /// The bundles of namespace `tenant/ns` as stored now (the cache is
    /// refreshed with them).
    pub async fn stored_bundles(
        &self,
        tenant: &str,
        namespace: &str,
    ) -> Result<Bundles, OwnershipError> {
        let ns = format!("{tenant}/{namespace}");
        let path = crate::tenancy::namespace_path(&self.layout, tenant, namespace);
        let data = match self.store.get(&path).await {
            Ok((data, _)) => data,
            Err(MetadataError::NoNode(_)) => return Err(OwnershipError::NoNamespace(ns)),
            Err(e) => return Err(e.into()),
        };
        let bundles = parse_bundles_policy(&data).map_err(|reason| OwnershipError::BadPolicy {
            namespace: ns.clone(),
            reason,
        })?;
        lock(&self.namespaces).insert(ns, (bundles.clone(), Instant::now()));
        Ok(bundles)
    }

    /// The owner of every bundle of namespace `tenant/ns`, in hash order
    /// (`None`: not owned now; in standalone this broker owns them all).
    pub async fn bundle_owners(
        &self,
        tenant: &str,
        namespace: &str,
    ) -> Result<Vec<(BundleRange, Option<OwnerRecord>)>, OwnershipError> {
        // The stored layout: a cached one can still name a split bundle.
        let bundles = self.stored_bundles(tenant, namespace).await?;
        let mut out = Vec::with_capacity(bundles.ranges().len());
        for range in bundles.ranges() {
            if !self.cfg.enabled {
                let me = self.own_record();
                out.push((*range, Some(me)));
                continue;
            }
            let key = BundleKey {
                tenant: tenant.to_string(),
                namespace: namespace.to_string(),
                range: *range,
            };
            let owner = match self.store.get(&self.node_path(&key)).await {
                Ok((data, _)) => serde_json::from_slice::<OwnerRecord>(&data).ok(),
                Err(MetadataError::NoNode(_)) => None,
                Err(e) => return Err(e.into()),
            };
            out.push((*range, owner));
        }
        Ok(out)
    }

    /// The bundle holding `topic`.
    pub async fn bundle_of(&self, topic: &TopicName) -> Result<BundleKey, OwnershipError> {
        let b = self.bundles(&topic.tenant, &topic.namespace).await?;
        Ok(BundleKey {
            tenant: topic.tenant.clone(),
            namespace: topic.namespace.clone(),
            range: b.bundle_of_topic(&topic.to_string()),
        })
    }

    /// Ok if this broker may serve `topic` now; else the ServiceNotReady
    /// message for the client.
    pub async fn check_owned(&self, topic: &TopicName) -> Result<(), String> {
        if !self.cfg.enabled {
            return Ok(());
        }
        let key = self.bundle_of(topic).await.map_err(|e| e.to_string())?;
        if !self.is_fresh() {
            return Err(format!(
                "{}: the broker lost contact with the metadata store",
                not_owned_message(&key)
            ));
        }
        match lock(&self.owned).get(&key) {
            Some(BundleState::Owned) => Ok(()),
            _ => Err(not_owned_message(&key)),
        }
    }

    /// Answers a LOOKUP for `topic`. `authoritative`: the client was sent
    /// here by another broker's redirect, so take an unowned bundle instead
    /// of choosing again.
    pub async fn lookup(
        &self,
        topic: &TopicName,
        authoritative: bool,
    ) -> Result<LookupAnswer, OwnershipError> {
        if !self.cfg.enabled {
            return Ok(LookupAnswer::Connect);
        }
        let mut key = self.bundle_of(topic).await?;
        match lock(&self.owned).get(&key) {
            Some(BundleState::Owned) if self.is_fresh() => return Ok(LookupAnswer::Connect),
            Some(BundleState::Unloading) => {
                return Err(OwnershipError::Unavailable(format!(
                    "Namespace bundle {key} is being unloaded"
                )));
            }
            _ => {}
        }
        if !self.is_fresh() {
            return Err(OwnershipError::Unavailable(format!(
                "Namespace bundle {key} is being unloaded: the broker lost contact with the metadata store"
            )));
        }
        let mut path = self.node_path(&key);
        // Bounded: read, maybe create, re-read once; a split seen on the
        // way costs one more round.
        for _ in 0..4 {
            match self.store.get(&path).await {
                Ok((data, stat)) => {
                    if stat.ephemeral_owner == self.store.session_id() {
                        // Ours in the store (kept through a short stale
                        // spell): serve it again.
                        if self.draining.load(Ordering::Acquire) {
                            return Err(OwnershipError::Unavailable(format!(
                                "Namespace bundle {key} is being unloaded"
                            )));
                        }
                        self.adopt(&key);
                        return Ok(LookupAnswer::Connect);
                    }
                    let rec: OwnerRecord = serde_json::from_slice(&data).map_err(|e| {
                        OwnershipError::Metadata(format!("ownership node {path}: {e}"))
                    })?;
                    if rec.broker_id == self.cfg.broker_id
                        || rec.service_url == self.cfg.service_url
                    {
                        // Left by an earlier incarnation of this broker
                        // (restarted after a crash, its session not expired
                        // yet): redirecting the client here again would loop
                        // (the client gives up with TooManyLookupRequest
                        // after its redirect limit). Wait for the node to go.
                        if self.wait_gone(&path, stat.ephemeral_owner).await? {
                            continue;
                        }
                        return Err(OwnershipError::Unavailable(format!(
                            "Namespace bundle {key} is being unloaded: still held by an earlier session of this broker"
                        )));
                    }
                    if !reachable(&rec.service_url).await {
                        // The owner's process is gone (connection refused)
                        // but its session has not expired yet: wait for the
                        // node to go rather than send the client to a dead
                        // address (each failed attempt doubles its backoff).
                        // A hint only: ownership still moves only when the
                        // node is gone.
                        if self.wait_gone(&path, stat.ephemeral_owner).await? {
                            continue;
                        }
                    }
                    return Ok(LookupAnswer::Redirect {
                        service_url: rec.service_url,
                        http_url: rec.http_url,
                        service_url_tls: rec.service_url_tls,
                        http_url_tls: rec.http_url_tls,
                    });
                }
                Err(MetadataError::NoNode(_)) => {}
                Err(e) => return Err(e.into()),
            }
            // Unowned: place it only if it is still a bundle of the stored
            // layout (a split elsewhere may have replaced it).
            let stored = self.stored_bundles(&key.tenant, &key.namespace).await?;
            if !stored.contains_range(&key.range) {
                key.range = stored.bundle_of_topic(&topic.to_string());
                path = self.node_path(&key);
                continue;
            }
            let me_draining = self.draining.load(Ordering::Acquire);
            let take_it = if authoritative {
                !me_draining
            } else {
                let mut candidates = self.candidates().await?;
                // Skip brokers whose port refuses connections (dead, session
                // not yet expired).
                let mut live = Vec::with_capacity(candidates.len());
                for c in candidates.drain(..) {
                    if c.id == self.cfg.broker_id || reachable(&c.registration.service_url).await {
                        live.push(c);
                    }
                }
                let mut candidates = live;
                let now_ms = wall_ms();
                let chosen = {
                    let mut placed = lock(&self.placed);
                    count_pending_placements(&mut placed, &mut candidates, now_ms);
                    let chosen = choose_broker(&key.to_string(), &candidates);
                    if let Some(c) = chosen {
                        placed.insert(key.to_string(), (c.id.clone(), now_ms));
                    }
                    chosen
                };
                match chosen {
                    None => {
                        return Err(OwnershipError::Unavailable(format!(
                            "no live broker can own bundle {key}"
                        )));
                    }
                    Some(c) if c.id == self.cfg.broker_id => !me_draining,
                    Some(c) => {
                        debug!(bundle = %key, to = %c.id, "placing bundle on another broker");
                        return Ok(LookupAnswer::Redirect {
                            service_url: c.registration.service_url.clone(),
                            http_url: c.registration.web_service_url.clone(),
                            service_url_tls: c.registration.service_url_tls.clone(),
                            http_url_tls: c.registration.web_service_url_tls.clone(),
                        });
                    }
                }
            };
            if !take_it {
                return Err(OwnershipError::Unavailable(format!(
                    "Namespace bundle {key} is being unloaded: this broker is shutting down"
                )));
            }
            match self.acquire(&key, &path).await {
                Ok(true) => return Ok(LookupAnswer::Connect),
                Ok(false) => {
                    // Split under us: the layout in the cache is new now.
                    key = self.bundle_of(topic).await?;
                    path = self.node_path(&key);
                }
                Err(e) => return Err(e),
            }
        }
        Err(OwnershipError::Unavailable(format!(
            "Namespace bundle {key}: ownership is changing, retry"
        )))
    }

    /// Waits (bounded by twice the session timeout: ZooKeeper expires a
    /// session between one timeout and one timeout plus a tick after its
    /// last contact, and a tick is at most half the timeout) for the node at
    /// `path` held by session `owner` to disappear; true if it did. A node
    /// of another session at `path` counts as gone: another lookup (often
    /// of this broker, for the same topic's consumer) took the bundle
    /// between two polls, and waiting on would only end at the deadline
    /// with a redirect to the dead owner.
    async fn wait_gone(&self, path: &str, owner: i64) -> Result<bool, OwnershipError> {
        let deadline = Instant::now() + Duration::from_millis(self.cfg.session_timeout_ms * 2);
        while Instant::now() < deadline {
            match self.store.exists(path).await {
                Ok(None) | Err(MetadataError::NoNode(_)) => return Ok(true),
                Ok(Some(stat)) if stat.ephemeral_owner != owner => return Ok(true),
                Ok(Some(_)) => {}
                Err(e) => return Err(e.into()),
            }
            tokio::time::sleep(Duration::from_millis(OWNER_GONE_POLL_MS)).await;
        }
        Ok(false)
    }

    /// What this broker writes in the ownership nodes it creates.
    fn own_record(&self) -> OwnerRecord {
        OwnerRecord {
            broker_id: self.cfg.broker_id.clone(),
            service_url: self.cfg.service_url.clone(),
            http_url: self.cfg.http_url.clone(),
            service_url_tls: self.cfg.service_url_tls.clone(),
            http_url_tls: self.cfg.http_url_tls.clone(),
        }
    }

    /// Creates `key`'s ownership node and serves the bundle. `Ok(false)`:
    /// another broker created it first, or the bundle is no longer in the
    /// stored layout (split meanwhile; the node is deleted again) — look up
    /// again.
    async fn acquire(&self, key: &BundleKey, path: &str) -> Result<bool, OwnershipError> {
        if !self.create_node(path).await? {
            return Ok(false);
        }
        // Checked after the create: a split that committed before it is
        // seen here; one after it needed the splitter to own this node.
        let stored = self.stored_bundles(&key.tenant, &key.namespace).await?;
        if !stored.contains_range(&key.range) {
            self.delete_own_node(path).await?;
            debug!(bundle = %key, "bundle was split before it was taken; looking up again");
            return Ok(false);
        }
        self.adopt(key);
        info!(tenant = %key.tenant, namespace = %key.namespace, bundle = %key.range, "took ownership of bundle");
        Ok(true)
    }

    /// Creates an ownership node of this broker at `path`; false if it
    /// exists already (held by anyone).
    async fn create_node(&self, path: &str) -> Result<bool, OwnershipError> {
        let data = serde_json::to_vec(&self.own_record()).unwrap_or_default();
        if let Some(parent) = cms_bookie::metadata::parent_of(path) {
            self.store.create_all(parent).await?;
        }
        match self.store.create(path, &data, CreateMode::Ephemeral).await {
            Ok(_) => Ok(true),
            Err(MetadataError::NodeExists(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the node at `path` if this broker's session holds it.
    async fn delete_own_node(&self, path: &str) -> Result<(), OwnershipError> {
        match self.store.exists(path).await? {
            Some(stat) if stat.ephemeral_owner == self.store.session_id() => {
                match self
                    .store
                    .delete(path, Expected::Version(stat.version))
                    .await
                {
                    Ok(()) | Err(MetadataError::NoNode(_)) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
            _ => Ok(()),
        }
    }

    fn adopt(&self, key: &BundleKey) {
        lock(&self.owned).insert(key.clone(), BundleState::Owned);
        self.report_now.notify_one();
    }

    /// Live brokers from `/cms/brokers`.
    pub async fn candidates(&self) -> Result<Vec<Candidate>, OwnershipError> {
        let dir = self.layout.brokers();
        let names = self.store.children(&dir).await?;
        let mut out = Vec::with_capacity(names.len());
        for id in names {
            match self.store.get(&join(&dir, &id)).await {
                Ok((data, _)) => match serde_json::from_slice::<Registration>(&data) {
                    Ok(registration) => out.push(Candidate { id, registration }),
                    Err(e) => warn!(broker = %id, error = %e, "unreadable broker registration"),
                },
                Err(MetadataError::NoNode(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// Unloads one bundle this broker owns: lookups answer "being unloaded",
    /// its topics close (cursors persisted, clients told to reconnect), then
    /// the node is released. `Ok(false)` if it was not owned here.
    pub async fn unload_bundle(
        &self,
        key: &BundleKey,
        reason: &str,
    ) -> Result<bool, OwnershipError> {
        if !self.cfg.enabled {
            // Standalone owns everything: close the bundle's topics only.
            self.unload_topics(std::slice::from_ref(key), reason).await;
            return Ok(true);
        }
        {
            let mut owned = lock(&self.owned);
            match owned.get_mut(key) {
                Some(s @ BundleState::Owned) => *s = BundleState::Unloading,
                _ => return Ok(false),
            }
        }
        info!(tenant = %key.tenant, namespace = %key.namespace, bundle = %key.range, reason, "unloading bundle");
        self.unload_topics(std::slice::from_ref(key), reason).await;
        let path = self.node_path(key);
        let result = match self.store.exists(&path).await {
            Ok(Some(stat)) if stat.ephemeral_owner == self.store.session_id() => {
                match self.store.delete(&path, Expected::Any).await {
                    Ok(()) | Err(MetadataError::NoNode(_)) => Ok(true),
                    Err(e) => Err(e.into()),
                }
            }
            Ok(_) => Ok(true),
            Err(e) => Err(e.into()),
        };
        lock(&self.owned).remove(key);
        self.report_now.notify_one();
        result
    }

    /// Unloads every bundle of namespace `tenant/ns` owned here; returns how
    /// many were owned.
    pub async fn unload_namespace(
        &self,
        tenant: &str,
        namespace: &str,
    ) -> Result<usize, OwnershipError> {
        let keys: Vec<BundleKey> = self
            .owned_bundles()
            .into_iter()
            .filter(|k| k.tenant == tenant && k.namespace == namespace)
            .collect();
        let mut n = 0;
        for k in keys {
            if self.unload_bundle(&k, "namespace unload").await? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Splits bundle `key` in two halves ([`BundleRange::halves`]) and
    /// serves both here; with `unload`, both halves are then unloaded so the
    /// next lookups place them (possibly elsewhere). The bundle must be
    /// owned here, or unowned (it is taken here first); owned elsewhere the
    /// answer is [`SplitOutcome::OwnedBy`]. `max` bounds the namespace's
    /// bundle count. Standalone: only the layout changes.
    pub async fn split_bundle(
        &self,
        key: &BundleKey,
        unload: bool,
        max: u32,
    ) -> Result<SplitOutcome, OwnershipError> {
        let (tenant, ns) = (&key.tenant, &key.namespace);
        let stored = self.stored_bundles(tenant, ns).await?;
        let split_err = |e: super::bundles::BundleError| match e {
            super::bundles::BundleError::NoSuchBundle(_) => {
                OwnershipError::NoBundle(format!("namespace {tenant}/{ns}: {e}"))
            }
            e => OwnershipError::Refused(format!("namespace {tenant}/{ns}: {e}")),
        };
        // Checked before taking anything: a refused split changes nothing.
        stored.split(&key.range, max).map_err(split_err)?;
        let (a, b) = key.range.halves().map_err(split_err)?;
        if self.cfg.enabled {
            if let Some(owner) = self.own_for_split(key).await? {
                return Ok(owner);
            }
            // The halves' nodes first: from here no other broker can own
            // any part of the range (it owned the parent's node before).
            let mut created: Vec<String> = Vec::with_capacity(2);
            for half in [a, b] {
                let half_key = BundleKey {
                    range: half,
                    ..key.clone()
                };
                let path = self.node_path(&half_key);
                if !self.create_node(&path).await? && !self.holds(&path).await? {
                    for p in &created {
                        self.delete_own_node(p).await?;
                    }
                    return Err(OwnershipError::Unavailable(format!(
                        "bundle {half_key} is already owned by another broker; retry"
                    )));
                }
                created.push(path);
            }
            if let Err(e) = self.write_split(key, max).await {
                for p in &created {
                    self.delete_own_node(p).await?;
                }
                return Err(e);
            }
        } else {
            self.write_split(key, max).await?;
        }
        // Serve the halves before the layout switch, drop the parent after,
        // so every loaded topic's bundle is owned throughout.
        let halves: Vec<BundleKey> = [a, b]
            .into_iter()
            .map(|range| BundleKey {
                range,
                ..key.clone()
            })
            .collect();
        if self.cfg.enabled {
            for h in &halves {
                lock(&self.owned).insert(h.clone(), BundleState::Owned);
            }
        }
        self.stored_bundles(tenant, ns).await?;
        if self.cfg.enabled {
            lock(&self.owned).remove(key);
            self.delete_own_node(&self.node_path(key)).await?;
            self.report_now.notify_one();
        }
        info!(tenant = %tenant, namespace = %ns, bundle = %key.range, low = %a, high = %b, "split bundle");
        if unload && self.cfg.enabled {
            for h in &halves {
                self.unload_bundle(h, "bundle split").await?;
            }
        }
        Ok(SplitOutcome::Split(a, b))
    }

    /// Makes sure this broker owns `key` before a split: `Ok(None)` when it
    /// does (taken now if it was unowned), `Ok(Some(OwnedBy))` when another
    /// broker does.
    async fn own_for_split(&self, key: &BundleKey) -> Result<Option<SplitOutcome>, OwnershipError> {
        if !self.is_fresh() {
            return Err(OwnershipError::Unavailable(
                "the broker lost contact with the metadata store".into(),
            ));
        }
        match lock(&self.owned).get(key) {
            Some(BundleState::Owned) => return Ok(None),
            Some(BundleState::Unloading) => {
                return Err(OwnershipError::Unavailable(format!(
                    "Namespace bundle {key} is being unloaded"
                )));
            }
            None => {}
        }
        let path = self.node_path(key);
        for _ in 0..2 {
            match self.store.get(&path).await {
                Ok((data, stat)) if stat.ephemeral_owner != self.store.session_id() => {
                    let rec: OwnerRecord = serde_json::from_slice(&data).map_err(|e| {
                        OwnershipError::Metadata(format!("ownership node {path}: {e}"))
                    })?;
                    return Ok(Some(SplitOutcome::OwnedBy(rec.http_url, rec.http_url_tls)));
                }
                Ok(_) => {
                    self.adopt(key);
                    return Ok(None);
                }
                Err(MetadataError::NoNode(_)) => {}
                Err(e) => return Err(e.into()),
            }
            if self.draining.load(Ordering::Acquire) {
                return Err(OwnershipError::Unavailable(
                    "this broker is shutting down".into(),
                ));
            }
            if self.acquire(key, &path).await? {
                return Ok(None);
            }
        }
        Err(OwnershipError::Unavailable(format!(
            "Namespace bundle {key}: ownership is changing, retry"
        )))
    }

    /// Whether this broker's session holds the node at `path`.
    async fn holds(&self, path: &str) -> Result<bool, OwnershipError> {
        Ok(self
            .store
            .exists(path)
            .await?
            .is_some_and(|s| s.ephemeral_owner == self.store.session_id()))
    }

    /// Writes the layout with `key` split into the namespace node: a CAS on
    /// the node's version, every other field kept as stored.
    async fn write_split(&self, key: &BundleKey, max: u32) -> Result<(), OwnershipError> {
        let ns = format!("{}/{}", key.tenant, key.namespace);
        let path = crate::tenancy::namespace_path(&self.layout, &key.tenant, &key.namespace);
        for _ in 0..SPLIT_CAS_ATTEMPTS {
            let (data, stat) = match self.store.get(&path).await {
                Ok(x) => x,
                Err(MetadataError::NoNode(_)) => return Err(OwnershipError::NoNamespace(ns)),
                Err(e) => return Err(e.into()),
            };
            let current =
                parse_bundles_policy(&data).map_err(|reason| OwnershipError::BadPolicy {
                    namespace: ns.clone(),
                    reason,
                })?;
            let next = current.split(&key.range, max).map_err(|e| match e {
                super::bundles::BundleError::NoSuchBundle(_) => {
                    OwnershipError::NoBundle(format!("namespace {ns}: {e}"))
                }
                e => OwnershipError::Refused(format!("namespace {ns}: {e}")),
            })?;
            let mut doc: serde_json::Value = if data.is_empty() {
                serde_json::json!({})
            } else {
                serde_json::from_slice(&data).map_err(|e| OwnershipError::BadPolicy {
                    namespace: ns.clone(),
                    reason: e.to_string(),
                })?
            };
            let Some(obj) = doc.as_object_mut() else {
                return Err(OwnershipError::BadPolicy {
                    namespace: ns,
                    reason: "the namespace node is not a JSON object".into(),
                });
            };
            obj.insert(
                "bundles".into(),
                serde_json::json!({
                    "boundaries": next.boundaries(),
                    "numBundles": next.ranges().len(),
                }),
            );
            let bytes = serde_json::to_vec(&doc).unwrap_or_default();
            match self
                .store
                .set(&path, &bytes, Expected::Version(stat.version))
                .await
            {
                Ok(_) => return Ok(()),
                Err(MetadataError::BadVersion { .. }) => continue,
                Err(MetadataError::NoNode(_)) => return Err(OwnershipError::NoNamespace(ns)),
                Err(e) => return Err(e.into()),
            }
        }
        Err(OwnershipError::Unavailable(format!(
            "namespace {ns} kept changing during the split; retry"
        )))
    }

    /// One pass of the automatic split: every owned bundle serving more
    /// than `split_topics_max` loaded topics is split (while its namespace
    /// has fewer than `split_bundles_max` bundles). Returns the splits done.
    pub async fn auto_split_pass(&self) -> usize {
        let max_topics = self.cfg.split_topics_max;
        if max_topics == 0 || !self.cfg.enabled || self.draining.load(Ordering::Acquire) {
            return 0;
        }
        let mut counts: HashMap<BundleKey, u64> = HashMap::new();
        for name in self.topics.loaded() {
            if let Ok(key) = self.bundle_of(&name).await {
                *counts.entry(key).or_default() += 1;
            }
        }
        let owned = self.owned_bundles();
        let mut done = 0;
        for (key, n) in counts {
            if n <= max_topics || !owned.contains(&key) {
                continue;
            }
            match self
                .split_bundle(&key, false, self.cfg.split_bundles_max)
                .await
            {
                Ok(SplitOutcome::Split(..)) => {
                    info!(bundle = %key, topics = n, threshold = max_topics, "bundle split automatically");
                    done += 1;
                }
                Ok(SplitOutcome::OwnedBy(..)) => {}
                Err(OwnershipError::Refused(reason)) => {
                    debug!(bundle = %key, topics = n, %reason, "bundle over the topic threshold not split");
                }
                Err(e) => warn!(bundle = %key, error = %e, "automatic bundle split failed"),
            }
        }
        done
    }

    /// Graceful shutdown: take no new bundles (the registration says
    /// `draining`), then unload every owned bundle.
    pub async fn drain(&self) {
        if !self.cfg.enabled {
            return;
        }
        self.draining.store(true, Ordering::Release);
        if let Err(e) = self.write_registration(&mut LoadSampler::default()).await {
            warn!(error = %e, "marking the broker as draining");
        }
        for key in self.owned_bundles() {
            if let Err(e) = self.unload_bundle(&key, "broker shutting down").await {
                warn!(bundle = %key, error = %e, "releasing bundle on shutdown");
            }
        }
    }

    /// Stops the background tasks.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    async fn unload_topics(&self, keys: &[BundleKey], reason: &str) {
        for name in self.topics.loaded() {
            let Ok(key) = self.bundle_of(&name).await else {
                continue;
            };
            if keys.contains(&key)
                && let Some(t) = self.topics.get_loaded(&name)
            {
                self.topics.unload(&t, reason).await;
            }
        }
    }

    /// Drops every bundle at once (session stale or expired): nothing is
    /// served from them any more; the nodes are left to the session.
    pub async fn lose_all(&self, reason: &str) {
        let lost: Vec<BundleKey> = lock(&self.owned).drain().map(|(k, _)| k).collect();
        if lost.is_empty() {
            return;
        }
        warn!(bundles = lost.len(), reason, "giving up bundle ownership");
        self.unload_topics(&lost, reason).await;
    }

    /// Starts the heartbeat, the watchdog and the load reports.
    pub fn start(self: &Arc<Self>) {
        if !self.cfg.enabled {
            return;
        }
        tokio::spawn(heartbeat(self.clone()));
        tokio::spawn(watchdog(self.clone()));
        tokio::spawn(reporter(self.clone()));
        if self.cfg.split_topics_max > 0 {
            tokio::spawn(auto_splitter(self.clone()));
        }
    }

    async fn write_registration(&self, sampler: &mut LoadSampler) -> Result<(), MetadataError> {
        let reg = Registration {
            service_url: self.cfg.service_url.clone(),
            web_service_url: self.cfg.http_url.clone(),
            service_url_tls: self.cfg.service_url_tls.clone(),
            web_service_url_tls: self.cfg.http_url_tls.clone(),
            cluster: self.cfg.cluster.clone(),
            draining: self.draining.load(Ordering::Acquire),
            load: sampler.sample(self),
        };
        let data = serde_json::to_vec(&reg).unwrap_or_default();
        self.store
            .set(&self.cfg.registration_path, &data, Expected::Any)
            .await
            .map(|_| ())
    }
}

/// The bundles of a namespace node's JSON (`bundles: {boundaries,
/// numBundles}`, Pulsar's shape); empty or absent means the default.
pub fn parse_bundles_policy(data: &[u8]) -> Result<Bundles, String> {
    if data.is_empty() {
        return Bundles::even(super::bundles::DEFAULT_BUNDLES).map_err(|e| e.to_string());
    }
    let v: serde_json::Value = serde_json::from_slice(data).map_err(|e| e.to_string())?;
    let b = &v["bundles"];
    if b.is_null() {
        return Bundles::even(super::bundles::DEFAULT_BUNDLES).map_err(|e| e.to_string());
    }
    let boundaries: Option<Vec<String>> = match &b["boundaries"] {
        serde_json::Value::Null => None,
        serde_json::Value::Array(a) => Some(
            a.iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or("boundaries must be strings")
                })
                .collect::<Result<_, _>>()?,
        ),
        _ => return Err("boundaries must be a list".into()),
    };
    let num = match &b["numBundles"] {
        serde_json::Value::Null => None,
        x => Some(x.as_u64().ok_or("numBundles must be a positive integer")?),
    };
    Bundles::from_policy(boundaries.as_deref(), num).map_err(|e| e.to_string())
}

/// Rates between two load samples.
#[derive(Debug, Default)]
struct LoadSampler {
    last: Option<(Instant, u64, u64, u64)>,
    cpu_percent: f64,
    rate_in: f64,
    rate_out: f64,
}

impl LoadSampler {
    fn sample(&mut self, o: &Ownership) -> LoadReport {
        let now = Instant::now();
        let msgs_in = o.metrics.messages_in.get();
        let msgs_out = o.metrics.messages_out.get();
        let proc = sample_process();
        let ticks = proc.map(|p| p.0).unwrap_or(0);
        if let Some((t0, in0, out0, ticks0)) = self.last {
            let dt = now.duration_since(t0).as_secs_f64();
            if dt > 0.05 {
                self.rate_in = msgs_in.saturating_sub(in0) as f64 / dt;
                self.rate_out = msgs_out.saturating_sub(out0) as f64 / dt;
                self.cpu_percent =
                    ticks.saturating_sub(ticks0) as f64 / CLOCK_TICKS_PER_SEC / dt * 100.0;
            }
        }
        if self
            .last
            .is_none_or(|(t0, ..)| now.duration_since(t0).as_millis() > 50)
        {
            self.last = Some((now, msgs_in, msgs_out, ticks));
        }
        LoadReport {
            bundles: o.owned_bundles().len() as u64,
            topics: o.topics.loaded().len() as u64,
            connections: o.metrics.connections.get().max(0) as u64,
            msg_rate_in: self.rate_in,
            msg_rate_out: self.rate_out,
            cpu_percent: self.cpu_percent,
            memory_mib: proc.map(|p| p.1).unwrap_or(0.0),
            timestamp_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        }
    }
}

async fn wait_stop(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Sends a cheap request regularly; a reply moves "last heard" to the
/// instant it was sent.
async fn heartbeat(o: Arc<Ownership>) {
    let timeout = Duration::from_millis(o.cfg.session_timeout_ms.max(1));
    let period = (timeout / 10).max(Duration::from_millis(20));
    let mut stop = o.stop.subscribe();
    let root = o.layout.root().to_string();
    loop {
        let sent = Instant::now();
        let probe = tokio::time::timeout(timeout, o.store.exists(&root));
        tokio::select! {
            r = probe => {
                if let Ok(Ok(_)) = r {
                    lock(&o.clock).heard(sent);
                }
            }
            _ = wait_stop(&mut stop) => return,
        }
        tokio::select! {
            _ = tokio::time::sleep_until((sent + period).into()) => {}
            _ = wait_stop(&mut stop) => return,
        }
    }
}

/// Gives up every bundle when the session goes stale or expires.
async fn watchdog(o: Arc<Ownership>) {
    let period =
        Duration::from_millis((o.cfg.session_timeout_ms / 40).clamp(10, WATCHDOG_PERIOD_MS_MAX));
    let mut stop = o.stop.subscribe();
    let mut session = o.store.session_events();
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            r = session.changed() => {
                let state = *session.borrow_and_update();
                if r.is_err() || state == SessionState::Expired {
                    lock(&o.clock).reset();
                    o.lose_all("metadata session expired").await;
                    warn!("metadata session expired: the broker stops");
                    o.fatal.send_replace(true);
                    return;
                }
                continue;
            }
            _ = wait_stop(&mut stop) => return,
        }
        let silence = {
            let c = lock(&o.clock);
            (!c.is_fresh(Instant::now())).then(|| c.silence(Instant::now()))
        };
        if let Some(silence) = silence
            && !lock(&o.owned).is_empty()
        {
            let ms = silence.map(|d| d.as_millis()).unwrap_or(0);
            o.lose_all(&format!(
                "no reply from the metadata store for {ms} ms (over 2/3 of the {} ms session timeout)",
                o.cfg.session_timeout_ms
            ))
            .await;
        }
    }
}

/// Rewrites the registration with a load report periodically and on
/// ownership changes.
async fn reporter(o: Arc<Ownership>) {
    let period = Duration::from_millis(o.cfg.load_report_interval_ms.max(100));
    let mut stop = o.stop.subscribe();
    let mut sampler = LoadSampler::default();
    loop {
        if let Err(e) = o.write_registration(&mut sampler).await {
            debug!(error = %e, "writing the load report");
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = o.report_now.notified() => {}
            _ = wait_stop(&mut stop) => return,
        }
    }
}

/// Runs [`Ownership::auto_split_pass`] every `split_check_interval_ms`.
async fn auto_splitter(o: Arc<Ownership>) {
    let period = Duration::from_millis(o.cfg.split_check_interval_ms.max(100));
    let mut stop = o.stop.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = wait_stop(&mut stop) => return,
        }
        o.auto_split_pass().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cms_bookie::client::driver::{LedgerClient, LedgerClientOptions};
    use cms_bookie::metadata::embedded::EmbeddedBackend;

    use crate::managed_ledger::io::{EntryCache, ManagedLedgerConfig};
    use crate::topics::TopicContext;

    /// One simulated broker: its own session on a shared embedded store, a
    /// registration and a listening port (so reachability probes succeed).
    struct Node {
        store: cms_bookie::metadata::embedded::EmbeddedStore,
        own: Arc<Ownership>,
        url: String,
        _listener: tokio::net::TcpListener,
    }

    async fn node(backend: &Arc<EmbeddedBackend>, name: &str, enabled: bool) -> Node {
        let layout = Layout::new("/cms").unwrap();
        let session = backend.session();
        let store: Arc<dyn MetadataStore> = Arc::new(session.clone());
        crate::tenancy::init_cluster(&*store, &layout, "test")
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("pulsar://{}", listener.local_addr().unwrap());
        let registry = prometheus::Registry::new();
        let metrics = BrokerMetrics::new(&registry).unwrap();
        let client = LedgerClient::connect(
            store.clone(),
            layout.clone(),
            LedgerClientOptions::default(),
        )
        .await
        .unwrap();
        let topics = Topics::new(TopicContext {
            client,
            store: store.clone(),
            layout: layout.clone(),
            ml_config: ManagedLedgerConfig::default(),
            cache: EntryCache::new(1 << 20),
            metrics: metrics.clone(),
            allow_auto_topic_creation: true,
            producers_per_topic_max: 10,
            topics_loaded_max: 10,
            tick_interval_ms: 1000,
            dedup: crate::dedup::DedupConfig::default(),
        });
        store.create_all(&layout.brokers()).await.unwrap();
        let reg = Registration {
            service_url: url.clone(),
            web_service_url: url.replace("pulsar", "http"),
            cluster: "test".into(),
            ..Registration::default()
        };
        let (reg_path, _) = store
            .create(
                &join(&layout.brokers(), &format!("{name}-")),
                &serde_json::to_vec(&reg).unwrap(),
                CreateMode::EphemeralSequential,
            )
            .await
            .unwrap();
        let own = Ownership::new(
            OwnershipConfig {
                enabled,
                broker_id: reg_path.rsplit('/').next().unwrap().to_string(),
                registration_path: reg_path,
                service_url: url.clone(),
                http_url: url.replace("pulsar", "http"),
                service_url_tls: None,
                http_url_tls: None,
                cluster: "test".into(),
                // Long: these tests do not run the heartbeat.
                session_timeout_ms: 120_000,
                load_report_interval_ms: 1000,
                split_topics_max: 2,
                split_check_interval_ms: 1000,
                split_bundles_max: 128,
            },
            store,
            layout,
            topics,
            metrics,
        );
        Node {
            store: session,
            own,
            url,
            _listener: listener,
        }
    }

    /// Ends `store`'s session (its ephemeral nodes go) and waits until it
    /// reports the expiry.
    async fn expire(store: &cms_bookie::metadata::embedded::EmbeddedStore) {
        let mut session = store.session_events();
        store.expire_session_for_test();
        tokio::time::timeout(
            Duration::from_secs(10),
            session.wait_for(|s| *s == SessionState::Expired),
        )
        .await
        .unwrap()
        .unwrap();
    }

    fn topic(name: &str) -> TopicName {
        TopicName::parse(name).unwrap()
    }

    #[tokio::test]
    async fn lookups_place_redirect_and_move_after_session_loss() {
        let dir = tempfile::tempdir().unwrap();
        let backend = EmbeddedBackend::open(&dir.path().join("m.redb")).unwrap();
        let x = node(&backend, "x", true).await;
        let y = node(&backend, "y", true).await;
        let t = topic("persistent://public/default/placed");

        // The first lookup places the bundle on one of the two brokers.
        let (owner, other) = match x.own.lookup(&t, false).await.unwrap() {
            LookupAnswer::Connect => (&x, &y),
            LookupAnswer::Redirect { service_url, .. } => {
                assert_eq!(service_url, y.url);
                // Redirected clients ask authoritatively: y takes it.
                assert_eq!(y.own.lookup(&t, true).await.unwrap(), LookupAnswer::Connect);
                (&y, &x)
            }
        };
        assert!(owner.own.check_owned(&t).await.is_ok());
        assert!(
            other
                .own
                .check_owned(&t)
                .await
                .unwrap_err()
                .contains("is being unloaded")
        );
        // The other broker redirects to the owner, authoritative or not.
        for auth in [false, true] {
            assert_eq!(
                other.own.lookup(&t, auth).await.unwrap(),
                LookupAnswer::Redirect {
                    service_url: owner.url.clone(),
                    http_url: owner.url.replace("pulsar", "http"),
                    service_url_tls: None,
                    http_url_tls: None,
                }
            );
        }
        let key = owner.own.bundle_of(&t).await.unwrap();
        assert_eq!(owner.own.owned_bundles(), vec![key.clone()]);
        let (data, _) = owner.store.get(&owner.own.node_path(&key)).await.unwrap();
        let rec: OwnerRecord = serde_json::from_slice(&data).unwrap();
        assert_eq!(rec.service_url, owner.url);

        // The owner's session ends: its node goes, the other broker takes it.
        expire(&owner.store).await;
        assert_eq!(
            other.own.lookup(&t, true).await.unwrap(),
            LookupAnswer::Connect
        );
        assert!(other.own.check_owned(&t).await.is_ok());

        // Unload releases the node; the bundle is no longer served here.
        assert!(other.own.unload_bundle(&key, "test").await.unwrap());
        assert!(other.own.check_owned(&t).await.is_err());
        assert_eq!(
            other
                .store
                .exists(&other.own.node_path(&key))
                .await
                .unwrap(),
            None
        );
        assert!(!other.own.unload_bundle(&key, "again").await.unwrap());
    }

    #[tokio::test]
    async fn a_node_left_by_an_earlier_session_of_this_broker_is_waited_out() {
        let dir = tempfile::tempdir().unwrap();
        let backend = EmbeddedBackend::open(&dir.path().join("m.redb")).unwrap();
        let x = node(&backend, "x", true).await;
        let t = topic("persistent://public/default/reborn");
        let key = x.own.bundle_of(&t).await.unwrap();
        let path = x.own.node_path(&key);
        // The crashed incarnation's node: same record, another session.
        let old = backend.session();
        old.create_all(cms_bookie::metadata::parent_of(&path).unwrap())
            .await
            .unwrap();
        old.create(
            &path,
            &serde_json::to_vec(&x.own.own_record()).unwrap(),
            CreateMode::Ephemeral,
        )
        .await
        .unwrap();
        // Never a redirect to itself: the lookup waits while the node lives.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), x.own.lookup(&t, true))
                .await
                .is_err(),
            "answered while an earlier session holds the bundle"
        );
        expire(&old).await;
        assert_eq!(x.own.lookup(&t, true).await.unwrap(), LookupAnswer::Connect);
        assert!(x.own.check_owned(&t).await.is_ok());
    }

    /// W6's broker kill: a producer's and a consumer's lookups both wait on
    /// the dead owner's node; when it goes, the first to look takes the
    /// bundle. The other must answer at once, not keep waiting for a node
    /// that is now this broker's (until the deadline, then a redirect to
    /// the dead address: an 8 s resume instead of 4 s).
    #[tokio::test]
    async fn a_lookup_waiting_on_a_dead_owner_follows_a_takeover_between_polls() {
        let dir = tempfile::tempdir().unwrap();
        let backend = EmbeddedBackend::open(&dir.path().join("m.redb")).unwrap();
        let x = Arc::new(node(&backend, "x", true).await);
        let t = topic("persistent://public/default/taken-over");
        let key = x.own.bundle_of(&t).await.unwrap();
        let path = x.own.node_path(&key);
        // The dead owner: its session lives on, its port refuses connections.
        let dead_url = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("pulsar://{}", l.local_addr().unwrap())
        };
        let old = backend.session();
        old.create_all(cms_bookie::metadata::parent_of(&path).unwrap())
            .await
            .unwrap();
        let rec = OwnerRecord {
            broker_id: "dead".into(),
            service_url: dead_url.clone(),
            http_url: dead_url.replace("pulsar", "http"),
            service_url_tls: None,
            http_url_tls: None,
        };
        old.create(
            &path,
            &serde_json::to_vec(&rec).unwrap(),
            CreateMode::Ephemeral,
        )
        .await
        .unwrap();
        let waiting = {
            let x = x.clone();
            let t = t.clone();
            tokio::spawn(async move { x.own.lookup(&t, false).await })
        };
        // It waits while the dead owner's session holds the node.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "answered while the dead owner holds the bundle"
        );
        expire(&old).await;
        // A second lookup takes the bundle within the first one's poll
        // interval (the node is gone and re-created in between).
        assert_eq!(x.own.lookup(&t, true).await.unwrap(), LookupAnswer::Connect);
        let answer = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting lookup still waits after the takeover")
            .unwrap()
            .unwrap();
        assert_eq!(answer, LookupAnswer::Connect);
    }

    #[tokio::test]
    async fn a_draining_broker_takes_no_bundle_and_standalone_owns_everything() {
        let dir = tempfile::tempdir().unwrap();
        let backend = EmbeddedBackend::open(&dir.path().join("m.redb")).unwrap();
        let x = node(&backend, "x", true).await;
        let y = node(&backend, "y", true).await;
        x.own.drain().await;
        // Every lookup through either broker ends on y.
        for i in 0..8 {
            let t = topic(&format!("persistent://public/default/d-{i}"));
            match x.own.lookup(&t, false).await.unwrap() {
                LookupAnswer::Redirect { service_url, .. } => assert_eq!(service_url, y.url),
                LookupAnswer::Connect => panic!("a draining broker took {t}"),
            }
            // Even a redirected (authoritative) lookup does not make it
            // take an unowned bundle.
            match x.own.lookup(&t, true).await {
                Err(OwnershipError::Unavailable(_)) => {}
                Ok(LookupAnswer::Redirect { service_url, .. }) => assert_eq!(service_url, y.url),
                other => panic!("a draining broker answered {other:?} for {t}"),
            }
            assert_eq!(
                y.own.lookup(&t, false).await.unwrap(),
                LookupAnswer::Connect
            );
        }
        let s = node(&backend, "s", false).await;
        let t = topic("persistent://public/default/d-0");
        assert_eq!(
            s.own.lookup(&t, false).await.unwrap(),
            LookupAnswer::Connect
        );
        assert!(s.own.check_owned(&t).await.is_ok());
        // A namespace that does not exist is an error, not a placement.
        assert!(matches!(
            y.own
                .lookup(&topic("persistent://public/nope/t"), false)
                .await,
            Err(OwnershipError::NoNamespace(_))
        ));
    }

    #[test]
    fn bundles_policy_shapes() {
        assert_eq!(parse_bundles_policy(b"").unwrap().ranges().len(), 4);
        assert_eq!(parse_bundles_policy(b"{}").unwrap().ranges().len(), 4);
        assert_eq!(
            parse_bundles_policy(br#"{"bundles":{"numBundles":8}}"#)
                .unwrap()
                .ranges()
                .len(),
            8
        );
        let b = parse_bundles_policy(
            br#"{"bundles":{"boundaries":["0x00000000","0x80000000","0xffffffff"],"numBundles":2}}"#,
        )
        .unwrap();
        assert_eq!(b.ranges().len(), 2);
        for bad in [
            &br#"{"bundles":{"numBundles":0}}"#[..],
            br#"{"bundles":{"numBundles":"x"}}"#,
            br#"{"bundles":{"boundaries":"0x0"}}"#,
            br#"{"bundles":{"boundaries":[1,2]}}"#,
            b"not json",
        ] {
            assert!(
                parse_bundles_policy(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[tokio::test]
    async fn split_keeps_one_owner_per_hash_and_stale_brokers_follow() {
        let dir = tempfile::tempdir().unwrap();
        let backend = EmbeddedBackend::open(&dir.path().join("m.redb")).unwrap();
        let x = node(&backend, "x", true).await;
        let y = node(&backend, "y", true).await;
        let t = topic("persistent://public/default/split-me");
        assert_eq!(x.own.lookup(&t, true).await.unwrap(), LookupAnswer::Connect);
        let parent = x.own.bundle_of(&t).await.unwrap();
        // y caches the layout before the split.
        assert_eq!(
            y.own
                .bundles("public", "default")
                .await
                .unwrap()
                .ranges()
                .len(),
            4
        );
        let x_http = x.url.replace("pulsar", "http");

        // Only the owner splits: y points at x.
        assert_eq!(
            y.own.split_bundle(&parent, false, 128).await.unwrap(),
            SplitOutcome::OwnedBy(x_http.clone(), None)
        );
        let SplitOutcome::Split(a, b) = x.own.split_bundle(&parent, false, 128).await.unwrap()
        else {
            panic!("x owns the bundle")
        };
        assert_eq!(
            (a.lower, b.upper, a.upper),
            (parent.range.lower, parent.range.upper, b.lower)
        );
        let half = |range| BundleKey {
            range,
            ..parent.clone()
        };
        let mut halves = vec![half(a), half(b)];
        halves.sort();
        assert_eq!(x.own.owned_bundles(), halves);
        assert!(
            x.own.check_owned(&t).await.is_ok(),
            "served through the split"
        );
        assert!(
            x.store
                .exists(&x.own.node_path(&parent))
                .await
                .unwrap()
                .is_none()
        );
        for h in &halves {
            let stat = x.store.exists(&x.own.node_path(h)).await.unwrap().unwrap();
            assert_eq!(stat.ephemeral_owner, x.store.session_id());
        }
        // y still has the old layout cached: its lookup finds the parent
        // unowned, re-reads the layout and redirects to the half's owner.
        assert_eq!(
            y.own
                .bundles("public", "default")
                .await
                .unwrap()
                .ranges()
                .len(),
            4
        );
        for auth in [false, true] {
            assert!(matches!(
                y.own.lookup(&t, auth).await.unwrap(),
                LookupAnswer::Redirect { ref service_url, .. } if *service_url == x.url
            ));
        }
        let stored = y.own.stored_bundles("public", "default").await.unwrap();
        assert_eq!(stored.ranges().len(), 5);
        assert!(!stored.contains_range(&parent.range));
        // A stale acquire of the parent range undoes itself.
        let ppath = y.own.node_path(&parent);
        assert!(!y.own.acquire(&parent, &ppath).await.unwrap());
        assert!(y.store.exists(&ppath).await.unwrap().is_none());
        assert!(y.own.owned_bundles().is_empty());

        // Refusals change nothing.
        assert!(matches!(
            x.own.split_bundle(&parent, false, 128).await,
            Err(OwnershipError::NoBundle(_))
        ));
        assert!(matches!(
            x.own.split_bundle(&half(a), false, 5).await,
            Err(OwnershipError::Refused(_))
        ));
        assert_eq!(
            x.own.stored_bundles("public", "default").await.unwrap(),
            stored
        );

        // Split with unload: the halves are released for the next lookup.
        let SplitOutcome::Split(c, d) = x.own.split_bundle(&half(a), true, 128).await.unwrap()
        else {
            panic!("x owns the half")
        };
        assert_eq!(x.own.owned_bundles(), vec![half(b)]);
        for r in [c, d] {
            assert!(
                x.store
                    .exists(&x.own.node_path(&half(r)))
                    .await
                    .unwrap()
                    .is_none()
            );
        }
        assert_eq!(
            x.own
                .stored_bundles("public", "default")
                .await
                .unwrap()
                .ranges()
                .len(),
            6
        );

        // An unowned bundle is taken by the broker asked, then split.
        let other = *stored
            .ranges()
            .iter()
            .find(|r| **r != a && **r != b)
            .unwrap();
        assert!(matches!(
            y.own.split_bundle(&half(other), false, 128).await.unwrap(),
            SplitOutcome::Split(..)
        ));
        assert_eq!(y.own.owned_bundles().len(), 2);
    }

    #[tokio::test]
    async fn standalone_split_changes_only_the_layout() {
        let dir = tempfile::tempdir().unwrap();
        let backend = EmbeddedBackend::open(&dir.path().join("m.redb")).unwrap();
        let s = node(&backend, "s", false).await;
        let t = topic("persistent://public/default/alone");
        let key = s.own.bundle_of(&t).await.unwrap();
        assert!(matches!(
            s.own.split_bundle(&key, false, 128).await.unwrap(),
            SplitOutcome::Split(..)
        ));
        assert_eq!(
            s.own
                .bundles("public", "default")
                .await
                .unwrap()
                .ranges()
                .len(),
            5
        );
        assert!(s.own.check_owned(&t).await.is_ok());
        assert_eq!(
            s.own.lookup(&t, false).await.unwrap(),
            LookupAnswer::Connect
        );
    }

    #[test]
    fn placements_count_until_the_report_shows_them() {
        let cand = |id: &str, bundles: u64, ts: u64| Candidate {
            id: id.into(),
            registration: Registration {
                service_url: format!("pulsar://{id}"),
                load: LoadReport {
                    bundles,
                    timestamp_ms: ts,
                    ..LoadReport::default()
                },
                ..Registration::default()
            },
        };
        let mut placed = HashMap::new();
        // Two bundles placed on b at 1000 and 1001; b's report is from 900.
        placed.insert("t/ns/r1".to_string(), ("b".to_string(), 1000));
        placed.insert("t/ns/r2".to_string(), ("b".to_string(), 1001));
        let mut c = vec![cand("a", 0, 950), cand("b", 0, 900)];
        count_pending_placements(&mut placed, &mut c, 1100);
        assert_eq!(
            (
                c[0].registration.load.bundles,
                c[1].registration.load.bundles
            ),
            (0, 2)
        );
        // The next bundle goes to a, which now scores lower.
        assert_eq!(choose_broker("t/ns/r3", &c).unwrap().id, "a");
        // b's report from 1002 includes them: they stop counting.
        let mut c = vec![cand("a", 0, 950), cand("b", 2, 1002)];
        count_pending_placements(&mut placed, &mut c, 1200);
        assert_eq!(c[1].registration.load.bundles, 2);
        assert!(placed.is_empty());
        // Old placements are forgotten even without a newer report.
        placed.insert("t/ns/r4".to_string(), ("a".to_string(), 1000));
        let mut c = vec![cand("a", 0, 950)];
        count_pending_placements(&mut placed, &mut c, 1000 + PLACEMENT_MEMORY_MS);
        assert!(placed.is_empty());
        assert_eq!(c[0].registration.load.bundles, 0);
    }
}
