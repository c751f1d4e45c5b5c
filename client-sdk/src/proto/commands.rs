//! Constructors for [`BaseCommand`]s: each returns a command with `type` set
//! and the matching sub-message filled, so no caller can pair a type with the
//! wrong sub-message or forget a required field (G1). Data only: no I/O.
//!
//! Broker-side replies come first, then the client-side requests the SDK and
//! the tests use.

use super::pulsar::{
    BaseCommand, CommandAck, CommandAckResponse, CommandActiveConsumerChange, CommandCloseConsumer,
    CommandCloseProducer, CommandConnect, CommandConnected, CommandError, CommandFlow,
    CommandGetLastMessageId, CommandGetLastMessageIdResponse, CommandGetSchemaResponse,
    CommandGetTopicsOfNamespace, CommandGetTopicsOfNamespaceResponse, CommandLookupTopic,
    CommandLookupTopicResponse, CommandMessage, CommandPartitionedTopicMetadata,
    CommandPartitionedTopicMetadataResponse, CommandPing, CommandPong, CommandProducer,
    CommandProducerSuccess, CommandRedeliverUnacknowledgedMessages, CommandSeek, CommandSend,
    CommandSendError, CommandSendReceipt, CommandSubscribe, CommandSuccess, CommandUnsubscribe,
    FeatureFlags, MessageIdData, ServerError,
    base_command::Type,
    command_ack::AckType,
    command_lookup_topic_response::LookupType,
    command_partitioned_topic_metadata_response::LookupType as PartitionedLookupType,
    command_subscribe::{InitialPosition, SubType},
};

/// Name of the command's type for logs and error messages (`"SEND"`,
/// `"LOOKUP"`, ...); `"UNKNOWN"` for a type this definition does not know
/// (transactions, topic-list watch, garbage).
pub fn command_name(cmd: &BaseCommand) -> &'static str {
    match Type::try_from(cmd.r#type) {
        Ok(t) => t.as_str_name(),
        Err(_) => "UNKNOWN",
    }
}

/// An empty command of type `ty`; the caller fills the sub-message.
pub fn base(ty: Type) -> BaseCommand {
    BaseCommand {
        r#type: ty as i32,
        ..Default::default()
    }
}

/// A message id without partition or batch index.
pub fn message_id(ledger_id: u64, entry_id: u64) -> MessageIdData {
    MessageIdData {
        ledger_id,
        entry_id,
        ..Default::default()
    }
}

// ---------------------------------------------------------------- broker to client

/// CONNECTED: `protocol_version` is the negotiated one (min of both sides).
pub fn connected(
    server_version: &str,
    protocol_version: i32,
    max_message_size: i32,
) -> BaseCommand {
    BaseCommand {
        connected: Some(CommandConnected {
            server_version: server_version.to_owned(),
            protocol_version: Some(protocol_version),
            max_message_size: Some(max_message_size),
            feature_flags: None,
        }),
        ..base(Type::Connected)
    }
}

/// PING (either direction).
pub fn ping() -> BaseCommand {
    BaseCommand {
        ping: Some(CommandPing {}),
        ..base(Type::Ping)
    }
}

/// PONG (either direction).
pub fn pong() -> BaseCommand {
    BaseCommand {
        pong: Some(CommandPong {}),
        ..base(Type::Pong)
    }
}

/// SUCCESS for a request.
pub fn success(request_id: u64) -> BaseCommand {
    BaseCommand {
        success: Some(CommandSuccess {
            request_id,
            schema: None,
        }),
        ..base(Type::Success)
    }
}

/// ERROR for a request.
pub fn error(request_id: u64, error: ServerError, message: impl Into<String>) -> BaseCommand {
    BaseCommand {
        error: Some(CommandError {
            request_id,
            error: error as i32,
            message: message.into(),
        }),
        ..base(Type::Error)
    }
}

/// PRODUCER_SUCCESS. `last_sequence_id` is −1 without de-duplication;
/// `producer_ready = false` means "queued behind an exclusive producer" and
/// must be followed by a second PRODUCER_SUCCESS with the same request id (G12).
pub fn producer_success(
    request_id: u64,
    producer_name: &str,
    last_sequence_id: i64,
    producer_ready: bool,
    topic_epoch: Option<u64>,
) -> BaseCommand {
    BaseCommand {
        producer_success: Some(CommandProducerSuccess {
            request_id,
            producer_name: producer_name.to_owned(),
            last_sequence_id: Some(last_sequence_id),
            schema_version: None,
            topic_epoch,
            producer_ready: Some(producer_ready),
        }),
        ..base(Type::ProducerSuccess)
    }
}

/// SEND_RECEIPT echoing the producer's `sequence_id` (G4) with the stored
/// position.
pub fn send_receipt(
    producer_id: u64,
    sequence_id: u64,
    ledger_id: u64,
    entry_id: u64,
) -> BaseCommand {
    BaseCommand {
        send_receipt: Some(CommandSendReceipt {
            producer_id,
            sequence_id,
            message_id: Some(message_id(ledger_id, entry_id)),
            highest_sequence_id: None,
        }),
        ..base(Type::SendReceipt)
    }
}

/// SEND_ERROR. Any error but `ChecksumError` makes pulsar-client-cpp drop the
/// whole connection (G6): use sparingly.
pub fn send_error(
    producer_id: u64,
    sequence_id: u64,
    error: ServerError,
    message: impl Into<String>,
) -> BaseCommand {
    BaseCommand {
        send_error: Some(CommandSendError {
            producer_id,
            sequence_id,
            error: error as i32,
            message: message.into(),
        }),
        ..base(Type::SendError)
    }
}

/// MESSAGE for one stored entry; the entry follows as the frame's payload
/// (see [`super::frame::encode_payload`]).
pub fn message(
    consumer_id: u64,
    ledger_id: u64,
    entry_id: u64,
    redelivery_count: u32,
) -> BaseCommand {
    BaseCommand {
        message: Some(CommandMessage {
            consumer_id,
            message_id: message_id(ledger_id, entry_id),
            redelivery_count: Some(redelivery_count),
            ack_set: Vec::new(),
            consumer_epoch: None,
        }),
        ..base(Type::Message)
    }
}

fn lookup_response(
    request_id: u64,
    url: &str,
    authoritative: bool,
    response: LookupType,
) -> BaseCommand {
    BaseCommand {
        lookup_topic_response: Some(CommandLookupTopicResponse {
            broker_service_url: Some(url.to_owned()),
            response: Some(response as i32),
            request_id,
            authoritative: Some(authoritative),
            proxy_through_service_url: Some(false),
            ..Default::default()
        }),
        ..base(Type::LookupResponse)
    }
}

/// LOOKUP_RESPONSE "connect to `url`" (this broker's advertised service URL).
pub fn lookup_response_connect(request_id: u64, url: &str, authoritative: bool) -> BaseCommand {
    lookup_response(request_id, url, authoritative, LookupType::Connect)
}

/// LOOKUP_RESPONSE "ask `url` instead"; set `authoritative` or proxies loop (G10).
pub fn lookup_response_redirect(request_id: u64, url: &str, authoritative: bool) -> BaseCommand {
    lookup_response(request_id, url, authoritative, LookupType::Redirect)
}

/// LOOKUP_RESPONSE with `response = Failed`.
pub fn lookup_response_failed(
    request_id: u64,
    error: ServerError,
    message: impl Into<String>,
) -> BaseCommand {
    BaseCommand {
        lookup_topic_response: Some(CommandLookupTopicResponse {
            response: Some(LookupType::Failed as i32),
            request_id,
            error: Some(error as i32),
            message: Some(message.into()),
            ..Default::default()
        }),
        ..base(Type::LookupResponse)
    }
}

/// PARTITIONED_METADATA_RESPONSE with `response = Success` (G3); 0 partitions
/// means a non-partitioned topic.
pub fn partitioned_metadata_response(request_id: u64, partitions: u32) -> BaseCommand {
    BaseCommand {
        partition_metadata_response: Some(CommandPartitionedTopicMetadataResponse {
            partitions: Some(partitions),
            request_id,
            response: Some(PartitionedLookupType::Success as i32),
            error: None,
            message: None,
        }),
        ..base(Type::PartitionedMetadataResponse)
    }
}

/// PARTITIONED_METADATA_RESPONSE with `response = Failed`.
pub fn partitioned_metadata_failed(
    request_id: u64,
    error: ServerError,
    message: impl Into<String>,
) -> BaseCommand {
    BaseCommand {
        partition_metadata_response: Some(CommandPartitionedTopicMetadataResponse {
            partitions: None,
            request_id,
            response: Some(PartitionedLookupType::Failed as i32),
            error: Some(error as i32),
            message: Some(message.into()),
        }),
        ..base(Type::PartitionedMetadataResponse)
    }
}

/// ACTIVE_CONSUMER_CHANGE (Failover subscriptions).
pub fn active_consumer_change(consumer_id: u64, is_active: bool) -> BaseCommand {
    BaseCommand {
        active_consumer_change: Some(CommandActiveConsumerChange {
            consumer_id,
            is_active: Some(is_active),
        }),
        ..base(Type::ActiveConsumerChange)
    }
}

/// CLOSE_PRODUCER: from the broker it means "look the topic up again" (G13);
/// from the client, "I am done" (answered with SUCCESS even for unknown ids, G8).
pub fn close_producer(producer_id: u64, request_id: u64) -> BaseCommand {
    BaseCommand {
        close_producer: Some(CommandCloseProducer {
            producer_id,
            request_id,
            ..Default::default()
        }),
        ..base(Type::CloseProducer)
    }
}

/// CLOSE_CONSUMER (see [`close_producer`]).
pub fn close_consumer(consumer_id: u64, request_id: u64) -> BaseCommand {
    BaseCommand {
        close_consumer: Some(CommandCloseConsumer {
            consumer_id,
            request_id,
            ..Default::default()
        }),
        ..base(Type::CloseConsumer)
    }
}

/// GET_LAST_MESSAGE_ID_RESPONSE.
pub fn get_last_message_id_response(
    request_id: u64,
    last_message_id: MessageIdData,
    consumer_mark_delete_position: Option<MessageIdData>,
) -> BaseCommand {
    BaseCommand {
        get_last_message_id_response: Some(CommandGetLastMessageIdResponse {
            last_message_id,
            request_id,
            consumer_mark_delete_position,
        }),
        ..base(Type::GetLastMessageIdResponse)
    }
}

/// ACK_RESPONSE for an ack that carried a `request_id`; `error` on failure.
pub fn ack_response(
    consumer_id: u64,
    request_id: u64,
    error: Option<(ServerError, String)>,
) -> BaseCommand {
    let (error, message) = match error {
        Some((e, m)) => (Some(e as i32), Some(m)),
        None => (None, None),
    };
    BaseCommand {
        ack_response: Some(CommandAckResponse {
            consumer_id,
            request_id: Some(request_id),
            error,
            message,
            ..Default::default()
        }),
        ..base(Type::AckResponse)
    }
}

/// GET_TOPICS_OF_NAMESPACE_RESPONSE with the full (unfiltered) list.
pub fn get_topics_of_namespace_response(request_id: u64, topics: Vec<String>) -> BaseCommand {
    BaseCommand {
        get_topics_of_namespace_response: Some(CommandGetTopicsOfNamespaceResponse {
            request_id,
            topics,
            filtered: Some(false),
            topics_hash: None,
            changed: Some(true),
        }),
        ..base(Type::GetTopicsOfNamespaceResponse)
    }
}

/// GET_SCHEMA_RESPONSE carrying an error (`TopicNotFound` means "no schema", G14).
pub fn get_schema_response_error(
    request_id: u64,
    error: ServerError,
    message: impl Into<String>,
) -> BaseCommand {
    BaseCommand {
        get_schema_response: Some(CommandGetSchemaResponse {
            request_id,
            error_code: Some(error as i32),
            error_message: Some(message.into()),
            schema: None,
            schema_version: None,
        }),
        ..base(Type::GetSchemaResponse)
    }
}

// ---------------------------------------------------------------- client to broker

/// CONNECT without authentication (`auth_method_name = "none"`), announcing
/// support for broker entry metadata.
pub fn connect(client_version: &str, protocol_version: i32) -> BaseCommand {
    BaseCommand {
        connect: Some(CommandConnect {
            client_version: client_version.to_owned(),
            protocol_version: Some(protocol_version),
            auth_method_name: Some("none".to_owned()),
            feature_flags: Some(FeatureFlags {
                supports_broker_entry_metadata: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..base(Type::Connect)
    }
}

/// PARTITIONED_METADATA for a topic.
pub fn partitioned_metadata(topic: &str, request_id: u64) -> BaseCommand {
    BaseCommand {
        partition_metadata: Some(CommandPartitionedTopicMetadata {
            topic: topic.to_owned(),
            request_id,
            ..Default::default()
        }),
        ..base(Type::PartitionedMetadata)
    }
}

/// LOOKUP for a topic.
pub fn lookup(topic: &str, request_id: u64, authoritative: bool) -> BaseCommand {
    BaseCommand {
        lookup_topic: Some(CommandLookupTopic {
            topic: topic.to_owned(),
            request_id,
            authoritative: Some(authoritative),
            ..Default::default()
        }),
        ..base(Type::Lookup)
    }
}

/// PRODUCER; `producer_name = None` lets the broker assign one.
pub fn producer(
    topic: &str,
    producer_id: u64,
    request_id: u64,
    producer_name: Option<&str>,
) -> BaseCommand {
    BaseCommand {
        producer: Some(CommandProducer {
            topic: topic.to_owned(),
            producer_id,
            request_id,
            producer_name: producer_name.map(str::to_owned),
            user_provided_producer_name: Some(producer_name.is_some()),
            ..Default::default()
        }),
        ..base(Type::Producer)
    }
}

/// SEND header; the entry follows as the frame's payload.
pub fn send(producer_id: u64, sequence_id: u64, num_messages: i32) -> BaseCommand {
    BaseCommand {
        send: Some(CommandSend {
            producer_id,
            sequence_id,
            num_messages: Some(num_messages),
            ..Default::default()
        }),
        ..base(Type::Send)
    }
}

/// SUBSCRIBE (durable).
pub fn subscribe(
    topic: &str,
    subscription: &str,
    sub_type: SubType,
    consumer_id: u64,
    request_id: u64,
    initial_position: InitialPosition,
) -> BaseCommand {
    BaseCommand {
        subscribe: Some(CommandSubscribe {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            sub_type: sub_type as i32,
            consumer_id,
            request_id,
            durable: Some(true),
            initial_position: Some(initial_position as i32),
            ..Default::default()
        }),
        ..base(Type::Subscribe)
    }
}

/// FLOW: `permits` more messages (not entries, G11).
pub fn flow(consumer_id: u64, permits: u32) -> BaseCommand {
    BaseCommand {
        flow: Some(CommandFlow {
            consumer_id,
            message_permits: permits,
        }),
        ..base(Type::Flow)
    }
}

/// ACK of `ids` (a cumulative ack carries exactly one id); `request_id` asks
/// for an ACK_RESPONSE.
pub fn ack(
    consumer_id: u64,
    ack_type: AckType,
    ids: Vec<MessageIdData>,
    request_id: Option<u64>,
) -> BaseCommand {
    BaseCommand {
        ack: Some(CommandAck {
            consumer_id,
            ack_type: ack_type as i32,
            message_id: ids,
            request_id,
            ..Default::default()
        }),
        ..base(Type::Ack)
    }
}

/// REDELIVER_UNACKNOWLEDGED_MESSAGES; an empty `ids` means "all unacked".
pub fn redeliver_unacknowledged(consumer_id: u64, ids: Vec<MessageIdData>) -> BaseCommand {
    BaseCommand {
        redeliver_unacknowledged_messages: Some(CommandRedeliverUnacknowledgedMessages {
            consumer_id,
            message_ids: ids,
            consumer_epoch: None,
        }),
        ..base(Type::RedeliverUnacknowledgedMessages)
    }
}

/// UNSUBSCRIBE.
pub fn unsubscribe(consumer_id: u64, request_id: u64) -> BaseCommand {
    BaseCommand {
        unsubscribe: Some(CommandUnsubscribe {
            consumer_id,
            request_id,
            force: None,
        }),
        ..base(Type::Unsubscribe)
    }
}

/// SEEK to a message id.
pub fn seek(consumer_id: u64, request_id: u64, id: MessageIdData) -> BaseCommand {
    BaseCommand {
        seek: Some(CommandSeek {
            consumer_id,
            request_id,
            message_id: Some(id),
            message_publish_time: None,
        }),
        ..base(Type::Seek)
    }
}

/// SEEK to the first message published at or after `publish_time_ms`
/// (milliseconds since the Unix epoch).
pub fn seek_publish_time(consumer_id: u64, request_id: u64, publish_time_ms: u64) -> BaseCommand {
    BaseCommand {
        seek: Some(CommandSeek {
            consumer_id,
            request_id,
            message_id: None,
            message_publish_time: Some(publish_time_ms),
        }),
        ..base(Type::Seek)
    }
}

/// GET_LAST_MESSAGE_ID.
pub fn get_last_message_id(consumer_id: u64, request_id: u64) -> BaseCommand {
    BaseCommand {
        get_last_message_id: Some(CommandGetLastMessageId {
            consumer_id,
            request_id,
        }),
        ..base(Type::GetLastMessageId)
    }
}

/// GET_TOPICS_OF_NAMESPACE: the topics of `namespace` (`tenant/ns`) in
/// `mode` (`CommandGetTopicsOfNamespace::Mode` as i32), optionally filtered
/// by the broker with `pattern`; `hash` is the client's last topics hash (the
/// broker leaves the list out when it is unchanged).
pub fn get_topics_of_namespace(
    request_id: u64,
    namespace: &str,
    mode: i32,
    pattern: Option<&str>,
    hash: Option<&str>,
) -> BaseCommand {
    BaseCommand {
        get_topics_of_namespace: Some(CommandGetTopicsOfNamespace {
            request_id,
            namespace: namespace.to_owned(),
            mode: Some(mode),
            topics_pattern: pattern.map(str::to_owned),
            topics_hash: hash.map(str::to_owned),
        }),
        ..base(Type::GetTopicsOfNamespace)
    }
}
