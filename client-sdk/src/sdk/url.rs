//! Service URL parsing: `pulsar://host[:port][,host2[:port]]...[/]`.
//! Promises: every host has a port (default 6650); an empty host list, a bad
//! port or an unknown scheme is [`Error::InvalidUrl`]; `pulsar+ssl://` is
//! recognised and refused as [`Error::Unsupported`] (no TLS in this SDK yet).

use super::error::{Error, Result};

/// Default Pulsar binary-protocol port.
pub const DEFAULT_PORT: u16 = 6650;

/// A parsed service URL: the hosts to try, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceUrl {
    /// `host:port` strings.
    pub hosts: Vec<String>,
}

impl ServiceUrl {
    /// Parses a `pulsar://` service URL.
    pub fn parse(url: &str) -> Result<ServiceUrl> {
        let invalid = |reason: &str| Error::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let rest = if let Some(rest) = url.strip_prefix("pulsar://") {
            rest
        } else if url.starts_with("pulsar+ssl://") {
            return Err(Error::Unsupported(format!(
                "TLS service URLs ({url}) are not supported by this SDK"
            )));
        } else {
            return Err(invalid("the scheme must be pulsar://"));
        };
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
                None => DEFAULT_PORT,
            };
            hosts.push(format!("{host}:{port}"));
        }
        Ok(ServiceUrl { hosts })
    }
}

/// `pulsar://host:port` (as in lookup answers) to `host:port`.
pub fn broker_addr(url: &str) -> Result<String> {
    let parsed = ServiceUrl::parse(url)?;
    match parsed.hosts.as_slice() {
        [one] => Ok(one.clone()),
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
        assert_eq!(
            broker_addr("pulsar://127.0.0.1:1234").unwrap(),
            "127.0.0.1:1234"
        );
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
            ServiceUrl::parse("pulsar+ssl://a:6651"),
            Err(Error::Unsupported(_))
        ));
        assert!(broker_addr("pulsar://a,b").is_err());
    }
}
