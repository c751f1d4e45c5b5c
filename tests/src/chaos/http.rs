//! HTTP control API of a [`ChaosProxy`], served by the `cms-chaos-proxy` binary so another
//! process (a test, a script) can change faults at run time.
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `GET /ready` | — | `200 ready` once the proxy listens |
//! | `GET /faults` | — | `200` [`Faults`] as JSON |
//! | `PUT /faults` | [`Faults`] as JSON (a full replacement; omitted fields are "off") | `200` the faults now in force, or `400 {"reason": ...}` (faults unchanged) |
//! | `POST /reset` | — | `200 {"reset_connections": n}`: every live connection gets RST |
//! | `GET /connections` | — | `200 {"connections": n}` |
//!
//! Promise: a request either applies completely or changes nothing.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::{ChaosProxy, Faults};

/// Answer of `POST /reset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetReply {
    /// Connections that were live and got reset.
    pub reset_connections: usize,
}

/// Answer of `GET /connections`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionsReply {
    /// Live connections.
    pub connections: usize,
}

/// Error body, shaped like the admin API's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// What was wrong with the request.
    pub reason: String,
}

/// The control routes for `proxy`.
pub fn router(proxy: Arc<ChaosProxy>) -> Router {
    Router::new()
        .route("/ready", get(|| async { "ready" }))
        .route("/faults", get(get_faults).put(put_faults))
        .route("/reset", post(reset))
        .route("/connections", get(connections))
        .with_state(proxy)
}

async fn get_faults(State(proxy): State<Arc<ChaosProxy>>) -> Json<Faults> {
    Json(proxy.faults())
}

async fn put_faults(
    State(proxy): State<Arc<ChaosProxy>>,
    body: Result<Json<Faults>, JsonRejection>,
) -> Response {
    let faults = match body {
        Ok(Json(faults)) => faults,
        Err(rejection) => return bad_request(rejection.body_text()),
    };
    match proxy.set_faults(faults) {
        Ok(()) => Json(proxy.faults()).into_response(),
        Err(e) => bad_request(e.to_string()),
    }
}

async fn reset(State(proxy): State<Arc<ChaosProxy>>) -> Json<ResetReply> {
    Json(ResetReply {
        reset_connections: proxy.reset_all(),
    })
}

async fn connections(State(proxy): State<Arc<ChaosProxy>>) -> Json<ConnectionsReply> {
    Json(ConnectionsReply {
        connections: proxy.connections(),
    })
}

fn bad_request(reason: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(ErrorReply { reason })).into_response()
}
