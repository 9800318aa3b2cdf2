//! The platform's foundation against the real services: migrations and per-test isolation.

use lapin::{
    BasicProperties, Connection, ConnectionProperties,
    options::{BasicPublishOptions, QueueDeclareOptions},
    types::FieldTable,
};
use std::time::{Duration, Instant};

use paybus_confirmations::withdrawal::{WithdrawalKind, WithdrawalStatus};
use paybus_db as db;
use paybus_testkit::TestEnv;
use sqlx::{
    SqlSafeStr,
    migrate::{Migration, MigrationType, Migrator},
};

async fn table_names(env: &TestEnv) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
         WHERE table_schema = DATABASE() ORDER BY table_name",
    )
    .fetch_all(&env.db)
    .await
    .expect("list tables")
}

#[tokio::test]
async fn migrations_apply_to_an_empty_database_and_are_idempotent() {
    let env = TestEnv::unmigrated().await;
    assert!(table_names(&env).await.is_empty());
    let known = db::MIGRATOR.iter().count();
    let mut conn = env.db.acquire().await.unwrap();
    assert_eq!(db::pending_migrations(&mut conn).await.unwrap(), known);

    paybus_runtime::migrations::apply(&env.db)
        .await
        .expect("first run applies");
    let tables = table_names(&env).await;
    for table in ["outbox_messages", "dead_letters", "_sqlx_migrations"] {
        assert!(
            tables.contains(&table.to_owned()),
            "{table} missing: {tables:?}"
        );
    }
    assert_eq!(db::pending_migrations(&mut conn).await.unwrap(), 0);

    paybus_runtime::migrations::apply(&env.db)
        .await
        .expect("second run is a no-op");
    let recorded: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(recorded, i64::try_from(known).unwrap());
    assert_eq!(table_names(&env).await, tables);
}

async fn amqp(env: &TestEnv) -> Connection {
    Connection::connect(
        env.settings.broker.url.as_str(),
        ConnectionProperties::default(),
    )
    .await
    .expect("connect to the test vhost")
}

#[tokio::test]
async fn two_tests_at_once_see_neither_rows_nor_queues_of_the_other() {
    let (a, b) = tokio::join!(TestEnv::new(), TestEnv::new());
    assert_ne!(a.db_name, b.db_name);

    sqlx::query(
        "INSERT INTO outbox_messages (message_id, routing_key, correlation_id, body) \
         VALUES (UUID(), 'test.isolation', UUID(), 'x')",
    )
    .execute(&a.db)
    .await
    .unwrap();
    let count =
        |pool| sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM outbox_messages").fetch_one(pool);
    assert_eq!(count(&a.db).await.unwrap(), 1);
    assert_eq!(count(&b.db).await.unwrap(), 0);

    // The same queue name in both namespaces is two different queues.
    let (conn_a, conn_b) = (amqp(&a).await, amqp(&b).await);
    let (ch_a, ch_b) = (
        conn_a.create_channel().await.unwrap(),
        conn_b.create_channel().await.unwrap(),
    );
    let declare = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch_a.queue_declare("paybus.isolation".into(), declare, FieldTable::default())
        .await
        .unwrap();
    ch_a.basic_publish(
        "".into(),
        "paybus.isolation".into(),
        BasicPublishOptions::default(),
        b"hello",
        BasicProperties::default(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let in_b = ch_b
        .queue_declare("paybus.isolation".into(), declare, FieldTable::default())
        .await
        .unwrap();
    assert_eq!(in_b.message_count(), 0);
    let in_a = ch_a
        .queue_declare("paybus.isolation".into(), declare, FieldTable::default())
        .await
        .unwrap();
    assert_eq!(in_a.message_count(), 1);
}

#[tokio::test]
async fn dropping_the_environment_removes_its_database_and_vhost() {
    let env = TestEnv::new().await;
    let name = env.db_name.clone();
    let mut settings = env.settings.clone();
    drop(env);

    settings.database.url.set_path("");
    let server = db::connect(&settings.database).await.unwrap();
    let left: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?",
    )
    .bind(&name)
    .fetch_one(&server)
    .await
    .unwrap();
    assert_eq!(left, 0, "database {name} was left behind");

    let error = Connection::connect(
        settings.broker.url.as_str(),
        ConnectionProperties::default(),
    )
    .await
    .err();
    assert!(error.is_some(), "vhost {name} still accepts connections");
}

#[tokio::test]
async fn a_pooled_connection_the_server_killed_while_idle_is_replaced_before_anyone_gets_it() {
    // Arrange: a pool of one connection, and that connection killed by the server while it
    // sits idle in the pool (a restart, a network drop, `wait_timeout`).
    let env = TestEnv::new().await;
    let mut settings = env.settings.database.clone();
    settings.max_connections = 1;
    let pool = db::connect(&settings).await.unwrap();
    let first: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL {first}")))
        .execute(&env.db)
        .await
        .unwrap();
    tokio::time::sleep(db::PING_WHEN_IDLE_FOR + std::time::Duration::from_millis(200)).await;

    // Act: the next acquire, once the connection has been idle longer than the pool trusts.
    let second: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&pool)
        .await
        .expect("the dead connection is found by the idle ping and replaced");

    // Assert
    assert_ne!(first, second);
}

#[tokio::test]
async fn a_read_committed_transaction_sees_what_others_commit_meanwhile() {
    // Arrange: a READ COMMITTED transaction that has read once (a REPEATABLE READ one would
    // keep that snapshot).
    let env = TestEnv::new().await;
    let count = "SELECT COUNT(*) FROM canary_pings";
    let mut tx = db::begin_read_committed(&env.db).await.unwrap();
    let before: i64 = sqlx::query_scalar(count).fetch_one(&mut *tx).await.unwrap();

    // Act: another connection commits a row.
    sqlx::query("INSERT INTO canary_pings () VALUES ()")
        .execute(&env.db)
        .await
        .unwrap();
    let after: i64 = sqlx::query_scalar(count).fetch_one(&mut *tx).await.unwrap();

    // Assert
    assert_eq!((before, after), (0, 1));
    tx.commit().await.unwrap();
}

/// This release's migrations and one more that changes `withdrawals` online, as the next
/// release would ship it.
fn migrations_and_an_online_alter_of_withdrawals() -> Migrator {
    migrations_and(
        "-- a nullable column, instantly\n\
         ALTER TABLE withdrawals ADD COLUMN note VARCHAR(20) NULL, ALGORITHM=INSTANT;",
    )
}

/// This release's migrations and one more, `sql`.
fn migrations_and(sql: &'static str) -> Migrator {
    let mut migrations: Vec<Migration> = db::MIGRATOR.iter().cloned().collect();
    migrations.push(Migration::new(
        99_991_231_000_001,
        "withdrawals note".into(),
        MigrationType::Simple,
        sql.into_sql_str(),
        false,
    ));
    Migrator::with_migrations(migrations)
}

/// A migration of two statements, as the next release might ship one: `withdrawals` first,
/// then `deposits`.
fn migrations_and_online_alters_of_withdrawals_then_deposits() -> Migrator {
    migrations_and(
        "ALTER TABLE withdrawals ADD COLUMN note VARCHAR(20) NULL, ALGORITHM=INSTANT;\n\
         ALTER TABLE deposits ADD COLUMN note VARCHAR(20) NULL, ALGORITHM=INSTANT;",
    )
}

/// A transaction left open after reading `withdrawals` (a report, a stuck session): it holds
/// the table's shared metadata lock until it ends.
async fn a_transaction_that_read_withdrawals(
    pool: &sqlx::MySqlPool,
) -> sqlx::Transaction<'static, sqlx::MySql> {
    let mut transaction = pool.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM withdrawals")
        .fetch_one(&mut *transaction)
        .await
        .unwrap();
    transaction
}

async fn has_note_column(pool: &sqlx::MySqlPool) -> bool {
    let columns: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = 'withdrawals' AND column_name = 'note'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    columns == 1
}

#[tokio::test]
async fn a_migration_behind_a_long_transaction_gives_up_within_its_bound_and_frees_the_table() {
    // Arrange: a withdrawal in flight, and a transaction that has read the table and stays
    // open (a report, a stuck session): it holds the table's shared metadata lock. An older
    // transaction in another schema of the server (another tenant's, another test's) is not
    // the one in the way.
    let elsewhere = TestEnv::new().await;
    let older_elsewhere = a_transaction_that_read_withdrawals(&elsewhere.db).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let env = TestEnv::new().await;
    let partner = paybus_testkit::partners::partner(&env.db, "partner", None).await;
    let withdrawal = paybus_testkit::confirmations::withdrawal(
        &env.db,
        partner,
        WithdrawalKind::Normal,
        WithdrawalStatus::Broadcasting,
        "10",
    )
    .await;
    let mut report = a_transaction_that_read_withdrawals(&env.db).await;
    let reporter: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&mut *report)
        .await
        .unwrap();
    let migrator = migrations_and_an_online_alter_of_withdrawals();
    let bound = Duration::from_secs(1);

    // Act: the migration, and a confirmation's UPDATE sent once the ALTER waits for the lock
    // (the moment it queues behind the ALTER).
    let started = Instant::now();
    // Time-limited, so that without the bound the test fails instead of hanging.
    let migrating = async {
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            db::migrate(&migrator, &env.db, bound),
        )
        .await;
        (result, started.elapsed())
    };
    let confirming = async {
        while !alter_waits_for_the_lock(&env.db).await {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the ALTER never waited for the lock"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let sent = Instant::now();
        let confirmed = tokio::time::timeout(
            Duration::from_secs(10),
            sqlx::query(
                "UPDATE withdrawals SET status = 'CONFIRMED', tx_hash = '0xconfirmed', \
                 confirmed_at = NOW(6) WHERE id = ? AND status = 'BROADCASTING'",
            )
            .bind(withdrawal)
            .execute(&env.db),
        )
        .await;
        (confirmed, sent.elapsed())
    };
    let ((migrated, migration_took), (confirmed, confirmation_took)) =
        tokio::join!(migrating, confirming);

    // Assert: the confirmation waited at most the bound, not for as long as the report stays
    // open; the migration gave up within its bound, naming the lock and the transaction holding
    // it, and changed nothing.
    let done = confirmed
        .expect("the confirmation is not stuck behind the ALTER")
        .unwrap();
    assert_eq!(done.rows_affected(), 1);
    assert!(
        confirmation_took <= bound + Duration::from_millis(500),
        "the confirmation waited {confirmation_took:?} behind the ALTER"
    );
    let error = migrated
        .expect("the migration gives up by itself")
        .expect_err("the migration cannot take the lock while the report is open");
    assert!(
        matches!(
            error,
            db::DbError::LockWaitTimeout {
                version: 99_991_231_000_001,
                retryable: true,
                ..
            }
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("metadata lock"), "{message}");
    assert!(
        message.contains(&format!("connection {reporter}")),
        "{message}"
    );
    assert!(
        migration_took < bound + Duration::from_secs(2),
        "{migration_took:?}"
    );
    assert!(!has_note_column(&env.db).await);

    // Once the report ends, running the migrations again applies it.
    report.commit().await.unwrap();
    older_elsewhere.commit().await.unwrap();
    db::migrate(&migrator, &env.db, bound)
        .await
        .expect("retried after the long transaction, the migration applies");
    assert!(has_note_column(&env.db).await);
}

/// [`paybus_runtime::migrations::migrate_retrying_locks`] with a 1 s bound, time-limited so
/// that a test fails instead of hanging.
async fn migrate_retrying_with_a_one_second_bound(
    migrator: &Migrator,
    pool: &sqlx::MySqlPool,
) -> Result<(), db::DbError> {
    tokio::time::timeout(
        Duration::from_secs(30),
        paybus_runtime::migrations::migrate_retrying_locks(migrator, pool, Duration::from_secs(1)),
    )
    .await
    .expect("the migration ends by itself")
}

/// `migrator` applied with retries on a new database while a transaction that has read
/// withdrawals ends 2.5 s after the start, past the first try's 1 s bound: the database, what
/// the migration returned and how long it took.
async fn migrated_while_a_read_of_withdrawals_ends_after_2_5_s(
    migrator: &Migrator,
) -> (TestEnv, Result<(), db::DbError>, Duration) {
    let env = TestEnv::new().await;
    let report = a_transaction_that_read_withdrawals(&env.db).await;
    let holding = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        report.commit().await.unwrap();
    });
    let started = Instant::now();
    let migrated = migrate_retrying_with_a_one_second_bound(migrator, &env.db).await;
    let took = started.elapsed();
    holding.await.unwrap();
    (env, migrated, took)
}

#[tokio::test]
async fn a_migration_behind_a_transaction_that_ends_within_seconds_is_tried_again_and_applies() {
    let (env, migrated, took) = migrated_while_a_read_of_withdrawals_ends_after_2_5_s(
        &migrations_and_an_online_alter_of_withdrawals(),
    )
    .await;

    // The first try gave up (the transaction was still open), a later one applied it.
    migrated.expect("tried again once the transaction ended, the migration applies");
    assert!(has_note_column(&env.db).await);
    assert!(took >= Duration::from_millis(2_500), "{took:?}");
}

#[tokio::test]
async fn a_migration_of_several_statements_that_gave_up_on_its_first_is_tried_again_and_applies() {
    // withdrawals, which the transaction holds, is the migration's first table.
    let (env, migrated, took) = migrated_while_a_read_of_withdrawals_ends_after_2_5_s(
        &migrations_and_online_alters_of_withdrawals_then_deposits(),
    )
    .await;

    // The first try gave up on its first statement, having changed nothing, and a later try
    // applied both.
    migrated.expect("tried again once the transaction ended, the migration applies");
    assert!(has_note_column(&env.db).await);
    assert!(took >= Duration::from_millis(2_500), "{took:?}");
}

#[tokio::test]
async fn a_migration_of_several_statements_that_gave_up_after_its_first_ran_says_so_and_is_not_run_again()
 {
    // Arrange: a transaction left open after reading deposits, the migration's second table.
    let env = TestEnv::new().await;
    let mut report = env.db.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM deposits")
        .fetch_one(&mut *report)
        .await
        .unwrap();
    let migrator = migrations_and_online_alters_of_withdrawals_then_deposits();

    // Act
    let migrated = migrate_retrying_with_a_one_second_bound(&migrator, &env.db).await;
    report.rollback().await.unwrap();

    // Assert: the first statement ran, so the migration is not one to run again whole: the
    // error says so at once, and sqlx keeps it recorded as partially applied.
    let error = migrated.expect_err("the second statement cannot take its lock");
    assert!(
        matches!(
            error,
            db::DbError::LockWaitTimeout {
                version: 99_991_231_000_001,
                retryable: false,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("partially applied"), "{error}");
    assert!(has_note_column(&env.db).await, "the first statement ran");
    let again = db::migrate(&migrator, &env.db, Duration::from_secs(1))
        .await
        .expect_err("a partially applied migration refuses every later run");
    assert!(
        matches!(
            again,
            db::DbError::Migrate(sqlx::migrate::MigrateError::Dirty(99_991_231_000_001))
        ),
        "{again:?}"
    );
}

/// Whether a session of this test's database waits for a table's metadata lock.
async fn alter_waits_for_the_lock(pool: &sqlx::MySqlPool) -> bool {
    let waiting: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE DB = DATABASE() AND STATE = 'Waiting for table metadata lock'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    waiting > 0
}
