//! Pulsar messaging features beyond the core path (issue 8) with the
//! official `pulsar-client` 3.13 against `cms-broker standalone` and cluster
//! mode (ZooKeeper + 3 bookies + broker as processes), through
//! the scripts of `tests/python/compat` (each prints one JSON verdict line):
//! Key_Shared spread, per-key order across joins and leaves, STICKY ranges;
//! partitioned topics, auto-created partitioned topics and pattern
//! subscriptions.
//!
//! The interpreter is `$CMS_TEST_PYTHON`, else `<repo>/.venv/bin/python`;
//! without one the tests fail naming the install command.

use cms_tests::cluster::{BrokerCluster, BrokerNode};
use cms_tests::pulsar_py::{ScriptRun, base_args, run, unique_topic};

/// Bound on one script run, in milliseconds.
const SCRIPT_TIMEOUT_MS: u64 = 120_000;

/// Runs `script` against `url` on a fresh topic named after `case`.
async fn case(url: &str, script: &str, case: &str, extra: &[String]) -> ScriptRun {
    let topic = unique_topic(case);
    let mut args = base_args(url, &topic, SCRIPT_TIMEOUT_MS);
    args.extend(extra.iter().cloned());
    let r = run(script, &args, SCRIPT_TIMEOUT_MS).await;
    eprintln!("{}: exit {:?}, verdict {}", r.command, r.code, r.json);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_key_shared_spread_order_joins_leaves_and_sticky_ranges() {
    let broker = BrokerNode::start_standalone(&[]).await;
    case(&broker.service_url(), "key_shared.py", "key-shared", &[])
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_partitioned_topics_auto_created_round_robin_keys_and_patterns() {
    let broker = BrokerNode::start_standalone(&[
        "--allow-auto-topic-creation-type=partitioned",
        "--default-num-partitions=3",
    ])
    .await;
    case(&broker.service_url(), "partitioned.py", "partitioned", &[])
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_key_shared_and_partitioned_topics() {
    let c = BrokerCluster::start(&[
        "--allow-auto-topic-creation-type=partitioned",
        "--default-num-partitions=3",
    ])
    .await;
    let url = c.broker.service_url();
    let runs = [
        case(&url, "partitioned.py", "cluster-partitioned", &[]).await,
        case(&url, "key_shared.py", "cluster-key-shared", &[]).await,
    ];
    for r in &runs {
        r.assert_ok();
    }
}
