//! In-memory state of one ledger on this bookie: master key, fenced, limbo,
//! explicit LAC and the highest LAC this bookie has seen (for long-poll reads).
//!
//! The durable copy lives in ledger storage ([`crate::storage::LedgerState`]),
//! covered by the journal until the next checkpoint; this struct is the cache
//! the add and read paths consult under one short mutex, so that the fence check
//! and the write-cache put of an add are atomic with respect to a fence (an add
//! that passed the check is in storage before a fencing read is answered).

use std::sync::Mutex;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::watch;

use crate::storage::LedgerState;

/// One ledger's cached state.
#[derive(Debug)]
pub struct LedgerHandle {
    /// The ledger.
    pub ledger_id: u64,
    mem: Mutex<LedgerState>,
    lac: watch::Sender<i64>,
}

/// `key` in an allocation of its own, for state kept as long as the ledger.
///
/// Keys arrive as slices of a gRPC decode buffer (`Bytes` fields decode
/// without a copy). Keeping such a slice in the ledger's cached state would
/// keep the whole buffer, kilobytes of other requests' entries, alive for as
/// long as the ledger is cached: about 16 KiB per ledger a bookie ever saw.
pub fn owned_key(key: &Bytes) -> Bytes {
    Bytes::copy_from_slice(key)
}

/// Encodes an explicit LAC for storage: the LAC then the writer's opaque body.
pub fn encode_explicit_lac(lac: i64, body: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(8 + body.len());
    b.put_i64(lac);
    b.put_slice(body);
    b.freeze()
}

/// Splits a stored explicit LAC into (lac, body); None if it is malformed.
pub fn decode_explicit_lac(stored: &Bytes) -> Option<(i64, Bytes)> {
    if stored.len() < 8 {
        return None;
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&stored[..8]);
    Some((i64::from_be_bytes(n), stored.slice(8..)))
}

impl LedgerHandle {
    /// A handle over `state`, with `lac` the highest LAC known so far.
    pub fn new(ledger_id: u64, state: LedgerState, lac: i64) -> Self {
        let (tx, _) = watch::channel(lac);
        LedgerHandle {
            ledger_id,
            mem: Mutex::new(state),
            lac: tx,
        }
    }

    /// Runs `f` with the state locked. Never held across an await.
    pub fn with<R>(&self, f: impl FnOnce(&mut LedgerState) -> R) -> R {
        let mut guard = match self.mem.lock() {
            Ok(g) => g,
            // A panic while holding the lock left plain data; keep serving it.
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    /// A copy of the state.
    pub fn snapshot(&self) -> LedgerState {
        self.with(|s| s.clone())
    }

    /// Raises the known LAC to `lac` (never lowers it) and wakes long polls.
    pub fn observe_lac(&self, lac: i64) {
        self.lac.send_if_modified(|cur| {
            if lac > *cur {
                *cur = lac;
                true
            } else {
                false
            }
        });
    }

    /// The highest LAC known.
    pub fn lac(&self) -> i64 {
        *self.lac.borrow()
    }

    /// A receiver that sees every LAC change (for long polls).
    pub fn subscribe_lac(&self) -> watch::Receiver<i64> {
        self.lac.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lac_only_moves_forward_and_wakes_subscribers() {
        let h = LedgerHandle::new(1, LedgerState::default(), -1);
        let mut rx = h.subscribe_lac();
        h.observe_lac(5);
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 5);
        h.observe_lac(3);
        assert!(!rx.has_changed().unwrap());
        assert_eq!(h.lac(), 5);
    }

    #[test]
    fn explicit_lac_round_trips() {
        let stored = encode_explicit_lac(42, b"body");
        assert_eq!(
            decode_explicit_lac(&stored),
            Some((42, Bytes::from_static(b"body")))
        );
        assert_eq!(decode_explicit_lac(&Bytes::from_static(b"short")), None);
    }
}
