//! Payment completions: every gateway's webhook and verify call, one code path
//! ([`paybus_bonuses::Completions`]).
//!
//! The payment service (the app backend's part that talks to the gateways and verifies their
//! receipts) relays each gateway's verdict here, signed with `PAYBUS_PAYMENTS_SECRET` exactly as
//! the chain monitor signs its confirmations (`X-Paybus-Signature`): paybus never takes a
//! member's word that a payment happened. Webhook and verify differ only in who started the
//! call; both may arrive, in any order, any number of times: the first completes the charge
//! (`completed_now: true`), the rest get the original result (`completed_now: false`). A
//! client's mistake is a 4xx that names it; the answers are in docs/api.md ("Routes").

use axum::{
    Json,
    body::Bytes,
    extract::{Path, State, rejection::BytesRejection, rejection::PathRejection},
    http::HeaderMap,
};
use paybus_bonuses::{
    CompleteError, Completion, PaymentCompletion, charge::PaymentGateway,
    completion::CompletedCharge,
};
use serde::{Deserialize, Serialize};

use crate::{
    ApiError, AppState,
    amount::Amount,
    body, chain,
    signed::{self, Signer},
};

/// `charges.gateway_tx_id` is `VARCHAR(190)`.
const GATEWAY_TX_ID_MAX_LEN: usize = 190;

/// The payment service signs with `PAYBUS_PAYMENTS_SECRET`.
const PAYMENT_SERVICE: Signer = Signer {
    name: "payment-service",
    disabled: "payment completions disabled: PAYBUS_PAYMENTS_SECRET is not set",
};

/// The body of both calls.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CompletionRequest {
    charge_id: u64,
    /// The gateway's id of the payment (receipt, transaction or order id).
    gateway_tx_id: String,
    /// What the gateway says was paid (a decimal string); must equal the charge's price.
    amount: Amount,
}

/// The answer: the completed charge and its bonus jobs, and whether this call completed it.
#[derive(Debug, Serialize)]
pub struct CompletionAnswer {
    #[serde(flatten)]
    charge: CompletedCharge,
    completed_now: bool,
}

/// Where the call came from (the log line says which).
#[derive(Debug, Clone, Copy)]
enum Call {
    Webhook,
    Verify,
}

/// `POST /v1/payments/{gateway}/webhook`: the gateway says the payment is done.
#[utoipa::path(
    post,
    path = "/v1/payments/{gateway}/webhook",
    tag = "payments",
    security(("signature" = [])),
    params(("gateway" = String, Path, description = "pg, payverse, hecto, google-iap or apple-iap")),
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completed charge and its bonus jobs; `completed_now` says whether this call completed it", body = Object),
        crate::responses::SignedErrors
    )
)]
pub(super) async fn webhook(
    State(state): State<AppState>,
    gateway: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CompletionAnswer>, ApiError> {
    complete(&state, Call::Webhook, gateway, &headers, body).await
}

/// `POST /v1/payments/{gateway}/verify`: the app paid; the gateway confirmed the receipt.
#[utoipa::path(
    post,
    path = "/v1/payments/{gateway}/verify",
    tag = "payments",
    security(("signature" = [])),
    params(("gateway" = String, Path, description = "pg, payverse, hecto, google-iap or apple-iap")),
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "As the webhook", body = Object),
        crate::responses::SignedErrors
    )
)]
pub(super) async fn verify(
    State(state): State<AppState>,
    gateway: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CompletionAnswer>, ApiError> {
    complete(&state, Call::Verify, gateway, &headers, body).await
}

/// The one code path behind every gateway and call.
#[tracing::instrument(skip_all, fields(?call, gateway, charge_id))]
async fn complete(
    state: &AppState,
    call: Call,
    gateway: Result<Path<String>, PathRejection>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CompletionAnswer>, ApiError> {
    let body = signed::verified_body(
        state,
        &PAYMENT_SERVICE,
        state.payments_secret.as_ref(),
        headers,
        body,
    )?;
    let gateway = gateway_of(gateway)?;
    tracing::Span::current().record("gateway", gateway.as_str());
    let request: CompletionRequest = body::json(&body)?;
    let completion = PaymentCompletion {
        charge_id: chain::id("charge_id", request.charge_id)?,
        gateway,
        gateway_tx_id: chain::identifier(
            "gateway_tx_id",
            &request.gateway_tx_id,
            GATEWAY_TX_ID_MAX_LEN,
        )?,
        amount: request.amount.value(),
    };
    tracing::Span::current().record("charge_id", completion.charge_id);
    let done = state
        .completions
        .complete(completion)
        .await
        .map_err(refused)?;
    Ok(Json(match done {
        Completion::Completed(charge) => CompletionAnswer {
            charge,
            completed_now: true,
        },
        Completion::AlreadyCompleted(charge) => CompletionAnswer {
            charge,
            completed_now: false,
        },
    }))
}

/// The path's gateway: `pg`, `payverse`, `hecto`, `google-iap`, `apple-iap`.
fn gateway_of(path: Result<Path<String>, PathRejection>) -> Result<PaymentGateway, ApiError> {
    let name = path.map(|Path(name)| name).unwrap_or_default();
    name.to_ascii_uppercase()
        .replace('-', "_")
        .parse()
        .map_err(|_| {
            ApiError::NotFound(format!(
                "no payment gateway {name:?}: pg, payverse, hecto, google-iap or apple-iap"
            ))
        })
}

fn refused(error: CompleteError) -> ApiError {
    match error {
        CompleteError::UnknownCharge(_) => ApiError::NotFound(error.to_string()),
        CompleteError::NotAPayment(_)
        | CompleteError::WrongGateway { .. }
        | CompleteError::WrongAmount { .. }
        | CompleteError::PaymentUsed { .. }
        | CompleteError::CompletedByAnotherPayment { .. } => {
            tracing::warn!(%error, "payment completion refused");
            ApiError::Conflict(error.to_string())
        }
        CompleteError::Bonus(error) => ApiError::from(error),
    }
}
