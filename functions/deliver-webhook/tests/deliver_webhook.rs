//! deliver-webhook against the real database and broker, with a real HTTP server (wiremock)
//! standing in for the partner.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use chrono::{DateTime, Utc};
use paybus_bus::{Context, Envelope, Handler, Outcome, Services};
use paybus_config::signature;
use paybus_deliver_webhook::{
    DeliverWebhook, WebhookConfig, due_notifications,
    request::{HEADER_EVENT, HEADER_NOTIFICATION_ID, HEADER_SIGNATURE},
};
use paybus_maintenance::DueSweepConfig;
use paybus_partners::{
    attempts::NewAttempt,
    breaker::{BreakerPolicy, BreakerState},
    notifications::{self, DeliveryClaim, NewNotification, NotificationCreated, enqueue},
};
use paybus_retry::{AfterFailure, Clock, RetryPolicy, Settled};
use paybus_runtime::runner::Runner;
use paybus_testkit::{
    TestEnv, eventually, manual_clock,
    partners::{PARTNER_SECRET as SECRET, notification, partner, withdrawal_confirmed},
    sealer,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate, matchers::method};

// ---------------------------------------------------------------------------------------------
// Harness

/// Short timeouts and delays, so nothing waits for minutes.
fn config(max_attempts: u32, backoff_ms: &[u64]) -> WebhookConfig {
    WebhookConfig {
        timeout: Duration::from_secs(2),
        retry: RetryPolicy::with_schedule(
            max_attempts,
            backoff_ms
                .iter()
                .map(|&ms| Duration::from_millis(ms))
                .collect(),
        )
        .unwrap(),
        ..WebhookConfig::default()
    }
}

/// The handler with the test key's sealer.
fn webhook(config: WebhookConfig) -> Result<DeliverWebhook, reqwest::Error> {
    DeliverWebhook::new(config, sealer())
}

/// A POST's record, for tests that settle by hand.
fn posted() -> NewAttempt {
    NewAttempt {
        started_at: Utc::now(),
        status_code: Some(200),
        latency: Duration::from_millis(5),
        error: None,
    }
}

fn fast_sweep() -> DueSweepConfig {
    DueSweepConfig {
        interval: Duration::from_millis(50),
        ..DueSweepConfig::default()
    }
}

async fn insert_partner(env: &TestEnv, name: &str, webhook_url: Option<&str>) -> u64 {
    partner(&env.db, name, webhook_url).await
}

/// A notification row as a confirming transition writes it, with its message (outbox).
async fn notify(services: &Services, partner_id: u64, reference_id: u64) -> u64 {
    let mut uow = services.outbox.begin().await.unwrap();
    let payload = withdrawal_confirmed(reference_id);
    let id = enqueue(
        &mut uow,
        &NewNotification {
            partner_id,
            event: "WITHDRAWAL_CONFIRMED",
            reference_type: "WITHDRAWAL",
            reference_id,
            payload: &payload,
        },
        uuid::Uuid::new_v4(),
    )
    .await
    .unwrap_or_else(|e| panic!("enqueue notification {reference_id}: {e}"))
    .unwrap_or_else(|| panic!("notification {reference_id} already exists"));
    uow.commit().await.unwrap();
    id
}

async fn handle(
    handler: &DeliverWebhook,
    services: &Services,
    notification_id: u64,
    attempt: u32,
) -> Outcome {
    let ctx = Context {
        db: &services.outbox,
        attempt,
    };
    handler
        .handle(Envelope::new(NotificationCreated { notification_id }), &ctx)
        .await
        .unwrap()
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    status: String,
    attempts: u32,
    last_error: Option<String>,
    next_attempt_at: Option<DateTime<Utc>>,
    delivered_at: Option<DateTime<Utc>>,
    updated_at: DateTime<Utc>,
    payload: String,
}

async fn row(env: &TestEnv, id: u64) -> Row {
    sqlx::query_as(
        "SELECT status, attempts, last_error, next_attempt_at, delivered_at, updated_at, payload \
         FROM partner_notifications WHERE id = ?",
    )
    .bind(id)
    .fetch_one(&env.db)
    .await
    .unwrap()
}

/// PENDING rows whose next attempt is at `at` exactly: settled there by a failure or a park
/// on a standing clock (a claim in flight carries its lease instead).
async fn pending_until(env: &TestEnv, at: DateTime<Utc>) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM partner_notifications \
         WHERE status = 'PENDING' AND next_attempt_at = ?",
    )
    .bind(at)
    .fetch_one(&env.db)
    .await
    .unwrap()
}

/// When each PENDING row may be attempted next.
async fn waits(env: &TestEnv) -> Vec<Option<DateTime<Utc>>> {
    sqlx::query_scalar(
        "SELECT next_attempt_at FROM partner_notifications WHERE status = 'PENDING' ORDER BY id",
    )
    .fetch_all(&env.db)
    .await
    .unwrap()
}

/// Polls `done` (for 20 s at most); whenever the function is quiet, moves `clock` to the
/// soonest time a row waits for, so the deliveries' own waits (a backoff, a park behind the
/// breaker, a deferral at the in-flight bound) pass without sleeping through them. Quiet: no
/// row is due or in flight, each PENDING row waits for a time after now and at most
/// `longest_wait` away (a claim in flight carries its lease, which is longer).
async fn run_clock_until<F, Fut>(
    env: &TestEnv,
    clock: &Clock,
    longest_wait: Duration,
    mut done: F,
) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let now = clock.sql_now().unwrap();
        let horizon = now + chrono::Duration::from_std(longest_wait).unwrap();
        // The rows are read before `done` is asked: read after, a row that settled in between
        // would make a quiet picture of a state `done` never saw, and the clock would move
        // past the moment the caller waits for.
        let waits = waits(env).await;
        if done().await {
            return true;
        }
        let quiet = waits
            .iter()
            .all(|at| at.is_some_and(|at| at > now && at <= horizon));
        if let Some(soonest) = waits.iter().flatten().min().filter(|_| quiet) {
            clock.advance((*soonest - now).to_std().unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done().await
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

async fn count(env: &TestEnv, sql: &'static str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(&env.db)
        .await
        .unwrap()
}

/// Claims the notification for delivery as deliver-webhook does, on `clock`; `None` when not
/// claimed.
async fn claimed(
    env: &TestEnv,
    id: u64,
    lease: Duration,
    clock: &Clock,
) -> Option<notifications::ClaimedNotification> {
    match notifications::claim(&env.db, &sealer(), id, lease, clock)
        .await
        .unwrap()
    {
        DeliveryClaim::Claimed(claimed) => Some(claimed),
        _ => None,
    }
}

/// The function's consumer, its dead-letter recorder, the outbox relay and the due sweep.
fn start(
    services: &Services,
    handler: DeliverWebhook,
    sweep: DueSweepConfig,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    start_on(services, handler, sweep, Clock::Database)
}

/// [`start`] with the due sweep on `clock` (give the handler the same clock).
fn start_on(
    services: &Services,
    handler: DeliverWebhook,
    sweep: DueSweepConfig,
    clock: Clock,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let shutdown = CancellationToken::new();
    let mut runner = Runner::new(services.clone());
    runner.add_function(handler);
    runner.add_job(Arc::new(
        due_notifications(services, sweep).with_clock(clock),
    ));
    let token = shutdown.clone();
    let run = tokio::spawn(async move { runner.run(token).await.unwrap() });
    (shutdown, run)
}

async fn stop(stop: CancellationToken, run: tokio::task::JoinHandle<()>) {
    stop.cancel();
    run.await.unwrap();
}

async fn partner_ok(server: &MockServer) {
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(server)
        .await;
}

async fn requests(server: &MockServer) -> Vec<Request> {
    server.received_requests().await.unwrap()
}

fn header<'r>(request: &'r Request, name: &str) -> Option<&'r str> {
    request.headers.get(name).and_then(|v| v.to_str().ok())
}

fn notification_id_of(request: &Request) -> u64 {
    header(request, HEADER_NOTIFICATION_ID)
        .unwrap()
        .parse()
        .unwrap()
}

fn assert_signed(request: &Request) {
    let verified = signature::verify(
        SECRET.as_bytes(),
        header(request, HEADER_SIGNATURE),
        &request.body,
        Utc::now().timestamp(),
        signature::DEFAULT_TOLERANCE,
    );
    assert_eq!(verified, Ok(()), "signature of {request:?}");
}

/// Answers 500 to the first `failures` requests, then 200, and records when each came.
#[derive(Clone)]
struct DownForAWhile {
    failures: usize,
    seen: Arc<Mutex<Vec<Instant>>>,
}

impl Respond for DownForAWhile {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let mut seen = self.seen.lock().unwrap();
        seen.push(Instant::now());
        if seen.len() <= self.failures {
            ResponseTemplate::new(500).set_body_string("partner down for maintenance")
        } else {
            ResponseTemplate::new(200)
        }
    }
}

/// An address where nothing listens (connection refused).
fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}/hooks/paybus")
}

// ---------------------------------------------------------------------------------------------
// Delivery

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_notification_is_delivered_once_with_a_valid_signature() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let partner = MockServer::start().await;
    partner_ok(&partner).await;
    let partner_id =
        insert_partner(&env, "p", Some(&format!("{}/hooks/paybus", partner.uri()))).await;
    let (halt, run) = start(&services, webhook(config(8, &[100])).unwrap(), fast_sweep());

    let id = notify(&services, partner_id, 1989).await;
    let delivered = eventually(Duration::from_secs(20), || async {
        row(&env, id).await.status == "DELIVERED"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // room for a (wrong) second POST
    stop(halt, run).await;

    assert!(delivered, "{:?}", row(&env, id).await);
    let received = requests(&partner).await;
    assert_eq!(received.len(), 1, "{received:?}");
    let request = &received[0];
    assert_eq!(request.url.path(), "/hooks/paybus");
    assert_eq!(header(request, "content-type"), Some("application/json"));
    assert_eq!(header(request, HEADER_EVENT), Some("WITHDRAWAL_CONFIRMED"));
    assert_eq!(notification_id_of(request), id);
    assert_signed(request);
    let stored = row(&env, id).await;
    assert_eq!(
        request.body,
        stored.payload.as_bytes(),
        "the frozen payload, byte for byte"
    );
    assert_eq!(stored.attempts, 1);
    assert!(stored.delivered_at.is_some());
    assert_eq!(stored.next_attempt_at, None);
    assert_eq!(stored.last_error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_message_handled_three_times_at_once_posts_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let partner = MockServer::start().await;
    // Slow enough that the duplicates arrive while the first POST is in flight.
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(204).set_delay(Duration::from_millis(500)))
        .mount(&partner)
        .await;
    let partner_id = insert_partner(&env, "p", Some(&partner.uri())).await;
    let id = notification(&env.db, partner_id, 7).await;
    let handler = webhook(config(8, &[100])).unwrap();

    let (a, b, c) = tokio::join!(
        handle(&handler, &services, id, 1),
        handle(&handler, &services, id, 1),
        handle(&handler, &services, id, 1),
    );

    let outcomes = [a, b, c];
    let done = outcomes.iter().filter(|o| **o == Outcome::Done).count();
    let skipped = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Skipped(_)))
        .count();
    assert_eq!((done, skipped), (1, 2), "{outcomes:?}");
    assert_eq!(requests(&partner).await.len(), 1);
    let stored = row(&env, id).await;
    assert_eq!((stored.status.as_str(), stored.attempts), ("DELIVERED", 1));
    // A late duplicate is skipped too, with the reason.
    let late = handle(&handler, &services, id, 1).await;
    assert_eq!(
        late,
        Outcome::Skipped(format!("notification {id} is already DELIVERED"))
    );
    assert_eq!(requests(&partner).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_messages_across_two_consumers_post_each_notification_once() {
    let env = TestEnv::new().await;
    let services_a = env.services(&[DeliverWebhook::queue()]).await;
    let services_b = env.services(&[DeliverWebhook::queue()]).await;
    let partner = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_millis(30)))
        .mount(&partner)
        .await;
    let partner_id = insert_partner(&env, "p", Some(&partner.uri())).await;
    let mut ids = Vec::new();
    for reference in 0..40 {
        ids.push(notification(&env.db, partner_id, reference).await);
    }
    let webhook = webhook(config(8, &[100])).unwrap();
    let (halt_a, run_a) = start(&services_a, webhook.clone(), fast_sweep());
    let (halt_b, run_b) = start(&services_b, webhook, fast_sweep());

    // Every message three times: the same envelope, so the same message id.
    for &notification_id in &ids {
        let outgoing = Envelope::new(NotificationCreated { notification_id })
            .to_outgoing()
            .unwrap();
        for _ in 0..3 {
            services_a
                .publisher()
                .publish_event(&outgoing)
                .await
                .unwrap();
        }
    }
    let all_delivered = eventually(Duration::from_secs(30), || async {
        count(
            &env,
            "SELECT COUNT(*) FROM partner_notifications WHERE status = 'DELIVERED'",
        )
        .await
            == 40
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop(halt_a, run_a).await;
    stop(halt_b, run_b).await;

    assert!(all_delivered);
    let received = requests(&partner).await;
    let distinct: HashSet<u64> = received.iter().map(notification_id_of).collect();
    assert_eq!(received.len(), 40, "one POST per notification");
    assert_eq!(distinct, ids.iter().copied().collect::<HashSet<_>>());
    assert_eq!(
        count(
            &env,
            "SELECT COUNT(*) FROM partner_notifications WHERE attempts <> 1"
        )
        .await,
        0
    );
    assert_eq!(count(&env, "SELECT COUNT(*) FROM dead_letters").await, 0);
}

// ---------------------------------------------------------------------------------------------
// Failed attempts and retries

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_attempt_records_the_error_and_the_next_attempt_on_the_row() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let partner = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_string("upstream\nunavailable"))
        .mount(&partner)
        .await;
    let partner_id = insert_partner(&env, "p", Some(&partner.uri())).await;
    let id = notification(&env.db, partner_id, 1).await;
    let handler = webhook(config(8, &[10_000, 30_000])).unwrap();

    let outcome = handle(&handler, &services, id, 1).await;

    let expected_error = "HTTP 503 Service Unavailable: upstream unavailable";
    assert_eq!(
        outcome,
        Outcome::Retry {
            after: Duration::from_secs(10),
            error: format!("notification {id}, attempt 1/8: {expected_error}"),
        }
    );
    let stored = row(&env, id).await;
    assert_eq!(stored.status, "PENDING");
    assert_eq!(stored.attempts, 1);
    assert_eq!(stored.last_error.as_deref(), Some(expected_error));
    // Written in one statement: next attempt = that statement's NOW(6) + the backoff.
    assert_eq!(
        stored.next_attempt_at.unwrap() - stored.updated_at,
        chrono::Duration::seconds(10)
    );
    // Not due: a duplicate message now is skipped and sends nothing.
    let duplicate = handle(&handler, &services, id, 1).await;
    assert!(
        matches!(&duplicate, Outcome::Skipped(reason) if reason.contains("not due")),
        "{duplicate:?}"
    );
    assert_eq!(requests(&partner).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partner_down_for_a_while_is_retried_with_backoff_then_delivered() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let partner = MockServer::start().await;
    let responder = DownForAWhile {
        failures: 3,
        seen: Arc::default(),
    };
    Mock::given(method("POST"))
        .respond_with(responder.clone())
        .mount(&partner)
        .await;
    let partner_id = insert_partner(&env, "p", Some(&partner.uri())).await;
    let backoff_ms = [300, 600, 900];
    // Committed first, so that the manual clock, a second past the database's now, finds it
    // due; its message waits in the outbox until the runner's relay starts.
    let id = notify(&services, partner_id, 42).await;
    let clock = manual_clock(&env.db).await;
    let handler = webhook(config(8, &backoff_ms))
        .unwrap()
        .with_clock(clock.clone());
    let (halt, run) = start_on(&services, handler, fast_sweep(), clock.clone());
    let sweep = due_notifications(&services, fast_sweep()).with_clock(clock.clone());

    // While the partner is down the row carries each failure and its next attempt, the
    // clock's now plus the backoff. A millisecond before that the row is not due and no sweep
    // sends it; at the backoff the running sweep does.
    let mut early = Vec::new();
    for (attempts, pause) in (1..).zip(backoff_ms) {
        let due = clock.sql_now().unwrap() + chrono::Duration::from_std(ms(pause)).unwrap();
        let recorded = eventually(Duration::from_secs(20), || async {
            let stored = row(&env, id).await;
            stored.status == "PENDING"
                && stored.attempts == attempts
                && stored
                    .last_error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("HTTP 500 Internal Server Error: partner down"))
                && stored.next_attempt_at == Some(due)
        })
        .await;
        assert!(recorded, "attempt {attempts}: {:?}", row(&env, id).await);
        clock.advance(ms(pause - 1));
        early.push(sweep.run_once().await.unwrap());
        clock.advance(ms(1));
    }
    let delivered = eventually(Duration::from_secs(30), || async {
        row(&env, id).await.status == "DELIVERED"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // room for a (wrong) fifth POST
    stop(halt, run).await;

    assert_eq!(early, [0, 0, 0], "no retry is due before its backoff");
    assert!(delivered, "{:?}", row(&env, id).await);
    let stored = row(&env, id).await;
    assert_eq!(stored.attempts, 4);
    assert!(stored.delivered_at.is_some());
    let received = requests(&partner).await;
    assert_eq!(received.len(), 4, "3 refused + 1 delivered");
    for request in &received {
        assert_eq!(notification_id_of(request), id);
        assert_signed(request);
    }
    assert_eq!(count(&env, "SELECT COUNT(*) FROM dead_letters").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partner_down_for_good_ends_failed_with_one_dead_letter_and_others_are_delivered() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let broken = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500).set_body_string("boom"))
        .mount(&broken)
        .await;
    let healthy = MockServer::start().await;
    partner_ok(&healthy).await;
    let broken_partner = insert_partner(&env, "broken", Some(&broken.uri())).await;
    let gone_partner = insert_partner(&env, "gone", Some(&closed_port_url())).await;
    let healthy_partner = insert_partner(&env, "healthy", Some(&healthy.uri())).await;
    // Committed before the manual clock is read, so they are due on it; the runner's relay
    // sends their messages.
    let to_broken = notify(&services, broken_partner, 1).await;
    let to_gone = notify(&services, gone_partner, 2).await;
    let mut to_healthy = Vec::new();
    for reference in 10..15 {
        to_healthy.push(notify(&services, healthy_partner, reference).await);
    }
    let clock = manual_clock(&env.db).await;
    let handler = webhook(config(3, &[100, 200]))
        .unwrap()
        .with_clock(clock.clone());
    let (halt, run) = start_on(&services, handler, fast_sweep(), clock.clone());
    // The clock moves past each backoff once both failing rows have settled their attempt
    // with it (the clock's now plus the backoff; a claim in flight carries its lease).
    for (attempts, backoff) in [(1, 100), (2, 200)] {
        let due = Some(clock.sql_now().unwrap() + chrono::Duration::from_std(ms(backoff)).unwrap());
        let settled_attempt = eventually(Duration::from_secs(20), || async {
            let (broken, gone) = (row(&env, to_broken).await, row(&env, to_gone).await);
            (broken.attempts, broken.next_attempt_at) == (attempts, due)
                && (gone.attempts, gone.next_attempt_at) == (attempts, due)
        })
        .await;
        assert!(
            settled_attempt,
            "{:?} / {:?}",
            row(&env, to_broken).await,
            row(&env, to_gone).await
        );
        clock.advance(ms(backoff));
    }
    let settled = eventually(Duration::from_secs(30), || async {
        row(&env, to_broken).await.status == "FAILED"
            && row(&env, to_gone).await.status == "FAILED"
            && count(&env, "SELECT COUNT(*) FROM dead_letters").await == 2
            && count(
                &env,
                "SELECT COUNT(*) FROM partner_notifications WHERE status = 'DELIVERED'",
            )
            .await
                == 5
    })
    .await;
    // An hour later nothing is due: a FAILED row is never re-published, re-sent or
    // dead-lettered again.
    clock.advance(Duration::from_secs(3600));
    let due_later = due_notifications(&services, fast_sweep())
        .with_clock(clock.clone())
        .run_once()
        .await
        .unwrap();
    stop(halt, run).await;

    assert_eq!(due_later, 0);
    assert!(
        settled,
        "{:?} / {:?}",
        row(&env, to_broken).await,
        row(&env, to_gone).await
    );
    let broken_row = row(&env, to_broken).await;
    assert_eq!(broken_row.attempts, 3);
    assert_eq!(
        broken_row.last_error.as_deref(),
        Some("HTTP 500 Internal Server Error: boom")
    );
    assert_eq!(broken_row.next_attempt_at, None);
    let gone_row = row(&env, to_gone).await;
    assert_eq!(gone_row.attempts, 3);
    assert!(
        gone_row
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("connection failed")),
        "{gone_row:?}"
    );
    assert_eq!(requests(&broken).await.len(), 3);
    assert_eq!(requests(&healthy).await.len(), 5);

    let dead: Vec<(String, String, String)> =
        sqlx::query_as("SELECT function_name, reason, error FROM dead_letters ORDER BY id")
            .fetch_all(&env.db)
            .await
            .unwrap();
    assert_eq!(dead.len(), 2, "{dead:?}");
    for (function, reason, _) in &dead {
        assert_eq!(
            (function.as_str(), reason.as_str()),
            ("deliver-webhook", "failed")
        );
    }
    for id in [to_broken, to_gone] {
        let mine: Vec<_> = dead
            .iter()
            .filter(|(_, _, error)| error.starts_with(&format!("notification {id} ")))
            .collect();
        assert_eq!(
            mine.len(),
            1,
            "one dead letter for notification {id}: {dead:?}"
        );
        assert!(mine[0].2.contains("gave up after 3 attempts"), "{mine:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timeout_counts_as_a_failed_attempt() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let partner = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(3)))
        .mount(&partner)
        .await;
    let partner_id = insert_partner(&env, "slow", Some(&partner.uri())).await;
    let id = notification(&env.db, partner_id, 1).await;
    let handler = webhook(WebhookConfig {
        timeout: Duration::from_millis(300),
        ..config(8, &[10_000])
    })
    .unwrap();

    let started = Instant::now();
    let outcome = handle(&handler, &services, id, 1).await;

    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        outcome,
        Outcome::Retry {
            after: Duration::from_secs(10),
            error: format!("notification {id}, attempt 1/8: timed out after 300ms"),
        }
    );
    let stored = row(&env, id).await;
    assert_eq!((stored.status.as_str(), stored.attempts), ("PENDING", 1));
    assert_eq!(stored.last_error.as_deref(), Some("timed out after 300ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redirect_is_a_failed_attempt_and_is_not_followed() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let partner = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(301).insert_header("location", "/elsewhere"))
        .mount(&partner)
        .await;
    let partner_id = insert_partner(&env, "moved", Some(&partner.uri())).await;
    let id = notification(&env.db, partner_id, 1).await;
    let handler = webhook(config(8, &[10_000])).unwrap();

    let outcome = handle(&handler, &services, id, 1).await;

    assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
    assert_eq!(
        requests(&partner).await.len(),
        1,
        "the redirect is not followed"
    );
    assert_eq!(
        row(&env, id).await.last_error.as_deref(),
        Some("HTTP 301 Moved Permanently")
    );
}

// ---------------------------------------------------------------------------------------------
// Nothing to send

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partner_without_webhook_url_is_skipped() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let partner_id = insert_partner(&env, "no hooks", None).await;
    let id = notification(&env.db, partner_id, 1).await;
    let handler = webhook(config(8, &[100])).unwrap();

    let outcome = handle(&handler, &services, id, 1).await;

    assert_eq!(
        outcome,
        Outcome::Skipped(format!(
            "notification {id}: partner {partner_id} has no webhook_url; marked SKIPPED"
        ))
    );
    let stored = row(&env, id).await;
    assert_eq!((stored.status.as_str(), stored.attempts), ("SKIPPED", 0));
    assert_eq!(stored.next_attempt_at, None);
    assert_eq!(
        handle(&handler, &services, id, 1).await,
        Outcome::Skipped(format!("notification {id} is already SKIPPED"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_notification_is_failed() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let handler = webhook(config(8, &[100])).unwrap();

    let outcome = handle(&handler, &services, 4242, 1).await;

    assert_eq!(
        outcome,
        Outcome::Failed("notification 4242 does not exist".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_row_is_failed_again_only_on_a_redelivery() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let partner = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500))
        .mount(&partner)
        .await;
    let partner_id = insert_partner(&env, "p", Some(&partner.uri())).await;
    let id = notification(&env.db, partner_id, 1).await;
    let handler = webhook(config(1, &[100])).unwrap();
    let first = handle(&handler, &services, id, 1).await;
    assert_eq!(
        first,
        Outcome::Failed(format!(
            "notification {id} to partner {partner_id}: gave up after 1 attempts; \
             last error: HTTP 500 Internal Server Error"
        ))
    );

    // A late duplicate: the row already has its dead letter.
    let duplicate = handle(&handler, &services, id, 1).await;
    // The same message again (its dead letter was not confirmed): failed again, so the dead
    // letter is not lost (recorded once: its id derives from the message id).
    let redelivered = handle(&handler, &services, id, 2).await;

    assert_eq!(
        duplicate,
        Outcome::Skipped(format!("notification {id} is already FAILED"))
    );
    assert!(
        matches!(&redelivered, Outcome::Failed(reason) if reason.contains("is FAILED after 1 attempts")),
        "{redelivered:?}"
    );
    assert_eq!(requests(&partner).await.len(), 1, "nothing is sent again");
}

// ---------------------------------------------------------------------------------------------
// The due-retries sweep

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sweep_republishes_each_due_retry_once_and_leaves_fresh_rows_alone() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let partner = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500))
        .mount(&partner)
        .await;
    let partner_id = insert_partner(&env, "p", Some(&partner.uri())).await;
    let retrying = notification(&env.db, partner_id, 1).await;
    let fresh = notification(&env.db, partner_id, 2).await;
    let clock = manual_clock(&env.db).await;
    let handler = webhook(config(8, &[1_500]))
        .unwrap()
        .with_clock(clock.clone());
    let sweep = due_notifications(&services, DueSweepConfig::default()).with_clock(clock.clone());
    let outbox_rows = || count(&env, "SELECT COUNT(*) FROM outbox_messages");

    assert!(matches!(
        handle(&handler, &services, retrying, 1).await,
        Outcome::Retry { .. }
    ));
    let before_due = sweep.run_once().await.unwrap();
    clock.advance(Duration::from_millis(1_500));
    let when_due = sweep.run_once().await.unwrap();
    let again = sweep.run_once().await.unwrap();

    assert_eq!(before_due, 0, "not due yet");
    assert_eq!(
        when_due, 1,
        "the due retry, not the fresh row (its message is on its way)"
    );
    assert_eq!(
        again, 0,
        "one message per arming, however often the sweep runs"
    );
    assert_eq!(outbox_rows().await, 1);
    let body: String = sqlx::query_scalar("SELECT CAST(body AS CHAR) FROM outbox_messages")
        .fetch_one(&env.db)
        .await
        .unwrap();
    let message: Envelope<NotificationCreated> = serde_json::from_str(&body).unwrap();
    assert_eq!(message.data.notification_id, retrying);
    assert_eq!(row(&env, fresh).await.attempts, 0);

    // The re-published message claims it (attempt 2), which re-arms it for a later sweep.
    assert!(matches!(
        handle(&handler, &services, retrying, 1).await,
        Outcome::Retry { .. }
    ));
    clock.advance(Duration::from_millis(1_500));
    assert_eq!(sweep.run_once().await.unwrap(), 1);
    assert_eq!(row(&env, retrying).await.attempts, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_due_row_left_unclaimed_is_republished_again_after_stale_after() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let partner_id = insert_partner(&env, "p", Some("http://127.0.0.1:9/unused")).await;
    // A fresh row whose message never arrived (lost, or consumers down).
    let id = notification(&env.db, partner_id, 1).await;
    let clock = manual_clock(&env.db).await;
    let stale_after = Duration::from_secs(120);
    let sweep = due_notifications(
        &services,
        DueSweepConfig {
            stale_after,
            ..DueSweepConfig::default()
        },
    )
    .with_clock(clock.clone());

    let at_once = sweep.run_once().await.unwrap();
    clock.advance(stale_after);
    let stale = sweep.run_once().await.unwrap();
    let right_after = sweep.run_once().await.unwrap();
    clock.advance(stale_after);
    let stale_again = sweep.run_once().await.unwrap();

    assert_eq!((at_once, stale, right_after, stale_again), (0, 1, 0, 1));
    assert_eq!(row(&env, id).await.status, "PENDING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_https_partner_gets_a_tls_handshake() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    // A plain-HTTP server behind an https:// URL: the client must speak TLS to it (and fail
    // the handshake), which proves TLS is built in.
    let partner = MockServer::start().await;
    partner_ok(&partner).await;
    let url = partner.uri().replacen("http://", "https://", 1);
    let partner_id = insert_partner(&env, "tls", Some(&url)).await;
    let id = notification(&env.db, partner_id, 1).await;
    let handler = webhook(config(8, &[10_000])).unwrap();

    let outcome = handle(&handler, &services, id, 1).await;

    assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
    let error = row(&env, id).await.last_error.unwrap();
    // rustls's own words for an HTTP answer to its ClientHello.
    assert!(
        error.starts_with("connection failed") && error.contains("InvalidContentType"),
        "{error}"
    );
}

// ---------------------------------------------------------------------------------------------
// Crashes mid-delivery

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delivery_whose_process_died_is_sent_again_once_its_lease_runs_out() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let partner = MockServer::start().await;
    partner_ok(&partner).await;
    let partner_id = insert_partner(&env, "p", Some(&partner.uri())).await;
    let id = notification(&env.db, partner_id, 1).await;
    let clock = manual_clock(&env.db).await;
    let handler = webhook(config(8, &[100]))
        .unwrap()
        .with_clock(clock.clone());
    let sweep = due_notifications(&services, DueSweepConfig::default()).with_clock(clock.clone());
    // A claim whose process then died: nothing settles it.
    let lease = Duration::from_secs(60);
    let claim = notifications::claim(&env.db, &sealer(), id, lease, &clock)
        .await
        .unwrap();
    assert!(matches!(claim, DeliveryClaim::Claimed(_)), "{claim:?}");

    let while_held = handle(&handler, &services, id, 1).await;
    clock.advance(lease - Duration::from_millis(1));
    let swept_while_held = sweep.run_once().await.unwrap();
    clock.advance(Duration::from_millis(1));
    let swept_after = sweep.run_once().await.unwrap();
    let retried = handle(&handler, &services, id, 1).await;

    assert!(
        matches!(&while_held, Outcome::Skipped(reason) if reason.contains("in flight")),
        "{while_held:?}"
    );
    assert_eq!((swept_while_held, swept_after), (0, 1));
    assert_eq!(retried, Outcome::Done);
    let stored = row(&env, id).await;
    assert_eq!((stored.status.as_str(), stored.attempts), ("DELIVERED", 2));
    assert_eq!(requests(&partner).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_settle_after_the_claim_was_taken_over_writes_nothing() {
    let env = TestEnv::new().await;
    let partner_id = insert_partner(&env, "p", Some("http://127.0.0.1:9/unused")).await;
    let id = notification(&env.db, partner_id, 1).await;
    let clock = manual_clock(&env.db).await;
    let Some(first) = claimed(&env, id, Duration::from_secs(60), &clock).await else {
        panic!("first claim")
    };
    clock.advance(Duration::from_secs(60));
    let Some(second) = claimed(&env, id, Duration::from_secs(60), &clock).await else {
        panic!("second claim after the lease")
    };

    let give_up_now = RetryPolicy::with_schedule(1, vec![Duration::from_secs(1)]).unwrap();
    let late_failure = notifications::settle_failure(
        &env.db,
        &first,
        &give_up_now,
        "HTTP 500 from a slow attempt",
        &clock,
        None,
    )
    .await;
    let late_success = notifications::settle_delivered(&env.db, &first, &posted()).await;
    let current = notifications::settle_delivered(&env.db, &second, &posted()).await;

    assert_eq!((first.attempts, second.attempts), (1, 2));
    assert_eq!(late_failure.unwrap(), AfterFailure::ClaimLost);
    assert_eq!(late_success.unwrap(), Settled::ClaimLost);
    assert_eq!(current.unwrap(), Settled::Yes);
    let stored = row(&env, id).await;
    assert_eq!((stored.status.as_str(), stored.attempts), ("DELIVERED", 2));
    assert_eq!(stored.last_error, None);
}

// ---------------------------------------------------------------------------------------------
// Partners are isolated from each other (bulkhead and circuit breaker)

/// Records when each notification reached the partner, and answers 200.
#[derive(Clone, Default)]
struct ArrivalLog {
    arrived: Arc<Mutex<std::collections::HashMap<u64, Instant>>>,
}

impl Respond for ArrivalLog {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        self.arrived
            .lock()
            .unwrap()
            .entry(notification_id_of(request))
            .or_insert_with(Instant::now);
        ResponseTemplate::new(200)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_hanging_deliveries_to_one_partner_do_not_delay_another() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    // Partner A never answers in time; partner B answers at once and logs each arrival.
    let hanging = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(60)))
        .mount(&hanging)
        .await;
    let healthy = MockServer::start().await;
    let arrivals = ArrivalLog::default();
    Mock::given(method("POST"))
        .respond_with(arrivals.clone())
        .mount(&healthy)
        .await;
    let a = insert_partner(&env, "hanging", Some(&hanging.uri())).await;
    let b = insert_partner(&env, "healthy", Some(&healthy.uri())).await;
    let (stop_run, run) = start(
        &services,
        webhook(config(8, &[1_000])).unwrap(),
        fast_sweep(),
    );

    for reference in 1..=200 {
        notify(&services, a, reference).await;
    }
    let mut sent = Vec::new();
    for reference in 1_001..=1_020 {
        let id = notify(&services, b, reference).await;
        sent.push((id, Instant::now()));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let all_arrived = eventually(Duration::from_secs(20), || async {
        arrivals.arrived.lock().unwrap().len() == sent.len()
    })
    .await;
    let hanging_requests = requests(&hanging).await.len();
    stop(stop_run, run).await;

    assert!(
        all_arrived,
        "every healthy-partner notification is delivered"
    );
    let arrived = arrivals.arrived.lock().unwrap().clone();
    let worst = sent
        .iter()
        .map(|(id, at)| arrived[id].duration_since(*at))
        .max()
        .unwrap();
    assert!(
        worst < Duration::from_secs(1),
        "the healthy partner's worst latency was {worst:?} while 200 deliveries to another hung"
    );
    // The hanging partner held at most its share of POSTs at a time, and its breaker opened
    // instead of every notification burning attempts.
    assert!(
        hanging_requests < 40,
        "{hanging_requests} POSTs to the hanging partner"
    );
    let (failures, open_until): (u32, Option<DateTime<Utc>>) =
        sqlx::query_as("SELECT webhook_failures, webhook_open_until FROM partners WHERE id = ?")
            .bind(a)
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert!(
        failures >= 5 && open_until.is_some(),
        "{failures} {open_until:?}"
    );
    let burned: i64 = sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(attempts), 0) AS SIGNED) FROM partner_notifications WHERE partner_id = ?",
    )
    .bind(a)
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(
        usize::try_from(burned).unwrap(),
        hanging_requests,
        "only deliveries actually POSTed count an attempt"
    );
}

/// Answers 500 until `recover` is set, then 200.
#[derive(Clone, Default)]
struct Recovers {
    recovered: Arc<std::sync::atomic::AtomicBool>,
}

impl Respond for Recovers {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        if self.recovered.load(std::sync::atomic::Ordering::SeqCst) {
            ResponseTemplate::new(200)
        } else {
            ResponseTemplate::new(500)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_open_breaker_parks_a_partner_without_burning_attempts_until_a_probe_succeeds() {
    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let server = MockServer::start().await;
    let partner = Recovers::default();
    Mock::given(method("POST"))
        .respond_with(partner.clone())
        .mount(&server)
        .await;
    let partner_id = insert_partner(&env, "flaky", Some(&server.uri())).await;
    let cool_down = Duration::from_secs(30);
    // Committed before the manual clock is read, so they are due on it; the runner's relay
    // sends their messages.
    let ids: Vec<u64> = {
        let mut ids = Vec::new();
        for reference in 1..=6 {
            ids.push(notify(&services, partner_id, reference).await);
        }
        ids
    };
    let clock = manual_clock(&env.db).await;
    let handler = webhook(WebhookConfig {
        partner_concurrency: 1,
        breaker: BreakerPolicy {
            failures_to_open: 3,
            cool_down,
        },
        ..config(10, &[200])
    })
    .unwrap()
    .with_clock(clock.clone());
    let (stop_run, run) = start_on(&services, handler, fast_sweep(), clock.clone());

    let breaker = || async {
        let mut conn = env.db.acquire().await.unwrap();
        paybus_partners::partner::find(&mut conn, partner_id)
            .await
            .unwrap()
            .unwrap()
            .webhook_breaker
    };
    // Deliveries that find the partner's one slot taken are deferred a second; the clock
    // moves on whenever nothing is in flight, until three failed POSTs open the breaker.
    let opened = run_clock_until(&env, &clock, cool_down, || async {
        breaker().await.state == BreakerState::Open
    })
    .await;
    let while_open = breaker().await;
    let posts_when_opened = requests(&server).await.len();
    // While it is open every delivery ends parked until the breaker lets a probe through,
    // the failed ones once their backoff has passed: none is POSTed.
    let open_until = while_open.open_until.unwrap();
    let all_parked = run_clock_until(&env, &clock, cool_down, || async {
        pending_until(&env, open_until).await == 6
    })
    .await;
    let posts_while_open = requests(&server).await.len();
    partner
        .recovered
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let delivered = run_clock_until(&env, &clock, cool_down, || async {
        count(
            &env,
            "SELECT COUNT(*) FROM partner_notifications WHERE status = 'DELIVERED'",
        )
        .await
            == 6
    })
    .await;
    stop(stop_run, run).await;

    assert!(opened, "three consecutive failures open the breaker");
    assert_eq!(while_open.consecutive_failures, 3);
    assert_eq!(posts_when_opened, 3, "one POST per failure, one at a time");
    assert!(all_parked, "{:?}", waits(&env).await);
    assert_eq!(posts_while_open, 3, "an open breaker parks: no POST");
    assert!(
        delivered,
        "after the cool-down a probe succeeds and the rest follow: {:?}",
        waits(&env).await
    );
    let closed = breaker().await;
    assert_eq!(
        (closed.state, closed.consecutive_failures),
        (BreakerState::Closed, 0)
    );
    let attempts: Vec<u32> =
        sqlx::query_scalar("SELECT attempts FROM partner_notifications ORDER BY id")
            .fetch_all(&env.db)
            .await
            .unwrap();
    assert_eq!(
        attempts.iter().sum::<u32>(),
        3 + 6,
        "three failed POSTs and six deliveries; parked time burned nothing: {attempts:?} for {ids:?}"
    );
}
