//! The console in a real browser: Debian's chromium driven by playwright (PyPI), against the
//! real `paybus serve` binary and its own test database, people signing in through a real
//! OpenID Connect provider (`paybus_testkit::oidc`) with break-glass off. The script
//! (`tests/console_browser.py`) is refused as carol (no paybus role), signs in as alice on the
//! provider's own login and consent pages, sees the dead-letter groups with the money at
//! stake, dry-runs a group and sees each letter's verdict (one safe, two needing a human); bob,
//! in a second browser context, signs in, approves and runs the replay and sees each letter's
//! result (the safe one re-sent, the others not), replays it again (nothing sent), asks for
//! the retry of a FAILED bonus job, which alice approves and executes; alice sees a
//! suspension's progress, the auditor's latest pass and both sessions, then signs out, and
//! her old cookie, put back into a fresh browser, opens nothing. A real confirm-withdrawal
//! consumer runs beside it, and the test then checks the database: the replayed confirmation
//! debited its withdrawal exactly once, every click left its trail, and the ops log names
//! alice and bob by issuer and subject. Screenshots land in `.local/test-output/console/`.

use crate::api_process;

use std::{process::Command, time::Duration};

use api_process::{ApiProcess, PAYMENTS_SECRET, output_dir, provider_admin_token, python_tool};
use paybus_bus::{Envelope, dead_letter::group_counts};
use paybus_confirm_withdrawal::ConfirmWithdrawal;
use paybus_confirmations::WithdrawalTxConfirmed;
use paybus_maintenance::auditor::{Auditor, AuditorConfig};
use paybus_runtime::runner::Runner;
use paybus_testkit::{
    TestEnv, eventually, free_port,
    oidc::{self, OidcProvider, OidcSetup},
    scalar,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// A FAILED bonus job, the way W3 makes one: an event, a member's paid charge (through the
/// signed verify call), then grant-bonus giving up (here: the row set as it leaves it).
async fn failed_bonus_job(env: &TestEnv, api: &ApiProcess, token: &str) -> u64 {
    let now = chrono::Utc::now();
    api.admin_post(
        token,
        "/v1/admin/charge-events",
        json!({
            "title": "console test", "add_percent": 10,
            "start_at": now - chrono::Duration::days(1), "end_at": now + chrono::Duration::days(1),
        }),
    )
    .await;
    let member = api
        .admin_post(token, "/v1/admin/members", json!({"nickname": "console"}))
        .await;
    let charge = api
        .admin_post(
            token,
            "/v1/admin/charges",
            json!({
                "member_id": member["id"], "cans": 10, "price": "1000",
                "payment_gateway": "PG", "method": "card",
            }),
        )
        .await;
    let completed = api
        .signed_post(
            PAYMENTS_SECRET,
            "/v1/payments/pg/verify",
            json!({"charge_id": charge["id"], "gateway_tx_id": "pg-console-1", "amount": "1000"}),
        )
        .await;
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

/// Dead letters as the recorders write them: two of one group that need a human (their
/// bodies are unreadable), one of another group.
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
    group_counts::recount(&env.db)
        .await
        .expect("count the letters' groups");
}

/// A withdrawal of 100 USDT still BROADCASTING, and its confirmation dead-lettered in the
/// group of the two above (the database was down for longer than the retries): a letter that
/// is safe to replay. Returns (withdrawal id, letter id).
async fn safe_letter(env: &TestEnv) -> (u64, u64) {
    let partner = sqlx::query("INSERT INTO partners (name) VALUES ('console partner')")
        .execute(&env.db)
        .await
        .expect("insert a partner")
        .last_insert_id();
    let withdrawal = sqlx::query(
        "INSERT INTO withdrawals (partner_id, kind, status, currency, amount, to_address, tx_hash) \
         VALUES (?, 'NORMAL', 'BROADCASTING', 'USDT', 100, 'T-address', '0xconsole')",
    )
    .bind(partner)
    .execute(&env.db)
    .await
    .expect("insert a withdrawal")
    .last_insert_id();
    let message = Envelope::new(WithdrawalTxConfirmed {
        withdrawal_id: withdrawal,
        tx_hash: "0xconsole".to_owned(),
    })
    .to_outgoing()
    .expect("an envelope");
    let letter = sqlx::query(
        "INSERT INTO dead_letters (dead_letter_id, function_name, message_id, routing_key, \
         reason, error, attempts, body) \
         VALUES ('dl-safe', 'confirm-withdrawal', ?, ?, 'rejected', \
                 'database unavailable for longer than the retries', 3, ?)",
    )
    .bind(message.id.to_string())
    .bind(&message.routing_key)
    .bind(&message.body)
    .execute(&env.db)
    .await
    .expect("insert the safe letter")
    .last_insert_id();
    group_counts::recount(&env.db)
        .await
        .expect("count the letters' groups");
    (withdrawal, letter)
}

/// A market with 8 open orders, suspended: its cancellations wait in the queue (no consumer
/// runs beside `paybus serve`), so the suspension is in progress.
async fn suspension(api: &ApiProcess, token: &str) {
    api.admin_post(token, "/v1/admin/markets", json!({"symbol": "BTC-USDT"}))
        .await;
    for account in 1..=8 {
        api.admin_post(
            token,
            "/v1/admin/markets/BTC-USDT/orders",
            json!({
                "account_id": account, "side": "BUY", "price": "100", "quantity": "1",
            }),
        )
        .await;
    }
    api.admin_post(
        token,
        "/v1/admin/markets/BTC-USDT/suspend",
        json!({"note": "exchange halt"}),
    )
    .await;
}

// The script runs in a blocking call on one worker while the consumer works on the other:
// the replay it clicks is applied while it runs, as in production.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_sign_in_at_the_provider_replay_dead_letters_under_four_eyes_and_sign_out_in_a_real_browser()
 {
    let Some(python) = python_tool("PAYBUS_TEST_PYTHON", "python") else {
        return;
    };
    let chromium =
        std::env::var("PAYBUS_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let port = free_port();
    let console = format!("http://127.0.0.1:{port}");
    let Some(provider) = OidcProvider::start(OidcSetup::default().console_redirect(
        &format!("{console}/console/callback"),
        &format!("{console}/console/login"),
    ))
    .await
    else {
        return;
    };
    let issuer = provider.issuer();
    let env = TestEnv::new().await;
    let services = env
        .services(&paybus_catalog::queues(&Default::default()))
        .await;
    let api = ApiProcess::start_on(
        &env,
        port,
        &[
            ("PAYBUS_BREAK_GLASS", Some("false")),
            ("PAYBUS_OIDC_ISSUER", Some(&issuer)),
            ("PAYBUS_OIDC_AUDIENCE", Some(provider.audience())),
            (
                "PAYBUS_OIDC_CONSOLE_CLIENT_ID",
                Some(oidc::CONSOLE_CLIENT_ID),
            ),
            (
                "PAYBUS_OIDC_CONSOLE_CLIENT_SECRET",
                Some(oidc::CONSOLE_CLIENT_SECRET),
            ),
            ("PAYBUS_CONSOLE_URL", Some(&console)),
        ],
    )
    .await;
    let token = provider_admin_token(&provider, "seed");
    dead_letters(&env).await;
    let (withdrawal, safe) = safe_letter(&env).await;
    let job = failed_bonus_job(&env, &api, &token).await;
    suspension(&api, &token).await;
    // One pass of the continuous auditor, as the sweeper runs it: what the audit page shows.
    Auditor::new(
        env.db.clone(),
        paybus_catalog::audit_checks(),
        AuditorConfig::default(),
    )
    .pass()
    .await
    .expect("an auditor pass");
    // The function the replayed confirmation goes to (`paybus serve` runs no consumer).
    let mut runner = Runner::new(services);
    runner.add_function(ConfirmWithdrawal);
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(runner.run(shutdown.clone()));
    let screenshots = output_dir("console");

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/console_browser.py");
    // Each step of the script waits at most 10 s, so it cannot hang.
    // -B: no bytecode of the scripts' shared module (console_sign_in.py) left in the tree.
    let output = Command::new(python)
        .arg("-B")
        .arg(script)
        .arg(&api.base_url)
        .arg(&screenshots)
        .arg(&chromium)
        .arg(safe.to_string())
        .output()
        .expect("run the browser script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the browser script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // The replay clicked in the browser reached the function: the withdrawal is confirmed and
    // debited once; the second replay sent nothing.
    let confirmed = || async {
        sqlx::query_scalar::<_, String>("SELECT status FROM withdrawals WHERE id = ?")
            .bind(withdrawal)
            .fetch_one(&env.db)
            .await
            .expect("read the withdrawal")
            == "CONFIRMED"
    };
    if !eventually(Duration::from_secs(60), confirmed).await {
        let (unpublished, letters): (i64, Vec<(String, String)>) = (
            sqlx::query_scalar("SELECT COUNT(*) FROM outbox_messages WHERE published_at IS NULL")
                .fetch_one(&env.db)
                .await
                .expect("read the outbox"),
            sqlx::query_as("SELECT dead_letter_id, status FROM dead_letters ORDER BY id")
                .fetch_all(&env.db)
                .await
                .expect("read the dead letters"),
        );
        panic!(
            "the replayed confirmation was not applied within 60 s: {unpublished} outbox \
             message(s) unpublished, dead letters {letters:?}; the script said:\n{stdout}"
        );
    }
    // Room for a (wrong) second application to land before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    consumer
        .await
        .expect("the consumer task")
        .expect("the consumer");
    let debits: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM ledger_entries WHERE reference_type = 'WITHDRAWAL' \
         AND reference_id = ? AND entry_type = 'DEBIT'",
    )
    .bind(withdrawal)
    .fetch_one(&env.db)
    .await
    .expect("count the debits");
    assert_eq!(debits, 1, "debited once");
    let sent = scalar(
        &env.db,
        "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'withdrawal.tx_confirmed'",
    )
    .await;
    assert_eq!(
        sent, 1,
        "one confirmation re-sent, by the first replay only"
    );
    // Every replay is on the letters' trail, under the person who ran it: the operation bob
    // approved and ran replayed the safe letter once and refused the others; the second dry
    // run of the group found nothing to confirm and ran nothing.
    let trail: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT l.dead_letter_id, a.result, a.actor, COUNT(*) FROM dead_letter_actions a \
         JOIN dead_letters l ON l.id = a.dead_letter_id WHERE a.action = 'REPLAY' \
         GROUP BY l.dead_letter_id, a.result, a.actor ORDER BY l.dead_letter_id",
    )
    .fetch_all(&env.db)
    .await
    .expect("read the trail");
    let second = "bob@example.com".to_owned();
    assert_eq!(
        trail,
        [
            ("dl-1".to_owned(), "NOT_SENT".to_owned(), second.clone(), 1),
            ("dl-2".to_owned(), "NOT_SENT".to_owned(), second.clone(), 1),
            ("dl-safe".to_owned(), "REPLAYED".to_owned(), second, 1),
        ]
    );
    let approved: (String, String, String) = sqlx::query_as(
        "SELECT requested_by, approved_by, status FROM dead_letter_operations \
         WHERE approved_by IS NOT NULL",
    )
    .fetch_one(&env.db)
    .await
    .expect("the approved operation");
    assert_eq!(
        approved,
        (
            "alice@example.com".to_owned(),
            "bob@example.com".to_owned(),
            "DONE".to_owned()
        )
    );
    // The ops log names both by the provider's issuer and their subjects.
    let log: Value = reqwest::Client::new()
        .get(format!("{}/v1/admin/ops-log?limit=500", api.base_url))
        .bearer_auth(&token)
        .send()
        .await
        .expect("the ops log")
        .json()
        .await
        .expect("JSON");
    let who_did = |action: &str| -> Vec<(String, String, String, String)> {
        log["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|entry| entry["action"] == action)
            .map(|entry| {
                let text = |field: &str| entry[field].as_str().unwrap_or_default().to_owned();
                (
                    text("actor"),
                    text("actor_issuer"),
                    text("actor_subject"),
                    text("auth_method"),
                )
            })
            .collect()
    };
    let person = |name: &str, subject: &str| {
        (
            name.to_owned(),
            issuer.clone(),
            subject.to_owned(),
            "OIDC".to_owned(),
        )
    };
    let alice = || person("alice@example.com", "alice");
    let bob = || person("bob@example.com", "bob");
    // Newest first: bob's second replay of the group (nothing safe), alice's dry run.
    assert_eq!(who_did("dead_letter_operation.request"), [bob(), alice()]);
    assert_eq!(who_did("dead_letter_operation.approve"), [bob()]);
    assert_eq!(who_did("approval.request"), [bob()]);
    assert_eq!(who_did("approval.approve"), [alice()]);
    assert_eq!(who_did("function.pause"), [alice()]);
    // Carol's refused sign-in made no session; alice's is over, bob's is not.
    let sessions: Vec<(String, bool)> =
        sqlx::query_as("SELECT subject, ended_at IS NOT NULL FROM console_sessions ORDER BY id")
            .fetch_all(&env.db)
            .await
            .expect("the sessions");
    assert_eq!(
        sessions,
        [("alice".to_owned(), true), ("bob".to_owned(), false)]
    );

    // The retry clicked in the browser reached the database.
    let status: String = sqlx::query_scalar("SELECT status FROM charge_event_job WHERE id = ?")
        .bind(job)
        .fetch_one(&env.db)
        .await
        .expect("read the job");
    assert_eq!(status, "PENDING");
    for shot in [
        "00-refused",
        "01-login",
        "01-provider-login",
        "02-overview-paused",
        "02-dead-letters",
        "03-dry-run",
        "04-approved",
        "05-replay",
        "06-letter",
        "07-replay-again",
        "08-group",
        "09-jobs",
        "10-job-approved",
        "11-suspensions",
        "12-audit",
        "13-sessions",
        "14-signed-out",
        "15-old-cookie",
    ] {
        let path = screenshots.join(format!("{shot}.png"));
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(size > 1_000, "{} missing or empty", path.display());
    }
}
