//! ZooKeeper persistent watches turned into the trait's [`Watch`] streams.
//!
//! One task per watch moves events from the crate's (unbounded) persistent
//! watcher into a channel bounded by [`WATCH_EVENTS_MAX`], in the order ZooKeeper
//! delivered them. The stream ends — and the consumer must re-read and re-watch —
//! when:
//! - the consumer falls more than [`WATCH_EVENTS_MAX`] events behind;
//! - the session ends (expired, closed);
//! - the connection is lost: ZooKeeper can drop persistent-watch events that
//!   happen while a client reconnects (ZOOKEEPER-4698), so a watch that lived
//!   through a disconnection could silently miss a change. Ending it keeps the
//!   trait's promise that no change is missed by a consumer that re-reads.
//!
//! Dropping the [`Watch`] stops the task, which drops the crate's watcher, which
//! removes the watch from the server once no other watcher of this session needs
//! the path.

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zookeeper_client as zk;

use crate::metadata::{WATCH_EVENTS_MAX, Watch, WatchEvent};

/// Which trait method a watch serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WatchKind {
    /// `watch_data`: `Created`, `DataChanged`, `Deleted`.
    Data,
    /// `watch_children`: `ChildrenChanged`, and `Deleted` for the node itself.
    Children,
}

/// What one crate event means for a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Deliver this event.
    Emit(WatchEvent),
    /// Not for this kind of watch.
    Skip,
    /// End the stream, for this reason.
    End(&'static str),
}

/// Translates one event of the crate's persistent watcher.
pub(super) fn step(kind: WatchKind, event: &zk::WatchedEvent) -> Step {
    let path = || event.path.clone();
    match (event.event_type, kind) {
        (zk::EventType::Session, _) => match event.session_state {
            zk::SessionState::SyncConnected => Step::Skip,
            zk::SessionState::Disconnected | zk::SessionState::ConnectedReadOnly => {
                Step::End("connection lost; events during reconnection may be missed")
            }
            zk::SessionState::Expired | zk::SessionState::AuthFailed => {
                Step::End("session expired")
            }
            zk::SessionState::Closed => Step::End("session closed"),
        },
        (zk::EventType::NodeDeleted, _) => Step::Emit(WatchEvent::Deleted(path())),
        (zk::EventType::NodeCreated, WatchKind::Data) => Step::Emit(WatchEvent::Created(path())),
        (zk::EventType::NodeDataChanged, WatchKind::Data) => {
            Step::Emit(WatchEvent::DataChanged(path()))
        }
        (zk::EventType::NodeChildrenChanged, WatchKind::Children) => {
            Step::Emit(WatchEvent::ChildrenChanged(path()))
        }
        (zk::EventType::NodeChildrenChanged, WatchKind::Data)
        | (zk::EventType::NodeCreated | zk::EventType::NodeDataChanged, WatchKind::Children) => {
            Step::Skip
        }
    }
}

/// Aborts the forwarding task when the [`Watch`] holding it is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts forwarding `watcher`'s events for `path` into a new [`Watch`].
pub(super) fn spawn(kind: WatchKind, path: &str, mut watcher: zk::PersistentWatcher) -> Watch {
    let (tx, rx) = mpsc::channel(WATCH_EVENTS_MAX);
    let path = path.to_string();
    let task = tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                event = watcher.changed() => event,
                () = tx.closed() => return,
            };
            match step(kind, &event) {
                Step::Skip => {}
                Step::End(reason) => {
                    tracing::debug!(%path, ?kind, reason, "ZooKeeper watch ended");
                    return;
                }
                Step::Emit(e) => match tx.try_send(e) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        tracing::warn!(
                            %path,
                            ?kind,
                            watch_events_max = WATCH_EVENTS_MAX,
                            "watch consumer fell too far behind; closing the watch"
                        );
                        return;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                },
            }
        }
    });
    Watch::new(rx, Some(Box::new(AbortOnDrop(task))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(t: zk::EventType) -> zk::WatchedEvent {
        zk::WatchedEvent::new(t, "/w")
    }

    #[test]
    fn data_watch_events() {
        use zk::EventType as E;
        let k = WatchKind::Data;
        assert_eq!(
            step(k, &node(E::NodeCreated)),
            Step::Emit(WatchEvent::Created("/w".into()))
        );
        assert_eq!(
            step(k, &node(E::NodeDataChanged)),
            Step::Emit(WatchEvent::DataChanged("/w".into()))
        );
        assert_eq!(
            step(k, &node(E::NodeDeleted)),
            Step::Emit(WatchEvent::Deleted("/w".into()))
        );
        assert_eq!(step(k, &node(E::NodeChildrenChanged)), Step::Skip);
    }

    #[test]
    fn children_watch_events() {
        use zk::EventType as E;
        let k = WatchKind::Children;
        assert_eq!(
            step(k, &node(E::NodeChildrenChanged)),
            Step::Emit(WatchEvent::ChildrenChanged("/w".into()))
        );
        assert_eq!(
            step(k, &node(E::NodeDeleted)),
            Step::Emit(WatchEvent::Deleted("/w".into()))
        );
        assert_eq!(step(k, &node(E::NodeCreated)), Step::Skip);
        assert_eq!(step(k, &node(E::NodeDataChanged)), Step::Skip);
    }

    #[test]
    fn session_events_end_or_pass() {
        use zk::SessionState as S;
        for k in [WatchKind::Data, WatchKind::Children] {
            assert_eq!(
                step(k, &zk::WatchedEvent::new_session(S::SyncConnected)),
                Step::Skip
            );
            for s in [S::Disconnected, S::Expired, S::Closed, S::AuthFailed] {
                assert!(
                    matches!(step(k, &zk::WatchedEvent::new_session(s)), Step::End(_)),
                    "{s:?}"
                );
            }
        }
    }
}
