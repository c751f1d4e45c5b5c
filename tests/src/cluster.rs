//! Our servers as processes, on top of [`crate::harness`]: a bookie
//! ([`BookieNode`]) started from the real `cms-bookie serve` binary against a
//! real ZooKeeper, with its data in its own directory, helpers to read the
//! metadata it writes, and a ledger client ([`ledger_client`]) with test
//! timeouts.

use std::net::SocketAddr;
use std::sync::Arc;

use cms_bookie::bookie_client::{BookieClient, ClientOptions};
use cms_bookie::client::driver::{LedgerClient, LedgerClientOptions};
use cms_bookie::metadata::MetadataStore;
use cms_bookie::metadata::layout::{Layout, init_cluster};
use cms_bookie::metadata::zk::{ZkOptions, ZkStore};

use crate::harness::process::{Process, ProcessBuilder};

/// The bookie config file tests start with: the read-only threshold is set
/// near 1.0 because the test machine's disk is shared and may be fuller than
/// the production default (0.95) allows; tests of read-only mode lower it.
pub const BOOKIE_TEST_CONFIG: &str = "disk_usage_threshold = 0.999\ndisk_usage_lwm = 0.998\n";

/// Metadata root used by the cluster tests.
pub const ROOT: &str = "/cms";

/// A ZooKeeper-backed store handle for the test itself, with the cluster
/// initialised (`init_cluster` is idempotent).
pub async fn init_store(connect_string: &str) -> Arc<dyn MetadataStore> {
    let store = ZkStore::connect(
        connect_string,
        &ZkOptions {
            session_timeout_ms: 15_000,
            ..ZkOptions::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("connecting to ZooKeeper {connect_string}: {e}"));
    let layout = Layout::new(ROOT).unwrap_or_else(|e| panic!("{e}"));
    init_cluster(&store, &layout, "test")
        .await
        .unwrap_or_else(|e| panic!("init-cluster: {e}"));
    Arc::new(store)
}

/// One `cms-bookie serve` process.
#[derive(Debug)]
pub struct BookieNode {
    /// The process (restart, kill, pause, log).
    pub process: Process,
    /// Its bookie id.
    pub id: String,
}

impl BookieNode {
    /// Builder arguments of a bookie `id` against ZooKeeper `zk` (`host:port`),
    /// with small files for tests; `extra` flags are appended (later flags win).
    pub fn builder(id: &str, zk: &str, extra: &[&str]) -> ProcessBuilder {
        ProcessBuilder::new("cms-bookie")
            .name(id)
            .port("grpc")
            .port("http")
            .arg("serve")
            .arg("--config={dir}/bookie.toml")
            .file("bookie.toml", BOOKIE_TEST_CONFIG)
            .arg(format!("--metadata-url=zk://{zk}"))
            .arg("--metadata-session-timeout-ms=4000")
            .arg(format!("--bookie-id={id}"))
            .arg("--grpc-bind=127.0.0.1:{port:grpc}")
            .arg("--http-bind=127.0.0.1:{port:http}")
            .arg("--journal-dir={dir}/journal")
            .arg("--ledger-dir={dir}/ledgers")
            .arg("--journal-file-bytes=8388608")
            .arg("--entry-log-bytes-max=8388608")
            .arg("--write-cache-bytes-max=33554432")
            .arg("--read-cache-bytes-max=16777216")
            .arg("--reserved-bytes=1048576")
            .arg("--disk-check-interval-ms=200")
            .args(extra.iter().copied())
    }

    /// Starts bookie `id` and waits until it is ready (registered, writable).
    pub async fn start(id: &str, zk: &str, extra: &[&str]) -> BookieNode {
        let mut process = Self::builder(id, zk, extra).spawn();
        let http = process.addr("http");
        process.wait_ready(http).await;
        BookieNode {
            process,
            id: id.to_string(),
        }
    }

    /// Replaces the bookie's TOML config file (read at the next start; flags
    /// given at spawn still win over it).
    pub fn set_config(&self, toml: &str) {
        let path = self.process.dir().join("bookie.toml");
        std::fs::write(&path, toml).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// The gRPC address.
    pub fn grpc(&self) -> SocketAddr {
        self.process.addr("grpc")
    }

    /// The HTTP address.
    pub fn http(&self) -> SocketAddr {
        self.process.addr("http")
    }

    /// Waits until ready again (after a restart).
    pub async fn wait_ready(&mut self) {
        let http = self.http();
        self.process.wait_ready(http).await;
    }

    /// Restarts (SIGTERM, start) and waits until ready.
    pub async fn restart(&mut self) {
        self.process.restart().await;
        self.wait_ready().await;
    }

    /// SIGKILL, start again, wait until ready.
    pub async fn kill_and_restart(&mut self) {
        self.process.kill();
        self.process.restart().await;
        self.wait_ready().await;
    }

    /// A connection to this bookie as incarnation `incarnation`.
    pub async fn client_for(&self, incarnation: u64) -> BookieClient {
        BookieClient::connect(
            &self.id,
            incarnation,
            &self.grpc().to_string(),
            ClientOptions::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", self.id))
    }

    /// A connection to this bookie, incarnation 1.
    pub async fn client(&self) -> BookieClient {
        self.client_for(1).await
    }

    /// `POST http://<http><path>` (test fault triggers); the status, or None if
    /// the connection broke (a power cut aborts the process mid-request).
    pub async fn post(&self, path: &str) -> Option<u16> {
        crate::harness::http::client()
            .post(format!("http://{}{path}", self.http()))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }
}

/// Options of a ledger client in process tests: short timeouts, so a lost or
/// frozen bookie is noticed within a test's time budget.
pub fn ledger_client_options() -> LedgerClientOptions {
    let mut o = LedgerClientOptions::default();
    o.writer.add_timeout_ms = 2_000;
    o.writer.explicit_lac_interval_ms = 200;
    o.recovery.read_timeout_ms = 2_000;
    o.recovery.add_timeout_ms = 2_000;
    o.bookie.connect_timeout_ms = 1_000;
    o.bookie.request_timeout_ms = 3_000;
    o
}

/// A ledger client against ZooKeeper `zk` (`host:port`) with `options`, in
/// its own metadata session.
pub async fn ledger_client(zk: &str, options: LedgerClientOptions) -> LedgerClient {
    let store = init_store(zk).await;
    let layout = Layout::new(ROOT).unwrap_or_else(|e| panic!("{e}"));
    LedgerClient::connect(store, layout, options)
        .await
        .unwrap_or_else(|e| panic!("ledger client: {e}"))
}

/// The payload the ledger tests (and `cms-test-ledger-writer`) write as entry
/// `entry_id`: `size` bytes that name the entry, so a misplaced or truncated
/// entry is visible.
pub fn ledger_payload(entry_id: i64, size: usize) -> Vec<u8> {
    let tag = format!("entry {entry_id:010} ");
    tag.bytes().cycle().take(size.max(tag.len())).collect()
}

/// Bookies `b1..=bn` against ZooKeeper `zk` (initialised first), started one
/// after the other and ready.
pub async fn start_bookies(zk: &str, n: usize) -> Vec<BookieNode> {
    init_store(zk).await.close().await;
    let mut out = Vec::with_capacity(n);
    for i in 1..=n {
        out.push(BookieNode::start(&format!("b{i}"), zk, &[]).await);
    }
    out
}

/// The cluster-mode topology of the broker system tests, as processes:
/// ZooKeeper, bookies `b1..=b3` and one `cms-broker serve` (its default
/// E/Qw/Qa = 3/3/2). Dropped in field order: the broker first, ZooKeeper last.
pub struct BrokerCluster {
    /// The broker.
    pub broker: BrokerNode,
    /// The bookies.
    pub bookies: Vec<BookieNode>,
    /// ZooKeeper.
    pub zk: crate::harness::zookeeper::ZooKeeper,
}

impl BrokerCluster {
    /// Starts ZooKeeper, three bookies and a broker named `broker` with
    /// `extra` flags; returns once the broker is ready.
    pub async fn start(extra: &[&str]) -> BrokerCluster {
        let zk = crate::harness::zookeeper::ZooKeeper::start().await;
        let zks = zk.connect_string();
        let bookies = start_bookies(&zks, 3).await;
        let broker = BrokerNode::start_cluster("broker", &zks, extra).await;
        BrokerCluster {
            broker,
            bookies,
            zk,
        }
    }
}

/// What a managed ledger needs in process tests: a ledger client with test
/// timeouts and a metadata store, each in its own ZooKeeper session (a "broker").
pub async fn managed_ledger_env(zk: &str) -> (LedgerClient, Arc<dyn MetadataStore>, Layout) {
    let store = init_store(zk).await;
    let layout = Layout::new(ROOT).unwrap_or_else(|e| panic!("{e}"));
    let client = LedgerClient::connect(store.clone(), layout.clone(), ledger_client_options())
        .await
        .unwrap_or_else(|e| panic!("ledger client: {e}"));
    (client, store, layout)
}

/// A `cms-bookie autorecovery` process (auditor + worker) against ZooKeeper
/// `zk`, with test-sized grace periods: a bookie is lost after
/// `lost_bookie_grace_ms`, an open ledger is recovered after 1 s, audits
/// every 200 ms, no throttle, `/metrics` on the port named `http`; `extra`
/// flags (`--name=value`) are appended and replace a default of the same name.
pub fn autorecovery_process(zk: &str, lost_bookie_grace_ms: u64, extra: &[&str]) -> Process {
    let defaults = [
        format!("--metadata-url=zk://{zk}"),
        "--metadata-session-timeout-ms=4000".to_string(),
        format!("--lost-bookie-grace-ms={lost_bookie_grace_ms}"),
        "--open-ledger-grace-ms=1000".to_string(),
        "--autorecovery-interval-ms=200".to_string(),
        "--replication-entries-per-s-max=0".to_string(),
        "--replication-bytes-per-s-max=0".to_string(),
        "--http-bind=127.0.0.1:{port:http}".to_string(),
    ];
    let name = |a: &str| a.split('=').next().unwrap_or(a).to_string();
    let overridden: Vec<String> = extra.iter().map(|a| name(a)).collect();
    ProcessBuilder::new("cms-bookie")
        .name("autorecovery")
        .port("http")
        .arg("autorecovery")
        .args(
            defaults
                .into_iter()
                .filter(|d| !overridden.contains(&name(d))),
        )
        .args(extra.iter().copied())
        .spawn()
}

/// Checks entry by entry that every bookie of each entry's write set (in the
/// ledger's current metadata) returns it, digest-verified, with `payload(e)`;
/// the mismatches as text (empty: all good).
pub async fn replica_mismatches(
    client: &LedgerClient,
    bookies: &[BookieNode],
    ledger_id: u64,
    payload: impl Fn(i64) -> Vec<u8>,
) -> Vec<String> {
    use cms_bookie::bookie_client::read_status;
    use cms_bookie::client::metadata::{quorum_spec, write_set_bookies};
    use cms_bookie::entry::Entry;
    use cms_bookie::proto::bookie::StatusCode;

    let md = match client.ledger_metadata(ledger_id).await {
        Ok(md) => md,
        Err(e) => return vec![format!("metadata: {e}")],
    };
    let spec = match quorum_spec(&md) {
        Ok(s) => s,
        Err(e) => return vec![format!("quorum: {e}")],
    };
    let mut out = Vec::new();
    let mut conns = std::collections::HashMap::new();
    for e in 0..=md.last_entry_id {
        for b in write_set_bookies(&md, &spec, e) {
            let Some(node) = bookies.iter().find(|n| n.id == b) else {
                out.push(format!("entry {e}: bookie {b} is not a known bookie"));
                continue;
            };
            if !conns.contains_key(&b) {
                conns.insert(b.clone(), node.client().await);
            }
            let c = &conns[&b];
            match c.read(ledger_id, e, None, "test").await {
                Ok(r) if read_status(&r) == StatusCode::Ok => {
                    match Entry::decode_expected(r.body, ledger_id, e) {
                        Ok(entry) if entry.payload.as_ref() == payload(e).as_slice() => {}
                        Ok(_) => out.push(format!("entry {e} on {b}: wrong payload")),
                        Err(err) => out.push(format!("entry {e} on {b}: {err}")),
                    }
                }
                Ok(r) => out.push(format!("entry {e} on {b}: {:?}", read_status(&r))),
                Err(err) => out.push(format!("entry {e} on {b}: {err}")),
            }
        }
    }
    out
}

/// The value of the Prometheus sample `name` (no labels) at `http://<addr>/metrics`,
/// None if the endpoint or the sample is missing.
pub async fn metric_value(addr: SocketAddr, name: &str) -> Option<f64> {
    let text = crate::harness::http::client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    metric_in(&text, name)
}

/// The value of the unlabelled series `name` in a Prometheus text exposition.
pub fn metric_in(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

// ---------------------------------------------------------------- brokers

/// One `cms-broker` process: `standalone` (embedded store + in-process
/// bookie under its directory) or `serve` (against ZooKeeper and bookies).
#[derive(Debug)]
pub struct BrokerNode {
    /// The process (restart, kill, pause, log).
    pub process: Process,
}

impl BrokerNode {
    /// An admin REST call to this broker with an optional JSON body:
    /// (status, the answer as JSON or `Null`). Panics only if the request
    /// cannot be sent.
    pub async fn admin_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let client = crate::harness::http::client();
        let mut req = client.request(method.clone(), format!("http://{}{path}", self.http()));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    }

    /// An admin REST call with a raw JSON body that must succeed (2xx);
    /// panics with the status and the answer otherwise.
    pub async fn admin_ok(&self, method: reqwest::Method, path: &str, body: Option<&str>) {
        let client = crate::harness::http::client();
        let mut req = client.request(method.clone(), format!("http://{}{path}", self.http()));
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "{method} {path}: {status} {text}");
    }

    /// Builder of `cms-broker standalone` with its data under `{dir}/data`,
    /// the Pulsar port `pulsar` and HTTP port `http` on loopback, the
    /// read-only disk threshold near 1.0 (shared test disks); `extra` flags
    /// are appended (later flags win).
    pub fn standalone_builder(name: &str, extra: &[&str]) -> ProcessBuilder {
        ProcessBuilder::new("cms-broker")
            .name(name)
            .port("pulsar")
            .port("http")
            .arg("standalone")
            .arg("--data-dir={dir}/data")
            .arg("--broker-bind=127.0.0.1:{port:pulsar}")
            .arg("--http-bind=127.0.0.1:{port:http}")
            .arg("--standalone-disk-usage-threshold=0.999")
            .args(extra.iter().copied())
    }

    /// Starts a standalone broker and waits until `/ready` answers 200.
    pub async fn start_standalone(extra: &[&str]) -> BrokerNode {
        let mut process = Self::standalone_builder("standalone", extra).spawn();
        let http = process.addr("http");
        process.wait_ready(http).await;
        BrokerNode { process }
    }

    /// Builder of `cms-broker serve` against ZooKeeper `zk` (`host:port`);
    /// `extra` flags are appended.
    pub fn cluster_builder(name: &str, zk: &str, extra: &[&str]) -> ProcessBuilder {
        ProcessBuilder::new("cms-broker")
            .name(name)
            .port("pulsar")
            .port("http")
            .arg("serve")
            .arg(format!("--metadata-url=zk://{zk}"))
            .arg("--metadata-session-timeout-ms=4000")
            .arg("--broker-bind=127.0.0.1:{port:pulsar}")
            .arg("--http-bind=127.0.0.1:{port:http}")
            .args(extra.iter().copied())
    }

    /// Initialises the cluster (layout, `public/default`) in ZooKeeper `zk`,
    /// starts a cluster-mode broker and waits until it is ready (the
    /// bookies must be running: `/ready` needs a writable quorum).
    pub async fn start_cluster(name: &str, zk: &str, extra: &[&str]) -> BrokerNode {
        let store = init_store(zk).await;
        let layout = Layout::new(ROOT).unwrap_or_else(|e| panic!("{e}"));
        cms_broker::tenancy::init_cluster(&*store, &layout, "test")
            .await
            .unwrap_or_else(|e| panic!("broker init-cluster: {e}"));
        store.close().await;
        let mut process = Self::cluster_builder(name, zk, extra).spawn();
        let http = process.addr("http");
        process.wait_ready(http).await;
        BrokerNode { process }
    }

    /// The Pulsar protocol address.
    pub fn pulsar(&self) -> SocketAddr {
        self.process.addr("pulsar")
    }

    /// The HTTP address.
    pub fn http(&self) -> SocketAddr {
        self.process.addr("http")
    }

    /// `pulsar://127.0.0.1:<port>`, the service URL clients are given.
    pub fn service_url(&self) -> String {
        format!("pulsar://{}", self.pulsar())
    }

    /// Waits until ready again (after a restart).
    pub async fn wait_ready(&mut self) {
        let http = self.http();
        self.process.wait_ready(http).await;
    }

    /// Restarts (SIGTERM, start) and waits until ready.
    pub async fn restart(&mut self) {
        self.process.restart().await;
        self.wait_ready().await;
    }

    /// SIGKILL, start again, wait until ready.
    pub async fn kill_and_restart(&mut self) {
        self.process.kill();
        self.process.restart().await;
        self.wait_ready().await;
    }
}

/// Environment variable naming the Python interpreter that has `pulsar-client`.
pub const PYTHON_ENV: &str = "CMS_TEST_PYTHON";

/// Bound on one Python script run, in milliseconds, unless the caller says otherwise.
pub const PYTHON_TIMEOUT_MS: u64 = 60_000;

/// The repository root (the parent of the `tests` crate).
pub fn repo_root() -> std::path::PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| manifest.to_path_buf())
}

/// The Python interpreter with `pulsar-client`: `$CMS_TEST_PYTHON`, else
/// `<repo>/.venv/bin/python`.
///
/// # Panics
/// With the command that creates the venv when neither exists (never skips).
pub fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os(PYTHON_ENV) {
        let p = std::path::PathBuf::from(p);
        if p.is_file() {
            return p;
        }
        panic!("{PYTHON_ENV}={} does not exist", p.display());
    }
    let venv = repo_root().join(".venv/bin/python");
    if venv.is_file() {
        return venv;
    }
    panic!(
        "no Python with pulsar-client: set {PYTHON_ENV} or create {} with \
         `python3 -m venv .venv && .venv/bin/pip install 'pulsar-client[avro]==3.13.*'` at the repo root",
        venv.display()
    );
}

/// What a script of `tests/python/` printed and how it exited.
#[derive(Debug, Clone)]
pub struct PythonRun {
    /// Exit success.
    pub ok: bool,
    /// How it exited (code or signal), for failure messages.
    pub status: String,
    /// The JSON object on its last stdout line (Null if none).
    pub json: serde_json::Value,
    /// Its stderr (the C++ client's log).
    pub stderr: String,
}

/// Runs `tests/python/<script>` with `args`, at most `timeout_ms` (then it is
/// killed and this panics).
pub async fn run_python(script: &str, args: &[&str], timeout_ms: u64) -> PythonRun {
    let path = repo_root().join("tests/python").join(script);
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(&path)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", path.display()));
    let out = match tokio::time::timeout(
        std::time::Duration::from_millis(timeout_ms),
        child.wait_with_output(),
    )
    .await
    {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => panic!("running {script}: {e}"),
        Err(_) => panic!("{script} {args:?} did not finish within {timeout_ms} ms"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let json = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(serde_json::Value::Null);
    PythonRun {
        ok: out.status.success(),
        status: out.status.to_string(),
        json,
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// A bare Pulsar protocol connection for protocol tests: frames in, frames
/// out, every wait bounded by [`RAW_ANSWER_TIMEOUT_MS`].
#[derive(Debug)]
pub struct RawPulsarClient {
    /// The framed socket.
    pub framed: tokio_util::codec::Framed<tokio::net::TcpStream, cms_client::proto::PulsarCodec>,
}

/// Bound on each expected answer or close of a [`RawPulsarClient`], in milliseconds.
pub const RAW_ANSWER_TIMEOUT_MS: u64 = 5_000;

impl RawPulsarClient {
    /// Opens a TCP connection (no handshake).
    pub async fn open(addr: SocketAddr) -> RawPulsarClient {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
        RawPulsarClient {
            framed: tokio_util::codec::Framed::new(
                stream,
                cms_client::proto::PulsarCodec::default(),
            ),
        }
    }

    /// Opens a connection and completes CONNECT / CONNECTED.
    pub async fn connected(addr: SocketAddr) -> RawPulsarClient {
        use cms_client::proto::pulsar::base_command::Type;
        let mut c = Self::open(addr).await;
        c.send(cms_client::proto::commands::connect("raw-test", 20))
            .await;
        let got = c.recv().await.unwrap_or_else(|| panic!("no CONNECTED"));
        assert_eq!(got.r#type, Type::Connected as i32, "{got:?}");
        c
    }

    /// Sends a simple command.
    pub async fn send(&mut self, cmd: cms_client::proto::pulsar::BaseCommand) {
        use futures::SinkExt;
        self.framed
            .send(cms_client::proto::Frame::from(cmd))
            .await
            .unwrap_or_else(|e| panic!("sending: {e}"));
    }

    /// The next command, or None if the broker closed the connection.
    ///
    /// # Panics
    /// If nothing arrives within [`RAW_ANSWER_TIMEOUT_MS`].
    pub async fn recv(&mut self) -> Option<cms_client::proto::pulsar::BaseCommand> {
        self.recv_within(RAW_ANSWER_TIMEOUT_MS)
            .await
            .unwrap_or_else(|| panic!("no answer and no close within {RAW_ANSWER_TIMEOUT_MS} ms"))
    }

    /// Like [`Self::recv`] with its own bound: `None` on timeout,
    /// `Some(None)` when closed.
    pub async fn recv_within(
        &mut self,
        timeout_ms: u64,
    ) -> Option<Option<cms_client::proto::pulsar::BaseCommand>> {
        use futures::StreamExt;
        match tokio::time::timeout(
            std::time::Duration::from_millis(timeout_ms),
            self.framed.next(),
        )
        .await
        {
            Ok(Some(Ok(f))) => Some(Some(f.command().clone())),
            Ok(Some(Err(_))) | Ok(None) => Some(None),
            Err(_) => None,
        }
    }

    /// Asserts the broker closes the connection (skipping a few answers).
    pub async fn expect_closed(&mut self, what: &str) {
        for _ in 0..4 {
            if self.recv().await.is_none() {
                return;
            }
        }
        panic!("{what}: the broker kept the connection open");
    }
}

/// Starts `tests/python/<script>` with `args` in the background, stdout and
/// stderr piped (killed when dropped); read its progress from stdout and
/// finish with [`finish_python`].
pub fn spawn_python(script: &str, args: &[&str]) -> tokio::process::Child {
    let path = repo_root().join("tests/python").join(script);
    tokio::process::Command::new(python())
        .arg(&path)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", path.display()))
}

/// Waits (at most `timeout_ms`, then panics) for a script started by
/// [`spawn_python`] whose stdout the caller may have partly read with `lines`.
pub async fn finish_python(
    mut child: tokio::process::Child,
    mut lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    timeout_ms: u64,
) -> PythonRun {
    use tokio::io::AsyncReadExt;
    let mut stderr = child.stderr.take();
    let work = async {
        let mut json = serde_json::Value::Null;
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim_start().starts_with('{') {
                json = serde_json::from_str(&line).unwrap_or(serde_json::Value::Null);
            }
        }
        let mut err = String::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_string(&mut err).await;
        }
        let (ok, status) = match child.wait().await {
            Ok(s) => (s.success(), s.to_string()),
            Err(e) => (false, e.to_string()),
        };
        PythonRun {
            ok,
            status,
            json,
            stderr: err,
        }
    };
    tokio::time::timeout(std::time::Duration::from_millis(timeout_ms), work)
        .await
        .unwrap_or_else(|_| panic!("python script did not finish within {timeout_ms} ms"))
}
