//! Messages and message ids as the application sees them, and the batch
//! format: a batch payload is `[u32 size ‖ SingleMessageMetadata ‖ payload]*`
//! (Pulsar's exact layout), possibly compressed as a whole. Decoding checks
//! every size against the bytes present: bad input is an error, not a panic.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};

use super::compression;
use super::error::{Error, Result};
use crate::proto::batch::{BatchedMessage, encode_batched, parse_batch};
use crate::proto::pulsar::{
    CompressionType, KeyValue, MessageIdData, MessageMetadata, SingleMessageMetadata,
};

/// Where a message lives: ledger, entry, and its index within a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId {
    /// Ledger id.
    pub ledger_id: u64,
    /// Entry id within the ledger.
    pub entry_id: u64,
    /// Partition index, -1 for a non-partitioned topic.
    pub partition: i32,
    /// Index in the batch, -1 if the entry is not a batch.
    pub batch_index: i32,
    /// Messages in the batch (0 if not a batch).
    pub batch_size: i32,
    /// Which inner subscription of a consumer delivered it (multi-topic,
    /// partitioned and pattern consumers route acks by it). Not part of the
    /// id's identity: ignored by `==`, hashing and ordering.
    pub(crate) route: Route,
}

/// A consumer's inner subscription: its slot and its consumer id (the id
/// tells a reused slot's new subscription from the old one). `consumer == 0`:
/// unknown (an id from a producer receipt or a constant).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Route {
    pub(crate) slot: u32,
    pub(crate) consumer: u64,
}

impl Route {
    pub(crate) const NONE: Route = Route {
        slot: 0,
        consumer: 0,
    };
}

impl PartialEq for Route {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Route {}
impl std::hash::Hash for Route {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}
impl PartialOrd for Route {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Route {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl MessageId {
    /// The earliest position of a topic.
    pub const EARLIEST: MessageId = MessageId {
        ledger_id: u64::MAX,
        entry_id: u64::MAX,
        partition: -1,
        batch_index: -1,
        batch_size: 0,
        route: Route::NONE,
    };

    /// The position after the last message of a topic.
    pub const LATEST: MessageId = MessageId {
        ledger_id: i64::MAX as u64,
        entry_id: i64::MAX as u64,
        partition: -1,
        batch_index: -1,
        batch_size: 0,
        route: Route::NONE,
    };

    pub(crate) fn from_data(d: &MessageIdData, batch_index: i32, batch_size: i32) -> Self {
        MessageId {
            ledger_id: d.ledger_id,
            entry_id: d.entry_id,
            partition: d.partition.unwrap_or(-1),
            batch_index,
            batch_size,
            route: Route::NONE,
        }
    }

    /// The wire form (entry level: batch index omitted).
    pub(crate) fn to_data(self) -> MessageIdData {
        MessageIdData {
            ledger_id: self.ledger_id,
            entry_id: self.entry_id,
            partition: (self.partition >= 0).then_some(self.partition),
            ..Default::default()
        }
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.ledger_id, self.entry_id, self.partition, self.batch_index
        )
    }
}

/// A message to publish. Build with [`ProducerMessage::new`] and the setters.
#[derive(Debug, Clone, Default)]
pub struct ProducerMessage {
    /// The payload.
    pub payload: Bytes,
    /// Partition key (routing, Key_Shared).
    pub key: Option<String>,
    /// User properties.
    pub properties: BTreeMap<String, String>,
    /// Event time, milliseconds since the epoch.
    pub event_time: Option<u64>,
    /// Absolute delivery time, milliseconds since the epoch (Shared subscriptions).
    pub deliver_at: Option<i64>,
}

impl ProducerMessage {
    /// A message with this payload.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        ProducerMessage {
            payload: payload.into(),
            ..Default::default()
        }
    }
    /// Sets the partition key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
    /// Adds a property.
    pub fn property(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.properties.insert(k.into(), v.into());
        self
    }
    /// Sets the event time (milliseconds since the epoch).
    pub fn event_time(mut self, ms: u64) -> Self {
        self.event_time = Some(ms);
        self
    }
    /// Delivers no earlier than `at`.
    pub fn deliver_at(mut self, at: SystemTime) -> Self {
        self.deliver_at = Some(millis(at) as i64);
        self
    }
    /// Delivers no earlier than `after` from now.
    pub fn deliver_after(self, after: Duration) -> Self {
        self.deliver_at(SystemTime::now() + after)
    }
}

impl ProducerMessage {
    /// A message whose payload is `value` as JSON (no schema is registered
    /// with the broker).
    pub fn json<T: serde::Serialize>(value: &T) -> Result<Self> {
        serde_json::to_vec(value)
            .map(ProducerMessage::new)
            .map_err(|e| Error::Payload(format!("JSON encoding: {e}")))
    }
}

impl Message {
    /// The payload as UTF-8 text.
    pub fn text(&self) -> Result<&str> {
        std::str::from_utf8(&self.payload).map_err(|e| Error::Payload(format!("not UTF-8: {e}")))
    }

    /// The payload decoded from JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.payload)
            .map_err(|e| Error::Payload(format!("JSON decoding: {e}")))
    }
}

impl From<Vec<u8>> for ProducerMessage {
    fn from(v: Vec<u8>) -> Self {
        ProducerMessage::new(v)
    }
}
impl From<&str> for ProducerMessage {
    fn from(v: &str) -> Self {
        ProducerMessage::new(Bytes::copy_from_slice(v.as_bytes()))
    }
}
impl From<String> for ProducerMessage {
    fn from(v: String) -> Self {
        ProducerMessage::new(v.into_bytes())
    }
}

/// A received message.
#[derive(Debug, Clone)]
pub struct Message {
    /// Its id (acknowledge with it).
    pub id: MessageId,
    /// The topic it came from.
    pub topic: String,
    /// The payload (decompressed, unbatched).
    pub payload: Bytes,
    /// Partition key.
    pub key: Option<String>,
    /// User properties.
    pub properties: BTreeMap<String, String>,
    /// Event time (ms since the epoch) if the producer set one.
    pub event_time: Option<u64>,
    /// Publish time, ms since the epoch.
    pub publish_time: u64,
    /// The producer's name.
    pub producer_name: String,
    /// The producer's sequence id for this message.
    pub sequence_id: u64,
    /// How many times the broker delivered this message before.
    pub redelivery_count: u32,
}

/// Milliseconds since the epoch.
pub(crate) fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn kv(props: &BTreeMap<String, String>) -> Vec<KeyValue> {
    props
        .iter()
        .map(|(k, v)| KeyValue {
            key: k.clone(),
            value: v.clone(),
        })
        .collect()
}

fn props(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect()
}

/// `data` compressed with `kind`; without compression, `data` itself (no
/// copy: the entry is built from it once).
fn compressed(kind: CompressionType, data: Bytes) -> Result<Bytes> {
    if kind == CompressionType::None {
        return Ok(data);
    }
    compression::compress(kind, &data).map(Bytes::from)
}

/// Metadata and payload of one message sent alone (not batched).
pub(crate) fn single_entry_parts(
    msg: &ProducerMessage,
    producer_name: &str,
    sequence_id: u64,
    compression: CompressionType,
) -> Result<(MessageMetadata, Bytes)> {
    let payload = compressed(compression, msg.payload.clone())?;
    let meta = MessageMetadata {
        producer_name: producer_name.to_owned(),
        sequence_id,
        publish_time: millis(SystemTime::now()),
        properties: kv(&msg.properties),
        partition_key: msg.key.clone(),
        compression: (compression != CompressionType::None).then_some(compression as i32),
        uncompressed_size: Some(msg.payload.len() as u32),
        event_time: msg.event_time,
        deliver_at_time: msg.deliver_at,
        ..Default::default()
    };
    Ok((meta, payload))
}

/// Metadata and payload of a batch of messages with consecutive sequence ids
/// starting at `first_sequence_id`.
pub(crate) fn batch_entry_parts(
    msgs: &[&ProducerMessage],
    producer_name: &str,
    first_sequence_id: u64,
    compression: CompressionType,
) -> Result<(MessageMetadata, Bytes)> {
    let mut raw = BytesMut::new();
    for (i, m) in msgs.iter().enumerate() {
        let smm = SingleMessageMetadata {
            properties: kv(&m.properties),
            partition_key: m.key.clone(),
            event_time: m.event_time,
            sequence_id: Some(first_sequence_id + i as u64),
            ..Default::default()
        };
        encode_batched(&mut raw, &smm, &m.payload);
    }
    let uncompressed_size = raw.len() as u32;
    let payload = compressed(compression, raw.freeze())?;
    let last = first_sequence_id + msgs.len().saturating_sub(1) as u64;
    let meta = MessageMetadata {
        producer_name: producer_name.to_owned(),
        sequence_id: first_sequence_id,
        publish_time: millis(SystemTime::now()),
        compression: (compression != CompressionType::None).then_some(compression as i32),
        uncompressed_size: Some(uncompressed_size),
        num_messages_in_batch: Some(msgs.len() as i32),
        highest_sequence_id: Some(last),
        deliver_at_time: msgs.first().and_then(|m| m.deliver_at),
        ..Default::default()
    };
    Ok((meta, payload))
}

/// Splits a received entry's payload into messages: decompresses it and
/// unpacks a batch. `id` is the entry's id from the MESSAGE command. An
/// uncompressed payload is shared, not copied (the messages' payloads are
/// slices of it).
pub(crate) fn unpack(
    topic: &str,
    id: &MessageIdData,
    meta: &MessageMetadata,
    payload: Bytes,
    redelivery_count: u32,
) -> Result<Vec<Message>> {
    let kind = CompressionType::try_from(meta.compression.unwrap_or(0))
        .map_err(|_| Error::Payload(format!("unknown compression {:?}", meta.compression)))?;
    let data = if kind == CompressionType::None {
        payload
    } else {
        Bytes::from(compression::decompress(
            kind,
            &payload,
            meta.uncompressed_size.unwrap_or(0) as usize,
        )?)
    };
    let Some(n) = meta.num_messages_in_batch else {
        return Ok(vec![Message {
            id: MessageId::from_data(id, -1, 0),
            topic: topic.to_owned(),
            payload: data,
            key: meta.partition_key.clone(),
            properties: props(&meta.properties),
            event_time: meta.event_time.filter(|t| *t > 0),
            publish_time: meta.publish_time,
            producer_name: meta.producer_name.clone(),
            sequence_id: meta.sequence_id,
            redelivery_count,
        }]);
    };
    let batch = parse_batch(data, n).map_err(|e| Error::Payload(e.to_string()))?;
    let n = batch.len() as i32;
    let out = batch
        .into_iter()
        .enumerate()
        .map(
            |(
                i,
                BatchedMessage {
                    metadata: smm,
                    payload,
                },
            )| Message {
                id: MessageId::from_data(id, i as i32, n),
                topic: topic.to_owned(),
                payload,
                key: smm.partition_key.clone(),
                properties: props(&smm.properties),
                event_time: smm.event_time.filter(|t| *t > 0),
                publish_time: meta.publish_time,
                producer_name: meta.producer_name.clone(),
                sequence_id: smm.sequence_id.unwrap_or(meta.sequence_id + i as u64),
                redelivery_count,
            },
        )
        .collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_is_not_part_of_an_ids_identity() {
        use std::collections::HashSet;
        let a = MessageId::from_data(&id(), 2, 5);
        let mut b = a;
        b.route = Route {
            slot: 3,
            consumer: 42,
        };
        assert_eq!(a, b);
        assert_eq!(a.cmp(&b), std::cmp::Ordering::Equal);
        let set: HashSet<MessageId> = [a, b].into_iter().collect();
        assert_eq!(set.len(), 1);
        let mut c = b;
        c.batch_index = 3;
        assert!(c > a, "the rest of the id still orders");
    }

    fn id() -> MessageIdData {
        MessageIdData {
            ledger_id: 7,
            entry_id: 9,
            ..Default::default()
        }
    }

    #[test]
    fn batch_round_trips_with_every_compression() {
        let msgs: Vec<ProducerMessage> = (0..5)
            .map(|i| {
                ProducerMessage::new(format!("m{i}").repeat(i + 1))
                    .key(format!("k{i}"))
                    .property("i", i.to_string())
                    .event_time(1000 + i as u64)
            })
            .collect();
        let refs: Vec<&ProducerMessage> = msgs.iter().collect();
        for kind in [
            CompressionType::None,
            CompressionType::Lz4,
            CompressionType::Zlib,
            CompressionType::Zstd,
            CompressionType::Snappy,
        ] {
            let (meta, payload) = batch_entry_parts(&refs, "p", 100, kind).unwrap();
            assert_eq!(meta.num_messages_in_batch, Some(5));
            assert_eq!(meta.highest_sequence_id, Some(104));
            let got = unpack("t", &id(), &meta, payload.clone(), 2).unwrap();
            assert_eq!(got.len(), 5);
            for (i, m) in got.iter().enumerate() {
                assert_eq!(m.payload, msgs[i].payload, "{kind:?}");
                assert_eq!(m.key.as_deref(), Some(format!("k{i}").as_str()));
                assert_eq!(m.properties.get("i"), Some(&i.to_string()));
                assert_eq!(m.event_time, Some(1000 + i as u64));
                assert_eq!(m.sequence_id, 100 + i as u64);
                assert_eq!(m.redelivery_count, 2);
                assert_eq!(
                    (m.id.batch_index, m.id.batch_size, m.id.entry_id),
                    (i as i32, 5, 9)
                );
            }
        }
    }

    #[test]
    fn single_message_round_trips() {
        let m = ProducerMessage::new("hello")
            .key("k")
            .deliver_at(UNIX_EPOCH + Duration::from_secs(5));
        let (meta, payload) = single_entry_parts(&m, "p", 3, CompressionType::Zstd).unwrap();
        assert_eq!(meta.deliver_at_time, Some(5000));
        let got = unpack("t", &id(), &meta, payload.clone(), 0).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(&got[0].payload[..], b"hello");
        assert_eq!(got[0].id.batch_index, -1);
    }

    #[test]
    fn an_uncompressed_payload_is_shared_not_copied() {
        let m = ProducerMessage::new(vec![7u8; 1024]);
        let (meta, payload) = single_entry_parts(&m, "p", 0, CompressionType::None).unwrap();
        assert_eq!(payload.as_ptr(), m.payload.as_ptr());
        let got = unpack("t", &id(), &meta, payload.clone(), 0).unwrap();
        assert_eq!(got[0].payload.as_ptr(), payload.as_ptr());
        let (meta, payload) = single_entry_parts(&m, "p", 0, CompressionType::Lz4).unwrap();
        let got = unpack("t", &id(), &meta, payload, 0).unwrap();
        assert_eq!(got[0].payload, m.payload);
    }

    #[test]
    fn json_and_text_helpers() {
        let m = ProducerMessage::json(&serde_json::json!({"a": 1, "b": "x"})).unwrap();
        let (meta, payload) = single_entry_parts(&m, "p", 0, CompressionType::None).unwrap();
        let got = unpack("t", &id(), &meta, payload.clone(), 0)
            .unwrap()
            .remove(0);
        let v: serde_json::Value = got.json().unwrap();
        assert_eq!(v["a"], 1);
        assert!(got.text().unwrap().contains("\"b\":\"x\""));
        let bad = ProducerMessage::new(vec![0xff, 0xfe]);
        let (meta, payload) = single_entry_parts(&bad, "p", 0, CompressionType::None).unwrap();
        let got = unpack("t", &id(), &meta, payload.clone(), 0)
            .unwrap()
            .remove(0);
        assert!(got.text().is_err());
        assert!(got.json::<serde_json::Value>().is_err());
    }

    #[test]
    fn truncated_batches_are_errors() {
        let m = ProducerMessage::new("hello");
        let (meta, payload) = batch_entry_parts(&[&m, &m], "p", 0, CompressionType::None).unwrap();
        for cut in 0..payload.len() {
            let mut meta = meta.clone();
            meta.uncompressed_size = Some(cut as u32);
            assert!(
                unpack("t", &id(), &meta, payload.slice(..cut), 0).is_err(),
                "cut {cut}"
            );
        }
        let mut meta2 = meta.clone();
        meta2.num_messages_in_batch = Some(-1);
        assert!(unpack("t", &id(), &meta2, payload.clone(), 0).is_err());
    }
}
