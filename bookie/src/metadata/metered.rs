//! A [`MetadataStore`] wrapper that measures every call of the store it wraps:
//! latency per operation (`cms_metadata_store_op_seconds{op}`, a histogram)
//! and failures per operation (`cms_metadata_store_errors_total{op}`).
//!
//! Promises: the wrapped store's behaviour is unchanged (every call is passed
//! through as is, results and errors untouched); the label set is fixed
//! (`get`, `exists`, `create`, `set`, `delete`, `children`, `watch`), so the
//! series count is bounded; an expected outcome that the caller handles
//! (`NoNode` on a lookup, `NodeExists` on a create, `BadVersion` on a CAS) is
//! not counted as an error, since it is how the caller asks its question.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use tokio::sync::watch;

use super::{
    CreateMode, Expected, MetadataError, MetadataStore, Result, SessionState, Stat, Watch,
};

/// Latency buckets, seconds: from an embedded store's microseconds to a
/// ZooKeeper write under load.
const BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// The operation labels, one per [`MetadataStore`] call.
const OPS: [&str; 7] = [
    "get", "exists", "create", "set", "delete", "children", "watch",
];

/// The metrics of one [`MeteredStore`]; registered once per registry.
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    latency: HistogramVec,
    errors: IntCounterVec,
}

impl StoreMetrics {
    /// Creates and registers the two metric families in `registry`.
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "cms_metadata_store_op_seconds",
                "Latency of metadata-store calls by operation, seconds",
            )
            .buckets(BUCKETS.to_vec()),
            &["op"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                "cms_metadata_store_errors_total",
                "Metadata-store calls that failed, by operation (not counting an expected \
                 NoNode, NodeExists or BadVersion answer)",
            ),
            &["op"],
        )?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        // Every series exists from the start (0 until something fails), so
        // dashboards and alerts see it before the first error.
        for op in OPS {
            latency.with_label_values(&[op]);
            errors.with_label_values(&[op]);
        }
        Ok(Self { latency, errors })
    }

    fn observe<T>(&self, op: &str, started: Instant, result: &Result<T>) {
        self.latency
            .with_label_values(&[op])
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = result
            && !is_expected(e)
        {
            self.errors.with_label_values(&[op]).inc();
        }
    }
}

/// Answers that are part of the store's protocol rather than failures.
fn is_expected(e: &MetadataError) -> bool {
    matches!(
        e,
        MetadataError::NoNode(_) | MetadataError::NodeExists(_) | MetadataError::BadVersion { .. }
    )
}

/// Wraps a store; see the module docs.
pub struct MeteredStore {
    inner: Arc<dyn MetadataStore>,
    metrics: StoreMetrics,
}

impl std::fmt::Debug for MeteredStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredStore").finish_non_exhaustive()
    }
}

impl MeteredStore {
    /// `inner`, measured into `metrics`.
    pub fn wrap(inner: Arc<dyn MetadataStore>, metrics: StoreMetrics) -> Arc<dyn MetadataStore> {
        Arc::new(Self { inner, metrics })
    }
}

#[async_trait]
impl MetadataStore for MeteredStore {
    async fn get(&self, path: &str) -> Result<(Vec<u8>, Stat)> {
        let t = Instant::now();
        let r = self.inner.get(path).await;
        self.metrics.observe("get", t, &r);
        r
    }

    async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        let t = Instant::now();
        let r = self.inner.exists(path).await;
        self.metrics.observe("exists", t, &r);
        r
    }

    async fn create(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<(String, Stat)> {
        let t = Instant::now();
        let r = self.inner.create(path, data, mode).await;
        self.metrics.observe("create", t, &r);
        r
    }

    async fn set(&self, path: &str, data: &[u8], expected: Expected) -> Result<Stat> {
        let t = Instant::now();
        let r = self.inner.set(path, data, expected).await;
        self.metrics.observe("set", t, &r);
        r
    }

    async fn delete(&self, path: &str, expected: Expected) -> Result<()> {
        let t = Instant::now();
        let r = self.inner.delete(path, expected).await;
        self.metrics.observe("delete", t, &r);
        r
    }

    async fn children(&self, path: &str) -> Result<Vec<String>> {
        let t = Instant::now();
        let r = self.inner.children(path).await;
        self.metrics.observe("children", t, &r);
        r
    }

    async fn watch_data(&self, path: &str) -> Result<Watch> {
        let t = Instant::now();
        let r = self.inner.watch_data(path).await;
        self.metrics.observe("watch", t, &r);
        r
    }

    async fn watch_children(&self, path: &str) -> Result<Watch> {
        let t = Instant::now();
        let r = self.inner.watch_children(path).await;
        self.metrics.observe("watch", t, &r);
        r
    }

    fn session_events(&self) -> watch::Receiver<SessionState> {
        self.inner.session_events()
    }

    fn session_id(&self) -> i64 {
        self.inner.session_id()
    }

    fn negotiated_session_timeout_ms(&self) -> Option<u64> {
        self.inner.negotiated_session_timeout_ms()
    }

    async fn close(&self) {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::embedded::EmbeddedBackend;

    /// The value of series `name{op="<op>"}` in the registry's text output.
    fn sample(registry: &Registry, name: &str, op: &str) -> u64 {
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        let key = format!("{name}{{op=\"{op}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .map_or(0, |v| v.parse::<f64>().unwrap() as u64)
    }

    #[tokio::test]
    async fn every_call_is_timed_and_only_real_failures_count_as_errors() {
        let registry = Registry::new();
        let dir = tempfile::tempdir().unwrap();
        let backend = EmbeddedBackend::open(&dir.path().join("meta.redb")).unwrap();
        let inner: Arc<dyn MetadataStore> = Arc::new(backend.session());
        let store = MeteredStore::wrap(inner, StoreMetrics::new(&registry).unwrap());

        store
            .create("/a", b"1", CreateMode::Persistent)
            .await
            .unwrap();
        // Expected answers: the node exists, a CAS loses, a lookup misses.
        assert!(
            store
                .create("/a", b"1", CreateMode::Persistent)
                .await
                .is_err()
        );
        assert!(store.set("/a", b"2", Expected::Version(7)).await.is_err());
        assert!(store.get("/missing").await.is_err());
        store.get("/a").await.unwrap();
        // A real failure: a malformed path.
        assert!(store.get("no-slash").await.is_err());

        let op_seconds = "cms_metadata_store_op_seconds_count";
        let errors = "cms_metadata_store_errors_total";
        assert_eq!(sample(&registry, op_seconds, "create"), 2);
        assert_eq!(sample(&registry, op_seconds, "set"), 1);
        assert_eq!(sample(&registry, op_seconds, "get"), 3);
        assert_eq!(sample(&registry, errors, "create"), 0);
        assert_eq!(sample(&registry, errors, "set"), 0);
        assert_eq!(sample(&registry, errors, "get"), 1);
        // The wrapped store saw every call: the data is the inner store's.
        assert_eq!(store.get("/a").await.unwrap().0, b"1");
        // A second registration in the same registry is refused.
        assert!(StoreMetrics::new(&registry).is_err());
    }
}
