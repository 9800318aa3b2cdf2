//! A partner's notifications (the webhooks paybus owes it): the list, one with every delivery
//! attempt (time, status code, latency, error), and a re-delivery under the same id — the same
//! `webhook-id`, which the partner deduplicates on.

use axum::{
    Extension, Json,
    extract::{Path, Query, State, rejection::PathRejection},
};
use paybus_ops::actor::Actor;
use paybus_partners::{
    attempts,
    notifications::{self, Redelivery},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::PartnerIdentity;
use crate::{
    ApiError, AppState,
    admin::path_id,
    partners::{NotificationWithAttempts, page_limit},
};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ListQuery {
    /// Only notifications with a smaller id (the `next_before` of the previous page).
    before: Option<u64>,
    /// Page size, 1–200 (default 50).
    limit: Option<u32>,
}

#[utoipa::path(
    get,
    path = "/v1/partner/notifications",
    tag = "partner",
    security(("partner_key" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "The partner's notifications, newest first: `{notifications, next_before}`", body = Object),
        crate::responses::PartnerErrors
    )
)]
pub(super) async fn list(
    State(state): State<AppState>,
    Extension(partner): Extension<PartnerIdentity>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let limit = page_limit(query.limit)?;
    let mut conn = state.pool.acquire().await?;
    let page =
        notifications::list_for_partner(&mut conn, partner.partner_id, query.before, limit).await?;
    let next_before = (page.len() == limit as usize)
        .then(|| page.last().map(|n| n.id))
        .flatten();
    Ok(Json(
        json!({ "notifications": page, "next_before": next_before }),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/partner/notifications/{id}",
    tag = "partner",
    security(("partner_key" = [])),
    params(("id" = u64, Path, description = "The notification's id (its webhook-id)")),
    responses(
        (status = 200, description = "The notification with its delivery attempts (time, status code, latency, error)", body = Object),
        crate::responses::PartnerErrors
    )
)]
pub(super) async fn show(
    State(state): State<AppState>,
    Extension(partner): Extension<PartnerIdentity>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<NotificationWithAttempts>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    let notification = notifications::find_for_partner(&mut conn, partner.partner_id, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("notification {id} not found")))?;
    let delivery_attempts = attempts::of_notification(&mut conn, partner.partner_id, id).await?;
    Ok(Json(NotificationWithAttempts {
        notification,
        delivery_attempts,
    }))
}

#[utoipa::path(
    post,
    path = "/v1/partner/notifications/{id}/redeliver",
    tag = "partner",
    security(("partner_key" = [])),
    params(
        ("id" = u64, Path, description = "The notification's id (its webhook-id)"),
        super::IdempotencyKeyHeader
    ),
    responses(
        (status = 200, description = "Queued again under the same id (it was DELIVERED, FAILED or SKIPPED)", body = Object),
        crate::responses::PartnerErrors
    )
)]
pub(super) async fn redeliver(
    State(state): State<AppState>,
    Extension(partner): Extension<PartnerIdentity>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = path_id(id)?;
    let mut uow = state.outbox.begin().await?;
    let actor = Actor::partner(&format!("partner:{}", partner.partner_id));
    match notifications::redeliver(&mut uow, partner.partner_id, id, &actor).await? {
        Redelivery::Queued => {
            uow.commit().await?;
            tracing::info!(
                partner_id = partner.partner_id,
                notification_id = id,
                "notification queued for re-delivery"
            );
            Ok(Json(json!({ "id": id, "status": "PENDING" })))
        }
        Redelivery::AlreadyPending => Err(ApiError::Conflict(format!(
            "notification {id} is PENDING already: it is being delivered"
        ))),
        Redelivery::NotFound => Err(ApiError::NotFound(format!("notification {id} not found"))),
    }
}
