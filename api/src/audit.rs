//! `GET /v1/admin/audit`: the audit (the same checks as `paybus audit`, every workflow's), for
//! the console and for ops without a shell.

use axum::{Json, Router, extract::State, routing::get};
use paybus_platform::audit::{self, Violation};
use serde::Serialize;

use crate::{ApiError, AppState};

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new().route("/v1/admin/audit", get(run))
}

#[derive(Debug, Serialize)]
struct AuditReport {
    clean: bool,
    violations: Vec<Violation>,
}

async fn run(State(state): State<AppState>) -> Result<Json<AuditReport>, ApiError> {
    // One snapshot for every check, so they agree with each other.
    let mut tx = state.pool.begin().await?;
    let violations = audit::run(&mut tx, &state.audit).await?;
    tx.rollback().await?;
    Ok(Json(AuditReport {
        clean: violations.is_empty(),
        violations,
    }))
}
