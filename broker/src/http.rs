//! The broker's HTTP port (axum): `/health` (the process answers), `/ready`
//! (metadata store reachable, a writable bookie quorum, topics loadable) and
//! `/metrics` (Prometheus text), and Pulsar's HTTP lookup
//! `/lookup/v2/topic/{domain}/{tenant}/{ns}/{topic}` (200 with the owner's
//! URLs when this broker owns the topic, 307 to the owner's lookup URL with
//! `authoritative=true` otherwise, as Pulsar's `TopicLookupBase`). The admin API
//! (`/admin/v2`, see [`crate::admin`]) is merged in.
//!
//! Promise: every handler is bounded in time (the metadata probe has a
//! deadline) and answers JSON (`{"reason": ...}` on errors) except
//! `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{Encoder, TextEncoder};

use crate::service::BrokerState;

/// Deadline of the metadata probe of `/ready`, in milliseconds.
pub const READY_PROBE_TIMEOUT_MS: u64 = 2_000;
/// Deadline of an HTTP lookup, in milliseconds.
pub const LOOKUP_TIMEOUT_MS: u64 = 10_000;

fn json(status: StatusCode, body: serde_json::Value) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn health() -> Response {
    json(StatusCode::OK, serde_json::json!({"status": "ok"}))
}

async fn ready(State(s): State<Arc<BrokerState>>) -> Response {
    let probe = tokio::time::timeout(
        Duration::from_millis(READY_PROBE_TIMEOUT_MS),
        s.store.exists(&s.layout.managed_ledgers()),
    )
    .await;
    let metadata_ok = matches!(probe, Ok(Ok(Some(_))));
    let writable = s.client.bookies().iter().filter(|b| b.writable).count();
    let needed = s.replication.ensemble;
    let bookies_ok = writable >= needed;
    let serving = s.is_serving();
    let body = serde_json::json!({
        "metadata": metadata_ok,
        "writable_bookies": writable,
        "ensemble_size": needed,
        "serving": serving,
        "topics_loaded": s.topics.loaded().len(),
    });
    if metadata_ok && bookies_ok && serving {
        json(StatusCode::OK, body)
    } else {
        json(StatusCode::SERVICE_UNAVAILABLE, body)
    }
}

async fn metrics(State(s): State<Arc<BrokerState>>) -> Response {
    let cache_bytes = s.topics.context().cache.size_bytes();
    s.metrics
        .entry_cache_bytes
        .set(i64::try_from(cache_bytes).unwrap_or(i64::MAX));
    let mut buf = Vec::new();
    match TextEncoder::new().encode(&s.registry.gather(), &mut buf) {
        Ok(()) => (
            StatusCode::OK,
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4",
            )],
            buf,
        )
            .into_response(),
        Err(e) => json(
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({"reason": e.to_string()}),
        ),
    }
}

/// Request extension of the HTTPS listener: the request came over TLS, so
/// redirects point at the target's `https://` URL when it has one.
#[derive(Debug, Clone, Copy)]
pub struct OverTls;

#[derive(Debug, serde::Deserialize)]
struct LookupQuery {
    #[serde(default)]
    authoritative: bool,
}

async fn lookup(
    State(s): State<Arc<BrokerState>>,
    Path((domain, tenant, namespace, topic)): Path<(String, String, String, String)>,
    Query(q): Query<LookupQuery>,
    over_tls: Option<axum::Extension<OverTls>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let bad =
        |status: StatusCode, reason: String| json(status, serde_json::json!({"reason": reason}));
    let full = format!("{domain}://{tenant}/{namespace}/{topic}");
    let name = match crate::topic_name::TopicName::parse(&full) {
        Ok(n) => n,
        Err(e) => return bad(StatusCode::BAD_REQUEST, e.to_string()),
    };
    if let Err(denied) =
        crate::admin::authz::authorize_topic(&s, &headers, &name, &crate::auth::TopicOp::Lookup)
            .await
    {
        return denied;
    }
    let answer = tokio::time::timeout(
        Duration::from_millis(LOOKUP_TIMEOUT_MS),
        s.ownership.lookup(&name, q.authoritative),
    )
    .await;
    use crate::ownership::{LookupAnswer, OwnershipError};
    match answer {
        Ok(Ok(LookupAnswer::Connect)) => json(
            StatusCode::OK,
            serde_json::json!({
                "brokerUrl": s.service_url,
                "brokerUrlTls": s.service_url_tls.clone().unwrap_or_default(),
                "httpUrl": s.http_url,
                "httpUrlTls": s.http_url_tls.clone().unwrap_or_default(),
                "nativeUrl": s.service_url,
            }),
        ),
        Ok(Ok(LookupAnswer::Redirect {
            http_url,
            http_url_tls,
            ..
        })) => {
            let http_url = match (over_tls, http_url_tls) {
                (Some(_), Some(https)) => https,
                _ => http_url,
            };
            let location = format!(
                "{http_url}/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}?authoritative=true"
            );
            (
                StatusCode::TEMPORARY_REDIRECT,
                [(axum::http::header::LOCATION, location)],
            )
                .into_response()
        }
        Ok(Err(e @ OwnershipError::NoNamespace(_))) => bad(StatusCode::NOT_FOUND, e.to_string()),
        Ok(Err(e @ OwnershipError::BadPolicy { .. })) => {
            bad(StatusCode::PRECONDITION_FAILED, e.to_string())
        }
        Ok(Err(e)) => bad(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(_) => bad(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("lookup took longer than {LOOKUP_TIMEOUT_MS} ms"),
        ),
    }
}

async fn not_found() -> Response {
    json(
        StatusCode::NOT_FOUND,
        serde_json::json!({"reason": "no such endpoint"}),
    )
}

async fn method_not_allowed() -> Response {
    json(
        StatusCode::METHOD_NOT_ALLOWED,
        serde_json::json!({"reason": "method not allowed on this endpoint"}),
    )
}

/// The HTTP router.
pub fn router(state: Arc<BrokerState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route(
            "/lookup/v2/topic/{domain}/{tenant}/{ns}/{topic}",
            get(lookup),
        )
        .merge(crate::admin::router(&state))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}
