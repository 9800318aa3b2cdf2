//! Who may call the admin API: bearer tokens that carry roles and expire (docs/operations.md).
//!
//! A token is an HS256 JWT signed with `PAYBUS_ADMIN_JWT_SECRET`, with claims `sub` (who),
//! `roles` (`OPS` reads, `ADMIN` changes and reads) and `exp`. `paybus token issue` mints
//! one. Reads (GET, HEAD) need OPS or ADMIN, anything else ADMIN. A missing, malformed,
//! tampered or expired token is 401; a valid token without the role is 403; no secret
//! configured closes the admin API (503). Only HS256 is accepted (never `alg: none`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::{
    extract::{Request, State},
    http::{Method, header},
    middleware::Next,
    response::Response,
};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, errors::ErrorKind};
use serde::{Deserialize, Serialize};

use crate::{ApiError, AppState};

paybus_platform::column_enum! {
    /// What a token lets its bearer do.
    pub enum Role {
        /// Reads: the views of every workflow, dead letters, the audit.
        Ops,
        /// Changes (create, retry, replay, suspend, ...) and reads.
        Admin,
    }
}

/// A token's claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Who holds it (for the log).
    pub sub: String,
    pub roles: Vec<Role>,
    /// Expiry, unix seconds.
    pub exp: u64,
    pub iat: u64,
}

impl Claims {
    fn allows(&self, needed: Role) -> bool {
        self.roles.contains(&Role::Admin) || self.roles.contains(&needed)
    }
}

/// Mints a token for `subject` with `roles`, valid for `ttl`.
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

/// Checks `token`: signature, algorithm and expiry (no leeway: an expired token is refused).
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
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let claims = authorize(&state, presented, request.method(), request.uri().path())?;
    // Handlers that record who acted (dead-letter replays) read the claims.
    request.extensions_mut().insert(claims);
    Ok(next.run(request).await)
}

/// May the bearer of `token` send `method` to `path`? The one rule, for the admin API and
/// the console: no secret configured 503, no or a bad token 401, a missing role 403.
pub(crate) fn authorize(
    state: &AppState,
    token: Option<&str>,
    method: &Method,
    path: &str,
) -> Result<Claims, ApiError> {
    let Some(secret) = state.admin_jwt_secret.as_ref() else {
        return Err(ApiError::Disabled(
            "admin API disabled: PAYBUS_ADMIN_JWT_SECRET is not set",
        ));
    };
    let Some(token) = token else {
        return Err(ApiError::BadToken(
            "missing admin token: send Authorization: Bearer <token>",
        ));
    };
    let claims = verify(secret.expose(), token).inspect_err(|_| {
        tracing::warn!(%path, "admin request with a bad token");
    })?;
    let needed = if matches!(*method, Method::GET | Method::HEAD) {
        Role::Ops
    } else {
        Role::Admin
    };
    if !claims.allows(needed) {
        tracing::warn!(sub = %claims.sub, %path, %needed, "admin request without the role");
        return Err(ApiError::Forbidden(needed));
    }
    tracing::debug!(sub = %claims.sub, "admin request");
    Ok(claims)
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
        let claims = |roles: Vec<Role>| Claims {
            sub: "x".into(),
            roles,
            exp: 0,
            iat: 0,
        };
        assert!(claims(vec![Role::Admin]).allows(Role::Ops));
        assert!(claims(vec![Role::Ops]).allows(Role::Ops));
        assert!(!claims(vec![Role::Ops]).allows(Role::Admin));
        assert!(!claims(vec![]).allows(Role::Ops));
    }
}
