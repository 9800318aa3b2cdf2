//! Chain-monitor intake through the router: authentication, validation, and the outbox row
//! that carries each accepted confirmation to the bus.

use crate::support;

use axum::http::StatusCode;
use paybus_config::signature;
use paybus_testkit::tap;
use serde_json::{Value, json};
use support::*;

#[derive(Debug, sqlx::FromRow)]
struct OutboxRow {
    message_id: String,
    routing_key: String,
    body: Vec<u8>,
}

async fn outbox_rows(api: &Api) -> Vec<OutboxRow> {
    sqlx::query_as("SELECT message_id, routing_key, body FROM outbox_messages ORDER BY id")
        .fetch_all(&api.env.db)
        .await
        .unwrap()
}

fn envelope(row: &OutboxRow) -> Value {
    serde_json::from_slice(&row.body).unwrap()
}

async fn assert_nothing_queued(api: &Api) {
    assert_eq!(api.scalar("SELECT COUNT(*) FROM outbox_messages").await, 0);
}

#[tokio::test]
async fn a_signed_withdrawal_confirmation_is_accepted_into_the_outbox_and_published() {
    let api = Api::new().await;
    let tap = tap(&api.services, "tap.withdrawal", "withdrawal.tx_confirmed").await;
    let body = r#"{"withdrawal_id": 1989, "tx_hash": "0xf16c3335"}"#;

    let (status, answer) = api.call(signed(WITHDRAWAL_CONFIRMATIONS, body)).await;

    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["accepted"], true);
    let rows = outbox_rows(&api).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].routing_key, "withdrawal.tx_confirmed");
    assert_eq!(answer["message_id"], rows[0].message_id.as_str());
    let envelope = envelope(&rows[0]);
    assert_eq!(envelope["type"], "withdrawal.tx_confirmed");
    assert_eq!(envelope["id"], rows[0].message_id.as_str());
    assert_eq!(
        envelope["data"],
        json!({"withdrawal_id": 1989, "tx_hash": "0xf16c3335"})
    );
    assert_eq!(tap_count(&tap, "tap.withdrawal", 1).await, 1);
}

#[tokio::test]
async fn a_valid_duplicate_is_accepted_again_and_left_to_the_idempotent_consumer() {
    let api = Api::new().await;
    let tap = tap(&api.services, "tap.duplicate", "withdrawal.tx_confirmed").await;
    let body = r#"{"withdrawal_id": 1989, "tx_hash": "0xf16c3335"}"#;

    let (first, a) = api.call(signed(WITHDRAWAL_CONFIRMATIONS, body)).await;
    let (second, b) = api.call(signed(WITHDRAWAL_CONFIRMATIONS, body)).await;

    assert_eq!(
        (first, second),
        (StatusCode::ACCEPTED, StatusCode::ACCEPTED)
    );
    assert_ne!(a["message_id"], b["message_id"]);
    let rows = outbox_rows(&api).await;
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .all(|r| envelope(r)["data"]["withdrawal_id"] == 1989)
    );
    assert_eq!(tap_count(&tap, "tap.duplicate", 2).await, 2);
}

#[tokio::test]
async fn a_signed_deposit_confirmation_is_accepted_as_deposit_tx_confirmed() {
    let api = Api::new().await;

    let (status, answer) = api
        .call(signed(DEPOSIT_CONFIRMATIONS, r#"{"deposit_id": 7}"#))
        .await;

    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let rows = outbox_rows(&api).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].routing_key, "deposit.tx_confirmed");
    assert_eq!(envelope(&rows[0])["data"], json!({"deposit_id": 7}));
}

#[tokio::test]
async fn hex_tx_hashes_are_queued_lower_cased() {
    let api = Api::new().await;
    let body = r#"{"withdrawal_id": 5, "tx_hash": "0xABCDEF01"}"#;

    let (status, _) = api.call(signed(WITHDRAWAL_CONFIRMATIONS, body)).await;

    assert_eq!(status, StatusCode::ACCEPTED);
    let rows = outbox_rows(&api).await;
    assert_eq!(envelope(&rows[0])["data"]["tx_hash"], "0xabcdef01");
}

#[tokio::test]
async fn a_bad_signature_is_refused_with_401_and_queues_nothing() {
    let api = Api::new().await;
    let body = r#"{"withdrawal_id": 1989, "tx_hash": "0xf16c3335"}"#;

    let wrong_secret = signed_at(
        WITHDRAWAL_CONFIRMATIONS,
        body,
        "not-the-monitor-secret",
        now(),
    );
    let (status, answer) = api.call(wrong_secret).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        error_of(&answer).contains("signature does not match"),
        "{answer}"
    );

    // Signed for one body, sent with another (a tampered amount of confirmations).
    let mut tampered = signed(WITHDRAWAL_CONFIRMATIONS, body);
    *tampered.body_mut() = r#"{"withdrawal_id": 1990, "tx_hash": "0xf16c3335"}"#.into();
    let (status, _) = api.call(tampered).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let mut garbled = unsigned(WITHDRAWAL_CONFIRMATIONS, body);
    garbled
        .headers_mut()
        .insert(signature::HEADER, "v1=deadbeef".parse().unwrap());
    let (status, answer) = api.call(garbled).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(error_of(&answer).contains("malformed"), "{answer}");

    assert_nothing_queued(&api).await;
}

#[tokio::test]
async fn a_missing_signature_is_refused_with_401() {
    let api = Api::new().await;

    let (status, answer) = api
        .call(unsigned(DEPOSIT_CONFIRMATIONS, r#"{"deposit_id": 7}"#))
        .await;

    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(error_of(&answer), "missing X-Paybus-Signature header");
    assert_nothing_queued(&api).await;
}

#[tokio::test]
async fn a_stale_signature_is_refused_with_401_saying_it_is_stale() {
    let api = Api::new().await;
    let body = r#"{"deposit_id": 7}"#;
    let ten_minutes_ago = now() - 600;

    let (status, answer) = api
        .call(signed_at(
            DEPOSIT_CONFIRMATIONS,
            body,
            MONITOR_SECRET,
            ten_minutes_ago,
        ))
        .await;

    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(error_of(&answer).starts_with("stale signature"), "{answer}");
    assert_nothing_queued(&api).await;
}

#[tokio::test]
async fn malformed_json_is_refused_with_400_and_a_clear_message() {
    let api = Api::new().await;

    let (status, answer) = api
        .call(signed(
            WITHDRAWAL_CONFIRMATIONS,
            r#"{"withdrawal_id": 1989,"#,
        ))
        .await;

    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        error_of(&answer).starts_with("Failed to parse the request body as JSON"),
        "{answer}"
    );
    assert_nothing_queued(&api).await;
}

#[tokio::test]
async fn a_wrong_field_type_is_refused_with_400_naming_the_field() {
    let api = Api::new().await;

    let (status, answer) = api
        .call(signed(
            WITHDRAWAL_CONFIRMATIONS,
            r#"{"withdrawal_id": "1989", "tx_hash": "0xf16c3335"}"#,
        ))
        .await;

    assert_eq!(status, StatusCode::BAD_REQUEST);
    let message = error_of(&answer);
    assert!(message.contains("withdrawal_id"), "{message}");
    assert!(message.contains("invalid type"), "{message}");
    assert_nothing_queued(&api).await;
}

#[tokio::test]
async fn missing_or_invalid_fields_are_refused_with_400_naming_the_problem() {
    let api = Api::new().await;
    let long_hash = format!(
        r#"{{"withdrawal_id": 1, "tx_hash": "0x{}"}}"#,
        "a".repeat(127)
    );
    let cases = [
        (
            WITHDRAWAL_CONFIRMATIONS,
            r#"{"withdrawal_id": 1989}"#.to_owned(),
            "missing field `tx_hash`",
        ),
        (
            WITHDRAWAL_CONFIRMATIONS,
            r#"{"withdrawal_id": 0, "tx_hash": "0x1"}"#.to_owned(),
            "withdrawal_id must be a positive integer",
        ),
        (
            WITHDRAWAL_CONFIRMATIONS,
            r#"{"withdrawal_id": -4, "tx_hash": "0x1"}"#.to_owned(),
            "withdrawal_id",
        ),
        (
            WITHDRAWAL_CONFIRMATIONS,
            r#"{"withdrawal_id": 1, "tx_hash": ""}"#.to_owned(),
            "tx_hash must not be empty",
        ),
        (
            WITHDRAWAL_CONFIRMATIONS,
            long_hash,
            "tx_hash is longer than 128 characters",
        ),
        (
            DEPOSIT_CONFIRMATIONS,
            r#"{}"#.to_owned(),
            "missing field `deposit_id`",
        ),
        (
            DEPOSIT_CONFIRMATIONS,
            r#"[7]"#.to_owned(),
            "must be a JSON object",
        ),
        (DEPOSIT_CONFIRMATIONS, String::new(), "Failed to parse"),
        (
            DEPOSIT_CONFIRMATIONS,
            r#"{"deposit_id": 7.5}"#.to_owned(),
            "deposit_id: invalid type",
        ),
    ];
    for (path, body, expected) in cases {
        let (status, answer) = api.call(signed(path, &body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(error_of(&answer).contains(expected), "{body}: {answer}");
    }
    assert_nothing_queued(&api).await;
}

#[tokio::test]
async fn a_body_over_64_kib_is_refused_with_413() {
    let api = Api::new().await;
    let body = format!(
        r#"{{"deposit_id": 7, "padding": "{}"}}"#,
        "x".repeat(paybus_api::BODY_LIMIT)
    );

    let (status, answer) = api.call(signed(DEPOSIT_CONFIRMATIONS, &body)).await;

    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        error_of(&answer).contains("larger than 65536 bytes"),
        "{answer}"
    );
    assert_nothing_queued(&api).await;
}

#[tokio::test]
async fn without_a_configured_secret_the_intake_is_disabled_with_503() {
    let api = Api::with(|config| config.chain_monitor_secret = None).await;

    let (status, answer) = api
        .call(signed(DEPOSIT_CONFIRMATIONS, r#"{"deposit_id": 7}"#))
        .await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        error_of(&answer),
        "intake disabled: PAYBUS_CHAIN_MONITOR_SECRET is not set"
    );
    assert_nothing_queued(&api).await;
}

#[tokio::test]
async fn a_server_out_of_prepared_statements_answers_503_not_500() {
    let api = Api::new().await;
    // What a server at max_prepared_stmt_count answers a statement new to its connection.
    sqlx::raw_sql(
        "CREATE TRIGGER out_of_prepared_statements BEFORE INSERT ON outbox_messages \
         FOR EACH ROW SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1461, \
         MESSAGE_TEXT = 'Can''t create more than max_prepared_stmt_count statements'",
    )
    .execute(&api.state.pool)
    .await
    .expect("create the trigger");

    let (status, answer) = api
        .call(signed(DEPOSIT_CONFIRMATIONS, r#"{"deposit_id": 7}"#))
        .await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(
        answer,
        json!({"error": "the database is unavailable; retry later"})
    );
}

#[tokio::test]
async fn a_database_fault_answers_503_without_details() {
    let api = Api::new().await;
    api.state.pool.close().await;

    let (status, answer) = api
        .call(signed(DEPOSIT_CONFIRMATIONS, r#"{"deposit_id": 7}"#))
        .await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        answer,
        json!({"error": "the database is unavailable; retry later"})
    );
}
