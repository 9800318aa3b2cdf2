//! `paybus-lab bench ops-queries`: every console page and every ops list, group and count
//! route, timed over HTTP against tables the size of a long-lived deployment's: `--rows` dead
//! letters, bonus jobs, cancel tasks and partner notifications with an attempt each (5,000,000
//! each by default), and the charts' eight days of activity.
//!
//! The rows are loaded set-based (`INSERT … SELECT` over a digits table) in the shapes a real
//! deployment accumulates (most letters archived or replayed and one in ten NEW, with real
//! bodies so the triage reads real rows; most jobs DONE; one of fifty suspended markets still
//! cancelling). Each route is asked once to warm up, then `TIMED_REQUESTS` times: the median and
//! the slowest beside the 200 ms target; then once more with the general log on, printing every
//! SELECT it ran with its EXPLAIN, so the plan behind each figure is on the page.
//!
//! A benchmark, not a test: it asserts only that every route answered 200.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use paybus_bus::{Envelope, dead_letter::group_counts};
use paybus_confirmations::WithdrawalTxConfirmed;
use paybus_markets::grouped;
use paybus_testkit::TestEnv;
use sqlx::{MySqlPool, Row};

use super::{BenchApi, BenchArgs, bench_services, suspend::create_digits};

const TIMED_REQUESTS: usize = 10;
const TARGET: Duration = Duration::from_millis(200);
/// Rows inserted per statement while loading.
const LOAD_STEP: u64 = 250_000;
/// Withdrawals the NEW letters' bodies refer to (BROADCASTING: a replay could still apply).
const WITHDRAWALS: u64 = 10_000;
/// Markets suspended, one batch each; the last still cancelling.
const MARKETS: u64 = 50;
/// The withdrawal id written into the body template, replaced per row.
const PLACEHOLDER_ID: u64 = 987_654_321_987;

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let rows = args.rows;
    ensure!(
        rows >= 2 * MARKETS,
        "--rows must be at least {}",
        2 * MARKETS
    );
    let env = TestEnv::new().await;
    // `long_query_time` is read when a session starts: set before the API's pool connects,
    // the slow log's switch (global) then applies to every connection it has. Set only
    // while a slow route was asked again, the API's sessions never logged a statement.
    execute_each(
        &env.db,
        &[
            "SET GLOBAL log_output = 'TABLE'",
            "SET GLOBAL long_query_time = 0.005",
        ],
    )
    .await?;
    let measured = measure(&env, rows).await;
    execute_each(&env.db, &["SET GLOBAL long_query_time = 10"]).await?;
    measured
}

async fn measure(env: &TestEnv, rows: u64) -> anyhow::Result<()> {
    let services = bench_services(env, 16).await?;
    let pool = &services.pool;
    create_digits(pool).await?;

    let started = Instant::now();
    let withdrawals = load_withdrawals(pool).await?;
    load_dead_letters(pool, rows, withdrawals).await?;
    println!(
        "loaded {} dead letters in {:.1?}",
        grouped(rows),
        started.elapsed()
    );
    let started = Instant::now();
    load_failures(pool).await?;
    load_activity(pool).await?;
    println!(
        "loaded a failure for each letter and 8 days of activity in {:.1?}",
        started.elapsed()
    );
    // Loaded around the recorder: their groups are counted as a deploy's recount would.
    let started = Instant::now();
    group_counts::recount(pool).await?;
    println!("counted their groups in {:.1?}", started.elapsed());
    let started = Instant::now();
    let job = load_bonus_jobs(pool, rows).await?;
    println!(
        "loaded {} bonus jobs in {:.1?}",
        grouped(rows),
        started.elapsed()
    );
    let started = Instant::now();
    let symbol = load_tasks(pool, rows).await?;
    println!(
        "loaded {} cancel tasks in {:.1?}",
        grouped(rows),
        started.elapsed()
    );
    let started = Instant::now();
    let partner = load_partner_notifications(pool, rows).await?;
    println!(
        "loaded {} partner notifications, each with a delivery attempt, in {:.1?}",
        grouped(rows),
        started.elapsed()
    );
    sqlx::query(
        "ANALYZE TABLE dead_letters, dead_letter_failures, charge_event_job, tasks, \
         task_batches, function_activity, queue_samples, outbox_samples, partners, \
         partner_notifications, partner_notification_attempts, partner_api_keys",
    )
    .execute(pool)
    .await?;

    let api = BenchApi::start(&services).await?;
    let (base, token) = (&api.base, &api.token);
    let http = reqwest::Client::new();
    let session = console_session(base, token).await?;
    let auth = Auth {
        token,
        console_session: &session,
    };

    let letter: u64 = sqlx::query_scalar("SELECT MAX(id) FROM dead_letters WHERE status = 'NEW'")
        .fetch_one(pool)
        .await?;
    let routes = routes(letter, job, withdrawals.0, &symbol, partner);
    let mut slowest_overall = Duration::ZERO;
    println!(
        "\n{:<64} {:>10} {:>10}  (target < {TARGET:?}; {TIMED_REQUESTS} requests each after one to warm up)",
        "route", "median", "slowest"
    );
    for route in &routes {
        let mut timed = Vec::with_capacity(TIMED_REQUESTS);
        for i in 0..=TIMED_REQUESTS {
            let started = Instant::now();
            get(&http, base, &auth, route).await?;
            if i > 0 {
                timed.push(started.elapsed());
            }
        }
        let timed_in_order = timed.clone();
        timed.sort();
        let median = timed[timed.len() / 2];
        let slowest = timed[timed.len() - 1];
        slowest_overall = slowest_overall.max(slowest);
        let verdict = if slowest < TARGET { "" } else { "  OVER" };
        println!(
            "{:<64} {:>10.1?} {:>10.1?}{verdict}",
            route.path, median, slowest
        );
        if slowest >= TARGET {
            // In the order they ran: one slow request among fast ones is a stall (a cold
            // cache, a background pass), every one slow is the query.
            println!("    each request, in order: {timed_in_order:.1?}");
            slow_statements(pool, &http, base, &auth, route).await?;
        }
    }
    println!(
        "slowest of every request: {slowest_overall:.1?} (target < {TARGET:?}: {})",
        if slowest_overall < TARGET {
            "met"
        } else {
            "NOT met"
        }
    );

    let groups: serde_json::Value = http
        .get(format!("{base}/v1/admin/dead-letters/groups"))
        .bearer_auth(token)
        .send()
        .await?
        .json()
        .await?;
    let first: serde_json::Value = http
        .get(format!("{base}/v1/admin/dead-letters/1"))
        .bearer_auth(token)
        .send()
        .await?
        .json()
        .await?;
    println!(
        "the first NEW letter ({}): {} — {}",
        first["function_name"], first["triage"]["verdict"], first["triage"]["reason"]
    );
    let rows_at_stake: u64 = groups["exposure"]
        .as_array()
        .map(|sums| sums.iter().filter_map(|sum| sum["rows"].as_u64()).sum())
        .unwrap_or_default();
    println!(
        "the groups' money at stake: {} rows over {} sums (exposure_complete: {})",
        grouped(rows_at_stake),
        groups["exposure"].as_array().map_or(0, Vec::len),
        groups["exposure_complete"]
    );

    println!("\nthe statements each route runs, with their plans:");
    for route in &routes {
        explain_route(pool, &http, base, &auth, route).await?;
    }
    api.stop().await
}

/// Runs `statements` in order: the bench's switches of the server's logs.
async fn execute_each(pool: &MySqlPool, statements: &[&'static str]) -> anyhow::Result<()> {
    for statement in statements {
        sqlx::query(*statement).execute(pool).await?;
    }
    Ok(())
}

/// The route asked ten times more with the server's slow log on (every statement over 5 ms),
/// to show which of its statements a slow request waited on.
async fn slow_statements(
    pool: &MySqlPool,
    http: &reqwest::Client,
    base: &str,
    auth: &Auth<'_>,
    route: &Route,
) -> anyhow::Result<()> {
    execute_each(
        pool,
        &[
            "TRUNCATE TABLE mysql.slow_log",
            "SET GLOBAL slow_query_log = 1",
        ],
    )
    .await?;
    let mut timed = Vec::new();
    let mut asked = Ok(());
    for _ in 0..TIMED_REQUESTS {
        let started = Instant::now();
        asked = get(http, base, auth, route).await;
        timed.push(started.elapsed());
        if asked.is_err() {
            break;
        }
    }
    sqlx::query("SET GLOBAL slow_query_log = 0")
        .execute(pool)
        .await?;
    asked?;
    println!("    again with the slow log on: {timed:.1?}");
    let slow: Vec<(String, f64, i64, i64)> = sqlx::query_as(
        "SELECT LEFT(CONVERT(sql_text USING utf8mb4), 120), \
                TIME_TO_SEC(query_time) + MICROSECOND(query_time) / 1e6, \
                CAST(rows_examined AS SIGNED), CAST(rows_sent AS SIGNED) \
         FROM mysql.slow_log ORDER BY start_time",
    )
    .fetch_all(pool)
    .await?;
    for (statement, seconds, examined, sent) in slow {
        println!(
            "      {:>8.1} ms  examined {examined:>8}  sent {sent:>6}  {statement}",
            seconds * 1e3
        );
    }
    Ok(())
}

struct Route {
    path: String,
    console: bool,
}

fn routes(letter: u64, job: u64, withdrawal: u64, symbol: &str, partner: u64) -> Vec<Route> {
    let api = |path: String| Route {
        path,
        console: false,
    };
    let console = |path: String| Route {
        path,
        console: true,
    };
    vec![
        api("/v1/admin/overview".into()),
        api("/v1/admin/activity".into()),
        api("/v1/admin/activity?window=day".into()),
        api("/v1/admin/search?q=0xbench7".into()),
        api(format!("/v1/admin/search?q={job}")),
        api("/v1/admin/dead-letters".into()),
        api("/v1/admin/dead-letters?status=NEW&function=confirm-withdrawal&reason=rejected".into()),
        api("/v1/admin/dead-letters/groups".into()),
        api("/v1/admin/dead-letters/dry-run?function=confirm-withdrawal&reason=rejected".into()),
        api(format!("/v1/admin/dead-letters/{letter}")),
        api("/v1/admin/dead-letters/operations".into()),
        api("/v1/admin/charge-event-jobs".into()),
        api("/v1/admin/charge-event-jobs?status=FAILED".into()),
        api(format!("/v1/admin/charge-event-jobs/{job}")),
        api(format!("/v1/admin/trace/bonus-job/{job}")),
        api(format!("/v1/admin/trace/withdrawal/{withdrawal}")),
        api(format!("/v1/admin/markets/{symbol}/suspension")),
        api("/v1/admin/ops-log".into()),
        api("/v1/admin/approvals".into()),
        api("/v1/admin/audit/status".into()),
        api("/v1/admin/audit/findings".into()),
        api("/v1/admin/audit/passes".into()),
        api("/v1/admin/functions".into()),
        api("/v1/admin/partners".into()),
        api(format!("/v1/admin/partners/{partner}")),
        api(format!("/v1/admin/partners/{partner}/notifications")),
        api(format!("/v1/admin/partners/{partner}/api-keys")),
        api("/metrics".into()),
        console("/console/overview".into()),
        console("/console/dead-letters".into()),
        console("/console/dead-letters/group?function=confirm-withdrawal&reason=rejected".into()),
        console(format!("/console/trace?kind=bonus-job&id={job}")),
        console(format!("/console/trace?kind=withdrawal&id={withdrawal}")),
        console("/console/approvals".into()),
        console("/console/jobs".into()),
        console("/console/suspensions".into()),
        console("/console/audit".into()),
        console("/console/overview?window=day".into()),
        console("/console/search?q=0xbench7".into()),
        console("/console/partners".into()),
        console(format!("/console/partners/{partner}")),
    ]
}

/// How the bench asks: the admin API with the token, the console with a session opened
/// with it.
struct Auth<'a> {
    token: &'a str,
    console_session: &'a str,
}

/// A console session for `token`'s holder, opened with the login page's break-glass form
/// (the bench's API has break-glass on): the `paybus_console` cookie's value.
async fn console_session(base: &str, token: &str) -> anyhow::Result<String> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    // A JWT is base64url and dots: nothing to escape in a form.
    let answer = http
        .post(format!("{base}/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}"))
        .send()
        .await?;
    ensure!(
        answer.status() == 303,
        "the console's login: {}",
        answer.status()
    );
    answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .find_map(|cookie| cookie.strip_prefix("paybus_console=")?.split(';').next())
        .filter(|secret| !secret.is_empty())
        .map(str::to_owned)
        .context("the console's login set no session cookie")
}

async fn get(
    http: &reqwest::Client,
    base: &str,
    auth: &Auth<'_>,
    route: &Route,
) -> anyhow::Result<()> {
    let request = http.get(format!("{base}{}", route.path));
    let request = if route.console {
        request.header("cookie", format!("paybus_console={}", auth.console_session))
    } else {
        request.bearer_auth(auth.token)
    };
    let response = request.send().await?;
    let status = response.status();
    let body = response.bytes().await?;
    ensure!(
        status == 200,
        "GET {}: {status} {}",
        route.path,
        String::from_utf8_lossy(&body)
    );
    Ok(())
}

/// Asks the route once with the general log on and prints each SELECT it ran: how often,
/// what one execution costs on its own, and its plan.
async fn explain_route(
    pool: &MySqlPool,
    http: &reqwest::Client,
    base: &str,
    auth: &Auth<'_>,
    route: &Route,
) -> anyhow::Result<()> {
    execute_each(
        pool,
        &[
            "TRUNCATE TABLE mysql.general_log",
            "SET GLOBAL general_log = 1",
        ],
    )
    .await?;
    let asked = get(http, base, auth, route).await;
    sqlx::query("SET GLOBAL general_log = 0")
        .execute(pool)
        .await?;
    asked?;
    // Bytes, not text: the log is the server's, and another client's statement may carry
    // binary parameters that no character set converts.
    let logged: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT argument FROM mysql.general_log \
         WHERE command_type IN ('Query', 'Execute') ORDER BY event_time",
    )
    .fetch_all(pool)
    .await
    .context("reading the general log (the bench needs SUPER on the database)")?;
    let statements = logged
        .iter()
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned());
    // A statement the log shows with `?` has no plan of its own: the same shape with
    // literals, if logged, stands for it.
    let mut shapes = std::collections::BTreeMap::<String, Shape>::new();
    let mut order = Vec::new();
    for statement in statements {
        let trimmed = statement.trim();
        if !trimmed.to_ascii_uppercase().starts_with("SELECT") || trimmed.contains("general_log") {
            continue;
        }
        let shape = shape_of(trimmed);
        let entry = shapes.entry(shape.clone()).or_insert_with(|| {
            order.push(shape);
            Shape {
                times: 0,
                statement: trimmed.to_owned(),
            }
        });
        entry.times += 1;
        if entry.statement.contains('?') && !trimmed.contains('?') {
            entry.statement = trimmed.to_owned();
        }
    }
    println!("\n{}", route.path);
    for shape in order {
        let Shape { times, statement } = &shapes[&shape];
        let shown: String = statement.split_whitespace().collect::<Vec<_>>().join(" ");
        // Run once more on its own, timed from here: what one execution costs.
        let once = if statement.contains('?') {
            "not timed (logged with placeholders)".to_owned()
        } else {
            let started = Instant::now();
            sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
                .fetch_all(pool)
                .await?;
            format!("{:.2?} once", started.elapsed())
        };
        println!("  {shown}\n    x{times} in the request; {once}");
        let plan = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {statement}")))
            .fetch_all(pool)
            .await;
        match plan {
            Ok(rows) => {
                for row in rows {
                    let text = |name: &str| -> String {
                        row.try_get::<Option<String>, _>(name)
                            .ok()
                            .flatten()
                            .unwrap_or_default()
                    };
                    let estimate = row
                        .try_get::<Option<u64>, _>("rows")
                        .ok()
                        .flatten()
                        .map(|r| r.to_string())
                        .or_else(|| {
                            row.try_get::<Option<i64>, _>("rows")
                                .ok()
                                .flatten()
                                .map(|r| r.to_string())
                        })
                        .or_else(|| row.try_get::<Option<String>, _>("rows").ok().flatten())
                        .unwrap_or_default();
                    println!(
                        "      {:<14} type={:<7} key={:<48} rows={:<9} {}",
                        text("table"),
                        text("type"),
                        text("key"),
                        estimate,
                        text("Extra")
                    );
                }
            }
            Err(error) => println!("      (no plan: {error})"),
        }
    }
    Ok(())
}

struct Shape {
    times: usize,
    statement: String,
}

/// A statement with its literals and placeholders blanked alike, so the per-row repeats of one query count as one.
fn shape_of(statement: &str) -> String {
    let mut shape = String::with_capacity(statement.len());
    let mut in_string = false;
    for c in statement.chars() {
        match (in_string, c) {
            (false, '\'') => {
                in_string = true;
                shape.push('#');
            }
            (false, '?') => shape.push('#'),
            (true, '\'') => in_string = false,
            (true, _) => {}
            (false, c) if c.is_ascii_digit() => {
                if !shape.ends_with('#') {
                    shape.push('#');
                }
            }
            (false, c) => shape.push(c),
        }
    }
    shape
}

/// The numbers `0..1_000_000` (six digits tables), filtered to `[start, end)` by the caller.
const MILLION: &str = "(SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d \
                              + 100000 * g.d AS n \
                       FROM bench_digits a, bench_digits b, bench_digits c, bench_digits e, \
                            bench_digits f, bench_digits g) numbers";

/// Runs `insert` (with `{numbers}` for the numbers table and `?`, `?` for the range) over
/// `0..count` in steps, each number offset by the million it falls in.
async fn load(pool: &MySqlPool, what: &str, count: u64, insert: &str) -> anyhow::Result<()> {
    let mut start = 0;
    while start < count {
        let end = (start + LOAD_STEP)
            .min(count)
            .min((start / 1_000_000 + 1) * 1_000_000);
        let million = start / 1_000_000 * 1_000_000;
        let sql = insert
            .replace("{numbers}", MILLION)
            .replace("{n}", &format!("({million} + n)"));
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(start - million)
            .bind(end - million)
            .execute(pool)
            .await
            .with_context(|| format!("loading {what} {start}..{end}"))?;
        start = end;
    }
    Ok(())
}

/// A thousand partners (every tenth with its breaker open, every tenth but one disabled by a
/// 410, three keys each) and `rows` notifications over the first ten, each with one delivery
/// attempt (a 200, or a 500 for the FAILED percent). Returns the first partner, the busiest.
async fn load_partner_notifications(pool: &MySqlPool, rows: u64) -> anyhow::Result<u64> {
    load(
        pool,
        "partners",
        1_000,
        "INSERT INTO partners (name, webhook_url, webhook_failures, webhook_open_until, \
         webhook_opened_at, webhook_disabled_at, webhook_disabled_reason) \
         SELECT CONCAT('bench partner ', n), CONCAT('https://partner-', n, '.example/hooks'), \
                IF(n % 10 = 1, 5, 0), IF(n % 10 = 1, NOW(6) + INTERVAL 10 MINUTE, NULL), \
                IF(n % 10 = 1, NOW(6), NULL), IF(n % 10 = 2, NOW(6), NULL), \
                IF(n % 10 = 2, 'HTTP 410 Gone from the endpoint', NULL) \
         FROM {numbers} WHERE n >= ? AND n < ?",
    )
    .await?;
    let first: u64 =
        sqlx::query_scalar("SELECT MIN(id) FROM partners WHERE name LIKE 'bench partner %'")
            .fetch_one(pool)
            .await?;
    load(
        pool,
        "partner API keys",
        3_000,
        &format!(
            "INSERT INTO partner_api_keys (partner_id, secret_hash, label, created_by, \
             expires_at, last_used_at) \
             SELECT {first} + n % 1000, UNHEX(SHA2(n, 256)), CONCAT('bench key ', n), 'bench', \
                    IF(n >= 2000, NOW(6) + INTERVAL 1 DAY, NULL), NOW(6) \
             FROM {{numbers}} WHERE n >= ? AND n < ?"
        ),
    )
    .await?;
    load(
        pool,
        "partner notifications",
        rows,
        &format!(
            "INSERT INTO partner_notifications (partner_id, event, reference_type, reference_id, \
             payload, status, attempts, next_attempt_at, last_error, delivered_at) \
             SELECT {first} + {{n}} % 10, 'WITHDRAWAL_CONFIRMED', 'WITHDRAWAL', {{n}}, \
                    CONCAT('{{\"withdrawal_id\":', {{n}}, '}}'), \
                    IF({{n}} % 100 = 99, 'FAILED', 'DELIVERED'), 1, NULL, \
                    IF({{n}} % 100 = 99, 'HTTP 500', NULL), \
                    IF({{n}} % 100 = 99, NULL, NOW(6)) \
             FROM {{numbers}} WHERE n >= ? AND n < ?"
        ),
    )
    .await?;
    let (low, high): (u64, u64) =
        sqlx::query_as("SELECT MIN(id), MAX(id) FROM partner_notifications")
            .fetch_one(pool)
            .await?;
    let mut from = low;
    while from <= high {
        sqlx::query(
            "INSERT INTO partner_notification_attempts (notification_id, partner_id, attempt, \
             started_at, status_code, latency_ms, error) \
             SELECT id, partner_id, 1, created_at, IF(status = 'FAILED', 500, 200), 40, \
                    IF(status = 'FAILED', 'HTTP 500', NULL) \
             FROM partner_notifications WHERE id >= ? AND id < ?",
        )
        .bind(from)
        .bind(from + LOAD_STEP)
        .execute(pool)
        .await
        .with_context(|| format!("loading delivery attempts from notification {from}"))?;
        from += LOAD_STEP;
    }
    Ok(first)
}

/// A partner and its BROADCASTING withdrawals: (first id, last id).
async fn load_withdrawals(pool: &MySqlPool) -> anyhow::Result<(u64, u64)> {
    let partner = sqlx::query("INSERT INTO partners (name) VALUES ('ops-queries bench')")
        .execute(pool)
        .await?
        .last_insert_id();
    load(
        pool,
        "withdrawals",
        WITHDRAWALS,
        &format!(
            "INSERT INTO withdrawals (partner_id, kind, status, currency, amount, to_address, \
             tx_hash) \
             SELECT {partner}, 'NORMAL', 'BROADCASTING', 'USDT', 10 + {{n}} % 990, 'T-bench', \
                    CONCAT('0xbench', {{n}}) \
             FROM {{numbers}} WHERE n >= ? AND n < ?"
        ),
    )
    .await?;
    let (first, last): (u64, u64) =
        sqlx::query_as("SELECT MIN(id), MAX(id) FROM withdrawals WHERE partner_id = ?")
            .bind(partner)
            .fetch_one(pool)
            .await?;
    Ok((first, last))
}

/// `rows` letters over 90 days, oldest first: one in ten NEW, the rest ARCHIVED or REPLAYED;
/// confirm-withdrawal's carry real bodies about the withdrawals, the others' are unreadable.
async fn load_dead_letters(
    pool: &MySqlPool,
    rows: u64,
    (first_withdrawal, _): (u64, u64),
) -> anyhow::Result<()> {
    let message = Envelope::new(WithdrawalTxConfirmed {
        withdrawal_id: PLACEHOLDER_ID,
        tx_hash: "0xbench".to_owned(),
    })
    .to_outgoing()?;
    let template = String::from_utf8(message.body.clone())?;
    ensure!(
        template.contains(&PLACEHOLDER_ID.to_string()),
        "the envelope does not carry the withdrawal id as written: {template}"
    );
    let seconds_per_row = (90 * 86_400 / rows).max(1);
    load(
        pool,
        "dead letters",
        rows,
        &format!(
            "INSERT INTO dead_letters (dead_letter_id, function_name, message_id, routing_key, \
             reason, error, attempts, body, failed_at, status, replayed_at, archived_at) \
             SELECT CONCAT('bench-dl-', {{n}}), \
                    ELT(1 + {{n}} % 4, 'confirm-withdrawal', 'confirm-withdrawal', \
                        'deliver-webhook', 'grant-bonus'), \
                    CONCAT('bench-', {{n}}), '{routing_key}', \
                    ELT(1 + {{n}} % 3, 'rejected', 'retries-exhausted', 'delivery-limit'), \
                    'the bench wrote it', 3, \
                    IF({{n}} % 4 < 2, REPLACE('{template}', '{PLACEHOLDER_ID}', \
                       {first_withdrawal} + {{n}} % {WITHDRAWALS}), '{{}}'), \
                    TIMESTAMPADD(SECOND, -CAST({seconds_per_row} * ({rows} - {{n}}) AS SIGNED), NOW(6)), \
                    ELT(1 + IF({{n}} % 10 = 0, 0, 1 + {{n}} % 2), 'NEW', 'ARCHIVED', 'REPLAYED'), \
                    IF({{n}} % 10 <> 0 AND {{n}} % 2 = 1, NOW(6), NULL), \
                    IF({{n}} % 10 <> 0 AND {{n}} % 2 = 0, NOW(6), NULL) \
             FROM {{numbers}} WHERE n >= ? AND n < ?",
            routing_key = message.routing_key,
            template = template.replace('\'', "''"),
        ),
    )
    .await
}

/// A failure for each letter, when it failed (what the recorder writes beside a letter).
async fn load_failures(pool: &MySqlPool) -> anyhow::Result<()> {
    let (first, last): (Option<u64>, Option<u64>) =
        sqlx::query_as("SELECT MIN(id), MAX(id) FROM dead_letters")
            .fetch_one(pool)
            .await?;
    let (Some(mut from), Some(last)) = (first, last) else {
        return Ok(());
    };
    while from <= last {
        sqlx::query(
            "INSERT INTO dead_letter_failures (failure_id, dead_letter_id, failed_at) \
             SELECT CONCAT('bench-f-', id), dead_letter_id, failed_at FROM dead_letters \
             WHERE id >= ? AND id < ?",
        )
        .bind(from)
        .bind(from + LOAD_STEP)
        .execute(pool)
        .await
        .with_context(|| format!("loading dead-letter failures from letter {from}"))?;
        from += LOAD_STEP;
    }
    Ok(())
}

/// Eight days (the retention) of every function's minutes and the sampler's rows: what the
/// charts read from.
async fn load_activity(pool: &MySqlPool) -> anyhow::Result<()> {
    const MINUTES: u64 = 8 * 1_440;
    for function in paybus_catalog::FUNCTIONS {
        load(
            pool,
            "function activity",
            MINUTES,
            &format!(
                "INSERT INTO function_activity (function_name, minute_at, done, skipped, \
                 retried, failed, dead_letters) \
                 SELECT '{name}', TIMESTAMPADD(MINUTE, -CAST({{n}} AS SIGNED), \
                        DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%d %H:%i:00')), \
                        600 + {{n}} % 120, {{n}} % 7, {{n}} % 3, {{n}} % 11 DIV 10, \
                        {{n}} % 11 DIV 10 \
                 FROM {{numbers}} WHERE n >= ? AND n < ?",
                name = function.name
            ),
        )
        .await?;
        for queue in paybus_catalog::queues(&Default::default())
            .iter()
            .filter(|q| q.function == function.name)
        {
            load(
                pool,
                "queue samples",
                MINUTES,
                &format!(
                    "INSERT INTO queue_samples (minute_at, queue_name, ready, consumers) \
                     SELECT TIMESTAMPADD(MINUTE, -CAST({{n}} AS SIGNED), \
                            DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%d %H:%i:00')), \
                            '{queue}', {{n}} % 50, 1 \
                     FROM {{numbers}} WHERE n >= ? AND n < ?",
                    queue = queue.queue()
                ),
            )
            .await?;
        }
    }
    load(
        pool,
        "outbox samples",
        MINUTES,
        "INSERT INTO outbox_samples (minute_at, backlog, oldest_seconds) \
         SELECT TIMESTAMPADD(MINUTE, -CAST({n} AS SIGNED), \
                DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%d %H:%i:00')), {n} % 40, {n} % 5 \
         FROM {numbers} WHERE n >= ? AND n < ?",
    )
    .await
}

/// `rows` jobs of 1,000 members: 98 % DONE, the rest PENDING, FAILED or PROCESSING. Returns
/// a FAILED job's id (what an operator traces).
async fn load_bonus_jobs(pool: &MySqlPool, rows: u64) -> anyhow::Result<u64> {
    load(
        pool,
        "members",
        1_000,
        "INSERT INTO members (nickname) SELECT CONCAT('bench-', n) FROM {numbers} \
         WHERE n >= ? AND n < ?",
    )
    .await?;
    let first_member: u64 = sqlx::query_scalar("SELECT MIN(id) FROM members")
        .fetch_one(pool)
        .await?;
    load(
        pool,
        "charges",
        1_000,
        &format!(
            "INSERT INTO charges (member_id, status, cans, price, payment_gateway, container, \
             method, payment_status, completed_at) \
             SELECT {first_member} + n, 'CHARGE', 10, 1000, 'PG', 'pg', 'card', 'COMPLETE', NOW(6) \
             FROM {{numbers}} WHERE n >= ? AND n < ?"
        ),
    )
    .await?;
    let first_charge: u64 = sqlx::query_scalar("SELECT MIN(id) FROM charges")
        .fetch_one(pool)
        .await?;
    load(
        pool,
        "bonus jobs",
        rows,
        &format!(
            "INSERT INTO charge_event_job (source_charge_id, result_charge_id, member_id, \
             job_type, idempotency_key, additional_can, payment_gateway, container, \
             method_snapshot, status, retry_count, next_retry_at, processing_started_at, \
             processed_at, last_error) \
             SELECT {first_charge} + {{n}} % 1000, \
                    IF({{n}} % 100 < 98, {first_charge} + {{n}} % 1000, NULL), \
                    {first_member} + {{n}} % 1000, 'FIRST_CHARGE', \
                    CONCAT('bench-job-', {{n}}), 5, 'PG', 'pg', 'first charge', \
                    CASE WHEN {{n}} % 100 < 98 THEN 'DONE' WHEN {{n}} % 100 = 98 THEN 'PENDING' \
                         WHEN {{n}} % 200 = 199 THEN 'PROCESSING' ELSE 'FAILED' END, \
                    IF({{n}} % 100 >= 98, 3, 0), \
                    IF({{n}} % 100 = 98, NOW(6), NULL), \
                    IF({{n}} % 200 = 199, NOW(6), NULL), \
                    IF({{n}} % 100 < 98, NOW(6), NULL), \
                    IF({{n}} % 100 >= 98, 'the bench failed it', NULL) \
             FROM {{numbers}} WHERE n >= ? AND n < ?"
        ),
    )
    .await?;
    let job: u64 =
        sqlx::query_scalar("SELECT MAX(id) FROM charge_event_job WHERE status = 'FAILED'")
            .fetch_one(pool)
            .await?;
    Ok(job)
}

/// `rows` tasks over fifty suspended markets' batches, the last batch half done. Returns the
/// last market's symbol.
async fn load_tasks(pool: &MySqlPool, rows: u64) -> anyhow::Result<String> {
    let per_batch = rows / MARKETS;
    let mut symbol = String::new();
    for m in 0..MARKETS {
        symbol = format!("OPSQ{m}");
        let last = m + 1 == MARKETS;
        let market = sqlx::query(
            "INSERT INTO markets (symbol, status, suspended_at) VALUES (?, 'SUSPENDED', NOW(6))",
        )
        .bind(&symbol)
        .execute(pool)
        .await?
        .last_insert_id();
        let batch = sqlx::query(
            "INSERT INTO task_batches (type, market_id, ref, reason, max_target_id, \
             materialise_cursor, created_count, materialised_at, closed_at) \
             VALUES ('CANCEL_OPEN_ORDER', ?, ?, 'SUSPENDED', ?, ?, ?, NOW(6), \
                     IF(?, NULL, NOW(6)))",
        )
        .bind(market)
        .bind(&symbol)
        .bind(per_batch)
        .bind(per_batch)
        .bind(per_batch)
        .bind(last)
        .execute(pool)
        .await?
        .last_insert_id();
        sqlx::query("UPDATE markets SET current_batch_id = ? WHERE id = ?")
            .bind(batch)
            .bind(market)
            .execute(pool)
            .await?;
        let done_below = if last { per_batch / 2 } else { per_batch };
        load(
            pool,
            "tasks",
            per_batch,
            &format!(
                "INSERT INTO tasks (type, batch_id, target_id, state, attempts, next_attempt_at, \
                 finished_at) \
                 SELECT 'CANCEL_OPEN_ORDER', {batch}, 1 + {{n}}, \
                        IF({{n}} < {done_below}, 'DONE', 'PENDING'), \
                        IF({{n}} < {done_below}, 1, 0), \
                        IF({{n}} < {done_below}, NULL, NOW(6)), \
                        IF({{n}} < {done_below}, NOW(6), NULL) \
                 FROM {{numbers}} WHERE n >= ? AND n < ?"
            ),
        )
        .await?;
    }
    Ok(symbol)
}
