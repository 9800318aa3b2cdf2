//! `Idempotency-Key` on the partner API's POSTs that create or act, with the IETF httpapi
//! draft's and Stripe's semantics (docs/partners.md, "Idempotency-Key"): the first request with
//! a key runs and its answer is kept 24 h; the same request again gets that answer
//! (`Idempotent-Replayed: true`) and has no second effect; another request under the key is 422;
//! one while the first still runs is 409 with `Retry-After: 1`; a 5xx is not kept.
//!
//! A running request renews its key's lease ([`LEASE`]) every [`RENEW_EVERY`], so it holds the
//! key however long it runs, and a process that dies mid-request frees it within one short
//! lease: a fixed lease long enough for any request would have every retrying partner refused
//! 409 for its whole length after an API crash. The retry then runs again, and the handler's
//! effect, keyed on the same key in its own table, is found rather than made twice.

use std::{
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use axum::{
    Extension,
    body::{Body, Bytes},
    extract::{FromRequest, Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use sha2::{Digest, Sha256};
use sqlx::{MySql, MySqlConnection, mysql::MySqlArguments, query::Query};
use tokio_util::task::AbortOnDropHandle;

use super::PartnerIdentity;
use crate::{ApiError, AppState};

pub const HEADER: &str = "idempotency-key";
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// How long a request's key is held past its last renewal before a retry may take it over:
/// how long partners wait for an order whose API process died mid-request.
pub const LEASE: Duration = Duration::from_secs(10);
/// How often a running request renews its lease: a few renewals fit in one lease, so a slow
/// database delays one without losing the key.
pub const RENEW_EVERY: Duration = Duration::from_secs(3);
/// How long an answer is kept (at least; the prune removes older ones).
pub const RETENTION_HOURS: u32 = 24;
const KEY_MAX_LEN: usize = 255;
/// One in this many new keys also prunes expired ones (a bounded DELETE), so the table stays
/// small without a job of its own.
const PRUNE_EVERY: u32 = 64;
const PRUNE_BATCH: u32 = 500;

/// The key of the request being served, for the handler's own effect (the order's
/// `idempotency_key` column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(pub String);

/// The header's value: 1–255 visible ASCII characters, optionally as a quoted string (the
/// draft's sf-string form).
fn parse_key(value: &HeaderValue) -> Result<String, ApiError> {
    let raw = value.to_str().unwrap_or("").trim();
    let key = raw
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or(raw);
    if key.is_empty() || key.len() > KEY_MAX_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::BadRequest(format!(
            "Idempotency-Key must be 1 to {KEY_MAX_LEN} visible ASCII characters"
        )));
    }
    Ok(key.to_owned())
}

fn fingerprint(method: &str, path: &str, body: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(method.as_bytes());
    hash.update([0]);
    hash.update(path.as_bytes());
    hash.update([0]);
    hash.update(body);
    hash.finalize().into()
}

#[derive(sqlx::FromRow)]
struct KeptRow {
    request_fingerprint: Vec<u8>,
    status: String,
    locked: bool,
    expired: bool,
    response_status: Option<u16>,
    response_body: Option<String>,
}

/// What the key's row says about this request.
enum Claim {
    /// Run it (a new key, an expired one, or one whose runner died).
    Run,
    Replay {
        status: u16,
        body: String,
    },
    Busy,
    OtherRequest,
}

/// The middleware (on the partner POSTs that take a key; after the partner's key check).
pub(crate) async fn idempotent(
    State(state): State<AppState>,
    Extension(partner): Extension<PartnerIdentity>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(value) = request.headers().get(HEADER) else {
        return Ok(next.run(request).await);
    };
    let key = parse_key(value)?;
    let method = request.method().as_str().to_owned();
    let path = request.uri().path_and_query().map_or_else(
        || request.uri().path().to_owned(),
        |p| p.as_str().to_owned(),
    );
    let (parts, body) = request.into_parts();
    let body = crate::body::bytes(
        Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await,
    )?;
    let print = fingerprint(&method, &path, &body);
    let partner_id = partner.partner_id;

    match claim(&state, partner_id, &key, &print).await? {
        Claim::Run => {}
        Claim::Replay { status, body } => return Ok(replay(status, body)),
        Claim::Busy => {
            let mut busy = ApiError::Conflict(format!(
                "a request with Idempotency-Key {key:?} is still being processed; retry shortly"
            ))
            .into_response();
            busy.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Ok(busy);
        }
        Claim::OtherRequest => {
            return Err(ApiError::Unprocessable(format!(
                "Idempotency-Key {key:?} was used with another request (method, path or body \
                 differ); use a new key for a new request"
            )));
        }
    }

    let mut request = Request::from_parts(parts, Body::from(body));
    request.extensions_mut().insert(IdempotencyKey(key.clone()));
    let renewal = AbortOnDropHandle::new(tokio::spawn(renew_lease(
        state.clone(),
        partner_id,
        key.clone(),
    )));
    let response = next.run(request).await;
    drop(renewal);
    let (parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(error) => {
            release(&state, partner_id, &key).await;
            return Err(ApiError::Internal(Box::new(error)));
        }
    };
    if parts.status.is_server_error() {
        release(&state, partner_id, &key).await;
    } else if let Err(error) = keep(&state, partner_id, &key, parts.status, &bytes).await {
        // The answer still goes out; the key stays IN_PROGRESS until its lease passes, and a
        // retry then runs again and finds the order by its key.
        tracing::warn!(partner_id, error = %error, "could not keep an idempotent answer");
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}

/// Extends the key's lease every [`RENEW_EVERY`] while the request runs (aborted when it
/// ends). A failed renewal is only logged: the next one may succeed, and a lease that ran out
/// lets a retry in, whose effect the order's own key still keeps single.
async fn renew_lease(state: AppState, partner_id: u64, key: String) {
    let mut ticks =
        tokio::time::interval_at(tokio::time::Instant::now() + RENEW_EVERY, RENEW_EVERY);
    loop {
        ticks.tick().await;
        let renewed = sqlx::query(
            "UPDATE partner_idempotency_keys SET locked_until = NOW(6) + INTERVAL ? SECOND \
             WHERE partner_id = ? AND idempotency_key = ? AND status = 'IN_PROGRESS'",
        )
        .bind(LEASE.as_secs())
        .bind(partner_id)
        .bind(&key)
        .execute(&state.pool)
        .await;
        if let Err(error) = renewed {
            tracing::warn!(partner_id, %error, "could not renew an idempotency key's lease");
        }
    }
}

async fn claim(
    state: &AppState,
    partner_id: u64,
    key: &str,
    print: &[u8; 32],
) -> Result<Claim, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let inserted = sqlx::query(
        "INSERT INTO partner_idempotency_keys \
         (partner_id, idempotency_key, request_fingerprint, locked_until) \
         VALUES (?, ?, ?, NOW(6) + INTERVAL ? SECOND)",
    )
    .bind(partner_id)
    .bind(key)
    .bind(print.as_slice())
    .bind(LEASE.as_secs())
    .execute(&mut *conn)
    .await;
    match inserted {
        Ok(_) => {
            prune_now_and_then(&mut conn).await;
            return Ok(Claim::Run);
        }
        Err(error) if paybus_db::is_duplicate_on(&error, "PRIMARY") => {}
        Err(error) => return Err(error.into()),
    }
    let row: Option<KeptRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT request_fingerprint, status, locked_until > NOW(6) AS locked, \
                created_at < NOW(6) - INTERVAL {RETENTION_HOURS} HOUR AS expired, \
                response_status, response_body \
         FROM partner_idempotency_keys WHERE partner_id = ? AND idempotency_key = ?"
    )))
    .bind(partner_id)
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        // Pruned between the INSERT and the read: the client's retry starts afresh.
        return Ok(Claim::Busy);
    };
    if row.expired {
        // Past its retention: the key is new again (conditional, so two retries cannot both
        // take it).
        let update = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE partner_idempotency_keys \
             SET request_fingerprint = ?, status = 'IN_PROGRESS', \
                 locked_until = NOW(6) + INTERVAL ? SECOND, response_status = NULL, \
                 response_body = NULL, completed_at = NULL, created_at = NOW(6) \
             WHERE partner_id = ? AND idempotency_key = ? \
               AND created_at < NOW(6) - INTERVAL {RETENTION_HOURS} HOUR"
        )))
        .bind(print.as_slice());
        let taken = take_over(&mut conn, update, partner_id, key).await?;
        return Ok(if taken { Claim::Run } else { Claim::Busy });
    }
    if row.request_fingerprint.as_slice() != print.as_slice() {
        return Ok(Claim::OtherRequest);
    }
    match (row.status.as_str(), row.response_status, row.response_body) {
        ("DONE", Some(status), Some(body)) => Ok(Claim::Replay { status, body }),
        _ if row.locked => Ok(Claim::Busy),
        _ => {
            // Its runner died (the lease passed): take it over, conditionally.
            let update = sqlx::query(
                "UPDATE partner_idempotency_keys SET locked_until = NOW(6) + INTERVAL ? SECOND \
                 WHERE partner_id = ? AND idempotency_key = ? AND status = 'IN_PROGRESS' \
                   AND locked_until <= NOW(6)",
            );
            let taken = take_over(&mut conn, update, partner_id, key).await?;
            if taken {
                tracing::info!(
                    partner_id,
                    "an interrupted idempotent request is run again under its key"
                );
            }
            Ok(if taken { Claim::Run } else { Claim::Busy })
        }
    }
}

/// Takes the key over with `update`, a conditional UPDATE whose last parameters are the new
/// lease, the partner and the key: whether this request took it (a concurrent retry may have
/// first).
async fn take_over(
    conn: &mut MySqlConnection,
    update: Query<'_, MySql, MySqlArguments>,
    partner_id: u64,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let taken = update
        .bind(LEASE.as_secs())
        .bind(partner_id)
        .bind(key)
        .execute(conn)
        .await?
        .rows_affected();
    Ok(taken == 1)
}

async fn keep(
    state: &AppState,
    partner_id: u64,
    key: &str,
    status: StatusCode,
    body: &[u8],
) -> Result<(), sqlx::Error> {
    let mut conn = state.pool.acquire().await?;
    sqlx::query(
        "UPDATE partner_idempotency_keys \
         SET status = 'DONE', response_status = ?, response_body = ?, completed_at = NOW(6) \
         WHERE partner_id = ? AND idempotency_key = ? AND status = 'IN_PROGRESS'",
    )
    .bind(status.as_u16())
    .bind(String::from_utf8_lossy(body).as_ref())
    .bind(partner_id)
    .bind(key)
    .execute(&mut *conn)
    .await
    .map(drop)
}

/// Frees the key after a 5xx (a retry runs again). A failure here only delays that retry until
/// the lease passes.
async fn release(state: &AppState, partner_id: u64, key: &str) {
    let deleted = async {
        let mut conn = state.pool.acquire().await?;
        sqlx::query(
            "DELETE FROM partner_idempotency_keys \
             WHERE partner_id = ? AND idempotency_key = ? AND status = 'IN_PROGRESS'",
        )
        .bind(partner_id)
        .bind(key)
        .execute(&mut *conn)
        .await
    }
    .await;
    if let Err(error) = deleted {
        tracing::warn!(partner_id, error = %error, "could not free an idempotency key after a 5xx");
    }
}

fn replay(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

static NEW_KEYS: AtomicU32 = AtomicU32::new(0);

async fn prune_now_and_then(conn: &mut sqlx::MySqlConnection) {
    if !NEW_KEYS
        .fetch_add(1, Ordering::Relaxed)
        .is_multiple_of(PRUNE_EVERY)
    {
        return;
    }
    let pruned = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM partner_idempotency_keys \
         WHERE created_at < NOW(6) - INTERVAL {RETENTION_HOURS} HOUR LIMIT {PRUNE_BATCH}"
    )))
    .execute(conn)
    .await;
    match pruned {
        Ok(done) if done.rows_affected() > 0 => {
            tracing::debug!(
                pruned = done.rows_affected(),
                "expired idempotency keys pruned"
            )
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(error = %error, "could not prune idempotency keys"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_visible_ascii_plain_or_quoted() {
        let parse = |raw: &str| parse_key(&HeaderValue::from_str(raw).expect("header")).ok();
        assert_eq!(parse("order-42"), Some("order-42".to_owned()));
        assert_eq!(parse("\"8e03978e-40d5\""), Some("8e03978e-40d5".to_owned()));
        assert_eq!(parse(""), None);
        assert_eq!(parse("two words"), None);
        assert_eq!(parse(&"k".repeat(256)), None);
        assert_eq!(parse(&"k".repeat(255)).map(|k| k.len()), Some(255));
    }

    #[test]
    fn the_fingerprint_covers_method_path_and_body() {
        let base = fingerprint("POST", "/v1/partner/x", b"{}");
        assert_ne!(base, fingerprint("POST", "/v1/partner/y", b"{}"));
        assert_ne!(base, fingerprint("PUT", "/v1/partner/x", b"{}"));
        assert_ne!(base, fingerprint("POST", "/v1/partner/x", b"{ }"));
        assert_eq!(base, fingerprint("POST", "/v1/partner/x", b"{}"));
    }
}
