//! Key_Shared selection (issue 8 item 1): the sticky key hash of an entry
//! and which consumer owns each hash, as pure functions and a selector.
//!
//! - **Hash.** Pulsar's `StickyKeyConsumerSelector.makeStickyKeyHash`:
//!   Murmur3 x86 32-bit (seed 0) of the sticky key, masked to a
//!   non-negative `i32`, modulo [`HASH_RANGE`] (65536). The sticky key is
//!   the message's `ordering_key` if present, else its `partition_key`
//!   (base64-decoded when `partition_key_b64_encoded`), else the constant
//!   [`NONE_KEY`] (`"NONE_KEY"`, as `Commands.peekStickyKey`): messages
//!   without a key all share one hash. A batch is one entry: its
//!   metadata's key applies to every message in it (Pulsar's key-based
//!   batching puts one key per batch).
//! - **AUTO_SPLIT** (the default mode) is Pulsar 4's default selector,
//!   `ConsistentHashingStickyKeyConsumerSelector`: every consumer puts
//!   [`RING_POINTS_PER_CONSUMER`] (100) points on a ring over the hash range,
//!   at the hash of `"<name><sep><name index><sep><i>"` (the name index tells
//!   apart consumers sharing a name), and a hash belongs to the consumer of
//!   the first point at or after it (wrapping). Points are derived from the
//!   consumer name, so a consumer that reconnects gets its hashes back, and a
//!   join or leave moves only the hashes next to that consumer's points.
//!   Colliding points keep the consumer that joined first.
//! - **STICKY**: each consumer declares inclusive ranges within
//!   `0..=65535`; a range that is malformed or overlaps another attached
//!   consumer's ranges is refused ([`KeySharedError`]); a hash no range covers
//!   has no consumer (its entries wait).
//!
//! Promises: no I/O; selection is a function of the attached consumers'
//! names and ranges only (deterministic, no randomness).

use std::collections::BTreeMap;

use super::types::ConsumerId;

/// Size of the sticky key hash range: hashes are `0..HASH_RANGE`.
pub const HASH_RANGE: u32 = 65_536;

/// Ring points per consumer in AUTO_SPLIT mode (Pulsar
/// `subscriptionKeySharedConsistentHashingReplicaPoints=100`).
pub const RING_POINTS_PER_CONSUMER: u32 = 100;

/// The sticky key of a message without ordering or partition key.
pub const NONE_KEY: &[u8] = b"NONE_KEY";

/// Ranges one STICKY consumer may declare.
pub const STICKY_RANGES_MAX: usize = 1_024;

/// Murmur3 x86 32-bit hash (Guava's `murmur3_32`, Pulsar's `Murmur3_32Hash`),
/// shared with the SDK's key routing so broker and client hash keys alike.
pub use cms_client::sdk::routing::murmur3_32;

/// The sticky key hash of `key`, in `0..HASH_RANGE`.
pub fn sticky_key_hash(key: &[u8]) -> u16 {
    let h = murmur3_32(key, 0) & 0x7fff_ffff;
    // Fits: HASH_RANGE is 2^16.
    (h % HASH_RANGE) as u16
}

/// The sticky key of a message: its ordering key, else its partition key
/// (base64-decoded when flagged and valid), else [`NONE_KEY`].
pub fn sticky_key<'a>(
    ordering_key: Option<&'a [u8]>,
    partition_key: Option<&'a str>,
    partition_key_b64: bool,
) -> std::borrow::Cow<'a, [u8]> {
    use std::borrow::Cow;
    if let Some(k) = ordering_key {
        return Cow::Borrowed(k);
    }
    match partition_key {
        Some(k) if partition_key_b64 => {
            base64_decode(k).map_or(Cow::Borrowed(k.as_bytes()), Cow::Owned)
        }
        Some(k) => Cow::Borrowed(k.as_bytes()),
        None => Cow::Borrowed(NONE_KEY),
    }
}

/// Standard base64 (with or without padding); `None` if malformed.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim_end_matches('=').as_bytes();
    if s.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= val(*c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// Key_Shared mode (Pulsar `KeySharedMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KeySharedMode {
    /// Hashes split across consumers by consistent hashing.
    #[default]
    AutoSplit,
    /// Consumers declare their hash ranges.
    Sticky,
}

impl std::fmt::Display for KeySharedMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::AutoSplit => "AUTO_SPLIT",
            Self::Sticky => "STICKY",
        })
    }
}

/// An inclusive hash range `start..=end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HashRange {
    /// First hash.
    pub start: u16,
    /// Last hash (inclusive).
    pub end: u16,
}

impl std::fmt::Display for HashRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}, {}]", self.start, self.end)
    }
}

/// A Key_Shared consumer's settings (Pulsar `KeySharedMeta`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeySharedSpec {
    /// The mode; every consumer of a subscription must use the same.
    pub mode: KeySharedMode,
    /// STICKY: the hash ranges this consumer takes (validated).
    pub ranges: Vec<HashRange>,
    /// Deliver without waiting for a previous owner's unacked messages of a
    /// hash (no draining); every consumer must agree.
    pub allow_out_of_order: bool,
}

/// Why a Key_Shared consumer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySharedError {
    /// A declared range is malformed (Pulsar answers ConsumerAssignError).
    #[error("invalid hash range [{start}, {end}]: need 0 <= start <= end < 65536")]
    InvalidRange {
        /// Declared start.
        start: i64,
        /// Declared end.
        end: i64,
    },
    /// STICKY without ranges, or too many.
    #[error("a STICKY Key_Shared consumer must declare between 1 and {max} hash ranges, got {got}")]
    RangeCount {
        /// Ranges declared.
        got: usize,
        /// The limit.
        max: usize,
    },
    /// Two declared ranges overlap (within one consumer or with another).
    #[error("Range conflict with consumer {other}: {range} overlaps {existing}")]
    RangeConflict {
        /// The consumer already holding `existing` (or the same consumer).
        other: ConsumerId,
        /// The requested range.
        range: HashRange,
        /// The range it overlaps.
        existing: HashRange,
    },
    /// The subscription's consumers use another mode or ordering setting.
    #[error(
        "Key_Shared settings mismatch: the subscription uses {current}, {requested} was asked for"
    )]
    ModeMismatch {
        /// The attached consumers' setting.
        current: String,
        /// The asked-for setting.
        requested: String,
    },
}

/// Validates client-declared ranges (`(start, end)` inclusive) into sorted
/// [`HashRange`]s; overlaps within the list are refused too.
pub fn validate_ranges(
    id: ConsumerId,
    declared: &[(i64, i64)],
) -> Result<Vec<HashRange>, KeySharedError> {
    if declared.is_empty() || declared.len() > STICKY_RANGES_MAX {
        return Err(KeySharedError::RangeCount {
            got: declared.len(),
            max: STICKY_RANGES_MAX,
        });
    }
    let mut out = Vec::with_capacity(declared.len());
    for &(start, end) in declared {
        let ok = 0 <= start && start <= end && end < i64::from(HASH_RANGE);
        if !ok {
            return Err(KeySharedError::InvalidRange { start, end });
        }
        out.push(HashRange {
            start: start as u16,
            end: end as u16,
        });
    }
    out.sort();
    for w in out.windows(2) {
        if w[1].start <= w[0].end {
            return Err(KeySharedError::RangeConflict {
                other: id,
                range: w[1],
                existing: w[0],
            });
        }
    }
    Ok(out)
}

#[derive(Debug, Clone)]
struct Member {
    id: ConsumerId,
    name: String,
    name_index: u32,
    ranges: Vec<HashRange>,
}

/// Which consumer owns each hash.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    mode: KeySharedMode,
    allow_out_of_order: bool,
    /// Join order.
    members: Vec<Member>,
    /// AUTO_SPLIT: point -> consumers there, in join order.
    ring: BTreeMap<u16, Vec<ConsumerId>>,
    /// STICKY: range start -> (range, owner).
    ranges: BTreeMap<u16, (HashRange, ConsumerId)>,
}

impl Selector {
    /// An empty selector.
    pub fn new() -> Self {
        Self::default()
    }

    /// The mode of the attached consumers.
    pub fn mode(&self) -> KeySharedMode {
        self.mode
    }

    /// Whether delivery may ignore a previous owner's unacked messages.
    pub fn allow_out_of_order(&self) -> bool {
        self.allow_out_of_order
    }

    /// No consumer attached.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    fn ring_point(name: &str, name_index: u32, i: u32) -> u16 {
        sticky_key_hash(format!("{name}\u{0}{name_index}\u{0}{i}").as_bytes())
    }

    /// Checks that `spec` may join (same mode and ordering setting as the
    /// attached consumers; STICKY ranges free), without changing anything.
    pub fn check(&self, id: ConsumerId, spec: &KeySharedSpec) -> Result<(), KeySharedError> {
        if !self.members.is_empty()
            && (self.mode != spec.mode || self.allow_out_of_order != spec.allow_out_of_order)
        {
            let show = |m: KeySharedMode, o: bool| format!("{m} (allowOutOfOrderDelivery={o})");
            return Err(KeySharedError::ModeMismatch {
                current: show(self.mode, self.allow_out_of_order),
                requested: show(spec.mode, spec.allow_out_of_order),
            });
        }
        if spec.mode == KeySharedMode::Sticky {
            if spec.ranges.is_empty() {
                return Err(KeySharedError::RangeCount {
                    got: 0,
                    max: STICKY_RANGES_MAX,
                });
            }
            for r in &spec.ranges {
                // The range starting at or before r.end with the greatest start.
                if let Some((_, (existing, owner))) = self.ranges.range(..=r.end).next_back()
                    && existing.end >= r.start
                {
                    return Err(KeySharedError::RangeConflict {
                        other: *owner,
                        range: *r,
                        existing: *existing,
                    });
                }
            }
            let _ = id;
        }
        Ok(())
    }

    /// Adds a consumer (after [`Self::check`]).
    pub fn add(
        &mut self,
        id: ConsumerId,
        name: &str,
        spec: &KeySharedSpec,
    ) -> Result<(), KeySharedError> {
        self.check(id, spec)?;
        if self.members.is_empty() {
            self.mode = spec.mode;
            self.allow_out_of_order = spec.allow_out_of_order;
        }
        let mut name_index = 0;
        while self
            .members
            .iter()
            .any(|m| m.name == name && m.name_index == name_index)
        {
            name_index += 1;
        }
        match spec.mode {
            KeySharedMode::AutoSplit => {
                for i in 0..RING_POINTS_PER_CONSUMER {
                    self.ring
                        .entry(Self::ring_point(name, name_index, i))
                        .or_default()
                        .push(id);
                }
            }
            KeySharedMode::Sticky => {
                for r in &spec.ranges {
                    self.ranges.insert(r.start, (*r, id));
                }
            }
        }
        self.members.push(Member {
            id,
            name: name.to_string(),
            name_index,
            ranges: spec.ranges.clone(),
        });
        Ok(())
    }

    /// Removes a consumer (unknown ids are ignored).
    pub fn remove(&mut self, id: ConsumerId) {
        let Some(i) = self.members.iter().position(|m| m.id == id) else {
            return;
        };
        let m = self.members.remove(i);
        match self.mode {
            KeySharedMode::AutoSplit => {
                for p in 0..RING_POINTS_PER_CONSUMER {
                    let point = Self::ring_point(&m.name, m.name_index, p);
                    if let Some(v) = self.ring.get_mut(&point) {
                        v.retain(|c| *c != id);
                        if v.is_empty() {
                            self.ring.remove(&point);
                        }
                    }
                }
            }
            KeySharedMode::Sticky => {
                for r in &m.ranges {
                    self.ranges.remove(&r.start);
                }
            }
        }
    }

    /// The consumer owning `hash`, if any.
    pub fn select(&self, hash: u16) -> Option<ConsumerId> {
        match self.mode {
            KeySharedMode::AutoSplit => self
                .ring
                .range(hash..)
                .next()
                .or_else(|| self.ring.iter().next())
                .and_then(|(_, v)| v.first().copied()),
            KeySharedMode::Sticky => self
                .ranges
                .range(..=hash)
                .next_back()
                .filter(|(_, (r, _))| r.end >= hash)
                .map(|(_, (_, c))| *c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn cid(i: u64) -> ConsumerId {
        ConsumerId::new(1, i)
    }

    #[test]
    fn murmur3_matches_reference_vectors() {
        // Reference values of MurmurHash3_x86_32 (Guava murmur3_32, seed 0
        // unless given).
        let cases: &[(&[u8], u32, u32)] = &[
            (b"", 0, 0),
            (b"", 1, 0x514e_28b7),
            (b"", 0xffff_ffff, 0x81f1_6f39),
            (b"\0\0\0\0", 0, 0x2362_f9de),
            (b"aaaa", 0x9747_b28c, 0x5a97_808a),
            (b"abc", 0, 0xb3dd_93fa),
            (b"Hello, world!", 0x9747_b28c, 0x2488_4cba),
            (
                b"The quick brown fox jumps over the lazy dog",
                0,
                0x2e4f_f723,
            ),
        ];
        for (data, seed, want) in cases {
            assert_eq!(murmur3_32(data, *seed), *want, "{data:?} seed {seed:#x}");
        }
    }

    #[test]
    fn sticky_key_prefers_ordering_then_partition_key() {
        assert_eq!(&*sticky_key(Some(b"o"), Some("p"), false), b"o");
        assert_eq!(&*sticky_key(None, Some("p"), false), b"p");
        assert_eq!(&*sticky_key(None, Some("aGVsbG8="), true), b"hello");
        assert_eq!(&*sticky_key(None, Some("aGVsbG8"), true), b"hello");
        assert_eq!(&*sticky_key(None, None, false), NONE_KEY);
        // Not base64: the raw string.
        assert_eq!(&*sticky_key(None, Some("*"), true), b"*");
        assert!(u32::from(sticky_key_hash(b"anything")) < HASH_RANGE);
    }

    fn auto(n: u64) -> Selector {
        let mut s = Selector::new();
        for i in 0..n {
            s.add(cid(i), &format!("consumer-{i}"), &KeySharedSpec::default())
                .unwrap_or_else(|e| panic!("{e}"));
        }
        s
    }

    #[test]
    fn auto_split_spreads_keys_over_every_consumer() {
        let s = auto(3);
        let mut counts = BTreeMap::new();
        for k in 0..3_000 {
            let c = s
                .select(sticky_key_hash(format!("key-{k}").as_bytes()))
                .unwrap_or_else(|| panic!("no consumer"));
            *counts.entry(c).or_insert(0u32) += 1;
        }
        assert_eq!(counts.len(), 3, "{counts:?}");
        for (c, n) in &counts {
            // Consistent hashing with 100 points: each gets a fair share.
            assert!((500..=1_500).contains(n), "{c}: {n} of 3000 ({counts:?})");
        }
    }

    #[test]
    fn a_join_moves_hashes_only_to_the_newcomer_and_a_leave_gives_them_back() {
        let mut rng = StdRng::seed_from_u64(8);
        let hashes: Vec<u16> = (0..2_000).map(|_| rng.random::<u16>()).collect();
        let mut s = auto(3);
        let before: Vec<_> = hashes.iter().map(|h| s.select(*h)).collect();
        s.add(cid(9), "late", &KeySharedSpec::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let during: Vec<_> = hashes.iter().map(|h| s.select(*h)).collect();
        let mut moved = 0;
        for (b, d) in before.iter().zip(&during) {
            if b != d {
                assert_eq!(*d, Some(cid(9)), "a hash moved between old consumers");
                moved += 1;
            }
        }
        assert!(moved > 200, "the newcomer took only {moved} of 2000");
        s.remove(cid(9));
        let after: Vec<_> = hashes.iter().map(|h| s.select(*h)).collect();
        assert_eq!(before, after);
        // Same name, new id: the same hashes (sticky across reconnects).
        s.remove(cid(1));
        s.add(cid(7), "consumer-1", &KeySharedSpec::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let again: Vec<_> = hashes
            .iter()
            .map(|h| s.select(*h).map(|c| if c == cid(7) { cid(1) } else { c }))
            .collect();
        assert_eq!(before, again);
    }

    #[test]
    fn sticky_ranges_select_and_refuse_overlaps() {
        let spec = |r: &[(i64, i64)]| KeySharedSpec {
            mode: KeySharedMode::Sticky,
            ranges: validate_ranges(cid(0), r).unwrap_or_else(|e| panic!("{e}")),
            allow_out_of_order: false,
        };
        let mut s = Selector::new();
        s.add(cid(1), "a", &spec(&[(0, 99), (200, 299)]))
            .unwrap_or_else(|e| panic!("{e}"));
        s.add(cid(2), "b", &spec(&[(100, 199)]))
            .unwrap_or_else(|e| panic!("{e}"));
        for (h, want) in [
            (0, Some(1)),
            (99, Some(1)),
            (100, Some(2)),
            (199, Some(2)),
            (250, Some(1)),
            (300, None),
            (65_535, None),
        ] {
            assert_eq!(s.select(h), want.map(cid), "hash {h}");
        }
        for bad in [&[(50, 150)][..], &[(299, 400)], &[(0, 0)], &[(150, 150)]] {
            let e = s.add(cid(3), "c", &spec(bad));
            assert!(
                matches!(e, Err(KeySharedError::RangeConflict { .. })),
                "{bad:?}: {e:?}"
            );
        }
        s.add(cid(3), "c", &spec(&[(300, 65_535)]))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.select(65_535), Some(cid(3)));
        s.remove(cid(2));
        assert_eq!(s.select(150), None);
        // Another mode or ordering setting is refused.
        assert!(matches!(
            s.add(cid(4), "d", &KeySharedSpec::default()),
            Err(KeySharedError::ModeMismatch { .. })
        ));
    }

    #[test]
    fn declared_ranges_are_validated() {
        for bad in [
            &[][..],
            &[(-1, 5)],
            &[(5, 4)],
            &[(0, 65_536)],
            &[(0, 10), (10, 20)],
            &[(30, 40), (0, 35)],
        ] {
            assert!(validate_ranges(cid(1), bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            validate_ranges(cid(1), &[(10, 20), (0, 9)]).unwrap_or_default(),
            vec![
                HashRange { start: 0, end: 9 },
                HashRange { start: 10, end: 20 }
            ]
        );
        let e = KeySharedError::RangeConflict {
            other: cid(2),
            range: HashRange { start: 1, end: 2 },
            existing: HashRange { start: 0, end: 5 },
        };
        assert!(
            e.to_string()
                .starts_with("Range conflict with consumer 1/2")
        );
    }
}
