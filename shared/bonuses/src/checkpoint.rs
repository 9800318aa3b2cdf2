//! Member can checkpoints: the sums of a member's settled charges, so the continuous auditor's
//! `member_can_balances` reads a member's recent charges, not its whole history.
//!
//! The check compares each touched member's balances with the sums of its COMPLETE charges.
//! Read whole, that grew with every member's history: in the soak of 2026-12-05 (evening; 250
//! members buying all along) the auditor's passes went from 1.3 s to 2.3 s in 30 minutes, and
//! confirmations' p99 inside a pass was 149 ms against 24 ms outside (docs/benchmarks.md).
//!
//! A checkpoint (`member_can_checkpoints`) holds, per container, the sum of the member's
//! COMPLETE charges with `id <= through_charge_id`. It only ever covers a prefix of the
//! member's charges in which every charge is
//! - **settled**: stamped (`created_at`) more than `settled_after` ago. A charge of the member
//!   below the prefix's end that is not yet visible would be missed for ever. Ids are handed
//!   out in order, so such a charge got its id before the prefix's last one, whose statement
//!   began more than `settled_after` ago and waited at most `innodb_lock_wait_timeout` (50 s).
//!   With `settled_after` at twice the auditor's overlap (4 minutes by default), that charge's
//!   transaction would have been open for longer than the overlap after its stamp: the
//!   windowed reads already assume no transaction does (docs/operations.md);
//! - **COMPLETE, or listed as unpaid**: a COMPLETE charge never changes again (no path writes
//!   one), so neither does its part of the sums. A purchase still in REQUEST may be paid later
//!   or never (abandoned at the gateway), so it is listed in `member_can_checkpoint_unpaid`
//!   instead of summed: the windowed check adds a listed charge once it is COMPLETE, and the
//!   checkpointer folds a paid one into the sums, deleting its listing in the same
//!   transaction. An abandoned checkout costs its member one listed row, not a checkpoint
//!   stuck behind it.
//!
//! The checkpointer ([`advance`]) reads each touched member's next settled stretch and adds it
//! to the checkpoint, conditional on the checkpoint's `through_charge_id` still being the one
//! it read, and folds listed charges conditional on deleting their listing: two checkpointers
//! racing add a stretch, or a paid charge, once. The windowed check trusts the checkpoints;
//! the full audit verifies every checkpoint against the charges below it
//! (`audit::member_can_balances`).

use std::{collections::HashMap, time::Duration};

use paybus_platform::{db, retry::clock::micros};
use sqlx::{AssertSqlSafe, MySqlConnection, MySqlPool};

/// Members per read and per checkpointing transaction.
const CHUNK: usize = 500;

/// What one [`advance`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Advanced {
    /// Members touched within the lookback, whose checkpoints were considered.
    pub members: u64,
    /// Checkpoints created or moved forward.
    pub moved: u64,
    /// Charges added to the checkpoints (the listed unpaid ones included).
    pub charges: u64,
    /// Listed unpaid charges found paid and folded into their checkpoints.
    pub folded: u64,
}

/// A member's next settled stretch, as read.
#[derive(Debug)]
struct Stretch {
    member_id: u64,
    /// The checkpoint's end when read; 0: no checkpoint yet.
    checkpoint_through: u64,
    through: u64,
    charges: i64,
    /// The COMPLETE charges' cans per container.
    pg: i64,
    aos: i64,
    ios: i64,
    /// The stretch's charges still in REQUEST, listed instead of summed.
    unpaid: Vec<u64>,
}

/// A listed unpaid charge that has been paid since.
#[derive(Debug, sqlx::FromRow)]
struct Paid {
    member_id: u64,
    charge_id: u64,
    pg: i64,
    aos: i64,
    ios: i64,
}

/// Checkpoints the settled charges of the members touched within `touched_within` (their row
/// changed: every credit changes it), each stretch of charges stamped more than
/// `settled_after` ago (see the module docs for why that bound). A member left out (the
/// checkpointer stood still) keeps its older checkpoint: the check is then slower for it,
/// never wrong.
pub async fn advance(
    pool: &MySqlPool,
    touched_within: Duration,
    settled_after: Duration,
) -> Result<Advanced, sqlx::Error> {
    let touched: Vec<u64> = sqlx::query_scalar(
        "SELECT id FROM members FORCE INDEX (index_members_recent) \
         WHERE updated_at >= NOW(6) - INTERVAL ? MICROSECOND ORDER BY id",
    )
    .bind(micros(touched_within))
    .fetch_all(pool)
    .await?;
    let mut advanced = Advanced::default();
    for members in touched.chunks(CHUNK) {
        let ends = checkpoint_ends(pool, members).await?;
        let mut stretches = Vec::new();
        for member_id in members {
            let from = ends.get(member_id).copied().unwrap_or(0);
            stretches.extend(settled_stretch(pool, *member_id, from, settled_after).await?);
        }
        let mut tx = db::begin_read_committed(pool).await?;
        for stretch in &stretches {
            if extend(&mut tx, stretch).await? {
                advanced.moved += 1;
                advanced.charges += u64::try_from(stretch.charges).unwrap_or_default();
            }
        }
        tx.commit().await?;
        // Its own transaction, in member order as the one above: one transaction going over
        // the members twice could wait on another in a cycle.
        let paid = paid_since_listed(pool, members).await?;
        let mut tx = db::begin_read_committed(pool).await?;
        for charge in &paid {
            if fold(&mut tx, charge).await? {
                advanced.folded += 1;
            }
        }
        tx.commit().await?;
        advanced.members += members.len() as u64;
    }
    Ok(advanced)
}

/// Where each of `members`' checkpoints ends (members without one are left out).
async fn checkpoint_ends(
    pool: &MySqlPool,
    members: &[u64],
) -> Result<HashMap<u64, u64>, sqlx::Error> {
    let sql = format!(
        "SELECT member_id, through_charge_id FROM member_can_checkpoints \
         WHERE member_id IN ({})",
        db::placeholders(members.len())
    );
    let ends: Vec<(u64, u64)> = members
        .iter()
        .fold(sqlx::query_as(AssertSqlSafe(sql)), |query, member| {
            query.bind(*member)
        })
        .fetch_all(pool)
        .await?;
    Ok(ends.into_iter().collect())
}

/// The member's charges above `from` up to (not including) its first charge above `from` that
/// is not settled; `None` when there is none.
///
/// One statement per member, with its bounds as constants: on `index_charges_payment_count`
/// (member_id first, and the id last in every InnoDB index) MariaDB then tests `id > ?` on the
/// index entries and reads only the rows above it. Joined with the checkpoints instead, the
/// bound came from another table, and MariaDB read every charge of the member and filtered
/// after: what the check had cost, moved into the checkpointer. And a correlated `MIN` in a
/// derived table, re-executed as a prepared statement, returned a stretch past a recent charge
/// in about one run in two on MariaDB 10.11 (`tests/tests/bonuses_checkpoints.rs`).
async fn settled_stretch(
    pool: &MySqlPool,
    member_id: u64,
    from: u64,
    settled_after: Duration,
) -> Result<Option<Stretch>, sqlx::Error> {
    let (through, charges, unpaid, pg, aos, ios): (Option<u64>, i64, i64, i64, i64, i64) =
        sqlx::query_as(
            "SELECT MAX(id), COUNT(*), \
                CAST(COALESCE(SUM(payment_status <> 'COMPLETE'), 0) AS SIGNED), \
                CAST(COALESCE(SUM(CASE WHEN payment_status = 'COMPLETE' AND container = 'pg' \
                                  THEN cans END), 0) AS SIGNED), \
                CAST(COALESCE(SUM(CASE WHEN payment_status = 'COMPLETE' AND container = 'aos' \
                                  THEN cans END), 0) AS SIGNED), \
                CAST(COALESCE(SUM(CASE WHEN payment_status = 'COMPLETE' AND container = 'ios' \
                                  THEN cans END), 0) AS SIGNED) \
             FROM charges \
             WHERE member_id = ? AND id > ? \
               AND id < COALESCE((SELECT MIN(o.id) FROM charges o \
                                  WHERE o.member_id = ? AND o.id > ? \
                                    AND o.created_at >= NOW(6) - INTERVAL ? MICROSECOND), \
                                 18446744073709551615)",
        )
        .bind(member_id)
        .bind(from)
        .bind(member_id)
        .bind(from)
        .bind(micros(settled_after))
        .fetch_one(pool)
        .await?;
    let Some(through) = through else {
        return Ok(None);
    };
    let unpaid = if unpaid > 0 {
        sqlx::query_scalar(
            "SELECT id FROM charges WHERE member_id = ? AND id > ? AND id <= ? \
                 AND payment_status <> 'COMPLETE' ORDER BY id",
        )
        .bind(member_id)
        .bind(from)
        .bind(through)
        .fetch_all(pool)
        .await?
    } else {
        Vec::new()
    };
    Ok(Some(Stretch {
        member_id,
        checkpoint_through: from,
        through,
        charges,
        pg,
        aos,
        ios,
        unpaid,
    }))
}

/// The listed unpaid charges of `members` that are COMPLETE now, with their cans.
async fn paid_since_listed(pool: &MySqlPool, members: &[u64]) -> Result<Vec<Paid>, sqlx::Error> {
    let sql = format!(
        "SELECT u.member_id, u.charge_id, \
                CAST(CASE WHEN c.container = 'pg' THEN c.cans ELSE 0 END AS SIGNED) AS pg, \
                CAST(CASE WHEN c.container = 'aos' THEN c.cans ELSE 0 END AS SIGNED) AS aos, \
                CAST(CASE WHEN c.container = 'ios' THEN c.cans ELSE 0 END AS SIGNED) AS ios \
         FROM member_can_checkpoint_unpaid u JOIN charges c ON c.id = u.charge_id \
         WHERE u.member_id IN ({}) AND c.payment_status = 'COMPLETE' \
         ORDER BY u.member_id, u.charge_id",
        db::placeholders(members.len())
    );
    members
        .iter()
        .fold(sqlx::query_as(AssertSqlSafe(sql)), |query, member| {
            query.bind(*member)
        })
        .fetch_all(pool)
        .await
}

/// Moves a paid charge from its member's unpaid list into the checkpoint's sums, if this
/// transaction is the one that deletes the listing; whether it did.
async fn fold(conn: &mut MySqlConnection, paid: &Paid) -> Result<bool, sqlx::Error> {
    let unlisted = sqlx::query(
        "DELETE FROM member_can_checkpoint_unpaid WHERE member_id = ? AND charge_id = ?",
    )
    .bind(paid.member_id)
    .bind(paid.charge_id)
    .execute(&mut *conn)
    .await?;
    if unlisted.rows_affected() != 1 {
        return Ok(false);
    }
    sqlx::query(
        "UPDATE member_can_checkpoints SET pg_cans = pg_cans + ?, aos_cans = aos_cans + ?, \
             ios_cans = ios_cans + ? \
         WHERE member_id = ?",
    )
    .bind(paid.pg)
    .bind(paid.aos)
    .bind(paid.ios)
    .bind(paid.member_id)
    .execute(conn)
    .await?;
    Ok(true)
}

/// Adds `stretch` to its member's checkpoint if the checkpoint still ends where it was read;
/// whether it did (another checkpointer got there first otherwise: its stretch covers the
/// same charges).
async fn extend(conn: &mut MySqlConnection, stretch: &Stretch) -> Result<bool, sqlx::Error> {
    let written = if stretch.checkpoint_through == 0 {
        let inserted = sqlx::query(
            "INSERT INTO member_can_checkpoints \
                 (member_id, through_charge_id, pg_cans, aos_cans, ios_cans) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(stretch.member_id)
        .bind(stretch.through)
        .bind(stretch.pg)
        .bind(stretch.aos)
        .bind(stretch.ios)
        .execute(&mut *conn)
        .await;
        match inserted {
            Ok(_) => true,
            // Another checkpointer created it meanwhile; only this statement is undone.
            Err(error) if db::is_duplicate_on(&error, "PRIMARY") => false,
            Err(error) => return Err(error),
        }
    } else {
        sqlx::query(
            "UPDATE member_can_checkpoints SET through_charge_id = ?, pg_cans = pg_cans + ?, \
                 aos_cans = aos_cans + ?, ios_cans = ios_cans + ? \
             WHERE member_id = ? AND through_charge_id = ?",
        )
        .bind(stretch.through)
        .bind(stretch.pg)
        .bind(stretch.aos)
        .bind(stretch.ios)
        .bind(stretch.member_id)
        .bind(stretch.checkpoint_through)
        .execute(&mut *conn)
        .await?
        .rows_affected()
            == 1
    };
    if written && !stretch.unpaid.is_empty() {
        let sql = format!(
            "INSERT INTO member_can_checkpoint_unpaid (member_id, charge_id) VALUES {}",
            vec!["(?, ?)"; stretch.unpaid.len()].join(", ")
        );
        stretch
            .unpaid
            .iter()
            .fold(sqlx::query(AssertSqlSafe(sql)), |query, charge| {
                query.bind(stretch.member_id).bind(*charge)
            })
            .execute(conn)
            .await?;
    }
    Ok(written)
}
