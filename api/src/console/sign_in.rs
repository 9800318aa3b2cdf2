//! Signing in to the console through the identity provider: OpenID Connect's authorization
//! code flow with PKCE (S256), `state` and `nonce`, as a confidential client
//! (`PAYBUS_OIDC_CONSOLE_CLIENT_ID` and its secret); the steps: docs/api.md, "Signing in" under
//! "The web console".
//!
//! The callback verifies the ID token (`iss`, `aud` = the client, `exp`, the nonce) and the
//! access token (the API's own [`crate::oidc::Verifier`]: roles), and that both name one
//! person; then a session ([`super::session::open`]). The tokens are never stored nor sent to
//! the browser. Nothing secret waits between the redirect and the callback: the PKCE verifier
//! and the nonce are HMAC-SHA256 of the state under the client secret ([`derived`]), so only
//! the state is kept, in a cookie of the browser that started ([`PENDING_COOKIE`]), and only
//! this server can turn it into the verifier.

use std::time::Duration;

use axum::{
    extract::{Query, State, rejection::QueryRejection},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Redirect, Response},
};
use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, Mac};
use paybus_config::Secret;
use paybus_ops::actor::{Actor, AuthMethod};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{
    layout,
    session::{self, LOGIN, SESSION_COOKIE, cookie, same_origin, set_cookie},
};
use crate::{AppState, auth::Caller, console_sessions, oidc::Refused};

/// The cookie that ties a sign-in in progress to the browser that started it: its `state`.
pub(crate) const PENDING_COOKIE: &str = "paybus_console_sign_in";
/// How long a person has on the provider's pages before the sign-in must start again.
const PENDING_FOR: Duration = Duration::from_secs(600);
/// What the console asks the provider for: the ID token, the person's email and username, and
/// their groups (the API's scope, whence the roles).
pub(crate) const SCOPE: &str = "openid email profile groups";

/// `GET /console/sign-in`: off to the provider's authorization endpoint.
pub(crate) async fn start(State(state): State<AppState>) -> Response {
    let (Some(verifier), Some(client_secret)) = (&state.oidc, &state.console.config.client_secret)
    else {
        return layout::error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            "No identity provider sign-in is configured here (PAYBUS_OIDC_ISSUER and \
             PAYBUS_OIDC_CONSOLE_CLIENT_SECRET).",
        );
    };
    let discovery = match verifier.discovery().await {
        Ok(discovery) => discovery,
        Err(refused) => return provider_unavailable(&refused),
    };
    let mut random = [0u8; 32];
    if let Err(error) = getrandom::fill(&mut random) {
        return layout::failure_page(crate::ApiError::Internal(Box::new(error)));
    }
    let pending_state = URL_SAFE_NO_PAD.encode(random);
    let code_verifier = derived(client_secret, "pkce", &pending_state);
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(code_verifier.as_bytes()));
    let mut to = match url::Url::parse(&discovery.authorization_endpoint) {
        Ok(url) => url,
        Err(error) => {
            tracing::error!(%error, endpoint = %discovery.authorization_endpoint,
                "the provider's authorization endpoint is not a URL");
            return provider_unavailable(&Refused::ProviderUnavailable);
        }
    };
    let config = &state.console.config;
    to.query_pairs_mut()
        .append_pair("response_type", "code")
        .append_pair("client_id", &config.client_id)
        .append_pair("redirect_uri", &config.link("/console/callback"))
        .append_pair("scope", SCOPE)
        .append_pair("resource", &verifier.config().audience)
        .append_pair("state", &pending_state)
        .append_pair("nonce", &derived(client_secret, "nonce", &pending_state))
        .append_pair("code_challenge", &challenge)
        .append_pair("code_challenge_method", "S256");
    let mut response = Redirect::to(to.as_str()).into_response();
    set_cookie(
        &mut response,
        &state,
        PENDING_COOKIE,
        &pending_state,
        PENDING_FOR.as_secs(),
    );
    response
}

/// What the provider sends the browser back with.
#[derive(Debug, Deserialize)]
pub(crate) struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// The token endpoint's answer (RFC 6749 §5.1, OpenID Connect Core §3.1.3.3).
#[derive(Deserialize)]
struct Tokens {
    access_token: String,
    id_token: Option<String>,
}

/// Why a sign-in was not completed; each is a page (never a token or a provider's internals).
enum Refusal {
    NotConfigured,
    ProviderSaid(String),
    NotThisBrowsers,
    NoCode,
    CodeRefused,
    ProviderUnavailable,
    Token(&'static str, Refused),
    NoRole(String),
    Failed(crate::ApiError),
}

impl Refusal {
    fn page(self) -> Response {
        let (status, message) = match self {
            Refusal::NotConfigured => (
                StatusCode::SERVICE_UNAVAILABLE,
                "No identity provider sign-in is configured here.".to_owned(),
            ),
            Refusal::ProviderSaid(what) => (
                StatusCode::UNAUTHORIZED,
                format!("The identity provider did not sign you in: {what}."),
            ),
            Refusal::NotThisBrowsers => (
                StatusCode::BAD_REQUEST,
                "This sign-in was not started in this browser, or took longer than 10 minutes: \
                 sign in again."
                    .to_owned(),
            ),
            Refusal::NoCode => (
                StatusCode::BAD_REQUEST,
                "The identity provider's answer has no code: sign in again.".to_owned(),
            ),
            Refusal::CodeRefused => (
                StatusCode::UNAUTHORIZED,
                "The identity provider refused this sign-in's code (it was used already or has \
                 expired): sign in again."
                    .to_owned(),
            ),
            Refusal::ProviderUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "The identity provider cannot be reached; try again in a moment.".to_owned(),
            ),
            Refusal::Token(which, refused) => (
                StatusCode::UNAUTHORIZED,
                format!("The identity provider's {which} was refused: {refused}."),
            ),
            Refusal::NoRole(name) => (
                StatusCode::FORBIDDEN,
                format!(
                    "Signed in as {name}, but your account has no paybus role: none of your \
                     groups maps to OPS or ADMIN. Ask an ADMIN to add you to a group that does."
                ),
            ),
            Refusal::Failed(error) => return layout::failure_page(error),
        };
        layout::error_page(status, &message)
    }
}

/// `GET /console/callback`: the provider's answer. Whatever happens, the pending sign-in's
/// cookie is cleared: a state is good for one try.
pub(crate) async fn callback(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<Callback>, QueryRejection>,
) -> Response {
    let pending = cookie(&headers, PENDING_COOKIE);
    let mut response = match complete(&state, pending.as_deref(), query).await {
        Ok(response) => response,
        Err(refusal) => refusal.page(),
    };
    set_cookie(&mut response, &state, PENDING_COOKIE, "", 0);
    response
}

async fn complete(
    state: &AppState,
    pending: Option<&str>,
    query: Result<Query<Callback>, QueryRejection>,
) -> Result<Response, Refusal> {
    let (Some(verifier), Some(client_secret)) = (&state.oidc, &state.console.config.client_secret)
    else {
        return Err(Refusal::NotConfigured);
    };
    let Query(answer) = query.map_err(|_| Refusal::NoCode)?;
    let states_match = matches!((pending, answer.state.as_deref()),
        (Some(pending), Some(returned)) if same_text(pending, returned));
    if let Some(error) = answer.error {
        tracing::warn!(%error, description = answer.error_description.as_deref().unwrap_or(""),
            "console sign-in: the provider refused");
        // The provider's words are shown only for a sign-in this browser started.
        let what = match answer.error_description.filter(|_| states_match) {
            Some(description) => format!("{error} ({description})"),
            None => error,
        };
        return Err(Refusal::ProviderSaid(what));
    }
    if !states_match {
        tracing::warn!("console sign-in: the state is not this browser's");
        return Err(Refusal::NotThisBrowsers);
    }
    let Some((code, pending)) = answer.code.zip(pending) else {
        return Err(Refusal::NoCode);
    };
    let discovery = verifier
        .discovery()
        .await
        .map_err(|_| Refusal::ProviderUnavailable)?;
    let config = &state.console.config;
    let credentials = format!(
        "{}:{}",
        form_urlencoded::byte_serialize(config.client_id.as_bytes()).collect::<String>(),
        form_urlencoded::byte_serialize(client_secret.expose().as_bytes()).collect::<String>()
    );
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("grant_type", "authorization_code")
        .append_pair("code", &code)
        .append_pair("redirect_uri", &config.link("/console/callback"))
        .append_pair("code_verifier", &derived(client_secret, "pkce", pending))
        .finish();
    let exchanged = state
        .console
        .http
        .post(&discovery.token_endpoint)
        .header(
            axum::http::header::AUTHORIZATION,
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(credentials)
            ),
        )
        .header(
            axum::http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(form)
        .send()
        .await
        .map_err(|error| {
            tracing::warn!(%error, "console sign-in: the token endpoint cannot be reached");
            Refusal::ProviderUnavailable
        })?;
    let status = exchanged.status();
    if status.is_client_error() {
        let body: serde_json::Value = exchanged.json().await.unwrap_or_default();
        tracing::warn!(status = status.as_u16(), error = %body["error"],
            description = %body["error_description"], "console sign-in: the code was refused");
        return Err(Refusal::CodeRefused);
    }
    if !status.is_success() {
        tracing::warn!(
            status = status.as_u16(),
            "console sign-in: the token endpoint failed"
        );
        return Err(Refusal::ProviderUnavailable);
    }
    let tokens: Tokens = exchanged.json().await.map_err(|error| {
        tracing::warn!(%error, "console sign-in: the token endpoint answered something unreadable");
        Refusal::ProviderUnavailable
    })?;
    let id_token = tokens
        .id_token
        .ok_or(Refusal::Token("ID token", Refused::Invalid))?;
    let nonce = derived(client_secret, "nonce", pending);
    let identified = verifier
        .verify_id_token(&id_token, &config.client_id, &nonce)
        .await
        .map_err(|refused| token_refusal("ID token", refused))?;
    let vouched = verifier
        .verify(&tokens.access_token)
        .await
        .map_err(|refused| token_refusal("access token", refused))?;
    if vouched.subject != identified.subject {
        tracing::warn!(id_token = %identified.subject, access_token = %vouched.subject,
            "console sign-in: the ID token and the access token name different people");
        return Err(Refusal::Token("access token", Refused::Invalid));
    }
    if vouched.roles.is_empty() {
        tracing::warn!(person = %vouched.name, issuer = %vouched.issuer,
            subject = %vouched.subject, "console sign-in refused: no paybus role");
        return Err(Refusal::NoRole(vouched.name));
    }
    let caller = Caller {
        actor: Actor::person(&vouched.issuer, &vouched.subject, &vouched.name),
        roles: vouched.roles,
        expires_at: 0,
    };
    session::open(state, &caller, config.session_lifetime)
        .await
        .map_err(Refusal::Failed)
}

fn token_refusal(which: &'static str, refused: Refused) -> Refusal {
    tracing::warn!(%refused, "console sign-in: the provider's {which} was refused");
    match refused {
        Refused::ProviderUnavailable => Refusal::ProviderUnavailable,
        refused => Refusal::Token(which, refused),
    }
}

fn provider_unavailable(refused: &Refused) -> Response {
    layout::error_page(StatusCode::SERVICE_UNAVAILABLE, &refused.to_string())
}

/// `POST /console/logout`: ends the session here, clears the cookie and, for a session the
/// provider signed in where it offers one, signs out there too (its `end_session_endpoint`,
/// which comes back to the login page); else straight to the login page.
pub(crate) async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if !same_origin(&headers) {
        return layout::error_page(
            StatusCode::FORBIDDEN,
            "This form was sent from another site.",
        );
    }
    let mut signed_in_with_provider = false;
    if let Some(secret) = cookie(&headers, SESSION_COOKIE) {
        let ended = async {
            let mut conn = state.pool.acquire().await?;
            console_sessions::end_own(&mut conn, &secret).await
        };
        match ended.await {
            Ok(method) => signed_in_with_provider = method == Some(AuthMethod::Oidc),
            Err(error) => return layout::failure_page(error),
        }
    }
    let to = if signed_in_with_provider {
        provider_sign_out(&state)
            .await
            .unwrap_or_else(|| LOGIN.to_owned())
    } else {
        LOGIN.to_owned()
    };
    let mut response = Redirect::to(&to).into_response();
    set_cookie(&mut response, &state, SESSION_COOKIE, "", 0);
    response
}

/// Where the browser goes to sign out at the provider too: its `end_session_endpoint` (when
/// its discovery document names one) with the client and the login page to come back to.
pub(crate) async fn provider_sign_out(state: &AppState) -> Option<String> {
    let verifier = state.oidc.as_ref()?;
    let endpoint = verifier
        .discovery()
        .await
        .ok()?
        .end_session_endpoint
        .clone()?;
    let mut to = url::Url::parse(&endpoint).ok()?;
    to.query_pairs_mut()
        .append_pair("client_id", &state.console.config.client_id)
        .append_pair(
            "post_logout_redirect_uri",
            &state.console.config.link("/console/login"),
        );
    Some(to.into())
}

/// The PKCE verifier (`purpose` "pkce") or the nonce ("nonce") of the sign-in whose state is
/// `state`: HMAC-SHA256 under the client secret, base64url (43 characters, as RFC 7636 asks).
fn derived(client_secret: &Secret, purpose: &str, state: &str) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(client_secret.expose().as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(b"paybus-console-sign-in/");
    mac.update(purpose.as_bytes());
    mac.update(b"/");
    mac.update(state.as_bytes());
    URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
}

/// Equal texts, compared in a time that does not depend on where they differ.
fn same_text(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |differ, (x, y)| differ | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verifier_and_the_nonce_come_from_the_state_and_the_secret_only() {
        let secret = Secret::new("client-secret-of-the-console");
        let verifier = derived(&secret, "pkce", "state-1");
        assert_eq!(verifier.len(), 43, "RFC 7636: 43 to 128 characters");
        assert_eq!(verifier, derived(&secret, "pkce", "state-1"));
        assert_ne!(verifier, derived(&secret, "nonce", "state-1"));
        assert_ne!(verifier, derived(&secret, "pkce", "state-2"));
        assert_ne!(
            verifier,
            derived(&Secret::new("another-client-secret"), "pkce", "state-1")
        );
    }

    #[test]
    fn texts_are_the_same_only_when_equal() {
        assert!(same_text("abc", "abc"));
        assert!(!same_text("abc", "abd"));
        assert!(!same_text("abc", "abcd"));
    }
}
