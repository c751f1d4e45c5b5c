//! A simulated bookie: what the protocol relies on, nothing more.
//!
//! Adds and fences go to a journal; they are acknowledged only when a later
//! sync makes them durable (fsync-before-ack). A crash keeps the durable state
//! and loses the unsynced tail and every answer not yet sent. A fence is
//! visible at once (later normal adds are refused) and answered once durable,
//! with the entries added before it visible to the answer.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::client::{BookieStatus, EntryId};

/// Durable or visible state of the one simulated ledger on a bookie.
#[derive(Debug, Clone, Default)]
pub(crate) struct LedgerState {
    pub(crate) known: bool,
    pub(crate) master_key: Option<Bytes>,
    pub(crate) fenced: bool,
    pub(crate) entries: BTreeMap<EntryId, Bytes>,
    pub(crate) explicit_lac: Option<Bytes>,
}

/// What a request asks for once its journal record is durable.
#[derive(Debug, Clone)]
pub(crate) enum Deferred {
    AddOk { entry_id: EntryId },
    ReadAfterFence { entry_id: EntryId },
    FenceDone,
    WriteLacOk,
}

#[derive(Debug)]
pub(crate) struct SimBookie {
    pub(crate) id: String,
    pub(crate) up: bool,
    pub(crate) incarnation: u64,
    pub(crate) durable: LedgerState,
    pub(crate) visible: LedgerState,
    /// Answers waiting for the next sync: (client address index, request).
    pub(crate) waiting: Vec<(usize, Deferred)>,
    pub(crate) sync_scheduled: bool,
}

impl SimBookie {
    pub(crate) fn new(id: String) -> SimBookie {
        SimBookie {
            id,
            up: true,
            incarnation: 0,
            durable: LedgerState::default(),
            visible: LedgerState::default(),
            waiting: Vec::new(),
            sync_scheduled: false,
        }
    }

    pub(crate) fn crash(&mut self) {
        self.up = false;
        self.incarnation += 1;
        self.visible = self.durable.clone();
        self.waiting.clear();
        self.sync_scheduled = false;
    }

    fn check_key(&mut self, key: &Bytes) -> Result<(), BookieStatus> {
        match &self.visible.master_key {
            Some(k) if k != key => Err(BookieStatus::Unauthorized),
            Some(_) => Ok(()),
            None => {
                // The key is journalled with the ledger's first record; kept
                // durable at once for simplicity.
                self.visible.master_key = Some(key.clone());
                self.durable.master_key = Some(key.clone());
                Ok(())
            }
        }
    }

    /// An add: `Err` is an immediate answer, `Ok` waits for the sync.
    pub(crate) fn add(
        &mut self,
        entry_id: EntryId,
        body: Bytes,
        recovery: bool,
        key: &Bytes,
    ) -> Result<(), BookieStatus> {
        self.check_key(key)?;
        if self.visible.fenced && !recovery {
            return Err(BookieStatus::Fenced);
        }
        self.visible.known = true;
        self.visible.entries.insert(entry_id, body);
        Ok(())
    }

    /// A fence (alone or before a read): visible now, durable at the sync.
    pub(crate) fn fence(&mut self, key: &Bytes) -> Result<(), BookieStatus> {
        self.check_key(key)?;
        self.visible.fenced = true;
        Ok(())
    }

    /// An explicit LAC: stored now, durable at the sync.
    pub(crate) fn write_lac(&mut self, body: Bytes, key: &Bytes) -> Result<(), BookieStatus> {
        self.check_key(key)?;
        self.visible.explicit_lac = Some(body);
        Ok(())
    }

    /// A read answered now.
    pub(crate) fn read(&self, entry_id: EntryId) -> (BookieStatus, Option<Bytes>) {
        if !self.visible.known {
            return (BookieStatus::NoLedger, None);
        }
        match self.visible.entries.get(&entry_id) {
            Some(b) => (BookieStatus::Ok, Some(b.clone())),
            None => (BookieStatus::NoEntry, None),
        }
    }

    pub(crate) fn last_entry(&self) -> Option<Bytes> {
        self.visible.entries.values().next_back().cloned()
    }

    /// The journal is synced: everything visible is durable.
    pub(crate) fn sync(&mut self) -> Vec<(usize, Deferred)> {
        self.durable = self.visible.clone();
        self.sync_scheduled = false;
        std::mem::take(&mut self.waiting)
    }
}
