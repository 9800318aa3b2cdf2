//! W3's payment completion and bonus jobs against the real database (seed 003): a repeated
//! completion returns the original result and creates nothing, one job per idempotency key,
//! `getPaymentCount` counts only the event's bonuses inside its window, the per-member limit
//! counts bonuses still owed, every refusal writes nothing, and what a completion reads grows
//! neither with the member's history nor with the event's other jobs.

use std::sync::Arc;

use chrono::Duration;
use paybus_bonuses::{
    BonusRules, CompleteError, Completion,
    charge::{Container, PaymentGateway},
    completion, event,
    job::{self, JobType, NewJob},
};
use paybus_bus::Services;
use paybus_testkit::{
    HandlerReads, TestEnv,
    bonuses::{self, assert_audit_clean},
    dec, scalar,
};
use tokio::{sync::Barrier, task::JoinSet};

async fn setup() -> (TestEnv, Services) {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    (env, services)
}

async fn jobs_and_messages(env: &TestEnv) -> (i64, i64) {
    (
        scalar(&env.db, "SELECT COUNT(*) FROM charge_event_job").await,
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'charge.bonus_job.created'",
        )
        .await,
    )
}

#[tokio::test]
async fn a_repeated_completion_returns_the_original_result_and_creates_nothing() {
    let (env, services) = setup().await;
    bonuses::active_event(&env.db, "weekend 30%", 30, 5).await;
    let member = bonuses::member(&env.db).await;
    let purchase = bonuses::purchase(&env.db, member, PaymentGateway::GoogleIap, 1000).await;
    let rules = BonusRules {
        first_charge_percent: 10,
    };

    let first = completion::complete(&services.outbox, rules, &purchase.paid())
        .await
        .unwrap();
    let written = jobs_and_messages(&env).await;
    let repeat = completion::complete(&services.outbox, rules, &purchase.paid())
        .await
        .unwrap();

    let Completion::Completed(original) = first else {
        panic!("the first completion completes: {first:?}")
    };
    assert_eq!(repeat, Completion::AlreadyCompleted(original.clone()));
    assert_eq!(original.container, Container::Aos);
    assert_eq!(
        original
            .bonus_jobs
            .iter()
            .map(|j| (j.job_type, j.additional_can))
            .collect::<Vec<_>>(),
        [
            (JobType::FirstCharge, 100),
            (JobType::ActiveChargeEvent, 300)
        ]
    );
    assert_eq!(written, (2, 2));
    assert_eq!(jobs_and_messages(&env).await, written, "nothing more");
    assert_eq!(bonuses::cans(&env.db, member, Container::Aos).await, 1000);
    let job = {
        let mut conn = env.db.acquire().await.unwrap();
        job::find(&mut conn, original.bonus_jobs[1].job_id)
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(
        (
            job.method_snapshot.as_str(),
            job.payment_gateway,
            job.container,
            job.idempotency_key.as_str()
        ),
        (
            "weekend 30%",
            PaymentGateway::GoogleIap,
            Container::Aos,
            format!(
                "charge-event:{}:ACTIVE_CHARGE_EVENT:{}",
                purchase.id,
                job.charge_event_id.unwrap()
            )
            .as_str()
        ),
        "the snapshot a retry grants from"
    );
    assert_audit_clean(&env.db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bonus_job_is_created_once_per_idempotency_key() {
    let (env, services) = setup().await;
    let member = bonuses::member(&env.db).await;
    let purchase = bonuses::purchase(&env.db, member, PaymentGateway::Pg, 100).await;
    let new = NewJob {
        source_charge_id: purchase.id,
        member_id: member,
        charge_event_id: None,
        job_type: JobType::FirstCharge,
        additional_can: 10,
        payment_gateway: PaymentGateway::Pg,
        container: Container::Pg,
        method_snapshot: "first charge bonus".into(),
    };
    let barrier = Arc::new(Barrier::new(10));
    let mut racers = JoinSet::new();
    for _ in 0..10 {
        let (outbox, barrier, new) = (services.outbox.clone(), barrier.clone(), new.clone());
        racers.spawn(async move {
            let mut uow = outbox.begin().await.unwrap();
            barrier.wait().await;
            let created = job::enqueue(&mut uow, &new, uuid::Uuid::now_v7())
                .await
                .unwrap();
            uow.commit().await.unwrap();
            created
        });
    }
    let created: Vec<_> = racers.join_all().await.into_iter().flatten().collect();
    let mut uow = services.outbox.begin().await.unwrap();
    let later = job::enqueue(&mut uow, &new, uuid::Uuid::now_v7())
        .await
        .unwrap();
    uow.commit().await.unwrap();

    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(later, None);
    assert_eq!(jobs_and_messages(&env).await, (1, 1));
}

#[tokio::test]
async fn get_payment_count_counts_only_the_event_s_bonuses_inside_its_window() {
    let (env, _services) = setup().await;
    let member = bonuses::member(&env.db).await;
    let other_member = bonuses::member(&env.db).await;
    // The event applies now: its window began ten days ago and ends tomorrow.
    let start = bonuses::db_now(&env.db).await - Duration::days(10);
    let end = start + Duration::days(11);
    bonuses::event_in(&env.db, "spring", 10, start, end, 5).await;
    // (member, status, method, created_at): only the first is the event's bonus in the window.
    let rows = [
        (member, "EVENT", "spring", start + Duration::days(1)),
        (member, "EVENT", "spring", start),
        (member, "EVENT", "spring", end),
        (member, "EVENT", "spring", start - Duration::days(30)),
        (member, "EVENT", "spring", end + Duration::seconds(1)),
        (member, "CHARGE", "spring", start + Duration::days(1)),
        (member, "EVENT", "autumn", start + Duration::days(1)),
        (other_member, "EVENT", "spring", start + Duration::days(1)),
    ];
    for (member_id, status, method, created_at) in rows {
        sqlx::query(
            "INSERT INTO charges (member_id, status, cans, price, payment_gateway, container, \
                                  method, payment_status, completed_at, created_at) \
             VALUES (?, ?, 10, IF(? = 'CHARGE', 1000, NULL), 'PG', 'pg', ?, 'COMPLETE', ?, ?)",
        )
        .bind(member_id)
        .bind(status)
        .bind(status)
        .bind(method)
        .bind(created_at)
        .bind(created_at)
        .execute(&env.db)
        .await
        .unwrap();
    }

    let mut conn = env.db.acquire().await.unwrap();
    let standing = event::applying_now(&mut conn, member)
        .await
        .unwrap()
        .expect("the event applies now");

    assert_eq!(standing.event.title, "spring");
    assert_eq!(
        (standing.granted, standing.owed),
        (3, 0),
        "inside the window (both ends included), EVENT, this method"
    );
}

#[tokio::test]
async fn the_event_limit_counts_bonuses_granted_and_still_owed() {
    let (env, services) = setup().await;
    bonuses::active_event(&env.db, "twice per member", 10, 2).await;
    let member = bonuses::member(&env.db).await;
    let mut owed = Vec::new();
    for _ in 0..3 {
        let purchase = bonuses::purchase(&env.db, member, PaymentGateway::Hecto, 100).await;
        let done = completion::complete(&services.outbox, BonusRules::default(), &purchase.paid())
            .await
            .unwrap();
        owed.push(done.charge().bonus_jobs.len());
    }
    // A bonus granted before paybus (an EVENT charge without a job) counts for another member.
    let veteran = bonuses::member(&env.db).await;
    sqlx::query(
        "INSERT INTO charges (member_id, status, cans, payment_gateway, container, method, \
                              payment_status, completed_at) \
         VALUES (?, 'EVENT', 10, 'PG', 'pg', 'twice per member', 'COMPLETE', NOW(6))",
    )
    .bind(veteran)
    .execute(&env.db)
    .await
    .unwrap();
    let mut veteran_owed = Vec::new();
    for _ in 0..2 {
        let purchase = bonuses::purchase(&env.db, veteran, PaymentGateway::Pg, 100).await;
        let done = completion::complete(&services.outbox, BonusRules::default(), &purchase.paid())
            .await
            .unwrap();
        veteran_owed.push(done.charge().bonus_jobs.len());
    }

    assert_eq!(
        owed,
        [1, 1, 0],
        "no bonus was granted yet: the owed ones count"
    );
    assert_eq!(veteran_owed, [1, 0]);
}

#[tokio::test]
async fn the_first_charge_bonus_is_owed_once_and_only_when_configured() {
    let (env, services) = setup().await;
    let rules = BonusRules {
        first_charge_percent: 100,
    };
    let member = bonuses::member(&env.db).await;
    let mut owed = Vec::new();
    for _ in 0..2 {
        let purchase = bonuses::purchase(&env.db, member, PaymentGateway::Pg, 100).await;
        let done = completion::complete(&services.outbox, rules, &purchase.paid())
            .await
            .unwrap();
        owed.push(done.charge().bonus_jobs.len());
    }
    let unconfigured = bonuses::member(&env.db).await;
    let purchase = bonuses::purchase(&env.db, unconfigured, PaymentGateway::Pg, 100).await;
    let without = completion::complete(&services.outbox, BonusRules::default(), &purchase.paid())
        .await
        .unwrap();

    assert_eq!(owed, [1, 0]);
    assert!(without.charge().bonus_jobs.is_empty());
}

#[tokio::test]
async fn an_inactive_or_ended_event_owes_nothing() {
    let (env, services) = setup().await;
    let now = bonuses::db_now(&env.db).await;
    bonuses::event_in(
        &env.db,
        "ended",
        50,
        now - Duration::days(9),
        now - Duration::days(2),
        1,
    )
    .await;
    let switched_off = bonuses::active_event(&env.db, "switched off", 50, 1).await;
    let mut conn = env.db.acquire().await.unwrap();
    paybus_bonuses::event::set_active(&mut conn, switched_off, false)
        .await
        .unwrap();
    let member = bonuses::member(&env.db).await;
    let purchase = bonuses::purchase(&env.db, member, PaymentGateway::Pg, 100).await;

    let done = completion::complete(&services.outbox, BonusRules::default(), &purchase.paid())
        .await
        .unwrap();

    assert!(done.charge().bonus_jobs.is_empty());
    assert_eq!(bonuses::cans(&env.db, member, Container::Pg).await, 100);
}

#[tokio::test]
async fn a_refused_completion_writes_nothing() {
    let (env, services) = setup().await;
    bonuses::active_event(&env.db, "any", 10, 9).await;
    let member = bonuses::member(&env.db).await;
    let purchase = bonuses::purchase(&env.db, member, PaymentGateway::Payverse, 100).await;
    let another = bonuses::purchase(&env.db, member, PaymentGateway::Payverse, 100).await;
    let complete = |request| {
        let outbox = services.outbox.clone();
        async move { completion::complete(&outbox, BonusRules::default(), &request).await }
    };

    let unknown = complete(paybus_bonuses::PaymentCompletion {
        charge_id: 999_999,
        ..purchase.paid()
    })
    .await;
    let wrong_gateway = complete(paybus_bonuses::PaymentCompletion {
        gateway: PaymentGateway::Pg,
        ..purchase.paid()
    })
    .await;
    let wrong_amount = complete(paybus_bonuses::PaymentCompletion {
        amount: dec("9999.99"),
        ..purchase.paid()
    })
    .await;
    let untouched = (
        jobs_and_messages(&env).await,
        bonuses::cans(&env.db, member, Container::Pg).await,
    );
    complete(purchase.paid()).await.unwrap();
    let replayed_receipt = complete(paybus_bonuses::PaymentCompletion {
        charge_id: another.id,
        ..purchase.paid()
    })
    .await;
    let another_receipt = complete(paybus_bonuses::PaymentCompletion {
        gateway_tx_id: "a-second-receipt".into(),
        ..purchase.paid()
    })
    .await;
    // A bonus (EVENT) charge, as grant-bonus writes them.
    let bonus_charge = sqlx::query(
        "INSERT INTO charges (member_id, status, cans, payment_gateway, container, method, \
                              payment_status, completed_at) \
         VALUES (?, 'EVENT', 10, 'PAYVERSE', 'pg', 'any', 'COMPLETE', NOW(6))",
    )
    .bind(member)
    .execute(&env.db)
    .await
    .unwrap()
    .last_insert_id();
    let event_charge = complete(paybus_bonuses::PaymentCompletion {
        charge_id: bonus_charge,
        ..purchase.paid()
    })
    .await;

    assert!(matches!(
        unknown,
        Err(CompleteError::UnknownCharge(999_999))
    ));
    assert!(
        matches!(
            wrong_gateway,
            Err(CompleteError::WrongGateway {
                expected: PaymentGateway::Payverse,
                ..
            })
        ),
        "{wrong_gateway:?}"
    );
    assert!(matches!(
        wrong_amount,
        Err(CompleteError::WrongAmount { .. })
    ));
    assert_eq!(untouched, ((0, 0), 0), "refusals wrote nothing");
    assert!(
        matches!(&replayed_receipt, Err(CompleteError::PaymentUsed { other_charge_id, .. }) if *other_charge_id == purchase.id),
        "{replayed_receipt:?}"
    );
    assert!(
        matches!(
            another_receipt,
            Err(CompleteError::CompletedByAnotherPayment { .. })
        ),
        "{another_receipt:?}"
    );
    assert!(
        matches!(event_charge, Err(CompleteError::NotAPayment(_))),
        "{event_charge:?}"
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM charges WHERE status = 'CHARGE' AND payment_status = 'COMPLETE'"
        )
        .await,
        1
    );
    assert_eq!(bonuses::cans(&env.db, member, Container::Pg).await, 100);
}

#[tokio::test]
async fn the_audit_names_every_broken_bonus_invariant_it_finds() {
    let (env, services) = setup().await;
    bonuses::active_event(&env.db, "audited", 10, 9).await;
    let (mut jobs, mut members, mut charges) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..4 {
        let member = bonuses::member(&env.db).await;
        let purchase = bonuses::purchase(&env.db, member, PaymentGateway::Pg, 100).await;
        let done = completion::complete(&services.outbox, BonusRules::default(), &purchase.paid())
            .await
            .unwrap();
        jobs.push(done.charge().bonus_jobs[0].job_id);
        members.push(member);
        charges.push(purchase.id);
    }
    let event_charge = |member: u64| {
        let pool = env.db.clone();
        async move {
            sqlx::query(
                "INSERT INTO charges (member_id, status, cans, payment_gateway, container, \
                                      method, payment_status, completed_at) \
                 VALUES (?, 'EVENT', 10, 'PG', 'pg', 'audited', 'COMPLETE', NOW(6))",
            )
            .bind(member)
            .execute(&pool)
            .await
            .unwrap()
            .last_insert_id()
        }
    };
    // Planted: job 1 DONE without its EVENT charge; job 2 PENDING naming an EVENT charge; an
    // EVENT charge no job owns; purchase 4 back in REQUEST under its job; member 3 credited
    // twice. Balances follow the planted charges, except member 3's.
    let named = event_charge(members[1]).await;
    let unowned = event_charge(members[1]).await;
    sqlx::query("ALTER TABLE charge_event_job DROP CONSTRAINT ck_charge_event_job_done")
        .execute(&env.db)
        .await
        .unwrap();
    for plant in [
        sqlx::query(
            "UPDATE charge_event_job SET status = 'DONE', processed_at = NOW(6) WHERE id = ?",
        )
        .bind(jobs[0]),
        sqlx::query("UPDATE charge_event_job SET result_charge_id = ? WHERE id = ?")
            .bind(named)
            .bind(jobs[1]),
        sqlx::query("UPDATE members SET pg_can = pg_can + 20 WHERE id = ?").bind(members[1]),
        sqlx::query("UPDATE members SET pg_can = pg_can + 100 WHERE id = ?").bind(members[2]),
        sqlx::query(
            "UPDATE charges SET payment_status = 'REQUEST', completed_at = NULL WHERE id = ?",
        )
        .bind(charges[3]),
        sqlx::query("UPDATE members SET pg_can = pg_can - 100 WHERE id = ?").bind(members[3]),
    ] {
        plant.execute(&env.db).await.unwrap();
    }

    let mut conn = env.db.acquire().await.unwrap();
    let found = paybus_ops::audit::run(&mut conn, paybus_bonuses::audit::CHECKS)
        .await
        .unwrap();

    let lines: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            format!(
                "member_balance_mismatch: member {} holds 200 pg cans, but its COMPLETE \
                 charges there add up to 100",
                members[2]
            ),
            format!(
                "bonus_charge_missing: bonus job {} is DONE without its EVENT charge",
                jobs[0]
            ),
            format!(
                "unexpected_bonus_result: bonus job {} is PENDING but names result charge \
                 {named}",
                jobs[1]
            ),
            format!(
                "event_charge_jobs: EVENT charge {unowned} is the result of 0 bonus jobs, not \
                 exactly one"
            ),
            format!(
                "job_without_completed_purchase: bonus job {} is owed for charge {}, which is \
                 not a COMPLETE purchase of its member",
                jobs[3], charges[3]
            ),
        ],
        "{found:#?}"
    );
}

/// Inserts `count` jobs of `member` in `event` (status `status`), each its own key.
async fn insert_jobs(
    env: &TestEnv,
    member: u64,
    event: u64,
    source: u64,
    status: &str,
    count: u32,
) {
    sqlx::query(
        "INSERT INTO charge_event_job (source_charge_id, result_charge_id, member_id, \
             charge_event_id, job_type, idempotency_key, additional_can, payment_gateway, \
             container, method_snapshot, status, processed_at) \
         WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) \
         SELECT ?, IF(? = 'DONE', ?, NULL), ?, ?, 'ACTIVE_CHARGE_EVENT', \
                CONCAT('history:', ?, ':', ?, ':', i), 10, 'PG', 'pg', 'history', ?, \
                IF(? = 'DONE', NOW(6), NULL) \
         FROM n",
    )
    .bind(count)
    .bind(source)
    .bind(status)
    .bind(source)
    .bind(member)
    .bind(event)
    .bind(member)
    .bind(event)
    .bind(status)
    .bind(status)
    .execute(&env.db)
    .await
    .unwrap();
}

#[tokio::test]
async fn the_limit_reads_only_the_member_s_jobs_of_the_event_not_its_history_or_the_event_s() {
    let (env, _services) = setup().await;
    let event = bonuses::active_event(&env.db, "popular", 10, 5).await;
    let member = bonuses::member(&env.db).await;
    let source = bonuses::purchase(&env.db, member, PaymentGateway::Pg, 100)
        .await
        .id;
    // The member's history: 1,000 bonuses granted in 40 events before this one.
    let start = bonuses::db_now(&env.db).await - Duration::days(400);
    for past in 0..40 {
        let title = format!("past {past}");
        let id = bonuses::event_in(&env.db, &title, 10, start, start + Duration::days(1), 25).await;
        insert_jobs(&env, member, id, source, "DONE", 25).await;
    }
    // The event's other jobs: 3,000 of other members, none DONE (the status filter alone
    // does not narrow them).
    for _ in 0..10 {
        let other = bonuses::member(&env.db).await;
        let other_source = bonuses::purchase(&env.db, other, PaymentGateway::Pg, 100)
            .await
            .id;
        insert_jobs(&env, other, event, other_source, "FAILED", 300).await;
    }
    // And two of the member's own in this event: the count must still find them.
    insert_jobs(&env, member, event, source, "PENDING", 2).await;
    sqlx::query("ANALYZE TABLE charge_event_job, charges, charge_events")
        .execute(&env.db)
        .await
        .unwrap();

    let mut conn = env.db.acquire().await.unwrap();
    let reads = HandlerReads::start(&mut conn).await;
    let standing = event::applying_now(&mut conn, member)
        .await
        .unwrap()
        .expect("the event applies now");
    let read = reads.since(&mut conn).await;

    assert_eq!((standing.event.id, standing.owed), (event, 2));
    // The member's 2 jobs of this event, the event's row and index entries, and the granted
    // count's range: a few dozen at most, where a read of the member's history is 1,000 and
    // a read of the event's jobs 3,000.
    assert!(
        read < 100,
        "the standing read {read} rows and index entries: not bounded by the member's jobs \
         of this event"
    );
}

#[tokio::test]
async fn the_standings_of_several_charges_read_only_their_members_jobs_not_the_event_s() {
    let (env, _services) = setup().await;
    // Statistics from when the table was young, as on a database that grew faster than
    // InnoDB recalculated them (the benchmark's): no longer trusted to pick the index.
    for statement in [
        "ANALYZE TABLE charge_event_job",
        "ALTER TABLE charge_event_job STATS_AUTO_RECALC = 0",
    ] {
        sqlx::query(statement).execute(&env.db).await.unwrap();
    }
    let event = bonuses::active_event(&env.db, "popular", 10, 5).await;
    // The event's other jobs: 3,000 of other members, none DONE.
    for _ in 0..10 {
        let other = bonuses::member(&env.db).await;
        let source = bonuses::purchase(&env.db, other, PaymentGateway::Pg, 100)
            .await
            .id;
        insert_jobs(&env, other, event, source, "FAILED", 300).await;
    }
    // Ten members being completed together (completions::Completions), two jobs each already.
    let mut charges = Vec::new();
    for _ in 0..10 {
        let member = bonuses::member(&env.db).await;
        let purchase = bonuses::purchase(&env.db, member, PaymentGateway::Pg, 100).await;
        insert_jobs(&env, member, event, purchase.id, "PENDING", 2).await;
        charges.push(purchase.id);
    }

    let mut conn = env.db.acquire().await.unwrap();
    let reads = HandlerReads::start(&mut conn).await;
    let read_together = event::charges_and_standings(&mut conn, &charges)
        .await
        .unwrap();
    let read = reads.since(&mut conn).await;

    let owed: Vec<(u64, Option<i64>)> = read_together
        .iter()
        .map(|(charge, standing)| (charge.id, standing.as_ref().map(|s| s.owed)))
        .collect();
    let expected: Vec<(u64, Option<i64>)> = charges.iter().map(|id| (*id, Some(2))).collect();
    assert_eq!(owed, expected);
    // Ten charges, each with its two jobs and its granted count's range: a few hundred at
    // most, where reading the event's jobs for each charge is 30,000.
    assert!(
        read < 500,
        "the standings read {read} rows and index entries: not bounded by the members' jobs"
    );
}

/// Rows and index entries a completion of `purchase` reads (its transaction rolled back).
async fn rows_read_by_completion(
    services: &Services,
    rules: BonusRules,
    purchase: &bonuses::Purchase,
) -> i64 {
    let mut uow = services.outbox.begin_read_committed().await.unwrap();
    let reads = HandlerReads::start(&mut uow).await;
    let completion =
        completion::complete_in(&mut uow, rules, &purchase.paid(), uuid::Uuid::now_v7())
            .await
            .unwrap();
    let read = reads.since(&mut uow).await;
    assert!(matches!(completion, Completion::Completed(_)));
    uow.rollback().await.unwrap();
    read
}

#[tokio::test]
async fn a_completion_reads_no_more_for_a_member_with_a_long_history() {
    let (env, services) = setup().await;
    bonuses::active_event(&env.db, "twice per member", 10, 2).await;
    let rules = BonusRules {
        first_charge_percent: 100,
    };
    let newcomer = bonuses::member(&env.db).await;
    for _ in 0..2 {
        let purchase = bonuses::purchase(&env.db, newcomer, PaymentGateway::Pg, 100).await;
        completion::complete(&services.outbox, rules, &purchase.paid())
            .await
            .unwrap();
    }
    // 500 purchases completed for the regular (the first two earned the event's bonus).
    let regular = bonuses::member(&env.db).await;
    for _ in 0..500 {
        let purchase = bonuses::purchase(&env.db, regular, PaymentGateway::Pg, 100).await;
        completion::complete(&services.outbox, rules, &purchase.paid())
            .await
            .unwrap();
    }
    sqlx::query("UPDATE charge_event_job SET status = 'DONE', result_charge_id = source_charge_id, processed_at = NOW(6)")
        .execute(&env.db)
        .await
        .unwrap();
    sqlx::query("ANALYZE TABLE charge_event_job, charges")
        .execute(&env.db)
        .await
        .unwrap();

    let newcomer_s = bonuses::purchase(&env.db, newcomer, PaymentGateway::Pg, 100).await;
    let regular_s = bonuses::purchase(&env.db, regular, PaymentGateway::Pg, 100).await;
    let newcomer_read = rows_read_by_completion(&services, rules, &newcomer_s).await;
    let regular_read = rows_read_by_completion(&services, rules, &regular_s).await;

    // Both read the same rows and entries, give or take an index page's neighbour: the first
    // charge question stops at a second purchase, and the limit reads the member's jobs of
    // this event only (two each: the event's limit bounds them).
    assert!(
        regular_read <= newcomer_read + 10,
        "a completion read {regular_read} rows for a member with 500 purchases against \
         {newcomer_read} for one with 2: it grows with the member's history"
    );
}
