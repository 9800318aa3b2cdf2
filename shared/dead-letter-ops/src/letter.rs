//! A dead letter as stored, the list, one letter in full, and what an action selects.
//!
//! `dead_letters.status` (the migration's header comment is the reference): NEW (recorded by
//! the dead-letter recorders) → REPLAYED (by [`crate::replay::replay`], when the triage said
//! safe and the message was re-sent) or ARCHIVED (by [`crate::replay::archive`]). Only NEW
//! letters are ever acted on. A new failure of a REPLAYED or ARCHIVED letter's message makes it
//! NEW again (`reopened_at`, `failures` counted: the platform's `dead_letter::record_failure`).

use chrono::{DateTime, Utc};
use paybus_bus::dead_letter::group_counts;
use serde::{Deserialize, Serialize};
use sqlx::{MySql, MySqlConnection, QueryBuilder};

use crate::DeadLetterError;

paybus_db::column_enum! {
    /// `dead_letters.status`.
    #[derive(Default)]
    #[strum(ascii_case_insensitive)]
    pub enum LetterStatus {
        /// Waiting for ops.
        #[default]
        New,
        /// Re-sent through the outbox after a safe triage.
        Replayed,
        /// Put aside by ops.
        Archived,
    }
}

impl LetterStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A dead letter without its body and headers (the list view).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    pub id: u64,
    pub dead_letter_id: String,
    pub function_name: String,
    pub message_id: Option<String>,
    pub correlation_id: Option<String>,
    pub routing_key: String,
    pub reason: String,
    pub error: String,
    pub attempts: u32,
    /// The first failure.
    pub failed_at: DateTime<Utc>,
    /// How often its message failed: each new failure of the same message counts (a DLQ
    /// redelivering the same dead letter does not).
    pub failures: u32,
    /// The latest failure (`None` before failures were counted: `failed_at`).
    pub last_failed_at: Option<DateTime<Utc>>,
    /// When a failure after an archive or a replay made it NEW again.
    pub reopened_at: Option<DateTime<Utc>>,
    pub status: LetterStatus,
    pub replayed_at: Option<DateTime<Utc>>,
    pub archived_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct LetterRow {
    id: u64,
    dead_letter_id: String,
    function_name: String,
    message_id: Option<String>,
    correlation_id: Option<String>,
    routing_key: String,
    reason: String,
    error: String,
    attempts: u32,
    failed_at: DateTime<Utc>,
    failures: u32,
    last_failed_at: Option<DateTime<Utc>>,
    reopened_at: Option<DateTime<Utc>>,
    status: String,
    replayed_at: Option<DateTime<Utc>>,
    archived_at: Option<DateTime<Utc>>,
}

impl LetterRow {
    fn into_letter(self) -> DeadLetter {
        DeadLetter {
            // An unknown status (written by hand) reads as NEW: it is shown, and an action
            // re-checks the column itself before acting.
            status: self.status.parse().unwrap_or_default(),
            id: self.id,
            dead_letter_id: self.dead_letter_id,
            function_name: self.function_name,
            message_id: self.message_id,
            correlation_id: self.correlation_id,
            routing_key: self.routing_key,
            reason: self.reason,
            error: self.error,
            attempts: self.attempts,
            failed_at: self.failed_at,
            failures: self.failures,
            last_failed_at: self.last_failed_at,
            reopened_at: self.reopened_at,
            replayed_at: self.replayed_at,
            archived_at: self.archived_at,
        }
    }
}

const COLUMNS: &str = "id, dead_letter_id, function_name, message_id, correlation_id, \
     routing_key, reason, error, attempts, failed_at, failures, last_failed_at, reopened_at, \
     status, replayed_at, archived_at";

/// Which letters a list shows: newest first, paged by id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ListFilter {
    pub function: Option<String>,
    pub reason: Option<String>,
    pub status: Option<LetterStatus>,
    /// Letters with an id below this one (the previous page's last id).
    pub before_id: Option<u64>,
    pub limit: Option<u32>,
}

/// The most letters one page or one action takes.
pub const MAX_PAGE: u32 = 500;

/// The letters `filter` selects (status NEW unless it says otherwise), newest first.
pub async fn list(
    conn: &mut MySqlConnection,
    filter: &ListFilter,
) -> Result<Vec<DeadLetter>, DeadLetterError> {
    let mut query = QueryBuilder::<MySql>::new(format!("SELECT {COLUMNS} FROM dead_letters"));
    query
        .push(" WHERE status = ")
        .push_bind(filter.status.unwrap_or_default().as_str());
    if let Some(function) = &filter.function {
        query.push(" AND function_name = ").push_bind(function);
    }
    if let Some(reason) = &filter.reason {
        query.push(" AND reason = ").push_bind(reason);
    }
    if let Some(before) = filter.before_id {
        query.push(" AND id < ").push_bind(before);
    }
    query
        .push(" ORDER BY id DESC LIMIT ")
        .push_bind(filter.limit.unwrap_or(50).clamp(1, MAX_PAGE));
    let rows: Vec<LetterRow> = query.build_query_as().fetch_all(conn).await?;
    Ok(rows.into_iter().map(LetterRow::into_letter).collect())
}

/// One letter with its body, or `None`.
pub async fn find(
    conn: &mut MySqlConnection,
    id: u64,
) -> Result<Option<(DeadLetter, Vec<u8>)>, DeadLetterError> {
    letter_with_body(conn, id, "").await
}

#[derive(sqlx::FromRow)]
struct LetterWithBody {
    #[sqlx(flatten)]
    letter: LetterRow,
    body: Vec<u8>,
}

/// The NEW letters after `after_id`, oldest first, with their bodies: one statement for a
/// page of them (the overview's money-at-stake scan read each letter twice by id, which
/// was most of its time).
pub(crate) async fn new_after(
    conn: &mut MySqlConnection,
    after_id: u64,
    limit: u32,
) -> Result<Vec<(DeadLetter, Vec<u8>)>, DeadLetterError> {
    // Forced: the index hands the NEW letters over in id order from the cursor on. At 5M
    // letters the optimizer sometimes chose another (status, ...) index and sorted every
    // NEW letter with its body instead — seconds instead of a millisecond.
    let sql = format!(
        "SELECT {COLUMNS}, body FROM dead_letters \
         FORCE INDEX (index_dead_letters_new_in_order) \
         WHERE status = 'NEW' AND id > ? ORDER BY id LIMIT ?"
    );
    let rows: Vec<LetterWithBody> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(after_id)
        .bind(limit)
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.letter.into_letter(), row.body))
        .collect())
}

/// The letters of `ids` that exist, with their bodies, in id order: one statement where
/// [`find`] per id was two (the dry run's 500 letters).
pub(crate) async fn with_bodies(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> Result<Vec<(DeadLetter, Vec<u8>)>, DeadLetterError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = QueryBuilder::<MySql>::new(format!(
        "SELECT {COLUMNS}, body FROM dead_letters WHERE id IN ("
    ));
    let mut separated = query.separated(", ");
    for id in ids {
        separated.push_bind(*id);
    }
    query.push(") ORDER BY id");
    let rows: Vec<LetterWithBody> = query.build_query_as().fetch_all(conn).await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.letter.into_letter(), row.body))
        .collect())
}

/// [`find`], locked until the caller's transaction ends (what an action decides on).
pub(crate) async fn lock(
    conn: &mut MySqlConnection,
    id: u64,
) -> Result<Option<(DeadLetter, Vec<u8>)>, DeadLetterError> {
    letter_with_body(conn, id, " FOR UPDATE").await
}

async fn letter_with_body(
    conn: &mut MySqlConnection,
    id: u64,
    lock: &str,
) -> Result<Option<(DeadLetter, Vec<u8>)>, DeadLetterError> {
    let sql = format!("SELECT {COLUMNS} FROM dead_letters WHERE id = ?{lock}");
    let Some(row) = sqlx::query_as::<_, LetterRow>(sqlx::AssertSqlSafe(sql.clone()))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let body: Vec<u8> = sqlx::query_scalar("SELECT body FROM dead_letters WHERE id = ?")
        .bind(id)
        .fetch_one(conn)
        .await?;
    Ok(Some((row.into_letter(), body)))
}

/// Which letters an action (dry run, replay, archive) takes: only NEW ones, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Selection {
    /// These letters (one or several).
    Ids(Vec<u64>),
    /// Every NEW letter of one function and reason.
    Group { function: String, reason: String },
}

/// The NEW letters of `selection`, oldest first, at most `limit`.
pub async fn selected_ids(
    conn: &mut MySqlConnection,
    selection: &Selection,
    limit: u32,
) -> Result<Vec<u64>, DeadLetterError> {
    let mut query = selecting("SELECT id", selection)?;
    query.push(" ORDER BY id LIMIT ").push_bind(limit);
    Ok(query.build_query_scalar().fetch_all(conn).await?)
}

/// How many NEW letters `selection` has in all (what is left after a limited action). A
/// group's from its counts (exact: kept in the transactions that move letters), not by
/// counting its letters.
pub async fn count_selected(
    conn: &mut MySqlConnection,
    selection: &Selection,
) -> Result<u64, DeadLetterError> {
    let count: i64 = match selection {
        Selection::Group { function, reason } => {
            group_counts::letters_of(conn, function, reason).await?
        }
        Selection::Ids(_) => {
            selecting("SELECT COUNT(*)", selection)?
                .build_query_scalar()
                .fetch_one(conn)
                .await?
        }
    };
    Ok(u64::try_from(count).unwrap_or(0))
}

/// `select` over the NEW letters of `selection` (the group by index_dead_letters_by_function_reason).
fn selecting(select: &str, selection: &Selection) -> Result<QueryBuilder<MySql>, DeadLetterError> {
    let mut query = QueryBuilder::<MySql>::new(select);
    query.push(" FROM dead_letters WHERE status = 'NEW'");
    match selection {
        Selection::Ids(ids) => {
            if ids.is_empty() {
                return Err(DeadLetterError::Invalid(
                    "select at least one dead letter id".to_owned(),
                ));
            }
            if ids.len() > MAX_PAGE as usize {
                return Err(DeadLetterError::Invalid(format!(
                    "select at most {MAX_PAGE} dead letters by id (or a whole group)"
                )));
            }
            query.push(" AND id IN (");
            let mut list = query.separated(", ");
            for id in ids {
                list.push_bind(*id);
            }
            query.push(")");
        }
        Selection::Group { function, reason } => {
            query
                .push(" AND function_name = ")
                .push_bind(function)
                .push(" AND reason = ")
                .push_bind(reason);
        }
    }
    Ok(query)
}
