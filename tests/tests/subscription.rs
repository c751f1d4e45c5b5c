//! Subscriptions and dispatch against real processes: a harness ZooKeeper
//! and 3 `cms-bookie serve` bookies under a managed ledger. Shared delivers
//! every entry exactly once across consumers, Exclusive refuses a second
//! consumer, Failover switches on leave and redelivers the unacked, redelivery
//! counts rise, permits bound deliveries (a batch counts its messages),
//! readers start where asked, and a reopened subscription resumes from its
//! stored cursor (acked entries are not redelivered); unsubscribe deletes it.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic is the test failing"
)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cms_broker::dispatch::{
    ConsumerId, DispatchError, HashRange, KeySharedMode, KeySharedSpec, SubType,
};
use cms_broker::managed_ledger::io::{
    EntryCache, ManagedLedger, ManagedLedgerConfig, Persist, SeekTarget,
};
use cms_broker::managed_ledger::{InitialPosition, Position};
use cms_broker::subscription::{
    ConsumerSpec, Delivery, KeyHasher, MessageCounter, StartPosition, SubError, Subscription,
    SubscriptionConfig,
};
use cms_tests::cluster::{managed_ledger_env, start_bookies};
use cms_tests::harness::zookeeper::{ZkConfig, ZooKeeper};
use tokio::sync::mpsc;

/// How long a test waits for a delivery it expects.
const DELIVERY_WAIT: Duration = Duration::from_secs(10);

async fn zk() -> ZooKeeper {
    ZooKeeper::start_with(ZkConfig::with_tick_time_ms(1_000)).await
}

/// One "broker": a ledger client and a metadata store, shared by the
/// managed ledgers a test opens.
struct Env {
    client: cms_bookie::client::driver::LedgerClient,
    store: Arc<dyn cms_bookie::metadata::MetadataStore>,
    layout: cms_bookie::metadata::layout::Layout,
    cache: EntryCache,
}

async fn env(zk: &ZooKeeper) -> Env {
    let (client, store, layout) = managed_ledger_env(&zk.connect_string()).await;
    Env {
        client,
        store,
        layout,
        cache: EntryCache::new(64 << 20),
    }
}

async fn open(env: &Env, name: &str) -> ManagedLedger {
    ManagedLedger::open(
        env.client.clone(),
        env.store.clone(),
        &env.layout,
        name,
        ManagedLedgerConfig::default(),
        env.cache.clone(),
    )
    .await
    .unwrap()
}

/// Entries written here start with their message count (1 = a single
/// message, more = a batch), then a name.
fn counter() -> MessageCounter {
    Arc::new(|b: &[u8]| u32::from(b.first().copied().unwrap_or(1)))
}

fn entry(i: usize, messages: u8) -> Vec<u8> {
    let mut v = vec![messages];
    v.extend_from_slice(format!("entry {i:04}").as_bytes());
    v
}

/// Appends `n` entries of `messages` messages each; returns their positions.
async fn append(ml: &ManagedLedger, n: usize, messages: u8) -> Vec<Position> {
    let mut pending = Vec::new();
    for i in 0..n {
        pending.push(ml.append_pipelined(entry(i, messages)).await.unwrap());
    }
    let mut out = Vec::new();
    for p in pending {
        out.push(p.wait().await.unwrap());
    }
    out
}

async fn durable(ml: &ManagedLedger, name: &str) -> Subscription {
    Subscription::open_durable(
        ml,
        name,
        InitialPosition::Earliest,
        counter(),
        SubscriptionConfig::default(),
    )
    .await
    .unwrap()
}

fn cid(i: u64) -> ConsumerId {
    ConsumerId::new(7, i)
}

/// Attaches consumer `i`; returns its sink's receiving end.
fn attach(
    sub: &Subscription,
    i: u64,
    name: &str,
    t: SubType,
) -> Result<mpsc::Receiver<Delivery>, SubError> {
    let (tx, rx) = mpsc::channel(1_000);
    sub.add_consumer(ConsumerSpec {
        id: cid(i),
        name: name.to_string(),
        priority: 0,
        sub_type: t,
        key_shared: None,
        sink: tx,
    })?;
    Ok(rx)
}

/// The next delivery (within [`DELIVERY_WAIT`]).
async fn next(rx: &mut mpsc::Receiver<Delivery>) -> Delivery {
    tokio::time::timeout(DELIVERY_WAIT, rx.recv())
        .await
        .expect("a delivery in time")
        .expect("the sink is open")
}

/// The next `n` messages: (position, redelivery count).
async fn messages(rx: &mut mpsc::Receiver<Delivery>, n: usize) -> Vec<(Position, u32)> {
    let mut out = Vec::new();
    while out.len() < n {
        match next(rx).await {
            Delivery::Message {
                position,
                redelivery_count,
                ..
            } => out.push((position, redelivery_count)),
            Delivery::ActiveChanged { .. } => {}
        }
    }
    out
}

/// Waits until the subscription cannot send `consumer` anything more (no
/// permits left, not the active consumer, or every entry read and nothing
/// to redeliver), then checks that nothing more arrived.
async fn assert_no_more(
    ml: &ManagedLedger,
    sub: &Subscription,
    consumer: ConsumerId,
    rx: &mut mpsc::Receiver<Delivery>,
) {
    let deadline = tokio::time::Instant::now() + DELIVERY_WAIT;
    loop {
        let s = sub.stats();
        let c = s
            .dispatcher
            .consumers
            .iter()
            .find(|c| c.id == consumer)
            .unwrap();
        let single_active = s.dispatcher.sub_type != Some(SubType::Shared);
        let caught_up = ml.ledgers().next_valid_position(s.read_position).is_none()
            && s.dispatcher.replay_entries == 0;
        if c.permits <= 0 || (single_active && !c.is_active) || caught_up {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still dispatching: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let a send that was already under way land before looking.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rx.try_recv().is_err(), "a delivery beyond what was allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_exclusive_and_failover_dispatch() {
    let zk = zk().await;
    let _bookies = start_bookies(&zk.connect_string(), 3).await;
    let env = env(&zk).await;
    let ml = open(&env, "t/ns/dispatch").await;
    let positions = append(&ml, 40, 1).await;

    // Shared, two consumers acking as they go: every entry exactly once.
    let shared = durable(&ml, "shared").await;
    let mut rx1 = attach(&shared, 1, "c1", SubType::Shared).unwrap();
    let mut rx2 = attach(&shared, 2, "c2", SubType::Shared).unwrap();
    shared.flow(cid(1), 10).unwrap();
    shared.flow(cid(2), 10).unwrap();
    let mut got: Vec<Position> = Vec::new();
    let mut per_consumer = [0usize; 2];
    while got.len() < positions.len() {
        let (who, d) = tokio::select! {
            d = next(&mut rx1) => (1, d),
            d = next(&mut rx2) => (2, d),
        };
        let Delivery::Message {
            position,
            consumer_id,
            redelivery_count,
            ..
        } = d
        else {
            panic!("Shared sends no active-consumer changes: {d:?}");
        };
        assert_eq!(consumer_id, cid(who));
        assert_eq!(redelivery_count, 0);
        per_consumer[usize::try_from(who - 1).unwrap()] += 1;
        got.push(position);
        shared
            .ack_individual(cid(who), &[position], Persist::Wait)
            .await
            .unwrap();
        shared.flow(cid(who), 1).unwrap();
    }
    let unique: BTreeSet<Position> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "no duplicates: {got:?}");
    assert_eq!(unique, positions.iter().copied().collect());
    assert!(
        per_consumer.iter().all(|n| *n >= 10),
        "both consumers served: {per_consumer:?}"
    );
    let s = shared.stats();
    assert_eq!(
        (s.msg_backlog, s.dispatcher.unacked_messages),
        (0, 0),
        "{s:?}"
    );
    assert_eq!(s.mark_delete, *positions.last().unwrap());
    assert_eq!(
        shared
            .ack_cumulative(cid(1), positions[0], Persist::Wait)
            .await,
        Err(SubError::Dispatch(DispatchError::CumulativeAckOnShared))
    );

    // Exclusive: a second consumer is refused, another type too.
    let excl = durable(&ml, "exclusive").await;
    let _x1 = attach(&excl, 1, "x1", SubType::Exclusive).unwrap();
    assert_eq!(
        attach(&excl, 2, "x2", SubType::Exclusive).err(),
        Some(SubError::Dispatch(DispatchError::ConsumerBusy {
            existing: cid(1)
        }))
    );
    assert!(matches!(
        attach(&excl, 3, "x3", SubType::Shared).err(),
        Some(SubError::Dispatch(DispatchError::SubTypeMismatch { .. }))
    ));

    // Failover: "a" is active; it gets 5, acks 2, leaves; "b" takes over and
    // gets the 3 unacked again (count 1), then the rest.
    let fo = durable(&ml, "failover").await;
    let mut fa = attach(&fo, 1, "a", SubType::Failover).unwrap();
    let mut fb = attach(&fo, 2, "b", SubType::Failover).unwrap();
    assert_eq!(
        next(&mut fa).await,
        Delivery::ActiveChanged {
            consumer_id: cid(1),
            is_active: true
        }
    );
    assert_eq!(
        next(&mut fb).await,
        Delivery::ActiveChanged {
            consumer_id: cid(2),
            is_active: false
        }
    );
    fo.flow(cid(2), 1_000).unwrap();
    fo.flow(cid(1), 5).unwrap();
    let first: Vec<Position> = messages(&mut fa, 5)
        .await
        .into_iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(first, positions[..5].to_vec());
    fo.ack_individual(cid(1), &positions[..2], Persist::Wait)
        .await
        .unwrap();
    assert_no_more(&ml, &fo, cid(2), &mut fb).await;
    fo.remove_consumer(cid(1)).unwrap();
    assert_eq!(
        next(&mut fb).await,
        Delivery::ActiveChanged {
            consumer_id: cid(2),
            is_active: true
        }
    );
    let rest = messages(&mut fb, 38).await;
    let want: Vec<(Position, u32)> = positions[2..]
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, u32::from(i < 3)))
        .collect();
    assert_eq!(rest, want);
    fo.ack_cumulative(cid(2), *positions.last().unwrap(), Persist::Wait)
        .await
        .unwrap();
    assert_eq!(fo.stats().msg_backlog, 0);
    for s in [shared, excl, fo] {
        s.close().await.unwrap();
    }
    ml.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_redelivery_counts_readers_and_resuming_from_the_cursor() {
    let zk = zk().await;
    let _bookies = start_bookies(&zk.connect_string(), 3).await;
    let env = env(&zk).await;
    let ml = open(&env, "t/ns/redeliver").await;
    let positions = append(&ml, 10, 1).await;

    // Permits: 3 permits, 3 deliveries, nothing more.
    let sub = durable(&ml, "s").await;
    let mut rx = attach(&sub, 1, "c", SubType::Shared).unwrap();
    assert_no_more(&ml, &sub, cid(1), &mut rx).await;
    sub.flow(cid(1), 3).unwrap();
    let got = messages(&mut rx, 3).await;
    assert_eq!(
        got,
        positions[..3].iter().map(|p| (*p, 0)).collect::<Vec<_>>()
    );
    assert_no_more(&ml, &sub, cid(1), &mut rx).await;

    // Negative acks: the count rises each time, redelivery comes first.
    for round in 1..=2u32 {
        sub.redeliver(cid(1), Some(vec![positions[1]])).unwrap();
        sub.flow(cid(1), 1).unwrap();
        assert_eq!(messages(&mut rx, 1).await, vec![(positions[1], round)]);
    }
    sub.ack_individual(cid(1), &positions[..3], Persist::Wait)
        .await
        .unwrap();
    assert_eq!(sub.stats().dispatcher.redelivery_counts, 0);

    // Seek back to the start: everything again, counts reset.
    sub.seek(SeekTarget::Earliest).await.unwrap();
    sub.flow(cid(1), 100).unwrap();
    let got = messages(&mut rx, 10).await;
    assert_eq!(got, positions.iter().map(|p| (*p, 0)).collect::<Vec<_>>());
    // Ack 0..=4 and 7; leave the rest unacked and close (a crash-free stop).
    sub.ack_individual(cid(1), &positions[..5], Persist::Wait)
        .await
        .unwrap();
    sub.ack_individual(cid(1), &[positions[7]], Persist::Wait)
        .await
        .unwrap();
    sub.close().await.unwrap();
    assert_eq!(sub.flow(cid(1), 1), Err(SubError::Closed("s".to_string())));

    // Batches: an entry of 5 messages takes 5 permits; 6 permits let two
    // such entries through (the second one drives them negative), no third.
    let batch_ml = open(&env, "t/ns/batches").await;
    let batches = append(&batch_ml, 4, 5).await;
    let bsub = durable(&batch_ml, "b").await;
    let mut brx = attach(&bsub, 1, "c", SubType::Exclusive).unwrap();
    bsub.flow(cid(1), 6).unwrap();
    assert_eq!(
        messages(&mut brx, 2).await,
        vec![(batches[0], 0), (batches[1], 0)]
    );
    assert_no_more(&batch_ml, &bsub, cid(1), &mut brx).await;
    assert_eq!(bsub.stats().dispatcher.consumers[0].permits, -4);
    assert_eq!(bsub.stats().dispatcher.unacked_messages, 10);
    // Exclusive redelivery without ids rewinds: both again, count 1.
    bsub.redeliver(cid(1), None).unwrap();
    bsub.flow(cid(1), 10).unwrap();
    assert_eq!(
        messages(&mut brx, 2).await,
        vec![(batches[0], 1), (batches[1], 1)]
    );
    bsub.close().await.unwrap();

    // Readers (non-durable): from an exact position, and tailing new entries.
    let reader = Subscription::open_non_durable(
        &ml,
        "reader-1",
        StartPosition::At(positions[6]),
        counter(),
        SubscriptionConfig::default(),
    )
    .await
    .unwrap();
    let mut rrx = attach(&reader, 1, "r", SubType::Exclusive).unwrap();
    reader.flow(cid(1), 100).unwrap();
    let got: Vec<Position> = messages(&mut rrx, 4)
        .await
        .into_iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(got, positions[6..].to_vec());
    let tail = ml.append(entry(99, 1)).await.unwrap();
    assert_eq!(messages(&mut rrx, 1).await, vec![(tail, 0)]);
    reader.close().await.unwrap();

    // The owner goes away; a new owner reopens the subscription from its
    // stored cursor: only the unacked entries come back.
    ml.close().await.unwrap();
    drop(ml);
    let ml = open(&env, "t/ns/redeliver").await;
    let sub = durable(&ml, "s").await;
    let mut rx = attach(&sub, 1, "c", SubType::Shared).unwrap();
    let mut rx2 = attach(&sub, 2, "c2", SubType::Shared).unwrap();
    sub.flow(cid(1), 100).unwrap();
    let got: Vec<Position> = messages(&mut rx, 5)
        .await
        .into_iter()
        .map(|m| m.0)
        .collect();
    let want = vec![positions[5], positions[6], positions[8], positions[9], tail];
    assert_eq!(got, want, "acked entries are not redelivered");
    assert_no_more(&ml, &sub, cid(1), &mut rx).await;
    assert_eq!(sub.stats().msg_backlog, 5);

    // Unsubscribe: refused while another consumer is attached, then the
    // cursor node is deleted.
    assert_eq!(
        sub.unsubscribe(Some(cid(1))).await,
        Err(SubError::OtherConsumersConnected {
            subscription: "s".to_string(),
            others: 1
        })
    );
    sub.remove_consumer(cid(2)).unwrap();
    assert!(rx2.try_recv().is_err());
    let store = &env.store;
    let node = "/cms/managed-ledgers/t/ns/persistent/redeliver/s";
    assert!(store.get(node).await.is_ok());
    sub.unsubscribe(Some(cid(1))).await.unwrap();
    assert!(store.get(node).await.is_err(), "cursor node deleted");
    ml.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_subscriptions_with_consumers_hold_entries_in_the_cache() {
    let zk = zk().await;
    let _bookies = start_bookies(&zk.connect_string(), 3).await;
    let env = env(&zk).await;
    let ml = open(&env, "t/ns/cache-holders").await;
    // A durable subscription nobody consumes from (Pulsar: an inactive
    // cursor) does not keep what is published in the broker's cache.
    let sub = durable(&ml, "idle").await;
    append(&ml, 5, 1).await;
    assert_eq!(env.cache.len(), 0, "no consumer");
    // A consumer attached (no permits yet, so nothing is read): the new
    // entries wait in the cache for it.
    let _rx = attach(&sub, 1, "c1", SubType::Shared).unwrap();
    append(&ml, 5, 1).await;
    assert_eq!(env.cache.len(), 5, "a consumer attached");
    // The consumer leaves: the cache lets go, and keeps nothing more.
    sub.remove_consumer(cid(1)).unwrap();
    assert_eq!(env.cache.len(), 0, "the consumer left");
    append(&ml, 3, 1).await;
    assert_eq!(env.cache.len(), 0, "no consumer again");
    sub.close().await.unwrap();
    ml.close().await.unwrap();
}

/// Entries read while the subscription was Shared carry no key hash (only
/// Key_Shared routes by key, so the read loop skips it): once the consumers
/// leave and Key_Shared consumers come, the unacknowledged entries are read
/// again and routed by their keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_read_for_shared_go_by_key_once_the_subscription_turns_key_shared() {
    let zk = zk().await;
    let _bookies = start_bookies(&zk.connect_string(), 3).await;
    let env = env(&zk).await;
    let ml = open(&env, "t/ns/turns-key-shared").await;
    // Entry i: one message of key i % 8 (its second byte). Key k hashes to
    // k * 8192 + 100, so AUTO_SPLIT's two halves get keys 0-3 and 4-7.
    let mut pending = Vec::new();
    for i in 0..40u8 {
        let mut e = vec![1, i % 8];
        e.extend_from_slice(format!("entry {i:04}").as_bytes());
        pending.push(ml.append_pipelined(e).await.unwrap());
    }
    let mut positions = BTreeSet::new();
    for p in pending {
        positions.insert(p.wait().await.unwrap());
    }
    let config = SubscriptionConfig {
        key_hasher: KeyHasher(Arc::new(|b: &[u8]| {
            u16::from(b.get(1).copied().unwrap_or(0)) * 8192 + 100
        })),
        ..SubscriptionConfig::default()
    };
    let sub =
        Subscription::open_durable(&ml, "turns", InitialPosition::Earliest, counter(), config)
            .await
            .unwrap();

    // A Shared consumer gets everything and acknowledges nothing, then leaves.
    let mut s1 = attach(&sub, 1, "s1", SubType::Shared).unwrap();
    sub.flow(cid(1), 100).unwrap();
    let first: BTreeSet<Position> = messages(&mut s1, 40)
        .await
        .into_iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(first, positions);
    sub.remove_consumer(cid(1)).unwrap();

    // Two Key_Shared consumers (STICKY, half the hash range each): every
    // entry again, each key to the consumer of its hash.
    let sticky = |i: u64, name: &str, start: u16, end: u16| {
        let (tx, rx) = mpsc::channel(1_000);
        sub.add_consumer(ConsumerSpec {
            id: cid(i),
            name: name.to_string(),
            priority: 0,
            sub_type: SubType::KeyShared,
            key_shared: Some(KeySharedSpec {
                mode: KeySharedMode::Sticky,
                ranges: vec![HashRange { start, end }],
                allow_out_of_order: false,
            }),
            sink: tx,
        })
        .unwrap();
        rx
    };
    let mut k1 = sticky(2, "k1", 0, 32_767);
    let mut k2 = sticky(3, "k2", 32_768, 65_535);
    sub.flow(cid(2), 100).unwrap();
    sub.flow(cid(3), 100).unwrap();
    let mut again = BTreeSet::new();
    while again.len() < positions.len() {
        let d = tokio::select! {
            d = next(&mut k1) => d,
            d = next(&mut k2) => d,
        };
        let Delivery::Message {
            consumer_id,
            position,
            entry,
            ..
        } = d
        else {
            continue;
        };
        let key = entry[1];
        let want = if key < 4 { cid(2) } else { cid(3) };
        assert_eq!(consumer_id, want, "key {key} at the wrong consumer");
        assert!(again.insert(position), "{position:?} twice");
    }
    assert_eq!(again, positions);
}
