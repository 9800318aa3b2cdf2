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

use paybus_platform::{
    audit::Check,
    bus::{Services, shutdown_on_signal},
    function::{self, FunctionError},
};

use crate::{ApiConfig, AppState, router, serve, warn_about_closed_routes};

/// Reads the settings (fetching `_FROM` references), connects, and serves until stopped.
pub async fn run(audit: Vec<Check>) -> Result<(), FunctionError> {
    let settings = function::settings().await?;
    let config = ApiConfig::from_env()?;
    let services = Services::connect(settings).await?;
    let state = AppState::new(&services, &config, audit)
        .map_err(|error| FunctionError::Service(Box::new(error)))?
        .with_functions(paybus_catalog::FUNCTIONS);
    if function::in_lambda() {
        warn_about_closed_routes(&state);
        tracing::info!("HTTP API answering API Gateway events");
        return lambda_http::run(router(state))
            .await
            .map_err(FunctionError::Lambda);
    }
    serve(config, state, shutdown_on_signal())
        .await
        .map_err(|error| FunctionError::Service(Box::new(error)))
}
