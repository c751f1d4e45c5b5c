//! The metadata-store conformance suite: one body per behaviour of the
//! [`MetadataStore`] contract, run against every backend (the embedded store,
//! ZooKeeper), so both keep the same semantics.
//!
//! A backend is plugged in through [`ConformanceBackend`]: new sessions, forced
//! expiry of one of them, and a restart that keeps persistent data. Each body
//! takes a base path of its own and clears it first, so bodies may share one
//! server and may be re-run on old data. Every wait is bounded; a body fails by
//! panicking with a message that says which promise broke.
//!
//! ```no_run
//! # async fn demo(backend: &mut dyn cms_tests::conformance::ConformanceBackend) {
//! cms_tests::conformance::create_get_set_delete_basics(backend, "/conformance/basics").await;
//! # }
//! ```

// These are test bodies: an unexpected error is the test's failure, and the
// panic message (with the backend name where it matters) is its report.
#![allow(
    clippy::unwrap_used,
    reason = "test bodies: a failed call is a test failure, reported by the panic"
)]

use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use cms_bookie::metadata::{
    CreateMode, Expected, MetadataError, MetadataStore, NODE_DATA_BYTES_MAX, SessionState,
    WatchEvent, join,
};
use futures::StreamExt;
use tokio::sync::Barrier;

/// Bound on one store call, in milliseconds: a call that takes longer is a hang.
pub const CALL_TIMEOUT_MS: u64 = 30_000;
/// Bound on the wait for one watch event, in milliseconds.
pub const EVENT_WAIT_MS_MAX: u64 = 10_000;
/// Bound on the wait for a session state (Expired, Closed), in milliseconds.
pub const SESSION_WAIT_MS_MAX: u64 = 60_000;
/// Creates (and deletes) in flight at once in the 10,000-children body.
pub const BULK_IN_FLIGHT_MAX: usize = 256;

/// A metadata backend under test.
#[async_trait]
pub trait ConformanceBackend: Send + Sync {
    /// A new session (own session id, own ephemeral nodes).
    async fn session(&self) -> Arc<dyn MetadataStore>;
    /// Forces `s` (a session made by [`ConformanceBackend::session`]) to
    /// expire, as a long partition would; returns once the store has expired
    /// it. The body then waits for [`SessionState::Expired`] itself.
    async fn expire(&self, s: &Arc<dyn MetadataStore>);
    /// Restarts the store, keeping its persistent data. The body drops every
    /// session it holds before calling this and makes new ones after.
    async fn restart(&mut self);
    /// The backend's name, for messages.
    fn name(&self) -> &str;
}

/// The sessions a backend made, kept weakly with their typed handles, so that
/// [`ConformanceBackend::expire`] can find the concrete store behind an
/// `Arc<dyn MetadataStore>` (no downcasting) without keeping it alive.
pub struct Sessions<T: MetadataStore> {
    made: Mutex<Vec<Weak<T>>>,
}

impl<T: MetadataStore> Default for Sessions<T> {
    fn default() -> Self {
        Sessions {
            made: Mutex::new(Vec::new()),
        }
    }
}

impl<T: MetadataStore> Sessions<T> {
    /// Remembers `store` and returns it as a trait object.
    pub fn add(&self, store: T) -> Arc<dyn MetadataStore> {
        let store = Arc::new(store);
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        made.retain(|w| w.strong_count() > 0);
        made.push(Arc::downgrade(&store));
        store
    }

    /// The typed handle behind `s`, if this set made it and it is alive.
    pub fn find(&self, s: &Arc<dyn MetadataStore>) -> Option<Arc<T>> {
        let target = Arc::as_ptr(s) as *const ();
        let made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        made.iter()
            .filter_map(Weak::upgrade)
            .find(|t| Arc::as_ptr(t) as *const () == target)
    }
}

async fn within<T>(what: &str, ms: u64, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_millis(ms), fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {ms} ms (hang)"),
    }
}

/// One store call, bounded by [`CALL_TIMEOUT_MS`].
async fn call<T>(what: &str, fut: impl Future<Output = T>) -> T {
    within(what, CALL_TIMEOUT_MS, fut).await
}

/// The next event of a watch, bounded by [`EVENT_WAIT_MS_MAX`].
async fn next_event(what: &str, w: &mut cms_bookie::metadata::Watch) -> WatchEvent {
    match within(what, EVENT_WAIT_MS_MAX, w.next()).await {
        Some(ev) => ev,
        None => panic!("{what}: the watch ended"),
    }
}

/// Waits until the session reports `want`.
async fn wait_state(what: &str, s: &Arc<dyn MetadataStore>, want: SessionState) {
    let mut events = s.session_events();
    let waited = within(what, SESSION_WAIT_MS_MAX, events.wait_for(|st| *st == want)).await;
    if waited.is_err() {
        panic!("{what}: session events ended before {want:?}");
    }
}

/// Deletes `path` and everything under it (deepest first); no-op if absent.
async fn delete_tree(s: &Arc<dyn MetadataStore>, path: &str) {
    let mut stack = vec![(path.to_string(), false)];
    while let Some((p, expanded)) = stack.pop() {
        if expanded {
            match call("delete_tree", s.delete(&p, Expected::Any)).await {
                Ok(()) | Err(MetadataError::NoNode(_)) => {}
                Err(e) => panic!("clearing {p}: {e}"),
            }
            continue;
        }
        match call("delete_tree", s.children(&p)).await {
            Ok(children) => {
                stack.push((p.clone(), true));
                for c in children {
                    stack.push((join(&p, &c), false));
                }
            }
            Err(MetadataError::NoNode(_)) => {}
            Err(e) => panic!("clearing {p}: {e}"),
        }
    }
}

/// A session and an empty `base` (old data from a previous run removed).
async fn fresh(b: &dyn ConformanceBackend, base: &str) -> Arc<dyn MetadataStore> {
    let s = b.session().await;
    delete_tree(&s, base).await;
    call("create_all", s.create_all(base))
        .await
        .unwrap_or_else(|e| panic!("{}: create_all({base}): {e}", b.name()));
    s
}

/// The numeric suffix of a sequential node: exactly 10 digits.
fn seq_suffix(created: &str, prefix: &str) -> i64 {
    let suffix = created
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{created} does not start with {prefix}"));
    assert_eq!(suffix.len(), 10, "{created}: the suffix is 10 digits");
    assert!(suffix.bytes().all(|c| c.is_ascii_digit()), "{created}");
    suffix.parse().unwrap_or_else(|e| panic!("{created}: {e}"))
}

/// Read-modify-CAS under concurrent writers: in lock-step rounds (everyone
/// reads, then everyone writes with the version read) exactly one CAS per round
/// wins and the others get `BadVersion`; then free-running retry loops. The
/// final value equals the number of successful CASes: no lost update.
pub async fn cas_conflict_under_concurrent_writers(b: &mut dyn ConformanceBackend, base: &str) {
    const WRITERS: usize = 6;
    const ROUNDS: usize = 8;
    const INCREMENTS: usize = 15;
    const ATTEMPTS_MAX: usize = 10_000;
    let s = fresh(b, base).await;
    let counter = join(base, "counter");
    call("create", s.create(&counter, b"0", CreateMode::Persistent))
        .await
        .unwrap();
    let barrier = Arc::new(Barrier::new(WRITERS));
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let w = b.session().await;
        let barrier = Arc::clone(&barrier);
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            let mut wins_per_round = Vec::new();
            let mut conflicts = 0usize;
            for _ in 0..ROUNDS {
                let (data, stat) = call("get", w.get(&counter)).await.unwrap();
                let value: u64 = String::from_utf8(data).unwrap().parse().unwrap();
                barrier.wait().await;
                let next = (value + 1).to_string();
                let r = call(
                    "set",
                    w.set(&counter, next.as_bytes(), Expected::Version(stat.version)),
                )
                .await;
                match r {
                    Ok(_) => wins_per_round.push(1usize),
                    Err(MetadataError::BadVersion { .. }) => {
                        wins_per_round.push(0);
                        conflicts += 1;
                    }
                    Err(e) => panic!("CAS failed with {e}"),
                }
                barrier.wait().await;
            }
            let mut wins = 0usize;
            let mut attempts = 0usize;
            while wins < INCREMENTS {
                attempts += 1;
                assert!(
                    attempts <= ATTEMPTS_MAX,
                    "no progress after {ATTEMPTS_MAX} CAS attempts"
                );
                let (data, stat) = call("get", w.get(&counter)).await.unwrap();
                let value: u64 = String::from_utf8(data).unwrap().parse().unwrap();
                let next = (value + 1).to_string();
                match call(
                    "set",
                    w.set(&counter, next.as_bytes(), Expected::Version(stat.version)),
                )
                .await
                {
                    Ok(new) => {
                        assert_eq!(
                            new.version,
                            stat.version + 1,
                            "a CAS bumps the version by one"
                        );
                        wins += 1;
                    }
                    Err(MetadataError::BadVersion { .. }) => conflicts += 1,
                    Err(e) => panic!("CAS failed with {e}"),
                }
            }
            (wins_per_round, wins, conflicts)
        }));
    }
    let mut round_wins = vec![0usize; ROUNDS];
    let mut total_wins = 0usize;
    let mut total_conflicts = 0usize;
    for t in tasks {
        let (per_round, wins, conflicts) = t.await.unwrap();
        for (i, w) in per_round.iter().enumerate() {
            round_wins[i] += w;
        }
        total_wins += per_round.iter().sum::<usize>() + wins;
        total_conflicts += conflicts;
    }
    assert!(
        round_wins.iter().all(|&w| w == 1),
        "{}: in each lock-step round exactly one CAS wins: {round_wins:?}",
        b.name()
    );
    assert!(
        total_conflicts >= ROUNDS * (WRITERS - 1),
        "{}: losers must see BadVersion ({total_conflicts})",
        b.name()
    );
    let (data, stat) = call("get", s.get(&counter)).await.unwrap();
    let value: usize = String::from_utf8(data).unwrap().parse().unwrap();
    assert_eq!(value, total_wins, "{}: lost update", b.name());
    assert_eq!(
        stat.version as usize,
        total_wins,
        "{}: one version per CAS",
        b.name()
    );
    assert_eq!(total_wins, ROUNDS + WRITERS * INCREMENTS);
}

/// create / get / exists / set / delete / children, with every error a caller
/// branches on: NoNode, NodeExists, BadVersion, NotEmpty.
pub async fn create_get_set_delete_basics(b: &mut dyn ConformanceBackend, base: &str) {
    let s = fresh(b, base).await;
    let n = join(base, "node");
    let child = join(&n, "child");
    let name = b.name().to_string();

    let root = call("exists /", s.exists("/")).await.unwrap();
    assert!(root.is_some(), "{name}: the root always exists");
    assert_eq!(call("exists", s.exists(&n)).await, Ok(None));
    assert!(matches!(
        call("get", s.get(&n)).await,
        Err(MetadataError::NoNode(_))
    ));
    assert!(matches!(
        call("children", s.children(&n)).await,
        Err(MetadataError::NoNode(_))
    ));
    assert!(
        matches!(
            call("create", s.create(&child, b"", CreateMode::Persistent)).await,
            Err(MetadataError::NoNode(_))
        ),
        "{name}: create under a missing parent is NoNode"
    );

    let (created, stat) = call("create", s.create(&n, b"v0", CreateMode::Persistent))
        .await
        .unwrap();
    assert_eq!(created, n);
    assert_eq!(
        (
            stat.version,
            stat.data_len,
            stat.num_children,
            stat.ephemeral_owner
        ),
        (0, 2, 0, 0)
    );
    assert!(
        stat.ctime_ms > 0 && stat.mtime_ms >= stat.ctime_ms,
        "{stat:?}"
    );
    let (data, got) = call("get", s.get(&n)).await.unwrap();
    assert_eq!((data.as_slice(), got.version), (&b"v0"[..], 0));
    assert_eq!(
        call("exists", s.exists(&n))
            .await
            .unwrap()
            .map(|st| st.version),
        Some(0)
    );
    assert!(matches!(
        call("create again", s.create(&n, b"x", CreateMode::Persistent)).await,
        Err(MetadataError::NodeExists(_))
    ));

    let st = call("set v0", s.set(&n, b"v1", Expected::Version(0)))
        .await
        .unwrap();
    assert_eq!((st.version, st.data_len), (1, 2));
    assert!(
        matches!(
            call("stale set", s.set(&n, b"v2", Expected::Version(0))).await,
            Err(MetadataError::BadVersion { expected: 0, .. })
        ),
        "{name}: a CAS with a stale version is BadVersion"
    );
    assert_eq!(
        call("get", s.get(&n)).await.unwrap().0,
        b"v1",
        "a refused set changed nothing"
    );
    let st = call("set any", s.set(&n, b"", Expected::Any))
        .await
        .unwrap();
    assert_eq!((st.version, st.data_len), (2, 0));
    assert!(matches!(
        call(
            "set missing",
            s.set(&join(base, "missing"), b"", Expected::Any)
        )
        .await,
        Err(MetadataError::NoNode(_))
    ));

    call(
        "create child",
        s.create(&child, b"c", CreateMode::Persistent),
    )
    .await
    .unwrap();
    assert_eq!(
        call("exists", s.exists(&n))
            .await
            .unwrap()
            .map(|st| st.num_children),
        Some(1)
    );
    assert_eq!(
        call("children", s.children(&n)).await.unwrap(),
        vec!["child".to_string()]
    );
    assert!(
        matches!(
            call("delete parent", s.delete(&n, Expected::Any)).await,
            Err(MetadataError::NotEmpty(_))
        ),
        "{name}: deleting a node with children is NotEmpty"
    );
    assert!(matches!(
        call("stale delete", s.delete(&child, Expected::Version(5))).await,
        Err(MetadataError::BadVersion { expected: 5, .. })
    ));
    call("delete child", s.delete(&child, Expected::Version(0)))
        .await
        .unwrap();
    assert!(matches!(
        call("delete again", s.delete(&child, Expected::Any)).await,
        Err(MetadataError::NoNode(_))
    ));
    call("delete", s.delete(&n, Expected::Version(2)))
        .await
        .unwrap();
    assert_eq!(call("exists", s.exists(&n)).await, Ok(None));

    // Children are names, sorted; create_all is idempotent.
    let deep = join(base, "a/b/c");
    call("create_all", s.create_all(&deep)).await.unwrap();
    call("create_all again", s.create_all(&deep)).await.unwrap();
    for name in ["z", "m", "a2"] {
        call(
            "create",
            s.create(&join(base, name), b"", CreateMode::Persistent),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        call("children", s.children(base)).await.unwrap(),
        vec!["a", "a2", "m", "z"]
    );
    // Data of any byte value round-trips.
    let bytes: Vec<u8> = (0..=255u8).collect();
    call("set bytes", s.set(&join(base, "z"), &bytes, Expected::Any))
        .await
        .unwrap();
    assert_eq!(call("get", s.get(&join(base, "z"))).await.unwrap().0, bytes);
}

/// Creates `n` persistent-sequential nodes at `prefix`; appends their numbers
/// to `seen` and returns their paths.
async fn create_sequential(
    s: &Arc<dyn MetadataStore>,
    prefix: &str,
    n: usize,
    seen: &mut Vec<i64>,
) -> Vec<String> {
    let mut created = Vec::with_capacity(n);
    for _ in 0..n {
        let (p, _) = call(
            "create seq",
            s.create(prefix, b"", CreateMode::PersistentSequential),
        )
        .await
        .unwrap();
        seen.push(seq_suffix(&p, prefix));
        created.push(p);
    }
    created
}

/// Sequential numbers: 10 digits, growing, never reused after the children
/// are deleted or after a restart; ephemeral-sequential shares the counter.
pub async fn sequential_numbers_never_repeat(b: &mut dyn ConformanceBackend, base: &str) {
    let s = fresh(b, base).await;
    let prefix = join(base, "n-");
    let mut seen: Vec<i64> = Vec::new();
    let created = create_sequential(&s, &prefix, 5, &mut seen).await;
    for p in &created {
        call("delete", s.delete(p, Expected::Any)).await.unwrap();
    }
    create_sequential(&s, &prefix, 3, &mut seen).await;
    let (p, stat) = call(
        "create eseq",
        s.create(&prefix, b"", CreateMode::EphemeralSequential),
    )
    .await
    .unwrap();
    assert_eq!(stat.ephemeral_owner, s.session_id());
    seen.push(seq_suffix(&p, &prefix));
    drop(s);

    b.restart().await;

    let s = b.session().await;
    create_sequential(&s, &prefix, 3, &mut seen).await;
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "{}: sequence numbers must only grow, across deletes and restart: {seen:?}",
        b.name()
    );
}

/// Ephemeral nodes are visible to other sessions with their owner, and are
/// gone once their session's `close` returns; the closed session's calls fail
/// with `Closed`.
pub async fn ephemerals_end_with_close(b: &mut dyn ConformanceBackend, base: &str) {
    let observer = fresh(b, base).await;
    let owner = b.session().await;
    let e = join(base, "e");
    let (es, _) = call(
        "create eseq",
        owner.create(&join(base, "es-"), b"", CreateMode::EphemeralSequential),
    )
    .await
    .unwrap();
    call("create e", owner.create(&e, b"mine", CreateMode::Ephemeral))
        .await
        .unwrap();
    let stat = call("exists", observer.exists(&e)).await.unwrap();
    let stat = stat.unwrap_or_else(|| panic!("{}: another session sees the ephemeral", b.name()));
    assert_eq!(stat.ephemeral_owner, owner.session_id());
    assert_ne!(stat.ephemeral_owner, 0);
    assert_ne!(owner.session_id(), observer.session_id());
    let mut watch = call("watch", observer.watch_data(&e)).await.unwrap();

    call("close", owner.close()).await;

    assert_eq!(
        call("exists", observer.exists(&e)).await,
        Ok(None),
        "{}: close returned but the ephemeral is still there",
        b.name()
    );
    assert_eq!(call("exists", observer.exists(&es)).await, Ok(None));
    assert_eq!(
        next_event("deleted", &mut watch).await,
        WatchEvent::Deleted(e.clone())
    );
    assert!(
        call("children", observer.children(base))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        call("get after close", owner.get(base)).await.map(|_| ()),
        Err(MetadataError::Closed)
    );
}

/// After expiry, the session reports `Expired`, its ephemerals are gone (an
/// observer's watch sees them go), and every call fails with `SessionExpired`.
pub async fn ephemerals_end_with_expiry(b: &mut dyn ConformanceBackend, base: &str) {
    let observer = fresh(b, base).await;
    let owner = b.session().await;
    let e = join(base, "e");
    call("create e", owner.create(&e, b"", CreateMode::Ephemeral))
        .await
        .unwrap();
    let mut watch = call("watch", observer.watch_data(&e)).await.unwrap();
    b.expire(&owner).await;
    wait_state("expiry is reported", &owner, SessionState::Expired).await;
    assert_eq!(
        call("exists", observer.exists(&e)).await,
        Ok(None),
        "{}: the expired session's ephemeral survived",
        b.name()
    );
    assert_eq!(
        next_event("deleted", &mut watch).await,
        WatchEvent::Deleted(e.clone())
    );
    // The observer's own session is untouched.
    call(
        "observer create",
        observer.create(&join(base, "after"), b"", CreateMode::Persistent),
    )
    .await
    .unwrap();
}

/// An ephemeral node cannot have children, of any mode.
pub async fn ephemerals_cannot_have_children(b: &mut dyn ConformanceBackend, base: &str) {
    let s = fresh(b, base).await;
    let e = join(base, "e");
    call("create e", s.create(&e, b"", CreateMode::Ephemeral))
        .await
        .unwrap();
    for mode in [
        CreateMode::Persistent,
        CreateMode::Ephemeral,
        CreateMode::PersistentSequential,
        CreateMode::EphemeralSequential,
    ] {
        let r = call(
            "create under ephemeral",
            s.create(&join(&e, "c"), b"", mode),
        )
        .await;
        assert!(
            matches!(r, Err(MetadataError::NoChildrenForEphemerals(_))),
            "{}: {mode:?} child of an ephemeral gave {r:?}",
            b.name()
        );
    }
    assert!(call("children", s.children(&e)).await.unwrap().is_empty());
}

/// Watches are persistent and deliver every change in order: a data watch
/// registered before the node exists sees Created, each DataChanged, Deleted,
/// and Created again; a children watch sees one ChildrenChanged per child
/// create / delete and Deleted when its node goes. A dropped watch is gone.
pub async fn watches_deliver_changes_in_order(b: &mut dyn ConformanceBackend, base: &str) {
    let s = fresh(b, base).await;
    let writer = b.session().await;
    let x = join(base, "x");
    let dir = join(base, "dir");
    let name = b.name().to_string();

    let mut data = call("watch_data", s.watch_data(&x)).await.unwrap();
    call("create", writer.create(&x, b"0", CreateMode::Persistent))
        .await
        .unwrap();
    for i in 1..=3 {
        call(
            "set",
            writer.set(&x, format!("{i}").as_bytes(), Expected::Any),
        )
        .await
        .unwrap();
    }
    call("delete", writer.delete(&x, Expected::Any))
        .await
        .unwrap();
    call(
        "create again",
        writer.create(&x, b"again", CreateMode::Persistent),
    )
    .await
    .unwrap();
    let expected = [
        WatchEvent::Created(x.clone()),
        WatchEvent::DataChanged(x.clone()),
        WatchEvent::DataChanged(x.clone()),
        WatchEvent::DataChanged(x.clone()),
        WatchEvent::Deleted(x.clone()),
        WatchEvent::Created(x.clone()),
    ];
    for (i, want) in expected.iter().enumerate() {
        let got = next_event("data watch", &mut data).await;
        assert_eq!(&got, want, "{name}: data watch event #{i}");
    }

    call(
        "create dir",
        writer.create(&dir, b"", CreateMode::Persistent),
    )
    .await
    .unwrap();
    let mut kids = call("watch_children", s.watch_children(&dir))
        .await
        .unwrap();
    let mut dir_data = call("watch_data dir", s.watch_data(&dir)).await.unwrap();
    for c in ["a", "b"] {
        call(
            "create child",
            writer.create(&join(&dir, c), b"", CreateMode::Persistent),
        )
        .await
        .unwrap();
    }
    call("set dir", writer.set(&dir, b"d", Expected::Any))
        .await
        .unwrap();
    for c in ["a", "b"] {
        call("delete child", writer.delete(&join(&dir, c), Expected::Any))
            .await
            .unwrap();
    }
    call("delete dir", writer.delete(&dir, Expected::Any))
        .await
        .unwrap();
    for i in 0..4 {
        let got = next_event("children watch", &mut kids).await;
        assert_eq!(
            got,
            WatchEvent::ChildrenChanged(dir.clone()),
            "{name}: children event #{i}"
        );
    }
    assert_eq!(
        next_event("children watch", &mut kids).await,
        WatchEvent::Deleted(dir.clone()),
        "{name}: a children watch sees its node's delete (and no data change)"
    );
    assert_eq!(
        next_event("dir data watch", &mut dir_data).await,
        WatchEvent::DataChanged(dir.clone()),
        "{name}: a data watch sees no children changes"
    );
    assert_eq!(
        next_event("dir data watch", &mut dir_data).await,
        WatchEvent::Deleted(dir.clone())
    );

    // A dropped watch delivers nothing more; a live one on the same path does.
    let dropped = call("watch", s.watch_data(&x)).await.unwrap();
    drop(dropped);
    call("set", writer.set(&x, b"last", Expected::Any))
        .await
        .unwrap();
    assert_eq!(
        next_event("data watch", &mut data).await,
        WatchEvent::DataChanged(x.clone())
    );
}

/// 10,000 children under one node, created and deleted concurrently (bounded
/// in flight): `children` lists exactly those names, sorted.
pub async fn ten_thousand_children(b: &mut dyn ConformanceBackend, base: &str) {
    const CHILDREN: usize = 10_000;
    let s = fresh(b, base).await;
    let parent = join(base, "many");
    call(
        "create parent",
        s.create(&parent, b"", CreateMode::Persistent),
    )
    .await
    .unwrap();
    let names: Vec<String> = (0..CHILDREN).map(|i| format!("child-{i:05}")).collect();
    let results: Vec<_> = futures::stream::iter(names.iter().cloned())
        .map(|n| {
            let s = Arc::clone(&s);
            let path = join(&parent, &n);
            async move { call("bulk create", s.create(&path, b"x", CreateMode::Persistent)).await }
        })
        .buffer_unordered(BULK_IN_FLIGHT_MAX)
        .collect()
        .await;
    for r in results {
        r.unwrap_or_else(|e| panic!("bulk create: {e}"));
    }
    let listed = call("children", s.children(&parent)).await.unwrap();
    assert_eq!(listed.len(), CHILDREN, "{}", b.name());
    assert_eq!(
        listed,
        names,
        "{}: children are the names, sorted",
        b.name()
    );
    let stat = call("exists", s.exists(&parent)).await.unwrap();
    assert_eq!(stat.map(|st| st.num_children), Some(CHILDREN));

    let results: Vec<_> = futures::stream::iter(names.iter().cloned())
        .map(|n| {
            let s = Arc::clone(&s);
            let path = join(&parent, &n);
            async move { call("bulk delete", s.delete(&path, Expected::Any)).await }
        })
        .buffer_unordered(BULK_IN_FLIGHT_MAX)
        .collect()
        .await;
    for r in results {
        r.unwrap_or_else(|e| panic!("bulk delete: {e}"));
    }
    assert!(
        call("children", s.children(&parent))
            .await
            .unwrap()
            .is_empty()
    );
}

/// Data over [`NODE_DATA_BYTES_MAX`] is `TooLarge` for create and set — an
/// answer, never a hang or a dropped session; exactly the limit is accepted.
pub async fn too_large_is_refused_and_the_session_survives(
    b: &mut dyn ConformanceBackend,
    base: &str,
) {
    let s = fresh(b, base).await;
    let big = join(base, "big");
    let over = vec![7u8; NODE_DATA_BYTES_MAX + 1];
    let r = call(
        "create too large",
        s.create(&big, &over, CreateMode::Persistent),
    )
    .await;
    assert!(
        matches!(&r, Err(MetadataError::TooLarge { len, max, .. }) if *len == over.len() && *max == NODE_DATA_BYTES_MAX),
        "{}: {r:?}",
        b.name()
    );
    assert_eq!(call("exists", s.exists(&big)).await, Ok(None));
    let max = vec![9u8; NODE_DATA_BYTES_MAX];
    call(
        "create at the limit",
        s.create(&big, &max, CreateMode::Persistent),
    )
    .await
    .unwrap_or_else(|e| panic!("{}: data of exactly the limit: {e}", b.name()));
    let r = call("set too large", s.set(&big, &over, Expected::Any)).await;
    assert!(matches!(r, Err(MetadataError::TooLarge { .. })), "{r:?}");
    let (data, stat) = call("get", s.get(&big)).await.unwrap();
    assert_eq!((data.len(), stat.version), (NODE_DATA_BYTES_MAX, 0));
    // The session is still usable.
    call(
        "create after",
        s.create(&join(base, "small"), b"ok", CreateMode::Persistent),
    )
    .await
    .unwrap();
    assert_eq!(*s.session_events().borrow(), SessionState::Connected);
}

/// Malformed paths are `InvalidPath` on every call.
pub async fn invalid_paths_are_refused(b: &mut dyn ConformanceBackend, base: &str) {
    let s = fresh(b, base).await;
    let trailing = format!("{base}/");
    let double = format!("{base}//x");
    let dot = format!("{base}/./x");
    let long = format!(
        "{base}/{}",
        "x".repeat(cms_bookie::metadata::PATH_BYTES_MAX)
    );
    for p in [
        "",
        "relative",
        trailing.as_str(),
        double.as_str(),
        dot.as_str(),
        "/a/../b",
        "/zookeeper/x",
        long.as_str(),
        "/bad\u{1}char",
    ] {
        let is_invalid =
            |r: &Result<(), MetadataError>| matches!(r, Err(MetadataError::InvalidPath { .. }));
        let results = [
            ("get", call("get", s.get(p)).await.map(|_| ())),
            ("exists", call("exists", s.exists(p)).await.map(|_| ())),
            (
                "create",
                call("create", s.create(p, b"", CreateMode::Persistent))
                    .await
                    .map(|_| ()),
            ),
            (
                "set",
                call("set", s.set(p, b"", Expected::Any)).await.map(|_| ()),
            ),
            ("delete", call("delete", s.delete(p, Expected::Any)).await),
            (
                "children",
                call("children", s.children(p)).await.map(|_| ()),
            ),
            (
                "watch_data",
                call("watch_data", s.watch_data(p)).await.map(|_| ()),
            ),
            (
                "watch_children",
                call("watch_children", s.watch_children(p))
                    .await
                    .map(|_| ()),
            ),
        ];
        for (op, r) in results {
            assert!(is_invalid(&r), "{}: {op}({p:?}) gave {r:?}", b.name());
        }
    }
    // Nothing was created, and the session still works.
    assert!(call("children", s.children(base)).await.unwrap().is_empty());
}

/// Every call of the ended session `s` fails with `want` (`when`: "after
/// expiry", "after close"); `base` is an existing node.
async fn assert_every_call_fails(
    b: &dyn ConformanceBackend,
    s: &Arc<dyn MetadataStore>,
    base: &str,
    want: MetadataError,
    when: &str,
) {
    let fails = |r: Result<(), MetadataError>, op: &str| {
        assert_eq!(r, Err(want.clone()), "{}: {op} {when}", b.name());
    };
    fails(call("get", s.get(base)).await.map(|_| ()), "get");
    fails(call("exists", s.exists(base)).await.map(|_| ()), "exists");
    fails(
        call("children", s.children(base)).await.map(|_| ()),
        "children",
    );
    let x = join(base, "x");
    let create = s.create(&x, b"", CreateMode::Persistent);
    fails(call("create", create).await.map(|_| ()), "create");
    let set = s.set(base, b"", Expected::Any);
    fails(call("set", set).await.map(|_| ()), "set");
    fails(
        call("delete", s.delete(base, Expected::Any)).await,
        "delete",
    );
    fails(
        call("watch", s.watch_data(base)).await.map(|_| ()),
        "watch_data",
    );
    fails(
        call("watch", s.watch_children(base)).await.map(|_| ()),
        "watch_children",
    );
}

/// Expiry is reported on `session_events` (a terminal state that stays), and
/// every later call fails with `SessionExpired`.
pub async fn session_expiry_is_reported_and_calls_fail(b: &mut dyn ConformanceBackend, base: &str) {
    let _setup = fresh(b, base).await;
    let s = b.session().await;
    assert_eq!(*s.session_events().borrow(), SessionState::Connected);
    let mut watch = call("watch", s.watch_children(base)).await.unwrap();
    b.expire(&s).await;
    wait_state("expiry is reported", &s, SessionState::Expired).await;
    assert_every_call_fails(b, &s, base, MetadataError::SessionExpired, "after expiry").await;
    assert_eq!(
        within("watch end", EVENT_WAIT_MS_MAX, watch.next()).await,
        None,
        "{}: the expired session's watches end",
        b.name()
    );
    assert_eq!(
        *s.session_events().borrow(),
        SessionState::Expired,
        "terminal states stay"
    );
}

/// `close` is reported as `Closed` on `session_events`, and every later call
/// fails with `Closed`; a second close returns.
pub async fn close_is_reported_and_calls_fail(b: &mut dyn ConformanceBackend, base: &str) {
    let _setup = fresh(b, base).await;
    let s = b.session().await;
    let mut watch = call("watch", s.watch_data(base)).await.unwrap();
    call("close", s.close()).await;
    wait_state("close is reported", &s, SessionState::Closed).await;
    assert_every_call_fails(b, &s, base, MetadataError::Closed, "after close").await;
    assert_eq!(
        within("watch end", EVENT_WAIT_MS_MAX, watch.next()).await,
        None,
        "{}: a closed session's watches end",
        b.name()
    );
    call("close again", s.close()).await;
    assert_eq!(*s.session_events().borrow(), SessionState::Closed);
}
