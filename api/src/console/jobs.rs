//! The bonus-jobs page (W3): jobs waiting for a retry (PENDING) or for ops (FAILED), and the
//! retry of a FAILED one (`POST /v1/admin/charge-event-jobs/{id}/retry`).

use axum::{
    extract::{Path, State, rejection::PathRejection},
    http::Method,
    response::{IntoResponse, Response},
};
use maud::html;
use paybus_bonuses::job::{self, JobPage, JobStatus};

use super::{
    Session, actions,
    layout::{self, Flash},
};
use crate::AppState;

/// Jobs shown (by id); the admin API pages through the rest.
const SHOWN: u32 = 200;

/// `GET /console/jobs`.
pub(crate) async fn page(State(state): State<AppState>, session: Session) -> Response {
    render(&state, &session, None).await
}

async fn render(state: &AppState, session: &Session, flash: Option<Flash>) -> Response {
    let jobs = async {
        let mut conn = state.pool.acquire().await?;
        let page = JobPage {
            status: None,
            after_id: 0,
            limit: SHOWN,
        };
        job::list(&mut conn, page)
            .await
            .map_err(crate::ApiError::from)
    };
    let jobs = match jobs.await {
        Ok(jobs) => jobs,
        Err(error) => return layout::failure_page(error),
    };
    let failed = jobs
        .iter()
        .filter(|j| j.status == JobStatus::Failed)
        .count();
    layout::page(
        "Bonus jobs",
        Some(&session.caller),
        html! {
            @if let Some(flash) = &flash { (flash) }
            p.hint { (failed) " FAILED (waiting for ops), " (jobs.len() - failed) " PENDING (waiting for their retry). A retry moves a FAILED job back to PENDING, due now, and grant-bonus attempts it at once." }
            @if jobs.is_empty() {
                p.flash { "No bonus job is waiting." }
            } @else {
                (layout::wide_table("Bonus jobs", html! {
                    table {
                        thead { tr { th.n { "Job" } th.n { "Charge" } th.n { "Member" } th.n { "Event" } th.n { "Cans" } th { "Status" } th.n { "Retries" } th { "Next retry" } th { "Last error" } th { (layout::unseen("Actions")) } } }
                        tbody {
                            @for job in &jobs {
                                tr.job data-id=(job.id) data-status=(job.status) {
                                    td.n { (job.id) }
                                    td.n { (job.source_charge_id) }
                                    td.n { (job.member_id) }
                                    td.n { (job.charge_event_id.map(|id| id.to_string()).unwrap_or_default()) }
                                    td.n { (job.additional_can) }
                                    td { span class=(format!("badge {}", job.status)) { (job.status) } }
                                    td.n { (job.retry_count) }
                                    td { (job.next_retry_at.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string()).unwrap_or_default()) }
                                    td { (job.last_error.as_deref().unwrap_or("")) }
                                    td {
                                        @if job.status == JobStatus::Failed {
                                            form method="post" action=(format!("/console/jobs/{}/retry", job.id)) {
                                                button type="submit" { "Retry" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }))
            }
        },
    )
    .into_response()
}

/// `POST /console/jobs/{id}/retry`.
pub(crate) async fn retry(
    State(state): State<AppState>,
    session: Session,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    let id = match crate::admin::path_id(id) {
        Ok(id) => id,
        Err(error) => return layout::failure_page(error),
    };
    let path = format!("/v1/admin/charge-event-jobs/{id}/retry");
    let answer = actions::call(&state, &session, Method::POST, &path, None).await;
    let flash = answer
        .failure(&Method::POST, &path)
        .or_else(|| super::approvals::held(&answer, &format!("the retry of bonus job {id}")))
        .unwrap_or_else(|| {
            Flash::Done(format!(
                "Bonus job {id} retried: it is {} again, due now.",
                answer.body["status"].as_str().unwrap_or("PENDING")
            ))
        });
    render(&state, &session, Some(flash)).await
}
