//! `POST /v1/admin/deposits`, `GET /v1/admin/deposits/{id}`. Creating a deposit stands in for
//! the chain monitor's detection (status DETECTED); its confirmation then goes through the
//! intake and confirm-deposit.

use axum::{
    Json,
    extract::{Path, State, rejection::PathRejection},
    http::StatusCode,
};
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::path_id;
use crate::{
    ApiError, AppState,
    amount::{self, Amount},
    body::JsonBody,
    chain,
    error::{is_foreign_key_violation, is_unique_violation},
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewDeposit {
    partner_id: u64,
    currency: String,
    amount: Amount,
    /// Defaults to "0".
    #[serde(default)]
    fee: Option<Amount>,
    tx_hash: String,
    to_address: String,
}

#[tracing::instrument(skip_all, fields(deposit_id, partner_id = new.partner_id))]
pub(super) async fn create(
    State(state): State<AppState>,
    JsonBody(new): JsonBody<NewDeposit>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let partner_id = chain::id("partner_id", new.partner_id)?;
    let currency = chain::currency(&new.currency)?;
    let amount = new.amount.value();
    let fee = new.fee.map_or(Decimal::ZERO, Amount::value);
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
    let tx_hash = chain::identifier("tx_hash", &new.tx_hash, 128)?;
    let to_address = chain::identifier("to_address", &new.to_address, 255)?;

    let inserted = sqlx::query(
        "INSERT INTO deposits (partner_id, currency, amount, fee, tx_hash, to_address) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(partner_id)
    .bind(&currency)
    .bind(amount)
    .bind(fee)
    .bind(&tx_hash)
    .bind(&to_address)
    .execute(&state.pool)
    .await;
    let id = match inserted {
        Ok(done) => done.last_insert_id(),
        Err(e) if is_foreign_key_violation(&e) => {
            return Err(ApiError::NotFound(format!(
                "partner {partner_id} not found"
            )));
        }
        Err(e) if is_unique_violation(&e) => {
            let existing: Option<u64> = sqlx::query_scalar(
                "SELECT id FROM deposits WHERE active_tx_key = CONCAT(?, '|', ?)",
            )
            .bind(&tx_hash)
            .bind(&to_address)
            .fetch_optional(&state.pool)
            .await?;
            let which = existing.map_or_else(String::new, |id| format!(" (deposit {id})"));
            return Err(ApiError::Conflict(format!(
                "an active deposit with this tx_hash and to_address already exists{which}"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    tracing::Span::current().record("deposit_id", id);
    tracing::info!(deposit_id = id, partner_id, %tx_hash, "deposit created");
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

#[derive(sqlx::FromRow)]
struct Row {
    id: u64,
    partner_id: u64,
    currency: String,
    amount: Decimal,
    fee: Decimal,
    tx_hash: String,
    to_address: String,
    status: String,
    confirmed_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// The row as JSON, amounts as strings.
#[derive(Debug, Serialize)]
pub(super) struct Deposit {
    id: u64,
    partner_id: u64,
    currency: String,
    amount: String,
    fee: String,
    tx_hash: String,
    to_address: String,
    status: String,
    confirmed_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

pub(super) async fn show(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Deposit>, ApiError> {
    let id = path_id(id)?;
    let row = sqlx::query_as::<_, Row>(
        "SELECT id, partner_id, currency, amount, fee, tx_hash, to_address, status, \
         confirmed_at, created_at, updated_at FROM deposits WHERE id = ?",
    )
    .bind(id)
    .fetch_optional(&state.pool)
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("deposit {id} not found")))?;
    Ok(Json(Deposit {
        id: row.id,
        partner_id: row.partner_id,
        currency: row.currency,
        amount: amount::to_text(row.amount),
        fee: amount::to_text(row.fee),
        tx_hash: row.tx_hash,
        to_address: row.to_address,
        status: row.status,
        confirmed_at: row.confirmed_at,
        created_at: row.created_at,
        updated_at: row.updated_at,
    }))
}
