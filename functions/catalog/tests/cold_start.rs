//! Cold start of every Lambda binary of the template, as Lambda starts it: process start to
//! the first `GET /next` on a local Runtime API (the init: settings and the database pool; the
//! broker connection only started), then the first invocation (its first event to its answer,
//! including the wait for the broker connection).
//!
//! A measurement, not a test of time: it is ignored by default and reads release binaries
//! from `PAYBUS_LAMBDA_BIN_DIR`:
//! `cargo build --release --bins && PAYBUS_LAMBDA_BIN_DIR=$CARGO_TARGET_DIR/release cargo nextest run -p paybus-catalog --run-ignored only -E 'test(cold_start)' --no-capture`
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::{path::PathBuf, time::Duration};

use paybus_bus::topology::dead_letter_queue_name;
use paybus_catalog::{FUNCTIONS, queues, sam};
use paybus_testkit::{
    TestEnv,
    lambda::{Answer, LambdaProcess, MqEvent, RuntimeApi, header_text},
};
use serde_json::json;

const SCHEDULED_EVENT: &str = r#"{"version":"0","id":"53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa","detail-type":"Scheduled Event","source":"aws.events","account":"123456789012","time":"2026-01-05T09:30:00Z","region":"eu-central-1","resources":[],"detail":{}}"#;

/// The first event each binary gets: one message for a consumer (a body that is no
/// envelope: decoded, dead-lettered and confirmed), one dead letter to record, one schedule,
/// one `GET /health`. `migrate` answers CloudFormation and is not measured here.
fn first_event(binary: &str) -> Option<String> {
    if let Some(function) = FUNCTIONS.iter().find(|f| f.name == binary) {
        return Some(
            MqEvent::new(&function.queue.queue())
                .message(
                    json!({"messageId": "cold-1", "type": function.queue.routing_key}),
                    b"{}",
                )
                .json(),
        );
    }
    match binary {
        "dead-letters" => Some(
            MqEvent::new(&dead_letter_queue_name(FUNCTIONS[0].name))
                .message(
                    json!({"messageId": "cold-1", "headers": {"x-first-death-reason": header_text("delivery_limit")}}),
                    b"{}",
                )
                .json(),
        ),
        "sweeper" => Some(SCHEDULED_EVENT.to_owned()),
        "api" => Some(
            json!({
                "version": "2.0", "routeKey": "$default", "rawPath": "/health", "rawQueryString": "",
                "headers": {"host": "abc123.execute-api.eu-central-1.amazonaws.com"},
                "requestContext": {
                    "accountId": "123456789012", "apiId": "abc123", "domainName": "abc123.execute-api.eu-central-1.amazonaws.com",
                    "domainPrefix": "abc123", "requestId": "r-1", "routeKey": "$default", "stage": "$default",
                    "time": "05/Jan/2026:09:30:00 +0000", "timeEpoch": 1767605400000u64,
                    "http": {"method": "GET", "path": "/health", "protocol": "HTTP/1.1", "sourceIp": "203.0.113.7", "userAgent": "cold"}
                },
                "isBase64Encoded": false
            })
            .to_string(),
        ),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: needs release binaries in PAYBUS_LAMBDA_BIN_DIR"]
async fn cold_start() {
    let dir = PathBuf::from(std::env::var("PAYBUS_LAMBDA_BIN_DIR").expect("PAYBUS_LAMBDA_BIN_DIR"));
    let env = TestEnv::new().await;
    let _services = env.services(&queues(&Default::default())).await;
    println!("{:<20} {:>12} {:>18}", "binary", "init", "first invocation");
    for lambda in sam::deployables() {
        let Some(event) = first_event(lambda.binary) else {
            continue;
        };
        let binary = dir.join(lambda.binary);
        let mut api = RuntimeApi::start().await;
        let mut process = LambdaProcess::spawn(binary.to_str().unwrap(), &api, env.env_vars());
        let first_next = api.next_call(Duration::from_secs(30)).await;
        let init = first_next.duration_since(process.spawned);
        let queued = std::time::Instant::now();
        let answer = process.invoke(&mut api, event).await;
        let first = queued.elapsed();
        assert!(
            matches!(answer, Answer::Response(_)),
            "{}: {answer:?}",
            lambda.binary
        );
        println!("{:<20} {:>12.1?} {:>18.1?}", lambda.binary, init, first);
    }
}
