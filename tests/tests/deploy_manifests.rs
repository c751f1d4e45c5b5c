//! Drift test of the Kubernetes manifests (`deploy/k8s`) against the real
//! binaries. `scripts/check-k8s` renders every overlay to
//! `target/k8s/<overlay>.yaml` (CI runs it before the tests); this suite
//! parses those files and fails when a manifest and the code disagree:
//!
//! - every container running one of our binaries is run here with its exact
//!   command line, its environment (downward-API values filled in), its
//!   ConfigMap files and its Secrets (made the way deploy/README.md says) at
//!   the mounted paths (mapped into a temporary directory), plus
//!   `--print-config`: the binary parses the flags, loads the TOML (unknown
//!   keys are refused), validates (TLS files, token keys) and prints the
//!   effective configuration, which must hold every key of the file;
//! - container ports equal the configured listen ports, Services and
//!   PodMonitors name ports that exist, probes use the HTTP port, the
//!   metadata URL names the ZooKeeper Service, advertised names are the
//!   pods' DNS names under a headless Service, bookie data lives on
//!   volumeClaimTemplates, enough bookies for the ensemble, grace periods
//!   cover the broker's bundle drain;
//! - the probe and scrape paths answer 200 on a bookie and a broker started
//!   from the dev overlay's own command lines and config files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use cms_tests::harness::process::ProcessBuilder;
use cms_tests::harness::{bins, wait, zookeeper::ZooKeeper};
use serde::Deserialize;
use serde_json::Value;

/// The overlays `scripts/check-k8s` renders.
const OVERLAYS: &[&str] = &["dev", "production", "monitoring"];

/// Listen-address keys of each binary's config and the container port name
/// each must be published as.
const BIND_PORTS: &[(&str, &str, &str)] = &[
    ("cms-bookie", "grpc_bind", "grpc"),
    ("cms-bookie", "http_bind", "http"),
    ("cms-broker", "broker_bind", "pulsar"),
    ("cms-broker", "http_bind", "http"),
    ("cms-broker", "broker_tls_bind", "pulsar-tls"),
    ("cms-broker", "https_bind", "https"),
];

/// Where our binaries live in the image (deploy/docker).
const IMAGE_BIN_DIR: &str = "/usr/local/bin/";

fn render(overlay: &str) -> Vec<Value> {
    let path = cms_tests::cluster::repo_root()
        .join("target/k8s")
        .join(format!("{overlay}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/check-k8s first (it renders the overlays)",
            path.display()
        )
    });
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{overlay}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn name(doc: &Value) -> &str {
    s(&doc["metadata"]["name"])
}

fn of_kind<'a>(docs: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    docs.iter().filter(move |d| d["kind"] == kind)
}

fn find<'a>(docs: &'a [Value], kind: &str, want: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && name(d) == want)
        .unwrap_or_else(|| panic!("no {kind} {want}"))
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// Workloads (StatefulSets, Deployments, Jobs) with their pod spec.
fn workloads(docs: &[Value]) -> Vec<&Value> {
    docs.iter()
        .filter(|d| matches!(s(&d["kind"]), "StatefulSet" | "Deployment" | "Job"))
        .collect()
}

fn pod_spec(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

fn namespace(docs: &[Value]) -> String {
    let ns = of_kind(docs, "Namespace")
        .next()
        .map(name)
        .expect("overlay has a Namespace");
    ns.to_string()
}

/// Containers running one of our binaries: (binary name, container).
fn our_containers(workload: &Value) -> Vec<(String, &Value)> {
    let spec = pod_spec(workload);
    list(&spec["containers"])
        .iter()
        .chain(list(&spec["initContainers"]))
        .filter_map(|c| {
            let cmd = list(&c["command"]).first().map(s).unwrap_or_default();
            cmd.strip_prefix(IMAGE_BIN_DIR)
                .filter(|b| b.starts_with("cms-"))
                .map(|b| (b.to_string(), c))
        })
        .collect()
}

/// Whether `labels` (a JSON object) holds every pair of `selector`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels[k] == *v))
}

fn workload_selected<'a>(docs: &'a [Value], selector: &Value) -> Vec<&'a Value> {
    workloads(docs)
        .into_iter()
        .filter(|w| selects(selector, &w["spec"]["template"]["metadata"]["labels"]))
        .collect()
}

/// `host:port` of a bind address ("" = off).
fn bind_port(addr: &str) -> Option<u16> {
    let (_, port) = addr.rsplit_once(':')?;
    Some(port.parse().unwrap_or_else(|e| panic!("{addr}: {e}")))
}

/// A container of ours, prepared to run on this machine: mounted files in a
/// sandbox directory, command line and config files with the mount paths
/// mapped into it, environment resolved.
struct Prepared {
    binary: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// (mount path in the pod, path in the sandbox, volume is a PVC template)
    mounts: Vec<(String, PathBuf, bool)>,
    /// The `--config` file in the sandbox, if any.
    config: Option<PathBuf>,
    dir: tempfile::TempDir,
}

impl Prepared {
    fn new(docs: &[Value], workload: &Value, binary: &str, container: &Value) -> Prepared {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = pod_spec(workload);
        let pvcs: BTreeSet<&str> = list(&workload["spec"]["volumeClaimTemplates"])
            .iter()
            .map(name)
            .collect();
        let mut mounts = Vec::new();
        for m in list(&container["volumeMounts"]) {
            let (vol, mount_path) = (s(&m["name"]), s(&m["mountPath"]));
            let real = dir.path().join(mount_path.trim_start_matches('/'));
            std::fs::create_dir_all(&real).expect("mkdir");
            let is_pvc = pvcs.contains(vol);
            if !is_pvc {
                let volume = list(&spec["volumes"])
                    .iter()
                    .find(|v| v["name"] == vol)
                    .unwrap_or_else(|| panic!("{}: volume {vol} is not declared", name(workload)));
                if let Some(cm) = volume["configMap"]["name"].as_str() {
                    let cm = docs
                        .iter()
                        .find(|d| d["kind"] == "ConfigMap" && name(d) == cm)
                        .unwrap_or_else(|| panic!("ConfigMap {cm} is not in the overlay"));
                    for (key, text) in cm["data"].as_object().expect("ConfigMap data") {
                        std::fs::write(real.join(key), s(text)).expect("write");
                    }
                } else if let Some(secret) = volume["secret"]["secretName"].as_str() {
                    make_secret(secret, &real);
                } else {
                    assert!(
                        volume.get("emptyDir").is_some(),
                        "{}: volume {vol} is neither a ConfigMap, a Secret, an emptyDir nor a PVC",
                        name(workload)
                    );
                }
            }
            mounts.push((mount_path.to_string(), real, is_pvc));
        }
        // Config files mention mount paths: map them (after all are written).
        for (_, real, _) in &mounts {
            for entry in std::fs::read_dir(real).expect("read_dir").flatten() {
                let p = entry.path();
                if p.extension().is_some_and(|e| e == "toml") {
                    let text = std::fs::read_to_string(&p).expect("read");
                    std::fs::write(&p, map_paths(&text, &mounts)).expect("write");
                }
            }
        }
        // Environment, as the kubelet builds it: downward API, $(VAR) expansion.
        let pod_name = format!("{}-0", name(workload));
        let ns = namespace(docs);
        let mut env: Vec<(String, String)> = Vec::new();
        for e in list(&container["env"]) {
            let value = if let Some(v) = e["value"].as_str() {
                expand(v, &env)
            } else {
                match s(&e["valueFrom"]["fieldRef"]["fieldPath"]) {
                    "metadata.name" => pod_name.clone(),
                    "metadata.namespace" => ns.clone(),
                    other => panic!(
                        "env {}: fieldRef {other:?} is not known here",
                        s(&e["name"])
                    ),
                }
            };
            env.push((s(&e["name"]).to_string(), value));
        }
        let cmd: Vec<String> = list(&container["command"])
            .iter()
            .chain(list(&container["args"]))
            .map(|a| map_paths(&expand(s(a), &env), &mounts))
            .collect();
        let config = cmd
            .iter()
            .find_map(|a| a.strip_prefix("--config="))
            .map(PathBuf::from);
        Prepared {
            binary: bins::find(binary).unwrap_or_else(|e| panic!("{e}")),
            args: cmd[1..].to_vec(),
            env,
            mounts,
            config,
            dir,
        }
    }

    /// Runs the binary with the prepared command line plus `extra`:
    /// (exit code, stdout, stderr).
    fn run(&self, extra: &[&str]) -> (i32, String, String) {
        let out = Command::new(&self.binary)
            .args(&self.args)
            .args(extra)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(self.dir.path())
            .output()
            .expect("running the binary");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The effective configuration (`--print-config`), which must load.
    fn effective_config(&self, what: &str) -> toml::Table {
        let (code, out, err) = self.run(&["--print-config"]);
        assert_eq!(
            code,
            0,
            "{what}: {} {} --print-config refused: {err}",
            self.binary.display(),
            self.args.join(" ")
        );
        out.parse()
            .unwrap_or_else(|e| panic!("{what}: printed config is not TOML: {e}\n{out}"))
    }

    /// The pod path a sandbox path stands for.
    fn pod_path(&self, real: &str) -> Option<(String, bool)> {
        self.mounts.iter().find_map(|(mp, r, pvc)| {
            real.strip_prefix(&*r.to_string_lossy())
                .map(|rest| (format!("{mp}{rest}"), *pvc))
        })
    }
}

/// Kubernetes' `$(VAR)` expansion of earlier variables.
fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = text.to_string();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

/// Replaces mount paths (whole path prefixes) by their sandbox paths.
fn map_paths(text: &str, mounts: &[(String, PathBuf, bool)]) -> String {
    let mut sorted: Vec<&(String, PathBuf, bool)> = mounts.iter().collect();
    sorted.sort_by_key(|(mp, _, _)| std::cmp::Reverse(mp.len()));
    let mut out = String::new();
    let mut i = 0;
    'scan: while i < text.len() {
        let prev = text[..i].chars().next_back();
        if matches!(prev, None | Some('=' | '"' | '\'' | ' ' | ',')) {
            for (mp, real, _) in &sorted {
                let rest = &text[i..];
                if rest.starts_with(mp.as_str())
                    && matches!(
                        rest[mp.len()..].chars().next(),
                        None | Some('/' | '"' | '\'' | ' ' | ',' | '\n')
                    )
                {
                    out.push_str(&real.to_string_lossy());
                    i += mp.len();
                    continue 'scan;
                }
            }
        }
        let c = text[i..].chars().next().expect("char");
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Writes the files of Secret `secret` as deploy/README.md ("Secrets") has
/// the operator create them.
fn make_secret(secret: &str, dir: &Path) {
    match secret {
        "cms-token-keys" => {
            let bin = bins::find("cms-broker").unwrap_or_else(|e| panic!("{e}"));
            let out = Command::new(bin)
                .args(["tokens", "create-key-pair", "--output-private-key"])
                .arg(dir.join("private.key"))
                .arg("--output-public-key")
                .arg(dir.join("public.key"))
                .output()
                .expect("cms-broker tokens create-key-pair");
            assert!(out.status.success(), "{out:?}");
            // The Secret holds the public key only.
            std::fs::remove_file(dir.join("private.key")).expect("rm");
        }
        "cms-broker-tls" => {
            let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
                .expect("self-signed certificate");
            std::fs::write(dir.join("tls.crt"), cert.cert.pem()).expect("write");
            std::fs::write(dir.join("tls.key"), cert.signing_key.serialize_pem()).expect("write");
        }
        other => panic!(
            "Secret {other}: this test does not know how to make it; add it here and to \
             deploy/README.md"
        ),
    }
}

/// Named container ports of a container: name -> port.
fn container_ports(container: &Value) -> BTreeMap<String, u64> {
    list(&container["ports"])
        .iter()
        .map(|p| {
            (
                s(&p["name"]).to_string(),
                p["containerPort"].as_u64().expect("containerPort"),
            )
        })
        .collect()
}

/// Resolves a probe's / Service's port (a number or a name) on `container`.
fn resolve_port(container: &Value, port: &Value) -> Option<u64> {
    let ports = container_ports(container);
    match port {
        Value::Number(n) => n.as_u64().filter(|p| ports.values().any(|v| v == p)),
        Value::String(n) => ports.get(n).copied(),
        _ => None,
    }
}

/// Checks one overlay; returns the probe / scrape paths per binary and port
/// name, for the live test.
fn check_overlay(overlay: &str) -> BTreeSet<(String, String, String)> {
    let docs = render(overlay);
    let ns = namespace(&docs);
    let mut paths = BTreeSet::new();
    let mut configs: BTreeMap<String, toml::Table> = BTreeMap::new();
    let mut checked = 0;
    for w in workloads(&docs) {
        let spec = pod_spec(w);
        for (binary, c) in our_containers(w) {
            let what = format!("{overlay}: {} container {}", name(w), s(&c["name"]));
            let p = Prepared::new(&docs, w, &binary, c);
            let effective = p.effective_config(&what);
            checked += 1;
            // Every key of the file is in force (unless a flag overrides it).
            if let Some(file) = &p.config {
                let text = std::fs::read_to_string(file).expect("config file");
                let table: toml::Table = text
                    .parse()
                    .unwrap_or_else(|e| panic!("{what}: {}: {e}", file.display()));
                for (k, v) in &table {
                    let flag = format!("--{}=", k.replace('_', "-"));
                    if !p.args.iter().any(|a| a.starts_with(&flag)) {
                        assert_eq!(effective.get(k), Some(v), "{what}: key {k} not in force");
                    }
                }
            }
            // Container ports = configured listen ports, no more, no less.
            let ports = container_ports(c);
            let mut expected = BTreeSet::new();
            for (_, key, port_name) in BIND_PORTS.iter().filter(|(b, _, _)| *b == binary) {
                let bind = effective.get(*key).and_then(|v| v.as_str()).unwrap_or("");
                match bind_port(bind) {
                    Some(port) => {
                        assert_eq!(
                            ports.get(*port_name),
                            Some(&u64::from(port)),
                            "{what}: containerPort {port_name} must be {port} ({key} = {bind:?})"
                        );
                        expected.insert(port_name.to_string());
                    }
                    None => assert!(
                        !ports.contains_key(*port_name),
                        "{what}: containerPort {port_name} but {key} is off"
                    ),
                }
            }
            let published: BTreeSet<String> = ports.keys().cloned().collect();
            assert_eq!(
                published, expected,
                "{what}: container ports vs listen keys"
            );
            // Probes: HTTP GET on the HTTP port.
            for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                let get = &c[probe]["httpGet"];
                if get.is_null() {
                    assert!(
                        c[probe].is_null() || w["kind"] == "Job",
                        "{what}: {probe} is not an httpGet"
                    );
                    continue;
                }
                assert_eq!(
                    resolve_port(c, &get["port"]),
                    ports.get("http").copied(),
                    "{what}: {probe} must use the HTTP port"
                );
                paths.insert((binary.clone(), "http".to_string(), s(&get["path"]).into()));
            }
            if w["kind"] == "StatefulSet" {
                assert!(!c["readinessProbe"].is_null(), "{what}: no readinessProbe");
                assert!(!c["livenessProbe"].is_null(), "{what}: no livenessProbe");
            }
            // Security context and identity.
            assert_eq!(
                c["securityContext"]["readOnlyRootFilesystem"], true,
                "{what}: readOnlyRootFilesystem"
            );
            assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{what}");
            assert_eq!(spec["securityContext"]["runAsUser"], 10001, "{what}");
            let headless = |svc: &str| {
                let svc = find(&docs, "Service", svc);
                assert_eq!(
                    svc["spec"]["clusterIP"],
                    "None",
                    "{what}: {} headless",
                    name(svc)
                );
                format!("{}-0.{}.{ns}.svc.cluster.local", name(w), name(svc))
            };
            match binary.as_str() {
                "cms-bookie" => {
                    let host = effective["advertised_host"].as_str().unwrap_or_default();
                    assert_eq!(host, headless(s(&w["spec"]["serviceName"])), "{what}");
                    assert_eq!(
                        effective["bookie_id"].as_str(),
                        Some(format!("{}-0", name(w)).as_str()),
                        "{what}: bookie id = pod name"
                    );
                    for key in ["journal_dir", "ledger_dir"] {
                        let real = effective[key].as_str().unwrap_or_default();
                        let (pod, pvc) = p
                            .pod_path(real)
                            .unwrap_or_else(|| panic!("{what}: {key} {real} is on no volume"));
                        assert!(pvc, "{what}: {key} {pod} is not on a volumeClaimTemplate");
                    }
                    assert!(
                        spec["terminationGracePeriodSeconds"].as_u64() >= Some(30),
                        "{what}: grace period too short to flush"
                    );
                    assert_eq!(w["spec"]["podManagementPolicy"], "Parallel", "{what}");
                }
                "cms-broker" if list(&c["command"]).iter().any(|a| a == "serve") => {
                    let addr = effective["advertised_address"].as_str().unwrap_or_default();
                    assert_eq!(addr, headless(s(&w["spec"]["serviceName"])), "{what}");
                    // SIGTERM drains bundles (bounded), then closes topics and
                    // the HTTP server (5 s each at most); preStop runs first.
                    let pre_stop: u64 = list(&c["lifecycle"]["preStop"]["exec"]["command"])
                        .iter()
                        .filter_map(|a| s(a).parse::<u64>().ok())
                        .sum();
                    let needed = cms_broker::service::DRAIN_TIMEOUT_MS / 1000 + pre_stop + 10;
                    assert!(
                        spec["terminationGracePeriodSeconds"].as_u64() >= Some(needed),
                        "{what}: terminationGracePeriodSeconds must be >= {needed}"
                    );
                }
                _ => {}
            }
            configs.insert(format!("{}/{}", name(w), s(&c["name"])), effective);
        }
    }
    assert!(checked >= 3, "{overlay}: only {checked} containers of ours");

    // The metadata URL names the ZooKeeper client Service and its port.
    for (what, cfg) in &configs {
        let url = cfg["metadata_url"].as_str().unwrap_or_default();
        let hosts = url
            .strip_prefix("zk://")
            .unwrap_or_else(|| panic!("{overlay} {what}: metadata_url {url}"));
        for host_port in hosts.split('/').next().unwrap_or_default().split(',') {
            let (host, port) = host_port.split_once(':').expect("host:port");
            let svc_name = host.split('.').next().unwrap_or_default();
            let svc = find(&docs, "Service", svc_name);
            let port: u64 = port.parse().expect("port");
            assert!(
                list(&svc["spec"]["ports"])
                    .iter()
                    .any(|p| p["port"] == port),
                "{overlay} {what}: Service {svc_name} has no port {port}"
            );
            let zk = workload_selected(&docs, &svc["spec"]["selector"]);
            assert!(
                zk.len() == 1 && name(zk[0]).contains("zookeeper"),
                "{overlay} {what}: {svc_name} does not select ZooKeeper"
            );
        }
    }
    // The init Job waits for the ZooKeeper its config names.
    let job = find(&docs, "Job", "cms-init-cluster");
    let init_url = configs
        .iter()
        .find(|(k, _)| k.starts_with("cms-init-cluster/"))
        .map(|(_, c)| c["metadata_url"].as_str().unwrap_or_default().to_string())
        .expect("init-cluster container");
    let waited = list(&pod_spec(job)["initContainers"])
        .iter()
        .flat_map(|c| list(&c["command"]))
        .map(s)
        .collect::<Vec<_>>()
        .join(" ");
    let zk_host = init_url.trim_start_matches("zk://").replace(':', "/");
    assert!(
        waited.contains(&format!("/dev/tcp/{zk_host}")),
        "{overlay}: the init Job waits for something else than {init_url}: {waited}"
    );

    // Services and PodMonitors name ports that exist on the pods they select.
    for svc in of_kind(&docs, "Service") {
        let targets = workload_selected(&docs, &svc["spec"]["selector"]);
        assert_eq!(targets.len(), 1, "{overlay}: Service {} selects", name(svc));
        let containers = list(&pod_spec(targets[0])["containers"]);
        for p in list(&svc["spec"]["ports"]) {
            let target = if p["targetPort"].is_null() {
                &p["port"]
            } else {
                &p["targetPort"]
            };
            assert!(
                containers.iter().any(|c| resolve_port(c, target).is_some()),
                "{overlay}: Service {} port {} has no container port",
                name(svc),
                p["port"]
            );
            if let Some(port_name) = p["name"].as_str() {
                let numbered = containers
                    .iter()
                    .find_map(|c| container_ports(c).get(port_name).copied());
                assert_eq!(
                    numbered,
                    p["port"].as_u64(),
                    "{overlay}: Service {} {port_name}",
                    name(svc)
                );
            }
        }
    }
    for pm in of_kind(&docs, "PodMonitor") {
        let targets = workload_selected(&docs, &pm["spec"]["selector"]["matchLabels"]);
        assert_eq!(
            targets.len(),
            1,
            "{overlay}: PodMonitor {} selects",
            name(pm)
        );
        for (binary, c) in our_containers(targets[0]) {
            for e in list(&pm["spec"]["podMetricsEndpoints"]) {
                let port = s(&e["port"]);
                assert!(
                    container_ports(c).contains_key(port),
                    "{overlay}: PodMonitor {} port {port}",
                    name(pm)
                );
                paths.insert((binary.clone(), port.to_string(), s(&e["path"]).into()));
            }
        }
    }
    // Prometheus annotations name the HTTP port.
    for w in workloads(&docs) {
        let ann = &w["spec"]["template"]["metadata"]["annotations"];
        if ann["prometheus.io/scrape"] == "true" {
            for (binary, c) in our_containers(w) {
                let port: u64 = s(&ann["prometheus.io/port"]).parse().expect("port");
                assert_eq!(
                    container_ports(c).get("http"),
                    Some(&port),
                    "{overlay} {}",
                    name(w)
                );
                paths.insert((binary, "http".into(), s(&ann["prometheus.io/path"]).into()));
            }
        }
    }
    // Enough writable bookies for the ensemble (the brokers' /ready).
    let bookies = find(&docs, "StatefulSet", "cms-bookie")["spec"]["replicas"]
        .as_u64()
        .expect("bookie replicas");
    let broker = &configs["cms-broker/broker"];
    let ensemble = broker["ensemble_size"].as_integer().expect("ensemble_size");
    let ensemble = if ensemble == 0 { 3 } else { ensemble as u64 };
    assert!(
        bookies >= ensemble,
        "{overlay}: {bookies} bookies < E{ensemble}"
    );
    if overlay != "dev" {
        assert!(
            bookies > ensemble,
            "{overlay}: a bookie must be losable ({bookies} bookies, E{ensemble})"
        );
        for w in workloads(&docs)
            .iter()
            .filter(|w| w["kind"] == "StatefulSet")
        {
            let pdb = of_kind(&docs, "PodDisruptionBudget")
                .find(|p| {
                    selects(
                        &p["spec"]["selector"]["matchLabels"],
                        &w["spec"]["template"]["metadata"]["labels"],
                    )
                })
                .unwrap_or_else(|| panic!("{overlay}: no PodDisruptionBudget for {}", name(w)));
            assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{overlay}: {}", name(pdb));
        }
    }
    paths
}

#[test]
fn manifests_match_what_the_binaries_accept() {
    for overlay in OVERLAYS {
        let paths = check_overlay(overlay);
        assert!(
            paths
                .iter()
                .any(|(b, _, p)| b == "cms-broker" && p == "/ready"),
            "{overlay}: no broker readiness on /ready: {paths:?}"
        );
    }
}

/// The mechanism catches drift: a misspelt key in the rendered ConfigMap
/// and an unknown flag are refused by the binary, naming them.
#[test]
fn a_misspelt_key_or_flag_is_refused() {
    let docs = render("production");
    let w = find(&docs, "StatefulSet", "cms-broker");
    let (binary, c) = our_containers(w).remove(0);
    let p = Prepared::new(&docs, w, &binary, c);
    let file = p.config.clone().expect("--config");
    let good = std::fs::read_to_string(&file).expect("read");
    assert!(good.contains("\nack_quorum ="), "{good}");
    std::fs::write(&file, good.replace("\nack_quorum =", "\nack_qourum =")).expect("write");
    let (code, _, err) = p.run(&["--print-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("ack_qourum"), "{err}");
    std::fs::write(&file, &good).expect("write");
    let (code, _, err) = p.run(&["--brokr-bind=0.0.0.0:6650", "--print-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--brokr-bind"), "{err}");
    // A Secret file the config names but the pod lacks.
    let key = p
        .mounts
        .iter()
        .find(|(mp, _, _)| mp == "/etc/cms-auth")
        .map(|(_, r, _)| r.join("public.key"))
        .expect("token key mount");
    std::fs::remove_file(&key).expect("rm");
    let (code, _, err) = p.run(&["--print-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("auth_public_key"), "{err}");
}

/// Starts the dev overlay's init Job command, bookie and broker (their
/// command lines and config files; only the metadata URL, the listen ports,
/// the advertised host and the disk threshold of the shared test disk are
/// overridden) and GETs every probe and scrape path of every overlay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_paths_answer_on_the_running_binaries() {
    let mut paths = BTreeSet::new();
    for overlay in OVERLAYS {
        paths.extend(check_overlay(overlay));
    }
    let docs = render("dev");
    let zk = ZooKeeper::start().await;
    let zk_url = format!("--metadata-url=zk://{}", zk.connect_string());

    let job = find(&docs, "Job", "cms-init-cluster");
    let (binary, c) = our_containers(job).remove(0);
    let init = Prepared::new(&docs, job, &binary, c);
    for expect in ["initialised cluster", "already initialised"] {
        let (code, out, err) = init.run(&[&zk_url]);
        assert_eq!(code, 0, "init-cluster: {out}{err}");
        assert!(out.contains(expect), "init-cluster twice: {out}");
    }

    let mut running = Vec::new();
    for (sts, overrides) in [
        (
            "cms-bookie",
            vec![
                "--grpc-bind=127.0.0.1:{port:grpc}",
                "--http-bind=127.0.0.1:{port:http}",
                "--advertised-host=127.0.0.1",
                "--disk-usage-threshold=0.999",
                "--disk-usage-lwm=0.998",
            ],
        ),
        (
            "cms-broker",
            vec![
                "--broker-bind=127.0.0.1:{port:pulsar}",
                "--http-bind=127.0.0.1:{port:http}",
                "--advertised-address=127.0.0.1",
            ],
        ),
    ] {
        let w = find(&docs, "StatefulSet", sts);
        let (binary, c) = our_containers(w).remove(0);
        let p = Prepared::new(&docs, w, &binary, c);
        // Flags may be given once: an override replaces the manifest's flag.
        let mut overrides: Vec<String> = overrides.into_iter().map(String::from).collect();
        overrides.push(zk_url.clone());
        let args = p.args.iter().filter(|a| {
            !overrides.iter().any(|o| {
                o.split_once('=')
                    .is_some_and(|(flag, _)| a.starts_with(&format!("{flag}=")))
            })
        });
        let mut builder = ProcessBuilder::program(&binary, &p.binary)
            .args(args.cloned())
            .args(overrides.iter().cloned());
        for port in container_ports(c).keys() {
            builder = builder.port(port);
        }
        for (k, v) in &p.env {
            builder = builder.env(k, v.clone());
        }
        let mut process = builder.spawn();
        let http = process.addr("http");
        process.wait_ready(http).await;
        running.push((binary, process, p));
    }
    let client = cms_tests::harness::http::client();
    for (binary, port, path) in &paths {
        let (_, process, _) = running
            .iter()
            .find(|(b, _, _)| b == binary)
            .unwrap_or_else(|| panic!("no running {binary}"));
        let url = format!("http://{}{path}", process.addr(port));
        wait::eventually(&format!("GET {url} ({binary}) answers 200"), 30_000, || {
            let req = client.get(&url).send();
            async move { req.await.is_ok_and(|r| r.status() == 200) }
        })
        .await;
    }
    // A path the binaries do not serve is not 200 (the check can fail).
    let (_, broker, _) = &running[1];
    let r = client
        .get(format!("http://{}/no-such-probe", broker.addr("http")))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status(), 404);
    for (_, mut process, _p) in running {
        process.stop().await;
    }
}
