//! The process harness itself: ZooKeeper keeps its data across kill/restart,
//! pause/resume freezes and thaws a process, dropped handles leave no process
//! behind, and missing prerequisites fail loudly with the fix.

use std::time::Duration;

use cms_bookie::metadata::zk::{ZkOptions, ZkStore};
use cms_bookie::metadata::{CreateMode, MetadataStore};
use cms_tests::harness::process::ProcessBuilder;
use cms_tests::harness::wait::{eventually, within};
use cms_tests::harness::zookeeper::{ZkConfig, ZooKeeper};
use cms_tests::harness::{HarnessError, ports};
use nix::errno::Errno;
use nix::sys::signal;
use nix::unistd::Pid;

/// True if a process with this PID exists (zombies included).
fn pid_exists(pid: u32) -> bool {
    match signal::kill(Pid::from_raw(pid as i32), None) {
        Ok(()) => true,
        Err(Errno::ESRCH) => false,
        Err(e) => panic!("kill(0) on {pid}: {e}"),
    }
}

async fn connect(zk: &ZooKeeper) -> ZkStore {
    let connect_string = zk.connect_string();
    ZkStore::connect(&connect_string, &ZkOptions::default())
        .await
        .unwrap_or_else(|e| panic!("connect to ZooKeeper at {connect_string}: {e}"))
}

#[tokio::test]
async fn zookeeper_keeps_persistent_nodes_across_kill_and_restart() {
    let mut zk = ZooKeeper::start().await;
    let connect_string = zk.connect_string();
    let store = connect(&zk).await;
    store
        .create("/survivor", b"still here", CreateMode::Persistent)
        .await
        .unwrap();
    store.close().await;
    let first_pid = zk.pid().unwrap();

    zk.kill();
    assert_eq!(zk.pid(), None);
    assert!(!pid_exists(first_pid), "a killed server is reaped");
    assert!(!zk.is_ok().await, "a killed server does not answer");

    zk.restart().await;
    assert_eq!(
        zk.connect_string(),
        connect_string,
        "same port after restart"
    );
    assert_ne!(zk.pid(), Some(first_pid));
    let store = connect(&zk).await;
    let (data, _) = store.get("/survivor").await.unwrap();
    assert_eq!(data, b"still here");
    store.close().await;

    // A graceful restart keeps it too.
    zk.restart().await;
    let store = connect(&zk).await;
    assert!(store.exists("/survivor").await.unwrap().is_some());
    store.close().await;
}

#[tokio::test]
async fn a_paused_zookeeper_does_not_answer_until_resumed() {
    let zk = ZooKeeper::start().await;
    assert!(zk.is_ok().await);
    zk.pause();
    // A few attempts, each bounded: not one answer while it is stopped.
    assert_eq!(
        within(3_000, || zk.is_ok()).await,
        None,
        "answered while paused"
    );
    zk.resume();
    eventually("the resumed server answers imok", 10_000, || zk.is_ok()).await;
}

#[tokio::test]
async fn a_dropped_process_is_killed_and_reaped() {
    let process = ProcessBuilder::program("sleeper", "/bin/sleep")
        .arg("600")
        .spawn();
    let pid = process.pid().unwrap();
    assert!(pid_exists(pid));
    drop(process);
    assert!(!pid_exists(pid), "PID {pid} still exists after drop");
}

#[tokio::test]
async fn a_paused_process_is_killed_on_drop_too() {
    let process = ProcessBuilder::program("sleeper", "/bin/sleep")
        .arg("600")
        .spawn();
    let pid = process.pid().unwrap();
    process.pause();
    drop(process);
    assert!(!pid_exists(pid), "PID {pid} still exists after drop");
}

#[tokio::test]
async fn a_process_keeps_its_ports_dir_and_args_across_restart() {
    let mut process = ProcessBuilder::program("echoer", "/bin/sh")
        .port("http")
        .file("conf/port.txt", "port={port:http}")
        .args([
            "-c",
            "echo started in $(pwd) with $(cat conf/port.txt); exec sleep 600",
        ])
        .spawn();
    let port = process.port("http");
    let dir = process.dir().to_path_buf();
    let line = format!("with port={port}");
    eventually("the first start logs its port", 5_000, || {
        let found = process.log_tail(10).contains(&line);
        async move { found }
    })
    .await;

    process.kill();
    assert!(!process.is_running());
    process.restart().await;
    assert_eq!(process.starts(), 2);
    assert_eq!(process.port("http"), port);
    assert_eq!(process.dir(), dir);
    eventually("the second start logs the same port", 5_000, || {
        let count = process.log_tail(100).matches(&line).count();
        async move { count == 2 }
    })
    .await;

    let status = process.stop().await.unwrap();
    assert!(!status.success(), "sleep ends by SIGTERM: {status}");
    assert!(!process.is_running());
}

#[tokio::test]
async fn stop_ends_a_paused_process() {
    let mut process = ProcessBuilder::program("sleeper", "/bin/sleep")
        .arg("600")
        .stop_timeout_ms(5_000)
        .spawn();
    process.pause();
    let start = std::time::Instant::now();
    assert!(process.stop().await.is_some());
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "SIGTERM reached it"
    );
}

#[tokio::test]
#[should_panic(expected = "boom before ready")]
async fn wait_ready_fails_with_the_log_tail_when_the_process_exits() {
    let mut process = ProcessBuilder::program("crasher", "/bin/sh")
        .args(["-c", "echo boom before ready; exit 3"])
        .spawn();
    process
        .wait_ready(ports::loopback(ports::free_port()))
        .await;
}

#[tokio::test]
#[should_panic(expected = "within 500 ms")]
async fn wait_ready_fails_at_its_deadline() {
    let mut process = ProcessBuilder::program("sleeper", "/bin/sleep")
        .arg("600")
        .ready_timeout_ms(500)
        .spawn();
    process
        .wait_ready(ports::loopback(ports::free_port()))
        .await;
}

#[test]
fn a_missing_binary_says_to_build_the_workspace() {
    let err = ProcessBuilder::new("cms-no-such-binary")
        .try_spawn()
        .unwrap_err();
    assert!(
        matches!(err, HarnessError::BinaryNotFound { ref name, .. } if name == "cms-no-such-binary")
    );
    assert!(
        err.to_string()
            .contains("run `cargo build --workspace --bins` first"),
        "{err}"
    );
}

#[test]
#[should_panic(expected = "run `cargo build --workspace --bins` first")]
fn spawning_a_missing_binary_panics_with_the_build_command() {
    ProcessBuilder::new("cms-no-such-binary").spawn();
}

#[tokio::test]
#[should_panic(expected = "apt-get update && apt-get install -y zookeeper")]
async fn a_missing_java_panics_with_the_install_command() {
    ZooKeeper::start_with(ZkConfig {
        java: "/nonexistent/bin/java".into(),
        ..ZkConfig::default()
    })
    .await;
}

#[tokio::test]
async fn a_missing_zookeeper_jar_is_a_clear_error() {
    let err = ZooKeeper::try_start_with(ZkConfig {
        zookeeper_jar: "/nonexistent/zookeeper.jar".into(),
        ..ZkConfig::default()
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, HarnessError::ZooKeeperMissing { ref what, .. } if what == "zookeeper.jar")
    );
    assert!(
        err.to_string().contains("apt-get install -y zookeeper"),
        "{err}"
    );
}
