//! Payments completing while grant-bonus grants the jobs they create, many at once
//! on different members, as at a busy charge event: every completion, claim and grant commits,
//! none deadlocks (a deadlock would be retried on the bus, but every one is a grant delayed).
//!
//! Why: the first `paybus-lab bench grant-bonus` deadlocked at once (1213). MariaDB served the
//! claim's `WHERE id = ? AND status = 'PENDING' AND …` from the (status, next_retry_at) index's
//! range, whose locks crossed those of a grant settling another job by its primary key; the
//! retry kit now forces the primary key on every by-id UPDATE. This debug-build race did not
//! reproduce that interleaving with the hint removed (the release bench did), so it guards the
//! pipeline as a whole, and `paybus-lab bench grant-bonus` stays the reproducer.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::sync::Arc;

use paybus_bonuses::{BonusRules, Completion, charge::PaymentGateway, completion};
use paybus_bus::Services;
use paybus_grant_bonus::{Attempted, MessageResult, attempt};
use paybus_retry::Clock;
use paybus_testkit::{
    TestEnv,
    bonuses::{self, Purchase, assert_audit_clean},
    scalar,
};
use tokio::{sync::Barrier, task::JoinSet};

/// Enough rows that the optimizer weighs the status index against the primary key.
const JOBS: usize = 2_000;
const RACERS: usize = 64;

const EVENT_ONLY: BonusRules = BonusRules {
    first_charge_percent: 0,
};

/// `JOBS` members, each with one purchase waiting for its payment.
async fn purchases(pool: &sqlx::MySqlPool) -> Vec<Purchase> {
    let mut purchases = Vec::with_capacity(JOBS);
    for _ in 0..JOBS {
        let member = bonuses::member(pool).await;
        purchases.push(bonuses::purchase(pool, member, PaymentGateway::Pg, 10).await);
    }
    purchases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completions_and_grants_of_different_members_at_once_all_commit_without_a_deadlock() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.database.max_connections = u32::try_from(RACERS).unwrap() + 8;
    let services = Services::connect(settings).await.unwrap();
    bonuses::active_event(&services.pool, "launch week", 10, 1).await;
    let purchases = Arc::new(purchases(&services.pool).await);

    let barrier = Arc::new(Barrier::new(RACERS));
    let policy = paybus_bonuses::job::RETRY_POLICY;
    let mut racers = JoinSet::new();
    for racer in 0..RACERS {
        let (outbox, purchases, barrier, policy) = (
            services.outbox.clone(),
            purchases.clone(),
            barrier.clone(),
            policy.clone(),
        );
        racers.spawn(async move {
            let pool = outbox.pool().clone();
            barrier.wait().await;
            let mut errors = Vec::new();
            for purchase in purchases.iter().skip(racer).step_by(RACERS) {
                let job_id = match completion::complete(&outbox, EVENT_ONLY, &purchase.paid()).await
                {
                    Ok(Completion::Completed(charge)) if charge.bonus_jobs.len() == 1 => {
                        charge.bonus_jobs[0].job_id
                    }
                    Ok(other) => panic!("a fresh purchase did not owe one job: {other:?}"),
                    Err(error) => {
                        errors.push(format!("complete {}: {error}", purchase.id));
                        continue;
                    }
                };
                let mut granted =
                    attempt::attempt_messages(&pool, &[job_id], &policy, &Clock::Database).await;
                match granted.pop() {
                    Some(Ok(MessageResult::Attempted(Attempted::Granted { .. }))) => {}
                    Some(Ok(other)) => errors.push(format!("grant {job_id}: {other:?}")),
                    Some(Err(error)) => errors.push(format!("grant {job_id}: {error}")),
                    None => errors.push(format!("grant {job_id}: no answer")),
                }
            }
            errors
        });
    }
    let errors = racers.join_all().await.concat();

    assert!(
        errors.is_empty(),
        "{} of {JOBS} attempts failed, first: {:?}",
        errors.len(),
        errors.first()
    );
    assert_eq!(
        scalar(
            &services.pool,
            "SELECT COUNT(*) FROM charge_event_job WHERE status = 'DONE'"
        )
        .await,
        i64::try_from(JOBS).unwrap()
    );
    assert_eq!(
        scalar(
            &services.pool,
            "SELECT COUNT(*) FROM charges WHERE status = 'EVENT'"
        )
        .await,
        i64::try_from(JOBS).unwrap(),
        "one bonus charge per job"
    );
    assert_audit_clean(&services.pool).await;
}
