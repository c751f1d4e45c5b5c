//! The process harness: real ZooKeeper and our own binaries as child processes
//! of a test, on free loopback ports, each in its own temporary directory.
//!
//! What it promises:
//! - **No leaks.** Every child is killed (SIGKILL, by its own PID, never by name)
//!   and reaped when its handle is dropped — also when the test panics.
//! - **Failures explain themselves.** When a handle is dropped on a panicking
//!   thread, the last [`LOG_TAIL_ON_PANIC_LINES`] lines of the child's output go
//!   to stderr; a process that does not become ready fails with its log tail.
//! - **Bounded waits.** Every wait (readiness, `ruok`, graceful stop, conditions
//!   in [`wait::eventually`]) has a deadline; nothing sleeps and hopes.
//! - **Same identity on restart.** A restarted child keeps its arguments,
//!   environment, directory and ports.
//! - **Missing prerequisites are loud.** A binary that was not built, or a
//!   ZooKeeper that is not installed, panics with the command that fixes it.
//!
//! The API knows nothing about clusters: [`process::Process`] runs any binary
//! and [`zookeeper::ZooKeeper`] is a `Process` that speaks `ruok`. Bookies and
//! brokers are built on `Process` the same way.
//!
//! ```no_run
//! use cms_tests::harness::{process::ProcessBuilder, zookeeper::ZooKeeper};
//! # async fn demo() {
//! let zk = ZooKeeper::start().await;
//! let mut holder = ProcessBuilder::new("cms-test-ephemeral-holder")
//!     .port("http")
//!     .args(["--zk", &zk.connect_string(), "--path", "/demo"])
//!     .args(["--http-port", "{port:http}"])
//!     .spawn();
//! holder.wait_ready(holder.addr("http")).await;
//! holder.pause(); // SIGSTOP
//! holder.resume(); // SIGCONT
//! # }
//! ```

pub mod bins;
pub mod http;
pub mod netns;
pub mod perf;
pub mod ports;
pub mod process;
pub mod wait;
pub mod zookeeper;

use std::path::PathBuf;

/// Lines of a child's output printed to stderr when its handle is dropped while
/// the thread is panicking.
pub const LOG_TAIL_ON_PANIC_LINES: usize = 40;

/// Environment variable: when set (to anything), the temporary directories of
/// children are kept after the test, and their paths printed.
pub const KEEP_DIRS_ENV: &str = "CMS_KEEP_TEST_DIRS";

/// A prerequisite of the harness is missing or the OS refused something.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HarnessError {
    /// One of our binaries is not in the target directory.
    #[error(
        "binary `{name}` not found (looked at: {tried}); run `cargo build --workspace --bins` first"
    )]
    BinaryNotFound {
        /// The binary's name.
        name: String,
        /// Every path that was tried, comma-separated.
        tried: String,
    },
    /// Java or the ZooKeeper jars are not installed.
    #[error(
        "{what} not found at {}; install ZooKeeper with `apt-get update && apt-get install -y zookeeper`",
        path.display()
    )]
    ZooKeeperMissing {
        /// What is missing (`java`, `zookeeper.jar`, ...).
        what: String,
        /// Where it was expected.
        path: PathBuf,
    },
    /// iproute2 (`ip`) is not installed; network namespaces need it.
    #[error(
        "`ip` not found; install iproute2 with `apt-get update && apt-get install -y iproute2`"
    )]
    IpMissing,
    /// A system command failed (e.g. `ip netns add` without root).
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// How it exited.
        status: String,
        /// What it said on stderr, trimmed.
        stderr: String,
    },
    /// A file or process operation failed.
    #[error("cannot {action}: {error}")]
    Io {
        /// What the harness was doing, as a verb phrase.
        action: String,
        /// The OS error.
        error: String,
    },
}

impl HarnessError {
    pub(crate) fn io(action: impl Into<String>, error: impl std::fmt::Display) -> Self {
        HarnessError::Io {
            action: action.into(),
            error: error.to_string(),
        }
    }
}
