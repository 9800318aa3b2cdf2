//! W3's completions committed together (`paybus_bonuses::Completions`), with real concurrent
//! transactions: concurrent completions of different members share transactions and each
//! answers as it would alone; one member's concurrent completions never share one (a
//! multi-table UPDATE would credit the member once for two); a batch holding a repeat, a
//! refusal, an unknown charge or a receipt used twice is rolled back and every request in it
//! gets the answer it gets alone, with nothing half-written; batches stalled on held member
//! rows do not hold up the completions queued behind them.

use std::{sync::Arc, time::Duration};

use paybus_bonuses::{
    BonusRules, CompleteError, Completion, Completions, PaymentCompletion,
    charge::{Container, PaymentGateway},
    completion,
    completions::{BATCHES_IN_FLIGHT, BatchCounts},
    job::JobType,
};
use paybus_bus::Services;
use paybus_testkit::{
    TestEnv,
    bonuses::{self, Purchase, assert_audit_clean},
    scalar,
};
use tokio::{sync::Barrier, task::JoinSet};

const FIRST_CHARGE_DOUBLED: BonusRules = BonusRules {
    first_charge_percent: 100,
};

/// Services whose pool holds a connection for every racer.
async fn services_for(env: &TestEnv, racers: u32) -> Services {
    let mut settings = env.settings.clone();
    settings.database.max_connections = racers + 8;
    Services::connect(settings).await.unwrap()
}

/// Every request at once through `completions`; the answers in the requests' order.
async fn all_at_once(
    completions: &Completions,
    requests: Vec<PaymentCompletion>,
) -> Vec<Result<Completion, CompleteError>> {
    let barrier = Arc::new(Barrier::new(requests.len()));
    let mut racers = JoinSet::new();
    for (at, request) in requests.into_iter().enumerate() {
        let (completions, barrier) = (completions.clone(), barrier.clone());
        racers.spawn(async move {
            barrier.wait().await;
            (at, completions.complete(request).await)
        });
    }
    let mut answers = racers.join_all().await;
    answers.sort_by_key(|(at, _)| *at);
    answers.into_iter().map(|(_, answer)| answer).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_completions_of_different_members_commit_together_and_each_gets_its_own_answer()
{
    const MEMBERS: usize = 120;
    let env = TestEnv::new().await;
    let services = services_for(&env, 32).await;
    bonuses::active_event(&env.db, "launch week", 10, 1).await;
    let mut purchases = Vec::with_capacity(MEMBERS);
    for n in 0..MEMBERS {
        let member = bonuses::member(&env.db).await;
        let gateway = [PaymentGateway::Pg, PaymentGateway::GoogleIap][n % 2];
        let cans = 10 + i32::try_from(n).unwrap();
        purchases.push(bonuses::purchase(&env.db, member, gateway, cans).await);
    }
    let completions = Completions::new(services.outbox.clone(), FIRST_CHARGE_DOUBLED);

    let answers = all_at_once(&completions, purchases.iter().map(Purchase::paid).collect()).await;

    let counts = completions.counts();
    assert!(
        counts.batches > 0 && counts.completed_together > counts.batches,
        "completions arriving together must share transactions: {counts:?}"
    );
    for (purchase, answer) in purchases.iter().zip(&answers) {
        let Ok(Completion::Completed(charge)) = answer else {
            panic!("charge {}: {answer:?}", purchase.id);
        };
        assert_eq!(
            (charge.charge_id, charge.member_id, charge.cans),
            (purchase.id, purchase.member_id, purchase.cans)
        );
        let kinds: Vec<JobType> = charge.bonus_jobs.iter().map(|j| j.job_type).collect();
        assert_eq!(kinds, [JobType::FirstCharge, JobType::ActiveChargeEvent]);
        let container = purchase.gateway.default_container();
        assert_eq!(
            bonuses::cans(&env.db, purchase.member_id, container).await,
            purchase.cans,
            "member {} credited once",
            purchase.member_id
        );
    }
    let jobs = i64::try_from(2 * MEMBERS).unwrap();
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM charge_event_job").await,
        jobs
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'charge.bonus_job.created'"
        )
        .await,
        jobs,
        "one message per job"
    );
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_member_s_concurrent_completions_never_share_a_transaction_and_lose_no_credit() {
    const PURCHASES: usize = 120;
    let env = TestEnv::new().await;
    let services = services_for(&env, 32).await;
    bonuses::active_event(&env.db, "three times 10%", 10, 3).await;
    let member = bonuses::member(&env.db).await;
    let mut purchases = Vec::with_capacity(PURCHASES);
    for cans in 1..=PURCHASES {
        let cans = i32::try_from(cans).unwrap();
        purchases.push(bonuses::purchase(&env.db, member, PaymentGateway::Pg, cans).await);
    }
    let sum: i32 = purchases.iter().map(|p| p.cans).sum();
    let completions = Completions::new(services.outbox.clone(), FIRST_CHARGE_DOUBLED);

    let answers = all_at_once(&completions, purchases.iter().map(Purchase::paid).collect()).await;

    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Ok(Completion::Completed(_)))),
        "{answers:?}"
    );
    assert_eq!(
        bonuses::cans(&env.db, member, Container::Pg).await,
        sum,
        "no credit lost"
    );
    let counts = completions.counts();
    assert_eq!(counts.batches, 0, "{counts:?}");
    assert!(
        counts.completed_apart > 0,
        "the race must have put one member's charges in one batch: {counts:?}"
    );
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
        3,
        "the event's limit of 3 per member"
    );
    assert_audit_clean(&env.db).await;
}

/// Holds the member rows of `members` locked (`FOR UPDATE`) until the returned sender fires.
async fn hold_members(
    pool: &sqlx::MySqlPool,
    members: Vec<u64>,
) -> tokio::sync::oneshot::Sender<()> {
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (locked, is_locked) = tokio::sync::oneshot::channel();
    let pool = pool.clone();
    tokio::spawn(async move {
        let mut tx = pool.begin().await.unwrap();
        for member in members {
            sqlx::query("SELECT id FROM members WHERE id = ? FOR UPDATE")
                .bind(member)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        locked.send(()).unwrap();
        let _ = released.await;
        tx.rollback().await.unwrap();
    });
    is_locked.await.unwrap();
    release
}

/// Every runner of a `Completions` busy on a member row the test holds.
struct Occupied {
    blockers: Vec<Purchase>,
    blocked: JoinSet<Result<Completion, CompleteError>>,
    release: tokio::sync::oneshot::Sender<()>,
}

impl Occupied {
    /// Lets the held members go; every blocked completion then completes.
    async fn release(self) {
        self.release.send(()).unwrap();
        let blocked = self.blocked.join_all().await;
        assert!(
            blocked
                .iter()
                .all(|a| matches!(a, Ok(Completion::Completed(_)))),
            "{blocked:?}"
        );
    }
}

/// Every runner of `completions` busy: one completion each (of 70 cans, a member of its own)
/// waiting on its member's row, which the test holds until [`Occupied::release`]. What comes
/// next queues behind them.
async fn occupy_every_runner(env: &TestEnv, completions: &Completions) -> Occupied {
    let mut blockers = Vec::new();
    for _ in 0..BATCHES_IN_FLIGHT {
        let member = bonuses::member(&env.db).await;
        blockers.push(bonuses::purchase(&env.db, member, PaymentGateway::Pg, 70).await);
    }
    let release = hold_members(&env.db, blockers.iter().map(|p| p.member_id).collect()).await;
    let mut blocked = JoinSet::new();
    for purchase in &blockers {
        let (completions, request) = (completions.clone(), purchase.paid());
        blocked.spawn(async move { completions.complete(request).await });
        // Each runner takes the one completion queued when it starts.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Occupied {
        blockers,
        blocked,
        release,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_with_a_repeat_and_refusals_is_rolled_back_and_each_request_answers_as_alone() {
    let env = TestEnv::new().await;
    let services = services_for(&env, 32).await;
    bonuses::active_event(&env.db, "launch week", 10, 5).await;
    let rules = BonusRules::default();
    let completions = Completions::new(services.outbox.clone(), rules);

    // What comes next queues behind the occupied runners and is taken in batches.
    let occupied = occupy_every_runner(&env, &completions).await;

    let mut fresh = Vec::new();
    for _ in 0..12 {
        let member = bonuses::member(&env.db).await;
        fresh.push(bonuses::purchase(&env.db, member, PaymentGateway::Pg, 40).await);
    }
    let member = bonuses::member(&env.db).await;
    let completed_before = bonuses::purchase(&env.db, member, PaymentGateway::Pg, 30).await;
    let before = completion::complete(&services.outbox, rules, &completed_before.paid())
        .await
        .unwrap();
    let other = bonuses::member(&env.db).await;
    let wrong_amount = bonuses::purchase(&env.db, other, PaymentGateway::Pg, 20).await;
    let another = bonuses::member(&env.db).await;
    let receipt_reused = bonuses::purchase(&env.db, another, PaymentGateway::Pg, 20).await;

    let mut requests: Vec<PaymentCompletion> = fresh.iter().map(Purchase::paid).collect();
    requests.insert(3, completed_before.paid());
    requests.insert(6, {
        let mut paid = wrong_amount.paid();
        paid.amount = paybus_money::Amount::whole(1);
        paid
    });
    requests.insert(
        9,
        PaymentCompletion {
            charge_id: 999_999_999,
            ..fresh[0].paid()
        },
    );
    requests.insert(12, {
        let mut paid = receipt_reused.paid();
        paid.gateway_tx_id = completed_before.paid().gateway_tx_id;
        paid
    });
    let mut queued = JoinSet::new();
    for (at, request) in requests.into_iter().enumerate() {
        let completions = completions.clone();
        queued.spawn(async move { (at, completions.complete(request).await) });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    occupied.release().await;

    let mut answers = queued.join_all().await;
    answers.sort_by_key(|(at, _)| *at);
    let answers: Vec<_> = answers.into_iter().map(|(_, answer)| answer).collect();
    let BatchCounts {
        batches,
        completed_apart,
        ..
    } = completions.counts();
    assert!(
        completed_apart >= 2,
        "the odd requests must have been in batches that fell apart: {:?}",
        completions.counts()
    );
    assert!(batches <= 1, "{:?}", completions.counts());

    let mut fresh_answers = Vec::new();
    for (at, answer) in answers.iter().enumerate() {
        match at {
            3 => assert_eq!(
                answer.as_ref().unwrap(),
                &Completion::AlreadyCompleted(before.charge().clone()),
                "a repeat answers the original result"
            ),
            6 => assert!(
                matches!(answer, Err(CompleteError::WrongAmount { charge_id, .. }) if *charge_id == wrong_amount.id),
                "{answer:?}"
            ),
            9 => assert!(
                matches!(answer, Err(CompleteError::UnknownCharge(999_999_999))),
                "{answer:?}"
            ),
            12 => assert!(
                matches!(answer, Err(CompleteError::PaymentUsed { other_charge_id, .. }) if *other_charge_id == completed_before.id),
                "{answer:?}"
            ),
            _ => fresh_answers.push(answer),
        }
    }
    for (purchase, answer) in fresh.iter().zip(fresh_answers) {
        let Ok(Completion::Completed(charge)) = answer else {
            panic!("charge {}: {answer:?}", purchase.id);
        };
        assert_eq!(charge.charge_id, purchase.id);
        assert_eq!(charge.bonus_jobs.len(), 1);
        assert_eq!(
            bonuses::cans(&env.db, purchase.member_id, Container::Pg).await,
            purchase.cans
        );
    }
    for refused in [&wrong_amount, &receipt_reused] {
        assert_eq!(
            bonuses::cans(&env.db, refused.member_id, Container::Pg).await,
            0,
            "a refusal writes nothing"
        );
    }
    assert_eq!(
        bonuses::cans(&env.db, completed_before.member_id, Container::Pg).await,
        completed_before.cans,
        "the repeat credits nothing more"
    );
    // The blockers, the one completed before and the twelve fresh: one job each.
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM charge_event_job").await,
        i64::try_from(BATCHES_IN_FLIGHT + 1 + fresh.len()).unwrap()
    );
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completions_queued_behind_batches_stalled_on_held_members_go_ahead_of_them() {
    let env = TestEnv::new().await;
    let services = services_for(&env, 32).await;
    let completions = Completions::new(services.outbox.clone(), BonusRules::default());
    // Every runner waits on a member row another transaction holds (up to
    // innodb_lock_wait_timeout, 50 s by default).
    let mut occupied = occupy_every_runner(&env, &completions).await;
    let member = bonuses::member(&env.db).await;
    let behind = bonuses::purchase(&env.db, member, PaymentGateway::Pg, 30).await;

    let answer =
        tokio::time::timeout(Duration::from_secs(5), completions.complete(behind.paid())).await;

    assert!(
        matches!(answer, Ok(Ok(Completion::Completed(_)))),
        "a completion of another member must not wait for the stalled batches: {answer:?}"
    );
    assert!(
        occupied.blocked.try_join_next().is_none(),
        "the stalled batches are still waiting on the held members"
    );
    let blockers = occupied.blockers.clone();
    occupied.release().await;
    for purchase in blockers.iter().chain([&behind]) {
        assert_eq!(
            bonuses::cans(&env.db, purchase.member_id, Container::Pg).await,
            purchase.cans
        );
    }
    assert_audit_clean(&env.db).await;
}
