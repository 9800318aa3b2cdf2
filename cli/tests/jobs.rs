//! `paybus jobs` as operators run it: the list of jobs waiting for a retry or for ops, one job
//! as JSON (from the database), and the retry of a FAILED job through a real `paybus serve` as
//! the person whose token the command line holds (exit 1, nothing changed, for any other
//! state); under four-eyes, the retry waits for someone else's `paybus approvals approve`.

use crate::api_process;

use std::process::Command;

use api_process::ApiProcess;
use paybus_bonuses::{BonusRules, charge::PaymentGateway, completion};
use paybus_bus::Services;
use paybus_testkit::{TestEnv, bonuses};

fn run(command: &mut Command, args: &[&str]) -> (Option<i32>, String, String) {
    let output = command.args(args).output().expect("run paybus");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Three completed purchases' bonus jobs: one PENDING, one FAILED (3 retries, "gateway down"),
/// one gone (as a DONE one would be from the list).
async fn jobs(env: &TestEnv, services: &Services) -> (u64, u64) {
    bonuses::active_event(&env.db, "cli 10%", 10, 9).await;
    let mut jobs = Vec::new();
    for _ in 0..3 {
        let member = bonuses::member(&env.db).await;
        let purchase = bonuses::purchase(&env.db, member, PaymentGateway::Pg, 100).await;
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
    (pending, failed)
}

#[tokio::test]
async fn ops_list_show_and_retry_bonus_jobs() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let (pending, failed) = jobs(&env, &services).await;
    // One operator acts alone here; four-eyes has its own test below.
    let Some(api) = ApiProcess::with_provider(&env, &[("PAYBUS_FOUR_EYES", Some("off"))]).await
    else {
        return;
    };
    let paybus = |args: &[&str]| run(&mut api.cli(&env), args);
    let carol = |args: &[&str]| run(&mut api.cli_as(&env, "carol"), args);

    let (listed, all, _) = paybus(&["jobs", "list"]);
    let (_, only_failed, _) = paybus(&["jobs", "list", "--status", "FAILED"]);
    let (_, paged, _) = paybus(&["jobs", "list", "--limit", "1"]);
    let (shown, json, _) = paybus(&["jobs", "show", &failed.to_string()]);
    let (retried, said, _) = carol(&["jobs", "retry", &failed.to_string()]);
    let (again, _, refused) = carol(&["jobs", "retry", &failed.to_string()]);
    let (logged, log, _) = paybus(&["ops-log"]);
    let (bad_status, _, _) = paybus(&["jobs", "list", "--status", "DONE"]);

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
    assert!(
        refused.contains("is PENDING, not FAILED") && refused.contains("409 Conflict"),
        "{refused}"
    );
    // The retry is in the ops log under the token's person; the refused one is not.
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
            "carol@example.com",
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

#[tokio::test]
async fn under_four_eyes_a_retry_waits_for_someone_elses_approval_through_the_cli() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let (_, failed) = jobs(&env, &services).await;
    let Some(api) =
        ApiProcess::with_provider(&env, &[("PAYBUS_FOUR_EYES", Some("job-retry"))]).await
    else {
        return;
    };
    let alice = |args: &[&str]| run(&mut api.cli_as(&env, "alice"), args);
    let bob = |args: &[&str]| run(&mut api.cli_as(&env, "bob"), args);

    let (asked, said, _) = alice(&["jobs", "retry", &failed.to_string()]);
    assert_eq!(asked, Some(0), "{said}");
    let approval: String = sqlx::query_scalar("SELECT id FROM ops_approvals")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert!(
        said.contains(&format!("paybus approvals approve {approval}\n")),
        "{said}"
    );
    let status = || async {
        sqlx::query_scalar::<_, String>("SELECT status FROM charge_event_job WHERE id = ?")
            .bind(failed)
            .fetch_one(&env.db)
            .await
            .unwrap()
    };
    assert_eq!(status().await, "FAILED", "held, not run");

    let (own, _, refusal) = alice(&["approvals", "approve", &approval]);
    assert_eq!(own, Some(1));
    assert!(
        refusal.contains("another ADMIN must approve it") && refusal.contains("403 Forbidden"),
        "{refusal}"
    );
    let (approved, said, _) = bob(&["approvals", "approve", &approval]);
    assert_eq!(approved, Some(0), "{said}");
    assert!(said.contains("approved by bob@example.com"), "{said}");
    let (executed, said, _) = alice(&["approvals", "execute", &approval]);
    assert_eq!(executed, Some(0), "{said}");
    assert!(said.contains("is EXECUTED"), "{said}");
    assert_eq!(status().await, "PENDING");

    let actions: Vec<(String, String)> =
        sqlx::query_as("SELECT actor, action FROM ops_log ORDER BY seq")
            .fetch_all(&env.db)
            .await
            .unwrap();
    let actions: Vec<(&str, &str)> = actions
        .iter()
        .map(|(actor, action)| (actor.as_str(), action.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("alice@example.com", "approval.request"),
            ("bob@example.com", "approval.approve"),
            ("alice@example.com", "bonus_job.retry"),
        ]
    );
}
