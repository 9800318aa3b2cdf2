//! The paybus HTTP API (SPEC §1: the producer side of the bus).
//!
//! - Chain-monitor intake (`/v1/chain-monitor/*`): HMAC-signed confirmations are written to the
//!   transactional outbox and answered 202; the functions behind the bus decide what they mean.
//! - Admin API (`/v1/admin/*`, bearer token): create and read partners, withdrawals and
//!   deposits (tests, the demo, ops).
//! - `GET /health`: liveness, no authentication.
//!
//! [`router`] builds the whole API from an [`AppState`] (tests drive it with `oneshot`);
//! [`serve`] binds `PAYBUS_HTTP_ADDR` and runs it until the shutdown token is cancelled.

pub mod admin;
mod amount;
mod body;
mod chain;
pub mod error;
pub mod intake;

use std::{net::SocketAddr, time::Duration};

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, Request},
    http::Method,
    middleware::{self, Next},
    response::Response,
    routing::get,
};
use paybus_platform::{
    Secret,
    bus::{Outbox, Services},
    signature,
};
use serde_json::json;
use sqlx::MySqlPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use error::ApiError;

/// The largest request body accepted (413 beyond). Confirmations and admin requests are a few
/// hundred bytes; the limit only stops a client from making us buffer megabytes.
pub const BODY_LIMIT: usize = 64 * 1024;

/// What every handler needs, built once at start-up.
#[derive(Clone)]
pub struct AppState {
    pub pool: MySqlPool,
    pub outbox: Outbox,
    /// `PAYBUS_CHAIN_MONITOR_SECRET`. None: the intake answers 503 to everything.
    pub chain_monitor_secret: Option<Secret>,
    /// `PAYBUS_ADMIN_TOKEN`. None: the admin API answers 503 to everything.
    pub admin_token: Option<Secret>,
    /// How far a signature's timestamp may be from now (default 300 s).
    pub signature_tolerance: Duration,
}

impl AppState {
    pub fn new(services: &Services) -> Self {
        Self {
            pool: services.pool.clone(),
            outbox: services.outbox.clone(),
            chain_monitor_secret: services.settings.chain_monitor_secret.clone(),
            admin_token: services.settings.admin_token.clone(),
            signature_tolerance: signature::DEFAULT_TOLERANCE,
        }
    }
}

/// The whole API. Admin routes check the bearer token before their body is read; every body
/// is capped at [`BODY_LIMIT`].
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .merge(intake::routes())
        .merge(admin::routes(state.clone()))
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

/// Binds `settings.http_addr` and serves until `shutdown` is cancelled; requests in flight
/// are finished before it returns.
pub async fn serve(services: Services, shutdown: CancellationToken) -> Result<(), ApiError> {
    let addr = services.settings.http_addr;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ApiError::Bind { addr, source })?;
    serve_on(listener, AppState::new(&services), shutdown).await
}

/// [`serve`] on a listener the caller bound (e.g. port 0 in tests).
pub async fn serve_on(
    listener: TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> Result<(), ApiError> {
    let addr: SocketAddr = listener.local_addr().map_err(ApiError::Serve)?;
    if state.chain_monitor_secret.is_none() {
        tracing::warn!(
            "PAYBUS_CHAIN_MONITOR_SECRET is not set: the chain-monitor intake answers 503"
        );
    }
    if state.admin_token.is_none() {
        tracing::warn!("PAYBUS_ADMIN_TOKEN is not set: the admin API answers 503");
    }
    tracing::info!(%addr, "HTTP API listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(ApiError::Serve)?;
    tracing::info!(%addr, "HTTP API stopped");
    Ok(())
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn no_route(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {method} {}", uri.path()))
}

/// One span and one line per request: method, path, status and latency (an internal error's
/// log line is inside the span, so it names the request too).
async fn log_request(request: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        "http",
        method = %request.method(),
        path = %request.uri().path()
    );
    let started = std::time::Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let _entered = span.enter();
    tracing::info!(
        status = response.status().as_u16(),
        latency_ms = started.elapsed().as_millis() as u64,
        "http request"
    );
    response
}
