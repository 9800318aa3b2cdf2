//! `paybus-lab bench grant-bonus`: W3 end to end (payment completions whose bonus jobs
//! grant-bonus grants through the broker) next to the same transactions driven directly on the
//! database at the same concurrency, and the database's write ceiling.
//!
//! Each item is one purchase by a member of its own (row locks never collide, as across real
//! members) during a charge event, so each completion owes one job, and each job's message is
//! delivered twice (the duplicate must be refused) in both phases: **direct**, with an
//! in-process queue standing in for the broker (`attempt::attempt_messages` grants each, then
//! once more as the duplicate); **end to end**, with the completion committing the job and its
//! message through the outbox, a copy published beside it, and grant-bonus consuming both as a
//! separate process would. The clock stops when every message is processed.
//!
//! It prints grants per second of both, their ratio and the useful grants per second against
//! the ceiling, then checks the result came out exactly once: one EVENT charge per purchase,
//! the audit clean.

use std::time::Instant;

use anyhow::{Context, bail};
use paybus_bonuses::BonusJobCreated;
use paybus_bonuses::{
    BonusRules, Completion, Completions, PaymentCompletion, charge::PaymentGateway,
};
use paybus_bus::{Handler, metrics};
use paybus_grant_bonus::{Attempted, GrantBonus, MessageResult, attempt};
use paybus_money::Amount;
use paybus_retry::Clock;
use paybus_runtime::runner::Runner;
use paybus_testkit::TestEnv;
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use super::{
    BenchArgs, Counters, Phase, bench_services, database_ceiling, drive, met, processed_by,
    publish_copy, purge, until_processed,
};

/// Cans per purchase (and 100 per can as its price); the event adds 10%.
const CANS: i32 = 100;

/// `count` members and one PG purchase of [`CANS`] each; the gateway's word for each.
async fn insert_purchases(
    pool: &MySqlPool,
    count: usize,
) -> anyhow::Result<Vec<PaymentCompletion>> {
    let mut paid = Vec::with_capacity(count);
    let rows: Vec<usize> = (0..count).collect();
    for chunk in rows.chunks(500) {
        let mut members = sqlx::QueryBuilder::<sqlx::MySql>::new("INSERT INTO members (nickname) ");
        members.push_values(chunk, |mut row, _| {
            row.push("'bench'");
        });
        let done = members.build().execute(pool).await?;
        let first_member = done.last_insert_id();
        let mut charges = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "INSERT INTO charges (member_id, status, cans, price, payment_gateway, container, \
             method, payment_status) ",
        );
        charges.push_values(0..done.rows_affected(), |mut row, i| {
            row.push_bind(first_member + i)
                .push("'CHARGE'")
                .push_bind(CANS)
                .push_bind(price())
                .push("'PG'")
                .push("'pg'")
                .push("'card'")
                .push("'REQUEST'");
        });
        let done = charges.build().execute(pool).await?;
        let first_charge = done.last_insert_id();
        paid.extend((0..done.rows_affected()).map(|i| PaymentCompletion {
            charge_id: first_charge + i,
            gateway: PaymentGateway::Pg,
            gateway_tx_id: format!("bench-{}", first_charge + i),
            amount: price(),
        }));
    }
    Ok(paid)
}

const GRANT_BONUS_QUEUE: &str = "paybus.grant-bonus";

fn price() -> Amount {
    Amount::whole(i64::from(CANS) * 100)
}

/// A completion as the gateway routes make it: through [`Completions`], which commits
/// concurrent ones together.
async fn complete(completions: &Completions, paid: &PaymentCompletion) -> anyhow::Result<u64> {
    match completions
        .complete(paid.clone())
        .await
        .context("completing a payment")?
    {
        Completion::Completed(charge) if charge.bonus_jobs.len() == 1 => {
            Ok(charge.bonus_jobs[0].job_id)
        }
        other => bail!("expected one new bonus job: {other:?}"),
    }
}

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let services = bench_services(&env, args.concurrency).await?;
    sqlx::query(
        "INSERT INTO charge_events (title, add_percent, start_at, end_at, available_count) \
         VALUES ('bench 10%', 10, NOW(6) - INTERVAL 1 DAY, NOW(6) + INTERVAL 1 DAY, 1)",
    )
    .execute(&services.pool)
    .await?;
    println!(
        "grant-bonus: {} purchases per phase (a member each, one bonus job each), concurrency {}",
        args.items, args.concurrency
    );

    // Direct: the same transactions at the same concurrency, with an in-process queue where
    // the broker would be: `concurrency` tasks complete the payments while `concurrency` others
    // take the jobs, claim and grant each, and claim it again as its duplicate would.
    let paid = std::sync::Arc::new(insert_purchases(&services.pool, args.items).await?);
    let policy = paybus_bonuses::job::RETRY_POLICY;
    let (created, jobs) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let jobs = std::sync::Arc::new(tokio::sync::Mutex::new(jobs));
    let counters = Counters::read(&services.pool).await?;
    let completions = Completions::new(services.outbox.clone(), BonusRules::default());
    let completing = drive(paid.len(), args.concurrency, {
        let (paid, completions) = (paid.clone(), completions.clone());
        move |i| {
            let (paid, completions, created) = (paid.clone(), completions.clone(), created.clone());
            async move {
                let job_id = complete(&completions, &paid[i]).await?;
                created.send(job_id).context("the granting tasks stopped")?;
                Ok(())
            }
        }
    });
    let granting = drive(paid.len(), args.concurrency, {
        let services = services.clone();
        move |_| {
            let (services, policy, jobs) = (services.clone(), policy.clone(), jobs.clone());
            async move {
                let Some(job_id) = jobs.lock().await.recv().await else {
                    bail!("the completing tasks stopped early");
                };
                let first =
                    attempt::attempt_messages(&services.pool, &[job_id], &policy, &Clock::Database)
                        .await;
                match &first[..] {
                    [Ok(MessageResult::Attempted(Attempted::Granted { .. }))] => {}
                    other => bail!("bonus job {job_id}: {other:?}"),
                }
                let duplicate =
                    attempt::attempt_messages(&services.pool, &[job_id], &policy, &Clock::Database)
                        .await;
                match &duplicate[..] {
                    [Ok(MessageResult::NotClaimed(state))] if state.status == "DONE" => Ok(()),
                    other => bail!("bonus job {job_id}: the duplicate was not refused: {other:?}"),
                }
            }
        }
    });
    let (completed, granted) = tokio::join!(completing, granting);
    completed?;
    let elapsed = granted?;
    let direct = Phase {
        name: "direct on the database",
        unit: "grants",
        count: paid.len(),
        elapsed,
        statements: Some(counters.since(&services.pool).await?),
    };
    let direct_batches = completions.counts();

    // The direct phase's completions published their messages too; they are not this phase's.
    purge(&services, GRANT_BONUS_QUEUE).await?;

    // End to end: completions here, grants by grant-bonus through the broker.
    let paid = std::sync::Arc::new(insert_purchases(&services.pool, args.items).await?);
    let shutdown = CancellationToken::new();
    let mut runner = Runner::new(bench_services(&env, args.concurrency).await?);
    runner.add_function(GrantBonus::default());
    let running = tokio::spawn(runner.run(shutdown.clone()));
    let granted = || metrics::count(GrantBonus::FUNCTION, "done");
    let before = processed_by(GrantBonus::FUNCTION);
    let counters = Counters::read(&services.pool).await?;
    let started = Instant::now();
    let completions = Completions::new(services.outbox.clone(), BonusRules::default());
    drive(paid.len(), args.concurrency, {
        let (paid, services, completions) = (paid.clone(), services.clone(), completions.clone());
        move |i| {
            let (paid, services, completions) =
                (paid.clone(), services.clone(), completions.clone());
            async move {
                let job_id = complete(&completions, &paid[i]).await?;
                publish_copy(&services, BonusJobCreated { job_id }).await
            }
        }
    })
    .await?;
    until_processed(GrantBonus::FUNCTION, before, 2 * paid.len() as u64, started).await?;
    if granted() != paid.len() as u64 {
        bail!("{} grants for {} jobs", granted(), paid.len());
    }
    let end_to_end = Phase {
        name: "end to end (completion, broker, grant)",
        unit: "grants",
        count: paid.len(),
        elapsed: started.elapsed(),
        statements: Some(counters.since(&services.pool).await?),
    };
    shutdown.cancel();
    running.await??;

    let ceiling = database_ceiling(&services.pool, paid.len(), args.concurrency).await?;

    let bonuses: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM charges WHERE status = 'EVENT'")
        .fetch_one(&services.pool)
        .await?;
    let mut conn = services.pool.acquire().await?;
    let violations = paybus_ops::audit::run(&mut conn, &paybus_catalog::audit_checks()).await?;
    if bonuses != i64::try_from(2 * args.items)? || !violations.is_empty() {
        bail!(
            "exactly-once broken: {bonuses} bonuses for {} purchases, audit: {violations:?}",
            2 * args.items
        );
    }

    for (phase, batches) in [
        (&direct, direct_batches),
        (&end_to_end, completions.counts()),
    ] {
        phase.print();
        println!(
            "    completions committed together: {} in {} transactions; {} apart",
            batches.completed_together, batches.batches, batches.completed_apart
        );
    }
    ceiling.print();
    let ratio = end_to_end.rate() / direct.rate();
    let of_ceiling = end_to_end.rate() / ceiling.rate();
    println!(
        "end to end / direct:                         {ratio:.3}  (target >= 0.80: {})",
        met(ratio >= 0.8)
    );
    println!(
        "grants end to end: {:.0} /s = {of_ceiling:.3} x the ceiling  (target >= 0.25: {})",
        end_to_end.rate(),
        met(of_ceiling >= 0.25)
    );
    println!(
        "exactly once: {bonuses} bonuses for {} purchases, audit clean",
        2 * args.items
    );
    Ok(())
}
