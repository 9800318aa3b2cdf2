//! The delivery's settings: typed, with documented defaults, read once at start-up.

use std::{collections::HashMap, time::Duration};

use paybus_config::{ConfigError, Setting, Vars};
use paybus_partners::breaker::BreakerPolicy;
use paybus_retry::{Backoff, RetryPolicy};

/// The default schedule: pauses after the 1st, 2nd, … failed attempt. Past its end the last
/// pause repeats (the cap).
pub const DEFAULT_BACKOFF: Backoff = Backoff::schedule(&[
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(2 * 60),
    Duration::from_secs(10 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(60 * 60),
]);

/// Attempts in all, the first one included.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;

/// The default attempts and backoff together, checked when compiled.
pub const DEFAULT_RETRY: RetryPolicy = RetryPolicy::constant(DEFAULT_MAX_ATTEMPTS, DEFAULT_BACKOFF);

/// Whole-request timeout of one POST by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connect timeout by default (inside the request timeout).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a claim outlives the request timeout by default.
pub const DEFAULT_LEASE_MARGIN: Duration = Duration::from_secs(50);

pub const VAR_TIMEOUT_MS: Setting = Setting {
    name: "PAYBUS_WEBHOOK_TIMEOUT_MS",
    default: "`10000`",
    about: "one POST to a partner before it counts as failed (milliseconds, at least 1)",
};
pub const VAR_MAX_ATTEMPTS: Setting = Setting {
    name: "PAYBUS_WEBHOOK_MAX_ATTEMPTS",
    default: "`8`",
    about: "attempts before FAILED + dead letter (waits 10 s, 30 s, 2 min, 10 min, 30 min, then \
            hourly) (at least 1)",
};
pub const VAR_PARTNER_CONCURRENCY: Setting = Setting {
    name: "PAYBUS_WEBHOOK_PARTNER_CONCURRENCY",
    default: "`16`",
    about: "POSTs in flight to one partner per process; past it a delivery is deferred \
            unattempted (at least 1)",
};
pub const VAR_BREAKER_FAILURES: Setting = Setting {
    name: "PAYBUS_WEBHOOK_BREAKER_FAILURES",
    default: "`5`",
    about: "consecutive failures that open a partner's circuit breaker (at least 1)",
};
pub const VAR_BREAKER_COOLDOWN_MS: Setting = Setting {
    name: "PAYBUS_WEBHOOK_BREAKER_COOLDOWN_MS",
    default: "`30000`",
    about: "how long an open breaker parks a partner's deliveries before one probe (milliseconds, at least 1)",
};

/// What [`WebhookConfig::read`] reads, in the order the page lists them.
pub const SETTINGS: &[Setting] = &[
    VAR_TIMEOUT_MS,
    VAR_MAX_ATTEMPTS,
    VAR_PARTNER_CONCURRENCY,
    VAR_BREAKER_FAILURES,
    VAR_BREAKER_COOLDOWN_MS,
];

/// Deliveries in flight per partner and process by default: a quarter of the default prefetch
/// (64), so one partner never holds more than its share of a consumer.
pub const DEFAULT_PARTNER_CONCURRENCY: usize = 16;
/// How long a delivery waits for its partner's slot before it is deferred: a healthy partner
/// answers well within it, a hanging one frees the consumer this fast.
pub const DEFAULT_PARTNER_WAIT: Duration = Duration::from_millis(100);
/// Consecutive failures that open a partner's breaker by default.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
/// How long an open breaker parks a partner's deliveries by default.
pub const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_secs(30);

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
    /// Attempts and backoff. Default: 8 attempts; after failed attempt 1..=7 wait 10 s, 30 s,
    /// 2 min, 10 min, 30 min, 1 h, 1 h; the 8th failure is terminal (FAILED + dead letter). A
    /// partner that is down for good is given up about 2 h 43 min after the first attempt
    /// (plus the attempts' own time). The attempt limit comes from
    /// `PAYBUS_WEBHOOK_MAX_ATTEMPTS`.
    pub retry: RetryPolicy,
    /// Deliveries in flight to one partner from this process (default 16,
    /// `PAYBUS_WEBHOOK_PARTNER_CONCURRENCY`); a delivery that finds no slot within
    /// `partner_wait` (100 ms) is deferred unattempted.
    pub partner_concurrency: usize,
    pub partner_wait: Duration,
    /// The partner circuit breaker: opens after `PAYBUS_WEBHOOK_BREAKER_FAILURES` (default 5)
    /// consecutive failures, parks the partner's deliveries for
    /// `PAYBUS_WEBHOOK_BREAKER_COOLDOWN_MS` (default 30 s), then lets one probe through.
    pub breaker: BreakerPolicy,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lease_margin: DEFAULT_LEASE_MARGIN,
            retry: DEFAULT_RETRY,
            partner_concurrency: DEFAULT_PARTNER_CONCURRENCY,
            partner_wait: DEFAULT_PARTNER_WAIT,
            breaker: BreakerPolicy {
                failures_to_open: DEFAULT_BREAKER_FAILURES,
                cool_down: DEFAULT_BREAKER_COOLDOWN,
            },
        }
    }
}

impl WebhookConfig {
    /// The claim's lease: the request timeout plus the margin.
    pub fn lease(&self) -> Duration {
        self.timeout.saturating_add(self.lease_margin)
    }

    pub fn from_env() -> Result<Self, ConfigError> {
        Self::read(&Vars::from_env())
    }

    /// The defaults, overridden by the variables that are set (an empty value counts as
    /// unset). A malformed value names the variable and the expected form.
    pub fn from_vars(vars: HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::read(&Vars::new(vars))
    }

    pub fn read(vars: &Vars) -> Result<Self, ConfigError> {
        let timeout = Duration::from_millis(vars.parse(
            VAR_TIMEOUT_MS,
            u64::try_from(DEFAULT_TIMEOUT.as_millis()).unwrap_or(u64::MAX),
            "milliseconds, at least 1",
            |ms: &u64| *ms > 0,
        )?);
        let retry = DEFAULT_RETRY.with_max_attempts_from(vars, VAR_MAX_ATTEMPTS)?;
        let partner_concurrency = vars.parse(
            VAR_PARTNER_CONCURRENCY,
            DEFAULT_PARTNER_CONCURRENCY,
            "deliveries in flight per partner, at least 1",
            |n: &usize| *n > 0,
        )?;
        let failures_to_open = vars.parse(
            VAR_BREAKER_FAILURES,
            DEFAULT_BREAKER_FAILURES,
            "consecutive failures, at least 1",
            |n: &u32| *n > 0,
        )?;
        let cool_down = Duration::from_millis(vars.parse(
            VAR_BREAKER_COOLDOWN_MS,
            u64::try_from(DEFAULT_BREAKER_COOLDOWN.as_millis()).unwrap_or(u64::MAX),
            "milliseconds, at least 1",
            |ms: &u64| *ms > 0,
        )?);
        Ok(Self {
            timeout,
            retry,
            partner_concurrency,
            breaker: BreakerPolicy {
                failures_to_open,
                cool_down,
            },
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
                WebhookConfig::from_vars(environment),
                Ok(WebhookConfig::default()),
                "{name}"
            );
        }
    }

    #[test]
    fn the_default_schedule_backs_off_then_caps_at_an_hour() {
        let policy = WebhookConfig::default().retry;
        let pauses: Vec<u64> = (1..=7).map(|n| policy.delay(n).as_secs()).collect();
        assert_eq!(pauses, [10, 30, 120, 600, 1800, 3600, 3600]);
        assert_eq!(policy.delay(100), Duration::from_secs(3600));
    }

    #[test]
    fn the_eighth_failure_gives_up_by_default() {
        use paybus_retry::RetryDecision;
        let policy = WebhookConfig::default().retry;
        assert_eq!(
            policy.after_failure(7),
            RetryDecision::RetryAfter(Duration::from_secs(3600))
        );
        assert_eq!(policy.after_failure(8), RetryDecision::GiveUp);
        assert_eq!(policy.after_failure(9), RetryDecision::GiveUp);
    }

    fn vars(pairs: &[(Setting, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.name.to_owned(), (*v).to_owned()))
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
    fn bulkhead_and_breaker_settings_default_and_override() {
        let config = WebhookConfig::from_vars(HashMap::new()).unwrap();
        assert_eq!(config.partner_concurrency, 16);
        assert_eq!(config.breaker.failures_to_open, 5);
        assert_eq!(config.breaker.cool_down, Duration::from_secs(30));
        let config = WebhookConfig::from_vars(vars(&[
            (VAR_PARTNER_CONCURRENCY, "2"),
            (VAR_BREAKER_FAILURES, "3"),
            (VAR_BREAKER_COOLDOWN_MS, "1500"),
        ]))
        .unwrap();
        assert_eq!(config.partner_concurrency, 2);
        assert_eq!(config.breaker.failures_to_open, 3);
        assert_eq!(config.breaker.cool_down, Duration::from_millis(1500));
        for variable in [
            VAR_PARTNER_CONCURRENCY,
            VAR_BREAKER_FAILURES,
            VAR_BREAKER_COOLDOWN_MS,
        ] {
            let error = WebhookConfig::from_vars(vars(&[(variable, "0")])).unwrap_err();
            assert_eq!(error.variable, variable.name);
        }
    }

    #[test]
    fn a_malformed_value_names_the_variable() {
        let error = WebhookConfig::from_vars(vars(&[(VAR_TIMEOUT_MS, "10s")])).unwrap_err();
        assert_eq!(error.variable, VAR_TIMEOUT_MS.name);
        let error = WebhookConfig::from_vars(vars(&[(VAR_MAX_ATTEMPTS, "0")])).unwrap_err();
        assert_eq!(error.variable, VAR_MAX_ATTEMPTS.name);
        let error = WebhookConfig::from_vars(vars(&[(VAR_TIMEOUT_MS, "0")])).unwrap_err();
        assert_eq!(error.variable, VAR_TIMEOUT_MS.name);
    }
}
