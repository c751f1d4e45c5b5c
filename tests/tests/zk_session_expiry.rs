//! A session owner that freezes (SIGSTOP) loses its session: ZooKeeper, still
//! running, expires it and deletes its ephemeral node, and when the owner wakes
//! up its store reports `Expired` — it is never silently given a new session.

use std::time::Duration;

use cms_bookie::metadata::MetadataStore;
use cms_bookie::metadata::zk::{ZkOptions, ZkStore};
use cms_tests::harness::http;
use cms_tests::harness::process::ProcessBuilder;
use cms_tests::harness::wait::eventually;
use cms_tests::harness::zookeeper::{ZkConfig, ZooKeeper};

const HOLDER_SESSION_TIMEOUT_MS: u64 = 4_000;
/// Expiry takes about one session timeout plus a tick; generous for 2 busy cores.
const EXPIRY_DEADLINE_MS: u64 = 30_000;
/// After SIGCONT the holder reconnects and is told its session is gone.
const EXPIRED_SEEN_DEADLINE_MS: u64 = 30_000;

#[tokio::test]
async fn paused_holder_sees_expiry_and_loses_its_ephemeral_node() {
    let zk = ZooKeeper::start_with(ZkConfig::with_tick_time_ms(1_000)).await;
    let path = "/cms/test/holder";

    let mut holder = ProcessBuilder::new("cms-test-ephemeral-holder")
        .port("http")
        .args(["--zk", &zk.connect_string(), "--path", path])
        .args(["--http-port", "{port:http}"])
        .arg(format!("--session-timeout-ms={HOLDER_SESSION_TIMEOUT_MS}"))
        .spawn();
    let http_addr = holder.addr("http");
    holder.wait_ready(http_addr).await;

    // The test's own session, with a long timeout so it outlives the holder's.
    let observer = ZkStore::connect(
        &zk.connect_string(),
        &ZkOptions {
            session_timeout_ms: 15_000,
            ..ZkOptions::default()
        },
    )
    .await
    .unwrap();
    let stat = observer
        .exists(path)
        .await
        .unwrap()
        .expect("the holder's node exists once it is ready");
    assert_ne!(stat.ephemeral_owner, 0, "the node is ephemeral");
    assert_ne!(stat.ephemeral_owner, observer.session_id());

    let client = http::client();
    let (status, state) = http::get(&client, http_addr, "/session").await.unwrap();
    assert_eq!((status, state.as_str()), (200, "Connected"));

    holder.pause();
    let took = eventually(
        "ZooKeeper deletes the paused holder's node",
        EXPIRY_DEADLINE_MS,
        || {
            let observer = &observer;
            async move { observer.exists(path).await.unwrap().is_none() }
        },
    )
    .await;
    assert!(
        took >= Duration::from_millis(HOLDER_SESSION_TIMEOUT_MS / 2),
        "the node went after {took:?}, before the session could have expired"
    );
    assert!(zk.is_ok().await, "ZooKeeper kept running throughout");

    holder.resume();
    eventually(
        "the holder reports its session Expired",
        EXPIRED_SEEN_DEADLINE_MS,
        || {
            let client = &client;
            async move {
                matches!(
                    http::get(client, http_addr, "/session").await,
                    Ok((200, state)) if state == "Expired"
                )
            }
        },
    )
    .await;
    // Expired, and no new session behind our back: the node stays gone.
    assert!(observer.exists(path).await.unwrap().is_none());
    let (status, _) = http::get(&client, http_addr, "/ready").await.unwrap();
    assert_eq!(status, 503, "an expired holder is not ready");
    observer.close().await;
}
