//! `paybus bench auditor --items 1000000`: one continuous-auditor pass over a ledger of
//! `--items` entries (written a day ago) plus the last minute's 1,000, against the full audit
//! (`paybus audit`) of the same rows in the same run. The auditor's cost should follow the
//! window, not the table: the ratio says how much of the full audit's cost it pays.

use std::time::{Duration, Instant};

use paybus_platform::{
    audit,
    auditor::{Auditor, AuditorConfig},
    testing::TestEnv,
};
use sqlx::MySqlPool;

use super::{BenchArgs, Phase};

const PARTNERS: u64 = 100;
/// The entries written "in the last minute": what a pass reads.
const RECENT: u64 = 1_000;
const CHUNK: u64 = 100_000;

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let pool = &env.db;
    let old = args.items as u64;
    println!(
        "writing {old} ledger entries a day old and {RECENT} recent over {PARTNERS} partners ..."
    );
    let started = Instant::now();
    fill(pool, old, RECENT).await?;
    println!("  written in {:.1?}", started.elapsed());
    let checks = paybus_catalog::audit_checks();

    let auditor = Auditor::new(pool.clone(), checks.clone(), AuditorConfig::default());
    auditor.pass().await?; // warm the buffer pool as the full audit will be
    let started = Instant::now();
    let pass = auditor.pass().await?;
    let windowed = Phase {
        name: "auditor pass (15 min window, every check)",
        unit: "passes",
        count: 1,
        elapsed: started.elapsed(),
        statements: None,
    };
    let started = Instant::now();
    let mut conn = pool.acquire().await?;
    let full = audit::run(&mut conn, &checks).await?;
    let baseline = Phase {
        name: "full audit (paybus audit, every check)",
        unit: "passes",
        count: 1,
        elapsed: started.elapsed(),
        statements: None,
    };
    windowed.print();
    baseline.print();
    println!(
        "auditor pass / full audit: {:.3} of the time ({} entries in all; violations: pass {}, full {})",
        windowed.elapsed.as_secs_f64() / baseline.elapsed.as_secs_f64().max(f64::EPSILON),
        old + RECENT,
        pass.violations.len(),
        full.len()
    );
    if !pass.violations.is_empty() || !full.is_empty() {
        anyhow::bail!("the generated ledger should be clean");
    }
    Ok(())
}

/// `old` CREDITs of 1 created a day ago, then `recent` created now, spread over the partners
/// with a correct chain and balance (`balance_after` = the entry's position in its chain).
async fn fill(pool: &MySqlPool, old: u64, recent: u64) -> anyhow::Result<()> {
    for partner in 1..=PARTNERS {
        sqlx::query("INSERT INTO partners (id, name, webhook_secret) VALUES (?, ?, 'bench')")
            .bind(partner)
            .bind(format!("bench {partner}"))
            .execute(pool)
            .await?;
        // The gate row first (the entries' foreign key); its balance is set at the end.
        sqlx::query("INSERT INTO partner_balances (partner_id, currency) VALUES (?, 'USDT')")
            .bind(partner)
            .execute(pool)
            .await?;
    }
    let mut written = 0;
    for (count, age) in [(old, Duration::from_secs(86_400)), (recent, Duration::ZERO)] {
        let mut done = 0;
        while done < count {
            let n = CHUNK.min(count - done);
            // n rows from a 100 x 100 x 10 cross join of a 0..99 sequence (runs on MySQL 8's
            // default recursion depth too).
            sqlx::query(
                "INSERT INTO ledger_entries (partner_id, currency, entry_type, amount, \
                     balance_after, reference_type, reference_id, created_at) \
                 WITH RECURSIVE d (i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM d WHERE i < 99), \
                 n (k) AS (SELECT a.i * 10000 + b.i * 100 + c.i FROM d a, d b, d c \
                           WHERE a.i < 10) \
                 SELECT 1 + (? + k) % ?, 'USDT', 'CREDIT', 1, FLOOR((? + k) / ?) + 1, \
                        'MIGRATION', ? + k, NOW(6) - INTERVAL ? SECOND \
                 FROM n WHERE k < ? ORDER BY k",
            )
            .bind(written)
            .bind(PARTNERS)
            .bind(written)
            .bind(PARTNERS)
            .bind(written)
            .bind(age.as_secs())
            .bind(n)
            .execute(pool)
            .await?;
            done += n;
            written += n;
        }
    }
    sqlx::query(
        "UPDATE partner_balances b \
         JOIN (SELECT partner_id, COUNT(*) AS n FROM ledger_entries GROUP BY partner_id) e \
           ON e.partner_id = b.partner_id \
         SET b.balance = e.n",
    )
    .execute(pool)
    .await?;
    Ok(())
}
