//! `cms-admin-types`: the bodies of the broker's admin REST API (DESIGN §6)
//! that carry policies — tenants and namespace `Policies` in Pulsar's JSON
//! shapes — as plain serde types with their validation, and nothing else
//! (no I/O, no async), so the JSON parsing can be fuzzed on its own.
//!
//! Promise: deserialising any bytes with `serde_json` never panics (bad
//! input is a `serde_json::Error`, which the broker answers with HTTP 400),
//! and `validate` accepts only values the broker can enforce. The broker
//! re-exports everything from `cms_broker::tenancy`.

pub mod policies;
pub mod quotas;
