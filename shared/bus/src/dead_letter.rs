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

pub mod group_counts;

use group_counts::Change;

pub const H_FUNCTION: &str = "x-paybus-function";
pub const H_REASON: &str = "x-paybus-reason";
pub const H_ERROR: &str = "x-paybus-error";
pub const H_ATTEMPTS: &str = "x-paybus-attempts";
pub const H_FAILED_AT: &str = "x-paybus-failed-at";
pub const H_ROUTING_KEY: &str = "x-paybus-routing-key";
pub const H_DEAD_LETTER_ID: &str = "x-paybus-dead-letter-id";
/// One id per failure the runtime decides (a fresh UUID each time it dead-letters a delivery):
/// what tells a DLQ redelivering the same dead letter (recorded once) from a new failure of
/// the same message (counted again).
pub const H_FAILURE_ID: &str = "x-paybus-failure-id";

/// Longest error text carried in a header (the table keeps the same).
const MAX_ERROR_LEN: usize = 4_000;

/// The WARN line of a failure recorded for the first time, of one that failed again (a replayed
/// letter), and of one that failed again after ops archived or replayed it; each with
/// `function`. The AWS deployment counts them (a metric filter on the recorder's log) to roll a
/// deploy back on new dead letters.
pub const RECORDED: &str = "dead letter recorded";
pub const RECORDED_AGAIN: &str = "dead letter recorded again";
pub const RECORDED_REOPENED: &str = "dead letter recorded again, reopened";
pub const RECORDED_LINES: [&str; 3] = [RECORDED, RECORDED_AGAIN, RECORDED_REOPENED];

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
    text_header(
        &mut headers,
        H_FAILURE_ID,
        &uuid::Uuid::new_v4().to_string(),
    );
    let properties = delivery.properties.clone().with_headers(headers);
    publisher
        .publish_raw(DEAD_LETTER_EXCHANGE, function, &delivery.body, properties)
        .await
}

/// The letter a failure belongs to: the same decision about the same message is one letter,
/// whose failures are counted (a crash between the confirm and the ack, a Lambda batch retried
/// for another message's fault, the same message failing again: each one more failure of it).
/// Messages without an id are keyed by their body's hash.
fn dead_letter_id(function: &str, delivery: &IncomingDelivery, dead: &DeadLetter) -> String {
    bounded_id(format!(
        "{function}:{}:{}",
        message_key(delivery),
        dead.reason.as_str()
    ))
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

/// A dead letter as stored, and the failure being recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRow {
    /// The letter: the same function, message and reason are one letter.
    pub dead_letter_id: String,
    /// This failure of it (see [`H_FAILURE_ID`]).
    pub failure_id: String,
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
            // A dead letter from before failure ids were stamped: its letter id was the only
            // identity it had.
            failure_id: bounded_id(
                header_text(headers, H_FAILURE_ID).unwrap_or_else(|| id.clone()),
            ),
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
            let letter = format!("broker:{}:{reason}", message_key(delivery));
            // The broker stamps no id of ours, but its x-death entry says how often and since
            // when this message died here: a redelivery from the DLQ repeats both, another
            // death of the message does not.
            let since = death.as_ref().and_then(|d| d.time).unwrap_or(0);
            DeadLetterRow {
                failure_id: bounded_id(format!("{letter}:{count}:{since}")),
                dead_letter_id: bounded_id(letter),
                function_name: function.to_owned(),
                message_id,
                correlation_id,
                routing_key: death
                    .and_then(|d| d.routing_key.clone())
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
    /// When the message first died for this queue and reason (seconds since the epoch).
    time: Option<u64>,
    routing_key: Option<String>,
}

/// The message id, or for a message without one a hash of its body.
fn message_key(delivery: &IncomingDelivery) -> String {
    use sha2::{Digest, Sha256};
    delivery
        .message_id()
        .unwrap_or_else(|| hex::encode(&Sha256::digest(&delivery.body)[..16]))
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
    let time = match death.inner().get("time") {
        Some(AMQPValue::Timestamp(time)) => Some(*time),
        _ => None,
    };
    Some(Death {
        count: header_integer(Some(death), "count"),
        time,
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

/// Records the failure a dead-lettered delivery carries ([`record_failure`]); true when it was
/// a failure not recorded yet.
pub async fn record(
    pool: &MySqlPool,
    function: &str,
    delivery: &IncomingDelivery,
) -> Result<bool, sqlx::Error> {
    record_delivered(pool, &describe(function, delivery), delivery).await
}

async fn record_delivered(
    pool: &MySqlPool,
    row: &DeadLetterRow,
    delivery: &IncomingDelivery,
) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let recorded = record_failure(&mut tx, row, &delivery.body, &headers_json(delivery)).await?;
    tx.commit().await?;
    Ok(recorded)
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
        failure_id: uuid::Uuid::new_v4().to_string(),
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
    text_header(&mut headers, H_FAILURE_ID, &row.failure_id);
    let headers = headers::to_json(&headers).to_string();
    record_failure(conn, &row, &message.body, &headers).await
}

/// Records one failure, in the caller's transaction: a new letter, or the letter it belongs to
/// counted once more — and reopened (NEW again, `reopened_at` set) when it had been archived or
/// replayed, so a failure that comes back after ops dealt with it is seen again, never
/// swallowed. A failure recorded already (its `failure_id`: a DLQ redelivering the same dead
/// letter) changes nothing. The letter's group counts ([`group_counts`]) change with it. True
/// when this call recorded a new failure.
pub async fn record_failure(
    conn: &mut MySqlConnection,
    row: &DeadLetterRow,
    body: &[u8],
    headers: &str,
) -> Result<bool, sqlx::Error> {
    let new_failure = sqlx::query(
        "INSERT IGNORE INTO dead_letter_failures (failure_id, dead_letter_id) VALUES (?, ?)",
    )
    .bind(&row.failure_id)
    .bind(&row.dead_letter_id)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        == 1;
    if !new_failure {
        return Ok(false);
    }
    super::activity::count_dead_letter(&row.function_name);
    // The status is left alone here: whether this failure reopens the letter is decided below,
    // under the lock this statement takes, so the group counts know which it was.
    let affected = sqlx::query(
        "INSERT INTO dead_letters (dead_letter_id, function_name, message_id, \
         correlation_id, routing_key, reason, error, attempts, body, headers, shard_key, \
         last_failed_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, CURRENT_TIMESTAMP(6)) \
         ON DUPLICATE KEY UPDATE failures = failures + 1, \
         last_failed_at = CURRENT_TIMESTAMP(6), error = ?, attempts = ?",
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
    .bind(indexed_shard_key(body))
    .bind(&row.error)
    .bind(row.attempts)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    // MySQL's affected rows for an upsert: 1 inserted, 2 updated.
    let recorded = if affected == 1 {
        group_counts::apply(conn, &row.function_name, &row.reason, Change::Recorded).await?;
        RECORDED
    } else if let Change::Reopened { .. } = failed_again(conn, &row.dead_letter_id).await? {
        RECORDED_REOPENED
    } else {
        RECORDED_AGAIN
    };
    tracing::warn!(
        function = %row.function_name, message_id = row.message_id.as_deref().unwrap_or(""),
        dead_letter_id = %row.dead_letter_id, reason = %row.reason, error = %row.error,
        "{recorded}"
    );
    Ok(true)
}

/// Reopens letter `dead_letter_id` (locked by the caller's upsert, its failure counted) if it
/// was no longer NEW, and applies the change to its group: the group it is stored under, which
/// a broker-made letter id shared by two functions' queues may make another than the failing
/// delivery's.
async fn failed_again(
    conn: &mut MySqlConnection,
    dead_letter_id: &str,
) -> Result<Change, sqlx::Error> {
    let (id, function, reason, failures): (u64, String, String, u32) = sqlx::query_as(
        "SELECT id, function_name, reason, failures FROM dead_letters \
         WHERE dead_letter_id = ? FOR UPDATE",
    )
    .bind(dead_letter_id)
    .fetch_one(&mut *conn)
    .await?;
    let reopened = sqlx::query(
        "UPDATE dead_letters SET status = 'NEW', reopened_at = CURRENT_TIMESTAMP(6) \
         WHERE id = ? AND status <> 'NEW'",
    )
    .bind(id)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        == 1;
    let change = if reopened {
        Change::Reopened { failures }
    } else {
        Change::FailedAgain
    };
    group_counts::apply(conn, &function, &reason, change).await?;
    Ok(change)
}

/// The body's shard key as the trace looks letters up by it; a key longer than the column
/// (no message of ours has one) is not indexed rather than cut to another entity's key.
fn indexed_shard_key(body: &[u8]) -> Option<String> {
    super::envelope::shard_key_of(body).filter(|key| key.chars().count() <= 190)
}

/// Records the dead letter of work that failed for good outside a delivery — a row a
/// sweeper job claimed in a batch, or an attempt made inline in an API request — in the
/// caller's transaction, so the row's terminal state and its dead letter commit together
/// (principle 9) even while the broker is down. `message` is the message that would have
/// carried the work (what a replay publishes); the row looks like a handler's `Failed`: same
/// id scheme, reason `failed`, the `x-paybus-*` headers as readable JSON. Each call is a
/// failure of its own ([`record_failure`]).
pub async fn record_unsent(
    conn: &mut MySqlConnection,
    function: &str,
    message: &OutgoingMessage,
    error: &str,
    attempts: u32,
) -> Result<bool, sqlx::Error> {
    let reason = DeadLetterReason::Failed.as_str();
    let dead_letter_id = format!("{function}:{}:{reason}", message.id);
    record_given_up(conn, function, &dead_letter_id, message, error, attempts).await
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
    let message_id = delivery.message_id();
    DeadLetterRow {
        dead_letter_id: bounded_id(format!("{UNROUTABLE}:{}", message_key(delivery))),
        // Nothing of ours was stamped on it: every arrival counts (a crash between recording
        // and the ack may count one twice; never none).
        failure_id: uuid::Uuid::new_v4().to_string(),
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
        match record_delivered(&self.pool, &describe_unrouted(delivery), delivery).await {
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
    record_delivered(pool, &row, delivery).await
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
