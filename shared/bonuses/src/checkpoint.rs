//! Member can checkpoints: the sums of a member's settled charges, so the continuous auditor's
//! `member_can_balances` reads a member's charges above its checkpoint, not its whole history
//! (read whole, the passes grow with every member's history, and the workflows' p99 with them).
//!
//! A checkpoint (`member_can_checkpoints`) holds, per container, the sum of the member's COMPLETE
//! charges with `id <= through_charge_id`, over a prefix in which every charge is
//! - **settled**: stamped more than `settled_after` ago, so that no charge below the prefix's
//!   end can still commit unseen ([`advance`] has the argument);
//! - **COMPLETE, or listed as unpaid** (`member_can_checkpoint_unpaid`): a COMPLETE charge never
//!   changes again; a REQUEST one may be paid later or never, so it is listed instead of summed,
//!   counted by the windowed check once paid, and then folded in by the checkpointer.
//!
//! [`advance`] adds each stretch conditional on the `through_charge_id` it read, and folds a
//! paid charge conditional on deleting its listing, so racing checkpointers add each charge
//! once. The windowed check trusts the checkpoints; the full audit verifies every one.

use std::{collections::HashMap, time::Duration};

use paybus_db as db;
use paybus_retry::clock::micros;
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
/// `settled_after` ago. A member left out (the checkpointer stood still) keeps its older
/// checkpoint: the check is then slower for it, never wrong.
///
/// Why that bound: a charge of the member below a checkpoint's end that is not yet visible
/// would be missed for ever. Ids are handed out in order, so such a charge got its id before
/// the prefix's last one, whose statement began more than `settled_after` ago and waited at
/// most `innodb_lock_wait_timeout` (50 s). With `settled_after` at twice the auditor's overlap
/// (4 minutes by default), that charge's transaction would have been open for longer than the
/// overlap after its stamp, and the windowed reads already assume that none is
/// (docs/operations.md, "The continuous auditor").
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
        let starts: Vec<(u64, u64)> = members
            .iter()
            .map(|member| (*member, ends.get(member).copied().unwrap_or(0)))
            .collect();
        let stretches = settled_stretches(pool, &starts, settled_after).await?;
        if !stretches.is_empty() {
            let mut tx = db::begin_read_committed(pool).await?;
            for stretch in &stretches {
                if extend(&mut tx, stretch).await? {
                    advanced.moved += 1;
                    advanced.charges += u64::try_from(stretch.charges).unwrap_or_default();
                }
            }
            tx.commit().await?;
        }
        // Its own transaction, in member order as the one above: one transaction going over
        // the members twice could wait on another in a cycle.
        let paid = paid_since_listed(pool, members).await?;
        if !paid.is_empty() {
            let mut tx = db::begin_read_committed(pool).await?;
            for charge in &paid {
                if fold(&mut tx, charge).await? {
                    advanced.folded += 1;
                }
            }
            tx.commit().await?;
        }
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

/// A charge above its member's checkpoint, as [`settled_stretches`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
struct ChargeAbove {
    member_id: u64,
    id: u64,
    /// Stamped more than `settled_after` ago.
    settled: bool,
    complete: bool,
    /// Its cans in its container, 0 in the others.
    pg: i64,
    aos: i64,
    ios: i64,
}

/// Members whose charges above their checkpoints one statement reads (the checkpointer's and
/// the windowed balance check's reads).
pub(crate) const MEMBERS_PER_STATEMENT: usize = 50;

/// One statement for [`MEMBERS_PER_STATEMENT`] members: `select`, one member's read in
/// parentheses, that many times, joined by `UNION ALL`.
pub(crate) fn per_member_statement(select: &str) -> String {
    vec![select; MEMBERS_PER_STATEMENT].join(" UNION ALL ")
}

/// `batch`, at most [`MEMBERS_PER_STATEMENT`] (member, where its checkpoint ends) pairs,
/// padded with member 0 (no member is) to a whole statement: its text, prepared once, is
/// always the same.
pub(crate) fn padded(
    batch: impl ExactSizeIterator<Item = (u64, u64)>,
) -> impl Iterator<Item = (u64, u64)> {
    let padding = MEMBERS_PER_STATEMENT.saturating_sub(batch.len());
    batch.chain(std::iter::repeat_n((0, 0), padding))
}

/// One member's charges above its checkpoint (binds: the settling time, the member, where its
/// checkpoint ends).
const CHARGES_ABOVE: &str = "(SELECT member_id, id, \
        created_at < NOW(6) - INTERVAL ? MICROSECOND AS settled, \
        payment_status = 'COMPLETE' AS complete, \
        CAST(CASE WHEN container = 'pg' THEN cans ELSE 0 END AS SIGNED) AS pg, \
        CAST(CASE WHEN container = 'aos' THEN cans ELSE 0 END AS SIGNED) AS aos, \
        CAST(CASE WHEN container = 'ios' THEN cans ELSE 0 END AS SIGNED) AS ios \
     FROM charges FORCE INDEX (index_charges_above_checkpoint) \
     WHERE member_id = ? AND id > ?)";

/// The next settled stretch of each of `starts` (a member and where its checkpoint ends, 0
/// for none), leaving out members with none, in member order (the order [`advance`]'s
/// transactions lock them in): their charges above the checkpoints, read
/// [`MEMBERS_PER_STATEMENT`] members to a statement, and the stretches decided here
/// ([`stretch`]).
///
/// - **Several members to a statement, each its own `SELECT`** (`UNION ALL`): a statement per
///   member would make the checkpointer's run a round trip for every member credited within
///   the lookback, ~230 µs each in a release build: 1.1 s for 5,000 members with nothing to
///   move, so a run would outlast its minute at ~250,000 members. One `SELECT` for many
///   members (`(member_id = ? AND id > ?) OR ...`) makes MariaDB test the whole `OR` on every
///   index entry of every member: 210 µs a member with 175 charges each, against 40 µs a
///   member as `UNION ALL`.
/// - **Bounds as constants, on `index_charges_above_checkpoint` (member_id, id)**: a range,
///   so only the entries above the checkpoint are read. On `index_charges_payment_count`
///   MariaDB walks every entry of the member and tests `id > ?` on each (index condition
///   pushdown): the rows below are not fetched, but the history is still walked on every
///   run. Joined with the checkpoints instead, the bound comes from another table and is no
///   range on any index: MariaDB reads every charge of the member. Left to choose, it can
///   take the primary key's range, every charge of every member from the bound on.
/// - **The stretch's end decided in Rust, not in SQL**: a correlated `MIN` in a derived table,
///   re-executed as a prepared statement, returns a stretch past a recent charge in about one
///   run in two on MariaDB 10.11 (`tests/tests/bonuses_checkpoints.rs`).
/// - The last statement is [`padded`]. A member's first checkpoint reads its whole history,
///   once, in memory 50 members at a time.
async fn settled_stretches(
    pool: &MySqlPool,
    starts: &[(u64, u64)],
    settled_after: Duration,
) -> Result<Vec<Stretch>, sqlx::Error> {
    let sql = per_member_statement(CHARGES_ABOVE);
    let mut stretches = Vec::new();
    // A statement's rows at a time: a member's first checkpoint reads its whole history, and
    // 500 long histories at once would be a spike in grant-bonus's memory.
    for batch in starts.chunks(MEMBERS_PER_STATEMENT) {
        let mut above: Vec<ChargeAbove> = padded(batch.iter().copied())
            .fold(
                sqlx::query_as(AssertSqlSafe(sql.as_str())),
                |query, (member_id, from)| {
                    query.bind(micros(settled_after)).bind(member_id).bind(from)
                },
            )
            .fetch_all(pool)
            .await?;
        // `UNION ALL` promises no order; a stretch needs its member's charges in id order, and
        // the writers the members in id order (`starts`, and so each batch, is in that order).
        above.sort_unstable_by_key(|charge| (charge.member_id, charge.id));
        let from_of: HashMap<u64, u64> = batch.iter().copied().collect();
        stretches.extend(
            above
                .chunk_by(|a, b| a.member_id == b.member_id)
                .filter_map(|charges| {
                    let from = *from_of.get(&charges[0].member_id)?;
                    stretch(from, charges)
                }),
        );
    }
    Ok(stretches)
}

/// The stretch of one member's `charges` above its checkpoint's end `from` (in id order): up
/// to, not including, the first that is not settled; `None` when that is the first.
fn stretch(from: u64, charges: &[ChargeAbove]) -> Option<Stretch> {
    let settled: Vec<&ChargeAbove> = charges.iter().take_while(|c| c.settled).collect();
    let last = settled.last()?;
    let paid = || settled.iter().filter(|c| c.complete);
    Some(Stretch {
        member_id: last.member_id,
        checkpoint_through: from,
        through: last.id,
        charges: settled.len() as i64,
        pg: paid().map(|c| c.pg).sum(),
        aos: paid().map(|c| c.aos).sum(),
        ios: paid().map(|c| c.ios).sum(),
        unpaid: settled
            .iter()
            .filter(|c| !c.complete)
            .map(|c| c.id)
            .collect(),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(id: u64, settled: bool, complete: bool, pg: i64, ios: i64) -> ChargeAbove {
        ChargeAbove {
            member_id: 7,
            id,
            settled,
            complete,
            pg,
            aos: 0,
            ios,
        }
    }

    #[test]
    fn a_stretch_ends_before_the_first_charge_not_settled() {
        let charges = [
            charge(11, true, true, 5, 0),
            charge(12, true, true, 0, 3),
            charge(13, false, true, 100, 0),
            // Settled but after one that is not: a later id can be stamped earlier.
            charge(14, true, true, 1_000, 0),
        ];
        let stretch = stretch(10, &charges).expect("two settled charges");
        assert_eq!(
            (
                stretch.member_id,
                stretch.checkpoint_through,
                stretch.through
            ),
            (7, 10, 12)
        );
        assert_eq!(
            (stretch.charges, stretch.pg, stretch.aos, stretch.ios),
            (2, 5, 0, 3)
        );
        assert!(stretch.unpaid.is_empty());
    }

    #[test]
    fn an_unpaid_charge_is_listed_not_summed_and_the_stretch_runs_over_it() {
        let charges = [charge(21, true, false, 50, 0), charge(22, true, true, 4, 0)];
        let stretch = stretch(0, &charges).expect("both settled");
        assert_eq!((stretch.through, stretch.charges, stretch.pg), (22, 2, 4));
        assert_eq!(stretch.unpaid, vec![21]);
    }

    #[test]
    fn no_stretch_when_the_first_charge_above_is_not_settled() {
        assert!(
            stretch(
                30,
                &[charge(31, false, true, 1, 0), charge(32, true, true, 1, 0)]
            )
            .is_none()
        );
        assert!(stretch(30, &[]).is_none());
    }
}
