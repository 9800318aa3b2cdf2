//! The real `migrate` binary behind a CloudFormation custom resource: CloudFormation's request
//! arrives as the Lambda event, the answer goes to its `ResponseURL` (a local server here), and
//! whatever happens, CloudFormation gets an answer.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::sync::Arc;

use axum::{Router, body::Bytes, extract::State, http::StatusCode, routing::put};
use paybus_platform::{
    db::MIGRATOR,
    testing::{
        TestEnv,
        lambda::{LambdaProcess, RuntimeApi},
        queue_depth, services_on,
    },
};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Where CloudFormation would wait for the answer (a presigned S3 URL in AWS).
struct ResponseUrl {
    url: String,
    answers: mpsc::UnboundedReceiver<Value>,
}

impl ResponseUrl {
    async fn start() -> Self {
        let (tx, answers) = mpsc::unbounded_channel();
        let app = Router::new()
            .route(
                "/cfn-response",
                put(
                    |State(tx): State<Arc<mpsc::UnboundedSender<Value>>>, body: Bytes| async move {
                        let _ = tx.send(serde_json::from_slice(&body).unwrap_or(Value::Null));
                        StatusCode::OK
                    },
                ),
            )
            .with_state(Arc::new(tx));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/cfn-response?X-Amz-Signature=abc",
            listener.local_addr().unwrap()
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, answers }
    }

    fn request(&self, request_type: &str, version: &str, old_version: Option<&str>) -> String {
        let mut request = json!({
            "RequestType": request_type,
            "ServiceToken": "arn:aws:lambda:eu-central-1:123456789012:function:paybus-MigrateFunction",
            "ResponseURL": self.url,
            "StackId": "arn:aws:cloudformation:eu-central-1:123456789012:stack/paybus/5b3bd4e0",
            "RequestId": format!("{request_type}-request"),
            "ResourceType": "Custom::PaybusMigration",
            "LogicalResourceId": "Migration",
            "ResourceProperties": {"ServiceToken": "arn:aws:lambda:...", "Version": version},
        });
        if request_type != "Create" {
            request["PhysicalResourceId"] = json!("paybus-migration");
        }
        if let Some(old) = old_version {
            request["OldResourceProperties"] =
                json!({"ServiceToken": "arn:aws:lambda:...", "Version": old});
        }
        request.to_string()
    }

    async fn answer(&mut self) -> Value {
        tokio::time::timeout(std::time::Duration::from_secs(30), self.answers.recv())
            .await
            .expect("CloudFormation is answered")
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_custom_resource_migrates_declares_the_queues_and_always_answers() {
    let env = TestEnv::unmigrated().await;
    let mut cloudformation = ResponseUrl::start().await;
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_migrate"), &api, env.env_vars());

    lambda
        .invoke(&mut api, cloudformation.request("Create", "1", None))
        .await
        .response();
    let created = cloudformation.answer().await;
    lambda
        .invoke(&mut api, cloudformation.request("Update", "1", Some("2")))
        .await
        .response();
    let rolled_back = cloudformation.answer().await;
    lambda
        .invoke(&mut api, cloudformation.request("Delete", "1", None))
        .await
        .response();
    let deleted = cloudformation.answer().await;

    assert_eq!(created["Status"], "SUCCESS", "{created}");
    assert_eq!(created["PhysicalResourceId"], "paybus-migration");
    assert_eq!(created["RequestId"], "Create-request");
    assert_eq!(created["LogicalResourceId"], "Migration");
    assert_eq!(
        created["Data"]["Migrations"],
        MIGRATOR.iter().count().to_string()
    );
    let applied: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(applied as usize, MIGRATOR.iter().count());
    let services = services_on(&env.settings, &[]).await;
    let channel = services.connection().create_channel().await.unwrap();
    for function in paybus_catalog::queues() {
        // A passive declare fails (and panics) for a queue that does not exist.
        queue_depth(&channel, &function.dead_letter_queue()).await;
    }
    assert_eq!(rolled_back["Status"], "SUCCESS", "{rolled_back}");
    assert!(
        rolled_back["Reason"].as_str().unwrap().contains("rollback"),
        "{rolled_back}"
    );
    assert_eq!(deleted["Status"], "SUCCESS", "{deleted}");
    assert_eq!(
        paybus_platform::testing::scalar(&env.db, "SELECT COUNT(*) FROM _sqlx_migrations").await
            as usize,
        MIGRATOR.iter().count(),
        "deleting the stack touched nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_a_failed_answer_with_the_reason_not_silence() {
    let env = TestEnv::unmigrated().await;
    let mut cloudformation = ResponseUrl::start().await;
    let mut vars = env.env_vars();
    vars.insert(
        "PAYBUS_DATABASE_URL".to_owned(),
        format!(
            "mysql://root:hunter2@127.0.0.1:{}/paybus",
            paybus_platform::testing::free_port()
        ),
    );
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_migrate"), &api, vars);

    lambda
        .invoke(&mut api, cloudformation.request("Create", "1", None))
        .await
        .response();
    let failed = cloudformation.answer().await;

    assert_eq!(failed["Status"], "FAILED", "{failed}");
    let reason = failed["Reason"].as_str().unwrap();
    assert!(reason.contains("cannot reach the database"), "{reason}");
    assert!(
        !reason.contains("hunter2"),
        "no password in CloudFormation's events: {reason}"
    );
}
