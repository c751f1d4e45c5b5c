//! The recorder: a cheap-to-clone, thread-safe, bounded in-memory log of
//! [`Event`]s, optionally mirrored to a JSON-lines file.
//!
//! Promises: every accepted event gets the next index and a monotonic
//! timestamp taken under the same lock, so index order is a total order
//! consistent with time; at most `events_max` events are kept in memory and
//! the rest are counted as dropped (a dropped event makes [`History::check`]
//! report [`Violation::Truncated`], never a silent pass); when a file is
//! configured every event is written to it as one JSON line as it is
//! recorded, so a failing test leaves its history on disk.

use std::fs::File;
use std::io::{BufRead, BufReader, LineWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::checker::{CheckOptions, check};
use super::event::{
    AckEvent, CursorPositionEvent, Event, EventKind, FaultEvent, ReceiveEvent,
    RedeliveryTriggerEvent, SendEvent, SendOp, SubType,
};
use super::message_id::MessageId;
use super::report::{Report, Violation};

/// Errors of history files.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The file could not be created, written or read.
    #[error("history file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line of a history file is not an event.
    #[error("history file {path}, line {line}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The JSON error.
        source: serde_json::Error,
    },
}

struct State {
    next_index: u64,
    events: Vec<Event>,
    events_dropped: u64,
    writer: Option<LineWriter<File>>,
    file_error: Option<String>,
}

struct Inner {
    start: Instant,
    events_max: usize,
    path: Option<PathBuf>,
    state: Mutex<State>,
}

/// A shared history of one test run. Clone it into every producer and
/// consumer task; all clones append to the same log.
#[derive(Clone)]
pub struct History {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("events_max", &self.inner.events_max)
            .field("len", &self.len())
            .field("path", &self.inner.path)
            .finish()
    }
}

impl History {
    /// An in-memory history keeping at most `events_max` events.
    pub fn new(events_max: usize) -> Self {
        Self::build(events_max, None, None)
    }

    /// A history keeping at most `events_max` events in memory and writing
    /// every event to `path` (created or truncated) as JSON lines.
    pub fn with_jsonl_file(
        events_max: usize,
        path: impl AsRef<Path>,
    ) -> Result<Self, HistoryError> {
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path).map_err(|source| HistoryError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(Self::build(
            events_max,
            Some(path),
            Some(LineWriter::new(file)),
        ))
    }

    fn build(events_max: usize, path: Option<PathBuf>, writer: Option<LineWriter<File>>) -> Self {
        Self {
            inner: Arc::new(Inner {
                start: Instant::now(),
                events_max,
                path,
                state: Mutex::new(State {
                    next_index: 0,
                    events: Vec::new(),
                    events_dropped: 0,
                    writer,
                    file_error: None,
                }),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave `State` inconsistent
        // (every update is a single push or counter bump), so keep recording.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends an event and returns its index.
    pub fn record(&self, kind: EventKind) -> u64 {
        let mut st = self.state();
        let index = st.next_index;
        st.next_index += 1;
        let at_ns = u64::try_from(self.inner.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let event = Event { index, at_ns, kind };
        if let Some(writer) = st.writer.as_mut() {
            let written = serde_json::to_writer(&mut *writer, &event)
                .map_err(|e| e.to_string())
                .and_then(|()| writer.write_all(b"\n").map_err(|e| e.to_string()));
            if let Err(e) = written {
                tracing::warn!(path = ?self.inner.path, error = %e, "history file write failed; file output stopped");
                st.writer = None;
                st.file_error = Some(e);
            }
        }
        if st.events.len() < self.inner.events_max {
            st.events.push(event);
        } else {
            st.events_dropped += 1;
        }
        index
    }

    /// A copy of the events kept in memory, in index order.
    pub fn events(&self) -> Vec<Event> {
        self.state().events.clone()
    }

    /// Number of events kept in memory.
    pub fn len(&self) -> usize {
        self.state().events.len()
    }

    /// Whether no event is kept in memory.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Events not kept because `events_max` was reached.
    pub fn events_dropped(&self) -> u64 {
        self.state().events_dropped
    }

    /// The in-memory bound this history was created with.
    pub fn events_max(&self) -> usize {
        self.inner.events_max
    }

    /// The JSON-lines file, if any.
    pub fn file_path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// The first write error of the JSON-lines file, after which the file
    /// stopped receiving events.
    pub fn file_error(&self) -> Option<String> {
        self.state().file_error.clone()
    }

    /// Flushes the JSON-lines file (lines are already flushed one by one;
    /// this is for callers that want to be sure).
    pub fn flush(&self) {
        let mut st = self.state();
        if let Some(w) = st.writer.as_mut()
            && let Err(e) = w.flush()
        {
            st.file_error = Some(e.to_string());
        }
    }

    /// Checks the events kept in memory; adds [`Violation::Truncated`] if
    /// any were dropped, and names the history file in the report.
    pub fn check(&self, options: &CheckOptions) -> Report {
        self.flush();
        let (events, dropped) = {
            let st = self.state();
            (st.events.clone(), st.events_dropped)
        };
        let mut report = check(&events, options);
        if dropped > 0 {
            report.violations.insert(
                0,
                Violation::Truncated {
                    events_dropped: dropped,
                    events_max: self.inner.events_max,
                },
            );
        }
        report.history_file = self.inner.path.clone();
        report
    }

    /// A recorder for one producer of one topic.
    pub fn producer(
        &self,
        producer: impl Into<String>,
        topic: impl Into<String>,
    ) -> ProducerRecorder {
        ProducerRecorder {
            history: self.clone(),
            producer: producer.into(),
            topic: topic.into(),
        }
    }

    /// A recorder for one consumer of one subscription.
    pub fn consumer(
        &self,
        consumer: impl Into<String>,
        topic: impl Into<String>,
        subscription: impl Into<String>,
        sub_type: SubType,
    ) -> ConsumerRecorder {
        ConsumerRecorder {
            history: self.clone(),
            consumer: consumer.into(),
            topic: topic.into(),
            subscription: subscription.into(),
            sub_type,
        }
    }

    /// Records a mark-delete position read from the admin stats.
    pub fn cursor_position(
        &self,
        topic: impl Into<String>,
        subscription: impl Into<String>,
        mark_delete: MessageId,
    ) -> u64 {
        self.record(EventKind::CursorPosition(CursorPositionEvent {
            topic: topic.into(),
            subscription: subscription.into(),
            mark_delete,
        }))
    }

    /// Records an injected or healed fault.
    pub fn fault(&self, description: impl Into<String>) -> u64 {
        self.record(EventKind::Fault(FaultEvent {
            description: description.into(),
        }))
    }
}

/// Reads a JSON-lines history file written by [`History::with_jsonl_file`].
pub fn load_jsonl(path: impl AsRef<Path>) -> Result<Vec<Event>, HistoryError> {
    let path = path.as_ref();
    let io_err = |source| HistoryError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let mut events = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io_err)?;
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|source| HistoryError::Parse {
            path: path.to_path_buf(),
            line: i + 1,
            source,
        })?;
        events.push(event);
    }
    Ok(events)
}

/// Records one producer's sends. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ProducerRecorder {
    history: History,
    producer: String,
    topic: String,
}

impl ProducerRecorder {
    fn send(&self, key: Option<&str>, payload_id: &str, op: SendOp) -> u64 {
        self.history.record(EventKind::Send(SendEvent {
            producer: self.producer.clone(),
            topic: self.topic.clone(),
            key: key.map(str::to_owned),
            payload_id: payload_id.to_owned(),
            op,
        }))
    }

    /// Records that a send of `payload_id` is about to be invoked.
    pub fn invoked(&self, key: Option<&str>, payload_id: &str) -> u64 {
        self.send(key, payload_id, SendOp::Invoked)
    }

    /// Records the broker's receipt for `payload_id`.
    pub fn acked(&self, payload_id: &str, message_id: MessageId) -> u64 {
        self.send(None, payload_id, SendOp::Acked { message_id })
    }

    /// Records a definite failure of the oldest pending send of `payload_id`.
    pub fn failed(&self, payload_id: &str, reason: impl Into<String>) -> u64 {
        self.send(
            None,
            payload_id,
            SendOp::Failed {
                reason: reason.into(),
            },
        )
    }

    /// Records that the outcome of the oldest pending send of `payload_id`
    /// is unknown.
    pub fn unknown(&self, payload_id: &str, reason: impl Into<String>) -> u64 {
        self.send(
            None,
            payload_id,
            SendOp::Unknown {
                reason: reason.into(),
            },
        )
    }
}

/// Records one consumer's receives and acks. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ConsumerRecorder {
    history: History,
    consumer: String,
    topic: String,
    subscription: String,
    sub_type: SubType,
}

impl ConsumerRecorder {
    /// Records a message handed to the application.
    pub fn received(
        &self,
        key: Option<&str>,
        payload_id: &str,
        message_id: MessageId,
        redelivery_count: u32,
    ) -> u64 {
        self.history.record(EventKind::Receive(ReceiveEvent {
            consumer: self.consumer.clone(),
            subscription: self.subscription.clone(),
            sub_type: self.sub_type,
            topic: self.topic.clone(),
            key: key.map(str::to_owned),
            payload_id: payload_id.to_owned(),
            message_id,
            redelivery_count,
        }))
    }

    fn ack(&self, message_id: MessageId, payload_id: Option<&str>, cumulative: bool) -> u64 {
        self.history.record(EventKind::Ack(AckEvent {
            consumer: self.consumer.clone(),
            subscription: self.subscription.clone(),
            topic: self.topic.clone(),
            message_id,
            payload_id: payload_id.map(str::to_owned),
            cumulative,
        }))
    }

    /// Records an individual ack (call before issuing it).
    pub fn acked(&self, message_id: MessageId, payload_id: Option<&str>) -> u64 {
        self.ack(message_id, payload_id, false)
    }

    /// Records a cumulative ack up to `message_id` (call before issuing it).
    pub fn acked_cumulative(&self, message_id: MessageId) -> u64 {
        self.ack(message_id, None, true)
    }

    /// Records a reason for the broker to redeliver this subscription's
    /// unacked messages (reconnect, negative ack, ack timeout, seek, a
    /// consumer joining or leaving).
    pub fn redelivery_triggered(&self, reason: impl Into<String>) -> u64 {
        self.history
            .record(EventKind::RedeliveryTrigger(RedeliveryTriggerEvent {
                consumer: self.consumer.clone(),
                subscription: self.subscription.clone(),
                topic: self.topic.clone(),
                reason: reason.into(),
            }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + Clone>() {}

    #[test]
    fn recorders_are_send_sync_and_clone() {
        assert_send_sync::<History>();
        assert_send_sync::<ProducerRecorder>();
        assert_send_sync::<ConsumerRecorder>();
    }

    #[test]
    fn indexes_are_dense_and_timestamps_monotonic_across_threads() {
        let h = History::new(10_000);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let p = h.producer(format!("p{t}"), "t");
                std::thread::spawn(move || {
                    for i in 0..250 {
                        p.invoked(None, &format!("{t}-{i}"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let events = h.events();
        assert_eq!(events.len(), 1000);
        for (i, pair) in events.windows(2).enumerate() {
            assert_eq!(pair[0].index, i as u64);
            assert_eq!(pair[1].index, i as u64 + 1);
            assert!(pair[0].at_ns <= pair[1].at_ns);
        }
    }

    #[test]
    fn capacity_bound_drops_and_check_reports_truncation() {
        let h = History::new(3);
        let p = h.producer("p", "t");
        for i in 0..5 {
            p.invoked(None, &format!("m{i}"));
        }
        assert_eq!(h.len(), 3);
        assert_eq!(h.events_dropped(), 2);
        let report = h.check(&CheckOptions::at_least_once());
        assert!(!report.is_ok());
        assert!(matches!(
            report.violations[0],
            Violation::Truncated {
                events_dropped: 2,
                events_max: 3
            }
        ));
    }

    #[test]
    fn jsonl_file_round_trips_every_event_kind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let h = History::with_jsonl_file(2, &path).unwrap();
        let p = h.producer("p", "t");
        let c = h.consumer("c", "t", "s", SubType::KeyShared);
        let id = MessageId::new(5, 1).with_batch_index(2);
        p.invoked(Some("k"), "m1");
        p.acked("m1", id);
        p.failed("m2", "closed");
        p.unknown("m3", "timeout");
        c.received(Some("k"), "m1", id, 1);
        c.acked(id, Some("m1"));
        c.acked_cumulative(id);
        c.redelivery_triggered("reconnect");
        h.cursor_position("t", "s", MessageId::new(5, 0));
        h.fault("kill -9 bookie-1");
        let loaded = load_jsonl(&path).unwrap();
        assert_eq!(loaded.len(), 10, "the file keeps events beyond events_max");
        assert_eq!(&loaded[..2], &h.events()[..]);
        assert_eq!(loaded[9].index, 9);
        assert!(matches!(loaded[9].kind, EventKind::Fault(_)));
        let report = h.check(&CheckOptions::at_least_once());
        assert_eq!(report.history_file.as_deref(), Some(path.as_path()));
    }

    #[test]
    fn load_jsonl_names_the_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.jsonl");
        std::fs::write(
            &path,
            "{\"index\":0,\"at_ns\":0,\"event\":\"fault\",\"description\":\"x\"}\nnot json\n",
        )
        .unwrap();
        match load_jsonl(&path) {
            Err(HistoryError::Parse { line, .. }) => assert_eq!(line, 2),
            other => panic!("expected a parse error, got {other:?}"),
        }
    }
}
