//! The console in a real browser: Debian's chromium driven by playwright (PyPI), against the
//! real `paybus serve` binary and its own test database. The script
//! (`tests/console_browser.py`) logs in with a token from `paybus token issue`, sees the
//! dead-letter groups and dry-runs one (the replay API is absent from this build: the page
//! must say so), opens the bonus jobs and retries the FAILED one, sees a suspension's
//! progress and the audit status. Screenshots land in `.local/test-output/console/`.

mod api_process;

use std::process::Command;

use api_process::{ApiProcess, output_dir, python_tool};
use paybus_platform::{signature, testing::TestEnv};
use serde_json::{Value, json};

const PAYMENTS_SECRET: &str = "payments-secret-for-black-box-tests";

/// Calls the admin API as ops would; the JSON answer (asserting it succeeded).
async fn admin(api: &ApiProcess, token: &str, path: &str, body: Value) -> Value {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", api.base_url))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("admin request");
    let status = response.status();
    let answer: Value = response.json().await.expect("JSON answer");
    assert!(status.is_success(), "POST {path}: {status} {answer}");
    answer
}

/// A FAILED bonus job, the way W3 makes one: an event, a member's paid charge (through the
/// signed verify call), then grant-bonus giving up (here: the row set as it leaves it).
async fn failed_bonus_job(env: &TestEnv, api: &ApiProcess, token: &str) -> u64 {
    let now = chrono::Utc::now();
    admin(
        api,
        token,
        "/v1/admin/charge-events",
        json!({
            "title": "console test", "add_percent": 10,
            "start_at": now - chrono::Duration::days(1), "end_at": now + chrono::Duration::days(1),
        }),
    )
    .await;
    let member = admin(
        api,
        token,
        "/v1/admin/members",
        json!({"nickname": "console"}),
    )
    .await;
    let charge = admin(
        api,
        token,
        "/v1/admin/charges",
        json!({
            "member_id": member["id"], "cans": 10, "price": "1000",
            "payment_gateway": "PG", "method": "card",
        }),
    )
    .await;
    let body =
        json!({"charge_id": charge["id"], "gateway_tx_id": "pg-console-1", "amount": "1000"})
            .to_string();
    let response = reqwest::Client::new()
        .post(format!("{}/v1/payments/pg/verify", api.base_url))
        .header(
            signature::HEADER,
            signature::sign(
                PAYMENTS_SECRET.as_bytes(),
                chrono::Utc::now().timestamp(),
                body.as_bytes(),
            ),
        )
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("verify");
    let completed: Value = response.json().await.expect("JSON");
    let job = completed["bonus_jobs"][0]["job_id"]
        .as_u64()
        .expect("a bonus job");
    sqlx::query(
        "UPDATE charge_event_job SET status = 'FAILED', retry_count = 3, \
         last_error = 'partner ledger refused: injected' WHERE id = ?",
    )
    .bind(job)
    .execute(&env.db)
    .await
    .expect("fail the job");
    job
}

/// Dead letters as the recorders write them: two of one group, one of another.
async fn dead_letters(env: &TestEnv) {
    for (id, function, reason, error) in [
        (
            "dl-1",
            "confirm-withdrawal",
            "rejected",
            "withdrawal 9001 not found",
        ),
        (
            "dl-2",
            "confirm-withdrawal",
            "rejected",
            "withdrawal 9002 not found",
        ),
        (
            "dl-3",
            "deliver-webhook",
            "delivery-limit",
            "partner answered 500 five times",
        ),
    ] {
        sqlx::query(
            "INSERT INTO dead_letters (dead_letter_id, function_name, message_id, routing_key, \
             reason, error, attempts, body) VALUES (?, ?, UUID(), 'withdrawal.tx_confirmed', ?, ?, 3, '{}')",
        )
        .bind(id)
        .bind(function)
        .bind(reason)
        .bind(error)
        .execute(&env.db)
        .await
        .expect("insert a dead letter");
    }
}

/// A market with 8 open orders, suspended: its cancellations wait in the queue (no consumer
/// runs beside `paybus serve`), so the suspension is in progress.
async fn suspension(api: &ApiProcess, token: &str) {
    admin(
        api,
        token,
        "/v1/admin/markets",
        json!({"symbol": "BTC-USDT"}),
    )
    .await;
    for account in 1..=8 {
        admin(
            api,
            token,
            "/v1/admin/markets/BTC-USDT/orders",
            json!({
                "account_id": account, "side": "BUY", "price": "100", "quantity": "1",
            }),
        )
        .await;
    }
    admin(
        api,
        token,
        "/v1/admin/markets/BTC-USDT/suspend",
        json!({"note": "exchange halt"}),
    )
    .await;
}

#[tokio::test]
async fn ops_log_in_see_dead_letters_retry_a_job_and_watch_a_suspension_in_a_real_browser() {
    let Some(python) = python_tool("PAYBUS_TEST_PYTHON", "python") else {
        return;
    };
    let chromium =
        std::env::var("PAYBUS_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let env = TestEnv::new().await;
    let api = ApiProcess::start(&env).await;
    let token = api.token(&["ADMIN"]);
    dead_letters(&env).await;
    let job = failed_bonus_job(&env, &api, &token).await;
    suspension(&api, &token).await;
    let screenshots = output_dir("console");

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/console_browser.py");
    // Each step of the script waits at most 10 s, so it cannot hang.
    let output = Command::new(python)
        .arg(script)
        .args([&api.base_url, &token])
        .arg(&screenshots)
        .arg(&chromium)
        .output()
        .expect("run the browser script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the browser script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // The retry clicked in the browser reached the database.
    let status: String = sqlx::query_scalar("SELECT status FROM charge_event_job WHERE id = ?")
        .bind(job)
        .fetch_one(&env.db)
        .await
        .expect("read the job");
    assert_eq!(status, "PENDING");
    for shot in [
        "1-login",
        "2-dead-letters",
        "3-dry-run",
        "4-group",
        "5-jobs",
        "6-job-retried",
        "7-suspensions",
        "8-audit",
    ] {
        let path = screenshots.join(format!("{shot}.png"));
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(size > 1_000, "{} missing or empty", path.display());
    }
}
