//! Validation of the names the admin API receives in paths: tenants,
//! namespaces, clusters and subscriptions follow Pulsar's character rule
//! (`[-=:.\w]`, not `.` / `..`), topics reuse [`TopicName::parse`]. Every
//! part is at most [`NAME_PART_BYTES_MAX`] bytes, so a valid name is always
//! one valid metadata-path component. Pure: no I/O.

use crate::admin::AdminError;
use crate::topic_name::{Domain, NAME_PART_BYTES_MAX, TopicName};

/// Checks a tenant, namespace, cluster or subscription name.
pub fn check(what: &str, name: &str) -> Result<(), AdminError> {
    let bad = |reason: String| AdminError::BadRequest(format!("invalid {what} {name:?}: {reason}"));
    if name.is_empty() {
        return Err(bad("empty".into()));
    }
    if name.len() > NAME_PART_BYTES_MAX {
        return Err(bad(format!("longer than {NAME_PART_BYTES_MAX} bytes")));
    }
    if name == "." || name == ".." {
        return Err(bad("must not be '.' or '..'".into()));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '=' | ':' | '.')))
    {
        return Err(bad(format!(
            "contains {c:?} (allowed: letters, digits, - _ = : .)"
        )));
    }
    Ok(())
}

/// The domain path segment (`persistent` / `non-persistent`).
pub fn domain(segment: &str) -> Result<Domain, AdminError> {
    match segment {
        "persistent" => Ok(Domain::Persistent),
        "non-persistent" => Ok(Domain::NonPersistent),
        _ => Err(AdminError::NotFound("no such endpoint".into())),
    }
}

/// A full topic name from its path segments.
pub fn topic(
    domain: Domain,
    tenant: &str,
    namespace: &str,
    local: &str,
) -> Result<TopicName, AdminError> {
    check("tenant", tenant)?;
    check("namespace", namespace)?;
    TopicName::parse(&format!(
        "{}://{tenant}/{namespace}/{local}",
        domain.as_str()
    ))
    .map_err(|e| AdminError::BadRequest(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_pulsars_rule() {
        for ok in ["public", "my-tenant", "a_b", "x=y:z.w", "A1"] {
            assert_eq!(check("tenant", ok), Ok(()), "{ok}");
        }
        let long = "a".repeat(NAME_PART_BYTES_MAX + 1);
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a b",
            "é",
            "a\n",
            "a%2F",
            long.as_str(),
        ] {
            assert!(
                matches!(check("tenant", bad), Err(AdminError::BadRequest(_))),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn topics_reuse_the_topic_name_rules() {
        let t = topic(Domain::Persistent, "a", "b", "c-1").unwrap();
        assert_eq!(t.to_string(), "persistent://a/b/c-1");
        assert!(topic(Domain::Persistent, "a", "b", "..").is_err());
        assert!(topic(Domain::Persistent, "a", "b", "x y").is_err());
        assert!(topic(Domain::Persistent, "a b", "b", "c").is_err());
        assert_eq!(domain("persistent"), Ok(Domain::Persistent));
        assert!(matches!(domain("nope"), Err(AdminError::NotFound(_))));
    }
}
