//! The admin API through the router: the bearer token, creating and reading back partners,
//! withdrawals and deposits, and clear 4xx answers for client mistakes.

use crate::support;

use paybus_api::role::Role;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use serde_json::{Value, json};
use support::*;

async fn create(api: &Api, path: &str, body: Value) -> u64 {
    let (status, answer) = api.call(admin_post(path, &body)).await;
    assert_eq!(status, StatusCode::CREATED, "{path} {body}: {answer}");
    answer["id"].as_u64().unwrap()
}

async fn partner(api: &Api) -> u64 {
    create(
        api,
        "/v1/admin/partners",
        json!({"name": "Partner 45", "webhook_url": "http://127.0.0.1:9/hooks",
               "webhook_secret": "partner-45-signing-secret"}),
    )
    .await
}

fn withdrawal(partner_id: u64) -> Value {
    json!({"partner_id": partner_id, "kind": "NORMAL", "status": "BROADCASTING",
           "currency": "USDT", "amount": "100", "to_address": "TQn9Y2khEsLJW1ChVWFMSMeRDow5KcbLSE",
           "tx_hash": "0xf16c3335"})
}

#[tokio::test]
async fn health_needs_no_token_and_names_the_build() {
    let api = Api::new().await;
    let (status, body) = api
        .call(Request::get("/health").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"status": "ok", "version": env!("CARGO_PKG_VERSION"),
               "commit": paybus_testkit::head_commit()})
    );
}

#[tokio::test]
async fn admin_without_a_token_or_with_a_wrong_one_is_401() {
    let api = Api::new().await;
    let no_token = Request::get("/v1/admin/withdrawals/1")
        .body(Body::empty())
        .unwrap();
    let wrong = Request::post("/v1/admin/partners")
        .header(
            header::AUTHORIZATION,
            "Bearer admin-token-for-tests-0123456788",
        )
        .body(Body::from(
            r#"{"name": "x", "webhook_secret": "0123456789abcdef"}"#,
        ))
        .unwrap();
    let basic = Request::get("/v1/admin/withdrawals/1")
        .header(header::AUTHORIZATION, format!("Basic {}", admin_token()))
        .body(Body::empty())
        .unwrap();

    for (request, expected) in [
        (no_token, "missing admin token"),
        (wrong, "invalid token"),
        (basic, "missing admin token"),
    ] {
        let response = tower::ServiceExt::oneshot(api.router(), request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert!(response.headers().contains_key(header::WWW_AUTHENTICATE));
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert!(error_of(&body).starts_with(expected), "{body}");
    }
    assert_eq!(api.scalar("SELECT COUNT(*) FROM partners").await, 0);
}

#[tokio::test]
async fn expired_and_tampered_tokens_are_401_and_a_missing_role_is_403() {
    let api = Api::new().await;
    let expired = paybus_api::auth::issue(
        ADMIN_JWT_SECRET,
        "tests",
        &[Role::Admin],
        std::time::Duration::ZERO,
    )
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let ops = token(&[Role::Ops]);
    let mut tampered = ops.clone();
    tampered.pop();
    tampered.push(if ops.ends_with('A') { 'B' } else { 'A' });
    let body = r#"{"name": "x", "webhook_secret": "0123456789abcdef"}"#;
    let call = |token: String, method: &str, path: &str| {
        Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(if method == "POST" { body } else { "" }))
            .unwrap()
    };

    for (request, status, expected) in [
        (
            call(expired, "GET", "/v1/admin/audit"),
            StatusCode::UNAUTHORIZED,
            "expired token",
        ),
        (
            call(tampered, "GET", "/v1/admin/audit"),
            StatusCode::UNAUTHORIZED,
            "invalid token",
        ),
        (
            call(ops.clone(), "POST", "/v1/admin/partners"),
            StatusCode::FORBIDDEN,
            "this request needs the ADMIN role",
        ),
    ] {
        let (got, answer) = api.call(request).await;
        assert_eq!(got, status, "{answer}");
        assert_eq!(error_of(&answer), expected);
    }
    let (reads, answer) = api.call(call(ops, "GET", "/v1/admin/audit")).await;
    assert_eq!(reads, StatusCode::OK, "OPS reads: {answer}");
    assert_eq!(api.scalar("SELECT COUNT(*) FROM partners").await, 0);
}

#[tokio::test]
async fn without_a_configured_token_the_admin_api_is_disabled_with_503() {
    let api = Api::with(|config| config.admin_jwt_secret = None).await;

    let (status, body) = api.call(admin_get("/v1/admin/deposits/1")).await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(error_of(&body).starts_with("admin API disabled"), "{body}");
}

#[tokio::test]
async fn admin_creates_a_partner_a_withdrawal_and_a_deposit_and_reads_them_back() {
    let api = Api::new().await;

    let partner_id = partner(&api).await;
    let withdrawal_id = create(&api, "/v1/admin/withdrawals", withdrawal(partner_id)).await;
    let deposit_id = create(
        &api,
        "/v1/admin/deposits",
        json!({"partner_id": partner_id, "currency": "usdt", "amount": "250.5", "fee": "0.25",
               "tx_hash": "0xDEADBEEF", "to_address": "0xAbC0000000000000000000000000000000000001"}),
    )
    .await;

    let (status, p) = api
        .call(admin_get(&format!("/v1/admin/partners/{partner_id}")))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(p["name"], "Partner 45");
    assert_eq!(p["webhook_url"], "http://127.0.0.1:9/hooks");
    assert!(
        p.get("webhook_secret").is_none(),
        "the secret is write-only: {p}"
    );

    let (status, w) = api
        .call(admin_get(&format!("/v1/admin/withdrawals/{withdrawal_id}")))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(w["id"], withdrawal_id);
    assert_eq!(w["partner_id"], partner_id);
    assert_eq!(w["kind"], "NORMAL");
    assert_eq!(w["status"], "BROADCASTING");
    assert_eq!(w["currency"], "USDT");
    assert_eq!(w["amount"], "100");
    assert_eq!(w["tx_hash"], "0xf16c3335");
    assert_eq!(w["confirmed_at"], Value::Null);
    assert_eq!(
        w["history"],
        json!([{"from_status": null, "to_status": "BROADCASTING",
                "reason": "created by the admin API", "created_at": w["history"][0]["created_at"]}])
    );

    let (status, d) = api
        .call(admin_get(&format!("/v1/admin/deposits/{deposit_id}")))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(d["status"], "DETECTED");
    assert_eq!(d["currency"], "USDT");
    assert_eq!(d["amount"], "250.5");
    assert_eq!(d["fee"], "0.25");
    assert_eq!(d["tx_hash"], "0xdeadbeef", "hex is lower-cased");
    assert_eq!(
        d["to_address"],
        "0xabc0000000000000000000000000000000000001"
    );
}

#[tokio::test]
async fn creating_a_partner_is_logged_with_who_and_never_its_secret() {
    let api = Api::new().await;
    let (status, _) = api
        .call(admin_post(
            "/v1/admin/partners",
            &json!({"name": "p", "webhook_secret": "short"}),
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let partner_id = partner(&api).await;

    assert_eq!(
        api.ops_actions().await,
        [logged(
            "tests (break-glass)",
            "partner.create",
            &format!("partner:{partner_id}")
        )],
        "the refused one is not logged"
    );
    let entry = &api.ops_log().await[0];
    assert_eq!(
        entry["detail"],
        json!({"name": "Partner 45", "webhook_url": "http://127.0.0.1:9/hooks"})
    );
    assert!(
        !entry.to_string().contains("partner-45-signing-secret"),
        "{entry}"
    );
}

#[tokio::test]
async fn amounts_are_kept_exactly_over_the_whole_column() {
    let api = Api::new().await;
    let partner_id = partner(&api).await;
    for amount in [
        "999999999999999999.999999999999999999",
        "123456789012345678.000000000000000001",
        "0.000000000000000001",
    ] {
        let mut body = withdrawal(partner_id);
        body["amount"] = json!(amount);
        let id = create(&api, "/v1/admin/withdrawals", body).await;

        let stored: String =
            sqlx::query_scalar("SELECT CAST(amount AS CHAR) FROM withdrawals WHERE id = ?")
                .bind(id)
                .fetch_one(&api.env.db)
                .await
                .unwrap();
        let (status, shown) = api
            .call(admin_get(&format!("/v1/admin/withdrawals/{id}")))
            .await;

        assert_eq!(stored.trim_end_matches('0').trim_end_matches('.'), amount);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(shown["amount"], amount, "{shown}");
    }
    // One digit beyond the column is refused, never rounded.
    let mut body = withdrawal(partner_id);
    body["amount"] = json!("1999999999999999999.5");
    let (status, answer) = api.call(admin_post("/v1/admin/withdrawals", &body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(error_of(&answer).contains("18 digits before"), "{answer}");
}

#[tokio::test]
async fn a_bad_amount_is_400_with_the_reason() {
    let api = Api::new().await;
    let partner_id = partner(&api).await;
    for (amount, expected) in [
        (
            json!("abc"),
            "amount: \"abc\" is not a plain decimal number",
        ),
        (
            json!(100.5),
            "amount: invalid type: floating point `100.5`, expected a decimal amount as a string",
        ),
        (json!("-5"), "amount: \"-5\" is negative"),
        (json!("0"), "amount must be greater than 0"),
        (
            json!("1.0000000000000000001"),
            "more than 18 decimal places",
        ),
    ] {
        let mut body = withdrawal(partner_id);
        body["amount"] = amount.clone();
        let (status, answer) = api.call(admin_post("/v1/admin/withdrawals", &body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{amount}: {answer}");
        assert!(error_of(&answer).contains(expected), "{amount}: {answer}");
    }
    let (status, answer) = api
        .call(admin_post(
            "/v1/admin/deposits",
            &json!({"partner_id": partner_id, "currency": "USDT", "amount": "1", "fee": "2",
                    "tx_hash": "0x01", "to_address": "T1"}),
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&answer), "fee must not exceed amount");
    assert_eq!(api.scalar("SELECT COUNT(*) FROM withdrawals").await, 0);
    assert_eq!(api.scalar("SELECT COUNT(*) FROM deposits").await, 0);
}

#[tokio::test]
async fn a_bad_kind_status_or_field_is_400_naming_it() {
    let api = Api::new().await;
    let partner_id = partner(&api).await;
    let with = |key: &str, value: Value| {
        let mut body = withdrawal(partner_id);
        body[key] = value;
        body
    };
    for (body, expected) in [
        (
            with("kind", json!("P2P")),
            "kind: unknown variant `P2P`, expected one of `NORMAL`",
        ),
        (
            with("status", json!("broadcasting")),
            "status: unknown variant `broadcasting`",
        ),
        (
            with("status", json!("CONFIRMED")),
            "CONFIRMED and FAILED are reached only through the workflow",
        ),
        (with("stauts", json!("STALE")), "unknown field `stauts`"),
        (with("currency", json!("US DT")), "currency must be"),
        (
            with("to_address", json!("")),
            "to_address must not be empty",
        ),
        (with("partner_id", json!("7")), "partner_id: invalid type"),
    ] {
        let (status, answer) = api.call(admin_post("/v1/admin/withdrawals", &body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(error_of(&answer).contains(expected), "{body}: {answer}");
    }
    let (status, answer) = api
        .call(admin_post(
            "/v1/admin/partners",
            &json!({"name": "p", "webhook_url": "ftp://x", "webhook_secret": "0123456789abcdef"}),
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        error_of(&answer).starts_with("webhook_url must be"),
        "{answer}"
    );
    let (status, answer) = api
        .call(admin_post(
            "/v1/admin/partners",
            &json!({"name": "p", "webhook_secret": "short"}),
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        error_of(&answer).starts_with("webhook_secret must be"),
        "{answer}"
    );
}

#[tokio::test]
async fn an_unknown_partner_is_404_not_500() {
    let api = Api::new().await;

    let (status, answer) = api
        .call(admin_post("/v1/admin/withdrawals", &withdrawal(424242)))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_eq!(error_of(&answer), "partner 424242 not found");

    let (status, answer) = api
        .call(admin_post(
            "/v1/admin/deposits",
            &json!({"partner_id": 424242, "currency": "USDT", "amount": "1",
                    "tx_hash": "0x01", "to_address": "T1"}),
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_eq!(error_of(&answer), "partner 424242 not found");
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM withdrawal_status_history")
            .await,
        0
    );
}

#[tokio::test]
async fn a_second_active_deposit_for_the_same_tx_and_address_is_409() {
    let api = Api::new().await;
    let partner_id = partner(&api).await;
    let deposit = json!({"partner_id": partner_id, "currency": "USDT", "amount": "10",
                         "tx_hash": "0xAA01", "to_address": "T1"});
    let first = create(&api, "/v1/admin/deposits", deposit.clone()).await;

    // Same tx in another hex case: the same deposit.
    let mut again = deposit;
    again["tx_hash"] = json!("0xaa01");
    let (status, answer) = api.call(admin_post("/v1/admin/deposits", &again)).await;

    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert!(
        error_of(&answer).contains(&format!("(deposit {first})")),
        "{answer}"
    );
    assert_eq!(api.scalar("SELECT COUNT(*) FROM deposits").await, 1);
}

#[tokio::test]
async fn unknown_ids_are_404_and_bad_ids_400() {
    let api = Api::new().await;
    for (path, status) in [
        ("/v1/admin/withdrawals/999", StatusCode::NOT_FOUND),
        ("/v1/admin/deposits/999", StatusCode::NOT_FOUND),
        ("/v1/admin/partners/999", StatusCode::NOT_FOUND),
        ("/v1/admin/withdrawals/abc", StatusCode::BAD_REQUEST),
        ("/v1/admin/deposits/0", StatusCode::BAD_REQUEST),
        ("/v1/nothing-here", StatusCode::NOT_FOUND),
    ] {
        let (got, answer) = api.call(admin_get(path)).await;
        assert_eq!(got, status, "{path}: {answer}");
        assert!(!error_of(&answer).is_empty());
    }
}

#[tokio::test]
async fn the_audit_endpoint_reports_clean_then_a_planted_double_debit() {
    let api = Api::new().await;
    let (status, body) = api.call(admin_get("/v1/admin/audit")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["clean"], json!(true));

    for sql in [
        "INSERT INTO partners (id, name) VALUES (45, 'p45')",
        "INSERT INTO partner_balances (partner_id, currency, balance) VALUES (45, 'USDT', -100)",
        "INSERT INTO ledger_entries (partner_id, currency, entry_type, amount, balance_after, \
         reference_type, reference_id, idem_key) \
         VALUES (45, 'USDT', 'DEBIT', 100, -100, 'WITHDRAWAL', 1989, 'WDR_CONFIRM:1989')",
        "INSERT INTO ledger_entries (partner_id, currency, entry_type, amount, balance_after, \
         reference_type, reference_id, idem_key) \
         VALUES (45, 'USDT', 'DEBIT', 100, -200, 'WITHDRAWAL', 1989, NULL)",
    ] {
        sqlx::query(sql).execute(&api.env.db).await.unwrap();
    }
    let (status, body) = api.call(admin_get("/v1/admin/audit")).await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["clean"], json!(false), "{body}");
    // The unkeyed second DEBIT left the balance row behind its entries, and the keyed one
    // names a withdrawal that does not exist: each check reports its own finding.
    assert_eq!(
        body["violations"],
        json!([
            {
                "check": "balance_mismatch",
                "description": "balance_mismatch: partner 45 USDT balance is -100.000000000000000000 but its entries sum to -200.000000000000000000",
                "partner_id": 45,
                "currency": "USDT",
                "balance": "-100.000000000000000000",
                "entries_sum": "-200.000000000000000000",
            },
            {
                "check": "unexpected_withdrawal_debit",
                "description": "unexpected_withdrawal_debit: entry 1 is a confirmation DEBIT of withdrawal 1989, which does not exist",
                "entry_id": 1,
                "withdrawal_id": 1989,
                "kind": null,
                "status": null,
            },
        ]),
        "{body}"
    );
}

#[tokio::test]
async fn a_partner_created_without_a_secret_gets_a_whsec_secret_once_sealed_at_rest() {
    let api = Api::new().await;

    let (status, created) = api
        .call(admin_post(
            "/v1/admin/partners",
            &json!({"name": "acme", "webhook_url": "https://acme.example/hooks"}),
        ))
        .await;
    let given = create(
        &api,
        "/v1/admin/partners",
        json!({"name": "globex", "webhook_secret": "globex-legacy-secret-01"}),
    )
    .await;

    assert_eq!(status, StatusCode::CREATED, "{created}");
    let secret = created["webhook_secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"), "{created}");
    let id = created["id"].as_u64().unwrap();
    let (_, shown) = api
        .call(admin_get(&format!("/v1/admin/partners/{id}")))
        .await;
    assert!(!shown.to_string().contains(secret), "{shown}");
    assert_eq!(shown["webhook_disabled"], Value::Null);
    let (_, shown_given) = api
        .call(admin_get(&format!("/v1/admin/partners/{given}")))
        .await;
    assert!(shown_given.get("webhook_secret").is_none());
    let stored: (Option<String>, i64) = sqlx::query_as(
        "SELECT MAX(p.webhook_secret), COUNT(s.id) FROM partners p \
         JOIN partner_webhook_secrets s ON s.partner_id = p.id",
    )
    .fetch_one(&api.env.db)
    .await
    .unwrap();
    assert_eq!(stored, (None, 2), "sealed, one secret each, no plaintext");
}

#[tokio::test]
async fn without_a_secrets_key_creating_a_partner_is_503() {
    let api = Api::with(|config| config.sealer = None).await;

    let (status, answer) = api
        .call(admin_post("/v1/admin/partners", &json!({"name": "acme"})))
        .await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert!(error_of(&answer).contains("PAYBUS_SECRETS_KEY"), "{answer}");
}
