//! The transactional outbox (docs/bus.md, principle 5).
//!
//! A producer opens a [`UnitOfWork`], changes state and adds messages in that one
//! transaction; `commit()` commits, then publishes the messages at once (the fast path). If
//! the process dies or the broker is down in between, the rows stay unpublished and the
//! [`Relay`] publishes them later: a broker outage delays messages, it never loses them.
//! Consumers are idempotent, so the rare double publish (fast path and relay racing after a
//! crash) is harmless.

use std::{
    ops::{Deref, DerefMut},
    time::Duration,
};

use sqlx::{MySql, MySqlConnection, MySqlPool, QueryBuilder, Transaction};
use tracing::Instrument;
use uuid::Uuid;

use super::{
    dead_letter,
    envelope::{Envelope, Message, OutgoingMessage},
    published_marks::{PublishedMarks, mark_published},
    publisher::Publisher,
};

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("message cannot be serialised: {0}")]
    Serialise(#[from] serde_json::Error),
}

/// Where messages go: the database (always) and the broker (when reachable).
#[derive(Clone)]
pub struct Outbox {
    pool: MySqlPool,
    publisher: Publisher,
    marks: PublishedMarks,
}

impl Outbox {
    pub fn new(pool: MySqlPool, publisher: Publisher) -> Self {
        Self {
            pool,
            publisher,
            marks: PublishedMarks::default(),
        }
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// The one way to open a transaction that may produce messages.
    pub async fn begin(&self) -> Result<UnitOfWork<'_>, sqlx::Error> {
        let span = transaction_span();
        Ok(UnitOfWork {
            tx: self.pool.begin().instrument(span.clone()).await?,
            staged: Vec::new(),
            outbox: self,
            span,
        })
    }

    /// [`Outbox::begin`] on a connection the caller already holds (a read before the
    /// transaction, on the same checkout of the pool).
    pub async fn begin_on(
        &self,
        conn: sqlx::pool::PoolConnection<MySql>,
    ) -> Result<UnitOfWork<'_>, sqlx::Error> {
        let span = transaction_span();
        Ok(UnitOfWork {
            tx: sqlx::Transaction::begin(conn, None)
                .instrument(span.clone())
                .await?,
            staged: Vec::new(),
            outbox: self,
            span,
        })
    }

    /// The same, READ COMMITTED: for claiming queue-like rows with `FOR UPDATE SKIP LOCKED`
    /// (see `db::begin_read_committed`: under REPEATABLE READ the claim's gap locks deadlock
    /// with the producers inserting new rows).
    pub async fn begin_read_committed(&self) -> Result<UnitOfWork<'_>, sqlx::Error> {
        let span = transaction_span();
        Ok(UnitOfWork {
            tx: paybus_db::begin_read_committed(&self.pool)
                .instrument(span.clone())
                .await?,
            staged: Vec::new(),
            outbox: self,
            span,
        })
    }

    /// Publishes messages whose rows are committed, then marks the rows published (together
    /// with other committers' rows: one UPDATE for all). Failures are logged and left to the
    /// relay.
    pub async fn publish_committed(&self, staged: Vec<OutgoingMessage>) {
        if staged.is_empty() {
            return;
        }
        let results = self.publisher.publish_events(&staged).await;
        let mut published = Vec::with_capacity(staged.len());
        for (message, result) in staged.iter().zip(results) {
            match result {
                Ok(()) => published.push(message.id),
                Err(error) => tracing::warn!(
                    message_id = %message.id, routing_key = %message.routing_key, %error,
                    "publish after commit failed; the outbox relay will retry"
                ),
            }
        }
        self.marks.mark(&self.pool, published).await;
    }
}

/// The span of one unit of work's transaction, from BEGIN to COMMIT or rollback (it ends when
/// the unit of work is dropped): the trace shows how long a handler held its row locks.
fn transaction_span() -> tracing::Span {
    tracing::info_span!(
        "db.transaction",
        otel.name = "transaction",
        otel.kind = "client",
        db.system.name = "mysql",
    )
}

/// A database transaction plus the messages it will publish once committed. Derefs to the
/// connection, so queries run on it as on a `Transaction`.
pub struct UnitOfWork<'a> {
    tx: Transaction<'static, MySql>,
    staged: Vec<OutgoingMessage>,
    outbox: &'a Outbox,
    span: tracing::Span,
}

impl UnitOfWork<'_> {
    /// Writes the message into the outbox inside this transaction.
    pub async fn send<T: Message>(&mut self, envelope: &Envelope<T>) -> Result<(), OutboxError> {
        self.send_all(std::slice::from_ref(envelope)).await
    }

    /// Writes several messages into the outbox in one statement.
    pub async fn send_all<T: Message>(
        &mut self,
        envelopes: &[Envelope<T>],
    ) -> Result<(), OutboxError> {
        let messages = envelopes
            .iter()
            .map(Envelope::to_outgoing)
            .collect::<Result<Vec<_>, _>>()?;
        insert(&mut self.tx, &messages).await?;
        self.staged.extend(messages);
        Ok(())
    }

    /// Writes an already serialised message (a dead letter's replay, whose data type only
    /// its function knows) into the outbox inside this transaction.
    pub async fn send_outgoing(&mut self, message: OutgoingMessage) -> Result<(), OutboxError> {
        insert(&mut self.tx, std::slice::from_ref(&message)).await?;
        self.staged.push(message);
        Ok(())
    }

    /// Commits, then publishes what this transaction sent.
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        let UnitOfWork {
            tx,
            staged,
            outbox,
            span,
        } = self;
        tx.commit().instrument(span.clone()).await?;
        drop(span);
        outbox.publish_committed(staged).await;
        Ok(())
    }

    /// Rolls back; nothing staged is ever published.
    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        self.tx.rollback().await
    }
}

impl Deref for UnitOfWork<'_> {
    type Target = MySqlConnection;
    fn deref(&self) -> &MySqlConnection {
        &self.tx
    }
}

impl DerefMut for UnitOfWork<'_> {
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        &mut self.tx
    }
}

async fn insert(
    conn: &mut MySqlConnection,
    messages: &[OutgoingMessage],
) -> Result<(), sqlx::Error> {
    if messages.is_empty() {
        return Ok(());
    }
    let mut query = QueryBuilder::<MySql>::new(
        "INSERT INTO outbox_messages \
         (message_id, routing_key, correlation_id, body, created_at, traceparent, tracestate) ",
    );
    query.push_values(messages, |mut row, message| {
        row.push_bind(message.id.to_string())
            .push_bind(&message.routing_key)
            .push_bind(message.correlation_id.to_string())
            .push_bind(&message.body)
            .push_bind(message.occurred_at)
            .push_bind(&message.trace.traceparent)
            .push_bind(&message.trace.tracestate);
    });
    query.build().execute(conn).await?;
    Ok(())
}

/// The relay's settings; the defaults suit both the local runner and a scheduled Lambda.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows claimed per transaction.
    pub batch_size: u32,
    /// A row younger than this is left to its producer's publish-after-commit, so the relay
    /// does not double-publish in the normal case.
    pub grace: Duration,
    /// Published rows are deleted after this.
    pub retention: Duration,
    /// Rows deleted per prune statement (keeps each delete short).
    pub prune_batch: u32,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: 500,
            grace: Duration::from_secs(10),
            retention: Duration::from_secs(24 * 3600),
            prune_batch: 5_000,
        }
    }
}

/// What one relay pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RelayReport {
    pub published: u64,
    pub failed: u64,
    /// Rows that cannot be a message (an id that is not a UUID): moved to `dead_letters`.
    pub defective: u64,
}

/// Publishes committed rows the fast path missed. Several relays may run at once: each
/// claims its rows with `FOR UPDATE SKIP LOCKED`, so a row is published by one of them.
#[derive(Clone)]
pub struct Relay {
    outbox: Outbox,
    config: RelayConfig,
}

#[derive(sqlx::FromRow)]
struct PendingRow {
    id: u64,
    message_id: String,
    routing_key: String,
    correlation_id: String,
    body: Vec<u8>,
    created_at: chrono::DateTime<chrono::Utc>,
    traceparent: Option<String>,
    tracestate: Option<String>,
}

/// Why an outbox row cannot be published as it is.
#[derive(Debug, thiserror::Error)]
#[error("outbox row {row_id}: {column} {value:?} is not a UUID")]
struct DefectiveRow {
    row_id: u64,
    column: &'static str,
    value: String,
}

impl PendingRow {
    fn outgoing(&self) -> Result<OutgoingMessage, DefectiveRow> {
        let uuid = |column, value: &str| {
            Uuid::parse_str(value).map_err(|_| DefectiveRow {
                row_id: self.id,
                column,
                value: value.chars().take(64).collect(),
            })
        };
        Ok(OutgoingMessage {
            id: uuid("message_id", &self.message_id)?,
            routing_key: self.routing_key.clone(),
            correlation_id: uuid("correlation_id", &self.correlation_id)?,
            occurred_at: self.created_at,
            body: self.body.clone(),
            trace: paybus_telemetry::TraceHeaders {
                traceparent: self.traceparent.clone(),
                tracestate: self.tracestate.clone(),
            },
        })
    }
}

/// A row no consumer could trust is a defect to report, not a message to send: it becomes a
/// dead letter (function `outbox`, reason `defective_outbox_row`, the body kept) and leaves
/// the outbox, in the relay's transaction, so ops see it and the relay does not trip on it
/// forever.
async fn set_aside(
    conn: &mut MySqlConnection,
    row: &PendingRow,
    defect: &DefectiveRow,
) -> Result<(), sqlx::Error> {
    tracing::error!(row_id = row.id, routing_key = %row.routing_key, %defect,
        "defective outbox row moved to dead_letters");
    let letter = format!("outbox:{}", row.id);
    let dead = dead_letter::DeadLetterRow {
        // The row leaves the outbox in this transaction: it can fail only once.
        failure_id: letter.clone(),
        dead_letter_id: letter,
        function_name: "outbox".to_owned(),
        message_id: None,
        correlation_id: None,
        routing_key: row.routing_key.clone(),
        reason: "defective_outbox_row".to_owned(),
        error: defect.to_string(),
        attempts: 0,
    };
    dead_letter::record_failure(&mut *conn, &dead, &row.body, "").await?;
    sqlx::query("DELETE FROM outbox_messages WHERE id = ?")
        .bind(row.id)
        .execute(conn)
        .await?;
    Ok(())
}

impl Relay {
    pub fn new(outbox: Outbox, config: RelayConfig) -> Self {
        Self { outbox, config }
    }

    pub fn batch_size(&self) -> u32 {
        self.config.batch_size
    }

    /// One batch: claim, publish with confirms, mark. The claim's row locks are held while
    /// publishing (milliseconds with pipelined confirms); only relays ever wait on them.
    #[tracing::instrument(skip_all, name = "outbox_relay")]
    pub async fn run_once(&self) -> Result<RelayReport, OutboxError> {
        let mut tx = paybus_db::begin_read_committed(&self.outbox.pool).await?;
        let rows: Vec<PendingRow> = sqlx::query_as(
            "SELECT id, message_id, routing_key, correlation_id, body, created_at, \
             traceparent, tracestate \
             FROM outbox_messages \
             WHERE published_at IS NULL AND created_at < NOW(6) - INTERVAL ? MICROSECOND \
             ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(u64::try_from(self.config.grace.as_micros()).unwrap_or(u64::MAX))
        .bind(self.config.batch_size)
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            return Ok(RelayReport::default());
        }
        let mut report = RelayReport::default();
        let mut sendable = Vec::with_capacity(rows.len());
        let mut messages = Vec::with_capacity(rows.len());
        for row in rows {
            match row.outgoing() {
                Ok(message) => {
                    messages.push(message);
                    sendable.push(row);
                }
                Err(defect) => {
                    set_aside(&mut tx, &row, &defect).await?;
                    report.defective += 1;
                }
            }
        }
        let rows = sendable;
        let results = self.outbox.publisher.publish_events(&messages).await;
        let mut published = Vec::new();
        for ((row, message), result) in rows.iter().zip(&messages).zip(results) {
            match result {
                Ok(()) => {
                    report.published += 1;
                    published.push(message.id);
                }
                Err(error) => {
                    report.failed += 1;
                    sqlx::query(
                        "UPDATE outbox_messages SET publish_attempts = publish_attempts + 1, \
                         last_error = LEFT(?, 1000) WHERE id = ?",
                    )
                    .bind(error.to_string())
                    .bind(row.id)
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        mark_published(&mut tx, &published).await?;
        tx.commit().await?;
        if report.published > 0 || report.failed > 0 || report.defective > 0 {
            tracing::info!(
                published = report.published,
                failed = report.failed,
                defective = report.defective,
                "outbox relay pass"
            );
        }
        Ok(report)
    }

    /// Deletes the records of skipped deliveries older than the retention (`super::skips`).
    pub async fn prune_skips(&self) -> Result<u64, sqlx::Error> {
        super::skips::prune(
            &self.outbox.pool,
            self.config.retention,
            self.config.prune_batch,
        )
        .await
    }

    /// Deletes published rows older than the retention, in short batches.
    pub async fn prune(&self) -> Result<u64, sqlx::Error> {
        let mut total = 0;
        loop {
            let deleted = sqlx::query(
                "DELETE FROM outbox_messages \
                 WHERE created_at < NOW(6) - INTERVAL ? SECOND AND published_at IS NOT NULL \
                 LIMIT ?",
            )
            .bind(self.config.retention.as_secs())
            .bind(self.config.prune_batch)
            .execute(&self.outbox.pool)
            .await?
            .rows_affected();
            total += deleted;
            if deleted < u64::from(self.config.prune_batch) {
                return Ok(total);
            }
        }
    }
}

/// Outbox rows not yet published, and the age of the oldest in seconds (0 with none).
pub async fn outbox_lag(conn: &mut sqlx::MySqlConnection) -> Result<(u64, f64), sqlx::Error> {
    let (backlog, oldest): (i64, Option<f64>) = sqlx::query_as(
        "SELECT COUNT(*), \
                CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)) / 1e6 AS DOUBLE) \
         FROM outbox_messages WHERE published_at IS NULL",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok((u64::try_from(backlog).unwrap_or(0), oldest.unwrap_or(0.0)))
}
