//! `paybus-lab bench confirm-deposit`: W2's deposit confirmation through the broker, each
//! message sent twice, next to the same transactions driven directly and the database's write
//! ceiling (the figures confirm-withdrawal's bench prints, `--rounds` as it takes them); and each
//! of the first two also one message per transaction, the shape confirm-deposit had before its
//! batches, once.

use anyhow::bail;
use paybus_bus::{Context, Envelope, Handler, HandlerError, Outcome, OutgoingMessage};
use paybus_confirm_deposit::ConfirmDeposit;
use paybus_confirmations::{
    DepositTxConfirmed,
    deposit::{confirm, confirm_all},
};
use paybus_testkit::TestEnv;
use sqlx::MySqlPool;

use super::{
    BenchArgs, alternating_rounds, bench_services, confirm_withdrawal::WEBHOOK_QUEUE,
    confirm_withdrawal::insert_partners, database_ceiling, direct, doubled,
    print_confirmation_ratios, print_rounds, purge, through_the_broker,
};

/// `count` DETECTED deposits of 1 USDT with a fee of 0.01 (so each confirmation posts a CREDIT
/// and a FEE), each on a tx of its own, spread round robin over `partners`.
async fn insert_detected_deposits(
    pool: &MySqlPool,
    partners: &[u64],
    count: usize,
) -> anyhow::Result<Vec<u64>> {
    let mut ids = Vec::with_capacity(count);
    let rows: Vec<usize> = (0..count).collect();
    for chunk in rows.chunks(500) {
        let mut query = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "INSERT INTO deposits (partner_id, currency, amount, fee, tx_hash, to_address) ",
        );
        query.push_values(chunk, |mut row, n| {
            row.push_bind(partners[n % partners.len()])
                .push("'USDT'")
                .push("1")
                .push("0.01")
                .push("CONCAT('0x', REPLACE(UUID(), '-', ''))")
                .push("'bench-address'");
        });
        let done = query.build().execute(pool).await?;
        let first = done.last_insert_id();
        ids.extend((0..done.rows_affected()).map(|i| first + i));
    }
    Ok(ids)
}

fn messages(deposits: &[u64]) -> anyhow::Result<Vec<OutgoingMessage>> {
    Ok(deposits
        .iter()
        .map(|&deposit_id| Envelope::new(DepositTxConfirmed { deposit_id }).to_outgoing())
        .collect::<Result<_, _>>()?)
}

/// confirm-deposit as the runtime ran it before its batches: every message on its own, in a
/// transaction of its own (on confirm-deposit's queue).
struct OneAtATime;

impl Handler for OneAtATime {
    type Message = DepositTxConfirmed;
    const FUNCTION: &'static str = ConfirmDeposit::FUNCTION;

    async fn handle(
        &self,
        message: Envelope<DepositTxConfirmed>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        confirm(ctx.db, &message.data, message.correlation_id).await
    }
}

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let services = bench_services(&env, args.concurrency).await?;
    let partners = insert_partners(&services.pool, args.partners).await?;
    println!(
        "confirm-deposit: {} deposits per phase over {} partner(s), each confirmation sent \
         twice, concurrency {}",
        args.items, args.partners, args.concurrency
    );
    let fresh = async || -> anyhow::Result<Vec<u64>> {
        Ok(doubled(
            &insert_detected_deposits(&services.pool, &partners, args.items).await?,
        ))
    };
    let message = |deposit_id| DepositTxConfirmed { deposit_id };

    // Direct: what the handler does with the messages, in its batches, with as many messages in
    // flight as the broker phase's prefetch. Through the broker: the same number of messages,
    // consumed by the real runtime; each such phase starts with the webhook queue as empty as
    // the direct phase found it (nothing consumes it here, and a quorum queue's cost per
    // message grows with what it holds).
    let batched_direct = async || {
        direct(
            &services,
            fresh().await?,
            ConfirmDeposit::MAX_BATCH,
            args.concurrency,
            "direct on the database (with duplicates)",
            message,
            |outbox, confirmations| async move { confirm_all(&outbox, &confirmations).await },
        )
        .await
    };
    let batched_through_broker = async || {
        purge(&services, WEBHOOK_QUEUE).await?;
        through_the_broker(
            &services,
            ConfirmDeposit,
            &messages(&fresh().await?)?,
            "through the broker (with duplicates)",
        )
        .await
    };
    let rounds = alternating_rounds(args.rounds, batched_direct, batched_through_broker).await?;

    // Once: each of the two one message per transaction, the shape before the batches.
    let single = direct(
        &services,
        fresh().await?,
        1,
        args.concurrency,
        "direct, one per transaction",
        message,
        |outbox, confirmations| async move { confirm_all(&outbox, &confirmations).await },
    )
    .await?;
    purge(&services, WEBHOOK_QUEUE).await?;
    let through_broker_single = through_the_broker(
        &services,
        OneAtATime,
        &messages(&fresh().await?)?,
        "through the broker, one per transaction",
    )
    .await?;

    let ceiling = database_ceiling(&services.pool, 2 * args.items, args.concurrency).await?;

    // Two phases of `items` deposits a round and the two single ones, each deposit credited
    // once and charged its fee once.
    let expected = i64::try_from((2 * rounds.len() + 2) * args.items)?;
    let (credits, fees): (i64, i64) = sqlx::query_as(
        "SELECT CAST(SUM(entry_type = 'CREDIT') AS SIGNED), CAST(SUM(entry_type = 'FEE') AS SIGNED) \
         FROM ledger_entries WHERE reference_type = 'DEPOSIT'",
    )
    .fetch_one(&services.pool)
    .await?;
    let mut conn = services.pool.acquire().await?;
    let violations = paybus_ops::audit::run(&mut conn, &paybus_catalog::audit_checks()).await?;
    if credits != expected || fees != expected || !violations.is_empty() {
        bail!(
            "exactly-once broken: {credits} credits and {fees} fees for {expected} deposits, \
             audit: {violations:?}"
        );
    }

    print_rounds(&rounds);
    single.print();
    through_broker_single.print();
    ceiling.print();
    // Against the last round's batched phases, which ran just before the single ones.
    let Some((batched, through_broker)) = rounds.last() else {
        bail!("--rounds must be at least 1");
    };
    let (batched_direct, batched_through_broker) = (
        batched.rate() / single.rate(),
        through_broker.rate() / through_broker_single.rate(),
    );
    print_confirmation_ratios(&rounds, &ceiling, args.items, args.pin_broker);
    println!(
        "batched / one message per transaction:      direct {batched_direct:.2}, through the \
         broker {batched_through_broker:.2}"
    );
    println!(
        "exactly once: {credits} credits and {fees} fees for {expected} deposits, audit clean"
    );
    Ok(())
}
