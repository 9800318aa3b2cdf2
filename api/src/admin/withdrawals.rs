//! `POST /v1/admin/withdrawals`, `GET /v1/admin/withdrawals/{id}`.
//!
//! Creating a withdrawal directly in PROCESSING, BROADCASTING or STALE stands in for the
//! signer (not part of paybus) so tests and the demo can confirm it; CONFIRMED and FAILED are
//! never set here: confirmation goes through the chain-monitor intake and confirm-withdrawal.

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
    error::is_foreign_key_violation,
};

/// `withdrawals.kind` (see the migration for what each kind means to the ledger).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum Kind {
    #[default]
    Normal,
    SettlementWithdraw,
    SelfTransfer,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Normal => "NORMAL",
            Kind::SettlementWithdraw => "SETTLEMENT_WITHDRAW",
            Kind::SelfTransfer => "SELF_TRANSFER",
        }
    }
}

/// `withdrawals.status`; only the first four may be set at creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum Status {
    #[default]
    Requested,
    Processing,
    Broadcasting,
    Stale,
    Confirmed,
    Failed,
}

impl Status {
    fn initial(self) -> Result<&'static str, ApiError> {
        match self {
            Status::Requested => Ok("REQUESTED"),
            Status::Processing => Ok("PROCESSING"),
            Status::Broadcasting => Ok("BROADCASTING"),
            Status::Stale => Ok("STALE"),
            Status::Confirmed | Status::Failed => Err(ApiError::BadRequest(
                "status must be REQUESTED, PROCESSING, BROADCASTING or STALE at creation: \
                 CONFIRMED and FAILED are reached only through the workflow"
                    .to_owned(),
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewWithdrawal {
    partner_id: u64,
    #[serde(default)]
    kind: Kind,
    #[serde(default)]
    status: Status,
    currency: String,
    amount: Amount,
    to_address: String,
    #[serde(default)]
    tx_hash: Option<String>,
}

#[tracing::instrument(skip_all, fields(withdrawal_id, partner_id = new.partner_id))]
pub(super) async fn create(
    State(state): State<AppState>,
    JsonBody(new): JsonBody<NewWithdrawal>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let partner_id = chain::id("partner_id", new.partner_id)?;
    let status = new.status.initial()?;
    let currency = chain::currency(&new.currency)?;
    if new.amount.value().is_zero() {
        return Err(ApiError::BadRequest(
            "amount must be greater than 0".to_owned(),
        ));
    }
    let to_address = chain::identifier("to_address", &new.to_address, 255)?;
    let tx_hash = new
        .tx_hash
        .as_deref()
        .map(|h| chain::identifier("tx_hash", h, 128))
        .transpose()?;

    let mut tx = state.pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO withdrawals (partner_id, kind, status, currency, amount, to_address, tx_hash) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(partner_id)
    .bind(new.kind.as_str())
    .bind(status)
    .bind(&currency)
    .bind(new.amount.value())
    .bind(&to_address)
    .bind(&tx_hash)
    .execute(&mut *tx)
    .await;
    let id = match inserted {
        Ok(done) => done.last_insert_id(),
        Err(e) if is_foreign_key_violation(&e) => {
            return Err(ApiError::NotFound(format!(
                "partner {partner_id} not found"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    // The creation is the first history row (from_status NULL).
    sqlx::query(
        "INSERT INTO withdrawal_status_history (withdrawal_id, from_status, to_status, reason) \
         VALUES (?, NULL, ?, 'created by the admin API')",
    )
    .bind(id)
    .bind(status)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::Span::current().record("withdrawal_id", id);
    tracing::info!(
        withdrawal_id = id,
        partner_id,
        status,
        kind = new.kind.as_str(),
        "withdrawal created"
    );
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

#[derive(sqlx::FromRow)]
struct Row {
    id: u64,
    partner_id: u64,
    kind: String,
    status: String,
    currency: String,
    amount: Decimal,
    to_address: String,
    tx_hash: Option<String>,
    confirmed_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, sqlx::FromRow)]
struct HistoryEntry {
    from_status: Option<String>,
    to_status: String,
    reason: Option<String>,
    created_at: DateTime<Utc>,
}

/// The row as JSON, amounts as strings, with its status history (oldest first).
#[derive(Debug, Serialize)]
pub(super) struct Withdrawal {
    id: u64,
    partner_id: u64,
    kind: String,
    status: String,
    currency: String,
    amount: String,
    to_address: String,
    tx_hash: Option<String>,
    confirmed_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    history: Vec<HistoryEntry>,
}

pub(super) async fn show(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Withdrawal>, ApiError> {
    let id = path_id(id)?;
    let row = sqlx::query_as::<_, Row>(
        "SELECT id, partner_id, kind, status, currency, amount, to_address, tx_hash, \
         confirmed_at, created_at, updated_at FROM withdrawals WHERE id = ?",
    )
    .bind(id)
    .fetch_optional(&state.pool)
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("withdrawal {id} not found")))?;
    let history = sqlx::query_as::<_, HistoryEntry>(
        "SELECT from_status, to_status, reason, created_at FROM withdrawal_status_history \
         WHERE withdrawal_id = ? ORDER BY id",
    )
    .bind(id)
    .fetch_all(&state.pool)
    .await?;
    Ok(Json(Withdrawal {
        id: row.id,
        partner_id: row.partner_id,
        kind: row.kind,
        status: row.status,
        currency: row.currency,
        amount: amount::to_text(row.amount),
        to_address: row.to_address,
        tx_hash: row.tx_hash,
        confirmed_at: row.confirmed_at,
        created_at: row.created_at,
        updated_at: row.updated_at,
        history,
    }))
}
