//! The due sweep: turns rows that are due again into messages, through the outbox. This is how
//! a retry (acked with `Outcome::Retry`) or an attempt whose process died (its in-place lease
//! ran out) comes back to its function.
//!
//! Each arming is re-published once: the kit's statement that pushes `next_attempt_at` out (a
//! lease, a backoff) also sets `republished_at` to NULL, and the sweep publishes one message for
//! a due, armed row and stamps it, in the outbox row's transaction. So a backlog waiting for busy
//! consumers is not multiplied by every pass, and a fresh row (inserted stamped) is left to the
//! message its transition sent. A due row stamped longer than `stale_after` ago is re-published
//! again: nothing is stranded.
//!
//! Re-publishing is always safe (a message for a row not due is `Skipped` by the claim), and
//! several sweeps may run (`FOR UPDATE SKIP LOCKED`). A message names one row
//! ([`DueSweep::new`]) or a few sharing a column ([`DueSweep::grouped`]).

use std::{collections::BTreeMap, time::Duration};

use sqlx::AssertSqlSafe;

use super::{Job, JobFuture, JobReport};
use paybus_bus::{Envelope, Message, Outbox, outbox::OutboxError};
use paybus_retry::{Clock, WorkTable};

/// The sweep's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueSweepConfig {
    /// Pause between passes (default 5 s): the extra delay a retry can see past its backoff.
    pub interval: Duration,
    /// Rows per transaction (default 500); a pass continues while batches come back full.
    pub batch_size: u32,
    /// A due row already re-published is re-published again after this (default 5 min).
    pub stale_after: Duration,
}

impl Default for DueSweepConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            batch_size: 500,
            stale_after: Duration::from_secs(5 * 60),
        }
    }
}

/// How due rows become messages.
enum Messages<M> {
    /// One message per row, built from its id.
    PerRow(fn(u64) -> M),
    /// Rows grouped by the value of `column`, at most `max` ids per message, built from the
    /// value and the ids.
    Grouped {
        column: &'static str,
        max: usize,
        build: fn(u64, Vec<u64>) -> M,
    },
}

// Function pointers are copies whatever `M` is (a derive would ask `M: Copy`).
impl<M> Clone for Messages<M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for Messages<M> {}

/// Re-publishes due rows of one [`WorkTable`] as `M` messages.
pub struct DueSweep<M> {
    name: &'static str,
    table: &'static WorkTable,
    message: Messages<M>,
    outbox: Outbox,
    clock: Clock,
    config: DueSweepConfig,
}

impl<M> Clone for DueSweep<M> {
    fn clone(&self) -> Self {
        Self {
            name: self.name,
            table: self.table,
            message: self.message,
            outbox: self.outbox.clone(),
            clock: self.clock.clone(),
            config: self.config.clone(),
        }
    }
}

impl<M: Message> DueSweep<M> {
    /// `name` is the job's name in logs and in the sweeper's report (e.g.
    /// `due-notifications`).
    pub fn new(
        name: &'static str,
        table: &'static WorkTable,
        message: fn(u64) -> M,
        outbox: Outbox,
        config: DueSweepConfig,
    ) -> Self {
        Self::with_messages(name, table, Messages::PerRow(message), outbox, config)
    }

    /// The same sweep for messages that carry a group of rows: due rows sharing the value of
    /// `column` (an integer column, e.g. `batch_id`) go out together, at most `max` ids per
    /// message.
    pub fn grouped(
        name: &'static str,
        table: &'static WorkTable,
        column: &'static str,
        max: usize,
        build: fn(u64, Vec<u64>) -> M,
        outbox: Outbox,
        config: DueSweepConfig,
    ) -> Self {
        let message = Messages::Grouped {
            column,
            max: max.max(1),
            build,
        };
        Self::with_messages(name, table, message, outbox, config)
    }

    fn with_messages(
        name: &'static str,
        table: &'static WorkTable,
        message: Messages<M>,
        outbox: Outbox,
        config: DueSweepConfig,
    ) -> Self {
        Self {
            name,
            table,
            message,
            outbox,
            clock: Clock::Database,
            config,
        }
    }

    /// The same sweep on another clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Re-publishes every armed due row (and stale ones), batch by batch; returns how many.
    pub async fn run_once(&self) -> Result<u64, OutboxError> {
        let mut republished = 0;
        loop {
            let published = self.republish_batch().await?;
            republished += published;
            if published < u64::from(self.config.batch_size) {
                break;
            }
        }
        if republished > 0 {
            tracing::info!(job = self.name, republished, "due rows re-published");
        }
        Ok(republished)
    }

    /// One transaction: pick, stamp, write the messages to the outbox; published on commit.
    async fn republish_batch(&self) -> Result<u64, OutboxError> {
        let mut uow = self.outbox.begin_read_committed().await?;
        let ids = self
            .table
            .take_due_for_republish(
                &mut uow,
                self.config.stale_after,
                self.config.batch_size,
                &self.clock,
            )
            .await?;
        if ids.is_empty() {
            uow.rollback().await?;
            return Ok(0);
        }
        match self.message {
            Messages::PerRow(build) => {
                for id in &ids {
                    uow.send(&Envelope::new(build(*id))).await?;
                }
            }
            Messages::Grouped { column, max, build } => {
                for (key, ids) in self.grouped_by(&mut uow, column, &ids).await? {
                    for group in ids.chunks(max) {
                        uow.send(&Envelope::new(build(key, group.to_vec()))).await?;
                    }
                }
            }
        }
        uow.commit().await?;
        Ok(ids.len() as u64)
    }

    /// `ids` (rows this transaction holds) by their value of `column`.
    async fn grouped_by(
        &self,
        conn: &mut sqlx::MySqlConnection,
        column: &str,
        ids: &[u64],
    ) -> Result<BTreeMap<u64, Vec<u64>>, sqlx::Error> {
        let rows: Vec<(u64, u64)> = ids
            .iter()
            .fold(
                sqlx::query_as(AssertSqlSafe(format!(
                    "SELECT {column}, id FROM {} WHERE id IN ({}) ORDER BY id",
                    self.table.table,
                    paybus_db::placeholders(ids.len())
                ))),
                |query, id| query.bind(*id),
            )
            .fetch_all(conn)
            .await?;
        let mut groups: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (key, id) in rows {
            groups.entry(key).or_default().push(id);
        }
        Ok(groups)
    }
}

impl<M: Message> Job for DueSweep<M> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn interval(&self) -> Duration {
        self.config.interval
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            let changed = DueSweep::run_once(self).await?;
            Ok(JobReport { changed })
        })
    }
}
