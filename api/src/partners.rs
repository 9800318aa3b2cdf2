//! `POST /v1/admin/partners`, `GET /v1/admin/partners/{id}`. The webhook secret is write-only:
//! it is never returned.

use axum::{
    Extension, Json, Router,
    extract::{Path, State, rejection::PathRejection},
    http::StatusCode,
    routing::{get, post},
};
use paybus_partners::{NewPartner, Partner, partner};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{ApiError, AppState, admin::path_id, auth::Claims, body::JsonBody};

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
    webhook_secret: String,
}

#[utoipa::path(
    post,
    path = "/v1/admin/partners",
    tag = "partners",
    security(("admin_token" = [])),
    request_body = NewPartnerRequest,
    responses((status = 201, body = crate::responses::Created), crate::responses::AdminErrors)
)]
#[tracing::instrument(skip_all, fields(partner_id))]
async fn create(
    State(state): State<AppState>,
    Extension(claims): Extension<Claims>,
    JsonBody(request): JsonBody<NewPartnerRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let new = NewPartner::new(
        &request.name,
        request.webhook_url.as_deref(),
        &request.webhook_secret,
    )
    .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let mut conn = state.pool.acquire().await?;
    let id = partner::create(&mut conn, &new, &claims.sub).await?;
    tracing::Span::current().record("partner_id", id);
    tracing::info!(partner_id = id, name = new.name(), "partner created");
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
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
