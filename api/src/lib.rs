//! The paybus HTTP API (docs/api.md): the producer side of the bus, with routes by workflow next
//! to the domain crate they use, [`confirmations`] (W2's chain-monitor intake), [`bonuses`]
//! (W3's payment completions), [`partner_api`] (the partner API: W1's orders, records, webhooks),
//! `markets`, `p2p`, `partners` and the ops routes (`dead_letters`, `functions`, `ops_log`,
//! `audit`, [`approvals`], [`trace`], [`search`]).
//!
//! Admin routes (`/v1/admin/*`) take a person's or a break-glass token ([`auth`], [`oidc`]: OPS
//! reads, ADMIN changes); `GET /health` is liveness, `GET /metrics` the Prometheus scrape,
//! `GET /openapi.json` the OpenAPI document ([`openapi`], which says how a route is annotated),
//! and `/console` the web console ([`console`]).
//!
//! It offers [`router`], which builds the whole API from an [`AppState`] (tests drive it with
//! `oneshot`), and [`serve`], which binds the configured address and runs it until the shutdown
//! token is cancelled; [`ApiConfig`] and [`ApiError`] are its settings and its one error type.

pub mod activity;
mod admin;
mod amount;
pub mod approvals;
mod audit;
pub mod auth;
mod body;
pub mod bonuses;
mod chain;
pub mod config;
pub mod confirmations;
pub mod console;
mod console_sessions;
mod dead_letters;
pub mod error;
mod functions;
mod markets;
pub mod oidc;
pub mod openapi;
mod ops_log;
mod overview;
mod p2p;
pub mod partner_api;
mod partners;
pub mod process;
mod responses;
pub mod role;
pub mod search;
pub mod secrets;
pub mod server;
mod signed;
pub mod trace;

use std::{sync::Arc, time::Duration};

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, Request},
    http::Method,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
};
use paybus_bonuses::Completions;
use paybus_bus::{Outbox, Services, metrics as bus_metrics};
use paybus_config::{Secret, signature};
use paybus_dead_letter_ops::Triager;
use paybus_maintenance::auditor::AuditorConfig;
use paybus_ops::audit::Check;
use paybus_p2p::Matcher;
use paybus_runtime::function::FunctionEntry;
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
    /// `PAYBUS_ADMIN_JWT_SECRET`, the key of break-glass tokens (taken only with
    /// `break_glass`).
    pub admin_jwt_secret: Option<Secret>,
    /// `PAYBUS_BREAK_GLASS`: break-glass tokens are accepted.
    pub break_glass: bool,
    /// Verifies the identity provider's tokens (`PAYBUS_OIDC_*`); None: no provider.
    pub oidc: Option<oidc::Verifier>,
    /// `PAYBUS_PAYMENTS_SECRET`. None: the payment completion routes answer 503.
    pub payments_secret: Option<Secret>,
    /// W3's payment completions (with its bonus rules), concurrent ones committed together.
    pub completions: Completions,
    /// How far a signature's timestamp may be from now (default 300 s).
    pub signature_tolerance: Duration,
    /// The invariants `GET /v1/admin/audit` checks (every workflow's: the catalog's list).
    pub audit: Arc<[Check]>,
    /// `PAYBUS_ASYNC_MATCHING_ENABLED`: false (the safe default) matches a new deposit order
    /// inside the request; true queues it for match-deposit.
    pub async_matching_enabled: bool,
    /// W1's matcher (inline matching, and creating queued orders).
    pub matcher: Matcher,
    /// Each function's dead-letter triage (the catalog's functions; none until
    /// [`AppState::with_functions`]: every letter then needs a human).
    pub dead_letters: Triager,
    /// The catalog's functions: their work tables are `/metrics` gauges.
    pub functions: &'static [FunctionEntry],
    /// Which ops actions need a second ADMIN, and how long a request lasts.
    pub four_eyes: paybus_ops::approvals::FourEyes,
    /// The queue layout (`PAYBUS_SHARDS`): which queues the overview asks the broker about.
    pub shards: paybus_config::Shards,
    /// The partner API's key hashing key and default rate limit.
    pub partner_api: partner_api::PartnerApiConfig,
    /// Every partner's request bucket (per process).
    pub partner_rate_limits: partner_api::rate_limit::RateLimits,
    /// Seals partner webhook secrets (`PAYBUS_SECRETS_KEY`). None: partner create answers 503.
    pub sealer: Option<paybus_config::sealed::Sealer>,
    /// How the web console signs people in and how long their sessions last.
    pub console: console::Console,
    /// How often the sweeper's auditor passes (`PAYBUS_AUDITOR_INTERVAL_MS`): a pass three
    /// intervals late shows on the audit page.
    pub audit_interval: Duration,
}

impl AppState {
    /// Builds the state once at start-up; fails only when the quote service's HTTP client
    /// cannot be built.
    pub fn new(
        services: &Services,
        config: &ApiConfig,
        audit: Vec<Check>,
    ) -> Result<Self, ApiError> {
        let matcher = Matcher::new(services.outbox.clone(), config.matching.clone())
            .map_err(|e| ApiError::Internal(Box::new(e)))?;
        Ok(Self {
            pool: services.pool.clone(),
            outbox: services.outbox.clone(),
            chain_monitor_secret: config.chain_monitor_secret.clone(),
            admin_jwt_secret: config.admin_jwt_secret.clone(),
            break_glass: config.break_glass,
            oidc: config.oidc.clone().map(oidc::Verifier::new),
            payments_secret: config.payments_secret.clone(),
            completions: Completions::new(services.outbox.clone(), config.bonus_rules),
            signature_tolerance: signature::DEFAULT_TOLERANCE,
            audit: audit.into(),
            async_matching_enabled: config.async_matching_enabled,
            matcher,
            dead_letters: Triager::new(&[]),
            functions: &[],
            four_eyes: config.four_eyes.clone(),
            shards: services.settings.broker.shards.clone(),
            partner_api: config.partner_api.clone(),
            partner_rate_limits: partner_api::rate_limit::RateLimits::default(),
            sealer: config.sealer.clone(),
            console: console::Console::new(config.console.clone()),
            audit_interval: AuditorConfig::read(&services.settings.vars)
                .unwrap_or_default()
                .interval,
        })
    }

    /// The catalog's functions' work tables (what `/metrics` and the overview count).
    pub(crate) fn work_tables(&self) -> Vec<&'static paybus_retry::WorkTable> {
        self.functions
            .iter()
            .flat_map(|function| function.work_tables.iter().copied())
            .collect()
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
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(openapi::routes())
        .merge(oidc::route::routes())
        .merge(confirmations::intake_routes())
        .merge(bonuses::payment_routes())
        .merge(admin_routes(&state))
        .merge(partner_api::routes(&state))
        .merge(console::routes())
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

/// Every `/v1/admin/*` route behind the role check. The console sends its actions through
/// this router too, so they pass the same checks as any API client's.
pub(crate) fn admin_routes(state: &AppState) -> Router<AppState> {
    Router::new()
        .merge(partners::admin_routes())
        .merge(partners::keys::admin_routes())
        .merge(confirmations::admin_routes())
        .merge(bonuses::admin_routes())
        .merge(p2p::admin_routes())
        .merge(audit::admin_routes())
        .merge(markets::admin_routes())
        .merge(dead_letters::admin_routes())
        .merge(functions::admin_routes())
        .merge(ops_log::admin_routes())
        .merge(approvals::admin_routes())
        .merge(secrets::admin_routes())
        .merge(trace::route::admin_routes())
        .merge(overview::admin_routes())
        .merge(activity::admin_routes())
        .merge(search::admin_routes())
        .merge(console_sessions::admin_routes())
        // route_layer: only matched routes are guarded, so an unknown path stays a 404.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_role,
        ))
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
    warn_about_closed_routes(&state);
    server::serve_on(listener, state, config.limits, shutdown).await
}

/// A route whose secret is unset answers 503 to everything: say so once at start-up.
pub fn warn_about_closed_routes(state: &AppState) {
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
    match (
        &state.oidc,
        state.break_glass && state.admin_jwt_secret.is_some(),
    ) {
        (None, false) => tracing::warn!(
            "no identity provider (PAYBUS_OIDC_ISSUER) and no break-glass tokens \
             (PAYBUS_BREAK_GLASS with PAYBUS_ADMIN_JWT_SECRET): the admin API answers 503"
        ),
        (_, true) => tracing::warn!(
            "break-glass tokens are accepted (PAYBUS_BREAK_GLASS): whoever holds \
             PAYBUS_ADMIN_JWT_SECRET can act under any name; every such action is marked"
        ),
        (Some(_), false) => {}
    }
    if state.partner_api.key_hash_key.is_none() {
        tracing::warn!("PAYBUS_PARTNER_KEY_HASH_KEY is not set: the partner API answers 503");
    }
    if state.sealer.is_none() {
        tracing::warn!("PAYBUS_SECRETS_KEY is not set: creating a partner answers 503");
    }
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
        // The console's own error pages are HTML on purpose.
        .is_some_and(|value| {
            value.starts_with("application/json") || value.starts_with("text/html")
        });
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

/// `/health`'s answer: the process is up, and which build answers (a deploy is the first
/// suspect of a new fault).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
struct Health {
    /// Always `ok`.
    status: &'static str,
    /// The release (the workspace's version; CHANGELOG.md).
    version: &'static str,
    /// The commit the binary was built from (40 hex digits), or `unknown`.
    commit: &'static str,
}

#[utoipa::path(
    get,
    path = "/health",
    tag = "service",
    responses((status = 200, description = "The process is up, and which build it runs", body = Health))
)]
async fn health() -> Json<Health> {
    Json(Health {
        status: "ok",
        version: paybus_config::build::VERSION,
        commit: paybus_config::build::COMMIT,
    })
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    responses((status = 200, description = "Prometheus / OpenMetrics text", content_type = "application/openmetrics-text"))
)]
/// Prometheus: the in-process counters and histograms plus the database's gauges (outbox
/// backlog, dead letters, due and stuck rows). No token, as `/health`: serve the API on a
/// network only ops and the scraper reach.
async fn metrics(
    axum::extract::State(state): axum::extract::State<AppState>,
) -> Result<Response, ApiError> {
    let mut gauges = paybus_bus::gauges::read_gauges(&state.pool, &state.work_tables()).await?;
    partner_gauges(&state.pool, &mut gauges).await?;
    gauges.function_due_rows = function_due_rows(state.functions, &gauges.due_retries);
    Ok((
        [(axum::http::header::CONTENT_TYPE, bus_metrics::CONTENT_TYPE)],
        bus_metrics::encode(&gauges),
    )
        .into_response())
}
/// Each function's backlog of due rows: the sum over the work tables it works.
fn function_due_rows(
    functions: &[FunctionEntry],
    due_by_table: &[(String, u64)],
) -> Vec<(String, u64)> {
    functions
        .iter()
        .filter(|function| !function.work_tables.is_empty())
        .map(|function| {
            let due = function
                .work_tables
                .iter()
                .filter_map(|table| {
                    due_by_table
                        .iter()
                        .find(|(name, _)| name == table.table)
                        .map(|(_, n)| *n)
                })
                .sum();
            (function.name.to_owned(), due)
        })
        .collect()
}

/// The partners' webhook health, which the platform's gauges cannot read (it knows no
/// partners): breakers not closed, endpoints disabled by a 410.
async fn partner_gauges(
    pool: &MySqlPool,
    gauges: &mut bus_metrics::Gauges,
) -> Result<(), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    gauges.partner_breakers_not_closed = paybus_partners::breaker::not_closed(&mut conn)
        .await?
        .into_iter()
        .filter(|b| b.state != paybus_partners::breaker::BreakerState::Closed)
        .map(|b| (b.partner_id.to_string(), 1))
        .collect();
    let disabled: Vec<u64> = sqlx::query_scalar(
        "SELECT id FROM partners WHERE webhook_disabled_at IS NOT NULL ORDER BY id LIMIT 200",
    )
    .fetch_all(&mut *conn)
    .await?;
    gauges.partner_webhooks_disabled = disabled.into_iter().map(|id| (id.to_string(), 1)).collect();
    Ok(())
}

/// How the fallback's 404 starts (the console tells "this build lacks the route" by it).
pub(crate) const NO_ROUTE: &str = "no route for";

pub(crate) async fn no_route(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound(format!("{NO_ROUTE} {method} {}", uri.path()))
}

/// One span and one line per request: method, path, status and latency (an internal error's
/// log line is inside the span, so it names the request too).
/// One span per request, continuing the caller's trace when it sent a `traceparent` (W3C
/// Trace Context), named as OpenTelemetry's HTTP conventions name a server span: method and
/// route template, never the raw path (ids in paths would make every span name unique).
async fn log_request(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|matched| matched.as_str().to_owned());
    let span = tracing::info_span!(
        "http",
        otel.name = format!("{} {}", request.method(), route.as_deref().unwrap_or("")).trim_end(),
        otel.kind = "server",
        http.request.method = %request.method(),
        http.route = route.as_deref(),
        http.response.status_code = tracing::field::Empty,
        method = %request.method(),
        path = %request.uri().path()
    );
    paybus_telemetry::propagation::continue_trace(
        &span,
        &paybus_telemetry::TraceHeaders::from_http(request.headers()),
    );
    let started = std::time::Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.record("http.response.status_code", i64::from(status));
    let _entered = span.enter();
    tracing::info!(
        status,
        latency_ms = started.elapsed().as_millis() as u64,
        "http request"
    );
    response
}
