//! Fuzz target for the admin REST API's policy bodies
//! (`cms_admin_types::policies`, served by `/admin/v2/tenants` and
//! `/admin/v2/namespaces/...`): serde_json into each body type, then its
//! validation.
//!
//! Input: byte 0 picks the body type, the rest is the JSON body. For any
//! input: parsing and validation never panic; a parsed body serialises, and
//! (for bodies without floats) serialising is stable: parse(serialise(b))
//! serialises to the same JSON.

#![no_main]

use cms_admin_types::policies::{
    AutoTopicCreationOverride, BacklogQuota, DispatchRate, NamespacePolicies, PersistencePolicies,
    PublishRate, RetentionPolicies, TenantInfo, schema_strategy_name,
};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Parses `T`, runs `validate`, checks serialisation (and its stability
/// unless `floats`).
fn body<T: DeserializeOwned + Serialize>(
    json: &[u8],
    floats: bool,
    validate: impl Fn(&T) -> Result<(), String>,
) {
    let Ok(v) = serde_json::from_slice::<T>(json) else {
        return;
    };
    let _ = validate(&v);
    let first = serde_json::to_vec(&v).expect("a parsed body serialises");
    let again: T = serde_json::from_slice(&first).expect("a serialised body parses");
    if !floats {
        let second = serde_json::to_vec(&again).expect("serialises");
        assert_eq!(first, second, "serialisation is not stable");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, json)) = data.split_first() else {
        return;
    };
    match kind % 10 {
        0 => body::<TenantInfo>(json, false, |_| Ok(())),
        // Policies hold a float (managedLedgerMaxMarkDeleteRate).
        1 => body::<NamespacePolicies>(json, true, NamespacePolicies::validate),
        2 => body::<RetentionPolicies>(json, false, RetentionPolicies::validate),
        3 => body::<BacklogQuota>(json, false, BacklogQuota::validate),
        4 => body::<PersistencePolicies>(json, true, PersistencePolicies::validate),
        5 => body::<PublishRate>(json, false, PublishRate::validate),
        6 => body::<DispatchRate>(json, false, DispatchRate::validate),
        7 => body::<AutoTopicCreationOverride>(json, false, AutoTopicCreationOverride::validate),
        8 => body::<Vec<String>>(json, false, |_| Ok(())),
        _ => {
            if let Ok(s) = std::str::from_utf8(json) {
                let _ = schema_strategy_name(s);
            }
        }
    }
});
