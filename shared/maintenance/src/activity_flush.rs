//! The activity tally's flush as a job: each process writes its counts every
//! [`FLUSH_EVERY`](paybus_bus::activity::FLUSH_EVERY).

use std::time::Duration;

use sqlx::MySqlPool;

use super::{Job, JobFuture, JobReport};
use paybus_bus::activity::{FLUSH_EVERY, flush};

/// A running process's flush, every [`FLUSH_EVERY`].
pub struct ActivityFlush {
    pool: MySqlPool,
}

impl ActivityFlush {
    pub fn new(pool: MySqlPool) -> Self {
        Self { pool }
    }
}

impl Job for ActivityFlush {
    fn name(&self) -> &'static str {
        "activity-flush"
    }

    fn interval(&self) -> Duration {
        FLUSH_EVERY
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            flush(&self.pool).await?;
            // Counts are no change to report: a pass that only flushed stays quiet.
            Ok(JobReport::default())
        })
    }
}
