//! Delivery features of issue 8 (items 4-6) with the official
//! `pulsar-client` 3.13 against `cms-broker standalone`, through the scripts
//! of `tests/python/compat` (each prints one JSON verdict line): delayed
//! delivery (`deliver_after` / `deliver_at`, honoured on Shared only, held
//! across a broker restart); batch-index acks (only the unacked messages of
//! a batch come back, also after a restart); seek by publish time on
//! consumers and readers;
//! chunked messages larger than the broker's max message size. Standalone,
//! and all of them once more in cluster mode (ZooKeeper + 3 bookies +
//! broker as processes).
//!
//! The interpreter is `$CMS_TEST_PYTHON`, else `<repo>/.venv/bin/python`;
//! without one the tests fail naming the install command.

use cms_tests::cluster::{BrokerCluster, BrokerNode};
use cms_tests::pulsar_py::{ScriptRun, base_args, run, unique_topic};

/// Bound on one script run, in milliseconds.
const SCRIPT_TIMEOUT_MS: u64 = 120_000;

/// Runs `script` against `url` on `topic` with `extra` arguments.
async fn run_on(url: &str, script: &str, topic: &str, extra: &[String]) -> ScriptRun {
    let mut args = base_args(url, topic, SCRIPT_TIMEOUT_MS);
    args.extend(extra.iter().cloned());
    let r = run(script, &args, SCRIPT_TIMEOUT_MS).await;
    eprintln!("{}: exit {:?}, verdict {}", r.command, r.code, r.json);
    r
}

/// Runs `script` against `url` on a fresh topic named after `case`.
async fn case(url: &str, script: &str, case: &str, extra: &[String]) -> ScriptRun {
    run_on(url, script, &unique_topic(case), extra).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_arrive_no_earlier_than_asked_and_survive_a_restart() {
    let mut broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    case(&url, "delayed_delivery.py", "delayed", &[])
        .await
        .assert_ok();

    let topic = unique_topic("delayed-restart");
    run_on(
        &url,
        "delayed_delivery.py",
        &topic,
        &["--phase=send".into()],
    )
    .await
    .assert_ok();
    broker.restart().await;
    let url = broker.service_url();
    run_on(
        &url,
        "delayed_delivery.py",
        &topic,
        &["--phase=receive".into()],
    )
    .await
    .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seek_by_publish_time_on_consumers_and_readers() {
    let broker = BrokerNode::start_standalone(&[]).await;
    case(&broker.service_url(), "seek_time.py", "seek-time", &[])
        .await
        .assert_ok();
}

/// The broker's max message size in the chunking case (small, so the
/// chunked messages stay small too).
const CHUNK_CASE_MESSAGE_BYTES_MAX: usize = 100 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_messages_larger_than_the_max_size_are_reassembled() {
    let flag = format!("--message-bytes-max={CHUNK_CASE_MESSAGE_BYTES_MAX}");
    let broker = BrokerNode::start_standalone(&[flag.as_str()]).await;
    case(
        &broker.service_url(),
        "chunked.py",
        "chunked",
        &[format!("--max-bytes={CHUNK_CASE_MESSAGE_BYTES_MAX}")],
    )
    .await
    .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_index_acks_redeliver_only_the_unacked_messages_of_a_batch() {
    let mut broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    case(&url, "batch_index_ack.py", "batch-index", &[])
        .await
        .assert_ok();

    // The acked indexes are in the cursor snapshot: they survive a restart.
    let topic = unique_topic("batch-index-restart");
    run_on(
        &url,
        "batch_index_ack.py",
        &topic,
        &["--phase=first".into()],
    )
    .await
    .assert_ok();
    broker.restart().await;
    let url = broker.service_url();
    run_on(&url, "batch_index_ack.py", &topic, &["--phase=rest".into()])
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_delayed_batch_index_seek_by_time_and_chunked() {
    let flag = format!("--message-bytes-max={CHUNK_CASE_MESSAGE_BYTES_MAX}");
    let c = BrokerCluster::start(&[flag.as_str()]).await;
    let url = c.broker.service_url();
    let runs = [
        case(&url, "delayed_delivery.py", "cluster-delayed", &[]).await,
        case(&url, "batch_index_ack.py", "cluster-batch-index", &[]).await,
        case(&url, "seek_time.py", "cluster-seek-time", &[]).await,
        case(
            &url,
            "chunked.py",
            "cluster-chunked",
            &[format!("--max-bytes={CHUNK_CASE_MESSAGE_BYTES_MAX}")],
        )
        .await,
    ];
    for r in &runs {
        r.assert_ok();
    }
}
