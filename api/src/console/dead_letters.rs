//! The dead-letters page: letters waiting for ops (status NEW), grouped by function and
//! reason with the money they hold up, a group's letters, and the dry-run / replay / archive
//! buttons.
//!
//! The reads are the dead-letter library's (`paybus_dead_letter_ops::groups::overview` and
//! `letter::list`, what `GET /v1/admin/dead-letters/groups` and `GET /v1/admin/dead-letters`
//! answer). The buttons call the dead-letter admin API (`POST /v1/admin/dead-letters/replay`
//! with `{group: {function, reason} | ids: [...], dry_run}` and `POST
//! /v1/admin/dead-letters/archive` with `{group | ids}`), and the page shows what it answered
//! letter by letter: the dry run's verdict and reason for each letter, the replay's verdict
//! (taken again under the letter's lock), result and re-sent message id for each.

use axum::{
    extract::{Query, State, rejection::QueryRejection},
    http::{Method, StatusCode},
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use paybus_dead_letter_ops::{ExposureSum, ListFilter, Overview, groups, letter};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    FormFields, Session, actions,
    layout::{self, Flash},
};
use crate::{AppState, dead_letters::into_api};

/// Letters shown in a group (the newest first).
const LETTERS_SHOWN: u32 = 200;

const REPLAY: &str = "/v1/admin/dead-letters/replay";
const ARCHIVE: &str = "/v1/admin/dead-letters/archive";

/// `GET /console/dead-letters`.
pub(crate) async fn groups(State(state): State<AppState>, session: Session) -> Response {
    render_groups(&state, &session, None, None).await
}

async fn render_groups(
    state: &AppState,
    session: &Session,
    flash: Option<Flash>,
    outcome: Option<Markup>,
) -> Response {
    let overview = async {
        let mut conn = state.pool.acquire().await?;
        groups::overview(&mut conn, &state.dead_letters)
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
        Some(session),
        html! {
            @if let Some(flash) = &flash { (flash) }
            @if let Some(outcome) = &outcome { (outcome) }
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
                                tr.letter data-letter-id=(letter.id) {
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
    let mode = selection.mode.as_deref().unwrap_or("dry-run");
    if mode == "archive" {
        return send_archive(&state, &session, &selection).await;
    }
    let dry_run = mode != "replay";
    let mut body = selection.target();
    body["dry_run"] = json!(dry_run);
    let answer = actions::call(&state, &session, Method::POST, REPLAY, Some(body)).await;
    if let Some(failure) = answer.failure(&Method::POST, REPLAY) {
        return render_groups(&state, &session, Some(failure), None).await;
    }
    let (flash, outcome) = if dry_run {
        dry_run_outcome(&selection, &answer.body)
    } else {
        replay_outcome(&selection, &answer.body)
    };
    render_groups(&state, &session, Some(flash), Some(outcome)).await
}

/// The dry run's answer (`DryRun`), as far as the page shows it.
#[derive(Debug, Deserialize)]
struct DryRunView {
    already_applied: u64,
    safe: u64,
    needs_human: u64,
    #[serde(default)]
    remaining: u64,
    letters: Vec<ClassifiedView>,
}

#[derive(Debug, Deserialize)]
struct ClassifiedView {
    letter: LetterView,
    triage: TriageView,
}

#[derive(Debug, Deserialize)]
struct LetterView {
    id: u64,
    function_name: String,
}

#[derive(Debug, Deserialize)]
struct TriageView {
    verdict: String,
    reason: String,
    exposure: Option<ExposureView>,
}

#[derive(Debug, Deserialize)]
struct ExposureView {
    partner_id: Option<u64>,
    currency: String,
    amount: String,
}

/// The replay's answer (`ReplayReport`), as far as the page shows it.
#[derive(Debug, Deserialize)]
struct ReplayView {
    replayed: u64,
    already_applied: u64,
    needs_human: u64,
    skipped: u64,
    #[serde(default)]
    remaining: u64,
    results: Vec<ResultView>,
}

#[derive(Debug, Deserialize)]
struct ResultView {
    id: u64,
    function_name: String,
    verdict: Option<String>,
    result: String,
    detail: String,
    replay_message_id: Option<String>,
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

fn dry_run_outcome(selection: &Selection, body: &Value) -> (Flash, Markup) {
    let Ok(run) = serde_json::from_value::<DryRunView>(body.clone()) else {
        return unreadable("The dry run", body);
    };
    let flash = Flash::Done(format!(
        "Dry run of {}: {} letter(s) classified — safe: {}, already_applied: {}, \
         needs_human: {}. Nothing was sent{}.",
        selection.describe(),
        run.letters.len(),
        run.safe,
        run.already_applied,
        run.needs_human,
        remaining_note(run.remaining)
    ));
    let outcome = html! {
        section #outcome data-kind="dry-run" {
            h2 { "Dry run: each letter's verdict" }
            table #letter-verdicts {
                thead { tr { th.n { "Letter" } th { "Function" } th { "Verdict" } th { "Why" } th { "At stake" } } }
                tbody {
                    @for classified in &run.letters {
                        tr.verdict data-letter-id=(classified.letter.id) data-verdict=(classified.triage.verdict) {
                            td.n { (classified.letter.id) }
                            td { (classified.letter.function_name) }
                            td { span class=(format!("badge {}", classified.triage.verdict)) { (classified.triage.verdict) } }
                            td { (classified.triage.reason) }
                            td {
                                @match &classified.triage.exposure {
                                    Some(exposure) => {
                                        (exposure.amount) " " (exposure.currency)
                                        @if let Some(partner) = exposure.partner_id { " (partner " (partner) ")" }
                                    },
                                    None => { "—" },
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    (flash, outcome)
}

fn replay_outcome(selection: &Selection, body: &Value) -> (Flash, Markup) {
    let Ok(report) = serde_json::from_value::<ReplayView>(body.clone()) else {
        return unreadable("The replay", body);
    };
    let flash = Flash::Done(format!(
        "Replay of {}: replayed: {}, already_applied: {}, needs_human: {}, skipped: {}{}.",
        selection.describe(),
        report.replayed,
        report.already_applied,
        report.needs_human,
        report.skipped,
        remaining_note(report.remaining)
    ));
    let outcome = html! {
        section #outcome data-kind="replay" {
            h2 { "Replay: what happened to each letter" }
            p.hint { "Each verdict was taken again under the letter's lock; only safe letters were re-sent (through the outbox, as a new message)." }
            table #letter-results {
                thead { tr { th.n { "Letter" } th { "Function" } th { "Verdict" } th { "Result" } th { "Why" } th { "Re-sent as" } } }
                tbody {
                    @for result in &report.results {
                        tr.result data-letter-id=(result.id) data-verdict=(result.verdict.as_deref().unwrap_or("")) data-result=(result.result) {
                            td.n { (result.id) }
                            td { (result.function_name) }
                            td { (result.verdict.as_deref().unwrap_or("—")) }
                            td { span class=(format!("badge {}", result.result)) { (result.result) } }
                            td { (result.detail) }
                            td { code { (result.replay_message_id.as_deref().unwrap_or("—")) } }
                        }
                    }
                }
            }
        }
    };
    (flash, outcome)
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
            "Archived {}: archived: {}{}",
            selection.describe(),
            answer.body["archived"],
            remaining_note(answer.body["remaining"].as_u64().unwrap_or(0))
        ))
    });
    render_groups(state, session, Some(flash), None).await
}

fn at(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}
