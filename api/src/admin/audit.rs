//! `GET /v1/admin/audit`: the ledger audit (the same checks as `paybus audit`), for the
//! console and for ops without a shell.

use axum::{Json, extract::State};
use paybus_platform::ledger::audit::{self, Violation};
use serde::Serialize;

use crate::{ApiError, AppState};

#[derive(Debug, Serialize)]
pub(crate) struct AuditReport {
    clean: bool,
    violations: Vec<ViolationLine>,
}

#[derive(Debug, Serialize)]
struct ViolationLine {
    check: &'static str,
    description: String,
    #[serde(flatten)]
    detail: Violation,
}

pub(crate) async fn run(State(state): State<AppState>) -> Result<Json<AuditReport>, ApiError> {
    // One snapshot for every check, so they agree with each other.
    let mut tx = state.pool.begin().await?;
    let violations = audit::run(&mut tx).await?;
    tx.rollback().await?;
    Ok(Json(AuditReport {
        clean: violations.is_empty(),
        violations: violations
            .into_iter()
            .map(|v| ViolationLine {
                check: v.check(),
                description: v.to_string(),
                detail: v,
            })
            .collect(),
    }))
}
