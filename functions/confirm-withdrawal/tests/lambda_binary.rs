//! The real `confirm-withdrawal` binary as AWS Lambda runs it: Amazon MQ events through a
//! local Runtime API, against the test's own database and vhost (for the outage, through a
//! relay the test cuts).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_bus::{Envelope, Handler, Message};
use paybus_confirm_withdrawal::ConfirmWithdrawal;
use paybus_confirmations::WithdrawalTxConfirmed;
use paybus_partners::NotificationCreated;
use paybus_testkit::{
    TestEnv,
    confirmations::{BROADCAST_TX, assert_audit_clean, withdrawal},
    lambda::{LambdaProcess, MqEvent, RuntimeApi},
    partners::partner,
    queue_depth, tap,
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

/// The same trace through the Lambda adapter: the message's `traceparent` header (as Amazon MQ
/// hands it over) parents the delivery's span, the invocation's X-Ray trace is linked, and the
/// spans are exported before the invocation answers (the environment may freeze right after).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lambda_delivery_continues_the_messages_trace_and_links_the_xray_trace() {
    use paybus_testkit::{lambda::header_text, otlp::OtlpReceiver};

    const SENT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const SENT_SPAN: &str = "b7ad6b7169203331";
    const RESENT_TRACE: &str = "1bf7651916cd43dd8448eb211c80319d";
    const RESENT_SPAN: &str = "c7ad6b7169203332";
    // What the local Runtime API sends as `Lambda-Runtime-Trace-Id`.
    let xray = (
        "5bef4de7ad49b0e87f6ef6c87fc2e700".to_owned(),
        "9a9197af755a6419".to_owned(),
    );
    let receiver = OtlpReceiver::start().await;
    let env = TestEnv::new().await;
    let services = env.services(&[ConfirmWithdrawal::queue()]).await;
    tap(&services, "test.notifications", NotificationCreated::TYPE).await;
    let partner_id = partner(&env.db, "acme", Some("http://127.0.0.1:9/webhook")).await;
    let id = withdrawal(
        &env.db,
        partner_id,
        "NORMAL".parse().unwrap(),
        "BROADCASTING".parse().unwrap(),
        "100",
    )
    .await;
    let message = |envelope: &Envelope<WithdrawalTxConfirmed>, headers: serde_json::Value| {
        MqEvent::new("paybus.confirm-withdrawal").message(
            json!({ "messageId": envelope.id.to_string(), "headers": headers }),
            &serde_json::to_vec(envelope).unwrap(),
        )
    };
    let first = message(
        &confirmation(id),
        json!({ "traceparent": header_text(&format!("00-{SENT_TRACE}-{SENT_SPAN}-01")) }),
    );
    // A duplicate's second delivery (the broker counted one before it).
    let redelivered = message(
        &confirmation(id),
        json!({
            "traceparent": header_text(&format!("00-{RESENT_TRACE}-{RESENT_SPAN}-01")),
            "x-delivery-count": 1,
        }),
    );
    let mut vars = env.env_vars();
    vars.extend(receiver.env_vars("confirm-withdrawal"));
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(BINARY, &api, vars);

    lambda.invoke(&mut api, first.json()).await.response();
    // No waiting: exported before the answer.
    let spans = receiver.spans();
    let deliveries: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "process confirm-withdrawal")
        .collect();
    assert_eq!(deliveries.len(), 1, "{spans:#?}");
    let delivery = deliveries[0];
    assert_eq!(
        (delivery.trace_id.as_str(), delivery.parent_span_id.as_str()),
        (SENT_TRACE, SENT_SPAN)
    );
    assert_eq!(delivery.attribute("outcome"), Some("done"));
    assert_eq!(delivery.service, "confirm-withdrawal");
    assert_eq!(
        delivery.links,
        std::slice::from_ref(&xray),
        "linked to the invocation's X-Ray trace"
    );
    let within_delivery = |name: &str| {
        spans.iter().any(|span| {
            let mut parent = span.parent_span_id.clone();
            while span.name == name && !parent.is_empty() {
                if parent == delivery.span_id {
                    return true;
                }
                parent = spans
                    .iter()
                    .find(|s| s.span_id == parent)
                    .map_or_else(String::new, |s| s.parent_span_id.clone());
            }
            false
        })
    };
    assert!(
        within_delivery("ledger.post_all") && within_delivery("transaction"),
        "{spans:#?}"
    );
    let notification: Option<String> = sqlx::query_scalar(
        "SELECT traceparent FROM outbox_messages WHERE routing_key = 'partner.notification.created'",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert!(
        notification.is_some_and(|t| t.starts_with(&format!("00-{SENT_TRACE}-"))),
        "the notification's outbox row continues the trace"
    );

    lambda.invoke(&mut api, redelivered.json()).await.response();
    let spans = receiver.spans();
    let again: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "process confirm-withdrawal" && s.span_id != delivery.span_id)
        .collect();
    assert_eq!(again.len(), 1, "{spans:#?}");
    let again = again[0];
    assert_eq!(again.attribute("outcome"), Some("skipped"));
    assert_eq!(again.attribute("attempt"), Some("2"));
    assert!(
        again.trace_id != RESENT_TRACE && again.trace_id != SENT_TRACE,
        "a redelivery is in a trace of its own (the invocation's): {again:#?}"
    );
    assert_eq!(
        again.links,
        [(RESENT_TRACE.to_owned(), RESENT_SPAN.to_owned()), xray],
        "linked to the message's trace, not parented"
    );
    assert_eq!(effects(&env.db, id).await, (1, 1));
}
