//! The bonus jobs ops look at (seed 003's `AdminChargeEventJobController`, with OPS reading
//! and ADMIN retrying, docs/operations.md):
//!
//! - `GET /v1/admin/charge-event-jobs[?status=PENDING|FAILED][&after_id=N][&limit=N]`: jobs
//!   waiting for a retry (PENDING) or for ops (FAILED) — never DONE or PROCESSING — by id,
//!   50 a page by default (at most 500); `next_after_id` continues the list (keyset pages stay
//!   exact while jobs move in and out of it).
//! - `GET /v1/admin/charge-event-jobs/{id}`: any job, whatever its state.
//! - `POST /v1/admin/charge-event-jobs/{id}/retry`: FAILED -> PENDING, due now, its message
//!   published at once (grant-bonus attempts it right away). Any other state: 409 naming it,
//!   nothing changed. Under four-eyes (`job-retry`): 202 with an approval a second ADMIN gives
//!   (`crate::approvals`), and the retry runs when it is executed.

use axum::{
    Extension, Json,
    extract::{Path, Query, State, rejection::PathRejection, rejection::QueryRejection},
    response::{IntoResponse, Response},
};
use paybus_bonuses::job::{self, BonusJob, JobPage, JobStatus};
use paybus_ops::approvals::Guarded;
use serde::{Deserialize, Serialize};

use crate::{ApiError, AppState, admin::path_id, approvals, auth::Caller};

const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 500;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ListQuery {
    /// PENDING or FAILED (both when absent).
    #[serde(default)]
    #[param(value_type = Option<String>)]
    status: Option<JobStatus>,
    #[serde(default)]
    after_id: u64,
    #[serde(default)]
    limit: Option<u32>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct JobList {
    #[schema(value_type = Vec<Object>)]
    jobs: Vec<BonusJob>,
    /// Pass as `after_id` for the next page; `null` on the last one.
    next_after_id: Option<u64>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/charge-event-jobs",
    tag = "bonuses",
    security(("admin_token" = [])),
    params(ListQuery),
    responses((status = 200, description = "PENDING and FAILED jobs by id", body = JobList), crate::responses::AdminErrors)
)]
pub(super) async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<JobList>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    if let Some(status @ (JobStatus::Done | JobStatus::Processing)) = query.status {
        return Err(ApiError::BadRequest(format!(
            "status {status} is never listed: the list holds PENDING and FAILED jobs (GET \
             /v1/admin/charge-event-jobs/{{id}} shows any job)"
        )));
    }
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be from 1 to {MAX_LIMIT}"
        )));
    }
    let mut conn = state.pool.acquire().await?;
    let jobs = job::list(
        &mut conn,
        JobPage {
            status: query.status,
            after_id: query.after_id,
            limit,
        },
    )
    .await
    .map_err(ApiError::from)?;
    let full = jobs.len() == limit as usize;
    Ok(Json(JobList {
        next_after_id: jobs.last().filter(|_| full).map(|job| job.id),
        jobs,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/admin/charge-event-jobs/{id}",
    tag = "bonuses",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses((status = 200, description = "The job, whatever its state", body = Object), crate::responses::AdminErrors)
)]
pub(super) async fn show(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<BonusJob>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    job::find(&mut conn, id)
        .await
        .map_err(ApiError::from)?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("bonus job {id} not found")))
}

#[utoipa::path(
    post,
    path = "/v1/admin/charge-event-jobs/{id}/retry",
    tag = "bonuses",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses(
        (status = 200, description = "FAILED -> PENDING, due now, published", body = Object),
        (status = 202, description = "Four-eyes: an approval a second ADMIN gives before it runs (`/v1/admin/approvals`)", body = Object),
        crate::responses::AdminErrors
    )
)]
#[tracing::instrument(skip_all, fields(job_id))]
pub(super) async fn retry(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_id(id)?;
    tracing::Span::current().record("job_id", id);
    let subject = format!("charge_event_job:{id}");
    if state.four_eyes.requires(Guarded::JobRetry) {
        // Ask a second person only about a retry that would do something.
        let mut conn = state.pool.acquire().await?;
        let job = job::find(&mut conn, id)
            .await
            .map_err(ApiError::from)?
            .ok_or_else(|| ApiError::NotFound(format!("bonus job {id} not found")))?;
        if job.status != JobStatus::Failed {
            return Err(ApiError::Conflict(format!(
                "bonus job {id} is {}, not FAILED: only a FAILED job can be retried; nothing \
                 changed",
                job.status
            )));
        }
    }
    if let Some(held) = approvals::held(&state, &caller, Guarded::JobRetry, &subject).await? {
        return Ok(held.into_response());
    }
    let retried = approvals::run(&state.outbox, Guarded::JobRetry, &subject, &caller.actor).await?;
    Ok(Json(retried).into_response())
}
