//! The message of W3 (docs/bus.md). The payment completion (and ops' retry) produce it, grant-bonus
//! consumes it; both use this one definition.

use paybus_bus::Message;
use serde::{Deserialize, Serialize};

/// `charge.bonus_job.created {job_id}`: a bonus job is PENDING and due; grant-bonus makes the
/// immediate attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BonusJobCreated {
    pub job_id: u64,
}

impl Message for BonusJobCreated {
    const TYPE: &'static str = "charge.bonus_job.created";

    fn shard_key(&self) -> Option<String> {
        Some(self.job_id.to_string())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use paybus_bus::Envelope;

    use super::*;

    #[test]
    fn the_envelope_carries_the_spec_type_and_field() {
        let message = Envelope::new(BonusJobCreated { job_id: 7 })
            .to_outgoing()
            .unwrap();
        assert_eq!(message.routing_key, "charge.bonus_job.created");
        let body: serde_json::Value = serde_json::from_slice(&message.body).unwrap();
        assert_eq!(body["data"], serde_json::json!({"job_id": 7}));
    }
}
