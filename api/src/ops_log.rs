//! `GET /v1/admin/ops-log[?before_seq=N][&limit=N]`: the ops log (`paybus_ops::ops_log`),
//! every ops action with who did it, newest first; 50 a page (at most 500), `next_before_seq`
//! continues. Whether the chain holds is the audit's (`GET /v1/admin/audit`, check
//! `ops_log_chain`).

use axum::{
    Json, Router,
    extract::{Query, State, rejection::QueryRejection},
    routing::get,
};
use paybus_ops::ops_log::{self, Row};
use serde::{Deserialize, Serialize};

use crate::{ApiError, AppState};

/// This module's part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new().route("/v1/admin/ops-log", get(list))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Rows before this seq (a positive integer); absent: from the newest.
    #[param(minimum = 1)]
    before_seq: Option<u64>,
    /// Rows a page, 1 to 500 (50 by default).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
}

#[derive(Debug, Serialize)]
struct Page {
    entries: Vec<Row>,
    /// Pass as `before_seq` for the next page; `null` on the last one.
    next_before_seq: Option<u64>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/ops-log",
    tag = "ops-log",
    security(("admin_token" = [])),
    params(ListQuery),
    responses((status = 200, description = "Ops actions newest first (seq, when, actor, action, subject, detail, the hashes); `next_before_seq` continues", body = Object), crate::responses::AdminErrors)
)]
async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Page>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    if query.before_seq == Some(0) {
        return Err(ApiError::BadRequest(
            "before_seq must be a positive integer (the log starts at 1)".to_owned(),
        ));
    }
    let limit = match query.limit.unwrap_or(50) {
        limit @ 1..=500 => limit,
        _ => {
            return Err(ApiError::BadRequest(
                "limit must be from 1 to 500".to_owned(),
            ));
        }
    };
    let mut conn = state.pool.acquire().await?;
    let entries = ops_log::list(&mut conn, query.before_seq, limit).await?;
    let full = entries.len() == limit as usize;
    Ok(Json(Page {
        next_before_seq: entries.last().filter(|_| full).map(|row| row.seq),
        entries,
    }))
}
