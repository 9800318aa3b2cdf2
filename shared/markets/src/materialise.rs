//! A batch's tasks, created after the suspension committed: set-based (`INSERT … SELECT`), a
//! chunk per transaction, resumable. Why after: even one `INSERT … SELECT` grows with the number
//! of open orders (about 0.5 s for 100k here), and the suspend request must not, so it only
//! freezes the target set on the batch row (market, `max_target_id`).
//!
//! Each chunk is one short transaction that holds the batch row (`FOR UPDATE`: two materialisers
//! never write the same chunk), inserts the tasks of the next open orders after the cursor (at
//! most [`Plan::chunk`], in id order), moves the cursor and `created_count`, and writes the
//! chunk's `market.cancel_tasks.created` messages ([`Plan::tasks_per_message`] ids each). The
//! chunk that finds less than a full one stamps `materialised_at`: the count is final from then.
//!
//! A process that dies between chunks leaves the cursor where the last commit put it; the
//! [`Materialiser`] job picks the batch up again, and the unique (batch, target) key stands
//! behind the row lock: a task is never created twice.

use std::time::Duration;

use paybus_bus::{Envelope, Outbox, UnitOfWork, outbox::OutboxError};
use paybus_maintenance::{Job, JobFuture, JobReport};
use sqlx::MySqlConnection;

use crate::{CancelTasksCreated, task::TaskType};

/// Open orders turned into tasks per transaction by default.
pub const DEFAULT_CHUNK: u32 = 1_000;

/// Tasks the suspend request creates itself by default: a market with no more open orders
/// than this is materialised before the answer; a larger one continues in the materialiser.
pub const DEFAULT_IN_REQUEST: u32 = 100;

/// Task ids per message by default. Against one task per message (`paybus-lab bench suspend`),
/// a group shares one cancel transaction (one commit for all its tasks) and one delivery, and
/// runs several times faster end to end.
pub const DEFAULT_TASKS_PER_MESSAGE: usize = 16;

/// How a batch is cut into transactions and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Tasks created per materialiser transaction (default [`DEFAULT_CHUNK`]).
    pub chunk: u32,
    /// Tasks created inside the suspend request's own transaction (default
    /// [`DEFAULT_IN_REQUEST`]): bounded, so the request stays short whatever N is.
    pub in_request: u32,
    /// Task ids per `market.cancel_tasks.created` message (default
    /// [`DEFAULT_TASKS_PER_MESSAGE`]).
    pub tasks_per_message: usize,
}

impl Default for Plan {
    fn default() -> Self {
        Self {
            chunk: DEFAULT_CHUNK,
            in_request: DEFAULT_IN_REQUEST,
            tasks_per_message: DEFAULT_TASKS_PER_MESSAGE,
        }
    }
}

/// A batch row the current transaction holds.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct HeldBatch {
    pub id: u64,
    pub market_id: u64,
    pub max_target_id: u64,
    pub materialise_cursor: u64,
}

/// What one chunk did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub batch_id: u64,
    pub created: u64,
    /// The batch is fully materialised: its created count is final.
    pub finished: bool,
}

/// Creates the next chunk of `batch`'s tasks (at most `limit`) and their messages in `uow`,
/// which must hold the batch row.
pub(crate) async fn next_chunk(
    uow: &mut UnitOfWork<'_>,
    batch: &HeldBatch,
    limit: u32,
    plan: &Plan,
) -> Result<Chunk, OutboxError> {
    let limit = limit.max(1);
    let created = sqlx::query(
        "INSERT INTO tasks (type, batch_id, target_id) \
         SELECT ?, ?, id FROM orders \
         WHERE open_market_id = ? AND id > ? AND id <= ? \
         ORDER BY id LIMIT ?",
    )
    .bind(<&str>::from(TaskType::CancelOpenOrder))
    .bind(batch.id)
    .bind(batch.market_id)
    .bind(batch.materialise_cursor)
    .bind(batch.max_target_id)
    .bind(limit)
    .execute(&mut **uow)
    .await?
    .rows_affected();
    let tasks = created_after(uow, batch.id, batch.materialise_cursor).await?;
    let finished = created < u64::from(limit);
    let cursor = match tasks.last() {
        Some((_, target)) if !finished => *target,
        _ => batch.max_target_id,
    };
    sqlx::query(
        "UPDATE task_batches \
         SET materialise_cursor = ?, created_count = created_count + ?, \
             materialised_at = CASE WHEN ? THEN NOW(6) END \
         WHERE id = ?",
    )
    .bind(cursor)
    .bind(created)
    .bind(finished)
    .bind(batch.id)
    .execute(&mut **uow)
    .await?;
    let ids: Vec<u64> = tasks.into_iter().map(|(id, _)| id).collect();
    for task_ids in ids.chunks(plan.tasks_per_message.max(1)) {
        uow.send(&Envelope::new(CancelTasksCreated {
            batch_id: batch.id,
            task_ids: task_ids.to_vec(),
        }))
        .await?;
    }
    if finished {
        tracing::info!(
            batch_id = batch.id,
            "cancel tasks materialised: count final"
        );
    }
    Ok(Chunk {
        batch_id: batch.id,
        created,
        finished,
    })
}

/// The batch's tasks whose target is past `cursor` (the chunk just inserted: nothing past the
/// cursor existed before it), in target order. Auto-increment ids of an `INSERT … SELECT`
/// need not be consecutive (`innodb_autoinc_lock_mode = 2`), so they are read back.
async fn created_after(
    conn: &mut MySqlConnection,
    batch_id: u64,
    cursor: u64,
) -> Result<Vec<(u64, u64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, target_id FROM tasks WHERE batch_id = ? AND target_id > ? ORDER BY target_id",
    )
    .bind(batch_id)
    .bind(cursor)
    .fetch_all(conn)
    .await
}

/// The materialiser's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaterialiserConfig {
    /// Pause between passes (default 250 ms): how late a batch's second chunk can start after
    /// the suspend request committed its first.
    pub interval: Duration,
    pub plan: Plan,
}

impl Default for MaterialiserConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(250),
            plan: Plan::default(),
        }
    }
}

/// The job that materialises batches still preparing, chunk by chunk, until none is left.
/// Several may run: each chunk takes its batch row `FOR UPDATE SKIP LOCKED`.
#[derive(Clone)]
pub struct Materialiser {
    outbox: Outbox,
    config: MaterialiserConfig,
}

impl Materialiser {
    pub fn new(outbox: Outbox, config: MaterialiserConfig) -> Self {
        Self { outbox, config }
    }

    /// Chunks until no batch is preparing (or every one is held elsewhere); returns the
    /// tasks created.
    pub async fn run_once(&self) -> Result<u64, OutboxError> {
        let mut created = 0;
        while let Some(chunk) = self.one_chunk().await? {
            created += chunk.created;
        }
        if created > 0 {
            tracing::info!(
                job = "cancel-task-materialiser",
                created,
                "cancel tasks created"
            );
        }
        Ok(created)
    }

    /// One transaction: the oldest batch still preparing, its next chunk.
    pub async fn one_chunk(&self) -> Result<Option<Chunk>, OutboxError> {
        let mut uow = self.outbox.begin_read_committed().await?;
        let batch: Option<HeldBatch> = sqlx::query_as(
            "SELECT id, market_id, max_target_id, materialise_cursor FROM task_batches \
             WHERE materialised_at IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        .fetch_optional(&mut *uow)
        .await?;
        let Some(batch) = batch else {
            uow.rollback().await?;
            return Ok(None);
        };
        let chunk = next_chunk(&mut uow, &batch, self.config.plan.chunk, &self.config.plan).await?;
        uow.commit().await?;
        Ok(Some(chunk))
    }
}

impl Job for Materialiser {
    fn name(&self) -> &'static str {
        "cancel-task-materialiser"
    }

    fn interval(&self) -> Duration {
        self.config.interval
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            let changed = Materialiser::run_once(self).await?;
            Ok(JobReport { changed })
        })
    }
}
