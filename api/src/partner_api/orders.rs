//! W1's partner routes (seed 000): a partner creates and reads its own P2P deposit orders
//! (buyers) and withdraw orders (sellers' liquidity); support reads them, and acts on one in
//! doubt, through the admin API (`crate::p2p`).
//!
//! `POST /v1/partner/p2p/deposit-orders` is the seed's `createAndMatch`, and the safety switch
//! `PAYBUS_ASYNC_MATCHING_ENABLED` (seed 000 §0, principle 10) decides where it matches: **off**
//! (the default, also unset or empty) claims the order as it is inserted and matches it inside
//! the request, the answer carrying the outcome; **on** publishes `p2p.deposit_order.created`
//! with the order and answers it as it stands (PENDING, or further when match-deposit was
//! quicker). A repeated `partner_order_ref` returns the order already created (200); an
//! `Idempotency-Key` replays the first answer ([`super::idempotency`]) and is kept on the order
//! itself, so a create run twice under it makes one order.

use axum::{
    Extension, Json,
    extract::{Path, State, rejection::PathRejection},
    http::StatusCode,
};
use paybus_p2p::{
    Created, Handoff, Inserted, NewDepositOrder, NewWithdrawOrder, WithdrawOrder, deposit_order,
    matches, withdraw_order,
};
use serde::Deserialize;

use super::{PartnerIdentity, idempotency::IdempotencyKey};
use crate::{
    ApiError, AppState,
    admin::path_id,
    amount::Amount,
    body::JsonBody,
    chain,
    p2p::{DepositOrderView, positive},
};

/// `p2p_deposit_orders.partner_order_ref` is a VARCHAR(64).
const PARTNER_ORDER_REF_MAX: usize = 64;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewDepositOrderRequest {
    currency: String,
    amount: Amount,
    /// The partner's own id for the order (a repeat returns the first).
    #[serde(default)]
    partner_order_ref: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/partner/p2p/deposit-orders",
    tag = "partner",
    security(("partner_key" = [])),
    params(super::IdempotencyKeyHeader),
    request_body = NewDepositOrderRequest,
    responses(
        (status = 201, description = "The order with its matches: matched inside the request (switch off), or as it stands once handed to match-deposit (switch on: PENDING, or already MATCHING / MATCHED)", body = Object),
        (status = 200, description = "The order already created for this partner_order_ref (or under this Idempotency-Key)", body = Object),
        crate::responses::PartnerErrors
    )
)]
#[tracing::instrument(skip_all, fields(deposit_order_id, partner_id = partner.partner_id))]
pub(super) async fn create_deposit_order(
    State(state): State<AppState>,
    Extension(partner): Extension<PartnerIdentity>,
    key: Option<Extension<IdempotencyKey>>,
    JsonBody(request): JsonBody<NewDepositOrderRequest>,
) -> Result<(StatusCode, Json<DepositOrderView>), ApiError> {
    let new = NewDepositOrder {
        partner_id: partner.partner_id,
        partner_order_ref: request
            .partner_order_ref
            .as_deref()
            .map(|r| chain::identifier("partner_order_ref", r, PARTNER_ORDER_REF_MAX))
            .transpose()?,
        idempotency_key: key.map(|Extension(IdempotencyKey(key))| key),
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
    let view = deposit_order_view(&state, partner.partner_id, id).await?;
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
    path = "/v1/partner/p2p/deposit-orders/{id}",
    tag = "partner",
    security(("partner_key" = [])),
    params(("id" = u64, Path, description = "The order's id (a positive integer)")),
    responses(
        (status = 200, description = "The deposit order with its matches", body = Object),
        crate::responses::PartnerErrors
    )
)]
pub(super) async fn show_deposit_order(
    State(state): State<AppState>,
    Extension(partner): Extension<PartnerIdentity>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<DepositOrderView>, ApiError> {
    let id = path_id(id)?;
    Ok(Json(
        deposit_order_view(&state, partner.partner_id, id).await?,
    ))
}

/// The partner's order with its matches; another partner's is "not found" (its existence is
/// not told).
async fn deposit_order_view(
    state: &AppState,
    partner_id: u64,
    id: u64,
) -> Result<DepositOrderView, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let order = deposit_order::find_for_partner(&mut conn, partner_id, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("deposit order {id} not found")))?;
    let matches = matches::of_deposit_order(&mut conn, id).await?;
    Ok(DepositOrderView { order, matches })
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewWithdrawOrderRequest {
    currency: String,
    amount: Amount,
}

#[utoipa::path(
    post,
    path = "/v1/partner/p2p/withdraw-orders",
    tag = "partner",
    security(("partner_key" = [])),
    params(super::IdempotencyKeyHeader),
    request_body = NewWithdrawOrderRequest,
    responses(
        (status = 201, description = "An OPEN withdraw order (a seller's liquidity)", body = Object),
        (status = 200, description = "The withdraw order already created under this Idempotency-Key", body = Object),
        crate::responses::PartnerErrors
    )
)]
#[tracing::instrument(skip_all, fields(withdraw_order_id, partner_id = partner.partner_id))]
pub(super) async fn create_withdraw_order(
    State(state): State<AppState>,
    Extension(partner): Extension<PartnerIdentity>,
    key: Option<Extension<IdempotencyKey>>,
    JsonBody(request): JsonBody<NewWithdrawOrderRequest>,
) -> Result<(StatusCode, Json<WithdrawOrder>), ApiError> {
    let new = NewWithdrawOrder {
        partner_id: partner.partner_id,
        currency: chain::currency(&request.currency)?,
        amount: positive(request.amount)?,
        idempotency_key: key.map(|Extension(IdempotencyKey(key))| key),
    };
    let mut conn = state.pool.acquire().await?;
    let (status, id) = match withdraw_order::create(&mut conn, &new).await? {
        Inserted::New(id) => (StatusCode::CREATED, id),
        Inserted::Existing(id) => (StatusCode::OK, id),
    };
    tracing::Span::current().record("withdraw_order_id", id);
    tracing::info!(withdraw_order_id = id, amount = %new.amount, "withdraw order created");
    let order = withdraw_order::find_for_partner(&mut conn, partner.partner_id, id)
        .await?
        .ok_or(ApiError::Database(sqlx::Error::RowNotFound))?;
    Ok((status, Json(order)))
}

#[utoipa::path(
    get,
    path = "/v1/partner/p2p/withdraw-orders/{id}",
    tag = "partner",
    security(("partner_key" = [])),
    params(("id" = u64, Path, description = "The order's id (a positive integer)")),
    responses(
        (status = 200, description = "The withdraw order", body = Object),
        crate::responses::PartnerErrors
    )
)]
pub(super) async fn show_withdraw_order(
    State(state): State<AppState>,
    Extension(partner): Extension<PartnerIdentity>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<WithdrawOrder>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    withdraw_order::find_for_partner(&mut conn, partner.partner_id, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("withdraw order {id} not found")))
}
