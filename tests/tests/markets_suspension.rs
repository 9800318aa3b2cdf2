//! W4 acceptance (seed 004) against the real services: the HTTP API on a port of its own, the
//! cancel-orders consumer with its jobs, MariaDB and RabbitMQ.
//!
//! The seed's incident: suspending a market with 8,000 open orders cancelled them inside the
//! request, which timed out with half of them cancelled. Here the request blocks placement and
//! freezes the set in one short transaction; tasks and cancels follow, visibly, resumably.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use paybus_api::{ApiConfig, AppState, role::Role};
use paybus_bus::{Handler, Services};
use paybus_cancel_orders::{CancelConfig, CancelOrders, due_tasks};
use paybus_config::Secret;
use paybus_maintenance::DueSweepConfig;
use paybus_markets::{
    materialise::{Materialiser, MaterialiserConfig},
    progress,
};
use paybus_retry::RetryPolicy;
use paybus_runtime::runner::Runner;
use paybus_testkit::{
    TestEnv, eventually,
    markets::{assert_audit_clean, market, open_orders, orders_in, refuse_cancels_of},
    scalar,
};
use serde_json::{Value, json};
use sqlx::MySqlPool;
use tokio::{sync::Barrier, task::JoinSet};
use tokio_util::sync::CancellationToken;

const ADMIN_SECRET: &str = "w4-acceptance-admin-secret-0123456789";

/// The API on 127.0.0.1:<free port>, and a client with an ADMIN token.
struct Api {
    base: String,
    http: reqwest::Client,
    token: String,
    shutdown: CancellationToken,
}

impl Api {
    async fn start(services: &Services) -> Self {
        // One ADMIN drives the suspension tests: four-eyes has its own (api/tests/approvals.rs).
        let config = ApiConfig {
            admin_jwt_secret: Some(Secret::new(ADMIN_SECRET)),
            break_glass: true,
            four_eyes: paybus_ops::approvals::FourEyes::off(),
            ..ApiConfig::default()
        };
        let state = AppState::new(services, &config, paybus_catalog::audit_checks())
            .expect("the API state builds");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        tokio::spawn(paybus_api::serve_on(listener, state, shutdown.clone()));
        let token = paybus_api::auth::issue(
            ADMIN_SECRET,
            "w4-tests",
            &[Role::Admin],
            Duration::from_secs(3600),
        )
        .unwrap();
        Self {
            base,
            http: reqwest::Client::new(),
            token,
            shutdown,
        }
    }

    async fn post(&self, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// cancel-orders, its due sweep and its materialiser, with short pauses.
fn start_cancel_orders(
    services: &Services,
    config: CancelConfig,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let mut runner = Runner::new(services.clone());
    runner.add_function(CancelOrders::new(config));
    runner.add_job(Arc::new(due_tasks(
        services,
        DueSweepConfig {
            interval: Duration::from_millis(50),
            ..DueSweepConfig::default()
        },
    )));
    runner.add_job(Arc::new(Materialiser::new(
        services.outbox.clone(),
        MaterialiserConfig {
            interval: Duration::from_millis(50),
            ..MaterialiserConfig::default()
        },
    )));
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let running = tokio::spawn(async move { runner.run(token).await.unwrap() });
    (shutdown, running)
}

async fn complete(env: &TestEnv, symbol: &str, within: Duration) -> bool {
    eventually(within, || async {
        progress::of_symbol(&env.db, symbol).await.unwrap().complete
    })
    .await
}

/// Waits until the market holds `count` orders (the hammering clients are under way).
async fn placed_at_least(pool: &MySqlPool, market_id: u64, count: i64) -> bool {
    eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM orders WHERE market_id = ?")
            .bind(market_id)
            .fetch_one(pool)
            .await
            .unwrap()
            >= count
    })
    .await
}

async fn open_in(pool: &MySqlPool, market_id: u64) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM orders WHERE market_id = ? AND status IN ('OPEN', 'PARTIALLY_FILLED')",
    )
    .bind(market_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_thousand_open_orders_are_cancelled_after_a_suspend_that_answers_at_once() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let api = Api::start(&services).await;
    let (status, _) = api
        .post("/v1/admin/markets", Some(json!({"symbol": "BTC"})))
        .await;
    assert_eq!(status, 201);
    let market_id: u64 = sqlx::query_scalar("SELECT id FROM markets WHERE symbol = 'BTC'")
        .fetch_one(&env.db)
        .await
        .unwrap();
    let orders = open_orders(&env.db, market_id, 8_000).await;
    let (halt, running) = start_cancel_orders(&services, CancelConfig::default());
    let (status, suspended) = api.post("/v1/admin/markets/BTC/suspend", None).await;
    // The matching engine's late trades land while the cancels run: those tasks are SKIPPED.
    let filling = Arc::new(AtomicBool::new(true));
    let filler = {
        let (api_base, http, token, filling) = (
            api.base.clone(),
            api.http.clone(),
            api.token.clone(),
            filling.clone(),
        );
        let orders = orders.clone();
        tokio::spawn(async move {
            let mut filled: i64 = 0;
            for order_id in orders.iter().rev().step_by(37) {
                if !filling.load(Ordering::Relaxed) {
                    break;
                }
                let response = http
                    .post(format!("{api_base}/v1/admin/orders/{order_id}/fills"))
                    .bearer_auth(&token)
                    .json(&json!({"quantity": "1"}))
                    .send()
                    .await
                    .unwrap();
                if response.status() == 200 {
                    filled += 1;
                }
            }
            filled
        })
    };

    assert_eq!(status, 202, "{suspended}");
    // The request created its bounded first chunk only: the rest is the materialiser's.
    assert_eq!(suspended["tasks_created_now"], 100, "{suspended}");
    assert_eq!(suspended["materialised"], false, "{suspended}");
    let (status, placed) = api
        .post(
            "/v1/admin/markets/BTC/orders",
            Some(json!({"account_id": 1, "side": "BUY", "price": "100", "quantity": "1"})),
        )
        .await;
    assert_eq!(status, 409, "placement is refused once suspended: {placed}");
    assert!(complete(&env, "BTC", Duration::from_secs(120)).await);
    filling.store(false, Ordering::Relaxed);
    let filled = filler.await.unwrap();
    halt.cancel();
    running.await.unwrap();

    let (status, progress) = api.get("/v1/admin/markets/BTC/suspension").await;
    assert_eq!(status, 200);
    assert_eq!(progress["complete"], true, "{progress}");
    assert_eq!(progress["open_orders"], 0);
    let (created, done, skipped) = (
        progress["created"].as_i64().unwrap(),
        progress["tasks"]["DONE"].as_i64().unwrap(),
        progress["tasks"]["SKIPPED"].as_i64().unwrap(),
    );
    assert_eq!(progress["tasks"]["PENDING"], 0);
    assert_eq!(progress["tasks"]["FAILED"], 0);
    assert_eq!(
        done + skipped,
        created,
        "counts add up to the created count"
    );
    assert_eq!(orders_in(&env.db, market_id, "CANCELLED").await, done);
    assert_eq!(orders_in(&env.db, market_id, "FILLED").await, filled);
    // A fill that landed before its chunk was materialised left the set (it was no longer
    // open): no task. One that landed after made its task SKIPPED. Every order is accounted.
    let filled_without_task = scalar(
        &env.db,
        "SELECT COUNT(*) FROM orders o LEFT JOIN tasks t ON t.target_id = o.id \
         WHERE o.status = 'FILLED' AND t.id IS NULL",
    )
    .await;
    assert_eq!(skipped + filled_without_task, filled);
    assert_eq!(created + filled_without_task, 8_000);
    assert!(
        filled > 0,
        "the matching engine filled some orders during the run"
    );
    assert_audit_clean(&env.db).await;
}

/// Placement from `clients` tasks until `stop`: every accepted order id, and every order
/// accepted by a request sent after `suspended` was set.
async fn hammer(
    api: &Api,
    symbol: &'static str,
    clients: usize,
    stop: Arc<AtomicBool>,
    suspended: Arc<AtomicBool>,
) -> JoinSet<(Vec<u64>, Vec<u64>)> {
    let mut hammering = JoinSet::new();
    for client in 0..clients {
        let (base, http, token) = (api.base.clone(), api.http.clone(), api.token.clone());
        let (stop, suspended) = (stop.clone(), suspended.clone());
        hammering.spawn(async move {
            let (mut accepted, mut accepted_after) = (Vec::new(), Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let sent_after_suspension = suspended.load(Ordering::SeqCst);
                let response = http
                    .post(format!("{base}/v1/admin/markets/{symbol}/orders"))
                    .bearer_auth(&token)
                    .json(&json!({
                        "account_id": client + 1, "side": "SELL", "price": "101.5", "quantity": "2"
                    }))
                    .send()
                    .await
                    .unwrap();
                match response.status().as_u16() {
                    201 => {
                        let id = response.json::<Value>().await.unwrap()["id"]
                            .as_u64()
                            .unwrap();
                        accepted.push(id);
                        if sent_after_suspension {
                            accepted_after.push(id);
                        }
                    }
                    409 => {}
                    other => panic!("placement answered {other}"),
                }
            }
            (accepted, accepted_after)
        });
    }
    hammering
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_placed_while_suspending_are_refused_or_cancelled_never_left_open() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let api = Api::start(&services).await;
    let market_id = market(&env.db, "BTC").await;
    open_orders(&env.db, market_id, 500).await;
    let (halt, running) = start_cancel_orders(&services, CancelConfig::default());
    let (stop, suspended) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let mut hammering = hammer(&api, "BTC", 16, stop.clone(), suspended.clone()).await;

    assert!(
        placed_at_least(&env.db, market_id, 600).await,
        "the clients placed no orders"
    );
    let (status, answer) = api.post("/v1/admin/markets/BTC/suspend", None).await;
    suspended.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut accepted, mut accepted_after) = (Vec::new(), Vec::new());
    while let Some(joined) = hammering.join_next().await {
        let (all, after) = joined.unwrap();
        accepted.extend(all);
        accepted_after.extend(after);
    }
    assert_eq!(status, 202, "{answer}");
    assert!(complete(&env, "BTC", Duration::from_secs(60)).await);
    halt.cancel();
    running.await.unwrap();

    assert!(
        accepted.len() > 50,
        "the clients placed orders before the suspension"
    );
    assert_eq!(
        accepted_after,
        Vec::<u64>::new(),
        "accepted after the suspension committed"
    );
    let max_target_id: u64 = sqlx::query_scalar("SELECT max_target_id FROM task_batches")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert!(
        accepted.iter().all(|id| *id <= max_target_id),
        "every accepted order is in the set"
    );
    assert_eq!(open_in(&env.db, market_id).await, 0, "nothing left OPEN");
    let tasks = scalar(&env.db, "SELECT COUNT(*) FROM tasks").await;
    assert_eq!(tasks, i64::try_from(500 + accepted.len()).unwrap());
    assert_audit_clean(&env.db).await;
}

/// The hazard the order of operations removes (seed 004, "순서와 중복"): enqueue what is open
/// first, block afterwards, under the same hammering — orders placed in between are in no
/// task and stay OPEN in a SUSPENDED market.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_enqueueing_before_blocking_leaves_orders_open() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let api = Api::start(&services).await;
    let market_id = market(&env.db, "BTC").await;
    open_orders(&env.db, market_id, 500).await;
    let (stop, suspended) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let mut hammering = hammer(&api, "BTC", 16, stop.clone(), suspended.clone()).await;
    assert!(
        placed_at_least(&env.db, market_id, 600).await,
        "the clients placed no orders"
    );

    // The reversed design: the open ids are read (and their cancels enqueued, which takes a
    // while for a big market), then the market is blocked.
    let snapshot: Vec<u64> =
        sqlx::query_scalar("SELECT id FROM orders WHERE market_id = ? AND status = 'OPEN'")
            .bind(market_id)
            .fetch_all(&env.db)
            .await
            .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    sqlx::query("UPDATE markets SET status = 'SUSPENDED', suspended_at = NOW(6) WHERE id = ?")
        .bind(market_id)
        .execute(&env.db)
        .await
        .unwrap();
    for id in &snapshot {
        sqlx::query("UPDATE orders SET status = 'CANCELLED', cancel_reason = 'MARKET_SUSPENDED', cancelled_at = NOW(6) WHERE id = ? AND status = 'OPEN'")
            .bind(id)
            .execute(&env.db)
            .await
            .unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    while hammering.join_next().await.is_some() {}

    let left_open = open_in(&env.db, market_id).await;
    assert!(left_open > 0, "the reversed order leaked nothing this time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_suspends_create_one_batch_and_no_duplicate_task() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let api = Arc::new(Api::start(&services).await);
    let market_id = market(&env.db, "BTC").await;
    open_orders(&env.db, market_id, 2_500).await;
    let barrier = Arc::new(Barrier::new(8));

    let mut suspends = JoinSet::new();
    for _ in 0..8 {
        let (api, barrier) = (api.clone(), barrier.clone());
        suspends.spawn(async move {
            barrier.wait().await;
            api.post(
                "/v1/admin/markets/BTC/suspend",
                Some(json!({"note": "exchange halt"})),
            )
            .await
        });
    }
    let mut answers = Vec::new();
    while let Some(answer) = suspends.join_next().await {
        answers.push(answer.unwrap());
    }
    let (halt, running) = start_cancel_orders(&services, CancelConfig::default());
    assert!(complete(&env, "BTC", Duration::from_secs(60)).await);
    halt.cancel();
    running.await.unwrap();

    let accepted: Vec<&Value> = answers
        .iter()
        .filter(|(s, _)| *s == 202)
        .map(|(_, b)| b)
        .collect();
    assert_eq!(accepted.len(), 1, "{answers:?}");
    let batch_id = &accepted[0]["batch_id"];
    for (status, body) in &answers {
        assert!(*status == 202 || *status == 200, "{status} {body}");
        assert_eq!(
            &body["batch_id"], batch_id,
            "every answer names the one batch"
        );
    }
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM task_batches").await,
        1
    );
    assert_eq!(scalar(&env.db, "SELECT COUNT(*) FROM tasks").await, 2_500);
    assert_eq!(orders_in(&env.db, market_id, "CANCELLED").await, 2_500);
    // Suspending again later is still the same batch, and still creates nothing.
    let (status, again) = api.post("/v1/admin/markets/BTC/suspend", None).await;
    assert_eq!((status, &again["batch_id"]), (200, batch_id));
    assert_eq!(scalar(&env.db, "SELECT COUNT(*) FROM tasks").await, 2_500);
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vanished_and_unfailing_cancels_end_failed_with_dead_letters_and_ops_can_finish_them() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let api = Api::start(&services).await;
    let market_id = market(&env.db, "BTC").await;
    let orders = open_orders(&env.db, market_id, 60).await;
    let (vanished, refused) = (orders[10], orders[40]);
    refuse_cancels_of(&env.db, refused).await;
    let (status, _) = api.post("/v1/admin/markets/BTC/suspend", None).await;
    assert_eq!(status, 202);
    sqlx::query("DELETE FROM orders WHERE id = ?")
        .bind(vanished)
        .execute(&env.db)
        .await
        .unwrap();
    let config = CancelConfig {
        retry: RetryPolicy::with_schedule(3, vec![Duration::from_millis(100)]).unwrap(),
        ..CancelConfig::default()
    };
    let (halt, running) = start_cancel_orders(&services, config.clone());

    let settled = eventually(Duration::from_secs(60), || async {
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM tasks WHERE state = 'PENDING'",
        )
        .await
            == 0
    })
    .await;
    let dead_letters = eventually(Duration::from_secs(30), || async {
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM dead_letters WHERE function_name = 'cancel-orders'",
        )
        .await
            >= 2
    })
    .await;
    assert!(settled && dead_letters);
    let (_, progress) = api.get("/v1/admin/markets/BTC/suspension").await;
    assert_eq!(progress["phase"], "needs_attention", "{progress}");
    assert_eq!(progress["tasks"]["FAILED"], 2);
    assert_eq!(progress["tasks"]["DONE"], 58);
    assert_eq!(progress["open_orders"], 1, "the refused order");
    let errors: Vec<String> = sqlx::query_scalar(
        "SELECT error FROM dead_letters WHERE function_name = 'cancel-orders' ORDER BY id",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    let all = errors.join("\n");
    assert!(
        all.contains(&format!("order {vanished} does not exist")),
        "{all}"
    );
    assert!(all.contains("gave up after 3 attempts"), "{all}");
    assert!(
        all.contains("order is locked by the matching engine"),
        "{all}"
    );
    let (status, refused_resume) = api.post("/v1/admin/markets/BTC/resume", None).await;
    assert_eq!(
        status, 409,
        "a half-cancelled market is not resumed: {refused_resume}"
    );

    // Ops fix the cause and retry: the suspension completes, and the market can resume.
    sqlx::query("DROP TRIGGER refuse_cancel")
        .execute(&env.db)
        .await
        .unwrap();
    let (status, retried) = api
        .post("/v1/admin/markets/BTC/suspension/retry-failed", None)
        .await;
    assert_eq!((status, &retried["retried"]), (200, &json!(2)));
    let finished = complete(&env, "BTC", Duration::from_secs(60)).await;
    halt.cancel();
    running.await.unwrap();
    assert!(finished);
    assert_eq!(open_in(&env.db, market_id).await, 0);
    let (status, resumed) = api.post("/v1/admin/markets/BTC/resume", None).await;
    assert_eq!(status, 200, "{resumed}");
    let (status, _) = api
        .post(
            "/v1/admin/markets/BTC/orders",
            Some(json!({"account_id": 1, "side": "BUY", "price": "100", "quantity": "1"})),
        )
        .await;
    assert_eq!(status, 201, "trading again");
    // Suspend, retry and resume are in the ops log under the token's subject, marked as the
    // break-glass token it is; the refused resume is not.
    let (_, log) = api.get("/v1/admin/ops-log").await;
    let logged: Vec<(&str, &str, &str)> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["actor"].as_str().unwrap(),
                entry["action"].as_str().unwrap(),
                entry["subject"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        logged,
        [
            ("w4-tests (break-glass)", "market.resume", "market:BTC"),
            (
                "w4-tests (break-glass)",
                "market.retry_failed_tasks",
                "market:BTC"
            ),
            ("w4-tests (break-glass)", "market.suspend", "market:BTC"),
        ]
    );
    assert_eq!(log["entries"][1]["detail"]["retried"], 2);
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspending_a_market_without_open_orders_reports_zero_tasks_created() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let api = Api::start(&services).await;
    market(&env.db, "EMPTY").await;

    let (status, answer) = api.post("/v1/admin/markets/EMPTY/suspend", None).await;
    let (_, progress) = api.get("/v1/admin/markets/EMPTY/suspension").await;

    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["materialised"], true);
    assert_eq!(progress["created"], 0);
    assert_eq!(progress["complete"], true);
    assert_eq!(
        progress["summary"],
        "suspension complete: 0 tasks created (no open orders at suspension)"
    );
    let (status, resumed) = api.post("/v1/admin/markets/EMPTY/resume", None).await;
    assert_eq!((status, &resumed["resumed_now"]), (200, &json!(true)));
}

/// Found by `paybus-lab chaos` (its full profile, clients placing and filling while ops suspend):
/// the newest orders of a market were filled before the suspension, so the frozen bound (then
/// the highest *open* id) sat below them and the audit read them as accepted while suspended.
/// The bound is the highest order id placed before the suspension, whatever became of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_filled_before_a_suspension_are_not_read_as_accepted_during_it() {
    let env = TestEnv::new().await;
    let services = env.services(&[CancelOrders::queue()]).await;
    let api = Api::start(&services).await;
    market(&env.db, "BTC").await;
    let mut placed = Vec::new();
    for _ in 0..3 {
        let (status, order) = api
            .post(
                "/v1/admin/markets/BTC/orders",
                Some(json!({"account_id": 1, "side": "BUY", "price": "100", "quantity": "1"})),
            )
            .await;
        assert_eq!(status, 201, "{order}");
        placed.push(order["id"].as_u64().unwrap());
    }
    let newest = placed[2];
    let (status, filled) = api
        .post(
            &format!("/v1/admin/orders/{newest}/fills"),
            Some(json!({"quantity": "1"})),
        )
        .await;
    assert_eq!((status, filled["status"].as_str()), (200, Some("FILLED")));

    let (status, suspended) = api.post("/v1/admin/markets/BTC/suspend", None).await;

    assert_eq!(status, 202, "{suspended}");
    let bound = scalar(
        &env.db,
        "SELECT CAST(max_target_id AS SIGNED) FROM task_batches",
    )
    .await;
    assert_eq!(
        u64::try_from(bound).unwrap(),
        newest,
        "the bound covers every order placed before"
    );
    let (_, progress) = api.get("/v1/admin/markets/BTC/suspension").await;
    assert_eq!(
        progress["created"], 2,
        "only the two open orders owe a cancel"
    );
    assert_audit_clean(&env.db).await;
}
