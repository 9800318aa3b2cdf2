//! W1's routes through the router: the async-matching switch (off, on, unset), idempotent
//! creation, reading orders back, and clear 4xx answers for client mistakes.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod support;

use std::{collections::HashMap, time::Duration};

use axum::http::StatusCode;
use paybus_api::{ApiConfig, auth::Role};
use paybus_match_deposit::MatchDeposit;
use paybus_p2p::{Matcher, testing::QuoteStub};
use paybus_platform::{
    bus::{Handler, Runner},
    config::Vars,
    testing::{eventually, tap},
};
use serde_json::{Value, json};
use support::*;
use tokio_util::sync::CancellationToken;

const DEPOSIT_ORDERS: &str = "/v1/admin/p2p/deposit-orders";
const WITHDRAW_ORDERS: &str = "/v1/admin/p2p/withdraw-orders";

/// The API with its quote service pointed at `stub`, then `configure` applied.
async fn api(stub: &QuoteStub, configure: impl FnOnce(&mut ApiConfig)) -> Api {
    let quote = stub.config();
    Api::with(move |config| {
        config.matching.quote = quote;
        configure(config);
    })
    .await
}

async fn created(api: &Api, path: &str, body: Value) -> Value {
    let (status, answer) = api.call(admin_post(path, &body)).await;
    assert_eq!(status, StatusCode::CREATED, "{path} {body}: {answer}");
    answer
}

/// A partner, and a seller of 100 USDT.
async fn market(api: &Api) -> u64 {
    let partner = created(
        api,
        "/v1/admin/partners",
        json!({"name": "Partner 7", "webhook_secret": "partner-7-signing-secret"}),
    )
    .await["id"]
        .as_u64()
        .unwrap();
    created(
        api,
        WITHDRAW_ORDERS,
        json!({"partner_id": partner, "currency": "USDT", "amount": "100"}),
    )
    .await;
    partner
}

fn order(partner_id: u64, amount: &str) -> Value {
    json!({"partner_id": partner_id, "currency": "USDT", "amount": amount})
}

#[tokio::test]
async fn switch_off_matches_inside_the_request_and_publishes_nothing() {
    let stub = QuoteStub::start().await;
    let api = api(&stub, |config| config.async_matching_enabled = false).await;
    let tap = tap(&api.services, "tap.p2p.off", "p2p.deposit_order.created").await;
    let partner = market(&api).await;

    let answer = created(&api, DEPOSIT_ORDERS, order(partner, "40")).await;

    assert_eq!(answer["status"], "MATCHED", "{answer}");
    assert_eq!(answer["close_reason"], "FILLED");
    assert_eq!(answer["remaining_amount"], "0");
    assert_eq!(answer["matches"][0]["status"], "CONFIRMED");
    assert_eq!(answer["matches"][0]["amount"], "40");
    assert_eq!(answer["matches"][0]["external_trade_id"], "t-1");
    assert_eq!(stub.trades().len(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(tap_count(&tap, "tap.p2p.off", 1).await, 0);
}

#[tokio::test]
async fn an_unset_switch_is_off() {
    let stub = QuoteStub::start().await;
    let vars = Vars::new(HashMap::from([("PAYBUS_QUOTE_URL".to_owned(), stub.url())]));
    let from_env = ApiConfig::read(&vars).unwrap();
    assert!(!from_env.async_matching_enabled);
    let api = Api::with(|config| {
        config.async_matching_enabled = from_env.async_matching_enabled;
        config.matching = from_env.matching;
    })
    .await;
    let partner = market(&api).await;

    let answer = created(&api, DEPOSIT_ORDERS, order(partner, "10")).await;

    assert_eq!(answer["status"], "MATCHED", "{answer}");
}

#[tokio::test]
async fn switch_on_answers_pending_and_match_deposit_matches_it() {
    let stub = QuoteStub::start().await;
    let api = api(&stub, |config| config.async_matching_enabled = true).await;
    // As `paybus run` does before the API takes requests.
    api.services
        .declare_topology(&[MatchDeposit::queue()])
        .await
        .unwrap();
    let tap = tap(&api.services, "tap.p2p.on", "p2p.deposit_order.created").await;
    let partner = market(&api).await;

    let answer = created(&api, DEPOSIT_ORDERS, order(partner, "40")).await;

    assert_eq!(answer["status"], "PENDING", "{answer}");
    assert_eq!(answer["match_attempt_count"], 0);
    assert_eq!(tap_count(&tap, "tap.p2p.on", 1).await, 1);
    assert_eq!(stub.quote_calls(), 0);

    let id = answer["id"].as_u64().unwrap();
    let matcher = Matcher::new(api.services.outbox.clone(), api.config.matching.clone()).unwrap();
    let mut runner = Runner::new(api.services.clone());
    runner.add_function(MatchDeposit::new(matcher));
    let stop = CancellationToken::new();
    let running = tokio::spawn(runner.run(stop.clone()));
    let matched = eventually(Duration::from_secs(30), || async {
        let (_, order) = api.call(admin_get(&format!("{DEPOSIT_ORDERS}/{id}"))).await;
        order["status"] == "MATCHED"
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    assert!(matched);
    assert_eq!(stub.trades().len(), 1);
}

#[tokio::test]
async fn a_repeated_partner_reference_returns_the_first_order() {
    let stub = QuoteStub::start().await;
    let api = api(&stub, |config| config.async_matching_enabled = true).await;
    let partner = market(&api).await;
    let body = json!({"partner_id": partner, "currency": "USDT", "amount": "5",
                      "partner_order_ref": "buy-2026-0001"});

    let first = created(&api, DEPOSIT_ORDERS, body.clone()).await;
    let (status, again) = api.call(admin_post(DEPOSIT_ORDERS, &body)).await;

    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again["partner_order_ref"], "buy-2026-0001");
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM p2p_deposit_orders").await,
        1
    );
    assert_eq!(api.scalar("SELECT COUNT(*) FROM outbox_messages").await, 1);
}

#[tokio::test]
async fn orders_read_back_with_their_amounts_exactly() {
    let stub = QuoteStub::start().await;
    let api = api(&stub, |_| {}).await;
    let partner = market(&api).await;
    let seller = created(
        &api,
        WITHDRAW_ORDERS,
        json!({"partner_id": partner, "currency": "usdt", "amount": "0.000000000000000001"}),
    )
    .await["id"]
        .as_u64()
        .unwrap();

    let (status, answer) = api
        .call(admin_get(&format!("{WITHDRAW_ORDERS}/{seller}")))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["currency"], "USDT");
    assert_eq!(answer["amount"], "0.000000000000000001");
    assert_eq!(answer["reserved_amount"], "0");
    assert_eq!(answer["status"], "OPEN");

    for path in [
        format!("{WITHDRAW_ORDERS}/999999"),
        format!("{DEPOSIT_ORDERS}/999999"),
    ] {
        let (status, answer) = api.call(admin_get(&path)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {answer}");
    }
}

#[tokio::test]
async fn client_mistakes_are_4xx_naming_the_problem_and_create_nothing() {
    let stub = QuoteStub::start().await;
    let api = api(&stub, |_| {}).await;
    let partner = market(&api).await;

    for (body, status, expected) in [
        (
            order(partner, "0"),
            StatusCode::BAD_REQUEST,
            "amount must be greater than 0",
        ),
        (order(partner, "-1"), StatusCode::BAD_REQUEST, "negative"),
        (
            json!({"partner_id": partner, "currency": "USDT", "amount": 5}),
            StatusCode::BAD_REQUEST,
            "as a string",
        ),
        (
            json!({"partner_id": partner, "currency": "US DT", "amount": "5"}),
            StatusCode::BAD_REQUEST,
            "currency",
        ),
        (
            json!({"partner_id": partner, "currency": "USDT", "amount": "5", "price": "1"}),
            StatusCode::BAD_REQUEST,
            "unknown field `price`",
        ),
        (
            json!({"partner_id": partner, "currency": "USDT", "amount": "5",
                   "partner_order_ref": "has spaces"}),
            StatusCode::BAD_REQUEST,
            "partner_order_ref",
        ),
        (order(0, "5"), StatusCode::BAD_REQUEST, "partner_id"),
        (
            order(424_242, "5"),
            StatusCode::NOT_FOUND,
            "partner 424242 not found",
        ),
    ] {
        let (got, answer) = api.call(admin_post(DEPOSIT_ORDERS, &body)).await;
        assert_eq!(got, status, "{body}: {answer}");
        assert!(error_of(&answer).contains(expected), "{body}: {answer}");
    }
    let (got, answer) = api
        .call(admin_post(WITHDRAW_ORDERS, &order(424_242, "5")))
        .await;
    assert_eq!(got, StatusCode::NOT_FOUND, "{answer}");
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM p2p_deposit_orders").await,
        0
    );
    assert_eq!(stub.quote_calls(), 0);
}

#[tokio::test]
async fn creating_needs_the_admin_role_and_reading_the_ops_role() {
    let stub = QuoteStub::start().await;
    let api = api(&stub, |_| {}).await;
    let partner = market(&api).await;
    let ops = token(&[Role::Ops]);
    let request = |method: &str, path: &str, body: String| {
        axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header(axum::http::header::AUTHORIZATION, format!("Bearer {ops}"))
            .body(axum::body::Body::from(body))
            .unwrap()
    };

    let (status, _) = api
        .call(request(
            "POST",
            DEPOSIT_ORDERS,
            order(partner, "5").to_string(),
        ))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = api
        .call(request(
            "GET",
            &format!("{WITHDRAW_ORDERS}/1"),
            String::new(),
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn without_a_quote_service_inline_matching_is_refused_with_503() {
    let api = Api::with(|config| config.async_matching_enabled = false).await;
    let partner = market(&api).await;

    let (status, answer) = api
        .call(admin_post(DEPOSIT_ORDERS, &order(partner, "5")))
        .await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert!(error_of(&answer).contains("PAYBUS_QUOTE_URL"), "{answer}");
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM p2p_deposit_orders").await,
        0
    );
}

#[tokio::test]
async fn an_order_in_doubt_is_shown_so_and_ops_recheck_re_arms_it_once() {
    let stub = QuoteStub::start().await;
    let api = api(&stub, |config| {
        config.async_matching_enabled = false;
        config.matching.quote.timeout = Duration::from_millis(300);
        // One unknown outcome is the bound: the inline attempt parks the order at once.
        config.matching.trade_checks =
            paybus_platform::retry::RetryPolicy::with_schedule(1, vec![Duration::from_secs(1)])
                .unwrap();
    })
    .await;
    let partner = market(&api).await;
    // The quote service trades, then answers after the client's timeout.
    stub.set_trade_delay(Duration::from_secs(2));

    let answer = created(&api, DEPOSIT_ORDERS, order(partner, "40")).await;

    assert_eq!(answer["status"], "IN_DOUBT", "{answer}");
    assert_eq!(answer["close_reason"], Value::Null);
    assert_eq!(answer["match_attempt_count"], 0);
    assert_eq!(answer["matches"][0]["status"], "TRADING");
    assert_eq!(answer["matches"][0]["trade_checks"], 1);
    let id = answer["id"].as_u64().unwrap();
    let key = format!("p2p-deposit-{id}-fill-1");
    assert_eq!(answer["matches"][0]["trade_key"], key.as_str());
    assert!(
        answer["last_error"].as_str().unwrap().contains(&key),
        "{answer}"
    );

    let recheck = format!("{DEPOSIT_ORDERS}/{id}/recheck");
    let (status, again) = api.call(admin_post(&recheck, &json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["status"], "PENDING");
    assert_eq!(again["matches"][0]["trade_checks"], 0);
    let (status, refused) = api.call(admin_post(&recheck, &json!({}))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert!(
        error_of(&refused).contains("PENDING, not IN_DOUBT"),
        "{refused}"
    );
    let (status, missing) = api
        .call(admin_post(
            &format!("{DEPOSIT_ORDERS}/987654/recheck"),
            &json!({}),
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
    // OPS may read it, not re-arm it.
    let (status, _) = api.call(with_roles("POST", &recheck, &[Role::Ops])).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Only the recheck that moved the order is logged (after the partner's creation).
    assert_eq!(
        api.ops_actions().await,
        [
            logged(
                "tests",
                "p2p_deposit_order.recheck",
                &format!("p2p_deposit_order:{id}")
            ),
            logged("tests", "partner.create", &format!("partner:{partner}")),
        ]
    );
}
