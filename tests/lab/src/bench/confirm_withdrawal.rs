//! `paybus-lab bench confirm-withdrawal`: W2's confirmation through the broker, each message sent
//! twice, next to the same transaction driven directly and the database's write ceiling.

use std::{sync::Arc, time::Instant};

use anyhow::{Context, bail};
use paybus_confirm_withdrawal::{ConfirmWithdrawal, WithdrawalTxConfirmed, confirm_all};
use paybus_platform::{
    bus::{
        Envelope, Handler, Outcome, OutgoingMessage, Runner, Services, link::BrokerLink,
        publisher::Publisher,
    },
    testing::TestEnv,
};
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use super::{
    BenchArgs, Counters, Phase, bench_services, database_ceiling, drive, met, processed_by, purge,
    until_processed,
};

pub(super) async fn insert_partners(pool: &MySqlPool, count: u16) -> anyhow::Result<Vec<u64>> {
    let mut ids = Vec::with_capacity(usize::from(count));
    for n in 0..count {
        ids.push(
            sqlx::query("INSERT INTO partners (name) VALUES (?)")
                .bind(format!("bench {n}"))
                .execute(pool)
                .await?
                .last_insert_id(),
        );
    }
    Ok(ids)
}

/// `count` NORMAL withdrawals in BROADCASTING, spread round robin over `partners`.
pub(super) async fn insert_broadcasting_withdrawals(
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

/// Where the transitions' partner notifications go (deliver-webhook does not run here).
const WEBHOOK_QUEUE: &str = "paybus.deliver-webhook";

/// Each id twice, the copies next to each other so duplicates really race.
fn doubled(ids: &[u64]) -> Vec<u64> {
    ids.iter().flat_map(|&id| [id, id]).collect()
}

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let services = bench_services(&env, args.concurrency).await?;
    let partners = insert_partners(&services.pool, args.partners).await?;
    println!(
        "confirm-withdrawal: {} withdrawals per phase over {} partner(s), each confirmation sent \
         twice, concurrency {}",
        args.items, args.partners, args.concurrency
    );

    // Direct: what the handler does with the messages, in its batches, with as many messages
    // in flight as the broker phase's prefetch.
    let work = Arc::new(doubled(
        &insert_broadcasting_withdrawals(&services.pool, &partners, args.items).await?,
    ));
    let outbox = services.outbox.clone();
    let batch = ConfirmWithdrawal::MAX_BATCH;
    let batches = work.len().div_ceil(batch);
    let counters = Counters::read(&services.pool).await?;
    let elapsed = drive(batches, (args.concurrency / batch as u16).max(1), {
        let work = work.clone();
        move |b| {
            let (work, outbox) = (work.clone(), outbox.clone());
            async move {
                let chunk = &work[b * batch..((b + 1) * batch).min(work.len())];
                let confirmations: Vec<_> = chunk
                    .iter()
                    .map(|&withdrawal_id| {
                        let confirmation = WithdrawalTxConfirmed {
                            withdrawal_id,
                            tx_hash: "0xbench".to_owned(),
                        };
                        (confirmation, uuid::Uuid::now_v7())
                    })
                    .collect();
                for (result, id) in confirm_all(&outbox, &confirmations)
                    .await
                    .into_iter()
                    .zip(chunk)
                {
                    match result {
                        Ok(Outcome::Done | Outcome::Skipped(_)) => {}
                        Ok(other) => bail!("direct confirmation of {id}: {other:?}"),
                        Err(error) => return Err(error).context("direct confirmation"),
                    }
                }
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
        statements: Some(counters.since(&services.pool).await?),
    };

    // Through the broker: the same number of messages, consumed by the real runtime. It starts
    // with the webhook queue as empty as the direct phase found it: nothing consumes it here,
    // and a quorum queue's cost per message grows with what it holds.
    purge(&services, WEBHOOK_QUEUE).await?;
    let ids = insert_broadcasting_withdrawals(&services.pool, &partners, args.items).await?;
    let through_broker = through_the_broker(
        &services,
        &doubled(&ids),
        "through the broker (with duplicates)",
    )
    .await?;

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

/// A confirmation of each of `withdrawals` published, and consumed by the real runtime (the
/// local consumer, prefetch = the services' setting) until every one is processed.
/// One confirmation message for each of `withdrawals`.
pub(super) fn confirmations(withdrawals: &[u64]) -> anyhow::Result<Vec<OutgoingMessage>> {
    Ok(withdrawals
        .iter()
        .map(|&withdrawal_id| {
            Envelope::new(WithdrawalTxConfirmed {
                withdrawal_id,
                tx_hash: "0xbench".to_owned(),
            })
            .to_outgoing()
        })
        .collect::<Result<_, _>>()?)
}

pub(super) async fn through_the_broker(
    services: &Services,
    withdrawals: &[u64],
    name: &'static str,
) -> anyhow::Result<Phase> {
    let messages = confirmations(withdrawals)?;
    // The input comes from another process in production (the chain monitor), on a connection
    // of its own: publishing it on the consumer's connection would throttle the consumer's
    // acks whenever the broker applies flow control to the publisher.
    let producer = Publisher::new(BrokerLink::connect(&services.settings.broker).await?);
    let shutdown = CancellationToken::new();
    let mut runner = Runner::new(services.clone());
    runner.add_function(ConfirmWithdrawal);
    let running = tokio::spawn(runner.run(shutdown.clone()));
    // The counters are process-wide: count from where they stand now.
    let before = processed_by(ConfirmWithdrawal::FUNCTION);
    let counters = Counters::read(&services.pool).await?;
    let started = Instant::now();
    for chunk in messages.chunks(512) {
        for result in producer.publish_events(chunk).await {
            result.context("publishing a confirmation")?;
        }
    }
    until_processed(
        ConfirmWithdrawal::FUNCTION,
        before,
        messages.len() as u64,
        started,
    )
    .await?;
    let phase = Phase {
        name,
        unit: "messages",
        count: messages.len(),
        elapsed: started.elapsed(),
        statements: Some(counters.since(&services.pool).await?),
    };
    shutdown.cancel();
    running.await??;
    Ok(phase)
}
