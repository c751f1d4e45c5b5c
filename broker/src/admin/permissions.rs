//! Permissions (Pulsar's shapes): grants of actions (`produce`,
//! `consume`, ...) to roles on a namespace or on one topic, and the roles
//! allowed on a subscription. Stored in the namespace's `auth_policies`
//! (read-modify-CAS), enforced by [`crate::auth`].
//!
//! - `GET /namespaces/{t}/{ns}/permissions` → `{"role": ["consume", "produce"]}`
//! - `POST|DELETE /namespaces/{t}/{ns}/permissions/{role}` (POST body `["produce"]`)
//! - `GET /{domain}/{t}/{ns}/{topic}/permissions` → namespace and topic grants merged
//! - `POST|DELETE /{domain}/{t}/{ns}/{topic}/permissions/{role}`
//! - `POST /namespaces/{t}/{ns}/permissions/subscription/{sub}` body
//!   `["role", ...]`
//! - `DELETE /namespaces/{t}/{ns}/permissions/{sub}/{role}` (Pulsar's
//!   `revokePermissionOnSubscription`: one role; the restriction goes with
//!   its last role)

use std::collections::{BTreeMap, BTreeSet};

use tracing::info;

use crate::admin::names;
use crate::admin::{AdminError, AdminResult, Body, Params, St, no_content, ok_json, store};
use crate::tenancy::{NamespacePolicies, namespace_path};

fn ns_params(p: &Params) -> Result<(String, String), AdminError> {
    let t = p.get("tenant")?;
    let ns = p.get("namespace")?;
    names::check("tenant", t)?;
    names::check("namespace", ns)?;
    Ok((t.to_string(), ns.to_string()))
}

fn role_param(p: &Params) -> Result<String, AdminError> {
    let r = p.get("role")?;
    if r.is_empty() || r.len() > 256 {
        return Err(AdminError::BadRequest("role must be 1..=256 bytes".into()));
    }
    Ok(r.to_string())
}

fn actions(body: &Body) -> Result<BTreeSet<String>, AdminError> {
    let list: Vec<String> = body.json()?;
    crate::auth::validate_actions(&list).map_err(AdminError::BadRequest)
}

fn topic_full(p: &Params) -> Result<String, AdminError> {
    let d = names::domain(p.get("domain")?)?;
    let name = names::topic(d, p.get("tenant")?, p.get("namespace")?, p.get("topic")?)?;
    Ok(name.to_string())
}

async fn read(
    s: &crate::service::BrokerState,
    t: &str,
    ns: &str,
) -> Result<NamespacePolicies, AdminError> {
    crate::admin::namespaces::read_policies(s, t, ns).await
}

async fn change(
    s: &crate::service::BrokerState,
    t: &str,
    ns: &str,
    f: impl Fn(&mut NamespacePolicies),
) -> Result<(), AdminError> {
    store::update::<NamespacePolicies, _>(
        &*s.store,
        &namespace_path(&s.layout, t, ns),
        || format!("namespace {t}/{ns} does not exist"),
        |cur| {
            f(cur);
            Ok(())
        },
    )
    .await
    .map(|_| ())
}

fn as_json(m: &BTreeMap<String, BTreeSet<String>>) -> serde_json::Value {
    serde_json::to_value(m).unwrap_or_default()
}

/// `GET /namespaces/{tenant}/{namespace}/permissions`.
pub async fn ns_get(axum::extract::State(s): St, p: Params) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let pol = read(&s, &t, &ns).await?;
    Ok(ok_json(as_json(&pol.auth_policies.namespace_auth)))
}

/// `POST /namespaces/{tenant}/{namespace}/permissions/{role}`.
pub async fn ns_grant(axum::extract::State(s): St, p: Params, body: Body) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let role = role_param(&p)?;
    let acts = actions(&body)?;
    change(&s, &t, &ns, |pol| {
        pol.auth_policies
            .namespace_auth
            .insert(role.clone(), acts.clone());
    })
    .await?;
    info!(tenant = %t, namespace = %ns, role = %role, actions = ?acts, "namespace permissions granted");
    Ok(no_content())
}

/// `DELETE /namespaces/{tenant}/{namespace}/permissions/{role}`.
pub async fn ns_revoke(axum::extract::State(s): St, p: Params) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let role = role_param(&p)?;
    change(&s, &t, &ns, |pol| {
        pol.auth_policies.namespace_auth.remove(&role);
    })
    .await?;
    info!(tenant = %t, namespace = %ns, role = %role, "namespace permissions revoked");
    Ok(no_content())
}

/// `GET /{domain}/{tenant}/{namespace}/{topic}/permissions`: the
/// namespace's grants merged with the topic's.
pub async fn topic_get(axum::extract::State(s): St, p: Params) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let full = topic_full(&p)?;
    let pol = read(&s, &t, &ns).await?;
    let mut m = pol.auth_policies.namespace_auth.clone();
    if let Some(own) = pol.auth_policies.destination_auth.get(&full) {
        for (role, acts) in own {
            m.entry(role.clone())
                .or_default()
                .extend(acts.iter().cloned());
        }
    }
    Ok(ok_json(as_json(&m)))
}

/// `POST /{domain}/{tenant}/{namespace}/{topic}/permissions/{role}`.
pub async fn topic_grant(axum::extract::State(s): St, p: Params, body: Body) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let full = topic_full(&p)?;
    let role = role_param(&p)?;
    let acts = actions(&body)?;
    change(&s, &t, &ns, |pol| {
        pol.auth_policies
            .destination_auth
            .entry(full.clone())
            .or_default()
            .insert(role.clone(), acts.clone());
    })
    .await?;
    info!(topic = %full, role = %role, actions = ?acts, "topic permissions granted");
    Ok(no_content())
}

/// `DELETE /{domain}/{tenant}/{namespace}/{topic}/permissions/{role}`.
pub async fn topic_revoke(axum::extract::State(s): St, p: Params) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let full = topic_full(&p)?;
    let role = role_param(&p)?;
    change(&s, &t, &ns, |pol| {
        let d = &mut pol.auth_policies.destination_auth;
        if let Some(m) = d.get_mut(&full) {
            m.remove(&role);
            if m.is_empty() {
                d.remove(&full);
            }
        }
    })
    .await?;
    info!(topic = %full, role = %role, "topic permissions revoked");
    Ok(no_content())
}

fn sub_param(p: &Params) -> Result<String, AdminError> {
    let sub = p.get("subscription")?;
    if sub.is_empty() || sub.len() > 1024 {
        return Err(AdminError::BadRequest(
            "subscription must be 1..=1024 bytes".into(),
        ));
    }
    Ok(sub.to_string())
}

/// `POST /namespaces/{tenant}/{namespace}/permissions/subscription/{subscription}`
/// body `["role", ...]`: only these roles may consume the subscription.
pub async fn sub_grant(axum::extract::State(s): St, p: Params, body: Body) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let sub = sub_param(&p)?;
    let roles: BTreeSet<String> = body.json()?;
    if roles.is_empty() || roles.iter().any(String::is_empty) {
        return Err(AdminError::BadRequest(
            "body must be a non-empty list of roles".into(),
        ));
    }
    change(&s, &t, &ns, |pol| {
        pol.auth_policies
            .subscription_auth_roles
            .entry(sub.clone())
            .or_default()
            .extend(roles.iter().cloned());
    })
    .await?;
    info!(tenant = %t, namespace = %ns, subscription = %sub, "subscription roles granted");
    Ok(no_content())
}

/// `DELETE /namespaces/{tenant}/{namespace}/permissions/{subscription}/{role}`
/// (Pulsar's path): removes `role` from the subscription's allowed roles;
/// when it was the last one, the subscription is no longer restricted.
/// Revoking a role that is not listed is a no-op (204).
pub async fn sub_revoke(axum::extract::State(s): St, p: Params) -> AdminResult {
    let (t, ns) = ns_params(&p)?;
    let sub = sub_param(&p)?;
    let role = role_param(&p)?;
    change(&s, &t, &ns, |pol| revoke_sub_role(pol, &sub, &role)).await?;
    info!(tenant = %t, namespace = %ns, subscription = %sub, role = %role, "subscription role revoked");
    Ok(no_content())
}

fn revoke_sub_role(pol: &mut NamespacePolicies, sub: &str, role: &str) {
    let m = &mut pol.auth_policies.subscription_auth_roles;
    if let Some(cur) = m.get_mut(sub) {
        cur.remove(role);
        if cur.is_empty() {
            m.remove(sub);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoking_a_subscription_role_drops_the_restriction_with_the_last_one() {
        let mut pol = NamespacePolicies::default();
        pol.auth_policies.subscription_auth_roles.insert(
            "s".into(),
            ["a", "b"].into_iter().map(String::from).collect(),
        );
        revoke_sub_role(&mut pol, "s", "a");
        revoke_sub_role(&mut pol, "other", "a");
        assert_eq!(
            pol.auth_policies.subscription_auth_roles["s"],
            BTreeSet::from(["b".to_string()])
        );
        revoke_sub_role(&mut pol, "s", "missing");
        revoke_sub_role(&mut pol, "s", "b");
        assert!(pol.auth_policies.subscription_auth_roles.is_empty());
    }
}
