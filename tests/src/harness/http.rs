//! Plain HTTP GETs against a child's loopback HTTP port (`/ready`, `/session`,
//! `/metrics`), never through a proxy, each bounded by [`HTTP_REQUEST_TIMEOUT_MS`].

use std::net::SocketAddr;
use std::time::Duration;

/// Bound on one request, connect included, in milliseconds.
pub const HTTP_REQUEST_TIMEOUT_MS: u64 = 2_000;

/// A client for loopback requests: no proxy, bounded time.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(HTTP_REQUEST_TIMEOUT_MS))
        .build()
        .unwrap_or_else(|e| panic!("cannot build an HTTP client: {e}"))
}

/// `GET http://<addr><path>`: the status code and the body as text.
pub async fn get(
    client: &reqwest::Client,
    addr: SocketAddr,
    path: &str,
) -> Result<(u16, String), reqwest::Error> {
    let response = client.get(format!("http://{addr}{path}")).send().await?;
    let status = response.status().as_u16();
    let body = response.text().await?;
    Ok((status, body))
}
