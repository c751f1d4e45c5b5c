//! Applies namespace policy changes to the topics loaded on this broker,
//! whichever broker stored the change.
//!
//! A loaded topic runs with the managed-ledger settings of the namespace
//! policies it was loaded with ([`crate::tenancy::ml_config_for`]:
//! persistence E/Qw/Qa, retention, message TTL) and the de-duplication
//! policy it was loaded with ([`crate::dedup_io`]). Every
//! [`POLICY_REFRESH_INTERVAL_MS`] this task re-reads the policies of each
//! namespace that has loaded topics (one metadata read per namespace) and
//! unloads the topics whose settings differ: their clients are told to
//! reconnect (CLOSE_PRODUCER / CLOSE_CONSUMER) and the next use loads the
//! topic with the new settings. Auto-creation needs nothing here (it is read
//! on every load). Policies that change nothing in the managed ledger
//! (quotas, rates, max counts) never unload a topic.
//!
//! Promise: a change of persistence, retention, TTL or de-duplication stored through any
//! broker is in force on every broker's loaded topics within about
//! [`POLICY_REFRESH_INTERVAL_MS`] plus a reload; the task ends on shutdown.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cms_bookie::metadata::MetadataStore;
use cms_bookie::metadata::layout::Layout;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::tenancy::{ml_policies_differ, namespace_policies};
use crate::topics::{Topic, Topics};

/// Period of the policy re-read, in milliseconds.
pub const POLICY_REFRESH_INTERVAL_MS: u64 = 2_000;

/// One pass: unloads the loaded topics whose namespace's managed-ledger
/// policies changed since they were loaded. Returns how many it unloaded.
pub async fn refresh_once(topics: &Topics, store: &dyn MetadataStore, layout: &Layout) -> usize {
    let mut by_ns: BTreeMap<(String, String), Vec<Arc<Topic>>> = BTreeMap::new();
    for name in topics.loaded() {
        if let Some(t) = topics.get_loaded(&name) {
            by_ns
                .entry((name.tenant.clone(), name.namespace.clone()))
                .or_default()
                .push(t);
        }
    }
    let mut unloaded = 0;
    for ((tenant, ns), loaded) in by_ns {
        let current = match namespace_policies(store, layout, &tenant, &ns).await {
            Ok(Some(p)) => p,
            // Deleted namespaces: their topics go with the admin delete.
            Ok(None) => continue,
            Err(e) => {
                warn!(tenant = %tenant, namespace = %ns, error = %e, "re-reading namespace policies");
                continue;
            }
        };
        for t in loaded {
            if ml_policies_differ(&t.policies, &current)
                || t.policies.deduplication_enabled != current.deduplication_enabled
            {
                info!(tenant = %tenant, namespace = %ns, topic = %t.name, "namespace policies changed: reloading topic");
                topics.unload(&t, "namespace policies changed").await;
                unloaded += 1;
            }
        }
    }
    unloaded
}

/// Runs [`refresh_once`] every [`POLICY_REFRESH_INTERVAL_MS`] until
/// `shutdown` turns true.
pub async fn run(
    topics: Arc<Topics>,
    store: Arc<dyn MetadataStore>,
    layout: Layout,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut interval = tokio::time::interval(Duration::from_millis(POLICY_REFRESH_INTERVAL_MS));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = crate::connection::wait_true(&mut shutdown) => return,
        }
        refresh_once(&topics, &*store, &layout).await;
    }
}
