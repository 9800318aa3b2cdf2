//! The due-retries sweep: turns notifications that are due again into
//! `partner.notification.created` messages. This is how a retry (acked with
//! `Outcome::Retry`) or a delivery whose process died mid-request (its lease ran out) comes
//! back to deliver-webhook.
//!
//! Each arming is re-published once. A row is *armed* when deliver-webhook pushes its
//! `next_attempt_at` out (the claim's lease, a retry's backoff): that UPDATE also moves
//! `updated_at` (ON UPDATE CURRENT_TIMESTAMP), to a moment before the new `next_attempt_at`.
//! Once due, the sweep publishes one message for an armed row and disarms it by setting
//! `updated_at = NOW(6)` (≥ `next_attempt_at`), in the same transaction as the outbox row. So
//! a backlog of due messages waiting for busy consumers is not multiplied by every pass, and
//! a fresh row (inserted with `updated_at = next_attempt_at`) is left to the message its
//! transition already sent. A due row that stays disarmed for `stale_after` (its message was
//! lost, or consumers are down) is re-published again: nothing is stranded.
//!
//! Re-publishing is always safe: a message for a row in flight, not due, or already settled
//! is `Skipped` by the claim. Several sweeps may run: rows are picked `FOR UPDATE SKIP LOCKED`.

use std::time::Duration;

use paybus_platform::{
    bus::{
        Envelope, Outbox,
        outbox::OutboxError,
        sweeper::{Job, JobFuture, JobReport},
    },
    notifications::NotificationCreated,
};
use sqlx::{MySql, QueryBuilder};

use crate::notification::micros;

/// The sweep's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueNotificationsConfig {
    /// Pause between passes (default 5 s): the extra delay a retry can see past its backoff.
    pub interval: Duration,
    /// Rows per transaction (default 500); a pass continues while batches come back full.
    pub batch_size: u32,
    /// A due row already re-published is re-published again after this (default 5 min).
    pub stale_after: Duration,
}

impl Default for DueNotificationsConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            batch_size: 500,
            stale_after: Duration::from_secs(5 * 60),
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DueNotificationsReport {
    /// Notifications re-published.
    pub republished: u64,
}

/// The sweep as a [`Job`] for the runner and the scheduled sweeper.
#[derive(Clone)]
pub struct DueNotificationsJob {
    outbox: Outbox,
    config: DueNotificationsConfig,
}

impl DueNotificationsJob {
    pub fn new(outbox: Outbox, config: DueNotificationsConfig) -> Self {
        Self { outbox, config }
    }

    /// Re-publishes every armed due notification (and stale ones), batch by batch.
    #[tracing::instrument(skip_all, name = "due_notifications")]
    pub async fn run_once(&self) -> Result<DueNotificationsReport, OutboxError> {
        let mut report = DueNotificationsReport::default();
        loop {
            let published = self.republish_batch().await?;
            report.republished += published;
            if published < u64::from(self.config.batch_size) {
                break;
            }
        }
        if report.republished > 0 {
            tracing::info!(
                republished = report.republished,
                "due partner notifications re-published"
            );
        }
        Ok(report)
    }

    /// One transaction: pick, disarm, write the messages to the outbox; published on commit.
    async fn republish_batch(&self) -> Result<u64, OutboxError> {
        let mut uow = self.outbox.begin().await?;
        // Served by index_partner_notifications_due (status, next_attempt_at).
        let ids: Vec<u64> = sqlx::query_scalar(
            "SELECT id FROM partner_notifications \
             WHERE status = 'PENDING' AND next_attempt_at <= NOW(6) \
               AND (updated_at < next_attempt_at \
                    OR updated_at <= NOW(6) - INTERVAL ? MICROSECOND) \
             ORDER BY next_attempt_at, id \
             LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(micros(self.config.stale_after))
        .bind(self.config.batch_size)
        .fetch_all(&mut *uow)
        .await?;
        if ids.is_empty() {
            uow.rollback().await?;
            return Ok(0);
        }
        let mut disarm = QueryBuilder::<MySql>::new(
            "UPDATE partner_notifications SET updated_at = NOW(6) WHERE id IN (",
        );
        let mut list = disarm.separated(", ");
        for id in &ids {
            list.push_bind(*id);
        }
        disarm.push(")");
        disarm.build().execute(&mut *uow).await?;
        for &notification_id in &ids {
            let envelope = Envelope::new(NotificationCreated { notification_id });
            uow.send(&envelope).await?;
        }
        uow.commit().await?;
        Ok(u64::try_from(ids.len()).unwrap_or(u64::MAX))
    }
}

impl Job for DueNotificationsJob {
    fn name(&self) -> &'static str {
        "due-partner-notifications"
    }

    fn interval(&self) -> Duration {
        self.config.interval
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            let report = DueNotificationsJob::run_once(self).await?;
            Ok(JobReport {
                changed: report.republished,
            })
        })
    }
}
