//! `paybus-lab bench online-ddl --items 1000000 --concurrency 32`: migrations of `withdrawals`
//! at `--items` rows, applied through `paybus migrate`'s path (`paybus_db::migrate`, this
//! release's migrations plus the bench's) while W2 confirmations run on it one a transaction
//! (`withdrawal::confirm`). The phases, on one continuous load: a baseline; the forms the rule
//! allows (`tests/docs/tests/online_ddl.rs`: an `INSTANT` column, an `INPLACE, LOCK=NONE`
//! index); an offline `COPY`, to show the measurement sees a lock; an ALTER behind a
//! transaction left open on the table, with the servers' bound (a day) and with
//! `PAYBUS_MIGRATION_LOCK_WAIT_SECONDS`, then run again. For each: the DDL's time, every
//! overlapping confirmation's latency against the baseline's p99, and the metadata-lock waits
//! sampled from `information_schema.PROCESSLIST` every few ms (MariaDB and MySQL 8 alike;
//! MariaDB's `METADATA_LOCK_INFO` is a plugin the bench does not install), the sampler running
//! through the baseline too. The claim is read from the waits: a whole latency also
//! carries what an index build's scan takes from the shared CPU. It asserts nothing about time.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use paybus_bus::Outcome;
use paybus_config::DEFAULT_MIGRATION_LOCK_WAIT;
use paybus_confirmations::{WithdrawalTxConfirmed, withdrawal};
use paybus_testkit::TestEnv;
use sqlx::{
    Connection, MySqlConnection, MySqlPool, SqlSafeStr,
    migrate::{Migration, MigrationType, Migrator},
};

use super::{
    BenchArgs, auditor::generate, bench_services, confirm_withdrawal::insert_partners,
    soak::figures::quantile_ms,
};
use crate::drive::drive;

const WARM_UP: Duration = Duration::from_secs(3);
const BASELINE: Duration = Duration::from_secs(15);
/// Load with no DDL between two phases, so that none starts in another's wake.
const SETTLE: Duration = Duration::from_secs(3);
/// How long the long transaction stays open in the hazard phases.
const HOLD: Duration = Duration::from_secs(8);
/// When the migration starts after the long transaction opened.
const MIGRATE_AFTER: Duration = Duration::from_millis(500);
/// The servers' own `lock_wait_timeout` (MariaDB's; MySQL 8's is a year): no bound to speak of.
const SERVER_DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(86_400);
const SAMPLE_EVERY: Duration = Duration::from_millis(2);
const WAITING: &str = "Waiting for table metadata lock";

/// The bench's migrations, versions after every real one.
const ADD_COLUMN: &str = "ALTER TABLE withdrawals ADD COLUMN bench_note VARCHAR(32) NULL, \
                          ALGORITHM=INSTANT";
const ADD_INDEX: &str = "ALTER TABLE withdrawals ADD INDEX index_withdrawals_bench \
                         (currency, created_at), ALGORITHM=INPLACE, LOCK=NONE";
const COPY: &str = "ALTER TABLE withdrawals ADD COLUMN bench_copied INT NULL, ALGORITHM=COPY";
const BEHIND_UNBOUNDED: &str = "ALTER TABLE withdrawals ADD COLUMN bench_unbounded INT NULL, \
                                ALGORITHM=INSTANT";
const BEHIND_BOUNDED: &str = "ALTER TABLE withdrawals ADD COLUMN bench_bounded INT NULL, \
                              ALGORITHM=INSTANT";
const BENCH_MIGRATIONS: [&str; 5] = [
    ADD_COLUMN,
    ADD_INDEX,
    COPY,
    BEHIND_UNBOUNDED,
    BEHIND_BOUNDED,
];
const FIRST_BENCH_VERSION: i64 = 99_991_231_000_001;

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    println!("load before: {}", load_average());
    let env = TestEnv::new().await;
    let services = bench_services(&env, args.concurrency).await?;
    let pool = &services.pool;
    let rows = args.items as u64;
    println!(
        "online-ddl: withdrawals filled to {rows} rows over {} partner(s), confirmations at \
         concurrency {}, one a transaction",
        args.partners, args.concurrency
    );
    let started = Instant::now();
    fill(pool, args.partners, rows).await?;
    println!("  filled in {:.1?}", started.elapsed());
    println!("{}", metadata_lock_info(pool).await?);

    let t0 = Instant::now();
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(confirmations(
        services.outbox.clone(),
        rows,
        args.concurrency,
        t0,
        samples.clone(),
        stop.clone(),
    ));
    let sampler = Sampler::start(pool, t0, stop.clone()).await?;
    let phases = phases(pool, t0, &load).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = load.await.context("the confirmations' task")??;
    let waits = sampler.finish().await?;
    let phases = phases?;
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
    report(&phases, &samples, &waits, elapsed);
    println!("load after: {}", load_average());
    Ok(())
}

/// `rows` NORMAL withdrawals in BROADCASTING, ids 1 to `rows`, over the partners round robin,
/// 100,000 rows a statement (W2's fixture, generated in SQL).
async fn fill(pool: &MySqlPool, partners: u16, rows: u64) -> anyhow::Result<()> {
    let ids = insert_partners(pool, partners).await?;
    let (first, last) = (ids[0], ids[ids.len() - 1]);
    if last - first + 1 != ids.len() as u64 {
        bail!("the partners' ids are not consecutive: {ids:?}");
    }
    generate(
        pool,
        "INSERT INTO withdrawals (id, partner_id, kind, status, currency, amount, to_address)",
        &format!(
            "k + 1, {first} + k % {}, 'NORMAL', 'BROADCASTING', 'USDT', 1, 'bench-address'",
            ids.len()
        ),
        0,
        rows,
        Duration::ZERO,
    )
    .await
}

/// One confirmation: when it started and ended (since the load's start), and whether it came
/// out done.
#[derive(Clone, Copy)]
struct Sample {
    started: Duration,
    ended: Duration,
    done: bool,
}

/// Confirms withdrawals 1, 2, ... on `concurrency` tasks until `stop` (recording each in
/// `samples`) or until every row is confirmed; the time it ran.
async fn confirmations(
    outbox: paybus_bus::Outbox,
    rows: u64,
    concurrency: u16,
    t0: Instant,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Duration> {
    let ran_out = Arc::new(AtomicBool::new(false));
    let elapsed = drive(rows as usize, concurrency, {
        let (ran_out, stop) = (ran_out.clone(), stop.clone());
        move |i| {
            let (outbox, samples, stop, ran_out) = (
                outbox.clone(),
                samples.clone(),
                stop.clone(),
                ran_out.clone(),
            );
            async move {
                // Once stopped, the remaining indices are skipped at once: `drive` runs a
                // count, and the load is stopped by time.
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let message = WithdrawalTxConfirmed {
                    withdrawal_id: i as u64 + 1,
                    tx_hash: "0xbench".to_owned(),
                };
                let started = t0.elapsed();
                let outcome = withdrawal::confirm(&outbox, &message, uuid::Uuid::now_v7()).await;
                let ended = t0.elapsed();
                let done = matches!(outcome, Ok(Outcome::Done));
                samples
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Sample {
                        started,
                        ended,
                        done,
                    });
                if i as u64 + 1 == rows {
                    ran_out.store(true, Ordering::Relaxed);
                }
                Ok(())
            }
        }
    })
    .await?;
    if ran_out.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
        bail!("every withdrawal was confirmed before the phases ended: raise --items");
    }
    Ok(elapsed)
}

/// A phase's window on the load's clock, and its DDL's outcome.
struct Phase {
    name: &'static str,
    from: Duration,
    to: Duration,
    /// None for the baseline; the DDL's error, if it failed.
    ddl: Option<Result<(), String>>,
    /// A form the migrations' rule allows, on a table no long transaction holds: the issue's
    /// claim is about these.
    online: bool,
}

/// The phases, in order, while the load runs (see the module docs).
async fn phases(
    pool: &MySqlPool,
    t0: Instant,
    load: &tokio::task::JoinHandle<anyhow::Result<Duration>>,
) -> anyhow::Result<Vec<Phase>> {
    let pause = async |how_long: Duration| -> anyhow::Result<()> {
        tokio::time::sleep(how_long).await;
        if load.is_finished() {
            bail!("the confirmations stopped early (see their error below)");
        }
        Ok(())
    };
    let mut phases = Vec::new();
    pause(WARM_UP).await?;
    let from = t0.elapsed();
    pause(BASELINE).await?;
    phases.push(Phase {
        name: "baseline, no DDL",
        from,
        to: t0.elapsed(),
        ddl: None,
        online: false,
    });
    for (name, applied, online) in [
        ("ADD COLUMN, ALGORITHM=INSTANT", 1, true),
        ("ADD INDEX, ALGORITHM=INPLACE, LOCK=NONE", 2, true),
        ("offline: ADD COLUMN, ALGORITHM=COPY", 3, false),
    ] {
        let mut phase = migration(pool, t0, name, applied, SERVER_DEFAULT_LOCK_WAIT).await;
        phase.online = online;
        phases.push(phase);
        pause(SETTLE).await?;
    }
    for (name, applied, lock_wait) in [
        (
            "behind an open transaction, the servers' bound (a day)",
            4,
            SERVER_DEFAULT_LOCK_WAIT,
        ),
        (
            "behind an open transaction, PAYBUS_MIGRATION_LOCK_WAIT_SECONDS=2",
            5,
            DEFAULT_MIGRATION_LOCK_WAIT,
        ),
    ] {
        phases.push(behind_a_long_transaction(pool, t0, name, applied, lock_wait).await?);
        pause(SETTLE).await?;
    }
    let mut again = migration(
        pool,
        t0,
        "the same, run again after it ended",
        5,
        DEFAULT_MIGRATION_LOCK_WAIT,
    )
    .await;
    again.online = true;
    phases.push(again);
    pause(SETTLE).await?;
    Ok(phases)
}

/// This release's migrations and the first `applied` of the bench's.
fn migrator(applied: usize) -> Migrator {
    let mut migrations: Vec<Migration> = paybus_db::MIGRATOR.iter().cloned().collect();
    for (i, sql) in BENCH_MIGRATIONS[..applied].iter().enumerate() {
        migrations.push(Migration::new(
            FIRST_BENCH_VERSION + i as i64,
            format!("bench {}", i + 1).into(),
            MigrationType::Simple,
            sql.into_sql_str(),
            false,
        ));
    }
    Migrator::with_migrations(migrations)
}

/// `paybus migrate`'s path with the first `applied` bench migrations, timed.
async fn migration(
    pool: &MySqlPool,
    t0: Instant,
    name: &'static str,
    applied: usize,
    lock_wait: Duration,
) -> Phase {
    let from = t0.elapsed();
    let result = paybus_db::migrate(&migrator(applied), pool, lock_wait).await;
    Phase {
        name,
        from,
        to: t0.elapsed(),
        ddl: Some(result.map_err(|e| e.to_string())),
        online: false,
    }
}

/// A transaction that reads the table and stays open for [`HOLD`], and the migration started
/// meanwhile.
async fn behind_a_long_transaction(
    pool: &MySqlPool,
    t0: Instant,
    name: &'static str,
    applied: usize,
    lock_wait: Duration,
) -> anyhow::Result<Phase> {
    let mut report = pool.begin().await?;
    sqlx::query("SELECT id FROM withdrawals ORDER BY id LIMIT 1")
        .fetch_optional(&mut *report)
        .await?;
    let migrating = async {
        tokio::time::sleep(MIGRATE_AFTER).await;
        migration(pool, t0, name, applied, lock_wait).await
    };
    let ending = async {
        tokio::time::sleep(HOLD).await;
        report.commit().await
    };
    let (phase, ended) = tokio::join!(migrating, ending);
    ended?;
    Ok(phase)
}

/// Sessions seen waiting for a metadata lock: who (the migration or a confirmation), and the
/// first and last sample that saw it waiting.
struct Wait {
    migration: bool,
    first: Duration,
    last: Duration,
}

struct Sampler {
    task: tokio::task::JoinHandle<anyhow::Result<(Vec<Wait>, usize)>>,
    t0: Instant,
}

impl Sampler {
    /// Samples the process list of the bench's database every [`SAMPLE_EVERY`] until `stop`,
    /// on a connection of its own.
    async fn start(pool: &MySqlPool, t0: Instant, stop: Arc<AtomicBool>) -> anyhow::Result<Self> {
        let mut conn = MySqlConnection::connect_with(&pool.connect_options()).await?;
        let task = tokio::spawn(async move {
            let mut done = Vec::new();
            let mut open: HashMap<u64, Wait> = HashMap::new();
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                let now = t0.elapsed();
                let waiting: Vec<(u64, Option<String>)> = sqlx::query_as(
                    "SELECT CAST(ID AS UNSIGNED), INFO FROM information_schema.PROCESSLIST \
                     WHERE DB = DATABASE() AND STATE = ?",
                )
                .bind(WAITING)
                .fetch_all(&mut conn)
                .await?;
                samples += 1;
                let seen: HashMap<u64, bool> = waiting
                    .into_iter()
                    .map(|(id, info)| {
                        let migration = info.is_some_and(|i| i.contains("ALTER TABLE"));
                        (id, migration)
                    })
                    .collect();
                // A session no longer waiting ended its wait; one waiting again later (a
                // pooled connection's next confirmation) starts another.
                let ended: Vec<u64> = open
                    .keys()
                    .filter(|id| !seen.contains_key(id))
                    .copied()
                    .collect();
                for id in ended {
                    done.extend(open.remove(&id));
                }
                for (id, migration) in seen {
                    open.entry(id)
                        .or_insert(Wait {
                            migration,
                            first: now,
                            last: now,
                        })
                        .last = now;
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
            done.extend(open.into_values());
            conn.close().await?;
            Ok((done, samples))
        });
        Ok(Self { task, t0 })
    }

    async fn finish(self) -> anyhow::Result<Waits> {
        let (waits, samples) = self.task.await.context("the process list's sampler")??;
        Ok(Waits {
            waits,
            every: self.t0.elapsed() / u32::try_from(samples.max(1)).unwrap_or(u32::MAX),
        })
    }
}

struct Waits {
    waits: Vec<Wait>,
    /// The time between two samples, on average.
    every: Duration,
}

/// Whether MariaDB's metadata-lock plugin is there (the bench does not install it).
async fn metadata_lock_info(pool: &MySqlPool) -> anyhow::Result<String> {
    let active: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.PLUGINS \
         WHERE PLUGIN_NAME = 'METADATA_LOCK_INFO' AND PLUGIN_STATUS = 'ACTIVE'",
    )
    .fetch_one(pool)
    .await?;
    Ok(if active > 0 {
        "METADATA_LOCK_INFO is installed; the waits below come from the process list all the \
         same (MySQL 8 has no such plugin)"
            .to_owned()
    } else {
        "METADATA_LOCK_INFO is not installed (a server plugin: INSTALL SONAME \
         'metadata_lock_info'); metadata-lock waits are sampled from the process list"
            .to_owned()
    })
}

/// Latencies of `samples` in sorted microseconds.
fn latencies(samples: impl Iterator<Item = Sample>) -> Vec<i64> {
    let mut took: Vec<i64> = samples
        .map(|s| i64::try_from((s.ended - s.started).as_micros()).unwrap_or(i64::MAX))
        .collect();
    took.sort_unstable();
    took
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

fn report(phases: &[Phase], samples: &[Sample], waits: &Waits, elapsed: Duration) {
    let failed = samples.iter().filter(|s| !s.done).count();
    println!(
        "{} confirmations in {elapsed:.1?} ({:.0} /s), {failed} not done; process list sampled \
         every {:.1?} on average",
        samples.len(),
        samples.len() as f64 / elapsed.as_secs_f64(),
        waits.every
    );
    let Some(baseline) = phases.first() else {
        return;
    };
    let base = latencies(
        samples
            .iter()
            .copied()
            .filter(|s| s.started >= baseline.from && s.started < baseline.to),
    );
    let base_p99 = quantile_ms(&base, 0.99).unwrap_or(f64::NAN);
    println!(
        "{:<66} {:>9} {:>7} {:>7} {:>8} {:>9} {:>10} {:>22} {:>10} {:>10}",
        "phase",
        "DDL took",
        "confs",
        "p50 ms",
        "p99 ms",
        "max ms",
        "max / p99",
        "MDL waits: confs, max",
        "MDL / p99",
        "DDL waited"
    );
    let mut online_mdl_max = Duration::ZERO;
    for phase in phases {
        let overlapped = latencies(
            samples
                .iter()
                .copied()
                .filter(|s| s.started < phase.to && s.ended > phase.from),
        );
        let max = overlapped.last().map(|&us| us as f64 / 1_000.0);
        let during = |w: &&Wait| w.last >= phase.from && w.first <= phase.to;
        let traffic: Vec<&Wait> = waits
            .waits
            .iter()
            .filter(during)
            .filter(|w| !w.migration)
            .collect();
        let longest = traffic.iter().map(|w| w.last - w.first).max();
        let ddl_waited = waits
            .waits
            .iter()
            .filter(during)
            .filter(|w| w.migration)
            .map(|w| w.last - w.first)
            .max();
        let span = |d: Option<Duration>| {
            d.map_or_else(
                || "-".to_owned(),
                |d| format!("{:.1}", d.as_secs_f64() * 1e3),
            )
        };
        if phase.online {
            online_mdl_max = online_mdl_max.max(longest.unwrap_or_default());
        }
        println!(
            "{:<66} {:>9} {:>7} {:>7} {:>8} {:>9} {:>10} {:>22} {:>10} {:>10}",
            phase.name,
            match &phase.ddl {
                None => "-".to_owned(),
                Some(_) => format!("{:.3} s", (phase.to - phase.from).as_secs_f64()),
            },
            overlapped.len(),
            ms(quantile_ms(&overlapped, 0.50)),
            ms(quantile_ms(&overlapped, 0.99)),
            ms(max),
            match (&phase.ddl, max) {
                (Some(_), Some(max)) => format!("{:.2}", max / base_p99),
                _ => "-".to_owned(),
            },
            format!("{}, {} ms", traffic.len(), span(longest)),
            match (&phase.ddl, longest) {
                (Some(_), Some(longest)) =>
                    format!("{:.2}", longest.as_secs_f64() * 1e3 / base_p99),
                _ => "-".to_owned(),
            },
            span(ddl_waited),
        );
        if let Some(Err(error)) = &phase.ddl {
            println!("    the migration failed: {error}");
        }
    }
    println!(
        "max / p99: the longest confirmation that overlapped the DDL over the baseline's p99 \
         ({base_p99:.1} ms; the baseline's own max over it: {:.2}). MDL waits: confirmations \
         seen waiting for the table's metadata lock (a wait shorter than a sample's interval \
         may be missed; each measured first to last sample seen), and the longest over the \
         baseline's p99.",
        base.last().map_or(f64::NAN, |&us| us as f64 / 1_000.0) / base_p99
    );
    let ratio = online_mdl_max.as_secs_f64() * 1e3 / base_p99;
    println!(
        "the longest metadata-lock wait of a confirmation during the online DDLs: {:.1} ms = \
         {ratio:.2} x the baseline's p99 (target <= 1: {})",
        online_mdl_max.as_secs_f64() * 1e3,
        super::met(ratio <= 1.0)
    );
}

/// The machine's load averages (1, 5, 15 minutes), as `uptime` prints them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".to_owned(),
        |text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(", ")
        },
    )
}
