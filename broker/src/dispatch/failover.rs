//! Failover's active-consumer rule (Pulsar, non-partitioned topics): the
//! consumer with the highest priority (the lowest `priority_level` number),
//! then the smallest consumer name; equal names go to the one that joined
//! first.

use super::types::{ConsumerId, ConsumerInfo};

/// The active consumer among `consumers` (given in join order), if any.
pub fn select_active<'a>(
    consumers: impl IntoIterator<Item = &'a ConsumerInfo>,
) -> Option<ConsumerId> {
    consumers
        .into_iter()
        .enumerate()
        .min_by(|(ia, a), (ib, b)| {
            (a.priority, a.name.as_str(), ia).cmp(&(b.priority, b.name.as_str(), ib))
        })
        .map(|(_, c)| c.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::SubType;

    fn c(id: u64, name: &str, priority: i32) -> ConsumerInfo {
        ConsumerInfo {
            id: ConsumerId::new(1, id),
            name: name.to_string(),
            priority,
            sub_type: SubType::Failover,
            key_shared: None,
        }
    }

    #[test]
    fn priority_then_name_then_join_order() {
        // (consumers in join order, expected active consumer id)
        type Case<'a> = (&'a [(u64, &'a str, i32)], Option<u64>);
        let cases: &[Case] = &[
            (&[], None),
            (&[(1, "b", 0)], Some(1)),
            (&[(1, "b", 0), (2, "a", 0)], Some(2)),
            (&[(1, "b", 0), (2, "a", 1)], Some(1)),
            (&[(1, "z", 5), (2, "y", 3), (3, "x", 3)], Some(3)),
            (&[(1, "same", 0), (2, "same", 0)], Some(1)),
            (&[(2, "same", 0), (1, "same", 0)], Some(2)),
            (&[(1, "a", 2), (2, "b", -1)], Some(2)),
        ];
        for (consumers, want) in cases {
            let list: Vec<ConsumerInfo> = consumers.iter().map(|(i, n, p)| c(*i, n, *p)).collect();
            assert_eq!(
                select_active(&list),
                want.map(|i| ConsumerId::new(1, i)),
                "{consumers:?}"
            );
        }
    }
}
