//! The due sweep: turns rows that are due again into messages, through the outbox. This is
//! how a retry (acked with `Outcome::Retry`) or an attempt whose process died (its in-place
//! lease ran out) comes back to its function.
//!
//! Each arming is re-published once. A row is *armed* when the kit pushes its
//! `next_attempt_at` out (a claim's lease, a retry's backoff): that statement also sets the
//! table's `republished_at` to NULL. Once due, the sweep publishes one message for an armed
//! row and stamps `republished_at`, in the same transaction as the outbox row. So a backlog of
//! due messages waiting for busy consumers is not multiplied by every pass, and a fresh row
//! (inserted with `republished_at` set) is left to the message its transition already sent. A
//! due row stamped longer than `stale_after` ago (its message was lost, or consumers are down)
//! is re-published again: nothing is stranded.
//!
//! Re-publishing is always safe: a message for a row in flight, not due, or already settled
//! is `Skipped` by the claim. Several sweeps may run: rows are picked `FOR UPDATE SKIP LOCKED`.

use std::time::Duration;

use crate::bus::{
    Envelope, Message, Outbox,
    outbox::OutboxError,
    sweeper::{Job, JobFuture, JobReport},
};

use super::{Clock, WorkTable};

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

/// Re-publishes due rows of one [`WorkTable`] as `M` messages (built from the row id).
pub struct DueSweep<M> {
    name: &'static str,
    table: &'static WorkTable,
    message: fn(u64) -> M,
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
        for id in &ids {
            uow.send(&Envelope::new((self.message)(*id))).await?;
        }
        uow.commit().await?;
        Ok(ids.len() as u64)
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
