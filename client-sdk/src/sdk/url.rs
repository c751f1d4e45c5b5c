//! Service URL parsing: `pulsar://host[:port][,host2[:port]]...[/]` and
//! the same with `pulsar+ssl://` (TLS).
//! Promises: every host has a port (default 6650, or 6651 with TLS); an
//! empty host list, a bad port or an unknown scheme is
//! [`Error::InvalidUrl`].

use super::error::{Error, Result};

/// Default Pulsar binary-protocol port.
pub const DEFAULT_PORT: u16 = 6650;
/// Default Pulsar binary-protocol port over TLS.
pub const DEFAULT_TLS_PORT: u16 = 6651;

/// A parsed service URL: the hosts to try, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceUrl {
    /// `host:port` strings.
    pub hosts: Vec<String>,
    /// `pulsar+ssl://`: every connection is TLS.
    pub tls: bool,
}

impl ServiceUrl {
    /// Parses a `pulsar://` or `pulsar+ssl://` service URL.
    pub fn parse(url: &str) -> Result<ServiceUrl> {
        let invalid = |reason: &str| Error::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let (rest, tls) = if let Some(rest) = url.strip_prefix("pulsar://") {
            (rest, false)
        } else if let Some(rest) = url.strip_prefix("pulsar+ssl://") {
            (rest, true)
        } else {
            return Err(invalid("the scheme must be pulsar:// or pulsar+ssl://"));
        };
        let default_port = if tls { DEFAULT_TLS_PORT } else { DEFAULT_PORT };
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') || rest.contains('?') {
            return Err(invalid("a service URL has no path or query"));
        }
        let mut hosts = Vec::new();
        for part in rest.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(invalid("empty host"));
            }
            // `[v6addr]:port` keeps its brackets; otherwise the last `:` splits.
            let (host, port) = match part.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') || h.ends_with(']') => (h, Some(p)),
                Some(_) => return Err(invalid("an IPv6 host must be in brackets")),
                None => (part, None),
            };
            if host.is_empty() {
                return Err(invalid("empty host"));
            }
            let port = match port {
                Some(p) => p
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| invalid("bad port"))?,
                None => default_port,
            };
            hosts.push(format!("{host}:{port}"));
        }
        Ok(ServiceUrl { hosts, tls })
    }
}

/// A broker to connect to: `host:port` and whether the connection is TLS.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BrokerAddr {
    /// `host:port`.
    pub addr: String,
    /// Connect with TLS.
    pub tls: bool,
}

impl BrokerAddr {
    /// The host part of `addr` (without brackets for IPv6): what the
    /// server certificate must name.
    pub fn host(&self) -> &str {
        let h = self
            .addr
            .rsplit_once(':')
            .map_or(self.addr.as_str(), |(h, _)| h);
        h.trim_start_matches('[').trim_end_matches(']')
    }
}

impl std::fmt::Display for BrokerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "pulsar+ssl" } else { "pulsar" };
        write!(f, "{scheme}://{}", self.addr)
    }
}

/// `pulsar://host:port` or `pulsar+ssl://host:port` (as in lookup
/// answers) to the broker to connect to.
pub fn broker_addr(url: &str) -> Result<BrokerAddr> {
    let parsed = ServiceUrl::parse(url)?;
    match parsed.hosts.as_slice() {
        [one] => Ok(BrokerAddr {
            addr: one.clone(),
            tls: parsed.tls,
        }),
        _ => Err(Error::InvalidUrl {
            url: url.to_owned(),
            reason: "a broker URL names exactly one host".to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_and_multi_host() {
        assert_eq!(
            ServiceUrl::parse("pulsar://localhost:6651").unwrap().hosts,
            vec!["localhost:6651"]
        );
        assert_eq!(
            ServiceUrl::parse("pulsar://a,b:7000/").unwrap().hosts,
            vec!["a:6650", "b:7000"]
        );
        let b = broker_addr("pulsar://127.0.0.1:1234").unwrap();
        assert_eq!((b.addr.as_str(), b.tls), ("127.0.0.1:1234", false));
        assert_eq!(b.host(), "127.0.0.1");
    }

    #[test]
    fn parses_tls_urls_with_their_default_port() {
        let u = ServiceUrl::parse("pulsar+ssl://h1:7651,h2").unwrap();
        assert_eq!(u.hosts, vec!["h1:7651", "h2:6651"]);
        assert!(u.tls);
        assert!(!ServiceUrl::parse("pulsar://h1").unwrap().tls);
        let b = broker_addr("pulsar+ssl://[::1]:6651").unwrap();
        assert!(b.tls);
        assert_eq!(b.host(), "::1");
        assert_eq!(b.to_string(), "pulsar+ssl://[::1]:6651");
    }

    #[test]
    fn rejects_bad_urls() {
        for bad in [
            "http://a:1",
            "pulsar://",
            "pulsar://a:x",
            "pulsar://a:0",
            "pulsar://a,,b",
            "pulsar://a/ns",
            "pulsar://:80",
        ] {
            assert!(
                matches!(ServiceUrl::parse(bad), Err(Error::InvalidUrl { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            ServiceUrl::parse("pulsar+ssl://"),
            Err(Error::InvalidUrl { .. })
        ));
        assert!(broker_addr("pulsar://a,b").is_err());
    }
}
