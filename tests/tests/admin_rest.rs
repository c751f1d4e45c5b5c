//! The admin REST API (`/admin/v2`) over HTTP against `cms-broker
//! standalone` (and two cluster-mode brokers): good and bad input for every
//! endpoint, JSON `{"reason": ...}` on every error, policies stored through
//! one broker seen and enforced by another, topics and subscriptions driven
//! with the official Python client producing and consuming.

use std::net::SocketAddr;
use std::time::Duration;

use cms_tests::cluster::{BrokerNode, PYTHON_TIMEOUT_MS, run_python, start_bookies};
use cms_tests::harness::zookeeper::ZooKeeper;
use serde_json::{Value, json};

/// Bound on one admin request, in milliseconds (a topic load or a bookie's
/// read-only switch included).
const ADMIN_REQUEST_TIMEOUT_MS: u64 = 40_000;

struct Admin {
    client: reqwest::Client,
    addr: SocketAddr,
}

impl Admin {
    fn new(addr: SocketAddr) -> Admin {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_millis(ADMIN_REQUEST_TIMEOUT_MS))
            .build()
            .expect("http client");
        Admin { client, addr }
    }

    /// `method path` with an optional raw body: (status, JSON body or Null).
    /// Every error answer must be JSON with a non-empty `reason`.
    async fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let url = format!("http://{}{path}", self.addr);
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut r = self.client.request(m, &url);
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
        let text = resp.text().await.expect("body");
        let v = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{method} {path} answered non-JSON {text:?}: {e}"))
        };
        if status >= 400 {
            assert!(
                v["reason"].as_str().is_some_and(|r| !r.is_empty()),
                "{method} {path}: error {status} without a reason: {text}"
            );
        }
        (status, v)
    }

    async fn ok(&self, method: &str, path: &str, body: Option<&str>) -> Value {
        let (status, v) = self.call(method, path, body).await;
        assert!(
            (200..300).contains(&status),
            "{method} {path} {body:?}: {status} {v}"
        );
        v
    }

    async fn status(&self, method: &str, path: &str, body: Option<&str>) -> u16 {
        self.call(method, path, body).await.0
    }

    async fn get(&self, path: &str) -> Value {
        self.ok("GET", path, None).await
    }
}

/// A peek: status, payload as text, `X-Pulsar-Message-ID`.
async fn peek(a: &Admin, path: &str) -> (u16, String, String) {
    let resp = a
        .client
        .get(format!("http://{}{path}", a.addr))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = resp.status().as_u16();
    let id = resp
        .headers()
        .get("X-Pulsar-Message-ID")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = resp.text().await.expect("body");
    if status >= 400 {
        let v: Value = serde_json::from_str(&body).expect("JSON error");
        assert!(v["reason"].is_string(), "{body}");
    }
    (status, body, id)
}

/// The value of the sample of metric `name` whose labels include every
/// `key="value"` of `labels`, from the broker's `/metrics`.
async fn sample(a: &Admin, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let text = a
        .client
        .get(format!("http://{}/metrics", a.addr))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.trim().parse().ok())
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_namespaces_and_policies_with_good_and_bad_input() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let a = Admin::new(broker.http());

    // Skeleton: unknown path and method answer JSON; the OpenAPI file is served.
    assert_eq!(
        a.status("GET", "/admin/v2/nope/a/b/c/d/e/f", None).await,
        404
    );
    assert_eq!(a.status("PATCH", "/admin/v2/tenants/x", None).await, 405);
    let doc = a.get("/admin/v2/openapi.json").await;
    assert!(doc["paths"]["/admin/v2/tenants/{tenant}"]["put"].is_object());

    // Clusters, brokers, bookies.
    let clusters = strings(&a.get("/admin/v2/clusters").await);
    assert_eq!(clusters.len(), 1, "{clusters:?}");
    let c = &clusters[0];
    let data = a.get(&format!("/admin/v2/clusters/{c}")).await;
    assert!(
        data["brokerServiceUrl"]
            .as_str()
            .unwrap()
            .starts_with("pulsar://")
    );
    assert_eq!(a.status("GET", "/admin/v2/clusters/other", None).await, 404);
    assert_eq!(
        a.status("GET", "/admin/v2/clusters/bad%20name", None).await,
        400
    );
    assert_eq!(
        a.get("/admin/v2/brokers").await.as_array().unwrap().len(),
        1
    );
    assert_eq!(a.get("/admin/v2/brokers/health").await, json!("ok"));
    let bookies = a.get("/admin/v2/bookies").await;
    assert_eq!(bookies[0]["state"], "available", "{bookies}");

    // Tenants.
    assert!(strings(&a.get("/admin/v2/tenants").await).contains(&"public".to_string()));
    a.ok(
        "PUT",
        "/admin/v2/tenants/acme",
        Some(r#"{"adminRoles":["ops"]}"#),
    )
    .await;
    assert_eq!(a.status("PUT", "/admin/v2/tenants/acme", None).await, 409);
    let t = a.get("/admin/v2/tenants/acme").await;
    assert_eq!(t["adminRoles"], json!(["ops"]));
    assert_eq!(t["allowedClusters"], json!([c]));
    a.ok(
        "POST",
        "/admin/v2/tenants/acme",
        Some(&format!(
            r#"{{"adminRoles":["a","b"],"allowedClusters":["{c}"]}}"#
        )),
    )
    .await;
    assert_eq!(
        a.get("/admin/v2/tenants/acme").await["adminRoles"],
        json!(["a", "b"])
    );
    assert_eq!(
        a.status("POST", "/admin/v2/tenants/ghost", Some("{}"))
            .await,
        404
    );
    assert_eq!(a.status("GET", "/admin/v2/tenants/ghost", None).await, 404);
    assert_eq!(
        a.status("PUT", "/admin/v2/tenants/t2", Some("{not json"))
            .await,
        400
    );
    assert_eq!(
        a.status("PUT", "/admin/v2/tenants/t2", Some(r#"{"adminRoles":"x"}"#))
            .await,
        400
    );
    assert_eq!(
        a.status(
            "PUT",
            "/admin/v2/tenants/t2",
            Some(r#"{"allowedClusters":["mars"]}"#)
        )
        .await,
        412
    );
    assert_eq!(a.status("PUT", "/admin/v2/tenants/a%20b", None).await, 400);
    assert_eq!(a.status("PUT", "/admin/v2/tenants/a%2Fb", None).await, 400);
    let long = "x".repeat(300);
    assert_eq!(
        a.status("PUT", &format!("/admin/v2/tenants/{long}"), None)
            .await,
        400
    );
    let huge = format!(r#"{{"adminRoles":["{}"]}}"#, "r".repeat(100_000));
    assert_eq!(
        a.status("PUT", "/admin/v2/tenants/t2", Some(&huge)).await,
        400
    );
    assert_eq!(a.status("GET", "/admin/v2/tenants/t2", None).await, 404);

    // Namespaces.
    assert_eq!(
        a.status("PUT", "/admin/v2/namespaces/ghost/ns", None).await,
        404
    );
    assert_eq!(
        a.status("GET", "/admin/v2/namespaces/ghost", None).await,
        404
    );
    a.ok("PUT", "/admin/v2/namespaces/acme/orders", None).await;
    a.ok(
        "PUT",
        "/admin/v2/namespaces/acme/billing",
        Some(r#"{"message_ttl_in_seconds":120,"retention_policies":{"retentionTimeInMinutes":5,"retentionSizeInMB":10}}"#),
    )
    .await;
    assert_eq!(
        a.status("PUT", "/admin/v2/namespaces/acme/orders", None)
            .await,
        409
    );
    assert_eq!(
        a.status(
            "PUT",
            "/admin/v2/namespaces/acme/bad",
            Some(r#"{"persistence":{"bookkeeperEnsemble":1,"bookkeeperWriteQuorum":3,"bookkeeperAckQuorum":1}}"#)
        )
        .await,
        400
    );
    assert_eq!(
        strings(&a.get("/admin/v2/namespaces/acme").await),
        vec!["acme/billing", "acme/orders"]
    );
    let billing = a.get("/admin/v2/namespaces/acme/billing").await;
    assert_eq!(billing["message_ttl_in_seconds"], 120);
    assert_eq!(
        a.get("/admin/v2/namespaces/acme/billing/messageTTL").await,
        120
    );
    assert_eq!(
        a.status("GET", "/admin/v2/namespaces/acme/ghost", None)
            .await,
        404
    );

    // Per-policy endpoints: set, read back, clear; bad values refused.
    let ns = "/admin/v2/namespaces/acme/orders";
    let cases: Vec<(&str, Value)> = vec![
        (
            "retention",
            json!({"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}),
        ),
        ("messageTTL", json!(30)),
        ("deduplication", json!(true)),
        ("maxProducersPerTopic", json!(4)),
        ("maxConsumersPerTopic", json!(5)),
        ("maxTopicsPerNamespace", json!(100)),
        ("maxSubscriptionsPerTopic", json!(7)),
        (
            "publishRate",
            json!({"publishThrottlingRateInMsg": 100, "publishThrottlingRateInByte": 1024}),
        ),
        (
            "persistence",
            json!({"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1, "managedLedgerMaxMarkDeleteRate": 0.0}),
        ),
    ];
    for (policy, value) in &cases {
        let path = format!("{ns}/{policy}");
        a.ok("POST", &path, Some(&value.to_string())).await;
        assert_eq!(&a.get(&path).await, value, "{policy}");
    }
    let all = a.get(ns).await;
    assert_eq!(all["max_producers_per_topic"], 4, "{all}");
    assert_eq!(all["deduplicationEnabled"], true, "{all}");
    assert_eq!(
        all["publishMaxMessageRate"][c]["publishThrottlingRateInMsg"],
        100
    );
    a.ok("DELETE", &format!("{ns}/messageTTL"), None).await;
    assert_eq!(a.get(&format!("{ns}/messageTTL")).await, Value::Null);
    a.ok(
        "POST",
        &format!("{ns}/backlogQuota?backlogQuotaType=destination_storage"),
        Some(r#"{"limitSize":1048576,"policy":"producer_exception"}"#),
    )
    .await;
    let quotas = a.get(&format!("{ns}/backlogQuotaMap")).await;
    assert_eq!(
        quotas["destination_storage"]["limitSize"], 1048576,
        "{quotas}"
    );
    assert_eq!(
        a.status(
            "POST",
            &format!("{ns}/backlogQuota?backlogQuotaType=nope"),
            Some(r#"{"policy":"producer_exception"}"#)
        )
        .await,
        400
    );
    let bad: Vec<(&str, &str)> = vec![
        ("messageTTL", "-1"),
        ("messageTTL", "\"ten\""),
        (
            "retention",
            r#"{"retentionTimeInMinutes":-7,"retentionSizeInMB":1}"#,
        ),
        ("deduplication", "1"),
        ("maxProducersPerTopic", "-2"),
        ("dispatchRate", r#"{"ratePeriodInSecond":0}"#),
        (
            "persistence",
            r#"{"bookkeeperEnsemble":1,"bookkeeperWriteQuorum":1,"bookkeeperAckQuorum":2}"#,
        ),
        (
            "autoTopicCreation",
            r#"{"allowAutoTopicCreation":true,"topicType":"sideways"}"#,
        ),
        ("backlogQuota", r#"{"limitSize":1,"policy":"shrug"}"#),
        ("retention", ""),
    ];
    for (policy, body) in bad {
        let status = a
            .status("POST", &format!("{ns}/{policy}"), Some(body))
            .await;
        assert_eq!(status, 400, "{policy} {body}");
    }
    assert_eq!(
        a.status("POST", &format!("{ns}/replication"), Some(r#"["mars"]"#))
            .await,
        412
    );
    assert_eq!(
        a.status("GET", &format!("{ns}/noSuchPolicy"), None).await,
        404
    );
    assert_eq!(
        a.status(
            "POST",
            "/admin/v2/namespaces/acme/ghost/messageTTL",
            Some("5")
        )
        .await,
        404
    );
    // The bad values left the stored ones alone.
    assert_eq!(a.get(&format!("{ns}/maxProducersPerTopic")).await, 4);

    // Delete: a tenant with namespaces, a namespace with topics.
    assert_eq!(
        a.status("DELETE", "/admin/v2/tenants/acme", None).await,
        409
    );
    a.ok("PUT", "/admin/v2/persistent/acme/orders/t1", None)
        .await;
    a.ok(
        "PUT",
        "/admin/v2/persistent/acme/orders/p1/partitions",
        Some("2"),
    )
    .await;
    a.ok("PUT", "/admin/v2/queues/acme/orders/q1", None).await;
    assert_eq!(a.status("DELETE", ns, None).await, 409);
    assert_eq!(
        a.status("DELETE", &format!("{ns}?force=maybe"), None).await,
        400
    );
    a.ok("DELETE", &format!("{ns}?force=true"), None).await;
    assert_eq!(a.status("GET", ns, None).await, 404);
    // Nothing of the old namespace comes back with a new one of that name.
    a.ok("PUT", ns, None).await;
    assert_eq!(a.get("/admin/v2/queues/acme/orders").await, json!([]));
    assert_eq!(a.get(&format!("{ns}/topics")).await, json!([]));
    assert_eq!(
        a.get("/admin/v2/persistent/acme/orders/partitioned").await,
        json!([])
    );
    a.ok("DELETE", ns, None).await;
    assert_eq!(
        a.status("GET", "/admin/v2/persistent/acme/orders/t1/stats", None)
            .await,
        404
    );
    a.ok("DELETE", "/admin/v2/namespaces/acme/billing", None)
        .await;
    a.ok("DELETE", "/admin/v2/tenants/acme", None).await;
    assert_eq!(
        a.status("DELETE", "/admin/v2/tenants/acme", None).await,
        404
    );
    assert!(!strings(&a.get("/admin/v2/tenants").await).contains(&"acme".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_subscriptions_and_stats_with_the_python_client() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let a = Admin::new(broker.http());
    let url = broker.service_url();
    let base = "/admin/v2/persistent/public/default";

    // Topics: create, duplicate, list; bad names and domains.
    a.ok("PUT", &format!("{base}/orders"), None).await;
    assert_eq!(a.status("PUT", &format!("{base}/orders"), None).await, 409);
    assert!(
        strings(&a.get(base).await).contains(&"persistent://public/default/orders".to_string())
    );
    assert_eq!(a.status("PUT", &format!("{base}/a%20b"), None).await, 400);
    assert_eq!(
        a.status("PUT", "/admin/v2/persistent/public/ghost/t", None)
            .await,
        404
    );
    assert_eq!(
        a.status("PUT", "/admin/v2/weird/public/default/t", None)
            .await,
        404
    );
    assert_eq!(
        a.status("PUT", "/admin/v2/non-persistent/public/default/np", None)
            .await,
        412
    );
    assert_eq!(
        a.status("GET", &format!("{base}/ghost/stats"), None).await,
        404
    );
    assert_eq!(
        a.status("GET", &format!("{base}/ghost/subscriptions"), None)
            .await,
        404
    );
    assert_eq!(
        a.status("DELETE", &format!("{base}/ghost"), None).await,
        404
    );

    // Partitioned topics.
    a.ok("PUT", &format!("{base}/parts/partitions"), Some("3"))
        .await;
    assert_eq!(
        a.get(&format!("{base}/parts/partitions")).await,
        json!({"partitions": 3})
    );
    assert_eq!(
        a.get(&format!("{base}/orders/partitions")).await,
        json!({"partitions": 0})
    );
    assert_eq!(
        a.status("PUT", &format!("{base}/parts/partitions"), Some("3"))
            .await,
        409
    );
    assert_eq!(
        a.status("PUT", &format!("{base}/orders/partitions"), Some("2"))
            .await,
        409
    );
    assert_eq!(
        a.status("PUT", &format!("{base}/x/partitions"), Some("0"))
            .await,
        400
    );
    assert_eq!(
        a.status("PUT", &format!("{base}/x/partitions"), Some("\"two\""))
            .await,
        400
    );
    assert_eq!(
        a.status("PUT", &format!("{base}/x/partitions"), Some("99999"))
            .await,
        400
    );
    a.ok("POST", &format!("{base}/parts/partitions"), Some("5"))
        .await;
    assert_eq!(
        a.status("POST", &format!("{base}/parts/partitions"), Some("2"))
            .await,
        400
    );
    assert_eq!(
        a.status("POST", &format!("{base}/ghost/partitions"), Some("2"))
            .await,
        404
    );
    assert_eq!(
        a.get(&format!("{base}/parts/partitions")).await["partitions"],
        5
    );
    assert_eq!(
        strings(&a.get(&format!("{base}/partitioned")).await),
        vec!["persistent://public/default/parts"]
    );
    a.ok(
        "PUT",
        "/admin/v2/non-persistent/public/default/np/partitions",
        Some("2"),
    )
    .await;
    assert_eq!(
        strings(
            &a.get("/admin/v2/non-persistent/public/default/partitioned")
                .await
        ),
        vec!["non-persistent://public/default/np"]
    );

    // Partitioned stats: the partitions summed (partition 0 used directly).
    a.ok("PUT", &format!("{base}/parts-partition-0"), None)
        .await;
    a.ok(
        "PUT",
        &format!("{base}/parts-partition-0/subscription/s"),
        Some(r#"{"ledgerId":-1,"entryId":-1}"#),
    )
    .await;
    let run = run_python(
        "produce.py",
        &[
            "--url",
            &url,
            "--topic",
            "parts-partition-0",
            "--count",
            "4",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    let ps = a
        .get(&format!("{base}/parts/partitioned-stats?perPartition=true"))
        .await;
    assert_eq!(ps["metadata"]["partitions"], 5, "{ps}");
    assert_eq!(ps["subscriptions"]["s"]["msgBacklog"], 4, "{ps}");
    assert!(ps["storageSize"].as_u64().unwrap() > 0, "{ps}");
    assert_eq!(ps["partitions"].as_object().unwrap().len(), 1, "{ps}");
    assert_eq!(
        a.status("GET", &format!("{base}/orders/partitioned-stats"), None)
            .await,
        404
    );
    assert_eq!(
        a.status(
            "GET",
            &format!("{base}/parts/partitioned-stats?perPartition=2"),
            None
        )
        .await,
        400
    );

    // Subscriptions: created from the earliest message, then messages come.
    a.ok(
        "PUT",
        &format!("{base}/orders/subscription/audit"),
        Some(r#"{"ledgerId":-1,"entryId":-1}"#),
    )
    .await;
    assert_eq!(
        a.status("PUT", &format!("{base}/orders/subscription/audit"), None)
            .await,
        409
    );
    assert_eq!(
        a.status("PUT", &format!("{base}/orders/subscription/a%20b"), None)
            .await,
        400
    );
    assert_eq!(
        a.status(
            "PUT",
            &format!("{base}/orders/subscription/s2"),
            Some(r#"{"ledgerId":"x"}"#)
        )
        .await,
        400
    );
    let run = run_python(
        "produce.py",
        &["--url", &url, "--topic", "orders", "--count", "10"],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    let produced_at = tokio::time::Instant::now();
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    assert_eq!(
        strings(&a.get(&format!("{base}/orders/subscriptions")).await),
        vec!["audit"]
    );
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 10, "{stats}");
    assert!(stats["storageSize"].as_u64().unwrap() > 0, "{stats}");
    let internal = a.get(&format!("{base}/orders/internalStats")).await;
    assert_eq!(internal["numberOfEntries"], 10, "{internal}");
    assert!(
        !internal["ledgers"].as_array().unwrap().is_empty(),
        "{internal}"
    );
    assert!(
        internal["cursors"]["audit"]["markDeletePosition"].is_string(),
        "{internal}"
    );

    let last = a.get(&format!("{base}/orders/lastMessageId")).await;
    assert_eq!(last["entryId"], 9, "{last}");
    assert_eq!(
        internal["lastConfirmedEntry"],
        format!("{}:9", last["ledgerId"]),
        "{internal}"
    );
    assert_eq!(
        a.status("GET", &format!("{base}/ghost/lastMessageId"), None)
            .await,
        404
    );

    // Per-topic metrics with tenant / namespace / topic labels.
    let orders = [
        ("tenant", "public"),
        ("namespace", "default"),
        ("topic", "persistent://public/default/orders"),
    ];
    assert_eq!(sample(&a, "cms_topic_entries", &orders).await, Some(10.0));
    let audit = [orders[0], orders[1], orders[2], ("subscription", "audit")];
    assert_eq!(
        sample(&a, "cms_subscription_backlog_entries", &audit).await,
        Some(10.0)
    );
    assert!(
        sample(
            &a,
            "cms_admin_requests_total",
            &[
                ("method", "PUT"),
                ("route", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}"),
                ("status", "409")
            ]
        )
        .await
        .is_some_and(|n| n >= 1.0)
    );

    // Peek: the n-th entry after the mark-delete, payload and headers.
    let sub = format!("{base}/orders/subscription/audit");
    let (status, body, id) = peek(&a, &format!("{sub}/position/1")).await;
    assert_eq!((status, body.as_str()), (200, "msg-0"));
    assert!(id.contains(':'), "message id header {id:?}");
    let (status, body, _) = peek(&a, &format!("{sub}/position/10")).await;
    assert_eq!((status, body.as_str()), (200, "msg-9"));
    assert_eq!(peek(&a, &format!("{sub}/position/11")).await.0, 404);
    assert_eq!(peek(&a, &format!("{sub}/position/0")).await.0, 400);
    assert_eq!(peek(&a, &format!("{sub}/position/x")).await.0, 400);
    assert_eq!(
        peek(&a, &format!("{base}/orders/subscription/ghost/position/1"))
            .await
            .0,
        404
    );

    // Skip 3: the backlog shrinks and the 4th message is next.
    a.ok("POST", &format!("{sub}/skip/3"), None).await;
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 7, "{stats}");
    assert_eq!(peek(&a, &format!("{sub}/position/1")).await.1, "msg-3");
    assert_eq!(a.status("POST", &format!("{sub}/skip/-1"), None).await, 400);
    a.ok("POST", &format!("{sub}/skip/100"), None).await;
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 0, "{stats}");
    a.ok(
        "POST",
        &format!("{sub}/resetcursor"),
        Some(r#"{"ledgerId":-1,"entryId":-1}"#),
    )
    .await;

    // Expiry by age: nothing is an hour old; everything is a second old
    // once two seconds have passed since the produce.
    let expire = format!("{base}/orders/all_subscription/expireMessages");
    a.ok("POST", &format!("{expire}/3600"), None).await;
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 10, "{stats}");
    assert_eq!(a.status("POST", &format!("{expire}/0"), None).await, 400);
    let aged = produced_at + Duration::from_secs(2);
    a.ok("POST", &format!("{sub}/expireMessages/3600"), None)
        .await;
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 10, "{stats}");
    assert_eq!(
        a.status("POST", &format!("{sub}/expireMessages/x"), None)
            .await,
        400
    );
    tokio::time::sleep_until(aged).await;
    // One subscription...
    a.ok("POST", &format!("{sub}/expireMessages/1"), None).await;
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 0, "{stats}");
    // ...and all of them.
    a.ok(
        "POST",
        &format!("{sub}/resetcursor"),
        Some(r#"{"ledgerId":-1,"entryId":-1}"#),
    )
    .await;
    a.ok("POST", &format!("{expire}/1"), None).await;
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 0, "{stats}");

    // Skip all, then reset to the earliest: the backlog follows.
    a.ok(
        "POST",
        &format!("{sub}/resetcursor"),
        Some(r#"{"ledgerId":-1,"entryId":-1}"#),
    )
    .await;
    a.ok(
        "POST",
        &format!("{base}/orders/subscription/audit/skip_all"),
        None,
    )
    .await;
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 0, "{stats}");
    a.ok(
        "POST",
        &format!("{base}/orders/subscription/audit/resetcursor"),
        Some(r#"{"ledgerId":-1,"entryId":-1}"#),
    )
    .await;
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 10, "{stats}");
    assert_eq!(
        a.status(
            "POST",
            &format!("{base}/orders/subscription/audit/resetcursor"),
            Some("{}")
        )
        .await,
        400
    );
    // Reset by publish time: past the last message, then before the first.
    let future_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3_600_000;
    a.ok("POST", &format!("{sub}/resetcursor/{future_ms}"), None)
        .await;
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 0, "{stats}");
    a.ok("POST", &format!("{sub}/resetcursor/1"), None).await;
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 10, "{stats}");
    assert_eq!(peek(&a, &format!("{sub}/position/1")).await.1, "msg-0");
    assert_eq!(
        a.status(
            "POST",
            &format!("{base}/orders/subscription/audit/resetcursor/abc"),
            None
        )
        .await,
        400
    );
    assert_eq!(
        a.status(
            "POST",
            &format!("{base}/orders/subscription/ghost/skip_all"),
            None
        )
        .await,
        404
    );

    // The subscription's consumer gets the 10 messages after the reset.
    let run = run_python(
        "consume.py",
        &[
            "--url", &url, "--topic", "orders", "--sub", "audit", "--count", "10",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "consume failed: {} / {}", run.json, run.stderr);
    let stats = a.get(&format!("{base}/orders/stats")).await;
    assert_eq!(stats["subscriptions"]["audit"]["msgBacklog"], 0, "{stats}");

    // Delete the subscription, unload, delete the topics.
    a.ok("DELETE", &format!("{base}/orders/subscription/audit"), None)
        .await;
    assert_eq!(
        a.status("DELETE", &format!("{base}/orders/subscription/audit"), None)
            .await,
        404
    );
    assert!(strings(&a.get(&format!("{base}/orders/subscriptions")).await).is_empty());
    a.ok("PUT", &format!("{base}/orders/unload"), None).await;
    a.ok("DELETE", &format!("{base}/orders"), None).await;
    assert_eq!(
        a.status("GET", &format!("{base}/orders/stats"), None).await,
        404
    );
    a.ok("DELETE", &format!("{base}/parts/partitions"), None)
        .await;
    assert_eq!(
        a.status("GET", &format!("{base}/parts/partitions"), None)
            .await,
        200
    );
    assert!(strings(&a.get(&format!("{base}/partitioned")).await).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_refuses_while_clients_are_connected_unless_forced() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let a = Admin::new(broker.http());
    let url = broker.service_url();
    // Auto-creation off: the consumer's reconnection after the forced
    // delete cannot bring the topic back.
    a.ok(
        "PUT",
        "/admin/v2/namespaces/public/held",
        Some(r#"{"autoTopicCreationOverride":{"allowAutoTopicCreation":false,"topicType":"non-partitioned"}}"#),
    )
    .await;
    let base = "/admin/v2/persistent/public/held";
    a.ok("PUT", &format!("{base}/busy"), None).await;
    // A consumer that waits for messages that never come keeps its
    // subscription attached while the admin calls run.
    let mut consumer = cms_tests::cluster::spawn_python(
        "consume.py",
        &[
            "--url",
            &url,
            "--topic",
            "public/held/busy",
            "--sub",
            "held",
            "--count",
            "1",
            "--timeout-ms",
            "30000",
        ],
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let stats = a.get(&format!("{base}/busy/stats")).await;
        let n = stats["subscriptions"]["held"]["consumers"]
            .as_array()
            .map_or(0, Vec::len);
        if n == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "consumer never attached: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        a.status("DELETE", &format!("{base}/busy/subscription/held"), None)
            .await,
        412
    );
    assert_eq!(a.status("DELETE", &format!("{base}/busy"), None).await, 409);
    a.ok("DELETE", &format!("{base}/busy?force=true"), None)
        .await;
    assert_eq!(
        a.status("GET", &format!("{base}/busy/stats"), None).await,
        404
    );
    let _ = consumer.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_set_through_one_broker_applies_on_another() {
    let zk = ZooKeeper::start().await;
    let zks = zk.connect_string();
    let _bookies = start_bookies(&zks, 3).await;
    let b1 = BrokerNode::start_cluster("broker-a", &zks, &[]).await;
    let b2 = BrokerNode::start_cluster("broker-b", &zks, &[]).await;
    let (a1, a2) = (Admin::new(b1.http()), Admin::new(b2.http()));

    assert_eq!(
        a2.get("/admin/v2/brokers").await.as_array().unwrap().len(),
        2
    );
    a1.ok("PUT", "/admin/v2/tenants/shared", None).await;
    a1.ok("PUT", "/admin/v2/namespaces/shared/ns", None).await;
    assert_eq!(
        strings(&a2.get("/admin/v2/namespaces/shared").await),
        vec!["shared/ns"]
    );

    // Auto-creation off through broker A: broker B refuses a new topic.
    a1.ok(
        "POST",
        "/admin/v2/namespaces/shared/ns/autoTopicCreation",
        Some(r#"{"allowAutoTopicCreation":false,"topicType":"non-partitioned"}"#),
    )
    .await;
    assert_eq!(
        a2.get("/admin/v2/namespaces/shared/ns/autoTopicCreation")
            .await["allowAutoTopicCreation"],
        false
    );
    let run = run_python(
        "produce.py",
        &[
            "--url",
            &b2.service_url(),
            "--topic",
            "persistent://shared/ns/fresh",
            "--count",
            "1",
            "--timeout-ms",
            "5000",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(
        !run.ok,
        "produce to a new topic with auto-creation off succeeded: {}",
        run.json
    );

    // A topic created through the admin API of broker A is served by B.
    a1.ok("PUT", "/admin/v2/persistent/shared/ns/made", None)
        .await;
    let run = run_python(
        "produce.py",
        &[
            "--url",
            &b2.service_url(),
            "--topic",
            "persistent://shared/ns/made",
            "--count",
            "3",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(
        run.ok,
        "produce to an admin-created topic failed: {} / {}",
        run.json, run.stderr
    );

    // Topic requests go to the topic's owner: the other broker answers 307
    // to the same path there (the Admin client follows it).
    let stats = "/admin/v2/persistent/shared/ns/made/stats?x=1";
    let direct = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_millis(ADMIN_REQUEST_TIMEOUT_MS))
        .build()
        .expect("http client");
    let mut owners = Vec::new();
    let mut redirects = Vec::new();
    for b in [&b1, &b2] {
        let r = direct
            .get(format!("http://{}{stats}", b.http()))
            .send()
            .await
            .expect("stats");
        match r.status().as_u16() {
            200 => owners.push(b.http()),
            307 => redirects.push(
                r.headers()["location"]
                    .to_str()
                    .expect("location")
                    .to_string(),
            ),
            other => panic!("stats answered {other}: {:?}", r.text().await),
        }
    }
    assert_eq!(
        (owners.len(), redirects.len()),
        (1, 1),
        "{owners:?} {redirects:?}"
    );
    assert!(
        redirects[0].ends_with(&format!("{}{stats}", owners[0])),
        "{redirects:?} should point at {}",
        owners[0]
    );
    assert!(a1.get(stats).await["storageSize"].as_u64().unwrap() > 0);
    assert!(a2.get(stats).await["storageSize"].as_u64().unwrap() > 0);

    // Retention and TTL set through A reach the loaded topic on its owner,
    // which reloads it with the new settings within seconds.
    let stats_path = "/admin/v2/persistent/shared/ns/made/internalStats";
    let before = a2.get(stats_path).await;
    assert_eq!(
        before["appliedPolicies"]["messageTtlInSeconds"], 0,
        "{before}"
    );
    a1.ok(
        "POST",
        "/admin/v2/namespaces/shared/ns/retention",
        Some(r#"{"retentionTimeInMinutes":30,"retentionSizeInMB":64}"#),
    )
    .await;
    a1.ok(
        "POST",
        "/admin/v2/namespaces/shared/ns/messageTTL",
        Some("600"),
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = a2.get(stats_path).await;
        let applied = &now["appliedPolicies"];
        if applied["messageTtlInSeconds"] == 600 && applied["retentionSizeInMB"] == 64 {
            assert_eq!(applied["retentionTimeInMinutes"], 30, "{now}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker B still runs the old policies: {now}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Cleared through B: A's namespace allows auto-creation again.
    a2.ok(
        "DELETE",
        "/admin/v2/namespaces/shared/ns/autoTopicCreation",
        None,
    )
    .await;
    assert_eq!(
        a1.get("/admin/v2/namespaces/shared/ns/autoTopicCreation")
            .await,
        Value::Null
    );
    let run = run_python(
        "produce.py",
        &[
            "--url",
            &b1.service_url(),
            "--topic",
            "persistent://shared/ns/fresh",
            "--count",
            "1",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(
        run.ok,
        "produce after clearing failed: {} / {}",
        run.json, run.stderr
    );
}

fn consumer_lines(
    child: &mut tokio::process::Child,
) -> tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>> {
    use tokio::io::AsyncBufReadExt;
    tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_are_shared_by_several_consumers_purged_and_deleted() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let a = Admin::new(broker.http());
    let url = broker.service_url();
    let q = "/admin/v2/queues/public/default";

    // Bad input.
    assert_eq!(
        a.status("PUT", &format!("{q}/jobs"), Some(r#"{"partitionz":2}"#))
            .await,
        400
    );
    assert_eq!(
        a.status(
            "PUT",
            &format!("{q}/jobs"),
            Some(r#"{"maxRedeliveries":0}"#)
        )
        .await,
        400
    );
    assert_eq!(
        a.status("PUT", &format!("{q}/jobs"), Some(r#"{"partitions":99999}"#))
            .await,
        400
    );
    assert_eq!(
        a.status("PUT", "/admin/v2/queues/public/ghost/jobs", None)
            .await,
        404
    );
    assert_eq!(a.status("PUT", &format!("{q}/a%20b"), None).await, 400);
    assert_eq!(a.status("GET", &format!("{q}/ghost"), None).await, 404);
    assert_eq!(
        a.status("POST", &format!("{q}/ghost/purge"), None).await,
        404
    );
    assert_eq!(a.status("DELETE", &format!("{q}/ghost"), None).await, 404);
    // A failed creation leaves nothing behind.
    assert!(a.get(q).await.as_array().unwrap().is_empty());

    // A partitioned queue: its topic's partitions each get the subscription,
    // so messages published before any consumer are kept on every partition.
    a.ok("PUT", &format!("{q}/wide"), Some(r#"{"partitions":2}"#))
        .await;
    assert_eq!(
        a.get("/admin/v2/persistent/public/default/wide/partitions")
            .await["partitions"],
        2
    );
    let wide = a.get(&format!("{q}/wide/stats")).await;
    assert_eq!(wide["partitions"].as_array().unwrap().len(), 2, "{wide}");
    assert_eq!(
        strings(
            &a.get("/admin/v2/persistent/public/default/wide-partition-1/subscriptions")
                .await
        ),
        vec!["queue"]
    );
    let run = run_python(
        "produce.py",
        &[
            "--url", &url, "--topic", "wide", "--count", "10", "--prefix", "w-",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    let wide = a.get(&format!("{q}/wide/stats")).await;
    assert_eq!(wide["msgBacklog"], 10, "{wide}");
    let spread: Vec<u64> = wide["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["msgBacklog"].as_u64().unwrap())
        .collect();
    assert!(
        spread.iter().all(|n| *n > 0),
        "one partition got nothing: {wide}"
    );
    let run = run_python(
        "consume.py",
        &[
            "--url",
            &url,
            "--topic",
            "wide",
            "--sub",
            "queue",
            "--sub-type",
            "Shared",
            "--count",
            "10",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "consume failed: {} / {}", run.json, run.stderr);
    let mut got = strings(&run.json["received"]);
    got.sort();
    let mut want: Vec<String> = (0..10).map(|i| format!("w-{i}")).collect();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(a.get(&format!("{q}/wide/stats")).await["msgBacklog"], 0);
    a.ok("DELETE", &format!("{q}/wide"), None).await;
    assert_eq!(
        a.get("/admin/v2/persistent/public/default/wide/partitions")
            .await["partitions"],
        0
    );
    assert_eq!(
        a.status(
            "GET",
            "/admin/v2/persistent/public/default/wide-partition-0/stats",
            None
        )
        .await,
        404
    );

    // A queue with a dead-letter policy.
    a.ok(
        "PUT",
        &format!("{q}/jobs"),
        Some(r#"{"maxRedeliveries":3}"#),
    )
    .await;
    assert_eq!(a.status("PUT", &format!("{q}/jobs"), None).await, 409);
    let info = a.get(&format!("{q}/jobs")).await;
    assert_eq!(info["subscription"], "queue", "{info}");
    assert_eq!(
        info["deadLetterTopic"],
        "persistent://public/default/jobs-queue-DLQ"
    );
    // The subscription exists from creation: messages published before any
    // consumer are kept.
    let run = run_python(
        "produce.py",
        &[
            "--url", &url, "--topic", "jobs", "--count", "6", "--prefix", "early-",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    let listed = a.get(q).await;
    assert_eq!(
        listed,
        json!([{"name": "jobs", "topic": "persistent://public/default/jobs", "msgBacklog": 6}])
    );
    a.ok("POST", &format!("{q}/jobs/purge"), None).await;
    assert_eq!(a.get(&format!("{q}/jobs/stats")).await["msgBacklog"], 0);

    // Two consumers on the queue's subscription share 60 messages.
    let args = |_: usize| {
        vec![
            "--url".to_string(),
            url.clone(),
            "--topic".into(),
            "jobs".into(),
            "--sub".into(),
            "queue".into(),
            "--sub-type".into(),
            "Shared".into(),
            "--count".into(),
            "60".into(),
            "--drain".into(),
            "--timeout-ms".into(),
            "4000".into(),
        ]
    };
    let mut children = Vec::new();
    for i in 0..2 {
        let v = args(i);
        let refs: Vec<&str> = v.iter().map(String::as_str).collect();
        let mut child = cms_tests::cluster::spawn_python("consume.py", &refs);
        let lines = consumer_lines(&mut child);
        children.push((child, lines));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let stats = a.get(&format!("{q}/jobs/stats")).await;
        if stats["consumers"] == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "consumers never attached: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let run = run_python(
        "produce.py",
        &["--url", &url, "--topic", "jobs", "--count", "60"],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    let mut received = Vec::new();
    for (child, lines) in children {
        let run = cms_tests::cluster::finish_python(child, lines, PYTHON_TIMEOUT_MS).await;
        assert!(run.ok, "consumer failed: {} / {}", run.json, run.stderr);
        let got = strings(&run.json["received"]);
        // Shared gives each consumer up to 20 entries in a row (Pulsar's
        // dispatcherMaxRoundRobinBatchSize): 60 reach both.
        assert!(!got.is_empty(), "one consumer got nothing: {}", run.json);
        received.extend(got);
    }
    received.sort();
    let mut want: Vec<String> = (0..60).map(|i| format!("msg-{i}")).collect();
    want.sort();
    assert_eq!(received, want);
    assert_eq!(a.get(&format!("{q}/jobs/stats")).await["msgBacklog"], 0);

    // Dead letters: a consumer applying the queue's settings sends what it
    // cannot process to the queue's DLQ after maxRedeliveries.
    a.ok(
        "PUT",
        &format!("{q}/risky"),
        Some(r#"{"maxRedeliveries":2}"#),
    )
    .await;
    let info = a.get(&format!("{q}/risky")).await;
    let dlq = info["deadLetterTopic"].as_str().unwrap().to_string();
    let run = run_python(
        "produce.py",
        &[
            "--url", &url, "--topic", "risky", "--count", "2", "--prefix", "r-",
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    let max = info["maxRedeliveries"].to_string();
    // The script waits for the originals' acks before it closes its client
    // (pulsar-client-cpp crashes when it is closed while the DLQ producer's
    // send callback acks the original).
    let backlog_url = format!("http://{}{q}/risky/stats", broker.http());
    let run = run_python(
        "queue_dlq.py",
        &[
            "--url",
            &url,
            "--topic",
            "risky",
            "--dlq",
            &dlq,
            "--max-redeliveries",
            &max,
            "--count",
            "2",
            "--backlog-url",
            &backlog_url,
        ],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(
        run.ok,
        "dead-letter run failed ({}): {} / {}",
        run.status, run.json, run.stderr
    );
    assert_eq!(run.json["dead"], json!(["r-0", "r-1"]), "{}", run.json);
    assert_eq!(run.json["deliveries"], 6, "{}", run.json);
    // The originals are acknowledged once they are in the DLQ.
    assert_eq!(
        run.json["backlog"], 0,
        "queue keeps its dead letters: {}",
        run.json
    );
    assert_eq!(a.get(&format!("{q}/risky/stats")).await["msgBacklog"], 0);
    let dead_topic = dlq.trim_start_matches("persistent://");
    let dead_stats = a
        .get(&format!("/admin/v2/persistent/{dead_topic}/internalStats"))
        .await;
    assert_eq!(dead_stats["numberOfEntries"], 2, "{dead_stats}");
    a.ok("DELETE", &format!("{q}/risky?force=true"), None).await;

    // Purge what is left, then delete.
    let run = run_python(
        "produce.py",
        &["--url", &url, "--topic", "jobs", "--count", "5"],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    assert_eq!(a.get(&format!("{q}/jobs/stats")).await["msgBacklog"], 5);
    a.ok("POST", &format!("{q}/jobs/purge"), None).await;
    assert_eq!(a.get(&format!("{q}/jobs/stats")).await["msgBacklog"], 0);
    a.ok("DELETE", &format!("{q}/jobs"), None).await;
    assert_eq!(a.status("GET", &format!("{q}/jobs"), None).await, 404);
    assert_eq!(
        a.get("/admin/v2/persistent/public/default/jobs/partitions")
            .await["partitions"],
        0
    );
    assert!(a.get(q).await.as_array().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookies_and_ledgers() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let a = Admin::new(broker.http());
    let url = broker.service_url();

    let bookies = a.get("/admin/v2/bookies").await;
    assert_eq!(bookies.as_array().unwrap().len(), 1, "{bookies}");
    let id = bookies[0]["id"].as_str().unwrap().to_string();
    assert_eq!(bookies[0]["state"], "available");
    assert!(bookies[0]["totalBytes"].as_u64().unwrap() > 0, "{bookies}");
    let one = a.get(&format!("/admin/v2/bookies/{id}")).await;
    assert_eq!(one["id"], id.as_str());
    assert_eq!(a.status("GET", "/admin/v2/bookies/ghost", None).await, 404);
    assert_eq!(a.status("GET", "/admin/v2/bookies/a%20b", None).await, 400);

    // The read-only switch, both ways.
    let ro = format!("/admin/v2/bookies/{id}/readonly");
    assert_eq!(
        a.status("PUT", &ro, Some(r#"{"readonly":"yes"}"#)).await,
        400
    );
    assert_eq!(a.status("PUT", &ro, Some("{}")).await, 400);
    assert_eq!(
        a.status(
            "PUT",
            "/admin/v2/bookies/ghost/readonly",
            Some(r#"{"readonly":true}"#)
        )
        .await,
        404
    );
    let on = a.ok("PUT", &ro, Some(r#"{"readonly":true}"#)).await;
    assert_eq!(on["state"], "readonly", "{on}");
    assert_eq!(
        a.get(&format!("/admin/v2/bookies/{id}")).await["state"],
        "readonly"
    );
    let off = a.ok("PUT", &ro, Some(r#"{"readonly":false}"#)).await;
    assert_eq!(off["state"], "available", "{off}");

    // Decommission: refused while the bookie runs; a bookie no ledger names
    // is done at once.
    assert_eq!(
        a.status(
            "POST",
            &format!("/admin/v2/bookies/{id}/decommission"),
            None
        )
        .await,
        409
    );
    let gone = a
        .ok("POST", "/admin/v2/bookies/gone-bookie/decommission", None)
        .await;
    assert_eq!(gone["done"], true, "{gone}");
    assert_eq!(gone["ledgersLeft"], 0, "{gone}");
    assert_eq!(a.get("/admin/v2/ledgers/underreplicated").await, json!([]));

    // A topic's ledger, as the metadata has it.
    let run = run_python(
        "produce.py",
        &["--url", &url, "--topic", "ledgers", "--count", "3"],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(run.ok, "produce failed: {} / {}", run.json, run.stderr);
    let internal = a
        .get("/admin/v2/persistent/public/default/ledgers/internalStats")
        .await;
    let ledger = internal["ledgers"][0]["ledgerId"]
        .as_u64()
        .expect("a ledger");
    let md = a.get(&format!("/admin/v2/ledgers/{ledger}")).await;
    assert_eq!(md["ensembleSize"], 1, "{md}");
    assert_eq!(md["segments"][0]["ensemble"], json!([id]), "{md}");
    assert!(md.get("password").is_none(), "{md}");
    assert_eq!(a.status("GET", "/admin/v2/ledgers/abc", None).await, 400);
    assert_eq!(
        a.status("GET", "/admin/v2/ledgers/987654321", None).await,
        404
    );
}
