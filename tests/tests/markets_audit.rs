//! W4's audit checks against real MariaDB: a finished suspension is clean, and each check
//! reports exactly the violation planted for it by raw SQL.

use paybus_bus::Services;
use paybus_cancel_orders::{Attempts, CancelConfig, cancel_tasks};
use paybus_markets::{
    audit::{self as w4, Violation},
    materialise::Plan,
    suspension,
};
use paybus_ops::audit;
use paybus_retry::Clock;
use paybus_testkit::{
    TestEnv,
    markets::{market, open_orders},
    scalar,
};
use sqlx::MySqlPool;

/// Every W4 finding, through the catalog's checks (a check dropped from it fails here).
async fn findings(pool: &MySqlPool) -> Vec<audit::Violation> {
    let mut conn = pool.acquire().await.unwrap();
    audit::run(&mut conn, &paybus_catalog::audit_checks())
        .await
        .unwrap()
}

fn reported(violations: Vec<Violation>) -> Vec<audit::Violation> {
    audit::violations(violations)
}

/// Market BTC with `count` open orders, suspended; its batch id.
async fn suspended(env: &TestEnv, services: &Services, count: usize) -> (u64, u64, Vec<u64>) {
    let market_id = market(&env.db, "BTC").await;
    let orders = open_orders(&env.db, market_id, count).await;
    let batch = suspension::suspend(
        &services.outbox,
        "BTC",
        None,
        &Plan::default(),
        &paybus_testkit::person("tests"),
    )
    .await
    .unwrap()
    .batch_id;
    (market_id, batch, orders)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_suspension_is_clean() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let (_, batch, _) = suspended(&env, &services, 5).await;
    let tasks: Vec<u64> = sqlx::query_scalar("SELECT id FROM tasks ORDER BY id")
        .fetch_all(&env.db)
        .await
        .unwrap();
    let config = CancelConfig::default();
    let attempts = Attempts {
        policy: config.retry,
        lease: config.lease,
        clock: Clock::Database,
    };
    cancel_tasks(&env.db, batch, &tasks, &attempts)
        .await
        .unwrap();

    assert_eq!(findings(&env.db).await, vec![]);
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM tasks WHERE state = 'DONE'").await,
        5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_order_of_the_set_without_a_task_is_reported() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let market_id = market(&env.db, "BTC").await;
    let orders = open_orders(&env.db, market_id, 3).await;
    // A gap in the ids, filled again after the suspension: an open order of the frozen set
    // (id below max_target_id) that no task covers.
    sqlx::query("DELETE FROM orders WHERE id = ?")
        .bind(orders[1])
        .execute(&env.db)
        .await
        .unwrap();
    let batch_id = suspension::suspend(
        &services.outbox,
        "BTC",
        None,
        &Plan::default(),
        &paybus_testkit::person("tests"),
    )
    .await
    .unwrap()
    .batch_id;
    sqlx::query(
        "INSERT INTO orders (id, market_id, account_id, side, price, quantity) \
         VALUES (?, ?, 1, 'BUY', 1, 1)",
    )
    .bind(orders[1])
    .bind(market_id)
    .execute(&env.db)
    .await
    .unwrap();

    let found = findings(&env.db).await;

    assert_eq!(
        found,
        reported(vec![Violation::OpenOrderLeftBehind {
            order_id: orders[1],
            symbol: "BTC".into(),
            batch_id
        }])
    );
    assert_eq!(
        found[0].to_string(),
        format!(
            "open_order_left_behind: order {} of suspended market BTC is open but batch \
             {batch_id} has no task for it",
            orders[1]
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_slipped_in_after_the_suspension_is_reported() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let (market_id, batch_id, orders) = suspended(&env, &services, 2).await;
    let late = sqlx::query(
        "INSERT INTO orders (market_id, account_id, side, price, quantity) \
         VALUES (?, 1, 'SELL', 1, 1)",
    )
    .bind(market_id)
    .execute(&env.db)
    .await
    .unwrap()
    .last_insert_id();

    let mut conn = env.db.acquire().await.unwrap();
    assert_eq!(
        w4::suspension_sets(&mut conn).await.unwrap(),
        vec![Violation::OrderAcceptedWhileSuspended {
            order_id: late,
            symbol: "BTC".into(),
            batch_id,
            max_target_id: orders[1]
        }]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_that_do_not_add_up_or_disagree_with_their_order_are_reported() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let (_, batch_id, orders) = suspended(&env, &services, 2).await;
    sqlx::query("UPDATE task_batches SET created_count = created_count + 1")
        .execute(&env.db)
        .await
        .unwrap();
    let task_id: u64 = sqlx::query_scalar("SELECT id FROM tasks WHERE target_id = ?")
        .bind(orders[0])
        .fetch_one(&env.db)
        .await
        .unwrap();
    sqlx::query("UPDATE tasks SET state = 'DONE', finished_at = NOW(6) WHERE id = ?")
        .bind(task_id)
        .execute(&env.db)
        .await
        .unwrap();

    let mut conn = env.db.acquire().await.unwrap();
    assert_eq!(
        w4::cancel_tasks(&mut conn).await.unwrap(),
        vec![
            Violation::TaskCountMismatch {
                batch_id,
                created_count: 3,
                tasks: 2
            },
            Violation::TaskDisagreesWithOrder {
                task_id,
                state: "DONE".into(),
                order_id: orders[0],
                order_status: Some("OPEN".into())
            }
        ]
    );
}
