//! `paybus bench <workflow>`: throughput end to end through the broker next to a baseline
//! measured in the same run — the same SQL transactions driven directly on the database at
//! the same concurrency — printed as a ratio. A benchmark, not a test: it asserts nothing
//! about time, only that the work came out exactly once.
//!
//! Each run gets its own database and vhost (dropped afterwards), so it can run next to
//! `paybus run` on the same servers.

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
};
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
    /// In-flight work in both phases: worker tasks for the baseline, prefetch for the broker.
    #[arg(long, default_value_t = 64)]
    pub concurrency: u16,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.workflow {
        Workflow::ConfirmWithdrawal => confirm_withdrawal(&args).await,
    }
}

struct Phase {
    name: &'static str,
    messages: usize,
    elapsed: Duration,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }
}

fn report(baseline: &Phase, through_broker: &Phase, target: f64) {
    let ratio = through_broker.rate() / baseline.rate();
    for phase in [baseline, through_broker] {
        println!(
            "{:<34} {:>7} messages in {:>7.2?}  {:>9.0} /s",
            phase.name,
            phase.messages,
            phase.elapsed,
            phase.rate()
        );
    }
    println!(
        "ratio through broker / direct: {ratio:.2}  (target >= {target:.2}: {})",
        if ratio >= target { "met" } else { "NOT met" }
    );
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

async fn insert_broadcasting_withdrawals(
    services: &Services,
    partner_id: u64,
    count: usize,
) -> anyhow::Result<Vec<u64>> {
    let mut ids = Vec::with_capacity(count);
    for chunk in (0..count).collect::<Vec<_>>().chunks(500) {
        let mut query = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "INSERT INTO withdrawals (partner_id, kind, status, currency, amount, to_address) ",
        );
        query.push_values(chunk, |mut row, _| {
            row.push_bind(partner_id)
                .push("'NORMAL'")
                .push("'BROADCASTING'")
                .push("'USDT'")
                .push("1")
                .push("'bench-address'");
        });
        let done = query.build().execute(&services.pool).await?;
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
    let partner_id =
        sqlx::query("INSERT INTO partners (name, webhook_secret) VALUES ('bench', 'bench-secret')")
            .execute(&services.pool)
            .await?
            .last_insert_id();
    println!(
        "confirm-withdrawal: {} withdrawals per phase, each confirmation sent twice, concurrency {}",
        args.items, args.concurrency
    );

    // Baseline: the handler's own transaction, driven directly by `concurrency` tasks.
    let work = Arc::new(doubled(
        &insert_broadcasting_withdrawals(&services, partner_id, args.items).await?,
    ));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let (work, next, services) = (work.clone(), next.clone(), services.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&id) = work.get(i) else {
                    return anyhow::Ok(());
                };
                let mut uow = services.outbox.begin().await?;
                let outcome =
                    confirm_if_in_flight(&mut uow, id, "0xbench", uuid::Uuid::now_v7()).await;
                match outcome {
                    Ok(paybus_platform::transition::Transition::Transitioned(_)) => {
                        uow.commit().await?
                    }
                    Ok(_) => uow.rollback().await?,
                    Err(e) => {
                        uow.rollback().await?;
                        return Err(e).context("baseline confirmation");
                    }
                }
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    let baseline = Phase {
        name: "direct on the database",
        messages: work.len(),
        elapsed: started.elapsed(),
    };

    // Through the broker: the same number of messages, consumed by the real runtime.
    let ids = insert_broadcasting_withdrawals(&services, partner_id, args.items).await?;
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
        messages: messages.len(),
        elapsed: started.elapsed(),
    };
    shutdown.cancel();
    running.await??;

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
    report(&baseline, &through_broker, 0.7);
    println!(
        "exactly once: {debits} debits for {} withdrawals, audit clean",
        2 * args.items
    );
    Ok(())
}
