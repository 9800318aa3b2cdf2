//! `paybus bench <workflow>`: throughput end to end through the broker next to two figures
//! measured in the same run on the same database at the same concurrency:
//!
//! - **direct**: the workflow's own SQL transactions driven straight on the database (what
//!   the bus costs on top of them: the ratio should be close to 1);
//! - **ceiling**: the database's own limit for a write transaction, sysbench
//!   `oltp_write_only`'s shape (an indexed UPDATE, a non-indexed UPDATE, a DELETE and an
//!   INSERT by primary key on a 100k-row table, in one transaction). The workflow's useful
//!   transitions per second divided by it says how close to the database's limit it runs.
//!
//! A benchmark, not a test: it asserts nothing about time, only that the work came out
//! exactly once (and the audit is clean). Each run gets its own database and vhost (dropped
//! afterwards), so it can run next to `paybus run` on the same servers.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use paybus_confirm_withdrawal::{ConfirmWithdrawal, WithdrawalTxConfirmed, confirm_if_in_flight};
use paybus_platform::{
    bus::{Envelope, Runner, Services, metrics},
    testing::TestEnv,
    transition::Transition,
};
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Workflow {
    /// W2: withdrawal confirmations, every message delivered twice.
    ConfirmWithdrawal,
}

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    pub workflow: Workflow,
    /// Distinct items per phase (each phase sends every item twice).
    #[arg(long, default_value_t = 2_000)]
    pub items: usize,
    /// In-flight work in every phase: worker tasks for direct and ceiling, prefetch for the
    /// broker.
    #[arg(long, default_value_t = 64)]
    pub concurrency: u16,
    /// Partners the items are spread over (round robin). One partner serialises every ledger
    /// posting on its gate row; real deployments have many.
    #[arg(long, default_value_t = 1)]
    pub partners: u16,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.items == 0 || args.concurrency == 0 || args.partners == 0 {
        bail!("--items, --concurrency and --partners must be at least 1");
    }
    match args.workflow {
        Workflow::ConfirmWithdrawal => confirm_withdrawal(&args).await,
    }
}

struct Phase {
    name: &'static str,
    unit: &'static str,
    count: usize,
    elapsed: Duration,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }

    fn print(&self) {
        println!(
            "{:<44} {:>7} {:<12} in {:>8.2?}  {:>8.0} /s",
            self.name,
            self.count,
            self.unit,
            self.elapsed,
            self.rate()
        );
    }
}

/// Runs `work(i)` for i in 0..count on `concurrency` tasks; the elapsed time.
async fn drive<F, Fut>(count: usize, concurrency: u16, work: F) -> anyhow::Result<Duration>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (next, work) = (next.clone(), work.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return anyhow::Ok(());
                }
                work(i).await?;
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(started.elapsed())
}

async fn bench_services(env: &TestEnv, concurrency: u16) -> anyhow::Result<Services> {
    let mut settings = env.settings.clone();
    settings.broker.prefetch = concurrency;
    // Every in-flight handler holds a connection; a smaller pool would measure the pool.
    settings.database.max_connections = u32::from(concurrency) + 8;
    let services = Services::connect(settings).await?;
    services.declare_topology(&paybus_catalog::queues()).await?;
    Ok(services)
}

async fn insert_partners(pool: &MySqlPool, count: u16) -> anyhow::Result<Vec<u64>> {
    let mut ids = Vec::with_capacity(usize::from(count));
    for n in 0..count {
        ids.push(
            sqlx::query("INSERT INTO partners (name, webhook_secret) VALUES (?, 'bench-secret')")
                .bind(format!("bench {n}"))
                .execute(pool)
                .await?
                .last_insert_id(),
        );
    }
    Ok(ids)
}

/// `count` NORMAL withdrawals in BROADCASTING, spread round robin over `partners`.
async fn insert_broadcasting_withdrawals(
    pool: &MySqlPool,
    partners: &[u64],
    count: usize,
) -> anyhow::Result<Vec<u64>> {
    let mut ids = Vec::with_capacity(count);
    let rows: Vec<usize> = (0..count).collect();
    for chunk in rows.chunks(500) {
        let mut query = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "INSERT INTO withdrawals (partner_id, kind, status, currency, amount, to_address) ",
        );
        query.push_values(chunk, |mut row, n| {
            row.push_bind(partners[n % partners.len()])
                .push("'NORMAL'")
                .push("'BROADCASTING'")
                .push("'USDT'")
                .push("1")
                .push("'bench-address'");
        });
        let done = query.build().execute(pool).await?;
        let first = done.last_insert_id();
        ids.extend((0..done.rows_affected()).map(|i| first + i));
    }
    Ok(ids)
}

/// Each id twice, the copies next to each other so duplicates really race.
fn doubled(ids: &[u64]) -> Vec<u64> {
    ids.iter().flat_map(|&id| [id, id]).collect()
}

async fn confirm_withdrawal(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let services = bench_services(&env, args.concurrency).await?;
    let partners = insert_partners(&services.pool, args.partners).await?;
    println!(
        "confirm-withdrawal: {} withdrawals per phase over {} partner(s), each confirmation sent \
         twice, concurrency {}",
        args.items, args.partners, args.concurrency
    );

    // Direct: the handler's own transaction, driven by `concurrency` tasks.
    let work = Arc::new(doubled(
        &insert_broadcasting_withdrawals(&services.pool, &partners, args.items).await?,
    ));
    let outbox = services.outbox.clone();
    let elapsed = drive(work.len(), args.concurrency, {
        let work = work.clone();
        move |i| {
            let (work, outbox) = (work.clone(), outbox.clone());
            async move {
                let mut uow = outbox.begin().await?;
                let result =
                    confirm_if_in_flight(&mut uow, work[i], "0xbench", uuid::Uuid::now_v7()).await;
                Transition::commit_or_rollback(uow, result)
                    .await
                    .context("direct confirmation")?;
                Ok(())
            }
        }
    })
    .await?;
    let direct = Phase {
        name: "direct on the database (with duplicates)",
        unit: "messages",
        count: work.len(),
        elapsed,
    };

    // Through the broker: the same number of messages, consumed by the real runtime.
    let ids = insert_broadcasting_withdrawals(&services.pool, &partners, args.items).await?;
    let messages: Vec<_> = doubled(&ids)
        .into_iter()
        .map(|withdrawal_id| {
            Envelope::new(WithdrawalTxConfirmed {
                withdrawal_id,
                tx_hash: "0xbench".to_owned(),
            })
            .to_outgoing()
        })
        .collect::<Result<_, _>>()?;
    let shutdown = CancellationToken::new();
    let mut runner = Runner::new(services.clone());
    runner.add_function(ConfirmWithdrawal);
    let running = tokio::spawn(runner.run(shutdown.clone()));
    let processed = || {
        metrics::count("confirm-withdrawal", "done")
            + metrics::count("confirm-withdrawal", "skipped")
    };
    let started = Instant::now();
    for chunk in messages.chunks(512) {
        for result in services.publisher().publish_events(chunk).await {
            result.context("publishing a confirmation")?;
        }
    }
    let deadline = started + Duration::from_secs(600);
    while processed() < messages.len() as u64 {
        if Instant::now() > deadline {
            bail!(
                "only {} of {} messages processed in 10 minutes",
                processed(),
                messages.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let through_broker = Phase {
        name: "through the broker (with duplicates)",
        unit: "messages",
        count: messages.len(),
        elapsed: started.elapsed(),
    };
    shutdown.cancel();
    running.await??;

    let ceiling = database_ceiling(&services.pool, work.len(), args.concurrency).await?;

    let debits: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM ledger_entries WHERE entry_type = 'DEBIT' AND reference_type = 'WITHDRAWAL'",
    )
    .fetch_one(&services.pool)
    .await?;
    let mut conn = services.pool.acquire().await?;
    let violations =
        paybus_platform::audit::run(&mut conn, &paybus_catalog::audit_checks()).await?;
    if debits != i64::try_from(2 * args.items)? || !violations.is_empty() {
        bail!(
            "exactly-once broken: {debits} debits for {} withdrawals, audit: {violations:?}",
            2 * args.items
        );
    }

    for phase in [&direct, &through_broker, &ceiling] {
        phase.print();
    }
    let ratio = through_broker.rate() / direct.rate();
    // Half the messages are duplicates: the useful work is one transition per withdrawal.
    let transitions = args.items as f64 / through_broker.elapsed.as_secs_f64();
    let of_ceiling = transitions / ceiling.rate();
    println!(
        "through the broker / direct:                 {ratio:.2}  (target >= 0.80: {})",
        met(ratio >= 0.8)
    );
    println!(
        "transitions end to end: {transitions:.0} /s = {of_ceiling:.2} x the ceiling  (target >= 0.30: {})",
        met(of_ceiling >= 0.3)
    );
    println!(
        "exactly once: {debits} debits for {} withdrawals, audit clean",
        2 * args.items
    );
    Ok(())
}

fn met(yes: bool) -> &'static str {
    if yes { "met" } else { "NOT met" }
}

/// Rows of the ceiling's table, as sysbench's default `--table-size`.
const CEILING_ROWS: u64 = 100_000;

/// sysbench `oltp_write_only`, natively: `transactions` transactions on `concurrency` tasks,
/// each an indexed UPDATE, a non-indexed UPDATE, a DELETE and the INSERT of the deleted id,
/// by primary key on a table of 100k rows (so the table keeps its size).
async fn database_ceiling(
    pool: &MySqlPool,
    transactions: usize,
    concurrency: u16,
) -> anyhow::Result<Phase> {
    sqlx::query(
        "CREATE TABLE bench_sbtest ( \
             id  INT UNSIGNED NOT NULL PRIMARY KEY, \
             k   INT UNSIGNED NOT NULL DEFAULT 0, \
             c   CHAR(120)    NOT NULL DEFAULT '', \
             pad CHAR(60)     NOT NULL DEFAULT '', \
             KEY k_1 (k)) ENGINE=InnoDB",
    )
    .execute(pool)
    .await?;
    for start in (1..=CEILING_ROWS).step_by(5_000) {
        let mut query =
            sqlx::QueryBuilder::<sqlx::MySql>::new("INSERT INTO bench_sbtest (id, k, c, pad) ");
        query.push_values(
            start..(start + 5_000).min(CEILING_ROWS + 1),
            |mut row, id| {
                row.push_bind(id)
                    .push_bind(id % 1_000)
                    .push("REPEAT('c', 119)")
                    .push("REPEAT('p', 59)");
            },
        );
        query.build().execute(pool).await?;
    }
    let pool = pool.clone();
    let elapsed = drive(transactions, concurrency, move |i| {
        let pool = pool.clone();
        async move {
            // Spread like sysbench's uniform distribution, without a random generator.
            let id = (i as u64).wrapping_mul(2_654_435_761) % CEILING_ROWS + 1;
            let other = (i as u64).wrapping_mul(40_503) % CEILING_ROWS + 1;
            // sysbench retries a transaction that lost a deadlock; so does this.
            loop {
                match oltp_write_only(&pool, id, other).await {
                    Err(e) if paybus_platform::db::error_number(&e) == Some(1213) => continue,
                    other => return other.map_err(Into::into),
                }
            }
        }
    })
    .await?;
    Ok(Phase {
        name: "database ceiling (oltp_write_only shape)",
        unit: "transactions",
        count: transactions,
        elapsed,
    })
}

/// One sysbench `oltp_write_only` transaction (its four writes, by primary key).
async fn oltp_write_only(pool: &MySqlPool, id: u64, other: u64) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE bench_sbtest SET k = k + 1 WHERE id = ?")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE bench_sbtest SET c = REPEAT('u', 119) WHERE id = ?")
        .bind(other)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM bench_sbtest WHERE id = ?")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO bench_sbtest (id, k, c, pad) \
         VALUES (?, ?, REPEAT('c', 119), REPEAT('p', 59))",
    )
    .bind(id)
    .bind(id % 1_000)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}
