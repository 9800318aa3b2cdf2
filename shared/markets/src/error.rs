//! The one error of W4's domain. The API turns each client-facing variant into its status
//! (`api/src/markets.rs`); database faults stay database faults.

use paybus_bus::outbox::OutboxError;
use paybus_db::column::UnknownValue;
use paybus_money::Amount;

#[derive(Debug, thiserror::Error)]
pub enum MarketError {
    #[error("symbol {symbol:?} {reason}")]
    InvalidSymbol {
        symbol: String,
        reason: &'static str,
    },
    #[error("market {0} not found")]
    UnknownMarket(String),
    #[error("market {0} already exists")]
    DuplicateMarket(String),
    #[error("market {0} is SUSPENDED: no orders are accepted until it is resumed")]
    Suspended(String),
    #[error("{0}")]
    Invalid(String),
    #[error("order {0} not found")]
    UnknownOrder(u64),
    #[error("order {order_id} is {status}: only OPEN and PARTIALLY_FILLED orders can be filled")]
    NotOpen { order_id: u64, status: String },
    #[error("order {order_id} has {open} open, less than the fill of {requested}")]
    Overfill {
        order_id: u64,
        open: Amount,
        requested: Amount,
    },
    #[error("market {0} has never been suspended")]
    NeverSuspended(String),
    #[error("market {symbol} cannot be resumed yet: {summary}")]
    StillCancelling { symbol: String, summary: String },
    #[error("market {0} is not SUSPENDED")]
    NotSuspended(String),
    #[error(transparent)]
    UnknownValue(#[from] UnknownValue),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("outbox: {0}")]
    Outbox(#[from] OutboxError),
}

pub(crate) use paybus_db::column::parse as parse_column;
