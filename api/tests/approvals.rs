//! Four-eyes for the single guarded actions through the router: a FAILED bonus job's retry and
//! a suspended market's resume are requested by one ADMIN, approved by another, then run once;
//! self-approval is 403, an expired approval does nothing, OPS can neither ask nor approve.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod support;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use paybus_api::auth::Role;
use paybus_bonuses::{BonusRules, charge::PaymentGateway, completion, testing};
use serde_json::Value;
use support::*;

fn as_admin(subject: &str, method: &str, path: &str) -> Request<Body> {
    let token = paybus_api::auth::issue(
        ADMIN_JWT_SECRET,
        subject,
        &[Role::Admin],
        std::time::Duration::from_secs(3600),
    )
    .unwrap();
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(if method == "POST" { "{}" } else { "" }))
        .unwrap()
}

/// A FAILED bonus job; its id.
async fn failed_job(api: &Api) -> u64 {
    let db = &api.env.db;
    testing::active_event(db, "four-eyes 10%", 10, 9).await;
    let member = testing::member(db).await;
    let purchase = testing::purchase(db, member, PaymentGateway::Pg, 100).await;
    let completed = completion::complete(
        &api.services.outbox,
        BonusRules::default(),
        &purchase.paid(),
    )
    .await
    .unwrap();
    let job = completed.charge().bonus_jobs[0].job_id;
    sqlx::query("UPDATE charge_event_job SET status = 'FAILED', retry_count = 3 WHERE id = ?")
        .bind(job)
        .execute(db)
        .await
        .unwrap();
    job
}

async fn job_status(api: &Api, id: u64) -> String {
    sqlx::query_scalar("SELECT status FROM charge_event_job WHERE id = ?")
        .bind(id)
        .fetch_one(&api.env.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_job_retry_is_asked_by_one_admin_approved_by_another_and_run_once() {
    let api = Api::new().await;
    let job = failed_job(&api).await;
    let retry = format!("/v1/admin/charge-event-jobs/{job}/retry");

    let (status, held) = api.call(as_admin("alice", "POST", &retry)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{held}");
    assert_eq!(held["approval"]["status"], "AWAITING_APPROVAL");
    assert_eq!(job_status(&api, job).await, "FAILED", "nothing ran yet");
    let (_, again) = api.call(as_admin("alice", "POST", &retry)).await;
    assert_eq!(
        again["approval"]["id"], held["approval"]["id"],
        "asking twice is one request"
    );
    let id = held["approval"]["id"].as_str().unwrap().to_owned();
    let path = |tail: &str| format!("/v1/admin/approvals/{id}{tail}");

    let (status, early) = api.call(as_admin("alice", "POST", &path("/execute"))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{early}");
    let (status, own) = api.call(as_admin("alice", "POST", &path("/approve"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "self-approval: {own}");
    let (status, ops) = api
        .call(with_roles("POST", &path("/approve"), &[Role::Ops]))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "OPS cannot approve: {ops}");
    let (status, approved) = api.call(as_admin("bob", "POST", &path("/approve"))).await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    assert_eq!(approved["status"], "APPROVED");

    let (status, executed) = api.call(as_admin("alice", "POST", &path("/execute"))).await;
    assert_eq!(status, StatusCode::OK, "{executed}");
    assert_eq!(executed["approval"]["status"], "EXECUTED");
    assert_eq!(executed["result"]["status"], "PENDING");
    assert_eq!(job_status(&api, job).await, "PENDING");
    let (status, twice) = api.call(as_admin("bob", "POST", &path("/execute"))).await;
    assert_eq!(status, StatusCode::OK, "{twice}");
    assert_eq!(twice["result"], Value::Null, "executed twice, ran once");
    let retries: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM ops_log WHERE action = 'bonus_job.retry'")
            .fetch_one(&api.env.db)
            .await
            .unwrap();
    assert_eq!(retries, 1);
    let logged: Vec<String> = sqlx::query_scalar("SELECT action FROM ops_log ORDER BY seq")
        .fetch_all(&api.env.db)
        .await
        .unwrap();
    assert_eq!(
        logged,
        ["approval.request", "approval.approve", "bonus_job.retry"]
    );
}

#[tokio::test]
async fn an_expired_approval_does_nothing_and_ops_cannot_ask() {
    let api = Api::new().await;
    let job = failed_job(&api).await;
    let retry = format!("/v1/admin/charge-event-jobs/{job}/retry");
    let (status, refused) = api.call(with_roles("POST", &retry, &[Role::Ops])).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "OPS cannot ask: {refused}");

    let (_, held) = api.call(as_admin("alice", "POST", &retry)).await;
    let id = held["approval"]["id"].as_str().unwrap().to_owned();
    let (status, _) = api
        .call(as_admin(
            "bob",
            "POST",
            &format!("/v1/admin/approvals/{id}/approve"),
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
    sqlx::query("UPDATE ops_approvals SET expires_at = NOW(6) - INTERVAL 1 SECOND")
        .execute(&api.env.db)
        .await
        .unwrap();

    let (status, expired) = api
        .call(as_admin(
            "alice",
            "POST",
            &format!("/v1/admin/approvals/{id}/execute"),
        ))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{expired}");
    assert_eq!(job_status(&api, job).await, "FAILED", "nothing ran");
    let (status, listed) = api
        .call(with_roles("GET", "/v1/admin/approvals", &[Role::Ops]))
        .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["approvals"][0]["expired"], true);
    let (status, _) = api
        .call(with_roles(
            "GET",
            "/v1/admin/approvals/not-a-uuid",
            &[Role::Ops],
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}
