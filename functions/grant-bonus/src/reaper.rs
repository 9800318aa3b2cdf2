//! The reaper: jobs whose attempt died with its process (a crash, a kill, a Lambda timeout)
//! would stay PROCESSING for ever — the seed has no reaper. A sweeper job returns every job
//! PROCESSING for longer than `processing_timeout` to PENDING, due now, without counting a
//! failure (the attempt never finished); the worker's next run grants it. Should that attempt
//! still be alive after all, its settle is guarded by the claim it no longer holds, so it
//! writes nothing and the job is granted once.

use std::time::Duration;

use paybus_bonuses::job::BONUS_JOBS;
use paybus_db as db;
use paybus_maintenance::{Job, JobFuture, JobReport};
use paybus_retry::Clock;
use sqlx::MySqlPool;

use crate::config::REAPER_INTERVAL;

/// Rows per reaping transaction.
const REAP_BATCH: u32 = 500;

/// The reaper job.
#[derive(Clone)]
pub struct BonusReaper {
    pool: MySqlPool,
    timeout: Duration,
    clock: Clock,
}

impl BonusReaper {
    pub fn new(pool: MySqlPool, timeout: Duration) -> Self {
        Self {
            pool,
            timeout,
            clock: Clock::Database,
        }
    }

    /// The same reaper on another clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Returns every expired PROCESSING job to PENDING, batch by batch; their ids.
    pub async fn run_once(&self) -> Result<Vec<u64>, sqlx::Error> {
        let mut reaped = Vec::new();
        loop {
            let mut tx = db::begin_read_committed(&self.pool).await?;
            let ids = BONUS_JOBS
                .reap_expired(&mut tx, self.timeout, REAP_BATCH, &self.clock)
                .await?;
            tx.commit().await?;
            let full = ids.len() == REAP_BATCH as usize;
            reaped.extend(ids);
            if !full {
                break;
            }
        }
        if !reaped.is_empty() {
            tracing::warn!(
                count = reaped.len(),
                job_ids = ?reaped,
                timeout = ?self.timeout,
                "bonus jobs stuck in PROCESSING returned to PENDING (their attempt died)"
            );
        }
        Ok(reaped)
    }
}

impl Job for BonusReaper {
    fn name(&self) -> &'static str {
        "bonus-job-reaper"
    }

    fn interval(&self) -> Duration {
        REAPER_INTERVAL
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            let reaped = BonusReaper::run_once(self).await?;
            Ok(JobReport {
                changed: reaped.len() as u64,
            })
        })
    }
}
