//! The search page (`crate::search`, what `GET /v1/admin/search` answers): what support has —
//! an id, a tx hash, a member or charge id, a partner's order reference — to the trace of the
//! money movement it names. One match goes straight to its trace.

use axum::{
    extract::{Query, State, rejection::QueryRejection},
    http::StatusCode,
    response::{IntoResponse, Redirect, Response},
};
use maud::html;
use serde::Deserialize;

use super::{Session, layout};
use crate::{
    ApiError, AppState,
    search::{self, SearchQuery},
};

#[derive(Debug, Deserialize)]
pub(crate) struct Asked {
    q: Option<String>,
    partner: Option<String>,
}

/// `GET /console/search[?q=..&partner=..]`.
pub(crate) async fn page(
    State(state): State<AppState>,
    session: Session,
    query: Result<Query<Asked>, QueryRejection>,
) -> Response {
    let Ok(Query(asked)) = query else {
        return layout::error_page(StatusCode::BAD_REQUEST, "Search with q (and partner).");
    };
    let q = asked.q.unwrap_or_default();
    let partner = match asked.partner.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(text) => match text.parse::<u64>() {
            Ok(partner) => Some(partner),
            Err(_) => {
                return layout::error_page(
                    StatusCode::BAD_REQUEST,
                    "The partner is a partner's numeric id.",
                );
            }
        },
    };
    let form = html! {
        form method="get" action="/console/search" {
            label { "Id, tx hash, member or charge id, order reference " input type="search" name="q" value=(q) required; }
            " " label { "partner (for an order reference) " input type="text" inputmode="numeric" name="partner" size="6" value=[partner]; }
            " " button type="submit" { "Search" }
        }
    };
    if q.trim().is_empty() {
        return layout::page("Search", Some(&session.caller), form).into_response();
    }
    let found = match search::find(&state, &SearchQuery { q, partner }).await {
        Ok(found) => found,
        Err(ApiError::BadRequest(why)) => return layout::error_page(StatusCode::BAD_REQUEST, &why),
        Err(error) => return layout::failure_page(error),
    };
    if let [only] = found.matches.as_slice() {
        return Redirect::to(&trace_of(only)).into_response();
    }
    layout::page(
        "Search",
        Some(&session.caller),
        html! {
            (form)
            @for note in &found.notes { p.hint { (note) } }
            @if found.matches.is_empty() {
                p #no-match { "Nothing matches " code { (found.query) } "." }
            } @else {
                ul #matches {
                    @for m in &found.matches {
                        li { a href=(trace_of(m)) { (m.what) } }
                    }
                }
            }
        },
    )
    .into_response()
}

fn trace_of(m: &search::Match) -> String {
    let kind = serde_json::to_value(m.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    format!("/console/trace?kind={kind}&id={}", m.id)
}
