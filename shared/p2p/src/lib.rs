//! W1's domain (docs/workflows/p2p.md, seed 000): P2P deposit orders (buyers) matched against withdraw
//! orders (sellers' liquidity) with a trade at the quote service (the seeds' TORQ) — with no
//! row lock held across that call, every attempt judged by where the order ends up, bounded
//! retries, a reaper for dead attempts and expiry.
//!
//! The incident behind it (seed 000 §0): `createAndMatch` held `FOR UPDATE` locks on up to 10
//! sellers' orders and the partner's lock row while it called TORQ over HTTP; one slow TORQ
//! call queued every other buyer behind it. And its retry counter only counted exceptions, so
//! the legacy path that "returns normally, still MATCHING" looped until expiry (§3.2).
//!
//! - [`deposit_order`], [`withdraw_order`], [`matches`]: the rows, their states (the
//!   migrations' header comments say who moves a row in and out of each) and their SQL;
//!   [`deposit_order::close`] is the one way an order is closed.
//! - [`matcher`]: [`Matcher`] — creating an order (inline or queued, by the switch) and the
//!   attempt: reserve in a short transaction, trade with no lock held ([`quote`]), settle or
//!   release in another — or, when createTrade's outcome is unknown, keep the fill in doubt
//!   and ask again under its key; then [`accounting`] in a transaction of its own.
//! - [`maintenance`]: the due-orders batch claim, the zombie reaper and expiry (match-deposit's
//!   sweeper jobs).
//! - [`audit`]: W1's invariants; [`reconcile`]: W1's fills against the quote service's own
//!   trades; [`config`]: its settings with the seed's defaults.

pub mod accounting;
pub mod audit;
pub mod config;
pub mod deposit_order;
mod error;
pub mod maintenance;
pub mod matcher;
pub mod matches;
pub mod messages;
pub mod quote;
pub mod reconcile;
mod reserve;
mod settle;
pub mod withdraw_order;

pub use accounting::{Accounted, AttemptEnd, DeadLetters};
pub use config::{FillPolicy, MatchingConfig, QuoteConfig};
pub use deposit_order::{CloseReason, DepositOrder, DepositOrderStatus, NewDepositOrder};
pub use error::{CreateError, MatchError};
pub use matcher::{Created, Handoff, Matcher};
pub use messages::DepositOrderCreated;
pub use withdraw_order::{NewWithdrawOrder, WithdrawOrder};

#[cfg(feature = "test-harness")]
pub mod testing;

/// The function that matches deposit orders: its queue, its dead letters.
pub const FUNCTION: &str = "match-deposit";

/// A status-like column read back into its enum (a value this code does not know names the row).
pub(crate) use paybus_platform::column::parse as parse_column;
