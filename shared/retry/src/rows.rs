//! Rows as units of work: a workflow describes its table once as a [`WorkTable`] and gets from
//! it every statement: claim one with a lease, settle it conditionally on that claim (done,
//! retry at, failed), claim due rows in batches, reap expired leases. Each is a conditional
//! UPDATE whose affected rows decide (principle 1), none holds a lock beyond the caller's short
//! transaction (principle 3), and all read the kit's [`Clock`] (`COALESCE(?, NOW(6))`).
//!
//! A claim holds the row one of two ways ([`Lease`]): **in place** (the row stays due, its
//! `next_attempt_at` pushed out: a dead attempt's row is simply due again later) or **by
//! status** (an in-flight status and `claimed_at`, which the reaper returns after a timeout).
//!
//! The rule that makes it safe: a settle is conditional on the claim it settles (the attempt
//! number, or the `claimed_at` stamp), so an attempt whose lease ran out can never overwrite the
//! outcome of the attempt that took the row over. docs/bus.md ("The retry kit") has the rest.

use std::{fmt::Write as _, time::Duration};

use chrono::{DateTime, Utc};
use sqlx::{
    AssertSqlSafe, MySql, MySqlConnection, Row,
    mysql::MySqlArguments,
    query::{Query, QueryScalar},
};

use super::{Clock, RetryDecision, RetryPolicy, clock::micros};
use paybus_db as db;

/// How a claim keeps other attempts off a row while it is worked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// The row stays in its due status; the claim pushes `next_attempt_at` out by the lease.
    /// Needs [`AttemptCount::OnClaim`]: the attempt number is what a settle is guarded by.
    InPlace,
    /// The claim moves the row to `status` and stamps `claimed_at`; [`WorkTable::reap_expired`]
    /// moves it back once the claim is older than a timeout.
    Status {
        status: &'static str,
        claimed_at: &'static str,
        /// The `(status, claimed_at)` index the stuck count reads.
        claims_index: &'static str,
    },
}

/// When the attempts column counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptCount {
    /// Every claim counts (a crash mid-attempt used one up): attempts made.
    OnClaim,
    /// Only a failure counts (W1's `match_attempt_count`): failures so far.
    OnFailure,
    /// Only a retry's failure counts: failed retries so far (W3's `retry_count`, seed 003).
    /// The first attempt comes before the retries: its failure schedules the first retry and
    /// leaves the column at 0, each failure after it counts one. A row's first failure is
    /// the one that finds `last_error` NULL. The policy is still asked about failures in
    /// all (the first one included), so "an immediate attempt, then 3 retries after 5, 10
    /// and 15 minutes" is `RetryPolicy::new(4, [5, 10, 15 min])`, and the column reads 3
    /// when it gives up.
    OnRetryFailure,
}

/// A table whose rows the kit claims, retries and gives up. Column names and status values
/// are the workflow's own (they go into SQL verbatim: static strings from code only).
#[derive(Debug, Clone, Copy)]
pub struct WorkTable {
    pub table: &'static str,
    /// The status column and its values the kit moves rows between.
    pub status: &'static str,
    pub due: &'static str,
    pub failed: &'static str,
    /// An unsigned or signed integer column.
    pub attempts: &'static str,
    pub count: AttemptCount,
    /// When the row is due; NULL counts as due now.
    pub next_attempt_at: &'static str,
    /// The `(status, next_attempt_at)` index. The gauges' counts name it: with a second
    /// `(status, …)` index on the table the optimizer at times took that one and read every
    /// due row from the clustered index (6.4 s for one count at 5M rows, where the covering
    /// range takes milliseconds).
    pub due_index: &'static str,
    pub last_error: &'static str,
    /// Characters of `last_error` kept (the column's size).
    pub last_error_max: usize,
    pub lease: Lease,
    /// The due sweep's arming column, when rows are re-published as messages: NULL means "a
    /// retry or a lease is waiting to come due and no message has been sent for it yet"; the
    /// sweep stamps it when it re-publishes. Rows are inserted with it set (`DEFAULT
    /// CURRENT_TIMESTAMP(6)`): the transition that created the row sent its first message.
    pub republished_at: Option<&'static str>,
    /// A status rows are parked in, neither due nor failed, until ops act on them (W1's
    /// IN_DOUBT: a trade may exist at the counterparty). Counted in `/metrics`.
    pub held_for_a_human: Option<&'static str>,
}

/// A row this attempt holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub id: u64,
    /// The attempts column after the claim: attempts made ([`AttemptCount::OnClaim`]),
    /// failures so far ([`AttemptCount::OnFailure`]) or failed retries so far
    /// ([`AttemptCount::OnRetryFailure`]).
    pub attempts: u32,
    /// The claim's stamp ([`Lease::Status`]); what its settle is guarded by.
    pub claimed_at: Option<DateTime<Utc>>,
    /// The row had failed before this claim (`last_error` was set).
    pub failed_before: bool,
}

impl Claim {
    /// The number of this attempt's failure, should it fail.
    fn failures_if_failed(&self, count: AttemptCount) -> u32 {
        match count {
            AttemptCount::OnClaim => self.attempts,
            AttemptCount::OnFailure => self.attempts.saturating_add(1),
            // The uncounted first failure, the counted ones, and this one.
            AttemptCount::OnRetryFailure if self.failed_before => self.attempts.saturating_add(2),
            AttemptCount::OnRetryFailure => 1,
        }
    }

    /// Whether this attempt's failure adds one to the attempts column.
    fn failure_counts(&self, count: AttemptCount) -> bool {
        match count {
            AttemptCount::OnClaim => false,
            AttemptCount::OnFailure => true,
            AttemptCount::OnRetryFailure => self.failed_before,
        }
    }
}

/// Where a row stands (for the log line or outcome of an attempt that could not claim it).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RowState {
    pub status: String,
    pub attempts: u64,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// The kit's clock when this was read.
    pub now: DateTime<Utc>,
}

impl RowState {
    /// Due (or its lease ran out) by the clock it was read with.
    pub fn is_due(&self) -> bool {
        self.next_attempt_at.is_none_or(|at| at <= self.now)
    }
}

/// Whether a settle found its claim still in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Yes,
    /// The claim had been taken over (its lease ran out and another attempt claimed the row,
    /// or the reaper returned it) or ops changed the row: nothing was written.
    ClaimLost,
}

impl Settled {
    fn from_rows(rows: u64) -> Self {
        if rows == 1 {
            Settled::Yes
        } else {
            Settled::ClaimLost
        }
    }
}

/// What [`WorkTable::settle_failure`] did with a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Due again after `after`; `failures` counts this one.
    Retry { after: Duration, failures: u32 },
    /// The policy gave up: the row is in the failed status.
    Failed { failures: u32 },
    /// Someone else owns the row now: nothing was written.
    ClaimLost,
}

const NOW: &str = "COALESCE(?, NOW(6))";

/// Every by-id UPDATE of a work table names its index. InnoDB's secondary indexes carry the
/// primary key, so for `WHERE id = ? AND status = 'PENDING'` MariaDB 10.11 prefers a range on
/// `(status, next_attempt_at, id)` over the primary key, and that scan locks other rows'
/// index entries: W3's bench deadlocks at once without the hint (a claim scanning the status
/// index against a grant settling its own row). MySQL 8 and MariaDB both accept index hints
/// on UPDATE.
const BY_ID: &str = "FORCE INDEX (PRIMARY)";

impl WorkTable {
    fn bounded(&self, error: &str) -> String {
        error.chars().take(self.last_error_max).collect()
    }

    /// `UPDATE <table> SET <set> WHERE <the claim's guard>`; bind with [`WorkTable::bind_guard`].
    pub fn guarded_update(&self, set: &str) -> String {
        format!(
            "UPDATE {} {BY_ID} SET {set} WHERE {}",
            self.table,
            self.guard()
        )
    }

    /// The WHERE condition that holds only while `claim` is the row's current claim.
    pub fn guard(&self) -> String {
        match self.lease {
            Lease::InPlace => format!(
                "id = ? AND {} = '{}' AND {} = ?",
                self.status, self.due, self.attempts
            ),
            Lease::Status {
                status, claimed_at, ..
            } => format!(
                "id = ? AND {} = '{status}' AND {claimed_at} = ?",
                self.status
            ),
        }
    }

    /// Binds the guard's parameters (after the SET clause's own).
    pub fn bind_guard<'q>(
        &self,
        query: Query<'q, MySql, MySqlArguments>,
        claim: &Claim,
    ) -> Query<'q, MySql, MySqlArguments> {
        let query = query.bind(claim.id);
        match self.lease {
            Lease::InPlace => query.bind(claim.attempts),
            Lease::Status { .. } => query.bind(claim.claimed_at),
        }
    }

    /// `UPDATE <table> SET <set> WHERE id IN (<ids placeholders>) AND <due>`: how an attempt
    /// that claims nothing beforehand and does its whole work in one transaction settles the
    /// rows [`WorkTable::lock_due`] locked (its row locks are the claim). Bind the SET
    /// clause's own parameters, then [`WorkTable::bind_due`].
    pub fn due_update(&self, set: &str, ids: usize) -> String {
        format!(
            "UPDATE {} {BY_ID} SET {set} WHERE id IN ({}) AND {}",
            self.table,
            db::placeholders(ids),
            self.due_condition()
        )
    }

    /// Locks, in the caller's transaction, the rows of `ids` that are due now and returns
    /// their ids: the claim of an attempt done in that one transaction. A row another attempt
    /// claimed meanwhile is not returned (a row locked by a claim in progress is waited for).
    pub async fn lock_due(
        &self,
        conn: &mut MySqlConnection,
        ids: &[u64],
        clock: &Clock,
    ) -> Result<Vec<u64>, sqlx::Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT id FROM {} {BY_ID} WHERE id IN ({}) AND {} ORDER BY id FOR UPDATE",
            self.table,
            db::placeholders(ids.len()),
            self.due_condition()
        );
        let rows = self
            .bind_due(sqlx::query(AssertSqlSafe(sql)), ids, clock)
            .fetch_all(conn)
            .await?;
        rows.iter().map(|row| row.try_get(0)).collect()
    }

    /// Locks the row of `claim` in the caller's transaction if the claim is still its own:
    /// an attempt that must lock the row before anything else (its lock order) checks its
    /// claim this way.
    pub async fn lock_claimed(
        &self,
        conn: &mut MySqlConnection,
        claim: &Claim,
    ) -> Result<Settled, sqlx::Error> {
        let sql = format!(
            "SELECT id FROM {} {BY_ID} WHERE {} FOR UPDATE",
            self.table,
            self.guard()
        );
        let locked = self
            .bind_guard(sqlx::query(AssertSqlSafe(sql)), claim)
            .fetch_optional(conn)
            .await?;
        Ok(Settled::from_rows(u64::from(locked.is_some())))
    }

    /// Binds [`WorkTable::due_update`]'s WHERE parameters: the ids, then the clock.
    pub fn bind_due<'q>(
        &self,
        query: Query<'q, MySql, MySqlArguments>,
        ids: &[u64],
        clock: &Clock,
    ) -> Query<'q, MySql, MySqlArguments> {
        ids.iter()
            .fold(query, |query, id| query.bind(*id))
            .bind(clock.sql_now())
    }

    fn due_condition(&self) -> String {
        format!(
            "{status} = '{due}' AND ({next} IS NULL OR {next} <= {NOW})",
            status = self.status,
            due = self.due,
            next = self.next_attempt_at
        )
    }

    /// The SET clause of a claim (binds: the clock, then the lease in microseconds for
    /// [`Lease::InPlace`]).
    fn claim_assignments(&self) -> String {
        let mut set = String::new();
        if self.count == AttemptCount::OnClaim {
            let _ = write!(set, "{a} = {a} + 1, ", a = self.attempts);
        }
        match self.lease {
            Lease::InPlace => {
                let _ = write!(
                    set,
                    "{} = {NOW} + INTERVAL ? MICROSECOND",
                    self.next_attempt_at
                );
                if let Some(marker) = self.republished_at {
                    // Armed: should this attempt die, its lease running out re-publishes it.
                    let _ = write!(set, ", {marker} = NULL");
                }
            }
            Lease::Status {
                status, claimed_at, ..
            } => {
                let _ = write!(set, "{} = '{status}', {claimed_at} = {NOW}", self.status);
            }
        }
        set
    }

    fn bind_claim<'q>(
        &self,
        query: Query<'q, MySql, MySqlArguments>,
        lease: Duration,
        clock: &Clock,
    ) -> Query<'q, MySql, MySqlArguments> {
        let query = query.bind(clock.sql_now());
        match self.lease {
            Lease::InPlace => query.bind(micros(lease)),
            Lease::Status { .. } => query,
        }
    }

    fn claimed_row_sql(&self, filter: &str) -> String {
        let claimed_at = match self.lease {
            Lease::InPlace => "NULL".to_owned(),
            Lease::Status { claimed_at, .. } => claimed_at.to_owned(),
        };
        format!(
            "SELECT id, CAST({} AS UNSIGNED), {claimed_at}, CAST({} IS NOT NULL AS UNSIGNED) \
             FROM {} WHERE {filter}",
            self.attempts, self.last_error, self.table
        )
    }

    /// Claims row `id` if it is due, in the caller's transaction (commit it before working
    /// on the row) or on a connection of its own, where the UPDATE commits by itself and the
    /// read after it still finds the claim it wrote (a claimed row is written only under its
    /// guard, and reaped only after its lease). `lease`: how long an in-place claim keeps the row (ignored by status
    /// leases, which the reaper times out). `None`: not due, not in the due status, or no
    /// such row ([`WorkTable::describe`] tells which).
    pub async fn claim(
        &self,
        conn: &mut MySqlConnection,
        id: u64,
        lease: Duration,
        clock: &Clock,
    ) -> Result<Option<Claim>, sqlx::Error> {
        let sql = format!(
            "UPDATE {} {BY_ID} SET {} WHERE id = ? AND {}",
            self.table,
            self.claim_assignments(),
            self.due_condition()
        );
        let claimed = self
            .bind_claim(sqlx::query(AssertSqlSafe(sql)), lease, clock)
            .bind(id)
            .bind(clock.sql_now())
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if claimed == 0 {
            return Ok(None);
        }
        // The row is ours (locked by our UPDATE, or claimed by it): these are the values we
        // claimed it with.
        let row: ClaimedRow = sqlx::query_as(AssertSqlSafe(self.claimed_row_sql("id = ?")))
            .bind(id)
            .fetch_one(&mut *conn)
            .await?;
        Ok(Some(claim_of(row)))
    }

    /// Claims up to `limit` due rows, oldest due first, skipping rows other claimers hold
    /// (`FOR UPDATE SKIP LOCKED`, so several workers never take the same row). Run it in a
    /// READ COMMITTED transaction (`db::begin_read_committed`) and commit before working on
    /// the rows, one by one.
    pub async fn claim_due(
        &self,
        conn: &mut MySqlConnection,
        limit: u32,
        lease: Duration,
        clock: &Clock,
    ) -> Result<Vec<Claim>, sqlx::Error> {
        let ids = self
            .lock_ids(conn, &self.due_condition(), limit, clock)
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list = db::placeholders(ids.len());
        let sql = format!(
            "UPDATE {} {BY_ID} SET {} WHERE id IN ({list})",
            self.table,
            self.claim_assignments()
        );
        ids.iter()
            .fold(
                self.bind_claim(sqlx::query(AssertSqlSafe(sql)), lease, clock),
                |query, id| query.bind(*id),
            )
            .execute(&mut *conn)
            .await?;
        let rows: Vec<ClaimedRow> = ids
            .iter()
            .fold(
                sqlx::query_as(AssertSqlSafe(
                    self.claimed_row_sql(&format!("id IN ({list}) ORDER BY id")),
                )),
                |query, id| query.bind(*id),
            )
            .fetch_all(&mut *conn)
            .await?;
        Ok(rows.into_iter().map(claim_of).collect())
    }

    /// `SELECT id ... WHERE <condition> ORDER BY <next attempt>, id LIMIT ? FOR UPDATE SKIP
    /// LOCKED`, with the clock bound for the condition's one `COALESCE(?, NOW(6))`.
    async fn lock_ids(
        &self,
        conn: &mut MySqlConnection,
        condition: &str,
        limit: u32,
        clock: &Clock,
    ) -> Result<Vec<u64>, sqlx::Error> {
        let sql = format!(
            "SELECT id FROM {} WHERE {condition} ORDER BY {}, id LIMIT ? FOR UPDATE SKIP LOCKED",
            self.table, self.next_attempt_at
        );
        let query: QueryScalar<'_, MySql, u64, MySqlArguments> =
            sqlx::query_scalar(AssertSqlSafe(sql));
        query
            .bind(clock.sql_now())
            .bind(limit)
            .fetch_all(conn)
            .await
    }

    /// Rows due for an attempt now (a retry whose time came, or a new row not yet taken).
    pub async fn count_due(&self, conn: &mut MySqlConnection) -> Result<u64, sqlx::Error> {
        let sql = format!(
            "SELECT COUNT(*) FROM {} FORCE INDEX ({}) WHERE {} = '{}' AND ({} IS NULL OR {} <= NOW(6))",
            self.table,
            self.due_index,
            self.status,
            self.due,
            self.next_attempt_at,
            self.next_attempt_at
        );
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(conn)
            .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Rows nothing is moving: due for longer than `overdue` (the due sweep or the worker
    /// should have taken them), or, with a status lease, claimed longer than `overdue` ago
    /// (the reaper should have returned them).
    pub async fn count_stuck(
        &self,
        conn: &mut MySqlConnection,
        overdue: Duration,
    ) -> Result<u64, sqlx::Error> {
        // One count per status, added: each is a range on its own (status, time) index.
        // With OR the optimizer read every row of both statuses (a second at a million
        // bonus jobs, on every scrape).
        let mut sql = format!(
            "SELECT (SELECT COUNT(*) FROM {} FORCE INDEX ({}) WHERE {} = '{}' AND {} < NOW(6) - \
             INTERVAL ? MICROSECOND)",
            self.table, self.due_index, self.status, self.due, self.next_attempt_at
        );
        if let Lease::Status {
            status,
            claimed_at,
            claims_index,
        } = self.lease
        {
            let _ = write!(
                sql,
                " + (SELECT COUNT(*) FROM {} FORCE INDEX ({claims_index}) WHERE {} = '{status}' \
                 AND {claimed_at} < NOW(6) - INTERVAL ? MICROSECOND)",
                self.table, self.status
            );
        }
        let micros = micros(overdue);
        let mut query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql)).bind(micros);
        if matches!(self.lease, Lease::Status { .. }) {
            query = query.bind(micros);
        }
        Ok(u64::try_from(query.fetch_one(conn).await?).unwrap_or(0))
    }

    /// Rows in the [`WorkTable::held_for_a_human`] status; `None` when the table has none.
    pub async fn count_held_for_a_human(
        &self,
        conn: &mut MySqlConnection,
    ) -> Result<Option<u64>, sqlx::Error> {
        let Some(held) = self.held_for_a_human else {
            return Ok(None);
        };
        let sql = format!(
            "SELECT COUNT(*) FROM {} WHERE {} = '{held}'",
            self.table, self.status
        );
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(conn)
            .await?;
        Ok(Some(u64::try_from(count).unwrap_or(0)))
    }

    /// Where row `id` stands now; `None` when there is no such row. A locking read, so it
    /// sees the latest committed version even inside a REPEATABLE READ snapshot.
    pub async fn describe(
        &self,
        conn: &mut MySqlConnection,
        id: u64,
        clock: &Clock,
    ) -> Result<Option<RowState>, sqlx::Error> {
        let sql = format!(
            "SELECT {} AS status, CAST({} AS UNSIGNED) AS attempts, {} AS next_attempt_at, \
                    {} AS last_error, {NOW} AS now \
             FROM {} WHERE id = ? FOR UPDATE",
            self.status, self.attempts, self.next_attempt_at, self.last_error, self.table
        );
        sqlx::query_as(AssertSqlSafe(sql))
            .bind(clock.sql_now())
            .bind(id)
            .fetch_optional(conn)
            .await
    }

    /// Runs an UPDATE built by [`WorkTable::guarded_update`] under `claim`'s guard.
    async fn settle_guarded(
        &self,
        conn: &mut MySqlConnection,
        query: Query<'_, MySql, MySqlArguments>,
        claim: &Claim,
    ) -> Result<Settled, sqlx::Error> {
        let rows = self
            .bind_guard(query, claim)
            .execute(conn)
            .await?
            .rows_affected();
        Ok(Settled::from_rows(rows))
    }

    /// The attempt succeeded: `set` (the workflow's own assignments, e.g. `status = 'DONE',
    /// processed_at = NOW(6)`, no parameters) applied under the claim's guard.
    pub async fn settle_done(
        &self,
        conn: &mut MySqlConnection,
        claim: &Claim,
        set: &str,
    ) -> Result<Settled, sqlx::Error> {
        let query = sqlx::query(AssertSqlSafe(self.guarded_update(set)));
        self.settle_guarded(conn, query, claim).await
    }

    /// The attempt failed below the limit: due again after `delay` with `error` recorded
    /// (back in the due status, for a status lease).
    pub async fn settle_retry(
        &self,
        conn: &mut MySqlConnection,
        claim: &Claim,
        delay: Duration,
        error: &str,
        clock: &Clock,
    ) -> Result<Settled, sqlx::Error> {
        let mut set = format!(
            "{} = ?, {} = {NOW} + INTERVAL ? MICROSECOND",
            self.last_error, self.next_attempt_at
        );
        self.push_release(&mut set, claim);
        if let Some(marker) = self.republished_at {
            // Armed: the due sweep re-publishes it once the backoff is over.
            let _ = write!(set, ", {marker} = NULL");
        }
        let query = sqlx::query(AssertSqlSafe(self.guarded_update(&set)))
            .bind(self.bounded(error))
            .bind(clock.sql_now())
            .bind(micros(delay));
        self.settle_guarded(conn, query, claim).await
    }

    /// Hands the claim back without counting an attempt: due again after `delay` (the work
    /// was not tried — its partner's breaker is open, its in-flight bound is reached — or it
    /// waits on something that is not a failure: W1's candidates held by other matchers for a
    /// moment, a trade whose outcome is still unknown). `note`, when given, becomes
    /// `last_error`, so the row says why it waits. Armed for the due sweep.
    pub async fn defer(
        &self,
        conn: &mut MySqlConnection,
        claim: &Claim,
        delay: Duration,
        note: Option<&str>,
        clock: &Clock,
    ) -> Result<Settled, sqlx::Error> {
        let mut set = format!("{} = {NOW} + INTERVAL ? MICROSECOND", self.next_attempt_at);
        if note.is_some() {
            let _ = write!(set, ", {} = ?", self.last_error);
        }
        if self.count == AttemptCount::OnClaim {
            let _ = write!(set, ", {a} = {a} - 1", a = self.attempts);
        }
        if let Lease::Status { claimed_at, .. } = self.lease {
            let _ = write!(
                set,
                ", {} = '{}', {claimed_at} = NULL",
                self.status, self.due
            );
        }
        if let Some(marker) = self.republished_at {
            let _ = write!(set, ", {marker} = NULL");
        }
        let mut query = sqlx::query(AssertSqlSafe(self.guarded_update(&set)))
            .bind(clock.sql_now())
            .bind(micros(delay));
        if let Some(note) = note {
            query = query.bind(self.bounded(note));
        }
        self.settle_guarded(conn, query, claim).await
    }

    /// The attempt failed at the limit: the failed status, `error` recorded, no next attempt.
    pub async fn settle_failed(
        &self,
        conn: &mut MySqlConnection,
        claim: &Claim,
        error: &str,
    ) -> Result<Settled, sqlx::Error> {
        let mut set = format!(
            "{} = '{}', {} = ?, {} = NULL",
            self.status, self.failed, self.last_error, self.next_attempt_at
        );
        if claim.failure_counts(self.count) {
            let _ = write!(set, ", {a} = {a} + 1", a = self.attempts);
        }
        let query = sqlx::query(AssertSqlSafe(self.guarded_update(&set))).bind(self.bounded(error));
        self.settle_guarded(conn, query, claim).await
    }

    /// A failed attempt, settled by `policy`: retried after its backoff, or failed at the
    /// limit.
    pub async fn settle_failure(
        &self,
        conn: &mut MySqlConnection,
        claim: &Claim,
        policy: &RetryPolicy,
        error: &str,
        clock: &Clock,
    ) -> Result<AfterFailure, sqlx::Error> {
        let failures = claim.failures_if_failed(self.count);
        let settled = match policy.after_failure(failures) {
            RetryDecision::RetryAfter(after) => {
                match self.settle_retry(conn, claim, after, error, clock).await? {
                    Settled::Yes => AfterFailure::Retry { after, failures },
                    Settled::ClaimLost => AfterFailure::ClaimLost,
                }
            }
            RetryDecision::GiveUp => match self.settle_failed(conn, claim, error).await? {
                Settled::Yes => AfterFailure::Failed { failures },
                Settled::ClaimLost => AfterFailure::ClaimLost,
            },
        };
        Ok(settled)
    }

    /// The assignments that hand a status-leased row back to the due status (and count the
    /// failure where this one counts).
    fn push_release(&self, set: &mut String, claim: &Claim) {
        if let Lease::Status { claimed_at, .. } = self.lease {
            let _ = write!(
                set,
                ", {} = '{}', {claimed_at} = NULL",
                self.status, self.due
            );
        }
        if claim.failure_counts(self.count) {
            let _ = write!(set, ", {a} = {a} + 1", a = self.attempts);
        }
    }

    /// Returns up to `limit` rows whose status lease is older than `timeout` to the due
    /// status, due now (their process died mid-attempt); no attempt is counted. Runs in the
    /// caller's transaction (READ COMMITTED), which may release what the rows held before
    /// committing. Returns the ids. A no-op for in-place leases: they come due by themselves.
    pub async fn reap_expired(
        &self,
        conn: &mut MySqlConnection,
        timeout: Duration,
        limit: u32,
        clock: &Clock,
    ) -> Result<Vec<u64>, sqlx::Error> {
        let Lease::Status {
            status, claimed_at, ..
        } = self.lease
        else {
            return Ok(Vec::new());
        };
        let sql = format!(
            "SELECT id FROM {table} \
             WHERE {column} = '{status}' AND {claimed_at} IS NOT NULL \
               AND {claimed_at} <= {NOW} - INTERVAL ? MICROSECOND \
             ORDER BY {claimed_at}, id LIMIT ? FOR UPDATE SKIP LOCKED",
            table = self.table,
            column = self.status
        );
        let ids: Vec<u64> = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(clock.sql_now())
            .bind(micros(timeout))
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
        if ids.is_empty() {
            return Ok(ids);
        }
        let mut set = format!(
            "{column} = '{due}', {claimed_at} = NULL, {next} = {NOW}",
            column = self.status,
            due = self.due,
            next = self.next_attempt_at
        );
        if let Some(marker) = self.republished_at {
            let _ = write!(set, ", {marker} = NULL");
        }
        let sql = format!(
            "UPDATE {} {BY_ID} SET {set} WHERE id IN ({}) AND {} = '{status}'",
            self.table,
            db::placeholders(ids.len()),
            self.status
        );
        update_stamped(conn, sql, &ids, clock).await?;
        Ok(ids)
    }

    /// Locks up to `limit` due rows that need a message (armed, or re-published longer than
    /// `stale_after` ago) and stamps them re-published, in the caller's transaction; returns
    /// their ids. `None` when the table has no arming column.
    pub async fn take_due_for_republish(
        &self,
        conn: &mut MySqlConnection,
        stale_after: Duration,
        limit: u32,
        clock: &Clock,
    ) -> Result<Vec<u64>, sqlx::Error> {
        let Some(marker) = self.republished_at else {
            return Ok(Vec::new());
        };
        let sql = format!(
            "SELECT id FROM {table} \
             WHERE {status} = '{due}' AND {next} <= {NOW} \
               AND ({marker} IS NULL OR {marker} <= {NOW} - INTERVAL ? MICROSECOND) \
             ORDER BY {next}, id LIMIT ? FOR UPDATE SKIP LOCKED",
            table = self.table,
            status = self.status,
            due = self.due,
            next = self.next_attempt_at
        );
        let ids: Vec<u64> = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(clock.sql_now())
            .bind(clock.sql_now())
            .bind(micros(stale_after))
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
        if ids.is_empty() {
            return Ok(ids);
        }
        let sql = format!(
            "UPDATE {} {BY_ID} SET {marker} = {NOW} WHERE id IN ({})",
            self.table,
            db::placeholders(ids.len())
        );
        update_stamped(conn, sql, &ids, clock).await?;
        Ok(ids)
    }
}

/// A claimed row as read back: id, attempts column, claim stamp, whether it had failed before.
type ClaimedRow = (u64, u64, Option<DateTime<Utc>>, u64);

/// Runs `sql`, an UPDATE whose one clock parameter precedes the `ids` of its `id IN (…)`.
async fn update_stamped(
    conn: &mut MySqlConnection,
    sql: String,
    ids: &[u64],
    clock: &Clock,
) -> Result<(), sqlx::Error> {
    ids.iter()
        .fold(
            sqlx::query(AssertSqlSafe(sql)).bind(clock.sql_now()),
            |query, id| query.bind(*id),
        )
        .execute(&mut *conn)
        .await?;
    Ok(())
}

fn claim_of((id, attempts, claimed_at, failed_before): ClaimedRow) -> Claim {
    Claim {
        id,
        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        claimed_at,
        failed_before: failed_before != 0,
    }
}
