//! Cookies: a bookie's identity, checked on every start (DESIGN §3,
//! RELIABILITY P0-9).
//!
//! The cookie (`proto::metadata::Cookie`: bookie id, incarnation, cluster
//! instance id, directories) is stored in the metadata store at
//! `/cms/bookies/cookies/<bookie id>` and as the file `COOKIE` in every data
//! directory. [`check_cookies`] compares all copies before the bookie opens its
//! storage and refuses to start, saying what differs, when:
//! - a directory lost its cookie while the cluster knows the bookie (wiped or
//!   swapped disk: its acknowledged entries are gone);
//! - a directory's cookie names another bookie, incarnation or cluster instance;
//! - the directories hold a cookie but the cluster has none (another cluster's
//!   metadata store, or a deleted bookie);
//! - a fresh bookie's directories are not empty.
//!
//! A brand-new bookie (no cookie anywhere, empty directories) gets incarnation 1:
//! the directory cookies are written and synced first, the metadata cookie last,
//! so a crash in between leaves a state that the next start completes.
//! [`format`] keeps the id, bumps the incarnation and empties the directories:
//! the bookie then starts as a bookie that may have lost data (limbo).

use std::path::{Path, PathBuf};

use prost::Message;

use crate::metadata::layout::{Layout, read_cluster};
use crate::metadata::{CreateMode, Expected, MetadataError, MetadataStore, join};
use crate::proto::metadata::Cookie;

/// File name of the cookie in every data directory.
pub const COOKIE_FILE: &str = "COOKIE";

/// Why a bookie may not start with these directories.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CookieError {
    /// The copies disagree or are missing; the message says which and how.
    #[error("cookie check failed for bookie {bookie_id}: {reason}")]
    Mismatch {
        /// The bookie.
        bookie_id: String,
        /// What differs, and what to do.
        reason: String,
    },
    /// A cookie file or node could not be read, written or decoded.
    #[error("cookie {what}: {reason}")]
    Io {
        /// Which copy.
        what: String,
        /// The error.
        reason: String,
    },
    /// The metadata store failed or the cluster is not initialised.
    #[error("cookie check: {0}")]
    Metadata(String),
    /// `format` refused: a bookie with this identity is registered (running).
    #[error(
        "bookie {bookie_id} is still registered at {node}: stop it (or wait for its session \
         to expire) before formatting its data directories"
    )]
    StillRegistered {
        /// The bookie.
        bookie_id: String,
        /// The registration node found.
        node: String,
    },
}

/// The outcome of a successful check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CookieCheck {
    /// The cookie all copies agree on.
    pub cookie: Cookie,
    /// True when this start created incarnation 1 of a new bookie.
    pub created: bool,
}

/// The data directories of one bookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookieDirs {
    /// The journal directory.
    pub journal_dir: PathBuf,
    /// The ledger directories.
    pub ledger_dirs: Vec<PathBuf>,
}

impl BookieDirs {
    fn all(&self) -> Vec<&Path> {
        std::iter::once(self.journal_dir.as_path())
            .chain(self.ledger_dirs.iter().map(PathBuf::as_path))
            .collect()
    }
}

fn cookie_path(layout: &Layout, bookie_id: &str) -> String {
    join(&layout.bookie_cookies(), bookie_id)
}

fn io_err(what: impl Into<String>, e: impl std::fmt::Display) -> CookieError {
    CookieError::Io {
        what: what.into(),
        reason: e.to_string(),
    }
}

/// Reads the cookie file of `dir`; None when the directory has none.
pub fn read_dir_cookie(dir: &Path) -> Result<Option<Cookie>, CookieError> {
    let path = dir.join(COOKIE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => Cookie::decode(bytes.as_slice())
            .map(Some)
            .map_err(|e| io_err(path.display().to_string(), e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path.display().to_string(), e)),
    }
}

/// Writes the cookie file of `dir` durably (temp file, fsync, rename, fsync dir).
pub fn write_dir_cookie(dir: &Path, cookie: &Cookie) -> Result<(), CookieError> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir.display().to_string(), e))?;
    let tmp = dir.join(format!("{COOKIE_FILE}.tmp"));
    let path = dir.join(COOKIE_FILE);
    let what = path.display().to_string();
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_err(&what, e))?;
    f.write_all(&cookie.encode_to_vec())
        .and_then(|_| f.sync_all())
        .map_err(|e| io_err(&what, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io_err(&what, e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(&what, e))
}

/// Whether `dir` holds nothing but (maybe) a cookie and lost+found.
fn dir_is_empty(dir: &Path) -> Result<bool, CookieError> {
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for e in entries {
                let e = e.map_err(|e| io_err(dir.display().to_string(), e))?;
                let name = e.file_name();
                if name != COOKIE_FILE && name != "lost+found" {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(io_err(dir.display().to_string(), e)),
    }
}

fn describe(c: &Cookie) -> String {
    format!(
        "bookie {} incarnation {} of cluster instance {}",
        c.bookie_id, c.incarnation, c.instance_id
    )
}

fn expected_cookie(
    bookie_id: &str,
    incarnation: u64,
    instance_id: &str,
    dirs: &BookieDirs,
) -> Cookie {
    Cookie {
        bookie_id: bookie_id.to_string(),
        incarnation,
        instance_id: instance_id.to_string(),
        journal_dir: dirs.journal_dir.display().to_string(),
        ledger_dirs: dirs
            .ledger_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect(),
        ctime_ms: now_ms(),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Same identity: everything but the creation time.
fn same_identity(a: &Cookie, b: &Cookie) -> bool {
    a.bookie_id == b.bookie_id
        && a.incarnation == b.incarnation
        && a.instance_id == b.instance_id
        && a.journal_dir == b.journal_dir
        && a.ledger_dirs == b.ledger_dirs
}

/// Checks (and for a new bookie, creates) the cookies; see the module docs.
pub async fn check_cookies(
    store: &dyn MetadataStore,
    layout: &Layout,
    bookie_id: &str,
    dirs: &BookieDirs,
) -> Result<CookieCheck, CookieError> {
    let cluster = read_cluster(store, layout)
        .await
        .map_err(|e| CookieError::Metadata(e.to_string()))?;
    let mismatch = |reason: String| CookieError::Mismatch {
        bookie_id: bookie_id.to_string(),
        reason,
    };
    let node = cookie_path(layout, bookie_id);
    let stored = match store.get(&node).await {
        Ok((data, _)) => Some(Cookie::decode(data.as_slice()).map_err(|e| io_err(&node, e))?),
        Err(MetadataError::NoNode(_)) => None,
        Err(e) => return Err(CookieError::Metadata(e.to_string())),
    };
    let mut on_disk = Vec::new();
    for dir in dirs.all() {
        on_disk.push((dir, read_dir_cookie(dir)?));
    }

    let Some(stored) = stored else {
        // No cookie in the cluster: only a brand-new bookie may start, or one
        // whose first start crashed after writing (some) directory cookies.
        let fresh = expected_cookie(bookie_id, 1, &cluster.instance_id, dirs);
        for (dir, cookie) in &on_disk {
            match cookie {
                Some(c) if same_identity(c, &fresh) => {}
                Some(c) => {
                    return Err(mismatch(format!(
                        "{} holds the cookie of {}, but the metadata store at {} has no cookie \
                         for this bookie: the directory belongs to another bookie or another \
                         cluster's metadata store",
                        dir.display(),
                        describe(c),
                        layout.root()
                    )));
                }
                None if !dir_is_empty(dir)? => {
                    return Err(mismatch(format!(
                        "{} is not empty but has no cookie and the cluster has no cookie for \
                         this bookie: refusing to adopt unknown data",
                        dir.display()
                    )));
                }
                None => {}
            }
        }
        for dir in dirs.all() {
            write_dir_cookie(dir, &fresh)?;
        }
        match store
            .create(&node, &fresh.encode_to_vec(), CreateMode::Persistent)
            .await
        {
            Ok(_) => {}
            Err(MetadataError::NodeExists(_)) => {
                return Err(mismatch(format!(
                    "another process registered a cookie for this bookie id at {node} meanwhile"
                )));
            }
            Err(e) => return Err(CookieError::Metadata(e.to_string())),
        }
        tracing::info!(bookie = bookie_id, "created cookie, incarnation 1");
        return Ok(CookieCheck {
            cookie: fresh,
            created: true,
        });
    };

    if stored.instance_id != cluster.instance_id {
        return Err(mismatch(format!(
            "the cookie at {node} names cluster instance {}, but the cluster is instance {}",
            stored.instance_id, cluster.instance_id
        )));
    }
    let expected = expected_cookie(bookie_id, stored.incarnation, &cluster.instance_id, dirs);
    if !same_identity(&stored, &expected) {
        return Err(mismatch(format!(
            "the cookie at {node} lists journal dir {} and ledger dirs {:?}, but this bookie \
             was started with journal dir {} and ledger dirs {:?}",
            stored.journal_dir, stored.ledger_dirs, expected.journal_dir, expected.ledger_dirs
        )));
    }
    for (dir, cookie) in &on_disk {
        match cookie {
            Some(c) if same_identity(c, &stored) => {}
            Some(c) => {
                return Err(mismatch(format!(
                    "{} holds the cookie of {}, but the cluster expects {}: the directory was \
                     swapped or belongs to another incarnation",
                    dir.display(),
                    describe(c),
                    describe(&stored)
                )));
            }
            None => {
                return Err(mismatch(format!(
                    "{} has no cookie, but the cluster knows {}: the directory was wiped or \
                     replaced, so entries this bookie acknowledged may be gone; run \
                     `cms-bookie format` to start a new incarnation (its ledgers go into limbo \
                     until re-replicated)",
                    dir.display(),
                    describe(&stored)
                )));
            }
        }
    }
    Ok(CookieCheck {
        cookie: stored,
        created: false,
    })
}

/// Starts a new incarnation of `bookie_id`: empties its directories, writes a
/// cookie with the next incarnation everywhere. Refused with
/// [`CookieError::StillRegistered`] while the identity is registered under
/// `available/` or `readonly/` (a running bookie would keep serving from the
/// directories being emptied).
pub async fn format(
    store: &dyn MetadataStore,
    layout: &Layout,
    bookie_id: &str,
    dirs: &BookieDirs,
) -> Result<Cookie, CookieError> {
    for parent in [layout.bookies_available(), layout.bookies_readonly()] {
        let node = format!("{parent}/{bookie_id}");
        match store.exists(&node).await {
            Ok(Some(_)) => {
                return Err(CookieError::StillRegistered {
                    bookie_id: bookie_id.to_string(),
                    node,
                });
            }
            Ok(None) => {}
            Err(e) => return Err(CookieError::Metadata(e.to_string())),
        }
    }
    let cluster = read_cluster(store, layout)
        .await
        .map_err(|e| CookieError::Metadata(e.to_string()))?;
    let node = cookie_path(layout, bookie_id);
    let (previous, version) = match store.get(&node).await {
        Ok((data, stat)) => (
            Some(Cookie::decode(data.as_slice()).map_err(|e| io_err(&node, e))?),
            Some(stat.version),
        ),
        Err(MetadataError::NoNode(_)) => (None, None),
        Err(e) => return Err(CookieError::Metadata(e.to_string())),
    };
    let incarnation = previous.as_ref().map_or(1, |c| c.incarnation + 1);
    let cookie = expected_cookie(bookie_id, incarnation, &cluster.instance_id, dirs);
    for dir in dirs.all() {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| io_err(dir.display().to_string(), e))?;
        }
        write_dir_cookie(dir, &cookie)?;
    }
    let data = cookie.encode_to_vec();
    let result = match version {
        Some(v) => store
            .set(&node, &data, Expected::Version(v))
            .await
            .map(|_| ()),
        None => store
            .create(&node, &data, CreateMode::Persistent)
            .await
            .map(|_| ()),
    };
    result.map_err(|e| CookieError::Metadata(e.to_string()))?;
    tracing::warn!(
        bookie = bookie_id,
        incarnation,
        "formatted: new incarnation, previous data removed"
    );
    Ok(cookie)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::embedded::EmbeddedStore;
    use crate::metadata::layout::init_cluster;

    async fn setup() -> (tempfile::TempDir, EmbeddedStore, Layout, BookieDirs) {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("md.redb"))
            .await
            .unwrap();
        let layout = Layout::new("/cms").unwrap();
        init_cluster(&store, &layout, "test").await.unwrap();
        let dirs = BookieDirs {
            journal_dir: dir.path().join("journal"),
            ledger_dirs: vec![dir.path().join("ledgers")],
        };
        (dir, store, layout, dirs)
    }

    #[tokio::test]
    async fn a_new_bookie_gets_incarnation_one_and_restarts_cleanly() {
        let (_d, store, layout, dirs) = setup().await;
        let first = check_cookies(&store, &layout, "b1", &dirs).await.unwrap();
        assert!(first.created);
        assert_eq!(first.cookie.incarnation, 1);
        let again = check_cookies(&store, &layout, "b1", &dirs).await.unwrap();
        assert!(!again.created);
        assert_eq!(again.cookie, first.cookie);
    }

    #[tokio::test]
    async fn a_wiped_directory_is_refused_with_the_reason() {
        let (_d, store, layout, dirs) = setup().await;
        check_cookies(&store, &layout, "b1", &dirs).await.unwrap();
        std::fs::remove_dir_all(&dirs.ledger_dirs[0]).unwrap();
        let err = check_cookies(&store, &layout, "b1", &dirs)
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("has no cookie") && msg.contains("wiped"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn another_bookies_directory_is_refused() {
        let (_d, store, layout, dirs) = setup().await;
        check_cookies(&store, &layout, "b1", &dirs).await.unwrap();
        let err = check_cookies(&store, &layout, "b2", &dirs)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("another bookie"), "{err}");
    }

    #[tokio::test]
    async fn directories_from_another_cluster_are_refused() {
        let (d, store, layout, dirs) = setup().await;
        check_cookies(&store, &layout, "b1", &dirs).await.unwrap();
        let other = EmbeddedStore::open(&d.path().join("other.redb"))
            .await
            .unwrap();
        init_cluster(&other, &layout, "other").await.unwrap();
        let err = check_cookies(&other, &layout, "b1", &dirs)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("another cluster"), "{err}");
    }

    #[tokio::test]
    async fn a_fresh_bookie_refuses_non_empty_directories_without_cookie() {
        let (_d, store, layout, dirs) = setup().await;
        std::fs::create_dir_all(&dirs.journal_dir).unwrap();
        std::fs::write(dirs.journal_dir.join("data"), b"x").unwrap();
        let err = check_cookies(&store, &layout, "b1", &dirs)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not empty"), "{err}");
    }

    #[tokio::test]
    async fn changed_directories_are_refused() {
        let (d, store, layout, dirs) = setup().await;
        check_cookies(&store, &layout, "b1", &dirs).await.unwrap();
        let moved = BookieDirs {
            journal_dir: dirs.journal_dir.clone(),
            ledger_dirs: vec![d.path().join("elsewhere")],
        };
        let err = check_cookies(&store, &layout, "b1", &moved)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("was started with"), "{err}");
    }

    #[tokio::test]
    async fn format_bumps_the_incarnation_and_empties_the_directories() {
        let (_d, store, layout, dirs) = setup().await;
        check_cookies(&store, &layout, "b1", &dirs).await.unwrap();
        std::fs::write(dirs.journal_dir.join("old"), b"x").unwrap();
        let c = format(&store, &layout, "b1", &dirs).await.unwrap();
        assert_eq!(c.incarnation, 2);
        assert!(!dirs.journal_dir.join("old").exists());
        let check = check_cookies(&store, &layout, "b1", &dirs).await.unwrap();
        assert_eq!(check.cookie.incarnation, 2);
        assert!(!check.created);
    }

    #[tokio::test]
    async fn format_is_refused_while_the_identity_is_registered() {
        let (_d, store, layout, dirs) = setup().await;
        check_cookies(&store, &layout, "b1", &dirs).await.unwrap();
        std::fs::write(dirs.journal_dir.join("keep"), b"x").unwrap();
        for parent in [layout.bookies_available(), layout.bookies_readonly()] {
            let node = format!("{parent}/b1");
            store
                .create(&node, b"", CreateMode::Ephemeral)
                .await
                .unwrap();
            let err = format(&store, &layout, "b1", &dirs).await.unwrap_err();
            assert!(
                matches!(&err, CookieError::StillRegistered { node: n, .. } if *n == node),
                "{err}"
            );
            assert!(dirs.journal_dir.join("keep").exists(), "nothing deleted");
            store.delete(&node, Expected::Any).await.unwrap();
        }
        let c = format(&store, &layout, "b1", &dirs).await.unwrap();
        assert_eq!(c.incarnation, 2);
    }
}
