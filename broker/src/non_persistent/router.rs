//! [`Router`]: one non-persistent subscription's fan-out decision, without
//! I/O. For each published message it names the one consumer that gets it,
//! or says why the message is dropped for this subscription.
//!
//! Rules (Pulsar's `NonPersistentDispatcher*`):
//! - Exclusive / Failover: the active consumer (Failover's rule is
//!   [`select_active`], shared with persistent dispatch);
//! - Shared: round-robin over the consumers that have permits;
//! - Key_Shared: the owner of the message's sticky key hash (the
//!   [`Selector`] shared with persistent dispatch);
//! - the chosen consumer must have permits (FLOW) left, else the message
//!   is dropped; nothing is kept for later (no replay, no redelivery);
//! - consumers join with the same checks as persistent subscriptions
//!   (one Exclusive consumer, one type per subscription, `consumers_max`,
//!   Key_Shared mode / range conflicts).

use crate::dispatch::key_shared::Selector;
use crate::dispatch::{
    ConsumerId, ConsumerInfo, DispatchError, Event, SubType, check_admission, select_active,
};

/// Why a message is not delivered on a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// No consumer (or no consumer owning the key) is attached.
    NoConsumer,
    /// The chosen consumer has no permits left.
    NoPermits,
    /// The chosen consumer's outbound queue is full (reported by the caller).
    QueueFull,
}

/// Where one message goes on one subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Send it to this consumer (its permits are already taken).
    Deliver(ConsumerId),
    /// Drop it.
    Drop(DropReason),
}

#[derive(Debug)]
struct Member {
    info: ConsumerInfo,
    permits: i64,
}

/// One non-persistent subscription's consumers and permits.
#[derive(Debug)]
pub struct Router {
    consumers_max: usize,
    sub_type: Option<SubType>,
    /// Join order = round-robin order.
    members: Vec<Member>,
    active: Option<ConsumerId>,
    rr_next: usize,
    selector: Selector,
}

impl Router {
    /// No consumer yet; at most `consumers_max` at once.
    pub fn new(consumers_max: usize) -> Self {
        Self {
            consumers_max,
            sub_type: None,
            members: Vec::new(),
            active: None,
            rr_next: 0,
            selector: Selector::new(),
        }
    }

    /// The type of the attached consumers (`None` without consumers).
    pub fn sub_type(&self) -> Option<SubType> {
        self.sub_type
    }

    /// Attached consumers.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// No consumer attached.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Permits left of a consumer.
    pub fn permits(&self, id: ConsumerId) -> Option<i64> {
        self.members
            .iter()
            .find(|m| m.info.id == id)
            .map(|m| m.permits)
    }

    /// Attached consumers with their names and permits, in join order.
    pub fn consumers(&self) -> Vec<(ConsumerId, String, i64)> {
        self.members
            .iter()
            .map(|m| (m.info.id, m.info.name.clone(), m.permits))
            .collect()
    }

    fn idx(&self, id: ConsumerId) -> Result<usize, DispatchError> {
        self.members
            .iter()
            .position(|m| m.info.id == id)
            .ok_or(DispatchError::UnknownConsumer(id))
    }

    /// Attaches a consumer with no permits (the same checks as a persistent
    /// subscription); returns Failover's activity events.
    pub fn add_consumer(&mut self, info: ConsumerInfo) -> Result<Vec<Event>, DispatchError> {
        check_admission(
            self.sub_type,
            self.members.iter().map(|m| &m.info),
            self.consumers_max,
            &info,
        )?;
        if info.sub_type == SubType::KeyShared {
            let spec = info.key_shared.clone().unwrap_or_default();
            self.selector.add(info.id, &info.name, &spec)?;
        }
        let id = info.id;
        self.sub_type = Some(info.sub_type);
        self.members.push(Member { info, permits: 0 });
        Ok(self.update_active(Some(id)))
    }

    /// Detaches a consumer (unknown ids: `UnknownConsumer`); returns
    /// Failover's activity events.
    pub fn remove_consumer(&mut self, id: ConsumerId) -> Result<Vec<Event>, DispatchError> {
        let i = self.idx(id)?;
        self.members.remove(i);
        if i < self.rr_next {
            self.rr_next -= 1;
        }
        if self.rr_next >= self.members.len() {
            self.rr_next = 0;
        }
        self.selector.remove(id);
        if self.members.is_empty() {
            self.sub_type = None;
        }
        Ok(self.update_active(None))
    }

    fn update_active(&mut self, joined: Option<ConsumerId>) -> Vec<Event> {
        let new = match self.sub_type {
            Some(SubType::Failover) => select_active(self.members.iter().map(|m| &m.info)),
            Some(SubType::Exclusive) => self.members.first().map(|m| m.info.id),
            Some(SubType::Shared | SubType::KeyShared) | None => None,
        };
        let failover = self.sub_type == Some(SubType::Failover);
        let mut events = Vec::new();
        if new != self.active {
            self.active = new;
            if failover {
                events.extend(self.members.iter().map(|m| Event::ActiveChanged {
                    consumer: m.info.id,
                    is_active: Some(m.info.id) == new,
                }));
            }
        } else if failover && let Some(j) = joined {
            events.push(Event::ActiveChanged {
                consumer: j,
                is_active: Some(j) == new,
            });
        }
        events
    }

    /// Adds `permits` messages to a consumer's permits.
    pub fn flow(&mut self, id: ConsumerId, permits: u32) -> Result<(), DispatchError> {
        let i = self.idx(id)?;
        let m = &mut self.members[i];
        m.permits = m.permits.saturating_add(i64::from(permits));
        Ok(())
    }

    /// Chooses the consumer of one published entry holding `messages`
    /// messages (a batch takes as many permits; a consumer with at least one
    /// permit takes a batch larger than its permits, as Pulsar does) with
    /// sticky key hash `key_hash` (Key_Shared only).
    pub fn route(&mut self, messages: u32, key_hash: u16) -> Route {
        let messages = i64::from(messages.max(1));
        let chosen = match self.sub_type {
            None => return Route::Drop(DropReason::NoConsumer),
            Some(SubType::Exclusive | SubType::Failover) => match self.active {
                Some(id) => id,
                None => return Route::Drop(DropReason::NoConsumer),
            },
            Some(SubType::KeyShared) => match self.selector.select(key_hash) {
                Some(id) => id,
                None => return Route::Drop(DropReason::NoConsumer),
            },
            Some(SubType::Shared) => {
                let n = self.members.len();
                let found = (0..n)
                    .map(|k| (self.rr_next + k) % n)
                    .find(|&i| self.members[i].permits > 0);
                match found {
                    Some(i) => {
                        self.rr_next = (i + 1) % n;
                        self.members[i].info.id
                    }
                    None => return Route::Drop(DropReason::NoPermits),
                }
            }
        };
        match self.members.iter_mut().find(|m| m.info.id == chosen) {
            Some(m) if m.permits > 0 => {
                m.permits -= messages;
                Route::Deliver(chosen)
            }
            Some(_) => Route::Drop(DropReason::NoPermits),
            None => Route::Drop(DropReason::NoConsumer),
        }
    }

    /// The send to `id` of an entry of `messages` messages did not happen
    /// (its queue was full): its permits are given back.
    pub fn not_sent(&mut self, id: ConsumerId, messages: u32) {
        if let Some(m) = self.members.iter_mut().find(|m| m.info.id == id) {
            m.permits = m.permits.saturating_add(i64::from(messages.max(1)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::{KeySharedMode, KeySharedSpec};

    fn cid(i: u64) -> ConsumerId {
        ConsumerId::new(1, i)
    }

    fn info(i: u64, t: SubType) -> ConsumerInfo {
        ConsumerInfo {
            id: cid(i),
            name: format!("c{i}"),
            priority: 0,
            sub_type: t,
            key_shared: None,
        }
    }

    #[test]
    fn no_consumer_drops() {
        let mut r = Router::new(10);
        assert_eq!(r.route(1, 0), Route::Drop(DropReason::NoConsumer));
    }

    #[test]
    fn exclusive_delivers_while_permits_last_then_drops() {
        let mut r = Router::new(10);
        r.add_consumer(info(1, SubType::Exclusive)).unwrap();
        assert_eq!(r.route(1, 0), Route::Drop(DropReason::NoPermits));
        r.flow(cid(1), 2).unwrap();
        assert_eq!(r.route(1, 0), Route::Deliver(cid(1)));
        assert_eq!(r.route(1, 0), Route::Deliver(cid(1)));
        assert_eq!(r.route(1, 0), Route::Drop(DropReason::NoPermits));
        // A second Exclusive consumer is refused.
        assert!(matches!(
            r.add_consumer(info(2, SubType::Exclusive)),
            Err(DispatchError::ConsumerBusy { .. })
        ));
        // Another type is refused.
        assert!(matches!(
            r.add_consumer(info(3, SubType::Shared)),
            Err(DispatchError::SubTypeMismatch { .. })
        ));
    }

    #[test]
    fn shared_round_robins_over_consumers_with_permits() {
        let mut r = Router::new(10);
        for i in 1..=3 {
            r.add_consumer(info(i, SubType::Shared)).unwrap();
        }
        r.flow(cid(1), 10).unwrap();
        r.flow(cid(3), 10).unwrap();
        let got: Vec<Route> = (0..4).map(|_| r.route(1, 0)).collect();
        assert_eq!(
            got,
            vec![
                Route::Deliver(cid(1)),
                Route::Deliver(cid(3)),
                Route::Deliver(cid(1)),
                Route::Deliver(cid(3)),
            ]
        );
        // Consumer 2 has none: skipped, never chosen; all out -> drop.
        let mut r = Router::new(10);
        r.add_consumer(info(1, SubType::Shared)).unwrap();
        r.add_consumer(info(2, SubType::Shared)).unwrap();
        r.flow(cid(2), 1).unwrap();
        assert_eq!(r.route(1, 0), Route::Deliver(cid(2)));
        assert_eq!(r.route(1, 0), Route::Drop(DropReason::NoPermits));
    }

    #[test]
    fn a_batch_takes_its_messages_in_permits() {
        let mut r = Router::new(10);
        r.add_consumer(info(1, SubType::Shared)).unwrap();
        r.flow(cid(1), 3).unwrap();
        assert_eq!(r.route(5, 0), Route::Deliver(cid(1)));
        assert_eq!(r.permits(cid(1)), Some(-2));
        assert_eq!(r.route(1, 0), Route::Drop(DropReason::NoPermits));
    }

    #[test]
    fn not_sent_gives_permits_back() {
        let mut r = Router::new(10);
        r.add_consumer(info(1, SubType::Exclusive)).unwrap();
        r.flow(cid(1), 1).unwrap();
        assert_eq!(r.route(1, 0), Route::Deliver(cid(1)));
        r.not_sent(cid(1), 1);
        assert_eq!(r.permits(cid(1)), Some(1));
    }

    #[test]
    fn failover_sends_to_the_active_consumer_only() {
        let mut r = Router::new(10);
        let ev = r.add_consumer(info(2, SubType::Failover)).unwrap();
        assert_eq!(
            ev,
            vec![Event::ActiveChanged {
                consumer: cid(2),
                is_active: true
            }]
        );
        // "c1" sorts first: it becomes active, both are told.
        let ev = r.add_consumer(info(1, SubType::Failover)).unwrap();
        assert_eq!(ev.len(), 2);
        r.flow(cid(1), 1).unwrap();
        r.flow(cid(2), 5).unwrap();
        assert_eq!(r.route(1, 0), Route::Deliver(cid(1)));
        // The active one is out of permits: dropped, not given to the other.
        assert_eq!(r.route(1, 0), Route::Drop(DropReason::NoPermits));
        r.remove_consumer(cid(1)).unwrap();
        assert_eq!(r.route(1, 0), Route::Deliver(cid(2)));
    }

    #[test]
    fn key_shared_sends_a_key_to_its_owner() {
        let mut r = Router::new(10);
        for i in 1..=2 {
            let mut c = info(i, SubType::KeyShared);
            c.key_shared = Some(KeySharedSpec {
                mode: KeySharedMode::Sticky,
                ranges: vec![crate::dispatch::HashRange {
                    start: if i == 1 { 0 } else { 32_768 },
                    end: if i == 1 { 32_767 } else { 65_535 },
                }],
                allow_out_of_order: false,
            });
            r.add_consumer(c).unwrap();
            r.flow(cid(i), 10).unwrap();
        }
        assert_eq!(r.route(1, 5), Route::Deliver(cid(1)));
        assert_eq!(r.route(1, 40_000), Route::Deliver(cid(2)));
        r.remove_consumer(cid(2)).unwrap();
        assert_eq!(r.route(1, 40_000), Route::Drop(DropReason::NoConsumer));
    }

    #[test]
    fn consumers_max_is_enforced_and_removal_resets_type() {
        let mut r = Router::new(1);
        r.add_consumer(info(1, SubType::Shared)).unwrap();
        assert!(matches!(
            r.add_consumer(info(2, SubType::Shared)),
            Err(DispatchError::TooManyConsumers { max: 1 })
        ));
        r.remove_consumer(cid(1)).unwrap();
        assert!(r.is_empty());
        assert_eq!(r.sub_type(), None);
        r.add_consumer(info(3, SubType::Exclusive)).unwrap();
        assert!(matches!(
            r.remove_consumer(cid(9)),
            Err(DispatchError::UnknownConsumer(_))
        ));
    }
}
