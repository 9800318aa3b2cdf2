//! Deliveries in flight per partner, in this process: one endpoint may hold at most its share
//! of the consumer. Black-box testing found 80 notifications to an endpoint that never
//! answered filling the whole prefetch, so every other partner's webhooks waited the full
//! timeout at every retry round.
//!
//! A delivery that finds its partner at the bound is not attempted: the handler defers it
//! (no attempt counted) and frees its prefetch slot at once.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

/// The bound, shared by the handler's clones.
#[derive(Debug, Clone)]
pub struct Bulkhead {
    limit: usize,
    in_flight: Arc<Mutex<HashMap<u64, usize>>>,
}

/// One delivery in flight to a partner; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    bulkhead: Bulkhead,
    partner_id: u64,
}

impl Bulkhead {
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            in_flight: Arc::default(),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A slot for `partner_id`, or `None` when it has `limit` deliveries in flight already.
    pub fn try_enter(&self, partner_id: u64) -> Option<Slot> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let count = in_flight.entry(partner_id).or_default();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Slot {
            bulkhead: self.clone(),
            partner_id,
        })
    }

    /// Deliveries in flight to `partner_id` now.
    pub fn in_flight(&self, partner_id: u64) -> usize {
        let in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        in_flight.get(&partner_id).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut in_flight = self
            .bulkhead
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(count) = in_flight.get_mut(&self.partner_id) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&self.partner_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_partner_gets_at_most_its_share() {
        let bulkhead = Bulkhead::new(2);
        let a1 = bulkhead.try_enter(1);
        let a2 = bulkhead.try_enter(1);
        assert!(a1.is_some() && a2.is_some());
        assert!(bulkhead.try_enter(1).is_none(), "partner 1 is at its bound");
        assert!(
            bulkhead.try_enter(2).is_some(),
            "partner 2 is not held by partner 1"
        );
        drop(a1);
        assert_eq!(bulkhead.in_flight(1), 1);
        assert!(
            bulkhead.try_enter(1).is_some(),
            "a finished delivery frees its slot"
        );
    }
}
