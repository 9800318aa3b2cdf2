//! W2 acceptance race (seed 001): 200 withdrawals in BROADCASTING, each confirmation arriving
//! three times at once. Through the broker with four consumers, confirm-withdrawal debits
//! each exactly once; the seed's original "read status, then update" design, driven through
//! the same schedule on the same database, debits them three times — so the hazard is real
//! here and the conditional transition is what removes it.

use std::{sync::Arc, time::Duration};

use lapin::{options::QueueDeclareOptions, types::FieldTable};
use paybus_bus::{Envelope, Handler, Outbox, Services, transition::Transition};
use paybus_config::Shards;
use paybus_confirm_withdrawal::ConfirmWithdrawal;
use paybus_confirmations::{WithdrawalTxConfirmed, withdrawal::confirm_if_in_flight};
use paybus_db as db;
use paybus_deliver_webhook::{DeliverWebhook, WebhookConfig, due_notifications};
use paybus_ledger::{self as ledger, EntryType, Posting, ReferenceType};
use paybus_maintenance::DueSweepConfig;
use paybus_money::Amount;
use paybus_runtime::runner::Runner;
use paybus_testkit::{
    TestEnv,
    confirmations::{assert_audit_clean, read_then_update},
    dec, eventually, scalar,
};
use sqlx::{MySql, MySqlPool, QueryBuilder, mysql::MySqlPoolOptions};
use tokio::{sync::Barrier, task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::outcome_counts::OutcomeCounts;
use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

const WITHDRAWALS: usize = 200;
/// Deliveries of each confirmation (the chain monitor re-sends while the first is in flight).
const COPIES: usize = 3;
const CONSUMERS: usize = 4;
const OPENING_BALANCE: &str = "1000000";

/// One partner with a webhook URL and an opening balance, and `WITHDRAWALS` NORMAL
/// withdrawals in BROADCASTING with distinct amounts. Returns the partner, the withdrawal ids
/// and the sum of their amounts.
async fn broadcasting_withdrawals(pool: &MySqlPool, webhook_url: &str) -> (u64, Vec<u64>, Amount) {
    let partner_id = paybus_testkit::partners::partner(pool, "partner 45", Some(webhook_url)).await;
    let mut tx = pool.begin().await.unwrap();
    ledger::post(
        &mut tx,
        &Posting::new(
            partner_id,
            "USDT",
            EntryType::Credit,
            dec(OPENING_BALANCE),
            ReferenceType::Migration,
            0,
        )
        .memo("opening balance"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let amounts: Vec<Amount> = (1..=WITHDRAWALS).map(|n| dec(&format!("{n}.25"))).collect();
    let mut insert = QueryBuilder::<MySql>::new(
        "INSERT INTO withdrawals (partner_id, kind, status, currency, amount, to_address, tx_hash) ",
    );
    insert.push_values(amounts.iter().enumerate(), |mut row, (n, amount)| {
        row.push_bind(partner_id)
            .push_bind("NORMAL")
            .push_bind("BROADCASTING")
            .push_bind("USDT")
            .push_bind(*amount)
            .push_bind("T-partner-wallet")
            .push_bind(tx_hash(n));
    });
    insert.build().execute(pool).await.unwrap();
    let ids: Vec<u64> = sqlx::query_scalar("SELECT id FROM withdrawals ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(ids.len(), WITHDRAWALS);
    (partner_id, ids, amounts.iter().copied().sum())
}

fn tx_hash(n: usize) -> String {
    format!("0x{n:064x}")
}

async fn confirmation_debits(pool: &MySqlPool) -> i64 {
    scalar(
        pool,
        "SELECT COUNT(*) FROM ledger_entries \
         WHERE entry_type = 'DEBIT' AND reference_type = 'WITHDRAWAL'",
    )
    .await
}

/// Seed 001 §7: withdrawals debited more than once.
async fn withdrawals_debited_twice(pool: &MySqlPool) -> i64 {
    scalar(
        pool,
        "SELECT COUNT(*) FROM ( \
             SELECT reference_id FROM ledger_entries \
             WHERE reference_type = 'WITHDRAWAL' AND entry_type = 'DEBIT' \
             GROUP BY reference_id HAVING COUNT(*) > 1) doubled",
    )
    .await
}

async fn balance(pool: &MySqlPool, partner_id: u64) -> Amount {
    sqlx::query_scalar(
        "SELECT balance FROM partner_balances WHERE partner_id = ? AND currency = 'USDT'",
    )
    .bind(partner_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn queue_counts(channel: &lapin::Channel, queue: &str) -> (u32, u32) {
    let queue = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    (queue.message_count(), queue.consumer_count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_confirmations_delivered_three_times_to_four_consumers_debit_exactly_once() {
    broker_race(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_race_on_four_shards_debits_exactly_once() {
    // Exactly-once does not depend on the shard layout: with confirm-withdrawal and
    // deliver-webhook on four queues each (every consumer on every shard, copies of one
    // withdrawal on the same shard), the same schedule gives the same single effects.
    broker_race(4).await;
}

/// The race through the broker with each function's messages over `shards` queues.
async fn broker_race(shards: u16) {
    let counts = OutcomeCounts::take().await;
    let mut env = TestEnv::new().await;
    env.settings.broker.shards = Shards::default()
        .with(ConfirmWithdrawal::FUNCTION, shards)
        .with(DeliverWebhook::FUNCTION, shards);
    let layout =
        |queue| paybus_bus::topology::FunctionQueue::queues_in(queue, &env.settings.broker.shards);
    // The partner: a real HTTP server that answers 200 and remembers every webhook.
    let partner = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&partner)
        .await;
    let webhook_url = format!("{}/partner-webhook", partner.uri());
    let (partner_id, ids, total) = broadcasting_withdrawals(&env.db, &webhook_url).await;
    let services = Services::connect(env.settings.clone()).await.unwrap();
    let queues: Vec<_> = [ConfirmWithdrawal::queue(), DeliverWebhook::queue()]
        .into_iter()
        .flat_map(layout)
        .collect();
    services.declare_topology(&queues).await.unwrap();
    let tap = services.connection().create_channel().await.unwrap();
    // Four consumers, each a process of its own as far as the broker and the database can
    // tell: its own connection, channel, prefetch (the default) and pool.
    let shutdown = CancellationToken::new();
    let mut consumers = JoinSet::new();
    for consumer in 0..CONSUMERS {
        let mut runner = Runner::new(Services::connect(env.settings.clone()).await.unwrap());
        runner.add_function(ConfirmWithdrawal);
        runner.add_function(
            DeliverWebhook::new(WebhookConfig::default(), paybus_testkit::sealer()).unwrap(),
        );
        if consumer == 0 {
            // The product's sweeper: a delivery that found its partner at the in-flight bound
            // is deferred, and only this sweep publishes it again. Without it a loaded CI
            // machine (a partner slower than the 100 ms slot wait) lost 7 of 200 webhooks.
            let sweep = DueSweepConfig {
                interval: Duration::from_secs(1),
                ..DueSweepConfig::default()
            };
            let services = runner.services().clone();
            runner.add_job(Arc::new(due_notifications(&services, sweep)));
        }
        let token = shutdown.clone();
        consumers.spawn(async move { runner.run(token).await.unwrap() });
    }
    for queue in layout(ConfirmWithdrawal::queue()) {
        let queue = queue.queue();
        assert!(
            eventually(Duration::from_secs(30), || async {
                queue_counts(&tap, &queue).await.1 >= u32::try_from(CONSUMERS).unwrap()
            })
            .await,
            "the consumers of {queue} did not start"
        );
    }

    // Copies of one confirmation are adjacent, so the broker hands them to different
    // consumers at the same moment. Each copy is its own message, as a re-sent webhook is.
    let messages: Vec<_> = ids
        .iter()
        .enumerate()
        .flat_map(|(n, &withdrawal_id)| {
            (0..COPIES).map(move |_| {
                Envelope::new(WithdrawalTxConfirmed {
                    withdrawal_id,
                    tx_hash: tx_hash(n),
                })
                .to_outgoing()
                .unwrap()
            })
        })
        .collect();
    let started = Instant::now();
    for result in services.publisher().publish_events(&messages).await {
        result.expect("the broker confirmed the publish");
    }
    let handled = eventually(Duration::from_secs(120), || async {
        counts.count("confirm-withdrawal", "done") + counts.count("confirm-withdrawal", "skipped")
            >= u64::try_from(WITHDRAWALS * COPIES).unwrap()
    })
    .await;
    let elapsed = started.elapsed();
    let webhooks = || async { partner.received_requests().await.unwrap_or_default() };
    let notified = eventually(Duration::from_secs(60), || async {
        webhooks().await.len() >= WITHDRAWALS
    })
    .await;
    // Room for a (wrong) second webhook to arrive before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    while let Some(joined) = consumers.join_next().await {
        joined.unwrap();
    }
    eprintln!(
        "{} deliveries on {shards} shard(s) handled in {elapsed:?} (done {}, skipped {}, requeued {}); \
         webhooks deferred at the partner's bound {}",
        WITHDRAWALS * COPIES,
        counts.count("confirm-withdrawal", "done"),
        counts.count("confirm-withdrawal", "skipped"),
        counts.count("confirm-withdrawal", "requeued"),
        counts.count(DeliverWebhook::FUNCTION, "deferred"),
    );

    assert!(handled, "not every delivery was handled in time");
    assert_eq!(
        counts.count("confirm-withdrawal", "done"),
        u64::try_from(WITHDRAWALS).unwrap()
    );
    assert_eq!(
        counts.count("confirm-withdrawal", "skipped"),
        u64::try_from(WITHDRAWALS * (COPIES - 1)).unwrap()
    );
    let expected = i64::try_from(WITHDRAWALS).unwrap();
    assert_eq!(confirmation_debits(&env.db).await, expected);
    assert_eq!(withdrawals_debited_twice(&env.db).await, 0);
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(DISTINCT idem_key) FROM ledger_entries \
             WHERE entry_type = 'DEBIT' AND idem_key = CONCAT('WDR_CONFIRM:', reference_id)"
        )
        .await,
        expected
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM withdrawals WHERE status = 'CONFIRMED'"
        )
        .await,
        expected
    );
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM withdrawal_status_history").await,
        expected
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM partner_notifications WHERE event = 'WITHDRAWAL_CONFIRMED'"
        )
        .await,
        expected
    );
    assert!(
        notified,
        "the partner got {} webhooks",
        webhooks().await.len()
    );
    let received = webhooks().await;
    assert_eq!(received.len(), WITHDRAWALS, "one webhook per withdrawal");
    let distinct: std::collections::HashSet<_> = received
        .iter()
        .filter_map(|r| r.headers.get("x-paybus-notification-id"))
        .collect();
    assert_eq!(distinct.len(), WITHDRAWALS);
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM partner_notifications WHERE status = 'DELIVERED'"
        )
        .await,
        expected
    );
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM dead_letters").await,
        0
    );
    assert_eq!(
        balance(&env.db, partner_id).await,
        dec(OPENING_BALANCE) - total
    );
    assert_audit_clean(&env.db).await;
}

/// How one copy of a confirmation is processed in the three-copy race below.
#[derive(Clone, Copy)]
enum Design {
    /// The seed's original `onTxConfirmed`: decide on the snapshot, overwrite, DEBIT unkeyed.
    ReadThenUpdate,
    /// confirm-withdrawal's `confirm_if_in_flight`.
    ConditionalUpdate,
}

/// Runs `COPIES` concurrent transactions per withdrawal, on separate connections, each first
/// reading the withdrawal (its snapshot) and waiting until every copy has read, then
/// processing it with `design` and committing. Withdrawals go in waves, so the pool always has
/// a connection for every copy of a wave. Returns how many copies debited.
async fn race_copies(outbox: &Outbox, ids: &[u64], design: Design) -> usize {
    const WAVE: usize = 16;
    let mut debited = 0;
    for (wave, chunk) in ids.chunks(WAVE).enumerate() {
        let mut copies = JoinSet::new();
        for (i, &withdrawal_id) in chunk.iter().enumerate() {
            let tx_hash = tx_hash(wave * WAVE + i);
            let snapshots_taken = Arc::new(Barrier::new(COPIES));
            for _ in 0..COPIES {
                let (outbox, tx_hash, snapshots_taken) =
                    (outbox.clone(), tx_hash.clone(), snapshots_taken.clone());
                copies.spawn(async move {
                    let mut uow = outbox.begin().await.unwrap();
                    let debited = match design {
                        Design::ReadThenUpdate => read_then_update(
                            &mut uow,
                            withdrawal_id,
                            &tx_hash,
                            snapshots_taken.wait(),
                        )
                        .await
                        .unwrap(),
                        Design::ConditionalUpdate => {
                            let _snapshot: String =
                                sqlx::query_scalar("SELECT status FROM withdrawals WHERE id = ?")
                                    .bind(withdrawal_id)
                                    .fetch_one(&mut *uow)
                                    .await
                                    .unwrap();
                            snapshots_taken.wait().await;
                            let confirmation = confirm_if_in_flight(
                                &mut uow,
                                withdrawal_id,
                                &tx_hash,
                                uuid::Uuid::now_v7(),
                            )
                            .await
                            .unwrap();
                            matches!(confirmation, Transition::Transitioned(_))
                        }
                    };
                    match design {
                        // Its writes are the point: commit them.
                        Design::ReadThenUpdate => uow.commit().await.unwrap(),
                        Design::ConditionalUpdate if debited => uow.commit().await.unwrap(),
                        Design::ConditionalUpdate => uow.rollback().await.unwrap(),
                    }
                    debited
                });
            }
        }
        while let Some(joined) = copies.join_next().await {
            debited += usize::from(joined.unwrap());
        }
    }
    debited
}

/// The race harness's own pool, large enough for every copy of a wave, and an outbox on it.
async fn race_outbox(env: &TestEnv) -> (MySqlPool, Services, Outbox) {
    let pool = MySqlPoolOptions::new()
        .max_connections(u32::try_from(16 * COPIES).unwrap())
        .connect_with(db::connect_options(&env.settings.database).unwrap())
        .await
        .unwrap();
    let services = Services::connect(env.settings.clone()).await.unwrap();
    // deliver-webhook's queue makes the notification messages routable; nobody consumes it.
    services
        .declare_topology(&[ConfirmWithdrawal::queue(), DeliverWebhook::queue()])
        .await
        .unwrap();
    let outbox = Outbox::new(pool.clone(), services.publisher().clone());
    (pool, services, outbox)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_seeds_read_then_update_design_debits_twice_under_the_same_race() {
    let env = TestEnv::new().await;
    let (partner_id, ids, total) =
        broadcasting_withdrawals(&env.db, "http://127.0.0.1:9/not-under-test").await;
    let (pool, _services, outbox) = race_outbox(&env).await;

    let debited = tokio::time::timeout(
        Duration::from_secs(120),
        race_copies(&outbox, &ids, Design::ReadThenUpdate),
    )
    .await
    .expect("the race finished");

    // Every copy read BROADCASTING from its snapshot, waited for the row lock, overwrote the
    // confirmation and debited again.
    let debits = confirmation_debits(&pool).await;
    eprintln!("read-then-update: {debits} DEBITs for {WITHDRAWALS} withdrawals");
    assert!(debits > i64::try_from(WITHDRAWALS).unwrap(), "{debits}");
    assert_eq!(debits, i64::try_from(WITHDRAWALS * COPIES).unwrap());
    assert_eq!(debited, WITHDRAWALS * COPIES);
    assert_eq!(
        withdrawals_debited_twice(&pool).await,
        i64::try_from(WITHDRAWALS).unwrap()
    );
    // The ledger now says the partner paid three times what left on chain.
    assert_eq!(
        balance(&pool, partner_id).await,
        dec(OPENING_BALANCE) - total.checked_mul(COPIES as i64).unwrap()
    );
    assert_eq!(
        scalar(&pool, "SELECT COUNT(*) FROM withdrawal_status_history").await,
        i64::try_from(WITHDRAWALS * COPIES).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_conditional_update_debits_once_under_the_same_race() {
    let env = TestEnv::new().await;
    let (partner_id, ids, total) =
        broadcasting_withdrawals(&env.db, "http://127.0.0.1:9/not-under-test").await;
    let (pool, _services, outbox) = race_outbox(&env).await;

    let debited = tokio::time::timeout(
        Duration::from_secs(120),
        race_copies(&outbox, &ids, Design::ConditionalUpdate),
    )
    .await
    .expect("the race finished");

    let expected = i64::try_from(WITHDRAWALS).unwrap();
    assert_eq!(debited, WITHDRAWALS);
    assert_eq!(confirmation_debits(&pool).await, expected);
    assert_eq!(withdrawals_debited_twice(&pool).await, 0);
    assert_eq!(
        scalar(&pool, "SELECT COUNT(*) FROM withdrawal_status_history").await,
        expected
    );
    assert_eq!(
        scalar(&pool, "SELECT COUNT(*) FROM partner_notifications").await,
        expected
    );
    assert_eq!(
        balance(&pool, partner_id).await,
        dec(OPENING_BALANCE) - total
    );
    assert_audit_clean(&pool).await;
}
