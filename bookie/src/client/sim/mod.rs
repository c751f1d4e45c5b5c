//! A seeded, deterministic simulation of the ledger protocol (RELIABILITY
//! "Deterministic simulation"), for tests only.
//!
//! One seed drives everything: simulated bookies (a journal whose unsynced
//! tail is lost on crash, a durable fence flag, a master key, restart), a
//! network that delays, reorders and drops messages and obeys scripted rules
//! (a slow or lost fence), a compare-and-set metadata store, a virtual clock,
//! and the real protocol cores ([`Writer`], [`Recovery`], [`Reader`]) driven by
//! small drivers that do what a real async driver does. The [`check`] of a
//! run's history asserts:
//! - no acked entry is lost or changed: every entry up to the closed end has
//!   at least Qa durable, digest-valid copies in its write set of the final
//!   metadata, with the bytes the writer wrote;
//! - a closed ledger's last entry is ≥ every acked entry (so a fenced writer
//!   never got a new ack), and its length is the sum of its payloads;
//! - acks are dense and in order, and none follows the writer's failure;
//! - every recovery that finished reports the metadata's end (convergence);
//! - a reader of an open ledger never returns an entry past what the writer
//!   had acked at that moment, and every reader returns the writer's bytes.

mod bookie;
mod world;

#[cfg(test)]
mod tests;

pub(crate) use world::{SimConfig, World};

/// splitmix64: small, fast, and the same everywhere.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `per_mille` / 1000.
    pub(crate) fn chance(&mut self, per_mille: u64) -> bool {
        self.next_u64() % 1000 < per_mille
    }
}
