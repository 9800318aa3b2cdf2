//! The bus sampled once a minute for the console's charts: each function queue's ready
//! messages and consumers (`queue_samples`), and the outbox's backlog and the age of its oldest
//! unpublished message (`outbox_samples`). The sweeper runs it (one per deployment; a second
//! sampler in the same minute overwrites the first's row), and it prunes these rows and
//! `function_activity`'s (`super::activity`) past [`RETENTION`], once an hour.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use sqlx::{MySql, MySqlPool, QueryBuilder};

use super::link::BrokerLink;

/// How long the charts' rows are kept: the day chart reads one, a week more is there to be
/// looked at by hand.
pub const RETENTION: TimeDelta = TimeDelta::days(8);
/// How often the sampler prunes.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// Rows a pruning statement deletes at most, so that no delete holds locks for long.
const PRUNE_BATCH: u32 = 5_000;

/// The sweeper's sampler over `queues` (their names).
pub struct BusSampler {
    pool: MySqlPool,
    link: BrokerLink,
    queues: Vec<String>,
    last_pruned: Mutex<Option<Instant>>,
}

impl BusSampler {
    pub fn new(pool: MySqlPool, link: BrokerLink, queues: Vec<String>) -> Self {
        Self {
            pool,
            link,
            queues,
            last_pruned: Mutex::new(None),
        }
    }

    /// Samples this minute: every queue (while the broker answers and does not block this
    /// connection: a queue's passive declare would wait out its bound) and the outbox.
    pub async fn sample(&self) -> Result<u64, sqlx::Error> {
        let minute = this_minute();
        let mut depths = Vec::with_capacity(self.queues.len());
        let mut reachable = self.link.blocked().is_none();
        for queue in &self.queues {
            let depth = if reachable {
                self.link.queue_depth(queue).await.unwrap_or_else(|_| {
                    reachable = false;
                    None
                })
            } else {
                None
            };
            depths.push((queue.as_str(), depth));
        }
        let mut conn = self.pool.acquire().await?;
        if !depths.is_empty() {
            let mut insert = QueryBuilder::<MySql>::new(
                "INSERT INTO queue_samples (minute_at, queue_name, ready, consumers) ",
            );
            insert.push_values(&depths, |mut row, (queue, depth)| {
                row.push_bind(minute.naive_utc())
                    .push_bind(*queue)
                    .push_bind(depth.map(|d| d.ready))
                    .push_bind(depth.map(|d| d.consumers));
            });
            insert.push(
                " ON DUPLICATE KEY UPDATE ready = VALUES(ready), consumers = VALUES(consumers)",
            );
            insert.build().execute(&mut *conn).await?;
        }
        let (backlog, oldest_seconds) = super::outbox::outbox_lag(&mut conn).await?;
        sqlx::query(
            "INSERT INTO outbox_samples (minute_at, backlog, oldest_seconds) VALUES (?, ?, ?) \
             ON DUPLICATE KEY UPDATE backlog = VALUES(backlog), \
             oldest_seconds = VALUES(oldest_seconds)",
        )
        .bind(minute.naive_utc())
        .bind(backlog)
        .bind(oldest_seconds)
        .execute(&mut *conn)
        .await?;
        Ok(depths.len() as u64 + 1)
    }

    /// Deletes the charts' rows older than [`RETENTION`], in short batches.
    pub async fn prune(&self) -> Result<u64, sqlx::Error> {
        let before = (this_minute() - RETENTION).naive_utc();
        let mut deleted = 0;
        for statement in [
            "DELETE FROM function_activity WHERE minute_at < ? LIMIT ?",
            "DELETE FROM queue_samples WHERE minute_at < ? LIMIT ?",
            "DELETE FROM outbox_samples WHERE minute_at < ? LIMIT ?",
        ] {
            loop {
                let gone = sqlx::query(statement)
                    .bind(before)
                    .bind(PRUNE_BATCH)
                    .execute(&self.pool)
                    .await?
                    .rows_affected();
                deleted += gone;
                if gone < u64::from(PRUNE_BATCH) {
                    break;
                }
            }
        }
        Ok(deleted)
    }

    pub fn prune_due(&self) -> bool {
        let mut last = self.last_pruned.lock().unwrap_or_else(|p| p.into_inner());
        let due = last.is_none_or(|at| at.elapsed() >= PRUNE_EVERY);
        if due {
            *last = Some(Instant::now());
        }
        due
    }
}

/// The start of the current minute (UTC), the key every chart row is kept under.
pub fn this_minute() -> DateTime<Utc> {
    let now = Utc::now();
    now.duration_trunc(TimeDelta::minutes(1)).unwrap_or(now)
}
