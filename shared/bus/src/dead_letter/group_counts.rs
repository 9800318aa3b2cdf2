//! The NEW dead letters counted per group (function, reason) in `dead_letter_group_counts`,
//! what the groups page, the API and `paybus dead-letters groups` show; counting the letters on
//! every view read every NEW letter (0.3–0.6 s at 500,000 of them).
//!
//! The counts are exact because every write that moves a letter into or out of NEW applies its
//! [`Change`] in its own transaction, under the letter's lock: [`super::record_failure`] and
//! the replay and archive of `paybus-dead-letter-ops`. Nothing else writes
//! `dead_letters.status` or `failures`.
//!
//! A group is spread over [`SLOTS`] rows, summed on read, so a storm in one group does not queue
//! every recorder on one row lock; a transaction always takes one slot, so two cannot deadlock
//! on each other's. A slot may go below zero: only the sum means anything. A write that went
//! around these functions makes the counts drift: the audit check [`CHECKS`] finds it and
//! [`recount`] sets every group right while writers keep writing.

use std::{collections::BTreeMap, fmt};

use serde::Serialize;
use sqlx::{MySqlConnection, MySqlPool, QueryBuilder};

use paybus_ops::audit::{Check, Finding};

/// Rows one group's counts are spread over.
pub const SLOTS: u8 = 8;

/// What a write did to the NEW letters of one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A new letter, NEW with its first failure.
    Recorded,
    /// One more failure of a letter that was NEW already.
    FailedAgain,
    /// A failure of an ARCHIVED or REPLAYED letter made it NEW again: it brings back every
    /// failure it has (`failures`, this one included).
    Reopened { failures: u32 },
    /// A NEW letter was replayed or archived, taking its `failures` out of the group.
    LeftNew { failures: u32 },
}

impl Change {
    /// (letters, failures) to add.
    fn deltas(self) -> (i64, i64) {
        match self {
            Change::Recorded => (1, 1),
            Change::FailedAgain => (0, 1),
            Change::Reopened { failures } => (1, i64::from(failures)),
            Change::LeftNew { failures } => (-1, -i64::from(failures)),
        }
    }
}

/// Applies `change` to the group of `function` and `reason` in the caller's transaction, the
/// one that made the change (the slot's lock is held until it commits: call this last).
pub async fn apply(
    conn: &mut MySqlConnection,
    function: &str,
    reason: &str,
    change: Change,
) -> Result<(), sqlx::Error> {
    let (letters, failures) = change.deltas();
    sqlx::query(
        "INSERT INTO dead_letter_group_counts (function_name, reason, slot, letters, failures) \
         VALUES (?, ?, CONNECTION_ID() % ?, ?, ?) \
         ON DUPLICATE KEY UPDATE letters = letters + ?, failures = failures + ?",
    )
    .bind(function)
    .bind(reason)
    .bind(SLOTS)
    .bind(letters)
    .bind(failures)
    .bind(letters)
    .bind(failures)
    .execute(conn)
    .await?;
    Ok(())
}

/// One group's NEW letters and their failures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupCount {
    pub function_name: String,
    pub reason: String,
    pub letters: i64,
    pub failures: i64,
}

type Key = (String, String);

/// Every group with NEW letters, by function and reason, from the counts.
pub async fn read(conn: &mut MySqlConnection) -> Result<Vec<GroupCount>, sqlx::Error> {
    Ok(counted(conn, "")
        .await?
        .into_iter()
        .filter(|(_, (letters, failures))| *letters != 0 || *failures != 0)
        .map(
            |((function_name, reason), (letters, failures))| GroupCount {
                function_name,
                reason,
                letters,
                failures,
            },
        )
        .collect())
}

/// The NEW letters of one group, from its counts: what is left of a group after a limited
/// action, without counting its letters (a dry run over a group of 80,000 NEW letters spent
/// most of its time in that count).
pub async fn letters_of(
    conn: &mut MySqlConnection,
    function: &str,
    reason: &str,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(letters), 0) AS SIGNED) FROM dead_letter_group_counts \
         WHERE function_name = ? AND reason = ?",
    )
    .bind(function)
    .bind(reason)
    .fetch_one(conn)
    .await
}

/// The counts summed per group; `lock` is appended to the statement.
async fn counted(
    conn: &mut MySqlConnection,
    lock: &str,
) -> Result<BTreeMap<Key, (i64, i64)>, sqlx::Error> {
    // The slots are summed here rather than by the server: FOR UPDATE must see the rows.
    let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT function_name, reason, letters, failures FROM dead_letter_group_counts{lock}"
    )))
    .fetch_all(conn)
    .await?;
    let mut sums = BTreeMap::new();
    for (function, reason, letters, failures) in rows {
        let sum: &mut (i64, i64) = sums.entry((function, reason)).or_default();
        sum.0 += letters;
        sum.1 += failures;
    }
    Ok(sums)
}

/// What the NEW letters are, per group, counted one by one (index-only on
/// `index_dead_letters_groups`: a read of every NEW letter's index entry).
async fn actual(conn: &mut MySqlConnection) -> Result<BTreeMap<Key, (i64, i64)>, sqlx::Error> {
    let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
        "SELECT function_name, reason, COUNT(*), CAST(SUM(failures) AS SIGNED) \
         FROM dead_letters WHERE status = 'NEW' GROUP BY function_name, reason",
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(function, reason, letters, failures)| ((function, reason), (letters, failures)))
        .collect())
}

/// A group whose counts are not what its NEW letters are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Drift {
    pub function_name: String,
    pub reason: String,
    pub counted_letters: i64,
    pub counted_failures: i64,
    pub letters: i64,
    pub failures: i64,
}

impl Finding for Drift {
    fn check(&self) -> &'static str {
        "dead_letter_group_counts"
    }
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} / {} is counted as {} letter(s) and {} failure(s), its NEW letters are {} \
             with {} failure(s) (`paybus dead-letters recount` sets it right)",
            self.check(),
            self.function_name,
            self.reason,
            self.counted_letters,
            self.counted_failures,
            self.letters,
            self.failures
        )
    }
}

/// Every group whose counts differ from its letters, on either side.
fn compare(counted: &BTreeMap<Key, (i64, i64)>, actual: &BTreeMap<Key, (i64, i64)>) -> Vec<Drift> {
    let keys: std::collections::BTreeSet<&Key> = counted.keys().chain(actual.keys()).collect();
    keys.into_iter()
        .filter_map(|key| {
            let (counted_letters, counted_failures) = counted.get(key).copied().unwrap_or_default();
            let (letters, failures) = actual.get(key).copied().unwrap_or_default();
            ((counted_letters, counted_failures) != (letters, failures)).then(|| Drift {
                function_name: key.0.clone(),
                reason: key.1.clone(),
                counted_letters,
                counted_failures,
                letters,
                failures,
            })
        })
        .collect()
}

/// The check `paybus audit` and the continuous auditor run. No windowed form: a drift may sit
/// in any group, however old its letters, and the full check reads one index entry per NEW
/// letter.
pub const CHECKS: &[Check] = &[paybus_ops::audit_check!(
    "dead_letter_group_counts",
    drifted
)];

/// Every group whose counts drifted from its NEW letters. Both reads must see one snapshot:
/// run it in a transaction, as the audit does.
pub async fn drifted(conn: &mut MySqlConnection) -> Result<Vec<Drift>, sqlx::Error> {
    let counted = counted(conn, "").await?;
    let actual = actual(conn).await?;
    Ok(compare(&counted, &actual))
}

/// Sets every group's counts to what its NEW letters are, exactly, while writers keep writing;
/// returns the groups it corrected (nothing when the counts were right).
///
/// It locks every slot row first (and the gaps: a first count of a new group waits too), then
/// counts the letters in a snapshot taken after that, and replaces the counts. A writer that
/// committed before the locks were granted is in the snapshot; one still open had not applied
/// its change yet (it waits for the locks here, holding its letter, and adds its change after
/// this commits), so it is not. Writers wait for the count: under a second at 500,000 NEW
/// letters.
pub async fn recount(pool: &MySqlPool) -> Result<Vec<Drift>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    // A locking read takes no snapshot: the first plain read below does, after the locks.
    let counted = counted(&mut tx, " FOR UPDATE").await?;
    let actual = actual(&mut tx).await?;
    let drifts = compare(&counted, &actual);
    if drifts.is_empty() {
        tx.rollback().await?;
        return Ok(drifts);
    }
    sqlx::query("DELETE FROM dead_letter_group_counts")
        .execute(&mut *tx)
        .await?;
    if !actual.is_empty() {
        let mut insert = QueryBuilder::new(
            "INSERT INTO dead_letter_group_counts (function_name, reason, slot, letters, failures) ",
        );
        insert.push_values(
            &actual,
            |mut row, ((function, reason), (letters, failures))| {
                row.push_bind(function)
                    .push_bind(reason)
                    .push_bind(0_u8)
                    .push_bind(letters)
                    .push_bind(failures);
            },
        );
        insert.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    for drift in &drifts {
        tracing::warn!(function = %drift.function_name, reason = %drift.reason,
            counted_letters = drift.counted_letters, letters = drift.letters,
            counted_failures = drift.counted_failures, failures = drift.failures,
            "dead-letter group counts recounted");
    }
    Ok(drifts)
}
