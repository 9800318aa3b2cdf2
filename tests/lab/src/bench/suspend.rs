//! `paybus-lab bench suspend`: W4's two claims, measured in one run on this database.
//!
//! 1. **The suspend request is flat in N**: its latency over HTTP with 1k, 100k and 1M open
//!    orders (`--open-orders`), next to the seed's in-request loop (UPDATE the market, then
//!    cancel every open order one by one in the same transaction) at 100k.
//! 2. **The bus costs little on top of the cancels**: `--items` orders cancelled end to end
//!    (suspend → materialiser → messages → cancel-orders → complete) next to the same
//!    cancels driven directly on the database at the same concurrency, for one task per
//!    message and for a small group per message.
//!
//! Orders are loaded set-based (`INSERT … SELECT` over a digits table), 100k per statement.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail, ensure};
use paybus_cancel_orders::{Attempts, CancelConfig, CancelOrders, cancel_tasks};
use paybus_markets::{
    grouped, market,
    materialise::{Materialiser, MaterialiserConfig, Plan},
    suspension,
};
use paybus_retry::Clock;
use paybus_runtime::runner::Runner;
use paybus_testkit::TestEnv;
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use super::{BenchApi, BenchArgs, Counters, Phase, bench_services, drive};

/// Orders inserted per statement while loading.
const LOAD_STEP: u64 = 100_000;
/// The seed's loop is measured at this size (the 100k).
const SEED_LOOP_ORDERS: u64 = 100_000;
/// The group sizes compared end to end.
const GROUPS: [usize; 2] = [1, paybus_markets::materialise::DEFAULT_TASKS_PER_MESSAGE];

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    latency(args).await?;
    throughput(args).await
}

/// Part 1: the suspend request's latency against N, and the seed's loop.
async fn latency(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let services = bench_services(&env, args.concurrency).await?;
    create_digits(&services.pool).await?;
    let api = BenchApi::start(&services).await?;
    let (base, token) = (&api.base, &api.token);
    let http = reqwest::Client::new();

    // Every market is loaded before the first request is timed, so no request pays for the
    // flushing of a load that just finished; sizes up to 100k are measured on three markets
    // each (the median is printed), 1M on one.
    let mut markets = Vec::new();
    for &n in &args.open_orders {
        let copies = if n <= SEED_LOOP_ORDERS { 3 } else { 1 };
        let symbols: Vec<String> = (0..copies).map(|c| format!("SUS{n}X{c}")).collect();
        for symbol in &symbols {
            market_with_open_orders(&services.pool, symbol, n).await?;
        }
        markets.push((n, symbols));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "suspend request latency (HTTP, one transaction; median of the markets of each size):"
    );
    let mut latencies = Vec::new();
    for (n, symbols) in &markets {
        let mut timed = Vec::new();
        let mut created_now = serde_json::Value::Null;
        let mut repeat_elapsed = Duration::ZERO;
        for symbol in symbols {
            let suspend = || {
                http.post(format!("{base}/v1/admin/markets/{symbol}/suspend"))
                    .bearer_auth(token)
                    .send()
            };
            let started = Instant::now();
            let response = suspend().await?;
            timed.push(started.elapsed());
            let status = response.status();
            let body: serde_json::Value = response.json().await?;
            ensure!(status == 202, "suspend {symbol}: {status} {body}");
            created_now = body["tasks_created_now"].clone();
            let again = Instant::now();
            let repeat = suspend().await?;
            repeat_elapsed = again.elapsed();
            ensure!(
                repeat.status() == 200,
                "suspend {symbol} again: {}",
                repeat.status()
            );
        }
        timed.sort();
        let median = timed[timed.len() / 2];
        println!(
            "  {:>9} open orders: {median:>8.2?}  (of {timed:.1?}; tasks created in the request: \
             {created_now}; again, already SUSPENDED: {repeat_elapsed:.2?})",
            grouped(*n),
        );
        latencies.push((*n, median));
    }
    if let (Some((small_n, small)), Some((large_n, large))) = (latencies.first(), latencies.last())
    {
        println!(
            "  {} / {} open orders: {:.2}x the latency for {:.0}x the orders",
            grouped(*large_n),
            grouped(*small_n),
            large.as_secs_f64() / small.as_secs_f64(),
            *large_n as f64 / *small_n as f64
        );
    }

    let market_id = market_with_open_orders(&services.pool, "SEEDLOOP", SEED_LOOP_ORDERS).await?;
    let started = Instant::now();
    let cancelled = seed_loop(&services.pool, market_id).await?;
    let seed = started.elapsed();
    ensure!(
        cancelled == SEED_LOOP_ORDERS,
        "the seed's loop cancelled {cancelled}"
    );
    println!(
        "seed's in-request loop, {} open orders: {:.2?} in one request",
        grouped(SEED_LOOP_ORDERS),
        seed
    );
    if let Some((_, ours)) = latencies.iter().find(|(n, _)| *n == SEED_LOOP_ORDERS) {
        println!(
            "  seed loop / suspend at {}: {:.0}x",
            grouped(SEED_LOOP_ORDERS),
            seed.as_secs_f64() / ours.as_secs_f64()
        );
    }
    api.stop().await
}

/// The seed's first design (seed 004): suspend and cancel every open order in the request's
/// one transaction, one UPDATE per order.
async fn seed_loop(pool: &MySqlPool, market_id: u64) -> anyhow::Result<u64> {
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE markets SET status = 'SUSPENDED', suspended_at = NOW(6) WHERE id = ?")
        .bind(market_id)
        .execute(&mut *tx)
        .await?;
    let open: Vec<u64> = sqlx::query_scalar(
        "SELECT id FROM orders WHERE market_id = ? AND status IN ('OPEN', 'PARTIALLY_FILLED')",
    )
    .bind(market_id)
    .fetch_all(&mut *tx)
    .await?;
    let mut cancelled = 0;
    for id in open {
        cancelled += sqlx::query(
            "UPDATE orders SET status = 'CANCELLED', cancel_reason = 'MARKET_SUSPENDED', \
             cancelled_at = NOW(6) WHERE id = ? AND status IN ('OPEN', 'PARTIALLY_FILLED')",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    }
    tx.commit().await?;
    Ok(cancelled)
}

/// Part 2: cancels per second end to end vs direct, one task per message vs a group.
async fn throughput(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let services = bench_services(&env, args.concurrency).await?;
    create_digits(&services.pool).await?;
    let items = u64::try_from(args.items)?;
    let attempts = Attempts {
        policy: CancelConfig::default().retry,
        lease: CancelConfig::default().lease,
        clock: Clock::Database,
    };
    println!(
        "cancels: {} open orders per phase, concurrency {} (direct: worker tasks; end to end: \
         prefetch)",
        grouped(items),
        args.concurrency
    );
    let mut end_to_end_rates = Vec::new();
    for tasks_per_message in GROUPS {
        let plan = Plan {
            tasks_per_message,
            ..Plan::default()
        };

        // Direct: the tasks materialised first (timed apart), then the handler's cancel
        // transactions driven by `concurrency` tasks, one call per message's group.
        let symbol = format!("DIRECT{tasks_per_message}");
        market_with_open_orders(&services.pool, &symbol, items).await?;
        let suspended = suspension::suspend(
            &services.outbox,
            &symbol,
            None,
            &plan,
            &paybus_testkit::person("lab"),
        )
        .await?;
        let materialiser = Materialiser::new(
            services.outbox.clone(),
            MaterialiserConfig {
                plan,
                ..MaterialiserConfig::default()
            },
        );
        let started = Instant::now();
        materialiser.run_once().await?;
        let materialised = started.elapsed();
        // The messages the materialiser published are the end-to-end phase's business.
        purge_cancel_queue(&services).await?;
        let groups: Arc<Vec<Vec<u64>>> = Arc::new(
            task_ids(&services.pool, suspended.batch_id)
                .await?
                .chunks(tasks_per_message)
                .map(<[u64]>::to_vec)
                .collect(),
        );
        let (pool, batch_id) = (services.pool.clone(), suspended.batch_id);
        let counters = Counters::read(&services.pool).await?;
        let elapsed = drive(groups.len(), args.concurrency, {
            let (groups, attempts) = (groups.clone(), attempts.clone());
            move |i| {
                let (pool, groups, attempts) = (pool.clone(), groups.clone(), attempts.clone());
                async move {
                    cancel_tasks(&pool, batch_id, &groups[i], &attempts).await?;
                    Ok(())
                }
            }
        })
        .await?;
        let statements = counters.since(&services.pool).await?;
        ensure_complete(&services.pool, &symbol, items).await?;
        let direct = Phase {
            name: "direct on the database",
            unit: "cancels",
            count: args.items,
            elapsed,
            statements: Some(statements),
        };

        // End to end: the real runtime (consumer, materialiser job, due sweep), from the
        // suspend call until the progress is complete.
        let symbol = format!("E2E{tasks_per_message}");
        market_with_open_orders(&services.pool, &symbol, items).await?;
        let shutdown = CancellationToken::new();
        let mut runner = Runner::new(services.clone());
        runner.add_function(CancelOrders::new(CancelConfig::default()));
        runner.add_job(Arc::new(paybus_cancel_orders::due_tasks(
            &services,
            Default::default(),
        )));
        runner.add_job(Arc::new(Materialiser::new(
            services.outbox.clone(),
            MaterialiserConfig {
                plan,
                ..MaterialiserConfig::default()
            },
        )));
        let running = tokio::spawn(runner.run(shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await; // consumers subscribed
        let counters = Counters::read(&services.pool).await?;
        let started = Instant::now();
        let suspended = suspension::suspend(
            &services.outbox,
            &symbol,
            None,
            &plan,
            &paybus_testkit::person("lab"),
        )
        .await?;
        let deadline = started + Duration::from_secs(1_800);
        while !batch_finished(&services.pool, suspended.batch_id).await? {
            if Instant::now() > deadline {
                bail!("{symbol}: not complete after 30 minutes");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let elapsed = started.elapsed();
        // Includes the progress polls above (one SELECT each 20 ms).
        let statements = counters.since(&services.pool).await?;
        shutdown.cancel();
        running.await??;
        ensure_complete(&services.pool, &symbol, items).await?;
        let end_to_end = Phase {
            name: "end to end (suspend → complete)",
            unit: "cancels",
            count: args.items,
            elapsed,
            statements: Some(statements),
        };

        println!("{tasks_per_message} task(s) per message:");
        println!(
            "  materialising {} tasks (the materialiser job, chunks of {}): {materialised:.2?}",
            grouped(items),
            grouped(u64::from(plan.chunk))
        );
        print!("  ");
        direct.print();
        print!("  ");
        end_to_end.print();
        println!(
            "  end to end / direct: {:.2}",
            end_to_end.rate() / direct.rate()
        );
        end_to_end_rates.push((tasks_per_message, end_to_end.rate()));
    }
    if let [(one, single), (group, grouped_rate)] = end_to_end_rates[..] {
        println!(
            "end to end, {group} tasks per message / {one} per message: {:.2}x",
            grouped_rate / single
        );
    }
    let mut conn = services.pool.acquire().await?;
    let violations = paybus_ops::audit::run(&mut conn, &paybus_catalog::audit_checks()).await?;
    ensure!(violations.is_empty(), "audit: {violations:?}");
    println!("every order cancelled once, task counts add up, audit clean");
    Ok(())
}

/// A digits table (0..9): cross joins of it count to a million without a sequence engine
/// (MySQL 8 has none).
pub(super) async fn create_digits(pool: &MySqlPool) -> anyhow::Result<()> {
    sqlx::query("CREATE TABLE bench_digits (d TINYINT UNSIGNED NOT NULL PRIMARY KEY)")
        .execute(pool)
        .await?;
    sqlx::query("INSERT INTO bench_digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)")
        .execute(pool)
        .await?;
    Ok(())
}

/// An ACTIVE market with `count` OPEN orders, inserted set-based.
async fn market_with_open_orders(
    pool: &MySqlPool,
    symbol: &str,
    count: u64,
) -> anyhow::Result<u64> {
    let mut conn = pool.acquire().await?;
    let market_id = market::create(&mut conn, symbol).await?;
    let mut start = 0;
    while start < count {
        let end = (start + LOAD_STEP).min(count);
        sqlx::query(
            "INSERT INTO orders (market_id, account_id, side, price, quantity) \
             SELECT ?, 1 + n % 1000, IF(n % 2 = 0, 'BUY', 'SELL'), 100 + n % 50, 1 \
             FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d \
                          + 100000 * g.d AS n \
                   FROM bench_digits a, bench_digits b, bench_digits c, bench_digits e, \
                        bench_digits f, bench_digits g) numbers \
             WHERE n >= ? AND n < ?",
        )
        .bind(market_id)
        .bind(start)
        .bind(end)
        .execute(&mut *conn)
        .await
        .with_context(|| format!("loading the orders of {symbol}"))?;
        start = end;
    }
    Ok(market_id)
}

async fn task_ids(pool: &MySqlPool, batch_id: u64) -> anyhow::Result<Vec<u64>> {
    Ok(
        sqlx::query_scalar("SELECT id FROM tasks WHERE batch_id = ? ORDER BY id")
            .bind(batch_id)
            .fetch_all(pool)
            .await?,
    )
}

/// Materialised and nothing PENDING (a cheap poll: two index lookups).
async fn batch_finished(pool: &MySqlPool, batch_id: u64) -> anyhow::Result<bool> {
    let (materialised, pending): (bool, i64) = sqlx::query_as(
        "SELECT b.materialised_at IS NOT NULL, \
                (SELECT COUNT(*) FROM tasks t WHERE t.batch_id = b.id AND t.state = 'PENDING') \
         FROM task_batches b WHERE b.id = ?",
    )
    .bind(batch_id)
    .fetch_one(pool)
    .await?;
    Ok(materialised && pending == 0)
}

async fn ensure_complete(pool: &MySqlPool, symbol: &str, items: u64) -> anyhow::Result<()> {
    let progress = paybus_markets::progress::of_symbol(pool, symbol).await?;
    ensure!(
        progress.complete && progress.tasks.done == items && progress.created == items,
        "{symbol}: {}",
        progress.summary
    );
    Ok(())
}

/// Drops what waits in cancel-orders' queue (the direct phase's messages).
async fn purge_cancel_queue(services: &paybus_bus::Services) -> anyhow::Result<()> {
    use paybus_bus::Handler;
    // Published after each chunk's commit: give the last confirms a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let channel = services.connection().create_channel().await?;
    channel
        .queue_purge(
            CancelOrders::queue().queue().as_str().into(),
            lapin::options::QueuePurgeOptions::default(),
        )
        .await?;
    Ok(())
}
