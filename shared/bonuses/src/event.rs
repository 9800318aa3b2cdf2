//! Charge events ("N% more cans between start and end"): created by ops, read by the payment
//! completion only. Retries never read an event: a bonus job carries its own snapshot.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{AssertSqlSafe, MySqlConnection};

use crate::{
    BonusError,
    charge::{Charge, ChargeRow},
};

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

/// A member's standing in event `e` (`granted`, `owed`: see [`Standing`]), for the member named
/// by `$member` (a placeholder or a column of the enclosing query). One text for
/// [`applying_now`] and [`charge_and_standing`], so the two never count differently.
///
/// Both counts name their index. Reading several charges at once
/// ([`charges_and_standings`]), the optimizer otherwise chooses
/// `idx_charge_event_job_charge_event_id` for the owed count: every job of the event read for
/// each charge, a cost that grows with the event (in W3's benchmark, the database's CPU per
/// grant doubles).
macro_rules! standing_counts {
    ($member:literal) => {
        concat!(
            "(SELECT COUNT(*) FROM charges g FORCE INDEX (index_charges_payment_count) ",
            "WHERE g.member_id = ",
            $member,
            " AND g.status = 'EVENT' AND g.method = e.title ",
            "AND g.created_at BETWEEN e.start_at AND e.end_at) AS granted, ",
            "(SELECT COUNT(*) FROM charge_event_job j ",
            "FORCE INDEX (idx_charge_event_job_member_event) WHERE j.member_id = ",
            $member,
            " AND j.charge_event_id = e.id AND j.status <> 'DONE') AS owed"
        )
    };
}

/// The events that apply to a charge completed now — active, their window around now — the
/// one that started last first (one event bonus per charge).
macro_rules! applying_events {
    ($alias:literal) => {
        concat!(
            "FROM charge_events ",
            $alias,
            " WHERE ",
            $alias,
            ".is_active = 1 AND ",
            $alias,
            ".start_at <= NOW(6) AND ",
            $alias,
            ".end_at >= NOW(6) ORDER BY ",
            $alias,
            ".start_at DESC, ",
            $alias,
            ".id DESC LIMIT 1"
        )
    };
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
    sqlx::query_as(concat!(
        "SELECT e.id, e.title, e.add_percent, e.start_at, e.end_at, e.is_active, ",
        "e.available_count, e.created_at, e.updated_at, ",
        standing_counts!("?"),
        " ",
        applying_events!("e")
    ))
    .bind(member_id)
    .bind(member_id)
    .fetch_optional(conn)
    .await
}

/// The completion's one read after its credit: charge `charge_id` as it now stands, the event
/// that applies now and its member's [`Standing`] in it ([`applying_now`]'s, for the charge's
/// member) — one statement where a read of the charge and then of the standing would be two
/// round trips. Read under the member's lock (the credit's UPDATE), at READ COMMITTED.
pub async fn charge_and_standing(
    conn: &mut MySqlConnection,
    charge_id: u64,
) -> Result<Option<(Charge, Option<Standing>)>, BonusError> {
    Ok(charges_and_standings(conn, &[charge_id]).await?.pop())
}

/// [`charge_and_standing`] of several charges in one statement, in id order (those that
/// exist). Each member's standing is its own only when the charges' members are distinct.
pub async fn charges_and_standings(
    conn: &mut MySqlConnection,
    charge_ids: &[u64],
) -> Result<Vec<(Charge, Option<Standing>)>, BonusError> {
    let sql = format!(
        "{} WHERE c.id IN ({}) ORDER BY c.id",
        concat!(
            "SELECT c.id, c.member_id, c.status, c.cans, c.price, c.payment_gateway, ",
            "c.container, c.method, c.payment_status, c.gateway_tx_id, c.completed_at, ",
            "c.created_at, c.updated_at, e.id AS event_id, e.title, e.add_percent, e.start_at, ",
            "e.end_at, e.is_active, e.available_count, e.created_at AS event_created_at, ",
            "e.updated_at AS event_updated_at, ",
            standing_counts!("c.member_id"),
            " FROM charges c LEFT JOIN charge_events e ON e.id = (SELECT a.id ",
            applying_events!("a"),
            ")"
        ),
        vec!["?"; charge_ids.len()].join(", ")
    );
    let rows: Vec<ChargeStandingRow> = charge_ids
        .iter()
        .fold(sqlx::query_as(AssertSqlSafe(sql)), |query, id| {
            query.bind(id)
        })
        .fetch_all(conn)
        .await?;
    rows.into_iter()
        .map(ChargeStandingRow::into_charge_and_standing)
        .collect()
}

/// The event's columns come through a LEFT JOIN (NULL when none applies), renamed where a
/// charge's have the same name.
#[derive(sqlx::FromRow)]
struct ChargeStandingRow {
    #[sqlx(flatten)]
    charge: ChargeRow,
    event_id: Option<u64>,
    title: Option<String>,
    add_percent: Option<i32>,
    start_at: Option<DateTime<Utc>>,
    end_at: Option<DateTime<Utc>>,
    is_active: Option<bool>,
    available_count: Option<i32>,
    event_created_at: Option<DateTime<Utc>>,
    event_updated_at: Option<DateTime<Utc>>,
    granted: i64,
    owed: i64,
}

impl ChargeStandingRow {
    fn into_charge_and_standing(self) -> Result<(Charge, Option<Standing>), BonusError> {
        let event = match (
            self.event_id,
            self.title,
            self.add_percent,
            self.start_at,
            self.end_at,
            self.is_active,
            self.available_count,
            self.event_created_at,
            self.event_updated_at,
        ) {
            (
                Some(id),
                Some(title),
                Some(add_percent),
                Some(start_at),
                Some(end_at),
                Some(is_active),
                Some(available_count),
                Some(created_at),
                Some(updated_at),
            ) => Some(ChargeEvent {
                id,
                title,
                add_percent,
                start_at,
                end_at,
                is_active,
                available_count,
                created_at,
                updated_at,
            }),
            _ => None,
        };
        let standing = event.map(|event| Standing {
            event,
            granted: self.granted,
            owed: self.owed,
        });
        Ok((self.charge.into_charge()?, standing))
    }
}
