//! W1's audit checks against real MariaDB: a matched market passes, and each check catches the
//! violation planted for it by raw SQL (or a stray posting through the ledger).

use paybus_ledger::{self as ledger, EntryType, Posting, ReferenceType};
use paybus_ops::audit;
use paybus_p2p::{FillPolicy, Handoff, Matcher};
use paybus_testkit::{
    TestEnv, dec,
    p2p::{self, QuoteStub},
};
use sqlx::MySqlPool;

async fn p2p_violations(pool: &MySqlPool) -> Vec<audit::Violation> {
    let mut conn = pool.acquire().await.unwrap();
    audit::run(&mut conn, paybus_p2p::audit::CHECKS)
        .await
        .unwrap()
}

async fn execute(pool: &MySqlPool, sql: &'static str, id: u64) {
    sqlx::query(sql).bind(id).execute(pool).await.unwrap();
}

async fn stray_credit(pool: &MySqlPool, partner_id: u64, match_id: u64, amount: &str) {
    let mut tx = pool.begin().await.unwrap();
    ledger::post(
        &mut tx,
        &Posting::new(
            partner_id,
            "USDT",
            EntryType::Credit,
            dec(amount),
            ReferenceType::P2pSettlement,
            match_id,
        ),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn each_w1_check_catches_the_violation_planted_for_it() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let stub = QuoteStub::start().await;
    let buyer = p2p::partner(&env.db, "buyer").await;
    let seller_partner = p2p::partner(&env.db, "seller").await;
    let used = p2p::seller(&env.db, seller_partner, "100").await;
    let matcher = Matcher::new(
        services.outbox.clone(),
        p2p::config(&stub, FillPolicy::FillOrCancel, 5),
    )
    .unwrap();
    let matched = matcher
        .create(&p2p::buyer(buyer, "40"), Handoff::Inline)
        .await
        .unwrap()
        .id();
    let match_id: u64 = sqlx::query_scalar("SELECT id FROM p2p_matches WHERE deposit_order_id = ?")
        .bind(matched)
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert!(p2p_violations(&env.db).await.is_empty());
    p2p::assert_audit_clean(&env.db).await;

    // A seller whose liquidity forgot a confirmed match (it could be sold twice).
    execute(
        &env.db,
        "UPDATE p2p_withdraw_orders SET remaining_amount = amount WHERE id = ?",
        used,
    )
    .await;
    // A reservation older than the zombie timeout (its attempt died; no reaper ran).
    let stale = p2p::seller(&env.db, seller_partner, "10").await;
    let waiting = matcher
        .create(&p2p::buyer(buyer, "5"), Handoff::Queued)
        .await
        .unwrap()
        .id();
    sqlx::query(
        "INSERT INTO p2p_matches (deposit_order_id, withdraw_order_id, amount, trade_key, reserved_at) \
         VALUES (?, ?, 5, 'k', NOW(6) - INTERVAL 10 MINUTE)",
    )
    .bind(waiting)
    .bind(stale)
    .execute(&env.db)
    .await
    .unwrap();
    execute(
        &env.db,
        "UPDATE p2p_withdraw_orders SET reserved_amount = 5 WHERE id = ?",
        stale,
    )
    .await;
    // An order MATCHED without the matches to show for it.
    let hollow: u64 = sqlx::query(
        "INSERT INTO p2p_deposit_orders (partner_id, currency, amount, remaining_amount, status, \
         expires_at, closed_at, close_reason) \
         VALUES (?, 'USDT', 7, 0, 'MATCHED', NOW(6), NOW(6), 'FILLED')",
    )
    .bind(buyer)
    .execute(&env.db)
    .await
    .unwrap()
    .last_insert_id();
    // A second CREDIT for a settled match, and a CREDIT for a match that does not exist.
    stray_credit(&env.db, buyer, match_id, "40").await;
    stray_credit(&env.db, buyer, 999_999, "1").await;

    let found = p2p_violations(&env.db).await;
    let mut checks: Vec<&str> = found.iter().map(|v| v.check).collect();
    checks.sort_unstable();
    assert_eq!(
        checks,
        [
            "p2p_deposit_fill",
            "p2p_seller_liquidity",
            "p2p_settlement_legs",
            "p2p_stale_reservation",
            "p2p_unexpected_settlement_entry",
        ],
        "{found:#?}"
    );
    let text: Vec<String> = found.iter().map(ToString::to_string).collect();
    let mentions = |needle: String| text.iter().any(|line| line.contains(&needle));
    assert!(
        mentions(format!("withdraw order {used} offers 100")),
        "{text:#?}"
    );
    assert!(
        mentions(format!("of deposit order {waiting} (PENDING)")),
        "{text:#?}"
    );
    assert!(
        mentions(format!("deposit order {hollow} (MATCHED) of 7")),
        "{text:#?}"
    );
    assert!(
        mentions(format!("CONFIRMED match {match_id} has 2 buyer CREDIT")),
        "{text:#?}"
    );
    assert!(
        mentions("settles match 999999, which does not exist".to_owned()),
        "{text:#?}"
    );
}

/// A TRADING match (createTrade sent, outcome unknown) of `order` on `seller`, sent `ago`.
async fn trading(pool: &MySqlPool, order: u64, seller: u64, ago: &'static str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO p2p_matches (deposit_order_id, withdraw_order_id, amount, trade_key, status, \
         quote_id, rate, trade_sent_at) \
         VALUES (?, ?, 5, CONCAT('p2p-deposit-', ?, '-fill-1'), 'TRADING', 'q-1', 1, \
                 NOW(6) - INTERVAL {ago})"
    )))
    .bind(order)
    .bind(seller)
    .bind(order)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn the_in_doubt_check_catches_a_closed_order_a_silent_in_doubt_order_and_a_stalled_fill() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let stub = QuoteStub::start().await;
    let buyer = p2p::partner(&env.db, "buyer").await;
    let seller_partner = p2p::partner(&env.db, "seller").await;
    let seller = p2p::seller(&env.db, seller_partner, "100").await;
    let matcher = Matcher::new(
        services.outbox.clone(),
        p2p::config(&stub, FillPolicy::FillOrCancel, 5),
    )
    .unwrap();
    let order = |amount| {
        let matcher = matcher.clone();
        async move {
            matcher
                .create(&p2p::buyer(buyer, amount), Handoff::Queued)
                .await
                .unwrap()
                .id()
        }
    };
    let in_doubt_checks = |found: Vec<audit::Violation>| {
        let mut found: Vec<(&'static str, String)> = found
            .into_iter()
            .filter(|v| v.check.starts_with("p2p_in_doubt"))
            .map(|v| (v.check, v.description))
            .collect();
        found.sort();
        found
    };

    // An order closed while its fill is in doubt (a trade may exist for it).
    let closed = order("5").await;
    trading(&env.db, closed, seller, "1 MINUTE").await;
    execute(
        &env.db,
        "UPDATE p2p_deposit_orders SET status = 'CANCELLED', closed_at = NOW(6), \
         close_reason = 'NO_LIQUIDITY' WHERE id = ?",
        closed,
    )
    .await;
    // An order parked IN_DOUBT ten minutes ago that nobody was told about.
    let silent = order("5").await;
    trading(&env.db, silent, seller, "20 MINUTE").await;
    execute(
        &env.db,
        "UPDATE p2p_deposit_orders SET status = 'IN_DOUBT', \
         updated_at = NOW(6) - INTERVAL 10 MINUTE WHERE id = ?",
        silent,
    )
    .await;
    // A fill in doubt for two hours on an order nobody is asking about.
    let stalled = order("5").await;
    trading(&env.db, stalled, seller, "2 HOUR").await;
    // A fill in doubt for a minute, being asked about: fine.
    let fresh = order("5").await;
    trading(&env.db, fresh, seller, "1 MINUTE").await;

    let found = in_doubt_checks(p2p_violations(&env.db).await);

    let checks: Vec<&str> = found.iter().map(|(check, _)| *check).collect();
    assert_eq!(
        checks,
        [
            "p2p_in_doubt_on_closed_order",
            "p2p_in_doubt_unattended",
            "p2p_in_doubt_without_dead_letter",
        ],
        "{found:#?}"
    );
    let text = |check: &str| &found.iter().find(|(c, _)| *c == check).unwrap().1;
    assert!(
        text("p2p_in_doubt_on_closed_order").contains(&format!(
            "deposit order {closed} is CANCELLED while its fill"
        )),
        "{found:#?}"
    );
    assert!(
        text("p2p_in_doubt_unattended").contains(&format!("of deposit order {stalled} (PENDING)")),
        "{found:#?}"
    );
    assert!(
        text("p2p_in_doubt_without_dead_letter").contains(&format!("deposit order {silent} is")),
        "{found:#?}"
    );

    // Its dead letter recorded, the IN_DOUBT order is accounted for.
    let mut conn = env.db.acquire().await.unwrap();
    let letter = paybus_bus::Envelope::new(paybus_p2p::DepositOrderCreated {
        deposit_order_id: silent,
    })
    .to_outgoing()
    .unwrap();
    paybus_bus::dead_letter::record_unsent(
        &mut conn,
        paybus_p2p::FUNCTION,
        &letter,
        "trade in doubt",
        10,
    )
    .await
    .unwrap();
    drop(conn);
    let found = in_doubt_checks(p2p_violations(&env.db).await);
    assert!(
        found
            .iter()
            .all(|(check, _)| *check != "p2p_in_doubt_without_dead_letter"),
        "{found:#?}"
    );
}
