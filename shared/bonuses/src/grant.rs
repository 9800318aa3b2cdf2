//! The grant: one transaction that pays a bonus job exactly once (seed 003's
//! `applyChargeEvent`, driven by the job row), committed only when the job's conditional UPDATE
//! to DONE still finds it this attempt's. Two attempts, two guards:
//!
//! - **the message's** ([`grant_due_in`]: grant-bonus's immediate attempt, ops' retries): no
//!   claim is committed first; the transaction locks the jobs still PENDING and due (the row
//!   locks are the claim), credits their members, writes the EVENT charges and moves the jobs to
//!   DONE. A crash before the commit leaves them PENDING and due, nothing to reap.
//! - **the worker's** ([`grant_in`]): its batch claim committed the jobs PROCESSING (`FOR
//!   UPDATE SKIP LOCKED`); the grant locks its job under that claim, and DONE is guarded by it.
//!
//! Lock order in both: the job rows, then the members (each in id order); a completion locks its
//! charge, then the member, and no existing job row, so no two wait on each other in a cycle.

use std::collections::BTreeMap;

use paybus_retry::{Claim, Clock, Settled};
use sqlx::{AssertSqlSafe, MySqlConnection};

use crate::{
    BonusError, charge,
    job::{BONUS_JOBS, BonusJob},
    member::{self, Credit},
};

/// A job an attempt holds: the row as claimed, and the claim its settle is guarded by.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub job: BonusJob,
    pub claim: Claim,
}

/// What the worker's grant transaction decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granted {
    /// Granted: the EVENT charge `charge_id` and the credit are in the transaction; commit it.
    Done { charge_id: u64 },
    /// The claim is no longer this attempt's (the reaper returned it, ops changed the row):
    /// nothing was written.
    ClaimLost,
}

/// The assignments of a job the worker granted (binds: the result charge, then the clock).
const DONE: &str = "status = 'DONE', result_charge_id = ?, processed_at = COALESCE(?, NOW(6)), \
                    next_retry_at = NULL";

/// The worker's grant of a job it claimed, in the caller's transaction: the credit (the
/// member's lock), the EVENT charge (the job's snapshot: cans, gateway, container, reason) and
/// PROCESSING -> DONE with `result_charge_id` and `processed_at`, conditional on the claim.
pub async fn grant_in(
    conn: &mut MySqlConnection,
    claimed: &ClaimedJob,
    clock: &Clock,
) -> Result<Granted, BonusError> {
    if BONUS_JOBS.lock_claimed(conn, &claimed.claim).await? == Settled::ClaimLost {
        return Ok(Granted::ClaimLost);
    }
    let job = &claimed.job;
    member::credit(conn, job.member_id, job.container, job.additional_can).await?;
    let charge_id = insert_charge(conn, job).await?;
    let matched = BONUS_JOBS
        .bind_guard(
            sqlx::query(AssertSqlSafe(BONUS_JOBS.guarded_update(DONE)))
                .bind(charge_id)
                .bind(clock.sql_now()),
            &claimed.claim,
        )
        .execute(conn)
        .await?
        .rows_affected();
    if matched != 1 {
        return Err(BonusError::Inconsistent(format!(
            "bonus job {} was locked under its claim, yet its DONE matched {matched} rows",
            job.id
        )));
    }
    Ok(Granted::Done { charge_id })
}

/// The message path's grant of `jobs` (distinct, read PENDING and due just before), in the
/// caller's transaction: the jobs still due locked (in id order), their credits (one UPDATE
/// for several: the members' locks, in id order), one EVENT charge each, and each job
/// PENDING -> DONE. Returns the EVENT charge of each job granted; a job missing from it was
/// claimed by another attempt meanwhile and nothing was written for it. A single job's
/// missing member is `Vanished`, as in [`grant_in`]; in a batch, an error (roll back).
pub async fn grant_due_in(
    conn: &mut MySqlConnection,
    jobs: &[&BonusJob],
    clock: &Clock,
) -> Result<BTreeMap<u64, u64>, BonusError> {
    let ids: Vec<u64> = jobs.iter().map(|job| job.id).collect();
    let locked = BONUS_JOBS.lock_due(conn, &ids, clock).await?;
    let jobs: Vec<&BonusJob> = jobs
        .iter()
        .copied()
        .filter(|job| locked.contains(&job.id))
        .collect();
    if jobs.is_empty() {
        return Ok(BTreeMap::new());
    }
    if let [job] = jobs[..] {
        member::credit(conn, job.member_id, job.container, job.additional_can).await?;
    } else {
        let credits: Vec<Credit> = jobs
            .iter()
            .map(|job| Credit {
                member_id: job.member_id,
                container: job.container,
                cans: job.additional_can,
            })
            .collect();
        if !member::credit_all(conn, &credits).await? {
            return Err(BonusError::Inconsistent(format!(
                "a member of bonus jobs {locked:?} is missing"
            )));
        }
    }
    let granted = insert_charges(conn, &jobs).await?;
    let set = format!(
        "status = 'DONE', result_charge_id = CASE id {}END, \
         processed_at = COALESCE(?, NOW(6)), next_retry_at = NULL",
        "WHEN ? THEN ? ".repeat(granted.len())
    );
    let query = granted
        .iter()
        .fold(
            sqlx::query(AssertSqlSafe(BONUS_JOBS.due_update(&set, granted.len()))),
            |query, (job_id, charge_id)| query.bind(*job_id).bind(*charge_id),
        )
        .bind(clock.sql_now());
    let granted_ids: Vec<u64> = granted.keys().copied().collect();
    let matched = BONUS_JOBS
        .bind_due(query, &granted_ids, clock)
        .execute(conn)
        .await?
        .rows_affected();
    if matched != granted_ids.len() as u64 {
        return Err(BonusError::Inconsistent(format!(
            "bonus jobs {granted_ids:?} were locked while due, yet their DONE matched {matched}"
        )));
    }
    Ok(granted)
}

/// The EVENT charge of each of `jobs` (locked, their members' locks held, in id order), from
/// their snapshots; each job's charge id. One job: one INSERT. Several: one multi-row INSERT
/// and one read of the ids it gave, where an INSERT per job would be a round trip each (about
/// one statement per grant of the ten a grant costs end to end).
///
/// Reading the ids back does not assume they are consecutive (MySQL 8's default
/// `innodb_autoinc_lock_mode = 2` may interleave another statement's): an EVENT charge is only
/// ever inserted under its member's row lock, which this transaction holds for every member of
/// `jobs`, so the EVENT charges of those members from the first id on are exactly these rows,
/// and a member's rows come in the order they were inserted (ids grow within a statement).
async fn insert_charges(
    conn: &mut MySqlConnection,
    jobs: &[&BonusJob],
) -> Result<BTreeMap<u64, u64>, BonusError> {
    if let [job] = jobs {
        return Ok(BTreeMap::from([(job.id, insert_charge(conn, job).await?)]));
    }
    let first = charge::insert_bonuses(
        conn,
        &jobs.iter().map(|job| bonus_charge(job)).collect::<Vec<_>>(),
    )
    .await?;
    let mut members: Vec<u64> = jobs.iter().map(|job| job.member_id).collect();
    members.sort_unstable();
    members.dedup();
    let mut inserted = charge::event_charges_from(conn, first, &members).await?;
    if inserted.len() != jobs.len() {
        return Err(BonusError::Inconsistent(format!(
            "{} EVENT charges inserted for bonus jobs, {} found from id {first}",
            jobs.len(),
            inserted.len()
        )));
    }
    // Each job takes the first remaining charge of its member (both in insertion order).
    let mut granted = BTreeMap::new();
    for job in jobs {
        let Some(at) = inserted
            .iter()
            .position(|(_, member)| *member == job.member_id)
        else {
            return Err(BonusError::Inconsistent(format!(
                "no EVENT charge found for bonus job {} of member {}",
                job.id, job.member_id
            )));
        };
        let (charge_id, _) = inserted.remove(at);
        granted.insert(job.id, charge_id);
    }
    Ok(granted)
}

/// The EVENT charge a job grants, from its snapshot.
fn bonus_charge(job: &BonusJob) -> charge::BonusCharge<'_> {
    charge::BonusCharge {
        member_id: job.member_id,
        cans: job.additional_can,
        payment_gateway: job.payment_gateway,
        container: job.container,
        method: &job.method_snapshot,
    }
}

/// The job's EVENT charge, from its snapshot.
async fn insert_charge(conn: &mut MySqlConnection, job: &BonusJob) -> Result<u64, sqlx::Error> {
    charge::insert_bonus(conn, &bonus_charge(job)).await
}
