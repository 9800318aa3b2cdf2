//! cancel-orders' settings: typed, with documented defaults, read once at start-up.

use std::{collections::HashMap, time::Duration};

use paybus_config::{ConfigError, Setting, Vars};
use paybus_retry::{Backoff, RetryPolicy};

/// Pauses after the 1st, 2nd, … failed attempt of a task; past the end the last repeats.
pub const DEFAULT_BACKOFF: Backoff = Backoff::schedule(&[
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(2 * 60),
]);

/// Attempts in all, the first one included.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;

/// The default attempts and backoff together, checked when compiled.
pub const DEFAULT_RETRY: RetryPolicy = RetryPolicy::constant(DEFAULT_MAX_ATTEMPTS, DEFAULT_BACKOFF);

pub const VAR_MAX_ATTEMPTS: Setting = Setting {
    name: "PAYBUS_CANCEL_MAX_ATTEMPTS",
    default: "`5`",
    about: "attempts of a task's cancel before FAILED + dead letter (waits 1 s, 5 s, 30 s, \
            2 min) (at least 1)",
};

/// What [`CancelConfig::read`] reads.
pub const SETTINGS: &[Setting] = &[VAR_MAX_ATTEMPTS];

/// How cancel-orders retries a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelConfig {
    /// Attempts and backoff. Default: 5 attempts; after failed attempt 1..=4 wait 1 s, 5 s,
    /// 30 s, 2 min; the 5th failure is terminal (FAILED + dead letter), about 2.5 min after
    /// the first. The attempt limit comes from `PAYBUS_CANCEL_MAX_ATTEMPTS`.
    pub retry: RetryPolicy,
    /// The in-place lease of a claim (default 30 s). A task's claim, cancel and settle share
    /// one transaction, so the lease only matters if a process dies between a failed attempt
    /// and its record.
    pub lease: Duration,
}

impl Default for CancelConfig {
    fn default() -> Self {
        Self {
            retry: DEFAULT_RETRY,
            lease: Duration::from_secs(30),
        }
    }
}

impl CancelConfig {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::read(&Vars::from_env())
    }

    pub fn from_vars(vars: HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::read(&Vars::new(vars))
    }

    pub fn read(vars: &Vars) -> Result<Self, ConfigError> {
        let retry = DEFAULT_RETRY.with_max_attempts_from(vars, VAR_MAX_ATTEMPTS)?;
        Ok(Self {
            retry,
            ..Self::default()
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_documented_default_is_the_default() {
        for (name, environment) in paybus_config::setting::documented_defaults(SETTINGS) {
            assert_eq!(
                CancelConfig::from_vars(environment),
                Ok(CancelConfig::default()),
                "{name}"
            );
        }
    }

    #[test]
    fn nothing_set_means_the_documented_defaults() {
        let config = CancelConfig::from_vars(HashMap::new()).unwrap();
        assert_eq!(config, CancelConfig::default());
        let pauses: Vec<u64> = (1..=5).map(|n| config.retry.delay(n).as_secs()).collect();
        assert_eq!(pauses, [1, 5, 30, 120, 120]);
        assert_eq!(config.retry.max_attempts(), 5);
    }

    #[test]
    fn the_attempt_limit_is_configurable_and_checked() {
        let vars = |v: &str| HashMap::from([(VAR_MAX_ATTEMPTS.name.to_owned(), v.to_owned())]);
        assert_eq!(
            CancelConfig::from_vars(vars("3"))
                .unwrap()
                .retry
                .max_attempts(),
            3
        );
        for bad in ["0", "three", "-1"] {
            assert_eq!(
                CancelConfig::from_vars(vars(bad)).unwrap_err().variable,
                VAR_MAX_ATTEMPTS.name
            );
        }
    }
}
