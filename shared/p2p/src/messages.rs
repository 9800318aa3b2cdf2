//! W1's message (docs/bus.md). The create API produces it when async matching is on; match-deposit
//! consumes it. Both use this definition.

use paybus_bus::Message;
use serde::{Deserialize, Serialize};

/// `p2p.deposit_order.created {deposit_order_id}`: a PENDING deposit order waits to be matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepositOrderCreated {
    pub deposit_order_id: u64,
}

impl Message for DepositOrderCreated {
    const TYPE: &'static str = "p2p.deposit_order.created";

    /// Every message about one order goes to the same shard.
    fn shard_key(&self) -> Option<String> {
        Some(self.deposit_order_id.to_string())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use paybus_bus::Envelope;

    use super::*;

    #[test]
    fn the_envelope_carries_the_spec_type_and_field() {
        let outgoing = Envelope::new(DepositOrderCreated {
            deposit_order_id: 42,
        })
        .to_outgoing()
        .unwrap();
        assert_eq!(outgoing.routing_key, "p2p.deposit_order.created");
        let body: serde_json::Value = serde_json::from_slice(&outgoing.body).unwrap();
        assert_eq!(body["data"], serde_json::json!({"deposit_order_id": 42}));
    }
}
