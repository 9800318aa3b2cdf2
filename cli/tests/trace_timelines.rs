//! "Where did this money go?" for every kind the trace takes, with rows made only the way users
//! make them: a real `paybus run` (API and functions), an ADMIN and a partner calling the public
//! API, the chain monitor and the payment service sending signed webhooks, a quote service and a
//! partner endpoint as real HTTP servers. Each trace is read three ways — `paybus trace`, `GET
//! /v1/admin/trace/{kind}/{id}` and the console's page — and must show the whole timeline.

use crate::api_process;

use api_process::paybus;
use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use axum::{Router, routing::post};
use paybus_config::signature;
use paybus_testkit::{TestEnv, free_port, p2p::QuoteStub};
use serde_json::{Value, json};

const ADMIN_SECRET: &str = "trace-timelines-admin-secret-0123456789";
const CHAIN_SECRET: &str = "trace-timelines-chain-secret-0123";
const PAYMENTS_SECRET: &str = "trace-timelines-payments-secret-01";

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The paybus process and how to reach it as an ADMIN.
struct Paybus {
    _process: Running,
    env: TestEnv,
    base: String,
    token: String,
    client: reqwest::Client,
}

impl Paybus {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = paybus(&self.env);
        command
            .args(args)
            .env("PAYBUS_ADMIN_JWT_SECRET", ADMIN_SECRET)
            .env("PAYBUS_BREAK_GLASS", "true")
            .env("RUST_LOG", "warn");
        command
    }

    async fn admin(&self, path: &str, body: Value) -> Value {
        let answer = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let text = answer.text().await.unwrap();
        assert!(status.is_success(), "POST {path}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    }

    async fn as_partner(&self, key: &str, path: &str, idempotency_key: &str, body: Value) -> Value {
        let answer = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
            .header("Idempotency-Key", idempotency_key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let text = answer.text().await.unwrap();
        assert!(status.is_success(), "POST {path}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// POSTs `body` signed as the chain monitor and the payment service sign.
    async fn signed(&self, path: &str, body: Value, secret: &str) -> Value {
        let body = body.to_string();
        let now = chrono::Utc::now().timestamp();
        let answer = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .header(
                signature::HEADER,
                signature::sign(secret.as_bytes(), now, body.as_bytes()),
            )
            .body(body)
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let text = answer.text().await.unwrap();
        assert!(status.is_success(), "POST {path}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// Waits (at most 60 s) until `sql` counts `want`.
    async fn until(&self, sql: &str, want: i64) {
        let started = Instant::now();
        loop {
            let got: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
                .fetch_one(&self.env.db)
                .await
                .unwrap();
            if got == want {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "waited 60 s for {sql} = {want}, it is {got}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The trace of `kind` `id` as the CLI prints it (`--json`), as the API answers it and as
    /// the console shows it: the API's JSON, after checking that the other two agree with it.
    async fn trace(&self, kind: &str, id: u64) -> Value {
        let printed = self
            .command(&["trace", kind, &id.to_string(), "--json"])
            .output()
            .unwrap();
        assert!(
            printed.status.success(),
            "paybus trace {kind} {id}: {}\n{}",
            printed.status,
            String::from_utf8_lossy(&printed.stderr)
        );
        let from_cli: Value = serde_json::from_slice(&printed.stdout).unwrap();

        let answer = self
            .client
            .get(format!("{}/v1/admin/trace/{kind}/{id}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "GET /v1/admin/trace/{kind}/{id}");
        let from_api: Value = answer.json().await.unwrap();
        assert_eq!(from_cli["events"], from_api["events"], "{kind} {id}");
        assert_eq!(from_cli["row"], from_api["row"], "{kind} {id}");

        let page = self
            .client
            .get(format!("{}/console/trace?kind={kind}&id={id}", self.base))
            .header(
                "cookie",
                format!(
                    "paybus_console={}",
                    api_process::console_session(&self.base, &self.token).await
                ),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200, "the console's trace of {kind} {id}");
        let page = page.text().await.unwrap();
        for event in from_api["events"].as_array().unwrap() {
            let what = event["what"].as_str().unwrap();
            assert!(
                page.contains(&escaped(what)),
                "the console's trace of {kind} {id} lacks {what:?}"
            );
        }
        assert!(!page.contains("Could not read"), "{page}");
        from_api
    }
}

/// `text` as maud writes it into HTML.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// What each event of `trace` says, in order.
fn said(trace: &Value) -> Vec<String> {
    assert_eq!(trace["unreadable"], json!([]), "{trace:#}");
    trace["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["what"].as_str().unwrap().to_owned())
        .collect()
}

/// Whether some event says exactly `what`, or starts with `what` when it ends with `…`.
fn has(events: &[String], what: &str) -> bool {
    match what.strip_suffix('…') {
        Some(start) => events.iter().any(|event| event.starts_with(start)),
        None => events.iter().any(|event| event == what),
    }
}

fn assert_says(kind: &str, events: &[String], expected: &[&str]) {
    for what in expected {
        assert!(
            has(events, what),
            "the {kind}'s trace lacks {what:?}: {events:#?}"
        );
    }
}

async fn start() -> (Paybus, QuoteStub) {
    let env = TestEnv::new().await;
    let quotes = QuoteStub::start().await;
    let partner = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let webhook_url = format!("http://{}/webhook", partner.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(
            partner,
            Router::new().route("/webhook", post(|| async { "ok" })),
        )
        .await
    });
    let port = free_port();
    let process = Running(
        paybus(&env)
            .arg("run")
            .env("PAYBUS_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .env("PAYBUS_ADMIN_JWT_SECRET", ADMIN_SECRET)
            .env("PAYBUS_BREAK_GLASS", "true")
            .env("PAYBUS_CHAIN_MONITOR_SECRET", CHAIN_SECRET)
            .env("PAYBUS_PAYMENTS_SECRET", PAYMENTS_SECRET)
            .env(
                "PAYBUS_PARTNER_KEY_HASH_KEY",
                "trace-timelines-partner-key-hash-key-0123456789",
            )
            .env(
                "PAYBUS_SECRETS_KEY",
                "7472616365732074696d656c696e6573206b65792c206e6f742061207265616c",
            )
            .env("PAYBUS_QUOTE_URL", quotes.url())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut paybus = Paybus {
        _process: process,
        env,
        base: format!("http://127.0.0.1:{port}"),
        token: String::new(),
        client: reqwest::Client::new(),
    };
    let issued = paybus
        .command(&[
            "token",
            "issue",
            "--role",
            "ADMIN",
            "--subject",
            "tracer",
            "--ttl",
            "1h",
        ])
        .output()
        .unwrap();
    assert!(issued.status.success(), "{issued:?}");
    paybus.token = String::from_utf8(issued.stdout).unwrap().trim().to_owned();
    let started = Instant::now();
    // A process that is starting answers 503 until its services are up.
    while !paybus
        .client
        .get(format!("{}/health", paybus.base))
        .send()
        .await
        .is_ok_and(|answer| answer.status().is_success())
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "paybus run did not come up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let partner = paybus
        .admin(
            "/v1/admin/partners",
            json!({"name": "traced partner", "webhook_url": webhook_url,
                   "webhook_secret": "trace-timelines-webhook-secret"}),
        )
        .await;
    assert_eq!(partner["id"], 1, "{partner}");
    (paybus, quotes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_made_through_the_public_api_is_traced_whole_by_the_cli_the_api_and_the_console()
{
    let (paybus, _quotes) = start().await;

    // A withdrawal the admin API creates in flight, confirmed by the chain monitor.
    let withdrawal = paybus
        .admin(
            "/v1/admin/withdrawals",
            json!({"partner_id": 1, "status": "BROADCASTING", "currency": "USDT",
                   "amount": "100", "to_address": "T-traced"}),
        )
        .await["id"]
        .as_u64()
        .unwrap();
    paybus
        .signed(
            "/v1/chain-monitor/withdrawal-confirmations",
            json!({"withdrawal_id": withdrawal, "tx_hash": "0xtraced-withdrawal"}),
            CHAIN_SECRET,
        )
        .await;

    // A deposit the admin API records as detected, confirmed by the chain monitor.
    let deposit = paybus
        .admin(
            "/v1/admin/deposits",
            json!({"partner_id": 1, "currency": "USDT", "amount": "50", "fee": "1",
                   "tx_hash": "0xtraced-deposit", "to_address": "T-deposit"}),
        )
        .await["id"]
        .as_u64()
        .unwrap();
    paybus
        .signed(
            "/v1/chain-monitor/deposit-confirmations",
            json!({"deposit_id": deposit}),
            CHAIN_SECRET,
        )
        .await;

    // A purchase during a charge event, completed by the payment service's webhook: one
    // bonus job, granted by grant-bonus.
    let member = paybus
        .admin("/v1/admin/members", json!({"nickname": "traced member"}))
        .await["id"]
        .as_u64()
        .unwrap();
    let now = chrono::Utc::now();
    paybus
        .admin(
            "/v1/admin/charge-events",
            json!({"title": "traced event", "add_percent": 50,
                   "start_at": now - chrono::Duration::hours(1),
                   "end_at": now + chrono::Duration::hours(1)}),
        )
        .await;
    let charge = paybus
        .admin(
            "/v1/admin/charges",
            json!({"member_id": member, "cans": 300, "price": "3300",
                   "payment_gateway": "GOOGLE_IAP", "method": "google play"}),
        )
        .await["id"]
        .as_u64()
        .unwrap();
    let completed = paybus
        .signed(
            "/v1/payments/google-iap/webhook",
            json!({"charge_id": charge, "gateway_tx_id": "GPA.traced", "amount": "3300"}),
            PAYMENTS_SECRET,
        )
        .await;
    let job = completed["bonus_jobs"][0]["job_id"].as_u64().unwrap();

    // A buyer's deposit order matched against the partner's seller through the partner API
    // (matched inside the request: the switch is off by default).
    let key = paybus
        .admin("/v1/admin/partners/1/api-keys", json!({"label": "traced"}))
        .await["key"]
        .as_str()
        .unwrap()
        .to_owned();
    paybus
        .as_partner(
            &key,
            "/v1/partner/p2p/withdraw-orders",
            "traced-seller",
            json!({"currency": "USDT", "amount": "100"}),
        )
        .await;
    let order = paybus
        .as_partner(
            &key,
            "/v1/partner/p2p/deposit-orders",
            "traced-buyer",
            json!({"currency": "USDT", "amount": "40", "partner_order_ref": "traced-buyer"}),
        )
        .await;
    assert_eq!(order["status"], "MATCHED", "{order}");
    let order = order["id"].as_u64().unwrap();

    paybus
        .until(
            "SELECT COUNT(*) FROM partner_notifications WHERE status = 'DELIVERED' \
             AND reference_type IN ('WITHDRAWAL', 'DEPOSIT')",
            2,
        )
        .await;
    paybus
        .until(
            &format!("SELECT COUNT(*) FROM charge_event_job WHERE id = {job} AND status = 'DONE'"),
            1,
        )
        .await;

    // The withdrawal's and the deposit's notifications are written by two functions at once:
    // either may get the first id.
    let notification: u64 = sqlx::query_scalar(
        "SELECT id FROM partner_notifications \
         WHERE reference_type = 'WITHDRAWAL' AND reference_id = ?",
    )
    .bind(withdrawal)
    .fetch_one(&paybus.env.db)
    .await
    .unwrap();
    let traced = paybus.trace("withdrawal", withdrawal).await;
    assert_eq!(traced["row"]["status"], "CONFIRMED");
    assert_says(
        "withdrawal",
        &said(&traced),
        &[
            "created (now CONFIRMED)",
            "entered as BROADCASTING",
            "BROADCASTING → CONFIRMED",
            "DEBIT 100 USDT",
            &format!(
                "webhook WITHDRAWAL_CONFIRMED (notification {notification}) written: now DELIVERED"
            ),
            "webhook WITHDRAWAL_CONFIRMED delivered after 1 attempt(s)",
        ],
    );

    let traced = paybus.trace("deposit", deposit).await;
    assert_eq!(traced["row"]["status"], "CONFIRMED");
    assert_says(
        "deposit",
        &said(&traced),
        &[
            "created (now CONFIRMED)",
            "confirmed on chain, tx 0xtraced-deposit",
            "CREDIT 50 USDT",
            "FEE 1 USDT",
            "webhook DEPOSIT_CONFIRMED delivered after 1 attempt(s)",
        ],
    );

    let traced = paybus.trace("bonus-job", job).await;
    assert_eq!(traced["row"]["status"], "DONE");
    assert_says(
        "bonus job",
        &said(&traced),
        &[
            "created (now DONE)",
            &format!("purchase charge {charge} completed: 300 cans through GOOGLE_IAP"),
            "bonus granted: EVENT charge …",
        ],
    );

    let traced = paybus.trace("deposit-order", order).await;
    assert_eq!(traced["row"]["status"], "MATCHED");
    assert_says(
        "deposit order",
        &said(&traced),
        &[
            "created (now MATCHED)",
            "fill 1 reserved 40 (now CONFIRMED)",
            "fill 1 settled, trade …",
            "closed MATCHED (FILLED)",
        ],
    );
}
