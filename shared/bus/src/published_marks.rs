//! Marking outbox rows published, many committers' rows in one statement.
//!
//! Every transaction that sends a message ends with its rows being marked published after the
//! broker confirmed them. One autocommit UPDATE per transaction would double the commits of
//! a one-message workflow step (2 commits per confirmation in the W2 benchmark), so the rows
//! of everyone who committed meanwhile go in one UPDATE. A committer still waits
//! until its rows are marked, so a Lambda invocation never returns with its marks pending
//! (a frozen process would leave them to the relay, which would publish them again).

use std::{
    fmt::Write,
    sync::{Arc, Mutex, PoisonError},
};

use sqlx::{AssertSqlSafe, MySqlConnection, MySqlPool};
use tokio::sync::oneshot;
use uuid::Uuid;

/// Rows per UPDATE: keeps the `IN` list and the statement short.
const MAX_ROWS_PER_UPDATE: usize = 1_000;

/// The rows waiting to be marked, and whether a flusher task is running.
#[derive(Default)]
struct Pending {
    ids: Vec<Uuid>,
    waiters: Vec<oneshot::Sender<()>>,
    flushing: bool,
}

/// Shared by every clone of an [`Outbox`](super::Outbox).
#[derive(Clone, Default)]
pub(crate) struct PublishedMarks {
    pending: Arc<Mutex<Pending>>,
}

impl PublishedMarks {
    /// Marks `ids` published, together with whatever other committers add meanwhile; returns
    /// once they are (or once marking them failed, which is logged: the relay may then publish
    /// them again, which consumers tolerate).
    pub(crate) async fn mark(&self, pool: &MySqlPool, ids: Vec<Uuid>) {
        if ids.is_empty() {
            return;
        }
        let (done, marked) = oneshot::channel();
        let start_flusher = {
            let mut pending = self.lock();
            pending.ids.extend(ids);
            pending.waiters.push(done);
            !std::mem::replace(&mut pending.flushing, true)
        };
        if start_flusher {
            tokio::spawn(self.clone().flush(pool.clone()));
        }
        // An Err means the flusher is gone (the runtime is shutting down): nothing to wait for.
        let _ = marked.await;
    }

    /// Runs while rows are pending: one UPDATE for everything queued since the last one. The
    /// emptiness check and the `flushing` reset happen under one lock, so a row queued at any
    /// moment is either taken by this loop or starts a new flusher.
    async fn flush(self, pool: MySqlPool) {
        loop {
            let (ids, waiters) = {
                let mut pending = self.lock();
                if pending.ids.is_empty() {
                    pending.flushing = false;
                    return;
                }
                (
                    std::mem::take(&mut pending.ids),
                    std::mem::take(&mut pending.waiters),
                )
            };
            let marked = match pool.acquire().await {
                Ok(mut conn) => mark_published(&mut conn, &ids).await,
                Err(e) => Err(e),
            };
            if let Err(error) = marked {
                tracing::warn!(%error, count = ids.len(),
                    "marking outbox rows published failed; the relay may publish them again");
            }
            for waiter in waiters {
                let _ = waiter.send(());
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        // The critical sections only move vectors; a panic there leaves them consistent.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `published_at = NOW(6)` on the rows of these messages that are still unpublished, in
/// statements of at most [`MAX_ROWS_PER_UPDATE`] rows. By message id (unique), so a producer
/// need not learn its rows' auto-increment ids.
///
/// A plain text statement with the ids written in, not a prepared one with a placeholder each:
/// the list's length changes with every flush, so each length would be a statement of its own
/// to prepare (a round trip more, almost every time: 52 prepares for 53 marks in a W3 bench)
/// that would then take a place in the connection's statement cache from the statements it runs
/// every time. The ids are UUIDs as `Uuid` prints them (hex digits and dashes), so writing
/// them in quotes cannot change the statement.
pub(crate) async fn mark_published(
    conn: &mut MySqlConnection,
    message_ids: &[Uuid],
) -> Result<(), sqlx::Error> {
    for chunk in message_ids.chunks(MAX_ROWS_PER_UPDATE) {
        let mut sql = String::with_capacity(110 + chunk.len() * 41);
        sql.push_str(
            "UPDATE outbox_messages SET published_at = NOW(6) \
             WHERE published_at IS NULL AND message_id IN (",
        );
        for (i, id) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            // `write!` to a String cannot fail.
            let _ = write!(sql, "'{}'", id.hyphenated());
        }
        sql.push(')');
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}
