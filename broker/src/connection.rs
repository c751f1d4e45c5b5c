//! One client connection (being written).
use std::net::SocketAddr;
use std::sync::Arc;

/// Serves one connection.
pub async fn serve(
    _state: Arc<crate::service::BrokerState>,
    _stream: tokio::net::TcpStream,
    _peer: SocketAddr,
) {
}
