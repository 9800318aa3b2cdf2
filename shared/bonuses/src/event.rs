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

/// The event that applies to a charge completed now: active, its window around now; when
/// windows overlap, the one that started last (one event bonus per charge).
pub async fn active_now(conn: &mut MySqlConnection) -> Result<Option<ChargeEvent>, sqlx::Error> {
    sqlx::query_as(select_events!(
        "WHERE is_active = 1 AND start_at <= NOW(6) AND end_at >= NOW(6) \
         ORDER BY start_at DESC, id DESC LIMIT 1"
    ))
    .fetch_optional(conn)
    .await
}
