//! The embedded store's single writer: one OS thread that orders every
//! mutation, decides it, makes it durable, and only then shows it to readers.
//!
//! Group commit: the thread takes every request already queued (at most
//! `commit_batch_ops_max`), decides each one in order against its working copy
//! of the tree — so each result is exactly what a serial execution would give —
//! writes all the persistent changes of the batch in ONE redb transaction with
//! `Durability::Immediate` (one fsync), then applies the same mutations to the
//! committed tree readers use, fires the watch events, and answers the callers.
//! Requests that arrive while a commit is in flight wait in the queue and form
//! the next batch. A batch with no persistent change (ephemeral nodes, session
//! ends) touches no file.
//!
//! If a commit fails, the unsynced batch is lost: its callers get
//! [`MetadataError::Storage`], the working copy is reset to the committed tree,
//! and the store refuses every later mutation (reads still work) — an fsync
//! error is fatal for unsynced data, and redb asks for a reopen after one.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tracing::{debug, error};

use super::super::{CreateMode, Expected, MetadataError, Result, Stat};
use super::disk::{Disk, encode};
use super::shared::{Effect, SessionCore, Shared, lock};
use super::tree::{Mutation, Tree};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A mutation a session asks for.
#[derive(Debug)]
pub(super) enum Op {
    /// `create`.
    Create {
        /// Requested path (without the sequence suffix).
        path: String,
        /// Data.
        data: Bytes,
        /// Mode.
        mode: CreateMode,
    },
    /// `set`.
    Set {
        /// Path.
        path: String,
        /// Data.
        data: Bytes,
        /// Expected version.
        expected: Expected,
    },
    /// `delete`.
    Delete {
        /// Path.
        path: String,
        /// Expected version.
        expected: Expected,
    },
}

/// What a successful [`Op`] returns.
#[derive(Debug)]
pub(super) enum OpOutput {
    /// Created path and stat.
    Created(String, Stat),
    /// New stat after a set.
    Set(Stat),
    /// Deleted.
    Deleted,
}

/// One request to the writer.
pub(super) enum Request {
    /// A mutation. The permit bounds the requests in flight.
    Op {
        /// The asking session.
        session: Arc<SessionCore>,
        /// The mutation.
        op: Op,
        /// Where the result goes.
        reply: oneshot::Sender<Result<OpOutput>>,
        /// Released when the request is answered.
        _permit: OwnedSemaphorePermit,
    },
    /// End a session whose end was requested ([`SessionCore::begin_end`]):
    /// delete its ephemerals, close its watches, publish its terminal state.
    /// Sent at most once per session, so these need no permit.
    EndSession {
        /// The session.
        session: Arc<SessionCore>,
        /// Answered once done, if someone waits.
        reply: Option<oneshot::Sender<()>>,
    },
    /// Finish the queued requests and exit (the backend is being dropped).
    Shutdown,
}

/// Set once the writer thread has exited and the file is closed.
#[derive(Default)]
pub(super) struct Released {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Released {
    /// Waits until released or `timeout` passes; true if released.
    pub fn wait(&self, timeout: std::time::Duration) -> bool {
        let guard = lock(&self.done);
        let (guard, _) = self
            .cv
            .wait_timeout_while(guard, timeout, |done| !*done)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *guard
    }

    fn set(&self) {
        *lock(&self.done) = true;
        self.cv.notify_all();
    }
}

/// Marks [`Released`] when dropped, also when the writer panics.
struct ReleaseOnDrop(Arc<Released>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

/// The writer's state.
pub(super) struct Writer {
    /// Set when a commit failed; every later mutation fails with it.
    failed: Option<String>,
    working: Tree,
    shared: Arc<Shared>,
    commit_batch_ops_max: usize,
}

/// The answer owed to one request of a batch.
enum Outcome {
    Op(Result<OpOutput>),
    End,
    None,
}

impl Writer {
    /// A writer whose working tree starts as a copy of `tree`.
    pub fn new(tree: Tree, shared: Arc<Shared>, commit_batch_ops_max: usize) -> Writer {
        Writer {
            failed: None,
            working: tree,
            shared,
            commit_batch_ops_max: commit_batch_ops_max.max(1),
        }
    }

    /// The thread body: runs until [`Request::Shutdown`] or until every sender is
    /// gone. `disk` is dropped (file closed) before `released` is set.
    pub fn run(
        mut self,
        disk: Disk,
        mut rx: mpsc::UnboundedReceiver<Request>,
        released: Arc<Released>,
    ) {
        let _release = ReleaseOnDrop(released);
        let mut disk = disk;
        let mut shutdown = false;
        while !shutdown {
            let Some(first) = rx.blocking_recv() else {
                break;
            };
            let mut batch = vec![first];
            while batch.len() < self.commit_batch_ops_max {
                match rx.try_recv() {
                    Ok(req) => batch.push(req),
                    Err(_) => break,
                }
            }
            if batch.iter().any(|r| matches!(r, Request::Shutdown)) {
                shutdown = true;
            }
            self.process(&mut disk, batch);
        }
        drop(disk);
        debug!("metadata writer stopped");
    }

    fn process(&mut self, disk: &mut Disk, batch: Vec<Request>) {
        let mut effects = Vec::new();
        let mut dirty = BTreeMap::new();
        let mut outcomes = self.decide(&batch, &mut effects, &mut dirty);
        if !dirty.is_empty() {
            match disk.commit(&dirty) {
                Ok(()) => {
                    self.shared.commits.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    error!(error = %e, ops = batch.len(), "metadata commit failed; the store now refuses writes");
                    self.failed = Some(e.to_string());
                    self.working = lock(&self.shared.committed).tree.clone();
                    effects.clear();
                    dirty.clear();
                    // Decided again in failed mode: mutations fail, session ends
                    // (which touch no file) still happen.
                    outcomes = self.decide(&batch, &mut effects, &mut dirty);
                }
            }
        }
        {
            let mut committed = lock(&self.shared.committed);
            for effect in effects {
                committed.apply(effect);
            }
        }
        for (req, outcome) in batch.into_iter().zip(outcomes) {
            match (req, outcome) {
                (Request::Op { reply, .. }, Outcome::Op(result)) => {
                    // The caller may have gone away; the op stands anyway.
                    let _ = reply.send(result);
                }
                (
                    Request::EndSession {
                        reply: Some(reply), ..
                    },
                    Outcome::End,
                ) => {
                    let _ = reply.send(());
                }
                _ => {}
            }
        }
    }

    /// Decides every request of the batch in order, applying each to the working
    /// tree; collects the effects for readers and the records to write.
    fn decide(
        &mut self,
        batch: &[Request],
        effects: &mut Vec<Effect>,
        dirty: &mut BTreeMap<String, Option<Vec<u8>>>,
    ) -> Vec<Outcome> {
        let now = now_ms();
        let mut outcomes = Vec::with_capacity(batch.len());
        for req in batch {
            let outcome = match req {
                Request::Op { session, op, .. } => {
                    Outcome::Op(self.decide_op(session, op, now, effects, dirty))
                }
                Request::EndSession { session, .. } => {
                    effects.push(Effect::DropWatches(session.id));
                    for path in self.working.ephemerals_of(session.id) {
                        let m = Mutation::Delete { path };
                        self.apply(m, effects, dirty);
                    }
                    effects.push(Effect::Ended(Arc::clone(session)));
                    Outcome::End
                }
                Request::Shutdown => Outcome::None,
            };
            outcomes.push(outcome);
        }
        outcomes
    }

    fn decide_op(
        &mut self,
        session: &SessionCore,
        op: &Op,
        now: i64,
        effects: &mut Vec<Effect>,
        dirty: &mut BTreeMap<String, Option<Vec<u8>>>,
    ) -> Result<OpOutput> {
        // Checked here too: an op queued before its session ended must not
        // leave an ephemeral node behind.
        session.check_live()?;
        if let Some(reason) = &self.failed {
            return Err(MetadataError::Storage(format!(
                "the store refuses writes after a failed commit: {reason}"
            )));
        }
        match op {
            Op::Create { path, data, mode } => {
                let (m, full) =
                    self.working
                        .plan_create(session.id, path, data.clone(), *mode, now)?;
                self.apply(m, effects, dirty);
                let stat = self.stat_of(&full)?;
                Ok(OpOutput::Created(full, stat))
            }
            Op::Set {
                path,
                data,
                expected,
            } => {
                let m = self.working.plan_set(path, data.clone(), *expected, now)?;
                self.apply(m, effects, dirty);
                Ok(OpOutput::Set(self.stat_of(path)?))
            }
            Op::Delete { path, expected } => {
                let m = self.working.plan_delete(path, *expected)?;
                self.apply(m, effects, dirty);
                Ok(OpOutput::Deleted)
            }
        }
    }

    fn stat_of(&self, path: &str) -> Result<Stat> {
        self.working
            .get(path)
            .map(|n| n.stat())
            .ok_or_else(|| MetadataError::Backend(format!("{path} vanished while applied")))
    }

    fn apply(
        &mut self,
        m: Mutation,
        effects: &mut Vec<Effect>,
        dirty: &mut BTreeMap<String, Option<Vec<u8>>>,
    ) {
        for touched in self.working.apply(&m) {
            let record = self.working.get(&touched).map(encode);
            dirty.insert(touched, record);
        }
        effects.push(Effect::Mutate(m));
    }
}
