//! A position in a managed ledger: (ledger id, entry id), ordered first by
//! ledger id, then by entry id.
//!
//! Promises: the order is the order of appends (ledgers of a topic are created
//! with ascending ids and listed in that order). Entry id −1 is a valid
//! *position* but never an entry: `(L, -1)` sorts after every entry of every
//! ledger before `L` and before the first entry of `L`, so a mark-delete of
//! `(L, -1)` means "everything before ledger L is consumed".

use std::fmt;

use super::ledger_list::LedgerList;
use super::proto;

/// A position in a managed ledger. The derived order (ledger id, then entry
/// id) is the append order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// Ledger id.
    pub ledger_id: u64,
    /// Entry id inside the ledger, from 0; −1 = before the first entry.
    pub entry_id: i64,
}

impl Position {
    /// The position `(ledger_id, entry_id)`.
    pub const fn new(ledger_id: u64, entry_id: i64) -> Self {
        Self {
            ledger_id,
            entry_id,
        }
    }

    /// The position before the first entry of `ledger_id`: `(ledger_id, -1)`.
    pub const fn before_ledger(ledger_id: u64) -> Self {
        Self::new(ledger_id, -1)
    }

    /// The next entry id in the same ledger (whether or not it exists yet).
    pub const fn next_in_ledger(self) -> Self {
        Self::new(self.ledger_id, self.entry_id.saturating_add(1))
    }

    /// The previous entry id in the same ledger, at least `(ledger_id, -1)`.
    pub const fn prev_in_ledger(self) -> Self {
        let entry_id = if self.entry_id > -1 {
            self.entry_id - 1
        } else {
            -1
        };
        Self::new(self.ledger_id, entry_id)
    }

    /// The first entry of the next non-empty ledger after this position's
    /// ledger in `ledgers`, if there is one.
    pub fn first_of_next_ledger(self, ledgers: &LedgerList) -> Option<Self> {
        ledgers
            .ledgers()
            .iter()
            .find(|l| l.ledger_id > self.ledger_id && l.entries > 0)
            .map(|l| Self::new(l.ledger_id, 0))
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ledger_id, self.entry_id)
    }
}

impl From<Position> for proto::Position {
    fn from(p: Position) -> Self {
        Self {
            ledger_id: p.ledger_id,
            entry_id: p.entry_id,
        }
    }
}

impl From<proto::Position> for Position {
    fn from(p: proto::Position) -> Self {
        Self::new(p.ledger_id, p.entry_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_ledger_then_entry() {
        let cases = [
            (Position::new(1, 5), Position::new(2, 0)),
            (Position::new(1, 5), Position::new(1, 6)),
            (Position::new(1, 99), Position::before_ledger(2)),
            (Position::before_ledger(2), Position::new(2, 0)),
        ];
        for (lo, hi) in cases {
            assert!(lo < hi, "{lo} < {hi}");
        }
    }

    #[test]
    fn next_and_prev_stay_in_the_ledger_and_stop_at_minus_one() {
        assert_eq!(Position::new(3, 4).next_in_ledger(), Position::new(3, 5));
        assert_eq!(Position::new(3, -1).next_in_ledger(), Position::new(3, 0));
        assert_eq!(Position::new(3, 4).prev_in_ledger(), Position::new(3, 3));
        assert_eq!(Position::new(3, 0).prev_in_ledger(), Position::new(3, -1));
        assert_eq!(Position::new(3, -1).prev_in_ledger(), Position::new(3, -1));
    }

    #[test]
    fn first_of_next_ledger_skips_empty_ledgers() {
        let list = crate::managed_ledger::ledger_list::tests::list(&[(1, 3), (2, 0), (3, 2)], true);
        assert_eq!(
            Position::new(1, 2).first_of_next_ledger(&list),
            Some(Position::new(3, 0))
        );
        assert_eq!(Position::new(3, 0).first_of_next_ledger(&list), None);
    }

    #[test]
    fn converts_to_and_from_proto() {
        let p = Position::new(7, -1);
        assert_eq!(Position::from(proto::Position::from(p)), p);
        assert_eq!(p.to_string(), "7:-1");
    }
}
