//! The partner API through the router: API keys (shown once, stored hashed, revoked at once,
//! rotated with an overlap), isolation walked over every partner operation of the OpenAPI
//! document, `Idempotency-Key` (replay, another body, concurrent requests, a run whose process
//! died), and per-partner rate limits.

use crate::support;

use std::time::Duration;

use axum::{
    body::Body,
    http::{Method, Request, StatusCode, header},
};
use paybus_testkit::p2p::QuoteStub;
use serde_json::{Value, json};
use support::*;
use tower::ServiceExt;

const DEPOSIT_ORDERS: &str = "/v1/partner/p2p/deposit-orders";
const WITHDRAW_ORDERS: &str = "/v1/partner/p2p/withdraw-orders";

/// The API with async matching on (creating an order needs no quote service) unless a test
/// says otherwise.
async fn api() -> Api {
    Api::with(|config| config.async_matching_enabled = true).await
}

async fn created_id(api: &Api, request: Request<Body>) -> u64 {
    let (status, answer) = api.call(request).await;
    assert!(
        status == StatusCode::CREATED,
        "expected 201, got {status}: {answer}"
    );
    answer["id"].as_u64().unwrap()
}

/// The whole answer: status, headers, JSON body.
async fn send(api: &Api, request: Request<Body>) -> (StatusCode, header::HeaderMap, Value) {
    let response = api.router().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (parts.status, parts.headers, body)
}

fn with_key(
    method: &str,
    path: &str,
    key: &str,
    idempotency_key: Option<&str>,
    body: &Value,
) -> Request<Body> {
    let mut builder = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(idempotency_key) = idempotency_key {
        builder = builder.header("idempotency-key", idempotency_key);
    }
    builder.body(Body::from(body.to_string())).unwrap()
}

#[tokio::test]
async fn a_key_is_shown_once_stored_hashed_and_refused_when_wrong() {
    let api = api().await;
    let partner = api.partner("acme").await;
    let (status, issued) = api
        .call(admin_post(
            &format!("/v1/admin/partners/{partner}/api-keys"),
            &json!({"label": "production"}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{issued}");
    let key = issued["key"].as_str().unwrap().to_owned();
    let key_id = issued["id"].as_u64().unwrap();
    assert!(key.starts_with(&format!("pbk_{key_id}_")), "{key}");
    assert_eq!(issued["label"], "production");

    let (status, me) = api.call(partner_get("/v1/partner/me", &key)).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(me["id"].as_u64(), Some(partner));
    assert_eq!(me["name"], "acme");

    // The list never shows a secret; the table holds no part of it.
    let (_, list) = api
        .call(admin_get(&format!("/v1/admin/partners/{partner}/api-keys")))
        .await;
    assert_eq!(list["keys"].as_array().unwrap().len(), 1);
    assert!(!list.to_string().contains(&key[key.len() - 20..]), "{list}");
    let secret = key[format!("pbk_{key_id}_").len()..].to_owned();
    let dump: Vec<(Vec<u8>,)> = sqlx::query_as("SELECT secret_hash FROM partner_api_keys")
        .fetch_all(&api.env.db)
        .await
        .unwrap();
    assert_eq!(dump[0].0.len(), 32);
    assert!(!String::from_utf8_lossy(&dump[0].0).contains(&secret[..8]));
    // The last use is recorded.
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM partner_api_keys WHERE last_used_at IS NOT NULL")
            .await,
        1
    );

    let mut wrong_secret = key.clone();
    wrong_secret.pop();
    wrong_secret.push(if key.ends_with('A') { 'B' } else { 'A' });
    for (presented, what) in [
        (None, "missing"),
        (Some("pbk_nonsense".to_owned()), "malformed"),
        (Some(wrong_secret), "wrong secret"),
        (Some(format!("pbk_987654_{secret}")), "unknown id"),
        (Some(admin_token()), "an admin token"),
    ] {
        let mut request = Request::get("/v1/partner/me");
        if let Some(presented) = &presented {
            request = request.header(header::AUTHORIZATION, format!("Bearer {presented}"));
        }
        let (status, headers, body) = send(&api, request.body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
        assert_eq!(
            headers[header::WWW_AUTHENTICATE],
            "Bearer realm=\"paybus-partner\"",
            "{what}"
        );
    }
    assert_eq!(
        api.ops_actions().await[0],
        logged(
            "tests (break-glass)",
            "partner_api_key.create",
            &format!("partner_api_key:{key_id}")
        )
    );
}

#[tokio::test]
async fn a_revoked_key_is_refused_at_once_and_a_rotated_one_after_its_overlap() {
    let api = api().await;
    let partner = api.partner("acme").await;
    let old = api.partner_key(partner).await;
    let old_id: u64 = old.split('_').nth(1).unwrap().parse().unwrap();

    let (status, rotated) = api
        .call(admin_post(
            &format!("/v1/admin/partners/{partner}/api-keys/{old_id}/rotate"),
            &json!({"overlap_seconds": 2}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{rotated}");
    let new = rotated["new"]["key"].as_str().unwrap().to_owned();
    assert!(rotated["old"]["expires_at"].is_string(), "{rotated}");

    // During the overlap both work.
    for key in [&old, &new] {
        let (status, body) = api.call(partner_get("/v1/partner/me", key)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let (status, body) = api.call(partner_get("/v1/partner/me", &old)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("revoked or expired")
    );
    let (status, _) = api.call(partner_get("/v1/partner/me", &new)).await;
    assert_eq!(status, StatusCode::OK);
    // A rotated-out key cannot be rotated again.
    let (status, body) = api
        .call(admin_post(
            &format!("/v1/admin/partners/{partner}/api-keys/{old_id}/rotate"),
            &json!({}),
        ))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // Revoked: refused from the very next request.
    let new_id = rotated["new"]["id"].as_u64().unwrap();
    let (status, revoked) = api
        .call(admin_post(
            &format!("/v1/admin/partners/{partner}/api-keys/{new_id}/revoke"),
            &json!({}),
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert!(revoked["revoked_at"].is_string());
    let (status, _) = api.call(partner_get("/v1/partner/me", &new)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Another partner's key id under this partner's path is not found.
    let other = api.partner("other").await;
    let (status, _) = api
        .call(admin_post(
            &format!("/v1/admin/partners/{other}/api-keys/{new_id}/revoke"),
            &json!({}),
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = api
        .call(admin_post("/v1/admin/partners/987654/api-keys", &json!({})))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// B's rows, one of each kind a partner route reads by id.
struct Rows {
    deposit_order: u64,
    withdraw_order: u64,
    withdrawal: u64,
    deposit: u64,
    notification: u64,
}

/// A DELIVERED notification of `partner` with one recorded attempt, as deliver-webhook leaves
/// one (written directly: the delivery itself has its own tests).
async fn delivered_notification(api: &Api, partner: u64, reference_id: u64, tag: &str) -> u64 {
    let id = sqlx::query(
        "INSERT INTO partner_notifications \
         (partner_id, event, reference_type, reference_id, payload, status, attempts, delivered_at) \
         VALUES (?, 'WITHDRAWAL_CONFIRMED', 'WITHDRAWAL', ?, ?, 'DELIVERED', 1, NOW(6))",
    )
    .bind(partner)
    .bind(reference_id)
    .bind(json!({"withdrawal_id": reference_id, "tag": tag}).to_string())
    .execute(&api.env.db)
    .await
    .unwrap()
    .last_insert_id();
    sqlx::query(
        "INSERT INTO partner_notification_attempts \
         (notification_id, partner_id, attempt, started_at, status_code, latency_ms, error) \
         VALUES (?, ?, 1, NOW(6), 200, 12, NULL)",
    )
    .bind(id)
    .bind(partner)
    .execute(&api.env.db)
    .await
    .unwrap();
    id
}

async fn rows_of(api: &Api, partner: u64, key: &str, tag: &str) -> Rows {
    let withdrawal = created_id(
        api,
        admin_post(
            "/v1/admin/withdrawals",
            &json!({"partner_id": partner, "status": "BROADCASTING", "currency": "USDT",
                    "amount": "3", "to_address": format!("T-{tag}")}),
        ),
    )
    .await;
    Rows {
        withdrawal,
        notification: delivered_notification(api, partner, withdrawal, tag).await,
        withdraw_order: created_id(
            api,
            partner_post(WITHDRAW_ORDERS, key, &json!({"currency": "USDT", "amount": "100"})),
        )
        .await,
        deposit_order: created_id(
            api,
            partner_post(
                DEPOSIT_ORDERS,
                key,
                &json!({"currency": "USDT", "amount": "7", "partner_order_ref": format!("ref-{tag}")}),
            ),
        )
        .await,
        deposit: created_id(
            api,
            admin_post(
                "/v1/admin/deposits",
                &json!({"partner_id": partner, "currency": "USDT", "amount": "4",
                        "tx_hash": format!("0x{tag}"), "to_address": format!("D-{tag}")}),
            ),
        )
        .await,
    }
}

/// The isolation walk: every partner operation of the OpenAPI document, with partner A's key
/// and partner B's ids, answers 404 — no 2xx, no 5xx, nothing of B's in the body; operations
/// without an id answer with A's own data only.
#[tokio::test]
async fn partner_a_reaches_nothing_of_partner_b_on_any_partner_route() {
    let api = api().await;
    let a = api.partner("partner-a").await;
    let a_key = api.partner_key(a).await;
    let b = api.partner("partner-b-confidential").await;
    let b_key = api.partner_key(b).await;
    let a_rows = rows_of(&api, a, &a_key, "aaaa").await;
    let b_rows = rows_of(&api, b, &b_key, "bbbb").await;

    let document = serde_json::to_value(paybus_api::openapi::document()).unwrap();
    let mut walked = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        if !path.starts_with("/v1/partner/") {
            continue;
        }
        for method in item.as_object().unwrap().keys() {
            if !["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            walked += 1;
            let b_id = if path.contains("{id}") {
                let id = if path.starts_with("/v1/partner/p2p/deposit-orders/") {
                    b_rows.deposit_order
                } else if path.starts_with("/v1/partner/p2p/withdraw-orders/") {
                    b_rows.withdraw_order
                } else if path.starts_with("/v1/partner/withdrawals/") {
                    b_rows.withdrawal
                } else if path.starts_with("/v1/partner/deposits/") {
                    b_rows.deposit
                } else if path.starts_with("/v1/partner/notifications/") {
                    b_rows.notification
                } else {
                    panic!("{method} {path}: the walk does not know which of B's rows to try");
                };
                Some(id)
            } else {
                None
            };
            let concrete =
                b_id.map_or_else(|| path.clone(), |id| path.replace("{id}", &id.to_string()));
            let (status, _, body) = send(
                &api,
                with_key(&method.to_uppercase(), &concrete, &a_key, None, &json!({})),
            )
            .await;
            assert!(
                !status.is_server_error(),
                "{method} {concrete}: {status} {body}"
            );
            let text = body.to_string();
            assert!(
                !text.contains("partner-b-confidential"),
                "{method} {concrete}: {text}"
            );
            assert!(!text.contains("bbbb"), "{method} {concrete}: {text}");
            assert_ne!(
                body["partner_id"].as_u64(),
                Some(b),
                "{method} {concrete}: {text}"
            );
            if b_id.is_some() {
                assert_eq!(status, StatusCode::NOT_FOUND, "{method} {concrete}: {text}");
            }
        }
    }
    assert!(walked >= 12, "walked {walked} partner operations");
    // B's notification was not re-delivered by A's POST.
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM partner_notifications WHERE status = 'DELIVERED'")
            .await,
        2
    );

    // The same routes with A's own ids answer A's rows (the walk's 404s are isolation, not
    // broken routes).
    for path in [
        format!("{DEPOSIT_ORDERS}/{}", a_rows.deposit_order),
        format!("{WITHDRAW_ORDERS}/{}", a_rows.withdraw_order),
        format!("/v1/partner/withdrawals/{}", a_rows.withdrawal),
        format!("/v1/partner/deposits/{}", a_rows.deposit),
        format!("/v1/partner/notifications/{}", a_rows.notification),
    ] {
        let (status, body) = api.call(partner_get(&path, &a_key)).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert_eq!(body["partner_id"].as_u64(), Some(a), "{path}: {body}");
    }
}

#[tokio::test]
async fn an_idempotency_key_replays_the_first_answer_and_refuses_another_body() {
    let api = api().await;
    let partner = api.partner("acme").await;
    let key = api.partner_key(partner).await;
    let body = json!({"currency": "USDT", "amount": "12.5"});

    let (first_status, first_headers, first) = send(
        &api,
        with_key("POST", WITHDRAW_ORDERS, &key, Some("sell-0001"), &body),
    )
    .await;
    assert_eq!(first_status, StatusCode::CREATED, "{first}");
    assert!(first_headers.get("idempotent-replayed").is_none());
    let (status, headers, again) = send(
        &api,
        with_key("POST", WITHDRAW_ORDERS, &key, Some("sell-0001"), &body),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_eq!(again, first);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM p2p_withdraw_orders").await,
        1
    );

    let (status, _, refused) = send(
        &api,
        with_key(
            "POST",
            WITHDRAW_ORDERS,
            &key,
            Some("sell-0001"),
            &json!({"currency": "USDT", "amount": "13"}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    let (status, _, refused) = send(
        &api,
        with_key("POST", DEPOSIT_ORDERS, &key, Some("sell-0001"), &body),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    // A client mistake is kept as it was answered, too.
    let bad = json!({"currency": "USDT", "amount": "0"});
    for _ in 0..2 {
        let (status, _, _) = send(
            &api,
            with_key("POST", WITHDRAW_ORDERS, &key, Some("bad-1"), &bad),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
    let (status, _, _) = send(
        &api,
        with_key("POST", WITHDRAW_ORDERS, &key, Some("two words"), &body),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Keys are the partner's own: another partner's same key is a new request.
    let other = api.partner("other").await;
    let other_key = api.partner_key(other).await;
    let (status, _, theirs) = send(
        &api,
        with_key(
            "POST",
            WITHDRAW_ORDERS,
            &other_key,
            Some("sell-0001"),
            &body,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_ne!(theirs["id"], first["id"]);
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM p2p_withdraw_orders").await,
        2
    );
}

#[tokio::test]
async fn two_concurrent_requests_with_one_key_make_one_order() {
    let stub = QuoteStub::start().await;
    let quote = stub.config();
    // Inline matching, with a quote service that takes a second: the first request is still
    // running when the second arrives.
    let api = Api::with(move |config| {
        config.async_matching_enabled = false;
        config.matching.quote = quote;
    })
    .await;
    let partner = api.partner("acme").await;
    let key = api.partner_key(partner).await;
    let (status, _) = api
        .call(partner_post(
            WITHDRAW_ORDERS,
            &key,
            &json!({"currency": "USDT", "amount": "100"}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    stub.set_trade_delay(Duration::from_millis(1500));
    let body = json!({"currency": "USDT", "amount": "10"});

    let router = api.router();
    let (one, two) = tokio::join!(
        router.clone().oneshot(with_key(
            "POST",
            DEPOSIT_ORDERS,
            &key,
            Some("buy-77"),
            &body
        )),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            router
                .clone()
                .oneshot(with_key(
                    "POST",
                    DEPOSIT_ORDERS,
                    &key,
                    Some("buy-77"),
                    &body,
                ))
                .await
        }
    );
    let (one, two) = (one.unwrap(), two.unwrap());
    assert_eq!(one.status(), StatusCode::CREATED);
    assert_eq!(two.status(), StatusCode::CONFLICT);
    assert_eq!(two.headers()[header::RETRY_AFTER], "1");
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM p2p_deposit_orders").await,
        1
    );
    assert_eq!(stub.trades().len(), 1);
    // Once the first is done, the retry gets its answer.
    let (status, headers, replayed) = send(
        &api,
        with_key("POST", DEPOSIT_ORDERS, &key, Some("buy-77"), &body),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{replayed}");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(replayed["status"], "MATCHED");
}

#[tokio::test]
async fn a_request_whose_process_died_after_its_commit_is_run_again_without_a_second_order() {
    let api = api().await;
    let partner = api.partner("acme").await;
    let key = api.partner_key(partner).await;
    let body = json!({"currency": "USDT", "amount": "5"});
    let (status, first) = api
        .call(with_key(
            "POST",
            WITHDRAW_ORDERS,
            &key,
            Some("sell-9"),
            &body,
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    // As if the process had died after the order committed, before its answer was kept: the
    // key IN_PROGRESS, its lease run out.
    sqlx::query(
        "UPDATE partner_idempotency_keys SET status = 'IN_PROGRESS', response_status = NULL, \
         response_body = NULL, locked_until = NOW(6) - INTERVAL 1 SECOND",
    )
    .execute(&api.env.db)
    .await
    .unwrap();

    let (status, again) = api
        .call(with_key(
            "POST",
            WITHDRAW_ORDERS,
            &key,
            Some("sell-9"),
            &body,
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["id"], first["id"]);
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM p2p_withdraw_orders").await,
        1
    );
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM partner_idempotency_keys WHERE status = 'DONE'")
            .await,
        1
    );
}

#[tokio::test]
async fn a_request_running_longer_than_the_lease_keeps_its_key_by_renewing_it() {
    // A live request renews its key; only a dead one lets a retry in after the lease. The
    // order's insert waits on the partner's row, held here for longer than a lease.
    let api = api().await;
    let partner = api.partner("slow").await;
    let key = api.partner_key(partner).await;
    let body = json!({"currency": "USDT", "amount": "5"});
    let mut holder = api.env.db.begin().await.unwrap();
    sqlx::query("SELECT id FROM partners WHERE id = ? FOR UPDATE")
        .bind(partner)
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    let first = tokio::spawn(api.router().oneshot(with_key(
        "POST",
        WITHDRAW_ORDERS,
        &key,
        Some("sell-long"),
        &body,
    )));
    tokio::time::sleep(paybus_api::partner_api::idempotency::LEASE + Duration::from_secs(2)).await;

    let retry = tokio::time::timeout(
        Duration::from_secs(3),
        send(
            &api,
            with_key("POST", WITHDRAW_ORDERS, &key, Some("sell-long"), &body),
        ),
    )
    .await
    .expect("the retry was run (it waits on the lock) instead of being told the key is busy");
    assert_eq!(retry.0, StatusCode::CONFLICT, "{}", retry.2);
    assert_eq!(retry.1[header::RETRY_AFTER], "1");

    holder.commit().await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM p2p_withdraw_orders").await,
        1
    );
}

#[tokio::test]
async fn past_its_rate_limit_a_partner_gets_429_and_nobody_else_does() {
    let api = api().await;
    let partner = api.partner("busy").await;
    let key = api.partner_key(partner).await;
    let calm = api.partner("calm").await;
    let calm_key = api.partner_key(calm).await;
    sqlx::query("UPDATE partners SET rate_limit_per_second = 1, rate_limit_burst = 2 WHERE id = ?")
        .bind(partner)
        .execute(&api.env.db)
        .await
        .unwrap();

    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let (status, headers, body) = send(&api, partner_get("/v1/partner/me", &key)).await;
        if status == StatusCode::OK {
            assert_eq!(
                body["rate_limit"],
                json!({"per_second": 1, "burst": 2}),
                "{body}"
            );
        }
        statuses.push(status);
        last = Some((headers, body));
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let (headers, body) = last.unwrap();
    assert_eq!(headers[header::RETRY_AFTER], "1");
    assert_eq!(headers["ratelimit-policy"], "\"partner\";q=2;w=2");
    assert!(
        headers["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"partner\";r=0;t=")
    );
    assert!(
        body["error"].as_str().unwrap().contains("rate limit"),
        "{body}"
    );

    // Another partner, and the admin API, are not limited by it.
    let (status, headers, _) = send(&api, partner_get("/v1/partner/me", &calm_key)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["ratelimit-policy"], "\"partner\";q=100;w=2");
    for _ in 0..5 {
        let (status, _) = api
            .call(admin_get(&format!("/v1/admin/partners/{partner}")))
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, _, _) = send(&api, partner_get("/v1/partner/me", &key)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn without_a_hash_key_the_partner_api_is_closed() {
    let api = Api::with(|config| config.partner_api.key_hash_key = None).await;
    let partner = api.partner("acme").await;
    let (status, body) = api
        .call(admin_post(
            &format!("/v1/admin/partners/{partner}/api-keys"),
            &json!({}),
        ))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("PAYBUS_PARTNER_KEY_HASH_KEY")
    );
    let (status, _) = api
        .call(partner_get(
            "/v1/partner/me",
            &format!("pbk_1_{}", "a".repeat(43)),
        ))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn a_partner_reads_its_notifications_with_their_attempts_and_redelivers_one() {
    let api = api().await;
    let partner = api.partner("acme").await;
    let key = api.partner_key(partner).await;
    let first = delivered_notification(&api, partner, 11, "first").await;
    let second = delivered_notification(&api, partner, 12, "second").await;

    let (status, page) = api
        .call(partner_get("/v1/partner/notifications?limit=1", &key))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["notifications"][0]["id"].as_u64(), Some(second));
    let before = page["next_before"].as_u64().unwrap();
    let (_, rest) = api
        .call(partner_get(
            &format!("/v1/partner/notifications?before={before}"),
            &key,
        ))
        .await;
    assert_eq!(rest["notifications"][0]["id"].as_u64(), Some(first));
    assert_eq!(rest["next_before"], Value::Null);
    let (status, _) = api
        .call(partner_get("/v1/partner/notifications?limit=0", &key))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let (status, shown) = api
        .call(partner_get(
            &format!("/v1/partner/notifications/{first}"),
            &key,
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["status"], "DELIVERED");
    let attempt = &shown["delivery_attempts"][0];
    assert_eq!(attempt["status_code"], 200);
    assert_eq!(attempt["latency_ms"], 12);
    assert!(attempt["started_at"].is_string(), "{shown}");

    let outbox_before = api.scalar("SELECT COUNT(*) FROM outbox_messages").await;
    let redeliver = format!("/v1/partner/notifications/{first}/redeliver");
    let (status, queued) = api.call(partner_post(&redeliver, &key, &json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{queued}");
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM outbox_messages").await,
        outbox_before + 1
    );
    let (_, shown) = api
        .call(partner_get(
            &format!("/v1/partner/notifications/{first}"),
            &key,
        ))
        .await;
    assert_eq!(shown["status"], "PENDING");
    assert_eq!(
        shown["id"].as_u64(),
        Some(first),
        "the same id: the same webhook-id"
    );
    let (status, busy) = api.call(partner_post(&redeliver, &key, &json!({}))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{busy}");
    assert!(
        api.ops_actions()
            .await
            .iter()
            .any(|(_, action, _)| action == "partner_notification.redeliver"),
        "the re-delivery is in the ops log"
    );
}

#[tokio::test]
async fn a_partner_sets_its_webhook_url_and_rotates_its_secret_with_an_overlap() {
    let api = api().await;
    let partner = api.partner("acme").await;
    let key = api.partner_key(partner).await;

    let (status, me) = api
        .call(with_key(
            "PUT",
            "/v1/partner/webhook",
            &key,
            None,
            &json!({"url": "https://acme.example/hooks"}),
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(me["webhook_url"], "https://acme.example/hooks");
    let (status, refused) = api
        .call(with_key(
            "PUT",
            "/v1/partner/webhook",
            &key,
            None,
            &json!({"url": "ftp://x"}),
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");

    let (status, rotated) = api
        .call(partner_post(
            "/v1/partner/webhook/secret/rotate",
            &key,
            &json!({"overlap_seconds": 600}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{rotated}");
    let secret = rotated["webhook_secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"), "{rotated}");
    assert_eq!(
        api.scalar(
            "SELECT COUNT(*) FROM partner_webhook_secrets \
             WHERE expires_at IS NOT NULL AND expires_at > NOW(6)"
        )
        .await,
        1,
        "the old secret signs for the overlap"
    );
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM partner_webhook_secrets WHERE expires_at IS NULL")
            .await,
        1,
        "the new one is current"
    );
    // Never readable again, and not stored as an idempotent answer.
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM partner_idempotency_keys")
            .await,
        0
    );
    let (_, me) = api.call(partner_get("/v1/partner/me", &key)).await;
    assert!(!me.to_string().contains(&secret[6..]), "{me}");
    let (status, _) = api
        .call(partner_post(
            "/v1/partner/webhook/secret/rotate",
            &key,
            &json!({"overlap_seconds": 999999999}),
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn metrics_show_each_partner_whose_webhooks_are_held_back() {
    let api = api().await;
    let failing = api.partner("failing").await;
    let gone = api.partner("gone").await;
    let healthy = api.partner("healthy").await;
    sqlx::query(
        "UPDATE partners SET webhook_failures = 5, \
         webhook_open_until = NOW(6) + INTERVAL 1 MINUTE WHERE id = ?",
    )
    .bind(failing)
    .execute(&api.env.db)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE partners SET webhook_disabled_at = NOW(6), \
         webhook_disabled_reason = 'HTTP 410 Gone' WHERE id = ?",
    )
    .bind(gone)
    .execute(&api.env.db)
    .await
    .unwrap();

    let (status, text) = api
        .call(Request::get("/metrics").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK);
    let text = text.as_str().unwrap();
    assert!(
        text.contains(&format!(
            "paybus_partner_breaker_not_closed{{partner=\"{failing}\"}} 1"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "paybus_partner_webhook_disabled{{partner=\"{gone}\"}} 1"
        )),
        "{text}"
    );
    for id in [gone, healthy] {
        assert!(
            !text.contains(&format!(
                "paybus_partner_breaker_not_closed{{partner=\"{id}\"}}"
            )),
            "{text}"
        );
    }
}
