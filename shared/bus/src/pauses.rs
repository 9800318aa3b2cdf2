//! Ops' switch for a function's consumption, without stopping a process.
//!
//! A paused function has a row in `function_pauses`. Every process reads that table each
//! [`POLL_INTERVAL`] and its consumers of a paused function stop taking deliveries: the
//! subscription is cancelled, deliveries in flight finish and are acked, prefetched ones go
//! back to the queue, and everything else waits there. On resume (the row deleted) they
//! subscribe again and drain the queue. The state is in the database, not in a process, so
//! every process — and a process started while the pause holds — obeys it. In AWS the same
//! switch is the Amazon MQ trigger's `Enabled` (the template's `<Function>Enabled` parameter).
//!
//! Every pause and resume that changes something is a row of the ops log (`paybus_ops::ops_log`),
//! written in the same transaction.
//!
//! Only a function's own consumers pause; its dead-letter recorder and the sweeper go on (the
//! letters of what failed before the pause still reach ops).

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::{Connection, MySqlConnection, MySqlPool};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use paybus_ops::{
    actor::Actor,
    ops_log::{self, Entry},
};

/// How often each process reads the paused functions.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// A function paused by ops, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Pause {
    pub function_name: String,
    pub paused_by: String,
    pub reason: String,
    pub paused_at: DateTime<Utc>,
}

/// Pauses `function` (true: this call paused it; false: it was paused already, by whoever
/// paused it first). A pause is logged (`function.pause`, with its reason) in the transaction
/// that writes it; a call that finds it paused writes nothing.
pub async fn pause(
    conn: &mut MySqlConnection,
    function: &str,
    actor: &Actor,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let paused_by = actor.name.chars().take(100).collect::<String>();
    let reason = reason.chars().take(1000).collect::<String>();
    let mut tx = conn.begin().await?;
    let paused = sqlx::query(
        "INSERT IGNORE INTO function_pauses (function_name, paused_by, reason) VALUES (?, ?, ?)",
    )
    .bind(function)
    .bind(&paused_by)
    .bind(&reason)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if paused {
        ops_log::append(
            &mut tx,
            &Entry {
                actor,
                action: "function.pause",
                subject: &format!("function:{function}"),
                detail: &json!({ "reason": reason }),
            },
        )
        .await?;
    }
    tx.commit().await?;
    if paused {
        tracing::warn!(
            function,
            actor = paused_by,
            reason,
            "function paused by ops"
        );
    }
    Ok(paused)
}

/// Resumes `function` (true: it was paused). A resume is logged (`function.resume`, with the
/// pause it ended) in its transaction; resuming a function that was not paused writes nothing.
pub async fn resume(
    conn: &mut MySqlConnection,
    function: &str,
    actor: &Actor,
) -> Result<bool, sqlx::Error> {
    let mut tx = conn.begin().await?;
    // Locked, so the pause the log names is the one this DELETE removes.
    let ended: Option<Pause> = sqlx::query_as(
        "SELECT function_name, paused_by, reason, paused_at FROM function_pauses \
         WHERE function_name = ? FOR UPDATE",
    )
    .bind(function)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(ended) = ended else {
        tx.rollback().await?;
        return Ok(false);
    };
    sqlx::query("DELETE FROM function_pauses WHERE function_name = ?")
        .bind(function)
        .execute(&mut *tx)
        .await?;
    ops_log::append(
        &mut tx,
        &Entry {
            actor,
            action: "function.resume",
            subject: &format!("function:{function}"),
            detail: &json!({
                "paused_by": ended.paused_by,
                "reason": ended.reason,
                "paused_at": ended.paused_at,
            }),
        },
    )
    .await?;
    tx.commit().await?;
    tracing::warn!(function, actor = actor.name, "function resumed by ops");
    Ok(true)
}

/// Every paused function, by name.
pub async fn list(conn: &mut MySqlConnection) -> Result<Vec<Pause>, sqlx::Error> {
    sqlx::query_as(
        "SELECT function_name, paused_by, reason, paused_at FROM function_pauses \
         ORDER BY function_name",
    )
    .fetch_all(conn)
    .await
}

/// What a process knows of the pauses: the names of the paused functions, as last read.
#[derive(Debug, Clone)]
pub struct PauseWatch {
    paused: watch::Receiver<Arc<BTreeSet<String>>>,
}

impl PauseWatch {
    /// A watch that never sees a pause (a consumer ops cannot pause: a recorder's).
    pub fn never() -> Self {
        let (sender, paused) = watch::channel(Arc::default());
        // The receiver outlives the sender: `changed` then never resolves.
        drop(sender);
        Self { paused }
    }

    pub fn is_paused(&self, function: &str) -> bool {
        self.paused.borrow().contains(function)
    }

    /// Waits until `function` is paused (`paused`) or consuming (`!paused`); never returns
    /// for a watch whose reader is gone (the state stays what it was).
    pub async fn until(&mut self, function: &str, paused: bool) {
        if self
            .paused
            .wait_for(|set| set.contains(function) == paused)
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }
}

/// Reads `function_pauses` into the watches it hands out.
pub struct PauseReader {
    pool: MySqlPool,
    sender: watch::Sender<Arc<BTreeSet<String>>>,
}

impl PauseReader {
    pub fn new(pool: MySqlPool) -> Self {
        Self {
            pool,
            sender: watch::Sender::new(Arc::default()),
        }
    }

    pub fn watch(&self) -> PauseWatch {
        PauseWatch {
            paused: self.sender.subscribe(),
        }
    }

    /// Reads the table once. A process starts its consumers after the first read, so a pause
    /// holds from its first moment.
    pub async fn read(&self) -> Result<(), sqlx::Error> {
        let names: Vec<String> = sqlx::query_scalar("SELECT function_name FROM function_pauses")
            .fetch_all(&self.pool)
            .await?;
        let names: BTreeSet<String> = names.into_iter().collect();
        self.sender.send_if_modified(|current| {
            let changed = **current != names;
            if changed {
                *current = Arc::new(names);
            }
            changed
        });
        Ok(())
    }

    /// Reads the table every [`POLL_INTERVAL`] until `shutdown`. While the database cannot be
    /// read the last state holds (a database outage neither pauses nor resumes anything).
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(POLL_INTERVAL) => {}
            }
            if let Err(error) = self.read().await {
                tracing::warn!(%error, "reading function_pauses; the last known pauses hold");
            }
        }
    }
}
