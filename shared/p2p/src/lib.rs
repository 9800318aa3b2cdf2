//! W1's domain (docs/workflows/p2p.md, seed 000): P2P deposit orders (buyers) matched against
//! withdraw orders (sellers' liquidity) with a trade at the quote service, with no row lock held
//! across that call (the seed's incident: one slow call under `FOR UPDATE` queued every buyer),
//! every attempt judged by where the order ends up, bounded retries, a reaper and expiry.
//!
//! - [`deposit_order`], [`withdraw_order`], [`matches`]: the rows, their states and their SQL;
//!   [`deposit_order::close`] is the one way an order is closed.
//! - [`matcher`]: [`Matcher`], creating an order (inline or queued) and the attempt (reserve,
//!   trade with no lock held through [`quote`], settle or release, or keep a fill in doubt),
//!   then [`accounting`] in a transaction of its own.
//! - [`maintenance`]: match-deposit's sweeper statements (due orders, the reaper, expiry).
//! - [`audit`] and [`reconcile`]: W1's invariants, and its fills against the quote service's
//!   trades; [`messages`]: `p2p.deposit_order.created`; [`config`]: the seed's defaults.
//! - [`seed`]: the seed's lock-holding design, the control the real path is measured against.

pub mod accounting;
pub mod audit;
pub mod config;
pub mod deposit_order;
mod error;
mod inserted;
pub mod maintenance;
pub mod matcher;
pub mod matches;
pub mod messages;
mod order_row;
pub mod quote;
pub mod reconcile;
mod reserve;
pub mod seed;
mod settle;
pub mod withdraw_order;

pub use accounting::{Accounted, AttemptEnd, DeadLetters};
pub use config::{FillPolicy, MatchingConfig, QuoteConfig};
pub use deposit_order::{CloseReason, DepositOrder, DepositOrderStatus, NewDepositOrder};
pub use error::{CreateError, MatchError};
pub use inserted::Inserted;
pub use matcher::{Created, Handoff, Matcher};
pub use messages::DepositOrderCreated;
pub use withdraw_order::{NewWithdrawOrder, WithdrawOrder};

/// The function that matches deposit orders: its queue, its dead letters.
pub const FUNCTION: &str = "match-deposit";

/// A status-like column read back into its enum (a value this code does not know names the row).
pub(crate) use paybus_db::column::parse as parse_column;
