//! W4's domain (docs/workflows/markets.md, seed 004): suspending a market cancels every order
//! still open in it without doing that work inside the suspend request (the seed's incident: 8,000
//! cancels in one request, which timed out half done holding their row locks). One state change
//! owes many units of work, and each is a row:
//!
//! - [`market`] and [`order`]: the market row (ACTIVE / SUSPENDED) and its orders; placement
//!   reads the market row LOCK IN SHARE MODE, so it serialises with suspend.
//! - [`suspension`]: suspend (one short transaction that freezes the cancel set), resume (only
//!   once the cancellation is complete), ops' retry of FAILED tasks.
//! - [`materialise`]: the batch's tasks created after the commit, a chunk per transaction,
//!   resumable ([`materialise::Materialiser`]).
//! - [`task`] and [`cancel`]: the task rows ([`task::TASKS`] for the retry kit) and the cancel
//!   transition cancel-orders runs.
//! - [`progress`]: the seed's GROUP BY and completion; [`audit`]: W4's invariants.

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
