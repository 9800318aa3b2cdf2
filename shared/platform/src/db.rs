//! The database: one pool per process, migrations embedded in the binary.
//!
//! Helpers that run SQL take `&mut MySqlConnection` (or a transaction deref'd to one) and
//! leave committing to the caller; the one way to open a transaction is `pool.begin()`.

use std::str::FromStr;

use sqlx::{
    Connection,
    migrate::Migrator,
    mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions},
};

use crate::config::DatabaseSettings;

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
}

pub fn connect_options(settings: &DatabaseSettings) -> Result<MySqlConnectOptions, DbError> {
    MySqlConnectOptions::from_str(settings.url.as_str()).map_err(|source| DbError::BadUrl {
        url: crate::redact::url(&settings.url),
        source,
    })
}

/// Opens the pool and proves it works with one round trip, so a wrong URL fails at start-up
/// and not inside the first handler.
pub async fn connect(settings: &DatabaseSettings) -> Result<MySqlPool, DbError> {
    let pool = MySqlPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .connect_with(connect_options(settings)?)
        .await
        .map_err(|source| DbError::Unreachable {
            url: crate::redact::url(&settings.url),
            source,
        })?;
    Ok(pool)
}

/// Applies every pending migration; applied ones are skipped, so this is safe to repeat.
pub async fn migrate(pool: &MySqlPool) -> Result<(), DbError> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// One connection, no pool and no retries: for health checks, which want the real reason
/// ("connection refused", "access denied") at once.
pub async fn connect_once(settings: &DatabaseSettings) -> Result<MySqlConnection, DbError> {
    MySqlConnection::connect_with(&connect_options(settings)?)
        .await
        .map_err(|source| DbError::Unreachable {
            url: crate::redact::url(&settings.url),
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
    let table: Option<String> = sqlx::query_scalar(
        "SELECT table_name FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = '_sqlx_migrations'",
    )
    .fetch_optional(&mut *conn)
    .await?;
    let applied: Vec<i64> = match table {
        None => Vec::new(),
        Some(_) => {
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success = TRUE")
                .fetch_all(&mut *conn)
                .await?
        }
    };
    Ok(MIGRATOR
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .count())
}

/// A READ COMMITTED transaction, for claiming queue-like rows with `FOR UPDATE SKIP LOCKED`:
/// under REPEATABLE READ the claim also takes gap locks, and two claimers that then update
/// the claimed rows' indexed columns deadlock on each other's gaps.
pub async fn begin_read_committed(
    pool: &MySqlPool,
) -> Result<sqlx::Transaction<'static, sqlx::MySql>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    // Applies to the next transaction on this connection only.
    sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *conn)
        .await?;
    sqlx::Transaction::begin(conn, None).await
}
