//! The held-message release: sends again the messages a consumer held as newer than it knew
//! (`paybus_bus::held`), once this process's functions read their version.

use std::time::Duration;

use super::{Job, JobFuture, JobReport};
use paybus_bus::{
    Outbox,
    held::{self, Known},
};

/// Messages released per function and pass: a rolling deploy holds a few seconds' traffic of a
/// function at most, released over a few passes.
const BATCH: u32 = 500;

/// Releases the held messages of `known` functions whose version they read.
pub struct HeldRelease {
    outbox: Outbox,
    known: Vec<Known>,
    interval: Duration,
}

impl HeldRelease {
    pub fn new(outbox: Outbox, known: Vec<Known>) -> Self {
        Self {
            outbox,
            known,
            interval: Duration::from_secs(5),
        }
    }
}

impl Job for HeldRelease {
    fn name(&self) -> &'static str {
        "held-release"
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            let changed = held::release(&self.outbox, &self.known, BATCH).await?;
            Ok(JobReport { changed })
        })
    }
}
