//! grant-bonus against the real database (seed 003's test list): the immediate attempt, the
//! worker's retries on a manual clock, FAILED with its dead letter, ops' retry, and the
//! seed's "no active event" rule where it would strand work.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod support;

use std::time::Duration;

use paybus_bonuses::{
    BonusRules,
    charge::{Container, PaymentGateway},
    job::{self, JobStatus, JobType},
};
use paybus_bus::{Handler, Outcome};
use paybus_grant_bonus::{GrantBonus, WorkerReport, attempt};
use paybus_testkit::bonuses::{self as testing, assert_audit_clean};
use support::*;

const NO_FIRST_CHARGE: BonusRules = BonusRules {
    first_charge_percent: 0,
};

#[tokio::test]
async fn a_completed_charge_is_granted_by_the_immediate_attempt() {
    let bonuses = Bonuses::new().await;
    ten_percent_event(bonuses.pool()).await;
    let charge = bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    let job_id = charge.bonus_jobs[0].job_id;
    let pending = bonuses.job(job_id).await;

    let outcome = bonuses.deliver(job_id).await;

    assert_eq!(
        (pending.status, pending.next_retry_at, pending.retry_count),
        (JobStatus::Pending, None, 0),
        "written by the completion, due at once"
    );
    assert_eq!(outcome, Outcome::Done);
    let done = bonuses.job(job_id).await;
    assert_eq!(done.status, JobStatus::Done);
    assert_eq!(done.processed_at, Some(bonuses.now()));
    let result = done.result_charge_id.expect("the EVENT charge");
    let (status, cans, method): (String, i32, String) =
        sqlx::query_as("SELECT status, cans, method FROM charges WHERE id = ?")
            .bind(result)
            .fetch_one(bonuses.pool())
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), cans, method.as_str()),
        ("EVENT", 10, "spring 10% bonus")
    );
    assert_eq!(
        testing::cans(bonuses.pool(), charge.member_id, Container::Pg).await,
        110
    );
    assert_audit_clean(bonuses.pool()).await;
}

#[tokio::test]
async fn the_worker_leaves_a_job_another_worker_claimed_alone() {
    let bonuses = Bonuses::new().await;
    ten_percent_event(bonuses.pool()).await;
    let charge = bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    let job_id = charge.bonus_jobs[0].job_id;
    let in_flight = attempt::claim_due(bonuses.pool(), 30, &bonuses.clock)
        .await
        .unwrap();
    assert_eq!(in_flight.len(), 1, "the other worker claims the job");

    let report = bonuses.run_worker().await;
    let message = bonuses.deliver(job_id).await;

    assert_eq!(report, WorkerReport::default(), "nothing claimed");
    assert!(
        matches!(&message, Outcome::Skipped(why) if why.contains("being granted")),
        "{message:?}"
    );
    let job = bonuses.job(job_id).await;
    assert_eq!(job.status, JobStatus::Processing);
    assert_eq!(job.processing_started_at, in_flight[0].claim.claimed_at);
    assert_eq!(
        bonuses
            .count("SELECT COUNT(*) FROM charges WHERE status = 'EVENT'")
            .await,
        0
    );
}

/// The message's grant claims nothing before its one transaction: a worker's claim that
/// commits between the message's read of the job and the grant's lock on it wins — the grant
/// leaves the job out and writes nothing — and the worker grants it. Once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_claim_landing_between_a_message_s_read_and_its_grant_wins_and_pays_once() {
    let bonuses = std::sync::Arc::new(Bonuses::new().await);
    ten_percent_event(bonuses.pool()).await;
    let charge = bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    let job_id = charge.bonus_jobs[0].job_id;
    // The worker's claim, not committed yet: the message still reads the job PENDING.
    let mut claiming = paybus_db::begin_read_committed(bonuses.pool())
        .await
        .unwrap();
    let claims = job::BONUS_JOBS
        .claim_due(&mut claiming, 30, Duration::ZERO, &bonuses.clock)
        .await
        .unwrap();
    assert_eq!(claims.len(), 1);
    let message = tokio::spawn({
        let bonuses = bonuses.clone();
        async move { bonuses.deliver(job_id).await }
    });
    assert!(
        bonuses.lock_waits(1).await,
        "the message's grant waits to lock the job"
    );
    let claimed = job::claimed(&mut claiming, &claims[0]).await.unwrap();
    claiming.commit().await.unwrap();
    let message = message.await.unwrap();
    let worker = attempt::attempt(
        bonuses.pool(),
        &paybus_bonuses::grant::ClaimedJob {
            job: claimed,
            claim: claims[0].clone(),
        },
        &job::RETRY_POLICY,
        &bonuses.clock,
    )
    .await
    .unwrap();

    assert!(
        matches!(&message, Outcome::Skipped(why) if why.contains("another attempt claimed it")),
        "{message:?}"
    );
    assert!(
        matches!(worker, paybus_grant_bonus::Attempted::Granted { .. }),
        "{worker:?}"
    );
    assert_eq!(bonuses.job(job_id).await.status, JobStatus::Done);
    bonuses.assert_granted_once(charge.member_id, 110).await;
}

/// And the other way round: once the message's grant holds the job (here while it waits on
/// the member's lock), a worker run skips the job instead of waiting, and the message grants
/// it. Once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_running_while_a_message_grants_the_job_skips_it() {
    let bonuses = std::sync::Arc::new(Bonuses::new().await);
    ten_percent_event(bonuses.pool()).await;
    let charge = bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    let job_id = charge.bonus_jobs[0].job_id;
    let blocker = bonuses.hold_member(charge.member_id).await;
    let message = tokio::spawn({
        let bonuses = bonuses.clone();
        async move { bonuses.deliver(job_id).await }
    });
    assert!(
        bonuses.lock_waits(1).await,
        "the message's grant waits on the member"
    );

    let report = bonuses.run_worker().await;
    blocker.rollback().await.unwrap();
    let message = message.await.unwrap();

    assert_eq!(
        report,
        WorkerReport::default(),
        "the worker skipped the job"
    );
    assert_eq!(message, Outcome::Done);
    assert_eq!(bonuses.job(job_id).await.status, JobStatus::Done);
    bonuses.assert_granted_once(charge.member_id, 110).await;
}

/// Messages the broker delivered together share one grant transaction; a job whose grant fails
/// rolls it back, and the others are granted one by one: every message gets the outcome it
/// would have had alone.
#[tokio::test]
async fn a_batch_grants_its_jobs_together_and_one_failing_grant_costs_the_others_nothing() {
    let bonuses = Bonuses::new().await;
    testing::active_event(bonuses.pool(), "spring 10% bonus", 10, 5).await;
    let twice = testing::member(bonuses.pool()).await;
    let mut jobs = Vec::new();
    for _ in 0..2 {
        let purchase = testing::purchase(bonuses.pool(), twice, PaymentGateway::Pg, 100).await;
        jobs.push(
            bonuses
                .complete(&purchase, NO_FIRST_CHARGE)
                .await
                .bonus_jobs[0]
                .job_id,
        );
    }
    let other = bonuses.completed_purchase(200, NO_FIRST_CHARGE).await;
    jobs.push(other.bonus_jobs[0].job_id);
    let broken = bonuses.completed_purchase(300, NO_FIRST_CHARGE).await;
    jobs.push(broken.bonus_jobs[0].job_id);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TRIGGER fault_refuse_one_member BEFORE INSERT ON charges FOR EACH ROW \
         IF NEW.status = 'EVENT' AND NEW.member_id = {} THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected fault: this member refused'; \
         END IF",
        broken.member_id
    )))
    .execute(bonuses.pool())
    .await
    .unwrap();
    // The first job's message twice in the same batch.
    let delivered = [jobs[0], jobs[1], jobs[2], jobs[3], jobs[0]];

    let outcomes = bonuses.deliver_batch(&delivered).await;

    assert_eq!(outcomes[..3], [Outcome::Done, Outcome::Done, Outcome::Done]);
    assert!(
        matches!(&outcomes[3], Outcome::Retry { after, error } if *after == minutes(5)
            && error.contains("injected fault")),
        "{:?}",
        outcomes[3]
    );
    assert!(
        matches!(&outcomes[4], Outcome::Skipped(why) if why.contains("twice in one batch")),
        "{:?}",
        outcomes[4]
    );
    for &job_id in &jobs[..3] {
        assert_eq!(bonuses.job(job_id).await.status, JobStatus::Done);
    }
    let failed = bonuses.job(jobs[3]).await;
    assert_eq!((failed.status, failed.retry_count), (JobStatus::Pending, 0));
    assert_eq!(
        (
            testing::cans(bonuses.pool(), twice, Container::Pg).await,
            testing::cans(bonuses.pool(), other.member_id, Container::Pg).await,
            testing::cans(bonuses.pool(), broken.member_id, Container::Pg).await,
        ),
        (220, 220, 300),
        "both bonuses of the member who bought twice, the other's, none for the refused"
    );
    assert_audit_clean(bonuses.pool()).await;
}

#[tokio::test]
async fn an_immediate_failure_is_due_five_minutes_later_and_is_not_a_retry() {
    let bonuses = Bonuses::new().await;
    ten_percent_event(bonuses.pool()).await;
    let charge = bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    let job_id = charge.bonus_jobs[0].job_id;
    bonuses.break_grants().await;
    let failed_at = bonuses.now();

    let outcome = bonuses.deliver(job_id).await;

    assert!(
        matches!(&outcome, Outcome::Retry { after, .. } if *after == minutes(5)),
        "{outcome:?}"
    );
    let job = bonuses.job(job_id).await;
    assert_eq!(job.status, JobStatus::Pending);
    assert_eq!(job.retry_count, 0);
    assert_eq!(
        job.next_retry_at,
        Some(failed_at + chrono::Duration::minutes(5))
    );
    assert_eq!(job.processing_started_at, None);
    assert!(
        job.last_error
            .as_deref()
            .is_some_and(|e| e.contains("injected fault: bonus charges refused")),
        "{:?}",
        job.last_error
    );
    assert_eq!(
        testing::cans(bonuses.pool(), charge.member_id, Container::Pg).await,
        100,
        "the payment's cans stay; the bonus waits"
    );
}

/// The acceptance scenario: the immediate attempt and 3 retries fail (the worker runs exactly
/// when each is due, on the manual clock), the job ends FAILED with retry_count 3 and a dead
/// letter, is not retried again automatically, and ops' retry grants it exactly once.
#[tokio::test]
async fn a_grant_failing_four_times_is_failed_with_a_dead_letter_and_an_ops_retry_grants_it_once() {
    let bonuses = Bonuses::new().await;
    ten_percent_event(bonuses.pool()).await;
    let charge = bonuses.completed_purchase(250, NO_FIRST_CHARGE).await;
    let job_id = charge.bonus_jobs[0].job_id;
    bonuses.break_grants().await;
    let start = bonuses.now();
    let at = |minutes| Some(start + chrono::Duration::minutes(minutes));
    let mut schedule = Vec::new();

    let immediate = bonuses.deliver(job_id).await;
    let job = bonuses.job(job_id).await;
    schedule.push((job.retry_count, job.next_retry_at));
    bonuses.advance(minutes(5) - Duration::from_secs(1));
    let too_early = bonuses.run_worker().await;
    let mut worker_runs = Vec::new();
    // Each retry runs the moment it is due: 5, then 10, then 15 minutes after the failure.
    for wait in [Duration::from_secs(1), minutes(10), minutes(15)] {
        bonuses.advance(wait);
        worker_runs.push(bonuses.run_worker().await);
        let job = bonuses.job(job_id).await;
        schedule.push((job.retry_count, job.next_retry_at));
    }
    let failed = bonuses.job(job_id).await;
    bonuses.advance(Duration::from_secs(86_400));
    let a_day_later = bonuses.run_worker().await;

    assert!(matches!(immediate, Outcome::Retry { .. }), "{immediate:?}");
    assert_eq!(
        too_early,
        WorkerReport::default(),
        "not due before 5 minutes"
    );
    assert_eq!(
        schedule,
        [(0, at(5)), (1, at(15)), (2, at(30)), (3, None)],
        "retry_count and next_retry_at after each failure"
    );
    let retried = WorkerReport {
        claimed: 1,
        retried: 1,
        ..WorkerReport::default()
    };
    let gave_up = WorkerReport {
        claimed: 1,
        failed: 1,
        ..WorkerReport::default()
    };
    assert_eq!(worker_runs, [retried, retried, gave_up]);
    assert_eq!((failed.status, failed.retry_count), (JobStatus::Failed, 3));
    assert!(failed.last_error.unwrap().contains("injected fault"));
    assert_eq!(
        a_day_later,
        WorkerReport::default(),
        "no automatic retry once FAILED"
    );
    let dead_letter: (String, String, u32, String, String) = sqlx::query_as(
        "SELECT function_name, reason, attempts, routing_key, \
                JSON_UNQUOTE(JSON_EXTRACT(headers, '$.\"x-paybus-reason\"')) FROM dead_letters",
    )
    .fetch_one(bonuses.pool())
    .await
    .unwrap();
    assert_eq!(
        dead_letter,
        (
            "grant-bonus".to_owned(),
            "failed".to_owned(),
            4,
            "charge.bonus_job.created".to_owned(),
            "failed".to_owned()
        )
    );
    let body: Vec<u8> = sqlx::query_scalar("SELECT body FROM dead_letters")
        .fetch_one(bonuses.pool())
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body["data"]["job_id"], job_id,
        "a replay re-sends this job's message"
    );

    // Ops fix the cause and retry it.
    bonuses.repair_grants().await;
    let mut uow = bonuses.services.outbox.begin().await.unwrap();
    assert!(
        job::retry_failed(&mut uow, job_id, uuid::Uuid::now_v7())
            .await
            .unwrap()
    );
    uow.commit().await.unwrap();
    let pending_again = bonuses.job(job_id).await;
    let granted = bonuses.deliver(job_id).await;
    let duplicate = bonuses.deliver(job_id).await;
    let later_run = bonuses.run_worker().await;

    assert_eq!(
        (pending_again.status, pending_again.retry_count),
        (JobStatus::Pending, 3)
    );
    assert_eq!(granted, Outcome::Done);
    assert!(matches!(duplicate, Outcome::Skipped(_)), "{duplicate:?}");
    assert_eq!(later_run, WorkerReport::default());
    assert_eq!(bonuses.job(job_id).await.status, JobStatus::Done);
    bonuses.assert_granted_once(charge.member_id, 275).await;
}

#[tokio::test]
async fn a_retry_granted_by_the_worker_pays_once() {
    let bonuses = Bonuses::new().await;
    ten_percent_event(bonuses.pool()).await;
    let charge = bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    let job_id = charge.bonus_jobs[0].job_id;
    bonuses.break_grants().await;
    bonuses.deliver(job_id).await;
    bonuses.repair_grants().await;
    bonuses.advance(minutes(5));

    let run = bonuses.run_worker().await;
    let again = bonuses.run_worker().await;
    let late_message = bonuses.deliver(job_id).await;

    assert_eq!(
        run,
        WorkerReport {
            claimed: 1,
            granted: 1,
            ..WorkerReport::default()
        }
    );
    assert_eq!(again, WorkerReport::default());
    assert!(
        matches!(late_message, Outcome::Skipped(_)),
        "{late_message:?}"
    );
    let job = bonuses.job(job_id).await;
    assert_eq!((job.status, job.retry_count), (JobStatus::Done, 0));
    bonuses.assert_granted_once(charge.member_id, 110).await;
}

#[tokio::test]
async fn the_worker_takes_at_most_thirty_jobs_a_run() {
    let bonuses = Bonuses::new().await;
    ten_percent_event(bonuses.pool()).await;
    for _ in 0..35 {
        bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    }

    let first = bonuses.run_worker().await;
    let second = bonuses.run_worker().await;

    assert_eq!((first.claimed, first.granted), (30, 30));
    assert_eq!((second.claimed, second.granted), (5, 5));
    assert_eq!(
        bonuses
            .count("SELECT COUNT(*) FROM charge_event_job WHERE status = 'DONE'")
            .await,
        35
    );
    assert_audit_clean(bonuses.pool()).await;
}

/// The seed's worker ended at once when no charge event was active. Here it still runs: a
/// FIRST_CHARGE job has no event, and an event's job outlives the event.
#[tokio::test]
async fn with_no_active_event_the_worker_still_retries_first_charge_and_ended_event_jobs() {
    let bonuses = Bonuses::new().await;
    let event_id = ten_percent_event(bonuses.pool()).await;
    let rules = BonusRules {
        first_charge_percent: 50,
    };
    let charge = bonuses.completed_purchase(100, rules).await;
    let kinds: Vec<JobType> = charge.bonus_jobs.iter().map(|j| j.job_type).collect();
    bonuses.break_grants().await;
    for job in &charge.bonus_jobs {
        bonuses.deliver(job.job_id).await;
    }
    bonuses.repair_grants().await;
    let mut conn = bonuses.pool().acquire().await.unwrap();
    paybus_bonuses::event::set_active(&mut conn, event_id, false)
        .await
        .unwrap();
    drop(conn);
    let nothing_due = bonuses.run_worker().await;
    bonuses.advance(minutes(5));

    let run = bonuses.run_worker().await;

    assert_eq!(kinds, [JobType::FirstCharge, JobType::ActiveChargeEvent]);
    assert_eq!(
        nothing_due,
        WorkerReport::default(),
        "nothing due: nothing changes"
    );
    assert_eq!((run.claimed, run.granted), (2, 2));
    assert_eq!(
        testing::cans(bonuses.pool(), charge.member_id, Container::Pg).await,
        100 + 50 + 10
    );
    assert_audit_clean(bonuses.pool()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_copies_of_the_message_at_once_grant_once() {
    let bonuses = std::sync::Arc::new(Bonuses::new().await);
    ten_percent_event(bonuses.pool()).await;
    let charge = bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    let job_id = charge.bonus_jobs[0].job_id;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(10));
    let mut copies = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let (bonuses, barrier) = (bonuses.clone(), barrier.clone());
        copies.spawn(async move {
            barrier.wait().await;
            bonuses.deliver(job_id).await
        });
    }

    let outcomes = copies.join_all().await;

    let done = outcomes.iter().filter(|o| **o == Outcome::Done).count();
    let skipped = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Skipped(_)))
        .count();
    assert_eq!((done, skipped), (1, 9), "{outcomes:?}");
    assert_eq!(
        testing::cans(bonuses.pool(), charge.member_id, Container::Pg).await,
        110
    );
    assert_audit_clean(bonuses.pool()).await;
}

#[tokio::test]
async fn a_message_for_no_job_is_a_dead_letter_and_a_redelivered_failed_job_fails_again() {
    let bonuses = Bonuses::new().await;
    ten_percent_event(bonuses.pool()).await;
    let charge = bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    let job_id = charge.bonus_jobs[0].job_id;
    sqlx::query("UPDATE charge_event_job SET status = 'FAILED', retry_count = 3, last_error = 'x' WHERE id = ?")
        .bind(job_id)
        .execute(bonuses.pool())
        .await
        .unwrap();

    let missing = bonuses.deliver(job_id + 1000).await;
    let late_duplicate = bonuses.deliver_as(job_id, 1).await;
    let redelivery = bonuses.deliver_as(job_id, 2).await;

    assert_eq!(
        missing,
        Outcome::Failed(format!("bonus job {} does not exist", job_id + 1000))
    );
    assert!(
        matches!(late_duplicate, Outcome::Skipped(_)),
        "{late_duplicate:?}"
    );
    assert!(matches!(redelivery, Outcome::Failed(_)), "{redelivery:?}");
    assert_eq!(GrantBonus::FUNCTION, "grant-bonus");
}
