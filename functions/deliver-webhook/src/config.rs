//! The delivery's settings: typed, with documented defaults, read once at start-up.

use std::{collections::HashMap, str::FromStr, time::Duration};

use paybus_platform::ConfigError;

use crate::retry::RetryPolicy;

/// Whole-request timeout of one POST by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connect timeout by default (inside the request timeout).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a claim outlives the request timeout by default.
pub const DEFAULT_LEASE_MARGIN: Duration = Duration::from_secs(50);

pub const VAR_TIMEOUT_MS: &str = "PAYBUS_WEBHOOK_TIMEOUT_MS";
pub const VAR_MAX_ATTEMPTS: &str = "PAYBUS_WEBHOOK_MAX_ATTEMPTS";

/// How deliver-webhook talks to partners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// One POST, from connecting to the last byte of the response (default 10 s,
    /// `PAYBUS_WEBHOOK_TIMEOUT_MS`). A timeout is a failed attempt.
    pub timeout: Duration,
    /// Connecting alone (default 5 s, capped by `timeout`).
    pub connect_timeout: Duration,
    /// A claim holds the row for `timeout + lease_margin` (default 50 s, so 60 s in all):
    /// long enough that no second claim starts while a POST is in flight, short enough that
    /// a delivery whose process died is tried again within a minute.
    pub lease_margin: Duration,
    /// Attempts and backoff (default: [`RetryPolicy::default`]; the attempt limit from
    /// `PAYBUS_WEBHOOK_MAX_ATTEMPTS`).
    pub retry: RetryPolicy,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lease_margin: DEFAULT_LEASE_MARGIN,
            retry: RetryPolicy::default(),
        }
    }
}

impl WebhookConfig {
    /// The claim's lease: the request timeout plus the margin.
    pub fn lease(&self) -> Duration {
        self.timeout.saturating_add(self.lease_margin)
    }

    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(std::env::vars().collect())
    }

    /// The defaults, overridden by the variables that are set (an empty value counts as
    /// unset). A malformed value names the variable and the expected form.
    pub fn from_vars(vars: HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        if let Some(ms) = parse::<u64>(&vars, VAR_TIMEOUT_MS, "milliseconds, at least 1")? {
            if ms == 0 {
                return Err(invalid(VAR_TIMEOUT_MS, "0", "milliseconds, at least 1"));
            }
            config.timeout = Duration::from_millis(ms);
        }
        if let Some(n) = parse::<u32>(&vars, VAR_MAX_ATTEMPTS, "an attempt count, at least 1")? {
            config.retry = config
                .retry
                .with_max_attempts(n)
                .map_err(|_| invalid(VAR_MAX_ATTEMPTS, &n.to_string(), "at least 1"))?;
        }
        Ok(config)
    }
}

fn parse<T: FromStr>(
    vars: &HashMap<String, String>,
    variable: &'static str,
    expected: &'static str,
) -> Result<Option<T>, ConfigError> {
    match vars.get(variable).map(|v| v.trim()) {
        None | Some("") => Ok(None),
        Some(value) => value
            .parse()
            .map(Some)
            .map_err(|_| invalid(variable, value, expected)),
    }
}

fn invalid(variable: &'static str, value: &str, expected: &'static str) -> ConfigError {
    ConfigError {
        variable,
        value: value.to_owned(),
        expected,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn nothing_set_means_the_documented_defaults() {
        let config = WebhookConfig::from_vars(HashMap::new()).unwrap();
        assert_eq!(config, WebhookConfig::default());
        assert_eq!(config.timeout, Duration::from_secs(10));
        assert_eq!(config.lease(), Duration::from_secs(60));
        assert_eq!(config.retry.max_attempts(), 8);
    }

    #[test]
    fn set_variables_override_and_empty_ones_do_not() {
        let config =
            WebhookConfig::from_vars(vars(&[(VAR_TIMEOUT_MS, "2500"), (VAR_MAX_ATTEMPTS, "")]))
                .unwrap();
        assert_eq!(config.timeout, Duration::from_millis(2500));
        assert_eq!(config.retry.max_attempts(), 8);
        let config = WebhookConfig::from_vars(vars(&[(VAR_MAX_ATTEMPTS, "3")])).unwrap();
        assert_eq!(config.retry.max_attempts(), 3);
    }

    #[test]
    fn a_malformed_value_names_the_variable() {
        let error = WebhookConfig::from_vars(vars(&[(VAR_TIMEOUT_MS, "10s")])).unwrap_err();
        assert_eq!(error.variable, VAR_TIMEOUT_MS);
        let error = WebhookConfig::from_vars(vars(&[(VAR_MAX_ATTEMPTS, "0")])).unwrap_err();
        assert_eq!(error.variable, VAR_MAX_ATTEMPTS);
        let error = WebhookConfig::from_vars(vars(&[(VAR_TIMEOUT_MS, "0")])).unwrap_err();
        assert_eq!(error.variable, VAR_TIMEOUT_MS);
    }
}
