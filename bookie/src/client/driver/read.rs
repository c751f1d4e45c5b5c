//! [`ReadHandle`] and the recovery driver.
//!
//! A read handle wraps the core's [`Reader`]: every entry read asks the
//! replica the core names, moves on after errors, digest failures and "no
//! entry", and sends a speculative read to the next replica after
//! `speculative_read_timeout_ms`. Reads of an open ledger stop at the highest
//! LAC seen (DESIGN §4 invariant 4); [`ReadHandle::read_lac`] and
//! [`ReadHandle::wait_lac_above`] (the bookies' long poll) move it.
//!
//! [`recover`] runs the core's [`Recovery`] to completion: each action is
//! performed on a spawned task whose answer comes back as an input, `tick`
//! runs on a timer; a recovery that gave up is started again from fresh
//! metadata, at most `recovery_attempts_max` times.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::registry::lock;
use super::{Inner, LedgerError};
use crate::bookie_client::read_status;
use crate::client::metadata::{UpdateError, last_segment, quorum_spec, write_set_bookies};
use crate::client::reader::{ReadError, ReadStep, Reader};
use crate::client::recovery::{FenceAnswer, Recovered, Recovery, RecoveryAction};
use crate::client::{BookieId, BookieStatus, EntryId};
use crate::proto::bookie::StatusCode;
use crate::proto::metadata::LedgerMetadata;

/// One entry as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// Its id.
    pub entry_id: EntryId,
    /// The application's bytes (digest-checked).
    pub payload: Bytes,
}

#[derive(Debug)]
struct State {
    reader: Reader,
    md: LedgerMetadata,
}

/// A reader of one ledger (see the module doc). Cheap to clone.
#[derive(Debug, Clone)]
pub struct ReadHandle {
    inner: Arc<Inner>,
    ledger_id: u64,
    state: Arc<Mutex<State>>,
    /// Sent with every entry read: bookies schedule reads fairly by it.
    fairness_key: Arc<str>,
}

fn nonempty(b: Bytes) -> Option<Bytes> {
    (!b.is_empty()).then_some(b)
}

impl ReadHandle {
    pub(crate) fn new(inner: Arc<Inner>, md: LedgerMetadata) -> Result<ReadHandle, LedgerError> {
        let mut reader = Reader::new(md.clone()).map_err(LedgerError::Read)?;
        reader.set_sticky_reads(inner.options.sticky_reads);
        Ok(ReadHandle {
            inner,
            ledger_id: md.ledger_id,
            state: Arc::new(Mutex::new(State { reader, md })),
            fairness_key: Arc::from(""),
        })
    }

    /// This handle with the opaque fairness key its entry reads carry (the
    /// broker uses the tenant; bookies share read capacity fairly among
    /// keys). Clones made afterwards keep it; the default is the empty key.
    pub fn with_fairness_key(mut self, key: &str) -> ReadHandle {
        self.fairness_key = Arc::from(key);
        self
    }

    /// The fairness key entry reads carry.
    pub fn fairness_key(&self) -> &str {
        &self.fairness_key
    }

    /// The ledger.
    pub fn ledger_id(&self) -> u64 {
        self.ledger_id
    }

    /// The metadata this handle reads with.
    pub fn metadata(&self) -> LedgerMetadata {
        lock(&self.state).md.clone()
    }

    /// Whether the ledger is closed (as of the handle's metadata).
    pub fn is_closed(&self) -> bool {
        lock(&self.state).reader.is_closed()
    }

    /// The highest entry a read may ask for now: the last entry of a closed
    /// ledger, else the highest LAC seen.
    pub fn last_readable(&self) -> EntryId {
        lock(&self.state).reader.last_readable()
    }

    /// Learns the LAC from this ledger's writer in this process (see
    /// [`crate::client::reader::Reader::observe_writer_lac`]).
    pub fn observe_writer_lac(&self, lac: EntryId) {
        lock(&self.state).reader.observe_writer_lac(lac);
    }

    /// Re-reads the metadata (new segments, a close).
    pub async fn refresh_metadata(&self) -> Result<(), LedgerError> {
        let (md, _) = self.inner.read_metadata(self.ledger_id).await?;
        let mut st = lock(&self.state);
        st.reader
            .update_metadata(md.clone())
            .map_err(LedgerError::Read)?;
        st.md = md;
        Ok(())
    }

    /// Asks the bookies of the last segment what they know of the LAC and
    /// returns the highest readable entry (a closed ledger's last entry).
    pub async fn read_lac(&self) -> Result<EntryId, LedgerError> {
        if !self.is_closed() {
            self.refresh_metadata().await?;
        }
        let (closed, ensemble) = {
            let st = lock(&self.state);
            (
                st.reader.is_closed(),
                last_segment(&st.md)
                    .map(|s| s.ensemble.clone())
                    .unwrap_or_default(),
            )
        };
        if closed {
            return Ok(self.last_readable());
        }
        let mut answers: FuturesUnordered<_> = ensemble
            .into_iter()
            .map(|b| {
                let inner = self.inner.clone();
                let ledger_id = self.ledger_id;
                async move {
                    let c = inner.pool.get(&b).await.ok()?;
                    match c.read_lac(ledger_id).await {
                        Ok(r) if StatusCode::try_from(r.status) == Ok(StatusCode::Ok) => {
                            Some((nonempty(r.last_entry_body), nonempty(r.lac_body)))
                        }
                        Ok(_) => None,
                        Err(e) => {
                            debug!(ledger = ledger_id, bookie = %b, error = %e, "read_lac failed");
                            None
                        }
                    }
                }
            })
            .collect();
        while let Some(a) = answers.next().await {
            if let Some((last, lac)) = a {
                lock(&self.state)
                    .reader
                    .observe_lac_answer(last.as_ref(), lac.as_ref());
            }
        }
        Ok(self.last_readable())
    }

    /// Tails the ledger: waits (the bookies' long poll, at most `timeout_ms`)
    /// until the LAC is above `previous`, and returns the highest readable
    /// entry then (unchanged when nothing new came in time).
    pub async fn wait_lac_above(
        &self,
        previous: EntryId,
        timeout_ms: u32,
    ) -> Result<EntryId, LedgerError> {
        let now = self.last_readable();
        if now > previous || self.is_closed() {
            return Ok(now);
        }
        let bookies = {
            let st = lock(&self.state);
            let spec = quorum_spec(&st.md).map_err(|e| LedgerError::BadMetadata {
                ledger_id: self.ledger_id,
                reason: e.to_string(),
            })?;
            write_set_bookies(&st.md, &spec, previous + 1)
        };
        let mut polls: FuturesUnordered<_> = bookies
            .into_iter()
            .map(|b| {
                let inner = self.inner.clone();
                let ledger_id = self.ledger_id;
                let key = self.fairness_key.clone();
                async move {
                    let c = inner.pool.get(&b).await.ok()?;
                    let r = c
                        .read_next(ledger_id, previous, timeout_ms, &key)
                        .await
                        .ok()?;
                    (StatusCode::try_from(r.status) == Ok(StatusCode::Ok)).then_some(())
                }
            })
            .collect();
        while let Some(r) = polls.next().await {
            if r.is_some() {
                break;
            }
        }
        drop(polls);
        self.read_lac().await
    }

    /// Reads entries `first..=last` (all of them at or below
    /// [`ReadHandle::last_readable`]), in order.
    pub async fn read(
        &self,
        first: EntryId,
        last: EntryId,
    ) -> Result<Vec<LedgerEntry>, LedgerError> {
        if first > last {
            return Ok(Vec::new());
        }
        // Refuse past the end before sending anything.
        lock(&self.state)
            .reader
            .read(last)
            .map_err(LedgerError::Read)?;
        let started = std::time::Instant::now();
        let parallel = self.inner.options.read_parallelism_max.max(1);
        let results: Vec<Result<LedgerEntry, LedgerError>> = futures::stream::iter(first..=last)
            .map(|e| self.read_entry_retrying(e))
            .buffered(parallel)
            .collect()
            .await;
        let r: Result<Vec<LedgerEntry>, LedgerError> = results.into_iter().collect();
        if let Some(m) = &self.inner.options.metrics {
            m.read_done(started, r.is_ok());
        }
        r
    }

    async fn read_entry_retrying(&self, entry_id: EntryId) -> Result<LedgerEntry, LedgerError> {
        match self.read_entry(entry_id).await {
            Err(LedgerError::Read(ReadError::NoValidReplica(_))) if !self.is_closed() => {
                // The ensemble may have changed since this handle read the metadata.
                self.refresh_metadata().await?;
                self.read_entry(entry_id).await
            }
            r => r,
        }
    }

    async fn read_entry(&self, entry_id: EntryId) -> Result<LedgerEntry, LedgerError> {
        let mut er = lock(&self.state)
            .reader
            .read(entry_id)
            .map_err(LedgerError::Read)?;
        let spec_timeout =
            Duration::from_millis(self.inner.options.speculative_read_timeout_ms.max(1));
        let mut inflight = FuturesUnordered::new();
        let mut step = er.start();
        loop {
            match step {
                ReadStep::Done(e) => {
                    lock(&self.state).reader.observe_entry(&e);
                    return Ok(LedgerEntry {
                        entry_id,
                        payload: e.payload,
                    });
                }
                ReadStep::Failed(err) => return Err(LedgerError::Read(err)),
                ReadStep::Send(b) => {
                    inflight.push(self.read_one(b, entry_id));
                    step = ReadStep::Wait;
                }
                ReadStep::Wait => {
                    if inflight.is_empty() {
                        return Err(LedgerError::Read(ReadError::NoValidReplica(entry_id)));
                    }
                    tokio::select! {
                        Some((b, status, body)) = inflight.next() => {
                            if status == BookieStatus::Timeout {
                                lock(&self.state).reader.bookie_failed(&b);
                            }
                            step = er.response(&b, status, body);
                        }
                        _ = tokio::time::sleep(spec_timeout) => {
                            step = er.speculative_timeout();
                        }
                    }
                }
            }
        }
    }

    async fn read_one(
        &self,
        bookie: BookieId,
        entry_id: EntryId,
    ) -> (BookieId, BookieStatus, Option<Bytes>) {
        let c = match self.inner.pool.get(&bookie).await {
            Ok(c) => c,
            Err(_) => return (bookie, BookieStatus::Timeout, None),
        };
        match c
            .read(self.ledger_id, entry_id, None, &self.fairness_key)
            .await
        {
            Ok(r) => {
                let status = BookieStatus::from_wire(read_status(&r));
                let body = (status == BookieStatus::Ok).then_some(r.body);
                (bookie, status, body)
            }
            Err(e) => {
                debug!(ledger = self.ledger_id, bookie = %bookie, entry = entry_id, error = %e, "read failed");
                (bookie, BookieStatus::Timeout, None)
            }
        }
    }
}

enum Event {
    Metadata(Result<LedgerMetadata, UpdateError>),
    Fence(BookieId, FenceAnswer),
    Read(BookieId, EntryId, BookieStatus, Option<Bytes>),
    Add(BookieId, EntryId, BookieStatus),
}

/// Recovers ledger `ledger_id` (fence, read forward, write back, close); see
/// the module doc.
pub(crate) async fn recover(inner: Arc<Inner>, ledger_id: u64) -> Result<Recovered, LedgerError> {
    let attempts = inner.options.recovery_attempts_max.max(1);
    let mut last_error = None;
    for attempt in 1..=attempts {
        let (md, _) = inner.read_metadata(ledger_id).await?;
        match recover_once(&inner, md).await {
            Ok(r) => {
                info!(
                    ledger = ledger_id,
                    last_entry = r.last_entry_id,
                    closed_by_us = r.closed_by_us,
                    attempt,
                    "recovery finished"
                );
                return Ok(r);
            }
            Err(e) => {
                warn!(ledger = ledger_id, attempt, error = %e, "recovery gave up; retrying");
                last_error = Some(e);
            }
        }
    }
    Err(last_error.unwrap_or(LedgerError::NoSuchLedger(ledger_id)))
}

async fn recover_once(inner: &Arc<Inner>, md: LedgerMetadata) -> Result<Recovered, LedgerError> {
    let ledger_id = md.ledger_id;
    let mut rec =
        Recovery::new(md, inner.options.recovery.clone()).map_err(LedgerError::Recovery)?;
    let key = rec.master_key().clone();
    let base = Instant::now();
    let now = || u64::try_from(base.elapsed().as_millis()).unwrap_or(u64::MAX);
    // Answers in flight: one per bookie per fence/read/add outstanding.
    let feedback_events_max = 1024;
    let (ev_tx, mut ev_rx) = mpsc::channel::<Event>(feedback_events_max);
    let mut interval =
        tokio::time::interval(Duration::from_millis(inner.options.tick_interval_ms.max(1)));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    rec.tick(now());
    rec.start();
    loop {
        while let Some(action) = rec.poll_action() {
            match action {
                RecoveryAction::Finished(r) => return r.map_err(LedgerError::Recovery),
                RecoveryAction::UpdateMetadata(op) => {
                    let (inner, ev_tx) = (inner.clone(), ev_tx.clone());
                    tokio::spawn(async move {
                        let r = inner.update_metadata(ledger_id, &op).await;
                        let _ = ev_tx.send(Event::Metadata(r)).await;
                    });
                }
                RecoveryAction::SendFence { bookie } => {
                    let (inner, ev_tx, key) = (inner.clone(), ev_tx.clone(), key.clone());
                    tokio::spawn(async move {
                        let answer = fence(&inner, &bookie, ledger_id, key).await;
                        let _ = ev_tx.send(Event::Fence(bookie, answer)).await;
                    });
                }
                RecoveryAction::SendRead {
                    bookie,
                    entry_id,
                    fence,
                } => {
                    let (inner, ev_tx) = (inner.clone(), ev_tx.clone());
                    let fence_key = fence.then(|| key.clone());
                    tokio::spawn(async move {
                        let (status, body) = match inner.pool.get(&bookie).await {
                            Ok(c) => match c
                                .read(ledger_id, entry_id, fence_key, crate::fair::RECOVERY_KEY)
                                .await
                            {
                                Ok(r) => {
                                    let s = BookieStatus::from_wire(read_status(&r));
                                    (s, (s == BookieStatus::Ok).then_some(r.body))
                                }
                                Err(_) => (BookieStatus::Timeout, None),
                            },
                            Err(_) => (BookieStatus::Timeout, None),
                        };
                        let _ = ev_tx
                            .send(Event::Read(bookie, entry_id, status, body))
                            .await;
                    });
                }
                RecoveryAction::SendAdd {
                    bookie,
                    entry_id,
                    body,
                } => {
                    let (inner, ev_tx, key) = (inner.clone(), ev_tx.clone(), key.clone());
                    tokio::spawn(async move {
                        let status = match inner.pool.get(&bookie).await {
                            Ok(c) => match c.add(ledger_id, entry_id, key, true, body).await {
                                Ok(code) => BookieStatus::from_wire(code),
                                Err(_) => {
                                    inner.pool.report_failure(&bookie);
                                    BookieStatus::Timeout
                                }
                            },
                            Err(_) => BookieStatus::Timeout,
                        };
                        let _ = ev_tx.send(Event::Add(bookie, entry_id, status)).await;
                    });
                }
                RecoveryAction::ChooseReplacements(req) => {
                    let chosen = inner.choose_replacements(&req);
                    rec.replacements_chosen(chosen);
                }
            }
        }
        tokio::select! {
            Some(ev) = ev_rx.recv() => {
                rec.tick(now());
                match ev {
                    Event::Metadata(r) => rec.metadata_result(r),
                    Event::Fence(b, a) => rec.fence_response(&b, a),
                    Event::Read(b, e, s, body) => rec.read_response(&b, e, s, body),
                    Event::Add(b, e, s) => rec.add_response(&b, e, s),
                }
            }
            _ = interval.tick() => rec.tick(now()),
        }
    }
}

/// Fences the ledger on `bookie` and reads what it knows of the LAC.
async fn fence(inner: &Inner, bookie: &str, ledger_id: u64, key: Bytes) -> FenceAnswer {
    let timeout = FenceAnswer {
        status: BookieStatus::Timeout,
        last_entry: None,
        explicit_lac: None,
    };
    let Ok(c) = inner.pool.get(bookie).await else {
        return timeout;
    };
    let status = match c
        .read(ledger_id, -1, Some(key), crate::fair::RECOVERY_KEY)
        .await
    {
        Ok(r) => BookieStatus::from_wire(read_status(&r)),
        Err(e) => {
            debug!(ledger = ledger_id, bookie, error = %e, "fence failed");
            return timeout;
        }
    };
    if status != BookieStatus::Ok {
        return FenceAnswer {
            status,
            last_entry: None,
            explicit_lac: None,
        };
    }
    match c.read_lac(ledger_id).await {
        Ok(r) if StatusCode::try_from(r.status) == Ok(StatusCode::Ok) => FenceAnswer {
            status,
            last_entry: nonempty(r.last_entry_body),
            explicit_lac: nonempty(r.lac_body),
        },
        // Fenced, but the LAC is unknown: retry the whole fence.
        Ok(r) => FenceAnswer {
            status: BookieStatus::from_wire(
                StatusCode::try_from(r.status).unwrap_or(StatusCode::IoError),
            ),
            last_entry: None,
            explicit_lac: None,
        },
        Err(_) => timeout,
    }
}
