//! One child process of a test: one of our binaries (or any program), with its
//! own temporary directory, named free ports, and its output in a log file.
//!
//! A [`ProcessBuilder`] describes the process; arguments, environment values and
//! files may contain `{dir}` (the process's directory) and `{port:NAME}` (a
//! port declared with [`ProcessBuilder::port`]), replaced at spawn. The
//! resulting [`Process`] can be paused (SIGSTOP), resumed (SIGCONT), killed
//! (SIGKILL), stopped (SIGTERM, then SIGKILL after [`STOP_TIMEOUT_MS`]) and
//! restarted with the same arguments, directory and ports.
//!
//! On drop the child is killed and reaped; on a panicking thread its log tail
//! is printed first (see the [module docs](super)).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use super::wait::POLL_INTERVAL_MS;
use super::{HarnessError, KEEP_DIRS_ENV, LOG_TAIL_ON_PANIC_LINES, bins, http, ports};

/// How long [`Process::stop`] waits after SIGTERM before SIGKILL, in milliseconds.
pub const STOP_TIMEOUT_MS: u64 = 10_000;

/// How long [`Process::wait_ready`] waits for `GET /ready` to answer 200, in
/// milliseconds.
pub const READY_TIMEOUT_MS: u64 = 30_000;

/// Bytes read from the end of a log file to produce its tail.
pub const LOG_TAIL_BYTES_MAX: u64 = 256 * 1024;

/// Name of the log file (stdout and stderr of every start) in the process's
/// directory.
pub const LOG_FILE_NAME: &str = "output.log";

#[derive(Debug, Clone)]
enum Program {
    /// One of our binaries, found by [`bins::find`].
    Binary(String),
    /// A program at a known path.
    Path(PathBuf),
}

/// Describes a child process; [`ProcessBuilder::spawn`] starts it.
#[derive(Debug, Clone)]
pub struct ProcessBuilder {
    name: String,
    program: Program,
    args: Vec<String>,
    env: Vec<(String, String)>,
    port_names: Vec<String>,
    files: Vec<(PathBuf, String)>,
    stop_timeout_ms: u64,
    ready_timeout_ms: u64,
}

impl ProcessBuilder {
    /// A process running our binary `binary` (looked up by [`bins::find`]).
    pub fn new(binary: &str) -> Self {
        Self::with_program(binary, Program::Binary(binary.to_string()))
    }

    /// A process running the program at `path` (e.g. `java`), labelled `name`.
    pub fn program(name: &str, path: impl Into<PathBuf>) -> Self {
        Self::with_program(name, Program::Path(path.into()))
    }

    fn with_program(name: &str, program: Program) -> Self {
        ProcessBuilder {
            name: name.to_string(),
            program,
            args: Vec::new(),
            env: Vec::new(),
            port_names: Vec::new(),
            files: Vec::new(),
            stop_timeout_ms: STOP_TIMEOUT_MS,
            ready_timeout_ms: READY_TIMEOUT_MS,
        }
    }

    /// The label used in logs and messages (default: the binary's name).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// Appends one argument (`{dir}` and `{port:NAME}` are replaced).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments (`{dir}` and `{port:NAME}` are replaced).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable (`{dir}` and `{port:NAME}` are replaced in
    /// the value).
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_string(), value.into()));
        self
    }

    /// Declares a named port: a free loopback port is taken at spawn and kept
    /// for the life of the [`Process`], restarts included.
    pub fn port(mut self, name: &str) -> Self {
        if !self.port_names.iter().any(|n| n == name) {
            self.port_names.push(name.to_string());
        }
        self
    }

    /// A file written into the process's directory before the first start
    /// (`{dir}` and `{port:NAME}` are replaced in `contents`).
    pub fn file(mut self, relative_path: impl Into<PathBuf>, contents: impl Into<String>) -> Self {
        self.files.push((relative_path.into(), contents.into()));
        self
    }

    /// Bound on the wait after SIGTERM in [`Process::stop`], in milliseconds.
    pub fn stop_timeout_ms(mut self, ms: u64) -> Self {
        self.stop_timeout_ms = ms;
        self
    }

    /// Bound on [`Process::wait_ready`], in milliseconds.
    pub fn ready_timeout_ms(mut self, ms: u64) -> Self {
        self.ready_timeout_ms = ms;
        self
    }

    /// Starts the process.
    ///
    /// # Panics
    /// With the error's message (e.g. "run `cargo build --workspace --bins`
    /// first") if [`ProcessBuilder::try_spawn`] fails.
    pub fn spawn(self) -> Process {
        self.try_spawn().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the process, or says why it cannot.
    pub fn try_spawn(self) -> Result<Process, HarnessError> {
        let program = match &self.program {
            Program::Binary(name) => bins::find(name)?,
            Program::Path(path) => path.clone(),
        };
        let dir = tempfile::Builder::new()
            .prefix(&format!("cms-{}-", self.name))
            .tempdir()
            .map_err(|e| HarnessError::io("create a temporary directory", e))?;
        let dir_path = dir.path().to_path_buf();
        let ports: BTreeMap<String, u16> = self
            .port_names
            .iter()
            .map(|n| (n.clone(), ports::free_port()))
            .collect();
        let subst = |s: &str| substitute(s, &dir_path, &ports);
        let args = self
            .args
            .iter()
            .map(|a| subst(a))
            .collect::<Result<_, _>>()?;
        let env = self
            .env
            .iter()
            .map(|(k, v)| Ok((k.clone(), subst(v)?)))
            .collect::<Result<_, HarnessError>>()?;
        for (relative, contents) in &self.files {
            let path = dir_path.join(relative);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| HarnessError::io(format!("create {}", parent.display()), e))?;
            }
            std::fs::write(&path, subst(contents)?)
                .map_err(|e| HarnessError::io(format!("write {}", path.display()), e))?;
        }
        let log_path = dir_path.join(LOG_FILE_NAME);
        let mut process = Process {
            name: self.name,
            program,
            args,
            env,
            ports,
            dir: Some(dir),
            dir_path,
            log_path,
            child: None,
            starts: 0,
            stop_timeout_ms: self.stop_timeout_ms,
            ready_timeout_ms: self.ready_timeout_ms,
        };
        process.start()?;
        Ok(process)
    }
}

/// Replaces `{dir}` and `{port:NAME}` in `s`.
fn substitute(s: &str, dir: &Path, ports: &BTreeMap<String, u16>) -> Result<String, HarnessError> {
    let mut out = s.replace("{dir}", &dir.display().to_string());
    for (name, port) in ports {
        out = out.replace(&format!("{{port:{name}}}"), &port.to_string());
    }
    if let Some(at) = out.find("{port:") {
        let rest = &out[at..];
        let token = rest.find('}').map_or(rest, |end| &rest[..=end]);
        return Err(HarnessError::Io {
            action: format!("substitute {token} in {s:?}"),
            error: "no port of that name was declared with .port(..)".to_string(),
        });
    }
    Ok(out)
}

/// A running (or stopped, or killed) child process; see the [module docs](self).
#[derive(Debug)]
pub struct Process {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    ports: BTreeMap<String, u16>,
    /// `None` only while dropping with the directory kept.
    dir: Option<tempfile::TempDir>,
    dir_path: PathBuf,
    log_path: PathBuf,
    /// The child while it has not been reaped; its PID is never signalled after.
    child: Option<Child>,
    starts: u32,
    stop_timeout_ms: u64,
    ready_timeout_ms: u64,
}

impl Process {
    fn start(&mut self) -> Result<(), HarnessError> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| HarnessError::io(format!("open {}", self.log_path.display()), e))?;
        self.starts += 1;
        writeln!(
            log,
            "=== harness: start #{} of {}: {} {}",
            self.starts,
            self.name,
            self.program.display(),
            self.args.join(" ")
        )
        .map_err(|e| HarnessError::io(format!("write {}", self.log_path.display()), e))?;
        let stderr = log
            .try_clone()
            .map_err(|e| HarnessError::io("duplicate the log file handle", e))?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.dir_path)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr))
            .spawn()
            .map_err(|e| HarnessError::io(format!("spawn {}", self.program.display()), e))?;
        tracing::info!(name = %self.name, pid = child.id(), start = self.starts, "process started");
        self.child = Some(child);
        Ok(())
    }

    /// The label of this process.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The PID of the child, while it has not exited (or been reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The port declared as `name`.
    ///
    /// # Panics
    /// If no port of that name was declared.
    pub fn port(&self, name: &str) -> u16 {
        match self.ports.get(name) {
            Some(port) => *port,
            None => panic!(
                "{}: no port named {name:?} (declared: {:?})",
                self.name, self.ports
            ),
        }
    }

    /// `127.0.0.1:<port named name>`.
    pub fn addr(&self, name: &str) -> SocketAddr {
        ports::loopback(self.port(name))
    }

    /// The process's own directory (also its working directory).
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    /// The log file holding stdout and stderr of every start.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// How many times the child was started (1 after spawn, +1 per restart).
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// The exit status if the child has exited (and reaps it), `None` while it
    /// runs (paused counts as running) or if it was already reaped.
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                tracing::info!(name = %self.name, %status, "process exited");
                Some(status)
            }
            Ok(None) => None,
            Err(e) => panic!("{}: cannot check the child's status: {e}", self.name),
        }
    }

    /// True while the child has not exited.
    pub fn is_running(&mut self) -> bool {
        self.try_exit_status();
        self.child.is_some()
    }

    fn signal(&self, sig: Signal) {
        let Some(pid) = self.pid() else {
            panic!(
                "{}: cannot send {sig}: the process is not running",
                self.name
            );
        };
        let pid = Pid::from_raw(
            i32::try_from(pid).unwrap_or_else(|_| panic!("{}: PID {pid} out of range", self.name)),
        );
        // The child is not reaped yet, so its PID cannot have been reused.
        if let Err(e) = signal::kill(pid, sig) {
            panic!("{}: cannot send {sig} to {pid}: {e}", self.name);
        }
    }

    /// SIGSTOP: the child freezes; its sockets stay open, nothing answers.
    ///
    /// # Panics
    /// If the process is not running.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
        tracing::info!(name = %self.name, "process paused");
    }

    /// SIGCONT: a paused child carries on.
    ///
    /// # Panics
    /// If the process is not running.
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
        tracing::info!(name = %self.name, "process resumed");
    }

    /// SIGKILL and reap. Does nothing if the child is not running.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Err(e) = child.kill() {
            // Only fails if the child already exited; it is reaped below.
            tracing::debug!(name = %self.name, error = %e, "kill of an exited child");
        }
        let status = child
            .wait()
            .unwrap_or_else(|e| panic!("{}: cannot reap the child: {e}", self.name));
        tracing::info!(name = %self.name, %status, "process killed");
        Some(status)
    }

    /// SIGTERM (and SIGCONT, so a paused child sees it), then SIGKILL if the
    /// child has not exited within the stop bound. Returns the exit status, or
    /// `None` if the child was not running.
    pub async fn stop(&mut self) -> Option<ExitStatus> {
        if !self.is_running() {
            return None;
        }
        self.signal(Signal::SIGTERM);
        self.signal(Signal::SIGCONT);
        let deadline = Instant::now() + Duration::from_millis(self.stop_timeout_ms);
        while Instant::now() < deadline {
            if let Some(status) = self.try_exit_status() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
        }
        tracing::warn!(
            name = %self.name,
            stop_timeout_ms = self.stop_timeout_ms,
            "process ignored SIGTERM; killing it"
        );
        self.kill()
    }

    /// Stops the child if it runs ([`Process::stop`]) and starts it again with
    /// the same program, arguments, environment, directory and ports.
    ///
    /// # Panics
    /// If the program cannot be started again.
    pub async fn restart(&mut self) {
        self.stop().await;
        if let Err(e) = self.start() {
            panic!("{}: restart failed: {e}", self.name);
        }
    }

    /// Polls `GET http://<http_addr>/ready` until it answers 200.
    ///
    /// # Panics
    /// With the log tail, if the child exits or the ready bound passes first.
    pub async fn wait_ready(&mut self, http_addr: SocketAddr) {
        let client = http::client();
        let start = Instant::now();
        let deadline = start + Duration::from_millis(self.ready_timeout_ms);
        loop {
            if let Some(status) = self.try_exit_status() {
                panic!(
                    "{} exited ({status}) before it was ready; last {} lines of {}:\n{}",
                    self.name,
                    LOG_TAIL_ON_PANIC_LINES,
                    self.log_path.display(),
                    self.log_tail(LOG_TAIL_ON_PANIC_LINES)
                );
            }
            if self.child.is_none() {
                panic!("{}: wait_ready on a process that is not running", self.name);
            }
            let last = match http::get(&client, http_addr, "/ready").await {
                Ok((200, _)) => {
                    let took_ms = start.elapsed().as_millis() as u64;
                    tracing::info!(name = %self.name, took_ms, "process ready");
                    return;
                }
                Ok((status, body)) => format!("HTTP {status}: {}", body.trim()),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                panic!(
                    "{} not ready at http://{http_addr}/ready within {} ms (last: {last}); last {} lines of {}:\n{}",
                    self.name,
                    self.ready_timeout_ms,
                    LOG_TAIL_ON_PANIC_LINES,
                    self.log_path.display(),
                    self.log_tail(LOG_TAIL_ON_PANIC_LINES)
                );
            }
            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
        }
    }

    /// The last `lines` lines of the log (at most [`LOG_TAIL_BYTES_MAX`] bytes
    /// are read).
    pub fn log_tail(&self, lines: usize) -> String {
        match read_tail(&self.log_path, LOG_TAIL_BYTES_MAX) {
            Ok(text) => {
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(lines)..].join("\n")
            }
            Err(e) => format!("<cannot read {}: {e}>", self.log_path.display()),
        }
    }
}

fn read_tail(path: &Path, bytes_max: u64) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(bytes_max)))?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

impl Drop for Process {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- last {LOG_TAIL_ON_PANIC_LINES} lines of {} ({}) -----\n{}\n----- end of {} -----",
                self.name,
                self.log_path.display(),
                self.log_tail(LOG_TAIL_ON_PANIC_LINES),
                self.name
            );
        }
        self.kill();
        if std::env::var_os(KEEP_DIRS_ENV).is_some()
            && let Some(dir) = self.dir.take()
        {
            let kept = dir.keep();
            eprintln!("{}: kept directory {}", self.name, kept.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_replaced() {
        let ports = BTreeMap::from([("http".to_string(), 8123u16), ("grpc".to_string(), 9)]);
        let out = substitute(
            "--dir {dir}/data --http {port:http} --grpc={port:grpc} {json}",
            Path::new("/tmp/x"),
            &ports,
        )
        .unwrap();
        assert_eq!(out, "--dir /tmp/x/data --http 8123 --grpc=9 {json}");
    }

    #[test]
    fn an_undeclared_port_is_an_error() {
        let err = substitute("{port:nope}", Path::new("/tmp"), &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("{port:nope}"), "{err}");
    }
}
