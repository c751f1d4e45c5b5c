//! The network-namespace partition harness (`cms_tests::harness::netns`) on a
//! real TCP stream: an echo server in namespace A, a client in namespace B.
//! Needs root and iproute2; without them these tests fail with what is missing.

use std::net::SocketAddr;
use std::time::Duration;

use cms_tests::harness::netns::{NetnsPair, Side};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Bound on a connect or an echo that must succeed, in milliseconds.
const REACH_TIMEOUT_MS: u64 = 5_000;
/// How long a connect or an echo across a cut link is given to (wrongly)
/// succeed, in milliseconds.
const CUT_PROBE_MS: u64 = 1_000;

fn pair() -> NetnsPair {
    NetnsPair::create().unwrap_or_else(|e| {
        panic!(
            "network namespaces are needed for partition tests (run as root, with iproute2): {e}"
        )
    })
}

/// An echo server listening on side A's address; returns where.
async fn echo_server(pair: &NetnsPair) -> SocketAddr {
    let addr = SocketAddr::from((pair.addr(Side::A), 0));
    let listener = pair
        .run_in(Side::A, || std::net::TcpListener::bind(addr))
        .expect("enter namespace A")
        .expect("bind in namespace A");
    listener.set_nonblocking(true).expect("non-blocking");
    let listener = TcpListener::from_std(listener).expect("tokio listener");
    let local = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    local
}

/// Connects from side B to `addr`, bounded by `ms`.
async fn connect_from_b(pair: &NetnsPair, addr: SocketAddr, ms: u64) -> std::io::Result<TcpStream> {
    let socket = pair
        .run_in(Side::B, TcpSocket::new_v4)
        .expect("enter namespace B")?;
    match tokio::time::timeout(Duration::from_millis(ms), socket.connect(addr)).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no connection within {ms} ms"),
        )),
    }
}

/// Sends `msg` and reads it back, bounded by `ms`.
async fn echo(stream: &mut TcpStream, msg: &[u8], ms: u64) -> std::io::Result<()> {
    let round_trip = async {
        stream.write_all(msg).await?;
        let mut back = vec![0; msg.len()];
        stream.read_exact(&mut back).await?;
        assert_eq!(back, msg, "the echo is the message");
        Ok(())
    };
    match tokio::time::timeout(Duration::from_millis(ms), round_trip).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no echo within {ms} ms"),
        )),
    }
}

/// Connects from side B and echoes `msg`, both of which must succeed within
/// [`REACH_TIMEOUT_MS`]; returns the connection.
async fn reach_from_b(pair: &NetnsPair, server: SocketAddr, msg: &[u8]) -> TcpStream {
    let when = String::from_utf8_lossy(msg);
    let mut stream = connect_from_b(pair, server, REACH_TIMEOUT_MS)
        .await
        .unwrap_or_else(|e| panic!("B connects to A {when}: {e}"));
    echo(&mut stream, msg, REACH_TIMEOUT_MS)
        .await
        .unwrap_or_else(|e| panic!("echo from B {when}: {e}"));
    stream
}

#[tokio::test]
async fn an_echo_server_in_a_is_reachable_from_b_until_cut_and_again_after_heal() {
    let mut pair = pair();
    let server = echo_server(&pair).await;

    let mut held = reach_from_b(&pair, server, b"before the cut").await;

    pair.cut().expect("cut the link");
    assert!(pair.is_cut());
    let new = connect_from_b(&pair, server, CUT_PROBE_MS).await;
    assert!(new.is_err(), "a new connection crossed a cut link");
    assert!(
        echo(&mut held, b"during", CUT_PROBE_MS).await.is_err(),
        "bytes crossed a cut link on a live connection"
    );

    pair.heal().expect("heal the link");
    reach_from_b(&pair, server, b"after the heal").await;
}

#[test]
fn dropping_the_pair_deletes_both_namespaces() {
    let pair = pair();
    let names = [
        pair.name(Side::A).to_string(),
        pair.name(Side::B).to_string(),
    ];
    let listed = || {
        let out = std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = listed();
    for name in &names {
        assert!(before.contains(name.as_str()), "{name} exists: {before}");
    }
    drop(pair);
    let after = listed();
    for name in &names {
        assert!(!after.contains(name.as_str()), "{name} is gone: {after}");
    }
}
