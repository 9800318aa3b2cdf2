//! Four-eyes: an ops action that moves or hides money is requested by one person and runs only
//! after another has approved it ([`FourEyes`] says which, `PAYBUS_FOUR_EYES`). The dead-letter
//! operations keep their own record; every other guarded action is an [`Approval`] row here.
//! [`ApprovalStatus`]: AWAITING_APPROVAL → APPROVED → EXECUTED, each step only before expiry.
//!
//! Rules (docs/operations.md, "four-eyes beyond dead letters"):
//! - **One open request per (action, subject)**: the open one holds `pending_slot`, a unique
//!   key, so the database, not a read, decides between concurrent requests; [`request`] returns
//!   the open one or inserts the slot's new holder. Only the slot's holder can be approved or
//!   executed.
//! - **Executed once**: an execution first [`claim`]s the approval (a conditional UPDATE one
//!   caller wins), runs the action, then records it ([`executed`]); others wait up to
//!   [`RESULT_WAIT`] for that record. A claim unrecorded after [`EXECUTION_LEASE`] is taken
//!   over: the action is a conditional update, so running it again changes nothing. A failed
//!   action [`release`]s its claim.

use std::{collections::BTreeSet, time::Duration};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{Connection, MySqlConnection};
use uuid::Uuid;

use crate::actor::Actor;
use paybus_config::{ConfigError, Setting, Vars};
use paybus_db as db;

paybus_db::column_enum! {
    /// The actions four-eyes can guard, as `PAYBUS_FOUR_EYES` names them (kebab-case there).
    #[derive(PartialOrd, Ord, Hash)]
    pub enum Guarded {
        /// Replaying dead letters (their dead-letter operation is what is approved).
        Replay,
        /// Archiving dead letters with money at stake.
        Archive,
        /// A FAILED bonus job back to PENDING.
        JobRetry,
        /// A suspension's FAILED cancel tasks back to PENDING.
        SuspensionRetry,
        /// A suspended market back to ACTIVE.
        MarketResume,
    }
}

impl Guarded {
    pub const ALL: [Guarded; 5] = [
        Guarded::Replay,
        Guarded::Archive,
        Guarded::JobRetry,
        Guarded::SuspensionRetry,
        Guarded::MarketResume,
    ];

    /// Its name in `PAYBUS_FOUR_EYES`.
    pub fn setting_name(self) -> &'static str {
        match self {
            Guarded::Replay => "replay",
            Guarded::Archive => "archive",
            Guarded::JobRetry => "job-retry",
            Guarded::SuspensionRetry => "suspension-retry",
            Guarded::MarketResume => "market-resume",
        }
    }
}

pub const VAR_FOUR_EYES: Setting = Setting {
    name: "PAYBUS_FOUR_EYES",
    default: "`replay,archive,job-retry,suspension-retry,market-resume`",
    about: "ops actions a second ADMIN must approve before they run, comma-separated: \
            `replay` and `archive` (dead letters; an archive only when a letter has money at \
            stake), `job-retry`, `suspension-retry`, `market-resume`; or `off` \
            (`infra/run.sh`'s local mode sets `off`)",
};
pub const VAR_OPERATION_TTL_SECONDS: Setting = Setting {
    name: "PAYBUS_OPERATION_TTL_SECONDS",
    default: "`3600`",
    about: "a request for a guarded action (a dead-letter operation, an approval) expires after \
            it: it can no longer be approved or started (seconds, 60 to 604800)",
};

/// What `paybus settings` lists for four-eyes.
pub const SETTINGS: &[Setting] = &[VAR_FOUR_EYES, VAR_OPERATION_TTL_SECONDS];

/// Which actions need a second person, and how long a request stays actionable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FourEyes {
    guarded: BTreeSet<Guarded>,
    pub ttl: Duration,
}

impl Default for FourEyes {
    fn default() -> Self {
        Self {
            guarded: Guarded::ALL.into_iter().collect(),
            ttl: Duration::from_secs(3600),
        }
    }
}

impl FourEyes {
    /// Nothing needs approval (local mode, and tests about something else).
    pub fn off() -> Self {
        Self {
            guarded: BTreeSet::new(),
            ..Self::default()
        }
    }

    /// Only `actions` need approval.
    pub fn only(actions: &[Guarded]) -> Self {
        Self {
            guarded: actions.iter().copied().collect(),
            ..Self::default()
        }
    }

    pub fn read(vars: &Vars) -> Result<Self, ConfigError> {
        const EXPECTED: &str = "`replay`, `archive`, `job-retry`, `suspension-retry`, \
                                `market-resume`, comma-separated, or `off`";
        let mut four_eyes = Self::default();
        match vars.get(VAR_FOUR_EYES) {
            None => {}
            Some(value) if value.trim().eq_ignore_ascii_case("off") => {
                four_eyes.guarded.clear();
            }
            Some(value) => {
                four_eyes.guarded.clear();
                for name in value.split(',').map(str::trim) {
                    let action = Guarded::ALL
                        .into_iter()
                        .find(|a| a.setting_name().eq_ignore_ascii_case(name))
                        .ok_or_else(|| vars.error(VAR_FOUR_EYES, value, EXPECTED))?;
                    four_eyes.guarded.insert(action);
                }
            }
        }
        let seconds = vars.parse(
            VAR_OPERATION_TTL_SECONDS,
            3600_u64,
            "a number of seconds from 60 to 604800",
            |seconds| (60..=604_800).contains(seconds),
        )?;
        four_eyes.ttl = Duration::from_secs(seconds);
        Ok(four_eyes)
    }

    pub fn requires(&self, action: Guarded) -> bool {
        self.guarded.contains(&action)
    }
}

paybus_db::column_enum! {
    /// `ops_approvals.status` (the module docs are the reference).
    pub enum ApprovalStatus {
        AwaitingApproval,
        Approved,
        Executed,
    }
}

/// How long an execution's claim stands without a recorded result before another execution
/// may take it over (its claimer died between the action and the record).
pub const EXECUTION_LEASE: Duration = Duration::from_secs(60);

/// How long an execution that lost the claim waits for the winner's recorded result. The
/// actions are one short transaction each: a winner still running after this is stuck, and
/// the caller is told so rather than held.
pub const RESULT_WAIT: Duration = Duration::from_secs(5);

/// How often a waiting execution looks for the recorded result.
const RESULT_POLL: Duration = Duration::from_millis(25);

/// The unique key that makes one open request per (action, subject).
const OPEN_REQUEST_KEY: &str = "uk_ops_approvals_pending_slot";

/// Rounds of "read the open request, else insert one" a request makes. Each further round
/// needs the open request to have been executed or expired since the last: never more than
/// two in practice.
const REQUEST_ROUNDS: u32 = 5;

/// A request for a guarded action, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Approval {
    pub id: Uuid,
    pub action: Guarded,
    /// What it acts on, `kind:id` (`charge_event_job:42`, `market:BTC-USDT`).
    pub subject: String,
    pub status: ApprovalStatus,
    /// Who asked, as people read it; `requested_by_issuer` and `requested_by_subject` say who
    /// that is (`null` on a request written before identities were recorded: it can no longer
    /// be approved).
    pub requested_by: String,
    pub requested_by_issuer: Option<String>,
    pub requested_by_subject: Option<String>,
    pub requested_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Past its expiry before it was executed: it can no longer be approved or executed.
    pub expired: bool,
    /// The open request for its action and subject (see the module docs): only it can be
    /// approved and executed.
    pub open: bool,
    pub approved_by: Option<String>,
    pub approved_at: Option<DateTime<Utc>>,
    /// An execution claimed it then and is running the action (APPROVED, claim within its
    /// lease).
    pub executing_since: Option<DateTime<Utc>>,
    pub executed_by: Option<String>,
    pub executed_at: Option<DateTime<Utc>>,
    /// What the execution did, as the action reported it.
    pub result: Option<String>,
}

/// Why an approval step was refused.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("approval {0} does not exist")]
    NotFound(Uuid),
    #[error("approval {0} was requested by you: another ADMIN must approve it")]
    SelfApproval(Uuid),
    /// A break-glass token's holder (or a request recorded without an identity) cannot be one
    /// of four eyes.
    #[error("{0}")]
    NotAPerson(String),
    /// Not in a state that allows the step (awaiting, expired, executed, not the open
    /// request, still being executed by another caller).
    #[error("approval {id}: {problem}")]
    State { id: Uuid, problem: String },
    /// Concurrent requests for the same action and subject kept opening and closing it.
    #[error("{action} on {subject}: other requests kept changing it; ask again")]
    Contended { action: Guarded, subject: String },
    #[error("approval {id} holds {value:?} in {column}, which this code does not know")]
    Unknown {
        id: String,
        column: &'static str,
        value: String,
    },
}

#[derive(sqlx::FromRow)]
struct ApprovalRow {
    id: String,
    action: String,
    subject: String,
    status: String,
    requested_by: String,
    requested_by_issuer: Option<String>,
    requested_by_subject: Option<String>,
    requested_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    past_expiry: bool,
    pending_slot: Option<u8>,
    approved_by: Option<String>,
    approved_at: Option<DateTime<Utc>>,
    claimed_at: Option<DateTime<Utc>>,
    executed_by: Option<String>,
    executed_at: Option<DateTime<Utc>>,
    result: Option<String>,
    /// The database's clock when the row was read: a claim's lease is judged by it, as the
    /// claim's UPDATE judges it.
    read_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, action, subject, status, requested_by, requested_by_issuer, \
     requested_by_subject, requested_at, expires_at, \
     (expires_at < NOW(6)) AS past_expiry, pending_slot, approved_by, approved_at, claimed_at, \
     executed_by, executed_at, result, NOW(6) AS read_at";

impl ApprovalRow {
    fn into_approval(self) -> Result<Approval, ApprovalError> {
        let unknown = |column: &'static str, value: &str| ApprovalError::Unknown {
            id: self.id.clone(),
            column,
            value: value.to_owned(),
        };
        let status: ApprovalStatus = self
            .status
            .parse()
            .map_err(|_| unknown("status", &self.status))?;
        let lease = chrono::Duration::from_std(EXECUTION_LEASE).unwrap_or(chrono::Duration::MAX);
        let executing_since = self.claimed_at.filter(|claimed_at| {
            status == ApprovalStatus::Approved
                && claimed_at
                    .checked_add_signed(lease)
                    .unwrap_or(DateTime::<Utc>::MAX_UTC)
                    > self.read_at
        });
        Ok(Approval {
            id: Uuid::parse_str(&self.id).map_err(|_| unknown("id", &self.id))?,
            action: self
                .action
                .parse()
                .map_err(|_| unknown("action", &self.action))?,
            expired: status != ApprovalStatus::Executed && self.past_expiry,
            open: self.pending_slot.is_some(),
            status,
            subject: self.subject,
            requested_by: self.requested_by,
            requested_by_issuer: self.requested_by_issuer,
            requested_by_subject: self.requested_by_subject,
            requested_at: self.requested_at,
            expires_at: self.expires_at,
            approved_by: self.approved_by,
            approved_at: self.approved_at,
            executing_since,
            executed_by: self.executed_by,
            executed_at: self.executed_at,
            result: self.result,
        })
    }
}

async fn find(
    conn: &mut MySqlConnection,
    id: Uuid,
    lock: &str,
) -> Result<Option<Approval>, ApprovalError> {
    let sql = format!("SELECT {COLUMNS} FROM ops_approvals WHERE id = ?{lock}");
    sqlx::query_as::<_, ApprovalRow>(sqlx::AssertSqlSafe(sql))
        .bind(id.to_string())
        .fetch_optional(conn)
        .await?
        .map(ApprovalRow::into_approval)
        .transpose()
}

/// The approval `id`, or `None`.
pub async fn show(conn: &mut MySqlConnection, id: Uuid) -> Result<Option<Approval>, ApprovalError> {
    find(conn, id, "").await
}

/// Approvals newest first, those awaiting approval only when `awaiting` (at most `limit`).
pub async fn list(
    conn: &mut MySqlConnection,
    awaiting: bool,
    limit: u32,
) -> Result<Vec<Approval>, ApprovalError> {
    let filter = if awaiting {
        " WHERE status = 'AWAITING_APPROVAL' AND expires_at > NOW(6)"
    } else {
        ""
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM ops_approvals{filter} ORDER BY requested_at DESC, id DESC LIMIT ?"
    );
    let rows: Vec<ApprovalRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(limit.clamp(1, 500))
        .fetch_all(conn)
        .await?;
    rows.into_iter().map(ApprovalRow::into_approval).collect()
}

/// `actor`'s request for `action` on `subject`: the open request for the same action and
/// subject, awaiting approval or approved (asking twice is one request, also at once), or a
/// new one expiring after `ttl` (see the module docs).
pub async fn request(
    conn: &mut MySqlConnection,
    action: Guarded,
    subject: &str,
    actor: &Actor,
    ttl: Duration,
) -> Result<Approval, ApprovalError> {
    refuse_break_glass(actor, "request")?;
    let subject: String = subject.chars().take(200).collect();
    for _ in 0..REQUEST_ROUNDS {
        if let Some(open) = open_request(conn, action, &subject).await? {
            return Ok(open);
        }
        match insert_request(conn, action, &subject, actor, ttl).await {
            Ok(requested) => return Ok(requested),
            // A concurrent request took the slot first (principle 2: an expected outcome),
            // or InnoDB chose this insert as a deadlock's victim and rolled it back whole:
            // the next round reads the winner.
            Err(ApprovalError::Database(lost))
                if db::is_duplicate_on(&lost, OPEN_REQUEST_KEY)
                    || db::error_number(&lost) == Some(DEADLOCK) =>
            {
                tracing::info!(%action, subject, actor = actor.name, error = %lost,
                    "four-eyes: a concurrent request for the same action and subject came first");
            }
            Err(other) => return Err(other),
        }
    }
    Err(ApprovalError::Contended { action, subject })
}

/// MySQL's and MariaDB's "Deadlock found when trying to get lock".
const DEADLOCK: u16 = 1213;

/// The open request for `action` on `subject`, read afresh (a statement of its own, so it
/// sees the latest commit); an expired holder's slot is freed instead, and `None` returned.
async fn open_request(
    conn: &mut MySqlConnection,
    action: Guarded,
    subject: &str,
) -> Result<Option<Approval>, ApprovalError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM ops_approvals \
         WHERE action = ? AND subject = ? AND pending_slot = 1"
    );
    let holder = sqlx::query_as::<_, ApprovalRow>(sqlx::AssertSqlSafe(sql))
        .bind(<&str>::from(action))
        .bind(subject)
        .fetch_optional(&mut *conn)
        .await?
        .map(ApprovalRow::into_approval)
        .transpose()?;
    let Some(holder) = holder else {
        return Ok(None);
    };
    if !holder.expired {
        return Ok(Some(holder));
    }
    // By its primary key and guarded: a row lock only, no gap lock for concurrent inserts of
    // the next request to deadlock on.
    sqlx::query(
        "UPDATE ops_approvals SET pending_slot = NULL \
         WHERE id = ? AND pending_slot = 1 AND expires_at < NOW(6)",
    )
    .bind(holder.id.to_string())
    .execute(&mut *conn)
    .await?;
    tracing::info!(approval = %holder.id, %action, subject,
        "four-eyes: the open request expired; a new one may be asked");
    Ok(None)
}

/// A new open request, with its ops log entry; a duplicate-key error when another holds the
/// slot.
async fn insert_request(
    conn: &mut MySqlConnection,
    action: Guarded,
    subject: &str,
    actor: &Actor,
    ttl: Duration,
) -> Result<Approval, ApprovalError> {
    let mut tx = conn.begin().await?;
    let id = Uuid::now_v7();
    let inserted = sqlx::query(
        "INSERT INTO ops_approvals (id, action, subject, status, requested_by, \
         requested_by_issuer, requested_by_subject, requested_at, expires_at, pending_slot) \
         VALUES (?, ?, ?, 'AWAITING_APPROVAL', ?, ?, ?, NOW(6), NOW(6) + INTERVAL ? SECOND, 1)",
    )
    .bind(id.to_string())
    .bind(<&str>::from(action))
    .bind(subject)
    .bind(actor.name.chars().take(100).collect::<String>())
    .bind(&actor.issuer)
    .bind(&actor.subject)
    .bind(ttl.as_secs())
    .execute(&mut *tx)
    .await;
    if let Err(lost) = inserted {
        // The duplicate check's shared lock on the winner's row goes now, not whenever this
        // connection is next used.
        tx.rollback().await?;
        return Err(lost.into());
    }
    crate::ops_log::append(
        &mut tx,
        &crate::ops_log::Entry {
            actor,
            action: "approval.request",
            subject: &format!("approval:{id}"),
            detail: &serde_json::json!({"action": action, "subject": subject}),
        },
    )
    .await?;
    let approval = find(&mut tx, id, "")
        .await?
        .ok_or(ApprovalError::NotFound(id))?;
    tx.commit().await?;
    tracing::warn!(approval = %id, %action, subject, actor = actor.name, "four-eyes: action requested");
    Ok(approval)
}

/// `actor` (not the requester) approves request `id`.
pub async fn approve(
    conn: &mut MySqlConnection,
    id: Uuid,
    actor: &Actor,
) -> Result<Approval, ApprovalError> {
    refuse_break_glass(actor, "approve")?;
    let mut tx = conn.begin().await?;
    let checked = approvable(&mut tx, id, actor).await;
    if let Err(refused) = checked {
        // The row lock goes now, not whenever this connection is next used.
        tx.rollback().await?;
        return Err(refused);
    }
    sqlx::query(
        "UPDATE ops_approvals SET status = 'APPROVED', approved_by = ?, approved_by_issuer = ?, \
         approved_by_subject = ?, approved_at = NOW(6) WHERE id = ?",
    )
    .bind(actor.name.chars().take(100).collect::<String>())
    .bind(&actor.issuer)
    .bind(&actor.subject)
    .bind(id.to_string())
    .execute(&mut *tx)
    .await?;
    let approved = find(&mut tx, id, "")
        .await?
        .ok_or(ApprovalError::NotFound(id))?;
    crate::ops_log::append(
        &mut tx,
        &crate::ops_log::Entry {
            actor,
            action: "approval.approve",
            subject: &format!("approval:{id}"),
            detail: &serde_json::json!({
                "action": approved.action,
                "subject": approved.subject,
                "requested_by": approved.requested_by,
            }),
        },
    )
    .await?;
    tx.commit().await?;
    tracing::warn!(approval = %id, actor = actor.name, "four-eyes: action approved");
    Ok(approved)
}

async fn approvable(
    conn: &mut MySqlConnection,
    id: Uuid,
    actor: &Actor,
) -> Result<Approval, ApprovalError> {
    let approval = find(conn, id, " FOR UPDATE")
        .await?
        .ok_or(ApprovalError::NotFound(id))?;
    awaiting_approval(
        approval.status == ApprovalStatus::AwaitingApproval,
        approval.status,
        approval.expired,
        approval.expires_at,
    )
    .map_err(|problem| ApprovalError::State { id, problem })?;
    if !approval.open {
        return Err(not_open(&approval));
    }
    let requester = (
        approval.requested_by_issuer.as_deref(),
        approval.requested_by_subject.as_deref(),
    );
    match second_person(requester, actor) {
        Ok(()) => Ok(approval),
        Err(NotSecondPerson::RequesterUnidentified) => Err(ApprovalError::NotAPerson(format!(
            "approval {id} was requested before requesters were identified by the identity \
             provider: request it again"
        ))),
        Err(NotSecondPerson::SamePerson) => Err(ApprovalError::SelfApproval(id)),
    }
}

/// Whether a four-eyes request (an approval here, a dead-letter operation in its own table)
/// can still be approved: awaiting approval and not expired. The problem otherwise, for the
/// caller's own error.
pub fn awaiting_approval(
    awaiting: bool,
    status: impl std::fmt::Display,
    expired: bool,
    expires_at: DateTime<Utc>,
) -> Result<(), String> {
    if !awaiting {
        return Err(format!("it is {status}, not awaiting approval"));
    }
    if expired {
        return Err(format!("it expired at {}", expires_at.to_rfc3339()));
    }
    Ok(())
}

/// Why `actor` is not the second person a four-eyes request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotSecondPerson {
    /// The request was made before requesters were identified by the identity provider, so
    /// nobody can tell whether `actor` made it.
    RequesterUnidentified,
    /// `actor` made the request.
    SamePerson,
}

/// Whether `actor` is someone other than the requester (`(issuer, subject)` as the identity
/// provider named them).
pub fn second_person(
    requester: (Option<&str>, Option<&str>),
    actor: &Actor,
) -> Result<(), NotSecondPerson> {
    let (Some(issuer), Some(subject)) = requester else {
        return Err(NotSecondPerson::RequesterUnidentified);
    };
    if actor.is(issuer, subject) {
        return Err(NotSecondPerson::SamePerson);
    }
    Ok(())
}

/// Four-eyes needs two people the identity provider vouches for: a break-glass token's holder
/// (anyone with the secret, under any name) can neither ask nor approve.
fn refuse_break_glass(actor: &Actor, step: &str) -> Result<(), ApprovalError> {
    if actor.is_person() {
        return Ok(());
    }
    Err(ApprovalError::NotAPerson(format!(
        "{} cannot {step} a four-eyes action: it needs two people the identity provider \
         vouches for (sign in with the provider, or switch four-eyes off with PAYBUS_FOUR_EYES)",
        actor.name
    )))
}

fn not_open(approval: &Approval) -> ApprovalError {
    ApprovalError::State {
        id: approval.id,
        problem: format!(
            "it is not the open request for {} on {} (a duplicate of another request): ask \
             again to get the open one",
            approval.action, approval.subject
        ),
    }
}

/// The right to run an approved action, won by one execution ([`claim`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The approval as the claim left it.
    pub approval: Approval,
    token: Uuid,
}

/// What an execution of an approval is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// This execution won the claim: run the action, then [`executed`] (or [`release`] when
    /// it could not run it).
    Run(Claim),
    /// It was executed: the approval with the result recorded then.
    Ran(Approval),
}

/// Claims approval `id` for an execution, or waits (at most [`RESULT_WAIT`]) for the result
/// of the execution that holds the claim (see the module docs). Refused while it awaits
/// approval, once it expired unexecuted, when it is not the open request, and when the
/// other execution has not recorded its result in time.
pub async fn claim(conn: &mut MySqlConnection, id: Uuid) -> Result<Turn, ApprovalError> {
    let deadline = tokio::time::Instant::now() + RESULT_WAIT;
    loop {
        let token = Uuid::now_v7();
        let won = sqlx::query(
            "UPDATE ops_approvals SET claim_token = ?, claimed_at = NOW(6) \
             WHERE id = ? AND status = 'APPROVED' AND pending_slot = 1 \
             AND expires_at >= NOW(6) \
             AND (claimed_at IS NULL OR claimed_at < NOW(6) - INTERVAL ? SECOND)",
        )
        .bind(token.to_string())
        .bind(id.to_string())
        .bind(EXECUTION_LEASE.as_secs())
        .execute(&mut *conn)
        .await?
        .rows_affected()
            == 1;
        let approval = find(conn, id, "")
            .await?
            .ok_or(ApprovalError::NotFound(id))?;
        if won {
            tracing::info!(approval = %id, "four-eyes: execution claimed");
            return Ok(Turn::Run(Claim { approval, token }));
        }
        let refused = |problem: String| Err(ApprovalError::State { id, problem });
        match approval.status {
            ApprovalStatus::Executed => return Ok(Turn::Ran(approval)),
            ApprovalStatus::AwaitingApproval if approval.expired => {
                return refused(format!(
                    "it expired at {} before a second ADMIN approved it: request it again",
                    approval.expires_at.to_rfc3339()
                ));
            }
            ApprovalStatus::AwaitingApproval => {
                return refused("it awaits the approval of a second ADMIN".to_owned());
            }
            // A claim's holder is running the action: its result is the answer.
            ApprovalStatus::Approved if approval.executing_since.is_some() => {}
            ApprovalStatus::Approved if approval.expired => {
                return refused(format!(
                    "it expired at {} before it ran: request it again",
                    approval.expires_at.to_rfc3339()
                ));
            }
            ApprovalStatus::Approved if !approval.open => return Err(not_open(&approval)),
            // Its claim went (released, lease passed) between the UPDATE and the read.
            ApprovalStatus::Approved => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return refused(match approval.executing_since {
                Some(since) => format!(
                    "another execution has been running it since {}: ask again for its result",
                    since.to_rfc3339()
                ),
                None => "other executions kept claiming it: ask again for its result".to_owned(),
            });
        }
        tokio::time::sleep(RESULT_POLL).await;
    }
}

/// Records that `actor` executed `claim`'s approval and what the action reported, and frees
/// its slot. When the claim was taken over meanwhile (this execution outlived its lease), the
/// result the other execution recorded stands: returned once recorded (waiting at most
/// [`RESULT_WAIT`]).
pub async fn executed(
    conn: &mut MySqlConnection,
    claim: &Claim,
    actor: &Actor,
    result: &str,
) -> Result<Approval, ApprovalError> {
    let id = claim.approval.id;
    let recorded = sqlx::query(
        "UPDATE ops_approvals SET status = 'EXECUTED', executed_by = ?, executed_at = NOW(6), \
         result = ?, pending_slot = NULL \
         WHERE id = ? AND status = 'APPROVED' AND claim_token = ?",
    )
    .bind(actor.name.chars().take(100).collect::<String>())
    .bind(result.chars().take(1000).collect::<String>())
    .bind(id.to_string())
    .bind(claim.token.to_string())
    .execute(&mut *conn)
    .await?
    .rows_affected()
        == 1;
    if recorded {
        tracing::warn!(approval = %id, actor = actor.name, "four-eyes: action executed");
    } else {
        tracing::warn!(approval = %id, actor = actor.name,
            "four-eyes: the claim was taken over before this execution recorded its result");
    }
    let deadline = tokio::time::Instant::now() + RESULT_WAIT;
    loop {
        let approval = find(conn, id, "")
            .await?
            .ok_or(ApprovalError::NotFound(id))?;
        if approval.status == ApprovalStatus::Executed {
            return Ok(approval);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApprovalError::State {
                id,
                problem: "another execution took it over and has not recorded its result yet: \
                          ask again for it"
                    .to_owned(),
            });
        }
        tokio::time::sleep(RESULT_POLL).await;
    }
}

/// Gives up `claim` without a result (the action failed with an error), so the next
/// execution need not wait for the lease.
pub async fn release(conn: &mut MySqlConnection, claim: &Claim) -> Result<(), ApprovalError> {
    sqlx::query(
        "UPDATE ops_approvals SET claim_token = NULL, claimed_at = NULL \
         WHERE id = ? AND status = 'APPROVED' AND claim_token = ?",
    )
    .bind(claim.approval.id.to_string())
    .bind(claim.token.to_string())
    .execute(conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;

    use super::*;

    fn read(value: &str) -> Result<FourEyes, ConfigError> {
        FourEyes::read(&Vars::new(HashMap::from([(
            VAR_FOUR_EYES.name.to_owned(),
            value.to_owned(),
        )])))
    }

    #[test]
    fn every_documented_default_is_the_default() {
        for (name, environment) in paybus_config::setting::documented_defaults(SETTINGS) {
            assert_eq!(
                FourEyes::read(&Vars::new(environment)),
                Ok(FourEyes::default()),
                "{name}"
            );
        }
    }

    #[test]
    fn four_eyes_is_per_action_or_off_and_anything_else_names_the_variable() {
        let some = read(" Job-Retry , market-resume").unwrap();
        assert!(some.requires(Guarded::JobRetry) && some.requires(Guarded::MarketResume));
        assert!(!some.requires(Guarded::Replay));
        assert_eq!(read("off").unwrap(), FourEyes::off());
        assert!(
            Guarded::ALL
                .iter()
                .all(|a| FourEyes::default().requires(*a))
        );
        assert_eq!(
            read("replay,burn").unwrap_err().variable,
            VAR_FOUR_EYES.name
        );
    }
}
