//! Every metadata-store conformance body (`cms_tests::conformance`) against
//! every backend. One `conformance_tests!(name, constructor);` line per backend;
//! the constructor is an async fn returning `Box<dyn ConformanceBackend>`.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use cms_bookie::metadata::embedded::{EmbeddedBackend, EmbeddedStore};
use cms_bookie::metadata::{MetadataStore, SessionState};
use cms_tests::conformance::{self, ConformanceBackend, Sessions};

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

// The two expiry bodies are not run on ZooKeeper yet: forcing expiry by
// attaching a second connection to the session (`expire_session_for_test`)
// races with the owner's reconnect and failed about one run in four. Real
// ZooKeeper expiry is proven by `tests/zk_session_expiry.rs` (SIGSTOP past the
// session timeout). Next step: expire through a chaos-proxy black hole per session.
conformance_tests!(zookeeper, make_zookeeper_backend);

/// A real ZooKeeper server of its own (the harness), one session per call.
struct ZooKeeperBackend {
    zk: cms_tests::harness::zookeeper::ZooKeeper,
    sessions: Sessions<cms_bookie::metadata::zk::ZkStore>,
}

async fn make_zookeeper_backend() -> Box<dyn ConformanceBackend> {
    let zk = cms_tests::harness::zookeeper::ZooKeeper::start().await;
    Box::new(ZooKeeperBackend {
        zk,
        sessions: Sessions::default(),
    })
}

#[async_trait]
impl ConformanceBackend for ZooKeeperBackend {
    async fn session(&self) -> Arc<dyn MetadataStore> {
        let store = cms_bookie::metadata::zk::ZkStore::connect(
            &self.zk.connect_string(),
            &cms_bookie::metadata::zk::ZkOptions::default(),
        )
        .await
        .expect("connect to ZooKeeper");
        self.sessions.add(store)
    }

    async fn expire(&self, s: &Arc<dyn MetadataStore>) {
        let store = self
            .sessions
            .find(s)
            .expect("expire: a session this backend made");
        store
            .expire_session_for_test()
            .await
            .expect("ZooKeeper expires the session");
    }

    async fn restart(&mut self) {
        self.zk.restart().await;
    }

    fn name(&self) -> &str {
        "zookeeper"
    }
}
