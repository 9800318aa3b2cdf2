//! W2's domain (docs/workflows/confirmations.md, seed 001): withdrawals and deposits whose on-chain confirmation must
//! move money exactly once.
//!
//! - [`messages`]: what the chain-monitor intake publishes and the confirm functions consume.
//! - [`withdrawal`], [`deposit`]: each row's states and kinds (the migrations' header comments
//!   say who moves a row in and out of each state), and every statement that reads or writes
//!   them — the admin API and the confirm functions share these, so there is one writer of
//!   `withdrawal_status_history` and one way to read an amount.
//! - [`owed`]: what a confirmation writes with its transition (keyed postings, the partner's
//!   notification).
//! - [`audit`]: W2's invariants about the ledger entries its confirmations owe.
//! - [`batch`]: what a confirm handler does with the messages delivered together (the
//!   committed read, one transaction, one per message if it fails).
//!
//! A workflow's transition lives in its domain crate: the withdrawal confirmation is
//! [`withdrawal::confirm_all_if_in_flight`], the deposit confirmation
//! [`deposit::confirm_all_if_detected`] (each one code path for one message or a batch), and
//! `functions/confirm-withdrawal` and `functions/confirm-deposit` are the handlers around them.

pub mod audit;
pub mod batch;
pub mod deposit;
mod error;
pub mod messages;
pub mod owed;
pub mod withdrawal;

pub use error::{ConfirmError, CreateError};
pub use messages::{DepositTxConfirmed, WithdrawalTxConfirmed};

#[cfg(feature = "test-harness")]
pub mod testing;
