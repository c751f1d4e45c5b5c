//! `cms-admin quotas` and `cms-admin permissions` against a real
//! `cms-broker standalone`. These commands use REST endpoints built in
//! parallel (issue 14 depends on the quotas and security issues):
//! `/admin/v2/{tenants/{t},namespaces/{t}/{ns}}/quotas[/usage]` and
//! `/admin/v2/{namespaces/{t}/{ns},persistent/{t}/{ns}/{topic}}/permissions[/{role}]`.
//! Until those are merged, this binary fails (404 "no such endpoint", exit 3);
//! it is a separate binary so the rest of `admin_cli` stays green meanwhile.

use cms_tests::admin_cli::{EXIT_NOT_FOUND, EXIT_USAGE, admin};
use cms_tests::cluster::BrokerNode;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_per_tenant_and_namespace() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = format!("http://{}", broker.http());
    let u = url.as_str();
    admin(u, &["tenants", "create", "acme"]).await.ok();
    admin(u, &["namespaces", "create", "acme/orders"])
        .await
        .ok();

    // Tenant quotas: set (only the limits given), get in JSON and table.
    admin(
        u,
        &[
            "quotas",
            "set",
            "acme",
            "--max-topics",
            "10",
            "--storage-bytes",
            "1073741824",
            "--publish-rate-msgs",
            "500",
        ],
    )
    .await
    .ok();
    let q = admin(u, &["quotas", "get", "acme", "-o", "json"])
        .await
        .json();
    assert_eq!(q["maxTopics"], 10, "{q}");
    assert_eq!(q["storageBytes"], 1073741824u64, "{q}");
    assert_eq!(q["publishRateInMsgs"], 500, "{q}");
    assert!(q["maxProducers"].is_null(), "not given = unlimited: {q}");
    let table = admin(u, &["quotas", "get", "acme"]).await;
    let row = table
        .rows()
        .into_iter()
        .find(|r| r.first().map(String::as_str) == Some("maxTopics"))
        .unwrap_or_else(|| panic!("no maxTopics row: {}", table.describe()));
    assert_eq!(row[1], "10", "{}", table.describe());

    // Usage has the same field names.
    admin(u, &["topics", "create", "acme/orders/t1"]).await.ok();
    let usage = admin(u, &["quotas", "usage", "acme", "-o", "json"])
        .await
        .json();
    assert!(
        usage["maxTopics"].as_u64().is_some_and(|n| n >= 1),
        "{usage}"
    );

    // Namespace quotas are separate from the tenant's.
    admin(u, &["quotas", "set", "acme/orders", "--max-producers", "3"])
        .await
        .ok();
    let nq = admin(u, &["quotas", "get", "acme/orders", "-o", "json"])
        .await
        .json();
    assert_eq!(nq["maxProducers"], 3, "{nq}");
    assert!(nq["maxTopics"].is_null(), "{nq}");
    let nusage = admin(u, &["quotas", "usage", "acme/orders", "-o", "json"])
        .await
        .json();
    assert!(nusage.is_object(), "{nusage}");

    // Remove: refused without --yes when nobody can be asked; then unlimited.
    admin(u, &["quotas", "remove", "acme/orders"])
        .await
        .fails(EXIT_USAGE, "--yes");
    admin(u, &["quotas", "remove", "acme/orders", "--yes"])
        .await
        .ok();
    let nq = admin(u, &["quotas", "get", "acme/orders", "-o", "json"])
        .await
        .json();
    assert!(nq["maxProducers"].is_null(), "{nq}");
    admin(u, &["quotas", "remove", "acme", "--yes"]).await.ok();
    let q = admin(u, &["quotas", "get", "acme", "-o", "json"])
        .await
        .json();
    assert!(q["maxTopics"].is_null(), "{q}");

    // Errors: unknown tenant (404 → 3), bad values (usage 2).
    admin(u, &["quotas", "get", "nope"])
        .await
        .fails(EXIT_NOT_FOUND, "nope");
    admin(u, &["quotas", "set", "acme", "--max-topics", "-1"])
        .await
        .fails(EXIT_USAGE, "-1");
    admin(u, &["quotas", "get", "a/b/c"])
        .await
        .fails(EXIT_USAGE, "TENANT/NS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_per_namespace_and_topic() {
    let broker = BrokerNode::start_standalone(&[]).await;
    let url = format!("http://{}", broker.http());
    let u = url.as_str();
    admin(u, &["tenants", "create", "acme"]).await.ok();
    admin(u, &["namespaces", "create", "acme/orders"])
        .await
        .ok();
    let topic = "persistent://acme/orders/events";
    admin(u, &["topics", "create", topic]).await.ok();

    for resource in ["acme/orders", topic] {
        admin(
            u,
            &[
                "permissions",
                "grant",
                resource,
                "--role",
                "billing",
                "--actions",
                "produce,consume",
            ],
        )
        .await
        .ok();
        admin(
            u,
            &[
                "permissions",
                "grant",
                resource,
                "--role",
                "audit",
                "--actions",
                "consume",
            ],
        )
        .await
        .ok();
        let p = admin(u, &["permissions", "list", resource, "-o", "json"])
            .await
            .json();
        let mut billing: Vec<Value> = p["billing"].as_array().cloned().unwrap_or_default();
        billing.sort_by_key(|v| v.as_str().unwrap_or_default().to_string());
        assert_eq!(
            billing,
            vec![json!("consume"), json!("produce")],
            "{resource}: {p}"
        );
        assert_eq!(p["audit"], json!(["consume"]), "{resource}: {p}");
        let table = admin(u, &["permissions", "list", resource]).await;
        assert!(table.ok().contains("billing"), "{}", table.describe());

        admin(u, &["permissions", "revoke", resource, "--role", "billing"])
            .await
            .ok();
        let p = admin(u, &["permissions", "list", resource, "-o", "json"])
            .await
            .json();
        assert!(
            p.get("billing").is_none_or(Value::is_null),
            "{resource}: {p}"
        );
        assert_eq!(p["audit"], json!(["consume"]), "{resource}: {p}");
    }

    // Bad arguments: an unknown action, no role.
    admin(
        u,
        &[
            "permissions",
            "grant",
            "acme/orders",
            "--role",
            "x",
            "--actions",
            "fly",
        ],
    )
    .await
    .fails(EXIT_USAGE, "fly");
    admin(
        u,
        &[
            "permissions",
            "grant",
            "acme/orders",
            "--actions",
            "produce",
        ],
    )
    .await
    .fails(EXIT_USAGE, "--role");
    // An unknown namespace: 404 → 3.
    admin(u, &["permissions", "list", "acme/nope"])
        .await
        .fails(EXIT_NOT_FOUND, "");
}
