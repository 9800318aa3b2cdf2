//! When a failed delivery is tried again, and when it is given up (principle 9: retries are
//! bounded and their state lives in the database row).
//!
//! The policy is pure: it is handed the attempt count and "now", so it is tested with fixed
//! instants and short schedules instead of sleeping. The handler applies it with the
//! database's clock (`NOW(6) + delay` in SQL), the same clock the claim and the due-retries
//! sweep compare `next_attempt_at` against, so application and database clocks never mix.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The default schedule: pauses after the 1st, 2nd, … failed attempt. Past its end the last
/// pause repeats (the cap).
pub const DEFAULT_BACKOFF: [Duration; 6] = [
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(2 * 60),
    Duration::from_secs(10 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(60 * 60),
];

/// Attempts in all, the first one included.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;

/// The shortest pause a policy hands out. Never zero: a retry must push `next_attempt_at`
/// strictly past the moment it is written, which is what arms the row for the due-retries
/// sweep (see `due`).
pub const MIN_DELAY: Duration = Duration::from_millis(1);

/// How many times a notification is tried and how long to wait between tries.
///
/// Defaults: 8 attempts; after failed attempt 1..=7 wait 10 s, 30 s, 2 min, 10 min, 30 min,
/// 1 h, 1 h; the 8th failure is terminal (FAILED + dead letter). A partner that is down for
/// good is given up about 2 h 43 min after the first attempt (plus the attempts' own time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    backoff: Vec<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRetryPolicy {
    #[error("max_attempts must be at least 1")]
    NoAttempts,
    #[error("the backoff schedule needs at least one pause")]
    EmptyBackoff,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Try again after this pause.
    RetryAfter(Duration),
    /// The attempt limit is reached: terminal.
    GiveUp,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: DEFAULT_BACKOFF.to_vec(),
        }
    }
}

impl RetryPolicy {
    /// `backoff[n - 1]` is the pause after the n-th failed attempt; the last entry repeats.
    /// Pauses shorter than [`MIN_DELAY`] are raised to it.
    pub fn new(max_attempts: u32, backoff: Vec<Duration>) -> Result<Self, InvalidRetryPolicy> {
        if max_attempts == 0 {
            return Err(InvalidRetryPolicy::NoAttempts);
        }
        if backoff.is_empty() {
            return Err(InvalidRetryPolicy::EmptyBackoff);
        }
        let backoff = backoff.into_iter().map(|d| d.max(MIN_DELAY)).collect();
        Ok(Self {
            max_attempts,
            backoff,
        })
    }

    /// The same schedule with another attempt limit.
    pub fn with_max_attempts(self, max_attempts: u32) -> Result<Self, InvalidRetryPolicy> {
        Self::new(max_attempts, self.backoff)
    }

    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    pub fn backoff(&self) -> &[Duration] {
        &self.backoff
    }

    /// The pause after `attempts` failed attempts (1 = the first), whether or not the limit
    /// allows another one.
    pub fn delay(&self, attempts: u32) -> Duration {
        let index = usize::try_from(attempts.saturating_sub(1)).unwrap_or(usize::MAX);
        self.backoff
            .get(index)
            .or(self.backoff.last())
            .copied()
            .unwrap_or(MIN_DELAY)
    }

    /// After the `attempts`-th attempt failed: another try, or give up. An attempt count past
    /// the limit (a crash on the last attempt, then one more claim) also gives up.
    pub fn after_failure(&self, attempts: u32) -> RetryDecision {
        if attempts >= self.max_attempts {
            RetryDecision::GiveUp
        } else {
            RetryDecision::RetryAfter(self.delay(attempts))
        }
    }

    /// When the next attempt is due if the `attempts`-th failed at `now`; `None` when the
    /// policy gives up.
    pub fn next_attempt_at(&self, attempts: u32, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self.after_failure(attempts) {
            RetryDecision::GiveUp => None,
            RetryDecision::RetryAfter(delay) => {
                let delay = chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
                Some(
                    now.checked_add_signed(delay)
                        .unwrap_or(DateTime::<Utc>::MAX_UTC),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn at(rfc3339: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(rfc3339).unwrap().into()
    }

    #[test]
    fn the_default_schedule_backs_off_then_caps_at_an_hour() {
        let policy = RetryPolicy::default();
        let pauses: Vec<u64> = (1..=7).map(|n| policy.delay(n).as_secs()).collect();
        assert_eq!(pauses, [10, 30, 120, 600, 1800, 3600, 3600]);
        assert_eq!(policy.delay(100), Duration::from_secs(3600));
    }

    #[test]
    fn the_eighth_failure_gives_up_by_default() {
        let policy = RetryPolicy::default();
        assert_eq!(
            policy.after_failure(7),
            RetryDecision::RetryAfter(Duration::from_secs(3600))
        );
        assert_eq!(policy.after_failure(8), RetryDecision::GiveUp);
        assert_eq!(policy.after_failure(9), RetryDecision::GiveUp);
    }

    #[test]
    fn the_next_attempt_is_now_plus_the_pause() {
        let policy = RetryPolicy::default();
        let now = at("2026-11-30T12:00:00.123456Z");
        assert_eq!(
            policy.next_attempt_at(1, now),
            Some(at("2026-11-30T12:00:10.123456Z"))
        );
        assert_eq!(
            policy.next_attempt_at(3, now),
            Some(at("2026-11-30T12:02:00.123456Z"))
        );
        assert_eq!(policy.next_attempt_at(8, now), None);
    }

    #[test]
    fn a_short_schedule_for_tests_is_just_another_policy() {
        let policy = RetryPolicy::new(
            3,
            vec![Duration::from_millis(100), Duration::from_millis(200)],
        )
        .unwrap();
        let now = at("2026-11-30T00:00:00Z");
        assert_eq!(
            policy.next_attempt_at(1, now),
            Some(at("2026-11-30T00:00:00.100Z"))
        );
        assert_eq!(
            policy.next_attempt_at(2, now),
            Some(at("2026-11-30T00:00:00.200Z"))
        );
        assert_eq!(policy.next_attempt_at(3, now), None);
    }

    #[test]
    fn pauses_are_never_zero_and_policies_are_never_empty() {
        let policy = RetryPolicy::new(2, vec![Duration::ZERO]).unwrap();
        assert_eq!(policy.delay(1), MIN_DELAY);
        assert_eq!(
            RetryPolicy::new(0, vec![Duration::from_secs(1)]),
            Err(InvalidRetryPolicy::NoAttempts)
        );
        assert_eq!(
            RetryPolicy::new(3, Vec::new()),
            Err(InvalidRetryPolicy::EmptyBackoff)
        );
    }
}
