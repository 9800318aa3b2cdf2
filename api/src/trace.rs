//! Where did this money go? One timeline of everything the database holds about one money
//! movement, across functions: the row as it stands, its state transitions, its ledger
//! entries, its partner notification (attempts, last error, delivery), the dead letters of its
//! messages with what ops did to them, and the ops log's rows about it.
//!
//! `GET /v1/admin/trace/{kind}/{id}` (OPS), `paybus trace <kind> <id>` and the console's trace
//! page, for `withdrawal`, `deposit`, `deposit-order` and `bonus-job`.
//!
//! Deliveries its function skipped (duplicates, messages about a row already past them) are
//! in it too (`paybus_platform::bus::skips`, kept a day). What it cannot show: deliveries
//! requeued or retried before one was applied — each delivery's log line and the
//! `paybus_messages_total{function,outcome}` counters have those.

use chrono::{DateTime, Utc};
use paybus_platform::bus::skips;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::MySqlConnection;

/// What can be traced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Traced {
    Withdrawal,
    Deposit,
    DepositOrder,
    BonusJob,
}

impl Traced {
    pub fn parse(kind: &str) -> Option<Self> {
        match kind {
            "withdrawal" => Some(Self::Withdrawal),
            "deposit" => Some(Self::Deposit),
            "deposit-order" => Some(Self::DepositOrder),
            "bonus-job" => Some(Self::BonusJob),
            _ => None,
        }
    }

    /// The function that consumes its message, and the message's type (its dead letters).
    fn message(self) -> (&'static str, &'static str) {
        match self {
            Self::Withdrawal => ("confirm-withdrawal", "withdrawal.tx_confirmed"),
            Self::Deposit => ("confirm-deposit", "deposit.tx_confirmed"),
            Self::DepositOrder => ("match-deposit", "p2p.deposit_order.created"),
            Self::BonusJob => ("grant-bonus", "charge.bonus_job.created"),
        }
    }

    /// The ops log's and the ledger's names for it.
    fn subject(self, id: u64) -> String {
        match self {
            Self::Withdrawal => format!("withdrawal:{id}"),
            Self::Deposit => format!("deposit:{id}"),
            Self::DepositOrder => format!("p2p_deposit_order:{id}"),
            Self::BonusJob => format!("charge_event_job:{id}"),
        }
    }
}

/// One thing that happened, when.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub at: DateTime<Utc>,
    /// Where it is recorded: `row`, `history`, `ledger`, `notification`, `dead_letter`,
    /// `dead_letter_action`, `ops_log`, `match`.
    pub source: &'static str,
    pub what: String,
    pub detail: Value,
}

/// A money movement's timeline, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trace {
    pub kind: Traced,
    pub id: u64,
    /// The row as it stands now.
    pub row: Value,
    pub events: Vec<Event>,
}

/// A DECIMAL column's text as people write the amount (`250`, not `250.000000000000000000`).
fn normalised(amount: &str) -> String {
    paybus_money::Amount::parse(amount).map_or_else(|_| amount.to_owned(), |a| a.to_string())
}

/// The trace of `kind` `id`, or `None` when there is no such row.
pub async fn trace(
    conn: &mut MySqlConnection,
    kind: Traced,
    id: u64,
) -> Result<Option<Trace>, sqlx::Error> {
    let mut events = Vec::new();
    let Some(row) = row(conn, kind, id, &mut events).await? else {
        return Ok(None);
    };
    match kind {
        Traced::Withdrawal => {
            let history: Vec<(String, String, Option<String>, DateTime<Utc>)> = sqlx::query_as(
                "SELECT from_status, to_status, reason, created_at FROM withdrawal_status_history \
                 WHERE withdrawal_id = ? ORDER BY id",
            )
            .bind(id)
            .fetch_all(&mut *conn)
            .await?;
            for (from, to, reason, at) in history {
                events.push(Event {
                    at,
                    source: "history",
                    what: format!("{from} → {to}"),
                    detail: json!({ "reason": reason }),
                });
            }
            ledger(conn, "WITHDRAWAL", id, &mut events).await?;
            notifications(conn, "WITHDRAWAL", id, &mut events).await?;
        }
        Traced::Deposit => {
            ledger(conn, "DEPOSIT", id, &mut events).await?;
            notifications(conn, "DEPOSIT", id, &mut events).await?;
        }
        Traced::DepositOrder => matches(conn, id, &mut events).await?,
        Traced::BonusJob => {}
    }
    let (function, _) = kind.message();
    for skip in skips::of_entity(conn, function, &id.to_string(), 200).await? {
        events.push(Event {
            at: skip.skipped_at,
            source: "skipped_delivery",
            what: format!(
                "{function} skipped message {}: {}",
                skip.message_id, skip.reason
            ),
            detail: json!({ "correlation_id": skip.correlation_id }),
        });
    }
    let letters = dead_letters(conn, kind, id, &mut events).await?;
    ops_log(conn, kind, id, &letters, &mut events).await?;
    events.sort_by_key(|event| event.at);
    Ok(Some(Trace {
        kind,
        id,
        row,
        events,
    }))
}

async fn row(
    conn: &mut MySqlConnection,
    kind: Traced,
    id: u64,
    events: &mut Vec<Event>,
) -> Result<Option<Value>, sqlx::Error> {
    let found: Option<(String, String, DateTime<Utc>)> =
        match kind {
            Traced::Withdrawal => {
                sqlx::query_as(
                    "SELECT status, JSON_OBJECT('id', id, 'partner_id', partner_id, 'kind', kind, \
                 'status', status, 'currency', currency, 'amount', CAST(amount AS CHAR), \
                 'tx_hash', tx_hash, 'confirmed_at', confirmed_at), created_at \
                 FROM withdrawals WHERE id = ?",
                )
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?
            }
            Traced::Deposit => sqlx::query_as(
                "SELECT status, JSON_OBJECT('id', id, 'partner_id', partner_id, 'status', status, \
                 'currency', currency, 'amount', CAST(amount AS CHAR), 'fee', CAST(fee AS CHAR), \
                 'tx_hash', tx_hash, 'confirmed_at', confirmed_at), created_at \
                 FROM deposits WHERE id = ?",
            )
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?,
            Traced::DepositOrder => {
                sqlx::query_as(
                    "SELECT status, JSON_OBJECT('id', id, 'partner_id', partner_id, \
                 'partner_order_ref', partner_order_ref, 'status', status, 'currency', currency, \
                 'amount', CAST(amount AS CHAR), 'remaining_amount', \
                 CAST(remaining_amount AS CHAR), 'match_attempt_count', match_attempt_count, \
                 'last_error', last_error, 'close_reason', close_reason, 'closed_at', \
                 closed_at), created_at FROM p2p_deposit_orders WHERE id = ?",
                )
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?
            }
            Traced::BonusJob => sqlx::query_as(
                "SELECT status, JSON_OBJECT('id', id, 'member_id', member_id, 'status', status, \
                 'retry_count', retry_count, 'last_error', last_error, 'additional_can', \
                 additional_can, 'processed_at', processed_at), created_at \
                 FROM charge_event_job WHERE id = ?",
            )
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?,
        };
    let Some((status, row, created_at)) = found else {
        return Ok(None);
    };
    events.push(Event {
        at: created_at,
        source: "row",
        what: format!("created (now {status})"),
        detail: Value::Null,
    });
    let mut row: Value = serde_json::from_str(&row).unwrap_or(Value::String(row));
    for field in ["amount", "fee", "remaining_amount"] {
        if let Some(Value::String(amount)) = row.get_mut(field) {
            *amount = normalised(amount);
        }
    }
    Ok(Some(row))
}

async fn ledger(
    conn: &mut MySqlConnection,
    reference: &str,
    id: u64,
    events: &mut Vec<Event>,
) -> Result<(), sqlx::Error> {
    let entries: Vec<(String, String, String, String, DateTime<Utc>)> = sqlx::query_as(
        "SELECT entry_type, CAST(amount AS CHAR), currency, idem_key, created_at \
         FROM ledger_entries WHERE reference_type = ? AND reference_id = ? ORDER BY id",
    )
    .bind(reference)
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    for (entry_type, amount, currency, key, at) in entries {
        let amount = normalised(&amount);
        events.push(Event {
            at,
            source: "ledger",
            what: format!("{entry_type} {amount} {currency}"),
            detail: json!({ "idem_key": key }),
        });
    }
    Ok(())
}

type NotificationRow = (
    u64,
    String,
    String,
    u32,
    Option<String>,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
);

async fn notifications(
    conn: &mut MySqlConnection,
    reference: &str,
    id: u64,
    events: &mut Vec<Event>,
) -> Result<(), sqlx::Error> {
    let rows: Vec<NotificationRow> = sqlx::query_as(
        "SELECT id, event, status, attempts, last_error, delivered_at, created_at \
         FROM partner_notifications WHERE reference_type = ? AND reference_id = ? ORDER BY id",
    )
    .bind(reference)
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    for (notification, event, status, attempts, last_error, delivered_at, created_at) in rows {
        events.push(Event {
            at: created_at,
            source: "notification",
            what: format!("webhook {event} (notification {notification}) written: now {status}"),
            detail: json!({ "attempts": attempts, "last_error": last_error }),
        });
        if let Some(at) = delivered_at {
            events.push(Event {
                at,
                source: "notification",
                what: format!("webhook {event} delivered after {attempts} attempt(s)"),
                detail: json!({ "notification": notification }),
            });
        }
    }
    Ok(())
}

async fn matches(
    conn: &mut MySqlConnection,
    order: u64,
    events: &mut Vec<Event>,
) -> Result<(), sqlx::Error> {
    type MatchRow = (
        u64,
        String,
        String,
        Option<String>,
        Option<String>,
        DateTime<Utc>,
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
    );
    let rows: Vec<MatchRow> = sqlx::query_as(
        "SELECT id, status, CAST(amount AS CHAR), trade_key, external_trade_id, reserved_at, \
         confirmed_at, released_at FROM p2p_matches WHERE deposit_order_id = ? ORDER BY id",
    )
    .bind(order)
    .fetch_all(&mut *conn)
    .await?;
    for (id, status, amount, key, trade, reserved, confirmed, released) in rows {
        let amount = normalised(&amount);
        events.push(Event {
            at: reserved,
            source: "match",
            what: format!("fill {id} reserved {amount} (now {status})"),
            detail: json!({ "trade_key": key }),
        });
        if let Some(at) = confirmed {
            events.push(Event {
                at,
                source: "match",
                what: format!(
                    "fill {id} settled, trade {}",
                    trade.as_deref().unwrap_or("?")
                ),
                detail: Value::Null,
            });
        }
        if let Some(at) = released {
            events.push(Event {
                at,
                source: "match",
                what: format!("fill {id} released"),
                detail: Value::Null,
            });
        }
    }
    Ok(())
}

/// The dead letters of its messages (its shard key names it), with their trails; their ids.
async fn dead_letters(
    conn: &mut MySqlConnection,
    kind: Traced,
    id: u64,
    events: &mut Vec<Event>,
) -> Result<Vec<u64>, sqlx::Error> {
    let (function, routing_key) = kind.message();
    type LetterRow = (u64, String, String, String, u32, DateTime<Utc>);
    let letters: Vec<LetterRow> = sqlx::query_as(
        "SELECT id, reason, status, error, failures, failed_at FROM dead_letters \
         WHERE shard_key = ? AND function_name = ? AND routing_key = ? \
         ORDER BY id LIMIT 100",
    )
    .bind(id.to_string())
    .bind(function)
    .bind(routing_key)
    .fetch_all(&mut *conn)
    .await?;
    let mut ids = Vec::with_capacity(letters.len());
    for (letter, reason, status, error, failures, at) in letters {
        ids.push(letter);
        events.push(Event {
            at,
            source: "dead_letter",
            what: format!("dead letter {letter} of {function} ({reason}), now {status}"),
            detail: json!({ "error": error, "failures": failures }),
        });
        type ActionRow = (String, String, Option<String>, String, DateTime<Utc>);
        let actions: Vec<ActionRow> = sqlx::query_as(
            "SELECT action, actor, verdict, result, created_at FROM dead_letter_actions \
                 WHERE dead_letter_id = ? ORDER BY id",
        )
        .bind(letter)
        .fetch_all(&mut *conn)
        .await?;
        for (action, actor, verdict, result, at) in actions {
            events.push(Event {
                at,
                source: "dead_letter_action",
                what: format!("{action} of dead letter {letter} by {actor}: {result}"),
                detail: json!({ "verdict": verdict }),
            });
        }
    }
    Ok(ids)
}

async fn ops_log(
    conn: &mut MySqlConnection,
    kind: Traced,
    id: u64,
    letters: &[u64],
    events: &mut Vec<Event>,
) -> Result<(), sqlx::Error> {
    let mut subjects = vec![kind.subject(id)];
    subjects.extend(letters.iter().map(|letter| format!("dead_letter:{letter}")));
    let mut query = sqlx::QueryBuilder::<sqlx::MySql>::new(
        "SELECT seq, actor, action, subject, created_at FROM ops_log WHERE subject IN (",
    );
    let mut list = query.separated(", ");
    for subject in &subjects {
        list.push_bind(subject);
    }
    query.push(") ORDER BY seq LIMIT 200");
    let rows: Vec<(u64, String, String, String, DateTime<Utc>)> =
        query.build_query_as().fetch_all(&mut *conn).await?;
    for (seq, actor, action, subject, at) in rows {
        events.push(Event {
            at,
            source: "ops_log",
            what: format!("{action} on {subject} by {actor}"),
            detail: json!({ "seq": seq }),
        });
    }
    Ok(())
}

pub(crate) mod route {
    use axum::{
        Json, Router,
        extract::{Path, State, rejection::PathRejection},
        routing::get,
    };

    use super::{Trace, Traced, trace};
    use crate::{ApiError, AppState};

    #[derive(utoipa::OpenApi)]
    #[openapi(paths(show))]
    pub(crate) struct Doc;

    pub(crate) fn admin_routes() -> Router<AppState> {
        Router::new().route("/v1/admin/trace/{kind}/{id}", get(show))
    }

    #[utoipa::path(
        get,
        path = "/v1/admin/trace/{kind}/{id}",
        tag = "functions",
        security(("admin_token" = [])),
        params(
            ("kind" = String, Path, description = "withdrawal, deposit, deposit-order or bonus-job"),
            ("id" = u64, Path, description = "The row's id (a positive integer)")
        ),
        responses((status = 200, description = "The row as it stands and its timeline: transitions, ledger entries, webhook notification, dead letters and what ops did", body = Object), crate::responses::AdminErrors)
    )]
    async fn show(
        State(state): State<AppState>,
        path: Result<Path<(String, u64)>, PathRejection>,
    ) -> Result<Json<Trace>, ApiError> {
        let Ok(Path((kind, id))) = path else {
            return Err(ApiError::BadRequest(
                "trace a kind (withdrawal, deposit, deposit-order, bonus-job) and a positive id"
                    .to_owned(),
            ));
        };
        let kind = Traced::parse(&kind).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "{kind:?} cannot be traced: withdrawal, deposit, deposit-order or bonus-job"
            ))
        })?;
        if id == 0 {
            return Err(ApiError::BadRequest(
                "the id must be a positive integer".to_owned(),
            ));
        }
        let mut conn = state.pool.acquire().await?;
        trace(&mut conn, kind, id)
            .await?
            .map(Json)
            .ok_or_else(|| ApiError::NotFound(format!("no {kind:?} {id}")))
    }
}
