//! The ops log: every ops action in one append-only table, `ops_log`, whose rows are chained by
//! hash, so a row changed or deleted by hand is found by `paybus audit` (check `ops_log_chain`).
//!
//! - [`append`] writes one row **in the acting transaction** (the action and its row commit
//!   together or not at all), after locking the one-row head (`ops_log_head`): appends are
//!   serialised and `seq` has no gaps.
//! - Each row carries the previous row's hash and its own ([`row_hash`]: SHA-256 over an
//!   unambiguous encoding of its fields), and the hash of the [`Actor`]'s identity over its own
//!   ([`identity_hash`]); see [`hashes`] for why the identity is not inside `row_hash`.
//! - [`verify`] walks the chain, [`BATCH`] rows a read, and reports the first broken link;
//!   [`verify_recent`] walks from an audit window's first row (the continuous auditor).
//!
//! What the chain cannot prove: whoever can write the tables can rewrite every row from the
//! first changed one on, hashes and head included, and the result verifies (docs/operations.md,
//! "The ops log").

use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::{Connection, MySqlConnection};

use crate::{
    actor::Actor,
    audit::{Check, Finding, Window},
};

/// `prev_hash` of row 1, and the head's hash while the log is empty (the migration seeds it).
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Rows the verifier reads at a time: its memory stays flat however long the log grows.
pub const BATCH: u32 = 1_000;

/// The columns' sizes, in characters: longer values are cut before they are hashed, so the
/// stored row is exactly what was hashed (a server that truncated them instead would break the
/// row's own hash).
pub const ACTOR_MAX: usize = 100;
pub const IDENTITY_MAX: usize = 255;
pub const ACTION_MAX: usize = 64;
pub const SUBJECT_MAX: usize = 200;

/// The check `paybus audit` and the continuous auditor run.
pub const CHECKS: &[Check] = &[crate::audit_check!(
    "ops_log_chain",
    verify,
    recent: verify_recent
)];

/// One ops action, as its caller describes it.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// Who acted.
    pub actor: &'a Actor,
    /// `noun.verb`: `function.pause`, `bonus_job.retry`, `market.suspend`, ...
    pub action: &'a str,
    /// What it acted on, `kind:id`: `function:confirm-withdrawal`, `charge_event_job:42`.
    pub subject: &'a str,
    /// What the action did, for whoever reads the log (a reason, the rows it moved).
    pub detail: &'a serde_json::Value,
}

/// A row of the log, as [`list`] reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub seq: u64,
    pub created_at: DateTime<Utc>,
    /// Who acted, as people read it.
    pub actor: String,
    /// Who that was: the identity provider's issuer and subject, and how they authenticated
    /// (`OIDC`, `BREAK_GLASS`, `PARTNER_KEY`); `null` on rows written before identities were
    /// recorded.
    pub actor_issuer: Option<String>,
    pub actor_subject: Option<String>,
    pub auth_method: Option<String>,
    pub action: String,
    pub subject: String,
    /// The stored JSON; a text that is not JSON (only a hand edit writes one) is shown as a
    /// string.
    pub detail: serde_json::Value,
    pub prev_hash: String,
    pub row_hash: String,
    /// [`identity_hash`] of the row's identity; `null` on rows without one, and on rows whose
    /// `row_hash` covers it (the `v2` form).
    pub identity_hash: Option<String>,
}

/// A row as stored: the detail as its text, the bytes the hash covers.
#[derive(Debug, sqlx::FromRow)]
struct StoredRow {
    seq: u64,
    created_at: DateTime<Utc>,
    actor: String,
    actor_issuer: Option<String>,
    actor_subject: Option<String>,
    auth_method: Option<String>,
    action: String,
    subject: String,
    detail: String,
    prev_hash: String,
    row_hash: String,
    identity_hash: Option<String>,
}

impl StoredRow {
    /// Whether the row's content matches its hashes, in either form a release writes: `v1`
    /// with the identity's hash beside it ([`hashes`]), or `v2` with the identity inside.
    fn is_as_written(&self) -> bool {
        let hashed = |identity| {
            row_hash(&Hashed {
                seq: self.seq,
                created_at: self.created_at,
                actor: &self.actor,
                action: &self.action,
                subject: &self.subject,
                detail: &self.detail,
                prev_hash: &self.prev_hash,
                identity,
            })
        };
        let identity = identity(
            self.actor_issuer.as_deref(),
            self.actor_subject.as_deref(),
            self.auth_method.as_deref(),
        );
        match (identity, self.identity_hash.as_deref()) {
            (None, None) => hashed(None) == self.row_hash,
            (Some(who), Some(stored)) => {
                hashed(None) == self.row_hash && identity_hash(&self.row_hash, &who) == stored
            }
            (Some(who), None) => hashed(Some(who)) == self.row_hash,
            // An identity's hash without the identity: the identity was removed.
            (None, Some(_)) => false,
        }
    }
}

/// The identity a stored row's hash covers: all three columns, or none (a row written before
/// identities were recorded; any other mix is hashed as none, and so fails its hash).
fn identity<'a>(
    issuer: Option<&'a str>,
    subject: Option<&'a str>,
    method: Option<&'a str>,
) -> Option<Identity<'a>> {
    Some(Identity {
        issuer: issuer?,
        subject: subject?,
        method: method?,
    })
}

impl Row {
    /// Who acted, as the row's hash covers it.
    pub fn identity(&self) -> Option<Identity<'_>> {
        identity(
            self.actor_issuer.as_deref(),
            self.actor_subject.as_deref(),
            self.auth_method.as_deref(),
        )
    }
}

impl From<StoredRow> for Row {
    fn from(row: StoredRow) -> Self {
        let detail =
            serde_json::from_str(&row.detail).unwrap_or(serde_json::Value::String(row.detail));
        Row {
            seq: row.seq,
            created_at: row.created_at,
            actor: row.actor,
            actor_issuer: row.actor_issuer,
            actor_subject: row.actor_subject,
            auth_method: row.auth_method,
            action: row.action,
            subject: row.subject,
            detail,
            prev_hash: row.prev_hash,
            row_hash: row.row_hash,
            identity_hash: row.identity_hash,
        }
    }
}

/// What a row's hash covers, field by field.
#[derive(Debug, Clone, Copy)]
pub struct Hashed<'a> {
    pub seq: u64,
    pub created_at: DateTime<Utc>,
    pub actor: &'a str,
    pub action: &'a str,
    pub subject: &'a str,
    /// The JSON text as stored.
    pub detail: &'a str,
    pub prev_hash: &'a str,
    /// Who the actor is; `None` for a row written before identities were recorded.
    pub identity: Option<Identity<'a>>,
}

/// Who acted, as a row's hash covers it.
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    pub issuer: &'a str,
    pub subject: &'a str,
    /// `OIDC`, `BREAK_GLASS`, `PARTNER_KEY` ([`crate::actor::AuthMethod`]).
    pub method: &'a str,
}

/// The hashes a row is written with (by [`append`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashes {
    pub row_hash: String,
    pub identity_hash: Option<String>,
}

/// What [`append`] writes for `row`: its `row_hash` in the `v1` form, without the identity,
/// and the identity's own hash over that ([`identity_hash`]).
///
/// Why not `v2` (the identity inside `row_hash`): the previous release verifies `v1` only, and
/// its continuous auditor still runs while a deploy rolls out (a canary's old version takes
/// most of the traffic) and after a rollback. Rows it cannot verify read to it as rows changed
/// by hand: an `ops_log_chain` violation on every ops action, whose alarm rolls the deploy
/// back. A release that verifies both forms (this one) comes first; the next may write `v2`.
pub fn hashes(row: &Hashed<'_>) -> Hashes {
    let row_hash = row_hash(&Hashed {
        identity: None,
        ..*row
    });
    let identity_hash = row
        .identity
        .map(|identity| self::identity_hash(&row_hash, &identity));
    Hashes {
        row_hash,
        identity_hash,
    }
}

/// SHA-256, lowercase hex, over a versioned tag, `row_hash`, and the identity's issuer,
/// subject and method, each length-prefixed as in [`row_hash`].
pub fn identity_hash(row_hash: &str, identity: &Identity<'_>) -> String {
    let mut hasher = Sha256::new();
    for field in [
        "paybus.ops_log.identity.v1",
        row_hash,
        identity.issuer,
        identity.subject,
        identity.method,
    ] {
        length_prefixed(&mut hasher, field);
    }
    hex::encode(hasher.finalize())
}

/// SHA-256, lowercase hex, over a versioned tag, seq (8 bytes big-endian), created_at in
/// microseconds since the epoch (8 bytes big-endian), then each text field as its byte length
/// (8 bytes big-endian) followed by its UTF-8 bytes. The length prefixes make the boundaries
/// unambiguous: no two different rows encode to the same bytes ("ab" + "c" is not "a" + "bc").
/// Without an identity it is the `v1` form, the one every release verifies and [`hashes`]
/// writes; with one, tagged `v2`, its issuer, subject and method follow (read, not written:
/// see [`hashes`]).
pub fn row_hash(row: &Hashed<'_>) -> String {
    let mut hasher = Sha256::new();
    let tag = if row.identity.is_some() {
        "paybus.ops_log.v2"
    } else {
        "paybus.ops_log.v1"
    };
    length_prefixed(&mut hasher, tag);
    hasher.update(row.seq.to_be_bytes());
    hasher.update(row.created_at.timestamp_micros().to_be_bytes());
    for field in [
        row.actor,
        row.action,
        row.subject,
        row.detail,
        row.prev_hash,
    ] {
        length_prefixed(&mut hasher, field);
    }
    if let Some(identity) = row.identity {
        for field in [identity.issuer, identity.subject, identity.method] {
            length_prefixed(&mut hasher, field);
        }
    }
    hex::encode(hasher.finalize())
}

fn length_prefixed(hasher: &mut Sha256, field: &str) {
    hasher.update((field.len() as u64).to_be_bytes());
    hasher.update(field.as_bytes());
}

fn clip(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// The head: how many rows the log has and the last one's hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Head {
    pub seq: u64,
    pub row_hash: String,
}

/// Appends `entry` and returns its seq. Call it in the acting transaction, after the action's
/// own writes: the head is the one lock every ops action shares, and taking it last holds it
/// only until the commit and orders it after every other lock, so two actions cannot deadlock
/// on it. On a connection outside a transaction it runs in one of its own.
#[tracing::instrument(skip_all, fields(action = entry.action, subject = entry.subject, seq))]
pub async fn append(conn: &mut MySqlConnection, entry: &Entry<'_>) -> Result<u64, sqlx::Error> {
    // A savepoint inside the caller's transaction; a transaction of its own otherwise, so the
    // row and the head never part.
    let mut tx = conn.begin().await?;
    // The time is read under the head's lock, from the database's clock: one clock for every
    // process, the one the auditor's window is measured with, and created_at follows seq. It
    // is bound, not defaulted, so the hash covers what is stored; sessions run in UTC (sqlx's
    // default `time_zone`), so the TIMESTAMP reads back exactly as written.
    let (head_seq, prev_hash, created_at): (u64, String, DateTime<Utc>) = sqlx::query_as(
        "SELECT seq, row_hash, SYSDATE(6) FROM ops_log_head WHERE id = 1 FOR UPDATE",
    )
    .fetch_one(&mut *tx)
    .await?;
    let seq = head_seq + 1;
    let actor = clip(&entry.actor.name, ACTOR_MAX);
    let issuer = clip(&entry.actor.issuer, IDENTITY_MAX);
    let actor_subject = clip(&entry.actor.subject, IDENTITY_MAX);
    let method: &'static str = entry.actor.via.into();
    let action = clip(entry.action, ACTION_MAX);
    let subject = clip(entry.subject, SUBJECT_MAX);
    let detail = entry.detail.to_string();
    let Hashes {
        row_hash: hash,
        identity_hash,
    } = hashes(&Hashed {
        seq,
        created_at,
        actor: &actor,
        action: &action,
        subject: &subject,
        detail: &detail,
        prev_hash: &prev_hash,
        identity: Some(Identity {
            issuer: &issuer,
            subject: &actor_subject,
            method,
        }),
    });
    sqlx::query(
        "INSERT INTO ops_log \
         (seq, created_at, actor, action, subject, detail, prev_hash, row_hash, actor_issuer, \
          actor_subject, auth_method, identity_hash) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(seq)
    .bind(created_at)
    .bind(&actor)
    .bind(&action)
    .bind(&subject)
    .bind(&detail)
    .bind(&prev_hash)
    .bind(&hash)
    .bind(&issuer)
    .bind(&actor_subject)
    .bind(method)
    .bind(&identity_hash)
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE ops_log_head SET seq = ?, row_hash = ? WHERE id = 1")
        .bind(seq)
        .bind(&hash)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    tracing::Span::current().record("seq", seq);
    tracing::info!(
        seq,
        actor,
        issuer,
        actor_subject,
        method,
        action,
        subject,
        "ops action logged"
    );
    Ok(seq)
}

macro_rules! select_rows {
    ($rest:literal) => {
        concat!(
            "SELECT seq, created_at, actor, actor_issuer, actor_subject, auth_method, action, \
             subject, detail, prev_hash, row_hash, identity_hash FROM ops_log ",
            $rest
        )
    };
}

/// The rows before `before_seq` (all of them for `None`), newest first, at most `limit`.
pub async fn list(
    conn: &mut MySqlConnection,
    before_seq: Option<u64>,
    limit: u32,
) -> Result<Vec<Row>, sqlx::Error> {
    let rows: Vec<StoredRow> =
        sqlx::query_as(select_rows!("WHERE seq < ? ORDER BY seq DESC LIMIT ?"))
            .bind(before_seq.unwrap_or(u64::MAX))
            .bind(limit)
            .fetch_all(conn)
            .await?;
    Ok(rows.into_iter().map(Row::from).collect())
}

/// The head as stored (`None`: its row was deleted).
pub async fn head(conn: &mut MySqlConnection) -> Result<Option<Head>, sqlx::Error> {
    sqlx::query_as("SELECT seq, row_hash FROM ops_log_head WHERE id = 1")
        .fetch_optional(conn)
        .await
}

/// The first broken link of the chain, if any (a chain broken at one row is suspect from there
/// on, so what follows it is not reported). Run it in a transaction: every read then sees the
/// same snapshot, and appends committed meanwhile are neither half seen nor mistaken for rows
/// written around the head.
#[tracing::instrument(skip_all)]
pub async fn verify(conn: &mut MySqlConnection) -> Result<Vec<BrokenLink>, sqlx::Error> {
    Ok(verify_from(conn, 1).await?.into_iter().collect())
}

/// [`verify`] from the first row written in `window` (linked to the row before it, whose own
/// link is not checked), and the head: what the continuous auditor runs each pass, at the cost
/// of the window's rows. Older rows are the full walk's (`paybus audit`, nightly).
#[tracing::instrument(skip_all)]
pub async fn verify_recent(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<BrokenLink>, sqlx::Error> {
    let first: Option<u64> =
        sqlx::query_scalar("SELECT CAST(MIN(seq) AS UNSIGNED) FROM ops_log WHERE created_at >= ?")
            .bind(window.since)
            .fetch_one(&mut *conn)
            .await?;
    // Nothing written in the window: the walk is the head's own row.
    let from = first.unwrap_or(u64::MAX);
    Ok(verify_from(conn, from).await?.into_iter().collect())
}

/// Walks rows `from - 1 ..= head` (from 1 with [`GENESIS`] as the link before it), then checks
/// the head against where the log ends.
async fn verify_from(
    conn: &mut MySqlConnection,
    from: u64,
) -> Result<Option<BrokenLink>, sqlx::Error> {
    let Some(head) = head(conn).await? else {
        return Ok(Some(BrokenLink {
            seq: 0,
            problem: Problem::HeadMissing,
        }));
    };
    let from = from.clamp(1, head.seq.saturating_add(1));
    let start = from.saturating_sub(1).max(1);
    // The hash the next row must carry as prev_hash; unknown for a walk that starts past row 1
    // (the row before `start` is outside what it reads).
    let mut prev: Option<String> = (start == 1).then(|| GENESIS.to_owned());
    let mut expected = start;
    while expected <= head.seq {
        let rows: Vec<StoredRow> = sqlx::query_as(select_rows!(
            "WHERE seq >= ? AND seq <= ? ORDER BY seq LIMIT ?"
        ))
        .bind(expected)
        .bind(head.seq)
        .bind(BATCH)
        .fetch_all(&mut *conn)
        .await?;
        if rows.is_empty() {
            break;
        }
        for row in rows {
            let problem = if row.seq != expected {
                Some((expected, Problem::Missing))
            } else if !row.is_as_written() {
                Some((row.seq, Problem::Changed))
            } else if prev.as_ref().is_some_and(|prev| *prev != row.prev_hash) {
                Some((row.seq, Problem::Unlinked))
            } else {
                None
            };
            if let Some((seq, problem)) = problem {
                return Ok(Some(BrokenLink { seq, problem }));
            }
            prev = Some(row.row_hash);
            expected += 1;
        }
    }
    if expected <= head.seq {
        let last: Option<u64> =
            sqlx::query_scalar("SELECT CAST(MAX(seq) AS UNSIGNED) FROM ops_log WHERE seq <= ?")
                .bind(head.seq)
                .fetch_one(&mut *conn)
                .await?;
        return Ok(Some(BrokenLink {
            seq: head.seq,
            problem: Problem::TailDeleted {
                last_seq: last.unwrap_or(0),
            },
        }));
    }
    if prev.as_deref() != Some(head.row_hash.as_str()) {
        return Ok(Some(BrokenLink {
            seq: head.seq,
            problem: Problem::HeadMismatch,
        }));
    }
    let past: Option<u64> =
        sqlx::query_scalar("SELECT CAST(MIN(seq) AS UNSIGNED) FROM ops_log WHERE seq > ?")
            .bind(head.seq)
            .fetch_one(&mut *conn)
            .await?;
    Ok(past.map(|seq| BrokenLink {
        seq,
        problem: Problem::PastHead { head_seq: head.seq },
    }))
}

/// The first place the chain does not hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BrokenLink {
    /// The row where it breaks (the head's seq for a problem with the head; 0 when the head
    /// itself is gone).
    pub seq: u64,
    #[serde(flatten)]
    pub problem: Problem,
}

/// What is wrong at [`BrokenLink::seq`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum Problem {
    /// The row's content does not match its `row_hash`: changed after it was written.
    Changed,
    /// No row has this seq, though later ones exist up to the head: deleted.
    Missing,
    /// The row's `prev_hash` is not the previous row's hash: the previous row was rewritten
    /// with a recomputed hash, or this row's link was.
    Unlinked,
    /// The head counts more rows than the log has: its last rows were deleted.
    TailDeleted { last_seq: u64 },
    /// The head's hash is not its last row's: the head or that row was rewritten.
    HeadMismatch,
    /// A row beyond the head: written around the appender.
    PastHead { head_seq: u64 },
    /// `ops_log_head` has no row: appends fail and the tail cannot be checked.
    HeadMissing,
}

impl Finding for BrokenLink {
    fn check(&self) -> &'static str {
        "ops_log_chain"
    }
}

impl fmt::Display for BrokenLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seq = self.seq;
        write!(f, "{}: ", self.check())?;
        match self.problem {
            Problem::Changed => write!(
                f,
                "row {seq}'s content does not match its hash (changed after it was written)"
            ),
            Problem::Missing => write!(f, "row {seq} is missing (deleted)"),
            Problem::Unlinked if seq <= 1 => write!(
                f,
                "row {seq}'s prev_hash is not the genesis hash (its link was changed)"
            ),
            Problem::Unlinked => write!(
                f,
                "row {seq}'s prev_hash is not row {previous}'s hash (row {previous} was \
                 rewritten with a recomputed hash, or row {seq}'s link was changed)",
                previous = seq - 1,
            ),
            Problem::TailDeleted { last_seq } => write!(
                f,
                "the head says {seq} rows but the log ends at {last_seq} (the tail was deleted)"
            ),
            Problem::HeadMismatch => write!(
                f,
                "the head's hash is not row {seq}'s (the head or row {seq} was rewritten)"
            ),
            Problem::PastHead { head_seq } => write!(
                f,
                "row {seq} is past the head's {head_seq} (written around the appender)"
            ),
            Problem::HeadMissing => write!(
                f,
                "the head row (ops_log_head) is missing: no ops action can be logged and the \
                 tail cannot be checked"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(actor: &'static str, action: &'static str) -> Hashed<'static> {
        Hashed {
            seq: 1,
            created_at: DateTime::UNIX_EPOCH,
            actor,
            action,
            subject: "function:canary",
            detail: "{}",
            prev_hash: GENESIS,
            identity: Some(Identity {
                issuer: "https://idp.example",
                subject: "u-1",
                method: "OIDC",
            }),
        }
    }

    #[test]
    fn moving_a_field_boundary_changes_the_hash() {
        assert_ne!(row_hash(&fields("ab", "c")), row_hash(&fields("a", "bc")));
    }

    #[test]
    fn every_field_is_covered() {
        let base = fields("alice", "function.pause");
        let hash = row_hash(&base);
        let later = DateTime::UNIX_EPOCH + chrono::Duration::microseconds(1);
        for changed in [
            Hashed { seq: 2, ..base },
            Hashed {
                created_at: later,
                ..base
            },
            Hashed {
                actor: "bob",
                ..base
            },
            Hashed {
                action: "function.resume",
                ..base
            },
            Hashed {
                subject: "function:grant-bonus",
                ..base
            },
            Hashed {
                detail: "{\"reason\":\"x\"}",
                ..base
            },
            Hashed {
                prev_hash: "1",
                ..base
            },
            Hashed {
                identity: Some(Identity {
                    issuer: "https://other.example",
                    subject: "u-1",
                    method: "OIDC",
                }),
                ..base
            },
            Hashed {
                identity: Some(Identity {
                    issuer: "https://idp.example",
                    subject: "u-2",
                    method: "OIDC",
                }),
                ..base
            },
            Hashed {
                identity: Some(Identity {
                    issuer: "https://idp.example",
                    subject: "u-1",
                    method: "BREAK_GLASS",
                }),
                ..base
            },
            Hashed {
                identity: None,
                ..base
            },
        ] {
            assert_ne!(row_hash(&changed), hash, "{changed:?}");
        }
        assert_eq!(row_hash(&base), hash, "deterministic");
        assert_eq!(hash.len(), 64);
    }

    /// `fields`' row as stored, with the hashes given.
    fn stored(row: &Hashed<'_>, row_hash: String, identity_hash: Option<String>) -> StoredRow {
        let identity = row.identity;
        StoredRow {
            seq: row.seq,
            created_at: row.created_at,
            actor: row.actor.to_owned(),
            actor_issuer: identity.map(|i| i.issuer.to_owned()),
            actor_subject: identity.map(|i| i.subject.to_owned()),
            auth_method: identity.map(|i| i.method.to_owned()),
            action: row.action.to_owned(),
            subject: row.subject.to_owned(),
            detail: row.detail.to_owned(),
            prev_hash: row.prev_hash.to_owned(),
            row_hash,
            identity_hash,
        }
    }

    #[test]
    fn a_row_is_written_with_the_previous_release_s_hash_and_its_identity_s_beside_it() {
        let base = fields("alice", "function.pause");
        let written = hashes(&base);
        let without_identity = Hashed {
            identity: None,
            ..base
        };
        assert_eq!(written.row_hash, row_hash(&without_identity), "the v1 form");
        assert_ne!(written.row_hash, row_hash(&base), "not the v2 form");

        let other_person = Hashed {
            identity: Some(Identity {
                issuer: "https://idp.example",
                subject: "u-2",
                method: "OIDC",
            }),
            ..base
        };
        let theirs = hashes(&other_person);
        assert_eq!(theirs.row_hash, written.row_hash);
        assert_ne!(
            theirs.identity_hash, written.identity_hash,
            "the identity is covered"
        );
        let other_action = hashes(&Hashed {
            action: "function.resume",
            ..base
        });
        assert_ne!(
            other_action.identity_hash, written.identity_hash,
            "the identity's hash is bound to its row"
        );
        assert_eq!(hashes(&without_identity).identity_hash, None);
    }

    #[test]
    fn a_row_verifies_in_either_written_form_and_not_with_its_identity_changed_or_removed() {
        let base = fields("alice", "function.pause");
        let written = hashes(&base);
        let as_written = || {
            stored(
                &base,
                written.row_hash.clone(),
                written.identity_hash.clone(),
            )
        };
        assert!(as_written().is_as_written());
        assert!(stored(&base, row_hash(&base), None).is_as_written(), "v2");
        let anonymous = Hashed {
            identity: None,
            ..base
        };
        assert!(
            stored(&anonymous, row_hash(&anonymous), None).is_as_written(),
            "v1 alone"
        );

        let changed = [
            StoredRow {
                actor_subject: Some("u-2".to_owned()),
                ..as_written()
            },
            StoredRow {
                auth_method: Some("BREAK_GLASS".to_owned()),
                ..as_written()
            },
            StoredRow {
                identity_hash: None,
                ..as_written()
            },
            StoredRow {
                actor_issuer: None,
                ..as_written()
            },
            StoredRow {
                actor: "bob".to_owned(),
                ..as_written()
            },
        ];
        for row in changed {
            assert!(!row.is_as_written(), "{row:?}");
        }
    }

    #[test]
    fn a_broken_link_names_its_row_and_what_is_wrong() {
        let link = BrokenLink {
            seq: 7,
            problem: Problem::Changed,
        };
        assert_eq!(
            link.to_string(),
            "ops_log_chain: row 7's content does not match its hash (changed after it was \
             written)"
        );
        assert_eq!(
            serde_json::to_value(&link).unwrap_or_default(),
            serde_json::json!({"seq": 7, "problem": "changed"})
        );
        let tail = BrokenLink {
            seq: 12,
            problem: Problem::TailDeleted { last_seq: 11 },
        };
        assert_eq!(
            tail.to_string(),
            "ops_log_chain: the head says 12 rows but the log ends at 11 (the tail was deleted)"
        );
    }
}
