//! The process dies mid-grant: a real grant-bonus binary is killed (SIGKILL) while its grant
//! waits on the member's row lock. The seed would have stranded the job PROCESSING for ever;
//! here the grant had committed nothing (the message path claims nothing before its one
//! transaction), so the job is still PENDING and due, the redelivered message grants it
//! exactly once, and the worker and the reaper that run after find nothing left.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod support;

use std::{process::Stdio, time::Duration};

use paybus_bonuses::{BonusRules, job::JobStatus};
use paybus_bus::metrics;
use paybus_grant_bonus::{BonusReaper, BonusWorker, GrantBonus};
use paybus_retry::Clock;
use paybus_runtime::runner::Runner;
use paybus_testkit::{bonuses as testing, eventually};
use support::*;
use tokio_util::sync::CancellationToken;

const TIMEOUT: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_whose_process_was_killed_mid_grant_is_granted_exactly_once_by_its_redelivered_message()
 {
    let bonuses = Bonuses::new().await;
    ten_percent_event(bonuses.pool()).await;
    // Its message waits in grant-bonus's queue for the process below.
    let charge = bonuses.completed_purchase(100, BonusRules::default()).await;
    let job_id = charge.bonus_jobs[0].job_id;
    // Hold the member's lock so the process's grant blocks inside its transaction.
    let blocker = bonuses.hold_member(charge.member_id).await;
    let mut process = tokio::process::Command::new(env!("CARGO_BIN_EXE_grant-bonus"))
        .envs(bonuses.env.env_vars())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    assert!(
        bonuses.lock_waits(1).await,
        "the process's grant waits on the member"
    );

    process.kill().await.unwrap();
    blocker.rollback().await.unwrap();
    let stranded = bonuses.job(job_id).await;
    // A consumer of our own gets the killed process's unacked message back.
    let shutdown = CancellationToken::new();
    let mut runner = Runner::new(bonuses.services.clone());
    runner.add_function(GrantBonus::default());
    let consumer = tokio::spawn(runner.run(shutdown.clone()));
    let redelivered = eventually(Duration::from_secs(30), || async {
        metrics::count("grant-bonus", "skipped") + metrics::count("grant-bonus", "done") >= 1
    })
    .await;
    let granted_by_then = bonuses.job(job_id).await;
    // The reaper and the worker run on a clock past the timeout.
    let later =
        Clock::manual(testing::db_now(bonuses.pool()).await + TIMEOUT + Duration::from_secs(1));
    let reaped = BonusReaper::new(bonuses.pool().clone(), TIMEOUT)
        .with_clock(later.clone())
        .run_once()
        .await
        .unwrap();
    let run = BonusWorker::new(bonuses.pool().clone(), TIMEOUT, 30)
        .with_clock(later)
        .run_once()
        .await
        .unwrap();
    shutdown.cancel();
    consumer.await.unwrap().unwrap();

    assert_eq!(
        stranded.status,
        JobStatus::Pending,
        "the kill left nothing committed"
    );
    assert!(redelivered, "the killed process's message came back");
    assert_eq!(
        (
            metrics::count("grant-bonus", "skipped"),
            metrics::count("grant-bonus", "done")
        ),
        (0, 1),
        "the redelivered message grants the job"
    );
    assert_eq!(granted_by_then.status, JobStatus::Done);
    assert_eq!(reaped, Vec::<u64>::new(), "nothing stranded PROCESSING");
    assert_eq!((run.claimed, run.granted), (0, 0));
    let job = bonuses.job(job_id).await;
    assert_eq!((job.status, job.retry_count), (JobStatus::Done, 0));
    bonuses.assert_granted_once(charge.member_id, 110).await;
}
