//! W2's domain (docs/workflows/confirmations.md, seed 001): withdrawals and deposits whose
//! on-chain confirmation must move money exactly once.
//!
//! - [`withdrawal`], [`deposit`]: each row's states and kinds and every statement that reads or
//!   writes them, shared by the admin API and the confirm functions (one writer of
//!   `withdrawal_status_history`, one way to read an amount). The transitions are
//!   [`withdrawal::confirm_all_if_in_flight`] and [`deposit::confirm_all_if_detected`], each one
//!   code path for one message or a batch; what a delivery comes to, [`withdrawal::confirm_all`]
//!   and [`deposit::confirm_all`], is each one call for its handler.
//! - [`owed`]: what a confirmation writes with its transition (keyed postings, the partner's
//!   notification); [`batch`]: the driver of messages delivered together.
//! - [`messages`]: what the chain-monitor intake publishes; [`audit`]: W2's invariants on the
//!   ledger entries its confirmations owe.
//!
//! The handlers are `functions/confirm-withdrawal` and `functions/confirm-deposit`.

pub mod audit;
pub mod batch;
mod decisions;
pub mod deposit;
mod error;
pub mod messages;
pub mod owed;
mod sql;
pub mod withdrawal;

pub use error::{ConfirmError, CreateError};
pub use messages::{DepositTxConfirmed, WithdrawalTxConfirmed};
