//! The platform's row-backed retry kit against real MariaDB, on a table of the test's own:
//! claims with both lease styles under real concurrent transactions, guarded settles, the
//! policy's backoff on the kit's clock (a manual one: nothing here sleeps for a backoff), the
//! reaper and the due sweep.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use paybus_bus::{Envelope, Message};
use paybus_db as db;
use paybus_maintenance::{DueSweep, DueSweepConfig};
use paybus_retry::{
    AfterFailure, AttemptCount, Backoff, Claim, Clock, Lease, RetryPolicy, Settled, WorkTable,
};
use paybus_testkit::{TestEnv, scalar};
use serde::{Deserialize, Serialize};
use sqlx::MySqlPool;
use tokio::{sync::Barrier, task::JoinSet};

/// deliver-webhook's shape: the row stays PENDING under its lease, every claim counts.
static IN_PLACE: WorkTable = WorkTable {
    table: "work_items",
    status: "status",
    due: "PENDING",
    failed: "FAILED",
    attempts: "attempts",
    count: AttemptCount::OnClaim,
    next_attempt_at: "next_attempt_at",
    due_index: "index_work_items_due",
    last_error: "last_error",
    last_error_max: 40,
    lease: Lease::InPlace,
    republished_at: Some("republished_at"),
    held_for_a_human: None,
};

/// W1's shape: a claim moves the row to an in-flight status, only failures count.
static BY_STATUS: WorkTable = WorkTable {
    table: "work_items",
    status: "status",
    due: "PENDING",
    failed: "FAILED",
    attempts: "attempts",
    count: AttemptCount::OnFailure,
    next_attempt_at: "next_attempt_at",
    due_index: "index_work_items_due",
    last_error: "last_error",
    last_error_max: 40,
    lease: Lease::Status {
        status: "PROCESSING",
        claimed_at: "claimed_at",
        claims_index: "index_work_items_claims",
    },
    republished_at: None,
    held_for_a_human: None,
};

/// W3's shape: a status lease, and only a retry's failure counts (the seed's `retry_count`:
/// the immediate attempt comes before the retries).
static RETRIES_COUNTED: WorkTable = WorkTable {
    table: "work_items",
    status: "status",
    due: "PENDING",
    failed: "FAILED",
    attempts: "attempts",
    count: AttemptCount::OnRetryFailure,
    next_attempt_at: "next_attempt_at",
    due_index: "index_work_items_due",
    last_error: "last_error",
    last_error_max: 40,
    lease: Lease::Status {
        status: "PROCESSING",
        claimed_at: "claimed_at",
        claims_index: "index_work_items_claims",
    },
    republished_at: None,
    held_for_a_human: None,
};

async fn work_table(env: &TestEnv) {
    sqlx::query(
        "CREATE TABLE work_items ( \
             id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             status          VARCHAR(16)  NOT NULL DEFAULT 'PENDING', \
             attempts        INT          NOT NULL DEFAULT 0, \
             next_attempt_at TIMESTAMP(6) NULL DEFAULT CURRENT_TIMESTAMP(6), \
             claimed_at      TIMESTAMP(6) NULL, \
             last_error      VARCHAR(40)  NULL, \
             republished_at  TIMESTAMP(6) NULL DEFAULT CURRENT_TIMESTAMP(6), \
             KEY index_work_items_due (status, next_attempt_at), \
             KEY index_work_items_claims (status, claimed_at))",
    )
    .execute(&env.db)
    .await
    .unwrap();
}

async fn insert_items(pool: &MySqlPool, n: usize) -> Vec<u64> {
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(
            sqlx::query("INSERT INTO work_items () VALUES ()")
                .execute(pool)
                .await
                .unwrap()
                .last_insert_id(),
        );
    }
    ids
}

/// A manual clock starting at the database's now (rows carry the database's time).
async fn clock_at_db_now(pool: &MySqlPool) -> Clock {
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT NOW(6)")
        .fetch_one(pool)
        .await
        .unwrap();
    Clock::manual(now)
}

#[derive(Debug, sqlx::FromRow, PartialEq)]
struct Item {
    status: String,
    attempts: i32,
    next_attempt_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
    republished_at: Option<DateTime<Utc>>,
}

async fn item(pool: &MySqlPool, id: u64) -> Item {
    sqlx::query_as(
        "SELECT status, attempts, next_attempt_at, last_error, republished_at \
         FROM work_items WHERE id = ?",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn claim(table: &WorkTable, pool: &MySqlPool, id: u64, clock: &Clock) -> Option<Claim> {
    let mut tx = db::begin_read_committed(pool).await.unwrap();
    let claim = table
        .claim(&mut tx, id, Duration::from_secs(60), clock)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    claim
}

/// W3's policy: 3 attempts, 5 then 10 minutes apart.
fn three_tries() -> RetryPolicy {
    const PAUSES: &[Duration] = &[Duration::from_secs(300), Duration::from_secs(600)];
    RetryPolicy::new(3, Backoff::schedule(PAUSES)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_claims_of_one_row_make_one_claim() {
    let env = TestEnv::new().await;
    work_table(&env).await;
    let id = insert_items(&env.db, 1).await[0];
    let barrier = Arc::new(Barrier::new(20));
    let mut claimers = JoinSet::new();
    for _ in 0..20 {
        let (pool, barrier) = (env.db.clone(), barrier.clone());
        claimers.spawn(async move {
            barrier.wait().await;
            claim(&IN_PLACE, &pool, id, &Clock::Database).await
        });
    }

    let claims: Vec<Claim> = claimers.join_all().await.into_iter().flatten().collect();

    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(claims[0].attempts, 1);
    assert_eq!(item(&env.db, id).await.attempts, 1);
}

#[tokio::test]
async fn a_failure_is_due_again_after_its_backoff_then_failed_at_the_limit() {
    let env = TestEnv::new().await;
    work_table(&env).await;
    let id = insert_items(&env.db, 1).await[0];
    let clock = clock_at_db_now(&env.db).await;
    let failed_at = clock.sql_now().unwrap();
    let policy = three_tries();
    let mut conn = env.db.acquire().await.unwrap();

    let first = claim(&IN_PLACE, &env.db, id, &clock).await.unwrap();
    let after_first = IN_PLACE
        .settle_failure(&mut conn, &first, &policy, "HTTP 503", &clock)
        .await
        .unwrap();
    let stored = item(&env.db, id).await;
    let not_yet = claim(&IN_PLACE, &env.db, id, &clock).await;
    clock.advance(Duration::from_secs(299));
    let still_not = claim(&IN_PLACE, &env.db, id, &clock).await;
    clock.advance(Duration::from_secs(1));
    let second = claim(&IN_PLACE, &env.db, id, &clock).await.unwrap();
    let after_second = IN_PLACE
        .settle_failure(&mut conn, &second, &policy, "timed out", &clock)
        .await
        .unwrap();
    clock.advance(Duration::from_secs(600));
    let third = claim(&IN_PLACE, &env.db, id, &clock).await.unwrap();
    let after_third = IN_PLACE
        .settle_failure(&mut conn, &third, &policy, &"x".repeat(100), &clock)
        .await
        .unwrap();

    assert_eq!(
        after_first,
        AfterFailure::Retry {
            after: Duration::from_secs(300),
            failures: 1
        }
    );
    assert_eq!(stored.status, "PENDING");
    assert_eq!(stored.last_error.as_deref(), Some("HTTP 503"));
    assert_eq!(
        stored.next_attempt_at,
        Some(failed_at + chrono::Duration::seconds(300)),
        "due exactly one backoff after the failure, on the kit's clock"
    );
    assert_eq!(stored.republished_at, None, "armed for the due sweep");
    assert_eq!((not_yet, still_not), (None, None));
    assert_eq!(
        after_second,
        AfterFailure::Retry {
            after: Duration::from_secs(600),
            failures: 2
        }
    );
    assert_eq!(after_third, AfterFailure::Failed { failures: 3 });
    let failed = item(&env.db, id).await;
    assert_eq!((failed.status.as_str(), failed.attempts), ("FAILED", 3));
    assert_eq!(failed.next_attempt_at, None);
    assert_eq!(failed.last_error.map(|e| e.len()), Some(40), "bounded");
    clock.advance(Duration::from_secs(86_400));
    assert_eq!(claim(&IN_PLACE, &env.db, id, &clock).await, None);
}

#[tokio::test]
async fn a_settle_after_the_lease_was_taken_over_writes_nothing() {
    let env = TestEnv::new().await;
    work_table(&env).await;
    let id = insert_items(&env.db, 1).await[0];
    let clock = clock_at_db_now(&env.db).await;
    let mut conn = env.db.acquire().await.unwrap();

    let slow = claim(&IN_PLACE, &env.db, id, &clock).await.unwrap();
    clock.advance(Duration::from_secs(61));
    let takeover = claim(&IN_PLACE, &env.db, id, &clock).await.unwrap();
    let late_done = IN_PLACE
        .settle_done(&mut conn, &slow, "status = 'DONE'")
        .await
        .unwrap();
    let late_failure = IN_PLACE
        .settle_failure(&mut conn, &slow, &three_tries(), "late", &clock)
        .await
        .unwrap();
    let current = IN_PLACE
        .settle_done(&mut conn, &takeover, "status = 'DONE'")
        .await
        .unwrap();

    assert_eq!((slow.attempts, takeover.attempts), (1, 2));
    assert_eq!(late_done, Settled::ClaimLost);
    assert_eq!(late_failure, AfterFailure::ClaimLost);
    assert_eq!(current, Settled::Yes);
    let done = item(&env.db, id).await;
    assert_eq!((done.status.as_str(), done.last_error), ("DONE", None));
}

#[tokio::test]
async fn a_status_lease_counts_failures_only_and_is_reaped_when_its_process_died() {
    let env = TestEnv::new().await;
    work_table(&env).await;
    let [retried, crashed] = insert_items(&env.db, 2).await[..] else {
        unreachable!()
    };
    let clock = clock_at_db_now(&env.db).await;
    let mut conn = env.db.acquire().await.unwrap();

    let first = claim(&BY_STATUS, &env.db, retried, &clock).await.unwrap();
    let in_flight = item(&env.db, retried).await;
    let retry = BY_STATUS
        .settle_failure(&mut conn, &first, &three_tries(), "gateway down", &clock)
        .await
        .unwrap();
    let dead = claim(&BY_STATUS, &env.db, crashed, &clock).await.unwrap();
    clock.advance(Duration::from_secs(299));
    let reaped_early = reap(&env.db, &clock).await;
    clock.advance(Duration::from_secs(2));
    let reaped = reap(&env.db, &clock).await;
    let late = BY_STATUS
        .settle_done(&mut conn, &dead, "status = 'DONE'")
        .await
        .unwrap();
    let again = claim(&BY_STATUS, &env.db, crashed, &clock).await.unwrap();

    assert_eq!(
        (first.attempts, in_flight.status.as_str()),
        (0, "PROCESSING")
    );
    assert_eq!(
        retry,
        AfterFailure::Retry {
            after: Duration::from_secs(300),
            failures: 1
        }
    );
    let stored = item(&env.db, retried).await;
    assert_eq!((stored.status.as_str(), stored.attempts), ("PENDING", 1));
    assert!(reaped_early.is_empty(), "{reaped_early:?}");
    assert_eq!(reaped, [crashed], "only the claim older than the timeout");
    assert_eq!(
        late,
        Settled::ClaimLost,
        "the reaped claim no longer settles"
    );
    assert_eq!(again.attempts, 0, "a crash is not a counted failure");
    assert_ne!(again.claimed_at, dead.claimed_at);
}

/// Seed 003's schedule: the immediate attempt, then retries after 5, 10 and 15 minutes.
fn immediate_then_three_retries() -> RetryPolicy {
    const PAUSES: &[Duration] = &[
        Duration::from_secs(300),
        Duration::from_secs(600),
        Duration::from_secs(900),
    ];
    RetryPolicy::new(4, Backoff::schedule(PAUSES)).unwrap()
}

#[tokio::test]
async fn a_first_failure_schedules_the_first_retry_and_only_retries_count() {
    let env = TestEnv::new().await;
    work_table(&env).await;
    let id = insert_items(&env.db, 1).await[0];
    let clock = clock_at_db_now(&env.db).await;
    let policy = immediate_then_three_retries();
    let mut conn = env.db.acquire().await.unwrap();
    let mut claims = Vec::new();
    let mut outcomes = Vec::new();
    let mut counted = Vec::new();

    // The immediate attempt and three retries, each failing when due; then an ops retry.
    for pause in [0, 300, 600, 900] {
        clock.advance(Duration::from_secs(pause));
        let claim = claim(&RETRIES_COUNTED, &env.db, id, &clock).await.unwrap();
        outcomes.push(
            RETRIES_COUNTED
                .settle_failure(&mut conn, &claim, &policy, "gateway down", &clock)
                .await
                .unwrap(),
        );
        counted.push(item(&env.db, id).await.attempts);
        claims.push(claim);
    }
    let gave_up = item(&env.db, id).await;
    sqlx::query("UPDATE work_items SET status = 'PENDING', next_attempt_at = NULL WHERE id = ?")
        .bind(id)
        .execute(&env.db)
        .await
        .unwrap();
    let by_ops = claim(&RETRIES_COUNTED, &env.db, id, &clock).await.unwrap();
    let after_ops_retry = RETRIES_COUNTED
        .settle_failure(&mut conn, &by_ops, &policy, "still down", &clock)
        .await
        .unwrap();

    let retry = |minutes: u64, failures| AfterFailure::Retry {
        after: Duration::from_secs(minutes * 60),
        failures,
    };
    assert_eq!(
        outcomes,
        [
            retry(5, 1),
            retry(10, 2),
            retry(15, 3),
            AfterFailure::Failed { failures: 4 }
        ]
    );
    assert_eq!(
        counted,
        [0, 1, 2, 3],
        "the immediate attempt's failure is not a retry"
    );
    assert_eq!(
        claims.iter().map(|c| c.failed_before).collect::<Vec<_>>(),
        [false, true, true, true]
    );
    assert_eq!((gave_up.status.as_str(), gave_up.attempts), ("FAILED", 3));
    assert_eq!(after_ops_retry, AfterFailure::Failed { failures: 5 });
    assert_eq!(
        item(&env.db, id).await.attempts,
        4,
        "one more attempt, counted"
    );
}

async fn reap(pool: &MySqlPool, clock: &Clock) -> Vec<u64> {
    let mut tx = db::begin_read_committed(pool).await.unwrap();
    let reaped = BY_STATUS
        .reap_expired(&mut tx, Duration::from_secs(300), 100, clock)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    reaped
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_batch_claims_take_disjoint_rows_and_all_of_them() {
    let env = TestEnv::new().await;
    work_table(&env).await;
    let ids = insert_items(&env.db, 200).await;
    let barrier = Arc::new(Barrier::new(8));
    let mut workers = JoinSet::new();
    for _ in 0..8 {
        let (pool, barrier) = (env.db.clone(), barrier.clone());
        workers.spawn(async move {
            barrier.wait().await;
            let mut mine = Vec::new();
            loop {
                let mut tx = db::begin_read_committed(&pool).await.unwrap();
                let batch = BY_STATUS
                    .claim_due(&mut tx, 30, Duration::from_secs(60), &Clock::Database)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                if batch.is_empty() {
                    return mine;
                }
                mine.extend(batch.into_iter().map(|claim| claim.id));
            }
        });
    }

    let mut claimed: Vec<u64> = workers.join_all().await.into_iter().flatten().collect();
    claimed.sort_unstable();

    assert_eq!(claimed, ids, "every row claimed exactly once");
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM work_items WHERE status = 'PROCESSING' AND claimed_at IS NOT NULL"
        )
        .await,
        200
    );
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct WorkDue {
    item_id: u64,
}

impl Message for WorkDue {
    const TYPE: &'static str = "test.work_due";
}

#[tokio::test]
async fn the_due_sweep_republishes_each_arming_once_and_stale_rows_again() {
    let env = TestEnv::new().await;
    work_table(&env).await;
    let services = env.services(&[]).await;
    let [retrying, fresh] = insert_items(&env.db, 2).await[..] else {
        unreachable!()
    };
    let clock = clock_at_db_now(&env.db).await;
    let sweep = DueSweep::new(
        "due-work",
        &IN_PLACE,
        |item_id| WorkDue { item_id },
        services.outbox.clone(),
        DueSweepConfig {
            stale_after: Duration::from_secs(3600),
            ..DueSweepConfig::default()
        },
    )
    .with_clock(clock.clone());
    let mut conn = env.db.acquire().await.unwrap();
    let first = claim(&IN_PLACE, &env.db, retrying, &clock).await.unwrap();
    IN_PLACE
        .settle_failure(&mut conn, &first, &three_tries(), "503", &clock)
        .await
        .unwrap();

    let before_due = sweep.run_once().await.unwrap();
    clock.advance(Duration::from_secs(300));
    let when_due = sweep.run_once().await.unwrap();
    let again = sweep.run_once().await.unwrap();
    clock.advance(Duration::from_secs(3600));
    let stale = sweep.run_once().await.unwrap();

    assert_eq!(before_due, 0, "not due yet");
    assert_eq!(when_due, 1, "the armed retry, not the fresh row");
    assert_eq!(again, 0, "one message per arming");
    assert_eq!(stale, 2, "both rows due and unclaimed for stale_after");
    let bodies: Vec<String> =
        sqlx::query_scalar("SELECT CAST(body AS CHAR) FROM outbox_messages ORDER BY id")
            .fetch_all(&env.db)
            .await
            .unwrap();
    let items: Vec<u64> = bodies
        .iter()
        .map(|body| {
            serde_json::from_str::<Envelope<WorkDue>>(body)
                .unwrap()
                .data
                .item_id
        })
        .collect();
    assert_eq!(items[0], retrying);
    assert_eq!(items[1..].len(), 2);
    assert!(items[1..].contains(&fresh));
}
