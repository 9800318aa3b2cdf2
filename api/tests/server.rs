//! The API on a real socket: `serve` binds its address (`PAYBUS_HTTP_ADDR`), answers over HTTP/1.1 and
//! stops when its shutdown token is cancelled.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod support;

use std::time::Duration;

use paybus_platform::{signature, testing::free_port};
use support::*;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn serve_answers_on_its_address_and_stops_on_shutdown() {
    let port = free_port();
    let api = Api::with(|config| config.http_addr = ([127, 0, 0, 1], port).into()).await;
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(paybus_api::serve(
        api.config.http_addr,
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
        api.config.http_addr,
        api.state.clone(),
        CancellationToken::new(),
    )
    .await;

    let error = result.unwrap_err();
    assert!(error.to_string().contains(&addr.to_string()), "{error}");
}
