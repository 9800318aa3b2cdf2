//! The dead-letters page: letters waiting for ops (status NEW), grouped by function and
//! reason, a group's letters, and the dry-run / replay / archive buttons.
//!
//! The buttons call the dead-letter admin API (`POST /v1/admin/dead-letters/replay` with
//! `{group: {function, reason} | ids: [...], dry_run}` and `POST
//! /v1/admin/dead-letters/archive` with `{group | ids}`); while this build has no such routes
//! the page says so and changes nothing. The read below is the console's own, over the
//! `dead_letters` table the recorders write (its index `index_dead_letters_by_function_reason`
//! serves both queries).

use axum::{
    extract::{Query, State, rejection::QueryRejection},
    http::{Method, StatusCode},
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::MySqlConnection;

use super::{
    FormFields, Session, actions,
    layout::{self, Flash},
};
use crate::AppState;

/// Groups shown (the largest first), letters shown in a group (the newest first).
const GROUPS_SHOWN: u32 = 200;
const LETTERS_SHOWN: u32 = 200;

const REPLAY: &str = "/v1/admin/dead-letters/replay";
const ARCHIVE: &str = "/v1/admin/dead-letters/archive";

/// Letters of one function that failed for one reason.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Group {
    pub(crate) function_name: String,
    pub(crate) reason: String,
    pub(crate) letters: i64,
    pub(crate) first_failed_at: DateTime<Utc>,
    pub(crate) last_failed_at: DateTime<Utc>,
}

/// NEW dead letters grouped by function and reason, the largest group first.
pub(crate) async fn groups_waiting(conn: &mut MySqlConnection) -> Result<Vec<Group>, sqlx::Error> {
    sqlx::query_as(
        "SELECT function_name, reason, COUNT(*) AS letters, MIN(failed_at) AS first_failed_at, \
                MAX(failed_at) AS last_failed_at \
         FROM dead_letters WHERE status = 'NEW' \
         GROUP BY function_name, reason ORDER BY letters DESC, function_name, reason LIMIT ?",
    )
    .bind(GROUPS_SHOWN)
    .fetch_all(conn)
    .await
}

/// One dead letter, as a group lists it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Letter {
    pub(crate) id: u64,
    pub(crate) message_id: Option<String>,
    pub(crate) routing_key: String,
    pub(crate) error: String,
    pub(crate) attempts: u32,
    pub(crate) failed_at: DateTime<Utc>,
}

/// A group's NEW letters, the newest first.
pub(crate) async fn letters_of(
    conn: &mut MySqlConnection,
    function_name: &str,
    reason: &str,
) -> Result<Vec<Letter>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, message_id, routing_key, error, attempts, failed_at FROM dead_letters \
         WHERE function_name = ? AND reason = ? AND status = 'NEW' ORDER BY id DESC LIMIT ?",
    )
    .bind(function_name)
    .bind(reason)
    .bind(LETTERS_SHOWN)
    .fetch_all(conn)
    .await
}

/// `GET /console/dead-letters`.
pub(crate) async fn groups(State(state): State<AppState>, session: Session) -> Response {
    render_groups(&state, &session, None).await
}

async fn render_groups(state: &AppState, session: &Session, flash: Option<Flash>) -> Response {
    let groups = async {
        let mut conn = state.pool.acquire().await?;
        groups_waiting(&mut conn).await
    };
    let groups = match groups.await {
        Ok(groups) => groups,
        Err(error) => return layout::failure_page(error.into()),
    };
    layout::page(
        "Dead letters",
        Some(session),
        html! {
            @if let Some(flash) = &flash { (flash) }
            @if groups.is_empty() {
                p.flash { "No dead letter is waiting: nothing failed for good." }
            } @else {
                p.hint { "Letters waiting for ops (NEW), grouped by function and reason. A dry run classifies each letter (already applied, safe to replay, needs a human) and changes nothing; replay sends only the safe ones." }
                table {
                    thead { tr { th { "Function" } th { "Reason" } th.n { "Letters" } th { "First" } th { "Last" } th { "Actions" } } }
                    tbody {
                        @for group in &groups {
                            tr.group data-function=(group.function_name) data-reason=(group.reason) {
                                td { a href=(group_href(&group.function_name, &group.reason)) { (group.function_name) } }
                                td { code { (group.reason) } }
                                td.n { (group.letters) }
                                td { (at(group.first_failed_at)) }
                                td { (at(group.last_failed_at)) }
                                td { (group_buttons(&group.function_name, &group.reason)) }
                            }
                        }
                    }
                }
            }
        },
    )
    .into_response()
}

fn group_href(function_name: &str, reason: &str) -> String {
    format!(
        "/console/dead-letters/group?function={}&reason={}",
        super::percent_encoded(function_name),
        super::percent_encoded(reason)
    )
}

fn group_buttons(function_name: &str, reason: &str) -> Markup {
    html! {
        form method="post" action="/console/dead-letters/replay" style="display:inline" {
            input type="hidden" name="function" value=(function_name);
            input type="hidden" name="reason" value=(reason);
            button type="submit" name="mode" value="dry-run" { "Dry run" }
            " "
            button type="submit" name="mode" value="replay" { "Replay safe ones" }
        }
        " "
        form method="post" action="/console/dead-letters/archive" style="display:inline" {
            input type="hidden" name="function" value=(function_name);
            input type="hidden" name="reason" value=(reason);
            button.danger type="submit" { "Archive" }
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct GroupQuery {
    function: String,
    reason: String,
}

/// `GET /console/dead-letters/group?function=..&reason=..`: the group's letters.
pub(crate) async fn group(
    State(state): State<AppState>,
    session: Session,
    query: Result<Query<GroupQuery>, QueryRejection>,
) -> Response {
    let Ok(Query(query)) = query else {
        return layout::error_page(
            StatusCode::BAD_REQUEST,
            "A group is named by ?function=...&reason=...",
        );
    };
    let (function_name, reason) = (query.function, query.reason);
    let letters = async {
        let mut conn = state.pool.acquire().await?;
        letters_of(&mut conn, &function_name, &reason).await
    };
    let letters = match letters.await {
        Ok(letters) => letters,
        Err(error) => return layout::failure_page(error.into()),
    };
    let title = format!("Dead letters: {function_name} / {reason}");
    layout::page(
        &title,
        Some(&session),
        html! {
            p { a href="/console/dead-letters" { "← all groups" } }
            @if letters.is_empty() {
                p.flash { "No letter of this group is waiting." }
            } @else {
                p { (group_buttons(&function_name, &reason)) }
                form method="post" action="/console/dead-letters/replay" {
                    input type="hidden" name="function" value=(function_name);
                    input type="hidden" name="reason" value=(reason);
                    table {
                        thead { tr { th {} th.n { "Id" } th { "Message" } th { "Routing key" } th { "Error" } th.n { "Attempts" } th { "Failed at" } } }
                        tbody {
                            @for letter in &letters {
                                tr {
                                    td { input type="checkbox" name="ids" value=(letter.id) aria-label=(format!("letter {}", letter.id)); }
                                    td.n { (letter.id) }
                                    td { code { (letter.message_id.as_deref().unwrap_or("—")) } }
                                    td { code { (letter.routing_key) } }
                                    td { (letter.error) }
                                    td.n { (letter.attempts) }
                                    td { (at(letter.failed_at)) }
                                }
                            }
                        }
                    }
                    p {
                        "Ticked letters: "
                        button type="submit" name="mode" value="dry-run" { "Dry run" }
                        " "
                        button type="submit" name="mode" value="replay" { "Replay safe ones" }
                        " "
                        button.danger type="submit" name="mode" value="archive" { "Archive" }
                    }
                }
            }
        },
    )
    .into_response()
}

/// The buttons' form: a group, or ticked `ids` within it.
#[derive(Debug)]
pub(crate) struct Selection {
    function: String,
    reason: String,
    mode: Option<String>,
    ids: Vec<u64>,
}

impl Selection {
    /// The selection, or what is wrong with the form.
    fn from_form(form: &FormFields) -> Result<Self, &'static str> {
        let (Some(function), Some(reason)) = (form.get("function"), form.get("reason")) else {
            return Err("The form names no group (function and reason).");
        };
        let ids = form
            .all("ids")
            .map(str::parse)
            .collect::<Result<Vec<u64>, _>>()
            .map_err(|_| "ids must be letter ids")?;
        Ok(Self {
            function: function.to_owned(),
            reason: reason.to_owned(),
            mode: form.get("mode").map(str::to_owned),
            ids,
        })
    }

    fn target(&self) -> Value {
        if self.ids.is_empty() {
            json!({"group": {"function": self.function, "reason": self.reason}})
        } else {
            json!({"ids": self.ids})
        }
    }

    fn describe(&self) -> String {
        if self.ids.is_empty() {
            format!("group {} / {}", self.function, self.reason)
        } else {
            format!(
                "{} ticked letter(s) of {} / {}",
                self.ids.len(),
                self.function,
                self.reason
            )
        }
    }
}

/// `POST /console/dead-letters/replay` (`mode` dry-run, replay, or archive from the group
/// page's one form).
pub(crate) async fn replay(
    State(state): State<AppState>,
    session: Session,
    form: FormFields,
) -> Response {
    let selection = match Selection::from_form(&form) {
        Ok(selection) => selection,
        Err(problem) => return layout::error_page(StatusCode::BAD_REQUEST, problem),
    };
    let mode = selection.mode.as_deref().unwrap_or("dry-run");
    if mode == "archive" {
        return send_archive(&state, &session, &selection).await;
    }
    let dry_run = mode != "replay";
    let mut body = selection.target();
    body["dry_run"] = json!(dry_run);
    let answer = actions::call(&state, &session, Method::POST, REPLAY, Some(body)).await;
    let what = if dry_run { "Dry run" } else { "Replay" };
    let flash = answer.failure(&Method::POST, REPLAY).unwrap_or_else(|| {
        Flash::Done(format!(
            "{what} of {}: {}",
            selection.describe(),
            summary(&answer.body)
        ))
    });
    render_groups(&state, &session, Some(flash)).await
}

/// `POST /console/dead-letters/archive`.
pub(crate) async fn archive(
    State(state): State<AppState>,
    session: Session,
    form: FormFields,
) -> Response {
    match Selection::from_form(&form) {
        Ok(selection) => send_archive(&state, &session, &selection).await,
        Err(problem) => layout::error_page(StatusCode::BAD_REQUEST, problem),
    }
}

async fn send_archive(state: &AppState, session: &Session, selection: &Selection) -> Response {
    let answer = actions::call(
        state,
        session,
        Method::POST,
        ARCHIVE,
        Some(selection.target()),
    )
    .await;
    let flash = answer.failure(&Method::POST, ARCHIVE).unwrap_or_else(|| {
        Flash::Done(format!(
            "Archived {}: {}",
            selection.describe(),
            summary(&answer.body)
        ))
    });
    render_groups(state, session, Some(flash)).await
}

/// The API's answer in one line (its exact shape belongs to the dead-letter API).
fn summary(body: &Value) -> String {
    match body {
        Value::Object(fields) => fields
            .iter()
            .filter(|(_, value)| !value.is_array() && !value.is_object())
            .map(|(name, value)| format!("{name}: {value}"))
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    }
}

fn at(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}
