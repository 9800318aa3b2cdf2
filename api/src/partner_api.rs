//! The partner API (`/v1/partner/*`): what a partner does for itself, with an API key an ADMIN
//! made for it ([`crate::partners::keys`]; docs/partners.md): [`orders`] (W1's orders),
//! [`records`] (W2's withdrawals and deposits), [`notifications`] (with their delivery attempts;
//! re-deliver one), [`webhook`] (its URL and secret rotation) and `me` (its own record).
//!
//! Every route passes [`require_partner`]: the key (`Authorization: Bearer pbk_…`) is checked
//! against its hash on every request (a revoked key is refused from the next request on), then
//! the partner's rate limit ([`rate_limit`]). The handler gets the [`PartnerIdentity`] and puts
//! its partner id **in the WHERE of every query**: another partner's row is never read, and it
//! answers 404 exactly like a missing one (existence does not leak). POSTs that create or act
//! take an `Idempotency-Key` ([`idempotency`]).

mod config;
pub mod idempotency;
mod notifications;
mod orders;
pub mod rate_limit;
mod records;
mod webhook;

use axum::{
    Extension, Json, Router,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post, put},
};
use hmac::Mac;
use serde::{Deserialize, Serialize};
use serde_json::json;

pub use config::{PartnerApiConfig, RateLimit, SETTINGS};
use rate_limit::Verdict;

use crate::{ApiError, AppState, partners::keys};

/// Who is calling, once its key checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartnerIdentity {
    pub partner_id: u64,
    pub key_id: u64,
    /// The rate limit this request was admitted under (the partner's own, or the default).
    pub rate_limit: RateLimit,
}

/// The `Idempotency-Key` request header, as the OpenAPI document lists it.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // read by the middleware from the headers, declared here for the document
pub(crate) struct IdempotencyKeyHeader {
    /// 1–255 visible ASCII characters: the same key with the same request answers the first
    /// answer again (kept 24 h), with another request 422, while the first runs 409.
    #[serde(rename = "Idempotency-Key")]
    idempotency_key: Option<String>,
}

/// This module's part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    me,
    orders::create_deposit_order,
    orders::show_deposit_order,
    orders::create_withdraw_order,
    orders::show_withdraw_order,
    records::show_withdrawal,
    records::show_deposit,
    notifications::list,
    notifications::show,
    notifications::redeliver,
    webhook::set_url,
    webhook::rotate_secret,
))]
pub(crate) struct Doc;

/// Every partner route, behind the key check; the POSTs that create or act also behind the
/// idempotency layer (inside the key check: it needs the partner).
pub(crate) fn routes(state: &AppState) -> Router<AppState> {
    let idempotent = Router::new()
        .route(
            "/v1/partner/p2p/deposit-orders",
            post(orders::create_deposit_order),
        )
        .route(
            "/v1/partner/p2p/withdraw-orders",
            post(orders::create_withdraw_order),
        )
        .route(
            "/v1/partner/notifications/{id}/redeliver",
            post(notifications::redeliver),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            idempotency::idempotent,
        ));
    Router::new()
        .merge(idempotent)
        .route("/v1/partner/me", get(me))
        .route(
            "/v1/partner/p2p/deposit-orders/{id}",
            get(orders::show_deposit_order),
        )
        .route(
            "/v1/partner/p2p/withdraw-orders/{id}",
            get(orders::show_withdraw_order),
        )
        .route(
            "/v1/partner/withdrawals/{id}",
            get(records::show_withdrawal),
        )
        .route("/v1/partner/deposits/{id}", get(records::show_deposit))
        .route("/v1/partner/notifications", get(notifications::list))
        .route("/v1/partner/notifications/{id}", get(notifications::show))
        .route("/v1/partner/webhook", put(webhook::set_url))
        // Not idempotent by key: its answer holds the new secret, which is never stored. A
        // retried rotation makes one more secret; the ones before keep signing their overlap.
        .route(
            "/v1/partner/webhook/secret/rotate",
            post(webhook::rotate_secret),
        )
        // route_layer: only matched routes are guarded, so an unknown path stays a 404.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_partner,
        ))
}

fn bearer(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
}

/// The key check and the rate limit, on every partner route. No hash key configured closes
/// the partner API (503); a missing, malformed, unknown, wrong, revoked or expired key is 401;
/// past the limit 429.
pub(crate) async fn require_partner(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let hash_key = state
        .partner_api
        .key_hash_key
        .as_ref()
        .ok_or(ApiError::Disabled(
            "the partner API is unavailable: PAYBUS_PARTNER_KEY_HASH_KEY is not set",
        ))?;
    let presented = bearer(&request).ok_or(ApiError::BadPartnerKey(
        "missing API key: send Authorization: Bearer pbk_…",
    ))?;
    let presented = keys::parse(presented).ok_or(ApiError::BadPartnerKey("malformed API key"))?;
    // Hashed before the row is looked at, so an unknown id costs what a wrong secret does.
    let mac = keys::hash(hash_key, presented.secret);
    let key_id = presented.key_id;
    let mut conn = state.pool.acquire().await?;
    let row = keys::lookup(&mut conn, key_id).await?;
    let row = match row {
        Some(row) if mac.verify_slice(&row.secret_hash).is_ok() => row,
        _ => return Err(ApiError::BadPartnerKey("invalid API key")),
    };
    if !row.usable {
        return Err(ApiError::BadPartnerKey("revoked or expired API key"));
    }
    if row.stale_use
        && let Err(error) = keys::touch(&mut conn, key_id).await
    {
        // The request is authorised either way; last_used_at is for people.
        tracing::warn!(key_id = key_id, error = %error, "could not record a key's use");
    }
    drop(conn);

    let defaults = state.partner_api.rate_limit;
    let limit = RateLimit {
        per_second: row.rate_limit_per_second.unwrap_or(defaults.per_second),
        burst: row.rate_limit_burst.unwrap_or(defaults.burst),
    };
    match state.partner_rate_limits.check(row.partner_id, limit) {
        Verdict::Allowed { remaining } => {
            request.extensions_mut().insert(PartnerIdentity {
                partner_id: row.partner_id,
                key_id,
                rate_limit: limit,
            });
            let mut response = next.run(request).await;
            let refill = std::time::Duration::from_secs_f64(
                f64::from(limit.burst.saturating_sub(remaining))
                    / f64::from(limit.per_second.max(1)),
            );
            rate_limit::headers(response.headers_mut(), limit, remaining, refill);
            Ok(response)
        }
        Verdict::Limited { retry_after } => {
            let seconds = rate_limit::retry_after_secs(retry_after);
            tracing::info!(
                partner_id = row.partner_id,
                retry_after_s = seconds,
                "partner rate limited"
            );
            let mut response = (
                StatusCode::TOO_MANY_REQUESTS,
                Json(json!({
                    "error": format!(
                        "rate limit: {} requests per second (burst {}); retry after {seconds} s",
                        limit.per_second, limit.burst
                    )
                })),
            )
                .into_response();
            let headers = response.headers_mut();
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                headers.insert(header::RETRY_AFTER, value);
            }
            rate_limit::headers(headers, limit, 0, retry_after);
            Ok(response)
        }
    }
}

#[derive(Serialize)]
struct Me {
    #[serde(flatten)]
    partner: paybus_partners::Partner,
    /// The request rate this partner may use (per API process).
    rate_limit: RateLimitView,
}

#[derive(Serialize)]
struct RateLimitView {
    per_second: u32,
    burst: u32,
}

#[utoipa::path(
    get,
    path = "/v1/partner/me",
    tag = "partner",
    security(("partner_key" = [])),
    responses(
        (status = 200, description = "The calling partner: name, webhook endpoint and breaker, rate limit (never a secret)", body = Object),
        crate::responses::PartnerErrors
    )
)]
async fn me(
    State(state): State<AppState>,
    Extension(partner): Extension<PartnerIdentity>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let found = paybus_partners::partner::find(&mut conn, partner.partner_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("partner not found".to_owned()))?;
    let me = Me {
        partner: found,
        rate_limit: RateLimitView {
            per_second: partner.rate_limit.per_second,
            burst: partner.rate_limit.burst,
        },
    };
    Ok(Json(
        serde_json::to_value(me).map_err(|e| ApiError::Internal(Box::new(e)))?,
    ))
}
