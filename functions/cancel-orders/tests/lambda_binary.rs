//! The real `cancel-orders` binary as AWS Lambda runs it: an Amazon MQ batch with a duplicate
//! and malformed messages through a local Runtime API, twice (Amazon MQ's replay).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_bus::{Envelope, Handler, Message};
use paybus_cancel_orders::CancelOrders;
use paybus_markets::{CancelTasksCreated, materialise::Plan, suspension};
use paybus_testkit::{
    TestEnv,
    lambda::{LambdaProcess, MqEvent, RuntimeApi},
    markets::{assert_audit_clean, market, open_orders, orders_in},
    queue_depth, scalar,
};
use serde_json::json;

/// The cancel message of a suspended market's tasks (materialised by the suspension).
async fn suspended(
    env: &TestEnv,
    outbox: &paybus_bus::Outbox,
    symbol: &str,
) -> (u64, Envelope<CancelTasksCreated>) {
    let market_id = market(&env.db, symbol).await;
    open_orders(&env.db, market_id, 3).await;
    let suspended = suspension::suspend(
        outbox,
        symbol,
        None,
        &Plan::default(),
        &paybus_testkit::person("tests"),
    )
    .await
    .unwrap();
    let task_ids: Vec<u64> =
        sqlx::query_scalar("SELECT id FROM tasks WHERE batch_id = ? ORDER BY id")
            .bind(suspended.batch_id)
            .fetch_all(&env.db)
            .await
            .unwrap();
    assert_eq!(task_ids.len(), 3, "{symbol}: one task per open order");
    (
        market_id,
        Envelope::new(CancelTasksCreated {
            batch_id: suspended.batch_id,
            task_ids,
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_duplicate_and_malformed_messages_cancels_each_order_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let (btc, cancel_btc) = suspended(&env, &services.outbox, "BTC").await;
    let (eth, cancel_eth) = suspended(&env, &services.outbox, "ETH").await;
    let event = MqEvent::new("paybus.cancel-orders")
        .envelope(&cancel_btc)
        .envelope(&cancel_eth)
        .repeat_last()
        .raw("not-base64", "%%% not base64 %%%")
        .message(
            json!({"messageId": "not-an-envelope", "type": CancelTasksCreated::TYPE}),
            b"hello",
        );
    let mut api = RuntimeApi::start().await;
    let mut lambda =
        LambdaProcess::spawn(env!("CARGO_BIN_EXE_cancel-orders"), &api, env.env_vars());

    let answer = lambda.invoke(&mut api, event.json()).await.response();
    let replay = lambda.invoke(&mut api, event.json()).await.response();

    let summary = json!({"processed": 5, "acked": 3, "dead_lettered": 2});
    assert_eq!(answer, summary);
    assert_eq!(replay, summary);
    for market_id in [btc, eth] {
        assert_eq!(orders_in(&env.db, market_id, "CANCELLED").await, 3);
    }
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM tasks WHERE state <> 'DONE' OR attempts <> 1"
        )
        .await,
        0,
        "every task done, claimed exactly once"
    );
    let channel = services.connection().create_channel().await.unwrap();
    assert_eq!(
        queue_depth(&channel, &CancelOrders::queue().dead_letter_queue()).await,
        4,
        "each malformed message dead-lettered by each run (the recorder keeps one row per id)"
    );
    assert_audit_clean(&env.db).await;
}
