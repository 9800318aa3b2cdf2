//! The console's rules, through the router: strangers go to the login page, a break-glass
//! token opens a marked session (the cookie holds a session secret, never the token), OPS
//! reads but cannot act, forms from other sites are refused, an action is logged under the
//! session's subject, and the dead-letter page groups what the recorders wrote. (Signing in
//! through the identity provider: `console_sign_in.rs`; the whole console in a real browser:
//! `cli/tests/console_browser.rs`.)

use crate::support;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use paybus_api::{auth, role::Role};
use paybus_bonuses::{BonusRules, charge::PaymentGateway, completion};
use paybus_bus::dead_letter::group_counts;
use paybus_testkit::bonuses;
use support::{ADMIN_JWT_SECRET, Api, logged, token};
use tower::ServiceExt;

struct Page {
    status: StatusCode,
    location: Option<String>,
    cookie: Option<String>,
    body: String,
}

async fn send(api: &Api, request: Request<Body>) -> Page {
    let response = api.router().oneshot(request).await.expect("infallible");
    let header_of = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (status, location, cookie) = (
        response.status(),
        header_of(header::LOCATION),
        header_of(header::SET_COOKIE),
    );
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    Page {
        status,
        location,
        cookie,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// The session cookie's value of a break-glass session with `roles`, opened with the login
/// page's token form.
async fn session_of(api: &Api, roles: &[Role]) -> String {
    let opened = send(api, break_glass_login(&format!("token={}", token(roles)))).await;
    assert_eq!(opened.status, StatusCode::SEE_OTHER, "{}", opened.body);
    session_cookie(&opened).expect("a session cookie")
}

fn break_glass_login(form: &str) -> Request<Body> {
    Request::post("/console/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.to_owned()))
        .expect("request")
}

/// The session secret the answer's cookie carries.
fn session_cookie(page: &Page) -> Option<String> {
    page.cookie
        .as_deref()?
        .strip_prefix("paybus_console=")?
        .split(';')
        .next()
        .filter(|value| !value.is_empty())
        .map(str::to_owned)
}

async fn get_as(api: &Api, path: &str, roles: &[Role]) -> Request<Body> {
    Request::get(path)
        .header(
            header::COOKIE,
            format!("paybus_console={}", session_of(api, roles).await),
        )
        .body(Body::empty())
        .expect("request")
}

async fn post_as(api: &Api, path: &str, roles: &[Role], form: &str) -> Request<Body> {
    Request::post(path)
        .header(
            header::COOKIE,
            format!("paybus_console={}", session_of(api, roles).await),
        )
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.to_owned()))
        .expect("request")
}

#[tokio::test]
async fn strangers_and_unknown_sessions_are_sent_to_the_login_page() {
    let api = Api::new().await;
    let stranger = send(
        &api,
        Request::get("/console/jobs")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    let unknown = send(
        &api,
        Request::get("/console/jobs")
            .header(header::COOKIE, "paybus_console=not-a-session")
            .body(Body::empty())
            .expect("request"),
    )
    .await;

    assert_eq!(stranger.status, StatusCode::SEE_OTHER);
    assert_eq!(stranger.location.as_deref(), Some("/console/login"));
    assert_eq!(unknown.status, StatusCode::SEE_OTHER);
    assert_eq!(
        unknown.location.as_deref(),
        Some("/console/login?session=over")
    );
    let cleared = unknown.cookie.expect("the stale cookie cleared");
    assert!(cleared.starts_with("paybus_console=;"), "{cleared}");
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
}

#[tokio::test]
async fn a_break_glass_token_opens_a_marked_session_and_the_cookie_holds_no_token() {
    let api = Api::new().await;
    let ops = token(&[Role::Ops]);

    let accepted = send(&api, break_glass_login(&format!("token={ops}"))).await;
    let refused = send(&api, break_glass_login("token=garbage")).await;

    assert_eq!(accepted.status, StatusCode::SEE_OTHER, "{}", accepted.body);
    let cookie = accepted.cookie.clone().expect("a cookie");
    let secret = session_cookie(&accepted).expect("a session secret");
    assert!(
        !cookie.contains(&ops),
        "the token stays out of the cookie: {cookie}"
    );
    assert_eq!(secret.len(), 43, "32 random bytes, base64url: {secret}");
    // The token expires in an hour: so does the session (under the 12-hour lifetime).
    for attribute in ["HttpOnly", "SameSite=Lax", "Path=/console", "Max-Age=3"] {
        assert!(cookie.contains(attribute), "{attribute} missing: {cookie}");
    }
    assert!(
        !cookie.contains("Secure"),
        "the console is served over http: {cookie}"
    );
    let (method, issuer, subject): (String, String, String) =
        sqlx::query_as("SELECT auth_method, issuer, subject FROM console_sessions")
            .fetch_one(&api.env.db)
            .await
            .expect("the session row");
    assert_eq!(
        (method.as_str(), issuer.as_str(), subject.as_str()),
        ("BREAK_GLASS", "paybus:break-glass", "tests")
    );
    let page = send(
        &api,
        Request::get("/console/overview")
            .header(header::COOKIE, format!("paybus_console={secret}"))
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("tests (break-glass)"), "{}", page.body);
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert!(refused.cookie.is_none());
    assert!(
        refused
            .body
            .contains("Your token was refused: invalid token")
    );
}

#[tokio::test]
async fn without_break_glass_the_token_form_is_gone_and_its_sessions_are_over() {
    let on = Api::new().await;
    let secret = session_of(&on, &[Role::Admin]).await;
    // The same database, served by a process with break-glass off.
    let off = paybus_api::AppState {
        break_glass: false,
        ..on.state.clone()
    };
    let off_router = paybus_api::router(off);
    let answer = |request: Request<Body>| {
        let router = off_router.clone();
        async move {
            let response = router.oneshot(request).await.expect("infallible");
            let status = response.status();
            let location = response
                .headers()
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .expect("body");
            (
                status,
                location,
                String::from_utf8_lossy(&bytes).into_owned(),
            )
        }
    };

    let (status, _, login_page) = answer(
        Request::get("/console/login")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    let (form_status, _, _) = answer(break_glass_login(&format!(
        "token={}",
        token(&[Role::Admin])
    )))
    .await;
    let (page_status, location, _) = answer(
        Request::get("/console/overview")
            .header(header::COOKIE, format!("paybus_console={secret}"))
            .body(Body::empty())
            .expect("request"),
    )
    .await;

    assert_eq!(status, StatusCode::OK);
    assert!(!login_page.contains("Break-glass token"), "{login_page}");
    assert_eq!(form_status, StatusCode::FORBIDDEN);
    assert_eq!(page_status, StatusCode::SEE_OTHER);
    assert_eq!(location.as_deref(), Some("/console/login?session=over"));
}

#[tokio::test]
async fn an_ops_token_reads_the_pages_but_cannot_act() {
    let api = Api::new().await;
    for page in [
        "/console/dead-letters",
        "/console/jobs",
        "/console/suspensions",
        "/console/audit",
    ] {
        let read = send(&api, get_as(&api, page, &[Role::Ops]).await).await;
        assert_eq!(read.status, StatusCode::OK, "{page}: {}", read.body);
        assert!(read.body.starts_with("<!DOCTYPE html>"), "{page}");
    }

    let retry = send(
        &api,
        post_as(&api, "/console/jobs/1/retry", &[Role::Ops], "").await,
    )
    .await;

    assert_eq!(retry.status, StatusCode::FORBIDDEN);
    assert!(
        retry.body.contains("needs the ADMIN role"),
        "{}",
        retry.body
    );
}

#[tokio::test]
async fn a_retry_from_the_console_is_logged_under_the_session_s_subject() {
    let api = Api::without_four_eyes().await;
    bonuses::active_event(&api.env.db, "console 10%", 10, 9).await;
    let member = bonuses::member(&api.env.db).await;
    let purchase = bonuses::purchase(&api.env.db, member, PaymentGateway::Pg, 100).await;
    let completed = completion::complete(
        &api.services.outbox,
        BonusRules::default(),
        &purchase.paid(),
    )
    .await
    .expect("complete the purchase");
    let job = completed.charge().bonus_jobs[0].job_id;
    sqlx::query(
        "UPDATE charge_event_job SET status = 'FAILED', retry_count = 3, \
         last_error = 'gateway down' WHERE id = ?",
    )
    .bind(job)
    .execute(&api.env.db)
    .await
    .expect("fail the job");
    let carol = auth::issue(
        ADMIN_JWT_SECRET,
        "carol",
        &[Role::Admin],
        std::time::Duration::from_secs(3600),
    )
    .expect("a break-glass token");
    let opened = send(&api, break_glass_login(&format!("token={carol}"))).await;
    let session = session_cookie(&opened).expect("a session");

    let page = send(
        &api,
        Request::post(format!("/console/jobs/{job}/retry"))
            .header(header::COOKIE, format!("paybus_console={session}"))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::empty())
            .expect("request"),
    )
    .await;

    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(
        api.ops_actions().await,
        [logged(
            "carol (break-glass)",
            "bonus_job.retry",
            &format!("charge_event_job:{job}")
        )]
    );
}

#[tokio::test]
async fn a_form_posted_from_another_site_is_refused() {
    let api = Api::new().await;
    let mut request = post_as(&api, "/console/jobs/1/retry", &[Role::Admin], "").await;
    request.headers_mut().insert(
        header::ORIGIN,
        "https://evil.example".parse().expect("header"),
    );
    request
        .headers_mut()
        .insert(header::HOST, "127.0.0.1:8080".parse().expect("header"));

    let page = send(&api, request).await;

    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(page.body.contains("another site"));
}

#[tokio::test]
async fn dead_letters_are_grouped_by_function_and_reason_largest_first() {
    let api = Api::new().await;
    for (id, function, reason, status) in [
        ("a", "grant-bonus", "rejected", "NEW"),
        ("b", "confirm-deposit", "rejected", "NEW"),
        ("c", "confirm-deposit", "rejected", "NEW"),
        ("d", "confirm-deposit", "rejected", "ARCHIVED"),
    ] {
        sqlx::query(
            "INSERT INTO dead_letters (dead_letter_id, function_name, routing_key, reason, \
             error, body, status) VALUES (?, ?, 'k', ?, 'e', '{}', ?)",
        )
        .bind(id)
        .bind(function)
        .bind(reason)
        .bind(status)
        .execute(&api.env.db)
        .await
        .expect("insert");
    }
    // Written around the recorder: their groups counted as `paybus dead-letters recount` does.
    group_counts::recount(&api.env.db).await.expect("recount");

    let page = send(
        &api,
        get_as(&api, "/console/dead-letters", &[Role::Ops]).await,
    )
    .await;

    assert_eq!(page.status, StatusCode::OK);
    let deposit = page
        .body
        .find("data-function=\"confirm-deposit\"")
        .expect("group");
    let bonus = page
        .body
        .find("data-function=\"grant-bonus\"")
        .expect("group");
    assert!(deposit < bonus, "the larger group first");
    let row = &page.body[deposit..bonus];
    assert!(
        row.contains("<td class=\"n letters\">2</td>"),
        "archived letters are not waiting: {row}"
    );
}

#[tokio::test]
async fn a_dead_letter_dry_run_from_the_console_shows_each_letters_verdict() {
    let api = Api::new().await;
    let letter = sqlx::query(
        "INSERT INTO dead_letters (dead_letter_id, function_name, routing_key, reason, error, \
         body) VALUES ('unreadable', 'grant-bonus', 'k', 'rejected', 'e', '{}')",
    )
    .execute(&api.env.db)
    .await
    .expect("insert")
    .last_insert_id();

    let page = send(
        &api,
        post_as(
            &api,
            "/console/dead-letters/replay",
            &[Role::Admin],
            "function=grant-bonus&reason=rejected&mode=dry-run",
        )
        .await,
    )
    .await;

    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains(
            "Dry run of group grant-bonus / rejected: 1 letter(s) classified — safe: 0, \
             already_applied: 0, needs_human: 1. Nothing was sent;"
        ),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("<button type=\"submit\" disabled>Nothing is safe to replay</button>"),
        "replay is disabled when the dry run found nothing safe: {}",
        page.body
    );
    assert!(
        page.body.contains(&format!(
            "data-letter-id=\"{letter}\" data-verdict=\"needs_human\""
        )),
        "the letter's own row: {}",
        page.body
    );
    assert!(
        page.body.contains("is not a readable"),
        "the verdict's reason: {}",
        page.body
    );
}

#[tokio::test]
async fn the_audit_page_shows_the_auditors_latest_pass_and_runs_no_check_itself() {
    let api = Api::new().await;
    let before = send(&api, get_as(&api, "/console/audit", &[Role::Ops]).await).await;
    assert!(
        before.body.contains("data-clean=\"unknown\""),
        "no pass yet: {}",
        before.body
    );

    // Cans nobody paid for, found by a pass of the auditor.
    let member = sqlx::query("INSERT INTO members (nickname, pg_can) VALUES ('gifted', 5)")
        .execute(&api.env.db)
        .await
        .expect("insert")
        .last_insert_id();
    paybus_maintenance::auditor::Auditor::new(
        api.services.pool.clone(),
        paybus_catalog::audit_checks(),
        paybus_maintenance::auditor::AuditorConfig::default(),
    )
    .pass()
    .await
    .expect("a pass");
    // Put right since: the page still shows what the latest pass found, not a live check.
    sqlx::query("UPDATE members SET pg_can = 0 WHERE id = ?")
        .bind(member)
        .execute(&api.env.db)
        .await
        .expect("update");

    let page = send(&api, get_as(&api, "/console/audit", &[Role::Ops]).await).await;

    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("data-clean=\"false\""), "{}", page.body);
    assert!(
        page.body
            .contains("tr class=\"finding\" data-check=\"member_balance_mismatch\""),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains(&format!("member {member} holds 5 pg cans")),
        "{}",
        page.body
    );
}

#[tokio::test]
async fn the_overview_shows_paused_functions_failures_of_the_hour_breakers_and_the_outbox_lag() {
    let api = Api::new().await;
    let db = &api.env.db;
    // A failure recorded just now, one of two hours ago (not in the last hour's count).
    for (id, ago) in [("recent", 0), ("old", 7_200)] {
        sqlx::query(
            "INSERT INTO dead_letters (dead_letter_id, function_name, routing_key, reason, \
             error, body) VALUES (?, 'confirm-deposit', 'k', 'failed', 'e', '{}')",
        )
        .bind(id)
        .execute(db)
        .await
        .expect("insert");
        sqlx::query(
            "INSERT INTO dead_letter_failures (failure_id, dead_letter_id, failed_at) \
             VALUES (?, ?, NOW(6) - INTERVAL ? SECOND)",
        )
        .bind(format!("f-{id}"))
        .bind(id)
        .bind(ago)
        .execute(db)
        .await
        .expect("insert");
    }
    group_counts::recount(db).await.expect("recount");
    sqlx::query(
        "INSERT INTO partners (name, webhook_url, webhook_failures, \
         webhook_open_until) VALUES ('flaky', NULL, 5, NOW(6) + INTERVAL 1 MINUTE)",
    )
    .execute(db)
    .await
    .expect("insert");
    sqlx::query(
        "INSERT INTO outbox_messages (message_id, routing_key, correlation_id, body, created_at) \
         VALUES (UUID(), 'k', UUID(), 'x', NOW(6) - INTERVAL 30 SECOND)",
    )
    .execute(db)
    .await
    .expect("insert");

    let paused = send(
        &api,
        post_as(
            &api,
            "/console/functions/grant-bonus/pause",
            &[Role::Admin],
            "reason=incident+42",
        )
        .await,
    )
    .await;
    assert_eq!(paused.status, StatusCode::OK);
    assert!(
        paused.body.contains("grant-bonus paused"),
        "{}",
        paused.body
    );

    let (status, overview) = api
        .call(support::with_roles(
            "GET",
            "/v1/admin/overview",
            &[Role::Ops],
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{overview}");
    let function = |name: &str| {
        overview["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(function("grant-bonus")["paused"]["reason"], "incident 42");
    assert!(function("confirm-deposit")["paused"].is_null());
    assert_eq!(function("confirm-deposit")["dead_letters_new"], 2);
    assert_eq!(function("confirm-deposit")["failures_last_hour"], 1);
    assert_eq!(overview["breakers"][0]["name"], "flaky");
    assert_eq!(overview["breakers"][0]["state"], "open");
    assert_eq!(overview["outbox"]["backlog"], 1);
    assert!(overview["outbox"]["oldest_seconds"].as_f64().unwrap() >= 29.0);

    let page = send(&api, get_as(&api, "/console/overview", &[Role::Ops]).await).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body
            .contains("data-function=\"grant-bonus\" data-paused=\"true\""),
        "{}",
        page.body
    );
    assert!(page.body.contains("incident 42"), "{}", page.body);
    let resumed = send(
        &api,
        post_as(
            &api,
            "/console/functions/grant-bonus/resume",
            &[Role::Admin],
            "",
        )
        .await,
    )
    .await;
    assert!(
        resumed.body.contains("grant-bonus resumed"),
        "{}",
        resumed.body
    );
    assert!(
        resumed
            .body
            .contains("data-function=\"grant-bonus\" data-paused=\"false\""),
        "{}",
        resumed.body
    );
}

#[tokio::test]
async fn a_withdrawal_is_traced_by_the_api_and_the_console_and_nonsense_is_a_400_or_404() {
    let api = Api::new().await;
    let partner = api.partner("acme").await;
    let (status, created) = api
        .call(support::admin_post(
            "/v1/admin/withdrawals",
            &serde_json::json!({"partner_id": partner, "status": "BROADCASTING",
                "currency": "USDT", "amount": "42.5", "to_address": "T-address"}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let withdrawal = created["id"].as_u64().expect("an id");

    let (status, trace) = api
        .call(support::with_roles(
            "GET",
            &format!("/v1/admin/trace/withdrawal/{withdrawal}"),
            &[Role::Ops],
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{trace}");
    assert_eq!(trace["row"]["amount"], "42.5");
    assert_eq!(trace["events"][0]["source"], "row");
    assert_eq!(trace["events"][1]["what"], "entered as BROADCASTING");
    assert_eq!(trace["unreadable"], serde_json::json!([]));
    for (path, expected) in [
        ("/v1/admin/trace/payout/1", StatusCode::BAD_REQUEST),
        ("/v1/admin/trace/withdrawal/x", StatusCode::BAD_REQUEST),
        ("/v1/admin/trace/withdrawal/0", StatusCode::BAD_REQUEST),
        ("/v1/admin/trace/withdrawal/999", StatusCode::NOT_FOUND),
    ] {
        let (status, answer) = api
            .call(support::with_roles("GET", path, &[Role::Ops]))
            .await;
        assert_eq!(status, expected, "{path}: {answer}");
    }

    let page = send(
        &api,
        get_as(
            &api,
            &format!("/console/trace?kind=withdrawal&id={withdrawal}"),
            &[Role::Ops],
        )
        .await,
    )
    .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("id=\"timeline\""), "{}", page.body);
    assert!(
        page.body.contains("created (now BROADCASTING)"),
        "{}",
        page.body
    );
}

#[tokio::test]
async fn a_trace_that_cannot_read_one_part_answers_with_the_rest_and_names_it() {
    let api = Api::new().await;
    let partner = api.partner("acme").await;
    let (status, created) = api
        .call(support::admin_post(
            "/v1/admin/withdrawals",
            &serde_json::json!({"partner_id": partner, "status": "BROADCASTING",
                "currency": "USDT", "amount": "7", "to_address": "T-address"}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let withdrawal = created["id"].as_u64().expect("an id");
    // A value this code cannot decode, as a later release's expanded schema could leave.
    for sql in [
        "ALTER TABLE withdrawal_status_history MODIFY to_status VARCHAR(16) NULL",
        "UPDATE withdrawal_status_history SET to_status = NULL",
    ] {
        sqlx::query(sql).execute(&api.env.db).await.expect(sql);
    }

    let (status, trace) = api
        .call(support::with_roles(
            "GET",
            &format!("/v1/admin/trace/withdrawal/{withdrawal}"),
            &[Role::Ops],
        ))
        .await;
    let page = send(
        &api,
        get_as(
            &api,
            &format!("/console/trace?kind=withdrawal&id={withdrawal}"),
            &[Role::Ops],
        )
        .await,
    )
    .await;

    assert_eq!(status, StatusCode::OK, "{trace}");
    assert_eq!(trace["row"]["amount"], "7");
    assert_eq!(trace["events"][0]["what"], "created (now BROADCASTING)");
    assert_eq!(trace["unreadable"][0]["part"], "status history", "{trace}");
    assert_eq!(
        trace["unreadable"][0]["problem"],
        "a stored value could not be decoded (the server's log has the cause)"
    );
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body
            .contains("Could not read the status history: a stored value could not be decoded"),
        "{}",
        page.body
    );
    assert!(page.body.contains("created (now BROADCASTING)"));
}
