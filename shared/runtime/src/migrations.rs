//! Bringing a database up to this release: the schema's migrations (`db::MIGRATOR`), then the
//! data fix-ups SQL cannot express. Above the bus, since a fix-up may read the bus's formats.

use std::time::Duration;

use paybus_retry::Backoff;
use sqlx::{MySqlPool, migrate::Migrator};

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
    migrate_retrying_locks(&MIGRATOR, pool, lock_wait).await?;
    let rewritten = dead_letter::rewrite_legacy_headers(pool)
        .await
        .map_err(DbError::DataMigration)?;
    if rewritten > 0 {
        tracing::info!(rewritten, "dead letter headers rewritten as readable JSON");
    }
    Ok(())
}

/// The pauses before trying again a migration that gave up on its table's lock, and so how
/// many tries (one more than the pauses). The transaction in its way (an audit pass, an ops
/// query, a report) usually ends within seconds, and a deploy should not fail for it; each try
/// stalls the table's traffic at most the bound, then frees it. About half a minute in all
/// before the error reaches the operator.
const LOCK_RETRY_PAUSES: &[Duration] = &[
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(15),
];

/// [`paybus_db::migrate`], tried again after each of [`LOCK_RETRY_PAUSES`] while a migration
/// gives up on its table's metadata lock having changed nothing; any other error at once.
pub async fn migrate_retrying_locks(
    migrator: &Migrator,
    pool: &MySqlPool,
    lock_wait: Duration,
) -> Result<(), DbError> {
    let pauses = Backoff::schedule(LOCK_RETRY_PAUSES);
    let mut failures: u32 = 0;
    loop {
        match paybus_db::migrate(migrator, pool, lock_wait).await {
            Err(
                error @ DbError::LockWaitTimeout {
                    retryable: true, ..
                },
            ) if (failures as usize) < LOCK_RETRY_PAUSES.len() => {
                failures += 1;
                let pause = pauses.delay(failures);
                tracing::warn!(
                    %error,
                    failures,
                    pause_ms = pause.as_millis() as u64,
                    "a migration gave up on its table's lock; trying again"
                );
                tokio::time::sleep(pause).await;
            }
            done => return done,
        }
    }
}
