//! The secrets paybus seals at rest (`paybus_config::sealed`), rotated by ADMIN:
//!
//! - `POST /v1/admin/secrets/rotate-key`: after `PAYBUS_SECRETS_KEY` became a new key (the old
//!   one moved to `PAYBUS_SECRETS_OLD_KEYS`) in this process's configuration, re-seals every
//!   partner webhook secret still under another key with the current one
//!   (`paybus_partners::webhook_secrets::rotate_key`) and answers the rows per key before and
//!   after. Safe to repeat or run from several processes at once (each row's UPDATE is
//!   conditional on its old key id). A row under a key this process does not hold stops the
//!   run, naming the key: 409. Without `PAYBUS_SECRETS_KEY`: 503. One ops-log row per run
//!   (`secrets.rotate_key`).

use axum::{Extension, Json, Router, extract::State, routing::post};
use paybus_config::sealed::{SealError, Sealer};
use paybus_ops::ops_log;
use paybus_partners::webhook_secrets::{self, WebhookSecretError};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::MySqlConnection;

use crate::{ApiError, AppState, auth::Caller};

#[derive(utoipa::OpenApi)]
#[openapi(paths(rotate_key))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new().route("/v1/admin/secrets/rotate-key", post(rotate_key))
}

/// Rows sealed under one key.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeyRows {
    pub key_id: String,
    /// Whether it is this process's `PAYBUS_SECRETS_KEY`.
    pub current: bool,
    pub rows: i64,
}

/// What a rotation did: the answer of `POST /v1/admin/secrets/rotate-key` (`paybus secrets
/// rotate-key` reads it).
#[derive(Debug, Serialize, Deserialize)]
pub struct Rotation {
    /// The current key's id: every row re-sealed is under it.
    pub key_id: String,
    /// Rows this run re-sealed.
    pub resealed: u64,
    /// Rows another run re-sealed first.
    pub raced: u64,
    pub before: Vec<KeyRows>,
    pub after: Vec<KeyRows>,
}

#[utoipa::path(
    post,
    path = "/v1/admin/secrets/rotate-key",
    tag = "partners",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "`{key_id, resealed, raced, before, after}`: every partner webhook secret under an old key re-sealed with the current one; rows per key before and after", body = Object),
        crate::responses::AdminErrors
    )
)]
/// Re-seals the partner webhook secrets under an old key with the current one.
///
/// The current key is this process's `PAYBUS_SECRETS_KEY`, the old ones its
/// `PAYBUS_SECRETS_OLD_KEYS`. 409 when a row is under a key the process does not hold (or does
/// not open); 503 when `PAYBUS_SECRETS_KEY` is unset.
#[tracing::instrument(skip_all)]
async fn rotate_key(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Rotation>, ApiError> {
    let sealer = state.sealer.as_ref().ok_or(ApiError::Disabled(
        "PAYBUS_SECRETS_KEY is not set: there is no current key to re-seal with",
    ))?;
    let mut conn = state.pool.acquire().await?;
    let before = rows_per_key(&mut conn, sealer).await?;
    let done = webhook_secrets::rotate_key(&mut conn, sealer)
        .await
        .map_err(|error| match error {
            WebhookSecretError::Seal(
                refused @ (SealError::UnknownKey { .. } | SealError::DoesNotOpen { .. }),
            ) => ApiError::Conflict(refused.to_string()),
            WebhookSecretError::Database(e) => ApiError::Database(e),
            other => ApiError::Internal(Box::new(other)),
        })?;
    ops_log::append(
        &mut conn,
        &ops_log::Entry {
            actor: &caller.actor,
            action: "secrets.rotate_key",
            subject: &format!("secrets_key:{}", sealer.current_key_id()),
            detail: &json!({
                "table": "partner_webhook_secrets",
                "resealed": done.resealed,
                "raced": done.raced,
            }),
        },
    )
    .await?;
    let after = rows_per_key(&mut conn, sealer).await?;
    Ok(Json(Rotation {
        key_id: sealer.current_key_id().to_owned(),
        resealed: done.resealed,
        raced: done.raced,
        before,
        after,
    }))
}

async fn rows_per_key(
    conn: &mut MySqlConnection,
    sealer: &Sealer,
) -> Result<Vec<KeyRows>, ApiError> {
    Ok(webhook_secrets::count_by_key(conn)
        .await?
        .into_iter()
        .map(|(key_id, rows)| KeyRows {
            current: sealer.is_current(&key_id),
            key_id,
            rows,
        })
        .collect())
}
