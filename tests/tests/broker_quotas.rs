//! Tenant and namespace quotas (issue 11 parts 1-3, docs/quotas.md) against
//! a standalone broker, with the official Python client where the client's
//! view matters: the quota REST shapes and usage; a producer over its
//! publish rate is slowed to the rate with no error; counts (producers,
//! consumers, connections, topics, queues) refused at the limit with the
//! quota named; the backlog quota's `producer_exception` refuses the
//! producer with ProducerBlockedQuotaExceededException, `producer_request_hold`
//! holds sends until the consumer drains, `consumer_backlog_eviction` drops
//! the oldest backlog; a tenant's publish-rate quota holds within 10 % across
//! two namespaces served by two brokers (ZooKeeper cluster mode).

use cms_client::proto::commands;
use cms_client::proto::pulsar::command_subscribe::{InitialPosition, SubType};
use cms_tests::cluster::{BrokerNode, RawPulsarClient, run_python, start_bookies};
use cms_tests::harness::zookeeper::ZooKeeper;
use serde_json::{Value, json};

async fn admin(
    broker: &BrokerNode,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    broker.admin_call(method, path, body).await
}

async fn setup_tenant(broker: &BrokerNode, t: &str, namespaces: &[&str]) {
    let (st, v) = admin(
        broker,
        reqwest::Method::PUT,
        &format!("/admin/v2/tenants/{t}"),
        None,
    )
    .await;
    assert_eq!(st, 204, "{v}");
    for ns in namespaces {
        let (st, v) = admin(
            broker,
            reqwest::Method::PUT,
            &format!("/admin/v2/namespaces/{t}/{ns}"),
            None,
        )
        .await;
        assert_eq!(st, 204, "{v}");
    }
}

fn args<'a>(broker_url: &'a str, topic: &'a str, mode: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--url", broker_url, "--topic", topic, "--mode", mode];
    v.extend_from_slice(extra);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_rest_shapes_and_usage() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qrest", &["ns"]).await;
    let get = reqwest::Method::GET;
    let post = reqwest::Method::POST;
    let del = reqwest::Method::DELETE;
    for base in [
        "/admin/v2/tenants/qrest/quotas",
        "/admin/v2/namespaces/qrest/ns/quotas",
    ] {
        assert_eq!(
            admin(&broker, get.clone(), base, None).await,
            (200, json!({}))
        );
        let q = json!({"publishRateInMsgs": 10, "maxTopics": 3, "storageBytes": null});
        assert_eq!(admin(&broker, post.clone(), base, Some(q)).await.0, 204);
        assert_eq!(
            admin(&broker, get.clone(), base, None).await,
            (200, json!({"publishRateInMsgs": 10, "maxTopics": 3}))
        );
        let (st, v) = admin(&broker, post.clone(), base, Some(json!({"maxTopics": -1}))).await;
        assert_eq!(st, 400, "{v}");
        let (st, v) = admin(
            &broker,
            post.clone(),
            base,
            Some(json!({"publishRateInBytes": 0})),
        )
        .await;
        assert_eq!(st, 400, "{v}");
        assert!(
            v["reason"].as_str().unwrap().contains("publishRateInBytes"),
            "{v}"
        );
        let (st, v) = admin(&broker, get.clone(), &format!("{base}/usage"), None).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["maxTopics"], 0, "{v}");
        assert_eq!(v["maxProducers"], 0, "{v}");
        assert_eq!(admin(&broker, del.clone(), base, None).await.0, 204);
        assert_eq!(
            admin(&broker, get.clone(), base, None).await,
            (200, json!({}))
        );
    }
    // Updating the tenant keeps its quotas.
    let tq = "/admin/v2/tenants/qrest/quotas";
    assert_eq!(
        admin(&broker, post.clone(), tq, Some(json!({"maxProducers": 5})))
            .await
            .0,
        204
    );
    assert_eq!(
        admin(
            &broker,
            post.clone(),
            "/admin/v2/tenants/qrest",
            Some(json!({"adminRoles": ["r"]}))
        )
        .await
        .0,
        204
    );
    assert_eq!(
        admin(&broker, get.clone(), tq, None).await,
        (200, json!({"maxProducers": 5}))
    );
    assert_eq!(
        admin(&broker, get.clone(), "/admin/v2/tenants/nope/quotas", None)
            .await
            .0,
        404
    );
    assert_eq!(
        admin(
            &broker,
            get,
            "/admin/v2/namespaces/qrest/nope/quotas/usage",
            None
        )
        .await
        .0,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_rate_slows_the_producer_without_errors() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qrate", &["ns"]).await;
    let (st, _) = admin(
        &broker,
        reqwest::Method::POST,
        "/admin/v2/namespaces/qrate/ns/quotas",
        Some(json!({"publishRateInMsgs": 100})),
    )
    .await;
    assert_eq!(st, 204);
    let url = broker.service_url();
    // 400 messages at 100/s: about 4 s (the bucket starts empty).
    let run = run_python(
        "quotas.py",
        &args(
            &url,
            "persistent://qrate/ns/rate",
            "rate",
            &["--count", "400"],
        ),
        60_000,
    )
    .await;
    assert!(run.ok, "{} {}\n{}", run.status, run.json, run.stderr);
    assert_eq!(run.json["acked"], 400, "{}", run.json);
    assert_eq!(run.json["errors"], json!([]), "{}", run.json);
    let secs = run.json["seconds"].as_f64().unwrap();
    let rate = 400.0 / secs;
    eprintln!("namespace quota 100/s: {rate:.1}/s over {secs:.2} s");
    assert!(
        (70.0..=115.0).contains(&rate),
        "rate {rate:.1}/s over {secs:.2} s, quota 100/s"
    );
    // The usage endpoint saw the publishes.
    let (_, v) = admin(
        &broker,
        reqwest::Method::GET,
        "/admin/v2/tenants/qrate/quotas/usage",
        None,
    )
    .await;
    assert_eq!(v["maxTopics"], 1, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_are_refused_at_the_limit_naming_the_quota() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qcount", &["a", "b"]).await;
    let post = reqwest::Method::POST;
    let put = reqwest::Method::PUT;
    assert_eq!(
        admin(
            &broker,
            post.clone(),
            "/admin/v2/tenants/qcount/quotas",
            Some(json!({"maxProducers": 3, "maxTopics": 3, "maxQueues": 1}))
        )
        .await
        .0,
        204
    );
    let url = broker.service_url();
    // Producers: the tenant's 3 across its namespaces; the Python client
    // sees the refusal as final with the quota in the message.
    let run = run_python(
        "quotas.py",
        &args(
            &url,
            "persistent://qcount/a/p",
            "producers",
            &["--count", "5"],
        ),
        60_000,
    )
    .await;
    assert!(run.ok, "{}\n{}", run.json, run.stderr);
    assert_eq!(run.json["created"], 3, "{}", run.json);
    let e = run.json["error"].as_str().unwrap_or_default();
    assert!(
        run.stderr.contains("maxProducers=3") || e.contains("NotAllowed"),
        "{e}\n{}",
        run.stderr
    );
    // Topics: a, plus two more make 3; the fourth is refused (admin 409).
    for t in ["t2", "t3"] {
        let (st, v) = admin(
            &broker,
            put.clone(),
            &format!("/admin/v2/persistent/qcount/a/{t}"),
            None,
        )
        .await;
        assert_eq!(st, 204, "{v}");
    }
    let (st, v) = admin(
        &broker,
        put.clone(),
        "/admin/v2/persistent/qcount/b/t4",
        None,
    )
    .await;
    assert_eq!(st, 409, "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("tenant qcount quota maxTopics=3"),
        "{v}"
    );
    // Auto-creation over the quota is refused on the wire too.
    let mut c = RawPulsarClient::connected(broker.pulsar()).await;
    c.send(commands::producer("persistent://qcount/b/auto", 1, 1, None))
        .await;
    let got = c.recv().await.expect("answer");
    let e = got.error.expect("refused");
    assert!(e.message.contains("maxTopics=3"), "{e:?}");
    // Queues.
    let (st, v) = admin(&broker, put.clone(), "/admin/v2/queues/qcount/b/q1", None).await;
    assert_eq!(st, 204, "{v}");
    let (st, v) = admin(&broker, put.clone(), "/admin/v2/queues/qcount/b/q2", None).await;
    assert_eq!(st, 409, "{v}");
    assert!(v["reason"].as_str().unwrap().contains("maxQueues=1"), "{v}");
    // Consumers and connections of namespace qconn/b.
    setup_tenant(&broker, "qconn", &["b"]).await;
    assert_eq!(
        admin(
            &broker,
            post.clone(),
            "/admin/v2/namespaces/qconn/b/quotas",
            Some(json!({"maxConsumers": 1, "maxConnections": 1}))
        )
        .await
        .0,
        204
    );
    let topic = "persistent://qconn/b/t";
    let sub = |id: u64| {
        commands::subscribe(
            topic,
            "s1",
            SubType::Shared,
            id,
            id,
            InitialPosition::Latest,
        )
    };
    let mut c1 = RawPulsarClient::connected(broker.pulsar()).await;
    c1.send(sub(1)).await;
    let got = c1.recv().await.expect("answer");
    assert!(got.success.is_some(), "{got:?}");
    c1.send(sub(2)).await;
    let got = c1.recv().await.expect("answer");
    let e = got.error.expect("second consumer refused");
    assert!(
        e.message.contains("namespace qconn/b quota maxConsumers=1"),
        "{e:?}"
    );
    let mut c2 = RawPulsarClient::connected(broker.pulsar()).await;
    c2.send(commands::producer(topic, 1, 1, None)).await;
    let got = c2.recv().await.expect("answer");
    let e = got.error.expect("second connection refused");
    assert!(e.message.contains("maxConnections=1"), "{e:?}");
    // The first connection may add a producer (same connection).
    c1.send(commands::producer(topic, 1, 3, None)).await;
    let got = c1.recv().await.expect("answer");
    assert!(got.producer_success.is_some(), "{got:?}");
    // Refusals are counted: producers (1), auto-created topic (not a
    // handle refusal), consumer (1), connection (1).
    let refused =
        cms_tests::cluster::metric_value(broker.http(), "cms_broker_quota_refusals_total")
            .await
            .unwrap_or(0.0);
    assert!(
        refused >= 3.0,
        "cms_broker_quota_refusals_total = {refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_producer_exception_refuses_the_producer() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qback", &["ns"]).await;
    let (st, v) = admin(
        &broker,
        reqwest::Method::POST,
        "/admin/v2/namespaces/qback/ns/backlogQuota",
        Some(json!({"limitSize": 20000, "policy": "producer_exception"})),
    )
    .await;
    assert_eq!(st, 204, "{v}");
    let url = broker.service_url();
    let topic = "persistent://qback/ns/b";
    let run = run_python(
        "quotas.py",
        &args(
            &url,
            topic,
            "backlog",
            &["--count", "20000", "--size", "1000"],
        ),
        60_000,
    )
    .await;
    assert!(run.ok, "{}\n{}", run.json, run.stderr);
    eprintln!("producer_exception: {}", run.json);
    // The running producer is disconnected once the topic is over its
    // quota, and its re-creation is refused: its sends fail with the quota
    // error (not a SEND_ERROR / connection drop).
    let acked = run.json["acked"].as_u64().unwrap();
    assert!(acked < 20000, "{}", run.json);
    assert!(
        run.json["errors"][0]
            .as_str()
            .is_some_and(|e| e.contains("ProducerBlockedQuota")),
        "{}",
        run.json
    );
    // Within a few report intervals the topic is over its quota and a new
    // producer is refused with the quota error (never a SEND_ERROR).
    let refused = cms_tests::harness::wait::within(10_000, || async {
        let run = run_python("quotas.py", &args(&url, topic, "create", &[]), 30_000).await;
        let e = run.json["error"].as_str().unwrap_or_default().to_string();
        e.contains("ProducerBlockedQuota")
    })
    .await;
    assert!(refused.is_some(), "no ProducerBlockedQuotaExceeded refusal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_hold_pauses_sends_until_the_consumer_drains() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qhold", &["ns"]).await;
    let (st, v) = admin(
        &broker,
        reqwest::Method::POST,
        "/admin/v2/namespaces/qhold/ns/backlogQuota",
        Some(json!({"limitSize": 20000, "policy": "producer_request_hold"})),
    )
    .await;
    assert_eq!(st, 204, "{v}");
    let url = broker.service_url();
    let run = run_python(
        "quotas.py",
        &args(
            &url,
            "persistent://qhold/ns/h",
            "hold",
            &["--count", "200", "--size", "1000"],
        ),
        60_000,
    )
    .await;
    assert!(run.ok, "{}\n{}", run.json, run.stderr);
    // Held: well short of all 200 after 3 s (200 KB against a 20 KB quota).
    eprintln!("hold: {}", run.json);
    let held_at = run.json["held_at"].as_u64().unwrap();
    assert!(held_at < 100, "{}", run.json);
    // Resumed once drained: every send acknowledged, none failed.
    assert_eq!(run.json["acked"], 200, "{}", run.json);
    assert_eq!(run.json["errors"], json!([]), "{}", run.json);
    assert_eq!(run.json["received"], 200, "{}", run.json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_eviction_drops_the_oldest_backlog() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qevict", &["ns"]).await;
    let (st, v) = admin(
        &broker,
        reqwest::Method::POST,
        "/admin/v2/namespaces/qevict/ns/backlogQuota",
        Some(json!({"limitSize": 20000, "policy": "consumer_backlog_eviction"})),
    )
    .await;
    assert_eq!(st, 204, "{v}");
    let url = broker.service_url();
    let topic = "persistent://qevict/ns/e";
    let run = run_python(
        "quotas.py",
        &args(
            &url,
            topic,
            "backlog",
            &["--count", "100", "--size", "1000", "--sub", "slow"],
        ),
        60_000,
    )
    .await;
    assert!(run.ok, "{}\n{}", run.json, run.stderr);
    // Producers are never refused under this policy.
    assert_eq!(run.json["acked"], 100, "{}", run.json);
    // Within a few intervals the slow subscription's backlog fits the quota
    // again (the entries carry ~1 KB each, plus headers).
    let stats = "/admin/v2/persistent/qevict/ns/e/stats";
    let fits = cms_tests::harness::wait::within(10_000, || async {
        let (_, v) = admin(&broker, reqwest::Method::GET, stats, None).await;
        v["subscriptions"]["slow"]["msgBacklog"]
            .as_u64()
            .is_some_and(|n| n <= 20)
    })
    .await;
    let (_, last) = admin(&broker, reqwest::Method::GET, stats, None).await;
    assert!(fits.is_some(), "backlog not evicted: {last}");
}

/// The owner's `pulsar://` URL of `topic` (`t/ns/local`) through the HTTP
/// lookup of the broker at `http` (redirects followed); `authoritative`:
/// the broker asked takes an unowned bundle itself (what a redirected
/// client's lookup does) instead of placing it by load.
async fn owner_via(http: std::net::SocketAddr, topic: &str, authoritative: bool) -> String {
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .expect("client");
    let v: Value = client
        .get(format!(
            "http://{http}/lookup/v2/topic/persistent/{topic}?authoritative={authoritative}"
        ))
        .send()
        .await
        .expect("lookup")
        .json()
        .await
        .expect("lookup JSON");
    v["brokerUrl"]
        .as_str()
        .unwrap_or_else(|| panic!("no brokerUrl in {v}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_publish_quota_holds_across_two_brokers_and_namespaces() {
    let zk = ZooKeeper::start().await;
    let zks = zk.connect_string();
    let _bookies = start_bookies(&zks, 3).await;
    let a = BrokerNode::start_cluster("broker-a", &zks, &[]).await;
    let b = BrokerNode::start_cluster("broker-b", &zks, &[]).await;
    setup_tenant(&a, "qcl", &["ns1", "ns2"]).await;
    const QUOTA: f64 = 200.0;
    let (st, v) = admin(
        &a,
        reqwest::Method::POST,
        "/admin/v2/tenants/qcl/quotas",
        Some(json!({"publishRateInMsgs": QUOTA as u64})),
    )
    .await;
    assert_eq!(st, 204, "{v}");
    // One topic of ns1 owned by broker a, one of ns2 owned by broker b:
    // both namespaces are new (every bundle unowned), and an authoritative
    // lookup makes the broker asked take the bundle (placement by load
    // would depend on the brokers' CPU at that moment).
    let (ta, tb) = ("qcl/ns1/t0", "qcl/ns2/t0");
    assert_eq!(owner_via(a.http(), ta, true).await, a.service_url());
    assert_eq!(owner_via(b.http(), tb, true).await, b.service_url());
    let (ta, tb) = (format!("persistent://{ta}"), format!("persistent://{tb}"));
    // Each producer alone would go at full speed; together they must share
    // 200/s: 1200 messages take about 6 s.
    const EACH: u64 = 600;
    let (ua, ub) = (a.service_url(), b.service_url());
    let count = EACH.to_string();
    let args_a = args(&ua, &ta, "rate", &["--count", &count]);
    let args_b = args(&ub, &tb, "rate", &["--count", &count]);
    let (ra, rb) = tokio::join!(
        run_python("quotas.py", &args_a, 60_000),
        run_python("quotas.py", &args_b, 60_000),
    );
    for r in [&ra, &rb] {
        assert!(r.ok, "{}\n{}", r.json, r.stderr);
        assert_eq!(r.json["acked"], EACH, "{}", r.json);
        assert_eq!(r.json["errors"], json!([]), "{}", r.json);
    }
    let secs = ra.json["seconds"]
        .as_f64()
        .unwrap()
        .max(rb.json["seconds"].as_f64().unwrap());
    let rate = (2 * EACH) as f64 / secs;
    eprintln!("tenant quota {QUOTA}/s: aggregate {rate:.1}/s over {secs:.2} s");
    assert!(
        rate <= QUOTA * 1.1,
        "aggregate {rate:.1}/s over {secs:.2} s above the tenant quota {QUOTA}/s + 10 %: {} {}",
        ra.json,
        rb.json
    );
    // Not starved either (shares move to where the load is).
    assert!(
        rate >= QUOTA * 0.6,
        "aggregate {rate:.1}/s over {secs:.2} s: {} {}",
        ra.json,
        rb.json
    );
}

/// Sets a `message_age` backlog quota of `limit_s` seconds with `policy` on
/// namespace `ns` (`tenant/ns`), as Pulsar's REST does
/// (`backlogQuotaType=message_age`).
async fn set_age_quota(broker: &BrokerNode, ns: &str, limit_s: u64, policy: &str) {
    let path = format!("/admin/v2/namespaces/{ns}/backlogQuota?backlogQuotaType=message_age");
    let body = json!({"limitTime": limit_s, "policy": policy});
    let (st, v) = admin(broker, reqwest::Method::POST, &path, Some(body.clone())).await;
    assert_eq!(st, 204, "{v}");
    let (st, v) = admin(
        broker,
        reqwest::Method::GET,
        &format!("/admin/v2/namespaces/{ns}/backlogQuotaMap"),
        None,
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message_age"]["limitTime"], limit_s, "{v}");
    assert_eq!(v["message_age"]["policy"], policy, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_quota_hold_pauses_sends_until_the_old_message_is_acked() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qagehold", &["ns"]).await;
    set_age_quota(&broker, "qagehold/ns", 2, "producer_request_hold").await;
    let run = run_python(
        "quotas.py",
        &args(
            &broker.service_url(),
            "persistent://qagehold/ns/h",
            "age_hold",
            &["--count", "50", "--age-wait-s", "4"],
        ),
        90_000,
    )
    .await;
    assert!(run.ok, "{}\n{}", run.json, run.stderr);
    eprintln!("age hold: {}", run.json);
    // Held: the unacknowledged first message is 4 s old against a 2 s
    // limit, so the 50 sends wait (at most the SEND read before the hold
    // was seen goes through).
    let held_at = run.json["held_at"].as_u64().unwrap();
    assert!(held_at <= 5, "{}", run.json);
    // Resumed once the consumer acknowledged: every send acknowledged.
    assert_eq!(run.json["acked"], 50, "{}", run.json);
    assert_eq!(run.json["errors"], json!([]), "{}", run.json);
    assert_eq!(run.json["received"], 51, "{}", run.json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_quota_exception_refuses_the_producer() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qageexc", &["ns"]).await;
    set_age_quota(&broker, "qageexc/ns", 2, "producer_exception").await;
    let url = broker.service_url();
    let topic = "persistent://qageexc/ns/x";
    // One message nobody acknowledges.
    let run = run_python(
        "quotas.py",
        &args(&url, topic, "backlog", &["--count", "1", "--sub", "slow"]),
        60_000,
    )
    .await;
    assert!(run.ok, "{}\n{}", run.json, run.stderr);
    assert_eq!(run.json["acked"], 1, "{}", run.json);
    // Once it is older than 2 s, a new producer is refused with the quota
    // error class (final at creation), never a SEND_ERROR.
    let refused = cms_tests::harness::wait::within(20_000, || async {
        let run = run_python("quotas.py", &args(&url, topic, "create", &[]), 30_000).await;
        let e = run.json["error"].as_str().unwrap_or_default().to_string();
        e.contains("ProducerBlockedQuota")
    })
    .await;
    assert!(refused.is_some(), "no ProducerBlockedQuotaExceeded refusal");
    // Other topics of the namespace are not affected.
    let run = run_python(
        "quotas.py",
        &args(&url, "persistent://qageexc/ns/other", "create", &[]),
        30_000,
    )
    .await;
    assert_eq!(run.json["created"], 1, "{}", run.json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_quota_eviction_drops_only_the_messages_over_the_age() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qageev", &["ns"]).await;
    set_age_quota(&broker, "qageev/ns", 4, "consumer_backlog_eviction").await;
    let url = broker.service_url();
    let topic = "persistent://qageev/ns/e";
    let publish_five = || async {
        let run = run_python(
            "quotas.py",
            &args(&url, topic, "backlog", &["--count", "5", "--sub", "slow"]),
            60_000,
        )
        .await;
        assert!(run.ok, "{}\n{}", run.json, run.stderr);
        // Producers are never refused under this policy.
        assert_eq!(run.json["acked"], 5, "{}", run.json);
    };
    let stats = "/admin/v2/persistent/qageev/ns/e/stats";
    let backlog_is = |n: u64| {
        let broker = &broker;
        move || async move {
            let (_, v) = admin(broker, reqwest::Method::GET, stats, None).await;
            v["subscriptions"]["slow"]["msgBacklog"].as_u64() == Some(n)
        }
    };
    publish_five().await;
    // The first five age past 4 s; five more are published after that.
    let first = std::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_millis(4_500)).await;
    publish_five().await;
    let young_left = first.elapsed();
    // The old five are evicted, the young five kept (until they too are
    // older than 4 s, at least 4 s after `young_left`).
    let only_young = cms_tests::harness::wait::within(3_500, backlog_is(5)).await;
    let (_, last) = admin(&broker, reqwest::Method::GET, stats, None).await;
    assert!(
        only_young.is_some(),
        "old backlog not evicted or young backlog evicted ({young_left:?} after the first): {last}"
    );
    // Then the young five, once over the age.
    let all = cms_tests::harness::wait::within(15_000, backlog_is(0)).await;
    let (_, last) = admin(&broker, reqwest::Method::GET, stats, None).await;
    assert!(all.is_some(), "backlog not evicted: {last}");
}

/// Publishes `n` unbatched messages `body(0..n)` to `topic` and waits for
/// every receipt.
async fn write_backlog(broker: &BrokerNode, topic: &str, n: u64, body: impl Fn(u64) -> Vec<u8>) {
    let client = cms_client::Client::new(broker.service_url()).expect("client");
    let p = client
        .producer(topic)
        .batching(false)
        .create()
        .await
        .expect("producer");
    let mut receipts = Vec::new();
    for i in 0..n {
        receipts.push(p.send_async(body(i)).await.expect("send"));
    }
    for r in receipts {
        r.await.expect("receipt");
    }
    p.close().await.expect("close");
}

/// Receives `n` messages on a new Exclusive subscription `sub` of `topic`
/// from the earliest, acknowledging each; the seconds it took.
async fn consume_timed(url: String, topic: String, sub: String, n: u64) -> f64 {
    let client = cms_client::Client::new(url).expect("client");
    let mut c = client
        .consumer(&topic, &sub)
        .sub_type(cms_client::SubType::Exclusive)
        .initial_position(cms_client::InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap_or_else(|e| panic!("subscribing {sub}: {e}"));
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        let m = tokio::time::timeout(std::time::Duration::from_secs(60), c.receive())
            .await
            .unwrap_or_else(|_| panic!("{sub}: no message within 60 s"))
            .unwrap_or_else(|e| panic!("{sub}: receive: {e}"));
        c.ack(&m.id)
            .await
            .unwrap_or_else(|e| panic!("{sub}: ack: {e}"));
    }
    t0.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_dispatch_rate_limits_each_subscription() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qsdr", &["ns"]).await;
    let topic = "persistent://qsdr/ns/d".to_string();
    let n = 300u64;
    // The backlog; the subscriptions start from the earliest message.
    write_backlog(&broker, &topic, n, |i| format!("m{i}").into_bytes()).await;
    let (st, v) = admin(
        &broker,
        reqwest::Method::POST,
        "/admin/v2/namespaces/qsdr/ns/subscriptionDispatchRate",
        Some(json!({"dispatchThrottlingRateInMsg": 100, "ratePeriodInSecond": 1})),
    )
    .await;
    assert_eq!(st, 204, "{v}");
    // Two subscriptions read at once: each is held to 100 msg/s on its own
    // (a topic-wide limit would make them share 100 msg/s).
    let url = broker.service_url();
    let a = tokio::spawn(consume_timed(url.clone(), topic.clone(), "a".into(), n));
    let b = tokio::spawn(consume_timed(url, topic.clone(), "b".into(), n));
    let (sa, sb) = (a.await.unwrap(), b.await.unwrap());
    for (sub, secs) in [("a", sa), ("b", sb)] {
        let rate = n as f64 / secs;
        eprintln!("subscription {sub}: {rate:.1} msg/s over {secs:.2} s (limit 100)");
        assert!(
            (60.0..=130.0).contains(&rate),
            "subscription {sub}: {rate:.1} msg/s over {secs:.2} s, limit 100/s"
        );
    }
}

/// A subscription under a byte dispatch rate reads its backlog from the
/// bookies in pieces of a tenth of a second of that rate (one 32 KiB entry
/// per read at 320 KiB/s), as Pulsar's dispatchers read no more than the
/// rate limiter's permits; a subscription without a rate reads the same
/// backlog in a few large reads. Counted by the broker's dispatch reads
/// (every bookie read of a cursor is admitted there once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_dispatch_rate_reads_the_backlog_in_pieces_of_its_rate() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qdrb", &["ns"]).await;
    let topic = "persistent://qdrb/ns/d".to_string();
    let n = 40u64;
    write_backlog(&broker, &topic, n, |i| {
        let mut body = vec![b'x'; 32 << 10];
        body[..8].copy_from_slice(&i.to_be_bytes());
        body
    })
    .await;
    let reads = || async {
        cms_tests::cluster::metric_value(
            broker.http(),
            "cms_broker_dispatch_read_wait_seconds_count",
        )
        .await
        .unwrap_or(0.0)
    };
    // No rate: the whole backlog in a few reads.
    let r0 = reads().await;
    consume_timed(broker.service_url(), topic.clone(), "free".into(), n).await;
    let free = reads().await - r0;
    assert!(
        free <= 5.0,
        "an unlimited subscription took {free} bookie reads for {n} entries"
    );
    let (st, v) = admin(
        &broker,
        reqwest::Method::POST,
        "/admin/v2/namespaces/qdrb/ns/subscriptionDispatchRate",
        Some(json!({"dispatchThrottlingRateInMsg": -1, "dispatchThrottlingRateInByte": 320 << 10, "ratePeriodInSecond": 1})),
    )
    .await;
    assert_eq!(st, 204, "{v}");
    let r1 = reads().await;
    let secs = consume_timed(broker.service_url(), topic.clone(), "paced".into(), n).await;
    let paced = reads().await - r1;
    eprintln!("paced: {paced} bookie reads for {n} entries in {secs:.2} s; unlimited: {free}");
    assert!(
        paced >= n as f64,
        "a subscription at 320 KiB/s took {paced} bookie reads for {n} entries of 32 KiB (want one per entry)"
    );
    // 1.25 MiB at 320 KiB/s, less the first tenth of a second.
    assert!(secs >= 2.5, "the rate held: {secs:.2} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_persistent_topics_are_under_publish_rate_and_count_quotas() {
    let broker = BrokerNode::start_standalone(&[]).await;
    setup_tenant(&broker, "qnp", &["ns"]).await;
    let (st, v) = admin(
        &broker,
        reqwest::Method::POST,
        "/admin/v2/namespaces/qnp/ns/quotas",
        Some(json!({"publishRateInMsgs": 100, "maxProducers": 1})),
    )
    .await;
    assert_eq!(st, 204, "{v}");
    let topic = "non-persistent://qnp/ns/np";
    let client = cms_client::Client::new(broker.service_url()).unwrap();
    let p = client
        .producer(topic)
        .batching(false)
        .create()
        .await
        .unwrap();
    // The namespace's one producer is in use: a second is refused with the
    // quota named.
    let other = cms_client::Client::new(broker.service_url()).unwrap();
    let Err(err) = other.producer(topic).create().await else {
        panic!("a second producer over maxProducers=1 was admitted");
    };
    assert!(err.to_string().contains("maxProducers=1"), "{err}");
    // 300 messages at 100/s: about 3 s (the bucket starts empty).
    let n = 300u64;
    let t0 = std::time::Instant::now();
    let mut receipts = Vec::new();
    for i in 0..n {
        receipts.push(p.send_async(format!("np{i}").into_bytes()).await.unwrap());
    }
    for r in receipts {
        r.await.unwrap();
    }
    let secs = t0.elapsed().as_secs_f64();
    let rate = n as f64 / secs;
    eprintln!("non-persistent publish under a 100 msg/s quota: {rate:.1}/s over {secs:.2} s");
    assert!(
        (60.0..=130.0).contains(&rate),
        "rate {rate:.1}/s over {secs:.2} s, quota 100/s"
    );
    p.close().await.unwrap();
}
