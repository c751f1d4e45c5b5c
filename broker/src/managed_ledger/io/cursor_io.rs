//! Durable cursor I/O: restoring a cursor from the last entry of its own
//! ledger (else from its metadata node), writing snapshots to that ledger,
//! rolling it, and keeping the cursor node (`<managed ledger node>/<cursor>`)
//! pointing at it.
//!
//! Promises: a cursor ledger is recovery-opened (fenced) before it is read,
//! so a previous owner can add no snapshot after the one restored; a new
//! cursor ledger holds a full snapshot as its first entry before the cursor
//! node points at it, and the old one is deleted only after that; the node is
//! written by CAS (a conflict fences the managed ledger); snapshot writes of
//! one cursor are serialized, so its ledger's last entry is its newest
//! snapshot.

use std::sync::Arc;

use cms_bookie::client::driver::WriteHandle;
use cms_bookie::metadata::{CreateMode, Expected, MetadataError, Version, join};
use prost::Message;
use tracing::{info, warn};

use super::managed_ledger::{CursorSlot, MlError, Shared, is_fenced, now_ms};
use crate::managed_ledger::cursor::Snapshot;
use crate::managed_ledger::metrics::add;
use crate::managed_ledger::{Cursor, InitialPosition, newest_snapshot, proto};

/// The cursor's own ledger, as written by this owner.
#[derive(Debug)]
pub(super) struct CursorLedger {
    /// Writer of the current cursor ledger (`None` after close: the next
    /// snapshot goes to a new ledger).
    handle: Option<WriteHandle>,
    /// Id of the cursor ledger the node points at.
    pub(super) ledger_id: u64,
    /// Snapshots written to it.
    entries: u64,
    /// Its creation time, ms.
    ctime_ms: u64,
    /// Version of the cursor node (`None` = not created yet).
    node_version: Option<Version>,
}

fn corrupt(path: &str, e: impl std::fmt::Display) -> MlError {
    MlError::Corrupt {
        path: path.to_string(),
        reason: e.to_string(),
    }
}

fn ledger_err(shared: &Shared, e: cms_bookie::client::driver::LedgerError) -> MlError {
    if is_fenced(&e) {
        shared.fenced()
    } else {
        MlError::Ledger(e)
    }
}

/// The last snapshot of cursor ledger `id`, after fencing it; `None` if it
/// is empty, gone or unreadable (the node's snapshot is the fallback).
async fn last_ledger_snapshot(shared: &Shared, id: u64) -> Option<proto::CursorSnapshot> {
    let h = match shared.client.open_ledger(id, true).await {
        Ok(h) => h.with_fairness_key(super::dispatch_reads::tenant_of(&shared.name)),
        Err(e) => {
            warn!(managed_ledger = %shared.name, ledger = id, error = %e, "cursor ledger not recoverable; using the node's snapshot");
            return None;
        }
    };
    let last = h.last_readable();
    if last < 0 {
        return None;
    }
    match h.read(last, last).await {
        Ok(v) => v.into_iter().next().and_then(|e| {
            proto::CursorSnapshot::decode(e.payload)
                .map_err(|err| {
                    warn!(managed_ledger = %shared.name, ledger = id, entry = last, error = %err, "corrupt cursor snapshot");
                })
                .ok()
        }),
        Err(e) => {
            warn!(managed_ledger = %shared.name, ledger = id, error = %e, "cursor ledger unreadable; using the node's snapshot");
            None
        }
    }
}

async fn write_node(
    shared: &Shared,
    path: &str,
    node_version: &mut Option<Version>,
    info: &proto::CursorInfo,
) -> Result<(), MlError> {
    let data = info.encode_to_vec();
    let r = match *node_version {
        None => shared
            .store
            .create(path, &data, CreateMode::Persistent)
            .await
            .map(|(_, stat)| stat),
        Some(v) => shared.store.set(path, &data, Expected::Version(v)).await,
    };
    match r {
        Ok(stat) => {
            *node_version = Some(stat.version);
            Ok(())
        }
        Err(
            MetadataError::BadVersion { .. }
            | MetadataError::NodeExists(_)
            | MetadataError::NoNode(_),
        ) => Err(shared.fenced()),
        Err(e) => Err(MlError::Metadata(e)),
    }
}

/// Read-modify-CAS rounds of [`claim_node`] lost to a previous owner.
const CLAIM_ATTEMPTS_MAX: u32 = 10;

/// Reads the cursor node and rewrites it unchanged by CAS, so that a previous
/// owner can no longer point it at a cursor ledger this owner has not fenced.
async fn claim_node(shared: &Shared, path: &str) -> Result<(Vec<u8>, Version), MetadataError> {
    let mut attempts = 0;
    loop {
        let (data, stat) = shared.store.get(path).await?;
        match shared
            .store
            .set(path, &data, Expected::Version(stat.version))
            .await
        {
            Ok(stat) => return Ok((data, stat.version)),
            Err(MetadataError::BadVersion { .. }) if attempts + 1 < CLAIM_ATTEMPTS_MAX => {
                attempts += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Restores (or creates) durable cursor `name`, gives it a new cursor ledger
/// holding its snapshot, points the node at it and deletes the old one.
pub(super) async fn open_durable(
    shared: &Arc<Shared>,
    name: &str,
    initial: InitialPosition,
) -> Result<(), MlError> {
    let path = join(&shared.path, name);
    let config = shared.config.cursor.clone();
    let (mut cursor, node_version, old_ledger) = match claim_node(shared, &path).await {
        Ok((data, version)) => {
            let info = proto::CursorInfo::decode(data.as_slice()).map_err(|e| corrupt(&path, e))?;
            let old = u64::try_from(info.cursor_ledger_id).ok();
            let from_ledger = match old {
                Some(id) => last_ledger_snapshot(shared, id).await,
                None => None,
            };
            let mut cursor =
                match newest_snapshot(from_ledger.as_ref(), info.last_snapshot.as_ref()) {
                    Some(s) => Cursor::restore(name, s, config).map_err(MlError::Cursor)?,
                    None => Cursor::new(name, initial, &shared.core().list, config),
                };
            *cursor.cursor_properties_mut() = info.properties.clone();
            (cursor, Some(version), old)
        }
        Err(MetadataError::NoNode(_)) => (
            Cursor::new(name, initial, &shared.core().list, config),
            None,
            None,
        ),
        Err(e) => return Err(MlError::Metadata(e)),
    };
    let handle = shared.create_ledger().await?;
    let now = now_ms();
    let snap = cursor.take_snapshot(now);
    if let Err(e) = handle.add(snap.snapshot.encode_to_vec()).await {
        let _ = shared.client.delete_ledger(handle.ledger_id()).await;
        return Err(ledger_err(shared, e));
    }
    add(&shared.config.metrics.cursor_persists, 1);
    add(
        &shared.config.metrics.cursor_persist_bytes,
        u64::try_from(snap.snapshot.encoded_len()).unwrap_or(u64::MAX),
    );
    let mut cl = CursorLedger {
        ledger_id: handle.ledger_id(),
        handle: Some(handle),
        entries: 1,
        ctime_ms: now,
        node_version,
    };
    let (info, _) = cursor.cursor_info(Some(cl.ledger_id));
    write_node(shared, &path, &mut cl.node_version, &info).await?;
    if let Some(old) = old_ledger.filter(|o| *o != cl.ledger_id) {
        match shared.client.delete_ledger(old).await {
            Ok(()) | Err(cms_bookie::client::driver::LedgerError::NoSuchLedger(_)) => {}
            Err(e) => {
                warn!(managed_ledger = %shared.name, ledger = old, error = %e, "old cursor ledger not deleted")
            }
        }
    }
    info!(managed_ledger = %shared.name, cursor = name, mark_delete = %cursor.mark_delete(), cursor_ledger = cl.ledger_id, "cursor opened");
    let read_after = cursor.mark_delete();
    shared.core().cursors.insert(
        name.to_string(),
        CursorSlot {
            cursor,
            durable: true,
            read_after,
            io: Some(Arc::new(tokio::sync::Mutex::new(cl))),
            snapshots_written: 1,
            read_ahead: std::collections::VecDeque::new(),
            active: false,
            persist_queued: false,
        },
    );
    Ok(())
}

/// Writes a snapshot of cursor `name` if one is due (`force`: if anything
/// changed, regardless of the rate), rolling its ledger when the policy says.
pub(super) async fn persist(shared: &Shared, name: &str, force: bool) -> Result<(), MlError> {
    let io = {
        let c = shared.core();
        let slot = c
            .cursors
            .get(name)
            .ok_or_else(|| MlError::NoCursor(name.to_string()))?;
        match &slot.io {
            Some(io) => io.clone(),
            None => return Ok(()),
        }
    };
    let mut cl = io.lock().await;
    let now = now_ms();
    let snap = {
        let mut c = shared.core();
        let Some(slot) = c.cursors.get_mut(name) else {
            return Ok(());
        };
        let due = if force {
            slot.cursor.needs_persist_on_close()
        } else {
            slot.cursor.should_persist(now)
        };
        if !due {
            return Ok(());
        }
        slot.cursor.take_snapshot(now)
    };
    let roll = cl.handle.is_none()
        || shared
            .config
            .cursor_ledger_rollover
            .should_roll(cl.entries, cl.ctime_ms, now);
    let r = if roll {
        switch_ledger(shared, name, &mut cl, &snap, now).await
    } else {
        match &cl.handle {
            Some(h) => match h.add(snap.snapshot.encode_to_vec()).await {
                Ok(_) => {
                    cl.entries += 1;
                    Ok(())
                }
                Err(e) => Err(ledger_err(shared, e)),
            },
            None => Ok(()),
        }
    };
    let m = &shared.config.metrics;
    if r.is_ok() {
        add(&m.cursor_persists, 1);
        add(
            &m.cursor_persist_bytes,
            u64::try_from(snap.snapshot.encoded_len()).unwrap_or(u64::MAX),
        );
        if snap.ranges_dropped > 0 {
            add(&m.snapshots_with_dropped_ranges, 1);
            add(&m.acks_not_persisted, snap.entries_dropped);
        }
    } else {
        add(&m.cursor_persist_failures, 1);
    }
    if let Some(slot) = shared.core().cursors.get_mut(name) {
        if r.is_ok() {
            slot.snapshots_written += 1;
        } else {
            slot.cursor.persist_failed();
        }
    }
    r
}

async fn switch_ledger(
    shared: &Shared,
    name: &str,
    cl: &mut CursorLedger,
    snap: &Snapshot,
    now: u64,
) -> Result<(), MlError> {
    let new = shared.create_ledger().await?;
    if let Err(e) = new.add(snap.snapshot.encode_to_vec()).await {
        let _ = shared.client.delete_ledger(new.ledger_id()).await;
        return Err(ledger_err(shared, e));
    }
    let info = {
        let mut c = shared.core();
        let slot = c
            .cursors
            .get_mut(name)
            .ok_or_else(|| MlError::NoCursor(name.to_string()))?;
        slot.cursor.cursor_info(Some(new.ledger_id())).0
    };
    let path = join(&shared.path, name);
    if let Err(e) = write_node(shared, &path, &mut cl.node_version, &info).await {
        let _ = shared.client.delete_ledger(new.ledger_id()).await;
        return Err(e);
    }
    let old_id = cl.ledger_id;
    let old = cl.handle.replace(new);
    cl.ledger_id = cl.handle.as_ref().map_or(old_id, WriteHandle::ledger_id);
    cl.entries = 1;
    cl.ctime_ms = now;
    if let Some(old) = old {
        let _ = old.close().await;
    }
    match shared.client.delete_ledger(old_id).await {
        Ok(()) | Err(cms_bookie::client::driver::LedgerError::NoSuchLedger(_)) => {}
        Err(e) => {
            warn!(managed_ledger = %shared.name, ledger = old_id, error = %e, "old cursor ledger not deleted")
        }
    }
    info!(managed_ledger = %shared.name, cursor = name, cursor_ledger = cl.ledger_id, "cursor ledger rolled over");
    Ok(())
}

/// Persists a final snapshot of cursor `name` and closes its ledger.
pub(super) async fn close(shared: &Shared, name: &str) -> Result<(), MlError> {
    persist(shared, name, true).await?;
    let io = shared.core().cursors.get(name).and_then(|s| s.io.clone());
    if let Some(io) = io {
        let mut cl = io.lock().await;
        if let Some(h) = cl.handle.take() {
            h.close().await.map_err(|e| ledger_err(shared, e))?;
            // Refresh the fallback snapshot in the node.
            let info = {
                let mut c = shared.core();
                let slot = c
                    .cursors
                    .get_mut(name)
                    .ok_or_else(|| MlError::NoCursor(name.to_string()))?;
                slot.cursor.cursor_info(Some(cl.ledger_id)).0
            };
            let path = join(&shared.path, name);
            let mut version = cl.node_version;
            write_node(shared, &path, &mut version, &info).await?;
            cl.node_version = version;
        }
    }
    Ok(())
}
