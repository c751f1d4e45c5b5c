//! The broker entry cache: recently appended entries of every managed ledger
//! of the broker, so tailing readers are served without bookie reads.
//!
//! Promises: the payload bytes held never exceed `cache_bytes_max` (an entry
//! larger than the bound is not cached); when an insert would pass the bound,
//! the oldest inserted entries (of any managed ledger) are evicted first; the
//! driver evicts what the slowest active cursor of a managed ledger has read
//! ([`EntryCache::evict_up_to`]) and whole ledgers when they are trimmed. A
//! cached payload is exactly the bytes appended at that position.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use crate::managed_ledger::Position;

#[derive(Debug, Default)]
struct Inner {
    /// (managed ledger id, position) → (insertion sequence, payload).
    entries: BTreeMap<(u64, Position), (u64, Bytes)>,
    /// Insertion sequence → key, oldest first.
    order: BTreeMap<u64, (u64, Position)>,
    next_seq: u64,
    next_ml_id: u64,
    size_bytes: usize,
}

impl Inner {
    fn remove(&mut self, key: &(u64, Position)) {
        if let Some((seq, payload)) = self.entries.remove(key) {
            self.order.remove(&seq);
            self.size_bytes -= payload.len();
        }
    }
}

/// The cache, shared by all managed ledgers of a broker (cheap to clone).
#[derive(Debug, Clone)]
pub struct EntryCache {
    cache_bytes_max: usize,
    inner: Arc<Mutex<Inner>>,
}

impl EntryCache {
    /// A cache holding at most `cache_bytes_max` payload bytes.
    pub fn new(cache_bytes_max: usize) -> Self {
        Self {
            cache_bytes_max,
            inner: Arc::new(Mutex::new(Inner::default())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh id for a managed ledger using this cache.
    pub fn register(&self) -> u64 {
        let mut g = self.lock();
        g.next_ml_id += 1;
        g.next_ml_id
    }

    /// The bound, in payload bytes.
    pub fn cache_bytes_max(&self) -> usize {
        self.cache_bytes_max
    }

    /// Payload bytes held now.
    pub fn size_bytes(&self) -> usize {
        self.lock().size_bytes
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// True if nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Caches the entry at `pos` of managed ledger `ml`, evicting the oldest
    /// entries as needed to stay within the bound.
    pub fn insert(&self, ml: u64, pos: Position, payload: Bytes) {
        if payload.len() > self.cache_bytes_max {
            return;
        }
        let mut g = self.lock();
        g.remove(&(ml, pos));
        while g.size_bytes + payload.len() > self.cache_bytes_max {
            let Some((_, key)) = g.order.pop_first() else {
                break;
            };
            if let Some((_, p)) = g.entries.remove(&key) {
                g.size_bytes -= p.len();
            }
        }
        let seq = g.next_seq;
        g.next_seq += 1;
        g.size_bytes += payload.len();
        g.order.insert(seq, (ml, pos));
        g.entries.insert((ml, pos), (seq, payload));
    }

    /// The cached payload at `pos` of `ml`, if any.
    pub fn get(&self, ml: u64, pos: Position) -> Option<Bytes> {
        self.lock().entries.get(&(ml, pos)).map(|(_, b)| b.clone())
    }

    /// Evicts every entry of `ml` at or before `pos` (what the slowest active
    /// cursor has read).
    pub fn evict_up_to(&self, ml: u64, pos: Position) {
        let mut g = self.lock();
        let keys: Vec<_> = g
            .entries
            .range((ml, Position::new(0, i64::MIN))..=(ml, pos))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            g.remove(&k);
        }
    }

    /// Evicts every entry of ledger `ledger_id` of `ml` (trimmed or deleted).
    pub fn evict_ledger(&self, ml: u64, ledger_id: u64) {
        let mut g = self.lock();
        let keys: Vec<_> = g
            .entries
            .range(
                (ml, Position::new(ledger_id, i64::MIN))..=(ml, Position::new(ledger_id, i64::MAX)),
            )
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            g.remove(&k);
        }
    }

    /// Evicts every entry of `ml` (closed or deleted).
    pub fn evict_all(&self, ml: u64) {
        self.evict_up_to(ml, Position::new(u64::MAX, i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(l: u64, e: i64) -> Position {
        Position::new(l, e)
    }

    fn b(n: usize) -> Bytes {
        Bytes::from(vec![7u8; n])
    }

    #[test]
    fn stays_within_the_byte_bound_evicting_oldest_first() {
        let c = EntryCache::new(100);
        let (a, z) = (c.register(), c.register());
        c.insert(a, p(1, 0), b(40));
        c.insert(z, p(5, 0), b(40));
        c.insert(a, p(1, 1), b(40));
        assert!(c.size_bytes() <= 100);
        assert_eq!(c.get(a, p(1, 0)), None, "oldest evicted");
        assert_eq!(c.get(z, p(5, 0)), Some(b(40)));
        assert_eq!(c.get(a, p(1, 1)), Some(b(40)));
    }

    #[test]
    fn an_entry_above_the_bound_is_not_cached() {
        let c = EntryCache::new(10);
        c.insert(1, p(1, 0), b(11));
        assert!(c.is_empty());
        assert_eq!(c.size_bytes(), 0);
    }

    #[test]
    fn evict_up_to_removes_only_that_managed_ledgers_prefix() {
        let c = EntryCache::new(1_000);
        for e in 0..5 {
            c.insert(1, p(3, e), b(10));
            c.insert(2, p(3, e), b(10));
        }
        c.insert(1, p(4, 0), b(10));
        c.evict_up_to(1, p(3, 2));
        assert_eq!(c.get(1, p(3, 2)), None);
        assert_eq!(c.get(1, p(3, 3)), Some(b(10)));
        assert_eq!(c.get(1, p(4, 0)), Some(b(10)));
        assert_eq!(c.get(2, p(3, 0)), Some(b(10)));
        assert_eq!(c.size_bytes(), 30 + 50);
        c.evict_ledger(1, 3);
        assert_eq!(c.get(1, p(3, 3)), None);
        assert_eq!(c.get(1, p(4, 0)), Some(b(10)));
        c.evict_all(2);
        assert_eq!(c.len(), 1);
        assert_eq!(c.size_bytes(), 10);
    }

    #[test]
    fn reinserting_a_position_replaces_it_without_double_counting() {
        let c = EntryCache::new(100);
        c.insert(1, p(1, 0), b(30));
        c.insert(1, p(1, 0), b(20));
        assert_eq!(c.size_bytes(), 20);
        assert_eq!(c.len(), 1);
    }
}
