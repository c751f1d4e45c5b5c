//! The schema registry on the Pulsar protocol: the `schema` of PRODUCER and
//! SUBSCRIBE, GET_SCHEMA and GET_OR_CREATE_SCHEMA.
//!
//! Promises: a PRODUCER or SUBSCRIBE without a schema, or with type NONE
//! (bytes), is not checked (a topic with a schema still accepts it, as
//! Pulsar with `isSchemaValidationEnforced=false`); an incompatible or
//! invalid schema is answered `IncompatibleSchema` with the reason; version
//! numbers travel as 8-byte big-endian (Pulsar's `LongSchemaVersion`);
//! GET_SCHEMA for a topic without a schema (or without that version) answers
//! `TopicNotFound` (G14).

use std::collections::BTreeMap;

use bytes::Bytes;
use cms_client::proto::pulsar::{
    BaseCommand, CommandGetOrCreateSchema, CommandGetOrCreateSchemaResponse, CommandGetSchema,
    CommandGetSchemaResponse, KeyValue, Schema, ServerError, base_command::Type,
};

use super::{SchemaData, SchemaError, SchemaVersion, registry, version_bytes, version_from_bytes};
use crate::connection::ErrorReply;
use crate::service::BrokerState;
use crate::topic_name::TopicName;

/// The Pulsar error of a registry failure.
pub fn error_reply(e: &SchemaError) -> ErrorReply {
    let code = match e {
        SchemaError::Incompatible(_) => ServerError::IncompatibleSchema,
        SchemaError::Invalid(_) => ServerError::NotAllowedError,
        SchemaError::NotFound(_) => ServerError::TopicNotFound,
        SchemaError::Metadata(_) => ServerError::MetadataError,
    };
    (code, e.to_string())
}

/// The registry's form of a protocol schema; None for "no schema" (NONE).
pub fn from_proto(s: &Schema) -> Result<Option<SchemaData>, ErrorReply> {
    if s.r#type == 0 {
        return Ok(None);
    }
    let properties: BTreeMap<String, String> = s
        .properties
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect();
    SchemaData::new(s.r#type, &s.schema_data, properties)
        .map(Some)
        .map_err(|e| match e {
            SchemaError::Invalid(m) => (ServerError::IncompatibleSchema, m),
            other => error_reply(&other),
        })
}

/// The protocol form of a stored version.
pub fn to_proto(topic: &TopicName, v: &SchemaVersion) -> Schema {
    let base = crate::partitioned::partition_of(topic)
        .map(|(b, _)| b.local)
        .unwrap_or_else(|| topic.local.clone());
    Schema {
        name: base,
        schema_data: Bytes::from(v.schema.bytes()),
        r#type: v.schema.type_number(),
        properties: v
            .schema
            .properties
            .iter()
            .map(|(k, val)| KeyValue {
                key: k.clone(),
                value: val.clone(),
            })
            .collect(),
    }
}

/// A producer's schema: the version for PRODUCER_SUCCESS (None without a schema).
pub async fn producer_schema(
    state: &BrokerState,
    topic: &TopicName,
    schema: Option<&Schema>,
) -> Result<Option<Bytes>, ErrorReply> {
    let Some(s) = schema else { return Ok(None) };
    let Some(data) = from_proto(s)? else {
        return Ok(None);
    };
    registry::get_or_create(&*state.store, &state.layout, topic, &data)
        .await
        .map(|v| Some(Bytes::from(version_bytes(v))))
        .map_err(|e| error_reply(&e))
}

/// A consumer's schema: must read the topic's data (registered if the
/// topic has no schema).
pub async fn consumer_schema(
    state: &BrokerState,
    topic: &TopicName,
    schema: Option<&Schema>,
) -> Result<(), ErrorReply> {
    let Some(s) = schema else { return Ok(()) };
    let Some(data) = from_proto(s)? else {
        return Ok(());
    };
    registry::check_consumer(&*state.store, &state.layout, topic, &data)
        .await
        .map(|_| ())
        .map_err(|e| error_reply(&e))
}

fn get_schema_error(request_id: u64, (code, msg): ErrorReply) -> BaseCommand {
    cms_client::proto::commands::get_schema_response_error(request_id, code, msg)
}

/// The GET_SCHEMA_RESPONSE for `c`.
pub async fn get_schema_reply(state: &BrokerState, c: &CommandGetSchema) -> BaseCommand {
    let topic = match TopicName::parse(&c.topic) {
        Ok(t) => t,
        Err(e) => {
            return get_schema_error(c.request_id, (ServerError::InvalidTopicName, e.to_string()));
        }
    };
    let version = match c.schema_version.as_deref() {
        None => None,
        Some(b) => match version_from_bytes(b) {
            Some(v) => Some(v),
            None => {
                return get_schema_error(
                    c.request_id,
                    (
                        ServerError::TopicNotFound,
                        format!(
                            "schema version of {} bytes is not a version number",
                            b.len()
                        ),
                    ),
                );
            }
        },
    };
    match registry::get(&*state.store, &state.layout, &topic, version).await {
        Ok(v) => BaseCommand {
            r#type: Type::GetSchemaResponse as i32,
            get_schema_response: Some(CommandGetSchemaResponse {
                request_id: c.request_id,
                error_code: None,
                error_message: None,
                schema: Some(to_proto(&topic, &v)),
                schema_version: Some(Bytes::from(version_bytes(v.version))),
            }),
            ..Default::default()
        },
        Err(e) => get_schema_error(c.request_id, error_reply(&e)),
    }
}

/// The GET_OR_CREATE_SCHEMA_RESPONSE for `c` (only clients that send the
/// command handle the answer; pulsar-client-cpp never sends it, G2).
pub async fn get_or_create_reply(state: &BrokerState, c: &CommandGetOrCreateSchema) -> BaseCommand {
    let r = match TopicName::parse(&c.topic) {
        Ok(t) => producer_schema(state, &t, Some(&c.schema)).await,
        Err(e) => Err((ServerError::InvalidTopicName, e.to_string())),
    };
    let resp = match r {
        Ok(v) => CommandGetOrCreateSchemaResponse {
            request_id: c.request_id,
            error_code: None,
            error_message: None,
            schema_version: Some(v.unwrap_or_default()),
        },
        Err((code, msg)) => CommandGetOrCreateSchemaResponse {
            request_id: c.request_id,
            error_code: Some(code as i32),
            error_message: Some(msg),
            schema_version: None,
        },
    };
    BaseCommand {
        r#type: Type::GetOrCreateSchemaResponse as i32,
        get_or_create_schema_response: Some(resp),
        ..Default::default()
    }
}
