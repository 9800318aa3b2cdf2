//! Periodic maintenance jobs: the [`Job`] trait and its scheduler, and the platform's own jobs
//! (the outbox relay, the due sweep, the held-message release, the activity flush, the bus
//! sampler; reapers and expiry come with their workflows). Locally each job runs on its own
//! timer; in AWS one scheduled Lambda runs [`run_all_once`]. A failing job backs off (doubling its interval, at most 30 s extra) so a
//! dead broker or database is not hammered, and resumes its pace once it succeeds.

mod activity_flush;
pub mod auditor;
mod bus_samples;
mod due_sweep;
mod held_release;
mod outbox_relay;

pub use activity_flush::ActivityFlush;
pub use due_sweep::{DueSweep, DueSweepConfig};
pub use held_release::HeldRelease;
pub use outbox_relay::{OutboxRelayJob, RelayStalled};

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use paybus_retry::Backoff;

/// The extra pause of a failing job on top of its interval (500 ms doubling, at most 30 s), so
/// a dead broker or database is not hammered.
const FAILING_JOB_BACKOFF: Backoff =
    Backoff::exponential(Duration::from_millis(500), Duration::from_secs(30));

pub type JobError = Box<dyn std::error::Error + Send + Sync>;
pub type JobFuture<'a> = Pin<Box<dyn Future<Output = Result<JobReport, JobError>> + Send + 'a>>;

/// What one pass changed; a job logs only when something did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct JobReport {
    pub changed: u64,
}

pub trait Job: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn interval(&self) -> Duration;
    fn run_once(&self) -> JobFuture<'_>;
}

/// Runs every job on its own timer until `shutdown` is cancelled.
pub async fn run(jobs: Vec<Arc<dyn Job>>, shutdown: CancellationToken) {
    let mut tasks = tokio::task::JoinSet::new();
    for job in jobs {
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            let mut failures: u32 = 0;
            loop {
                let pause = match job.run_once().await {
                    Ok(_) => {
                        failures = 0;
                        job.interval()
                    }
                    Err(error) => {
                        failures = failures.saturating_add(1);
                        let backoff = FAILING_JOB_BACKOFF.delay(failures);
                        tracing::warn!(job = job.name(), %error, failures, ?backoff, "job failed; backing off");
                        job.interval() + backoff
                    }
                };
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// One pass of every job (the scheduled-Lambda form). Returns each job's result.
pub async fn run_all_once(
    jobs: &[Arc<dyn Job>],
) -> Vec<(&'static str, Result<JobReport, JobError>)> {
    let mut results = Vec::with_capacity(jobs.len());
    for job in jobs {
        results.push((job.name(), job.run_once().await));
    }
    results
}
