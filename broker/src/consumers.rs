//! The consumers of one connection and the consumer-side commands
//! (SUBSCRIBE, FLOW, ACK, REDELIVER_UNACKNOWLEDGED_MESSAGES, SEEK,
//! UNSUBSCRIBE, CLOSE_CONSUMER, CONSUMER_STATS, GET_LAST_MESSAGE_ID).
//!
//! Being wired to the subscription layer: until then every consumer command
//! is answered with an ERROR naming it (CLOSE_CONSUMER with SUCCESS, G8).

use cms_client::proto::commands;
use cms_client::proto::pulsar::{BaseCommand, ServerError, base_command::Type};

use crate::connection::Conn;

/// The consumers of one connection.
#[derive(Debug, Default)]
pub struct Consumers {
    ids: std::collections::HashMap<u64, u64>,
}

impl Consumers {
    /// Consumers on the connection.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// No consumer.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Handles one consumer-side command.
pub(crate) async fn on_command(
    conn: &mut Conn,
    ty: Type,
    cmd: &BaseCommand,
) -> Result<(), crate::connection::CloseReason> {
    if ty == Type::CloseConsumer {
        if let Some(c) = cmd.close_consumer.as_ref() {
            conn.send(commands::success(c.request_id)).await;
        }
        return Ok(());
    }
    conn.send_error(
        crate::connection::request_id_of(cmd),
        (
            ServerError::NotAllowedError,
            format!("{} is not served yet", commands::command_name(cmd)),
        ),
    )
    .await;
    Ok(())
}

/// The broker closed a consumer.
pub(crate) async fn on_closed_by_broker(_conn: &mut Conn, _consumer_id: u64, _generation: u64) {}

/// The connection ends: every consumer leaves its subscription.
pub(crate) async fn remove_all(_conn: &mut Conn) {}
