//! `/v1/admin/functions` through the router: OPS reads which functions are paused, ADMIN
//! pauses and resumes them (recorded with who and why), every process obeys the row.

use crate::support;

use axum::http::StatusCode;
use paybus_api::role::Role;
use serde_json::json;
use support::*;

#[tokio::test]
async fn admin_pauses_and_resumes_a_function_with_a_reason_and_ops_only_reads() {
    let api = Api::new().await;

    let (status, answer) = api
        .call(with_roles("GET", "/v1/admin/functions", &[Role::Ops]))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let functions = answer["functions"].as_array().unwrap();
    assert_eq!(functions.len(), paybus_catalog::FUNCTIONS.len());
    assert!(functions.iter().all(|f| f["paused"].is_null()), "{answer}");

    let pause = "/v1/admin/functions/confirm-withdrawal/pause";
    let (status, _) = api.call(with_roles("POST", pause, &[Role::Ops])).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, answer) = api.call(admin_post(pause, &json!({"reason": " "}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(error_of(&answer).contains("reason"));
    let (status, answer) = api
        .call(admin_post(
            "/v1/admin/functions/no-such-function/pause",
            &json!({"reason": "x"}),
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");

    let body = json!({"reason": "partner ledger migration"});
    let (status, answer) = api.call(admin_post(pause, &body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["paused_now"], true);
    let (_, again) = api.call(admin_post(pause, &body)).await;
    assert_eq!(again["paused_now"], false);
    assert_eq!(
        api.scalar("SELECT COUNT(*) FROM function_pauses WHERE function_name = 'confirm-withdrawal' AND paused_by = 'tests (break-glass)' AND reason = 'partner ledger migration'")
            .await,
        1
    );
    let (_, listed) = api.call(admin_get("/v1/admin/functions")).await;
    let paused: Vec<&str> = listed["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| !f["paused"].is_null())
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(paused, ["confirm-withdrawal"]);

    let resume = "/v1/admin/functions/confirm-withdrawal/resume";
    let (status, answer) = api.call(admin_post(resume, &json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["resumed_now"], true);
    let (_, answer) = api.call(admin_post(resume, &json!({}))).await;
    assert_eq!(answer["resumed_now"], false);
    assert_eq!(api.scalar("SELECT COUNT(*) FROM function_pauses").await, 0);
}

#[tokio::test]
async fn a_pause_and_a_resume_are_logged_once_each_with_who_and_why() {
    let api = Api::new().await;
    let pause = "/v1/admin/functions/grant-bonus/pause";
    let resume = "/v1/admin/functions/grant-bonus/resume";
    let body = json!({"reason": "partner ledger migration"});

    for (path, body) in [
        (pause, &body),
        (pause, &body),
        (resume, &json!({})),
        (resume, &json!({})),
    ] {
        let (status, answer) = api.call(admin_post(path, body)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }

    // The second pause and the second resume changed nothing, so they are not in the log.
    assert_eq!(
        api.ops_actions().await,
        [
            logged(
                "tests (break-glass)",
                "function.resume",
                "function:grant-bonus"
            ),
            logged(
                "tests (break-glass)",
                "function.pause",
                "function:grant-bonus"
            ),
        ]
    );
    let entries = api.ops_log().await;
    assert_eq!(
        entries[1]["detail"],
        json!({"reason": "partner ledger migration"})
    );
    assert_eq!(entries[0]["detail"]["paused_by"], "tests (break-glass)");
    assert_eq!(entries[0]["prev_hash"], entries[1]["row_hash"]);
}
