//! One proxied TCP connection: black-hole gate, upstream dial, then two pumps (one per
//! direction) and a controller watching the faults, all in one task.
//!
//! Each pump is a reader and a writer joined by a channel of at most `in_flight_chunks_max`
//! chunks of at most `chunk_bytes_max` bytes: the reader stamps each chunk with the time it may
//! leave (delay + jitter, never earlier than the chunk before it, so byte order is kept) and
//! draws the per-chunk reset; the writer waits for that time, for a cut to heal and for
//! bandwidth tokens, and discards while the black hole is on.
//!
//! Promises: bytes are forwarded in order or the connection is reset, never delivered with a hole;
//! a reset sets `SO_LINGER 0` on both sockets so both peers get RST; everything ends when the
//! proxy shuts down or is dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Buf, Bytes};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{Instrument, debug};

use super::bucket::TokenBucket;
use super::faults::Direction;
use super::{Control, ProxyConfig};

/// What one connection needs from the proxy.
pub(crate) struct Connection {
    pub(crate) id: u64,
    pub(crate) upstream: SocketAddr,
    pub(crate) config: ProxyConfig,
    pub(crate) control: watch::Receiver<Control>,
    /// Seed of this connection's random choices, drawn from the proxy's seeded generator.
    pub(crate) seed: u64,
    /// `Control::reset_epoch` when the connection was accepted.
    pub(crate) start_epoch: u64,
}

/// How a connection ends.
#[derive(Debug)]
enum End {
    /// Both directions reached EOF and were flushed: close normally.
    Finished,
    /// The proxy is stopping: close normally.
    Shutdown,
    /// Close both sockets with RST.
    Reset(&'static str),
    /// An I/O error on one side: reset the other so the failure propagates.
    Io(std::io::Error),
}

/// A slice of the byte stream in flight inside the proxy.
struct Chunk {
    bytes: Bytes,
    /// Not forwarded before this instant.
    due: Instant,
}

/// Runs the connection to its end.
pub(crate) async fn run(mut client: TcpStream, mut conn: Connection) {
    let span = tracing::debug_span!("chaos_connection", id = conn.id);
    async move {
        let poisoned = AtomicBool::new(false);
        if let Err(end) = hold_while_black_holed(&mut client, &mut conn, &poisoned).await {
            finish(end, &client, None);
            return;
        }
        let mut upstream = match dial_upstream(&mut conn, &poisoned).await {
            Ok(upstream) => upstream,
            Err(end) => {
                finish(end, &client, None);
                return;
            }
        };
        let end = pump(&mut client, &mut upstream, &conn, &poisoned).await;
        finish(end, &client, Some(&upstream));
    }
    .instrument(span)
    .await
}

/// Sets `SO_LINGER 0` when the connection must end with RST; the caller then drops the sockets.
fn finish(end: End, client: &TcpStream, upstream: Option<&TcpStream>) {
    let rst = match &end {
        End::Finished => {
            debug!("connection finished");
            false
        }
        End::Shutdown => {
            debug!("connection closed by proxy shutdown");
            false
        }
        End::Reset(why) => {
            debug!(why, "connection reset");
            true
        }
        End::Io(error) => {
            debug!(%error, "connection failed; resetting the other side");
            true
        }
    };
    if rst {
        // Best effort: a socket the peer already reset cannot take the option, and needs no RST.
        let _ = client.set_zero_linger();
        if let Some(upstream) = upstream {
            let _ = upstream.set_zero_linger();
        }
    }
}

/// The control decision that ends a connection regardless of traffic, if any.
fn verdict(control: &Control, start_epoch: u64, poisoned: &AtomicBool) -> Option<End> {
    if control.shutdown {
        Some(End::Shutdown)
    } else if control.faults.reset {
        Some(End::Reset("reset fault"))
    } else if control.reset_epoch != start_epoch {
        Some(End::Reset("reset_all"))
    } else if !control.faults.black_hole && poisoned.load(Ordering::SeqCst) {
        Some(End::Reset("black hole lifted after discarding bytes"))
    } else {
        None
    }
}

/// Ends when the faults say the connection must end.
async fn watch_control(
    mut control: watch::Receiver<Control>,
    start_epoch: u64,
    poisoned: &AtomicBool,
) -> End {
    loop {
        if let Some(end) = verdict(&control.borrow_and_update(), start_epoch, poisoned) {
            return end;
        }
        if control.changed().await.is_err() {
            return End::Shutdown;
        }
    }
}

/// A connection accepted during a black hole reads and discards its client's bytes, and does not
/// dial the upstream, until the black hole is lifted.
async fn hold_while_black_holed(
    client: &mut TcpStream,
    conn: &mut Connection,
    poisoned: &AtomicBool,
) -> Result<(), End> {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        {
            let control = conn.control.borrow_and_update();
            if let Some(end) = verdict(&control, conn.start_epoch, poisoned) {
                return Err(end);
            }
            if !control.faults.black_hole {
                return Ok(());
            }
        }
        if buf.is_empty() {
            buf = vec![0; conn.config.chunk_bytes_max];
        }
        tokio::select! {
            changed = conn.control.changed() => {
                if changed.is_err() {
                    return Err(End::Shutdown);
                }
            }
            read = client.read(&mut buf) => match read {
                Ok(0) => return Err(End::Finished),
                Ok(_) => poisoned.store(true, Ordering::SeqCst),
                Err(e) => return Err(End::Io(e)),
            },
        }
    }
}

/// Connects to the upstream within `upstream_connect_timeout_ms`, giving up early if the faults
/// end the connection.
async fn dial_upstream(conn: &mut Connection, poisoned: &AtomicBool) -> Result<TcpStream, End> {
    let timeout = Duration::from_millis(conn.config.upstream_connect_timeout_ms);
    let dial = tokio::time::timeout(timeout, TcpStream::connect(conn.upstream));
    tokio::select! {
        end = watch_control(conn.control.clone(), conn.start_epoch, poisoned) => Err(end),
        dialled = dial => match dialled {
            Ok(Ok(upstream)) => {
                // Latency is what the faults say it is, not what Nagle adds.
                let _ = upstream.set_nodelay(true);
                Ok(upstream)
            }
            Ok(Err(e)) => Err(End::Io(e)),
            Err(_) => Err(End::Reset("upstream connect timed out")),
        },
    }
}

/// Forwards both directions until both end, or the faults end the connection.
async fn pump(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    conn: &Connection,
    poisoned: &AtomicBool,
) -> End {
    let mut rng = StdRng::seed_from_u64(conn.seed);
    let (client_read, client_write) = client.split();
    let (upstream_read, upstream_write) = upstream.split();
    let to_upstream = direction(
        Direction::ToUpstream,
        client_read,
        upstream_write,
        conn,
        StdRng::seed_from_u64(rng.random()),
        poisoned,
    );
    let to_client = direction(
        Direction::ToClient,
        upstream_read,
        client_write,
        conn,
        StdRng::seed_from_u64(rng.random()),
        poisoned,
    );
    tokio::select! {
        end = watch_control(conn.control.clone(), conn.start_epoch, poisoned) => end,
        both = async { tokio::try_join!(to_upstream, to_client) } => match both {
            Ok(_) => End::Finished,
            Err(end) => end,
        },
    }
}

/// One direction: a reader and a writer joined by a bounded channel.
async fn direction(
    dir: Direction,
    src: ReadHalf<'_>,
    dst: WriteHalf<'_>,
    conn: &Connection,
    rng: StdRng,
    poisoned: &AtomicBool,
) -> Result<(), End> {
    let (tx, rx) = mpsc::channel(conn.config.in_flight_chunks_max);
    let reader = read_side(
        dir,
        src,
        tx,
        conn.control.clone(),
        rng,
        conn.config.chunk_bytes_max,
    );
    let writer = write_side(
        dir,
        dst,
        rx,
        conn.control.clone(),
        poisoned,
        conn.config.chunk_bytes_max,
    );
    tokio::try_join!(reader, writer).map(|_| ())
}

/// Reads chunks, draws the per-chunk reset and stamps each chunk with its departure time.
async fn read_side(
    dir: Direction,
    mut src: ReadHalf<'_>,
    tx: mpsc::Sender<Chunk>,
    control: watch::Receiver<Control>,
    mut rng: StdRng,
    chunk_bytes_max: usize,
) -> Result<(), End> {
    let mut buf = vec![0u8; chunk_bytes_max];
    let mut last_due = Instant::now();
    loop {
        let n = src.read(&mut buf).await.map_err(End::Io)?;
        if n == 0 {
            // Dropping `tx` lets the writer flush what is in flight, then half-close.
            return Ok(());
        }
        let (delay_ms, jitter_ms, reset_probability) = {
            let control = control.borrow();
            let f = dir.of(&control.faults);
            (f.delay_ms, f.jitter_ms, f.reset_probability)
        };
        if reset_probability > 0.0 && rng.random_bool(reset_probability) {
            debug!(direction = dir.name(), "injected per-chunk reset");
            return Err(End::Reset("per-chunk reset"));
        }
        let jitter_us = if jitter_ms > 0 {
            rng.random_range(0..=jitter_ms.saturating_mul(1000))
        } else {
            0
        };
        let wanted =
            Instant::now() + Duration::from_millis(delay_ms) + Duration::from_micros(jitter_us);
        let due = wanted.max(last_due);
        last_due = due;
        let chunk = Chunk {
            bytes: Bytes::copy_from_slice(&buf[..n]),
            due,
        };
        if tx.send(chunk).await.is_err() {
            // The writer ended; its result decides how the connection ends.
            return Ok(());
        }
    }
}

/// Forwards chunks when due, holding while cut, pacing under a bandwidth cap, discarding while
/// black-holed; half-closes `dst` after the reader's EOF.
async fn write_side(
    dir: Direction,
    mut dst: WriteHalf<'_>,
    mut rx: mpsc::Receiver<Chunk>,
    mut control: watch::Receiver<Control>,
    poisoned: &AtomicBool,
    chunk_bytes_max: usize,
) -> Result<(), End> {
    let mut bucket: Option<TokenBucket> = None;
    while let Some(chunk) = rx.recv().await {
        if chunk.due > Instant::now() {
            tokio::time::sleep_until(chunk.due).await;
        }
        let mut data = chunk.bytes;
        while !data.is_empty() {
            let (black_hole, rate) = {
                let control = control
                    .wait_for(|c| c.shutdown || c.faults.black_hole || !dir.of(&c.faults).cut)
                    .await
                    .map_err(|_| End::Shutdown)?;
                if control.shutdown {
                    return Err(End::Shutdown);
                }
                (
                    control.faults.black_hole,
                    dir.of(&control.faults).bandwidth_bytes_per_second,
                )
            };
            if black_hole {
                poisoned.store(true, Ordering::SeqCst);
                break;
            }
            if poisoned.load(Ordering::SeqCst) {
                return Err(End::Reset("bytes were discarded by a black hole"));
            }
            let n = match rate {
                None => {
                    bucket = None;
                    data.len()
                }
                Some(rate) => {
                    if bucket.as_ref().map(TokenBucket::rate_bytes_per_second) != Some(rate) {
                        // A new or changed cap starts from an empty bucket.
                        bucket = None;
                    }
                    let b = bucket.get_or_insert_with(|| {
                        TokenBucket::new(rate, chunk_bytes_max, Instant::now().into_std())
                    });
                    match b.take(data.len(), Instant::now().into_std()) {
                        Ok(n) => n,
                        Err(wait) => {
                            tokio::time::sleep(wait).await;
                            continue;
                        }
                    }
                }
            };
            dst.write_all(&data[..n]).await.map_err(End::Io)?;
            data.advance(n);
        }
    }
    dst.shutdown().await.map_err(End::Io)
}
