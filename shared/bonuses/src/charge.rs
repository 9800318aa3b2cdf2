//! Charges: purchases (CHARGE) and bonuses (EVENT), their payment status, and every statement
//! W3 runs on them (the migration's header comment says who moves a row in and out of each
//! state). The REQUEST -> COMPLETE transition itself is [`crate::completion`]'s.

use chrono::{DateTime, Utc};
use paybus_money::Amount;
use serde::Serialize;
use sqlx::{AssertSqlSafe, MySqlConnection, Row};

use crate::{BonusError, error::parse_column};

const ENTITY: &str = "charge";

paybus_db::column_enum! {
    /// `charges.status`: what a charge is (never changes).
    pub enum ChargeStatus {
        /// A purchase of cans.
        Charge,
        /// Bonus cans granted for a purchase (a bonus job's result).
        Event,
    }
}

paybus_db::column_enum! {
    /// `charges.payment_status`.
    pub enum PaymentStatus {
        /// The payment started; nothing credited.
        Request,
        /// Terminal: paid and credited (an EVENT charge is born COMPLETE).
        Complete,
    }
}

paybus_db::column_enum! {
    /// `charges.payment_gateway` (and the bonus job's snapshot of it): who took the payment.
    #[derive(strum::VariantArray)]
    pub enum PaymentGateway {
        Pg,
        Payverse,
        Hecto,
        GoogleIap,
        AppleIap,
    }
}

impl PaymentGateway {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Where its cans go when the request names no container: the stores' own containers for
    /// in-app purchases, `pg` for the web gateways.
    pub fn default_container(self) -> Container {
        match self {
            PaymentGateway::GoogleIap => Container::Aos,
            PaymentGateway::AppleIap => Container::Ios,
            PaymentGateway::Pg | PaymentGateway::Payverse | PaymentGateway::Hecto => Container::Pg,
        }
    }
}

paybus_db::column_enum! {
    case = "lowercase";
    /// `charges.container` (and the job's snapshot): which of the member's balances the cans
    /// go to.
    pub enum Container {
        Pg,
        Aos,
        Ios,
    }
}

impl Container {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A charge as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Charge {
    pub id: u64,
    pub member_id: u64,
    pub status: ChargeStatus,
    pub cans: i32,
    pub price: Option<Amount>,
    pub payment_gateway: PaymentGateway,
    pub container: Container,
    pub method: String,
    pub payment_status: PaymentStatus,
    pub gateway_tx_id: Option<String>,
    pub completed_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// `SELECT <the columns of ChargeRow> FROM charges <tail>`, as one static statement.
macro_rules! select_charges {
    ($tail:literal) => {
        concat!(
            "SELECT id, member_id, status, cans, price, payment_gateway, container, method, ",
            "payment_status, gateway_tx_id, completed_at, created_at, updated_at FROM charges ",
            $tail
        )
    };
}

#[derive(sqlx::FromRow)]
pub(crate) struct ChargeRow {
    id: u64,
    member_id: u64,
    status: String,
    cans: i32,
    price: Option<Amount>,
    payment_gateway: String,
    container: String,
    method: String,
    payment_status: String,
    gateway_tx_id: Option<String>,
    completed_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl ChargeRow {
    pub(crate) fn into_charge(self) -> Result<Charge, BonusError> {
        let id = self.id;
        Ok(Charge {
            id,
            member_id: self.member_id,
            status: parse_column(ENTITY, id, "status", self.status)?,
            cans: self.cans,
            price: self.price,
            payment_gateway: parse_column(ENTITY, id, "payment_gateway", self.payment_gateway)?,
            container: parse_column(ENTITY, id, "container", self.container)?,
            method: self.method,
            payment_status: parse_column(ENTITY, id, "payment_status", self.payment_status)?,
            gateway_tx_id: self.gateway_tx_id,
            completed_at: self.completed_at,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// A purchase to start (what the app backend writes when the member starts paying).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChargeRequest {
    pub member_id: u64,
    pub cans: i32,
    pub price: Amount,
    pub payment_gateway: PaymentGateway,
    pub container: Container,
    pub method: String,
}

/// Why a charge request cannot be created as asked.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("member {0} not found")]
    UnknownMember(u64),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Inserts a CHARGE in payment status REQUEST.
pub async fn create_request(
    conn: &mut MySqlConnection,
    new: &NewChargeRequest,
) -> Result<u64, RequestError> {
    sqlx::query(
        "INSERT INTO charges (member_id, status, cans, price, payment_gateway, container, method, \
                              payment_status) \
         VALUES (?, 'CHARGE', ?, ?, ?, ?, ?, 'REQUEST')",
    )
    .bind(new.member_id)
    .bind(new.cans)
    .bind(new.price)
    .bind(new.payment_gateway.as_str())
    .bind(new.container.as_str())
    .bind(&new.method)
    .execute(conn)
    .await
    .map(|done| done.last_insert_id())
    .map_err(|error| {
        if error
            .as_database_error()
            .is_some_and(|e| e.is_foreign_key_violation())
        {
            RequestError::UnknownMember(new.member_id)
        } else {
            RequestError::Database(error)
        }
    })
}

/// The charge, or `None`. Within a transaction that just changed it, it carries the change.
pub async fn find(conn: &mut MySqlConnection, id: u64) -> Result<Option<Charge>, BonusError> {
    by_id(conn, select_charges!("WHERE id = ?"), id).await
}

/// [`find`] as a locking read: the latest committed row even inside a snapshot (for explaining
/// a transition that did not happen), and nobody changes it until the caller's transaction
/// ends.
pub async fn find_locked(
    conn: &mut MySqlConnection,
    id: u64,
) -> Result<Option<Charge>, BonusError> {
    by_id(conn, select_charges!("WHERE id = ? FOR UPDATE"), id).await
}

async fn by_id(
    conn: &mut MySqlConnection,
    sql: &'static str,
    id: u64,
) -> Result<Option<Charge>, BonusError> {
    let row: Option<ChargeRow> = sqlx::query_as(sql).bind(id).fetch_optional(conn).await?;
    row.map(ChargeRow::into_charge).transpose()
}

/// A gateway's word that a charge is paid, as the transition reads it.
#[derive(Debug, Clone, Copy)]
pub struct Payment<'a> {
    pub charge_id: u64,
    pub gateway: PaymentGateway,
    pub gateway_tx_id: &'a str,
    pub amount: Amount,
}

/// The conditional transition REQUEST -> COMPLETE (principle 1) and the credit of the charge's
/// cans to its member's balance of its container, in one statement: true when this call made
/// the transition. Only a purchase through `gateway` for exactly `amount` completes; the
/// gateway payment's id is recorded (its unique key refuses a receipt presented for a second
/// charge).
///
/// Why one statement: as two, the transition and the credit would be two round trips of the
/// seven a completion makes alone, and each round trip costs the database a wake-up and a thread
/// switch besides its SQL (W3's benchmark: 9.1 → 8.1 statements per grant end to end). The
/// join reads the charge first (a constant: its primary key), so the locks are taken in the
/// completion's order, the charge then the member; the credit reads the cans and the container
/// from the charge row itself, and every container's column is assigned (the others + 0), so
/// one statement text serves the three containers.
pub async fn complete_and_credit(
    conn: &mut MySqlConnection,
    payment: Payment<'_>,
) -> Result<bool, BonusError> {
    // sqlx counts matched rows (CLIENT_FOUND_ROWS), of both tables: 2 is the transition and
    // its credit, 0 no transition (the status is in the WHERE clause). A charge without its
    // member (the foreign key forbids it) would match nothing either, and be reported by the
    // locking read that explains a 0.
    match complete_and_credit_all(conn, &[payment]).await? {
        0 => Ok(false),
        2 => Ok(true),
        other => Err(BonusError::Inconsistent(format!(
            "completing charge {} matched {other} rows of charges and members, not 2",
            payment.charge_id
        ))),
    }
}

/// [`complete_and_credit`] of several payments (distinct charges) in one statement: the rows
/// of charges and members it matched. All of them made their transition exactly when that is
/// twice their number *and* their members are distinct: a multi-table UPDATE changes a row
/// once however often the join meets it, so two charges of one member match 3 rows and credit
/// the member once — the caller must then roll back ([`crate::completions`] does, and
/// completes each on its own).
pub async fn complete_and_credit_all(
    conn: &mut MySqlConnection,
    payments: &[Payment<'_>],
) -> Result<u64, BonusError> {
    let each = |text: &str| text.repeat(payments.len());
    let sql = format!(
        "UPDATE charges c JOIN members m FORCE INDEX (PRIMARY) ON m.id = c.member_id \
         SET c.payment_status = 'COMPLETE', c.gateway_tx_id = CASE c.id {}END, \
             c.completed_at = NOW(6), \
             m.pg_can = m.pg_can + IF(c.container = 'pg', c.cans, 0), \
             m.aos_can = m.aos_can + IF(c.container = 'aos', c.cans, 0), \
             m.ios_can = m.ios_can + IF(c.container = 'ios', c.cans, 0) \
         WHERE c.id IN ({}) AND c.status = 'CHARGE' AND c.payment_status = 'REQUEST' \
           AND CASE c.id {}END",
        each("WHEN ? THEN ? "),
        vec!["?"; payments.len()].join(", "),
        each("WHEN ? THEN c.payment_gateway = ? AND c.price = ? "),
    );
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for payment in payments {
        query = query.bind(payment.charge_id).bind(payment.gateway_tx_id);
    }
    for payment in payments {
        query = query.bind(payment.charge_id);
    }
    for payment in payments {
        query = query
            .bind(payment.charge_id)
            .bind(payment.gateway.as_str())
            .bind(payment.amount);
    }
    Ok(query.execute(conn).await?.rows_affected())
}

/// The charge a gateway payment completed, if any.
pub async fn completed_by(
    conn: &mut MySqlConnection,
    gateway: PaymentGateway,
    gateway_tx_id: &str,
) -> Result<Option<u64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM charges WHERE payment_gateway = ? AND gateway_tx_id = ?")
        .bind(gateway.as_str())
        .bind(gateway_tx_id)
        .fetch_optional(conn)
        .await
}

/// Whether the member has exactly one COMPLETE purchase: the one this transaction just
/// completed. Exact only under the member's lock at READ COMMITTED: every completion takes
/// that lock first. It stops at a second COMPLETE purchase, where counting them all read a
/// member's whole purchase history on every completion.
pub async fn is_first_completed_purchase(
    conn: &mut MySqlConnection,
    member_id: u64,
) -> Result<bool, sqlx::Error> {
    let first_two: Vec<u64> = sqlx::query_scalar(
        "SELECT id FROM charges \
         WHERE member_id = ? AND status = 'CHARGE' AND payment_status = 'COMPLETE' LIMIT 2",
    )
    .bind(member_id)
    .fetch_all(conn)
    .await?;
    Ok(first_two.len() == 1)
}

/// The EVENT charge a bonus job grants: its snapshot of the purchase.
#[derive(Debug, Clone, Copy)]
pub struct BonusCharge<'a> {
    pub member_id: u64,
    pub cans: i32,
    pub payment_gateway: PaymentGateway,
    pub container: Container,
    /// The reason the job recorded (`method_snapshot`).
    pub method: &'a str,
}

/// Inserts the EVENT charge a bonus job grants (COMPLETE at birth); the caller holds the
/// member's lock and credits the cans in the same transaction.
pub async fn insert_bonus(
    conn: &mut MySqlConnection,
    bonus: &BonusCharge<'_>,
) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "INSERT INTO charges (member_id, status, cans, price, payment_gateway, container, method, \
                              payment_status, completed_at) \
         VALUES (?, 'EVENT', ?, NULL, ?, ?, ?, 'COMPLETE', NOW(6))",
    )
    .bind(bonus.member_id)
    .bind(bonus.cans)
    .bind(bonus.payment_gateway.as_str())
    .bind(bonus.container.as_str())
    .bind(bonus.method)
    .execute(conn)
    .await?
    .last_insert_id())
}

/// Inserts several EVENT charges in one statement (the caller holds every member's lock);
/// the id of the first. The others' ids are not assumed: [`event_charges_from`] reads them.
pub async fn insert_bonuses(
    conn: &mut MySqlConnection,
    bonuses: &[BonusCharge<'_>],
) -> Result<u64, sqlx::Error> {
    let mut insert = sqlx::QueryBuilder::<sqlx::MySql>::new(
        "INSERT INTO charges (member_id, status, cans, price, payment_gateway, container, method, \
                              payment_status, completed_at) ",
    );
    insert.push_values(bonuses, |mut row, bonus| {
        row.push_bind(bonus.member_id)
            .push("'EVENT'")
            .push_bind(bonus.cans)
            .push("NULL")
            .push_bind(bonus.payment_gateway.as_str())
            .push_bind(bonus.container.as_str())
            .push_bind(bonus.method)
            .push("'COMPLETE'")
            .push("NOW(6)");
    });
    Ok(insert.build().execute(conn).await?.last_insert_id())
}

/// The EVENT charges of `members` (sorted, distinct) with an id from `first` on, in id order:
/// (charge id, member id). Under the members' locks these are the ones this transaction just
/// inserted ([`insert_bonuses`]). The ids are numbers, written into the statement: the
/// list's length varies with the batch, and a prepared statement per length would cost a
/// prepare round trip on most connections.
pub async fn event_charges_from(
    conn: &mut MySqlConnection,
    first: u64,
    members: &[u64],
) -> Result<Vec<(u64, u64)>, sqlx::Error> {
    let list = members
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    // A plain text statement (`raw_sql`): `query_as` would prepare each distinct text.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT id, member_id FROM charges \
         WHERE member_id IN ({list}) AND status = 'EVENT' AND id >= {first} ORDER BY id"
    )))
    .fetch_all(conn)
    .await?
    .iter()
    .map(|row| Ok((row.try_get("id")?, row.try_get("member_id")?)))
    .collect()
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn enums_are_their_column_values() {
        assert_eq!(PaymentGateway::GoogleIap.as_str(), "GOOGLE_IAP");
        assert_eq!(
            PaymentGateway::from_str("APPLE_IAP"),
            Ok(PaymentGateway::AppleIap)
        );
        assert_eq!(Container::Aos.as_str(), "aos");
        assert_eq!(Container::from_str("ios"), Ok(Container::Ios));
        assert_eq!(ChargeStatus::Event.to_string(), "EVENT");
        assert_eq!(
            PaymentStatus::from_str("COMPLETE"),
            Ok(PaymentStatus::Complete)
        );
        assert!(Container::from_str("PG").is_err());
    }

    #[test]
    fn in_app_purchases_land_in_their_store_s_container() {
        assert_eq!(PaymentGateway::AppleIap.default_container(), Container::Ios);
        assert_eq!(
            PaymentGateway::GoogleIap.default_container(),
            Container::Aos
        );
        assert_eq!(PaymentGateway::Hecto.default_container(), Container::Pg);
    }
}
