//! Dead letters: publishing them (with the `x-paybus-*` headers of docs/bus.md) and recording
//! every message of every `paybus.<function>.dlq` in the `dead_letters` table, where ops query,
//! group, replay and archive them.

use lapin::types::{AMQPValue, FieldTable};
use sqlx::{MySqlConnection, MySqlPool};

use super::{
    delivery::{DeadLetter, DeadLetterReason, Disposition, IncomingDelivery, Processor},
    envelope::OutgoingMessage,
    headers::{self, header_integer, header_text, integer_header, text_header},
    publisher::{PublishError, Publisher},
    topology::{
        DEAD_LETTER_EXCHANGE, EVENTS_EXCHANGE, UNROUTED_QUEUE, dead_letter_queue_function,
        dead_letter_queue_name,
    },
};

pub const H_FUNCTION: &str = "x-paybus-function";
pub const H_REASON: &str = "x-paybus-reason";
pub const H_ERROR: &str = "x-paybus-error";
pub const H_ATTEMPTS: &str = "x-paybus-attempts";
pub const H_FAILED_AT: &str = "x-paybus-failed-at";
pub const H_ROUTING_KEY: &str = "x-paybus-routing-key";
pub const H_DEAD_LETTER_ID: &str = "x-paybus-dead-letter-id";

/// Longest error text carried in a header (the table keeps the same).
const MAX_ERROR_LEN: usize = 4_000;

/// Publishes `delivery` to `paybus.dlx` (→ `paybus.<function>.dlq`) and waits for the confirm.
pub async fn publish(
    publisher: &Publisher,
    function: &str,
    delivery: &IncomingDelivery,
    dead: &DeadLetter,
) -> Result<(), PublishError> {
    let mut headers = delivery.properties.headers().clone().unwrap_or_default();
    // The DLQ counts its own deliveries; an inherited count would read as redeliveries.
    let mut inner = headers.inner().clone();
    inner.remove("x-delivery-count");
    headers = FieldTable::from(inner);
    let error: String = dead.error.chars().take(MAX_ERROR_LEN).collect();
    text_header(&mut headers, H_FUNCTION, function);
    text_header(&mut headers, H_REASON, dead.reason.as_str());
    text_header(&mut headers, H_ERROR, &error);
    integer_header(
        &mut headers,
        H_ATTEMPTS,
        i64::from(delivery.delivery_count()) + 1,
    );
    text_header(
        &mut headers,
        H_FAILED_AT,
        &chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    );
    text_header(&mut headers, H_ROUTING_KEY, &delivery.routing_key);
    text_header(
        &mut headers,
        H_DEAD_LETTER_ID,
        &dead_letter_id(function, delivery, dead),
    );
    let properties = delivery.properties.clone().with_headers(headers);
    publisher
        .publish_raw(DEAD_LETTER_EXCHANGE, function, &delivery.body, properties)
        .await
}

/// The same decision about the same message gets the same id, so a dead letter published
/// again (a crash between the confirm and the ack, a Lambda batch retried for another
/// message's fault) is recorded once. Messages without an id are keyed by their body's hash.
fn dead_letter_id(function: &str, delivery: &IncomingDelivery, dead: &DeadLetter) -> String {
    use sha2::{Digest, Sha256};
    let message = delivery
        .message_id()
        .unwrap_or_else(|| hex::encode(&Sha256::digest(&delivery.body)[..16]));
    bounded_id(format!("{function}:{message}:{}", dead.reason.as_str()))
}

/// The column holds 100 characters; a hostile message id must not break the insert.
fn bounded_id(id: String) -> String {
    use sha2::{Digest, Sha256};
    if id.len() <= 100 {
        id
    } else {
        format!("sha256:{}", hex::encode(Sha256::digest(id.as_bytes())))
    }
}

/// Drains one function's DLQ into `dead_letters` (one row per dead letter, even when the DLQ
/// redelivers it).
pub struct DeadLetterRecorder {
    function: String,
    pool: MySqlPool,
}

impl DeadLetterRecorder {
    pub fn new(function: &str, pool: MySqlPool) -> Self {
        Self {
            function: function.to_owned(),
            pool,
        }
    }
}

/// A dead letter as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRow {
    pub dead_letter_id: String,
    pub function_name: String,
    pub message_id: Option<String>,
    pub correlation_id: Option<String>,
    pub routing_key: String,
    pub reason: String,
    pub error: String,
    pub attempts: u32,
}

/// Reads the dead letter's facts from its headers. A message the broker dead-lettered on its
/// own (delivery limit after crashes) has no `x-paybus-*` headers, only `x-death`.
pub fn describe(function: &str, delivery: &IncomingDelivery) -> DeadLetterRow {
    let headers = delivery.properties.headers().as_ref();
    let message_id = delivery.message_id();
    let correlation_id = delivery
        .properties
        .correlation_id()
        .as_ref()
        .map(|s| s.to_string());
    match header_text(headers, H_DEAD_LETTER_ID) {
        Some(id) => DeadLetterRow {
            dead_letter_id: bounded_id(id),
            function_name: header_text(headers, H_FUNCTION).unwrap_or_else(|| function.to_owned()),
            message_id,
            correlation_id,
            routing_key: header_text(headers, H_ROUTING_KEY)
                .unwrap_or_else(|| delivery.routing_key.clone()),
            reason: header_text(headers, H_REASON).unwrap_or_else(|| "unknown".to_owned()),
            error: header_text(headers, H_ERROR).unwrap_or_default(),
            attempts: header_integer(headers, H_ATTEMPTS)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
        },
        None => {
            let death = first_death(headers);
            let reason =
                header_text(headers, "x-first-death-reason").unwrap_or_else(|| "broker".to_owned());
            let count = death.as_ref().and_then(|d| d.count).unwrap_or(0);
            DeadLetterRow {
                dead_letter_id: bounded_id(format!(
                    "broker:{}:{}:{count}",
                    message_id.as_deref().unwrap_or("no-id"),
                    reason
                )),
                function_name: function.to_owned(),
                message_id,
                correlation_id,
                routing_key: death
                    .and_then(|d| d.routing_key)
                    .unwrap_or_else(|| delivery.routing_key.clone()),
                // No `x-first-death-reason` at all (a message put on the DLQ by hand): "broker".
                reason: match reason.as_str() {
                    "delivery_limit" | "broker" => reason.clone(),
                    other => format!("broker_{other}"),
                },
                error: format!("dead-lettered by the broker ({reason}) after {count} death(s)"),
                attempts: u32::try_from(count).unwrap_or(0),
            }
        }
    }
}

struct Death {
    count: Option<i64>,
    routing_key: Option<String>,
}

fn first_death(headers: Option<&FieldTable>) -> Option<Death> {
    let AMQPValue::FieldArray(deaths) = headers?.inner().get("x-death")? else {
        return None;
    };
    let AMQPValue::FieldTable(death) = deaths.as_slice().first()? else {
        return None;
    };
    let routing_key = match death.inner().get("routing-keys") {
        Some(AMQPValue::FieldArray(keys)) => keys.as_slice().first().and_then(|k| match k {
            AMQPValue::LongString(s) => Some(s.to_string()),
            _ => None,
        }),
        _ => None,
    };
    Some(Death {
        count: header_integer(Some(death), "count"),
        routing_key,
    })
}

fn headers_json(delivery: &IncomingDelivery) -> String {
    delivery
        .properties
        .headers()
        .as_ref()
        .map(|headers| headers::to_json(headers).to_string())
        .unwrap_or_default()
}

/// Inserts the dead letter unless it is already recorded; true when this call recorded it.
pub async fn record(
    pool: &MySqlPool,
    function: &str,
    delivery: &IncomingDelivery,
) -> Result<bool, sqlx::Error> {
    insert(pool, &describe(function, delivery), delivery).await
}

async fn insert(
    pool: &MySqlPool,
    row: &DeadLetterRow,
    delivery: &IncomingDelivery,
) -> Result<bool, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    insert_row(&mut conn, row, &delivery.body, &headers_json(delivery)).await
}

/// A dead letter decided outside a delivery: a sweeper job gave a unit of work up (W3's
/// worker after the last retry). Recorded in the caller's transaction, so the row's terminal
/// state and its dead letter commit together and neither exists without the other; `message`
/// is what a replay re-publishes. Reason `failed`, headers as a delivered dead letter carries
/// them. True when this call recorded it (false: `dead_letter_id` is already recorded).
pub async fn record_given_up(
    conn: &mut MySqlConnection,
    function: &str,
    dead_letter_id: &str,
    message: &OutgoingMessage,
    error: &str,
    attempts: u32,
) -> Result<bool, sqlx::Error> {
    let row = DeadLetterRow {
        dead_letter_id: bounded_id(dead_letter_id.to_owned()),
        function_name: function.to_owned(),
        message_id: Some(message.id.to_string()),
        correlation_id: Some(message.correlation_id.to_string()),
        routing_key: message.routing_key.clone(),
        reason: DeadLetterReason::Failed.as_str().to_owned(),
        error: error.chars().take(MAX_ERROR_LEN).collect(),
        attempts,
    };
    let mut headers = FieldTable::default();
    text_header(&mut headers, H_FUNCTION, &row.function_name);
    text_header(&mut headers, H_REASON, &row.reason);
    text_header(&mut headers, H_ERROR, &row.error);
    integer_header(&mut headers, H_ATTEMPTS, i64::from(attempts));
    text_header(
        &mut headers,
        H_FAILED_AT,
        &chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    );
    text_header(&mut headers, H_ROUTING_KEY, &row.routing_key);
    text_header(&mut headers, H_DEAD_LETTER_ID, &row.dead_letter_id);
    let headers = headers::to_json(&headers).to_string();
    insert_row(conn, &row, &message.body, &headers).await
}

async fn insert_row(
    conn: &mut MySqlConnection,
    row: &DeadLetterRow,
    body: &[u8],
    headers: &str,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT IGNORE INTO dead_letters (dead_letter_id, function_name, message_id, \
         correlation_id, routing_key, reason, error, attempts, body, headers) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&row.dead_letter_id)
    .bind(&row.function_name)
    .bind(&row.message_id)
    .bind(&row.correlation_id)
    .bind(&row.routing_key)
    .bind(&row.reason)
    .bind(&row.error)
    .bind(row.attempts)
    .bind(body)
    .bind(headers)
    .execute(conn)
    .await?
    .rows_affected();
    if inserted == 1 {
        tracing::warn!(
            function = %row.function_name, message_id = row.message_id.as_deref().unwrap_or(""),
            reason = %row.reason, error = %row.error, "dead letter recorded"
        );
    }
    Ok(inserted == 1)
}

/// Records the dead letter of work that failed for good outside a delivery — a row a
/// sweeper job claimed in a batch, or an attempt made inline in an API request — in the
/// caller's transaction, so the row's terminal state and its dead letter commit together
/// (principle 9) even while the broker is down. `message` is the message that would have
/// carried the work (what a replay publishes); the row looks like a handler's `Failed`: same
/// id scheme, reason `failed`, the `x-paybus-*` headers as readable JSON. True when this call
/// recorded it (its id was new).
pub async fn record_unsent(
    conn: &mut MySqlConnection,
    function: &str,
    message: &OutgoingMessage,
    error: &str,
    attempts: u32,
) -> Result<bool, sqlx::Error> {
    let reason = DeadLetterReason::Failed.as_str();
    let dead_letter_id = bounded_id(format!("{function}:{}:{reason}", message.id));
    let error: String = error.chars().take(MAX_ERROR_LEN).collect();
    let mut headers = FieldTable::default();
    text_header(&mut headers, H_FUNCTION, function);
    text_header(&mut headers, H_REASON, reason);
    text_header(&mut headers, H_ERROR, &error);
    integer_header(&mut headers, H_ATTEMPTS, i64::from(attempts));
    text_header(
        &mut headers,
        H_FAILED_AT,
        &chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    );
    text_header(&mut headers, H_ROUTING_KEY, &message.routing_key);
    text_header(&mut headers, H_DEAD_LETTER_ID, &dead_letter_id);
    let inserted = sqlx::query(
        "INSERT IGNORE INTO dead_letters (dead_letter_id, function_name, message_id, \
         correlation_id, routing_key, reason, error, attempts, body, headers) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&dead_letter_id)
    .bind(function)
    .bind(message.id.to_string())
    .bind(message.correlation_id.to_string())
    .bind(&message.routing_key)
    .bind(reason)
    .bind(&error)
    .bind(attempts)
    .bind(&message.body)
    .bind(headers::to_json(&headers).to_string())
    .execute(conn)
    .await?
    .rows_affected();
    if inserted == 1 {
        tracing::warn!(
            function, message_id = %message.id, reason, error = %error,
            "dead letter recorded (work outside a delivery)"
        );
    }
    Ok(inserted == 1)
}

/// `function_name` of a message no function binds.
pub const UNROUTED_FUNCTION: &str = "unrouted";
/// `reason` of a message no function binds.
pub const UNROUTABLE: &str = "unroutable";

/// Drains `paybus.unrouted` (what `paybus.events` could route nowhere) into `dead_letters`,
/// reason `unroutable`, so a message published under a routing key no function binds is
/// seen by ops instead of being dropped by the broker.
pub struct UnroutedRecorder {
    pool: MySqlPool,
}

impl UnroutedRecorder {
    pub fn new(pool: MySqlPool) -> Self {
        Self { pool }
    }
}

/// The dead letter of an unroutable message (the routing key is the original one).
pub fn describe_unrouted(delivery: &IncomingDelivery) -> DeadLetterRow {
    use sha2::{Digest, Sha256};
    let message_id = delivery.message_id();
    let key = message_id
        .clone()
        .unwrap_or_else(|| hex::encode(&Sha256::digest(&delivery.body)[..16]));
    DeadLetterRow {
        dead_letter_id: bounded_id(format!("{UNROUTABLE}:{key}")),
        function_name: UNROUTED_FUNCTION.to_owned(),
        message_id,
        correlation_id: delivery
            .properties
            .correlation_id()
            .as_ref()
            .map(|s| s.to_string()),
        routing_key: delivery.routing_key.clone(),
        reason: UNROUTABLE.to_owned(),
        error: format!(
            "no queue is bound for routing key {:?} on {EVENTS_EXCHANGE}",
            delivery.routing_key
        ),
        attempts: 0,
    }
}

impl Processor for UnroutedRecorder {
    fn function(&self) -> &str {
        UNROUTED_FUNCTION
    }

    fn queue(&self) -> String {
        UNROUTED_QUEUE.to_owned()
    }

    async fn process(&self, delivery: &IncomingDelivery) -> Disposition {
        match insert(&self.pool, &describe_unrouted(delivery), delivery).await {
            Ok(_) => Disposition::Ack,
            Err(error) => Disposition::Requeue {
                after: delivery.requeue_after(),
                error: format!("recording an unroutable message: {error}"),
            },
        }
    }
}

/// Records a message that arrived on `queue` (a function's `.dlq`, or `paybus.unrouted`) as
/// that queue's recorder does; true when this call recorded it. A queue of any other name is
/// recorded under its own name rather than dropped (a mapping pointed at the wrong queue is
/// a deployment mistake ops must see). The dead-letter recorder Lambda's one step.
pub async fn record_from_queue(
    pool: &MySqlPool,
    queue: &str,
    delivery: &IncomingDelivery,
) -> Result<bool, sqlx::Error> {
    let row = if queue == UNROUTED_QUEUE {
        describe_unrouted(delivery)
    } else {
        describe(dead_letter_queue_function(queue).unwrap_or(queue), delivery)
    };
    insert(pool, &row, delivery).await
}

/// Rewrites `dead_letters.headers` that an earlier paybus stored in lapin's serde form (a
/// string as its bytes: `{"LongString":[110,...]}`) as readable JSON. Idempotent: readable
/// rows are left alone. Returns how many rows it rewrote.
pub async fn rewrite_legacy_headers(pool: &MySqlPool) -> Result<u64, sqlx::Error> {
    let mut after: u64 = 0;
    let mut rewritten = 0;
    loop {
        let rows: Vec<(u64, String)> = sqlx::query_as(
            "SELECT id, headers FROM dead_letters \
             WHERE id > ? AND headers LIKE '%{\"LongString\":%' ORDER BY id LIMIT 500",
        )
        .bind(after)
        .fetch_all(pool)
        .await?;
        let Some(&(last, _)) = rows.last() else {
            return Ok(rewritten);
        };
        after = last;
        for (id, text) in rows {
            let Ok(table) = serde_json::from_str::<FieldTable>(&text) else {
                continue;
            };
            sqlx::query("UPDATE dead_letters SET headers = ? WHERE id = ?")
                .bind(headers::to_json(&table).to_string())
                .bind(id)
                .execute(pool)
                .await?;
            rewritten += 1;
        }
    }
}

impl Processor for DeadLetterRecorder {
    fn function(&self) -> &str {
        &self.function
    }

    fn queue(&self) -> String {
        dead_letter_queue_name(&self.function)
    }

    async fn process(&self, delivery: &IncomingDelivery) -> Disposition {
        match record(&self.pool, &self.function, delivery).await {
            Ok(_) => Disposition::Ack,
            Err(error) => Disposition::Requeue {
                after: delivery.requeue_after(),
                error: format!("recording dead letter: {error}"),
            },
        }
    }
}
