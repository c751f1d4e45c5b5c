//! The bookie's request logic, without the network: adds, reads (with fencing),
//! long-poll reads, LAC reads and writes, over the journal and ledger storage.
//!
//! Promises (DESIGN §4):
//! - **Ack = durable.** [`BookieCore::add`] answers `OK` only after the entry's
//!   journal record is durable under the sync policy (fsync-before-ack by
//!   default); a journal failure answers `IO_ERROR` and turns the bookie
//!   read-only for good (RELIABILITY P0-10).
//! - **Fencing.** The fence check and the write-cache put of an add happen
//!   under the ledger's lock, and a fence sets the flag under the same lock, so
//!   an add that passed the check is in storage before any fencing read is
//!   answered; the fence is journalled and synced before it is answered. A fence
//!   for a ledger this bookie has never seen creates its (fenced) state.
//! - **Master key.** A ledger's first add or fence fixes its key; any other key
//!   gets `UNAUTHORIZED`.
//! - **Limbo.** For a ledger in limbo a missing entry is `UNKNOWN_LEDGER_STATE`,
//!   never `NO_ENTRY` / `NO_LEDGER`.
//! - **Bounds.** Entry size, range count and bytes, long-poll wait: over a bound
//!   is `BAD_REQUEST` (or is capped), a full journal queue or write cache is
//!   `TOO_MANY_REQUESTS`; nothing else on the connection is affected.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use tracing::{debug, error, warn};

use super::ledger::{LedgerHandle, decode_explicit_lac, encode_explicit_lac, owned_key};
use super::metrics::ServerMetrics;
use crate::entry::Entry;
use crate::journal::{Journal, JournalError, JournalRecord};
use crate::proto::bookie::StatusCode;
use crate::storage::{LedgerState, LedgerStorage, StorageError};

/// Default largest entry accepted: a maximal Pulsar message (5 MiB) plus its
/// metadata and our 36-byte entry prefix.
pub const ENTRY_BYTES_MAX_DEFAULT: usize = 5 * 1024 * 1024 + 64 * 1024;

/// Longest master key accepted, in bytes (ours are 20).
pub const MASTER_KEY_BYTES_MAX: usize = 64;

/// Bounds of the request paths.
#[derive(Debug, Clone)]
pub struct CoreLimits {
    /// Largest entry body, in bytes.
    pub entry_bytes_max: usize,
    /// Most entries in one range read.
    pub read_range_entries_max: usize,
    /// Most body bytes in one range read.
    pub read_range_bytes_max: usize,
    /// Longest long-poll wait, in milliseconds.
    pub long_poll_ms_max: u64,
    /// Longest an add waits for a checkpoint when the write cache is full, in
    /// milliseconds (then TOO_MANY_REQUESTS).
    pub write_cache_wait_ms_max: u64,
}

impl Default for CoreLimits {
    fn default() -> Self {
        CoreLimits {
            entry_bytes_max: ENTRY_BYTES_MAX_DEFAULT,
            read_range_entries_max: 1_000,
            read_range_bytes_max: 4 * 1024 * 1024,
            long_poll_ms_max: 30_000,
            write_cache_wait_ms_max: 1_000,
        }
    }
}

/// Whether the bookie takes writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BookieMode {
    /// Adds accepted.
    Writable = 0,
    /// Disk above the threshold: adds refused (READ_ONLY), reads served.
    ReadOnlyDisk = 1,
    /// The journal failed to sync: adds refused for good, reads served.
    ReadOnlyJournalFailed = 2,
    /// Shutting down: adds refused, reads served until the end.
    Draining = 3,
    /// Set read-only by an operator (`cms-bookie readonly <id> on`): adds
    /// refused, reads served, until the operator turns it off. The disk
    /// watch never changes this mode. Not kept across a restart.
    ReadOnlyManual = 4,
}

impl BookieMode {
    fn from_u8(v: u8) -> BookieMode {
        match v {
            0 => BookieMode::Writable,
            1 => BookieMode::ReadOnlyDisk,
            2 => BookieMode::ReadOnlyJournalFailed,
            4 => BookieMode::ReadOnlyManual,
            _ => BookieMode::Draining,
        }
    }
}

/// An add, as the protocol delivers it.
#[derive(Debug, Clone)]
pub struct AddOp {
    /// The ledger.
    pub ledger_id: u64,
    /// The entry.
    pub entry_id: i64,
    /// The writer's master key.
    pub master_key: Bytes,
    /// Written by recovery (accepted on a fenced ledger).
    pub recovery: bool,
    /// The entry bytes.
    pub body: Bytes,
}

/// A read's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    /// Outcome.
    pub status: StatusCode,
    /// The entry bytes when `status` is OK.
    pub body: Bytes,
}

/// The bookie's request logic; shared by every connection.
#[derive(Debug)]
pub struct BookieCore {
    journal: Journal,
    storage: Arc<LedgerStorage>,
    ledgers: DashMap<u64, Arc<LedgerHandle>>,
    mode: AtomicU8,
    limits: CoreLimits,
    metrics: ServerMetrics,
    /// Wakes the checkpoint task early (the write cache is full).
    flush_wanted: tokio::sync::Notify,
    /// Counts completed checkpoints, so a full add can wait for the next one.
    flushed: tokio::sync::watch::Sender<u64>,
}

fn storage_status(ledger_id: u64, e: &StorageError) -> StatusCode {
    match e {
        StorageError::WriteCacheFull => StatusCode::TooManyRequests,
        StorageError::TooLarge(_) => StatusCode::BadRequest,
        other => {
            error!(ledger = ledger_id, error = %other, "ledger storage failed");
            StatusCode::IoError
        }
    }
}

impl BookieCore {
    /// The core over an opened journal and storage.
    pub fn new(
        journal: Journal,
        storage: Arc<LedgerStorage>,
        limits: CoreLimits,
        metrics: ServerMetrics,
    ) -> Self {
        BookieCore {
            journal,
            storage,
            ledgers: DashMap::new(),
            mode: AtomicU8::new(BookieMode::Writable as u8),
            limits,
            metrics,
            flush_wanted: tokio::sync::Notify::new(),
            flushed: tokio::sync::watch::channel(0).0,
        }
    }

    /// Resolves when an add asked for an early checkpoint (full write cache).
    pub async fn flush_wanted(&self) {
        self.flush_wanted.notified().await;
    }

    /// Called by the checkpoint task after each successful checkpoint.
    pub fn checkpoint_done(&self) {
        self.flushed.send_modify(|n| *n += 1);
    }

    /// The journal.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The ledger storage.
    pub fn storage(&self) -> &Arc<LedgerStorage> {
        &self.storage
    }

    /// The limits in force.
    pub fn limits(&self) -> &CoreLimits {
        &self.limits
    }

    /// The metrics.
    pub fn metrics(&self) -> &ServerMetrics {
        &self.metrics
    }

    /// Current mode.
    pub fn mode(&self) -> BookieMode {
        let m = BookieMode::from_u8(self.mode.load(Ordering::Acquire));
        if m == BookieMode::Writable && self.journal.is_failed() {
            self.set_mode(BookieMode::ReadOnlyJournalFailed);
            return BookieMode::ReadOnlyJournalFailed;
        }
        m
    }

    /// Changes the mode. A journal failure and draining are final: a later
    /// request for Writable or ReadOnlyDisk does not undo them.
    pub fn set_mode(&self, mode: BookieMode) {
        let _ = self
            .mode
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                let cur = BookieMode::from_u8(cur);
                let sticky = matches!(
                    cur,
                    BookieMode::ReadOnlyJournalFailed | BookieMode::Draining
                );
                let allowed = !sticky
                    || (cur == BookieMode::ReadOnlyJournalFailed && mode == BookieMode::Draining);
                allowed.then_some(mode as u8)
            });
        self.metrics
            .mode
            .set(self.mode.load(Ordering::Acquire) as i64);
    }

    /// Changes the mode from `from` to `to` only if it is still `from`
    /// (the disk watch uses it so it never overrides an operator's or a
    /// failure's mode set in between). Returns whether it changed.
    pub fn transition(&self, from: BookieMode, to: BookieMode) -> bool {
        let changed = self
            .mode
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        self.metrics
            .mode
            .set(self.mode.load(Ordering::Acquire) as i64);
        changed
    }

    /// The operator's read-only switch. `on` moves a writable or disk-read-only
    /// bookie to [`BookieMode::ReadOnlyManual`]; `off` moves it back to
    /// writable (the disk watch re-checks the disk on its next tick). A journal
    /// failure or draining is final and is returned as an error.
    pub fn set_manual_read_only(&self, on: bool) -> Result<BookieMode, BookieMode> {
        let result = self
            .mode
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                match (BookieMode::from_u8(cur), on) {
                    (BookieMode::ReadOnlyJournalFailed | BookieMode::Draining, _) => None,
                    (_, true) => Some(BookieMode::ReadOnlyManual as u8),
                    (BookieMode::ReadOnlyManual, false) => Some(BookieMode::Writable as u8),
                    (_, false) => Some(cur),
                }
            });
        self.metrics
            .mode
            .set(self.mode.load(Ordering::Acquire) as i64);
        match result {
            Ok(_) => Ok(self.mode()),
            Err(cur) => Err(BookieMode::from_u8(cur)),
        }
    }

    /// Number of ledgers with cached state.
    pub fn cached_ledgers(&self) -> usize {
        self.ledgers.len()
    }

    /// The cached handle of a ledger, loading it from storage; None when the
    /// bookie holds nothing of it.
    fn handle(&self, ledger_id: u64) -> Result<Option<Arc<LedgerHandle>>, StatusCode> {
        if let Some(h) = self.ledgers.get(&ledger_id) {
            return Ok(Some(h.clone()));
        }
        let state = self
            .storage
            .ledger_state(ledger_id)
            .map_err(|e| storage_status(ledger_id, &e))?;
        let Some(state) = state else {
            return Ok(None);
        };
        let lac = self.stored_lac(ledger_id, &state)?;
        let h = self
            .ledgers
            .entry(ledger_id)
            .or_insert_with(|| Arc::new(LedgerHandle::new(ledger_id, state, lac)))
            .clone();
        Ok(Some(h))
    }

    /// The highest LAC storage knows: the explicit one, or the piggybacked LAC
    /// of the last stored entry.
    fn stored_lac(&self, ledger_id: u64, state: &LedgerState) -> Result<i64, StatusCode> {
        let mut lac = state
            .explicit_lac
            .as_ref()
            .and_then(decode_explicit_lac)
            .map_or(-1, |(l, _)| l);
        let last = self
            .storage
            .last_entry_id(ledger_id)
            .map_err(|e| storage_status(ledger_id, &e))?;
        if let Some(last) = last
            && let Ok(Some(body)) = self.storage.get_entry(ledger_id, last)
            && let Ok(h) = Entry::peek_header(&body)
        {
            lac = lac.max(h.lac);
        }
        Ok(lac)
    }

    /// The handle of a ledger, created with `master_key` when the bookie does
    /// not know it. Returns the handle and the records that must be journalled
    /// for a creation (none when it existed).
    fn handle_or_create(
        &self,
        ledger_id: u64,
        master_key: &Bytes,
        fenced: bool,
    ) -> Result<(Arc<LedgerHandle>, bool), StatusCode> {
        if let Some(h) = self.handle(ledger_id)? {
            return Ok((h, false));
        }
        let state = LedgerState {
            master_key: owned_key(master_key),
            fenced,
            explicit_lac: None,
            limbo: false,
        };
        let mut created = false;
        let h = self
            .ledgers
            .entry(ledger_id)
            .or_insert_with(|| {
                created = true;
                Arc::new(LedgerHandle::new(ledger_id, state.clone(), -1))
            })
            .clone();
        if created {
            self.storage
                .set_ledger_state(ledger_id, state)
                .map_err(|e| storage_status(ledger_id, &e))?;
            self.metrics.ledgers.set(self.ledgers.len() as i64);
        }
        Ok((h, created))
    }

    fn journal_status(&self, ledger_id: u64, e: &JournalError) -> StatusCode {
        match e {
            JournalError::QueueFull => StatusCode::TooManyRequests,
            JournalError::TooLarge(_) => StatusCode::BadRequest,
            JournalError::Closed => StatusCode::ReadOnly,
            other => {
                error!(ledger = ledger_id, error = %other, "journal failed: the bookie stops taking writes");
                self.set_mode(BookieMode::ReadOnlyJournalFailed);
                StatusCode::IoError
            }
        }
    }

    /// Journals `rec`, preceded by the ledger's master key when `key` is set
    /// (a ledger new to this bookie); both are queued before either is awaited,
    /// so they share a group. OK once both are durable.
    async fn journal_with_key(
        &self,
        ledger_id: u64,
        key: Option<Bytes>,
        rec: JournalRecord,
    ) -> StatusCode {
        let key_record = key.map(|master_key| {
            self.journal.append(JournalRecord::MasterKey {
                ledger_id,
                master_key,
            })
        });
        let record = self.journal.append(rec);
        if let Some(k) = key_record
            && let Err(e) = k.await
        {
            return self.journal_status(ledger_id, &e);
        }
        match record.await {
            Ok(()) => StatusCode::Ok,
            Err(e) => self.journal_status(ledger_id, &e),
        }
    }

    /// One add; see the module docs for the rules. Resolves when the entry is
    /// durable or refused.
    pub async fn add(&self, op: AddOp) -> StatusCode {
        let started = std::time::Instant::now();
        let bytes = op.body.len() as u64;
        let status = self.add_inner(op).await;
        self.metrics.observe_add(status, started.elapsed());
        if status == StatusCode::Ok {
            self.metrics.add_bytes.inc_by(bytes);
        }
        status
    }

    async fn add_inner(&self, op: AddOp) -> StatusCode {
        let AddOp {
            ledger_id,
            entry_id,
            master_key,
            recovery,
            body,
        } = op;
        if body.len() > self.limits.entry_bytes_max {
            debug!(
                ledger = ledger_id,
                entry = entry_id,
                bytes = body.len(),
                "entry over the size limit"
            );
            return StatusCode::BadRequest;
        }
        if master_key.is_empty() || master_key.len() > MASTER_KEY_BYTES_MAX || entry_id < 0 {
            return StatusCode::BadRequest;
        }
        let header = match Entry::peek_header(&body) {
            Ok(h) if h.ledger_id == ledger_id && h.entry_id == entry_id => h,
            _ => return StatusCode::BadRequest,
        };
        match self.mode() {
            BookieMode::Writable => {}
            // Recovery may still complete a ledger on a bookie whose disk is
            // merely above its threshold.
            BookieMode::ReadOnlyDisk if recovery => {}
            _ => return StatusCode::ReadOnly,
        }
        let (handle, created) = match self.handle_or_create(ledger_id, &master_key, false) {
            Ok(x) => x,
            Err(s) => return s,
        };
        // Check and put under the ledger's lock (see module docs). A full write
        // cache asks for a checkpoint and waits (bounded) for it once.
        let mut adopted = false;
        let mut waited = false;
        let checked = loop {
            let seen = *self.flushed.borrow();
            let r = self.check_and_put(
                &handle,
                &master_key,
                recovery,
                ledger_id,
                entry_id,
                &body,
                &mut adopted,
            );
            if r != Err(StatusCode::TooManyRequests) || waited {
                break r;
            }
            waited = true;
            self.storage.hurry_flush();
            self.flush_wanted.notify_one();
            let mut rx = self.flushed.subscribe();
            let _ = tokio::time::timeout(
                Duration::from_millis(self.limits.write_cache_wait_ms_max),
                rx.wait_for(|n| *n > seen),
            )
            .await;
        };
        if let Err(s) = checked {
            return s;
        }
        if self.storage.take_flush_due() {
            // A half of the write cache just froze: flush it now, at full
            // speed, while the other half takes adds.
            self.storage.hurry_flush();
            self.flush_wanted.notify_one();
        }
        self.add_journal(
            handle, header.lac, created, adopted, ledger_id, entry_id, master_key, body,
        )
        .await
    }

    /// The fence / key check and the write-cache put, atomically under the
    /// ledger's lock.
    #[allow(clippy::too_many_arguments, reason = "one add's fields, kept flat")]
    fn check_and_put(
        &self,
        handle: &LedgerHandle,
        master_key: &Bytes,
        recovery: bool,
        ledger_id: u64,
        entry_id: i64,
        body: &Bytes,
        adopted: &mut bool,
    ) -> Result<(), StatusCode> {
        handle.with(|st| {
            if st.master_key.is_empty() {
                // State created by a limbo scan before any key was known.
                st.master_key = owned_key(master_key);
                *adopted = true;
            }
            if st.master_key != *master_key {
                return Err(StatusCode::Unauthorized);
            }
            if st.fenced && !recovery {
                return Err(StatusCode::Fenced);
            }
            self.storage
                .put_entry(ledger_id, entry_id, body.clone())
                .map_err(|e| storage_status(ledger_id, &e))
        })
    }

    /// Journals an add that is in the write cache; resolves when durable.
    #[allow(clippy::too_many_arguments, reason = "one add's fields, kept flat")]
    async fn add_journal(
        &self,
        handle: Arc<LedgerHandle>,
        lac: i64,
        created: bool,
        adopted: bool,
        ledger_id: u64,
        entry_id: i64,
        master_key: Bytes,
        body: Bytes,
    ) -> StatusCode {
        handle.observe_lac(lac);
        if adopted && let Err(e) = self.storage.set_ledger_state(ledger_id, handle.snapshot()) {
            return storage_status(ledger_id, &e);
        }
        let key = (created || adopted).then_some(master_key);
        let rec = JournalRecord::Entry {
            ledger_id,
            entry_id,
            data: body,
        };
        self.journal_with_key(ledger_id, key, rec).await
    }

    /// Fences a ledger durably (creating its state when unknown). Returns OK
    /// once the fence is journalled and synced.
    pub async fn fence(&self, ledger_id: u64, master_key: &Bytes) -> StatusCode {
        if master_key.is_empty() || master_key.len() > MASTER_KEY_BYTES_MAX {
            return StatusCode::BadRequest;
        }
        if self.mode() == BookieMode::ReadOnlyJournalFailed {
            // A fence that cannot be made durable must not be reported.
            return StatusCode::IoError;
        }
        let (handle, created) = match self.handle_or_create(ledger_id, master_key, true) {
            Ok(x) => x,
            Err(s) => return s,
        };
        let set = handle.with(|st| {
            let adopted = st.master_key.is_empty();
            if adopted {
                // State created by a limbo scan before any key was known.
                st.master_key = owned_key(master_key);
            }
            if st.master_key != *master_key {
                return Err(StatusCode::Unauthorized);
            }
            let newly = !st.fenced;
            st.fenced = true;
            Ok((newly, adopted, st.clone()))
        });
        let (newly, adopted, state) = match set {
            Ok(x) => x,
            Err(s) => return s,
        };
        if (newly || adopted)
            && let Err(e) = self.storage.set_ledger_state(ledger_id, state)
        {
            return storage_status(ledger_id, &e);
        }
        let key = (created || adopted).then(|| master_key.clone());
        // Journalled every time: a fence answered OK is durable even when an
        // earlier fence of this ledger is still in the journal queue.
        let s = self
            .journal_with_key(ledger_id, key, JournalRecord::Fence { ledger_id })
            .await;
        if s == StatusCode::Ok && newly {
            debug!(ledger = ledger_id, "ledger fenced");
        }
        s
    }

    /// The status for an entry that storage does not have.
    fn absent(&self, handle: Option<&Arc<LedgerHandle>>) -> StatusCode {
        match handle {
            None => StatusCode::NoLedger,
            Some(h) if h.with(|s| s.limbo) => StatusCode::UnknownLedgerState,
            Some(_) => StatusCode::NoEntry,
        }
    }

    /// Reads one stored entry (blocking storage I/O: call it from the
    /// blocking pool). Storage is the authority for presence; the ledger's
    /// state only decides how an absence is reported.
    pub fn read_entry(&self, ledger_id: u64, entry_id: i64) -> ReadResult {
        let r = self.read_stored(ledger_id, entry_id);
        self.metrics.observe_read(r.status, r.body.len());
        r
    }

    fn read_stored(&self, ledger_id: u64, entry_id: i64) -> ReadResult {
        let handle = match self.handle(ledger_id) {
            Ok(h) => h,
            Err(s) => {
                return ReadResult {
                    status: s,
                    body: Bytes::new(),
                };
            }
        };
        match self.storage.get_entry(ledger_id, entry_id) {
            Ok(Some(body)) => ReadResult {
                status: StatusCode::Ok,
                body,
            },
            Ok(None) => ReadResult {
                status: self.absent(handle.as_ref()),
                body: Bytes::new(),
            },
            Err(e) => {
                warn!(ledger = ledger_id, entry = entry_id, error = %e, "read failed");
                ReadResult {
                    status: StatusCode::IoError,
                    body: Bytes::new(),
                }
            }
        }
    }

    /// Reads one entry, fencing first when `fence_key` is given.
    pub async fn read(
        &self,
        ledger_id: u64,
        entry_id: i64,
        fence_key: Option<&Bytes>,
    ) -> ReadResult {
        if let Some(key) = fence_key {
            let s = self.fence(ledger_id, key).await;
            if s != StatusCode::Ok {
                return ReadResult {
                    status: s,
                    body: Bytes::new(),
                };
            }
        }
        if entry_id < 0 {
            // A fence-only read (entry -1) answers OK once fenced.
            return ReadResult {
                status: if fence_key.is_some() {
                    StatusCode::Ok
                } else {
                    StatusCode::BadRequest
                },
                body: Bytes::new(),
            };
        }
        self.read_entry(ledger_id, entry_id)
    }

    /// Reads consecutive entries from `first`, bounded by the request and the
    /// bookie's own limits; stops at the first gap.
    pub async fn read_range(
        &self,
        ledger_id: u64,
        first: i64,
        count_max: usize,
        bytes_max: usize,
        fence_key: Option<&Bytes>,
    ) -> (StatusCode, Vec<Bytes>) {
        if let Some(key) = fence_key {
            let s = self.fence(ledger_id, key).await;
            if s != StatusCode::Ok {
                return (s, Vec::new());
            }
        }
        if first < 0 || count_max == 0 {
            return (StatusCode::BadRequest, Vec::new());
        }
        let count = count_max.min(self.limits.read_range_entries_max);
        let bytes = bytes_max.min(self.limits.read_range_bytes_max).max(1);
        match self.storage.get_range(ledger_id, first, count, bytes) {
            Ok(bodies) if !bodies.is_empty() => {
                for b in &bodies {
                    self.metrics.observe_read(StatusCode::Ok, b.len());
                }
                (StatusCode::Ok, bodies)
            }
            Ok(_) => {
                let handle = self.handle(ledger_id).unwrap_or(None);
                (self.absent(handle.as_ref()), Vec::new())
            }
            Err(e) => {
                warn!(ledger = ledger_id, entry = first, error = %e, "range read failed");
                (StatusCode::IoError, Vec::new())
            }
        }
    }

    /// Long poll: waits (up to `timeout`, capped) until the bookie knows a LAC
    /// above `previous_lac`, then returns that LAC and entry `previous_lac + 1`.
    /// NO_ENTRY with the current LAC when the wait ends with nothing new.
    pub async fn read_next(
        &self,
        ledger_id: u64,
        previous_lac: i64,
        timeout: Duration,
    ) -> (StatusCode, i64, Bytes) {
        let handle = match self.handle(ledger_id) {
            Ok(Some(h)) => h,
            Ok(None) => return (StatusCode::NoLedger, -1, Bytes::new()),
            Err(s) => return (s, -1, Bytes::new()),
        };
        let timeout = timeout.min(Duration::from_millis(self.limits.long_poll_ms_max));
        let mut rx = handle.subscribe_lac();
        let waited = tokio::time::timeout(timeout, rx.wait_for(|lac| *lac > previous_lac)).await;
        let lac = handle.lac();
        if !matches!(waited, Ok(Ok(_))) && lac <= previous_lac {
            return (StatusCode::NoEntry, lac, Bytes::new());
        }
        let r = self.read_stored(ledger_id, previous_lac + 1);
        (r.status, lac, r.body)
    }

    /// The explicit LAC body and the last stored entry of a ledger.
    pub fn read_lac(&self, ledger_id: u64) -> (StatusCode, Bytes, Bytes) {
        let handle = match self.handle(ledger_id) {
            Ok(Some(h)) => h,
            Ok(None) => return (StatusCode::NoLedger, Bytes::new(), Bytes::new()),
            Err(s) => return (s, Bytes::new(), Bytes::new()),
        };
        let lac_body = handle
            .with(|s| s.explicit_lac.clone())
            .as_ref()
            .and_then(decode_explicit_lac)
            .map(|(_, b)| b)
            .unwrap_or_default();
        let last = match self.storage.last_entry_id(ledger_id) {
            Ok(Some(last)) => match self.storage.get_entry(ledger_id, last) {
                Ok(Some(b)) => b,
                Ok(None) => Bytes::new(),
                Err(e) => {
                    warn!(ledger = ledger_id, error = %e, "reading the last entry failed");
                    return (StatusCode::IoError, lac_body, Bytes::new());
                }
            },
            Ok(None) => Bytes::new(),
            Err(e) => return (storage_status(ledger_id, &e), lac_body, Bytes::new()),
        };
        if lac_body.is_empty() && last.is_empty() && handle.with(|s| s.limbo) {
            return (StatusCode::UnknownLedgerState, lac_body, last);
        }
        (StatusCode::Ok, lac_body, last)
    }

    /// Stores an explicit LAC written by an idle writer.
    pub async fn write_lac(
        &self,
        ledger_id: u64,
        master_key: &Bytes,
        lac: i64,
        body: Bytes,
    ) -> StatusCode {
        if body.len() > self.limits.entry_bytes_max || master_key.is_empty() {
            return StatusCode::BadRequest;
        }
        if self.mode() != BookieMode::Writable {
            return StatusCode::ReadOnly;
        }
        let (handle, created) = match self.handle_or_create(ledger_id, master_key, false) {
            Ok(x) => x,
            Err(s) => return s,
        };
        let stored = encode_explicit_lac(lac, &body);
        let updated = handle.with(|st| {
            if st.master_key != *master_key {
                return Err(StatusCode::Unauthorized);
            }
            let newer = st
                .explicit_lac
                .as_ref()
                .and_then(decode_explicit_lac)
                .is_none_or(|(old, _)| lac >= old);
            if newer {
                st.explicit_lac = Some(stored.clone());
            }
            Ok(st.clone())
        });
        let state = match updated {
            Ok(s) => s,
            Err(s) => return s,
        };
        if let Err(e) = self.storage.set_ledger_state(ledger_id, state) {
            return storage_status(ledger_id, &e);
        }
        handle.observe_lac(lac);
        let key = created.then(|| master_key.clone());
        let rec = JournalRecord::ExplicitLac {
            ledger_id,
            lac,
            data: stored,
        };
        self.journal_with_key(ledger_id, key, rec).await
    }

    /// Puts a ledger into limbo (or out of it) durably; a ledger put into limbo
    /// is also fenced when `fence` is set (it was not closed).
    pub async fn set_limbo(&self, ledger_id: u64, in_limbo: bool, fence: bool) -> StatusCode {
        let handle = match self.handle(ledger_id) {
            Ok(Some(h)) => h,
            Ok(None) => {
                // Unknown here (its data is gone): remember it with an empty
                // key; the first fence or recovery add sets nothing else.
                let state = LedgerState {
                    master_key: Bytes::new(),
                    fenced: fence,
                    explicit_lac: None,
                    limbo: in_limbo,
                };
                self.ledgers
                    .entry(ledger_id)
                    .or_insert_with(|| Arc::new(LedgerHandle::new(ledger_id, state, -1)))
                    .clone()
            }
            Err(s) => return s,
        };
        let state = handle.with(|st| {
            st.limbo = in_limbo;
            st.fenced |= fence;
            st.clone()
        });
        if let Err(e) = self.storage.set_ledger_state(ledger_id, state) {
            return storage_status(ledger_id, &e);
        }
        let limbo = self.journal.append(JournalRecord::Limbo {
            ledger_id,
            in_limbo,
        });
        let fence_rec = fence.then(|| self.journal.append(JournalRecord::Fence { ledger_id }));
        if let Err(e) = limbo.await {
            return self.journal_status(ledger_id, &e);
        }
        if let Some(f) = fence_rec
            && let Err(e) = f.await
        {
            return self.journal_status(ledger_id, &e);
        }
        StatusCode::Ok
    }

    /// Forgets a ledger's cached state (after GC deleted it from storage).
    pub fn forget(&self, ledger_id: u64) {
        self.ledgers.remove(&ledger_id);
        self.metrics.ledgers.set(self.ledgers.len() as i64);
    }
}

/// Applies one replayed journal record to storage (idempotent: replay may
/// repeat records a checkpoint already covered).
pub fn apply_replayed(storage: &LedgerStorage, rec: JournalRecord) -> Result<(), String> {
    let state_of = |ledger_id: u64| -> Result<LedgerState, String> {
        Ok(storage
            .ledger_state(ledger_id)
            .map_err(|e| e.to_string())?
            .unwrap_or_default())
    };
    match rec {
        JournalRecord::Entry {
            ledger_id,
            entry_id,
            data,
        } => storage
            .put_entry(ledger_id, entry_id, data)
            .map_err(|e| e.to_string()),
        JournalRecord::MasterKey {
            ledger_id,
            master_key,
        } => {
            let mut st = state_of(ledger_id)?;
            if st.master_key.is_empty() {
                st.master_key = master_key;
                storage
                    .set_ledger_state(ledger_id, st)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        JournalRecord::Fence { ledger_id } => {
            let mut st = state_of(ledger_id)?;
            st.fenced = true;
            storage
                .set_ledger_state(ledger_id, st)
                .map_err(|e| e.to_string())
        }
        JournalRecord::ExplicitLac {
            ledger_id,
            lac,
            data,
        } => {
            let mut st = state_of(ledger_id)?;
            let newer = st
                .explicit_lac
                .as_ref()
                .and_then(decode_explicit_lac)
                .is_none_or(|(old, _)| lac >= old);
            if newer {
                st.explicit_lac = Some(data);
            }
            storage
                .set_ledger_state(ledger_id, st)
                .map_err(|e| e.to_string())
        }
        JournalRecord::Limbo {
            ledger_id,
            in_limbo,
        } => {
            let mut st = state_of(ledger_id)?;
            st.limbo = in_limbo;
            storage
                .set_ledger_state(ledger_id, st)
                .map_err(|e| e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use super::*;
    use crate::entry::EntryHeader;
    use crate::fs::RealFs;
    use crate::journal::{JournalConfig, JournalMetrics};
    use crate::storage::{StorageConfig, StorageMetrics};

    fn core(dir: &std::path::Path) -> BookieCore {
        let fs: crate::fs::SharedFs = Arc::new(RealFs);
        let mut jc = JournalConfig::new(dir.join("journal"));
        jc.file_bytes = 1 << 20;
        let journal = Journal::open(fs.clone(), jc, JournalMetrics::unregistered(), &mut |_| {
            Ok(())
        })
        .unwrap();
        let sc = StorageConfig {
            ledger_dir: dir.join("ledgers"),
            entry_log_bytes_max: 1 << 20,
            write_cache_bytes_max: 1 << 20,
            read_cache_bytes_max: 1 << 20,
            index_cache_bytes_max: 1 << 20,
            read_ahead_entries_max: 10,
            read_ahead_bytes_max: 1 << 20,
            read_io_bytes_max: 64 << 10,
            read_io_class: crate::storage::ReadIoClass::Idle,
            compaction_threshold: 0.5,
            reserved_bytes: 0,
        };
        let storage =
            Arc::new(LedgerStorage::open(fs, sc, StorageMetrics::unregistered()).unwrap());
        let limits = CoreLimits {
            entry_bytes_max: 1 << 20,
            read_range_entries_max: 100,
            read_range_bytes_max: 1 << 20,
            long_poll_ms_max: 1_000,
            write_cache_wait_ms_max: 100,
        };
        BookieCore::new(journal, storage, limits, ServerMetrics::unregistered())
    }

    /// A key sliced out of a 64 KiB buffer, as a gRPC decode hands it over,
    /// and the address range of that buffer.
    fn key_in_big_buffer() -> (Bytes, Range<usize>) {
        let mut buf = vec![7u8; 64 * 1024];
        buf[1000..1008].copy_from_slice(b"the-key!");
        let whole = Bytes::from(buf);
        let start = whole.as_ptr() as usize;
        (whole.slice(1000..1008), start..start + whole.len())
    }

    fn cached_key(core: &BookieCore, ledger_id: u64) -> Bytes {
        let h = core.handle(ledger_id).unwrap().unwrap();
        let key = h.snapshot().master_key;
        let stored = core.storage.ledger_state(ledger_id).unwrap().unwrap();
        assert_eq!(stored.master_key, key);
        key
    }

    /// Adds entry 0 of `ledger_id` with `key`.
    async fn add_first(core: &BookieCore, ledger_id: u64, key: &Bytes) -> StatusCode {
        let header = EntryHeader {
            ledger_id,
            entry_id: 0,
            lac: -1,
            length: 3,
        };
        let op = AddOp {
            ledger_id,
            entry_id: 0,
            master_key: key.clone(),
            recovery: false,
            body: Entry::encode(header, b"abc"),
        };
        core.add(op).await
    }

    #[tokio::test]
    async fn cached_master_keys_do_not_keep_the_request_buffer_alive() {
        let dir = tempfile::tempdir().unwrap();
        let core = core(dir.path());
        let check = |ledger_id: u64, key: &Bytes, buffer: &Range<usize>| {
            let kept = cached_key(&core, ledger_id);
            assert_eq!(kept, key);
            assert!(!buffer.contains(&(kept.as_ptr() as usize)));
        };

        // A new ledger by an add.
        let (key, buffer) = key_in_big_buffer();
        assert_eq!(add_first(&core, 1, &key).await, StatusCode::Ok);
        check(1, &key, &buffer);

        // A new ledger by a fence.
        let (key, buffer) = key_in_big_buffer();
        assert_eq!(core.fence(2, &key).await, StatusCode::Ok);
        check(2, &key, &buffer);

        // A key adopted by a ledger a limbo scan created without one.
        core.storage
            .set_ledger_state(3, LedgerState::default())
            .unwrap();
        let (key, buffer) = key_in_big_buffer();
        assert_eq!(add_first(&core, 3, &key).await, StatusCode::Ok);
        check(3, &key, &buffer);
    }

    #[tokio::test]
    async fn the_add_that_freezes_half_the_write_cache_asks_for_a_flush_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let core = core(dir.path());
        let key = Bytes::from_static(b"key");
        // 64 KiB entries: the 512 KiB half holds 7 of them; the 8th freezes it.
        let body = vec![5u8; 64 * 1024];
        for entry_id in 0..8 {
            assert!(
                tokio::time::timeout(Duration::from_millis(1), core.flush_wanted())
                    .await
                    .is_err(),
                "a flush was asked for before the half was full (entry {entry_id})"
            );
            let header = EntryHeader {
                ledger_id: 9,
                entry_id,
                lac: entry_id - 1,
                length: (entry_id as u64 + 1) * body.len() as u64,
            };
            let op = AddOp {
                ledger_id: 9,
                entry_id,
                master_key: key.clone(),
                recovery: false,
                body: Entry::encode(header, &body),
            };
            assert_eq!(core.add(op).await, StatusCode::Ok);
        }
        // The permit is stored: the checkpoint loop would start at once.
        tokio::time::timeout(Duration::from_secs(10), core.flush_wanted())
            .await
            .expect("no flush asked for after a half of the write cache froze");
    }
}
