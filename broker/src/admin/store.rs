//! JSON nodes in the metadata store for the admin API: read, create,
//! read-modify-CAS update (on the node version) and list.
//!
//! Promise: an update applies its change to the latest stored value and
//! writes with the version it read; a concurrent writer makes it read and
//! apply again, at most [`CAS_RETRIES_MAX`] times, then it answers 409.

use cms_bookie::metadata::{CreateMode, Expected, MetadataError, MetadataStore, Version};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::admin::AdminError;

/// Read-modify-CAS attempts before giving up with 409.
pub const CAS_RETRIES_MAX: usize = 16;

fn decode<T: DeserializeOwned + Default>(path: &str, data: &[u8]) -> Result<T, AdminError> {
    if data.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(data)
        .map_err(|e| AdminError::Internal(format!("corrupt node {path}: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, AdminError> {
    serde_json::to_vec(value).map_err(|e| AdminError::Internal(format!("encoding: {e}")))
}

/// The node's value and version, or None if absent.
pub async fn read<T: DeserializeOwned + Default>(
    store: &dyn MetadataStore,
    path: &str,
) -> Result<Option<(T, Version)>, AdminError> {
    match store.get(path).await {
        Ok((data, stat)) => Ok(Some((decode(path, &data)?, stat.version))),
        Err(MetadataError::NoNode(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Creates the node (and its parents); `exists` is the 409 message if it is
/// there already.
pub async fn create<T: Serialize>(
    store: &dyn MetadataStore,
    path: &str,
    value: &T,
    exists: impl FnOnce() -> String,
) -> Result<(), AdminError> {
    if let Some(parent) = cms_bookie::metadata::parent_of(path) {
        store.create_all(parent).await?;
    }
    match store
        .create(path, &encode(value)?, CreateMode::Persistent)
        .await
    {
        Ok(_) => Ok(()),
        Err(MetadataError::NodeExists(_)) => Err(AdminError::Conflict(exists())),
        Err(e) => Err(e.into()),
    }
}

/// Applies `change` to the stored value and writes it back with a CAS on
/// the version read; `missing` is the 404 message. Returns the new value.
pub async fn update<T, F>(
    store: &dyn MetadataStore,
    path: &str,
    missing: impl Fn() -> String,
    mut change: F,
) -> Result<T, AdminError>
where
    T: DeserializeOwned + Serialize + Default,
    F: FnMut(&mut T) -> Result<(), AdminError>,
{
    for _ in 0..CAS_RETRIES_MAX {
        let Some((mut value, version)) = read::<T>(store, path).await? else {
            return Err(AdminError::NotFound(missing()));
        };
        change(&mut value)?;
        match store
            .set(path, &encode(&value)?, Expected::Version(version))
            .await
        {
            Ok(_) => return Ok(value),
            Err(MetadataError::BadVersion { .. }) => continue,
            Err(MetadataError::NoNode(_)) => return Err(AdminError::NotFound(missing())),
            Err(e) => return Err(e.into()),
        }
    }
    Err(AdminError::Conflict(format!(
        "{path} kept changing concurrently ({CAS_RETRIES_MAX} attempts); retry"
    )))
}

/// Children of `path`, sorted; empty if it does not exist.
pub async fn children(store: &dyn MetadataStore, path: &str) -> Result<Vec<String>, AdminError> {
    match store.children(path).await {
        Ok(mut c) => {
            c.sort();
            Ok(c)
        }
        Err(MetadataError::NoNode(_)) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cms_bookie::metadata::embedded::EmbeddedStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn update_is_read_modify_cas() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("m.redb"))
            .await
            .unwrap();
        let path = "/t/a/b";
        let missing = || "missing".to_string();
        let e = update::<Vec<u32>, _>(&store, path, missing, |v| {
            v.push(1);
            Ok(())
        })
        .await
        .unwrap_err();
        assert_eq!(e, AdminError::NotFound("missing".into()));
        create(&store, path, &vec![0u32], || "exists".into())
            .await
            .unwrap();
        assert_eq!(
            create(&store, path, &vec![0u32], || "exists".into()).await,
            Err(AdminError::Conflict("exists".into()))
        );
        // A concurrent write between the read and the CAS makes the change
        // apply again on the newer value.
        let mut first = true;
        let v: Vec<u32> = update(&store, path, missing, |v: &mut Vec<u32>| {
            if first {
                first = false;
                let s = &store;
                tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(async {
                        s.set(path, b"[7]", Expected::Any).await.unwrap();
                    })
                });
            }
            v.push(1);
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(v, vec![7, 1]);
        let (stored, _) = read::<Vec<u32>>(&store, path).await.unwrap().unwrap();
        assert_eq!(stored, vec![7, 1]);
        assert_eq!(children(&store, "/t/a").await.unwrap(), vec!["b"]);
        assert!(children(&store, "/nope").await.unwrap().is_empty());
    }
}
