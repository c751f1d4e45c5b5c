//! `/admin/v2/bookies` and `/admin/v2/ledgers`: the storage layer as an
//! operator sees it, with the operations `cms-bookie` offers on its command
//! line (the same `cms_bookie` functions): bookie list with state, rack and
//! disk figures (`/cms/bookies/{available,readonly}`), the read-only switch
//! (the bookie's own `PUT /admin/readonly`, then waiting for its
//! registration to move), decommissioning a stopped bookie (one
//! `decommission_step` per call: marks the ledgers still naming it
//! under-replicated for autorecovery and reports how many are left),
//! under-replicated ledgers, and one ledger's metadata.
//!
//! Promises: every call is bounded in time ([`BOOKIE_REQUEST_TIMEOUT_MS`],
//! [`BOOKIE_SWITCH_TIMEOUT_MS`]);
//! a bookie that is not registered answers 404, a decommission of a running
//! bookie 409.

use std::time::Duration;

use axum::extract::State;
use cms_bookie::autorecovery::{DecommissionError, decommission_step, list_underreplicated};
use cms_bookie::client::driver::LedgerError;
use cms_bookie::metadata::{MetadataError, join};
use cms_bookie::proto::metadata::BookieRegistration;
use prost::Message;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::info;

use crate::admin::{AdminError, AdminResult, Body, Params, St, names, ok_json, store};
use crate::service::BrokerState;

/// Bound on the bookie's answer to the read-only switch, in milliseconds.
pub const BOOKIE_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Bound on the registration moving after the switch, in milliseconds (the
/// bookie moves it on its disk check, every 10 s by default).
pub const BOOKIE_SWITCH_TIMEOUT_MS: u64 = 30_000;
/// Ledger ids listed at most in one decommission answer.
pub const DECOMMISSION_LEDGERS_LISTED_MAX: usize = 100;

async fn registration(
    s: &BrokerState,
    bookie: &str,
) -> Result<Option<(bool, BookieRegistration)>, AdminError> {
    for (writable, dir) in [
        (true, s.layout.bookies_available()),
        (false, s.layout.bookies_readonly()),
    ] {
        match s.store.get(&join(&dir, bookie)).await {
            Ok((data, _)) => {
                let reg = BookieRegistration::decode(data.as_slice()).map_err(|e| {
                    AdminError::Internal(format!("registration of bookie {bookie}: {e}"))
                })?;
                return Ok(Some((writable, reg)));
            }
            Err(MetadataError::NoNode(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

fn bookie_json(writable: bool, r: &BookieRegistration) -> Value {
    json!({
        "id": r.bookie_id,
        "endpoint": r.endpoint,
        "httpEndpoint": r.http_endpoint,
        "incarnation": r.incarnation,
        "rack": r.rack,
        "state": if writable { "available" } else { "readonly" },
        "totalBytes": r.total_bytes,
        "freeBytes": r.free_bytes,
    })
}

/// `GET /bookies`: every registered bookie.
pub async fn list(State(s): St) -> AdminResult {
    let mut out = Vec::new();
    for dir in [s.layout.bookies_available(), s.layout.bookies_readonly()] {
        for id in store::children(&*s.store, &dir).await? {
            if let Some((writable, reg)) = registration(&s, &id).await? {
                out.push(bookie_json(writable, &reg));
            }
        }
    }
    Ok(ok_json(json!(out)))
}

/// `GET /bookies/{bookie}`.
pub async fn get(State(s): St, p: Params) -> AdminResult {
    let b = p.get("bookie")?;
    names::check("bookie", b)?;
    match registration(&s, b).await? {
        Some((writable, reg)) => Ok(ok_json(bookie_json(writable, &reg))),
        None => Err(AdminError::NotFound(format!(
            "bookie {b} is not registered"
        ))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadOnlyBody {
    readonly: bool,
}

/// `PUT /bookies/{bookie}/readonly` with `{"readonly": true|false}`: the
/// operator's switch; answers once the registration has moved.
pub async fn set_readonly(State(s): St, p: Params, body: Body) -> AdminResult {
    let b = p.get("bookie")?;
    names::check("bookie", b)?;
    let want: ReadOnlyBody = body.json()?;
    let Some((_, reg)) = registration(&s, b).await? else {
        return Err(AdminError::NotFound(format!(
            "bookie {b} is not registered (the switch acts on a running bookie)"
        )));
    };
    if reg.http_endpoint.is_empty() {
        return Err(AdminError::PreconditionFailed(format!(
            "bookie {b} registered no HTTP endpoint"
        )));
    }
    let url = format!("http://{}/admin/readonly", reg.http_endpoint);
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(BOOKIE_REQUEST_TIMEOUT_MS))
        .build()
        .map_err(|e| AdminError::Internal(format!("HTTP client: {e}")))?;
    let resp = http
        .put(&url)
        .json(&json!({ "readonly": want.readonly }))
        .send()
        .await
        .map_err(|e| AdminError::Unavailable(format!("PUT {url}: {e}")))?;
    let status = resp.status();
    let answer: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        return Err(AdminError::PreconditionFailed(format!(
            "bookie {b} refused: {status}: {}",
            answer["reason"].as_str().unwrap_or("no reason given")
        )));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(BOOKIE_SWITCH_TIMEOUT_MS);
    loop {
        if let Some((writable, reg)) = registration(&s, b).await?
            && writable != want.readonly
        {
            info!(
                bookie = b,
                readonly = want.readonly,
                "bookie read-only switch"
            );
            return Ok(ok_json(bookie_json(writable, &reg)));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(AdminError::Unavailable(format!(
                "bookie {b} accepted the switch but its registration did not move within {BOOKIE_SWITCH_TIMEOUT_MS} ms"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `POST /bookies/{bookie}/decommission`: one step (call again for
/// progress): `{"ledgersLeft": n, "ledgers": [...], "done": bool}`.
pub async fn decommission(State(s): St, p: Params) -> AdminResult {
    let b = p.get("bookie")?;
    names::check("bookie", b)?;
    match decommission_step(&*s.store, &s.layout, b).await {
        Ok(left) => {
            info!(bookie = b, ledgers_left = left.len(), "decommission step");
            Ok(ok_json(json!({
                "bookie": b,
                "ledgersLeft": left.len(),
                "ledgers": left.iter().take(DECOMMISSION_LEDGERS_LISTED_MAX).collect::<Vec<_>>(),
                "done": left.is_empty(),
            })))
        }
        Err(DecommissionError::StillRegistered(id)) => Err(AdminError::Conflict(format!(
            "bookie {id} is still registered (available or read-only): stop it first"
        ))),
        Err(DecommissionError::Metadata(e)) => Err(e.into()),
    }
}

/// `GET /ledgers/underreplicated`: `[{"ledgerId", "lostBookies"}]`.
pub async fn underreplicated(State(s): St) -> AdminResult {
    let list = list_underreplicated(&*s.store, &s.layout).await?;
    let out: Vec<Value> = list
        .into_iter()
        .map(|(id, lost)| json!({"ledgerId": id, "lostBookies": lost}))
        .collect();
    Ok(ok_json(json!(out)))
}

/// `GET /ledgers/{ledger}`: the ledger's metadata (no password).
pub async fn ledger(State(s): St, p: Params) -> AdminResult {
    let raw = p.get("ledger")?;
    let id: u64 = raw.parse().map_err(|_| {
        AdminError::BadRequest(format!("ledger id must be an integer, got {raw:?}"))
    })?;
    let md = match s.client.ledger_metadata(id).await {
        Ok(md) => md,
        Err(LedgerError::NoSuchLedger(_)) => {
            return Err(AdminError::NotFound(format!("ledger {id} does not exist")));
        }
        Err(e) => return Err(AdminError::Unavailable(format!("ledger {id}: {e}"))),
    };
    let segments: Vec<Value> = md
        .segments
        .iter()
        .map(|seg| json!({"firstEntryId": seg.first_entry_id, "ensemble": seg.ensemble}))
        .collect();
    let custom: serde_json::Map<String, Value> = md
        .custom
        .iter()
        .map(|(k, v)| (k.clone(), json!(String::from_utf8_lossy(v))))
        .collect();
    Ok(ok_json(json!({
        "ledgerId": md.ledger_id,
        "state": format!("{:?}", md.status()),
        "ensembleSize": md.ensemble_size,
        "writeQuorum": md.write_quorum,
        "ackQuorum": md.ack_quorum,
        "lastEntryId": md.last_entry_id,
        "length": md.length,
        "ctimeMs": md.ctime_ms,
        "segments": segments,
        "custom": custom,
    })))
}
