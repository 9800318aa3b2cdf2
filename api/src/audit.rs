//! `GET /v1/admin/audit`: the audit (the same checks as `paybus audit`, every workflow's), for
//! the console and for ops without a shell.
//!
//! The continuous auditor's record (a sweeper job, `paybus_maintenance::auditor`):
//! - `GET /v1/admin/audit/status`: the latest pass (when, window, checks, violations,
//!   duration), `clean`, and the violations that pass found.
//! - `GET /v1/admin/audit/findings[?limit=N]`: every violation ever found (first and last
//!   seen, times seen), most recently seen first (50 by default, at most 500).
//! - `GET /v1/admin/audit/passes[?limit=N]`: the latest passes, newest first.

use axum::{
    Json, Router,
    extract::{Query, State, rejection::QueryRejection},
    routing::get,
};
use paybus_maintenance::auditor::{self, Finding, PassRecord};
use paybus_ops::audit::{self, Violation};
use serde::{Deserialize, Serialize};

use crate::{ApiError, AppState};

/// This module's part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(run, status, findings, passes))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/audit", get(run))
        .route("/v1/admin/audit/status", get(status))
        .route("/v1/admin/audit/findings", get(findings))
        .route("/v1/admin/audit/passes", get(passes))
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
        crate::responses::AdminErrors
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

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct Page {
    limit: Option<u32>,
}

fn limit(page: Result<Query<Page>, QueryRejection>) -> Result<u32, ApiError> {
    let Query(page) = page.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    match page.limit.unwrap_or(50) {
        limit @ 1..=500 => Ok(limit),
        _ => Err(ApiError::BadRequest(
            "limit must be from 1 to 500".to_owned(),
        )),
    }
}

#[derive(Debug, Serialize)]
struct AuditStatus {
    /// No pass yet (the auditor has not run): `false`, `last_pass` null.
    clean: bool,
    last_pass: Option<PassRecord>,
    violations: Vec<Finding>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/audit/status",
    tag = "audit",
    security(("admin_token" = [])),
    responses((status = 200, description = "The continuous auditor's last pass and its violations", body = Object), crate::responses::AdminErrors)
)]
async fn status(State(state): State<AppState>) -> Result<Json<AuditStatus>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let last_pass = auditor::recent_passes(&mut conn, 1).await?.pop();
    let violations = match &last_pass {
        Some(pass) => auditor::findings(&mut conn, Some(pass.id), 500).await?,
        None => Vec::new(),
    };
    Ok(Json(AuditStatus {
        clean: last_pass.as_ref().is_some_and(|pass| pass.violations == 0),
        last_pass,
        violations,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/admin/audit/findings",
    tag = "audit",
    security(("admin_token" = [])),
    params(Page),
    responses((status = 200, description = "Every violation the auditor found, most recent first", body = Object), crate::responses::AdminErrors)
)]
async fn findings(
    State(state): State<AppState>,
    page: Result<Query<Page>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = limit(page)?;
    let mut conn = state.pool.acquire().await?;
    let findings = auditor::findings(&mut conn, None, limit).await?;
    Ok(Json(serde_json::json!({ "findings": findings })))
}

#[utoipa::path(
    get,
    path = "/v1/admin/audit/passes",
    tag = "audit",
    security(("admin_token" = [])),
    params(Page),
    responses((status = 200, description = "The auditor's passes, newest first", body = Object), crate::responses::AdminErrors)
)]
async fn passes(
    State(state): State<AppState>,
    page: Result<Query<Page>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = limit(page)?;
    let mut conn = state.pool.acquire().await?;
    let passes = auditor::recent_passes(&mut conn, limit).await?;
    Ok(Json(serde_json::json!({ "passes": passes })))
}
