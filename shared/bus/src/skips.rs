//! Deliveries a function skipped, kept for the trace of a money movement (`paybus trace`).
//!
//! A skipped delivery (a duplicate of a confirmation already applied, a message about a row
//! already past it) is acked and changes nothing, so no workflow row records it; the runtime
//! writes one `skipped_deliveries` row for it after the handler answered, found later by the
//! entity its message names (the envelope's shard key). Only skips are written — the happy
//! path costs nothing — and a failed write is logged, never the delivery's failure: the
//! record is for people, the ack is for the money. The relay's housekeeping prunes them with
//! the outbox's published rows.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{MySql, MySqlConnection, MySqlPool, QueryBuilder};
use uuid::Uuid;

/// One skipped delivery to record.
#[derive(Debug, Clone)]
pub struct Skip {
    pub message_id: Uuid,
    pub correlation_id: Uuid,
    pub routing_key: String,
    pub shard_key: Option<String>,
    pub reason: String,
}

/// A recorded skip.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Skipped {
    pub message_id: String,
    pub correlation_id: String,
    pub reason: String,
    pub skipped_at: DateTime<Utc>,
}

/// Records `skips` of `function` in one statement; a failure is logged (see the module docs).
pub async fn record(pool: &MySqlPool, function: &str, skips: &[Skip]) {
    if skips.is_empty() {
        return;
    }
    let mut insert = QueryBuilder::<MySql>::new(
        "INSERT INTO skipped_deliveries \
         (function_name, message_id, correlation_id, routing_key, shard_key, reason) ",
    );
    insert.push_values(skips, |mut row, skip| {
        row.push_bind(function)
            .push_bind(skip.message_id.to_string())
            .push_bind(skip.correlation_id.to_string())
            .push_bind(skip.routing_key.chars().take(190).collect::<String>())
            .push_bind(
                skip.shard_key
                    .as_deref()
                    .map(|key| key.chars().take(190).collect::<String>()),
            )
            .push_bind(skip.reason.chars().take(1000).collect::<String>());
    });
    if let Err(error) = insert.build().execute(pool).await {
        tracing::warn!(function, %error, skipped = skips.len(),
            "could not record skipped deliveries (the trace will not show them)");
    }
}

/// The skips of `function`'s messages about `shard_key`, oldest first (at most `limit`).
pub async fn of_entity(
    conn: &mut MySqlConnection,
    function: &str,
    shard_key: &str,
    limit: u32,
) -> Result<Vec<Skipped>, sqlx::Error> {
    sqlx::query_as(
        "SELECT message_id, correlation_id, reason, skipped_at FROM skipped_deliveries \
         WHERE function_name = ? AND shard_key = ? ORDER BY id LIMIT ?",
    )
    .bind(function)
    .bind(shard_key)
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// Deletes records older than `retention`, `batch` rows a statement.
pub async fn prune(pool: &MySqlPool, retention: Duration, batch: u32) -> Result<u64, sqlx::Error> {
    let mut total = 0;
    loop {
        let deleted = sqlx::query(
            "DELETE FROM skipped_deliveries WHERE skipped_at < NOW(6) - INTERVAL ? SECOND LIMIT ?",
        )
        .bind(retention.as_secs())
        .bind(batch)
        .execute(pool)
        .await?
        .rows_affected();
        total += deleted;
        if deleted < u64::from(batch) {
            return Ok(total);
        }
    }
}
