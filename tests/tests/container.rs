//! The container image (`deploy/docker`, issue 15 item 1), run for real on
//! the machine's Docker Engine: `cms:dev` is built from the binaries of the
//! current build on the locally made base image, then
//! - `cms-broker standalone` in a container answers a publish and a consume
//!   from the official Python client;
//! - a cluster in containers on an `--internal` network of its own
//!   (ZooKeeper from `cms-zookeeper:bookworm`, a one-shot `init-cluster`,
//!   4 bookies, 2 brokers, each advertising its container address) keeps
//!   every acknowledged message through `docker kill` of a bookie of the
//!   topic's ensemble and of the broker owning the topic: the client fails
//!   over to the other broker, and the history checker judges the run.
//!
//! No Docker Engine or no base images is a failure naming the fix (start
//! dockerd; `scripts/make-base-images`), never a skip. Containers and the
//! network are removed by a guard, also on failure. The host reaches the
//! containers on the internal bridge through the bridge's gateway address.

use cms_bookie::client::metadata::ensemble_for_entry;
use cms_bookie::metadata::layout::Layout;
use cms_tests::cluster::{
    PYTHON_TIMEOUT_MS, ROOT, init_store, ledger_client, ledger_client_options, run_python,
};
use cms_tests::docker::{
    BASE_IMAGE, Container, Scope, TEST_IMAGE, ZOOKEEPER_IMAGE, build_test_image, docker,
    require_engine, require_images,
};
use cms_tests::harness::wait::eventually;
use cms_tests::harness::zookeeper::four_letter;
use cms_tests::history::{CheckOptions, EventKind, SendOp, check};
use cms_tests::pulsar_py::{
    StampedFault, base_args, client_resends_across, count_lines_containing,
    load_history_with_faults, spawn, unique_topic,
};

/// Bound on one container becoming ready, in milliseconds.
const READY_TIMEOUT_MS: u64 = 60_000;
/// Bound on the kill run, in milliseconds.
const KILL_RUN_TIMEOUT_MS: u64 = 100_000;
/// Messages of the kill run, their send rate, and the acks logged before the kills.
const KILL_RUN_MESSAGES: usize = 500;
const KILL_RUN_RATE_PER_S: usize = 100;
const KILL_RUN_ACKS_BEFORE_KILL: usize = 100;
/// The fault event of the kill run.
const KILL_FAULT: &str = "docker kill of a bookie of the ensemble and of the owning broker";
/// The event that ends the kill: the dead broker's ZooKeeper session expired,
/// so its topics are free for the survivor. Acks the client sent into the
/// dead connection after the kill are lost; the redeliveries they cause come
/// after this (the checker's redelivery window opens here too).
const EXPIRED_FAULT: &str = "the killed broker's session expired; its topics are free";

/// Everything a container test needs before it starts, loudly.
fn prerequisites() {
    require_engine();
    require_images(&[BASE_IMAGE, ZOOKEEPER_IMAGE]);
    build_test_image();
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_in_a_container_serves_the_python_client() {
    prerequisites();
    let scope = Scope::with_internal_network("standalone");
    // The image's default command is `cms-broker standalone`. The read-only
    // disk threshold goes near 1.0 through the environment, as the harness's
    // flag does: the container's data lives on the shared host disk, which
    // was 96 % full on one CI machine (the default 0.95 made the in-process
    // bookie read-only and the broker never started).
    let broker = scope
        .run(
            "standalone",
            &strings(&[
                "-e",
                "CMS_ADVERTISE=container-ip",
                "-e",
                "CMS_BROKER_STANDALONE_DISK_USAGE_THRESHOLD=0.999",
                TEST_IMAGE,
            ]),
        )
        .await;
    scope.wait_ready(&broker, 8080, READY_TIMEOUT_MS).await;

    // The image runs as the non-root user 10001.
    let uid = docker(&["exec", &broker.id, "id", "-u"]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(uid, "10001", "the container's process user");

    let url = format!("pulsar://{}:6650", broker.ip);
    let count = 50;
    let run = run_python(
        "produce_consume.py",
        &[
            "--url",
            &url,
            "--topic",
            "container-standalone",
            "--count",
            &count.to_string(),
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(
        run.ok,
        "publish + consume against the container failed: {} / {}",
        run.json, run.stderr
    );
    let received: Vec<String> = run.json["received"]
        .as_array()
        .unwrap_or_else(|| panic!("no received list in {}", run.json))
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_string())
        .collect();
    let sent: Vec<String> = (0..count).map(|i| format!("msg-{i}")).collect();
    assert_eq!(received, sent, "consumed back what was published, in order");
    // Nothing went wrong on the way: no ERROR line in the broker's log.
    let log = scope.logs_tail(&broker, 10_000);
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(
        errors.is_empty(),
        "ERROR lines in the container's log:\n{}",
        errors.join("\n")
    );
}

/// A cluster's containers.
struct DockerCluster {
    zk: Container,
    bookies: Vec<Container>,
    brokers: Vec<Container>,
}

async fn start_cluster(scope: &Scope) -> DockerCluster {
    let zk = scope
        .run(
            "zk",
            &strings(&[
                "-e",
                "ZOO_TICK_TIME=1000",
                "-e",
                "ZOO_MAX_SESSION_TIMEOUT=20000",
                ZOOKEEPER_IMAGE,
            ]),
        )
        .await;
    let zk_addr = std::net::SocketAddr::from((zk.ip, 2181));
    eventually(
        "ZooKeeper in its container answers imok",
        READY_TIMEOUT_MS,
        || async move { four_letter(zk_addr, "ruok").await.as_deref() == Some("imok") },
    )
    .await;
    let metadata = format!("--metadata-url=zk://{}:2181", zk.name);

    let init = scope
        .run_once(&strings(&[
            TEST_IMAGE,
            "cms-broker",
            "init-cluster",
            &metadata,
            &format!("--metadata-root={ROOT}"),
            "--cluster-name=test",
        ]))
        .await
        .unwrap_or_else(|e| panic!("init-cluster in a container: {e}"));
    assert!(init.contains("public/default"), "init-cluster said: {init}");

    let mut bookies = Vec::new();
    for i in 1..=4 {
        let id = format!("bk{i}");
        bookies.push(
            scope
                .run(
                    &id,
                    &strings(&[
                        "-e",
                        "CMS_ADVERTISE=container-ip",
                        TEST_IMAGE,
                        "cms-bookie",
                        "serve",
                        &metadata,
                        "--metadata-session-timeout-ms=4000",
                        &format!("--bookie-id={id}"),
                        "--journal-file-bytes=16777216",
                        "--entry-log-bytes-max=16777216",
                        "--write-cache-bytes-max=33554432",
                        "--read-cache-bytes-max=16777216",
                        "--reserved-bytes=1048576",
                        "--disk-usage-threshold=0.999",
                        "--disk-usage-lwm=0.998",
                    ]),
                )
                .await,
        );
    }
    for b in &bookies {
        scope.wait_ready(b, 8000, READY_TIMEOUT_MS).await;
    }
    let mut brokers = Vec::new();
    for i in 1..=2 {
        brokers.push(
            scope
                .run(
                    &format!("broker{i}"),
                    &strings(&[
                        "-e",
                        "CMS_ADVERTISE=container-ip",
                        TEST_IMAGE,
                        "cms-broker",
                        "serve",
                        &metadata,
                        &format!("--metadata-root={ROOT}"),
                        "--metadata-session-timeout-ms=4000",
                    ]),
                )
                .await,
        );
    }
    for b in &brokers {
        scope.wait_ready(b, 8080, READY_TIMEOUT_MS).await;
    }
    // The admin CLI in the image reaches a broker by its name on the network.
    let tenants = scope
        .run_once(&strings(&[
            TEST_IMAGE,
            "cms-admin",
            "--url",
            &format!("http://{}:8080", brokers[0].name),
            "tenants",
            "list",
        ]))
        .await
        .unwrap_or_else(|e| panic!("cms-admin tenants list in a container: {e}"));
    assert!(
        tenants.contains("public"),
        "cms-admin tenants list said: {tenants}"
    );
    DockerCluster {
        zk,
        bookies,
        brokers,
    }
}

/// The broker of `brokers` owning `topic` (HTTP lookup through the first,
/// redirects followed).
async fn owner_of(brokers: &[Container], topic: &str) -> Container {
    let client = cms_tests::harness::http::client();
    let url = format!(
        "http://{}:8080/lookup/v2/topic/persistent/public/default/{topic}",
        brokers[0].ip
    );
    let answer: serde_json::Value = client
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"));
    let broker_url = answer["brokerUrl"].as_str().unwrap_or_default();
    brokers
        .iter()
        .find(|b| broker_url == format!("pulsar://{}:6650", b.ip))
        .cloned()
        .unwrap_or_else(|| panic!("lookup of {topic} answered {answer}, not one of our brokers"))
}

/// The ledger and entry of the last acknowledged send in the history so far.
fn last_acked_position(history: &std::path::Path) -> (u64, i64) {
    let text = std::fs::read_to_string(history)
        .unwrap_or_else(|e| panic!("reading {}: {e}", history.display()));
    text.lines()
        .rev()
        .filter(|l| l.contains("\"acked\""))
        .find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            let id = &v["message_id"];
            Some((id["ledger_id"].as_u64()?, id["entry_id"].as_i64()?))
        })
        .unwrap_or_else(|| panic!("no acked send in {}", history.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_in_containers_keeps_acked_messages_through_docker_kill() {
    prerequisites();
    let scope = Scope::with_internal_network("cluster");
    let cluster = start_cluster(&scope).await;

    let topic = unique_topic("container-kill");
    let full_topic = format!("persistent://public/default/{topic}");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let history = dir.path().join("history.jsonl");
    // Both brokers in the service URL: the client fails over to the survivor.
    let url = format!(
        "pulsar://{}:6650,{}:6650",
        cluster.brokers[0].ip, cluster.brokers[1].ip
    );
    let mut args = base_args(&url, &topic, KILL_RUN_TIMEOUT_MS);
    args.extend([
        format!("--history={}", history.display()),
        format!("--count={KILL_RUN_MESSAGES}"),
        format!("--rate={KILL_RUN_RATE_PER_S}"),
        "--run-s=85".to_string(),
        "--sub=kill-run".to_string(),
    ]);
    let child = spawn("kill_run.py", &args);
    eventually(
        &format!("the consumer logged {KILL_RUN_ACKS_BEFORE_KILL} acks"),
        60_000,
        || async {
            count_lines_containing(&history, "\"event\": \"ack\"") >= KILL_RUN_ACKS_BEFORE_KILL
        },
    )
    .await;

    // Which bookie to kill: one of the current ledger's ensemble.
    let (ledger_id, entry_id) = last_acked_position(&history);
    let zk_connect = format!("{}:2181", cluster.zk.ip);
    let ledgers = ledger_client(&zk_connect, ledger_client_options()).await;
    let md = ledgers
        .ledger_metadata(ledger_id)
        .await
        .unwrap_or_else(|e| panic!("metadata of ledger {ledger_id}: {e}"));
    let ensemble: Vec<String> = ensemble_for_entry(&md, entry_id)
        .unwrap_or_else(|| panic!("no ensemble for entry {entry_id} of ledger {ledger_id}"))
        .to_vec();
    let bookie = cluster
        .bookies
        .iter()
        .find(|b| {
            ensemble
                .iter()
                .any(|id| b.name.ends_with(&format!("-{id}")))
        })
        .cloned()
        .unwrap_or_else(|| panic!("ensemble {ensemble:?} names none of our bookies"));
    let owner = owner_of(&cluster.brokers, &topic).await;

    let killed = StampedFault::now(KILL_FAULT);
    scope.kill(&bookie).await;
    scope.kill(&owner).await;
    eprintln!(
        "killed bookie {} (ensemble of ledger {ledger_id}: {ensemble:?}) and broker {} ({})",
        bookie.name, owner.name, owner.ip
    );

    let store = init_store(&zk_connect).await;
    let brokers_path = Layout::new(ROOT)
        .unwrap_or_else(|e| panic!("{e}"))
        .brokers();
    eventually(
        "the killed broker's registration left ZooKeeper",
        30_000,
        || async {
            store
                .children(&brokers_path)
                .await
                .map(|c| c.len() == 1)
                .unwrap_or(false)
        },
    )
    .await;
    let expired = StampedFault::now(EXPIRED_FAULT);

    let result = child.finish(KILL_RUN_TIMEOUT_MS).await;
    result.assert_ok();
    let events = load_history_with_faults(&history, &[killed, expired])
        .unwrap_or_else(|e| panic!("reading the history: {e}"));
    // The client resends what was pending when the broker died: sends in
    // flight at the kill, and sends invoked before the session expired (into
    // the dying connection) whose receipt came after the failover.
    let events = client_resends_across(events, KILL_FAULT);
    let events = client_resends_across(events, EXPIRED_FAULT);

    // The kills landed mid-run: acks before them, acked sends after them.
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
        "the kills did not land mid-run: {acks_before} acks before, {sends_acked_after} acked sends after"
    );
    let report = check(
        &events,
        &CheckOptions::at_least_once().require_complete(&full_topic, "kill-run"),
    );
    assert!(
        report.is_ok(),
        "the history violates the checker (kept at {}):\n{report}",
        dir.keep().display()
    );
    // The survivor now owns the topic.
    let survivors: Vec<Container> = cluster
        .brokers
        .iter()
        .filter(|b| b.id != owner.id)
        .cloned()
        .collect();
    let survivor = owner_of(&survivors, &topic).await;
    assert_ne!(survivor.id, owner.id);
    eprintln!(
        "container kill run: {} events, {acks_before} acks before the kills, {sends_acked_after} sends acked after; verdict {}",
        events.len(),
        result.json
    );
}
