//! `GET /v1/admin/audit`: the audit (the same checks as `paybus audit`, every workflow's), for
//! the console and for ops without a shell.

use axum::{Json, Router, extract::State, routing::get};
use paybus_platform::audit::{self, Violation};
use serde::Serialize;

use crate::{ApiError, AppState};

/// This module's part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(run))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new().route("/v1/admin/audit", get(run))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct AuditReport {
    pub(crate) clean: bool,
    /// `{check, id, detail}` per violation.
    #[schema(value_type = Vec<Object>)]
    pub(crate) violations: Vec<Violation>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/audit",
    tag = "audit",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Every workflow's invariants, checked in one snapshot", body = AuditReport),
        crate::openapi::AdminErrors
    )
)]
async fn run(State(state): State<AppState>) -> Result<Json<AuditReport>, ApiError> {
    report(&state).await.map(Json)
}

/// Every check, in one snapshot so they agree with each other (the console's page too).
pub(crate) async fn report(state: &AppState) -> Result<AuditReport, ApiError> {
    let mut tx = state.pool.begin().await?;
    let violations = audit::run(&mut tx, &state.audit).await?;
    tx.rollback().await?;
    Ok(AuditReport {
        clean: violations.is_empty(),
        violations,
    })
}
