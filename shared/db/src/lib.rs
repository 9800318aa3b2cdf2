//! The database: one pool per process, migrations embedded in the binary.
//!
//! Helpers that run SQL take `&mut MySqlConnection` (or a transaction deref'd to one) and
//! leave committing to the caller; the one way to open a transaction is `pool.begin()`.

// `column_enum!` names this crate by its path, as every crate using it does.
extern crate self as paybus_db;

pub mod column;
mod migrations;

pub use migrations::migrate;

/// What [`column_enum!`] expands to needs, whatever the calling crate depends on.
#[doc(hidden)]
pub mod __private {
    pub use serde;
    pub use strum;
}

use std::{str::FromStr, time::Duration};

use sqlx::{
    Connection,
    migrate::Migrator,
    mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions},
};

use paybus_config::DatabaseSettings;

/// Every migration under `migrations/`, compiled into each binary so a deployed Lambda or
/// `paybus migrate` never depends on files next to it.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database URL {url} is not usable: {source}")]
    BadUrl { url: String, source: sqlx::Error },
    #[error("cannot reach the database at {url}: {source}")]
    Unreachable { url: String, source: sqlx::Error },
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("data migration failed: {0}")]
    DataMigration(#[source] sqlx::Error),
    #[error("cannot read the applied migrations: {0}")]
    Applied(#[source] sqlx::Error),
    /// A migration's statement waited [`migrate`]'s bound for a lock and gave up.
    #[error(
        "migration {version} ({description}) gave up after {} s waiting for its table's metadata \
         lock, which a transaction open on the table holds until it ends ({}){}; {}",
        .waited.as_secs(),
        paybus_config::VAR_MIGRATION_LOCK_WAIT_SECONDS.name,
        .oldest.as_deref().map(|o| format!("; the oldest open transaction: {o}")).unwrap_or_default(),
        if *.retryable {
            "nothing was changed: run the migrations again once that transaction ends"
        } else {
            "the migration has several statements, some may have run before it gave up, and sqlx \
             marks it partially applied: see which ran, finish or undo them, delete its row from \
             _sqlx_migrations and run again"
        }
    )]
    LockWaitTimeout {
        version: i64,
        description: String,
        waited: Duration,
        /// The oldest transaction open on the server, other than the migration's own (who to
        /// ask, or to end), when the server could tell.
        oldest: Option<String>,
        /// Nothing of the migration was applied and its record is gone: running the migrations
        /// again retries it.
        retryable: bool,
    },
}

pub fn connect_options(settings: &DatabaseSettings) -> Result<MySqlConnectOptions, DbError> {
    MySqlConnectOptions::from_str(settings.url.as_str()).map_err(|source| DbError::BadUrl {
        url: paybus_config::redact::url(&settings.url),
        source,
    })
}

/// A pooled connection idle for longer than this is pinged before it is handed out.
///
/// Why not every time (sqlx's default): the pool already pings each connection when it is
/// released (sqlx's check on return, which closes a broken one), so one handed out moments
/// later was just proven alive, and a second ping would be a round trip per acquire for
/// nothing. A W3 grant end to end acquires about 1.5 connections, each ping a wake-up of a
/// server thread and of a client worker. A connection that sat idle longer (across a
/// database restart, a network drop, the server's `wait_timeout`) is still checked, and
/// replaced when dead, before anyone gets it.
pub const PING_WHEN_IDLE_FOR: Duration = Duration::from_secs(1);

/// Opens the pool and proves it works with one round trip, so a wrong URL fails at start-up
/// and not inside the first handler.
pub async fn connect(settings: &DatabaseSettings) -> Result<MySqlPool, DbError> {
    let pool = MySqlPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > PING_WHEN_IDLE_FOR {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        .connect_with(connect_options(settings)?)
        .await
        .map_err(|source| DbError::Unreachable {
            url: paybus_config::redact::url(&settings.url),
            source,
        })?;
    Ok(pool)
}

impl DbError {
    /// Whether connecting again later may succeed: the server refused or dropped the
    /// connection, or is busy or shutting down ([`is_unavailable`]). A wrong URL, password or
    /// database is permanent.
    pub fn is_transient(&self) -> bool {
        match self {
            DbError::Unreachable { source, .. } => is_unavailable(source),
            _ => false,
        }
    }
}

/// One connection, no pool and no retries: for health checks, which want the real reason
/// ("connection refused", "access denied") at once.
pub async fn connect_once(settings: &DatabaseSettings) -> Result<MySqlConnection, DbError> {
    MySqlConnection::connect_with(&connect_options(settings)?)
        .await
        .map_err(|source| DbError::Unreachable {
            url: paybus_config::redact::url(&settings.url),
            source,
        })
}

/// The server's version string, e.g. `10.11.6-MariaDB-0+deb12u1` or `8.0.36`.
pub async fn server_version(conn: &mut MySqlConnection) -> Result<String, sqlx::Error> {
    sqlx::query_scalar("SELECT VERSION()").fetch_one(conn).await
}

/// How many embedded migrations this database has not applied yet (all of them on an empty
/// database).
pub async fn pending_migrations(conn: &mut MySqlConnection) -> Result<usize, sqlx::Error> {
    let applied = applied_migrations(conn).await?;
    Ok(MIGRATOR
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .count())
}

/// The versions of the migrations this database has applied (none before the first).
pub async fn applied_migrations(conn: &mut MySqlConnection) -> Result<Vec<i64>, sqlx::Error> {
    let table: Option<String> = sqlx::query_scalar(
        "SELECT table_name FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = '_sqlx_migrations'",
    )
    .fetch_optional(&mut *conn)
    .await?;
    match table {
        None => Ok(Vec::new()),
        Some(_) => {
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success = TRUE")
                .fetch_all(&mut *conn)
                .await
        }
    }
}

/// Migrations this database has applied that this code does not know and that are newer
/// than all it knows: the schema belongs to a later release (an older release runs on it
/// after a rollback). sqlx refuses to migrate such a database ("previously applied but is
/// missing"); there is nothing for this code to apply.
pub async fn migrations_ahead(pool: &MySqlPool) -> Result<Vec<i64>, DbError> {
    let newest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let mut conn = pool.acquire().await.map_err(DbError::Applied)?;
    Ok(applied_migrations(&mut conn)
        .await
        .map_err(DbError::Applied)?
        .into_iter()
        .filter(|version| *version > newest)
        .collect())
}

/// A READ COMMITTED transaction, for claiming queue-like rows with `FOR UPDATE SKIP LOCKED`:
/// under REPEATABLE READ the claim also takes gap locks, and two claimers that then update
/// the claimed rows' indexed columns deadlock on each other's gaps.
pub async fn begin_read_committed(
    pool: &MySqlPool,
) -> Result<sqlx::Transaction<'static, sqlx::MySql>, sqlx::Error> {
    // The SET applies to the next transaction on this connection only. Sent with the BEGIN in
    // one text query (the connection allows multi-statements): one round trip instead of a
    // prepared SET and then a BEGIN. sqlx still checks the server reports a transaction open.
    pool.begin_with(READ_COMMITTED_BEGIN).await
}

/// [`begin_read_committed`]'s BEGIN.
const READ_COMMITTED_BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; BEGIN";

/// A transaction whose reads all see one snapshot, taken at its start: for checks that
/// compare what several statements read (the auditor's pass). Named, not the server's
/// default: under `transaction_isolation = READ-COMMITTED`, a setting operators choose, each
/// statement would see its own, and a payment committed between two reads would look like
/// a lost credit.
pub async fn begin_snapshot(
    pool: &MySqlPool,
) -> Result<sqlx::Transaction<'static, sqlx::MySql>, sqlx::Error> {
    pool.begin_with(SNAPSHOT_BEGIN).await
}

/// [`begin_snapshot`]'s BEGIN, for a connection already checked out
/// (`Connection::begin_with`).
pub const SNAPSHOT_BEGIN: &str =
    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION WITH CONSISTENT SNAPSHOT";

/// MySQL / MariaDB error numbers that no retry can fix: the statement itself is refused for
/// what it writes (a constraint, a value that does not fit) or is malformed.
const PERMANENT_ERRORS: &[u16] = &[
    1048, // column cannot be null
    1062, // duplicate entry
    1064, // syntax error
    1264, // out of range value
    1265, // data truncated
    1292, // truncated incorrect value
    1364, // field has no default value
    1366, // incorrect value for column
    1406, // data too long
    1451, // foreign key: row is referenced
    1452, // foreign key: no parent row
    1586, // duplicate entry (with key name)
    1690, // value out of range (BIGINT UNSIGNED arithmetic)
    3819, // MySQL: check constraint violated
    4025, // MariaDB: CONSTRAINT ... failed
];

/// `?, ?, …`: one placeholder per value of an `IN` list, bound after the statement's other
/// values. One statement text per list length stays in the connection's statement cache; ids
/// formatted into the text made every call a new prepared statement (one more round trip) that
/// pushed the cached ones out.
pub fn placeholders(count: usize) -> String {
    vec!["?"; count].join(", ")
}

/// The server's error number, when the error came from the server.
pub fn error_number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(e) => e
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|e| e.number()),
        _ => None,
    }
}

/// Whether trying the same work again can succeed: the one classification of database errors
/// (the consumer runtime requeues transient ones and dead-letters the rest at once).
///
/// Transient: the connection, the pool, a deadlock or lock wait timeout, and any server error
/// not known to be permanent (a table not migrated yet may be, after the deploy finishes).
/// Permanent: constraint violations and values that do not fit their column
/// ([`PERMANENT_ERRORS`]), and errors about our own code or data (decoding a column, a row
/// that must exist and does not).
pub fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(_) => {
            error_number(error).is_none_or(|number| !PERMANENT_ERRORS.contains(&number))
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

/// Server errors that mean "busy or going away right now", not "wrong statement".
const UNAVAILABLE_ERRORS: &[u16] = &[
    1040, // too many connections
    1053, // server shutdown in progress
    1203, // the user's max_user_connections reached
    1205, // lock wait timeout
    1213, // deadlock
    // max_prepared_stmt_count reached: the server's cap over every connection's statement
    // cache (infra/aws/README.md budgets it). A statement new to its connection fails until
    // other connections close theirs; the request was fine.
    1461, 1927, // MariaDB: the connection was killed (a failover, an operator's KILL)
];

/// Whether the database is unreachable or overloaded right now (a caller should come back
/// later: HTTP 503), as opposed to a statement that failed for its own reasons.
pub fn is_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(_) => {
            error_number(error).is_some_and(|number| UNAVAILABLE_ERRORS.contains(&number))
        }
        _ => false,
    }
}

/// A duplicate-key error on exactly the unique key `key` (not on any other): the key name
/// ends the server's message (`... for key 'uk_x'` on MariaDB, `... for key 'table.uk_x'` on
/// MySQL 8). The failed statement is the only thing rolled back: the transaction stays usable.
pub fn is_duplicate_on(error: &sqlx::Error, key: &str) -> bool {
    let sqlx::Error::Database(e) = error else {
        return false;
    };
    if !e.is_unique_violation() {
        return false;
    }
    let message = e.message().trim_end_matches(['\'', '`', '"']);
    message
        .strip_suffix(key)
        .is_some_and(|rest| rest.ends_with(['\'', '`', '"', '.']))
}

#[cfg(test)]
mod tests {
    use super::placeholders;

    #[test]
    fn one_placeholder_per_value() {
        assert_eq!(placeholders(1), "?");
        assert_eq!(placeholders(3), "?, ?, ?");
    }
}
