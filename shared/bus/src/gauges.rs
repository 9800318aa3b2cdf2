//! What `/metrics` and the console's overview read from the database at each look: the outbox
//! backlog, the messages held for a newer release, the dead letters per function, each work
//! table's due, stuck and held rows, the auditor's last pass and the paused functions.

use std::time::Duration;

use crate::{dead_letter, held, metrics::Gauges, outbox};
use paybus_retry::WorkTable;

/// How long a row may sit due (or claimed) before it counts as stuck.
pub const STUCK_AFTER: Duration = Duration::from_secs(15 * 60);

/// Reads the scrape-time [`Gauges`]: the outbox backlog, NEW dead letters per function, and
/// each of `work_tables`' due and stuck rows (every statement on an index named for it).
pub async fn read_gauges(
    pool: &sqlx::MySqlPool,
    work_tables: &[&WorkTable],
) -> Result<Gauges, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let (outbox_backlog, outbox_oldest_seconds) = outbox::outbox_lag(&mut conn).await?;
    // From the counts every dead-letter write keeps: exact, and a read of a few rows. Counting
    // the NEW letters read every one of them (0.13-0.16 s at 500,000 on every scrape and
    // every overview, `paybus-lab bench ops-queries`).
    let mut dead_letters = std::collections::BTreeMap::<String, u64>::new();
    for group in dead_letter::group_counts::read(&mut conn).await? {
        if let Ok(letters @ 1..) = u64::try_from(group.letters) {
            *dead_letters.entry(group.function_name).or_default() += letters;
        }
    }
    // A pass is written when it finishes: the newest row (by primary key) is the last pass.
    let audit_last_pass_age_seconds: Option<f64> = sqlx::query_scalar(
        "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, finished_at, NOW(6)) / 1e6 AS DOUBLE) \
         FROM audit_passes ORDER BY id DESC LIMIT 1",
    )
    .fetch_optional(&mut *conn)
    .await?;
    let paused_functions: Vec<String> =
        sqlx::query_scalar("SELECT function_name FROM function_pauses ORDER BY function_name")
            .fetch_all(&mut *conn)
            .await?;
    let held_messages = held::waiting(&mut conn).await?;
    let mut gauges = Gauges {
        held_messages,
        audit_last_pass_age_seconds,
        paused_functions,
        outbox_backlog,
        outbox_oldest_seconds,
        dead_letters: dead_letters.into_iter().collect(),
        ..Gauges::default()
    };
    for table in work_tables {
        gauges
            .due_retries
            .push((table.table.to_owned(), table.count_due(&mut conn).await?));
        gauges.stuck_rows.push((
            table.table.to_owned(),
            table.count_stuck(&mut conn, STUCK_AFTER).await?,
        ));
        if let Some(held) = table.count_held_for_a_human(&mut conn).await? {
            gauges.held_for_a_human.push((table.table.to_owned(), held));
        }
    }
    Ok(gauges)
}
