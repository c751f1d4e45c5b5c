//! Security against `cms-broker standalone` with token authentication on
//! (RELIABILITY P1-14, P1-15):
//! - the authentication matrix, with raw frames and the official Python
//!   client: only a valid token connects; every refusal is ERROR
//!   `AuthenticationError` and closes that connection only; an expired
//!   token on a live connection is challenged (AUTH_CHALLENGE) and the
//!   connection survives a valid AUTH_RESPONSE and is closed without one;
//!   the admin API answers 401 without valid credentials; a broker with
//!   authentication enabled and no key refuses to start;
//! - the authorization matrix: every data command and every admin route
//!   (from `ROUTE_LIST`, so none is forgotten) × six roles × the own and
//!   the other tenant's resources, expectations from one table.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use cms_broker::auth::{self, Claims, SigningKey};
use cms_client::proto::commands;
use cms_client::proto::pulsar::{
    AuthData, BaseCommand, CommandAuthResponse, CommandConnect, CommandGetTopicsOfNamespace,
    ServerError,
    base_command::Type,
    command_lookup_topic_response::LookupType,
    command_partitioned_topic_metadata_response::LookupType as PmLookupType,
    command_subscribe::{InitialPosition, SubType},
};
use cms_tests::cluster::{BrokerNode, PYTHON_TIMEOUT_MS, RawPulsarClient, run_python};
use serde_json::{Value, json};

const AUDIENCE: &str = "cms-test";
const SUPERUSER: &str = "admin";
const HTTP_TIMEOUT_MS: u64 = 30_000;

struct Keys {
    _dir: tempfile::TempDir,
    secret_path: String,
    secret: Vec<u8>,
}

fn keys() -> Keys {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = auth::new_secret_key();
    let path = dir.path().join("secret.key");
    std::fs::write(&path, &secret).expect("write key");
    Keys {
        secret_path: path.display().to_string(),
        secret,
        _dir: dir,
    }
}

impl Keys {
    fn token_with(&self, sub: &str, exp: Option<u64>, nbf: Option<u64>, aud: &str) -> String {
        auth::create_token(
            &SigningKey::Secret(self.secret.clone()),
            &Claims {
                sub: sub.into(),
                exp,
                nbf,
                aud: Some(aud.into()),
            },
        )
        .expect("token")
    }

    fn token(&self, sub: &str) -> String {
        self.token_with(sub, Some(auth::now_s() + 3600), None, AUDIENCE)
    }
}

async fn start_broker(k: &Keys, extra: &[&str]) -> BrokerNode {
    let key = format!("--auth-secret-key={}", k.secret_path);
    let aud = format!("--auth-audience={AUDIENCE}");
    let su = format!("--superuser-roles={SUPERUSER}");
    let mut args = vec![key.as_str(), aud.as_str(), su.as_str()];
    args.extend_from_slice(extra);
    BrokerNode::start_standalone(&args).await
}

fn connect_cmd(token: Option<&str>) -> BaseCommand {
    let mut c = commands::connect("security-test", 20);
    let cc: &mut CommandConnect = c.connect.as_mut().expect("connect");
    if let Some(t) = token {
        cc.auth_method_name = Some("token".into());
        cc.auth_data = Some(bytes::Bytes::copy_from_slice(t.as_bytes()));
    }
    c
}

/// A connection authenticated as `token`'s role (panics if refused).
async fn connected_as(addr: SocketAddr, token: &str) -> RawPulsarClient {
    let mut c = RawPulsarClient::open(addr).await;
    c.send(connect_cmd(Some(token))).await;
    let got = c.recv().await.expect("CONNECTED");
    assert_eq!(got.r#type, Type::Connected as i32, "{got:?}");
    c
}

/// CONNECT with `token` must be refused with AuthenticationError, then closed.
async fn expect_refused(addr: SocketAddr, token: Option<&str>, what: &str) {
    let mut c = RawPulsarClient::open(addr).await;
    c.send(connect_cmd(token)).await;
    let got = c
        .recv()
        .await
        .unwrap_or_else(|| panic!("{what}: closed without an ERROR"));
    let err = got
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: expected ERROR, got {got:?}"));
    assert_eq!(
        err.error,
        ServerError::AuthenticationError as i32,
        "{what}: {err:?}"
    );
    assert!(!err.message.is_empty(), "{what}: empty reason");
    c.expect_closed(what).await;
}

/// A round trip on `c` (PING → PONG), proving the connection is alive.
async fn alive(c: &mut RawPulsarClient, what: &str) {
    c.send(commands::ping()).await;
    loop {
        let got = c
            .recv()
            .await
            .unwrap_or_else(|| panic!("{what}: connection closed"));
        if got.r#type == Type::Pong as i32 {
            return;
        }
    }
}

struct Http {
    client: reqwest::Client,
    addr: SocketAddr,
}

impl Http {
    fn new(addr: SocketAddr) -> Http {
        Http {
            client: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_millis(HTTP_TIMEOUT_MS))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("http client"),
            addr,
        }
    }

    /// `method path` as `token` (None = no header): status and JSON body.
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        token: Option<&str>,
    ) -> (u16, Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut r = self
            .client
            .request(m, format!("http://{}{path}", self.addr));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = r
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let v = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status == 401 || status == 403 {
            assert!(
                v["reason"].as_str().is_some_and(|r| !r.is_empty()),
                "{method} {path}: {status} without a JSON reason: {text}"
            );
        }
        (status, v)
    }

    async fn ok(&self, method: &str, path: &str, body: Option<&str>, token: &str) {
        let (s, v) = self.call(method, path, body, Some(token)).await;
        assert!((200..300).contains(&s), "{method} {path}: {s} {v}");
    }
}

// ---------------------------------------------------------------- P1-14

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_matrix() {
    let k = keys();
    // Fail closed: authentication on without a key → the broker refuses to start.
    let bin = cms_tests::harness::bins::find("cms-broker").expect("cms-broker binary");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(&bin)
            .args([
                "standalone",
                "--authentication-enabled=true",
                &format!("--data-dir={}", dir.path().join("data").display()),
                "--broker-bind=127.0.0.1:0",
                "--http-bind=127.0.0.1:0",
            ])
            .output(),
    )
    .await
    .expect("refusal within 30 s")
    .expect("run cms-broker");
    assert!(!out.status.success(), "started without a key");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("auth_secret_key"), "{stderr}");

    let broker = start_broker(
        &k,
        &["--keep-alive-interval-s=10", "--auth-refresh-timeout-s=2"],
    )
    .await;
    let addr = broker.pulsar();
    let now = auth::now_s();

    // A valid connection that must survive every refusal below.
    let mut keeper = connected_as(addr, &k.token("alice")).await;

    let other_secret = auth::new_secret_key();
    let wrong_sig = auth::create_token(
        &SigningKey::Secret(other_secret),
        &Claims {
            sub: "alice".into(),
            exp: None,
            nbf: None,
            aud: Some(AUDIENCE.into()),
        },
    )
    .expect("token");
    let (private, _) = auth::new_key_pair(auth::KeyPairAlgorithm::Rs256).expect("key pair");
    let wrong_alg = auth::create_token(
        &SigningKey::Private(private.into_bytes()),
        &Claims {
            sub: "alice".into(),
            exp: None,
            nbf: None,
            aud: Some(AUDIENCE.into()),
        },
    )
    .expect("token");
    // {"alg":"none","typ":"JWT"} . {"sub":"alice","aud":"cms-test"} . (no signature)
    let alg_none =
        "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSIsImF1ZCI6ImNtcy10ZXN0In0.";
    let expired = k.token_with("alice", Some(now - 120), None, AUDIENCE);
    let not_yet = k.token_with("alice", None, Some(now + 3600), AUDIENCE);
    let wrong_aud = k.token_with("alice", Some(now + 3600), None, "someone-else");
    let cases: Vec<(&str, Option<&str>)> = vec![
        ("expired", Some(&expired)),
        ("not yet valid", Some(&not_yet)),
        ("wrong signature", Some(&wrong_sig)),
        ("wrong algorithm (RS256)", Some(&wrong_alg)),
        ("alg none", Some(alg_none)),
        ("wrong audience", Some(&wrong_aud)),
        ("malformed", Some("not-a-jwt")),
        ("empty token", Some("")),
        ("no token", None),
    ];
    for (what, token) in &cases {
        expect_refused(addr, *token, what).await;
    }
    // An unsupported method is refused as well.
    let mut c = RawPulsarClient::open(addr).await;
    let mut cmd = connect_cmd(None);
    if let Some(cc) = cmd.connect.as_mut() {
        cc.auth_method_name = Some("tls".into());
    }
    c.send(cmd).await;
    let got = c.recv().await.expect("ERROR");
    assert_eq!(
        got.error.as_ref().map(|e| e.error),
        Some(ServerError::AuthenticationError as i32)
    );
    c.expect_closed("method tls").await;
    alive(&mut keeper, "the valid connection after the refusals").await;

    // The official client: only the valid token produces and consumes.
    let url = broker.service_url();
    let topic = "persistent://public/default/auth-py";
    let valid = k.token(SUPERUSER);
    // A refused client retries until its operation timeout, then fails.
    let run = |token: String| {
        let url = url.clone();
        async move {
            run_python(
                "auth_connect.py",
                &[
                    "--url",
                    &url,
                    "--topic",
                    topic,
                    "--token",
                    &token,
                    "--timeout-ms",
                    "3000",
                ],
                PYTHON_TIMEOUT_MS,
            )
            .await
        }
    };
    let ok = run(valid.clone()).await;
    alive(&mut keeper, "after the valid Python client").await;
    assert!(ok.ok, "valid token: {} {}", ok.json, ok.stderr);
    assert_eq!(ok.json["received"], "hello");
    for (what, token) in [
        ("expired", expired.clone()),
        ("wrong signature", wrong_sig.clone()),
        ("wrong audience", wrong_aud.clone()),
        ("no token", String::new()),
    ] {
        let r = run(token).await;
        alive(&mut keeper, what).await;
        assert!(!r.ok, "{what}: the Python client connected: {}", r.json);
        let e = r.json["error"].as_str().unwrap_or_default().to_string();
        assert!(
            !e.is_empty(),
            "{what}: no error: {} {} {}",
            r.status,
            r.json,
            r.stderr
        );
    }

    // The Rust SDK: `auth_token` connects and publishes; without it the
    // producer is refused.
    let sdk = cms_client::Client::builder(broker.service_url())
        .operation_timeout(Duration::from_secs(5))
        .auth_token(valid.clone())
        .build()
        .expect("sdk client");
    let producer = sdk
        .producer("persistent://public/default/auth-sdk")
        .create()
        .await
        .expect("SDK producer with a token");
    producer.send("hello").await.expect("SDK send");
    let anonymous = cms_client::Client::builder(broker.service_url())
        .operation_timeout(Duration::from_secs(3))
        .build()
        .expect("sdk client");
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        anonymous
            .producer("persistent://public/default/auth-sdk")
            .create(),
    )
    .await
    .expect("the SDK gave up within 30 s");
    assert!(refused.is_err(), "SDK producer without a token was created");
    alive(&mut keeper, "after the SDK clients").await;

    // Token refresh: a token expiring in 2 s is challenged; answering with
    // a fresh token keeps the connection, not answering closes it.
    let short = k.token_with("alice", Some(auth::now_s() + 2), None, AUDIENCE);
    let mut refreshed = connected_as(addr, &short).await;
    let mut silent = connected_as(addr, &short).await;
    let challenge = wait_for(&mut refreshed, Type::AuthChallenge, 15_000).await;
    assert_eq!(
        challenge
            .auth_challenge
            .as_ref()
            .and_then(|c| c.challenge.as_ref())
            .and_then(|c| c.auth_method_name.as_deref()),
        Some("token")
    );
    refreshed
        .send(BaseCommand {
            r#type: Type::AuthResponse as i32,
            auth_response: Some(CommandAuthResponse {
                client_version: Some("security-test".into()),
                response: Some(AuthData {
                    auth_method_name: Some("token".into()),
                    auth_data: Some(bytes::Bytes::from(k.token("alice").into_bytes())),
                }),
                protocol_version: Some(20),
            }),
            ..Default::default()
        })
        .await;
    // The silent one is challenged and closed within the refresh timeout
    // (2 s) plus a tick; meanwhile it answers the broker's keep-alive.
    wait_closed(&mut silent, 15_000).await;
    alive(&mut refreshed, "the refreshed connection").await;
    alive(&mut keeper, "the valid connection after the refresh").await;

    // Admin API: 401 without or with bad credentials, 200 with a valid one.
    let http = Http::new(broker.http());
    let (s, _) = http.call("GET", "/admin/v2/tenants", None, None).await;
    assert_eq!(s, 401);
    for bad in [expired.as_str(), wrong_sig.as_str(), alg_none, "garbage"] {
        let (s, _) = http.call("GET", "/admin/v2/tenants", None, Some(bad)).await;
        assert_eq!(s, 401, "bad admin token");
    }
    let (s, v) = http
        .call("GET", "/admin/v2/tenants", None, Some(&valid))
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, _) = http.call("GET", "/admin/v2/openapi.json", None, None).await;
    assert_eq!(s, 200, "openapi.json is public");
    // The HTTP lookup is authorized like LOOKUP.
    let (s, _) = http
        .call(
            "GET",
            "/lookup/v2/topic/persistent/public/default/auth-py",
            None,
            None,
        )
        .await;
    assert_eq!(s, 401);
    let (s, _) = http
        .call(
            "GET",
            "/lookup/v2/topic/persistent/public/default/auth-py",
            None,
            Some(&valid),
        )
        .await;
    assert_eq!(s, 200);
    // Tokens never reach the log.
    let log = std::fs::read_to_string(broker.process.log_path()).unwrap_or_default();
    for t in [&valid, &expired, &wrong_sig] {
        assert!(!log.contains(t.as_str()), "a token was logged");
    }
}

/// Reads (answering PINGs, sending our own to stay non-idle) until a
/// command of type `ty` arrives.
async fn wait_for(c: &mut RawPulsarClient, ty: Type, timeout_ms: u64) -> BaseCommand {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
    while tokio::time::Instant::now() < deadline {
        match c.recv_within(500).await {
            Some(Some(cmd)) if cmd.r#type == ty as i32 => return cmd,
            Some(Some(cmd)) if cmd.r#type == Type::Ping as i32 => {
                c.send(commands::pong()).await;
            }
            Some(Some(_)) => {}
            Some(None) => panic!("closed while waiting for {ty:?}"),
            None => c.send(commands::ping()).await,
        }
    }
    panic!("no {ty:?} within {timeout_ms} ms");
}

/// Reads (keeping the connection non-idle) until the broker closes it.
async fn wait_closed(c: &mut RawPulsarClient, timeout_ms: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
    while tokio::time::Instant::now() < deadline {
        match c.recv_within(500).await {
            Some(None) => return,
            Some(Some(cmd)) if cmd.r#type == Type::Ping as i32 => {
                c.send(commands::pong()).await;
            }
            Some(Some(_)) => {}
            None => c.send(commands::ping()).await,
        }
    }
    panic!("the broker did not close the unrefreshed connection within {timeout_ms} ms");
}

// ---------------------------------------------------------------- P1-15

const TENANT_A: &str = "ta";
const TENANT_B: &str = "tb";

/// The roles of the matrix (None = anonymous).
const ROLES: [Option<&str>; 6] = [
    Some(SUPERUSER),
    Some("ta-admin"),
    Some("ta-producer"),
    Some("ta-consumer"),
    Some("tb-admin"),
    None,
];

/// What a call needs: the one table both matrices are generated from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    Public,
    AnyRole,
    Superuser,
    TenantAdmin,
    Lookup,
    Produce,
    Consume,
    /// Listing a namespace's topics: any grant on the namespace.
    NamespaceGrant,
}

/// Whether `role` may do what `needs` on `tenant`'s resources.
fn allowed(role: Option<&str>, needs: Needs, tenant: &str) -> bool {
    let Some(role) = role else {
        return needs == Needs::Public;
    };
    if role == SUPERUSER {
        return true;
    }
    let admin_of = |t: &str| role == format!("{t}-admin");
    match needs {
        Needs::Public | Needs::AnyRole => true,
        Needs::Superuser => false,
        Needs::TenantAdmin => admin_of(tenant),
        Needs::Lookup | Needs::NamespaceGrant => {
            admin_of(tenant)
                || (tenant == TENANT_A && (role == "ta-producer" || role == "ta-consumer"))
        }
        Needs::Produce => admin_of(tenant) || (tenant == TENANT_A && role == "ta-producer"),
        Needs::Consume => admin_of(tenant) || (tenant == TENANT_A && role == "ta-consumer"),
    }
}

/// Every admin route and what it needs; a route missing here fails the test.
fn admin_table() -> HashMap<(&'static str, &'static str), Needs> {
    use Needs::*;
    let mut m = HashMap::new();
    for (method, path) in cms_broker::admin::ROUTE_LIST {
        let rest = path.trim_start_matches("/admin/v2/");
        let first = rest.split('/').next().unwrap_or_default();
        let last = rest.rsplit('/').next().unwrap_or_default();
        let needs = match (first, *method) {
            ("openapi.json", _) => Public,
            ("clusters", _) => AnyRole,
            ("brokers" | "bookies" | "ledgers", _) => Superuser,
            ("tenants", "GET") if rest.contains("{tenant}") => TenantAdmin,
            ("tenants", _) => Superuser,
            ("namespaces", "PUT") if last == "split" || last == "unload" => Superuser,
            ("namespaces" | "queues", _) => TenantAdmin,
            ("schemas", "GET") => Lookup,
            ("schemas", "POST") => Produce,
            ("schemas", _) => TenantAdmin,
            ("{domain}", m) => {
                let segs: Vec<&str> = rest.split('/').collect();
                if segs.len() <= 4 {
                    TenantAdmin
                } else if rest.contains("subscription") || (m == "GET" && last == "subscriptions") {
                    Consume
                } else if m == "GET" && last != "permissions" {
                    Lookup
                } else {
                    TenantAdmin
                }
            }
            _ => panic!("route {method} {path} is not in the authorization table"),
        };
        m.insert((*method, *path), needs);
    }
    m
}

/// A concrete path for `template` on `tenant`: harmless targets for
/// destructive calls (absent namespaces, topics, subscriptions, bookies).
fn instantiate(method: &str, template: &str, tenant: &str) -> (String, Option<String>) {
    let destructive = method == "DELETE";
    let mut out = String::new();
    for seg in template.split('/').filter(|s| !s.is_empty()) {
        let v = match seg {
            "{tenant}" => tenant.to_string(),
            "{namespace}" if destructive && template.ends_with("{namespace}") => "ns-absent".into(),
            "{namespace}" if method == "PUT" && template.ends_with("{namespace}") => {
                "ns-created".into()
            }
            "{namespace}" => "ns".into(),
            "{domain}" => "persistent".into(),
            "{topic}" | "{queue}" if destructive => "absent-topic".into(),
            "{topic}" | "{queue}" => "t1".into(),
            "{subscription}" if template.contains("/permissions/") => "sub-restricted".into(),
            "{subscription}" if destructive => "absent-sub".into(),
            "{subscription}" => "sub-admin".into(),
            "{role}" => "nobody".into(),
            // Not a bundle of the namespace: split / unload answer 404.
            "{bundle}" => "0x00000000_0x00000010".into(),
            "{policy}" => "messageTTL".into(),
            "{cluster}" => "standalone".into(),
            "{bookie}" => "absent-bookie:1".into(),
            "{ledger}" => "1".into(),
            "{version}" => "0".into(),
            "{timestamp}" => "0".into(),
            "{count}" | "{seconds}" | "{position}" => "1".into(),
            other if other.starts_with('{') => panic!("unknown path parameter {other}"),
            other => other.to_string(),
        };
        out.push('/');
        out.push_str(&v);
    }
    let body = match method {
        "POST" | "PUT" => Some(if template.ends_with("/permissions/{role}") {
            r#"["produce"]"#.to_string()
        } else if template.contains("/permissions/subscription/") {
            r#"["nobody"]"#.to_string()
        } else if template == "/admin/v2/tenants/{tenant}" {
            json!({"adminRoles": [format!("{tenant}-admin")], "allowedClusters": ["standalone"]})
                .to_string()
        } else if template.ends_with("/{policy}") {
            "60".to_string()
        } else if template.ends_with("/schema") {
            json!({"type": "STRING", "schema": "", "properties": {}}).to_string()
        } else if template.ends_with("/partitions") {
            "2".to_string()
        } else if template.ends_with("/readonly") {
            "true".to_string()
        } else if template.ends_with("/resetcursor") {
            json!({"ledgerId": 0, "entryId": 0}).to_string()
        } else {
            String::new()
        }),
        _ => None,
    };
    (out, body.filter(|b| !b.is_empty()))
}

/// The data commands of the matrix.
#[derive(Debug, Clone, Copy)]
enum DataCmd {
    Lookup,
    PartitionedMetadata,
    Producer,
    Subscribe,
    GetTopicsOfNamespace,
}

impl DataCmd {
    const ALL: [DataCmd; 5] = [
        DataCmd::Lookup,
        DataCmd::PartitionedMetadata,
        DataCmd::Producer,
        DataCmd::Subscribe,
        DataCmd::GetTopicsOfNamespace,
    ];

    fn needs(self) -> Needs {
        match self {
            DataCmd::Lookup | DataCmd::PartitionedMetadata => Needs::Lookup,
            DataCmd::Producer => Needs::Produce,
            DataCmd::Subscribe => Needs::Consume,
            DataCmd::GetTopicsOfNamespace => Needs::NamespaceGrant,
        }
    }
}

/// Runs `cmd` on `tenant`'s topic: Ok(()) when served, Err(code) when refused.
async fn data_call(c: &mut RawPulsarClient, cmd: DataCmd, tenant: &str, n: u64) -> Result<(), i32> {
    let topic = format!("persistent://{tenant}/ns/t1");
    let req = 1000 + n;
    let send = match cmd {
        DataCmd::Lookup => commands::lookup(&topic, req, false),
        DataCmd::PartitionedMetadata => commands::partitioned_metadata(&topic, req),
        DataCmd::Producer => commands::producer(&topic, n, req, None),
        DataCmd::Subscribe => commands::subscribe(
            &topic,
            &format!("sub-{n}"),
            SubType::Shared,
            n,
            req,
            InitialPosition::Latest,
        ),
        DataCmd::GetTopicsOfNamespace => BaseCommand {
            r#type: Type::GetTopicsOfNamespace as i32,
            get_topics_of_namespace: Some(CommandGetTopicsOfNamespace {
                request_id: req,
                namespace: format!("{tenant}/ns"),
                ..Default::default()
            }),
            ..Default::default()
        },
    };
    c.send(send).await;
    loop {
        let got = c.recv().await.expect("connection closed by a data command");
        if let Some(e) = &got.error {
            return Err(e.error);
        }
        if let Some(l) = &got.lookup_topic_response {
            return match LookupType::try_from(l.response.unwrap_or(0)) {
                Ok(LookupType::Failed) => Err(l.error.unwrap_or(-1)),
                _ => Ok(()),
            };
        }
        if let Some(p) = &got.partition_metadata_response {
            return match PmLookupType::try_from(p.response.unwrap_or(0)) {
                Ok(PmLookupType::Failed) => Err(p.error.unwrap_or(-1)),
                _ => Ok(()),
            };
        }
        if let Ok(Type::ProducerSuccess | Type::Success | Type::GetTopicsOfNamespaceResponse) =
            Type::try_from(got.r#type)
        {
            return Ok(());
        }
    }
}

async fn setup_tenants(http: &Http, su: &str) {
    for t in [TENANT_A, TENANT_B] {
        let info = json!({"adminRoles": [format!("{t}-admin")], "allowedClusters": ["standalone"]});
        http.ok(
            "PUT",
            &format!("/admin/v2/tenants/{t}"),
            Some(&info.to_string()),
            su,
        )
        .await;
        http.ok("PUT", &format!("/admin/v2/namespaces/{t}/ns"), None, su)
            .await;
        http.ok("PUT", &format!("/admin/v2/persistent/{t}/ns/t1"), None, su)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_matrix() {
    let k = keys();
    let broker = start_broker(&k, &[]).await;
    let http = Http::new(broker.http());
    let su = k.token(SUPERUSER);
    setup_tenants(&http, &su).await;
    let ta_admin = k.token("ta-admin");
    // Grants by the tenant admin, through the permissions API (Pulsar's shapes).
    http.ok(
        "POST",
        "/admin/v2/namespaces/ta/ns/permissions/ta-producer",
        Some(r#"["produce"]"#),
        &ta_admin,
    )
    .await;
    http.ok(
        "POST",
        "/admin/v2/namespaces/ta/ns/permissions/ta-consumer",
        Some(r#"["consume"]"#),
        &ta_admin,
    )
    .await;
    let (s, v) = http
        .call(
            "GET",
            "/admin/v2/namespaces/ta/ns/permissions",
            None,
            Some(&ta_admin),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        v,
        json!({"ta-consumer": ["consume"], "ta-producer": ["produce"]})
    );
    // Bad actions are 400.
    let (s, _) = http
        .call(
            "POST",
            "/admin/v2/namespaces/ta/ns/permissions/x",
            Some(r#"["fly"]"#),
            Some(&ta_admin),
        )
        .await;
    assert_eq!(s, 400);

    // Data commands × roles × tenants.
    let mut n = 0;
    let mut failures = Vec::new();
    for role in ROLES {
        for tenant in [TENANT_A, TENANT_B] {
            for cmd in DataCmd::ALL {
                n += 1;
                let expect = allowed(role, cmd.needs(), tenant);
                let Some(r) = role else {
                    // Anonymous: refused at CONNECT (authentication matrix);
                    // no command is reachable at all.
                    continue;
                };
                let mut c = connected_as(broker.pulsar(), &k.token(r)).await;
                let got = data_call(&mut c, cmd, tenant, n).await;
                let ok = match (&got, expect) {
                    (Ok(()), true) => true,
                    (Err(code), false) => *code == ServerError::AuthorizationError as i32,
                    _ => false,
                };
                if !ok {
                    failures.push(format!(
                        "{cmd:?} as {r} on {tenant}: expected allowed={expect}, got {got:?}"
                    ));
                }
            }
        }
    }
    let mut anon = RawPulsarClient::open(broker.pulsar()).await;
    anon.send(connect_cmd(None)).await;
    let got = anon.recv().await.expect("ERROR");
    assert!(got.error.is_some(), "anonymous CONNECT accepted: {got:?}");

    // Subscription restriction: ta-consumer may not use a subscription
    // restricted to another role; the listed role may.
    http.ok(
        "POST",
        "/admin/v2/namespaces/ta/ns/permissions/subscription/locked",
        Some(r#"["someone-else"]"#),
        &ta_admin,
    )
    .await;
    let mut c = connected_as(broker.pulsar(), &k.token("ta-consumer")).await;
    c.send(commands::subscribe(
        "persistent://ta/ns/t1",
        "locked",
        SubType::Shared,
        900,
        900,
        InitialPosition::Latest,
    ))
    .await;
    let got = c.recv().await.expect("answer");
    assert_eq!(
        got.error.as_ref().map(|e| e.error),
        Some(ServerError::AuthorizationError as i32),
        "{got:?}"
    );
    // Pulsar's revoke path (`…/permissions/{subscription}/{role}`): the
    // last listed role revoked, the subscription is no longer restricted.
    http.ok(
        "DELETE",
        "/admin/v2/namespaces/ta/ns/permissions/locked/someone-else",
        None,
        &ta_admin,
    )
    .await;
    let (s, v) = http
        .call("GET", "/admin/v2/namespaces/ta/ns", None, Some(&su))
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(
        v["auth_policies"]["subscription_auth_roles"]
            .get("locked")
            .is_none(),
        "restriction still stored: {v}"
    );
    c.send(commands::subscribe(
        "persistent://ta/ns/t1",
        "locked",
        SubType::Shared,
        904,
        904,
        InitialPosition::Latest,
    ))
    .await;
    let got = c.recv().await.expect("answer");
    assert!(got.success.is_some(), "after the revoke: {got:?}");
    // A topic-level grant: tb-user may consume tb/ns/t1 only.
    http.ok(
        "POST",
        "/admin/v2/persistent/tb/ns/t1/permissions/tb-user",
        Some(r#"["consume"]"#),
        &k.token("tb-admin"),
    )
    .await;
    let (s, v) = http
        .call(
            "GET",
            "/admin/v2/persistent/tb/ns/t1/permissions",
            None,
            Some(&su),
        )
        .await;
    assert_eq!((s, v), (200, json!({"tb-user": ["consume"]})));
    let mut c = connected_as(broker.pulsar(), &k.token("tb-user")).await;
    assert_eq!(
        data_call(&mut c, DataCmd::Subscribe, TENANT_B, 901).await,
        Ok(())
    );
    assert_eq!(
        data_call(&mut c, DataCmd::Producer, TENANT_B, 902).await,
        Err(ServerError::AuthorizationError as i32)
    );
    // Revoked: refused again, on the same connection (checked per command).
    http.ok(
        "DELETE",
        "/admin/v2/persistent/tb/ns/t1/permissions/tb-user",
        None,
        &k.token("tb-admin"),
    )
    .await;
    assert_eq!(
        data_call(&mut c, DataCmd::Lookup, TENANT_B, 903).await,
        Err(ServerError::AuthorizationError as i32)
    );

    // Admin routes × roles × tenants, from ROUTE_LIST.
    let table = admin_table();
    let tokens: Vec<(Option<&str>, Option<String>)> =
        ROLES.iter().map(|r| (*r, r.map(|r| k.token(r)))).collect();
    // Superuser last, so its successful writes cannot change other cells.
    let order: Vec<usize> = vec![5, 4, 3, 2, 1, 0];
    let mut cells = 0;
    for (method, template) in cms_broker::admin::ROUTE_LIST {
        let needs = table[&(*method, *template)];
        let tenants: &[&str] = if template.contains("{tenant}") {
            &[TENANT_A, TENANT_B]
        } else {
            &[TENANT_A]
        };
        for tenant in tenants {
            let (path, body) = instantiate(method, template, tenant);
            for &i in &order {
                let (role, token) = &tokens[i];
                let expect = allowed(*role, needs, tenant);
                let (status, v) = http
                    .call(method, &path, body.as_deref(), token.as_deref())
                    .await;
                cells += 1;
                let denied = status == 401 || status == 403;
                let right_code = match role {
                    None => status == 401,
                    Some(_) => status == 403,
                };
                if expect == denied || (denied && !right_code) {
                    failures.push(format!(
                        "{method} {path} as {role:?}: expected allowed={expect}, got {status} {v}"
                    ));
                }
            }
        }
    }
    assert!(cells > 500, "only {cells} admin cells");
    assert!(
        failures.is_empty(),
        "{} wrong cells:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------- TLS

use cms_tests::tls::pki;

/// Whether a TLS handshake with `addr` succeeds trusting only `ca_pem`.
async fn tls_handshake_ok(addr: SocketAddr, ca_pem: &str) -> bool {
    use rustls_pki_types::pem::PemObject;
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("ca pem")).expect("add root");
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("tcp");
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
    matches!(
        tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp)).await,
        Ok(Ok(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_ports_trust_and_reload() {
    let k = keys();
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca_file, cert_file, key_file) = (
        dir.path().join("ca.pem"),
        dir.path().join("cert.pem"),
        dir.path().join("key.pem"),
    );
    let one = pki("ca-one");
    std::fs::write(&ca_file, &one.ca_pem).expect("write");
    std::fs::write(&cert_file, &one.cert_pem).expect("write");
    std::fs::write(&key_file, &one.key_pem).expect("write");
    let other_ca = dir.path().join("other-ca.pem");
    let two = pki("ca-two");
    std::fs::write(&other_ca, &two.ca_pem).expect("write");

    let key = format!("--auth-secret-key={}", k.secret_path);
    let aud = format!("--auth-audience={AUDIENCE}");
    let su = format!("--superuser-roles={SUPERUSER}");
    let cert = format!("--tls-cert-file={}", cert_file.display());
    let tkey = format!("--tls-key-file={}", key_file.display());
    // As `BrokerNode::standalone_builder`, but with the plaintext Pulsar
    // port off: only pulsar+ssl:// serves.
    let mut process = cms_tests::harness::process::ProcessBuilder::new("cms-broker")
        .name("standalone-tls")
        .port("pulsar")
        .port("http")
        .port("tls")
        .port("https")
        .arg("standalone")
        .arg("--data-dir={dir}/data")
        .arg("--broker-bind=")
        .arg("--http-bind=127.0.0.1:{port:http}")
        .arg("--standalone-disk-usage-threshold=0.999")
        .args([
            key.as_str(),
            aud.as_str(),
            su.as_str(),
            cert.as_str(),
            tkey.as_str(),
            "--broker-tls-bind=127.0.0.1:{port:tls}",
            "--https-bind=127.0.0.1:{port:https}",
            "--tls-reload-interval-ms=200",
        ])
        .spawn();
    let http = process.addr("http");
    process.wait_ready(http).await;
    let broker = BrokerNode { process };
    let tls_addr = broker.process.addr("tls");
    let https_addr = broker.process.addr("https");
    let token = k.token(SUPERUSER);

    // The official client over pulsar+ssl:// with the CA: token + TLS work.
    let url = format!("pulsar+ssl://127.0.0.1:{}", tls_addr.port());
    let run = |ca: String| {
        let url = url.clone();
        let token = token.clone();
        async move {
            run_python(
                "auth_connect.py",
                &[
                    "--url",
                    &url,
                    "--topic",
                    "persistent://public/default/tls-py",
                    "--token",
                    &token,
                    "--tls-trust-certs-file",
                    &ca,
                    "--timeout-ms",
                    "3000",
                ],
                PYTHON_TIMEOUT_MS,
            )
            .await
        }
    };
    let ok = run(ca_file.display().to_string()).await;
    assert!(ok.ok, "trusted CA: {} {}", ok.json, ok.stderr);
    assert_eq!(ok.json["received"], "hello");
    let bad = run(other_ca.display().to_string()).await;
    assert!(!bad.ok, "untrusted CA connected: {}", bad.json);

    // Plaintext Pulsar to the TLS port: no CONNECTED, the connection closes.
    let mut plain = RawPulsarClient::open(tls_addr).await;
    plain.send(connect_cmd(Some(&token))).await;
    match plain.recv_within(15_000).await {
        Some(None) => {}
        other => panic!("plaintext to the TLS port: expected a close, got {other:?}"),
    }

    // The plaintext Pulsar port is off.
    assert!(
        tokio::net::TcpStream::connect(broker.pulsar())
            .await
            .is_err(),
        "the plaintext Pulsar port answers although --broker-bind is empty"
    );

    // HTTPS admin API with the CA.
    let https = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(one.ca_pem.as_bytes()).expect("ca")])
        .timeout(Duration::from_millis(HTTP_TIMEOUT_MS))
        .build()
        .expect("https client");
    let resp = https
        .get(format!(
            "https://127.0.0.1:{}/admin/v2/tenants",
            https_addr.port()
        ))
        .bearer_auth(&token)
        .send()
        .await
        .expect("https request");
    assert_eq!(resp.status().as_u16(), 200);

    // Reload: a certificate from the second CA, served without a restart.
    assert!(tls_handshake_ok(tls_addr, &one.ca_pem).await);
    assert!(!tls_handshake_ok(tls_addr, &two.ca_pem).await);
    std::fs::write(&key_file, &two.key_pem).expect("write");
    std::fs::write(&cert_file, &two.cert_pem).expect("write");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if tls_handshake_ok(tls_addr, &two.ca_pem).await
            && tls_handshake_ok(https_addr, &two.ca_pem).await
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was not served within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!tls_handshake_ok(tls_addr, &one.ca_pem).await);
    assert_eq!(broker.process.starts(), 1, "the broker restarted");
}
