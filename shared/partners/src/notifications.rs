//! Partner notifications owed by a transition (principle 8): written in the transition's own
//! transaction with the `partner.notification.created` message, delivered after commit by
//! deliver-webhook. The claim and the settles are the retry kit on [`NOTIFICATIONS`] (an in-place
//! lease), each a conditional UPDATE in its own short transaction; nothing is open across the POST.
//!
//! ```text
//!            claim: attempts+1, next_attempt_at = now + lease      2xx
//! PENDING ──────────────────────────────────────────► (in flight) ─────► DELIVERED
//!   ▲  │ partner has no webhook_url                      │  failure, below the limit:
//!   │  └──────────────────────────► SKIPPED              │  next_attempt_at = now + backoff,
//!   └────────────────────────────────────────────────────┘  last_error
//!                                                         │  failure at the limit
//!                                                         └──────────────────────► FAILED
//! ```

use std::{collections::BTreeMap, time::Duration};

use paybus_bus::{Envelope, Message, UnitOfWork, outbox::OutboxError};
use paybus_config::sealed::{SealError, Sealer};
use paybus_db as db;
use paybus_ops::actor::Actor;
use paybus_ops::ops_log::{self, Entry};
use paybus_retry::{
    AfterFailure, AttemptCount, Claim, Clock, Lease, RetryPolicy, RowState, Settled, WorkTable,
};
use serde::{Deserialize, Serialize};
use sqlx::{Connection, MySql, MySqlConnection, MySqlPool, QueryBuilder};

use crate::{
    attempts::{self, AttemptOf, NewAttempt},
    breaker::BreakerRead,
    webhook_secrets::{self, SigningSecrets},
};

/// `partner.notification.created {notification_id}`: a notification row is ready to send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationCreated {
    pub notification_id: u64,
}

impl Message for NotificationCreated {
    const TYPE: &'static str = "partner.notification.created";

    fn shard_key(&self) -> Option<String> {
        Some(self.notification_id.to_string())
    }
}

paybus_db::column_enum! {
    /// `partner_notifications.status`.
    pub enum NotificationStatus {
        /// Waiting for its (next) attempt, or in flight under a claim's lease.
        Pending,
        /// Terminal: the partner answered 2xx.
        Delivered,
        /// Terminal: the partner takes no webhooks.
        Skipped,
        /// Terminal until ops retry it: the attempt limit was reached (with a dead letter).
        Failed,
    }
}

/// A notification as ops see it (the frozen payload left out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct NotificationView {
    pub id: u64,
    pub partner_id: u64,
    pub event: String,
    pub reference_type: String,
    pub reference_id: u64,
    pub status: String,
    pub attempts: u32,
    pub next_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
    pub last_error: Option<String>,
    pub delivered_at: Option<chrono::DateTime<chrono::Utc>>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// The notification, or `None` (a dead letter's triage).
pub async fn find(
    conn: &mut MySqlConnection,
    id: u64,
) -> Result<Option<NotificationView>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, partner_id, event, reference_type, reference_id, status, attempts, \
                next_attempt_at, last_error, delivered_at, created_at \
         FROM partner_notifications WHERE id = ?",
    )
    .bind(id)
    .fetch_optional(conn)
    .await
}

const VIEW_COLUMNS: &str = "id, partner_id, event, reference_type, reference_id, status, \
                            attempts, next_attempt_at, last_error, delivered_at, created_at";

/// Notification `id` if it is `partner_id`'s (the partner API: another partner's is `None`).
pub async fn find_for_partner(
    conn: &mut MySqlConnection,
    partner_id: u64,
    id: u64,
) -> Result<Option<NotificationView>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {VIEW_COLUMNS} FROM partner_notifications WHERE id = ? AND partner_id = ?"
    )))
    .bind(id)
    .bind(partner_id)
    .fetch_optional(conn)
    .await
}

/// A page of `partner_id`'s notifications, newest first: those with an id below `before_id`
/// (all, without it), at most `limit` (`index_partner_notifications_for_partner`).
pub async fn list_for_partner(
    conn: &mut MySqlConnection,
    partner_id: u64,
    before_id: Option<u64>,
    limit: u32,
) -> Result<Vec<NotificationView>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {VIEW_COLUMNS} FROM partner_notifications \
         WHERE partner_id = ? AND id < ? ORDER BY id DESC LIMIT ?"
    )))
    .bind(partner_id)
    .bind(before_id.unwrap_or(u64::MAX))
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// What [`redeliver`] made of a request to send a notification again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redelivery {
    /// It was DELIVERED, FAILED or SKIPPED: PENDING again, its message sent.
    Queued,
    /// It is PENDING already (waiting or in flight): left alone.
    AlreadyPending,
    /// No such notification of this partner.
    NotFound,
}

/// Sends a DELIVERED, FAILED or SKIPPED notification of `partner_id` again: PENDING with a
/// fresh attempt count, due now, under the **same id** (so the same `webhook-id`, which the
/// partner deduplicates on), with its `partner.notification.created` message and an ops-log
/// entry (`partner_notification.redeliver`, by `actor`: the partner itself or ops) in `uow`'s
/// transaction; the caller commits.
pub async fn redeliver(
    uow: &mut UnitOfWork<'_>,
    partner_id: u64,
    id: u64,
    actor: &Actor,
) -> Result<Redelivery, OutboxError> {
    // The message goes out in this transaction, so the row counts as republished now.
    let reopened = sqlx::query(
        "UPDATE partner_notifications SET status = 'PENDING', attempts = 0, \
         next_attempt_at = NOW(6), republished_at = NOW(6), delivered_at = NULL \
         WHERE id = ? AND partner_id = ? AND status IN ('DELIVERED', 'FAILED', 'SKIPPED')",
    )
    .bind(id)
    .bind(partner_id)
    .execute(&mut **uow)
    .await?
    .rows_affected();
    if reopened == 0 {
        let status: Option<(String,)> = sqlx::query_as(
            "SELECT status FROM partner_notifications WHERE id = ? AND partner_id = ?",
        )
        .bind(id)
        .bind(partner_id)
        .fetch_optional(&mut **uow)
        .await?;
        return Ok(match status {
            Some(_) => Redelivery::AlreadyPending,
            None => Redelivery::NotFound,
        });
    }
    uow.send(&Envelope::new(NotificationCreated {
        notification_id: id,
    }))
    .await?;
    ops_log::append(
        uow,
        &Entry {
            actor,
            action: "partner_notification.redeliver",
            subject: &format!("partner_notification:{id}"),
            detail: &serde_json::json!({ "partner_id": partner_id }),
        },
    )
    .await?;
    Ok(Redelivery::Queued)
}

/// The notification rows as the retry kit works them.
pub static NOTIFICATIONS: WorkTable = WorkTable {
    table: "partner_notifications",
    status: "status",
    due: "PENDING",
    failed: "FAILED",
    attempts: "attempts",
    count: AttemptCount::OnClaim,
    next_attempt_at: "next_attempt_at",
    due_index: "index_partner_notifications_due",
    last_error: "last_error",
    // `last_error` is a VARCHAR(2000).
    last_error_max: 2000,
    lease: Lease::InPlace,
    republished_at: Some("republished_at"),
    held_for_a_human: None,
};

/// One notification to create.
#[derive(Debug, Clone)]
pub struct NewNotification<'a> {
    pub partner_id: u64,
    /// e.g. `WITHDRAWAL_CONFIRMED`
    pub event: &'static str,
    /// e.g. `WITHDRAWAL`
    pub reference_type: &'static str,
    pub reference_id: u64,
    /// The JSON body the partner receives, frozen now.
    pub payload: &'a serde_json::Value,
}

/// The unique key that makes a notification once-only per (event, reference).
const EVENT_REFERENCE_KEY: &str = "uk_partner_notifications_event_reference";

/// Inserts one notification and its message: [`enqueue_all`] with one.
pub async fn enqueue(
    uow: &mut UnitOfWork<'_>,
    notification: &NewNotification<'_>,
    correlation_id: uuid::Uuid,
) -> Result<Option<u64>, OutboxError> {
    let mut ids = enqueue_all(uow, &[(notification.clone(), correlation_id)]).await?;
    Ok(ids.pop().flatten())
}

/// Inserts the notifications and their messages in `uow`'s transaction: one id per
/// notification, in the caller's order, `None` where one already exists for (event,
/// reference) — the unique key is the last line of defence against a second
/// `WITHDRAWAL_CONFIRMED`, and hitting it is expected, not an error. Each message carries the
/// correlation id paired with its notification.
///
/// Per event and reference type one multi-row INSERT (and, for several rows, one read of their
/// ids: the auto-increment ids of a multi-row INSERT need not be consecutive), then one INSERT
/// of all the messages. The rows go in (event, reference type, reference id) order, the unique
/// key's, so two transactions' inserts meet in the index in one order. The server does not say
/// which row of several collided, so on that rare path the group goes again one row at a time
/// (MySQL rolls back only the failed statement: the transaction stays usable). Any other error
/// propagates.
pub async fn enqueue_all(
    uow: &mut UnitOfWork<'_>,
    notifications: &[(NewNotification<'_>, uuid::Uuid)],
) -> Result<Vec<Option<u64>>, OutboxError> {
    let mut ids: Vec<Option<u64>> = vec![None; notifications.len()];
    let key = |i: usize| {
        let n = &notifications[i].0;
        (n.event, n.reference_type, n.reference_id)
    };
    let mut order: Vec<usize> = (0..notifications.len()).collect();
    order.sort_by_key(|&i| key(i));
    for group in order.chunk_by(|&a, &b| key(a).0 == key(b).0 && key(a).1 == key(b).1) {
        let mut one_at_a_time: &[usize] = group;
        if group.len() > 1 {
            match insert(uow, notifications, group).await {
                Ok(_) => {
                    let id_of = new_ids(uow, notifications, group).await?;
                    for &i in group {
                        // Our own INSERT just wrote it; only a concurrent DELETE could hide it.
                        let Some(&id) = id_of.get(&notifications[i].0.reference_id) else {
                            return Err(OutboxError::Database(sqlx::Error::RowNotFound));
                        };
                        ids[i] = Some(id);
                    }
                    one_at_a_time = &[];
                }
                Err(e) if db::is_duplicate_on(&e, EVENT_REFERENCE_KEY) => tracing::debug!(
                    notifications = group.len(),
                    "a notification of the batch already exists; inserting them one at a time"
                ),
                Err(e) => return Err(e.into()),
            }
        }
        for &i in one_at_a_time {
            match insert(uow, notifications, &[i]).await {
                Ok(done) => ids[i] = Some(done.last_insert_id()),
                Err(e) if db::is_duplicate_on(&e, EVENT_REFERENCE_KEY) => {
                    let notification = &notifications[i].0;
                    tracing::warn!(
                        event = notification.event,
                        reference_type = notification.reference_type,
                        reference_id = notification.reference_id,
                        "notification already exists; not sent again"
                    );
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    let messages: Vec<Envelope<NotificationCreated>> = ids
        .iter()
        .zip(notifications)
        .filter_map(|(id, (_, correlation_id))| {
            id.map(|notification_id| {
                Envelope::with_correlation(*correlation_id, NotificationCreated { notification_id })
            })
        })
        .collect();
    if !messages.is_empty() {
        uow.send_all(&messages).await?;
    }
    Ok(ids)
}

/// One multi-row INSERT of `rows` (indices into `notifications`, of one event and reference
/// type).
async fn insert(
    uow: &mut UnitOfWork<'_>,
    notifications: &[(NewNotification<'_>, uuid::Uuid)],
    rows: &[usize],
) -> Result<sqlx::mysql::MySqlQueryResult, sqlx::Error> {
    let mut insert = QueryBuilder::<MySql>::new(
        "INSERT INTO partner_notifications \
         (partner_id, event, reference_type, reference_id, payload) ",
    );
    insert.push_values(rows, |mut row, &i| {
        let notification = &notifications[i].0;
        row.push_bind(notification.partner_id)
            .push_bind(notification.event)
            .push_bind(notification.reference_type)
            .push_bind(notification.reference_id)
            .push_bind(notification.payload.to_string());
    });
    insert.build().execute(&mut **uow).await
}

/// The ids of `rows` just inserted, by reference id.
async fn new_ids(
    uow: &mut UnitOfWork<'_>,
    notifications: &[(NewNotification<'_>, uuid::Uuid)],
    rows: &[usize],
) -> Result<BTreeMap<u64, u64>, sqlx::Error> {
    let Some(&first) = rows.first() else {
        return Ok(BTreeMap::new());
    };
    let (event, reference_type) = (
        notifications[first].0.event,
        notifications[first].0.reference_type,
    );
    let mut select = QueryBuilder::<MySql>::new(
        "SELECT reference_id, id FROM partner_notifications WHERE event = ",
    );
    select
        .push_bind(event)
        .push(" AND reference_type = ")
        .push_bind(reference_type)
        .push(" AND reference_id IN (");
    let mut references = select.separated(", ");
    for &i in rows {
        references.push_bind(notifications[i].0.reference_id);
    }
    select.push(")");
    let rows: Vec<(u64, u64)> = select.build_query_as().fetch_all(&mut **uow).await?;
    Ok(rows.into_iter().collect())
}

/// A row this delivery holds: everything needed to POST it, and the claim to settle.
#[derive(Debug, Clone)]
pub struct ClaimedNotification {
    pub id: u64,
    pub partner_id: u64,
    pub event: String,
    /// The JSON body, exactly as frozen by the transition (and signed as such).
    pub payload: String,
    pub webhook_url: String,
    /// The partner's unexpired secrets, opened; an error when one does not open (a key
    /// missing from the settings), which fails the attempt unsent.
    pub secrets: Result<SigningSecrets, SealError>,
    /// The endpoint answered 410 Gone once: its deliveries are parked until ops set the URL.
    pub disabled: bool,
    /// This attempt's number (1 = the first); the settle is conditional on it.
    pub attempts: u32,
    /// The partner's circuit breaker as read with the claim.
    pub breaker: BreakerRead,
    claim: Claim,
}

impl ClaimedNotification {
    /// This attempt, as its record names it.
    pub fn attempt_of(&self) -> AttemptOf {
        AttemptOf {
            notification_id: self.id,
            partner_id: self.partner_id,
            attempt: self.attempts,
        }
    }
}

/// What the claim made of a notification.
#[derive(Debug, Clone)]
pub enum DeliveryClaim {
    /// This delivery holds the row until the lease runs out.
    Claimed(ClaimedNotification),
    /// The partner takes no webhooks: the row is now SKIPPED.
    SkippedNoWebhook { partner_id: u64 },
    /// Not ours to send now: delivered, skipped or failed already, in flight elsewhere, or
    /// not due yet.
    NotClaimed(RowState),
    /// No such notification.
    Missing,
}

#[derive(sqlx::FromRow)]
struct NotificationRow {
    status: String,
    event: String,
    payload: String,
    partner_id: u64,
    webhook_url: Option<String>,
    webhook_disabled_at: Option<chrono::DateTime<chrono::Utc>>,
    webhook_failures: u32,
    webhook_open_until: Option<chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
}

/// Short transaction 1: claims a due PENDING row (counts the attempt, pushes
/// `next_attempt_at` out by `lease`), or settles it SKIPPED when the partner has no webhook
/// URL (also only once due, so it never steps on a delivery in flight). READ COMMITTED, so
/// every read sees the latest committed row.
#[tracing::instrument(skip_all, fields(notification_id = id))]
pub async fn claim(
    pool: &MySqlPool,
    sealer: &Sealer,
    id: u64,
    lease: Duration,
    clock: &Clock,
) -> Result<DeliveryClaim, sqlx::Error> {
    let mut tx = db::begin_read_committed(pool).await?;
    let row: Option<NotificationRow> = sqlx::query_as(
        "SELECT n.status, n.event, n.payload, n.partner_id, p.webhook_url, \
                p.webhook_disabled_at, p.webhook_failures, p.webhook_open_until, COALESCE(?, NOW(6)) AS now \
         FROM partner_notifications n JOIN partners p ON p.id = n.partner_id \
         WHERE n.id = ?",
    )
    .bind(clock.sql_now())
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        tx.rollback().await?;
        return Ok(DeliveryClaim::Missing);
    };
    // A quick exit for the common duplicate; the UPDATEs below decide either way.
    if row.status != <&str>::from(NotificationStatus::Pending) {
        return not_claimed(tx, id, clock).await;
    }
    let webhook_url = row.webhook_url.as_deref().map(str::trim).unwrap_or("");
    if webhook_url.is_empty() {
        if skip_no_webhook(&mut tx, id, clock).await? == Settled::Yes {
            tx.commit().await?;
            return Ok(DeliveryClaim::SkippedNoWebhook {
                partner_id: row.partner_id,
            });
        }
        return not_claimed(tx, id, clock).await;
    }
    let Some(claim) = NOTIFICATIONS.claim(&mut tx, id, lease, clock).await? else {
        return not_claimed(tx, id, clock).await;
    };
    let secrets = webhook_secrets::signing(&mut tx, sealer, row.partner_id, clock.sql_now())
        .await?
        .and_then(|secrets| {
            if secrets.is_empty() {
                // Sealed by `paybus migrate`; until then nothing can sign.
                Err(SealError::UnknownKey {
                    key_id: "(none: the partner has no sealed webhook secret)".to_owned(),
                })
            } else {
                Ok(secrets)
            }
        });
    tx.commit().await?;
    Ok(DeliveryClaim::Claimed(ClaimedNotification {
        id,
        partner_id: row.partner_id,
        event: row.event,
        payload: row.payload,
        webhook_url: webhook_url.to_owned(),
        secrets,
        disabled: row.webhook_disabled_at.is_some(),
        attempts: claim.attempts,
        breaker: BreakerRead {
            failures: row.webhook_failures,
            open_until: row.webhook_open_until,
            now: row.now,
        },
        claim,
    }))
}

/// PENDING → SKIPPED for a partner without a webhook URL, once due (never under a lease).
async fn skip_no_webhook(
    conn: &mut MySqlConnection,
    id: u64,
    clock: &Clock,
) -> Result<Settled, sqlx::Error> {
    let skipped = sqlx::query(
        "UPDATE partner_notifications \
         SET status = 'SKIPPED', next_attempt_at = NULL, \
             last_error = 'partner has no webhook_url' \
         WHERE id = ? AND status = 'PENDING' \
           AND (next_attempt_at IS NULL OR next_attempt_at <= COALESCE(?, NOW(6)))",
    )
    .bind(id)
    .bind(clock.sql_now())
    .execute(conn)
    .await?
    .rows_affected();
    Ok(if skipped == 1 {
        Settled::Yes
    } else {
        Settled::ClaimLost
    })
}

async fn not_claimed(
    mut tx: sqlx::Transaction<'static, sqlx::MySql>,
    id: u64,
    clock: &Clock,
) -> Result<DeliveryClaim, sqlx::Error> {
    let state = NOTIFICATIONS.describe(&mut tx, id, clock).await?;
    tx.rollback().await?;
    Ok(state.map_or(DeliveryClaim::Missing, DeliveryClaim::NotClaimed))
}

/// The delivery was not attempted (its partner's breaker is open, or the partner has as many
/// deliveries in flight as it may): the row is due again after `delay`, no attempt counted.
pub async fn defer(
    pool: &MySqlPool,
    claimed: &ClaimedNotification,
    delay: Duration,
    clock: &Clock,
) -> Result<Settled, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    NOTIFICATIONS
        .defer(&mut conn, &claimed.claim, delay, None, clock)
        .await
}

/// Short transaction 2 after a 2xx: PENDING → DELIVERED. `last_error` keeps the failure
/// before the success, if any, for the record.
pub async fn settle_delivered(
    pool: &MySqlPool,
    claimed: &ClaimedNotification,
    attempt: &NewAttempt,
) -> Result<Settled, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    attempts::record(&mut conn, claimed.attempt_of(), attempt).await?;
    NOTIFICATIONS
        .settle_done(
            &mut conn,
            &claimed.claim,
            "status = 'DELIVERED', delivered_at = NOW(6), next_attempt_at = NULL",
        )
        .await
}

/// Short transaction 2 after a failure: PENDING with `last_error` and the next attempt after
/// the policy's backoff, or FAILED at the limit (terminal; ops may put it back to PENDING).
pub async fn settle_failure(
    pool: &MySqlPool,
    claimed: &ClaimedNotification,
    policy: &RetryPolicy,
    error: &str,
    clock: &Clock,
    attempt: Option<&NewAttempt>,
) -> Result<AfterFailure, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    if let Some(attempt) = attempt {
        attempts::record(&mut conn, claimed.attempt_of(), attempt).await?;
    }
    NOTIFICATIONS
        .settle_failure(&mut conn, &claimed.claim, policy, error, clock)
        .await
}

/// The endpoint answered 410 Gone: the partner's endpoint is disabled (unless it already
/// was) with `reason`, and this notification parked for `park_for` with no attempt counted —
/// it is not failed, and goes when ops set the URL again. One transaction with the attempt's
/// record. True when this disabled the endpoint.
pub async fn settle_gone(
    pool: &MySqlPool,
    claimed: &ClaimedNotification,
    attempt: &NewAttempt,
    reason: &str,
    park_for: Duration,
    clock: &Clock,
) -> Result<(Settled, bool), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    attempts::record(&mut tx, claimed.attempt_of(), attempt).await?;
    let disabled = sqlx::query(
        "UPDATE partners SET webhook_disabled_at = NOW(6), webhook_disabled_reason = ? \
         WHERE id = ? AND webhook_disabled_at IS NULL",
    )
    .bind(reason)
    .bind(claimed.partner_id)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    let settled = NOTIFICATIONS
        .defer(&mut tx, &claimed.claim, park_for, Some(reason), clock)
        .await?;
    tx.commit().await?;
    Ok((settled, disabled))
}

/// Ops' re-delivery of a FAILED notification (a replay of its dead letter once the partner's
/// endpoint works again): PENDING again with a fresh attempt count, due now, under the **same
/// id**, so the partner deduplicates it like any redelivery. True when it was FAILED.
pub async fn reopen_failed(conn: &mut MySqlConnection, id: u64) -> Result<bool, sqlx::Error> {
    let reopened = sqlx::query(
        "UPDATE partner_notifications SET status = 'PENDING', attempts = 0, \
         next_attempt_at = NOW(6) WHERE id = ? AND status = 'FAILED'",
    )
    .bind(id)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(reopened == 1)
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn statuses_are_their_column_values() {
        assert_eq!(NotificationStatus::Pending.to_string(), "PENDING");
        assert_eq!(
            NotificationStatus::from_str("DELIVERED"),
            Ok(NotificationStatus::Delivered)
        );
        assert!(NotificationStatus::from_str("delivered").is_err());
    }
}
