//! `paybus-lab bench confirm-withdrawal`: W2's confirmation through the broker, each message sent
//! twice, next to the same transaction driven directly and the database's write ceiling.

use anyhow::bail;
use paybus_bus::{Envelope, Handler, OutgoingMessage, Services};
use paybus_confirm_withdrawal::ConfirmWithdrawal;
use paybus_confirmations::{WithdrawalTxConfirmed, withdrawal::confirm_all};
use paybus_testkit::TestEnv;
use sqlx::MySqlPool;

use super::{
    BenchArgs, Phase, alternating_rounds, bench_services, database_ceiling, direct, doubled,
    print_confirmation_ratios, print_rounds, purge,
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
pub(super) const WEBHOOK_QUEUE: &str = "paybus.deliver-webhook";

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let services = bench_services(&env, args.concurrency).await?;
    let partners = insert_partners(&services.pool, args.partners).await?;
    println!(
        "confirm-withdrawal: {} withdrawals per phase over {} partner(s), each confirmation sent \
         twice, concurrency {}",
        args.items, args.partners, args.concurrency
    );

    let rounds = alternating_rounds(
        args.rounds,
        async || direct_phase(&services, &partners, args).await,
        async || broker_phase(&services, &partners, args.items).await,
    )
    .await?;

    let ceiling = database_ceiling(&services.pool, 2 * args.items, args.concurrency).await?;

    let debits: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM ledger_entries WHERE entry_type = 'DEBIT' AND reference_type = 'WITHDRAWAL'",
    )
    .fetch_one(&services.pool)
    .await?;
    let mut conn = services.pool.acquire().await?;
    let violations = paybus_ops::audit::run(&mut conn, &paybus_catalog::audit_checks()).await?;
    let withdrawals = 2 * args.items * rounds.len();
    if debits != i64::try_from(withdrawals)? || !violations.is_empty() {
        bail!(
            "exactly-once broken: {debits} debits for {withdrawals} withdrawals, audit: {violations:?}"
        );
    }

    print_rounds(&rounds);
    ceiling.print();
    print_confirmation_ratios(&rounds, &ceiling, args.items, args.pin_broker);
    println!("exactly once: {debits} debits for {withdrawals} withdrawals, audit clean");
    Ok(())
}

/// Direct: what the handler does with the messages, in its batches, with as many messages in
/// flight as the broker phase's prefetch.
async fn direct_phase(
    services: &Services,
    partners: &[u64],
    args: &BenchArgs,
) -> anyhow::Result<Phase> {
    purge(services, WEBHOOK_QUEUE).await?;
    let work =
        doubled(&insert_broadcasting_withdrawals(&services.pool, partners, args.items).await?);
    direct(
        services,
        work,
        ConfirmWithdrawal::MAX_BATCH,
        args.concurrency,
        "direct on the database (with duplicates)",
        |withdrawal_id| WithdrawalTxConfirmed {
            withdrawal_id,
            tx_hash: "0xbench".to_owned(),
        },
        |outbox, confirmations| async move { confirm_all(&outbox, &confirmations).await },
    )
    .await
}

/// Through the broker: the same number of messages, consumed by the real runtime. It starts
/// with the webhook queue as empty as the direct phase found it: nothing consumes it here,
/// and a quorum queue's cost per message grows with what it holds.
async fn broker_phase(
    services: &Services,
    partners: &[u64],
    items: usize,
) -> anyhow::Result<Phase> {
    purge(services, WEBHOOK_QUEUE).await?;
    let ids = insert_broadcasting_withdrawals(&services.pool, partners, items).await?;
    through_the_broker(
        services,
        &doubled(&ids),
        "through the broker (with duplicates)",
    )
    .await
}

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

/// A confirmation of each of `withdrawals` published, and consumed by the real runtime until
/// every one is processed.
pub(super) async fn through_the_broker(
    services: &Services,
    withdrawals: &[u64],
    name: &'static str,
) -> anyhow::Result<Phase> {
    let messages = confirmations(withdrawals)?;
    super::through_the_broker(services, ConfirmWithdrawal, &messages, name).await
}
