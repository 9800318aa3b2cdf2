//! W4's domain (docs/workflows/markets.md, seed 004): suspending a market cancels every order still open in it,
//! without doing that work inside the suspend request.
//!
//! The seed's first version cancelled 8,000 orders inside the request: it timed out with half
//! of them cancelled and held their row locks until it died. Here one state change owes many
//! units of work, and each is a row:
//!
//! - [`market`]: the market row (ACTIVE / SUSPENDED) and the symbol's rules.
//! - [`order`]: orders — placement (refused while the market is SUSPENDED: it reads the market
//!   row LOCK IN SHARE MODE, so it serialises with suspend), fills, the conditional cancel.
//! - [`suspension`]: suspend (one short transaction: the conditional ACTIVE → SUSPENDED and the
//!   batch row that freezes the cancel set), resume (only once the cancellation is complete),
//!   ops' retry of FAILED tasks.
//! - [`materialise`]: the batch's tasks created after the commit, set-based, a chunk per
//!   transaction with a cursor on the batch row (resumable), each chunk with its
//!   `market.cancel_tasks.created` messages; the [`materialise::Materialiser`] job.
//! - [`task`]: the task row's states and the platform retry kit's [`task::TASKS`].
//! - [`progress`]: the seed's GROUP BY, the created count, open orders left, and completion.
//! - [`audit`]: W4's invariants.

pub mod audit;
pub mod cancel;
mod error;
pub mod market;
pub mod materialise;
pub mod messages;
pub mod order;
pub mod progress;
pub mod suspension;
pub mod task;

pub use error::MarketError;
pub use messages::CancelTasksCreated;

#[cfg(feature = "test-harness")]
pub mod testing;

/// `1234567` as `1,234,567`: counts as people read them in progress lines.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(super::grouped(0), "0");
        assert_eq!(super::grouped(999), "999");
        assert_eq!(super::grouped(6_204), "6,204");
        assert_eq!(super::grouped(1_000_000), "1,000,000");
    }
}
