//! `paybus bench lambda-batch`: what one Lambda execution environment gets through on one
//! Amazon MQ batch of W2 confirmations (the event source mapping gives a queue one
//! environment, so this is the function's whole throughput in AWS), against the local
//! consumer on the same number of confirmations at the same concurrency
//! (`PAYBUS_LAMBDA_CONCURRENCY` = the consumer's prefetch = `--concurrency`).
//!
//! The Lambda phase calls the transport the binary runs (`bus::lambda::handle_event`) with
//! the event a real mapping would deliver (bodies base64), in process: the Runtime API's one
//! HTTP round trip per batch is left out, the decoding and every settlement are in.

use std::time::Instant;

use anyhow::bail;
use paybus_confirm_withdrawal::{ConfirmWithdrawal, WithdrawalTxConfirmed};
use paybus_platform::{
    bus::{Envelope, Handler, lambda::handle_event},
    testing::{TestEnv, lambda::MqEvent},
};

use super::{
    BenchArgs, Counters, Phase, bench_services,
    confirm_withdrawal::{insert_broadcasting_withdrawals, insert_partners, through_the_broker},
};

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let mut services = bench_services(&env, args.concurrency).await?;
    services.settings.broker.lambda_concurrency = args.concurrency;
    let partners = insert_partners(&services.pool, args.partners).await?;
    println!(
        "lambda-batch: one Amazon MQ batch of {} confirmations over {} partner(s), concurrency {} \
         (handle_batch chunks of {})",
        args.items,
        args.partners,
        args.concurrency,
        ConfirmWithdrawal::MAX_BATCH
    );

    let ids = insert_broadcasting_withdrawals(&services.pool, &partners, args.items).await?;
    let local =
        through_the_broker(&services, &ids, "local consumer (prefetch = concurrency)").await?;

    let ids = insert_broadcasting_withdrawals(&services.pool, &partners, args.items).await?;
    let event = ids
        .iter()
        .fold(
            MqEvent::new(&ConfirmWithdrawal::queue().queue()),
            |event, &withdrawal_id| {
                event.envelope(&Envelope::new(WithdrawalTxConfirmed {
                    withdrawal_id,
                    tx_hash: "0xbench".to_owned(),
                }))
            },
        )
        .event();
    let counters = Counters::read(&services.pool).await?;
    let started = Instant::now();
    let summary = handle_event(&ConfirmWithdrawal, &services, event).await?;
    let lambda = Phase {
        name: "one Lambda environment, one batch",
        unit: "messages",
        count: summary.processed,
        elapsed: started.elapsed(),
        statements: Some(counters.since(&services.pool).await?),
    };
    if summary.acked != args.items {
        bail!("the batch settled {summary:?}, not {} acks", args.items);
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
    lambda.print();
    println!(
        "one Lambda batch / local consumer:           {:.2}",
        lambda.rate() / local.rate()
    );
    Ok(())
}
