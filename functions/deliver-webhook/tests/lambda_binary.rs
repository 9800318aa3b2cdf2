//! The real `deliver-webhook` binary as AWS Lambda runs it: an Amazon MQ batch of
//! `partner.notification.created` with a duplicate and a malformed message; the partner (a
//! real HTTP server) gets each webhook once, however often the batch is delivered.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_bus::{Envelope, Handler};
use paybus_deliver_webhook::DeliverWebhook;
use paybus_partners::notifications::{NewNotification, NotificationCreated, enqueue};
use paybus_testkit::{
    TestEnv,
    lambda::{LambdaProcess, MqEvent, RuntimeApi},
    partners::partner,
};
use serde_json::json;
use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_duplicate_posts_each_webhook_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let endpoint = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&endpoint)
        .await;
    let partner_id = partner(
        &env.db,
        "acme",
        Some(&format!("{}/webhook", endpoint.uri())),
    )
    .await;
    let mut ids = Vec::new();
    for reference_id in [7u64, 8] {
        let payload = json!({"event": "WITHDRAWAL_CONFIRMED", "withdrawal_id": reference_id});
        let mut uow = services.outbox.begin().await.unwrap();
        let notification = NewNotification {
            partner_id,
            event: "WITHDRAWAL_CONFIRMED",
            reference_type: "WITHDRAWAL",
            reference_id,
            payload: &payload,
        };
        ids.push(
            enqueue(&mut uow, &notification, uuid::Uuid::new_v4())
                .await
                .unwrap()
                .unwrap(),
        );
        uow.commit().await.unwrap();
    }
    let created = |notification_id| Envelope::new(NotificationCreated { notification_id });
    let event = MqEvent::new("paybus.deliver-webhook")
        .envelope(&created(ids[0]))
        .envelope(&created(ids[1]))
        .repeat_last()
        .raw("not-base64", "%%% not base64 %%%");
    let mut api = RuntimeApi::start().await;
    let mut lambda =
        LambdaProcess::spawn(env!("CARGO_BIN_EXE_deliver-webhook"), &api, env.env_vars());

    let answer = lambda.invoke(&mut api, event.json()).await.response();
    let replay = lambda.invoke(&mut api, event.json()).await.response();

    let summary = json!({"processed": 4, "acked": 3, "dead_lettered": 1});
    assert_eq!(answer, summary);
    assert_eq!(replay, summary);
    assert_eq!(
        endpoint.received_requests().await.unwrap().len(),
        2,
        "one POST per notification"
    );
    let delivered = paybus_testkit::scalar(
        &env.db,
        "SELECT COUNT(*) FROM partner_notifications WHERE status = 'DELIVERED'",
    )
    .await;
    assert_eq!(delivered, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_fails_the_invocation_and_the_replay_posts_each_webhook_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let endpoint = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&endpoint)
        .await;
    let partner_id = partner(
        &env.db,
        "acme",
        Some(&format!("{}/webhook", endpoint.uri())),
    )
    .await;
    let payload = json!({"event": "WITHDRAWAL_CONFIRMED", "withdrawal_id": 7});
    let mut uow = services.outbox.begin().await.unwrap();
    let notification = NewNotification {
        partner_id,
        event: "WITHDRAWAL_CONFIRMED",
        reference_type: "WITHDRAWAL",
        reference_id: 7,
        payload: &payload,
    };
    let id = enqueue(&mut uow, &notification, uuid::Uuid::new_v4())
        .await
        .unwrap()
        .unwrap();
    uow.commit().await.unwrap();
    let batch = MqEvent::new("paybus.deliver-webhook")
        .envelope(&Envelope::new(NotificationCreated {
            notification_id: id,
        }))
        .repeat_last();
    let mut api = RuntimeApi::start().await;
    let (mut lambda, database) =
        LambdaProcess::spawn_behind_relay(env!("CARGO_BIN_EXE_deliver-webhook"), &mut api, &env)
            .await;

    let (_, replayed) = lambda
        .invoke_during_and_after_outage(&mut api, &database, &batch.json())
        .await;

    assert_eq!(
        replayed,
        json!({"processed": 2, "acked": 2, "dead_lettered": 0})
    );
    assert_eq!(
        endpoint.received_requests().await.unwrap().len(),
        1,
        "one POST, after the outage"
    );
}
