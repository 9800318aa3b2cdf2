//! One delivery as the runtime sees it, whichever transport brought it (a local consumer or a
//! Lambda event), and what the transport must do with it ([`Disposition`]). A [`Processor`]
//! turns the first into the second: every function's handler (through
//! `handler::HandlerProcessor`) and the dead-letter recorder are processors.

use std::{future::Future, time::Duration};

use lapin::BasicProperties;

use super::headers::header_integer;
use paybus_retry::Backoff;

/// A delivery as the runtime sees it, whichever way it arrived.
#[derive(Debug, Clone)]
pub struct IncomingDelivery {
    pub body: Vec<u8>,
    pub routing_key: String,
    pub properties: BasicProperties,
}

impl IncomingDelivery {
    /// Earlier deliveries of this message (RabbitMQ's quorum queues count them in
    /// `x-delivery-count`; absent on the first delivery).
    pub fn delivery_count(&self) -> u32 {
        header_integer(self.properties.headers().as_ref(), "x-delivery-count")
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0)
    }

    pub fn message_id(&self) -> Option<String> {
        self.properties.message_id().as_ref().map(|s| s.to_string())
    }

    /// The pause before this delivery goes back to the queue after an infrastructure fault.
    pub fn requeue_after(&self) -> Duration {
        REQUEUE_BACKOFF.delay(self.delivery_count())
    }
}

/// The pause before a requeue: the database or broker is struggling, so back off instead of
/// spinning through the delivery limit (250 ms doubling, at most 30 s).
pub const REQUEUE_BACKOFF: Backoff =
    Backoff::exponential(Duration::from_millis(250), Duration::from_secs(30));

/// Why a message becomes a dead letter (`x-paybus-reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub reason: DeadLetterReason,
    pub error: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// The body is not a paybus envelope, or its data does not fit the type.
    Malformed,
    /// The envelope's type is not what this function handles.
    UnknownType,
    /// The handler said so (`Outcome::Failed`), or its error can never succeed on a retry
    /// (a constraint violation, bad data).
    Failed,
    /// Infrastructure errors on every one of the allowed deliveries.
    DeliveryLimit,
}

impl DeadLetterReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Malformed => "malformed",
            DeadLetterReason::UnknownType => "unknown_type",
            DeadLetterReason::Failed => "failed",
            DeadLetterReason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// What the transport must do with a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Ack: the outcome is committed (or there was nothing to do).
    Ack,
    /// Publish a dead letter (confirmed), then ack.
    DeadLetter(DeadLetter),
    /// Put it back after a pause: an infrastructure fault.
    Requeue { after: Duration, error: String },
}

/// Turns a delivery into a disposition.
pub trait Processor: Send + Sync + 'static {
    /// The function this processor belongs to (its dead letters are routed by it).
    fn function(&self) -> &str;
    fn queue(&self) -> String;
    fn process(&self, delivery: &IncomingDelivery) -> impl Future<Output = Disposition> + Send;

    /// The most deliveries [`Processor::process_batch`] takes at once; 1 = one at a time.
    fn max_batch(&self) -> usize {
        1
    }

    /// One disposition per delivery, in order. The default processes them one by one.
    fn process_batch(
        &self,
        deliveries: &[IncomingDelivery],
    ) -> impl Future<Output = Vec<Disposition>> + Send {
        async move {
            let mut dispositions = Vec::with_capacity(deliveries.len());
            for delivery in deliveries {
                dispositions.push(self.process(delivery).await);
            }
            dispositions
        }
    }
}
