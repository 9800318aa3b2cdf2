//! `paybus suspension show|watch` as operators run them, on a suspension planted by SQL.

use crate::api_process;

use api_process::{output_of, paybus};
use paybus_testkit::TestEnv;

/// Market BTC suspended with 3 tasks: 1 DONE (its order cancelled), 2 in `rest` state, whose
/// orders are OPEN when `rest` is PENDING or FAILED.
async fn plant(env: &TestEnv, rest: &str) {
    for sql in [
        "INSERT INTO markets (id, symbol, status, suspended_at, current_batch_id) \
         VALUES (1, 'BTC', 'SUSPENDED', NOW(6), 1)",
        "INSERT INTO orders (id, market_id, account_id, side, price, quantity, status, \
         cancel_reason, cancelled_at) VALUES (1, 1, 1, 'BUY', 1, 1, 'CANCELLED', \
         'MARKET_SUSPENDED', NOW(6))",
        "INSERT INTO orders (id, market_id, account_id, side, price, quantity) \
         VALUES (2, 1, 1, 'BUY', 1, 1), (3, 1, 1, 'SELL', 1, 1)",
        "INSERT INTO task_batches (id, type, market_id, ref, reason, max_target_id, \
         materialise_cursor, created_count, materialised_at) \
         VALUES (1, 'CANCEL_OPEN_ORDER', 1, 'BTC', 'MARKET_SUSPENDED', 3, 3, 3, NOW(6))",
        "INSERT INTO tasks (type, batch_id, target_id, state, attempts, finished_at) \
         VALUES ('CANCEL_OPEN_ORDER', 1, 1, 'DONE', 1, NOW(6))",
    ] {
        sqlx::query(sql).execute(&env.db).await.unwrap();
    }
    sqlx::query(
        "INSERT INTO tasks (type, batch_id, target_id, state) \
         VALUES ('CANCEL_OPEN_ORDER', 1, 2, ?), ('CANCEL_OPEN_ORDER', 1, 3, ?)",
    )
    .bind(rest)
    .bind(rest)
    .execute(&env.db)
    .await
    .unwrap();
}

#[tokio::test]
async fn show_prints_the_seeds_group_by_table_and_the_progress_line() {
    let env = TestEnv::new().await;
    plant(&env, "PENDING").await;

    let output = output_of(paybus(&env).args(["suspension", "show", "BTC"]));

    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let lines: Vec<&str> = stdout.lines().skip(1).collect();
    assert_eq!(
        lines,
        [
            "PENDING  2",
            "DONE     1",
            "SKIPPED  0",
            "FAILED   0",
            "created  3 (final)",
            "open orders left: 2",
            "suspension in progress (1 / 3)",
        ]
    );
    assert!(stdout.starts_with("market BTC: SUSPENDED, batch 1 (MARKET_SUSPENDED) since"));
}

#[tokio::test]
async fn watch_stops_with_exit_1_when_the_suspension_needs_attention() {
    let env = TestEnv::new().await;
    plant(&env, "FAILED").await;

    let output = output_of(paybus(&env).args(["suspension", "watch", "BTC"]));

    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("suspension needs attention: no task pending but 2 orders still open"),
        "{stdout}"
    );
}

#[tokio::test]
async fn watch_and_show_name_a_market_that_was_never_suspended() {
    let env = TestEnv::new().await;
    sqlx::query("INSERT INTO markets (symbol) VALUES ('ETH')")
        .execute(&env.db)
        .await
        .unwrap();

    let output = output_of(paybus(&env).args(["suspension", "show", "ETH"]));

    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("market ETH has never been suspended"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
