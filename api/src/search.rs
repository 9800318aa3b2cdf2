//! `GET /v1/admin/search?q=…[&partner=ID]` (OPS) and the console's search box: find a money
//! movement by what support has, and land on its trace.
//!
//! - a number: the withdrawal, deposit, P2P deposit order and bonus job of that id, and the
//!   bonus jobs of that member or of that source charge (payment);
//! - anything else: the withdrawals and deposits of that tx hash, and, with `partner`, the P2P
//!   deposit order of that partner reference (a reference is unique per partner only, and
//!   only indexed with it).
//!
//! A withdrawal row holds no partner reference (its partner reads it back by its id,
//! `/v1/partner/withdrawals/{id}`): its id or its tx hash finds it.
//!
//! Every lookup is an index read; at most [`LIMIT`] matches a kind.

use axum::{
    Json, Router,
    extract::{Query, State, rejection::QueryRejection},
    routing::get,
};
use serde::{Deserialize, Serialize};
use sqlx::MySqlConnection;

use crate::{ApiError, AppState, trace::Traced};

#[derive(utoipa::OpenApi)]
#[openapi(paths(search))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new().route("/v1/admin/search", get(search))
}

/// Matches of one kind at most.
pub const LIMIT: u32 = 20;
/// The longest query taken: a tx hash or a reference fits well within it.
const MAX_QUERY: usize = 200;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    /// An id, a member or charge id, a tx hash, or a partner's order reference (with `partner`).
    pub q: String,
    /// The partner whose order reference `q` is.
    pub partner: Option<u64>,
}

/// One thing found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Match {
    pub kind: Traced,
    pub id: u64,
    /// Why it matched and what it is, in a line.
    pub what: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Found {
    pub query: String,
    pub matches: Vec<Match>,
    /// What could not be searched, said plainly (an order reference without its partner).
    pub notes: Vec<String>,
}

/// The matches of `query`, or a 400 for an empty or overlong one.
pub async fn find(state: &AppState, query: &SearchQuery) -> Result<Found, ApiError> {
    let q = query.q.trim();
    if q.is_empty() {
        return Err(ApiError::BadRequest(
            "q is empty: give an id, a member or charge id, a tx hash or an order reference"
                .to_owned(),
        ));
    }
    if q.len() > MAX_QUERY {
        return Err(ApiError::BadRequest(format!(
            "q is longer than {MAX_QUERY} characters"
        )));
    }
    let mut conn = state.pool.acquire().await?;
    let mut matches = Vec::new();
    let mut notes = Vec::new();
    if let Ok(number) = q.parse::<u64>() {
        by_number(&mut conn, number, &mut matches).await?;
    } else {
        by_text(&mut conn, q, &mut matches).await?;
    }
    match query.partner {
        Some(partner) => by_reference(&mut conn, partner, q, &mut matches).await?,
        None if q.parse::<u64>().is_err() => notes.push(
            "P2P deposit orders are found by their partner's reference with the partner: add \
             partner=ID"
                .to_owned(),
        ),
        None => {}
    }
    Ok(Found {
        query: q.to_owned(),
        matches,
        notes,
    })
}

async fn by_number(
    conn: &mut MySqlConnection,
    n: u64,
    matches: &mut Vec<Match>,
) -> Result<(), sqlx::Error> {
    let withdrawal: Option<(u64, String)> =
        sqlx::query_as("SELECT partner_id, status FROM withdrawals WHERE id = ?")
            .bind(n)
            .fetch_optional(&mut *conn)
            .await?;
    if let Some((partner, status)) = withdrawal {
        matches.push(Match {
            kind: Traced::Withdrawal,
            id: n,
            what: format!("withdrawal {n} of partner {partner}, {status}"),
        });
    }
    let deposit: Option<(u64, String)> =
        sqlx::query_as("SELECT partner_id, status FROM deposits WHERE id = ?")
            .bind(n)
            .fetch_optional(&mut *conn)
            .await?;
    if let Some((partner, status)) = deposit {
        matches.push(Match {
            kind: Traced::Deposit,
            id: n,
            what: format!("deposit {n} of partner {partner}, {status}"),
        });
    }
    let order: Option<(u64, String)> =
        sqlx::query_as("SELECT partner_id, status FROM p2p_deposit_orders WHERE id = ?")
            .bind(n)
            .fetch_optional(&mut *conn)
            .await?;
    if let Some((partner, status)) = order {
        matches.push(Match {
            kind: Traced::DepositOrder,
            id: n,
            what: format!("P2P deposit order {n} of partner {partner}, {status}"),
        });
    }
    let jobs: Vec<(u64, u64, u64, String)> = sqlx::query_as(
        "SELECT id, member_id, source_charge_id, status FROM charge_event_job WHERE id = ? \
         UNION SELECT id, member_id, source_charge_id, status FROM \
           (SELECT id, member_id, source_charge_id, status FROM charge_event_job \
            WHERE member_id = ? ORDER BY id DESC LIMIT ?) AS of_member \
         UNION SELECT id, member_id, source_charge_id, status FROM \
           (SELECT id, member_id, source_charge_id, status FROM charge_event_job \
            WHERE source_charge_id = ? ORDER BY id DESC LIMIT ?) AS of_charge \
         ORDER BY id DESC",
    )
    .bind(n)
    .bind(n)
    .bind(LIMIT)
    .bind(n)
    .bind(LIMIT)
    .fetch_all(&mut *conn)
    .await?;
    for (id, member, charge, status) in jobs {
        let why = match (id == n, member == n, charge == n) {
            (true, _, _) => "",
            (_, true, _) => " (member's)",
            _ => " (of that charge)",
        };
        matches.push(Match {
            kind: Traced::BonusJob,
            id,
            what: format!("bonus job {id}{why}: member {member}, charge {charge}, {status}"),
        });
    }
    Ok(())
}

async fn by_text(
    conn: &mut MySqlConnection,
    q: &str,
    matches: &mut Vec<Match>,
) -> Result<(), sqlx::Error> {
    let withdrawals: Vec<(u64, u64, String)> = sqlx::query_as(
        "SELECT id, partner_id, status FROM withdrawals WHERE tx_hash = ? ORDER BY id DESC \
         LIMIT ?",
    )
    .bind(q)
    .bind(LIMIT)
    .fetch_all(&mut *conn)
    .await?;
    for (id, partner, status) in withdrawals {
        matches.push(Match {
            kind: Traced::Withdrawal,
            id,
            what: format!("withdrawal {id} of partner {partner} with tx {q}, {status}"),
        });
    }
    let deposits: Vec<(u64, u64, String)> = sqlx::query_as(
        "SELECT id, partner_id, status FROM deposits WHERE tx_hash = ? ORDER BY id DESC LIMIT ?",
    )
    .bind(q)
    .bind(LIMIT)
    .fetch_all(&mut *conn)
    .await?;
    for (id, partner, status) in deposits {
        matches.push(Match {
            kind: Traced::Deposit,
            id,
            what: format!("deposit {id} of partner {partner} with tx {q}, {status}"),
        });
    }
    Ok(())
}

async fn by_reference(
    conn: &mut MySqlConnection,
    partner: u64,
    reference: &str,
    matches: &mut Vec<Match>,
) -> Result<(), sqlx::Error> {
    let order: Option<(u64, String)> = sqlx::query_as(
        "SELECT id, status FROM p2p_deposit_orders WHERE partner_id = ? AND partner_order_ref = ?",
    )
    .bind(partner)
    .bind(reference)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some((id, status)) = order {
        matches.push(Match {
            kind: Traced::DepositOrder,
            id,
            what: format!("P2P deposit order {id}, partner {partner}'s {reference}, {status}"),
        });
    }
    Ok(())
}

#[utoipa::path(
    get,
    path = "/v1/admin/search",
    tag = "functions",
    security(("admin_token" = [])),
    params(SearchQuery),
    responses((status = 200, description = "What the query names: `{query, matches: [{kind, id, what}], notes}`; each match's trace is `/v1/admin/trace/{kind}/{id}`", body = Object), crate::responses::AdminErrors)
)]
async fn search(
    State(state): State<AppState>,
    query: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<Json<Found>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    Ok(Json(find(&state, &query).await?))
}
