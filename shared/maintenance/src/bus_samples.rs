//! The bus sampler as a job: the queues' depth and the outbox's lag every minute, and the old
//! samples pruned.

use std::time::Duration;

use super::{Job, JobFuture, JobReport};
use paybus_bus::samples::BusSampler;

impl Job for BusSampler {
    fn name(&self) -> &'static str {
        "bus-sampler"
    }

    fn interval(&self) -> Duration {
        Duration::from_secs(60)
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            self.sample().await?;
            let pruned = if self.prune_due() {
                self.prune().await?
            } else {
                0
            };
            // Samples are no change; pruned rows are.
            Ok(JobReport { changed: pruned })
        })
    }
}
