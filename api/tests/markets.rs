//! W4's admin routes: what a client gets back for each mistake, the roles, and the contract of
//! suspend / resume / progress (the cancels themselves are `tests/tests/markets_suspension.rs`).

use crate::support;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use paybus_api::role::Role;
use serde_json::{Value, json};
use support::{Api, admin_get, admin_post, error_of, token};

async fn with_market(symbol: &str) -> Api {
    let api = Api::without_four_eyes().await;
    let (status, body) = api
        .call(admin_post("/v1/admin/markets", &json!({"symbol": symbol})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    api
}

fn order(price: Value, quantity: Value) -> Value {
    json!({"account_id": 7, "side": "BUY", "price": price, "quantity": quantity})
}

async fn place(api: &Api, symbol: &str) -> u64 {
    let (status, body) = api
        .call(admin_post(
            &format!("/v1/admin/markets/{symbol}/orders"),
            &order(json!("100.25"), json!("2")),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_u64().unwrap()
}

#[tokio::test]
async fn markets_are_created_once_with_a_valid_symbol() {
    let api = with_market("BTC-KRW").await;

    let (duplicate, body) = api
        .call(admin_post(
            "/v1/admin/markets",
            &json!({"symbol": "BTC-KRW"}),
        ))
        .await;
    assert_eq!(duplicate, StatusCode::CONFLICT, "{body}");
    for (symbol, reason) in [("btc", "upper-case"), ("BTC/KRW", "only"), ("", "empty")] {
        let (status, body) = api
            .call(admin_post("/v1/admin/markets", &json!({"symbol": symbol})))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{symbol}: {body}");
        assert!(error_of(&body).contains(reason), "{symbol}: {body}");
    }
    let (status, market) = api.call(admin_get("/v1/admin/markets/BTC-KRW")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(market["status"], "ACTIVE");
    let (status, _) = api.call(admin_get("/v1/admin/markets/NOPE")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_order_with_a_bad_field_is_refused_naming_it() {
    let api = with_market("BTC").await;
    let path = "/v1/admin/markets/BTC/orders";
    for (body, expected) in [
        (
            order(json!("100"), json!("0")),
            "quantity must be greater than 0",
        ),
        (
            order(json!("0"), json!("1")),
            "price must be greater than 0",
        ),
        (order(json!("-1"), json!("1")), "negative"),
        (order(json!(100.5), json!("1")), "as a string"),
        (
            json!({"account_id": 7, "side": "HOLD", "price": "1", "quantity": "1"}),
            "side",
        ),
        (
            json!({"account_id": 7, "side": "BUY", "price": "1", "quantity": "1", "qty": "1"}),
            "qty",
        ),
    ] {
        let (status, answer) = api.call(admin_post(path, &body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(error_of(&answer).contains(expected), "{body}: {answer}");
    }
    let (status, _) = api
        .call(admin_post(
            "/v1/admin/markets/NOPE/orders",
            &order(json!("1"), json!("1")),
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn fills_move_an_order_to_partially_filled_then_filled_and_never_past_it() {
    let api = with_market("BTC").await;
    let id = place(&api, "BTC").await;
    let fill = |quantity: &str| {
        admin_post(
            &format!("/v1/admin/orders/{id}/fills"),
            &json!({"quantity": quantity}),
        )
    };

    let (status, partial) = api.call(fill("0.5")).await;
    assert_eq!(
        (status, partial["status"].as_str()),
        (StatusCode::OK, Some("PARTIALLY_FILLED"))
    );
    assert_eq!(partial["filled_quantity"], "0.5");
    let (status, over) = api.call(fill("2")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(error_of(&over).contains("1.5 open"), "{over}");
    let (status, filled) = api.call(fill("1.5")).await;
    assert_eq!(
        (status, filled["status"].as_str()),
        (StatusCode::OK, Some("FILLED"))
    );
    let (status, closed) = api.call(fill("1")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(error_of(&closed).contains("is FILLED"), "{closed}");
    let (status, _) = api
        .call(admin_post(
            "/v1/admin/orders/999999/fills",
            &json!({"quantity": "1"}),
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn suspend_answers_202_then_200_with_the_same_batch_and_placement_is_refused() {
    let api = with_market("BTC").await;
    let id = place(&api, "BTC").await;

    let (first, suspended) = api
        .call(admin_post(
            "/v1/admin/markets/BTC/suspend",
            &json!({"note": "maintenance"}),
        ))
        .await;
    let (second, again) = api
        .call(
            Request::post("/v1/admin/markets/BTC/suspend")
                .header(
                    header::AUTHORIZATION,
                    format!("Bearer {}", support::admin_token()),
                )
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    let (placed, refused) = api
        .call(admin_post(
            "/v1/admin/markets/BTC/orders",
            &order(json!("1"), json!("1")),
        ))
        .await;

    assert_eq!(first, StatusCode::ACCEPTED, "{suspended}");
    assert_eq!(suspended["tasks_created_now"], 1);
    assert_eq!(suspended["progress"], "/v1/admin/markets/BTC/suspension");
    assert_eq!(second, StatusCode::OK, "{again}");
    assert_eq!(again["batch_id"], suspended["batch_id"]);
    assert_eq!(again["suspended_now"], false);
    assert_eq!(placed, StatusCode::CONFLICT);
    assert!(error_of(&refused).contains("BTC is SUSPENDED"), "{refused}");
    let (status, progress) = api
        .call(admin_get("/v1/admin/markets/BTC/suspension"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(progress["phase"], "in_progress");
    assert_eq!(progress["note"], "maintenance");
    assert_eq!(
        progress["tasks"],
        json!({"PENDING": 1, "DONE": 0, "SKIPPED": 0, "FAILED": 0})
    );
    assert_eq!(progress["summary"], "suspension in progress (0 / 1)");
    // Nobody cancelled the order yet: resuming now would leave it behind.
    let (status, body) = api
        .call(admin_post("/v1/admin/markets/BTC/resume", &json!({})))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(error_of(&body).contains("suspension in progress"), "{body}");
    let (status, order) = api.call(admin_get(&format!("/v1/admin/orders/{id}"))).await;
    assert_eq!(
        (status, order["status"].as_str()),
        (StatusCode::OK, Some("OPEN"))
    );
}

#[tokio::test]
async fn progress_needs_a_suspension_and_retry_needs_a_suspended_market() {
    let api = with_market("BTC").await;

    let (status, body) = api
        .call(admin_get("/v1/admin/markets/BTC/suspension"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error_of(&body).contains("never been suspended"), "{body}");
    let (status, _) = api
        .call(admin_post(
            "/v1/admin/markets/BTC/suspension/retry-failed",
            &json!({}),
        ))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, resumed) = api
        .call(admin_post("/v1/admin/markets/BTC/resume", &json!({})))
        .await;
    assert_eq!(
        (status, &resumed["resumed_now"]),
        (StatusCode::OK, &json!(false))
    );
    let (status, _) = api
        .call(admin_post("/v1/admin/markets/NOPE/suspend", &json!({})))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn ops_read_progress_but_only_admins_suspend() {
    let api = with_market("BTC").await;
    let ops = token(&[Role::Ops]);
    let as_ops = |request: axum::http::request::Builder, body: Body| {
        request
            .header(header::AUTHORIZATION, format!("Bearer {ops}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .unwrap()
    };

    let (suspend, _) = api
        .call(as_ops(
            Request::post("/v1/admin/markets/BTC/suspend"),
            Body::from("{}"),
        ))
        .await;
    let (admin, _) = api
        .call(admin_post("/v1/admin/markets/BTC/suspend", &json!({})))
        .await;
    let (read, progress) = api
        .call(as_ops(
            Request::get("/v1/admin/markets/BTC/suspension"),
            Body::empty(),
        ))
        .await;

    assert_eq!(suspend, StatusCode::FORBIDDEN);
    assert_eq!(admin, StatusCode::ACCEPTED);
    assert_eq!(read, StatusCode::OK);
    assert_eq!(
        progress["summary"],
        "suspension complete: 0 tasks created (no open orders at suspension)"
    );
}
