//! `paybus login`, `paybus logout`, `paybus whoami`: a person's sign-in for the command line.
//!
//! - `login [--api URL]`: asks the API which provider signs its people in (`GET
//!   /v1/auth/config`, public), then runs the provider's device authorization grant (RFC
//!   8628): prints a code and a link to open in any browser, waits while the person signs in
//!   there, and stores the tokens (`crate::credentials`, 0600).
//! - `logout`: revokes the refresh token at the provider (when it names a revocation
//!   endpoint) and deletes the stored sign-in.
//! - `whoami`: whom the token names and until when, read from the token itself: the API has
//!   no route that answers it, so this is what the token says, not what the API verified.
//!
//! No token is ever printed.

use std::process::ExitCode;

use anyhow::Context;
use chrono::Utc;
use paybus_config::Vars;
use serde_json::Value;

use crate::{
    api_client::{self, ApiArgs, VAR_TOKEN},
    credentials::{Credentials, Store},
    oidc::{self, AuthConfig, Provider},
};

pub async fn login(args: &ApiArgs) -> anyhow::Result<ExitCode> {
    let vars = Vars::from_env();
    let api = args.base_url(&vars)?;
    let store = Store::locate(&vars)?;
    let http = api_client::http_client()?;
    let config = auth_config(&http, &api).await?;
    let provider = Provider::discover(&http, &config.issuer).await?;
    let device = provider
        .authorize_device(&config.cli_client_id, &config.audience)
        .await?;
    eprintln!("! First copy your one-time code: {}", device.user_code);
    match &device.verification_uri_complete {
        Some(complete) => eprintln!(
            "Then open {complete} in a browser and sign in (or open {} and enter the code).",
            device.verification_uri
        ),
        None => eprintln!(
            "Then open {} in a browser, enter the code and sign in.",
            device.verification_uri
        ),
    }
    eprintln!(
        "Waiting for the sign-in at {} (the code expires in {} min)...",
        config.issuer,
        device.expires_in.div_ceil(60)
    );
    let tokens = provider
        .poll_device_tokens(
            &config.cli_client_id,
            &config.audience,
            &device,
            tokio::time::sleep,
        )
        .await?;
    let credentials = Credentials {
        api: api.clone(),
        issuer: config.issuer,
        client_id: config.cli_client_id,
        audience: config.audience,
        expires_at: oidc::expires_at(&tokens),
        access_token: tokens.access_token,
        refresh_token: tokens.refresh_token,
    };
    store.save(&credentials)?;
    println!(
        "✓ Signed in to {api} as {} (kept in {}; `paybus logout` signs out)",
        who(&credentials.access_token),
        store.path().display()
    );
    if credentials.refresh_token.is_none() {
        println!(
            "  the provider gave no refresh token: run `paybus login` again once it expires ({})",
            credentials.expires_at.to_rfc3339()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `GET /v1/auth/config`: the provider, client and audience the API's people sign in with.
async fn auth_config(http: &reqwest::Client, api: &str) -> anyhow::Result<AuthConfig> {
    let url = format!("{api}/v1/auth/config");
    let response = http
        .get(&url)
        .send()
        .await
        .map_err(|e| api_client::unreachable_api(api, &url, api_client::CALL_TIMEOUT, e))?;
    let status = response.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        anyhow::bail!(
            "the API at {api} names no OpenID provider (GET /v1/auth/config answered 404): \
             sign-in is not set up there"
        );
    }
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(api_client::refused(status, &body));
    }
    response
        .json()
        .await
        .with_context(|| format!("{url} did not answer {{issuer, cli_client_id, audience}}"))
}

pub async fn logout() -> anyhow::Result<ExitCode> {
    let store = Store::locate(&Vars::from_env())?;
    let Some(credentials) = store.load()? else {
        println!("not signed in (no {})", store.path().display());
        return Ok(ExitCode::SUCCESS);
    };
    // Revoked first: once the file is gone, nothing here could revoke it any more.
    let revoked = match &credentials.refresh_token {
        Some(refresh_token) => revoke(&credentials, refresh_token).await,
        None => Ok(None),
    };
    store.delete()?;
    let api = &credentials.api;
    let path = store.path();
    match revoked {
        Ok(Some(())) => {
            println!(
                "signed out of {api}: the refresh token is revoked at {} and {} is deleted",
                credentials.issuer,
                path.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(None) => {
            println!(
                "signed out of {api}: {} is deleted (the provider revokes nothing here: a \
                 refresh token it issued lives until it expires)",
                path.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("signed out of {api}: {} is deleted", path.display());
            eprintln!(
                "paybus: but the refresh token could not be revoked at {}: {e:#}",
                credentials.issuer
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn revoke(credentials: &Credentials, refresh_token: &str) -> anyhow::Result<Option<()>> {
    let http = api_client::http_client()?;
    let provider = Provider::discover(&http, &credentials.issuer).await?;
    provider.revoke(&credentials.client_id, refresh_token).await
}

pub async fn whoami() -> anyhow::Result<ExitCode> {
    let vars = Vars::from_env();
    let (token, source) = match vars.get(VAR_TOKEN) {
        Some(token) => (token.to_owned(), VAR_TOKEN.name.to_owned()),
        None => {
            let store = Store::locate(&vars)?;
            let Some(credentials) = store.load()? else {
                eprintln!(
                    "not signed in: run `paybus login` (or set {})",
                    VAR_TOKEN.name
                );
                return Ok(ExitCode::FAILURE);
            };
            let http = api_client::http_client()?;
            let credentials = api_client::fresh(&http, &store, credentials).await?;
            let source = format!(
                "the sign-in to {} in {}",
                credentials.api,
                store.path().display()
            );
            (credentials.access_token, source)
        }
    };
    let Some(claims) = oidc::unverified_claims(&token) else {
        println!(
            "the token of {source} is not a JWT: only the API can say whom it names, and it has \
             no route that does"
        );
        return Ok(ExitCode::SUCCESS);
    };
    println!("{}", who(&token));
    for (label, claim) in [
        ("subject", "sub"),
        ("email", "email"),
        ("issuer", "iss"),
        ("audience", "aud"),
        ("groups", "groups"),
        ("roles", "roles"),
    ] {
        if let Some(value) = shown(&claims[claim]) {
            println!("  {label}: {value}");
        }
    }
    if let Some(expiry) = claims["exp"]
        .as_i64()
        .and_then(|exp| chrono::DateTime::from_timestamp(exp, 0))
    {
        let state = if expiry > Utc::now() {
            "expires"
        } else {
            "expired"
        };
        println!("  {state}: {}", expiry.to_rfc3339());
    }
    println!(
        "  (read from the token of {source} without verifying it: the API checks it on every \
         call)"
    );
    Ok(ExitCode::SUCCESS)
}

/// The person a token names, as people read it: their login or email, else its subject.
fn who(token: &str) -> String {
    let Some(claims) = oidc::unverified_claims(token) else {
        return "the token's holder".to_owned();
    };
    let name = ["preferred_username", "email", "sub"]
        .iter()
        .find_map(|claim| claims[*claim].as_str().map(str::to_owned))
        .unwrap_or_else(|| "the token's holder".to_owned());
    match claims["email"].as_str() {
        Some(email) if email != name => format!("{name} ({email})"),
        _ => name,
    }
}

fn shown(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Array(items) => Some(
            items
                .iter()
                .map(|item| {
                    item.as_str()
                        .map_or_else(|| item.to_string(), str::to_owned)
                })
                .collect::<Vec<_>>()
                .join(", "),
        ),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}
