//! W1's routes (seed 000): create and read P2P deposit orders (buyers) and withdraw orders
//! (sellers' liquidity).
//!
//! `POST /v1/admin/p2p/deposit-orders` is the seed's `createAndMatch`. Which way the order goes
//! is the safety switch `PAYBUS_ASYNC_MATCHING_ENABLED` (seed 000 §0, principle 10):
//! - **off** (the default, also when unset or empty): the order is claimed as it is inserted
//!   and matched inside the request — reserve, quote call with no lock held, settle — and the
//!   answer carries the outcome (MATCHED, CANCELLED, or PENDING again with the attempt's
//!   `last_error` when it will be retried by match-deposit).
//! - **on**: `p2p.deposit_order.created` is published with the order (one transaction) and
//!   match-deposit matches it; the answer is the order as it stands when the answer is
//!   written — PENDING, or already MATCHING (or even MATCHED) when match-deposit was quicker
//!   than the read. A client polls `GET …/{id}` (or waits for the webhook) for the outcome.
//!
//! `POST /v1/admin/p2p/deposit-orders/{id}/recheck` (ADMIN) is ops' answer to an IN_DOUBT
//! order (createTrade's outcome stayed unknown after every check): PENDING, due now, so
//! match-deposit asks the quote service once more under the fill's key; 409 when the order is
//! not IN_DOUBT.
//!
//! A repeated `partner_order_ref` returns the order already created (200) instead of a second
//! one. Partners have no credentials of their own in paybus yet: these routes sit in the admin
//! API, where an ADMIN role token stands in for the partner's authentication (GETs need OPS).
//! Creating withdraw orders stands in for the partner's sell flow, for tests and the demo.

use axum::{
    Extension, Json, Router,
    extract::{Path, State, rejection::PathRejection},
    http::StatusCode,
    routing::{get, post},
};
use paybus_p2p::{
    CreateError, Created, DepositOrder, Handoff, MatchError, NewDepositOrder, NewWithdrawOrder,
    WithdrawOrder, deposit_order,
    matches::{self, Match},
    withdraw_order,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{
    ApiError, AppState, admin::path_id, amount::Amount, auth::Claims, body::JsonBody, chain,
};

/// `p2p_deposit_orders.partner_order_ref` is a VARCHAR(64).
const PARTNER_ORDER_REF_MAX: usize = 64;

/// W1's part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    create_deposit_order,
    show_deposit_order,
    recheck_deposit_order,
    create_withdraw_order,
    show_withdraw_order,
))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/p2p/deposit-orders", post(create_deposit_order))
        .route("/v1/admin/p2p/deposit-orders/{id}", get(show_deposit_order))
        .route(
            "/v1/admin/p2p/deposit-orders/{id}/recheck",
            post(recheck_deposit_order),
        )
        .route("/v1/admin/p2p/withdraw-orders", post(create_withdraw_order))
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

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewDepositOrderRequest {
    partner_id: u64,
    currency: String,
    amount: Amount,
    /// The partner's own id for the order (idempotency: a repeat returns the first).
    #[serde(default)]
    partner_order_ref: Option<String>,
}

/// A deposit order with its matches (amounts as exact strings).
#[derive(Debug, Serialize)]
struct DepositOrderView {
    #[serde(flatten)]
    order: DepositOrder,
    matches: Vec<Match>,
}

#[utoipa::path(
    post,
    path = "/v1/admin/p2p/deposit-orders",
    tag = "p2p",
    security(("admin_token" = [])),
    request_body = NewDepositOrderRequest,
    responses(
        (status = 201, description = "The order with its matches: matched inside the request (switch off), or as it stands once handed to match-deposit (switch on: PENDING, or already MATCHING / MATCHED)", body = Object),
        (status = 200, description = "The order already created for this partner_order_ref", body = Object),
        crate::responses::AdminErrors
    )
)]
#[tracing::instrument(skip_all, fields(deposit_order_id, partner_id = request.partner_id))]
async fn create_deposit_order(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<NewDepositOrderRequest>,
) -> Result<(StatusCode, Json<DepositOrderView>), ApiError> {
    let new = NewDepositOrder {
        partner_id: chain::id("partner_id", request.partner_id)?,
        partner_order_ref: request
            .partner_order_ref
            .as_deref()
            .map(|r| chain::identifier("partner_order_ref", r, PARTNER_ORDER_REF_MAX))
            .transpose()?,
        currency: chain::currency(&request.currency)?,
        amount: positive(request.amount)?,
    };
    let handoff = if state.async_matching_enabled {
        Handoff::Queued
    } else {
        if !state.matcher.can_trade() {
            return Err(ApiError::Disabled(
                "P2P matching is unavailable: PAYBUS_QUOTE_URL is not set",
            ));
        }
        Handoff::Inline
    };
    let created = state.matcher.create(&new, handoff).await?;
    let id = created.id();
    tracing::Span::current().record("deposit_order_id", id);
    let status = match created {
        Created::Existing(_) => StatusCode::OK,
        Created::Queued(_) | Created::Attempted { .. } => StatusCode::CREATED,
    };
    let view = deposit_order_view(&state, id).await?;
    tracing::info!(
        deposit_order_id = id,
        status = %view.order.status,
        ?handoff,
        "deposit order created"
    );
    Ok((status, Json(view)))
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
    Extension(claims): Extension<Claims>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<DepositOrderView>, ApiError> {
    let id = path_id(id)?;
    tracing::Span::current().record("deposit_order_id", id);
    if deposit_order::recheck(&state.pool, id, &claims.sub).await? {
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

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewWithdrawOrderRequest {
    partner_id: u64,
    currency: String,
    amount: Amount,
}

#[utoipa::path(
    post,
    path = "/v1/admin/p2p/withdraw-orders",
    tag = "p2p",
    security(("admin_token" = [])),
    request_body = NewWithdrawOrderRequest,
    responses((status = 201, description = "An OPEN withdraw order (a seller's liquidity)", body = Object), crate::responses::AdminErrors)
)]
#[tracing::instrument(skip_all, fields(withdraw_order_id, partner_id = request.partner_id))]
async fn create_withdraw_order(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<NewWithdrawOrderRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let new = NewWithdrawOrder {
        partner_id: chain::id("partner_id", request.partner_id)?,
        currency: chain::currency(&request.currency)?,
        amount: positive(request.amount)?,
    };
    let mut conn = state.pool.acquire().await?;
    let id = withdraw_order::create(&mut conn, &new).await?;
    tracing::Span::current().record("withdraw_order_id", id);
    tracing::info!(withdraw_order_id = id, partner_id = new.partner_id, amount = %new.amount, "withdraw order created");
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
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

fn positive(amount: Amount) -> Result<paybus_money::Amount, ApiError> {
    let value = amount.value();
    if value.is_zero() {
        return Err(ApiError::BadRequest(
            "amount must be greater than 0".to_owned(),
        ));
    }
    Ok(value)
}
