//! The dry run, and one letter's replay or archive as an [`crate::operation`] takes it; each
//! action goes into the letter's [`trail`].
//!
//! A replay locks the letter, asks its function for the verdict again (the dry run may be
//! minutes old), and only when the verdict is *safe* re-sends the message through the outbox —
//! a new message id, the original correlation id, type and data — and marks the letter
//! REPLAYED; any other verdict leaves the letter NEW and sends nothing. Either way the action
//! is recorded in the same transaction.

use std::time::Duration;

use paybus_bus::{
    OutgoingMessage, UnitOfWork,
    dead_letter::group_counts::{self, Change},
};
use paybus_ops::triage::{Triage, Verdict};
use serde::Serialize;
use sqlx::{MySqlConnection, MySqlPool};
use uuid::Uuid;

use crate::{
    DeadLetterError, Triager,
    letter::{self, DeadLetter, MAX_PAGE, Selection},
    trail::{self, ActionKind, ActionResult, Entry},
};

/// One letter and what a replay would do with it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Classified {
    pub letter: DeadLetter,
    pub triage: Triage,
}

/// The dry run of a selection: each letter classified; nothing written, nothing sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DryRun {
    pub already_applied: u64,
    pub safe: u64,
    pub needs_human: u64,
    pub letters: Vec<Classified>,
    /// NEW letters of the selection beyond `limit`, not classified here.
    pub remaining: u64,
}

/// Classifies the selection's NEW letters (oldest first, at most `limit`).
pub async fn dry_run(
    pool: &MySqlPool,
    triager: &Triager,
    selection: &Selection,
    limit: u32,
) -> Result<DryRun, DeadLetterError> {
    let mut conn = pool.acquire().await?;
    let ids = letter::selected_ids(&mut conn, selection, limit.clamp(1, MAX_PAGE)).await?;
    let total = letter::count_selected(&mut conn, selection).await?;
    let letters = letter::with_bodies(&mut conn, &ids).await?;
    drop(conn);
    let mut run = DryRun {
        already_applied: 0,
        safe: 0,
        needs_human: 0,
        remaining: total.saturating_sub(ids.len() as u64),
        letters: Vec::with_capacity(letters.len()),
    };
    for (letter, triage) in triager.triage_each(pool, letters).await? {
        match triage.verdict {
            Verdict::AlreadyApplied => run.already_applied += 1,
            Verdict::Safe => run.safe += 1,
            Verdict::NeedsHuman => run.needs_human += 1,
        }
        run.letters.push(Classified { letter, triage });
    }
    Ok(run)
}

/// What a replay did with one letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayResult {
    pub id: u64,
    pub function_name: String,
    /// The verdict taken under the letter's lock (`None`: the letter was no longer NEW).
    pub verdict: Option<Verdict>,
    /// REPLAYED, NOT_SENT or SKIPPED.
    pub result: ActionResult,
    pub detail: String,
    /// The re-sent message's id (REPLAYED only).
    pub replay_message_id: Option<Uuid>,
}

/// The pace of a replay or an archive when none is given: ten letters a second.
pub const DEFAULT_PER_SECOND: f64 = 10.0;

pub(crate) fn pace(per_second: f64) -> tokio::time::Interval {
    let per_second = if per_second.is_finite() && per_second > 0.0 {
        per_second
    } else {
        DEFAULT_PER_SECOND
    };
    let mut interval = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

/// Replays letter `id` in the caller's unit of work when its verdict, taken again under the
/// letter's lock, is safe; records the attempt in its trail either way.
pub(crate) async fn replay_locked(
    uow: &mut UnitOfWork<'_>,
    triager: &Triager,
    id: u64,
    actor: &str,
    operation_id: Option<Uuid>,
) -> Result<ReplayResult, DeadLetterError> {
    let Some((letter, body)) = letter::lock(uow, id).await? else {
        return Err(DeadLetterError::NotFound(id));
    };
    let mut result = ReplayResult::skipped(id, &letter.function_name);
    if letter.status != letter::LetterStatus::New {
        result.detail = format!("the letter is {} now", letter.status);
        trail::record(uow, &result.entry(actor, operation_id)).await?;
        return Ok(result);
    }
    let triage = triager.triage(uow, &letter, &body).await?;
    result.verdict = Some(triage.verdict);
    result.detail = triage.reason;
    if triage.verdict == Verdict::Safe {
        triager.prepare_replay(uow, &letter, &body).await?;
        let message = replay_message(&body)?;
        result.replay_message_id = Some(message.id);
        result.result = ActionResult::Replayed;
        uow.send_outgoing(message).await?;
        let replayed = sqlx::query(
            "UPDATE dead_letters SET status = 'REPLAYED', replayed_at = NOW(6) \
             WHERE id = ? AND status = 'NEW'",
        )
        .bind(id)
        .execute(&mut **uow)
        .await?
        .rows_affected();
        left_new(uow, &letter, replayed).await?;
    } else {
        result.result = ActionResult::NotSent;
    }
    trail::record(uow, &result.entry(actor, operation_id)).await?;
    Ok(result)
}

/// A letter an operation holds but did not preview as safe: never sent (what was approved is
/// what runs), recorded as such.
pub(crate) async fn not_previewed_safe(
    conn: &mut MySqlConnection,
    id: u64,
    verdict: Verdict,
    actor: &str,
    operation_id: Uuid,
) -> Result<ReplayResult, DeadLetterError> {
    let Some((letter, _)) = letter::lock(conn, id).await? else {
        return Err(DeadLetterError::NotFound(id));
    };
    let result = ReplayResult {
        id,
        function_name: letter.function_name,
        verdict: Some(verdict),
        result: ActionResult::NotSent,
        detail: format!(
            "the dry run found it {verdict}: an operation replays only what it showed as safe"
        ),
        replay_message_id: None,
    };
    trail::record(conn, &result.entry(actor, Some(operation_id))).await?;
    Ok(result)
}

/// Archives letter `id` in the caller's transaction when it is NEW (else SKIPPED), with its
/// trail entry.
pub(crate) async fn archive_locked(
    conn: &mut MySqlConnection,
    id: u64,
    actor: &str,
    operation_id: Option<Uuid>,
) -> Result<ReplayResult, DeadLetterError> {
    let Some((letter, _)) = letter::lock(conn, id).await? else {
        return Err(DeadLetterError::NotFound(id));
    };
    let mut result = ReplayResult::skipped(id, &letter.function_name);
    if letter.status == letter::LetterStatus::New {
        let archived = sqlx::query(
            "UPDATE dead_letters SET status = 'ARCHIVED', archived_at = NOW(6) \
             WHERE id = ? AND status = 'NEW'",
        )
        .bind(id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        left_new(&mut *conn, &letter, archived).await?;
        result.result = ActionResult::Archived;
    } else {
        result.detail = format!("the letter is {} now", letter.status);
    }
    let entry = Entry {
        action: ActionKind::Archive,
        ..result.entry(actor, operation_id)
    };
    trail::record(conn, &entry).await?;
    Ok(result)
}

/// Takes `letter` (locked by the caller, read NEW) out of its group's counts when the caller's
/// guarded UPDATE moved it out of NEW (`moved`: its affected rows).
async fn left_new(
    conn: &mut MySqlConnection,
    letter: &DeadLetter,
    moved: u64,
) -> Result<(), DeadLetterError> {
    if moved == 1 {
        group_counts::apply(
            conn,
            &letter.function_name,
            &letter.reason,
            Change::LeftNew {
                failures: letter.failures,
            },
        )
        .await?;
    }
    Ok(())
}

impl ReplayResult {
    /// Nothing done to letter `id` (yet): what an action starts from.
    fn skipped(id: u64, function_name: &str) -> Self {
        Self {
            id,
            function_name: function_name.to_owned(),
            verdict: None,
            result: ActionResult::Skipped,
            detail: String::new(),
            replay_message_id: None,
        }
    }

    /// The trail entry of this replay attempt by `actor`.
    fn entry<'a>(&'a self, actor: &'a str, operation_id: Option<Uuid>) -> Entry<'a> {
        Entry {
            operation_id,
            dead_letter_id: self.id,
            action: ActionKind::Replay,
            actor,
            verdict: self.verdict,
            result: self.result,
            detail: &self.detail,
            replay_message_id: self.replay_message_id,
        }
    }
}

/// The message a replay sends: the dead letter's envelope sent again (a new id and time; the
/// same correlation id, type and data), continuing the ops request's trace.
fn replay_message(body: &[u8]) -> Result<OutgoingMessage, DeadLetterError> {
    OutgoingMessage::resend(body).map_err(|error| {
        DeadLetterError::Invalid(format!("the stored body is not an envelope: {error}"))
    })
}
