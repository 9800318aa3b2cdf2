//! The worker: the retry path of bonus jobs (seed 003's `ChargeEventJobWorker`), a sweeper
//! job. Each run claims at most `worker_batch` (30) due PENDING jobs — `next_retry_at` NULL or
//! past, oldest due first, `FOR UPDATE SKIP LOCKED` so several workers never take the same
//! job — and attempts them one by one. Its failures count as retries (10, then 15 minutes,
//! then FAILED with a dead letter).
//!
//! The seed's "no active charge event → end without querying `charge_event_job`" is not kept:
//! it would strand FIRST_CHARGE retries (they have no event), and the retries of any event
//! that ended after its jobs were created — the very jobs the seed snapshots `additional_can`
//! for so that a retry no longer depends on the event. A run with nothing due costs one
//! indexed SELECT (`idx_charge_event_job_status_next_retry_at`) and writes nothing, which is
//! what the rule was protecting.

use std::time::{Duration, Instant};

use paybus_bus::{Handler, metrics};
use paybus_maintenance::{Job, JobFuture, JobReport};
use paybus_retry::{Clock, RetryPolicy};
use sqlx::MySqlPool;

use crate::{
    GrantBonus,
    attempt::{self, Attempted},
};

/// What one worker run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WorkerReport {
    pub claimed: u64,
    pub granted: u64,
    pub retried: u64,
    /// Given up: FAILED, with a dead letter.
    pub failed: u64,
    pub claims_lost: u64,
}

/// The worker job.
#[derive(Clone)]
pub struct BonusWorker {
    pool: MySqlPool,
    interval: Duration,
    batch: u32,
    policy: RetryPolicy,
    clock: Clock,
}

impl BonusWorker {
    pub fn new(pool: MySqlPool, interval: Duration, batch: u32) -> Self {
        Self {
            pool,
            interval,
            batch,
            policy: paybus_bonuses::job::RETRY_POLICY,
            clock: Clock::Database,
        }
    }

    /// The same worker on another clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// One run: claim the due batch, attempt each job. An error (the database went away)
    /// stops the run; jobs it had claimed and not settled stay PROCESSING for the reaper.
    pub async fn run_once(&self) -> Result<WorkerReport, paybus_bonuses::BonusError> {
        let claimed = attempt::claim_due(&self.pool, self.batch, &self.clock).await?;
        let mut report = WorkerReport {
            claimed: claimed.len() as u64,
            ..WorkerReport::default()
        };
        for job in &claimed {
            let started = Instant::now();
            let outcome = attempt::attempt(&self.pool, job, &self.policy, &self.clock).await?;
            let label = match outcome {
                Attempted::Granted { .. } => {
                    report.granted += 1;
                    "worker_granted"
                }
                Attempted::Retry { .. } => {
                    report.retried += 1;
                    "worker_retry"
                }
                Attempted::GaveUp { .. } => {
                    report.failed += 1;
                    "worker_failed"
                }
                Attempted::ClaimLost => {
                    report.claims_lost += 1;
                    "worker_claim_lost"
                }
            };
            metrics::record(GrantBonus::FUNCTION, label, started.elapsed());
        }
        if report.claimed > 0 {
            tracing::info!(
                claimed = report.claimed,
                granted = report.granted,
                retried = report.retried,
                failed = report.failed,
                claims_lost = report.claims_lost,
                "bonus worker run"
            );
        }
        Ok(report)
    }
}

impl Job for BonusWorker {
    fn name(&self) -> &'static str {
        "bonus-job-worker"
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            let report = BonusWorker::run_once(self).await?;
            Ok(JobReport {
                changed: report.claimed,
            })
        })
    }
}
