//! The read cache: entries read ahead from entry logs for catch-up readers,
//! bounded by `read_cache_bytes_max` (data plus a per-entry overhead), evicted
//! oldest-inserted first (a FIFO, like DbLedgerStorage's ring of segments).
//!
//! Promises: never holds more than its bound; an entry larger than the bound is
//! not cached; entries of a deleted ledger are dropped by [`ReadCache::remove_ledger`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use bytes::Bytes;

/// Bookkeeping bytes charged per cached entry on top of its data.
pub(crate) const ENTRY_OVERHEAD_BYTES: usize = 64;

#[derive(Debug, Default)]
struct Inner {
    entries: BTreeMap<(u64, i64), Bytes>,
    /// Insertion order; may hold keys already removed.
    order: VecDeque<(u64, i64)>,
    bytes: usize,
}

/// The cache; methods take `&self`.
#[derive(Debug)]
pub(crate) struct ReadCache {
    bytes_max: usize,
    inner: Mutex<Inner>,
}

impl ReadCache {
    /// An empty cache of at most `read_cache_bytes_max` bytes.
    pub(crate) fn new(read_cache_bytes_max: usize) -> ReadCache {
        ReadCache {
            bytes_max: read_cache_bytes_max,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The cache holds no invariant a panicking holder could break halfway
        // that matters for correctness (it is only a cache): take it anyway.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached entry.
    pub(crate) fn get(&self, ledger_id: u64, entry_id: i64) -> Option<Bytes> {
        self.lock().entries.get(&(ledger_id, entry_id)).cloned()
    }

    /// Caches an entry, evicting the oldest ones to stay within the bound.
    pub(crate) fn insert(&self, ledger_id: u64, entry_id: i64, data: Bytes) {
        let cost = data.len() + ENTRY_OVERHEAD_BYTES;
        if cost > self.bytes_max {
            return;
        }
        let mut inner = self.lock();
        if inner.entries.contains_key(&(ledger_id, entry_id)) {
            return;
        }
        while inner.bytes + cost > self.bytes_max {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some(d) = inner.entries.remove(&old) {
                inner.bytes -= d.len() + ENTRY_OVERHEAD_BYTES;
            }
        }
        inner.entries.insert((ledger_id, entry_id), data);
        inner.order.push_back((ledger_id, entry_id));
        inner.bytes += cost;
    }

    /// Drops the ledger's entries.
    pub(crate) fn remove_ledger(&self, ledger_id: u64) {
        let mut inner = self.lock();
        let keys: Vec<(u64, i64)> = inner
            .entries
            .range((ledger_id, i64::MIN)..=(ledger_id, i64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(d) = inner.entries.remove(&k) {
                inner.bytes -= d.len() + ENTRY_OVERHEAD_BYTES;
            }
        }
        // Stale keys left in `order` are skipped at eviction; compact the queue
        // when it grows past twice the live entries so it stays bounded too.
        if inner.order.len() > 2 * inner.entries.len() + 1024 {
            let Inner { entries, order, .. } = &mut *inner;
            order.retain(|k| entries.contains_key(k));
        }
    }

    /// Charged bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_its_bound_evicting_oldest_first() {
        let c = ReadCache::new(3 * (10 + ENTRY_OVERHEAD_BYTES));
        for e in 0..5 {
            c.insert(1, e, Bytes::from(vec![0u8; 10]));
        }
        assert!(c.bytes() <= 3 * (10 + ENTRY_OVERHEAD_BYTES));
        assert_eq!(c.get(1, 0), None);
        assert_eq!(c.get(1, 1), None);
        assert!(c.get(1, 4).is_some());
    }

    #[test]
    fn removed_ledger_is_gone_and_uncharged() {
        let c = ReadCache::new(1 << 20);
        c.insert(1, 0, Bytes::from_static(b"a"));
        c.insert(2, 0, Bytes::from_static(b"b"));
        c.remove_ledger(1);
        assert_eq!(c.get(1, 0), None);
        assert_eq!(c.bytes(), 1 + ENTRY_OVERHEAD_BYTES);
    }
}
