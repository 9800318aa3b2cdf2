//! The `partner_notifications` row's state machine, as deliver-webhook moves it (the migration's
//! header comment is the reference):
//!
//! ```text
//!            claim: attempts+1, next_attempt_at = NOW + lease      2xx
//! PENDING ──────────────────────────────────────────► (in flight) ─────► DELIVERED
//!   ▲  │ partner has no webhook_url                      │  failure, below the limit:
//!   │  └──────────────────────────► SKIPPED              │  next_attempt_at = NOW + backoff,
//!   └────────────────────────────────────────────────────┘  last_error
//!                                                         │  failure at the limit
//!                                                         └──────────────────────► FAILED
//! ```
//!
//! Every transition is a conditional UPDATE whose affected rows decide (principle 1), each in
//! its own short transaction; nothing here is held open across the POST (principle 3). A
//! settle is conditional on the claim it settles (`status = 'PENDING' AND attempts = n`), so
//! a delivery whose lease ran out cannot overwrite the outcome of the attempt after it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{MySqlConnection, MySqlPool};

/// `last_error` is a VARCHAR(2000).
const LAST_ERROR_MAX: usize = 2000;

/// A row as the claim first reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
struct NotificationRow {
    status: String,
    attempts: u32,
    next_attempt_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
    now: DateTime<Utc>,
    event: String,
    payload: String,
    partner_id: u64,
    webhook_url: Option<String>,
    webhook_secret: String,
}

/// A row this delivery holds: everything needed to POST it, and the attempt it is.
#[derive(Debug, Clone)]
pub struct ClaimedNotification {
    pub id: u64,
    pub partner_id: u64,
    pub event: String,
    /// The JSON body, exactly as frozen by the transition (and signed as such).
    pub payload: String,
    pub webhook_url: String,
    pub webhook_secret: String,
    /// This attempt's number (1 = the first); the settle is conditional on it.
    pub attempts: u32,
}

/// Where a notification stands when it could not be claimed.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct NotificationState {
    pub status: String,
    pub attempts: u32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// The database's clock when this was read.
    pub now: DateTime<Utc>,
}

/// What the claim made of a notification.
#[derive(Debug, Clone)]
pub enum Claim {
    /// This delivery holds the row until the lease runs out.
    Claimed(ClaimedNotification),
    /// The partner takes no webhooks: the row is now SKIPPED.
    SkippedNoWebhook { partner_id: u64 },
    /// Not ours to send now: delivered, skipped or failed already, in flight elsewhere, or
    /// not due yet.
    NotClaimed(NotificationState),
    /// No such notification.
    Missing,
}

/// Short transaction 1: claims a due PENDING row (counts the attempt, pushes
/// `next_attempt_at` out by `lease`), or settles it SKIPPED when the partner has no webhook
/// URL (also only once due, so it never steps on a delivery in flight). READ COMMITTED, so
/// every read sees the latest committed row.
#[tracing::instrument(skip_all, fields(notification_id = id))]
pub async fn claim(pool: &MySqlPool, id: u64, lease: Duration) -> Result<Claim, sqlx::Error> {
    let mut tx = paybus_platform::db::begin_read_committed(pool).await?;
    let row: Option<NotificationRow> = sqlx::query_as(
        "SELECT n.status, n.attempts, n.next_attempt_at, n.last_error, NOW(6) AS now, \
                n.event, n.payload, n.partner_id, p.webhook_url, p.webhook_secret \
         FROM partner_notifications n JOIN partners p ON p.id = n.partner_id \
         WHERE n.id = ?",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        tx.rollback().await?;
        return Ok(Claim::Missing);
    };
    // A quick exit for the common duplicate; the UPDATEs below decide either way.
    if row.status != "PENDING" {
        tx.rollback().await?;
        return Ok(Claim::NotClaimed(NotificationState {
            status: row.status,
            attempts: row.attempts,
            next_attempt_at: row.next_attempt_at,
            last_error: row.last_error,
            now: row.now,
        }));
    }
    let webhook_url = row.webhook_url.as_deref().map(str::trim).unwrap_or("");
    if webhook_url.is_empty() {
        let skipped = sqlx::query(
            "UPDATE partner_notifications \
             SET status = 'SKIPPED', next_attempt_at = NULL, \
                 last_error = 'partner has no webhook_url' \
             WHERE id = ? AND status = 'PENDING' AND next_attempt_at <= NOW(6)",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if skipped == 1 {
            tx.commit().await?;
            return Ok(Claim::SkippedNoWebhook {
                partner_id: row.partner_id,
            });
        }
        let state = describe(&mut tx, id).await?;
        tx.rollback().await?;
        return Ok(state.map_or(Claim::Missing, Claim::NotClaimed));
    }
    let claimed = sqlx::query(
        "UPDATE partner_notifications \
         SET attempts = attempts + 1, next_attempt_at = NOW(6) + INTERVAL ? MICROSECOND \
         WHERE id = ? AND status = 'PENDING' AND next_attempt_at <= NOW(6)",
    )
    .bind(micros(lease))
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if claimed == 0 {
        let state = describe(&mut tx, id).await?;
        tx.rollback().await?;
        return Ok(state.map_or(Claim::Missing, Claim::NotClaimed));
    }
    // The row is locked by our UPDATE: this is the count we claimed.
    let attempts: u32 =
        sqlx::query_scalar("SELECT attempts FROM partner_notifications WHERE id = ?")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
    tx.commit().await?;
    Ok(Claim::Claimed(ClaimedNotification {
        id,
        partner_id: row.partner_id,
        event: row.event,
        payload: row.payload,
        webhook_url: webhook_url.to_owned(),
        webhook_secret: row.webhook_secret,
        attempts,
    }))
}

/// The row's state now (for the log line of a skip).
async fn describe(
    conn: &mut MySqlConnection,
    id: u64,
) -> Result<Option<NotificationState>, sqlx::Error> {
    sqlx::query_as(
        "SELECT status, attempts, next_attempt_at, last_error, NOW(6) AS now \
         FROM partner_notifications WHERE id = ?",
    )
    .bind(id)
    .fetch_optional(conn)
    .await
}

/// Whether a settle found its claim still in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Yes,
    /// The claim had been taken over (its lease ran out and another attempt claimed the row)
    /// or the row was changed by ops: nothing was written.
    ClaimLost,
}

fn settled(rows: u64) -> Settled {
    if rows == 1 {
        Settled::Yes
    } else {
        Settled::ClaimLost
    }
}

/// Short transaction 2 after a 2xx: PENDING → DELIVERED. `last_error` keeps the failure
/// before the success, if any, for the record.
pub async fn settle_delivered(
    pool: &MySqlPool,
    claim: &ClaimedNotification,
) -> Result<Settled, sqlx::Error> {
    let rows = sqlx::query(
        "UPDATE partner_notifications \
         SET status = 'DELIVERED', delivered_at = NOW(6), next_attempt_at = NULL \
         WHERE id = ? AND status = 'PENDING' AND attempts = ?",
    )
    .bind(claim.id)
    .bind(claim.attempts)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(settled(rows))
}

/// Short transaction 2 after a failure below the limit: stays PENDING, due again after
/// `delay` (database clock), with the error.
pub async fn settle_retry(
    pool: &MySqlPool,
    claim: &ClaimedNotification,
    delay: Duration,
    error: &str,
) -> Result<Settled, sqlx::Error> {
    let rows = sqlx::query(
        "UPDATE partner_notifications \
         SET last_error = ?, next_attempt_at = NOW(6) + INTERVAL ? MICROSECOND \
         WHERE id = ? AND status = 'PENDING' AND attempts = ?",
    )
    .bind(bounded(error))
    .bind(micros(delay))
    .bind(claim.id)
    .bind(claim.attempts)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(settled(rows))
}

/// Short transaction 2 after the failure at the limit: PENDING → FAILED (terminal; ops may
/// put it back to PENDING).
pub async fn settle_failed(
    pool: &MySqlPool,
    claim: &ClaimedNotification,
    error: &str,
) -> Result<Settled, sqlx::Error> {
    let rows = sqlx::query(
        "UPDATE partner_notifications \
         SET status = 'FAILED', last_error = ?, next_attempt_at = NULL \
         WHERE id = ? AND status = 'PENDING' AND attempts = ?",
    )
    .bind(bounded(error))
    .bind(claim.id)
    .bind(claim.attempts)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(settled(rows))
}

pub(crate) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// At most [`LAST_ERROR_MAX`] characters, cut on a character boundary.
fn bounded(error: &str) -> String {
    error.chars().take(LAST_ERROR_MAX).collect()
}
