//! W3's invariants (docs/workflows/bonuses.md, seed 003): plain SQL, one statement per question
//! (the windowed balance check: two reads in one snapshot, [`recent_member_can_balances`]).
//!
//! | check | invariant |
//! | --- | --- |
//! | `member_can_balances` | each member's balance in each container equals the cans of its COMPLETE charges there (purchases and granted bonuses): no credit lost, none doubled; and (full form) each member's checkpoint equals the sums of its COMPLETE charges below it, every other charge below it listed as unpaid |
//! | `bonus_job_results` | every DONE job has its own EVENT charge (same member, container, cans and reason); no other job has a result; every EVENT charge is the result of exactly one job; every job comes from a COMPLETE purchase of its member |
//!
//! The `recent` forms run the same SQL over the members, charges and jobs the window touched
//! (changed since its start, through their `index_*_recent`, or linked to one that was): the
//! window narrows which members, not the sums. The windowed balance check starts from each
//! member's checkpoint (`crate::checkpoint`); the full form reads every charge and verifies the
//! checkpoints.

use std::{collections::HashMap, fmt};

use paybus_db as db;
use paybus_ops::audit::{Check, Finding, Scope, Window};
use serde::Serialize;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection};

use crate::checkpoint::{self, MEMBERS_PER_STATEMENT};

/// W3's checks, in the order `paybus audit` runs them.
pub const CHECKS: &[Check] = &[
    paybus_ops::audit_check!("member_can_balances", member_can_balances, recent: recent_member_can_balances),
    paybus_ops::audit_check!("bonus_job_results", bonus_job_results, recent: recent_bonus_job_results),
];

/// One broken W3 invariant; [`fmt::Display`] renders it as one line naming the ids involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "check", rename_all = "snake_case")]
pub enum Violation {
    /// A container's balance is not the sum of the member's COMPLETE charges there.
    MemberBalanceMismatch {
        member_id: u64,
        container: String,
        balance: i64,
        charged: i64,
    },
    /// A DONE job whose result charge is missing or is not its bonus.
    BonusChargeMissing {
        job_id: u64,
        result_charge_id: Option<u64>,
    },
    /// A job that is not DONE but names a result charge.
    UnexpectedResult {
        job_id: u64,
        status: String,
        result_charge_id: u64,
    },
    /// An EVENT charge that is the result of no job, or of several.
    EventChargeJobs { charge_id: u64, jobs: i64 },
    /// A job whose source is not a COMPLETE purchase of its member.
    JobWithoutCompletedPurchase { job_id: u64, source_charge_id: u64 },
    /// A member's checkpoint that is not the sums of its unlisted charges up to
    /// `through_charge_id`, or below which a charge is neither COMPLETE nor listed as unpaid: the windowed balance check, which trusts it, is
    /// wrong for this member until it is fixed (delete the checkpoint: the checkpointer writes
    /// it again).
    CheckpointMismatch {
        member_id: u64,
        through_charge_id: u64,
        /// pg, aos, ios.
        checkpoint: [i64; 3],
        charged: [i64; 3],
        not_complete: i64,
    },
    /// A charge listed as unpaid in a member's checkpoint that is not that member's charge
    /// below the checkpoint: the windowed check would count it twice, or for someone else.
    CheckpointListingMisplaced { member_id: u64, charge_id: u64 },
}

impl Finding for Violation {
    fn check(&self) -> &'static str {
        match self {
            Violation::MemberBalanceMismatch { .. } => "member_balance_mismatch",
            Violation::BonusChargeMissing { .. } => "bonus_charge_missing",
            Violation::UnexpectedResult { .. } => "unexpected_bonus_result",
            Violation::EventChargeJobs { .. } => "event_charge_jobs",
            Violation::JobWithoutCompletedPurchase { .. } => "job_without_completed_purchase",
            Violation::CheckpointMismatch { .. } => "member_checkpoint_mismatch",
            Violation::CheckpointListingMisplaced { .. } => "member_checkpoint_listing_misplaced",
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.check())?;
        match self {
            Violation::MemberBalanceMismatch {
                member_id,
                container,
                balance,
                charged,
            } => write!(
                f,
                "member {member_id} holds {balance} {container} cans, but its COMPLETE charges \
                 there add up to {charged}"
            ),
            Violation::BonusChargeMissing {
                job_id,
                result_charge_id: Some(charge_id),
            } => write!(
                f,
                "bonus job {job_id} is DONE but charge {charge_id} is not its EVENT charge \
                 (member, container, cans or reason differ)"
            ),
            Violation::BonusChargeMissing { job_id, .. } => {
                write!(f, "bonus job {job_id} is DONE without its EVENT charge")
            }
            Violation::UnexpectedResult {
                job_id,
                status,
                result_charge_id,
            } => write!(
                f,
                "bonus job {job_id} is {status} but names result charge {result_charge_id}"
            ),
            Violation::EventChargeJobs { charge_id, jobs } => write!(
                f,
                "EVENT charge {charge_id} is the result of {jobs} bonus jobs, not exactly one"
            ),
            Violation::JobWithoutCompletedPurchase {
                job_id,
                source_charge_id,
            } => write!(
                f,
                "bonus job {job_id} is owed for charge {source_charge_id}, which is not a \
                 COMPLETE purchase of its member"
            ),
            Violation::CheckpointMismatch {
                member_id,
                through_charge_id,
                checkpoint: [pg, aos, ios],
                charged: [pg_charged, aos_charged, ios_charged],
                not_complete,
            } => write!(
                f,
                "member {member_id}'s checkpoint through charge {through_charge_id} holds \
                 {pg}/{aos}/{ios} pg/aos/ios cans, but its unlisted COMPLETE charges up to \
                 there add up to {pg_charged}/{aos_charged}/{ios_charged}, and {not_complete} \
                 of them are neither COMPLETE nor listed as unpaid"
            ),
            Violation::CheckpointListingMisplaced {
                member_id,
                charge_id,
            } => write!(
                f,
                "charge {charge_id} is listed as unpaid in member {member_id}'s checkpoint, \
                 but it is not that member's charge below the checkpoint"
            ),
        }
    }
}

/// The members a window touched: changed since its start, or with a charge changed since.
const TOUCHED_MEMBERS: &str = " JOIN ( \
        SELECT id FROM members FORCE INDEX (index_members_recent) WHERE updated_at >= ? \
        UNION SELECT member_id FROM charges FORCE INDEX (index_charges_recent) \
              WHERE updated_at >= ?) touched \
     ON touched.id = m.id";

/// The bonus jobs a window touched: changed since its start, or whose source or result charge
/// changed since.
const TOUCHED_JOBS: &str = " JOIN ( \
        SELECT id FROM charge_event_job FORCE INDEX (index_charge_event_job_recent) \
              WHERE updated_at >= ? \
        UNION SELECT tj.id FROM charges tc FORCE INDEX (index_charges_recent) \
              JOIN charge_event_job tj ON tj.result_charge_id = tc.id \
              WHERE tc.updated_at >= ? \
        UNION SELECT tj.id FROM charges tc FORCE INDEX (index_charges_recent) \
              JOIN charge_event_job tj ON tj.source_charge_id = tc.id \
              WHERE tc.updated_at >= ?) touched \
     ON touched.id = j.id";

/// The charges a window touched: changed since its start, or the result of a job changed
/// since.
const TOUCHED_CHARGES: &str = " JOIN ( \
        SELECT id FROM charges FORCE INDEX (index_charges_recent) WHERE updated_at >= ? \
        UNION SELECT result_charge_id \
              FROM charge_event_job FORCE INDEX (index_charge_event_job_recent) \
              WHERE updated_at >= ? AND result_charge_id IS NOT NULL) touched \
     ON touched.id = c.id";

/// Every member's three balances against its COMPLETE charges, and every checkpoint against
/// the charges below it.
pub async fn member_can_balances(
    conn: &mut MySqlConnection,
) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(u64, i64, i64, i64, i64, i64, i64)> = Scope::All
        .fetch(&mut *conn, BALANCES_FROM_EVERY_CHARGE, TOUCHED_MEMBERS)
        .await?;
    let mut violations: Vec<Violation> = rows
        .into_iter()
        .flat_map(
            |(member_id, pg, aos, ios, pg_charged, aos_charged, ios_charged)| {
                mismatches(
                    member_id,
                    [pg, aos, ios],
                    [pg_charged, aos_charged, ios_charged],
                )
            },
        )
        .collect();
    violations.extend(broken_checkpoints(conn).await?);
    Ok(violations)
}

/// [`member_can_balances`] for the members `window` touched, from their checkpoints: each
/// member's balances and checkpoint first (`BALANCES_AND_CHECKPOINTS`), then the COMPLETE
/// charges above each checkpoint (`CHARGES_ABOVE_CHECKPOINT`, `MEMBERS_PER_STATEMENT`
/// members to a statement), added up here.
///
/// Two reads, so they must see one snapshot, or a completion committed between them would
/// look like a lost credit: in the caller's transaction when there is one (the auditor's
/// pass, a consistent snapshot: [`paybus_db::SNAPSHOT_BEGIN`]), else in one of its
/// own.
///
/// Why two reads and not one statement with a subquery per container bounded by the member's
/// checkpoint: that bound would come from the joined checkpoint row, so it would be no range
/// on any index, and MariaDB walks every index entry of the member and tests it, the member's
/// whole history on every pass (~115 µs a member with 200 charges). Read as constants, the
/// bounds are ranges on `index_charges_above_checkpoint`, and only the charges above them are
/// read.
pub async fn recent_member_can_balances(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    if conn.is_in_transaction() {
        return balances_from_checkpoints(conn, window).await;
    }
    let mut snapshot = conn.begin_with(db::SNAPSHOT_BEGIN).await?;
    let found = balances_from_checkpoints(&mut snapshot, window).await;
    snapshot.rollback().await?;
    found
}

/// A member's balances against the sums of all its COMPLETE charges (the full form).
const BALANCES_FROM_EVERY_CHARGE: &str = "SELECT m.id, CAST(m.pg_can AS SIGNED), \
        CAST(m.aos_can AS SIGNED), CAST(m.ios_can AS SIGNED), \
        CAST(COALESCE(SUM(CASE WHEN c.container = 'pg' THEN c.cans END), 0) AS SIGNED) \
            AS pg_charged, \
        CAST(COALESCE(SUM(CASE WHEN c.container = 'aos' THEN c.cans END), 0) AS SIGNED) \
            AS aos_charged, \
        CAST(COALESCE(SUM(CASE WHEN c.container = 'ios' THEN c.cans END), 0) AS SIGNED) \
            AS ios_charged \
     FROM members m {recent} \
     LEFT JOIN charges c ON c.member_id = m.id AND c.payment_status = 'COMPLETE' \
     GROUP BY m.id, m.pg_can, m.aos_can, m.ios_can \
     HAVING m.pg_can <> pg_charged OR m.aos_can <> aos_charged OR m.ios_can <> ios_charged \
     ORDER BY m.id";

/// Each touched member's balances, where its checkpoint ends (0: none), and what is charged
/// up to there: the checkpoint's sums plus its listed unpaid charges paid since.
const BALANCES_AND_CHECKPOINTS: &str = "SELECT m.id AS member_id, \
        CAST(m.pg_can AS SIGNED) AS pg, CAST(m.aos_can AS SIGNED) AS aos, \
        CAST(m.ios_can AS SIGNED) AS ios, \
        CAST(COALESCE(s.through_charge_id, 0) AS UNSIGNED) AS through_charge_id, \
        CAST(COALESCE(s.pg_cans, 0) + COALESCE((SELECT SUM(c.cans) \
            FROM member_can_checkpoint_unpaid u JOIN charges c ON c.id = u.charge_id \
            WHERE u.member_id = m.id AND c.payment_status = 'COMPLETE' \
              AND c.container = 'pg'), 0) AS SIGNED) AS pg_below, \
        CAST(COALESCE(s.aos_cans, 0) + COALESCE((SELECT SUM(c.cans) \
            FROM member_can_checkpoint_unpaid u JOIN charges c ON c.id = u.charge_id \
            WHERE u.member_id = m.id AND c.payment_status = 'COMPLETE' \
              AND c.container = 'aos'), 0) AS SIGNED) AS aos_below, \
        CAST(COALESCE(s.ios_cans, 0) + COALESCE((SELECT SUM(c.cans) \
            FROM member_can_checkpoint_unpaid u JOIN charges c ON c.id = u.charge_id \
            WHERE u.member_id = m.id AND c.payment_status = 'COMPLETE' \
              AND c.container = 'ios'), 0) AS SIGNED) AS ios_below \
     FROM members m {recent} \
     LEFT JOIN member_can_checkpoints s ON s.member_id = m.id \
     ORDER BY m.id";

/// A touched member as [`BALANCES_AND_CHECKPOINTS`] reads it.
#[derive(sqlx::FromRow)]
struct MemberBelow {
    member_id: u64,
    pg: i64,
    aos: i64,
    ios: i64,
    through_charge_id: u64,
    pg_below: i64,
    aos_below: i64,
    ios_below: i64,
}

/// One member's COMPLETE charges above its checkpoint, per container (binds: the member twice,
/// where its checkpoint ends). An aggregate without `GROUP BY`: one row, zeros for none.
const CHARGES_ABOVE_CHECKPOINT: &str = "(SELECT CAST(? AS UNSIGNED), \
        CAST(COALESCE(SUM(CASE WHEN container = 'pg' THEN cans END), 0) AS SIGNED), \
        CAST(COALESCE(SUM(CASE WHEN container = 'aos' THEN cans END), 0) AS SIGNED), \
        CAST(COALESCE(SUM(CASE WHEN container = 'ios' THEN cans END), 0) AS SIGNED) \
     FROM charges FORCE INDEX (index_charges_above_checkpoint) \
     WHERE member_id = ? AND id > ? AND payment_status = 'COMPLETE')";

/// [`recent_member_can_balances`]'s reads, in the caller's snapshot.
async fn balances_from_checkpoints(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    let members: Vec<MemberBelow> = Scope::Recent(window)
        .fetch(&mut *conn, BALANCES_AND_CHECKPOINTS, TOUCHED_MEMBERS)
        .await?;
    let sql = checkpoint::per_member_statement(CHARGES_ABOVE_CHECKPOINT);
    let mut violations = Vec::new();
    for batch in members.chunks(MEMBERS_PER_STATEMENT) {
        let pairs = batch
            .iter()
            .map(|member| (member.member_id, member.through_charge_id));
        let above: HashMap<u64, [i64; 3]> = checkpoint::padded(pairs)
            .fold(
                sqlx::query_as(AssertSqlSafe(sql.as_str())),
                |query, (member_id, through)| query.bind(member_id).bind(member_id).bind(through),
            )
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .map(|(member_id, pg, aos, ios): (u64, i64, i64, i64)| (member_id, [pg, aos, ios]))
            .collect();
        for member in batch {
            let [pg_above, aos_above, ios_above] =
                above.get(&member.member_id).copied().unwrap_or_default();
            violations.extend(mismatches(
                member.member_id,
                [member.pg, member.aos, member.ios],
                [
                    member.pg_below + pg_above,
                    member.aos_below + aos_above,
                    member.ios_below + ios_above,
                ],
            ));
        }
    }
    Ok(violations)
}

/// A violation for each container whose balance is not what is charged there (pg, aos, ios).
fn mismatches(
    member_id: u64,
    balances: [i64; 3],
    charged: [i64; 3],
) -> impl Iterator<Item = Violation> {
    ["pg", "aos", "ios"]
        .into_iter()
        .zip(balances.into_iter().zip(charged))
        .filter(|(_, (balance, charged))| balance != charged)
        .map(
            move |(container, (balance, charged))| Violation::MemberBalanceMismatch {
                member_id,
                container: container.to_owned(),
                balance,
                charged,
            },
        )
}

/// A checkpoint that [`broken_checkpoints`] found wrong, with what its charges add up to.
#[derive(sqlx::FromRow)]
struct CheckpointRow {
    member_id: u64,
    through_charge_id: u64,
    pg_cans: i64,
    aos_cans: i64,
    ios_cans: i64,
    pg_charged: i64,
    aos_charged: i64,
    ios_charged: i64,
    not_complete: i64,
}

/// Every checkpoint against the charges below it: what the windowed form trusts, read whole.
async fn broken_checkpoints(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<CheckpointRow> = sqlx::query_as(
        "SELECT s.member_id, s.through_charge_id, s.pg_cans, s.aos_cans, s.ios_cans, \
            CAST(COALESCE(SUM(CASE WHEN c.payment_status = 'COMPLETE' AND u.charge_id IS NULL \
                                   AND c.container = 'pg' THEN c.cans END), 0) AS SIGNED) \
                AS pg_charged, \
            CAST(COALESCE(SUM(CASE WHEN c.payment_status = 'COMPLETE' AND u.charge_id IS NULL \
                                   AND c.container = 'aos' THEN c.cans END), 0) AS SIGNED) \
                AS aos_charged, \
            CAST(COALESCE(SUM(CASE WHEN c.payment_status = 'COMPLETE' AND u.charge_id IS NULL \
                                   AND c.container = 'ios' THEN c.cans END), 0) AS SIGNED) \
                AS ios_charged, \
            CAST(COALESCE(SUM(c.payment_status <> 'COMPLETE' AND u.charge_id IS NULL), 0) \
                 AS SIGNED) AS not_complete \
         FROM member_can_checkpoints s \
         LEFT JOIN charges c ON c.member_id = s.member_id AND c.id <= s.through_charge_id \
         LEFT JOIN member_can_checkpoint_unpaid u \
                ON u.member_id = s.member_id AND u.charge_id = c.id \
         GROUP BY s.member_id, s.through_charge_id, s.pg_cans, s.aos_cans, s.ios_cans \
         HAVING s.pg_cans <> pg_charged OR s.aos_cans <> aos_charged \
             OR s.ios_cans <> ios_charged OR not_complete > 0 \
         ORDER BY s.member_id",
    )
    .fetch_all(&mut *conn)
    .await?;
    let misplaced: Vec<(u64, u64)> = sqlx::query_as(
        "SELECT u.member_id, u.charge_id FROM member_can_checkpoint_unpaid u \
         LEFT JOIN member_can_checkpoints s ON s.member_id = u.member_id \
         LEFT JOIN charges c ON c.id = u.charge_id \
         WHERE s.member_id IS NULL OR c.id IS NULL OR c.member_id <> u.member_id \
            OR u.charge_id > s.through_charge_id \
         ORDER BY u.member_id, u.charge_id",
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(misplaced
        .into_iter()
        .map(
            |(member_id, charge_id)| Violation::CheckpointListingMisplaced {
                member_id,
                charge_id,
            },
        )
        .chain(rows.into_iter().map(|row| Violation::CheckpointMismatch {
            member_id: row.member_id,
            through_charge_id: row.through_charge_id,
            checkpoint: [row.pg_cans, row.aos_cans, row.ios_cans],
            charged: [row.pg_charged, row.aos_charged, row.ios_charged],
            not_complete: row.not_complete,
        }))
        .collect())
}

/// Bonus jobs and their EVENT charges, both directions, and their source purchases.
pub async fn bonus_job_results(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    bonus_job_results_in(conn, Scope::All).await
}

/// [`bonus_job_results`] for the jobs and charges `window` touched.
pub async fn recent_bonus_job_results(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    bonus_job_results_in(conn, Scope::Recent(window)).await
}

/// A touched job with what [`bonus_job_results`] found wrong with it.
#[derive(sqlx::FromRow)]
struct JobFlags {
    id: u64,
    status: String,
    result_charge_id: Option<u64>,
    source_charge_id: u64,
    result_missing: Option<bool>,
    result_unexpected: Option<bool>,
    source_not_purchase: Option<bool>,
}

async fn bonus_job_results_in(
    conn: &mut MySqlConnection,
    scope: Scope,
) -> Result<Vec<Violation>, sqlx::Error> {
    // The job's three checks in one read of the jobs: the windowed form finds the jobs a
    // window touched with a three-way UNION, which would be most of a pass's time if each
    // check built it again (738 ms of a 3.6-s pass on a soak's database). Each flag is NULL where
    // a comparison met a NULL, which the checks count as no violation, as a WHERE clause would.
    let jobs: Vec<JobFlags> = scope
        .fetch(
            &mut *conn,
            "SELECT j.id, j.status, j.result_charge_id, j.source_charge_id, \
                    j.status = 'DONE' \
                      AND (c.id IS NULL OR c.status <> 'EVENT' OR c.member_id <> j.member_id \
                           OR c.container <> j.container OR c.cans <> j.additional_can \
                           OR c.method <> j.method_snapshot) AS result_missing, \
                    j.status <> 'DONE' AND j.result_charge_id IS NOT NULL AS result_unexpected, \
                    s.id IS NOT NULL \
                      AND (s.status <> 'CHARGE' OR s.payment_status <> 'COMPLETE' \
                           OR s.member_id <> j.member_id) AS source_not_purchase \
             FROM charge_event_job j {recent} \
             LEFT JOIN charges c ON c.id = j.result_charge_id \
             LEFT JOIN charges s ON s.id = j.source_charge_id \
             HAVING result_missing OR result_unexpected OR source_not_purchase \
             ORDER BY j.id",
            TOUCHED_JOBS,
        )
        .await?;
    let flagged = |flag: fn(&JobFlags) -> Option<bool>| {
        jobs.iter().filter(move |job| flag(job).unwrap_or(false))
    };
    let mut violations: Vec<Violation> = flagged(|job| job.result_missing)
        .map(|job| Violation::BonusChargeMissing {
            job_id: job.id,
            result_charge_id: job.result_charge_id,
        })
        .collect();
    violations.extend(flagged(|job| job.result_unexpected).filter_map(|job| {
        Some(Violation::UnexpectedResult {
            job_id: job.id,
            status: job.status.clone(),
            result_charge_id: job.result_charge_id?,
        })
    }));

    let event_charges: Vec<(u64, i64)> = scope
        .fetch(
            &mut *conn,
            "SELECT c.id, COUNT(j.id) FROM charges c {recent} \
             LEFT JOIN charge_event_job j ON j.result_charge_id = c.id \
             WHERE c.status = 'EVENT' GROUP BY c.id HAVING COUNT(j.id) <> 1 ORDER BY c.id",
            TOUCHED_CHARGES,
        )
        .await?;
    violations.extend(
        event_charges
            .into_iter()
            .map(|(charge_id, jobs)| Violation::EventChargeJobs { charge_id, jobs }),
    );

    violations.extend(flagged(|job| job.source_not_purchase).map(|job| {
        Violation::JobWithoutCompletedPurchase {
            job_id: job.id,
            source_charge_id: job.source_charge_id,
        }
    }));
    Ok(violations)
}
