//! What a process builds once at start-up and hands to every consumer and job: the pool, the
//! broker connection, the confirm-mode publisher and the outbox.

use std::sync::Arc;

use lapin::Connection;
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use super::{outbox::Outbox, publisher::Publisher, topology};
use crate::{
    Settings,
    broker::{self, BrokerUnreachable},
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
    pub connection: Arc<Connection>,
    pub outbox: Outbox,
}

impl Services {
    pub async fn connect(settings: Settings) -> Result<Self, StartupError> {
        let pool = db::connect(&settings.database).await?;
        let connection = Arc::new(broker::connect(&settings.broker).await?);
        let publisher =
            Publisher::open(&connection)
                .await
                .map_err(|source| StartupError::Amqp {
                    doing: "opening the publisher channel",
                    source,
                })?;
        Ok(Self {
            outbox: Outbox::new(pool.clone(), publisher),
            settings,
            pool,
            connection,
        })
    }

    pub fn publisher(&self) -> &Publisher {
        self.outbox.publisher()
    }

    /// Declares the exchanges and these functions' queues (idempotent).
    pub async fn declare_topology(
        &self,
        functions: &[topology::FunctionQueue],
    ) -> Result<(), StartupError> {
        let amqp = |source| StartupError::Amqp {
            doing: "declaring the topology",
            source,
        };
        let channel = self.connection.create_channel().await.map_err(amqp)?;
        topology::declare(&channel, functions).await.map_err(amqp)?;
        let _ = channel.close(200, "topology declared".into()).await;
        Ok(())
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
