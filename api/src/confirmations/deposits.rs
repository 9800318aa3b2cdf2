//! `POST /v1/admin/deposits`, `GET /v1/admin/deposits/{id}`. Creating a deposit stands in for
//! the chain monitor's detection (status DETECTED); its confirmation then goes through the
//! intake and confirm-deposit.

use axum::{
    Json,
    extract::{Path, State, rejection::PathRejection},
    http::StatusCode,
};
use paybus_confirmations::deposit::{self, Deposit, NewDeposit};
use serde::Deserialize;
use serde_json::{Value, json};

use super::withdrawals::internal;
use crate::{ApiError, AppState, admin::path_id, amount::Amount, body::JsonBody, chain};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewDepositRequest {
    partner_id: u64,
    currency: String,
    amount: Amount,
    /// Defaults to "0".
    #[serde(default)]
    fee: Option<Amount>,
    tx_hash: String,
    to_address: String,
}

#[utoipa::path(
    post,
    path = "/v1/admin/deposits",
    tag = "confirmations",
    security(("admin_token" = [])),
    request_body = NewDepositRequest,
    responses((status = 201, body = crate::responses::Created), crate::responses::AdminErrors)
)]
#[tracing::instrument(skip_all, fields(deposit_id, partner_id = request.partner_id))]
pub(super) async fn create(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<NewDepositRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let partner_id = chain::id("partner_id", request.partner_id)?;
    let currency = chain::currency(&request.currency)?;
    let amount = request.amount.value();
    let fee = request
        .fee
        .map_or(paybus_money::Amount::ZERO, Amount::value);
    if amount.is_zero() {
        return Err(ApiError::BadRequest(
            "amount must be greater than 0".to_owned(),
        ));
    }
    if fee > amount {
        return Err(ApiError::BadRequest(
            "fee must not exceed amount".to_owned(),
        ));
    }
    let new = NewDeposit {
        partner_id,
        currency,
        amount,
        fee,
        tx_hash: chain::identifier("tx_hash", &request.tx_hash, 128)?,
        to_address: chain::identifier("to_address", &request.to_address, 255)?,
    };
    let mut conn = state.pool.acquire().await?;
    let id = deposit::create(&mut conn, &new).await?;
    tracing::Span::current().record("deposit_id", id);
    tracing::info!(deposit_id = id, partner_id, tx_hash = %new.tx_hash, "deposit created");
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

/// The row as JSON (amounts as exact strings).
#[utoipa::path(
    get,
    path = "/v1/admin/deposits/{id}",
    tag = "confirmations",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses((status = 200, description = "The deposit", body = Object), crate::responses::AdminErrors)
)]
pub(super) async fn show(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Deposit>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    deposit::find(&mut conn, id)
        .await
        .map_err(internal)?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("deposit {id} not found")))
}
