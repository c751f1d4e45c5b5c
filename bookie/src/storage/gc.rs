//! Entry-log garbage collection and compaction (reference §3.7).
//!
//! GC never decides that a ledger is dead: it only reclaims bytes of ledgers the
//! server already removed with `delete_ledger`. Per-log live bytes come from the
//! index's `log_ledgers` rows (no log scan).
//!
//! Promises:
//! - a log with no live data is removed (after its rows are removed in a durable
//!   commit); logs at or above the writer's active log (read under the flush
//!   lock) are never touched, so a flush's uncommitted log is safe;
//! - a log whose live fraction is below `compaction_threshold` has its live
//!   records copied (CRC-checked) to the active log in batches of at most
//!   [`COMPACTION_BATCH_BYTES_MAX`], each synced then committed under the flush
//!   lock (the throttle: flushes interleave between batches); the old log is
//!   removed only after every live record has moved;
//! - a corrupt record stops the compaction of its log, which is kept (the data is
//!   never dropped silently);
//! - disk nearly full: empty logs are deleted first, then the sparsest logs are
//!   compacted one at a time, each removed before the next is copied; a log is
//!   compacted only if its live bytes fit in the available space (which may be the
//!   `reserved_bytes` the server keeps free for this).

use std::io;

use bytes::Bytes;

use super::entry_log::{LOG_HEADER_BYTES, Location, decode_record};
use redb::ReadableTable;

use super::index::{LOCATIONS, LOG_LEDGERS, add_usage, db_err, remove_log_rows};
use super::{LedgerStorage, StorageError, io_err};

/// Live bytes copied per compaction batch (one lock hold, one sync, one commit).
pub(crate) const COMPACTION_BATCH_BYTES_MAX: u64 = 16 << 20;

/// One log's GC view.
#[derive(Debug, Clone, Copy)]
struct LogUsage {
    log_id: u32,
    file_bytes: u64,
    live_bytes: u64,
}

impl LogUsage {
    fn live_fraction(&self) -> f64 {
        let data = self.file_bytes.saturating_sub(LOG_HEADER_BYTES).max(1);
        self.live_bytes as f64 / data as f64
    }
}

impl LedgerStorage {
    /// Deletes entry logs with no live data and compacts logs whose live fraction
    /// is below the threshold; returns bytes reclaimed. Works when the disk is
    /// nearly full (see [`gc`](self) promises). Blocking: call from a blocking
    /// thread.
    pub fn gc_and_compact(&self) -> Result<u64, StorageError> {
        self.check_open()?;
        let _pass = self.gc_lock.lock().map_err(super::poisoned)?;
        let mut reclaimed = 0u64;
        let mut sparse = Vec::new();
        // Taken under the flush lock, so no flush is halfway: every log below the
        // active one has all its rows committed, and later flushes and compaction
        // only append at or above it. Live bytes only shrink meanwhile (deletes),
        // so the scan below needs no lock.
        let active = self.lock_writer()?.active_log_id();
        let index = self.index()?;
        let live = index.live_bytes_per_log()?;
        for log_id in self
            .files
            .list()
            .map_err(|e| io_err("list entry logs", e))?
        {
            if log_id >= active {
                continue;
            }
            let file_bytes = self
                .files
                .get(log_id)
                .and_then(|f| f.len())
                .map_err(|e| io_err(&format!("entry log {log_id} length"), e))?;
            let live_bytes = live.get(&log_id).copied().unwrap_or(0);
            if live_bytes == 0 {
                self.remove_log(log_id)?;
                tracing::info!(
                    log_id,
                    bytes = file_bytes,
                    "entry log removed: no live data"
                );
                reclaimed += file_bytes;
            } else {
                sparse.push(LogUsage {
                    log_id,
                    file_bytes,
                    live_bytes,
                });
            }
        }
        let threshold = self.cfg.compaction_threshold;
        sparse.retain(|u| u.live_fraction() < threshold);
        sparse.sort_by(|a, b| a.live_fraction().total_cmp(&b.live_fraction()));
        for usage in sparse {
            let space = self
                .fs
                .space(self.files.dir())
                .map_err(|e| io_err("disk space", e))?;
            if usage.live_bytes > space.available_bytes {
                tracing::warn!(
                    log_id = usage.log_id,
                    live_bytes = usage.live_bytes,
                    available_bytes = space.available_bytes,
                    "entry log not compacted: its live data does not fit in the free space"
                );
                continue;
            }
            if space.available_bytes < self.cfg.reserved_bytes {
                tracing::info!(
                    log_id = usage.log_id,
                    available_bytes = space.available_bytes,
                    reserved_bytes = self.cfg.reserved_bytes,
                    "disk nearly full: compacting into the reserved space"
                );
            }
            if let Some(bytes) = self.compact_log(usage)? {
                reclaimed += bytes;
            }
        }
        Ok(reclaimed)
    }

    /// Removes a log's rows (durably), then the file. The log must be below the
    /// active one (nothing appends to it any more).
    fn remove_log(&self, log_id: u32) -> Result<(), StorageError> {
        let index = self.index()?;
        let txn = index.begin_write()?;
        remove_log_rows(&txn, log_id)?;
        txn.commit().map_err(db_err)?;
        self.files
            .remove(log_id)
            .map_err(|e| io_err(&format!("remove entry log {log_id}"), e))
    }

    /// Moves the live records of a log to the active log, then removes it.
    /// `Ok(None)` when the log was kept (a corrupt record).
    fn compact_log(&self, usage: LogUsage) -> Result<Option<u64>, StorageError> {
        let log_id = usage.log_id;
        let index = self.index()?;
        let mut batch: Vec<(u64, i64, Location)> = Vec::new();
        let mut batch_bytes = 0u64;
        let mut copied = 0u64;
        for ledger_id in index.ledgers_in_log(log_id)? {
            for (entry_id, loc) in index.entries_in_log(ledger_id, log_id)? {
                batch.push((ledger_id, entry_id, loc));
                batch_bytes += u64::from(loc.size);
                if batch_bytes >= COMPACTION_BATCH_BYTES_MAX {
                    match self.compact_batch(log_id, &batch)? {
                        Some(n) => copied += n,
                        None => return Ok(None),
                    }
                    batch.clear();
                    batch_bytes = 0;
                }
            }
        }
        match self.compact_batch(log_id, &batch)? {
            Some(n) => copied += n,
            None => return Ok(None),
        }
        self.remove_log(log_id)?;
        let reclaimed = usage.file_bytes.saturating_sub(copied);
        tracing::info!(
            log_id,
            copied_bytes = copied,
            reclaimed_bytes = reclaimed,
            "entry log compacted"
        );
        Ok(Some(reclaimed))
    }

    /// Copies one batch under the flush lock: read + check each record, append,
    /// sync, commit the new locations. `Ok(None)` if a record was corrupt.
    fn compact_batch(
        &self,
        log_id: u32,
        batch: &[(u64, i64, Location)],
    ) -> Result<Option<u64>, StorageError> {
        if batch.is_empty() {
            return Ok(Some(0));
        }
        let mut writer = self.lock_writer()?;
        let index = self.index()?;
        let file = self
            .files
            .open_for_scan(log_id)
            .map_err(|e| io_err(&format!("open entry log {log_id}"), e))?;
        let txn = index.begin_write()?;
        let copied = (|| -> Result<Option<u64>, StorageError> {
            let mut copied = 0u64;
            let mut moved = Vec::new();
            {
                let mut locations = txn.open_table(LOCATIONS).map_err(db_err)?;
                for &(ledger_id, entry_id, old) in batch {
                    let current = locations
                        .get((ledger_id, entry_id))
                        .map_err(db_err)?
                        .map(|v| Location::from_index(v.value()));
                    if current != Some(old) {
                        // Deleted or already moved since the batch was listed.
                        continue;
                    }
                    let mut buf = vec![0u8; old.size as usize];
                    let data = match file.read_exact_at(&mut buf, u64::from(old.offset)) {
                        Ok(()) => decode_record(&Bytes::from(buf), ledger_id, entry_id),
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                            Err(format!("short read: {e}"))
                        }
                        Err(e) => return Err(io_err(&format!("read entry log {log_id}"), e)),
                    };
                    let data = match data {
                        Ok(d) => d,
                        Err(reason) => {
                            tracing::warn!(
                                ledger_id,
                                entry_id,
                                log_id,
                                offset = old.offset,
                                %reason,
                                "corrupt entry found by compaction; entry log kept"
                            );
                            return Ok(None);
                        }
                    };
                    self.metrics
                        .entry_log_bytes_read
                        .inc_by(u64::from(old.size));
                    let new = writer
                        .append(ledger_id, entry_id, &data)
                        .map_err(|e| io_err("append to entry log", e))?;
                    locations
                        .insert((ledger_id, entry_id), new.to_index())
                        .map_err(db_err)?;
                    moved.push((new.log_id, ledger_id, u64::from(new.size)));
                    copied += u64::from(new.size);
                }
            }
            let mut usage = txn.open_table(LOG_LEDGERS).map_err(db_err)?;
            for (new_log, ledger_id, bytes) in moved {
                add_usage(&mut usage, new_log, ledger_id, bytes)?;
            }
            drop(usage);
            writer.sync().map_err(|e| io_err("sync entry logs", e))?;
            Ok(Some(copied))
        })();
        match copied {
            Ok(Some(n)) => {
                txn.commit().map_err(db_err)?;
                self.metrics.entry_log_bytes_written.inc_by(n);
                Ok(Some(n))
            }
            other => {
                writer.abandon();
                drop(txn);
                other
            }
        }
    }
}
