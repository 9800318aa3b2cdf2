//! Typed configuration, read once at start-up from `PAYBUS_*` environment variables.
//!
//! Every setting has a default that points at the local services started by
//! `infra/local/start.sh`, so a developer needs no configuration at all. A malformed value is
//! an error that names the variable and the expected form; an unset safety switch falls back
//! to the safe behaviour (principle 10).

use std::{collections::HashMap, fmt, str::FromStr, time::Duration};

use url::Url;

mod shards;

pub use crate::setting::Setting;
pub use shards::{Shards, VAR_SHARDS};

pub const DEFAULT_DATABASE_URL: &str = "mysql://root@127.0.0.1:13306/paybus";
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5682/%2f";

pub const VAR_DATABASE_URL: Setting = Setting {
    name: "PAYBUS_DATABASE_URL",
    default: "`mysql://root@127.0.0.1:13306/paybus`",
    about: "MySQL 8 / Aurora MySQL / MariaDB 10.11",
};
pub const VAR_DB_MAX_CONNECTIONS: Setting = Setting {
    name: "PAYBUS_DB_MAX_CONNECTIONS",
    default: "`32`",
    about: "pool size; size it for the consumers' prefetch (at least 1)",
};
pub const VAR_DB_ACQUIRE_TIMEOUT_MS: Setting = Setting {
    name: "PAYBUS_DB_ACQUIRE_TIMEOUT_MS",
    default: "`5000`",
    about: "wait for a pooled connection before failing (milliseconds, at least 1)",
};
pub const VAR_MIGRATION_LOCK_WAIT_SECONDS: Setting = Setting {
    name: "PAYBUS_MIGRATION_LOCK_WAIT_SECONDS",
    default: "`2`",
    about: "`paybus migrate` and the migrate Lambda: how long a migration's statement waits for \
            a table's metadata lock (`lock_wait_timeout`, set on the migrating session only; the \
            servers' own defaults are a day and a year). While an `ALTER` waits behind a \
            transaction open on its table, every later statement on that table waits behind the \
            `ALTER`, confirmations included: this bounds that stall. A migration of one \
            statement that gives up changed nothing and is tried again after 1, 2, 4, 8 and \
            15 s (the transaction in its way usually ends by then); the last failure names the \
            lock and the oldest open transaction \
            ([benchmarks](benchmarks.md)) (seconds, 1 to 86400)",
};
pub const VAR_AMQP_URL: Setting = Setting {
    name: "PAYBUS_AMQP_URL",
    default: "`amqp://guest:guest@127.0.0.1:5682/%2f`",
    about: "RabbitMQ / Amazon MQ; the path is the vhost. For a cluster, its nodes' URLs \
            separated by commas (`amqp://u:p@10.0.0.1:5672/%2f,amqp://u:p@10.0.0.2:5672/%2f`), \
            all on the same vhost: connections go to the first node that answers and move on to \
            the next when theirs drops (a comma inside a password is written `%2C`); an empty \
            entry or another vhost is refused. A connection asks for a 10 s heartbeat unless the \
            URL names one (`?heartbeat=N`), so a node gone silent is left after two; in Lambda \
            the broker's default stays (a frozen environment sends none). Logged with passwords \
            as `***`",
};
pub const VAR_PREFETCH: Setting = Setting {
    name: "PAYBUS_PREFETCH",
    default: "`64`",
    about: "deliveries in flight per consumer (bounds concurrency). A function that handles \
            deliveries in batches of 16 (confirm-withdrawal, confirm-deposit, grant-bonus) runs \
            prefetch / 16 transactions at once: raise it when the database has CPU to spare \
            (on two cores shared with the broker, 128 confirmed withdrawals 25 % faster than 64; \
            [benchmarks](benchmarks.md)), and the pool with it (1 to 65535)",
};
pub const VAR_LAMBDA_CONCURRENCY: Setting = Setting {
    name: "PAYBUS_LAMBDA_CONCURRENCY",
    default: "`64`",
    about: "Lambda only: messages of one Amazon MQ batch processed at once (a handler with \
            `MAX_BATCH` > 1 gets them in chunks of that size) (1 to 65535)",
};
pub const VAR_LOG_FORMAT: Setting = Setting {
    name: "PAYBUS_LOG_FORMAT",
    default: "`text`",
    about: "`text` or `json`, on stderr; `RUST_LOG` sets levels (default `info`); text is \
            coloured only on a terminal",
};

pub const VAR_STARTUP_WAIT_SECONDS: Setting = Setting {
    name: "PAYBUS_STARTUP_WAIT_SECONDS",
    default: "`60`",
    about: "long-running processes (`paybus run` and `serve`, a function's or the API's local \
            process) wait up to this long at start-up for a database or broker that is not up \
            yet (connection refused, timed out), trying again every 2 to 10 s with a warning \
            each time, then exit with the last reason; `0`: exit at once. A process that serves \
            the HTTP API listens meanwhile and answers 503 with `Retry-After` until both are up \
            and the topology is declared. A wrong password, database or vhost exits at once; \
            Lambda and one-shot commands never wait (seconds, 0 to 86400)",
};

/// What every process reads through [`Settings`], in the order the page lists them.
pub const SETTINGS: &[Setting] = &[
    VAR_DATABASE_URL,
    VAR_DB_MAX_CONNECTIONS,
    VAR_DB_ACQUIRE_TIMEOUT_MS,
    VAR_MIGRATION_LOCK_WAIT_SECONDS,
    VAR_AMQP_URL,
    VAR_PREFETCH,
    VAR_LAMBDA_CONCURRENCY,
    VAR_SHARDS,
    VAR_STARTUP_WAIT_SECONDS,
    VAR_LOG_FORMAT,
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid configuration: {variable}={value:?}: expected {expected}")]
pub struct ConfigError {
    /// The [`Setting::name`] of the variable.
    pub variable: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// How log lines are written: human-readable text locally, JSON in Lambda or on request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseSettings {
    /// `mysql://user:password@host:port/database`; the password is never logged.
    pub url: Url,
    /// Upper bound of the connection pool; size it for the consumers' prefetch.
    pub max_connections: u32,
    /// How long to wait for a free connection (or a first connect) before giving up.
    pub acquire_timeout: Duration,
    /// How long a migration's statement waits for a table's metadata lock
    /// ([`VAR_MIGRATION_LOCK_WAIT_SECONDS`]); whole seconds, as the server counts them.
    pub migration_lock_wait: Duration,
}

/// [`VAR_MIGRATION_LOCK_WAIT_SECONDS`]'s default. Why two seconds: a confirmation takes
/// milliseconds, so an online `ALTER` gets its lock at once unless a transaction stays open on
/// the table (a report, a stuck session); then every statement on the table queues behind the
/// waiting `ALTER` for as long as it waits. Two seconds of stall is what money traffic pays for
/// a deploy that meets such a transaction, and one retry later is what the deploy pays.
pub const DEFAULT_MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(2);

impl fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &crate::redact::url(&self.url))
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("migration_lock_wait", &self.migration_lock_wait)
            .finish()
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct BrokerSettings {
    /// `amqp://user:password@host:port/vhost` (vhost URL-encoded, `%2f` is `/`): the node
    /// tried first.
    pub url: Url,
    /// The cluster's other nodes, tried in turn when `url` does not answer or its connection
    /// drops (the link moves on to the next node); empty for a single broker. Same vhost as
    /// `url`.
    pub failover_urls: Vec<Url>,
    /// Deliveries in flight per consumer: bounds each function's concurrency.
    pub prefetch: u16,
    /// Messages of one Amazon MQ batch processed at once by a Lambda (its prefetch): the
    /// event source mapping hands one environment the whole batch.
    pub lambda_concurrency: u16,
    /// How many queues each function's messages are spread over (`PAYBUS_SHARDS`; the
    /// layout the topology declares, `bus::topology`).
    pub shards: Shards,
}

impl fmt::Debug for BrokerSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrokerSettings")
            .field("url", &crate::redact::url(&self.url))
            .field(
                "failover_urls",
                &self
                    .failover_urls
                    .iter()
                    .map(crate::redact::url)
                    .collect::<Vec<_>>(),
            )
            .field("prefetch", &self.prefetch)
            .field("lambda_concurrency", &self.lambda_concurrency)
            .field("shards", &self.shards.to_string())
            .finish()
    }
}

impl BrokerSettings {
    /// Every node, in the order they are tried: `url`, then `failover_urls`.
    pub fn urls(&self) -> impl Iterator<Item = &Url> {
        std::iter::once(&self.url).chain(&self.failover_urls)
    }

    /// Node `index` of [`Self::urls`] (wrapping around).
    pub fn node(&self, index: usize) -> &Url {
        let index = index % (1 + self.failover_urls.len());
        if index == 0 {
            &self.url
        } else {
            &self.failover_urls[index - 1]
        }
    }

    /// The same nodes on another vhost (a test's or a chaos run's own).
    pub fn set_vhost(&mut self, vhost: &str) {
        let path = format!("/{}", urlencoding_vhost(vhost));
        self.url.set_path(&path);
        for url in &mut self.failover_urls {
            url.set_path(&path);
        }
    }

    /// The `PAYBUS_AMQP_URL` value that reads back as these nodes (for a child process);
    /// it holds the passwords: never log it.
    pub fn to_env_value(&self) -> String {
        self.urls().map(Url::as_str).collect::<Vec<_>>().join(",")
    }

    /// The nodes with their passwords hidden, for log lines and errors.
    pub fn redacted(&self) -> String {
        self.urls()
            .map(crate::redact::url)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A vhost as a URL path segment (`/` is `%2f`).
fn urlencoding_vhost(vhost: &str) -> String {
    url::form_urlencoded::byte_serialize(vhost.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub database: DatabaseSettings,
    pub broker: BrokerSettings,
    pub log_format: LogFormat,
    /// How long a long-running process waits at start-up for a database or broker that is not
    /// up yet (`Services::connect_waiting`); zero: not at all.
    pub startup_wait: Duration,
    /// Every variable these settings were read from, secrets resolved: what the process reads
    /// the rest of its settings from (a function's, the auditor's, the API's).
    pub vars: Vars,
}

/// A secret value: usable, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Settings {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::read(&Vars::from_env())
    }

    /// Reads the given variables only (tests pass their own map instead of mutating the
    /// process environment).
    pub fn from_vars(vars: HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::read(&Vars(vars))
    }

    pub fn read(env: &Vars) -> Result<Self, ConfigError> {
        let (first_node, failover_urls) = broker_nodes(env)?;
        Ok(Self {
            database: DatabaseSettings {
                url: env.url(
                    VAR_DATABASE_URL,
                    DEFAULT_DATABASE_URL,
                    &["mysql", "mariadb"],
                    "a URL like mysql://user:password@host:3306/database",
                )?,
                max_connections: env.parse(
                    VAR_DB_MAX_CONNECTIONS,
                    32,
                    "a positive integer (connections)",
                    |n: &u32| *n > 0,
                )?,
                acquire_timeout: Duration::from_millis(env.parse(
                    VAR_DB_ACQUIRE_TIMEOUT_MS,
                    5_000,
                    "a positive integer (milliseconds)",
                    |n: &u64| *n > 0,
                )?),
                migration_lock_wait: Duration::from_secs(env.parse(
                    VAR_MIGRATION_LOCK_WAIT_SECONDS,
                    DEFAULT_MIGRATION_LOCK_WAIT.as_secs(),
                    "a whole number of seconds from 1 to 86400",
                    |seconds: &u64| (1..=86_400).contains(seconds),
                )?),
            },
            broker: BrokerSettings {
                url: first_node,
                failover_urls,
                prefetch: env.parse(
                    VAR_PREFETCH,
                    64,
                    "an integer from 1 to 65535 (deliveries in flight per consumer)",
                    |n: &u16| *n > 0,
                )?,
                lambda_concurrency: env.parse(
                    VAR_LAMBDA_CONCURRENCY,
                    64,
                    "an integer from 1 to 65535 (messages of a Lambda batch in flight)",
                    |n: &u16| *n > 0,
                )?,
                shards: match env.get(VAR_SHARDS) {
                    None => Shards::default(),
                    Some(raw) => Shards::parse(raw)
                        .map_err(|_| env.error(VAR_SHARDS, raw, Shards::EXPECTED))?,
                },
            },
            startup_wait: Duration::from_secs(env.parse(
                VAR_STARTUP_WAIT_SECONDS,
                60,
                "a whole number of seconds from 0 to 86400 (0: do not wait)",
                |seconds: &u64| *seconds <= 86_400,
            )?),
            log_format: match env.get(VAR_LOG_FORMAT) {
                None => LogFormat::Text,
                Some(v) if v.eq_ignore_ascii_case("text") => LogFormat::Text,
                Some(v) if v.eq_ignore_ascii_case("json") => LogFormat::Json,
                Some(v) => return Err(env.error(VAR_LOG_FORMAT, v, "`text` or `json`")),
            },
            vars: env.clone(),
        })
    }
}

/// `PAYBUS_AMQP_URL`: one broker URL, or the nodes of a cluster separated by commas (tried in
/// that order), all on the same vhost. One variable rather than a second list variable: a
/// deployment that keeps the URL in a secret (`PAYBUS_AMQP_URL_FROM`) moves to a cluster by
/// changing the secret's value only.
fn broker_nodes(env: &Vars) -> Result<(Url, Vec<Url>), ConfigError> {
    const VARIABLE: Setting = VAR_AMQP_URL;
    const EXPECTED: &str = "a URL like amqp://user:password@host:5672/%2f, or the nodes of a \
                            cluster as such URLs separated by commas, all on the same vhost";
    let raw = env.get(VARIABLE).unwrap_or(DEFAULT_AMQP_URL);
    let invalid = || env.error(VARIABLE, &redact_list(raw), EXPECTED);
    let mut nodes = Vec::new();
    for part in raw.split(',') {
        // An empty entry ("a,,b", a trailing comma) is a typo, not a node to skip: it reads
        // as unset, whose default "" is no URL.
        let one = Vars::new(HashMap::from([(VARIABLE.name.to_owned(), part.to_owned())]));
        let url = one
            .url(VARIABLE, "", &["amqp", "amqps"], EXPECTED)
            .map_err(|_| invalid())?;
        nodes.push(url);
    }
    let first = nodes.remove(0);
    // Another vhost on another node would be another system: its own queues and messages.
    if nodes.iter().any(|url| url.path() != first.path()) {
        return Err(invalid());
    }
    Ok((first, nodes))
}

fn redact_list(raw: &str) -> String {
    raw.split(',')
        .map(|part| crate::redact::text(part.trim()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Environment variables as settings are read from them: the one parser every crate's own
/// settings use (so every malformed value is a [`ConfigError`] naming the variable and the
/// expected form, and an empty value counts as unset everywhere).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Vars(HashMap<String, String>);

impl fmt::Debug for Vars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Values may be secrets: names only.
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl Vars {
    /// The process environment as it is. A function process reads its settings from
    /// [`Settings::vars`] instead, where [`crate::secrets::resolve`] put the values of its
    /// `_FROM` references.
    pub fn from_env() -> Self {
        Vars(std::env::vars().collect())
    }

    pub fn new(vars: HashMap<String, String>) -> Self {
        Vars(vars)
    }

    /// An empty value counts as unset: `FOO= cmd` is how people "unset" in shells and
    /// deployment templates.
    pub fn get(&self, setting: Setting) -> Option<&str> {
        self.0
            .get(setting.name)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    pub fn error(&self, setting: Setting, value: &str, expected: &'static str) -> ConfigError {
        ConfigError {
            variable: setting.name,
            value: value.to_owned(),
            expected,
        }
    }

    /// `default` when unset; else the parsed value if `valid` accepts it.
    pub fn parse<T: FromStr>(
        &self,
        variable: Setting,
        default: T,
        expected: &'static str,
        valid: impl Fn(&T) -> bool,
    ) -> Result<T, ConfigError> {
        match self.get(variable) {
            None => Ok(default),
            Some(raw) => raw
                .parse::<T>()
                .ok()
                .filter(|v| valid(v))
                .ok_or_else(|| self.error(variable, raw, expected)),
        }
    }

    /// A positive duration in milliseconds (`*_MS` settings); `default` when unset.
    pub fn millis(&self, variable: Setting, default: Duration) -> Result<Duration, ConfigError> {
        self.parse(
            variable,
            u64::try_from(default.as_millis()).unwrap_or(u64::MAX),
            "a positive integer (milliseconds)",
            |ms: &u64| *ms > 0,
        )
        .map(Duration::from_millis)
    }

    pub fn url(
        &self,
        variable: Setting,
        default: &str,
        schemes: &[&str],
        expected: &'static str,
    ) -> Result<Url, ConfigError> {
        let raw = self.get(variable).unwrap_or(default);
        match Url::parse(raw) {
            Ok(url) if schemes.contains(&url.scheme()) && url.host().is_some() => Ok(url),
            // Never echo a credential back into a log line, even a malformed one.
            _ => Err(self.error(variable, &crate::redact::text(raw), expected)),
        }
    }

    /// A secret is optional, but a short one is a mistake worth stopping for.
    pub fn secret(&self, variable: Setting, min_len: usize) -> Result<Option<Secret>, ConfigError> {
        match self.get(variable) {
            None => Ok(None),
            Some(v) if v.len() >= min_len => Ok(Some(Secret::new(v))),
            Some(_) => Err(ConfigError {
                variable: variable.name,
                value: "***".to_owned(),
                expected: if min_len >= 32 {
                    "a secret of at least 32 characters"
                } else {
                    "a secret of at least 16 characters"
                },
            }),
        }
    }

    /// A safety switch is on only when it says so explicitly.
    pub fn switch(&self, variable: Setting) -> Result<bool, ConfigError> {
        match self.get(variable).map(str::to_ascii_lowercase).as_deref() {
            None | Some("false" | "0" | "no" | "off") => Ok(false),
            Some("true" | "1" | "yes" | "on") => Ok(true),
            Some(other) => Err(self.error(variable, other, "`true` or `false`")),
        }
    }
}

/// Whether this process is a Lambda execution environment (Lambda sets the variable).
pub fn in_lambda() -> bool {
    std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOME_SWITCH: Setting = Setting {
        name: "PAYBUS_SOME_SWITCH",
        default: "`false`",
        about: "a switch",
    };
    const SOME_MS: Setting = Setting {
        name: "PAYBUS_SOME_MS",
        default: "`3000`",
        about: "a pause",
    };
    const SOME_TOKEN: Setting = Setting {
        name: "PAYBUS_SOME_TOKEN",
        default: "unset",
        about: "a secret",
    };

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_point_at_the_local_services() {
        let s = Settings::from_vars(HashMap::new()).expect("defaults are valid");
        assert_eq!(s.database.url.as_str(), DEFAULT_DATABASE_URL);
        assert_eq!(s.database.url.port(), Some(13306));
        assert_eq!(s.broker.url.port(), Some(5682));
        assert_eq!(s.broker.prefetch, 64);
        assert_eq!(s.broker.lambda_concurrency, 64);
        assert_eq!(s.log_format, LogFormat::Text);
    }

    #[test]
    fn every_documented_default_is_the_default() {
        let defaults = Settings::from_vars(HashMap::new()).unwrap();
        for (name, environment) in crate::setting::documented_defaults(SETTINGS) {
            // The same settings, read from another source.
            let read = Settings::from_vars(environment).map(|settings| Settings {
                vars: defaults.vars.clone(),
                ..settings
            });
            assert_eq!(read.as_ref(), Ok(&defaults), "{name}");
        }
    }

    #[test]
    fn an_unset_or_empty_switch_is_off() {
        let switch = |pairs: &[(&str, &str)]| Vars::new(vars(pairs)).switch(SOME_SWITCH);
        assert_eq!(switch(&[]), Ok(false));
        assert_eq!(switch(&[("PAYBUS_SOME_SWITCH", "")]), Ok(false));
        assert_eq!(switch(&[("PAYBUS_SOME_SWITCH", "TRUE")]), Ok(true));
    }

    #[test]
    fn a_malformed_switch_is_an_error_naming_the_variable() {
        let err = Vars::new(vars(&[("PAYBUS_SOME_SWITCH", "maybe")]))
            .switch(SOME_SWITCH)
            .unwrap_err();
        assert_eq!(err.variable, "PAYBUS_SOME_SWITCH");
        assert!(err.to_string().contains("`true` or `false`"), "{err}");
    }

    #[test]
    fn milliseconds_are_positive_and_default_when_unset() {
        let read =
            |pairs: &[(&str, &str)]| Vars::new(vars(pairs)).millis(SOME_MS, Duration::from_secs(3));
        assert_eq!(read(&[]), Ok(Duration::from_secs(3)));
        assert_eq!(
            read(&[("PAYBUS_SOME_MS", "250")]),
            Ok(Duration::from_millis(250))
        );
        for bad in ["0", "1s", "-5"] {
            let error = read(&[("PAYBUS_SOME_MS", bad)]).unwrap_err();
            assert_eq!(error.variable, "PAYBUS_SOME_MS");
            assert!(error.to_string().contains("milliseconds"), "{error}");
        }
    }

    #[test]
    fn the_startup_wait_is_a_minute_by_default_zero_or_at_most_a_day() {
        let read = |pairs: &[(&str, &str)]| Settings::from_vars(vars(pairs));
        assert_eq!(read(&[]).unwrap().startup_wait, Duration::from_secs(60));
        let none = read(&[("PAYBUS_STARTUP_WAIT_SECONDS", "0")]).unwrap();
        assert_eq!(none.startup_wait, Duration::ZERO);
        // An Instant plus a larger one could overflow, and nobody means a wait of years.
        for bad in ["86401", "-1", "1m"] {
            let error = read(&[("PAYBUS_STARTUP_WAIT_SECONDS", bad)]).unwrap_err();
            assert_eq!(error.variable, "PAYBUS_STARTUP_WAIT_SECONDS");
            assert!(error.to_string().contains("0 to 86400"), "{error}");
        }
    }

    #[test]
    fn a_migration_waits_two_seconds_for_a_lock_by_default_and_at_least_one() {
        let read = |pairs: &[(&str, &str)]| Settings::from_vars(vars(pairs));
        assert_eq!(
            read(&[]).unwrap().database.migration_lock_wait,
            Duration::from_secs(2)
        );
        let set = read(&[("PAYBUS_MIGRATION_LOCK_WAIT_SECONDS", "30")]).unwrap();
        assert_eq!(set.database.migration_lock_wait, Duration::from_secs(30));
        // The server counts whole seconds, and 0 is no wait on MariaDB but refused by MySQL 8.
        for bad in ["0", "86401", "1.5", "2s"] {
            let error = read(&[("PAYBUS_MIGRATION_LOCK_WAIT_SECONDS", bad)]).unwrap_err();
            assert_eq!(
                error.variable, "PAYBUS_MIGRATION_LOCK_WAIT_SECONDS",
                "{bad}"
            );
            assert!(error.to_string().contains("1 to 86400"), "{error}");
        }
    }

    #[test]
    fn malformed_number_names_variable_and_form() {
        let err = Settings::from_vars(vars(&[("PAYBUS_PREFETCH", "0")])).unwrap_err();
        assert_eq!(err.variable, "PAYBUS_PREFETCH");
        assert!(err.to_string().contains("1 to 65535"), "{err}");
    }

    #[test]
    fn wrong_scheme_is_rejected_without_echoing_the_password() {
        let err = Settings::from_vars(vars(&[(
            "PAYBUS_DATABASE_URL",
            "postgres://app:s3cret@db:5432/x",
        )]))
        .unwrap_err();
        assert_eq!(err.variable, "PAYBUS_DATABASE_URL");
        assert!(!err.to_string().contains("s3cret"), "{err}");
        assert!(err.to_string().contains("mysql://"), "{err}");
    }

    #[test]
    fn secrets_are_optional_long_and_never_printed() {
        let secret = |pairs: &[(&str, &str)]| Vars::new(vars(pairs)).secret(SOME_TOKEN, 16);
        assert_eq!(secret(&[]), Ok(None));
        let short = secret(&[("PAYBUS_SOME_TOKEN", "abc")]).unwrap_err();
        assert_eq!(short.variable, "PAYBUS_SOME_TOKEN");
        assert!(!short.to_string().contains("abc"));
        let long = secret(&[("PAYBUS_SOME_TOKEN", "0123456789abcdef-tok")]).unwrap();
        assert_eq!(
            long.as_ref().map(Secret::expose),
            Some("0123456789abcdef-tok")
        );
        assert!(!format!("{long:?}").contains("0123456789abcdef-tok"));
    }

    #[test]
    fn a_comma_separated_amqp_url_lists_the_nodes_of_a_cluster_in_order() {
        let list = "amqp://u:pw@127.0.0.1:5701/%2f, amqp://u:pw@127.0.0.1:5702/%2f,amqp://u:pw@127.0.0.1:5703/%2f";
        let s = Settings::from_vars(vars(&[("PAYBUS_AMQP_URL", list)])).unwrap();

        let ports: Vec<_> = s.broker.urls().map(|u| u.port().unwrap()).collect();
        assert_eq!(ports, [5701, 5702, 5703]);
        assert_eq!(s.broker.node(4).port(), Some(5702));
        // What a child process is given reads back as the same nodes.
        let again = Settings::from_vars(vars(&[("PAYBUS_AMQP_URL", &s.broker.to_env_value())]));
        assert_eq!(again.unwrap().broker, s.broker);
        assert!(!s.broker.redacted().contains("pw"));
        assert!(!format!("{:?}", s.broker).contains("pw"));
    }

    #[test]
    fn a_single_amqp_url_has_no_failover_nodes() {
        let s = Settings::from_vars(HashMap::new()).unwrap();
        assert!(s.broker.failover_urls.is_empty());
        assert_eq!(s.broker.to_env_value(), DEFAULT_AMQP_URL);
    }

    #[test]
    fn a_bad_node_list_is_an_error_naming_the_variable_without_passwords() {
        for bad in [
            "amqp://u:s3cret@a:5672/%2f,",
            "amqp://u:s3cret@a:5672/%2f,,amqp://u:s3cret@b:5672/%2f",
            "amqp://u:s3cret@a:5672/%2f,http://u:s3cret@b/%2f",
            "amqp://u:s3cret@a:5672/%2f,amqp://u:s3cret@b:5672/other",
        ] {
            let err = Settings::from_vars(vars(&[("PAYBUS_AMQP_URL", bad)])).unwrap_err();
            assert_eq!(err.variable, "PAYBUS_AMQP_URL", "{bad}");
            assert!(!err.to_string().contains("s3cret"), "{err}");
            assert!(err.to_string().contains("separated by commas"), "{err}");
        }
    }

    #[test]
    fn shard_counts_are_read_and_a_malformed_list_names_the_variable() {
        let read = |value: &str| {
            Settings::from_vars(HashMap::from([(
                "PAYBUS_SHARDS".to_owned(),
                value.to_owned(),
            )]))
        };
        let shards = read("confirm-withdrawal=4, grant-bonus=1")
            .unwrap()
            .broker
            .shards;
        assert_eq!(shards.of("confirm-withdrawal"), 4);
        assert_eq!(shards.of("grant-bonus"), 1);
        assert_eq!(shards.of("cancel-orders"), 1);
        assert_eq!(shards.to_string(), "confirm-withdrawal=4");
        for bad in ["confirm-withdrawal", "a=0", "a=65", "a=x", "a=2,a=3", "=2"] {
            let error = read(bad).unwrap_err();
            assert_eq!(error.variable, "PAYBUS_SHARDS", "{bad}");
        }
        assert!(read("").unwrap().broker.shards.is_empty());
    }

    #[test]
    fn moving_the_nodes_to_another_vhost_moves_every_node() {
        let list = "amqp://u:pw@a:5672/%2f,amqp://u:pw@b:5672/%2f";
        let mut s = Settings::from_vars(vars(&[("PAYBUS_AMQP_URL", list)])).unwrap();
        s.broker.set_vhost("paybus_test/1");
        let paths: Vec<_> = s.broker.urls().map(|u| u.path().to_owned()).collect();
        assert_eq!(paths, ["/paybus_test%2F1", "/paybus_test%2F1"]);
    }

    #[test]
    fn debug_output_hides_credentials() {
        let s = Settings::from_vars(vars(&[(
            "PAYBUS_AMQP_URL",
            "amqp://user:hunter2@mq:5672/%2f",
        )]))
        .unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
