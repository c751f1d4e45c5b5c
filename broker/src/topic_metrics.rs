//! Per-topic Prometheus metrics with `tenant`, `namespace`, `topic` (and
//! `subscription`) labels, computed when `/metrics` is scraped from the
//! topics loaded on this broker: stored bytes and entries, producers,
//! messages and bytes in and out since the topic was loaded here (counters
//! that restart when a topic moves, which `rate()` treats as a reset), and
//! per subscription the backlog (entries), unacked messages and consumers.
//!
//! With `metrics_topic_level` off the same names are summed per namespace
//! (labels tenant, namespace only; the subscription series become the sums
//! over the namespace's subscriptions), as Pulsar does without
//! `exposeTopicLevelMetricsInPrometheus`.
//!
//! Promises: cardinality is bounded by `topics_loaded_max` (only loaded
//! topics are reported, a topic's series disappear when it unloads), or by
//! the namespaces with a loaded topic when topic level is off; a
//! scrape never waits on a topic: a subscription set busy at that instant is
//! skipped for that scrape (it is reported on the next one).

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGaugeVec, Opts};

use crate::topics::Topics;

const TOPIC_LABELS: [&str; 3] = ["tenant", "namespace", "topic"];
const SUB_LABELS: [&str; 4] = ["tenant", "namespace", "topic", "subscription"];
const NS_LABELS: [&str; 2] = ["tenant", "namespace"];

/// The collector; register it once in the broker's registry.
pub struct TopicCollector {
    topics: Arc<Topics>,
    topic_level: bool,
    /// One scrape at a time: a scrape resets the series and adds to them.
    scrape: std::sync::Mutex<()>,
    storage_bytes: IntGaugeVec,
    entries: IntGaugeVec,
    producers: IntGaugeVec,
    backlog: IntGaugeVec,
    unacked: IntGaugeVec,
    consumers: IntGaugeVec,
    /// Messages in, bytes in, messages out, bytes out.
    traffic: [IntCounterVec; 4],
    descs: Vec<Desc>,
}

impl std::fmt::Debug for TopicCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicCollector").finish_non_exhaustive()
    }
}

impl TopicCollector {
    /// A collector over `topics`; per topic and subscription when
    /// `topic_level`, else per namespace.
    pub fn new(topics: Arc<Topics>, topic_level: bool) -> Result<Self, prometheus::Error> {
        let (topic_labels, sub_labels): (&[&str], &[&str]) = if topic_level {
            (&TOPIC_LABELS, &SUB_LABELS)
        } else {
            (&NS_LABELS, &NS_LABELS)
        };
        let g = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels)
        };
        let storage_bytes = g(
            "cms_topic_storage_bytes",
            "Payload bytes stored in the topic's ledgers",
            topic_labels,
        )?;
        let entries = g(
            "cms_topic_entries",
            "Entries stored in the topic's ledgers",
            topic_labels,
        )?;
        let producers = g(
            "cms_topic_producers",
            "Producers connected to the topic",
            topic_labels,
        )?;
        let backlog = g(
            "cms_subscription_backlog_entries",
            "Unacknowledged entries after the subscription's mark-delete",
            sub_labels,
        )?;
        let unacked = g(
            "cms_subscription_unacked_messages",
            "Messages delivered and not acknowledged",
            sub_labels,
        )?;
        let consumers = g(
            "cms_subscription_consumers",
            "Consumers attached to the subscription",
            sub_labels,
        )?;
        let c = |name: &str, help: &str| IntCounterVec::new(Opts::new(name, help), topic_labels);
        let traffic = [
            c(
                "cms_topic_messages_in_total",
                "Messages published to the topic since it was loaded here",
            )?,
            c(
                "cms_topic_bytes_in_total",
                "Entry bytes published to the topic since it was loaded here",
            )?,
            c(
                "cms_topic_messages_out_total",
                "Messages delivered from the topic since it was loaded here",
            )?,
            c(
                "cms_topic_bytes_out_total",
                "Entry bytes delivered from the topic since it was loaded here",
            )?,
        ];
        let mut descs: Vec<Desc> = [
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
        descs.extend(traffic.iter().flat_map(|v| v.desc().into_iter().cloned()));
        Ok(Self {
            topics,
            topic_level,
            scrape: std::sync::Mutex::new(()),
            storage_bytes,
            entries,
            producers,
            backlog,
            unacked,
            consumers,
            traffic,
            descs,
        })
    }
}

impl Collector for TopicCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _one_scrape = self
            .scrape
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
        for v in &self.traffic {
            v.reset();
        }
        for name in self.topics.loaded() {
            let Some(t) = self.topics.get_loaded(&name) else {
                continue;
            };
            let topic = name.to_string();
            let labels: &[&str] = if self.topic_level {
                &[
                    name.tenant.as_str(),
                    name.namespace.as_str(),
                    topic.as_str(),
                ]
            } else {
                &[name.tenant.as_str(), name.namespace.as_str()]
            };
            let list = t.ml.ledgers();
            let to_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            // `add`, not `set`: per namespace, every topic adds its share
            // (per topic, each series is added to once after the reset).
            self.storage_bytes
                .with_label_values(labels)
                .add(to_i64(list.total_size_bytes()));
            self.entries
                .with_label_values(labels)
                .add(to_i64(list.total_entries()));
            self.producers
                .with_label_values(labels)
                .add(i64::try_from(t.producer_count()).unwrap_or(i64::MAX));
            let n = t.counters.counts();
            for (v, x) in self
                .traffic
                .iter()
                .zip([n.msgs_in, n.bytes_in, n.msgs_out, n.bytes_out])
            {
                v.with_label_values(labels).inc_by(x);
            }
            let Some(subs) = t.subscriptions.try_open_now() else {
                continue;
            };
            for sub in subs {
                let st = sub.stats();
                let topic_sub = [labels[0], labels[1], topic.as_str(), st.name.as_str()];
                let l: &[&str] = if self.topic_level { &topic_sub } else { labels };
                self.backlog
                    .with_label_values(l)
                    .add(to_i64(st.msg_backlog));
                self.unacked
                    .with_label_values(l)
                    .add(to_i64(st.dispatcher.unacked_messages));
                self.consumers
                    .with_label_values(l)
                    .add(i64::try_from(st.dispatcher.consumers.len()).unwrap_or(i64::MAX));
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
        .chain(self.traffic.iter().flat_map(|v| v.collect()))
        .collect()
    }
}
