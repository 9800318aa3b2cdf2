//! W1's routes through the router: partners create their orders with their API key (the
//! async-matching switch off, on, unset), idempotent creation, reading orders back (the
//! partner its own, support any), and clear 4xx answers for client mistakes.

use crate::support;

use std::{collections::HashMap, time::Duration};

use axum::http::StatusCode;
use paybus_api::{ApiConfig, role::Role};
use paybus_bus::Handler;
use paybus_config::Vars;
use paybus_match_deposit::MatchDeposit;
use paybus_p2p::Matcher;
use paybus_runtime::runner::Runner;
use paybus_testkit::{eventually, p2p::QuoteStub, tap};
use serde_json::{Value, json};
use support::*;
use tokio_util::sync::CancellationToken;

const DEPOSIT_ORDERS: &str = "/v1/partner/p2p/deposit-orders";
const WITHDRAW_ORDERS: &str = "/v1/partner/p2p/withdraw-orders";
const ADMIN_DEPOSIT_ORDERS: &str = "/v1/admin/p2p/deposit-orders";
const ADMIN_WITHDRAW_ORDERS: &str = "/v1/admin/p2p/withdraw-orders";

/// The API with its quote service pointed at `stub`, then `configure` applied.
async fn api(stub: &QuoteStub, configure: impl FnOnce(&mut ApiConfig)) -> Api {
    let quote = stub.config();
    Api::with(move |config| {
        config.matching.quote = quote;
        configure(config);
    })
    .await
}

/// A partner's POST with its key, which must answer 201.
async fn created(api: &Api, key: &str, path: &str, body: Value) -> Value {
    let (status, answer) = api.call(partner_post(path, key, &body)).await;
    assert_eq!(status, StatusCode::CREATED, "{path} {body}: {answer}");
    answer
}

/// A partner with its API key, and a seller of 100 USDT (the same partner's liquidity).
async fn market(api: &Api) -> (u64, String) {
    let partner = api.partner("Partner 7").await;
    let key = api.partner_key(partner).await;
    created(
        api,
        &key,
        WITHDRAW_ORDERS,
        json!({"currency": "USDT", "amount": "100"}),
    )
    .await;
    (partner, key)
}

fn order(amount: &str) -> Value {
    json!({"currency": "USDT", "amount": amount})
}

#[tokio::test]
async fn switch_off_matches_inside_the_request_and_publishes_nothing() {
    let stub = QuoteStub::start().await;
    let api = api(&stub, |config| config.async_matching_enabled = false).await;
    let tap = tap(&api.services, "tap.p2p.off", "p2p.deposit_order.created").await;
    let (_, key) = market(&api).await;

    let answer = created(&api, &key, DEPOSIT_ORDERS, order("40")).await;

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
    let (_, key) = market(&api).await;

    let answer = created(&api, &key, DEPOSIT_ORDERS, order("10")).await;

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
    let (_, key) = market(&api).await;

    let answer = created(&api, &key, DEPOSIT_ORDERS, order("40")).await;

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
        let (_, order) = api
            .call(partner_get(&format!("{DEPOSIT_ORDERS}/{id}"), &key))
            .await;
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
    let (_, key) = market(&api).await;
    let body = json!({"currency": "USDT", "amount": "5", "partner_order_ref": "buy-2026-0001"});

    let first = created(&api, &key, DEPOSIT_ORDERS, body.clone()).await;
    let (status, again) = api.call(partner_post(DEPOSIT_ORDERS, &key, &body)).await;

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
    let (_, key) = market(&api).await;
    let seller = created(
        &api,
        &key,
        WITHDRAW_ORDERS,
        json!({"currency": "usdt", "amount": "0.000000000000000001"}),
    )
    .await["id"]
        .as_u64()
        .unwrap();

    for (path, request) in [
        (
            "partner",
            partner_get(&format!("{WITHDRAW_ORDERS}/{seller}"), &key),
        ),
        (
            "admin",
            admin_get(&format!("{ADMIN_WITHDRAW_ORDERS}/{seller}")),
        ),
    ] {
        let (status, answer) = api.call(request).await;
        assert_eq!(status, StatusCode::OK, "{path}: {answer}");
        assert_eq!(answer["currency"], "USDT");
        assert_eq!(answer["amount"], "0.000000000000000001");
        assert_eq!(answer["reserved_amount"], "0");
        assert_eq!(answer["status"], "OPEN");
    }

    for path in [
        format!("{ADMIN_WITHDRAW_ORDERS}/999999"),
        format!("{ADMIN_DEPOSIT_ORDERS}/999999"),
    ] {
        let (status, answer) = api.call(admin_get(&path)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {answer}");
    }
    for path in [
        format!("{WITHDRAW_ORDERS}/999999"),
        format!("{DEPOSIT_ORDERS}/999999"),
    ] {
        let (status, answer) = api.call(partner_get(&path, &key)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {answer}");
    }
}

#[tokio::test]
async fn client_mistakes_are_4xx_naming_the_problem_and_create_nothing() {
    let stub = QuoteStub::start().await;
    let api = api(&stub, |_| {}).await;
    let (_, key) = market(&api).await;

    for (body, status, expected) in [
        (
            order("0"),
            StatusCode::BAD_REQUEST,
            "amount must be greater than 0",
        ),
        (order("-1"), StatusCode::BAD_REQUEST, "negative"),
        (
            json!({"currency": "USDT", "amount": 5}),
            StatusCode::BAD_REQUEST,
            "as a string",
        ),
        (
            json!({"currency": "US DT", "amount": "5"}),
            StatusCode::BAD_REQUEST,
            "currency",
        ),
        (
            json!({"currency": "USDT", "amount": "5", "price": "1"}),
            StatusCode::BAD_REQUEST,
            "unknown field `price`",
        ),
        (
            json!({"currency": "USDT", "amount": "5", "partner_order_ref": "has spaces"}),
            StatusCode::BAD_REQUEST,
            "partner_order_ref",
        ),
        // The partner is the key's: naming one in the body is a mistake, not a way in.
        (
            json!({"partner_id": 1, "currency": "USDT", "amount": "5"}),
            StatusCode::BAD_REQUEST,
            "unknown field `partner_id`",
        ),
    ] {
        let (got, answer) = api.call(partner_post(DEPOSIT_ORDERS, &key, &body)).await;
        assert_eq!(got, status, "{body}: {answer}");
        assert!(error_of(&answer).contains(expected), "{body}: {answer}");
    }
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM p2p_deposit_orders").await,
        0
    );
    assert_eq!(stub.quote_calls(), 0);
}

#[tokio::test]
async fn creating_needs_a_partner_key_and_support_reads_with_the_ops_role() {
    let stub = QuoteStub::start().await;
    let api = api(&stub, |_| {}).await;
    market(&api).await;

    // An admin token is not a partner key (and there is no admin create any more).
    let (status, answer) = api.call(admin_post(DEPOSIT_ORDERS, &order("5"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
    let (status, _) = api
        .call(admin_post(ADMIN_DEPOSIT_ORDERS, &order("5")))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = api
        .call(with_roles(
            "GET",
            &format!("{ADMIN_WITHDRAW_ORDERS}/1"),
            &[Role::Ops],
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn without_a_quote_service_inline_matching_is_refused_with_503() {
    let api = Api::with(|config| config.async_matching_enabled = false).await;
    let (_, key) = market(&api).await;

    let (status, answer) = api
        .call(partner_post(DEPOSIT_ORDERS, &key, &order("5")))
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
            paybus_retry::RetryPolicy::with_schedule(1, vec![Duration::from_secs(1)]).unwrap();
    })
    .await;
    let (partner, key) = market(&api).await;
    // The quote service trades, then answers after the client's timeout.
    stub.set_trade_delay(Duration::from_secs(2));

    let answer = created(&api, &key, DEPOSIT_ORDERS, order("40")).await;

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

    let recheck = format!("{ADMIN_DEPOSIT_ORDERS}/{id}/recheck");
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
            &format!("{ADMIN_DEPOSIT_ORDERS}/987654/recheck"),
            &json!({}),
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
    // OPS may read it, not re-arm it.
    let (status, _) = api.call(with_roles("POST", &recheck, &[Role::Ops])).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Only the recheck that moved the order is logged (after the partner's creation and its
    // key's).
    let actions = api.ops_actions().await;
    assert_eq!(
        actions[0],
        logged(
            "tests (break-glass)",
            "p2p_deposit_order.recheck",
            &format!("p2p_deposit_order:{id}")
        )
    );
    assert_eq!(actions[1].1, "partner_api_key.create");
    assert_eq!(
        actions[2],
        logged(
            "tests (break-glass)",
            "partner.create",
            &format!("partner:{partner}")
        )
    );
    assert_eq!(actions.len(), 3, "{actions:?}");
}
