//! The API on a real socket: `serve` binds its address (`PAYBUS_HTTP_ADDR`), answers over
//! HTTP/1.1 within its limits (header, body and idle timeouts, a connection cap), answers
//! 503 while the database is down, JSON for every error, and stops when its shutdown token is
//! cancelled.

use crate::support;

use std::time::Duration;

use paybus_api::server::Limits;
use paybus_bus::Outbox;
use paybus_config::signature;
use paybus_testkit::free_port;
use support::*;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

#[tokio::test]
async fn serve_answers_on_its_address_and_stops_on_shutdown() {
    let port = free_port();
    let api = Api::with(|config| config.http_addr = ([127, 0, 0, 1], port).into()).await;
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(paybus_api::serve(
        api.config.clone(),
        api.state.clone(),
        shutdown.clone(),
    ));
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let mut health = None;
    for _ in 0..50 {
        if let Ok(response) = client.get(format!("{base}/health")).send().await {
            health = Some(response.status());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(health, Some(reqwest::StatusCode::OK));

    let body = r#"{"withdrawal_id": 1989, "tx_hash": "0xf16c3335"}"#;
    let response = client
        .post(format!("{base}{WITHDRAWAL_CONFIRMATIONS}"))
        .header(
            signature::HEADER,
            signature::sign(MONITOR_SECRET.as_bytes(), now(), body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::ACCEPTED);
    let answer: serde_json::Value = response.json().await.unwrap();
    assert_eq!(answer["accepted"], true);

    let response = client
        .post(format!("{base}{WITHDRAWAL_CONFIRMATIONS}"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::UNAUTHORIZED);

    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("serve returns after shutdown")
        .unwrap();
    assert!(stopped.is_ok(), "{stopped:?}");
    assert_eq!(
        api.scalar(
            "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'withdrawal.tx_confirmed'"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn serve_reports_an_address_in_use() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let api = Api::with(|config| config.http_addr = addr).await;

    let result = paybus_api::serve(
        api.config.clone(),
        api.state.clone(),
        CancellationToken::new(),
    )
    .await;

    let error = result.unwrap_err();
    assert!(error.to_string().contains(&addr.to_string()), "{error}");
}

/// A server on a free port with `limits`; its address and its shutdown token.
async fn serve_with(api: &Api, limits: Limits) -> (std::net::SocketAddr, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(paybus_api::server::serve_on(
        listener,
        api.state.clone(),
        limits,
        shutdown.clone(),
    ));
    (addr, shutdown)
}

/// Reads what the server sends until it closes the connection or `within` passes.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut answer = Vec::new();
    match tokio::time::timeout(within, stream.read_to_end(&mut answer)).await {
        Ok(_) => Some(String::from_utf8_lossy(&answer).into_owned()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn a_body_that_never_arrives_is_408_and_the_connection_is_closed() {
    let api = Api::new().await;
    let limits = Limits {
        body_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let (addr, _shutdown) = serve_with(&api, limits).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!(
                "POST {WITHDRAWAL_CONFIRMATIONS} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{"
            )
            .as_bytes(),
        )
        .await
        .unwrap();

    let answer = read_until_closed(&mut stream, Duration::from_secs(5)).await;

    let answer = answer.expect("closed within the body timeout, not held open");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains(r#"{"error":"the request body did not arrive in time"}"#),
        "{answer}"
    );
}

#[tokio::test]
async fn headers_that_never_finish_and_idle_connections_are_closed() {
    let api = Api::new().await;
    let limits = Limits {
        header_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let (addr, _shutdown) = serve_with(&api, limits).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();

    let slow_closed = read_until_closed(&mut slow, Duration::from_secs(5)).await;
    let idle_closed = read_until_closed(&mut idle, Duration::from_secs(5)).await;

    assert!(
        slow_closed.is_some(),
        "half-sent headers must not hold a connection"
    );
    assert!(idle_closed.is_some(), "an idle connection must not be held");
}

#[tokio::test]
async fn past_the_connection_cap_new_connections_wait_for_a_free_slot() {
    let api = Api::new().await;
    let limits = Limits {
        max_connections: 2,
        header_timeout: Duration::from_secs(30),
        ..Limits::default()
    };
    let (addr, _shutdown) = serve_with(&api, limits).await;
    let holders = [
        TcpStream::connect(addr).await.unwrap(),
        TcpStream::connect(addr).await.unwrap(),
    ];
    let request = async move {
        let mut third = TcpStream::connect(addr).await.unwrap();
        third
            .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        read_until_closed(&mut third, Duration::from_secs(10)).await
    };
    let waiting = tokio::spawn(request);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answered_while_full = waiting.is_finished();

    drop(holders);
    let answer = waiting.await.unwrap();

    assert!(
        !answered_while_full,
        "the third connection must wait for a slot"
    );
    assert!(answer.unwrap_or_default().starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn a_database_outage_is_503_with_retry_after_not_500() {
    let api = Api::new().await;
    // A pool whose database does not answer (nothing listens on the port).
    let dead = sqlx::mysql::MySqlPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy(&format!("mysql://root@127.0.0.1:{}/paybus", free_port()))
        .unwrap();
    let mut state = api.state.clone();
    state.outbox = Outbox::new(dead.clone(), api.services.publisher().clone());
    state.pool = dead;
    let router = paybus_api::router(state);
    let body = r#"{"withdrawal_id": 1989, "tx_hash": "0xf16c3335"}"#;

    let response = router
        .oneshot(signed(WITHDRAWAL_CONFIRMATIONS, body))
        .await
        .unwrap();

    assert_eq!(
        response.status(),
        axum::http::StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        response.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"5"[..])
    );
    let bytes = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
        serde_json::json!({"error": "the database is unavailable; retry later"})
    );
}

#[tokio::test]
async fn framework_errors_are_json_too() {
    let api = Api::new().await;

    let (status, body) = api
        .call(
            axum::http::Request::get(WITHDRAWAL_CONFIRMATIONS)
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await;

    assert_eq!(status, axum::http::StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body, serde_json::json!({"error": "method not allowed"}));
}

#[tokio::test]
async fn unknown_fields_are_refused_on_every_route() {
    let api = Api::new().await;
    let (intake, body) = api
        .call(signed(
            WITHDRAWAL_CONFIRMATIONS,
            r#"{"withdrawal_id": 1, "tx_hash": "0xab", "txhash": "0xab"}"#,
        ))
        .await;
    assert_eq!(intake, axum::http::StatusCode::BAD_REQUEST, "{body}");
    assert!(error_of(&body).contains("unknown field `txhash`"), "{body}");

    let (admin, body) = api
        .call(admin_post(
            "/v1/admin/partners",
            &serde_json::json!({"name": "p", "webhook_secret": "0123456789abcdef", "webhook_ur": "x"}),
        ))
        .await;
    assert_eq!(admin, axum::http::StatusCode::BAD_REQUEST, "{body}");
    assert!(
        error_of(&body).contains("unknown field `webhook_ur`"),
        "{body}"
    );
}

/// Statements running on this test's own database (other tests run beside it) from other
/// connections than this one: here, the completion waiting on the member's lock. sqlx
/// prepares, so they show as `Execute`; `innodb_trx` does not always list a transaction
/// waiting on its first row lock.
async fn statements_waiting(api: &Api) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.processlist \
         WHERE db = DATABASE() AND id <> CONNECTION_ID() AND command IN ('Query', 'Execute')",
    )
    .fetch_one(&api.env.db)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_request_whose_client_hangs_up_mid_transaction_still_finishes_it() {
    // A payment completion whose client went away while its transaction waited on a lock
    // (a proxy's timeout, a crashed caller). Cut off there, it would leave its connection
    // to the pool mid-transaction — the soak saw the next request on it fail with MySQL
    // 1568 — and whether the payment was applied would depend on when the client left.
    let api = Api::new().await;
    let member = paybus_testkit::bonuses::member(&api.env.db).await;
    let purchase = paybus_testkit::bonuses::purchase(
        &api.env.db,
        member,
        paybus_bonuses::charge::PaymentGateway::Pg,
        10,
    )
    .await;
    let paid = purchase.paid();
    let body = serde_json::json!({"charge_id": paid.charge_id, "gateway_tx_id": paid.gateway_tx_id,
                                  "amount": paid.amount.to_string()})
    .to_string();
    let mut holder = api.env.db.begin().await.unwrap();
    sqlx::query("SELECT id FROM members WHERE id = ? FOR UPDATE")
        .bind(member)
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    let (addr, shutdown) = serve_with(&api, Limits::default()).await;

    let client = tokio::spawn(
        reqwest::Client::new()
            .post(format!("http://{addr}/v1/payments/pg/webhook"))
            .header("content-type", "application/json")
            .header(
                signature::HEADER,
                signature::sign(PAYMENTS_SECRET.as_bytes(), now(), body.as_bytes()),
            )
            .body(body)
            .send(),
    );
    let mut waited = 0;
    while statements_waiting(&api).await == 0 {
        waited += 1;
        if waited == 400 || client.is_finished() {
            let answer = match client.await.unwrap() {
                Ok(r) => format!("{} {}", r.status(), r.text().await.unwrap_or_default()),
                Err(e) => e.to_string(),
            };
            panic!("the completion never waited on the member's lock: {answer:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // The client gives up: its connection closes.
    client.abort();
    // Long enough for the server to see the hang-up before the lock goes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.commit().await.unwrap();

    let mut status = String::new();
    for _ in 0..100 {
        status = sqlx::query_scalar("SELECT payment_status FROM charges WHERE id = ?")
            .bind(purchase.id)
            .fetch_one(&api.env.db)
            .await
            .unwrap();
        if status == "COMPLETE" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        status, "COMPLETE",
        "the completion was abandoned with its client"
    );
    shutdown.cancel();
}
