//! W2 intake end to end: the real `paybus run` process (API + consumers) takes signed chain
//! monitor webhooks, and a duplicate confirmation still debits once.

use crate::api_process;

use api_process::paybus;
use std::{
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use paybus_config::signature;
use paybus_testkit::{TestEnv, free_port};

const SECRET: &str = "chain-monitor-secret-e2e-0123";

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn post_signed(client: &reqwest::Client, url: &str, body: &str, secret: &str) -> u16 {
    let now = chrono::Utc::now().timestamp();
    client
        .post(url)
        .header("content-type", "application/json")
        .header(
            signature::HEADER,
            signature::sign(secret.as_bytes(), now, body.as_bytes()),
        )
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn scalar(env: &TestEnv, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&env.db).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_duplicate_confirmations_are_accepted_and_debit_once() {
    let env = TestEnv::new().await;
    let port = free_port();
    let _run = Running(
        paybus(&env)
            .arg("run")
            .env("PAYBUS_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .env("PAYBUS_CHAIN_MONITOR_SECRET", SECRET)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for sql in [
        "INSERT INTO partners (id, name) VALUES (45, 'partner45')",
        "INSERT INTO withdrawals (id, partner_id, kind, status, currency, amount, to_address) \
         VALUES (1989, 45, 'NORMAL', 'BROADCASTING', 'USDT', 100, 'T-addr')",
    ] {
        sqlx::query(sql).execute(&env.db).await.unwrap();
    }
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    // A process that is starting answers 503 until its services are up.
    while !client
        .get(format!("{base}/health"))
        .send()
        .await
        .is_ok_and(|answer| answer.status().is_success())
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "paybus run did not come up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let url = format!("{base}/v1/chain-monitor/withdrawal-confirmations");
    let body = r#"{"withdrawal_id": 1989, "tx_hash": "0xf16c3335"}"#;

    let bad = post_signed(&client, &url, body, "not-the-secret-at-all").await;
    let malformed = post_signed(&client, &url, r#"{"withdrawal_id": "#, SECRET).await;
    let (first, second) = tokio::join!(
        post_signed(&client, &url, body, SECRET),
        post_signed(&client, &url, body, SECRET)
    );

    assert_eq!((bad, malformed), (401, 400));
    assert_eq!((first, second), (202, 202));
    let started = Instant::now();
    while scalar(
        &env,
        "SELECT COUNT(*) FROM withdrawals WHERE status = 'CONFIRMED'",
    )
    .await
        != 1
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never confirmed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the duplicate be processed too before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        scalar(
            &env,
            "SELECT COUNT(*) FROM ledger_entries WHERE entry_type = 'DEBIT'"
        )
        .await,
        1
    );
    assert_eq!(
        scalar(&env, "SELECT COUNT(*) FROM partner_notifications").await,
        1
    );
    assert_eq!(
        scalar(
            &env,
            "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'withdrawal.tx_confirmed'"
        )
        .await,
        2,
        "both accepted confirmations went through the outbox"
    );
}
