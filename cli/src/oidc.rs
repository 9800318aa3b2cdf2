//! The command line's side of OpenID Connect: the provider's discovery document, the device
//! authorization grant (RFC 8628) that `paybus login` runs, the refresh of an access token
//! about to expire, and the revocation of a refresh token at `paybus logout`.
//!
//! paybus is a public client here (no secret: anyone can read a binary); what the provider
//! issues is an access token for the API's resource indicator (RFC 8707), which the API
//! verifies itself. Nothing here checks a token: it only carries them.

use std::{future::Future, time::Duration};

use anyhow::Context;
use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use chrono::{DateTime, TimeDelta, Utc};
use serde::Deserialize;
use serde_json::Value;

/// What the command line asks for: an ID token, a refresh token, and the claims the API maps
/// roles from.
pub const SCOPE: &str = "openid email profile groups offline_access";

const DEVICE_CODE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

/// How long the provider may take to answer one request.
pub const PROVIDER_TIMEOUT: Duration = Duration::from_secs(15);

/// RFC 8628 §3.2: the polling interval when the provider names none.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// RFC 8628 §3.5: `slow_down` adds five seconds to the interval, for this and every later poll.
const SLOW_DOWN_STEP: Duration = Duration::from_secs(5);

/// The API's answer to `GET /v1/auth/config`: which provider signs its people in.
#[derive(Debug, Clone, Deserialize)]
pub struct AuthConfig {
    pub issuer: String,
    pub cli_client_id: String,
    pub audience: String,
}

/// The endpoints of the provider's discovery document that the command line uses.
#[derive(Debug, Clone, Deserialize)]
pub struct Discovery {
    pub issuer: String,
    pub token_endpoint: String,
    pub device_authorization_endpoint: Option<String>,
    pub revocation_endpoint: Option<String>,
}

/// The provider's answer to a device authorization request (RFC 8628 §3.2).
#[derive(Clone, Deserialize)]
pub struct DeviceAuthorization {
    pub device_code: String,
    pub user_code: String,
    pub verification_uri: String,
    pub verification_uri_complete: Option<String>,
    pub expires_in: u64,
    pub interval: Option<u64>,
}

/// A successful token response (RFC 6749 §5.1).
#[derive(Clone, Deserialize)]
pub struct Tokens {
    pub access_token: String,
    pub refresh_token: Option<String>,
    pub expires_in: Option<u64>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("access_token", &"***")
            .field("refresh_token", &self.refresh_token.as_ref().map(|_| "***"))
            .field("expires_in", &self.expires_in)
            .finish()
    }
}

/// An error response of the token endpoint (RFC 6749 §5.2).
#[derive(Debug, Clone, Deserialize)]
struct TokenError {
    error: String,
    error_description: Option<String>,
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.error_description {
            Some(description) => write!(f, "{} ({description})", self.error),
            None => f.write_str(&self.error),
        }
    }
}

/// Why a device sign-in ended without tokens.
#[derive(Debug, PartialEq, Eq)]
pub enum DeviceFlowEnd {
    /// The person refused it (`access_denied`).
    Denied,
    /// The code expired before anyone approved it (`expired_token`, or its `expires_in`
    /// passed while polling).
    Expired,
}

impl std::fmt::Display for DeviceFlowEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceFlowEnd::Denied => "the sign-in was refused at the provider (access_denied)",
            DeviceFlowEnd::Expired => {
                "the code expired before it was approved: run `paybus login` again"
            }
        })
    }
}

impl std::error::Error for DeviceFlowEnd {}

/// One provider: its discovery document and an HTTP client with timeouts.
pub struct Provider {
    http: reqwest::Client,
    pub discovery: Discovery,
}

impl Provider {
    /// Reads `{issuer}/.well-known/openid-configuration`; its `issuer` must be `issuer`
    /// (OpenID Connect Discovery §4.3), or every token would come from someone else.
    pub async fn discover(http: &reqwest::Client, issuer: &str) -> anyhow::Result<Self> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        let response = http
            .get(&url)
            .timeout(PROVIDER_TIMEOUT)
            .send()
            .await
            .with_context(|| format!("while reading the provider's discovery document {url}"))?;
        let status = response.status();
        if !status.is_success() {
            anyhow::bail!("the provider's discovery document {url} answered {status}");
        }
        let discovery: Discovery = response
            .json()
            .await
            .with_context(|| format!("{url} is not an OpenID discovery document"))?;
        if discovery.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
            anyhow::bail!(
                "{url} names issuer {:?}, not {issuer:?}: refusing a provider that is not the \
                 one configured",
                discovery.issuer
            );
        }
        Ok(Self {
            http: http.clone(),
            discovery,
        })
    }

    /// RFC 8628 §3.1: asks for a device code and the code the person enters.
    pub async fn authorize_device(
        &self,
        client_id: &str,
        audience: &str,
    ) -> anyhow::Result<DeviceAuthorization> {
        let endpoint = self
            .discovery
            .device_authorization_endpoint
            .as_deref()
            .context("the provider offers no device authorization endpoint (RFC 8628)")?;
        let response = self
            .form(
                endpoint,
                &[
                    ("client_id", client_id),
                    ("scope", SCOPE),
                    ("resource", audience),
                ],
            )
            .await
            .context("while asking the provider for a device code")?;
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        if !status.is_success() {
            anyhow::bail!(
                "the provider refused the device authorization request ({status}): {}",
                error_text(&body)
            );
        }
        serde_json::from_str(&body)
            .context("the provider's device authorization answer is not RFC 8628's")
    }

    /// RFC 8628 §3.4-3.5: polls the token endpoint until the person approved or refused the
    /// code, or it expired; `authorization_pending` waits the interval, `slow_down` makes it
    /// five seconds longer. `pause` waits (tokio's sleep; a test's records); the time waited is
    /// also the clock the code's `expires_in` is measured with.
    pub async fn poll_device_tokens<P, F>(
        &self,
        client_id: &str,
        audience: &str,
        device: &DeviceAuthorization,
        mut pause: P,
    ) -> anyhow::Result<Tokens>
    where
        P: FnMut(Duration) -> F,
        F: Future<Output = ()>,
    {
        let mut interval = device
            .interval
            .filter(|seconds| *seconds > 0)
            .map_or(DEFAULT_INTERVAL, Duration::from_secs);
        let lifetime = Duration::from_secs(device.expires_in);
        let mut waited = Duration::ZERO;
        loop {
            if waited >= lifetime {
                return Err(DeviceFlowEnd::Expired.into());
            }
            pause(interval).await;
            waited += interval;
            let answer = self
                .token_request(&[
                    ("grant_type", DEVICE_CODE_GRANT),
                    ("device_code", &device.device_code),
                    ("client_id", client_id),
                    ("resource", audience),
                ])
                .await?;
            match answer {
                Ok(tokens) => return Ok(tokens),
                Err(refused) => match refused.error.as_str() {
                    "authorization_pending" => {}
                    "slow_down" => interval += SLOW_DOWN_STEP,
                    "access_denied" => return Err(DeviceFlowEnd::Denied.into()),
                    "expired_token" => return Err(DeviceFlowEnd::Expired.into()),
                    _ => anyhow::bail!("the provider ended the sign-in: {refused}"),
                },
            }
        }
    }

    /// A new access token for `refresh_token` (RFC 6749 §6), for the API's resource again.
    pub async fn refresh(
        &self,
        client_id: &str,
        audience: &str,
        refresh_token: &str,
    ) -> anyhow::Result<Tokens> {
        match self
            .token_request(&[
                ("grant_type", "refresh_token"),
                ("refresh_token", refresh_token),
                ("client_id", client_id),
                ("resource", audience),
            ])
            .await?
        {
            Ok(tokens) => Ok(tokens),
            Err(refused) => anyhow::bail!(
                "the provider refused to renew the sign-in: {refused}; run `paybus login` again"
            ),
        }
    }

    /// RFC 7009: tells the provider the refresh token is no longer wanted. `None` when the
    /// provider names no revocation endpoint.
    pub async fn revoke(&self, client_id: &str, refresh_token: &str) -> anyhow::Result<Option<()>> {
        let Some(endpoint) = self.discovery.revocation_endpoint.as_deref() else {
            return Ok(None);
        };
        let response = self
            .form(
                endpoint,
                &[
                    ("token", refresh_token),
                    ("token_type_hint", "refresh_token"),
                    ("client_id", client_id),
                ],
            )
            .await
            .context("while revoking the refresh token")?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            anyhow::bail!(
                "the provider refused to revoke the refresh token ({status}): {}",
                error_text(&body)
            );
        }
        Ok(Some(()))
    }

    /// One token request: the tokens, or the provider's OAuth error.
    async fn token_request(
        &self,
        fields: &[(&str, &str)],
    ) -> anyhow::Result<Result<Tokens, TokenError>> {
        let response = self
            .form(&self.discovery.token_endpoint, fields)
            .await
            .context("while asking the provider's token endpoint")?;
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        if status.is_success() {
            let tokens = serde_json::from_str(&body)
                .context("the provider's token answer has no access_token")?;
            return Ok(Ok(tokens));
        }
        match serde_json::from_str::<TokenError>(&body) {
            Ok(refused) => Ok(Err(refused)),
            Err(_) => anyhow::bail!("the provider's token endpoint answered {status}"),
        }
    }

    async fn form(
        &self,
        endpoint: &str,
        fields: &[(&str, &str)],
    ) -> reqwest::Result<reqwest::Response> {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        self.http
            .post(endpoint)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(PROVIDER_TIMEOUT)
            .body(body)
            .send()
            .await
    }
}

/// When the access token of `tokens` expires: `expires_in` from now, else its own `exp`, else
/// now (so the next call renews it).
pub fn expires_at(tokens: &Tokens) -> DateTime<Utc> {
    let now = Utc::now();
    if let Some(seconds) = tokens.expires_in {
        // A provider's nonsense (years) is capped: the token is renewed sooner, never later.
        let seconds = i64::try_from(seconds).unwrap_or(i64::MAX).min(86_400);
        return now + TimeDelta::seconds(seconds);
    }
    unverified_claims(&tokens.access_token)
        .and_then(|claims| claims["exp"].as_i64())
        .and_then(|exp| DateTime::from_timestamp(exp, 0))
        .unwrap_or(now)
}

/// A JWT's claims, read without checking its signature: to show whom it names and until
/// when, never to trust it (the API verifies it).
pub fn unverified_claims(token: &str) -> Option<Value> {
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// An OAuth error body as one line, or the start of whatever else it was.
fn error_text(body: &str) -> String {
    serde_json::from_str::<TokenError>(body)
        .map(|refused| refused.to_string())
        .unwrap_or_else(|_| body.chars().take(200).collect())
}

#[cfg(test)]
mod tests {
    //! The polling state machine against a real HTTP token endpoint on loopback that answers a
    //! scripted sequence, with the waits recorded instead of slept.
    #![allow(clippy::unwrap_used)]

    use std::sync::{Arc, Mutex};

    use axum::{Router, extract::State, http::StatusCode, routing::post};
    use serde_json::json;

    use super::*;

    /// The answers the token endpoint gives, in order, and the forms it received.
    #[derive(Clone, Default)]
    struct Script {
        answers: Arc<Mutex<Vec<(StatusCode, Value)>>>,
        received: Arc<Mutex<Vec<String>>>,
    }

    async fn token_endpoint(State(script): State<Script>, body: String) -> (StatusCode, String) {
        script.received.lock().unwrap().push(body);
        let mut answers = script.answers.lock().unwrap();
        let (status, answer) = if answers.is_empty() {
            (StatusCode::INTERNAL_SERVER_ERROR, json!({}))
        } else {
            answers.remove(0)
        };
        (status, answer.to_string())
    }

    async fn scripted(answers: Vec<(StatusCode, Value)>) -> (Provider, Script) {
        let script = Script {
            answers: Arc::new(Mutex::new(answers)),
            ..Script::default()
        };
        let app = Router::new()
            .route("/token", post(token_endpoint))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let provider = Provider {
            http: reqwest::Client::new(),
            discovery: Discovery {
                issuer: base.clone(),
                token_endpoint: format!("{base}/token"),
                device_authorization_endpoint: None,
                revocation_endpoint: None,
            },
        };
        (provider, script)
    }

    fn refused(error: &str) -> (StatusCode, Value) {
        (StatusCode::BAD_REQUEST, json!({ "error": error }))
    }

    fn granted() -> (StatusCode, Value) {
        (
            StatusCode::OK,
            json!({"access_token": "the-access-token", "refresh_token": "the-refresh-token",
                   "token_type": "Bearer", "expires_in": 600}),
        )
    }

    fn device(interval: Option<u64>, expires_in: u64) -> DeviceAuthorization {
        DeviceAuthorization {
            device_code: "the-device-code".to_owned(),
            user_code: "ABCD-EFGH".to_owned(),
            verification_uri: "http://provider/device".to_owned(),
            verification_uri_complete: None,
            expires_in,
            interval,
        }
    }

    /// Polls with `device`, recording each wait instead of sleeping it.
    async fn poll(
        provider: &Provider,
        device: &DeviceAuthorization,
    ) -> (anyhow::Result<Tokens>, Vec<Duration>) {
        let waits = Arc::new(Mutex::new(Vec::new()));
        let recorded = waits.clone();
        let result = provider
            .poll_device_tokens("paybus-cli", "urn:paybus:admin-api", device, |wait| {
                recorded.lock().unwrap().push(wait);
                std::future::ready(())
            })
            .await;
        let waits = waits.lock().unwrap().clone();
        (result, waits)
    }

    fn seconds(list: &[u64]) -> Vec<Duration> {
        list.iter().copied().map(Duration::from_secs).collect()
    }

    #[tokio::test]
    async fn pending_waits_the_interval_and_slow_down_lengthens_it_for_good() {
        let (provider, script) = scripted(vec![
            refused("authorization_pending"),
            refused("slow_down"),
            refused("authorization_pending"),
            granted(),
        ])
        .await;

        let (tokens, waits) = poll(&provider, &device(Some(2), 600)).await;

        let tokens = tokens.unwrap();
        assert_eq!(tokens.access_token, "the-access-token");
        assert_eq!(tokens.refresh_token.as_deref(), Some("the-refresh-token"));
        assert_eq!(waits, seconds(&[2, 2, 7, 7]));
        let received = script.received.lock().unwrap().clone();
        assert_eq!(received.len(), 4);
        assert_eq!(
            received[0],
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Adevice_code&\
             device_code=the-device-code&client_id=paybus-cli&resource=urn%3Apaybus%3Aadmin-api"
        );
    }

    #[tokio::test]
    async fn without_an_interval_the_poll_waits_five_seconds() {
        let (provider, _) = scripted(vec![refused("authorization_pending"), granted()]).await;

        let (tokens, waits) = poll(&provider, &device(None, 600)).await;

        assert!(tokens.is_ok());
        assert_eq!(waits, seconds(&[5, 5]));
    }

    #[tokio::test]
    async fn a_refusal_ends_the_poll_as_denied() {
        let (provider, script) = scripted(vec![
            refused("authorization_pending"),
            refused("access_denied"),
            granted(),
        ])
        .await;

        let (result, _) = poll(&provider, &device(Some(1), 600)).await;

        let end = result.unwrap_err();
        assert_eq!(
            end.downcast_ref::<DeviceFlowEnd>(),
            Some(&DeviceFlowEnd::Denied)
        );
        assert_eq!(script.received.lock().unwrap().len(), 2, "no poll after it");
    }

    #[tokio::test]
    async fn an_expired_code_ends_the_poll_whether_the_provider_or_the_clock_says_so() {
        let (provider, _) = scripted(vec![refused("expired_token")]).await;
        let (said, _) = poll(&provider, &device(Some(1), 600)).await;
        assert_eq!(
            said.unwrap_err().downcast_ref::<DeviceFlowEnd>(),
            Some(&DeviceFlowEnd::Expired)
        );

        // 3 s to live, polled every 1 s: three polls, then the code is known to be dead.
        let (provider, script) = scripted(vec![
            refused("authorization_pending"),
            refused("authorization_pending"),
            refused("authorization_pending"),
            granted(),
        ])
        .await;
        let (timed_out, waits) = poll(&provider, &device(Some(1), 3)).await;
        assert_eq!(
            timed_out.unwrap_err().downcast_ref::<DeviceFlowEnd>(),
            Some(&DeviceFlowEnd::Expired)
        );
        assert_eq!(waits, seconds(&[1, 1, 1]));
        assert_eq!(script.received.lock().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn another_oauth_error_ends_the_poll_naming_it() {
        let (provider, _) = scripted(vec![(
            StatusCode::BAD_REQUEST,
            json!({"error": "invalid_client", "error_description": "no such client"}),
        )])
        .await;

        let (result, _) = poll(&provider, &device(Some(1), 600)).await;

        let message = format!("{:#}", result.unwrap_err());
        assert!(
            message.contains("invalid_client (no such client)"),
            "{message}"
        );
    }
}
