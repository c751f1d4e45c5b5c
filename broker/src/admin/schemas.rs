//! `/admin/v2/schemas/{tenant}/{namespace}/{topic}/...`: Pulsar's schema
//! admin endpoints over the schema registry ([`crate::schema`]): get the
//! latest or one version, list every version, upload (checked against the
//! namespace strategy like a producer's schema), delete.
//!
//! Shapes (Pulsar's): a version is `{"version", "type", "timestamp", "data",
//! "properties"}`; upload takes `{"type", "schema", "properties"}` and
//! answers `{"version": {"version": N}}`; an incompatible upload is 409 with
//! the reason; a topic without a schema is 404.

use std::collections::BTreeMap;

use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::admin::{AdminError, AdminResult, Body, Params, St, names, ok_json};
use crate::schema::{SchemaData, SchemaError, SchemaVersion, Settings, registry, type_number};
use crate::service::BrokerState;
use crate::topic_name::TopicName;

fn admin_error(e: SchemaError) -> AdminError {
    match e {
        SchemaError::Incompatible(_) => AdminError::Conflict(e.to_string()),
        SchemaError::Invalid(m) => AdminError::BadRequest(m),
        SchemaError::NotFound(m) => AdminError::NotFound(m),
        SchemaError::Metadata(m) => AdminError::Unavailable(m),
    }
}

/// The topic of the path; 404 when its namespace does not exist.
async fn topic(s: &BrokerState, p: &Params) -> Result<TopicName, AdminError> {
    let t = p.get("tenant")?;
    let ns = p.get("namespace")?;
    let local = p.get("topic")?;
    names::check("tenant", t)?;
    names::check("namespace", ns)?;
    let name = TopicName::parse(&format!("persistent://{t}/{ns}/{local}"))
        .map_err(|e| AdminError::BadRequest(e.to_string()))?;
    match crate::tenancy::namespace_policies(&*s.store, &s.layout, t, ns).await {
        Ok(Some(_)) => Ok(name),
        Ok(None) => Err(AdminError::NotFound(format!(
            "namespace {t}/{ns} does not exist"
        ))),
        Err(e) => Err(AdminError::Unavailable(e.to_string())),
    }
}

fn version_json(v: &SchemaVersion) -> Value {
    let data = match &v.schema.data {
        Some(d) => d.clone(),
        None => v.schema.data_hex.clone().unwrap_or_default(),
    };
    json!({
        "version": v.version,
        "type": v.schema.type_name,
        "timestamp": v.timestamp_ms,
        "data": data,
        "properties": v.schema.properties,
    })
}

/// `GET .../schema`: the latest version.
pub async fn get_latest(State(s): St, p: Params) -> AdminResult {
    let t = topic(&s, &p).await?;
    let v = registry::get(&*s.store, &s.layout, &t, None)
        .await
        .map_err(admin_error)?;
    Ok(ok_json(version_json(&v)))
}

/// `GET .../schema/{version}`.
pub async fn get_version(State(s): St, p: Params) -> AdminResult {
    let t = topic(&s, &p).await?;
    let raw = p.get("version")?;
    let version: u64 = raw.parse().map_err(|_| {
        AdminError::BadRequest(format!("schema version must be a number, got {raw:?}"))
    })?;
    let v = registry::get(&*s.store, &s.layout, &t, Some(version))
        .await
        .map_err(admin_error)?;
    Ok(ok_json(version_json(&v)))
}

/// `GET .../schemas`: every live version, oldest first.
pub async fn get_all(State(s): St, p: Params) -> AdminResult {
    let t = topic(&s, &p).await?;
    let h = registry::load(&*s.store, &s.layout, &t)
        .await
        .map_err(admin_error)?
        .map(|(h, _)| h)
        .unwrap_or_default();
    let list: Vec<Value> = h.versions.iter().map(version_json).collect();
    Ok(ok_json(json!({ "getSchemaResponses": list })))
}

#[derive(Debug, Deserialize)]
struct Upload {
    #[serde(rename = "type")]
    type_name: String,
    #[serde(default)]
    schema: String,
    #[serde(default)]
    properties: BTreeMap<String, String>,
}

/// `POST .../schema`: adds a version if the namespace strategy accepts it.
pub async fn upload(State(s): St, p: Params, body: Body) -> AdminResult {
    let t = topic(&s, &p).await?;
    let u: Upload = body.json()?;
    let n = type_number(&u.type_name)
        .ok_or_else(|| AdminError::BadRequest(format!("unknown schema type {:?}", u.type_name)))?;
    if n == 0 {
        return Err(AdminError::BadRequest(
            "a BYTES / NONE schema is not stored; a topic without a schema accepts bytes".into(),
        ));
    }
    let data = SchemaData::new(n, u.schema.as_bytes(), u.properties).map_err(admin_error)?;
    let settings = Settings {
        allow_auto_update: true,
        ..registry::settings(&*s.store, &s.layout, &t)
            .await
            .map_err(admin_error)?
    };
    let v = registry::put(&*s.store, &s.layout, &t, &data, settings)
        .await
        .map_err(admin_error)?;
    Ok(ok_json(json!({ "version": { "version": v } })))
}

/// `DELETE .../schema`: removes every version (numbers are not reused).
pub async fn delete(State(s): St, p: Params) -> AdminResult {
    let t = topic(&s, &p).await?;
    match registry::delete(&*s.store, &s.layout, &t)
        .await
        .map_err(admin_error)?
    {
        Some(v) => Ok(ok_json(json!({ "version": { "version": v } }))),
        None => Err(AdminError::NotFound(format!("topic {t} has no schema"))),
    }
}

/// Removes the schema history of a deleted topic (its next schema starts
/// again at version 0).
pub async fn remove_with_topic(s: &BrokerState, t: &TopicName) -> Result<(), AdminError> {
    registry::remove(&*s.store, &s.layout, t)
        .await
        .map_err(admin_error)
}
