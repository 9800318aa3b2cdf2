//! People's tokens from the company's OpenID Connect provider: its discovery document, its
//! signing keys (JWKS) fetched and cached, and the checks a token passes before anyone acts on
//! it (docs/api.md, "Who may call").
//!
//! - Only asymmetric algorithms the provider publishes keys for (RS*, PS*, ES*, EdDSA): HS* and
//!   `none` are refused before any key is looked at, so the provider's public key can never
//!   serve as an HMAC secret (algorithm confusion).
//! - The key is the one its `kid` names. An unknown `kid` refetches the JWKS (a key rotated in
//!   works without a restart), at most once per [`REFETCH_AT_MOST_EVERY`] so made-up kids cannot
//!   flood the provider; the set is refetched once older than [`KEYS_FRESH_FOR`], so a key
//!   rotated out stops working.
//! - `iss`, `aud` (Cognito's access tokens: `client_id` and `token_use`), `exp` and `nbf` with
//!   [`LEEWAY`]. Roles come from one configured claim; a person is (`iss`, `sub`).

use std::{
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use jsonwebtoken::{
    Algorithm, DecodingKey, Validation, decode, decode_header, errors::ErrorKind, jwk::JwkSet,
};
use paybus_config::{ConfigError, Setting, Vars};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{Mutex, OnceCell};

use crate::role::Role;

pub const VAR_ISSUER: Setting = Setting {
    name: "PAYBUS_OIDC_ISSUER",
    default: "unset",
    about: "the OpenID Connect provider people sign in with (its issuer URL, e.g. \
            `https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_AbC` or \
            `https://login.example.com/realms/ops`); its discovery document and keys are \
            fetched from it. Unset: no person can sign in, and only break-glass tokens \
            (`PAYBUS_BREAK_GLASS`) reach the admin API",
};
pub const VAR_AUDIENCE: Setting = Setting {
    name: "PAYBUS_OIDC_AUDIENCE",
    default: "unset",
    about: "what the provider's access tokens for paybus name in `aud` (or, on Amazon Cognito, \
            the app client id in `client_id`); required with `PAYBUS_OIDC_ISSUER`",
};
pub const VAR_ROLES_CLAIM: Setting = Setting {
    name: "PAYBUS_OIDC_ROLES_CLAIM",
    default: "`groups`",
    about: "the token claim that carries a person's groups or roles (`groups`, `roles`, \
            `cognito:groups`, ...): a list, or a space-separated string",
};
pub const VAR_ADMIN_GROUPS: Setting = Setting {
    name: "PAYBUS_OIDC_ADMIN_GROUPS",
    default: "`paybus-admins`",
    about: "values of the roles claim that make a person an ADMIN (changes and reads), \
            comma-separated",
};
pub const VAR_OPS_GROUPS: Setting = Setting {
    name: "PAYBUS_OIDC_OPS_GROUPS",
    default: "`paybus-ops`",
    about: "values of the roles claim that make a person OPS (reads), comma-separated; a \
            person with neither role is refused (403, and at the console's sign-in)",
};

pub const VAR_CLI_CLIENT_ID: Setting = Setting {
    name: "PAYBUS_OIDC_CLI_CLIENT_ID",
    default: "`paybus-cli`",
    about: "the provider's public client the CLI signs in with (`paybus login`: the device \
            authorization grant), told to it by `GET /v1/auth/config`",
};

/// What the provider settings read.
pub const SETTINGS: &[Setting] = &[
    VAR_ISSUER,
    VAR_AUDIENCE,
    VAR_ROLES_CLAIM,
    VAR_ADMIN_GROUPS,
    VAR_OPS_GROUPS,
    VAR_CLI_CLIENT_ID,
];

/// Clock skew allowed on `exp` and `nbf`: the provider's clock and ours.
pub const LEEWAY: Duration = Duration::from_secs(30);
/// A kid the cached keys do not have refetches them at most this often.
pub const REFETCH_AT_MOST_EVERY: Duration = Duration::from_secs(5);
/// The cached keys are refetched once older than this (a key rotated out stops working).
pub const KEYS_FRESH_FOR: Duration = Duration::from_secs(300);
/// Every call to the provider (discovery, keys) gives up after this.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(5);

/// The provider and how its tokens map to paybus's roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcConfig {
    pub issuer: String,
    pub audience: String,
    pub roles_claim: String,
    pub admin_values: Vec<String>,
    pub ops_values: Vec<String>,
    /// The public client `paybus login` uses.
    pub cli_client_id: String,
}

impl OidcConfig {
    /// The provider's settings; `None` when no issuer is configured.
    pub fn read(vars: &Vars) -> Result<Option<Self>, ConfigError> {
        let Some(issuer) = vars.get(VAR_ISSUER) else {
            return Ok(None);
        };
        let issuer = issuer.trim().trim_end_matches('/').to_owned();
        if url::Url::parse(&issuer).is_err() {
            return Err(vars.error(VAR_ISSUER, &issuer, "the provider's issuer URL"));
        }
        let audience = vars.get(VAR_AUDIENCE).ok_or_else(|| {
            vars.error(
                VAR_AUDIENCE,
                "",
                "the audience of the provider's access tokens (required with PAYBUS_OIDC_ISSUER)",
            )
        })?;
        let list = |setting: Setting, default: &str| -> Vec<String> {
            vars.get(setting)
                .unwrap_or(default)
                .split(',')
                .map(str::trim)
                .filter(|value| !value.is_empty())
                .map(str::to_owned)
                .collect()
        };
        Ok(Some(Self {
            issuer,
            audience: audience.trim().to_owned(),
            roles_claim: vars
                .get(VAR_ROLES_CLAIM)
                .unwrap_or("groups")
                .trim()
                .to_owned(),
            admin_values: list(VAR_ADMIN_GROUPS, "paybus-admins"),
            ops_values: list(VAR_OPS_GROUPS, "paybus-ops"),
            cli_client_id: vars
                .get(VAR_CLI_CLIENT_ID)
                .unwrap_or("paybus-cli")
                .trim()
                .to_owned(),
        }))
    }

    /// The roles a token's claims give.
    pub fn roles_of(&self, claims: &Value) -> Vec<Role> {
        let values: Vec<&str> = match claims.get(&self.roles_claim) {
            Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
            Some(Value::String(text)) => text.split([' ', ',']).filter(|v| !v.is_empty()).collect(),
            _ => Vec::new(),
        };
        let mut roles = Vec::new();
        if values
            .iter()
            .any(|v| self.admin_values.iter().any(|a| a == v))
        {
            roles.push(Role::Admin);
        }
        if values
            .iter()
            .any(|v| self.ops_values.iter().any(|o| o == v))
        {
            roles.push(Role::Ops);
        }
        roles
    }
}

/// The parts of the provider's discovery document paybus uses.
#[derive(Debug, Clone, Deserialize)]
pub struct Discovery {
    pub issuer: String,
    pub jwks_uri: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    #[serde(default)]
    pub device_authorization_endpoint: Option<String>,
    #[serde(default)]
    pub end_session_endpoint: Option<String>,
}

/// Why a token was refused (each is a 401; the text is safe to show).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("invalid token")]
    Invalid,
    #[error("expired token")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token's signing algorithm is not accepted (an asymmetric one is needed)")]
    Algorithm,
    #[error("the token's key is unknown to the identity provider")]
    UnknownKey,
    #[error("the token was issued for another audience or by another issuer")]
    NotForUs,
    /// The provider could not be reached to read its keys: a 503, not the token's fault.
    #[error("the identity provider cannot be reached; retry later")]
    ProviderUnavailable,
}

/// A person the provider vouches for, as a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vouched {
    pub issuer: String,
    pub subject: String,
    /// `email`, else `preferred_username`, else the subject.
    pub name: String,
    pub roles: Vec<Role>,
    /// `exp`, unix seconds.
    pub expires_at: u64,
}

struct Keys {
    set: JwkSet,
    fetched_at: Instant,
}

/// Verifies the provider's tokens; cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
}

struct Inner {
    config: OidcConfig,
    http: reqwest::Client,
    discovery: OnceCell<Discovery>,
    keys: Mutex<Option<Keys>>,
}

impl Verifier {
    pub fn new(config: OidcConfig) -> Self {
        let http = reqwest::Client::builder()
            .timeout(PROVIDER_TIMEOUT)
            .build()
            .unwrap_or_default();
        Self {
            inner: Arc::new(Inner {
                config,
                http,
                discovery: OnceCell::new(),
                keys: Mutex::new(None),
            }),
        }
    }

    pub fn config(&self) -> &OidcConfig {
        &self.inner.config
    }

    /// The provider's discovery document, fetched once (a failure is tried again next time).
    pub async fn discovery(&self) -> Result<&Discovery, Refused> {
        self.inner
            .discovery
            .get_or_try_init(|| async {
                let url = format!(
                    "{}/.well-known/openid-configuration",
                    self.inner.config.issuer
                );
                let discovery: Discovery = self.get_json(&url).await?;
                if discovery.issuer.trim_end_matches('/') != self.inner.config.issuer {
                    tracing::error!(
                        configured = %self.inner.config.issuer,
                        published = %discovery.issuer,
                        "the provider's discovery document names another issuer"
                    );
                    return Err(Refused::ProviderUnavailable);
                }
                Ok(discovery)
            })
            .await
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, Refused> {
        let answer = self.inner.http.get(url).send().await.map_err(|error| {
            tracing::warn!(%url, %error, "the identity provider cannot be reached");
            Refused::ProviderUnavailable
        })?;
        if !answer.status().is_success() {
            tracing::warn!(%url, status = answer.status().as_u16(), "the identity provider refused");
            return Err(Refused::ProviderUnavailable);
        }
        answer.json().await.map_err(|error| {
            tracing::warn!(%url, %error, "the identity provider answered something unreadable");
            Refused::ProviderUnavailable
        })
    }

    /// The key `kid` names: from the cached set while it is fresh and has it, else from a
    /// refetched one (at most once per [`REFETCH_AT_MOST_EVERY`]).
    async fn key(&self, kid: &str) -> Result<jsonwebtoken::jwk::Jwk, Refused> {
        let mut keys = self.inner.keys.lock().await;
        let fresh = keys
            .as_ref()
            .is_some_and(|k| k.fetched_at.elapsed() < KEYS_FRESH_FOR);
        if fresh && let Some(jwk) = keys.as_ref().and_then(|k| k.set.find(kid)) {
            return Ok(jwk.clone());
        }
        let may_refetch = keys
            .as_ref()
            .is_none_or(|k| !fresh || k.fetched_at.elapsed() >= REFETCH_AT_MOST_EVERY);
        if may_refetch {
            let jwks_uri = self.discovery().await?.jwks_uri.clone();
            let set: JwkSet = self.get_json(&jwks_uri).await?;
            tracing::info!(keys = set.keys.len(), "identity provider keys fetched");
            *keys = Some(Keys {
                set,
                fetched_at: Instant::now(),
            });
        }
        keys.as_ref()
            .and_then(|k| k.set.find(kid))
            .cloned()
            .ok_or(Refused::UnknownKey)
    }

    /// The algorithm `token` is signed with and the provider's key it names: an asymmetric
    /// algorithm, and the key's own when the key names one.
    async fn signing_key(&self, token: &str) -> Result<(Algorithm, DecodingKey), Refused> {
        let header = decode_header(token).map_err(|_| Refused::Invalid)?;
        if !is_asymmetric(header.alg) {
            return Err(Refused::Algorithm);
        }
        let kid = header.kid.ok_or(Refused::UnknownKey)?;
        let jwk = self.key(&kid).await?;
        // A key published for one algorithm verifies tokens of that one only.
        if let Some(published) = jwk.common.key_algorithm
            && Algorithm::from_str(&published.to_string()).ok() != Some(header.alg)
        {
            return Err(Refused::Algorithm);
        }
        let key = DecodingKey::from_jwk(&jwk).map_err(|_| Refused::UnknownKey)?;
        Ok((header.alg, key))
    }

    /// The person `token` names, if the provider signed it for paybus and it holds now.
    pub async fn verify(&self, token: &str) -> Result<Vouched, Refused> {
        let (alg, key) = self.signing_key(token).await?;
        let config = &self.inner.config;
        let mut validation = Validation::new(alg);
        validation.leeway = LEEWAY.as_secs();
        validation.validate_nbf = true;
        validation.set_issuer(&[&config.issuer]);
        validation.set_required_spec_claims(&["exp", "iss", "sub"]);
        // Amazon Cognito's access tokens have no `aud`: their app client is `client_id`.
        validation.validate_aud = false;
        let claims = decode::<Value>(token, &key, &validation)
            .map_err(|error| match error.kind() {
                ErrorKind::ExpiredSignature => Refused::Expired,
                ErrorKind::ImmatureSignature => Refused::NotYetValid,
                ErrorKind::InvalidIssuer => Refused::NotForUs,
                _ => Refused::Invalid,
            })?
            .claims;
        if !names_audience(&claims, &config.audience) {
            return Err(Refused::NotForUs);
        }
        let text = |name: &str| claims.get(name).and_then(Value::as_str).map(str::to_owned);
        let subject = text("sub").ok_or(Refused::Invalid)?;
        Ok(Vouched {
            issuer: config.issuer.clone(),
            name: text("email")
                .or_else(|| text("preferred_username"))
                .unwrap_or_else(|| subject.clone()),
            subject,
            roles: config.roles_of(&claims),
            expires_at: claims.get("exp").and_then(Value::as_u64).unwrap_or(0),
        })
    }
}

pub(crate) mod route {
    use axum::{Json, Router, extract::State, routing::get};
    use serde::Serialize;

    use crate::{ApiError, AppState};

    #[derive(utoipa::OpenApi)]
    #[openapi(paths(config))]
    pub(crate) struct Doc;

    pub(crate) fn routes() -> Router<AppState> {
        Router::new().route("/v1/auth/config", get(config))
    }

    /// What a client needs to sign a person in (public: it holds no secret).
    #[derive(Debug, Serialize, utoipa::ToSchema)]
    struct SignInConfig {
        /// The identity provider's issuer; its discovery document is at
        /// `{issuer}/.well-known/openid-configuration`.
        issuer: String,
        /// The audience (resource indicator) of access tokens for this API.
        audience: String,
        /// The public client of the CLI (device authorization grant).
        cli_client_id: String,
    }

    #[utoipa::path(
        get,
        path = "/v1/auth/config",
        tag = "service",
        responses(
            (status = 200, description = "The identity provider people sign in with, for `paybus login`", body = SignInConfig),
            (status = 404, description = "No identity provider is configured (break-glass tokens only)", body = crate::responses::ErrorBody)
        )
    )]
    async fn config(State(state): State<AppState>) -> Result<Json<SignInConfig>, ApiError> {
        let provider = state.oidc.as_ref().ok_or_else(|| {
            ApiError::NotFound(
                "no identity provider is configured here (PAYBUS_OIDC_ISSUER): use a \
                 break-glass token (PAYBUS_TOKEN)"
                    .to_owned(),
            )
        })?;
        let config = provider.config();
        Ok(Json(SignInConfig {
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            cli_client_id: config.cli_client_id.clone(),
        }))
    }
}

/// Whether a token of this algorithm is signed with a private key (never a shared secret).
fn is_asymmetric(alg: Algorithm) -> bool {
    matches!(
        alg,
        Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512
            | Algorithm::ES256
            | Algorithm::ES384
            | Algorithm::EdDSA
    )
}

/// `aud` names `audience` (a string or a list); or, with no `aud`, an Amazon Cognito access
/// token of app client `audience`.
fn names_audience(claims: &Value, audience: &str) -> bool {
    match claims.get("aud") {
        Some(Value::String(aud)) => aud == audience,
        Some(Value::Array(auds)) => auds.iter().any(|aud| aud.as_str() == Some(audience)),
        None => {
            claims.get("client_id").and_then(Value::as_str) == Some(audience)
                && claims.get("token_use").and_then(Value::as_str) == Some("access")
        }
        Some(_) => false,
    }
}

/// What a verified ID token says of the person who just signed in (OpenID Connect Core
/// §3.1.3.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdToken {
    pub subject: String,
    /// `exp`, unix seconds.
    pub expires_at: u64,
}

impl Verifier {
    /// The ID token of an authorization code sign-in: signed by a key of the provider's JWKS
    /// with an asymmetric algorithm, `iss` the provider, `aud` naming `client_id` (and `azp`
    /// it when `aud` names others too), `exp` not passed, and `nonce` the one the sign-in
    /// sent, so a token minted for another sign-in cannot be slipped into this one.
    pub async fn verify_id_token(
        &self,
        token: &str,
        client_id: &str,
        nonce: &str,
    ) -> Result<IdToken, Refused> {
        let (alg, key) = self.signing_key(token).await?;
        let mut validation = Validation::new(alg);
        validation.leeway = LEEWAY.as_secs();
        validation.set_issuer(&[&self.inner.config.issuer]);
        validation.set_audience(&[client_id]);
        validation.set_required_spec_claims(&["exp", "iss", "sub", "aud"]);
        let claims = decode::<Value>(token, &key, &validation)
            .map_err(|error| match error.kind() {
                ErrorKind::ExpiredSignature => Refused::Expired,
                ErrorKind::InvalidIssuer | ErrorKind::InvalidAudience => Refused::NotForUs,
                _ => Refused::Invalid,
            })?
            .claims;
        let several_audiences = claims
            .get("aud")
            .and_then(Value::as_array)
            .is_some_and(|audiences| audiences.len() > 1);
        if several_audiences && claims.get("azp").and_then(Value::as_str) != Some(client_id) {
            return Err(Refused::NotForUs);
        }
        if claims.get("nonce").and_then(Value::as_str) != Some(nonce) {
            return Err(Refused::Invalid);
        }
        Ok(IdToken {
            subject: claims
                .get("sub")
                .and_then(Value::as_str)
                .ok_or(Refused::Invalid)?
                .to_owned(),
            expires_at: claims.get("exp").and_then(Value::as_u64).unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<Option<OidcConfig>, ConfigError> {
        OidcConfig::read(&Vars::new(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
        ))
    }

    #[test]
    fn no_issuer_is_no_provider_and_an_issuer_needs_an_audience() {
        assert_eq!(config(&[]).unwrap(), None);
        assert_eq!(
            config(&[(VAR_ISSUER.name, "https://idp.example/")])
                .unwrap_err()
                .variable,
            VAR_AUDIENCE.name
        );
        let read = config(&[
            (VAR_ISSUER.name, "https://idp.example/"),
            (VAR_AUDIENCE.name, "urn:paybus"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(read.issuer, "https://idp.example");
        assert_eq!(read.admin_values, ["paybus-admins"]);
    }

    #[test]
    fn roles_come_from_the_configured_claim_as_a_list_or_a_string() {
        let read = config(&[
            (VAR_ISSUER.name, "https://idp.example"),
            (VAR_AUDIENCE.name, "urn:paybus"),
            (VAR_ROLES_CLAIM.name, "cognito:groups"),
            (VAR_ADMIN_GROUPS.name, "admins, root"),
            (VAR_OPS_GROUPS.name, "ops"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            read.roles_of(&json!({"cognito:groups": ["staff", "root"]})),
            [Role::Admin]
        );
        assert_eq!(
            read.roles_of(&json!({"cognito:groups": "ops staff"})),
            [Role::Ops]
        );
        assert!(read.roles_of(&json!({"groups": ["admins"]})).is_empty());
        assert!(
            read.roles_of(&json!({"cognito:groups": ["staff"]}))
                .is_empty()
        );
    }

    #[test]
    fn only_asymmetric_algorithms_are_accepted() {
        for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
            assert!(!is_asymmetric(alg));
        }
        assert!(is_asymmetric(Algorithm::RS256) && is_asymmetric(Algorithm::EdDSA));
    }

    #[test]
    fn the_audience_is_aud_or_a_cognito_access_tokens_client() {
        assert!(names_audience(&json!({"aud": "urn:p"}), "urn:p"));
        assert!(names_audience(&json!({"aud": ["x", "urn:p"]}), "urn:p"));
        assert!(!names_audience(&json!({"aud": "x"}), "urn:p"));
        assert!(names_audience(
            &json!({"client_id": "urn:p", "token_use": "access"}),
            "urn:p"
        ));
        assert!(!names_audience(
            &json!({"client_id": "urn:p", "token_use": "id"}),
            "urn:p"
        ));
    }
}
