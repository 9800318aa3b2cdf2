//! W3 through the router: payment completions from every gateway (signed, one code path,
//! idempotent, every client mistake a 4xx), the admin views of bonus jobs with ops' retry, and
//! the members, charges and events ops set up.

use crate::support;

use axum::{
    body::Body,
    http::{Request, StatusCode},
};
use paybus_api::role::Role;
use paybus_bonuses::charge::{Container, PaymentGateway};
use paybus_testkit::{
    bonuses::{self, Purchase, assert_audit_clean},
    tap,
};
use serde_json::{Value, json};
use support::*;

/// The gateway's path segment.
fn path_of(gateway: PaymentGateway) -> &'static str {
    match gateway {
        PaymentGateway::Pg => "pg",
        PaymentGateway::Payverse => "payverse",
        PaymentGateway::Hecto => "hecto",
        PaymentGateway::GoogleIap => "google-iap",
        PaymentGateway::AppleIap => "apple-iap",
    }
}

fn completion_body(purchase: &Purchase) -> String {
    let paid = purchase.paid();
    json!({"charge_id": paid.charge_id, "gateway_tx_id": paid.gateway_tx_id,
           "amount": paid.amount.to_string()})
    .to_string()
}

/// A POST signed by the payment service.
fn payment(path: &str, body: &str) -> Request<Body> {
    signed_at(path, body, PAYMENTS_SECRET, now())
}

async fn purchase(api: &Api, gateway: PaymentGateway, cans: i32) -> Purchase {
    let member = bonuses::member(&api.env.db).await;
    bonuses::purchase(&api.env.db, member, gateway, cans).await
}

#[tokio::test]
async fn every_gateway_s_webhook_and_verify_complete_through_one_transition() {
    let api = Api::without_four_eyes().await;
    bonuses::active_event(&api.env.db, "api 10%", 10, 9).await;
    let mut answers = Vec::new();
    for gateway in [
        PaymentGateway::Pg,
        PaymentGateway::Payverse,
        PaymentGateway::Hecto,
        PaymentGateway::GoogleIap,
        PaymentGateway::AppleIap,
    ] {
        for (first, then) in [("verify", "webhook"), ("webhook", "verify")] {
            let purchase = purchase(&api, gateway, 100).await;
            let body = completion_body(&purchase);
            let gateway_path = path_of(gateway);
            let completed = api
                .call(payment(
                    &format!("/v1/payments/{gateway_path}/{first}"),
                    &body,
                ))
                .await;
            let repeated = api
                .call(payment(
                    &format!("/v1/payments/{gateway_path}/{then}"),
                    &body,
                ))
                .await;
            let container = gateway.default_container();
            answers.push((
                gateway,
                completed,
                repeated,
                bonuses::cans(&api.env.db, purchase.member_id, container).await,
                container,
            ));
        }
    }

    for (gateway, (status, completed), (again, repeated), cans, container) in answers {
        assert_eq!(status, StatusCode::OK, "{gateway}: {completed}");
        assert_eq!(completed["completed_now"], true, "{gateway}");
        assert_eq!(completed["payment_gateway"], gateway.as_str());
        assert_eq!(completed["container"], container.as_str());
        assert_eq!(
            completed["bonus_jobs"][0]["job_type"],
            "ACTIVE_CHARGE_EVENT"
        );
        assert_eq!(completed["bonus_jobs"][0]["additional_can"], 10);
        assert_eq!(again, StatusCode::OK, "{gateway}: {repeated}");
        assert_eq!(repeated["completed_now"], false);
        let mut same = repeated.clone();
        same["completed_now"] = true.into();
        assert_eq!(same, completed, "{gateway}: the original result");
        assert_eq!(cans, 100, "{gateway}: credited once");
    }
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM charge_event_job").await,
        10
    );
    assert_audit_clean(&api.env.db).await;
}

#[tokio::test]
async fn a_payment_call_is_signed_and_a_client_mistake_is_a_4xx_that_writes_nothing() {
    let api = Api::without_four_eyes().await;
    let charge = purchase(&api, PaymentGateway::Pg, 100).await;
    let good = completion_body(&charge);
    let path = "/v1/payments/pg/verify";
    let with = |change: Value| {
        let mut body: Value = serde_json::from_str(&good).unwrap();
        for (field, value) in change.as_object().unwrap() {
            body[field] = value.clone();
        }
        body.to_string()
    };

    let cases = [
        ("unsigned", unsigned(path, &good), StatusCode::UNAUTHORIZED),
        (
            "signed with the chain monitor's secret",
            signed_at(path, &good, MONITOR_SECRET, now()),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "stale",
            signed_at(path, &good, PAYMENTS_SECRET, now() - 3_600),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "unknown gateway",
            payment("/v1/payments/paypal/verify", &good),
            StatusCode::NOT_FOUND,
        ),
        (
            "not JSON",
            payment(path, "charge 1 is paid"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "unknown field",
            payment(path, &with(json!({"amout": "1"}))),
            StatusCode::BAD_REQUEST,
        ),
        (
            "amount as a number",
            payment(path, &with(json!({"amount": 10000}))),
            StatusCode::BAD_REQUEST,
        ),
        (
            "negative amount",
            payment(path, &with(json!({"amount": "-10000"}))),
            StatusCode::BAD_REQUEST,
        ),
        (
            "empty gateway_tx_id",
            payment(path, &with(json!({"gateway_tx_id": ""}))),
            StatusCode::BAD_REQUEST,
        ),
        (
            "charge 0",
            payment(path, &with(json!({"charge_id": 0}))),
            StatusCode::BAD_REQUEST,
        ),
        (
            "unknown charge",
            payment(path, &with(json!({"charge_id": 987_654}))),
            StatusCode::NOT_FOUND,
        ),
        (
            "another amount",
            payment(path, &with(json!({"amount": "100"}))),
            StatusCode::CONFLICT,
        ),
        (
            "another gateway",
            payment("/v1/payments/hecto/verify", &good),
            StatusCode::CONFLICT,
        ),
    ];
    let mut answers = Vec::new();
    for (case, request, expected) in cases {
        let (status, body) = api.call(request).await;
        answers.push((case, status, expected, body));
    }
    let disabled = Api::with(|config| config.payments_secret = None).await;
    let (closed, _) = disabled.call(payment(path, &good)).await;

    for (case, status, expected, body) in answers {
        assert_eq!(status, expected, "{case}: {body}");
        assert!(!error_of(&body).is_empty(), "{case}");
    }
    assert_eq!(closed, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM charges WHERE payment_status = 'COMPLETE'")
            .await,
        0,
        "nothing completed"
    );
    assert_eq!(
        bonuses::cans(&api.env.db, charge.member_id, Container::Pg).await,
        0
    );
    // And the right call still completes it.
    let (status, _) = api.call(payment(path, &good)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_replayed_receipt_for_another_charge_is_refused() {
    let api = Api::without_four_eyes().await;
    let first = purchase(&api, PaymentGateway::AppleIap, 100).await;
    let second = purchase(&api, PaymentGateway::AppleIap, 100).await;
    let (status, _) = api
        .call(payment(
            "/v1/payments/apple-iap/verify",
            &completion_body(&first),
        ))
        .await;
    assert_eq!(status, StatusCode::OK);

    let replay = json!({"charge_id": second.id, "gateway_tx_id": first.paid().gateway_tx_id,
                        "amount": second.price.to_string()})
    .to_string();
    let (status, body) = api
        .call(payment("/v1/payments/apple-iap/verify", &replay))
        .await;

    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        error_of(&body).contains(&format!("already completed charge {}", first.id)),
        "{body}"
    );
    assert_eq!(
        bonuses::cans(&api.env.db, second.member_id, Container::Ios).await,
        0
    );
}

/// One job in each state: PENDING (due later), PROCESSING, DONE and FAILED. Returns their ids.
async fn jobs_in_every_state(api: &Api) -> [u64; 4] {
    bonuses::active_event(&api.env.db, "admin views", 10, 9).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let charge = purchase(api, PaymentGateway::Pg, 100).await;
        let (status, answer) = api
            .call(payment("/v1/payments/pg/verify", &completion_body(&charge)))
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        ids.push(answer["bonus_jobs"][0]["job_id"].as_u64().unwrap());
    }
    let [pending, processing, done, failed] = ids[..] else {
        unreachable!()
    };
    for (id, sql) in [
        (
            pending,
            "UPDATE charge_event_job SET next_retry_at = NOW(6) + INTERVAL 5 MINUTE, \
             last_error = 'gateway timeout' WHERE id = ?",
        ),
        (
            processing,
            "UPDATE charge_event_job SET status = 'PROCESSING', processing_started_at = NOW(6) \
             WHERE id = ?",
        ),
        (
            failed,
            "UPDATE charge_event_job SET status = 'FAILED', retry_count = 3, \
             last_error = 'injected' WHERE id = ?",
        ),
    ] {
        sqlx::query(sql)
            .bind(id)
            .execute(&api.env.db)
            .await
            .unwrap();
    }
    // DONE as grant-bonus leaves it: its EVENT charge and the credit.
    let member: u64 = sqlx::query_scalar("SELECT member_id FROM charge_event_job WHERE id = ?")
        .bind(done)
        .fetch_one(&api.env.db)
        .await
        .unwrap();
    let charge_id = sqlx::query(
        "INSERT INTO charges (member_id, status, cans, payment_gateway, container, method, \
                              payment_status, completed_at) \
         VALUES (?, 'EVENT', 10, 'PG', 'pg', 'admin views', 'COMPLETE', NOW(6))",
    )
    .bind(member)
    .execute(&api.env.db)
    .await
    .unwrap()
    .last_insert_id();
    sqlx::query("UPDATE members SET pg_can = pg_can + 10 WHERE id = ?")
        .bind(member)
        .execute(&api.env.db)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE charge_event_job SET status = 'DONE', result_charge_id = ?, \
         processed_at = NOW(6) WHERE id = ?",
    )
    .bind(charge_id)
    .bind(done)
    .execute(&api.env.db)
    .await
    .unwrap();
    [pending, processing, done, failed]
}

fn ids(list: &Value) -> Vec<u64> {
    list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["id"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn the_job_list_shows_pending_and_failed_jobs_with_the_seed_s_fields() {
    let api = Api::without_four_eyes().await;
    let [pending, _processing, _done, failed] = jobs_in_every_state(&api).await;
    let ops = |path: &str| with_roles("GET", path, &[Role::Ops]);

    let (status, all) = api.call(ops("/v1/admin/charge-event-jobs")).await;
    let (_, only_failed) = api
        .call(ops("/v1/admin/charge-event-jobs?status=FAILED"))
        .await;
    let (_, first_page) = api.call(ops("/v1/admin/charge-event-jobs?limit=1")).await;
    let after = first_page["next_after_id"].as_u64().unwrap();
    let (_, second_page) = api
        .call(ops(&format!(
            "/v1/admin/charge-event-jobs?limit=1&after_id={after}"
        )))
        .await;
    let (_, third_page) = api
        .call(ops(&format!(
            "/v1/admin/charge-event-jobs?limit=1&after_id={}",
            second_page["next_after_id"].as_u64().unwrap()
        )))
        .await;

    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(ids(&all), [pending, failed], "never DONE or PROCESSING");
    assert_eq!(all["next_after_id"], Value::Null);
    let job = &all["jobs"][1];
    for field in [
        "id",
        "source_charge_id",
        "result_charge_id",
        "member_id",
        "charge_event_id",
        "job_type",
        "additional_can",
        "status",
        "retry_count",
        "next_retry_at",
        "last_error",
        "created_at",
        "updated_at",
    ] {
        assert!(job.get(field).is_some(), "{field} missing from {job}");
    }
    assert_eq!(
        (&job["status"], &job["retry_count"], &job["last_error"]),
        (&json!("FAILED"), &json!(3), &json!("injected"))
    );
    assert_eq!(ids(&only_failed), [failed]);
    assert_eq!(
        (ids(&first_page), ids(&second_page), ids(&third_page)),
        (vec![pending], vec![failed], vec![])
    );
    assert_eq!(third_page["next_after_id"], Value::Null);
}

#[tokio::test]
async fn the_job_list_refuses_what_it_never_shows_and_malformed_queries() {
    let api = Api::without_four_eyes().await;
    for query in [
        "status=DONE",
        "status=PROCESSING",
        "status=done",
        "limit=0",
        "limit=501",
        "after_id=-1",
        "page=2",
    ] {
        let (status, body) = api
            .call(admin_get(&format!("/v1/admin/charge-event-jobs?{query}")))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert!(!error_of(&body).is_empty());
    }
    let (status, _) = api.call(admin_get("/v1/admin/charge-event-jobs/77")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn retrying_a_failed_job_makes_it_due_now_and_publishes_its_message_at_once() {
    let api = Api::without_four_eyes().await;
    let tap = tap(&api.services, "tap.bonus-jobs", "charge.bonus_job.created").await;
    let [_, _, _, failed] = jobs_in_every_state(&api).await;
    let completions = tap_count(&tap, "tap.bonus-jobs", 4).await;

    let (status, job) = api
        .call(admin_post(
            &format!("/v1/admin/charge-event-jobs/{failed}/retry"),
            &Value::Null,
        ))
        .await;

    assert_eq!(completions, 4, "one message per completion's job");
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(job["status"], "PENDING");
    assert_eq!(job["retry_count"], 3, "the failures stay on record");
    assert!(job["next_retry_at"].is_string());
    let due_now = api
        .scalar("SELECT COUNT(*) FROM charge_event_job WHERE status = 'PENDING' AND next_retry_at <= NOW(6)")
        .await;
    assert_eq!(due_now, 1);
    assert_eq!(
        tap_count(&tap, "tap.bonus-jobs", 5).await,
        5,
        "published at once"
    );
    assert_eq!(
        api.ops_actions().await,
        [logged(
            "tests (break-glass)",
            "bonus_job.retry",
            &format!("charge_event_job:{failed}")
        )]
    );
    assert_eq!(api.ops_log().await[0]["detail"]["last_error"], "injected");
}

#[tokio::test]
async fn retrying_a_job_that_is_not_failed_is_a_conflict_and_changes_nothing() {
    let api = Api::without_four_eyes().await;
    let [pending, processing, done, _] = jobs_in_every_state(&api).await;
    let rows = || async {
        sqlx::query_as::<_, (u64, String, i32, Option<String>)>(
            "SELECT id, status, retry_count, CAST(next_retry_at AS CHAR) FROM charge_event_job \
             ORDER BY id",
        )
        .fetch_all(&api.env.db)
        .await
        .unwrap()
    };
    let before = rows().await;
    let messages = api.scalar("SELECT COUNT(*) FROM outbox_messages").await;

    let mut answers = Vec::new();
    for (id, state) in [
        (pending, "PENDING"),
        (processing, "PROCESSING"),
        (done, "DONE"),
    ] {
        let (status, body) = api
            .call(admin_post(
                &format!("/v1/admin/charge-event-jobs/{id}/retry"),
                &Value::Null,
            ))
            .await;
        answers.push((state, status, body));
    }
    let (missing, _) = api
        .call(admin_post(
            "/v1/admin/charge-event-jobs/999/retry",
            &Value::Null,
        ))
        .await;

    for (state, status, body) in answers {
        assert_eq!(status, StatusCode::CONFLICT, "{state}: {body}");
        assert!(
            error_of(&body).contains(&format!("is {state}, not FAILED")),
            "{body}"
        );
    }
    assert_eq!(missing, StatusCode::NOT_FOUND);
    assert_eq!(rows().await, before, "nothing changed");
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM outbox_messages").await,
        messages,
        "nothing published"
    );
    assert_eq!(api.ops_actions().await, [], "nothing logged");
}

#[tokio::test]
async fn job_views_need_ops_and_a_retry_needs_admin() {
    let api = Api::without_four_eyes().await;
    let [_, _, _, failed] = jobs_in_every_state(&api).await;
    let retry = format!("/v1/admin/charge-event-jobs/{failed}/retry");

    let (list_as_ops, _) = api
        .call(with_roles(
            "GET",
            "/v1/admin/charge-event-jobs",
            &[Role::Ops],
        ))
        .await;
    let (retry_as_ops, body) = api.call(with_roles("POST", &retry, &[Role::Ops])).await;
    let (no_token, _) = api
        .call(
            Request::get("/v1/admin/charge-event-jobs")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    let (retry_as_admin, _) = api.call(with_roles("POST", &retry, &[Role::Admin])).await;

    assert_eq!(list_as_ops, StatusCode::OK);
    assert_eq!(retry_as_ops, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(no_token, StatusCode::UNAUTHORIZED);
    assert_eq!(retry_as_admin, StatusCode::OK);
}

#[tokio::test]
async fn ops_set_up_members_charges_and_events_and_read_them_back() {
    let api = Api::without_four_eyes().await;
    let created = |path: &'static str, body: Value| {
        let api = &api;
        async move {
            let (status, answer) = api.call(admin_post(path, &body)).await;
            assert_eq!(status, StatusCode::CREATED, "{path} {body}: {answer}");
            answer["id"].as_u64().unwrap()
        }
    };
    let member = created("/v1/admin/members", json!({"nickname": "soda"})).await;
    let charge = created(
        "/v1/admin/charges",
        json!({"member_id": member, "cans": 300, "price": "3300", "payment_gateway": "GOOGLE_IAP",
               "method": "google play"}),
    )
    .await;
    let now = chrono::Utc::now();
    let event = created(
        "/v1/admin/charge-events",
        json!({"title": "grand opening", "add_percent": 50,
               "start_at": (now - chrono::Duration::hours(1)).to_rfc3339(),
               "end_at": (now + chrono::Duration::hours(1)).to_rfc3339()}),
    )
    .await;
    let body = json!({"charge_id": charge, "gateway_tx_id": "GPA.3301-2945", "amount": "3300"})
        .to_string();
    let (status, completed) = api
        .call(payment("/v1/payments/google-iap/webhook", &body))
        .await;

    let (_, member_view) = api
        .call(admin_get(&format!("/v1/admin/members/{member}")))
        .await;
    let (_, charge_view) = api
        .call(admin_get(&format!("/v1/admin/charges/{charge}")))
        .await;
    let (_, event_view) = api
        .call(admin_get(&format!("/v1/admin/charge-events/{event}")))
        .await;

    assert_eq!(status, StatusCode::OK, "{completed}");
    assert_eq!(member_view["aos_can"], 300);
    assert_eq!(charge_view["payment_status"], "COMPLETE");
    assert_eq!(charge_view["container"], "aos");
    assert_eq!(charge_view["price"], "3300");
    assert_eq!(charge_view["bonus_jobs"][0]["additional_can"], 150);
    assert_eq!(
        charge_view["bonus_jobs"][0]["method_snapshot"],
        "grand opening"
    );
    assert_eq!(event_view["available_count"], 1);
    assert_eq!(event_view["is_active"], true);
}

#[tokio::test]
async fn setting_up_with_bad_values_is_a_400_naming_the_field() {
    let api = Api::without_four_eyes().await;
    let member = bonuses::member(&api.env.db).await;
    let now = chrono::Utc::now();
    let cases = [
        ("/v1/admin/members", json!({"nickname": "  "}), "nickname"),
        (
            "/v1/admin/charges",
            json!({"member_id": member, "cans": 0, "price": "1", "payment_gateway": "PG",
                   "method": "card"}),
            "cans",
        ),
        (
            "/v1/admin/charges",
            json!({"member_id": member, "cans": 1, "price": "1", "payment_gateway": "PAYPAL",
                   "method": "card"}),
            "payment_gateway",
        ),
        (
            "/v1/admin/charges",
            json!({"member_id": member, "cans": 1, "price": "1", "payment_gateway": "PG",
                   "container": "PG", "method": "card"}),
            "container",
        ),
        (
            "/v1/admin/charge-events",
            json!({"title": "x", "add_percent": 0, "start_at": now.to_rfc3339(),
                   "end_at": now.to_rfc3339()}),
            "add_percent",
        ),
        (
            "/v1/admin/charge-events",
            json!({"title": "x", "add_percent": 10, "start_at": now.to_rfc3339(),
                   "end_at": now.to_rfc3339()}),
            "end_at",
        ),
        (
            "/v1/admin/charge-events",
            json!({"title": "x", "add_percent": 10, "start_at": now.to_rfc3339(),
                   "end_at": "2099-01-01T00:00:00Z"}),
            "end_at",
        ),
    ];
    for (path, body, field) in cases {
        let (status, answer) = api.call(admin_post(path, &body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {answer}");
        assert!(error_of(&answer).contains(field), "{field}: {answer}");
    }
    let (status, _) = api
        .call(admin_post(
            "/v1/admin/charges",
            &json!({"member_id": 4242, "cans": 1, "price": "1", "payment_gateway": "PG",
                    "method": "card"}),
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "an unknown member");
}
