//! The outbox relay as a job (locally on its timer, in AWS in the scheduled Lambda).

use std::time::Duration;

use super::{Job, JobFuture, JobReport};
use paybus_bus::outbox::Relay;

/// The outbox relay as a job: drains due rows batch by batch, then prunes old published rows.
pub struct OutboxRelayJob {
    relay: Relay,
    interval: Duration,
}

impl OutboxRelayJob {
    pub fn new(relay: Relay, interval: Duration) -> Self {
        Self { relay, interval }
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "{failed} outbox message(s) could not be published: the broker is unreachable or blocks publishers (each row's last_error says which)"
)]
pub struct RelayStalled {
    pub failed: u64,
}

impl Job for OutboxRelayJob {
    fn name(&self) -> &'static str {
        "outbox-relay"
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            let mut changed = 0;
            loop {
                let report = self.relay.run_once().await?;
                changed += report.published;
                if report.failed > 0 {
                    return Err(RelayStalled {
                        failed: report.failed,
                    }
                    .into());
                }
                if report.published < u64::from(self.relay.batch_size()) {
                    break;
                }
            }
            changed += self.relay.prune().await?;
            // The records of skipped deliveries live as long as the published outbox rows.
            changed += self.relay.prune_skips().await?;
            Ok(JobReport { changed })
        })
    }
}
