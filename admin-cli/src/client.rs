//! The HTTP side of `cms-admin`: one blocking client over the admin REST API
//! (`/admin/v2`) with the bearer token, the CA file and the timeout applied to
//! every request, and the mapping of every failure to an [`AdminError`] whose
//! [`AdminError::exit_code`] is the documented process exit code.
//!
//! Promises: a request never outlives the configured timeout (connect
//! included); an error answer's `{"reason": ...}` is what the user sees; a
//! response body is read up to [`RESPONSE_BYTES_MAX`] bytes.

use std::io::Read;
use std::time::Duration;

use reqwest::Method;
use reqwest::blocking::{Client, Response};
use serde_json::Value;

/// Largest response body read, in bytes (stats of a big partitioned topic
/// fit many times over).
pub const RESPONSE_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// Redirects (307 to the owning broker) followed per request.
pub const REDIRECTS_MAX: u32 = 5;

/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: the server refused the request (400, 401, 403, 405 and other
/// 4xx not listed below), or a local problem (unreadable file, bad config).
pub const EXIT_REFUSED: u8 = 1;
/// Exit code: bad command line (clap's usage errors, a destructive command
/// without `--yes` when nobody can be asked).
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the resource does not exist (404).
pub const EXIT_NOT_FOUND: u8 = 3;
/// Exit code: conflict with the resource's state (409 exists / in use,
/// 412 precondition failed).
pub const EXIT_CONFLICT: u8 = 4;
/// Exit code: server-side failure (5xx).
pub const EXIT_SERVER: u8 = 5;
/// Exit code: the server could not be reached or did not answer in time.
pub const EXIT_UNREACHABLE: u8 = 6;

/// What can go wrong running a command.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The server answered an error status.
    #[error("{reason} (HTTP {status})")]
    Http {
        /// HTTP status.
        status: u16,
        /// The server's `reason`, or the raw body / status text.
        reason: String,
    },
    /// The server could not be reached, or did not answer in time.
    #[error("cannot reach {url}: {detail}")]
    Unreachable {
        /// The URL tried.
        url: String,
        /// Why (connection refused, timed out, TLS failure...).
        detail: String,
    },
    /// Bad command-line use found after parsing.
    #[error("{0}")]
    Usage(String),
    /// A local problem: unreadable file, bad config, unexpected answer.
    #[error("{0}")]
    Local(String),
}

impl AdminError {
    /// The documented process exit code of this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            AdminError::Http { status, .. } => match status {
                404 => EXIT_NOT_FOUND,
                409 | 412 => EXIT_CONFLICT,
                s if *s >= 500 => EXIT_SERVER,
                _ => EXIT_REFUSED,
            },
            AdminError::Unreachable { .. } => EXIT_UNREACHABLE,
            AdminError::Usage(_) => EXIT_USAGE,
            AdminError::Local(_) => EXIT_REFUSED,
        }
    }
}

/// Result of a command.
pub type AdminResult<T> = Result<T, AdminError>;

/// Connection settings, resolved from flags, environment and profile.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Base URL (`http://host:port` or `https://...`), no trailing slash.
    pub url: String,
    /// Bearer token, if any.
    pub token: Option<String>,
    /// PEM file of an extra trusted CA.
    pub tls_ca_file: Option<String>,
    /// Bound on each request.
    pub timeout: Duration,
}

/// The admin REST client.
pub struct Admin {
    client: Client,
    base: String,
    token: Option<String>,
}

/// A peeked message: the payload and the `X-Pulsar-*` headers.
#[derive(Debug, Clone)]
pub struct Peeked {
    /// Payload bytes.
    pub payload: Vec<u8>,
    /// Headers as (name, value), names lower-case.
    pub headers: Vec<(String, String)>,
}

impl Admin {
    /// A client for `s`.
    pub fn new(s: &Settings) -> AdminResult<Admin> {
        let url = s.url.trim_end_matches('/').to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(AdminError::Usage(format!(
                "--url must start with http:// or https://, got {url:?}"
            )));
        }
        let mut b = Client::builder()
            .timeout(s.timeout)
            .connect_timeout(s.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("cms-admin/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &s.tls_ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| AdminError::Local(format!("reading --tls-ca-file {ca}: {e}")))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| AdminError::Local(format!("--tls-ca-file {ca}: {e}")))?;
            if certs.is_empty() {
                return Err(AdminError::Local(format!(
                    "--tls-ca-file {ca}: no PEM certificate in the file"
                )));
            }
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        let client = b
            .build()
            .map_err(|e| AdminError::Local(format!("HTTP client: {e}")))?;
        Ok(Admin {
            client,
            base: url,
            token: s.token.clone(),
        })
    }

    fn send(&self, method: Method, path: &str, body: Option<&Value>) -> AdminResult<Response> {
        let mut url = format!("{}{path}", self.base);
        let mut hops = 0;
        let resp = loop {
            let mut r = self.client.request(method.clone(), &url);
            if let Some(t) = &self.token {
                r = r.bearer_auth(t);
            }
            if let Some(b) = body {
                r = r
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(b.to_string());
            }
            let resp = r.send().map_err(|e| AdminError::Unreachable {
                url: url.clone(),
                detail: describe(&e),
            })?;
            // A topic owned by another broker: 307 to the same path there.
            // Followed here (not by reqwest) so the token goes along.
            let location = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(str::to_string);
            match (resp.status().as_u16(), location) {
                (307 | 308, Some(loc)) if hops < REDIRECTS_MAX => {
                    hops += 1;
                    url = loc;
                }
                _ => break resp,
            }
        };
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let text = read_body(resp, &self.base)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        Err(AdminError::Http {
            status: status.as_u16(),
            reason: reason_of(&text, status),
        })
    }

    /// `method path` with an optional JSON body: the JSON answer, or `Null`
    /// for an empty one (204).
    pub fn call(&self, method: Method, path: &str, body: Option<&Value>) -> AdminResult<Value> {
        let resp = self.send(method.clone(), path, body)?;
        let bytes = read_body(resp, &self.base)?;
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            AdminError::Local(format!(
                "{method} {path}: the server answered non-JSON ({e}): {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            ))
        })
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> AdminResult<Value> {
        self.call(Method::GET, path, None)
    }

    /// `PUT path` with an optional body.
    pub fn put(&self, path: &str, body: Option<&Value>) -> AdminResult<Value> {
        self.call(Method::PUT, path, body)
    }

    /// `POST path` with an optional body.
    pub fn post(&self, path: &str, body: Option<&Value>) -> AdminResult<Value> {
        self.call(Method::POST, path, body)
    }

    /// `DELETE path`.
    pub fn delete(&self, path: &str) -> AdminResult<Value> {
        self.call(Method::DELETE, path, None)
    }

    /// `GET path` answering raw bytes (a peek).
    pub fn get_raw(&self, path: &str) -> AdminResult<Peeked> {
        let resp = self.send(Method::GET, path, None)?;
        let headers = resp
            .headers()
            .iter()
            .filter_map(|(k, v)| {
                v.to_str()
                    .ok()
                    .map(|v| (k.as_str().to_ascii_lowercase(), v.to_string()))
            })
            .collect();
        let payload = read_body(resp, &self.base)?;
        Ok(Peeked { payload, headers })
    }
}

fn read_body(resp: Response, base: &str) -> AdminResult<Vec<u8>> {
    let mut out = Vec::new();
    resp.take(RESPONSE_BYTES_MAX)
        .read_to_end(&mut out)
        .map_err(|e| AdminError::Unreachable {
            url: base.to_string(),
            detail: format!("reading the answer: {e}"),
        })?;
    Ok(out)
}

/// The `reason` of an error body, else the body itself, else the status text.
pub fn reason_of(text: &str, status: reqwest::StatusCode) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(text)
        && let Some(r) = v.get("reason").and_then(Value::as_str)
    {
        return r.to_string();
    }
    let t = text.trim();
    if t.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("no reason given")
            .to_string()
    } else {
        t.chars().take(500).collect()
    }
}

/// A transport error with its causes (reqwest's own message is terse).
fn describe(e: &reqwest::Error) -> String {
    let mut s = if e.is_timeout() {
        "timed out (see --timeout)".to_string()
    } else if e.is_connect() {
        "connection failed".to_string()
    } else {
        "request failed".to_string()
    };
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Percent-encodes one path segment (names are validated by the server; this
/// keeps a stray `/`, `?` or `#` from changing the path).
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'=' | b':' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_documented_table() {
        let h = |status| AdminError::Http {
            status,
            reason: String::new(),
        };
        assert_eq!(h(400).exit_code(), EXIT_REFUSED);
        assert_eq!(h(403).exit_code(), EXIT_REFUSED);
        assert_eq!(h(404).exit_code(), EXIT_NOT_FOUND);
        assert_eq!(h(409).exit_code(), EXIT_CONFLICT);
        assert_eq!(h(412).exit_code(), EXIT_CONFLICT);
        assert_eq!(h(500).exit_code(), EXIT_SERVER);
        assert_eq!(h(503).exit_code(), EXIT_SERVER);
        let u = AdminError::Unreachable {
            url: String::new(),
            detail: String::new(),
        };
        assert_eq!(u.exit_code(), EXIT_UNREACHABLE);
        assert_eq!(AdminError::Usage(String::new()).exit_code(), EXIT_USAGE);
        assert_eq!(AdminError::Local(String::new()).exit_code(), EXIT_REFUSED);
    }

    #[test]
    fn reason_comes_from_the_json_body_else_the_text() {
        let s = reqwest::StatusCode::CONFLICT;
        assert_eq!(
            reason_of(r#"{"reason":"tenant t exists"}"#, s),
            "tenant t exists"
        );
        assert_eq!(reason_of("plain words", s), "plain words");
        assert_eq!(reason_of("", s), "Conflict");
    }

    #[test]
    fn segments_are_escaped() {
        assert_eq!(seg("a-b_c.d=e:f"), "a-b_c.d=e:f");
        assert_eq!(seg("a/b?c#d e"), "a%2Fb%3Fc%23d%20e");
    }

    #[test]
    fn urls_without_a_scheme_are_refused() {
        let s = Settings {
            url: "localhost:8080".into(),
            timeout: Duration::from_secs(1),
            ..Settings::default()
        };
        assert!(matches!(Admin::new(&s), Err(AdminError::Usage(_))));
    }
}
