//! The schema registry against `cms-broker standalone` and in cluster mode
//! (ZooKeeper, three bookies, broker): the official Python
//! client (pulsar-client 3.13) evolves an Avro schema (compatible v2 accepted,
//! incompatible changes refused with IncompatibleSchema under the default
//! FULL strategy), reads old data with a new schema through GET_SCHEMA, and
//! round-trips JSON and String schemas; raw protocol checks of GET_SCHEMA
//! (latest, by version, no schema = TopicNotFound) and of the schema version
//! PRODUCER_SUCCESS carries.

use bytes::Bytes;
use cms_client::proto::commands;
use cms_client::proto::pulsar::{
    BaseCommand, CommandGetSchema, Schema, ServerError, base_command::Type,
};
use cms_tests::cluster::{
    BrokerCluster, BrokerNode, PYTHON_TIMEOUT_MS, RawPulsarClient, run_python,
};

/// `method path` with a JSON body: (status, body as JSON or Null).
async fn admin(
    broker: &BrokerNode,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    broker.admin_call(method, path, body).await
}

fn get_schema(request_id: u64, topic: &str, version: Option<u64>) -> BaseCommand {
    BaseCommand {
        r#type: Type::GetSchema as i32,
        get_schema: Some(CommandGetSchema {
            request_id,
            topic: topic.to_string(),
            schema_version: version.map(|v| Bytes::from(v.to_be_bytes().to_vec())),
        }),
        ..Default::default()
    }
}

fn avro_record(fields: &str) -> Schema {
    Schema {
        name: "raw".into(),
        schema_data: Bytes::from(format!(
            r#"{{"type":"record","name":"Raw","fields":[{fields}]}}"#
        )),
        r#type: 4,
        properties: vec![],
    }
}

/// The next answer on `c`, which must be a GET_SCHEMA_RESPONSE.
async fn schema_response(
    c: &mut RawPulsarClient,
) -> cms_client::proto::pulsar::CommandGetSchemaResponse {
    c.recv()
        .await
        .expect("an answer")
        .get_schema_response
        .expect("GET_SCHEMA_RESPONSE")
}

async fn producer_with(
    c: &mut RawPulsarClient,
    topic: &str,
    id: u64,
    schema: Option<Schema>,
) -> BaseCommand {
    let mut cmd = commands::producer(topic, id, id, None);
    if let Some(p) = cmd.producer.as_mut() {
        p.schema = schema;
    }
    c.send(cmd).await;
    c.recv().await.expect("an answer to PRODUCER")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_evolution_with_the_python_client_and_get_schema() {
    let broker = BrokerNode::start_standalone(&[]).await;
    schema_evolution(&broker).await;
}

/// The same in cluster mode: schemas stored in ZooKeeper, data on 3 bookies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_schema_evolution_with_the_python_client_and_get_schema() {
    let c = BrokerCluster::start(&[]).await;
    schema_evolution(&c.broker).await;
}

async fn schema_evolution(broker: &BrokerNode) {
    let url = broker.service_url();
    let (st, v) = admin(
        broker,
        reqwest::Method::PUT,
        "/admin/v2/persistent/public/default/schemas-part/partitions",
        Some(serde_json::json!(3)),
    )
    .await;
    assert!(st == 200 || st == 204, "{st} {v}");
    let run = run_python(
        "schemas.py",
        &["--url", &url, "--topic", "schemas"],
        PYTHON_TIMEOUT_MS,
    )
    .await;
    assert!(
        run.ok,
        "schema checks failed: {} / {}",
        run.json,
        run.stderr
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The refusals name the reason the client got.
    for case in [
        "type",
        "nodefault",
        "consumer",
        "string-to-avro",
        "partitioned",
    ] {
        let e = run.json["errors"][case].as_str().unwrap_or_default();
        assert!(e.contains("IncompatibleSchema"), "{case}: {e}");
    }

    // Raw GET_SCHEMA: the latest of the Avro topic is version 1 (with `age`).
    let mut c = RawPulsarClient::connected(broker.pulsar()).await;
    let topic = "persistent://public/default/schemas-avro";
    c.send(get_schema(1, topic, None)).await;
    let r = schema_response(&mut c).await;
    assert_eq!(r.error_code, None, "{:?}", r.error_message);
    assert_eq!(r.schema_version.as_deref(), Some(&1u64.to_be_bytes()[..]));
    let s = r.schema.expect("schema");
    assert_eq!(s.r#type, 4);
    assert!(
        String::from_utf8_lossy(&s.schema_data).contains("\"age\""),
        "{s:?}"
    );
    // By version.
    c.send(get_schema(2, topic, Some(0))).await;
    let r = schema_response(&mut c).await;
    assert_eq!(r.schema_version.as_deref(), Some(&0u64.to_be_bytes()[..]));
    assert!(!String::from_utf8_lossy(&r.schema.expect("schema").schema_data).contains("\"age\""));
    // No schema: TopicNotFound (G14).
    c.send(get_schema(
        3,
        "persistent://public/default/no-schema-here",
        None,
    ))
    .await;
    let r = schema_response(&mut c).await;
    assert_eq!(r.error_code, Some(ServerError::TopicNotFound as i32));

    // Every partition answers with the partitioned topic's one version.
    for i in 0..3 {
        let part = format!("persistent://public/default/schemas-part-partition-{i}");
        c.send(get_schema(10 + i, &part, None)).await;
        let r = schema_response(&mut c).await;
        assert_eq!(r.error_code, None, "{part}: {:?}", r.error_message);
        assert_eq!(
            r.schema_version.as_deref(),
            Some(&0u64.to_be_bytes()[..]),
            "{part}"
        );
    }

    // PRODUCER_SUCCESS carries the version: 0 for the first, the same for
    // the same schema, 1 for a compatible change.
    let t = "persistent://public/default/schemas-raw";
    let v0 = avro_record(r#"{"name":"a","type":"string"}"#);
    let v1 = avro_record(r#"{"name":"a","type":"string"},{"name":"b","type":"int","default":0}"#);
    for (id, schema, expect) in [(1, v0.clone(), 0u64), (2, v0, 0), (3, v1, 1)] {
        let got = producer_with(&mut c, t, id, Some(schema)).await;
        let ps = got
            .producer_success
            .clone()
            .unwrap_or_else(|| panic!("producer {id}: {got:?}"));
        assert_eq!(
            ps.schema_version.as_deref(),
            Some(&expect.to_be_bytes()[..]),
            "producer {id}"
        );
    }
    // Not Avro at all: IncompatibleSchema with a reason, the connection stays.
    let got = producer_with(&mut c, t, 4, Some(avro_record("{oops"))).await;
    let e = got.error.expect("an ERROR");
    assert_eq!(e.error, ServerError::IncompatibleSchema as i32);
    assert!(e.message.contains("Avro"), "{}", e.message);
    // Without a schema: accepted, no version.
    let got = producer_with(&mut c, t, 5, None).await;
    assert_eq!(got.producer_success.expect("success").schema_version, None);

    // Admin REST: the same history, uploads checked like producers, delete.
    let base = "/admin/v2/schemas/public/default/schemas-raw";
    let (st, v) = admin(
        broker,
        reqwest::Method::GET,
        &format!("{base}/schema"),
        None,
    )
    .await;
    assert_eq!(
        (st, v["version"].as_u64(), v["type"].as_str()),
        (200, Some(1), Some("AVRO")),
        "{v}"
    );
    let (st, v) = admin(
        broker,
        reqwest::Method::GET,
        &format!("{base}/schema/0"),
        None,
    )
    .await;
    assert_eq!((st, v["version"].as_u64()), (200, Some(0)), "{v}");
    let (st, v) = admin(
        broker,
        reqwest::Method::GET,
        &format!("{base}/schemas"),
        None,
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(
        v["getSchemaResponses"].as_array().map(Vec::len),
        Some(2),
        "{v}"
    );
    let changed_type = serde_json::json!({
        "type": "AVRO",
        "schema": r#"{"type":"record","name":"Raw","fields":[{"name":"a","type":"int"}]}"#,
        "properties": {}
    });
    let post = |body| {
        admin(
            broker,
            reqwest::Method::POST,
            "/admin/v2/schemas/public/default/schemas-raw/schema",
            Some(body),
        )
    };
    let (st, v) = post(changed_type.clone()).await;
    assert_eq!(st, 409, "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("incompatible"),
        "{v}"
    );
    // ALWAYS_COMPATIBLE for the namespace: the same upload becomes version 2.
    let (st, v) = admin(
        broker,
        reqwest::Method::POST,
        "/admin/v2/namespaces/public/default/schemaCompatibilityStrategy",
        Some(serde_json::json!("ALWAYS_COMPATIBLE")),
    )
    .await;
    assert!(st == 200 || st == 204, "{st} {v}");
    let (st, v) = post(changed_type).await;
    assert_eq!(
        (st, v["version"]["version"].as_u64()),
        (200, Some(2)),
        "{v}"
    );
    let (st, v) = admin(
        broker,
        reqwest::Method::DELETE,
        &format!("{base}/schema"),
        None,
    )
    .await;
    assert_eq!(
        (st, v["version"]["version"].as_u64()),
        (200, Some(2)),
        "{v}"
    );
    let (st, _) = admin(
        broker,
        reqwest::Method::GET,
        &format!("{base}/schema"),
        None,
    )
    .await;
    assert_eq!(st, 404);
    let (st, _) = admin(
        broker,
        reqwest::Method::GET,
        "/admin/v2/schemas/public/nope/t/schema",
        None,
    )
    .await;
    assert_eq!(st, 404);
    // Deleting a topic takes its schema with it.
    let json_schema = "/admin/v2/schemas/public/default/schemas-json/schema";
    let (st, _) = admin(broker, reqwest::Method::GET, json_schema, None).await;
    assert_eq!(st, 200);
    let (st, v) = admin(
        broker,
        reqwest::Method::DELETE,
        "/admin/v2/persistent/public/default/schemas-json?force=true",
        None,
    )
    .await;
    assert!(st == 200 || st == 204, "{st} {v}");
    let (st, _) = admin(broker, reqwest::Method::GET, json_schema, None).await;
    assert_eq!(st, 404);
}
