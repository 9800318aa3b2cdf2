//! The Lambda transport: the same [`Handler`] on Amazon MQ for RabbitMQ events.
//!
//! Amazon MQ has no partial-batch response: an error redelivers the *whole* batch. So each
//! message's outcome is settled here, one by one, as the local consumer does (commit, or a
//! confirmed dead letter), and the invocation fails only for infrastructure faults, after the
//! rest of the batch is processed; redoing the done ones is harmless (idempotent handlers,
//! attempts in the rows). Messages run concurrently, at most `PAYBUS_LAMBDA_CONCURRENCY`, and a
//! `MAX_BATCH > 1` handler gets them in `handle_batch` chunks as locally.
//!
//! Rules: the topology is not declared here (the deployment does it; a cold start would pay
//! its round trips), and an event from a queue this Lambda does not read is refused whole with
//! `paybus.WrongQueue` before any message is looked at. A dead letter re-sent by a retried
//! batch keeps its id (function, message id, reason): counted twice, never lost. docs/aws.md
//! has the rest; the dead-letter queues drain through [`record_dead_letters`].

use std::{collections::BTreeMap, future::Future, time::Duration};

use aws_lambda_events::event::rabbitmq::{RabbitMqBasicProperties, RabbitMqEvent, RabbitMqMessage};
use base64::Engine;
use futures_util::{StreamExt, future::join_all, stream};
use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};
use lapin::{
    BasicProperties,
    types::{AMQPValue, FieldArray, FieldTable, ShortString},
};
use serde::{Deserialize, Serialize};
use sqlx::MySqlPool;
use tokio::sync::OnceCell;
use tracing::Instrument;

use paybus_bus::{
    dead_letter,
    delivery::{DeadLetter, DeadLetterReason, Disposition, IncomingDelivery},
    handler::{Handler, process, process_batch},
    metrics,
    publisher::{PublishError, Publisher},
    services::{PendingServices, Services},
    topology::{FunctionQueue, UNROUTED_QUEUE},
};
use paybus_config::Shards;

/// The Lambda's response for a batch that settled every message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSummary {
    /// Messages in the batch (`acked + dead_lettered`).
    pub processed: usize,
    /// Done, skipped or scheduled for a retry by the handler (for the dead-letter recorder:
    /// recorded, or already recorded).
    pub acked: usize,
    /// Published (confirmed) to the function's dead-letter queue.
    pub dead_lettered: usize,
}

/// A message whose outcome could not be settled: an infrastructure fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageFault {
    /// The `queueName::vhost` key of the event.
    pub queue: String,
    pub message_id: Option<String>,
    pub error: String,
}

/// Some messages hit an infrastructure fault: the invocation fails, so Amazon MQ delivers the
/// whole batch again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} of {} messages hit an infrastructure fault, the batch will be retried; first: {}",
    faults.len(), summary.processed + faults.len(),
    faults.first().map(|f| f.error.as_str()).unwrap_or("none")
)]
pub struct BatchError {
    /// What was settled anyway (it will be seen again, and skipped, on the retry).
    pub summary: BatchSummary,
    pub faults: Vec<MessageFault>,
}

impl From<BatchError> for Diagnostic {
    fn from(error: BatchError) -> Self {
        Diagnostic {
            error_type: "paybus.BatchError".to_owned(),
            error_message: error.to_string(),
        }
    }
}

/// Runs the function under the Lambda runtime until the execution environment ends. The
/// runtime asks for its first event while the broker connection is still being opened
/// ([`Services::start`]); the first invocation awaits it, then `build`s the handler (once).
/// Until both succeed every invocation fails as a whole, touching nothing, and the next one
/// tries again. The process has already set up tracing (lambda_runtime's own set-up would
/// panic on a second subscriber).
pub async fn run<H, E>(
    services: PendingServices,
    build: impl Fn(&Services) -> Result<H, E>,
) -> Result<(), lambda_runtime::Error>
where
    H: Handler,
    E: std::fmt::Display,
{
    let services = &services;
    let build = &build;
    let handler = &OnceCell::new();
    tracing::info!(function = H::FUNCTION, "lambda runtime starting");
    lambda_runtime::run(service_fn(
        move |event: LambdaEvent<RabbitMqEvent>| async move {
            let services = services.ready().await.map_err(InvocationError::start)?;
            let handler = handler
                .get_or_try_init(|| async { build(services) })
                .await
                .map_err(InvocationError::start)?;
            let answer = handle_invocation(
                handler,
                services,
                event.payload,
                event.context.xray_trace_id.as_deref(),
            )
            .await;
            // The environment may be frozen the moment the answer is sent: record and export
            // now.
            if let Err(error) = paybus_bus::activity::flush(&services.pool).await {
                tracing::warn!(%error, "could not record this batch's activity counts");
            }
            if paybus_telemetry::tracing_enabled() {
                let _ = tokio::task::spawn_blocking(paybus_telemetry::flush).await;
            }
            answer
        },
    ))
    .await
}

/// Why an invocation failed: Amazon MQ delivers the whole batch again either way.
#[derive(Debug, thiserror::Error)]
pub enum InvocationError {
    /// The function could not start (the broker unreachable, a setting of its own wrong):
    /// no message was looked at.
    #[error("the function could not start: {0}")]
    Start(String),
    /// The event comes from a queue this Lambda does not read: nothing was processed.
    #[error(transparent)]
    WrongQueue(#[from] WrongQueue),
    #[error(transparent)]
    Batch(#[from] BatchError),
}

/// An event from a queue that is not the Lambda's own (see the module's comment).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refused an event from {key:?}: {function} reads only {}; a trigger is wired to another queue ({messages} message(s) left unprocessed)",
    expected.join(", ")
)]
pub struct WrongQueue {
    pub function: String,
    /// The event's `queueName::vhost` key.
    pub key: String,
    /// The queues the Lambda reads.
    pub expected: Vec<String>,
    pub messages: usize,
}

/// The queue name of an event's `queueName::vhost` key.
pub fn queue_of_key(key: &str) -> &str {
    key.rsplit_once("::").map_or(key, |(queue, _vhost)| queue)
}

/// Refuses `event` unless every queue it comes from is one of `expected` (error and metric).
fn check_queues(
    function: &str,
    expected: &[String],
    event: &RabbitMqEvent,
) -> Result<(), WrongQueue> {
    let Some((key, messages)) = event
        .messages_by_queue
        .iter()
        .find(|(key, _)| !expected.iter().any(|q| q == queue_of_key(key)))
    else {
        return Ok(());
    };
    for _ in messages {
        metrics::record(function, "refused", Duration::ZERO);
    }
    let error = WrongQueue {
        function: function.to_owned(),
        key: key.clone(),
        expected: expected.to_vec(),
        messages: event.messages_by_queue.values().map(Vec::len).sum(),
    };
    tracing::error!(function, %error, "event refused");
    Err(error)
}

impl InvocationError {
    /// The batch's faults, when that is why the invocation failed.
    pub fn batch(&self) -> Option<&BatchError> {
        match self {
            InvocationError::Batch(batch) => Some(batch),
            _ => None,
        }
    }
}

impl InvocationError {
    fn start(error: impl std::fmt::Display) -> Self {
        let error = Self::Start(error.to_string());
        tracing::error!(%error, "invocation failed");
        error
    }
}

impl From<InvocationError> for Diagnostic {
    fn from(error: InvocationError) -> Self {
        match error {
            InvocationError::Batch(batch) => batch.into(),
            InvocationError::WrongQueue(wrong) => Diagnostic {
                error_type: "paybus.WrongQueue".to_owned(),
                error_message: wrong.to_string(),
            },
            start @ InvocationError::Start(_) => Diagnostic {
                error_type: "paybus.StartupError".to_owned(),
                error_message: start.to_string(),
            },
        }
    }
}

/// The queues the Lambda of `H` reads in the layout `shards`: its queue, or its shards (each
/// shard has a trigger of its own; any of them may invoke it).
pub fn own_queues<H: Handler>(shards: &Shards) -> Vec<String> {
    H::queue()
        .queues_in(shards)
        .iter()
        .map(FunctionQueue::queue)
        .collect()
}

/// Settles every message of one Amazon MQ event: ack (nothing to do), or a confirmed dead
/// letter; `lambda_concurrency` of them at once, in chunks of up to `H::MAX_BATCH`. Fails,
/// after processing the whole batch, if any message hit an infrastructure fault; refuses the
/// event untouched if it comes from a queue that is not `H`'s.
pub async fn handle_event<H: Handler>(
    handler: &H,
    services: &Services,
    event: RabbitMqEvent,
) -> Result<BatchSummary, InvocationError> {
    handle_invocation(handler, services, event, None).await
}

/// [`handle_event`] for one invocation whose X-Ray trace id Lambda gave (`Lambda-Runtime-Trace-Id`,
/// `_X_AMZN_TRACE_ID`): each delivery's span links to it, so X-Ray's view of the invocation and
/// the message's trace meet.
pub async fn handle_invocation<H: Handler>(
    handler: &H,
    services: &Services,
    event: RabbitMqEvent,
    xray_trace_id: Option<&str>,
) -> Result<BatchSummary, InvocationError> {
    let own = own_queues::<H>(&services.settings.broker.shards);
    check_queues(H::FUNCTION, &own, &event)?;
    let concurrency = usize::from(services.settings.broker.lambda_concurrency);
    let settled = settle_concurrently(
        &event,
        concurrency,
        H::MAX_BATCH,
        |queue, first, messages| {
            let span = tracing::info_span!(
                "rabbitmq_messages",
                function = H::FUNCTION,
                queue = %queue,
                first,
                count = messages.len(),
            );
            settle_chunk(handler, services, messages, xray_trace_id).instrument(span)
        },
    )
    .await;
    Ok(summarise(H::FUNCTION, settled)?)
}

/// The `function_name` the dead-letter recorder logs under (each row names its own function).
pub const DEAD_LETTER_RECORDER: &str = "dead-letters";

/// The queues the dead-letter recorder reads: the dead-letter queue of each of `functions`,
/// and `paybus.unrouted`.
pub fn recorder_queues(functions: &[FunctionQueue]) -> Vec<String> {
    let mut queues: Vec<String> = Vec::with_capacity(functions.len() + 1);
    for function in functions {
        let dlq = function.dead_letter_queue();
        if !queues.contains(&dlq) {
            queues.push(dlq);
        }
    }
    queues.push(UNROUTED_QUEUE.to_owned());
    queues
}

/// The dead-letter recorder's Lambda: records every message of an event from the dead-letter
/// queues (`paybus.<function>.dlq` of the catalog's functions, and `paybus.unrouted`) in
/// `dead_letters`, once however often the batch is delivered (the row's key is the dead
/// letter's id). A message that does not decode is recorded as it arrived; only a database
/// fault fails the batch. An event from any other queue (a function's own queue, wired to
/// the recorder by mistake) is refused untouched: recording it would acknowledge work nobody
/// did.
pub async fn record_dead_letters(
    pool: &MySqlPool,
    concurrency: usize,
    queues: &[String],
    event: RabbitMqEvent,
) -> Result<BatchSummary, InvocationError> {
    check_queues(DEAD_LETTER_RECORDER, queues, &event)?;
    let settled = settle_concurrently(&event, concurrency, 1, |queue, first, messages| {
        let span = tracing::info_span!("dead_letters", queue = %queue, first);
        let queue = queue_of_key(queue);
        async move {
            let mut settled = Vec::with_capacity(messages.len());
            for message in messages {
                let delivery = decode(message).delivery;
                settled.push(
                    dead_letter::record_from_queue(pool, queue, &delivery)
                        .await
                        .map(|_| Settled::Acked)
                        .map_err(Unsettled::Record),
                );
            }
            settled
        }
        .instrument(span)
    })
    .await;
    Ok(summarise(DEAD_LETTER_RECORDER, settled)?)
}

/// What became of one message: settled, or why not.
type Settlement = Result<Settled, Unsettled>;

/// Runs `settle` over the event's messages in chunks of up to `max_batch` (never more than
/// `concurrency`), with at most `concurrency` messages in flight; one settlement per message,
/// in the event's order. `settle` gets the queue key, the chunk's first index and the chunk.
async fn settle_concurrently<'e, F, Fut>(
    event: &'e RabbitMqEvent,
    concurrency: usize,
    max_batch: usize,
    settle: F,
) -> Vec<(&'e str, &'e RabbitMqMessage, Settlement)>
where
    F: Fn(&'e str, usize, &'e [RabbitMqMessage]) -> Fut,
    Fut: Future<Output = Vec<Settlement>>,
{
    let concurrency = concurrency.max(1);
    let size = max_batch.clamp(1, concurrency);
    let chunks = event
        .messages_by_queue
        .iter()
        .flat_map(|(queue, messages)| {
            messages
                .chunks(size)
                .enumerate()
                .map(move |(n, chunk)| (queue.as_str(), n * size, chunk))
        });
    stream::iter(chunks)
        .map(|(queue, first, chunk)| {
            let settled = settle(queue, first, chunk);
            async move {
                let settled = settled.await;
                chunk
                    .iter()
                    .zip(settled)
                    .map(|(message, settlement)| (queue, message, settlement))
                    .collect::<Vec<_>>()
            }
        })
        .buffered(concurrency / size)
        .flat_map(stream::iter)
        .collect()
        .await
}

/// The invocation's answer: the summary, or the error that makes Amazon MQ retry the batch.
fn summarise(
    function: &str,
    settled: Vec<(&str, &RabbitMqMessage, Settlement)>,
) -> Result<BatchSummary, BatchError> {
    let mut summary = BatchSummary::default();
    let mut faults = Vec::new();
    for (queue, message, settlement) in settled {
        match settlement {
            Ok(Settled::Acked) => summary.acked += 1,
            Ok(Settled::DeadLettered) => summary.dead_lettered += 1,
            Err(error) => faults.push(MessageFault {
                queue: queue.to_owned(),
                message_id: message.basic_properties.message_id.clone(),
                error: error.to_string(),
            }),
        }
    }
    summary.processed = summary.acked + summary.dead_lettered;
    if faults.is_empty() {
        tracing::info!(
            function,
            processed = summary.processed,
            acked = summary.acked,
            dead_lettered = summary.dead_lettered,
            "batch processed"
        );
        Ok(summary)
    } else {
        let error = BatchError { summary, faults };
        tracing::error!(function, %error, "batch failed");
        Err(error)
    }
}

enum Settled {
    Acked,
    DeadLettered,
}

/// Why a message could not be settled: an infrastructure fault, so the batch is retried.
#[derive(Debug, thiserror::Error)]
enum Unsettled {
    /// The handler hit a transient fault (the disposition's rendered error).
    #[error("{0}")]
    Requeue(String),
    #[error("dead letter not confirmed: {0}")]
    DeadLetter(#[from] PublishError),
    #[error("recording the dead letter: {0}")]
    Record(sqlx::Error),
}

/// One chunk of messages: decode, process (together when the handler takes batches),
/// settle each.
async fn settle_chunk<H: Handler>(
    handler: &H,
    services: &Services,
    messages: &[RabbitMqMessage],
    xray_trace_id: Option<&str>,
) -> Vec<Settlement> {
    let decoded: Vec<Decoded> = messages
        .iter()
        .map(|message| with_xray_trace_id(decode(message), xray_trace_id))
        .collect();
    let well_formed: Vec<IncomingDelivery> = decoded
        .iter()
        .filter(|d| d.malformed.is_none())
        .map(|d| d.delivery.clone())
        .collect();
    let mut processed = match &well_formed[..] {
        [] => Vec::new(),
        [single] => vec![process(handler, &services.outbox, single).await],
        several => process_batch(handler, &services.outbox, several).await,
    }
    .into_iter();
    let dispositions: Vec<Disposition> = decoded
        .iter()
        .map(|d| match &d.malformed {
            Some(error) => malformed::<H>(&d.delivery, error),
            None => processed.next().unwrap_or_else(|| Disposition::Requeue {
                after: Duration::ZERO,
                error: "not processed".to_owned(),
            }),
        })
        .collect();
    // Concurrently: the dead letters' confirms are independent round trips.
    join_all(
        decoded
            .iter()
            .zip(dispositions)
            .map(|(d, disposition)| settle::<H>(services.publisher(), &d.delivery, disposition)),
    )
    .await
}

/// The invocation's X-Ray trace id rides on each of its deliveries as the
/// [`XRAY_TRACE_HEADER`](paybus_bus::headers::XRAY_TRACE_HEADER) header, where the delivery's span finds it (and a dead letter keeps it).
fn with_xray_trace_id(mut decoded: Decoded, xray_trace_id: Option<&str>) -> Decoded {
    if let Some(xray) = xray_trace_id.filter(|_| paybus_telemetry::tracing_enabled()) {
        let mut headers = decoded
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        paybus_bus::headers::text_header(
            &mut headers,
            paybus_bus::headers::XRAY_TRACE_HEADER,
            xray,
        );
        decoded.delivery.properties = decoded.delivery.properties.with_headers(headers);
    }
    decoded
}

/// The disposition of a message whose body the event could not give us.
fn malformed<H: Handler>(delivery: &IncomingDelivery, error: &str) -> Disposition {
    metrics::record(H::FUNCTION, "malformed", Duration::ZERO);
    tracing::warn!(
        function = H::FUNCTION,
        message_id = delivery.message_id().unwrap_or_default(),
        outcome = "malformed",
        detail = %error,
        "message processed"
    );
    Disposition::DeadLetter(DeadLetter {
        reason: DeadLetterReason::Malformed,
        error: error.to_owned(),
    })
}

async fn settle<H: Handler>(
    publisher: &Publisher,
    delivery: &IncomingDelivery,
    disposition: Disposition,
) -> Settlement {
    match disposition {
        Disposition::Ack => Ok(Settled::Acked),
        Disposition::DeadLetter(dead) => {
            dead_letter::publish(publisher, H::FUNCTION, delivery, &dead).await?;
            Ok(Settled::DeadLettered)
        }
        Disposition::Requeue { error, .. } => Err(Unsettled::Requeue(error)),
    }
}

/// A message of the event as the runtime sees it.
struct Decoded {
    /// Body decoded from base64; for an undecodable one, the raw `data` text, so the dead
    /// letter shows what arrived.
    delivery: IncomingDelivery,
    /// Why the body could not be decoded: the message is malformed.
    malformed: Option<String>,
}

/// Decodes the base64 body and converts the properties and headers.
fn decode(message: &RabbitMqMessage) -> Decoded {
    let properties = basic_properties(&message.basic_properties);
    let from_properties = message.basic_properties.type_.clone();
    let (body, malformed) = match message.data.as_deref() {
        None => (Vec::new(), Some("the event message has no data".to_owned())),
        Some(data) => match base64::engine::general_purpose::STANDARD.decode(data) {
            Ok(body) => (body, None),
            Err(e) => (
                data.as_bytes().to_vec(),
                Some(format!("the event message's data is not base64: {e}")),
            ),
        },
    };
    let routing_key = match (&from_properties, &malformed) {
        (Some(kind), _) => kind.clone(),
        (None, None) => envelope_type(&body).unwrap_or_default(),
        (None, Some(_)) => String::new(),
    };
    Decoded {
        delivery: IncomingDelivery {
            body,
            routing_key,
            properties,
        },
        malformed,
    }
}

/// The envelope's `type` (= the routing key it was published with), for an event whose AMQP
/// properties lack `type`: the Amazon MQ event does not carry the routing key.
fn envelope_type(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Kind {
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_slice::<Kind>(body).ok().map(|k| k.kind)
}

/// The AMQP properties worth keeping. Left out on purpose: `expiration` (it would make the dead
/// letter expire), `user_id` (RabbitMQ rejects a publish whose user id is not the publisher's),
/// `cluster_id` (deprecated) and `timestamp` (a locale-formatted string in the event).
fn basic_properties(p: &RabbitMqBasicProperties) -> BasicProperties {
    let mut properties = BasicProperties::default()
        .with_delivery_mode(p.delivery_mode)
        .with_priority(p.priority)
        .with_headers(field_table(p.headers.iter()));
    let short = |s: &Option<String>| s.as_deref().and_then(|s| ShortString::try_new(s).ok());
    if let Some(v) = short(&p.message_id) {
        properties = properties.with_message_id(v);
    }
    if let Some(v) = short(&p.correlation_id) {
        properties = properties.with_correlation_id(v);
    }
    if let Some(v) = short(&p.type_) {
        properties = properties.with_type(v);
    }
    if let Some(v) = short(&p.content_type) {
        properties = properties.with_content_type(v);
    }
    if let Some(v) = short(&p.content_encoding) {
        properties = properties.with_content_encoding(v);
    }
    if let Some(v) = short(&p.reply_to) {
        properties = properties.with_reply_to(v);
    }
    if let Some(v) = short(&p.app_id) {
        properties = properties.with_app_id(v);
    }
    properties
}

/// Headers as they arrive in the event (strings as `{"bytes": [...]}`) back to AMQP values.
/// Names longer than an AMQP short string are dropped.
fn field_table<'a>(
    entries: impl Iterator<Item = (&'a String, &'a serde_json::Value)>,
) -> FieldTable {
    let map: BTreeMap<ShortString, AMQPValue> = entries
        .filter_map(|(name, value)| {
            Some((ShortString::try_new(name.as_str()).ok()?, amqp_value(value)))
        })
        .collect();
    FieldTable::from(map)
}

fn amqp_value(value: &serde_json::Value) -> AMQPValue {
    use serde_json::Value;
    match value {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => AMQPValue::LongLongInt(i),
            (None, Some(f)) => AMQPValue::Double(f),
            (None, None) => AMQPValue::LongString(n.to_string().into()),
        },
        Value::String(s) => AMQPValue::LongString(s.as_str().into()),
        Value::Array(items) => AMQPValue::FieldArray(FieldArray::from(
            items.iter().map(amqp_value).collect::<Vec<_>>(),
        )),
        Value::Object(map) => match string_bytes(map) {
            Some(bytes) => AMQPValue::LongString(bytes.into()),
            None => AMQPValue::FieldTable(field_table(map.iter())),
        },
    }
}

/// `{"bytes": [118, 97, ...]}`: how the event encodes an AMQP long string.
fn string_bytes(map: &serde_json::Map<String, serde_json::Value>) -> Option<Vec<u8>> {
    if map.len() != 1 {
        return None;
    }
    map.get("bytes")?
        .as_array()?
        .iter()
        .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use paybus_bus::headers::{header_integer, header_text};

    fn ok(decoded: Decoded) -> IncomingDelivery {
        assert_eq!(decoded.malformed, None);
        decoded.delivery
    }

    fn message(json: serde_json::Value) -> RabbitMqMessage {
        serde_json::from_value(json).unwrap()
    }

    fn props(extra: serde_json::Value) -> serde_json::Value {
        let mut p = serde_json::json!({
            "contentType": "application/json", "contentEncoding": null, "deliveryMode": 2,
            "priority": 0, "correlationId": "c-1", "replyTo": null, "expiration": "60000",
            "messageId": "m-1", "timestamp": "Jan 1, 1970, 12:33:41 AM", "type": null,
            "userId": "AIDACKCEVSQ6C2EXAMPLE", "appId": null, "clusterId": null, "bodySize": 2
        });
        if let (Some(p), Some(extra)) = (p.as_object_mut(), extra.as_object()) {
            p.extend(extra.clone());
        }
        p
    }

    #[test]
    fn decodes_body_headers_and_properties() {
        let m = message(serde_json::json!({
            "basicProperties": props(serde_json::json!({
                "type": "canary.ping",
                "headers": {
                    "x-delivery-count": 3,
                    "x-paybus-reason": {"bytes": [102, 97, 105, 108, 101, 100]},
                    "flag": true,
                    "nested": {"a": 1},
                    "list": [{"bytes": [104]}, 2]
                }
            })),
            "redelivered": true,
            "data": "e30="
        }));
        let d = ok(decode(&m));
        assert_eq!(d.body, b"{}");
        assert_eq!(d.routing_key, "canary.ping");
        assert_eq!(d.delivery_count(), 3);
        assert_eq!(d.message_id().as_deref(), Some("m-1"));
        let headers = d.properties.headers().as_ref();
        assert_eq!(
            header_text(headers, "x-paybus-reason").as_deref(),
            Some("failed")
        );
        assert_eq!(header_integer(headers, "x-delivery-count"), Some(3));
        let inner = headers.unwrap().inner();
        assert_eq!(inner.get("flag"), Some(&AMQPValue::Boolean(true)));
        let Some(AMQPValue::FieldTable(nested)) = inner.get("nested") else {
            panic!("nested is a table: {inner:?}");
        };
        assert_eq!(header_integer(Some(nested), "a"), Some(1));
        let Some(AMQPValue::FieldArray(list)) = inner.get("list") else {
            panic!("list is an array: {inner:?}");
        };
        assert_eq!(list.as_slice()[0], AMQPValue::LongString("h".into()));
        assert_eq!(
            d.properties.correlation_id().as_ref().map(|s| s.as_str()),
            Some("c-1")
        );
        assert_eq!(*d.properties.delivery_mode(), Some(2));
        // Never carried into a dead letter.
        assert_eq!(*d.properties.expiration(), None);
        assert_eq!(*d.properties.user_id(), None);
    }

    #[test]
    fn routing_key_falls_back_to_the_envelope_type() {
        let body = base64::engine::general_purpose::STANDARD.encode(br#"{"type":"canary.ping"}"#);
        let m = message(serde_json::json!({
            "basicProperties": props(serde_json::json!({})), "redelivered": false, "data": body
        }));
        assert_eq!(ok(decode(&m)).routing_key, "canary.ping");
    }

    #[test]
    fn missing_or_undecodable_data_is_malformed() {
        for data in [serde_json::Value::Null, serde_json::json!("not base64!")] {
            let m = message(serde_json::json!({
                "basicProperties": props(serde_json::json!({})), "redelivered": false, "data": data
            }));
            let decoded = decode(&m);
            assert!(decoded.malformed.is_some(), "{data} must be malformed");
            assert_eq!(decoded.delivery.message_id().as_deref(), Some("m-1"));
        }
    }

    #[test]
    fn an_overlong_message_id_is_dropped_not_a_panic() {
        let m = message(serde_json::json!({
            "basicProperties": props(serde_json::json!({"messageId": "x".repeat(300)})),
            "redelivered": false, "data": "e30="
        }));
        assert_eq!(ok(decode(&m)).message_id(), None);
    }

    const CRATE_FIXTURE: &str = r#"{"eventSource":"aws:rmq","eventSourceArn":"arn:aws:mq:us-west-2:112556298976:broker:test:b-9bcfa592-423a-4942-879d-eb284b418fc8","rmqMessagesByQueue":{"test::/":[{"basicProperties":{"contentType":"text/plain","contentEncoding":null,"headers":{"header1":{"bytes":[118,97,108,117,101,49]},"header2":{"bytes":[118,97,108,117,101,50]},"numberInHeader":10},"deliveryMode":1,"priority":34,"correlationId":null,"replyTo":null,"expiration":"60000","messageId":null,"timestamp":"Jan 1, 1970, 12:33:41 AM","type":null,"userId":"AIDACKCEVSQ6C2EXAMPLE","appId":null,"clusterId":null,"bodySize":80},"redelivered":false,"data":"eyJ0aW1lb3V0IjowLCJkYXRhIjoiQ1pybWYwR3c4T3Y0YnFMUXhENEUifQ=="}]}}"#;

    #[test]
    fn the_crate_fixture_decodes() {
        // aws_lambda_events' own `src/fixtures/example-rabbitmq-event.json`, verbatim.
        let event: RabbitMqEvent = serde_json::from_str(CRATE_FIXTURE).unwrap();
        let messages = &event.messages_by_queue["test::/"];
        let d = ok(decode(&messages[0]));
        assert!(d.body.starts_with(b"{\"timeout\":0"));
        let headers = d.properties.headers().as_ref();
        assert_eq!(header_text(headers, "header1").as_deref(), Some("value1"));
        assert_eq!(header_integer(headers, "numberInHeader"), Some(10));
    }

    #[test]
    fn an_event_from_another_queue_is_refused_and_counted() {
        let mut event: RabbitMqEvent = serde_json::from_str(CRATE_FIXTURE).unwrap();
        let expected = vec!["paybus.test-own".to_owned()];
        let before = metrics::count("test-refusing", "refused");

        let error = check_queues("test-refusing", &expected, &event).unwrap_err();

        assert_eq!(error.key, "test::/");
        assert_eq!(error.messages, 1);
        assert!(
            error.to_string().contains("reads only paybus.test-own"),
            "{error}"
        );
        assert_eq!(metrics::count("test-refusing", "refused"), before + 1);
        let messages = event.messages_by_queue.remove("test::/").unwrap();
        event
            .messages_by_queue
            .insert("paybus.test-own::paybus".to_owned(), messages);
        assert_eq!(check_queues("test-refusing", &expected, &event), Ok(()));
    }

    #[test]
    fn the_recorder_reads_dead_letter_queues_and_the_unrouted_queue_only() {
        let queues = recorder_queues(&FunctionQueue::new("a", "a.happened").sharded(2));
        assert_eq!(queues, ["paybus.a.dlq", "paybus.unrouted"]);
    }

    #[test]
    fn a_batch_error_names_the_first_fault() {
        let error = BatchError {
            summary: BatchSummary {
                processed: 2,
                acked: 1,
                dead_lettered: 1,
            },
            faults: vec![MessageFault {
                queue: "q::/".into(),
                message_id: None,
                error: "database: pool timed out".into(),
            }],
        };
        let text = error.to_string();
        assert!(text.contains("1 of 3"), "{text}");
        assert!(text.contains("pool timed out"), "{text}");
        let diagnostic = Diagnostic::from(error);
        assert_eq!(diagnostic.error_type, "paybus.BatchError");
        let summary = serde_json::to_value(BatchSummary {
            processed: 3,
            acked: 2,
            dead_lettered: 1,
        })
        .unwrap();
        assert_eq!(
            summary,
            serde_json::json!({"processed": 3, "acked": 2, "dead_lettered": 1})
        );
    }
}
