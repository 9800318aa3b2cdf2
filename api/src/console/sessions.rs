//! The sessions page (ADMIN): who is signed in to the console, and ending a session
//! (`GET /v1/admin/console-sessions`, `POST /v1/admin/console-sessions/{id}/end`). Both are
//! admin API calls, so the list is ADMIN only here as it is there.

use axum::{
    extract::{Path, State, rejection::PathRejection},
    http::Method,
    response::{IntoResponse, Response},
};
use maud::html;
use serde_json::Value;

use super::{
    Session, actions,
    layout::{self, Flash, SESSIONS},
};
use crate::AppState;

const LIST: &str = "/v1/admin/console-sessions";

/// `GET /console/sessions`.
pub(crate) async fn page(State(state): State<AppState>, session: Session) -> Response {
    render(&state, &session, None).await
}

async fn render(state: &AppState, session: &Session, flash: Option<Flash>) -> Response {
    let answer = actions::call(state, session, Method::GET, LIST, None).await;
    if !answer.status.is_success() {
        return match answer
            .failure(&Method::GET, LIST)
            .filter(|_| answer.no_route)
        {
            Some(no_route) => layout::page(SESSIONS.1, Some(&session.caller), html! { (no_route) })
                .into_response(),
            None => layout::error_page(answer.status, answer.error()),
        };
    }
    let sessions = answer.body["sessions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    let time = |value: &Value| {
        chrono::DateTime::parse_from_rfc3339(value.as_str().unwrap_or_default())
            .map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_default()
    };
    let this = session.id.to_string();
    layout::page(
        SESSIONS.1,
        Some(&session.caller),
        html! {
            @if let Some(flash) = &flash { (flash) }
            p.hint { (sessions.len()) " active console session(s), newest first. Ending one signs its holder out at their next request (times UTC)." }
            (layout::wide_table("Active sessions", html! {
                table #sessions {
                    thead { tr { th { "Who" } th { "Issuer" } th { "Subject" } th { "How" } th { "Roles" } th { "Signed in" } th { "Last seen" } th { "Expires" } th { (layout::unseen("Actions")) } } }
                    tbody {
                        @for row in &sessions {
                            @let id = text(&row["id"]);
                            tr.session data-id=(id) data-subject=(text(&row["subject"])) {
                                td {
                                    (text(&row["name"]))
                                    @if id == this { " " span.badge { "this session" } }
                                }
                                td { (text(&row["issuer"])) }
                                td { (text(&row["subject"])) }
                                td { span class=(format!("badge {}", text(&row["auth_method"]))) { (text(&row["auth_method"])) } }
                                td {
                                    @for (i, role) in row["roles"].as_array().into_iter().flatten().enumerate() {
                                        @if i > 0 { ", " } (role.as_str().unwrap_or_default())
                                    }
                                }
                                td { (time(&row["created_at"])) }
                                td { (time(&row["last_seen_at"])) }
                                td { (time(&row["expires_at"])) }
                                td {
                                    form method="post" action=(format!("/console/sessions/{id}/end")) {
                                        button.danger type="submit" aria-label=(format!("End the session of {}", text(&row["name"]))) { "End" }
                                    }
                                }
                            }
                        }
                    }
                }
            }))
        },
    )
    .into_response()
}

/// `POST /console/sessions/{id}/end`.
pub(crate) async fn end(
    State(state): State<AppState>,
    session: Session,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let Ok(Path(id)) = id else {
        return layout::error_page(
            axum::http::StatusCode::BAD_REQUEST,
            "the session id must be a UUID",
        );
    };
    let path = format!("{LIST}/{}/end", super::percent_encoded(&id));
    let answer = actions::call(&state, &session, Method::POST, &path, None).await;
    let flash = answer.failure(&Method::POST, &path).unwrap_or_else(|| {
        Flash::Done(format!(
            "The session of {} ({} {}) is ended: its cookie no longer opens the console.",
            answer.body["name"].as_str().unwrap_or("?"),
            answer.body["issuer"].as_str().unwrap_or("?"),
            answer.body["subject"].as_str().unwrap_or("?"),
        ))
    });
    render(&state, &session, Some(flash)).await
}
