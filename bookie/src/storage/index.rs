//! The shared ledger index: one redb database under `<ledger_dir>/index/` for every
//! ledger and entry of this bookie (no file per ledger; measured for 1,000,000
//! ledgers in `examples/index_bench.rs`).
//!
//! Tables:
//! - `locations`: `(ledger, entry)` → `(log_id << 32 | offset, record size)`;
//! - `ledgers`: ledger → encoded [`LedgerState`];
//! - `log_ledgers`: `(log_id, ledger)` → bytes of that ledger's records in that log,
//!   so GC knows each log's live bytes without scanning it;
//! - `meta`: format version.
//!
//! The database file is read and written through [`crate::fs`] (a redb
//! `StorageBackend` over [`FsFile`]), so fault-injecting file systems cover it too.
//! Every commit is durable (`Durability::Immediate`) when it returns. redb may
//! panic on a corrupt file; [`Index::open`] turns that into an error.
//!
//! Why redb: measured with `examples/index_bench.rs` (1,000,000 ledgers × 4
//! entries, 40 durable commits of 100,000 sorted entries, 64 MiB cache each,
//! 2-core Xeon VM, release build, page cache warm):
//!
//! | engine | insert | on disk | reopen + 1st get | get p50 / p99 | RSS (peak) |
//! |---|---|---|---|---|---|
//! | redb 4.6 | 2.9 s | 150 MiB | 0.4 ms | 3.3 / 7.6 µs | 73 (74) MiB |
//! | fjall 3.1 | 3.1 s | 192 MiB | 1,866 ms | 4.2 / 9.8 µs | 267 (308) MiB |
//!
//! redb wins on every axis, most on restart time and memory, and is already a
//! dependency; fjall stays an optional bench-only dependency (`bench-fjall`).

use std::collections::HashMap;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use redb::{
    Database, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    StorageBackend, TableDefinition, WriteTransaction,
};

use super::entry_log::Location;
use super::{LedgerState, StorageError};
use crate::fs::{FsFile, OpenMode, SharedFs};

pub(crate) const LOCATIONS: TableDefinition<(u64, i64), (u64, u32)> =
    TableDefinition::new("locations");
pub(crate) const LEDGERS: TableDefinition<u64, &[u8]> = TableDefinition::new("ledgers");
pub(crate) const LOG_LEDGERS: TableDefinition<(u32, u64), u64> =
    TableDefinition::new("log_ledgers");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const FORMAT_VERSION: u64 = 1;
/// The default of the index database's page cache (redb's default is 1 GiB;
/// 256 MiB holds the whole index of 1,000,000 ledgers × 4 entries, which is
/// ≈150 MiB on disk); `--index-cache-bytes-max` sets it.
pub const INDEX_CACHE_BYTES_MAX: usize = 256 << 20;
/// File name of the index database.
pub(crate) const INDEX_FILE: &str = "index.redb";

/// redb storage over an [`FsFile`].
#[derive(Debug)]
struct FsBackend {
    file: Arc<dyn FsFile>,
}

impl StorageBackend for FsBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.file.read_exact_at(out, offset)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.file.write_at(data, offset)
    }
}

/// Any index-engine error as [`StorageError::Io`].
pub(crate) fn db_err(e: impl std::fmt::Display) -> StorageError {
    StorageError::Io(format!("index: {e}"))
}

/// The shared index.
#[derive(Debug)]
pub(crate) struct Index {
    db: Database,
    file: Arc<dyn FsFile>,
}

impl Index {
    /// Opens or creates the index in `dir`; the flag says whether it was created
    /// now (it had no format record).
    /// `cache_bytes_max` bounds redb's page cache.
    pub(crate) fn open(
        fs: &SharedFs,
        dir: &Path,
        cache_bytes_max: usize,
    ) -> Result<(Index, bool), StorageError> {
        let path = dir.join(INDEX_FILE);
        let file = fs
            .open(&path, OpenMode::CreateOrOpen)
            .map_err(|e| StorageError::Io(format!("open {}: {e}", path.display())))?;
        let backend = FsBackend { file: file.clone() };
        let opened = catch_unwind(AssertUnwindSafe(|| {
            redb::Builder::new()
                .set_cache_size(cache_bytes_max)
                .create_with_backend(backend)
        }));
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(e)) => return Err(db_err(format!("open {}: {e}", path.display()))),
            Err(_) => {
                return Err(StorageError::Io(format!(
                    "index {} is corrupt (the engine panicked opening it)",
                    path.display()
                )));
            }
        };
        let index = Index { db, file };
        let txn = index.begin_write()?;
        let created;
        {
            let mut meta = txn.open_table(META).map_err(db_err)?;
            let version = meta.get("format").map_err(db_err)?.map(|v| v.value());
            created = version.is_none();
            match version {
                None => {
                    meta.insert("format", FORMAT_VERSION).map_err(db_err)?;
                }
                Some(FORMAT_VERSION) => {}
                Some(other) => {
                    return Err(StorageError::Io(format!(
                        "index {} has format {other}, this build reads {FORMAT_VERSION}",
                        path.display()
                    )));
                }
            }
            txn.open_table(LOCATIONS).map_err(db_err)?;
            txn.open_table(LEDGERS).map_err(db_err)?;
            txn.open_table(LOG_LEDGERS).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;
        Ok((index, created))
    }

    /// Bytes of the database file.
    pub(crate) fn file_bytes(&self) -> Result<u64, StorageError> {
        self.file
            .len()
            .map_err(|e| StorageError::Io(format!("index length: {e}")))
    }

    /// A durable write transaction.
    pub(crate) fn begin_write(&self) -> Result<WriteTransaction, StorageError> {
        self.db.begin_write().map_err(db_err)
    }

    fn read(&self) -> Result<ReadTransaction, StorageError> {
        self.db.begin_read().map_err(db_err)
    }

    /// Up to `count_max` consecutive indexed entries of the ledger from `first`
    /// (stops at the first gap).
    pub(crate) fn run_from(
        &self,
        ledger_id: u64,
        first: i64,
        count_max: usize,
    ) -> Result<Vec<(i64, Location)>, StorageError> {
        let txn = self.read()?;
        let t = txn.open_table(LOCATIONS).map_err(db_err)?;
        let mut out = Vec::new();
        for item in t
            .range((ledger_id, first)..=(ledger_id, i64::MAX))
            .map_err(db_err)?
        {
            if out.len() >= count_max {
                break;
            }
            let (k, v) = item.map_err(db_err)?;
            let entry_id = k.value().1;
            if entry_id != first + out.len() as i64 {
                break;
            }
            out.push((entry_id, Location::from_index(v.value())));
        }
        Ok(out)
    }

    /// Every indexed entry of the ledger that lives in log `log_id`.
    pub(crate) fn entries_in_log(
        &self,
        ledger_id: u64,
        log_id: u32,
    ) -> Result<Vec<(i64, Location)>, StorageError> {
        let txn = self.read()?;
        let t = txn.open_table(LOCATIONS).map_err(db_err)?;
        let mut out = Vec::new();
        for item in t
            .range((ledger_id, i64::MIN)..=(ledger_id, i64::MAX))
            .map_err(db_err)?
        {
            let (k, v) = item.map_err(db_err)?;
            let loc = Location::from_index(v.value());
            if loc.log_id == log_id {
                out.push((k.value().1, loc));
            }
        }
        Ok(out)
    }

    /// Highest indexed entry id of the ledger.
    pub(crate) fn last_entry_id(&self, ledger_id: u64) -> Result<Option<i64>, StorageError> {
        let txn = self.read()?;
        let t = txn.open_table(LOCATIONS).map_err(db_err)?;
        let mut range = t
            .range((ledger_id, i64::MIN)..=(ledger_id, i64::MAX))
            .map_err(db_err)?;
        match range.next_back() {
            Some(item) => Ok(Some(item.map_err(db_err)?.0.value().1)),
            None => Ok(None),
        }
    }

    /// The ledger's stored state.
    pub(crate) fn ledger_state(&self, ledger_id: u64) -> Result<Option<LedgerState>, StorageError> {
        let txn = self.read()?;
        let t = txn.open_table(LEDGERS).map_err(db_err)?;
        match t.get(ledger_id).map_err(db_err)? {
            Some(v) => decode_state(ledger_id, v.value()).map(Some),
            None => Ok(None),
        }
    }

    /// Number of ledgers with a stored state.
    pub(crate) fn ledger_count(&self) -> Result<u64, StorageError> {
        let txn = self.read()?;
        let t = txn.open_table(LEDGERS).map_err(db_err)?;
        t.len().map_err(db_err)
    }

    /// Every ledger with a state or an indexed entry, ascending.
    pub(crate) fn ledger_ids(&self) -> Result<Vec<u64>, StorageError> {
        let txn = self.read()?;
        let ledgers = txn.open_table(LEDGERS).map_err(db_err)?;
        let mut ids = Vec::new();
        for item in ledgers.iter().map_err(db_err)? {
            ids.push(item.map_err(db_err)?.0.value());
        }
        let locations = txn.open_table(LOCATIONS).map_err(db_err)?;
        let mut with_entries = Vec::new();
        let mut from = 0u64;
        loop {
            let mut range = locations.range((from, i64::MIN)..).map_err(db_err)?;
            let Some(item) = range.next() else { break };
            let ledger_id = item.map_err(db_err)?.0.value().0;
            with_entries.push(ledger_id);
            match ledger_id.checked_add(1) {
                Some(next) => from = next,
                None => break,
            }
        }
        ids.extend(with_entries);
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// Live bytes per log: the `log_ledgers` rows of ledgers that still have
    /// indexed entries. Logs with no live row are absent.
    pub(crate) fn live_bytes_per_log(&self) -> Result<HashMap<u32, u64>, StorageError> {
        let txn = self.read()?;
        let usage = txn.open_table(LOG_LEDGERS).map_err(db_err)?;
        let locations = txn.open_table(LOCATIONS).map_err(db_err)?;
        let mut alive: HashMap<u64, bool> = HashMap::new();
        let mut live: HashMap<u32, u64> = HashMap::new();
        for item in usage.iter().map_err(db_err)? {
            let (k, v) = item.map_err(db_err)?;
            let (log_id, ledger_id) = k.value();
            let is_alive = match alive.get(&ledger_id) {
                Some(a) => *a,
                None => {
                    let a = locations
                        .range((ledger_id, i64::MIN)..=(ledger_id, i64::MAX))
                        .map_err(db_err)?
                        .next()
                        .is_some();
                    alive.insert(ledger_id, a);
                    a
                }
            };
            if is_alive {
                *live.entry(log_id).or_insert(0) += v.value();
            }
        }
        Ok(live)
    }

    /// Ledgers with a `log_ledgers` row for log `log_id`.
    pub(crate) fn ledgers_in_log(&self, log_id: u32) -> Result<Vec<u64>, StorageError> {
        let txn = self.read()?;
        let usage = txn.open_table(LOG_LEDGERS).map_err(db_err)?;
        let mut out = Vec::new();
        for item in usage
            .range((log_id, 0)..=(log_id, u64::MAX))
            .map_err(db_err)?
        {
            out.push(item.map_err(db_err)?.0.value().1);
        }
        Ok(out)
    }
}

/// Adds `bytes` to the `(log, ledger)` usage row in `txn`.
pub(crate) fn add_usage(
    usage: &mut redb::Table<(u32, u64), u64>,
    log_id: u32,
    ledger_id: u64,
    bytes: u64,
) -> Result<(), StorageError> {
    let old = usage
        .get((log_id, ledger_id))
        .map_err(db_err)?
        .map(|v| v.value());
    usage
        .insert((log_id, ledger_id), old.unwrap_or(0) + bytes)
        .map_err(db_err)?;
    Ok(())
}

/// Removes every row of `log_id` from `log_ledgers`.
pub(crate) fn remove_log_rows(txn: &WriteTransaction, log_id: u32) -> Result<(), StorageError> {
    let mut usage = txn.open_table(LOG_LEDGERS).map_err(db_err)?;
    usage
        .retain_in((log_id, 0)..=(log_id, u64::MAX), |_, _| false)
        .map_err(db_err)?;
    Ok(())
}

/// Removes the ledger's locations and state in `txn`.
pub(crate) fn remove_ledger(txn: &WriteTransaction, ledger_id: u64) -> Result<(), StorageError> {
    let mut locations = txn.open_table(LOCATIONS).map_err(db_err)?;
    locations
        .retain_in((ledger_id, i64::MIN)..=(ledger_id, i64::MAX), |_, _| false)
        .map_err(db_err)?;
    let mut ledgers = txn.open_table(LEDGERS).map_err(db_err)?;
    ledgers.remove(ledger_id).map_err(db_err)?;
    Ok(())
}

const STATE_VERSION: u8 = 1;
const FLAG_FENCED: u8 = 1;
const FLAG_LIMBO: u8 = 2;
const FLAG_HAS_LAC: u8 = 4;

/// `[version u8][flags u8][key len u32][key][lac len u32][lac]`.
pub(crate) fn encode_state(state: &LedgerState) -> Vec<u8> {
    let lac = state.explicit_lac.as_deref().unwrap_or(&[]);
    let mut out = Vec::with_capacity(10 + state.master_key.len() + lac.len());
    out.put_u8(STATE_VERSION);
    let mut flags = 0;
    if state.fenced {
        flags |= FLAG_FENCED;
    }
    if state.limbo {
        flags |= FLAG_LIMBO;
    }
    if state.explicit_lac.is_some() {
        flags |= FLAG_HAS_LAC;
    }
    out.put_u8(flags);
    out.put_u32(state.master_key.len() as u32);
    out.put_slice(&state.master_key);
    out.put_u32(lac.len() as u32);
    out.put_slice(lac);
    out
}

/// Inverse of [`encode_state`]; a malformed value is `Corrupt` (entry id −1).
pub(crate) fn decode_state(ledger_id: u64, raw: &[u8]) -> Result<LedgerState, StorageError> {
    let corrupt = |reason: &str| StorageError::Corrupt {
        ledger_id,
        entry_id: -1,
        reason: format!("ledger state: {reason}"),
    };
    let mut b = raw;
    if b.remaining() < 6 {
        return Err(corrupt("too short"));
    }
    let version = b.get_u8();
    if version != STATE_VERSION {
        return Err(corrupt(&format!("unknown version {version}")));
    }
    let flags = b.get_u8();
    let key_len = b.get_u32() as usize;
    if b.remaining() < key_len + 4 {
        return Err(corrupt("master key past the end"));
    }
    let master_key = Bytes::copy_from_slice(&b[..key_len]);
    b.advance(key_len);
    let lac_len = b.get_u32() as usize;
    if b.remaining() != lac_len {
        return Err(corrupt("explicit LAC length mismatch"));
    }
    let explicit_lac = (flags & FLAG_HAS_LAC != 0).then(|| Bytes::copy_from_slice(b));
    Ok(LedgerState {
        master_key,
        fenced: flags & FLAG_FENCED != 0,
        explicit_lac,
        limbo: flags & FLAG_LIMBO != 0,
    })
}
