//! One OpenTelemetry trace per money movement, end to end: a real `paybus run` exporting to a
//! real OTLP/HTTP receiver, a chain monitor sending one withdrawal's confirmation three times
//! under its own `traceparent`, and a partner endpoint that records the `traceparent` it gets.

use crate::api_process;

use api_process::paybus;
use std::{
    collections::HashMap,
    io::Read,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, extract::State, http::HeaderMap, routing::post};
use paybus_config::signature;
use paybus_testkit::{
    TestEnv, free_port,
    otlp::{OtlpReceiver, ReceivedSpan},
};

const SECRET: &str = "chain-monitor-secret-traces-0123";
/// The chain monitor's own span: the trace every span of this withdrawal must join.
const MONITOR_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const MONITOR_SPAN: &str = "00f067aa0ba902b7";

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The partner's endpoint: answers 200 and keeps each request's `traceparent`.
async fn partner_endpoint() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route(
            "/webhook",
            post(
                |State(seen): State<Arc<Mutex<Vec<String>>>>, headers: HeaderMap| async move {
                    let traceparent = headers
                        .get("traceparent")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    seen.lock().unwrap().push(traceparent);
                    "ok"
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

async fn confirm(client: &reqwest::Client, url: &str) -> u16 {
    let body = r#"{"withdrawal_id": 2026, "tx_hash": "0xtraced"}"#;
    let started = Instant::now();
    loop {
        let now = chrono::Utc::now().timestamp();
        let sent = client
            .post(url)
            .header("content-type", "application/json")
            .header(
                "traceparent",
                format!("00-{MONITOR_TRACE}-{MONITOR_SPAN}-01"),
            )
            .header(
                signature::HEADER,
                signature::sign(SECRET.as_bytes(), now, body.as_bytes()),
            )
            .body(body)
            .send()
            .await;
        match sent {
            // Not listening yet, or listening and starting (503 until its services are up).
            Ok(answer) if answer.status() == 503 && started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(answer) => return answer.status().as_u16(),
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("paybus run did not come up: {error}"),
        }
    }
}

/// Whether `span` descends from `ancestor` (by span ids, within the received spans).
fn descends(spans: &[ReceivedSpan], span: &ReceivedSpan, ancestor: &str) -> bool {
    let by_id: HashMap<&str, &ReceivedSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let mut parent = span.parent_span_id.as_str();
    while !parent.is_empty() {
        if parent == ancestor {
            return true;
        }
        parent = by_id.get(parent).map_or("", |s| s.parent_span_id.as_str());
    }
    false
}

fn named<'s>(spans: &'s [ReceivedSpan], name: &str) -> Vec<&'s ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.trace_id == MONITOR_TRACE && s.name == name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawal_confirmed_three_times_is_one_trace_from_the_monitor_to_the_partner() {
    let receiver = OtlpReceiver::start().await;
    let (webhook_url, partner_saw) = partner_endpoint().await;
    let env = TestEnv::new().await;
    let partner_id = paybus_testkit::partners::partner(&env.db, "traced", Some(&webhook_url)).await;
    sqlx::query(
        "INSERT INTO withdrawals (id, partner_id, kind, status, currency, amount, to_address) \
         VALUES (2026, ?, 'NORMAL', 'BROADCASTING', 'USDT', 100, 'T-addr')",
    )
    .bind(partner_id)
    .execute(&env.db)
    .await
    .unwrap();
    let port = free_port();
    let log = std::env::temp_dir().join(format!("paybus-traces-{}.log", std::process::id()));
    let mut run = Running(
        paybus(&env)
            .arg("run")
            .envs(receiver.env_vars("paybus-run"))
            .env("PAYBUS_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .env("PAYBUS_CHAIN_MONITOR_SECRET", SECRET)
            .env("PAYBUS_LOG_FORMAT", "json")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/v1/chain-monitor/withdrawal-confirmations");

    // The first confirmation, then the monitor's two re-sends once it has gone through (as
    // the monitor re-sends after 60 s).
    assert_eq!(confirm(&client, &url).await, 202);
    receiver
        .wait_for(Duration::from_secs(30), |spans| {
            !named(spans, "POST webhook").is_empty()
        })
        .await;
    assert_eq!(confirm(&client, &url).await, 202);
    assert_eq!(confirm(&client, &url).await, 202);
    receiver
        .wait_for(Duration::from_secs(30), |spans| {
            named(spans, "process confirm-withdrawal").len() == 3
        })
        .await;
    // Let the last spans of the duplicates' deliveries (and anything wrongly extra) arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spans = receiver.spans();

    // The intake: three server spans, each a child of the monitor's span.
    let intakes = named(&spans, "POST /v1/chain-monitor/withdrawal-confirmations");
    assert_eq!(intakes.len(), 3, "{intakes:#?}");
    for intake in &intakes {
        assert_eq!(intake.parent_span_id, MONITOR_SPAN);
        assert_eq!(intake.kind, 2, "a server span");
        assert_eq!(intake.integer("http.response.status_code"), Some(202));
        assert_eq!(intake.service, "paybus-run");
        assert_eq!(
            intake.resource.get("service.version").map(String::as_str),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(
            intake.resource.get("vcs.ref.head.revision"),
            Some(&paybus_testkit::head_commit())
        );
    }
    // Three deliveries, each the child of the intake that sent its message: one transitioned,
    // the duplicates were skipped.
    let deliveries = named(&spans, "process confirm-withdrawal");
    let mut outcomes: Vec<&str> = deliveries
        .iter()
        .map(|d| d.attribute("outcome").unwrap_or(""))
        .collect();
    outcomes.sort_unstable();
    assert_eq!(outcomes, ["done", "skipped", "skipped"], "{deliveries:#?}");
    for delivery in &deliveries {
        assert_eq!(delivery.kind, 5, "a consumer span");
        assert!(
            intakes
                .iter()
                .any(|i| descends(&spans, delivery, &i.span_id)),
            "{delivery:#?} does not descend from an intake; its parent: {:#?}",
            spans.iter().find(|s| s.span_id == delivery.parent_span_id)
        );
        assert_eq!(delivery.attribute("messaging.system"), Some("rabbitmq"));
        assert_eq!(delivery.integer("attempt"), Some(1));
    }
    let transitioned = deliveries
        .iter()
        .find(|d| d.attribute("outcome") == Some("done"))
        .unwrap();
    // The ledger's posting and the transaction sit inside the delivery that transitioned.
    let postings = named(&spans, "ledger.post_all");
    assert_eq!(postings.len(), 1, "{postings:#?}");
    assert!(descends(&spans, postings[0], &transitioned.span_id));
    assert!(named(&spans, "transaction").iter().any(|t| descends(
        &spans,
        t,
        &transitioned.span_id
    )));
    // The notification it owed: deliver-webhook's delivery continues the same trace, and its
    // POST is a client span whose context the partner received.
    let webhook_deliveries = named(&spans, "process deliver-webhook");
    assert_eq!(webhook_deliveries.len(), 1, "{webhook_deliveries:#?}");
    assert!(descends(
        &spans,
        webhook_deliveries[0],
        &transitioned.span_id
    ));
    let posts = named(&spans, "POST webhook");
    assert_eq!(posts.len(), 1);
    let post = posts[0];
    assert_eq!(post.kind, 3, "a client span");
    assert!(descends(&spans, post, &webhook_deliveries[0].span_id));
    assert_eq!(post.integer("http.response.status_code"), Some(200));
    assert_eq!(
        post.attribute("server.address"),
        Some("127.0.0.1"),
        "only the host: a webhook URL's path may carry a partner's token"
    );
    assert_eq!(
        partner_saw.lock().unwrap().clone(),
        [format!("00-{MONITOR_TRACE}-{}-01", post.span_id)]
    );

    // The outbox rows kept the context they were written under.
    let kept: Vec<Option<String>> =
        sqlx::query_scalar("SELECT traceparent FROM outbox_messages ORDER BY id")
            .fetch_all(&env.db)
            .await
            .unwrap();
    assert_eq!(kept.len(), 4, "3 confirmations and 1 notification");
    assert!(
        kept.iter()
            .all(|t| t.as_deref().is_some_and(|t| t.contains(MONITOR_TRACE))),
        "{kept:?}"
    );

    // The latency histogram's exemplar opens this trace.
    let metrics = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(|line| {
            line.starts_with("paybus_handler_seconds_bucket{")
                && line.contains(r#"function="confirm-withdrawal""#)
                && line.contains(&format!(r#"# {{trace_id="{MONITOR_TRACE}""#))
        }),
        "no exemplar of the trace in:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("handler_seconds_bucket"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // The JSON log lines of the deliveries carry the trace's ids.
    let _ = run.0.kill();
    let _ = run.0.wait();
    let mut text = String::new();
    std::fs::File::open(&log)
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let _ = std::fs::remove_file(&log);
    let processed: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| {
            line["message"] == "message processed" && line["function"] == "confirm-withdrawal"
        })
        .collect();
    assert!(!processed.is_empty(), "no delivery log lines in:\n{text}");
    for line in &processed {
        assert_eq!(line["trace_id"], MONITOR_TRACE, "{line}");
        assert!(
            deliveries
                .iter()
                .any(|d| line["span_id"] == d.span_id.as_str()),
            "{line}"
        );
    }
}

/// `(withdrawal id, traceparent)` of each webhook the partner received.
type Received = Arc<Mutex<Vec<(u64, String)>>>;

/// The partner's endpoint for many withdrawals: answers 200 and keeps, for each request, the
/// withdrawal its body names and the `traceparent` it came with.
async fn partner_endpoint_by_withdrawal() -> (String, Received) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route(
            "/webhook",
            post(
                |State(seen): State<Received>, headers: HeaderMap, body: String| async move {
                    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let withdrawal = body["data"]["withdrawal_id"]
                        .as_u64()
                        .or_else(|| body["withdrawal_id"].as_u64())
                        .unwrap_or_else(|| panic!("no withdrawal id in {body}"));
                    let traceparent = headers
                        .get("traceparent")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    seen.lock().unwrap().push((withdrawal, traceparent));
                    "ok"
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

const ADMIN_SECRET: &str = "traces-admin-jwt-secret-0123456789abcdef";

/// The chain monitor's trace of withdrawal number `n` of the batch test.
fn monitor_trace(n: u64) -> String {
    format!("{:032x}", 0x5ca1_ab1e_0000 + n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmations_handled_as_one_batch_each_stay_in_their_withdrawals_own_trace() {
    const WITHDRAWALS: u64 = 24;
    let receiver = OtlpReceiver::start().await;
    let (webhook_url, partner_saw) = partner_endpoint_by_withdrawal().await;
    let env = TestEnv::new().await;
    let port = free_port();
    let _run = Running(
        paybus(&env)
            .arg("run")
            .envs(receiver.env_vars("paybus-run"))
            .env("PAYBUS_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .env("PAYBUS_CHAIN_MONITOR_SECRET", SECRET)
            .env("PAYBUS_ADMIN_JWT_SECRET", ADMIN_SECRET)
            .env("PAYBUS_BREAK_GLASS", "true")
            .env(
                "PAYBUS_SECRETS_KEY",
                "7472616365732074696d656c696e6573206b65792c206e6f742061207265616c",
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let issued = Command::new(env!("CARGO_BIN_EXE_paybus"))
        .args([
            "token",
            "issue",
            "--role",
            "ADMIN",
            "--subject",
            "tracer",
            "--ttl",
            "1h",
        ])
        .env("PAYBUS_ADMIN_JWT_SECRET", ADMIN_SECRET)
        .env("PAYBUS_BREAK_GLASS", "true")
        .output()
        .unwrap();
    assert!(issued.status.success(), "{issued:?}");
    let token = String::from_utf8(issued.stdout).unwrap().trim().to_owned();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let admin = |path: &str, body: serde_json::Value| {
        let request = client
            .post(format!("{base}{path}"))
            .bearer_auth(&token)
            .json(&body);
        async move {
            let answer = request.send().await.unwrap();
            let status = answer.status();
            let body: serde_json::Value = answer.json().await.unwrap();
            assert!(status.is_success(), "{status} {body}");
            body
        }
    };
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
    let partner = admin(
        "/v1/admin/partners",
        serde_json::json!({"name": "batched", "webhook_url": webhook_url,
            "webhook_secret": "traces-webhook-secret-0123"}),
    )
    .await["id"]
        .as_u64()
        .unwrap();
    let mut withdrawals = Vec::new();
    for n in 0..WITHDRAWALS {
        let created = admin(
            "/v1/admin/withdrawals",
            serde_json::json!({"partner_id": partner, "status": "BROADCASTING",
                "currency": "USDT", "amount": "10", "to_address": format!("T-{n}")}),
        )
        .await;
        withdrawals.push(created["id"].as_u64().unwrap());
    }

    // The confirmations wait in the queue while confirm-withdrawal is paused, so that its
    // consumer takes them in batches once resumed, as it does when a burst arrives.
    admin(
        "/v1/admin/functions/confirm-withdrawal/pause",
        serde_json::json!({"reason": "let the confirmations queue up"}),
    )
    .await;
    let services = env.services(&[]).await;
    let queue = "paybus.confirm-withdrawal";
    assert!(
        paybus_testkit::eventually(Duration::from_secs(20), || async {
            paybus_testkit::queue_state(&services, queue)
                .await
                .is_some_and(|(_, consumers)| consumers == 0)
        })
        .await,
        "confirm-withdrawal kept consuming while paused"
    );
    let url = format!("{base}/v1/chain-monitor/withdrawal-confirmations");
    let mut sends = tokio::task::JoinSet::new();
    for (n, id) in withdrawals.iter().copied().enumerate() {
        let (client, url) = (client.clone(), url.clone());
        sends.spawn(async move {
            let body = format!(r#"{{"withdrawal_id": {id}, "tx_hash": "0xbatched{n}"}}"#);
            let now = chrono::Utc::now().timestamp();
            client
                .post(url)
                .header("content-type", "application/json")
                .header(
                    "traceparent",
                    format!("00-{}-{MONITOR_SPAN}-01", monitor_trace(n as u64)),
                )
                .header(
                    signature::HEADER,
                    signature::sign(SECRET.as_bytes(), now, body.as_bytes()),
                )
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        });
    }
    let answers = sends.join_all().await;
    assert!(answers.iter().all(|status| *status == 202), "{answers:?}");
    assert!(
        paybus_testkit::eventually(Duration::from_secs(20), || async {
            paybus_testkit::queue_state(&services, queue)
                .await
                .is_some_and(|(ready, _)| u64::from(ready) == WITHDRAWALS)
        })
        .await,
        "the confirmations did not all reach the queue"
    );
    admin(
        "/v1/admin/functions/confirm-withdrawal/resume",
        serde_json::json!({}),
    )
    .await;

    receiver
        .wait_for(Duration::from_secs(60), |spans| {
            spans.iter().filter(|s| s.name == "POST webhook").count() as u64 == WITHDRAWALS
        })
        .await;
    // Let the last spans of the deliveries arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spans = receiver.spans();
    let in_trace = |trace: &str, name: &str| -> Vec<ReceivedSpan> {
        spans
            .iter()
            .filter(|s| s.trace_id == trace && s.name == name)
            .cloned()
            .collect()
    };

    // The confirmations were taken in batches, each batch span with every message's outcome
    // on that message's own span.
    let batches: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.name == "process confirm-withdrawal batch")
        .collect();
    assert!(
        !batches.is_empty(),
        "no batch formed: the test proves nothing"
    );
    let batched: i64 = batches
        .iter()
        .map(|b| b.integer("messaging.batch.message_count").unwrap())
        .sum();
    assert!(batched >= 2, "{batches:#?}");
    let saw = partner_saw.lock().unwrap().clone();
    for (n, withdrawal) in withdrawals.iter().enumerate() {
        let trace = monitor_trace(n as u64);
        let intakes = in_trace(&trace, "POST /v1/chain-monitor/withdrawal-confirmations");
        assert_eq!(intakes.len(), 1, "withdrawal {withdrawal}: {intakes:#?}");
        assert_eq!(intakes[0].parent_span_id, MONITOR_SPAN);
        let deliveries = in_trace(&trace, "process confirm-withdrawal");
        assert_eq!(
            deliveries.len(),
            1,
            "withdrawal {withdrawal}: {deliveries:#?}"
        );
        let delivery = &deliveries[0];
        assert!(descends(&spans, delivery, &intakes[0].span_id));
        assert_eq!(delivery.attribute("outcome"), Some("done"), "{delivery:#?}");
        assert_eq!(delivery.integer("attempt"), Some(1));
        let webhook = in_trace(&trace, "process deliver-webhook");
        assert_eq!(
            webhook.len(),
            1,
            "withdrawal {withdrawal}'s webhook delivery"
        );
        assert!(descends(&spans, &webhook[0], &delivery.span_id));
        let posts = in_trace(&trace, "POST webhook");
        assert_eq!(posts.len(), 1, "withdrawal {withdrawal}'s webhook POST");
        assert!(descends(&spans, &posts[0], &webhook[0].span_id));
        assert_eq!(posts[0].integer("http.response.status_code"), Some(200));
        let received: Vec<&String> = saw
            .iter()
            .filter(|(id, _)| id == withdrawal)
            .map(|(_, traceparent)| traceparent)
            .collect();
        assert_eq!(
            received,
            [&format!("00-{trace}-{}-01", posts[0].span_id)],
            "the traceparent withdrawal {withdrawal}'s partner received"
        );
    }
    for batch in &batches {
        let count = batch.integer("messaging.batch.message_count").unwrap();
        assert_eq!(batch.links.len() as i64, count, "{batch:#?}");
    }
}
