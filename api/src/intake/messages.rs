//! The messages the intake produces (SPEC §3). Each is owned by the function that consumes
//! it, so producer and consumer share one definition and cannot drift apart.

pub use paybus_confirm_deposit::DepositTxConfirmed;
pub use paybus_confirm_withdrawal::WithdrawalTxConfirmed;

#[cfg(test)]
mod tests {
    use paybus_platform::bus::Envelope;
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
