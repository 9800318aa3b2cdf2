//! The real `confirm-deposit` binary as AWS Lambda runs it: an Amazon MQ batch with a
//! duplicate and malformed messages through a local Runtime API, twice.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_bus::{Envelope, Handler, Message};
use paybus_confirm_deposit::ConfirmDeposit;
use paybus_confirmations::DepositTxConfirmed;
use paybus_partners::NotificationCreated;
use paybus_testkit::{
    TestEnv,
    confirmations::{assert_audit_clean, deposit},
    lambda::{LambdaProcess, MqEvent, RuntimeApi},
    partners::partner,
    tap,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_duplicate_and_a_malformed_message_credits_each_deposit_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[ConfirmDeposit::queue()]).await;
    tap(&services, "test.notifications", NotificationCreated::TYPE).await;
    let partner_id = partner(&env.db, "acme", Some("http://127.0.0.1:9/webhook")).await;
    let first = deposit(&env.db, partner_id, "DETECTED", "100", "1").await;
    let second = deposit(&env.db, partner_id, "DETECTED", "50", "0.5").await;
    let confirm = |deposit_id| Envelope::new(DepositTxConfirmed { deposit_id });
    let event = MqEvent::new("paybus.confirm-deposit")
        .envelope(&confirm(first))
        .envelope(&confirm(second))
        .repeat_last()
        .raw("not-base64", "%%% not base64 %%%");
    let mut api = RuntimeApi::start().await;
    let mut lambda =
        LambdaProcess::spawn(env!("CARGO_BIN_EXE_confirm-deposit"), &api, env.env_vars());

    let answer = lambda.invoke(&mut api, event.json()).await.response();
    let replay = lambda.invoke(&mut api, event.json()).await.response();

    let summary = json!({"processed": 4, "acked": 3, "dead_lettered": 1});
    assert_eq!(answer, summary);
    assert_eq!(replay, summary);
    for id in [first, second] {
        let keyed: Vec<String> = sqlx::query_scalar(
            "SELECT idem_key FROM ledger_entries WHERE idem_key IN (?, ?) ORDER BY idem_key",
        )
        .bind(format!("DEP_CREDIT:{id}"))
        .bind(format!("DEP_FEE:{id}"))
        .fetch_all(&env.db)
        .await
        .unwrap();
        assert_eq!(
            keyed,
            [format!("DEP_CREDIT:{id}"), format!("DEP_FEE:{id}")],
            "deposit {id}"
        );
    }
    // What the console charts: each invocation's tally is written before it answers (the
    // environment may be frozen after): two batches of two credits, one duplicate, one
    // unreadable message each.
    let (done, skipped, failed): (u64, u64, u64) = sqlx::query_as(
        "SELECT CAST(SUM(done) AS UNSIGNED), CAST(SUM(skipped) AS UNSIGNED), \
                CAST(SUM(failed) AS UNSIGNED) \
         FROM function_activity WHERE function_name = 'confirm-deposit'",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!((done, skipped, failed), (2, 4, 2));
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_fails_the_invocation_and_the_replay_credits_each_deposit_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[ConfirmDeposit::queue()]).await;
    tap(&services, "test.notifications", NotificationCreated::TYPE).await;
    let partner_id = partner(&env.db, "acme", Some("http://127.0.0.1:9/webhook")).await;
    let first = deposit(&env.db, partner_id, "DETECTED", "100", "1").await;
    let second = deposit(&env.db, partner_id, "DETECTED", "50", "0.5").await;
    let confirm = |deposit_id| Envelope::new(DepositTxConfirmed { deposit_id });
    let batch = MqEvent::new("paybus.confirm-deposit")
        .envelope(&confirm(first))
        .envelope(&confirm(second))
        .repeat_last();
    let mut api = RuntimeApi::start().await;
    let (mut lambda, database) =
        LambdaProcess::spawn_behind_relay(env!("CARGO_BIN_EXE_confirm-deposit"), &mut api, &env)
            .await;

    let (_, replayed) = lambda
        .invoke_during_and_after_outage(&mut api, &database, &batch.json())
        .await;

    assert_eq!(
        replayed,
        json!({"processed": 3, "acked": 3, "dead_lettered": 0})
    );
    let credits: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM ledger_entries WHERE idem_key IN (?, ?)")
            .bind(format!("DEP_CREDIT:{first}"))
            .bind(format!("DEP_CREDIT:{second}"))
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!(credits, 2, "one credit per deposit");
    assert_audit_clean(&env.db).await;
}
