//! `paybus-lab bench lambda-batch`: what Lambda execution environments get through on Amazon MQ
//! batches of W2 confirmations, against the local consumer on the same number of
//! confirmations at the same concurrency (`PAYBUS_LAMBDA_CONCURRENCY` = the consumer's
//! prefetch = `--concurrency`).
//!
//! The event source mapping gives each queue one environment, so with `--shards N` (N queues
//! for confirm-withdrawal, one trigger each) N environments work at once, each on its own
//! shard's batch, each with its own database pool and broker connection as in AWS. The
//! confirmations go through the real broker first (paybus.events and, sharded, the
//! consistent-hash exchange), so each shard's batch is what the broker put there; each batch
//! becomes the event its mapping would deliver (bodies base64, string headers as bytes) and
//! is handed to the transport the binary runs (`bus::lambda::handle_event`), in process: the
//! Runtime API's one HTTP round trip per batch is left out, the decoding and every
//! settlement are in. Here all environments share this machine's cores and one database; in
//! AWS each has its own CPU, so the database is the shared part.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::future::try_join_all;
use lapin::options::BasicGetOptions;
use paybus_bus::{Handler, Services, headers::header_text, topology};
use paybus_confirm_withdrawal::ConfirmWithdrawal;
use paybus_runtime::lambda::handle_event;
use paybus_testkit::{
    TestEnv,
    lambda::{self, MqEvent},
};
use serde_json::json;

use super::{
    BenchArgs, Counters, Phase, bench_services,
    confirm_withdrawal::{
        confirmations, insert_broadcasting_withdrawals, insert_partners, through_the_broker,
    },
};

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let mut env = TestEnv::new().await;
    env.settings.broker.shards =
        paybus_config::Shards::default().with(ConfirmWithdrawal::FUNCTION, args.shards);
    let mut services = bench_services(&env, args.concurrency).await?;
    services.settings.broker.lambda_concurrency = args.concurrency;
    let partners = insert_partners(&services.pool, args.partners).await?;
    println!(
        "lambda-batch: {} confirmations over {} partner(s), concurrency {} (handle_batch chunks \
         of {}), confirm-withdrawal on {} queue(s): one Lambda environment per queue",
        args.items,
        args.partners,
        args.concurrency,
        ConfirmWithdrawal::MAX_BATCH,
        args.shards,
    );

    let ids = insert_broadcasting_withdrawals(&services.pool, &partners, args.items).await?;
    let local = through_the_broker(
        &services,
        &ids,
        "local consumer (one per queue, prefetch = concurrency)",
    )
    .await?;

    let ids = insert_broadcasting_withdrawals(&services.pool, &partners, args.items).await?;
    let batches = batches_from_the_broker(&services, &ids).await?;
    // One environment per shard: its own pool and broker connection, as in AWS.
    let mut environments = Vec::with_capacity(batches.len());
    for _ in &batches {
        let mut own = services.settings.clone();
        own.database.max_connections = u32::from(args.concurrency) + 8;
        environments.push(Services::connect(own).await?);
    }
    let counters = Counters::read(&services.pool).await?;
    let started = Instant::now();
    let runs =
        batches
            .into_iter()
            .zip(&environments)
            .map(|((queue, event), services)| async move {
                let began = Instant::now();
                let summary = handle_event(&ConfirmWithdrawal, services, event.event()).await?;
                anyhow::Ok((queue, summary, began.elapsed()))
            });
    let shards = try_join_all(runs).await?;
    let lambda = Phase {
        name: "Lambda environments at once, one batch each",
        unit: "messages",
        count: shards.iter().map(|(_, s, _)| s.processed).sum(),
        elapsed: started.elapsed(),
        statements: Some(counters.since(&services.pool).await?),
    };
    let acked: usize = shards.iter().map(|(_, s, _)| s.acked).sum();
    if acked != args.items {
        bail!("the batches settled {acked} acks, not {}", args.items);
    }

    let debits: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM ledger_entries WHERE entry_type = 'DEBIT' AND reference_type = 'WITHDRAWAL'",
    )
    .fetch_one(&services.pool)
    .await?;
    if debits != i64::try_from(2 * args.items)? {
        bail!(
            "exactly-once broken: {debits} debits for {} withdrawals",
            2 * args.items
        );
    }
    local.print();
    for (queue, summary, elapsed) in &shards {
        println!(
            "  {queue:<42} {:>7} messages     in {:>8.2?}  {:>8.0} /s",
            summary.processed,
            elapsed,
            rate(summary.processed, *elapsed)
        );
    }
    lambda.print();
    let slowest = shards
        .iter()
        .map(|(_, _, elapsed)| *elapsed)
        .max()
        .unwrap_or_default();
    println!(
        "Lambda environments / local consumer:        {:.2}",
        lambda.rate() / local.rate()
    );
    if shards.len() > 1 {
        let mean = shards
            .iter()
            .map(|(_, s, e)| rate(s.processed, *e))
            .sum::<f64>()
            / shards.len() as f64;
        println!(
            "{} environments here: {:.0} /s in all, {mean:.0} /s each on average (the slowest \
             took {slowest:.2?}); they share this machine's cores and database. In AWS each \
             has its own CPU: up to {} x one environment's rate, until the database is the bound.",
            shards.len(),
            lambda.rate(),
            shards.len()
        );
    }
    Ok(())
}

fn rate(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64()
}

/// Publishes a confirmation for each of `withdrawals` to `paybus.events` (nothing consumes
/// confirm-withdrawal's queues meanwhile), then takes each queue's messages as the event its
/// mapping would deliver: one batch per shard.
async fn batches_from_the_broker(
    services: &Services,
    withdrawals: &[u64],
) -> anyhow::Result<Vec<(String, MqEvent)>> {
    let messages = confirmations(withdrawals)?;
    for chunk in messages.chunks(512) {
        for result in services.publisher().publish_events(chunk).await {
            result.context("publishing a confirmation")?;
        }
    }
    let channel = services.connection().create_channel().await?;
    let queues = ConfirmWithdrawal::queue().queues_in(&services.settings.broker.shards);
    let mut batches = Vec::with_capacity(queues.len());
    let mut taken = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Confirmed means routed; wait until every message can be taken.
    let mut events: Vec<MqEvent> = queues.iter().map(|q| MqEvent::new(&q.queue())).collect();
    while taken < messages.len() {
        let mut progressed = false;
        for (queue, event) in queues.iter().zip(events.iter_mut()) {
            while let Some(message) = channel
                .basic_get(
                    queue.queue().as_str().into(),
                    BasicGetOptions { no_ack: true },
                )
                .await?
            {
                let delivery = message.delivery;
                let properties = &delivery.properties;
                let shard_key =
                    header_text(properties.headers().as_ref(), topology::SHARD_KEY_HEADER)
                        .unwrap_or_default();
                let text =
                    |v: &Option<lapin::types::ShortString>| v.as_ref().map(|s| s.to_string());
                *event = std::mem::replace(event, MqEvent::new(&queue.queue())).message(
                    json!({
                        "messageId": text(properties.message_id()),
                        "correlationId": text(properties.correlation_id()),
                        "type": text(properties.kind()),
                        "headers": { topology::SHARD_KEY_HEADER: lambda::header_text(&shard_key) },
                    }),
                    &delivery.data,
                );
                taken += 1;
                progressed = true;
            }
        }
        if !progressed {
            if Instant::now() > deadline {
                bail!(
                    "only {taken} of {} confirmations reached the queues",
                    messages.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for (queue, event) in queues.iter().zip(events) {
        batches.push((queue.queue(), event));
    }
    Ok(batches)
}
