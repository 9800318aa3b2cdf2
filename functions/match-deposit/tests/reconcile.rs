//! Reconciliation of paybus's settled fills with the quote service's own trades, against the
//! real database and the stub's `GET /v1/trades`: clean when they agree, an orphan trade and
//! a missing trade found when planted, and the continuous auditor recording them where its
//! own findings go.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod world;

use std::{sync::Arc, time::Duration};

use paybus_bus::Outcome;
use paybus_maintenance::auditor::{Auditor, AuditorConfig};
use paybus_match_deposit::MatchDeposit;
use paybus_p2p::{
    FillPolicy,
    reconcile::{Discrepancy, QuoteReconciler},
};
use world::{World, reconciled};

/// Two orders matched through the handler: two trades, two settled fills.
async fn two_matched_orders(world: &World) -> (u64, u64) {
    let matcher = world.matcher(FillPolicy::FillOrCancel, 5);
    let handler = MatchDeposit::new(matcher.clone());
    world.seller("100").await;
    let first = world.queued(&matcher, "10").await;
    let second = world.queued(&matcher, "20").await;
    for id in [first, second] {
        assert_eq!(world.deliver(&handler, id, 1).await, Outcome::Done);
    }
    (first, second)
}

#[tokio::test]
async fn agreeing_books_reconcile_clean() {
    let world = World::new().await;
    two_matched_orders(&world).await;

    let found = reconciled(&world).await;

    assert!(found.is_clean(), "{:?}", found.discrepancies);
    assert_eq!((found.trades_listed, found.fills_settled), (2, 2));
    assert!(found.in_doubt.is_empty());
}

#[tokio::test]
async fn a_trade_paybus_never_settled_is_an_orphan() {
    let world = World::new().await;
    two_matched_orders(&world).await;
    let planted = world
        .stub
        .plant_trade("p2p-deposit-424242-fill-1", "7.5", "p2p-deposit-424242");

    let found = reconciled(&world).await;

    assert_eq!(found.discrepancies.len(), 1, "{:?}", found.discrepancies);
    let Discrepancy::OrphanTrade {
        trade_id,
        trade_key,
        amount,
        in_paybus,
        ..
    } = &found.discrepancies[0]
    else {
        panic!("expected an orphan, got {:?}", found.discrepancies);
    };
    assert_eq!(
        (trade_id.as_str(), trade_key.as_str(), in_paybus.as_str()),
        (planted.as_str(), "p2p-deposit-424242-fill-1", "no match")
    );
    assert_eq!(amount.to_string(), "7.5");
}

#[tokio::test]
async fn a_settled_fill_whose_trade_the_service_lost_is_missing() {
    let world = World::new().await;
    let (first, _) = two_matched_orders(&world).await;
    let lost = world
        .stub
        .forget_trade(&format!("p2p-deposit-{first}-fill-1"))
        .unwrap();

    let found = reconciled(&world).await;

    assert_eq!(found.discrepancies.len(), 1, "{:?}", found.discrepancies);
    let Discrepancy::MissingTrade {
        trade_id,
        deposit_order_id,
        ..
    } = &found.discrepancies[0]
    else {
        panic!("expected a missing trade, got {:?}", found.discrepancies);
    };
    assert_eq!(
        (trade_id.as_str(), *deposit_order_id),
        (lost.trade_id.as_str(), first)
    );
}

#[tokio::test]
async fn a_listing_the_service_pages_short_is_followed_to_its_last_page() {
    let world = World::new().await;
    two_matched_orders(&world).await;
    // Made last, so on the last page: a reconciliation that stopped at the first short page
    // would never judge it.
    world
        .stub
        .plant_trade("p2p-deposit-777-fill-1", "4", "p2p-deposit-777");
    world.stub.cap_listing_pages(1);
    let asked = world.stub.listing_calls();

    let found = reconciled(&world).await;

    let orphans: Vec<&str> = found
        .discrepancies
        .iter()
        .map(|d| match d {
            Discrepancy::OrphanTrade { trade_key, .. } => trade_key.as_str(),
            other => panic!("expected only the orphan, got {other:?}"),
        })
        .collect();
    assert_eq!(orphans, ["p2p-deposit-777-fill-1"]);
    assert_eq!((found.trades_listed, found.fills_settled), (3, 2));
    // Three pages of one, and no fill asked for by key: both settled trades were listed.
    assert_eq!(world.stub.listing_calls() - asked, 3);
}

#[tokio::test]
async fn a_fill_settled_in_the_period_whose_trade_is_older_is_judged_from_the_listing() {
    let world = World::new().await;
    let (first, _) = two_matched_orders(&world).await;
    let key = format!("p2p-deposit-{first}-fill-1");
    // Before the hour judged, within the listing's lookback: not judged from the service's
    // side, but its fill was settled in the period.
    world
        .stub
        .backdate_trade(&key, Duration::from_secs(65 * 60));
    sqlx::query("UPDATE p2p_matches SET amount = amount + 1 WHERE trade_key = ?")
        .bind(&key)
        .execute(world.pool())
        .await
        .unwrap();
    let asked = world.stub.listing_calls();

    let found = reconciled(&world).await;

    assert_eq!(found.discrepancies.len(), 1, "{:?}", found.discrepancies);
    let Discrepancy::TradeMismatch {
        trade_key,
        deposit_order_id,
        paybus_amount,
        service_amount,
        ..
    } = &found.discrepancies[0]
    else {
        panic!("expected a mismatch, got {:?}", found.discrepancies);
    };
    assert_eq!((trade_key, *deposit_order_id), (&key, first));
    assert_eq!(
        (paybus_amount.to_string(), service_amount.to_string()),
        ("11".to_owned(), "10".to_owned())
    );
    assert_eq!(
        world.stub.listing_calls() - asked,
        1,
        "one page, nothing asked by key"
    );
}

#[tokio::test]
async fn the_continuous_auditor_records_a_reconciliation_finding_like_its_own() {
    let world = World::new().await;
    two_matched_orders(&world).await;
    let key = "p2p-deposit-31337-fill-1";
    world.stub.plant_trade(key, "3", "p2p-deposit-31337");
    // A trade made a moment ago is not judged yet (the service's clock may run ahead).
    let every_pass = Auditor::new(world.pool().clone(), Vec::new(), AuditorConfig::default())
        .with_external(vec![Arc::new(QuoteReconciler::every(
            world.stub.client(),
            Duration::ZERO,
        ))]);
    assert!(every_pass.pass().await.unwrap().violations.is_empty());
    world.stub.backdate_trade(key, Duration::from_secs(60));
    let auditor = Auditor::new(world.pool().clone(), Vec::new(), AuditorConfig::default())
        .with_external(vec![Arc::new(QuoteReconciler::new(world.stub.client()))]);

    let pass = auditor.pass().await.unwrap();

    let checks: Vec<&str> = pass.violations.iter().map(|v| v.check).collect();
    assert_eq!(checks, ["p2p_orphan_trade"]);
    let (check, description): (String, String) =
        sqlx::query_as("SELECT check_name, description FROM audit_findings")
            .fetch_one(world.pool())
            .await
            .unwrap();
    assert_eq!(check, "p2p_orphan_trade");
    assert!(
        description.contains("p2p-deposit-31337-fill-1"),
        "{description}"
    );
    // The passes before the next reconciliation report its finding again, without asking.
    let asked = world.stub.listing_calls();
    let again = auditor.pass().await.unwrap();
    assert_eq!(again.violations.len(), 1);
    assert_eq!(world.stub.listing_calls(), asked);
}
