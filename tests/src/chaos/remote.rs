//! Client of the HTTP control API ([`super::http`]) of a `cms-chaos-proxy` process.
//!
//! Promise: every call is bounded by `request_timeout_ms`; a non-2xx answer is an error
//! carrying the server's `reason`.

use std::net::SocketAddr;
use std::time::Duration;

use super::http::{ConnectionsReply, ErrorReply, ResetReply};
use super::{ChaosError, Faults};

/// Default bound of one control request, in milliseconds.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 5_000;

/// Handle on a proxy running in another process.
#[derive(Clone, Debug)]
pub struct RemoteChaosProxy {
    base_url: String,
    client: reqwest::Client,
}

impl RemoteChaosProxy {
    /// Talks to the control API at `control_addr`, each request bounded by
    /// [`REQUEST_TIMEOUT_MS_DEFAULT`].
    pub fn new(control_addr: SocketAddr) -> Result<Self, ChaosError> {
        Self::with_timeout(control_addr, REQUEST_TIMEOUT_MS_DEFAULT)
    }

    /// Talks to the control API at `control_addr`, each request bounded by `request_timeout_ms`.
    pub fn with_timeout(
        control_addr: SocketAddr,
        request_timeout_ms: u64,
    ) -> Result<Self, ChaosError> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_millis(request_timeout_ms))
            .build()
            .map_err(|e| ChaosError::Remote(format!("build HTTP client: {e}")))?;
        Ok(Self {
            base_url: format!("http://{control_addr}"),
            client,
        })
    }

    /// `GET /ready`: `Ok(true)` when the proxy answers.
    pub async fn ready(&self) -> Result<bool, ChaosError> {
        let response = self
            .client
            .get(format!("{}/ready", self.base_url))
            .send()
            .await
            .map_err(remote)?;
        Ok(response.status().is_success())
    }

    /// `GET /faults`.
    pub async fn faults(&self) -> Result<Faults, ChaosError> {
        let request = self.client.get(format!("{}/faults", self.base_url));
        decode(request).await
    }

    /// `PUT /faults`; returns the faults now in force.
    pub async fn set_faults(&self, faults: &Faults) -> Result<Faults, ChaosError> {
        let request = self
            .client
            .put(format!("{}/faults", self.base_url))
            .json(faults);
        decode(request).await
    }

    /// `POST /reset`; returns how many connections were reset.
    pub async fn reset_all(&self) -> Result<usize, ChaosError> {
        let request = self.client.post(format!("{}/reset", self.base_url));
        Ok(decode::<ResetReply>(request).await?.reset_connections)
    }

    /// `GET /connections`.
    pub async fn connections(&self) -> Result<usize, ChaosError> {
        let request = self.client.get(format!("{}/connections", self.base_url));
        Ok(decode::<ConnectionsReply>(request).await?.connections)
    }
}

fn remote(e: reqwest::Error) -> ChaosError {
    ChaosError::Remote(e.to_string())
}

async fn decode<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
) -> Result<T, ChaosError> {
    let response = request.send().await.map_err(remote)?;
    let status = response.status();
    if status.is_success() {
        return response.json::<T>().await.map_err(remote);
    }
    let reason = match response.json::<ErrorReply>().await {
        Ok(body) => body.reason,
        Err(_) => String::from("(no reason given)"),
    };
    Err(ChaosError::Remote(format!("{status}: {reason}")))
}
