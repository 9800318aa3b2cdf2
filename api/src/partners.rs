//! `POST /v1/admin/partners`, `GET /v1/admin/partners/{id}`. The webhook secret is write-only:
//! sealed at rest, returned once by the create that generated it, never by a read.

use axum::{
    Extension, Json, Router,
    extract::{Path, State, rejection::PathRejection},
    http::StatusCode,
    routing::{get, post},
};
use paybus_partners::{NewPartner, Partner, partner, webhook_secrets::WebhookSecretError};
use serde::Deserialize;

use crate::{ApiError, AppState, admin::path_id, auth::Caller, body::JsonBody};

/// This module's part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(create, show))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/partners", post(create))
        .route("/v1/admin/partners/{id}", get(show))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewPartnerRequest {
    name: String,
    /// Where deliver-webhook POSTs this partner's notifications; absent: no webhooks.
    #[serde(default)]
    webhook_url: Option<String>,
    /// Absent: one is generated and returned once in the answer (`whsec_<base64>`, Standard
    /// Webhooks). Present: a `whsec_<base64>` secret, or a legacy string of 16 to 255 bytes.
    #[serde(default)]
    webhook_secret: Option<String>,
}

/// The created partner; `webhook_secret` only when it was generated (shown this once).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
struct CreatedPartner {
    id: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    webhook_secret: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/admin/partners",
    tag = "partners",
    security(("admin_token" = [])),
    request_body = NewPartnerRequest,
    responses((status = 201, body = CreatedPartner), crate::responses::AdminErrors)
)]
#[tracing::instrument(skip_all, fields(partner_id))]
async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(request): JsonBody<NewPartnerRequest>,
) -> Result<(StatusCode, Json<CreatedPartner>), ApiError> {
    let sealer = state.sealer.as_ref().ok_or(ApiError::Disabled(
        "creating a partner is disabled: PAYBUS_SECRETS_KEY is not set",
    ))?;
    let new = NewPartner::new(
        &request.name,
        request.webhook_url.as_deref(),
        request.webhook_secret.as_deref(),
    )
    .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let mut conn = state.pool.acquire().await?;
    let created = partner::create(&mut conn, sealer, &new, &caller.actor)
        .await
        .map_err(|e| match e {
            WebhookSecretError::Database(e) => ApiError::Database(e),
            other => ApiError::Internal(Box::new(other)),
        })?;
    let id = created.id;
    tracing::Span::current().record("partner_id", id);
    tracing::info!(partner_id = id, name = new.name(), "partner created");
    Ok((
        StatusCode::CREATED,
        Json(CreatedPartner {
            id,
            webhook_secret: created.webhook_secret.map(|s| s.expose().to_owned()),
        }),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/admin/partners/{id}",
    tag = "partners",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses(
        (status = 200, description = "The partner (never its webhook secret)", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn show(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Partner>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    partner::find(&mut conn, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("partner {id} not found")))
}
