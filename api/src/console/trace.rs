//! The trace page: one money movement's timeline (`crate::trace`, what `GET
//! /v1/admin/trace/{kind}/{id}` answers), and a form to ask for one.

use axum::{
    extract::{Query, State, rejection::QueryRejection},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use maud::html;
use serde::Deserialize;

use super::{Session, layout};
use crate::{
    AppState,
    trace::{self, Traced},
};

#[derive(Debug, Deserialize)]
pub(crate) struct TraceQuery {
    kind: Option<String>,
    id: Option<String>,
}

const KINDS: [&str; 4] = ["withdrawal", "deposit", "deposit-order", "bonus-job"];

/// `GET /console/trace[?kind=..&id=..]`.
pub(crate) async fn page(
    State(state): State<AppState>,
    session: Session,
    query: Result<Query<TraceQuery>, QueryRejection>,
) -> Response {
    let (kind, id) = query.map(|Query(q)| (q.kind, q.id)).unwrap_or_default();
    let asked = match (kind.as_deref(), id.as_deref()) {
        (Some(kind), Some(id)) if !id.is_empty() => {
            let (Some(traced), Ok(id)) = (Traced::parse(kind), id.trim().parse::<u64>()) else {
                return layout::error_page(
                    StatusCode::BAD_REQUEST,
                    "Trace a withdrawal, deposit, deposit-order or bonus-job by its numeric id.",
                );
            };
            let trace = async {
                let mut conn = state.pool.acquire().await?;
                trace::trace(&mut conn, traced, id).await
            };
            match trace.await {
                Ok(found) => Some((kind.to_owned(), id, found)),
                Err(error) => return layout::failure_page(error.into()),
            }
        }
        _ => None,
    };
    layout::page(
        "Trace",
        Some(&session.caller),
        html! {
            form method="get" action="/console/trace" {
                label { "Kind "
                    select name="kind" {
                        @for k in KINDS { option value=(k) selected[kind.as_deref() == Some(k)] { (k) } }
                    }
                }
                " " label { "Id " input type="text" inputmode="numeric" name="id" size="12" value=(id.clone().unwrap_or_default()); }
                " " button type="submit" { "Trace" }
            }
            p.hint { "Everything the database holds about one money movement, oldest first. Skipped deliveries (duplicates) are kept a day; requeued ones are in the delivery log lines and paybus_messages_total." }
            @if let Some((kind, id, found)) = &asked {
                @match found {
                    None => { p.flash.warn role="status" { "No " (kind) " " (id) "." } },
                    Some(trace) => {
                        h2 { (kind) " " (id) }
                        @for part in &trace.unreadable {
                            p.flash.warn.unreadable role="status" { "Could not read the " (part.part) ": " (part.problem) ". The rest of the timeline is below." }
                        }
                        pre #row { (serde_json::to_string_pretty(&trace.row).unwrap_or_default()) }
                        (layout::wide_table("Timeline", html! {
                            table #timeline {
                                thead { tr { th { "When" } th { "Where" } th { "What" } th { "Detail" } } }
                                tbody {
                                    @for event in &trace.events {
                                        tr.event data-source=(event.source) {
                                            td { (event.at.format("%Y-%m-%d %H:%M:%S%.3f UTC")) }
                                            td { (event.source) }
                                            td { (event.what) }
                                            td { @if !event.detail.is_null() { code { (event.detail) } } }
                                        }
                                    }
                                }
                            }
                        }))
                    },
                }
            }
        },
    )
    .into_response()
}
