//! The bookie's HTTP port (axum): `/health` (the process answers), `/ready`
//! (registered and writable), `/metrics` (Prometheus text), `GET|PUT
//! /admin/readonly` (the operator's read-only switch), and — only with
//! `fault_injection` (tests) — `POST /test/power-cut` and
//! `POST /test/fail-next-sync`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prometheus::{Encoder, Registry, TextEncoder};

use super::core::{BookieCore, BookieMode};
use crate::fs::FaultyFs;

/// What the HTTP handlers read.
#[derive(Debug, Clone)]
pub struct HttpState {
    /// The request logic (mode).
    pub core: Arc<BookieCore>,
    /// Set once the bookie is registered in the metadata store.
    pub registered: Arc<AtomicBool>,
    /// Every metric of the process.
    pub registry: Registry,
    /// The fault-injecting file system, when enabled.
    pub faults: Option<FaultyFs>,
}

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

async fn ready(State(s): State<HttpState>) -> Response {
    let registered = s.registered.load(Ordering::Acquire);
    let mode = s.core.mode();
    let writable = mode == BookieMode::Writable;
    let body = serde_json::json!({
        "registered": registered,
        "writable": writable,
        "mode": format!("{mode:?}"),
    });
    if registered && writable {
        json(StatusCode::OK, body)
    } else {
        json(StatusCode::SERVICE_UNAVAILABLE, body)
    }
}

async fn metrics(State(s): State<HttpState>) -> Response {
    metrics_response(&s.registry)
}

/// Every metric of `registry` as Prometheus text (a JSON 500 if encoding fails).
pub fn metrics_response(registry: &Registry) -> Response {
    let mut buf = Vec::new();
    match TextEncoder::new().encode(&registry.gather(), &mut buf) {
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

async fn power_cut(State(s): State<HttpState>) -> Response {
    let Some(faults) = s.faults else {
        return json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"reason": "fault injection is not enabled"}),
        );
    };
    tracing::warn!("TEST: power cut: unsynced writes discarded, process aborts");
    faults.power_cut();
    // The machine is off: nothing may run after this.
    std::process::abort();
}

async fn fail_next_sync(State(s): State<HttpState>) -> Response {
    let Some(faults) = s.faults else {
        return json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"reason": "fault injection is not enabled"}),
        );
    };
    tracing::warn!("TEST: the next fdatasync fails");
    faults.fail_next_sync();
    json(StatusCode::OK, serde_json::json!({"armed": true}))
}

/// Body of `PUT /admin/readonly`.
#[derive(Debug, serde::Deserialize)]
struct ReadOnlyRequest {
    readonly: bool,
}

/// `GET /admin/readonly`: the operator switch and the mode.
async fn readonly_get(State(s): State<HttpState>) -> Response {
    let mode = s.core.mode();
    json(
        StatusCode::OK,
        serde_json::json!({
            "readonly": mode != BookieMode::Writable,
            "manual": mode == BookieMode::ReadOnlyManual,
            "mode": format!("{mode:?}"),
        }),
    )
}

/// `PUT /admin/readonly` with `{"readonly": true|false}`: the operator's
/// read-only switch (`cms-bookie readonly <id> on|off`). The registration
/// moves between `available/` and `readonly/` on the disk watch's next tick.
async fn readonly_put(
    State(s): State<HttpState>,
    body: Result<axum::Json<ReadOnlyRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let req = match body {
        Ok(axum::Json(r)) => r,
        Err(e) => {
            return json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"reason": format!("expected {{\"readonly\": true|false}}: {e}")}),
            );
        }
    };
    match s.core.set_manual_read_only(req.readonly) {
        Ok(mode) => {
            tracing::warn!(readonly = req.readonly, ?mode, "operator read-only switch");
            json(
                StatusCode::OK,
                serde_json::json!({"readonly": mode != BookieMode::Writable, "mode": format!("{mode:?}")}),
            )
        }
        Err(mode) => json(
            StatusCode::CONFLICT,
            serde_json::json!({"reason": format!("the bookie is {mode:?}; that mode is final")}),
        ),
    }
}

/// The router of a process that runs autorecovery alone
/// (`cms-bookie autorecovery`): `/health` and `/metrics` of `registry`.
pub fn autorecovery_router(registry: Registry) -> Router {
    Router::new().route("/health", get(health)).route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            async move { metrics_response(&registry) }
        }),
    )
}

/// The router.
pub fn router(state: HttpState) -> Router {
    let mut r = Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/admin/readonly", get(readonly_get).put(readonly_put));
    if state.faults.is_some() {
        r = r
            .route("/test/power-cut", post(power_cut))
            .route("/test/fail-next-sync", post(fail_next_sync));
    }
    r.with_state(state)
}
