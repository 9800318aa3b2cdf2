//! The continuous auditor (a sweeper job) against real rows: quiet on clean data, a planted
//! violation reported once per pass (an ERROR line, a metric, one `audit_findings` row seen
//! again), and the ledger's windowed checks find what the full checks find in the window.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use paybus_bus::metrics;
use paybus_confirmations::withdrawal::{WithdrawalKind, WithdrawalStatus};
use paybus_maintenance::auditor::{self, Auditor, AuditorConfig};
use paybus_ops::audit::{self, Window};
use paybus_testkit::{
    TestEnv,
    confirmations::{BROADCAST_TX, withdrawal},
};
use sqlx::MySqlPool;

/// A partner with a confirmed withdrawal (its keyed DEBIT, balance and chain all right).
async fn clean_ledger(services: &paybus_bus::Services) -> u64 {
    let pool = &services.pool;
    let partner = paybus_testkit::partners::partner(pool, "acme", None).await;
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
        paybus_confirmations::withdrawal::confirm(
            &services.outbox,
            &confirmation,
            uuid::Uuid::now_v7(),
        )
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

/// Moves an entry's stamp to `seconds` before the given instant and puts a key on it that is
/// not its own (to the ledger's checks a `misplaced_idem_key`, nothing else): a transaction that wrote it then
/// and committed now.
async fn plant_late_commit(pool: &MySqlPool, entry_id: u64, before: DateTime<Utc>, seconds: u32) {
    sqlx::query(
        "UPDATE ledger_entries SET idem_key = CONCAT('WDR_CONFIRM:', reference_id + 1000), \
         created_at = ? - INTERVAL ? SECOND WHERE id = ?",
    )
    .bind(before)
    .bind(seconds)
    .bind(entry_id)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_pass_reads_from_the_previous_pass_less_the_overlap_and_no_further() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let pool = &services.pool;
    clean_ledger(&services).await;
    let entries: Vec<u64> = sqlx::query_scalar("SELECT id FROM ledger_entries ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap();
    // The older entry is stamped further back, so the stamps keep the ids' order (the
    // windowed balance check reads a pair's latest entry in the window).
    let (too_late, late) = (entries[entries.len() - 2], entries[entries.len() - 1]);
    let config = AuditorConfig::default();
    // The ledger's checks: a key that is not its own is then one finding (W2's would add the
    // withdrawal it no longer names).
    let ledger_checks = paybus_ledger::audit::CHECKS;
    let auditor = Auditor::new(pool.clone(), ledger_checks.to_vec(), config);
    let started = |pass: u64| async move {
        sqlx::query_scalar::<_, DateTime<Utc>>("SELECT started_at FROM audit_passes WHERE id = ?")
            .bind(pass)
            .fetch_one(pool)
            .await
            .unwrap()
    };

    let first = auditor.pass().await.unwrap();
    assert_eq!(first.violations, []);
    let first_started = started(first.id).await;
    // The first pass on the database reads the whole window.
    assert_eq!(
        first.window_since,
        first_started - chrono::Duration::from_std(config.window).unwrap()
    );
    // Written a minute before the first pass, committed after it: inside the overlap.
    plant_late_commit(pool, late, first_started, 60).await;
    let second = auditor.pass().await.unwrap();
    assert_eq!(
        second.window_since,
        first_started - chrono::Duration::from_std(config.overlap).unwrap(),
        "the second pass reads from the first's start less the overlap"
    );
    let checks: Vec<_> = second.violations.iter().map(|v| v.check).collect();
    assert_eq!(checks, ["misplaced_idem_key"]);

    // Written five minutes before the second pass (longer than the overlap): no pass reads
    // it any more; the full audit does.
    plant_late_commit(pool, too_late, started(second.id).await, 300).await;
    let third = auditor.pass().await.unwrap();
    let described: Vec<_> = third
        .violations
        .iter()
        .map(|v| v.description.clone())
        .collect();
    assert_eq!(described.len(), 1, "{described:?}");
    assert!(
        described[0].contains(&format!("entry {late} ")),
        "{described:?}"
    );
    let mut conn = pool.acquire().await.unwrap();
    let full = audit::run(&mut conn, ledger_checks).await.unwrap();
    let found: BTreeSet<_> = full.iter().map(|v| v.description.clone()).collect();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found
            .iter()
            .any(|d| d.contains(&format!("entry {too_late} ")))
    );
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
