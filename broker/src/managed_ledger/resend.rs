//! Close-and-resend after a ledger write failure (issue 6 leftover): which
//! pending appends the failed ledger already holds, which must be sent again
//! on a new ledger, and how long to keep trying.
//!
//! When a data ledger's writer fails for a reason other than fencing (not
//! enough bookies, a failed ensemble change, timeouts, its task gone), the
//! driver stops writing to it, recovery-opens it (fence and close: its last
//! entry is then what recovery found on the bookies, which includes every
//! entry that reached an ack quorum) and asks [`plan_resend`] what to do with
//! the appends submitted and not yet completed, in submission order.
//!
//! Promises: a pure function of its inputs (no I/O, no clock); appends at or
//! below the recovered last entry are durable where they were submitted and
//! are completed there, in order; everything after the first append the
//! failed ledger does not hold is resent, in order, including appends already
//! submitted to later ledgers (a rollover in flight): none of those was
//! confirmed yet (completions are in order), so those later ledgers are
//! abandoned (dropped from the list before the new ledger's first write) and
//! nothing is stored twice; an impossible recovery result (below what was
//! confirmed, beyond what was submitted) is an error, never a guess.
//! [`RetryPolicy`] bounds the retries (recovery, ledger creation) with an
//! exponential backoff inside a time window.

use super::position::Position;

/// What to do with the pending appends after a ledger failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResendPlan {
    /// The first `durable` pending appends are stored in the failed ledger
    /// at the position they were submitted at: complete them there.
    pub durable: usize,
    /// The pending appends after those (`pending[durable..]`, this many) are
    /// sent again, in order, on a new ledger. 0: nothing is resent and the
    /// appends submitted to later ledgers complete as submitted.
    pub resend: usize,
    /// Ledgers created after the failed one whose appends are all resent:
    /// drop them from the list before the new ledger's first write.
    pub abandoned: Vec<u64>,
}

/// Inputs [`plan_resend`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResendError {
    /// The first pending append is not on the failed ledger (a driver bug:
    /// the failure is reported by the first unresolved append).
    #[error("the first pending append is not on the failed ledger {0}")]
    NotFirstPending(u64),
    /// Pending appends are not in submission order (consecutive entry ids
    /// per ledger, ascending ledgers).
    #[error("pending appends out of submission order at {0}")]
    OutOfOrder(Position),
    /// Recovery closed the ledger below what was already confirmed (acked
    /// data would be lost).
    #[error(
        "ledger {ledger_id} recovered with last entry {recovered}, below the confirmed {confirmed}"
    )]
    BelowConfirmed {
        /// The ledger.
        ledger_id: u64,
        /// Its last entry after recovery.
        recovered: i64,
        /// The last entry confirmed before the failure.
        confirmed: i64,
    },
    /// Recovery found entries this owner never submitted.
    #[error(
        "ledger {ledger_id} recovered with last entry {recovered}, beyond the last submitted {submitted}"
    )]
    BeyondSubmitted {
        /// The ledger.
        ledger_id: u64,
        /// Its last entry after recovery.
        recovered: i64,
        /// The last entry submitted to it.
        submitted: i64,
    },
}

/// Plans the resend after ledger `failed_ledger` failed. `pending` holds the
/// positions the appends not yet completed were submitted at, in submission
/// order (first on `failed_ledger`, entry ids from `confirmed_last + 1`);
/// `confirmed_last` is the failed ledger's last confirmed entry (−1: none)
/// and `recovered_last` its last entry after recovery (−1: empty).
pub fn plan_resend(
    pending: &[Position],
    failed_ledger: u64,
    confirmed_last: i64,
    recovered_last: i64,
) -> Result<ResendPlan, ResendError> {
    if pending.first().map(|p| p.ledger_id) != Some(failed_ledger) {
        return Err(ResendError::NotFirstPending(failed_ledger));
    }
    // Submission order: within a ledger consecutive ids (the failed one from
    // confirmed_last + 1, later ones from 0), ledgers ascending.
    let mut prev: Option<Position> = None;
    for p in pending {
        let expected = match prev {
            None => Position::new(failed_ledger, confirmed_last.saturating_add(1)),
            Some(q) if q.ledger_id == p.ledger_id => Position::new(q.ledger_id, q.entry_id + 1),
            Some(q) if p.ledger_id > q.ledger_id => Position::new(p.ledger_id, 0),
            Some(_) => return Err(ResendError::OutOfOrder(*p)),
        };
        if *p != expected {
            return Err(ResendError::OutOfOrder(*p));
        }
        prev = Some(*p);
    }
    let on_failed = pending
        .iter()
        .take_while(|p| p.ledger_id == failed_ledger)
        .count();
    let submitted_last =
        confirmed_last.saturating_add(i64::try_from(on_failed).unwrap_or(i64::MAX));
    if recovered_last < confirmed_last {
        return Err(ResendError::BelowConfirmed {
            ledger_id: failed_ledger,
            recovered: recovered_last,
            confirmed: confirmed_last,
        });
    }
    if recovered_last > submitted_last {
        return Err(ResendError::BeyondSubmitted {
            ledger_id: failed_ledger,
            recovered: recovered_last,
            submitted: submitted_last,
        });
    }
    let durable = usize::try_from(recovered_last - confirmed_last).unwrap_or(usize::MAX);
    if durable == on_failed {
        return Ok(ResendPlan {
            durable,
            resend: 0,
            abandoned: Vec::new(),
        });
    }
    let mut abandoned: Vec<u64> = pending[on_failed..].iter().map(|p| p.ledger_id).collect();
    abandoned.dedup();
    Ok(ResendPlan {
        durable,
        resend: pending.len() - durable,
        abandoned,
    })
}

/// Bounded retries: an exponential backoff from `backoff_ms_min` doubling
/// up to `backoff_ms_max`, for at most `window_ms` after the first failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First delay, ms.
    pub backoff_ms_min: u64,
    /// Largest delay, ms.
    pub backoff_ms_max: u64,
    /// Retrying stops this long after the failure, ms.
    pub window_ms: u64,
}

impl Default for RetryPolicy {
    /// 100 ms doubling to 2 s, for 20 s (below the Pulsar client's 30 s send
    /// timeout, so a producer sees the error rather than its own timeout).
    fn default() -> Self {
        Self {
            backoff_ms_min: 100,
            backoff_ms_max: 2_000,
            window_ms: 20_000,
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `attempt` (0 = the first retry) when
    /// `elapsed_ms` have passed since the failure; `None` once the window is
    /// over (give up). The delay never reaches past the window's end.
    pub fn next_delay_ms(&self, attempt: u32, elapsed_ms: u64) -> Option<u64> {
        if elapsed_ms >= self.window_ms {
            return None;
        }
        let doubled = self
            .backoff_ms_min
            .saturating_mul(1u64.checked_shl(attempt.min(63)).unwrap_or(u64::MAX));
        let delay = doubled.min(self.backoff_ms_max.max(self.backoff_ms_min));
        Some(delay.min(self.window_ms - elapsed_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(l: u64, e: i64) -> Position {
        Position::new(l, e)
    }

    /// (pending, failed ledger, confirmed last, recovered last, want).
    type Case = (
        Vec<Position>,
        u64,
        i64,
        i64,
        Result<ResendPlan, ResendError>,
    );

    fn ok(durable: usize, resend: usize, abandoned: &[u64]) -> Result<ResendPlan, ResendError> {
        Ok(ResendPlan {
            durable,
            resend,
            abandoned: abandoned.to_vec(),
        })
    }

    #[test]
    fn the_recovered_prefix_completes_and_the_rest_is_resent_in_order() {
        // (pending, failed ledger, confirmed last, recovered last) → plan.
        let cases: Vec<Case> = vec![
            // Nothing of the pending reached the bookies.
            (vec![p(5, 3), p(5, 4), p(5, 5)], 5, 2, 2, ok(0, 3, &[])),
            // Recovery found the first two: they complete, one is resent.
            (vec![p(5, 3), p(5, 4), p(5, 5)], 5, 2, 4, ok(2, 1, &[])),
            // Recovery found all: nothing to resend.
            (vec![p(5, 3), p(5, 4), p(5, 5)], 5, 2, 5, ok(3, 0, &[])),
            // A fresh ledger (nothing confirmed), nothing stored.
            (vec![p(7, 0), p(7, 1)], 7, -1, -1, ok(0, 2, &[])),
            // A rollover in flight: the next ledger's appends are resent
            // too, after the failed ledger's, and that ledger is abandoned.
            (
                vec![p(5, 3), p(5, 4), p(9, 0), p(9, 1)],
                5,
                2,
                3,
                ok(1, 3, &[9]),
            ),
            // Two rollovers in flight.
            (
                vec![p(5, 3), p(9, 0), p(11, 0), p(11, 1)],
                5,
                2,
                2,
                ok(0, 4, &[9, 11]),
            ),
            // Everything of the failed ledger is stored: the later ledger's
            // appends continue as submitted (their own failure, if any, is
            // handled when they complete).
            (vec![p(5, 3), p(5, 4), p(9, 0)], 5, 2, 4, ok(2, 0, &[])),
        ];
        for (pending, failed, confirmed, recovered, want) in cases {
            assert_eq!(
                plan_resend(&pending, failed, confirmed, recovered),
                want,
                "{pending:?} failed {failed} confirmed {confirmed} recovered {recovered}"
            );
        }
    }

    #[test]
    fn impossible_inputs_are_refused_not_guessed() {
        assert_eq!(
            plan_resend(&[p(5, 3)], 5, 2, 1),
            Err(ResendError::BelowConfirmed {
                ledger_id: 5,
                recovered: 1,
                confirmed: 2
            })
        );
        assert_eq!(
            plan_resend(&[p(5, 3)], 5, 2, 4),
            Err(ResendError::BeyondSubmitted {
                ledger_id: 5,
                recovered: 4,
                submitted: 3
            })
        );
        // Appends of a later ledger do not count as submitted to the failed one.
        assert_eq!(
            plan_resend(&[p(5, 3), p(9, 0)], 5, 2, 4),
            Err(ResendError::BeyondSubmitted {
                ledger_id: 5,
                recovered: 4,
                submitted: 3
            })
        );
        assert_eq!(
            plan_resend(&[], 5, 2, 2),
            Err(ResendError::NotFirstPending(5))
        );
        assert_eq!(
            plan_resend(&[p(9, 0), p(5, 3)], 5, 2, 2),
            Err(ResendError::NotFirstPending(5))
        );
        for bad in [
            vec![p(5, 4)],                   // does not follow the confirmed entry
            vec![p(5, 3), p(5, 5)],          // a gap
            vec![p(5, 3), p(9, 1)],          // a later ledger not from entry 0
            vec![p(5, 3), p(9, 0), p(5, 4)], // back to an earlier ledger
        ] {
            assert!(
                matches!(plan_resend(&bad, 5, 2, 2), Err(ResendError::OutOfOrder(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_resend_plan_never_drops_or_duplicates_an_append() {
        // Every split of a pending run over up to three ledgers, every
        // recovery result: durable + resent = all, resent ones follow the
        // durable ones, and a resend takes everything after the durable.
        for on_failed in 1..=4usize {
            for later in 0..=3usize {
                let mut pending: Vec<Position> = (0..on_failed)
                    .map(|i| p(5, 10 + i64::try_from(i).unwrap_or(0)))
                    .collect();
                pending.extend((0..later).map(|i| p(8, i64::try_from(i).unwrap_or(0))));
                for recovered in 9..=9 + i64::try_from(on_failed).unwrap_or(0) {
                    let plan = plan_resend(&pending, 5, 9, recovered)
                        .unwrap_or_else(|e| panic!("{pending:?} {recovered}: {e}"));
                    let durable = usize::try_from(recovered - 9).unwrap_or(0);
                    assert_eq!(plan.durable, durable);
                    if durable == on_failed {
                        assert_eq!((plan.resend, plan.abandoned.len()), (0, 0));
                    } else {
                        assert_eq!(plan.durable + plan.resend, pending.len());
                        assert_eq!(plan.abandoned.len(), usize::from(later > 0));
                    }
                }
            }
        }
    }

    #[test]
    fn retries_back_off_exponentially_within_the_window() {
        let r = RetryPolicy {
            backoff_ms_min: 100,
            backoff_ms_max: 1_000,
            window_ms: 5_000,
        };
        // (attempt, elapsed) → delay.
        let cases = [
            (0, 0, Some(100)),
            (1, 0, Some(200)),
            (3, 0, Some(800)),
            (4, 0, Some(1_000)),
            (40, 0, Some(1_000)),
            (u32::MAX, 0, Some(1_000)),
            (4, 4_500, Some(500)),
            (0, 4_999, Some(1)),
            (0, 5_000, None),
            (0, u64::MAX, None),
        ];
        for (attempt, elapsed, want) in cases {
            assert_eq!(
                r.next_delay_ms(attempt, elapsed),
                want,
                "{attempt} {elapsed}"
            );
        }
        let zero = RetryPolicy {
            window_ms: 0,
            ..RetryPolicy::default()
        };
        assert_eq!(zero.next_delay_ms(0, 0), None, "an empty window: no retry");
    }
}
