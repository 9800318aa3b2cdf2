//! grant-bonus's settings: typed, with documented defaults, read once at start-up. The retry
//! schedule itself (5, 10, 15 minutes, then FAILED) is the seed's confirmed policy
//! (`paybus_bonuses::job::retry_policy`), not a setting.

use std::{collections::HashMap, time::Duration};

use paybus_config::{ConfigError, Setting, Vars};

pub const VAR_WORKER_INTERVAL_MS: Setting = Setting {
    name: "PAYBUS_BONUS_WORKER_INTERVAL_MS",
    default: "`300000`",
    about: "pause between worker runs (the retry path; seed 003: 5 min) (milliseconds, at least 1)",
};
pub const VAR_WORKER_BATCH: Setting = Setting {
    name: "PAYBUS_BONUS_WORKER_BATCH",
    default: "`30`",
    about: "due jobs a worker run claims (1 to 1000)",
};
pub const VAR_PROCESSING_TIMEOUT_MS: Setting = Setting {
    name: "PAYBUS_BONUS_PROCESSING_TIMEOUT_MS",
    default: "`600000`",
    about: "a job PROCESSING longer than this is returned to PENDING by the reaper (its \
            attempt's process died) (milliseconds, at least 1)",
};

/// What [`GrantConfig::read`] reads, in the order the page lists them.
pub const SETTINGS: &[Setting] = &[
    VAR_WORKER_INTERVAL_MS,
    VAR_WORKER_BATCH,
    VAR_PROCESSING_TIMEOUT_MS,
];

/// Seed 003: the worker runs every 5 minutes...
pub const DEFAULT_WORKER_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// ... and takes at most 30 due jobs a run.
pub const DEFAULT_WORKER_BATCH: u32 = 30;
/// A grant is one short transaction (a lock wait gives up after 50 s): a job PROCESSING for
/// 10 minutes belongs to an attempt whose process died.
pub const DEFAULT_PROCESSING_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// How often the reaper looks for such jobs.
pub const REAPER_INTERVAL: Duration = Duration::from_secs(60);

/// How grant-bonus's sweeper jobs run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantConfig {
    /// Pause between worker runs (default 5 min, `PAYBUS_BONUS_WORKER_INTERVAL_MS`). A retry
    /// is attempted on the first run after it is due: up to one interval past its backoff.
    pub worker_interval: Duration,
    /// Due jobs a worker run claims (default 30, `PAYBUS_BONUS_WORKER_BATCH`, 1 to 1000).
    pub worker_batch: u32,
    /// A PROCESSING job older than this is returned to PENDING by the reaper (default
    /// 10 min, `PAYBUS_BONUS_PROCESSING_TIMEOUT_MS`). Too short is safe, only wasteful: the
    /// attempt that still runs finds its claim gone and writes nothing.
    pub processing_timeout: Duration,
}

impl Default for GrantConfig {
    fn default() -> Self {
        Self {
            worker_interval: DEFAULT_WORKER_INTERVAL,
            worker_batch: DEFAULT_WORKER_BATCH,
            processing_timeout: DEFAULT_PROCESSING_TIMEOUT,
        }
    }
}

impl GrantConfig {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::read(&Vars::from_env())
    }

    pub fn from_vars(vars: HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::read(&Vars::new(vars))
    }

    /// The defaults, overridden by the variables that are set; a malformed value names the
    /// variable and the expected form.
    pub fn read(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Self {
            worker_interval: vars.millis(VAR_WORKER_INTERVAL_MS, DEFAULT_WORKER_INTERVAL)?,
            worker_batch: vars.parse(
                VAR_WORKER_BATCH,
                DEFAULT_WORKER_BATCH,
                "jobs per run, 1 to 1000",
                |n: &u32| (1..=1_000).contains(n),
            )?,
            processing_timeout: vars
                .millis(VAR_PROCESSING_TIMEOUT_MS, DEFAULT_PROCESSING_TIMEOUT)?,
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
                GrantConfig::from_vars(environment),
                Ok(GrantConfig::default()),
                "{name}"
            );
        }
    }

    fn vars(pairs: &[(Setting, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.name.to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn nothing_set_means_the_seed_s_policy() {
        let config = GrantConfig::from_vars(HashMap::new()).unwrap();
        assert_eq!(config, GrantConfig::default());
        assert_eq!(config.worker_interval, Duration::from_secs(300));
        assert_eq!(config.worker_batch, 30);
        assert_eq!(config.processing_timeout, Duration::from_secs(600));
    }

    #[test]
    fn set_variables_override_and_bad_ones_name_themselves() {
        let config = GrantConfig::from_vars(vars(&[
            (VAR_WORKER_INTERVAL_MS, "1000"),
            (VAR_WORKER_BATCH, "5"),
            (VAR_PROCESSING_TIMEOUT_MS, ""),
        ]))
        .unwrap();
        assert_eq!(config.worker_interval, Duration::from_secs(1));
        assert_eq!(config.worker_batch, 5);
        assert_eq!(config.processing_timeout, DEFAULT_PROCESSING_TIMEOUT);
        for (variable, value) in [
            (VAR_WORKER_BATCH, "0"),
            (VAR_WORKER_BATCH, "1001"),
            (VAR_WORKER_INTERVAL_MS, "5m"),
            (VAR_PROCESSING_TIMEOUT_MS, "0"),
        ] {
            let error = GrantConfig::from_vars(vars(&[(variable, value)])).unwrap_err();
            assert_eq!(error.variable, variable.name);
        }
    }
}
