//! Docker from the system tests (`tests/tests/container.rs`): the `docker`
//! CLI as a bounded child process, the image build from the binaries of the
//! current build, and a [`Scope`] guard that removes what a test created.
//!
//! Promises:
//! - **Loud prerequisites.** [`require_engine`] and [`require_images`] panic
//!   with what to do (a reachable Docker Engine; `scripts/make-base-images`)
//!   instead of skipping.
//! - **Bounded.** Every `docker` call has a deadline; at the deadline the CLI
//!   child is killed (by its PID) and the call fails naming the command.
//! - **No leaks.** A [`Scope`] owns the containers it started (by container
//!   id, never by a name pattern) and the network it created (a name unique to
//!   the test run); dropping it, also while panicking, removes the containers
//!   with their anonymous volumes, then the network. While panicking it first
//!   prints the tail of every container's log, so a failure explains itself.

use std::fs::File;
use std::io::Read;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cluster::repo_root;
use crate::harness::bins;

/// Deadline of an ordinary `docker` call (run, inspect, kill, rm ...).
pub const DOCKER_CALL_TIMEOUT_MS: u64 = 60_000;
/// Deadline of `deploy/docker/build.sh` (strip + context upload + build).
pub const IMAGE_BUILD_TIMEOUT_MS: u64 = 240_000;
/// The local base image of the CMS image (`scripts/make-base-images`).
pub const BASE_IMAGE: &str = "cms-base:bookworm";
/// The local ZooKeeper image (`scripts/make-base-images`).
pub const ZOOKEEPER_IMAGE: &str = "cms-zookeeper:bookworm";
/// The tag the tests build the CMS image under.
pub const TEST_IMAGE: &str = "cms:dev";
/// Lines of each container's log printed when a [`Scope`] drops while panicking.
pub const LOG_TAIL_ON_PANIC_LINES: usize = 40;

/// A `docker` call that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerError {
    /// The CLI could not be started.
    #[error("`{command}` could not start: {reason}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        reason: String,
    },
    /// The deadline passed; the child was killed.
    #[error("`{command}` did not finish within {timeout_ms} ms (killed)")]
    Timeout {
        /// The command line.
        command: String,
        /// The deadline.
        timeout_ms: u64,
    },
    /// It exited non-zero.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Exit status, as text.
        status: String,
        /// Its stderr, trimmed.
        stderr: String,
    },
}

/// Runs `program args` with a deadline; its trimmed stdout on success.
pub fn run_bounded(
    program: &str,
    args: &[String],
    envs: &[(&str, String)],
    timeout_ms: u64,
) -> Result<String, DockerError> {
    let command = format!("{program} {}", args.join(" "));
    let child = Command::new(program)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| DockerError::Spawn {
            command: command.clone(),
            reason: e.to_string(),
        })?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    // The waiting thread owns the child and drains both pipes; a deadline
    // here kills the child by its PID, which ends the thread too.
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_millis(timeout_ms)) {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => {
            return Err(DockerError::Spawn {
                command,
                reason: e.to_string(),
            });
        }
        Err(_) => {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            // Reaped by the thread once killed; bounded as well.
            let _ = rx.recv_timeout(Duration::from_secs(5));
            return Err(DockerError::Timeout {
                command,
                timeout_ms,
            });
        }
    };
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(DockerError::Failed {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// `docker args...` with [`DOCKER_CALL_TIMEOUT_MS`].
pub fn docker<S: AsRef<str>>(args: &[S]) -> Result<String, DockerError> {
    let args: Vec<String> = args.iter().map(|a| a.as_ref().to_string()).collect();
    run_bounded("docker", &args, &[], DOCKER_CALL_TIMEOUT_MS)
}

/// [`docker`] on a blocking thread, for async tests.
pub async fn docker_async(args: Vec<String>) -> Result<String, DockerError> {
    tokio::task::spawn_blocking(move || docker(&args))
        .await
        .unwrap_or_else(|e| panic!("docker call thread: {e}"))
}

/// Panics unless `docker info` succeeds.
pub fn require_engine() {
    if let Err(e) = docker(&["info", "--format", "{{.ServerVersion}}"]) {
        panic!(
            "the container tests need a reachable Docker Engine, and `docker info` fails: {e}\n\
             Start dockerd (CI machines have Docker Engine 20.10+) and run the test again."
        );
    }
}

/// Panics unless every image in `images` exists locally.
pub fn require_images(images: &[&str]) {
    let missing: Vec<&str> = images
        .iter()
        .copied()
        .filter(|i| docker(&["image", "inspect", "--format", "{{.Id}}", i]).is_err())
        .collect();
    assert!(
        missing.is_empty(),
        "missing local image(s) {missing:?}: run `scripts/make-base-images` (as root) first; \
         it makes {BASE_IMAGE} and {ZOOKEEPER_IMAGE} without a registry"
    );
}

/// Builds [`TEST_IMAGE`] from the binaries of the current build (the
/// `prebuilt` target, `deploy/docker/build.sh`) and returns its image id.
/// Test processes that build at the same time take turns (a file lock);
/// an unchanged build is a cache hit.
///
/// # Panics
/// If the build fails, with its output.
pub fn build_test_image() -> String {
    let bin_dir = bins::profile_dir()
        .unwrap_or_else(|| panic!("cannot tell the target directory of this test binary"));
    let lock_path = bin_dir.join("cms-image-build.lock");
    let lock = File::create(&lock_path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("locking {}: {e}", lock_path.display()));
    let script = repo_root().join("deploy/docker/build.sh");
    let args = vec![
        "--bin-dir".to_string(),
        bin_dir.display().to_string(),
        "--tag".to_string(),
        TEST_IMAGE.to_string(),
    ];
    let started = std::time::Instant::now();
    let id = run_bounded(
        &script.display().to_string(),
        &args,
        &[],
        IMAGE_BUILD_TIMEOUT_MS,
    )
    .unwrap_or_else(|e| panic!("building the image {TEST_IMAGE}: {e}"));
    drop(lock);
    eprintln!(
        "built {TEST_IMAGE} ({id}) in {} ms",
        started.elapsed().as_millis()
    );
    id
}

/// One container a [`Scope`] started.
#[derive(Debug, Clone)]
pub struct Container {
    /// Container id.
    pub id: String,
    /// Its name (also its DNS name on the scope's network).
    pub name: String,
    /// Its IPv4 address on the scope's network.
    pub ip: Ipv4Addr,
}

/// Containers and a network of one test; removed on drop (module docs).
#[derive(Debug)]
pub struct Scope {
    name: String,
    network: Option<String>,
    containers: Mutex<Vec<Container>>,
}

impl Scope {
    /// A scope named `cms-test-<label>-<pid>-<nanos>` (unique to the run)
    /// with its own `--internal` bridge network of that name: traffic stays
    /// between the containers (and the host, through the bridge).
    ///
    /// # Panics
    /// If the network cannot be created.
    pub fn with_internal_network(label: &str) -> Scope {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() % 1_000_000_000)
            .unwrap_or(0);
        let name = format!("cms-test-{label}-{}-{nanos}", std::process::id());
        let mut scope = Scope {
            name: name.clone(),
            network: None,
            containers: Mutex::new(Vec::new()),
        };
        docker(&[
            "network",
            "create",
            "--internal",
            "--driver",
            "bridge",
            &name,
        ])
        .unwrap_or_else(|e| panic!("creating the network {name}: {e}"));
        scope.network = Some(name);
        scope
    }

    /// The network (and name prefix of every container).
    pub fn network(&self) -> &str {
        &self.name
    }

    /// `docker run -d --network <net> --name <net>-<role> <args...>` (args:
    /// options, the image, then its command); waits until the container has
    /// an address and returns it.
    ///
    /// # Panics
    /// If the container does not start.
    pub async fn run(&self, role: &str, args: &[String]) -> Container {
        let name = format!("{}-{role}", self.name);
        let mut all = vec![
            "run".to_string(),
            "-d".to_string(),
            "--network".to_string(),
            self.name.clone(),
            "--name".to_string(),
            name.clone(),
        ];
        all.extend(args.iter().cloned());
        let id = docker_async(all)
            .await
            .unwrap_or_else(|e| panic!("starting container {name}: {e}"));
        let format = format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
            self.name
        );
        // Registered before inspecting, so the guard removes it whatever happens.
        let mut c = Container {
            id: id.clone(),
            name: name.clone(),
            ip: Ipv4Addr::UNSPECIFIED,
        };
        self.containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(c.clone());
        let ip = docker_async(vec!["inspect".into(), "-f".into(), format, id.clone()])
            .await
            .unwrap_or_else(|e| panic!("inspecting container {name}: {e}"));
        c.ip = ip
            .parse()
            .unwrap_or_else(|e| panic!("container {name} has no IPv4 address ({ip:?}): {e}"));
        if let Some(stored) = self
            .containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter_mut()
            .find(|s| s.id == id)
        {
            stored.ip = c.ip;
        }
        c
    }

    /// Runs a one-shot container on the network (`docker run --rm`) to the
    /// end; its stdout.
    pub async fn run_once(&self, args: &[String]) -> Result<String, DockerError> {
        let mut all = vec![
            "run".to_string(),
            "--rm".to_string(),
            "--network".to_string(),
            self.name.clone(),
        ];
        all.extend(args.iter().cloned());
        docker_async(all).await
    }

    /// Waits until `GET http://<ip>:<port>/ready` answers 200, at most
    /// `timeout_ms`.
    ///
    /// # Panics
    /// At the deadline, or as soon as the container is seen stopped, with
    /// its log tail.
    pub async fn wait_ready(&self, c: &Container, port: u16, timeout_ms: u64) {
        let client = crate::harness::http::client();
        let addr = std::net::SocketAddr::from((c.ip, port));
        let start = std::time::Instant::now();
        let mut last = String::new();
        let mut checked_running = start;
        while start.elapsed() < Duration::from_millis(timeout_ms) {
            match crate::harness::http::get(&client, addr, "/ready").await {
                Ok((200, _)) => return,
                Ok((status, body)) => last = format!("HTTP {status}: {}", body.trim()),
                Err(e) => last = e.to_string(),
            }
            if checked_running.elapsed() >= Duration::from_secs(1) {
                checked_running = std::time::Instant::now();
                let running = docker_async(vec![
                    "inspect".into(),
                    "-f".into(),
                    "{{.State.Running}}".into(),
                    c.id.clone(),
                ])
                .await
                .unwrap_or_default();
                assert!(
                    running == "true",
                    "container {} stopped before it was ready; its log:\n{}",
                    c.name,
                    self.logs_tail(c, LOG_TAIL_ON_PANIC_LINES)
                );
            }
            tokio::time::sleep(Duration::from_millis(
                crate::harness::wait::POLL_INTERVAL_MS * 4,
            ))
            .await;
        }
        panic!(
            "container {} ({addr}) not ready within {timeout_ms} ms (last answer: {last}); its log:\n{}",
            c.name,
            self.logs_tail(c, LOG_TAIL_ON_PANIC_LINES)
        );
    }

    /// `docker kill` (SIGKILL) of one of this scope's containers.
    ///
    /// # Panics
    /// If the kill fails.
    pub async fn kill(&self, c: &Container) {
        docker_async(vec!["kill".into(), c.id.clone()])
            .await
            .unwrap_or_else(|e| panic!("docker kill {}: {e}", c.name));
    }

    /// The last `lines` lines of a container's output (stdout and stderr).
    pub fn logs_tail(&self, c: &Container, lines: usize) -> String {
        logs_tail(&c.id, lines)
    }
}

fn logs_tail(id: &str, lines: usize) -> String {
    let args = vec![
        "logs".to_string(),
        "--tail".to_string(),
        lines.to_string(),
        id.to_string(),
    ];
    // `docker logs` writes the container's stderr to its own stderr: merge.
    let mut child = match Command::new("docker")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return format!("(docker logs failed: {e})"),
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    let _ = child.wait();
    format!("{out}{err}")
}

impl Drop for Scope {
    fn drop(&mut self) {
        let containers =
            std::mem::take(&mut *self.containers.lock().unwrap_or_else(|p| p.into_inner()));
        if std::thread::panicking() {
            for c in &containers {
                eprintln!(
                    "----- last {LOG_TAIL_ON_PANIC_LINES} lines of container {} ({}) -----\n{}",
                    c.name,
                    c.ip,
                    logs_tail(&c.id, LOG_TAIL_ON_PANIC_LINES)
                );
            }
        }
        if !containers.is_empty() {
            let mut args = vec!["rm".to_string(), "-f".to_string(), "-v".to_string()];
            args.extend(containers.iter().map(|c| c.id.clone()));
            if let Err(e) = run_bounded("docker", &args, &[], DOCKER_CALL_TIMEOUT_MS) {
                eprintln!("removing the test containers: {e}");
            }
        }
        if let Some(net) = self.network.take()
            && let Err(e) = docker(&["network", "rm", &net])
        {
            eprintln!("removing the test network {net}: {e}");
        }
    }
}

/// The repository's `deploy/docker` directory.
pub fn deploy_dir() -> PathBuf {
    repo_root().join("deploy/docker")
}
