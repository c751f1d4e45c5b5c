//! `/admin/v2/clusters`, `/admin/v2/brokers`: the cluster of this
//! deployment (one cluster per metadata store, its name from
//! `/cms/cluster`) and the registered brokers (`/cms/brokers`). Read-only
//! views; nothing here writes.

use axum::extract::State;
use serde_json::json;

use crate::admin::{AdminError, AdminResult, Params, St, names, ok_json, store};

/// `GET /clusters`: `["<cluster>"]`.
pub async fn list_clusters(State(s): St) -> AdminResult {
    Ok(ok_json(json!([s.cluster_name])))
}

/// `GET /clusters/{cluster}`: Pulsar's `ClusterData`.
pub async fn get_cluster(State(s): St, p: Params) -> AdminResult {
    let name = p.get("cluster")?;
    names::check("cluster", name)?;
    if name != s.cluster_name {
        return Err(AdminError::NotFound(format!(
            "cluster {name} does not exist"
        )));
    }
    Ok(ok_json(json!({
        "serviceUrl": s.http_url,
        "brokerServiceUrl": s.service_url,
    })))
}

/// `GET /brokers`: the registration of every live broker.
pub async fn list_brokers(State(s): St) -> AdminResult {
    let dir = s.layout.brokers();
    let mut out = Vec::new();
    for child in store::children(&*s.store, &dir).await? {
        let path = cms_bookie::metadata::join(&dir, &child);
        if let Some((reg, _)) = store::read::<serde_json::Value>(&*s.store, &path).await? {
            out.push(json!({
                "id": child,
                "serviceUrl": reg["serviceUrl"],
                "webServiceUrl": reg["webServiceUrl"],
                "cluster": reg["cluster"],
            }));
        }
    }
    Ok(ok_json(json!(out)))
}

/// `GET /brokers/health`: `"ok"` while this broker serves, else 503.
pub async fn broker_health(State(s): St) -> AdminResult {
    if s.is_serving() {
        Ok(ok_json(json!("ok")))
    } else {
        Err(AdminError::Unavailable("broker is not serving".into()))
    }
}
