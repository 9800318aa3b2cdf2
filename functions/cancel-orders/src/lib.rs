//! The cancel-orders function (docs/workflows/markets.md, seed 004): `market.cancel_tasks.created
//! {batch_id, task_ids}` → each task's order cancelled by a conditional UPDATE and the task
//! settled in the same transaction (`paybus_markets::cancel`: DONE, SKIPPED or FAILED per task).
//!
//! | the message | outcome |
//! | --- | --- |
//! | some task FAILED now, or a redelivery finds one FAILED, or a task id not of the batch | `Failed`: a dead letter naming those tasks (the others completed) |
//! | some task retried | `Retry` |
//! | some task DONE | `Done` |
//! | nothing to do | `Skipped` with the reasons |
//! | no task ids, or more than [`MAX_TASKS_PER_MESSAGE`] | `Failed` (malformed) |
//! | database unreachable or deadlock | error: requeued, the group rolled back |
//!
//! It offers [`CancelOrders`] and its jobs: the due sweep over `tasks` ([`due_tasks`]) and the
//! materialiser (the batches' tasks after the suspend request's first chunk, resumably).

pub mod config;
mod triage;

use std::{sync::Arc, time::Duration};

use paybus_bus::{Context, Envelope, Handler, HandlerError, Outcome, Services, metrics};
use paybus_config::setting::SettingGroup;
use paybus_maintenance::{DueSweep, DueSweepConfig, Job};
use paybus_markets::{
    CancelTasksCreated,
    materialise::{Materialiser, MaterialiserConfig},
    task::TASKS,
};
use paybus_retry::Clock;
use paybus_runtime::function::{BuildError, Function};

pub use config::CancelConfig;
pub use paybus_markets::cancel::{Attempts, TaskOutcome, cancel_tasks};

/// The most task ids one message may carry (the materialiser sends a small group).
pub const MAX_TASKS_PER_MESSAGE: usize = 1_000;

/// The handler.
#[derive(Clone)]
pub struct CancelOrders {
    attempts: Attempts,
}

impl CancelOrders {
    pub fn new(config: CancelConfig) -> Self {
        Self {
            attempts: Attempts {
                policy: config.retry,
                lease: config.lease,
                clock: Clock::Database,
            },
        }
    }

    /// The same handler on another clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.attempts.clock = clock;
        self
    }
}

impl Handler for CancelOrders {
    type Message = CancelTasksCreated;
    const FUNCTION: &'static str = "cancel-orders";

    async fn handle(
        &self,
        message: Envelope<CancelTasksCreated>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        let batch_id = message.data.batch_id;
        let mut ids = message.data.task_ids;
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() || ids.len() > MAX_TASKS_PER_MESSAGE {
            return Ok(Outcome::Failed(format!(
                "a message for batch {batch_id} must name 1 to {MAX_TASKS_PER_MESSAGE} tasks, \
                 not {}",
                ids.len()
            )));
        }
        match cancel_tasks(ctx.db.pool(), batch_id, &ids, &self.attempts).await {
            Ok(outcomes) => Ok(outcome(batch_id, &outcomes, ctx.attempt)),
            Err(error) => HandlerError::from(error).into_outcome(),
        }
    }
}

/// The message's outcome from its tasks'.
fn outcome(batch_id: u64, outcomes: &[(u64, TaskOutcome)], delivery_attempt: u32) -> Outcome {
    let (mut done, mut skipped, mut retries, mut failed) = (0, Vec::new(), Vec::new(), Vec::new());
    for (id, task) in outcomes {
        metrics::record(CancelOrders::FUNCTION, task_label(task), Duration::ZERO);
        match task {
            TaskOutcome::Done => done += 1,
            TaskOutcome::Skipped(reason) => skipped.push(reason.clone()),
            // A redelivery of a message that failed the task: its dead letter may not have been
            // confirmed, so it is failed again (a dead letter that did get through is recorded
            // once: its id derives from the message id). A first delivery is a late duplicate.
            TaskOutcome::NotClaimed(state) if state.status == "FAILED" && delivery_attempt > 1 => {
                failed.push(format!(
                    "task {id} is FAILED after {} attempts; last error: {}",
                    state.attempts,
                    state.last_error.as_deref().unwrap_or("none recorded")
                ));
            }
            TaskOutcome::NotClaimed(state) => {
                skipped.push(format!(
                    "task {id} is {} (attempt {})",
                    not_due(state),
                    state.attempts
                ));
            }
            TaskOutcome::Retry { after, error } => retries.push((*after, error.clone())),
            TaskOutcome::Failed(error) | TaskOutcome::Unknown(error) => failed.push(error.clone()),
        }
    }
    if !failed.is_empty() {
        return Outcome::Failed(format!(
            "batch {batch_id}: {} of {} tasks failed: {}",
            failed.len(),
            outcomes.len(),
            failed.join("; ")
        ));
    }
    if let Some(after) = retries.iter().map(|(after, _)| *after).min() {
        let errors: Vec<String> = retries.into_iter().map(|(_, error)| error).collect();
        return Outcome::Retry {
            after,
            error: errors.join("; "),
        };
    }
    if done > 0 {
        return Outcome::Done;
    }
    let more = skipped.len().saturating_sub(3);
    let mut reason = skipped.into_iter().take(3).collect::<Vec<_>>().join("; ");
    if more > 0 {
        reason.push_str(&format!("; and {more} more"));
    }
    Outcome::Skipped(format!("batch {batch_id}: nothing to cancel: {reason}"))
}

fn not_due(state: &paybus_retry::RowState) -> String {
    match state.status.as_str() {
        "PENDING" if !state.is_due() => "PENDING, not due (in flight or backing off)".to_owned(),
        "PENDING" => "PENDING, claimed concurrently".to_owned(),
        status => format!("already {status}"),
    }
}

fn task_label(task: &TaskOutcome) -> &'static str {
    match task {
        TaskOutcome::Done => "task_done",
        TaskOutcome::Skipped(_) => "task_skipped",
        TaskOutcome::NotClaimed(_) => "task_not_claimed",
        TaskOutcome::Retry { .. } => "task_retry",
        TaskOutcome::Failed(_) | TaskOutcome::Unknown(_) => "task_failed",
    }
}

impl Function for CancelOrders {
    const SETTINGS: Option<SettingGroup> = Some(SettingGroup {
        title: "markets (W4): cancel-orders",
        read_by: "Read by cancel-orders (`paybus_cancel_orders::config`).",
        settings: config::SETTINGS,
    });

    fn build(services: &Services) -> Result<Self, BuildError> {
        Ok(CancelOrders::new(CancelConfig::read(
            &services.settings.vars,
        )?))
    }

    /// The due sweep over `tasks` and the batches' materialiser.
    fn jobs(services: &Services) -> Result<Vec<Arc<dyn Job>>, BuildError> {
        Ok(vec![
            Arc::new(due_tasks(services, DueSweepConfig::default())),
            Arc::new(Materialiser::new(
                services.outbox.clone(),
                MaterialiserConfig::default(),
            )),
        ])
    }

    const WORK_TABLES: &'static [&'static paybus_retry::WorkTable] = &[&TASKS];

    async fn triage(
        conn: &mut sqlx::MySqlConnection,
        message: CancelTasksCreated,
    ) -> Result<paybus_ops::triage::Triage, paybus_ops::triage::TriageError> {
        triage::triage(conn, message).await
    }
}

/// The due sweep over `tasks`: PENDING tasks whose retry is due (or whose message was lost:
/// re-published after `stale_after`), grouped by batch as the materialiser sends them.
pub fn due_tasks(services: &Services, config: DueSweepConfig) -> DueSweep<CancelTasksCreated> {
    DueSweep::grouped(
        "due-cancel-tasks",
        &TASKS,
        "batch_id",
        paybus_markets::materialise::DEFAULT_TASKS_PER_MESSAGE,
        |batch_id, task_ids| CancelTasksCreated { batch_id, task_ids },
        services.outbox.clone(),
        config,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_done_when_any_task_is_and_nothing_failed() {
        let outcomes = [
            (1, TaskOutcome::Done),
            (2, TaskOutcome::Skipped("order 7 is already FILLED".into())),
        ];
        assert_eq!(outcome(9, &outcomes, 1), Outcome::Done);
    }

    #[test]
    fn one_failed_task_makes_the_message_a_dead_letter_naming_it() {
        let outcomes = [
            (1, TaskOutcome::Done),
            (
                2,
                TaskOutcome::Failed("task 2: gave up after 5 attempts".into()),
            ),
            (
                3,
                TaskOutcome::Retry {
                    after: Duration::from_secs(1),
                    error: "x".into(),
                },
            ),
        ];
        let Outcome::Failed(reason) = outcome(9, &outcomes, 1) else {
            panic!("not failed");
        };
        assert!(
            reason.contains("1 of 3 tasks failed: task 2: gave up"),
            "{reason}"
        );
    }

    #[test]
    fn retries_wait_for_the_shortest_backoff() {
        let outcomes = [
            (
                1,
                TaskOutcome::Retry {
                    after: Duration::from_secs(5),
                    error: "a".into(),
                },
            ),
            (
                2,
                TaskOutcome::Retry {
                    after: Duration::from_secs(1),
                    error: "b".into(),
                },
            ),
        ];
        assert_eq!(
            outcome(9, &outcomes, 1),
            Outcome::Retry {
                after: Duration::from_secs(1),
                error: "a; b".into()
            }
        );
    }
}
