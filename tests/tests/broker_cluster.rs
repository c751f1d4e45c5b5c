//! `cms-broker` in cluster mode: ZooKeeper, three `cms-bookie serve`
//! processes and `cms-broker serve` as processes. `cms-broker init-cluster`
//! is idempotent and creates `public/default`; the broker is ready with a
//! writable quorum (E/Qw/Qa = 3/3/2); the official Python client produces
//! and consumes; a broker restart keeps the data and the cursor.

use std::process::Command;

use cms_tests::cluster::{BrokerNode, PYTHON_TIMEOUT_MS, ROOT, run_python, start_bookies};
use cms_tests::harness::{bins, zookeeper::ZooKeeper};

fn init_cluster(zk: &str) -> String {
    let bin = bins::find("cms-broker").unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(bin)
        .args([
            "init-cluster",
            &format!("--metadata-url=zk://{zk}"),
            &format!("--metadata-root={ROOT}"),
            "--cluster-name=test",
        ])
        .output()
        .expect("running cms-broker init-cluster");
    assert!(
        out.status.success(),
        "init-cluster failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn strs(v: &serde_json::Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key:?} in {v}"))
        .iter()
        .map(|x| x.as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_serves_the_python_client() {
    let zk = ZooKeeper::start().await;
    let zks = zk.connect_string();

    // init-cluster: creates, then finds nothing to do.
    let first = init_cluster(&zks);
    assert!(first.contains("public/default"), "{first}");
    let again = init_cluster(&zks);
    assert!(again.contains("nothing to do"), "{again}");

    let _bookies = start_bookies(&zks, 3).await;
    let mut broker = BrokerNode::start_cluster("broker", &zks, &[]).await;
    let url = broker.service_url();

    let run = run_python(
        "produce_consume.py",
        &[
            "--url",
            &url,
            "--topic",
            "cluster-roundtrip",
            "--count",
            "30",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "round trip failed: {} / {}", run.json, run.stderr);
    assert_eq!(strs(&run.json, "received").len(), 30);

    let run = run_python(
        "produce.py",
        &["--url", &url, "--topic", "cluster-restart", "--count", "20"],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    let run = run_python(
        "consume.py",
        &[
            "--url",
            &url,
            "--topic",
            "cluster-restart",
            "--sub",
            "s",
            "--count",
            "5",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "consume failed: {} / {}", run.json, run.stderr);

    broker.restart().await;
    let url = broker.service_url();
    let run = run_python(
        "consume.py",
        &[
            "--url",
            &url,
            "--topic",
            "cluster-restart",
            "--sub",
            "s",
            "--count",
            "30",
            "--drain",
            "--timeout-ms",
            "2000",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "consume failed: {} / {}", run.json, run.stderr);
    assert_eq!(
        strs(&run.json, "received"),
        (5..20).map(|i| format!("msg-{i}")).collect::<Vec<_>>()
    );
}
