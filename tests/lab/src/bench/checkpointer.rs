//! `paybus-lab bench checkpointer --items 5000`: what grant-bonus's checkpointer costs against
//! what it saves the continuous auditor, on one database in one run. `--items` members, each
//! credited just now and holding [`HISTORY`] settled purchases (an hour old), so every one is
//! among the members a checkpointer run and a windowed `member_can_balances` consider:
//!
//! - the windowed check without checkpoints (it sums each member's whole history);
//! - the checkpointer's first run (it writes a checkpoint per member);
//! - a run with nothing to move, what most of its minutes are;
//! - the windowed check with the checkpoints (it reads above them: nothing here).
//!
//! The ratio that matters is the idle run against what the checkpoints take off the check.

use std::time::{Duration, Instant};

use paybus_ops::audit::Window;
use paybus_testkit::TestEnv;

use super::{BenchArgs, Phase};

/// Settled purchases per member.
const HISTORY: u32 = 200;
/// The auditor's defaults (`grant-bonus`'s checkpointer derives them the same way).
const TOUCHED_WITHIN: Duration = Duration::from_secs(19 * 60);
const SETTLED_AFTER: Duration = Duration::from_secs(4 * 60);

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let pool = &env.db;
    let members = u64::try_from(args.items)?;
    println!("writing {members} members with {HISTORY} settled purchases each ...");
    // Credited just now (their rows' `updated_at`): touched, for the checkpointer and the check.
    super::auditor::generate(
        pool,
        "INSERT INTO members (id, nickname, pg_can)",
        &format!("k + 1, CONCAT('bench ', k), {HISTORY}"),
        0,
        members,
        Duration::ZERO,
    )
    .await?;
    sqlx::query(
        "INSERT INTO charges (member_id, status, cans, price, payment_gateway, container, \
             method, payment_status, completed_at, created_at, updated_at) \
         WITH RECURSIVE h (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM h WHERE i < ?) \
         SELECT m.id, 'CHARGE', 1, 100, 'PG', 'pg', 'card', 'COMPLETE', \
                NOW(6) - INTERVAL 1 HOUR, NOW(6) - INTERVAL 1 HOUR, NOW(6) - INTERVAL 1 HOUR \
         FROM members m, h ORDER BY m.id, h.i",
    )
    .bind(HISTORY)
    .execute(pool)
    .await?;

    let mut conn = pool.acquire().await?;
    // The auditor's default window, on the database's clock.
    let check = async |conn: &mut sqlx::MySqlConnection, name| -> anyhow::Result<Phase> {
        let since = sqlx::query_scalar("SELECT NOW(6) - INTERVAL 15 MINUTE")
            .fetch_one(&mut *conn)
            .await?;
        let window = Window { since };
        let started = Instant::now();
        let found = paybus_bonuses::audit::recent_member_can_balances(conn, window).await?;
        anyhow::ensure!(
            found.is_empty(),
            "the generated rows should be clean: {found:?}"
        );
        Ok(phase(name, started.elapsed(), args.items))
    };
    let advance = async |name| -> anyhow::Result<(Phase, u64)> {
        let started = Instant::now();
        let advanced =
            paybus_bonuses::checkpoint::advance(pool, TOUCHED_WITHIN, SETTLED_AFTER).await?;
        Ok((phase(name, started.elapsed(), args.items), advanced.moved))
    };
    let without = check(&mut conn, "windowed balance check, no checkpoints").await?;
    let (first, written) = advance("checkpointer, first run").await?;
    let (idle, moved) = advance("checkpointer, nothing to move").await?;
    let with = check(&mut conn, "windowed balance check, with checkpoints").await?;
    for phase in [&without, &first, &idle, &with] {
        phase.print();
    }
    anyhow::ensure!(
        (written, moved) == (members, 0),
        "expected {members} checkpoints written then none moved: {written}, {moved}"
    );
    let saved = without.elapsed.saturating_sub(with.elapsed);
    println!(
        "checkpointer idle run / what the checkpoints take off the check: {:.2} ({:.1?} against {:.1?})",
        idle.elapsed.as_secs_f64() / saved.as_secs_f64().max(f64::EPSILON),
        idle.elapsed,
        saved
    );
    // The full form verifies every checkpoint the runs wrote.
    let violations = paybus_ops::audit::run(&mut conn, paybus_bonuses::audit::CHECKS).await?;
    anyhow::ensure!(violations.is_empty(), "the audit found {violations:?}");
    println!("audit clean: {members} checkpoints, each its member's charges");
    Ok(())
}

fn phase(name: &'static str, elapsed: Duration, members: usize) -> Phase {
    Phase {
        name,
        unit: "members",
        count: members,
        elapsed,
        statements: None,
    }
}
