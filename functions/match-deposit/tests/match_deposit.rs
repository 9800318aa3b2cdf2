//! match-deposit against the real database (and broker where a message travels), with a real
//! HTTP server (wiremock) standing in for the quote service, and a manual clock so retries and
//! timeouts are reached without sleeping.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::time::Duration;

use paybus_bus::Outcome;
use paybus_match_deposit::{DueOrders, Expiry, MatchDeposit, ZombieReaper};
use paybus_p2p::{FillPolicy, MatchingConfig, deposit_order};
use paybus_testkit::{
    dec,
    p2p::{self, assert_audit_clean, order_state},
};

mod world;

use world::{World, seller_amounts, trim};

// ---------------------------------------------------------------------------------------------
// The attempt

#[tokio::test]
async fn an_order_the_sellers_can_fill_is_matched_with_its_legs_and_its_notification() {
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::FillOrCancel, 5);
    let handler = MatchDeposit::new(matcher.clone());
    let (older, newer) = (world.seller("30").await, world.seller("100").await);
    let id = world.queued(&matcher, "50").await;

    let outcome = world.deliver(&handler, id, 1).await;

    assert_eq!(outcome, Outcome::Done);
    assert_eq!(
        order_state(world.pool(), id).await,
        ("MATCHED".to_owned(), Some("FILLED".to_owned()), 0)
    );
    // Oldest first: the older seller gives all it has, the newer the rest.
    let (remaining, reserved, status) = seller_amounts(world.pool(), older).await;
    assert_eq!(
        (trim(&remaining), trim(&reserved), status.as_str()),
        ("0", "0", "FILLED")
    );
    let (remaining, reserved, status) = seller_amounts(world.pool(), newer).await;
    assert_eq!(
        (trim(&remaining), trim(&reserved), status.as_str()),
        ("80", "0", "OPEN")
    );
    // One trade for the fill, recorded on both matches.
    let trades = world.stub.trades();
    assert_eq!(trades.len(), 1);
    let trade = &trades[&format!("p2p-deposit-{id}-fill-1")];
    assert_eq!((trade.amount, trade.requests), (dec("50"), 1));
    assert_eq!(
        world
            .count(
                "SELECT COUNT(*) FROM p2p_matches \
                 WHERE status = 'CONFIRMED' AND external_trade_id = 't-1'"
            )
            .await,
        2
    );
    // Legs: 2 CREDITs and 1 FEE for the buyer, 2 DEBITs for the sellers, all un-keyed.
    assert_eq!(
        world
            .count(
                "SELECT COUNT(*) FROM ledger_entries \
                 WHERE reference_type = 'P2P_SETTLEMENT' AND idem_key IS NULL"
            )
            .await,
        5
    );
    let fee: String =
        sqlx::query_scalar("SELECT CAST(fee_amount AS CHAR) FROM p2p_deposit_orders WHERE id = ?")
            .bind(id)
            .fetch_one(world.pool())
            .await
            .unwrap();
    assert_eq!(trim(&fee), "0.1");
    // The partner hears of it through the webhook delivery, after commit.
    assert_eq!(
        world
            .count(
                "SELECT COUNT(*) FROM partner_notifications \
                 WHERE event = 'P2P_DEPOSIT_MATCHED' AND reference_type = 'P2P_DEPOSIT_ORDER'"
            )
            .await,
        1
    );
    assert_audit_clean(world.pool()).await;
}

async fn remaining_and_fee(world: &World, id: u64) -> (String, String) {
    sqlx::query_as(
        "SELECT CAST(remaining_amount AS CHAR), CAST(fee_amount AS CHAR) \
         FROM p2p_deposit_orders WHERE id = ?",
    )
    .bind(id)
    .fetch_one(world.pool())
    .await
    .unwrap()
}

/// The payload of the order's notification of `event`, as frozen at its close.
async fn notification(world: &World, event: &str, id: u64) -> serde_json::Value {
    let payload: String = sqlx::query_scalar(
        "SELECT payload FROM partner_notifications WHERE event = ? AND reference_id = ?",
    )
    .bind(event)
    .bind(id)
    .fetch_one(world.pool())
    .await
    .unwrap();
    serde_json::from_str(&payload).unwrap()
}

#[tokio::test]
async fn an_order_filled_over_two_attempts_notifies_every_confirmed_match_of_both_fills() {
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::PartialRetry, 5);
    let handler = MatchDeposit::new(matcher.clone());
    let first_seller = world.seller("40").await;
    let id = world.queued(&matcher, "100").await;

    // Attempt 1: 40 of 100 (the partial fill's remaining and fee are written on the order).
    assert!(matches!(
        world.deliver(&handler, id, 1).await,
        Outcome::Retry { .. }
    ));
    let (remaining, fee) = remaining_and_fee(&world, id).await;
    assert_eq!((trim(&remaining), trim(&fee)), ("60", "0.1"));
    // Attempt 2, once a second seller came: the last 60, and the close writes what is left.
    let second_seller = world.seller("75").await;
    world.clock.advance(Duration::from_secs(1));
    assert_eq!(DueOrders::new(matcher).run_once().await.unwrap(), 1);
    assert_eq!(order_state(world.pool(), id).await.0, "MATCHED");

    let payload = notification(&world, "P2P_DEPOSIT_MATCHED", id).await;
    assert_eq!(payload["deposit_order_id"], id);
    assert_eq!(payload["status"], "MATCHED");
    assert_eq!(payload["close_reason"], "FILLED");
    let amount = |value: &serde_json::Value| dec(value.as_str().unwrap());
    assert_eq!(
        (
            amount(&payload["amount"]),
            amount(&payload["filled_amount"]),
            amount(&payload["fee_amount"])
        ),
        (dec("100"), dec("100"), dec("0.2"))
    );
    let matches: Vec<(u64, paybus_money::Amount, String)> = payload["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["withdraw_order_id"].as_u64().unwrap(),
                amount(&m["amount"]),
                m["trade_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        matches,
        [
            (first_seller, dec("40"), "t-1".to_owned()),
            (second_seller, dec("60"), "t-2".to_owned()),
        ]
    );
    let (remaining, fee) = remaining_and_fee(&world, id).await;
    assert_eq!((trim(&remaining), trim(&fee)), ("0", "0.2"));
    assert_audit_clean(world.pool()).await;
}

#[tokio::test]
async fn a_cancelled_order_s_notification_lists_no_match() {
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::FillOrCancel, 5);
    let handler = MatchDeposit::new(matcher.clone());
    world.seller("30").await;
    let id = world.queued(&matcher, "50").await;

    assert_eq!(world.deliver(&handler, id, 1).await, Outcome::Done);

    let payload = notification(&world, "P2P_DEPOSIT_CANCELLED", id).await;
    assert_eq!(payload["close_reason"], "NO_LIQUIDITY");
    assert_eq!(payload["matches"], serde_json::json!([]));
    assert!(dec(payload["filled_amount"].as_str().unwrap()).is_zero());
}

#[tokio::test]
async fn fill_or_cancel_cancels_at_once_without_a_quote_call_and_without_counting() {
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::FillOrCancel, 5);
    let handler = MatchDeposit::new(matcher.clone());
    let seller = world.seller("30").await;
    let id = world.queued(&matcher, "50").await;

    let outcome = world.deliver(&handler, id, 1).await;

    assert_eq!(outcome, Outcome::Done);
    assert_eq!(
        order_state(world.pool(), id).await,
        ("CANCELLED".to_owned(), Some("NO_LIQUIDITY".to_owned()), 0)
    );
    assert_eq!(world.stub.quote_calls(), 0);
    let (remaining, reserved, _) = seller_amounts(world.pool(), seller).await;
    assert_eq!((trim(&remaining), trim(&reserved)), ("30", "0"));
    assert_eq!(
        world
            .count(
                "SELECT COUNT(*) FROM partner_notifications WHERE event = 'P2P_DEPOSIT_CANCELLED'"
            )
            .await,
        1
    );
    assert_audit_clean(world.pool()).await;
}

#[tokio::test]
async fn the_legacy_path_that_returns_still_matching_counts_every_attempt_and_gives_up_with_a_dead_letter()
 {
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::PartialRetry, 3);
    let handler = MatchDeposit::new(matcher.clone());
    let due_orders = DueOrders::new(matcher.clone());
    world.seller("40").await;
    let id = world.queued(&matcher, "100").await;

    // Attempt 1 (the message): 40 filled, 60 left, the order still MATCHING when the attempt
    // returned normally. Seed 000 §3.2: that is a failed attempt.
    let outcome = world.deliver(&handler, id, 1).await;
    let Outcome::Retry { after, error } = outcome else {
        panic!("expected a retry, got {outcome:?}");
    };
    assert_eq!(after, Duration::from_secs(1));
    assert!(error.contains("not filled: 60 of 100 remaining"), "{error}");
    assert_eq!(
        order_state(world.pool(), id).await,
        ("PENDING".to_owned(), None, 1)
    );
    // Not due before its backoff: the batch claim leaves it alone.
    assert_eq!(due_orders.run_once().await.unwrap(), 0);

    // Attempt 2 (the due-orders job, once due): nothing left to take; counted again.
    world.clock.advance(Duration::from_secs(1));
    assert_eq!(due_orders.run_once().await.unwrap(), 1);
    assert_eq!(
        order_state(world.pool(), id).await,
        ("PENDING".to_owned(), None, 2)
    );

    // Attempt 3 is the last: CANCELLED MATCH_FAILED, with its dead letter.
    world.clock.advance(Duration::from_secs(1));
    assert_eq!(due_orders.run_once().await.unwrap(), 1);
    assert_eq!(
        order_state(world.pool(), id).await,
        ("CANCELLED".to_owned(), Some("MATCH_FAILED".to_owned()), 3)
    );
    let (function, reason, error): (String, String, String) =
        sqlx::query_as("SELECT function_name, reason, error FROM dead_letters")
            .fetch_one(world.pool())
            .await
            .unwrap();
    assert_eq!(
        (function.as_str(), reason.as_str()),
        ("match-deposit", "failed")
    );
    assert!(error.contains("gave up after 3 attempts"), "{error}");
    // The partial fill stays settled; nothing more is held or claimed.
    world.clock.advance(Duration::from_secs(60));
    assert_eq!(due_orders.run_once().await.unwrap(), 0);
    assert_eq!(
        world
            .count("SELECT COUNT(*) FROM p2p_matches WHERE status = 'RESERVED'")
            .await,
        0
    );
    assert_audit_clean(world.pool()).await;
}

#[tokio::test]
async fn a_message_that_makes_the_last_attempt_fails_and_becomes_the_dead_letter() {
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::PartialRetry, 1);
    let handler = MatchDeposit::new(matcher.clone());
    let id = world.queued(&matcher, "10").await;

    let outcome = world.deliver(&handler, id, 1).await;

    let Outcome::Failed(reason) = outcome else {
        panic!("expected Failed, got {outcome:?}");
    };
    assert!(reason.contains("gave up after 1 attempts"), "{reason}");
    assert_eq!(
        order_state(world.pool(), id).await,
        ("CANCELLED".to_owned(), Some("MATCH_FAILED".to_owned()), 1)
    );
    // The runtime dead-letters the message: none is recorded twice.
    assert_eq!(world.count("SELECT COUNT(*) FROM dead_letters").await, 0);
    // A redelivery (the dead letter's publish may have been lost) fails again; a late first
    // delivery of a duplicate is only skipped.
    assert!(matches!(
        world.deliver(&handler, id, 2).await,
        Outcome::Failed(_)
    ));
    assert!(matches!(
        world.deliver(&handler, id, 1).await,
        Outcome::Skipped(_)
    ));
}

#[tokio::test]
async fn a_failing_quote_service_counts_an_attempt_releases_the_reservation_and_is_retried() {
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::FillOrCancel, 5);
    let handler = MatchDeposit::new(matcher.clone());
    let seller = world.seller("100").await;
    let id = world.queued(&matcher, "25").await;
    world.stub.fail_next_quotes(1);

    let outcome = world.deliver(&handler, id, 1).await;

    let Outcome::Retry { error, .. } = outcome else {
        panic!("expected a retry, got {outcome:?}");
    };
    assert!(error.contains("getQuote answered HTTP 503"), "{error}");
    assert_eq!(
        order_state(world.pool(), id).await,
        ("PENDING".to_owned(), None, 1)
    );
    let (remaining, reserved, _) = seller_amounts(world.pool(), seller).await;
    assert_eq!((trim(&remaining), trim(&reserved)), ("100", "0"));
    assert_eq!(
        world
            .count(
                "SELECT COUNT(*) FROM p2p_matches \
                 WHERE status = 'RELEASED' AND release_reason = 'QUOTE_FAILED'"
            )
            .await,
        1
    );

    world.clock.advance(Duration::from_secs(1));
    assert_eq!(DueOrders::new(matcher).run_once().await.unwrap(), 1);
    assert_eq!(order_state(world.pool(), id).await.0, "MATCHED");
    assert_audit_clean(world.pool()).await;
}

#[tokio::test]
async fn duplicate_late_and_unknown_messages_are_skipped_or_dead_lettered() {
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::FillOrCancel, 5);
    let handler = MatchDeposit::new(matcher.clone());
    world.seller("100").await;
    let id = world.queued(&matcher, "10").await;
    assert_eq!(world.deliver(&handler, id, 1).await, Outcome::Done);

    let again = world.deliver(&handler, id, 1).await;
    assert_eq!(
        again,
        Outcome::Skipped(format!("deposit order {id} is already MATCHED"))
    );
    assert_eq!(world.stub.trade_calls(), 1);
    assert_eq!(
        world.deliver(&handler, 987_654, 1).await,
        Outcome::Failed("deposit order 987654 does not exist".to_owned())
    );
}

#[tokio::test]
async fn an_unconfigured_quote_service_is_a_counted_failure_with_its_reason() {
    let world = World::new().await;
    let config = MatchingConfig {
        quote: paybus_p2p::QuoteConfig::default(),
        ..p2p::config(&world.stub, FillPolicy::FillOrCancel, 5)
    };
    let matcher = world.matcher_with(config);
    world.seller("100").await;
    let id = world.queued(&matcher, "10").await;

    let outcome = world.deliver(&MatchDeposit::new(matcher), id, 1).await;

    let Outcome::Retry { error, .. } = outcome else {
        panic!("expected a retry, got {outcome:?}");
    };
    assert!(error.contains("PAYBUS_QUOTE_URL is not set"), "{error}");
    assert_eq!(order_state(world.pool(), id).await.2, 1);
}

// ---------------------------------------------------------------------------------------------
// Reaper and expiry

#[tokio::test]
async fn the_reaper_takes_back_only_claims_older_than_the_timeout_and_releases_their_reservations()
{
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::FillOrCancel, 5);
    let seller = world.seller("100").await;
    let id = world.queued(&matcher, "40").await;
    // An attempt that died after its reservation: claimed, one RESERVED match.
    let mut tx = world.pool().begin().await.unwrap();
    deposit_order::claim(&mut tx, id, &world.clock)
        .await
        .unwrap()
        .unwrap();
    tx.commit().await.unwrap();
    sqlx::query(
        "INSERT INTO p2p_matches (deposit_order_id, withdraw_order_id, amount, trade_key) \
         VALUES (?, ?, 40, 'k')",
    )
    .bind(id)
    .bind(seller)
    .execute(world.pool())
    .await
    .unwrap();
    sqlx::query("UPDATE p2p_withdraw_orders SET reserved_amount = 40 WHERE id = ?")
        .bind(seller)
        .execute(world.pool())
        .await
        .unwrap();
    let reaper = ZombieReaper::new(matcher.clone());

    world.clock.advance(Duration::from_secs(4 * 60));
    assert_eq!(reaper.run_once().await.unwrap(), 0);
    assert_eq!(order_state(world.pool(), id).await.0, "MATCHING");

    world.clock.advance(Duration::from_secs(61));
    assert_eq!(reaper.run_once().await.unwrap(), 1);
    // PENDING, due now, no attempt counted; the liquidity is back.
    assert_eq!(
        order_state(world.pool(), id).await,
        ("PENDING".to_owned(), None, 0)
    );
    let (remaining, reserved, _) = seller_amounts(world.pool(), seller).await;
    assert_eq!((trim(&remaining), trim(&reserved)), ("100", "0"));
    assert_eq!(
        world
            .count("SELECT COUNT(*) FROM p2p_matches WHERE release_reason = 'REAPED'")
            .await,
        1
    );
    // And the due-orders job matches it.
    assert_eq!(DueOrders::new(matcher).run_once().await.unwrap(), 1);
    assert_eq!(order_state(world.pool(), id).await.0, "MATCHED");
    assert_audit_clean(world.pool()).await;
}

#[tokio::test]
async fn a_close_that_finds_a_reservation_still_held_gives_it_back_to_the_seller() {
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::FillOrCancel, 5);
    let handler = MatchDeposit::new(matcher.clone());
    let seller = world.seller("100").await;
    let id = world.queued(&matcher, "30").await;
    // A reservation no attempt holds any more (what a bug elsewhere would leave): the close
    // must not leave it behind, or the seller's 30 would stay held forever.
    sqlx::query(
        "INSERT INTO p2p_matches (deposit_order_id, withdraw_order_id, amount, trade_key) \
         VALUES (?, ?, 30, ?)",
    )
    .bind(id)
    .bind(seller)
    .bind(format!("p2p-deposit-{id}-fill-1"))
    .execute(world.pool())
    .await
    .unwrap();
    sqlx::query("UPDATE p2p_withdraw_orders SET reserved_amount = 30 WHERE id = ?")
        .bind(seller)
        .execute(world.pool())
        .await
        .unwrap();

    // The attempt finds the order expired and closes it itself.
    world.clock.advance(Duration::from_secs(31 * 60));
    assert_eq!(world.deliver(&handler, id, 1).await, Outcome::Done);

    assert_eq!(
        order_state(world.pool(), id).await,
        ("EXPIRED".to_owned(), Some("EXPIRED".to_owned()), 0)
    );
    assert_eq!(
        world
            .count(
                "SELECT COUNT(*) FROM p2p_matches \
                 WHERE status = 'RELEASED' AND release_reason = 'ORDER_CLOSED'"
            )
            .await,
        1
    );
    let (remaining, reserved, _) = seller_amounts(world.pool(), seller).await;
    assert_eq!((trim(&remaining), trim(&reserved)), ("100", "0"));
    assert_audit_clean(world.pool()).await;
}

#[tokio::test]
async fn expiry_closes_waiting_orders_and_dead_claims_but_not_live_attempts() {
    let world = World::new().await;
    let matcher = world.matcher(FillPolicy::FillOrCancel, 5);
    let waiting = world.queued(&matcher, "10").await;
    let live = world.queued(&matcher, "10").await;
    let expiry = Expiry::new(matcher.clone());

    // Not expired yet.
    world.clock.advance(Duration::from_secs(29 * 60));
    assert_eq!(expiry.run_once().await.unwrap(), 0);
    // A claim taken just before the orders expire is a live attempt.
    let mut tx = world.pool().begin().await.unwrap();
    deposit_order::claim(&mut tx, live, &world.clock)
        .await
        .unwrap()
        .unwrap();
    tx.commit().await.unwrap();

    world.clock.advance(Duration::from_secs(2 * 60));
    assert_eq!(expiry.run_once().await.unwrap(), 1);
    assert_eq!(
        order_state(world.pool(), waiting).await,
        ("EXPIRED".to_owned(), Some("EXPIRED".to_owned()), 0)
    );
    assert_eq!(order_state(world.pool(), live).await.0, "MATCHING");

    // Once that claim is older than the zombie timeout, it is a dead one.
    world.clock.advance(Duration::from_secs(5 * 60));
    assert_eq!(expiry.run_once().await.unwrap(), 1);
    assert_eq!(order_state(world.pool(), live).await.0, "EXPIRED");
    assert_eq!(
        world
            .count("SELECT COUNT(*) FROM partner_notifications WHERE event = 'P2P_DEPOSIT_EXPIRED'")
            .await,
        2
    );
    assert_audit_clean(world.pool()).await;
}
