//! Chain-monitor intake: confirmations signed with `PAYBUS_CHAIN_MONITOR_SECRET`
//! (`X-Paybus-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256("<t>.<body>")>`, see
//! `paybus_config::signature`) become outbox messages, answered 202.
//!
//! The intake checks who sent the request and the shape of what was sent, nothing more: it
//! does not look the withdrawal or deposit up. The function behind the bus decides (a
//! conditional UPDATE), an unknown id ends as a dead letter, and a duplicate — the monitor
//! re-sends after 60 s, sometimes while the first is still in flight — is accepted again and
//! skipped by the consumer.
//!
//! Order of checks: intake enabled (503) → body size (413) → signature (401) → JSON (400) →
//! field values (400) → one outbox transaction → 202.

use axum::{
    Json, Router,
    body::Bytes,
    extract::{State, rejection::BytesRejection},
    http::{HeaderMap, StatusCode},
    routing::post,
};
use paybus_bus::{Envelope, Message, Outbox};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use paybus_confirmations::{DepositTxConfirmed, WithdrawalTxConfirmed};

use crate::{
    ApiError, AppState, body, chain,
    signed::{self, Signer},
};

/// `withdrawals.tx_hash` is `VARCHAR(128)`.
const TX_HASH_MAX_LEN: usize = 128;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/chain-monitor/withdrawal-confirmations",
            post(withdrawal_confirmation),
        )
        .route(
            "/v1/chain-monitor/deposit-confirmations",
            post(deposit_confirmation),
        )
}

/// `POST /v1/chain-monitor/withdrawal-confirmations`. Unknown fields are refused, as on every
/// route: a misspelt field must not be silently dropped.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct WithdrawalConfirmation {
    withdrawal_id: u64,
    tx_hash: String,
}

/// `POST /v1/chain-monitor/deposit-confirmations`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DepositConfirmation {
    deposit_id: u64,
}

/// The 202 answer: the confirmation is durably queued under this message id.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Accepted {
    pub accepted: bool,
    #[schema(value_type = String, format = "uuid")]
    pub message_id: Uuid,
}

#[utoipa::path(
    post,
    path = "/v1/chain-monitor/withdrawal-confirmations",
    tag = "intake",
    security(("signature" = [])),
    request_body = WithdrawalConfirmation,
    responses(
        (status = 202, description = "Durably queued; confirm-withdrawal decides", body = Accepted),
        crate::responses::SignedErrors
    )
)]
#[tracing::instrument(skip_all, fields(withdrawal_id, message_id))]
pub(super) async fn withdrawal_confirmation(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let body = authenticate(&state, &headers, body)?;
    let request: WithdrawalConfirmation = body::json(&body)?;
    let message = WithdrawalTxConfirmed {
        withdrawal_id: chain::id("withdrawal_id", request.withdrawal_id)?,
        tx_hash: chain::identifier("tx_hash", &request.tx_hash, TX_HASH_MAX_LEN)?,
    };
    tracing::Span::current().record("withdrawal_id", message.withdrawal_id);
    enqueue(&state.outbox, message).await
}

#[utoipa::path(
    post,
    path = "/v1/chain-monitor/deposit-confirmations",
    tag = "intake",
    security(("signature" = [])),
    request_body = DepositConfirmation,
    responses(
        (status = 202, description = "Durably queued; confirm-deposit decides", body = Accepted),
        crate::responses::SignedErrors
    )
)]
#[tracing::instrument(skip_all, fields(deposit_id, message_id))]
pub(super) async fn deposit_confirmation(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let body = authenticate(&state, &headers, body)?;
    let request: DepositConfirmation = body::json(&body)?;
    let message = DepositTxConfirmed {
        deposit_id: chain::id("deposit_id", request.deposit_id)?,
    };
    tracing::Span::current().record("deposit_id", message.deposit_id);
    enqueue(&state.outbox, message).await
}

/// The chain monitor signs with `PAYBUS_CHAIN_MONITOR_SECRET`.
const CHAIN_MONITOR: Signer = Signer {
    name: "chain-monitor",
    disabled: "intake disabled: PAYBUS_CHAIN_MONITOR_SECRET is not set",
};

/// The intake is enabled, the body fits, and its signature is good and fresh.
fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    signed::verified_body(
        state,
        &CHAIN_MONITOR,
        state.chain_monitor_secret.as_ref(),
        headers,
        body,
    )
}

/// One transaction: the outbox row; published right after commit (or later by the relay).
async fn enqueue<T: Message>(
    outbox: &Outbox,
    message: T,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let envelope = Envelope::new(message);
    tracing::Span::current().record("message_id", tracing::field::display(envelope.id));
    let mut work = outbox.begin().await?;
    work.send(&envelope).await?;
    work.commit().await?;
    tracing::info!(message_id = %envelope.id, r#type = T::TYPE, "confirmation accepted");
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            accepted: true,
            message_id: envelope.id,
        }),
    ))
}
