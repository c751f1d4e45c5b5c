//! The simulated world: event queue, network, metadata store, drivers, checker.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use bytes::Bytes;

use super::Rng;
use super::bookie::{Deferred, SimBookie};
use crate::client::metadata::{
    MetadataOp, NewLedger, Update, UpdateError, new_ledger, validate, write_set_bookies,
};
use crate::client::quorum::QuorumSpec;
use crate::client::reader::{EntryRead, ReadStep, Reader};
use crate::client::recovery::{
    FenceAnswer, Recovered, Recovery, RecoveryAction, RecoveryConfig, RecoveryError,
};
use crate::client::writer::{AddError, Writer, WriterAction, WriterConfig};
use crate::client::{BookieStatus, EnsembleChangeRequest, EntryId, Replacement};
use crate::entry::Entry;
use crate::proto::metadata::{LedgerMetadata, LedgerStatus};

pub(crate) const LEDGER_ID: u64 = 42;
const TICK_MS: u64 = 10;
const READER_ROUND_MS: u64 = 40;
const RECOVERY_RETRY_MS: u64 = 60;
const RECOVERY_RESTARTS_MAX: u32 = 40;
const GRACE_MS: u64 = 600;

/// A network address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Addr {
    Bookie(usize),
    Writer,
    Recovery(usize),
    Reader(usize),
    Meta,
}

/// Messages on the simulated network.
#[derive(Debug, Clone)]
pub(crate) enum Msg {
    Add {
        entry_id: EntryId,
        body: Bytes,
        recovery: bool,
        key: Bytes,
    },
    Read {
        entry_id: EntryId,
        fence: bool,
        key: Bytes,
    },
    Fence {
        key: Bytes,
    },
    WriteLac {
        body: Bytes,
        key: Bytes,
    },
    ReadLac,
    AddResp {
        entry_id: EntryId,
        status: BookieStatus,
    },
    ReadResp {
        entry_id: EntryId,
        status: BookieStatus,
        body: Option<Bytes>,
    },
    FenceResp(FenceAnswer),
    ReadLacResp {
        last_entry: Option<Bytes>,
        explicit_lac: Option<Bytes>,
    },
    MetaRead {
        for_cas: bool,
    },
    MetaCas {
        expected: u64,
        md: LedgerMetadata,
    },
    MetaResp {
        for_cas: bool,
        ok: bool,
        md: LedgerMetadata,
        version: u64,
    },
}

/// What a scripted rule does to a matching message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RuleAction {
    Drop,
    DelayMs(u64),
}

/// Whether a rule applies to a message (from, to, message).
pub(crate) type Matcher = Box<dyn Fn(Addr, Addr, &Msg) -> bool>;

/// A scripted network rule: the first one matching decides.
pub(crate) struct Rule {
    pub(crate) matches: Matcher,
    pub(crate) action: RuleAction,
    /// The rule applies only before this time.
    pub(crate) until_ms: u64,
}

/// One run's parameters.
#[derive(Debug, Clone)]
pub(crate) struct SimConfig {
    pub(crate) seed: u64,
    pub(crate) ensemble: usize,
    pub(crate) write_quorum: usize,
    pub(crate) ack_quorum: usize,
    pub(crate) bookies: usize,
    pub(crate) entries: usize,
    pub(crate) latency_ms: (u64, u64),
    /// Per-mille drop probability of bookie traffic until `heal_ms`.
    pub(crate) drop_per_mille: u64,
    pub(crate) heal_ms: u64,
    /// (time, bookie, down for).
    pub(crate) crashes: Vec<(u64, usize, u64)>,
    pub(crate) writer_dies_ms: Option<u64>,
    /// Fences (and fencing reads) to this bookie are delayed by this many ms
    /// (`None`: dropped) until `heal_ms`: a slow or lost fence.
    pub(crate) slow_fence: Option<(usize, Option<u64>)>,
    /// The writer's adds to this bookie are delayed by this many ms until
    /// `heal_ms` (a slow link: entries in flight when recovery starts).
    pub(crate) slow_adds: Option<(usize, u64)>,
    pub(crate) writer_closes: bool,
    pub(crate) add_gap_ms: u64,
    pub(crate) recoveries: Vec<u64>,
    pub(crate) readers: usize,
    pub(crate) fence_reads: bool,
    pub(crate) add_timeout_ms: u64,
    pub(crate) read_timeout_ms: u64,
    pub(crate) end_ms: u64,
}

impl SimConfig {
    /// A random run from one seed.
    pub(crate) fn random(seed: u64) -> SimConfig {
        let mut r = Rng::new(seed);
        const SHAPES: [(usize, usize, usize); 7] = [
            (3, 3, 2),
            (3, 2, 2),
            (4, 3, 2),
            (3, 3, 3),
            (5, 3, 2),
            (2, 2, 1),
            (3, 3, 1),
        ];
        let (e, qw, qa) = SHAPES[r.range(0, SHAPES.len() as u64 - 1) as usize];
        let bookies = e + r.range(0, 2) as usize;
        let heal_ms = 800;
        let mut crashes = Vec::new();
        for _ in 0..r.range(0, 2) {
            crashes.push((
                r.range(0, 400),
                r.range(0, bookies as u64 - 1) as usize,
                r.range(5, 300),
            ));
        }
        let writer_dies_ms = if r.chance(600) {
            Some(r.range(5, 300))
        } else {
            None
        };
        let mut recoveries = vec![r.range(10, 400)];
        if r.chance(300) {
            recoveries.push(recoveries[0] + r.range(0, 60));
        }
        let lat_max = r.range(1, 15);
        let slow_fence = if r.chance(350) {
            let b = r.range(0, e as u64 - 1) as usize;
            Some((
                b,
                if r.chance(500) {
                    None
                } else {
                    Some(r.range(20, 400))
                },
            ))
        } else {
            None
        };
        let slow_adds = match slow_fence {
            Some((b, _)) if r.chance(500) => Some((b, r.range(20, 400))),
            _ if r.chance(150) => Some((r.range(0, e as u64 - 1) as usize, r.range(20, 400))),
            _ => None,
        };
        SimConfig {
            seed,
            ensemble: e,
            write_quorum: qw,
            ack_quorum: qa,
            bookies,
            entries: r.range(1, 12) as usize,
            latency_ms: (1, lat_max),
            drop_per_mille: if r.chance(400) { r.range(5, 60) } else { 0 },
            heal_ms,
            crashes,
            writer_dies_ms,
            slow_fence,
            slow_adds,
            writer_closes: r.chance(300),
            add_gap_ms: r.range(0, 15),
            recoveries,
            readers: r.range(0, 2) as usize,
            fence_reads: true,
            // Timeouts above the worst round trip (2 × latency + sync), as a
            // real driver configures them; shorter ones only measure churn.
            add_timeout_ms: r.range(2 * lat_max + 5, 100),
            read_timeout_ms: r.range(2 * lat_max + 5, 100),
            end_ms: 20_000,
        }
    }
}

#[derive(Debug)]
enum Event {
    Deliver { from: Addr, to: Addr, msg: Msg },
    Sync { bookie: usize, incarnation: u64 },
    Crash { bookie: usize, down_ms: u64 },
    Restart { bookie: usize },
    Tick(Addr),
    WriterAdd,
    WriterDies,
    RecoveryStart(usize),
    ReaderRound(usize),
    ReaderTimer { reader: usize, seq: u64 },
}

/// A client's read-modify-CAS loop over the simulated store.
#[derive(Debug)]
struct CasLoop {
    op: MetadataOp,
    proposed: Option<LedgerMetadata>,
}

struct WriterClient {
    w: Writer,
    dead: bool,
    stopped: bool,
    next_payload: usize,
    cas: Option<CasLoop>,
}

struct RecoveryClient {
    r: Option<Recovery>,
    cas: Option<CasLoop>,
    running: bool,
    done: bool,
    restarts: u32,
}

struct ReaderClient {
    reader: Option<Reader>,
    next: EntryId,
    inflight: Option<(EntryRead, u64, u32, bool)>,
    seq: u64,
}

/// What happened, for the checker.
#[derive(Debug, Default)]
pub(crate) struct History {
    pub(crate) payloads: Vec<Bytes>,
    /// (entry, time) in completion order.
    pub(crate) acked: Vec<(EntryId, u64)>,
    pub(crate) writer_failed_at: Option<u64>,
    pub(crate) writer_closed: Option<(EntryId, u64)>,
    pub(crate) acks_after_failure: Vec<EntryId>,
    pub(crate) recoveries: Vec<Result<Recovered, RecoveryError>>,
    /// (reader, entry, payload, time, ledger was open to that reader).
    pub(crate) reads: Vec<(usize, EntryId, Bytes, u64, bool)>,
    pub(crate) under_replicated: usize,
    pub(crate) ensemble_changes: usize,
    /// Entries recovery asked to read (for the clamp assertion).
    pub(crate) recovery_reads: Vec<EntryId>,
}

/// The simulated world of one run.
pub(crate) struct World {
    pub(crate) cfg: SimConfig,
    rng: Rng,
    pub(crate) now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: HashMap<u64, Event>,
    pub(crate) bookies: Vec<SimBookie>,
    pub(crate) meta: (LedgerMetadata, u64),
    writer: Option<WriterClient>,
    recoveries: Vec<RecoveryClient>,
    readers: Vec<ReaderClient>,
    pub(crate) rules: Vec<Rule>,
    pub(crate) history: History,
    pub(crate) events_run: u64,
    /// Print every delivered message (debugging one seed).
    pub(crate) trace: bool,
}

fn short(m: &Msg) -> String {
    match m {
        Msg::Add {
            entry_id, recovery, ..
        } => format!("Add e{entry_id} recovery={recovery}"),
        Msg::Read {
            entry_id, fence, ..
        } => format!("Read e{entry_id} fence={fence}"),
        Msg::MetaCas { expected, md } => {
            format!(
                "Cas v{expected} status={} segs={}",
                md.status,
                md.segments.len()
            )
        }
        Msg::MetaResp {
            ok, md, version, ..
        } => format!(
            "MetaResp ok={ok} v{version} status={} last={} segs={:?}",
            md.status,
            md.last_entry_id,
            md.segments
                .iter()
                .map(|s| (s.first_entry_id, s.ensemble.clone()))
                .collect::<Vec<_>>()
        ),
        Msg::ReadResp {
            entry_id, status, ..
        } => format!("ReadResp e{entry_id} {status:?}"),
        other => format!("{other:?}").chars().take(80).collect(),
    }
}

fn bookie_name(i: usize) -> String {
    format!("b{i}")
}

fn bookie_index(id: &str) -> Option<usize> {
    id.strip_prefix('b').and_then(|n| n.parse().ok())
}

impl World {
    /// A world with a fresh ledger on bookies 0..E and a writer for it.
    pub(crate) fn new(cfg: SimConfig) -> World {
        let mut w = World::bare(cfg.clone());
        let md = new_ledger(NewLedger {
            ledger_id: LEDGER_ID,
            quorum: QuorumSpec::new(cfg.ensemble, cfg.write_quorum, cfg.ack_quorum)
                .expect("valid shape"),
            ensemble: (0..cfg.ensemble).map(bookie_name).collect(),
            password: Bytes::from_static(b"sim"),
            custom: Default::default(),
            ctime_ms: 0,
        })
        .expect("valid ledger");
        w.meta = (md.clone(), 1);
        let writer = Writer::new(
            md,
            WriterConfig {
                outstanding_adds_max: 8,
                add_timeout_ms: cfg.add_timeout_ms,
                explicit_lac_interval_ms: 30,
                ..WriterConfig::default()
            },
        )
        .expect("writer");
        w.writer = Some(WriterClient {
            w: writer,
            dead: false,
            stopped: false,
            next_payload: 0,
            cas: None,
        });
        let mut prng = Rng::new(cfg.seed.wrapping_mul(31).wrapping_add(7));
        w.history.payloads = (0..cfg.entries)
            .map(|i| {
                let n = prng.range(0, 24) as usize;
                let mut p = format!("e{i}:").into_bytes();
                p.extend((0..n).map(|_| prng.range(b'a' as u64, b'z' as u64) as u8));
                Bytes::from(p)
            })
            .collect();
        w.schedule(0, Event::WriterAdd);
        w.schedule(0, Event::Tick(Addr::Writer));
        if let Some(t) = cfg.writer_dies_ms {
            w.schedule(t, Event::WriterDies);
        }
        w.schedule_common();
        w
    }

    /// A world with no writer and empty bookies; the test builds the state.
    pub(crate) fn bare(cfg: SimConfig) -> World {
        let rng = Rng::new(cfg.seed);
        let bookies = (0..cfg.bookies)
            .map(|i| SimBookie::new(bookie_name(i)))
            .collect();
        World {
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            bookies,
            meta: (LedgerMetadata::default(), 0),
            writer: None,
            recoveries: Vec::new(),
            readers: Vec::new(),
            rules: Vec::new(),
            history: History::default(),
            events_run: 0,
            trace: std::env::var("CMS_SIM_TRACE").is_ok(),
            cfg,
        }
    }

    /// Schedules crashes, recoveries and readers from the config.
    pub(crate) fn schedule_common(&mut self) {
        if let Some((b, delay)) = self.cfg.slow_adds {
            self.rules.push(Rule {
                matches: Box::new(move |from, to, m| {
                    from == Addr::Writer && to == Addr::Bookie(b) && matches!(m, Msg::Add { .. })
                }),
                action: RuleAction::DelayMs(delay),
                until_ms: self.cfg.heal_ms,
            });
        }
        if let Some((b, delay)) = self.cfg.slow_fence {
            self.rules.push(Rule {
                matches: Box::new(move |_, to, m| {
                    to == Addr::Bookie(b)
                        && matches!(m, Msg::Fence { .. } | Msg::Read { fence: true, .. })
                }),
                action: delay.map_or(RuleAction::Drop, RuleAction::DelayMs),
                until_ms: self.cfg.heal_ms,
            });
        }
        for (t, b, down) in self.cfg.crashes.clone() {
            self.schedule(
                t,
                Event::Crash {
                    bookie: b,
                    down_ms: down,
                },
            );
        }
        for (i, t) in self.cfg.recoveries.clone().into_iter().enumerate() {
            self.recoveries.push(RecoveryClient {
                r: None,
                cas: None,
                running: false,
                done: false,
                restarts: 0,
            });
            self.schedule(t, Event::RecoveryStart(i));
            self.schedule(t, Event::Tick(Addr::Recovery(i)));
        }
        for i in 0..self.cfg.readers {
            self.readers.push(ReaderClient {
                reader: None,
                next: 0,
                inflight: None,
                seq: 0,
            });
            self.schedule(5 + 7 * i as u64, Event::ReaderRound(i));
        }
    }

    fn schedule(&mut self, at: u64, ev: Event) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq)));
        self.events.insert(self.seq, ev);
    }

    fn send(&mut self, from: Addr, to: Addr, msg: Msg) {
        let mut delay = self.rng.range(self.cfg.latency_ms.0, self.cfg.latency_ms.1);
        for rule in &self.rules {
            if self.now < rule.until_ms && (rule.matches)(from, to, &msg) {
                match rule.action {
                    RuleAction::Drop => {
                        if self.trace {
                            eprintln!(
                                "{:>6} {from:?} -> {to:?}: {} RULE-DROPPED",
                                self.now,
                                short(&msg)
                            );
                        }
                        return;
                    }
                    RuleAction::DelayMs(d) => delay += d,
                }
                break;
            }
        }
        let bookie_traffic = matches!(to, Addr::Bookie(_)) || matches!(from, Addr::Bookie(_));
        if bookie_traffic
            && self.now < self.cfg.heal_ms
            && self.cfg.drop_per_mille > 0
            && self.rng.chance(self.cfg.drop_per_mille)
        {
            if self.trace {
                eprintln!(
                    "{:>6} {from:?} -> {to:?}: {} DROPPED",
                    self.now,
                    short(&msg)
                );
            }
            return;
        }
        self.schedule(self.now + delay, Event::Deliver { from, to, msg });
    }

    /// Runs to the end; returns the checker's verdict.
    pub(crate) fn run(&mut self) -> Result<(), String> {
        let mut quiet_since: Option<u64> = None;
        while let Some(Reverse((at, id))) = self.queue.pop() {
            if at > self.cfg.end_ms {
                break;
            }
            self.now = at;
            let Some(ev) = self.events.remove(&id) else {
                continue;
            };
            self.events_run += 1;
            self.step(ev);
            let recovered = !self.recoveries.is_empty()
                && self.recoveries.iter().all(|r| r.done)
                && self.history.recoveries.iter().any(|r| r.is_ok());
            if recovered {
                let since = *quiet_since.get_or_insert(self.now);
                if self.now >= since + GRACE_MS && self.now >= self.cfg.heal_ms {
                    break;
                }
            }
        }
        self.check()
    }

    fn step(&mut self, ev: Event) {
        match ev {
            Event::Deliver { from, to, msg } => {
                if self.trace {
                    eprintln!("{:>6} {from:?} -> {to:?}: {}", self.now, short(&msg));
                }
                self.deliver(from, to, msg)
            }
            Event::Sync {
                bookie,
                incarnation,
            } => {
                let b = &mut self.bookies[bookie];
                if !b.up || b.incarnation != incarnation {
                    return;
                }
                let released = b.sync();
                for (client, d) in released {
                    self.answer_deferred(bookie, client, d);
                }
            }
            Event::WriterDies => {
                if let Some(w) = self.writer.as_mut() {
                    w.dead = true;
                }
            }
            Event::Crash { bookie, down_ms } => {
                if self.bookies[bookie].up {
                    self.bookies[bookie].crash();
                    let back = (self.now + down_ms).min(self.cfg.heal_ms.max(self.now + 1));
                    self.schedule(back, Event::Restart { bookie });
                }
            }
            Event::Restart { bookie } => self.bookies[bookie].up = true,
            Event::Tick(addr) => self.tick(addr),
            Event::WriterAdd => self.writer_add(),
            Event::RecoveryStart(i) => {
                if !self.recoveries[i].done && !self.recoveries[i].running {
                    self.recoveries[i].running = true;
                    self.send(
                        Addr::Recovery(i),
                        Addr::Meta,
                        Msg::MetaRead { for_cas: false },
                    );
                }
            }
            Event::ReaderRound(i) => self.reader_round(i),
            Event::ReaderTimer { reader, seq } => self.reader_timer(reader, seq),
        }
    }

    fn tick(&mut self, addr: Addr) {
        let now = self.now;
        let mut again = false;
        match addr {
            Addr::Writer => {
                if let Some(w) = self.writer.as_mut()
                    && !w.dead
                {
                    w.w.tick(now);
                    again = !w.stopped;
                }
                self.drain_writer();
            }
            Addr::Recovery(i) => {
                if let Some(r) = self.recoveries[i].r.as_mut() {
                    r.tick(now);
                }
                again = !self.recoveries[i].done;
                self.drain_recovery(i);
            }
            _ => {}
        }
        if again && now < self.cfg.end_ms {
            self.schedule(now + TICK_MS, Event::Tick(addr));
        }
    }

    // ---------------------------------------------------------------- bookies

    fn deliver(&mut self, from: Addr, to: Addr, msg: Msg) {
        // Like a real driver, pass the time before an input, so requests the
        // core sends in response are stamped with the right time.
        let now = self.now;
        match to {
            Addr::Writer => {
                if let Some(w) = self.writer.as_mut()
                    && !w.dead
                {
                    w.w.tick(now);
                }
            }
            Addr::Recovery(i) => {
                if let Some(r) = self.recoveries[i].r.as_mut() {
                    r.tick(now);
                }
            }
            _ => {}
        }
        match to {
            Addr::Bookie(b) => self.bookie_request(b, from, msg),
            Addr::Meta => self.meta_request(from, msg),
            Addr::Writer => self.writer_message(from, msg),
            Addr::Recovery(i) => self.recovery_message(i, from, msg),
            Addr::Reader(i) => self.reader_message(i, from, msg),
        }
    }

    fn client_index(a: Addr) -> usize {
        match a {
            Addr::Writer => 0,
            Addr::Recovery(i) => 1000 + i,
            Addr::Reader(i) => 2000 + i,
            _ => usize::MAX,
        }
    }

    fn client_addr(i: usize) -> Addr {
        match i {
            0 => Addr::Writer,
            i if (1000..2000).contains(&i) => Addr::Recovery(i - 1000),
            i => Addr::Reader(i - 2000),
        }
    }

    fn defer(&mut self, b: usize, from: Addr, d: Deferred) {
        let bk = &mut self.bookies[b];
        bk.waiting.push((Self::client_index(from), d));
        if !bk.sync_scheduled {
            bk.sync_scheduled = true;
            let inc = bk.incarnation;
            let delay = self.rng.range(0, 3);
            self.schedule(
                self.now + delay,
                Event::Sync {
                    bookie: b,
                    incarnation: inc,
                },
            );
        }
    }

    fn bookie_request(&mut self, b: usize, from: Addr, msg: Msg) {
        if !self.bookies[b].up {
            return;
        }
        let me = Addr::Bookie(b);
        match msg {
            Msg::Add {
                entry_id,
                body,
                recovery,
                key,
            } => match self.bookies[b].add(entry_id, body, recovery, &key) {
                Ok(()) => self.defer(b, from, Deferred::AddOk { entry_id }),
                Err(status) => self.send(me, from, Msg::AddResp { entry_id, status }),
            },
            Msg::Read {
                entry_id,
                fence,
                key,
            } => {
                if fence {
                    match self.bookies[b].fence(&key) {
                        Ok(()) => self.defer(b, from, Deferred::ReadAfterFence { entry_id }),
                        Err(status) => self.send(
                            me,
                            from,
                            Msg::ReadResp {
                                entry_id,
                                status,
                                body: None,
                            },
                        ),
                    }
                } else {
                    let (status, body) = self.bookies[b].read(entry_id);
                    self.send(
                        me,
                        from,
                        Msg::ReadResp {
                            entry_id,
                            status,
                            body,
                        },
                    );
                }
            }
            Msg::Fence { key } => match self.bookies[b].fence(&key) {
                Ok(()) => self.defer(b, from, Deferred::FenceDone),
                Err(status) => self.send(
                    me,
                    from,
                    Msg::FenceResp(FenceAnswer {
                        status,
                        last_entry: None,
                        explicit_lac: None,
                    }),
                ),
            },
            Msg::WriteLac { body, key } => {
                let stored = self.bookies[b].write_lac(body, &key);
                if stored.is_ok() {
                    self.defer(b, from, Deferred::WriteLacOk);
                }
            }
            Msg::ReadLac => {
                let bk = &self.bookies[b];
                let m = Msg::ReadLacResp {
                    last_entry: bk.last_entry(),
                    explicit_lac: bk.visible.explicit_lac.clone(),
                };
                self.send(me, from, m);
            }
            _ => {}
        }
    }

    fn answer_deferred(&mut self, b: usize, client: usize, d: Deferred) {
        let me = Addr::Bookie(b);
        let to = Self::client_addr(client);
        let msg = match d {
            Deferred::AddOk { entry_id } => Msg::AddResp {
                entry_id,
                status: BookieStatus::Ok,
            },
            Deferred::ReadAfterFence { entry_id } => {
                let (status, body) = self.bookies[b].read(entry_id);
                Msg::ReadResp {
                    entry_id,
                    status,
                    body,
                }
            }
            Deferred::FenceDone => {
                let bk = &self.bookies[b];
                Msg::FenceResp(FenceAnswer {
                    status: BookieStatus::Ok,
                    last_entry: bk.last_entry(),
                    explicit_lac: bk.visible.explicit_lac.clone(),
                })
            }
            Deferred::WriteLacOk => return,
        };
        self.send(me, to, msg);
    }

    // --------------------------------------------------------------- metadata

    fn meta_request(&mut self, from: Addr, msg: Msg) {
        let reply = match msg {
            Msg::MetaRead { for_cas } => Msg::MetaResp {
                for_cas,
                ok: true,
                md: self.meta.0.clone(),
                version: self.meta.1,
            },
            Msg::MetaCas { expected, md } => {
                let ok = expected == self.meta.1;
                if ok {
                    self.meta = (md, self.meta.1 + 1);
                }
                Msg::MetaResp {
                    for_cas: true,
                    ok,
                    md: self.meta.0.clone(),
                    version: self.meta.1,
                }
            }
            _ => return,
        };
        self.send(Addr::Meta, from, reply);
    }

    /// Advances a CAS loop with a store answer; `Some` when it is over.
    fn cas_step(
        &mut self,
        who: Addr,
        cas: &mut CasLoop,
        ok: bool,
        md: LedgerMetadata,
        version: u64,
    ) -> Option<Result<LedgerMetadata, UpdateError>> {
        if ok && let Some(p) = cas.proposed.take() {
            return Some(Ok(p));
        }
        match cas.op.apply(&md) {
            Ok(Update::Write(new)) => {
                cas.proposed = Some(new.clone());
                self.send(
                    who,
                    Addr::Meta,
                    Msg::MetaCas {
                        expected: version,
                        md: new,
                    },
                );
                None
            }
            Ok(Update::Unchanged) => Some(Ok(md)),
            Err(e) => Some(Err(e)),
        }
    }

    fn start_cas(&mut self, who: Addr, op: MetadataOp) -> CasLoop {
        self.send(who, Addr::Meta, Msg::MetaRead { for_cas: true });
        CasLoop { op, proposed: None }
    }

    fn place(&mut self, req: &EnsembleChangeRequest) -> Vec<Replacement> {
        let mut free: Vec<String> = self
            .bookies
            .iter()
            .filter(|b| b.up && !req.ensemble.contains(&b.id))
            .map(|b| b.id.clone())
            .collect();
        let mut out = Vec::new();
        for old in &req.failed {
            if free.is_empty() {
                break;
            }
            let i = self.rng.range(0, free.len() as u64 - 1) as usize;
            out.push(Replacement {
                old: old.clone(),
                new: free.remove(i),
            });
        }
        out
    }

    // ----------------------------------------------------------------- writer

    fn writer_add(&mut self) {
        let n = self.history.payloads.len();
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        if w.dead || w.stopped {
            return;
        }
        w.w.tick(self.now);
        if w.next_payload < n {
            let p = self.history.payloads[w.next_payload].clone();
            match w.w.add(&p) {
                Ok(id) => {
                    debug_assert_eq!(id as usize, w.next_payload);
                    w.next_payload += 1;
                }
                Err(AddError::Backpressure { .. }) => {}
                Err(_) => {
                    w.stopped = true;
                }
            }
        }
        let (more, close) = (w.next_payload < n && !w.stopped, w.next_payload >= n);
        if close && self.cfg.writer_closes {
            w.w.close();
        }
        self.drain_writer();
        if more {
            let gap = self.rng.range(0, self.cfg.add_gap_ms);
            self.schedule(self.now + gap.max(1), Event::WriterAdd);
        }
    }

    fn drain_writer(&mut self) {
        loop {
            let Some(w) = self.writer.as_mut() else {
                return;
            };
            if w.dead {
                return;
            }
            let Some(a) = w.w.poll_action() else {
                return;
            };
            let key = w.w.master_key().clone();
            match a {
                WriterAction::SendAdd {
                    bookie,
                    entry_id,
                    body,
                } => {
                    if let Some(b) = bookie_index(&bookie) {
                        self.send(
                            Addr::Writer,
                            Addr::Bookie(b),
                            Msg::Add {
                                entry_id,
                                body,
                                recovery: false,
                                key,
                            },
                        );
                    }
                }
                WriterAction::SendWriteLac { bookie, body, .. } => {
                    if let Some(b) = bookie_index(&bookie) {
                        self.send(Addr::Writer, Addr::Bookie(b), Msg::WriteLac { body, key });
                    }
                }
                WriterAction::Completed { entry_id, .. } => {
                    if self.history.writer_failed_at.is_some() {
                        self.history.acks_after_failure.push(entry_id);
                    }
                    self.history.acked.push((entry_id, self.now));
                }
                WriterAction::ChooseReplacements(req) => {
                    let reps = self.place(&req);
                    if let Some(w) = self.writer.as_mut() {
                        w.w.replacements_chosen(reps);
                    }
                }
                WriterAction::UpdateMetadata(op) => {
                    if !matches!(op, MetadataOp::Close { .. }) {
                        self.history.ensemble_changes += 1;
                    }
                    let cas = self.start_cas(Addr::Writer, op);
                    if let Some(w) = self.writer.as_mut() {
                        w.cas = Some(cas);
                    }
                }
                WriterAction::UnderReplicated { .. } => self.history.under_replicated += 1,
                WriterAction::Closed {
                    last_entry_id,
                    length,
                } => {
                    self.history.writer_closed = Some((last_entry_id, length));
                    if let Some(w) = self.writer.as_mut() {
                        w.stopped = true;
                    }
                }
                WriterAction::Failed { .. } => {
                    self.history.writer_failed_at = Some(self.now);
                    if let Some(w) = self.writer.as_mut() {
                        w.stopped = true;
                    }
                }
            }
        }
    }

    fn writer_message(&mut self, from: Addr, msg: Msg) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        if w.dead {
            return;
        }
        match (from, msg) {
            (Addr::Bookie(b), Msg::AddResp { entry_id, status }) => {
                w.w.add_response(&bookie_name(b), entry_id, status);
            }
            (
                Addr::Meta,
                Msg::MetaResp {
                    ok, md, version, ..
                },
            ) => {
                let Some(mut cas) = w.cas.take() else {
                    return;
                };
                match self.cas_step(Addr::Writer, &mut cas, ok, md, version) {
                    Some(result) => {
                        if let Some(w) = self.writer.as_mut() {
                            w.w.metadata_result(result);
                        }
                    }
                    None => {
                        if let Some(w) = self.writer.as_mut() {
                            w.cas = Some(cas);
                        }
                    }
                }
            }
            _ => {}
        }
        self.drain_writer();
    }

    // --------------------------------------------------------------- recovery

    fn drain_recovery(&mut self, i: usize) {
        loop {
            let Some(r) = self.recoveries[i].r.as_mut() else {
                return;
            };
            let Some(a) = r.poll_action() else {
                return;
            };
            let key = r.master_key().clone();
            let me = Addr::Recovery(i);
            match a {
                RecoveryAction::UpdateMetadata(op) => {
                    let cas = self.start_cas(me, op);
                    self.recoveries[i].cas = Some(cas);
                }
                RecoveryAction::SendFence { bookie } => {
                    if let Some(b) = bookie_index(&bookie) {
                        self.send(me, Addr::Bookie(b), Msg::Fence { key });
                    }
                }
                RecoveryAction::SendRead {
                    bookie,
                    entry_id,
                    fence,
                } => {
                    self.history.recovery_reads.push(entry_id);
                    if let Some(b) = bookie_index(&bookie) {
                        self.send(
                            me,
                            Addr::Bookie(b),
                            Msg::Read {
                                entry_id,
                                fence,
                                key,
                            },
                        );
                    }
                }
                RecoveryAction::SendAdd {
                    bookie,
                    entry_id,
                    body,
                } => {
                    if let Some(b) = bookie_index(&bookie) {
                        self.send(
                            me,
                            Addr::Bookie(b),
                            Msg::Add {
                                entry_id,
                                body,
                                recovery: true,
                                key,
                            },
                        );
                    }
                }
                RecoveryAction::ChooseReplacements(req) => {
                    let reps = self.place(&req);
                    if let Some(r) = self.recoveries[i].r.as_mut() {
                        r.replacements_chosen(reps);
                    }
                }
                RecoveryAction::Finished(result) => {
                    if self.trace {
                        eprintln!("{:>6} recovery {i} finished: {result:?}", self.now);
                    }
                    let ok = result.is_ok();
                    self.history.recoveries.push(result);
                    let rc = &mut self.recoveries[i];
                    rc.running = false;
                    rc.r = None;
                    rc.cas = None;
                    if ok || rc.restarts >= RECOVERY_RESTARTS_MAX {
                        rc.done = true;
                    } else {
                        rc.restarts += 1;
                        self.schedule(self.now + RECOVERY_RETRY_MS, Event::RecoveryStart(i));
                    }
                    return;
                }
            }
        }
    }

    fn recovery_message(&mut self, i: usize, from: Addr, msg: Msg) {
        if !self.recoveries[i].running {
            return;
        }
        match (from, msg) {
            (
                Addr::Meta,
                Msg::MetaResp {
                    for_cas: false, md, ..
                },
            ) if self.recoveries[i].r.is_none() => {
                match Recovery::new(
                    md,
                    RecoveryConfig {
                        read_timeout_ms: self.cfg.read_timeout_ms,
                        attempts_max: 4,
                        add_timeout_ms: self.cfg.add_timeout_ms,
                    },
                ) {
                    Ok(mut r) => {
                        if !self.cfg.fence_reads {
                            r.disable_read_fence_for_test();
                        }
                        r.tick(self.now);
                        r.start();
                        self.recoveries[i].r = Some(r);
                    }
                    Err(e) => {
                        self.history.recoveries.push(Err(e));
                        self.recoveries[i].done = true;
                    }
                }
            }
            (
                Addr::Meta,
                Msg::MetaResp {
                    for_cas: true,
                    ok,
                    md,
                    version,
                },
            ) => {
                let Some(mut cas) = self.recoveries[i].cas.take() else {
                    return;
                };
                match self.cas_step(Addr::Recovery(i), &mut cas, ok, md, version) {
                    Some(result) => {
                        if let Some(r) = self.recoveries[i].r.as_mut() {
                            r.metadata_result(result);
                        }
                    }
                    None => self.recoveries[i].cas = Some(cas),
                }
            }
            (Addr::Bookie(b), Msg::FenceResp(answer)) => {
                if let Some(r) = self.recoveries[i].r.as_mut() {
                    r.fence_response(&bookie_name(b), answer);
                }
            }
            (
                Addr::Bookie(b),
                Msg::ReadResp {
                    entry_id,
                    status,
                    body,
                },
            ) => {
                if let Some(r) = self.recoveries[i].r.as_mut() {
                    r.read_response(&bookie_name(b), entry_id, status, body);
                }
            }
            (Addr::Bookie(b), Msg::AddResp { entry_id, status }) => {
                if let Some(r) = self.recoveries[i].r.as_mut() {
                    r.add_response(&bookie_name(b), entry_id, status);
                }
            }
            _ => {}
        }
        self.drain_recovery(i);
    }

    // ---------------------------------------------------------------- readers

    fn reader_round(&mut self, i: usize) {
        self.send(
            Addr::Reader(i),
            Addr::Meta,
            Msg::MetaRead { for_cas: false },
        );
        if self.now < self.cfg.end_ms {
            self.schedule(self.now + READER_ROUND_MS, Event::ReaderRound(i));
        }
    }

    fn reader_timer(&mut self, i: usize, seq: u64) {
        let step = {
            let rc = &mut self.readers[i];
            let Some((rd, s, timers, _)) = rc.inflight.as_mut() else {
                return;
            };
            if *s != seq {
                return;
            }
            *timers += 1;
            if *timers > 3 {
                rc.inflight = None;
                return;
            }
            rd.speculative_timeout()
        };
        self.reader_step(i, step);
        let now = self.now;
        self.schedule(now + 15, Event::ReaderTimer { reader: i, seq });
    }

    fn reader_step(&mut self, i: usize, step: ReadStep) {
        match step {
            ReadStep::Send(bookie) => {
                let Some((rd, ..)) = self.readers[i].inflight.as_ref() else {
                    return;
                };
                let entry_id = rd.entry_id();
                if let Some(b) = bookie_index(&bookie) {
                    self.send(
                        Addr::Reader(i),
                        Addr::Bookie(b),
                        Msg::Read {
                            entry_id,
                            fence: false,
                            key: Bytes::new(),
                        },
                    );
                }
            }
            ReadStep::Done(entry) => {
                let rc = &mut self.readers[i];
                let open = rc.inflight.as_ref().is_some_and(|x| x.3);
                rc.inflight = None;
                if let Some(r) = rc.reader.as_mut() {
                    r.observe_entry(&entry);
                }
                rc.next = entry.header.entry_id + 1;
                self.history.reads.push((
                    i,
                    entry.header.entry_id,
                    entry.payload.clone(),
                    self.now,
                    open,
                ));
                self.reader_try(i);
            }
            ReadStep::Failed(_) => self.readers[i].inflight = None,
            ReadStep::Wait => {}
        }
    }

    fn reader_try(&mut self, i: usize) {
        let step = {
            let rc = &mut self.readers[i];
            if rc.inflight.is_some() {
                return;
            }
            let Some(r) = rc.reader.as_ref() else {
                return;
            };
            if rc.next > r.last_readable() {
                return;
            }
            let open = !r.is_closed();
            let Ok(mut rd) = r.read(rc.next) else {
                return;
            };
            rc.seq += 1;
            let step = rd.start();
            rc.inflight = Some((rd, rc.seq, 0, open));
            step
        };
        let seq = self.readers[i].seq;
        self.schedule(self.now + 15, Event::ReaderTimer { reader: i, seq });
        self.reader_step(i, step);
    }

    fn reader_message(&mut self, i: usize, from: Addr, msg: Msg) {
        match (from, msg) {
            (Addr::Meta, Msg::MetaResp { md, .. }) => {
                let rc = &mut self.readers[i];
                let ens: Vec<String> = md
                    .segments
                    .last()
                    .map(|s| s.ensemble.clone())
                    .unwrap_or_default();
                match rc.reader.as_mut() {
                    Some(r) => {
                        let _ = r.update_metadata(md);
                    }
                    None => rc.reader = Reader::new(md).ok(),
                }
                for b in ens {
                    if let Some(b) = bookie_index(&b) {
                        self.send(Addr::Reader(i), Addr::Bookie(b), Msg::ReadLac);
                    }
                }
                self.reader_try(i);
            }
            (
                Addr::Bookie(_),
                Msg::ReadLacResp {
                    last_entry,
                    explicit_lac,
                },
            ) => {
                if let Some(r) = self.readers[i].reader.as_mut() {
                    r.observe_lac_answer(last_entry.as_ref(), explicit_lac.as_ref());
                }
                self.reader_try(i);
            }
            (
                Addr::Bookie(b),
                Msg::ReadResp {
                    entry_id,
                    status,
                    body,
                },
            ) => {
                let step = {
                    let Some((rd, ..)) = self.readers[i].inflight.as_mut() else {
                        return;
                    };
                    if rd.entry_id() != entry_id {
                        return;
                    }
                    rd.response(&bookie_name(b), status, body)
                };
                self.reader_step(i, step);
            }
            _ => {}
        }
    }

    // ---------------------------------------------------------------- checker

    /// Checks the run's history against the final state (see the module doc).
    pub(crate) fn check(&self) -> Result<(), String> {
        let h = &self.history;
        let md = &self.meta.0;
        let spec = validate(md).map_err(|e| format!("final metadata invalid: {e}"))?;
        for (i, (e, _)) in h.acked.iter().enumerate() {
            if *e != i as EntryId {
                return Err(format!("acks out of order: {:?}", h.acked));
            }
        }
        if !h.acks_after_failure.is_empty() {
            return Err(format!(
                "acks after the writer failed: {:?}",
                h.acks_after_failure
            ));
        }
        if md.status != LedgerStatus::LedgerClosed as i32 {
            return Err(format!(
                "ledger not closed at the end ({} recovery attempts)",
                h.recoveries.len()
            ));
        }
        let last = md.last_entry_id;
        let max_acked = h.acked.last().map_or(-1, |(e, _)| *e);
        if max_acked > last {
            return Err(format!(
                "acked entry {max_acked} truncated: ledger closed at {last}"
            ));
        }
        if let Some((l, len)) = h.writer_closed
            && (l, len) != (last, md.length)
        {
            return Err(format!("writer closed at {l} but metadata says {last}"));
        }
        let mut length = 0u64;
        for e in 0..=last {
            let Some(want) = h.payloads.get(e as usize) else {
                return Err(format!(
                    "closed at {last}, past the {} entries written",
                    h.payloads.len()
                ));
            };
            length += want.len() as u64;
            let mut copies = 0;
            for b in write_set_bookies(md, &spec, e) {
                let Some(i) = bookie_index(&b) else { continue };
                if let Some(bytes) = self.bookies[i].durable.entries.get(&e) {
                    match Entry::decode_expected(bytes.clone(), LEDGER_ID, e) {
                        Ok(x) if x.payload == *want => copies += 1,
                        Ok(_) => return Err(format!("entry {e} on {b} has other bytes")),
                        Err(err) => return Err(format!("entry {e} on {b}: {err}")),
                    }
                }
            }
            if copies < spec.ack_quorum() {
                return Err(format!(
                    "entry {e} has {copies} durable copies in its write set (Qa {}), acked up to {max_acked}",
                    spec.ack_quorum()
                ));
            }
        }
        if length != md.length {
            return Err(format!(
                "closed length {} but payloads sum to {length}",
                md.length
            ));
        }
        for r in h.recoveries.iter().flatten() {
            if (r.last_entry_id, r.length) != (last, md.length) {
                return Err(format!(
                    "a recovery reported {r:?}, metadata closed at {last}"
                ));
            }
        }
        for (reader, e, payload, t, open) in &h.reads {
            if h.payloads.get(*e as usize) != Some(payload) {
                return Err(format!("reader {reader} read other bytes for entry {e}"));
            }
            let acked_then = h
                .acked
                .iter()
                .take_while(|(_, at)| at <= t)
                .last()
                .map_or(-1, |(x, _)| *x);
            if *open && *e > acked_then {
                return Err(format!(
                    "reader {reader} read entry {e} of the open ledger at {t} ms, past the acked {acked_then}"
                ));
            }
        }
        Ok(())
    }

    /// A one-line summary of the run, for failure messages.
    pub(crate) fn summary(&self) -> String {
        let acked: BTreeMap<&str, EntryId> =
            BTreeMap::from([("acked", self.history.acked.last().map_or(-1, |x| x.0))]);
        format!(
            "seed {} E{}Qw{}Qa{} bookies {} entries {} {:?} closed at {} segments {} recoveries {:?} writer failed at {:?} events {}",
            self.cfg.seed,
            self.cfg.ensemble,
            self.cfg.write_quorum,
            self.cfg.ack_quorum,
            self.cfg.bookies,
            self.cfg.entries,
            acked,
            self.meta.0.last_entry_id,
            self.meta.0.segments.len(),
            &self.history.recoveries[self.history.recoveries.len().saturating_sub(3)..],
            self.history.writer_failed_at,
            self.events_run
        )
    }
}
