//! The row-backed retry kit (principles 6 and 9): every unit of work is a row whose attempts,
//! next attempt, last error and terminal state are visible with plain SQL, and a restart
//! resumes where it stopped.
//!
//! - [`Backoff`] — the one type for every pause (requeues, failing jobs, reconnection,
//!   retry schedules).
//! - [`RetryPolicy`] — attempts and backoff of a unit of work; pure, tested without sleeping.
//! - [`Clock`] — the database's `NOW(6)` in production, a manual clock in tests.
//! - [`WorkTable`] — a workflow's table described once: claim with a lease, conditional
//!   settle (done / retry at / failed), batch claim of due rows, reaper of expired leases.
//! - the due sweep that re-publishes due rows through the outbox is a maintenance job
//!   (`paybus_maintenance::DueSweep`).
//!
//! Its users: deliver-webhook's partner notifications, W1's matching, W3's bonus jobs and W4's
//! cancel tasks.

mod backoff;
pub mod clock;
mod policy;
mod rows;

pub use backoff::Backoff;
pub use clock::Clock;
pub use policy::{InvalidRetryPolicy, MIN_DELAY, RetryDecision, RetryPolicy};
pub use rows::{AfterFailure, AttemptCount, Claim, Lease, RowState, Settled, WorkTable};
