//! `paybus-lab bench dead-letter-storm`: the dead-letter recorder under a storm of failures
//! of one function and reason. `--items` new letters are recorded by `--concurrency` workers,
//! each in a transaction of its own as the recorder records a DLQ message
//! (`dead_letter::record_failure`, the group's counts included), first all in one group, then
//! spread over one group per worker, in one run: the ratio is what sharing one group's
//! counts costs when every failure lands on it (the counts are spread over
//! `group_counts::SLOTS` rows for that). Then the counts are checked against the letters.
//!
//! A benchmark, not a test: it fails only on an error or counts that drifted.

use std::sync::Arc;

use anyhow::ensure;
use paybus_bus::dead_letter::{self, DeadLetterRow, group_counts};
use paybus_testkit::TestEnv;
use sqlx::Connection;

use super::{BenchArgs, Counters, Phase, bench_services, drive};

const FUNCTION: &str = "storm";
/// The reason of the one-group phase's letters.
const ONE_GROUP: &str = "failed";

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let services = bench_services(&env, args.concurrency).await?;
    let pool = services.pool.clone();
    // What a recorder stores: a small envelope as the body, its headers as JSON.
    let body = Arc::new(
        serde_json::json!({
            "id": uuid::Uuid::nil(), "type": "storm.failed", "occurred_at": "2026-12-04T00:00:00Z",
            "correlation_id": uuid::Uuid::nil(), "data": {"payload": "x".repeat(160)}
        })
        .to_string()
        .into_bytes(),
    );
    let workers = usize::from(args.concurrency);
    println!(
        "{} new dead letters each phase, {workers} recorders, {} slots per group",
        args.items,
        group_counts::SLOTS
    );
    let mut phases = Vec::new();
    for (name, groups) in [
        ("one group", 1),
        ("spread over a group per recorder", workers),
    ] {
        let counters = Counters::read(&pool).await?;
        let (pool_for_work, body) = (pool.clone(), body.clone());
        let elapsed = drive(args.items, args.concurrency, move |i| {
            let (pool, body) = (pool_for_work.clone(), body.clone());
            async move {
                let letter = format!("{FUNCTION}:{name}:{i}");
                let row = DeadLetterRow {
                    dead_letter_id: letter.clone(),
                    failure_id: letter,
                    function_name: FUNCTION.to_owned(),
                    message_id: Some(uuid::Uuid::new_v4().to_string()),
                    correlation_id: None,
                    routing_key: "storm.failed".to_owned(),
                    reason: if groups == 1 {
                        ONE_GROUP.to_owned()
                    } else {
                        format!("failed-{}", i % groups)
                    },
                    error: "the storm".to_owned(),
                    attempts: 3,
                };
                let mut tx = pool.begin().await?;
                dead_letter::record_failure(&mut tx, &row, &body, "{}").await?;
                tx.commit().await?;
                Ok(())
            }
        })
        .await?;
        let phase = Phase {
            name,
            unit: "letters",
            count: args.items,
            elapsed,
            statements: Some(counters.since(&pool).await?),
        };
        phase.print();
        phases.push(phase);
    }
    println!(
        "one group / spread: {:.2}",
        phases[0].rate() / phases[1].rate()
    );

    let mut conn = pool.acquire().await?;
    let slots: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM dead_letter_group_counts WHERE function_name = ? AND reason = ?",
    )
    .bind(FUNCTION)
    .bind(ONE_GROUP)
    .fetch_one(&mut *conn)
    .await?;
    println!("the one group's counts are on {slots} slot row(s)");
    let mut tx = conn.begin().await?;
    let drifts = group_counts::drifted(&mut tx).await?;
    tx.commit().await?;
    ensure!(drifts.is_empty(), "the counts drifted: {drifts:#?}");
    println!("the counts equal the letters, group by group");
    Ok(())
}
