//! `/admin/v2/tenants/{tenant}/quotas` and
//! `/admin/v2/namespaces/{tenant}/{namespace}/quotas` (docs/quotas.md):
//! get, set (POST, replaces), remove (DELETE) the quotas of a tenant (in its
//! `TenantInfo` node) or a namespace (in its policies node), and `.../usage`:
//! the cluster-wide usage in the same field names.
//!
//! Promises: GET of an unset quota answers `{}`; a bad body answers 400
//! naming the field; writes are read-modify-CAS on the node.

use axum::extract::State;
use tracing::info;

use crate::admin::namespaces::read_policies;
use crate::admin::{AdminError, AdminResult, Body, Params, St, names, no_content, ok_json, store};
use crate::quota::Quotas;
use crate::tenancy::{NamespacePolicies, TenantInfo, namespace_path, tenant_path};

fn tenant_of(p: &Params) -> Result<&str, AdminError> {
    let t = p.get("tenant")?;
    names::check("tenant", t)?;
    Ok(t)
}

fn namespace_of(p: &Params) -> Result<(&str, &str), AdminError> {
    let t = tenant_of(p)?;
    let ns = p.get("namespace")?;
    names::check("namespace", ns)?;
    Ok((t, ns))
}

fn body_quotas(body: &Body) -> Result<Quotas, AdminError> {
    let q: Quotas = body.json_or_default()?;
    q.validate().map_err(AdminError::BadRequest)?;
    Ok(q)
}

/// `GET /tenants/{tenant}/quotas`.
pub async fn get_tenant(State(s): St, p: Params) -> AdminResult {
    let t = tenant_of(&p)?;
    match store::read::<TenantInfo>(&*s.store, &tenant_path(&s.layout, t)).await? {
        Some((info, _)) => Ok(ok_json(serde_json::json!(info.quotas.unwrap_or_default()))),
        None => Err(AdminError::NotFound(format!("tenant {t} does not exist"))),
    }
}

async fn set_tenant_quotas(s: &St, t: &str, q: Option<Quotas>) -> Result<(), AdminError> {
    let State(s) = s;
    store::update::<TenantInfo, _>(
        &*s.store,
        &tenant_path(&s.layout, t),
        || format!("tenant {t} does not exist"),
        |cur| {
            cur.quotas = q.filter(|q| !q.is_empty());
            Ok(())
        },
    )
    .await?;
    Ok(())
}

/// `POST /tenants/{tenant}/quotas`: replaces the tenant's quotas.
pub async fn set_tenant(s: St, p: Params, body: Body) -> AdminResult {
    let t = tenant_of(&p)?;
    let q = body_quotas(&body)?;
    set_tenant_quotas(&s, t, Some(q)).await?;
    info!(tenant = t, quotas = ?q, "tenant quotas set");
    Ok(no_content())
}

/// `DELETE /tenants/{tenant}/quotas`.
pub async fn delete_tenant(s: St, p: Params) -> AdminResult {
    let t = tenant_of(&p)?;
    set_tenant_quotas(&s, t, None).await?;
    info!(tenant = t, "tenant quotas removed");
    Ok(no_content())
}

/// `GET /tenants/{tenant}/quotas/usage`.
pub async fn tenant_usage(State(s): St, p: Params) -> AdminResult {
    let t = tenant_of(&p)?;
    if store::read::<TenantInfo>(&*s.store, &tenant_path(&s.layout, t))
        .await?
        .is_none()
    {
        return Err(AdminError::NotFound(format!("tenant {t} does not exist")));
    }
    let u = s.quota.tenant_usage(t).await?;
    Ok(ok_json(serde_json::json!(u)))
}

/// `GET /namespaces/{tenant}/{namespace}/quotas`.
pub async fn get_namespace(State(s): St, p: Params) -> AdminResult {
    let (t, ns) = namespace_of(&p)?;
    let policies = read_policies(&s, t, ns).await?;
    Ok(ok_json(serde_json::json!(
        policies.quotas.unwrap_or_default()
    )))
}

async fn set_ns_quotas(s: &St, t: &str, ns: &str, q: Option<Quotas>) -> Result<(), AdminError> {
    let State(s) = s;
    store::update::<NamespacePolicies, _>(
        &*s.store,
        &namespace_path(&s.layout, t, ns),
        || format!("namespace {t}/{ns} does not exist"),
        |cur| {
            cur.quotas = q.filter(|q| !q.is_empty());
            Ok(())
        },
    )
    .await?;
    Ok(())
}

/// `POST /namespaces/{tenant}/{namespace}/quotas`: replaces them.
pub async fn set_namespace(s: St, p: Params, body: Body) -> AdminResult {
    let (t, ns) = namespace_of(&p)?;
    let q = body_quotas(&body)?;
    set_ns_quotas(&s, t, ns, Some(q)).await?;
    info!(tenant = t, namespace = ns, quotas = ?q, "namespace quotas set");
    Ok(no_content())
}

/// `DELETE /namespaces/{tenant}/{namespace}/quotas`.
pub async fn delete_namespace(s: St, p: Params) -> AdminResult {
    let (t, ns) = namespace_of(&p)?;
    set_ns_quotas(&s, t, ns, None).await?;
    info!(tenant = t, namespace = ns, "namespace quotas removed");
    Ok(no_content())
}

/// `GET /namespaces/{tenant}/{namespace}/quotas/usage`.
pub async fn namespace_usage(State(s): St, p: Params) -> AdminResult {
    let (t, ns) = namespace_of(&p)?;
    read_policies(&s, t, ns).await?;
    let u = s.quota.namespace_usage(t, ns).await?;
    Ok(ok_json(serde_json::json!(u)))
}
