//! W2's routes: the chain-monitor intake (signed confirmations into the outbox) and the admin
//! endpoints that stand in for the signer and the chain monitor's detection (create and read
//! withdrawals and deposits).

mod deposits;
pub mod intake;
mod withdrawals;

use axum::{
    Router,
    routing::{get, post},
};

use crate::AppState;

pub(crate) use intake::routes as intake_routes;
pub(crate) use withdrawals::{WithdrawalView, internal};

/// W2's part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    intake::withdrawal_confirmation,
    intake::deposit_confirmation,
    withdrawals::create,
    withdrawals::show,
    deposits::create,
    deposits::show,
))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/withdrawals", post(withdrawals::create))
        .route("/v1/admin/withdrawals/{id}", get(withdrawals::show))
        .route("/v1/admin/deposits", post(deposits::create))
        .route("/v1/admin/deposits/{id}", get(deposits::show))
}
