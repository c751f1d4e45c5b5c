//! [`WriteHandle`]: one task per ledger drives the core's [`Writer`].
//!
//! The handle sends commands (add, close) over a bounded channel
//! (`add_queue_max`) to the task, which alone owns the `Writer`: it feeds each
//! command and each bookie answer to the core, calls `tick` on a timer
//! (`tick_interval_ms`; add timeouts and the idle writer's explicit LAC fire
//! there), and performs every action the core asks for: adds are sent as
//! futures the task polls itself (each answer comes back as an input),
//! metadata updates run as read-modify-CAS loops on spawned tasks,
//! replacements come from placement.
//!
//! Promises: adds complete in entry order and only when the core says so
//! (Qa acks of the current write set and every earlier entry completed);
//! when the core pushes back (outstanding adds/bytes bounds), the task stops
//! taking commands, so callers wait on the channel; after the writer failed,
//! every pending and later add fails with the writer's error.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt as _;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use super::{Inner, LedgerError};
use crate::client::metadata::UpdateError;
use crate::client::writer::{AddError, Writer, WriterAction, WriterError};
use crate::client::{BookieId, BookieStatus, EntryId};
use crate::proto::metadata::LedgerMetadata;

type Reply = oneshot::Sender<Result<EntryId, LedgerError>>;

enum Cmd {
    Add(Bytes, Reply),
    Close(Reply),
}

enum Event {
    AddDone {
        bookie: BookieId,
        entry_id: EntryId,
        status: BookieStatus,
    },
    Metadata(Result<LedgerMetadata, UpdateError>),
}

/// The completion of an add submitted with [`WriteHandle::add_pipelined`]:
/// resolves to the entry id once the entry is durable on an ack quorum (and
/// every earlier entry completed).
#[derive(Debug)]
pub struct PendingAdd {
    rx: oneshot::Receiver<Result<EntryId, LedgerError>>,
    /// When the add was submitted, and where its latency goes.
    measured: Option<(Instant, super::metrics::ClientMetrics)>,
}

impl Future for PendingAdd {
    type Output = Result<EntryId, LedgerError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = std::task::ready!(Pin::new(&mut self.rx).poll(cx))
            .unwrap_or(Err(LedgerError::HandleClosed));
        if let Some((started, m)) = self.measured.take() {
            m.add_done(started, r.is_ok());
        }
        Poll::Ready(r)
    }
}

/// The writer of one ledger (see the module doc). Clones share the ledger's
/// task; entry ids follow the order in which adds are submitted.
#[derive(Debug, Clone)]
pub struct WriteHandle {
    ledger_id: u64,
    tx: mpsc::Sender<Cmd>,
    lac: Arc<AtomicI64>,
    metrics: Option<super::metrics::ClientMetrics>,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cmd::Add(b, _) => write!(f, "Add({} bytes)", b.len()),
            Cmd::Close(_) => write!(f, "Close"),
        }
    }
}

impl WriteHandle {
    pub(crate) fn start(inner: Arc<Inner>, md: LedgerMetadata) -> Result<WriteHandle, LedgerError> {
        let ledger_id = md.ledger_id;
        let writer = Writer::new(md, inner.options.writer.clone()).map_err(LedgerError::Writer)?;
        let (tx, rx) = mpsc::channel(inner.options.add_queue_max.max(1));
        let lac = Arc::new(AtomicI64::new(-1));
        // Answers in flight are bounded by outstanding adds × Qw, plus metadata.
        let feedback_events_max = inner
            .options
            .writer
            .outstanding_adds_max
            .saturating_mul(4)
            .max(64);
        let (ev_tx, ev_rx) = mpsc::channel(feedback_events_max);
        let metrics = inner.options.metrics.clone();
        let task = Task {
            key: writer.master_key().clone(),
            inner,
            writer,
            ledger_id,
            base: Instant::now(),
            waiters: VecDeque::new(),
            backlog: VecDeque::new(),
            close_waiters: Vec::new(),
            ev_tx,
            adds_in_flight: FuturesUnordered::new(),
            lac: lac.clone(),
            closed_at: None,
            explicit_lac_sent: -1,
            last_tick_ms: u64::MAX,
        };
        tokio::spawn(task.run(rx, ev_rx));
        Ok(WriteHandle {
            ledger_id,
            tx,
            lac,
            metrics,
        })
    }

    /// The ledger.
    pub fn ledger_id(&self) -> u64 {
        self.ledger_id
    }

    /// The last add confirmed (−1 = none yet).
    pub fn lac(&self) -> EntryId {
        self.lac.load(Ordering::Acquire)
    }

    /// Submits an add and returns once it has its place in the ledger (the
    /// entry id order is the order of these calls); await the returned
    /// [`PendingAdd`] for its completion. Waits while the writer pushes back.
    pub async fn add_pipelined(
        &self,
        payload: impl Into<Bytes>,
    ) -> Result<PendingAdd, LedgerError> {
        let measured = self.metrics.clone().map(|m| (Instant::now(), m));
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Add(payload.into(), tx))
            .await
            .map_err(|_| LedgerError::HandleClosed)?;
        Ok(PendingAdd { rx, measured })
    }

    /// Appends `payload` and waits until it is durable on an ack quorum;
    /// returns its entry id.
    pub async fn add(&self, payload: impl Into<Bytes>) -> Result<EntryId, LedgerError> {
        self.add_pipelined(payload).await?.await
    }

    /// Closes the ledger after every submitted add completed; returns the
    /// last entry id (−1 for an empty ledger).
    pub async fn close(&self) -> Result<EntryId, LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Close(tx))
            .await
            .map_err(|_| LedgerError::HandleClosed)?;
        rx.await.unwrap_or(Err(LedgerError::HandleClosed))
    }
}

struct Task {
    inner: Arc<Inner>,
    writer: Writer,
    ledger_id: u64,
    key: Bytes,
    base: Instant,
    /// Submitted adds waiting for completion, in entry order.
    waiters: VecDeque<(EntryId, Reply)>,
    /// Commands not yet accepted by the core (backpressure).
    backlog: VecDeque<Cmd>,
    close_waiters: Vec<Reply>,
    ev_tx: mpsc::Sender<Event>,
    /// Adds sent to bookies, polled by this task (no task per request: an
    /// answer wakes the driver directly). Bounded by the core's outstanding
    /// adds × Qw (plus answers to replaced bookies not yet back).
    adds_in_flight: FuturesUnordered<BoxFuture<'static, Event>>,
    lac: Arc<AtomicI64>,
    closed_at: Option<EntryId>,
    /// The last LAC sent explicitly (−1 = none).
    explicit_lac_sent: EntryId,
    /// The time last given to the core.
    last_tick_ms: u64,
}

impl Task {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>, mut ev_rx: mpsc::Receiver<Event>) {
        let busy_period = Duration::from_millis(self.inner.options.tick_interval_ms.max(1));
        let idle_period = Duration::from_millis(
            (self.inner.options.writer.explicit_lac_interval_ms / 4)
                .max(self.inner.options.tick_interval_ms.max(1)),
        );
        let mut next_tick = tokio::time::Instant::now() + busy_period;
        let mut rx_open = true;
        loop {
            let take = rx_open && self.backlog.is_empty();
            // An idle ledger's task sleeps: no timer at all once its LAC was
            // sent explicitly, a slow one until then, the fast one while adds
            // or a close are outstanding.
            let busy = self.writer.outstanding_adds() > 0
                || !self.backlog.is_empty()
                || !self.close_waiters.is_empty();
            let lac_due = self.inner.options.writer.explicit_lac_interval_ms > 0
                && self.writer.lac() > self.explicit_lac_sent;
            let open = self.closed_at.is_none() && self.writer.error().is_none();
            let timer = open && (busy || lac_due);
            let period = if busy { busy_period } else { idle_period };
            let now = tokio::time::Instant::now();
            if next_tick > now + period {
                next_tick = now + period;
            }
            // Unbiased: a steady stream of answers never starves new adds.
            tokio::select! {
                Some(ev) = self.adds_in_flight.next(), if !self.adds_in_flight.is_empty() => {
                    self.tick();
                    self.event(ev);
                    // Take every answer already in before deciding anything.
                    while let Some(Some(ev)) = self.adds_in_flight.next().now_or_never() {
                        self.event(ev);
                    }
                }
                Some(ev) = ev_rx.recv() => {
                    self.tick();
                    self.event(ev);
                    while let Ok(ev) = ev_rx.try_recv() {
                        self.event(ev);
                    }
                }
                cmd = rx.recv(), if take => match cmd {
                    Some(c) => {
                        self.backlog.push_back(c);
                        while self.backlog.len() < 256 {
                            match rx.try_recv() {
                                Ok(c) => self.backlog.push_back(c),
                                Err(_) => break,
                            }
                        }
                    }
                    None => rx_open = false,
                },
                _ = tokio::time::sleep_until(next_tick), if timer => {
                    next_tick = tokio::time::Instant::now() + period;
                    self.tick();
                }
            }
            self.submit_backlog();
            self.drain();
            let idle =
                self.waiters.is_empty() && self.backlog.is_empty() && self.close_waiters.is_empty();
            if !rx_open && idle {
                debug!(ledger = self.ledger_id, "write handle dropped; task ends");
                return;
            }
        }
    }

    /// Gives the core the time. The core's tick scans every outstanding add
    /// for timeouts, so it runs at most once per millisecond (the clock's
    /// resolution anyway), however many inputs arrive.
    fn tick(&mut self) {
        let now = self.now_ms();
        if now != self.last_tick_ms {
            self.last_tick_ms = now;
            self.writer.tick(now);
        }
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::AddDone {
                bookie,
                entry_id,
                status,
            } => self.writer.add_response(&bookie, entry_id, status),
            Event::Metadata(r) => self.writer.metadata_result(r),
        }
        self.drain();
    }

    fn submit_backlog(&mut self) {
        if self.backlog.is_empty() {
            return;
        }
        // New requests are stamped with the time last given to the core.
        self.tick();
        while let Some(cmd) = self.backlog.pop_front() {
            match cmd {
                Cmd::Add(payload, reply) => match self.writer.add(&payload) {
                    Ok(id) => self.waiters.push_back((id, reply)),
                    Err(AddError::Backpressure { .. }) => {
                        self.backlog.push_front(Cmd::Add(payload, reply));
                        return;
                    }
                    Err(AddError::Failed(e)) => {
                        let _ = reply.send(Err(LedgerError::Writer(e)));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(LedgerError::Add(e)));
                    }
                },
                Cmd::Close(reply) => {
                    if let Some(last) = self.closed_at {
                        let _ = reply.send(Ok(last));
                    } else if let Some(e) = self.writer.error() {
                        let _ = reply.send(Err(LedgerError::Writer(e.clone())));
                    } else {
                        self.close_waiters.push(reply);
                        self.writer.close();
                    }
                }
            }
            self.drain();
        }
    }

    fn fail_waiters(&mut self, error: &WriterError) {
        for (_, reply) in self.waiters.drain(..) {
            let _ = reply.send(Err(LedgerError::Writer(error.clone())));
        }
        for reply in self.close_waiters.drain(..) {
            let _ = reply.send(Err(LedgerError::Writer(error.clone())));
        }
    }

    fn drain(&mut self) {
        while let Some(action) = self.writer.poll_action() {
            match action {
                WriterAction::SendAdd {
                    bookie,
                    entry_id,
                    body,
                } => self.send_add(bookie, entry_id, body),
                WriterAction::SendWriteLac { bookie, lac, body } => {
                    self.explicit_lac_sent = self.explicit_lac_sent.max(lac);
                    let inner = self.inner.clone();
                    let (ledger_id, key) = (self.ledger_id, self.key.clone());
                    tokio::spawn(async move {
                        if let Ok(c) = inner.pool.get(&bookie).await
                            && let Err(e) = c.write_lac(ledger_id, key, lac, body).await
                        {
                            debug!(ledger = ledger_id, bookie = %bookie, error = %e, "explicit LAC not written");
                        }
                    });
                }
                WriterAction::Completed { entry_id, .. } => {
                    self.lac.store(entry_id, Ordering::Release);
                    while let Some((id, _)) = self.waiters.front() {
                        if *id > entry_id {
                            break;
                        }
                        if let Some((id, reply)) = self.waiters.pop_front() {
                            let _ = reply.send(Ok(id));
                        }
                    }
                }
                WriterAction::ChooseReplacements(req) => {
                    let chosen = self.inner.choose_replacements(&req);
                    self.writer.replacements_chosen(chosen);
                }
                WriterAction::UpdateMetadata(op) => {
                    let inner = self.inner.clone();
                    let ev_tx = self.ev_tx.clone();
                    let ledger_id = self.ledger_id;
                    tokio::spawn(async move {
                        let r = inner.update_metadata(ledger_id, &op).await;
                        let _ = ev_tx.send(Event::Metadata(r)).await;
                    });
                }
                WriterAction::UnderReplicated { bookies } => {
                    let inner = self.inner.clone();
                    let ledger_id = self.ledger_id;
                    tokio::spawn(async move {
                        inner.report_underreplicated(ledger_id, &bookies).await;
                    });
                }
                WriterAction::Closed { last_entry_id, .. } => {
                    self.closed_at = Some(last_entry_id);
                    for reply in self.close_waiters.drain(..) {
                        let _ = reply.send(Ok(last_entry_id));
                    }
                }
                WriterAction::Failed { error, .. } => self.fail_waiters(&error),
            }
        }
    }

    fn send_add(&mut self, bookie: BookieId, entry_id: EntryId, body: Bytes) {
        let inner = self.inner.clone();
        let (ledger_id, key) = (self.ledger_id, self.key.clone());
        self.adds_in_flight.push(Box::pin(async move {
            let status = match inner.pool.get(&bookie).await {
                Ok(c) => match c.add(ledger_id, entry_id, key, false, body).await {
                    Ok(code) => BookieStatus::from_wire(code),
                    Err(e) => {
                        debug!(ledger = ledger_id, bookie = %bookie, entry = entry_id, error = %e, "add failed");
                        inner.pool.report_failure(&bookie);
                        BookieStatus::Timeout
                    }
                },
                Err(_) => BookieStatus::Timeout,
            };
            Event::AddDone {
                bookie,
                entry_id,
                status,
            }
        }));
    }
}
