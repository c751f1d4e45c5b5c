//! Partition choice for a producer on a partitioned topic: messages with a
//! key go to `murmur3_32(key) & i32::MAX mod n` (Pulsar's Murmur3_32Hash), so
//! a key always lands on one partition; keyless messages go round robin
//! (or to one fixed partition with [`RoutingMode::Single`]). Pure.

/// How a producer picks a partition for keyless messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RoutingMode {
    /// Partitions in turn.
    #[default]
    RoundRobin,
    /// Always the same partition (chosen at random when the producer starts).
    Single,
}

/// MurmurHash3 x86 32-bit (Guava's `murmur3_32`, Pulsar's `Murmur3_32Hash`),
/// also the broker's Key_Shared hash. Written here rather than taken from a
/// crate: it is 30 lines, pinned by Pulsar's reference vectors in the tests,
/// and the crates offering it take a `Read` and return `io::Result`.
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h = seed;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, b) in tail.iter().enumerate() {
            k |= u32::from(*b) << (8 * i);
        }
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
    }
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// The partition of a message among `n` (> 0): by key hash if it has a key,
/// else `counter` (round robin) or `fixed` (single).
pub fn choose(
    key: Option<&str>,
    n: usize,
    mode: RoutingMode,
    counter: usize,
    fixed: usize,
) -> usize {
    let n = n.max(1);
    match key {
        Some(k) => ((murmur3_32(k.as_bytes(), 0) & 0x7fff_ffff) as usize) % n,
        None => match mode {
            RoutingMode::RoundRobin => counter % n,
            RoutingMode::Single => fixed % n,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur3_reference_vectors() {
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_32(b"abc", 0), 0xb3dd_93fa);
        assert_eq!(murmur3_32(b"Hello, world!", 0x9747_b28c), 0x2488_4cba);
        assert_eq!(
            murmur3_32(b"The quick brown fox jumps over the lazy dog", 0),
            0x2e4f_f723
        );
    }

    #[test]
    fn keys_are_sticky_and_keyless_round_robin() {
        for k in ["a", "order-17", "ü"] {
            let p = choose(Some(k), 7, RoutingMode::RoundRobin, 0, 0);
            for c in 0..20 {
                assert_eq!(choose(Some(k), 7, RoutingMode::RoundRobin, c, 3), p);
            }
        }
        let seq: Vec<usize> = (0..6)
            .map(|c| choose(None, 3, RoutingMode::RoundRobin, c, 0))
            .collect();
        assert_eq!(seq, vec![0, 1, 2, 0, 1, 2]);
        assert!((0..6).all(|c| choose(None, 3, RoutingMode::Single, c, 5) == 2));
        assert_eq!(choose(None, 0, RoutingMode::RoundRobin, 9, 0), 0);
    }
}
