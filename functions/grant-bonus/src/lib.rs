//! The grant-bonus function (docs/workflows/bonuses.md, seed 003): the bonus jobs a payment
//! completion wrote (`charge.bonus_job.created {job_id}`) granted exactly once, never lost. It
//! offers [`GrantBonus`] (the immediate attempt, up to 16 messages at once: [`attempt`]) and its
//! jobs: [`BonusWorker`] (the retries), [`BonusReaper`] (dead claims back to PENDING) and
//! [`MemberCanCheckpointer`] (the auditor's balance checkpoints).
//!
//! | delivery | outcome |
//! | --- | --- |
//! | this delivery granted the job | `Done` (the EVENT charge, the credit and DONE committed together) |
//! | the grant failed | `Retry` (the worker retries it when due) |
//! | the grant failed and that was the last attempt (after an ops retry) | `Failed`: dead letter |
//! | the job is DONE, PROCESSING or not due (a duplicate, a late message), or another message of the same batch names it | `Skipped` |
//! | the job is FAILED and this is a redelivery | `Failed` again (its dead letter may not have been confirmed; it is recorded once) |
//! | no such job | `Failed`: dead letter |
//! | the database is unreachable while granting or settling | error: requeued (nothing was committed: the job is still PENDING and due) |

pub mod attempt;
pub mod checkpointer;
pub mod config;
pub mod reaper;
mod triage;
pub mod worker;

use std::sync::Arc;

use paybus_bonuses::BonusJobCreated;
use paybus_bus::{Batched, Context, Envelope, Handler, HandlerError, Outbox, Outcome, Services};
use paybus_config::setting::SettingGroup;
use paybus_maintenance::{Job, auditor::AuditorConfig};
use paybus_retry::{Clock, RetryPolicy, RowState};
use paybus_runtime::function::{BuildError, Function};

pub use attempt::{Attempted, MessageResult};
pub use checkpointer::MemberCanCheckpointer;
pub use config::GrantConfig;
pub use reaper::BonusReaper;
pub use worker::{BonusWorker, WorkerReport};

/// The handler: the immediate attempt of each new (or ops-retried) job.
#[derive(Debug, Clone)]
pub struct GrantBonus {
    policy: RetryPolicy,
    clock: Clock,
}

impl Default for GrantBonus {
    fn default() -> Self {
        Self {
            policy: paybus_bonuses::job::RETRY_POLICY,
            clock: Clock::Database,
        }
    }
}

impl GrantBonus {
    /// The same handler on another clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }
}

impl Handler for GrantBonus {
    type Message = BonusJobCreated;
    const FUNCTION: &'static str = "grant-bonus";

    async fn handle(
        &self,
        message: Envelope<BonusJobCreated>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        let id = message.data.job_id;
        let mut results =
            attempt::attempt_messages(ctx.db.pool(), &[id], &self.policy, &self.clock).await;
        let result = results.pop().unwrap_or_else(|| {
            Err(paybus_bonuses::BonusError::Inconsistent(format!(
                "no result for the message of bonus job {id}"
            )))
        });
        self.outcome(id, result, ctx.attempt)
    }

    /// A batch's due jobs share one grant transaction: a handful of statements for up to 16
    /// grants (four concurrent batches fill the default prefetch of 64, as confirm-withdrawal's).
    const MAX_BATCH: usize = 16;

    async fn handle_batch(
        &self,
        messages: Vec<Batched<BonusJobCreated>>,
        outbox: &Outbox,
    ) -> Vec<Result<Outcome, HandlerError>> {
        let ids: Vec<u64> = messages.iter().map(|m| m.message.data.job_id).collect();
        let results =
            attempt::attempt_messages(outbox.pool(), &ids, &self.policy, &self.clock).await;
        messages
            .iter()
            .zip(results)
            .map(|(batched, result)| {
                self.outcome(batched.message.data.job_id, result, batched.attempt)
            })
            .collect()
    }
}

impl GrantBonus {
    /// The outcome of one message of job `id`, delivered for the `delivery_attempt`-th time.
    fn outcome(
        &self,
        id: u64,
        result: Result<MessageResult, paybus_bonuses::BonusError>,
        delivery_attempt: u32,
    ) -> Result<Outcome, HandlerError> {
        Ok(match result? {
            MessageResult::Attempted(Attempted::Granted { .. }) => Outcome::Done,
            MessageResult::Attempted(Attempted::Retry {
                after,
                failures,
                error,
            }) => Outcome::Retry {
                after,
                error: format!(
                    "bonus job {id}: failure {failures} of at most {} ({error}); the worker \
                     retries it when due",
                    self.policy.max_attempts()
                ),
            },
            MessageResult::Attempted(Attempted::GaveUp { retry_count, error }) => Outcome::Failed(
                format!("bonus job {id} FAILED after {retry_count} retries; last error: {error}"),
            ),
            MessageResult::Attempted(Attempted::ClaimLost) => Outcome::Skipped(format!(
                "bonus job {id}: another attempt claimed it before this grant committed"
            )),
            MessageResult::NotClaimed(state) => not_claimed(id, &state, delivery_attempt),
            MessageResult::Repeated => Outcome::Skipped(format!(
                "bonus job {id}: delivered twice in one batch; the first copy made the attempt"
            )),
            MessageResult::Missing => Outcome::Failed(format!("bonus job {id} does not exist")),
        })
    }
}

/// Why a message found nothing to attempt.
fn not_claimed(id: u64, state: &RowState, delivery_attempt: u32) -> Outcome {
    match state.status.as_str() {
        // A redelivery of the message that failed the job: its dead letter may not have been
        // confirmed, so it is failed again (the dead letter's id comes from the message id,
        // so one that did get through is recorded once). A first delivery is a late duplicate.
        "FAILED" if delivery_attempt > 1 => Outcome::Failed(format!(
            "bonus job {id} is FAILED after {} retries; last error: {}",
            state.attempts,
            state.last_error.as_deref().unwrap_or("none recorded")
        )),
        "PENDING" => match state.next_attempt_at {
            Some(at) if at > state.now => Outcome::Skipped(format!(
                "bonus job {id} is not due until {} (the worker retries it)",
                at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            )),
            _ => Outcome::Skipped(format!("bonus job {id} was claimed concurrently")),
        },
        "PROCESSING" => Outcome::Skipped(format!(
            "bonus job {id} is being granted by another attempt"
        )),
        status => Outcome::Skipped(format!("bonus job {id} is already {status}")),
    }
}

impl Function for GrantBonus {
    const SETTINGS: Option<SettingGroup> = Some(SettingGroup {
        title: "bonuses (W3): grant-bonus",
        read_by: "Read by grant-bonus and its sweeper jobs (`paybus_grant_bonus::config`).",
        settings: config::SETTINGS,
    });

    fn build(_: &Services) -> Result<Self, BuildError> {
        Ok(GrantBonus::default())
    }

    /// The worker (the retry path), the reaper and the checkpointer.
    fn jobs(services: &Services) -> Result<Vec<Arc<dyn Job>>, BuildError> {
        let config = GrantConfig::read(&services.settings.vars)?;
        Ok(vec![
            Arc::new(BonusWorker::new(
                services.pool.clone(),
                config.worker_interval,
                config.worker_batch,
            )),
            Arc::new(BonusReaper::new(
                services.pool.clone(),
                config.processing_timeout,
            )),
            Arc::new(MemberCanCheckpointer::new(
                services.pool.clone(),
                &AuditorConfig::read(&services.settings.vars)?,
            )),
        ])
    }

    const WORK_TABLES: &'static [&'static paybus_retry::WorkTable] =
        &[&paybus_bonuses::job::BONUS_JOBS];

    async fn triage(
        conn: &mut sqlx::MySqlConnection,
        message: BonusJobCreated,
    ) -> Result<paybus_ops::triage::Triage, paybus_ops::triage::TriageError> {
        triage::triage(conn, message).await
    }
}
