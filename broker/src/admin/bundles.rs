//! Namespace bundles over REST (Pulsar's paths): `GET
//! /namespaces/{t}/{ns}/bundles` (the stored layout, Pulsar's
//! `{boundaries, numBundles}`), `PUT /namespaces/{t}/{ns}/{bundle}/split`
//! (`unload`, `splitAlgorithmName=range_equally_divide`), `PUT
//! /namespaces/{t}/{ns}/{bundle}/unload` and `PUT
//! /namespaces/{t}/{ns}/unload`.
//!
//! Promises: a split or a bundle unload of a bundle another broker owns
//! answers 307 to that broker (the same path), so the owner does it; an
//! unowned bundle is taken by the broker asked before a split, and has
//! nothing to unload (204). A namespace unload unloads the bundles owned
//! here and forwards one bundle unload to each other owner (the caller's
//! `Authorization` header travels with it); any failure is reported (503
//! naming the bundles), never silently dropped. A bundle that is not one of
//! the namespace's bundles is 404, a malformed one 400, an unsplittable one
//! (too narrow, or the namespace at the bundle bound) 412.

use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use serde_json::json;
use tracing::info;

use crate::admin::namespaces::{ns_params, read_policies};
use crate::admin::{AdminError, AdminResult, Params, QueryParams, St, no_content, ok_json};
use crate::ownership::bundles::{BUNDLES_MAX, BundleRange};
use crate::ownership::{BundleKey, OwnershipError, SplitOutcome};
use crate::service::BrokerState;

/// Bound of one forwarded bundle unload, in milliseconds (closing a
/// bundle's topics persists their cursors).
const FORWARD_TIMEOUT_MS: u64 = 30_000;

/// The only split algorithm (Pulsar's default name for it).
const SPLIT_ALGORITHM: &str = "range_equally_divide";

/// The admin answer to an ownership failure.
pub(crate) fn own_err(e: OwnershipError) -> AdminError {
    match e {
        OwnershipError::NoNamespace(ns) => {
            AdminError::NotFound(format!("namespace {ns} does not exist"))
        }
        OwnershipError::NoBundle(m) => AdminError::NotFound(m),
        OwnershipError::Refused(m) => AdminError::PreconditionFailed(m),
        OwnershipError::BadPolicy { .. } => AdminError::Internal(e.to_string()),
        OwnershipError::Metadata(_) | OwnershipError::Unavailable(_) => {
            AdminError::Unavailable(e.to_string())
        }
    }
}

/// The namespace and bundle of the path; 404 for an absent namespace, 400
/// for a malformed bundle name.
async fn bundle_params(s: &BrokerState, p: &Params) -> Result<BundleKey, AdminError> {
    let (tenant, namespace) = ns_params(p)?;
    read_policies(s, &tenant, &namespace).await?;
    let range =
        BundleRange::parse(p.get("bundle")?).map_err(|e| AdminError::BadRequest(e.to_string()))?;
    Ok(BundleKey {
        tenant,
        namespace,
        range,
    })
}

/// `GET /namespaces/{tenant}/{namespace}/bundles`.
pub async fn get(State(s): St, p: Params) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    read_policies(&s, &t, &ns).await?;
    let b = s.ownership.stored_bundles(&t, &ns).await.map_err(own_err)?;
    Ok(ok_json(json!({
        "boundaries": b.boundaries(),
        "numBundles": b.ranges().len(),
    })))
}

/// `PUT /namespaces/{tenant}/{namespace}/{bundle}/split`.
pub async fn split(State(s): St, p: Params, q: QueryParams) -> AdminResult {
    let key = bundle_params(&s, &p).await?;
    let unload = q.flag("unload")?;
    if let Some(alg) = q.0.get("splitAlgorithmName")
        && alg != SPLIT_ALGORITHM
    {
        return Err(AdminError::PreconditionFailed(format!(
            "split algorithm {alg:?} is not supported; the only one is {SPLIT_ALGORITHM}"
        )));
    }
    let stored = s
        .ownership
        .stored_bundles(&key.tenant, &key.namespace)
        .await
        .map_err(own_err)?;
    if !stored.contains_range(&key.range) {
        return Err(AdminError::NotFound(format!(
            "bundle {} is not a bundle of namespace {}/{} (its bundles: {})",
            key.range,
            key.tenant,
            key.namespace,
            stored.boundaries().join(",")
        )));
    }
    match s
        .ownership
        .split_bundle(&key, unload, BUNDLES_MAX)
        .await
        .map_err(own_err)?
    {
        SplitOutcome::Split(a, b) => {
            info!(tenant = %key.tenant, namespace = %key.namespace, bundle = %key.range, %a, %b, unload, "bundle split by admin");
            Ok(no_content())
        }
        SplitOutcome::OwnedBy(http, https) => Err(AdminError::Redirect(http, https)),
    }
}

/// `PUT /namespaces/{tenant}/{namespace}/{bundle}/unload`.
pub async fn unload_bundle(State(s): St, p: Params) -> AdminResult {
    let key = bundle_params(&s, &p).await?;
    let owners = s
        .ownership
        .bundle_owners(&key.tenant, &key.namespace)
        .await
        .map_err(own_err)?;
    let Some((_, owner)) = owners.into_iter().find(|(r, _)| *r == key.range) else {
        return Err(AdminError::NotFound(format!(
            "bundle {} is not a bundle of namespace {}/{}",
            key.range, key.tenant, key.namespace
        )));
    };
    match owner {
        Some(o) if s.ownership.enabled() && o.broker_id != s.ownership.broker_id() => {
            Err(AdminError::Redirect(o.http_url, o.http_url_tls))
        }
        Some(_) => {
            s.ownership
                .unload_bundle(&key, "unloaded by admin")
                .await
                .map_err(own_err)?;
            Ok(no_content())
        }
        // Not owned by anyone: nothing is loaded anywhere.
        None => Ok(no_content()),
    }
}

/// `PUT /namespaces/{tenant}/{namespace}/unload`: every bundle, wherever
/// it is owned.
pub async fn unload_namespace(State(s): St, p: Params, headers: HeaderMap) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    read_policies(&s, &t, &ns).await?;
    let owners = s.ownership.bundle_owners(&t, &ns).await.map_err(own_err)?;
    let mut failed = Vec::new();
    let mut http: Option<reqwest::Client> = None;
    for (range, owner) in owners {
        let key = BundleKey {
            tenant: t.clone(),
            namespace: ns.clone(),
            range,
        };
        match owner {
            None => {}
            Some(o) if !s.ownership.enabled() || o.broker_id == s.ownership.broker_id() => {
                if let Err(e) = s
                    .ownership
                    .unload_bundle(&key, "namespace unloaded by admin")
                    .await
                {
                    failed.push(format!("{range}: {e}"));
                }
            }
            Some(o) => {
                let base = if o.http_url.is_empty() {
                    o.http_url_tls.clone().unwrap_or_default()
                } else {
                    o.http_url.clone()
                };
                let url = format!(
                    "{}/admin/v2/namespaces/{t}/{ns}/{range}/unload",
                    base.trim_end_matches('/')
                );
                if http.is_none() {
                    http = Some(
                        reqwest::Client::builder()
                            .no_proxy()
                            .timeout(Duration::from_millis(FORWARD_TIMEOUT_MS))
                            .redirect(reqwest::redirect::Policy::none())
                            .build()
                            .map_err(|e| AdminError::Internal(format!("HTTP client: {e}")))?,
                    );
                }
                let Some(client) = http.as_ref() else {
                    continue;
                };
                let mut req = client.put(&url);
                if let Some(a) = headers.get(axum::http::header::AUTHORIZATION) {
                    req = req.header(reqwest::header::AUTHORIZATION, a.as_bytes());
                }
                match req.send().await {
                    // 307: it moved again meanwhile; its new owner unloads
                    // it when asked, and a moved bundle is unloaded enough.
                    Ok(r) if r.status().is_success() || r.status().as_u16() == 307 => {}
                    Ok(r) => {
                        failed.push(format!("{range} on {}: HTTP {}", o.broker_id, r.status()))
                    }
                    Err(e) => failed.push(format!("{range} on {}: {e}", o.broker_id)),
                }
            }
        }
    }
    if failed.is_empty() {
        Ok(no_content())
    } else {
        Err(AdminError::Unavailable(format!(
            "namespace {t}/{ns}: {} bundle(s) not unloaded: {}",
            failed.len(),
            failed.join("; ")
        )))
    }
}
