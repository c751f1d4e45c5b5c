//! A real, standalone ZooKeeper server (the Debian `zookeeper` package) as a
//! child process of the test.
//!
//! Each [`ZooKeeper`] has its own temporary directory (config, data, log) and a
//! free loopback client port, and is ready when [`ZooKeeper::start`] returns:
//! `ruok` over TCP answered `imok`. [`ZooKeeper::restart`] keeps the data
//! directory and the port, so persistent nodes survive it and clients can
//! reconnect to the same connect string. If Java or the jars are missing it
//! panics with the install command; it never skips.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::process::{Process, ProcessBuilder};
use super::wait::POLL_INTERVAL_MS;
use super::{HarnessError, LOG_TAIL_ON_PANIC_LINES};

/// ZooKeeper's main class for a (standalone) server.
pub const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";

/// Bound on one four-letter-word exchange, connect included, in milliseconds.
pub const FOUR_LETTER_TIMEOUT_MS: u64 = 1_000;

/// Bytes of a four-letter-word answer read at most.
pub const FOUR_LETTER_REPLY_BYTES_MAX: u64 = 64 * 1024;

/// How a [`ZooKeeper`] is run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkConfig {
    /// ZooKeeper's `tickTime`: the heartbeat unit; sessions may be 2 to 20 ticks.
    pub tick_time_ms: u64,
    /// `maxSessionTimeout`, in milliseconds.
    pub max_session_timeout_ms: u64,
    /// Bound on the wait for `imok` after a (re)start, in milliseconds. The JVM
    /// takes a few seconds to start on a busy 2-core machine.
    pub start_timeout_ms: u64,
    /// Bound on the wait after SIGTERM in [`ZooKeeper::stop`], in milliseconds.
    pub stop_timeout_ms: u64,
    /// The `java` executable.
    pub java: PathBuf,
    /// The ZooKeeper server jar (its manifest pulls in its dependencies).
    pub zookeeper_jar: PathBuf,
    /// The SLF4J binding that sends ZooKeeper's log to stderr.
    pub slf4j_jar: PathBuf,
    /// ZooKeeper's packaged configuration directory (first on the classpath).
    pub conf_dir: PathBuf,
    /// Extra JVM options, before the classpath.
    pub jvm_args: Vec<String>,
}

impl Default for ZkConfig {
    fn default() -> Self {
        ZkConfig {
            tick_time_ms: 1_000,
            max_session_timeout_ms: 20_000,
            start_timeout_ms: 30_000,
            stop_timeout_ms: 10_000,
            java: PathBuf::from("/usr/bin/java"),
            zookeeper_jar: PathBuf::from("/usr/share/java/zookeeper.jar"),
            slf4j_jar: PathBuf::from("/usr/share/java/slf4j-simple.jar"),
            conf_dir: PathBuf::from("/etc/zookeeper/conf"),
            // Several servers share 2 cores: small heap, one GC thread, quick JIT.
            jvm_args: vec![
                "-Xmx256m".to_string(),
                "-XX:+UseSerialGC".to_string(),
                "-XX:TieredStopAtLevel=1".to_string(),
            ],
        }
    }
}

impl ZkConfig {
    /// The default config with another `tickTime`.
    pub fn with_tick_time_ms(tick_time_ms: u64) -> Self {
        ZkConfig {
            tick_time_ms,
            ..ZkConfig::default()
        }
    }

    fn check_installed(&self) -> Result<(), HarnessError> {
        for (what, path) in [
            ("java", &self.java),
            ("zookeeper.jar", &self.zookeeper_jar),
            ("slf4j-simple.jar", &self.slf4j_jar),
        ] {
            if !path.is_file() {
                return Err(HarnessError::ZooKeeperMissing {
                    what: what.to_string(),
                    path: path.clone(),
                });
            }
        }
        Ok(())
    }

    fn zoo_cfg(&self) -> String {
        format!(
            "tickTime={}\n\
             dataDir={{dir}}/data\n\
             clientPort={{port:client}}\n\
             clientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr,mntr\n\
             maxSessionTimeout={}\n",
            self.tick_time_ms, self.max_session_timeout_ms
        )
    }
}

/// A running ZooKeeper server; killed and reaped on drop.
#[derive(Debug)]
pub struct ZooKeeper {
    process: Process,
    config: ZkConfig,
}

impl ZooKeeper {
    /// Starts a server with [`ZkConfig::default`] and waits until it is ready.
    ///
    /// # Panics
    /// If ZooKeeper is not installed (the message gives the install command), or
    /// it does not answer `imok` in time (the message has its log tail).
    pub async fn start() -> Self {
        Self::start_with(ZkConfig::default()).await
    }

    /// Starts a server with `config` and waits until it is ready.
    ///
    /// # Panics
    /// As [`ZooKeeper::start`].
    pub async fn start_with(config: ZkConfig) -> Self {
        match Self::try_start_with(config).await {
            Ok(zk) => zk,
            Err(e) => panic!("{e}"),
        }
    }

    /// Starts a server with `config` and waits until it is ready; fails if
    /// ZooKeeper is not installed.
    ///
    /// # Panics
    /// If the server does not answer `imok` in time.
    pub async fn try_start_with(config: ZkConfig) -> Result<Self, HarnessError> {
        config.check_installed()?;
        let classpath = format!(
            "{}:{}:{}",
            config.conf_dir.display(),
            config.zookeeper_jar.display(),
            config.slf4j_jar.display()
        );
        let process = ProcessBuilder::program("zookeeper", &config.java)
            .port("client")
            .file("zoo.cfg", config.zoo_cfg())
            .file("data/.keep", "")
            .args(config.jvm_args.iter().cloned())
            .args(["-cp".to_string(), classpath, MAIN_CLASS.to_string()])
            .arg("{dir}/zoo.cfg")
            .stop_timeout_ms(config.stop_timeout_ms)
            .try_spawn()?;
        let mut zk = ZooKeeper { process, config };
        zk.wait_ready().await;
        Ok(zk)
    }

    /// `127.0.0.1:<client port>`, for clients.
    pub fn connect_string(&self) -> String {
        self.addr().to_string()
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        self.process.addr("client")
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.process.port("client")
    }

    /// The server's PID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The config it runs with.
    pub fn config(&self) -> &ZkConfig {
        &self.config
    }

    /// The data directory (`dataDir`).
    pub fn data_dir(&self) -> PathBuf {
        self.process.dir().join("data")
    }

    /// The server's own directory (config, data, log).
    pub fn dir(&self) -> &Path {
        self.process.dir()
    }

    /// The underlying child process.
    pub fn process(&self) -> &Process {
        &self.process
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// SIGKILL and reap: a crash. Data written so far stays in the data dir.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        self.process.kill()
    }

    /// SIGTERM, then SIGKILL after the stop bound.
    pub async fn stop(&mut self) -> Option<ExitStatus> {
        self.process.stop().await
    }

    /// Stops the server if it runs, starts it again on the same data directory
    /// and port, and waits until it is ready.
    ///
    /// # Panics
    /// If it does not answer `imok` in time.
    pub async fn restart(&mut self) {
        self.process.restart().await;
        self.wait_ready().await;
    }

    /// SIGSTOP: the server freezes; connections stay open, nothing answers,
    /// sessions do not expire.
    pub fn pause(&self) {
        self.process.pause();
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.process.resume();
    }

    /// Sends a four-letter word (`ruok`, `srvr`, `mntr`) and returns the answer,
    /// or `None` if there was none within [`FOUR_LETTER_TIMEOUT_MS`].
    pub async fn four_letter(&self, word: &str) -> Option<String> {
        four_letter(self.addr(), word).await
    }

    /// True if the server answers `ruok` with `imok` right now.
    pub async fn is_ok(&self) -> bool {
        self.four_letter("ruok").await.as_deref() == Some("imok")
    }

    async fn wait_ready(&mut self) {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(self.config.start_timeout_ms);
        loop {
            if let Some(status) = self.process.try_exit_status() {
                panic!(
                    "zookeeper exited ({status}) before answering imok; last {} lines of {}:\n{}",
                    LOG_TAIL_ON_PANIC_LINES,
                    self.process.log_path().display(),
                    self.log_tail(LOG_TAIL_ON_PANIC_LINES)
                );
            }
            if self.is_ok().await {
                tracing::info!(
                    addr = %self.addr(),
                    took_ms = start.elapsed().as_millis() as u64,
                    "zookeeper ready"
                );
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "zookeeper at {} did not answer imok within {} ms; last {} lines of {}:\n{}",
                    self.addr(),
                    self.config.start_timeout_ms,
                    LOG_TAIL_ON_PANIC_LINES,
                    self.process.log_path().display(),
                    self.log_tail(LOG_TAIL_ON_PANIC_LINES)
                );
            }
            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
        }
    }
}

/// Sends a ZooKeeper four-letter word to `addr` and reads the answer until the
/// server closes the connection; `None` on any error or after
/// [`FOUR_LETTER_TIMEOUT_MS`].
pub async fn four_letter(addr: SocketAddr, word: &str) -> Option<String> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream.write_all(word.as_bytes()).await.ok()?;
        let mut reply = Vec::new();
        stream
            .take(FOUR_LETTER_REPLY_BYTES_MAX)
            .read_to_end(&mut reply)
            .await
            .ok()?;
        Some(String::from_utf8_lossy(&reply).into_owned())
    };
    tokio::time::timeout(Duration::from_millis(FOUR_LETTER_TIMEOUT_MS), exchange)
        .await
        .ok()
        .flatten()
        .filter(|reply| !reply.is_empty())
}
