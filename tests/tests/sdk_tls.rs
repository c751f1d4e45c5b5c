//! TLS for clients (issues 12 and 13): the Rust SDK on `pulsar+ssl://`
//! against real brokers.
//! - standalone with token authentication and only the TLS Pulsar port:
//!   a trusted CA connects, produces and consumes with a token; an
//!   untrusted CA and a certificate that does not name the host are clear
//!   `Error::Tls` refusals (not hangs, not retried); hostname validation
//!   off or `tls_allow_insecure_connection` connect;
//! - cluster mode, two brokers with TLS: LOOKUP redirects carry the
//!   owner's `brokerServiceUrlTls`, the official Python client and the SDK
//!   on the non-owner's `pulsar+ssl://` port are redirected and publish /
//!   consume over TLS, and admin 307s point at the owner's `https://` URL
//!   when the request came over HTTPS.

use std::time::Duration;

use cms_broker::auth::{self, Claims, SigningKey};
use cms_client::proto::commands;
use cms_client::proto::pulsar::command_lookup_topic_response::LookupType;
use cms_client::{Client, Error, InitialPosition};
use cms_tests::cluster::{
    BrokerNode, PYTHON_TIMEOUT_MS, ROOT, RawPulsarClient, init_store, run_python, start_bookies,
};
use cms_tests::harness::process::ProcessBuilder;
use cms_tests::harness::zookeeper::ZooKeeper;
use cms_tests::tls::{pki, pki_for};

/// Longest a refused client may take to fail.
const REFUSAL_DEADLINE: Duration = Duration::from_secs(20);

/// Produces `text` on a topic of its own (`<topic>-<text>`) and receives
/// it back with `client`.
async fn round_trip(client: &Client, topic: &str, text: &str) {
    let topic = format!("{topic}-{text}");
    let topic = topic.as_str();
    let mut consumer = tokio::time::timeout(
        Duration::from_secs(30),
        client
            .consumer(topic, "tls-sub")
            .initial_position(InitialPosition::Earliest)
            .subscribe(),
    )
    .await
    .expect("subscribe within 30 s")
    .unwrap_or_else(|e| panic!("subscribe on {topic}: {e}"));
    let producer = client
        .producer(topic)
        .create()
        .await
        .unwrap_or_else(|e| panic!("producer on {topic}: {e}"));
    producer
        .send(text.as_bytes().to_vec())
        .await
        .unwrap_or_else(|e| panic!("send on {topic}: {e}"));
    let m = tokio::time::timeout(Duration::from_secs(20), consumer.receive())
        .await
        .expect("no message within 20 s")
        .expect("receive");
    assert_eq!(&m.payload[..], text.as_bytes());
    consumer.ack(&m.id).await.expect("ack");
}

/// A producer on `topic` must fail with `Error::Tls`, promptly.
async fn refused(client: Result<Client, Error>, topic: &str, what: &str) -> String {
    let client = client.unwrap_or_else(|e| panic!("{what}: build: {e}"));
    let r = tokio::time::timeout(REFUSAL_DEADLINE, client.producer(topic).create())
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {REFUSAL_DEADLINE:?} (a hang)"));
    match r {
        Err(e @ Error::Tls { .. }) => e.to_string(),
        Err(other) => panic!("{what}: expected a TLS error, got {other}"),
        Ok(_) => panic!("{what}: connected"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_tls_trust_hostname_and_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The certificate names only `localhost`; the broker advertises it.
    let good = pki_for("sdk-ca", &["localhost"]).write(dir.path(), "good");
    let other = pki("other-ca").write(dir.path(), "other");
    let secret = auth::new_secret_key();
    let secret_file = dir.path().join("secret.key");
    std::fs::write(&secret_file, &secret).expect("write key");
    let token = auth::create_token(
        &SigningKey::Secret(secret),
        &Claims {
            sub: "admin".into(),
            exp: Some(auth::now_s() + 3600),
            nbf: None,
            aud: None,
        },
    )
    .expect("token");

    let mut process = ProcessBuilder::new("cms-broker")
        .name("standalone-sdk-tls")
        .port("http")
        .port("tls")
        .arg("standalone")
        .arg("--data-dir={dir}/data")
        .arg("--broker-bind=")
        .arg("--http-bind=127.0.0.1:{port:http}")
        .arg("--broker-tls-bind=127.0.0.1:{port:tls}")
        .arg("--advertised-address=localhost")
        .arg("--standalone-disk-usage-threshold=0.999")
        .arg(format!("--auth-secret-key={}", secret_file.display()))
        .arg("--superuser-roles=admin")
        .arg(format!("--tls-cert-file={}", good.cert.display()))
        .arg(format!("--tls-key-file={}", good.key.display()))
        .spawn();
    let http = process.addr("http");
    process.wait_ready(http).await;
    let port = process.addr("tls").port();
    let by_name = format!("pulsar+ssl://localhost:{port}");
    let by_ip = format!("pulsar+ssl://127.0.0.1:{port}");
    let topic = "persistent://public/default/sdk-tls";
    let builder = |url: &str| {
        Client::builder(url)
            .operation_timeout(Duration::from_secs(10))
            .connection_timeout(Duration::from_secs(5))
            .auth_token(token.clone())
    };

    // Trusted CA, name validated, token over TLS: publish and consume.
    let ok = builder(&by_name)
        .tls_trust_certs_file(&good.ca)
        .build()
        .expect("client");
    round_trip(&ok, topic, "over-tls").await;

    // An untrusted CA: refused with the reason.
    let e = refused(
        builder(&by_name).tls_trust_certs_file(&other.ca).build(),
        topic,
        "untrusted CA",
    )
    .await;
    assert!(e.contains("UnknownIssuer"), "{e}");

    // The certificate does not name 127.0.0.1: refused while validating...
    let e = refused(
        builder(&by_ip).tls_trust_certs_file(&good.ca).build(),
        topic,
        "hostname mismatch",
    )
    .await;
    assert!(e.contains("not valid for name"), "{e}");
    // ...and accepted with validation off (the chain is still checked).
    let no_name = builder(&by_ip)
        .tls_trust_certs_file(&good.ca)
        .tls_validate_hostname(false)
        .build()
        .expect("client");
    round_trip(&no_name, topic, "no-hostname-check").await;
    refused(
        builder(&by_ip)
            .tls_trust_certs_file(&other.ca)
            .tls_validate_hostname(false)
            .build(),
        topic,
        "untrusted CA without hostname validation",
    )
    .await;

    // Insecure: any certificate.
    let insecure = builder(&by_ip)
        .tls_allow_insecure_connection(true)
        .build()
        .expect("client");
    round_trip(&insecure, topic, "insecure").await;

    // TLS without a token: authenticated refusal, over TLS.
    let anon = Client::builder(&by_name)
        .operation_timeout(Duration::from_secs(10))
        .tls_trust_certs_file(&good.ca)
        .build()
        .expect("client");
    match tokio::time::timeout(REFUSAL_DEADLINE, anon.producer(topic).create()).await {
        Ok(Err(Error::Server { code, .. })) => {
            assert_eq!(code, cms_client::ServerError::AuthenticationError)
        }
        other => panic!("no token over TLS: {other:?}"),
    }

    // cms-perf takes the same options: trusted CA + token publishes; an
    // untrusted CA exits non-zero with the TLS reason.
    let perf = cms_tests::harness::bins::find("cms-perf").expect("cms-perf binary");
    let run_perf = |ca: std::path::PathBuf| {
        let mut cmd = tokio::process::Command::new(&perf);
        cmd.args([
            "produce",
            "--service-url",
            &by_name,
            "--topic",
            "persistent://public/default/sdk-tls-perf",
            "--size",
            "128",
            "--messages",
            "50",
            "--json",
            "--auth-token",
            &token,
        ])
        .arg("--tls-trust-cert")
        .arg(ca)
        .kill_on_drop(true);
        async move {
            tokio::time::timeout(Duration::from_secs(60), cmd.output())
                .await
                .expect("cms-perf finished within 60 s")
                .expect("cms-perf ran")
        }
    };
    let out = run_perf(good.ca.clone()).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cms-perf over TLS: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("cms-perf JSON");
    assert_eq!(v["msgs"], 50, "{v}");
    let out = run_perf(other.ca.clone()).await;
    assert!(
        !out.status.success(),
        "cms-perf with an untrusted CA succeeded"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");

    // A plaintext client on the TLS port fails rather than hangs.
    let plain = Client::builder(format!("pulsar://127.0.0.1:{port}"))
        .operation_timeout(Duration::from_secs(5))
        .auth_token(token.clone())
        .build()
        .expect("client");
    let r = tokio::time::timeout(REFUSAL_DEADLINE, plain.producer(topic).create()).await;
    assert!(matches!(r, Ok(Err(_))), "plaintext on the TLS port: {r:?}");
    assert_eq!(process.starts(), 1);
}

/// Cluster mode: two TLS brokers, redirects over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_lookup_redirects_in_cluster_mode() {
    let zk = ZooKeeper::start().await;
    let zks = zk.connect_string();
    let store = init_store(&zks).await;
    let layout = cms_bookie::metadata::layout::Layout::new(ROOT).expect("layout");
    cms_broker::tenancy::init_cluster(&*store, &layout, "test")
        .await
        .expect("init-cluster");
    store.close().await;
    let _bookies = start_bookies(&zks, 3).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let files = pki("cluster-ca").write(dir.path(), "cluster");
    let cert = format!("--tls-cert-file={}", files.cert.display());
    let key = format!("--tls-key-file={}", files.key.display());
    let mut brokers = Vec::new();
    for name in ["tls-b1", "tls-b2"] {
        let mut process = BrokerNode::cluster_builder(name, &zks, &[])
            .port("tls")
            .port("https")
            .arg("--broker-tls-bind=127.0.0.1:{port:tls}")
            .arg("--https-bind=127.0.0.1:{port:https}")
            .arg(cert.as_str())
            .arg(key.as_str())
            .spawn();
        let http = process.addr("http");
        process.wait_ready(http).await;
        brokers.push(BrokerNode { process });
    }
    let topic = "persistent://public/default/tls-redirect";

    // Place the bundle (first lookup), then find the owner: it answers
    // Connect, the other redirects with both URLs of the owner.
    let mut answers = Vec::new();
    for (i, b) in brokers.iter().enumerate() {
        let mut c = RawPulsarClient::connected(b.pulsar()).await;
        c.send(commands::lookup(topic, 1, false)).await;
        let r = c.recv().await.expect("lookup answer");
        let r = r.lookup_topic_response.expect("LOOKUP_RESPONSE");
        answers.push((i, r));
    }
    let (mut owner, mut other) = (None, None);
    for (i, r) in &answers {
        match r.response.and_then(|t| LookupType::try_from(t).ok()) {
            Some(LookupType::Connect) => owner = Some(*i),
            Some(LookupType::Redirect) => other = Some((*i, r.clone())),
            x => panic!("lookup on broker {i}: {x:?} {r:?}"),
        }
    }
    let owner = owner.expect("one broker owns the topic");
    let (other, redirect) = other.expect("the other broker redirects");
    let owner_tls = brokers[owner].process.addr("tls").port();
    assert_eq!(
        redirect.broker_service_url_tls.as_deref(),
        Some(format!("pulsar+ssl://127.0.0.1:{owner_tls}").as_str()),
        "{redirect:?}"
    );
    assert_eq!(
        redirect.broker_service_url.as_deref(),
        Some(brokers[owner].service_url().as_str())
    );

    // The official client on the non-owner's TLS port: redirected, over TLS.
    let other_tls = brokers[other].process.addr("tls").port();
    let url = format!("pulsar+ssl://127.0.0.1:{other_tls}");
    let ca = files.ca.display().to_string();
    let run = run_python(
        "auth_connect.py",
        &[
            "--url",
            &url,
            "--topic",
            topic,
            "--tls-trust-certs-file",
            &ca,
            "--timeout-ms",
            "10000",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "python over TLS: {} {}", run.json, run.stderr);
    assert_eq!(run.json["received"], "hello");

    // The SDK, too.
    let client = Client::builder(&url)
        .operation_timeout(Duration::from_secs(15))
        .tls_trust_certs_file(&files.ca)
        .build()
        .expect("client");
    round_trip(&client, topic, "sdk-redirected").await;

    // Admin 307: https:// of the owner over HTTPS, http:// over HTTP.
    let path = "/admin/v2/persistent/public/default/tls-redirect/stats";
    let https = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .tls_certs_only([reqwest::Certificate::from_pem(
            std::fs::read(&files.ca).expect("ca").as_slice(),
        )
        .expect("ca")])
        .timeout(Duration::from_secs(30))
        .build()
        .expect("https client");
    let other_https = brokers[other].process.addr("https").port();
    let resp = https
        .get(format!("https://127.0.0.1:{other_https}{path}"))
        .send()
        .await
        .expect("https request");
    assert_eq!(resp.status().as_u16(), 307);
    let owner_https = brokers[owner].process.addr("https").port();
    assert_eq!(
        resp.headers()["location"].to_str().expect("location"),
        format!("https://127.0.0.1:{owner_https}{path}")
    );
    let resp = https
        .get(format!("http://{}{path}", brokers[other].http()))
        .send()
        .await
        .expect("http request");
    assert_eq!(resp.status().as_u16(), 307);
    assert_eq!(
        resp.headers()["location"].to_str().expect("location"),
        format!("http://{}{path}", brokers[owner].http())
    );
}
