//! The real `sweeper` binary as a scheduled Lambda: each EventBridge invocation runs every job
//! once and answers what each changed.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_bus::{Envelope, Handler};
use paybus_canary::{Canary, Ping};
use paybus_testkit::{
    TestEnv,
    lambda::{LambdaProcess, RuntimeApi},
    queue_depth,
};

const SCHEDULED_EVENT: &str = r#"{"version":"0","id":"53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa","detail-type":"Scheduled Event","source":"aws.events","account":"123456789012","time":"2026-01-05T09:30:00Z","region":"eu-central-1","resources":["arn:aws:events:eu-central-1:123456789012:rule/paybus-sweeper"],"detail":{}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_invocation_relays_what_the_outbox_left_behind() {
    let env = TestEnv::new().await;
    let services = env.services(&[Canary::queue()]).await;
    // A committed message whose publish-after-commit never happened (the producer crashed).
    let left = Envelope::new(Ping { ping_id: 1 }).to_outgoing().unwrap();
    sqlx::query(
        "INSERT INTO outbox_messages (message_id, routing_key, correlation_id, body, created_at) \
         VALUES (?, 'canary.ping', ?, ?, NOW(6) - INTERVAL 1 MINUTE)",
    )
    .bind(left.id.to_string())
    .bind(left.correlation_id.to_string())
    .bind(&left.body)
    .execute(&env.db)
    .await
    .unwrap();
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_sweeper"), &api, env.env_vars());

    let first = lambda.invoke(&mut api, SCHEDULED_EVENT).await.response();
    let second = lambda.invoke(&mut api, SCHEDULED_EVENT).await.response();

    assert_eq!(first["outbox-relay"], 1, "{first}");
    assert_eq!(second["outbox-relay"], 0, "published once: {second}");
    let channel = services.connection().create_channel().await.unwrap();
    assert_eq!(queue_depth(&channel, &Canary::queue().queue()).await, 1);
}
