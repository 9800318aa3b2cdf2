//! W3's domain (docs/workflows/bonuses.md, seed 003): charge-event bonuses that are never lost
//! and never paid twice. It offers:
//!
//! - [`completion`] and [`completions`]: the one REQUEST -> COMPLETE transition behind every
//!   gateway path (the credit and the bonus jobs it owes, in one transaction), and concurrent
//!   completions committed together;
//! - [`member`], [`charge`], [`event`]: can balances (changed only under the member's row lock),
//!   purchases and granted bonuses, charge events and a member's standing in one
//!   ([`event::applying_now`]);
//! - [`job`] and [`grant`]: the bonus jobs ([`job::BONUS_JOBS`], [`job::RETRY_POLICY`]) and the
//!   one transaction that pays one; [`messages`]: `charge.bonus_job.created`;
//! - [`audit`] and [`checkpoint`]: W3's invariants, and the checkpoints that keep the windowed
//!   balance check off a member's history.
//!
//! The attempts themselves (immediate, retries, reaper) are grant-bonus's.

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
