//! The admin API as the command line calls it: every command that changes something is one of
//! its routes, called as the person `paybus login` signed in (or with `PAYBUS_TOKEN`), so the
//! console, the command line and scripts share one authenticated path and the API, not a
//! command-line flag, says who acted.
//!
//! - The API: `--api URL`, else `PAYBUS_API_URL`, else `http://127.0.0.1:8080` (what
//!   `paybus run` serves locally).
//! - The token: `PAYBUS_TOKEN` (scripts, break-glass), else the sign-in `paybus login` stored
//!   (`crate::credentials`), renewed with its refresh token when it has less than a minute
//!   left. A stored sign-in is sent only to the API it was made for.
//! - An answer other than 2xx is an error naming the API's `{"error"}` text and the status
//!   (exit 1); a 401 says to run `paybus login`; a refused connection names the URL. Every call
//!   has a timeout.

use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use paybus_config::{
    Secret, Vars,
    setting::{Setting, SettingGroup},
};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{
    credentials::{self, Credentials, Store},
    oidc::{self, Provider},
};

pub const DEFAULT_API_URL: &str = "http://127.0.0.1:8080";

pub const VAR_API_URL: Setting = Setting {
    name: "PAYBUS_API_URL",
    default: "`http://127.0.0.1:8080`",
    about: "the admin API the changing commands (and `paybus login`) call; `--api URL` wins \
            over it",
};

pub const VAR_TOKEN: Setting = Setting {
    name: "PAYBUS_TOKEN",
    default: "unset: the sign-in `paybus login` stored",
    about: "a bearer token the commands send instead of the stored sign-in (scripts, \
            break-glass); never printed or logged",
};

pub const SETTINGS: &[Setting] = &[VAR_API_URL, VAR_TOKEN, credentials::VAR_CONFIG_HOME];

/// The command line's section of the configuration page.
pub const SETTINGS_GROUP: SettingGroup = SettingGroup {
    title: "Command line",
    read_by: "Read by the `paybus` commands that call the admin API: every command that changes \
              something, `login`, `logout` and `whoami`.",
    settings: SETTINGS,
};

/// An ordinary call's bound, connection included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A stored access token with less left than this is renewed before the call, so it cannot
/// expire on its way.
const REFRESH_MARGIN: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// `--api URL` of the commands that call the admin API.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ApiArgs {
    /// The admin API to call [env: PAYBUS_API_URL] [default: http://127.0.0.1:8080].
    #[arg(long, value_name = "URL")]
    pub api: Option<String>,
}

impl ApiArgs {
    /// The API's base URL, without a trailing `/`.
    pub fn base_url(&self, vars: &Vars) -> anyhow::Result<String> {
        let (raw, from) = match &self.api {
            Some(api) => (api.as_str(), "--api"),
            None => (
                vars.get(VAR_API_URL).unwrap_or(DEFAULT_API_URL),
                VAR_API_URL.name,
            ),
        };
        let url = url::Url::parse(raw.trim())
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https") && url.host().is_some())
            .with_context(|| {
                format!(
                    "{from} {:?} is not an http(s) URL like {DEFAULT_API_URL}",
                    paybus_config::redact::text(raw)
                )
            })?;
        Ok(url.as_str().trim_end_matches('/').to_owned())
    }
}

/// The HTTP client of every call the command line makes (the API's and the provider's):
/// bounded, and never following a redirect with a bearer token.
pub fn http_client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .user_agent(concat!("paybus-cli/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .context("while building the HTTP client")
}

/// A 2xx answer: its status (200 and 202 mean different things on guarded routes) and body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
}

impl Answer {
    /// The body as `T` (the fields the command prints).
    pub fn parse<T: DeserializeOwned>(self) -> anyhow::Result<T> {
        serde_json::from_value(self.body)
            .context("the admin API's answer is not what this paybus expects (another version?)")
    }
}

/// The admin API, called with one person's token.
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: Secret,
}

impl ApiClient {
    /// The API of `args` with the token of `PAYBUS_TOKEN` or of the stored sign-in (renewed
    /// first when it is about to expire).
    pub async fn connect(args: &ApiArgs) -> anyhow::Result<Self> {
        let vars = Vars::from_env();
        let base = args.base_url(&vars)?;
        let http = http_client()?;
        let token = bearer(&http, &base, &vars).await?;
        Ok(Self { http, base, token })
    }

    pub async fn post(&self, path: &str, body: Option<&Value>) -> anyhow::Result<Answer> {
        self.send(Method::POST, path, body, CALL_TIMEOUT).await
    }

    /// A POST whose work takes a known while (an execution paced at N letters a second).
    pub async fn post_taking(
        &self,
        path: &str,
        body: Option<&Value>,
        work: Duration,
    ) -> anyhow::Result<Answer> {
        self.send(Method::POST, path, body, work + CALL_TIMEOUT)
            .await
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> anyhow::Result<Answer> {
        let url = format!("{}{path}", self.base);
        let mut request = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(self.token.expose())
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| unreachable_api(&self.base, &url, timeout, e))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| unreachable_api(&self.base, &url, timeout, e))?;
        if status.is_success() {
            let body = if text.trim().is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&text).with_context(|| {
                    format!("{method} {url} answered {status} with a body that is not JSON")
                })?
            };
            return Ok(Answer { status, body });
        }
        Err(refused(status, &text))
    }
}

/// The error of a non-2xx answer: the API's `{"error"}` text and the status.
pub(crate) fn refused(status: StatusCode, body: &str) -> anyhow::Error {
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|answer| answer["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| {
            status
                .canonical_reason()
                .unwrap_or("error")
                .to_ascii_lowercase()
        });
    if status == StatusCode::UNAUTHORIZED {
        anyhow::anyhow!(
            "{message} ({status}): run `paybus login` to sign in again (or check PAYBUS_TOKEN)"
        )
    } else {
        anyhow::anyhow!("{message} ({status})")
    }
}

/// A call that got no answer: refused, timed out or cut, naming where it went.
pub(crate) fn unreachable_api(
    base: &str,
    url: &str,
    timeout: Duration,
    error: reqwest::Error,
) -> anyhow::Error {
    if error.is_timeout() {
        return anyhow::anyhow!(
            "the admin API at {base} did not answer within {} s ({url})",
            timeout.as_secs()
        );
    }
    let mut cause: &dyn std::error::Error = &error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    if error.is_connect() {
        anyhow::anyhow!(
            "cannot connect to the admin API at {base}: {cause} (is `paybus serve` or `paybus \
             run` listening there? --api or PAYBUS_API_URL names another)"
        )
    } else {
        anyhow::anyhow!("the call to {url} failed: {cause}")
    }
}

/// The token to send to `base`: `PAYBUS_TOKEN`, else the stored sign-in for `base`.
async fn bearer(http: &reqwest::Client, base: &str, vars: &Vars) -> anyhow::Result<Secret> {
    if let Some(token) = vars.get(VAR_TOKEN) {
        return Ok(Secret::new(token));
    }
    let store = Store::locate(vars)?;
    let Some(credentials) = store.load()? else {
        anyhow::bail!("not signed in: run `paybus login --api {base}` (scripts: set PAYBUS_TOKEN)");
    };
    if credentials.api != base {
        anyhow::bail!(
            "signed in to {}, not {base}; a sign-in's tokens go only to the API they were made \
             for: run `paybus login --api {base}`",
            credentials.api
        );
    }
    let credentials = fresh(http, &store, credentials).await?;
    Ok(Secret::new(credentials.access_token))
}

/// `credentials`, renewed (and stored) first when the access token expires within the margin.
pub async fn fresh(
    http: &reqwest::Client,
    store: &Store,
    credentials: Credentials,
) -> anyhow::Result<Credentials> {
    if credentials.expires_at - Utc::now() > REFRESH_MARGIN {
        return Ok(credentials);
    }
    let Some(refresh_token) = credentials.refresh_token.clone() else {
        anyhow::bail!(
            "the sign-in expired at {} and cannot be renewed (no refresh token): run `paybus \
             login`",
            credentials.expires_at.to_rfc3339()
        );
    };
    let provider = Provider::discover(http, &credentials.issuer).await?;
    let tokens = provider
        .refresh(
            &credentials.client_id,
            &credentials.audience,
            &refresh_token,
        )
        .await?;
    let renewed = Credentials {
        expires_at: oidc::expires_at(&tokens),
        access_token: tokens.access_token,
        // A provider that rotates refresh tokens sends a new one; one that does not keeps the
        // old one valid.
        refresh_token: tokens.refresh_token.or(Some(refresh_token)),
        ..credentials
    };
    store.save(&renewed)?;
    Ok(renewed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vars {
        Vars::new(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
        )
    }

    #[test]
    fn the_flag_wins_over_the_variable_which_wins_over_the_default() {
        let set = vars(&[(VAR_API_URL.name, "https://paybus.example.com/")]);
        let flag = ApiArgs {
            api: Some("http://10.0.0.1:9000".to_owned()),
        };
        assert_eq!(
            flag.base_url(&set).unwrap(),
            "http://10.0.0.1:9000",
            "--api"
        );
        assert_eq!(
            ApiArgs::default().base_url(&set).unwrap(),
            "https://paybus.example.com"
        );
        assert_eq!(
            ApiArgs::default().base_url(&vars(&[])).unwrap(),
            DEFAULT_API_URL
        );
        let bad = ApiArgs {
            api: Some("ftp://x".to_owned()),
        };
        assert!(
            bad.base_url(&set)
                .unwrap_err()
                .to_string()
                .contains("--api")
        );
    }

    #[test]
    fn the_documented_default_is_the_readers() {
        for (name, environment) in
            paybus_config::setting::documented_defaults(SETTINGS).collect::<Vec<_>>()
        {
            let documented = Vars::new(environment);
            assert_eq!(
                ApiArgs::default().base_url(&documented).unwrap(),
                ApiArgs::default().base_url(&vars(&[])).unwrap(),
                "{name}"
            );
        }
    }

    #[test]
    fn a_refusal_shows_the_apis_error_and_status_and_a_401_says_to_sign_in() {
        let conflict = refused(
            StatusCode::CONFLICT,
            r#"{"error": "bonus job 7 is PENDING, not FAILED"}"#,
        );
        assert_eq!(
            conflict.to_string(),
            "bonus job 7 is PENDING, not FAILED (409 Conflict)"
        );
        let expired = refused(StatusCode::UNAUTHORIZED, r#"{"error": "expired token"}"#);
        assert!(
            expired
                .to_string()
                .starts_with("expired token (401 Unauthorized): run `paybus login`"),
            "{expired}"
        );
        let bare = refused(StatusCode::BAD_GATEWAY, "<html>proxy</html>");
        assert_eq!(bare.to_string(), "bad gateway (502 Bad Gateway)");
    }
}
