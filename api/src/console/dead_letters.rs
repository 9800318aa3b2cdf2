//! The dead-letters page: letters waiting for ops (status NEW), grouped by function and
//! reason with the money they hold up, a group's letters, and the dry-run / replay / archive
//! buttons.
//!
//! The reads are the dead-letter library's (`paybus_dead_letter_ops::groups::overview`,
//! `letter::list` and `detail::show`, what `GET /v1/admin/dead-letters/groups`, `GET
//! /v1/admin/dead-letters` and `GET /v1/admin/dead-letters/{id}` answer). The buttons call the
//! dead-letter admin API: *Dry run* and *Archive* freeze the selection into an operation (`POST
//! /v1/admin/dead-letters/operations`) and show its page (`super::operations`), the
//! confirmation step whose button acts on exactly those letters (*Replay safe ones* included:
//! the page shows how many are safe, and under four-eyes waits for a second ADMIN).

use axum::{
    extract::{Path, Query, State, rejection::PathRejection, rejection::QueryRejection},
    http::{Method, StatusCode},
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use paybus_dead_letter_ops::{ExposureSum, ListFilter, Overview, detail, groups, letter};
use paybus_ops::triage::Verdict;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{
    FormFields, Session, actions,
    layout::{self, Flash},
    operations,
};
use crate::{AppState, dead_letters::into_api};

/// Letters shown in a group (the newest first).
const LETTERS_SHOWN: u32 = 200;

const OPERATIONS: &str = "/v1/admin/dead-letters/operations";

/// `GET /console/dead-letters`.
pub(crate) async fn groups(State(state): State<AppState>, session: Session) -> Response {
    render_groups(&state, &session, None).await
}

async fn render_groups(state: &AppState, session: &Session, flash: Option<Flash>) -> Response {
    let overview = async {
        groups::overview(&state.pool, &state.dead_letters)
            .await
            .map_err(into_api)
    };
    let Overview {
        groups,
        exposure,
        exposure_complete,
    } = match overview.await {
        Ok(overview) => overview,
        Err(error) => return layout::failure_page(error),
    };
    layout::page(
        "Dead letters",
        Some(&session.caller),
        html! {
            @if let Some(flash) = &flash { (flash) }
            @if groups.is_empty() {
                p.flash { "No dead letter is waiting: nothing failed for good." }
            } @else {
                p.hint { "Letters waiting for ops (NEW), grouped by function and reason. A dry run classifies each letter (already applied, safe to replay, needs a human) and changes nothing; replay sends only the safe ones." }
                @if !exposure.is_empty() {
                    p #exposure {
                        "Money held up by letters a replay could still apply: "
                        (sums(&exposure))
                        @if !exposure_complete { " (at least: only the oldest letters were read)" }
                    }
                }
                (layout::wide_table("Dead-letter groups", html! {
                    table {
                        thead { tr { th { "Function" } th { "Reason" } th.n { "Letters" } th.n { "Failures" } th { "First" } th { "Last" } th { "At stake" } th { "Actions" } } }
                        tbody {
                            @for group in &groups {
                                tr.group data-function=(group.function) data-reason=(group.reason) {
                                    td { a href=(group_href(&group.function, &group.reason)) { (group.function) } }
                                    td { code { (group.reason) } }
                                    td.n.letters { (group.count) }
                                    td.n.failures { (group.failures) }
                                    td { (at(group.first_failed_at)) }
                                    td { (at(group.last_failed_at)) }
                                    td { (sums(&group.exposure)) }
                                    td { (group_buttons(&group.function, &group.reason)) }
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

/// Exposure sums in one line, biggest first: "100 USDT (partner 3), 5 CAN (members)", with
/// the part that waits for a human named.
fn sums(exposure: &[ExposureSum]) -> Markup {
    html! {
        @if exposure.is_empty() { "—" }
        @for (i, sum) in exposure.iter().enumerate() {
            @if i > 0 { ", " }
            span.exposure {
                (sum.amount) " " (sum.currency) " ("
                @match sum.partner_id {
                    Some(partner) => { "partner " (partner) },
                    None => { "members" },
                }
                ")"
                @if !sum.needs_a_human.is_zero() {
                    " — " span.needs-a-human { (sum.needs_a_human) " needs a human" }
                }
            }
        }
    }
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
        let filter = ListFilter {
            function: Some(function_name.clone()),
            reason: Some(reason.clone()),
            limit: Some(LETTERS_SHOWN),
            ..ListFilter::default()
        };
        letter::list(&mut conn, &filter).await.map_err(into_api)
    };
    let letters = match letters.await {
        Ok(letters) => letters,
        Err(error) => return layout::failure_page(error),
    };
    let title = format!("Dead letters: {function_name} / {reason}");
    layout::page(
        &title,
        Some(&session.caller),
        html! {
            p { a href="/console/dead-letters" { "← all groups" } }
            @if letters.is_empty() {
                p.flash { "No letter of this group is waiting." }
            } @else {
                p { (group_buttons(&function_name, &reason)) }
                form method="post" action="/console/dead-letters/replay" {
                    input type="hidden" name="function" value=(function_name);
                    input type="hidden" name="reason" value=(reason);
                    (layout::wide_table("The group's letters", html! {
                        table {
                            thead { tr { th { (layout::unseen("Tick to act on")) } th.n { "Id" } th { "Message" } th { "Routing key" } th { "Error" } th.n { "Attempts" } th { "Failed at" } } }
                            tbody {
                                @for letter in &letters {
                                    tr.letter data-letter-id=(letter.id) {
                                        td { input type="checkbox" name="ids" value=(letter.id) aria-label=(format!("letter {}", letter.id)); }
                                        td.n { a href=(format!("/console/dead-letters/letter/{}", letter.id)) { (letter.id) } }
                                        td { code { (letter.message_id.as_deref().unwrap_or("—")) } }
                                        td { code { (letter.routing_key) } }
                                        td { (letter.error) }
                                        td.n { (letter.attempts) }
                                        td { (at(letter.failed_at)) }
                                    }
                                }
                            }
                        }
                    }))
                    @if letters.len() == LETTERS_SHOWN as usize {
                        p.hint { "The newest " (LETTERS_SHOWN) " letters are shown; the group's buttons act on all of them." }
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
    // Every button freezes the selection first and shows the operation's page: what the
    // confirm button there acts on is what the page shows, counted.
    match selection.mode.as_deref().unwrap_or("dry-run") {
        "archive" => freeze(&state, &session, &selection, "archive").await,
        _ => freeze(&state, &session, &selection, "replay").await,
    }
}

/// The selection frozen into an operation (`action`), shown on its page.
async fn freeze(
    state: &AppState,
    session: &Session,
    selection: &Selection,
    action: &str,
) -> Response {
    let mut body = selection.target();
    body["action"] = json!(action);
    let answer = actions::call(state, session, Method::POST, OPERATIONS, Some(body)).await;
    if let Some(failure) = answer.failure(&Method::POST, OPERATIONS) {
        return render_groups(state, session, Some(failure)).await;
    }
    let Some(id) = answer.body["id"]
        .as_str()
        .and_then(|id| Uuid::parse_str(id).ok())
    else {
        let (flash, _) = unreadable("The dry run", &answer.body);
        return render_groups(state, session, Some(flash)).await;
    };
    let count = |field: &str| answer.body[field].as_u64().unwrap_or(0);
    let flash = Flash::Done(format!(
        "Dry run of {}: {} letter(s) classified — safe: {}, already_applied: {}, needs_human: \
         {}. Nothing was sent; the button below acts on these letters only{}.",
        selection.describe(),
        answer.body["letters"].as_u64().unwrap_or(0),
        count("safe"),
        count("already_applied"),
        count("needs_human"),
        remaining_note(count("not_included"))
    ));
    operations::render(state, session, id, Some(flash), &[]).await
}

/// An answer the page cannot read: shown as it came (its shape belongs to the API).
fn unreadable(what: &str, body: &Value) -> (Flash, Markup) {
    (
        Flash::Warn(format!(
            "{what} done, but its answer could not be read letter by letter: {body}"
        )),
        html! {},
    )
}

fn remaining_note(remaining: u64) -> String {
    if remaining == 0 {
        String::new()
    } else {
        format!("; {remaining} more letter(s) of the selection were left for another call")
    }
}

/// `POST /console/dead-letters/archive`: the selection frozen into an archive operation.
pub(crate) async fn archive(
    State(state): State<AppState>,
    session: Session,
    form: FormFields,
) -> Response {
    match Selection::from_form(&form) {
        Ok(selection) => freeze(&state, &session, &selection, "archive").await,
        Err(problem) => layout::error_page(StatusCode::BAD_REQUEST, problem),
    }
}

/// `GET /console/dead-letters/letter/{id}`: one letter — what failed, the rows it refers to as
/// they stand, the verdict a replay would get now and what to do about it, its trail.
pub(crate) async fn letter_page(
    State(state): State<AppState>,
    session: Session,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    let Ok(Path(id)) = id else {
        return layout::error_page(StatusCode::BAD_REQUEST, "A letter is named by its id.");
    };
    let detail = async {
        let mut conn = state.pool.acquire().await?;
        detail::show(&mut conn, &state.dead_letters, id)
            .await
            .map_err(into_api)
    };
    let detail = match detail.await {
        Ok(Some(detail)) => detail,
        Ok(None) => {
            return layout::error_page(
                StatusCode::NOT_FOUND,
                &format!("Dead letter {id} does not exist."),
            );
        }
        Err(error) => return layout::failure_page(error),
    };
    let l = &detail.letter;
    let pretty = |value: &Value| serde_json::to_string_pretty(value).unwrap_or_default();
    layout::page(
        &format!("Dead letter {id}"),
        Some(&session.caller),
        html! {
            p { a href=(group_href(&l.function_name, &l.reason)) { "← " (l.function_name) " / " (l.reason) } }
            dl #letter data-status=(l.status) data-verdict=(detail.triage.verdict) {
                dt { "Status" } dd { (l.status) }
                dt { "Failed" } dd { (l.failures) " time(s), first " (at(l.failed_at)) @if let Some(last) = l.last_failed_at { ", last " (at(last)) } }
                dt { "Error" } dd { (l.error) }
                dt { "Message" } dd { code { (l.message_id.as_deref().unwrap_or("—")) } " (" code { (l.routing_key) } ")" }
                dt { "A replay now" } dd.verdict { span class=(format!("badge {}", detail.triage.verdict)) { (detail.triage.verdict) } " " (detail.triage.reason) }
                dt { "What to do" } dd.next-step { (next_step(l.status, detail.triage.verdict)) }
            }
            h2 { "The rows it refers to, as they stand" }
            @for row in &detail.triage.referenced {
                h3 { (row.entity) " " (row.id) ": " (row.state.as_deref().unwrap_or("does not exist")) }
                pre { (pretty(&row.row)) }
            }
            h2 { "Body" }
            pre #body { (pretty(&detail.body)) }
            h2 { "Headers" }
            pre { (pretty(&detail.headers)) }
            h2 { "What ops did" }
            (layout::wide_table("What ops did", html! {
                table #trail {
                    thead { tr { th { "When" } th { "Action" } th { "Who" } th { "Verdict" } th { "Result" } th { "Operation" } } }
                    tbody {
                        @for action in &detail.actions {
                            tr { td { (at(action.created_at)) } td { (action.action) } td { (action.actor) } td { (action.verdict.as_deref().unwrap_or("—")) } td { (action.result) }
                                td { @match action.operation_id.as_deref().and_then(|id| Uuid::parse_str(id).ok()) { Some(op) => { a href=(operations::href(op)) { (op) } }, None => { "—" } } } }
                        }
                    }
                }
            }))
        },
    )
    .into_response()
}

/// What the on-call person does next about a letter in `status` with this verdict.
fn next_step(status: letter::LetterStatus, verdict: Verdict) -> &'static str {
    if status != letter::LetterStatus::New {
        return "Nothing: ops acted on it already (see below). A new failure of its message \
                makes it NEW again.";
    }
    match verdict {
        Verdict::Safe => "Replay it (a dry run of its group, then the button): it applies once.",
        Verdict::AlreadyApplied => {
            "Nothing to re-send: what it would do is done. Archive it once you know why it failed."
        }
        Verdict::NeedsHuman => {
            "Read the reason and the rows above: fix the row (or the partner's endpoint) and dry-run \
             again, or archive it with a note in your incident log. A replay will not send it."
        }
    }
}

fn at(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}
