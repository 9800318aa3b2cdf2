//! Who may call the admin API, and as whom (docs/api.md, "Who may call"): a bearer token, and
//! who the caller is is what the token's issuer vouches for.
//!
//! - **A person**: an access token of the company's OpenID Connect provider, verified by
//!   [`crate::oidc::Verifier`]; their roles come from a claim the configuration maps, and they
//!   act as (issuer, subject).
//! - **Break-glass**: an HS256 token signed with `PAYBUS_ADMIN_JWT_SECRET`, accepted only while
//!   `PAYBUS_BREAK_GLASS` is on. Whoever holds the secret can mint any name with any role, so
//!   such a caller is marked wherever it acts and is never one of four eyes.
//!
//! Reads (GET, HEAD) need OPS or ADMIN, anything else ADMIN. A missing, malformed, forged,
//! expired or foreign token is 401; a valid one without the role 403; with neither a provider
//! nor break-glass configured, or the provider's keys out of reach, the admin API answers 503.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::{
    extract::{Request, State},
    http::{Method, header},
    middleware::Next,
    response::Response,
};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, errors::ErrorKind};
use paybus_ops::actor::Actor;
use serde::{Deserialize, Serialize};

use crate::{ApiError, AppState, oidc::Refused, role::Role};

/// Who is calling, and what they may do: what every admin handler acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub actor: Actor,
    pub roles: Vec<Role>,
    /// When the credential it presented expires, unix seconds.
    pub expires_at: u64,
}

impl Caller {
    pub fn allows(&self, needed: Role) -> bool {
        self.roles.contains(&Role::Admin) || self.roles.contains(&needed)
    }
}

/// A break-glass token's claims (`paybus token issue`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The name its holder gave (nobody vouches for it).
    pub sub: String,
    pub roles: Vec<Role>,
    /// Expiry, unix seconds.
    pub exp: u64,
    pub iat: u64,
}

/// Mints a break-glass token for `subject` with `roles`, valid for `ttl`.
pub fn issue(
    secret: &str,
    subject: &str,
    roles: &[Role],
    ttl: Duration,
) -> Result<String, jsonwebtoken::errors::Error> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let claims = Claims {
        sub: subject.to_owned(),
        roles: roles.to_vec(),
        exp: now.saturating_add(ttl.as_secs()),
        iat: now,
    };
    sign(secret, &claims)
}

/// Signs `claims` as they are (tests use it for an already expired token).
pub fn sign(secret: &str, claims: &Claims) -> Result<String, jsonwebtoken::errors::Error> {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
}

/// Checks a break-glass `token`: signature, algorithm and expiry (no leeway: an expired token
/// is refused).
pub fn verify(secret: &str, token: &str) -> Result<Claims, ApiError> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.leeway = 0;
    validation.set_required_spec_claims(&["exp", "sub"]);
    jsonwebtoken::decode::<Claims>(
        token,
        &DecodingKey::from_secret(secret.as_bytes()),
        &validation,
    )
    .map(|data| data.claims)
    .map_err(|error| match error.kind() {
        ErrorKind::ExpiredSignature => ApiError::BadToken("expired token"),
        _ => ApiError::BadToken("invalid token"),
    })
}

/// The middleware on every admin route.
pub(crate) async fn require_role(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // The console's own calls come with the session's caller already (`console::actions`):
    // only its role is checked. Nothing from outside can put one there.
    if let Some(caller) = request.extensions().get::<Caller>() {
        let needed = needed_role(request.method());
        if !caller.allows(needed) {
            return Err(ApiError::Forbidden(needed));
        }
        return Ok(next.run(request).await);
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim().to_owned());
    let caller = authorize(
        &state,
        presented.as_deref(),
        request.method(),
        request.uri().path(),
    )
    .await?;
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}

fn needed_role(method: &Method) -> Role {
    if matches!(*method, Method::GET | Method::HEAD) {
        Role::Ops
    } else {
        Role::Admin
    }
}

/// Who `token` names, whatever it may do.
pub(crate) async fn identify(state: &AppState, token: &str) -> Result<Caller, ApiError> {
    let algorithm = jsonwebtoken::decode_header(token)
        .map_err(|_| ApiError::BadToken("invalid token"))?
        .alg;
    if algorithm == Algorithm::HS256 {
        return break_glass(state, token);
    }
    let Some(verifier) = state.oidc.as_ref() else {
        return Err(ApiError::BadToken(
            "invalid token: no identity provider is configured (PAYBUS_OIDC_ISSUER)",
        ));
    };
    let vouched = verifier
        .verify(token)
        .await
        .map_err(|refused| match refused {
            Refused::ProviderUnavailable => {
                ApiError::Disabled("the identity provider cannot be reached; retry later")
            }
            Refused::Expired => ApiError::BadToken("expired token"),
            Refused::NotYetValid => ApiError::BadToken("invalid token: not valid yet"),
            Refused::Algorithm => {
                ApiError::BadToken("invalid token: its algorithm is not accepted")
            }
            Refused::UnknownKey => {
                ApiError::BadToken("invalid token: its key is not the provider's")
            }
            Refused::NotForUs => ApiError::BadToken(
                "invalid token: issued by another issuer or for another audience",
            ),
            Refused::Invalid => ApiError::BadToken("invalid token"),
        })?;
    Ok(Caller {
        actor: Actor::person(&vouched.issuer, &vouched.subject, &vouched.name),
        roles: vouched.roles,
        expires_at: vouched.expires_at,
    })
}

/// A break-glass token's holder, while break-glass is on.
fn break_glass(state: &AppState, token: &str) -> Result<Caller, ApiError> {
    let Some(secret) = state
        .admin_jwt_secret
        .as_ref()
        .filter(|_| state.break_glass)
    else {
        return Err(ApiError::BadToken(
            "break-glass tokens are not accepted here (PAYBUS_BREAK_GLASS is off): sign in \
             with the identity provider",
        ));
    };
    let claims = verify(secret.expose(), token)?;
    paybus_bus::metrics::record_break_glass();
    tracing::warn!(sub = %claims.sub, "break-glass token used");
    Ok(Caller {
        actor: Actor::break_glass(&claims.sub),
        roles: claims.roles,
        expires_at: claims.exp,
    })
}

/// May the bearer of `token` send `method` to `path`? The one rule, for the admin API and
/// the console: no way to authenticate configured 503, no or a bad token 401, a missing role
/// 403.
pub(crate) async fn authorize(
    state: &AppState,
    token: Option<&str>,
    method: &Method,
    path: &str,
) -> Result<Caller, ApiError> {
    if state.oidc.is_none() && !(state.break_glass && state.admin_jwt_secret.is_some()) {
        return Err(ApiError::Disabled(
            "admin API disabled: configure the identity provider (PAYBUS_OIDC_ISSUER), or \
             break-glass tokens (PAYBUS_BREAK_GLASS with PAYBUS_ADMIN_JWT_SECRET)",
        ));
    }
    let Some(token) = token else {
        return Err(ApiError::BadToken(
            "missing admin token: send Authorization: Bearer <token>",
        ));
    };
    let caller = identify(state, token).await.inspect_err(|error| {
        tracing::warn!(%path, %error, "admin request refused");
    })?;
    let needed = needed_role(method);
    if !caller.allows(needed) {
        tracing::warn!(actor = %caller.actor.name, %path, %needed, "admin request without the role");
        return Err(ApiError::Forbidden(needed));
    }
    tracing::debug!(actor = %caller.actor.name, "admin request");
    Ok(caller)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const SECRET: &str = "a-test-secret-of-at-least-32-bytes!!";

    #[test]
    fn a_token_round_trips_its_roles() {
        let token = issue(SECRET, "alice", &[Role::Ops], Duration::from_secs(60)).unwrap();
        let claims = verify(SECRET, &token).unwrap();
        assert_eq!(
            (claims.sub.as_str(), claims.roles),
            ("alice", vec![Role::Ops])
        );
        assert!(claims.exp > claims.iat);
    }

    #[test]
    fn tampered_foreign_and_expired_tokens_are_refused() {
        let token = issue(SECRET, "alice", &[Role::Ops], Duration::from_secs(60)).unwrap();
        let (head, rest) = token.split_once('.').unwrap();
        let (payload, signature) = rest.split_once('.').unwrap();
        // Claim ADMIN without re-signing.
        let forged = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            br#"{"sub":"alice","roles":["ADMIN"],"exp":99999999999,"iat":0}"#,
        );
        assert!(payload != forged);
        let tampered = format!("{head}.{forged}.{signature}");
        let other = issue(
            "another-secret-of-at-least-32-bytes!",
            "alice",
            &[Role::Admin],
            Duration::from_secs(60),
        )
        .unwrap();
        let expired = issue(SECRET, "alice", &[Role::Admin], Duration::ZERO).unwrap();
        std::thread::sleep(Duration::from_millis(1_100));
        for (token, expected) in [
            (tampered.as_str(), "invalid token"),
            (other.as_str(), "invalid token"),
            ("not.a.jwt", "invalid token"),
            (expired.as_str(), "expired token"),
        ] {
            assert_eq!(verify(SECRET, token).unwrap_err().to_string(), expected);
        }
    }

    #[test]
    fn the_none_algorithm_is_refused() {
        let header = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            br#"{"alg":"none","typ":"JWT"}"#,
        );
        let claims = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            br#"{"sub":"eve","roles":["ADMIN"],"exp":99999999999,"iat":0}"#,
        );
        assert!(verify(SECRET, &format!("{header}.{claims}.")).is_err());
    }

    #[test]
    fn admin_implies_ops() {
        let caller = |roles: Vec<Role>| Caller {
            actor: Actor::person("https://idp.example", "x", "x"),
            roles,
            expires_at: 0,
        };
        assert!(caller(vec![Role::Admin]).allows(Role::Ops));
        assert!(caller(vec![Role::Ops]).allows(Role::Ops));
        assert!(!caller(vec![Role::Ops]).allows(Role::Admin));
        assert!(!caller(vec![]).allows(Role::Ops));
    }
}
