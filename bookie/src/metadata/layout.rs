//! The `/cms` layout of DESIGN §3 and `init-cluster`.
//!
//! [`Layout`] names every well-known path under one root (default `/cms`), so no
//! other code spells them. [`init_cluster`] creates the layout and
//! `<root>/cluster` (name, instance id, layout version):
//!
//! - **idempotent**: a second run for the same cluster name creates nothing and
//!   reports [`InitOutcome::AlreadyInitialised`]; a run interrupted half-way is
//!   completed by the next one;
//! - **refuses another cluster**: a store initialised for cluster `a` answers a
//!   run for cluster `b` with [`LayoutError::OtherCluster`], before creating
//!   anything;
//! - **safe under concurrent runs**: every step tolerates `NodeExists`, and the
//!   cluster node is created with `create` (not `set`), so exactly one instance
//!   id wins.

use prost::Message;

use super::{CreateMode, MetadataError, MetadataStore, validate_path};
use crate::proto::metadata::ClusterInfo;

/// Version of the layout this code writes and understands.
pub const LAYOUT_VERSION: u32 = 1;

/// Default metadata root.
pub const DEFAULT_ROOT: &str = "/cms";

/// Longest accepted cluster name, in bytes.
pub const CLUSTER_NAME_BYTES_MAX: usize = 64;

/// Every well-known path under one root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    root: String,
}

impl Layout {
    /// The layout under `root` (e.g. `/cms`), which must be a valid node path
    /// other than `/`.
    pub fn new(root: &str) -> Result<Layout, MetadataError> {
        validate_path(root)?;
        if root == "/" {
            return Err(MetadataError::InvalidPath {
                path: root.into(),
                reason: "the metadata root cannot be '/'".into(),
            });
        }
        Ok(Layout { root: root.into() })
    }

    fn at(&self, rest: &str) -> String {
        format!("{}/{rest}", self.root)
    }

    /// The root itself.
    pub fn root(&self) -> &str {
        &self.root
    }
    /// `<root>/cluster`: [`ClusterInfo`].
    pub fn cluster(&self) -> String {
        self.at("cluster")
    }
    /// `<root>/ledgers`: ledger metadata, hierarchical by id.
    pub fn ledgers(&self) -> String {
        self.at("ledgers")
    }
    /// `<root>/ledgers/idgen`: parent of the sequential nodes ledger ids come from.
    pub fn ledger_idgen(&self) -> String {
        self.at("ledgers/idgen")
    }
    /// `<root>/ledgers/<hierarchical id>`: the metadata node of ledger `id`.
    ///
    /// The id's 20 decimal digits are split 4/4/4/4/4 with the last level
    /// prefixed by `L` (`/cms/ledgers/0000/0000/0000/0001/L2345`), so no level
    /// has more than 10,000 children and a million ledgers never make one huge
    /// listing (ZooKeeper replies are limited to 1 MB).
    pub fn ledger(&self, id: u64) -> String {
        let d = format!("{id:020}");
        format!(
            "{}/{}/{}/{}/{}/L{}",
            self.ledgers(),
            &d[0..4],
            &d[4..8],
            &d[8..12],
            &d[12..16],
            &d[16..20]
        )
    }
    /// The ledger id of a path made by [`Layout::ledger`], None for any other path.
    pub fn ledger_id_of(&self, path: &str) -> Option<u64> {
        let rest = path.strip_prefix(&self.ledgers())?.strip_prefix('/')?;
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() != 5 || !parts[..4].iter().all(|p| p.len() == 4) {
            return None;
        }
        let last = parts[4].strip_prefix('L').filter(|l| l.len() == 4)?;
        let digits: String = parts[..4].concat() + last;
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }
    /// `<root>/bookies/available`: ephemeral registrations of writable bookies.
    pub fn bookies_available(&self) -> String {
        self.at("bookies/available")
    }
    /// `<root>/bookies/readonly`: ephemeral registrations of read-only bookies.
    pub fn bookies_readonly(&self) -> String {
        self.at("bookies/readonly")
    }
    /// `<root>/bookies/cookies`: one persistent cookie per bookie id.
    pub fn bookie_cookies(&self) -> String {
        self.at("bookies/cookies")
    }
    /// `<root>/underreplicated`: ledgers that lost a replica.
    pub fn underreplicated(&self) -> String {
        self.at("underreplicated")
    }
    /// `<root>/autorecovery/auditor`: the auditor election node (ephemeral).
    pub fn auditor(&self) -> String {
        self.at("autorecovery/auditor")
    }
    /// `<root>/autorecovery/locks`: one ephemeral lock per ledger being re-replicated.
    pub fn autorecovery_locks(&self) -> String {
        self.at("autorecovery/locks")
    }
    /// `<root>/brokers`: ephemeral broker registrations.
    pub fn brokers(&self) -> String {
        self.at("brokers")
    }
    /// `<root>/admin/tenants`.
    pub fn tenants(&self) -> String {
        self.at("admin/tenants")
    }
    /// `<root>/admin/namespaces`.
    pub fn namespaces(&self) -> String {
        self.at("admin/namespaces")
    }
    /// `<root>/admin/partitioned`: partition counts of partitioned topics.
    pub fn partitioned(&self) -> String {
        self.at("admin/partitioned")
    }
    /// `<root>/ownership`: ephemeral bundle ownership.
    pub fn ownership(&self) -> String {
        self.at("ownership")
    }
    /// `<root>/managed-ledgers`: topics' ledger lists and cursors.
    pub fn managed_ledgers(&self) -> String {
        self.at("managed-ledgers")
    }
    /// `<root>/schemas`.
    pub fn schemas(&self) -> String {
        self.at("schemas")
    }

    /// The persistent directories `init-cluster` creates, parents first.
    pub fn directories(&self) -> Vec<String> {
        vec![
            self.root.clone(),
            self.ledgers(),
            self.ledger_idgen(),
            self.at("bookies"),
            self.bookies_available(),
            self.bookies_readonly(),
            self.bookie_cookies(),
            self.underreplicated(),
            self.at("autorecovery"),
            self.autorecovery_locks(),
            self.brokers(),
            self.at("admin"),
            self.tenants(),
            self.namespaces(),
            self.partitioned(),
            self.ownership(),
            self.managed_ledgers(),
            self.schemas(),
        ]
    }
}

/// Why `init-cluster` or reading the cluster node failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The store already belongs to another cluster.
    #[error(
        "metadata store at {root} is already initialised for cluster {existing:?} \
         (instance {instance_id}); refusing to initialise it for cluster {requested:?}"
    )]
    OtherCluster {
        /// The metadata root.
        root: String,
        /// The cluster it belongs to.
        existing: String,
        /// Its instance id.
        instance_id: String,
        /// The name this run asked for.
        requested: String,
    },
    /// The cluster name is empty, too long or has characters outside
    /// `[A-Za-z0-9._-]`.
    #[error("invalid cluster name {0:?}: use 1-64 characters of [A-Za-z0-9._-]")]
    InvalidClusterName(String),
    /// The cluster node exists but cannot be decoded, or has a newer layout.
    #[error("cluster node {path} is unreadable: {reason}")]
    BadClusterNode {
        /// Node path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The cluster has not been initialised.
    #[error("cluster not initialised: {0} does not exist (run `cms-bookie init-cluster`)")]
    NotInitialised(String),
    /// The metadata store failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

/// What `init-cluster` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitOutcome {
    /// This run wrote the cluster node.
    Created {
        /// The cluster as written.
        cluster: ClusterInfo,
        /// Layout nodes this run created (directories + the cluster node).
        nodes_created: usize,
    },
    /// The cluster was already initialised with this name.
    AlreadyInitialised {
        /// The cluster as found.
        cluster: ClusterInfo,
        /// Layout directories this run had to (re)create: 0 for a complete layout.
        nodes_created: usize,
    },
}

impl InitOutcome {
    /// The cluster node's content.
    pub fn cluster(&self) -> &ClusterInfo {
        match self {
            InitOutcome::Created { cluster, .. }
            | InitOutcome::AlreadyInitialised { cluster, .. } => cluster,
        }
    }
}

/// Checks a cluster name.
pub fn validate_cluster_name(name: &str) -> Result<(), LayoutError> {
    let ok = !name.is_empty()
        && name.len() <= CLUSTER_NAME_BYTES_MAX
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(LayoutError::InvalidClusterName(name.into()))
    }
}

/// Reads `<root>/cluster`.
pub async fn read_cluster(
    store: &dyn MetadataStore,
    layout: &Layout,
) -> Result<ClusterInfo, LayoutError> {
    let path = layout.cluster();
    match store.get(&path).await {
        Ok((data, _)) => decode_cluster(&path, &data),
        Err(MetadataError::NoNode(_)) => Err(LayoutError::NotInitialised(path)),
        Err(e) => Err(e.into()),
    }
}

fn decode_cluster(path: &str, data: &[u8]) -> Result<ClusterInfo, LayoutError> {
    let info = ClusterInfo::decode(data).map_err(|e| LayoutError::BadClusterNode {
        path: path.into(),
        reason: e.to_string(),
    })?;
    if info.layout_version > LAYOUT_VERSION {
        return Err(LayoutError::BadClusterNode {
            path: path.into(),
            reason: format!(
                "layout version {} is newer than this binary's {LAYOUT_VERSION}",
                info.layout_version
            ),
        });
    }
    Ok(info)
}

/// Creates the layout and the cluster node; see the module docs for the rules.
pub async fn init_cluster(
    store: &dyn MetadataStore,
    layout: &Layout,
    cluster_name: &str,
) -> Result<InitOutcome, LayoutError> {
    validate_cluster_name(cluster_name)?;
    let refuse = |existing: ClusterInfo| LayoutError::OtherCluster {
        root: layout.root().into(),
        existing: existing.name,
        instance_id: existing.instance_id,
        requested: cluster_name.into(),
    };

    // Refuse another cluster before touching anything.
    let existing = match read_cluster(store, layout).await {
        Ok(info) if info.name != cluster_name => return Err(refuse(info)),
        Ok(info) => Some(info),
        Err(LayoutError::NotInitialised(_)) => None,
        Err(e) => return Err(e),
    };

    let mut nodes_created = 0;
    // Ancestors of the root (e.g. a root of `/a/cms`) are plain empty nodes.
    if let Some(parent) = super::parent_of(layout.root()) {
        store.create_all(parent).await?;
    }
    for dir in layout.directories() {
        if store.exists(&dir).await?.is_some() {
            continue;
        }
        match store.create(&dir, b"", CreateMode::Persistent).await {
            Ok(_) => nodes_created += 1,
            Err(MetadataError::NodeExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }

    if let Some(cluster) = existing {
        if nodes_created > 0 {
            tracing::warn!(
                cluster = %cluster.name,
                nodes_created,
                "init-cluster completed a partial layout"
            );
        }
        return Ok(InitOutcome::AlreadyInitialised {
            cluster,
            nodes_created,
        });
    }

    let info = ClusterInfo {
        name: cluster_name.into(),
        instance_id: uuid::Uuid::new_v4().to_string(),
        layout_version: LAYOUT_VERSION,
        ctime_ms: now_ms(),
    };
    let path = layout.cluster();
    match store
        .create(&path, &info.encode_to_vec(), CreateMode::Persistent)
        .await
    {
        Ok(_) => {
            tracing::info!(cluster = %info.name, instance_id = %info.instance_id, "cluster initialised");
            Ok(InitOutcome::Created {
                cluster: info,
                nodes_created: nodes_created + 1,
            })
        }
        // A concurrent run won: same name is fine, another is refused.
        Err(MetadataError::NodeExists(_)) => {
            let winner = read_cluster(store, layout).await?;
            if winner.name != cluster_name {
                return Err(refuse(winner));
            }
            Ok(InitOutcome::AlreadyInitialised {
                cluster: winner,
                nodes_created,
            })
        }
        Err(e) => Err(e.into()),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_paths_follow_design() {
        let l = Layout::new("/cms").unwrap();
        assert_eq!(l.cluster(), "/cms/cluster");
        assert_eq!(l.ledger_idgen(), "/cms/ledgers/idgen");
        assert_eq!(l.bookies_available(), "/cms/bookies/available");
        assert_eq!(l.auditor(), "/cms/autorecovery/auditor");
        assert_eq!(l.managed_ledgers(), "/cms/managed-ledgers");
        for d in l.directories() {
            validate_path(&d).unwrap();
            // parents come before children
            if let Some(p) = crate::metadata::parent_of(&d)
                && p != "/"
            {
                let dirs = l.directories();
                let pi = dirs.iter().position(|x| x == p).unwrap();
                let di = dirs.iter().position(|x| x == &d).unwrap();
                assert!(pi < di, "{p} after {d}");
            }
        }
    }

    #[test]
    fn bad_roots_and_names_are_refused() {
        assert!(Layout::new("/").is_err());
        assert!(Layout::new("cms").is_err());
        assert!(Layout::new("/cms/").is_err());
        for bad in ["", "a b", "a/b", &"x".repeat(65), "é"] {
            assert!(validate_cluster_name(bad).is_err(), "{bad:?}");
        }
        for good in ["local", "us-east-1", "prod_2.a"] {
            validate_cluster_name(good).unwrap();
        }
    }

    #[test]
    fn undecodable_or_newer_cluster_nodes_are_errors() {
        assert!(matches!(
            decode_cluster("/cms/cluster", &[0xff, 0xff, 0xff]),
            Err(LayoutError::BadClusterNode { .. })
        ));
        let newer = ClusterInfo {
            name: "a".into(),
            instance_id: "i".into(),
            layout_version: LAYOUT_VERSION + 1,
            ctime_ms: 0,
        };
        assert!(matches!(
            decode_cluster("/cms/cluster", &newer.encode_to_vec()),
            Err(LayoutError::BadClusterNode { .. })
        ));
    }

    #[test]
    fn ledger_paths_are_hierarchical_and_reversible() {
        let layout = Layout::new("/cms").unwrap();
        assert_eq!(
            layout.ledger(12345),
            "/cms/ledgers/0000/0000/0000/0001/L2345"
        );
        for id in [0, 1, 9_999, 10_000, 123_456_789, u64::MAX] {
            assert_eq!(layout.ledger_id_of(&layout.ledger(id)), Some(id), "{id}");
            assert_eq!(validate_path(&layout.ledger(id)), Ok(()));
        }
        assert_eq!(layout.ledger_id_of("/cms/ledgers/idgen"), None);
        assert_eq!(
            layout.ledger_id_of("/cms/ledgers/0000/0000/0000/0001/X2345"),
            None
        );
    }
}
