//! W3 acceptance races (seed 003) with real concurrent transactions: 50 completions of one
//! charge at once complete, credit and owe it once; 200 completions of one member's different
//! charges at once lose no credit — and the seed's unlocked `+=` under the same schedule
//! does, so the hazard is real here and the member's row lock is what removes it.

use std::sync::Arc;

use paybus_bonuses::{
    BonusRules, Completion,
    charge::{Container, PaymentGateway},
    completion::{self, complete_in},
    job::JobType,
};
use paybus_bus::{Outbox, Services};
use paybus_testkit::{
    TestEnv,
    bonuses::{self, Purchase, assert_audit_clean},
    scalar,
};
use sqlx::MySqlPool;
use tokio::{sync::Barrier, task::JoinSet};

const FIRST_CHARGE_DOUBLED: BonusRules = BonusRules {
    first_charge_percent: 100,
};

/// Services whose pool holds a connection for every racer (a smaller pool would serialise
/// the race before the database sees it).
async fn services_for(env: &TestEnv, racers: u32) -> Services {
    let mut settings = env.settings.clone();
    settings.database.max_connections = racers + 8;
    Services::connect(settings).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_completions_of_one_charge_complete_credit_and_owe_it_once() {
    let env = TestEnv::new().await;
    let services = services_for(&env, 50).await;
    bonuses::active_event(&env.db, "launch week", 20, 1).await;
    let member = bonuses::member(&env.db).await;
    let purchase = bonuses::purchase(&env.db, member, PaymentGateway::AppleIap, 500).await;
    let barrier = Arc::new(Barrier::new(50));
    let mut racers = JoinSet::new();
    for _ in 0..50 {
        let (outbox, barrier, request) =
            (services.outbox.clone(), barrier.clone(), purchase.paid());
        racers.spawn(async move {
            barrier.wait().await;
            completion::complete(&outbox, FIRST_CHARGE_DOUBLED, &request)
                .await
                .unwrap()
        });
    }

    let results = racers.join_all().await;

    let completed: Vec<_> = results
        .iter()
        .filter(|r| matches!(r, Completion::Completed(_)))
        .collect();
    assert_eq!(
        completed.len(),
        1,
        "exactly one completion made the transition"
    );
    let original = completed[0].charge();
    assert!(
        results.iter().all(|r| r.charge() == original),
        "every repeat returns the original result"
    );
    let kinds: Vec<JobType> = original.bonus_jobs.iter().map(|j| j.job_type).collect();
    assert_eq!(kinds, [JobType::FirstCharge, JobType::ActiveChargeEvent]);
    assert_eq!(
        bonuses::cans(&env.db, member, Container::Ios).await,
        500,
        "credited once"
    );
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM charge_event_job").await,
        2
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'charge.bonus_job.created'"
        )
        .await,
        2,
        "one message per job"
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM charges WHERE payment_status = 'COMPLETE'"
        )
        .await,
        1
    );
    assert_audit_clean(&env.db).await;
}

const RACERS: usize = 200;

/// One member, `RACERS` purchases of 1..=RACERS cans through PG.
async fn purchases_of_one_member(pool: &MySqlPool) -> (u64, Vec<Purchase>) {
    let member = bonuses::member(pool).await;
    let mut purchases = Vec::with_capacity(RACERS);
    for cans in 1..=RACERS {
        purchases.push(
            bonuses::purchase(
                pool,
                member,
                PaymentGateway::Pg,
                i32::try_from(cans).unwrap(),
            )
            .await,
        );
    }
    (member, purchases)
}

/// How one completion is processed in the race below.
#[derive(Clone, Copy)]
enum Design {
    /// The seed's original: the member read without a lock, `member.charge()` adds in memory,
    /// the entity's new balance written back.
    UnlockedPlusEquals,
    /// paybus_bonuses::completion: the member's row lock, then the credit.
    MemberRowLock,
}

/// The seed's `member.charge(...)` on an entity read without a lock, flushed as its absolute
/// value (kept here only to show the hazard on this database).
async fn unlocked_plus_equals(
    conn: &mut sqlx::MySqlConnection,
    purchase: &Purchase,
    read_done: &Barrier,
) {
    let balance: i32 = sqlx::query_scalar("SELECT pg_can FROM members WHERE id = ?")
        .bind(purchase.member_id)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    read_done.wait().await;
    sqlx::query(
        "UPDATE charges SET payment_status = 'COMPLETE', completed_at = NOW(6) \
         WHERE id = ? AND payment_status = 'REQUEST'",
    )
    .bind(purchase.id)
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::query("UPDATE members SET pg_can = ? WHERE id = ?")
        .bind(balance + purchase.cans)
        .bind(purchase.member_id)
        .execute(&mut *conn)
        .await
        .unwrap();
}

/// Every completion at once, each on its own connection: every transaction first reads the
/// member (its snapshot) and waits until all have read, then completes its charge and commits.
async fn race(outbox: &Outbox, purchases: &[Purchase], design: Design, rules: BonusRules) {
    let read_done = Arc::new(Barrier::new(purchases.len()));
    let mut racers = JoinSet::new();
    for purchase in purchases {
        let (outbox, purchase, read_done) = (outbox.clone(), purchase.clone(), read_done.clone());
        racers.spawn(async move {
            let mut uow = outbox.begin_read_committed().await.unwrap();
            match design {
                Design::UnlockedPlusEquals => {
                    unlocked_plus_equals(&mut uow, &purchase, &read_done).await;
                }
                Design::MemberRowLock => {
                    let _snapshot: i32 =
                        sqlx::query_scalar("SELECT pg_can FROM members WHERE id = ?")
                            .bind(purchase.member_id)
                            .fetch_one(&mut *uow)
                            .await
                            .unwrap();
                    read_done.wait().await;
                    let done = complete_in(&mut uow, rules, &purchase.paid(), uuid::Uuid::now_v7())
                        .await
                        .unwrap();
                    assert!(matches!(done, Completion::Completed(_)));
                }
            }
            uow.commit().await.unwrap();
        });
    }
    while let Some(joined) = racers.join_next().await {
        joined.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_completions_of_one_member_lose_no_credit() {
    let env = TestEnv::new().await;
    let services = services_for(&env, u32::try_from(RACERS).unwrap()).await;
    bonuses::active_event(&env.db, "three times 10%", 10, 3).await;
    let (member, purchases) = purchases_of_one_member(&env.db).await;
    let sum: i32 = purchases.iter().map(|p| p.cans).sum();

    race(
        &services.outbox,
        &purchases,
        Design::MemberRowLock,
        FIRST_CHARGE_DOUBLED,
    )
    .await;

    assert_eq!(bonuses::cans(&env.db, member, Container::Pg).await, sum);
    // Decided under the member's lock, so exact under the race too: one first charge, and
    // the event's limit of 3 per member.
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM charge_event_job WHERE job_type = 'FIRST_CHARGE'"
        )
        .await,
        1
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM charge_event_job WHERE job_type = 'ACTIVE_CHARGE_EVENT'"
        )
        .await,
        3
    );
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_seed_s_unlocked_plus_equals_loses_credits_under_the_same_race() {
    let env = TestEnv::new().await;
    let services = services_for(&env, u32::try_from(RACERS).unwrap()).await;
    let (member, purchases) = purchases_of_one_member(&env.db).await;
    let sum: i32 = purchases.iter().map(|p| p.cans).sum();

    race(
        &services.outbox,
        &purchases,
        Design::UnlockedPlusEquals,
        BonusRules::default(),
    )
    .await;

    let balance = bonuses::cans(&env.db, member, Container::Pg).await;
    eprintln!(
        "seed design: balance {balance} of {sum} cans paid ({} lost)",
        sum - balance
    );
    assert!(
        balance < sum,
        "the control must show the hazard: {balance} of {sum}"
    );
    // Every transaction read 0 before any wrote: the last writer's charge is all that is left.
    assert!(balance <= i32::try_from(RACERS).unwrap(), "{balance}");
    // And the audit names it.
    let mut conn = env.db.acquire().await.unwrap();
    let found = paybus_ops::audit::run(&mut conn, paybus_bonuses::audit::CHECKS)
        .await
        .unwrap();
    assert_eq!(
        found.iter().map(|v| v.check).collect::<Vec<_>>(),
        ["member_balance_mismatch"]
    );
}
