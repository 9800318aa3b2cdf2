//! What a process builds once at start-up and hands to every consumer and job: the pool, the
//! broker connection, the confirm-mode publisher and the outbox.
//!
//! A Lambda execution environment does not wait for the broker during its init
//! ([`Services::start`]): the AMQP handshake, the channel and `confirm.select` are most of a
//! cold start (the database-only recorder initialises in a tenth of the time), so they run in
//! the background while the runtime asks for its first event, and the first invocation awaits
//! them ([`PendingServices::ready`]) before any handler runs. Nothing publishes on a half-built
//! link: a handler only ever sees complete [`Services`], so a publish after commit still either
//! happens or leaves its outbox row to the relay.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use lapin::Connection;
use sqlx::MySqlPool;
use tokio::{sync::OnceCell, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use super::{
    link::{BrokerLink, RECONNECT_BACKOFF},
    outbox::Outbox,
    publisher::Publisher,
    topology,
};
use crate::broker::BrokerUnreachable;
use paybus_config::Settings;
use paybus_db as db;
use paybus_db::DbError;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Database(#[from] DbError),
    #[error(transparent)]
    Broker(#[from] BrokerUnreachable),
    #[error("broker error while {doing}: {source}")]
    Amqp {
        doing: &'static str,
        source: lapin::Error,
    },
}

/// `connect()` until it succeeds, fails for good (`transient` says no), or fails once `wait`
/// has passed (the last try starts at the latest when it ends). `waiting` hears the service
/// after each failed try (only its name: it may be shown to anyone who asks; the log has the
/// error).
async fn until_up<T, E: std::fmt::Display>(
    service: &'static str,
    wait: Duration,
    transient: fn(&E) -> bool,
    waiting: &(dyn Fn(String) + Sync),
    mut connect: impl AsyncFnMut() -> Result<T, E>,
) -> Result<T, E> {
    let started = Instant::now();
    let mut failures = 0;
    loop {
        match connect().await {
            Ok(connected) => {
                if failures > 0 {
                    tracing::info!(service, waited = ?started.elapsed(), "{service} is up");
                }
                return Ok(connected);
            }
            Err(error) => {
                failures += 1;
                let waited = started.elapsed();
                if !transient(&error) || waited >= wait {
                    return Err(error);
                }
                // The link's pace after a drop: 2 s doubling, at most 10 s.
                let pause = RECONNECT_BACKOFF.delay(failures).min(wait - waited);
                waiting(format!("waiting for {service}"));
                tracing::warn!(
                    %error,
                    retry_in = ?pause,
                    gives_up_in = ?wait.saturating_sub(waited),
                    "{service} is not up yet; waiting for it"
                );
                tokio::time::sleep(pause).await;
            }
        }
    }
}

#[derive(Clone)]
pub struct Services {
    pub settings: Settings,
    pub pool: MySqlPool,
    pub link: BrokerLink,
    pub outbox: Outbox,
}

impl Services {
    /// Connects to the database and the broker (at the same time) and returns once both are
    /// ready.
    pub async fn connect(settings: Settings) -> Result<Self, StartupError> {
        Self::connect_within(settings, Duration::ZERO, &|_| {}).await
    }

    /// [`connect`](Self::connect) for a long-running process (`paybus run` and `serve`, a
    /// function's or the API's local process): a database or broker that is not up yet is
    /// waited for, each on its own, for up to `settings.startup_wait`, with a warning per try.
    ///
    /// Why: a compose file or an init system that starts paybus beside RabbitMQ and MariaDB
    /// would otherwise see it exit before they listen, though the same process rides out a
    /// broker that goes away later (the link reconnects). A refusal that waiting cannot cure
    /// (a password, a database, a vhost) still fails at once.
    pub async fn connect_waiting(settings: Settings) -> Result<Self, StartupError> {
        Self::connect_waiting_saying(settings, &|_| {}).await
    }

    /// [`connect_waiting`](Self::connect_waiting), telling `waiting` what it waits for after
    /// each failed try (an HTTP API that listens meanwhile answers 503 with it).
    pub async fn connect_waiting_saying(
        settings: Settings,
        waiting: &(dyn Fn(String) + Sync),
    ) -> Result<Self, StartupError> {
        let wait = settings.startup_wait;
        Self::connect_within(settings, wait, waiting).await
    }

    /// Both at the same time, each tried until it is up or `wait` has passed (zero: once).
    async fn connect_within(
        settings: Settings,
        wait: Duration,
        waiting: &(dyn Fn(String) + Sync),
    ) -> Result<Self, StartupError> {
        let (pool, link) = tokio::try_join!(
            async {
                let pool = until_up("the database", wait, DbError::is_transient, waiting, || {
                    db::connect(&settings.database)
                })
                .await?;
                Ok::<_, StartupError>(pool)
            },
            async {
                let link = until_up(
                    "the broker",
                    wait,
                    BrokerUnreachable::is_transient,
                    waiting,
                    || BrokerLink::connect(&settings.broker),
                )
                .await?;
                Ok(link)
            },
        )?;
        Ok(Self::assemble(settings, pool, link))
    }

    /// Connects to the database now and starts connecting to the broker in the background
    /// (a Lambda's init: see the module's comment). A wrong or unreachable database still
    /// fails here.
    pub async fn start(settings: Settings) -> Result<PendingServices, StartupError> {
        let pool = db::connect(&settings.database).await?;
        let broker = settings.broker.clone();
        let connecting = tokio::spawn(async move { BrokerLink::connect(&broker).await });
        Ok(PendingServices {
            settings,
            pool,
            connecting: Mutex::new(Some((Instant::now(), connecting))),
            ready: OnceCell::new(),
        })
    }

    fn assemble(settings: Settings, pool: MySqlPool, link: BrokerLink) -> Self {
        Self {
            outbox: Outbox::new(pool.clone(), Publisher::new(link.clone())),
            settings,
            pool,
            link,
        }
    }

    /// The live broker connection (it may be replaced after an outage: take it anew rather
    /// than keeping it).
    pub fn connection(&self) -> Arc<Connection> {
        self.link.current().connection.clone()
    }

    pub fn publisher(&self) -> &Publisher {
        self.outbox.publisher()
    }

    /// Unbinds the queues of the `earlier` layout that `current` does not have (see
    /// `topology::retire`); the retired queues, with what they still hold.
    pub async fn retire(
        &self,
        current: &[topology::FunctionQueue],
        earlier: &[topology::FunctionQueue],
    ) -> Result<Vec<topology::Retired>, StartupError> {
        topology::retire(&self.connection(), current, earlier)
            .await
            .map_err(|source| StartupError::Amqp {
                doing: "retiring the queues of the earlier shard layout",
                source,
            })
    }

    /// Declares the exchanges and these functions' queues (idempotent).
    pub async fn declare_topology(
        &self,
        functions: &[topology::FunctionQueue],
    ) -> Result<(), StartupError> {
        self.link
            .declare(functions)
            .await
            .map_err(|source| StartupError::Amqp {
                doing: "declaring the topology",
                source,
            })
    }
}

/// [`Services`] whose broker connection is being opened in the background
/// ([`Services::start`]).
pub struct PendingServices {
    settings: Settings,
    pool: MySqlPool,
    /// The connection started at init (and when), until the first [`ready`](Self::ready)
    /// takes it.
    connecting: Mutex<Option<(Instant, BrokerConnecting)>>,
    ready: OnceCell<Services>,
}

type BrokerConnecting = JoinHandle<Result<BrokerLink, BrokerUnreachable>>;

impl PendingServices {
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The services, once the broker is connected: the connection started at init or, if
    /// that one failed, a new attempt (every call after a failure tries again, as a new
    /// execution environment's init would).
    pub async fn ready(&self) -> Result<&Services, StartupError> {
        self.ready
            .get_or_try_init(|| async {
                let started = self
                    .connecting
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .take();
                let link = match started {
                    Some((since, connecting)) => {
                        let awaited = Instant::now();
                        let link = match connecting.await {
                            Ok(connected) => connected?,
                            // The connecting task panicked: connect here instead.
                            Err(_) => BrokerLink::connect(&self.settings.broker).await?,
                        };
                        tracing::info!(
                            connected_after = ?since.elapsed(),
                            waited = ?awaited.elapsed(),
                            "broker connected"
                        );
                        link
                    }
                    None => BrokerLink::connect(&self.settings.broker).await?,
                };
                Ok(Services::assemble(
                    self.settings.clone(),
                    self.pool.clone(),
                    link,
                ))
            })
            .await
    }
}

/// A token cancelled on SIGTERM (what Lambda, systemd and Kubernetes send) or Ctrl-C.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown requested: finishing in-flight messages");
        cancel.cancel();
    });
    token
}
