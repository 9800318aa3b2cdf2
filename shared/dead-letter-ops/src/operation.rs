//! Operations: a dry run bound to what it showed, so what was previewed (and approved) is what
//! runs, and letters that arrive after the dry run are never acted on unseen.
//!
//! [`request`] freezes the selection's NEW letters into an operation: their ids with the verdict
//! each had, a hash of that list ([`Operation::content_hash`]), an expiry. [`execute`] acts on
//! those letters only, each in a transaction of its own that locks the letter's operation row
//! first and writes its result there: two executions at once, or one run twice, act on each
//! letter once, and one that dies mid-way leaves the rest to the next
//! ([`ExecutionReport::by_another_execution`] counts what another execution did).
//!
//! Four-eyes (`paybus_ops::approvals::FourEyes`): a replay, or an archive of letters with
//! money at stake, runs only after a second person approved its hash ([`approve`]), and the
//! execution checks the frozen list still has that hash. [`OperationStatus`]:
//! AWAITING_APPROVAL → READY → RUNNING → DONE; one not started before its expiry never starts,
//! one started may always be finished.

use chrono::{DateTime, Utc};
use paybus_bus::Outbox;
use paybus_ops::actor::Actor;
use paybus_ops::{
    approvals::{FourEyes, Guarded, NotSecondPerson, awaiting_approval, second_person},
    ops_log,
    triage::Verdict,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::{MySql, MySqlConnection, MySqlPool, QueryBuilder};
use uuid::Uuid;

use crate::{
    DeadLetterError, Triager,
    letter::{MAX_PAGE, Selection},
    replay::{self, ReplayResult},
    trail::ActionResult,
};

paybus_db::column_enum! {
    /// `dead_letter_operations.action`.
    #[strum(ascii_case_insensitive)]
    pub enum OperationAction {
        /// Re-send the letters that were safe at the dry run and are safe again when their
        /// turn comes.
        Replay,
        /// Put the letters aside.
        Archive,
    }
}

paybus_db::column_enum! {
    /// `dead_letter_operations.status` (the migration's header comment is the reference).
    pub enum OperationStatus {
        /// Four-eyes: waits for a second person to approve its hash.
        AwaitingApproval,
        /// May be executed (approved, or no approval needed).
        Ready,
        /// Started; the letters without a result are left.
        Running,
        /// Every letter has its result.
        Done,
    }
}

/// Whether an operation needs a second person: a replay when four-eyes guards replays, an
/// archive when it guards archives and a letter has money at stake.
fn needs_approval(four_eyes: &FourEyes, action: OperationAction, money_at_stake: bool) -> bool {
    match action {
        OperationAction::Replay => four_eyes.requires(Guarded::Replay),
        OperationAction::Archive => four_eyes.requires(Guarded::Archive) && money_at_stake,
    }
}

/// An operation as stored, with whether it has expired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Operation {
    pub id: Uuid,
    pub action: OperationAction,
    /// How the letters were chosen (`{"ids": [..]}` or `{"group": {..}}`).
    pub selection: serde_json::Value,
    /// How many letters it holds.
    pub letters: u32,
    /// Of them, letters the dry run found with money at stake.
    pub letters_with_money: u32,
    /// SHA-256 over its id, action and letters with their verdicts: what an approver approves.
    pub content_hash: String,
    pub status: OperationStatus,
    pub approval_required: bool,
    /// Who asked, as people read it; the issuer and subject say who that is (`null` on an
    /// operation requested before identities were recorded: it can no longer be approved).
    pub requested_by: String,
    pub requested_by_issuer: Option<String>,
    pub requested_by_subject: Option<String>,
    pub requested_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Not started and past `expires_at`: it can no longer be approved or started.
    pub expired: bool,
    pub approved_by: Option<String>,
    pub approved_at: Option<DateTime<Utc>>,
    pub executed_by: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Letters with their result so far (the progress).
    pub done: u32,
}

#[derive(sqlx::FromRow)]
struct OperationRow {
    id: String,
    action: String,
    selection: String,
    letters: u32,
    letters_with_money: u32,
    content_hash: String,
    status: String,
    approval_required: bool,
    requested_by: String,
    requested_by_issuer: Option<String>,
    requested_by_subject: Option<String>,
    requested_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    past_expiry: bool,
    approved_by: Option<String>,
    approved_at: Option<DateTime<Utc>>,
    executed_by: Option<String>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    done: u32,
}

const OPERATION_COLUMNS: &str = "id, action, selection, letters, letters_with_money, content_hash, status, \
     approval_required, requested_by, requested_by_issuer, requested_by_subject, requested_at, \
     expires_at, (expires_at < NOW(6)) AS past_expiry, approved_by, approved_at, executed_by, started_at, \
     finished_at, done";

impl OperationRow {
    fn into_operation(self) -> Result<Operation, DeadLetterError> {
        let unknown = |column: &str, value: &str| {
            DeadLetterError::Invalid(format!(
                "operation {} has {column} {value:?}, which this code does not know",
                self.id
            ))
        };
        let status: OperationStatus = self
            .status
            .parse()
            .map_err(|_| unknown("status", &self.status))?;
        let not_started = matches!(
            status,
            OperationStatus::AwaitingApproval | OperationStatus::Ready
        );
        Ok(Operation {
            id: Uuid::parse_str(&self.id).map_err(|_| unknown("id", &self.id))?,
            action: self
                .action
                .parse()
                .map_err(|_| unknown("action", &self.action))?,
            selection: serde_json::from_str(&self.selection)
                .unwrap_or(serde_json::Value::String(self.selection.clone())),
            letters: self.letters,
            letters_with_money: self.letters_with_money,
            content_hash: self.content_hash,
            status,
            approval_required: self.approval_required,
            requested_by: self.requested_by,
            requested_by_issuer: self.requested_by_issuer,
            requested_by_subject: self.requested_by_subject,
            requested_at: self.requested_at,
            expires_at: self.expires_at,
            expired: not_started && self.past_expiry,
            approved_by: self.approved_by,
            approved_at: self.approved_at,
            executed_by: self.executed_by,
            started_at: self.started_at,
            finished_at: self.finished_at,
            done: self.done,
        })
    }
}

/// One letter of an operation: the verdict it was frozen with and, once acted on, the result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct OperationLetter {
    pub dead_letter_id: u64,
    /// The dry run's verdict (`safe`, `already_applied`, `needs_human`).
    pub verdict: String,
    pub reason: String,
    /// REPLAYED, NOT_SENT, ARCHIVED or SKIPPED; `None` until acted on.
    pub result: Option<String>,
    pub detail: String,
    pub done_at: Option<DateTime<Utc>>,
}

/// An operation with its letters and the dry run's counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperationDetail {
    #[serde(flatten)]
    pub operation: Operation,
    pub safe: u64,
    pub already_applied: u64,
    pub needs_human: u64,
    /// NEW letters of the selection beyond the operation's limit, not in it.
    pub not_included: u64,
    pub letter_results: Vec<OperationLetter>,
}

/// What the letters of an operation hash to (the approver's and the executor's check).
fn content_hash(id: Uuid, action: OperationAction, letters: &[(u64, String)]) -> String {
    let mut sorted: Vec<&(u64, String)> = letters.iter().collect();
    sorted.sort();
    let mut hasher = Sha256::new();
    hasher.update(format!("paybus dead-letter operation v1\n{id}\n{action}\n"));
    for (letter, verdict) in sorted {
        hasher.update(format!("{letter} {verdict}\n"));
    }
    hex::encode(hasher.finalize())
}

/// Classifies the selection's NEW letters (oldest first, at most `limit`) and freezes them into
/// an operation of `actor`'s (see the module docs). Nothing is acted on.
pub async fn request(
    pool: &MySqlPool,
    triager: &Triager,
    action: OperationAction,
    selection: &Selection,
    actor: &Actor,
    limit: u32,
    four_eyes: &FourEyes,
) -> Result<OperationDetail, DeadLetterError> {
    let run = replay::dry_run(pool, triager, selection, limit.clamp(1, MAX_PAGE)).await?;
    if run.letters.is_empty() {
        return Err(DeadLetterError::NothingSelected);
    }
    let id = Uuid::now_v7();
    let frozen: Vec<(u64, String)> = run
        .letters
        .iter()
        .map(|c| (c.letter.id, c.triage.verdict.to_string()))
        .collect();
    let with_money_at_stake = run
        .letters
        .iter()
        .filter(|c| c.triage.exposure.is_some())
        .count() as u64;
    // A replay with nothing safe in it would send nothing: no second person is needed to
    // approve that.
    let nothing_to_send = action == OperationAction::Replay && run.safe == 0;
    let approval_required =
        needs_approval(four_eyes, action, with_money_at_stake > 0) && !nothing_to_send;
    if approval_required && !actor.is_person() {
        return Err(DeadLetterError::NotAPerson(format!(
            "{} cannot request a four-eyes operation: it needs two people the identity \
             provider vouches for (sign in with the provider, or switch four-eyes off with \
             PAYBUS_FOUR_EYES)",
            actor.name
        )));
    }
    let status = if approval_required {
        OperationStatus::AwaitingApproval
    } else {
        OperationStatus::Ready
    };
    let selection_text = serde_json::to_string(selection)
        .map_err(|e| DeadLetterError::Invalid(format!("the selection: {e}")))?;
    let hash = content_hash(id, action, &frozen);
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO dead_letter_operations \
         (id, action, selection, letters, letters_with_money, content_hash, status, \
          approval_required, requested_by, requested_by_issuer, requested_by_subject, \
          requested_at, expires_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NOW(6), NOW(6) + INTERVAL ? SECOND)",
    )
    .bind(id.to_string())
    .bind(<&str>::from(action))
    .bind(selection_text.chars().take(1000).collect::<String>())
    .bind(u32::try_from(frozen.len()).unwrap_or(u32::MAX))
    .bind(u32::try_from(with_money_at_stake).unwrap_or(u32::MAX))
    .bind(&hash)
    .bind(<&str>::from(status))
    .bind(approval_required)
    .bind(actor.name.chars().take(100).collect::<String>())
    .bind(&actor.issuer)
    .bind(&actor.subject)
    .bind(four_eyes.ttl.as_secs())
    .execute(&mut *tx)
    .await?;
    let mut insert = QueryBuilder::<MySql>::new(
        "INSERT INTO dead_letter_operation_letters (operation_id, dead_letter_id, verdict, reason) ",
    );
    insert.push_values(&run.letters, |mut row, classified| {
        row.push_bind(id.to_string())
            .push_bind(classified.letter.id)
            .push_bind(classified.triage.verdict.to_string())
            .push_bind(
                classified
                    .triage
                    .reason
                    .chars()
                    .take(1000)
                    .collect::<String>(),
            );
    });
    insert.build().execute(&mut *tx).await?;
    ops_log::append(
        &mut tx,
        &ops_log::Entry {
            actor,
            action: "dead_letter_operation.request",
            subject: &format!("dead_letter_operation:{id}"),
            detail: &serde_json::json!({
                "action": action,
                "letters": frozen.len(),
                "letters_with_money": with_money_at_stake,
                "approval_required": approval_required,
                "content_hash": hash,
                "selection": selection,
            }),
        },
    )
    .await?;
    tx.commit().await?;
    tracing::info!(operation = %id, %action, actor = actor.name, letters = frozen.len(), approval_required,
        "dead-letter operation requested");
    let mut detail = show(&mut *pool.acquire().await?, id)
        .await?
        .ok_or(DeadLetterError::OperationNotFound(id))?;
    detail.not_included = run.remaining;
    Ok(detail)
}

/// The operation `id` with its letters, or `None`.
pub async fn show(
    conn: &mut MySqlConnection,
    id: Uuid,
) -> Result<Option<OperationDetail>, DeadLetterError> {
    let Some(operation) = find(conn, id, "").await? else {
        return Ok(None);
    };
    let letter_results: Vec<OperationLetter> = sqlx::query_as(
        "SELECT dead_letter_id, verdict, reason, result, detail, done_at \
         FROM dead_letter_operation_letters WHERE operation_id = ? ORDER BY dead_letter_id",
    )
    .bind(id.to_string())
    .fetch_all(&mut *conn)
    .await?;
    let count = |verdict: Verdict| {
        let verdict = verdict.to_string();
        letter_results
            .iter()
            .filter(|l| l.verdict == verdict)
            .count() as u64
    };
    Ok(Some(OperationDetail {
        safe: count(Verdict::Safe),
        already_applied: count(Verdict::AlreadyApplied),
        needs_human: count(Verdict::NeedsHuman),
        not_included: 0,
        operation,
        letter_results,
    }))
}

/// Recent operations, newest first (at most `limit`).
pub async fn list(
    conn: &mut MySqlConnection,
    limit: u32,
) -> Result<Vec<Operation>, DeadLetterError> {
    let sql = format!(
        "SELECT {OPERATION_COLUMNS} FROM dead_letter_operations \
         ORDER BY requested_at DESC, id DESC LIMIT ?"
    );
    let rows: Vec<OperationRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(limit.clamp(1, MAX_PAGE))
        .fetch_all(conn)
        .await?;
    rows.into_iter().map(OperationRow::into_operation).collect()
}

async fn find(
    conn: &mut MySqlConnection,
    id: Uuid,
    lock: &str,
) -> Result<Option<Operation>, DeadLetterError> {
    let sql = format!("SELECT {OPERATION_COLUMNS} FROM dead_letter_operations WHERE id = ?{lock}");
    sqlx::query_as::<_, OperationRow>(sqlx::AssertSqlSafe(sql))
        .bind(id.to_string())
        .fetch_optional(conn)
        .await?
        .map(OperationRow::into_operation)
        .transpose()
}

/// The hash of the letters as they are stored now (a changed row changes it).
async fn stored_hash(
    conn: &mut MySqlConnection,
    operation: &Operation,
) -> Result<String, DeadLetterError> {
    let letters: Vec<(u64, String)> = sqlx::query_as(
        "SELECT dead_letter_id, verdict FROM dead_letter_operation_letters \
         WHERE operation_id = ?",
    )
    .bind(operation.id.to_string())
    .fetch_all(conn)
    .await?;
    Ok(content_hash(operation.id, operation.action, &letters))
}

async fn check_integrity(
    conn: &mut MySqlConnection,
    operation: &Operation,
) -> Result<(), DeadLetterError> {
    if stored_hash(conn, operation).await? != operation.content_hash {
        return Err(DeadLetterError::OperationTampered(operation.id));
    }
    Ok(())
}

/// The second person's approval: `actor` (not the requester) approves the operation whose
/// hash they saw. Refused when it is not awaiting approval, has expired, was requested by
/// `actor`, or `hash` is not its hash.
pub async fn approve(
    conn: &mut MySqlConnection,
    id: Uuid,
    actor: &Actor,
    hash: &str,
) -> Result<Operation, DeadLetterError> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let checked = approvable(&mut tx, id, actor, hash).await;
    let operation = match checked {
        Ok(operation) => operation,
        Err(refused) => {
            // The operation's row lock goes now, not whenever this connection is next used.
            tx.rollback().await?;
            return Err(refused);
        }
    };
    sqlx::query(
        "UPDATE dead_letter_operations \
         SET status = 'READY', approved_by = ?, approved_by_issuer = ?, \
         approved_by_subject = ?, approved_at = NOW(6) WHERE id = ?",
    )
    .bind(actor.name.chars().take(100).collect::<String>())
    .bind(&actor.issuer)
    .bind(&actor.subject)
    .bind(id.to_string())
    .execute(&mut *tx)
    .await?;
    ops_log::append(
        &mut tx,
        &ops_log::Entry {
            actor,
            action: "dead_letter_operation.approve",
            subject: &format!("dead_letter_operation:{id}"),
            detail: &serde_json::json!({
                "requested_by": operation.requested_by,
                "content_hash": operation.content_hash,
            }),
        },
    )
    .await?;
    tx.commit().await?;
    tracing::warn!(operation = %id, actor = actor.name, requested_by = operation.requested_by,
        "dead-letter operation approved");
    find(conn, id, "")
        .await?
        .ok_or(DeadLetterError::OperationNotFound(id))
}

/// The operation, locked, when `actor` may approve it with `hash`.
async fn approvable(
    conn: &mut MySqlConnection,
    id: Uuid,
    actor: &Actor,
    hash: &str,
) -> Result<Operation, DeadLetterError> {
    let operation = find(conn, id, " FOR UPDATE")
        .await?
        .ok_or(DeadLetterError::OperationNotFound(id))?;
    awaiting_approval(
        operation.status == OperationStatus::AwaitingApproval,
        operation.status,
        operation.expired,
        operation.expires_at,
    )
    .map_err(|problem| DeadLetterError::OperationState { id, problem })?;
    if !actor.is_person() {
        return Err(DeadLetterError::NotAPerson(format!(
            "{} cannot approve a four-eyes operation: it needs two people the identity \
             provider vouches for",
            actor.name
        )));
    }
    let requester = (
        operation.requested_by_issuer.as_deref(),
        operation.requested_by_subject.as_deref(),
    );
    match second_person(requester, actor) {
        Ok(()) => {}
        Err(NotSecondPerson::RequesterUnidentified) => {
            return Err(DeadLetterError::NotAPerson(format!(
                "operation {id} was requested before requesters were identified by the \
                 identity provider: request it again"
            )));
        }
        Err(NotSecondPerson::SamePerson) => return Err(DeadLetterError::SelfApproval(id)),
    }
    if !hash.eq_ignore_ascii_case(&operation.content_hash) {
        return Err(DeadLetterError::OperationState {
            id,
            problem: "the hash given is not its hash: approve the operation you saw".to_owned(),
        });
    }
    check_integrity(conn, &operation).await?;
    Ok(operation)
}

/// How an execution runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExecuteOptions {
    /// The most letters taken a second (default 10).
    pub per_second: f64,
    /// The most letters one call takes (default and most: 500); the rest are left for the
    /// next call, which resumes.
    pub limit: u32,
}

impl Default for ExecuteOptions {
    fn default() -> Self {
        Self {
            per_second: replay::DEFAULT_PER_SECOND,
            limit: MAX_PAGE,
        }
    }
}

/// What one call of [`execute`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecutionReport {
    pub operation: Operation,
    pub replayed: u64,
    pub archived: u64,
    pub already_applied: u64,
    pub needs_human: u64,
    /// Letters no longer NEW when their turn came.
    pub skipped: u64,
    /// Letters another execution of this operation acted on while this one ran (their
    /// results are the operation's, in `letter_results`), not counted above.
    pub by_another_execution: u64,
    /// This call's results, letter by letter.
    pub results: Vec<ReplayResult>,
    /// Letters of the operation still without a result (call again to go on).
    pub remaining: u64,
}

/// Executes (or resumes) operation `id` as `actor`: at most `options.limit` of its letters
/// without a result, each once (see the module docs). `progress` sees each letter's result
/// as it is committed.
pub async fn execute(
    outbox: &Outbox,
    triager: &Triager,
    id: Uuid,
    actor: &Actor,
    options: ExecuteOptions,
    mut progress: impl FnMut(&ReplayResult) + Send,
) -> Result<ExecutionReport, DeadLetterError> {
    let pool = outbox.pool();
    let operation = {
        let mut tx = pool.begin().await?;
        match start(&mut tx, id, actor).await {
            Ok(operation) => {
                tx.commit().await?;
                operation
            }
            Err(refused) => {
                tx.rollback().await?;
                return Err(refused);
            }
        }
    };
    let pending: Vec<u64> = sqlx::query_scalar(
        "SELECT dead_letter_id FROM dead_letter_operation_letters \
         WHERE operation_id = ? AND result IS NULL ORDER BY dead_letter_id LIMIT ?",
    )
    .bind(id.to_string())
    .bind(options.limit.clamp(1, MAX_PAGE))
    .fetch_all(pool)
    .await?;
    let mut report = ExecutionReport {
        operation,
        replayed: 0,
        archived: 0,
        already_applied: 0,
        needs_human: 0,
        skipped: 0,
        by_another_execution: 0,
        results: Vec::with_capacity(pending.len()),
        remaining: 0,
    };
    let mut pace = replay::pace(options.per_second);
    for letter_id in pending {
        pace.tick().await;
        let Some(result) = act_on(outbox, triager, &report.operation, letter_id, actor).await?
        else {
            report.by_another_execution += 1;
            continue;
        };
        match (result.result, result.verdict) {
            (ActionResult::Replayed, _) => report.replayed += 1,
            (ActionResult::Archived, _) => report.archived += 1,
            (_, Some(Verdict::AlreadyApplied)) => report.already_applied += 1,
            (ActionResult::Skipped, _) | (_, None) => report.skipped += 1,
            (_, Some(_)) => report.needs_human += 1,
        }
        progress(&result);
        report.results.push(result);
    }
    let remaining: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM dead_letter_operation_letters \
         WHERE operation_id = ? AND result IS NULL",
    )
    .bind(id.to_string())
    .fetch_one(pool)
    .await?;
    report.remaining = u64::try_from(remaining).unwrap_or(0);
    if report.remaining == 0 {
        sqlx::query(
            "UPDATE dead_letter_operations SET status = 'DONE', finished_at = NOW(6) \
             WHERE id = ? AND status = 'RUNNING'",
        )
        .bind(id.to_string())
        .execute(pool)
        .await?;
    }
    let mut conn = pool.acquire().await?;
    report.operation = find(&mut conn, id, "")
        .await?
        .ok_or(DeadLetterError::OperationNotFound(id))?;
    tracing::info!(operation = %id, actor = actor.name, replayed = report.replayed,
        archived = report.archived, remaining = report.remaining, "dead-letter operation executed");
    Ok(report)
}

/// Locks the operation and marks it RUNNING when it may run (a RUNNING one resumes, a DONE one
/// has nothing left); the reason when it may not.
async fn start(
    conn: &mut MySqlConnection,
    id: Uuid,
    actor: &Actor,
) -> Result<Operation, DeadLetterError> {
    let operation = find(conn, id, " FOR UPDATE")
        .await?
        .ok_or(DeadLetterError::OperationNotFound(id))?;
    match operation.status {
        OperationStatus::AwaitingApproval if operation.expired => {
            Err(DeadLetterError::OperationState {
                id,
                problem: format!(
                    "it expired at {} before a second ADMIN approved it: request it again",
                    operation.expires_at.to_rfc3339()
                ),
            })
        }
        OperationStatus::AwaitingApproval => Err(DeadLetterError::OperationState {
            id,
            problem: "it awaits the approval of a second ADMIN".to_owned(),
        }),
        OperationStatus::Ready if operation.expired => Err(DeadLetterError::OperationState {
            id,
            problem: format!(
                "it expired at {} without being started: request it again",
                operation.expires_at.to_rfc3339()
            ),
        }),
        OperationStatus::Ready => {
            check_integrity(conn, &operation).await?;
            sqlx::query(
                "UPDATE dead_letter_operations SET status = 'RUNNING', \
                 executed_by = ?, started_at = NOW(6) WHERE id = ?",
            )
            .bind(actor.name.chars().take(100).collect::<String>())
            .bind(id.to_string())
            .execute(conn)
            .await?;
            Ok(operation)
        }
        OperationStatus::Running => {
            check_integrity(conn, &operation).await?;
            Ok(operation)
        }
        OperationStatus::Done => Ok(operation),
    }
}

/// Acts on one letter of `operation` in a transaction of its own; `None` when another
/// execution acted on it first.
async fn act_on(
    outbox: &Outbox,
    triager: &Triager,
    operation: &Operation,
    letter_id: u64,
    actor: &Actor,
) -> Result<Option<ReplayResult>, DeadLetterError> {
    let mut uow = outbox.begin().await?;
    match act_in(&mut uow, triager, operation, letter_id, actor).await {
        Ok(Some(result)) => {
            uow.commit().await?;
            Ok(Some(result))
        }
        Ok(None) => {
            uow.rollback().await?;
            Ok(None)
        }
        Err(failed) => {
            // The letter's locks go now, not whenever this connection is next used.
            uow.rollback().await?;
            Err(failed)
        }
    }
}

async fn act_in(
    uow: &mut paybus_bus::UnitOfWork<'_>,
    triager: &Triager,
    operation: &Operation,
    letter_id: u64,
    actor: &Actor,
) -> Result<Option<ReplayResult>, DeadLetterError> {
    // The operation's row for this letter is the claim: locked first, so a concurrent
    // execution waits here and then finds the result written.
    let frozen: Option<(String, Option<String>)> = sqlx::query_as(
        "SELECT verdict, result FROM dead_letter_operation_letters \
         WHERE operation_id = ? AND dead_letter_id = ? FOR UPDATE",
    )
    .bind(operation.id.to_string())
    .bind(letter_id)
    .fetch_optional(&mut **uow)
    .await?;
    let Some((verdict, None)) = frozen else {
        return Ok(None);
    };
    let frozen: Verdict = verdict
        .parse()
        .map_err(|_| DeadLetterError::OperationTampered(operation.id))?;
    let result = match operation.action {
        OperationAction::Replay if frozen == Verdict::Safe => {
            replay::replay_locked(uow, triager, letter_id, &actor.name, Some(operation.id)).await?
        }
        OperationAction::Replay => {
            replay::not_previewed_safe(uow, letter_id, frozen, &actor.name, operation.id).await?
        }
        OperationAction::Archive => {
            replay::archive_locked(uow, letter_id, &actor.name, Some(operation.id)).await?
        }
    };
    let result_name: &str = result.result.into();
    sqlx::query(
        "UPDATE dead_letter_operation_letters SET result = ?, detail = ?, done_at = NOW(6) \
         WHERE operation_id = ? AND dead_letter_id = ?",
    )
    .bind(result_name)
    .bind(result.detail.chars().take(1000).collect::<String>())
    .bind(operation.id.to_string())
    .bind(letter_id)
    .execute(&mut **uow)
    .await?;
    sqlx::query("UPDATE dead_letter_operations SET done = done + 1 WHERE id = ?")
        .bind(operation.id.to_string())
        .execute(&mut **uow)
        .await?;
    // Only what changed something is an ops action; a letter left NEW is on its trail.
    let logged = match result.result {
        ActionResult::Replayed => Some("dead_letter.replay"),
        ActionResult::Archived => Some("dead_letter.archive"),
        ActionResult::NotSent | ActionResult::Skipped => None,
    };
    if let Some(action) = logged {
        ops_log::append(
            uow,
            &ops_log::Entry {
                actor,
                action,
                subject: &format!("dead_letter:{letter_id}"),
                detail: &serde_json::json!({
                    "operation": operation.id,
                    "function": result.function_name,
                    "verdict": result.verdict,
                    "replay_message_id": result.replay_message_id,
                }),
            },
        )
        .await?;
    }
    Ok(Some(result))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_archive_needs_approval_only_with_money_at_stake() {
        let four_eyes = FourEyes::default();
        assert!(needs_approval(&four_eyes, OperationAction::Replay, false));
        assert!(needs_approval(&four_eyes, OperationAction::Archive, true));
        assert!(!needs_approval(&four_eyes, OperationAction::Archive, false));
        let replays_only = FourEyes::only(&[Guarded::Replay]);
        assert!(!needs_approval(
            &replays_only,
            OperationAction::Archive,
            true
        ));
    }

    #[test]
    fn the_hash_covers_the_letters_and_their_verdicts_in_any_order() {
        let id = Uuid::now_v7();
        let letters = [(1, "safe".to_owned()), (2, "needs_human".to_owned())];
        let reversed = [letters[1].clone(), letters[0].clone()];
        let hash = content_hash(id, OperationAction::Replay, &letters);
        assert_eq!(hash, content_hash(id, OperationAction::Replay, &reversed));
        assert_ne!(hash, content_hash(id, OperationAction::Archive, &letters));
        let changed = [(1, "safe".to_owned()), (2, "safe".to_owned())];
        assert_ne!(hash, content_hash(id, OperationAction::Replay, &changed));
        assert_ne!(
            hash,
            content_hash(Uuid::now_v7(), OperationAction::Replay, &letters)
        );
    }
}
