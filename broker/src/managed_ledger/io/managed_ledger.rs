//! [`ManagedLedger`]: a topic as a sequence of ledgers, opened by one owner,
//! with pipelined in-order appends, reads across ledger boundaries, a tailing
//! wait, cursors ([`ManagedCursor`]), trimming and deletion.
//!
//! Promises: see the parent module. Appends are submitted to the current
//! ledger's writer under one lock (entry order = submission order) and
//! completed by one completion task in submission order, which also records
//! them in the in-memory ledger list, so the list never holds an entry that
//! was not acknowledged. A rollover creates the next ledger and stores it in
//! the list before any write to it (appends wait for that one create and CAS
//! only); the previous ledger is closed once its own adds completed.
//!
//! A ledger write failure other than fencing (not enough bookies, a failed
//! ensemble change, timeouts) is handled by the completion task
//! (`Shared::recover_and_resend`): it stops submissions (takes the writer
//! lock), recovery-opens the failed ledger (bounded retries), completes the
//! pending appends recovery found stored, closes the ledger in the list and
//! resends the rest, in order, on a new ledger stored in the list before its
//! first write ([`crate::managed_ledger::plan_resend`] decides). Appends it
//! cannot place within the retry window fail with [`MlError::Unavailable`]
//! (retryable: the handle stays usable; the next append creates a ledger);
//! only a fenced ledger, a version conflict on the list, or a ledger that
//! cannot be recovered within the window make the handle terminal.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use cms_bookie::client::driver::{LedgerClient, LedgerError, PendingAdd, ReadHandle, WriteHandle};
use cms_bookie::client::writer::{AddError, WriterError};
use cms_bookie::metadata::layout::Layout;
use cms_bookie::metadata::{CreateMode, Expected, MetadataError, MetadataStore, Version, join};
use prost::Message;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};

use super::cache::EntryCache;
use super::cursor_io::{self, CursorLedger};
use crate::managed_ledger::metrics::add;
use crate::managed_ledger::{
    AckOutcome, Cursor, CursorConfig, CursorError, CursorLedgerRollover, InitialPosition,
    LedgerList, LedgerListError, MlMetrics, Position, PublishTimeSearch, RetentionPolicy,
    RetryPolicy, RolloverDecision, RolloverPolicy, SearchError, SearchResult, SearchStep,
    WallAnchor, deletable_ledgers, plan_resend, proto, ttl, ttl_cutoff_ms,
};

/// Settings of one managed ledger (broker defaults, overridable per namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedLedgerConfig {
    /// Ensemble size E of every ledger (data and cursor ledgers).
    pub ensemble_size: usize,
    /// Write quorum Qw.
    pub write_quorum: usize,
    /// Ack quorum Qa.
    pub ack_quorum: usize,
    /// Password of the ledgers.
    pub password: Vec<u8>,
    /// When the current ledger is replaced.
    pub rollover: RolloverPolicy,
    /// Cursor persistence settings.
    pub cursor: CursorConfig,
    /// When a cursor's own ledger is replaced.
    pub cursor_ledger_rollover: CursorLedgerRollover,
    /// Retention of consumed ledgers.
    pub retention: RetentionPolicy,
    /// Appends submitted and not yet completed, at most (appends wait beyond).
    pub pending_appends_max: usize,
    /// Message TTL in seconds (namespace policy; 0 = none): `tick` moves the
    /// mark-delete of every durable cursor past entries older than this (see
    /// [`crate::managed_ledger::ttl`] for how age is known).
    pub message_ttl_seconds: u64,
    /// `tick` checks the TTL at most once per this many ms (Pulsar:
    /// `messageExpiryCheckIntervalInMinutes=5`).
    pub ttl_check_interval_ms: u64,
    /// Where this managed ledger counts (share one set per broker).
    pub metrics: MlMetrics,
    /// A cursor reading behind the cache (catch-up) reads up to this many
    /// entries at once and keeps those beyond what was asked for its next
    /// reads (0 = no read-ahead; Pulsar: `dispatcherMaxReadBatchSize=100`).
    pub read_ahead_entries: usize,
    /// Payload bytes one cursor keeps read ahead, at most.
    pub read_ahead_bytes_max: usize,
    /// An active cursor more than this many entries behind the last
    /// confirmed entry no longer holds entries in the broker's entry cache
    /// (it reads from the bookies anyway; Pulsar:
    /// `managedLedgerCursorBackloggedThreshold=1000`).
    pub cache_backlogged_entries: u64,
    /// Retries after a ledger write failure (recovering the failed ledger,
    /// creating the next one): backoff and the window after which pending
    /// appends fail with [`MlError::Unavailable`].
    pub ledger_failure_retry: RetryPolicy,
    /// The broker-wide per-tenant queues bookie reads wait in (share one per
    /// broker; invariant 8).
    pub dispatch_reads: super::DispatchReads,
}

impl Default for ManagedLedgerConfig {
    fn default() -> Self {
        Self {
            ensemble_size: 3,
            write_quorum: 3,
            ack_quorum: 2,
            password: b"cms-managed-ledger".to_vec(),
            rollover: RolloverPolicy::default(),
            cursor: CursorConfig::default(),
            cursor_ledger_rollover: CursorLedgerRollover::default(),
            retention: RetentionPolicy::default(),
            pending_appends_max: 10_000,
            message_ttl_seconds: 0,
            ttl_check_interval_ms: 5 * 60 * 1000,
            metrics: MlMetrics::default(),
            read_ahead_entries: 100,
            read_ahead_bytes_max: 4 << 20,
            cache_backlogged_entries: 1000,
            ledger_failure_retry: RetryPolicy::default(),
            dispatch_reads: super::DispatchReads::default(),
        }
    }
}

/// Why a managed-ledger call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MlError {
    /// The name is not `tenant/namespace/topic`.
    #[error("bad managed ledger name {0:?}: want tenant/namespace/topic")]
    BadName(String),
    /// Another owner took over (a fenced ledger or a version conflict on the
    /// list): the handle is terminal.
    #[error("managed ledger {0} is fenced: another owner took over")]
    Fenced(String),
    /// The managed ledger was closed or deleted by this owner.
    #[error("managed ledger {0} is closed")]
    Closed(String),
    /// A ledger client call failed.
    #[error("ledger client: {0}")]
    Ledger(LedgerError),
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Metadata(MetadataError),
    /// A stored record cannot be decoded.
    #[error("corrupt record at {path}: {reason}")]
    Corrupt {
        /// The node or ledger.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The ledger list refused a change.
    #[error(transparent)]
    List(LedgerListError),
    /// A cursor operation was refused.
    #[error(transparent)]
    Cursor(CursorError),
    /// No open cursor of that name.
    #[error("no open cursor {0:?}")]
    NoCursor(String),
    /// The entry cannot be read (past what the bookies can serve).
    #[error("entry {0} cannot be read now")]
    NotReadable(Position),
    /// The publish-time search was fed wrongly (a driver bug).
    #[error(transparent)]
    Search(SearchError),
    /// The bookies cannot take the append now (a ledger failed and no new
    /// one could be created and written within the retry window). Not
    /// terminal: the append was not stored; send it again.
    #[error("storage unavailable, retry: {0}")]
    Unavailable(String),
    /// The tenant's dispatch read queue is full (invariant 8); retryable.
    #[error("dispatch reads of tenant {tenant} are queued to their bound, retry: {reason}")]
    ReadsBusy {
        /// The tenant.
        tenant: String,
        /// The bound reached.
        reason: String,
    },
    /// The payload is above what one ledger entry holds; only this append
    /// is refused.
    #[error("entry of {bytes} bytes above the {max}-byte entry bound")]
    EntryTooLarge {
        /// The payload's size.
        bytes: usize,
        /// The bound ([`LedgerClient::entry_payload_bytes_max`]).
        max: usize,
    },
}

/// Reads an entry's publish time (ms since the Unix epoch) from its bytes;
/// `None` if it cannot tell.
pub type PublishTimeFn = Arc<dyn Fn(&[u8]) -> Option<u64> + Send + Sync>;

/// One entry read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its position.
    pub position: Position,
    /// The bytes appended.
    pub payload: Bytes,
}

/// Where [`ManagedCursor::seek`] moves a cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekTarget {
    /// Before the first stored entry.
    Earliest,
    /// After the last confirmed entry.
    Latest,
    /// So that the next entry delivered is the first at or after this position.
    Position(Position),
}

/// "Now" for TTL expiry: the wall clock bounded by the monotonic clock
/// since the first call in this process (RELIABILITY P1-12; see
/// [`WallAnchor`]), so a forward clock jump never expires unacked messages early.
fn ttl_now_ms() -> u64 {
    static ANCHOR: std::sync::OnceLock<WallAnchor> = std::sync::OnceLock::new();
    let anchor = ANCHOR.get_or_init(|| WallAnchor::new(now_ms(), Instant::now()));
    anchor.bounded_now_ms(now_ms(), Instant::now())
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(super) fn is_fenced(e: &LedgerError) -> bool {
    matches!(
        e,
        LedgerError::Writer(WriterError::Fenced)
            | LedgerError::Add(AddError::Failed(WriterError::Fenced))
    )
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many entries a cursor read asks the bookies for: the `count_max`
/// asked for plus read-ahead, at most `entries_max` in all and no more
/// read-ahead than `bytes_max` holds at the ledger's `mean_entry_bytes` (what
/// the cursor cannot keep would be read again later). Pure.
fn read_ahead_count(
    count_max: usize,
    entries_max: usize,
    bytes_max: usize,
    mean_entry_bytes: Option<u64>,
) -> usize {
    let fit = entries_fitting(bytes_max, mean_entry_bytes).unwrap_or(usize::MAX);
    entries_max
        .min(count_max.saturating_add(fit))
        .max(count_max)
}

/// How many entries a cursor read under a per-read byte budget (a dispatch
/// rate's share, [`ManagedCursor::read_next_within`]) asks for: what fits
/// `budget_bytes` at the ledger's `mean_entry_bytes`, at most `count_max`,
/// at least one (an entry larger than the budget still goes, alone). No
/// read-ahead beyond it: the point of the budget is that a rate-limited
/// reader's bookie reads come in pieces of that size. Pure.
fn budgeted_count(count_max: usize, budget_bytes: usize, mean_entry_bytes: Option<u64>) -> usize {
    let fit = entries_fitting(budget_bytes, mean_entry_bytes).unwrap_or(count_max);
    count_max.min(fit).max(1)
}

/// How many entries of `mean_entry_bytes` (a zero size counts as one byte)
/// fit `bytes`; `None` when the size is unknown. Pure.
fn entries_fitting(bytes: usize, mean_entry_bytes: Option<u64>) -> Option<usize> {
    mean_entry_bytes.map(|m| {
        usize::try_from(u64::try_from(bytes).unwrap_or(u64::MAX) / m.max(1)).unwrap_or(usize::MAX)
    })
}

/// When an acknowledgement's due snapshot is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// Before the call returns (its error is the call's).
    Wait,
    /// In a background task: the caller does not wait for a bookie round
    /// trip (a connection handling ACKs keeps reading its other commands,
    /// as Pulsar's lazy mark-delete persistence does). Acks are in memory
    /// either way; a crash loses those after the last snapshot, which are
    /// then redelivered (at least once).
    Background,
}

/// A cursor as held by its managed ledger.
pub(super) struct CursorSlot {
    pub(super) cursor: Cursor,
    /// Durable cursors hold data back from trimming and are persisted.
    pub(super) durable: bool,
    /// The last position read through this cursor.
    pub(super) read_after: Position,
    /// The cursor's own ledger (durable cursors only).
    pub(super) io: Option<Arc<tokio::sync::Mutex<CursorLedger>>>,
    /// Snapshots this owner wrote durably (cursor ledger entries acked,
    /// including the one written on open).
    pub(super) snapshots_written: u64,
    /// Consecutive entries read ahead of `read_after` (bounded by the
    /// config's read-ahead limits), served before reading again.
    pub(super) read_ahead: VecDeque<Entry>,
    /// Someone reads through this cursor (a subscription with consumers):
    /// only active cursors that are not backlogged keep appended entries
    /// in the entry cache ([`Shared::cache_floor`]).
    pub(super) active: bool,
    /// A background snapshot is queued ([`Persist::Background`]).
    pub(super) persist_queued: bool,
}

pub(super) struct Core {
    /// Confirmed entries only (what reads and cursors see).
    pub(super) list: LedgerList,
    /// Ledgers created and stored in the list but not yet current in `list`
    /// (their predecessor still has adds in flight).
    pending_ledgers: VecDeque<(u64, u64)>,
    /// Version of the managed-ledger node.
    version: Version,
    terminal: Option<MlError>,
    pub(super) cursors: BTreeMap<String, CursorSlot>,
    /// Ledgers trimmed from the list, deleted once a list without them is
    /// stored.
    trimmed: Vec<u64>,
}

impl Core {
    fn record(&self) -> proto::ManagedLedgerInfo {
        let mut l = self.list.clone();
        for (id, ctime) in &self.pending_ledgers {
            // Ascending by construction; a refusal would only drop a ledger
            // that was never written.
            let _ = l.add_ledger(*id, *ctime);
        }
        l.to_proto()
    }
}

struct WriterState {
    /// The current ledger's writer; `None` after a failure left no ledger
    /// (the next append creates one) and after `close`.
    handle: Option<WriteHandle>,
    /// `close` was called: appends are refused.
    closing: bool,
    ledger_id: u64,
    ctime_ms: u64,
    entries: u64,
    size_bytes: u64,
    tx: mpsc::Sender<Completion>,
}

/// An append submitted to a ledger, waiting for its completion.
struct AddItem {
    /// The ledger it was submitted to.
    ledger_id: u64,
    /// The entry id it gets there (adds to one writer are numbered in
    /// submission order).
    entry_id: i64,
    payload: Bytes,
    reply: oneshot::Sender<Result<Position, MlError>>,
    submitted: Instant,
}

enum Completion {
    /// An append; `None`: the writer refused it at submission (its task is
    /// gone), handled as a failure of that ledger.
    Add(AddItem, Option<PendingAdd>),
    /// `new_ledger_id` becomes current once every earlier append completed;
    /// `old` (if any) is closed first.
    Roll {
        old: Option<WriteHandle>,
        new_ledger_id: u64,
        new_ctime_ms: u64,
    },
    /// Close `handle` (if any) and store the list.
    Close {
        handle: Option<WriteHandle>,
        reply: oneshot::Sender<Result<(), MlError>>,
    },
}

/// How `Shared::complete_add` ended.
enum AddOutcome {
    /// Completed (stored or failed for good).
    Done(AddItem, Result<Position, MlError>),
    /// Its ledger failed (not fenced): recover and resend.
    LedgerFailed(AddItem, LedgerError),
}

pub(super) struct Shared {
    pub(super) name: String,
    pub(super) path: String,
    pub(super) client: LedgerClient,
    pub(super) store: Arc<dyn MetadataStore>,
    pub(super) config: ManagedLedgerConfig,
    cache: EntryCache,
    cache_id: u64,
    pub(super) core: Mutex<Core>,
    meta_lock: tokio::sync::Mutex<()>,
    writer: tokio::sync::Mutex<WriterState>,
    confirmed: watch::Sender<Position>,
    readers: Mutex<HashMap<u64, ReadHandle>>,
    /// Publish time of an entry, for TTL (`None`: ledger close times).
    publish_time: Mutex<Option<PublishTimeFn>>,
    /// When `tick` last checked the TTL, ms.
    ttl_checked_ms: Mutex<Option<u64>>,
}

/// An open managed ledger (cheap to clone; clones share it). Dropping every
/// clone without [`ManagedLedger::close`] is a crash: the next owner recovers.
#[derive(Clone)]
pub struct ManagedLedger {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ManagedLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedLedger")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

/// The completion of an append submitted with [`ManagedLedger::append_pipelined`].
#[derive(Debug)]
pub struct PendingAppend {
    rx: oneshot::Receiver<Result<Position, MlError>>,
    name: String,
}

impl PendingAppend {
    /// Waits for the append's position (completions come in submission order).
    pub async fn wait(self) -> Result<Position, MlError> {
        self.rx.await.unwrap_or(Err(MlError::Closed(self.name)))
    }
}

/// The node path of managed ledger `name` (`tenant/ns/topic`).
pub fn node_path(layout: &Layout, name: &str) -> Result<String, MlError> {
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        [t, ns, topic] if !t.is_empty() && !ns.is_empty() && !topic.is_empty() => Ok(format!(
            "{}/{t}/{ns}/persistent/{topic}",
            layout.managed_ledgers()
        )),
        _ => Err(MlError::BadName(name.to_string())),
    }
}

impl Shared {
    pub(super) fn core(&self) -> MutexGuard<'_, Core> {
        lock(&self.core)
    }

    fn terminal(&self) -> Option<MlError> {
        self.core().terminal.clone()
    }

    /// Enters the terminal state (first reason wins).
    pub(super) fn set_terminal(&self, e: MlError) -> MlError {
        let mut c = self.core();
        let e = c.terminal.get_or_insert(e).clone();
        drop(c);
        warn!(managed_ledger = %self.name, error = %e, "managed ledger terminal");
        // Wake tailing readers.
        self.confirmed.send_modify(|_| {});
        e
    }

    pub(super) fn fenced(&self) -> MlError {
        self.set_terminal(MlError::Fenced(self.name.clone()))
    }

    pub(super) async fn create_ledger(&self) -> Result<WriteHandle, MlError> {
        let c = &self.config;
        let mut custom = HashMap::new();
        custom.insert(
            "managed-ledger".to_string(),
            Bytes::from(self.name.clone().into_bytes()),
        );
        self.client
            .create_ledger(
                c.ensemble_size,
                c.write_quorum,
                c.ack_quorum,
                &c.password,
                custom,
            )
            .await
            .map_err(MlError::Ledger)
    }

    /// Stores the list (read-modify-CAS against the version this owner
    /// holds); a version conflict fences this owner.
    async fn persist_list(&self) -> Result<(), MlError> {
        let _g = self.meta_lock.lock().await;
        if let Some(MlError::Fenced(n)) = self.terminal() {
            return Err(MlError::Fenced(n));
        }
        let (data, version) = {
            let c = self.core();
            (c.record().encode_to_vec(), c.version)
        };
        match self
            .store
            .set(&self.path, &data, Expected::Version(version))
            .await
        {
            Ok(stat) => {
                self.core().version = stat.version;
                Ok(())
            }
            Err(MetadataError::BadVersion { .. } | MetadataError::NoNode(_)) => Err(self.fenced()),
            Err(e) => Err(MlError::Metadata(e)),
        }
    }

    /// What the entry cache keeps for this managed ledger: the entries after
    /// the returned position (the slowest read position over the active
    /// cursors that are at most `cache_backlogged_entries` behind), or
    /// nothing (None) when no cursor is such. Cursors without consumers and
    /// far-behind readers hold nothing back (Pulsar's active cursors).
    fn cache_floor(c: &Core, backlogged: u64) -> Option<Position> {
        let last = c.list.last_confirmed_position();
        // Within the last ledger (the usual case) without walking the list.
        let behind = |p: Position| {
            if p.ledger_id == last.ledger_id {
                (last.entry_id - p.entry_id).max(0).unsigned_abs()
            } else {
                c.list.count_entries(p, last)
            }
        };
        c.cursors
            .values()
            .filter(|s| s.active && behind(s.read_after) <= backlogged)
            .map(|s| s.read_after)
            .min()
    }

    fn evict_read(&self) {
        let floor = Self::cache_floor(&self.core(), self.config.cache_backlogged_entries);
        match floor {
            Some(p) => self.cache.evict_up_to(self.cache_id, p),
            None => self.cache.evict_all(self.cache_id),
        }
    }

    async fn reader(&self, ledger_id: u64) -> Result<ReadHandle, MlError> {
        if let Some(h) = lock(&self.readers).get(&ledger_id) {
            return Ok(h.clone());
        }
        let h = self
            .client
            .open_ledger(ledger_id, false)
            .await
            .map_err(MlError::Ledger)?
            .with_fairness_key(super::dispatch_reads::tenant_of(&self.name));
        lock(&self.readers).insert(ledger_id, h.clone());
        Ok(h)
    }

    /// Reads entries `first..=last` of `ledger_id` from the bookies.
    async fn read_bookies(
        &self,
        ledger_id: u64,
        first: i64,
        last: i64,
    ) -> Result<Vec<Entry>, MlError> {
        let h = self.reader(ledger_id).await?;
        // This broker's own open ledger: what its writer saw acknowledged is
        // readable now, with no explicit LAC from the bookies (off by
        // default, as in BookKeeper: `explicit_lac_interval_ms`).
        let confirmed = self.core().list.last_confirmed_position();
        if confirmed.ledger_id == ledger_id {
            h.observe_writer_lac(confirmed.entry_id);
        }
        let mut tries = 0;
        while h.last_readable() < last {
            let lr = h.read_lac().await.map_err(MlError::Ledger)?;
            if lr >= last {
                break;
            }
            tries += 1;
            if tries > 10 {
                return Err(MlError::NotReadable(Position::new(ledger_id, last)));
            }
            h.wait_lac_above(lr, 500).await.map_err(MlError::Ledger)?;
        }
        let entries = h.read(first, last).await.map_err(MlError::Ledger)?;
        Ok(entries
            .into_iter()
            .map(|e| Entry {
                position: Position::new(ledger_id, e.entry_id),
                payload: e.payload,
            })
            .collect())
    }

    /// Reads up to `count_max` entries at or after `from`, in order.
    pub(super) async fn read(
        &self,
        from: Position,
        count_max: usize,
    ) -> Result<Vec<Entry>, MlError> {
        // Plan contiguous runs per ledger from the confirmed list.
        let mut runs: Vec<(u64, i64, i64)> = Vec::new();
        {
            let c = self.core();
            let list = &c.list;
            let mut next = if list.contains_entry(from) {
                Some(from)
            } else {
                list.next_valid_position(Position::new(
                    from.ledger_id,
                    from.entry_id.saturating_sub(1),
                ))
            };
            let mut left = count_max;
            while let (Some(pos), true) = (next, left > 0) {
                let Some(last) = list.ledger(pos.ledger_id).and_then(|l| l.last_entry()) else {
                    break;
                };
                let n = i64::try_from(left).unwrap_or(i64::MAX);
                let end = last.entry_id.min(pos.entry_id.saturating_add(n - 1));
                runs.push((pos.ledger_id, pos.entry_id, end));
                left -= usize::try_from(end - pos.entry_id + 1).unwrap_or(left);
                next = list.next_valid_position(Position::new(pos.ledger_id, end));
            }
        }
        let mut out = Vec::new();
        for (ledger_id, first, last) in runs {
            let mut e = first;
            while e <= last {
                let pos = Position::new(ledger_id, e);
                if let Some(payload) = self.cache.get(self.cache_id, pos) {
                    add(&self.config.metrics.cache_hits, 1);
                    out.push(Entry {
                        position: pos,
                        payload,
                    });
                    e += 1;
                    continue;
                }
                // A run of misses: read it from the bookies (catch-up reads
                // are not cached).
                let mut miss_end = e;
                while miss_end < last
                    && self
                        .cache
                        .get(self.cache_id, Position::new(ledger_id, miss_end + 1))
                        .is_none()
                {
                    miss_end += 1;
                }
                // Wait for the tenant's turn (its own budget), then read.
                let tenant = super::dispatch_reads::tenant_of(&self.name);
                let count = u32::try_from(miss_end - e + 1).unwrap_or(u32::MAX);
                let mut permit = self
                    .config
                    .dispatch_reads
                    .admit(tenant, count)
                    .await
                    .map_err(|r| MlError::ReadsBusy {
                        tenant: tenant.to_string(),
                        reason: r.to_string(),
                    })?;
                let n = self.read_bookies(ledger_id, e, miss_end).await?;
                permit.set_bytes(n.iter().map(|x| x.payload.len() as u64).sum());
                drop(permit);
                add(&self.config.metrics.bookie_reads, 1);
                add(
                    &self.config.metrics.cache_misses,
                    u64::try_from(n.len()).unwrap_or(u64::MAX),
                );
                out.extend(n);
                e = miss_end + 1;
            }
        }
        Ok(out)
    }

    async fn completion_task(weak: Weak<Shared>, mut rx: mpsc::Receiver<Completion>) {
        // Completions taken off the channel by a failure's resend (resent
        // appends, or ones that continue as submitted), served first.
        let mut backlog: VecDeque<Completion> = VecDeque::new();
        // When the current run of ledger failures started (reset by an
        // append that completes, and when appends were failed for good).
        let mut failing_since: Option<Instant> = None;
        loop {
            let item = match backlog.pop_front() {
                Some(item) => item,
                None => match rx.recv().await {
                    Some(item) => item,
                    None => return,
                },
            };
            let Some(shared) = weak.upgrade() else {
                return;
            };
            match item {
                Completion::Add(item, pending) => match shared.complete_add(item, pending).await {
                    AddOutcome::Done(item, r) => {
                        if r.is_ok() {
                            failing_since = None;
                        }
                        shared.reply_add(item, r);
                    }
                    AddOutcome::LedgerFailed(item, e) => {
                        let since = *failing_since.get_or_insert_with(Instant::now);
                        let gave_up = shared
                            .recover_and_resend(item, e, since, &mut rx, &mut backlog)
                            .await;
                        if gave_up {
                            failing_since = None;
                        }
                    }
                },
                Completion::Roll {
                    old,
                    new_ledger_id,
                    new_ctime_ms,
                } => shared.complete_roll(old, new_ledger_id, new_ctime_ms).await,
                Completion::Close { handle, reply } => {
                    let _ = reply.send(shared.complete_close(handle).await);
                }
            }
        }
    }

    /// Counts and answers a completed append.
    fn reply_add(&self, item: AddItem, r: Result<Position, MlError>) {
        let m = &self.config.metrics;
        if r.is_ok() {
            add(&m.appends, 1);
            add(
                &m.append_bytes,
                u64::try_from(item.payload.len()).unwrap_or(u64::MAX),
            );
            m.append_latency
                .record_us(u64::try_from(item.submitted.elapsed().as_micros()).unwrap_or(u64::MAX));
        } else {
            add(&m.append_failures, 1);
        }
        let _ = item.reply.send(r);
    }

    async fn complete_add(&self, item: AddItem, pending: Option<PendingAdd>) -> AddOutcome {
        let r = match pending {
            Some(p) => p.await,
            None => Err(LedgerError::HandleClosed),
        };
        if let Some(t) = self.terminal() {
            return AddOutcome::Done(item, Err(t));
        }
        match r {
            Ok(entry_id) if entry_id == item.entry_id => {
                let r = self.confirm(&item);
                AddOutcome::Done(item, r)
            }
            Ok(entry_id) => {
                // The resend logic relies on this numbering.
                let e = self.set_terminal(MlError::Corrupt {
                    path: format!("ledger {}", item.ledger_id),
                    reason: format!(
                        "append stored as entry {entry_id}, expected entry {}",
                        item.entry_id
                    ),
                });
                AddOutcome::Done(item, Err(e))
            }
            Err(e) if is_fenced(&e) => AddOutcome::Done(item, Err(self.fenced())),
            // Refused without failing the writer: later adds took the entry
            // ids this numbering gave to it, so nothing can be resent safely
            // (the size bound is checked before submission; this is a bug).
            Err(
                e @ LedgerError::Add(AddError::TooLarge { .. } | AddError::Backpressure { .. }),
            ) => AddOutcome::Done(item, Err(self.set_terminal(MlError::Ledger(e)))),
            Err(e) => AddOutcome::LedgerFailed(item, e),
        }
    }

    /// Records a stored append in the list (in order), caches it and wakes
    /// tailing readers.
    fn confirm(&self, item: &AddItem) -> Result<Position, MlError> {
        let size = u64::try_from(item.payload.len()).unwrap_or(u64::MAX);
        let (pos, cached) = {
            let mut c = self.core();
            match c.list.record_add(item.ledger_id, item.entry_id, size) {
                Ok(p) => (
                    p,
                    Self::cache_floor(&c, self.config.cache_backlogged_entries).is_some(),
                ),
                Err(e) => {
                    drop(c);
                    return Err(self.set_terminal(MlError::List(e)));
                }
            }
        };
        if cached {
            self.cache.insert(self.cache_id, pos, item.payload.clone());
        } else {
            self.cache.evict_all(self.cache_id);
        }
        self.confirmed.send_replace(pos);
        Ok(pos)
    }

    /// Sleeps before retry `attempt` of a failure that started at `since`;
    /// false once the retry window is over.
    async fn backoff(&self, attempt: u32, since: Instant) -> bool {
        let elapsed = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
        match self
            .config
            .ledger_failure_retry
            .next_delay_ms(attempt, elapsed)
        {
            Some(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                true
            }
            None => false,
        }
    }

    /// Recovery-opens (fences and closes) ledger `id` of this owner after
    /// its writer failed, retrying within the window; returns its last entry
    /// id. Fenced, or not recovered within the window: terminal.
    async fn recover_ledger(&self, id: u64, since: Instant) -> Result<i64, MlError> {
        let mut attempt = 0;
        loop {
            if let Some(t) = self.terminal() {
                return Err(t);
            }
            let e = match self.client.open_ledger(id, true).await {
                Ok(h) => {
                    let last = h.metadata().last_entry_id;
                    let h = h.with_fairness_key(super::dispatch_reads::tenant_of(&self.name));
                    lock(&self.readers).insert(id, h);
                    return Ok(last);
                }
                Err(e) if is_fenced(&e) => return Err(self.fenced()),
                Err(e) => e,
            };
            warn!(managed_ledger = %self.name, ledger = id, attempt, error = %e, "recovering a failed ledger failed");
            if !self.backoff(attempt, since).await {
                return Err(self.set_terminal(MlError::Ledger(e)));
            }
            attempt += 1;
        }
    }

    /// Closes ledger `id` in the in-memory list with the counts confirmed
    /// for it, after recovery reported `last_entry` for it.
    fn record_recovered_close(&self, id: u64, last_entry: i64) -> Result<(), MlError> {
        let mut c = self.core();
        let (entries, size) = c
            .list
            .ledger(id)
            .map_or((0, 0), |l| (l.entries, l.size_bytes));
        if u64::try_from(last_entry.saturating_add(1)).ok() != Some(entries) {
            drop(c);
            return Err(self.set_terminal(MlError::Corrupt {
                path: format!("ledger {id}"),
                reason: format!(
                    "recovered with last entry {last_entry}, but {entries} entries were confirmed"
                ),
            }));
        }
        if let Err(e) = c.list.record_closed(id, entries, size, now_ms()) {
            drop(c);
            return Err(self.set_terminal(MlError::List(e)));
        }
        Ok(())
    }

    /// Handles a non-fenced failure of the ledger `first` was submitted to
    /// (see the module doc). `since`: when this run of failures started.
    /// Returns true if appends were failed for good (the window is over).
    async fn recover_and_resend(
        &self,
        first: AddItem,
        error: LedgerError,
        since: Instant,
        rx: &mut mpsc::Receiver<Completion>,
        backlog: &mut VecDeque<Completion>,
    ) -> bool {
        let failed = first.ledger_id;
        warn!(managed_ledger = %self.name, ledger = failed, error = %error, "ledger write failed; recovering it and resending what it lacks");
        add(&self.config.metrics.ledger_write_failures, 1);
        // Stop submissions: take the writer lock, taking completions off the
        // channel meanwhile (a submitter holding the lock may be waiting for
        // room in it). Once held, the channel gets nothing new.
        let mut items: Vec<Completion> = vec![Completion::Add(first, None)];
        items.extend(backlog.drain(..));
        let mut w = {
            let lock = self.writer.lock();
            tokio::pin!(lock);
            loop {
                tokio::select! {
                    g = &mut lock => break g,
                    item = rx.recv() => match item {
                        Some(item) => items.push(item),
                        None => break (&mut lock).await,
                    },
                }
            }
        };
        while let Ok(item) = rx.try_recv() {
            items.push(item);
        }

        let plan = match self.recover_ledger(failed, since).await {
            Ok(last) => {
                let confirmed = self
                    .core()
                    .list
                    .ledger(failed)
                    .and_then(|l| l.last_entry())
                    .map_or(-1, |p| p.entry_id);
                let pending: Vec<Position> = items
                    .iter()
                    .filter_map(|i| match i {
                        Completion::Add(a, _) => Some(Position::new(a.ledger_id, a.entry_id)),
                        _ => None,
                    })
                    .collect();
                plan_resend(&pending, failed, confirmed, last).map_err(|e| {
                    self.set_terminal(MlError::Corrupt {
                        path: format!("ledger {failed}"),
                        reason: e.to_string(),
                    })
                })
            }
            Err(e) => Err(e),
        };
        let plan = match plan {
            Ok(p) => p,
            Err(e) => {
                fail_all(items, &e, self);
                w.handle = None;
                return false;
            }
        };

        // Complete what the failed ledger holds; sort the rest.
        let mut durable_left = plan.durable;
        let mut resend: Vec<AddItem> = Vec::new();
        let mut keep: VecDeque<Completion> = VecDeque::new();
        let mut close_reply = None;
        for item in items {
            match item {
                Completion::Add(a, p) => {
                    if durable_left > 0 {
                        durable_left -= 1;
                        let r = self.confirm(&a);
                        self.reply_add(a, r);
                    } else if plan.resend > 0 {
                        resend.push(a);
                    } else {
                        keep.push_back(Completion::Add(a, p));
                    }
                }
                // With a resend, ledgers after the failed one are abandoned.
                Completion::Roll { .. } if plan.resend > 0 => {}
                Completion::Close { reply, .. } if plan.resend > 0 => close_reply = Some(reply),
                other => keep.push_back(other),
            }
        }
        let closed = {
            let last = self
                .core()
                .list
                .ledger(failed)
                .and_then(|l| l.last_entry())
                .map_or(-1, |p| p.entry_id);
            self.record_recovered_close(failed, last)
        };
        if let Err(e) = closed {
            let rest = resend
                .into_iter()
                .map(|a| Completion::Add(a, None))
                .chain(keep)
                .chain(close_reply.map(|reply| Completion::Close {
                    handle: None,
                    reply,
                }));
            fail_all(rest.collect(), &e, self);
            w.handle = None;
            return false;
        }
        info!(managed_ledger = %self.name, ledger = failed, durable = plan.durable, resend = plan.resend, "failed ledger recovered and closed");

        if plan.resend == 0 {
            // The appends of later ledgers continue as submitted; a failed
            // current ledger is replaced by the next append.
            if w.ledger_id == failed {
                w.handle = None;
            }
            drop(w);
            *backlog = keep;
            if let Err(e) = self.persist_list().await {
                warn!(managed_ledger = %self.name, error = %e, "storing the list after closing a failed ledger failed");
            }
            return false;
        }

        // Abandon every ledger created after the failed one (none has a
        // confirmed entry), then place the rest on a new ledger.
        let abandoned: Vec<u64> = {
            let mut c = self.core();
            c.pending_ledgers.drain(..).map(|(id, _)| id).collect()
        };
        w.handle = None;
        let mut attempt = 0;
        let created = loop {
            if let Some(t) = self.terminal() {
                break Err(t);
            }
            match self.create_and_store().await {
                Ok(h) => break Ok(h),
                Err(e @ MlError::Fenced(_)) => break Err(e),
                Err(e) => {
                    warn!(managed_ledger = %self.name, attempt, error = %e, "creating a ledger for the resend failed");
                    if !self.backoff(attempt, since).await {
                        break Err(MlError::Unavailable(format!(
                            "no ledger could be created within {} ms: {e}",
                            self.config.ledger_failure_retry.window_ms
                        )));
                    }
                    attempt += 1;
                }
            }
        };
        let (handle, ctime) = match created {
            Ok(x) => x,
            Err(e) => {
                let gave_up = matches!(e, MlError::Unavailable(_));
                if gave_up {
                    warn!(managed_ledger = %self.name, appends = resend.len(), error = %e, "failing the appends that could not be resent");
                    // The list without the abandoned ledgers, the failed one closed.
                    if self.persist_list().await.is_ok() {
                        for id in &abandoned {
                            delete_ledger_quietly(&self.client, *id).await;
                        }
                    }
                }
                let rest =
                    resend
                        .into_iter()
                        .map(|a| Completion::Add(a, None))
                        .chain(close_reply.map(|reply| Completion::Close {
                            handle: None,
                            reply,
                        }));
                fail_all(rest.collect(), &e, self);
                return gave_up;
            }
        };
        // The abandoned ledgers are out of the stored list now.
        for id in &abandoned {
            lock(&self.readers).remove(id);
            delete_ledger_quietly(&self.client, *id).await;
        }
        let new_id = handle.ledger_id();
        {
            let mut c = self.core();
            c.pending_ledgers.retain(|(id, _)| *id != new_id);
            if let Err(e) = c.list.add_ledger(new_id, ctime) {
                drop(c);
                let e = self.set_terminal(MlError::List(e));
                let rest = resend.into_iter().map(|a| Completion::Add(a, None));
                fail_all(rest.collect(), &e, self);
                return false;
            }
        }
        let count = resend.len();
        let mut size = 0u64;
        for (k, a) in resend.into_iter().enumerate() {
            size = size.saturating_add(u64::try_from(a.payload.len()).unwrap_or(u64::MAX));
            let pending = match handle.add_pipelined(a.payload.clone()).await {
                Ok(p) => Some(p),
                Err(e) => {
                    warn!(managed_ledger = %self.name, ledger = new_id, error = %e, "resend refused");
                    None
                }
            };
            let a = AddItem {
                ledger_id: new_id,
                entry_id: i64::try_from(k).unwrap_or(i64::MAX),
                ..a
            };
            backlog.push_back(Completion::Add(a, pending));
        }
        add(
            &self.config.metrics.appends_resent,
            u64::try_from(count).unwrap_or(u64::MAX),
        );
        info!(managed_ledger = %self.name, failed, ledger = new_id, appends = count, abandoned = ?abandoned, "appends resent on a new ledger");
        w.ledger_id = new_id;
        w.ctime_ms = ctime;
        w.entries = u64::try_from(count).unwrap_or(u64::MAX);
        w.size_bytes = size;
        match close_reply {
            Some(reply) => backlog.push_back(Completion::Close {
                handle: Some(handle),
                reply,
            }),
            None => w.handle = Some(handle),
        }
        false
    }

    /// Creates a ledger and stores it in the list (as pending) before any
    /// write; on failure nothing of it remains.
    async fn create_and_store(&self) -> Result<(WriteHandle, u64), MlError> {
        let handle = self.create_ledger().await?;
        let ctime = now_ms();
        let id = handle.ledger_id();
        self.core().pending_ledgers.push_back((id, ctime));
        if let Err(e) = self.persist_list().await {
            self.core().pending_ledgers.retain(|(x, _)| *x != id);
            delete_ledger_quietly(&self.client, id).await;
            return Err(e);
        }
        Ok((handle, ctime))
    }

    /// Closes ledger `handle` after its adds completed (nothing to do if a
    /// failure's recovery closed it already) and records the close in the
    /// in-memory list; a non-fenced close failure is resolved by recovery.
    async fn close_ledger(&self, handle: &WriteHandle) -> Result<(), MlError> {
        let id = handle.ledger_id();
        let already = self
            .core()
            .list
            .ledger(id)
            .is_some_and(|l| l.closed_ms.is_some());
        if already {
            // Recovered after a failure.
            return Ok(());
        }
        let last = match handle.close().await {
            Ok(last) => last,
            Err(e) if is_fenced(&e) => return Err(self.fenced()),
            Err(e) => {
                warn!(managed_ledger = %self.name, ledger = id, error = %e, "closing a ledger failed; recovering it");
                self.recover_ledger(id, Instant::now()).await?
            }
        };
        self.record_recovered_close(id, last)
    }

    async fn complete_roll(&self, old: Option<WriteHandle>, new_ledger_id: u64, new_ctime_ms: u64) {
        if self.terminal().is_some() {
            return;
        }
        let old_id = old.as_ref().map(WriteHandle::ledger_id);
        if let Some(old) = old
            && self.close_ledger(&old).await.is_err()
        {
            return;
        }
        let r = {
            let mut c = self.core();
            c.pending_ledgers.retain(|(id, _)| *id != new_ledger_id);
            let r = c.list.add_ledger(new_ledger_id, new_ctime_ms);
            let last = c.list.last_confirmed_position();
            drop(c);
            self.confirmed.send_replace(last);
            r
        };
        if let Err(e) = r {
            self.set_terminal(MlError::List(e));
            return;
        }
        info!(managed_ledger = %self.name, ledger = ?old_id, next = new_ledger_id, "ledger rolled over");
        if let Err(e) = self.persist_list().await {
            warn!(managed_ledger = %self.name, error = %e, "storing the list after a rollover failed");
        }
    }

    async fn complete_close(&self, handle: Option<WriteHandle>) -> Result<(), MlError> {
        if let Some(t) = self.terminal() {
            return Err(t);
        }
        if let Some(handle) = handle {
            self.close_ledger(&handle).await?;
        }
        self.persist_list().await
    }
}

/// Fails every append (and close) of `items` with `e`.
fn fail_all(items: Vec<Completion>, e: &MlError, shared: &Shared) {
    for item in items {
        match item {
            Completion::Add(a, _) => shared.reply_add(a, Err(e.clone())),
            Completion::Close { reply, .. } => {
                let _ = reply.send(Err(e.clone()));
            }
            Completion::Roll { .. } => {}
        }
    }
}

impl ManagedLedger {
    /// Opens managed ledger `name` (`tenant/ns/topic`) as its owner: reads
    /// (or creates) its node, recovery-opens every listed ledger that is not
    /// closed, stores a new current ledger in the list, and restores every
    /// durable cursor stored under the node. `cache` is the broker's entry
    /// cache, shared by all its managed ledgers.
    pub async fn open(
        client: LedgerClient,
        store: Arc<dyn MetadataStore>,
        layout: &Layout,
        name: &str,
        config: ManagedLedgerConfig,
        cache: EntryCache,
    ) -> Result<ManagedLedger, MlError> {
        let path = node_path(layout, name)?;
        let (info, version) = claim(&store, &path).await?;
        let mut list = LedgerList::from_proto(&info).map_err(MlError::List)?;
        for id in list.unclosed_ledger_ids() {
            let (listed_entries, listed_size) = list
                .ledger(id)
                .map_or((0, 0), |l| (l.entries, l.size_bytes));
            let (entries, size) = match client.open_ledger(id, true).await {
                Ok(h) => {
                    let md = h.metadata();
                    (
                        u64::try_from(md.last_entry_id.saturating_add(1)).unwrap_or(0),
                        md.length,
                    )
                }
                Err(LedgerError::NoSuchLedger(_)) => {
                    warn!(
                        managed_ledger = name,
                        ledger = id,
                        "listed ledger has no metadata"
                    );
                    (listed_entries, listed_size)
                }
                Err(e) => return Err(MlError::Ledger(e)),
            };
            list.record_closed(id, entries, size, now_ms())
                .map_err(MlError::List)?;
            info!(
                managed_ledger = name,
                ledger = id,
                entries,
                "recovered ledger closed"
            );
        }
        let shared_client = client.clone();
        let (tx, rx) = mpsc::channel(config.pending_appends_max.max(1));
        let cache_id = cache.register();
        let last = list.last_confirmed_position();
        let shared = Arc::new(Shared {
            name: name.to_string(),
            path,
            client: shared_client,
            store,
            config,
            cache,
            cache_id,
            core: Mutex::new(Core {
                list,
                pending_ledgers: VecDeque::new(),
                version,
                terminal: None,
                cursors: BTreeMap::new(),
                trimmed: Vec::new(),
            }),
            meta_lock: tokio::sync::Mutex::new(()),
            writer: tokio::sync::Mutex::new(WriterState {
                handle: None,
                closing: false,
                ledger_id: 0,
                ctime_ms: 0,
                entries: 0,
                size_bytes: 0,
                tx,
            }),
            confirmed: watch::channel(last).0,
            readers: Mutex::new(HashMap::new()),
            publish_time: Mutex::new(None),
            ttl_checked_ms: Mutex::new(None),
        });
        // The first ledger of this owner: in the list before its first write.
        let handle = shared.create_ledger().await?;
        let ctime = now_ms();
        shared
            .core()
            .pending_ledgers
            .push_back((handle.ledger_id(), ctime));
        if let Err(e) = shared.persist_list().await {
            let _ = client.delete_ledger(handle.ledger_id()).await;
            return Err(e);
        }
        {
            let mut c = shared.core();
            c.pending_ledgers.clear();
            c.list
                .add_ledger(handle.ledger_id(), ctime)
                .map_err(MlError::List)?;
        }
        {
            let mut w = shared.writer.lock().await;
            w.ledger_id = handle.ledger_id();
            w.ctime_ms = ctime;
            w.handle = Some(handle);
        }
        tokio::spawn(Shared::completion_task(Arc::downgrade(&shared), rx));
        let ml = ManagedLedger { shared };
        // Durable cursors stored under the node.
        let names = ml
            .shared
            .store
            .children(&ml.shared.path)
            .await
            .map_err(MlError::Metadata)?;
        // Restored inactive: nobody reads through them until a subscription
        // with consumers opens them.
        for cursor in names {
            cursor_io::open_durable(&ml.shared, &cursor, InitialPosition::Latest).await?;
        }
        info!(managed_ledger = name, "managed ledger opened");
        Ok(ml)
    }

    /// The name (`tenant/ns/topic`).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// A copy of the confirmed ledger list.
    pub fn ledgers(&self) -> LedgerList {
        self.shared.core().list.clone()
    }

    /// One topic property (stored with the ledger list).
    pub fn property(&self, key: &str) -> Option<String> {
        self.shared.core().list.properties().get(key).cloned()
    }

    /// Changes the topic properties with `f` (which says whether it changed
    /// anything) and stores the list, read-modify-CAS like every list update;
    /// returns once stored. A version conflict fences this owner
    /// ([`MlError::Fenced`]); a terminal handle stores nothing.
    pub async fn update_properties(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, String>) -> bool,
    ) -> Result<(), MlError> {
        if let Some(e) = self.shared.terminal() {
            return Err(e);
        }
        let changed = f(self.shared.core().list.properties_mut());
        if changed {
            self.shared.persist_list().await
        } else {
            Ok(())
        }
    }

    /// The last confirmed position.
    pub fn last_confirmed(&self) -> Position {
        self.shared.core().list.last_confirmed_position()
    }

    /// The terminal error, if the handle is terminal (fenced, closed, failed).
    pub fn terminal_error(&self) -> Option<MlError> {
        self.shared.terminal()
    }

    /// Submits an append; returns once it has its place (entry order =
    /// order of these calls). Rolls the current ledger first when the policy
    /// says so (waiting for one ledger create and list store), and creates
    /// one if a failure left none. A payload above the entry bound is
    /// refused with [`MlError::EntryTooLarge`] (only this append).
    pub async fn append_pipelined(
        &self,
        payload: impl Into<Bytes>,
    ) -> Result<PendingAppend, MlError> {
        let payload = payload.into();
        let s = &self.shared;
        let max = s.client.entry_payload_bytes_max();
        if payload.len() > max {
            return Err(MlError::EntryTooLarge {
                bytes: payload.len(),
                max,
            });
        }
        let mut w = s.writer.lock().await;
        if let Some(t) = s.terminal() {
            return Err(t);
        }
        if w.closing {
            return Err(MlError::Closed(s.name.clone()));
        }
        if w.handle.is_none() {
            self.start_ledger(&mut w).await?;
        } else {
            let decision = s
                .config
                .rollover
                .decide(w.entries, w.size_bytes, w.ctime_ms, now_ms());
            if let RolloverDecision::Roll(reason) = decision {
                info!(managed_ledger = %s.name, ledger = w.ledger_id, ?reason, "rolling over");
                self.roll(&mut w).await?;
            }
        }
        let Some(handle) = w.handle.clone() else {
            return Err(s.terminal().unwrap_or(MlError::Closed(s.name.clone())));
        };
        let pending = match handle.add_pipelined(payload.clone()).await {
            Ok(p) => Some(p),
            Err(e) if is_fenced(&e) => return Err(s.fenced()),
            // Resolved as a failure of this ledger, in order.
            Err(e) => {
                warn!(managed_ledger = %s.name, ledger = w.ledger_id, error = %e, "add refused at submission");
                None
            }
        };
        let (reply, rx) = oneshot::channel();
        let item = AddItem {
            ledger_id: w.ledger_id,
            entry_id: i64::try_from(w.entries).unwrap_or(i64::MAX),
            payload,
            reply,
            submitted: Instant::now(),
        };
        w.entries += 1;
        w.size_bytes = w
            .size_bytes
            .saturating_add(u64::try_from(item.payload.len()).unwrap_or(u64::MAX));
        if w.tx.send(Completion::Add(item, pending)).await.is_err() {
            return Err(MlError::Closed(s.name.clone()));
        }
        Ok(PendingAppend {
            rx,
            name: s.name.clone(),
        })
    }

    /// Appends `payload` and waits for its position.
    pub async fn append(&self, payload: impl Into<Bytes>) -> Result<Position, MlError> {
        self.append_pipelined(payload).await?.wait().await
    }

    async fn roll(&self, w: &mut WriterState) -> Result<(), MlError> {
        let s = &self.shared;
        let (new, ctime) = match s.create_and_store().await {
            Ok(x) => x,
            Err(e @ MlError::Fenced(_)) => return Err(e),
            Err(e) => {
                // Keep appending to the current ledger; retried on the next append.
                warn!(managed_ledger = %s.name, error = %e, "rollover: creating and storing a ledger failed");
                return Ok(());
            }
        };
        let new_ledger_id = new.ledger_id();
        let Some(old) = w.handle.replace(new) else {
            return Err(MlError::Closed(s.name.clone()));
        };
        w.ledger_id = new_ledger_id;
        w.ctime_ms = ctime;
        w.entries = 0;
        w.size_bytes = 0;
        add(&s.config.metrics.rollovers, 1);
        w.tx.send(Completion::Roll {
            old: Some(old),
            new_ledger_id,
            new_ctime_ms: ctime,
        })
        .await
        .map_err(|_| MlError::Closed(s.name.clone()))
    }

    /// Creates the current ledger when a failure left none; a failure to
    /// create it is [`MlError::Unavailable`] (not terminal).
    async fn start_ledger(&self, w: &mut WriterState) -> Result<(), MlError> {
        let s = &self.shared;
        let (new, ctime) = match s.create_and_store().await {
            Ok(x) => x,
            Err(e @ MlError::Fenced(_)) => return Err(e),
            Err(e) => {
                warn!(managed_ledger = %s.name, error = %e, "creating a ledger failed");
                return Err(MlError::Unavailable(format!("creating a ledger: {e}")));
            }
        };
        let new_ledger_id = new.ledger_id();
        w.handle = Some(new);
        w.ledger_id = new_ledger_id;
        w.ctime_ms = ctime;
        w.entries = 0;
        w.size_bytes = 0;
        info!(managed_ledger = %s.name, ledger = new_ledger_id, "new current ledger after a failure");
        w.tx.send(Completion::Roll {
            old: None,
            new_ledger_id,
            new_ctime_ms: ctime,
        })
        .await
        .map_err(|_| MlError::Closed(s.name.clone()))
    }

    /// Reads up to `count_max` confirmed entries at or after `from`, across
    /// ledger boundaries, in order (from the cache where possible).
    pub async fn read(&self, from: Position, count_max: usize) -> Result<Vec<Entry>, MlError> {
        self.shared.read(from, count_max).await
    }

    /// Waits (at most `timeout_ms`) until an entry after `pos` is confirmed;
    /// returns the last confirmed position then (unchanged on timeout).
    /// Returns the terminal error if the handle becomes terminal.
    pub async fn wait_for_entry_after(
        &self,
        pos: Position,
        timeout_ms: u64,
    ) -> Result<Position, MlError> {
        let mut rx = self.shared.confirmed.subscribe();
        let wait = async {
            loop {
                if let Some(t) = self.shared.terminal() {
                    return Err(t);
                }
                let last = self.last_confirmed();
                if last > pos && self.shared.core().list.next_valid_position(pos).is_some() {
                    return Ok(last);
                }
                if rx.changed().await.is_err() {
                    return Err(MlError::Closed(self.shared.name.clone()));
                }
            }
        };
        match tokio::time::timeout(std::time::Duration::from_millis(timeout_ms), wait).await {
            Ok(r) => r,
            Err(_) => Ok(self.last_confirmed()),
        }
    }

    /// Opens (restores or creates) durable cursor `name`; a new cursor starts
    /// at `initial`. Opening an open cursor returns it.
    pub async fn open_cursor(
        &self,
        name: &str,
        initial: InitialPosition,
    ) -> Result<ManagedCursor, MlError> {
        if !self.shared.core().cursors.contains_key(name) {
            cursor_io::open_durable(&self.shared, name, initial).await?;
        }
        let cursor = ManagedCursor {
            shared: self.shared.clone(),
            name: name.to_string(),
        };
        cursor.set_active(true)?;
        Ok(cursor)
    }

    /// The durable subscription cursor with the largest backlog (the
    /// de-duplication cursor left out): its name, estimated backlog bytes
    /// and mark-delete position. None without subscription cursors. Used by
    /// the backlog quota ([`crate::quota_io`]).
    pub fn slowest_cursor_backlog(&self) -> Option<(String, u64, Position)> {
        let c = self.shared.core();
        c.cursors
            .iter()
            .filter(|(n, x)| x.durable && n.as_str() != crate::dedup::DEDUP_CURSOR)
            .map(|(n, x)| {
                (
                    n.clone(),
                    x.cursor.backlog_size_bytes_estimate(&c.list),
                    x.cursor.mark_delete(),
                )
            })
            .max_by_key(|(_, b, _)| *b)
    }

    /// The oldest unacknowledged entry over the durable subscription
    /// cursors (the de-duplication cursor left out): the cursor furthest
    /// behind and the first entry after its mark-delete. None when every
    /// cursor is caught up or there is none. Used by the `message_age`
    /// backlog quota ([`crate::quota_io`]).
    pub fn oldest_unacked(&self) -> Option<(String, Position)> {
        let c = self.shared.core();
        c.cursors
            .iter()
            .filter(|(n, x)| x.durable && n.as_str() != crate::dedup::DEDUP_CURSOR)
            .filter_map(|(n, x)| {
                c.list
                    .next_valid_position(x.cursor.mark_delete())
                    .map(|p| (n.clone(), p))
            })
            .min_by_key(|(_, p)| *p)
    }

    /// The publish time (ms) of the entry at `pos`, read with the function
    /// of [`Self::set_publish_time_fn`]; None without one or when the entry
    /// carries none.
    pub async fn publish_time_of(&self, pos: Position) -> Result<Option<u64>, MlError> {
        let f = lock(&self.shared.publish_time).clone();
        let Some(f) = f else {
            return Ok(None);
        };
        let entries = self.shared.read(pos, 1).await?;
        Ok(entries
            .into_iter()
            .find(|e| e.position == pos)
            .and_then(|e| f(&e.payload)))
    }

    /// Whether cursor `name` is open (durable cursors are all opened with
    /// the managed ledger).
    pub fn has_cursor(&self, name: &str) -> bool {
        self.shared.core().cursors.contains_key(name)
    }

    /// Opens a non-durable cursor (a reader): never persisted, holds no data
    /// back from trimming.
    pub fn open_non_durable_cursor(&self, name: &str, initial: InitialPosition) -> ManagedCursor {
        let mut c = self.shared.core();
        let cursor = Cursor::new(name, initial, &c.list, self.shared.config.cursor.clone());
        let read_after = cursor.mark_delete();
        c.cursors.insert(
            name.to_string(),
            CursorSlot {
                cursor,
                durable: false,
                read_after,
                io: None,
                snapshots_written: 0,
                read_ahead: VecDeque::new(),
                active: true,
                persist_queued: false,
            },
        );
        ManagedCursor {
            shared: self.shared.clone(),
            name: name.to_string(),
        }
    }

    /// Persists every durable cursor whose snapshot is due (call periodically).
    pub async fn persist_due_cursors(&self) -> Result<(), MlError> {
        let names: Vec<String> = self.shared.core().cursors.keys().cloned().collect();
        for n in names {
            cursor_io::persist(&self.shared, &n, false).await?;
        }
        Ok(())
    }

    /// The owner's periodic work (call every second or so): rolls the
    /// current ledger if the rollover policy says so even without appends
    /// (age), expires entries older than the message TTL when a check is
    /// due, persists the cursors whose snapshot is due, then trims.
    pub async fn tick(&self) -> Result<Vec<u64>, MlError> {
        self.roll_if_due().await?;
        let ttl = self.shared.config.message_ttl_seconds;
        if ttl > 0 {
            let now = now_ms();
            let due = {
                let mut last = lock(&self.shared.ttl_checked_ms);
                let due = last.is_none_or(|t| {
                    now.saturating_sub(t) >= self.shared.config.ttl_check_interval_ms
                });
                if due {
                    *last = Some(now);
                }
                due
            };
            if due {
                self.expire_messages(ttl).await?;
            }
        }
        self.persist_due_cursors().await?;
        self.trim().await
    }

    /// Rolls the current ledger now if the rollover policy says so (an idle
    /// ledger past its maximum age is rolled without waiting for an append).
    pub async fn roll_if_due(&self) -> Result<(), MlError> {
        let s = &self.shared;
        let mut w = s.writer.lock().await;
        if let Some(t) = s.terminal() {
            return Err(t);
        }
        if w.handle.is_none() {
            return Ok(());
        }
        let decision = s
            .config
            .rollover
            .decide(w.entries, w.size_bytes, w.ctime_ms, now_ms());
        if let RolloverDecision::Roll(reason) = decision {
            info!(managed_ledger = %s.name, ledger = w.ledger_id, ?reason, "rolling over (tick)");
            self.roll(&mut w).await?;
        }
        Ok(())
    }

    /// Sets the function reading an entry's publish time, used by TTL expiry
    /// (without one, whole ledgers closed before the cutoff expire).
    pub fn set_publish_time_fn(&self, f: PublishTimeFn) {
        *lock(&self.shared.publish_time) = Some(f);
    }

    /// Expires entries older than `ttl_seconds` (0: none) on every durable
    /// cursor by moving its mark-delete (never deleting anything); an entry
    /// whose publish time cannot be read counts as new. Returns the cursors
    /// moved.
    pub async fn expire_messages(&self, ttl_seconds: u64) -> Result<Vec<String>, MlError> {
        let s = &self.shared;
        if let Some(t) = s.terminal() {
            return Err(t);
        }
        let Some(cutoff) = ttl_cutoff_ms(ttl_now_ms(), ttl_seconds) else {
            return Ok(Vec::new());
        };
        let f = lock(&s.publish_time).clone();
        let target = match f {
            None => ttl::target_by_close_time(&s.core().list, cutoff),
            Some(f) => {
                let list = s.core().list.clone();
                let mut search = PublishTimeSearch::new(&list, cutoff);
                let mut step = search.step();
                let result = loop {
                    match step {
                        SearchStep::Read(p) => {
                            let e = s.read(p, 1).await?;
                            let entry = e
                                .into_iter()
                                .find(|e| e.position == p)
                                .ok_or(MlError::NotReadable(p))?;
                            let t = f(&entry.payload).unwrap_or(u64::MAX);
                            step = search.feed(p, t).map_err(MlError::Search)?;
                        }
                        SearchStep::Done(r) => break r,
                    }
                };
                ttl::target_from_search(&list, result)
            }
        };
        let Some(target) = target else {
            return Ok(Vec::new());
        };
        let moved: Vec<String> = {
            let mut c = s.core();
            let c = &mut *c;
            let mut moved = Vec::new();
            // The de-duplication cursor is no subscription: its mark-delete
            // must stay the position its snapshot covers.
            for (name, slot) in c
                .cursors
                .iter_mut()
                .filter(|(n, x)| x.durable && n.as_str() != crate::dedup::DEDUP_CURSOR)
            {
                match slot.cursor.expire_up_to(target, &c.list) {
                    Ok(true) => moved.push(name.clone()),
                    Ok(false) => {}
                    Err(e) => {
                        warn!(managed_ledger = %s.name, cursor = %name, error = %e, "TTL expiry refused")
                    }
                }
            }
            moved
        };
        for name in &moved {
            add(&s.config.metrics.ttl_expiries, 1);
            info!(managed_ledger = %s.name, cursor = %name, up_to = %target, ttl_seconds, "entries expired by TTL");
            cursor_io::persist(s, name, false).await?;
        }
        Ok(moved)
    }

    /// Deletes the ledgers trimming allows now (behind the slowest durable
    /// cursor, within retention): stores the list without them first, then
    /// deletes them. Returns the deleted ledger ids.
    pub async fn trim(&self) -> Result<Vec<u64>, MlError> {
        let s = &self.shared;
        if let Some(t) = s.terminal() {
            return Err(t);
        }
        let ids = {
            let mut c = s.core();
            let slowest = c
                .cursors
                .values()
                .filter(|x| x.durable)
                .map(|x| x.cursor.mark_delete())
                .min();
            let ids = deletable_ledgers(&c.list, slowest, &s.config.retention, now_ms());
            for id in &ids {
                c.list.remove_ledger(*id).map_err(MlError::List)?;
            }
            // With those a failed earlier store left behind.
            c.trimmed.extend(ids);
            c.trimmed.clone()
        };
        if ids.is_empty() {
            return Ok(ids);
        }
        s.persist_list().await?;
        s.core().trimmed.retain(|id| !ids.contains(id));
        for id in &ids {
            lock(&s.readers).remove(id);
            s.cache.evict_ledger(s.cache_id, *id);
            match s.client.delete_ledger(*id).await {
                Ok(()) | Err(LedgerError::NoSuchLedger(_)) => {}
                Err(e) => {
                    warn!(managed_ledger = %s.name, ledger = id, error = %e, "trim: delete failed")
                }
            }
        }
        add(
            &s.config.metrics.ledgers_trimmed,
            u64::try_from(ids.len()).unwrap_or(u64::MAX),
        );
        info!(managed_ledger = %s.name, ledgers = ?ids, "trimmed");
        Ok(ids)
    }

    /// Closes: persists every cursor, closes the current ledger and stores
    /// the list with it closed. The handle is terminal afterwards.
    pub async fn close(&self) -> Result<(), MlError> {
        let s = &self.shared;
        let names: Vec<String> = s.core().cursors.keys().cloned().collect();
        for n in names {
            cursor_io::close(s, &n).await?;
        }
        let mut w = s.writer.lock().await;
        let first_close = !w.closing;
        w.closing = true;
        let handle = w.handle.take();
        if handle.is_some() || (first_close && s.terminal().is_none()) {
            let (reply, rx) = oneshot::channel();
            w.tx.send(Completion::Close { handle, reply })
                .await
                .map_err(|_| MlError::Closed(s.name.clone()))?;
            // The completion task may need the writer lock (a failure's
            // resend) before it gets to the close.
            drop(w);
            rx.await.unwrap_or(Err(MlError::Closed(s.name.clone())))?;
        }
        s.set_terminal(MlError::Closed(s.name.clone()));
        s.cache.evict_all(s.cache_id);
        Ok(())
    }

    /// Deletes the whole managed ledger: its cursors (their nodes and
    /// ledgers), its ledgers and its node. The handle is terminal afterwards.
    pub async fn delete(&self) -> Result<(), MlError> {
        let s = &self.shared;
        s.set_terminal(MlError::Closed(s.name.clone()));
        let handle = s.writer.lock().await.handle.take();
        drop(handle);
        let cursors: Vec<(String, Option<Arc<tokio::sync::Mutex<CursorLedger>>>)> = {
            let mut c = s.core();
            std::mem::take(&mut c.cursors)
                .into_iter()
                .map(|(n, slot)| (n, slot.io))
                .collect()
        };
        for (n, io) in cursors {
            if let Some(io) = io {
                let id = io.lock().await.ledger_id;
                delete_ledger_quietly(&s.client, id).await;
            }
            delete_node_quietly(&*s.store, &join(&s.path, &n)).await?;
        }
        // Cursor nodes (and their ledgers) of cursors never opened here.
        for n in s.store.children(&s.path).await.map_err(MlError::Metadata)? {
            let node = join(&s.path, &n);
            match s.store.get(&node).await {
                Ok((data, _)) => {
                    if let Some(id) = proto::CursorInfo::decode(data.as_slice())
                        .ok()
                        .and_then(|i| u64::try_from(i.cursor_ledger_id).ok())
                    {
                        delete_ledger_quietly(&s.client, id).await;
                    }
                }
                Err(MetadataError::NoNode(_)) => {}
                Err(e) => return Err(MlError::Metadata(e)),
            }
            delete_node_quietly(&*s.store, &node).await?;
        }
        let ids: Vec<u64> = {
            let c = s.core();
            c.record().ledgers.iter().map(|l| l.ledger_id).collect()
        };
        for id in ids {
            delete_ledger_quietly(&s.client, id).await;
        }
        delete_node_quietly(&*s.store, &s.path).await?;
        s.cache.evict_all(s.cache_id);
        info!(managed_ledger = %s.name, "managed ledger deleted");
        Ok(())
    }
}

async fn delete_ledger_quietly(client: &LedgerClient, id: u64) {
    match client.delete_ledger(id).await {
        Ok(()) | Err(LedgerError::NoSuchLedger(_)) => {}
        Err(e) => warn!(ledger = id, error = %e, "ledger delete failed"),
    }
}

async fn delete_node_quietly(store: &dyn MetadataStore, path: &str) -> Result<(), MlError> {
    match store.delete(path, Expected::Any).await {
        Ok(()) | Err(MetadataError::NoNode(_)) => Ok(()),
        Err(e) => Err(MlError::Metadata(e)),
    }
}

/// Read-modify-CAS rounds of [`claim`] lost to a concurrent writer before
/// opening fails.
const CLAIM_ATTEMPTS_MAX: u32 = 10;

/// Reads (or creates) the node and rewrites it unchanged by CAS: from then on
/// a previous owner's list update fails on the version (it is fenced from
/// the list before its ledgers are fenced), so nothing it adds to the list
/// later escapes this owner's recovery.
async fn claim(
    store: &Arc<dyn MetadataStore>,
    path: &str,
) -> Result<(proto::ManagedLedgerInfo, Version), MlError> {
    let mut attempts = 0;
    loop {
        let (info, version) = read_or_create(store, path).await?;
        match store
            .set(path, &info.encode_to_vec(), Expected::Version(version))
            .await
        {
            Ok(stat) => return Ok((info, stat.version)),
            Err(MetadataError::BadVersion { .. }) if attempts + 1 < CLAIM_ATTEMPTS_MAX => {
                attempts += 1;
                info!(
                    path,
                    attempts, "managed ledger node changed while claiming; retrying"
                );
            }
            Err(MetadataError::BadVersion { .. }) => {
                return Err(MlError::Fenced(path.to_string()));
            }
            Err(e) => return Err(MlError::Metadata(e)),
        }
    }
}

async fn read_or_create(
    store: &Arc<dyn MetadataStore>,
    path: &str,
) -> Result<(proto::ManagedLedgerInfo, Version), MlError> {
    loop {
        match store.get(path).await {
            Ok((data, stat)) => {
                let info = proto::ManagedLedgerInfo::decode(data.as_slice()).map_err(|e| {
                    MlError::Corrupt {
                        path: path.to_string(),
                        reason: e.to_string(),
                    }
                })?;
                return Ok((info, stat.version));
            }
            Err(MetadataError::NoNode(_)) => {}
            Err(e) => return Err(MlError::Metadata(e)),
        }
        if let Some(parent) = cms_bookie::metadata::parent_of(path) {
            store.create_all(parent).await.map_err(MlError::Metadata)?;
        }
        let empty = proto::ManagedLedgerInfo::default().encode_to_vec();
        match store.create(path, &empty, CreateMode::Persistent).await {
            Ok((_, stat)) => return Ok((proto::ManagedLedgerInfo::default(), stat.version)),
            Err(MetadataError::NodeExists(_)) => continue,
            Err(e) => return Err(MlError::Metadata(e)),
        }
    }
}

/// A cursor of a managed ledger (durable or not). Cheap to clone.
#[derive(Clone)]
pub struct ManagedCursor {
    pub(super) shared: Arc<Shared>,
    pub(super) name: String,
}

impl std::fmt::Debug for ManagedCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedCursor")
            .field("managed_ledger", &self.shared.name)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ManagedCursor {
    /// The cursor name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn with<T>(&self, f: impl FnOnce(&mut CursorSlot, &LedgerList) -> T) -> Result<T, MlError> {
        let mut c = self.shared.core();
        let c = &mut *c;
        let slot = c
            .cursors
            .get_mut(&self.name)
            .ok_or_else(|| MlError::NoCursor(self.name.clone()))?;
        Ok(f(slot, &c.list))
    }

    /// Marks whether anyone reads through this cursor (a subscription with
    /// consumers). Cursors are active when opened with
    /// [`ManagedLedger::open_cursor`] or
    /// [`ManagedLedger::open_non_durable_cursor`] and inactive when restored
    /// with the managed ledger; an inactive cursor holds no entries in the
    /// broker's entry cache.
    pub fn set_active(&self, active: bool) -> Result<(), MlError> {
        self.with(|s, _| s.active = active)?;
        if !active {
            self.shared.evict_read();
        }
        Ok(())
    }

    /// The mark-delete position.
    pub fn mark_delete(&self) -> Result<Position, MlError> {
        self.with(|s, _| s.cursor.mark_delete())
    }

    /// True if the entry at `pos` is acknowledged.
    pub fn is_acked(&self, pos: Position) -> Result<bool, MlError> {
        self.with(|s, _| s.cursor.is_acked(pos))
    }

    /// Entries not yet acknowledged.
    pub fn backlog_entries(&self) -> Result<u64, MlError> {
        self.with(|s, l| s.cursor.backlog_entries(l))
    }

    /// The last position read through this cursor.
    pub fn read_position(&self) -> Result<Position, MlError> {
        self.with(|s, _| s.read_after)
    }

    /// The individually acknowledged ranges after the mark-delete (inclusive
    /// `(first, last)` pairs, ascending).
    pub fn acked_ranges(&self) -> Result<Vec<(Position, Position)>, MlError> {
        self.with(|s, _| s.cursor.acked_ranges().iter().collect())
    }

    /// Snapshots of this cursor written durably by this owner so far (the
    /// one written on open included). When it grows across a call, every
    /// acknowledgement made before that call is persisted.
    pub fn snapshots_written(&self) -> Result<u64, MlError> {
        self.with(|s, _| s.snapshots_written)
    }

    /// The mark-delete properties (restored with the cursor).
    pub fn properties(&self) -> Result<BTreeMap<String, i64>, MlError> {
        self.with(|s, _| s.cursor.properties().clone())
    }

    /// Replaces the mark-delete properties; they are written with the next
    /// snapshot ([`Self::persist`] forces one).
    pub fn set_properties(&self, properties: BTreeMap<String, i64>) -> Result<(), MlError> {
        self.with(|s, _| s.cursor.set_properties(properties))
    }

    /// Reads up to `count_max` entries after the read position, skipping
    /// acknowledged ones, and moves the read position past them. Entries
    /// not in the cache are read with read-ahead: up to the config's
    /// `read_ahead_entries` at once, fewer when the surplus would not fit
    /// `read_ahead_bytes_max` at the ledger's mean entry size; the surplus
    /// is kept (bounded) for the next calls instead of entering the shared
    /// cache.
    pub async fn read_next(&self, count_max: usize) -> Result<Vec<Entry>, MlError> {
        self.read_next_within(count_max, None).await
    }

    /// [`Self::read_next`] with an optional byte budget for this read (a
    /// dispatch-rate-limited subscription passes its rate's share, as
    /// Pulsar's dispatchers read no more than the rate limiter's available
    /// permits): with a budget, entries not already read ahead are read
    /// from the bookies in pieces of about `budget_bytes` (at least one
    /// entry) and nothing more is read ahead, so a reader held to a few MiB/s
    /// does not pull several MiB through the bookies and the broker at once.
    pub async fn read_next_within(
        &self,
        count_max: usize,
        budget_bytes: Option<usize>,
    ) -> Result<Vec<Entry>, MlError> {
        let (from, buffered, mean) = self.with(|s, l| {
            // Acks may have moved the mark-delete past what was read.
            s.read_after = s.read_after.max(s.cursor.mark_delete());
            let from = l.next_valid_position(s.read_after);
            // Drop read-ahead the cursor has moved past (acks); anything
            // else not starting at `from` is stale.
            while from.is_some_and(|f| s.read_ahead.front().is_some_and(|e| e.position < f)) {
                s.read_ahead.pop_front();
            }
            if s.read_ahead.front().map(|e| e.position) != from {
                s.read_ahead.clear();
            }
            let n = count_max.min(s.read_ahead.len());
            // The mean entry size of the ledger read from, to size the read.
            let mean = from
                .and_then(|f| l.ledger(f.ledger_id))
                .filter(|m| m.entries > 0)
                .map(|m| m.size_bytes / m.entries);
            (from, s.read_ahead.drain(..n).collect::<Vec<_>>(), mean)
        })?;
        let Some(from) = from else {
            return Ok(Vec::new());
        };
        let entries = if buffered.is_empty() {
            let bytes_max = self.shared.config.read_ahead_bytes_max;
            let ahead = match budget_bytes {
                Some(b) => budgeted_count(count_max, b.min(bytes_max), mean),
                None => read_ahead_count(
                    count_max,
                    self.shared.config.read_ahead_entries,
                    bytes_max,
                    mean,
                ),
            };
            let mut entries = self.shared.read(from, ahead).await?;
            let rest = entries.split_off(count_max.min(entries.len()));
            self.with(|s, _| {
                let mut bytes = 0;
                s.read_ahead = rest
                    .into_iter()
                    .take_while(|e| {
                        bytes += e.payload.len();
                        bytes <= bytes_max
                    })
                    .collect();
            })?;
            entries
        } else {
            buffered
        };
        let out = self.with(|s, _| {
            if let Some(last) = entries.last() {
                s.read_after = s.read_after.max(last.position);
            }
            entries
                .into_iter()
                .filter(|e| !s.cursor.is_acked(e.position))
                .collect::<Vec<_>>()
        })?;
        self.shared.evict_read();
        Ok(out)
    }

    /// Acknowledges some messages of the batch entry at `pos` (Pulsar ack
    /// set: 1 = left unacked; see
    /// [`crate::managed_ledger::Cursor::ack_batch_index`]); a snapshot that
    /// is due is written as `persist` says.
    pub async fn ack_batch_index(
        &self,
        pos: Position,
        ack_set: &[i64],
        persist: Persist,
    ) -> Result<AckOutcome, MlError> {
        let o = self
            .with(|s, l| s.cursor.ack_batch_index(pos, ack_set, l))?
            .map_err(MlError::Cursor)?;
        self.persist_due(persist).await?;
        Ok(o)
    }

    /// Writes a snapshot if one is due: now (`Wait`), or in a task of its
    /// own (`Background`; at most one queued per cursor, a failure is
    /// counted and logged and the next due snapshot retries).
    async fn persist_due(&self, persist: Persist) -> Result<(), MlError> {
        match persist {
            Persist::Wait => cursor_io::persist(&self.shared, &self.name, false).await,
            Persist::Background => {
                let queue = self.with(|s, _| {
                    let due = s.durable && !s.persist_queued && s.cursor.should_persist(now_ms());
                    s.persist_queued |= due;
                    due
                })?;
                if queue {
                    let (shared, name) = (self.shared.clone(), self.name.clone());
                    tokio::spawn(async move {
                        let r = cursor_io::persist(&shared, &name, false).await;
                        if let Some(slot) = shared.core().cursors.get_mut(&name) {
                            slot.persist_queued = false;
                        }
                        match r {
                            Ok(()) | Err(MlError::NoCursor(_) | MlError::Closed(_)) => {}
                            Err(e) => {
                                warn!(managed_ledger = %shared.name, cursor = %name, error = %e, "cursor snapshot failed; the next due one retries");
                            }
                        }
                    });
                }
                Ok(())
            }
        }
    }

    /// The bit set (1 = unacked) of a partly acknowledged batch entry.
    pub fn batch_unacked(&self, pos: Position) -> Result<Option<Vec<i64>>, MlError> {
        self.with(|s, _| s.cursor.batch_unacked(pos).map(<[i64]>::to_vec))
    }

    /// Individually acknowledges `pos`; a snapshot that is due is written
    /// as `persist` says.
    pub async fn ack(&self, pos: Position, persist: Persist) -> Result<AckOutcome, MlError> {
        let o = self
            .with(|s, l| s.cursor.ack(pos, l))?
            .map_err(MlError::Cursor)?;
        self.persist_due(persist).await?;
        Ok(o)
    }

    /// Acknowledges everything at or before `pos`; a snapshot that is due
    /// is written as `persist` says.
    pub async fn ack_cumulative(
        &self,
        pos: Position,
        persist: Persist,
    ) -> Result<AckOutcome, MlError> {
        let o = self
            .with(|s, l| s.cursor.ack_cumulative(pos, l))?
            .map_err(MlError::Cursor)?;
        self.persist_due(persist).await?;
        Ok(o)
    }

    /// Writes a snapshot now if anything changed since the last one
    /// (regardless of the rate limit).
    pub async fn persist(&self) -> Result<(), MlError> {
        cursor_io::persist(&self.shared, &self.name, true).await
    }

    /// Moves the cursor (forgetting individual acks); the read position
    /// follows the new mark-delete.
    pub async fn seek(&self, target: SeekTarget) -> Result<(), MlError> {
        self.with(|s, l| {
            let to = match target {
                SeekTarget::Earliest => l
                    .first_position()
                    .unwrap_or_else(|| l.last_confirmed_position().next_in_ledger()),
                SeekTarget::Latest => l.last_confirmed_position().next_in_ledger(),
                SeekTarget::Position(p) => p,
            };
            s.cursor.reset_to(to, l).map(|()| {
                s.read_after = s.cursor.mark_delete();
                s.read_ahead.clear();
            })
        })?
        .map_err(MlError::Cursor)?;
        cursor_io::persist(&self.shared, &self.name, false).await
    }

    /// Moves the cursor to the first entry published at or after
    /// `target_ms` (binary search; `publish_time_ms` reads the publish time
    /// from a payload, `None` = unknown, taken as 0), or to the end if every
    /// entry is older. Returns where it moved.
    pub async fn seek_publish_time(
        &self,
        target_ms: u64,
        publish_time_ms: impl Fn(&[u8]) -> Option<u64>,
    ) -> Result<Option<Position>, MlError> {
        let mut search = PublishTimeSearch::new(&self.shared.core().list, target_ms);
        let mut step = search.step();
        let found = loop {
            match step {
                SearchStep::Read(p) => {
                    let e = self.shared.read(p, 1).await?;
                    let entry = e
                        .into_iter()
                        .find(|e| e.position == p)
                        .ok_or(MlError::NotReadable(p))?;
                    let t = publish_time_ms(&entry.payload).unwrap_or(0);
                    step = search.feed(p, t).map_err(MlError::Search)?;
                }
                SearchStep::Done(SearchResult::Found(p)) => break Some(p),
                SearchStep::Done(SearchResult::NoneAtOrAfter) => break None,
            }
        };
        match found {
            Some(p) => self.seek(SeekTarget::Position(p)).await?,
            None => self.seek(SeekTarget::Latest).await?,
        }
        Ok(found)
    }

    /// Persists a final snapshot and closes the cursor ledger; the cursor
    /// stays restorable from it.
    pub async fn close(&self) -> Result<(), MlError> {
        cursor_io::close(&self.shared, &self.name).await
    }
}

// ---------------------------------------------------------------------------
// Additions for subscriptions and dispatch (issue 7, `crate::subscription`):
// rewinding a cursor's read position and removing a cursor (unsubscribe,
// closing a reader). Kept in this one block.
// ---------------------------------------------------------------------------

impl ManagedCursor {
    /// Moves the read position back to the mark-delete, so every
    /// unacknowledged entry is read again (acknowledged ones are skipped by
    /// [`ManagedCursor::read_next`]). Acks are untouched.
    pub fn rewind(&self) -> Result<(), MlError> {
        self.with(|s, _| s.read_after = s.cursor.mark_delete())
    }
}

impl ManagedLedger {
    /// Removes cursor `name` from this managed ledger. A durable cursor is
    /// deleted: its metadata node, then its cursor ledger (it no longer
    /// holds data back from trimming, and is not restored on the next open).
    /// A non-durable cursor is just dropped. Removing a cursor that does not
    /// exist is not an error.
    pub async fn delete_cursor(&self, name: &str) -> Result<(), MlError> {
        let s = &self.shared;
        let slot = s.core().cursors.remove(name);
        let durable = slot.as_ref().is_none_or(|x| x.durable);
        if !durable {
            return Ok(());
        }
        // A snapshot write in flight finishes before the node goes.
        let ledger = match slot.and_then(|x| x.io) {
            Some(io) => Some(io.lock().await.ledger_id),
            None => None,
        };
        delete_node_quietly(&*s.store, &join(&s.path, name)).await?;
        if let Some(id) = ledger {
            delete_ledger_quietly(&s.client, id).await;
        }
        s.evict_read();
        info!(managed_ledger = %s.name, cursor = name, "cursor deleted");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_path_puts_persistent_between_namespace_and_topic() {
        let layout = Layout::new("/cms").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            node_path(&layout, "acme/ns1/orders"),
            Ok("/cms/managed-ledgers/acme/ns1/persistent/orders".to_string())
        );
        for bad in ["acme/ns1", "a/b/c/d", "a//c", ""] {
            assert_eq!(
                node_path(&layout, bad),
                Err(MlError::BadName(bad.to_string()))
            );
        }
    }

    #[test]
    fn the_stored_record_lists_created_ledgers_before_they_are_current_in_memory() {
        let mut list = LedgerList::new();
        list.add_ledger(5, 100).unwrap_or_else(|e| panic!("{e}"));
        list.record_add(5, 0, 10).unwrap_or_else(|e| panic!("{e}"));
        let core = Core {
            list,
            pending_ledgers: VecDeque::from([(7, 200)]),
            version: 0,
            terminal: None,
            cursors: BTreeMap::new(),
            trimmed: Vec::new(),
        };
        let rec = core.record();
        let ids: Vec<u64> = rec.ledgers.iter().map(|l| l.ledger_id).collect();
        assert_eq!(ids, vec![5, 7]);
        assert_eq!(rec.current_ledger_id, Some(7));
        assert_eq!(rec.ledgers[0].entries, 1);
        // The in-memory list still has 5 current (its adds still complete).
        assert_eq!(core.list.current_ledger_id(), Some(5));
    }

    #[test]
    fn reads_ahead_no_more_than_the_cursor_can_keep() {
        // Small entries: the entry bound decides.
        assert_eq!(read_ahead_count(1, 100, 4 << 20, Some(100)), 100);
        // 128 KiB batches and 4 MiB kept: 8 asked + 32 ahead, not 100
        // (of which 60 were dropped and read again).
        assert_eq!(read_ahead_count(8, 100, 4 << 20, Some(128 << 10)), 40);
        // More asked than the bounds: what was asked.
        assert_eq!(read_ahead_count(200, 100, 4 << 20, Some(128 << 10)), 200);
        assert_eq!(read_ahead_count(3, 100, 1 << 10, Some(1 << 20)), 3);
        // Unknown size (nothing recorded yet) and zero sizes.
        assert_eq!(read_ahead_count(1, 100, 4 << 20, None), 100);
        assert_eq!(read_ahead_count(1, 100, 4 << 20, Some(0)), 100);
        assert_eq!(read_ahead_count(0, 0, 0, Some(1)), 0);
    }

    #[test]
    fn a_read_budget_bounds_the_entries_read() {
        // 8 MiB/s in tenths of a second: 819 KiB, six 128 KiB batches.
        assert_eq!(budgeted_count(1000, 838_860, Some(128 << 10)), 6);
        // Never more than asked, never none.
        assert_eq!(budgeted_count(3, 838_860, Some(1 << 10)), 3);
        assert_eq!(budgeted_count(1000, 1024, Some(1 << 20)), 1);
        assert_eq!(budgeted_count(1000, 0, Some(1 << 10)), 1);
        // Unknown or zero entry size: what was asked.
        assert_eq!(budgeted_count(7, 838_860, None), 7);
        assert_eq!(budgeted_count(7, 838_860, Some(0)), 7);
    }

    #[test]
    fn only_fenced_ledger_errors_count_as_fenced() {
        assert!(is_fenced(&LedgerError::Writer(WriterError::Fenced)));
        assert!(is_fenced(&LedgerError::Add(AddError::Failed(
            WriterError::Fenced
        ))));
        assert!(!is_fenced(&LedgerError::HandleClosed));
        assert!(!is_fenced(&LedgerError::Add(AddError::Closing)));
    }
}
