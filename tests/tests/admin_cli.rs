//! System tests of the `cms-admin` binary as operators run it, against a real
//! `cms-broker standalone` (and a cluster-mode broker with bookies for the
//! bookie commands): success output in table and JSON form, bad arguments
//! (exit 2), server errors (the documented exit code and the server's
//! reason), an unreachable or silent server (exit 6, bounded by
//! `--timeout`), profiles and bearer tokens.
//!
//! The binary is found by the harness (`cargo build -p cms-admin` first);
//! every run is bounded by [`RUN_TIMEOUT_MS`].

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use cms_tests::admin_cli::{
    EXIT_CONFLICT, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_SERVER, EXIT_UNREACHABLE, EXIT_USAGE, admin,
    cms_admin_env, first_column,
};
use cms_tests::cluster::{BrokerNode, PYTHON_TIMEOUT_MS, run_python, start_bookies};
use cms_tests::harness::ports::{free_port, loopback};
use cms_tests::harness::wait::eventually;
use cms_tests::harness::zookeeper::ZooKeeper;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_namespaces_topics_and_queues_through_the_cli() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = format!("http://{}", broker.http());
    let u = url.as_str();

    // Clusters and brokers.
    let clusters = admin(u, &["clusters", "list", "-o", "json"]).await.json();
    let cluster = clusters[0].as_str().expect("a cluster name").to_string();
    assert_eq!(
        first_column(&admin(u, &["clusters", "list"]).await),
        vec![cluster.clone()]
    );
    let c = admin(u, &["clusters", "get", &cluster, "-o", "json"])
        .await
        .json();
    assert!(c["brokerServiceUrl"].is_string(), "{c}");
    let brokers = admin(u, &["brokers", "list", "-o", "json"]).await.json();
    assert_eq!(brokers.as_array().map(Vec::len), Some(1), "{brokers}");
    admin(u, &["brokers", "health"]).await.ok();

    // Tenants: create, list (table and JSON), get, update, conflict, delete.
    admin(u, &["tenants", "create", "acme", "--admin-roles", "alice"])
        .await
        .ok();
    let list = admin(u, &["tenants", "list"]).await;
    assert_eq!(list.rows()[0], vec!["TENANT"], "{}", list.describe());
    assert!(first_column(&list).contains(&"acme".to_string()));
    let list = admin(u, &["tenants", "list", "-o", "json"]).await.json();
    assert!(list.as_array().unwrap().contains(&json!("acme")), "{list}");
    let yaml = admin(u, &["tenants", "get", "acme", "-o", "yaml"]).await;
    assert!(yaml.ok().contains("adminRoles:"), "{}", yaml.describe());
    admin(
        u,
        &["tenants", "update", "acme", "--admin-roles", "alice,bob"],
    )
    .await
    .ok();
    let t = admin(u, &["tenants", "get", "acme", "-o", "json"])
        .await
        .json();
    assert_eq!(t["adminRoles"], json!(["alice", "bob"]), "{t}");
    admin(u, &["tenants", "create", "acme"])
        .await
        .fails(EXIT_CONFLICT, "exists");
    admin(u, &["tenants", "get", "nope"])
        .await
        .fails(EXIT_NOT_FOUND, "nope");

    // Namespaces and one setter per policy family.
    admin(
        u,
        &["namespaces", "create", "acme/orders", "--bundles", "4"],
    )
    .await
    .ok();
    assert_eq!(
        first_column(&admin(u, &["namespaces", "list", "acme"]).await),
        vec!["acme/orders"]
    );
    let b = admin(u, &["namespaces", "bundles", "acme/orders", "-o", "json"])
        .await
        .json();
    assert_eq!(b["numBundles"], 4, "{b}");
    // Ownership: standalone owns every bundle.
    let own = admin(u, &["brokers", "ownership", "acme/orders", "-o", "json"])
        .await
        .json();
    let own = own.as_array().expect("bundles").clone();
    assert_eq!(own.len(), 4, "{own:?}");
    assert!(
        own.iter().all(|b| b["owner"] == brokers[0]["id"]),
        "{own:?} vs {brokers}"
    );
    let own = admin(u, &["brokers", "ownership", "acme/orders"]).await;
    assert_eq!(
        own.rows()[0],
        vec!["BUNDLE", "OWNER", "WEB-SERVICE-URL"],
        "{}",
        own.describe()
    );
    admin(u, &["brokers", "ownership", "acme/none"])
        .await
        .fails(EXIT_NOT_FOUND, "acme/none");
    // Split one bundle, unload one bundle and the namespace.
    let owned = admin(u, &["brokers", "ownership", "acme/orders", "-o", "json"])
        .await
        .json();
    let first = owned[0]["bundle"]
        .as_str()
        .expect("bundle name")
        .to_string();
    admin(
        u,
        &[
            "namespaces",
            "split-bundle",
            "acme/orders",
            "--bundle",
            &first,
        ],
    )
    .await
    .ok();
    let b = admin(u, &["namespaces", "bundles", "acme/orders", "-o", "json"])
        .await
        .json();
    assert_eq!(b["numBundles"], 5, "{b}");
    assert_eq!(b["boundaries"][1], "0x20000000", "{b}");
    admin(
        u,
        &[
            "namespaces",
            "split-bundle",
            "acme/orders",
            "--bundle",
            &first,
        ],
    )
    .await
    .fails(EXIT_NOT_FOUND, "not a bundle");
    admin(
        u,
        &[
            "namespaces",
            "split-bundle",
            "acme/orders",
            "--bundle",
            "nonsense",
        ],
    )
    .await
    .fails(EXIT_REFUSED, "nonsense");
    admin(
        u,
        &[
            "namespaces",
            "unload",
            "acme/orders",
            "--bundle",
            "0x20000000_0x40000000",
        ],
    )
    .await
    .ok();
    admin(u, &["namespaces", "unload", "acme/orders"])
        .await
        .ok();
    admin(
        u,
        &["namespaces", "set-bundles", "acme/orders", "--count", "8"],
    )
    .await
    .ok();
    let b = admin(u, &["namespaces", "bundles", "acme/orders", "-o", "json"])
        .await
        .json();
    assert_eq!(b["numBundles"], 8, "{b}");
    admin(
        u,
        &["namespaces", "set-bundles", "acme/orders", "--count", "2"],
    )
    .await
    .fails(EXIT_REFUSED, "never merged");
    admin(u, &["namespaces", "unload", "acme/none"])
        .await
        .fails(EXIT_NOT_FOUND, "acme/none");
    let ns = "acme/orders";
    for args in [
        vec![
            "set-retention",
            ns,
            "--time-minutes",
            "60",
            "--size-mb",
            "-1",
        ],
        vec!["set-message-ttl", ns, "3600"],
        vec![
            "set-backlog-quota",
            ns,
            "--limit-bytes",
            "1048576",
            "--policy",
            "producer-request-hold",
        ],
        vec!["set-publish-rate", ns, "--msgs", "100"],
        vec!["set-dispatch-rate", ns, "--msgs", "50"],
        vec!["set-subscription-dispatch-rate", ns, "--bytes", "1024"],
        vec!["set-max-producers-per-topic", ns, "7"],
        vec!["set-max-consumers-per-topic", ns, "8"],
        vec!["set-max-consumers-per-subscription", ns, "9"],
        vec!["set-max-topics-per-namespace", ns, "100"],
        vec!["set-max-subscriptions-per-topic", ns, "5"],
        vec!["set-deduplication", ns, "--enable"],
        vec!["set-auto-topic-creation", ns, "--disable"],
        vec!["set-persistence", ns, "-e", "1", "-w", "1", "-a", "1"],
        vec!["set-replication-clusters", ns, &cluster],
        vec!["set-schema-compatibility-strategy", ns, "BACKWARD"],
        vec!["set-is-allow-auto-update-schema", ns, "--disable"],
    ] {
        let mut full = vec!["namespaces"];
        full.extend(args.iter().copied());
        admin(u, &full).await.ok();
    }
    let p = admin(u, &["namespaces", "policies", ns, "-o", "json"])
        .await
        .json();
    assert_eq!(p["retention_policies"]["retentionTimeInMinutes"], 60, "{p}");
    assert_eq!(p["message_ttl_in_seconds"], 3600, "{p}");
    assert_eq!(p["max_producers_per_topic"], 7, "{p}");
    assert_eq!(p["deduplicationEnabled"], true, "{p}");
    assert_eq!(p["persistence"]["bookkeeperEnsemble"], 1, "{p}");
    assert_eq!(
        p["backlog_quota_map"]["destination_storage"]["limitSize"], 1048576,
        "{p}"
    );
    let ttl = admin(
        u,
        &["namespaces", "get-policy", ns, "message-ttl", "-o", "json"],
    )
    .await;
    assert_eq!(ttl.json(), json!(3600));
    admin(u, &["namespaces", "clear-policy", ns, "message-ttl"])
        .await
        .ok();
    let ttl = admin(
        u,
        &["namespaces", "get-policy", ns, "message-ttl", "-o", "json"],
    )
    .await;
    assert_eq!(ttl.json(), Value::Null);
    admin(
        u,
        &["namespaces", "set-auto-topic-creation", ns, "--enable"],
    )
    .await
    .ok();
    // Server-side validation: E < Qw is refused locally as usage, a bad
    // strategy by the server (400 → exit 1 with its reason).
    admin(
        u,
        &[
            "namespaces",
            "set-persistence",
            ns,
            "-e",
            "1",
            "-w",
            "2",
            "-a",
            "1",
        ],
    )
    .await
    .fails(EXIT_USAGE, "E >= Qw");
    admin(
        u,
        &[
            "namespaces",
            "set-schema-compatibility-strategy",
            ns,
            "SOMETIMES",
        ],
    )
    .await
    .fails(EXIT_REFUSED, "SOMETIMES");
    admin(u, &["tenants", "delete", "acme", "--yes"])
        .await
        .fails(EXIT_CONFLICT, "still has");

    // Topics.
    let topic = "persistent://acme/orders/events";
    admin(u, &["topics", "create", topic]).await.ok();
    admin(u, &["topics", "create", "acme/orders/events"])
        .await
        .fails(EXIT_CONFLICT, "exists");
    admin(
        u,
        &[
            "topics",
            "create-partitioned",
            "acme/orders/parts",
            "-p",
            "2",
        ],
    )
    .await
    .ok();
    admin(
        u,
        &[
            "topics",
            "update-partitions",
            "acme/orders/parts",
            "-p",
            "3",
        ],
    )
    .await
    .ok();
    let parts = admin(
        u,
        &["topics", "partitions", "acme/orders/parts", "-o", "json"],
    )
    .await;
    assert_eq!(parts.json()["partitions"], 3);
    admin(
        u,
        &[
            "topics",
            "update-partitions",
            "acme/orders/parts",
            "-p",
            "1",
        ],
    )
    .await
    .fails(EXIT_REFUSED, "");
    let listed = first_column(&admin(u, &["topics", "list", ns]).await);
    assert!(listed.contains(&topic.to_string()), "{listed:?}");
    let listed = admin(u, &["topics", "list", ns, "--partitioned", "-o", "json"])
        .await
        .json();
    assert_eq!(listed, json!(["persistent://acme/orders/parts"]));
    admin(
        u,
        &[
            "topics",
            "create-subscription",
            topic,
            "-s",
            "audit",
            "--position",
            "earliest",
        ],
    )
    .await
    .ok();
    assert_eq!(
        first_column(&admin(u, &["topics", "subscriptions", topic]).await),
        vec!["audit"]
    );

    let run = run_python(
        "produce.py",
        &[
            "--url",
            &broker.service_url(),
            "--topic",
            topic,
            "--count",
            "3",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);

    let stats = admin(u, &["topics", "stats", topic, "-o", "json"])
        .await
        .json();
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 3, "{stats}");
    let table = admin(u, &["topics", "stats", topic]).await;
    let audit_row = table
        .rows()
        .into_iter()
        .find(|r| r.first().map(String::as_str) == Some("audit"))
        .unwrap_or_else(|| panic!("no audit row: {}", table.describe()));
    assert_eq!(audit_row[2], "3", "{}", table.describe());
    let pstats = admin(u, &["topics", "stats", "acme/orders/parts", "-o", "json"])
        .await
        .json();
    assert_eq!(pstats["metadata"]["partitions"], 3, "{pstats}");
    let per = admin(
        u,
        &["topics", "stats", "acme/orders/parts", "--per-partition"],
    )
    .await;
    assert!(
        per.rows()
            .iter()
            .any(|r| r.first().map(String::as_str) == Some("PARTITION")
                && r.get(1).map(String::as_str) == Some("MSG-RATE-IN")),
        "no per-partition table: {}",
        per.describe()
    );

    let peek = admin(
        u,
        &[
            "topics", "peek", topic, "-s", "audit", "-n", "5", "-o", "json",
        ],
    )
    .await
    .json();
    let payloads: Vec<&str> = peek
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["payload"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(payloads, vec!["msg-0", "msg-1", "msg-2"], "{peek}");
    let peek_table = admin(u, &["topics", "peek", topic, "-s", "audit"]).await;
    assert!(
        peek_table.ok().contains("msg-0"),
        "{}",
        peek_table.describe()
    );

    let internal = admin(u, &["topics", "internal-stats", topic, "-o", "json"])
        .await
        .json();
    let ledger = internal["ledgers"][0]["ledgerId"]
        .as_u64()
        .expect("a ledger");
    let info = admin(u, &["ledgers", "info", &ledger.to_string(), "-o", "json"])
        .await
        .json();
    assert_eq!(info["ledgerId"], ledger, "{info}");
    let by_topic = admin(u, &["ledgers", "info", "--topic", topic, "-o", "json"])
        .await
        .json();
    assert!(!by_topic.as_array().unwrap().is_empty(), "{by_topic}");
    admin(u, &["ledgers", "info", "999999999"])
        .await
        .fails(EXIT_NOT_FOUND, "999999999");
    let last = admin(u, &["topics", "last-message-id", topic, "-o", "json"])
        .await
        .json();
    assert_eq!(last["ledgerId"], ledger, "{last}");

    let backlog = |s: Value| s["subscriptions"]["audit"]["msgBacklog"].clone();
    admin(u, &["topics", "skip", topic, "-s", "audit", "-n", "1"])
        .await
        .ok();
    assert_eq!(
        backlog(
            admin(u, &["topics", "stats", topic, "-o", "json"])
                .await
                .json()
        ),
        2
    );
    admin(
        u,
        &[
            "topics",
            "reset-cursor",
            topic,
            "-s",
            "audit",
            "--position",
            "earliest",
        ],
    )
    .await
    .ok();
    assert_eq!(
        backlog(
            admin(u, &["topics", "stats", topic, "-o", "json"])
                .await
                .json()
        ),
        3
    );
    admin(
        u,
        &["topics", "expire", topic, "-s", "audit", "-t", "86400"],
    )
    .await
    .ok();
    assert_eq!(
        backlog(
            admin(u, &["topics", "stats", topic, "-o", "json"])
                .await
                .json()
        ),
        3
    );
    // Messages older than 1 s: true once a second has passed since producing.
    eventually("every message expired", 20_000, || async {
        admin(
            u,
            &["topics", "expire", topic, "--all-subscriptions", "-t", "1"],
        )
        .await
        .ok();
        backlog(
            admin(u, &["topics", "stats", topic, "-o", "json"])
                .await
                .json(),
        ) == 0
    })
    .await;
    admin(
        u,
        &[
            "topics",
            "reset-cursor",
            topic,
            "-s",
            "audit",
            "--time",
            "0",
        ],
    )
    .await
    .ok();
    assert_eq!(
        backlog(
            admin(u, &["topics", "stats", topic, "-o", "json"])
                .await
                .json()
        ),
        3
    );
    // Destructive without --yes and without a terminal: refused, nothing done.
    admin(u, &["topics", "skip", topic, "-s", "audit", "--all"])
        .await
        .fails(EXIT_USAGE, "--yes");
    admin(
        u,
        &["topics", "skip", topic, "-s", "audit", "--all", "--yes"],
    )
    .await
    .ok();
    assert_eq!(
        backlog(
            admin(u, &["topics", "stats", topic, "-o", "json"])
                .await
                .json()
        ),
        0
    );
    admin(u, &["topics", "peek", topic, "-s", "audit"])
        .await
        .fails(EXIT_NOT_FOUND, "");
    admin(u, &["topics", "unload", topic]).await.ok();
    admin(
        u,
        &[
            "topics",
            "delete-subscription",
            topic,
            "-s",
            "audit",
            "--yes",
        ],
    )
    .await
    .ok();
    admin(u, &["topics", "delete", topic])
        .await
        .fails(EXIT_USAGE, "--yes");
    admin(u, &["topics", "delete", topic, "--yes"]).await.ok();
    admin(u, &["topics", "delete", "acme/orders/parts", "--yes"])
        .await
        .ok();
    admin(u, &["topics", "stats", topic])
        .await
        .fails(EXIT_NOT_FOUND, "");

    // Queues.
    let q = "acme/orders/jobs";
    admin(u, &["queues", "create", q, "--max-redeliveries", "3"])
        .await
        .ok();
    admin(u, &["queues", "create", q])
        .await
        .fails(EXIT_CONFLICT, "");
    let got = admin(u, &["queues", "get", q, "-o", "json"]).await.json();
    assert_eq!(got["maxRedeliveries"], 3, "{got}");
    let qt = got["topic"].as_str().expect("queue topic").to_string();
    let run = run_python(
        "produce.py",
        &[
            "--url",
            &broker.service_url(),
            "--topic",
            &qt,
            "--count",
            "2",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    let ql = admin(u, &["queues", "list", ns]).await;
    assert_eq!(
        ql.rows()[0],
        vec!["QUEUE", "TOPIC", "BACKLOG"],
        "{}",
        ql.describe()
    );
    assert_eq!(ql.rows()[1][2], "2", "{}", ql.describe());
    let qs = admin(u, &["queues", "stats", q, "-o", "json"]).await.json();
    assert_eq!(qs["msgBacklog"], 2, "{qs}");
    admin(u, &["queues", "stats", q]).await.ok();
    admin(u, &["queues", "purge", q])
        .await
        .fails(EXIT_USAGE, "--yes");
    admin(u, &["queues", "purge", q, "--yes"]).await.ok();
    assert_eq!(
        admin(u, &["queues", "stats", q, "-o", "json"]).await.json()["msgBacklog"],
        0
    );
    admin(u, &["queues", "delete", q, "--yes"]).await.ok();
    admin(u, &["queues", "get", q])
        .await
        .fails(EXIT_NOT_FOUND, "");

    // Writes print a line in table mode and nothing in JSON mode.
    let w = admin(u, &["namespaces", "create", "acme/tmp"]).await;
    assert!(w.ok().contains("created"), "{}", w.describe());
    let w = admin(
        u,
        &["namespaces", "delete", "acme/tmp", "--yes", "-o", "json"],
    )
    .await;
    assert_eq!(w.ok(), "", "{}", w.describe());

    // Namespace delete: 409 while a topic exists, --force deletes it.
    admin(u, &["topics", "create", "acme/orders/left"])
        .await
        .ok();
    admin(u, &["namespaces", "delete", ns, "--yes"])
        .await
        .fails(EXIT_CONFLICT, "");
    admin(u, &["namespaces", "delete", ns, "--force", "--yes"])
        .await
        .ok();
    admin(u, &["tenants", "delete", "acme", "--yes"]).await.ok();
    admin(u, &["tenants", "get", "acme"])
        .await
        .fails(EXIT_NOT_FOUND, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_exit_2_with_a_clear_message() {
    // No server needed: these fail before any request.
    let u = format!("http://{}", loopback(free_port()));
    let u = u.as_str();
    admin(u, &["tenants"]).await.fails(EXIT_USAGE, "Usage");
    admin(u, &["frobnicate"])
        .await
        .fails(EXIT_USAGE, "unrecognized subcommand");
    admin(u, &["namespaces", "create", "no-slash"])
        .await
        .fails(EXIT_USAGE, "TENANT/NS");
    admin(u, &["topics", "create", "a/b"])
        .await
        .fails(EXIT_USAGE, "TENANT/NS/TOPIC");
    admin(u, &["topics", "create", "http://a/b/c"])
        .await
        .fails(EXIT_USAGE, "persistent://");
    admin(u, &["topics", "create-partitioned", "a/b/c", "-p", "0"])
        .await
        .fails(EXIT_USAGE, "0");
    admin(
        u,
        &[
            "topics",
            "reset-cursor",
            "a/b/c",
            "-s",
            "x",
            "--position",
            "12",
        ],
    )
    .await
    .fails(EXIT_USAGE, "LEDGER:ENTRY");
    admin(u, &["namespaces", "set-message-ttl", "a/b", "soon"])
        .await
        .fails(EXIT_USAGE, "soon");
    admin(u, &["tenants", "list", "-o", "xml"])
        .await
        .fails(EXIT_USAGE, "xml");
    cms_admin_env(&["--url", "localhost:1", "tenants", "list"], &[])
        .await
        .fails(EXIT_USAGE, "http://");
    // TLS: an unreadable or empty CA file is a local error (exit 1).
    admin(
        u,
        &["--tls-ca-file", "/nonexistent/ca.pem", "tenants", "list"],
    )
    .await
    .fails(EXIT_REFUSED, "/nonexistent/ca.pem");
    let dir = tempfile::tempdir().expect("tempdir");
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, "not a certificate\n").expect("write");
    admin(
        u,
        &[
            "--tls-ca-file",
            not_pem.to_str().unwrap(),
            "tenants",
            "list",
        ],
    )
    .await
    .fails(EXIT_REFUSED, "no PEM certificate");
    // --help has examples; completions print a script.
    let help = admin(u, &["queues", "create", "--help"]).await;
    assert!(help.ok().contains("Examples:"), "{}", help.describe());
    let comp = admin(u, &["completions", "bash"]).await;
    assert!(comp.ok().contains("cms-admin"), "{}", comp.describe());
}

/// A server that accepts connections and never answers: the CLI must give
/// up after `--timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_and_silent_servers_exit_6_within_the_timeout() {
    // Nothing listens.
    let closed = format!("http://{}", loopback(free_port()));
    let start = Instant::now();
    admin(&closed, &["tenants", "list"])
        .await
        .fails(EXIT_UNREACHABLE, "cannot reach");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );

    // Accepts, reads, never answers.
    let listener = TcpListener::bind(loopback(free_port())).expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (release, released) = std::sync::mpsc::channel::<()>();
    let hold = std::thread::spawn(move || {
        // Keep the accepted connection open, unanswered, until released.
        if let Ok((_conn, _)) = listener.accept() {
            let _ = released.recv_timeout(Duration::from_secs(30));
        }
    });
    let start = Instant::now();
    admin(
        &format!("http://{addr}"),
        &["--timeout", "1", "tenants", "list"],
    )
    .await
    .fails(EXIT_UNREACHABLE, "timed out");
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "took {took:?} with --timeout 1"
    );
    drop(release);
    hold.join().expect("holder");
}

/// A one-request HTTP server answering `body` and handing back the request
/// text it read.
fn one_shot(body: &'static str) -> (String, std::thread::JoinHandle<String>) {
    one_shot_with("200 OK".to_string(), body)
}

/// [`one_shot`] answering `status` (the status line's code and text, plus
/// any header lines).
fn one_shot_with(status: String, body: &'static str) -> (String, std::thread::JoinHandle<String>) {
    let listener = TcpListener::bind(loopback(free_port())).expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let h = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => req.extend_from_slice(&buf[..n]),
            }
        }
        let resp = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = s.write_all(resp.as_bytes());
        String::from_utf8_lossy(&req).into_owned()
    });
    (url, h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_and_bearer_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").expect("token");

    // --token-file sends the token.
    let (url, h) = one_shot(r#"["acme"]"#);
    let run = admin(
        &url,
        &[
            "--token-file",
            token_file.to_str().unwrap(),
            "tenants",
            "list",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(run.json(), json!(["acme"]));
    let req = h.join().expect("server");
    assert!(req.starts_with("GET /admin/v2/tenants "), "{req}");
    assert!(
        req.to_ascii_lowercase()
            .contains("authorization: bearer s3cret-token\r\n"),
        "{req}"
    );

    // A 307 to the owning broker is followed with the token.
    let (owner, owner_h) = one_shot(r#"{"partitions": 0}"#);
    let (first, first_h) = one_shot_with(
        format!("307 Temporary Redirect\r\nlocation: {owner}/admin/v2/persistent/a/b/c/partitions"),
        r#"{"reason": "owned elsewhere"}"#,
    );
    let run = admin(
        &first,
        &[
            "--token",
            "t0k",
            "topics",
            "partitions",
            "a/b/c",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(run.json(), json!({"partitions": 0}));
    first_h.join().expect("first server");
    let req = owner_h.join().expect("owner server");
    assert!(
        req.starts_with("GET /admin/v2/persistent/a/b/c/partitions "),
        "{req}"
    );
    assert!(
        req.to_ascii_lowercase()
            .contains("authorization: bearer t0k\r\n"),
        "{req}"
    );

    // A server error: exit 5 with the server's reason.
    let (url503, h) = one_shot_with(
        "503 Service Unavailable".to_string(),
        r#"{"reason": "metadata store unavailable"}"#,
    );
    admin(&url503, &["tenants", "list"])
        .await
        .fails(EXIT_SERVER, "metadata store unavailable (HTTP 503)");
    h.join().expect("server");

    // A profile from the config file gives URL and token; --profile picks it.
    let (url, h) = one_shot(r#"["c1"]"#);
    let config = dir.path().join("admin.toml");
    std::fs::write(
        &config,
        format!("default = \"none\"\n[profiles.none]\nurl = \"http://127.0.0.1:1\"\n[profiles.test]\nurl = \"{url}\"\ntoken = \"from-profile\"\n"),
    )
    .expect("config");
    let cfg = config.to_str().unwrap();
    let run = cms_admin_env(
        &["--profile", "test", "clusters", "list", "-o", "json"],
        &[("CMS_ADMIN_CONFIG", cfg)],
    )
    .await;
    assert_eq!(run.json(), json!(["c1"]));
    let req = h.join().expect("server");
    assert!(
        req.to_ascii_lowercase()
            .contains("authorization: bearer from-profile"),
        "{req}"
    );
    // An unknown profile is a usage error naming the known ones.
    cms_admin_env(
        &["--profile", "nope", "tenants", "list"],
        &[("CMS_ADMIN_CONFIG", cfg)],
    )
    .await
    .fails(EXIT_USAGE, "test");
    // A missing token file is a local error.
    admin(
        &url,
        &["--token-file", "/nonexistent/token", "tenants", "list"],
    )
    .await
    .fails(EXIT_REFUSED, "/nonexistent/token");
    // CMS_ADMIN_URL is used when --url is absent.
    let (url, h) = one_shot(r#"[]"#);
    let run = cms_admin_env(
        &["tenants", "list", "-o", "json"],
        &[("CMS_ADMIN_URL", &url)],
    )
    .await;
    assert_eq!(run.json(), json!([]));
    h.join().expect("server");
}

/// Bookie commands against a cluster-mode broker with three bookies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookies_list_readonly_decommission_and_under_replicated() {
    let zk = ZooKeeper::start().await;
    let mut bookies = start_bookies(&zk.connect_string(), 3).await;
    let broker = BrokerNode::start_cluster("broker", &zk.connect_string(), &[]).await;
    let url = format!("http://{}", broker.http());
    let u = url.as_str();

    let list = admin(u, &["bookies", "list"]).await;
    assert_eq!(
        list.rows()[0],
        vec![
            "ID",
            "STATE",
            "RACK",
            "ENDPOINT",
            "FREE-BYTES",
            "TOTAL-BYTES"
        ],
        "{}",
        list.describe()
    );
    let ids = first_column(&list);
    assert_eq!(ids, vec!["b1", "b2", "b3"], "{}", list.describe());
    let b3 = admin(u, &["bookies", "get", "b3", "-o", "json"])
        .await
        .json();
    assert_eq!(b3["state"], "available", "{b3}");
    admin(u, &["bookies", "get", "b9"])
        .await
        .fails(EXIT_NOT_FOUND, "b9");

    let ro = admin(u, &["bookies", "set-readonly", "b3", "-o", "json"])
        .await
        .json();
    assert_eq!(ro["state"], "readonly", "{ro}");
    let back = admin(u, &["bookies", "set-readonly", "b3", "--off", "-o", "json"])
        .await
        .json();
    assert_eq!(back["state"], "available", "{back}");

    // A topic whose ledger is on every bookie (E3/Qw3/Qa2 by default).
    let topic = "persistent://public/default/on-b3";
    admin(u, &["topics", "create", topic]).await.ok();
    let ledgers = admin(u, &["ledgers", "info", "--topic", topic, "-o", "json"])
        .await
        .json();
    let ledger = ledgers[0]["ledgerId"].as_u64().expect("a ledger");
    let on_b3 = ledgers[0]["segments"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|seg| seg["ensemble"].to_string().contains("b3"));
    assert!(on_b3, "{ledgers}");

    // Decommission needs the bookie stopped: 409 (exit 4) while it runs.
    admin(u, &["bookies", "decommission", "b3", "--yes"])
        .await
        .fails(EXIT_CONFLICT, "stop it first");
    admin(u, &["bookies", "decommission", "b3"])
        .await
        .fails(EXIT_USAGE, "--yes");
    bookies[2].process.stop().await;
    eventually("b3 unregistered", 30_000, || async {
        let v = admin(u, &["bookies", "list", "-o", "json"]).await.json();
        v.as_array().is_some_and(|a| a.len() == 2)
    })
    .await;
    // One step: the ledger is left (no autorecovery runs here) and marked.
    let d = admin(
        u,
        &[
            "bookies",
            "decommission",
            "b3",
            "--yes",
            "--no-wait",
            "-o",
            "json",
        ],
    )
    .await
    .json();
    assert_eq!(d["done"], false, "{d}");
    assert!(d["ledgersLeft"].as_u64().is_some_and(|n| n >= 1), "{d}");
    assert!(
        d["ledgers"].as_array().unwrap().contains(&json!(ledger)),
        "{d}"
    );
    let ur = admin(u, &["bookies", "under-replicated", "-o", "json"])
        .await
        .json();
    let marked = ur
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["ledgerId"] == ledger)
        .unwrap_or_else(|| panic!("ledger {ledger} not under-replicated: {ur}"));
    assert_eq!(marked["lostBookies"], json!("b3"), "{ur}");
    let table = admin(u, &["bookies", "under-replicated"]).await;
    assert_eq!(
        table.rows()[0],
        vec!["LEDGER", "LOST-BOOKIES"],
        "{}",
        table.describe()
    );
    assert!(
        table
            .rows()
            .iter()
            .any(|r| r == &vec![ledger.to_string(), "b3".to_string()]),
        "{}",
        table.describe()
    );
    // Following progress is bounded: nothing re-replicates here, so it
    // gives up after --wait-timeout naming what is left.
    let start = std::time::Instant::now();
    admin(
        u,
        &[
            "bookies",
            "decommission",
            "b3",
            "--yes",
            "--wait-timeout",
            "2",
            "--interval",
            "1",
        ],
    )
    .await
    .fails(EXIT_REFUSED, "ledgers left");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    drop(zk);
}

/// `https://` with `--tls-ca-file`: a real TLS server (Python's `ssl`, a CA
/// and a server certificate for 127.0.0.1 made by `openssl`) is trusted through the CA
/// file, and refused (exit 6) without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_ca_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca_cert, ca_key) = (dir.path().join("ca.pem"), dir.path().join("ca.key"));
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let (csr, ext) = (dir.path().join("leaf.csr"), dir.path().join("leaf.ext"));
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext file");
    let p = |x: &std::path::Path| x.to_str().expect("utf-8 path").to_string();
    // A CA, and a server certificate for 127.0.0.1 signed by it.
    for args in [
        vec![
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=cms-admin test CA",
            "-keyout",
            &p(&ca_key),
            "-out",
            &p(&ca_cert),
        ],
        vec![
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            &p(&key),
            "-out",
            &p(&csr),
        ],
        vec![
            "x509",
            "-req",
            "-in",
            &p(&csr),
            "-CA",
            &p(&ca_cert),
            "-CAkey",
            &p(&ca_key),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &p(&ext),
            "-out",
            &p(&cert),
        ],
    ] {
        let made = std::process::Command::new("openssl")
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("openssl (package openssl) is needed to make test certificates");
        assert!(
            made.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&made.stderr)
        );
    }
    let port = free_port();
    let server = r#"
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'["tls"]'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[2], sys.argv[3])
s.socket = ctx.wrap_socket(s.socket, server_side=True)
s.serve_forever()
"#;
    let mut child = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(server)
        .arg(port.to_string())
        .arg(&cert)
        .arg(&key)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("python3");
    eventually("the TLS server listens", 20_000, || async {
        tokio::net::TcpStream::connect(loopback(port)).await.is_ok()
    })
    .await;
    let url = format!("https://127.0.0.1:{port}");
    let ca = p(&ca_cert);
    admin(&url, &["--timeout", "5", "tenants", "list"])
        .await
        .fails(EXIT_UNREACHABLE, "cannot reach");
    let ok = admin(
        &url,
        &["--tls-ca-file", &ca, "tenants", "list", "-o", "json"],
    )
    .await;
    assert_eq!(ok.json(), json!(["tls"]));
    let _ = child.kill().await;
}

/// Runs `cms-admin --url url args...` on a pseudo-terminal (util-linux
/// `script`) with `answer` typed on it.
async fn on_a_terminal(url: &str, args: &[&str], answer: &str) -> (Option<i32>, String) {
    let binary = cms_tests::harness::bins::find("cms-admin").unwrap_or_else(|e| panic!("{e}"));
    let command = format!("{} --url {url} {}", binary.display(), args.join(" "));
    let mut child = tokio::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("XDG_CONFIG_HOME", "/nonexistent-cms-admin-test")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("script (util-linux) runs a command on a pseudo-terminal");
    let mut stdin = child.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut stdin, answer.as_bytes())
        .await
        .expect("type the answer");
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("script exits")
        .expect("script output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// On a terminal, destructive commands ask; only "y" goes ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destructive_commands_ask_on_a_terminal() {
    // "n": nothing is sent (nothing listens here; a request would exit 6).
    let closed = format!("http://{}", loopback(free_port()));
    let (code, text) = on_a_terminal(&closed, &["tenants", "delete", "acme"], "n\n").await;
    assert_eq!(code, Some(EXIT_USAGE), "{text}");
    assert!(text.contains("delete tenant acme? [y/N]"), "{text}");
    assert!(text.contains("not confirmed"), "{text}");
    // "y": the DELETE is sent.
    let (url, h) = one_shot("");
    let (code, text) = on_a_terminal(&url, &["tenants", "delete", "acme"], "y\n").await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("tenant acme deleted"), "{text}");
    let req = h.join().expect("server");
    assert!(req.starts_with("DELETE /admin/v2/tenants/acme "), "{req}");
}

/// On a terminal, a forced namespace delete counts its topics down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_namespace_delete_counts_topics_on_a_terminal() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = format!("http://{}", broker.http());
    let u = url.as_str();
    admin(u, &["tenants", "create", "acme"]).await.ok();
    admin(u, &["namespaces", "create", "acme/many"]).await.ok();
    for i in 0..3 {
        admin(
            u,
            &["topics", "create", &format!("persistent://acme/many/t{i}")],
        )
        .await
        .ok();
    }
    let (code, text) = on_a_terminal(
        u,
        &["namespaces", "delete", "acme/many", "--force", "--yes"],
        "",
    )
    .await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("/3 topics deleted"), "{text}");
    assert!(text.contains("namespace acme/many deleted"), "{text}");
    let left = admin(u, &["namespaces", "list", "acme", "-o", "json"])
        .await
        .json();
    assert_eq!(left, serde_json::json!([]), "{left}");
}

// `cms-admin quotas` and `cms-admin permissions` (REST of issues 11 and 12).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_per_tenant_and_namespace() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = format!("http://{}", broker.http());
    let u = url.as_str();
    admin(u, &["tenants", "create", "acme"]).await.ok();
    admin(u, &["namespaces", "create", "acme/orders"])
        .await
        .ok();

    // Tenant quotas: set (only the limits given), get in JSON and table.
    admin(
        u,
        &[
            "quotas",
            "set",
            "acme",
            "--max-topics",
            "10",
            "--storage-bytes",
            "1073741824",
            "--publish-rate-msgs",
            "500",
        ],
    )
    .await
    .ok();
    let q = admin(u, &["quotas", "get", "acme", "-o", "json"])
        .await
        .json();
    assert_eq!(q["maxTopics"], 10, "{q}");
    assert_eq!(q["storageBytes"], 1073741824u64, "{q}");
    assert_eq!(q["publishRateInMsgs"], 500, "{q}");
    assert!(q["maxProducers"].is_null(), "not given = unlimited: {q}");
    let table = admin(u, &["quotas", "get", "acme"]).await;
    let row = table
        .rows()
        .into_iter()
        .find(|r| r.first().map(String::as_str) == Some("maxTopics"))
        .unwrap_or_else(|| panic!("no maxTopics row: {}", table.describe()));
    assert_eq!(row[1], "10", "{}", table.describe());

    // Usage has the same field names.
    admin(u, &["topics", "create", "acme/orders/t1"]).await.ok();
    let usage = admin(u, &["quotas", "usage", "acme", "-o", "json"])
        .await
        .json();
    assert!(
        usage["maxTopics"].as_u64().is_some_and(|n| n >= 1),
        "{usage}"
    );

    // Namespace quotas are separate from the tenant's.
    admin(u, &["quotas", "set", "acme/orders", "--max-producers", "3"])
        .await
        .ok();
    let nq = admin(u, &["quotas", "get", "acme/orders", "-o", "json"])
        .await
        .json();
    assert_eq!(nq["maxProducers"], 3, "{nq}");
    assert!(nq["maxTopics"].is_null(), "{nq}");
    let nusage = admin(u, &["quotas", "usage", "acme/orders", "-o", "json"])
        .await
        .json();
    assert!(nusage.is_object(), "{nusage}");

    // Remove: refused without --yes when nobody can be asked; then unlimited.
    admin(u, &["quotas", "remove", "acme/orders"])
        .await
        .fails(EXIT_USAGE, "--yes");
    admin(u, &["quotas", "remove", "acme/orders", "--yes"])
        .await
        .ok();
    let nq = admin(u, &["quotas", "get", "acme/orders", "-o", "json"])
        .await
        .json();
    assert!(nq["maxProducers"].is_null(), "{nq}");
    admin(u, &["quotas", "remove", "acme", "--yes"]).await.ok();
    let q = admin(u, &["quotas", "get", "acme", "-o", "json"])
        .await
        .json();
    assert!(q["maxTopics"].is_null(), "{q}");

    // Errors: unknown tenant (404 → 3), bad values (usage 2).
    admin(u, &["quotas", "get", "nope"])
        .await
        .fails(EXIT_NOT_FOUND, "nope");
    admin(u, &["quotas", "set", "acme", "--max-topics", "-1"])
        .await
        .fails(EXIT_USAGE, "-1");
    admin(u, &["quotas", "get", "a/b/c"])
        .await
        .fails(EXIT_USAGE, "TENANT/NS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_per_namespace_and_topic() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = format!("http://{}", broker.http());
    let u = url.as_str();
    admin(u, &["tenants", "create", "acme"]).await.ok();
    admin(u, &["namespaces", "create", "acme/orders"])
        .await
        .ok();
    let topic = "persistent://acme/orders/events";
    admin(u, &["topics", "create", topic]).await.ok();

    for resource in ["acme/orders", topic] {
        admin(
            u,
            &[
                "permissions",
                "grant",
                resource,
                "--role",
                "billing",
                "--actions",
                "produce,consume",
            ],
        )
        .await
        .ok();
        admin(
            u,
            &[
                "permissions",
                "grant",
                resource,
                "--role",
                "audit",
                "--actions",
                "consume",
            ],
        )
        .await
        .ok();
        let p = admin(u, &["permissions", "list", resource, "-o", "json"])
            .await
            .json();
        let mut billing: Vec<Value> = p["billing"].as_array().cloned().unwrap_or_default();
        billing.sort_by_key(|v| v.as_str().unwrap_or_default().to_string());
        assert_eq!(
            billing,
            vec![json!("consume"), json!("produce")],
            "{resource}: {p}"
        );
        assert_eq!(p["audit"], json!(["consume"]), "{resource}: {p}");
        let table = admin(u, &["permissions", "list", resource]).await;
        assert!(table.ok().contains("billing"), "{}", table.describe());

        admin(u, &["permissions", "revoke", resource, "--role", "billing"])
            .await
            .ok();
        let p = admin(u, &["permissions", "list", resource, "-o", "json"])
            .await
            .json();
        assert!(
            p.get("billing").is_none_or(Value::is_null),
            "{resource}: {p}"
        );
        assert_eq!(p["audit"], json!(["consume"]), "{resource}: {p}");
    }

    // Bad arguments: an unknown action, no role.
    admin(
        u,
        &[
            "permissions",
            "grant",
            "acme/orders",
            "--role",
            "x",
            "--actions",
            "fly",
        ],
    )
    .await
    .fails(EXIT_USAGE, "fly");
    admin(
        u,
        &[
            "permissions",
            "grant",
            "acme/orders",
            "--actions",
            "produce",
        ],
    )
    .await
    .fails(EXIT_USAGE, "--role");
    // An unknown namespace: 404 → 3.
    admin(u, &["permissions", "list", "acme/nope"])
        .await
        .fails(EXIT_NOT_FOUND, "");
}
