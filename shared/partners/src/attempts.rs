//! One record per POST deliver-webhook made (`partner_notification_attempts`; the migration's
//! header comment is the reference): what the partner API shows of a notification's delivery
//! history. Written on the settle's connection; pruned after a retention by deliver-webhook's
//! `prune-attempts` job.

use std::time::Duration;

use chrono::{DateTime, Utc};
use paybus_retry::clock::micros;
use serde::Serialize;
use sqlx::{MySql, MySqlConnection, QueryBuilder};

/// `error` is a VARCHAR(2000).
const ERROR_MAX_CHARS: usize = 2000;

/// Whose POST an attempt is: the notification, its partner and the claim's attempt number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptOf {
    pub notification_id: u64,
    pub partner_id: u64,
    /// The notification's attempt number (1 = the first; a re-delivery starts again at 1).
    pub attempt: u32,
}

/// One POST as deliver-webhook saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAttempt {
    pub started_at: DateTime<Utc>,
    /// The HTTP status, when an answer came.
    pub status_code: Option<u16>,
    pub latency: Duration,
    /// Why it failed (None for a 2xx).
    pub error: Option<String>,
}

/// A recorded attempt, as the partner API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct DeliveryAttempt {
    pub id: u64,
    pub notification_id: u64,
    /// The notification's attempt number then (a re-delivery starts again at 1).
    pub attempt: u32,
    pub started_at: DateTime<Utc>,
    pub status_code: Option<u16>,
    pub latency_ms: u32,
    pub error: Option<String>,
}

/// Records one POST of a notification.
pub async fn record(
    conn: &mut MySqlConnection,
    of: AttemptOf,
    attempt: &NewAttempt,
) -> Result<(), sqlx::Error> {
    let error = attempt
        .error
        .as_deref()
        .map(|e| e.chars().take(ERROR_MAX_CHARS).collect::<String>());
    sqlx::query(
        "INSERT INTO partner_notification_attempts \
         (notification_id, partner_id, attempt, started_at, status_code, latency_ms, error) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(of.notification_id)
    .bind(of.partner_id)
    .bind(of.attempt)
    .bind(attempt.started_at)
    .bind(attempt.status_code)
    .bind(u32::try_from(attempt.latency.as_millis()).unwrap_or(u32::MAX))
    .bind(error)
    .execute(conn)
    .await?;
    Ok(())
}

/// The attempts of notification `notification_id` if it is `partner_id`'s (none otherwise),
/// oldest first.
pub async fn of_notification(
    conn: &mut MySqlConnection,
    partner_id: u64,
    notification_id: u64,
) -> Result<Vec<DeliveryAttempt>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, notification_id, attempt, started_at, status_code, latency_ms, error \
         FROM partner_notification_attempts \
         WHERE partner_id = ? AND notification_id = ? ORDER BY id",
    )
    .bind(partner_id)
    .bind(notification_id)
    .fetch_all(conn)
    .await
}

/// The attempts of `partner_id`'s notifications `notification_ids` (a page of them), oldest
/// first; one index range per notification.
pub async fn of_notifications(
    conn: &mut MySqlConnection,
    partner_id: u64,
    notification_ids: &[u64],
) -> Result<Vec<DeliveryAttempt>, sqlx::Error> {
    if notification_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = QueryBuilder::<MySql>::new(
        "SELECT id, notification_id, attempt, started_at, status_code, latency_ms, error \
         FROM partner_notification_attempts WHERE partner_id = ",
    );
    query
        .push_bind(partner_id)
        .push(" AND notification_id IN (");
    let mut ids = query.separated(", ");
    for id in notification_ids {
        ids.push_bind(*id);
    }
    query.push(") ORDER BY id");
    query.build_query_as().fetch_all(conn).await
}

/// Deletes up to `batch` attempts recorded more than `retention` ago; returns how many.
pub async fn prune(
    conn: &mut MySqlConnection,
    retention: Duration,
    batch: u32,
) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM partner_notification_attempts \
         WHERE created_at < NOW(6) - INTERVAL ? MICROSECOND ORDER BY created_at LIMIT ?",
    )
    .bind(micros(retention))
    .bind(batch)
    .execute(conn)
    .await?
    .rows_affected())
}
