//! One add stream's pipeline: it reads add requests, starts each add at once
//! and yields the answers in completion order, all inside the response
//! stream's own `poll_next`.
//!
//! Promises:
//! - **No task or channel of its own.** Whoever polls the response stream
//!   (tonic's task for the RPC) reads the requests, starts the adds and takes
//!   their answers. A spawned task fed through a channel cost two more task
//!   wake-ups and a channel hand-off per add, and the add path is the hottest
//!   path of a bookie.
//! - **Bounded.** At most `in_flight_max` adds are in flight; a request over
//!   that bound is answered by `refuse` (the caller's `TOO_MANY_REQUESTS`)
//!   before anything more is read, so at most one refusal waits at a time.
//! - **Draining.** Once `draining` turns true (or its sender is gone) no more
//!   requests are read; the adds in flight are answered, then the stream ends.
//!   It also ends after the request stream ends (or fails) and every add in
//!   flight has been answered.
//! - **Backpressure.** Nothing is read while the response side is not polled
//!   (its flow-control window is full): adds already started still complete in
//!   the journal, only their answers wait.
//! - Dropping the stream drops the adds not yet answered (as a cancelled RPC
//!   must); what they already queued in the journal still becomes durable.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

/// See the module docs. `In` yields requests (or an error that ends reading),
/// `start` turns a request into the future of its answer, `refuse` answers a
/// request over the bound at once.
pub(crate) struct AddPipeline<In, Fut, Start, Refuse>
where
    Fut: Future,
{
    inbound: Option<In>,
    draining: WatchStream<bool>,
    pending: FuturesUnordered<Fut>,
    /// The answer to a request over the bound; nothing is read while it waits.
    refused: Option<Fut::Output>,
    in_flight_max: usize,
    start: Start,
    refuse: Refuse,
}

impl<In, Req, E, Fut, Start, Refuse> AddPipeline<In, Fut, Start, Refuse>
where
    In: Stream<Item = Result<Req, E>> + Unpin,
    E: std::fmt::Display,
    Fut: Future,
    Start: FnMut(Req) -> Fut,
    Refuse: FnMut(Req) -> Fut::Output,
{
    /// A pipeline over `inbound`. `draining` must already have been read
    /// (`borrow_and_update`): only later changes are seen.
    pub(crate) fn new(
        inbound: In,
        draining: watch::Receiver<bool>,
        in_flight_max: usize,
        start: Start,
        refuse: Refuse,
    ) -> Self {
        Self {
            inbound: Some(inbound),
            draining: WatchStream::from_changes(draining),
            pending: FuturesUnordered::new(),
            refused: None,
            in_flight_max: in_flight_max.max(1),
            start,
            refuse,
        }
    }
}

impl<In, Req, E, Fut, Start, Refuse> Stream for AddPipeline<In, Fut, Start, Refuse>
where
    In: Stream<Item = Result<Req, E>> + Unpin,
    E: std::fmt::Display,
    Fut: Future,
    Start: FnMut(Req) -> Fut + Unpin,
    Refuse: FnMut(Req) -> Fut::Output + Unpin,
    Fut::Output: Unpin,
{
    type Item = Fut::Output;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(answer) = this.refused.take() {
            return Poll::Ready(Some(answer));
        }
        // Draining: stop reading. Loop so the watch's waker is registered.
        while this.inbound.is_some() {
            match this.draining.poll_next_unpin(cx) {
                Poll::Ready(Some(false)) => continue,
                Poll::Ready(Some(true)) | Poll::Ready(None) => this.inbound = None,
                Poll::Pending => break,
            }
        }
        // Read every request that is ready (until the bound refuses one), so
        // the request stream's waker is registered when this returns Pending.
        while let Some(inbound) = this.inbound.as_mut() {
            match inbound.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(req))) => {
                    if this.pending.len() >= this.in_flight_max {
                        this.refused = Some((this.refuse)(req));
                        break;
                    }
                    this.pending.push((this.start)(req));
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!(error = %e, "add stream ended with an error");
                    this.inbound = None;
                }
                Poll::Ready(None) => this.inbound = None,
                Poll::Pending => break,
            }
        }
        // The adds just started are polled here for the first time (that is
        // when they queue their journal record).
        if let Poll::Ready(Some(answer)) = this.pending.poll_next_unpin(cx) {
            return Poll::Ready(Some(answer));
        }
        if let Some(answer) = this.refused.take() {
            return Poll::Ready(Some(answer));
        }
        if this.inbound.is_none() && this.pending.is_empty() {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc as fmpsc;
    use std::sync::{Arc, Mutex};
    use tokio::sync::oneshot;

    /// Answers are `(request, refused)`; each started add waits on a oneshot
    /// the test completes.
    type Answer = (u32, bool);
    type Gates = Arc<Mutex<Vec<(u32, oneshot::Sender<()>)>>>;

    #[allow(clippy::type_complexity)]
    fn pipeline(
        max: usize,
    ) -> (
        fmpsc::UnboundedSender<Result<u32, String>>,
        watch::Sender<bool>,
        Gates,
        Pin<Box<dyn Stream<Item = Answer> + Send>>,
    ) {
        let (req_tx, req_rx) = fmpsc::unbounded::<Result<u32, String>>();
        let (drain_tx, mut drain_rx) = watch::channel(false);
        drain_rx.borrow_and_update();
        let gates: Gates = Arc::default();
        let g = gates.clone();
        let p = AddPipeline::new(
            req_rx,
            drain_rx,
            max,
            move |r: u32| {
                let (tx, rx) = oneshot::channel();
                g.lock().unwrap().push((r, tx));
                async move {
                    let _ = rx.await;
                    (r, false)
                }
            },
            |r: u32| (r, true),
        );
        (req_tx, drain_tx, gates, Box::pin(p))
    }

    fn open(gates: &Gates, r: u32) {
        let mut g = gates.lock().unwrap();
        let i = g.iter().position(|(x, _)| *x == r).expect("started");
        let (_, tx) = g.remove(i);
        tx.send(()).unwrap();
    }

    fn poll_now<S: Stream + Unpin>(s: &mut S) -> Poll<Option<S::Item>> {
        let waker = futures::task::noop_waker();
        s.poll_next_unpin(&mut Context::from_waker(&waker))
    }

    #[tokio::test]
    async fn answers_in_completion_order_and_ends_after_inbound() {
        let (req, _drain, gates, mut s) = pipeline(8);
        for r in 1..=3 {
            req.unbounded_send(Ok(r)).unwrap();
        }
        assert!(poll_now(&mut s).is_pending());
        assert_eq!(gates.lock().unwrap().len(), 3, "every add started at once");
        open(&gates, 2);
        assert_eq!(s.next().await, Some((2, false)));
        open(&gates, 3);
        open(&gates, 1);
        let mut got = vec![s.next().await.unwrap(), s.next().await.unwrap()];
        got.sort();
        assert_eq!(got, vec![(1, false), (3, false)]);
        drop(req);
        assert_eq!(s.next().await, None);
    }

    #[tokio::test]
    async fn over_the_bound_is_refused_at_once_and_the_stream_goes_on() {
        let (req, _drain, gates, mut s) = pipeline(2);
        for r in 1..=4 {
            req.unbounded_send(Ok(r)).unwrap();
        }
        assert_eq!(s.next().await, Some((3, true)));
        assert_eq!(s.next().await, Some((4, true)));
        assert!(poll_now(&mut s).is_pending());
        open(&gates, 1);
        assert_eq!(s.next().await, Some((1, false)));
        req.unbounded_send(Ok(5)).unwrap();
        assert!(poll_now(&mut s).is_pending());
        assert_eq!(gates.lock().unwrap().len(), 2, "5 took 1's slot");
    }

    #[tokio::test]
    async fn draining_stops_reading_and_answers_what_is_in_flight() {
        let (req, drain, gates, mut s) = pipeline(8);
        req.unbounded_send(Ok(1)).unwrap();
        assert!(poll_now(&mut s).is_pending());
        drain.send(true).unwrap();
        req.unbounded_send(Ok(2)).unwrap();
        assert!(poll_now(&mut s).is_pending());
        assert_eq!(gates.lock().unwrap().len(), 1, "2 is not read");
        open(&gates, 1);
        assert_eq!(s.next().await, Some((1, false)));
        assert_eq!(
            s.next().await,
            None,
            "ends with the request stream still open"
        );
    }

    #[tokio::test]
    async fn a_request_stream_error_ends_reading_but_not_the_answers() {
        let (req, _drain, gates, mut s) = pipeline(8);
        req.unbounded_send(Ok(1)).unwrap();
        req.unbounded_send(Err("reset".into())).unwrap();
        req.unbounded_send(Ok(2)).unwrap();
        assert!(poll_now(&mut s).is_pending());
        assert_eq!(gates.lock().unwrap().len(), 1);
        open(&gates, 1);
        assert_eq!(s.next().await, Some((1, false)));
        assert_eq!(s.next().await, None);
    }

    #[tokio::test]
    async fn a_dropped_drain_sender_counts_as_draining() {
        let (req, drain, _gates, mut s) = pipeline(8);
        drop(drain);
        req.unbounded_send(Ok(1)).unwrap();
        assert_eq!(s.next().await, None);
    }
}
