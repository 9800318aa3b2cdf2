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
use paybus_confirmations::{
    ConfirmError, CreateError,
    withdrawal::{self, HistoryEntry, NewWithdrawal, Withdrawal, WithdrawalKind, WithdrawalStatus},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::MySqlConnection;

use crate::{ApiError, AppState, admin::path_id, amount::Amount, body::JsonBody, chain};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewWithdrawalRequest {
    partner_id: u64,
    /// `PARTNER` (default) or `USER`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    kind: WithdrawalKind,
    /// `PROCESSING` (default), `BROADCASTING` or `STALE`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    status: WithdrawalStatus,
    currency: String,
    amount: Amount,
    to_address: String,
    #[serde(default)]
    tx_hash: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/admin/withdrawals",
    tag = "confirmations",
    security(("admin_token" = [])),
    request_body = NewWithdrawalRequest,
    responses((status = 201, body = crate::responses::Created), crate::responses::AdminErrors)
)]
#[tracing::instrument(skip_all, fields(withdrawal_id, partner_id = request.partner_id))]
pub(super) async fn create(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<NewWithdrawalRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let partner_id = chain::id("partner_id", request.partner_id)?;
    if !request.status.is_initial() {
        return Err(ApiError::BadRequest(CreateError::NotInitial.to_string()));
    }
    let currency = chain::currency(&request.currency)?;
    if request.amount.value().is_zero() {
        return Err(ApiError::BadRequest(
            "amount must be greater than 0".to_owned(),
        ));
    }
    let new = NewWithdrawal {
        partner_id,
        kind: request.kind,
        status: request.status,
        currency,
        amount: request.amount.value(),
        to_address: chain::identifier("to_address", &request.to_address, 255)?,
        tx_hash: request
            .tx_hash
            .as_deref()
            .map(|h| chain::identifier("tx_hash", h, 128))
            .transpose()?,
    };
    let mut tx = state.pool.begin().await?;
    // The creation is the first history row (from_status NULL).
    let id = withdrawal::create(&mut tx, &new, "created by the admin API")
        .await
        .map_err(ApiError::from)?;
    tx.commit().await?;
    tracing::Span::current().record("withdrawal_id", id);
    tracing::info!(
        withdrawal_id = id,
        partner_id = new.partner_id,
        status = %new.status,
        kind = %new.kind,
        "withdrawal created"
    );
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

/// The row as JSON (amounts as exact strings), with its status history (oldest first).
#[derive(Debug, Serialize)]
pub(crate) struct WithdrawalView {
    #[serde(flatten)]
    pub(crate) withdrawal: Withdrawal,
    pub(crate) history: Vec<HistoryEntry>,
}

impl WithdrawalView {
    /// Withdrawal `id` as `found` (404 when `None`), with its history.
    pub(crate) async fn with_history(
        conn: &mut MySqlConnection,
        id: u64,
        found: Option<Withdrawal>,
    ) -> Result<Json<Self>, ApiError> {
        let withdrawal =
            found.ok_or_else(|| ApiError::NotFound(format!("withdrawal {id} not found")))?;
        let history = withdrawal::history(conn, id).await?;
        Ok(Json(WithdrawalView {
            withdrawal,
            history,
        }))
    }
}

#[utoipa::path(
    get,
    path = "/v1/admin/withdrawals/{id}",
    tag = "confirmations",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses(
        (status = 200, description = "The withdrawal with its status history", body = Object),
        crate::responses::AdminErrors
    )
)]
pub(super) async fn show(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<WithdrawalView>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    let found = withdrawal::find(&mut conn, id).await.map_err(internal)?;
    WithdrawalView::with_history(&mut conn, id, found).await
}

/// A row the domain cannot read is our fault, not the client's.
pub(crate) fn internal(error: ConfirmError) -> ApiError {
    ApiError::Internal(Box::new(error))
}
