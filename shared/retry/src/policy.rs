//! When a failed unit of work is tried again, and when it is given up (principle 9: retries
//! are bounded and their state lives in the database row).
//!
//! The policy is pure: it is handed the attempt count (and, for [`RetryPolicy::next_attempt_at`],
//! "now"), so it is tested with fixed instants and short schedules instead of sleeping. The
//! kit applies the delay with its [`super::Clock`] in SQL, the same clock the claim and the
//! due sweep compare `next_attempt_at` against.

use std::{borrow::Cow, time::Duration};

use chrono::{DateTime, Utc};

use super::Backoff;
use paybus_config::{ConfigError, Setting, Vars};

/// The shortest pause a policy hands out. Never zero: a retry must push `next_attempt_at`
/// strictly past the moment it is written, so a concurrent duplicate does not find the row
/// due at once.
pub const MIN_DELAY: Duration = Duration::from_millis(1);

/// How many attempts a unit of work gets and how long to wait between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    backoff: Backoff,
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

impl RetryPolicy {
    /// `max_attempts` attempts in all, the first one included; the pause after the n-th
    /// failure is `backoff.delay(n)`, raised to [`MIN_DELAY`] where shorter.
    pub fn new(max_attempts: u32, backoff: Backoff) -> Result<Self, InvalidRetryPolicy> {
        if max_attempts == 0 {
            return Err(InvalidRetryPolicy::NoAttempts);
        }
        if backoff.is_empty() {
            return Err(InvalidRetryPolicy::EmptyBackoff);
        }
        Ok(Self {
            max_attempts,
            backoff: backoff.at_least(MIN_DELAY),
        })
    }

    /// A policy written in the code, checked when it is compiled: `pub const DEFAULT_RETRY:
    /// RetryPolicy = RetryPolicy::constant(5, DEFAULT_BACKOFF);` does not build with no
    /// attempts, no pause or a pause shorter than [`MIN_DELAY`] (outside a `const` it would
    /// panic, so settings read at run time go through [`RetryPolicy::new`]).
    pub const fn constant(max_attempts: u32, backoff: Backoff) -> Self {
        assert!(max_attempts > 0, "max_attempts must be at least 1");
        let shortest = match &backoff {
            Backoff::Exponential { initial, .. } => initial.as_nanos(),
            Backoff::Schedule(Cow::Borrowed(steps)) => {
                assert!(!steps.is_empty(), "the backoff schedule needs a pause");
                let mut shortest = u128::MAX;
                let mut i = 0;
                while i < steps.len() {
                    if steps[i].as_nanos() < shortest {
                        shortest = steps[i].as_nanos();
                    }
                    i += 1;
                }
                shortest
            }
            Backoff::Schedule(Cow::Owned(_)) => panic!("a constant schedule is borrowed"),
        };
        assert!(
            shortest >= MIN_DELAY.as_nanos(),
            "no pause may be shorter than MIN_DELAY"
        );
        Self {
            max_attempts,
            backoff,
        }
    }

    /// A schedule of pauses (the last repeats), e.g. for tests: `[100 ms, 200 ms]`.
    pub fn with_schedule(
        max_attempts: u32,
        steps: Vec<Duration>,
    ) -> Result<Self, InvalidRetryPolicy> {
        Self::new(max_attempts, Backoff::Schedule(steps.into()))
    }

    /// The same backoff with another attempt limit.
    pub fn with_max_attempts(self, max_attempts: u32) -> Result<Self, InvalidRetryPolicy> {
        Self::new(max_attempts, self.backoff)
    }

    /// The same backoff with its attempt limit from `variable` (`*_MAX_ATTEMPTS` settings, at
    /// least 1); as it is when unset.
    pub fn with_max_attempts_from(
        self,
        vars: &Vars,
        variable: Setting,
    ) -> Result<Self, ConfigError> {
        let attempts = vars.parse(
            variable,
            self.max_attempts,
            "an attempt count, at least 1",
            |n: &u32| *n > 0,
        )?;
        self.with_max_attempts(attempts)
            .map_err(|_| vars.error(variable, &attempts.to_string(), "at least 1"))
    }

    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// The pause after `attempts` failed attempts (1 = the first), whether or not the limit
    /// allows another one.
    pub fn delay(&self, attempts: u32) -> Duration {
        self.backoff.delay(attempts).max(MIN_DELAY)
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
    fn a_short_schedule_for_tests_is_just_another_policy() {
        let policy = RetryPolicy::with_schedule(
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
        assert_eq!(policy.after_failure(4), RetryDecision::GiveUp);
    }

    #[test]
    fn pauses_are_never_zero_and_policies_are_never_empty() {
        let policy = RetryPolicy::with_schedule(2, vec![Duration::ZERO]).unwrap();
        assert_eq!(policy.delay(1), MIN_DELAY);
        assert_eq!(
            RetryPolicy::with_schedule(0, vec![Duration::from_secs(1)]),
            Err(InvalidRetryPolicy::NoAttempts)
        );
        assert_eq!(
            RetryPolicy::with_schedule(3, Vec::new()),
            Err(InvalidRetryPolicy::EmptyBackoff)
        );
        let exponential = RetryPolicy::new(
            5,
            Backoff::exponential(Duration::ZERO, Duration::from_secs(1)),
        )
        .unwrap();
        assert_eq!(exponential.delay(1), MIN_DELAY);
    }

    const STEPS: &[Duration] = &[Duration::from_secs(1), Duration::from_secs(5)];

    #[test]
    fn a_constant_policy_is_the_one_new_builds_from_the_same_parts() {
        const POLICY: RetryPolicy = RetryPolicy::constant(3, Backoff::schedule(STEPS));
        assert_eq!(
            POLICY,
            RetryPolicy::new(3, Backoff::schedule(STEPS)).unwrap()
        );
    }

    #[test]
    #[should_panic(expected = "max_attempts must be at least 1")]
    fn a_constant_policy_without_attempts_does_not_build() {
        let _ = RetryPolicy::constant(0, Backoff::schedule(STEPS));
    }

    #[test]
    #[should_panic(expected = "no pause may be shorter than MIN_DELAY")]
    fn a_constant_policy_with_a_zero_pause_does_not_build() {
        let _ = RetryPolicy::constant(2, Backoff::schedule(&[Duration::ZERO]));
    }
}
