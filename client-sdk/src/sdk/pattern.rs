//! Topic discovery for pattern consumers ([`super::consumer::ConsumerBuilder::topics_pattern`]):
//! parses a pattern such as `persistent://public/default/orders-.*` into its
//! namespace and regex, and lists the namespace's matching topics with
//! GET_TOPICS_OF_NAMESPACE (sending the last topics hash so an unchanged
//! list is not sent again).
//!
//! Promises:
//! - the tenant and namespace of a pattern are literal (a regex there is an
//!   error, as Pulsar requires);
//! - matching is a full match of the regex against the name without its
//!   `persistent://` / `non-persistent://` scheme (the broker's rule), and
//!   the SDK filters itself when the broker answers unfiltered;
//! - a pattern longer than [`PATTERN_BYTES_MAX`] is refused.

use regex::Regex;

use super::client::Client;
use super::error::{Error, Result};
use crate::proto::commands;

/// Longest pattern accepted.
pub const PATTERN_BYTES_MAX: usize = 1024;

/// Which topics of the namespace a pattern consumer considers (Pulsar's
/// `RegexSubscriptionMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PatternMode {
    /// `persistent://` topics (default, as Pulsar).
    #[default]
    Persistent,
    /// `non-persistent://` topics.
    NonPersistent,
    /// Both.
    All,
}

impl PatternMode {
    /// The wire value of `CommandGetTopicsOfNamespace.Mode`.
    fn wire(self) -> i32 {
        match self {
            PatternMode::Persistent => 0,
            PatternMode::NonPersistent => 1,
            PatternMode::All => 2,
        }
    }
}

/// A parsed topics pattern.
#[derive(Debug, Clone)]
pub(crate) struct Pattern {
    /// As the user gave it (sent to the broker).
    pub(crate) text: String,
    /// `tenant/namespace`.
    pub(crate) namespace: String,
    /// Anchored regex over names without scheme.
    regex: Regex,
    pub(crate) mode: PatternMode,
}

fn strip_scheme(s: &str) -> &str {
    s.split_once("://").map_or(s, |(_, rest)| rest)
}

impl Pattern {
    /// Parses `pattern` (`[scheme://]tenant/namespace/<regex>`).
    pub(crate) fn parse(pattern: &str, mode: PatternMode) -> Result<Pattern> {
        let bad = |why: &str| Error::Unsupported(format!("topics pattern {pattern:?}: {why}"));
        if pattern.len() > PATTERN_BYTES_MAX {
            return Err(bad("longer than 1024 bytes"));
        }
        let rest = strip_scheme(pattern);
        let mut it = rest.splitn(3, '/');
        let (Some(tenant), Some(ns), Some(local)) = (it.next(), it.next(), it.next()) else {
            return Err(bad("expected [persistent://]tenant/namespace/<regex>"));
        };
        let literal = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '=' | ':' | '.'))
        };
        if !literal(tenant) || !literal(ns) || local.is_empty() {
            return Err(bad("tenant and namespace must be literal names"));
        }
        let regex = Regex::new(&format!("^(?:{rest})$"))
            .map_err(|e| bad(&format!("invalid regex: {e}")))?;
        Ok(Pattern {
            text: pattern.to_owned(),
            namespace: format!("{tenant}/{ns}"),
            regex,
            mode,
        })
    }

    /// Whether topic `name` (full name) matches.
    pub(crate) fn matches(&self, name: &str) -> bool {
        let scheme_ok = match self.mode {
            PatternMode::Persistent => !name.starts_with("non-persistent://"),
            PatternMode::NonPersistent => name.starts_with("non-persistent://"),
            PatternMode::All => true,
        };
        scheme_ok && self.regex.is_match(strip_scheme(name))
    }

    /// Lists the matching topics (partitions of partitioned topics are
    /// listed one by one). `Ok((None, hash))` when the list is unchanged
    /// since `hash`.
    pub(crate) async fn list(
        &self,
        client: &Client,
        hash: Option<&str>,
    ) -> Result<(Option<Vec<String>>, Option<String>)> {
        let conn = client.service_connection().await?;
        let rid = client.next_id();
        let r = conn
            .request(
                rid,
                commands::get_topics_of_namespace(
                    rid,
                    &self.namespace,
                    self.mode.wire(),
                    Some(&self.text),
                    hash,
                ),
            )
            .await?;
        let r = r.get_topics_of_namespace_response.ok_or_else(|| {
            Error::Protocol("GET_TOPICS_OF_NAMESPACE_RESPONSE without body".into())
        })?;
        if r.changed == Some(false) {
            return Ok((None, r.topics_hash));
        }
        let mut topics: Vec<String> = if r.filtered == Some(true) {
            r.topics
        } else {
            r.topics.into_iter().filter(|t| self.matches(t)).collect()
        };
        topics.sort();
        topics.dedup();
        Ok((Some(topics), r.topics_hash))
    }
}

/// The partition index of `<topic>-partition-<i>`, -1 otherwise.
pub(crate) fn partition_of(topic: &str) -> i32 {
    topic
        .rsplit_once("-partition-")
        .and_then(|(_, i)| i.parse::<i32>().ok())
        .filter(|i| *i >= 0)
        .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_namespace_and_matches_full_names_without_scheme() {
        let p = Pattern::parse(
            "persistent://public/default/orders-.*",
            PatternMode::Persistent,
        )
        .unwrap();
        assert_eq!(p.namespace, "public/default");
        assert!(p.matches("persistent://public/default/orders-1"));
        assert!(p.matches("persistent://public/default/orders-1-partition-0"));
        assert!(!p.matches("persistent://public/default/other"));
        assert!(!p.matches("persistent://public/default2/orders-1"));
        assert!(!p.matches("non-persistent://public/default/orders-1"));
        // Full match: a prefix is not enough.
        let q = Pattern::parse("public/default/a", PatternMode::All).unwrap();
        assert!(q.matches("non-persistent://public/default/a"));
        assert!(!q.matches("persistent://public/default/ab"));
    }

    #[test]
    fn refuses_regex_in_namespace_bad_regex_and_long_patterns() {
        for bad in [
            "persistent://pub.*/default/x",
            "persistent://public/def(ault/x",
            "public/default",
            "public/default/(",
        ] {
            assert!(
                Pattern::parse(bad, PatternMode::Persistent).is_err(),
                "{bad}"
            );
        }
        let long = format!("public/default/{}", "a".repeat(PATTERN_BYTES_MAX));
        assert!(Pattern::parse(&long, PatternMode::Persistent).is_err());
    }

    #[test]
    fn partition_suffix_is_parsed() {
        assert_eq!(partition_of("persistent://a/b/t-partition-3"), 3);
        assert_eq!(partition_of("persistent://a/b/t"), -1);
        assert_eq!(partition_of("persistent://a/b/t-partition-x"), -1);
    }
}
