//! Every console page in a real browser after real traffic: Debian's chromium driven by
//! playwright (`tests/console_pages_browser.py`) against `paybus serve`, alice signed in on the
//! test OpenID provider's own pages. Before the browser opens, a real `paybus run` (every
//! function, the sweeper's jobs, the sampler, the activity tally) works what people and
//! counterparties send through the public and admin APIs: withdrawals confirmed by the chain
//! monitor (some twice, some for withdrawals that do not exist: dead letters), a deposit, a
//! bonus, a P2P order whose first quote fails, a market suspended (its orders cancelled), and
//! the webhooks these owe to two partners, one of whose endpoints answers 500 (retried). Then it is stopped (SIGTERM: in-flight messages finish, the tally is
//! flushed), so nothing writes while the pages are read.
//!
//! The script reads the overview's charts in both windows and runs axe-core, the keyboard and
//! the 390 px checks on every page (its `PAGES`); this test then computes each chart's numbers
//! with its own SQL over `function_activity`, `queue_samples`, `outbox_samples` and the dead
//! letters' failures, and requires every cell of every chart's table to be that number.

use crate::api_process;

use std::{
    collections::{BTreeMap, BTreeSet},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use api_process::{
    ApiProcess, CHAIN_MONITOR_SECRET, PAYMENTS_SECRET, axe_script, output_dir,
    provider_admin_token, python_tool,
};
use axum::{Router, http::StatusCode, routing::post};
use paybus_bus::samples::BusSampler;
use paybus_testkit::{
    TestEnv, free_port,
    oidc::{self, OidcProvider, OidcSetup},
    p2p::QuoteStub,
};
use serde_json::{Value, json};

/// Withdrawals made through the admin API and confirmed by the chain monitor.
const WITHDRAWALS: u64 = 6;
/// Of those, the ones the chain monitor confirms a second time (skipped).
const CONFIRMED_TWICE: u64 = 2;
/// Confirmations of withdrawals that do not exist (dead letters).
const UNKNOWN_CONFIRMATIONS: u64 = 3;
/// Withdrawals of the partner whose endpoint answers 500: their webhooks are retried.
const FAILING_PARTNER_WITHDRAWALS: u64 = 2;
const MARKET: &str = "ETH-USDT";
/// Open orders of the market, each cancelled by cancel-orders after the suspension.
const ORDERS: u64 = 4;

/// `paybus run`, killed if the test ends before it was stopped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    /// SIGTERM, as a deploy stops it, and its clean exit: in-flight messages finish and the
    /// activity tally is flushed.
    async fn stop(&mut self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .expect("send SIGTERM");
        assert!(sent.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.0.try_wait().expect("poll paybus run") {
                assert!(status.success(), "paybus run exited with {status}");
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("paybus run did not stop within 60 s of SIGTERM");
    }
}

/// A partner's webhook endpoint: `/ok` takes every delivery, `/failing` answers 500.
async fn partner_endpoints() -> String {
    let app = Router::new().route("/ok", post(|| async { "ok" })).route(
        "/failing",
        post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "down") }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the partner's endpoint");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

/// Waits (at most 60 s) until `sql` counts `want`.
async fn until(env: &TestEnv, sql: &str, want: i64) {
    let started = Instant::now();
    loop {
        let got: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&env.db)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
        if got == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "waited 60 s for {sql} = {want}; it is {got}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Rows of a chart's table: (series, bucket start as RFC 3339) → the number, `None` where the
/// chart shows that nothing was measured.
type Numbers = BTreeMap<(String, String), Option<i64>>;

/// What SQL counts for each chart of `window` (`hour`: by minute, `day`: by hour), keyed by
/// chart id as the page names them.
async fn counted(env: &TestEnv, window: &str) -> BTreeMap<String, Numbers> {
    // The bucket a row falls in, formatted as the page's `<time datetime>` (chrono's RFC 3339).
    let bucket = match window {
        "hour" => "%Y-%m-%dT%H:%i:00+00:00",
        _ => "%Y-%m-%dT%H:00:00+00:00",
    };
    let mut charts: BTreeMap<String, Numbers> = BTreeMap::new();
    let activity: Vec<(String, String, i64, i64, i64, i64)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT function_name, DATE_FORMAT(minute_at, '{bucket}'), \
                    CAST(SUM(done) AS SIGNED), CAST(SUM(skipped) AS SIGNED), \
                    CAST(SUM(retried) AS SIGNED), CAST(SUM(failed) AS SIGNED) \
             FROM function_activity GROUP BY 1, 2"
        )))
        .fetch_all(&env.db)
        .await
        .expect("count function_activity");
    for (function, at, done, skipped, retried, failed) in activity {
        let chart = charts.entry(format!("chart-{function}")).or_default();
        for (series, n) in [
            ("done", done),
            ("skipped", skipped),
            ("retried", retried),
            ("failed", failed),
        ] {
            chart.insert((series.to_owned(), at.clone()), Some(n));
        }
    }
    let queues: Vec<(String, String, Option<i64>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT queue_name, DATE_FORMAT(minute_at, '{bucket}'), CAST(MAX(ready) AS SIGNED) \
         FROM queue_samples GROUP BY 1, 2"
    )))
    .fetch_all(&env.db)
    .await
    .expect("count queue_samples");
    let chart = charts.entry("chart-queues".to_owned()).or_default();
    for (queue, at, ready) in queues {
        chart.insert((queue, at), ready);
    }
    let outbox: Vec<(String, Option<i64>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT DATE_FORMAT(minute_at, '{bucket}'), CAST(MAX(backlog) AS SIGNED) \
         FROM outbox_samples GROUP BY 1"
    )))
    .fetch_all(&env.db)
    .await
    .expect("count outbox_samples");
    let chart = charts.entry("chart-outbox".to_owned()).or_default();
    for (at, backlog) in outbox {
        chart.insert(("backlog".to_owned(), at), backlog);
    }
    // Dead letters are drawn by hour in both windows: each failure of a letter counts.
    let dead: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT l.function_name, DATE_FORMAT(f.failed_at, '%Y-%m-%dT%H:00:00+00:00'), COUNT(*) \
         FROM dead_letter_failures f JOIN dead_letters l ON l.dead_letter_id = f.dead_letter_id \
         GROUP BY 1, 2",
    )
    .fetch_all(&env.db)
    .await
    .expect("count the dead letters' failures");
    let chart = charts.entry("chart-dead-letters".to_owned()).or_default();
    for (function, at, n) in dead {
        chart.insert((function, at), Some(n));
    }
    charts
}

/// What a chart shows where SQL has no row: counts are 0, samples were not taken ("—").
fn unmeasured(chart: &str) -> Option<i64> {
    match chart {
        "chart-queues" | "chart-outbox" => None,
        _ => Some(0),
    }
}

/// Compares the tables the page showed for `window` with what SQL counts: every cell, and
/// every SQL row with something to show has its cell. Returns each chart's totals per series,
/// the chart named by its id without `chart-` (a function's name, `dead-letters`, `queues`,
/// `outbox`).
fn compare(
    window: &str,
    shown: &Value,
    expected: &BTreeMap<String, Numbers>,
) -> BTreeMap<String, BTreeMap<String, i64>> {
    assert_eq!(shown["window"], window, "{shown}");
    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut totals: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    let mut wrong = Vec::new();
    let charts = shown["charts"].as_array().expect("the page's charts");
    for chart in charts {
        let id = chart["chart"].as_str().expect("a chart id");
        let series: Vec<&str> = chart["series"]
            .as_array()
            .expect("series")
            .iter()
            .map(|s| s.as_str().expect("a series name"))
            .collect();
        let rows = chart["rows"].as_array().expect("rows");
        let buckets = if id == "chart-dead-letters" || window == "day" {
            24
        } else {
            60
        };
        assert_eq!(rows.len(), buckets, "{window}: {id} has a row per bucket");
        for row in rows {
            let at = row["at"].as_str().expect("a bucket's start");
            for (name, cell) in series.iter().zip(row["values"].as_array().expect("cells")) {
                let cell = cell.as_str().expect("a cell's text");
                let on_page = match cell {
                    "—" => None,
                    n => Some(n.parse::<i64>().unwrap_or_else(|_| {
                        panic!("{window}: {id} {name} at {at} shows {cell:?}, not a count")
                    })),
                };
                let key = ((*name).to_owned(), at.to_owned());
                let by_sql = expected
                    .get(id)
                    .and_then(|numbers| numbers.get(&key).copied())
                    .unwrap_or_else(|| unmeasured(id));
                if on_page != by_sql {
                    wrong.push(format!(
                        "{id} {name} at {at}: the page shows {on_page:?}, SQL counts {by_sql:?}"
                    ));
                }
                seen.insert((id.to_owned(), key.0, key.1));
                if let (Some(function), Some(n)) = (id.strip_prefix("chart-"), on_page) {
                    *totals
                        .entry(function.to_owned())
                        .or_default()
                        .entry((*name).to_owned())
                        .or_default() += n;
                }
            }
        }
    }
    for (id, numbers) in expected {
        for ((name, at), n) in numbers {
            if *n != unmeasured(id)
                && *n != Some(0)
                && !seen.contains(&(id.clone(), name.clone(), at.clone()))
            {
                wrong.push(format!(
                    "{id} {name} at {at}: SQL counts {n:?}, the page has no such cell"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{window}: the charts' tables are not what SQL counts:\n{}",
        wrong.join("\n")
    );
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_console_page_passes_axe_works_by_keyboard_and_at_390_px_and_its_charts_are_what_sql_counts()
 {
    let Some(python) = python_tool("PAYBUS_TEST_PYTHON", "python") else {
        return;
    };
    let Some(axe) = axe_script() else {
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
    // Break-glass stays on (the harness's default): the login page shows its token form too.
    let api = ApiProcess::start_on(
        &env,
        port,
        &[
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
    let quotes = QuoteStub::start().await;
    let endpoints = partner_endpoints().await;
    let log = std::env::var("TEST_LOG").map_or_else(|_| Stdio::null(), |_| Stdio::inherit());
    let mut run = Running(
        Command::new(env!("CARGO_BIN_EXE_paybus"))
            .arg("run")
            .envs(env.env_vars())
            .env("PAYBUS_QUOTE_URL", quotes.url())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start paybus run"),
    );

    // W2: two partners, withdrawals confirmed by the chain monitor (some twice), and
    // confirmations of withdrawals that do not exist.
    let mut partners = Vec::new();
    for (name, endpoint) in [("Prompt", "ok"), ("Failing", "failing")] {
        let created = api
            .admin_post(
                &token,
                "/v1/admin/partners",
                json!({"name": name, "webhook_url": format!("{endpoints}/{endpoint}")}),
            )
            .await;
        partners.push(created["id"].as_u64().expect("a partner id"));
    }
    let tx_hash = |id: u64| format!("0x{:064x}", 0xa11e_0000 + id);
    let mut withdrawals = Vec::new();
    for n in 0..WITHDRAWALS {
        let partner = if n < FAILING_PARTNER_WITHDRAWALS {
            partners[1]
        } else {
            partners[0]
        };
        let created = api
            .admin_post(
                &token,
                "/v1/admin/withdrawals",
                json!({"partner_id": partner, "status": "BROADCASTING", "currency": "USDT",
                       "amount": "25", "to_address": format!("T-pages-{n}")}),
            )
            .await;
        withdrawals.push(created["id"].as_u64().expect("a withdrawal id"));
    }
    let confirm = |id: u64| json!({"withdrawal_id": id, "tx_hash": tx_hash(id)});
    let confirmations = withdrawals
        .iter()
        .chain(withdrawals.iter().take(CONFIRMED_TWICE as usize))
        .copied()
        .chain((1..=UNKNOWN_CONFIRMATIONS).map(|n| 900_000 + n));
    for id in confirmations {
        api.signed_post(
            CHAIN_MONITOR_SECRET,
            "/v1/chain-monitor/withdrawal-confirmations",
            confirm(id),
        )
        .await;
    }
    let deposit = api
        .admin_post(
            &token,
            "/v1/admin/deposits",
            json!({"partner_id": partners[0], "currency": "USDT", "amount": "50", "fee": "1",
                   "tx_hash": "0xpages-deposit", "to_address": "T-deposit"}),
        )
        .await["id"]
        .as_u64()
        .expect("a deposit id");
    api.signed_post(
        CHAIN_MONITOR_SECRET,
        "/v1/chain-monitor/deposit-confirmations",
        json!({"deposit_id": deposit}),
    )
    .await;

    // W3: a purchase during a charge event, completed by the payment service.
    let now = chrono::Utc::now();
    api.admin_post(
        &token,
        "/v1/admin/charge-events",
        json!({"title": "pages event", "add_percent": 10,
               "start_at": now - chrono::Duration::days(1), "end_at": now + chrono::Duration::days(1)}),
    )
    .await;
    let purchase = async |gateway_tx: &str| {
        let member = api
            .admin_post(&token, "/v1/admin/members", json!({"nickname": gateway_tx}))
            .await;
        let charge = api
            .admin_post(
                &token,
                "/v1/admin/charges",
                json!({"member_id": member["id"], "cans": 10, "price": "1000",
                       "payment_gateway": "PG", "method": "card"}),
            )
            .await;
        let completed = api
            .signed_post(
                PAYMENTS_SECRET,
                "/v1/payments/pg/verify",
                json!({"charge_id": charge["id"], "gateway_tx_id": gateway_tx, "amount": "1000"}),
            )
            .await;
        completed["bonus_jobs"][0]["job_id"]
            .as_u64()
            .expect("a bonus job")
    };
    let bonus_job = purchase("pg-pages-1").await;

    // W1: a seller and a buyer through the partner API; the quote service fails the first
    // quote, so the order is matched by a later attempt after its backoff.
    let key = api
        .admin_post(
            &token,
            &format!("/v1/admin/partners/{}/api-keys", partners[0]),
            json!({"label": "pages"}),
        )
        .await["key"]
        .as_str()
        .expect("an API key")
        .to_owned();
    let as_partner = async |path: &str, idempotency_key: &str, body: Value| -> Value {
        let answer = reqwest::Client::new()
            .post(format!("{}{path}", api.base_url))
            .bearer_auth(&key)
            .header("Idempotency-Key", idempotency_key)
            .json(&body)
            .send()
            .await
            .expect("a partner request");
        let status = answer.status();
        let answer: Value = answer.json().await.expect("JSON");
        assert!(status.is_success(), "POST {path}: {status} {answer}");
        answer
    };
    as_partner(
        "/v1/partner/p2p/withdraw-orders",
        "pages-seller",
        json!({"currency": "USDT", "amount": "100"}),
    )
    .await;
    quotes.fail_next_quotes(1);
    let deposit_order = as_partner(
        "/v1/partner/p2p/deposit-orders",
        "pages-buyer",
        json!({"currency": "USDT", "amount": "40", "partner_order_ref": "pages-buyer"}),
    )
    .await["id"]
        .as_u64()
        .expect("a deposit order id");

    // W4: a market with open orders, suspended: cancel-orders cancels each.
    api.admin_post(&token, "/v1/admin/markets", json!({"symbol": MARKET}))
        .await;
    for account in 1..=ORDERS {
        api.admin_post(
            &token,
            &format!("/v1/admin/markets/{MARKET}/orders"),
            json!({"account_id": account, "side": "BUY", "price": "100", "quantity": "1"}),
        )
        .await;
    }
    api.admin_post(
        &token,
        &format!("/v1/admin/markets/{MARKET}/suspend"),
        json!({"note": "pages test halt"}),
    )
    .await;

    // Everything worked: confirmed, dead-lettered, credited, granted, matched after its retry,
    // cancelled; then each webhook these owe (written with them) delivered, or tried at least
    // once.
    until(
        &env,
        "SELECT COUNT(*) FROM withdrawals WHERE status = 'CONFIRMED'",
        WITHDRAWALS as i64,
    )
    .await;
    until(
        &env,
        "SELECT COUNT(*) FROM dead_letters",
        UNKNOWN_CONFIRMATIONS as i64,
    )
    .await;
    until(
        &env,
        "SELECT COUNT(*) FROM deposits WHERE status = 'CONFIRMED'",
        1,
    )
    .await;
    until(
        &env,
        "SELECT COUNT(*) FROM charge_event_job WHERE status = 'DONE'",
        1,
    )
    .await;
    until(
        &env,
        "SELECT COUNT(*) FROM p2p_deposit_orders WHERE status = 'MATCHED'",
        1,
    )
    .await;
    until(
        &env,
        "SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED'",
        ORDERS as i64,
    )
    .await;
    until(
        &env,
        &format!(
            "SELECT COUNT(*) FROM partner_notifications WHERE partner_id = {} \
             AND status <> 'DELIVERED'",
            partners[0]
        ),
        0,
    )
    .await;
    until(
        &env,
        &format!(
            "SELECT COUNT(*) FROM partner_notifications WHERE partner_id = {} AND attempts > 0",
            partners[1]
        ),
        FAILING_PARTNER_WITHDRAWALS as i64,
    )
    .await;
    // The duplicates are settled too: every queue drained.
    let services = env
        .services(&paybus_catalog::queues(&Default::default()))
        .await;
    let queues: Vec<String> = paybus_catalog::queues(&Default::default())
        .iter()
        .map(|queue| queue.queue())
        .collect();
    let started = Instant::now();
    loop {
        let mut ready = 0;
        for queue in &queues {
            if let Ok(Some(depth)) = services.link.queue_depth(queue).await {
                ready += depth.ready;
            }
        }
        if ready == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{ready} message(s) still ready after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    run.stop().await;

    // What the pages show beyond the traffic: a dry run of the letters' group (an operation
    // awaiting a second ADMIN), the market's resumption asked for (an approval), and a
    // purchase whose bonus waits for grant-bonus (a PENDING job on the jobs page).
    let (letter, group_function, group_reason): (u64, String, String) =
        sqlx::query_as("SELECT id, function_name, reason FROM dead_letters ORDER BY id LIMIT 1")
            .fetch_one(&env.db)
            .await
            .expect("a dead letter");
    let operation = api
        .admin_post(
            &token,
            "/v1/admin/dead-letters/operations",
            json!({"group": {"function": group_function, "reason": group_reason},
                   "action": "replay"}),
        )
        .await["id"]
        .as_str()
        .expect("an operation id")
        .to_owned();
    api.admin_post(
        &token,
        &format!("/v1/admin/markets/{MARKET}/resume"),
        json!({}),
    )
    .await;
    purchase("pg-pages-2").await;
    // The sweeper's sampler once more, as its next pass would: grant-bonus's queue now holds
    // that purchase's message, so the queues' chart has a number that is not 0.
    let grant_bonus = paybus_catalog::queues(&Default::default())
        .iter()
        .find(|queue| queue.function == "grant-bonus")
        .expect("grant-bonus's queue")
        .queue();
    let started = Instant::now();
    while !matches!(services.link.queue_depth(&grant_bonus).await, Ok(Some(depth)) if depth.ready == 1)
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the purchase's message did not reach {grant_bonus}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    BusSampler::new(env.db.clone(), services.link.clone(), queues)
        .sample()
        .await
        .expect("a sample of the bus");

    let output = output_dir("console-pages");
    let _ = std::fs::remove_file(output.join("charts.json"));
    let ids = json!({
        "withdrawal": withdrawals[FAILING_PARTNER_WITHDRAWALS as usize],
        "tx_hash": tx_hash(withdrawals[FAILING_PARTNER_WITHDRAWALS as usize]),
        "deposit": deposit,
        "deposit_order": deposit_order,
        "bonus_job": bonus_job,
        "letter": letter,
        "group_function": group_function,
        "group_reason": group_reason,
        "operation": operation,
        "partner": partners[1],
        // A number names a withdrawal, a deposit, an order and a bonus job at once.
        "several": "1",
    });
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/console_pages_browser.py"
    );
    // -B: no bytecode of the scripts' shared module (console_sign_in.py) left in the tree.
    let ran = Command::new(python)
        .arg("-B")
        .arg(script)
        .arg(&api.base_url)
        .arg(&output)
        .arg(&chromium)
        .arg(&axe)
        .arg(ids.to_string())
        .output()
        .expect("run the browser script");
    let said = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "the browser script failed:\n{said}\n{}",
        String::from_utf8_lossy(&ran.stderr)
    );

    let shown: Value = serde_json::from_str(
        &std::fs::read_to_string(output.join("charts.json")).expect("the script's charts.json"),
    )
    .expect("charts.json is JSON");
    for window in ["hour", "day"] {
        let expected = counted(&env, window).await;
        let totals = compare(window, &shown[window], &expected);
        // The tally is what the workflows' rows say, and the traffic made every kind.
        let confirmations = &totals["confirm-withdrawal"];
        assert_eq!(confirmations["done"], WITHDRAWALS as i64, "{totals:?}");
        assert_eq!(
            confirmations["skipped"], CONFIRMED_TWICE as i64,
            "{totals:?}"
        );
        assert_eq!(
            confirmations["failed"], UNKNOWN_CONFIRMATIONS as i64,
            "{totals:?}"
        );
        assert_eq!(
            totals["dead-letters"]["confirm-withdrawal"],
            UNKNOWN_CONFIRMATIONS as i64
        );
        assert!(totals["deliver-webhook"]["retried"] >= 1, "{totals:?}");
        assert!(totals["queues"]["paybus.grant-bonus"] >= 1, "{totals:?}");
        assert!(totals["cancel-orders"]["done"] >= 1, "{totals:?}");
    }
    for name in [
        "login",
        "overview",
        "dead-letter",
        "trace-withdrawal",
        "sessions",
    ] {
        for width in [1280, 390] {
            let path = output.join(format!("{name}-{width}.png"));
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            assert!(size > 1_000, "{} missing or empty", path.display());
        }
    }
}
