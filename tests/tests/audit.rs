//! `paybus audit`'s checks against real MariaDB: a clean ledger passes, and each check catches
//! the violation planted for it by raw SQL.

use paybus_confirmations::{
    audit::Violation as W2,
    withdrawal::{WithdrawalKind, WithdrawalStatus},
};
use paybus_ledger::{
    self as ledger, EntryType, IdemKey, Posted, Posting, ReferenceType, audit::Violation as Ledger,
};
use paybus_ops::audit::{self, Violation};
use paybus_testkit::{
    TestEnv,
    confirmations::{deposit as new_deposit, withdrawal},
    dec,
    partners::partner,
};
use sqlx::MySqlPool;

async fn new_partner(pool: &MySqlPool) -> u64 {
    partner(pool, "partner", None).await
}

async fn new_withdrawal(
    pool: &MySqlPool,
    partner_id: u64,
    kind: &str,
    status: &str,
    amount: &str,
) -> u64 {
    let kind: WithdrawalKind = kind.parse().expect("a withdrawal kind");
    let status: WithdrawalStatus = status.parse().expect("a withdrawal status");
    withdrawal(pool, partner_id, kind, status, amount).await
}

/// Posts through the ledger (so balance and chain stay right) and returns the entry id: the
/// gate's newest entry, read while the posting's transaction still holds the gate.
async fn post(pool: &MySqlPool, posting: Posting) -> u64 {
    let mut tx = pool.begin().await.expect("post through the ledger");
    let posted = ledger::post(&mut tx, &posting)
        .await
        .expect("post through the ledger");
    assert_eq!(posted, Posted::Recorded);
    let entry_id: u64 = sqlx::query_scalar(
        "SELECT MAX(id) FROM ledger_entries WHERE partner_id = ? AND currency = ?",
    )
    .bind(posting.partner_id)
    .bind(&posting.currency)
    .fetch_one(&mut *tx)
    .await
    .expect("read the entry's id");
    tx.commit().await.expect("post through the ledger");
    entry_id
}

fn withdrawal_debit(partner_id: u64, withdrawal_id: u64, amount: &str) -> Posting {
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

fn deposit_credit(partner_id: u64, deposit_id: u64, amount: &str) -> Posting {
    Posting::new(
        partner_id,
        "USDT",
        EntryType::Credit,
        dec(amount),
        ReferenceType::Deposit,
        deposit_id,
    )
    .idem_key(IdemKey::deposit_credit(deposit_id))
}

fn deposit_fee(partner_id: u64, deposit_id: u64, amount: &str) -> Posting {
    Posting::new(
        partner_id,
        "USDT",
        EntryType::Fee,
        dec(amount),
        ReferenceType::Deposit,
        deposit_id,
    )
    .idem_key(IdemKey::deposit_fee(deposit_id))
}

fn credit(partner_id: u64, amount: &str) -> Posting {
    Posting::new(
        partner_id,
        "USDT",
        EntryType::Credit,
        dec(amount),
        ReferenceType::Migration,
        0,
    )
}

/// Every check `paybus audit` runs: a check deleted from the catalog fails its test here.
async fn violations(pool: &MySqlPool) -> Vec<Violation> {
    let mut conn = pool.acquire().await.expect("run the audit");
    audit::run(&mut conn, &paybus_catalog::audit_checks())
        .await
        .expect("run the audit")
}

fn checks(violations: &[Violation]) -> Vec<&'static str> {
    violations.iter().map(|v| v.check).collect()
}

/// Typed findings as the audit reports them.
fn reported<V: Into<Violation>, const N: usize>(findings: [V; N]) -> Vec<Violation> {
    findings.into_iter().map(Into::into).collect()
}

#[tokio::test]
async fn a_clean_ledger_has_no_violations() {
    let env = TestEnv::new().await;
    let (a, b) = (new_partner(&env.db).await, new_partner(&env.db).await);
    post(&env.db, credit(a, "1000")).await;
    // A confirmed NORMAL withdrawal with its DEBIT, and P2P legs that repeat without a key.
    let normal = new_withdrawal(&env.db, a, "NORMAL", "CONFIRMED", "100").await;
    post(&env.db, withdrawal_debit(a, normal, "100")).await;
    let p2p = new_withdrawal(&env.db, a, "NORMAL", "BROADCASTING", "20").await;
    for _ in 0..2 {
        let leg = Posting::new(
            a,
            "USDT",
            EntryType::Debit,
            dec("10"),
            ReferenceType::Withdrawal,
            p2p,
        );
        post(&env.db, leg).await;
    }
    // Confirmed withdrawals that move no balance, and ones not confirmed yet.
    new_withdrawal(&env.db, a, "SELF_TRANSFER", "CONFIRMED", "5").await;
    new_withdrawal(&env.db, a, "SETTLEMENT_WITHDRAW", "CONFIRMED", "7").await;
    new_withdrawal(&env.db, b, "NORMAL", "REQUESTED", "1").await;
    new_withdrawal(&env.db, b, "NORMAL", "FAILED", "1").await;
    // Confirmed deposits with and without a fee; a detected and a failed one.
    let with_fee = new_deposit(&env.db, b, "CONFIRMED", "50", "0.5").await;
    post(&env.db, deposit_credit(b, with_fee, "50")).await;
    post(&env.db, deposit_fee(b, with_fee, "0.5")).await;
    let without_fee = new_deposit(&env.db, b, "CONFIRMED", "8", "0").await;
    post(&env.db, deposit_credit(b, without_fee, "8")).await;
    new_deposit(&env.db, b, "DETECTED", "3", "0").await;
    new_deposit(&env.db, b, "FAILED", "3", "0").await;
    // Another currency of the same partner has a chain of its own.
    let btc = Posting {
        currency: "BTC".to_owned(),
        ..credit(b, "0.1")
    };
    post(&env.db, btc).await;

    let found = violations(&env.db).await;

    assert_eq!(found, []);
}

#[tokio::test]
async fn two_keyed_debits_on_one_withdrawal_are_reported() {
    // Seed 001 §7. The key is unique, so a second keyed DEBIT needs a key of another spelling:
    // here a leg whose key was rewritten, as a buggy path or a manual fix could do.
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let withdrawal = new_withdrawal(&env.db, partner, "NORMAL", "CONFIRMED", "100").await;
    let first = post(&env.db, withdrawal_debit(partner, withdrawal, "100")).await;
    let leg = Posting::new(
        partner,
        "USDT",
        EntryType::Debit,
        dec("100"),
        ReferenceType::Withdrawal,
        withdrawal,
    );
    let second = post(&env.db, leg).await;
    sqlx::query("UPDATE ledger_entries SET idem_key = CONCAT('WDR_CONFIRM:', reference_id, '-retry') WHERE id = ?")
        .bind(second)
        .execute(&env.db)
        .await
        .unwrap();

    let found = violations(&env.db).await;

    assert_eq!(
        found,
        reported([
            Ledger::DuplicateKeyedEntries {
                reference_type: "WITHDRAWAL".to_owned(),
                reference_id: withdrawal,
                entry_type: "DEBIT".to_owned(),
                entry_ids: vec![first, second],
            },
            Ledger::MisplacedIdemKey {
                entry_id: second,
                idem_key: format!("WDR_CONFIRM:{withdrawal}-retry"),
                entry_type: "DEBIT".to_owned(),
                reference_type: "WITHDRAWAL".to_owned(),
                reference_id: withdrawal,
            },
        ])
    );
    assert_eq!(
        found[0].to_string(),
        format!(
            "duplicate_keyed_entries: WITHDRAWAL {withdrawal} has 2 keyed DEBIT entries (ids {first}, {second})"
        )
    );
}

#[tokio::test]
async fn a_confirmed_withdrawal_debited_again_without_key_is_reported() {
    // Seed 001 §1, the incident: the duplicate's DEBIT bypassed the key. A P2P leg of another
    // amount on the same withdrawal is not a confirmation DEBIT and is not counted.
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let withdrawal = new_withdrawal(&env.db, partner, "NORMAL", "CONFIRMED", "100").await;
    post(&env.db, withdrawal_debit(partner, withdrawal, "100")).await;
    for amount in ["100", "10"] {
        let unkeyed = Posting::new(
            partner,
            "USDT",
            EntryType::Debit,
            dec(amount),
            ReferenceType::Withdrawal,
            withdrawal,
        );
        post(&env.db, unkeyed).await;
    }

    let found = violations(&env.db).await;

    assert_eq!(
        found,
        reported([W2::WithdrawalDebitedTwice {
            withdrawal_id: withdrawal,
            debits: 2,
        }])
    );
}

#[tokio::test]
async fn a_key_that_names_another_reference_is_reported() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let deposit = new_deposit(&env.db, partner, "CONFIRMED", "10", "0").await;
    let entry = post(&env.db, deposit_credit(partner, deposit, "10")).await;
    sqlx::query("UPDATE ledger_entries SET reference_id = reference_id + 1000 WHERE id = ?")
        .bind(entry)
        .execute(&env.db)
        .await
        .unwrap();

    let found = violations(&env.db).await;

    assert_eq!(checks(&found), ["misplaced_idem_key"]);
    assert_eq!(
        found[0].to_string(),
        format!(
            "misplaced_idem_key: entry {entry} carries key DEP_CREDIT:{deposit} but is a CREDIT of DEPOSIT {}",
            deposit + 1000
        )
    );
}

#[tokio::test]
async fn a_balance_that_disagrees_with_its_entries_is_reported() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    post(&env.db, credit(partner, "100")).await;
    post(&env.db, credit(partner, "20")).await;
    sqlx::query("UPDATE partner_balances SET balance = balance + 1 WHERE partner_id = ?")
        .bind(partner)
        .execute(&env.db)
        .await
        .unwrap();

    let found = violations(&env.db).await;

    assert_eq!(
        found,
        reported([Ledger::BalanceMismatch {
            partner_id: partner,
            currency: "USDT".to_owned(),
            balance: Some("121.000000000000000000".to_owned()),
            entries_sum: "120.000000000000000000".to_owned(),
        }])
    );
    assert_eq!(
        found[0].to_string(),
        format!(
            "balance_mismatch: partner {partner} USDT balance is 121.000000000000000000 but its entries sum to 120.000000000000000000"
        )
    );
}

#[tokio::test]
async fn entries_without_a_balance_row_are_reported() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    post(&env.db, credit(partner, "100")).await;
    // Only a load with foreign key checks off can leave entries without their gate row.
    let mut conn = env.db.acquire().await.unwrap();
    sqlx::query("SET SESSION foreign_key_checks = 0")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("DELETE FROM partner_balances WHERE partner_id = ?")
        .bind(partner)
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SET SESSION foreign_key_checks = 1")
        .execute(&mut *conn)
        .await
        .unwrap();

    let found = audit::run(&mut conn, &paybus_catalog::audit_checks())
        .await
        .unwrap();

    assert_eq!(
        found,
        reported([Ledger::BalanceMismatch {
            partner_id: partner,
            currency: "USDT".to_owned(),
            balance: None,
            entries_sum: "100.000000000000000000".to_owned(),
        }])
    );
}

#[tokio::test]
async fn a_broken_balance_after_chain_is_reported_at_the_break() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let first = post(&env.db, credit(partner, "100")).await;
    let second = post(&env.db, credit(partner, "10")).await;
    let third = post(&env.db, credit(partner, "1")).await;
    // The middle entry's balance_after is off by one; balances and sums stay right.
    sqlx::query("UPDATE ledger_entries SET balance_after = balance_after + 1 WHERE id = ?")
        .bind(second)
        .execute(&env.db)
        .await
        .unwrap();

    let found = violations(&env.db).await;

    let chain = |entry_id, balance_after: &str, expected: &str| Ledger::BrokenChain {
        entry_id,
        partner_id: partner,
        currency: "USDT".to_owned(),
        balance_after: balance_after.to_owned(),
        expected: expected.to_owned(),
    };
    assert_eq!(
        found,
        reported([
            chain(second, "111.000000000000000000", "110.000000000000000000"),
            chain(third, "111.000000000000000000", "112.000000000000000000"),
        ])
    );
    assert!(
        found
            .iter()
            .all(|v| !v.to_string().contains(&format!("entry {first} ")))
    );
}

#[tokio::test]
async fn a_chain_that_does_not_start_from_zero_is_reported() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let first = post(&env.db, credit(partner, "100")).await;
    sqlx::query("UPDATE ledger_entries SET balance_after = 150 WHERE id = ?")
        .bind(first)
        .execute(&env.db)
        .await
        .unwrap();
    sqlx::query("UPDATE partner_balances SET balance = 150 WHERE partner_id = ?")
        .bind(partner)
        .execute(&env.db)
        .await
        .unwrap();

    let found = violations(&env.db).await;

    assert_eq!(checks(&found), ["balance_mismatch", "broken_chain"]);
}

#[tokio::test]
async fn a_confirmed_normal_withdrawal_without_its_debit_is_reported() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let withdrawal = new_withdrawal(&env.db, partner, "NORMAL", "CONFIRMED", "100").await;

    let found = violations(&env.db).await;

    assert_eq!(
        found,
        reported([W2::WithdrawalDebitMissing {
            withdrawal_id: withdrawal
        }])
    );
    assert_eq!(
        found[0].to_string(),
        format!(
            "withdrawal_debit_missing: withdrawal {withdrawal} is CONFIRMED NORMAL but has no WDR_CONFIRM:{withdrawal} DEBIT"
        )
    );
}

#[tokio::test]
async fn a_confirmation_debit_that_disagrees_with_its_withdrawal_is_reported() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let withdrawal = new_withdrawal(&env.db, partner, "NORMAL", "CONFIRMED", "100").await;
    let entry = post(&env.db, withdrawal_debit(partner, withdrawal, "90")).await;

    let found = violations(&env.db).await;

    assert_eq!(
        found,
        reported([W2::WithdrawalDebitMismatch {
            withdrawal_id: withdrawal,
            entry_id: entry,
            expected: format!("100.000000000000000000 USDT of partner {partner}"),
            found: format!("DEBIT 90.000000000000000000 USDT of partner {partner}"),
        }])
    );
}

#[tokio::test]
async fn a_confirmation_debit_on_a_withdrawal_that_must_not_have_one_is_reported() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let self_transfer = new_withdrawal(&env.db, partner, "SELF_TRANSFER", "CONFIRMED", "5").await;
    let settlement =
        new_withdrawal(&env.db, partner, "SETTLEMENT_WITHDRAW", "CONFIRMED", "7").await;
    let failed = new_withdrawal(&env.db, partner, "NORMAL", "FAILED", "9").await;
    let e1 = post(&env.db, withdrawal_debit(partner, self_transfer, "5")).await;
    let e2 = post(&env.db, withdrawal_debit(partner, settlement, "7")).await;
    let e3 = post(&env.db, withdrawal_debit(partner, failed, "9")).await;

    let found = violations(&env.db).await;

    let unexpected =
        |entry_id, withdrawal_id, kind: &str, status: &str| W2::UnexpectedWithdrawalDebit {
            entry_id,
            withdrawal_id,
            kind: Some(kind.to_owned()),
            status: Some(status.to_owned()),
        };
    assert_eq!(
        found,
        reported([
            unexpected(e1, self_transfer, "SELF_TRANSFER", "CONFIRMED"),
            unexpected(e2, settlement, "SETTLEMENT_WITHDRAW", "CONFIRMED"),
            unexpected(e3, failed, "NORMAL", "FAILED"),
        ])
    );
    assert_eq!(
        found[0].to_string(),
        format!(
            "unexpected_withdrawal_debit: entry {e1} is a confirmation DEBIT of withdrawal {self_transfer}, which is CONFIRMED SELF_TRANSFER"
        )
    );
}

#[tokio::test]
async fn a_confirmed_deposit_without_its_credit_or_fee_is_reported() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let nothing = new_deposit(&env.db, partner, "CONFIRMED", "10", "1").await;
    let credit_only = new_deposit(&env.db, partner, "CONFIRMED", "20", "2").await;
    post(&env.db, deposit_credit(partner, credit_only, "20")).await;
    let no_fee_due = new_deposit(&env.db, partner, "CONFIRMED", "30", "0").await;
    post(&env.db, deposit_credit(partner, no_fee_due, "30")).await;

    let found = violations(&env.db).await;

    assert_eq!(
        found,
        reported([
            W2::DepositCreditMissing {
                deposit_id: nothing
            },
            W2::DepositFeeMissing {
                deposit_id: nothing
            },
            W2::DepositFeeMissing {
                deposit_id: credit_only
            },
        ])
    );
}

#[tokio::test]
async fn a_fee_entry_on_a_deposit_without_fee_is_reported() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let deposit = new_deposit(&env.db, partner, "CONFIRMED", "30", "0").await;
    post(&env.db, deposit_credit(partner, deposit, "30")).await;
    let fee = post(&env.db, deposit_fee(partner, deposit, "1")).await;

    let found = violations(&env.db).await;

    assert_eq!(
        found,
        reported([W2::DepositEntryMismatch {
            deposit_id: deposit,
            entry_id: fee,
            idem_key: format!("DEP_FEE:{deposit}"),
            expected: format!("FEE 0.000000000000000000 USDT of partner {partner}"),
            found: format!("FEE 1.000000000000000000 USDT of partner {partner}"),
        }])
    );
}

#[tokio::test]
async fn deposit_entries_of_an_unconfirmed_deposit_are_reported() {
    let env = TestEnv::new().await;
    let partner = new_partner(&env.db).await;
    let detected = new_deposit(&env.db, partner, "DETECTED", "10", "1").await;
    let credit = post(&env.db, deposit_credit(partner, detected, "10")).await;
    let fee = post(&env.db, deposit_fee(partner, detected, "1")).await;

    let found = violations(&env.db).await;

    let unexpected = |entry_id, idem_key: String| W2::UnexpectedDepositEntry {
        entry_id,
        idem_key,
        deposit_id: detected,
        status: Some("DETECTED".to_owned()),
    };
    assert_eq!(
        found,
        reported([
            unexpected(credit, format!("DEP_CREDIT:{detected}")),
            unexpected(fee, format!("DEP_FEE:{detected}")),
        ])
    );
}
