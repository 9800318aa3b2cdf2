//! `paybus-lab bench auditor --items 1000000`: one continuous-auditor pass over a ledger of
//! `--items` entries (written a day ago) plus the last minute's 1,000, and over W1–W4's tables
//! holding `--items / 10` rows each (a day old) plus the last minute's 100 — deposits, sellers'
//! and buyers' orders with their matches, members with their charges, a closed suspension's
//! orders and tasks, all consistent — against the full audit (`paybus audit`) of the same rows
//! in the same run, in all and check by check. The auditor's cost should follow the window,
//! not the tables: the ratios say how much of the full audit's cost it pays.

use std::time::{Duration, Instant};

use paybus_maintenance::auditor::{Auditor, AuditorConfig};
use paybus_ops::audit;
use paybus_testkit::TestEnv;
use sqlx::MySqlPool;

use super::{BenchArgs, Phase};

const PARTNERS: u64 = 100;
/// The entries written "in the last minute": what a pass reads.
const RECENT: u64 = 1_000;
const CHUNK: u64 = 100_000;
/// Each workflow table holds a tenth of the ledger's rows (old and recent alike).
const WORKFLOW_SHARE: u64 = 10;
const DAY: Duration = Duration::from_secs(86_400);

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    if let Some(url) = &args.database_url {
        return on_existing_database(url).await;
    }
    let env = TestEnv::new().await;
    let pool = &env.db;
    let old = args.items as u64;
    println!(
        "writing {old} ledger entries a day old and {RECENT} recent over {PARTNERS} partners ..."
    );
    let started = Instant::now();
    fill(pool, old, RECENT).await?;
    let (old_rows, recent_rows) = (old / WORKFLOW_SHARE, RECENT / WORKFLOW_SHARE);
    println!(
        "writing every workflow's rows: {old_rows} a day old and {recent_rows} recent in each table ..."
    );
    fill_workflows(pool, old_rows, recent_rows).await?;
    println!("  written in {:.1?}", started.elapsed());
    let checks = paybus_catalog::audit_checks();

    let auditor = Auditor::new(pool.clone(), checks.clone(), AuditorConfig::default());
    auditor.pass().await?; // warm the buffer pool as the full audit will be
    let started = Instant::now();
    let pass = auditor.pass().await?;
    let windowed = Phase {
        name: "auditor pass (15 min window, every check)",
        unit: "passes",
        count: 1,
        elapsed: started.elapsed(),
        statements: None,
    };
    let started = Instant::now();
    let mut conn = pool.acquire().await?;
    let full = audit::run(&mut conn, &checks).await?;
    let baseline = Phase {
        name: "full audit (paybus audit, every check)",
        unit: "passes",
        count: 1,
        elapsed: started.elapsed(),
        statements: None,
    };
    windowed.print();
    baseline.print();
    println!(
        "auditor pass / full audit: {:.3} of the time ({} entries in all; violations: pass {}, full {})",
        windowed.elapsed.as_secs_f64() / baseline.elapsed.as_secs_f64().max(f64::EPSILON),
        old + RECENT,
        pass.violations.len(),
        full.len()
    );
    if !pass.violations.is_empty() || !full.is_empty() {
        anyhow::bail!("the generated rows should be clean: {:?}", pass.violations);
    }
    by_check(pool, &checks, pass.window_since).await
}

/// Every check on a database as it is, the auditor's default window ending at its latest
/// ledger entry (a finished soak's database has no "now" of its own).
async fn on_existing_database(url: &str) -> anyhow::Result<()> {
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    let latest: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT MAX(created_at) FROM ledger_entries")
            .fetch_one(&pool)
            .await?;
    let latest = latest.ok_or_else(|| anyhow::anyhow!("no ledger entry: nothing to time"))?;
    // What a pass reads once passes follow each other (the settings from the environment).
    let span = AuditorConfig::from_env()?.steady_span();
    let since = latest - span;
    println!("the span of a steady pass ({span:?}): {since} to {latest}");
    by_check(&pool, &paybus_catalog::audit_checks(), since).await
}

/// Each check's windowed form against its full form, over the same rows.
async fn by_check(
    pool: &MySqlPool,
    checks: &[audit::Check],
    since: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<()> {
    println!(
        "{:<28} {:>12} {:>12} {:>8}",
        "check", "windowed", "full", "ratio"
    );
    let mut conn = pool.acquire().await?;
    for check in checks {
        let Some(recent) = check.recent else {
            anyhow::bail!("{} has no windowed form", check.name);
        };
        let started = Instant::now();
        recent(&mut conn, audit::Window { since }).await?;
        let windowed = started.elapsed();
        let started = Instant::now();
        (check.run)(&mut conn).await?;
        let full = started.elapsed();
        println!(
            "{:<28} {:>12.2?} {:>12.2?} {:>8.3}",
            check.name,
            windowed,
            full,
            windowed.as_secs_f64() / full.as_secs_f64().max(f64::EPSILON)
        );
    }
    Ok(())
}

/// Inserts `count` rows numbered `first..first + count` (`k` in `values`, SQL over the row's
/// number; `{at}` is replaced by the rows' time, `age` ago) with `insert` (`INSERT INTO t
/// (columns)`), 100,000 a statement.
pub(super) async fn generate(
    pool: &MySqlPool,
    insert: &str,
    values: &str,
    first: u64,
    count: u64,
    age: Duration,
) -> anyhow::Result<()> {
    let values = values.replace(
        "{at}",
        &format!("NOW(6) - INTERVAL {} SECOND", age.as_secs()),
    );
    let mut done = 0;
    while done < count {
        let n = CHUNK.min(count - done);
        // n rows from a 100 x 100 x 10 cross join of a 0..99 sequence (runs on MySQL 8's
        // default recursion depth too).
        let sql = format!(
            "{insert} WITH RECURSIVE d (i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM d WHERE i < 99), \
             n (k) AS (SELECT ? + a.i * 10000 + b.i * 100 + c.i FROM d a, d b, d c \
                       WHERE a.i < 10) \
             SELECT {values} FROM n WHERE k < ? ORDER BY k"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(first + done)
            .bind(first + done + n)
            .execute(pool)
            .await?;
        done += n;
    }
    Ok(())
}

/// Consistent rows for every workflow's checks to read, `old` a day old then `recent` now, in
/// each table: FAILED deposits (W2); OPEN sellers' orders, EXPIRED buyers' orders and a
/// RELEASED match between each pair (W1); members holding the 10 cans of their COMPLETE
/// purchase (W3); per phase a market whose suspension is over, its orders CANCELLED by their
/// DONE tasks (W4). Row `k` has id `k + 1` in every table.
async fn fill_workflows(pool: &MySqlPool, old: u64, recent: u64) -> anyhow::Result<()> {
    let mut first = 0;
    for (phase, (count, age)) in [(old, DAY), (recent, Duration::ZERO)]
        .into_iter()
        .enumerate()
    {
        let market = phase as u64 + 1;
        generate(
            pool,
            "INSERT INTO deposits (id, partner_id, currency, amount, fee, tx_hash, to_address, \
             status, created_at, updated_at)",
            "k + 1, 1 + k % 100, 'USDT', 1, 0, CONCAT('0xbench', k), 'T-bench', 'FAILED', \
             {at}, {at}",
            first,
            count,
            age,
        )
        .await?;
        generate(
            pool,
            "INSERT INTO p2p_withdraw_orders (id, partner_id, currency, amount, \
             remaining_amount, created_at, updated_at)",
            "k + 1, 1 + k % 100, 'USDT', 10, 10, {at}, {at}",
            first,
            count,
            age,
        )
        .await?;
        generate(
            pool,
            "INSERT INTO p2p_deposit_orders (id, partner_id, currency, amount, \
             remaining_amount, status, expires_at, closed_at, close_reason, created_at, \
             updated_at)",
            "k + 1, 1 + k % 100, 'USDT', 10, 10, 'EXPIRED', {at}, {at}, 'EXPIRED', {at}, {at}",
            first,
            count,
            age,
        )
        .await?;
        generate(
            pool,
            "INSERT INTO p2p_matches (id, deposit_order_id, withdraw_order_id, amount, \
             trade_key, status, release_reason, reserved_at, released_at, updated_at)",
            "k + 1, k + 1, k + 1, 10, CONCAT('bench-', k), 'RELEASED', 'ORDER_CLOSED', {at}, {at}, \
             {at}",
            first,
            count,
            age,
        )
        .await?;
        generate(
            pool,
            "INSERT INTO members (id, nickname, pg_can, created_at, updated_at)",
            "k + 1, CONCAT('bench ', k), 10, {at}, {at}",
            first,
            count,
            age,
        )
        .await?;
        generate(
            pool,
            "INSERT INTO charges (id, member_id, status, cans, price, payment_gateway, \
             container, method, payment_status, completed_at, created_at, updated_at)",
            "k + 1, k + 1, 'CHARGE', 10, 1000, 'PG', 'pg', 'card', 'COMPLETE', {at}, {at}, {at}",
            first,
            count,
            age,
        )
        .await?;
        // W4: a market, its orders cancelled by a closed suspension's DONE tasks.
        sqlx::query("INSERT INTO markets (id, symbol) VALUES (?, ?)")
            .bind(market)
            .bind(format!("BENCH-{market}"))
            .execute(pool)
            .await?;
        generate(
            pool,
            "INSERT INTO orders (id, market_id, account_id, side, price, quantity, status, \
             cancel_reason, cancelled_at, created_at, updated_at)",
            &format!(
                "k + 1, {market}, 1 + k % 97, 'BUY', 100, 1, 'CANCELLED', 'HALT', {{at}}, \
                 {{at}}, {{at}}"
            ),
            first,
            count,
            age,
        )
        .await?;
        sqlx::query(
            "INSERT INTO task_batches (id, type, market_id, ref, reason, max_target_id, \
             materialise_cursor, created_count, materialised_at, closed_at, created_at) \
             VALUES (?, 'CANCEL_OPEN_ORDER', ?, ?, 'HALT', ?, ?, ?, \
                     NOW(6) - INTERVAL ? SECOND, NOW(6) - INTERVAL ? SECOND, \
                     NOW(6) - INTERVAL ? SECOND)",
        )
        .bind(market)
        .bind(market)
        .bind(format!("BENCH-{market}"))
        .bind(first + count)
        .bind(first + count)
        .bind(count)
        .bind(age.as_secs())
        .bind(age.as_secs())
        .bind(age.as_secs())
        .execute(pool)
        .await?;
        generate(
            pool,
            "INSERT INTO tasks (id, type, batch_id, target_id, state, next_attempt_at, \
             finished_at, created_at, updated_at)",
            &format!(
                "k + 1, 'CANCEL_OPEN_ORDER', {market}, k + 1, 'DONE', NULL, {{at}}, {{at}}, {{at}}"
            ),
            first,
            count,
            age,
        )
        .await?;
        first += count;
    }
    Ok(())
}

/// `old` CREDITs of 1 created a day ago, then `recent` created now, spread over the partners
/// with a correct chain and balance (`balance_after` = the entry's position in its chain).
async fn fill(pool: &MySqlPool, old: u64, recent: u64) -> anyhow::Result<()> {
    for partner in 1..=PARTNERS {
        sqlx::query("INSERT INTO partners (id, name) VALUES (?, ?)")
            .bind(partner)
            .bind(format!("bench {partner}"))
            .execute(pool)
            .await?;
        // The gate row first (the entries' foreign key); its balance is set at the end.
        sqlx::query("INSERT INTO partner_balances (partner_id, currency) VALUES (?, 'USDT')")
            .bind(partner)
            .execute(pool)
            .await?;
    }
    let mut written = 0;
    for (count, age) in [(old, Duration::from_secs(86_400)), (recent, Duration::ZERO)] {
        let mut done = 0;
        while done < count {
            let n = CHUNK.min(count - done);
            // n rows from a 100 x 100 x 10 cross join of a 0..99 sequence (runs on MySQL 8's
            // default recursion depth too).
            sqlx::query(
                "INSERT INTO ledger_entries (partner_id, currency, entry_type, amount, \
                     balance_after, reference_type, reference_id, created_at) \
                 WITH RECURSIVE d (i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM d WHERE i < 99), \
                 n (k) AS (SELECT a.i * 10000 + b.i * 100 + c.i FROM d a, d b, d c \
                           WHERE a.i < 10) \
                 SELECT 1 + (? + k) % ?, 'USDT', 'CREDIT', 1, FLOOR((? + k) / ?) + 1, \
                        'MIGRATION', ? + k, NOW(6) - INTERVAL ? SECOND \
                 FROM n WHERE k < ? ORDER BY k",
            )
            .bind(written)
            .bind(PARTNERS)
            .bind(written)
            .bind(PARTNERS)
            .bind(written)
            .bind(age.as_secs())
            .bind(n)
            .execute(pool)
            .await?;
            done += n;
            written += n;
        }
    }
    sqlx::query(
        "UPDATE partner_balances b \
         JOIN (SELECT partner_id, COUNT(*) AS n FROM ledger_entries GROUP BY partner_id) e \
           ON e.partner_id = b.partner_id \
         SET b.balance = e.n",
    )
    .execute(pool)
    .await?;
    Ok(())
}
