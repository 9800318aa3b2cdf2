//! cancel-orders against the real database and broker: the handler called directly where the
//! question is one message's outcome, the real runtime (and the real binary, killed) where it
//! is the whole run.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::{process::Stdio, sync::Arc, time::Duration};

use paybus_bus::{Context, Envelope, Handler, Outcome, Services};
use paybus_cancel_orders::{CancelConfig, CancelOrders, due_tasks};
use paybus_maintenance::DueSweepConfig;
use paybus_markets::{
    CancelTasksCreated,
    materialise::{Materialiser, MaterialiserConfig, Plan},
    progress, suspension,
};
use paybus_retry::RetryPolicy;
use paybus_runtime::runner::Runner;
use paybus_testkit::{
    TestEnv, eventually, manual_clock,
    markets::{assert_audit_clean, market, open_orders, orders_in, refuse_cancels_of},
    scalar,
};
use sqlx::MySqlPool;
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------------
// Harness

/// Three attempts, 100 ms then 200 ms apart.
fn short_retries() -> CancelConfig {
    CancelConfig {
        retry: RetryPolicy::with_schedule(
            3,
            vec![Duration::from_millis(100), Duration::from_millis(200)],
        )
        .unwrap(),
        ..CancelConfig::default()
    }
}

/// A market with `count` open orders, suspended (its tasks materialised in the request when
/// they fit one chunk). Returns the market, the batch and the order ids.
async fn suspended_market(
    env: &TestEnv,
    services: &Services,
    symbol: &str,
    count: usize,
) -> (u64, u64, Vec<u64>) {
    let market_id = market(&env.db, symbol).await;
    let orders = open_orders(&env.db, market_id, count).await;
    let suspended = suspension::suspend(
        &services.outbox,
        symbol,
        None,
        &Plan::default(),
        &paybus_testkit::person("tests"),
    )
    .await
    .unwrap();
    (market_id, suspended.batch_id, orders)
}

async fn task_ids(pool: &MySqlPool, batch_id: u64) -> Vec<u64> {
    sqlx::query_scalar("SELECT id FROM tasks WHERE batch_id = ? ORDER BY id")
        .bind(batch_id)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn handle(
    handler: &CancelOrders,
    services: &Services,
    batch_id: u64,
    task_ids: &[u64],
    attempt: u32,
) -> Outcome {
    let ctx = Context {
        db: &services.outbox,
        attempt,
    };
    handler
        .handle(
            Envelope::new(CancelTasksCreated {
                batch_id,
                task_ids: task_ids.to_vec(),
            }),
            &ctx,
        )
        .await
        .unwrap()
}

#[derive(Debug, sqlx::FromRow)]
struct TaskRow {
    state: String,
    attempts: u32,
    last_error: Option<String>,
}

async fn task_of_order(pool: &MySqlPool, order_id: u64) -> TaskRow {
    sqlx::query_as("SELECT state, attempts, last_error FROM tasks WHERE target_id = ?")
        .bind(order_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn tasks_in(pool: &MySqlPool, batch_id: u64, state: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM tasks WHERE batch_id = ? AND state = ?")
        .bind(batch_id)
        .bind(state)
        .fetch_one(pool)
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// One message

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_open_orders_is_cancelled_and_its_tasks_done_in_one_go() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let (market_id, batch_id, orders) = suspended_market(&env, &services, "BTC", 5).await;
    let tasks = task_ids(&env.db, batch_id).await;

    let outcome = handle(
        &CancelOrders::new(short_retries()),
        &services,
        batch_id,
        &tasks,
        1,
    )
    .await;

    assert_eq!(outcome, Outcome::Done);
    assert_eq!(orders_in(&env.db, market_id, "CANCELLED").await, 5);
    for order_id in orders {
        let task = task_of_order(&env.db, order_id).await;
        assert_eq!((task.state.as_str(), task.attempts), ("DONE", 1));
    }
    let reason: String = sqlx::query_scalar("SELECT DISTINCT cancel_reason FROM orders")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(reason, "MARKET_SUSPENDED");
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_filled_meanwhile_is_skipped_with_the_reason_not_failed() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let (_, batch_id, orders) = suspended_market(&env, &services, "BTC", 3).await;
    // The matching engine's last trades land after the suspension: one full, one partial.
    let mut tx = env.db.begin().await.unwrap();
    paybus_markets::order::fill(&mut tx, orders[0], paybus_money::Amount::whole(1))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    sqlx::query(
        "UPDATE orders SET status = 'PARTIALLY_FILLED', filled_quantity = 0.5 WHERE id = ?",
    )
    .bind(orders[1])
    .execute(&env.db)
    .await
    .unwrap();

    let outcome = handle(
        &CancelOrders::new(short_retries()),
        &services,
        batch_id,
        &task_ids(&env.db, batch_id).await,
        1,
    )
    .await;

    assert_eq!(outcome, Outcome::Done);
    let filled = task_of_order(&env.db, orders[0]).await;
    assert_eq!(filled.state, "SKIPPED");
    assert_eq!(
        filled.last_error.as_deref(),
        Some(format!("order {} is already FILLED", orders[0]).as_str())
    );
    assert_eq!(task_of_order(&env.db, orders[1]).await.state, "DONE");
    assert_eq!(task_of_order(&env.db, orders[2]).await.state, "DONE");
    let progress = progress::of_symbol(&env.db, "BTC").await.unwrap();
    assert!(progress.complete, "{}", progress.summary);
    assert_eq!((progress.tasks.done, progress.tasks.skipped), (2, 1));
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_group_delivered_four_times_at_once_cancels_each_order_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let (market_id, batch_id, _) = suspended_market(&env, &services, "BTC", 16).await;
    let tasks = Arc::new(task_ids(&env.db, batch_id).await);
    let handler = CancelOrders::new(short_retries());
    let barrier = Arc::new(Barrier::new(4));

    let mut deliveries = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (handler, services, tasks, barrier) = (
            handler.clone(),
            services.clone(),
            tasks.clone(),
            barrier.clone(),
        );
        deliveries.spawn(async move {
            barrier.wait().await;
            handle(&handler, &services, batch_id, &tasks, 1).await
        });
    }
    let mut outcomes = Vec::new();
    while let Some(outcome) = deliveries.join_next().await {
        outcomes.push(outcome.unwrap());
    }

    assert!(outcomes.contains(&Outcome::Done), "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Done | Outcome::Skipped(_))),
        "{outcomes:?}"
    );
    assert_eq!(orders_in(&env.db, market_id, "CANCELLED").await, 16);
    assert_eq!(tasks_in(&env.db, batch_id, "DONE").await, 16);
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM tasks WHERE attempts <> 1").await,
        0,
        "every task claimed exactly once"
    );
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_order_fails_its_task_at_once_and_the_rest_of_the_group_completes() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let (market_id, batch_id, orders) = suspended_market(&env, &services, "BTC", 4).await;
    sqlx::query("DELETE FROM orders WHERE id = ?")
        .bind(orders[2])
        .execute(&env.db)
        .await
        .unwrap();

    let outcome = handle(
        &CancelOrders::new(short_retries()),
        &services,
        batch_id,
        &task_ids(&env.db, batch_id).await,
        1,
    )
    .await;

    let Outcome::Failed(reason) = outcome else {
        panic!("not a dead letter: {outcome:?}");
    };
    assert!(
        reason.contains(&format!("order {} does not exist", orders[2])),
        "{reason}"
    );
    let vanished = task_of_order(&env.db, orders[2]).await;
    assert_eq!((vanished.state.as_str(), vanished.attempts), ("FAILED", 1));
    assert_eq!(orders_in(&env.db, market_id, "CANCELLED").await, 3);
    let progress = progress::of_symbol(&env.db, "BTC").await.unwrap();
    assert!(progress.complete, "{}", progress.summary);
    assert!(
        progress.summary.contains("1 FAILED"),
        "{}",
        progress.summary
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_keeps_failing_is_retried_with_backoff_then_failed_while_the_rest_complete() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let (market_id, batch_id, orders) = suspended_market(&env, &services, "BTC", 4).await;
    refuse_cancels_of(&env.db, orders[1]).await;
    let clock = manual_clock(&env.db).await;
    let handler = CancelOrders::new(short_retries()).with_clock(clock.clone());
    let tasks = task_ids(&env.db, batch_id).await;

    let first = handle(&handler, &services, batch_id, &tasks, 1).await;
    assert!(
        matches!(first, Outcome::Retry { after, .. } if after == Duration::from_millis(100)),
        "{first:?}"
    );
    assert_eq!(
        orders_in(&env.db, market_id, "CANCELLED").await,
        3,
        "the others are done"
    );
    let refused = task_of_order(&env.db, orders[1]).await;
    assert_eq!((refused.state.as_str(), refused.attempts), ("PENDING", 1));
    assert!(
        refused
            .last_error
            .as_deref()
            .unwrap()
            .contains("order is locked by the matching engine"),
        "{refused:?}"
    );

    // Before its backoff is over, a duplicate finds nothing to do.
    let early = handle(&handler, &services, batch_id, &tasks, 1).await;
    assert!(matches!(early, Outcome::Skipped(_)), "{early:?}");
    assert_eq!(task_of_order(&env.db, orders[1]).await.attempts, 1);

    clock.advance(Duration::from_millis(100));
    let second = handle(&handler, &services, batch_id, &tasks, 1).await;
    assert!(
        matches!(second, Outcome::Retry { after, .. } if after == Duration::from_millis(200)),
        "{second:?}"
    );
    clock.advance(Duration::from_millis(200));
    let third = handle(&handler, &services, batch_id, &tasks, 1).await;

    let Outcome::Failed(reason) = third else {
        panic!("not a dead letter: {third:?}");
    };
    assert!(reason.contains("gave up after 3 attempts"), "{reason}");
    let refused = task_of_order(&env.db, orders[1]).await;
    assert_eq!((refused.state.as_str(), refused.attempts), ("FAILED", 3));
    let progress = progress::of_symbol(&env.db, "BTC").await.unwrap();
    assert!(!progress.complete);
    assert!(
        progress.summary.contains("needs attention"),
        "{}",
        progress.summary
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_naming_no_task_or_another_batchs_task_is_a_dead_letter() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let (_, batch_id, _) = suspended_market(&env, &services, "BTC", 1).await;
    let handler = CancelOrders::new(short_retries());

    let empty = handle(&handler, &services, batch_id, &[], 1).await;
    let foreign = handle(
        &handler,
        &services,
        batch_id + 1,
        &task_ids(&env.db, batch_id).await,
        1,
    )
    .await;

    assert!(
        matches!(&empty, Outcome::Failed(r) if r.contains("1 to 1000 tasks")),
        "{empty:?}"
    );
    assert!(
        matches!(&foreign, Outcome::Failed(r) if r.contains("is not a task of batch")),
        "{foreign:?}"
    );
    assert_eq!(
        tasks_in(&env.db, batch_id, "PENDING").await,
        1,
        "nothing touched"
    );
}

// ---------------------------------------------------------------------------------------------
// Materialisation and the sweep

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn materialisation_resumes_from_its_cursor_and_creates_each_task_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let market_id = market(&env.db, "ETH").await;
    open_orders(&env.db, market_id, 350).await;
    let plan = Plan {
        chunk: 100,
        in_request: 100,
        tasks_per_message: 16,
    };

    let suspended = suspension::suspend(
        &services.outbox,
        "ETH",
        None,
        &plan,
        &paybus_testkit::person("tests"),
    )
    .await
    .unwrap();
    assert_eq!(
        (suspended.tasks_created_now, suspended.materialised),
        (100, false)
    );
    let preparing = progress::of_symbol(&env.db, "ETH").await.unwrap();
    assert!(preparing.preparing && !preparing.complete);
    assert!(
        preparing
            .summary
            .starts_with("suspension preparing: 100 tasks created so far")
    );
    // One chunk, then the process "dies": another materialiser picks the batch up.
    let config = MaterialiserConfig {
        plan,
        ..MaterialiserConfig::default()
    };
    let chunk = Materialiser::new(services.outbox.clone(), config)
        .one_chunk()
        .await
        .unwrap()
        .unwrap();
    assert_eq!((chunk.created, chunk.finished), (100, false));
    let rest = Materialiser::new(services.outbox.clone(), config)
        .run_once()
        .await
        .unwrap();

    assert_eq!(rest, 150);
    let (created, distinct): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT target_id) FROM tasks WHERE batch_id = ?")
            .bind(suspended.batch_id)
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!((created, distinct), (350, 350));
    let progress = progress::of_symbol(&env.db, "ETH").await.unwrap();
    assert_eq!((progress.created, progress.preparing), (350, false));
    // Every task went out in a message of at most 16 (7 per chunk of 100, 4 for the last 50).
    let messages = scalar(
        &env.db,
        "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'market.cancel_tasks.created'",
    )
    .await;
    assert_eq!(messages, 7 + 7 + 7 + 4);
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_came_due_is_republished_in_its_batchs_message() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let (_, batch_id, orders) = suspended_market(&env, &services, "BTC", 2).await;
    refuse_cancels_of(&env.db, orders[0]).await;
    let clock = manual_clock(&env.db).await;
    let handler = CancelOrders::new(short_retries()).with_clock(clock.clone());
    let first = handle(
        &handler,
        &services,
        batch_id,
        &task_ids(&env.db, batch_id).await,
        1,
    )
    .await;
    assert!(matches!(first, Outcome::Retry { .. }), "{first:?}");
    let sweep = due_tasks(&services, DueSweepConfig::default()).with_clock(clock.clone());
    assert_eq!(sweep.run_once().await.unwrap(), 0, "not due yet");
    sqlx::query("DELETE FROM outbox_messages")
        .execute(&env.db)
        .await
        .unwrap();

    clock.advance(Duration::from_millis(100));
    let republished = sweep.run_once().await.unwrap();

    assert_eq!(republished, 1);
    let body: Vec<u8> = sqlx::query_scalar("SELECT body FROM outbox_messages")
        .fetch_one(&env.db)
        .await
        .unwrap();
    let envelope: Envelope<CancelTasksCreated> = serde_json_from(&body);
    let retried: u64 = sqlx::query_scalar("SELECT id FROM tasks WHERE target_id = ?")
        .bind(orders[0])
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(
        envelope.data,
        CancelTasksCreated {
            batch_id,
            task_ids: vec![retried]
        }
    );
}

fn serde_json_from(body: &[u8]) -> Envelope<CancelTasksCreated> {
    serde_json::from_slice(body).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The real binary, killed mid-run

/// The `cancel-orders` binary, pointed at the test's database and vhost.
fn spawn_binary(env: &TestEnv) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_cancel-orders"))
        .envs(env.env_vars())
        .env("PAYBUS_PREFETCH", "8")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_killed_mid_run_resumes_when_restarted_and_cancels_nothing_twice() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let market_id = market(&env.db, "BTC").await;
    open_orders(&env.db, market_id, 6_000).await;
    // The materialiser and the relay run here; the consumer is the binary.
    let shutdown = CancellationToken::new();
    let mut jobs = Runner::new(services.clone());
    jobs.add_job(Arc::new(Materialiser::new(
        services.outbox.clone(),
        MaterialiserConfig {
            interval: Duration::from_millis(50),
            ..MaterialiserConfig::default()
        },
    )));
    let running_jobs = tokio::spawn(jobs.run(shutdown.clone()));
    let suspended = suspension::suspend(
        &services.outbox,
        "BTC",
        None,
        &Plan::default(),
        &paybus_testkit::person("tests"),
    )
    .await
    .unwrap();
    let batch_id = suspended.batch_id;

    let mut consumer = spawn_binary(&env);
    let started = eventually(Duration::from_secs(60), || async {
        tasks_in(&env.db, batch_id, "DONE").await >= 300
    })
    .await;
    consumer.kill().await.unwrap(); // SIGKILL: in-flight transactions die with the connection
    assert!(started, "the consumer did not start cancelling");
    let done_at_kill = tasks_in(&env.db, batch_id, "DONE").await;
    assert!(
        tasks_in(&env.db, batch_id, "PENDING").await > 0,
        "killed too late: {done_at_kill} done"
    );

    let mut consumer = spawn_binary(&env);
    let complete = eventually(Duration::from_secs(120), || async {
        progress::of_symbol(&env.db, "BTC").await.unwrap().complete
    })
    .await;
    consumer.kill().await.unwrap();
    shutdown.cancel();
    running_jobs.await.unwrap().unwrap();

    let progress = progress::of_symbol(&env.db, "BTC").await.unwrap();
    assert!(complete, "{}", progress.summary);
    assert_eq!((progress.created, progress.tasks.done), (6_000, 6_000));
    assert_eq!(orders_in(&env.db, market_id, "CANCELLED").await, 6_000);
    // A task claimed by a transaction that died was rolled back with it: every DONE task was
    // attempted once, and none found its order already cancelled.
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM tasks WHERE attempts <> 1").await,
        0
    );
    assert_eq!(progress.tasks.skipped, 0);
    assert_audit_clean(&env.db).await;
}
