//! The write cache: entries put since the last checkpoint, sorted by
//! `(ledger, entry)`, in two halves (active + frozen) like DbLedgerStorage's
//! (reference §3.6).
//!
//! Promises: memory is bounded by `write_cache_bytes_max` (each half by half of
//! it, an entry counted as its data plus [`ENTRY_OVERHEAD_BYTES`]); a put of an
//! entry already cached keeps the first copy; when the active half is full it is
//! frozen (if no half is frozen yet) and waits for the next flush (the put
//! that froze it says so, so the owner can start that flush at once), and a
//! put that finds both halves full gets [`StorageError::WriteCacheFull`]; an entry stays
//! readable here until the flush that wrote it has committed the index.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use super::StorageError;

/// Bookkeeping bytes charged per cached entry on top of its data.
pub(crate) const ENTRY_OVERHEAD_BYTES: usize = 48;

/// One half: a sorted map and its charged size.
#[derive(Debug, Default, Clone)]
pub(crate) struct Half {
    /// Entries by `(ledger, entry)`.
    pub entries: BTreeMap<(u64, i64), Bytes>,
    /// Charged bytes.
    pub bytes: usize,
}

impl Half {
    fn get(&self, ledger_id: u64, entry_id: i64) -> Option<&Bytes> {
        self.entries.get(&(ledger_id, entry_id))
    }

    pub(crate) fn last_entry_id(&self, ledger_id: u64) -> Option<i64> {
        self.entries
            .range((ledger_id, i64::MIN)..=(ledger_id, i64::MAX))
            .next_back()
            .map(|((_, e), _)| *e)
    }

    fn remove_ledger(&mut self, ledger_id: u64) {
        let keys: Vec<(u64, i64)> = self
            .entries
            .range((ledger_id, i64::MIN)..=(ledger_id, i64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(d) = self.entries.remove(&k) {
                self.bytes -= d.len() + ENTRY_OVERHEAD_BYTES;
            }
        }
    }

    fn ledger_ids(&self, out: &mut Vec<u64>) {
        let mut next = self.entries.range((0, i64::MIN)..).next();
        while let Some(((l, _), _)) = next {
            out.push(*l);
            next = match l.checked_add(1) {
                Some(n) => self.entries.range((n, i64::MIN)..).next(),
                None => None,
            };
        }
    }
}

/// Both halves. The caller wraps it in a lock.
#[derive(Debug)]
pub(crate) struct WriteCache {
    half_bytes_max: usize,
    active: Half,
    frozen: Option<Arc<Half>>,
}

impl WriteCache {
    /// An empty cache of `write_cache_bytes_max` bytes in total.
    pub(crate) fn new(write_cache_bytes_max: usize) -> WriteCache {
        WriteCache {
            half_bytes_max: write_cache_bytes_max / 2,
            active: Half::default(),
            frozen: None,
        }
    }

    /// Charged bytes of both halves.
    pub(crate) fn bytes(&self) -> usize {
        self.active.bytes + self.frozen.as_ref().map_or(0, |f| f.bytes)
    }

    /// Caches an entry (see the module promises). True when this put froze
    /// the active half: a flush is due.
    pub(crate) fn put(
        &mut self,
        ledger_id: u64,
        entry_id: i64,
        data: Bytes,
    ) -> Result<bool, StorageError> {
        let cost = data.len() + ENTRY_OVERHEAD_BYTES;
        if cost > self.half_bytes_max {
            return Err(StorageError::TooLarge(data.len()));
        }
        if self.get(ledger_id, entry_id).is_some() {
            return Ok(false);
        }
        let mut froze = false;
        if self.active.bytes + cost > self.half_bytes_max {
            if self.frozen.is_some() {
                return Err(StorageError::WriteCacheFull);
            }
            self.frozen = Some(Arc::new(std::mem::take(&mut self.active)));
            froze = true;
        }
        self.active.entries.insert((ledger_id, entry_id), data);
        self.active.bytes += cost;
        Ok(froze)
    }

    /// The cached entry.
    pub(crate) fn get(&self, ledger_id: u64, entry_id: i64) -> Option<Bytes> {
        if let Some(d) = self.active.get(ledger_id, entry_id) {
            return Some(d.clone());
        }
        self.frozen.as_ref()?.get(ledger_id, entry_id).cloned()
    }

    /// Highest cached entry id of the ledger.
    pub(crate) fn last_entry_id(&self, ledger_id: u64) -> Option<i64> {
        let a = self.active.last_entry_id(ledger_id);
        let f = self
            .frozen
            .as_ref()
            .and_then(|f| f.last_entry_id(ledger_id));
        a.max(f)
    }

    /// Ledgers with a cached entry (unsorted, may repeat).
    pub(crate) fn ledger_ids(&self, out: &mut Vec<u64>) {
        self.active.ledger_ids(out);
        if let Some(f) = &self.frozen {
            f.ledger_ids(out);
        }
    }

    /// Drops every cached entry of the ledger.
    pub(crate) fn remove_ledger(&mut self, ledger_id: u64) {
        self.active.remove_ledger(ledger_id);
        if let Some(f) = &mut self.frozen {
            Arc::make_mut(f).remove_ledger(ledger_id);
        }
    }

    /// The frozen half to flush; the active half is frozen first if none is.
    /// `None` when there is nothing to flush.
    pub(crate) fn freeze(&mut self) -> Option<Arc<Half>> {
        if self.frozen.is_none() {
            if self.active.entries.is_empty() {
                return None;
            }
            self.frozen = Some(Arc::new(std::mem::take(&mut self.active)));
        }
        self.frozen.clone()
    }

    /// Whether a half is frozen (waiting for or in a flush).
    pub(crate) fn has_frozen(&self) -> bool {
        self.frozen.is_some()
    }

    /// Drops the frozen half once its flush has committed.
    pub(crate) fn release_frozen(&mut self) {
        self.frozen = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_active_half_freezes_then_second_full_half_is_rejected() {
        let mut c = WriteCache::new(2 * (100 + ENTRY_OVERHEAD_BYTES) * 2);
        let d = Bytes::from(vec![1u8; 100]);
        assert_eq!(c.put(1, 0, d.clone()), Ok(false));
        assert_eq!(c.put(1, 1, d.clone()), Ok(false));
        assert!(!c.has_frozen());
        assert_eq!(c.put(1, 2, d.clone()), Ok(true), "this put froze a half");
        assert!(c.has_frozen());
        assert_eq!(c.put(1, 3, d.clone()), Ok(false));
        assert_eq!(c.put(1, 4, d.clone()), Err(StorageError::WriteCacheFull));
        // Idempotent re-put of a cached entry is fine even when full.
        c.put(1, 0, d.clone()).unwrap();
        assert_eq!(c.last_entry_id(1), Some(3));
        c.release_frozen();
        c.put(1, 4, d).unwrap();
    }

    #[test]
    fn entry_larger_than_half_is_too_large() {
        let mut c = WriteCache::new(1000);
        assert_eq!(
            c.put(1, 0, Bytes::from(vec![0u8; 500])),
            Err(StorageError::TooLarge(500))
        );
    }

    #[test]
    fn re_put_keeps_the_first_copy_and_charges_once() {
        let mut c = WriteCache::new(1 << 20);
        c.put(7, 0, Bytes::from_static(b"first")).unwrap();
        c.put(7, 0, Bytes::from_static(b"second")).unwrap();
        assert_eq!(c.get(7, 0), Some(Bytes::from_static(b"first")));
        assert_eq!(c.bytes(), 5 + ENTRY_OVERHEAD_BYTES);
    }
}
