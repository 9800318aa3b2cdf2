//! Partner API keys: `pbk_<key id>_<secret>`, created by an ADMIN and shown once, stored only
//! as HMAC-SHA256(`PAYBUS_PARTNER_KEY_HASH_KEY`, secret) (the migration's header comment has
//! the states).
//!
//! Why a keyed hash and not argon2: the secret is 32 random bytes, so no guess can find it and
//! a slow hash buys nothing against a dump — while it would cost every partner request tens of
//! milliseconds of CPU. The server key on top means a dump alone cannot even test a stolen
//! candidate key. The key id in the prefix finds the row; the comparison is constant-time.
//!
//! ADMIN routes: `POST /v1/admin/partners/{id}/api-keys` (create), `GET …/api-keys` (list,
//! never a secret), `POST …/api-keys/{key_id}/revoke` (refused from the next request on),
//! `POST …/api-keys/{key_id}/rotate` (a new key; the old one keeps working for
//! `overlap_seconds`, then not). Each is in the ops log.

use std::time::Duration;

use axum::{
    Extension, Json, Router,
    extract::{Path, State, rejection::PathRejection},
    http::StatusCode,
    routing::post,
};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use paybus_config::Secret;
use paybus_ops::{
    actor::Actor,
    ops_log::{self, Entry},
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::Sha256;
use sqlx::{Connection, MySqlConnection};

use crate::{
    ApiError, AppState,
    admin::{path_id, path_ids},
    auth::Caller,
    body::JsonBody,
};

/// Every key starts with it, so a leaked key is recognisable (secret scanners, logs).
pub const PREFIX: &str = "pbk_";
/// How long a rotated-out key keeps working unless the request says otherwise.
pub const DEFAULT_OVERLAP: Duration = Duration::from_secs(24 * 3600);
/// The longest overlap a rotation may ask for (7 days).
pub const MAX_OVERLAP_SECONDS: u64 = 7 * 24 * 3600;
const SECRET_BYTES: usize = 32;
const LABEL_MAX_CHARS: usize = 190;

/// A presented key taken apart (not yet checked).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Presented<'a> {
    pub key_id: u64,
    pub secret: &'a str,
}

/// `pbk_<id>_<secret>`, or `None` for anything else.
pub(crate) fn parse(key: &str) -> Option<Presented<'_>> {
    let (id, secret) = key.strip_prefix(PREFIX)?.split_once('_')?;
    let key_id = id.parse::<u64>().ok().filter(|id| *id > 0)?;
    if !id.bytes().all(|b| b.is_ascii_digit()) || secret.len() < 32 {
        return None;
    }
    Some(Presented { key_id, secret })
}

pub(crate) fn hash(hash_key: &Secret, secret: &str) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(hash_key.expose().as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(secret.as_bytes());
    mac
}

/// A new secret: 32 bytes from the operating system's generator, base64url.
fn new_secret() -> Result<String, ApiError> {
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::Internal(Box::new(e)))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// A key as an ADMIN sees it: never its secret or hash.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub(crate) struct KeyView {
    pub id: u64,
    pub partner_id: u64,
    pub label: Option<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
}

const KEY_COLUMNS: &str =
    "id, partner_id, label, created_by, created_at, expires_at, revoked_at, last_used_at";

/// A key just made: its view and the whole key, shown this once.
#[derive(Serialize)]
pub(crate) struct Issued {
    #[serde(flatten)]
    pub view: KeyView,
    /// `pbk_<id>_<secret>`: shown once, never stored.
    pub key: String,
}

/// Issues a key for `partner_id` in the caller's transaction, in the ops log
/// (`partner_api_key.create`); 404 when there is no such partner.
async fn issue(
    conn: &mut MySqlConnection,
    hash_key: &Secret,
    partner_id: u64,
    label: Option<String>,
    actor: &Actor,
) -> Result<Issued, ApiError> {
    let exists: Option<u64> = sqlx::query_scalar("SELECT id FROM partners WHERE id = ?")
        .bind(partner_id)
        .fetch_optional(&mut *conn)
        .await?;
    if exists.is_none() {
        return Err(ApiError::NotFound(format!(
            "partner {partner_id} not found"
        )));
    }
    let secret = new_secret()?;
    let digest = hash(hash_key, &secret).finalize().into_bytes();
    let id = sqlx::query(
        "INSERT INTO partner_api_keys (partner_id, secret_hash, label, created_by) \
         VALUES (?, ?, ?, ?)",
    )
    .bind(partner_id)
    .bind(digest.to_vec())
    .bind(label)
    .bind(actor.name.chars().take(100).collect::<String>())
    .execute(&mut *conn)
    .await?
    .last_insert_id();
    let view = find(conn, partner_id, id)
        .await?
        .ok_or(ApiError::Database(sqlx::Error::RowNotFound))?;
    log(conn, actor, "partner_api_key.create", &view).await?;
    Ok(Issued {
        view,
        key: format!("{PREFIX}{id}_{secret}"),
    })
}

async fn find(
    conn: &mut MySqlConnection,
    partner_id: u64,
    id: u64,
) -> Result<Option<KeyView>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {KEY_COLUMNS} FROM partner_api_keys WHERE id = ? AND partner_id = ?"
    )))
    .bind(id)
    .bind(partner_id)
    .fetch_optional(conn)
    .await
}

/// This module's part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(create, list, revoke, rotate))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/partners/{id}/api-keys", post(create).get(list))
        .route(
            "/v1/admin/partners/{id}/api-keys/{key_id}/revoke",
            post(revoke),
        )
        .route(
            "/v1/admin/partners/{id}/api-keys/{key_id}/rotate",
            post(rotate),
        )
}

fn hash_key(state: &AppState) -> Result<&Secret, ApiError> {
    state
        .partner_api
        .key_hash_key
        .as_ref()
        .ok_or(ApiError::Disabled(
            "partner API keys are unavailable: PAYBUS_PARTNER_KEY_HASH_KEY is not set",
        ))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewKeyRequest {
    /// What the key is for (e.g. "production, eu-west"), for whoever reads the list.
    #[serde(default)]
    label: Option<String>,
}

fn label(raw: Option<&str>) -> Result<Option<String>, ApiError> {
    match raw.map(str::trim) {
        None | Some("") => Ok(None),
        Some(label) if label.chars().count() > LABEL_MAX_CHARS => Err(ApiError::BadRequest(
            format!("label is longer than {LABEL_MAX_CHARS} characters"),
        )),
        Some(label) if label.chars().any(char::is_control) => Err(ApiError::BadRequest(
            "label must not contain control characters".to_owned(),
        )),
        Some(label) => Ok(Some(label.to_owned())),
    }
}

#[utoipa::path(
    post,
    path = "/v1/admin/partners/{id}/api-keys",
    tag = "partners",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The partner's id (a positive integer)")),
    request_body = NewKeyRequest,
    responses(
        (status = 201, description = "The key's record and the key itself (`key`: shown this once, never again)", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<u64>, PathRejection>,
    JsonBody(request): JsonBody<NewKeyRequest>,
) -> Result<(StatusCode, Json<Issued>), ApiError> {
    let partner_id = path_id(id)?;
    let hash_key = hash_key(&state)?;
    let label = label(request.label.as_deref())?;
    let mut conn = state.pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let issued = issue(&mut tx, hash_key, partner_id, label, &caller.actor).await?;
    tx.commit().await?;
    tracing::info!(
        partner_id,
        key_id = issued.view.id,
        "partner API key created"
    );
    Ok((StatusCode::CREATED, Json(issued)))
}

async fn log(
    conn: &mut MySqlConnection,
    actor: &Actor,
    action: &str,
    key: &KeyView,
) -> Result<(), sqlx::Error> {
    ops_log::append(
        conn,
        &Entry {
            actor,
            action,
            subject: &format!("partner_api_key:{}", key.id),
            detail: &json!({
                "partner_id": key.partner_id,
                "label": key.label,
                "expires_at": key.expires_at,
                "revoked_at": key.revoked_at,
            }),
        },
    )
    .await
    .map(drop)
}

#[utoipa::path(
    get,
    path = "/v1/admin/partners/{id}/api-keys",
    tag = "partners",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The partner's id (a positive integer)")),
    responses(
        (status = 200, description = "The partner's keys, newest first (never a secret)", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn list(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let partner_id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    let keys = of_partner(&mut conn, partner_id).await?;
    Ok(Json(json!({ "partner_id": partner_id, "keys": keys })))
}

/// `partner_id`'s keys, newest first (never a secret).
pub(crate) async fn of_partner(
    conn: &mut MySqlConnection,
    partner_id: u64,
) -> Result<Vec<KeyView>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {KEY_COLUMNS} FROM partner_api_keys WHERE partner_id = ? ORDER BY id DESC"
    )))
    .bind(partner_id)
    .fetch_all(conn)
    .await
}

#[utoipa::path(
    post,
    path = "/v1/admin/partners/{id}/api-keys/{key_id}/revoke",
    tag = "partners",
    security(("admin_token" = [])),
    params(
        ("id" = u64, Path, description = "The partner's id (a positive integer)"),
        ("key_id" = u64, Path, description = "The key's id (the number after `pbk_`)")
    ),
    responses(
        (status = 200, description = "The key, revoked: refused from the next request on (revoking it again changes nothing)", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn revoke(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(u64, u64)>, PathRejection>,
) -> Result<Json<KeyView>, ApiError> {
    let (partner_id, key_id) = path_ids(path)?;
    let mut conn = state.pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let revoked = sqlx::query(
        "UPDATE partner_api_keys SET revoked_at = NOW(6) \
         WHERE id = ? AND partner_id = ? AND revoked_at IS NULL",
    )
    .bind(key_id)
    .bind(partner_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let key = find(&mut tx, partner_id, key_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("partner {partner_id} has no key {key_id}")))?;
    if revoked == 1 {
        log(&mut tx, &caller.actor, "partner_api_key.revoke", &key).await?;
        tracing::info!(partner_id, key_id, "partner API key revoked");
    }
    tx.commit().await?;
    Ok(Json(key))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct RotateRequest {
    /// How long the old key keeps working (default 86400, at most 604800; 0: not at all).
    #[serde(default)]
    overlap_seconds: Option<u64>,
    /// The new key's label (default: the old one's).
    #[serde(default)]
    label: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/admin/partners/{id}/api-keys/{key_id}/rotate",
    tag = "partners",
    security(("admin_token" = [])),
    params(
        ("id" = u64, Path, description = "The partner's id (a positive integer)"),
        ("key_id" = u64, Path, description = "The key to rotate out")
    ),
    request_body = RotateRequest,
    responses(
        (status = 201, description = "The new key (`key`: shown this once) and the old key's record with its `expires_at`", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn rotate(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(u64, u64)>, PathRejection>,
    JsonBody(request): JsonBody<RotateRequest>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let (partner_id, key_id) = path_ids(path)?;
    let hash_key = hash_key(&state)?;
    let overlap = request.overlap_seconds.unwrap_or(DEFAULT_OVERLAP.as_secs());
    if overlap > MAX_OVERLAP_SECONDS {
        return Err(ApiError::BadRequest(format!(
            "overlap_seconds must be at most {MAX_OVERLAP_SECONDS}"
        )));
    }
    let mut conn = state.pool.acquire().await?;
    let mut tx = conn.begin().await?;
    // The old key's end is only ever brought forward: a second rotation cannot extend it.
    let usable = sqlx::query(
        "UPDATE partner_api_keys \
         SET expires_at = LEAST(COALESCE(expires_at, NOW(6) + INTERVAL ? SECOND), \
                                NOW(6) + INTERVAL ? SECOND) \
         WHERE id = ? AND partner_id = ? AND revoked_at IS NULL \
           AND (expires_at IS NULL OR expires_at > NOW(6))",
    )
    .bind(overlap)
    .bind(overlap)
    .bind(key_id)
    .bind(partner_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let Some(old) = find(&mut tx, partner_id, key_id).await? else {
        return Err(ApiError::NotFound(format!(
            "partner {partner_id} has no key {key_id}"
        )));
    };
    if usable == 0 {
        return Err(ApiError::Conflict(format!(
            "key {key_id} is revoked or expired already: create a new key instead"
        )));
    }
    let label = label(request.label.as_deref().or(old.label.as_deref()))?;
    log(&mut tx, &caller.actor, "partner_api_key.rotate_out", &old).await?;
    let issued = issue(&mut tx, hash_key, partner_id, label, &caller.actor).await?;
    tx.commit().await?;
    tracing::info!(
        partner_id,
        old_key_id = key_id,
        new_key_id = issued.view.id,
        overlap_seconds = overlap,
        "partner API key rotated"
    );
    Ok((
        StatusCode::CREATED,
        Json(json!({ "new": issued, "old": old })),
    ))
}

/// What the partner API knows of the caller after its key checked out.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct KeyRow {
    pub partner_id: u64,
    pub secret_hash: Vec<u8>,
    pub usable: bool,
    pub stale_use: bool,
    pub rate_limit_per_second: Option<u32>,
    pub rate_limit_burst: Option<u32>,
}

/// The key's row joined with its partner's limits, or `None` for an unknown key id. Read from
/// the database on every request, so a revocation counts from the next request on.
pub(crate) async fn lookup(
    conn: &mut MySqlConnection,
    key_id: u64,
) -> Result<Option<KeyRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT k.partner_id, k.secret_hash, \
                (k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > NOW(6))) \
                    AS usable, \
                (k.last_used_at IS NULL OR k.last_used_at < NOW(6) - INTERVAL 60 SECOND) \
                    AS stale_use, \
                p.rate_limit_per_second, p.rate_limit_burst \
         FROM partner_api_keys k JOIN partners p ON p.id = k.partner_id \
         WHERE k.id = ?",
    )
    .bind(key_id)
    .fetch_optional(conn)
    .await
}

/// Records that the key was used (at most once a minute: [`lookup`]'s `stale_use`).
pub(crate) async fn touch(conn: &mut MySqlConnection, key_id: u64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE partner_api_keys SET last_used_at = NOW(6) \
         WHERE id = ? AND (last_used_at IS NULL OR last_used_at < NOW(6) - INTERVAL 60 SECOND)",
    )
    .bind(key_id)
    .execute(conn)
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_into_id_and_secret() {
        let secret = "A".repeat(43);
        assert_eq!(
            parse(&format!("pbk_12_{secret}")),
            Some(Presented {
                key_id: 12,
                secret: &secret
            })
        );
        // The secret may itself hold underscores (base64url).
        let with_underscore = format!("a_b{}", "c".repeat(40));
        assert_eq!(
            parse(&format!("pbk_3_{with_underscore}")).map(|p| p.secret),
            Some(with_underscore.as_str())
        );
        for bad in [
            String::new(),
            format!("pbk__{secret}"),
            format!("pbk_0_{secret}"),
            format!("pbk_+1_{secret}"),
            format!("pbk_x_{secret}"),
            "pbk_1_short".to_owned(),
            format!("sk_1_{secret}"),
        ] {
            assert_eq!(parse(&bad), None, "{bad}");
        }
    }

    #[test]
    fn a_secret_is_32_random_bytes() {
        let (a, b) = (new_secret().ok(), new_secret().ok());
        assert_eq!(a.as_ref().map(String::len), Some(43));
        assert_ne!(a, b);
    }

    #[test]
    fn the_hash_depends_on_the_server_key() {
        let digest = |key: &str| {
            hash(&Secret::new(key), "the secret")
                .finalize()
                .into_bytes()
                .to_vec()
        };
        assert_ne!(
            digest("one server key, 32 bytes at least!"),
            digest("another server key of 32 bytes..")
        );
    }
}
