//! The partner's webhook endpoint and signing secret, set by the partner itself: the URL (which
//! also re-enables an endpoint a `410 Gone` disabled), and a new secret with an overlap during
//! which both the old and the new one sign (the Standard Webhooks way: space-separated
//! signatures).

use std::time::Duration;

use axum::{Extension, Json, extract::State, http::StatusCode};
use paybus_partners::{
    partner::{self, SetWebhookUrlError},
    webhook_secrets::{self, WebhookSecretError},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::PartnerIdentity;
use crate::{ApiError, AppState, body::JsonBody};

/// How long the old secret keeps signing unless the request says otherwise.
const DEFAULT_OVERLAP_SECONDS: u64 = 24 * 3600;
const MAX_OVERLAP_SECONDS: u64 = 7 * 24 * 3600;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct WebhookRequest {
    /// An absolute http(s) URL, or null: no webhooks (notifications are then SKIPPED).
    url: Option<String>,
}

#[utoipa::path(
    put,
    path = "/v1/partner/webhook",
    tag = "partner",
    security(("partner_key" = [])),
    request_body = WebhookRequest,
    responses(
        (status = 200, description = "The partner with its new endpoint (re-enabled if a 410 had disabled it)", body = Object),
        crate::responses::PartnerErrors
    )
)]
pub(super) async fn set_url(
    State(state): State<AppState>,
    Extension(caller): Extension<PartnerIdentity>,
    JsonBody(request): JsonBody<WebhookRequest>,
) -> Result<Json<paybus_partners::Partner>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let actor = actor(&caller);
    match partner::set_webhook_url(&mut conn, caller.partner_id, request.url.as_deref(), &actor)
        .await
    {
        Ok(true) => {}
        Ok(false) => return Err(ApiError::NotFound("partner not found".to_owned())),
        Err(SetWebhookUrlError::Invalid(e)) => return Err(ApiError::BadRequest(e.to_string())),
        Err(SetWebhookUrlError::Database(e)) => return Err(e.into()),
    }
    partner::find(&mut conn, caller.partner_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound("partner not found".to_owned()))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RotateSecretRequest {
    /// How long the current secret keeps signing beside the new one (default 86400, at most
    /// 604800).
    #[serde(default)]
    overlap_seconds: Option<u64>,
}

#[utoipa::path(
    post,
    path = "/v1/partner/webhook/secret/rotate",
    tag = "partner",
    security(("partner_key" = [])),
    request_body = RotateSecretRequest,
    responses(
        (status = 201, description = "The new secret (`webhook_secret: whsec_…`, shown this once); the old one signs too until `old_secret_signs_until`", body = Object),
        crate::responses::PartnerErrors
    )
)]
pub(super) async fn rotate_secret(
    State(state): State<AppState>,
    Extension(caller): Extension<PartnerIdentity>,
    JsonBody(request): JsonBody<RotateSecretRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let sealer = state.sealer.as_ref().ok_or(ApiError::Disabled(
        "webhook secrets cannot be stored: PAYBUS_SECRETS_KEY is not set",
    ))?;
    let overlap = request.overlap_seconds.unwrap_or(DEFAULT_OVERLAP_SECONDS);
    if overlap > MAX_OVERLAP_SECONDS {
        return Err(ApiError::BadRequest(format!(
            "overlap_seconds must be at most {MAX_OVERLAP_SECONDS}"
        )));
    }
    let mut conn = state.pool.acquire().await?;
    let secret = webhook_secrets::rotate(
        &mut conn,
        sealer,
        caller.partner_id,
        Duration::from_secs(overlap),
        &actor(&caller),
    )
    .await
    .map_err(|error| match error {
        WebhookSecretError::PartnerNotFound(_) => {
            ApiError::NotFound("partner not found".to_owned())
        }
        WebhookSecretError::Database(e) => e.into(),
        other => ApiError::Internal(Box::new(other)),
    })?;
    let until = chrono::Utc::now() + chrono::Duration::seconds(overlap as i64);
    tracing::info!(
        partner_id = caller.partner_id,
        overlap_seconds = overlap,
        "webhook secret rotated"
    );
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "webhook_secret": secret.expose(),
            "old_secret_signs_until": until,
        })),
    ))
}

/// Who acted, for the ops log: the partner, by its key.
fn actor(caller: &PartnerIdentity) -> paybus_ops::actor::Actor {
    paybus_ops::actor::Actor::partner(&format!(
        "partner:{} (key {})",
        caller.partner_id, caller.key_id
    ))
}
