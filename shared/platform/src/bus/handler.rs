//! What a function is: a handler from a typed message to an [`Outcome`], and the pure step
//! that turns one delivery into a [`Disposition`] (ack, dead-letter or requeue), whichever way
//! the delivery arrived (a local consumer or a Lambda event).

use std::{future::Future, time::Duration};

use lapin::{
    BasicProperties,
    types::{AMQPValue, FieldTable},
};
use tokio::time::Instant;
use tracing::Instrument;

use super::{
    envelope::{Envelope, EnvelopeHead, Message},
    metrics,
    outbox::{Outbox, OutboxError},
    topology::{DELIVERY_LIMIT, FunctionQueue},
};

/// What a handler made of a message. Every variant ends the delivery (it is acked); only an
/// `Err(HandlerError)` puts it back on the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The work is done and committed.
    Done,
    /// Nothing to do: a duplicate, or no longer needed (principle 7). Not a failure.
    Skipped(String),
    /// Not done yet; the handler has recorded the retry (attempts, next attempt time, last
    /// error) in its own rows, and a sweeper re-publishes it when due (principle 9).
    Retry { after: Duration, error: String },
    /// Terminal: the message becomes a dead letter with this reason.
    Failed(String),
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Skipped(_) => "skipped",
            Outcome::Retry { .. } => "retry",
            Outcome::Failed(_) => "failed",
        }
    }
}

/// An infrastructure fault (database unreachable, deadlock, broker error): the message is
/// requeued and tried again. Business failures are [`Outcome`]s, not errors.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("outbox: {0}")]
    Outbox(#[from] OutboxError),
    #[error("{0}")]
    Infrastructure(String),
}

/// What a handler gets besides its message.
pub struct Context<'a> {
    /// Opens transactions (`ctx.outbox.begin()`) and reaches the pool.
    pub outbox: &'a Outbox,
    /// 1 on the first delivery, counting broker redeliveries.
    pub attempt: u32,
}

/// One workflow step. `handle` must be idempotent: a message can arrive twice, even twice at
/// the same moment.
pub trait Handler: Send + Sync + 'static {
    type Message: Message;
    /// The function's name: its queue is `paybus.<FUNCTION>`.
    const FUNCTION: &'static str;

    fn handle(
        &self,
        message: Envelope<Self::Message>,
        ctx: &Context<'_>,
    ) -> impl Future<Output = Result<Outcome, HandlerError>> + Send;

    fn queue() -> FunctionQueue {
        FunctionQueue {
            function: Self::FUNCTION,
            routing_key: <Self::Message as Message>::TYPE,
        }
    }
}

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
}

pub fn header_integer(headers: Option<&FieldTable>, name: &str) -> Option<i64> {
    match headers?.inner().get(name)? {
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongLongInt(n) => Some(*n),
        _ => None,
    }
}

pub fn header_text(headers: Option<&FieldTable>, name: &str) -> Option<String> {
    match headers?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

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
    /// The handler said so (`Outcome::Failed`).
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

/// The pause before a requeue: the database or broker is struggling, so back off instead of
/// spinning through the delivery limit (250 ms doubling, at most 30 s).
pub fn requeue_backoff(delivery_count: u32) -> Duration {
    let exp = delivery_count.min(7);
    Duration::from_millis(250 * (1u64 << exp)).min(Duration::from_secs(30))
}

/// Decodes, dispatches and classifies one delivery. Logs one line and counts one metric.
pub async fn process<H: Handler>(
    handler: &H,
    outbox: &Outbox,
    delivery: &IncomingDelivery,
) -> Disposition {
    let started = Instant::now();
    let delivery_count = delivery.delivery_count();
    let attempt = delivery_count + 1;
    let head = match serde_json::from_slice::<EnvelopeHead>(&delivery.body) {
        Ok(head) => head,
        Err(e) => {
            return finish::<H>(
                delivery,
                None,
                started,
                attempt,
                Disposition::DeadLetter(DeadLetter {
                    reason: DeadLetterReason::Malformed,
                    error: format!("not a paybus envelope: {e}"),
                }),
                "malformed",
                Some(e.to_string()),
            );
        }
    };
    if head.kind != <H::Message as Message>::TYPE {
        let error = format!(
            "{} handles {:?}, not {:?}",
            H::FUNCTION,
            <H::Message as Message>::TYPE,
            head.kind
        );
        return finish::<H>(
            delivery,
            Some(&head),
            started,
            attempt,
            Disposition::DeadLetter(DeadLetter {
                reason: DeadLetterReason::UnknownType,
                error: error.clone(),
            }),
            "unknown_type",
            Some(error),
        );
    }
    let envelope = match serde_json::from_slice::<Envelope<H::Message>>(&delivery.body) {
        Ok(envelope) => envelope,
        Err(e) => {
            return finish::<H>(
                delivery,
                Some(&head),
                started,
                attempt,
                Disposition::DeadLetter(DeadLetter {
                    reason: DeadLetterReason::Malformed,
                    error: format!("data does not fit {}: {e}", head.kind),
                }),
                "malformed",
                Some(e.to_string()),
            );
        }
    };
    let span = tracing::info_span!(
        "message",
        function = H::FUNCTION,
        message_id = %head.id,
        correlation_id = %head.correlation_id,
        attempt,
    );
    let ctx = Context { outbox, attempt };
    let result = handler.handle(envelope, &ctx).instrument(span).await;
    let (disposition, label, detail) = match result {
        Ok(outcome) => {
            let label = outcome.label();
            match outcome {
                Outcome::Done => (Disposition::Ack, label, None),
                Outcome::Skipped(reason) => (Disposition::Ack, label, Some(reason)),
                Outcome::Retry { after, error } => (
                    Disposition::Ack,
                    label,
                    Some(format!("retry in {after:?}: {error}")),
                ),
                Outcome::Failed(error) => (
                    Disposition::DeadLetter(DeadLetter {
                        reason: DeadLetterReason::Failed,
                        error: error.clone(),
                    }),
                    label,
                    Some(error),
                ),
            }
        }
        // The runtime dead-letters on the last allowed delivery itself, so the reason and the
        // error are recorded instead of the broker's bare "delivery limit".
        Err(error) if attempt >= DELIVERY_LIMIT.unsigned_abs() => {
            let error = format!("{attempt} deliveries, last error: {error}");
            (
                Disposition::DeadLetter(DeadLetter {
                    reason: DeadLetterReason::DeliveryLimit,
                    error: error.clone(),
                }),
                "dead_lettered",
                Some(error),
            )
        }
        Err(error) => (
            Disposition::Requeue {
                after: requeue_backoff(delivery_count),
                error: error.to_string(),
            },
            "requeued",
            Some(error.to_string()),
        ),
    };
    finish::<H>(
        delivery,
        Some(&head),
        started,
        attempt,
        disposition,
        label,
        detail,
    )
}

/// The one log line and the metric of a delivery.
fn finish<H: Handler>(
    delivery: &IncomingDelivery,
    head: Option<&EnvelopeHead>,
    started: Instant,
    attempt: u32,
    disposition: Disposition,
    outcome: &'static str,
    detail: Option<String>,
) -> Disposition {
    let elapsed = started.elapsed();
    metrics::record(H::FUNCTION, outcome, elapsed);
    let message_id = head
        .map(|h| h.id.to_string())
        .or_else(|| delivery.message_id())
        .unwrap_or_default();
    let correlation_id = head
        .map(|h| h.correlation_id.to_string())
        .unwrap_or_default();
    let detail = detail.unwrap_or_default();
    let duration_ms = elapsed.as_secs_f64() * 1000.0;
    match &disposition {
        Disposition::Ack => tracing::info!(
            function = H::FUNCTION, %message_id, %correlation_id, outcome, attempt,
            duration_ms, routing_key = %delivery.routing_key, detail, "message processed"
        ),
        Disposition::DeadLetter(_) | Disposition::Requeue { .. } => tracing::warn!(
            function = H::FUNCTION, %message_id, %correlation_id, outcome, attempt,
            duration_ms, routing_key = %delivery.routing_key, detail, "message processed"
        ),
    }
    disposition
}
