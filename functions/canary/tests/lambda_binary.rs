//! The real `canary` binary in Lambda mode, against a fake Lambda Runtime API (the HTTP
//! interface Lambda gives a custom runtime) and the test's own database and vhost.

use std::{
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use axum::{
    Router,
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    routing::{get, post},
};
use paybus_canary::Canary;
use paybus_platform::{
    bus::{Handler, Services},
    testing::TestEnv,
};
use tokio::sync::mpsc;

const PINGS_EVENT: &str = include_str!("fixtures/canary-pings-event.json");
const REQUEST_ID: &str = "8476a536-e9f4-11e8-9739-2dfe598c3fcd";

/// What the function posted back for an invocation.
#[derive(Debug)]
enum Posted {
    Response { request_id: String, body: Bytes },
    Error { request_id: String, body: Bytes },
}

struct Api {
    /// The one event to hand out; later `next` calls never return (as when no message waits).
    event: Mutex<Option<String>>,
    /// When the runtime asked for an event (the first one ends its cold start).
    next_calls: mpsc::UnboundedSender<Instant>,
    posted: mpsc::UnboundedSender<Posted>,
}

async fn next(State(api): State<Arc<Api>>) -> (HeaderMap, String) {
    let _ = api.next_calls.send(Instant::now());
    let event = api.event.lock().ok().and_then(|mut e| e.take());
    let Some(event) = event else {
        return std::future::pending().await;
    };
    let deadline = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis()
        + 60_000;
    let mut headers = HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        headers.insert(name, value.parse().expect("a valid header value"));
    };
    set("lambda-runtime-aws-request-id", REQUEST_ID.to_owned());
    set("lambda-runtime-deadline-ms", deadline.to_string());
    set(
        "lambda-runtime-invoked-function-arn",
        "arn:aws:lambda:eu-central-1:123456789012:function:canary".to_owned(),
    );
    set(
        "lambda-runtime-trace-id",
        "Root=1-5bef4de7-ad49b0e87f6ef6c87fc2e700;Parent=9a9197af755a6419;Sampled=1".to_owned(),
    );
    set("content-type", "application/json".to_owned());
    (headers, event)
}

async fn response(
    State(api): State<Arc<Api>>,
    Path(request_id): Path<String>,
    body: Bytes,
) -> StatusCode {
    let _ = api.posted.send(Posted::Response { request_id, body });
    StatusCode::ACCEPTED
}

async fn error(
    State(api): State<Arc<Api>>,
    Path(request_id): Path<String>,
    body: Bytes,
) -> StatusCode {
    let _ = api.posted.send(Posted::Error { request_id, body });
    StatusCode::ACCEPTED
}

async fn init_error(State(api): State<Arc<Api>>, body: Bytes) -> StatusCode {
    let _ = api.posted.send(Posted::Error {
        request_id: "init".to_owned(),
        body,
    });
    StatusCode::ACCEPTED
}

/// The binary's logs show with `TEST_LOG=1`, like the harness's own.
fn child_output() -> Stdio {
    if std::env::var_os("TEST_LOG").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    }
}

#[tokio::test]
async fn the_canary_binary_answers_a_lambda_invocation_and_pongs() {
    let env = TestEnv::new().await;
    for expected in 1..=2u64 {
        let id = sqlx::query("INSERT INTO canary_pings () VALUES ()")
            .execute(&env.db)
            .await
            .unwrap()
            .last_insert_id();
        assert_eq!(id, expected, "the fixture names pings 1 and 2");
    }
    // The deployment declares the topology; the Lambda does not.
    let services = Services::connect(env.settings.clone()).await.unwrap();
    services.declare_topology(&[Canary::queue()]).await.unwrap();

    let (next_calls_tx, mut next_calls) = mpsc::unbounded_channel();
    let (posted_tx, mut posted) = mpsc::unbounded_channel();
    let api = Arc::new(Api {
        event: Mutex::new(Some(PINGS_EVENT.to_owned())),
        next_calls: next_calls_tx,
        posted: posted_tx,
    });
    let app = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next))
        .route(
            "/2018-06-01/runtime/invocation/{id}/response",
            post(response),
        )
        .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
        .route("/2018-06-01/runtime/init/error", post(init_error))
        .with_state(api);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let spawned = Instant::now();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_canary"))
        .envs(env.env_vars())
        .env("AWS_LAMBDA_RUNTIME_API", address.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "canary")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "test")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "test")
        .stdin(Stdio::null())
        .stdout(child_output())
        .stderr(child_output())
        .kill_on_drop(true)
        .spawn()
        .expect("start the canary binary");

    let cold_start = tokio::time::timeout(Duration::from_secs(30), next_calls.recv())
        .await
        .expect("the runtime asks for an event within 30 s")
        .expect("the fake API is running");
    println!(
        "cold start (spawn to first GET /next): {:?}",
        cold_start.duration_since(spawned)
    );

    let outcome = tokio::select! {
        posted = tokio::time::timeout(Duration::from_secs(30), posted.recv()) => {
            posted.expect("the function answers within 30 s").expect("the fake API is running")
        }
        status = child.wait() => panic!("the canary binary exited early: {status:?}"),
    };
    let body = match outcome {
        Posted::Response { request_id, body } => {
            assert_eq!(request_id, REQUEST_ID);
            body
        }
        Posted::Error { request_id, body } => panic!(
            "the function reported an error for {request_id}: {}",
            String::from_utf8_lossy(&body)
        ),
    };
    let summary: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        summary,
        serde_json::json!({"processed": 2, "acked": 2, "dead_lettered": 0})
    );

    for id in [1u64, 2] {
        let (status, pongs): (String, u32) =
            sqlx::query_as("SELECT status, pongs FROM canary_pings WHERE id = ?")
                .bind(id)
                .fetch_one(&env.db)
                .await
                .unwrap();
        assert_eq!((status.as_str(), pongs), ("PONGED", 1), "ping {id}");
    }

    // It went back for the next event and waits there, alive.
    tokio::time::timeout(Duration::from_secs(10), next_calls.recv())
        .await
        .expect("the runtime asks for the next event")
        .expect("the fake API is running");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the runtime keeps running between invocations"
    );
    child.kill().await.unwrap();
}
