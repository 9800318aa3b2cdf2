//! `GET /v1/admin/activity[?window=hour|day]` (OPS) and the console overview's charts: is
//! money flowing, and since when is it not. Per function, what it did (`done`, `skipped`,
//! `retried`, `failed`: `function_activity`, which every process adds its tally to, see
//! `paybus_bus::activity`), each queue's ready messages and the outbox's lag (the
//! sweeper's samples, `bus::samples`), by minute over the last hour or by hour over the last
//! day; and dead letters per hour over the last day (the recorder's counts in the same rows).
//!
//! Every series has one value per bucket, oldest first, the current (partial) bucket last, so
//! that a chart's axis is continuous: a bucket without rows is 0 (counts) or `null` (samples:
//! nothing was sampled then). A day's bucket of samples holds the highest of its hour.

use std::collections::BTreeMap;

use axum::{
    Json, Router,
    extract::{Query, State, rejection::QueryRejection},
    routing::get,
};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::{ApiError, AppState};

#[derive(utoipa::OpenApi)]
#[openapi(paths(activity))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new().route("/v1/admin/activity", get(activity))
}

/// How far back, and in what steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Window {
    /// The last hour by minute.
    #[default]
    Hour,
    /// The last day by hour.
    Day,
}

impl Window {
    /// `TIMESTAMPDIFF`'s unit of a bucket.
    fn unit(self) -> &'static str {
        match self {
            Self::Hour => "MINUTE",
            Self::Day => "HOUR",
        }
    }

    fn bucket(self) -> TimeDelta {
        match self {
            Self::Hour => TimeDelta::minutes(1),
            Self::Day => TimeDelta::hours(1),
        }
    }

    fn buckets(self) -> i32 {
        match self {
            Self::Hour => 60,
            Self::Day => 24,
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ActivityQuery {
    /// `hour` (by minute, the default) or `day` (by hour).
    window: Option<Window>,
}

/// The charts' figures.
#[derive(Debug, Clone, Serialize)]
pub struct Activity {
    pub window: Window,
    pub bucket_seconds: i64,
    /// The start of each bucket, oldest first; the last is the current one.
    pub buckets: Vec<DateTime<Utc>>,
    /// Every catalog function, with or without activity.
    pub functions: Vec<FunctionActivity>,
    /// Each function queue's ready messages (`null`: not sampled, or the broker not asked).
    pub queues: Vec<QueueSeries>,
    pub outbox_backlog: Vec<Option<u64>>,
    pub outbox_oldest_seconds: Vec<Option<f64>>,
    /// The last 24 hours' starts, for [`dead_letters`](Self::dead_letters).
    pub dead_letter_hours: Vec<DateTime<Utc>>,
    /// Per function with any: its messages dead-lettered in each of those hours.
    pub dead_letters: Vec<DeadLetterSeries>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionActivity {
    pub name: String,
    pub done: Vec<u64>,
    pub skipped: Vec<u64>,
    pub retried: Vec<u64>,
    pub failed: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct QueueSeries {
    pub queue: String,
    pub ready: Vec<Option<u64>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeadLetterSeries {
    pub function: String,
    pub per_hour: Vec<u64>,
}

/// The buckets of `window` ending with the current one.
fn buckets(window: Window, now: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let step = window.bucket();
    let current = now.duration_trunc(step).unwrap_or(now);
    (0..window.buckets())
        .rev()
        .map(|back| current - step * back)
        .collect()
}

/// A bucket number the server computed, if it is one of the window's `len`.
fn bucket_index(bucket: i64, len: usize) -> Option<usize> {
    usize::try_from(bucket).ok().filter(|&i| i < len)
}

/// Reads the figures of `window` (four indexed range reads).
pub async fn read(state: &AppState, window: Window) -> Result<Activity, ApiError> {
    let now = Utc::now();
    let starts = buckets(window, now);
    let step = window.bucket();
    let from = starts.first().copied().unwrap_or(now).naive_utc();
    let mut conn = state.pool.acquire().await?;

    // Bucketed by the server: a day is every function's 1,440 rows, a chart 24 values.
    let unit = window.unit();
    let rows: Vec<(String, i64, u64, u64, u64, u64)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT function_name, TIMESTAMPDIFF({unit}, ?, minute_at) AS bucket, \
                CAST(SUM(done) AS UNSIGNED), CAST(SUM(skipped) AS UNSIGNED), \
                CAST(SUM(retried) AS UNSIGNED), CAST(SUM(failed) AS UNSIGNED) \
         FROM function_activity WHERE minute_at >= ? GROUP BY function_name, bucket"
        )))
        .bind(from)
        .bind(from)
        .fetch_all(&mut *conn)
        .await?;
    let zeros = vec![0; starts.len()];
    let mut functions: Vec<FunctionActivity> = state
        .functions
        .iter()
        .map(|f| FunctionActivity {
            name: f.name.to_owned(),
            done: zeros.clone(),
            skipped: zeros.clone(),
            retried: zeros.clone(),
            failed: zeros.clone(),
        })
        .collect();
    for (name, bucket, done, skipped, retried, failed) in rows {
        let Some(i) = bucket_index(bucket, starts.len()) else {
            continue;
        };
        // A function no longer in the catalog keeps its rows until they are pruned.
        let Some(function) = functions.iter_mut().find(|f| f.name == name) else {
            continue;
        };
        function.done[i] += done;
        function.skipped[i] += skipped;
        function.retried[i] += retried;
        function.failed[i] += failed;
    }

    let samples: Vec<(String, i64, Option<u64>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT queue_name, TIMESTAMPDIFF({unit}, ?, minute_at) AS bucket, \
                CAST(MAX(ready) AS UNSIGNED) \
         FROM queue_samples WHERE minute_at >= ? GROUP BY queue_name, bucket"
    )))
    .bind(from)
    .bind(from)
    .fetch_all(&mut *conn)
    .await?;
    let mut queues: BTreeMap<String, Vec<Option<u64>>> = state
        .functions
        .iter()
        .flat_map(|f| f.queue.queues_in(&state.shards))
        .map(|queue| (queue.queue(), vec![None; starts.len()]))
        .collect();
    for (queue, bucket, ready) in samples {
        let Some(i) = bucket_index(bucket, starts.len()) else {
            continue;
        };
        let Some(series) = queues.get_mut(&queue) else {
            continue;
        };
        series[i] = series[i].max(ready);
    }

    let outbox: Vec<(i64, u64, f64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT TIMESTAMPDIFF({unit}, ?, minute_at) AS bucket, CAST(MAX(backlog) AS UNSIGNED), \
                MAX(oldest_seconds) \
         FROM outbox_samples WHERE minute_at >= ? GROUP BY bucket"
    )))
    .bind(from)
    .bind(from)
    .fetch_all(&mut *conn)
    .await?;
    let mut outbox_backlog = vec![None; starts.len()];
    let mut outbox_oldest_seconds: Vec<Option<f64>> = vec![None; starts.len()];
    for (bucket, backlog, oldest) in outbox {
        let Some(i) = bucket_index(bucket, starts.len()) else {
            continue;
        };
        outbox_backlog[i] = Some(backlog);
        outbox_oldest_seconds[i] = Some(oldest);
    }

    let hours = buckets(Window::Day, now);
    let since = hours.first().copied().unwrap_or(now);
    let since = since.naive_utc();
    let failures: Vec<(String, i64, u64)> = sqlx::query_as(
        "SELECT function_name, TIMESTAMPDIFF(HOUR, ?, minute_at) AS bucket, \
                CAST(SUM(dead_letters) AS UNSIGNED) \
         FROM function_activity WHERE minute_at >= ? AND dead_letters > 0 \
         GROUP BY function_name, bucket",
    )
    .bind(since)
    .bind(since)
    .fetch_all(&mut *conn)
    .await?;
    drop(conn);
    let mut dead_letters: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (function, bucket, count) in failures {
        let Some(i) = bucket_index(bucket, hours.len()) else {
            continue;
        };
        dead_letters
            .entry(function)
            .or_insert_with(|| vec![0; hours.len()])[i] += count;
    }

    Ok(Activity {
        window,
        bucket_seconds: step.num_seconds(),
        buckets: starts,
        functions,
        queues: queues
            .into_iter()
            .map(|(queue, ready)| QueueSeries { queue, ready })
            .collect(),
        outbox_backlog,
        outbox_oldest_seconds,
        dead_letter_hours: hours,
        dead_letters: dead_letters
            .into_iter()
            .map(|(function, per_hour)| DeadLetterSeries { function, per_hour })
            .collect(),
    })
}

#[utoipa::path(
    get,
    path = "/v1/admin/activity",
    tag = "functions",
    security(("admin_token" = [])),
    params(ActivityQuery),
    responses((status = 200, description = "Per function its done, skipped, retried and failed messages, each queue's ready messages and the outbox's backlog and oldest age, one value per bucket (`buckets`: by minute over the last hour, or by hour over the last day); dead letters per function per hour over the last day", body = Object), crate::responses::AdminErrors)
)]
async fn activity(
    State(state): State<AppState>,
    query: Result<Query<ActivityQuery>, QueryRejection>,
) -> Result<Json<Activity>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    Ok(Json(read(&state, query.window.unwrap_or_default()).await?))
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn the_buckets_end_with_the_current_one_and_the_server_s_buckets_fall_in_theirs() {
        let now = Utc.with_ymd_and_hms(2026, 12, 7, 10, 30, 45).unwrap();
        let minutes = buckets(Window::Hour, now);
        assert_eq!(minutes.len(), 60);
        assert_eq!(
            minutes[59],
            Utc.with_ymd_and_hms(2026, 12, 7, 10, 30, 0).unwrap()
        );
        assert_eq!(
            minutes[0],
            Utc.with_ymd_and_hms(2026, 12, 7, 9, 31, 0).unwrap()
        );
        let hours = buckets(Window::Day, now);
        assert_eq!(hours.len(), 24);
        assert_eq!(
            hours[23],
            Utc.with_ymd_and_hms(2026, 12, 7, 10, 0, 0).unwrap()
        );
        assert_eq!(bucket_index(23, hours.len()), Some(23));
        assert_eq!(bucket_index(24, hours.len()), None, "the future");
        assert_eq!(bucket_index(-1, hours.len()), None, "before the window");
    }
}
