//! W4's fixtures: markets and open orders as the admin API and the order gateway would have
//! written them, and the audit W4 must pass.

use paybus_ops::audit::Check;
use sqlx::{MySql, MySqlPool, QueryBuilder};

/// An ACTIVE market named `symbol`.
pub async fn market(pool: &MySqlPool, symbol: &str) -> u64 {
    sqlx::query("INSERT INTO markets (symbol) VALUES (?)")
        .bind(symbol)
        .execute(pool)
        .await
        .expect("insert a market")
        .last_insert_id()
}

/// `count` OPEN orders (BUY 1 at price 100) in `market_id`, inserted 1,000 per statement;
/// their ids, ascending.
pub async fn open_orders(pool: &MySqlPool, market_id: u64, count: usize) -> Vec<u64> {
    let rows: Vec<usize> = (0..count).collect();
    for chunk in rows.chunks(1_000) {
        let mut insert = QueryBuilder::<MySql>::new(
            "INSERT INTO orders (market_id, account_id, side, price, quantity) ",
        );
        insert.push_values(chunk, |mut row, n| {
            row.push_bind(market_id)
                .push_bind(u64::try_from(*n % 97).unwrap_or_default() + 1)
                .push("'BUY'")
                .push("100")
                .push("1");
        });
        insert.build().execute(pool).await.expect("insert orders");
    }
    sqlx::query_scalar("SELECT id FROM orders WHERE market_id = ? AND status = 'OPEN' ORDER BY id")
        .bind(market_id)
        .fetch_all(pool)
        .await
        .expect("read the orders back")
}

/// How many of `market_id`'s orders are in `status`.
pub async fn orders_in(pool: &MySqlPool, market_id: u64, status: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE market_id = ? AND status = ?")
        .bind(market_id)
        .bind(status)
        .fetch_one(pool)
        .await
        .expect("count orders")
}

/// A trigger that refuses to cancel `order_id` (as a matching engine holding the order
/// would): its cancel statement fails with `order is locked by the matching engine` until the
/// trigger `refuse_cancel` is dropped.
pub async fn refuse_cancels_of(pool: &MySqlPool, order_id: u64) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TRIGGER refuse_cancel BEFORE UPDATE ON orders FOR EACH ROW \
         BEGIN \
           IF NEW.id = {order_id} AND NEW.status = 'CANCELLED' THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'order is locked by the matching engine'; \
           END IF; \
         END"
    )))
    .execute(pool)
    .await
    .expect("create the trigger that refuses a cancel");
}

/// The invariants W4's rows must keep.
pub const AUDIT: &[&[Check]] = &[paybus_markets::audit::CHECKS];

/// Fails the test on any violation of [`AUDIT`].
pub async fn assert_audit_clean(pool: &MySqlPool) {
    crate::assert_audit_clean(pool, AUDIT).await;
}
