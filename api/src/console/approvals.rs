//! The approvals page: four-eyes for the single guarded actions (`crate::approvals`) — what
//! waits for a second ADMIN, and what was approved and run. Approve and execute are the admin
//! API's calls (`POST /v1/admin/approvals/{id}/approve`, `.../execute`).

use axum::{
    extract::{Path, State, rejection::PathRejection},
    http::{Method, StatusCode},
    response::{IntoResponse, Response},
};
use maud::html;
use paybus_ops::approvals::{self, ApprovalStatus};
use serde_json::json;

use super::{
    Session, actions,
    layout::{self, Flash},
};
use crate::{AppState, approvals::into_api};

/// The flash of a guarded action the API held for a second ADMIN (`202 {approval}`), or
/// `None` when it ran. Asking again while the open request is approved answers that one.
pub(crate) fn held(answer: &actions::Answer, what: &str) -> Option<Flash> {
    (answer.status == StatusCode::ACCEPTED).then(|| {
        let approval = &answer.body["approval"];
        let id = approval["id"].as_str().unwrap_or("?");
        if approval["status"] == "APPROVED" {
            Flash::Warn(format!(
                "Four-eyes: {what} was asked for and approved already (approval {id}): execute \
                 it on the Approvals page. Nothing changed yet."
            ))
        } else {
            Flash::Warn(format!(
                "Four-eyes: {what} waits for a second ADMIN's approval (approval {id}, on the \
                 Approvals page). Nothing changed yet."
            ))
        }
    })
}

/// `GET /console/approvals`.
pub(crate) async fn page(State(state): State<AppState>, session: Session) -> Response {
    render(&state, &session, None).await
}

async fn render(state: &AppState, session: &Session, flash: Option<Flash>) -> Response {
    let list = async {
        let mut conn = state.pool.acquire().await?;
        approvals::list(&mut conn, false, 100)
            .await
            .map_err(into_api)
    };
    let list = match list.await {
        Ok(list) => list,
        Err(error) => return layout::failure_page(error),
    };
    layout::page(
        "Approvals",
        Some(&session.caller),
        html! {
            @if let Some(flash) = &flash { (flash) }
            p.hint { "Retrying a FAILED bonus job, re-running a suspension's FAILED tasks and resuming a market move money: one ADMIN asks, another approves, then it runs. Dead-letter replays are approved on their operation's page." }
            @if list.is_empty() {
                p.flash { "Nothing was asked for." }
            } @else {
                (layout::wide_table("Approvals", html! {
                    table #approvals {
                        thead { tr { th { "Action" } th { "On" } th { "Status" } th { "Asked by" } th { "Approved by" } th { "Result" } th { (layout::unseen("Actions")) } } }
                        tbody {
                            @for a in &list {
                                @let status = if a.expired { "EXPIRED".to_owned() } else { a.status.to_string() };
                                tr.approval data-id=(a.id) data-status=(status) data-action=(a.action) {
                                    td { (a.action) }
                                    td { code { (a.subject) } }
                                    td { span class=(format!("badge {status}")) { (status) } }
                                    td { (a.requested_by) ", " (a.requested_at.format("%Y-%m-%d %H:%M:%S UTC")) }
                                    td { (a.approved_by.as_deref().unwrap_or("—")) }
                                    td { (a.result.as_deref().unwrap_or("—")) }
                                    td {
                                        @if a.expired {
                                        } @else if !a.open && a.status != ApprovalStatus::Executed {
                                            span.hint { "a duplicate of the open request: neither approved nor executed" }
                                        } @else if let Some(since) = a.executing_since {
                                            span.hint { "being executed since " (since.format("%H:%M:%S UTC")) }
                                        } @else if a.status == ApprovalStatus::AwaitingApproval && !requested_by(&session.caller.actor, a.requested_by_issuer.as_deref(), a.requested_by_subject.as_deref()) {
                                            form method="post" action=(format!("/console/approvals/{}/approve", a.id)) { button type="submit" { "Approve" } }
                                        } @else if a.status == ApprovalStatus::AwaitingApproval {
                                            span.hint { "yours: another ADMIN approves it" }
                                        } @else if a.status == ApprovalStatus::Approved {
                                            form method="post" action=(format!("/console/approvals/{}/execute", a.id)) { button.danger type="submit" { "Execute" } }
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

/// `POST /console/approvals/{id}/approve` and `.../execute`.
pub(crate) async fn approve(
    State(state): State<AppState>,
    session: Session,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    step(&state, &session, id, "approve").await
}

pub(crate) async fn execute(
    State(state): State<AppState>,
    session: Session,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    step(&state, &session, id, "execute").await
}

async fn step(
    state: &AppState,
    session: &Session,
    id: Result<Path<String>, PathRejection>,
    step: &str,
) -> Response {
    let Some(id) = id.ok().and_then(|Path(id)| uuid::Uuid::parse_str(&id).ok()) else {
        return layout::error_page(StatusCode::BAD_REQUEST, "An approval is named by its UUID.");
    };
    let path = format!("/v1/admin/approvals/{id}/{step}");
    let answer = actions::call(state, session, Method::POST, &path, Some(json!({}))).await;
    let flash = answer.failure(&Method::POST, &path).unwrap_or_else(|| {
        if step == "approve" {
            Flash::Done(format!(
                "Approved by {}: it may be executed now.",
                session.caller.actor.name
            ))
        } else {
            let result = &answer.body["result"];
            if answer.body["ran_now"] == true {
                Flash::Done(format!("Executed: {result}"))
            } else {
                Flash::Done(format!("Executed before, by another execution: {result}"))
            }
        }
    });
    render(state, session, Some(flash)).await
}

/// Whether `actor` is the person recorded as a request's requester.
pub(super) fn requested_by(
    actor: &paybus_ops::actor::Actor,
    issuer: Option<&str>,
    subject: Option<&str>,
) -> bool {
    matches!((issuer, subject), (Some(issuer), Some(subject)) if actor.is(issuer, subject))
}
