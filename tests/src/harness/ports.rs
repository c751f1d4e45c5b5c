//! Free loopback TCP ports for the processes a test starts.
//!
//! Ports are handed out from below the kernel's ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`), so no socket that any process
//! binds to port 0 or connects from (an in-process bookie's gRPC listener, a
//! client's outgoing connection) can take a port between the moment it is
//! handed out and the moment the child process binds it.
//!
//! What this promises:
//! - within one test process, no port is ever handed out twice, even after the
//!   process holding it died (a restarted process keeps its ports; a new one
//!   never gets them);
//! - across test processes running at the same time (nextest runs each test in
//!   its own process), no port is handed out twice either: each handed-out
//!   port is held by an exclusive `flock` on a lock file under the temp
//!   directory for the life of the test process, and the kernel drops the lock
//!   when that process exits, however it exits.
//!
//! If the ephemeral range leaves no room below it, ports come from the kernel
//! (`bind 127.0.0.1:0`) as a fallback, guarded only within this process.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use nix::fcntl::{Flock, FlockArg};
use rand::Rng;

/// Attempts at finding a port not handed out yet before giving up.
const PORT_ATTEMPTS_MAX: usize = 1_000;
/// Lowest port handed out; below are well-known and commonly configured ports.
const RANGE_LOW: u16 = 10_000;
/// The smallest range below the ephemeral range worth using.
const RANGE_WIDTH_MIN: u16 = 1_000;

struct Registry {
    handed_out: HashSet<u16>,
    /// Locks held until this process exits.
    locks: Vec<Flock<File>>,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        Mutex::new(Registry {
            handed_out: HashSet::new(),
            locks: Vec::new(),
        })
    })
}

/// Ports `[RANGE_LOW, ephemeral low)`, or `None` when that range is too small.
fn usable_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let ephemeral_low: u16 = text.split_whitespace().next()?.parse().ok()?;
    (ephemeral_low >= RANGE_LOW.saturating_add(RANGE_WIDTH_MIN))
        .then_some((RANGE_LOW, ephemeral_low))
}

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("cms-test-ports")
}

/// Takes the cross-process lock on `port`, or `None` if another process holds it.
fn lock_port(port: u16) -> Option<Flock<File>> {
    let dir = lock_dir();
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| {
        panic!(
            "cannot create the port lock directory {}: {e}",
            dir.display()
        )
    });
    let path = dir.join(format!("{port}.lock"));
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot open the port lock file {}: {e}", path.display()));
    Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()
}

fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

fn kernel_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"));
    match listener.local_addr() {
        Ok(addr) => addr.port(),
        Err(e) => panic!("cannot read the address of a loopback socket: {e}"),
    }
}

/// A loopback port that is free now, that this process has never handed out
/// before, and that no other test process holds.
///
/// # Panics
/// If the kernel refuses to bind a loopback socket, or no such port is found
/// in [`PORT_ATTEMPTS_MAX`] attempts.
pub fn free_port() -> u16 {
    let range = usable_range();
    let mut rng = rand::rng();
    let mut registry = registry().lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..PORT_ATTEMPTS_MAX {
        match range {
            Some((low, high)) => {
                let port = rng.random_range(low..high);
                if registry.handed_out.contains(&port) {
                    continue;
                }
                let Some(lock) = lock_port(port) else {
                    continue;
                };
                if !bindable(port) {
                    continue;
                }
                registry.handed_out.insert(port);
                registry.locks.push(lock);
                return port;
            }
            None => {
                let port = kernel_port();
                if registry.handed_out.insert(port) {
                    return port;
                }
            }
        }
    }
    panic!("no new free loopback port after {PORT_ATTEMPTS_MAX} attempts");
}

/// `n` distinct free loopback ports (see [`free_port`]).
pub fn free_ports(n: usize) -> Vec<u16> {
    (0..n).map(|_| free_port()).collect()
}

/// `127.0.0.1:<port>`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice() {
        let ports = free_ports(200);
        let unique: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len());
        assert!(ports.iter().all(|p| *p != 0));
    }

    #[test]
    fn a_handed_out_port_can_be_bound() {
        let port = free_port();
        TcpListener::bind(loopback(port)).unwrap();
    }

    #[test]
    fn handed_out_ports_are_below_the_ephemeral_range() {
        let Some((low, high)) = usable_range() else {
            return;
        };
        for port in free_ports(20) {
            assert!((low..high).contains(&port), "{port} not in {low}..{high}");
        }
    }

    #[test]
    fn a_handed_out_port_is_locked_against_other_processes() {
        if usable_range().is_none() {
            return;
        }
        let port = free_port();
        // A second open file description stands for another process: flock
        // locks belong to the open file description.
        assert!(lock_port(port).is_none(), "port {port} lock was not held");
    }
}
