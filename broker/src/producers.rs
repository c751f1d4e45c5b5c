//! The producers of one topic as a pure state machine (STYLE §2): access
//! modes, unique names, the per-topic bound and the topic epoch.
//!
//! Rules (Pulsar's, for the modes we serve):
//! - `Shared`: any number of producers, unless an exclusive one holds the
//!   topic (then `ProducerBusy`);
//! - `Exclusive`: granted only when no other producer is connected, else
//!   `ProducerBusy`; each grant of exclusivity bumps the topic epoch;
//! - `WaitForExclusive`: granted like `Exclusive` when possible, otherwise
//!   queued (FIFO) and granted when the topic becomes free — the connection
//!   answers PRODUCER_SUCCESS with `producer_ready=false` first and a second
//!   one when granted (G12);
//! - a name already connected on the topic is `ProducerBusy`;
//! - an exclusive producer that presents a topic epoch lower than the
//!   current one was fenced by a newer exclusive producer: `ProducerFenced`;
//! - at most `producers_max` producers (connected plus waiting).
//!
//! Pure: no I/O, no clock. The caller (the topic) holds it under a lock and
//! sends what the returned [`Grant`]s say; it stores each granted epoch in
//! the managed ledger's properties before the producer hears of the grant,
//! and starts a reloaded topic from the stored one ([`Producers::with_epoch`]),
//! so epochs only grow across unloads, restarts and owner changes.

use std::collections::{BTreeMap, VecDeque};

/// How a producer wants the topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// Many producers.
    Shared,
    /// One producer; others are refused.
    Exclusive,
    /// One producer; others wait for their turn.
    WaitForExclusive,
}

/// A producer's identity: (connection id, producer id on that connection).
pub type ProducerKey = (u64, u64);

/// A producer asking to join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerRequest {
    /// Who.
    pub key: ProducerKey,
    /// Its name (assigned or user-provided).
    pub name: String,
    /// Access mode.
    pub mode: AccessMode,
    /// The topic epoch the client presents (reconnects of exclusive producers).
    pub topic_epoch: Option<u64>,
}

/// Why a producer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProducerRefusal {
    /// Another producer has the name, or the topic is held exclusively, or
    /// the topic has too many producers.
    #[error("{0}")]
    Busy(String),
    /// A newer exclusive producer fenced this one.
    #[error("{0}")]
    Fenced(String),
    /// The topic is being unloaded (policy change, bundle unload, failure):
    /// retryable, the next load serves the producer (Pulsar answers a
    /// fenced topic with `ServiceNotReady` too).
    #[error("{0}")]
    Unloading(String),
}

/// What the caller tells the producer's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The producer.
    pub key: ProducerKey,
    /// Its name.
    pub name: String,
    /// Topic epoch to report (exclusive modes), if any.
    pub topic_epoch: Option<u64>,
}

/// The answer to [`Producers::add`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddOutcome {
    /// Connected now.
    Ready(Grant),
    /// Queued behind the exclusive holder (send `producer_ready=false`).
    Waiting,
}

#[derive(Debug, Clone)]
struct Connected {
    name: String,
    mode: AccessMode,
}

/// The producers of one topic.
#[derive(Debug, Clone)]
pub struct Producers {
    producers_max: usize,
    connected: BTreeMap<ProducerKey, Connected>,
    waiting: VecDeque<ProducerRequest>,
    exclusive_holder: Option<ProducerKey>,
    topic_epoch: u64,
}

impl Producers {
    /// An empty set that allows `producers_max` producers (connected plus waiting).
    pub fn new(producers_max: usize) -> Self {
        Self {
            producers_max: producers_max.max(1),
            connected: BTreeMap::new(),
            waiting: VecDeque::new(),
            exclusive_holder: None,
            topic_epoch: 0,
        }
    }

    /// Like [`Producers::new`], continuing from a stored topic epoch (the
    /// next exclusive grant gets `topic_epoch + 1`).
    pub fn with_epoch(producers_max: usize, topic_epoch: u64) -> Self {
        Self {
            topic_epoch,
            ..Self::new(producers_max)
        }
    }

    /// Producers connected now.
    pub fn len(&self) -> usize {
        self.connected.len()
    }

    /// No producer connected.
    pub fn is_empty(&self) -> bool {
        self.connected.is_empty()
    }

    /// Names and access modes of the connected producers, in key order.
    pub fn connected(&self) -> Vec<(String, AccessMode)> {
        self.connected
            .values()
            .map(|c| (c.name.clone(), c.mode))
            .collect()
    }

    /// Producers waiting for exclusivity.
    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// The current topic epoch.
    pub fn topic_epoch(&self) -> u64 {
        self.topic_epoch
    }

    /// Whether `key` is connected.
    pub fn contains(&self, key: ProducerKey) -> bool {
        self.connected.contains_key(&key)
    }

    /// A producer asks to join.
    pub fn add(&mut self, req: ProducerRequest) -> Result<AddOutcome, ProducerRefusal> {
        if self.connected.contains_key(&req.key) || self.waiting.iter().any(|w| w.key == req.key) {
            return Err(ProducerRefusal::Busy(format!(
                "producer id {} is already in use on this connection",
                req.key.1
            )));
        }
        if self.connected.values().any(|c| c.name == req.name)
            || self.waiting.iter().any(|w| w.name == req.name)
        {
            return Err(ProducerRefusal::Busy(format!(
                "producer with name '{}' is already connected to the topic",
                req.name
            )));
        }
        if self.connected.len() + self.waiting.len() >= self.producers_max {
            return Err(ProducerRefusal::Busy(format!(
                "topic reached the limit of {} producers",
                self.producers_max
            )));
        }
        if let Some(e) = req.topic_epoch
            && req.mode != AccessMode::Shared
            && e < self.topic_epoch
        {
            return Err(ProducerRefusal::Fenced(format!(
                "producer fenced: topic epoch {e} is older than the current {}",
                self.topic_epoch
            )));
        }
        match req.mode {
            AccessMode::Shared => {
                if self.exclusive_holder.is_some() {
                    return Err(ProducerRefusal::Busy(
                        "topic has an exclusive producer".into(),
                    ));
                }
                Ok(AddOutcome::Ready(self.connect(req, None)))
            }
            AccessMode::Exclusive | AccessMode::WaitForExclusive => {
                if self.connected.is_empty() && self.waiting.is_empty() {
                    self.topic_epoch += 1;
                    self.exclusive_holder = Some(req.key);
                    let epoch = self.topic_epoch;
                    return Ok(AddOutcome::Ready(self.connect(req, Some(epoch))));
                }
                if req.mode == AccessMode::Exclusive {
                    let why = if self.exclusive_holder.is_some() {
                        "topic has an exclusive producer"
                    } else {
                        "topic has connected producers; exclusive access refused"
                    };
                    return Err(ProducerRefusal::Busy(why.into()));
                }
                self.waiting.push_back(req);
                Ok(AddOutcome::Waiting)
            }
        }
    }

    fn connect(&mut self, req: ProducerRequest, topic_epoch: Option<u64>) -> Grant {
        self.connected.insert(
            req.key,
            Connected {
                name: req.name.clone(),
                mode: req.mode,
            },
        );
        Grant {
            key: req.key,
            name: req.name,
            topic_epoch,
        }
    }

    /// A producer leaves (closed, its connection gone, or it gave up
    /// waiting). Returns the waiting producer granted now, if any.
    pub fn remove(&mut self, key: ProducerKey) -> Option<Grant> {
        self.waiting.retain(|w| w.key != key);
        let removed = self.connected.remove(&key)?;
        if self.exclusive_holder == Some(key) {
            self.exclusive_holder = None;
        }
        let _ = removed.mode;
        if self.connected.is_empty()
            && let Some(next) = self.waiting.pop_front()
        {
            self.topic_epoch += 1;
            self.exclusive_holder = Some(next.key);
            let epoch = self.topic_epoch;
            return Some(self.connect(next, Some(epoch)));
        }
        None
    }

    /// Every producer (connected and waiting) of connection `conn`, e.g. to
    /// remove them when it closes.
    pub fn keys_of_connection(&self, conn: u64) -> Vec<ProducerKey> {
        self.connected
            .keys()
            .copied()
            .chain(self.waiting.iter().map(|w| w.key))
            .filter(|k| k.0 == conn)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reloaded_topic_continues_from_the_stored_epoch() {
        let mut p = Producers::with_epoch(10, 5);
        let mut stale = req(1, 1, "old", AccessMode::Exclusive);
        stale.topic_epoch = Some(4);
        assert!(matches!(p.add(stale), Err(ProducerRefusal::Fenced(_))));
        let mut current = req(1, 2, "cur", AccessMode::Exclusive);
        current.topic_epoch = Some(5);
        match p.add(current) {
            Ok(AddOutcome::Ready(g)) => assert_eq!(g.topic_epoch, Some(6)),
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    fn req(conn: u64, id: u64, name: &str, mode: AccessMode) -> ProducerRequest {
        ProducerRequest {
            key: (conn, id),
            name: name.into(),
            mode,
            topic_epoch: None,
        }
    }

    use AccessMode::*;

    /// (existing producers, new request, expected: Ok(true)=ready,
    /// Ok(false)=waiting, Err("busy"|"fenced"))
    #[test]
    fn access_mode_table() {
        type Case = (
            Vec<(&'static str, AccessMode)>,
            (&'static str, AccessMode),
            Result<bool, &'static str>,
        );
        let cases: Vec<Case> = vec![
            (vec![], ("a", Shared), Ok(true)),
            (vec![("a", Shared)], ("b", Shared), Ok(true)),
            (vec![("a", Shared)], ("a", Shared), Err("busy")),
            (vec![], ("a", Exclusive), Ok(true)),
            (vec![("a", Shared)], ("b", Exclusive), Err("busy")),
            (vec![("a", Exclusive)], ("b", Shared), Err("busy")),
            (vec![("a", Exclusive)], ("b", Exclusive), Err("busy")),
            (vec![], ("a", WaitForExclusive), Ok(true)),
            (vec![("a", Exclusive)], ("b", WaitForExclusive), Ok(false)),
            (vec![("a", Shared)], ("b", WaitForExclusive), Ok(false)),
            (vec![("a", WaitForExclusive)], ("b", Shared), Err("busy")),
        ];
        for (i, (existing, (name, mode), want)) in cases.into_iter().enumerate() {
            let mut p = Producers::new(100);
            for (j, (n, m)) in existing.iter().enumerate() {
                assert!(
                    matches!(p.add(req(1, j as u64, n, *m)), Ok(AddOutcome::Ready(_))),
                    "case {i} setup"
                );
            }
            let got = match p.add(req(2, 0, name, mode)) {
                Ok(AddOutcome::Ready(_)) => Ok(true),
                Ok(AddOutcome::Waiting) => Ok(false),
                Err(ProducerRefusal::Busy(_)) => Err("busy"),
                Err(ProducerRefusal::Fenced(_)) => Err("fenced"),
                Err(ProducerRefusal::Unloading(_)) => Err("unloading"),
            };
            assert_eq!(got, want, "case {i}: {existing:?} + {name}/{mode:?}");
        }
    }

    #[test]
    fn waiting_producer_is_granted_when_the_holder_leaves() {
        let mut p = Producers::new(10);
        let AddOutcome::Ready(g) = p.add(req(1, 1, "a", Exclusive)).unwrap() else {
            panic!()
        };
        assert_eq!(g.topic_epoch, Some(1));
        assert_eq!(
            p.add(req(2, 1, "b", WaitForExclusive)).unwrap(),
            AddOutcome::Waiting
        );
        assert_eq!(
            p.add(req(3, 1, "c", WaitForExclusive)).unwrap(),
            AddOutcome::Waiting
        );
        let g = p.remove((1, 1)).unwrap();
        assert_eq!(g.key, (2, 1));
        assert_eq!(g.topic_epoch, Some(2));
        // A waiter that gives up is dropped from the queue.
        assert_eq!(p.remove((3, 1)), None);
        assert_eq!(p.waiting_len(), 0);
        assert_eq!(p.remove((2, 1)), None);
        assert!(p.is_empty());
    }

    #[test]
    fn an_old_epoch_is_fenced() {
        let mut p = Producers::new(10);
        p.add(req(1, 1, "a", Exclusive)).unwrap();
        p.remove((1, 1));
        p.add(req(1, 2, "b", Exclusive)).unwrap();
        p.remove((1, 2));
        assert_eq!(p.topic_epoch(), 2);
        let mut r = req(1, 3, "a", Exclusive);
        r.topic_epoch = Some(1);
        assert!(matches!(p.add(r), Err(ProducerRefusal::Fenced(_))));
        let mut r = req(1, 3, "a", Exclusive);
        r.topic_epoch = Some(2);
        assert!(matches!(p.add(r), Ok(AddOutcome::Ready(_))));
    }

    #[test]
    fn producers_are_bounded_and_ids_unique() {
        let mut p = Producers::new(2);
        p.add(req(1, 1, "a", Shared)).unwrap();
        assert!(matches!(
            p.add(req(1, 1, "z", Shared)),
            Err(ProducerRefusal::Busy(_))
        ));
        p.add(req(1, 2, "b", Shared)).unwrap();
        let e = p.add(req(1, 3, "c", Shared)).unwrap_err();
        assert!(e.to_string().contains("limit of 2"), "{e}");
        assert_eq!(p.keys_of_connection(1).len(), 2);
        assert_eq!(p.remove((9, 9)), None);
    }
}
