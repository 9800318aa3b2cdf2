//! The API as a process of its own (the `api` binary; `paybus run` also serves it, next to
//! every function).
//!
//! In a Lambda execution environment (AWS sets `AWS_LAMBDA_RUNTIME_API`) the same router
//! answers API Gateway events through `lambda_http` (an HTTP API, payload format 2.0).
//! Chosen over a container service because every route is a short request over one or two
//! short transactions, the traffic (chain-monitor webhooks, ops) is bursty and small, and
//! the API then deploys, scales and is observed like every other paybus function, from the
//! same template. API Gateway holds the connections, so the server loop's own limits
//! (header and body timeouts, the connection cap) are its job there: 30 s per request, 10 MB
//! bodies (the router still refuses more than 64 KiB), throttling per stage. Elsewhere the
//! binary serves HTTP itself with those limits, until SIGTERM.

use axum::{Router, response::IntoResponse};
use paybus_platform::{
    bus::{Services, services::PendingServices, shutdown_on_signal},
    function::{self, FunctionError},
};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::{ApiConfig, ApiError, AppState, router, serve, warn_about_closed_routes};

/// Reads the settings (fetching `_FROM` references), connects, and serves until stopped.
pub async fn run() -> Result<(), FunctionError> {
    let settings = function::settings().await?;
    let config = ApiConfig::from_env()?;
    if function::in_lambda() {
        return answer_api_gateway(Services::start(settings).await?, config).await;
    }
    let services = Services::connect_waiting(settings).await?;
    serve_until_stopped(&services, config, shutdown_on_signal()).await
}

/// Serves HTTP on `config.http_addr` until `shutdown` (the `api` binary and `paybus serve`).
/// The function queues are declared first: the API publishes into them, and a message
/// published before its queue exists would be unroutable and wait for the relay.
pub async fn serve_until_stopped(
    services: &Services,
    config: ApiConfig,
    shutdown: CancellationToken,
) -> Result<(), FunctionError> {
    let queues = paybus_catalog::queues_with(&services.settings.broker.shards);
    services.declare_topology(&queues).await?;
    let state = catalog_state(services, &config)
        .map_err(|error| FunctionError::Service(Box::new(error)))?;
    tracing::info!(addr = %config.http_addr, "paybus API serving; Ctrl-C or SIGTERM stops it");
    serve(config, state, shutdown)
        .await
        .map_err(|error| FunctionError::Service(Box::new(error)))
}

/// The API over every function of the catalog: its audit checks, and its functions' triage
/// and work-table gauges.
pub fn catalog_state(services: &Services, config: &ApiConfig) -> Result<AppState, ApiError> {
    Ok(
        AppState::new(services, config, paybus_catalog::audit_checks())?
            .with_functions(paybus_catalog::FUNCTIONS),
    )
}

/// The router behind API Gateway. As every function's Lambda, the broker connects while the
/// runtime waits for the first request (see `Services::start`); that request awaits it and
/// builds the router, once. Until that succeeds requests are answered 503, and the next one
/// tries again.
async fn answer_api_gateway(
    services: PendingServices,
    config: ApiConfig,
) -> Result<(), FunctionError> {
    let built: &OnceCell<Router> = &OnceCell::new();
    let (services, config) = (&services, &config);
    tracing::info!("HTTP API answering API Gateway events");
    lambda_http::run(lambda_http::service_fn(
        move |request: lambda_http::Request| async move {
            let app = built
                .get_or_try_init(|| async {
                    let services = services.ready().await.map_err(|error| {
                        tracing::error!(%error, "the API cannot start");
                        ApiError::Disabled("the API cannot reach the broker yet; retry later")
                    })?;
                    let state = catalog_state(services, config)?;
                    warn_about_closed_routes(&state);
                    Ok::<_, ApiError>(router(state))
                })
                .await;
            match app {
                Ok(app) => app.clone().oneshot(request).await,
                Err(error) => Ok(error.into_response()),
            }
        },
    ))
    .await
    .map_err(FunctionError::Lambda)
}
