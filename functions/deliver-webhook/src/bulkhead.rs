//! Deliveries in flight per partner, in this process: one endpoint may hold at most its share
//! of the consumer. Without it, 80 notifications to an endpoint that never answers fill the
//! whole prefetch, and every other partner's webhooks wait the full timeout at every retry
//! round.
//!
//! A delivery waits a moment for its partner's slot (a healthy partner answers in
//! milliseconds, so a burst just queues briefly); when none frees in time, the handler defers
//! it (no attempt counted) and its prefetch slot is free at once for other partners.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The per-partner bounds, shared by the handler's clones.
#[derive(Debug, Clone)]
pub struct Bulkhead {
    limit: usize,
    partners: Arc<Mutex<HashMap<u64, Arc<Semaphore>>>>,
}

/// One delivery in flight to a partner; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    /// The slot was not free at once: the partner's state may have moved meanwhile.
    pub waited: bool,
}

impl Bulkhead {
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            partners: Arc::default(),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    fn semaphore(&self, partner_id: u64) -> Arc<Semaphore> {
        let mut partners = self.partners.lock().unwrap_or_else(|p| p.into_inner());
        partners
            .entry(partner_id)
            .or_insert_with(|| Arc::new(Semaphore::new(self.limit)))
            .clone()
    }

    /// A slot for `partner_id` within `wait`, or `None` when its deliveries in flight stay at
    /// the bound that long.
    pub async fn enter(&self, partner_id: u64, wait: Duration) -> Option<Slot> {
        let semaphore = self.semaphore(partner_id);
        if let Ok(permit) = semaphore.clone().try_acquire_owned() {
            return Some(Slot {
                _permit: permit,
                waited: false,
            });
        }
        match tokio::time::timeout(wait, semaphore.acquire_owned()).await {
            Ok(Ok(permit)) => Some(Slot {
                _permit: permit,
                waited: true,
            }),
            _ => None,
        }
    }

    /// Deliveries in flight to `partner_id` now.
    pub fn in_flight(&self, partner_id: u64) -> usize {
        self.limit - self.semaphore(partner_id).available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_WAIT: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn each_partner_gets_at_most_its_share() {
        let bulkhead = Bulkhead::new(2);
        let a1 = bulkhead.enter(1, NO_WAIT).await;
        let a2 = bulkhead.enter(1, NO_WAIT).await;
        assert!(a1.is_some() && a2.is_some());
        assert!(
            bulkhead.enter(1, NO_WAIT).await.is_none(),
            "partner 1 is at its bound"
        );
        assert!(
            bulkhead.enter(2, NO_WAIT).await.is_some(),
            "partner 2 is not held by partner 1"
        );
        drop(a1);
        assert_eq!(bulkhead.in_flight(1), 1);
        assert!(
            bulkhead.enter(1, NO_WAIT).await.is_some(),
            "a finished delivery frees its slot"
        );
    }

    #[tokio::test]
    async fn a_delivery_waits_briefly_for_a_slot_that_frees() {
        let bulkhead = Bulkhead::new(1);
        let first = bulkhead.enter(7, NO_WAIT).await;
        let waiter = {
            let bulkhead = bulkhead.clone();
            tokio::spawn(async move { bulkhead.enter(7, Duration::from_secs(5)).await.is_some() })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(first);
        assert!(waiter.await.unwrap_or(false));
    }
}
