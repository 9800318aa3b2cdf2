//! The `prune-attempts` job: deletes delivery attempt records (`partner_notification_attempts`)
//! older than the retention, a batch at a time, so the table holds a bounded history.

use std::time::Duration;

use paybus_maintenance::{Job, JobFuture, JobReport};
use paybus_partners::attempts;
use sqlx::MySqlPool;

/// The job's settings, with documented defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneConfig {
    /// How long an attempt record is kept (default 30 days: what the partner API shows).
    pub retention: Duration,
    /// How often the job runs (default 10 min).
    pub interval: Duration,
    /// Rows deleted per statement (default 1000), so a backlog never holds a long lock.
    pub batch: u32,
}

impl Default for PruneConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(30 * 24 * 60 * 60),
            interval: Duration::from_secs(10 * 60),
            batch: 1_000,
        }
    }
}

pub struct PruneAttempts {
    pool: MySqlPool,
    config: PruneConfig,
}

impl PruneAttempts {
    pub fn new(pool: MySqlPool, config: PruneConfig) -> Self {
        Self { pool, config }
    }

    /// Deletes every record past the retention, batch by batch; returns how many.
    pub async fn run_once(&self) -> Result<u64, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let mut deleted = 0;
        loop {
            let n = attempts::prune(&mut conn, self.config.retention, self.config.batch).await?;
            deleted += n;
            if n < u64::from(self.config.batch) {
                return Ok(deleted);
            }
        }
    }
}

impl Job for PruneAttempts {
    fn name(&self) -> &'static str {
        "prune-attempts"
    }

    fn interval(&self) -> Duration {
        self.config.interval
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            let changed = PruneAttempts::run_once(self).await?;
            Ok(JobReport { changed })
        })
    }
}
