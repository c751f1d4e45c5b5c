//! Real network partitions: a pair of network namespaces joined by a veth link,
//! which a test can cut and heal.
//!
//! [`NetnsPair::create`] makes two namespaces of its own (`cms-netns-<pid>-<n>-a`
//! and `-b`), a veth pair between them with [`ADDR_A`] and [`ADDR_B`] on a /30
//! that exists only between these two namespaces (the host's network is never
//! touched), and brings the links and each namespace's loopback up.
//! [`NetnsPair::cut`] sets both ends of the link down: packets in flight and
//! new ones are lost, so live TCP connections stall and new connects fail, as
//! in a partition. [`NetnsPair::heal`] brings the link back. Dropping the pair
//! deletes both namespaces (which destroys the veth pair), also on panic.
//!
//! Code runs inside a namespace through [`NetnsPair::run_in`] (a thread of its
//! own that enters the namespace: sockets it creates stay in that namespace
//! wherever they are used later) or, for a child process, by prefixing its
//! command line with [`NetnsPair::exec_prefix`] (`ip netns exec <name>`).
//!
//! Needs root (or `CAP_SYS_ADMIN` + `CAP_NET_ADMIN`) and iproute2. Without
//! them, [`NetnsPair::create`] fails with an error that says what is missing;
//! nothing is skipped. Namespaces left by a process that died without dropping
//! its pair (SIGKILL) are deleted by the next [`NetnsPair::create`].
//!
//! ```no_run
//! use cms_tests::harness::netns::{NetnsPair, Side};
//! let mut pair = NetnsPair::create().unwrap();
//! let listener = pair
//!     .run_in(Side::A, || std::net::TcpListener::bind((pair.addr(Side::A), 0)))
//!     .unwrap()
//!     .unwrap();
//! pair.cut().unwrap();
//! pair.heal().unwrap();
//! # drop(listener);
//! ```

use std::fs::File;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sched::{CloneFlags, setns};

use super::HarnessError;

/// Address of side A's end of the link.
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 1);
/// Address of side B's end of the link.
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 2);
/// Prefix length of the link's subnet: a /30 holds exactly the two ends.
pub const PREFIX_LEN: u8 = 30;

/// Prefix of the namespaces this module makes; the pid of the maker follows.
const NAME_PREFIX: &str = "cms-netns-";
/// Where iproute2 keeps named namespaces.
const NETNS_RUN_DIR: &str = "/var/run/netns";

/// Pairs made by this process so far (part of each name).
static PAIRS_MADE: AtomicU32 = AtomicU32::new(0);

/// One side of a [`NetnsPair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The namespace holding [`ADDR_A`].
    A,
    /// The namespace holding [`ADDR_B`].
    B,
}

/// Two network namespaces joined by a veth link; deleted on drop.
#[derive(Debug)]
pub struct NetnsPair {
    ns_a: String,
    ns_b: String,
    veth_a: String,
    veth_b: String,
    cut: bool,
}

/// Runs `ip args...`; an error carries the command and its stderr.
fn ip(args: &[&str]) -> Result<(), HarnessError> {
    let command = format!("ip {}", args.join(" "));
    let output = Command::new("ip").args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            HarnessError::IpMissing
        } else {
            HarnessError::io(format!("run `{command}`"), e)
        }
    })?;
    if output.status.success() {
        return Ok(());
    }
    Err(HarnessError::Command {
        command,
        status: output.status.to_string(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
    })
}

/// Deletes namespaces of this module whose maker process is gone.
fn delete_stale_namespaces() {
    let Ok(entries) = std::fs::read_dir(NETNS_RUN_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(NAME_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            tracing::info!(netns = %name, pid, "deleting a network namespace left by a dead test process");
            if let Err(e) = ip(&["netns", "del", &name]) {
                tracing::warn!(netns = %name, error = %e, "could not delete a stale network namespace");
            }
        }
    }
}

impl NetnsPair {
    /// Makes the two namespaces and the link between them, up and addressed.
    ///
    /// Fails with [`HarnessError::IpMissing`] without iproute2, and with
    /// [`HarnessError::Command`] (the command and its stderr) when the OS
    /// refuses, e.g. without root. Whatever was made before a failure is removed.
    pub fn create() -> Result<NetnsPair, HarnessError> {
        delete_stale_namespaces();
        let pid = std::process::id();
        let n = PAIRS_MADE.fetch_add(1, Ordering::Relaxed);
        // Interface names are at most 15 bytes: "cv" + pid (<= 7 digits) + n + side.
        let pair = NetnsPair {
            ns_a: format!("{NAME_PREFIX}{pid}-{n}-a"),
            ns_b: format!("{NAME_PREFIX}{pid}-{n}-b"),
            veth_a: format!("cv{pid}x{}a", n % 100),
            veth_b: format!("cv{pid}x{}b", n % 100),
            cut: false,
        };
        // From here on, drop deletes whatever exists.
        pair.build()?;
        tracing::info!(a = %pair.ns_a, b = %pair.ns_b, "network namespace pair created");
        Ok(pair)
    }

    fn build(&self) -> Result<(), HarnessError> {
        ip(&["netns", "add", &self.ns_a])?;
        ip(&["netns", "add", &self.ns_b])?;
        // Made inside A, so it never exists in the host namespace by itself.
        ip(&[
            "-n",
            &self.ns_a,
            "link",
            "add",
            &self.veth_a,
            "type",
            "veth",
            "peer",
            "name",
            &self.veth_b,
            "netns",
            &self.ns_b,
        ])?;
        for side in [Side::A, Side::B] {
            let ns = self.name(side);
            let cidr = format!("{}/{PREFIX_LEN}", self.addr(side));
            ip(&["-n", ns, "addr", "add", &cidr, "dev", self.veth(side)])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", self.veth(side), "up"])?;
        }
        Ok(())
    }

    /// The namespace's name (for `ip netns exec`).
    pub fn name(&self, side: Side) -> &str {
        match side {
            Side::A => &self.ns_a,
            Side::B => &self.ns_b,
        }
    }

    /// The address of `side`'s end of the link.
    pub fn addr(&self, side: Side) -> Ipv4Addr {
        match side {
            Side::A => ADDR_A,
            Side::B => ADDR_B,
        }
    }

    fn veth(&self, side: Side) -> &str {
        match side {
            Side::A => &self.veth_a,
            Side::B => &self.veth_b,
        }
    }

    /// Whether the link is cut.
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// The words that run a command inside `side`'s namespace:
    /// `["ip", "netns", "exec", <name>]`, to put before the program and its arguments.
    pub fn exec_prefix(&self, side: Side) -> [String; 4] {
        [
            "ip".to_string(),
            "netns".to_string(),
            "exec".to_string(),
            self.name(side).to_string(),
        ]
    }

    /// Runs `f` on a new thread that has entered `side`'s namespace, and
    /// returns its result. Sockets `f` creates belong to that namespace.
    pub fn run_in<T, F>(&self, side: Side, f: F) -> Result<T, HarnessError>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        let path = format!("{NETNS_RUN_DIR}/{}", self.name(side));
        let ns = File::open(&path).map_err(|e| HarnessError::io(format!("open {path}"), e))?;
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|e| {
                        HarnessError::io(format!("enter network namespace {path}"), e)
                    })?;
                    Ok(f())
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Cuts the link: both ends go down, so nothing passes either way until
    /// [`NetnsPair::heal`]. Idempotent.
    pub fn cut(&mut self) -> Result<(), HarnessError> {
        for side in [Side::A, Side::B] {
            ip(&[
                "-n",
                self.name(side),
                "link",
                "set",
                self.veth(side),
                "down",
            ])?;
        }
        self.cut = true;
        tracing::info!(a = %self.ns_a, b = %self.ns_b, "network link cut");
        Ok(())
    }

    /// Heals the link cut by [`NetnsPair::cut`]. Idempotent.
    pub fn heal(&mut self) -> Result<(), HarnessError> {
        for side in [Side::A, Side::B] {
            ip(&["-n", self.name(side), "link", "set", self.veth(side), "up"])?;
        }
        self.cut = false;
        tracing::info!(a = %self.ns_a, b = %self.ns_b, "network link healed");
        Ok(())
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        // Deleting a namespace destroys its end of the veth, and with it the peer.
        for ns in [&self.ns_a, &self.ns_b] {
            if std::path::Path::new(NETNS_RUN_DIR).join(ns).exists()
                && let Err(e) = ip(&["netns", "del", ns])
            {
                tracing::warn!(netns = %ns, error = %e, "could not delete a network namespace");
            }
        }
    }
}
