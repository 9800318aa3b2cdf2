//! Applying migrations with a bound on how long a statement waits for its table's lock, and
//! telling, when one gives up, whether it changed anything (then it can simply be run again).

use std::{collections::HashSet, time::Duration};

use sqlx::{
    AssertSqlSafe, Connection, Row,
    migrate::{Migrate, MigrateError, Migration, Migrator},
    mysql::{MySqlConnection, MySqlPool},
};

use crate::{DbError, error_number};

/// Applies `migrator`'s pending migrations on a connection of their own on which every
/// statement waits at most `lock_wait` for a lock (`lock_wait_timeout`, whole seconds).
///
/// Why: an `ALTER`, however online, takes its table's exclusive metadata lock to start and to
/// finish, and waits for every transaction open on the table first; meanwhile every later
/// statement on the table, confirmations included, queues behind it. The servers' own bound is
/// a day (MariaDB) or a year (MySQL 8). Bounded, a migration that meets a long transaction
/// fails fast instead of stalling money traffic, with [`DbError::LockWaitTimeout`].
///
/// sqlx records a migration before running it and, since DDL commits implicitly, a failed one
/// stays recorded as partially applied, which refuses every later run. A migration that gave
/// up on its lock having changed nothing has its record removed, so running the migrations
/// again retries it: one of one statement (the lock comes before any change), or one of
/// several that starts with DDL and left the schema as it found it (it gave up on its first
/// statement; see [`SchemaFingerprint`]).
pub async fn migrate(
    migrator: &Migrator,
    pool: &MySqlPool,
    lock_wait: Duration,
) -> Result<(), DbError> {
    // A connection of its own, closed afterwards: the session setting and the migrator's
    // advisory lock (kept when a migration fails) never reach a pooled connection.
    let options = pool.connect_options();
    let mut conn = MySqlConnection::connect_with(&options)
        .await
        .map_err(|source| DbError::Unreachable {
            url: format!(
                "mysql://{}:{}/{}",
                options.get_host(),
                options.get_port(),
                options.get_database().unwrap_or_default()
            ),
            source,
        })?;
    sqlx::query("SET SESSION lock_wait_timeout = ?")
        .bind(lock_wait.as_secs().max(1))
        .execute(&mut conn)
        .await
        .map_err(|e| DbError::Migrate(MigrateError::Execute(e)))?;
    let result = match apply_pending(migrator, &mut conn).await {
        Err(Failed {
            error: MigrateError::ExecuteMigration(error, version),
            before,
        }) if error_number(&error) == Some(LOCK_WAIT_TIMEOUT) => {
            Err(gave_up_on_lock(&mut conn, migrator, version, lock_wait, before).await)
        }
        Err(failed) => Err(DbError::from(failed.error)),
        Ok(()) => Ok(()),
    };
    // Closing is a courtesy to the server: a dropped connection is closed all the same.
    let _ = conn.close().await;
    result
}

/// A migration that failed, with the schema as it was before it when it has several
/// statements.
struct Failed {
    error: MigrateError,
    before: Option<SchemaFingerprint>,
}

impl From<MigrateError> for Failed {
    fn from(error: MigrateError) -> Self {
        Failed {
            error,
            before: None,
        }
    }
}

/// sqlx's own run, one pending migration at a time, so that one of several statements can be
/// compared with the schema it started from; then sqlx's run over everything, which applies
/// nothing more and checks what it always checks (a migration changed or missing since it was
/// applied, one left partially applied).
async fn apply_pending(migrator: &Migrator, conn: &mut MySqlConnection) -> Result<(), Failed> {
    conn.ensure_migrations_table(&migrator.table_name).await?;
    let applied: HashSet<i64> = conn
        .list_applied_migrations(&migrator.table_name)
        .await?
        .into_iter()
        .map(|m| m.version)
        .collect();
    for migration in migrator
        .iter()
        .filter(|m| m.migration_type.is_up_migration() && !applied.contains(&m.version))
    {
        let before = if starts_with_ddl_of_several(migration) {
            Some(
                SchemaFingerprint::read(conn)
                    .await
                    .map_err(MigrateError::Execute)?,
            )
        } else {
            None
        };
        migrator
            .run_to(migration.version, &mut *conn)
            .await
            .map_err(|error| Failed { error, before })?;
    }
    migrator.run(&mut *conn).await?;
    Ok(())
}

/// Lock wait timeout exceeded: a metadata lock past `lock_wait_timeout`, or a row lock past
/// `innodb_lock_wait_timeout`.
const LOCK_WAIT_TIMEOUT: u16 = 1205;

/// [`DbError::LockWaitTimeout`] for migration `version`, its record removed when it changed
/// nothing (see [`migrate`]).
async fn gave_up_on_lock(
    conn: &mut MySqlConnection,
    migrator: &Migrator,
    version: i64,
    waited: Duration,
    before: Option<SchemaFingerprint>,
) -> DbError {
    let migration = migrator.iter().find(|m| m.version == version);
    let changed_nothing = match (migration, before) {
        (Some(m), _) if is_one_statement(m.sql.as_str()) => true,
        (Some(_), Some(before)) => SchemaFingerprint::read(conn)
            .await
            .is_ok_and(|now| now == before),
        _ => false,
    };
    let mut retryable = false;
    if changed_nothing {
        let removed = sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {} WHERE version = ? AND success = FALSE",
            migrator.table_name
        )))
        .bind(version)
        .execute(&mut *conn)
        .await;
        retryable = removed.is_ok();
    }
    // The server's other schemas (tenants, tests) have transactions of their own, often older:
    // one whose session uses this schema is named first, and the oldest anywhere only when no
    // such one is open (it may still touch this schema's tables by their full names).
    let oldest: Option<(u64, i64)> = sqlx::query_as(
        "SELECT CAST(t.trx_mysql_thread_id AS UNSIGNED), \
                TIMESTAMPDIFF(SECOND, t.trx_started, NOW()) \
         FROM information_schema.INNODB_TRX t \
         LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
         WHERE t.trx_mysql_thread_id <> CONNECTION_ID() \
         ORDER BY (p.DB <=> DATABASE()) DESC, t.trx_started LIMIT 1",
    )
    .fetch_optional(&mut *conn)
    .await
    .ok()
    .flatten();
    DbError::LockWaitTimeout {
        version,
        description: migration.map_or_else(String::new, |m| m.description.to_string()),
        waited,
        oldest: oldest
            .map(|(connection, seconds)| format!("connection {connection}, open for {seconds} s")),
        retryable,
    }
}

/// The migration's SQL without its whole-line comments.
fn code(sql: &str) -> String {
    sql.lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether a migration's SQL is one statement: no `;` but a last one, outside whole-line
/// comments. Cautious: a `;` inside a string or a trailing comment reads as a second statement
/// (the record is then kept), never the other way round.
fn is_one_statement(sql: &str) -> bool {
    let code = code(sql);
    let code = code.trim_end();
    let code = code.strip_suffix(';').unwrap_or(code);
    !code.trim().is_empty() && !code.contains(';')
}

/// Whether `migration` has several statements, the first of them DDL: the ones a
/// [`SchemaFingerprint`] can tell untouched. A first statement that changes rows would leave
/// the schema as it was while having changed something.
fn starts_with_ddl_of_several(migration: &Migration) -> bool {
    let sql = migration.sql.as_str();
    let code = code(sql);
    let first = code
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase();
    !is_one_statement(sql) && ["ALTER", "CREATE", "DROP", "RENAME"].contains(&first.as_str())
}

/// The schema's tables as `SHOW CREATE TABLE` prints them, without their next
/// `AUTO_INCREMENT` value (which inserts move): columns, indexes, keys, constraints, engine,
/// comments. Equal before and after a migration that gave up means its DDL changed nothing. A
/// DDL statement that completes without changing any of that (`ALTER TABLE t FORCE`, a
/// `CREATE TABLE IF NOT EXISTS` of a table that exists) reads as unchanged, and is run again.
#[derive(Debug, PartialEq, Eq)]
struct SchemaFingerprint(Vec<(String, String)>);

impl SchemaFingerprint {
    async fn read(conn: &mut MySqlConnection) -> Result<Self, sqlx::Error> {
        let tables: Vec<String> = sqlx::query("SHOW FULL TABLES")
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;
        let mut created = Vec::with_capacity(tables.len());
        for table in tables {
            let row = sqlx::query(AssertSqlSafe(format!(
                "SHOW CREATE TABLE `{}`",
                table.replace('`', "``")
            )))
            .fetch_one(&mut *conn)
            .await?;
            let statement: String = row.try_get(1)?;
            created.push((table, without_next_auto_increment(&statement)));
        }
        created.sort();
        Ok(SchemaFingerprint(created))
    }
}

fn without_next_auto_increment(statement: &str) -> String {
    statement
        .split(' ')
        .filter(|word| {
            !word
                .strip_prefix("AUTO_INCREMENT=")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use sqlx::migrate::MigrationType;

    use super::*;

    #[test]
    fn one_statement_is_told_from_several_and_doubt_counts_as_several() {
        assert!(is_one_statement(
            "-- a comment; with a semicolon\nALTER TABLE t\n    ADD COLUMN c INT NULL,\n    ALGORITHM=INSTANT;\n"
        ));
        assert!(is_one_statement("CREATE INDEX i ON t (c)"));
        assert!(!is_one_statement(
            "ALTER TABLE t ADD COLUMN c INT NULL; UPDATE t SET c = 1;"
        ));
        assert!(!is_one_statement("INSERT INTO t VALUES ('a;b')"));
        assert!(!is_one_statement("-- only a comment\n"));
    }

    fn migration(sql: &'static str) -> Migration {
        Migration::new(
            1,
            "m".into(),
            MigrationType::Simple,
            sqlx::SqlStr::from_static(sql),
            false,
        )
    }

    #[test]
    fn only_several_statements_opening_with_ddl_are_compared_with_the_schema() {
        assert!(starts_with_ddl_of_several(&migration(
            "-- why\nalter table t ADD COLUMN c INT NULL, ALGORITHM=INSTANT;\nUPDATE t SET c = 1;"
        )));
        assert!(starts_with_ddl_of_several(&migration(
            "CREATE TABLE a (id INT PRIMARY KEY);\nALTER TABLE b ADD COLUMN c INT NULL;"
        )));
        assert!(!starts_with_ddl_of_several(&migration(
            "UPDATE t SET c = 1;\nALTER TABLE t DROP COLUMN d, ALGORITHM=INSTANT;"
        )));
        assert!(!starts_with_ddl_of_several(&migration(
            "ALTER TABLE t ADD COLUMN c INT NULL, ALGORITHM=INSTANT;"
        )));
    }

    #[test]
    fn the_next_auto_increment_value_is_not_part_of_the_schema() {
        let before = "CREATE TABLE `t` (\n  `id` bigint(20) unsigned NOT NULL AUTO_INCREMENT,\n  PRIMARY KEY (`id`)\n) ENGINE=InnoDB AUTO_INCREMENT=7 DEFAULT CHARSET=utf8mb4";
        let after = before.replace("AUTO_INCREMENT=7", "AUTO_INCREMENT=912");
        assert_eq!(
            without_next_auto_increment(before),
            without_next_auto_increment(&after)
        );
        assert!(without_next_auto_increment(before).contains("NOT NULL AUTO_INCREMENT,"));
        assert_ne!(
            without_next_auto_increment(before),
            without_next_auto_increment(&before.replace("InnoDB", "Aria"))
        );
    }
}
