//! The master key: what a writer or recoverer sends with every add and fence
//! so a bookie can refuse a client that does not know the ledger's password.
//!
//! Like BookKeeper (reference §3.9) it is SHA-1("ledger" ‖ password), 20 bytes,
//! so the password itself never travels with the data. SHA-1 serves as a key
//! derivation of a shared secret here, not as a collision-resistant hash; it is
//! implemented in a few lines below (FIPS 180-4) to avoid a dependency, and
//! checked against the standard's test vectors.

use bytes::Bytes;

/// Bytes of a master key.
pub const MASTER_KEY_BYTES: usize = 20;

/// The master key of a ledger with this password.
pub fn master_key(password: &[u8]) -> Bytes {
    let mut input = Vec::with_capacity(6 + password.len());
    input.extend_from_slice(b"ledger");
    input.extend_from_slice(password);
    Bytes::copy_from_slice(&sha1(&input))
}

/// SHA-1 of `data` (FIPS 180-4 §6.1).
fn sha1(data: &[u8]) -> [u8; MASTER_KEY_BYTES] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let bit_len = (data.len() as u64).wrapping_mul(8);
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (hi, v) in h.iter_mut().zip([a, b, c, d, e]) {
            *hi = hi.wrapping_add(v);
        }
    }
    let mut out = [0u8; MASTER_KEY_BYTES];
    for (i, v) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&v.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn sha1_matches_the_fips_test_vectors() {
        assert_eq!(
            hex(&sha1(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(hex(&sha1(b"")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(
            hex(&sha1(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
        let million_a = vec![b'a'; 1_000_000];
        assert_eq!(
            hex(&sha1(&million_a)),
            "34aa973cd4c4daa4f61eeb2bdbad27316534016f"
        );
    }

    #[test]
    fn master_key_is_20_bytes_and_depends_on_the_password() {
        let a = master_key(b"secret");
        assert_eq!(a.len(), MASTER_KEY_BYTES);
        assert_eq!(a, master_key(b"secret"));
        assert_ne!(a, master_key(b"secreT"));
        assert_eq!(&a[..], &sha1(b"ledgersecret")[..]);
        assert_eq!(master_key(b"").len(), MASTER_KEY_BYTES);
    }
}
