//! W1 acceptance races (seed 000), against the real database and broker, with a real HTTP
//! server standing in for the quote service:
//!
//! - 100 buyers at once against 20 sellers, through the broker: no liquidity is used twice,
//!   every order ends terminal, every reservation is settled or released, one trade per
//!   matched order.
//! - 32 buyers at once with a slow (300 ms) quote service: while every one of them is inside
//!   its quote call, `FOR UPDATE NOWAIT` takes every seller row, every order row and the
//!   partners' rows at once — no transaction holds a lock across the call. The control runs
//!   the seed's design (its locks held across the call) and shows the same probe refused.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::{sync::Arc, time::Duration};

use paybus_match_deposit::{DueOrders, MatchDeposit};
use paybus_money::{Amount, dec};
use paybus_p2p::{
    DepositOrderStatus, FillPolicy, Handoff, Matcher, MatchingConfig,
    quote::QuoteClient,
    testing::{self, QuoteStub, assert_audit_clean},
};
use paybus_platform::{
    bus::{Handler, Runner},
    testing::{TestEnv, eventually, scalar},
};
use sqlx::{Connection, MySqlConnection, MySqlPool};
use tokio::{sync::Barrier, task::JoinSet};
use tokio_util::sync::CancellationToken;

const BUYERS: usize = 100;
const SELLERS: usize = 20;

/// Amounts that do not all fit: 20 sellers of 50 hold 1,000; 100 buyers want 1,250.
fn buyer_amount(i: usize) -> String {
    format!("{}.5", 5 + i % 16)
}

async fn sum(pool: &MySqlPool, sql: &'static str) -> Amount {
    sqlx::query_scalar::<_, Amount>(sql)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_buyers_at_once_against_twenty_sellers_never_use_liquidity_twice() {
    let env = TestEnv::new().await;
    let services = env.services(&[MatchDeposit::queue()]).await;
    // A little latency, so attempts overlap in their quote calls.
    let stub = QuoteStub::with_delay(Duration::from_millis(20)).await;
    let buyer = testing::partner(&env.db, "buyers").await;
    let seller_partner = testing::partner(&env.db, "sellers").await;
    testing::sellers(&env.db, seller_partner, SELLERS, "50").await;
    let config = MatchingConfig {
        poll_interval: Duration::from_millis(200),
        ..testing::config(&stub, FillPolicy::FillOrCancel, 5)
    };
    let matcher = Matcher::new(services.outbox.clone(), config).unwrap();
    let mut runner = Runner::new(services.clone());
    runner.add_function(MatchDeposit::new(matcher.clone()));
    runner.add_job(Arc::new(DueOrders::new(matcher.clone())));
    let stop = CancellationToken::new();
    let running = tokio::spawn(runner.run(stop.clone()));

    // Every buyer's order created at the same moment (async matching on: queued).
    let start = Arc::new(Barrier::new(BUYERS));
    let mut buyers = JoinSet::new();
    for i in 0..BUYERS {
        let (matcher, start) = (matcher.clone(), start.clone());
        buyers.spawn(async move {
            start.wait().await;
            matcher
                .create(&testing::buyer(buyer, &buyer_amount(i)), Handoff::Queued)
                .await
                .unwrap()
                .id()
        });
    }
    let ids = buyers.join_all().await;
    assert_eq!(ids.len(), BUYERS);

    let settled = eventually(Duration::from_secs(120), || async {
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM p2p_deposit_orders WHERE status IN ('PENDING', 'MATCHING')",
        )
        .await
            == 0
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    assert!(settled, "orders still open after two minutes");

    // Every order terminal: matched, or cancelled for want of liquidity.
    let by_outcome: Vec<(String, Option<String>, i64)> = sqlx::query_as(
        "SELECT status, close_reason, COUNT(*) FROM p2p_deposit_orders \
         GROUP BY status, close_reason ORDER BY status",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    let matched = scalar(
        &env.db,
        "SELECT COUNT(*) FROM p2p_deposit_orders WHERE status = 'MATCHED'",
    )
    .await;
    for (status, reason, _) in &by_outcome {
        assert!(
            matches!(
                (status.as_str(), reason.as_deref()),
                ("MATCHED", Some("FILLED")) | ("CANCELLED", Some("NO_LIQUIDITY"))
            ),
            "{by_outcome:?}"
        );
    }
    assert!(matched > 0 && matched < BUYERS as i64, "{by_outcome:?}");
    // No reservation outlives its attempt.
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM p2p_matches WHERE status = 'RESERVED'"
        )
        .await,
        0
    );
    // No seller gave more than it offered; what the sellers gave is what the matched buyers got.
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM p2p_withdraw_orders w \
             WHERE (SELECT COALESCE(SUM(m.amount), 0) FROM p2p_matches m \
                    WHERE m.withdraw_order_id = w.id AND m.status = 'CONFIRMED') > w.amount \
                OR w.reserved_amount <> 0",
        )
        .await,
        0
    );
    let given = sum(
        &env.db,
        "SELECT COALESCE(SUM(amount - remaining_amount), 0) FROM p2p_withdraw_orders",
    )
    .await;
    let confirmed = sum(
        &env.db,
        "SELECT COALESCE(SUM(amount), 0) FROM p2p_matches WHERE status = 'CONFIRMED'",
    )
    .await;
    let bought = sum(
        &env.db,
        "SELECT COALESCE(SUM(amount), 0) FROM p2p_deposit_orders WHERE status = 'MATCHED'",
    )
    .await;
    assert_eq!((given, confirmed), (bought, bought));
    assert!(bought <= dec("1000"));
    // One trade per matched order, each asked for once.
    let trades = stub.trades();
    assert_eq!(trades.len() as i64, matched);
    assert!(trades.values().all(|t| t.requests == 1), "{trades:?}");
    assert_audit_clean(&env.db).await;
}

// ---------------------------------------------------------------------------------------------
// No lock across the quote call

const CONCURRENT_BUYERS: usize = 32;
const SLOW: Duration = Duration::from_millis(300);

/// What a probe found.
#[derive(Debug, Default)]
struct Probe {
    rows: usize,
    refused: Vec<String>,
}

/// `SELECT ... FOR UPDATE NOWAIT` over every row of each table, a table per transaction
/// (READ COMMITTED: no gap locks of its own), on a connection of its own: a table any row of
/// which another transaction holds is refused at once instead of waited for.
async fn probe(url: &str, tables: &[(&'static str, &'static str)]) -> Probe {
    let mut conn = MySqlConnection::connect(url).await.unwrap();
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut found = Probe::default();
    for (table, key) in tables {
        let mut tx = conn.begin().await.unwrap();
        let locked = sqlx::query_scalar::<_, u64>(sqlx::AssertSqlSafe(format!(
            "SELECT {key} FROM {table} FOR UPDATE NOWAIT"
        )))
        .fetch_all(&mut *tx)
        .await;
        match locked {
            Ok(rows) => found.rows += rows.len(),
            Err(error) => found.refused.push(format!("{table}: {error}")),
        }
        tx.rollback().await.unwrap();
    }
    found
}

const PROBED: &[(&str, &str)] = &[
    ("p2p_withdraw_orders", "id"),
    ("p2p_deposit_orders", "id"),
    ("partners", "id"),
    ("p2p_matches", "id"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_transaction_holds_a_row_lock_while_a_slow_quote_call_is_in_flight() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let buyer = testing::partner(&env.db, "buyers").await;
    let seller_partner = testing::partner(&env.db, "sellers").await;
    testing::sellers(&env.db, seller_partner, 40, "1000").await;
    let url = env.settings.database.url.to_string();

    // A round: 32 buyers start together; once all 32 are inside their getQuote call and none
    // has reached createTrade, every buyer's reservation has committed and no settle has begun
    // — the probe runs then. On a slow machine the buyers may not all get there within one
    // call's 300 ms; a round without that moment probes nothing and another round runs.
    let mut probes = Vec::new();
    for round in 0..3 {
        let stub = QuoteStub::with_delay(SLOW).await;
        let matcher = Matcher::new(
            services.outbox.clone(),
            testing::config(&stub, FillPolicy::FillOrCancel, 5),
        )
        .unwrap();
        let start = Arc::new(Barrier::new(CONCURRENT_BUYERS));
        let mut buyers = JoinSet::new();
        for _ in 0..CONCURRENT_BUYERS {
            let (matcher, start) = (matcher.clone(), start.clone());
            buyers.spawn(async move {
                start.wait().await;
                matcher
                    .create(&testing::buyer(buyer, "1"), Handoff::Inline)
                    .await
                    .unwrap()
            });
        }
        let all_in_flight = eventually(Duration::from_secs(10), || async {
            stub.quote_calls() == CONCURRENT_BUYERS as u64 || stub.trade_calls() > 0
        })
        .await;
        if all_in_flight && stub.trade_calls() == 0 {
            let found = probe(&url, PROBED).await;
            // Only a probe that ended while every buyer was still inside its call proves what
            // it says; one that outlasted the calls may meet a settle's locks.
            if stub.trade_calls() == 0 {
                probes.push(found);
            } else {
                eprintln!("round {round}: the probe outlasted the quote calls; not counted");
            }
        }
        for created in buyers.join_all().await {
            assert!(
                matches!(
                    created,
                    paybus_p2p::Created::Attempted {
                        accounted: paybus_p2p::Accounted::Terminal {
                            status: DepositOrderStatus::Matched,
                            ..
                        },
                        ..
                    }
                ),
                "{created:?}"
            );
        }
        if !probes.is_empty() {
            break;
        }
    }

    assert!(
        !probes.is_empty(),
        "no round had all 32 buyers inside their quote call at once"
    );
    for found in &probes {
        // 40 sellers, 32 orders, 2 partners, 32 matches.
        assert!(found.rows >= 40 + 32 + 2 + 32, "{found:?}");
        assert!(
            found.refused.is_empty(),
            "locked during the quote call: {:#?}",
            found.refused
        );
    }
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_the_seeds_design_holds_its_locks_across_the_quote_call() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let buyer = testing::partner(&env.db, "buyers").await;
    let seller_partner = testing::partner(&env.db, "sellers").await;
    testing::sellers(&env.db, seller_partner, 40, "1000").await;
    let url = env.settings.database.url.to_string();
    let stub = QuoteStub::with_delay(SLOW).await;
    let quote = QuoteClient::new(&stub.config()).unwrap().unwrap();

    let outbox = services.outbox.clone();
    let seed = tokio::spawn(async move {
        testing::create_and_match_holding_locks(&outbox, &quote, &testing::buyer(buyer, "1"))
            .await
            .unwrap()
    });
    let in_flight = eventually(Duration::from_secs(10), || async {
        stub.quote_calls() == 1
    })
    .await;
    assert!(in_flight);
    let found = probe(&url, &[("p2p_withdraw_orders", "id"), ("partners", "id")]).await;
    seed.await.unwrap();

    // Its candidates (the oldest sellers) and the buyer's partner row are held by the one
    // buyer whose quote call is in flight.
    assert_eq!(found.refused.len(), 2, "{found:#?}");
    assert!(
        found.refused[0].starts_with("p2p_withdraw_orders"),
        "{found:#?}"
    );
    assert!(found.refused[1].starts_with("partners"), "{found:#?}");
    assert_audit_clean(&env.db).await;
}
