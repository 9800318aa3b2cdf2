//! W1's admin routes (seed 000): support reads P2P deposit orders (buyers) and withdraw orders
//! (sellers' liquidity), and acts on an order in doubt. Partners create and read their own
//! orders through the partner API (`crate::partner_api::orders`, where the safety switch
//! `PAYBUS_ASYNC_MATCHING_ENABLED` is described).
//!
//! `POST /v1/admin/p2p/deposit-orders/{id}/recheck` (ADMIN) is ops' answer to an IN_DOUBT
//! order (createTrade's outcome stayed unknown after every check): PENDING, due now, so
//! match-deposit asks the quote service once more under the fill's key; 409 when the order is
//! not IN_DOUBT.

use axum::{
    Extension, Json, Router,
    extract::{Path, State, rejection::PathRejection},
    routing::{get, post},
};
use paybus_p2p::{
    CreateError, DepositOrder, MatchError, WithdrawOrder, deposit_order,
    matches::{self, Match},
    withdraw_order,
};
use serde::Serialize;

use crate::{ApiError, AppState, admin::path_id, amount::Amount, auth::Caller};

/// W1's part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(show_deposit_order, recheck_deposit_order, show_withdraw_order))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/p2p/deposit-orders/{id}", get(show_deposit_order))
        .route(
            "/v1/admin/p2p/deposit-orders/{id}/recheck",
            post(recheck_deposit_order),
        )
        .route(
            "/v1/admin/p2p/withdraw-orders/{id}",
            get(show_withdraw_order),
        )
}

impl From<MatchError> for ApiError {
    fn from(error: MatchError) -> Self {
        match error {
            MatchError::Database(e) => ApiError::Database(e),
            MatchError::Outbox(e) => ApiError::Outbox(e),
            other => ApiError::Internal(Box::new(other)),
        }
    }
}

impl From<CreateError> for ApiError {
    fn from(error: CreateError) -> Self {
        match error {
            CreateError::UnknownPartner(_) => ApiError::NotFound(error.to_string()),
            CreateError::Match(e) => e.into(),
        }
    }
}

/// A deposit order with its matches (amounts as exact strings).
#[derive(Debug, Serialize)]
pub(crate) struct DepositOrderView {
    #[serde(flatten)]
    pub(crate) order: DepositOrder,
    pub(crate) matches: Vec<Match>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/p2p/deposit-orders/{id}",
    tag = "p2p",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses((status = 200, description = "The deposit order with its matches", body = Object), crate::responses::AdminErrors)
)]
async fn show_deposit_order(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<DepositOrderView>, ApiError> {
    let id = path_id(id)?;
    Ok(Json(deposit_order_view(&state, id).await?))
}

#[utoipa::path(
    post,
    path = "/v1/admin/p2p/deposit-orders/{id}/recheck",
    tag = "p2p",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses(
        (status = 200, description = "IN_DOUBT -> PENDING, due now: match-deposit asks the quote service again under the fill's key", body = Object),
        crate::responses::AdminErrors
    )
)]
#[tracing::instrument(skip_all, fields(deposit_order_id))]
async fn recheck_deposit_order(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<DepositOrderView>, ApiError> {
    let id = path_id(id)?;
    tracing::Span::current().record("deposit_order_id", id);
    if deposit_order::recheck(&state.pool, id, &caller.actor).await? {
        tracing::info!(
            deposit_order_id = id,
            "IN_DOUBT order re-armed: its trade is asked about again"
        );
        return Ok(Json(deposit_order_view(&state, id).await?));
    }
    let view = deposit_order_view(&state, id).await?;
    Err(ApiError::Conflict(format!(
        "deposit order {id} is {}, not IN_DOUBT: nothing changed",
        view.order.status
    )))
}

async fn deposit_order_view(state: &AppState, id: u64) -> Result<DepositOrderView, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let order = deposit_order::find(&mut conn, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("deposit order {id} not found")))?;
    let matches = matches::of_deposit_order(&mut conn, id).await?;
    Ok(DepositOrderView { order, matches })
}

#[utoipa::path(
    get,
    path = "/v1/admin/p2p/withdraw-orders/{id}",
    tag = "p2p",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses((status = 200, description = "The withdraw order", body = Object), crate::responses::AdminErrors)
)]
async fn show_withdraw_order(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<WithdrawOrder>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    withdraw_order::find(&mut conn, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("withdraw order {id} not found")))
}

pub(crate) fn positive(amount: Amount) -> Result<paybus_money::Amount, ApiError> {
    let value = amount.value();
    if value.is_zero() {
        return Err(ApiError::BadRequest(
            "amount must be greater than 0".to_owned(),
        ));
    }
    Ok(value)
}
