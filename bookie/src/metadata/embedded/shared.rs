//! What readers see: the committed tree, the registered watches, and each
//! session's shared state.
//!
//! The writer changes the committed tree only after the changes are durable, and
//! fires the watch events under the same lock, so a watch registered before a read
//! sees every change the read did not. A watch's channel holds at most
//! [`WATCH_EVENTS_MAX`] events; a watch whose consumer falls further behind is
//! dropped, which ends its stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{mpsc, watch};

use super::super::{MetadataError, SessionState, WATCH_EVENTS_MAX, WatchEvent, parent_of};
use super::tree::{Mutation, Tree};

/// Locks a mutex, ignoring poisoning: every critical section here leaves the data
/// consistent before anything can panic.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

const LIVE: u8 = 0;
const CLOSED: u8 = 1;
const EXPIRED: u8 = 2;

/// A session's state, shared by its handles and the writer.
#[derive(Debug)]
pub(super) struct SessionCore {
    /// Session id = ephemeral owner.
    pub id: i64,
    /// LIVE until the session's end is requested; then CLOSED or EXPIRED.
    ending: AtomicU8,
    /// Published state; turns terminal once the ephemerals are gone.
    state: watch::Sender<SessionState>,
}

impl SessionCore {
    /// A live session.
    pub fn new(id: i64) -> SessionCore {
        SessionCore {
            id,
            ending: AtomicU8::new(LIVE),
            state: watch::Sender::new(SessionState::Connected),
        }
    }

    /// Marks the end of the session as requested; true for the one caller that
    /// made the transition (and must ask the writer to end it).
    pub fn begin_end(&self, expired: bool) -> bool {
        let to = if expired { EXPIRED } else { CLOSED };
        self.ending
            .compare_exchange(LIVE, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// `Ok` while the session is live, else the error every call now returns.
    pub fn check_live(&self) -> Result<(), MetadataError> {
        match self.ending.load(Ordering::Acquire) {
            LIVE => Ok(()),
            CLOSED => Err(MetadataError::Closed),
            _ => Err(MetadataError::SessionExpired),
        }
    }

    /// The terminal state the session is heading to, if its end was requested.
    pub fn terminal_state(&self) -> Option<SessionState> {
        match self.ending.load(Ordering::Acquire) {
            LIVE => None,
            CLOSED => Some(SessionState::Closed),
            _ => Some(SessionState::Expired),
        }
    }

    /// Publishes the terminal state (after the ephemerals are gone).
    pub fn publish_end(&self) {
        if let Some(state) = self.terminal_state() {
            self.state.send_replace(state);
        }
    }

    /// A receiver of the published state.
    pub fn subscribe(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }
}

/// Which events a watch wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum WatchKind {
    /// Created / DataChanged / Deleted of the path.
    Data,
    /// ChildrenChanged of the path, and Deleted of the path itself.
    Children,
}

struct Watcher {
    id: u64,
    session: i64,
    tx: mpsc::Sender<WatchEvent>,
}

/// The committed state.
pub(super) struct Committed {
    /// The tree as of the last durable batch.
    pub tree: Tree,
    watchers: HashMap<(WatchKind, String), Vec<Watcher>>,
    next_watch_id: u64,
}

/// One change as readers see it, in the order the writer applied it.
#[derive(Debug)]
pub(super) enum Effect {
    /// A tree mutation.
    Mutate(Mutation),
    /// A session ended: its watches close now; its state is published by
    /// [`Effect::Ended`] after its ephemerals' deletes.
    DropWatches(i64),
    /// Publish the session's terminal state.
    Ended(Arc<SessionCore>),
}

/// Shared between the backend, its sessions, the writer and watch guards.
pub(super) struct Shared {
    /// The committed tree and the watches.
    pub committed: Mutex<Committed>,
    /// Write transactions committed since open.
    pub commits: AtomicU64,
}

impl Shared {
    /// Shared state over a loaded tree.
    pub fn new(tree: Tree) -> Shared {
        Shared {
            committed: Mutex::new(Committed {
                tree,
                watchers: HashMap::new(),
                next_watch_id: 0,
            }),
            commits: AtomicU64::new(0),
        }
    }
}

impl Committed {
    /// Registers a watch and returns its id and receiver.
    pub fn add_watch(
        &mut self,
        kind: WatchKind,
        path: &str,
        session: i64,
    ) -> (u64, mpsc::Receiver<WatchEvent>) {
        let (tx, rx) = mpsc::channel(WATCH_EVENTS_MAX);
        self.next_watch_id += 1;
        let id = self.next_watch_id;
        self.watchers
            .entry((kind, path.to_string()))
            .or_default()
            .push(Watcher { id, session, tx });
        (id, rx)
    }

    /// Removes one watch (its guard was dropped).
    pub fn remove_watch(&mut self, kind: WatchKind, path: &str, id: u64) {
        let key = (kind, path.to_string());
        if let Some(list) = self.watchers.get_mut(&key) {
            list.retain(|w| w.id != id);
            if list.is_empty() {
                self.watchers.remove(&key);
            }
        }
    }

    /// Number of registered watches (for tests).
    #[cfg(test)]
    pub fn watch_count(&self) -> usize {
        self.watchers.values().map(Vec::len).sum()
    }

    fn fire(&mut self, kind: WatchKind, path: &str, event: WatchEvent) {
        let key = (kind, path.to_string());
        let Some(list) = self.watchers.get_mut(&key) else {
            return;
        };
        // A full channel means the consumer is WATCH_EVENTS_MAX behind: drop the
        // watch, which ends its stream once the buffered events are read.
        list.retain(|w| w.tx.try_send(event.clone()).is_ok());
        if list.is_empty() {
            self.watchers.remove(&key);
        }
    }

    /// Applies one effect to the committed state and fires its events.
    pub fn apply(&mut self, effect: Effect) {
        match effect {
            Effect::Mutate(m) => {
                self.tree.apply(&m);
                match &m {
                    Mutation::Create { path, .. } => {
                        self.fire(WatchKind::Data, path, WatchEvent::Created(path.clone()));
                        if let Some(parent) = parent_of(path) {
                            self.fire(
                                WatchKind::Children,
                                parent,
                                WatchEvent::ChildrenChanged(parent.to_string()),
                            );
                        }
                    }
                    Mutation::Set { path, .. } => {
                        self.fire(WatchKind::Data, path, WatchEvent::DataChanged(path.clone()));
                    }
                    Mutation::Delete { path } => {
                        self.fire(WatchKind::Data, path, WatchEvent::Deleted(path.clone()));
                        self.fire(WatchKind::Children, path, WatchEvent::Deleted(path.clone()));
                        if let Some(parent) = parent_of(path) {
                            self.fire(
                                WatchKind::Children,
                                parent,
                                WatchEvent::ChildrenChanged(parent.to_string()),
                            );
                        }
                    }
                }
            }
            Effect::DropWatches(session) => {
                self.watchers.retain(|_, list| {
                    list.retain(|w| w.session != session);
                    !list.is_empty()
                });
            }
            Effect::Ended(core) => core.publish_end(),
        }
    }
}

/// Unregisters a watch when the [`super::super::Watch`] is dropped.
pub(super) struct WatchGuard {
    pub shared: Arc<Shared>,
    pub kind: WatchKind,
    pub path: String,
    pub id: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        lock(&self.shared.committed).remove_watch(self.kind, &self.path, self.id);
    }
}
