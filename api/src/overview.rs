//! The ops overview, `GET /v1/admin/overview` (OPS) and the console's first page: what an
//! on-call person needs before anything else — per function, paused or consuming, its queues'
//! depth and consumers, NEW dead letters and failures in the last hour; the outbox's lag; the
//! work tables' due, stuck and held rows; partners whose webhook breaker is not closed; the
//! continuous auditor's last pass; whether the broker blocks this process's connection (a
//! resource alarm: each process reports its own link, as its `paybus_broker_blocked` does);
//! whether break-glass tokens are taken here and what was changed with them in the last day.
//!
//! Messages processed per function are counters of each process (`paybus_messages_total` on
//! `/metrics`): Prometheus sums them across processes and Lambdas; this page does not pretend
//! to.

use axum::{Json, Router, extract::State, routing::get};
use chrono::{DateTime, Utc};
use paybus_bus::{link::QueueDepth, pauses};
use paybus_partners::breaker::{self, PartnerBreaker};
use serde::Serialize;

use crate::{ApiError, AppState};

#[derive(utoipa::OpenApi)]
#[openapi(paths(overview))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new().route("/v1/admin/overview", get(overview))
}

/// The whole overview.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub functions: Vec<FunctionLine>,
    pub outbox: OutboxLag,
    pub work_tables: Vec<WorkTableLine>,
    pub breakers: Vec<PartnerBreaker>,
    pub auditor: AuditorLine,
    /// The broker could not be asked for its queues (their depth shows as `null`).
    pub broker_unreachable: bool,
    /// While the broker blocks this process's connection, its reason (`low on memory`, `low on
    /// disk`): nothing is published until the alarm clears, and the queues' depth is not asked
    /// (their depth shows as `null`).
    pub broker_blocked: Option<String>,
    pub break_glass: BreakGlassLine,
}

/// Break-glass in use: whoever holds the shared secret can mint any name, so every change made
/// with one is shown here until a day has passed.
#[derive(Debug, Clone, Serialize)]
pub struct BreakGlassLine {
    /// This API takes break-glass tokens (`PAYBUS_BREAK_GLASS`).
    pub enabled: bool,
    /// Changes in the ops log made with a break-glass token in the last 24 hours.
    pub changes_last_day: u64,
    /// The latest of them.
    pub last_change_at: Option<DateTime<Utc>>,
    /// The names their tokens gave (at most ten).
    pub names: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionLine {
    pub name: &'static str,
    /// Who paused it, why, since when; `None`: consuming.
    pub paused: Option<pauses::Pause>,
    /// Each of its queues (its shards) with what it holds now (`None`: not declared, or the
    /// broker unreachable).
    pub queues: Vec<(String, Option<QueueDepth>)>,
    pub dead_letters_new: u64,
    pub failures_last_hour: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct OutboxLag {
    pub backlog: u64,
    pub oldest_seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkTableLine {
    pub table: String,
    pub due: u64,
    pub stuck: u64,
    pub held_for_a_human: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AuditorLine {
    pub last_pass_at: Option<DateTime<Utc>>,
    pub last_pass_age_seconds: Option<f64>,
    pub last_pass_violations: Option<u32>,
}

/// Reads the overview (a handful of indexed statements and one passive queue declare per
/// queue).
pub async fn read(state: &AppState) -> Result<Overview, ApiError> {
    let gauges = paybus_bus::gauges::read_gauges(&state.pool, &state.work_tables()).await?;
    let mut conn = state.pool.acquire().await?;
    let paused = pauses::list(&mut conn).await?;
    let failures: Vec<(String, i64)> = sqlx::query_as(
        "SELECT l.function_name, COUNT(*) FROM dead_letter_failures f \
         JOIN dead_letters l ON l.dead_letter_id = f.dead_letter_id \
         WHERE f.failed_at > NOW(6) - INTERVAL 1 HOUR GROUP BY l.function_name",
    )
    .fetch_all(&mut *conn)
    .await?;
    let breakers = breaker::not_closed(&mut conn).await?;
    let last_pass: Option<(DateTime<Utc>, u32)> =
        sqlx::query_as("SELECT finished_at, violations FROM audit_passes ORDER BY id DESC LIMIT 1")
            .fetch_optional(&mut *conn)
            .await?;
    let break_glass = break_glass_line(&mut conn, state.break_glass).await?;
    drop(conn);

    let count = |list: &[(String, u64)], name: &str| {
        list.iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, count)| *count)
    };
    let failures: Vec<(String, u64)> = failures
        .into_iter()
        .map(|(name, n)| (name, u64::try_from(n).unwrap_or(0)))
        .collect();
    let link = state.outbox.publisher().link();
    let shards = &state.shards;
    // lapin writes nothing on a blocked connection: a queue's passive declare would wait out
    // its bound.
    let broker_blocked = link.blocked();
    let mut broker_unreachable = false;
    let mut functions = Vec::with_capacity(state.functions.len());
    for function in state.functions {
        let mut queues = Vec::new();
        for queue in function.queue.queues_in(shards) {
            let name = queue.queue();
            let depth = if broker_unreachable || broker_blocked.is_some() {
                None
            } else {
                link.queue_depth(&name).await.unwrap_or_else(|_| {
                    broker_unreachable = true;
                    None
                })
            };
            queues.push((name, depth));
        }
        functions.push(FunctionLine {
            name: function.name,
            paused: paused
                .iter()
                .find(|p| p.function_name == function.name)
                .cloned(),
            queues,
            dead_letters_new: count(&gauges.dead_letters, function.name),
            failures_last_hour: count(&failures, function.name),
        });
    }
    let work_tables = gauges
        .due_retries
        .iter()
        .map(|(table, due)| WorkTableLine {
            table: table.clone(),
            due: *due,
            stuck: count(&gauges.stuck_rows, table),
            held_for_a_human: gauges
                .held_for_a_human
                .iter()
                .find(|(t, _)| t == table)
                .map(|(_, held)| *held),
        })
        .collect();
    Ok(Overview {
        functions,
        outbox: OutboxLag {
            backlog: gauges.outbox_backlog,
            oldest_seconds: gauges.outbox_oldest_seconds,
        },
        work_tables,
        breakers,
        auditor: AuditorLine {
            last_pass_at: last_pass.map(|(at, _)| at),
            last_pass_age_seconds: gauges.audit_last_pass_age_seconds,
            last_pass_violations: last_pass.map(|(_, violations)| violations),
        },
        broker_unreachable,
        broker_blocked,
        break_glass,
    })
}

/// The ops log's day of break-glass changes (its `created_at` index bounds the read to a day
/// of ops actions).
async fn break_glass_line(
    conn: &mut sqlx::MySqlConnection,
    enabled: bool,
) -> Result<BreakGlassLine, ApiError> {
    let rows: Vec<(String, i64, DateTime<Utc>)> = sqlx::query_as(
        "SELECT actor, COUNT(*), MAX(created_at) FROM ops_log \
         WHERE created_at > NOW(6) - INTERVAL 1 DAY AND auth_method = ? \
         GROUP BY actor ORDER BY MAX(created_at) DESC",
    )
    .bind(paybus_ops::actor::AuthMethod::BreakGlass.to_string())
    .fetch_all(&mut *conn)
    .await?;
    Ok(BreakGlassLine {
        enabled,
        changes_last_day: rows
            .iter()
            .map(|(_, n, _)| u64::try_from(*n).unwrap_or(0))
            .sum(),
        last_change_at: rows.first().map(|(_, _, at)| *at),
        names: rows.into_iter().take(10).map(|(name, _, _)| name).collect(),
    })
}

#[utoipa::path(
    get,
    path = "/v1/admin/overview",
    tag = "functions",
    security(("admin_token" = [])),
    responses((status = 200, description = "Per function: paused or consuming, queue depth and consumers, NEW dead letters, failures in the last hour; the outbox's lag; work tables' due, stuck and held rows; breakers not closed; the auditor's last pass; `broker_blocked`: the broker's reason while it blocks this process's connection (a resource alarm), else null; `break_glass`: whether this API takes break-glass tokens, and the changes made with them in the last 24 hours (count, latest, names)", body = Object), crate::responses::AdminErrors)
)]
async fn overview(State(state): State<AppState>) -> Result<Json<Overview>, ApiError> {
    Ok(Json(read(&state).await?))
}
