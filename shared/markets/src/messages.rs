//! The message of W4 (docs/bus.md): the materialiser produces it with each chunk of tasks, the due
//! sweep re-produces it for tasks whose retry is due, cancel-orders consumes it.

use paybus_bus::Message;
use serde::{Deserialize, Serialize};

/// `market.cancel_tasks.created {batch_id, task_ids}`: these PENDING tasks of the batch are
/// ready to be cancelled. A small group per message (see [`crate::materialise`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelTasksCreated {
    pub batch_id: u64,
    pub task_ids: Vec<u64>,
}

impl Message for CancelTasksCreated {
    const TYPE: &'static str = "market.cancel_tasks.created";

    /// The group's first task: a suspension's chunks spread over the shards (keyed by the
    /// batch, a whole market's cancels would sit on one).
    fn shard_key(&self) -> Option<String> {
        self.task_ids.first().map(|task| task.to_string())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use paybus_bus::Envelope;
    use serde_json::json;

    use super::*;

    #[test]
    fn the_envelope_carries_the_spec_type_and_fields() {
        let message = Envelope::new(CancelTasksCreated {
            batch_id: 7,
            task_ids: vec![1, 2, 3],
        })
        .to_outgoing()
        .unwrap();
        assert_eq!(message.routing_key, "market.cancel_tasks.created");
        let body: serde_json::Value = serde_json::from_slice(&message.body).unwrap();
        assert_eq!(body["data"], json!({"batch_id": 7, "task_ids": [1, 2, 3]}));
    }
}
