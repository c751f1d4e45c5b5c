//! Ledger storage of the bookie (DESIGN §5; BookKeeper's DbLedgerStorage,
//! reference §3.4–3.7): a write cache sorted by `(ledger, entry)`, flushed at each
//! checkpoint into interleaved entry logs; one shared index (redb) for every
//! ledger, entry and per-ledger state; a read cache filled by read-ahead for
//! catch-up readers; GC and compaction of entry logs.
//!
//! Layout: entry logs in `<ledger_dir>/current/<8 hex>.log` ([`entry_log`]), the
//! index in `<ledger_dir>/index/index.redb` ([`index`]). All of it goes through
//! [`crate::fs`].
//!
//! Promises:
//! - [`LedgerStorage::flush`] makes everything put (and every state set) before
//!   it durable: entry logs are `fdatasync`ed, then the index is committed durably.
//!   Until then the journal covers the data; its replay calls `put_entry` /
//!   `set_ledger_state` again, which are idempotent (an entry already stored is
//!   not written a second time). [`LedgerStorage::flush_spread`] promises the
//!   same, with its entry-log writes paced (at least [`FLUSH_BYTES_PER_S_MIN`])
//!   and written back as they go, so the journals' syncs on the same disk do
//!   not queue behind one burst; [`LedgerStorage::hurry_flush`] lifts the pace.
//! - A read answers `Ok(None)` only when the entry is absent: a record whose CRC,
//!   length or ids do not match, a short read or a missing log file is
//!   [`StorageError::Corrupt`] (RELIABILITY P0-8).
//! - A tailing reader is served from the write cache; a miss that goes to an entry
//!   log reads the ledger's following entries in the same I/O into the read cache
//!   (bounded by `read_ahead_entries_max` / `read_ahead_bytes_max`), except
//!   those another read is bringing in now ([`read_ahead`]: a miss of such an
//!   entry waits for that read, then takes it from the cache); that read runs in
//!   the configured I/O class, idle by default ([`io_priority`]), so journal
//!   and flush writes go first at the disk.
//! - Data of a ledger is deleted only by [`LedgerStorage::delete_ledger`] (the
//!   server decides, after checking metadata); its bytes go away with entry-log GC
//!   and compaction ([`gc`]).
//!
//! Threads: every method takes `&self` and the type is `Send + Sync`. `put_entry`,
//! reads from the caches and `set_ledger_state` are memory operations; reads from
//! entry logs, `flush`, `delete_ledger`, `gc_and_compact`, `open` and `close` do
//! blocking disk I/O: call them from `spawn_blocking` (or a dedicated thread).
//! Flush, delete and each compaction batch are serialised by one lock.

pub(crate) mod entry_log;
mod gc;
pub(crate) mod index;
mod io_priority;
mod metrics;
mod read_ahead;
mod read_cache;
mod write_cache;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use bytes::Bytes;
use redb::ReadableTable;

use crate::fs::SharedFs;
use entry_log::{LOG_HEADER_BYTES, Location, LogFiles, LogWriter, decode_record};
pub use index::INDEX_CACHE_BYTES_MAX;
use index::{Index, LEDGERS, LOCATIONS, LOG_LEDGERS, add_usage, db_err, encode_state};
use read_ahead::ReadAheadClaims;
use read_cache::ReadCache;
use write_cache::{Half, WriteCache};

pub use io_priority::ReadIoClass;
pub use metrics::StorageMetrics;

/// How long a miss waits for a read-ahead that covers it (then it reads the
/// disk itself).
const CLAIM_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// Configuration of a [`LedgerStorage`].
#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// Entry logs go under `<ledger_dir>/current/`, the index under `<ledger_dir>/index/`.
    pub ledger_dir: PathBuf,
    /// An entry log is rolled before it would exceed this size (at most 4 GiB).
    pub entry_log_bytes_max: u64,
    /// Bound of the write cache (two halves: active + flushing).
    pub write_cache_bytes_max: usize,
    /// Bound of the read cache.
    pub read_cache_bytes_max: usize,
    /// Bound of the index database's page cache.
    pub index_cache_bytes_max: usize,
    /// Entries read ahead after a miss.
    pub read_ahead_entries_max: usize,
    /// Bytes read ahead after a miss.
    pub read_ahead_bytes_max: usize,
    /// Most bytes one entry-log read asks the disk for at a time (a
    /// read-ahead is read in pieces of this size, [`FsFile::read_exact_in_pieces`]).
    pub read_io_bytes_max: usize,
    /// I/O class of entry-log reads ([`io_priority`]).
    pub read_io_class: ReadIoClass,
    /// A log whose live fraction is below this is compacted.
    pub compaction_threshold: f64,
    /// Free space kept for compaction: the server stops taking writes (read-only)
    /// below it; compaction may use it.
    pub reserved_bytes: u64,
}

impl StorageConfig {
    /// The defaults for `ledger_dir`: 1 GiB logs, 256 MiB caches, read-ahead of
    /// 100 entries / 4 MiB read in 512 KiB pieces, compaction below 50 % live,
    /// 1 GiB reserved.
    pub fn new(ledger_dir: PathBuf) -> StorageConfig {
        StorageConfig {
            ledger_dir,
            entry_log_bytes_max: 1 << 30,
            write_cache_bytes_max: 256 << 20,
            read_cache_bytes_max: 256 << 20,
            index_cache_bytes_max: index::INDEX_CACHE_BYTES_MAX,
            read_ahead_entries_max: 100,
            read_ahead_bytes_max: 4 << 20,
            read_io_bytes_max: crate::fs::READ_PIECE_BYTES,
            read_io_class: ReadIoClass::Idle,
            compaction_threshold: 0.5,
            reserved_bytes: 1 << 30,
        }
    }
}

/// Per-ledger state kept by the bookie.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerState {
    /// The writer's master key, checked on every add.
    pub master_key: Bytes,
    /// Fenced by recovery: no more adds except recovery adds.
    pub fenced: bool,
    /// The last explicit LAC body written for the ledger.
    pub explicit_lac: Option<Bytes>,
    /// In limbo: may have lost data; reads answer "unknown state" until checked.
    pub limbo: bool,
}

/// Errors of the ledger storage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// An I/O or index-engine error.
    #[error("storage I/O error: {0}")]
    Io(String),
    /// Stored bytes are damaged (bad CRC, short read, missing log, bad state).
    #[error("corrupt entry {ledger_id}:{entry_id}: {reason}")]
    Corrupt {
        /// The ledger.
        ledger_id: u64,
        /// The entry (−1 for the ledger's state).
        entry_id: i64,
        /// What is wrong.
        reason: String,
    },
    /// Both halves of the write cache are full: flush (checkpoint), then retry.
    #[error("write cache full")]
    WriteCacheFull,
    /// An entry of this many bytes can never fit in half the write cache.
    #[error("entry of {0} bytes is larger than half the write cache")]
    TooLarge(usize),
    /// The storage was closed.
    #[error("storage closed")]
    Closed,
}

fn io_err(what: &str, e: io::Error) -> StorageError {
    StorageError::Io(format!("{what}: {e}"))
}

fn poisoned<T>(_: T) -> StorageError {
    StorageError::Io("storage lock poisoned by a panic".to_string())
}

/// The bookie's ledger storage. See the module docs.
#[derive(Debug)]
pub struct LedgerStorage {
    fs: SharedFs,
    cfg: StorageConfig,
    metrics: StorageMetrics,
    index: RwLock<Option<Arc<Index>>>,
    files: Arc<LogFiles>,
    /// The entry-log appender; its lock is the flush lock.
    writer: Mutex<LogWriter>,
    cache: RwLock<WriteCache>,
    /// States set since the last flush (read before the index).
    states: RwLock<HashMap<u64, LedgerState>>,
    read_cache: ReadCache,
    /// Read-ahead ranges being read now (concurrent misses do not re-read them).
    read_ahead: ReadAheadClaims,
    /// One GC / compaction pass at a time.
    gc_lock: Mutex<()>,
    closed: AtomicBool,
    /// Set by [`LedgerStorage::hurry_flush`]: a paced flush stops pacing.
    hurry: Arc<AtomicBool>,
    /// A put froze a half of the write cache: a flush is due now
    /// ([`LedgerStorage::take_flush_due`]).
    flush_due: AtomicBool,
}

/// A paced flush ([`LedgerStorage::flush_spread`]) never writes slower than
/// this (bytes a second).
pub const FLUSH_BYTES_PER_S_MIN: f64 = 16.0 * 1024.0 * 1024.0;

impl LedgerStorage {
    /// Opens (creating if needed) the storage in `cfg.ledger_dir`. Appends go to a
    /// new entry log; logs left by a crash before their index commit are removed
    /// by the next GC. Refuses to open when entry logs exist without an index
    /// (it would answer "no entry" for data it holds).
    pub fn open(
        fs: SharedFs,
        cfg: StorageConfig,
        metrics: StorageMetrics,
    ) -> Result<LedgerStorage, StorageError> {
        if cfg.entry_log_bytes_max <= LOG_HEADER_BYTES
            || cfg.entry_log_bytes_max > u64::from(u32::MAX)
        {
            return Err(StorageError::Io(format!(
                "entry_log_bytes_max {} must be in {}..=4 GiB",
                cfg.entry_log_bytes_max,
                LOG_HEADER_BYTES + 1
            )));
        }
        let current = cfg.ledger_dir.join("current");
        let index_dir = cfg.ledger_dir.join("index");
        for dir in [&current, &index_dir] {
            fs.create_dir_all(dir)
                .map_err(|e| io_err(&format!("create {}", dir.display()), e))?;
        }
        let files = Arc::new(LogFiles::new(fs.clone(), current.clone()));
        let logs = files.list().map_err(|e| io_err("list entry logs", e))?;
        let (index, created) = Index::open(&fs, &index_dir, cfg.index_cache_bytes_max)?;
        if created && !logs.is_empty() {
            // Serving from an empty index would answer "no entry" for data we
            // hold: refuse instead (the index is created before any log).
            return Err(StorageError::Io(format!(
                "index {} is missing but {} entry logs exist; refusing to open",
                index_dir.display(),
                logs.len()
            )));
        }
        let next_log_id = match logs.last() {
            None => 1,
            Some(last) => last
                .checked_add(1)
                .ok_or_else(|| StorageError::Io("entry log ids exhausted".to_string()))?,
        };
        let ledger_count = index.ledger_count()?;
        metrics.ledger_count.set(ledger_count as i64);
        tracing::info!(
            dir = %cfg.ledger_dir.display(),
            entry_logs = logs.len(),
            ledgers = ledger_count,
            next_log_id,
            "ledger storage opened"
        );
        Ok(LedgerStorage {
            writer: Mutex::new(LogWriter::new(
                files.clone(),
                cfg.entry_log_bytes_max,
                next_log_id,
            )),
            cache: RwLock::new(WriteCache::new(cfg.write_cache_bytes_max)),
            read_cache: ReadCache::new(cfg.read_cache_bytes_max),
            read_ahead: ReadAheadClaims::default(),
            index: RwLock::new(Some(Arc::new(index))),
            states: RwLock::new(HashMap::new()),
            gc_lock: Mutex::new(()),
            closed: AtomicBool::new(false),
            hurry: Arc::new(AtomicBool::new(false)),
            flush_due: AtomicBool::new(false),
            files,
            fs,
            cfg,
            metrics,
        })
    }

    fn check_open(&self) -> Result<(), StorageError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StorageError::Closed);
        }
        Ok(())
    }

    fn index(&self) -> Result<Arc<Index>, StorageError> {
        self.index
            .read()
            .map_err(poisoned)?
            .clone()
            .ok_or(StorageError::Closed)
    }

    fn lock_writer(&self) -> Result<MutexGuard<'_, LogWriter>, StorageError> {
        self.writer.lock().map_err(poisoned)
    }

    fn cache_read(&self) -> Result<RwLockReadGuard<'_, WriteCache>, StorageError> {
        self.cache.read().map_err(poisoned)
    }

    fn cache_write(&self) -> Result<RwLockWriteGuard<'_, WriteCache>, StorageError> {
        self.cache.write().map_err(poisoned)
    }

    /// Puts an entry (bytes stored exactly as given). Idempotent for equal
    /// (ledger, entry): an entry already cached or stored keeps its first copy.
    /// `WriteCacheFull` when both halves are full (flush, then retry);
    /// `TooLarge` when the entry can never fit in half the cache.
    pub fn put_entry(
        &self,
        ledger_id: u64,
        entry_id: i64,
        data: Bytes,
    ) -> Result<(), StorageError> {
        self.check_open()?;
        let mut cache = self.cache_write()?;
        if cache.put(ledger_id, entry_id, data)? {
            self.flush_due.store(true, Ordering::Release);
        }
        self.metrics.write_cache_bytes.set(cache.bytes() as i64);
        Ok(())
    }

    /// True once after a put froze a half of the write cache: its owner
    /// should flush now, while the other half takes puts, instead of at the
    /// next periodic checkpoint (by then the other half may be full too and
    /// adds would wait for a whole flush).
    pub fn take_flush_due(&self) -> bool {
        self.flush_due.swap(false, Ordering::AcqRel)
    }

    /// The entry. `Ok(None)` only when it is truly absent; corruption (CRC of the
    /// log record, short read, missing log) is `Err(Corrupt)`.
    pub fn get_entry(&self, ledger_id: u64, entry_id: i64) -> Result<Option<Bytes>, StorageError> {
        self.check_open()?;
        if let Some(data) = self.cache_read()?.get(ledger_id, entry_id) {
            return Ok(Some(data));
        }
        if let Some(data) = self.read_cache.get(ledger_id, entry_id) {
            self.metrics.read_cache_hits.inc();
            return Ok(Some(data));
        }
        // Another read is bringing this entry in: wait for it rather than
        // read the disk a second time.
        if self
            .read_ahead
            .wait_released(ledger_id, entry_id, CLAIM_WAIT_MAX)
            && let Some(data) = self.read_cache.get(ledger_id, entry_id)
        {
            self.metrics.read_cache_hits.inc();
            return Ok(Some(data));
        }
        self.metrics.read_cache_misses.inc();
        self.read_from_logs(ledger_id, entry_id)
    }

    /// Reads the entry from its log, and the ledger's next entries adjacent to it
    /// into the read cache (one read).
    fn read_from_logs(&self, ledger_id: u64, entry_id: i64) -> Result<Option<Bytes>, StorageError> {
        let index = self.index()?;
        let corrupt = |reason: String| StorageError::Corrupt {
            ledger_id,
            entry_id,
            reason,
        };
        // Two attempts: compaction may move the entry and remove its old log
        // between our index lookup and the open.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let run = index.run_from(ledger_id, entry_id, 1 + self.cfg.read_ahead_entries_max)?;
            let Some(&(_, first)) = run.first() else {
                return Ok(None);
            };
            let mut span: Vec<(i64, Location)> = vec![(entry_id, first)];
            let mut end = first.end();
            let mut ahead_bytes = 0usize;
            for &(e, loc) in &run[1..] {
                ahead_bytes += loc.size as usize;
                if loc.log_id != first.log_id
                    || u64::from(loc.offset) != end
                    || ahead_bytes > self.cfg.read_ahead_bytes_max
                {
                    break;
                }
                end = loc.end();
                span.push((e, loc));
            }
            // Released after this iteration's cache inserts (or on `continue`).
            let _claim = self.read_ahead.claim(ledger_id, &mut span);
            if let Some(&(_, last)) = span.last() {
                end = last.end();
            }
            let file = match self.files.get(first.log_id) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if attempt < 2 {
                        continue;
                    }
                    return Err(corrupt(format!("entry log {} is missing", first.log_id)));
                }
                Err(e) => return Err(io_err(&format!("open entry log {}", first.log_id), e)),
            };
            let mut buf = vec![0u8; (end - u64::from(first.offset)) as usize];
            let prio = io_priority::ReadPriority::enter(self.cfg.read_io_class);
            let read = file.read_exact_in_pieces(
                &mut buf,
                u64::from(first.offset),
                self.cfg.read_io_bytes_max,
            );
            drop(prio);
            match read {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err(corrupt(format!(
                        "short read in entry log {} at offset {}: {e}",
                        first.log_id, first.offset
                    )));
                }
                Err(e) => {
                    return Err(io_err(
                        &format!("read entry log {} at offset {}", first.log_id, first.offset),
                        e,
                    ));
                }
            }
            self.metrics.entry_log_bytes_read.inc_by(buf.len() as u64);
            let buf = Bytes::from(buf);
            let rec = buf.slice(0..first.size as usize);
            let data = decode_record(&rec, ledger_id, entry_id).map_err(|reason| {
                tracing::warn!(
                    ledger_id,
                    entry_id,
                    log_id = first.log_id,
                    offset = first.offset,
                    %reason,
                    "corrupt entry in entry log"
                );
                corrupt(format!(
                    "entry log {} offset {}: {reason}",
                    first.log_id, first.offset
                ))
            })?;
            if span.len() == 1 {
                return Ok(Some(data));
            }
            // Copy out of the shared buffer so cached entries do not pin it.
            for &(e, loc) in &span[1..] {
                let at = (loc.offset - first.offset) as usize;
                let rec = buf.slice(at..at + loc.size as usize);
                match decode_record(&rec, ledger_id, e) {
                    Ok(d) => self
                        .read_cache
                        .insert(ledger_id, e, Bytes::copy_from_slice(&d)),
                    // Its own read will report it.
                    Err(_) => break,
                }
            }
            self.metrics
                .read_cache_bytes
                .set(self.read_cache.bytes() as i64);
            return Ok(Some(Bytes::copy_from_slice(&data)));
        }
    }

    /// Entries `[first, ..]` of a ledger, at most `count_max` entries and
    /// `bytes_max` bytes (at least one if present), stopping at the first gap.
    pub fn get_range(
        &self,
        ledger_id: u64,
        first_entry_id: i64,
        count_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<Bytes>, StorageError> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut entry_id = first_entry_id;
        while out.len() < count_max {
            let Some(data) = self.get_entry(ledger_id, entry_id)? else {
                break;
            };
            if !out.is_empty() && bytes + data.len() > bytes_max {
                break;
            }
            bytes += data.len();
            out.push(data);
            match entry_id.checked_add(1) {
                Some(next) => entry_id = next,
                None => break,
            }
        }
        Ok(out)
    }

    /// Highest entry id stored for the ledger (write cache included), None if none.
    pub fn last_entry_id(&self, ledger_id: u64) -> Result<Option<i64>, StorageError> {
        self.check_open()?;
        let cached = self.cache_read()?.last_entry_id(ledger_id);
        let indexed = self.index()?.last_entry_id(ledger_id)?;
        Ok(cached.max(indexed))
    }

    /// Per-ledger state; None when the ledger is unknown to this bookie.
    pub fn ledger_state(&self, ledger_id: u64) -> Result<Option<LedgerState>, StorageError> {
        self.check_open()?;
        if let Some(s) = self.states.read().map_err(poisoned)?.get(&ledger_id) {
            return Ok(Some(s.clone()));
        }
        self.index()?.ledger_state(ledger_id)
    }

    /// Creates or replaces the ledger's state (made durable by the next flush; the
    /// journal covers it before).
    pub fn set_ledger_state(&self, ledger_id: u64, state: LedgerState) -> Result<(), StorageError> {
        self.check_open()?;
        self.states
            .write()
            .map_err(poisoned)?
            .insert(ledger_id, state);
        Ok(())
    }

    /// Every ledger id this bookie holds (state or entries), ascending.
    pub fn ledger_ids(&self) -> Result<Vec<u64>, StorageError> {
        self.check_open()?;
        let mut ids = self.index()?.ledger_ids()?;
        self.cache_read()?.ledger_ids(&mut ids);
        ids.extend(self.states.read().map_err(poisoned)?.keys().copied());
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// Checkpoint: everything put before this call becomes durable (logs synced,
    /// then the index committed).
    pub fn flush(&self) -> Result<(), StorageError> {
        self.check_open()?;
        let mut writer = self.lock_writer()?;
        self.flush_locked(&mut writer)
    }

    /// [`LedgerStorage::flush`], with the entry-log writes spread over about
    /// `over` (never slower than [`FLUSH_BYTES_PER_S_MIN`]) instead of going
    /// out at once: a periodic checkpoint's data then reaches a disk shared
    /// with journals in a trickle that their syncs hardly notice. A
    /// [`LedgerStorage::hurry_flush`] during it drops the pace.
    pub fn flush_spread(&self, over: std::time::Duration) -> Result<(), StorageError> {
        self.check_open()?;
        let mut writer = self.lock_writer()?;
        let bytes = self.cache_read()?.bytes() as f64;
        let rate = (bytes / over.as_secs_f64().max(1e-3)).max(FLUSH_BYTES_PER_S_MIN);
        writer.set_pace(Some(entry_log::Pace::new(rate, self.hurry.clone())));
        let r = self.flush_locked(&mut writer);
        writer.set_pace(None);
        r
    }

    /// Adds are waiting for room in the write cache: a paced flush running
    /// now goes at full speed.
    pub fn hurry_flush(&self) {
        self.hurry.store(true, Ordering::Release);
    }

    fn flush_locked(&self, writer: &mut LogWriter) -> Result<(), StorageError> {
        let start = Instant::now();
        let index = self.index()?;
        // A half frozen by a put is older than the active one: flush it, then the
        // active half, so both are covered.
        let rounds = if self.cache_read()?.has_frozen() {
            2
        } else {
            1
        };
        let mut written = 0u64;
        for _ in 0..rounds {
            let half = self.cache_write()?.freeze();
            let states: Vec<(u64, LedgerState)> = self
                .states
                .read()
                .map_err(poisoned)?
                .iter()
                .map(|(l, s)| (*l, s.clone()))
                .collect();
            if half.is_none() && states.is_empty() {
                break;
            }
            written += self.flush_batch(writer, &index, half.as_deref(), &states)?;
            let mut cache = self.cache_write()?;
            if half.is_some() {
                cache.release_frozen();
            }
            self.metrics.write_cache_bytes.set(cache.bytes() as i64);
            drop(cache);
            let mut dirty = self.states.write().map_err(poisoned)?;
            for (l, s) in &states {
                if dirty.get(l) == Some(s) {
                    dirty.remove(l);
                }
            }
        }
        self.metrics.ledger_count.set(index.ledger_count()? as i64);
        let secs = start.elapsed().as_secs_f64();
        self.metrics.flush_seconds.observe(secs);
        tracing::debug!(bytes = written, seconds = secs, "ledger storage flushed");
        // Adds that waited for room have it now; the next paced flush paces.
        self.hurry.store(false, Ordering::Release);
        Ok(())
    }

    /// Appends the half's entries not yet indexed, syncs the logs, then commits
    /// their locations and the states. Returns record bytes written.
    fn flush_batch(
        &self,
        writer: &mut LogWriter,
        index: &Index,
        half: Option<&Half>,
        states: &[(u64, LedgerState)],
    ) -> Result<u64, StorageError> {
        let txn = index.begin_write()?;
        let appended = (|| -> Result<u64, StorageError> {
            let mut written = 0u64;
            let mut usage: HashMap<(u32, u64), u64> = HashMap::new();
            {
                let mut locations = txn.open_table(LOCATIONS).map_err(db_err)?;
                if let Some(half) = half {
                    // Entries already indexed (a replayed journal re-adds them)
                    // are skipped. One range lookup per ledger of the half, not
                    // one lookup per entry: the half is in (ledger, entry)
                    // order and almost never holds an indexed entry.
                    let mut run: Option<u64> = None;
                    let mut indexed: Vec<i64> = Vec::new();
                    for (&(l, e), data) in &half.entries {
                        if run != Some(l) {
                            run = Some(l);
                            indexed.clear();
                            let last = half.last_entry_id(l).unwrap_or(e);
                            for item in locations.range((l, e)..=(l, last)).map_err(db_err)? {
                                indexed.push(item.map_err(db_err)?.0.value().1);
                            }
                        }
                        if indexed.binary_search(&e).is_ok() {
                            continue;
                        }
                        let loc = writer
                            .append(l, e, data)
                            .map_err(|err| io_err("append to entry log", err))?;
                        locations.insert((l, e), loc.to_index()).map_err(db_err)?;
                        *usage.entry((loc.log_id, l)).or_insert(0) += u64::from(loc.size);
                        written += u64::from(loc.size);
                    }
                }
            }
            let mut table = txn.open_table(LOG_LEDGERS).map_err(db_err)?;
            for ((log_id, l), bytes) in usage {
                add_usage(&mut table, log_id, l, bytes)?;
            }
            drop(table);
            let mut ledgers = txn.open_table(LEDGERS).map_err(db_err)?;
            for (l, s) in states {
                ledgers
                    .insert(*l, encode_state(s).as_slice())
                    .map_err(db_err)?;
            }
            drop(ledgers);
            writer.sync().map_err(|e| io_err("sync entry logs", e))?;
            Ok(written)
        })();
        match appended {
            Ok(written) => {
                txn.commit().map_err(db_err)?;
                self.metrics.entry_log_bytes_written.inc_by(written);
                Ok(written)
            }
            Err(e) => {
                tracing::error!(error = %e, "ledger storage flush failed; entries stay in the write cache");
                writer.abandon();
                drop(txn);
                Err(e)
            }
        }
    }

    /// Removes the ledger's index entries and state (durably); its bytes are
    /// reclaimed by entry-log GC/compaction.
    pub fn delete_ledger(&self, ledger_id: u64) -> Result<(), StorageError> {
        self.check_open()?;
        let _writer = self.lock_writer()?;
        let index = self.index()?;
        let txn = index.begin_write()?;
        index::remove_ledger(&txn, ledger_id)?;
        txn.commit().map_err(db_err)?;
        let mut cache = self.cache_write()?;
        cache.remove_ledger(ledger_id);
        self.metrics.write_cache_bytes.set(cache.bytes() as i64);
        drop(cache);
        self.states.write().map_err(poisoned)?.remove(&ledger_id);
        self.read_cache.remove_ledger(ledger_id);
        self.metrics
            .read_cache_bytes
            .set(self.read_cache.bytes() as i64);
        tracing::info!(ledger_id, "ledger deleted from storage");
        Ok(())
    }

    /// Bytes used by entry logs + index on disk.
    pub fn disk_bytes(&self) -> Result<u64, StorageError> {
        self.check_open()?;
        let mut total = self.index()?.file_bytes()?;
        for log_id in self
            .files
            .list()
            .map_err(|e| io_err("list entry logs", e))?
        {
            match self.files.get(log_id) {
                Ok(f) => total += f.len().map_err(|e| io_err("entry log length", e))?,
                // Removed by GC since the listing.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("open entry log", e)),
            }
        }
        Ok(total)
    }

    /// Flushes, then closes: every later call returns [`StorageError::Closed`] and
    /// the index is released once in-flight reads end.
    pub fn close(&self) -> Result<(), StorageError> {
        let mut writer = self.lock_writer()?;
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        let flushed = self.flush_locked(&mut writer);
        self.closed.store(true, Ordering::Release);
        self.index.write().map_err(poisoned)?.take();
        tracing::info!(dir = %self.cfg.ledger_dir.display(), "ledger storage closed");
        flushed
    }
}
