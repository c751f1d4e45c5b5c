//! Placement: which bookies hold a new ledger, and which replace failed ones.
//!
//! Promises:
//! - only writable bookies are chosen, never one in the caller's exclusion set
//!   (read-only bookies, bookies whose connection just failed, the current
//!   ensemble);
//! - when any candidate has a rack, choices spread across racks: each pick
//!   comes from a rack with the fewest bookies already in the ensemble;
//!   without racks the choice is uniformly random;
//! - all randomness comes from the `Rng` handed in, so tests pass a seeded one.

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;
use rand::seq::SliceRandom;

use crate::client::{BookieId, Replacement};

/// What placement knows of one bookie (from its registration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookieInfo {
    /// The bookie's id.
    pub id: BookieId,
    /// Its gRPC address, `host:port`.
    pub endpoint: String,
    /// Its incarnation (bumped by `format`).
    pub incarnation: u64,
    /// Its rack or zone, empty when not set.
    pub rack: String,
    /// False for a read-only bookie.
    pub writable: bool,
}

/// Why no ensemble could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// Fewer usable bookies than asked for.
    #[error("not enough bookies: {wanted} wanted, {available} writable and not excluded")]
    NotEnoughBookies {
        /// Bookies asked for.
        wanted: usize,
        /// Usable bookies found.
        available: usize,
    },
}

fn candidates<'a>(bookies: &'a [BookieInfo], exclude: &BTreeSet<BookieId>) -> Vec<&'a BookieInfo> {
    let mut c: Vec<&BookieInfo> = bookies
        .iter()
        .filter(|b| b.writable && !exclude.contains(&b.id))
        .collect();
    // Deterministic order before shuffling, whatever order the registry had.
    c.sort_by(|a, b| a.id.cmp(&b.id));
    c.dedup_by(|a, b| a.id == b.id);
    c
}

/// Picks `n` bookies from `pool` (already shuffled), spreading across racks
/// given how many bookies each rack already holds (`used`).
fn pick<'a>(
    mut pool: Vec<&'a BookieInfo>,
    n: usize,
    used: &mut BTreeMap<String, usize>,
    rng: &mut impl Rng,
) -> Vec<&'a BookieInfo> {
    pool.shuffle(rng);
    let racked = pool.iter().any(|b| !b.rack.is_empty());
    if !racked {
        pool.truncate(n);
        return pool;
    }
    let mut out = Vec::with_capacity(n);
    while out.len() < n && !pool.is_empty() {
        // The least used rack among the candidates left (ties: first in the
        // shuffled order, so ties break randomly).
        let mut best: Option<(usize, usize)> = None;
        for (i, b) in pool.iter().enumerate() {
            let u = used.get(&b.rack).copied().unwrap_or(0);
            if best.is_none_or(|(_, bu)| u < bu) {
                best = Some((i, u));
            }
        }
        let Some((i, _)) = best else { break };
        let b = pool.remove(i);
        *used.entry(b.rack.clone()).or_insert(0) += 1;
        out.push(b);
    }
    out
}

/// Chooses `n` bookies for a new ledger among writable ones outside `exclude`.
pub fn choose_ensemble(
    bookies: &[BookieInfo],
    n: usize,
    exclude: &BTreeSet<BookieId>,
    rng: &mut impl Rng,
) -> Result<Vec<BookieId>, PlacementError> {
    let pool = candidates(bookies, exclude);
    if pool.len() < n {
        return Err(PlacementError::NotEnoughBookies {
            wanted: n,
            available: pool.len(),
        });
    }
    let mut used = BTreeMap::new();
    Ok(pick(pool, n, &mut used, rng)
        .into_iter()
        .map(|b| b.id.clone())
        .collect())
}

/// Chooses a replacement for each of `failed` (bookies of `ensemble`), outside
/// `ensemble` and `exclude`, preferring racks the remaining ensemble uses
/// least. Returns as many as could be placed (possibly none), in the order of
/// `failed`.
pub fn choose_replacements(
    bookies: &[BookieInfo],
    ensemble: &[BookieId],
    failed: &[BookieId],
    exclude: &BTreeSet<BookieId>,
    rng: &mut impl Rng,
) -> Vec<Replacement> {
    let mut ex = exclude.clone();
    ex.extend(ensemble.iter().cloned());
    ex.extend(failed.iter().cloned());
    let pool = candidates(bookies, &ex);
    let mut used: BTreeMap<String, usize> = BTreeMap::new();
    for id in ensemble.iter().filter(|b| !failed.contains(b)) {
        if let Some(b) = bookies.iter().find(|b| &b.id == id) {
            *used.entry(b.rack.clone()).or_insert(0) += 1;
        }
    }
    let chosen = pick(pool, failed.len(), &mut used, rng);
    failed
        .iter()
        .zip(chosen)
        .map(|(old, new)| Replacement {
            old: old.clone(),
            new: new.id.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is the test failing")]

    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn bookie(id: &str, rack: &str, writable: bool) -> BookieInfo {
        BookieInfo {
            id: id.into(),
            endpoint: format!("{id}:1"),
            incarnation: 1,
            rack: rack.into(),
            writable,
        }
    }

    #[test]
    fn never_chooses_read_only_or_excluded_bookies() {
        let bookies = vec![
            bookie("b1", "", true),
            bookie("b2", "", false),
            bookie("b3", "", true),
            bookie("b4", "", true),
            bookie("b5", "", true),
        ];
        let exclude: BTreeSet<BookieId> = ["b4".to_string()].into();
        for seed in 0..200 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut e = choose_ensemble(&bookies, 3, &exclude, &mut rng).unwrap();
            e.sort();
            assert_eq!(e, vec!["b1", "b3", "b5"], "seed {seed}");
        }
    }

    #[test]
    fn too_few_usable_bookies_is_not_enough_bookies() {
        let bookies = vec![bookie("b1", "", true), bookie("b2", "", false)];
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            choose_ensemble(&bookies, 2, &BTreeSet::new(), &mut rng),
            Err(PlacementError::NotEnoughBookies {
                wanted: 2,
                available: 1
            })
        );
    }

    #[test]
    fn without_racks_every_bookie_gets_chosen_across_seeds() {
        let bookies: Vec<_> = (1..=6)
            .map(|i| bookie(&format!("b{i}"), "", true))
            .collect();
        let mut seen = BTreeSet::new();
        for seed in 0..100 {
            let mut rng = StdRng::seed_from_u64(seed);
            let e = choose_ensemble(&bookies, 2, &BTreeSet::new(), &mut rng).unwrap();
            assert_eq!(e.len(), 2);
            assert_ne!(e[0], e[1]);
            seen.extend(e);
        }
        assert_eq!(seen.len(), 6, "random placement should reach every bookie");
    }

    #[test]
    fn with_racks_an_ensemble_spreads_across_racks() {
        let bookies = vec![
            bookie("a1", "ra", true),
            bookie("a2", "ra", true),
            bookie("a3", "ra", true),
            bookie("b1", "rb", true),
            bookie("b2", "rb", true),
            bookie("c1", "rc", true),
        ];
        for seed in 0..100 {
            let mut rng = StdRng::seed_from_u64(seed);
            let e = choose_ensemble(&bookies, 3, &BTreeSet::new(), &mut rng).unwrap();
            let racks: BTreeSet<char> = e.iter().map(|b| b.chars().next().unwrap()).collect();
            assert_eq!(racks.len(), 3, "seed {seed}: {e:?}");
        }
    }

    #[test]
    fn a_replacement_comes_from_outside_the_ensemble_and_prefers_a_missing_rack() {
        let bookies = vec![
            bookie("a1", "ra", true),
            bookie("a2", "ra", true),
            bookie("b1", "rb", true),
            bookie("b2", "rb", true),
            bookie("c1", "rc", true),
            bookie("c2", "rc", true),
        ];
        let ensemble: Vec<BookieId> = vec!["a1".into(), "b1".into(), "c1".into()];
        for seed in 0..100 {
            let mut rng = StdRng::seed_from_u64(seed);
            let r = choose_replacements(
                &bookies,
                &ensemble,
                &["c1".to_string()],
                &BTreeSet::new(),
                &mut rng,
            );
            assert_eq!(
                r,
                vec![Replacement {
                    old: "c1".into(),
                    new: "c2".into()
                }],
                "seed {seed}"
            );
        }
    }

    #[test]
    fn no_candidate_means_no_replacement() {
        let bookies = vec![
            bookie("b1", "", true),
            bookie("b2", "", true),
            bookie("b3", "", true),
            bookie("b4", "", false),
        ];
        let ensemble: Vec<BookieId> = vec!["b1".into(), "b2".into(), "b3".into()];
        let mut rng = StdRng::seed_from_u64(3);
        let r = choose_replacements(
            &bookies,
            &ensemble,
            &["b2".to_string()],
            &BTreeSet::new(),
            &mut rng,
        );
        assert!(r.is_empty());
    }
}
