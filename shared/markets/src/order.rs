//! The `orders` row: placement, fills (the matching engine's, stood in for by the admin API),
//! and the conditional cancel cancel-orders runs (the migration's header comment says who moves
//! a row in and out of each state).

use chrono::{DateTime, Utc};
use paybus_money::Amount;
use serde::Serialize;
use sqlx::MySqlConnection;

use crate::{MarketError, error::parse_column, market::MarketStatus};

paybus_db::column_enum! {
    /// `orders.status`.
    pub enum OrderStatus {
        /// Placed while the market was ACTIVE; nothing filled yet.
        Open,
        /// Some quantity filled, some still open.
        PartiallyFilled,
        /// Terminal: the whole quantity filled.
        Filled,
        /// Terminal: cancelled (by cancel-orders, with the reason).
        Cancelled,
    }
}

impl OrderStatus {
    pub fn is_open(self) -> bool {
        matches!(self, OrderStatus::Open | OrderStatus::PartiallyFilled)
    }
}

paybus_db::column_enum! {
    /// `orders.side`.
    pub enum Side {
        Buy,
        Sell,
    }
}

/// Why an order was cancelled (`orders.cancel_reason`).
pub const MARKET_SUSPENDED: &str = "MARKET_SUSPENDED";

/// An order as stored; quantities and price exact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Order {
    pub id: u64,
    pub market_id: u64,
    pub account_id: u64,
    pub side: Side,
    pub price: Amount,
    pub quantity: Amount,
    pub filled_quantity: Amount,
    pub status: OrderStatus,
    pub cancel_reason: Option<String>,
    pub cancelled_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// An order to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrder {
    pub account_id: u64,
    pub side: Side,
    pub price: Amount,
    pub quantity: Amount,
}

/// Places an OPEN order in `symbol`'s market, in the caller's transaction, if the market is
/// ACTIVE. The market row is read LOCK IN SHARE MODE: placements do not wait for each other,
/// but a suspend (which locks the row exclusively) waits for the placements in flight to
/// commit, and placements that come after it see SUSPENDED. So every order accepted is either
/// in the suspension's frozen set or was refused.
pub async fn place(
    conn: &mut MySqlConnection,
    symbol: &str,
    new: &NewOrder,
) -> Result<u64, MarketError> {
    if !new.price.is_positive() {
        return Err(MarketError::Invalid("price must be greater than 0".into()));
    }
    if !new.quantity.is_positive() {
        return Err(MarketError::Invalid(
            "quantity must be greater than 0".into(),
        ));
    }
    let market: Option<(u64, String)> =
        sqlx::query_as("SELECT id, status FROM markets WHERE symbol = ? LOCK IN SHARE MODE")
            .bind(symbol)
            .fetch_optional(&mut *conn)
            .await?;
    let Some((market_id, status)) = market else {
        return Err(MarketError::UnknownMarket(symbol.to_owned()));
    };
    let status: MarketStatus = parse_column("market", market_id, "status", status)?;
    if status == MarketStatus::Suspended {
        return Err(MarketError::Suspended(symbol.to_owned()));
    }
    let id = sqlx::query(
        "INSERT INTO orders (market_id, account_id, side, price, quantity) VALUES (?, ?, ?, ?, ?)",
    )
    .bind(market_id)
    .bind(new.account_id)
    .bind(<&str>::from(new.side))
    .bind(new.price)
    .bind(new.quantity)
    .execute(conn)
    .await?
    .last_insert_id();
    Ok(id)
}

/// Fills `quantity` of an open order, in the caller's transaction (the conditional UPDATE
/// decides: an order closed meanwhile, or a fill larger than what is open, changes nothing).
/// Fills are accepted while the market is SUSPENDED: they stand for trades the matching
/// engine executed before the halt, and a task that finds its order FILLED is SKIPPED.
pub async fn fill(
    conn: &mut MySqlConnection,
    order_id: u64,
    quantity: Amount,
) -> Result<Order, MarketError> {
    if !quantity.is_positive() {
        return Err(MarketError::Invalid(
            "quantity must be greater than 0".into(),
        ));
    }
    // MySQL applies SET assignments left to right: the status is decided on the quantity
    // filled before this fill.
    let filled = sqlx::query(
        "UPDATE orders \
         SET status = CASE WHEN filled_quantity + ? = quantity THEN 'FILLED' \
                           ELSE 'PARTIALLY_FILLED' END, \
             filled_quantity = filled_quantity + ? \
         WHERE id = ? AND status IN ('OPEN', 'PARTIALLY_FILLED') \
           AND filled_quantity + ? <= quantity",
    )
    .bind(quantity)
    .bind(quantity)
    .bind(order_id)
    .bind(quantity)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    let order = locked(conn, order_id)
        .await?
        .ok_or(MarketError::UnknownOrder(order_id))?;
    if filled == 1 {
        return Ok(order);
    }
    if !order.status.is_open() {
        return Err(MarketError::NotOpen {
            order_id,
            status: order.status.to_string(),
        });
    }
    Err(MarketError::Overfill {
        order_id,
        open: order
            .quantity
            .checked_sub(order.filled_quantity)
            .unwrap_or(order.quantity),
        requested: quantity,
    })
}

/// The conditional cancel (principle 1): true when this call cancelled the order; false when
/// it was not open (filled or cancelled meanwhile) or does not exist.
pub async fn cancel_if_open(
    conn: &mut MySqlConnection,
    order_id: u64,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let cancelled = sqlx::query(
        "UPDATE orders SET status = 'CANCELLED', cancel_reason = ?, cancelled_at = NOW(6) \
         WHERE id = ? AND status IN ('OPEN', 'PARTIALLY_FILLED')",
    )
    .bind(reason)
    .bind(order_id)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(cancelled == 1)
}

/// The order's latest committed status, locked (`None`: no such order): why a conditional
/// cancel matched nothing.
pub async fn locked_status(
    conn: &mut MySqlConnection,
    order_id: u64,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT status FROM orders WHERE id = ? FOR UPDATE")
        .bind(order_id)
        .fetch_optional(conn)
        .await
}

#[derive(sqlx::FromRow)]
struct OrderRow {
    id: u64,
    market_id: u64,
    account_id: u64,
    side: String,
    price: Amount,
    quantity: Amount,
    filled_quantity: Amount,
    status: String,
    cancel_reason: Option<String>,
    cancelled_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
}

impl OrderRow {
    fn into_order(self) -> Result<Order, MarketError> {
        Ok(Order {
            side: parse_column("order", self.id, "side", self.side)?,
            status: parse_column("order", self.id, "status", self.status)?,
            id: self.id,
            market_id: self.market_id,
            account_id: self.account_id,
            price: self.price,
            quantity: self.quantity,
            filled_quantity: self.filled_quantity,
            cancel_reason: self.cancel_reason,
            cancelled_at: self.cancelled_at,
            created_at: self.created_at,
        })
    }
}

/// The order as this transaction's snapshot sees it.
pub async fn find(conn: &mut MySqlConnection, id: u64) -> Result<Option<Order>, MarketError> {
    fetch(
        conn,
        "SELECT id, market_id, account_id, side, price, quantity, filled_quantity, \
                        status, cancel_reason, cancelled_at, created_at FROM orders WHERE id = ?",
        id,
    )
    .await
}

/// The order's latest committed version, locked: what a conditional UPDATE that matched
/// nothing found.
pub async fn locked(conn: &mut MySqlConnection, id: u64) -> Result<Option<Order>, MarketError> {
    fetch(
        conn,
        "SELECT id, market_id, account_id, side, price, quantity, filled_quantity, \
                        status, cancel_reason, cancelled_at, created_at \
                 FROM orders WHERE id = ? FOR UPDATE",
        id,
    )
    .await
}

async fn fetch(
    conn: &mut MySqlConnection,
    sql: &'static str,
    id: u64,
) -> Result<Option<Order>, MarketError> {
    let row: Option<OrderRow> = sqlx::query_as(sql).bind(id).fetch_optional(conn).await?;
    row.map(OrderRow::into_order).transpose()
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn statuses_and_sides_are_their_column_values() {
        assert_eq!(OrderStatus::PartiallyFilled.to_string(), "PARTIALLY_FILLED");
        assert_eq!(
            OrderStatus::from_str("CANCELLED"),
            Ok(OrderStatus::Cancelled)
        );
        assert!(OrderStatus::Open.is_open() && OrderStatus::PartiallyFilled.is_open());
        assert!(!OrderStatus::Filled.is_open() && !OrderStatus::Cancelled.is_open());
        assert_eq!(Side::from_str("SELL"), Ok(Side::Sell));
        assert!(Side::from_str("sell").is_err());
    }
}
