//! Every fault of the chaos proxy, observed on real TCP streams through it: a local echo server
//! (or a capturing server, to see each direction alone) sits upstream, the test is the client.
//!
//! Timing assertions are lower bounds only ("a delay of d adds at least d"), except where no
//! fault is set, where bounds are generous. Nothing sleeps and hopes: every wait has a deadline
//! and a condition; the only fixed windows are the `SILENCE` windows that assert that nothing
//! arrives.

// Helpers below are test code too (clippy's `allow-unwrap-in-tests` covers only `#[test]` fns):
// a panic in them is a test failure with a location.
#![allow(clippy::unwrap_used)]

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cms_tests::chaos::remote::RemoteChaosProxy;
use cms_tests::chaos::{ChaosError, ChaosProxy, Direction, DirectionFaults, Faults, ProxyConfig};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

/// Bound on anything that must happen.
const DEADLINE: Duration = Duration::from_secs(3);
/// Window in which something must NOT happen.
const SILENCE: Duration = Duration::from_millis(300);

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// An echo server that counts the bytes it received.
struct Echo {
    addr: SocketAddr,
    received: Arc<AtomicUsize>,
}

impl Echo {
    fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

async fn spawn_echo() -> Echo {
    let listener = TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(AtomicUsize::new(0));
    let counter = received.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            stream.set_nodelay(true).unwrap();
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let n = match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    counter.fetch_add(n, Ordering::SeqCst);
                    if stream.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Echo { addr, received }
}

/// An echo server and a fault-free proxy in front of it.
async fn echo_behind_proxy() -> (Echo, ChaosProxy) {
    let echo = spawn_echo().await;
    let proxy = ChaosProxy::start(any_port(), echo.addr).await.unwrap();
    (echo, proxy)
}

/// A server that hands every accepted stream to the test.
async fn spawn_capture() -> (SocketAddr, mpsc::Receiver<TcpStream>) {
    let listener = TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            stream.set_nodelay(true).unwrap();
            if tx.send(stream).await.is_err() {
                break;
            }
        }
    });
    (addr, rx)
}

async fn connect(addr: SocketAddr) -> TcpStream {
    let stream = timeout(DEADLINE, TcpStream::connect(addr))
        .await
        .expect("connect within deadline")
        .expect("connect succeeds");
    stream.set_nodelay(true).unwrap();
    stream
}

/// Sends `msg`, reads it back, returns the round-trip time.
async fn round_trip(stream: &mut TcpStream, msg: &[u8]) -> Duration {
    let start = Instant::now();
    timeout(DEADLINE, async {
        stream.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        stream.read_exact(&mut got).await.unwrap();
        assert_eq!(got, msg);
    })
    .await
    .expect("round trip within deadline");
    start.elapsed()
}

async fn min_round_trip(stream: &mut TcpStream, samples: usize) -> Duration {
    let mut min = Duration::MAX;
    for i in 0..samples {
        min = min.min(round_trip(stream, format!("ping-{i}").as_bytes()).await);
    }
    min
}

/// Nothing arrives on `stream` within `SILENCE` (and the stream is not closed either).
async fn expect_silence(stream: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match timeout(SILENCE, stream.read(&mut buf)).await {
        Err(_) => {}
        Ok(Ok(0)) => panic!("stream closed instead of stalling"),
        Ok(Ok(n)) => panic!("{n} bytes arrived: {:?}", &buf[..n]),
        Ok(Err(e)) => panic!("stream failed instead of stalling: {e}"),
    }
}

/// The stream gets RST (`ECONNRESET`) within the deadline, with no data before it.
async fn expect_reset(stream: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match timeout(DEADLINE, stream.read(&mut buf)).await {
        Err(_) => panic!("no reset within {DEADLINE:?}"),
        Ok(Ok(0)) => panic!("clean EOF where a reset was expected"),
        Ok(Ok(n)) => panic!("{n} bytes arrived where a reset was expected"),
        Ok(Err(e)) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
}

/// The stream ends (EOF or reset) within the deadline, with no data before it.
async fn expect_closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match timeout(DEADLINE, stream.read(&mut buf)).await {
        Err(_) => panic!("not closed within {DEADLINE:?}"),
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => panic!("{n} bytes arrived where a close was expected"),
        Ok(Err(e)) => assert!(
            matches!(
                e.kind(),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
            ),
            "{e}"
        ),
    }
}

async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn read_exactly(stream: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    timeout(DEADLINE, stream.read_exact(&mut got))
        .await
        .expect("bytes within deadline")
        .unwrap();
    got
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

fn delay(delay_ms: u64, jitter_ms: u64) -> DirectionFaults {
    DirectionFaults {
        delay_ms,
        jitter_ms,
        ..DirectionFaults::default()
    }
}

#[tokio::test]
async fn pass_through_keeps_a_megabyte_intact_and_counts_connections() {
    let (_, proxy) = echo_behind_proxy().await;
    let mut client = connect(proxy.local_addr()).await;
    let rtt = min_round_trip(&mut client, 3).await;
    assert!(rtt < Duration::from_secs(1), "no-fault round trip {rtt:?}");
    assert_eq!(proxy.connections(), 1);

    let data = pattern(1 << 20);
    let (mut rd, mut wr) = client.split();
    let write = async {
        wr.write_all(&data).await.unwrap();
        wr.shutdown().await.unwrap();
    };
    let read = async {
        let mut got = Vec::new();
        rd.read_to_end(&mut got).await.unwrap();
        got
    };
    let ((), got) = timeout(DEADLINE, async { tokio::join!(write, read) })
        .await
        .expect("transfer within deadline");
    assert_eq!(got.len(), data.len());
    assert!(got == data, "echoed bytes differ");
    // Half-close travelled both ways: the proxy's connection is gone.
    wait_until("connection count back to 0", || proxy.connections() == 0).await;
}

#[tokio::test]
async fn delay_adds_at_least_its_value_to_live_and_new_connections_and_clears() {
    let (_, proxy) = echo_behind_proxy().await;
    let mut live = connect(proxy.local_addr()).await;
    round_trip(&mut live, b"warm-up").await;

    proxy
        .set_faults(Faults {
            to_upstream: delay(40, 0),
            to_client: delay(30, 0),
            ..Faults::default()
        })
        .unwrap();
    let min = min_round_trip(&mut live, 5).await;
    assert!(min >= Duration::from_millis(70), "live connection: {min:?}");
    let mut fresh = connect(proxy.local_addr()).await;
    let min = min_round_trip(&mut fresh, 3).await;
    assert!(min >= Duration::from_millis(70), "new connection: {min:?}");

    proxy.clear_faults();
    let min = min_round_trip(&mut live, 10).await;
    assert!(
        min < Duration::from_millis(60),
        "delay still applied: {min:?}"
    );
}

#[tokio::test]
async fn jitter_varies_round_trips_but_keeps_byte_order() {
    let (_, proxy) = echo_behind_proxy().await;
    proxy
        .set_faults(Faults {
            seed: 42,
            to_upstream: delay(0, 40),
            to_client: delay(0, 40),
            ..Faults::default()
        })
        .unwrap();
    let mut client = connect(proxy.local_addr()).await;
    let mut rtts = Vec::new();
    for i in 0..10 {
        rtts.push(round_trip(&mut client, format!("j{i}").as_bytes()).await);
    }
    let spread = *rtts.iter().max().unwrap() - *rtts.iter().min().unwrap();
    assert!(spread >= Duration::from_millis(10), "rtts {rtts:?}");

    // Many small writes, each its own chunk with its own jitter, still arrive in order.
    let count = 500u32;
    let (mut rd, mut wr) = client.split();
    let write = async {
        for i in 0..count {
            wr.write_all(&i.to_be_bytes()).await.unwrap();
        }
    };
    let read = async {
        let mut got = vec![0u8; count as usize * 4];
        rd.read_exact(&mut got).await.unwrap();
        got
    };
    let ((), got) = timeout(DEADLINE, async { tokio::join!(write, read) })
        .await
        .expect("pipelined writes within deadline");
    for (i, word) in got.chunks_exact(4).enumerate() {
        let n = u32::from_be_bytes(word.try_into().unwrap());
        assert_eq!(n, i as u32, "byte order broken at message {i}");
    }
}

#[tokio::test]
async fn black_hole_swallows_everything_then_resets_only_connections_that_lost_bytes() {
    let (echo, proxy) = echo_behind_proxy().await;
    let mut active = connect(proxy.local_addr()).await;
    round_trip(&mut active, b"before").await;
    let mut idle = connect(proxy.local_addr()).await;
    round_trip(&mut idle, b"before").await;
    let received_before = echo.received();

    proxy
        .set_faults(Faults {
            black_hole: true,
            ..Faults::default()
        })
        .unwrap();
    active.write_all(b"swallowed").await.unwrap();
    expect_silence(&mut active).await;
    let mut new_talker = connect(proxy.local_addr()).await;
    new_talker.write_all(b"hello?").await.unwrap();
    expect_silence(&mut new_talker).await;
    let mut new_idle = connect(proxy.local_addr()).await;
    wait_until("four live connections", || proxy.connections() == 4).await;
    assert_eq!(echo.received(), received_before, "bytes leaked upstream");

    proxy.clear_faults();
    expect_reset(&mut active).await;
    expect_reset(&mut new_talker).await;
    round_trip(&mut idle, b"after").await;
    round_trip(&mut new_idle, b"after").await;
    let mut fresh = connect(proxy.local_addr()).await;
    round_trip(&mut fresh, b"after").await;
    assert_eq!(
        echo.received(),
        received_before + 3 * b"after".len(),
        "swallowed bytes reached the upstream after healing"
    );
}

#[tokio::test]
async fn reset_fault_resets_live_and_new_connections_until_cleared() {
    let (_, proxy) = echo_behind_proxy().await;
    let mut live = connect(proxy.local_addr()).await;
    round_trip(&mut live, b"before").await;

    proxy
        .set_faults(Faults {
            reset: true,
            ..Faults::default()
        })
        .unwrap();
    expect_reset(&mut live).await;
    let mut fresh = connect(proxy.local_addr()).await;
    expect_reset(&mut fresh).await;
    wait_until("no live connection", || proxy.connections() == 0).await;

    proxy.set_faults(Faults::none()).unwrap();
    let mut after = connect(proxy.local_addr()).await;
    round_trip(&mut after, b"after").await;
}

#[tokio::test]
async fn reset_all_resets_live_connections_but_not_later_ones() {
    let (_, proxy) = echo_behind_proxy().await;
    let mut a = connect(proxy.local_addr()).await;
    let mut b = connect(proxy.local_addr()).await;
    round_trip(&mut a, b"a").await;
    round_trip(&mut b, b"b").await;

    assert_eq!(proxy.reset_all(), 2);
    expect_reset(&mut a).await;
    expect_reset(&mut b).await;
    let mut later = connect(proxy.local_addr()).await;
    round_trip(&mut later, b"later").await;
    round_trip(&mut later, b"still").await;
    assert_eq!(proxy.connections(), 1);
}

/// Connects, sends, and says whether the connection was served (`true`) or refused.
async fn served(proxy: SocketAddr) -> bool {
    let mut stream = connect(proxy).await;
    if stream.write_all(b"x").await.is_err() {
        return false;
    }
    let mut buf = [0u8; 1];
    match timeout(DEADLINE, stream.read(&mut buf)).await {
        Err(_) => panic!("neither served nor refused within {DEADLINE:?}"),
        Ok(Ok(1)) => true,
        Ok(Ok(_)) | Ok(Err(_)) => false,
    }
}

#[tokio::test]
async fn refusal_closes_new_connections_only_and_is_reproducible_by_seed() {
    let (echo, proxy) = echo_behind_proxy().await;
    let mut live = connect(proxy.local_addr()).await;
    round_trip(&mut live, b"before").await;

    proxy
        .set_faults(Faults {
            refuse_probability: 1.0,
            ..Faults::default()
        })
        .unwrap();
    let mut refused = connect(proxy.local_addr()).await;
    expect_reset(&mut refused).await;
    round_trip(&mut live, b"existing connections keep working").await;

    let half = Faults {
        seed: 9,
        refuse_probability: 0.5,
        ..Faults::default()
    };
    let mut patterns = Vec::new();
    for _ in 0..2 {
        let proxy = ChaosProxy::start(any_port(), echo.addr).await.unwrap();
        proxy.set_faults(half.clone()).unwrap();
        let mut pattern = Vec::new();
        for _ in 0..20 {
            pattern.push(served(proxy.local_addr()).await);
        }
        patterns.push(pattern);
    }
    let refused = patterns[0].iter().filter(|s| !**s).count();
    assert!(0 < refused && refused < 20, "pattern {:?}", patterns[0]);
    assert_eq!(patterns[0], patterns[1], "same seed, different refusals");
}

#[tokio::test]
async fn per_chunk_reset_resets_the_connection_instead_of_forwarding() {
    let (echo, proxy) = echo_behind_proxy().await;
    let mut live = connect(proxy.local_addr()).await;
    round_trip(&mut live, b"before").await;
    let received_before = echo.received();

    proxy
        .set_faults(Faults {
            to_upstream: DirectionFaults {
                reset_probability: 1.0,
                ..DirectionFaults::default()
            },
            ..Faults::default()
        })
        .unwrap();
    live.write_all(b"never forwarded").await.unwrap();
    expect_reset(&mut live).await;
    assert_eq!(echo.received(), received_before);

    // Resetting on the way back: the upstream got the request, the client never the answer.
    proxy
        .set_faults(Faults {
            to_client: DirectionFaults {
                reset_probability: 1.0,
                ..DirectionFaults::default()
            },
            ..Faults::default()
        })
        .unwrap();
    let mut fresh = connect(proxy.local_addr()).await;
    fresh.write_all(b"request").await.unwrap();
    expect_reset(&mut fresh).await;
    wait_until("request reached the upstream", || {
        echo.received() == received_before + b"request".len()
    })
    .await;
}

#[tokio::test]
async fn bandwidth_cap_makes_n_bytes_take_at_least_n_over_rate_each_way() {
    let (_, proxy) = echo_behind_proxy().await;
    let rate = 100_000u64;
    let len = 60_000usize;
    let minimum = Duration::from_secs_f64(len as f64 / rate as f64);
    let capped = DirectionFaults {
        bandwidth_bytes_per_second: Some(rate),
        ..DirectionFaults::default()
    };
    for faults in [
        Faults {
            to_upstream: capped.clone(),
            ..Faults::default()
        },
        Faults {
            to_client: capped.clone(),
            ..Faults::default()
        },
    ] {
        proxy.set_faults(faults.clone()).unwrap();
        let mut client = connect(proxy.local_addr()).await;
        let data = pattern(len);
        let start = Instant::now();
        let (mut rd, mut wr) = client.split();
        let write = async { wr.write_all(&data).await.unwrap() };
        let read = async {
            let mut got = vec![0u8; len];
            rd.read_exact(&mut got).await.unwrap();
            got
        };
        let ((), got) = timeout(DEADLINE, async { tokio::join!(write, read) })
            .await
            .expect("capped transfer within deadline");
        let took = start.elapsed();
        assert!(got == data, "bytes changed under {faults:?}");
        assert!(took >= minimum, "{took:?} < {minimum:?} under {faults:?}");
    }
}

#[tokio::test]
async fn one_way_cut_holds_one_direction_while_the_other_flows_and_heals() {
    let (upstream, mut accepted) = spawn_capture().await;
    let proxy = ChaosProxy::start(any_port(), upstream).await.unwrap();
    let mut client = connect(proxy.local_addr()).await;
    let mut server = timeout(DEADLINE, accepted.recv())
        .await
        .expect("upstream connection within deadline")
        .unwrap();

    // Client → upstream cut, then upstream → client cut.
    one_way_cut_holds_then_delivers(
        &proxy,
        Direction::ToUpstream,
        &mut client,
        &mut server,
        b"ping",
        b"pong",
    )
    .await;
    one_way_cut_holds_then_delivers(
        &proxy,
        Direction::ToClient,
        &mut server,
        &mut client,
        b"late",
        b"up",
    )
    .await;
}

/// Cuts `direction` (from `sender` to `receiver`): `held` written by `sender`
/// does not arrive while `flowing` written back by `receiver` does; once the
/// cut is cleared, `held` arrives intact.
async fn one_way_cut_holds_then_delivers(
    proxy: &ChaosProxy,
    direction: Direction,
    sender: &mut TcpStream,
    receiver: &mut TcpStream,
    held: &[u8],
    flowing: &[u8],
) {
    let cut = DirectionFaults {
        cut: true,
        ..DirectionFaults::default()
    };
    let faults = match direction {
        Direction::ToUpstream => Faults {
            to_upstream: cut,
            ..Faults::default()
        },
        Direction::ToClient => Faults {
            to_client: cut,
            ..Faults::default()
        },
    };
    proxy.set_faults(faults).unwrap();
    sender.write_all(held).await.unwrap();
    receiver.write_all(flowing).await.unwrap();
    assert_eq!(read_exactly(sender, flowing.len()).await, flowing);
    expect_silence(receiver).await;
    proxy.clear_faults();
    assert_eq!(
        read_exactly(receiver, held.len()).await,
        held,
        "held bytes lost"
    );
}

#[tokio::test]
async fn connections_beyond_the_limit_are_reset_at_accept() {
    let echo = spawn_echo().await;
    let config = ProxyConfig {
        connections_max: 2,
        ..ProxyConfig::default()
    };
    let proxy = ChaosProxy::start_with(any_port(), echo.addr, config)
        .await
        .unwrap();
    let mut a = connect(proxy.local_addr()).await;
    let mut b = connect(proxy.local_addr()).await;
    round_trip(&mut a, b"a").await;
    round_trip(&mut b, b"b").await;
    let mut over = connect(proxy.local_addr()).await;
    expect_reset(&mut over).await;

    drop(a);
    wait_until("one connection left", || proxy.connections() == 1).await;
    let mut c = connect(proxy.local_addr()).await;
    round_trip(&mut c, b"c").await;
}

#[tokio::test]
async fn invalid_faults_are_refused_and_change_nothing() {
    let (echo, proxy) = echo_behind_proxy().await;
    let good = Faults {
        seed: 3,
        to_client: delay(5, 0),
        ..Faults::default()
    };
    proxy.set_faults(good.clone()).unwrap();
    let bad = Faults {
        refuse_probability: 2.0,
        ..Faults::default()
    };
    assert!(matches!(
        proxy.set_faults(bad),
        Err(ChaosError::InvalidFaults(_))
    ));
    assert_eq!(proxy.faults(), good);
    let bad_config = ProxyConfig {
        chunk_bytes_max: 0,
        ..ProxyConfig::default()
    };
    assert!(matches!(
        ChaosProxy::start_with(any_port(), echo.addr, bad_config).await,
        Err(ChaosError::InvalidConfig(_))
    ));
}

#[tokio::test]
async fn stop_and_drop_close_the_listener_and_every_connection() {
    let (echo, proxy) = echo_behind_proxy().await;
    let addr = proxy.local_addr();
    let mut live = connect(addr).await;
    round_trip(&mut live, b"before").await;
    timeout(DEADLINE, proxy.stop())
        .await
        .expect("stop within deadline");
    expect_closed(&mut live).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "listener still open"
    );

    let proxy = ChaosProxy::start(any_port(), echo.addr).await.unwrap();
    let mut live = connect(proxy.local_addr()).await;
    round_trip(&mut live, b"before").await;
    drop(proxy);
    expect_closed(&mut live).await;
}

/// Starts the `cms-chaos-proxy` binary; returns the child and its proxy and control addresses.
async fn spawn_binary(upstream: SocketAddr) -> (tokio::process::Child, SocketAddr, SocketAddr) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cms-chaos-proxy"))
        .args(["--listen", "127.0.0.1:0", "--upstream"])
        .arg(upstream.to_string())
        .args(["--control-port", "0", "--log-level", "warn"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    timeout(DEADLINE, BufReader::new(stdout).read_line(&mut line))
        .await
        .expect("ready line within deadline")
        .unwrap();
    let field = |name: &str| -> SocketAddr {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .parse()
            .unwrap()
    };
    let (listen, control) = (field("listen="), field("control="));
    (child, listen, control)
}

#[tokio::test]
async fn http_control_binary_changes_faults_at_run_time() {
    let echo = spawn_echo().await;
    let (mut child, listen, control) = spawn_binary(echo.addr).await;
    let remote = RemoteChaosProxy::new(control).unwrap();
    assert!(remote.ready().await.unwrap());
    assert_eq!(remote.faults().await.unwrap(), Faults::none());

    let mut first = connect(listen).await;
    round_trip(&mut first, b"through the binary").await;
    let black_hole = Faults {
        black_hole: true,
        ..Faults::default()
    };
    assert_eq!(remote.set_faults(&black_hole).await.unwrap(), black_hole);
    assert_eq!(remote.faults().await.unwrap(), black_hole);
    first.write_all(b"swallowed").await.unwrap();
    expect_silence(&mut first).await;
    remote.set_faults(&Faults::none()).await.unwrap();
    expect_reset(&mut first).await;

    let mut second = connect(listen).await;
    round_trip(&mut second, b"healed").await;
    remote
        .set_faults(&Faults {
            to_client: delay(50, 0),
            ..Faults::default()
        })
        .await
        .unwrap();
    let min = min_round_trip(&mut second, 3).await;
    assert!(min >= Duration::from_millis(50), "{min:?}");

    // Invalid values and unknown fields answer 400 and change nothing.
    let invalid = Faults {
        refuse_probability: 2.0,
        ..Faults::default()
    };
    let err = remote.set_faults(&invalid).await.unwrap_err();
    assert!(err.to_string().contains("400"), "{err}");
    let raw = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .put(format!("http://{control}/faults"))
        .header("content-type", "application/json")
        .body(r#"{"blackhole": true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), reqwest::StatusCode::BAD_REQUEST);
    assert_eq!(remote.faults().await.unwrap().to_client.delay_ms, 50);

    assert_eq!(remote.connections().await.unwrap(), 1);
    assert_eq!(remote.reset_all().await.unwrap(), 1);
    expect_reset(&mut second).await;

    child.start_kill().unwrap();
    timeout(DEADLINE, child.wait())
        .await
        .expect("binary exits after kill")
        .unwrap();
}
