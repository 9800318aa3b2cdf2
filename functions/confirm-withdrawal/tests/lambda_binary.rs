//! The real `confirm-withdrawal` binary as AWS Lambda runs it: Amazon MQ events through a
//! local Runtime API, against the test's own database and vhost (for the outage, through a
//! relay the test cuts).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_confirm_withdrawal::{ConfirmWithdrawal, WithdrawalTxConfirmed};
use paybus_confirmations::testing::{BROADCAST_TX, assert_audit_clean, withdrawal};
use paybus_partners::{NotificationCreated, testing::partner};
use paybus_platform::{
    bus::{Envelope, Handler, Message},
    testing::{
        TestEnv,
        lambda::{LambdaProcess, MqEvent, RuntimeApi},
        queue_depth, tap,
    },
};
use serde_json::json;
use sqlx::MySqlPool;

const BINARY: &str = env!("CARGO_BIN_EXE_confirm-withdrawal");

fn confirmation(withdrawal_id: u64) -> Envelope<WithdrawalTxConfirmed> {
    Envelope::new(WithdrawalTxConfirmed {
        withdrawal_id,
        tx_hash: BROADCAST_TX.to_owned(),
    })
}

/// (keyed DEBITs, notifications) of a withdrawal.
async fn effects(pool: &MySqlPool, withdrawal_id: u64) -> (i64, i64) {
    let debits: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger_entries WHERE idem_key = ?")
        .bind(format!("WDR_CONFIRM:{withdrawal_id}"))
        .fetch_one(pool)
        .await
        .unwrap();
    let notifications: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM partner_notifications WHERE reference_id = ? AND event = 'WITHDRAWAL_CONFIRMED'",
    )
    .bind(withdrawal_id)
    .fetch_one(pool)
    .await
    .unwrap();
    (debits, notifications)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_duplicate_and_malformed_messages_applies_each_confirmation_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[ConfirmWithdrawal::queue()]).await;
    tap(&services, "test.notifications", NotificationCreated::TYPE).await;
    let partner_id = partner(&env.db, "acme", Some("http://127.0.0.1:9/webhook")).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            withdrawal(
                &env.db,
                partner_id,
                "NORMAL".parse().unwrap(),
                "BROADCASTING".parse().unwrap(),
                "100",
            )
            .await,
        );
    }
    let event = MqEvent::new("paybus.confirm-withdrawal")
        .envelope(&confirmation(ids[0]))
        .envelope(&confirmation(ids[1]))
        .repeat_last()
        .envelope(&confirmation(ids[2]))
        .raw("not-base64", "%%% not base64 %%%")
        .message(
            json!({"messageId": "not-an-envelope", "type": WithdrawalTxConfirmed::TYPE}),
            b"hello",
        );
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(BINARY, &api, env.env_vars());

    let first = lambda.invoke(&mut api, event.json()).await.response();
    // Amazon MQ delivers the whole batch again after any failed invocation: nothing changes.
    let replay = lambda.invoke(&mut api, event.json()).await.response();

    let summary = json!({"processed": 6, "acked": 4, "dead_lettered": 2});
    assert_eq!(first, summary);
    assert_eq!(replay, summary);
    for &id in &ids {
        assert_eq!(
            effects(&env.db, id).await,
            (1, 1),
            "withdrawal {id}: one DEBIT, one notification"
        );
    }
    let channel = services.connection().create_channel().await.unwrap();
    assert_eq!(
        queue_depth(&channel, &ConfirmWithdrawal::queue().dead_letter_queue()).await,
        4,
        "each malformed message dead-lettered by each run (the recorder keeps one row per id)"
    );
    assert_audit_clean(&env.db).await;
    assert!(
        lambda.is_running(),
        "the environment lives on between invocations"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_fails_the_invocation_and_the_replayed_batch_applies_each_effect_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[ConfirmWithdrawal::queue()]).await;
    tap(&services, "test.notifications", NotificationCreated::TYPE).await;
    let partner_id = partner(&env.db, "acme", Some("http://127.0.0.1:9/webhook")).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            withdrawal(
                &env.db,
                partner_id,
                "NORMAL".parse().unwrap(),
                "BROADCASTING".parse().unwrap(),
                "100",
            )
            .await,
        );
    }
    let mut api = RuntimeApi::start().await;
    let (mut lambda, database) = LambdaProcess::spawn_behind_relay(BINARY, &mut api, &env).await;
    let before = MqEvent::new("paybus.confirm-withdrawal").envelope(&confirmation(ids[0]));
    lambda.invoke(&mut api, before.json()).await.response();

    let batch = MqEvent::new("paybus.confirm-withdrawal")
        .envelope(&confirmation(ids[0]))
        .envelope(&confirmation(ids[1]))
        .envelope(&confirmation(ids[2]))
        .raw("not-base64", "%%%");
    let (failed, replayed) = lambda
        .invoke_during_and_after_outage(&mut api, &database, &batch.json())
        .await;

    assert!(
        failed["errorMessage"]
            .as_str()
            .unwrap()
            .contains("3 of 4 messages"),
        "the malformed one was settled anyway: {failed}"
    );
    assert_eq!(
        replayed,
        json!({"processed": 4, "acked": 3, "dead_lettered": 1})
    );
    for &id in &ids {
        assert_eq!(effects(&env.db, id).await, (1, 1), "withdrawal {id}");
    }
    assert_audit_clean(&env.db).await;
}
