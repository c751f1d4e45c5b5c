//! Free loopback TCP ports for the processes a test starts.
//!
//! A port comes from the kernel (`bind 127.0.0.1:0`), and the listener is closed
//! before the port is handed out, so a child process can bind it. What this
//! promises: within one test process, no port is ever handed out twice, even
//! after the process holding it died (a restarted process keeps its ports; a new
//! one never gets them). Across test processes the kernel's choice is the only
//! guard, which is why ports are taken as late as possible, right before spawn.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{Mutex, OnceLock};

/// Attempts at finding a port not handed out yet before giving up.
const PORT_ATTEMPTS_MAX: usize = 1_000;

fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A loopback port that was free a moment ago and that this process has never
/// handed out before.
///
/// # Panics
/// If the kernel refuses to bind a loopback socket, or keeps returning ports
/// already handed out ([`PORT_ATTEMPTS_MAX`] times).
pub fn free_port() -> u16 {
    for _ in 0..PORT_ATTEMPTS_MAX {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"));
        let port = match listener.local_addr() {
            Ok(addr) => addr.port(),
            Err(e) => panic!("cannot read the address of a loopback socket: {e}"),
        };
        drop(listener);
        let mut ports = handed_out().lock().unwrap_or_else(|e| e.into_inner());
        if ports.insert(port) {
            return port;
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
}
