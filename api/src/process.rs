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
//! binary serves HTTP itself with those limits, until SIGTERM: it listens first and answers
//! 503 until the database and the broker are up and the topology is declared.

use axum::{Router, response::IntoResponse};
use paybus_bus::{
    Services,
    services::{PendingServices, StartupError},
    shutdown_on_signal,
};
use paybus_config::Settings;
use paybus_runtime::function::{self, FunctionError};
use tokio::{net::TcpListener, sync::OnceCell, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::{
    ApiConfig, ApiError, AppState, router,
    server::{self, Starting},
    warn_about_closed_routes,
};

/// Reads the settings (fetching `_FROM` references), connects, and serves until stopped.
pub async fn run() -> Result<(), FunctionError> {
    let settings = function::settings().await?;
    let config = ApiConfig::read(&settings.vars)?;
    if paybus_config::in_lambda() {
        return answer_api_gateway(Services::start(settings).await?, config).await;
    }
    serve_until_stopped(settings, config, shutdown_on_signal()).await
}

/// The `api` binary and `paybus serve`: listens on `config.http_addr` at once (answering 503
/// until ready), connects, declares the function queues and serves until `shutdown`.
pub async fn serve_until_stopped(
    settings: Settings,
    config: ApiConfig,
    shutdown: CancellationToken,
) -> Result<(), FunctionError> {
    let service = |error: ApiError| FunctionError::Service(Box::new(error));
    let api = Listening::bind(&config, &shutdown).await.map_err(service)?;
    let Some(services) = api.connect(settings, &shutdown).await? else {
        return api.stopped().await.map_err(service);
    };
    api.declare_topology(&services).await?;
    api.ready(catalog_state(&services, &config).map_err(service)?);
    tracing::info!(addr = %config.http_addr, "paybus API serving; Ctrl-C or SIGTERM stops it");
    api.stopped().await.map_err(service)
}

/// The HTTP API of a process that is starting (`paybus run`, `serve`, the `api` binary): it
/// listens from the first moment, and answers 503 with `Retry-After` and what it waits for
/// until [`Listening::ready`] (see [`Starting`]).
pub struct Listening {
    starting: Starting,
    server: JoinHandle<Result<(), ApiError>>,
    /// Stops the server when the start fails.
    stop: CancellationToken,
}

impl Listening {
    /// Binds `config.http_addr` (a port taken fails at once) and serves; `shutdown` stops it.
    pub async fn bind(config: &ApiConfig, shutdown: &CancellationToken) -> Result<Self, ApiError> {
        let addr = config.http_addr;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ApiError::Bind { addr, source })?;
        let starting = Starting::default();
        let stop = shutdown.child_token();
        let server = tokio::spawn(server::serve_app_on(
            listener,
            starting.app(),
            config.limits,
            stop.clone(),
        ));
        Ok(Self {
            starting,
            server,
            stop,
        })
    }

    /// Connects to the database and the broker as a long-running process does (waiting up to
    /// `PAYBUS_STARTUP_WAIT_SECONDS` for either), each 503 meanwhile saying which it waits
    /// for; `None` when `shutdown` came first. A failure stops the server.
    pub async fn connect(
        &self,
        settings: Settings,
        shutdown: &CancellationToken,
    ) -> Result<Option<Services>, StartupError> {
        let waiting = |what: String| self.starting.waiting_for(what);
        tokio::select! {
            connected = Services::connect_waiting_saying(settings, &waiting) => match connected {
                Ok(services) => Ok(Some(services)),
                Err(error) => {
                    self.stop.cancel();
                    Err(error)
                }
            },
            () = shutdown.cancelled() => Ok(None),
        }
    }

    /// Declares every function queue of the catalog. Before the API takes its first webhook:
    /// a message published before its queue exists would be unroutable and wait for the
    /// relay. A failure stops the server.
    pub async fn declare_topology(&self, services: &Services) -> Result<(), StartupError> {
        self.starting
            .waiting_for("declaring the broker's topology".to_owned());
        let queues = paybus_catalog::queues(&services.settings.broker.shards);
        services.declare_topology(&queues).await.inspect_err(|_| {
            self.stop.cancel();
        })
    }

    /// From now on the API answers with `state`.
    pub fn ready(&self, state: AppState) {
        self.starting.ready(state);
    }

    /// Waits for the server to stop (the shutdown token, or a failed start).
    pub async fn stopped(self) -> Result<(), ApiError> {
        self.server
            .await
            .map_err(|panicked| ApiError::Internal(Box::new(panicked)))?
    }
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
