//! Every metadata-store conformance body (`cms_tests::conformance`) against
//! every backend. One `conformance_tests!(name, constructor);` line per backend;
//! the constructor is an async fn returning `Box<dyn ConformanceBackend>`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use cms_bookie::metadata::embedded::{EmbeddedBackend, EmbeddedStore};
use cms_bookie::metadata::zk::{ZkOptions, ZkStore};
use cms_bookie::metadata::{CreateMode, MetadataError, MetadataStore, SessionState};
use cms_tests::chaos::{ChaosProxy, Faults};
use cms_tests::conformance::{self, ConformanceBackend, Sessions};
use cms_tests::harness::ports::loopback;
use cms_tests::harness::wait::eventually;
use cms_tests::harness::zookeeper::ZooKeeper;

/// Where the ZooKeeper backend keeps one ephemeral marker per session it is
/// expiring (outside every body's base path).
const EXPIRY_MARKERS_PATH: &str = "/conformance-expiry-markers";

/// Runs each named body in its own test, with a fresh backend and its own
/// base path `/conformance/<body>`.
macro_rules! conformance_cases {
    ($make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let mut backend = $make().await;
                conformance::$case(&mut *backend, concat!("/conformance/", stringify!($case))).await;
            }
        )*
    };
}

/// One module of tests per backend: `conformance_tests!(name, constructor);`.
macro_rules! conformance_tests {
    ($backend:ident, $make:path $(; $($extra:ident),*)?) => {
        mod $backend {
            use super::*;
            conformance_cases!($make;
                cas_conflict_under_concurrent_writers,
                create_get_set_delete_basics,
                sequential_numbers_never_repeat,
                ephemerals_end_with_close,
                ephemerals_cannot_have_children,
                watches_deliver_changes_in_order,
                ten_thousand_children,
                too_large_is_refused_and_the_session_survives,
                invalid_paths_are_refused,
                close_is_reported_and_calls_fail,
            );
            $( conformance_cases!($make; $($extra),*); )?
        }
    };
}

conformance_tests!(embedded, make_embedded_backend;
    ephemerals_end_with_expiry, session_expiry_is_reported_and_calls_fail);

/// The embedded store on a file in a temporary directory.
struct Embedded {
    _dir: tempfile::TempDir,
    file: PathBuf,
    backend: Option<Arc<EmbeddedBackend>>,
    sessions: Sessions<EmbeddedStore>,
}

async fn make_embedded_backend() -> Box<dyn ConformanceBackend> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = dir.path().join("metadata.redb");
    let backend = EmbeddedBackend::open(&file).expect("open the embedded store");
    Box::new(Embedded {
        _dir: dir,
        file,
        backend: Some(backend),
        sessions: Sessions::default(),
    })
}

#[async_trait]
impl ConformanceBackend for Embedded {
    async fn session(&self) -> Arc<dyn MetadataStore> {
        let backend = self.backend.as_ref().expect("backend is open");
        self.sessions.add(backend.session())
    }

    async fn expire(&self, s: &Arc<dyn MetadataStore>) {
        let store = self
            .sessions
            .find(s)
            .expect("expire: a session this backend made");
        store.expire_session_for_test();
        let mut events = store.session_events();
        tokio::time::timeout(
            std::time::Duration::from_millis(conformance::SESSION_WAIT_MS_MAX),
            events.wait_for(|st| *st == SessionState::Expired),
        )
        .await
        .expect("embedded expiry completes")
        .expect("session events stay open");
    }

    async fn restart(&mut self) {
        let backend = self.backend.take().expect("backend is open");
        let weak = Arc::downgrade(&backend);
        drop(backend);
        assert!(
            weak.upgrade().is_none(),
            "restart: the body still holds a session of the old store"
        );
        let file = self.file.clone();
        let reopened = tokio::task::spawn_blocking(move || EmbeddedBackend::open(&file))
            .await
            .expect("reopen task")
            .expect("reopen the embedded store");
        self.backend = Some(reopened);
    }

    fn name(&self) -> &str {
        "embedded"
    }
}

conformance_tests!(zookeeper, make_zookeeper_backend;
    ephemerals_end_with_expiry, session_expiry_is_reported_and_calls_fail);

/// Session timeout asked of ZooKeeper by the conformance sessions, in ms: short,
/// so that forced expiry (a black hole this long and more) is quick.
const ZK_SESSION_TIMEOUT_MS: u64 = 4_000;

/// A real ZooKeeper server of its own (the harness), one session per call, each
/// through a chaos proxy of its own so that one session can be partitioned
/// from the server while the others (and the body's observers) keep talking.
struct ZooKeeperBackend {
    zk: ZooKeeper,
    sessions: Sessions<ZkStore>,
    /// The proxy in front of each session, by session id.
    proxies: Mutex<HashMap<i64, ChaosProxy>>,
}

async fn make_zookeeper_backend() -> Box<dyn ConformanceBackend> {
    let zk = ZooKeeper::start().await;
    Box::new(ZooKeeperBackend {
        zk,
        sessions: Sessions::default(),
        proxies: Mutex::new(HashMap::new()),
    })
}

fn zk_options() -> ZkOptions {
    ZkOptions {
        session_timeout_ms: ZK_SESSION_TIMEOUT_MS,
        ..ZkOptions::default()
    }
}

impl ZooKeeperBackend {
    /// Turns the black hole of `session_id`'s proxy on or off.
    fn black_hole(&self, session_id: i64, on: bool) {
        let proxies = self.proxies.lock().unwrap_or_else(|p| p.into_inner());
        let proxy = proxies
            .get(&session_id)
            .expect("expire: the session has a proxy");
        proxy
            .set_faults(Faults {
                black_hole: on,
                ..Faults::none()
            })
            .expect("valid faults");
    }
}

#[async_trait]
impl ConformanceBackend for ZooKeeperBackend {
    async fn session(&self) -> Arc<dyn MetadataStore> {
        let proxy = ChaosProxy::start(loopback(0), self.zk.addr())
            .await
            .expect("start the session's chaos proxy");
        let store = ZkStore::connect(&proxy.local_addr().to_string(), &zk_options())
            .await
            .expect("connect to ZooKeeper through the proxy");
        self.proxies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(store.session_id(), proxy);
        self.sessions.add(store)
    }

    /// Expires `s` for real: its proxy black-holes the connection (accepts,
    /// never answers) until the server has expired the session, which a marker
    /// ephemeral watched over a direct session shows; then the partition heals
    /// and the client learns `Expired` (from the server when it reconnects, or
    /// from its own session timer, whichever comes first).
    async fn expire(&self, s: &Arc<dyn MetadataStore>) {
        let store = self
            .sessions
            .find(s)
            .expect("expire: a session this backend made");
        let session_id = store.session_id();
        let marker = format!("{EXPIRY_MARKERS_PATH}/{session_id:x}");
        let monitor = ZkStore::connect(&self.zk.connect_string(), &zk_options())
            .await
            .expect("connect the expiry monitor to ZooKeeper");
        match monitor
            .create(EXPIRY_MARKERS_PATH, b"", CreateMode::Persistent)
            .await
        {
            Ok(_) | Err(MetadataError::NodeExists(_)) => {}
            Err(e) => panic!("create {EXPIRY_MARKERS_PATH}: {e}"),
        }
        store
            .create(&marker, b"", CreateMode::Ephemeral)
            .await
            .expect("the session to expire creates its marker");

        self.black_hole(session_id, true);
        eventually(
            "ZooKeeper expired the black-holed session (its marker is gone)",
            conformance::SESSION_WAIT_MS_MAX,
            || async { monitor.exists(&marker).await == Ok(None) },
        )
        .await;
        self.black_hole(session_id, false);
        monitor.close().await;

        let mut events = store.session_events();
        tokio::time::timeout(
            Duration::from_millis(conformance::SESSION_WAIT_MS_MAX),
            events.wait_for(|st| *st == SessionState::Expired),
        )
        .await
        .expect("the client reports the expiry once the partition heals")
        .expect("session events stay open");
    }

    async fn restart(&mut self) {
        self.zk.restart().await;
    }

    fn name(&self) -> &str {
        "zookeeper"
    }
}
