//! The bookies a ledger client knows of, and its connections to them.
//!
//! [`Registry`] mirrors `<root>/bookies/available/` and `.../readonly/`: a
//! background task watches both directories' children and re-reads every
//! [`BookieRegistration`] on each change, so placement sees joins, leaves and
//! read-only moves within one watch round trip. An endpoint override map (used
//! by tests to route one bookie through the chaos proxy) wins over the
//! registered endpoint.
//!
//! [`Pool`] holds one [`BookieClient`] per bookie. A closed client (its add
//! stream ended) is replaced on the next use; a failed connect is retried only
//! after a backoff that doubles per failure up to `reconnect_backoff_ms_max`,
//! and a bookie whose connection failed less than that backoff ago is reported
//! as *quarantined* so placement avoids it. At most `bookie_connections_max`
//! bookies are connected at once (the least recently used idle one is dropped).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use prost::Message;
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use super::placement::BookieInfo;
use crate::bookie_client::{BookieClient, ClientError, ClientOptions};
use crate::client::BookieId;
use crate::metadata::layout::Layout;
use crate::metadata::{MetadataError, MetadataStore, join};
use crate::proto::metadata::BookieRegistration;

fn read_lock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    match l.read() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn write_lock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    match l.write() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Live bookies as their registrations say.
pub(crate) struct Registry {
    store: Arc<dyn MetadataStore>,
    layout: Layout,
    overrides: HashMap<BookieId, String>,
    bookies: RwLock<HashMap<BookieId, BookieInfo>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("layout", &self.layout)
            .field("bookies", &read_lock(&self.bookies).len())
            .finish_non_exhaustive()
    }
}

impl Registry {
    pub(crate) fn new(
        store: Arc<dyn MetadataStore>,
        layout: Layout,
        overrides: HashMap<BookieId, String>,
    ) -> Registry {
        Registry {
            store,
            layout,
            overrides,
            bookies: RwLock::new(HashMap::new()),
        }
    }

    /// Every known bookie (writable and read-only).
    pub(crate) fn snapshot(&self) -> Vec<BookieInfo> {
        read_lock(&self.bookies).values().cloned().collect()
    }

    /// One bookie's registered incarnation, if it is registered.
    pub(crate) fn incarnation(&self, id: &str) -> Option<u64> {
        read_lock(&self.bookies).get(id).map(|b| b.incarnation)
    }

    /// One bookie's registration, if it is registered.
    pub(crate) fn get(&self, id: &str) -> Option<BookieInfo> {
        read_lock(&self.bookies).get(id).cloned()
    }

    async fn read_dir(
        &self,
        dir: &str,
        writable: bool,
        out: &mut HashMap<BookieId, BookieInfo>,
    ) -> Result<(), MetadataError> {
        let names = match self.store.children(dir).await {
            Ok(n) => n,
            Err(MetadataError::NoNode(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        for name in names {
            let path = join(dir, &name);
            let data = match self.store.get(&path).await {
                Ok((d, _)) => d,
                // Gone between the listing and the read: the next event re-reads.
                Err(MetadataError::NoNode(_)) => continue,
                Err(e) => return Err(e),
            };
            let reg = match BookieRegistration::decode(data.as_slice()) {
                Ok(r) => r,
                Err(e) => {
                    warn!(path = %path, error = %e, "unreadable bookie registration ignored");
                    continue;
                }
            };
            let id = if reg.bookie_id.is_empty() {
                name.clone()
            } else {
                reg.bookie_id.clone()
            };
            let endpoint = self
                .overrides
                .get(&id)
                .cloned()
                .unwrap_or(reg.endpoint.clone());
            // A bookie listed in both directories mid-move: writable wins only
            // if its registration says so.
            out.insert(
                id.clone(),
                BookieInfo {
                    id,
                    endpoint,
                    incarnation: reg.incarnation,
                    rack: reg.rack,
                    writable: writable && reg.writable,
                },
            );
        }
        Ok(())
    }

    /// Re-reads both directories and replaces the view.
    pub(crate) async fn refresh(&self) -> Result<(), MetadataError> {
        let mut next = HashMap::new();
        self.read_dir(&self.layout.bookies_readonly(), false, &mut next)
            .await?;
        self.read_dir(&self.layout.bookies_available(), true, &mut next)
            .await?;
        let mut cur = write_lock(&self.bookies);
        if cur.len() != next.len() || cur.keys().any(|k| !next.contains_key(k)) {
            info!(bookies = ?next.keys().collect::<BTreeSet<_>>(), "bookie registry changed");
        }
        *cur = next;
        Ok(())
    }

    /// Watches both directories until `stop` fires; re-reads on each change,
    /// and re-creates a watch that ended (session loss, slow consumer).
    pub(crate) async fn watch(self: Arc<Self>, mut stop: oneshot::Receiver<()>, retry_ms: u64) {
        loop {
            let available = self
                .store
                .watch_children(&self.layout.bookies_available())
                .await;
            let readonly = self
                .store
                .watch_children(&self.layout.bookies_readonly())
                .await;
            let (mut a, mut r) = match (available, readonly) {
                (Ok(a), Ok(r)) => (a, r),
                (Err(e), _) | (_, Err(e)) => {
                    debug!(error = %e, "bookie watch failed; retrying");
                    tokio::select! {
                        _ = &mut stop => return,
                        _ = tokio::time::sleep(Duration::from_millis(retry_ms)) => continue,
                    }
                }
            };
            if let Err(e) = self.refresh().await {
                debug!(error = %e, "bookie registry refresh failed");
            }
            loop {
                let ended = tokio::select! {
                    _ = &mut stop => return,
                    ev = a.recv() => ev.is_none(),
                    ev = r.recv() => ev.is_none(),
                };
                if let Err(e) = self.refresh().await {
                    debug!(error = %e, "bookie registry refresh failed");
                }
                if ended {
                    break;
                }
            }
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(Duration::from_millis(retry_ms)) => {}
            }
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    client: Option<(u64, BookieClient)>,
    failures: u32,
    failed_at: Option<Instant>,
    last_used: Option<Instant>,
}

/// Bounds of the pool.
#[derive(Debug, Clone)]
pub(crate) struct PoolConfig {
    pub(crate) client: ClientOptions,
    pub(crate) reconnect_backoff_ms_min: u64,
    pub(crate) reconnect_backoff_ms_max: u64,
    pub(crate) bookie_connections_max: usize,
}

/// One connection per bookie (see the module doc).
#[derive(Debug)]
pub(crate) struct Pool {
    registry: Arc<Registry>,
    config: PoolConfig,
    slots: Mutex<HashMap<BookieId, Slot>>,
    /// Serialises connecting to one bookie, so concurrent users share one connect.
    connecting: Mutex<HashMap<BookieId, Arc<tokio::sync::Mutex<()>>>>,
}

impl Pool {
    pub(crate) fn new(registry: Arc<Registry>, config: PoolConfig) -> Pool {
        Pool {
            registry,
            config,
            slots: Mutex::new(HashMap::new()),
            connecting: Mutex::new(HashMap::new()),
        }
    }

    fn backoff(&self, failures: u32) -> Duration {
        let shift = failures.saturating_sub(1).min(16);
        let ms = self
            .config
            .reconnect_backoff_ms_min
            .saturating_mul(1u64 << shift)
            .min(self.config.reconnect_backoff_ms_max);
        Duration::from_millis(ms)
    }

    /// A usable connection if one is open and its incarnation is current.
    fn cached(&self, bookie: &str, incarnation: u64) -> Option<BookieClient> {
        let mut slots = lock(&self.slots);
        let slot = slots.get_mut(bookie)?;
        match &slot.client {
            Some((inc, c)) if *inc == incarnation && !c.is_closed() => {
                slot.last_used = Some(Instant::now());
                Some(c.clone())
            }
            _ => None,
        }
    }

    /// Bookies whose connection failed within their backoff: placement avoids them.
    pub(crate) fn quarantined(&self) -> BTreeSet<BookieId> {
        let now = Instant::now();
        lock(&self.slots)
            .iter()
            .filter(|(_, s)| {
                s.failed_at
                    .is_some_and(|t| now.duration_since(t) < self.backoff(s.failures))
            })
            .map(|(b, _)| b.clone())
            .collect()
    }

    /// Records that a call to `bookie` broke: the connection is dropped and the
    /// bookie quarantined for its backoff.
    pub(crate) fn report_failure(&self, bookie: &str) {
        let mut slots = lock(&self.slots);
        let slot = slots.entry(bookie.to_string()).or_default();
        if slot
            .failed_at
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(50))
        {
            slot.failures = slot.failures.saturating_add(1);
        }
        slot.failed_at = Some(Instant::now());
        slot.client = None;
    }

    /// The connection to `bookie`, connecting (or replacing a closed one) if needed.
    pub(crate) async fn get(&self, bookie: &str) -> Result<BookieClient, ClientError> {
        // The path of every add: the registered incarnation, then the
        // connection to it, without copying the registration.
        let not_registered = || ClientError::Connect {
            bookie: bookie.to_string(),
            endpoint: String::new(),
            reason: "bookie not registered".into(),
        };
        let incarnation = self
            .registry
            .incarnation(bookie)
            .ok_or_else(not_registered)?;
        if let Some(c) = self.cached(bookie, incarnation) {
            return Ok(c);
        }
        let info = self.registry.get(bookie).ok_or_else(not_registered)?;
        let gate = lock(&self.connecting)
            .entry(bookie.to_string())
            .or_default()
            .clone();
        let _held = gate.lock().await;
        if let Some(c) = self.cached(bookie, info.incarnation) {
            return Ok(c);
        }
        {
            let slots = lock(&self.slots);
            if let Some(s) = slots.get(bookie)
                && let Some(t) = s.failed_at
                && t.elapsed() < self.backoff(s.failures)
                && s.client.is_none()
            {
                return Err(ClientError::Connect {
                    bookie: bookie.to_string(),
                    endpoint: info.endpoint.clone(),
                    reason: format!("in reconnect backoff after {} failures", s.failures),
                });
            }
        }
        match BookieClient::connect(
            bookie,
            info.incarnation,
            &info.endpoint,
            self.config.client.clone(),
        )
        .await
        {
            Ok(c) => {
                let mut slots = lock(&self.slots);
                self.evict_if_full(&mut slots, bookie);
                let slot = slots.entry(bookie.to_string()).or_default();
                slot.client = Some((info.incarnation, c.clone()));
                slot.last_used = Some(Instant::now());
                slot.failures = 0;
                slot.failed_at = None;
                Ok(c)
            }
            Err(e) => {
                debug!(bookie, endpoint = %info.endpoint, error = %e, "connect failed");
                self.report_failure(bookie);
                Err(e)
            }
        }
    }

    fn evict_if_full(&self, slots: &mut HashMap<BookieId, Slot>, keep: &str) {
        let open = slots.values().filter(|s| s.client.is_some()).count();
        if open < self.config.bookie_connections_max.max(1) {
            return;
        }
        if let Some(victim) = slots
            .iter()
            .filter(|(b, s)| s.client.is_some() && b.as_str() != keep)
            .min_by_key(|(_, s)| s.last_used)
            .map(|(b, _)| b.clone())
            && let Some(s) = slots.get_mut(&victim)
        {
            s.client = None;
        }
    }
}
