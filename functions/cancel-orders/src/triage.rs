//! What a replay of a dead-lettered `market.cancel_tasks.created` would do (over all the
//! tasks it names).
//!
//! | the tasks now | verdict |
//! | --- | --- |
//! | every one DONE or SKIPPED | already applied |
//! | some PENDING, none FAILED, all of the batch | safe: a replay cancels the pending ones once (the settled ones are skipped) |
//! | some FAILED, absent or of another batch; no task or too many | needs a human |
//!
//! Orders hold no money here: no exposure.

use paybus_markets::{
    CancelTasksCreated,
    task::{self, TaskState},
};
use paybus_ops::triage::{Triage, TriageError};
use sqlx::MySqlConnection;

use crate::MAX_TASKS_PER_MESSAGE;

pub(crate) async fn triage(
    conn: &mut MySqlConnection,
    message: CancelTasksCreated,
) -> Result<Triage, TriageError> {
    let batch_id = message.batch_id;
    let mut ids = message.task_ids;
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() || ids.len() > MAX_TASKS_PER_MESSAGE {
        return Ok(Triage::needs_human(format!(
            "the message for batch {batch_id} names {} tasks (1 to {MAX_TASKS_PER_MESSAGE} \
             expected): the function would refuse it",
            ids.len()
        )));
    }
    let tasks = task::find_all(conn, &ids).await?;
    let state = |wanted: TaskState| {
        tasks
            .iter()
            .filter(|t| t.state == <&str>::from(wanted))
            .count()
    };
    let foreign: Vec<u64> = tasks
        .iter()
        .filter(|t| t.batch_id != batch_id)
        .map(|t| t.id)
        .collect();
    let (pending, failed) = (state(TaskState::Pending), state(TaskState::Failed));
    let settled = state(TaskState::Done) + state(TaskState::Skipped);
    let triage = if tasks.len() < ids.len() {
        Triage::needs_human(format!(
            "batch {batch_id}: {} of the {} tasks named do not exist",
            ids.len() - tasks.len(),
            ids.len()
        ))
    } else if !foreign.is_empty() {
        Triage::needs_human(format!(
            "batch {batch_id}: tasks {foreign:?} belong to another batch"
        ))
    } else if failed > 0 {
        Triage::needs_human(format!(
            "batch {batch_id}: {failed} of {} tasks are FAILED (the function refuses them)",
            ids.len()
        ))
    } else if pending > 0 {
        Triage::safe(format!(
            "batch {batch_id}: {pending} of {} tasks are PENDING: a replay cancels them once",
            ids.len()
        ))
    } else if settled == ids.len() {
        Triage::already_applied(format!(
            "batch {batch_id}: all {} tasks are DONE or SKIPPED",
            ids.len()
        ))
    } else {
        Triage::needs_human(format!("batch {batch_id}: tasks in an unknown state"))
    };
    Ok(tasks.iter().fold(triage, |triage, task| {
        triage.referring_to("task", task.id, Some(task.state.clone()), Some(task))
    }))
}
