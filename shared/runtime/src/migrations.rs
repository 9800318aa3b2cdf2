//! Bringing a database up to this release: the schema's migrations (`db::MIGRATOR`), then the
//! data fix-ups SQL cannot express. Above the bus, since a fix-up may read the bus's formats.

use std::time::Duration;

use sqlx::MySqlPool;

use paybus_bus::dead_letter;
use paybus_config::DEFAULT_MIGRATION_LOCK_WAIT;
use paybus_db::{DbError, MIGRATOR};

/// [`apply_within`] the default bound on a migration's lock waits
/// (`PAYBUS_MIGRATION_LOCK_WAIT_SECONDS`'s default): for tests and the lab, which read no
/// settings of their own for it.
pub async fn apply(pool: &MySqlPool) -> Result<(), DbError> {
    apply_within(pool, DEFAULT_MIGRATION_LOCK_WAIT).await
}

/// Applies every pending migration, each statement waiting at most `lock_wait` for a table's
/// metadata lock (`paybus_db::migrate`; `DatabaseSettings::migration_lock_wait`), then the data
/// fix-ups; applied ones are skipped, so this is safe to repeat, after a
/// [`DbError::LockWaitTimeout`] too.
pub async fn apply_within(pool: &MySqlPool, lock_wait: Duration) -> Result<(), DbError> {
    paybus_db::migrate(&MIGRATOR, pool, lock_wait).await?;
    let rewritten = dead_letter::rewrite_legacy_headers(pool)
        .await
        .map_err(DbError::DataMigration)?;
    if rewritten > 0 {
        tracing::info!(rewritten, "dead letter headers rewritten as readable JSON");
    }
    Ok(())
}
