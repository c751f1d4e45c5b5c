//! The embedded store's file: a redb database holding every persistent node.
//!
//! One table maps a node's path to its record (version, times, sequence counter,
//! data); children are not stored, they follow from the paths. A second table
//! holds the format version. [`Disk::commit`] writes a batch of record changes in
//! one write transaction with [`Durability::Immediate`]: when it returns `Ok`, the
//! batch is on disk (fsynced). Ephemeral nodes never reach this file.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use redb::{Database, DatabaseError, Durability, ReadableTable, TableDefinition};

use super::super::{MetadataError, Result};
use super::tree::{Node, Tree};

const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const FORMAT_KEY: &str = "format";
/// Version of the record layout below. Bump it on any change.
const FORMAT_VERSION: u64 = 1;
/// Record layout: tag byte, then version, ctime, mtime, next_seq (i64 LE each),
/// then the data.
const RECORD_TAG: u8 = 1;
const RECORD_HEADER_BYTES: usize = 1 + 4 * 8;

/// The open file.
pub(super) struct Disk {
    db: Database,
    path: PathBuf,
}

/// The on-disk record of a persistent node.
pub(super) fn encode(node: &Node) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER_BYTES + node.data.len());
    out.push(RECORD_TAG);
    out.extend_from_slice(&node.version.to_le_bytes());
    out.extend_from_slice(&node.ctime_ms.to_le_bytes());
    out.extend_from_slice(&node.mtime_ms.to_le_bytes());
    out.extend_from_slice(&node.next_seq.to_le_bytes());
    out.extend_from_slice(&node.data);
    out
}

fn decode(path: &str, record: &[u8]) -> std::result::Result<Node, String> {
    if record.len() < RECORD_HEADER_BYTES || record[0] != RECORD_TAG {
        return Err(format!(
            "record of {path:?} is malformed ({} bytes)",
            record.len()
        ));
    }
    let field = |i: usize| {
        let start = 1 + i * 8;
        let mut b = [0u8; 8];
        b.copy_from_slice(&record[start..start + 8]);
        i64::from_le_bytes(b)
    };
    Ok(Node {
        data: Bytes::copy_from_slice(&record[RECORD_HEADER_BYTES..]),
        version: field(0),
        ctime_ms: field(1),
        mtime_ms: field(2),
        owner: 0,
        next_seq: field(3),
        children: Default::default(),
    })
}

fn storage(path: &Path, what: &str, e: impl std::fmt::Display) -> MetadataError {
    MetadataError::Storage(format!("metadata file {}: {what}: {e}", path.display()))
}

fn open_error(path: &Path, e: DatabaseError) -> MetadataError {
    match e {
        DatabaseError::DatabaseAlreadyOpen | DatabaseError::LockProtocolMismatch => {
            MetadataError::Storage(format!(
                "metadata file {} is already in use by another process (its lock is held); \
                 stop that process or use another file",
                path.display()
            ))
        }
        other => MetadataError::Storage(format!(
            "cannot open metadata file {} (corrupt, or not a CMS metadata file?): {other}",
            path.display()
        )),
    }
}

impl Disk {
    /// Opens (creating if needed) the file and loads every persistent node.
    /// Corruption is reported as [`MetadataError::Storage`], never as a panic.
    pub fn open(path: &Path, cache_bytes_max: usize, now_ms: i64) -> Result<(Disk, Tree)> {
        let opened = catch_unwind(AssertUnwindSafe(|| {
            redb::Builder::new()
                .set_cache_size(cache_bytes_max)
                .set_check_integrity_on_open(true)
                .create(path)
        }));
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(e)) => return Err(open_error(path, e)),
            Err(_) => {
                return Err(MetadataError::Storage(format!(
                    "cannot open metadata file {}: the file is corrupt",
                    path.display()
                )));
            }
        };
        let disk = Disk {
            db,
            path: path.to_path_buf(),
        };
        let loaded = catch_unwind(AssertUnwindSafe(|| disk.load(now_ms)));
        match loaded {
            Ok(Ok(tree)) => Ok((disk, tree)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(MetadataError::Storage(format!(
                "reading metadata file {}: the file is corrupt",
                path.display()
            ))),
        }
    }

    /// Checks the format, writes the root on a new file, and reads every node.
    fn load(&self, now_ms: i64) -> Result<Tree> {
        let path = &self.path;
        let mut txn = self
            .db
            .begin_write()
            .map_err(|e| storage(path, "begin", e))?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| storage(path, "durability", e))?;
        let mut tree = Tree::with_root(now_ms);
        {
            let mut meta = txn
                .open_table(META)
                .map_err(|e| storage(path, "meta table", e))?;
            let format = meta
                .get(FORMAT_KEY)
                .map_err(|e| storage(path, "format", e))?
                .map(|v| v.value());
            match format {
                Some(FORMAT_VERSION) => {}
                Some(other) => {
                    return Err(MetadataError::Storage(format!(
                        "metadata file {} has format {other}, this build reads format {FORMAT_VERSION}",
                        path.display()
                    )));
                }
                None => {
                    meta.insert(FORMAT_KEY, FORMAT_VERSION)
                        .map_err(|e| storage(path, "format", e))?;
                }
            }
            let mut nodes = txn
                .open_table(NODES)
                .map_err(|e| storage(path, "nodes table", e))?;
            let has_root = nodes
                .get("/")
                .map_err(|e| storage(path, "root", e))?
                .is_some();
            if !has_root {
                let root = tree.get("/").map(encode).unwrap_or_default();
                nodes
                    .insert("/", root.as_slice())
                    .map_err(|e| storage(path, "root", e))?;
            }
            for entry in nodes.iter().map_err(|e| storage(path, "scan", e))? {
                let (key, value) = entry.map_err(|e| storage(path, "scan", e))?;
                let node_path = key.value().to_string();
                super::super::validate_path(&node_path)
                    .map_err(|e| storage(path, "corrupt node path", e))?;
                let node = decode(&node_path, value.value())
                    .map_err(|e| storage(path, "corrupt record", e))?;
                tree.insert_loaded(node_path, node)
                    .map_err(|e| storage(path, "corrupt tree", e))?;
            }
        }
        txn.commit().map_err(|e| storage(path, "commit", e))?;
        Ok(tree)
    }

    /// Writes the records (`None` = delete) in one durable transaction.
    pub fn commit(&mut self, changes: &BTreeMap<String, Option<Vec<u8>>>) -> Result<()> {
        let path = &self.path;
        let mut txn = self
            .db
            .begin_write()
            .map_err(|e| storage(path, "begin", e))?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| storage(path, "durability", e))?;
        {
            let mut nodes = txn
                .open_table(NODES)
                .map_err(|e| storage(path, "nodes table", e))?;
            for (key, record) in changes {
                match record {
                    Some(bytes) => {
                        nodes
                            .insert(key.as_str(), bytes.as_slice())
                            .map_err(|e| storage(path, "write", e))?;
                    }
                    None => {
                        nodes
                            .remove(key.as_str())
                            .map_err(|e| storage(path, "delete", e))?;
                    }
                }
            }
        }
        txn.commit().map_err(|e| storage(path, "commit (fsync)", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let node = Node {
            data: Bytes::from_static(b"hello"),
            version: 7,
            ctime_ms: 11,
            mtime_ms: 12,
            owner: 0,
            next_seq: 42,
            children: Default::default(),
        };
        assert_eq!(decode("/x", &encode(&node)), Ok(node));
        assert!(decode("/x", &[RECORD_TAG; 3]).is_err());
        assert!(decode("/x", &[9u8; RECORD_HEADER_BYTES]).is_err());
    }
}
