//! `/admin/v2/tenants`: create (PUT), update (POST), get, list and delete
//! tenants stored as Pulsar `TenantInfo` JSON in `/cms/admin/tenants/<t>`.
//!
//! Promises: a tenant's allowed clusters must name this cluster (the only
//! one a store holds); delete answers 409 while the tenant has namespaces.

use axum::extract::State;
use tracing::info;

use crate::admin::{AdminError, AdminResult, Body, Params, St, names, no_content, ok_json, store};
use crate::service::BrokerState;
use crate::tenancy::{TenantInfo, tenant_path};

fn check_info(s: &BrokerState, info: &mut TenantInfo) -> Result<(), AdminError> {
    if info.allowed_clusters.is_empty() {
        info.allowed_clusters.push(s.cluster_name.clone());
    }
    for c in &info.allowed_clusters {
        names::check("cluster", c)?;
        if *c != s.cluster_name {
            return Err(AdminError::PreconditionFailed(format!(
                "cluster {c} does not exist (this cluster is {})",
                s.cluster_name
            )));
        }
    }
    for r in &info.admin_roles {
        if r.is_empty() || r.len() > crate::topic_name::NAME_PART_BYTES_MAX {
            return Err(AdminError::BadRequest(format!("invalid admin role {r:?}")));
        }
    }
    Ok(())
}

/// `GET /tenants`.
pub async fn list(State(s): St) -> AdminResult {
    let names = store::children(&*s.store, &s.layout.tenants()).await?;
    Ok(ok_json(serde_json::json!(names)))
}

/// `GET /tenants/{tenant}`.
pub async fn get(State(s): St, p: Params) -> AdminResult {
    let t = p.get("tenant")?;
    names::check("tenant", t)?;
    match store::read::<TenantInfo>(&*s.store, &tenant_path(&s.layout, t)).await? {
        Some((info, _)) => Ok(ok_json(serde_json::json!(info))),
        None => Err(AdminError::NotFound(format!("tenant {t} does not exist"))),
    }
}

/// `PUT /tenants/{tenant}`: creates (409 if it exists).
pub async fn create(State(s): St, p: Params, body: Body) -> AdminResult {
    let t = p.get("tenant")?;
    names::check("tenant", t)?;
    let mut info: TenantInfo = body.json_or_default()?;
    check_info(&s, &mut info)?;
    if let Some(q) = &info.quotas {
        q.validate().map_err(AdminError::BadRequest)?;
    }
    store::create(&*s.store, &tenant_path(&s.layout, t), &info, || {
        format!("tenant {t} already exists")
    })
    .await?;
    info!(tenant = t, "tenant created");
    Ok(no_content())
}

/// `POST /tenants/{tenant}`: replaces the tenant info (404 if absent).
pub async fn update(State(s): St, p: Params, body: Body) -> AdminResult {
    let t = p.get("tenant")?;
    names::check("tenant", t)?;
    let mut info: TenantInfo = body.json()?;
    check_info(&s, &mut info)?;
    store::update::<TenantInfo, _>(
        &*s.store,
        &tenant_path(&s.layout, t),
        || format!("tenant {t} does not exist"),
        |cur| {
            // Quotas have their own endpoint and stay as they are.
            let quotas = cur.quotas;
            *cur = info.clone();
            cur.quotas = quotas;
            Ok(())
        },
    )
    .await?;
    info!(tenant = t, "tenant updated");
    Ok(no_content())
}

/// `DELETE /tenants/{tenant}`: 409 while it has namespaces.
pub async fn delete(State(s): St, p: Params) -> AdminResult {
    let t = p.get("tenant")?;
    names::check("tenant", t)?;
    let path = tenant_path(&s.layout, t);
    if store::read::<TenantInfo>(&*s.store, &path).await?.is_none() {
        return Err(AdminError::NotFound(format!("tenant {t} does not exist")));
    }
    let ns_dir = cms_bookie::metadata::join(&s.layout.namespaces(), t);
    let namespaces = store::children(&*s.store, &ns_dir).await?;
    if !namespaces.is_empty() {
        return Err(AdminError::Conflict(format!(
            "tenant {t} still has {} namespace(s): {}",
            namespaces.len(),
            namespaces.join(", ")
        )));
    }
    // The (empty) namespaces folder goes first; a namespace created
    // meanwhile makes this fail with 409 and the tenant stays.
    match s
        .store
        .delete(&ns_dir, cms_bookie::metadata::Expected::Any)
        .await
    {
        Ok(()) | Err(cms_bookie::metadata::MetadataError::NoNode(_)) => {}
        Err(e) => return Err(e.into()),
    }
    match s
        .store
        .delete(&path, cms_bookie::metadata::Expected::Any)
        .await
    {
        Ok(()) => {}
        Err(cms_bookie::metadata::MetadataError::NoNode(_)) => {
            return Err(AdminError::NotFound(format!("tenant {t} does not exist")));
        }
        Err(e) => return Err(e.into()),
    }
    info!(tenant = t, "tenant deleted");
    Ok(no_content())
}
