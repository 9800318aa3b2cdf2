//! The web console's sessions (`console_sessions`): what a console cookie stands for, and the
//! ADMINs' view of them (docs/api.md, "The web console"; docs/operations.md, "Console sessions").
//!
//! - A session is made at sign-in ([`create`]) with the roles the person had then. The browser
//!   holds a random 32-byte secret; the table holds its SHA-256, so a copy of the table cannot
//!   be presented as anyone's session.
//! - It is [`active`] while not ended, before its expiry and within the idle timeout; the last
//!   request's time is written at most once per [`TOUCH_AT_MOST_EVERY`], not on every page.
//! - It ends when its holder signs out ([`end_own`]) or an ADMIN ends it (ops-logged).
//! - The list of active sessions is a security view (who is signed in, vouched for by whom), so
//!   it is ADMIN only although a GET needs only OPS by the admin API's rule: the handler checks.

use std::time::Duration;

use axum::{
    Extension, Json, Router,
    extract::{Path, State, rejection::PathRejection},
    routing::{get, post},
};
use base64::Engine;
use chrono::{DateTime, Utc};
use paybus_db::column;
use paybus_ops::{
    actor::{Actor, AuthMethod},
    ops_log,
};
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::{MySqlConnection, MySqlPool};
use uuid::Uuid;

use crate::{ApiError, AppState, auth::Caller, role::Role};

/// `last_seen_at` is written at most this often: the idle timeout is kept to within it
/// without a write per page.
pub const TOUCH_AT_MOST_EVERY: Duration = Duration::from_secs(60);
/// The secret's length: as many random bits as the session's hash has.
const SECRET_BYTES: usize = 32;
/// The identity columns' width: an issuer or subject longer than this cannot be stored whole,
/// and a cut one would name someone else.
const IDENTITY_MAX_CHARS: usize = 255;
/// The list's length: sessions active at once are few; more than this is itself a finding.
const LIST_LIMIT: u32 = 500;

/// A session just made: its public id and the secret the cookie carries (never stored).
pub(crate) struct Issued {
    pub public_id: Uuid,
    pub secret: String,
}

/// Makes a session for `actor` with `roles`, ending `lasts` from now.
pub(crate) async fn create(
    conn: &mut MySqlConnection,
    actor: &Actor,
    roles: &[Role],
    lasts: Duration,
) -> Result<Issued, ApiError> {
    if actor.issuer.chars().count() > IDENTITY_MAX_CHARS
        || actor.subject.chars().count() > IDENTITY_MAX_CHARS
    {
        return Err(ApiError::BadRequest(format!(
            "the identity provider's issuer or subject is longer than {IDENTITY_MAX_CHARS} \
             characters: such a session cannot be recorded"
        )));
    }
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::Internal(Box::new(e)))?;
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let public_id = Uuid::new_v4();
    let name: String = actor.name.chars().take(IDENTITY_MAX_CHARS).collect();
    sqlx::query(
        "INSERT INTO console_sessions (public_id, secret_sha256, issuer, subject, name, \
         auth_method, roles, created_at, last_seen_at, expires_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, NOW(6), NOW(6), NOW(6) + INTERVAL ? SECOND)",
    )
    .bind(public_id.to_string())
    .bind(secret_sha256(&secret).as_slice())
    .bind(&actor.issuer)
    .bind(&actor.subject)
    .bind(&name)
    .bind(actor.via.to_string())
    .bind(roles_column(roles))
    .bind(lasts.as_secs())
    .execute(&mut *conn)
    .await?;
    Ok(Issued { public_id, secret })
}

/// An active session: who holds it, as every console page and action acts.
pub(crate) struct Active {
    pub public_id: Uuid,
    pub caller: Caller,
}

#[derive(sqlx::FromRow)]
struct ActiveRow {
    id: u64,
    public_id: String,
    issuer: String,
    subject: String,
    name: String,
    auth_method: String,
    roles: String,
    expires_at: DateTime<Utc>,
    due_a_touch: bool,
}

/// The active session `secret` stands for, if any (unknown, ended, expired and idle ones are
/// none); its last request becomes now (at most once per [`TOUCH_AT_MOST_EVERY`]).
#[tracing::instrument(skip_all)]
pub(crate) async fn active(
    conn: &mut MySqlConnection,
    secret: &str,
    idle_timeout: Duration,
) -> Result<Option<Active>, ApiError> {
    let row: Option<ActiveRow> = sqlx::query_as(
        "SELECT id, public_id, issuer, subject, name, auth_method, roles, expires_at, \
         last_seen_at <= NOW(6) - INTERVAL ? SECOND AS due_a_touch \
         FROM console_sessions \
         WHERE secret_sha256 = ? AND ended_at IS NULL AND expires_at > NOW(6) \
         AND last_seen_at > NOW(6) - INTERVAL ? SECOND",
    )
    .bind(TOUCH_AT_MOST_EVERY.as_secs())
    .bind(secret_sha256(secret).as_slice())
    .bind(idle_timeout.as_secs())
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    if row.due_a_touch {
        sqlx::query("UPDATE console_sessions SET last_seen_at = NOW(6) WHERE id = ?")
            .bind(row.id)
            .execute(&mut *conn)
            .await?;
    }
    let via: AuthMethod = column::parse("console session", row.id, "auth_method", row.auth_method)
        .map_err(|e| ApiError::Internal(Box::new(e)))?;
    let roles = parse_roles(row.id, &row.roles)?;
    let public_id = Uuid::parse_str(&row.public_id).map_err(|e| ApiError::Internal(Box::new(e)))?;
    Ok(Some(Active {
        public_id,
        caller: Caller {
            actor: Actor {
                issuer: row.issuer,
                subject: row.subject,
                name: row.name,
                via,
            },
            roles,
            expires_at: u64::try_from(row.expires_at.timestamp()).unwrap_or(0),
        },
    }))
}

/// Ends the session `secret` stands for, as its holder signing out; how it was signed in to
/// (`None`: no such session). Ending one already ended changes nothing.
#[tracing::instrument(skip_all)]
pub(crate) async fn end_own(
    conn: &mut MySqlConnection,
    secret: &str,
) -> Result<Option<AuthMethod>, ApiError> {
    let hash = secret_sha256(secret);
    let method: Option<(u64, String)> =
        sqlx::query_as("SELECT id, auth_method FROM console_sessions WHERE secret_sha256 = ?")
            .bind(hash.as_slice())
            .fetch_optional(&mut *conn)
            .await?;
    let Some((id, method)) = method else {
        return Ok(None);
    };
    sqlx::query(
        "UPDATE console_sessions SET ended_at = NOW(6), ended_by = name, \
         ended_by_issuer = issuer, ended_by_subject = subject \
         WHERE id = ? AND ended_at IS NULL",
    )
    .bind(id)
    .execute(&mut *conn)
    .await?;
    column::parse("console session", id, "auth_method", method)
        .map(Some)
        .map_err(|e| ApiError::Internal(Box::new(e)))
}

/// A session as ADMINs see it: never its secret or hash.
#[derive(Debug, Serialize)]
pub(crate) struct SessionView {
    /// What it is ended by.
    pub id: Uuid,
    pub name: String,
    pub issuer: String,
    pub subject: String,
    /// `OIDC` (signed in with the identity provider) or `BREAK_GLASS`.
    pub auth_method: String,
    pub roles: Vec<Role>,
    pub created_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct ViewRow {
    id: u64,
    public_id: String,
    name: String,
    issuer: String,
    subject: String,
    auth_method: String,
    roles: String,
    created_at: DateTime<Utc>,
    last_seen_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

/// The active sessions, newest first.
#[tracing::instrument(skip_all)]
pub(crate) async fn list_active(
    conn: &mut MySqlConnection,
    idle_timeout: Duration,
) -> Result<Vec<SessionView>, ApiError> {
    let rows: Vec<ViewRow> = sqlx::query_as(
        "SELECT id, public_id, name, issuer, subject, auth_method, roles, created_at, \
         last_seen_at, expires_at FROM console_sessions \
         WHERE ended_at IS NULL AND expires_at > NOW(6) \
         AND last_seen_at > NOW(6) - INTERVAL ? SECOND \
         ORDER BY created_at DESC LIMIT ?",
    )
    .bind(idle_timeout.as_secs())
    .bind(LIST_LIMIT)
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(SessionView {
                id: Uuid::parse_str(&row.public_id).map_err(|e| ApiError::Internal(Box::new(e)))?,
                roles: parse_roles(row.id, &row.roles)?,
                name: row.name,
                issuer: row.issuer,
                subject: row.subject,
                auth_method: row.auth_method,
                created_at: row.created_at,
                last_seen_at: row.last_seen_at,
                expires_at: row.expires_at,
            })
        })
        .collect()
}

/// Ends session `public_id` as `by` (an ADMIN), with its ops-log row, in one transaction.
/// 404 when there is no such session, 409 when it had ended already.
#[tracing::instrument(skip_all, fields(session = %public_id))]
async fn end(pool: &MySqlPool, public_id: Uuid, by: &Actor) -> Result<Ended, ApiError> {
    let mut tx = pool.begin().await?;
    let ended = sqlx::query(
        "UPDATE console_sessions SET ended_at = NOW(6), ended_by = ?, ended_by_issuer = ?, \
         ended_by_subject = ? WHERE public_id = ? AND ended_at IS NULL",
    )
    .bind(&by.name)
    .bind(&by.issuer)
    .bind(&by.subject)
    .bind(public_id.to_string())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let row: Option<(String, String, String, Option<DateTime<Utc>>)> = sqlx::query_as(
        "SELECT name, issuer, subject, ended_at FROM console_sessions WHERE public_id = ?",
    )
    .bind(public_id.to_string())
    .fetch_optional(&mut *tx)
    .await?;
    let Some((name, issuer, subject, ended_at)) = row else {
        return Err(ApiError::NotFound(format!(
            "console session {public_id} does not exist"
        )));
    };
    if ended == 0 {
        return Err(ApiError::Conflict(format!(
            "console session {public_id} had already ended{}",
            ended_at.map_or_else(String::new, |at| format!(" at {}", at.to_rfc3339()))
        )));
    }
    ops_log::append(
        &mut tx,
        &ops_log::Entry {
            actor: by,
            action: "console_session.end",
            subject: &format!("console_session:{public_id}"),
            detail: &json!({"name": name, "issuer": issuer, "subject": subject}),
        },
    )
    .await?;
    tx.commit().await?;
    tracing::info!(session = %public_id, holder = %name, by = %by.name, "console session ended");
    Ok(Ended {
        id: public_id,
        name,
        issuer,
        subject,
    })
}

/// The cookie's secret as the table keeps it.
fn secret_sha256(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

fn roles_column(roles: &[Role]) -> String {
    roles
        .iter()
        .map(|role| role.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_roles(id: u64, column: &str) -> Result<Vec<Role>, ApiError> {
    column
        .split(',')
        .filter(|role| !role.is_empty())
        .map(|role| {
            column::parse("console session", id, "roles", role.to_owned())
                .map_err(|e| ApiError::Internal(Box::new(e)))
        })
        .collect()
}

/// This module's part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list_sessions, end_session))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/console-sessions", get(list_sessions))
        .route("/v1/admin/console-sessions/{id}/end", post(end_session))
}

#[derive(Debug, Serialize)]
struct SessionList {
    sessions: Vec<SessionView>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/console-sessions",
    tag = "console-sessions",
    operation_id = "list_console_sessions",
    security(("admin_token" = [])),
    // The role walk (api/tests/openapi.rs) reads it: this GET is not OPS's.
    extensions(("x-paybus-role" = json!("ADMIN"))),
    responses(
        (status = 200, description = "The console's active sessions, newest first (at most 500): `{sessions: [{id, name, issuer, subject, auth_method, roles, created_at, last_seen_at, expires_at}]}`. ADMIN only (a security view), although a GET needs only OPS elsewhere", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn list_sessions(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<SessionList>, ApiError> {
    if !caller.allows(Role::Admin) {
        return Err(ApiError::Forbidden(Role::Admin));
    }
    let mut conn = state.pool.acquire().await?;
    let sessions = list_active(&mut conn, state.console.config.idle_timeout).await?;
    Ok(Json(SessionList { sessions }))
}

/// What an ADMIN ended.
#[derive(Debug, Serialize)]
struct Ended {
    id: Uuid,
    name: String,
    issuer: String,
    subject: String,
}

#[utoipa::path(
    post,
    path = "/v1/admin/console-sessions/{id}/end",
    tag = "console-sessions",
    operation_id = "end_console_session",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The session's id (a UUID, from the list)")),
    responses(
        (status = 200, description = "Ended: its cookie no longer opens the console (`{id, name, issuer, subject}`); ops-logged as `console_session.end`", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn end_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Ended>, ApiError> {
    let id = id
        .ok()
        .and_then(|Path(id)| Uuid::parse_str(&id).ok())
        .ok_or_else(|| ApiError::BadRequest("the session id must be a UUID".to_owned()))?;
    Ok(Json(end(&state.pool, id, &caller.actor).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_through_their_column() {
        let column = roles_column(&[Role::Admin, Role::Ops]);
        assert_eq!(column, "ADMIN,OPS");
        assert_eq!(
            parse_roles(1, &column).ok(),
            Some(vec![Role::Admin, Role::Ops])
        );
        assert_eq!(parse_roles(1, "").ok(), Some(vec![]));
        assert!(parse_roles(1, "ROOT").is_err());
    }

    #[test]
    fn the_table_keeps_a_hash_never_the_secret() {
        let hash = secret_sha256("secret");
        assert_ne!(hash.as_slice(), b"secret");
        assert_eq!(hash, secret_sha256("secret"));
        assert_ne!(hash, secret_sha256("secreT"));
    }
}
