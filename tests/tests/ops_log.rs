//! The ops log's hash chain against the real database: appends chain and verify clean; a row
//! changed (its identity too), deleted in the middle or at the tail, or written around the appender by SQL is found
//! at its seq; the windowed form finds what its window holds; concurrent appends from real
//! transactions make one contiguous chain; and an action's row commits or rolls back with it.

use std::sync::Arc;

use paybus_bus::pauses;
use paybus_db as db;
use paybus_ops::{
    audit::Window,
    ops_log::{self, BrokenLink, Entry, GENESIS, Problem},
};
use paybus_testkit::{TestEnv, scalar};
use serde_json::json;
use sqlx::MySqlPool;
use tokio::{sync::Barrier, task::JoinSet};

/// `count` entries appended in one transaction (each a savepoint of it).
async fn append(pool: &MySqlPool, count: u64) {
    let mut tx = pool.begin().await.unwrap();
    for n in 1..=count {
        ops_log::append(
            &mut tx,
            &Entry {
                actor: &paybus_ops::actor::Actor::person("https://idp.example", "alice", "alice"),
                action: "bonus_job.retry",
                subject: &format!("charge_event_job:{n}"),
                detail: &json!({ "n": n, "last_error": "quote service down" }),
            },
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

/// The full walk, in one snapshot as `paybus audit` runs it.
async fn verify(pool: &MySqlPool) -> Vec<BrokenLink> {
    let mut tx = pool.begin().await.unwrap();
    let found = ops_log::verify(&mut tx).await.unwrap();
    tx.rollback().await.unwrap();
    found
}

async fn verify_recent(pool: &MySqlPool, since: &'static str) -> Vec<BrokenLink> {
    let since = sqlx::query_scalar(since).fetch_one(pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let found = ops_log::verify_recent(&mut tx, Window { since })
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    found
}

async fn execute(pool: &MySqlPool, sql: &'static str) {
    sqlx::query(sql).execute(pool).await.unwrap();
}

fn broken(seq: u64, problem: Problem) -> Vec<BrokenLink> {
    vec![BrokenLink { seq, problem }]
}

#[tokio::test]
async fn appended_rows_chain_from_the_genesis_hash_and_verify_clean() {
    let env = TestEnv::new().await;
    assert_eq!(verify(&env.db).await, [], "the empty log");

    append(&env.db, 3).await;

    let mut conn = env.db.acquire().await.unwrap();
    let rows = ops_log::list(&mut conn, None, 10).await.unwrap();
    let seqs: Vec<u64> = rows.iter().map(|row| row.seq).collect();
    assert_eq!(seqs, [3, 2, 1], "newest first");
    assert_eq!(rows[2].prev_hash, GENESIS);
    assert_eq!(rows[1].prev_hash, rows[2].row_hash);
    assert_eq!(rows[0].prev_hash, rows[1].row_hash);
    let head = ops_log::head(&mut conn).await.unwrap().unwrap();
    assert_eq!(
        (head.seq, head.row_hash.as_str()),
        (3, rows[0].row_hash.as_str())
    );
    assert_eq!(rows[0].detail["last_error"], "quote service down");
    assert_eq!(verify(&env.db).await, []);
}

#[tokio::test]
async fn a_detail_changed_by_sql_is_found_at_its_row() {
    let env = TestEnv::new().await;
    append(&env.db, 9).await;

    execute(
        &env.db,
        "UPDATE ops_log SET detail = '{\"n\": 7, \"last_error\": \"nothing\"}' WHERE seq = 7",
    )
    .await;

    let found = verify(&env.db).await;
    assert_eq!(found, broken(7, Problem::Changed));
    assert_eq!(
        found[0].to_string(),
        "ops_log_chain: row 7's content does not match its hash (changed after it was written)"
    );
}

#[tokio::test]
async fn an_identity_changed_by_sql_is_found_at_its_row() {
    let env = TestEnv::new().await;
    append(&env.db, 4).await;

    execute(
        &env.db,
        "UPDATE ops_log SET actor_subject = 'mallory' WHERE seq = 2",
    )
    .await;
    assert_eq!(verify(&env.db).await, broken(2, Problem::Changed));
    execute(
        &env.db,
        "UPDATE ops_log SET actor_subject = 'alice' WHERE seq = 2",
    )
    .await;
    assert_eq!(verify(&env.db).await, []);

    // Its hash removed with it, the row would read as one written before identities.
    execute(
        &env.db,
        "UPDATE ops_log SET auth_method = 'BREAK_GLASS', identity_hash = NULL WHERE seq = 3",
    )
    .await;
    assert_eq!(verify(&env.db).await, broken(3, Problem::Changed));
}

#[tokio::test]
async fn a_row_rewritten_with_a_recomputed_hash_breaks_the_next_link() {
    let env = TestEnv::new().await;
    append(&env.db, 5).await;
    let mut conn = env.db.acquire().await.unwrap();
    let row = ops_log::list(&mut conn, Some(4), 1)
        .await
        .unwrap()
        .remove(0);
    let forged = "{\"n\":3,\"last_error\":\"nobody retried this\"}";
    let hashes = ops_log::hashes(&ops_log::Hashed {
        seq: row.seq,
        created_at: row.created_at,
        actor: &row.actor,
        action: &row.action,
        subject: &row.subject,
        detail: forged,
        prev_hash: &row.prev_hash,
        identity: row.identity(),
    });

    sqlx::query("UPDATE ops_log SET detail = ?, row_hash = ?, identity_hash = ? WHERE seq = 3")
        .bind(forged)
        .bind(&hashes.row_hash)
        .bind(&hashes.identity_hash)
        .execute(&env.db)
        .await
        .unwrap();

    assert_eq!(verify(&env.db).await, broken(4, Problem::Unlinked));
}

#[tokio::test]
async fn a_deleted_middle_row_is_found_missing() {
    let env = TestEnv::new().await;
    append(&env.db, 9).await;

    execute(&env.db, "DELETE FROM ops_log WHERE seq = 8").await;

    let found = verify(&env.db).await;
    assert_eq!(found, broken(8, Problem::Missing));
    assert_eq!(
        found[0].to_string(),
        "ops_log_chain: row 8 is missing (deleted)"
    );
}

#[tokio::test]
async fn a_deleted_tail_is_found_by_the_head() {
    let env = TestEnv::new().await;
    append(&env.db, 12).await;

    execute(&env.db, "DELETE FROM ops_log WHERE seq = 12").await;

    let found = verify(&env.db).await;
    assert_eq!(found, broken(12, Problem::TailDeleted { last_seq: 11 }));
    assert_eq!(
        found[0].to_string(),
        "ops_log_chain: the head says 12 rows but the log ends at 11 (the tail was deleted)"
    );
    // The windowed form, with nothing written in its window, still reads the head's row.
    assert_eq!(
        verify_recent(&env.db, "SELECT NOW(6) + INTERVAL 1 HOUR").await,
        found
    );
}

#[tokio::test]
async fn a_head_moved_back_with_the_tail_or_a_row_written_around_it_is_found() {
    let env = TestEnv::new().await;
    append(&env.db, 4).await;

    // The last row deleted and the head moved back to row 3, but not to row 3's hash.
    execute(&env.db, "DELETE FROM ops_log WHERE seq = 4").await;
    execute(&env.db, "UPDATE ops_log_head SET seq = 3").await;
    assert_eq!(verify(&env.db).await, broken(3, Problem::HeadMismatch));

    // The head made consistent again, and a row added past it by hand.
    execute(
        &env.db,
        "UPDATE ops_log_head SET row_hash = (SELECT row_hash FROM ops_log WHERE seq = 3)",
    )
    .await;
    assert_eq!(verify(&env.db).await, []);
    execute(
        &env.db,
        "INSERT INTO ops_log (seq, created_at, actor, action, subject, detail, prev_hash, row_hash) \
         SELECT 4, created_at, 'mallory', action, subject, detail, row_hash, row_hash \
         FROM ops_log WHERE seq = 3",
    )
    .await;
    assert_eq!(
        verify(&env.db).await,
        broken(4, Problem::PastHead { head_seq: 3 })
    );

    execute(&env.db, "DELETE FROM ops_log_head").await;
    assert_eq!(verify(&env.db).await, broken(0, Problem::HeadMissing));
}

#[tokio::test]
async fn the_walk_reads_in_batches_and_finds_a_gap_at_a_batch_boundary() {
    let env = TestEnv::new().await;
    let rows = u64::from(ops_log::BATCH) + 200;
    append(&env.db, rows).await;
    assert_eq!(verify(&env.db).await, []);

    execute(&env.db, "DELETE FROM ops_log WHERE seq = 1001").await;

    assert_eq!(
        u64::from(ops_log::BATCH),
        1_000,
        "the boundary this test aims at"
    );
    assert_eq!(verify(&env.db).await, broken(1001, Problem::Missing));
}

#[tokio::test]
async fn the_windowed_walk_checks_the_window_s_rows_and_leaves_older_ones_to_the_full_one() {
    let env = TestEnv::new().await;
    append(&env.db, 3).await;
    // Rows 1-3 as if written two hours ago (hash and all: written so, not edited).
    let mut conn = env.db.acquire().await.unwrap();
    let old = ops_log::list(&mut conn, None, 3).await.unwrap();
    execute(&env.db, "DELETE FROM ops_log").await;
    execute(
        &env.db,
        "UPDATE ops_log_head SET seq = 0, row_hash = REPEAT('0', 64)",
    )
    .await;
    let mut tx = env.db.begin().await.unwrap();
    for row in old.iter().rev() {
        let created_at = row.created_at - chrono::Duration::hours(2);
        let detail = row.detail.to_string();
        let prev_hash = ops_log::head(&mut tx).await.unwrap().unwrap().row_hash;
        let hashes = ops_log::hashes(&ops_log::Hashed {
            seq: row.seq,
            created_at,
            actor: &row.actor,
            action: &row.action,
            subject: &row.subject,
            detail: &detail,
            prev_hash: &prev_hash,
            identity: row.identity(),
        });
        sqlx::query(
            "INSERT INTO ops_log (seq, created_at, actor, action, subject, detail, prev_hash, \
             row_hash, actor_issuer, actor_subject, auth_method, identity_hash) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(row.seq)
        .bind(created_at)
        .bind(&row.actor)
        .bind(&row.action)
        .bind(&row.subject)
        .bind(&detail)
        .bind(&prev_hash)
        .bind(&hashes.row_hash)
        .bind(&row.actor_issuer)
        .bind(&row.actor_subject)
        .bind(&row.auth_method)
        .bind(&hashes.identity_hash)
        .execute(&mut *tx)
        .await
        .unwrap();
        sqlx::query("UPDATE ops_log_head SET seq = ?, row_hash = ?")
            .bind(row.seq)
            .bind(&hashes.row_hash)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    append(&env.db, 3).await;
    let last_hour = "SELECT NOW(6) - INTERVAL 1 HOUR";
    assert_eq!(verify(&env.db).await, []);
    assert_eq!(verify_recent(&env.db, last_hour).await, []);

    // A change in the window is found by both.
    execute(
        &env.db,
        "UPDATE ops_log SET actor = 'mallory' WHERE seq = 5",
    )
    .await;
    assert_eq!(verify(&env.db).await, broken(5, Problem::Changed));
    assert_eq!(
        verify_recent(&env.db, last_hour).await,
        broken(5, Problem::Changed)
    );
    execute(&env.db, "UPDATE ops_log SET actor = 'alice' WHERE seq = 5").await;

    // The row the window links to (row 3) is read too; row 2 is the full walk's.
    execute(
        &env.db,
        "UPDATE ops_log SET actor = 'mallory' WHERE seq = 3",
    )
    .await;
    assert_eq!(
        verify_recent(&env.db, last_hour).await,
        broken(3, Problem::Changed)
    );
    execute(&env.db, "UPDATE ops_log SET actor = 'alice' WHERE seq = 3").await;
    execute(
        &env.db,
        "UPDATE ops_log SET actor = 'mallory' WHERE seq = 2",
    )
    .await;
    assert_eq!(verify_recent(&env.db, last_hour).await, []);
    assert_eq!(verify(&env.db).await, broken(2, Problem::Changed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_from_real_transactions_make_one_contiguous_chain() {
    const WRITERS: usize = 8;
    let env = TestEnv::new().await;
    // Every writer holds an open transaction before any appends: they all meet at the head's
    // lock at once, on an empty log (where a locking read of ops_log itself would lock nothing
    // under READ COMMITTED, half of them).
    let barrier = Arc::new(Barrier::new(WRITERS));
    let mut writers = JoinSet::new();
    for writer in 0..WRITERS {
        let (pool, barrier) = (env.db.clone(), barrier.clone());
        writers.spawn(async move {
            let mut tx = if writer % 2 == 0 {
                db::begin_read_committed(&pool).await.unwrap()
            } else {
                pool.begin().await.unwrap()
            };
            sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
            barrier.wait().await;
            let seq = ops_log::append(
                &mut tx,
                &Entry {
                    actor: &paybus_ops::actor::Actor::person(
                        "https://idp.example",
                        &format!("writer-{writer}"),
                        &format!("writer-{writer}"),
                    ),
                    action: "function.pause",
                    subject: "function:canary",
                    detail: &json!({ "writer": writer }),
                },
            )
            .await
            .unwrap();
            // Held a moment after the append, so the others queue on the lock.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            tx.commit().await.unwrap();
            seq
        });
    }
    let mut seqs: Vec<u64> = writers.join_all().await;

    seqs.sort_unstable();
    assert_eq!(seqs, (1..=WRITERS as u64).collect::<Vec<_>>());
    assert_eq!(verify(&env.db).await, []);
    let mut conn = env.db.acquire().await.unwrap();
    let actors: std::collections::BTreeSet<String> = ops_log::list(&mut conn, None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.actor)
        .collect();
    assert_eq!(actors.len(), WRITERS, "{actors:?}");
}

#[tokio::test]
async fn an_action_rolled_back_leaves_no_row_and_one_committed_leaves_its_row() {
    let env = TestEnv::new().await;

    let mut tx = env.db.begin().await.unwrap();
    assert!(
        pauses::pause(
            &mut tx,
            "canary",
            &paybus_testkit::person("alice"),
            "maintenance"
        )
        .await
        .unwrap()
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM function_pauses").await,
        0
    );
    assert_eq!(scalar(&env.db, "SELECT COUNT(*) FROM ops_log").await, 0);
    assert_eq!(
        scalar(&env.db, "SELECT CAST(seq AS SIGNED) FROM ops_log_head").await,
        0
    );

    let mut conn = env.db.acquire().await.unwrap();
    assert!(
        pauses::pause(
            &mut conn,
            "canary",
            &paybus_testkit::person("alice"),
            "maintenance"
        )
        .await
        .unwrap()
    );
    assert!(
        pauses::resume(&mut conn, "canary", &paybus_testkit::person("bob"))
            .await
            .unwrap()
    );
    assert!(
        !pauses::resume(&mut conn, "canary", &paybus_testkit::person("bob"))
            .await
            .unwrap()
    );

    let logged: Vec<(String, String, String)> = ops_log::list(&mut conn, None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.actor, row.action, row.subject))
        .collect();
    assert_eq!(
        logged,
        [
            (
                "bob".into(),
                "function.resume".into(),
                "function:canary".into()
            ),
            (
                "alice".into(),
                "function.pause".into(),
                "function:canary".into()
            ),
        ]
    );
    assert_eq!(verify(&env.db).await, []);
}
