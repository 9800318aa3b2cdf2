//! A letter's trail (`dead_letter_actions`): every action taken on it — each replay attempt
//! with the verdict it was taken under, each archive — written in the transaction that acts.

use chrono::{DateTime, Utc};
use paybus_ops::triage::Verdict;
use serde::Serialize;
use sqlx::MySqlConnection;
use uuid::Uuid;

use crate::DeadLetterError;

paybus_db::column_enum! {
    /// `dead_letter_actions.action`.
    pub enum ActionKind {
        Replay,
        Archive,
    }
}

paybus_db::column_enum! {
    /// `dead_letter_actions.result`: what the action did.
    pub enum ActionResult {
        /// Safe under the letter's lock: the message was re-sent, the letter is REPLAYED.
        Replayed,
        /// Not safe under the letter's lock: nothing sent, the letter stays NEW.
        NotSent,
        Archived,
        /// The letter was no longer NEW when its turn came.
        Skipped,
    }
}

/// One entry of a letter's trail, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Action {
    pub id: u64,
    pub dead_letter_id: u64,
    /// REPLAY or ARCHIVE ([`ActionKind`]).
    pub action: String,
    /// Who (the token's subject, or the CLI's `--actor`).
    pub actor: String,
    /// The triage's verdict when the action was taken (replays only).
    pub verdict: Option<String>,
    /// REPLAYED, NOT_SENT, ARCHIVED or SKIPPED ([`ActionResult`]).
    pub result: String,
    pub detail: String,
    pub replay_message_id: Option<String>,
    /// The operation it was part of (`None`: taken before operations existed).
    pub operation_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// An entry to write.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub dead_letter_id: u64,
    pub action: ActionKind,
    pub actor: &'a str,
    pub verdict: Option<Verdict>,
    pub result: ActionResult,
    pub detail: &'a str,
    pub replay_message_id: Option<Uuid>,
    pub operation_id: Option<Uuid>,
}

/// A letter's trail, oldest first.
pub async fn of_letter(
    conn: &mut MySqlConnection,
    dead_letter_id: u64,
) -> Result<Vec<Action>, DeadLetterError> {
    Ok(sqlx::query_as(
        "SELECT id, dead_letter_id, action, actor, verdict, result, detail, replay_message_id, \
                operation_id, created_at \
         FROM dead_letter_actions WHERE dead_letter_id = ? ORDER BY id",
    )
    .bind(dead_letter_id)
    .fetch_all(conn)
    .await?)
}

/// Appends `entry` in the caller's transaction (the one that acted).
pub async fn record(conn: &mut MySqlConnection, entry: &Entry<'_>) -> Result<(), DeadLetterError> {
    let action: &str = entry.action.into();
    let result: &str = entry.result.into();
    sqlx::query(
        "INSERT INTO dead_letter_actions \
         (dead_letter_id, action, actor, verdict, result, detail, replay_message_id, \
          operation_id) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(entry.dead_letter_id)
    .bind(action)
    .bind(entry.actor.chars().take(100).collect::<String>())
    .bind(entry.verdict.map(|v| v.to_string()))
    .bind(result)
    .bind(entry.detail.chars().take(1000).collect::<String>())
    .bind(entry.replay_message_id.map(|id| id.to_string()))
    .bind(entry.operation_id.map(|id| id.to_string()))
    .execute(conn)
    .await?;
    Ok(())
}
