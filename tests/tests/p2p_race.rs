//! W1 acceptance races (seed 000), against the real database and broker, with a real HTTP
//! server standing in for the quote service:
//!
//! - 100 buyers at once against 20 sellers, through the broker: no liquidity is used twice,
//!   every order ends terminal, every reservation is settled or released, one trade per
//!   matched order.
//! - 32 buyers at once with a slow (300 ms) quote service, each with its own partner, currency
//!   and seller (so no other buyer has a reason to touch its rows), probed all along with
//!   `FOR UPDATE NOWAIT`: inside its calls, the caller's deposit order, seller and partner
//!   rows are free every time — no transaction holds a lock across the call. The control runs
//!   the seed's design (its locks held across the call) under the same probers: inside its
//!   calls, none of the three is ever free. (Shared sellers under contention are the first
//!   test's subject.)

use std::{sync::Arc, time::Duration};

use paybus_bus::Handler;
use paybus_db::error_number;
use paybus_match_deposit::{DueOrders, MatchDeposit};
use paybus_money::Amount;
use paybus_p2p::{
    Accounted, Created, DepositOrderStatus, FillPolicy, Handoff, Matcher, MatchingConfig,
    quote::QuoteClient,
};
use paybus_runtime::runner::Runner;
use paybus_testkit::{
    TestEnv, dec, eventually,
    p2p::{self, QuoteStub, StubCall, assert_audit_clean},
    scalar,
};
use sqlx::{Connection, MySqlConnection, MySqlPool};
use std::time::Instant;
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
    let buyer = p2p::partner(&env.db, "buyers").await;
    let seller_partner = p2p::partner(&env.db, "sellers").await;
    p2p::sellers(&env.db, seller_partner, SELLERS, "50").await;
    let config = MatchingConfig {
        poll_interval: Duration::from_millis(200),
        ..p2p::config(&stub, FillPolicy::FillOrCancel, 5)
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
                .create(&p2p::buyer(buyer, &buyer_amount(i)), Handoff::Queued)
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

/// One buyer of the lock tests: its partner, its currency and the one seller of that currency,
/// so that during its calls no other buyer has any reason to touch its rows.
#[derive(Debug, Clone)]
struct Buyer {
    partner_id: u64,
    currency: String,
    seller_id: u64,
}

/// `n` buyers, each with a partner, a currency and a seller of its own.
async fn own_markets(pool: &MySqlPool, n: usize) -> Vec<Buyer> {
    let seller_partner = p2p::partner(pool, "sellers").await;
    let mut buyers = Vec::with_capacity(n);
    for i in 0..n {
        let currency = format!("T{i:02}");
        buyers.push(Buyer {
            partner_id: p2p::partner(pool, &format!("buyer {i}")).await,
            seller_id: p2p::seller_in(pool, seller_partner, &currency, "100").await,
            currency,
        });
    }
    buyers
}

/// One `SELECT ... FOR UPDATE NOWAIT` of one row (autocommit: a transaction of its own, one
/// round trip): a row another transaction holds is refused at once instead of waited for.
#[derive(Debug, Clone, Copy)]
struct Probed {
    row: &'static str,
    started: Instant,
    ended: Instant,
    free: bool,
}

async fn nowait(conn: &mut MySqlConnection, table: &'static str, id: u64) -> Probed {
    let started = Instant::now();
    let locked = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {table} WHERE id = ? FOR UPDATE NOWAIT"
    )))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await;
    let ended = Instant::now();
    // Only a refusal for the lock counts as "held": any other error would make the control
    // pass for the wrong reason.
    let free = match locked {
        Ok(_) => true,
        Err(e) if error_number(&e).is_some_and(|n| LOCK_REFUSED.contains(&n)) => false,
        Err(e) => panic!("probe of {table} {id} failed: {e}"),
    };
    Probed {
        row: table,
        started,
        ended,
        free,
    }
}

/// `NOWAIT` refused the lock: MariaDB reports a lock wait timeout, MySQL 8 `ER_LOCK_NOWAIT`.
const LOCK_REFUSED: [u16; 2] = [1205, 3572];

/// A probe of a caller's row made entirely inside one of its quote service calls.
#[derive(Debug, Clone)]
struct InsideCall {
    call: StubCall,
    probed: Probed,
}

/// Until `stop`: whenever one of `buyer`'s quote service calls is in flight, probes the
/// buyer's own rows — its deposit order, its seller, its partner — and keeps each probe that
/// began after the call arrived and ended before it was answered. One prober (and connection)
/// per buyer, so every call is probed within its 300 ms.
async fn probe_caller(
    url: String,
    stub: Arc<QuoteStub>,
    buyer: Buyer,
    stop: CancellationToken,
) -> Vec<InsideCall> {
    let mut conn = MySqlConnection::connect(&url).await.unwrap();
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut inside = Vec::new();
    while !stop.is_cancelled() {
        let now = Instant::now();
        let in_flight = stub.calls().into_iter().find(|call| {
            call.currency == buyer.currency && call.arrived <= now && now < call.answered
        });
        if let Some((call, order_id)) =
            in_flight.and_then(|call| call.deposit_order_id().map(|id| (call, id)))
        {
            for (table, id) in [
                ("p2p_deposit_orders", order_id),
                ("p2p_withdraw_orders", buyer.seller_id),
                ("partners", buyer.partner_id),
            ] {
                let probed = nowait(&mut conn, table, id).await;
                if probed.started >= call.arrived && probed.ended <= call.answered {
                    inside.push(InsideCall {
                        call: call.clone(),
                        probed,
                    });
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    inside
}

/// Runs `buy` for every buyer at once, each under its prober; returns the probes made inside
/// calls.
async fn probed<F, Fut>(
    env: &TestEnv,
    stub: &Arc<QuoteStub>,
    buyers: &[Buyer],
    buy: F,
) -> Vec<InsideCall>
where
    F: Fn(Buyer) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let stop = CancellationToken::new();
    let probers: Vec<_> = buyers
        .iter()
        .map(|buyer| {
            tokio::spawn(probe_caller(
                env.settings.database.url.to_string(),
                stub.clone(),
                buyer.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let start = Arc::new(Barrier::new(buyers.len()));
    let mut running = JoinSet::new();
    for buyer in buyers {
        let (start, work) = (start.clone(), buy(buyer.clone()));
        running.spawn(async move {
            start.wait().await;
            work.await;
        });
    }
    running.join_all().await;
    stop.cancel();
    let mut inside = Vec::new();
    for prober in probers {
        inside.extend(prober.await.unwrap());
    }
    inside
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_transaction_holds_a_row_lock_while_a_slow_quote_call_is_in_flight() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let buyers = own_markets(&env.db, CONCURRENT_BUYERS).await;
    let stub = Arc::new(QuoteStub::with_delay(SLOW).await);
    let matcher = Matcher::new(
        services.outbox.clone(),
        p2p::config(&stub, FillPolicy::FillOrCancel, 5),
    )
    .unwrap();

    let inside = probed(&env, &stub, &buyers, |buyer| {
        let matcher = matcher.clone();
        async move {
            let created = matcher
                .create(
                    &p2p::buyer_in(buyer.partner_id, &buyer.currency, "40"),
                    Handoff::Inline,
                )
                .await
                .unwrap();
            assert!(
                matches!(
                    created,
                    Created::Attempted {
                        accounted: Accounted::Terminal {
                            status: DepositOrderStatus::Matched,
                            ..
                        },
                        ..
                    }
                ),
                "{created:?}"
            );
        }
    })
    .await;

    // 32 buyers, each inside two 300 ms calls at once with the others.
    assert_eq!(stub.calls().len(), 2 * CONCURRENT_BUYERS);
    let probed_calls = inside
        .iter()
        .map(|probe| (probe.call.reference.clone(), probe.call.call.to_string()))
        .collect::<std::collections::HashSet<_>>()
        .len();
    // Not vacuous: on a loaded machine a prober misses some 300 ms windows, never most.
    assert!(
        probed_calls >= CONCURRENT_BUYERS / 4,
        "only {probed_calls} of 64 calls probed inside"
    );
    for probe in &inside {
        assert!(
            probe.probed.free,
            "a row of the caller was locked during its call: {probe:?}"
        );
    }
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_the_seeds_design_holds_its_locks_across_the_quote_call() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let buyers = own_markets(&env.db, 4).await;
    let stub = Arc::new(QuoteStub::with_delay(SLOW).await);
    let quote = QuoteClient::new(&stub.config()).unwrap().unwrap();

    let inside = probed(&env, &stub, &buyers, |buyer| {
        let (outbox, quote) = (services.outbox.clone(), quote.clone());
        async move {
            let new = p2p::buyer_in(buyer.partner_id, &buyer.currency, "40");
            paybus_p2p::seed::create_and_match_holding_locks(&outbox, &quote, &new)
                .await
                .unwrap();
        }
    })
    .await;

    // Inside every call the caller holds its order, its candidate and its partner's lock row.
    for row in ["p2p_deposit_orders", "p2p_withdraw_orders", "partners"] {
        assert!(
            inside.iter().any(|probe| probe.probed.row == row),
            "{row} never probed inside a call: {inside:#?}"
        );
    }
    for probe in &inside {
        assert!(!probe.probed.free, "{probe:?}");
    }
    assert_audit_clean(&env.db).await;
}
