//! The paybus HTTP API (SPEC §1: the producer side of the bus).
//!
//! Routes live by workflow, next to the domain crate they use:
//!
//! | module | routes | domain |
//! | --- | --- | --- |
//! | [`confirmations`] | W2: chain-monitor intake (`/v1/chain-monitor/*`, HMAC-signed, into the outbox, 202) and admin withdrawals / deposits | `paybus_confirmations` |
//! | `partners` | admin partners | `paybus_partners` |
//! | [`bonuses`] | W3: payment completions from every gateway (`/v1/payments/*`, HMAC-signed) and admin members, charges, charge events and bonus jobs | `paybus_bonuses` |
//! | `audit` | `GET /v1/admin/audit`: every workflow's invariants | the catalog's checks |
//! | `markets` | W4: markets, orders, suspend / resume, suspension progress | `paybus_markets` |
//! | `dead_letters` | ops: dead letters grouped, shown, dry-run, replayed, archived | `paybus_dead_letters` over the catalog's triage |
//!
//! Admin routes (`/v1/admin/*`) take a role token (`auth`: OPS reads, ADMIN changes);
//! `GET /health` is liveness, `GET /metrics` the Prometheus scrape.
//! [`router`] builds the whole API from an [`AppState`] (tests drive it with `oneshot`);
//! [`serve`] binds the configured address and runs it until the shutdown token is cancelled.

mod admin;
mod amount;
mod audit;
pub mod auth;
mod body;
pub mod bonuses;
mod chain;
pub mod config;
pub mod confirmations;
mod dead_letters;
pub mod error;
mod markets;
mod partners;
pub mod server;
mod signed;

use std::{sync::Arc, time::Duration};

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, Request},
    http::Method,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
};
use paybus_bonuses::BonusRules;
use paybus_dead_letters::Triager;
use paybus_platform::{
    Secret,
    audit::Check,
    bus::{Outbox, Services, metrics as bus_metrics},
    function::FunctionEntry,
    signature,
};
use serde_json::json;
use sqlx::MySqlPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use config::ApiConfig;
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
    /// `PAYBUS_ADMIN_JWT_SECRET`, the key of the admin role tokens. None: the admin API
    /// answers 503 to everything.
    pub admin_jwt_secret: Option<Secret>,
    /// `PAYBUS_PAYMENTS_SECRET`. None: the payment completion routes answer 503.
    pub payments_secret: Option<Secret>,
    /// W3's bonus rules for completions.
    pub bonus_rules: BonusRules,
    /// How far a signature's timestamp may be from now (default 300 s).
    pub signature_tolerance: Duration,
    /// The invariants `GET /v1/admin/audit` checks (every workflow's: the catalog's list).
    pub audit: Arc<[Check]>,
    /// Each function's dead-letter triage (the catalog's functions; none until
    /// [`AppState::with_functions`]: every letter then needs a human).
    pub dead_letters: Triager,
    /// The catalog's functions: their work tables are `/metrics` gauges.
    pub functions: &'static [FunctionEntry],
}

impl AppState {
    pub fn new(services: &Services, config: &ApiConfig, audit: Vec<Check>) -> Self {
        Self {
            pool: services.pool.clone(),
            outbox: services.outbox.clone(),
            chain_monitor_secret: config.chain_monitor_secret.clone(),
            admin_jwt_secret: config.admin_jwt_secret.clone(),
            payments_secret: config.payments_secret.clone(),
            bonus_rules: config.bonus_rules,
            signature_tolerance: signature::DEFAULT_TOLERANCE,
            audit: audit.into(),
            dead_letters: Triager::new(&[]),
            functions: &[],
        }
    }

    /// The catalog's functions (`paybus_catalog::FUNCTIONS`), whose triage the dead-letter
    /// routes ask.
    pub fn with_functions(mut self, functions: &'static [FunctionEntry]) -> Self {
        self.dead_letters = Triager::new(functions);
        self.functions = functions;
        self
    }
}

/// The whole API. Admin routes check the bearer token before their body is read; every body
/// is capped at [`BODY_LIMIT`].
pub fn router(state: AppState) -> Router {
    let admin = Router::new()
        .merge(partners::admin_routes())
        .merge(confirmations::admin_routes())
        .merge(bonuses::admin_routes())
        .merge(audit::admin_routes())
        .merge(markets::admin_routes())
        .merge(dead_letters::admin_routes())
        // route_layer: only matched routes are guarded, so an unknown path stays a 404.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_role,
        ));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(confirmations::intake_routes())
        .merge(bonuses::payment_routes())
        .merge(admin)
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

/// Binds the configured address and serves with the configured limits until `shutdown` is
/// cancelled; requests in flight are finished before it returns. Warns about a route that is
/// closed because its secret is unset.
pub async fn serve(
    config: ApiConfig,
    state: AppState,
    shutdown: CancellationToken,
) -> Result<(), ApiError> {
    let addr = config.http_addr;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ApiError::Bind { addr, source })?;
    if state.chain_monitor_secret.is_none() {
        tracing::warn!(
            "PAYBUS_CHAIN_MONITOR_SECRET is not set: the chain-monitor intake answers 503"
        );
    }
    if state.payments_secret.is_none() {
        tracing::warn!(
            "PAYBUS_PAYMENTS_SECRET is not set: the payment completion routes answer 503"
        );
    }
    if state.admin_jwt_secret.is_none() {
        tracing::warn!("PAYBUS_ADMIN_JWT_SECRET is not set: the admin API answers 503");
    }
    server::serve_on(listener, state, config.limits, shutdown).await
}

/// [`serve`] on a listener the caller bound (e.g. port 0 in tests), with default limits.
pub async fn serve_on(
    listener: TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> Result<(), ApiError> {
    server::serve_on(listener, state, server::Limits::default(), shutdown).await
}

/// Every error answer is JSON `{"error": ...}`, also the ones the framework writes itself
/// (405 with its `Allow` header, 415, ...), which come with an empty or plain-text body.
async fn json_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    let message = status
        .canonical_reason()
        .unwrap_or("error")
        .to_ascii_lowercase();
    let body = Json(json!({ "error": message }));
    let mut answer = body.into_response();
    *answer.status_mut() = status;
    for (name, value) in parts.headers.iter() {
        if name != axum::http::header::CONTENT_TYPE {
            answer.headers_mut().insert(name.clone(), value.clone());
        }
    }
    answer
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// Prometheus: the in-process counters and histograms plus the database's gauges (outbox
/// backlog, dead letters, due and stuck rows). No token, as `/health`: serve the API on a
/// network only ops and the scraper reach.
async fn metrics(
    axum::extract::State(state): axum::extract::State<AppState>,
) -> Result<Response, ApiError> {
    let tables: Vec<_> = state
        .functions
        .iter()
        .flat_map(|function| function.work_tables.iter().copied())
        .collect();
    let gauges = bus_metrics::read_gauges(&state.pool, &tables).await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, bus_metrics::CONTENT_TYPE)],
        bus_metrics::encode(&gauges),
    )
        .into_response())
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
