//! The messages of W2 (docs/bus.md). Producer (the chain-monitor intake) and consumers (the
//! confirm functions) share these definitions, so they cannot drift apart.

use paybus_bus::Message;
use serde::{Deserialize, Serialize};

/// `withdrawal.tx_confirmed`: the chain monitor saw the withdrawal's transaction confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WithdrawalTxConfirmed {
    pub withdrawal_id: u64,
    pub tx_hash: String,
}

impl Message for WithdrawalTxConfirmed {
    const TYPE: &'static str = "withdrawal.tx_confirmed";

    /// The withdrawal: its confirmations (and the chain monitor's re-sends) meet on one shard.
    fn shard_key(&self) -> Option<String> {
        Some(self.withdrawal_id.to_string())
    }
}

/// `deposit.tx_confirmed`: the chain monitor saw the deposit's transaction confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepositTxConfirmed {
    pub deposit_id: u64,
}

impl Message for DepositTxConfirmed {
    const TYPE: &'static str = "deposit.tx_confirmed";

    fn shard_key(&self) -> Option<String> {
        Some(self.deposit_id.to_string())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use paybus_bus::Envelope;
    use serde_json::json;

    use super::*;

    #[test]
    fn envelopes_carry_the_spec_types_and_fields() {
        let w = Envelope::new(WithdrawalTxConfirmed {
            withdrawal_id: 1989,
            tx_hash: "0xabc".into(),
        })
        .to_outgoing()
        .unwrap();
        assert_eq!(w.routing_key, "withdrawal.tx_confirmed");
        let body: serde_json::Value = serde_json::from_slice(&w.body).unwrap();
        assert_eq!(
            body["data"],
            json!({"withdrawal_id": 1989, "tx_hash": "0xabc"})
        );

        let d = Envelope::new(DepositTxConfirmed { deposit_id: 7 })
            .to_outgoing()
            .unwrap();
        assert_eq!(d.routing_key, "deposit.tx_confirmed");
        let body: serde_json::Value = serde_json::from_slice(&d.body).unwrap();
        assert_eq!(body["data"], json!({"deposit_id": 7}));
    }
}
