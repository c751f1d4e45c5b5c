//! Authentication and authorization of every admin call: one middleware on
//! the route table that reads `Authorization: Bearer <token>`, derives what
//! the matched route needs ([`need`], a pure function of method and path
//! template, so no route escapes it) and checks the role against it.
//!
//! Promise: with authentication on, a call without valid credentials
//! answers 401 and a call the role may not make answers 403, both JSON
//! `{"reason": ...}`, before the handler runs; only `GET
//! /admin/v2/openapi.json` is public. With authentication off every call
//! passes as before.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;

use crate::admin::json_response;
use crate::auth::{Authenticator, TopicOp};
use crate::service::BrokerState;
use crate::topic_name::TopicName;

/// What a route needs from the caller's role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Nothing (no credentials needed).
    Public,
    /// Valid credentials, any role.
    Authenticated,
    /// A superuser role.
    Superuser,
    /// A superuser or an admin of the path's `{tenant}`.
    TenantAdmin,
    /// A grant on the path's topic (or tenant admin / superuser).
    Topic(TopicNeed),
}

/// The kind of topic grant a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicNeed {
    /// Produce or consume (stats, metadata, schema reads).
    Lookup,
    /// Produce (schema upload).
    Produce,
    /// Consume (subscription listing and subscription operations; the
    /// path's `{subscription}` is checked against subscription restrictions).
    Consume,
}

/// What `method path_template` needs. Pure; every route of
/// [`crate::admin::ROUTE_LIST`] is classified.
pub fn need(method: &str, template: &str) -> Need {
    let rest = template.strip_prefix("/admin/v2/").unwrap_or(template);
    let mut seg = rest.split('/');
    let first = seg.next().unwrap_or_default();
    match first {
        "openapi.json" => Need::Public,
        "clusters" => Need::Authenticated,
        "brokers" | "bookies" | "ledgers" => Need::Superuser,
        "tenants" => {
            if method == "GET" && rest.contains("{tenant}") {
                Need::TenantAdmin
            } else {
                Need::Superuser
            }
        }
        // Moving bundles between brokers is the operator's (as Pulsar).
        "namespaces"
            if method == "PUT" && (rest.ends_with("/split") || rest.ends_with("/unload")) =>
        {
            Need::Superuser
        }
        "namespaces" | "queues" => Need::TenantAdmin,
        "schemas" => match method {
            "GET" => Need::Topic(TopicNeed::Lookup),
            "POST" => Need::Topic(TopicNeed::Produce),
            _ => Need::TenantAdmin,
        },
        "{domain}" => {
            // {domain}/{tenant}/{namespace}/{topic}/<what>...
            let parts: Vec<&str> = rest.split('/').collect();
            let what = parts.get(4).copied().unwrap_or_default();
            if parts.len() <= 4 || (parts.len() == 4 && parts[3] == "partitioned") {
                return Need::TenantAdmin;
            }
            match (method, what) {
                (
                    "GET",
                    "partitions" | "stats" | "partitioned-stats" | "internalStats"
                    | "lastMessageId",
                ) => Need::Topic(TopicNeed::Lookup),
                ("GET", "subscriptions") => Need::Topic(TopicNeed::Consume),
                (_, "subscription" | "all_subscription") => Need::Topic(TopicNeed::Consume),
                _ => Need::TenantAdmin,
            }
        }
        _ => Need::Superuser,
    }
}

fn deny(status: StatusCode, reason: impl Into<String>) -> Response {
    json_response(status, &serde_json::json!({ "reason": reason.into() }))
}

/// Authenticates `headers` and authorizes `op` on `name` (for HTTP routes
/// outside the admin table, such as the HTTP lookup); Err(the 401 / 403).
pub async fn authorize_topic(
    state: &BrokerState,
    headers: &axum::http::HeaderMap,
    name: &TopicName,
    op: &TopicOp,
) -> Result<(), Response> {
    let Some(auth) = state.auth.clone() else {
        return Ok(());
    };
    let Some(token) = bearer(headers) else {
        return Err(deny(
            StatusCode::UNAUTHORIZED,
            "authentication required: send Authorization: Bearer <token>",
        ));
    };
    let role = auth
        .authenticate(&token)
        .map_err(|e| deny(StatusCode::UNAUTHORIZED, e.to_string()))?
        .role;
    crate::auth::check_topic(state, &auth, &role, name, op)
        .await
        .map_err(|reason| deny(StatusCode::FORBIDDEN, reason))
}

/// The bearer token of a request, if any.
fn bearer(headers: &axum::http::HeaderMap) -> Option<String> {
    let v = headers.get(axum::http::header::AUTHORIZATION)?;
    let v = v.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

/// The middleware.
pub async fn layer(State(state): State<Arc<BrokerState>>, req: Request, next: Next) -> Response {
    let Some(auth) = state.auth.clone() else {
        return next.run(req).await;
    };
    let template = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(String::new, |m| m.as_str().to_string());
    let need = need(req.method().as_str(), &template);
    if need == Need::Public {
        return next.run(req).await;
    }
    let Some(token) = bearer(req.headers()) else {
        return deny(
            StatusCode::UNAUTHORIZED,
            "authentication required: send Authorization: Bearer <token>",
        );
    };
    let role = match auth.authenticate(&token) {
        Ok(id) => id.role,
        Err(e) => return deny(StatusCode::UNAUTHORIZED, e.to_string()),
    };
    let (mut parts, body) = req.into_parts();
    let params = Path::<HashMap<String, String>>::from_request_parts(&mut parts, &state)
        .await
        .map(|Path(m)| m)
        .unwrap_or_default();
    if let Err(reason) = check(&state, &auth, &role, &need, &params).await {
        tracing::info!(role = %role, route = %template, reason = %reason, "admin call denied");
        return deny(StatusCode::FORBIDDEN, reason);
    }
    next.run(Request::from_parts(parts, body)).await
}

async fn check(
    state: &BrokerState,
    auth: &Authenticator,
    role: &str,
    need: &Need,
    params: &HashMap<String, String>,
) -> Result<(), String> {
    let tenant = params.get("tenant").map(String::as_str).unwrap_or_default();
    match need {
        Need::Public | Need::Authenticated => Ok(()),
        Need::Superuser => {
            if auth.is_superuser(role) {
                Ok(())
            } else {
                Err(format!("role {role} is not a superuser"))
            }
        }
        Need::TenantAdmin => crate::auth::check_tenant_admin(state, auth, role, tenant).await,
        Need::Topic(kind) => {
            let domain = params.get("domain").map_or("persistent", String::as_str);
            let ns = params
                .get("namespace")
                .map(String::as_str)
                .unwrap_or_default();
            let local = params
                .get("topic")
                .or_else(|| params.get("queue"))
                .map(String::as_str)
                .unwrap_or_default();
            let name = TopicName::parse(&format!("{domain}://{tenant}/{ns}/{local}"))
                .map_err(|e| format!("bad topic name: {e}"))?;
            let op = match kind {
                TopicNeed::Lookup => TopicOp::Lookup,
                TopicNeed::Produce => TopicOp::Produce,
                TopicNeed::Consume => TopicOp::Consume {
                    subscription: params.get("subscription").cloned(),
                },
            };
            crate::auth::check_topic(state, auth, role, &name, &op).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_classified_and_only_openapi_is_public() {
        for (m, p) in crate::admin::ROUTE_LIST {
            let n = need(m, p);
            assert_eq!(n == Need::Public, *p == "/admin/v2/openapi.json", "{m} {p}");
        }
        assert_eq!(need("PUT", "/admin/v2/tenants/{tenant}"), Need::Superuser);
        assert_eq!(need("GET", "/admin/v2/tenants/{tenant}"), Need::TenantAdmin);
        assert_eq!(need("GET", "/admin/v2/tenants"), Need::Superuser);
        assert_eq!(
            need(
                "GET",
                "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/stats"
            ),
            Need::Topic(TopicNeed::Lookup)
        );
        assert_eq!(
            need("PUT", "/admin/v2/{domain}/{tenant}/{namespace}/{topic}"),
            Need::TenantAdmin
        );
        assert_eq!(
            need("GET", "/admin/v2/{domain}/{tenant}/{namespace}"),
            Need::TenantAdmin
        );
        assert_eq!(
            need(
                "POST",
                "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/permissions/{role}"
            ),
            Need::TenantAdmin
        );
    }
}
