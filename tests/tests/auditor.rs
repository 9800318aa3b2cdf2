//! The continuous auditor (a sweeper job) against real rows: quiet on clean data, a planted
//! violation reported once per pass (an ERROR line, a metric, one `audit_findings` row seen
//! again), and the ledger's windowed checks find what the full checks find in the window.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::collections::BTreeSet;

use paybus_confirmations::{
    testing::{BROADCAST_TX, withdrawal},
    withdrawal::{WithdrawalKind, WithdrawalStatus},
};
use paybus_platform::{
    audit::{self, Window},
    auditor::{self, Auditor, AuditorConfig},
    bus::metrics,
    testing::TestEnv,
};
use sqlx::MySqlPool;

/// A partner with a confirmed withdrawal (its keyed DEBIT, balance and chain all right).
async fn clean_ledger(services: &paybus_platform::bus::Services) -> u64 {
    let pool = &services.pool;
    let partner = paybus_partners::testing::partner(pool, "acme", None).await;
    for amount in ["100", "25"] {
        let id = withdrawal(
            pool,
            partner,
            WithdrawalKind::Normal,
            WithdrawalStatus::Broadcasting,
            amount,
        )
        .await;
        let confirmation = paybus_confirmations::WithdrawalTxConfirmed {
            withdrawal_id: id,
            tx_hash: BROADCAST_TX.to_owned(),
        };
        paybus_confirm_withdrawal::confirm(&services.outbox, &confirmation, uuid::Uuid::now_v7())
            .await
            .unwrap();
    }
    partner
}

async fn findings(pool: &MySqlPool) -> Vec<(String, u32)> {
    sqlx::query_as("SELECT check_name, times_seen FROM audit_findings ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_auditor_reports_a_planted_violation_once_per_pass_and_nothing_on_clean_data() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let pool = &services.pool;
    let partner = clean_ledger(&services).await;
    let auditor = Auditor::new(
        pool.clone(),
        paybus_catalog::audit_checks(),
        AuditorConfig::default(),
    );

    let clean = auditor.pass().await.unwrap();
    assert_eq!(clean.violations, []);
    assert!(findings(pool).await.is_empty());

    // Someone "fixes" a balance by hand.
    sqlx::query("UPDATE partner_balances SET balance = balance + 1 WHERE partner_id = ?")
        .bind(partner)
        .execute(pool)
        .await
        .unwrap();
    let reported_before = metrics::encode(&metrics::Gauges::default());
    let first = auditor.pass().await.unwrap();
    let second = auditor.pass().await.unwrap();
    for pass in [&first, &second] {
        let checks: Vec<_> = pass.violations.iter().map(|v| v.check).collect();
        assert_eq!(checks, ["balance_mismatch"], "pass {}", pass.id);
    }
    assert_eq!(findings(pool).await, [("balance_mismatch".to_owned(), 2)]);

    let mut conn = pool.acquire().await.unwrap();
    let passes = auditor::recent_passes(&mut conn, 10).await.unwrap();
    let counts: Vec<_> = passes.iter().map(|p| p.violations).collect();
    assert_eq!(counts, [1, 1, 0], "newest first");
    let seen = auditor::findings(&mut conn, Some(second.id), 10)
        .await
        .unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].detail["partner_id"], partner);
    assert!(
        metrics::encode(&metrics::Gauges::default())
            .contains("paybus_audit_violations_total{check=\"balance_mismatch\"}"),
        "the metric counts it (before: {reported_before})"
    );
}

#[tokio::test]
async fn the_ledgers_windowed_checks_find_what_the_full_checks_find_in_the_window() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let pool = &services.pool;
    let partner = clean_ledger(&services).await;
    let checks = paybus_ledger::audit::CHECKS;
    let since = sqlx::query_scalar("SELECT NOW(6) - INTERVAL 1 HOUR")
        .fetch_one(pool)
        .await
        .unwrap();
    let names = |found: Vec<audit::Violation>| -> BTreeSet<(&'static str, String)> {
        found
            .into_iter()
            .map(|v| (v.check, v.description))
            .collect()
    };
    // A keyed DEBIT in the wrong place (a second one for the first withdrawal, under the
    // key of another), with a balance_after that breaks the chain and a balance left as it
    // was.
    let first: u64 = sqlx::query_scalar("SELECT MIN(reference_id) FROM ledger_entries")
        .fetch_one(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO ledger_entries (partner_id, currency, entry_type, amount, balance_after, \
         reference_type, reference_id, idem_key) \
         VALUES (?, 'USDT', 'DEBIT', 5, 0, 'WITHDRAWAL', ?, 'WDR_CONFIRM:424242')",
    )
    .bind(partner)
    .bind(first)
    .execute(pool)
    .await
    .unwrap();

    let mut conn = pool.acquire().await.unwrap();
    let full = names(audit::run(&mut conn, checks).await.unwrap());
    let recent = names(
        audit::run_recent(&mut conn, checks, Window { since })
            .await
            .unwrap(),
    );
    let kinds = |set: &BTreeSet<(&'static str, String)>| -> BTreeSet<&'static str> {
        set.iter().map(|(check, _)| *check).collect()
    };
    assert_eq!(
        kinds(&full),
        BTreeSet::from([
            "balance_mismatch",
            "broken_chain",
            "duplicate_keyed_entries",
            "misplaced_idem_key"
        ])
    );
    assert_eq!(kinds(&recent), kinds(&full));
    // Outside the window nothing is read.
    let later = sqlx::query_scalar("SELECT NOW(6) + INTERVAL 1 SECOND")
        .fetch_one(pool)
        .await
        .unwrap();
    let none = audit::run_recent(&mut conn, checks, Window { since: later })
        .await
        .unwrap();
    assert_eq!(none, []);
}

#[test]
fn a_malformed_auditor_setting_names_its_variable() {
    let error = AuditorConfig::from_vars(
        [("PAYBUS_AUDITOR_WINDOW_SECS".to_owned(), "soon".to_owned())].into(),
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("PAYBUS_AUDITOR_WINDOW_SECS"),
        "{error}"
    );
    assert_eq!(
        AuditorConfig::from_vars([].into()).unwrap(),
        AuditorConfig::default()
    );
}
