//! Bringing a database up to this release: the schema's migrations (`db::MIGRATOR`), then the
//! data fix-ups SQL cannot express. Above the bus, since a fix-up may read the bus's formats.

use sqlx::MySqlPool;

use paybus_bus::dead_letter;
use paybus_db::{DbError, MIGRATOR};

/// Applies every pending migration, then the data fix-ups; applied ones are skipped, so this is
/// safe to repeat.
pub async fn apply(pool: &MySqlPool) -> Result<(), DbError> {
    MIGRATOR.run(pool).await?;
    let rewritten = dead_letter::rewrite_legacy_headers(pool)
        .await
        .map_err(DbError::DataMigration)?;
    if rewritten > 0 {
        tracing::info!(rewritten, "dead letter headers rewritten as readable JSON");
    }
    Ok(())
}
