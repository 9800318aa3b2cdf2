//! The API's own settings, read once at start-up (the platform's `Settings` carry only what
//! every process shares: database, broker, logs).

use std::{net::SocketAddr, time::Duration};

use paybus_bonuses::BonusRules;
use paybus_config::{ConfigError, Secret, Setting, Vars, sealed};
use paybus_p2p::MatchingConfig;

use crate::server::Limits;

pub const VAR_HTTP_ADDR: Setting = Setting {
    name: "PAYBUS_HTTP_ADDR",
    default: "`127.0.0.1:8080`",
    about: "where the HTTP API listens",
};
pub const VAR_HEADER_TIMEOUT_MS: Setting = Setting {
    name: "PAYBUS_HTTP_HEADER_TIMEOUT_MS",
    default: "`10000`",
    about: "request headers must arrive within it; also closes an idle keep-alive connection (milliseconds, at least 1)",
};
pub const VAR_BODY_TIMEOUT_MS: Setting = Setting {
    name: "PAYBUS_HTTP_BODY_TIMEOUT_MS",
    default: "`10000`",
    about: "a request body must arrive within it (else 408) (milliseconds, at least 1)",
};
pub const VAR_MAX_CONNECTIONS: Setting = Setting {
    name: "PAYBUS_HTTP_MAX_CONNECTIONS",
    default: "`256`",
    about: "connections served at once; more wait in the listen backlog (at least 1)",
};
pub const VAR_CHAIN_MONITOR_SECRET: Setting = Setting {
    name: "PAYBUS_CHAIN_MONITOR_SECRET",
    default: "unset",
    about: "HMAC secret of the chain-monitor webhooks (≥ 16 chars); unset: intake answers 503 \
            (`infra/run.sh` generates a development one)",
};
pub const VAR_ADMIN_JWT_SECRET: Setting = Setting {
    name: "PAYBUS_ADMIN_JWT_SECRET",
    default: "unset",
    about: "key of break-glass tokens (HS256, ≥ 32 chars), taken only while \
            `PAYBUS_BREAK_GLASS` is on (`infra/run.sh` generates a development one). Tokens: \
            `paybus token issue --role OPS\\|ADMIN --ttl 8h`",
};
pub const VAR_BREAK_GLASS: Setting = Setting {
    name: "PAYBUS_BREAK_GLASS",
    default: "`false`",
    about: "`true`: the admin API also takes tokens signed with `PAYBUS_ADMIN_JWT_SECRET` \
            (`paybus token issue`), for when no identity provider can be used (local mode, a \
            first deployment, a provider outage). Whoever holds the secret can mint any name, \
            so every such action is marked break-glass (the ops log, \
            `paybus_break_glass_requests_total`, the overview) and none can request or approve \
            a four-eyes action. `infra/run.sh`'s local mode sets it",
};
pub const VAR_PAYMENTS_SECRET: Setting = Setting {
    name: "PAYBUS_PAYMENTS_SECRET",
    default: "unset",
    about: "HMAC secret the payment service signs gateway completions with (≥ 16 chars); \
            unset: `/v1/payments/*` answer 503",
};
pub const VAR_OIDC_CONSOLE_CLIENT_ID: Setting = Setting {
    name: "PAYBUS_OIDC_CONSOLE_CLIENT_ID",
    default: "`paybus-console`",
    about: "the provider's confidential client the web console signs people in with (the \
            authorization code flow with PKCE); its redirect URI is \
            `{PAYBUS_CONSOLE_URL}/console/callback`, its post-logout redirect URI \
            `{PAYBUS_CONSOLE_URL}/console/login`",
};
pub const VAR_OIDC_CONSOLE_CLIENT_SECRET: Setting = Setting {
    name: "PAYBUS_OIDC_CONSOLE_CLIENT_SECRET",
    default: "unset",
    about: "that client's secret (≥ 16 chars; sent to the token endpoint with HTTP Basic); \
            unset: the console offers no provider sign-in",
};
pub const VAR_CONSOLE_URL: Setting = Setting {
    name: "PAYBUS_CONSOLE_URL",
    default: "`http://` + `PAYBUS_HTTP_ADDR`",
    about: "the console's public base URL as browsers reach it (scheme, host, port; no path), \
            e.g. `https://ops.example.com`; `https` makes the session cookie `Secure`",
};
pub const VAR_CONSOLE_SESSION_HOURS: Setting = Setting {
    name: "PAYBUS_CONSOLE_SESSION_HOURS",
    default: "`12`",
    about: "a console session ends this long after sign-in, however active (hours, 1 to 168)",
};
pub const VAR_CONSOLE_IDLE_MINUTES: Setting = Setting {
    name: "PAYBUS_CONSOLE_IDLE_MINUTES",
    default: "`30`",
    about: "a console session ends after this long without a request (minutes, 1 to 1440)",
};
pub const VAR_ASYNC_MATCHING_ENABLED: Setting = Setting {
    name: "PAYBUS_ASYNC_MATCHING_ENABLED",
    default: "`false`",
    about: "safety switch (seed 000 §0), read by the API: only an explicit `true` queues new \
            P2P deposit orders for match-deposit; off matches them inside the create request",
};

/// What [`ApiConfig::read`] reads itself (it also reads p2p's and bonuses' settings), in the
/// order the page lists them.
pub const SETTINGS: &[Setting] = &[
    VAR_HTTP_ADDR,
    VAR_HEADER_TIMEOUT_MS,
    VAR_BODY_TIMEOUT_MS,
    VAR_MAX_CONNECTIONS,
    VAR_CHAIN_MONITOR_SECRET,
    VAR_ADMIN_JWT_SECRET,
    VAR_BREAK_GLASS,
    VAR_PAYMENTS_SECRET,
    VAR_ASYNC_MATCHING_ENABLED,
    VAR_OIDC_CONSOLE_CLIENT_ID,
    VAR_OIDC_CONSOLE_CLIENT_SECRET,
    VAR_CONSOLE_URL,
    VAR_CONSOLE_SESSION_HOURS,
    VAR_CONSOLE_IDLE_MINUTES,
];

/// How the web console signs people in and how long their sessions last
/// (`PAYBUS_OIDC_CONSOLE_*`, `PAYBUS_CONSOLE_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleConfig {
    /// The provider's client the console signs in with.
    pub client_id: String,
    /// Its secret. None: no provider sign-in (break-glass's token form only, where on).
    pub client_secret: Option<Secret>,
    /// Where browsers reach the console, without a trailing `/` (`https://ops.example.com`):
    /// the redirect URIs are made from it, and `https` makes the cookies `Secure`.
    pub url: String,
    /// A session ends this long after sign-in.
    pub session_lifetime: Duration,
    /// A session ends after this long without a request.
    pub idle_timeout: Duration,
}

impl ConsoleConfig {
    const DEFAULT_SESSION_HOURS: u64 = 12;
    const DEFAULT_IDLE_MINUTES: u64 = 30;

    /// The defaults for a console served at `http_addr`.
    pub fn at(http_addr: SocketAddr) -> Self {
        Self {
            client_id: "paybus-console".to_owned(),
            client_secret: None,
            url: console_url_of(http_addr),
            session_lifetime: Duration::from_secs(Self::DEFAULT_SESSION_HOURS * 3_600),
            idle_timeout: Duration::from_secs(Self::DEFAULT_IDLE_MINUTES * 60),
        }
    }

    fn read(env: &Vars, http_addr: SocketAddr) -> Result<Self, ConfigError> {
        let url = match env.get(VAR_CONSOLE_URL) {
            None => console_url_of(http_addr),
            Some(raw) => url::Url::parse(raw)
                .ok()
                .filter(|url| {
                    matches!(url.scheme(), "http" | "https")
                        && url.host().is_some()
                        && url.path() == "/"
                        && url.query().is_none()
                        && url.fragment().is_none()
                        && url.username().is_empty()
                        && url.password().is_none()
                })
                .map(|url| url.as_str().trim_end_matches('/').to_owned())
                .ok_or_else(|| {
                    env.error(
                        VAR_CONSOLE_URL,
                        &paybus_config::redact::text(raw),
                        "an http(s) URL with a host and no path, like https://ops.example.com",
                    )
                })?,
        };
        let hours = env.parse(
            VAR_CONSOLE_SESSION_HOURS,
            Self::DEFAULT_SESSION_HOURS,
            "hours, from 1 to 168",
            |h: &u64| (1..=168).contains(h),
        )?;
        let minutes = env.parse(
            VAR_CONSOLE_IDLE_MINUTES,
            Self::DEFAULT_IDLE_MINUTES,
            "minutes, from 1 to 1440",
            |m: &u64| (1..=1_440).contains(m),
        )?;
        Ok(Self {
            client_id: env
                .get(VAR_OIDC_CONSOLE_CLIENT_ID)
                .unwrap_or("paybus-console")
                .to_owned(),
            client_secret: env.secret(VAR_OIDC_CONSOLE_CLIENT_SECRET, 16)?,
            url,
            session_lifetime: Duration::from_secs(hours * 3_600),
            idle_timeout: Duration::from_secs(minutes * 60),
        })
    }

    /// The cookies are `Secure` when browsers reach the console over HTTPS.
    pub fn secure(&self) -> bool {
        self.url.starts_with("https://")
    }

    /// `{url}{path}`, e.g. the redirect URI `{url}/console/callback`.
    pub fn link(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }
}

/// `http://` + the address the API listens on: right on a developer's machine, where the
/// browser reaches the process directly.
fn console_url_of(http_addr: SocketAddr) -> String {
    format!("http://{http_addr}")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// Where the API listens (`PAYBUS_HTTP_ADDR`, default 127.0.0.1:8080).
    pub http_addr: SocketAddr,
    /// Shared secret the chain monitor signs its webhooks with. Unset: the intake endpoints
    /// refuse everything (503) rather than accept unsigned confirmations.
    pub chain_monitor_secret: Option<Secret>,
    /// The key admin role tokens are signed with (HS256, at least 32 bytes). Unset: the admin
    /// API is closed.
    pub admin_jwt_secret: Option<Secret>,
    /// Whether tokens signed with `admin_jwt_secret` are accepted (`PAYBUS_BREAK_GLASS`).
    pub break_glass: bool,
    /// The identity provider people sign in with (`PAYBUS_OIDC_*`). None: only break-glass.
    pub oidc: Option<crate::oidc::OidcConfig>,
    /// Shared secret the payment service signs gateway completions with (webhooks and verify
    /// calls, W3). Unset: the payment routes refuse everything (503).
    pub payments_secret: Option<Secret>,
    /// W3's configured bonus rules (the first-charge bonus percent).
    pub bonus_rules: BonusRules,
    /// Seed 000 §0: W1's queued matching is off unless explicitly switched on; a missing value
    /// must never turn the worker path on by accident.
    pub async_matching_enabled: bool,
    /// W1's matching settings (`PAYBUS_MATCH_*`, `PAYBUS_QUOTE_*`): the inline path matches with
    /// the same policy and quote service as match-deposit.
    pub matching: MatchingConfig,
    /// Header-read (and keep-alive idle) timeout, body-read timeout, connection cap.
    pub limits: Limits,
    /// Which ops actions need a second ADMIN, and how long a request lasts
    /// (`PAYBUS_FOUR_EYES`, `PAYBUS_OPERATION_TTL_SECONDS`).
    pub four_eyes: paybus_ops::approvals::FourEyes,
    /// How the web console signs people in and how long their sessions last.
    pub console: ConsoleConfig,
    /// The partner API's settings (`PAYBUS_PARTNER_*`).
    pub partner_api: crate::partner_api::PartnerApiConfig,
    /// Seals partner webhook secrets (`PAYBUS_SECRETS_KEY`). None: partner create answers 503.
    pub sealer: Option<paybus_config::sealed::Sealer>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        let http_addr = SocketAddr::from(([127, 0, 0, 1], 8080));
        Self {
            http_addr,
            chain_monitor_secret: None,
            admin_jwt_secret: None,
            break_glass: false,
            oidc: None,
            payments_secret: None,
            bonus_rules: BonusRules::default(),
            async_matching_enabled: false,
            matching: MatchingConfig::default(),
            limits: Limits::default(),
            four_eyes: paybus_ops::approvals::FourEyes::default(),
            console: ConsoleConfig::at(http_addr),
            partner_api: crate::partner_api::PartnerApiConfig::default(),
            sealer: None,
        }
    }
}

impl ApiConfig {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::read(&Vars::from_env())
    }

    pub fn read(env: &Vars) -> Result<Self, ConfigError> {
        let defaults = Limits::default();
        let http_addr = env.parse(
            VAR_HTTP_ADDR,
            Self::default().http_addr,
            "a socket address like 127.0.0.1:8080",
            |_| true,
        )?;
        Ok(Self {
            http_addr,
            chain_monitor_secret: env.secret(VAR_CHAIN_MONITOR_SECRET, 16)?,
            admin_jwt_secret: env.secret(VAR_ADMIN_JWT_SECRET, 32)?,
            break_glass: env.switch(VAR_BREAK_GLASS)?,
            oidc: crate::oidc::OidcConfig::read(env)?,
            payments_secret: env.secret(VAR_PAYMENTS_SECRET, 16)?,
            bonus_rules: BonusRules::read(env)?,
            async_matching_enabled: env.switch(VAR_ASYNC_MATCHING_ENABLED)?,
            matching: MatchingConfig::read(env)?,
            limits: Limits {
                header_timeout: env.millis(VAR_HEADER_TIMEOUT_MS, defaults.header_timeout)?,
                body_timeout: env.millis(VAR_BODY_TIMEOUT_MS, defaults.body_timeout)?,
                max_connections: env.parse(
                    VAR_MAX_CONNECTIONS,
                    defaults.max_connections,
                    "a positive integer (connections)",
                    |n: &usize| *n > 0,
                )?,
            },
            four_eyes: paybus_ops::approvals::FourEyes::read(env)?,
            console: ConsoleConfig::read(env, http_addr)?,
            partner_api: crate::partner_api::PartnerApiConfig::read(env)?,
            sealer: paybus_config::sealed::Sealer::read(
                env.secret(sealed::VAR_SECRETS_KEY, sealed::KEY_MIN_CHARS)?,
                env,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;

    use super::*;

    fn read(pairs: &[(Setting, &str)]) -> Result<ApiConfig, ConfigError> {
        ApiConfig::read(&Vars::new(
            pairs
                .iter()
                .map(|(k, v)| (k.name.to_owned(), v.to_string()))
                .collect::<HashMap<_, _>>(),
        ))
    }

    #[test]
    fn every_documented_default_is_the_default() {
        for (name, environment) in paybus_config::setting::documented_defaults(SETTINGS) {
            assert_eq!(
                ApiConfig::read(&Vars::new(environment)),
                Ok(ApiConfig::default()),
                "{name}"
            );
        }
    }

    #[test]
    fn unset_or_empty_safety_switch_is_off() {
        assert!(!read(&[]).unwrap().async_matching_enabled);
        assert!(
            !read(&[(VAR_ASYNC_MATCHING_ENABLED, "")])
                .unwrap()
                .async_matching_enabled
        );
        assert!(
            read(&[(VAR_ASYNC_MATCHING_ENABLED, "TRUE")])
                .unwrap()
                .async_matching_enabled
        );
    }

    #[test]
    fn malformed_switch_is_an_error_naming_the_variable() {
        let err = read(&[(VAR_ASYNC_MATCHING_ENABLED, "maybe")]).unwrap_err();
        assert_eq!(err.variable, VAR_ASYNC_MATCHING_ENABLED.name);
        assert!(err.to_string().contains("`true` or `false`"), "{err}");
    }

    #[test]
    fn secrets_are_optional_long_and_never_printed() {
        let config = read(&[]).unwrap();
        assert!(config.chain_monitor_secret.is_none() && config.admin_jwt_secret.is_none());
        let short = read(&[(VAR_ADMIN_JWT_SECRET, "abc")]).unwrap_err();
        assert_eq!(short.variable, VAR_ADMIN_JWT_SECRET.name);
        assert!(!short.to_string().contains("abc"));
        let secret = "0123456789abcdef0123456789abcdef-key";
        let config = read(&[(VAR_ADMIN_JWT_SECRET, secret)]).unwrap();
        assert_eq!(
            config.admin_jwt_secret.as_ref().map(Secret::expose),
            Some(secret)
        );
        assert!(!format!("{config:?}").contains(secret));
    }

    #[test]
    fn a_bad_address_names_the_variable() {
        let err = read(&[(VAR_HTTP_ADDR, "localhost")]).unwrap_err();
        assert_eq!(err.variable, VAR_HTTP_ADDR.name);
        assert_eq!(
            read(&[(VAR_HTTP_ADDR, "0.0.0.0:9000")]).unwrap().http_addr,
            SocketAddr::from(([0, 0, 0, 0], 9000))
        );
    }
}

#[cfg(test)]
mod console_tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;

    use super::*;

    fn read(pairs: &[(Setting, &str)]) -> Result<ApiConfig, ConfigError> {
        ApiConfig::read(&Vars::new(
            pairs
                .iter()
                .map(|(k, v)| (k.name.to_owned(), v.to_string()))
                .collect::<HashMap<_, _>>(),
        ))
    }

    #[test]
    fn the_console_url_defaults_to_the_listening_address_and_https_makes_cookies_secure() {
        let config = read(&[(VAR_HTTP_ADDR, "127.0.0.1:9000")]).unwrap().console;
        assert_eq!(config.url, "http://127.0.0.1:9000");
        assert!(!config.secure());
        let config = read(&[(VAR_CONSOLE_URL, "https://ops.example.com/")])
            .unwrap()
            .console;
        assert_eq!(
            config.link("/console/callback"),
            "https://ops.example.com/console/callback"
        );
        assert!(config.secure());
        for bad in [
            "ops.example.com",
            "ftp://ops.example.com",
            "https://ops.example.com/paybus",
            "https://user:pw@ops.example.com",
        ] {
            let error = read(&[(VAR_CONSOLE_URL, bad)]).unwrap_err();
            assert_eq!(error.variable, VAR_CONSOLE_URL.name, "{bad}");
            assert!(!error.to_string().contains("pw"), "{error}");
        }
    }

    #[test]
    fn session_lengths_are_bounded_and_the_client_secret_is_a_secret() {
        let config = read(&[
            (VAR_CONSOLE_SESSION_HOURS, "8"),
            (VAR_CONSOLE_IDLE_MINUTES, "15"),
            (VAR_OIDC_CONSOLE_CLIENT_SECRET, "a-console-client-secret"),
        ])
        .unwrap()
        .console;
        assert_eq!(config.session_lifetime, Duration::from_secs(8 * 3_600));
        assert_eq!(config.idle_timeout, Duration::from_secs(15 * 60));
        assert!(!format!("{config:?}").contains("a-console-client-secret"));
        for (setting, value) in [
            (VAR_CONSOLE_SESSION_HOURS, "0"),
            (VAR_CONSOLE_SESSION_HOURS, "169"),
            (VAR_CONSOLE_IDLE_MINUTES, "0"),
            (VAR_CONSOLE_IDLE_MINUTES, "1441"),
            (VAR_OIDC_CONSOLE_CLIENT_SECRET, "short"),
        ] {
            assert_eq!(
                read(&[(setting, value)]).unwrap_err().variable,
                setting.name,
                "{value}"
            );
        }
    }
}

#[cfg(test)]
mod limit_tests {
    #![allow(clippy::unwrap_used)]

    use std::{collections::HashMap, time::Duration};

    use super::*;

    #[test]
    fn limits_default_and_override() {
        let read = |pairs: &[(Setting, &str)]| {
            ApiConfig::read(&Vars::new(
                pairs
                    .iter()
                    .map(|(k, v)| (k.name.to_owned(), v.to_string()))
                    .collect::<HashMap<_, _>>(),
            ))
        };
        assert_eq!(read(&[]).unwrap().limits, Limits::default());
        let config = read(&[
            (VAR_HEADER_TIMEOUT_MS, "2500"),
            (VAR_BODY_TIMEOUT_MS, "3000"),
            (VAR_MAX_CONNECTIONS, "10"),
        ])
        .unwrap();
        assert_eq!(
            config.limits,
            Limits {
                header_timeout: Duration::from_millis(2500),
                body_timeout: Duration::from_secs(3),
                max_connections: 10,
            }
        );
        assert_eq!(
            read(&[(VAR_MAX_CONNECTIONS, "0")]).unwrap_err().variable,
            VAR_MAX_CONNECTIONS.name
        );
    }
}
