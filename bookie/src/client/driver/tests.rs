//! The driver's metadata side against the embedded store (no bookies needed):
//! id generation, creation errors, the metadata node, CAS updates, deletion,
//! under-replication marks.

#![allow(clippy::unwrap_used, reason = "tests: a panic is the test failing")]

use std::collections::{BTreeSet, HashMap};

use prost::Message;

use super::*;
use crate::client::metadata::{EnsembleChange, status};
use crate::metadata::embedded::EmbeddedStore;
use crate::metadata::layout::init_cluster;
use crate::proto::metadata::{BookieRegistration, LedgerStatus};

async fn setup(bookies: &[(&str, bool)]) -> (tempfile::TempDir, Arc<dyn MetadataStore>, Layout) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn MetadataStore> = Arc::new(
        EmbeddedStore::open(&dir.path().join("md.redb"))
            .await
            .unwrap(),
    );
    let layout = Layout::new("/cms").unwrap();
    init_cluster(store.as_ref(), &layout, "t").await.unwrap();
    for (id, writable) in bookies {
        register(&store, &layout, id, *writable).await;
    }
    (dir, store, layout)
}

async fn register(store: &Arc<dyn MetadataStore>, layout: &Layout, id: &str, writable: bool) {
    let reg = BookieRegistration {
        bookie_id: id.into(),
        incarnation: 1,
        // Nothing listens there: these tests never send to bookies.
        endpoint: "127.0.0.1:1".into(),
        writable,
        ..Default::default()
    };
    let dir = if writable {
        layout.bookies_available()
    } else {
        layout.bookies_readonly()
    };
    store
        .create(&join(&dir, id), &reg.encode_to_vec(), CreateMode::Ephemeral)
        .await
        .unwrap();
}

fn options() -> LedgerClientOptions {
    LedgerClientOptions::default()
}

#[tokio::test]
async fn ledger_ids_never_repeat_and_idgen_nodes_are_deleted() {
    let (_d, store, layout) = setup(&[]).await;
    let client = LedgerClient::connect(store.clone(), layout.clone(), options())
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    for _ in 0..50 {
        let id = client.inner.next_ledger_id().await.unwrap();
        assert!(seen.insert(id), "id {id} repeated");
    }
    assert!(
        store
            .children(&layout.ledger_idgen())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn bad_quorums_and_too_few_writable_bookies_are_refused() {
    let (_d, store, layout) = setup(&[("b1", true), ("b2", true), ("b3", false)]).await;
    let client = LedgerClient::connect(store, layout, options())
        .await
        .unwrap();
    assert!(matches!(
        client.create_ledger(2, 3, 1, b"pw", HashMap::new()).await,
        Err(LedgerError::InvalidQuorum(_))
    ));
    assert!(matches!(
        client.create_ledger(2, 2, 0, b"pw", HashMap::new()).await,
        Err(LedgerError::InvalidQuorum(_))
    ));
    assert_eq!(
        client
            .create_ledger(3, 2, 2, b"pw", HashMap::new())
            .await
            .err(),
        Some(LedgerError::NotEnoughBookies {
            wanted: 3,
            available: 2
        })
    );
}

#[tokio::test]
async fn create_stores_open_metadata_on_writable_bookies_and_delete_removes_it() {
    let (_d, store, layout) =
        setup(&[("b1", true), ("b2", true), ("b3", true), ("b4", false)]).await;
    let client = LedgerClient::connect(store.clone(), layout.clone(), options())
        .await
        .unwrap();
    let custom: HashMap<String, Bytes> = [("topic".to_string(), Bytes::from_static(b"t1"))].into();
    let w = client.create_ledger(3, 3, 2, b"pw", custom).await.unwrap();
    let md = client.ledger_metadata(w.ledger_id()).await.unwrap();
    assert_eq!(status(&md).unwrap(), LedgerStatus::LedgerOpen);
    let mut ensemble = md.segments[0].ensemble.clone();
    ensemble.sort();
    assert_eq!(ensemble, vec!["b1", "b2", "b3"]);
    assert_eq!(md.custom.get("topic").map(Vec::as_slice), Some(&b"t1"[..]));
    assert!(
        store
            .exists(&layout.ledger(w.ledger_id()))
            .await
            .unwrap()
            .is_some()
    );
    // A reader of the open, empty ledger sees nothing readable.
    let r = client.open_ledger(w.ledger_id(), false).await.unwrap();
    assert_eq!(r.last_readable(), -1);
    assert!(matches!(
        r.read(0, 0).await,
        Err(LedgerError::Read(ReadError::PastEnd { .. }))
    ));
    client.delete_ledger(w.ledger_id()).await.unwrap();
    assert_eq!(
        client.open_ledger(w.ledger_id(), false).await.err(),
        Some(LedgerError::NoSuchLedger(w.ledger_id()))
    );
    assert_eq!(
        client.delete_ledger(w.ledger_id()).await.err(),
        Some(LedgerError::NoSuchLedger(w.ledger_id()))
    );
}

#[tokio::test]
async fn cas_update_applies_once_and_a_fenced_writer_update_fails() {
    let (_d, store, layout) =
        setup(&[("b1", true), ("b2", true), ("b3", true), ("b4", true)]).await;
    let client = LedgerClient::connect(store, layout, options())
        .await
        .unwrap();
    let w = client
        .create_ledger(3, 2, 2, b"pw", HashMap::new())
        .await
        .unwrap();
    let id = w.ledger_id();
    let md = client.ledger_metadata(id).await.unwrap();
    let old = md.segments[0].ensemble[0].clone();
    let new = ["b1", "b2", "b3", "b4"]
        .iter()
        .find(|b| !md.segments[0].ensemble.iter().any(|x| x == *b))
        .unwrap()
        .to_string();
    let change = MetadataOp::ChangeEnsemble(EnsembleChange {
        first_entry_id: 0,
        replacements: vec![Replacement {
            old,
            new: new.clone(),
        }],
    });
    let after = client.inner.update_metadata(id, &change).await.unwrap();
    assert!(after.segments.last().unwrap().ensemble.contains(&new));
    assert_eq!(client.ledger_metadata(id).await.unwrap(), after);
    // Recovery marks it; the writer's next update is refused as fenced.
    client
        .inner
        .update_metadata(id, &MetadataOp::MarkInRecovery)
        .await
        .unwrap();
    let close = MetadataOp::Close {
        last_entry_id: -1,
        length: 0,
        by: crate::client::metadata::Updater::Writer,
        ensemble_changes: Vec::new(),
    };
    assert!(matches!(
        client.inner.update_metadata(id, &close).await,
        Err(UpdateError::Fenced { .. })
    ));
}

#[tokio::test]
async fn under_replication_mark_mirrors_the_ledger_path_and_is_idempotent() {
    let (_d, store, layout) = setup(&[]).await;
    let client = LedgerClient::connect(store.clone(), layout.clone(), options())
        .await
        .unwrap();
    let path = client.underreplicated_path(12_345);
    assert_eq!(path, "/cms/underreplicated/0000/0000/0000/0001/L2345");
    client
        .inner
        .report_underreplicated(12_345, &["b2".into()])
        .await;
    client
        .inner
        .report_underreplicated(12_345, &["b2".into()])
        .await;
    let (data, _) = store.get(&path).await.unwrap();
    assert_eq!(data, b"b2");
}

#[tokio::test]
async fn the_registry_follows_registrations_and_read_only_moves() {
    let (_d, store, layout) = setup(&[("b1", true)]).await;
    let client = LedgerClient::connect(store.clone(), layout.clone(), options())
        .await
        .unwrap();
    assert_eq!(client.bookies().len(), 1);
    register(&store, &layout, "b2", false).await;
    client.refresh_bookies().await.unwrap();
    let b = client.bookies();
    assert_eq!(b.len(), 2);
    assert!(b[0].writable && !b[1].writable);
}

#[test]
fn client_and_handles_are_send_sync_and_cheap_to_clone() {
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    shareable::<LedgerClient>();
    shareable::<WriteHandle>();
    shareable::<ReadHandle>();
}
