//! Topic names: parsing and validation of what clients send.
//!
//! Accepted forms (Pulsar's v2 names):
//! - `persistent://tenant/namespace/topic` (and `non-persistent://…`, parsed
//!   so the broker can refuse it by name);
//! - `tenant/namespace/topic` = `persistent://tenant/namespace/topic`;
//! - `topic` = `persistent://public/default/topic`.
//!
//! Promise: a name that parses has non-empty tenant, namespace and local
//! parts made of characters that are safe as one metadata-path component
//! (no `/`, no control characters, not `.` or `..`), each at most
//! [`NAME_PART_BYTES_MAX`] bytes, so the managed-ledger node path built from
//! it is always valid. Pure: no I/O.

use std::fmt;

/// Longest tenant, namespace or local topic name, in bytes.
pub const NAME_PART_BYTES_MAX: usize = 255;

/// Tenant of short topic names.
pub const DEFAULT_TENANT: &str = "public";
/// Namespace of short topic names.
pub const DEFAULT_NAMESPACE: &str = "default";

/// `persistent` or `non-persistent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Domain {
    /// Stored in a managed ledger.
    Persistent,
    /// Not stored (not served yet).
    NonPersistent,
}

impl Domain {
    /// The scheme as written in names.
    pub fn as_str(self) -> &'static str {
        match self {
            Domain::Persistent => "persistent",
            Domain::NonPersistent => "non-persistent",
        }
    }
}

/// A parsed, valid topic name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicName {
    /// Domain.
    pub domain: Domain,
    /// Tenant.
    pub tenant: String,
    /// Namespace (local part, without the tenant).
    pub namespace: String,
    /// Local topic name.
    pub local: String,
}

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid topic name {name:?}: {reason}")]
pub struct InvalidTopicName {
    /// The name as received (truncated to 300 bytes).
    pub name: String,
    /// What is wrong.
    pub reason: String,
}

fn check_part(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("empty {what}"));
    }
    if s.len() > NAME_PART_BYTES_MAX {
        return Err(format!("{what} longer than {NAME_PART_BYTES_MAX} bytes"));
    }
    if s == "." || s == ".." {
        return Err(format!("{what} must not be '.' or '..'"));
    }
    if let Some(c) = s
        .chars()
        .find(|c| c.is_control() || c.is_whitespace() || *c == '/')
    {
        return Err(format!("{what} contains {c:?}"));
    }
    Ok(())
}

impl TopicName {
    /// Parses a name as a client sends it.
    pub fn parse(name: &str) -> Result<TopicName, InvalidTopicName> {
        let err = |reason: String| InvalidTopicName {
            name: name.chars().take(300).collect(),
            reason,
        };
        let (domain, rest) = if let Some(r) = name.strip_prefix("persistent://") {
            (Domain::Persistent, r)
        } else if let Some(r) = name.strip_prefix("non-persistent://") {
            (Domain::NonPersistent, r)
        } else if name.contains("://") {
            return Err(err(
                "unknown domain (use persistent://tenant/namespace/topic)".into(),
            ));
        } else {
            let parts: Vec<&str> = name.split('/').collect();
            return match parts.as_slice() {
                [local] => {
                    Self::build(Domain::Persistent, DEFAULT_TENANT, DEFAULT_NAMESPACE, local)
                        .map_err(err)
                }
                [t, ns, local] => Self::build(Domain::Persistent, t, ns, local).map_err(err),
                _ => Err(err(
                    "expected `topic`, `tenant/namespace/topic` or a full persistent:// name"
                        .into(),
                )),
            };
        };
        let parts: Vec<&str> = rest.splitn(3, '/').collect();
        match parts.as_slice() {
            [t, ns, local] => Self::build(domain, t, ns, local).map_err(err),
            _ => Err(err("expected <domain>://tenant/namespace/topic".into())),
        }
    }

    fn build(domain: Domain, t: &str, ns: &str, local: &str) -> Result<TopicName, String> {
        check_part("tenant", t)?;
        check_part("namespace", ns)?;
        check_part("topic", local)?;
        Ok(TopicName {
            domain,
            tenant: t.to_string(),
            namespace: ns.to_string(),
            local: local.to_string(),
        })
    }

    /// `tenant/namespace`.
    pub fn namespace_name(&self) -> String {
        format!("{}/{}", self.tenant, self.namespace)
    }

    /// The managed ledger's name: `tenant/namespace/topic`.
    pub fn managed_ledger_name(&self) -> String {
        format!("{}/{}/{}", self.tenant, self.namespace, self.local)
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}/{}/{}",
            self.domain.as_str(),
            self.tenant,
            self.namespace,
            self.local
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms() {
        let table = [
            ("my-topic", "persistent://public/default/my-topic"),
            ("t/ns/x", "persistent://t/ns/x"),
            ("persistent://t/ns/x", "persistent://t/ns/x"),
            ("non-persistent://t/ns/x", "non-persistent://t/ns/x"),
            (
                "persistent://public/default/a.b-c_d=e:f%20",
                "persistent://public/default/a.b-c_d=e:f%20",
            ),
            (
                "persistent://t/ns/x-partition-3",
                "persistent://t/ns/x-partition-3",
            ),
        ];
        for (input, full) in table {
            let t = TopicName::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(t.to_string(), full, "{input}");
            assert_eq!(TopicName::parse(&t.to_string()).unwrap(), t);
        }
        let t = TopicName::parse("my-topic").unwrap();
        assert_eq!(t.managed_ledger_name(), "public/default/my-topic");
        assert_eq!(t.namespace_name(), "public/default");
    }

    #[test]
    fn refused_forms() {
        let long = "x".repeat(NAME_PART_BYTES_MAX + 1);
        let refused = [
            "",
            "persistent://",
            "persistent://t/ns",
            "persistent://t/ns/",
            "persistent:///ns/x",
            "persistent://t//x",
            "persistent://t/ns/a/b",
            "a/b",
            "a/b/c/d",
            "http://t/ns/x",
            "persistent://t/ns/..",
            "persistent://t/./x",
            "persistent://t/ns/a b",
            "persistent://t/ns/a\u{0}b",
            "persistent://t/ns/a\nb",
            &format!("persistent://t/ns/{long}"),
        ];
        for input in refused {
            let e = TopicName::parse(input).unwrap_err();
            assert!(!e.reason.is_empty(), "{input}");
            assert!(e.to_string().contains("invalid topic name"), "{e}");
        }
    }
}
