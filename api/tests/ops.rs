//! `/metrics` (Prometheus) and the continuous auditor's status through the router.

use crate::support;

use std::time::Duration;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use paybus_bus::metrics;
use paybus_maintenance::auditor::{Auditor, AuditorConfig};
use support::*;
use tower::ServiceExt;

async fn scrape(api: &Api) -> String {
    let response = api
        .router()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn metrics_expose_outcomes_latency_backlog_dead_letters_due_and_stuck_rows() {
    let api = Api::new().await;
    metrics::record("confirm-withdrawal", "done", Duration::from_millis(3));
    metrics::record("confirm-withdrawal", "failed", Duration::from_millis(2));
    sqlx::query(
        "INSERT INTO dead_letters (dead_letter_id, function_name, routing_key, reason, error, body) \
         VALUES ('d1', 'grant-bonus', 'charge.bonus_job.created', 'failed', 'boom', '{}')",
    )
    .execute(&api.services.pool)
    .await
    .unwrap();
    // Written around the recorder: its group counted as `paybus dead-letters recount` does.
    paybus_bus::dead_letter::group_counts::recount(&api.services.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox_messages (message_id, routing_key, correlation_id, body) \
         VALUES (UUID(), 'x', UUID(), '{}')",
    )
    .execute(&api.services.pool)
    .await
    .unwrap();

    let text = scrape(&api).await;
    let build = format!(
        "paybus_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        paybus_testkit::head_commit()
    );
    assert!(text.contains(&build), "{build} missing from:\n{text}");
    for series in [
        "paybus_messages_total{function=\"confirm-withdrawal\",outcome=\"done\"}",
        "paybus_messages_total{function=\"confirm-withdrawal\",outcome=\"failed\"}",
        "paybus_handler_seconds_bucket{le=\"0.004\",function=\"confirm-withdrawal\"}",
        "paybus_outbox_backlog 1",
        "paybus_outbox_oldest_unpublished_seconds",
        "paybus_dead_letters{function=\"grant-bonus\"} 1",
        "paybus_due_retries{table=\"partner_notifications\"} 0",
        "paybus_due_retries{table=\"charge_event_job\"} 0",
        "paybus_stuck_rows{table=\"tasks\"} 0",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
}

#[tokio::test]
async fn metrics_expose_paused_functions_and_the_age_of_the_auditors_last_pass() {
    let api = Api::new().await;
    let text = scrape(&api).await;
    // No pass yet: no age to alert on (the absent series is what says so).
    assert!(
        !text.contains("paybus_audit_last_pass_age_seconds "),
        "{text}"
    );
    assert!(!text.contains("paybus_function_paused{"), "{text}");

    let mut conn = api.services.pool.acquire().await.unwrap();
    paybus_bus::pauses::pause(
        &mut conn,
        "grant-bonus",
        &paybus_testkit::person("alice"),
        "maintenance",
    )
    .await
    .unwrap();
    Auditor::new(
        api.services.pool.clone(),
        paybus_catalog::audit_checks(),
        AuditorConfig::default(),
    )
    .pass()
    .await
    .unwrap();
    let text = scrape(&api).await;
    assert!(
        text.contains("paybus_function_paused{function=\"grant-bonus\"} 1"),
        "{text}"
    );
    let age: f64 = text
        .lines()
        .find_map(|line| line.strip_prefix("paybus_audit_last_pass_age_seconds "))
        .unwrap_or_else(|| panic!("no auditor age in:\n{text}"))
        .parse()
        .unwrap();
    assert!((0.0..60.0).contains(&age), "{age}");
}

#[tokio::test]
async fn the_audit_status_shows_the_last_pass_of_the_auditor() {
    let api = Api::new().await;
    let (status, before) = api.call(admin_get("/v1/admin/audit/status")).await;
    assert_eq!(status, StatusCode::OK, "{before}");
    assert_eq!(
        (before["clean"].as_bool(), before["last_pass"].is_null()),
        (Some(false), true)
    );

    Auditor::new(
        api.services.pool.clone(),
        paybus_catalog::audit_checks(),
        AuditorConfig::default(),
    )
    .pass()
    .await
    .unwrap();
    let (status, after) = api.call(admin_get("/v1/admin/audit/status")).await;
    assert_eq!(status, StatusCode::OK, "{after}");
    assert_eq!(after["clean"], true);
    assert_eq!(after["last_pass"]["violations"], 0);
    let (status, passes) = api.call(admin_get("/v1/admin/audit/passes?limit=5")).await;
    assert_eq!(
        (status, passes["passes"].as_array().unwrap().len()),
        (StatusCode::OK, 1)
    );
    let (status, _) = api
        .call(admin_get("/v1/admin/audit/findings?limit=0"))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}
