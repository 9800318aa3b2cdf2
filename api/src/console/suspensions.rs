//! The suspensions page (W4): each suspended market's latest suspension with its progress
//! ("suspension in progress (6,204 / 8,000)"), refreshing itself every 2 s while one is still
//! moving (a `<meta refresh>`: live without JavaScript); ops retry a suspension's FAILED tasks
//! (`POST /v1/admin/markets/{symbol}/suspension/retry-failed`).

use axum::{
    extract::{Path, State, rejection::PathRejection},
    http::Method,
    response::{IntoResponse, Response},
};
use maud::html;
use paybus_markets::{
    market,
    progress::{self, Phase, Progress},
};

use super::{
    Session, actions,
    layout::{self, Flash},
};
use crate::{ApiError, AppState};

/// Suspensions shown, the newest first.
const SHOWN: u32 = 50;

/// `GET /console/suspensions`.
pub(crate) async fn page(State(state): State<AppState>, session: Session) -> Response {
    render(&state, &session, None).await
}

/// Every shown suspension's progress, from one snapshot.
async fn suspensions(state: &AppState) -> Result<Vec<Progress>, ApiError> {
    let mut tx = state.pool.begin().await?;
    let markets = market::with_suspension(&mut tx, SHOWN).await?;
    let mut shown = Vec::with_capacity(markets.len());
    for market in &markets {
        if let Some(progress) = progress::of_market(&mut tx, market).await? {
            shown.push(progress);
        }
    }
    tx.rollback().await?;
    Ok(shown)
}

async fn render(state: &AppState, session: &Session, flash: Option<Flash>) -> Response {
    let shown = match suspensions(state).await {
        Ok(shown) => shown,
        Err(error) => return layout::failure_page(error),
    };
    let moving = shown
        .iter()
        .any(|p| matches!(p.phase, Phase::Preparing | Phase::InProgress));
    let head = html! {
        @if moving && flash.is_none() { meta http-equiv="refresh" content="2"; }
    };
    layout::page_with_head(
        "Suspensions",
        Some(&session.caller),
        head,
        html! {
            @if let Some(flash) = &flash { (flash) }
            @if moving { p.hint { "A suspension is still moving: this page refreshes every 2 seconds." } }
            @if shown.is_empty() {
                p.flash { "No market has been suspended." }
            } @else {
                (layout::wide_table("Suspensions", html! {
                    table {
                        thead { tr { th { "Market" } th { "Status" } th { "Suspended at" } th { "Progress" } th.n { "Done" } th.n { "Skipped" } th.n { "Failed" } th.n { "Pending" } th.n { "Open orders" } th { (layout::unseen("Actions")) } } }
                        tbody {
                            @for p in &shown {
                                tr.suspension data-symbol=(p.symbol) data-phase=(p.phase) {
                                    td { strong { (p.symbol) } br; span.hint { (p.note.as_deref().unwrap_or("")) } }
                                    td { (p.market_status) br; span class=(format!("badge {}", p.phase)) { (p.phase) } }
                                    td { (p.suspended_at.format("%Y-%m-%d %H:%M:%S UTC")) }
                                    td {
                                        progress value=(p.tasks.settled()) max=(p.created.max(1)) {}
                                        br;
                                        span.summary { (p.summary) }
                                    }
                                    td.n { (p.tasks.done) }
                                    td.n { (p.tasks.skipped) }
                                    td.n { (p.tasks.failed) }
                                    td.n { (p.tasks.pending) }
                                    td.n { (p.open_orders) }
                                    td {
                                        @if p.tasks.failed > 0 {
                                            form method="post" action=(format!("/console/suspensions/{}/retry-failed", p.symbol)) {
                                                button type="submit" { "Retry failed tasks" }
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

/// `POST /console/suspensions/{symbol}/retry-failed`.
pub(crate) async fn retry_failed(
    State(state): State<AppState>,
    session: Session,
    symbol: Result<Path<String>, PathRejection>,
) -> Response {
    let symbol = match symbol
        .map_err(|_| ())
        .and_then(|Path(s)| market::symbol(&s).map_err(|_| ()))
    {
        Ok(symbol) => symbol,
        Err(()) => {
            return layout::failure_page(ApiError::BadRequest("not a market symbol".to_owned()));
        }
    };
    let path = format!("/v1/admin/markets/{symbol}/suspension/retry-failed");
    let answer = actions::call(&state, &session, Method::POST, &path, None).await;
    let flash = answer
        .failure(&Method::POST, &path)
        .or_else(|| super::approvals::held(&answer, &format!("re-running {symbol}'s failed tasks")))
        .unwrap_or_else(|| {
            Flash::Done(format!(
                "{symbol}: {} failed task(s) back to PENDING.",
                answer.body["retried"]
            ))
        });
    render(&state, &session, Some(flash)).await
}
