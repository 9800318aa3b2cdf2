//! The real `match-deposit` binary killed (SIGKILL) right after the quote service traded,
//! before the settle: the fill stays held (another buyer cannot take its liquidity), the reaper
//! hands the order back without releasing it, and the next attempt asks under the same key and
//! settles that one trade — never NO_LIQUIDITY.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::{process::Stdio, time::Duration};

use paybus_bus::Handler;
use paybus_match_deposit::{DueOrders, MatchDeposit, ZombieReaper};
use paybus_p2p::{FillPolicy, Handoff, Matcher};
use paybus_retry::Clock;
use paybus_testkit::{
    TestEnv, dec, eventually,
    p2p::{self, QuoteStub, assert_audit_clean, order_state},
    scalar,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_killed_after_the_trade_was_made_is_reaped_resolved_under_its_key_and_settled_once()
 {
    let env = TestEnv::new().await;
    let services = env.services(&[MatchDeposit::queue()]).await;
    let stub = QuoteStub::start().await;
    // The trade is made when the request arrives, but the answer never comes in time.
    stub.set_trade_delay(Duration::from_secs(60));
    let buyer = p2p::partner(&env.db, "buyer").await;
    let seller_partner = p2p::partner(&env.db, "seller").await;
    let seller = p2p::seller(&env.db, seller_partner, "100").await;
    let matcher = Matcher::new(
        services.outbox.clone(),
        p2p::config(&stub, FillPolicy::FillOrCancel, 5),
    )
    .unwrap();
    let id = matcher
        .create(&p2p::buyer(buyer, "100"), Handoff::Queued)
        .await
        .unwrap()
        .id();

    let mut function = tokio::process::Command::new(env!("CARGO_BIN_EXE_match-deposit"))
        .envs(env.env_vars())
        .env("PAYBUS_QUOTE_URL", stub.url())
        .env("PAYBUS_QUOTE_TIMEOUT_MS", "120000")
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("TEST_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let in_flight = eventually(Duration::from_secs(60), || async {
        stub.trade_calls() == 1
    })
    .await;
    assert!(in_flight, "the function never reached createTrade");
    // The quote service has traded; paybus has the fill TRADING, claimed, no transaction open.
    assert_eq!(stub.trades().len(), 1);
    assert_eq!(order_state(&env.db, id).await.0, "MATCHING");
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM p2p_matches WHERE status = 'TRADING'"
        )
        .await,
        1
    );

    function.kill().await.unwrap();
    stub.set_trade_delay(Duration::ZERO);

    // Another buyer meanwhile: the liquidity is still the dead attempt's fill's.
    let other = matcher
        .create(&p2p::buyer(buyer, "100"), Handoff::Queued)
        .await
        .unwrap()
        .id();
    let handler = MatchDeposit::new(matcher.clone());
    let ctx = paybus_bus::Context {
        db: &services.outbox,
        attempt: 1,
    };
    handler
        .handle(
            paybus_bus::Envelope::new(paybus_p2p::DepositOrderCreated {
                deposit_order_id: other,
            }),
            &ctx,
        )
        .await
        .unwrap();
    assert_eq!(
        order_state(&env.db, other).await,
        ("CANCELLED".to_owned(), Some("NO_LIQUIDITY".to_owned()), 0)
    );

    // Later than the zombie timeout (5 minutes by default).
    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT NOW(6)")
        .fetch_one(&env.db)
        .await
        .unwrap();
    let later = Clock::manual(now + chrono::Duration::minutes(6));
    let matcher = matcher.with_clock(later);
    assert_eq!(
        ZombieReaper::new(matcher.clone()).run_once().await.unwrap(),
        1
    );
    assert_eq!(
        order_state(&env.db, id).await,
        ("PENDING".to_owned(), None, 0)
    );
    // Handed back, not released: the trade may exist (it does).
    let reserved: String = sqlx::query_scalar(
        "SELECT CAST(reserved_amount AS CHAR) FROM p2p_withdraw_orders WHERE id = ?",
    )
    .bind(seller)
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(
        reserved.parse::<paybus_money::Amount>().unwrap(),
        dec("100")
    );

    assert_eq!(DueOrders::new(matcher).run_once().await.unwrap(), 1);

    assert_eq!(
        order_state(&env.db, id).await,
        ("MATCHED".to_owned(), Some("FILLED".to_owned()), 0)
    );
    // One trade for the order: the retry asked under the same key and got the first one.
    let trades = stub.trades();
    assert_eq!(trades.len(), 1, "{trades:?}");
    let trade = &trades[&format!("p2p-deposit-{id}-fill-1")];
    assert_eq!((trade.amount, trade.requests), (dec("100"), 2));
    let settled: String =
        sqlx::query_scalar("SELECT external_trade_id FROM p2p_matches WHERE status = 'CONFIRMED'")
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!(settled, trade.trade_id);
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM p2p_matches WHERE status = 'RELEASED'"
        )
        .await,
        0
    );
    assert_audit_clean(&env.db).await;
}
