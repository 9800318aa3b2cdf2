//! W1's settings: typed, with the seed's defaults (seed 000 §4), read once at start-up by the
//! API (inline matching) and by match-deposit (its handler and sweeper jobs).

use std::{collections::HashMap, time::Duration};

use paybus_config::{ConfigError, Secret, Setting, Vars};
use paybus_retry::{Backoff, RetryPolicy};
use url::Url;

pub const VAR_QUOTE_URL: Setting = Setting {
    name: "PAYBUS_QUOTE_URL",
    default: "unset",
    about: "base URL of the quote service (TORQ: `POST /v1/quotes`, `POST /v1/trades`); unset: \
            inline matching answers 503 and every attempt fails (counted) with that reason",
};
pub const VAR_QUOTE_API_KEY: Setting = Setting {
    name: "PAYBUS_QUOTE_API_KEY",
    default: "unset",
    about: "sent as `Authorization: Bearer` to the quote service (≥ 16 chars)",
};
pub const VAR_QUOTE_TIMEOUT_MS: Setting = Setting {
    name: "PAYBUS_QUOTE_TIMEOUT_MS",
    default: "`3000`",
    about: "one quote service call, connect to last byte; a getQuote timeout is a failed \
            attempt, a createTrade timeout leaves the fill in doubt (asked again under its key) (milliseconds, at least 1)",
};
pub const VAR_QUOTE_CONNECT_TIMEOUT_MS: Setting = Setting {
    name: "PAYBUS_QUOTE_CONNECT_TIMEOUT_MS",
    default: "`1000`",
    about: "connecting alone (capped by the call's timeout) (milliseconds, at least 1)",
};
pub const VAR_FILL_POLICY: Setting = Setting {
    name: "PAYBUS_MATCH_FILL_POLICY",
    default: "`fill-or-cancel`",
    about: "`fill-or-cancel` (too little liquidity → CANCELLED at once) or `partial-retry` \
            (fill what is there, retry the rest)",
};
pub const VAR_MAX_ATTEMPTS: Setting = Setting {
    name: "PAYBUS_MATCH_MAX_ATTEMPTS",
    default: "`5`",
    about: "attempts before CANCELLED MATCH_FAILED + dead letter (waits 5 s, 15 s, 30 s, 60 s \
            between them) (at least 1)",
};
pub const VAR_TRADE_CHECKS: Setting = Setting {
    name: "PAYBUS_MATCH_TRADE_CHECKS",
    default: "`10`",
    about: "createTrade calls under one fill's key whose outcome may stay unknown (waits 2 s, \
            5 s, 15 s, 30 s, 1 min, 2 min, then 5 min; ~19 min in all) before the order is \
            IN_DOUBT with a dead letter; never counted as failed attempts (at least 1)",
};
pub const VAR_BATCH_SIZE: Setting = Setting {
    name: "PAYBUS_MATCH_BATCH_SIZE",
    default: "`10`",
    about: "orders the due-orders job claims per batch (1 to 1000)",
};
pub const VAR_POLL_INTERVAL_MS: Setting = Setting {
    name: "PAYBUS_MATCH_POLL_INTERVAL_MS",
    default: "`1000`",
    about: "pause between the due-orders job's passes (milliseconds, at least 1)",
};
pub const VAR_ZOMBIE_TIMEOUT_MS: Setting = Setting {
    name: "PAYBUS_MATCH_ZOMBIE_TIMEOUT_MS",
    default: "`300000`",
    about: "a MATCHING claim older than this is a dead attempt; the reaper (every fifth of it) \
            hands the order back; also the audit's limit for a RESERVED match. Must exceed \
            2 × `PAYBUS_QUOTE_TIMEOUT_MS` + 10 s, so a live attempt never looks dead (milliseconds, at least 1)",
};
pub const VAR_ORDER_TTL_MS: Setting = Setting {
    name: "PAYBUS_MATCH_ORDER_TTL_MS",
    default: "`1800000`",
    about: "a deposit order's life (`expires_at`) (milliseconds, at least 1)",
};
pub const VAR_EXPIRY_INTERVAL_MS: Setting = Setting {
    name: "PAYBUS_MATCH_EXPIRY_INTERVAL_MS",
    default: "`30000`",
    about: "pause between the expiry job's passes (milliseconds, at least 1)",
};

/// What [`MatchingConfig::read`] reads, in the order the page lists them.
pub const SETTINGS: &[Setting] = &[
    VAR_QUOTE_URL,
    VAR_QUOTE_API_KEY,
    VAR_QUOTE_TIMEOUT_MS,
    VAR_QUOTE_CONNECT_TIMEOUT_MS,
    VAR_FILL_POLICY,
    VAR_MAX_ATTEMPTS,
    VAR_TRADE_CHECKS,
    VAR_BATCH_SIZE,
    VAR_POLL_INTERVAL_MS,
    VAR_ZOMBIE_TIMEOUT_MS,
    VAR_ORDER_TTL_MS,
    VAR_EXPIRY_INTERVAL_MS,
];

/// Seed 000 §4 (`max-attempts: 5`).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// Seed 000 §4 (`batch-size: 10`).
pub const DEFAULT_BATCH_SIZE: u32 = 10;
/// Seed 000 §4 (`poll-interval-ms: 1000`).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Seed 000 §4 (`zombie-timeout-minutes: 5`).
pub const DEFAULT_ZOMBIE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Seed 000 §3.2: a deposit order expires 30 minutes after it was created.
pub const DEFAULT_ORDER_TTL: Duration = Duration::from_secs(30 * 60);
/// Seed 000 §5: the expiry job sweeps every 30 s.
pub const DEFAULT_EXPIRY_INTERVAL: Duration = Duration::from_secs(30);
pub const DEFAULT_QUOTE_TIMEOUT: Duration = Duration::from_secs(3);
pub const DEFAULT_QUOTE_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The pause after the 1st, 2nd, … failed attempt (the last repeats). With the default 5
/// attempts an order that never fills is given up about 2 minutes after its first attempt,
/// well inside its 30-minute life.
pub const DEFAULT_BACKOFF: Backoff = Backoff::schedule(&[
    Duration::from_secs(5),
    Duration::from_secs(15),
    Duration::from_secs(30),
    Duration::from_secs(60),
]);

/// The default attempts and backoff together, checked when compiled.
pub const DEFAULT_RETRY: RetryPolicy = RetryPolicy::constant(DEFAULT_MAX_ATTEMPTS, DEFAULT_BACKOFF);

/// createTrade calls under one fill's key whose outcome may stay unknown before asking stops
/// and the order is parked IN_DOUBT for a human.
pub const DEFAULT_TRADE_CHECKS: u32 = 10;

/// The pause after the 1st, 2nd, … unknown outcome (the last repeats): with the default 10
/// checks, asking stops about 19 minutes after the first call — long enough to ride out a
/// quote service incident, short enough that ops hear of it the same hour.
pub const DEFAULT_TRADE_CHECK_BACKOFF: Backoff = Backoff::schedule(&[
    Duration::from_secs(2),
    Duration::from_secs(5),
    Duration::from_secs(15),
    Duration::from_secs(30),
    Duration::from_secs(60),
    Duration::from_secs(120),
    Duration::from_secs(300),
]);

/// The default checks and their backoff together, checked when compiled.
pub const DEFAULT_TRADE_CHECK_POLICY: RetryPolicy =
    RetryPolicy::constant(DEFAULT_TRADE_CHECKS, DEFAULT_TRADE_CHECK_BACKOFF);

/// What an attempt spends besides its two quote calls, at most (its short transactions), for
/// the check that the zombie timeout cannot reap a live attempt.
const ATTEMPT_MARGIN: Duration = Duration::from_secs(10);

/// Candidates one attempt considers: the oldest OPEN withdraw orders, at most this many
/// (seed 000 §0 ②, not a setting).
pub const CANDIDATES: u32 = 10;

/// What an attempt does with an order the liquidity it finds cannot fill.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
)]
#[strum(serialize_all = "kebab-case")]
pub enum FillPolicy {
    /// The seed's unified path (production): an order the candidates cannot fill in full is
    /// CANCELLED at once (NO_LIQUIDITY); nothing is reserved, nothing is traded.
    #[default]
    FillOrCancel,
    /// The seed's legacy path: fill what the candidates hold, keep the remainder, and return
    /// normally with the order still MATCHING; outcome accounting counts that as a failed
    /// attempt (seed 000 §3.2) and tries again after the backoff, up to the limit.
    PartialRetry,
}

/// The quote service (the seeds' TORQ): where, with which key, and how long to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuoteConfig {
    /// Base URL (`PAYBUS_QUOTE_URL`). Unset: matching attempts fail with a clear error (and
    /// the create API refuses inline matching with 503).
    pub url: Option<Url>,
    /// Sent as `Authorization: Bearer <key>` when set (`PAYBUS_QUOTE_API_KEY`).
    pub api_key: Option<Secret>,
    /// One call, connect to last byte (default 3 s, `PAYBUS_QUOTE_TIMEOUT_MS`).
    pub timeout: Duration,
    /// Connecting alone (default 1 s, capped by `timeout`).
    pub connect_timeout: Duration,
}

impl Default for QuoteConfig {
    fn default() -> Self {
        Self {
            url: None,
            api_key: None,
            timeout: DEFAULT_QUOTE_TIMEOUT,
            connect_timeout: DEFAULT_QUOTE_CONNECT_TIMEOUT,
        }
    }
}

/// How deposit orders are matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchingConfig {
    /// `PAYBUS_MATCH_FILL_POLICY`: `fill-or-cancel` (default) or `partial-retry`.
    pub fill_policy: FillPolicy,
    /// Attempts and their backoff (`PAYBUS_MATCH_MAX_ATTEMPTS`, default 5; pauses 5 s, 15 s,
    /// 30 s, 60 s). At the limit: CANCELLED MATCH_FAILED and a dead letter.
    pub retry: RetryPolicy,
    /// Calls under a fill's key whose outcome may stay unknown, and the pauses between them
    /// (`PAYBUS_MATCH_TRADE_CHECKS`, default 10; 2 s, 5 s, 15 s, 30 s, 1 min, 2 min, then
    /// 5 min). At the bound: IN_DOUBT and a dead letter (needs a human). Never counted as a
    /// failed attempt.
    pub trade_checks: RetryPolicy,
    /// Orders the due-orders job claims per batch (`PAYBUS_MATCH_BATCH_SIZE`, default 10).
    pub batch_size: u32,
    /// Pause between the due-orders job's passes (`PAYBUS_MATCH_POLL_INTERVAL_MS`, 1 s).
    pub poll_interval: Duration,
    /// A MATCHING claim older than this belongs to a dead process: the reaper hands the order
    /// back (`PAYBUS_MATCH_ZOMBIE_TIMEOUT_MS`, default 5 min; the reaper runs every fifth of it).
    pub zombie_timeout: Duration,
    /// A deposit order's life (`PAYBUS_MATCH_ORDER_TTL_MS`, default 30 min).
    pub order_ttl: Duration,
    /// Pause between the expiry job's passes (`PAYBUS_MATCH_EXPIRY_INTERVAL_MS`, 30 s).
    pub expiry_interval: Duration,
    pub quote: QuoteConfig,
}

impl Default for MatchingConfig {
    fn default() -> Self {
        Self {
            fill_policy: FillPolicy::default(),
            retry: DEFAULT_RETRY,
            trade_checks: DEFAULT_TRADE_CHECK_POLICY,
            batch_size: DEFAULT_BATCH_SIZE,
            poll_interval: DEFAULT_POLL_INTERVAL,
            zombie_timeout: DEFAULT_ZOMBIE_TIMEOUT,
            order_ttl: DEFAULT_ORDER_TTL,
            expiry_interval: DEFAULT_EXPIRY_INTERVAL,
            quote: QuoteConfig::default(),
        }
    }
}

impl MatchingConfig {
    /// The zombie reaper's period: a fifth of the timeout (seed 000 §5), at least a second.
    pub fn reaper_interval(&self) -> Duration {
        (self.zombie_timeout / 5).max(Duration::from_secs(1))
    }

    pub fn from_env() -> Result<Self, ConfigError> {
        Self::read(&Vars::from_env())
    }

    pub fn from_vars(vars: HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::read(&Vars::new(vars))
    }

    /// The defaults, overridden by the variables that are set (an empty value counts as
    /// unset). A malformed value names the variable and the expected form.
    pub fn read(vars: &Vars) -> Result<Self, ConfigError> {
        let fill_policy = vars.parse(
            VAR_FILL_POLICY,
            FillPolicy::default(),
            "`fill-or-cancel` or `partial-retry`",
            |_| true,
        )?;
        let retry = DEFAULT_RETRY.with_max_attempts_from(vars, VAR_MAX_ATTEMPTS)?;
        let trade_checks =
            DEFAULT_TRADE_CHECK_POLICY.with_max_attempts_from(vars, VAR_TRADE_CHECKS)?;
        let batch_size = vars.parse(
            VAR_BATCH_SIZE,
            DEFAULT_BATCH_SIZE,
            "orders per batch, from 1 to 1000",
            |n: &u32| (1..=1000).contains(n),
        )?;
        let url = match vars.get(VAR_QUOTE_URL) {
            None => None,
            Some(raw) => Some(
                Url::parse(raw)
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
                    .ok_or_else(|| {
                        vars.error(
                            VAR_QUOTE_URL,
                            &paybus_config::redact::text(raw),
                            "an http(s) URL like https://torq.example.com",
                        )
                    })?,
            ),
        };
        let timeout = vars.millis(VAR_QUOTE_TIMEOUT_MS, DEFAULT_QUOTE_TIMEOUT)?;
        let zombie_timeout = vars.millis(VAR_ZOMBIE_TIMEOUT_MS, DEFAULT_ZOMBIE_TIMEOUT)?;
        // A live attempt must never look dead: it makes two quote calls, plus its transactions.
        if zombie_timeout <= timeout.saturating_mul(2).saturating_add(ATTEMPT_MARGIN) {
            return Err(vars.error(
                VAR_ZOMBIE_TIMEOUT_MS,
                &zombie_timeout.as_millis().to_string(),
                "longer than two quote calls (2 x PAYBUS_QUOTE_TIMEOUT_MS) plus 10 s",
            ));
        }
        Ok(Self {
            fill_policy,
            retry,
            trade_checks,
            batch_size,
            poll_interval: vars.millis(VAR_POLL_INTERVAL_MS, DEFAULT_POLL_INTERVAL)?,
            zombie_timeout,
            order_ttl: vars.millis(VAR_ORDER_TTL_MS, DEFAULT_ORDER_TTL)?,
            expiry_interval: vars.millis(VAR_EXPIRY_INTERVAL_MS, DEFAULT_EXPIRY_INTERVAL)?,
            quote: QuoteConfig {
                url,
                api_key: vars.secret(VAR_QUOTE_API_KEY, 16)?,
                timeout,
                connect_timeout: vars
                    .millis(VAR_QUOTE_CONNECT_TIMEOUT_MS, DEFAULT_QUOTE_CONNECT_TIMEOUT)?
                    .min(timeout),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use paybus_retry::RetryDecision;

    use super::*;

    fn vars(pairs: &[(Setting, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.name.to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn every_documented_default_is_the_default() {
        for (name, environment) in paybus_config::setting::documented_defaults(SETTINGS) {
            assert_eq!(
                MatchingConfig::from_vars(environment),
                Ok(MatchingConfig::default()),
                "{name}"
            );
        }
    }

    #[test]
    fn nothing_set_means_the_seeds_defaults() {
        let config = MatchingConfig::from_vars(HashMap::new()).unwrap();
        assert_eq!(config, MatchingConfig::default());
        assert_eq!(config.fill_policy, FillPolicy::FillOrCancel);
        assert_eq!(config.retry.max_attempts(), 5);
        assert_eq!(config.trade_checks.max_attempts(), 10);
        assert_eq!(config.batch_size, 10);
        assert_eq!(config.poll_interval, Duration::from_secs(1));
        assert_eq!(config.zombie_timeout, Duration::from_secs(300));
        assert_eq!(config.reaper_interval(), Duration::from_secs(60));
        assert_eq!(config.order_ttl, Duration::from_secs(1800));
        assert_eq!(config.quote.url, None);
        assert_eq!(config.quote.timeout, Duration::from_secs(3));
    }

    #[test]
    fn the_fifth_failure_gives_up_by_default() {
        let retry = MatchingConfig::default().retry;
        let pauses: Vec<u64> = (1..=4)
            .map(|n| match retry.after_failure(n) {
                RetryDecision::RetryAfter(after) => after.as_secs(),
                RetryDecision::GiveUp => 0,
            })
            .collect();
        assert_eq!(pauses, [5, 15, 30, 60]);
        assert_eq!(retry.after_failure(5), RetryDecision::GiveUp);
    }

    #[test]
    fn set_variables_override_and_empty_ones_do_not() {
        let config = MatchingConfig::from_vars(vars(&[
            (VAR_FILL_POLICY, "partial-retry"),
            (VAR_MAX_ATTEMPTS, "3"),
            (VAR_BATCH_SIZE, ""),
            (VAR_ZOMBIE_TIMEOUT_MS, "60000"),
            (VAR_QUOTE_URL, "https://torq.example.com/api"),
            (VAR_QUOTE_TIMEOUT_MS, "500"),
        ]))
        .unwrap();
        assert_eq!(config.fill_policy, FillPolicy::PartialRetry);
        assert_eq!(config.retry.max_attempts(), 3);
        assert_eq!(config.batch_size, 10);
        assert_eq!(config.reaper_interval(), Duration::from_secs(12));
        assert_eq!(
            config.quote.url.as_ref().map(Url::as_str),
            Some("https://torq.example.com/api")
        );
        // The connect timeout never outlasts the whole call.
        assert_eq!(config.quote.connect_timeout, Duration::from_millis(500));
    }

    #[test]
    fn a_malformed_value_names_the_variable() {
        for (variable, value) in [
            (VAR_FILL_POLICY, "fill-and-kill"),
            (VAR_MAX_ATTEMPTS, "0"),
            (VAR_BATCH_SIZE, "0"),
            (VAR_POLL_INTERVAL_MS, "1s"),
            (VAR_QUOTE_URL, "torq.example.com"),
            (VAR_QUOTE_URL, "ftp://torq.example.com"),
            (VAR_QUOTE_API_KEY, "short"),
        ] {
            let error = MatchingConfig::from_vars(vars(&[(variable, value)])).unwrap_err();
            assert_eq!(error.variable, variable.name, "{value}");
        }
    }

    #[test]
    fn the_zombie_timeout_must_outlast_a_live_attempt() {
        let error = MatchingConfig::from_vars(vars(&[
            (VAR_QUOTE_TIMEOUT_MS, "30000"),
            (VAR_ZOMBIE_TIMEOUT_MS, "60000"),
        ]))
        .unwrap_err();
        assert_eq!(error.variable, VAR_ZOMBIE_TIMEOUT_MS.name);
        assert!(error.to_string().contains("two quote calls"), "{error}");
        assert!(
            MatchingConfig::from_vars(vars(&[
                (VAR_QUOTE_TIMEOUT_MS, "20000"),
                (VAR_ZOMBIE_TIMEOUT_MS, "60000"),
            ]))
            .is_ok()
        );
    }

    #[test]
    fn a_quote_url_with_credentials_is_never_echoed() {
        let error = MatchingConfig::from_vars(vars(&[(VAR_QUOTE_URL, "mailto://user:s3cret@x")]))
            .unwrap_err();
        assert!(!error.to_string().contains("s3cret"), "{error}");
    }
}
