//! W3's domain (docs/workflows/bonuses.md, seed 003): charge-event bonuses that are never lost and never paid
//! twice.
//!
//! - [`member`]: can balances per container, changed only under the member's row lock.
//! - [`charge`]: purchases (CHARGE) and granted bonuses (EVENT), and their payment status.
//! - [`event`]: charge events (title, percent, window, active, per-member limit), and a
//!   member's standing in the one that applies now, `getPaymentCount` included
//!   ([`event::applying_now`]).
//! - [`completion`]: the one REQUEST -> COMPLETE transition behind every gateway path: the
//!   credit and the bonus jobs it owes, in one transaction.
//! - [`job`]: the bonus jobs (`charge_event_job`): states, the retry kit's table
//!   ([`job::BONUS_JOBS`]) and schedule ([`job::RETRY_POLICY`]), the admin views and retry.
//! - [`grant`]: the one transaction that pays a job (the message's or the worker's).
//! - [`messages`]: the `charge.bonus_job.created` message.
//! - [`audit`]: W3's invariants.
//! - [`checkpoint`]: the sums of each member's settled charges, which let the continuous auditor's
//!   balance check read a member's recent charges instead of its whole history.
//!
//! The attempts themselves (the immediate one on the message, the worker's retries, the
//! reaper) are the grant-bonus function's (`functions/grant-bonus`).

pub mod audit;
pub mod charge;
pub mod checkpoint;
pub mod completion;
pub mod completions;
mod error;
pub mod event;
pub mod grant;
pub mod job;
pub mod member;
pub mod messages;

pub use completion::{BonusRules, CompleteError, Completion, PaymentCompletion};
pub use completions::Completions;
pub use error::BonusError;
pub use messages::BonusJobCreated;

#[cfg(feature = "test-harness")]
pub mod testing;
