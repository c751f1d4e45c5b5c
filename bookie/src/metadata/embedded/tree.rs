//! The in-memory node tree of the embedded store, and the rules that decide
//! every mutation against it.
//!
//! The tree is a plain value: [`Tree::plan_create`], [`Tree::plan_set`] and
//! [`Tree::plan_delete`] check an operation exactly as ZooKeeper would (NoNode
//! parent, NodeExists, BadVersion, NotEmpty, ephemeral parent) and return the
//! [`Mutation`] to apply; [`Tree::apply`] applies it. The writer decides on its
//! working copy and replays the same mutations onto the copy readers see, so both
//! copies stay identical by construction.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;

use super::super::{CreateMode, Expected, MetadataError, Result, Stat, Version, parent_of};

/// One node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Node {
    /// The payload.
    pub data: Bytes,
    /// Data version: 0 on create, +1 per set.
    pub version: Version,
    /// Creation time, ms since the epoch.
    pub ctime_ms: i64,
    /// Last modification time, ms since the epoch.
    pub mtime_ms: i64,
    /// Owning session of an ephemeral node, 0 for persistent nodes.
    pub owner: i64,
    /// The number the next sequential child gets. Only grows.
    pub next_seq: i64,
    /// Names of the children.
    pub children: BTreeSet<String>,
}

impl Node {
    /// A node without children.
    pub fn new(data: Bytes, now_ms: i64, owner: i64) -> Node {
        Node {
            data,
            version: 0,
            ctime_ms: now_ms,
            mtime_ms: now_ms,
            owner,
            next_seq: 0,
            children: BTreeSet::new(),
        }
    }

    /// True for nodes that are written to disk.
    pub fn is_persistent(&self) -> bool {
        self.owner == 0
    }

    /// The node's stat.
    pub fn stat(&self) -> Stat {
        Stat {
            version: self.version,
            ctime_ms: self.ctime_ms,
            mtime_ms: self.mtime_ms,
            ephemeral_owner: self.owner,
            num_children: self.children.len(),
            data_len: self.data.len(),
        }
    }
}

/// One change to the tree, decided by a `plan_*` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Mutation {
    /// Insert `node` (which has no children) at `path`; if `parent_next_seq` is
    /// set, the parent's sequence counter becomes that value.
    Create {
        /// Full path of the new node.
        path: String,
        /// The new node.
        node: Node,
        /// New value of the parent's counter, for sequential creates.
        parent_next_seq: Option<i64>,
    },
    /// Replace a node's data.
    Set {
        /// Node path.
        path: String,
        /// New data.
        data: Bytes,
        /// New version.
        version: Version,
        /// New modification time.
        mtime_ms: i64,
    },
    /// Remove a node that has no children.
    Delete {
        /// Node path.
        path: String,
    },
}

/// The whole tree: every node by path, and each session's ephemeral nodes.
#[derive(Debug, Clone, Default)]
pub(super) struct Tree {
    nodes: BTreeMap<String, Node>,
    ephemerals: HashMap<i64, BTreeSet<String>>,
}

fn name_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(i) => &path[i + 1..],
        None => path,
    }
}

impl Tree {
    /// A tree holding only the root.
    pub fn with_root(now_ms: i64) -> Tree {
        let mut nodes = BTreeMap::new();
        nodes.insert("/".to_string(), Node::new(Bytes::new(), now_ms, 0));
        Tree {
            nodes,
            ephemerals: HashMap::new(),
        }
    }

    /// Inserts a node read from disk. Its parent must already be there and be
    /// persistent (disk order puts parents first: a parent's path is a prefix of
    /// its children's).
    pub fn insert_loaded(&mut self, path: String, node: Node) -> std::result::Result<(), String> {
        if path == "/" {
            let children = self
                .nodes
                .get("/")
                .map(|n| n.children.clone())
                .unwrap_or_default();
            self.nodes.insert(path, Node { children, ..node });
            return Ok(());
        }
        let Some(parent_path) = parent_of(&path) else {
            return Err(format!("node {path:?} has no parent"));
        };
        let Some(parent) = self.nodes.get_mut(parent_path) else {
            return Err(format!("node {path:?} is stored without its parent"));
        };
        if !parent.is_persistent() {
            return Err(format!("node {path:?} is stored under an ephemeral parent"));
        }
        parent.children.insert(name_of(&path).to_string());
        self.nodes.insert(path, node);
        Ok(())
    }

    /// The node at `path`.
    pub fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    /// Number of nodes, root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Paths of the ephemeral nodes `session` owns.
    pub fn ephemerals_of(&self, session: i64) -> Vec<String> {
        self.ephemerals
            .get(&session)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Decides a create; returns the mutation and the created path.
    pub fn plan_create(
        &self,
        session: i64,
        path: &str,
        data: Bytes,
        mode: CreateMode,
        now_ms: i64,
    ) -> Result<(Mutation, String)> {
        let Some(parent_path) = parent_of(path) else {
            return Err(MetadataError::NodeExists(path.to_string()));
        };
        let Some(parent) = self.nodes.get(parent_path) else {
            return Err(MetadataError::NoNode(path.to_string()));
        };
        if !parent.is_persistent() {
            return Err(MetadataError::NoChildrenForEphemerals(
                parent_path.to_string(),
            ));
        }
        let (full, parent_next_seq) = if mode.is_sequential() {
            let seq = parent.next_seq;
            let next = seq.checked_add(1).ok_or_else(|| {
                MetadataError::Backend(format!("sequence counter of {parent_path} overflowed"))
            })?;
            (format!("{path}{seq:010}"), Some(next))
        } else {
            (path.to_string(), None)
        };
        if self.nodes.contains_key(&full) {
            return Err(MetadataError::NodeExists(full));
        }
        let owner = if mode.is_ephemeral() { session } else { 0 };
        let node = Node::new(data, now_ms, owner);
        Ok((
            Mutation::Create {
                path: full.clone(),
                node,
                parent_next_seq,
            },
            full,
        ))
    }

    /// Decides a set.
    pub fn plan_set(
        &self,
        path: &str,
        data: Bytes,
        expected: Expected,
        now_ms: i64,
    ) -> Result<Mutation> {
        let Some(node) = self.nodes.get(path) else {
            return Err(MetadataError::NoNode(path.to_string()));
        };
        check_version(path, node, expected)?;
        let version = node
            .version
            .checked_add(1)
            .ok_or_else(|| MetadataError::Backend(format!("version of {path} overflowed")))?;
        Ok(Mutation::Set {
            path: path.to_string(),
            data,
            version,
            mtime_ms: now_ms,
        })
    }

    /// Decides a delete.
    pub fn plan_delete(&self, path: &str, expected: Expected) -> Result<Mutation> {
        if path == "/" {
            return Err(MetadataError::InvalidPath {
                path: path.to_string(),
                reason: "the root cannot be deleted".to_string(),
            });
        }
        let Some(node) = self.nodes.get(path) else {
            return Err(MetadataError::NoNode(path.to_string()));
        };
        check_version(path, node, expected)?;
        if !node.children.is_empty() {
            return Err(MetadataError::NotEmpty(path.to_string()));
        }
        Ok(Mutation::Delete {
            path: path.to_string(),
        })
    }

    /// Applies a mutation decided by a `plan_*` call on this tree (or on a tree
    /// identical to it). Returns the paths whose on-disk record changed.
    pub fn apply(&mut self, mutation: &Mutation) -> Vec<String> {
        let mut touched = Vec::new();
        match mutation {
            Mutation::Create {
                path,
                node,
                parent_next_seq,
            } => {
                if let Some(parent_path) = parent_of(path)
                    && let Some(parent) = self.nodes.get_mut(parent_path)
                {
                    parent.children.insert(name_of(path).to_string());
                    if let Some(next) = parent_next_seq {
                        parent.next_seq = *next;
                        touched.push(parent_path.to_string());
                    }
                }
                if !node.is_persistent() {
                    self.ephemerals
                        .entry(node.owner)
                        .or_default()
                        .insert(path.clone());
                } else {
                    touched.push(path.clone());
                }
                self.nodes.insert(path.clone(), node.clone());
            }
            Mutation::Set {
                path,
                data,
                version,
                mtime_ms,
            } => {
                if let Some(node) = self.nodes.get_mut(path) {
                    node.data = data.clone();
                    node.version = *version;
                    node.mtime_ms = *mtime_ms;
                    if node.is_persistent() {
                        touched.push(path.clone());
                    }
                }
            }
            Mutation::Delete { path } => {
                if let Some(node) = self.nodes.remove(path) {
                    if node.is_persistent() {
                        touched.push(path.clone());
                    } else if let Some(set) = self.ephemerals.get_mut(&node.owner) {
                        set.remove(path);
                        if set.is_empty() {
                            self.ephemerals.remove(&node.owner);
                        }
                    }
                }
                if let Some(parent_path) = parent_of(path)
                    && let Some(parent) = self.nodes.get_mut(parent_path)
                {
                    parent.children.remove(name_of(path));
                }
            }
        }
        touched
    }
}

fn check_version(path: &str, node: &Node, expected: Expected) -> Result<()> {
    match expected {
        Expected::Any => Ok(()),
        Expected::Version(v) if v == node.version => Ok(()),
        Expected::Version(v) => Err(MetadataError::BadVersion {
            path: path.to_string(),
            expected: v,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(tree: &mut Tree, path: &str, mode: CreateMode, session: i64) -> Result<String> {
        let (m, full) = tree.plan_create(session, path, Bytes::from_static(b"x"), mode, 1)?;
        tree.apply(&m);
        Ok(full)
    }

    #[test]
    fn create_checks_parent_and_existence() {
        let mut t = Tree::with_root(0);
        assert_eq!(
            create(&mut t, "/a/b", CreateMode::Persistent, 0),
            Err(MetadataError::NoNode("/a/b".into()))
        );
        assert_eq!(
            create(&mut t, "/a", CreateMode::Persistent, 0),
            Ok("/a".into())
        );
        assert_eq!(
            create(&mut t, "/a", CreateMode::Persistent, 0),
            Err(MetadataError::NodeExists("/a".into()))
        );
        assert_eq!(
            create(&mut t, "/", CreateMode::Persistent, 0),
            Err(MetadataError::NodeExists("/".into()))
        );
        assert_eq!(t.get("/").map(|n| n.children.len()), Some(1));
    }

    #[test]
    fn ephemerals_cannot_have_children_and_are_indexed_by_owner() {
        let mut t = Tree::with_root(0);
        create(&mut t, "/e", CreateMode::Ephemeral, 7).unwrap();
        assert_eq!(
            create(&mut t, "/e/c", CreateMode::Persistent, 7),
            Err(MetadataError::NoChildrenForEphemerals("/e".into()))
        );
        assert_eq!(t.ephemerals_of(7), vec!["/e".to_string()]);
        let m = t.plan_delete("/e", Expected::Any).unwrap();
        assert!(
            t.apply(&m).is_empty(),
            "an ephemeral delete touches no record"
        );
        assert!(t.ephemerals_of(7).is_empty());
    }

    #[test]
    fn sequence_numbers_only_grow() {
        let mut t = Tree::with_root(0);
        create(&mut t, "/p", CreateMode::Persistent, 0).unwrap();
        let a = create(&mut t, "/p/n-", CreateMode::PersistentSequential, 0).unwrap();
        assert_eq!(a, "/p/n-0000000000");
        let m = t.plan_delete(&a, Expected::Any).unwrap();
        t.apply(&m);
        let b = create(&mut t, "/p/n-", CreateMode::EphemeralSequential, 3).unwrap();
        assert_eq!(b, "/p/n-0000000001");
    }

    #[test]
    fn versions_are_compared_and_bumped() {
        let mut t = Tree::with_root(0);
        create(&mut t, "/v", CreateMode::Persistent, 0).unwrap();
        assert!(matches!(
            t.plan_set("/v", Bytes::new(), Expected::Version(1), 2),
            Err(MetadataError::BadVersion { expected: 1, .. })
        ));
        let m = t
            .plan_set("/v", Bytes::new(), Expected::Version(0), 2)
            .unwrap();
        assert_eq!(t.apply(&m), vec!["/v".to_string()]);
        assert_eq!(t.get("/v").map(|n| n.version), Some(1));
        create(&mut t, "/v/c", CreateMode::Persistent, 0).unwrap();
        assert_eq!(
            t.plan_delete("/v", Expected::Any),
            Err(MetadataError::NotEmpty("/v".into()))
        );
    }
}
