//! System tests of the `cms-bookie` binary as users run it: `init-cluster`
//! against the embedded store (`file://`) and against a real ZooKeeper from the
//! harness, and the configuration errors every binary shares (exit code 2, one
//! line on stderr naming the key and where it came from).
//!
//! The binary is found by the harness (`cargo build -p cms-bookie --bins` first);
//! every run is bounded by [`RUN_TIMEOUT_MS`] and killed if it takes longer.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use cms_bookie::metadata::connect::{MetadataUrl, connect};
use cms_bookie::metadata::layout::{Layout, read_cluster};
use cms_bookie::metadata::zk::ZkOptions;
use cms_tests::harness::bins;
use cms_tests::harness::zookeeper::ZooKeeper;

/// Bound on one run of the binary, in milliseconds.
const RUN_TIMEOUT_MS: u64 = 60_000;

/// Exit code of a configuration error (`cms_common::config`).
const CONFIG_ERROR_EXIT_CODE: i32 = 2;

/// The environment prefix of `cms-bookie`'s configuration.
const ENV_PREFIX: &str = "CMS_BOOKIE_";

/// One finished run of `cms-bookie`.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn describe(&self) -> String {
        format!(
            "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `cms-bookie args...` with `env` added to an environment cleared of
/// every `CMS_BOOKIE_*` variable, and waits (bounded) for it to exit.
async fn cms_bookie(args: &[&str], env: &[(&str, &str)]) -> Run {
    let binary = bins::find("cms-bookie").unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = tokio::process::Command::new(&binary);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .kill_on_drop(true);
    for (key, _) in std::env::vars() {
        if key.starts_with(ENV_PREFIX) {
            cmd.env_remove(key);
        }
    }
    for (key, value) in env {
        cmd.env(key, value);
    }
    let output: Output = tokio::time::timeout(Duration::from_millis(RUN_TIMEOUT_MS), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("cms-bookie {args:?} did not exit within {RUN_TIMEOUT_MS} ms"))
        .unwrap_or_else(|e| panic!("run {}: {e}", binary.display()));
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `cms-bookie init-cluster` against `url` for cluster `name`.
async fn init_cluster(url: &str, name: &str) -> Run {
    cms_bookie(
        &[
            "init-cluster",
            "--metadata-url",
            url,
            "--cluster-name",
            name,
        ],
        &[],
    )
    .await
}

/// Checks, through the library, that the whole `/cms` layout exists at `url`
/// and that `/cms/cluster` names `name`; returns the cluster's instance id.
async fn assert_layout(url: &str, name: &str) -> String {
    let parsed: MetadataUrl = url.parse().expect("a valid metadata URL");
    let store = connect(&parsed, &ZkOptions::default())
        .await
        .expect("open the metadata store");
    let layout = Layout::new("/cms").expect("the default root");
    for dir in layout.directories() {
        assert!(
            store.exists(&dir).await.expect("exists").is_some(),
            "init-cluster did not create {dir}"
        );
    }
    let cluster = read_cluster(store.as_ref(), &layout)
        .await
        .expect("init-cluster wrote /cms/cluster");
    store.close().await;
    assert_eq!(cluster.name, name);
    assert!(!cluster.instance_id.is_empty(), "an instance id is set");
    cluster.instance_id
}

/// First run creates the layout; the second changes nothing, exits 0 and says so.
async fn creates_the_layout_then_is_a_no_op(url: &str) {
    let first = init_cluster(url, "alpha").await;
    assert_eq!(first.code, Some(0), "first run:\n{}", first.describe());
    assert!(
        first.stdout.contains("initialised cluster \"alpha\""),
        "first run reports what it did:\n{}",
        first.describe()
    );
    let instance = assert_layout(url, "alpha").await;

    let second = init_cluster(url, "alpha").await;
    assert_eq!(second.code, Some(0), "second run:\n{}", second.describe());
    assert!(
        second.stdout.contains("already initialised") && second.stdout.contains("nothing to do"),
        "second run says it is a no-op:\n{}",
        second.describe()
    );
    assert_eq!(
        assert_layout(url, "alpha").await,
        instance,
        "a second run keeps the cluster's instance id"
    );
}

/// Another cluster name against an initialised store: non-zero exit, a message
/// naming both clusters, and the store unchanged.
async fn refuses_another_cluster_name(url: &str) {
    let first = init_cluster(url, "alpha").await;
    assert_eq!(first.code, Some(0), "first run:\n{}", first.describe());
    let instance = assert_layout(url, "alpha").await;

    let other = init_cluster(url, "beta").await;
    assert_ne!(other.code, Some(0), "another name:\n{}", other.describe());
    assert!(
        other
            .stderr
            .contains("already initialised for cluster \"alpha\"")
            && other.stderr.contains("refusing")
            && other.stderr.contains("\"beta\""),
        "the refusal names both clusters:\n{}",
        other.describe()
    );
    assert_eq!(
        assert_layout(url, "alpha").await,
        instance,
        "a refused run changes nothing"
    );
}

fn embedded_url(dir: &Path) -> String {
    format!("file://{}", dir.join("metadata.redb").display())
}

fn zookeeper_url(zk: &ZooKeeper) -> String {
    format!("zk://{}/cli-test", zk.connect_string())
}

#[tokio::test]
async fn init_cluster_on_the_embedded_store_creates_the_layout_and_a_second_run_is_a_no_op() {
    let dir = tempfile::tempdir().expect("temporary directory");
    creates_the_layout_then_is_a_no_op(&embedded_url(dir.path())).await;
}

#[tokio::test]
async fn init_cluster_on_the_embedded_store_refuses_another_cluster_name() {
    let dir = tempfile::tempdir().expect("temporary directory");
    refuses_another_cluster_name(&embedded_url(dir.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_cluster_on_zookeeper_creates_the_layout_and_a_second_run_is_a_no_op() {
    let zk = ZooKeeper::start().await;
    creates_the_layout_then_is_a_no_op(&zookeeper_url(&zk)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_cluster_on_zookeeper_refuses_another_cluster_name() {
    let zk = ZooKeeper::start().await;
    refuses_another_cluster_name(&zookeeper_url(&zk)).await;
}

/// Runs `init-cluster` with `args` and `env` (the store is a file in a fresh
/// directory, in case the config were accepted) and asserts a configuration
/// error: exit code 2 and exactly one line on stderr, containing every one of
/// `needles`. Nothing may be created.
async fn assert_config_error(
    dir: &Path,
    extra_args: &[&str],
    env: &[(&str, &str)],
    needles: &[&str],
) {
    let url = embedded_url(dir);
    let mut args = vec!["init-cluster", "--metadata-url", url.as_str()];
    args.extend_from_slice(extra_args);
    let run = cms_bookie(&args, env).await;
    assert_eq!(
        run.code,
        Some(CONFIG_ERROR_EXIT_CODE),
        "a config error exits 2:\n{}",
        run.describe()
    );
    assert_eq!(
        run.stderr.lines().count(),
        1,
        "a config error is one line on stderr:\n{}",
        run.describe()
    );
    for needle in needles {
        assert!(
            run.stderr.contains(needle),
            "the error names {needle:?}:\n{}",
            run.describe()
        );
    }
    assert!(
        run.stdout.is_empty(),
        "nothing on stdout:\n{}",
        run.describe()
    );
    assert!(
        !dir.join("metadata.redb").exists(),
        "nothing is created on a config error"
    );
}

/// Writes `contents` to `bookie.toml` in `dir`; returns its path as a string.
fn config_file(dir: &Path, contents: &str) -> String {
    let path = dir.join("bookie.toml");
    std::fs::write(&path, contents).expect("write the config file");
    path.display().to_string()
}

#[tokio::test]
async fn an_unknown_key_in_the_config_file_is_exit_2_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = config_file(dir.path(), "cluster_name = \"a\"\njournal_dirz = \"/x\"\n");
    assert_config_error(
        dir.path(),
        &["--config", &file],
        &[],
        &["`journal_dirz`", "unknown key", &file],
    )
    .await;
}

#[tokio::test]
async fn a_bad_value_in_the_config_file_is_exit_2_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = config_file(dir.path(), "metadata_session_timeout_ms = \"soon\"\n");
    assert_config_error(
        dir.path(),
        &["--config", &file],
        &[],
        &["`metadata_session_timeout_ms`", &file],
    )
    .await;
}

#[tokio::test]
async fn a_missing_config_file_is_exit_2_naming_the_file() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = dir.path().join("no-such.toml").display().to_string();
    assert_config_error(
        dir.path(),
        &["--config", &file],
        &[],
        &[&file, "No such file"],
    )
    .await;
}

#[tokio::test]
async fn an_unknown_environment_key_is_exit_2_naming_the_variable() {
    let dir = tempfile::tempdir().expect("temporary directory");
    assert_config_error(
        dir.path(),
        &[],
        &[("CMS_BOOKIE_JOURNAL_DIRZ", "/x")],
        &[
            "`journal_dirz`",
            "environment CMS_BOOKIE_JOURNAL_DIRZ",
            "unknown key",
        ],
    )
    .await;
}

#[tokio::test]
async fn a_bad_environment_value_is_exit_2_naming_the_variable() {
    let dir = tempfile::tempdir().expect("temporary directory");
    assert_config_error(
        dir.path(),
        &[],
        &[("CMS_BOOKIE_METADATA_SESSION_TIMEOUT_MS", "soon")],
        &[
            "`metadata_session_timeout_ms`",
            "environment CMS_BOOKIE_METADATA_SESSION_TIMEOUT_MS",
        ],
    )
    .await;
}

// ---- operator commands against a running bookie ----

/// `--metadata-url` of the cluster tests' bookies (root `/cms`).
fn bookie_metadata_flag(zk: &ZooKeeper) -> String {
    format!("--metadata-url=zk://{}", zk.connect_string())
}

/// Whether `node` exists, read through a fresh session.
async fn node_exists(store: &dyn cms_bookie::metadata::MetadataStore, node: &str) -> bool {
    store
        .exists(node)
        .await
        .unwrap_or_else(|e| panic!("exists {node}: {e}"))
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_on_stops_new_ensembles_on_a_running_bookie_and_off_restores_it() {
    use cms_tests::cluster::{BookieNode, init_store, ledger_client, ledger_client_options};
    let zk = ZooKeeper::start().await;
    let store = init_store(&zk.connect_string()).await;
    let bookie = BookieNode::start("ro-1", &zk.connect_string(), &[]).await;
    let flag = bookie_metadata_flag(&zk);

    let run = cms_bookie(&["readonly", "ro-1", "on", &flag], &[]).await;
    assert_eq!(run.code, Some(0), "{}", run.describe());
    assert!(run.stdout.contains("read-only"), "{}", run.describe());
    assert!(node_exists(store.as_ref(), "/cms/bookies/readonly/ro-1").await);
    assert!(!node_exists(store.as_ref(), "/cms/bookies/available/ro-1").await);
    let ready = cms_tests::harness::http::client()
        .get(format!("http://{}/ready", bookie.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        ready.status().as_u16(),
        503,
        "a read-only bookie is not ready"
    );
    // No new ledger can be placed on it: it is the only bookie.
    let client = ledger_client(&zk.connect_string(), ledger_client_options()).await;
    client.refresh_bookies().await.unwrap();
    let err = client
        .create_ledger(1, 1, 1, b"pw", Default::default())
        .await
        .expect_err("a read-only bookie must not be chosen for a new ensemble");
    assert!(err.to_string().contains("bookie"), "{err}");

    let run = cms_bookie(&["readonly", "ro-1", "off", &flag], &[]).await;
    assert_eq!(run.code, Some(0), "{}", run.describe());
    assert!(node_exists(store.as_ref(), "/cms/bookies/available/ro-1").await);
    client.refresh_bookies().await.unwrap();
    let ledger = client
        .create_ledger(1, 1, 1, b"pw", Default::default())
        .await
        .unwrap_or_else(|e| panic!("writable again, so placement succeeds: {e}"));
    ledger.add(b"after".to_vec()).await.unwrap();

    // An unknown bookie is a clear error, exit 1.
    let run = cms_bookie(&["readonly", "nobody", "on", &flag], &[]).await;
    assert_eq!(run.code, Some(1), "{}", run.describe());
    assert!(run.stderr.contains("not registered"), "{}", run.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_is_refused_while_the_bookie_is_registered_and_works_once_it_stopped() {
    use cms_tests::cluster::{BookieNode, init_store};
    let zk = ZooKeeper::start().await;
    let store = init_store(&zk.connect_string()).await;
    let mut bookie = BookieNode::start("fmt-1", &zk.connect_string(), &[]).await;
    let dir = bookie.process.dir().to_path_buf();
    let journal = format!("--journal-dir={}/journal", dir.display());
    let ledgers = format!("--ledger-dir={}/ledgers", dir.display());
    let flag = bookie_metadata_flag(&zk);
    let args = [
        "format",
        "--yes",
        "--bookie-id=fmt-1",
        &flag,
        &journal,
        &ledgers,
    ];

    let run = cms_bookie(&args, &[]).await;
    assert_eq!(run.code, Some(1), "{}", run.describe());
    assert!(
        run.stderr.contains("still registered"),
        "{}",
        run.describe()
    );
    assert!(
        std::fs::read_dir(dir.join("journal")).unwrap().count() > 0,
        "nothing was deleted"
    );

    bookie.process.stop().await;
    assert!(!node_exists(store.as_ref(), "/cms/bookies/available/fmt-1").await);
    let run = cms_bookie(&args, &[]).await;
    assert_eq!(run.code, Some(0), "{}", run.describe());
    assert!(run.stdout.contains("incarnation 2"), "{}", run.describe());
}
