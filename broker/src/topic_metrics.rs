//! Per-topic Prometheus metrics with `tenant`, `namespace`, `topic` (and
//! `subscription`) labels, computed when `/metrics` is scraped from the
//! topics loaded on this broker: stored bytes and entries, producers, and
//! per subscription the backlog (entries), unacked messages and consumers.
//!
//! Promises: cardinality is bounded by `topics_loaded_max` (only loaded
//! topics are reported, a topic's series disappear when it unloads); a
//! scrape never waits on a topic: a subscription set busy at that instant is
//! skipped for that scrape (it is reported on the next one).

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGaugeVec, Opts};

use crate::topics::Topics;

const TOPIC_LABELS: [&str; 3] = ["tenant", "namespace", "topic"];
const SUB_LABELS: [&str; 4] = ["tenant", "namespace", "topic", "subscription"];

/// The collector; register it once in the broker's registry.
pub struct TopicCollector {
    topics: Arc<Topics>,
    storage_bytes: IntGaugeVec,
    entries: IntGaugeVec,
    producers: IntGaugeVec,
    backlog: IntGaugeVec,
    unacked: IntGaugeVec,
    consumers: IntGaugeVec,
    descs: Vec<Desc>,
}

impl std::fmt::Debug for TopicCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicCollector").finish_non_exhaustive()
    }
}

impl TopicCollector {
    /// A collector over `topics`.
    pub fn new(topics: Arc<Topics>) -> Result<Self, prometheus::Error> {
        let g = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels)
        };
        let storage_bytes = g(
            "cms_topic_storage_bytes",
            "Payload bytes stored in the topic's ledgers",
            &TOPIC_LABELS,
        )?;
        let entries = g(
            "cms_topic_entries",
            "Entries stored in the topic's ledgers",
            &TOPIC_LABELS,
        )?;
        let producers = g(
            "cms_topic_producers",
            "Producers connected to the topic",
            &TOPIC_LABELS,
        )?;
        let backlog = g(
            "cms_subscription_backlog_entries",
            "Unacknowledged entries after the subscription's mark-delete",
            &SUB_LABELS,
        )?;
        let unacked = g(
            "cms_subscription_unacked_messages",
            "Messages delivered and not acknowledged",
            &SUB_LABELS,
        )?;
        let consumers = g(
            "cms_subscription_consumers",
            "Consumers attached to the subscription",
            &SUB_LABELS,
        )?;
        let descs = [
            &storage_bytes,
            &entries,
            &producers,
            &backlog,
            &unacked,
            &consumers,
        ]
        .iter()
        .flat_map(|v| v.desc().into_iter().cloned())
        .collect();
        Ok(Self {
            topics,
            storage_bytes,
            entries,
            producers,
            backlog,
            unacked,
            consumers,
            descs,
        })
    }
}

impl Collector for TopicCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        for v in [
            &self.storage_bytes,
            &self.entries,
            &self.producers,
            &self.backlog,
            &self.unacked,
            &self.consumers,
        ] {
            v.reset();
        }
        for name in self.topics.loaded() {
            let Some(t) = self.topics.get_loaded(&name) else {
                continue;
            };
            let topic = name.to_string();
            let labels = [
                name.tenant.as_str(),
                name.namespace.as_str(),
                topic.as_str(),
            ];
            let list = t.ml.ledgers();
            let to_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            self.storage_bytes
                .with_label_values(&labels)
                .set(to_i64(list.total_size_bytes()));
            self.entries
                .with_label_values(&labels)
                .set(to_i64(list.total_entries()));
            self.producers
                .with_label_values(&labels)
                .set(i64::try_from(t.producer_count()).unwrap_or(i64::MAX));
            let Some(subs) = t.subscriptions.try_open_now() else {
                continue;
            };
            for sub in subs {
                let st = sub.stats();
                let l = [labels[0], labels[1], labels[2], st.name.as_str()];
                self.backlog
                    .with_label_values(&l)
                    .set(to_i64(st.msg_backlog));
                self.unacked
                    .with_label_values(&l)
                    .set(to_i64(st.dispatcher.unacked_messages));
                self.consumers
                    .with_label_values(&l)
                    .set(i64::try_from(st.dispatcher.consumers.len()).unwrap_or(i64::MAX));
            }
        }
        [
            &self.storage_bytes,
            &self.entries,
            &self.producers,
            &self.backlog,
            &self.unacked,
            &self.consumers,
        ]
        .iter()
        .flat_map(|v| v.collect())
        .collect()
    }
}
