//! Where did this money go? One timeline of everything the database holds about one money
//! movement, across functions: the row as it stands, its state transitions, its ledger
//! entries, its partner notification (attempts, last error, delivery), a P2P order's fills, a
//! bonus job's charges, the dead letters of its messages with what ops did to them, and the ops
//! log's rows about it. Each part is read on its own: one that cannot be read (a value this
//! code cannot decode) is named in `unreadable` and the rest is answered.
//!
//! `GET /v1/admin/trace/{kind}/{id}` (OPS), `paybus trace <kind> <id>` and the console's trace
//! page, for `withdrawal`, `deposit`, `deposit-order` and `bonus-job`.
//!
//! Deliveries its function skipped (duplicates, messages about a row already past them) are
//! in it too (`paybus_bus::skips`, kept a day). What it cannot show: deliveries
//! requeued or retried before one was applied — each delivery's log line and the
//! `paybus_messages_total{function,outcome}` counters have those.

use chrono::{DateTime, Utc};
use paybus_bus::{Message, skips};
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

    /// The type of the message that carries it to its function (its dead letters').
    fn message_type(self) -> &'static str {
        match self {
            Self::Withdrawal => paybus_confirmations::WithdrawalTxConfirmed::TYPE,
            Self::Deposit => paybus_confirmations::DepositTxConfirmed::TYPE,
            Self::DepositOrder => paybus_p2p::DepositOrderCreated::TYPE,
            Self::BonusJob => paybus_bonuses::BonusJobCreated::TYPE,
        }
    }

    /// The function that consumes that message, as the catalog lists it.
    fn function(self) -> Option<&'static str> {
        let routing_key = self.message_type();
        paybus_catalog::FUNCTIONS
            .iter()
            .find(|function| function.queue.routing_key == routing_key)
            .map(|function| function.name)
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
    /// Where it is recorded: `row`, `history`, `ledger`, `notification`, `match`, `charge`,
    /// `skipped_delivery`, `dead_letter`, `dead_letter_action`, `ops_log`.
    pub source: &'static str,
    pub what: String,
    pub detail: Value,
}

/// A money movement's timeline, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trace {
    pub kind: Traced,
    pub id: u64,
    /// The row as it stands now (`null` when it could not be read: see `unreadable`).
    pub row: Value,
    pub events: Vec<Event>,
    /// The parts of the timeline that could not be read; the rest is shown. Empty when the
    /// whole of it was read.
    pub unreadable: Vec<Unreadable>,
}

/// A part of the timeline left out because reading it failed for its own reasons (a value
/// the code cannot decode, a statement the schema refuses), named for the reader; the cause
/// is in the server's log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unreadable {
    pub part: &'static str,
    pub problem: String,
}

/// A DECIMAL column's text as people write the amount (`250`, not `250.000000000000000000`).
fn normalised(amount: &str) -> String {
    paybus_money::Amount::parse(amount).map_or_else(|_| amount.to_owned(), |a| a.to_string())
}

/// What the parts read so far found, and which ones could not be read.
#[derive(Default)]
struct Timeline {
    events: Vec<Event>,
    unreadable: Vec<Unreadable>,
}

impl Timeline {
    /// Keeps `part`'s events, or notes that it could not be read. A database that cannot be
    /// reached or is busy fails the whole trace instead (the caller answers 503): nothing
    /// else would read either, and a partial timeline would hide that.
    fn take<T: Default>(&mut self, part: &'static str, read: Part<T>) -> Result<T, sqlx::Error> {
        match read {
            Ok((value, events)) => {
                self.events.extend(events);
                Ok(value)
            }
            Err(error)
                if paybus_db::is_unavailable(&error)
                    || matches!(error, sqlx::Error::Protocol(_)) =>
            {
                Err(error)
            }
            Err(error) => {
                tracing::warn!(part, error = %paybus_telemetry::one_line(&error), "a part of a trace could not be read");
                let problem = match error {
                    sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
                        "a stored value could not be decoded"
                    }
                    _ => "the query failed",
                };
                self.unreadable.push(Unreadable {
                    part,
                    problem: format!("{problem} (the server's log has the cause)"),
                });
                Ok(T::default())
            }
        }
    }
}

/// The trace of `kind` `id`, or `None` when there is no such row.
pub async fn trace(
    conn: &mut MySqlConnection,
    kind: Traced,
    id: u64,
) -> Result<Option<Trace>, sqlx::Error> {
    let mut timeline = Timeline::default();
    let row = match row(conn, kind, id).await {
        Ok(None) => return Ok(None),
        Ok(Some((row, events))) => {
            timeline.events.extend(events);
            row
        }
        Err(error) => {
            timeline.take("the row", Err::<((), _), _>(error))?;
            Value::Null
        }
    };
    match kind {
        Traced::Withdrawal => {
            timeline.take("status history", history(conn, id).await)?;
            timeline.take("ledger entries", ledger(conn, "WITHDRAWAL", id).await)?;
            timeline.take("notifications", notifications(conn, "WITHDRAWAL", id).await)?;
        }
        Traced::Deposit => {
            timeline.take("ledger entries", ledger(conn, "DEPOSIT", id).await)?;
            timeline.take("notifications", notifications(conn, "DEPOSIT", id).await)?;
        }
        Traced::DepositOrder => timeline.take("matches", matches(conn, id).await)?,
        Traced::BonusJob => timeline.take("charges", charges(conn, id).await)?,
    }
    timeline.take("skipped deliveries", skipped(conn, kind, id).await)?;
    let letters = timeline.take("dead letters", dead_letters(conn, kind, id).await)?;
    timeline.take("ops log", ops_log(conn, kind, id, &letters).await)?;
    let Timeline {
        mut events,
        unreadable,
    } = timeline;
    events.sort_by_key(|event| event.at);
    Ok(Some(Trace {
        kind,
        id,
        row,
        events,
        unreadable,
    }))
}

/// A part's events, and what it hands on to the parts after it.
type Part<T = ()> = Result<(T, Vec<Event>), sqlx::Error>;

/// The row as it stands (a JSON object), its state, when it was created and, where the row
/// records it and no other part shows it, when and how it ended.
fn row_sql(kind: Traced) -> &'static str {
    match kind {
        Traced::Withdrawal => {
            "SELECT status, JSON_OBJECT('id', id, 'partner_id', partner_id, 'kind', kind, \
             'status', status, 'currency', currency, 'amount', CAST(amount AS CHAR), \
             'tx_hash', tx_hash, 'confirmed_at', confirmed_at), created_at, \
             NULL AS ended_at, NULL AS ended \
             FROM withdrawals WHERE id = ?"
        }
        Traced::Deposit => {
            "SELECT status, JSON_OBJECT('id', id, 'partner_id', partner_id, 'status', status, \
             'currency', currency, 'amount', CAST(amount AS CHAR), 'fee', CAST(fee AS CHAR), \
             'tx_hash', tx_hash, 'confirmed_at', confirmed_at), created_at, \
             confirmed_at AS ended_at, CONCAT('confirmed on chain, tx ', tx_hash) AS ended \
             FROM deposits WHERE id = ?"
        }
        Traced::DepositOrder => {
            "SELECT status, JSON_OBJECT('id', id, 'partner_id', partner_id, \
             'partner_order_ref', partner_order_ref, 'status', status, 'currency', currency, \
             'amount', CAST(amount AS CHAR), 'remaining_amount', \
             CAST(remaining_amount AS CHAR), 'match_attempt_count', match_attempt_count, \
             'last_error', last_error, 'close_reason', close_reason, 'closed_at', \
             closed_at), created_at, \
             closed_at AS ended_at, CONCAT('closed ', status, ' (', close_reason, ')') AS ended \
             FROM p2p_deposit_orders WHERE id = ?"
        }
        Traced::BonusJob => {
            "SELECT status, JSON_OBJECT('id', id, 'member_id', member_id, 'status', status, \
             'retry_count', retry_count, 'next_retry_at', next_retry_at, 'last_error', \
             last_error, 'additional_can', additional_can, 'source_charge_id', \
             source_charge_id, 'result_charge_id', result_charge_id, 'processed_at', \
             processed_at), created_at, NULL AS ended_at, NULL AS ended \
             FROM charge_event_job WHERE id = ?"
        }
    }
}

/// The row as it stands, with the events it records itself (its creation, and its end where
/// no other part shows it); `None` when there is no such row.
async fn row(
    conn: &mut MySqlConnection,
    kind: Traced,
    id: u64,
) -> Result<Option<(Value, Vec<Event>)>, sqlx::Error> {
    type RowRow = (
        String,
        String,
        DateTime<Utc>,
        Option<DateTime<Utc>>,
        Option<String>,
    );
    let found: Option<RowRow> = sqlx::query_as(row_sql(kind))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    let Some((status, row, created_at, ended_at, ended)) = found else {
        return Ok(None);
    };
    let mut events = vec![Event {
        at: created_at,
        source: "row",
        what: format!("created (now {status})"),
        detail: Value::Null,
    }];
    if let (Some(at), Some(what)) = (ended_at, ended) {
        events.push(Event {
            at,
            source: "row",
            what,
            detail: Value::Null,
        });
    }
    let mut row: Value = serde_json::from_str(&row).unwrap_or(Value::String(row));
    for field in ["amount", "fee", "remaining_amount"] {
        if let Some(Value::String(amount)) = row.get_mut(field) {
            *amount = normalised(amount);
        }
    }
    Ok(Some((row, events)))
}

/// A bonus job's charges: the purchase it is owed for and, once granted, its EVENT charge.
async fn charges(conn: &mut MySqlConnection, job: u64) -> Part {
    type ChargeRow = (
        u64,
        String,
        i32,
        String,
        Option<DateTime<Utc>>,
        DateTime<Utc>,
    );
    let rows: Vec<ChargeRow> = sqlx::query_as(
        "SELECT c.id, c.status, c.cans, c.payment_gateway, c.completed_at, c.created_at \
         FROM charge_event_job j JOIN charges c \
         ON c.id = j.source_charge_id OR c.id = j.result_charge_id \
         WHERE j.id = ? ORDER BY c.id",
    )
    .bind(job)
    .fetch_all(&mut *conn)
    .await?;
    let events = rows
        .into_iter()
        .map(
            |(charge, status, cans, gateway, completed_at, created_at)| {
                let what = if status == "EVENT" {
                    format!("bonus granted: EVENT charge {charge}, {cans} cans")
                } else {
                    format!("purchase charge {charge} completed: {cans} cans through {gateway}")
                };
                Event {
                    at: completed_at.unwrap_or(created_at),
                    source: "charge",
                    what,
                    detail: Value::Null,
                }
            },
        )
        .collect();
    Ok(((), events))
}

/// A withdrawal's status changes; its first row has no `from_status` (the state it was
/// created in).
async fn history(conn: &mut MySqlConnection, id: u64) -> Part {
    type HistoryRow = (Option<String>, String, Option<String>, DateTime<Utc>);
    let history: Vec<HistoryRow> = sqlx::query_as(
        "SELECT from_status, to_status, reason, created_at FROM withdrawal_status_history \
         WHERE withdrawal_id = ? ORDER BY id",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let events = history
        .into_iter()
        .map(|(from, to, reason, at)| Event {
            at,
            source: "history",
            what: match from {
                Some(from) => format!("{from} → {to}"),
                None => format!("entered as {to}"),
            },
            detail: json!({ "reason": reason }),
        })
        .collect();
    Ok(((), events))
}

async fn ledger(conn: &mut MySqlConnection, reference: &str, id: u64) -> Part {
    type EntryRow = (String, String, String, Option<String>, DateTime<Utc>);
    let entries: Vec<EntryRow> = sqlx::query_as(
        "SELECT entry_type, CAST(amount AS CHAR), currency, idem_key, created_at \
         FROM ledger_entries WHERE reference_type = ? AND reference_id = ? ORDER BY id",
    )
    .bind(reference)
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let events = entries
        .into_iter()
        .map(|(entry_type, amount, currency, key, at)| Event {
            at,
            source: "ledger",
            what: format!("{entry_type} {} {currency}", normalised(&amount)),
            detail: json!({ "idem_key": key }),
        })
        .collect();
    Ok(((), events))
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

async fn notifications(conn: &mut MySqlConnection, reference: &str, id: u64) -> Part {
    let rows: Vec<NotificationRow> = sqlx::query_as(
        "SELECT id, event, status, attempts, last_error, delivered_at, created_at \
         FROM partner_notifications WHERE reference_type = ? AND reference_id = ? ORDER BY id",
    )
    .bind(reference)
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let mut events = Vec::with_capacity(rows.len() * 2);
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
    Ok(((), events))
}

async fn matches(conn: &mut MySqlConnection, order: u64) -> Part {
    type MatchRow = (
        u64,
        String,
        String,
        String,
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
    let mut events = Vec::with_capacity(rows.len() * 2);
    for (id, status, amount, key, trade, reserved, confirmed, released) in rows {
        events.push(Event {
            at: reserved,
            source: "match",
            what: format!("fill {id} reserved {} (now {status})", normalised(&amount)),
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
    Ok(((), events))
}

/// The deliveries its function skipped (duplicates, messages about a row already past them).
async fn skipped(conn: &mut MySqlConnection, kind: Traced, id: u64) -> Part {
    let Some(function) = kind.function() else {
        return Ok(((), Vec::new()));
    };
    let events = skips::of_entity(conn, function, &id.to_string(), 200)
        .await?
        .into_iter()
        .map(|skip| Event {
            at: skip.skipped_at,
            source: "skipped_delivery",
            what: format!(
                "{function} skipped message {}: {}",
                skip.message_id, skip.reason
            ),
            detail: json!({ "correlation_id": skip.correlation_id }),
        })
        .collect();
    Ok(((), events))
}

/// The dead letters of its messages (its shard key names it), with their trails; their ids.
async fn dead_letters(conn: &mut MySqlConnection, kind: Traced, id: u64) -> Part<Vec<u64>> {
    let routing_key = kind.message_type();
    let Some(function) = kind.function() else {
        return Ok((Vec::new(), Vec::new()));
    };
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
    let mut events = Vec::with_capacity(letters.len());
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
        events.extend(
            actions
                .into_iter()
                .map(|(action, actor, verdict, result, at)| Event {
                    at,
                    source: "dead_letter_action",
                    what: format!("{action} of dead letter {letter} by {actor}: {result}"),
                    detail: json!({ "verdict": verdict }),
                }),
        );
    }
    Ok((ids, events))
}

async fn ops_log(conn: &mut MySqlConnection, kind: Traced, id: u64, letters: &[u64]) -> Part {
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
    let events = rows
        .into_iter()
        .map(|(seq, actor, action, subject, at)| Event {
            at,
            source: "ops_log",
            what: format!("{action} on {subject} by {actor}"),
            detail: json!({ "seq": seq }),
        })
        .collect();
    Ok(((), events))
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
