//! Namespace bundles (pure, no I/O): a namespace's 32-bit hash space
//! `0x00000000..=0xffffffff` split into contiguous ranges, and the mapping of
//! a topic to the bundle that holds it.
//!
//! Promises:
//! - [`Bundles::even`] splits the space into `n` ranges exactly as Pulsar's
//!   `NamespaceBundleFactory` does (boundaries `i * (2^32 / n)`, the last one
//!   `0xffffffff`), so 4 bundles are `0x00000000_0x40000000`,
//!   `0x40000000_0x80000000`, `0x80000000_0xc0000000`,
//!   `0xc0000000_0xffffffff`;
//! - boundaries given as Pulsar's policy strings (`"0x00000000"`, ...) are
//!   accepted only if they start at 0, end at `0xffffffff` and strictly
//!   increase ([`BundleError`] otherwise);
//! - every hash falls in exactly one range: ranges are `[lower, upper)`
//!   except the last, which includes `0xffffffff`;
//! - a topic's hash is the CRC-32 (IEEE, as Guava's `Hashing.crc32()`, the
//!   hash Pulsar's `NamespaceBundleFactory` uses by default) of its full
//!   name (`persistent://tenant/ns/topic`) in UTF-8. (The task sketch said
//!   Murmur3; Pulsar's bundle factory uses CRC-32 and Murmur3 only for
//!   Key_Shared, so we follow the bundle factory: the same topic lands in
//!   the same bundle range as on Apache Pulsar.)

use std::fmt;

/// Bundles of a namespace without a `bundles` policy.
pub const DEFAULT_BUNDLES: u32 = 4;
/// Most bundles a namespace may have (the namespace policy's bound; the
/// automatic split stops earlier, at its own configured maximum).
pub const BUNDLES_MAX: u32 = 1024;
/// The top of the hash space (inclusive).
pub const HASH_MAX: u32 = u32::MAX;

/// Why a bundle layout was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// Bundle count 0 or over [`BUNDLES_MAX`].
    #[error("bundle count {0} is out of range 1..={BUNDLES_MAX}")]
    Count(u64),
    /// A boundary is not `0x` + hex that fits in 32 bits.
    #[error("bundle boundary {0:?} is not a 32-bit hex number like \"0x40000000\"")]
    Boundary(String),
    /// Boundaries not from 0 to 0xffffffff, strictly increasing.
    #[error("bundle boundaries must start at 0x00000000, end at 0xffffffff and increase: {0}")]
    Order(String),
    /// A bundle name that is not `0x........_0x........`.
    #[error("bundle range {0:?} is not like \"0x00000000_0x40000000\"")]
    Range(String),
    /// The bundle is not one of the namespace's bundles (now).
    #[error("bundle {0} is not a bundle of the namespace (it may have been split already)")]
    NoSuchBundle(String),
    /// The bundle cannot be split further.
    #[error("bundle {0} cannot be split: {1}")]
    Unsplittable(String, String),
}

/// One bundle: hashes `lower..upper` (and `upper` itself when it is
/// `0xffffffff`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BundleRange {
    /// First hash of the bundle.
    pub lower: u32,
    /// End of the bundle (exclusive unless it is [`HASH_MAX`]).
    pub upper: u32,
}

impl BundleRange {
    /// Whether `hash` belongs to this bundle.
    pub fn contains(&self, hash: u32) -> bool {
        hash >= self.lower && (hash < self.upper || (self.upper == HASH_MAX && hash == HASH_MAX))
    }

    /// The two halves of this range (Pulsar's `range_equally_divide`): the
    /// split point is the middle of the range, rounded down. A range too
    /// narrow for a middle strictly inside it cannot be split.
    pub fn halves(&self) -> Result<(BundleRange, BundleRange), BundleError> {
        let mid = self.lower + ((u64::from(self.upper) - u64::from(self.lower)) / 2) as u32;
        if mid == self.lower {
            return Err(BundleError::Unsplittable(
                self.to_string(),
                "it is too narrow".into(),
            ));
        }
        Ok((
            BundleRange {
                lower: self.lower,
                upper: mid,
            },
            BundleRange {
                lower: mid,
                upper: self.upper,
            },
        ))
    }

    /// Parses Pulsar's bundle name `0x00000000_0x40000000`.
    pub fn parse(s: &str) -> Result<BundleRange, BundleError> {
        let bad = || BundleError::Range(s.to_string());
        let (l, u) = s.split_once('_').ok_or_else(bad)?;
        let lower = parse_boundary(l).map_err(|_| bad())?;
        let upper = parse_boundary(u).map_err(|_| bad())?;
        if lower >= upper {
            return Err(bad());
        }
        Ok(BundleRange { lower, upper })
    }
}

impl fmt::Display for BundleRange {
    /// Pulsar's bundle name: `0x00000000_0x40000000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:08x}_0x{:08x}", self.lower, self.upper)
    }
}

/// Parses one boundary string `0x40000000`.
pub fn parse_boundary(s: &str) -> Result<u32, BundleError> {
    let hex = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .ok_or_else(|| BundleError::Boundary(s.to_string()))?;
    if hex.is_empty() || hex.len() > 8 {
        return Err(BundleError::Boundary(s.to_string()));
    }
    u32::from_str_radix(hex, 16).map_err(|_| BundleError::Boundary(s.to_string()))
}

/// A namespace's bundles, sorted, covering the whole hash space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundles {
    ranges: Vec<BundleRange>,
}

impl Bundles {
    /// `n` even bundles (Pulsar's default split).
    pub fn even(n: u32) -> Result<Bundles, BundleError> {
        if n == 0 || n > BUNDLES_MAX {
            return Err(BundleError::Count(u64::from(n)));
        }
        let step = (1u64 << 32) / u64::from(n);
        let mut bounds: Vec<u32> = (0..u64::from(n)).map(|i| (i * step) as u32).collect();
        bounds.push(HASH_MAX);
        Self::from_bounds(&bounds)
    }

    /// From Pulsar's policy shape `{"boundaries": [...], "numBundles": n}`;
    /// boundaries win when present, else `num_bundles` even bundles.
    pub fn from_policy(
        boundaries: Option<&[String]>,
        num_bundles: Option<u64>,
    ) -> Result<Bundles, BundleError> {
        match boundaries {
            Some(b) if !b.is_empty() => {
                let bounds = b
                    .iter()
                    .map(|s| parse_boundary(s))
                    .collect::<Result<Vec<u32>, _>>()?;
                if bounds.len() < 2 || bounds.len() - 1 > BUNDLES_MAX as usize {
                    return Err(BundleError::Count(bounds.len().saturating_sub(1) as u64));
                }
                if let Some(n) = num_bundles
                    && n != (bounds.len() - 1) as u64
                {
                    return Err(BundleError::Order(format!(
                        "numBundles {n} but {} boundaries",
                        bounds.len()
                    )));
                }
                Self::from_bounds(&bounds)
            }
            _ => {
                let n = num_bundles.unwrap_or(u64::from(DEFAULT_BUNDLES));
                let n = u32::try_from(n).map_err(|_| BundleError::Count(n))?;
                Self::even(n)
            }
        }
    }

    fn from_bounds(bounds: &[u32]) -> Result<Bundles, BundleError> {
        let shown = || {
            bounds
                .iter()
                .map(|b| format!("0x{b:08x}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        if bounds.first() != Some(&0)
            || bounds.last() != Some(&HASH_MAX)
            || bounds.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(BundleError::Order(shown()));
        }
        Ok(Bundles {
            ranges: bounds
                .windows(2)
                .map(|w| BundleRange {
                    lower: w[0],
                    upper: w[1],
                })
                .collect(),
        })
    }

    /// The ranges, in hash order.
    pub fn ranges(&self) -> &[BundleRange] {
        &self.ranges
    }

    /// Pulsar's `boundaries` strings.
    pub fn boundaries(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .ranges
            .iter()
            .map(|r| format!("0x{:08x}", r.lower))
            .collect();
        v.push(format!("0x{HASH_MAX:08x}"));
        v
    }

    /// The bundle holding `hash`.
    pub fn bundle_of_hash(&self, hash: u32) -> BundleRange {
        // Ranges cover 0..=HASH_MAX without gaps (checked on construction).
        let i = self.ranges.partition_point(|r| r.upper <= hash);
        let i = i.min(self.ranges.len() - 1);
        self.ranges[i]
    }

    /// The bundle of a topic given its full name (`persistent://t/ns/x`).
    pub fn bundle_of_topic(&self, full_name: &str) -> BundleRange {
        self.bundle_of_hash(topic_hash(full_name))
    }

    /// Whether `range` is one of these bundles.
    pub fn contains_range(&self, range: &BundleRange) -> bool {
        self.ranges.binary_search(range).is_ok()
    }

    /// These bundles with `range` replaced by its two [`BundleRange::halves`];
    /// refused when `range` is not one of them or the result would exceed
    /// `max` bundles. Every other range is unchanged, so every topic keeps
    /// its bundle unless it was in `range`, and then it is in one half.
    pub fn split(&self, range: &BundleRange, max: u32) -> Result<Bundles, BundleError> {
        let i = self
            .ranges
            .binary_search(range)
            .map_err(|_| BundleError::NoSuchBundle(range.to_string()))?;
        if self.ranges.len() >= max.min(BUNDLES_MAX) as usize {
            return Err(BundleError::Unsplittable(
                range.to_string(),
                format!(
                    "the namespace has {} bundles, the most allowed is {}",
                    self.ranges.len(),
                    max.min(BUNDLES_MAX)
                ),
            ));
        }
        let (a, b) = range.halves()?;
        let mut ranges = self.ranges.clone();
        ranges.splice(i..=i, [a, b]);
        Ok(Bundles { ranges })
    }
}

/// The hash of a topic's full name: CRC-32 (IEEE 802.3, reflected,
/// polynomial 0xEDB88320) of its UTF-8 bytes, as Pulsar's bundle factory.
pub fn topic_hash(full_name: &str) -> u32 {
    crc32_ieee(full_name.as_bytes())
}

/// CRC-32 (IEEE) of `data`; bitwise, topic names are short.
pub fn crc32_ieee(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xedb8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32_ieee(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32_ieee(b""), 0);
    }

    #[test]
    fn four_even_bundles_are_pulsars_defaults() {
        let b = Bundles::even(4).unwrap();
        let names: Vec<String> = b.ranges().iter().map(|r| r.to_string()).collect();
        assert_eq!(
            names,
            [
                "0x00000000_0x40000000",
                "0x40000000_0x80000000",
                "0x80000000_0xc0000000",
                "0xc0000000_0xffffffff"
            ]
        );
        assert_eq!(
            b.boundaries(),
            [
                "0x00000000",
                "0x40000000",
                "0x80000000",
                "0xc0000000",
                "0xffffffff"
            ]
        );
    }

    #[test]
    fn every_hash_is_in_exactly_one_bundle() {
        for n in [1, 2, 3, 4, 7, 16, 128] {
            let b = Bundles::even(n).unwrap();
            assert_eq!(b.ranges().len(), n as usize);
            for h in [
                0u32,
                1,
                0x3fff_ffff,
                0x4000_0000,
                0x7fff_ffff,
                0x8000_0000,
                0xffff_fffe,
                HASH_MAX,
            ] {
                let hits = b.ranges().iter().filter(|r| r.contains(h)).count();
                assert_eq!(hits, 1, "n={n} hash={h:#x}");
                assert!(b.bundle_of_hash(h).contains(h), "n={n} hash={h:#x}");
            }
        }
    }

    #[test]
    fn bad_counts_and_boundaries_are_refused() {
        assert_eq!(Bundles::even(0), Err(BundleError::Count(0)));
        assert_eq!(Bundles::even(1025), Err(BundleError::Count(1025)));
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(matches!(
            Bundles::from_policy(Some(&s(&["0x10", "0xffffffff"])), None),
            Err(BundleError::Order(_))
        ));
        assert!(matches!(
            Bundles::from_policy(
                Some(&s(&["0x0", "0x80000000", "0x70000000", "0xffffffff"])),
                None
            ),
            Err(BundleError::Order(_))
        ));
        assert!(matches!(
            Bundles::from_policy(Some(&s(&["0", "0xffffffff"])), None),
            Err(BundleError::Boundary(_))
        ));
        assert!(matches!(
            Bundles::from_policy(Some(&s(&["0x0", "0x1ffffffff"])), None),
            Err(BundleError::Boundary(_))
        ));
        assert!(matches!(
            Bundles::from_policy(Some(&s(&["0x0", "0x80000000", "0xffffffff"])), Some(3)),
            Err(BundleError::Order(_))
        ));
    }

    #[test]
    fn policy_shapes() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let b = Bundles::from_policy(
            Some(&s(&["0x00000000", "0x80000000", "0xffffffff"])),
            Some(2),
        )
        .unwrap();
        assert_eq!(b.ranges().len(), 2);
        assert_eq!(
            Bundles::from_policy(None, None).unwrap(),
            Bundles::even(4).unwrap()
        );
        assert_eq!(
            Bundles::from_policy(None, Some(8)).unwrap(),
            Bundles::even(8).unwrap()
        );
    }

    #[test]
    fn ranges_round_trip_through_their_names() {
        let b = Bundles::even(16).unwrap();
        for r in b.ranges() {
            assert_eq!(BundleRange::parse(&r.to_string()).unwrap(), *r);
            assert!(b.contains_range(r));
        }
        for bad in ["", "0x0", "0x10_0x05", "x_y", "0x0_0x1_0x2"] {
            assert!(BundleRange::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn topics_spread_over_bundles_and_stay_put() {
        let b = Bundles::even(4).unwrap();
        let mut seen = std::collections::HashSet::new();
        for i in 0..64 {
            let name = format!("persistent://public/default/t-{i}");
            let r = b.bundle_of_topic(&name);
            assert_eq!(r, b.bundle_of_topic(&name));
            seen.insert(r);
        }
        assert_eq!(seen.len(), 4, "64 topics should touch all 4 bundles");
    }

    #[test]
    fn splitting_halves_one_bundle_and_moves_no_other_topic() {
        let four = Bundles::even(4).unwrap();
        let r = four.ranges()[1];
        let split = four.split(&r, 128).unwrap();
        assert_eq!(
            split.boundaries(),
            [
                "0x00000000",
                "0x40000000",
                "0x60000000",
                "0x80000000",
                "0xc0000000",
                "0xffffffff"
            ]
        );
        // The last bundle (it includes 0xffffffff) halves too.
        let last = four.ranges()[3];
        let (a, b) = last.halves().unwrap();
        assert_eq!(
            (a.to_string().as_str(), b.to_string().as_str()),
            ("0xc0000000_0xdfffffff", "0xdfffffff_0xffffffff")
        );
        assert!(b.contains(HASH_MAX));
        // Every topic stays in its bundle, or lands in a half of the split one.
        for i in 0..2000 {
            let name = format!("persistent://t/ns/topic-{i}");
            let (before, after) = (four.bundle_of_topic(&name), split.bundle_of_topic(&name));
            if before == r {
                assert!(after.lower >= r.lower && after.upper <= r.upper && after != r);
            } else {
                assert_eq!(before, after);
            }
        }
        // Refusals: unknown range, too many bundles, too narrow.
        assert!(matches!(
            split.split(&r, 128),
            Err(BundleError::NoSuchBundle(_))
        ));
        assert!(matches!(
            four.split(&r, 4),
            Err(BundleError::Unsplittable(..))
        ));
        let narrow = BundleRange { lower: 7, upper: 8 };
        assert!(matches!(
            narrow.halves(),
            Err(BundleError::Unsplittable(..))
        ));
        let two = BundleRange { lower: 7, upper: 9 };
        assert_eq!(two.halves().unwrap().0, BundleRange { lower: 7, upper: 8 });
        // Split repeatedly down to the bound: always a valid layout.
        let mut b = Bundles::even(1).unwrap();
        while b.ranges().len() < 64 {
            let widest = *b.ranges().iter().max_by_key(|r| r.upper - r.lower).unwrap();
            b = b.split(&widest, 64).unwrap();
            let again = Bundles::from_policy(Some(&b.boundaries()), None).unwrap();
            assert_eq!(again, b);
        }
        // As Pulsar: halving a range that ends at 0xffffffff rounds down,
        // so one bundle splits into 0x00000000_0x7fffffff and
        // 0x7fffffff_0xffffffff.
        let (a, _) = Bundles::even(1).unwrap().ranges()[0].halves().unwrap();
        assert_eq!(a.to_string(), "0x00000000_0x7fffffff");
    }
}
