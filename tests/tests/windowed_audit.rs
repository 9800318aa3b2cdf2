//! The continuous auditor's windowed checks of W1–W4 against real rows: over a window that
//! holds the planted violations they find exactly what the full checks find; once every row
//! has aged out of the window they read nothing (while the full checks still find it all);
//! and touching one row brings back that row's violations only. So a pass costs what was
//! written lately, and still sees what it must.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use paybus_confirmations::withdrawal::{WithdrawalKind, WithdrawalStatus};
use paybus_ops::audit::{self, Check, Window};
use paybus_testkit::{
    TestEnv,
    confirmations::{deposit, withdrawal},
};
use sqlx::MySqlPool;

type Found = BTreeSet<(&'static str, String)>;

async fn full(pool: &MySqlPool, checks: &[Check]) -> Found {
    let mut conn = pool.acquire().await.unwrap();
    let found = audit::run(&mut conn, checks).await.unwrap();
    found
        .into_iter()
        .map(|v| (v.check, v.description))
        .collect()
}

/// The windowed checks over the last hour.
async fn last_hour(pool: &MySqlPool, checks: &[Check]) -> Found {
    let since: DateTime<Utc> = sqlx::query_scalar("SELECT NOW(6) - INTERVAL 1 HOUR")
        .fetch_one(pool)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    for check in checks {
        assert!(
            check.recent.is_some(),
            "{} has no windowed form",
            check.name
        );
    }
    let found = audit::run_recent(&mut conn, checks, Window { since })
        .await
        .unwrap();
    found
        .into_iter()
        .map(|v| (v.check, v.description))
        .collect()
}

fn kinds(found: &Found) -> BTreeSet<&'static str> {
    found.iter().map(|(check, _)| *check).collect()
}

/// Moves every row's time columns two hours back: out of a one-hour window.
async fn age_everything(pool: &MySqlPool) {
    for statement in [
        "UPDATE withdrawals SET updated_at = updated_at - INTERVAL 2 HOUR",
        "UPDATE deposits SET updated_at = updated_at - INTERVAL 2 HOUR",
        "UPDATE ledger_entries SET created_at = created_at - INTERVAL 2 HOUR",
        "UPDATE members SET updated_at = updated_at - INTERVAL 2 HOUR",
        "UPDATE charges SET updated_at = updated_at - INTERVAL 2 HOUR",
        "UPDATE charge_event_job SET updated_at = updated_at - INTERVAL 2 HOUR",
        "UPDATE p2p_withdraw_orders SET updated_at = updated_at - INTERVAL 2 HOUR",
        "UPDATE p2p_deposit_orders SET updated_at = updated_at - INTERVAL 2 HOUR",
        "UPDATE p2p_matches SET updated_at = updated_at - INTERVAL 2 HOUR",
        "UPDATE orders SET created_at = created_at - INTERVAL 2 HOUR",
        "UPDATE task_batches SET materialised_at = materialised_at - INTERVAL 2 HOUR \
         WHERE materialised_at IS NOT NULL",
        "UPDATE tasks SET updated_at = updated_at - INTERVAL 2 HOUR",
    ] {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
}

async fn insert(pool: &MySqlPool, sql: &'static str, binds: &[u64]) -> u64 {
    let mut query = sqlx::query(sql);
    for bind in binds {
        query = query.bind(*bind);
    }
    query.execute(pool).await.unwrap().last_insert_id()
}

/// The three steps every workflow's windowed checks must pass. `touch` updates one row;
/// `touched` is what the window then finds.
async fn assert_windowed(
    pool: &MySqlPool,
    checks: &[Check],
    planted: &[&'static str],
    touch: &str,
    touched: &[&'static str],
) {
    let everything = full(pool, checks).await;
    assert_eq!(
        kinds(&everything),
        BTreeSet::from_iter(planted.iter().copied())
    );
    assert_eq!(
        last_hour(pool, checks).await,
        everything,
        "the window holding every row finds what the full checks find"
    );

    age_everything(pool).await;
    assert_eq!(
        last_hour(pool, checks).await,
        Found::new(),
        "rows older than the window are not read"
    );
    assert_eq!(
        full(pool, checks).await,
        everything,
        "the full checks still find them"
    );

    sqlx::query(sqlx::AssertSqlSafe(touch.to_owned()))
        .execute(pool)
        .await
        .unwrap();
    let found = last_hour(pool, checks).await;
    assert_eq!(kinds(&found), BTreeSet::from_iter(touched.iter().copied()));
    assert!(found.is_subset(&everything), "{found:?}");
}

#[tokio::test]
async fn confirmations_windowed_checks_read_the_withdrawals_deposits_and_entries_of_the_window() {
    let env = TestEnv::new().await;
    let pool = &env.db;
    let partner = paybus_testkit::partners::partner(pool, "acme", None).await;
    insert(
        pool,
        "INSERT INTO partner_balances (partner_id, currency) VALUES (?, 'USDT')",
        &[partner],
    )
    .await;
    // CONFIRMED without its DEBIT.
    let undebited = withdrawal(
        pool,
        partner,
        WithdrawalKind::Normal,
        WithdrawalStatus::Confirmed,
        "10",
    )
    .await;
    // CONFIRMED, debited by its key and once more without one (the seed's double debit).
    let twice = withdrawal(
        pool,
        partner,
        WithdrawalKind::Normal,
        WithdrawalStatus::Confirmed,
        "20",
    )
    .await;
    for key in [Some(format!("WDR_CONFIRM:{twice}")), None] {
        sqlx::query(
            "INSERT INTO ledger_entries (partner_id, currency, entry_type, amount, \
             balance_after, reference_type, reference_id, idem_key) \
             VALUES (?, 'USDT', 'DEBIT', 20, 0, 'WITHDRAWAL', ?, ?)",
        )
        .bind(partner)
        .bind(twice)
        .bind(key)
        .execute(pool)
        .await
        .unwrap();
    }
    // CONFIRMED without its CREDIT.
    deposit(pool, partner, "CONFIRMED", "30", "0").await;

    assert_windowed(
        pool,
        paybus_confirmations::audit::CHECKS,
        &[
            "withdrawal_debit_missing",
            "withdrawal_debited_twice",
            "deposit_credit_missing",
        ],
        &format!("UPDATE withdrawals SET updated_at = NOW(6) WHERE id = {undebited}"),
        &["withdrawal_debit_missing"],
    )
    .await;
}

#[tokio::test]
async fn bonuses_windowed_checks_read_the_members_charges_and_jobs_of_the_window() {
    let env = TestEnv::new().await;
    let pool = &env.db;
    // Cans nobody paid for.
    let gifted = insert(
        pool,
        "INSERT INTO members (nickname, pg_can) VALUES ('gifted', 5)",
        &[],
    )
    .await;
    // A purchase of 10 cans, an EVENT charge of 1 no job granted, and a DONE job whose
    // "result" is the purchase itself; the balance agrees with the charges.
    let buyer = insert(
        pool,
        "INSERT INTO members (nickname, pg_can) VALUES ('buyer', 11)",
        &[],
    )
    .await;
    let purchase = insert(
        pool,
        "INSERT INTO charges (member_id, status, cans, price, payment_gateway, container, \
         method, payment_status, completed_at) \
         VALUES (?, 'CHARGE', 10, 1000, 'PG', 'pg', 'card', 'COMPLETE', NOW(6))",
        &[buyer],
    )
    .await;
    insert(
        pool,
        "INSERT INTO charges (member_id, status, cans, payment_gateway, container, method, \
         payment_status, completed_at) \
         VALUES (?, 'EVENT', 1, 'PG', 'pg', 'welcome', 'COMPLETE', NOW(6))",
        &[buyer],
    )
    .await;
    insert(
        pool,
        "INSERT INTO charge_event_job (source_charge_id, result_charge_id, member_id, \
         job_type, idempotency_key, additional_can, payment_gateway, container, \
         method_snapshot, status, processed_at) \
         VALUES (?, ?, ?, 'FIRST_CHARGE', 'windowed-audit', 1, 'PG', 'pg', 'welcome', 'DONE', \
                 NOW(6))",
        &[purchase, purchase, buyer],
    )
    .await;

    assert_windowed(
        pool,
        paybus_bonuses::audit::CHECKS,
        &[
            "member_balance_mismatch",
            "bonus_charge_missing",
            "event_charge_jobs",
        ],
        &format!("UPDATE members SET updated_at = NOW(6) WHERE id = {gifted}"),
        &["member_balance_mismatch"],
    )
    .await;
}

#[tokio::test]
async fn markets_windowed_checks_read_the_batches_orders_and_tasks_of_the_window() {
    let env = TestEnv::new().await;
    let pool = &env.db;
    let market = paybus_testkit::markets::market(pool, "BTC-USDT").await;
    let orders = paybus_testkit::markets::open_orders(pool, market, 3).await;
    let (cancelling, left_behind, still_open) = (orders[0], orders[1], orders[2]);
    // Suspended with a frozen set of the three, materialised: a task for the first (PENDING)
    // and the third (DONE, yet its order is open), none for the second, and a count of 3.
    let batch = insert(
        pool,
        "INSERT INTO task_batches (type, market_id, ref, reason, max_target_id, \
         materialise_cursor, created_count, materialised_at) \
         VALUES ('CANCEL_OPEN_ORDER', ?, 'BTC-USDT', 'HALT', ?, ?, 3, NOW(6))",
        &[market, still_open, still_open],
    )
    .await;
    insert(
        pool,
        "UPDATE markets SET status = 'SUSPENDED', suspended_at = NOW(6), current_batch_id = ? \
         WHERE id = ?",
        &[batch, market],
    )
    .await;
    insert(
        pool,
        "INSERT INTO tasks (type, batch_id, target_id) VALUES ('CANCEL_OPEN_ORDER', ?, ?)",
        &[batch, cancelling],
    )
    .await;
    let done = insert(
        pool,
        "INSERT INTO tasks (type, batch_id, target_id, state, finished_at) \
         VALUES ('CANCEL_OPEN_ORDER', ?, ?, 'DONE', NOW(6))",
        &[batch, still_open],
    )
    .await;
    // An order accepted after the suspension.
    paybus_testkit::markets::open_orders(pool, market, 1).await;
    assert!(left_behind < still_open);

    assert_windowed(
        pool,
        paybus_markets::audit::CHECKS,
        &[
            "open_order_left_behind",
            "order_accepted_while_suspended",
            "task_count_mismatch",
            "task_disagrees_with_order",
        ],
        &format!("UPDATE tasks SET updated_at = NOW(6) WHERE id = {done}"),
        &["task_count_mismatch", "task_disagrees_with_order"],
    )
    .await;
}

#[tokio::test]
async fn p2p_windowed_checks_read_the_orders_matches_and_entries_of_the_window() {
    let env = TestEnv::new().await;
    let pool = &env.db;
    let partner = paybus_testkit::p2p::partner(pool, "acme").await;
    let seller = paybus_testkit::p2p::seller(pool, partner, "100").await;
    let buyer = insert(
        pool,
        "INSERT INTO p2p_deposit_orders (partner_id, currency, amount, remaining_amount, \
         expires_at) VALUES (?, 'USDT', 40, 40, NOW(6) + INTERVAL 1 HOUR)",
        &[partner],
    )
    .await;
    // A CONFIRMED match neither order accounted for, and never settled in the ledger.
    insert(
        pool,
        "INSERT INTO p2p_matches (deposit_order_id, withdraw_order_id, amount, rate, \
         trade_key, external_trade_id, status, confirmed_at) \
         VALUES (?, ?, 40, 1, 'windowed-audit', 'trade-1', 'CONFIRMED', NOW(6))",
        &[buyer, seller],
    )
    .await;

    assert_windowed(
        pool,
        paybus_p2p::audit::CHECKS,
        &[
            "p2p_seller_liquidity",
            "p2p_deposit_fill",
            "p2p_settlement_legs",
        ],
        &format!("UPDATE p2p_withdraw_orders SET updated_at = NOW(6) WHERE id = {seller}"),
        &["p2p_seller_liquidity"],
    )
    .await;
}
