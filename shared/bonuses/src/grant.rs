//! The grant: one transaction that pays a claimed bonus job exactly once (seed 003's
//! `applyChargeEvent`, now driven by the job row). Whoever attempts it (grant-bonus on the
//! message, the worker on a retry) holds the job's PROCESSING claim; the transaction is
//! committed only when the job's conditional UPDATE still finds that claim.

use paybus_platform::retry::{Claim, Clock};
use sqlx::{AssertSqlSafe, MySqlConnection};

use crate::{
    BonusError, charge,
    job::{BONUS_JOBS, BonusJob},
    member,
};

/// A job an attempt holds: the row as claimed, and the claim its settle is guarded by.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub job: BonusJob,
    pub claim: Claim,
}

/// What the grant transaction decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granted {
    /// Granted: the EVENT charge `charge_id` and the credit are in the transaction; commit it.
    Done { charge_id: u64 },
    /// The claim is no longer this attempt's (the reaper returned it, another attempt holds
    /// it): roll back, nothing may be kept.
    ClaimLost,
}

/// In the caller's transaction: the member's row lock, the EVENT charge (the job's snapshot:
/// cans, gateway, container, reason), the credit to the container's balance, and the job
/// PROCESSING -> DONE with `result_charge_id` and `processed_at`, conditional on the claim.
pub async fn grant_in(
    conn: &mut MySqlConnection,
    claimed: &ClaimedJob,
    clock: &Clock,
) -> Result<Granted, BonusError> {
    let job = &claimed.job;
    member::lock(conn, job.member_id).await?;
    let charge_id = charge::insert_bonus(
        conn,
        &charge::BonusCharge {
            member_id: job.member_id,
            cans: job.additional_can,
            payment_gateway: job.payment_gateway,
            container: job.container,
            method: &job.method_snapshot,
        },
    )
    .await?;
    member::credit(conn, job.member_id, job.container, job.additional_can).await?;
    let done = BONUS_JOBS.guarded_update(
        "status = 'DONE', result_charge_id = ?, processed_at = COALESCE(?, NOW(6)), \
         next_retry_at = NULL",
    );
    let matched = BONUS_JOBS
        .bind_guard(
            sqlx::query(AssertSqlSafe(done))
                .bind(charge_id)
                .bind(clock.sql_now()),
            &claimed.claim,
        )
        .execute(conn)
        .await?
        .rows_affected();
    Ok(if matched == 1 {
        Granted::Done { charge_id }
    } else {
        Granted::ClaimLost
    })
}
