//! The overview page, the console's first: `crate::overview` (what `GET /v1/admin/overview`
//! answers) as one screen — per function paused or consuming, queue depth, NEW dead letters and
//! the last hour's failures; what each function did over the last hour or day, drawn
//! (`crate::activity`, `?window=day`); the outbox's lag; stuck and held rows; breakers; the
//! auditor; and, first, a warning while the broker blocks this process's connection.

use axum::{
    extract::{
        Path, Query, State,
        rejection::{PathRejection, QueryRejection},
    },
    http::{Method, StatusCode},
    response::{IntoResponse, Response},
};
use maud::html;
use serde_json::json;

use super::charts::{self, Series};
use super::{
    FormFields, Session, actions,
    layout::{self, Flash},
};
use crate::{
    AppState,
    activity::{self, Activity, Window},
    overview,
};

#[derive(Debug, serde::Deserialize)]
pub(crate) struct OverviewQuery {
    window: Option<Window>,
}

/// `GET /console/overview[?window=hour|day]`.
pub(crate) async fn page(
    State(state): State<AppState>,
    session: Session,
    query: Result<Query<OverviewQuery>, QueryRejection>,
) -> Response {
    let Ok(Query(query)) = query else {
        return layout::error_page(
            StatusCode::BAD_REQUEST,
            "The window is hour (the default) or day.",
        );
    };
    let window = query.window.unwrap_or_default();
    render_window(&state, &session, None, window).await
}

/// `POST /console/functions/{name}/pause` (`reason`) and `.../resume`: the admin API's switch.
pub(crate) async fn pause(
    State(state): State<AppState>,
    session: Session,
    name: Result<Path<String>, PathRejection>,
    form: FormFields,
) -> Response {
    let Ok(Path(name)) = name else {
        return layout::error_page(StatusCode::BAD_REQUEST, "A function is named in the path.");
    };
    let reason = form.get("reason").unwrap_or_default().trim();
    let reason = if reason.is_empty() {
        "paused from the console"
    } else {
        reason
    };
    let path = format!(
        "/v1/admin/functions/{}/pause",
        super::percent_encoded(&name)
    );
    let answer = actions::call(
        &state,
        &session,
        Method::POST,
        &path,
        Some(json!({"reason": reason})),
    )
    .await;
    let flash = answer.failure(&Method::POST, &path).unwrap_or_else(|| {
        Flash::Done(format!(
            "{name} paused: every process stops taking its deliveries within a couple of seconds; they wait in its queue."
        ))
    });
    render(&state, &session, Some(flash)).await
}

pub(crate) async fn resume(
    State(state): State<AppState>,
    session: Session,
    name: Result<Path<String>, PathRejection>,
) -> Response {
    let Ok(Path(name)) = name else {
        return layout::error_page(StatusCode::BAD_REQUEST, "A function is named in the path.");
    };
    let path = format!(
        "/v1/admin/functions/{}/resume",
        super::percent_encoded(&name)
    );
    let answer = actions::call(&state, &session, Method::POST, &path, Some(json!({}))).await;
    let flash = answer
        .failure(&Method::POST, &path)
        .unwrap_or_else(|| Flash::Done(format!("{name} resumed: its queue drains.")));
    render(&state, &session, Some(flash)).await
}

async fn render(state: &AppState, session: &Session, flash: Option<Flash>) -> Response {
    render_window(state, session, flash, Window::Hour).await
}

async fn render_window(
    state: &AppState,
    session: &Session,
    flash: Option<Flash>,
    window: Window,
) -> Response {
    let overview = match overview::read(state).await {
        Ok(overview) => overview,
        Err(error) => return layout::failure_page(error),
    };
    let activity = match activity::read(state, window).await {
        Ok(activity) => activity,
        Err(error) => return layout::failure_page(error),
    };
    let seconds = |s: f64| format!("{s:.1} s");
    layout::page(
        "Overview",
        Some(&session.caller),
        html! {
            @if let Some(flash) = &flash { (flash) }
            @if let Some(reason) = &overview.broker_blocked {
                p.flash.warn #broker-blocked role="alert" {
                    "The broker blocks this process's connection: " strong { (reason) } ". "
                    "A resource alarm (memory or disk) on the broker: nothing is published until it clears, and committed messages wait in the outbox. "
                    "The runbook: " code { "docs/operations.md#the-broker-blocks-publishers" } "."
                }
            }
            @if overview.break_glass.changes_last_day > 0 {
                p.flash.warn #break-glass role="alert" {
                    "Break-glass tokens changed things here in the last 24 hours: "
                    strong { (overview.break_glass.changes_last_day) " change(s)" }
                    " by " (overview.break_glass.names.join(", "))
                    @if let Some(at) = overview.break_glass.last_change_at { ", the latest at " (at.format("%Y-%m-%d %H:%M:%S UTC")) }
                    ". Whoever holds the shared secret can mint any name: the ops log marks each one. The runbook: "
                    code { "docs/operations.md#break-glass" } "."
                }
            } @else if overview.break_glass.enabled {
                p.flash.warn #break-glass role="status" {
                    "Break-glass is on (PAYBUS_BREAK_GLASS): this API also takes tokens signed with the shared secret, each marked break-glass. None changed anything in the last 24 hours."
                }
            }
            @if overview.broker_unreachable {
                p.flash.warn role="status" { "The broker could not be asked for its queues: their depth is unknown." }
            }
            h2 { "Functions" }
            p.hint { "What each function did over time: " a href="#activity" { "Activity" } ", below." }
            (layout::wide_table("Functions", html! {
                table #functions {
                    thead { tr { th { "Function" } th { "State" } th { "Switch" } th { "Queue" } th.n { "Ready" } th.n { "Consumers" } th.n { "NEW dead letters" } th.n { "Failures, last hour" } } }
                    tbody {
                        @for function in &overview.functions {
                            @for (i, (queue, depth)) in function.queues.iter().enumerate() {
                                tr.function data-function=(function.name) data-paused=(function.paused.is_some()) {
                                    @if i == 0 {
                                        td { (function.name) }
                                        td {
                                            @match &function.paused {
                                                Some(pause) => { span.badge.FAILED { "paused" } " by " (pause.paused_by) ": " (pause.reason) },
                                                None => { span.badge.DONE { "consuming" } },
                                            }
                                        }
                                        td {
                                            @if function.paused.is_some() {
                                                form method="post" action=(format!("/console/functions/{}/resume", function.name)) { button type="submit" { "Resume" } }
                                            } @else {
                                                form method="post" action=(format!("/console/functions/{}/pause", function.name)) {
                                                    input type="text" name="reason" placeholder="why" aria-label=(format!("why pause {}", function.name));
                                                    " " button.danger type="submit" { "Pause" }
                                                }
                                            }
                                        }
                                    } @else { td {} td {} td {} }
                                    td { code { (queue) } }
                                    td.n.ready { (depth.map_or_else(|| "—".to_owned(), |d| d.ready.to_string())) }
                                    td.n { (depth.map_or_else(|| "—".to_owned(), |d| d.consumers.to_string())) }
                                    @if i == 0 {
                                        td.n.dead-letters { a href="/console/dead-letters" { (function.dead_letters_new) } }
                                        td.n.failures { (function.failures_last_hour) }
                                    } @else { td {} td {} }
                                }
                            }
                        }
                    }
                }
            }))
            (activity_section(&activity))
            h2 { "Outbox" }
            p #outbox data-backlog=(overview.outbox.backlog) {
                (overview.outbox.backlog) " message(s) not yet published"
                @if overview.outbox.backlog > 0 { ", the oldest for " (seconds(overview.outbox.oldest_seconds)) }
            }
            h2 { "Work tables" }
            (layout::wide_table("Work tables", html! {
                table #work-tables {
                    thead { tr { th { "Table" } th.n { "Due for a retry" } th.n { "Stuck" } th.n { "Held for a human" } } }
                    tbody {
                        @for line in &overview.work_tables {
                            tr data-table=(line.table) { td { code { (line.table) } } td.n { (line.due) } td.n.stuck { (line.stuck) } td.n { (line.held_for_a_human.map_or_else(|| "—".to_owned(), |n| n.to_string())) } }
                        }
                    }
                }
            }))
            h2 { "Partner webhook breakers" }
            @if overview.breakers.is_empty() {
                p #breakers { "Every partner's breaker is closed." }
            } @else {
                (layout::wide_table("Partner webhook breakers", html! {
                    table #breakers {
                        thead { tr { th { "Partner" } th { "State" } th.n { "Consecutive failures" } th { "Open until" } } }
                        tbody {
                            @for b in &overview.breakers {
                                tr data-state=(b.state) { td { (b.name) " (" (b.partner_id) ")" } td { (b.state) } td.n { (b.failures) } td { (b.open_until.map_or_else(|| "—".to_owned(), |t| t.to_rfc3339())) } }
                            }
                        }
                    }
                }))
            }
            h2 { "The continuous auditor" }
            p #auditor data-violations=(overview.auditor.last_pass_violations.map_or_else(|| "unknown".to_owned(), |v| v.to_string())) {
                @match (overview.auditor.last_pass_at, overview.auditor.last_pass_violations) {
                    (Some(at), Some(violations)) => {
                        "Last pass " (at.format("%Y-%m-%d %H:%M:%S UTC")) " ("
                        (overview.auditor.last_pass_age_seconds.map_or_else(String::new, seconds)) " ago): "
                        (violations) " violation(s). " a href="/console/audit" { "Details" }
                    },
                    _ => { "No pass yet: the sweeper's auditor job runs it." },
                }
            }
        },
    )
    .into_response()
}

/// The charts: per function with any messages in the window, its outcomes; dead letters per
/// hour; each queue's ready messages; the outbox's backlog and oldest age.
fn activity_section(activity: &Activity) -> maud::Markup {
    let (label, per, other, other_label) = match activity.window {
        Window::Hour => ("%H:%M", "minute", "day", "the last day, by hour"),
        Window::Day => ("%d %H:00", "hour", "hour", "the last hour, by minute"),
    };
    let (busy, quiet): (Vec<_>, Vec<_>) = activity.functions.iter().partition(|f| {
        [&f.done, &f.skipped, &f.retried, &f.failed]
            .iter()
            .any(|series| series.iter().any(|n| *n > 0))
    });
    html! {
        section #activity data-window=(match activity.window { Window::Hour => "hour", Window::Day => "day" }) {
            h2 { "Activity, " (match activity.window { Window::Hour => "the last hour", Window::Day => "the last day" }) " (UTC)" }
            p.hint {
                "Messages per " (per) " as every process counted them (written every 10 s; a Lambda's after each batch). "
                a href=(format!("/console/overview?window={other}#activity")) { "Show " (other_label) }
            }
            @for function in &busy {
                (charts::chart(
                    &format!("chart-{}", function.name),
                    &format!("{}: messages per {per}", function.name),
                    &activity.buckets,
                    label,
                    &[
                        Series::counts("done", &function.done),
                        Series::counts("skipped", &function.skipped),
                        Series::counts("retried", &function.retried),
                        Series::counts("failed", &function.failed),
                    ],
                ))
            }
            @if !quiet.is_empty() {
                p #quiet-functions { "No messages in this window: " (quiet.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(", ")) "." }
            }
            @if activity.dead_letters.is_empty() {
                p #dead-letters-per-hour { "No dead letter in the last 24 hours." }
            } @else {
                (charts::chart(
                    "chart-dead-letters",
                    "Dead letters per hour, the last 24 hours",
                    &activity.dead_letter_hours,
                    "%d %H:00",
                    &activity
                        .dead_letters
                        .iter()
                        .map(|d| Series::counts(&d.function, &d.per_hour))
                        .collect::<Vec<_>>(),
                ))
            }
            (charts::chart(
                "chart-queues",
                &format!("Messages ready in each queue (sampled each minute; the {per}'s highest)"),
                &activity.buckets,
                label,
                &activity
                    .queues
                    .iter()
                    .map(|q| Series::samples(&q.queue, &q.ready))
                    .collect::<Vec<_>>(),
            ))
            (charts::chart(
                "chart-outbox",
                &format!("Outbox: messages not yet published (sampled each minute; the {per}'s highest)"),
                &activity.buckets,
                label,
                &[Series::samples("backlog", &activity.outbox_backlog)],
            ))
        }
    }
}
