//! Partners as ops see them: `POST /v1/admin/partners`, `GET /v1/admin/partners[?after&limit]`,
//! `GET /v1/admin/partners/{id}` (each with its webhook endpoint's state: breaker, disabled by a
//! 410), `GET /v1/admin/partners/{id}/notifications[?before&limit]` (newest first, each with its
//! delivery attempts) and `POST …/notifications/{notification_id}/redeliver` (sent again under
//! the same id, so the same `webhook-id`). The webhook secret is write-only: sealed at rest,
//! returned once by the create that generated it, never by a read. Their API keys: [`keys`].

pub(crate) mod keys;

use axum::{
    Extension, Json, Router,
    extract::{
        Path, Query, State,
        rejection::{PathRejection, QueryRejection},
    },
    http::StatusCode,
    routing::{get, post},
};
use paybus_partners::{
    NewPartner, Partner,
    attempts::{self, DeliveryAttempt},
    notifications::{self, NotificationView, Redelivery},
    partner,
    webhook_secrets::WebhookSecretError,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::MySqlConnection;

use crate::{
    ApiError, AppState,
    admin::{path_id, path_ids},
    auth::Caller,
    body::JsonBody,
};

/// This module's part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(create, list, show, notifications_of, redeliver))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/partners", post(create).get(list))
        .route("/v1/admin/partners/{id}", get(show))
        .route(
            "/v1/admin/partners/{id}/notifications",
            get(notifications_of),
        )
        .route(
            "/v1/admin/partners/{id}/notifications/{notification_id}/redeliver",
            post(redeliver),
        )
}

const PAGE_DEFAULT: u32 = 50;
const PAGE_MAX: u32 = 200;

/// A page size asked for, 1 to 200 (default 50), or a 400 saying so.
pub(crate) fn page_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(PAGE_DEFAULT);
    if (1..=PAGE_MAX).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::BadRequest(format!(
            "limit must be 1 to {PAGE_MAX}"
        )))
    }
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

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only partners with a larger id (the `next_after` of the previous page).
    after: Option<u64>,
    /// Page size, 1–200 (default 50).
    limit: Option<u32>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/partners",
    tag = "partners",
    security(("admin_token" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "Partners by id, each with its webhook endpoint's state: `{partners, next_after}`", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let limit = page_limit(query.limit)?;
    let mut conn = state.pool.acquire().await?;
    let partners = partner::list(&mut conn, query.after.unwrap_or(0), limit).await?;
    let next_after = (partners.len() == limit as usize)
        .then(|| partners.last().map(|p| p.id))
        .flatten();
    Ok(Json(
        json!({ "partners": partners, "next_after": next_after }),
    ))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct NotificationsQuery {
    /// Only notifications with a smaller id (the `next_before` of the previous page).
    before: Option<u64>,
    /// Page size, 1–200 (default 50).
    limit: Option<u32>,
}

/// A notification with every POST made for it.
#[derive(Debug, Serialize)]
pub(crate) struct NotificationWithAttempts {
    #[serde(flatten)]
    pub notification: NotificationView,
    /// Oldest first.
    pub delivery_attempts: Vec<DeliveryAttempt>,
}

/// A page of `partner_id`'s notifications, newest first, each with its delivery attempts (two
/// index reads).
pub(crate) async fn notifications_with_attempts(
    conn: &mut MySqlConnection,
    partner_id: u64,
    before: Option<u64>,
    limit: u32,
) -> Result<Vec<NotificationWithAttempts>, sqlx::Error> {
    let page = notifications::list_for_partner(conn, partner_id, before, limit).await?;
    let ids: Vec<u64> = page.iter().map(|n| n.id).collect();
    let mut attempts = attempts::of_notifications(conn, partner_id, &ids).await?;
    Ok(page
        .into_iter()
        .map(|notification| {
            let (own, rest) = attempts
                .drain(..)
                .partition(|a| a.notification_id == notification.id);
            attempts = rest;
            NotificationWithAttempts {
                notification,
                delivery_attempts: own,
            }
        })
        .collect())
}

#[utoipa::path(
    get,
    path = "/v1/admin/partners/{id}/notifications",
    tag = "partners",
    security(("admin_token" = [])),
    params(
        ("id" = u64, Path, description = "The partner's id (a positive integer)"),
        NotificationsQuery
    ),
    responses(
        (status = 200, description = "The partner's notifications, newest first, each with its delivery attempts (time, status code, latency, error): `{notifications, next_before}`", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn notifications_of(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
    query: Result<Query<NotificationsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let partner_id = path_id(id)?;
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let limit = page_limit(query.limit)?;
    let mut conn = state.pool.acquire().await?;
    if partner::find(&mut conn, partner_id).await?.is_none() {
        return Err(ApiError::NotFound(format!(
            "partner {partner_id} not found"
        )));
    }
    let page = notifications_with_attempts(&mut conn, partner_id, query.before, limit).await?;
    let next_before = (page.len() == limit as usize)
        .then(|| page.last().map(|n| n.notification.id))
        .flatten();
    Ok(Json(
        json!({ "notifications": page, "next_before": next_before }),
    ))
}

#[utoipa::path(
    post,
    path = "/v1/admin/partners/{id}/notifications/{notification_id}/redeliver",
    tag = "partners",
    security(("admin_token" = [])),
    params(
        ("id" = u64, Path, description = "The partner's id (a positive integer)"),
        ("notification_id" = u64, Path, description = "The notification's id (its webhook-id)")
    ),
    responses(
        (status = 200, description = "Queued again under the same id (it was DELIVERED, FAILED or SKIPPED)", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn redeliver(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(u64, u64)>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let (partner_id, id) = path_ids(path)?;
    let mut uow = state.outbox.begin().await?;
    match notifications::redeliver(&mut uow, partner_id, id, &caller.actor).await? {
        Redelivery::Queued => {
            uow.commit().await?;
            tracing::info!(
                partner_id,
                notification_id = id,
                "notification queued for re-delivery by ops"
            );
            Ok(Json(json!({ "id": id, "status": "PENDING" })))
        }
        Redelivery::AlreadyPending => Err(ApiError::Conflict(format!(
            "notification {id} is PENDING already: it is being delivered"
        ))),
        Redelivery::NotFound => Err(ApiError::NotFound(format!(
            "partner {partner_id} has no notification {id}"
        ))),
    }
}
