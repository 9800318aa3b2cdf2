//! `/v1/admin/dead-letters` through the router: OPS reads and dry-runs, ADMIN replays and
//! archives, everyone else is refused; a replay over HTTP records the token's subject; under
//! four-eyes (the default) a replay is an operation a second ADMIN approves before it runs.

use crate::support;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use paybus_api::role::Role;
use paybus_bus::{Envelope, dead_letter::record_given_up};
use paybus_confirmations::WithdrawalTxConfirmed;
use serde_json::json;
use support::*;

/// An in-flight withdrawal and the dead letter of its confirmation; (withdrawal, letter) ids.
async fn dead_lettered_confirmation(api: &Api) -> (u64, u64) {
    dead_lettered_confirmations(api, 1).await[0]
}

/// `count` in-flight withdrawals of one partner, each with the dead letter of its confirmation
/// (safe to replay); their (withdrawal, letter) ids.
async fn dead_lettered_confirmations(api: &Api, count: usize) -> Vec<(u64, u64)> {
    let pool = &api.services.pool;
    let partner = sqlx::query("INSERT INTO partners (name, webhook_url) VALUES ('acme', NULL)")
        .execute(pool)
        .await
        .unwrap()
        .last_insert_id();
    let mut made = Vec::with_capacity(count);
    for n in 1..=count {
        let tx_hash = format!("0xabc{n}");
        let withdrawal = sqlx::query(
            "INSERT INTO withdrawals (partner_id, kind, status, currency, amount, to_address, tx_hash) \
             VALUES (?, 'NORMAL', 'BROADCASTING', 'USDT', 42, 'T-address', ?)",
        )
        .bind(partner)
        .bind(&tx_hash)
        .execute(pool)
        .await
        .unwrap()
        .last_insert_id();
        let message = Envelope::new(WithdrawalTxConfirmed {
            withdrawal_id: withdrawal,
            tx_hash,
        })
        .to_outgoing()
        .unwrap();
        let key = format!("letter-{n}");
        let mut conn = pool.acquire().await.unwrap();
        record_given_up(&mut conn, "confirm-withdrawal", &key, &message, "boom", 4)
            .await
            .unwrap();
        let letter = sqlx::query_scalar("SELECT id FROM dead_letters WHERE dead_letter_id = ?")
            .bind(&key)
            .fetch_one(pool)
            .await
            .unwrap();
        made.push((withdrawal, letter));
    }
    made
}

const REPLAY_BODY: &str = r#"{"ids": [1]}"#;

fn request(method: &str, path: &str, token: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    builder
        .body(Body::from(if method == "POST" { REPLAY_BODY } else { "" }))
        .unwrap()
}

const READS: &[&str] = &[
    "/v1/admin/dead-letters",
    "/v1/admin/dead-letters/groups",
    "/v1/admin/dead-letters/1",
    "/v1/admin/dead-letters/dry-run?ids=1",
];
const CHANGES: &[&str] = &[
    "/v1/admin/dead-letters/replay",
    "/v1/admin/dead-letters/archive",
    "/v1/admin/dead-letters/operations",
    "/v1/admin/dead-letters/operations/0190f0e0-0000-7000-8000-000000000000/approve",
    "/v1/admin/dead-letters/operations/0190f0e0-0000-7000-8000-000000000000/execute",
];

fn post_as(token: &str, path: &str, body: &serde_json::Value) -> Request<Body> {
    Request::post(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

#[tokio::test]
async fn dead_letter_routes_are_401_without_a_valid_token_and_403_without_the_role() {
    let api = Api::new().await;
    let expired = paybus_api::auth::issue(
        ADMIN_JWT_SECRET,
        "tests",
        &[Role::Admin],
        std::time::Duration::ZERO,
    )
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let calls = READS
        .iter()
        .map(|path| ("GET", *path))
        .chain(CHANGES.iter().map(|path| ("POST", *path)));
    for (method, path) in calls {
        for token in [None, Some("not-a-token"), Some(expired.as_str())] {
            let (status, answer) = api.call(request(method, path, token)).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} {token:?}: {answer}"
            );
        }
        if method == "POST" {
            let ops = token(&[Role::Ops]);
            let (status, answer) = api.call(request(method, path, Some(&ops))).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {answer}");
        }
    }
    let ops = token(&[Role::Ops]);
    for path in READS {
        let (status, answer) = api.call(request("GET", path, Some(&ops))).await;
        // Letter 1 does not exist yet: 404 for the one letter, 200 for the lists.
        assert!(
            status == StatusCode::OK || status == StatusCode::NOT_FOUND,
            "OPS reads {path}: {status} {answer}"
        );
    }
}

#[tokio::test]
async fn ops_dry_run_then_an_admin_replay_sends_the_safe_letter_and_records_who() {
    // One ADMIN alone (four-eyes off, as in local mode).
    let api = Api::with(|config| {
        config.four_eyes = paybus_ops::approvals::FourEyes::off();
    })
    .await;
    let (withdrawal, letter) = dead_lettered_confirmation(&api).await;
    let ops = token(&[Role::Ops]);

    let (status, groups) = api
        .call(request("GET", "/v1/admin/dead-letters/groups", Some(&ops)))
        .await;
    assert_eq!(status, StatusCode::OK, "{groups}");
    assert_eq!(groups["groups"][0]["function"], "confirm-withdrawal");
    assert_eq!(groups["groups"][0]["count"], 1);
    assert_eq!(groups["exposure"][0]["amount"], "42");
    assert_eq!(groups["exposure"][0]["currency"], "USDT");

    let (status, run) = api
        .call(request(
            "GET",
            "/v1/admin/dead-letters/dry-run?function=confirm-withdrawal&reason=failed",
            Some(&ops),
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(
        (run["safe"].as_u64(), run["needs_human"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(run["letters"][0]["triage"]["verdict"], "safe");
    assert_eq!(
        run["letters"][0]["triage"]["referenced"][0]["id"],
        withdrawal
    );

    // The console's one form: a dry run over POST, then the replay.
    let group = json!({"function": "confirm-withdrawal", "reason": "failed"});
    let (status, run) = api
        .call(admin_post(
            "/v1/admin/dead-letters/replay",
            &json!({"group": group, "dry_run": true}),
        ))
        .await;
    assert_eq!(
        (status, run["safe"].as_u64()),
        (StatusCode::OK, Some(1)),
        "{run}"
    );
    let (status, report) = api
        .call(admin_post(
            "/v1/admin/dead-letters/replay",
            &json!({"group": group, "per_second": 100}),
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["replayed"], 1);
    let (status, shown) = api
        .call(admin_get(&format!("/v1/admin/dead-letters/{letter}")))
        .await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["status"], "REPLAYED");
    assert_eq!(shown["actions"][0]["actor"], "tests (break-glass)");
    assert_eq!(shown["actions"][0]["result"], "REPLAYED");
    assert_eq!(
        api.scalar(
            "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'withdrawal.tx_confirmed'"
        )
        .await,
        1,
        "the replay went through the outbox"
    );
}

#[tokio::test]
async fn a_group_dry_run_over_part_of_its_group_says_how_many_it_left_out() {
    let api = Api::new().await;
    let (withdrawal, _) = dead_lettered_confirmation(&api).await;
    let mut conn = api.services.pool.acquire().await.unwrap();
    for n in 2..=3 {
        let message = Envelope::new(WithdrawalTxConfirmed {
            withdrawal_id: withdrawal,
            tx_hash: format!("0xabc{n}"),
        })
        .to_outgoing()
        .unwrap();
        let letter = format!("letter-{n}");
        record_given_up(
            &mut conn,
            "confirm-withdrawal",
            &letter,
            &message,
            "boom",
            4,
        )
        .await
        .unwrap();
    }
    drop(conn);
    let ops = token(&[Role::Ops]);
    let group = "/v1/admin/dead-letters/dry-run?function=confirm-withdrawal&reason=failed";

    let mut seen = Vec::new();
    for limit in [2, 3, 500] {
        let (status, run) = api
            .call(request(
                "GET",
                &format!("{group}&limit={limit}"),
                Some(&ops),
            ))
            .await;
        assert_eq!(status, StatusCode::OK, "{run}");
        seen.push((
            run["letters"].as_array().unwrap().len(),
            run["remaining"].as_u64(),
        ));
    }

    assert_eq!(seen, [(2, Some(1)), (3, Some(0)), (3, Some(0))]);
}

#[tokio::test]
async fn client_mistakes_on_dead_letter_routes_are_400_or_404() {
    let api = Api::new().await;
    for (request, status) in [
        (
            admin_get("/v1/admin/dead-letters/dry-run"),
            StatusCode::BAD_REQUEST,
        ),
        (
            admin_get("/v1/admin/dead-letters/dry-run?ids=1,x"),
            StatusCode::BAD_REQUEST,
        ),
        (
            admin_get("/v1/admin/dead-letters?limit=0"),
            StatusCode::BAD_REQUEST,
        ),
        (
            admin_get("/v1/admin/dead-letters?status=LOST"),
            StatusCode::BAD_REQUEST,
        ),
        (
            admin_get("/v1/admin/dead-letters/0"),
            StatusCode::BAD_REQUEST,
        ),
        (
            admin_get("/v1/admin/dead-letters/77"),
            StatusCode::NOT_FOUND,
        ),
        (
            admin_post("/v1/admin/dead-letters/replay", &json!({"ids": []})),
            StatusCode::BAD_REQUEST,
        ),
        (
            admin_post(
                "/v1/admin/dead-letters/archive",
                &json!({"ids": [1], "group": {"function": "f", "reason": "r"}}),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            admin_post(
                "/v1/admin/dead-letters/replay",
                &json!({"ids": [1], "per_second": 0}),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            admin_post(
                "/v1/admin/dead-letters/archive",
                &json!({"ids": [1], "x": 1}),
            ),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let uri = request.uri().to_string();
        let (got, answer) = api.call(request).await;
        assert_eq!(got, status, "{uri}: {answer}");
        assert!(answer["error"].is_string(), "{answer}");
    }
}

#[tokio::test]
async fn four_eyes_over_http_request_then_another_admin_approves_then_it_runs_once() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let (withdrawal, letter) = dead_lettered_confirmation(&api).await;
    let (alice, bob) = (api.admin("alice"), api.admin("bob"));
    let group = json!({"function": "confirm-withdrawal", "reason": "failed"});

    // The one-call replay is held: an operation waiting for a second ADMIN, nothing sent.
    let (status, held) = api
        .call(post_as(
            &alice,
            "/v1/admin/dead-letters/replay",
            &json!({"group": group}),
        ))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{held}");
    assert_eq!(held["status"], "AWAITING_APPROVAL");
    assert_eq!(held["letter_results"][0]["dead_letter_id"], letter);
    let sent = "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'withdrawal.tx_confirmed'";
    assert_eq!(api.scalar(sent).await, 0);

    // The operation form: requested by alice.
    let (status, operation) = api
        .call(post_as(
            &alice,
            "/v1/admin/dead-letters/operations",
            &json!({"action": "replay", "group": group}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{operation}");
    let id = operation["id"].as_str().unwrap().to_owned();
    let hash = operation["content_hash"].as_str().unwrap().to_owned();
    let path = |tail: &str| format!("/v1/admin/dead-letters/operations/{id}{tail}");

    let (status, answer) = api
        .call(post_as(&alice, &path("/execute"), &json!({})))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "not approved yet: {answer}");
    let (status, answer) = api
        .call(post_as(&alice, &path("/approve"), &json!({"hash": hash})))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "self-approval: {answer}");
    let ops = token(&[Role::Ops]);
    let (status, answer) = api
        .call(post_as(&ops, &path("/approve"), &json!({"hash": hash})))
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "OPS cannot approve: {answer}"
    );
    let (status, answer) = api
        .call(post_as(
            &bob,
            &path("/approve"),
            &json!({"hash": "f".repeat(64)}),
        ))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "another hash: {answer}");
    let (status, approved) = api
        .call(post_as(&bob, &path("/approve"), &json!({"hash": hash})))
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    assert_eq!(
        (
            approved["status"].as_str(),
            approved["approved_by"].as_str()
        ),
        (Some("READY"), Some("bob@example.com"))
    );

    let (status, report) = api
        .call(post_as(
            &alice,
            &path("/execute"),
            &json!({"per_second": 100}),
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        (report["replayed"].as_u64(), report["remaining"].as_u64()),
        (Some(1), Some(0))
    );
    let (status, again) = api.call(post_as(&bob, &path("/execute"), &json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["replayed"], 0, "executed twice, acted once: {again}");
    assert_eq!(again["operation"]["status"], "DONE");
    assert_eq!(api.scalar(sent).await, 1);

    let (status, shown) = api.call(with_roles("GET", &path(""), &[Role::Ops])).await;
    assert_eq!(status, StatusCode::OK, "OPS reads operations: {shown}");
    assert_eq!(shown["letter_results"][0]["result"], "REPLAYED");
    let (status, listed) = api
        .call(with_roles(
            "GET",
            "/v1/admin/dead-letters/operations",
            &[Role::Ops],
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["operations"].as_array().map(Vec::len), Some(2));
    let (_, letter_now) = api
        .call(admin_get(&format!("/v1/admin/dead-letters/{letter}")))
        .await;
    assert_eq!(letter_now["actions"][0]["operation_id"], id.as_str());
    assert_eq!(letter_now["actions"][0]["actor"], "alice@example.com");
    let _ = withdrawal;
}

#[tokio::test]
async fn client_mistakes_on_operation_routes_are_400_404_or_409() {
    let api = Api::new().await;
    let missing = "/v1/admin/dead-letters/operations/0190f0e0-0000-7000-8000-000000000000";
    for (request, status) in [
        (
            admin_get("/v1/admin/dead-letters/operations/not-a-uuid"),
            StatusCode::BAD_REQUEST,
        ),
        (admin_get(missing), StatusCode::NOT_FOUND),
        (
            admin_post(&format!("{missing}/approve"), &json!({"hash": "x"})),
            StatusCode::NOT_FOUND,
        ),
        (
            admin_post(&format!("{missing}/execute"), &json!({})),
            StatusCode::NOT_FOUND,
        ),
        (
            admin_post(&format!("{missing}/execute"), &json!({"per_second": -1})),
            StatusCode::BAD_REQUEST,
        ),
        (
            admin_post(
                "/v1/admin/dead-letters/operations",
                &json!({"action": "burn", "ids": [1]}),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            admin_post(
                "/v1/admin/dead-letters/operations",
                &json!({"action": "replay"}),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            admin_post(
                "/v1/admin/dead-letters/operations",
                &json!({"action": "archive", "ids": [77]}),
            ),
            StatusCode::CONFLICT,
        ),
        (
            admin_get("/v1/admin/dead-letters/operations?limit=0"),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let uri = request.uri().to_string();
        let (got, answer) = api.call(request).await;
        assert_eq!(got, status, "{uri}: {answer}");
        assert!(answer["error"].is_string(), "{answer}");
    }
}

/// alice asks for a replay of the failed confirmations' group, bob approves the hash he saw:
/// the operation's id.
async fn approved_group_replay(api: &Api) -> String {
    let (status, operation) = api
        .call(post_as(
            &api.admin("alice"),
            "/v1/admin/dead-letters/operations",
            &json!({"action": "replay", "group": {"function": "confirm-withdrawal", "reason": "failed"}}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{operation}");
    let id = operation["id"].as_str().unwrap().to_owned();
    let (status, approved) = api
        .call(post_as(
            &api.admin("bob"),
            &format!("/v1/admin/dead-letters/operations/{id}/approve"),
            &json!({"hash": operation["content_hash"]}),
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admins_executing_one_operation_at_once_replay_each_letter_once_and_each_report_is_true() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let letters = dead_lettered_confirmations(&api, 12).await;
    let id = approved_group_replay(&api).await;
    let served = Served::start(&api).await;
    let execute = format!("/v1/admin/dead-letters/operations/{id}/execute");

    let reports = served
        .post_all_at_once(
            &["alice", "bob", "carol", "dave"].map(|admin| (admin, execute.clone())),
            &json!({"per_second": 100}),
        )
        .await;

    let mut replayed = 0;
    for (status, report) in &reports {
        assert_eq!(*status, StatusCode::OK, "{report}");
        let count = |field: &str| report[field].as_u64().unwrap();
        assert_eq!(
            (
                count("skipped"),
                count("needs_human"),
                count("already_applied")
            ),
            (0, 0, 0),
            "no letter was skipped: those another execution took are counted as such: {report}"
        );
        assert_eq!(
            report["results"].as_array().map(Vec::len),
            Some(count("replayed") as usize),
            "{report}"
        );
        assert_eq!(
            (
                report["operation"]["status"].as_str(),
                report["operation"]["done"].as_u64(),
                count("remaining")
            ),
            (Some("DONE"), Some(12), 0),
            "{report}"
        );
        replayed += count("replayed");
    }
    assert_eq!(
        replayed, 12,
        "each letter replayed by one execution: {reports:?}"
    );
    let taken_by_another: u64 = reports
        .iter()
        .filter_map(|(_, report)| report["by_another_execution"].as_u64())
        .sum();
    assert!(
        taken_by_another > 0,
        "the executions ran at the same time (or this test proves nothing): {reports:?}"
    );
    let sent = "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'withdrawal.tx_confirmed'";
    assert_eq!(api.scalar(sent).await, 12);
    for (_, letter) in letters {
        let replays: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM dead_letter_actions WHERE dead_letter_id = ? AND result = 'REPLAYED'",
        )
        .bind(letter)
        .fetch_one(&api.env.db)
        .await
        .unwrap();
        assert_eq!(replays, 1, "letter {letter}");
    }
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM ops_log WHERE action = 'dead_letter.replay'")
            .await,
        12
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admins_approving_one_operation_at_once_approve_it_once() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    dead_lettered_confirmations(&api, 2).await;
    let (_, operation) = api
        .call(post_as(
            &api.admin("alice"),
            "/v1/admin/dead-letters/operations",
            &json!({"action": "replay", "group": {"function": "confirm-withdrawal", "reason": "failed"}}),
        ))
        .await;
    let approve = format!(
        "/v1/admin/dead-letters/operations/{}/approve",
        operation["id"].as_str().unwrap()
    );
    let served = Served::start(&api).await;

    let answers = served
        .post_all_at_once(
            &["bob", "carol", "dave", "erin"].map(|admin| (admin, approve.clone())),
            &json!({"hash": operation["content_hash"]}),
        )
        .await;

    let approved = answers
        .iter()
        .filter(|(status, _)| *status == StatusCode::OK);
    assert_eq!(approved.count(), 1, "{answers:?}");
    let refused = answers
        .iter()
        .filter(|(status, _)| *status == StatusCode::CONFLICT);
    assert_eq!(refused.count(), 3, "{answers:?}");
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM ops_log WHERE action = 'dead_letter_operation.approve'")
            .await,
        1
    );
}

#[tokio::test]
async fn executing_an_operation_that_expired_unapproved_says_it_expired() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    dead_lettered_confirmation(&api).await;
    let (_, operation) = api
        .call(post_as(
            &api.admin("alice"),
            "/v1/admin/dead-letters/operations",
            &json!({"action": "replay", "ids": [1]}),
        ))
        .await;
    assert_eq!(operation["status"], "AWAITING_APPROVAL", "{operation}");
    sqlx::query("UPDATE dead_letter_operations SET expires_at = NOW(6) - INTERVAL 1 SECOND")
        .execute(&api.env.db)
        .await
        .unwrap();

    let (status, answer) = api
        .call(post_as(
            &api.admin("bob"),
            &format!(
                "/v1/admin/dead-letters/operations/{}/execute",
                operation["id"].as_str().unwrap()
            ),
            &json!({}),
        ))
        .await;

    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert!(
        error_of(&answer).contains("expired") && !error_of(&answer).contains("awaits"),
        "{answer}"
    );
}
