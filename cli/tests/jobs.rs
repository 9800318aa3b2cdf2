//! `paybus jobs` as operators run it: the list of jobs waiting for a retry or for ops, one job
//! as JSON, and the retry of a FAILED job (exit 1, nothing changed, for any other state).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_bonuses::{
    BonusRules,
    charge::PaymentGateway,
    completion,
    testing::{self},
};
use paybus_platform::testing::TestEnv;

fn paybus(env: &TestEnv, args: &[&str]) -> (Option<i32>, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_paybus"))
        .args(args)
        .envs(env.env_vars())
        // One operator acts alone here; four-eyes has its own test (approvals.rs).
        .env("PAYBUS_FOUR_EYES", "off")
        .output()
        .expect("run paybus");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn ops_list_show_and_retry_bonus_jobs() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    testing::active_event(&env.db, "cli 10%", 10, 9).await;
    let mut jobs = Vec::new();
    for _ in 0..3 {
        let member = testing::member(&env.db).await;
        let purchase = testing::purchase(&env.db, member, PaymentGateway::Pg, 100).await;
        let done = completion::complete(&services.outbox, BonusRules::default(), &purchase.paid())
            .await
            .unwrap();
        jobs.push(done.charge().bonus_jobs[0].job_id);
    }
    let [pending, failed, done] = jobs[..] else {
        unreachable!()
    };
    sqlx::query(
        "UPDATE charge_event_job SET status = 'FAILED', retry_count = 3, \
         last_error = 'gateway down' WHERE id = ?",
    )
    .bind(failed)
    .execute(&env.db)
    .await
    .unwrap();
    sqlx::query("DELETE FROM charge_event_job WHERE id = ?")
        .bind(done)
        .execute(&env.db)
        .await
        .unwrap();

    let (listed, all, _) = paybus(&env, &["jobs", "list"]);
    let (_, only_failed, _) = paybus(&env, &["jobs", "list", "--status", "FAILED"]);
    let (_, paged, _) = paybus(&env, &["jobs", "list", "--limit", "1"]);
    let (shown, json, _) = paybus(&env, &["jobs", "show", &failed.to_string()]);
    let (retried, said, _) = paybus(
        &env,
        &["jobs", "retry", &failed.to_string(), "--actor", "carol"],
    );
    let (again, _, refused) = paybus(&env, &["jobs", "retry", &failed.to_string()]);
    let (logged, log, _) = paybus(&env, &["ops-log"]);
    let (bad_status, _, _) = paybus(&env, &["jobs", "list", "--status", "DONE"]);

    assert_eq!(listed, Some(0));
    let ids: Vec<u64> = all
        .lines()
        .filter(|line| line.contains("ACTIVE_CHARGE_EVENT"))
        .filter_map(|line| line.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(ids, [pending, failed], "{all}");
    assert!(only_failed.contains("gateway down"), "{only_failed}");
    assert!(
        !only_failed.contains(&format!("\n{pending:>8} ")),
        "{only_failed}"
    );
    assert!(
        paged.contains(&format!("paybus jobs list --after-id {pending}")),
        "{paged}"
    );
    assert_eq!(shown, Some(0));
    let job: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        (job["status"].as_str(), job["retry_count"].as_i64()),
        (Some("FAILED"), Some(3))
    );
    assert_eq!(retried, Some(0), "{said}");
    assert!(said.contains("PENDING again"), "{said}");
    assert_eq!(again, Some(1));
    assert!(refused.contains("is PENDING, not FAILED"), "{refused}");
    // The retry is in the ops log under --actor; the refused one is not.
    assert_eq!(logged, Some(0));
    let entries: Vec<Vec<&str>> = log
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(entries.len(), 1, "{log}");
    assert_eq!(
        (entries[0][0], entries[0][3], entries[0][4], entries[0][5]),
        (
            "1",
            "carol",
            "bonus_job.retry",
            format!("charge_event_job:{failed}").as_str()
        ),
        "{log}"
    );
    assert!(log.contains("\"last_error\":\"gateway down\""), "{log}");
    assert_eq!(
        bad_status,
        Some(2),
        "clap refuses a status the list never holds"
    );
}
