//! Four-eyes for the single guarded actions through the router: a FAILED bonus job's retry and
//! a suspended market's resume are requested by one ADMIN, approved by another, then run once;
//! self-approval is 403, an expired approval does nothing, OPS can neither ask nor approve.
//! Against a served API, with real concurrent requests: asking at once is one request,
//! approving at once approves once, executing at once runs the action once and every answer
//! is the result it recorded.

use crate::support;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use paybus_api::role::Role;
use paybus_bonuses::{BonusRules, charge::PaymentGateway, completion};
use paybus_testkit::bonuses;
use serde_json::{Value, json};
use support::*;

/// `subject`, a person in the provider's ADMIN group, sends `method path`.
fn as_admin(api: &Api, subject: &str, method: &str, path: &str) -> Request<Body> {
    let token = api.admin(subject);
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
    bonuses::active_event(db, "four-eyes 10%", 10, 9).await;
    let member = bonuses::member(db).await;
    let purchase = bonuses::purchase(db, member, PaymentGateway::Pg, 100).await;
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
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let job = failed_job(&api).await;
    let retry = format!("/v1/admin/charge-event-jobs/{job}/retry");

    let (status, held) = api.call(as_admin(&api, "alice", "POST", &retry)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{held}");
    assert_eq!(held["approval"]["status"], "AWAITING_APPROVAL");
    assert_eq!(job_status(&api, job).await, "FAILED", "nothing ran yet");
    let (_, again) = api.call(as_admin(&api, "alice", "POST", &retry)).await;
    assert_eq!(
        again["approval"]["id"], held["approval"]["id"],
        "asking twice is one request"
    );
    let id = held["approval"]["id"].as_str().unwrap().to_owned();
    let path = |tail: &str| format!("/v1/admin/approvals/{id}{tail}");

    let (status, early) = api
        .call(as_admin(&api, "alice", "POST", &path("/execute")))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{early}");
    let (status, own) = api
        .call(as_admin(&api, "alice", "POST", &path("/approve")))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "self-approval: {own}");
    let (status, ops) = api
        .call(with_roles("POST", &path("/approve"), &[Role::Ops]))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "OPS cannot approve: {ops}");
    let (status, approved) = api
        .call(as_admin(&api, "bob", "POST", &path("/approve")))
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    assert_eq!(approved["status"], "APPROVED");

    let (status, executed) = api
        .call(as_admin(&api, "alice", "POST", &path("/execute")))
        .await;
    assert_eq!(status, StatusCode::OK, "{executed}");
    assert_eq!(executed["approval"]["status"], "EXECUTED");
    assert_eq!(executed["result"]["status"], "PENDING");
    assert_eq!(job_status(&api, job).await, "PENDING");
    let (status, twice) = api
        .call(as_admin(&api, "bob", "POST", &path("/execute")))
        .await;
    assert_eq!(status, StatusCode::OK, "{twice}");
    assert_eq!(
        (&twice["result"], &twice["ran_now"]),
        (&executed["result"], &Value::Bool(false)),
        "executed twice, ran once: the second answer is the recorded result"
    );
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
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let job = failed_job(&api).await;
    let retry = format!("/v1/admin/charge-event-jobs/{job}/retry");
    let (status, refused) = api.call(with_roles("POST", &retry, &[Role::Ops])).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "OPS cannot ask: {refused}");

    let (_, held) = api.call(as_admin(&api, "alice", "POST", &retry)).await;
    let id = held["approval"]["id"].as_str().unwrap().to_owned();
    let (status, _) = api
        .call(as_admin(
            &api,
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
            &api,
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

/// alice asks for the retry of `job`, bob approves it: the approval's id.
async fn approved_retry(api: &Api, job: u64) -> String {
    let retry = format!("/v1/admin/charge-event-jobs/{job}/retry");
    let (status, held) = api.call(as_admin(api, "alice", "POST", &retry)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{held}");
    let id = held["approval"]["id"].as_str().unwrap().to_owned();
    let (status, approved) = api
        .call(as_admin(
            api,
            "bob",
            "POST",
            &format!("/v1/admin/approvals/{id}/approve"),
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    id
}

async fn ops_log_count(api: &Api, action: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM ops_log WHERE action = ?")
        .bind(action)
        .fetch_one(&api.env.db)
        .await
        .unwrap()
}

/// grant-bonus consuming its queue, as `paybus run` runs it; stops when the token is
/// cancelled.
async fn grant_bonus_running(api: &Api) -> tokio_util::sync::CancellationToken {
    let grant_bonus = paybus_catalog::FUNCTIONS
        .iter()
        .find(|function| function.name == "grant-bonus")
        .unwrap();
    api.services
        .declare_topology(&[grant_bonus.queue])
        .await
        .unwrap();
    let mut runner = paybus_runtime::runner::Runner::new(api.services.clone());
    grant_bonus.add_to(&mut runner).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(runner.run(stop.clone()));
    stop
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_admins_asking_six_times_at_once_make_one_approval() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let job = failed_job(&api).await;
    let served = Served::start(&api).await;
    let retry = format!("/v1/admin/charge-event-jobs/{job}/retry");

    let answers = served
        .post_all_at_once(
            &[
                ("alice", retry.clone()),
                ("bob", retry.clone()),
                ("alice", retry.clone()),
                ("bob", retry.clone()),
                ("alice", retry.clone()),
                ("bob", retry.clone()),
            ],
            &json!({}),
        )
        .await;

    for (status, answer) in &answers {
        assert_eq!(*status, StatusCode::ACCEPTED, "{answer}");
    }
    let ids: std::collections::BTreeSet<&str> = answers
        .iter()
        .filter_map(|(_, answer)| answer["approval"]["id"].as_str())
        .collect();
    assert_eq!(ids.len(), 1, "asking at once is one request: {answers:?}");
    assert_eq!(api.scalar("SELECT COUNT(*) FROM ops_approvals").await, 1);
    assert_eq!(ops_log_count(&api, "approval.request").await, 1);
    assert_eq!(job_status(&api, job).await, "FAILED", "nothing ran yet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn six_executes_at_once_run_the_retry_once_and_every_answer_is_what_it_recorded() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let job = failed_job(&api).await;
    let id = approved_retry(&api, job).await;
    let granting = grant_bonus_running(&api).await;
    let served = Served::start(&api).await;
    let execute = format!("/v1/admin/approvals/{id}/execute");

    let answers = served
        .post_all_at_once(
            &["alice", "bob", "carol", "dave", "erin", "frank"]
                .map(|admin| (admin, execute.clone())),
            &json!({}),
        )
        .await;

    let (_, shown) = api
        .call(with_roles(
            "GET",
            &format!("/v1/admin/approvals/{id}"),
            &[Role::Ops],
        ))
        .await;
    assert_eq!(shown["status"], "EXECUTED", "{shown}");
    let recorded: Value = serde_json::from_str(shown["result"].as_str().unwrap()).unwrap();
    assert_eq!(
        (recorded["id"].as_u64(), recorded["status"].as_str()),
        (Some(job), Some("PENDING")),
        "the approval records the retry, not a refusal: {recorded}"
    );
    for (status, answer) in &answers {
        assert_eq!(*status, StatusCode::OK, "{answer}");
        assert_eq!(
            answer["result"], recorded,
            "every answer is the recorded result"
        );
        assert_eq!(answer["approval"], shown);
    }
    let ran: Vec<&Value> = answers
        .iter()
        .map(|(_, answer)| &answer["ran_now"])
        .collect();
    assert_eq!(
        ran.iter().filter(|ran| ***ran == Value::Bool(true)).count(),
        1,
        "one answer ran it, the others report it: {ran:?}"
    );
    assert_eq!(ops_log_count(&api, "bonus_job.retry").await, 1);
    let granted = paybus_testkit::eventually(std::time::Duration::from_secs(20), || async {
        job_status(&api, job).await == "DONE"
    })
    .await;
    granting.cancel();
    assert!(granted, "grant-bonus granted the retried job");
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM charges WHERE status = 'EVENT'")
            .await,
        1,
        "one EVENT charge"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admins_approving_at_once_approve_once() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let job = failed_job(&api).await;
    let retry = format!("/v1/admin/charge-event-jobs/{job}/retry");
    let (_, held) = api.call(as_admin(&api, "alice", "POST", &retry)).await;
    let approve = format!(
        "/v1/admin/approvals/{}/approve",
        held["approval"]["id"].as_str().unwrap()
    );
    let served = Served::start(&api).await;

    let answers = served
        .post_all_at_once(
            &["bob", "carol", "dave", "erin"].map(|admin| (admin, approve.clone())),
            &json!({}),
        )
        .await;

    let statuses: Vec<StatusCode> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        1,
        "{answers:?}"
    );
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CONFLICT)
            .count(),
        3,
        "{answers:?}"
    );
    assert_eq!(ops_log_count(&api, "approval.approve").await, 1);
}

#[tokio::test]
async fn asking_again_while_approved_gives_the_approved_one_and_after_its_expiry_a_new_one() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let job = failed_job(&api).await;
    let id = approved_retry(&api, job).await;
    let retry = format!("/v1/admin/charge-event-jobs/{job}/retry");

    let (status, again) = api.call(as_admin(&api, "carol", "POST", &retry)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(
        (
            again["approval"]["id"].as_str(),
            again["approval"]["status"].as_str()
        ),
        (Some(id.as_str()), Some("APPROVED")),
        "the approved one, not a second that could run again"
    );

    sqlx::query("UPDATE ops_approvals SET expires_at = NOW(6) - INTERVAL 1 SECOND")
        .execute(&api.env.db)
        .await
        .unwrap();
    let (status, renewed) = api.call(as_admin(&api, "carol", "POST", &retry)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{renewed}");
    assert_ne!(
        renewed["approval"]["id"],
        id.as_str(),
        "an expired one blocks nothing"
    );
    assert_eq!(renewed["approval"]["status"], "AWAITING_APPROVAL");
    let (status, expired) = api
        .call(as_admin(
            &api,
            "alice",
            "POST",
            &format!("/v1/admin/approvals/{id}/execute"),
        ))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{expired}");
    assert!(error_of(&expired).contains("expired"), "{expired}");
    assert_eq!(job_status(&api, job).await, "FAILED");
}

#[tokio::test]
async fn executing_an_approval_that_expired_unapproved_says_it_expired() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let job = failed_job(&api).await;
    let retry = format!("/v1/admin/charge-event-jobs/{job}/retry");
    let (_, held) = api.call(as_admin(&api, "alice", "POST", &retry)).await;
    let id = held["approval"]["id"].as_str().unwrap().to_owned();
    sqlx::query("UPDATE ops_approvals SET expires_at = NOW(6) - INTERVAL 1 SECOND")
        .execute(&api.env.db)
        .await
        .unwrap();

    let (status, answer) = api
        .call(as_admin(
            &api,
            "bob",
            "POST",
            &format!("/v1/admin/approvals/{id}/execute"),
        ))
        .await;

    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert!(
        error_of(&answer).contains("expired") && !error_of(&answer).contains("awaits"),
        "{answer}"
    );
}

#[tokio::test]
async fn an_execution_whose_claimer_died_is_taken_over_once_its_lease_passed() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let job = failed_job(&api).await;
    let id = approved_retry(&api, job).await;
    let execute = format!("/v1/admin/approvals/{id}/execute");
    let claimed_ago = |seconds: u32| {
        sqlx::query(
            "UPDATE ops_approvals SET claim_token = 'a process that died', \
             claimed_at = NOW(6) - INTERVAL ? SECOND",
        )
        .bind(seconds)
        .execute(&api.env.db)
    };

    // Claimed just now, never recorded: the execute waits for a result, then says so.
    claimed_ago(0).await.unwrap();
    let (status, waited) = api.call(as_admin(&api, "carol", "POST", &execute)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{waited}");
    assert!(error_of(&waited).contains("ask again"), "{waited}");
    assert_eq!(
        job_status(&api, job).await,
        "FAILED",
        "the claim's holder runs it, not carol"
    );

    // Its lease runs out while the next execute waits: that one takes it over and runs it.
    let lease = paybus_ops::approvals::EXECUTION_LEASE.as_secs() as u32;
    claimed_ago(lease - 1).await.unwrap();
    let (status, executed) = api.call(as_admin(&api, "carol", "POST", &execute)).await;
    assert_eq!(status, StatusCode::OK, "{executed}");
    assert_eq!(
        (&executed["ran_now"], &executed["result"]["status"]),
        (&Value::Bool(true), &json!("PENDING"))
    );
    assert_eq!(executed["approval"]["executed_by"], "carol@example.com");
    assert_eq!(job_status(&api, job).await, "PENDING");
}

/// Rows as the request before the open-request slot left them: several open duplicates for
/// one job, approved and awaiting; an expired one for another.
#[tokio::test]
async fn duplicates_left_before_the_slot_migrate_and_only_one_per_subject_stays_open() {
    use paybus_db::MIGRATOR;
    use paybus_ops::approvals::{self, ApprovalError, Guarded};
    use paybus_testkit::TestEnv;
    const SLOT_MIGRATION: i64 = 20261207000527;
    let env = TestEnv::unmigrated().await;
    let before = MIGRATOR
        .iter()
        .map(|migration| migration.version)
        .filter(|version| *version < SLOT_MIGRATION)
        .max()
        .unwrap();
    MIGRATOR.run_to(before, &env.db).await.unwrap();
    let rows = [
        (
            "01a00000-0000-7000-8000-000000000001",
            "charge_event_job:7",
            "AWAITING_APPROVAL",
            3,
            60,
        ),
        (
            "01a00000-0000-7000-8000-000000000002",
            "charge_event_job:7",
            "APPROVED",
            2,
            60,
        ),
        (
            "01a00000-0000-7000-8000-000000000003",
            "charge_event_job:7",
            "AWAITING_APPROVAL",
            1,
            60,
        ),
        (
            "01a00000-0000-7000-8000-000000000004",
            "charge_event_job:8",
            "AWAITING_APPROVAL",
            3,
            60,
        ),
        (
            "01a00000-0000-7000-8000-000000000005",
            "charge_event_job:8",
            "AWAITING_APPROVAL",
            2,
            60,
        ),
        (
            "01a00000-0000-7000-8000-000000000006",
            "charge_event_job:9",
            "AWAITING_APPROVAL",
            90,
            -30,
        ),
    ];
    for (id, subject, status, minutes_ago, expires_in_minutes) in rows {
        sqlx::query(
            "INSERT INTO ops_approvals (id, action, subject, status, requested_by, requested_at, \
             expires_at, approved_by, approved_at) \
             VALUES (?, 'JOB_RETRY', ?, ?, 'alice', NOW(6) - INTERVAL ? MINUTE, \
             NOW(6) + INTERVAL ? MINUTE, IF(? = 'APPROVED', 'bob', NULL), NULL)",
        )
        .bind(id)
        .bind(subject)
        .bind(status)
        .bind(minutes_ago)
        .bind(expires_in_minutes)
        .bind(status)
        .execute(&env.db)
        .await
        .unwrap();
    }

    paybus_runtime::migrations::apply(&env.db)
        .await
        .expect("the duplicates do not stop the migration");

    let mut conn = env.db.acquire().await.unwrap();
    let ttl = std::time::Duration::from_secs(3600);
    let mut ask = async |subject: &str| {
        approvals::request(
            &mut conn,
            Guarded::JobRetry,
            subject,
            &paybus_testkit::person("carol"),
            ttl,
        )
        .await
        .unwrap()
        .id
        .to_string()
    };
    assert_eq!(
        ask("charge_event_job:7").await,
        "01a00000-0000-7000-8000-000000000002",
        "the approved one is job 7's open request"
    );
    assert_eq!(
        ask("charge_event_job:8").await,
        "01a00000-0000-7000-8000-000000000004",
        "else the oldest"
    );
    let renewed = ask("charge_event_job:9").await;
    assert!(
        !renewed.starts_with("01a00000"),
        "an expired one blocks nothing: {renewed}"
    );
    let duplicate = "01a00000-0000-7000-8000-000000000005".parse().unwrap();
    let refused = approvals::approve(&mut conn, duplicate, &paybus_testkit::person("bob")).await;
    assert!(
        matches!(&refused, Err(ApprovalError::State { problem, .. }) if problem.contains("not the open request")),
        "{refused:?}"
    );
}
