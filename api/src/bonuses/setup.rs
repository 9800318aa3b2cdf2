//! Members, charge requests and charge events through the admin API. Ops create events; the
//! member and charge-request routes stand in for the app backend (where members sign up and
//! start paying), so the whole W3 flow can be driven by hand and by the demo.
//!
//! - `POST /v1/admin/members {nickname}` → 201 `{id}`; `GET /v1/admin/members/{id}`: the
//!   balances.
//! - `POST /v1/admin/charges {member_id, cans, price, payment_gateway, container?, method}` →
//!   201 `{id}` (payment status REQUEST; the container defaults to the gateway's:
//!   GOOGLE_IAP aos, APPLE_IAP ios, the others pg); `GET /v1/admin/charges/{id}` with its bonus
//!   jobs.
//! - `POST /v1/admin/charge-events {title, add_percent, start_at, end_at, active?,
//!   available_count?}` → 201 `{id}`; `GET /v1/admin/charge-events/{id}`.

use axum::{
    Json,
    extract::{Path, State, rejection::PathRejection},
    http::StatusCode,
};
use chrono::{DateTime, Utc};
use paybus_bonuses::{
    charge::{self, Charge, Container, NewChargeRequest, PaymentGateway, RequestError},
    event::{self, ChargeEvent, NewChargeEvent},
    job::{self, BonusJob},
    member::{self, Member},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{ApiError, AppState, admin::path_id, amount::Amount, body::JsonBody};

/// `members.nickname`, `charges.method` and `charge_events.title` are `VARCHAR(100)`.
const TEXT_MAX_CHARS: usize = 100;

/// A short text field: not blank, at most 100 characters (trimmed).
fn text(field: &str, value: &str) -> Result<String, ApiError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(ApiError::BadRequest(format!("{field} must not be empty")));
    }
    if value.chars().count() > TEXT_MAX_CHARS {
        return Err(ApiError::BadRequest(format!(
            "{field} is longer than {TEXT_MAX_CHARS} characters"
        )));
    }
    Ok(value.to_owned())
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewMemberRequest {
    nickname: String,
}

#[utoipa::path(
    post,
    path = "/v1/admin/members",
    tag = "bonuses",
    security(("admin_token" = [])),
    request_body = NewMemberRequest,
    responses((status = 201, body = crate::responses::Created), crate::responses::AdminErrors)
)]
pub(super) async fn create_member(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<NewMemberRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let nickname = text("nickname", &request.nickname)?;
    let mut conn = state.pool.acquire().await?;
    let id = member::create(&mut conn, &nickname).await?;
    tracing::info!(member_id = id, "member created");
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

#[utoipa::path(
    get,
    path = "/v1/admin/members/{id}",
    tag = "bonuses",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses((status = 200, description = "The member's balances", body = Object), crate::responses::AdminErrors)
)]
pub(super) async fn show_member(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Member>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    member::find(&mut conn, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("member {id} not found")))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewChargeRequestBody {
    member_id: u64,
    cans: i32,
    price: Amount,
    /// PG, PAYVERSE, HECTO, GOOGLE_IAP or APPLE_IAP.
    #[schema(value_type = String)]
    payment_gateway: PaymentGateway,
    /// The gateway's by default.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    container: Option<Container>,
    method: String,
}

#[utoipa::path(
    post,
    path = "/v1/admin/charges",
    tag = "bonuses",
    security(("admin_token" = [])),
    request_body = NewChargeRequestBody,
    responses((status = 201, body = crate::responses::Created), crate::responses::AdminErrors)
)]
pub(super) async fn create_charge(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<NewChargeRequestBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let member_id = crate::chain::id("member_id", request.member_id)?;
    if request.cans <= 0 {
        return Err(ApiError::BadRequest(
            "cans must be a positive whole number".to_owned(),
        ));
    }
    let new = NewChargeRequest {
        member_id,
        cans: request.cans,
        price: request.price.value(),
        payment_gateway: request.payment_gateway,
        container: request
            .container
            .unwrap_or_else(|| request.payment_gateway.default_container()),
        method: text("method", &request.method)?,
    };
    let mut conn = state.pool.acquire().await?;
    let id = charge::create_request(&mut conn, &new)
        .await
        .map_err(|error| match error {
            RequestError::UnknownMember(_) => ApiError::NotFound(error.to_string()),
            RequestError::Database(e) => ApiError::Database(e),
        })?;
    tracing::info!(charge_id = id, member_id, cans = new.cans, gateway = %new.payment_gateway,
        "charge requested");
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

/// A charge with the bonus jobs its completion created.
#[derive(Debug, Serialize)]
pub(super) struct ChargeView {
    #[serde(flatten)]
    charge: Charge,
    bonus_jobs: Vec<BonusJob>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/charges/{id}",
    tag = "bonuses",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses((status = 200, description = "The charge with its bonus jobs", body = Object), crate::responses::AdminErrors)
)]
pub(super) async fn show_charge(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<ChargeView>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    let charge = charge::find(&mut conn, id)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::NotFound(format!("charge {id} not found")))?;
    let bonus_jobs = job::for_charge(&mut conn, id)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(ChargeView { charge, bonus_jobs }))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewEventRequest {
    title: String,
    add_percent: i32,
    #[schema(value_type = String, format = DateTime)]
    start_at: DateTime<Utc>,
    #[schema(value_type = String, format = DateTime)]
    end_at: DateTime<Utc>,
    #[serde(default = "active_by_default")]
    active: bool,
    #[serde(default = "once_per_member")]
    available_count: i32,
}

fn active_by_default() -> bool {
    true
}

fn once_per_member() -> i32 {
    1
}

/// What a `TIMESTAMP(6)` column holds: `1970-01-01 00:00:01` to `2038-01-19 03:14:07` UTC.
fn in_timestamp_range(field: &str, at: DateTime<Utc>) -> Result<DateTime<Utc>, ApiError> {
    let (first, last) = (1, 2_147_483_647);
    if (first..=last).contains(&at.timestamp()) {
        Ok(at)
    } else {
        Err(ApiError::BadRequest(format!(
            "{field} must be between 1970-01-01T00:00:01Z and 2038-01-19T03:14:07Z"
        )))
    }
}

#[utoipa::path(
    post,
    path = "/v1/admin/charge-events",
    tag = "bonuses",
    security(("admin_token" = [])),
    request_body = NewEventRequest,
    responses((status = 201, body = crate::responses::Created), crate::responses::AdminErrors)
)]
pub(super) async fn create_event(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<NewEventRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if !(1..=1_000).contains(&request.add_percent) {
        return Err(ApiError::BadRequest(
            "add_percent must be a whole percent from 1 to 1000".to_owned(),
        ));
    }
    if request.available_count < 1 {
        return Err(ApiError::BadRequest(
            "available_count must be at least 1".to_owned(),
        ));
    }
    let new = NewChargeEvent {
        title: text("title", &request.title)?,
        add_percent: request.add_percent,
        start_at: in_timestamp_range("start_at", request.start_at)?,
        end_at: in_timestamp_range("end_at", request.end_at)?,
        is_active: request.active,
        available_count: request.available_count,
    };
    if new.end_at <= new.start_at {
        return Err(ApiError::BadRequest(
            "end_at must be after start_at".to_owned(),
        ));
    }
    let mut conn = state.pool.acquire().await?;
    let id = event::create(&mut conn, &new).await?;
    tracing::info!(event_id = id, title = %new.title, add_percent = new.add_percent,
        "charge event created");
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

#[utoipa::path(
    get,
    path = "/v1/admin/charge-events/{id}",
    tag = "bonuses",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses((status = 200, description = "The charge event", body = Object), crate::responses::AdminErrors)
)]
pub(super) async fn show_event(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<ChargeEvent>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    event::find(&mut conn, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("charge event {id} not found")))
}
