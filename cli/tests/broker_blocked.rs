//! A broker that blocks publishers (a real resource alarm on a RabbitMQ node of the test's
//! own, raised and cleared with `rabbitmqctl`) is visible: in a running `paybus run`'s
//! `/metrics` (`paybus_broker_blocked`), its overview (JSON and console) and log, in `paybus
//! doctor`'s exit; publishes on the blocked link fail within their bounds naming the alarm; and
//! once the alarm clears, everything committed meanwhile is published.

use crate::api_process;

use std::{
    path::Path,
    process::{Child, Output, Stdio},
    time::{Duration, Instant},
};

use api_process::{output_of, paybus};

use paybus_api::{auth, role::Role};
use paybus_bus::{Envelope, Handler, OutgoingMessage};
use paybus_canary::{Canary, Ping};
use paybus_config::signature;
use paybus_lab::services::PrivateBroker;
use paybus_testkit::{TestEnv, eventually, free_port, scalar, services_on};
use serde_json::Value;

const CHAIN_MONITOR_SECRET: &str = "chain-monitor-secret-blocked-0123";
const ADMIN_JWT_SECRET: &str = "admin-jwt-secret-for-the-blocked-broker-test";
/// What RabbitMQ 3.10 says when a memory alarm blocks a connection.
const MEMORY_ALARM: &str = "low on memory";

/// A memory alarm at once: the node's whole memory is over a watermark this low.
fn raise_memory_alarm(broker: &PrivateBroker) {
    tokio::task::block_in_place(|| {
        broker.rabbitmqctl(&["set_vm_memory_high_watermark", "0.000001"]);
    });
}

/// RabbitMQ's default watermark: the alarm clears.
fn clear_memory_alarm(broker: &PrivateBroker) {
    tokio::task::block_in_place(|| {
        broker.rabbitmqctl(&["set_vm_memory_high_watermark", "0.4"]);
    });
}

/// A child process killed when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `paybus doctor` on `env`'s database and `broker`, off the runtime's worker.
fn run_doctor(env: &TestEnv, broker: &PrivateBroker) -> Output {
    tokio::task::block_in_place(|| {
        output_of(
            paybus(env)
                .env("PAYBUS_AMQP_URL", broker.url.as_str())
                .arg("doctor"),
        )
    })
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

fn ping(ping_id: u64) -> OutgoingMessage {
    Envelope::new(Ping { ping_id }).to_outgoing().unwrap()
}

/// The value of `paybus_broker_blocked` in a scrape of `base`'s `/metrics`.
async fn blocked_gauge(client: &reqwest::Client, base: &str) -> Option<i64> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("paybus_broker_blocked "))
        .and_then(|value| value.trim().parse().ok())
}

async fn wait_for_gauge(client: &reqwest::Client, base: &str, expected: i64) {
    let settled = eventually(Duration::from_secs(30), || async {
        blocked_gauge(client, base).await == Some(expected)
    })
    .await;
    assert!(
        settled,
        "paybus_broker_blocked never {expected} within 30 s: {:?}",
        blocked_gauge(client, base).await
    );
}

async fn overview(client: &reqwest::Client, base: &str) -> Value {
    let token = auth::issue(
        ADMIN_JWT_SECRET,
        "ops-on-call",
        &[Role::Ops],
        Duration::from_secs(600),
    )
    .unwrap();
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        client
            .get(format!("{base}/v1/admin/overview"))
            .bearer_auth(token)
            .send(),
    )
    .await
    .expect("the overview answers within 10 s")
    .unwrap();
    assert_eq!(answer.status(), 200);
    answer.json().await.unwrap()
}

async fn console_overview(client: &reqwest::Client, base: &str) -> String {
    let token = auth::issue(
        ADMIN_JWT_SECRET,
        "ops-on-call",
        &[Role::Ops],
        Duration::from_secs(600),
    )
    .unwrap();
    let page = tokio::time::timeout(
        Duration::from_secs(10),
        client
            .get(format!("{base}/console/overview"))
            .header(
                "cookie",
                format!(
                    "paybus_console={}",
                    api_process::console_session(base, &token).await
                ),
            )
            .send(),
    )
    .await
    .expect("the console's overview answers within 10 s")
    .unwrap();
    assert_eq!(page.status(), 200);
    page.text().await.unwrap()
}

fn unpublished(env: &TestEnv) -> impl Future<Output = i64> {
    scalar(
        &env.db,
        "SELECT COUNT(*) FROM outbox_messages WHERE published_at IS NULL",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_alarm_shows_in_doctor_metrics_overview_and_log_until_it_clears() {
    let env = TestEnv::new().await;
    let broker = tokio::task::spawn_blocking(PrivateBroker::start)
        .await
        .unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let log = std::env::temp_dir().join(format!("paybus-blocked-{port}.log"));
    let _run = Running(
        paybus(&env)
            .arg("run")
            .env("PAYBUS_AMQP_URL", broker.url.as_str())
            .env("PAYBUS_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .env("PAYBUS_CHAIN_MONITOR_SECRET", CHAIN_MONITOR_SECRET)
            .env("PAYBUS_ADMIN_JWT_SECRET", ADMIN_JWT_SECRET)
            .env("PAYBUS_BREAK_GLASS", "true")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let up = eventually(Duration::from_secs(60), || async {
        let health = client.get(format!("{base}/health")).send().await;
        health.is_ok_and(|answer| answer.status().is_success())
    })
    .await;
    assert!(up, "paybus run did not answer within 60 s: {}", read(&log));
    assert_eq!(blocked_gauge(&client, &base).await, Some(0));
    let healthy = run_doctor(&env, &broker);
    assert!(healthy.status.success(), "{healthy:?}");

    raise_memory_alarm(&broker);

    // doctor's own probe learns of the alarm from one publish to nowhere.
    let started = Instant::now();
    let doctor = run_doctor(&env, &broker);
    let said = String::from_utf8_lossy(&doctor.stderr);
    assert!(!doctor.status.success(), "{doctor:?}");
    let line = said
        .lines()
        .find(|line| line.starts_with("broker: FAILED: "))
        .unwrap_or_else(|| panic!("no broker line: {said}"));
    assert!(
        line.contains(&format!(
            "127.0.0.1:{}/%2f blocks publishers: {MEMORY_ALARM}",
            broker.url.port().unwrap()
        )),
        "{line}"
    );
    assert!(!line.contains("guest:guest"), "credentials leaked: {line}");
    eprintln!("doctor named the alarm in {:?}", started.elapsed());

    // A confirmation comes in: committed, and its publish is what the broker blocks.
    let body = r#"{"withdrawal_id": 70, "tx_hash": "0xblocked"}"#;
    let now = chrono::Utc::now().timestamp();
    let accepted = client
        .post(format!("{base}/v1/chain-monitor/withdrawal-confirmations"))
        .header("content-type", "application/json")
        .header(
            signature::HEADER,
            signature::sign(CHAIN_MONITOR_SECRET.as_bytes(), now, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    wait_for_gauge(&client, &base, 1).await;

    let blocked = overview(&client, &base).await;
    assert_eq!(blocked["broker_blocked"], MEMORY_ALARM, "{blocked}");
    let page = console_overview(&client, &base).await;
    assert!(
        page.contains("id=\"broker-blocked\"") && page.contains(MEMORY_ALARM),
        "{page}"
    );
    assert_eq!(
        unpublished(&env).await,
        1,
        "the message waits in the outbox"
    );

    clear_memory_alarm(&broker);

    wait_for_gauge(&client, &base, 0).await;
    assert!(overview(&client, &base).await["broker_blocked"].is_null());
    let healthy = run_doctor(&env, &broker);
    assert!(healthy.status.success(), "{healthy:?}");
    // The relay publishes what waited (its grace is 10 s).
    let drained = eventually(Duration::from_secs(60), || async {
        unpublished(&env).await == 0
    })
    .await;
    assert!(drained, "the outbox kept {}", unpublished(&env).await);
    let logged = read(&log);
    let warned = logged
        .lines()
        .find(|line| line.contains("the broker blocks this process's connection"))
        .unwrap_or_else(|| panic!("no WARN line for the block:\n{logged}"));
    assert!(
        warned.contains("WARN") && warned.contains(MEMORY_ALARM),
        "{warned}"
    );
    assert!(
        logged.lines().any(|line| line.contains("INFO")
            && line.contains("the broker unblocked this process's connection")),
        "no INFO line for the unblock:\n{logged}"
    );
    let _ = std::fs::remove_file(log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_link_fails_publishes_naming_the_alarm_and_its_replacement_starts_unblocked() {
    let env = TestEnv::new().await;
    let broker = tokio::task::spawn_blocking(PrivateBroker::start)
        .await
        .unwrap();
    let mut settings = env.settings.clone();
    settings.broker.url = broker.url.clone();
    let services = services_on(&settings, &[Canary::queue()]).await;
    let publisher = services.publisher();
    let link = publisher.link().clone();

    raise_memory_alarm(&broker);
    assert_eq!(link.blocked(), None, "told only once it publishes");

    // A batch into the alarm: the broker blocks the connection at its first message, and lapin
    // sends nothing more; every publish ends within its bounds (10 s to send, 10 s to be
    // confirmed), naming the alarm.
    let batch: Vec<OutgoingMessage> = (1..=200).map(ping).collect();
    let started = Instant::now();
    let results = tokio::time::timeout(Duration::from_secs(40), publisher.publish_events(&batch))
        .await
        .expect("a batch published into a blocking broker ends within its bounds");
    eprintln!(
        "a batch of 200 into the alarm ended in {:?}",
        started.elapsed()
    );
    for result in &results {
        let error = result
            .as_ref()
            .expect_err("nothing is confirmed while blocked");
        assert!(
            error
                .to_string()
                .contains(&format!("blocks this connection ({MEMORY_ALARM})")),
            "{error}"
        );
    }
    assert_eq!(link.blocked().as_deref(), Some(MEMORY_ALARM));

    // Once the link knows, a publish fails at once.
    let started = Instant::now();
    let refused = publisher.publish_event(&ping(201)).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        refused.to_string(),
        format!(
            "not sent: the broker blocks this connection ({MEMORY_ALARM}) until its resource alarm clears"
        )
    );

    // The broker drops the blocked connection; the link's replacement has been told nothing
    // (the alarm holds) until it publishes.
    let mut generation = link.generation();
    tokio::task::block_in_place(|| {
        broker.rabbitmqctl(&[
            "close_all_connections",
            "the test replaces the blocked connection",
        ]);
    });
    tokio::time::timeout(Duration::from_secs(30), generation.changed())
        .await
        .expect("the link replaces the dropped connection within 30 s")
        .unwrap();
    assert_eq!(link.blocked(), None, "a new connection starts unblocked");
    let into_the_alarm = publisher.publish_event(&ping(202)).await.unwrap_err();
    assert!(
        into_the_alarm
            .to_string()
            .contains(&format!("it blocks this connection ({MEMORY_ALARM})")),
        "{into_the_alarm}"
    );
    assert_eq!(link.blocked().as_deref(), Some(MEMORY_ALARM));

    clear_memory_alarm(&broker);
    let unblocked = eventually(Duration::from_secs(10), || async {
        link.blocked().is_none()
    })
    .await;
    assert!(unblocked, "still blocked: {:?}", link.blocked());
    publisher
        .publish_event(&ping(203))
        .await
        .expect("published once the alarm cleared");
}
