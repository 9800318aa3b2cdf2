//! An operation's page: a dry run frozen into an operation (`paybus_dead_letter_ops::operation`)
//! with each letter's verdict and, once executed, its result; the four-eyes approval and the
//! execution, each an admin API call (`POST /v1/admin/dead-letters/operations/{id}/approve`
//! with the hash the page shows, `.../execute`).
//!
//! The page is the confirmation step of every bulk action: it shows how many letters the
//! button acts on, and the button acts on those letters only.

use axum::{
    extract::{FromRequestParts, Path, State},
    http::{Method, StatusCode, request::Parts},
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use paybus_dead_letter_ops::{OperationAction, OperationDetail, OperationStatus, operation};
use serde_json::json;
use uuid::Uuid;

use super::{
    FormFields, Session, actions,
    layout::{self, Flash},
};
use crate::{AppState, dead_letters::into_api};

pub(crate) fn href(id: Uuid) -> String {
    format!("/console/operations/{id}")
}

/// The operation a page's path names by its UUID; a path that names none is answered with a
/// page saying how an operation is named.
pub(crate) struct OperationId(Uuid);

impl<S: Send + Sync> FromRequestParts<S> for OperationId {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let path = Path::<String>::from_request_parts(parts, state).await;
        match path.ok().and_then(|Path(id)| Uuid::parse_str(&id).ok()) {
            Some(id) => Ok(OperationId(id)),
            None => Err(layout::error_page(
                StatusCode::BAD_REQUEST,
                "An operation is named by its UUID.",
            )),
        }
    }
}

/// `GET /console/operations/{id}`.
pub(crate) async fn page(
    State(state): State<AppState>,
    session: Session,
    OperationId(id): OperationId,
) -> Response {
    render(&state, &session, id, None, &[]).await
}

/// A letter and the id of the message an execution re-sent for it.
type Resent = (u64, String);

/// The operation's page, after `flash` and with the messages this call re-sent.
pub(crate) async fn render(
    state: &AppState,
    session: &Session,
    id: Uuid,
    flash: Option<Flash>,
    resent: &[Resent],
) -> Response {
    let detail = async {
        let mut conn = state.pool.acquire().await?;
        operation::show(&mut conn, id).await.map_err(into_api)
    };
    let detail = match detail.await {
        Ok(Some(detail)) => detail,
        Ok(None) => {
            return layout::error_page(
                StatusCode::NOT_FOUND,
                &format!("Operation {id} does not exist."),
            );
        }
        Err(error) => return layout::failure_page(error),
    };
    let op = &detail.operation;
    let title = format!("Operation: {} of {} letter(s)", op.action, op.letters);
    layout::page(
        &title,
        Some(&session.caller),
        html! {
            @if let Some(flash) = &flash { (flash) }
            p { a href="/console/dead-letters" { "← all groups" } }
            (summary(&detail))
            (buttons(&detail, session))
            (layout::wide_table("The letters of this operation", html! {
                table #letter-verdicts {
                    thead { tr { th.n { "Letter" } th { "Verdict at the dry run" } th { "Why" } th { "Result" } th { "Detail" } th { "Re-sent as" } } }
                    tbody {
                        @for letter in &detail.letter_results {
                            @let resent_as = resent.iter().find(|(id, _)| *id == letter.dead_letter_id).map(|(_, message)| message.as_str());
                            tr.verdict data-letter-id=(letter.dead_letter_id) data-verdict=(letter.verdict) data-result=(letter.result.as_deref().unwrap_or("")) {
                                td.n { a href=(format!("/console/dead-letters/letter/{}", letter.dead_letter_id)) { (letter.dead_letter_id) } }
                                td { span class=(format!("badge {}", letter.verdict)) { (letter.verdict) } }
                                td { (letter.reason) }
                                td { @match &letter.result { Some(result) => { span class=(format!("badge {result}")) { (result) } }, None => { "—" } } }
                                td { (letter.detail) }
                                td { code { (resent_as.unwrap_or("—")) } }
                            }
                        }
                    }
                }
            }))
        },
    )
    .into_response()
}

fn summary(detail: &OperationDetail) -> Markup {
    let op = &detail.operation;
    let status = if op.expired {
        "EXPIRED".to_owned()
    } else {
        op.status.to_string()
    };
    html! {
        p { a #permalink href=(href(op.id)) { "This operation's page" } " (send it to the second ADMIN)" }
        dl #operation data-id=(op.id) data-status=(status) data-action=(op.action) {
            dt { "Status" } dd.status { (status) " — " (op.done) " / " (op.letters) " letter(s) done" }
            dt { "Verdicts at the dry run" } dd { "safe: " (detail.safe) ", already_applied: " (detail.already_applied) ", needs_human: " (detail.needs_human) "; with money at stake: " (op.letters_with_money) }
            dt { "Requested" } dd { (op.requested_by) ", " (at(op.requested_at)) "; expires " (at(op.expires_at)) }
            @if let (Some(by), Some(when)) = (&op.approved_by, op.approved_at) {
                dt { "Approved" } dd.approved { (by) ", " (at(when)) }
            }
            dt { "Hash" } dd { code.hash { (op.content_hash) } }
        }
    }
}

fn buttons(detail: &OperationDetail, session: &Session) -> Markup {
    let op = &detail.operation;
    let acts_on = match op.action {
        OperationAction::Replay => detail.safe,
        OperationAction::Archive => u64::from(op.letters),
    };
    let label = match op.action {
        OperationAction::Replay => format!("Replay the {acts_on} safe letter(s)"),
        OperationAction::Archive => format!("Archive the {acts_on} letter(s)"),
    };
    html! {
        @if op.expired {
            p.flash.warn { "This operation expired before it started: run the dry run again." }
        } @else if op.status == OperationStatus::AwaitingApproval {
            p.hint #awaiting { "Four-eyes: this " (op.action) " waits for a second ADMIN to approve exactly what is shown here." }
            @if super::approvals::requested_by(&session.caller.actor, op.requested_by_issuer.as_deref(), op.requested_by_subject.as_deref()) {
                p.hint { "You requested it: another ADMIN approves it from this page." }
            } @else {
                form method="post" action=(format!("{}/approve", href(op.id))) {
                    input type="hidden" name="hash" value=(op.content_hash);
                    button type="submit" { "Approve" }
                }
            }
        } @else if matches!(op.status, OperationStatus::Ready | OperationStatus::Running) {
            form method="post" action=(format!("{}/execute", href(op.id))) {
                @if acts_on == 0 {
                    button type="submit" disabled { "Nothing is safe to replay" }
                } @else {
                    button.danger[op.action == OperationAction::Archive] type="submit" { (label) }
                }
            }
        }
    }
}

/// `POST /console/operations/{id}/approve` (`hash`).
pub(crate) async fn approve(
    State(state): State<AppState>,
    session: Session,
    OperationId(id): OperationId,
    form: FormFields,
) -> Response {
    let path = format!("/v1/admin/dead-letters/operations/{id}/approve");
    let hash = form.get("hash").unwrap_or_default();
    let answer = actions::call(
        &state,
        &session,
        Method::POST,
        &path,
        Some(json!({ "hash": hash })),
    )
    .await;
    let flash = answer.failure(&Method::POST, &path).unwrap_or_else(|| {
        Flash::Done(format!(
            "Approved by {}: it may run now.",
            session.caller.actor.name
        ))
    });
    render(&state, &session, id, Some(flash), &[]).await
}

/// `POST /console/operations/{id}/execute`.
pub(crate) async fn execute(
    State(state): State<AppState>,
    session: Session,
    OperationId(id): OperationId,
) -> Response {
    let path = format!("/v1/admin/dead-letters/operations/{id}/execute");
    let answer = actions::call(&state, &session, Method::POST, &path, Some(json!({}))).await;
    if let Some(failure) = answer.failure(&Method::POST, &path) {
        return render(&state, &session, id, Some(failure), &[]).await;
    }
    let resent: Vec<Resent> = answer.body["results"]
        .as_array()
        .map(|results| {
            results
                .iter()
                .filter_map(|r| {
                    Some((
                        r["id"].as_u64()?,
                        r["replay_message_id"].as_str()?.to_owned(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let count = |field: &str| answer.body[field].as_u64().unwrap_or(0);
    let flash = Flash::Done(format!(
        "Executed: replayed: {}, archived: {}, already_applied: {}, needs_human: {}, skipped: {}{}{}.",
        count("replayed"),
        count("archived"),
        count("already_applied"),
        count("needs_human"),
        count("skipped"),
        match count("by_another_execution") {
            0 => String::new(),
            by_another => format!(", acted on by another execution meanwhile: {by_another}"),
        },
        match count("remaining") {
            0 => String::new(),
            left => format!("; {left} letter(s) left: execute again to go on"),
        }
    ));
    render(&state, &session, id, Some(flash), &resent).await
}

fn at(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}
