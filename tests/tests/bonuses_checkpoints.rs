//! Member can checkpoints (`paybus_bonuses::checkpoint`) against the real database: a
//! checkpoint covers a member's charges stamped long enough ago, lists the unpaid ones and
//! folds them in once paid, and stops at a recent one; checkpointers racing add each charge
//! once; with checkpoints the
//! continuous auditor's balance check finds what the full one finds, and reads a member's
//! recent charges rather than its history; the full audit verifies the checkpoints.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use paybus_bonuses::{audit, checkpoint};
use paybus_db as db;
use paybus_ops::audit::{Check, Window};
use paybus_testkit::{HandlerReads, TestEnv, bonuses::assert_audit_clean};
use sqlx::{Connection, MySqlPool};
use tokio::{sync::Barrier, task::JoinSet};

/// The auditor's defaults: a checkpointer reads members credited in the last 15 + 4 minutes
/// and checkpoints charges stamped more than 4 minutes ago (twice the 2-minute overlap).
const TOUCHED_WITHIN: Duration = Duration::from_secs(19 * 60);
const SETTLED_AFTER: Duration = Duration::from_secs(4 * 60);

/// An hour ago: settled.
const OLD: u32 = 3_600;
/// Just now: not settled.
const NEW: u32 = 0;

async fn member(pool: &MySqlPool) -> u64 {
    paybus_testkit::bonuses::member(pool).await
}

/// `count` pg charges of `member` of `cans` each, stamped `age` seconds ago, COMPLETE (the
/// member credited) or REQUEST; the first id.
async fn charges(
    pool: &MySqlPool,
    member: u64,
    count: u32,
    cans: i32,
    age: u32,
    paid: bool,
) -> u64 {
    let status = if paid { "COMPLETE" } else { "REQUEST" };
    let first = sqlx::query(
        "INSERT INTO charges (member_id, status, cans, price, payment_gateway, container, \
             method, payment_status, completed_at, created_at, updated_at) \
         WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) \
         SELECT ?, 'CHARGE', ?, ? * 100, 'PG', 'pg', CONCAT('card ', i), ?, \
                IF(? = 'COMPLETE', NOW(6) - INTERVAL ? SECOND, NULL), \
                NOW(6) - INTERVAL ? SECOND, NOW(6) - INTERVAL ? SECOND \
         FROM n",
    )
    .bind(count)
    .bind(member)
    .bind(cans)
    .bind(cans)
    .bind(status)
    .bind(status)
    .bind(age)
    .bind(age)
    .bind(age)
    .execute(pool)
    .await
    .unwrap()
    .last_insert_id();
    if paid {
        credit(pool, member, i64::from(count) * i64::from(cans)).await;
    }
    first
}

async fn credit(pool: &MySqlPool, member: u64, cans: i64) {
    sqlx::query("UPDATE members SET pg_can = pg_can + ? WHERE id = ?")
        .bind(cans)
        .bind(member)
        .execute(pool)
        .await
        .unwrap();
}

/// The gateway's word on an unpaid charge, as the completion writes it (the charge COMPLETE,
/// the member credited).
async fn pay(pool: &MySqlPool, charge: u64) {
    let (member, cans): (u64, i32) = sqlx::query_as(
        "SELECT member_id, cans FROM charges WHERE id = ? AND payment_status = 'REQUEST'",
    )
    .bind(charge)
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE charges SET payment_status = 'COMPLETE', completed_at = NOW(6) WHERE id = ?",
    )
    .bind(charge)
    .execute(pool)
    .await
    .unwrap();
    credit(pool, member, i64::from(cans)).await;
}

/// The member's checkpoint: (through, pg cans), or `None`.
async fn checkpoint_of(pool: &MySqlPool, member: u64) -> Option<(u64, i64)> {
    sqlx::query_as(
        "SELECT through_charge_id, pg_cans FROM member_can_checkpoints WHERE member_id = ?",
    )
    .bind(member)
    .fetch_optional(pool)
    .await
    .unwrap()
}

async fn advance(pool: &MySqlPool) -> checkpoint::Advanced {
    checkpoint::advance(pool, TOUCHED_WITHIN, SETTLED_AFTER)
        .await
        .unwrap()
}

type Found = BTreeSet<(&'static str, String)>;

const BALANCES: &[Check] = &[audit::CHECKS[0]];

async fn full(pool: &MySqlPool) -> Found {
    let mut conn = pool.acquire().await.unwrap();
    paybus_ops::audit::run(&mut conn, BALANCES)
        .await
        .unwrap()
        .into_iter()
        .map(|v| (v.check, v.description))
        .collect()
}

/// The window of the last hour, on the database's clock.
async fn last_hour_window(conn: &mut sqlx::MySqlConnection) -> Window {
    let since: DateTime<Utc> = sqlx::query_scalar("SELECT NOW(6) - INTERVAL 1 HOUR")
        .fetch_one(conn)
        .await
        .unwrap();
    Window { since }
}

async fn last_hour(pool: &MySqlPool) -> Found {
    let mut conn = pool.acquire().await.unwrap();
    let window = last_hour_window(&mut conn).await;
    paybus_ops::audit::run_recent(&mut conn, BALANCES, window)
        .await
        .unwrap()
        .into_iter()
        .map(|v| (v.check, v.description))
        .collect()
}

async fn listed_unpaid(pool: &MySqlPool, member: u64) -> Vec<u64> {
    sqlx::query_scalar(
        "SELECT charge_id FROM member_can_checkpoint_unpaid WHERE member_id = ? ORDER BY charge_id",
    )
    .bind(member)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_checkpoint_covers_settled_charges_lists_the_unpaid_ones_and_stops_at_a_recent_one() {
    let env = TestEnv::new().await;
    let pool = &env.db;
    assert_eq!(audit::CHECKS[0].name, "member_can_balances");
    let buyer = member(pool).await;
    charges(pool, buyer, 3, 10, OLD, true).await;
    let unpaid = charges(pool, buyer, 1, 7, OLD, false).await;
    let later = charges(pool, buyer, 2, 5, OLD, true).await;
    charges(pool, buyer, 1, 3, NEW, true).await;
    let newcomer = member(pool).await;
    charges(pool, newcomer, 2, 4, NEW, true).await;

    let advanced = advance(pool).await;
    assert_eq!(
        checkpoint_of(pool, buyer).await,
        Some((later + 1, 30 + 10)),
        "over the unpaid purchase, up to the recent charge"
    );
    assert_eq!(listed_unpaid(pool, buyer).await, [unpaid]);
    assert_eq!(checkpoint_of(pool, newcomer).await, None, "nothing settled");
    assert_eq!(
        (
            advanced.members,
            advanced.moved,
            advanced.charges,
            advanced.folded
        ),
        (2, 1, 6, 0)
    );
    assert_audit_clean(pool).await;
    assert_eq!(last_hour(pool).await, Found::new());

    // Paid after it was listed: the windowed check counts it before the checkpointer has
    // folded it, and after.
    pay(pool, unpaid).await;
    assert_audit_clean(pool).await;
    assert_eq!(
        last_hour(pool).await,
        Found::new(),
        "the listed charge, now paid"
    );
    let advanced = advance(pool).await;
    assert_eq!((advanced.moved, advanced.folded), (0, 1));
    assert_eq!(checkpoint_of(pool, buyer).await, Some((later + 1, 47)));
    assert_eq!(listed_unpaid(pool, buyer).await, Vec::<u64>::new());
    let again = advance(pool).await;
    assert_eq!(
        (again.moved, again.folded),
        (0, 0),
        "nothing more is settled"
    );

    assert_audit_clean(pool).await;
    assert_eq!(last_hour(pool).await, Found::new());
}

#[tokio::test]
async fn with_checkpoints_the_windowed_balance_check_finds_what_the_full_one_finds() {
    let env = TestEnv::new().await;
    let pool = &env.db;
    let buyer = member(pool).await;
    let first = charges(pool, buyer, 4, 10, OLD, true).await;
    charges(pool, buyer, 1, 3, NEW, true).await;
    let bystander = member(pool).await;
    let stranger = charges(pool, bystander, 3, 2, OLD, true).await;
    advance(pool).await;
    assert_eq!(checkpoint_of(pool, buyer).await, Some((first + 3, 40)));
    assert_eq!(last_hour(pool).await, Found::new());

    // A credit no charge accounts for.
    credit(pool, buyer, 1).await;
    let found = full(pool).await;
    assert_eq!(
        found.iter().map(|(check, _)| *check).collect::<Vec<_>>(),
        ["member_balance_mismatch"]
    );
    assert!(
        found.iter().any(|(_, d)| d.contains("holds 44 pg cans")),
        "{found:?}"
    );
    assert_eq!(
        last_hour(pool).await,
        found,
        "the checkpoint plus the charges above it"
    );
    // The same prepared statement again on one connection: MariaDB re-executing one once
    // answered differently from the first time (checkpoint.rs, `settled_stretch`).
    let mut conn = pool.acquire().await.unwrap();
    let window = last_hour_window(&mut conn).await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(
            audit::recent_member_can_balances(&mut conn, window)
                .await
                .unwrap(),
        );
    }
    assert_eq!(runs[0].len(), 1, "{runs:?}");
    assert!(runs.iter().all(|run| *run == runs[0]), "{runs:?}");
    drop(conn);
    credit(pool, buyer, -1).await;

    // A checkpointed charge changed afterwards (no path of paybus does): the windowed form
    // trusts the checkpoint, the full audit sees both the balance and the checkpoint wrong.
    sqlx::query("UPDATE charges SET cans = cans + 2 WHERE id = ?")
        .bind(first)
        .execute(pool)
        .await
        .unwrap();
    let kinds: BTreeSet<&str> = full(pool).await.iter().map(|(check, _)| *check).collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["member_balance_mismatch", "member_checkpoint_mismatch"])
    );
    assert_eq!(last_hour(pool).await, Found::new());

    // Another member's charge listed as this one's unpaid purchase.
    sqlx::query("INSERT INTO member_can_checkpoint_unpaid (member_id, charge_id) VALUES (?, ?)")
        .bind(buyer)
        .bind(stranger)
        .execute(pool)
        .await
        .unwrap();
    assert!(
        full(pool)
            .await
            .iter()
            .any(|(check, _)| *check == "member_checkpoint_listing_misplaced")
    );
}

/// Pays `charge` as a completion does: COMPLETE and the member credited in one statement, so
/// no reader sees one without the other.
async fn pay_at_once(pool: &MySqlPool, charge: u64) {
    let matched = sqlx::query(
        "UPDATE charges c JOIN members m ON m.id = c.member_id \
         SET c.payment_status = 'COMPLETE', c.completed_at = NOW(6), m.pg_can = m.pg_can + c.cans \
         WHERE c.id = ? AND c.payment_status = 'REQUEST'",
    )
    .bind(charge)
    .execute(pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(matched, 2, "charge {charge} and its member");
}

/// The windowed check reads the balances, then the charges above the checkpoints: a payment
/// committed between the two must not look like a credit without its charge. Its reader's
/// session is READ COMMITTED (a server configured so), where each statement alone would
/// see its own snapshot; more members than one statement sums, so every batch is read while
/// payments commit.
#[tokio::test]
async fn the_windowed_check_reads_one_snapshot_while_payments_commit() {
    let env = TestEnv::new().await;
    let pool = &env.db;
    let mut unpaid = Vec::new();
    for _ in 0..120 {
        let buyer = member(pool).await;
        charges(pool, buyer, 3, 10, OLD, true).await;
        let first = charges(pool, buyer, 8, 1, NEW, false).await;
        unpaid.push((first..first + 8).collect::<Vec<u64>>());
    }
    advance(pool).await;
    assert_eq!(last_hour(pool).await, Found::new());

    // Each member's first unpaid purchase, then each one's second, ...: every batch changes.
    let payments: Vec<u64> = (0..8)
        .flat_map(|nth| unpaid.iter().map(move |member| member[nth]))
        .collect();
    let paying = tokio::spawn({
        let pool = pool.clone();
        async move {
            for charge in payments {
                pay_at_once(&pool, charge).await;
            }
        }
    });
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *conn)
        .await
        .unwrap();
    let window = last_hour_window(&mut conn).await;
    let mut checks = 0;
    while !paying.is_finished() {
        let alone = audit::recent_member_can_balances(&mut conn, window)
            .await
            .unwrap();
        assert_eq!(
            alone,
            Vec::new(),
            "check {checks}, in a snapshot of its own"
        );
        checks += 1;
        // As the auditor's pass runs it.
        let mut pass = conn.begin_with(db::SNAPSHOT_BEGIN).await.unwrap();
        let in_pass = audit::recent_member_can_balances(&mut pass, window)
            .await
            .unwrap();
        pass.rollback().await.unwrap();
        assert_eq!(in_pass, Vec::new(), "check {checks}, in a pass's snapshot");
        checks += 1;
    }
    paying.await.unwrap();
    assert!(
        checks >= 10,
        "only {checks} checks ran while the payments committed"
    );
    assert_eq!(last_hour(pool).await, Found::new());
    assert_eq!(full(pool).await, Found::new());
}

#[tokio::test]
async fn checkpointers_racing_add_each_charge_once() {
    let env = TestEnv::new().await;
    let pool = &env.db;
    let mut unpaid = Vec::new();
    let mut members = Vec::new();
    for m in 0..20 {
        let id = member(pool).await;
        charges(pool, id, 5 + m, 3, OLD, true).await;
        unpaid.push(charges(pool, id, 1, 2, OLD, false).await);
        charges(pool, id, 4, 1, OLD, true).await;
        members.push(id);
    }
    const CHECKPOINTERS: usize = 8;
    // Round 0 checkpoints every member, its unpaid charge listed; round 1, once that charge is
    // paid, folds it in.
    for round in 0..2 {
        if round == 1 {
            for charge in &unpaid {
                pay(pool, *charge).await;
            }
        }
        let barrier = Arc::new(Barrier::new(CHECKPOINTERS));
        let mut racing = JoinSet::new();
        for _ in 0..CHECKPOINTERS {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            racing.spawn(async move {
                barrier.wait().await;
                advance(&pool).await
            });
        }
        let all = racing.join_all().await;
        let moved: u64 = all.iter().map(|a| a.moved).sum();
        let folded: u64 = all.iter().map(|a| a.folded).sum();
        let expected = if round == 0 { (20, 0) } else { (0, 20) };
        assert_eq!(
            (moved, folded),
            expected,
            "round {round}: each checkpoint moved, and each paid charge folded, by one \
             checkpointer"
        );
    }
    for member in members {
        let (_, pg_cans) = checkpoint_of(pool, member).await.unwrap();
        let balance: i64 = sqlx::query_scalar("SELECT pg_can FROM members WHERE id = ?")
            .bind(member)
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(
            pg_cans, balance,
            "member {member}: every charge settled, once"
        );
    }
    assert_audit_clean(pool).await;
}

/// One member with `history` checkpointed charges and one new charge: what the windowed
/// balance check reads without and with the checkpoint, and what the checkpointer reads to
/// move the checkpoint over the new charge once it has settled — index entries walked and
/// passed over included, not only the rows kept.
async fn reads_with_history(history: u32) -> Reads {
    let env = TestEnv::new().await;
    // One connection, so its session counters are everything the checkpointer reads.
    let single = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(env.settings.database.url.as_str())
        .await
        .unwrap();
    let pool = &env.db;
    let buyer = member(pool).await;
    charges(pool, buyer, history, 1, OLD, true).await;
    let newest = charges(pool, buyer, 1, 1, NEW, true).await;
    let mut check = Vec::new();
    for checkpointed in [false, true] {
        if checkpointed {
            advance(pool).await;
        }
        let mut conn = pool.acquire().await.unwrap();
        let window = last_hour_window(&mut conn).await;
        let counter = HandlerReads::start_with_pushdown(&mut conn).await;
        let found = audit::recent_member_can_balances(&mut conn, window)
            .await
            .unwrap();
        check.push(counter.since(&mut conn).await);
        assert_eq!(found, Vec::new());
    }
    // The new charge settles.
    sqlx::query("UPDATE charges SET created_at = created_at - INTERVAL 1 HOUR WHERE id = ?")
        .bind(newest)
        .execute(pool)
        .await
        .unwrap();
    let counter = HandlerReads::start_with_pushdown(&mut single.acquire().await.unwrap()).await;
    let moved = advance(&single).await;
    let checkpointer = counter.since(&mut single.acquire().await.unwrap()).await;
    assert_eq!((moved.moved, moved.charges), (1, 1));
    Reads {
        check_without: check[0],
        check_with: check[1],
        checkpointer,
    }
}

#[derive(Debug)]
struct Reads {
    check_without: i64,
    check_with: i64,
    checkpointer: i64,
}

#[tokio::test]
async fn with_its_checkpoint_a_member_s_history_is_read_neither_by_the_check_nor_by_the_checkpointer()
 {
    let short = reads_with_history(2).await;
    let long = reads_with_history(500).await;
    assert!(
        long.check_without > short.check_without + 400,
        "without a checkpoint the check reads the history: {long:?} vs {short:?}"
    );
    assert!(
        long.check_with <= short.check_with + 20,
        "with it, the new charge: {long:?} vs {short:?}"
    );
    assert!(
        long.checkpointer <= short.checkpointer + 20,
        "the checkpointer reads the charge it moves over: {long:?} vs {short:?}"
    );
}

/// Statements the session has executed (sqlx prepares every one).
async fn statements_run(conn: &mut sqlx::MySqlConnection) -> i64 {
    let (_, executed): (String, String) =
        sqlx::query_as("SHOW SESSION STATUS LIKE 'Com_stmt_execute'")
            .fetch_one(conn)
            .await
            .unwrap();
    executed.parse().unwrap()
}

/// The checkpointer reads the members it considers many to a statement: a statement per member
/// made its run a round trip for each member credited within the lookback (1.1 s for 5,000
/// members with nothing to move, docs/benchmarks.md).
#[tokio::test]
async fn the_checkpointer_reads_its_members_many_to_a_statement_not_one_by_one() {
    let env = TestEnv::new().await;
    let members: u32 = 1_200;
    // Two statements: a recursive CTE stops at 1,000 rows by default (`max_recursive_iterations`).
    for _ in 0..2 {
        sqlx::query(
            "INSERT INTO members (nickname, pg_can) \
             WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) \
             SELECT CONCAT('member ', i), 1 FROM n",
        )
        .bind(members / 2)
        .execute(&env.db)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO charges (member_id, status, cans, price, payment_gateway, container, \
             method, payment_status, completed_at, created_at, updated_at) \
         SELECT id, 'CHARGE', 1, 100, 'PG', 'pg', 'card', 'COMPLETE', \
                NOW(6) - INTERVAL 1 HOUR, NOW(6) - INTERVAL 1 HOUR, NOW(6) - INTERVAL 1 HOUR \
         FROM members",
    )
    .execute(&env.db)
    .await
    .unwrap();
    // One connection, so its session counters are everything the checkpointer runs.
    let single = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(env.settings.database.url.as_str())
        .await
        .unwrap();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let before = statements_run(&mut single.acquire().await.unwrap()).await;
        let advanced = advance(&single).await;
        let after = statements_run(&mut single.acquire().await.unwrap()).await;
        // Less the read of the counters itself.
        runs.push((advanced, after - before - 1));
    }
    let (first, first_statements) = runs[0];
    let (second, second_statements) = runs[1];
    assert_eq!(
        (first.members, first.moved, first.charges),
        (1_200, 1_200, 1_200)
    );
    assert_eq!((second.members, second.moved), (1_200, 0));
    // The members' list; per chunk of 500, the checkpoints' ends and the listed charges paid
    // since; the charges above the checkpoints, 50 members to a statement (the first run also
    // writes 1,200 checkpoints). A statement per member: 1,207.
    assert!(
        second_statements <= 1 + 3 * 2 + 1_200 / 50,
        "{second_statements} statements for 1,200 members with nothing to move"
    );
    assert!(
        first_statements <= 1 + 3 * 2 + 1_200 / 50 + i64::from(members),
        "{first_statements} statements for 1,200 members' first checkpoints"
    );
    assert_audit_clean(&env.db).await;
}
