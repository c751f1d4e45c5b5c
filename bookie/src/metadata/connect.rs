//! Metadata store URLs and opening a store from one.
//!
//! - `zk://host:port[,host:port...][/chroot]` — ZooKeeper (production, tests);
//! - `file:///absolute/path/metadata.redb` or `embedded:///…` — the embedded
//!   single-process store (standalone).
//!
//! Every binary takes its store as such a URL (`--metadata-url`), so the code
//! above [`connect`] never knows which backend it runs on.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use super::embedded::EmbeddedStore;
use super::zk::{ZkOptions, ZkStore};
use super::{MetadataError, MetadataStore};

/// Where a metadata store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataUrl {
    /// A ZooKeeper ensemble: ZooKeeper's own connect string, chroot included.
    ZooKeeper {
        /// `host:port[,host:port...][/chroot]`.
        connect_string: String,
    },
    /// The embedded store in one local file.
    Embedded {
        /// The redb file.
        path: PathBuf,
    },
}

impl FromStr for MetadataUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(rest) = s.strip_prefix("zk://") {
            let hosts = rest.split('/').next().unwrap_or("");
            if hosts.is_empty() {
                return Err(format!(
                    "{s:?}: no ZooKeeper host (expected zk://host:port[/chroot])"
                ));
            }
            for host in hosts.split(',') {
                let ok = host
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
                if !ok {
                    return Err(format!("{s:?}: {host:?} is not host:port"));
                }
            }
            if let Some(idx) = rest.find('/') {
                let chroot = &rest[idx..];
                super::validate_path(chroot).map_err(|e| format!("{s:?}: chroot: {e}"))?;
                if chroot == "/" {
                    return Err(format!(
                        "{s:?}: an empty chroot ('/'): drop the trailing '/'"
                    ));
                }
            }
            return Ok(MetadataUrl::ZooKeeper {
                connect_string: rest.to_string(),
            });
        }
        for scheme in ["file://", "embedded://"] {
            if let Some(path) = s.strip_prefix(scheme) {
                if !path.starts_with('/') {
                    return Err(format!(
                        "{s:?}: the embedded store needs an absolute path ({scheme}/dir/metadata.redb)"
                    ));
                }
                return Ok(MetadataUrl::Embedded {
                    path: PathBuf::from(path),
                });
            }
        }
        Err(format!(
            "{s:?}: unknown metadata URL scheme (use zk://host:port[/chroot] or file:///path)"
        ))
    }
}

impl fmt::Display for MetadataUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataUrl::ZooKeeper { connect_string } => write!(f, "zk://{connect_string}"),
            MetadataUrl::Embedded { path } => write!(f, "file://{}", path.display()),
        }
    }
}

/// Opens a session on the store at `url`. For ZooKeeper, `opts` sets the
/// session and operation timeouts; the embedded store ignores them.
pub async fn connect(
    url: &MetadataUrl,
    opts: &ZkOptions,
) -> Result<Arc<dyn MetadataStore>, MetadataError> {
    match url {
        MetadataUrl::ZooKeeper { connect_string } => {
            Ok(Arc::new(ZkStore::connect(connect_string, opts).await?))
        }
        MetadataUrl::Embedded { path } => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    MetadataError::Storage(format!("creating {}: {e}", dir.display()))
                })?;
            }
            Ok(Arc::new(EmbeddedStore::open(path).await?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        assert_eq!(
            "zk://127.0.0.1:2181".parse::<MetadataUrl>(),
            Ok(MetadataUrl::ZooKeeper {
                connect_string: "127.0.0.1:2181".into()
            })
        );
        assert_eq!(
            "zk://a:1,b:2/chroot/x".parse::<MetadataUrl>(),
            Ok(MetadataUrl::ZooKeeper {
                connect_string: "a:1,b:2/chroot/x".into()
            })
        );
        assert_eq!(
            "file:///var/lib/cms/metadata.redb".parse::<MetadataUrl>(),
            Ok(MetadataUrl::Embedded {
                path: "/var/lib/cms/metadata.redb".into()
            })
        );
    }

    #[test]
    fn bad_urls_say_why() {
        for bad in [
            "",
            "zk://",
            "zk://host",
            "zk://host:0",
            "zk://host:99999",
            "zk://h:1/",
            "zk://h:1//x",
            "file://relative/path",
            "http://x",
        ] {
            let e = bad.parse::<MetadataUrl>().unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
    }
}
