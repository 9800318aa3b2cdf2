//! The bus runtime end to end, against the real broker and database, with the canary as the
//! function under test.

use std::{sync::Arc, time::Duration};

use lapin::BasicProperties;
use paybus_bus::{
    Envelope, Handler, Message, Services, consumer, dead_letter,
    delivery::{Disposition, IncomingDelivery, Processor},
    outbox::{Relay, RelayConfig},
    pauses, topology,
};
use paybus_canary::{Canary, Ping, send_ping};
use paybus_config::Settings;
use paybus_lab::services::{PrivateBroker, PrivateCluster, PrivateService};
use paybus_runtime::runner::Runner;
use paybus_testkit::{
    TestEnv, eventually, outage::Relay as TcpRelay, queue_depth, queue_state, scalar, services_on,
};
use tokio_util::sync::CancellationToken;

use crate::outcome_counts::OutcomeCounts;

fn relay(services: &Services) -> Relay {
    Relay::new(
        services.outbox.clone(),
        RelayConfig {
            grace: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
}

/// A queue of the test's own bound to `canary.ping`, to count what reaches the broker.
async fn tap(services: &Services, name: &str) -> lapin::Channel {
    paybus_testkit::tap(services, name, Ping::TYPE).await
}

async fn insert_pings(env: &TestEnv, n: usize) -> Vec<u64> {
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(
            sqlx::query("INSERT INTO canary_pings () VALUES ()")
                .execute(&env.db)
                .await
                .unwrap()
                .last_insert_id(),
        );
    }
    ids
}

async fn publish_raw(services: &Services, routing_key: &str, body: &[u8]) {
    services
        .publisher()
        .publish_raw(
            topology::EVENTS_EXCHANGE,
            routing_key,
            body,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .expect("publish");
}

/// A test's turn to run the canary, and the canary's counts when it began.
struct CanaryCounts(OutcomeCounts);

impl CanaryCounts {
    async fn take() -> Self {
        Self(OutcomeCounts::take().await)
    }

    /// Canary messages that ended with `outcome` since this turn began.
    fn count(&self, outcome: &str) -> u64 {
        self.0.count(Canary::FUNCTION, outcome)
    }
}

/// A runner of the canary; only a test holding its turn (`_turn`) starts one.
fn start_runner(
    services: &Services,
    _turn: &CanaryCounts,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let shutdown = CancellationToken::new();
    let mut runner = Runner::new(services.clone());
    runner.add_function(Canary);
    show_warnings();
    let token = shutdown.clone();
    let handle = tokio::spawn(async move { runner.run(token).await.expect("runner") });
    (shutdown, handle)
}

/// WARN and above on stderr, which nextest shows when a test fails: a runner whose stop hangs
/// names what it waits for every 10 s (its tasks, a consumer's deliveries in flight), and CI's
/// output of a failure carries it (a failover test's stop once took over 60 s, 2026-12-06, and
/// said nothing).
fn show_warnings() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

/// Stops a runner from [`start_runner`]; a stop that hangs fails the test by name, rather than
/// as a test the harness kills with nothing said.
async fn stop_runner(shutdown: CancellationToken, run: tokio::task::JoinHandle<()>) {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the runner stops within 60 s of its shutdown")
        .expect("the runner ends without a panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolled_back_unit_of_work_publishes_nothing() {
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let channel = tap(&services, "test.tap").await;

    let mut tx = services.outbox.begin().await.unwrap();
    tx.send(&Envelope::new(Ping { ping_id: 1 })).await.unwrap();
    tx.rollback().await.unwrap();
    let report = relay(&services).run_once().await.unwrap();

    assert_eq!(report.published, 0);
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM outbox_messages").await,
        0
    );
    assert_eq!(queue_depth(&channel, "test.tap").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_defective_outbox_row_becomes_a_dead_letter_and_the_rest_is_published() {
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let channel = tap(&services, "test.tap").await;
    let good = Envelope::new(Ping { ping_id: 1 }).to_outgoing().unwrap();
    for (message_id, body) in [
        (good.id.to_string(), good.body.clone()),
        ("not-a-uuid".to_owned(), b"{\"broken\": true}".to_vec()),
    ] {
        sqlx::query(
            "INSERT INTO outbox_messages (message_id, routing_key, correlation_id, body, created_at) \
             VALUES (?, 'canary.ping', ?, ?, NOW(6))",
        )
        .bind(&message_id)
        .bind(good.correlation_id.to_string())
        .bind(body)
        .execute(&env.db)
        .await
        .unwrap();
    }

    let report = relay(&services).run_once().await.unwrap();

    assert_eq!((report.published, report.defective), (1, 1));
    assert_eq!(queue_depth(&channel, "test.tap").await, 1);
    let dead: (String, String, String, Vec<u8>) =
        sqlx::query_as("SELECT function_name, reason, error, body FROM dead_letters")
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!(
        (dead.0.as_str(), dead.1.as_str()),
        ("outbox", "defective_outbox_row")
    );
    assert!(
        dead.2.contains("\"not-a-uuid\" is not a UUID"),
        "{}",
        dead.2
    );
    assert_eq!(dead.3, b"{\"broken\": true}");
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM outbox_messages WHERE published_at IS NULL"
        )
        .await,
        0,
        "nothing left for the relay to trip on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_committed_unit_of_work_is_published_at_once_and_marked() {
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let channel = tap(&services, "test.tap").await;

    let mut tx = services.outbox.begin().await.unwrap();
    tx.send(&Envelope::new(Ping { ping_id: 1 })).await.unwrap();
    tx.commit().await.unwrap();

    assert_eq!(queue_depth(&channel, "test.tap").await, 1);
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM outbox_messages WHERE published_at IS NOT NULL"
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_together_publish_each_row_once() {
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let channel = tap(&services, "test.tap").await;
    // Rows committed by producers that died before publishing.
    for i in 0..2_000u64 {
        let envelope = Envelope::new(Ping { ping_id: i }).to_outgoing().unwrap();
        sqlx::query(
            "INSERT INTO outbox_messages (message_id, routing_key, correlation_id, body) \
             VALUES (?, ?, ?, ?)",
        )
        .bind(envelope.id.to_string())
        .bind(&envelope.routing_key)
        .bind(envelope.correlation_id.to_string())
        .bind(&envelope.body)
        .execute(&env.db)
        .await
        .unwrap();
    }

    let (a, b) = (relay(&services), relay(&services));
    let drain = |relay: Relay| async move {
        let mut published = 0;
        loop {
            let report = relay.run_once().await.unwrap();
            published += report.published;
            if report.published == 0 {
                return published;
            }
        }
    };
    let (by_a, by_b) = tokio::join!(drain(a), drain(b));

    assert_eq!(by_a + by_b, 2_000, "a: {by_a}, b: {by_b}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            queue_depth(&channel, "test.tap").await == 2_000
        })
        .await,
        "broker holds {} messages",
        queue_depth(&channel, "test.tap").await
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM outbox_messages WHERE published_at IS NULL"
        )
        .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_messages_delivered_twice_in_parallel_give_a_thousand_effects() {
    let counts = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let ids = insert_pings(&env, 1_000).await;
    // Two consumers of the same queue in parallel.
    let (stop_a, run_a) = start_runner(&services, &counts);
    let (stop_b, run_b) = start_runner(&services, &counts);

    let messages: Vec<_> = ids
        .iter()
        .flat_map(|&ping_id| {
            let outgoing = Envelope::new(Ping { ping_id }).to_outgoing().unwrap();
            [outgoing.clone(), outgoing]
        })
        .collect();
    for result in services.publisher().publish_events(&messages).await {
        result.expect("confirmed");
    }

    let all_ponged = eventually(Duration::from_secs(60), || async {
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM canary_pings WHERE status = 'PONGED'",
        )
        .await
            == 1_000
    })
    .await;
    let handled = eventually(Duration::from_secs(30), || async {
        counts.count("done") + counts.count("skipped") == 2_000
    })
    .await;
    stop_a.cancel();
    stop_b.cancel();
    run_a.await.unwrap();
    run_b.await.unwrap();

    assert!(all_ponged);
    assert!(
        handled,
        "done {} skipped {}",
        counts.count("done"),
        counts.count("skipped")
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT CAST(SUM(pongs) AS SIGNED) FROM canary_pings"
        )
        .await,
        1_000
    );
    assert_eq!(counts.count("done"), 1_000);
    assert_eq!(counts.count("skipped"), 1_000);
}

/// Publishes a ping whose body is `first`, then `count` whose bodies are `1`, `2`, ….
async fn publish_first_then_numbered(services: &Services, first: &str, count: u32) {
    publish_raw(services, "canary.ping", first.as_bytes()).await;
    for n in 1..=count {
        publish_raw(services, "canary.ping", n.to_string().as_bytes()).await;
    }
}

/// `processor`'s consumer with `prefetch`, running until the token is cancelled.
fn consume_in_background<P: Processor + 'static>(
    services: &Services,
    processor: Arc<P>,
    prefetch: u16,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), lapin::Error>>,
) {
    let shutdown = CancellationToken::new();
    let consuming = tokio::spawn({
        let (link, publisher) = (services.link.clone(), services.publisher().clone());
        let shutdown = shutdown.clone();
        async move {
            consumer::consume(
                &link,
                processor,
                publisher,
                prefetch,
                pauses::PauseWatch::never(),
                shutdown,
            )
            .await
        }
    });
    (shutdown, consuming)
}

/// What the canary recorder does with the delivery whose body is `special`.
enum OnSpecial {
    /// Panics the first time (a handler bug).
    PanicOnce,
    /// Waits until `release` is cancelled (a call that never answers).
    HoldUntilReleased,
}

/// Records every body it processed from the canary queue; the `special` one gets `on_special`.
struct Recorder {
    special: &'static str,
    on_special: OnSpecial,
    processed: std::sync::Mutex<Vec<String>>,
    panicked: std::sync::atomic::AtomicBool,
    release: CancellationToken,
}

impl Recorder {
    fn new(special: &'static str, on_special: OnSpecial) -> Self {
        Self {
            special,
            on_special,
            processed: std::sync::Mutex::default(),
            panicked: std::sync::atomic::AtomicBool::default(),
            release: CancellationToken::new(),
        }
    }
}

impl Processor for Recorder {
    fn function(&self) -> &str {
        Canary::FUNCTION
    }

    fn queue(&self) -> String {
        Canary::queue().queue()
    }

    async fn process(&self, delivery: &IncomingDelivery) -> Disposition {
        let body = String::from_utf8_lossy(&delivery.body).into_owned();
        if body == self.special {
            match self.on_special {
                OnSpecial::PanicOnce => {
                    if !self
                        .panicked
                        .swap(true, std::sync::atomic::Ordering::SeqCst)
                    {
                        panic!("a handler bug");
                    }
                }
                OnSpecial::HoldUntilReleased => self.release.cancelled().await,
            }
        }
        self.processed.lock().unwrap().push(body);
        Disposition::Ack
    }
}

/// Acks go out in runs, so a delivery never settled would hold back every later ack until the
/// prefetch window (4 here) is full and the consumer stalls. A panicking handler's delivery is
/// requeued instead: it comes back and is processed, and the 20 after it are acked meanwhile.
#[tokio::test]
async fn a_handler_panic_requeues_its_delivery_and_the_later_ones_are_still_acked() {
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let processor = Arc::new(Recorder::new("boom", OnSpecial::PanicOnce));
    let (shutdown, consuming) = consume_in_background(&services, processor.clone(), 4);
    publish_first_then_numbered(&services, "boom", 20).await;

    let all_processed = eventually(Duration::from_secs(30), || async {
        processor.processed.lock().unwrap().len() == 21
    })
    .await;
    let mut processed = processor.processed.lock().unwrap().clone();
    assert!(all_processed, "processed only {processed:?}");
    processed.sort();
    let mut expected: Vec<String> = (1..=20).map(|n: u32| n.to_string()).collect();
    expected.push("boom".to_owned());
    expected.sort();
    assert_eq!(processed, expected, "each message processed once");
    shutdown.cancel();
    consuming.await.unwrap().unwrap();
    let channel = services.connection().create_channel().await.unwrap();
    assert_eq!(queue_depth(&channel, &Canary::queue().queue()).await, 0);
}

/// Acks go out in runs, and a run cannot pass a delivery still being processed. CI caught a
/// webhook to a partner that never answered holding the deferred deliveries behind it until
/// they took the whole prefetch. Now the held ones are acked one by one past a quarter of the
/// prefetch (2 of 8 here): 40 messages behind a delivery that never finishes all flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_delivery_does_not_hold_the_prefetch_of_the_ones_behind_it() {
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let processor = Arc::new(Recorder::new("slow", OnSpecial::HoldUntilReleased));
    let (shutdown, consuming) = consume_in_background(&services, processor.clone(), 8);
    publish_first_then_numbered(&services, "slow", 40).await;

    let the_rest_flowed = eventually(Duration::from_secs(20), || async {
        processor.processed.lock().unwrap().len() == 40
    })
    .await;
    let behind = processor.processed.lock().unwrap().clone();
    processor.release.cancel();
    let slow_done = eventually(Duration::from_secs(10), || async {
        processor.processed.lock().unwrap().len() == 41
    })
    .await;
    shutdown.cancel();
    consuming.await.unwrap().unwrap();

    assert!(
        the_rest_flowed,
        "only {} of the 40 behind the slow delivery were processed while it was held",
        behind.len()
    );
    assert!(
        !behind.contains(&"slow".to_owned()),
        "the slow one was still held"
    );
    assert!(slow_done, "the slow one finished once released");
    let channel = services.connection().create_channel().await.unwrap();
    assert_eq!(
        queue_depth(&channel, &Canary::queue().queue()).await,
        0,
        "every delivery acked, none requeued"
    );
}

async fn dead_letter_rows(env: &TestEnv) -> Vec<(String, String, String, String)> {
    sqlx::query_as(
        "SELECT function_name, reason, error, COALESCE(headers, '') FROM dead_letters ORDER BY id",
    )
    .fetch_all(&env.db)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_message_is_dead_lettered_at_once_and_the_rest_flow() {
    let counts = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let ids = insert_pings(&env, 20).await;
    let (stop, run) = start_runner(&services, &counts);

    publish_raw(&services, "canary.ping", b"{not json").await;
    publish_raw(
        &services,
        "canary.ping",
        br#"{"id":"0191d7d6-3a5e-7c39-9a55-3c1b8e1f0d2a","type":"canary.ping","occurred_at":"2026-11-30T00:00:00Z","correlation_id":"0191d7d6-3a5e-7c39-9a55-3c1b8e1f0d2a","data":{"ping_id":"seven"}}"#,
    )
    .await;
    for &ping_id in &ids {
        let outgoing = Envelope::new(Ping { ping_id }).to_outgoing().unwrap();
        services.publisher().publish_event(&outgoing).await.unwrap();
    }

    let recorded = eventually(Duration::from_secs(30), || async {
        dead_letter_rows(&env).await.len() == 2
            && scalar(
                &env.db,
                "SELECT COUNT(*) FROM canary_pings WHERE status = 'PONGED'",
            )
            .await
                == 20
    })
    .await;
    stop_runner(stop, run).await;

    assert!(recorded, "dead letters: {:?}", dead_letter_rows(&env).await);
    for (function, reason, error, _) in dead_letter_rows(&env).await {
        assert_eq!(function, "canary");
        assert_eq!(reason, "malformed");
        assert!(!error.is_empty());
    }
    // Dead-lettered at once: one delivery each, no requeue.
    assert_eq!(counts.count("requeued"), 0);
    assert_eq!(counts.count("malformed"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_outcome_makes_exactly_one_dead_letter_with_all_headers() {
    let counts = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let (stop, run) = start_runner(&services, &counts);
    let envelope = Envelope::new(Ping { ping_id: 424_242 });
    let outgoing = envelope.to_outgoing().unwrap();
    // Delivered twice: still one dead letter per delivery decision, each recorded once.
    services.publisher().publish_event(&outgoing).await.unwrap();

    let recorded = eventually(Duration::from_secs(30), || async {
        dead_letter_rows(&env).await.len() == 1
    })
    .await;
    // Give the recorder time to (wrongly) record more.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_runner(stop, run).await;

    assert!(recorded);
    let rows = dead_letter_rows(&env).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (function, reason, error, headers) = &rows[0];
    assert_eq!((function.as_str(), reason.as_str()), ("canary", "failed"));
    assert!(error.contains("424242 does not exist"), "{error}");
    let headers: serde_json::Value = serde_json::from_str(headers).unwrap();
    for name in [
        "x-paybus-function",
        "x-paybus-reason",
        "x-paybus-error",
        "x-paybus-attempts",
        "x-paybus-failed-at",
        "x-paybus-routing-key",
        "x-paybus-dead-letter-id",
    ] {
        assert!(
            headers.to_string().contains(name),
            "{name} missing in {headers}"
        );
    }
    let message_id: String = sqlx::query_scalar("SELECT message_id FROM dead_letters")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(message_id, envelope.id.to_string());
}

#[tokio::test]
async fn work_that_failed_outside_a_delivery_is_recorded_in_the_callers_transaction_and_counted() {
    let env = TestEnv::new().await;
    let envelope = Envelope::new(Ping { ping_id: 77 });
    let message = envelope.to_outgoing().unwrap();

    // Rolled back with the caller's transaction: nothing recorded.
    let mut tx = env.db.begin().await.unwrap();
    assert!(
        dead_letter::record_unsent(&mut tx, "canary", &message, "gave up", 5)
            .await
            .unwrap()
    );
    tx.rollback().await.unwrap();
    assert!(dead_letter_rows(&env).await.is_empty());

    // Committed with it: one letter, like a handler's `Failed`; the same work failing again is
    // the same letter, counted twice.
    let mut tx = env.db.begin().await.unwrap();
    for _ in 0..2 {
        assert!(
            dead_letter::record_unsent(&mut tx, "canary", &message, "gave up", 5)
                .await
                .unwrap()
        );
    }
    tx.commit().await.unwrap();

    let rows = dead_letter_rows(&env).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        scalar(&env.db, "SELECT CAST(failures AS SIGNED) FROM dead_letters").await,
        2
    );
    let (function, reason, error, headers) = &rows[0];
    assert_eq!(
        (function.as_str(), reason.as_str(), error.as_str()),
        ("canary", "failed", "gave up")
    );
    let headers: serde_json::Value = serde_json::from_str(headers).unwrap();
    assert_eq!(headers["x-paybus-routing-key"], "canary.ping");
    assert_eq!(headers["x-paybus-attempts"], 5);
    let (message_id, body): (String, Vec<u8>) =
        sqlx::query_as("SELECT message_id, body FROM dead_letters")
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!(message_id, envelope.id.to_string());
    // The body is the message a replay would publish.
    let replayed: Envelope<Ping> = serde_json::from_slice(&body).unwrap();
    assert_eq!(replayed.data.ping_id, 77);
}

/// The letter's (failures, status, reopened) as stored.
async fn letter_state(env: &TestEnv) -> Vec<(i64, String, bool)> {
    sqlx::query_as(
        "SELECT CAST(failures AS SIGNED), status, reopened_at IS NOT NULL FROM dead_letters",
    )
    .fetch_all(&env.db)
    .await
    .unwrap()
}

/// Publishes onto canary's DLQ what the runtime publishes there for one failure of `body`,
/// stamped `failure_id`.
async fn dead_letter_again(services: &Services, body: &[u8], letter: &str, failure_id: &str) {
    let mut headers = lapin::types::FieldTable::default();
    for (name, value) in [
        (dead_letter::H_FUNCTION, "canary"),
        (dead_letter::H_REASON, "malformed"),
        (dead_letter::H_ERROR, "not an envelope"),
        (dead_letter::H_DEAD_LETTER_ID, letter),
        (dead_letter::H_FAILURE_ID, failure_id),
    ] {
        headers.insert(
            name.into(),
            lapin::types::AMQPValue::LongString(value.into()),
        );
    }
    services
        .publisher()
        .publish_raw(
            topology::DEAD_LETTER_EXCHANGE,
            "canary",
            body,
            BasicProperties::default()
                .with_delivery_mode(2)
                .with_headers(headers),
        )
        .await
        .expect("publish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_failure_counts_and_one_after_archiving_reopens_its_letter() {
    let counts = CanaryCounts::take().await;
    // The defect: identical bytes without a message id were one letter recorded once (INSERT
    // IGNORE on a key of their hash), so two failures read as one, and after ops archived the
    // group a third made no letter at all.
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let (stop, run) = start_runner(&services, &counts);
    let body = b"{not json";

    publish_raw(&services, "canary.ping", body).await;
    publish_raw(&services, "canary.ping", body).await;
    let counted = eventually(Duration::from_secs(30), || async {
        letter_state(&env).await == [(2, "NEW".to_owned(), false)]
    })
    .await;
    assert!(counted, "{:?}", letter_state(&env).await);

    let letter: u64 = sqlx::query_scalar("SELECT id FROM dead_letters")
        .fetch_one(&env.db)
        .await
        .unwrap();
    let archived = {
        use paybus_dead_letter_ops::{OperationAction, Selection, Triager, operation};
        let triager = Triager::new(&[]);
        let requested = operation::request(
            &services.pool,
            &triager,
            OperationAction::Archive,
            &Selection::Ids(vec![letter]),
            &paybus_testkit::person("alice"),
            10,
            &paybus_ops::approvals::FourEyes::off(),
        )
        .await
        .unwrap();
        operation::execute(
            &services.outbox,
            &triager,
            requested.operation.id,
            &paybus_testkit::person("alice"),
            paybus_dead_letter_ops::ExecuteOptions::default(),
            |_| {},
        )
        .await
        .unwrap()
    };
    assert_eq!(archived.archived, 1);
    assert_eq!(
        letter_state(&env).await,
        [(2, "ARCHIVED".to_owned(), false)]
    );

    publish_raw(&services, "canary.ping", body).await;
    let reopened = eventually(Duration::from_secs(30), || async {
        letter_state(&env).await == [(3, "NEW".to_owned(), true)]
    })
    .await;
    assert!(reopened, "{:?}", letter_state(&env).await);

    // The DLQ handing the recorder the same dead letter again (a crash before its ack) is not
    // a failure; the one behind it, with an id of its own, is.
    let (dead_letter_id, failure_id): (String, String) = sqlx::query_as(
        "SELECT dead_letter_id, failure_id FROM dead_letter_failures \
         ORDER BY failed_at DESC, failure_id LIMIT 1",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    dead_letter_again(&services, body, &dead_letter_id, &failure_id).await;
    dead_letter_again(&services, body, &dead_letter_id, "a-later-failure").await;
    let recorded_in_order = eventually(Duration::from_secs(30), || async {
        scalar(&env.db, "SELECT COUNT(*) FROM dead_letter_failures").await == 4
    })
    .await;
    // Time for the duplicate, had it been taken for a failure, to be counted too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_runner(stop, run).await;
    assert!(recorded_in_order);
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM dead_letter_failures").await,
        4
    );
    assert_eq!(letter_state(&env).await, [(4, "NEW".to_owned(), true)]);
    // Its group's counts followed it through the archive and the reopening.
    let mut tx = env.db.begin().await.unwrap();
    let counts = dead_letter::group_counts::read(&mut tx).await.unwrap();
    assert_eq!(
        dead_letter::group_counts::drifted(&mut tx).await.unwrap(),
        []
    );
    tx.commit().await.unwrap();
    assert_eq!(
        counts
            .iter()
            .map(|group| (group.letters, group.failures))
            .collect::<Vec<_>>(),
        [(1, 4)]
    );
}

async fn publish_pings(services: &Services, ids: &[u64]) {
    for &ping_id in ids {
        let outgoing = Envelope::new(Ping { ping_id }).to_outgoing().unwrap();
        services.publisher().publish_event(&outgoing).await.unwrap();
    }
}

async fn ponged(env: &TestEnv) -> i64 {
    scalar(
        &env.db,
        "SELECT COUNT(*) FROM canary_pings WHERE status = 'PONGED'",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_function_takes_nothing_keeps_its_queue_and_drains_it_once_on_resume() {
    let counts = CanaryCounts::take().await;
    // Longer than a pause takes to reach every consumer (one read a second).
    let settle = pauses::POLL_INTERVAL * 3;
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let channel = tap(&services, "test.tap").await;
    let mut conn = env.db.acquire().await.unwrap();

    // Paused before the process starts: not one delivery is taken.
    assert!(
        pauses::pause(
            &mut conn,
            "canary",
            &paybus_testkit::person("alice"),
            "maintenance"
        )
        .await
        .unwrap()
    );
    let (stop, run) = start_runner(&services, &counts);
    let before = insert_pings(&env, 20).await;
    publish_pings(&services, &before).await;
    tokio::time::sleep(settle).await;
    assert_eq!(ponged(&env).await, 0);
    assert_eq!(queue_depth(&channel, "paybus.canary").await, 20);

    assert!(
        pauses::resume(&mut conn, "canary", &paybus_testkit::person("alice"))
            .await
            .unwrap()
    );
    let drained = eventually(Duration::from_secs(30), || async {
        ponged(&env).await == 20
    })
    .await;
    assert!(drained);

    // Paused while consuming: it stops within the settle time and keeps what arrives.
    pauses::pause(
        &mut conn,
        "canary",
        &paybus_testkit::person("alice"),
        "again",
    )
    .await
    .unwrap();
    tokio::time::sleep(settle).await;
    let during = insert_pings(&env, 30).await;
    publish_pings(&services, &during).await;
    tokio::time::sleep(settle).await;
    assert_eq!(ponged(&env).await, 20);
    assert_eq!(queue_depth(&channel, "paybus.canary").await, 30);
    // A pause already there is not a second one.
    assert!(
        !pauses::pause(&mut conn, "canary", &paybus_testkit::person("bob"), "too")
            .await
            .unwrap()
    );

    pauses::resume(&mut conn, "canary", &paybus_testkit::person("alice"))
        .await
        .unwrap();
    let drained = eventually(Duration::from_secs(30), || async {
        ponged(&env).await == 50
    })
    .await;
    stop_runner(stop, run).await;
    assert!(drained);
    // Each once: nothing was lost or taken twice by the pauses.
    assert_eq!(
        scalar(
            &env.db,
            "SELECT CAST(SUM(pongs) AS SIGNED) FROM canary_pings"
        )
        .await,
        50
    );
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM dead_letters").await,
        0
    );
}

fn settings_on(env: &TestEnv, broker: &PrivateBroker) -> Settings {
    let mut settings = env.settings.clone();
    settings.broker.url = broker.url.clone();
    settings
}

/// A consumer and a publisher on one link, fed 300 pings through the outbox 10 ms apart while
/// `interrupt` takes the broker node they are connected to away (restarts it, kills it...)
/// after 800 ms. Returns how many were sent.
async fn ping_through_an_interruption(
    services: &Services,
    interrupt: impl FnOnce() -> tokio::task::JoinHandle<()>,
) -> u64 {
    let producer_services = services.clone();
    let producer = tokio::spawn(async move {
        let mut sent = 0u64;
        for _ in 0..300 {
            // Through the outbox: a commit is a promise, whatever the broker does.
            if send_ping(&producer_services.outbox).await.is_ok() {
                sent += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        sent
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Bounds that name the stage that hangs (a CI run was killed at 600 s in a test built on
    // this, with no output): the interruption's scripts bound their own waits (at most about
    // two and a half minutes for a broker's stop and start), and 300 pings take seconds.
    tokio::time::timeout(Duration::from_secs(240), interrupt())
        .await
        .expect("the interruption ends within 240 s")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(120), producer)
        .await
        .expect("the producer's 300 pings end within 120 s of the interruption")
        .unwrap()
}

/// Every ping ponged, each once.
async fn assert_every_ping_ponged_once(env: &TestEnv, sent: u64) {
    let all_ponged = eventually(Duration::from_secs(120), || async {
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM canary_pings WHERE status = 'PONGED'",
        )
        .await
            == i64::try_from(sent).unwrap()
    })
    .await;
    assert!(
        all_ponged,
        "ponged {} of {sent}",
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM canary_pings WHERE status = 'PONGED'"
        )
        .await
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT CAST(SUM(pongs) AS SIGNED) FROM canary_pings"
        )
        .await,
        i64::try_from(sent).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_committed_while_the_broker_is_down_are_all_delivered_after_it_returns() {
    let env = TestEnv::new().await;
    let broker = tokio::task::spawn_blocking(PrivateBroker::start)
        .await
        .unwrap();
    let services = services_on(&settings_on(&env, &broker), &[Canary::queue()]).await;
    let channel = tap(&services, "test.tap").await;
    let broker = Arc::new(broker);

    let down = broker.clone();
    tokio::task::spawn_blocking(move || down.stop())
        .await
        .unwrap();
    let mut committed = 0;
    for _ in 0..200 {
        send_ping(&services.outbox)
            .await
            .expect("the database still takes work");
        committed += 1;
    }
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM outbox_messages WHERE published_at IS NULL"
        )
        .await,
        committed
    );
    let up = broker.clone();
    tokio::task::spawn_blocking(move || up.start_again())
        .await
        .unwrap();

    let relay = relay(&services);
    let drained = eventually(Duration::from_secs(60), || async {
        let _ = relay.run_once().await;
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM outbox_messages WHERE published_at IS NULL",
        )
        .await
            == 0
    })
    .await;
    assert!(
        drained,
        "relay did not drain the outbox after the broker returned"
    );
    // The tap queue was declared before the restart and survives it; the channel does not:
    // take one on the connection the link re-established.
    drop(channel);
    let channel = services.connection().create_channel().await.unwrap();
    let count = queue_depth(&channel, "test.tap").await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            queue_depth(&channel, "test.tap").await == 200
        })
        .await,
        "broker holds {count}, expected 200"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_restart_mid_stream_loses_nothing_and_processing_resumes() {
    let counts = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    let broker = Arc::new(
        tokio::task::spawn_blocking(PrivateBroker::start)
            .await
            .unwrap(),
    );
    let services = services_on(&settings_on(&env, &broker), &[Canary::queue()]).await;
    let (stop, run) = start_runner(&services, &counts);

    // A clone: the last handle's drop removes the broker, which must outlive the restart.
    let restart = broker.clone();
    let sent = ping_through_an_interruption(&services, move || {
        tokio::task::spawn_blocking(move || {
            restart.stop();
            restart.start_again();
        })
    })
    .await;

    assert_every_ping_ponged_once(&env, sent).await;
    stop_runner(stop, run).await;
    assert_eq!(sent, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_outage_delays_processing_and_nothing_is_lost_or_doubled() {
    let counts = CanaryCounts::take().await;
    // The broker namespace of a TestEnv, the database of a private server we can stop.
    let env = TestEnv::new().await;
    let database = Arc::new(
        tokio::task::spawn_blocking(PrivateService::start_mariadb)
            .await
            .unwrap(),
    );
    let mut settings = env.settings.clone();
    settings.database.url = database.url.clone();
    settings.database.acquire_timeout = Duration::from_secs(2);
    let services = services_on(&settings, &[Canary::queue()]).await;
    paybus_runtime::migrations::apply(&services.pool)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..100 {
        ids.push(
            sqlx::query("INSERT INTO canary_pings () VALUES ()")
                .execute(&services.pool)
                .await
                .unwrap()
                .last_insert_id(),
        );
    }
    let (stop, run) = start_runner(&services, &counts);
    // Consuming before the outage (a runner starts its consumers once it has read the
    // pauses, which needs the database).
    let warm_up = sqlx::query("INSERT INTO canary_pings () VALUES ()")
        .execute(&services.pool)
        .await
        .unwrap()
        .last_insert_id();
    publish_pings(&services, &[warm_up]).await;
    let consuming = eventually(Duration::from_secs(30), || async {
        scalar(
            &services.pool,
            "SELECT COUNT(*) FROM canary_pings WHERE status = 'PONGED'",
        )
        .await
            == 1
    })
    .await;
    assert!(consuming);

    let down = database.clone();
    tokio::task::spawn_blocking(move || down.stop())
        .await
        .unwrap();
    let messages: Vec<_> = ids
        .iter()
        .map(|&ping_id| Envelope::new(Ping { ping_id }).to_outgoing().unwrap())
        .collect();
    for result in services.publisher().publish_events(&messages).await {
        result.expect("the broker still takes messages");
    }
    // Let every delivery fail against the dead database at least once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let requeued_while_down = counts.count("requeued");
    let up = database.clone();
    tokio::task::spawn_blocking(move || up.start_again())
        .await
        .unwrap();

    let pool = services.pool.clone();
    let ponged = |pool: sqlx::MySqlPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM canary_pings WHERE status = 'PONGED'")
            .fetch_one(&pool)
            .await
            .unwrap_or(-1)
    };
    let done = eventually(Duration::from_secs(90), || async {
        ponged(pool.clone()).await == 101
    })
    .await;
    stop_runner(stop, run).await;

    assert!(requeued_while_down > 0, "no delivery met the outage");
    assert!(done, "ponged {} of 101", ponged(pool.clone()).await);
    let pongs: i64 = sqlx::query_scalar("SELECT CAST(SUM(pongs) AS SIGNED) FROM canary_pings")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(pongs, 101);
    let dead: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dead, 0, "an outage is a delay, not a failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_no_function_binds_becomes_an_unroutable_dead_letter() {
    let counts = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let (stop, running) = start_runner(&services, &counts);
    let body = Envelope::new(Ping { ping_id: 7 }).to_outgoing().unwrap();

    // Not `mandatory`: the broker would have dropped it without the alternate exchange.
    services
        .publisher()
        .publish_raw(
            topology::EVENTS_EXCHANGE,
            "nobody.listens.here",
            &body.body,
            BasicProperties::default()
                .with_message_id(body.id.to_string().as_str().into())
                .with_delivery_mode(2),
        )
        .await
        .expect("the alternate exchange takes it");
    let recorded = eventually(Duration::from_secs(20), || async {
        scalar(&env.db, "SELECT COUNT(*) FROM dead_letters").await == 1
    })
    .await;
    stop.cancel();
    running.await.unwrap();

    assert!(recorded, "the unroutable message must become a dead letter");
    let row: (String, String, String, String, Option<String>) = sqlx::query_as(
        "SELECT function_name, reason, routing_key, error, message_id FROM dead_letters",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(
        row,
        (
            "unrouted".to_owned(),
            "unroutable".to_owned(),
            "nobody.listens.here".to_owned(),
            "no queue is bound for routing key \"nobody.listens.here\" on paybus.events".to_owned(),
            Some(body.id.to_string()),
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_events_exchange_declared_before_the_alternate_exchange_is_upgraded() {
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[]).await;
    // What an earlier paybus declared: the events exchange without arguments.
    let channel = services.connection().create_channel().await.unwrap();
    channel
        .exchange_delete(topology::EVENTS_EXCHANGE.into(), Default::default())
        .await
        .unwrap();
    channel
        .exchange_declare(
            topology::EVENTS_EXCHANGE.into(),
            lapin::ExchangeKind::Topic,
            lapin::options::ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();

    services
        .declare_topology(&[Canary::queue()])
        .await
        .expect("the old exchange is upgraded, not a startup failure");

    let channel = tap(&services, "test.tap").await;
    let returned = services
        .publisher()
        .publish_raw(
            topology::EVENTS_EXCHANGE,
            "nobody.listens.here",
            b"{}",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await;
    assert!(
        returned.is_ok(),
        "routed to the alternate exchange: {returned:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            queue_depth(&channel, topology::UNROUTED_QUEUE).await == 1
        })
        .await
    );
}

#[tokio::test]
async fn dead_letter_headers_stored_by_an_earlier_paybus_are_rewritten_readable() {
    let env = TestEnv::new().await;
    let legacy = r#"{"x-paybus-reason":{"LongString":[102,97,105,108,101,100]},"x-paybus-attempts":{"LongLongInt":3}}"#;
    sqlx::query(
        "INSERT INTO dead_letters (dead_letter_id, function_name, routing_key, reason, error, \
         body, headers) VALUES ('legacy', 'canary', 'canary.ping', 'failed', 'x', '', ?)",
    )
    .bind(legacy)
    .execute(&env.db)
    .await
    .unwrap();

    paybus_runtime::migrations::apply(&env.db).await.unwrap();
    paybus_runtime::migrations::apply(&env.db).await.unwrap();

    let headers: String = sqlx::query_scalar("SELECT headers FROM dead_letters")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&headers).unwrap(),
        serde_json::json!({"x-paybus-reason": "failed", "x-paybus-attempts": 3})
    );
    let reason: String = sqlx::query_scalar(
        "SELECT JSON_UNQUOTE(JSON_EXTRACT(headers, '$.\"x-paybus-reason\"')) FROM dead_letters",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(reason, "failed", "queryable with plain SQL");
}

// ---- Failover between broker nodes (PAYBUS_AMQP_URL listing several) ----

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_url_that_refuses_connections_is_skipped_for_the_next() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    let mut dead = env.settings.broker.url.clone();
    dead.set_port(Some(paybus_testkit::free_port())).unwrap();
    settings.broker.url = dead;
    settings.broker.failover_urls = vec![env.settings.broker.url.clone()];

    let services = services_on(&settings, &[Canary::queue()]).await;

    assert_eq!(services.link.node(), 1, "connected to the second URL");
    let channel = tap(&services, "test.tap").await;
    send_ping(&services.outbox).await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            queue_depth(&channel, "test.tap").await == 1
        })
        .await
    );
}

/// The test broker as two nodes, each URL through a relay of its own, the first the one
/// connected to.
async fn two_relayed_nodes(env: &TestEnv) -> (Arc<TcpRelay>, Arc<TcpRelay>, Services) {
    let first = TcpRelay::to(&env.settings.broker.url).await;
    let second = TcpRelay::to(&env.settings.broker.url).await;
    let mut settings = env.settings.clone();
    settings.broker.url = first.url(&env.settings.broker.url);
    settings.broker.failover_urls = vec![second.url(&env.settings.broker.url)];
    let services = services_on(&settings, &[Canary::queue()]).await;
    (first, second, services)
}

/// Two URLs in front of the shared test broker, each through a relay of its own: cutting the
/// first relay is, from the client's side, its node going away (the socket closes, the port
/// refuses). The fast proof of the failover path, next to the real node kill below.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_consumer_and_publisher_move_to_the_next_url_when_their_node_goes_away() {
    let counts = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    // The second relay is kept: dropping it would cut it.
    let (first, _second, services) = two_relayed_nodes(&env).await;
    assert_eq!(services.link.node(), 0);
    let (stop, run) = start_runner(&services, &counts);

    let sent =
        ping_through_an_interruption(&services, || tokio::spawn(async move { first.cut() })).await;

    assert_every_ping_ponged_once(&env, sent).await;
    assert_eq!(services.link.node(), 1, "the link moved to the second URL");
    stop_runner(stop, run).await;
    assert_eq!(sent, 300);
}

/// The node goes silent instead (a partition, a hung host: the connection stays open and
/// nothing crosses it). Only the heartbeat tells, and the link asks for one of 10 s
/// (`broker::DEFAULT_HEARTBEAT_SECONDS`): lapin gives up on the connection after two
/// intervals, and the link moves on. With RabbitMQ's own 60 s that took two minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_consumer_and_publisher_leave_a_silent_node_within_two_heartbeats() {
    let counts = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    // The second relay is kept: dropping it would cut it.
    let (first, _second, services) = two_relayed_nodes(&env).await;
    let (stop, run) = start_runner(&services, &counts);

    let stalled = first.clone();
    let sent = ping_through_an_interruption(&services, move || {
        tokio::spawn(async move { stalled.stall() })
    })
    .await;
    let moved = eventually(Duration::from_secs(40), || async {
        services.link.node() == 1
    })
    .await;

    assert!(moved, "the link left the silent node within 40 s");
    assert_every_ping_ponged_once(&env, sent).await;
    stop_runner(stop, run).await;
    assert_eq!(sent, 300);
}

/// What the broker refuses is no outage: a runner whose queue exists with other arguments (a
/// classic queue where the topology declares a quorum one) stops at once, naming it, instead
/// of waiting for a link that has nothing to replace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_whose_queue_exists_with_other_arguments_stops_at_once() {
    let _turn = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[]).await;
    let channel = services.connection().create_channel().await.unwrap();
    channel
        .queue_declare(
            Canary::queue().queue().as_str().into(),
            lapin::options::QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let mut runner = Runner::new(services.clone());
    runner.add_function(Canary);

    let ran = tokio::time::timeout(
        Duration::from_secs(20),
        runner.run(CancellationToken::new()),
    )
    .await
    .expect("the runner stops by itself");

    let error = ran.expect_err("a queue with other arguments stops the runner");
    assert!(format!("{error:?}").contains("PRECONDITION"), "{error:?}");
}

/// The node goes silent before the runner's first subscriptions are made (a loaded machine
/// once took that long, and the runner stopped, reading the lost connection as a queue that
/// does not exist): the consumers wait for the link, which leaves the node, and consume on
/// the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_gone_silent_before_the_first_subscription_is_left_and_consuming_starts_on_the_next()
{
    let counts = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    // The second relay is kept: dropping it would cut it.
    let (first, _second, services) = two_relayed_nodes(&env).await;
    first.stall();
    let (stop, run) = start_runner(&services, &counts);

    let sent = ping_through_an_interruption(&services, || tokio::spawn(async {})).await;
    let moved = eventually(Duration::from_secs(60), || async {
        services.link.node() == 1
    })
    .await;

    assert!(moved, "the link left the silent node within 60 s");
    assert_every_ping_ponged_once(&env, sent).await;
    assert!(!run.is_finished(), "the runner stopped by itself");
    stop_runner(stop, run).await;
}

/// A broker that took the connection and went silent (a partition, a hung host: nothing is
/// reset or closed, no reply comes) answers nothing, and lapin waits for a reply for as long as
/// the connection lives: until its heartbeat fails. These stops must not wait for that.
async fn relayed_services(env: &TestEnv) -> (Arc<TcpRelay>, Services) {
    let node = TcpRelay::to(&env.settings.broker.url).await;
    let mut settings = env.settings.clone();
    settings.broker.url = node.url(&env.settings.broker.url);
    let services = services_on(&settings, &[Canary::queue()]).await;
    (node, services)
}

/// How long a stop may take on a silent node: each running consumer's cancel and close wait
/// 5 s at most (they were 30 s each, and a subscription or the start-up's topology waited for
/// good or for minutes).
const STOP_ON_A_SILENT_NODE: Duration = Duration::from_secs(15);

async fn assert_stops_despite_the_silent_node(
    stop: CancellationToken,
    run: tokio::task::JoinHandle<()>,
) {
    stop.cancel();
    let stopped = tokio::time::timeout(STOP_ON_A_SILENT_NODE, run).await;
    assert!(
        stopped.is_ok(),
        "the runner did not stop within {STOP_ON_A_SILENT_NODE:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_during_start_up_does_not_wait_on_a_silent_broker() {
    let counts = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    let (node, services) = relayed_services(&env).await;
    node.stall();
    let (stop, run) = start_runner(&services, &counts);
    // Time for the runner to send its topology, which the silent node never answers.
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert_stops_despite_the_silent_node(stop, run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_does_not_wait_on_a_subscription_to_a_silent_node() {
    let counts = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    let (node, services) = relayed_services(&env).await;
    let mut conn = env.db.acquire().await.unwrap();
    pauses::pause(
        &mut conn,
        "canary",
        &paybus_testkit::person("alice"),
        "the node is about to go silent",
    )
    .await
    .unwrap();
    let (stop, run) = start_runner(&services, &counts);
    // Started: the canary's dead-letter recorder consumes, the canary itself waits paused.
    let recorder_consuming = eventually(Duration::from_secs(10), || async {
        queue_state(&services, &Canary::queue().dead_letter_queue())
            .await
            .is_some_and(|(_, consumers)| consumers == 1)
    })
    .await;
    assert!(recorder_consuming, "the dead-letter recorder consumes");
    node.stall();
    pauses::resume(&mut conn, "canary", &paybus_testkit::person("alice"))
        .await
        .unwrap();
    // The pauses are read every second; then the canary asks for its channel.
    tokio::time::sleep(pauses::POLL_INTERVAL * 2).await;

    assert_stops_despite_the_silent_node(stop, run).await;
}

/// The real thing: a RabbitMQ cluster of three nodes of the test's own, the canary's quorum
/// queue replicated on all three, and the node that the consumer and the publisher are
/// connected to SIGKILLed mid-stream. The link moves to another node, the quorum queue elects
/// a leader among the two left, and every ping is ponged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_and_publisher_keep_working_when_their_cluster_node_is_killed() {
    let counts = CanaryCounts::take().await;
    let env = TestEnv::new().await;
    let cluster = Arc::new(
        tokio::task::spawn_blocking(PrivateCluster::start)
            .await
            .unwrap(),
    );
    let mut settings = env.settings.clone();
    settings.broker = cluster.broker_settings(&env.settings.broker, 1);
    let services = services_on(&settings, &[Canary::queue()]).await;
    assert_eq!(services.link.node(), 0, "connected to node 1");
    let (stop, run) = start_runner(&services, &counts);

    let killed = cluster.clone();
    let sent = ping_through_an_interruption(&services, move || {
        tokio::task::spawn_blocking(move || killed.kill_node(1))
    })
    .await;

    assert_every_ping_ponged_once(&env, sent).await;
    assert_ne!(services.link.node(), 0, "the link left the killed node");
    stop_runner(stop, run).await;
    assert_eq!(sent, 300);
}

/// The canary's message as a newer release would define it: the same type, a field the
/// release before does not know, and version 2.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct PingV2 {
    ping_id: u64,
    #[serde(default)]
    reason: Option<String>,
}

impl Message for PingV2 {
    const TYPE: &'static str = Ping::TYPE;
    const VERSION: u16 = 2;

    fn shard_key(&self) -> Option<String> {
        Some(self.ping_id.to_string())
    }
}

/// The canary of that newer release: it reads version 2 and the version before.
struct CanaryV2;

impl Handler for CanaryV2 {
    type Message = PingV2;
    const FUNCTION: &'static str = Canary::FUNCTION;

    async fn handle(
        &self,
        message: Envelope<PingV2>,
        ctx: &paybus_bus::Context<'_>,
    ) -> Result<paybus_bus::Outcome, paybus_bus::HandlerError> {
        let ping = Envelope {
            id: message.id,
            kind: message.kind,
            version: message.version,
            occurred_at: message.occurred_at,
            correlation_id: message.correlation_id,
            shard_key: message.shard_key,
            data: Ping {
                ping_id: message.data.ping_id,
            },
        };
        Canary.handle(ping, ctx).await
    }
}

async fn ping_status(env: &TestEnv, ping_id: u64) -> (String, i64) {
    sqlx::query_as("SELECT status, CAST(pongs AS SIGNED) FROM canary_pings WHERE id = ?")
        .bind(ping_id)
        .fetch_one(&env.db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_newer_than_its_consumer_is_held_not_dead_lettered_and_the_newer_release_handles_it_once()
 {
    use paybus_bus::held::Known;
    use paybus_maintenance::{HeldRelease, Job};

    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let turn = CanaryCounts::take().await;
    let [newer, older] = insert_pings(&env, 2).await[..] else {
        unreachable!()
    };
    let send = |envelope: Vec<u8>| {
        let services = services.clone();
        async move { publish_raw(&services, Ping::TYPE, &envelope).await }
    };

    // The release before (the canary reads version 1) meets a version 2 message.
    let (shutdown, run) = start_runner(&services, &turn);
    let v2 = Envelope::new(PingV2 {
        ping_id: newer,
        reason: Some("sent by the new release".to_owned()),
    });
    assert_eq!(v2.version, 2);
    send(serde_json::to_vec(&v2).unwrap()).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            scalar(&env.db, "SELECT COUNT(*) FROM held_messages").await == 1
        })
        .await,
        "the old consumer holds the newer message"
    );
    let channel = services.connection().create_channel().await.unwrap();
    assert_eq!(
        queue_depth(&channel, &Canary::queue().queue()).await,
        0,
        "acked"
    );
    assert_eq!(ping_status(&env, newer).await, ("PENDING".to_owned(), 0));
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM dead_letters").await,
        0
    );
    // A process of the release before does not release what it cannot read.
    let old_release = HeldRelease::new(
        services.outbox.clone(),
        vec![Known {
            function: Canary::FUNCTION,
            version: Ping::VERSION,
        }],
    );
    assert_eq!(old_release.run_once().await.unwrap().changed, 0);
    stop_runner(shutdown, run).await;

    // The newer release: its consumer, and its release of the held messages.
    let shutdown = CancellationToken::new();
    let mut runner = Runner::new(services.clone());
    runner.add_function(CanaryV2);
    let token = shutdown.clone();
    let run = tokio::spawn(async move { runner.run(token).await.expect("runner") });
    let new_release = HeldRelease::new(
        services.outbox.clone(),
        vec![Known {
            function: CanaryV2::FUNCTION,
            version: PingV2::VERSION,
        }],
    );
    assert_eq!(new_release.run_once().await.unwrap().changed, 1);
    assert_eq!(
        new_release.run_once().await.unwrap().changed,
        0,
        "released once"
    );
    // It still reads the version before.
    send(serde_json::to_vec(&Envelope::new(Ping { ping_id: older })).unwrap()).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            ping_status(&env, newer).await.0 == "PONGED"
                && ping_status(&env, older).await.0 == "PONGED"
        })
        .await,
        "the newer release handles the held message and the older one"
    );
    stop_runner(shutdown, run).await;
    assert_eq!(ping_status(&env, newer).await, ("PONGED".to_owned(), 1));
    assert_eq!(ping_status(&env, older).await, ("PONGED".to_owned(), 1));
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM held_messages WHERE released_at IS NULL"
        )
        .await,
        0
    );
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM dead_letters").await,
        0
    );
    assert_eq!(turn.count("held"), 1);
}
