//! `paybus audit` as operators run it: clean is exit 0, each violation is a line and exit 1.

use crate::api_process;

use api_process::{output_of, paybus};
use paybus_testkit::TestEnv;

#[tokio::test]
async fn a_clean_ledger_passes_and_a_double_debit_fails_the_audit() {
    let env = TestEnv::new().await;
    let clean = output_of(paybus(&env).arg("audit"));
    assert!(
        clean.status.success(),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    assert!(String::from_utf8_lossy(&clean.stdout).contains("clean"));

    // The 2026-09-08 incident, planted by hand: withdrawal 1989 debited twice, once keyed
    // and once by a path that bypassed the key.
    for sql in [
        "INSERT INTO partners (id, name) VALUES (45, 'partner45')",
        "INSERT INTO partner_balances (partner_id, currency, balance) VALUES (45, 'USDT', -200)",
        "INSERT INTO ledger_entries (partner_id, currency, entry_type, amount, balance_after, \
         reference_type, reference_id, idem_key) \
         VALUES (45, 'USDT', 'DEBIT', 100, -100, 'WITHDRAWAL', 1989, 'WDR_CONFIRM:1989')",
        "INSERT INTO ledger_entries (partner_id, currency, entry_type, amount, balance_after, \
         reference_type, reference_id, idem_key) \
         VALUES (45, 'USDT', 'DEBIT', 100, -150, 'WITHDRAWAL', 1989, NULL)",
    ] {
        sqlx::query(sql).execute(&env.db).await.unwrap();
    }
    let dirty = output_of(paybus(&env).arg("audit"));
    let stdout = String::from_utf8_lossy(&dirty.stdout);

    assert_eq!(dirty.status.code(), Some(1), "{stdout}");
    let violations: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("violation"))
        .collect();
    // The second entry's balance_after (-150) does not follow from the first (-100 - 100),
    // and the keyed DEBIT names a withdrawal that does not exist.
    assert_eq!(
        violations,
        [
            "violation [broken_chain]: broken_chain: entry 2 (partner 45 USDT) has balance_after \
             -150.000000000000000000, expected -200.000000000000000000 from the entry before it",
            "violation [unexpected_withdrawal_debit]: unexpected_withdrawal_debit: entry 1 is a \
             confirmation DEBIT of withdrawal 1989, which does not exist",
        ],
        "{stdout}"
    );
    assert!(String::from_utf8_lossy(&dirty.stderr).contains("2 violation(s)"));
}

#[tokio::test]
async fn logs_written_to_a_pipe_carry_no_colour_codes() {
    let env = TestEnv::new().await;

    let output = output_of(paybus(&env).arg("audit"));

    let logs = String::from_utf8_lossy(&output.stderr);
    assert!(logs.contains("audit clean"), "{logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "ANSI escape codes in piped logs: {logs:?}"
    );
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("audit clean"),
        "logs go to stderr, the command's output to stdout"
    );
}

#[tokio::test]
async fn an_ops_log_row_changed_or_deleted_by_sql_fails_the_audit_naming_the_first_broken_link() {
    let env = TestEnv::new().await;
    let mut tx = env.db.begin().await.unwrap();
    for function in ["grant-bonus", "confirm-deposit", "cancel-orders", "canary"] {
        paybus_ops::ops_log::append(
            &mut tx,
            &paybus_ops::ops_log::Entry {
                actor: &paybus_testkit::person("alice"),
                action: "function.pause",
                subject: &format!("function:{function}"),
                detail: &serde_json::json!({"reason": "maintenance"}),
            },
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    let clean = output_of(paybus(&env).arg("audit"));
    assert!(
        clean.status.success(),
        "{}",
        String::from_utf8_lossy(&clean.stdout)
    );

    // Someone hides who paused confirm-deposit, and deletes the canary's pause.
    sqlx::query("UPDATE ops_log SET actor = 'nobody' WHERE seq = 2")
        .execute(&env.db)
        .await
        .unwrap();
    sqlx::query("DELETE FROM ops_log WHERE seq = 4")
        .execute(&env.db)
        .await
        .unwrap();
    let changed = output_of(paybus(&env).arg("audit"));
    sqlx::query("UPDATE ops_log SET actor = 'alice' WHERE seq = 2")
        .execute(&env.db)
        .await
        .unwrap();
    let deleted = output_of(paybus(&env).arg("audit"));

    let violations = |output: &std::process::Output| -> Vec<String> {
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| line.starts_with("violation"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(changed.status.code(), Some(1));
    assert_eq!(
        violations(&changed),
        [
            "violation [ops_log_chain]: ops_log_chain: row 2's content does not match its hash \
          (changed after it was written)"
        ],
        "only the first broken link"
    );
    assert_eq!(deleted.status.code(), Some(1));
    assert_eq!(
        violations(&deleted),
        [
            "violation [ops_log_chain]: ops_log_chain: the head says 4 rows but the log ends at 3 \
          (the tail was deleted)"
        ]
    );
}
