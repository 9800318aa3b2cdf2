//! The dry run, the replay and the archive; each action goes into the letter's [`trail`].
//!
//! A replay takes each selected NEW letter in a transaction of its own: it locks the letter,
//! asks its function for the verdict again (the dry run may be minutes old), and only when the
//! verdict is *safe* re-sends the message through the outbox — a new message id, the original
//! correlation id, type and data — and marks the letter REPLAYED; any other verdict leaves
//! the letter NEW and sends nothing. Either way the action is recorded in the same
//! transaction. Letters are taken at most [`ReplayOptions::per_second`] a second, so a
//! replayed group does not flood a function that just recovered.

use std::time::Duration;

use chrono::{SubsecRound, Utc};
use paybus_platform::{
    bus::{Envelope, Outbox, OutgoingMessage},
    triage::{Triage, Verdict},
};
use serde::Serialize;
use sqlx::MySqlConnection;
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
    conn: &mut MySqlConnection,
    triager: &Triager,
    selection: &Selection,
    limit: u32,
) -> Result<DryRun, DeadLetterError> {
    let ids = letter::selected_ids(conn, selection, limit.clamp(1, MAX_PAGE)).await?;
    let total = letter::count_selected(conn, selection).await?;
    let mut run = DryRun {
        already_applied: 0,
        safe: 0,
        needs_human: 0,
        remaining: total.saturating_sub(ids.len() as u64),
        letters: Vec::with_capacity(ids.len()),
    };
    for id in ids {
        let Some((letter, body)) = letter::find(conn, id).await? else {
            continue;
        };
        let triage = triager.triage(conn, &letter, &body).await?;
        match triage.verdict {
            Verdict::AlreadyApplied => run.already_applied += 1,
            Verdict::Safe => run.safe += 1,
            Verdict::NeedsHuman => run.needs_human += 1,
        }
        run.letters.push(Classified { letter, triage });
    }
    Ok(run)
}

/// How a replay runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayOptions {
    /// The most letters taken a second (default 10).
    pub per_second: f64,
    /// The most letters one call takes (default and most: 500; the rest stay NEW).
    pub limit: u32,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            per_second: 10.0,
            limit: MAX_PAGE,
        }
    }
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

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    pub replayed: u64,
    pub already_applied: u64,
    pub needs_human: u64,
    /// No longer NEW when their turn came (replayed or archived meanwhile).
    pub skipped: u64,
    pub results: Vec<ReplayResult>,
    /// NEW letters of the selection left for another call (beyond `limit`).
    pub remaining: u64,
}

/// Replays the selection's safe letters (see the module docs). `progress` sees each letter's
/// result as it is committed (the CLI's progress bar).
pub async fn replay(
    outbox: &Outbox,
    triager: &Triager,
    selection: &Selection,
    actor: &str,
    options: ReplayOptions,
    mut progress: impl FnMut(&ReplayResult) + Send,
) -> Result<ReplayReport, DeadLetterError> {
    let ids = {
        let mut conn = outbox.pool().acquire().await?;
        letter::selected_ids(&mut conn, selection, options.limit.clamp(1, MAX_PAGE)).await?
    };
    let mut report = ReplayReport::default();
    let mut pace = pace(options.per_second);
    for id in ids {
        pace.tick().await;
        let result = replay_one(outbox, triager, id, actor).await?;
        match (result.result, result.verdict) {
            (ActionResult::Replayed, _) => report.replayed += 1,
            (_, Some(Verdict::AlreadyApplied)) => report.already_applied += 1,
            (_, Some(_)) => report.needs_human += 1,
            (_, None) => report.skipped += 1,
        }
        progress(&result);
        report.results.push(result);
    }
    let mut conn = outbox.pool().acquire().await?;
    // Letters this call left NEW (not safe) are not "remaining": another call would only
    // classify them again.
    let left_new = report
        .results
        .iter()
        .filter(|r| r.result == ActionResult::NotSent)
        .count() as u64;
    report.remaining = letter::count_selected(&mut conn, selection)
        .await?
        .saturating_sub(left_new);
    tracing::info!(
        actor,
        replayed = report.replayed,
        already_applied = report.already_applied,
        needs_human = report.needs_human,
        skipped = report.skipped,
        "dead letters replayed"
    );
    Ok(report)
}

fn pace(per_second: f64) -> tokio::time::Interval {
    let per_second = if per_second.is_finite() && per_second > 0.0 {
        per_second
    } else {
        ReplayOptions::default().per_second
    };
    let mut interval = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

async fn replay_one(
    outbox: &Outbox,
    triager: &Triager,
    id: u64,
    actor: &str,
) -> Result<ReplayResult, DeadLetterError> {
    let mut uow = outbox.begin().await?;
    let Some((letter, body)) = letter::lock(&mut uow, id).await? else {
        return Err(DeadLetterError::NotFound(id));
    };
    let mut result = ReplayResult {
        id,
        function_name: letter.function_name.clone(),
        verdict: None,
        result: ActionResult::Skipped,
        detail: String::new(),
        replay_message_id: None,
    };
    if letter.status != letter::LetterStatus::New {
        result.detail = format!("the letter is {} now", letter.status);
        trail::record(&mut uow, &result.entry(actor)).await?;
        uow.commit().await?;
        return Ok(result);
    }
    let triage = triager.triage(&mut uow, &letter, &body).await?;
    result.verdict = Some(triage.verdict);
    result.detail = triage.reason;
    if triage.verdict == Verdict::Safe {
        triager.prepare_replay(&mut uow, &letter, &body).await?;
        let message = replay_message(&body)?;
        result.replay_message_id = Some(message.id);
        result.result = ActionResult::Replayed;
        uow.send_outgoing(message).await?;
        sqlx::query(
            "UPDATE dead_letters SET status = 'REPLAYED', replayed_at = NOW(6) \
             WHERE id = ? AND status = 'NEW'",
        )
        .bind(id)
        .execute(&mut *uow)
        .await?;
    } else {
        result.result = ActionResult::NotSent;
    }
    trail::record(&mut uow, &result.entry(actor)).await?;
    uow.commit().await?;
    Ok(result)
}

impl ReplayResult {
    /// The trail entry of this replay attempt by `actor`.
    fn entry<'a>(&'a self, actor: &'a str) -> Entry<'a> {
        Entry {
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

/// The message a replay sends: the dead letter's envelope with a new id and time (a message
/// id names one publication; the original's outbox row may still hold it), the same
/// correlation id, type and data.
fn replay_message(body: &[u8]) -> Result<OutgoingMessage, DeadLetterError> {
    let original: Envelope<serde_json::Value> = serde_json::from_slice(body).map_err(|error| {
        DeadLetterError::Invalid(format!("the stored body is not an envelope: {error}"))
    })?;
    let replay = Envelope {
        id: Uuid::now_v7(),
        occurred_at: Utc::now().trunc_subsecs(6),
        ..original
    };
    let body = serde_json::to_vec(&replay)
        .map_err(|error| DeadLetterError::Invalid(format!("re-serialising: {error}")))?;
    Ok(OutgoingMessage {
        id: replay.id,
        routing_key: replay.kind,
        correlation_id: replay.correlation_id,
        occurred_at: replay.occurred_at,
        body,
    })
}

/// What an archive did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ArchiveReport {
    pub archived: u64,
    /// NEW letters of the selection left for another call (beyond `limit`).
    pub remaining: u64,
}

/// Archives the selection's NEW letters (at most `limit`), each with its trail entry.
pub async fn archive(
    outbox: &Outbox,
    selection: &Selection,
    actor: &str,
    limit: u32,
) -> Result<ArchiveReport, DeadLetterError> {
    let pool = outbox.pool();
    let ids = {
        let mut conn = pool.acquire().await?;
        letter::selected_ids(&mut conn, selection, limit.clamp(1, MAX_PAGE)).await?
    };
    let mut report = ArchiveReport::default();
    for id in ids {
        let mut tx = pool.begin().await?;
        let archived = sqlx::query(
            "UPDATE dead_letters SET status = 'ARCHIVED', archived_at = NOW(6) \
             WHERE id = ? AND status = 'NEW'",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if archived {
            trail::record(
                &mut tx,
                &Entry {
                    dead_letter_id: id,
                    action: ActionKind::Archive,
                    actor,
                    verdict: None,
                    result: ActionResult::Archived,
                    detail: "",
                    replay_message_id: None,
                },
            )
            .await?;
            report.archived += 1;
        }
        tx.commit().await?;
    }
    let mut conn = pool.acquire().await?;
    report.remaining = letter::count_selected(&mut conn, selection).await?;
    tracing::info!(actor, archived = report.archived, "dead letters archived");
    Ok(report)
}
