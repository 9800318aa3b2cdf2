//! The real `api` binary as a Lambda behind an API Gateway HTTP API (payload 2.0): the same
//! router answers API Gateway events, and its secrets come from Secrets Manager through the
//! Parameters and Secrets extension (`PAYBUS_*_FROM`), never from plain variables.

use std::{collections::HashMap, time::Duration};

use paybus_api::{auth::issue, role::Role};
use paybus_testkit::{
    TestEnv,
    lambda::{LambdaProcess, RuntimeApi, SecretsExtension},
};
use serde_json::{Value, json};

const JWT_SECRET_ARN: &str =
    "arn:aws:secretsmanager:eu-central-1:123456789012:secret:paybus-admin-jwt-AbCdEf";
const MONITOR_SECRET_ARN: &str =
    "arn:aws:secretsmanager:eu-central-1:123456789012:secret:paybus-monitor-AbCdEf";
const JWT_SECRET: &str = "a-jwt-secret-of-at-least-32-characters!";
const MONITOR_SECRET: &str = "a-monitor-secret-0001";

/// An API Gateway HTTP API (payload format 2.0) request event.
fn request(method: &str, path: &str, headers: Value, body: Option<&str>) -> String {
    let mut headers = headers;
    headers["host"] = json!("abc123.execute-api.eu-central-1.amazonaws.com");
    json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abc123",
            "domainName": "abc123.execute-api.eu-central-1.amazonaws.com",
            "domainPrefix": "abc123",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "203.0.113.7",
                "userAgent": "test"
            },
            "requestId": "c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
            "routeKey": "$default",
            "stage": "$default",
            "time": "05/Jan/2026:09:30:00 +0000",
            "timeEpoch": 1767605400000u64
        },
        "body": body,
        "isBase64Encoded": false
    })
    .to_string()
}

/// (status, JSON body) of an API Gateway response.
fn answer(response: Value) -> (u64, Value) {
    let body = response["body"].as_str().unwrap_or_default();
    (
        response["statusCode"].as_u64().unwrap(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_binary_answers_api_gateway_events_with_secrets_from_secrets_manager() {
    let env = TestEnv::new().await;
    let _services = env.services(&[]).await;
    let extension = SecretsExtension::start(HashMap::from([
        (JWT_SECRET_ARN.to_owned(), JWT_SECRET.to_owned()),
        (MONITOR_SECRET_ARN.to_owned(), MONITOR_SECRET.to_owned()),
    ]))
    .await;
    let mut vars = env.env_vars();
    vars.extend(extension.vars());
    vars.insert(
        "PAYBUS_ADMIN_JWT_SECRET_FROM".to_owned(),
        JWT_SECRET_ARN.to_owned(),
    );
    vars.insert(
        "PAYBUS_CHAIN_MONITOR_SECRET_FROM".to_owned(),
        MONITOR_SECRET_ARN.to_owned(),
    );
    // The token below is a break-glass one: the deployment would sign people in with Cognito.
    vars.insert("PAYBUS_BREAK_GLASS".to_owned(), "true".to_owned());
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_api"), &api, vars);
    let token = issue(JWT_SECRET, "ops", &[Role::Admin], Duration::from_secs(600)).unwrap();
    let body = r#"{"withdrawal_id":1989,"tx_hash":"0xabc"}"#;
    let signature = paybus_config::signature::sign(
        MONITOR_SECRET.as_bytes(),
        chrono::Utc::now().timestamp(),
        body.as_bytes(),
    );

    let health = lambda
        .invoke(&mut api, request("GET", "/health", json!({}), None))
        .await;
    let anonymous = lambda
        .invoke(
            &mut api,
            request("GET", "/v1/admin/partners/1", json!({}), None),
        )
        .await;
    let admin = lambda
        .invoke(
            &mut api,
            request(
                "GET",
                "/v1/admin/partners/999",
                json!({"authorization": format!("Bearer {token}")}),
                None,
            ),
        )
        .await;
    let intake = lambda
        .invoke(
            &mut api,
            request(
                "POST",
                "/v1/chain-monitor/withdrawal-confirmations",
                json!({"content-type": "application/json", "x-paybus-signature": signature}),
                Some(body),
            ),
        )
        .await;

    let build = json!({"status": "ok", "version": env!("CARGO_PKG_VERSION"),
                       "commit": paybus_testkit::head_commit()});
    assert_eq!(answer(health.response()), (200, build));
    let (status, error) = answer(anonymous.response());
    assert_eq!(status, 401, "{error}");
    let (status, error) = answer(admin.response());
    assert_eq!(
        status, 404,
        "the token signed with the fetched secret is accepted: {error}"
    );
    let (status, accepted) = answer(intake.response());
    assert_eq!(status, 202, "{accepted}");
    assert_eq!(
        paybus_testkit::scalar(&env.db, "SELECT COUNT(*) FROM outbox_messages").await,
        1,
        "the confirmation went into the outbox"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_that_cannot_be_read_stops_the_start_naming_the_variable() {
    let env = TestEnv::new().await;
    let extension = SecretsExtension::start(HashMap::new()).await;
    let mut vars = env.env_vars();
    vars.extend(extension.vars());
    vars.insert(
        "PAYBUS_ADMIN_JWT_SECRET_FROM".to_owned(),
        JWT_SECRET_ARN.to_owned(),
    );
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_api"), &api, vars);

    let status = lambda.wait().await;

    assert_eq!(status, Some(1));
    let stderr = lambda.stderr();
    assert!(
        stderr.contains("cannot read PAYBUS_ADMIN_JWT_SECRET from arn:aws:secretsmanager"),
        "{stderr}"
    );
    // Lambda is told why, through the Runtime API, and nothing was served.
    let (from, answer) = api.answer(std::time::Duration::from_secs(5)).await;
    assert_eq!(from, "init");
    let paybus_testkit::lambda::Answer::InitError(error) = answer else {
        panic!("an init error, not {answer:?}");
    };
    assert_eq!(error["errorType"], "paybus.SecretUnavailable", "{error}");
    assert!(
        error["errorMessage"]
            .as_str()
            .unwrap()
            .contains("cannot read PAYBUS_ADMIN_JWT_SECRET"),
        "{error}"
    );
    assert!(api.no_answer(), "nothing was served");
}
