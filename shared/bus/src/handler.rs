//! What a function is: a handler from a typed message to an [`Outcome`], and the pure step
//! that turns one delivery into a [`Disposition`] (ack, dead-letter or requeue), whichever way
//! the delivery arrived (a local consumer or a Lambda event).

use std::{collections::HashMap, future::Future, sync::Arc, time::Duration};

use tokio::time::Instant;
use tracing::Instrument;

use super::{
    delivery::{DeadLetter, DeadLetterReason, Disposition, IncomingDelivery, Processor},
    envelope::{self, Envelope, EnvelopeHead, Message},
    held, metrics,
    outbox::{Outbox, OutboxError},
    skips,
    topology::{DELIVERY_LIMIT, FunctionQueue},
};
use paybus_db as db;
use paybus_telemetry::{TraceHeaders, propagation};

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

/// A handler that could not reach an outcome. [`HandlerError::is_transient`] is the one place
/// errors are classified: a transient fault (database unreachable, deadlock, broker error) is
/// requeued and tried again; anything else (a constraint violation, a value that does not fit,
/// bad data) can never succeed and is dead-lettered at once instead of burning the delivery
/// limit. Business failures are [`Outcome`]s, not errors.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("outbox: {0}")]
    Outbox(#[from] OutboxError),
    /// The message can never be applied as it is (bad data, a refused posting).
    #[error("{0}")]
    Rejected(Box<dyn std::error::Error + Send + Sync>),
}

impl HandlerError {
    /// A domain error that no retry can fix.
    pub fn rejected(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        HandlerError::Rejected(error.into())
    }

    /// Whether trying the same message again can succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            HandlerError::Database(e) | HandlerError::Outbox(OutboxError::Database(e)) => {
                db::is_transient(e)
            }
            HandlerError::Outbox(OutboxError::Serialise(_)) | HandlerError::Rejected(_) => false,
        }
    }

    /// What a handler that hit this error answers: a transient error stays an error (the
    /// message is requeued), anything else is `Failed` (a dead letter with this text).
    pub fn into_outcome(self) -> Result<Outcome, HandlerError> {
        if self.is_transient() {
            Err(self)
        } else {
            Ok(Outcome::Failed(self.to_string()))
        }
    }
}

/// What a handler gets besides its message.
pub struct Context<'a> {
    /// The database: `ctx.db.begin()` opens a unit of work (a transaction whose messages go
    /// out through the outbox once it commits), `ctx.db.pool()` reaches the pool.
    pub db: &'a Outbox,
    /// 1 on the first delivery, counting broker redeliveries.
    pub attempt: u32,
}

/// One message of a batch, with its delivery attempt (1 on the first delivery).
pub struct Batched<M> {
    pub message: Envelope<M>,
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

    /// The most messages [`Handler::handle_batch`] takes at once. 1 (the default): every
    /// message is handled on its own and `handle_batch` is never called.
    const MAX_BATCH: usize = 1;

    /// Several messages at once, one result per message in the same order. For handlers whose
    /// messages can share a transaction and set-based statements; the runtime batches only
    /// what the broker has already delivered, it never waits to fill a batch. Whatever a batch
    /// does, each message's outcome must be the one `handle` would have given it. The default
    /// handles them one by one.
    fn handle_batch(
        &self,
        messages: Vec<Batched<Self::Message>>,
        outbox: &Outbox,
    ) -> impl Future<Output = Vec<Result<Outcome, HandlerError>>> + Send {
        async move {
            let mut results = Vec::with_capacity(messages.len());
            for Batched { message, attempt } in messages {
                results.push(
                    self.handle(
                        message,
                        &Context {
                            db: outbox,
                            attempt,
                        },
                    )
                    .await,
                );
            }
            results
        }
    }

    /// The function's queue, unsharded (a layout's [`Shards`](paybus_config::Shards) give
    /// its shards).
    fn queue() -> FunctionQueue {
        FunctionQueue::new(Self::FUNCTION, <Self::Message as Message>::TYPE)
    }
}

/// A delivery that never reaches the handler: its disposition is decided by decoding.
struct Undecodable {
    head: Option<Box<EnvelopeHead>>,
    disposition: Disposition,
    outcome: &'static str,
    detail: String,
    /// Newer than this release knows: held ([`held`]) before its ack.
    newer: bool,
}

/// The delivery's envelope for `H`, or why it cannot be one.
fn decode<H: Handler>(
    delivery: &IncomingDelivery,
) -> Result<(EnvelopeHead, Envelope<H::Message>), Undecodable> {
    let dead =
        |head: Option<EnvelopeHead>, reason, outcome, error: String, detail: String| Undecodable {
            head: head.map(Box::new),
            disposition: Disposition::DeadLetter(DeadLetter { reason, error }),
            outcome,
            detail,
            newer: false,
        };
    let head = serde_json::from_slice::<EnvelopeHead>(&delivery.body).map_err(|e| {
        dead(
            None,
            DeadLetterReason::Malformed,
            "malformed",
            format!("not a paybus envelope: {e}"),
            e.to_string(),
        )
    })?;
    if head.kind != <H::Message as Message>::TYPE {
        let error = format!(
            "{} handles {:?}, not {:?}",
            H::FUNCTION,
            <H::Message as Message>::TYPE,
            head.kind
        );
        return Err(dead(
            Some(head),
            DeadLetterReason::UnknownType,
            "unknown_type",
            error.clone(),
            error,
        ));
    }
    let known = <H::Message as Message>::VERSION;
    if head.version > known
        && serde_json::from_slice::<Envelope<serde_json::Value>>(&delivery.body).is_ok()
    {
        let detail = format!(
            "version {} of {}, newer than this release reads ({known}): held",
            head.version, head.kind
        );
        return Err(Undecodable {
            head: Some(Box::new(head)),
            disposition: Disposition::Ack,
            outcome: "held",
            detail,
            newer: true,
        });
    }
    match serde_json::from_slice::<Envelope<H::Message>>(&delivery.body) {
        Ok(envelope) => Ok((head, envelope)),
        Err(e) => {
            let error = format!("data does not fit {}: {e}", head.kind);
            Err(dead(
                Some(head),
                DeadLetterReason::Malformed,
                "malformed",
                error,
                e.to_string(),
            ))
        }
    }
}

/// Decodes, dispatches and classifies one delivery. Logs one line and counts one metric.
pub async fn process<H: Handler>(
    handler: &H,
    outbox: &Outbox,
    delivery: &IncomingDelivery,
) -> Disposition {
    let started = Instant::now();
    let attempt = delivery.delivery_count() + 1;
    let (head, envelope) = match decode::<H>(delivery) {
        Ok(decoded) => decoded,
        Err(undecodable) => {
            return finish_undecodable::<H>(outbox, delivery, started, attempt, undecodable).await;
        }
    };
    let span = delivery_span::<H>(&head, delivery, attempt);
    delivery_trace::follow(&span, delivery, attempt);
    let ctx = Context {
        db: outbox,
        attempt,
    };
    let result = handler
        .handle(envelope, &ctx)
        .instrument(span.clone())
        .await;
    let (disposition, skip) = conclude::<H>(&span, delivery, &head, started, attempt, result);
    if let Some(skip) = skip {
        skips::record(outbox.pool(), H::FUNCTION, &[skip]).await;
    }
    disposition
}

/// Classifies a decoded delivery's result, then logs and counts it in the delivery's span;
/// the skip it is, if it is one, for the caller to record.
fn conclude<H: Handler>(
    span: &tracing::Span,
    delivery: &IncomingDelivery,
    head: &EnvelopeHead,
    started: Instant,
    attempt: u32,
    result: Result<Outcome, HandlerError>,
) -> (Disposition, Option<skips::Skip>) {
    let (disposition, label, detail) = classify(result, attempt, delivery);
    let skip = skipped(delivery, head, label, detail.as_deref());
    span.record("outcome", label);
    let disposition = span.in_scope(|| {
        finish::<H>(
            delivery,
            Some(head),
            started,
            attempt,
            disposition,
            label,
            detail,
        )
    });
    (disposition, skip)
}

/// The span of one delivery, with the OpenTelemetry messaging conventions' names (`otel.*`
/// fields are tracing-opentelemetry's span name and kind). In a batch each delivery has its
/// own, in its message's trace, beside the batch's span ([`batch_span`]).
fn delivery_span<H: Handler>(
    head: &EnvelopeHead,
    delivery: &IncomingDelivery,
    attempt: u32,
) -> tracing::Span {
    tracing::info_span!(
        "message",
        otel.name = format!("process {}", H::FUNCTION),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "process",
        messaging.destination.name = %delivery.routing_key,
        messaging.message.id = %head.id,
        function = H::FUNCTION,
        message_id = %head.id,
        correlation_id = %head.correlation_id,
        // Integers, as the conventions type them: tracing-opentelemetry exports an unsigned
        // field as its text.
        attempt = i64::from(attempt),
        outcome = tracing::field::Empty,
    )
}

/// The span of a batch's handling: the one transaction and the statements its messages share.
/// A trace of its own, linked to each message's producer, while each message's delivery span
/// (linked to this one) stays in its message's trace with its own outcome.
fn batch_span<H: Handler>(size: usize) -> tracing::Span {
    tracing::info_span!(
        "batch",
        otel.name = format!("process {} batch", H::FUNCTION),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "process",
        messaging.batch.message_count = i64::try_from(size).unwrap_or(i64::MAX),
        function = H::FUNCTION,
    )
}

/// Decodes every delivery and hands the decodable ones to [`Handler::handle_batch`] at once
/// (or to `handle`, when only one is left); one disposition per delivery, in order, each
/// logged and counted as [`process`] does.
pub async fn process_batch<H: Handler>(
    handler: &H,
    outbox: &Outbox,
    deliveries: &[IncomingDelivery],
) -> Vec<Disposition> {
    if deliveries.len() == 1 {
        return vec![process(handler, outbox, &deliveries[0]).await];
    }
    let started = Instant::now();
    let mut dispositions: Vec<Option<Disposition>> = vec![None; deliveries.len()];
    let mut decoded = Vec::with_capacity(deliveries.len());
    for (index, delivery) in deliveries.iter().enumerate() {
        let attempt = delivery.delivery_count() + 1;
        match decode::<H>(delivery) {
            Ok((head, message)) => decoded.push((index, head, Batched { message, attempt })),
            Err(undecodable) => {
                dispositions[index] = Some(
                    finish_undecodable::<H>(outbox, delivery, started, attempt, undecodable).await,
                );
            }
        }
    }
    if let [(index, _, _)] = decoded[..] {
        dispositions[index] = Some(process(handler, outbox, &deliveries[index]).await);
    } else if !decoded.is_empty() {
        let (heads, messages): (Vec<_>, Vec<_>) = decoded
            .into_iter()
            .map(|(index, head, batched)| ((index, head, batched.attempt), batched))
            .unzip();
        let batch = batch_span::<H>(heads.len());
        let mut causes = HashMap::with_capacity(heads.len());
        let spans: Vec<tracing::Span> = heads
            .iter()
            .map(|(index, head, attempt)| {
                let delivery = &deliveries[*index];
                let span = delivery_span::<H>(head, delivery, *attempt);
                delivery_trace::follow(&span, delivery, *attempt);
                delivery_trace::link(&batch, delivery);
                propagation::link_to_span(&span, &batch);
                causes
                    .entry(head.correlation_id)
                    .or_insert_with(|| TraceHeaders::of_span(&span));
                span
            })
            .collect();
        let mut results = propagation::within_batch(causes, handler.handle_batch(messages, outbox))
            .instrument(batch.clone())
            .await;
        if results.len() != heads.len() {
            // A handler bug; requeueing lets the messages go through again rather than guess.
            let error = format!(
                "{} returned {} results for a batch of {}",
                H::FUNCTION,
                results.len(),
                heads.len()
            );
            tracing::error!(function = H::FUNCTION, %error, "batch results do not match");
            results = heads
                .iter()
                .map(|_| Err(HandlerError::rejected(error.clone())))
                .collect();
        }
        let mut skipped_here = Vec::new();
        for (((index, head, attempt), result), span) in heads.into_iter().zip(results).zip(spans) {
            let delivery = &deliveries[index];
            let (disposition, skip) =
                conclude::<H>(&span, delivery, &head, started, attempt, result);
            skipped_here.extend(skip);
            dispositions[index] = Some(disposition);
        }
        skips::record(outbox.pool(), H::FUNCTION, &skipped_here).await;
    }
    dispositions
        .into_iter()
        .map(|disposition| {
            disposition.unwrap_or_else(|| Disposition::Requeue {
                after: Duration::from_secs(1),
                error: "not processed".to_owned(),
            })
        })
        .collect()
}

/// Settles a delivery that never reaches the handler; a newer message is held first, and
/// requeued when it cannot be (its hold is idempotent, so a retry holds it once).
async fn finish_undecodable<H: Handler>(
    outbox: &Outbox,
    delivery: &IncomingDelivery,
    started: Instant,
    attempt: u32,
    undecodable: Undecodable,
) -> Disposition {
    let Undecodable {
        head,
        mut disposition,
        mut outcome,
        mut detail,
        newer,
    } = undecodable;
    if let (true, Some(newer_head)) = (newer, head.as_deref())
        && let Err(error) = held::hold(outbox.pool(), H::FUNCTION, newer_head, &delivery.body).await
    {
        detail = format!("holding it failed: {error}");
        outcome = "requeued";
        disposition = Disposition::Requeue {
            after: Duration::from_secs(1),
            error: detail.clone(),
        };
    }
    finish::<H>(
        delivery,
        head.as_deref(),
        started,
        attempt,
        disposition,
        outcome,
        Some(detail),
    )
}

/// The record of a delivery the handler skipped (`label` "skipped"), for the trace.
fn skipped(
    delivery: &IncomingDelivery,
    head: &EnvelopeHead,
    label: &str,
    reason: Option<&str>,
) -> Option<skips::Skip> {
    (label == "skipped").then(|| skips::Skip {
        message_id: head.id,
        correlation_id: head.correlation_id,
        routing_key: head.kind.clone(),
        shard_key: envelope::shard_key_of(&delivery.body),
        reason: reason.unwrap_or_default().to_owned(),
    })
}

/// What the transport does with a handler's result: the disposition, its metric label and the
/// detail for the log line.
fn classify(
    result: Result<Outcome, HandlerError>,
    attempt: u32,
    delivery: &IncomingDelivery,
) -> (Disposition, &'static str, Option<String>) {
    match result {
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
        // Requeueing cannot help: a dead letter now, with the error, not after 20 deliveries.
        Err(error) if !error.is_transient() => {
            let error = error.to_string();
            (
                Disposition::DeadLetter(DeadLetter {
                    reason: DeadLetterReason::Failed,
                    error: error.clone(),
                }),
                "failed",
                Some(error),
            )
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
                after: delivery.requeue_after(),
                error: error.to_string(),
            },
            "requeued",
            Some(error.to_string()),
        ),
    }
}

/// How a delivery's span joins its message's trace.
mod delivery_trace {
    use super::IncomingDelivery;
    use paybus_telemetry::propagation;

    /// The message's first delivery continues its sender's trace (a child of the span that
    /// wrote the outbox row). A redelivery — requeued after a fault, or after a crash before
    /// the ack — starts a trace of its own linked to the message's: the sender's trace shows the
    /// delivery that did the work, not every attempt that came before or after it.
    pub(super) fn follow(span: &tracing::Span, delivery: &IncomingDelivery, attempt: u32) {
        let headers = delivery.properties.headers().as_ref();
        let sent = crate::headers::trace_headers(headers);
        if attempt == 1 {
            propagation::continue_trace(span, &sent);
        } else {
            propagation::link_to(span, &sent);
        }
        if let Some(xray) = crate::headers::header_text(headers, crate::headers::XRAY_TRACE_HEADER)
        {
            propagation::link_to_xray(span, &xray);
        }
    }

    /// A batch's span, linked to each of its messages' producers (the messaging conventions'
    /// batch process).
    pub(super) fn link(span: &tracing::Span, delivery: &IncomingDelivery) {
        let sent = crate::headers::trace_headers(delivery.properties.headers().as_ref());
        propagation::link_to(span, &sent);
    }
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
    // A skipped duplicate is routine and counted by the metrics; at INFO it would be half the
    // log volume of a duplicate storm. Work done and retries scheduled stay visible at INFO.
    macro_rules! processed {
        ($level:expr) => {
            tracing::event!(
                $level, function = H::FUNCTION, %message_id, %correlation_id, outcome, attempt,
                duration_ms, routing_key = %delivery.routing_key, detail, "message processed"
            )
        };
    }
    match &disposition {
        Disposition::Ack if outcome == "skipped" => processed!(tracing::Level::DEBUG),
        Disposition::Ack => processed!(tracing::Level::INFO),
        Disposition::DeadLetter(_) | Disposition::Requeue { .. } => {
            processed!(tracing::Level::WARN)
        }
    }
    disposition
}

/// A handler as the consumer runtime drives it on one queue (one processor per shard, all
/// sharing the handler).
pub struct HandlerProcessor<H> {
    handler: Arc<H>,
    outbox: Outbox,
    queue: String,
}

impl<H: Handler> HandlerProcessor<H> {
    /// The handler on its one (unsharded) queue.
    pub fn new(handler: H, outbox: Outbox) -> Self {
        Self::on(Arc::new(handler), outbox, &H::queue())
    }

    /// The handler on `queue` (one of its shards).
    pub fn on(handler: Arc<H>, outbox: Outbox, queue: &FunctionQueue) -> Self {
        Self {
            handler,
            outbox,
            queue: queue.queue(),
        }
    }
}

impl<H: Handler> Processor for HandlerProcessor<H> {
    fn function(&self) -> &str {
        H::FUNCTION
    }

    fn queue(&self) -> String {
        self.queue.clone()
    }

    async fn process(&self, delivery: &IncomingDelivery) -> Disposition {
        process(&*self.handler, &self.outbox, delivery).await
    }

    fn max_batch(&self) -> usize {
        H::MAX_BATCH
    }

    async fn process_batch(&self, deliveries: &[IncomingDelivery]) -> Vec<Disposition> {
        process_batch(&*self.handler, &self.outbox, deliveries).await
    }
}
