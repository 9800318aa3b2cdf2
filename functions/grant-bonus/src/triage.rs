//! What a replay of a dead-lettered `charge.bonus_job.created` would do.
//!
//! | the job now | verdict |
//! | --- | --- |
//! | DONE (its EVENT charge exists) | already applied |
//! | PENDING | safe: a replay claims and grants it once |
//! | FAILED | needs a human: the function skips a FAILED job; retry it (`paybus jobs retry`), which sends its own message |
//! | PROCESSING | needs a human: an attempt holds it (or died: the reaper returns it to PENDING) |
//! | absent | needs a human |
//!
//! The exposure is the member's bonus cans (`CAN`, no partner).

use paybus_bonuses::{
    BonusJobCreated,
    job::{self, JobStatus},
};
use paybus_money::Amount;
use paybus_ops::triage::{Exposure, Triage, TriageError};
use sqlx::MySqlConnection;

pub(crate) async fn triage(
    conn: &mut MySqlConnection,
    message: BonusJobCreated,
) -> Result<Triage, TriageError> {
    let id = message.job_id;
    let Some(found) = job::find(conn, id).await? else {
        return Ok(
            Triage::needs_human(format!("bonus job {id} does not exist")).referring_to::<()>(
                "charge_event_job",
                id,
                None,
                None,
            ),
        );
    };
    let triage = match found.status {
        JobStatus::Done => Triage::already_applied(format!(
            "bonus job {id} is DONE (charge {})",
            found.result_charge_id.unwrap_or_default()
        )),
        JobStatus::Pending => Triage::safe(format!(
            "bonus job {id} is PENDING: a replay grants {} cans once",
            found.additional_can
        )),
        JobStatus::Failed => Triage::needs_human(format!(
            "bonus job {id} is FAILED after {} retries: retry the job (`paybus jobs retry \
             {id}`), not its dead letter",
            found.retry_count
        )),
        JobStatus::Processing => Triage::needs_human(format!(
            "bonus job {id} is PROCESSING: an attempt holds it (the reaper returns it if that \
             attempt died)"
        )),
    };
    Ok(triage
        .exposing(Exposure {
            entity: "charge_event_job",
            id,
            partner_id: None,
            currency: "CAN".to_owned(),
            amount: Amount::whole(i64::from(found.additional_can)),
        })
        .referring_to(
            "charge_event_job",
            id,
            Some(found.status.as_str().to_owned()),
            Some(&found),
        ))
}
