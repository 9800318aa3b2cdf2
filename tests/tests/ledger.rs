//! The ledger against real MariaDB: the idempotency key is the last line of defence against a
//! double DEBIT (seed 001), postings serialise on the balance gate row, and the
//! `balance_after` chain stays exact.

use std::sync::Arc;

use paybus_db as db;
use paybus_ledger::{
    self as ledger, EntryType, IdemKey, LedgerError, Posted, Posting, ReferenceType,
};
use paybus_money::Amount;
use paybus_ops::audit;
use paybus_testkit::{TestEnv, dec};
use sqlx::{MySqlPool, mysql::MySqlPoolOptions};
use tokio::{sync::Barrier, task::JoinSet};

async fn new_partner(pool: &MySqlPool) -> u64 {
    sqlx::query("INSERT INTO partners (name) VALUES ('partner')")
        .execute(pool)
        .await
        .expect("insert a partner")
        .last_insert_id()
}

/// A withdrawal already CONFIRMED (the caller's own transition is not under test here).
async fn confirmed_withdrawal(pool: &MySqlPool, partner_id: u64, amount: &str) -> u64 {
    sqlx::query(
        "INSERT INTO withdrawals (partner_id, kind, status, currency, amount, to_address, \
         tx_hash, confirmed_at) \
         VALUES (?, 'NORMAL', 'CONFIRMED', 'USDT', ?, 'T-address', '0xfeed', NOW(6))",
    )
    .bind(partner_id)
    .bind(dec(amount))
    .execute(pool)
    .await
    .expect("insert a withdrawal")
    .last_insert_id()
}

fn confirm_debit(partner_id: u64, withdrawal_id: u64, amount: &str) -> Posting {
    Posting::new(
        partner_id,
        "USDT",
        EntryType::Debit,
        dec(amount),
        ReferenceType::Withdrawal,
        withdrawal_id,
    )
    .idem_key(IdemKey::withdrawal_confirm(withdrawal_id))
}

fn migration_credit(partner_id: u64, amount: &str) -> Posting {
    Posting::new(
        partner_id,
        "USDT",
        EntryType::Credit,
        dec(amount),
        ReferenceType::Migration,
        0,
    )
    .memo("opening balance")
}

/// Posts in a transaction of its own: committed on success, rolled back on an error (at once,
/// so no lock outlives the test).
async fn post_committed(pool: &MySqlPool, posting: &Posting) -> Result<Posted, LedgerError> {
    let mut tx = pool.begin().await.expect("run the posting transaction");
    match ledger::post(&mut tx, posting).await {
        Ok(posted) => {
            tx.commit().await.expect("run the posting transaction");
            Ok(posted)
        }
        Err(error) => {
            tx.rollback().await.expect("run the posting transaction");
            Err(error)
        }
    }
}

async fn balance(pool: &MySqlPool, partner_id: u64, currency: &str) -> Option<Amount> {
    sqlx::query_scalar("SELECT balance FROM partner_balances WHERE partner_id = ? AND currency = ?")
        .bind(partner_id)
        .bind(currency)
        .fetch_optional(pool)
        .await
        .expect("read the balance")
}

/// (entry_type, amount, balance_after, idem_key) of a partner's entries in one currency, in
/// posting order.
async fn entries(
    pool: &MySqlPool,
    partner_id: u64,
    currency: &str,
) -> Vec<(String, Amount, Amount, Option<String>)> {
    sqlx::query_as(
        "SELECT entry_type, amount, balance_after, idem_key FROM ledger_entries \
         WHERE partner_id = ? AND currency = ? ORDER BY id",
    )
    .bind(partner_id)
    .bind(currency)
    .fetch_all(pool)
    .await
    .expect("read the entries")
}

/// The `balance_after` a posting left on its entry.
/// The latest entry's `balance_after` of the partner's gate in `currency`.
async fn last_balance_after(pool: &MySqlPool, partner_id: u64, currency: &str) -> Amount {
    let entries = entries(pool, partner_id, currency).await;
    entries.last().expect("an entry").2
}

/// Every `balance_after` of the partner's gate in `currency`, in chain order.
async fn balances_after(pool: &MySqlPool, partner_id: u64, currency: &str) -> Vec<Amount> {
    let entries = entries(pool, partner_id, currency).await;
    entries.into_iter().map(|(_, _, after, _)| after).collect()
}

async fn audit_violations(pool: &MySqlPool) -> Vec<String> {
    let mut conn = pool.acquire().await.expect("run the audit");
    audit::run(&mut conn, &paybus_catalog::audit_checks())
        .await
        .expect("run the audit")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[tokio::test]
async fn a_keyed_debit_is_recorded_once_and_the_repeat_is_already_recorded() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    post_committed(&env.db, &migration_credit(partner, "500"))
        .await
        .unwrap();
    let withdrawal = confirmed_withdrawal(&env.db, partner, "100").await;
    let debit = confirm_debit(partner, withdrawal, "100");

    let first = post_committed(&env.db, &debit).await.unwrap();
    let second = post_committed(&env.db, &debit).await.unwrap();

    assert_eq!(first, Posted::Recorded);
    assert_eq!(
        last_balance_after(&env.db, partner, "USDT").await,
        dec("400")
    );
    assert_eq!(
        second,
        Posted::AlreadyRecorded {
            idem_key: IdemKey::withdrawal_confirm(withdrawal)
        }
    );
    let debits: Vec<_> = entries(&env.db, partner, "USDT")
        .await
        .into_iter()
        .filter(|(entry_type, ..)| entry_type == "DEBIT")
        .collect();
    assert_eq!(
        debits,
        [(
            "DEBIT".to_owned(),
            dec("100"),
            dec("400"),
            Some(format!("WDR_CONFIRM:{withdrawal}"))
        )]
    );
    assert_eq!(balance(&env.db, partner, "USDT").await, Some(dec("400")));
    assert_eq!(audit_violations(&env.db).await, Vec::<String>::new());
}

#[tokio::test]
async fn after_a_duplicate_hit_the_same_transaction_still_writes_and_commits() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let withdrawal = confirmed_withdrawal(&env.db, partner, "100").await;
    let debit = confirm_debit(partner, withdrawal, "100");
    post_committed(&env.db, &debit).await.unwrap();

    let mut tx = env.db.begin().await.unwrap();
    let repeat = ledger::post(&mut tx, &debit).await.unwrap();
    // Other writes after the hit: a plain row, and another posting on the same gate.
    sqlx::query(
        "INSERT INTO withdrawal_status_history (withdrawal_id, from_status, to_status, reason) \
         VALUES (?, 'BROADCASTING', 'CONFIRMED', 'after the duplicate hit')",
    )
    .bind(withdrawal)
    .execute(&mut *tx)
    .await
    .unwrap();
    let credit = ledger::post(&mut tx, &migration_credit(partner, "30"))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    assert!(
        matches!(repeat, Posted::AlreadyRecorded { .. }),
        "{repeat:?}"
    );
    assert!(matches!(credit, Posted::Recorded), "{credit:?}");
    let reasons: Vec<String> =
        sqlx::query_scalar("SELECT reason FROM withdrawal_status_history WHERE withdrawal_id = ?")
            .bind(withdrawal)
            .fetch_all(&env.db)
            .await
            .unwrap();
    assert_eq!(reasons, ["after the duplicate hit"]);
    let chain: Vec<(String, Amount)> = entries(&env.db, partner, "USDT")
        .await
        .into_iter()
        .map(|(entry_type, _, balance_after, _)| (entry_type, balance_after))
        .collect();
    assert_eq!(
        chain,
        [
            ("DEBIT".to_owned(), dec("-100")),
            ("CREDIT".to_owned(), dec("-70"))
        ]
    );
    assert_eq!(balance(&env.db, partner, "USDT").await, Some(dec("-70")));
    assert_eq!(audit_violations(&env.db).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_repeat_inside_the_same_transaction_is_already_recorded_too() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let withdrawal = confirmed_withdrawal(&env.db, partner, "100").await;
    let debit = confirm_debit(partner, withdrawal, "100");

    let mut tx = env.db.begin().await.unwrap();
    let first = ledger::post(&mut tx, &debit).await.unwrap();
    let second = ledger::post(&mut tx, &debit).await.unwrap();
    tx.commit().await.unwrap();

    assert!(matches!(first, Posted::Recorded), "{first:?}");
    assert!(
        matches!(second, Posted::AlreadyRecorded { .. }),
        "{second:?}"
    );
    assert_eq!(entries(&env.db, partner, "USDT").await.len(), 1);
    assert_eq!(balance(&env.db, partner, "USDT").await, Some(dec("-100")));
}

#[tokio::test]
async fn entries_without_a_key_may_repeat_for_one_reference() {
    // Seed 001 §3: P2P legs and safety-net corrections write several DEBITs per withdrawal.
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let leg = Posting::new(
        partner,
        "USDT",
        EntryType::Debit,
        dec("10"),
        ReferenceType::Withdrawal,
        348,
    );

    for _ in 0..3 {
        let posted = post_committed(&env.db, &leg).await.unwrap();
        assert!(matches!(posted, Posted::Recorded), "{posted:?}");
    }

    let legs = entries(&env.db, partner, "USDT").await;
    assert_eq!(legs.len(), 3);
    assert!(legs.iter().all(|(.., idem_key)| idem_key.is_none()));
    assert_eq!(balance(&env.db, partner, "USDT").await, Some(dec("-30")));
    assert_eq!(audit_violations(&env.db).await, Vec::<String>::new());
}

#[tokio::test]
async fn balance_after_chains_through_credits_debits_and_fees_per_currency() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let posting = |currency: &str, entry_type, amount: &str| {
        Posting::new(
            partner,
            currency,
            entry_type,
            dec(amount),
            ReferenceType::Settlement,
            1,
        )
    };
    let sequence = [
        posting("USDT", EntryType::Credit, "100"),
        posting("BTC", EntryType::Credit, "0.5"),
        posting("USDT", EntryType::Debit, "30.5"),
        posting("USDT", EntryType::Fee, "0.25"),
        posting("BTC", EntryType::Fee, "0.00000001"),
        posting("USDT", EntryType::Credit, "0.000000000000000001"),
    ];

    let mut returned = Vec::new();
    for posting in &sequence {
        match post_committed(&env.db, posting).await.unwrap() {
            Posted::Recorded => {
                returned.push(last_balance_after(&env.db, partner, &posting.currency).await)
            }
            other => panic!("expected Recorded, got {other:?}"),
        }
    }

    assert_eq!(
        returned,
        [
            "100",
            "0.5",
            "69.5",
            "69.25",
            "0.49999999",
            "69.250000000000000001"
        ]
        .map(dec)
    );
    let usdt: Vec<(String, Amount)> = entries(&env.db, partner, "USDT")
        .await
        .into_iter()
        .map(|(entry_type, _, balance_after, _)| (entry_type, balance_after))
        .collect();
    assert_eq!(
        usdt,
        [
            ("CREDIT".to_owned(), dec("100")),
            ("DEBIT".to_owned(), dec("69.5")),
            ("FEE".to_owned(), dec("69.25")),
            ("CREDIT".to_owned(), dec("69.250000000000000001")),
        ]
    );
    assert_eq!(
        balance(&env.db, partner, "USDT").await,
        Some(dec("69.250000000000000001"))
    );
    assert_eq!(
        balance(&env.db, partner, "BTC").await,
        Some(dec("0.49999999"))
    );
    assert_eq!(audit_violations(&env.db).await, Vec::<String>::new());
}

#[tokio::test]
async fn zero_or_negative_amounts_are_rejected_before_anything_is_written() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;

    for amount in ["0", "-5"] {
        let posting = Posting::new(
            partner,
            "USDT",
            EntryType::Credit,
            dec(amount),
            ReferenceType::Migration,
            0,
        );
        let result = post_committed(&env.db, &posting).await;
        assert!(
            matches!(result, Err(LedgerError::InvalidAmount { .. })),
            "{amount}: {result:?}"
        );
    }

    assert!(entries(&env.db, partner, "USDT").await.is_empty());
    assert_eq!(balance(&env.db, partner, "USDT").await, None);
}

#[tokio::test]
async fn a_key_on_the_wrong_entry_is_rejected() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    // A P2P leg of withdrawal 7 must not borrow withdrawal 7's confirmation key.
    let leg = Posting::new(
        partner,
        "USDT",
        EntryType::Credit,
        dec("1"),
        ReferenceType::Withdrawal,
        7,
    )
    .idem_key(IdemKey::withdrawal_confirm(7));

    let result = post_committed(&env.db, &leg).await;

    assert!(
        matches!(result, Err(LedgerError::MisplacedIdemKey { .. })),
        "{result:?}"
    );
    assert!(entries(&env.db, partner, "USDT").await.is_empty());
}

#[tokio::test]
async fn the_whole_decimal_range_is_posted_exactly() {
    // DECIMAL(36,18) holds 36 significant digits; rust_decimal held 28 and refused these.
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let widest = "999999999999999999.999999999999999999";
    let smallest = "0.000000000000000001";

    post_committed(
        &env.db,
        &migration_credit(partner, "999999999999999999.999999999999999998"),
    )
    .await
    .unwrap();
    let to_max = post_committed(&env.db, &migration_credit(partner, smallest))
        .await
        .unwrap();
    let debit = Posting::new(
        partner,
        "USDT",
        EntryType::Debit,
        dec(widest),
        ReferenceType::Migration,
        0,
    );
    let max_after = last_balance_after(&env.db, partner, "USDT").await;
    let to_zero = post_committed(&env.db, &debit).await.unwrap();

    assert_eq!((&to_max, &to_zero), (&Posted::Recorded, &Posted::Recorded));
    assert_eq!(max_after, Amount::MAX);
    assert!(last_balance_after(&env.db, partner, "USDT").await.is_zero());
    let stored: Vec<String> =
        sqlx::query_scalar("SELECT CAST(balance_after AS CHAR) FROM ledger_entries ORDER BY id")
            .fetch_all(&env.db)
            .await
            .unwrap();
    assert_eq!(
        stored,
        [
            "999999999999999999.999999999999999998",
            widest,
            "0.000000000000000000"
        ]
    );
    assert_eq!(audit_violations(&env.db).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_balance_beyond_the_column_is_refused_not_rounded() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    post_committed(
        &env.db,
        &migration_credit(partner, "999999999999999999.999999999999999999"),
    )
    .await
    .unwrap();

    let result = post_committed(&env.db, &migration_credit(partner, "0.000000000000000001")).await;

    assert!(
        matches!(&result, Err(LedgerError::OutOfRange { partner_id, .. }) if *partner_id == partner),
        "{result:?}"
    );
    assert_eq!(entries(&env.db, partner, "USDT").await.len(), 1);
    assert_eq!(balance(&env.db, partner, "USDT").await, Some(Amount::MAX));
}

#[tokio::test]
async fn a_missing_table_is_a_database_error_not_already_recorded() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    sqlx::query("DROP TABLE ledger_entries")
        .execute(&env.db)
        .await
        .unwrap();

    let result = post_committed(&env.db, &confirm_debit(partner, 1, "100")).await;

    match result {
        Err(LedgerError::Database(sqlx::Error::Database(error))) => {
            assert!(!error.is_unique_violation(), "{error}");
            assert!(error.message().contains("ledger_entries"), "{error}");
        }
        other => panic!("expected a database error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_posting_for_an_unknown_partner_is_a_database_error() {
    let env = TestEnv::new().await;

    let result = post_committed(&env.db, &confirm_debit(999_999, 1, "100")).await;

    match result {
        Err(LedgerError::Database(sqlx::Error::Database(error))) => {
            assert!(error.is_foreign_key_violation(), "{error}");
        }
        other => panic!("expected a foreign key violation, got {other:?}"),
    }
}

#[tokio::test]
async fn a_duplicate_on_another_unique_key_is_a_database_error_not_already_recorded() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    // Some other unique key on the table: its duplicates are real errors, even for a keyed
    // posting, which would otherwise be reported as "already recorded".
    sqlx::query("ALTER TABLE ledger_entries ADD UNIQUE KEY uk_test_memo (memo)")
        .execute(&env.db)
        .await
        .unwrap();
    post_committed(&env.db, &confirm_debit(partner, 1, "100").memo("same memo"))
        .await
        .unwrap();

    let result = post_committed(&env.db, &confirm_debit(partner, 2, "100").memo("same memo")).await;

    match result {
        Err(LedgerError::Database(sqlx::Error::Database(error))) => {
            assert!(error.is_unique_violation(), "{error}");
            assert!(error.message().contains("uk_test_memo"), "{error}");
        }
        other => panic!("expected a unique violation on uk_test_memo, got {other:?}"),
    }
    assert_eq!(entries(&env.db, partner, "USDT").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_confirmations_debit_once() {
    const TASKS: usize = 20;
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    post_committed(&env.db, &migration_credit(partner, "1000"))
        .await
        .unwrap();
    let withdrawal = confirmed_withdrawal(&env.db, partner, "100").await;
    let debit = confirm_debit(partner, withdrawal, "100");
    // Every task holds its own open transaction before any of them posts.
    let start = Arc::new(Barrier::new(TASKS));

    let mut tasks = JoinSet::new();
    for _ in 0..TASKS {
        let (pool, start, debit) = (env.db.clone(), start.clone(), debit.clone());
        tasks.spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            start.wait().await;
            let posted = ledger::post(&mut tx, &debit).await;
            tx.commit().await.unwrap();
            posted
        });
    }
    let outcomes = tasks.join_all().await;

    let recorded = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, Ok(Posted::Recorded)))
        .count();
    let already = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, Ok(Posted::AlreadyRecorded { .. })))
        .count();
    assert_eq!((recorded, already), (1, TASKS - 1), "{outcomes:?}");
    let debits: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM ledger_entries WHERE reference_type = 'WITHDRAWAL' \
         AND reference_id = ? AND entry_type = 'DEBIT'",
    )
    .bind(withdrawal)
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(debits, 1);
    assert_eq!(balance(&env.db, partner, "USDT").await, Some(dec("900")));
    assert_eq!(audit_violations(&env.db).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_credits_serialise_on_the_gate_row() {
    const TASKS: usize = 50;
    let env = TestEnv::new().await;
    // A connection per task, so all fifty transactions are open at once; the gate row does not
    // exist yet, so they also race to create it.
    let pool = MySqlPoolOptions::new()
        .max_connections(u32::try_from(TASKS).unwrap())
        .connect_with(db::connect_options(&env.settings.database).unwrap())
        .await
        .unwrap();
    let partner = new_partner(&pool).await;
    let credit = Posting::new(
        partner,
        "USDT",
        EntryType::Credit,
        dec("1.000000000000000001"),
        ReferenceType::Settlement,
        1,
    );
    let start = Arc::new(Barrier::new(TASKS));

    let mut tasks = JoinSet::new();
    for _ in 0..TASKS {
        let (pool, start, credit) = (pool.clone(), start.clone(), credit.clone());
        tasks.spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            start.wait().await;
            let posted = ledger::post(&mut tx, &credit).await;
            tx.commit().await.unwrap();
            posted
        });
    }
    let outcomes = tasks.join_all().await;

    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(outcome, Ok(Posted::Recorded))),
        "{outcomes:?}"
    );
    let chain: Vec<Amount> = entries(&pool, partner, "USDT")
        .await
        .into_iter()
        .map(|(_, _, balance_after, _)| balance_after)
        .collect();
    let expected: Vec<Amount> = (1..=TASKS)
        .map(|n| {
            dec("1.000000000000000001")
                .checked_mul(i64::try_from(n).unwrap())
                .unwrap()
        })
        .collect();
    assert_eq!(chain, expected);
    assert_eq!(
        balance(&pool, partner, "USDT").await,
        Some(dec("50.00000000000000005"))
    );
    assert_eq!(audit_violations(&pool).await, Vec::<String>::new());
    pool.close().await;
}

// `post_all`: a batch of postings in two statements, one `Posted` each.

/// Posts a batch in a transaction of its own: committed on success, rolled back on an error.
async fn post_all_committed(
    pool: &MySqlPool,
    postings: &[Posting],
) -> Result<Vec<Posted>, LedgerError> {
    let mut tx = pool.begin().await.expect("run the batch transaction");
    match ledger::post_all(&mut tx, postings).await {
        Ok(posted) => {
            tx.commit().await.expect("run the batch transaction");
            Ok(posted)
        }
        Err(error) => {
            tx.rollback().await.expect("run the batch transaction");
            Err(error)
        }
    }
}

fn credit(partner_id: u64, currency: &str, amount: &str) -> Posting {
    Posting::new(
        partner_id,
        currency,
        EntryType::Credit,
        dec(amount),
        ReferenceType::Settlement,
        partner_id,
    )
}

#[tokio::test]
async fn a_batch_writes_the_chain_sequential_postings_would_have_written() {
    let env = TestEnv::new().await;
    let (first, second) = (new_partner(&env.db).await, new_partner(&env.db).await);
    post_committed(&env.db, &migration_credit(first, "100"))
        .await
        .unwrap();
    let w1 = confirmed_withdrawal(&env.db, first, "30").await;
    let w2 = confirmed_withdrawal(&env.db, first, "0.000000000000000001").await;
    let w3 = confirmed_withdrawal(&env.db, second, "5").await;

    // Gates interleaved in the input, one of them new (second's USDT), two currencies.
    ledger::post_all(&mut env.db.acquire().await.unwrap(), &[])
        .await
        .unwrap();
    post_all_committed(
        &env.db,
        &[
            confirm_debit(first, w1, "30"),
            confirm_debit(second, w3, "5"),
            credit(first, "BTC", "0.5"),
            confirm_debit(first, w2, "0.000000000000000001"),
            credit(first, "USDT", "7"),
        ],
    )
    .await
    .unwrap();

    assert_eq!(
        entries(&env.db, first, "USDT").await,
        vec![
            ("CREDIT".into(), dec("100"), dec("100"), None),
            (
                "DEBIT".into(),
                dec("30"),
                dec("70"),
                Some(format!("WDR_CONFIRM:{w1}"))
            ),
            (
                "DEBIT".into(),
                dec("0.000000000000000001"),
                dec("69.999999999999999999"),
                Some(format!("WDR_CONFIRM:{w2}"))
            ),
            (
                "CREDIT".into(),
                dec("7"),
                dec("76.999999999999999999"),
                None
            ),
        ]
    );
    assert_eq!(
        entries(&env.db, second, "USDT").await,
        vec![(
            "DEBIT".into(),
            dec("5"),
            dec("-5"),
            Some(format!("WDR_CONFIRM:{w3}"))
        )]
    );
    assert_eq!(
        balance(&env.db, first, "USDT").await,
        Some(dec("76.999999999999999999"))
    );
    assert_eq!(balance(&env.db, first, "BTC").await, Some(dec("0.5")));
    assert_eq!(balance(&env.db, second, "USDT").await, Some(dec("-5")));
    assert_eq!(audit_violations(&env.db).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_batch_with_a_key_already_recorded_records_the_rest_as_sequential_postings_would() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let (w1, w2, w3) = (
        confirmed_withdrawal(&env.db, partner, "10").await,
        confirmed_withdrawal(&env.db, partner, "20").await,
        confirmed_withdrawal(&env.db, partner, "30").await,
    );
    post_committed(&env.db, &confirm_debit(partner, w2, "20"))
        .await
        .unwrap();

    let posted = post_all_committed(
        &env.db,
        &[
            confirm_debit(partner, w1, "10"),
            confirm_debit(partner, w2, "20"),
            confirm_debit(partner, w3, "30"),
            // The same key twice in one call: the second finds the first.
            confirm_debit(partner, w3, "30"),
        ],
    )
    .await
    .unwrap();

    assert_eq!(
        posted,
        [
            Posted::Recorded,
            Posted::AlreadyRecorded {
                idem_key: IdemKey::withdrawal_confirm(w2)
            },
            Posted::Recorded,
            Posted::AlreadyRecorded {
                idem_key: IdemKey::withdrawal_confirm(w3)
            },
        ]
    );
    // w2's earlier debit, then w1's and w3's of the batch.
    assert_eq!(
        balances_after(&env.db, partner, "USDT").await,
        [dec("-20"), dec("-30"), dec("-60")]
    );
    assert_eq!(balance(&env.db, partner, "USDT").await, Some(dec("-60")));
    assert_eq!(audit_violations(&env.db).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_batch_answers_each_posting_in_the_callers_order_and_chains_each_gate_in_it() {
    let env = TestEnv::new().await;
    let (first, second) = (new_partner(&env.db).await, new_partner(&env.db).await);

    let posted = post_all_committed(
        &env.db,
        &[
            credit(second, "USDT", "2"),
            credit(first, "USDT", "1"),
            credit(second, "USDT", "3"),
        ],
    )
    .await
    .unwrap();

    assert_eq!(
        posted,
        [Posted::Recorded, Posted::Recorded, Posted::Recorded]
    );
    assert_eq!(
        balances_after(&env.db, second, "USDT").await,
        [dec("2"), dec("5")]
    );
    assert_eq!(balances_after(&env.db, first, "USDT").await, [dec("1")]);
}

#[tokio::test]
async fn a_batch_beyond_the_column_or_with_a_bad_posting_is_refused() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    post_committed(
        &env.db,
        &migration_credit(partner, "999999999999999999.999999999999999999"),
    )
    .await
    .unwrap();

    let beyond = post_all_committed(&env.db, &[migration_credit(partner, "1")]).await;
    let invalid = post_all_committed(
        &env.db,
        &[credit(partner, "USDT", "1"), credit(partner, "usdt", "1")],
    )
    .await;

    assert!(
        matches!(&beyond, Err(LedgerError::OutOfRange { partner_id, .. }) if *partner_id == partner),
        "{beyond:?}"
    );
    assert!(
        matches!(&invalid, Err(LedgerError::InvalidCurrency { .. })),
        "{invalid:?}"
    );
    assert_eq!(entries(&env.db, partner, "USDT").await.len(), 1);
    assert_eq!(audit_violations(&env.db).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_batches_over_shared_gates_keep_every_chain_exact() {
    let env = TestEnv::new().await;
    let pool = MySqlPoolOptions::new()
        .max_connections(16)
        .connect_with(db::connect_options(&env.settings.database).unwrap())
        .await
        .unwrap();
    let mut partners = Vec::new();
    for _ in 0..5 {
        partners.push(new_partner(&pool).await);
    }
    // Twelve batches of ten credits each, every batch touching the partners in its own order,
    // all started at once: gate locks are taken in (partner, currency) order, so none waits
    // for another in a cycle.
    let start = Arc::new(Barrier::new(12));
    let mut batches = JoinSet::new();
    for b in 0..12_usize {
        let (pool, partners, start) = (pool.clone(), partners.clone(), start.clone());
        batches.spawn(async move {
            let postings: Vec<Posting> = (0..10)
                .map(|n| credit(partners[(b * 3 + n * 7) % partners.len()], "USDT", "1.5"))
                .collect();
            start.wait().await;
            post_all_committed(&pool, &postings).await
        });
    }
    while let Some(done) = batches.join_next().await {
        done.unwrap().unwrap();
    }

    let mut total = Amount::ZERO;
    for &partner in &partners {
        total = total + balance(&pool, partner, "USDT").await.unwrap();
    }
    assert_eq!(total, dec("180"));
    assert_eq!(audit_violations(&pool).await, Vec::<String>::new());
}

/// A batch reads only its own gates, even while the gate table is new and its statistics say
/// it is empty: with them, the entries' INSERT … SELECT once scanned the gates into a join
/// buffer, share-locking every one — here it would wait for the open transaction that holds
/// two other partners' gates (and, with two such batches, deadlock; CI saw it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_on_a_new_gate_table_waits_for_no_other_partner_s_gate() {
    let env = TestEnv::new().await;
    let others = [new_partner(&env.db).await, new_partner(&env.db).await];
    let mine = new_partner(&env.db).await;
    let mut holding = env.db.begin().await.unwrap();
    let held: Vec<Posting> = others.iter().map(|&p| credit(p, "USDT", "1")).collect();
    ledger::post_all(&mut holding, &held).await.unwrap();

    let batch: Vec<Posting> = (0..16).map(|_| credit(mine, "USDT", "1")).collect();
    let posted = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        post_all_committed(&env.db, &batch),
    )
    .await;
    holding.commit().await.unwrap();

    assert!(
        matches!(&posted, Ok(Ok(entries)) if entries.len() == 16),
        "the batch waited for the other partners' open transaction: {posted:?}"
    );
    assert_eq!(balance(&env.db, mine, "USDT").await, Some(dec("16")));
    assert_eq!(audit_violations(&env.db).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_batches_over_different_gates_never_deadlock() {
    // Four shards of four batches each, as confirm-withdrawal's sharded consumers run them:
    // every batch posts to eleven of sixteen partners, a different eleven each, so two
    // batches share some gates and each holds gates the other lacks. Every batch must commit
    // at the first try: a deadlock is an error here, not a retry.
    const PARTNERS: usize = 16;
    const BATCHES: usize = 16;
    const ROUNDS: usize = 20;
    let env = TestEnv::new().await;
    let pool = MySqlPoolOptions::new()
        .max_connections(u32::try_from(BATCHES).unwrap())
        .connect_with(db::connect_options(&env.settings.database).unwrap())
        .await
        .unwrap();
    let mut partners = Vec::new();
    for _ in 0..PARTNERS {
        partners.push(new_partner(&pool).await);
    }
    for round in 0..ROUNDS {
        let start = Arc::new(Barrier::new(BATCHES));
        let mut batches = JoinSet::new();
        for b in 0..BATCHES {
            let (pool, partners, start) = (pool.clone(), partners.clone(), start.clone());
            batches.spawn(async move {
                let postings: Vec<Posting> = (0..16)
                    .map(|n| {
                        credit(
                            partners[(b * 5 + round * 3 + n * n * 7) % PARTNERS],
                            "USDT",
                            "1",
                        )
                    })
                    .collect();
                start.wait().await;
                post_all_committed(&pool, &postings).await
            });
        }
        while let Some(done) = batches.join_next().await {
            done.unwrap().unwrap();
        }
    }

    let mut total = Amount::ZERO;
    for &partner in &partners {
        total = total
            + balance(&pool, partner, "USDT")
                .await
                .unwrap_or(Amount::ZERO);
    }
    assert_eq!(total, dec("5120"));
    assert_eq!(audit_violations(&pool).await, Vec::<String>::new());
    pool.close().await;
}
