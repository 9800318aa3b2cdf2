//! W3's routes (docs/workflows/bonuses.md, seed 003): payment completions from every gateway, and the admin
//! views of members, charges, charge events and bonus jobs.
//!
//! - [`payments`]: `POST /v1/payments/{gateway}/webhook` and `.../verify` for PG, PAYVERSE,
//!   HECTO, GOOGLE_IAP and APPLE_IAP — one code path into the one completion transition
//!   (`paybus_bonuses::completion`), signed with `PAYBUS_PAYMENTS_SECRET`.
//! - `jobs`: bonus jobs waiting for a retry or for ops (PENDING, FAILED), one job, and ops'
//!   retry of a FAILED one (OPS reads, ADMIN retries).
//! - `setup`: members, charge requests and charge events (ops create events; members and
//!   charge requests stand in for the app backend, so the flow can be driven by hand).

mod jobs;
pub mod payments;
mod setup;

use axum::{
    Router,
    routing::{get, post},
};

use crate::AppState;

/// W3's part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    payments::webhook,
    payments::verify,
    jobs::list,
    jobs::show,
    jobs::retry,
    setup::create_member,
    setup::show_member,
    setup::create_charge,
    setup::show_charge,
    setup::create_event,
    setup::show_event,
))]
pub(crate) struct Doc;

pub(crate) fn payment_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/payments/{gateway}/webhook", post(payments::webhook))
        .route("/v1/payments/{gateway}/verify", post(payments::verify))
}

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/charge-event-jobs", get(jobs::list))
        .route("/v1/admin/charge-event-jobs/{id}", get(jobs::show))
        .route("/v1/admin/charge-event-jobs/{id}/retry", post(jobs::retry))
        .route("/v1/admin/members", post(setup::create_member))
        .route("/v1/admin/members/{id}", get(setup::show_member))
        .route("/v1/admin/charges", post(setup::create_charge))
        .route("/v1/admin/charges/{id}", get(setup::show_charge))
        .route("/v1/admin/charge-events", post(setup::create_event))
        .route("/v1/admin/charge-events/{id}", get(setup::show_event))
}
