//! The bookie's registration in the metadata store: one ephemeral node,
//! `/cms/bookies/available/<id>` while writable or `/cms/bookies/readonly/<id>`
//! while read-only, holding a `BookieRegistration` (endpoint, rack, space).
//!
//! Promises:
//! - at most one of the two nodes is ours at a time (the other is deleted
//!   before the new one is created);
//! - a node left by this bookie's previous process (restarted before its
//!   ZooKeeper session expired) is replaced, not waited for;
//! - a session expiry is never hidden: it is logged, a new session is opened
//!   and the bookie registers again (its ephemeral node was gone meanwhile, so
//!   clients saw it as down, which is the truth).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prost::Message;
use tokio::sync::{Mutex, RwLock};
use tracing::{info, warn};

use crate::metadata::connect::{MetadataUrl, connect};
use crate::metadata::layout::Layout;
use crate::metadata::zk::ZkOptions;
use crate::metadata::{CreateMode, Expected, MetadataError, MetadataStore, join};
use crate::proto::metadata::BookieRegistration;

/// Registers and re-registers one bookie.
pub struct Registrar {
    store: RwLock<Arc<dyn MetadataStore>>,
    url: MetadataUrl,
    opts: ZkOptions,
    layout: Layout,
    template: BookieRegistration,
    registered_writable: Mutex<Option<bool>>,
    registered: Arc<AtomicBool>,
}

impl std::fmt::Debug for Registrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registrar")
            .field("bookie_id", &self.template.bookie_id)
            .finish_non_exhaustive()
    }
}

impl Registrar {
    /// A registrar for the bookie described by `template`.
    pub fn new(
        store: Arc<dyn MetadataStore>,
        url: MetadataUrl,
        opts: ZkOptions,
        layout: Layout,
        template: BookieRegistration,
    ) -> Self {
        Registrar {
            store: RwLock::new(store),
            url,
            opts,
            layout,
            template,
            registered_writable: Mutex::new(None),
            registered: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The current metadata store handle.
    pub async fn store(&self) -> Arc<dyn MetadataStore> {
        self.store.read().await.clone()
    }

    /// Set while a registration node is ours.
    pub fn registered_flag(&self) -> Arc<AtomicBool> {
        self.registered.clone()
    }

    fn node(&self, writable: bool) -> String {
        let parent = if writable {
            self.layout.bookies_available()
        } else {
            self.layout.bookies_readonly()
        };
        join(&parent, &self.template.bookie_id)
    }

    /// Registers as writable or read-only, replacing any previous node.
    pub async fn register(
        &self,
        writable: bool,
        total_bytes: u64,
        free_bytes: u64,
    ) -> Result<(), MetadataError> {
        let mut current = self.registered_writable.lock().await;
        let store = self.store().await;
        let mut reg = self.template.clone();
        reg.writable = writable;
        reg.total_bytes = total_bytes;
        reg.free_bytes = free_bytes;
        let data = reg.encode_to_vec();
        // Remove the other node first, so no reader sees both.
        delete_if_present(store.as_ref(), &self.node(!writable)).await?;
        let path = self.node(writable);
        match store.create(&path, &data, CreateMode::Ephemeral).await {
            Ok(_) => {}
            Err(MetadataError::NodeExists(_)) => {
                let ours = store
                    .exists(&path)
                    .await?
                    .is_some_and(|s| s.ephemeral_owner == store.session_id());
                if ours {
                    store.set(&path, &data, Expected::Any).await?;
                } else {
                    // Left by our previous process whose session has not
                    // expired yet: the cookie check proved we are that bookie.
                    info!(node = %path, "replacing the registration of a previous process");
                    delete_if_present(store.as_ref(), &path).await?;
                    store.create(&path, &data, CreateMode::Ephemeral).await?;
                }
            }
            Err(e) => return Err(e),
        }
        if *current != Some(writable) {
            info!(
                bookie = %self.template.bookie_id,
                node = %path,
                writable,
                "registered"
            );
        }
        *current = Some(writable);
        self.registered.store(true, Ordering::Release);
        Ok(())
    }

    /// Removes the registration (clean shutdown).
    pub async fn deregister(&self) {
        let mut current = self.registered_writable.lock().await;
        let store = self.store().await;
        for writable in [true, false] {
            if let Err(e) = delete_if_present(store.as_ref(), &self.node(writable)).await {
                warn!(error = %e, "removing the registration failed");
            }
        }
        *current = None;
        self.registered.store(false, Ordering::Release);
    }

    /// Watches the session; on expiry opens a new one and registers again as
    /// `writable()` says. Returns when the store is closed.
    pub async fn keep_registered(
        &self,
        writable: impl Fn() -> bool,
        space: impl Fn() -> (u64, u64),
    ) {
        loop {
            let mut events = self.store().await.session_events();
            let state = events.wait_for(|s| s.is_terminal()).await.map(|s| *s).ok();
            match state {
                Some(crate::metadata::SessionState::Expired) => {
                    self.registered.store(false, Ordering::Release);
                    *self.registered_writable.lock().await = None;
                    warn!(
                        "metadata session expired: the registration is gone; opening a new session"
                    );
                    let mut delay_ms = 100;
                    loop {
                        match connect(&self.url, &self.opts).await {
                            Ok(store) => {
                                *self.store.write().await = store;
                                let (total, free) = space();
                                match self.register(writable(), total, free).await {
                                    Ok(()) => break,
                                    Err(e) => warn!(error = %e, "re-registering failed"),
                                }
                            }
                            Err(e) => {
                                warn!(error = %e, "reconnecting to the metadata store failed")
                            }
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                        delay_ms = (delay_ms * 2).min(5_000);
                    }
                }
                _ => return,
            }
        }
    }
}

async fn delete_if_present(store: &dyn MetadataStore, path: &str) -> Result<(), MetadataError> {
    match store.delete(path, Expected::Any).await {
        Ok(()) | Err(MetadataError::NoNode(_)) => Ok(()),
        Err(e) => Err(e),
    }
}
