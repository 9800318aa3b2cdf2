//! What a process builds once at start-up and hands to every consumer and job: the pool, the
//! broker connection, the confirm-mode publisher and the outbox.

use std::sync::Arc;

use lapin::Connection;
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use super::{link::BrokerLink, outbox::Outbox, publisher::Publisher, topology};
use crate::{
    Settings,
    broker::BrokerUnreachable,
    db::{self, DbError},
};

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

#[derive(Clone)]
pub struct Services {
    pub settings: Settings,
    pub pool: MySqlPool,
    pub link: BrokerLink,
    pub outbox: Outbox,
}

impl Services {
    pub async fn connect(settings: Settings) -> Result<Self, StartupError> {
        let pool = db::connect(&settings.database).await?;
        let link = BrokerLink::connect(&settings.broker).await?;
        Ok(Self {
            outbox: Outbox::new(pool.clone(), Publisher::new(link.clone())),
            settings,
            pool,
            link,
        })
    }

    /// The live broker connection (it may be replaced after an outage: take it anew rather
    /// than keeping it).
    pub fn connection(&self) -> Arc<Connection> {
        self.link.current().connection.clone()
    }

    pub fn publisher(&self) -> &Publisher {
        self.outbox.publisher()
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
