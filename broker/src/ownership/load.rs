//! Broker registration data, load reports and the placement choice (pure
//! except [`sample_process`], which reads `/proc/self`).
//!
//! A broker's ephemeral node `/cms/brokers/<host:port>-<n>` holds a
//! [`Registration`]: its service and HTTP URLs and its latest [`LoadReport`],
//! rewritten every `load_report_interval_ms` and on every ownership change.
//!
//! Placement ([`choose_broker`]) is deliberately simple (issue 9 §6, no
//! shedding loop): each live, non-draining broker gets a score
//!
//! ```text
//! score = 2.0 * bundles + 1.0 * topics + 0.5 * connections
//!       + (msg_rate_in + msg_rate_out) / 1000 + cpu_percent / 2 + rss_mib / 100
//! ```
//!
//! (one owned bundle weighs as two loaded topics, 1000 msg/s as one topic, a
//! fully busy core as 50 topics, 100 MiB of memory as one topic). The
//! lowest score wins; brokers within [`SCORE_TOLERANCE`] of it (or 10 % of
//! it) count as equally loaded and the tie is broken by rendezvous hashing
//! of (bundle, broker id), so idle brokers share a burst of new bundles
//! instead of all of them landing on the first broker before load reports
//! catch up.

use serde::{Deserialize, Serialize};

use super::bundles::crc32_ieee;

/// Scores this close to the lowest count as a tie.
pub const SCORE_TOLERANCE: f64 = 1.0;

/// What a broker publishes about its load.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LoadReport {
    /// Bundles owned.
    pub bundles: u64,
    /// Topics loaded.
    pub topics: u64,
    /// Open client connections.
    pub connections: u64,
    /// Messages published per second (recent average).
    pub msg_rate_in: f64,
    /// Messages dispatched per second (recent average).
    pub msg_rate_out: f64,
    /// Process CPU use, percent of one core (recent average).
    pub cpu_percent: f64,
    /// Resident memory, MiB.
    pub memory_mib: f64,
    /// Wall clock of the report, ms since the epoch (informational).
    pub timestamp_ms: u64,
}

impl LoadReport {
    /// The placement score (lower is less loaded); see the module doc.
    pub fn score(&self) -> f64 {
        2.0 * self.bundles as f64
            + self.topics as f64
            + 0.5 * self.connections as f64
            + (self.msg_rate_in + self.msg_rate_out) / 1000.0
            + self.cpu_percent / 2.0
            + self.memory_mib / 100.0
    }
}

/// The content of `/cms/brokers/<id>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Registration {
    /// `pulsar://host:port` (advertised).
    pub service_url: String,
    /// `http://host:port` (advertised).
    pub web_service_url: String,
    /// `pulsar+ssl://host:port` when the broker's TLS port is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_url_tls: Option<String>,
    /// `https://host:port` when the broker's HTTPS port is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub web_service_url_tls: Option<String>,
    /// Cluster name.
    pub cluster: String,
    /// Shutting down: takes no new bundles.
    pub draining: bool,
    /// Latest load.
    pub load: LoadReport,
}

/// A live broker as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Its registration node name.
    pub id: String,
    /// What it registered.
    pub registration: Registration,
}

/// The broker that should own `bundle_key` (`tenant/ns/range`), or `None`
/// when no broker can take it (none live, all draining).
pub fn choose_broker<'a>(bundle_key: &str, candidates: &'a [Candidate]) -> Option<&'a Candidate> {
    let live: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| !c.registration.draining && !c.registration.service_url.is_empty())
        .collect();
    let min = live
        .iter()
        .map(|c| c.registration.load.score())
        .fold(f64::INFINITY, f64::min);
    if !min.is_finite() {
        return None;
    }
    let limit = min + SCORE_TOLERANCE.max(min * 0.1);
    live.into_iter()
        .filter(|c| c.registration.load.score() <= limit)
        .max_by_key(|c| (rendezvous(bundle_key, &c.id), c.id.clone()))
}

fn rendezvous(bundle_key: &str, broker_id: &str) -> u32 {
    let mut s = String::with_capacity(bundle_key.len() + broker_id.len() + 1);
    s.push_str(bundle_key);
    s.push('|');
    s.push_str(broker_id);
    // Mix so that similar keys do not give correlated winners.
    let h = crc32_ieee(s.as_bytes());
    h.wrapping_mul(0x9e37_79b1).rotate_left(13) ^ h
}

/// CPU time (ticks) and resident memory of this process, from `/proc/self`;
/// `None` where `/proc` is not available.
pub fn sample_process() -> Option<(u64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields overall (11th and 12th after the name).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let rss_pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some((utime + stime, rss_pages * 4096.0 / (1024.0 * 1024.0)))
}

/// Clock ticks per second of `/proc/self/stat` (Linux's USER_HZ).
pub const CLOCK_TICKS_PER_SEC: f64 = 100.0;

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: &str, load: LoadReport) -> Candidate {
        Candidate {
            id: id.into(),
            registration: Registration {
                service_url: format!("pulsar://{id}"),
                web_service_url: format!("http://{id}"),
                cluster: "c".into(),
                draining: false,
                load,
                ..Registration::default()
            },
        }
    }

    #[test]
    fn score_weights() {
        let r = LoadReport {
            bundles: 1,
            topics: 3,
            connections: 4,
            msg_rate_in: 1500.0,
            msg_rate_out: 500.0,
            cpu_percent: 10.0,
            memory_mib: 200.0,
            timestamp_ms: 0,
        };
        assert!((r.score() - (2.0 + 3.0 + 2.0 + 2.0 + 5.0 + 2.0)).abs() < 1e-9);
    }

    #[test]
    fn least_loaded_wins() {
        let busy = LoadReport {
            topics: 50,
            ..Default::default()
        };
        let cands = [
            cand("a", busy.clone()),
            cand("b", LoadReport::default()),
            cand("c", busy),
        ];
        for i in 0..20 {
            assert_eq!(choose_broker(&format!("t/ns/{i}"), &cands).unwrap().id, "b");
        }
    }

    #[test]
    fn draining_and_unusable_brokers_are_skipped() {
        let mut d = cand("a", LoadReport::default());
        d.registration.draining = true;
        let mut no_url = cand("b", LoadReport::default());
        no_url.registration.service_url.clear();
        assert_eq!(choose_broker("k", &[d.clone(), no_url.clone()]), None);
        let busy = cand(
            "c",
            LoadReport {
                topics: 100,
                ..Default::default()
            },
        );
        assert_eq!(choose_broker("k", &[d, no_url, busy]).unwrap().id, "c");
        assert_eq!(choose_broker("k", &[]), None);
    }

    #[test]
    fn equal_brokers_share_bundles_deterministically() {
        let cands = [
            cand("127.0.0.1:1-0001", LoadReport::default()),
            cand("127.0.0.2:1-0002", LoadReport::default()),
        ];
        let mut per = std::collections::HashMap::new();
        for i in 0..64 {
            let key = format!("public/default/0x{:08x}_x", i);
            let first = choose_broker(&key, &cands).unwrap().id.clone();
            // Same inputs, same answer (any broker computes the same choice).
            let rev = [cands[1].clone(), cands[0].clone()];
            assert_eq!(choose_broker(&key, &rev).unwrap().id, first);
            *per.entry(first).or_insert(0) += 1;
        }
        assert_eq!(per.len(), 2, "{per:?}");
        assert!(per.values().all(|&n| n >= 16), "{per:?}");
    }

    #[test]
    fn registration_json_is_camel_case_and_tolerant() {
        let r: Registration =
            serde_json::from_str(r#"{"serviceUrl":"pulsar://h:1","webServiceUrl":"http://h:2"}"#)
                .unwrap();
        assert_eq!(r.service_url, "pulsar://h:1");
        assert_eq!(r.service_url_tls, None);
        assert_eq!(r.load, LoadReport::default());
        let v = serde_json::to_value(&r).unwrap();
        assert!(v["load"]["msgRateIn"].is_number());
        assert!(v.get("serviceUrlTls").is_none());
        let tls = Registration {
            service_url_tls: Some("pulsar+ssl://h:3".into()),
            web_service_url_tls: Some("https://h:4".into()),
            ..r
        };
        let v = serde_json::to_value(&tls).unwrap();
        assert_eq!(v["serviceUrlTls"], "pulsar+ssl://h:3");
        assert_eq!(v["webServiceUrlTls"], "https://h:4");
    }

    #[test]
    fn process_sample_reads_proc() {
        if std::path::Path::new("/proc/self/stat").exists() {
            let (_, rss) = sample_process().unwrap();
            assert!(rss > 0.0);
        }
    }
}
