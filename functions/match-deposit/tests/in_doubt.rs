//! createTrade's third outcome (principle 12): a call whose outcome is unknown — a timeout after
//! the request was written, a 5xx — is never treated as a failure. The fill keeps its
//! liquidity (its matches stay TRADING), the attempt is not counted, and the order's next
//! attempt asks again under the same key until the quote service says done or not done; past
//! the bound the order is IN_DOUBT with a dead letter for a human. Against the real database
//! and a real HTTP quote service stub that trades as soon as a request arrives.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod world;

use std::time::Duration;

use paybus_bus::Outcome;
use paybus_match_deposit::{DueOrders, Expiry, MatchDeposit, ZombieReaper};
use paybus_ops::triage::Verdict;
use paybus_p2p::{DepositOrderCreated, FillPolicy, deposit_order};
use paybus_runtime::function::Function;
use paybus_testkit::{
    eventually,
    p2p::{assert_audit_clean, order_state},
};
use world::{World, reconciled, seller_amounts, trim, with_timeout};

/// The client's timeout in these tests, and a quote service that answers well after it. The
/// timeout covers the quotes too, which must answer in time: at 300 ms a suite run with both
/// cores busy once left an order PENDING after one counted attempt instead of in doubt, what a
/// quote that missed the timeout does.
const TIMEOUT: Duration = Duration::from_secs(1);
const LATE: Duration = Duration::from_secs(3);

async fn match_statuses(world: &World, id: u64) -> Vec<String> {
    sqlx::query_scalar("SELECT status FROM p2p_matches WHERE deposit_order_id = ? ORDER BY id")
        .bind(id)
        .fetch_all(world.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trade_answered_late_keeps_its_liquidity_from_competing_buyers_and_is_settled_once() {
    let world = World::new().await;
    let matcher = with_timeout(&world, TIMEOUT, FillPolicy::FillOrCancel);
    let handler = MatchDeposit::new(matcher.clone());
    let seller = world.seller("25").await;
    let first = world.queued(&matcher, "25").await;
    let during = world.queued(&matcher, "25").await;
    let after = world.queued(&matcher, "25").await;
    // The quote service trades at once and answers after the client's timeout.
    world.stub.set_trade_delay(LATE);

    let (first_outcome, during_outcome) = tokio::join!(world.deliver(&handler, first, 1), async {
        // A second buyer while the first one's createTrade is in flight.
        let in_flight = eventually(Duration::from_secs(10), || async {
            world.stub.trade_calls() == 1
        })
        .await;
        assert!(in_flight, "the first buyer never reached createTrade");
        world.deliver(&handler, during, 1).await
    });
    // And a third once the first attempt has ended without an answer.
    let after_outcome = world.deliver(&handler, after, 1).await;

    let Outcome::Retry { error, .. } = first_outcome else {
        panic!("expected a retry, got {first_outcome:?}");
    };
    let key = format!("p2p-deposit-{first}-fill-1");
    assert!(
        error.contains(&format!("trade in doubt under key {key}")),
        "{error}"
    );
    // Not counted, not released: the liquidity stays with the fill.
    assert_eq!(
        order_state(world.pool(), first).await,
        ("PENDING".to_owned(), None, 0)
    );
    assert_eq!(match_statuses(&world, first).await, ["TRADING"]);
    let (remaining, reserved, _) = seller_amounts(world.pool(), seller).await;
    assert_eq!((trim(&remaining), trim(&reserved)), ("25", "25"));
    for (id, outcome) in [(during, during_outcome), (after, after_outcome)] {
        assert_eq!(outcome, Outcome::Done);
        assert_eq!(
            order_state(world.pool(), id).await,
            ("CANCELLED".to_owned(), Some("NO_LIQUIDITY".to_owned()), 0),
            "order {id} got liquidity held by a fill in doubt"
        );
    }

    // The service is answering in time again; the next check asks under the same key.
    world.stub.set_trade_delay(Duration::ZERO);
    world.clock.advance(Duration::from_secs(2));
    let matched_before = matches_done(world.pool()).await;
    assert_eq!(DueOrders::new(matcher).run_once().await.unwrap(), 1);

    assert_eq!(
        order_state(world.pool(), first).await,
        ("MATCHED".to_owned(), Some("FILLED".to_owned()), 0)
    );
    // The job's match is on the console's charts, as a message's would be.
    assert_eq!(matches_done(world.pool()).await, matched_before + 1);
    // One trade, asked for twice, settled once as exactly that trade.
    let trades = world.stub.trades();
    assert_eq!(trades.len(), 1, "{trades:?}");
    let trade = &trades[&key];
    assert_eq!(trade.requests, 2);
    let settled: Vec<String> =
        sqlx::query_scalar("SELECT external_trade_id FROM p2p_matches WHERE status = 'CONFIRMED'")
            .fetch_all(world.pool())
            .await
            .unwrap();
    assert_eq!(settled, std::slice::from_ref(&trade.trade_id));
    let (remaining, reserved, status) = seller_amounts(world.pool(), seller).await;
    assert_eq!(
        (trim(&remaining), trim(&reserved), status.as_str()),
        ("0", "0", "FILLED")
    );
    // The quote service's trades are exactly paybus's settled fills.
    let found = reconciled(&world).await;
    assert!(found.is_clean(), "{:?}", found.discrepancies);
    assert_eq!((found.trades_listed, found.fills_settled), (1, 1));
    assert_audit_clean(world.pool()).await;
}

#[tokio::test]
async fn a_5xx_from_create_trade_is_in_doubt_and_the_next_check_trades_once() {
    let world = World::new().await;
    let matcher = with_timeout(&world, TIMEOUT, FillPolicy::FillOrCancel);
    let handler = MatchDeposit::new(matcher.clone());
    world.seller("100").await;
    let id = world.queued(&matcher, "25").await;
    // A 500 says nothing about whether the service traded (this one did not).
    world.stub.fail_next_trades(1);

    let outcome = world.deliver(&handler, id, 1).await;

    let Outcome::Retry { error, .. } = outcome else {
        panic!("expected a retry, got {outcome:?}");
    };
    assert!(error.contains("createTrade answered HTTP 500"), "{error}");
    assert_eq!(order_state(world.pool(), id).await.2, 0);
    assert_eq!(match_statuses(&world, id).await, ["TRADING"]);

    world.clock.advance(Duration::from_secs(2));
    assert_eq!(DueOrders::new(matcher).run_once().await.unwrap(), 1);

    assert_eq!(order_state(world.pool(), id).await.0, "MATCHED");
    assert_eq!(world.stub.trades().len(), 1);
    assert!(reconciled(&world).await.is_clean());
    assert_audit_clean(world.pool()).await;
}

#[tokio::test]
async fn a_refused_retry_of_a_trade_in_doubt_settles_the_trade_the_service_holds_under_the_key() {
    // Found by the chaos run: the service traded, answered late, then refused the retry
    // ("quote expired" checked before the key). Releasing then left an orphan trade.
    a_refused_resend_settles_the_late_trade(CheckCount::Recorded).await;
}

#[tokio::test]
async fn a_refused_resend_of_a_fill_whose_unknown_outcome_was_never_counted_settles_the_trade() {
    // Found by a full chaos profile run: a process killed between its createTrade and
    // recording the unknown outcome leaves a TRADING fill with no check counted (an ops recheck
    // leaves the same); the next attempt's resend was refused, and the fill was released while
    // the service held the first send's trade: an orphan for the 42-134 s until a retry found it.
    a_refused_resend_settles_the_late_trade(CheckCount::Lost).await;
}

/// Whether the first attempt's unknown outcome is still counted when the next one resends.
enum CheckCount {
    Recorded,
    /// What a process killed before writing it leaves.
    Lost,
}

/// A trade made and answered late leaves its fill TRADING; the next attempt's resend is
/// refused; the trade the service holds under the key must be settled, once.
async fn a_refused_resend_settles_the_late_trade(checks: CheckCount) {
    let world = World::new().await;
    let matcher = with_timeout(&world, TIMEOUT, FillPolicy::FillOrCancel);
    let handler = MatchDeposit::new(matcher.clone());
    let seller = world.seller("25").await;
    let id = world.queued(&matcher, "25").await;
    world.stub.set_trade_delay(LATE);
    let outcome = world.deliver(&handler, id, 1).await;
    assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
    assert_eq!(match_statuses(&world, id).await, ["TRADING"]);
    if let CheckCount::Lost = checks {
        sqlx::query("UPDATE p2p_matches SET trade_checks = 0 WHERE deposit_order_id = ?")
            .bind(id)
            .execute(world.pool())
            .await
            .unwrap();
    }

    world.stub.set_trade_delay(Duration::ZERO);
    world.stub.refuse_next_trades(1);
    world.clock.advance(Duration::from_secs(2));
    assert_eq!(DueOrders::new(matcher).run_once().await.unwrap(), 1);

    assert_eq!(
        order_state(world.pool(), id).await,
        ("MATCHED".to_owned(), Some("FILLED".to_owned()), 0)
    );
    assert_eq!(match_statuses(&world, id).await, ["CONFIRMED"]);
    let trades = world.stub.trades();
    assert_eq!(trades.len(), 1, "{trades:?}");
    let settled: Vec<String> =
        sqlx::query_scalar("SELECT external_trade_id FROM p2p_matches WHERE status = 'CONFIRMED'")
            .fetch_all(world.pool())
            .await
            .unwrap();
    let trade = trades.values().next().unwrap();
    assert_eq!(settled, std::slice::from_ref(&trade.trade_id));
    let (_, reserved, status) = seller_amounts(world.pool(), seller).await;
    assert_eq!((trim(&reserved), status.as_str()), ("0", "FILLED"));
    let found = reconciled(&world).await;
    assert!(found.is_clean(), "{:?}", found.discrepancies);
    assert_audit_clean(world.pool()).await;
}

#[tokio::test]
async fn a_definitively_refused_trade_releases_the_liquidity_and_counts_a_failed_attempt() {
    let world = World::new().await;
    let matcher = with_timeout(&world, TIMEOUT, FillPolicy::FillOrCancel);
    let handler = MatchDeposit::new(matcher.clone());
    let seller = world.seller("100").await;
    let id = world.queued(&matcher, "25").await;
    world.stub.refuse_next_trades(1);

    let outcome = world.deliver(&handler, id, 1).await;

    let Outcome::Retry { error, .. } = outcome else {
        panic!("expected a retry, got {outcome:?}");
    };
    assert!(error.contains("createTrade answered HTTP 422"), "{error}");
    assert_eq!(
        order_state(world.pool(), id).await,
        ("PENDING".to_owned(), None, 1)
    );
    assert_eq!(match_statuses(&world, id).await, ["RELEASED"]);
    let reason: String = sqlx::query_scalar("SELECT release_reason FROM p2p_matches")
        .fetch_one(world.pool())
        .await
        .unwrap();
    assert_eq!(reason, "TRADE_REFUSED");
    let (_, reserved, _) = seller_amounts(world.pool(), seller).await;
    assert_eq!(trim(&reserved), "0");
    assert!(world.stub.trades().is_empty());
    assert_audit_clean(world.pool()).await;
}

#[tokio::test]
async fn a_service_that_always_answers_late_parks_the_order_in_doubt_with_a_letter_naming_the_key()
{
    let world = World::new().await;
    let matcher = with_timeout(&world, TIMEOUT, FillPolicy::FillOrCancel);
    let handler = MatchDeposit::new(matcher.clone());
    let due_orders = DueOrders::new(matcher.clone());
    world.seller("100").await;
    let id = world.queued(&matcher, "25").await;
    let key = format!("p2p-deposit-{id}-fill-1");
    world.stub.set_trade_delay(LATE);

    // Three checks (the test's bound): the message's attempt, then the due-orders job's.
    assert!(matches!(
        world.deliver(&handler, id, 1).await,
        Outcome::Retry { .. }
    ));
    for _ in 0..2 {
        world.clock.advance(Duration::from_secs(2));
        assert_eq!(due_orders.run_once().await.unwrap(), 1);
    }

    // Parked for a human, never failed: no MATCH_FAILED, nothing counted, the fill held.
    assert_eq!(
        order_state(world.pool(), id).await,
        ("IN_DOUBT".to_owned(), None, 0)
    );
    assert_eq!(match_statuses(&world, id).await, ["TRADING"]);
    let checks: u32 = sqlx::query_scalar("SELECT trade_checks FROM p2p_matches")
        .fetch_one(world.pool())
        .await
        .unwrap();
    assert_eq!(checks, 3);
    let (reason, error): (String, String) = sqlx::query_as(
        "SELECT reason, error FROM dead_letters WHERE function_name = 'match-deposit'",
    )
    .fetch_one(world.pool())
    .await
    .unwrap();
    assert_eq!(reason, "failed");
    assert!(
        error.contains(&key) && error.contains("a trade may exist"),
        "{error}"
    );
    // The letter's triage says what it is and what to do.
    let mut conn = world.pool().acquire().await.unwrap();
    let triage = <MatchDeposit as Function>::triage(
        &mut conn,
        DepositOrderCreated {
            deposit_order_id: id,
        },
    )
    .await
    .unwrap();
    drop(conn);
    assert_eq!(triage.verdict, Verdict::NeedsHuman);
    assert!(
        triage.reason.contains(&key)
            && triage
                .reason
                .contains("a trade may exist at the quote service"),
        "{}",
        triage.reason
    );
    // Reconciliation lists it, with the trade the service has for it; no discrepancy.
    let found = reconciled(&world).await;
    assert!(found.is_clean(), "{:?}", found.discrepancies);
    assert_eq!(found.in_doubt.len(), 1);
    let doubt = &found.in_doubt[0];
    assert_eq!(
        (
            doubt.trade_key.as_str(),
            doubt.order_status.as_str(),
            doubt.checks
        ),
        (key.as_str(), "IN_DOUBT", 3)
    );
    assert_eq!(
        doubt.service_trade_id.as_deref(),
        Some(world.stub.trades()[&key].trade_id.as_str())
    );
    assert_audit_clean(world.pool()).await;

    // Nothing automatic touches it: not claimed, not reaped, not expired.
    world.clock.advance(Duration::from_secs(40 * 60));
    assert_eq!(due_orders.run_once().await.unwrap(), 0);
    assert_eq!(
        ZombieReaper::new(matcher.clone()).run_once().await.unwrap(),
        0
    );
    assert_eq!(Expiry::new(matcher.clone()).run_once().await.unwrap(), 0);
    assert_eq!(order_state(world.pool(), id).await.0, "IN_DOUBT");

    // Ops looked at the quote service; a recheck asks once more under the same key.
    world.stub.set_trade_delay(Duration::ZERO);
    assert!(
        deposit_order::recheck(world.pool(), id, &paybus_testkit::person("tests"))
            .await
            .unwrap()
    );
    assert!(
        !deposit_order::recheck(world.pool(), id, &paybus_testkit::person("tests"))
            .await
            .unwrap()
    );
    assert_eq!(due_orders.run_once().await.unwrap(), 1);
    assert_eq!(order_state(world.pool(), id).await.0, "MATCHED");
    assert_eq!(world.stub.trades().len(), 1);
    assert!(reconciled(&world).await.is_clean());
    assert_audit_clean(world.pool()).await;
}

#[tokio::test]
async fn candidates_held_by_other_matchers_for_a_moment_do_not_count_an_attempt() {
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::FillOrCancel, 1);
    let handler = MatchDeposit::new(matcher.clone());
    let seller = world.seller("25").await;
    let id = world.queued(&matcher, "25").await;
    // Another matcher holds the only candidate (its reserve transaction is open).
    let mut other = world.pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM p2p_withdraw_orders WHERE id = ? FOR UPDATE")
        .bind(seller)
        .execute(&mut *other)
        .await
        .unwrap();

    let outcome = world.deliver(&handler, id, 1).await;

    // With one attempt allowed, a counted attempt would have been MATCH_FAILED.
    let Outcome::Retry { after, error } = outcome else {
        panic!("expected a retry, got {outcome:?}");
    };
    assert_eq!(after, Duration::from_secs(2));
    assert!(error.contains("held by other matchers"), "{error}");
    assert_eq!(
        order_state(world.pool(), id).await,
        ("PENDING".to_owned(), None, 0)
    );
    other.rollback().await.unwrap();

    world.clock.advance(Duration::from_secs(2));
    assert_eq!(DueOrders::new(matcher).run_once().await.unwrap(), 1);
    assert_eq!(order_state(world.pool(), id).await.0, "MATCHED");
    assert_audit_clean(world.pool()).await;
}

/// match-deposit's done count on the activity charts, this process's tally flushed first.
async fn matches_done(pool: &sqlx::MySqlPool) -> i64 {
    paybus_bus::activity::flush(pool).await.unwrap();
    sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(done), 0) AS SIGNED) FROM function_activity \
         WHERE function_name = 'match-deposit'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}
