//! The `markets` row: a symbol and whether it trades (the migration's header comment says who
//! moves a row in and out of each state).

use chrono::{DateTime, Utc};
use paybus_db as db;
use serde::Serialize;
use sqlx::MySqlConnection;

use crate::{MarketError, error::parse_column};

paybus_db::column_enum! {
    /// `markets.status`.
    pub enum MarketStatus {
        /// Orders are accepted. Inserted so; SUSPENDED → ACTIVE by resume, once the suspension's
        /// cancellation is complete.
        Active,
        /// No order is accepted; ACTIVE → SUSPENDED by suspend, with the batch that cancels what
        /// was open.
        Suspended,
    }
}

/// A market as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Market {
    pub id: u64,
    pub symbol: String,
    pub status: MarketStatus,
    pub suspended_at: Option<DateTime<Utc>>,
    pub resumed_at: Option<DateTime<Utc>>,
    /// The cancel batch of the latest suspension.
    pub current_batch_id: Option<u64>,
    pub created_at: DateTime<Utc>,
}

/// Longest symbol (the column's size).
pub const SYMBOL_MAX: usize = 32;

/// A symbol as markets are named: 1 to 32 characters, upper-case letters and digits, then
/// also `.`, `_` or `-` (`BTC`, `BTC-KRW`). It appears in paths, so nothing else.
pub fn symbol(text: &str) -> Result<String, MarketError> {
    let invalid = |reason| MarketError::InvalidSymbol {
        symbol: text.chars().take(40).collect(),
        reason,
    };
    let mut chars = text.chars();
    match chars.next() {
        None => return Err(invalid("is empty")),
        Some(first) if !(first.is_ascii_uppercase() || first.is_ascii_digit()) => {
            return Err(invalid("must start with an upper-case letter or a digit"));
        }
        Some(_) => {}
    }
    if text.len() > SYMBOL_MAX {
        return Err(invalid("is longer than 32 characters"));
    }
    if !chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
    {
        return Err(invalid(
            "may hold only upper-case letters, digits, '.', '_' and '-'",
        ));
    }
    Ok(text.to_owned())
}

/// Inserts an ACTIVE market.
pub async fn create(conn: &mut MySqlConnection, symbol: &str) -> Result<u64, MarketError> {
    let symbol = self::symbol(symbol)?;
    match sqlx::query("INSERT INTO markets (symbol) VALUES (?)")
        .bind(&symbol)
        .execute(conn)
        .await
    {
        Ok(done) => Ok(done.last_insert_id()),
        Err(e) if db::is_duplicate_on(&e, "uk_markets_symbol") => {
            Err(MarketError::DuplicateMarket(symbol))
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(sqlx::FromRow)]
struct MarketRow {
    id: u64,
    symbol: String,
    status: String,
    suspended_at: Option<DateTime<Utc>>,
    resumed_at: Option<DateTime<Utc>>,
    current_batch_id: Option<u64>,
    created_at: DateTime<Utc>,
}

impl MarketRow {
    fn into_market(self) -> Result<Market, MarketError> {
        Ok(Market {
            status: parse_column("market", self.id, "status", self.status)?,
            id: self.id,
            symbol: self.symbol,
            suspended_at: self.suspended_at,
            resumed_at: self.resumed_at,
            current_batch_id: self.current_batch_id,
            created_at: self.created_at,
        })
    }
}

const SELECT: &str = "SELECT id, symbol, status, suspended_at, resumed_at, current_batch_id, \
                      created_at FROM markets WHERE symbol = ?";

/// The market named `symbol`, as this transaction's snapshot sees it.
pub async fn find(conn: &mut MySqlConnection, symbol: &str) -> Result<Option<Market>, MarketError> {
    fetch(conn, SELECT, symbol).await
}

/// The market, locked for update (its latest committed version): resume and ops' retry
/// serialise on it with suspend.
pub async fn locked(
    conn: &mut MySqlConnection,
    symbol: &str,
) -> Result<Option<Market>, MarketError> {
    fetch(
        conn,
        "SELECT id, symbol, status, suspended_at, resumed_at, current_batch_id, created_at \
         FROM markets WHERE symbol = ? FOR UPDATE",
        symbol,
    )
    .await
}

/// Markets that have been suspended at least once (their latest suspension is on
/// `current_batch_id`), the most recent batch first, at most `limit`: the console's list.
/// Batch ids grow with time, so ordering by them needs no index beyond the primary key of a
/// table that holds one row per market.
pub async fn with_suspension(
    conn: &mut MySqlConnection,
    limit: u32,
) -> Result<Vec<Market>, MarketError> {
    let rows: Vec<MarketRow> = sqlx::query_as(
        "SELECT id, symbol, status, suspended_at, resumed_at, current_batch_id, created_at \
         FROM markets WHERE current_batch_id IS NOT NULL \
         ORDER BY current_batch_id DESC LIMIT ?",
    )
    .bind(limit)
    .fetch_all(conn)
    .await?;
    rows.into_iter().map(MarketRow::into_market).collect()
}

async fn fetch(
    conn: &mut MySqlConnection,
    sql: &'static str,
    symbol: &str,
) -> Result<Option<Market>, MarketError> {
    let row: Option<MarketRow> = sqlx::query_as(sql)
        .bind(symbol)
        .fetch_optional(conn)
        .await?;
    row.map(MarketRow::into_market).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_are_upper_case_and_path_safe() {
        for ok in ["BTC", "BTC-KRW", "ETH_USDT", "1INCH", "BRK.B"] {
            assert_eq!(symbol(ok).ok().as_deref(), Some(ok), "{ok}");
        }
        for (bad, reason) in [
            ("", "empty"),
            ("btc", "upper-case"),
            ("-BTC", "start"),
            ("BTC/KRW", "only"),
            ("BTC KRW", "only"),
            ("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456", "32"),
        ] {
            let error = symbol(bad).expect_err(bad).to_string();
            assert!(error.contains(reason), "{bad:?}: {error}");
        }
    }
}
