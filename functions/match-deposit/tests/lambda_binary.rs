//! The real `match-deposit` binary as AWS Lambda runs it, against a stub quote service
//! (wiremock): an Amazon MQ batch with a duplicate and malformed messages through a local
//! Runtime API, twice (Amazon MQ's replay).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_bus::{Envelope, Handler, Message};
use paybus_match_deposit::MatchDeposit;
use paybus_p2p::{DepositOrderCreated, FillPolicy, Handoff, Matcher};
use paybus_testkit::{
    TestEnv,
    lambda::{LambdaProcess, MqEvent, RuntimeApi},
    p2p::{self, QuoteStub, assert_audit_clean, order_state},
    queue_depth, scalar,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_duplicate_and_malformed_messages_matches_each_order_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[MatchDeposit::queue()]).await;
    let stub = QuoteStub::start().await;
    let buyer = p2p::partner(&env.db, "buyer partner").await;
    let seller_partner = p2p::partner(&env.db, "seller partner").await;
    p2p::seller(&env.db, seller_partner, "100").await;
    let matcher = Matcher::new(
        services.outbox.clone(),
        p2p::config(&stub, FillPolicy::FillOrCancel, 5),
    )
    .unwrap();
    let mut orders = Vec::new();
    for amount in ["40", "30"] {
        let order = matcher
            .create(&p2p::buyer(buyer, amount), Handoff::Queued)
            .await
            .unwrap();
        orders.push(order.id());
    }
    let created = |deposit_order_id| Envelope::new(DepositOrderCreated { deposit_order_id });
    let event = MqEvent::new("paybus.match-deposit")
        .envelope(&created(orders[0]))
        .envelope(&created(orders[1]))
        .repeat_last()
        .raw("not-base64", "%%% not base64 %%%")
        .message(
            json!({"messageId": "not-an-envelope", "type": DepositOrderCreated::TYPE}),
            b"hello",
        );
    let mut vars = env.env_vars();
    vars.insert("PAYBUS_QUOTE_URL".to_owned(), stub.url());
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_match-deposit"), &api, vars);

    let answer = lambda.invoke(&mut api, event.json()).await.response();
    let replay = lambda.invoke(&mut api, event.json()).await.response();

    let summary = json!({"processed": 5, "acked": 3, "dead_lettered": 2});
    assert_eq!(answer, summary);
    assert_eq!(replay, summary);
    for &id in &orders {
        // Its last_error says why, when an attempt did not match it (seen once in a full
        // suite run on a loaded machine, never alone).
        let last_error: Option<String> =
            sqlx::query_scalar("SELECT last_error FROM p2p_deposit_orders WHERE id = ?")
                .bind(id)
                .fetch_one(&env.db)
                .await
                .unwrap();
        assert_eq!(
            order_state(&env.db, id).await,
            ("MATCHED".to_owned(), Some("FILLED".to_owned()), 0),
            "order {id}: last error {last_error:?}"
        );
    }
    let trades = stub.trades();
    assert_eq!(trades.len(), 2, "one trade per order: {trades:?}");
    assert!(
        trades.values().all(|trade| trade.requests == 1),
        "no trade requested twice: {trades:?}"
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT CAST(remaining_amount AS CHAR) = '30.000000000000000000' FROM p2p_withdraw_orders"
        )
        .await,
        1,
        "the seller gave 70 of its 100, once"
    );
    let channel = services.connection().create_channel().await.unwrap();
    assert_eq!(
        queue_depth(&channel, &MatchDeposit::queue().dead_letter_queue()).await,
        4,
        "each malformed message dead-lettered by each run (the recorder keeps one row per id)"
    );
    assert_audit_clean(&env.db).await;
}
