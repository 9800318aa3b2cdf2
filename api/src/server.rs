//! The HTTP server loop: hyper's HTTP/1.1 under the axum router, with the limits a public
//! endpoint needs (axum's own `serve` has none of them): without them, 1,000 connections that
//! announce a body and never send it hold the process for minutes.
//!
//! - header read timeout: a request's headers must arrive within it; hyper starts the same
//!   timer when a keep-alive connection goes idle, so it is also the idle timeout;
//! - body read timeout: a request's body must arrive within it (408);
//! - connection cap: past it, new connections wait in the listen backlog;
//! - every request runs to its end on a task of its own, even when its client hangs up
//!   ([`run_to_completion`]).
//!
//! Shutdown stops accepting, lets requests in flight finish, then returns.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use axum::{
    Router,
    extract::Request,
    middleware::Next,
    response::{IntoResponse, Response},
};
use hyper::server::conn::http1;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
    service::TowerToHyperService,
};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower::ServiceExt;
use tower_http::timeout::RequestBodyTimeoutLayer;

use crate::{ApiError, AppState, router};

/// The server's limits (`PAYBUS_HTTP_*`, see the configuration table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            max_connections: 256,
        }
    }
}

/// Serves `state`'s router on `listener` until `shutdown` is cancelled.
pub async fn serve_on(
    listener: TcpListener,
    state: AppState,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<(), ApiError> {
    serve_app_on(listener, router(state), limits, shutdown).await
}

/// The API of a process that listens before its services are up: until [`Starting::ready`]
/// hands it the router, every request is answered 503 with `Retry-After` and what the process
/// waits for. Why: a process that connected first refused connections meanwhile, and a load
/// balancer marks such a target dead, where a 503 says "not yet".
#[derive(Clone)]
pub struct Starting {
    ready: Arc<OnceLock<Router>>,
    waiting_for: Arc<Mutex<String>>,
}

impl Default for Starting {
    fn default() -> Self {
        Self {
            ready: Arc::default(),
            waiting_for: Arc::new(Mutex::new(
                "connecting to the database and the broker".into(),
            )),
        }
    }
}

impl Starting {
    /// The router to serve: answers 503 until ready, then as the ready router does.
    pub fn app(&self) -> Router {
        let starting = self.clone();
        Router::new().fallback(move |request: Request| {
            let starting = starting.clone();
            async move {
                match starting.ready.get() {
                    Some(router) => match router.clone().oneshot(request).await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    },
                    None => {
                        let waiting = starting
                            .waiting_for
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .clone();
                        ApiError::Starting(waiting).into_response()
                    }
                }
            }
        })
    }

    /// What the process waits for now (said in each 503).
    pub fn waiting_for(&self, what: String) {
        *self
            .waiting_for
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = what;
    }

    /// From now on every request goes to `state`'s router.
    pub fn ready(&self, state: AppState) {
        crate::warn_about_closed_routes(&state);
        if self.ready.set(router(state)).is_err() {
            tracing::warn!("the API was made ready twice; the first router stays");
        }
        tracing::info!("HTTP API ready");
    }
}

/// Serves `app` on `listener` with the server's limits until `shutdown` is cancelled.
pub async fn serve_app_on(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<(), ApiError> {
    let addr: SocketAddr = listener.local_addr().map_err(ApiError::Serve)?;
    let requests = TaskTracker::new();
    let service = app
        .layer(axum::middleware::from_fn({
            let requests = requests.clone();
            move |request: Request, next: Next| run_to_completion(requests.clone(), request, next)
        }))
        .layer(RequestBodyTimeoutLayer::new(limits.body_timeout));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = GracefulShutdown::new();
    tracing::info!(%addr, ?limits, "HTTP API listening");
    loop {
        let slot = tokio::select! {
            () = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .serve_connection(
                TokioIo::new(stream),
                TowerToHyperService::new(service.clone()),
            );
        let connection = connections.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "HTTP connection ended with an error");
            }
            drop(slot);
        });
    }
    connections.shutdown().await;
    // Requests whose clients hung up are not connections any more, but still run.
    requests.close();
    requests.wait().await;
    tracing::info!(%addr, "HTTP API stopped");
    Ok(())
}

/// Runs the request on a task of its own, so it ends as its handler decides even when its
/// client hangs up. hyper drops a request's future when the connection closes: a payment
/// completion cut off while waiting on a member's lock would never be applied, and a handler
/// cut off inside a transaction would hand its connection back to the pool mid-transaction
/// (the next request on it then fails with MySQL 1568). An answer nobody reads is dropped.
async fn run_to_completion(requests: TaskTracker, request: Request, next: Next) -> Response {
    match requests.spawn(next.run(request)).await {
        Ok(response) => response,
        Err(failed) => {
            tracing::error!(error = %failed, "a request's task failed");
            ApiError::Internal(Box::new(failed)).into_response()
        }
    }
}
