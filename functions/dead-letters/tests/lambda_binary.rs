//! The real `dead-letters` binary as the recorder Lambda: an event from a dead-letter queue
//! (and one from `paybus.unrouted`) becomes one `dead_letters` row per dead letter, however
//! often Amazon MQ delivers the batch.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_testkit::{
    TestEnv,
    lambda::{LambdaProcess, MqEvent, RuntimeApi, header_text},
};
use serde_json::json;

/// What paybus itself dead-letters: the `x-paybus-*` headers of a `Failed` outcome.
fn failed(id: &str, error: &str) -> serde_json::Value {
    json!({
        "messageId": id,
        "type": "withdrawal.tx_confirmed",
        "headers": {
            "x-paybus-function": header_text("confirm-withdrawal"),
            "x-paybus-reason": header_text("failed"),
            "x-paybus-error": header_text(error),
            "x-paybus-attempts": 1,
            "x-paybus-failed-at": header_text("2026-01-05T09:30:00.000000Z"),
            "x-paybus-routing-key": header_text("withdrawal.tx_confirmed"),
            "x-paybus-dead-letter-id": header_text(&format!("confirm-withdrawal:{id}:failed")),
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_recorded_once_however_often_the_batch_is_replayed() {
    let env = TestEnv::new().await;
    let dead_letters = MqEvent::new("paybus.confirm-withdrawal.dlq")
        .message(failed("m-1", "withdrawal 7 is FAILED"), br#"{"id":"m-1"}"#)
        .message(
            failed("m-2", "withdrawal 8 is REQUESTED"),
            br#"{"id":"m-2"}"#,
        )
        // Dead-lettered by the broker itself: the delivery limit, no paybus headers.
        .message(
            json!({
                "messageId": "m-3",
                "headers": {
                    "x-first-death-reason": header_text("delivery_limit"),
                    "x-death": [{
                        "count": 20,
                        "reason": header_text("delivery_limit"),
                        "queue": header_text("paybus.confirm-withdrawal"),
                        "routing-keys": [header_text("withdrawal.tx_confirmed")],
                    }],
                },
            }),
            br#"{"id":"m-3"}"#,
        )
        .raw("m-4", "%%% not base64 %%%");
    let unrouted = MqEvent::new("paybus.unrouted").message(
        json!({"messageId": "m-5", "type": "nobody.listens"}),
        br#"{"id":"m-5","type":"nobody.listens"}"#,
    );
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_dead-letters"), &api, env.env_vars());

    let answers = [
        lambda
            .invoke(&mut api, dead_letters.json())
            .await
            .response(),
        lambda
            .invoke(&mut api, dead_letters.json())
            .await
            .response(),
        lambda.invoke(&mut api, unrouted.json()).await.response(),
        lambda.invoke(&mut api, unrouted.json()).await.response(),
    ];

    assert_eq!(
        answers.map(|a| a["processed"].clone()),
        [json!(4), json!(4), json!(1), json!(1)]
    );
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT COALESCE(message_id, ''), function_name, reason, routing_key FROM dead_letters ORDER BY message_id",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    let row = |id: &str, function: &str, reason: &str, key: &str| {
        (
            id.to_owned(),
            function.to_owned(),
            reason.to_owned(),
            key.to_owned(),
        )
    };
    assert_eq!(
        rows,
        [
            row(
                "m-1",
                "confirm-withdrawal",
                "failed",
                "withdrawal.tx_confirmed"
            ),
            row(
                "m-2",
                "confirm-withdrawal",
                "failed",
                "withdrawal.tx_confirmed"
            ),
            row(
                "m-3",
                "confirm-withdrawal",
                "delivery_limit",
                "withdrawal.tx_confirmed"
            ),
            row("m-4", "confirm-withdrawal", "broker", ""),
            row("m-5", "unrouted", "unroutable", "nobody.listens"),
        ]
    );
    let raw: Vec<u8> = sqlx::query_scalar("SELECT body FROM dead_letters WHERE message_id = 'm-4'")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(
        raw, b"%%% not base64 %%%",
        "kept as it arrived, for ops to see"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_fails_the_invocation_and_the_replay_records_each_dead_letter_once() {
    let env = TestEnv::new().await;
    let batch = MqEvent::new("paybus.confirm-withdrawal.dlq")
        .message(failed("m-1", "withdrawal 7 is FAILED"), br#"{"id":"m-1"}"#)
        .message(
            failed("m-2", "withdrawal 8 is REQUESTED"),
            br#"{"id":"m-2"}"#,
        );
    let mut api = RuntimeApi::start().await;
    let (mut lambda, database) =
        LambdaProcess::spawn_behind_relay(env!("CARGO_BIN_EXE_dead-letters"), &mut api, &env).await;

    let (_, replayed) = lambda
        .invoke_during_and_after_outage(&mut api, &database, &batch.json())
        .await;
    let again = lambda.invoke(&mut api, batch.json()).await.response();

    assert_eq!(
        replayed,
        json!({"processed": 2, "acked": 2, "dead_lettered": 0})
    );
    assert_eq!(again, replayed);
    let recorded: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM dead_letters")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(recorded, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_from_a_queue_that_is_no_dead_letter_queue_is_refused_untouched() {
    // A recorder trigger wired to a function's own queue (or to a queue of no catalog
    // function): recording those messages would acknowledge work nobody did.
    let env = TestEnv::new().await;
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_dead-letters"), &api, env.env_vars());

    let mut refused = Vec::new();
    for queue in ["paybus.confirm-withdrawal", "paybus.no-such-function.dlq"] {
        let event = MqEvent::new(queue).message(failed("m-1", "misrouted"), br#"{"id":"m-1"}"#);
        refused.push(lambda.invoke(&mut api, event.json()).await.error());
    }
    let accepted = lambda
        .invoke(
            &mut api,
            MqEvent::new("paybus.confirm-withdrawal.dlq")
                .message(failed("m-2", "withdrawal 7 is FAILED"), br#"{"id":"m-2"}"#)
                .json(),
        )
        .await
        .response();

    for (error, queue) in refused
        .iter()
        .zip(["paybus.confirm-withdrawal", "paybus.no-such-function.dlq"])
    {
        assert_eq!(error["errorType"], "paybus.WrongQueue", "{error}");
        assert!(
            error["errorMessage"].as_str().unwrap().contains(queue),
            "{error}"
        );
    }
    assert_eq!(accepted["processed"], 1);
    assert_eq!(
        paybus_testkit::scalar(&env.db, "SELECT COUNT(*) FROM dead_letters").await,
        1,
        "only the dead letter was recorded"
    );
}
