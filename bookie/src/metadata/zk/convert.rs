//! Pure translations between the `zookeeper-client` crate and the metadata API:
//! errors, stats, session states, expected versions and the connect string.
//!
//! No I/O here, so every rule is unit-tested: which ZooKeeper error becomes which
//! [`MetadataError`] (with which path), how a ZooKeeper session state is reported,
//! and how `host:port[,host:port...][/chroot]` is split.

use zookeeper_client as zk;

use crate::metadata::{
    CreateMode, Expected, MetadataError, Result, SessionState, Stat, Version, parent_of,
    validate_path,
};

/// What an operation was about, for turning a ZooKeeper error into a
/// [`MetadataError`] that names the right path.
#[derive(Debug, Clone, Copy)]
pub(super) struct Target<'a> {
    /// The path the caller passed.
    pub path: &'a str,
    /// The version the caller expected (`set`, `delete`).
    pub expected: Expected,
    /// True for `create`: `NoNode` and `NoChildrenForEphemerals` are then about
    /// the parent, not the node being created.
    pub creating: bool,
}

impl<'a> Target<'a> {
    /// A read or a watch of `path`.
    pub fn node(path: &'a str) -> Self {
        Target {
            path,
            expected: Expected::Any,
            creating: false,
        }
    }

    /// A `set` or `delete` of `path` expecting `expected`.
    pub fn versioned(path: &'a str, expected: Expected) -> Self {
        Target {
            path,
            expected,
            creating: false,
        }
    }

    /// A `create` of `path`.
    pub fn create(path: &'a str) -> Self {
        Target {
            path,
            expected: Expected::Any,
            creating: true,
        }
    }

    fn parent(&self) -> String {
        parent_of(self.path).unwrap_or("/").to_string()
    }
}

/// Maps a ZooKeeper error onto the metadata API's errors.
///
/// `ClientClosed` becomes [`MetadataError::Closed`]; the store turns it into
/// [`MetadataError::SessionExpired`] when its owner did not close it.
pub(super) fn map_error(err: &zk::Error, target: &Target<'_>) -> MetadataError {
    let path = target.path.to_string();
    match err {
        zk::Error::NoNode if target.creating => MetadataError::NoNode(target.parent()),
        zk::Error::NoNode => MetadataError::NoNode(path),
        zk::Error::NodeExists => MetadataError::NodeExists(path),
        zk::Error::BadVersion => MetadataError::BadVersion {
            path,
            expected: match target.expected {
                Expected::Version(v) => v,
                // ZooKeeper only reports BadVersion for a conditional call.
                Expected::Any => -1,
            },
        },
        zk::Error::NotEmpty => MetadataError::NotEmpty(path),
        zk::Error::NoChildrenForEphemerals => {
            MetadataError::NoChildrenForEphemerals(target.parent())
        }
        zk::Error::SessionExpired | zk::Error::SessionMoved => MetadataError::SessionExpired,
        zk::Error::ClientClosed => MetadataError::Closed,
        zk::Error::ConnectionLoss => MetadataError::ConnectionLoss(format!(
            "connection to ZooKeeper lost during an operation on {path}"
        )),
        // The crate fails calls in flight with whatever broke the connection (an
        // I/O error, a silent server): the outcome is unknown, the session may live.
        zk::Error::Custom(cause) => MetadataError::ConnectionLoss(format!(
            "connection to ZooKeeper lost during an operation on {path}: {cause}"
        )),
        zk::Error::NoHosts => {
            MetadataError::ConnectionLoss("no ZooKeeper server is reachable".to_string())
        }
        zk::Error::Timeout => MetadataError::ConnectionLoss(format!(
            "ZooKeeper client timed out during an operation on {path}"
        )),
        zk::Error::NoAuth => MetadataError::Backend(format!("not authorized to access {path}")),
        other => MetadataError::Backend(format!("ZooKeeper error at {path}: {other}")),
    }
}

/// The crate's create mode for ours.
pub(super) fn create_mode(mode: CreateMode) -> zk::CreateMode {
    match mode {
        CreateMode::Persistent => zk::CreateMode::Persistent,
        CreateMode::Ephemeral => zk::CreateMode::Ephemeral,
        CreateMode::PersistentSequential => zk::CreateMode::PersistentSequential,
        CreateMode::EphemeralSequential => zk::CreateMode::EphemeralSequential,
    }
}

/// Our stat from ZooKeeper's.
pub(super) fn stat_from_zk(stat: &zk::Stat) -> Stat {
    Stat {
        version: Version::from(stat.version),
        ctime_ms: stat.ctime,
        mtime_ms: stat.mtime,
        ephemeral_owner: stat.ephemeral_owner,
        num_children: usize::try_from(stat.num_children).unwrap_or(0),
        data_len: usize::try_from(stat.data_length).unwrap_or(0),
    }
}

/// How an [`Expected`] goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum VersionCheck {
    /// Unconditional (ZooKeeper's `-1`).
    Any,
    /// Conditional on this ZooKeeper version.
    Exact(i32),
    /// A version no node can have (negative, or past ZooKeeper's `i32`): the call
    /// fails with `BadVersion` if the node exists, `NoNode` if not. Never sent as
    /// is, since ZooKeeper reads `-1` as "any version".
    Impossible(Version),
}

/// Classifies an expected version.
pub(super) fn version_check(expected: Expected) -> VersionCheck {
    match expected {
        Expected::Any => VersionCheck::Any,
        Expected::Version(v) => match i32::try_from(v) {
            Ok(v32) if v32 >= 0 => VersionCheck::Exact(v32),
            _ => VersionCheck::Impossible(v),
        },
    }
}

/// Our session state for ZooKeeper's. `closed_by_owner` says whether the handle's
/// owner called `close` (or dropped it): only then is `Closed` reported; a session
/// the crate closed on its own is lost to us, so it is reported as `Expired`.
pub(super) fn session_state(state: zk::SessionState, closed_by_owner: bool) -> SessionState {
    match state {
        zk::SessionState::SyncConnected => SessionState::Connected,
        // Read-only sessions are never asked for; a read-only server cannot hold
        // our writes, so treat it like a lost connection.
        zk::SessionState::Disconnected | zk::SessionState::ConnectedReadOnly => {
            SessionState::Suspended
        }
        zk::SessionState::Expired | zk::SessionState::AuthFailed => SessionState::Expired,
        zk::SessionState::Closed if closed_by_owner => SessionState::Closed,
        zk::SessionState::Closed => SessionState::Expired,
    }
}

/// A connect string split into the servers and the optional chroot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ConnectString {
    /// `host:port[,host:port...]`, as the crate takes it.
    pub hosts: String,
    /// The chroot, validated; `None` for none or `/`.
    pub chroot: Option<String>,
}

/// Parses ZooKeeper's connect string `host:port[,host:port...][/chroot]`.
pub(super) fn parse_connect_string(s: &str) -> Result<ConnectString> {
    let s = s.trim();
    let bad = |reason: &str| {
        Err(MetadataError::Backend(format!(
            "invalid ZooKeeper connect string {s:?}: {reason}"
        )))
    };
    if s.contains("://") {
        return bad("protocol prefixes are not supported; use host:port[,host:port...][/chroot]");
    }
    let (hosts, chroot) = match s.find('/') {
        Some(i) => (&s[..i], Some(&s[i..])),
        None => (s, None),
    };
    if hosts.is_empty() {
        return bad("no servers");
    }
    if hosts.split(',').any(|h| h.trim().is_empty()) {
        return bad("empty server in the list");
    }
    if hosts.chars().any(char::is_whitespace) {
        return bad("whitespace inside the server list");
    }
    let chroot = match chroot {
        None | Some("/") => None,
        Some(c) => {
            validate_path(c)?;
            Some(c.to_string())
        }
    };
    Ok(ConnectString {
        hosts: hosts.to_string(),
        chroot,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_errors_name_the_node() {
        let t = Target::node("/a/b");
        assert_eq!(
            map_error(&zk::Error::NoNode, &t),
            MetadataError::NoNode("/a/b".into())
        );
        assert_eq!(
            map_error(&zk::Error::NodeExists, &t),
            MetadataError::NodeExists("/a/b".into())
        );
        assert_eq!(
            map_error(&zk::Error::NotEmpty, &t),
            MetadataError::NotEmpty("/a/b".into())
        );
    }

    #[test]
    fn create_errors_name_the_parent() {
        let t = Target::create("/a/b");
        assert_eq!(
            map_error(&zk::Error::NoNode, &t),
            MetadataError::NoNode("/a".into())
        );
        assert_eq!(
            map_error(&zk::Error::NoChildrenForEphemerals, &t),
            MetadataError::NoChildrenForEphemerals("/a".into())
        );
        assert_eq!(
            map_error(&zk::Error::NoNode, &Target::create("/top")),
            MetadataError::NoNode("/".into())
        );
        assert_eq!(
            map_error(&zk::Error::NodeExists, &t),
            MetadataError::NodeExists("/a/b".into())
        );
    }

    #[test]
    fn bad_version_carries_path_and_expected() {
        let t = Target::versioned("/v", Expected::Version(7));
        assert_eq!(
            map_error(&zk::Error::BadVersion, &t),
            MetadataError::BadVersion {
                path: "/v".into(),
                expected: 7
            }
        );
    }

    #[test]
    fn session_and_connection_errors() {
        let t = Target::node("/x");
        assert_eq!(
            map_error(&zk::Error::SessionExpired, &t),
            MetadataError::SessionExpired
        );
        assert_eq!(
            map_error(&zk::Error::SessionMoved, &t),
            MetadataError::SessionExpired
        );
        assert_eq!(
            map_error(&zk::Error::ClientClosed, &t),
            MetadataError::Closed
        );
        for e in [
            zk::Error::ConnectionLoss,
            zk::Error::NoHosts,
            zk::Error::Timeout,
        ] {
            assert!(
                matches!(map_error(&e, &t), MetadataError::ConnectionLoss(m) if !m.is_empty()),
                "{e:?}"
            );
        }
        for e in [
            zk::Error::NoAuth,
            zk::Error::InvalidAcl,
            zk::Error::Unimplemented,
            zk::Error::UnexpectedErrorCode(-42),
        ] {
            assert!(
                matches!(map_error(&e, &t), MetadataError::Backend(m) if m.contains("/x")),
                "{e:?}"
            );
        }
    }

    #[test]
    fn versions_on_the_wire() {
        assert_eq!(version_check(Expected::Any), VersionCheck::Any);
        assert_eq!(version_check(Expected::Version(0)), VersionCheck::Exact(0));
        assert_eq!(
            version_check(Expected::Version(i64::from(i32::MAX))),
            VersionCheck::Exact(i32::MAX)
        );
        // -1 would mean "any version" to ZooKeeper: never send it.
        assert_eq!(
            version_check(Expected::Version(-1)),
            VersionCheck::Impossible(-1)
        );
        let past = i64::from(i32::MAX) + 1;
        assert_eq!(
            version_check(Expected::Version(past)),
            VersionCheck::Impossible(past)
        );
    }

    #[test]
    fn stats_map_field_by_field() {
        let zs = zk::Stat {
            czxid: 1,
            mzxid: 2,
            pzxid: 3,
            ctime: 1_700_000_000_000,
            mtime: 1_700_000_000_500,
            version: 4,
            cversion: 9,
            aversion: 0,
            ephemeral_owner: 0x1234,
            data_length: 11,
            num_children: 3,
        };
        assert_eq!(
            stat_from_zk(&zs),
            Stat {
                version: 4,
                ctime_ms: 1_700_000_000_000,
                mtime_ms: 1_700_000_000_500,
                ephemeral_owner: 0x1234,
                num_children: 3,
                data_len: 11,
            }
        );
    }

    #[test]
    fn session_states() {
        use zk::SessionState as Z;
        assert_eq!(
            session_state(Z::SyncConnected, false),
            SessionState::Connected
        );
        assert_eq!(
            session_state(Z::Disconnected, false),
            SessionState::Suspended
        );
        assert_eq!(
            session_state(Z::ConnectedReadOnly, false),
            SessionState::Suspended
        );
        assert_eq!(session_state(Z::Expired, false), SessionState::Expired);
        assert_eq!(session_state(Z::Expired, true), SessionState::Expired);
        assert_eq!(session_state(Z::AuthFailed, false), SessionState::Expired);
        assert_eq!(session_state(Z::Closed, true), SessionState::Closed);
        // Closed without the owner asking: the session is lost, not closed.
        assert_eq!(session_state(Z::Closed, false), SessionState::Expired);
    }

    #[test]
    fn connect_strings_split_hosts_and_chroot() {
        let cs = |hosts: &str, chroot: Option<&str>| ConnectString {
            hosts: hosts.to_string(),
            chroot: chroot.map(str::to_string),
        };
        assert_eq!(
            parse_connect_string("127.0.0.1:2181").unwrap(),
            cs("127.0.0.1:2181", None)
        );
        assert_eq!(
            parse_connect_string("a:1,b:2,c:3/cms/test").unwrap(),
            cs("a:1,b:2,c:3", Some("/cms/test"))
        );
        assert_eq!(parse_connect_string("a:1/").unwrap(), cs("a:1", None));
        assert_eq!(parse_connect_string(" zk1 ").unwrap(), cs("zk1", None));
    }

    #[test]
    fn bad_connect_strings_are_refused() {
        for s in ["", "/cms", "a:1,,b:2", "a:1, b:2", "tcp://a:1"] {
            assert!(
                matches!(parse_connect_string(s), Err(MetadataError::Backend(_))),
                "{s:?}"
            );
        }
        for s in ["a:1/cms/", "a:1//cms", "a:1/cms/../x", "a:1/zookeeper"] {
            assert!(
                matches!(
                    parse_connect_string(s),
                    Err(MetadataError::InvalidPath { .. })
                ),
                "{s:?}"
            );
        }
    }
}
