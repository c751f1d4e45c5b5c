//! The Apache Pulsar client compatibility scripts (`tests/python/compat`) as
//! seen from Rust tests: finding the interpreter, running a script with a
//! bound, reading its one-line JSON verdict, and turning the JSON-lines
//! history a script wrote into checker events with the test's own fault
//! events merged in.
//!
//! Promises: a missing interpreter panics with the command that installs it
//! (never a silent skip; the lookup is [`crate::cluster::python`]:
//! `$CMS_TEST_PYTHON`, else `<repo>/.venv/bin/python`); every run is bounded (the child is killed at the
//! bound and the test fails naming the script); a failed script's panic
//! message holds its verdict line and the tail of its stderr (the C++
//! client's log), so a failure explains itself.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use crate::cluster::{PYTHON_ENV, python, repo_root};
use crate::history::{Event, EventKind, FaultEvent, HistoryError, SendEvent, SendOp, load_jsonl};

/// Lines of a failed script's stderr shown in the panic message.
pub const STDERR_TAIL_LINES: usize = 60;

/// The directory of the compatibility scripts.
pub fn compat_dir() -> PathBuf {
    repo_root().join("tests/python/compat")
}

/// How one script run ended.
#[derive(Debug, Clone)]
pub struct ScriptRun {
    /// The script and its arguments, for messages.
    pub command: String,
    /// Exit code (None: killed by a signal).
    pub code: Option<i32>,
    /// The JSON object on its last `{`-line of stdout (Null if none).
    pub json: serde_json::Value,
    /// Its whole stdout.
    pub stdout: String,
    /// Its stderr (the C++ client's log).
    pub stderr: String,
}

impl ScriptRun {
    /// Exit 0 and a verdict line with `"ok": true`.
    pub fn ok(&self) -> bool {
        self.code == Some(0) && self.json.get("ok") == Some(&serde_json::Value::Bool(true))
    }

    /// The last `lines` lines of stderr.
    pub fn stderr_tail(&self, lines: usize) -> String {
        let all: Vec<&str> = self.stderr.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Panics unless [`ScriptRun::ok`], with the verdict and the stderr tail.
    pub fn assert_ok(&self) {
        assert!(
            self.ok(),
            "{} failed (exit {:?}).\nverdict: {}\nstdout:\n{}\n----- last {STDERR_TAIL_LINES} lines of stderr -----\n{}",
            self.command,
            self.code,
            serde_json::to_string_pretty(&self.json).unwrap_or_default(),
            self.stdout.trim(),
            self.stderr_tail(STDERR_TAIL_LINES)
        );
    }
}

/// A script started in the background ([`spawn`]).
#[derive(Debug)]
pub struct ScriptChild {
    command: String,
    child: tokio::process::Child,
}

fn command(script: &str, args: &[String]) -> (String, tokio::process::Command) {
    let path = compat_dir().join(script);
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(&path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    (format!("{script} {}", args.join(" ")), cmd)
}

/// Starts `tests/python/compat/<script>` with `args`; the child is killed
/// if the handle is dropped.
pub fn spawn(script: &str, args: &[String]) -> ScriptChild {
    let (text, mut cmd) = command(script, args);
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {text}: {e}"));
    ScriptChild {
        command: text,
        child,
    }
}

impl ScriptChild {
    /// Waits at most `timeout_ms` for the script to exit.
    ///
    /// # Panics
    /// When the bound passes (the child is killed) or waiting fails.
    pub async fn finish(self, timeout_ms: u64) -> ScriptRun {
        let ScriptChild { command, child } = self;
        let out =
            match tokio::time::timeout(Duration::from_millis(timeout_ms), child.wait_with_output())
                .await
            {
                Ok(Ok(out)) => out,
                Ok(Err(e)) => panic!("waiting for {command}: {e}"),
                Err(_) => panic!("{command} did not finish within {timeout_ms} ms (killed)"),
            };
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let json = stdout
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(serde_json::Value::Null);
        ScriptRun {
            command,
            code: out.status.code(),
            json,
            stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// Runs a script to completion, at most `timeout_ms`.
pub async fn run(script: &str, args: &[String], timeout_ms: u64) -> ScriptRun {
    spawn(script, args).finish(timeout_ms).await
}

/// Standard arguments of every script: service URL, topic, per-operation
/// timeout, and a script deadline a little under `timeout_ms`.
pub fn base_args(service_url: &str, topic: &str, timeout_ms: u64) -> Vec<String> {
    let deadline_s = (timeout_ms.saturating_sub(2_000)).max(1_000) as f64 / 1000.0;
    vec![
        format!("--url={service_url}"),
        format!("--topic={topic}"),
        "--timeout-ms=10000".to_string(),
        format!("--deadline-s={deadline_s}"),
    ]
}

/// A topic name unique to this test process and call: `<prefix>-<pid>-<nanos>`.
pub fn unique_topic(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        wall_clock_ns() % 1_000_000_000_000
    )
}

/// Nanoseconds since the Unix epoch (CLOCK_REALTIME). The scripts stamp
/// their history events with Python's `time.time_ns()`, the same clock, so
/// the test can place its own fault events among them.
pub fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A fault the test injected, stamped with [`wall_clock_ns`] just before it
/// was injected (or just after it healed).
#[derive(Debug, Clone)]
pub struct StampedFault {
    /// When (wall clock, ns).
    pub at_ns: u64,
    /// What, for humans.
    pub description: String,
}

impl StampedFault {
    /// A fault stamped now.
    pub fn now(description: impl Into<String>) -> Self {
        Self {
            at_ns: wall_clock_ns(),
            description: description.into(),
        }
    }
}

/// Loads a script's history and merges `faults` in: the script's events keep
/// their own order (their `index`); each fault goes right before the first
/// script event stamped after it. Indexes are then renumbered densely
/// and times made relative to the first event.
pub fn load_history_with_faults(
    path: &Path,
    faults: &[StampedFault],
) -> Result<Vec<Event>, HistoryError> {
    let mut events = load_jsonl(path)?;
    events.sort_by_key(|e| e.index);
    Ok(merge_faults(events, faults))
}

fn merge_faults(events: Vec<Event>, faults: &[StampedFault]) -> Vec<Event> {
    let mut faults: Vec<&StampedFault> = faults.iter().collect();
    faults.sort_by_key(|f| f.at_ns);
    let mut out: Vec<Event> = Vec::with_capacity(events.len() + faults.len());
    let mut next_fault = 0;
    for event in events {
        while next_fault < faults.len() && faults[next_fault].at_ns < event.at_ns {
            out.push(fault_event(faults[next_fault]));
            next_fault += 1;
        }
        out.push(event);
    }
    out.extend(faults[next_fault..].iter().map(|f| fault_event(f)));
    let base = out.iter().map(|e| e.at_ns).min().unwrap_or(0);
    let mut last = 0;
    for (i, e) in out.iter_mut().enumerate() {
        e.index = i as u64;
        // Monotonic in index order even if the wall clock stepped back.
        last = last.max(e.at_ns.saturating_sub(base));
        e.at_ns = last;
    }
    out
}

/// Models the client's own resend across a connection loss: the C++ client
/// keeps unacknowledged sends pending and sends them again after it
/// reconnects (without deduplication on the topic, a send whose first copy
/// was stored before the loss is then stored twice, as with Apache Pulsar).
/// The application saw one `send()`; the history must see what happened on
/// the wire. For every send invoked before the fault event described as
/// `fault` whose outcome was recorded after it, this inserts, right after
/// the fault, an `unknown` outcome of that attempt and a second `invoked`
/// (the resend), so the later receipt belongs to the resend. Indexes are
/// renumbered.
pub fn client_resends_across(events: Vec<Event>, fault: &str) -> Vec<Event> {
    use std::collections::HashMap;
    let Some(fault_pos) = events
        .iter()
        .position(|e| matches!(&e.kind, EventKind::Fault(f) if f.description == fault))
    else {
        return events;
    };
    // (producer, topic, payload) -> invoked-before-the-fault attempts without an outcome yet.
    let mut open: HashMap<(String, String, String), (usize, Option<String>)> = HashMap::new();
    for e in &events[..fault_pos] {
        if let EventKind::Send(s) = &e.kind {
            let k = (s.producer.clone(), s.topic.clone(), s.payload_id.clone());
            match s.op {
                SendOp::Invoked => {
                    let entry = open.entry(k).or_insert((0, s.key.clone()));
                    entry.0 += 1;
                }
                _ => {
                    if let Some(entry) = open.get_mut(&k) {
                        entry.0 = entry.0.saturating_sub(1);
                    }
                }
            }
        }
    }
    let mut spanning: Vec<((String, String, String), Option<String>)> = open
        .into_iter()
        .filter(|(_, (n, _))| *n > 0)
        .map(|(k, (_, key))| (k, key))
        .collect();
    spanning.sort();
    let at_ns = events[fault_pos].at_ns;
    let mut out = events;
    let inserted = spanning
        .into_iter()
        .flat_map(|((producer, topic, payload_id), key)| {
            let send = |op| Event {
                index: 0,
                at_ns,
                kind: EventKind::Send(SendEvent {
                    producer: producer.clone(),
                    topic: topic.clone(),
                    key: key.clone(),
                    payload_id: payload_id.clone(),
                    op,
                }),
            };
            [
                send(SendOp::Unknown {
                    reason: format!("in flight at `{fault}`; the client resends it on reconnect"),
                }),
                send(SendOp::Invoked),
            ]
        });
    let tail = out.split_off(fault_pos + 1);
    out.extend(inserted);
    out.extend(tail);
    for (i, e) in out.iter_mut().enumerate() {
        e.index = i as u64;
    }
    out
}

fn fault_event(f: &StampedFault) -> Event {
    Event {
        index: 0,
        at_ns: f.at_ns,
        kind: EventKind::Fault(FaultEvent {
            description: f.description.clone(),
        }),
    }
}

/// How many lines of a (growing) JSON-lines history mention `needle`
/// (0 if the file does not exist yet).
pub fn count_lines_containing(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .map(|text| text.lines().filter(|l| l.contains(needle)).count())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{AckEvent, MessageId};

    fn ack(index: u64, at_ns: u64) -> Event {
        Event {
            index,
            at_ns,
            kind: EventKind::Ack(AckEvent {
                consumer: "c".into(),
                subscription: "s".into(),
                topic: "t".into(),
                message_id: MessageId::new(1, index),
                payload_id: None,
                cumulative: false,
            }),
        }
    }

    fn fault(at_ns: u64) -> StampedFault {
        StampedFault {
            at_ns,
            description: format!("fault at {at_ns}"),
        }
    }

    fn shape(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match &e.kind {
                EventKind::Fault(f) => f.description.clone(),
                EventKind::Ack(a) => format!("ack {}", a.message_id.entry_id),
                other => format!("{other:?}"),
            })
            .collect()
    }

    /// (index, at_ns) of script events; fault times; expected order.
    type MergeCase<'a> = (&'a [(u64, u64)], &'a [u64], &'a [&'a str]);

    #[test]
    fn faults_go_before_the_first_event_stamped_after_them() {
        let table: &[MergeCase] = &[
            // (index, at_ns) of script events; fault times; expected order.
            (
                &[(0, 100), (1, 200), (2, 300)],
                &[250],
                &["ack 0", "ack 1", "fault at 250", "ack 2"],
            ),
            (&[(0, 100)], &[50], &["fault at 50", "ack 0"]),
            (
                &[(0, 100)],
                &[100, 500],
                &["ack 0", "fault at 100", "fault at 500"],
            ),
            // Script order wins over a clock that stepped back.
            (
                &[(0, 300), (1, 200)],
                &[250],
                &["fault at 250", "ack 0", "ack 1"],
            ),
        ];
        for (events, faults, expected) in table {
            let events: Vec<Event> = events.iter().map(|&(i, t)| ack(i, t)).collect();
            let faults: Vec<StampedFault> = faults.iter().map(|&t| fault(t)).collect();
            let merged = merge_faults(events, &faults);
            assert_eq!(shape(&merged), *expected);
            let indexes: Vec<u64> = merged.iter().map(|e| e.index).collect();
            assert_eq!(indexes, (0..merged.len() as u64).collect::<Vec<_>>());
            assert!(merged.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
        }
    }

    fn send(index: u64, payload: &str, op: SendOp) -> Event {
        Event {
            index,
            at_ns: index,
            kind: EventKind::Send(SendEvent {
                producer: "p".into(),
                topic: "t".into(),
                key: None,
                payload_id: payload.into(),
                op,
            }),
        }
    }

    #[test]
    fn only_sends_in_flight_at_the_fault_get_a_resend() {
        let acked = |e| SendOp::Acked {
            message_id: MessageId::new(1, e),
        };
        let mut events = vec![
            send(0, "done", SendOp::Invoked),
            send(1, "done", acked(0)),
            send(2, "flying", SendOp::Invoked),
        ];
        events.push(fault_event(&fault(3)));
        events[3].index = 3;
        events.push(send(4, "flying", acked(1)));
        events.push(send(5, "later", SendOp::Invoked));
        let out = client_resends_across(events, "fault at 3");
        let shape: Vec<String> = out
            .iter()
            .map(|e| match &e.kind {
                EventKind::Send(s) => {
                    format!("{} {:?}", s.payload_id, std::mem::discriminant(&s.op))
                }
                EventKind::Fault(_) => "fault".into(),
                _ => "other".into(),
            })
            .collect();
        let d = |op: SendOp| format!("{:?}", std::mem::discriminant(&op));
        let unknown = d(SendOp::Unknown {
            reason: String::new(),
        });
        let invoked = d(SendOp::Invoked);
        let ack = d(acked(0));
        assert_eq!(
            shape,
            vec![
                format!("done {invoked}"),
                format!("done {ack}"),
                format!("flying {invoked}"),
                "fault".to_string(),
                format!("flying {unknown}"),
                format!("flying {invoked}"),
                format!("flying {ack}"),
                format!("later {invoked}"),
            ]
        );
        assert_eq!(
            out.iter().map(|e| e.index).collect::<Vec<_>>(),
            (0..8).collect::<Vec<u64>>()
        );
        // No such fault: unchanged.
        assert_eq!(client_resends_across(out.clone(), "nope"), out);
    }
}
