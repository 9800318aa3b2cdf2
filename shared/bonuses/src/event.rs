//! Charge events ("N% more cans between start and end"): created by ops, read by the payment
//! completion only. Retries never read an event: a bonus job carries its own snapshot.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::MySqlConnection;

/// A charge event as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct ChargeEvent {
    pub id: u64,
    /// Also the reason on its bonuses (their EVENT charges' method).
    pub title: String,
    pub add_percent: i32,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub is_active: bool,
    /// Bonuses of this event per member.
    pub available_count: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// An event to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChargeEvent {
    pub title: String,
    pub add_percent: i32,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub is_active: bool,
    pub available_count: i32,
}

/// `SELECT <the columns of ChargeEvent> FROM charge_events <tail>`.
macro_rules! select_events {
    ($tail:literal) => {
        concat!(
            "SELECT id, title, add_percent, start_at, end_at, is_active, available_count, ",
            "created_at, updated_at FROM charge_events ",
            $tail
        )
    };
}

pub async fn create(conn: &mut MySqlConnection, new: &NewChargeEvent) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "INSERT INTO charge_events (title, add_percent, start_at, end_at, is_active, \
                                    available_count) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(&new.title)
    .bind(new.add_percent)
    .bind(new.start_at)
    .bind(new.end_at)
    .bind(new.is_active)
    .bind(new.available_count)
    .execute(conn)
    .await?
    .last_insert_id())
}

pub async fn find(conn: &mut MySqlConnection, id: u64) -> Result<Option<ChargeEvent>, sqlx::Error> {
    sqlx::query_as(select_events!("WHERE id = ?"))
        .bind(id)
        .fetch_optional(conn)
        .await
}

/// Switches an event on or off; false when there is no such event.
pub async fn set_active(
    conn: &mut MySqlConnection,
    id: u64,
    active: bool,
) -> Result<bool, sqlx::Error> {
    let matched = sqlx::query("UPDATE charge_events SET is_active = ? WHERE id = ?")
        .bind(active)
        .bind(id)
        .execute(conn)
        .await?
        .rows_affected();
    Ok(matched == 1)
}

/// The event that applies to a charge completed now, and where the member stands in it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Standing {
    #[sqlx(flatten)]
    pub event: ChargeEvent,
    /// The member's bonuses of this event granted so far: the seed's `getPaymentCount(member,
    /// method, startDate, endDate)`, fixed as the seed asks — only EVENT charges, only inside
    /// the window (both ends included), counted by the database (a COUNT served by
    /// `index_charges_payment_count`), not by fetching rows.
    pub granted: i64,
    /// The member's jobs of this event not DONE yet: the limit counts them with the granted
    /// ones, so two quick charges cannot both pass it before either bonus is granted.
    pub owed: i64,
}

/// The event that applies to a charge completed now — active, its window around now; when
/// windows overlap, the one that started last (one event bonus per charge) — with the
/// member's [`Standing`] in it, in one statement (the completion reads it under the
/// member's lock: READ COMMITTED, so the counts see every other completion and grant of the
/// member).
pub async fn applying_now(
    conn: &mut MySqlConnection,
    member_id: u64,
) -> Result<Option<Standing>, sqlx::Error> {
    sqlx::query_as(
        "SELECT e.id, e.title, e.add_percent, e.start_at, e.end_at, e.is_active, \
                e.available_count, e.created_at, e.updated_at, \
                (SELECT COUNT(*) FROM charges c \
                  WHERE c.member_id = ? AND c.status = 'EVENT' AND c.method = e.title \
                    AND c.created_at BETWEEN e.start_at AND e.end_at) AS granted, \
                (SELECT COUNT(*) FROM charge_event_job j \
                  WHERE j.member_id = ? AND j.charge_event_id = e.id \
                    AND j.status <> 'DONE') AS owed \
         FROM charge_events e \
         WHERE e.is_active = 1 AND e.start_at <= NOW(6) AND e.end_at >= NOW(6) \
         ORDER BY e.start_at DESC, e.id DESC LIMIT 1",
    )
    .bind(member_id)
    .bind(member_id)
    .fetch_optional(conn)
    .await
}
