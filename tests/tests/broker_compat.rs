//! Apache Pulsar client compatibility: the official `pulsar-client` 3.13
//! (C++ client 4.2) against `cms-broker`, unchanged, through the scripts of
//! `tests/python/compat` (each one case, one JSON verdict line).
//!
//! Against standalone: every subscription type, keys and properties,
//! batching with each compression type, readers, consumer seek, negative acks and
//! redelivery counts with ack timeouts, the client's dead-letter policy, the
//! message size limit, resuming from the cursor (also across a broker
//! restart), and a `kill -9` of the broker in the middle of a
//! consume-and-ack run judged by the history checker. Against cluster mode
//! (ZooKeeper + 3 bookies + broker as processes): subscription types,
//! batching, resume, and the `kill -9` run.
//!
//! The interpreter is `$CMS_TEST_PYTHON`, else `<repo>/.venv/bin/python`;
//! without one the tests fail naming the install command.

use cms_tests::cluster::{BrokerCluster, BrokerNode};
use cms_tests::harness::wait::eventually;
use cms_tests::history::{CheckOptions, EventKind, SendOp, check};
use cms_tests::pulsar_py::{
    ScriptRun, StampedFault, base_args, client_resends_across, count_lines_containing,
    load_history_with_faults, run, spawn, unique_topic,
};

/// Bound on one ordinary script run, in milliseconds.
const SCRIPT_TIMEOUT_MS: u64 = 60_000;

/// Bound on the `kill -9` run, in milliseconds.
const KILL_RUN_TIMEOUT_MS: u64 = 90_000;

/// Messages of the `kill -9` run, their send rate, and how many acks the
/// consumer must have logged before the broker is killed.
const KILL_RUN_MESSAGES: usize = 600;
const KILL_RUN_RATE_PER_S: usize = 150;
const KILL_RUN_ACKS_BEFORE_KILL: usize = 150;

/// The fault event of the `kill -9` runs.
const KILL_FAULT: &str = "kill -9 of the broker";

/// The compression types of the batching case (names of `batch_compression.py`).
const COMPRESSIONS: [&str; 5] = ["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"];

/// Runs `script` against `url` on a fresh topic named after `case`.
async fn case(url: &str, script: &str, case: &str, extra: &[String]) -> ScriptRun {
    let topic = unique_topic(case);
    let mut args = base_args(url, &topic, SCRIPT_TIMEOUT_MS);
    args.extend(extra.iter().cloned());
    let r = run(script, &args, SCRIPT_TIMEOUT_MS).await;
    eprintln!("{}: exit {:?}, verdict {}", r.command, r.code, r.json);
    r
}

/// Fails with every failed run's explanation (all runs of a group are made
/// before judging, so one report shows every failing case).
fn assert_all_ok(runs: &[ScriptRun]) {
    let failed: Vec<&ScriptRun> = runs.iter().filter(|r| !r.ok()).collect();
    for r in &failed {
        eprintln!(
            "FAILED {} (exit {:?}): {}\n----- stderr tail -----\n{}\n",
            r.command,
            r.code,
            r.json,
            r.stderr_tail(40)
        );
    }
    if let Some(first) = failed.first() {
        let names: Vec<&str> = failed.iter().map(|r| r.command.as_str()).collect();
        eprintln!("{} of {} runs failed: {names:?}", failed.len(), runs.len());
        first.assert_ok();
    }
}

async fn subscription_types(url: &str) -> Vec<ScriptRun> {
    vec![
        case(url, "sub_exclusive.py", "exclusive", &[]).await,
        case(url, "sub_shared.py", "shared", &[]).await,
        case(url, "sub_failover.py", "failover", &[]).await,
    ]
}

async fn batching_with_each_compression(url: &str) -> Vec<ScriptRun> {
    let mut runs = Vec::new();
    for c in COMPRESSIONS {
        let name = format!("batch-{}", c.to_lowercase());
        runs.push(
            case(
                url,
                "batch_compression.py",
                &name,
                &[format!("--compression={c}")],
            )
            .await,
        );
    }
    runs
}

/// Resume from the cursor in one script (new connection), then again with
/// `between` (e.g. a broker restart) between the two phases.
async fn resume_from_cursor<F, Fut>(url: &str, between: F) -> Vec<ScriptRun>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut runs = vec![case(url, "resume_cursor.py", "resume", &[]).await];
    let topic = unique_topic("resume-restart");
    let args = |phase: &str| {
        let mut a = base_args(url, &topic, SCRIPT_TIMEOUT_MS);
        a.push(format!("--phase={phase}"));
        a
    };
    let first = run("resume_cursor.py", &args("first"), SCRIPT_TIMEOUT_MS).await;
    let first_ok = first.ok();
    runs.push(first);
    if first_ok {
        between().await;
        runs.push(run("resume_cursor.py", &args("rest"), SCRIPT_TIMEOUT_MS).await);
    }
    runs
}

/// The `kill -9` run: a consume-and-ack script writes its history while
/// the broker is killed and restarted under it; the history checker then
/// demands that every acked send was received (nothing acknowledged lost,
/// nothing unacked skipped), with redeliveries only where the kill explains
/// them, in order.
async fn kill_9_mid_consume_and_ack(broker: &mut BrokerNode, label: &str) {
    let url = broker.service_url();
    let topic = unique_topic(&format!("kill9-{label}"));
    let full_topic = format!("persistent://public/default/{topic}");
    let history = broker.process.dir().join(format!("history-{topic}.jsonl"));
    let mut args = base_args(&url, &topic, KILL_RUN_TIMEOUT_MS);
    args.extend([
        format!("--history={}", history.display()),
        format!("--count={KILL_RUN_MESSAGES}"),
        format!("--rate={KILL_RUN_RATE_PER_S}"),
        "--run-s=70".to_string(),
        "--sub=kill-run".to_string(),
    ]);
    let child = spawn("kill_run.py", &args);
    eventually(
        &format!("the consumer logged {KILL_RUN_ACKS_BEFORE_KILL} acks"),
        30_000,
        || async {
            count_lines_containing(&history, "\"event\": \"ack\"") >= KILL_RUN_ACKS_BEFORE_KILL
        },
    )
    .await;
    let killed = StampedFault::now(KILL_FAULT);
    broker.kill_and_restart().await;
    let restarted = StampedFault::now("broker restarted and ready");

    let result = child.finish(KILL_RUN_TIMEOUT_MS).await;
    result.assert_ok();
    let events = load_history_with_faults(&history, &[killed, restarted])
        .unwrap_or_else(|e| panic!("reading the history: {e}"));
    let events = client_resends_across(events, KILL_FAULT);

    // The kill really landed mid-run: acks before it, acked sends after it.
    let kill_at = events
        .iter()
        .position(|e| matches!(&e.kind, EventKind::Fault(_)))
        .unwrap_or_else(|| panic!("no fault event in the merged history"));
    let acks_before = events[..kill_at]
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Ack(_)))
        .count();
    let sends_acked_after = events[kill_at..]
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::Send(s) if matches!(s.op, SendOp::Acked { .. })))
        .count();
    assert!(
        acks_before > 0 && sends_acked_after > 0,
        "the kill did not land mid-run: {acks_before} acks before it, \
         {sends_acked_after} acked sends after it (history {})",
        history.display()
    );

    let report = check(
        &events,
        &CheckOptions::at_least_once().require_complete(&full_topic, "kill-run"),
    );
    assert!(
        report.is_ok(),
        "history {} violates the checker:\n{report}",
        history.display()
    );
    eprintln!(
        "kill -9 run ({label}): {} events, {acks_before} acks before the kill, {sends_acked_after} sends acked after; verdict {}",
        events.len(),
        result.json
    );
}

// ------------------------------------------------------------- standalone

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_subscription_types() {
    let broker = BrokerNode::start_standalone(&[]).await;
    assert_all_ok(&subscription_types(&broker.service_url()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_keys_and_properties_round_trip() {
    let broker = BrokerNode::start_standalone(&[]).await;
    case(&broker.service_url(), "keys_properties.py", "keys", &[])
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_batching_with_each_compression() {
    let broker = BrokerNode::start_standalone(&[]).await;
    assert_all_ok(&batching_with_each_compression(&broker.service_url()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_readers_from_earliest_latest_and_a_stored_id() {
    let broker = BrokerNode::start_standalone(&[]).await;
    case(&broker.service_url(), "readers.py", "reader", &[])
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_consumer_seek_rewinds() {
    let broker = BrokerNode::start_standalone(&[]).await;
    case(&broker.service_url(), "consumer_seek.py", "seek", &[])
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_negative_acks_and_ack_timeout_redeliver() {
    let broker = BrokerNode::start_standalone(&[]).await;
    case(&broker.service_url(), "nack_redelivery.py", "nack", &[])
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_dead_letter_policy() {
    let broker = BrokerNode::start_standalone(&[]).await;
    case(&broker.service_url(), "dead_letter.py", "dlq", &[])
        .await
        .assert_ok();
}

/// The size case against a broker started with `flags` whose limit is `max`.
async fn size_limit(flags: &[&str], max: usize) {
    let broker = BrokerNode::start_standalone(flags).await;
    case(
        &broker.service_url(),
        "size_limit.py",
        "size",
        &[format!("--max-bytes={max}")],
    )
    .await
    .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_message_size_limit_configured() {
    size_limit(&["--message-bytes-max=1048576"], 1_048_576).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_message_size_limit_default() {
    size_limit(&[], cms_broker::config::MESSAGE_BYTES_MAX_DEFAULT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_consumers_resume_from_their_cursor() {
    let mut broker = BrokerNode::start_standalone(&[]).await;
    let url = broker.service_url();
    let broker = &mut broker;
    assert_all_ok(&resume_from_cursor(&url, || broker.restart()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_kill_9_mid_consume_and_ack_loses_nothing() {
    let mut broker = BrokerNode::start_standalone(&[]).await;
    kill_9_mid_consume_and_ack(&mut broker, "standalone").await;
}

// ---------------------------------------------------------------- cluster

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_subscriptions_batching_and_resume() {
    let mut c = BrokerCluster::start(&[]).await;
    let url = c.broker.service_url();
    let mut runs = subscription_types(&url).await;
    runs.extend(batching_with_each_compression(&url).await);
    let broker = &mut c.broker;
    runs.extend(resume_from_cursor(&url, || broker.restart()).await);
    assert_all_ok(&runs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_kill_9_mid_consume_and_ack_loses_nothing() {
    let mut c = BrokerCluster::start(&[]).await;
    kill_9_mid_consume_and_ack(&mut c.broker, "cluster").await;
}
