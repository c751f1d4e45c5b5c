//! The admin REST API, Pulsar-shaped, under `/admin/v2` (DESIGN §6,
//! `reference/pulsar.md` §3): clusters, tenants, namespaces and their
//! policies, topics and subscriptions, brokers and bookies.
//!
//! Layout: this file holds the route table ([`router`], [`ROUTE_LIST`] for
//! the OpenAPI check), the error type ([`AdminError`], answered as
//! `{"reason": ...}`) and the extractors that turn axum's rejections into
//! that error; [`names`] validates names, [`store`] reads and CAS-updates
//! JSON nodes; one file per resource.
//!
//! Promises: every failure answers JSON `{"reason": ...}` with 400 / 403 /
//! 404 / 409 / 412 / 500 / 503, never a panic; a single-topic request to a
//! broker that does not own the topic answers 307 to the same path on the
//! owner; request bodies are bounded
//! ([`ADMIN_BODY_BYTES_MAX`]); every metadata update is a read-modify-CAS on
//! the node version, retried at most [`store::CAS_RETRIES_MAX`] times.

pub mod authz;
pub mod bookies;
pub mod bundles;
pub mod clusters;
pub mod names;
pub mod namespaces;
pub mod permissions;
pub mod queues;
pub mod quotas;
pub mod schemas;
pub mod store;
pub mod tenants;
pub mod topics;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, Request};
use axum::handler::Handler;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, on};
use cms_bookie::metadata::MetadataError;
use serde::de::DeserializeOwned;

use crate::service::BrokerState;

/// Largest admin request body, in bytes.
pub const ADMIN_BODY_BYTES_MAX: usize = 64 * 1024;

/// The OpenAPI description of this API.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// Why an admin request failed; the status code Pulsar's admin clients
/// expect for each case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// Malformed input (400).
    #[error("{0}")]
    BadRequest(String),
    /// Not allowed (403).
    #[error("{0}")]
    Forbidden(String),
    /// No such resource (404).
    #[error("{0}")]
    NotFound(String),
    /// Exists already, or still in use (409).
    #[error("{0}")]
    Conflict(String),
    /// A precondition does not hold (412).
    #[error("{0}")]
    PreconditionFailed(String),
    /// The store or the bookies cannot serve now (503).
    #[error("{0}")]
    Unavailable(String),
    /// A bug or corrupt stored data (500).
    #[error("{0}")]
    Internal(String),
    /// Another broker owns the topic (307 to the same path there; the
    /// values are that broker's `http://host:port` and, when its HTTPS
    /// port is on, its `https://host:port`, used for requests that came
    /// over HTTPS).
    #[error("topic served by {0}")]
    Redirect(String, Option<String>),
}

impl AdminError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            AdminError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AdminError::Forbidden(_) => StatusCode::FORBIDDEN,
            AdminError::NotFound(_) => StatusCode::NOT_FOUND,
            AdminError::Conflict(_) => StatusCode::CONFLICT,
            AdminError::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            AdminError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            AdminError::Redirect(..) => StatusCode::TEMPORARY_REDIRECT,
        }
    }
}

impl From<MetadataError> for AdminError {
    fn from(e: MetadataError) -> Self {
        match e {
            MetadataError::NoNode(p) => AdminError::NotFound(format!("no node at {p}")),
            MetadataError::NodeExists(p) => AdminError::Conflict(format!("{p} already exists")),
            MetadataError::BadVersion { path, .. } => {
                AdminError::Conflict(format!("{path} was changed concurrently; retry"))
            }
            MetadataError::NotEmpty(p) => AdminError::Conflict(format!("{p} is not empty")),
            MetadataError::TooLarge { .. } | MetadataError::InvalidPath { .. } => {
                AdminError::BadRequest(e.to_string())
            }
            other => AdminError::Unavailable(format!("metadata store: {other}")),
        }
    }
}

/// Header carrying a redirect's target broker from the handler to the
/// route layer, which completes `Location` with the request's path.
const REDIRECT_BASE_HEADER: &str = "x-cms-redirect-base";
/// As [`REDIRECT_BASE_HEADER`], the target's HTTPS base (when it has one).
const REDIRECT_BASE_TLS_HEADER: &str = "x-cms-redirect-base-tls";

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let AdminError::Redirect(base, base_tls) = &self {
            let mut resp =
                json_response(status, &serde_json::json!({ "reason": self.to_string() }));
            if let Ok(v) = axum::http::HeaderValue::from_str(base) {
                resp.headers_mut().insert(REDIRECT_BASE_HEADER, v);
            }
            if let Some(t) = base_tls
                && let Ok(v) = axum::http::HeaderValue::from_str(t)
            {
                resp.headers_mut().insert(REDIRECT_BASE_TLS_HEADER, v);
            }
            return resp;
        }
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), reason = %self, "admin request failed");
        }
        json_response(status, &serde_json::json!({ "reason": self.to_string() }))
    }
}

/// A JSON response.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// 200 with a JSON body.
pub fn ok_json(body: serde_json::Value) -> Response {
    json_response(StatusCode::OK, &body)
}

/// 204, no body (Pulsar answers writes this way).
pub fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// Result of a handler.
pub type AdminResult = Result<Response, AdminError>;

/// Path parameters by name; a bad path answers 400 JSON.
#[derive(Debug)]
pub struct Params(pub HashMap<String, String>);

impl Params {
    /// The parameter `name` (always present for the routes that declare it).
    pub fn get(&self, name: &str) -> Result<&str, AdminError> {
        self.0
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| AdminError::Internal(format!("route has no parameter {name}")))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = AdminError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AdminError> {
        Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map(|Path(m)| Params(m))
            .map_err(|e| AdminError::BadRequest(format!("bad path: {e}")))
    }
}

/// Query parameters; a bad query answers 400 JSON.
#[derive(Debug, Default)]
pub struct QueryParams(pub HashMap<String, String>);

impl QueryParams {
    /// `name` as a boolean (`true` / `false`), `false` when absent.
    pub fn flag(&self, name: &str) -> Result<bool, AdminError> {
        match self.0.get(name).map(String::as_str) {
            None | Some("false") => Ok(false),
            Some("true") | Some("") => Ok(true),
            Some(other) => Err(AdminError::BadRequest(format!(
                "query parameter {name} must be true or false, got {other:?}"
            ))),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for QueryParams {
    type Rejection = AdminError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AdminError> {
        Query::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map(|Query(m)| QueryParams(m))
            .map_err(|e| AdminError::BadRequest(format!("bad query: {e}")))
    }
}

/// A request body (bounded by [`ADMIN_BODY_BYTES_MAX`]); too large or
/// unreadable answers JSON.
#[derive(Debug)]
pub struct Body(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = AdminError;
    async fn from_request(req: Request, state: &S) -> Result<Self, AdminError> {
        match Bytes::from_request(req, state).await {
            Ok(b) => Ok(Body(b)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(AdminError::BadRequest(
                format!("request body over {ADMIN_BODY_BYTES_MAX} bytes"),
            )),
            Err(e) => Err(AdminError::BadRequest(format!("bad body: {e}"))),
        }
    }
}

impl Body {
    /// Whether the body is empty (whitespace only).
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(u8::is_ascii_whitespace)
    }

    /// The body as JSON of type `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, AdminError> {
        serde_json::from_slice(&self.0)
            .map_err(|e| AdminError::BadRequest(format!("invalid JSON body: {e}")))
    }

    /// The body as JSON of type `T`, or `T::default()` when empty.
    pub fn json_or_default<T: DeserializeOwned + Default>(&self) -> Result<T, AdminError> {
        if self.is_empty() {
            Ok(T::default())
        } else {
            self.json()
        }
    }
}

/// Handler state.
pub type St = axum::extract::State<Arc<BrokerState>>;

/// Every route: `(method, path)`, as registered and as in `openapi.json`.
pub const ROUTE_LIST: &[(&str, &str)] = &[
    ("GET", "/admin/v2/openapi.json"),
    ("GET", "/admin/v2/clusters"),
    ("GET", "/admin/v2/clusters/{cluster}"),
    ("GET", "/admin/v2/brokers"),
    ("GET", "/admin/v2/brokers/health"),
    ("GET", "/admin/v2/bookies"),
    ("GET", "/admin/v2/bookies/{bookie}"),
    ("PUT", "/admin/v2/bookies/{bookie}/readonly"),
    ("POST", "/admin/v2/bookies/{bookie}/decommission"),
    ("GET", "/admin/v2/ledgers/underreplicated"),
    ("GET", "/admin/v2/ledgers/{ledger}"),
    ("GET", "/admin/v2/tenants"),
    ("GET", "/admin/v2/tenants/{tenant}"),
    ("PUT", "/admin/v2/tenants/{tenant}"),
    ("POST", "/admin/v2/tenants/{tenant}"),
    ("DELETE", "/admin/v2/tenants/{tenant}"),
    ("GET", "/admin/v2/tenants/{tenant}/quotas"),
    ("POST", "/admin/v2/tenants/{tenant}/quotas"),
    ("DELETE", "/admin/v2/tenants/{tenant}/quotas"),
    ("GET", "/admin/v2/tenants/{tenant}/quotas/usage"),
    ("GET", "/admin/v2/namespaces/{tenant}"),
    ("GET", "/admin/v2/namespaces/{tenant}/{namespace}"),
    ("PUT", "/admin/v2/namespaces/{tenant}/{namespace}"),
    ("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}"),
    ("GET", "/admin/v2/namespaces/{tenant}/{namespace}/topics"),
    ("GET", "/admin/v2/namespaces/{tenant}/{namespace}/ownership"),
    ("GET", "/admin/v2/namespaces/{tenant}/{namespace}/bundles"),
    ("PUT", "/admin/v2/namespaces/{tenant}/{namespace}/unload"),
    (
        "PUT",
        "/admin/v2/namespaces/{tenant}/{namespace}/{bundle}/unload",
    ),
    (
        "PUT",
        "/admin/v2/namespaces/{tenant}/{namespace}/{bundle}/split",
    ),
    ("GET", "/admin/v2/namespaces/{tenant}/{namespace}/quotas"),
    ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/quotas"),
    ("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}/quotas"),
    (
        "GET",
        "/admin/v2/namespaces/{tenant}/{namespace}/quotas/usage",
    ),
    (
        "GET",
        "/admin/v2/namespaces/{tenant}/{namespace}/permissions",
    ),
    (
        "POST",
        "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}",
    ),
    (
        "DELETE",
        "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}",
    ),
    (
        "POST",
        "/admin/v2/namespaces/{tenant}/{namespace}/permissions/subscription/{subscription}",
    ),
    (
        "DELETE",
        "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{subscription}/{role}",
    ),
    (
        "GET",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/permissions",
    ),
    (
        "POST",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/permissions/{role}",
    ),
    (
        "DELETE",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/permissions/{role}",
    ),
    ("GET", "/admin/v2/namespaces/{tenant}/{namespace}/{policy}"),
    ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/{policy}"),
    (
        "DELETE",
        "/admin/v2/namespaces/{tenant}/{namespace}/{policy}",
    ),
    ("GET", "/admin/v2/queues/{tenant}/{namespace}"),
    ("GET", "/admin/v2/queues/{tenant}/{namespace}/{queue}"),
    ("PUT", "/admin/v2/queues/{tenant}/{namespace}/{queue}"),
    ("DELETE", "/admin/v2/queues/{tenant}/{namespace}/{queue}"),
    ("GET", "/admin/v2/queues/{tenant}/{namespace}/{queue}/stats"),
    (
        "POST",
        "/admin/v2/queues/{tenant}/{namespace}/{queue}/purge",
    ),
    (
        "GET",
        "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema",
    ),
    (
        "POST",
        "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema",
    ),
    (
        "DELETE",
        "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema",
    ),
    (
        "GET",
        "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema/{version}",
    ),
    (
        "GET",
        "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schemas",
    ),
    ("GET", "/admin/v2/{domain}/{tenant}/{namespace}"),
    ("GET", "/admin/v2/{domain}/{tenant}/{namespace}/partitioned"),
    ("PUT", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}"),
    ("DELETE", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}"),
    (
        "PUT",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions",
    ),
    (
        "POST",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions",
    ),
    (
        "GET",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions",
    ),
    (
        "DELETE",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions",
    ),
    (
        "GET",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/stats",
    ),
    (
        "GET",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/internalStats",
    ),
    (
        "GET",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscriptions",
    ),
    (
        "PUT",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/unload",
    ),
    (
        "PUT",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}",
    ),
    (
        "DELETE",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}",
    ),
    (
        "POST",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/skip_all",
    ),
    (
        "POST",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/resetcursor/{timestamp}",
    ),
    (
        "POST",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/resetcursor",
    ),
    (
        "POST",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/skip/{count}",
    ),
    (
        "GET",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/position/{position}",
    ),
    (
        "POST",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/all_subscription/expireMessages/{seconds}",
    ),
    (
        "GET",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitioned-stats",
    ),
    (
        "GET",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/lastMessageId",
    ),
    (
        "POST",
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/expireMessages/{seconds}",
    ),
];

fn method_filter(m: &str) -> MethodFilter {
    match m {
        "GET" => MethodFilter::GET,
        "PUT" => MethodFilter::PUT,
        "POST" => MethodFilter::POST,
        "DELETE" => MethodFilter::DELETE,
        other => panic!("route table names unknown method {other}"),
    }
}

/// The route table under construction: refuses (in debug and tests) a route
/// missing from [`ROUTE_LIST`], so the list, the router and `openapi.json`
/// cannot drift apart unnoticed.
struct Table {
    router: Router<Arc<BrokerState>>,
    added: Vec<(&'static str, &'static str)>,
}

impl Table {
    fn add<H, T>(mut self, method: &'static str, path: &'static str, h: H) -> Self
    where
        H: Handler<T, Arc<BrokerState>>,
        T: 'static,
    {
        debug_assert!(
            ROUTE_LIST.contains(&(method, path)),
            "{method} {path} missing from ROUTE_LIST"
        );
        self.added.push((method, path));
        self.router = self.router.route(path, on(method_filter(method), h));
        self
    }
}

async fn openapi() -> Response {
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI_JSON,
    )
        .into_response()
}

fn table() -> Table {
    use bookies as bk;
    use bundles as bu;
    use clusters as c;
    use namespaces as n;
    use permissions as pm;
    use queues as q;
    use quotas as qt;
    use schemas as sc;
    use tenants as t;
    use topics as tp;
    Table {
        router: Router::new(),
        added: Vec::new(),
    }
    .add("GET", "/admin/v2/openapi.json", openapi)
    .add("GET", "/admin/v2/clusters", c::list_clusters)
    .add("GET", "/admin/v2/clusters/{cluster}", c::get_cluster)
    .add("GET", "/admin/v2/brokers", c::list_brokers)
    .add("GET", "/admin/v2/brokers/health", c::broker_health)
    .add("GET", "/admin/v2/bookies", bk::list)
    .add("GET", "/admin/v2/bookies/{bookie}", bk::get)
    .add("PUT", "/admin/v2/bookies/{bookie}/readonly", bk::set_readonly)
    .add("POST", "/admin/v2/bookies/{bookie}/decommission", bk::decommission)
    .add("GET", "/admin/v2/ledgers/underreplicated", bk::underreplicated)
    .add("GET", "/admin/v2/ledgers/{ledger}", bk::ledger)
    .add("GET", "/admin/v2/tenants", t::list)
    .add("GET", "/admin/v2/tenants/{tenant}", t::get)
    .add("PUT", "/admin/v2/tenants/{tenant}", t::create)
    .add("POST", "/admin/v2/tenants/{tenant}", t::update)
    .add("DELETE", "/admin/v2/tenants/{tenant}", t::delete)
    .add("GET", "/admin/v2/tenants/{tenant}/quotas", qt::get_tenant)
    .add("POST", "/admin/v2/tenants/{tenant}/quotas", qt::set_tenant)
    .add("DELETE", "/admin/v2/tenants/{tenant}/quotas", qt::delete_tenant)
    .add("GET", "/admin/v2/tenants/{tenant}/quotas/usage", qt::tenant_usage)
    .add("GET", "/admin/v2/namespaces/{tenant}", n::list)
    .add("GET", "/admin/v2/namespaces/{tenant}/{namespace}", n::get)
    .add("PUT", "/admin/v2/namespaces/{tenant}/{namespace}", n::create)
    .add("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}", n::delete)
    .add("GET", "/admin/v2/namespaces/{tenant}/{namespace}/topics", n::topics)
    .add("GET", "/admin/v2/namespaces/{tenant}/{namespace}/ownership", n::ownership)
    .add("GET", "/admin/v2/namespaces/{tenant}/{namespace}/bundles", bu::get)
    .add("PUT", "/admin/v2/namespaces/{tenant}/{namespace}/unload", bu::unload_namespace)
    .add("PUT", "/admin/v2/namespaces/{tenant}/{namespace}/{bundle}/unload", bu::unload_bundle)
    .add("PUT", "/admin/v2/namespaces/{tenant}/{namespace}/{bundle}/split", bu::split)
    .add("GET", "/admin/v2/namespaces/{tenant}/{namespace}/quotas", qt::get_namespace)
    .add("POST", "/admin/v2/namespaces/{tenant}/{namespace}/quotas", qt::set_namespace)
    .add("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}/quotas", qt::delete_namespace)
    .add("GET", "/admin/v2/namespaces/{tenant}/{namespace}/quotas/usage", qt::namespace_usage)
    .add("GET", "/admin/v2/namespaces/{tenant}/{namespace}/permissions", pm::ns_get)
    .add("POST", "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}", pm::ns_grant)
    .add("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}", pm::ns_revoke)
    .add("POST", "/admin/v2/namespaces/{tenant}/{namespace}/permissions/subscription/{subscription}", pm::sub_grant)
    .add("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{subscription}/{role}", pm::sub_revoke)
    .add("GET", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/permissions", pm::topic_get)
    .add("POST", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/permissions/{role}", pm::topic_grant)
    .add("DELETE", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/permissions/{role}", pm::topic_revoke)
    .add("GET", "/admin/v2/namespaces/{tenant}/{namespace}/{policy}", n::get_policy)
    .add("POST", "/admin/v2/namespaces/{tenant}/{namespace}/{policy}", n::set_policy)
    .add("DELETE", "/admin/v2/namespaces/{tenant}/{namespace}/{policy}", n::clear_policy)
    .add("GET", "/admin/v2/queues/{tenant}/{namespace}", q::list)
    .add("GET", "/admin/v2/queues/{tenant}/{namespace}/{queue}", q::get)
    .add("PUT", "/admin/v2/queues/{tenant}/{namespace}/{queue}", q::create)
    .add("DELETE", "/admin/v2/queues/{tenant}/{namespace}/{queue}", q::delete)
    .add("GET", "/admin/v2/queues/{tenant}/{namespace}/{queue}/stats", q::stats)
    .add("POST", "/admin/v2/queues/{tenant}/{namespace}/{queue}/purge", q::purge)
    .add("GET", "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema", sc::get_latest)
    .add("POST", "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema", sc::upload)
    .add("DELETE", "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema", sc::delete)
    .add("GET", "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema/{version}", sc::get_version)
    .add("GET", "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schemas", sc::get_all)
    .add("GET", "/admin/v2/{domain}/{tenant}/{namespace}", tp::list)
    .add("GET", "/admin/v2/{domain}/{tenant}/{namespace}/partitioned", tp::list_partitioned)
    .add("PUT", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}", tp::create)
    .add("DELETE", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}", tp::delete)
    .add("PUT", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions", tp::create_partitioned)
    .add("POST", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions", tp::update_partitioned)
    .add("GET", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions", tp::get_partitioned)
    .add("DELETE", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions", tp::delete_partitioned)
    .add("GET", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/stats", tp::stats)
    .add("GET", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitioned-stats", tp::partitioned_stats)
    .add("GET", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/lastMessageId", tp::last_message_id)
    .add("GET", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/internalStats", tp::internal_stats)
    .add("GET", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscriptions", tp::subscriptions)
    .add("PUT", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/unload", tp::unload)
    .add("PUT", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}", tp::create_subscription)
    .add("DELETE", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}", tp::delete_subscription)
    .add("POST", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/skip_all", tp::skip_all)
    .add("POST", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/resetcursor/{timestamp}", tp::reset_cursor_time)
    .add("POST", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/resetcursor", tp::reset_cursor_id)
    .add("POST", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/skip/{count}", tp::skip)
    .add("GET", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/position/{position}", tp::peek)
    .add("POST", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/all_subscription/expireMessages/{seconds}", tp::expire_all)
    .add("POST", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}/expireMessages/{seconds}", tp::expire)
}

/// `cms_admin_requests_total{method, route, status}`: route is the path
/// template (bounded by the route table), registered in `registry`.
fn request_counter(registry: &prometheus::Registry) -> Option<prometheus::IntCounterVec> {
    let c = prometheus::IntCounterVec::new(
        prometheus::Opts::new(
            "cms_admin_requests_total",
            "Admin REST requests by method, route template and status code",
        ),
        &["method", "route", "status"],
    )
    .and_then(|c| registry.register(Box::new(c.clone())).map(|()| c));
    match c {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %e, "admin request metrics not registered");
            None
        }
    }
}

/// The admin routes (to merge into the broker's HTTP router), with the body
/// bound and the request counter (in `state`'s registry).
pub fn router(state: &Arc<BrokerState>) -> Router<Arc<BrokerState>> {
    let counter = request_counter(&state.registry);
    table()
        .router
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authz::layer,
        ))
        .route_layer(axum::middleware::from_fn(
            move |req: Request, next: axum::middleware::Next| {
                let counter = counter.clone();
                async move {
                    let method = req.method().as_str().to_string();
                    let path_and_query = req
                        .uri()
                        .path_and_query()
                        .map_or_else(String::new, |p| p.as_str().to_string());
                    let route = req
                        .extensions()
                        .get::<axum::extract::MatchedPath>()
                        .map_or_else(String::new, |m| m.as_str().to_string());
                    let over_tls = req.extensions().get::<crate::http::OverTls>().is_some();
                    let mut resp = next.run(req).await;
                    // A redirect to the owning broker: same path and query
                    // there, over HTTPS when the request came over HTTPS
                    // and the owner has an HTTPS port.
                    let plain = resp.headers_mut().remove(REDIRECT_BASE_HEADER);
                    let tls = resp.headers_mut().remove(REDIRECT_BASE_TLS_HEADER);
                    let target = if over_tls { tls.or(plain) } else { plain };
                    if let Some(base) = target
                        && let Ok(base) = base.to_str()
                        && let Ok(loc) = axum::http::HeaderValue::from_str(&format!(
                            "{}{path_and_query}",
                            base.trim_end_matches('/')
                        ))
                    {
                        resp.headers_mut().insert(axum::http::header::LOCATION, loc);
                    }
                    if let Some(c) = &counter {
                        c.with_label_values(&[
                            method.as_str(),
                            route.as_str(),
                            resp.status().as_str(),
                        ])
                        .inc();
                    }
                    resp
                }
            },
        ))
        .layer(DefaultBodyLimit::max(ADMIN_BODY_BYTES_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_listed_once_and_registered() {
        let t = table();
        let mut added = t.added.clone();
        added.sort();
        let mut listed = ROUTE_LIST.to_vec();
        listed.sort();
        assert_eq!(added, listed, "router and ROUTE_LIST differ");
        let mut dedup = listed.clone();
        dedup.dedup();
        assert_eq!(dedup.len(), listed.len(), "ROUTE_LIST has duplicates");
    }

    #[test]
    fn openapi_describes_exactly_the_routes() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI_JSON).expect("openapi.json");
        let mut described = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                described.push((method.to_uppercase(), path.clone()));
            }
        }
        described.sort();
        let mut listed: Vec<(String, String)> = ROUTE_LIST
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        listed.sort();
        assert_eq!(described, listed, "openapi.json and the router differ");
    }

    #[test]
    fn errors_map_to_status_codes() {
        assert_eq!(AdminError::BadRequest(String::new()).status(), 400);
        assert_eq!(AdminError::Forbidden(String::new()).status(), 403);
        assert_eq!(AdminError::NotFound(String::new()).status(), 404);
        assert_eq!(AdminError::Conflict(String::new()).status(), 409);
        assert_eq!(AdminError::PreconditionFailed(String::new()).status(), 412);
        assert_eq!(AdminError::Unavailable(String::new()).status(), 503);
        assert_eq!(
            AdminError::Redirect("http://b:8080".into(), None).status(),
            307
        );
        let r = AdminError::Redirect("http://b:8080".into(), None).into_response();
        assert_eq!(r.headers()[REDIRECT_BASE_HEADER], "http://b:8080");
        assert!(r.headers().get(REDIRECT_BASE_TLS_HEADER).is_none());
        let r = AdminError::Redirect("http://b:8080".into(), Some("https://b:8443".into()))
            .into_response();
        assert_eq!(r.headers()[REDIRECT_BASE_TLS_HEADER], "https://b:8443");
        assert_eq!(
            AdminError::from(MetadataError::NoNode("/x".into())).status(),
            404
        );
        assert_eq!(
            AdminError::from(MetadataError::ConnectionLoss("x".into())).status(),
            503
        );
    }
}
