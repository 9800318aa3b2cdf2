//! `paybus-lab bench <workflow>`: throughput end to end through the broker next to two figures
//! measured in the same run on the same database:
//!
//! - **direct**: the workflow's own SQL transactions driven straight on the database at the
//!   same concurrency (what the bus costs on top of them: the ratio should be close to 1);
//! - **ceiling**: the database's own limit for a write transaction, sysbench
//!   `oltp_write_only`'s shape (an indexed UPDATE, a non-indexed UPDATE, a DELETE and an
//!   INSERT by primary key on a 100k-row table, in one transaction), the best of 16, 32 and 64
//!   connections and the bench's own concurrency ([`database_ceiling`]). The workflow's useful
//!   transitions per second divided by it says how close to the database's limit it runs.
//!
//! A benchmark, not a test: it asserts nothing about time, only that the work came out
//! exactly once (and the audit is clean). Each run gets its own database and vhost (dropped
//! afterwards), so it can run next to `paybus run` on the same servers.

use std::{
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use paybus_bus::{
    Envelope, Handler, HandlerError, Message, Outbox, Outcome, OutgoingMessage, Services,
    link::BrokerLink, metrics, publisher::Publisher,
};
use paybus_runtime::runner::Runner;
use paybus_testkit::TestEnv;
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use crate::drive::drive;

mod auditor;
mod checkpointer;
mod confirm_deposit;
mod confirm_withdrawal;
mod cpu;
mod dead_letter_storm;
mod grant_bonus;
mod idle;
mod lambda_batch;
mod matching;
mod online_ddl;
mod ops_queries;
pub(crate) mod pinning;
pub(crate) mod soak;
mod suspend;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Workflow {
    /// W2: withdrawal confirmations, every message delivered twice.
    ConfirmWithdrawal,
    /// W2: deposit confirmations, every message delivered twice (and, through the broker, one
    /// message per transaction next to the handler's batches).
    ConfirmDeposit,
    /// W3: payment completions and their bonus grants (grants/s end to end vs direct).
    GrantBonus,
    /// W4: the suspend request's latency against the number of open orders (and the seed's
    /// in-request loop), and cancels per second end to end against direct.
    Suspend,
    /// W1: P2P deposit orders matched with a 200 ms quote service, against the seed's design
    /// holding its locks across the call (run with `--concurrency 32`).
    Match,
    /// One Lambda environment on one Amazon MQ batch of W2 confirmations (`--items` of them)
    /// against the local consumer at the same concurrency; with `--shards N`, N environments
    /// at once, one per queue.
    LambdaBatch,
    /// Ops: one continuous-auditor pass over a ledger of `--items` entries against the full
    /// audit of the same rows (try `--items 1000000`).
    Auditor,
    /// Ops: grant-bonus's checkpointer over `--items` members credited just now, each with
    /// 200 settled purchases: its first run and an idle one, against the windowed balance
    /// check without and with the checkpoints (try `--items 5000`).
    Checkpointer,
    /// Ops: every console page and ops list, group and count route over HTTP with `--rows`
    /// dead letters, bonus jobs and cancel tasks each, and the EXPLAIN of every query.
    OpsQueries,
    /// Ops: `--items` dead letters recorded by `--concurrency` recorders all in one group
    /// (function, reason) against spread over a group each: what the group's counts cost
    /// under a storm of one failure.
    DeadLetterStorm,
    /// Deploys: migrations of `withdrawals` filled to `--items` rows (run with `--items
    /// 1000000 --concurrency 32`) applied while W2 confirmations run on it: each confirmation's
    /// latency during every DDL against the baseline's p99 and the metadata-lock waits, for the
    /// online forms, an offline one, and an ALTER behind a long transaction with and without
    /// `PAYBUS_MIGRATION_LOCK_WAIT_SECONDS`.
    OnlineDdl,
    /// Memory: every function's process, the API's and `paybus run`'s left idle for
    /// `--idle-seconds` on a fresh database: resident memory, its anonymous and file-backed
    /// parts, threads and database connections, against a function's 30 MiB.
    Idle,
    /// All four workflows at a steady rate for `--minutes`, every message delivered
    /// `--copies` times, each function its own process: throughput, p50/p99, RSS, table
    /// sizes, outbox backlog and dead letters per window, a plot, then chaos's exactly-once
    /// checks.
    Soak,
}

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    pub workflow: Workflow,
    /// Distinct items per phase (each phase sends every item twice).
    #[arg(long, default_value_t = 2_000)]
    pub items: usize,
    /// In-flight work in every phase: worker tasks for direct and ceiling, prefetch for the
    /// broker.
    #[arg(long, default_value_t = 64)]
    pub concurrency: u16,
    /// Partners the items are spread over (round robin). One partner serialises every ledger
    /// posting on its gate row; real deployments have many.
    #[arg(long, default_value_t = 1)]
    pub partners: u16,
    /// (lambda-batch) Queues confirm-withdrawal's messages are spread over, one Lambda
    /// environment each (PAYBUS_SHARDS).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub shards: u16,
    /// (confirm-withdrawal, confirm-deposit) RabbitMQ on a CPU of its own and the database and
    /// the bench on the others, as Amazon MQ runs on hosts of its own (`taskset`; undone at
    /// the end).
    #[arg(long)]
    pub pin_broker: bool,
    /// (confirm-withdrawal, confirm-deposit) Rounds of the direct and the through-the-broker
    /// phases (confirm-deposit's batched ones; its one-at-a-time pair runs once), which one
    /// goes first alternating; the ratios are the rounds' medians. Why: on these shared
    /// virtual cores one round's broker / direct swings by ±0.1 from run to run, so one
    /// round's figure cannot say met or not.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=20))]
    pub rounds: u16,
    /// (suspend) Open orders of the markets whose suspend request is timed.
    #[arg(long, value_delimiter = ',', default_value = "1000,100000,1000000")]
    pub open_orders: Vec<u64>,
    /// (ops-queries) Rows of each big table: dead letters, bonus jobs, cancel tasks.
    #[arg(long, default_value_t = 5_000_000)]
    pub rows: u64,
    /// (auditor) Time every check, windowed and in full, on this existing database (a soak's,
    /// a copy of production's) instead of generated rows; the window is a steady pass's span
    /// (`PAYBUS_AUDITOR_INTERVAL_MS` plus `PAYBUS_AUDITOR_OVERLAP_SECS`, at most
    /// `PAYBUS_AUDITOR_WINDOW_SECS`) ending at its latest ledger entry. Read only.
    #[arg(long)]
    pub database_url: Option<String>,
    /// (idle) How long the processes are left alone before their memory is read.
    #[arg(long, default_value_t = 30)]
    pub idle_seconds: u64,
    #[command(flatten)]
    pub soak: soak::SoakArgs,
}

/// `--pin-broker`'s CPUs, set before the async runtime starts (`main`): its worker threads are
/// as many as the CPUs this process keeps, one on two cores, as a function's runtime on a
/// one-CPU host has. Pinned after the runtime started, two workers would share the one CPU
/// left to the bench and the database, and switching between them costs the broker phase
/// most: in four interleaved sets of five pinned rounds, medians 0.84, 0.88, 0.77, 0.85 with
/// two workers against 0.85, 0.90, 0.88, 0.89 with one. Undone when the guard drops.
pub(crate) fn pin(args: &BenchArgs) -> anyhow::Result<Option<pinning::Pinned>> {
    args.pin_broker.then(pinning::pin_broker).transpose()
}

/// Every bench but the soak fails only on an error; the soak also fails (exit 1) when its
/// exactly-once checks find a violation. `--pin-broker` was applied by [`pin`].
pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if args.items == 0 || args.concurrency == 0 || args.partners == 0 {
        bail!("--items, --concurrency and --partners must be at least 1");
    }
    let ran = match args.workflow {
        Workflow::ConfirmWithdrawal => confirm_withdrawal::run(&args).await,
        Workflow::ConfirmDeposit => confirm_deposit::run(&args).await,
        Workflow::GrantBonus => grant_bonus::run(&args).await,
        Workflow::Suspend => suspend::run(&args).await,
        Workflow::Match => matching::run(&args).await,
        Workflow::LambdaBatch => lambda_batch::run(&args).await,
        Workflow::Auditor => auditor::run(&args).await,
        Workflow::Checkpointer => checkpointer::run(&args).await,
        Workflow::OpsQueries => ops_queries::run(&args).await,
        Workflow::DeadLetterStorm => dead_letter_storm::run(&args).await,
        Workflow::OnlineDdl => online_ddl::run(&args).await,
        Workflow::Idle => idle::run(&args).await,
        Workflow::Soak => return soak::run(&args.soak, args.concurrency).await,
    };
    ran.map(|()| ExitCode::SUCCESS)
}

pub(crate) struct Phase {
    pub(crate) name: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) count: usize,
    pub(crate) elapsed: Duration,
    /// What the phase cost the database, per unit.
    pub(crate) statements: Option<Statements>,
}

impl Phase {
    pub(crate) fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }

    pub(crate) fn print(&self) {
        println!(
            "{:<44} {:>7} {:<12} in {:>8.2?}  {:>8.0} /s",
            self.name,
            self.count,
            self.unit,
            self.elapsed,
            self.rate()
        );
        if let Some(statements) = &self.statements {
            let unit = self.unit.trim_end_matches('s');
            println!("    per {unit}: {}", statements.per(self.count));
            let (before, after) = &statements.cpu;
            if let Some(cpu) = before.per_unit_since(after, unit, self.count) {
                println!("    {cpu}");
            }
        }
    }
}

/// The server's statement counters (`SHOW GLOBAL STATUS`) we report, in print order.
const COUNTERS: [(&str, &str); 13] = [
    ("Questions", "statements"),
    ("Com_select", "select"),
    ("Com_insert", "insert"),
    ("Com_insert_select", "insert_select"),
    ("Com_update", "update"),
    // UPDATE ... JOIN (W3's credit of a completed charge) counts here, not in Com_update.
    ("Com_update_multi", "update_multi"),
    ("Com_delete", "delete"),
    ("Com_begin", "begin"),
    ("Com_commit", "commit"),
    ("Com_rollback", "rollback"),
    // Every statement's storage-engine commit, reads in autocommit included.
    ("Handler_commit", "handler_commit"),
    // Statements prepared (a round trip each, not in `Questions`): a statement shape a
    // connection's statement cache had not seen, or had evicted.
    ("Com_stmt_prepare", "prepare"),
    // A transaction that waited for another's row lock: concurrent batches of one entity.
    ("Innodb_row_lock_waits", "lock_waits"),
];

/// Statements the server executed between two readings of its counters, and the CPU time
/// spent meanwhile. They are server- and machine-wide: anything else running during the phase
/// is counted too.
pub(crate) struct Statements {
    counts: [u64; COUNTERS.len()],
    cpu: (cpu::CpuTimes, cpu::CpuTimes),
}

/// A reading of [`COUNTERS`] and of the CPU times, taken before a phase.
pub(crate) struct Counters([u64; COUNTERS.len()], cpu::CpuTimes);

impl Counters {
    pub(crate) async fn read(pool: &MySqlPool) -> anyhow::Result<Self> {
        let rows: Vec<(String, String)> = sqlx::query_as("SHOW GLOBAL STATUS LIKE '%'")
            .fetch_all(pool)
            .await?;
        let mut values = [0; COUNTERS.len()];
        for (name, value) in rows {
            if let Some(i) = COUNTERS.iter().position(|(counter, _)| *counter == name) {
                values[i] = value.parse()?;
            }
        }
        Ok(Self(values, cpu::CpuTimes::read()))
    }

    /// The statements since this reading (minus the readings' own `SHOW` statements).
    pub(crate) async fn since(&self, pool: &MySqlPool) -> anyhow::Result<Statements> {
        let now = Self::read(pool).await?;
        let mut delta = [0; COUNTERS.len()];
        for (i, d) in delta.iter_mut().enumerate() {
            *d = now.0[i].saturating_sub(self.0[i]);
        }
        delta[0] = delta[0].saturating_sub(1);
        Ok(Statements {
            counts: delta,
            cpu: (self.1, now.1),
        })
    }
}

impl Statements {
    fn per(&self, units: usize) -> String {
        let units = units.max(1) as f64;
        COUNTERS
            .iter()
            .zip(self.counts)
            .map(|((_, label), n)| format!("{label} {:.2}", n as f64 / units))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The admin API served on a local port over `services`, with an ADMIN token: what the
/// benches that time HTTP routes ask.
pub(crate) struct BenchApi {
    pub(crate) base: String,
    pub(crate) token: String,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<Result<(), paybus_api::ApiError>>,
}

impl BenchApi {
    const ADMIN_SECRET: &'static str = "bench-admin-secret-0123456789-abcdef";

    /// With every catalog function's triage (what `paybus run` serves).
    pub(crate) async fn start(services: &Services) -> anyhow::Result<Self> {
        let config = paybus_api::ApiConfig {
            admin_jwt_secret: Some(paybus_config::Secret::new(Self::ADMIN_SECRET)),
            break_glass: true,
            ..paybus_api::ApiConfig::default()
        };
        let state = paybus_api::AppState::new(services, &config, paybus_catalog::audit_checks())?
            .with_functions(paybus_catalog::FUNCTIONS);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(paybus_api::serve_on(listener, state, shutdown.clone()));
        let token = paybus_api::auth::issue(
            Self::ADMIN_SECRET,
            "bench",
            &[paybus_api::role::Role::Admin],
            Duration::from_secs(3600),
        )?;
        Ok(Self {
            base,
            token,
            shutdown,
            server,
        })
    }

    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.server.await??;
        Ok(())
    }
}

pub(crate) async fn bench_services(env: &TestEnv, concurrency: u16) -> anyhow::Result<Services> {
    let mut settings = env.settings.clone();
    settings.broker.prefetch = concurrency;
    // Every in-flight handler holds a connection; a smaller pool would measure the pool.
    settings.database.max_connections = u32::from(concurrency) + 8;
    let services = Services::connect(settings).await?;
    services
        .declare_topology(&paybus_catalog::queues(&services.settings.broker.shards))
        .await?;
    Ok(services)
}

/// Empties `queue`: what an earlier phase left there is not the next phase's.
pub(crate) async fn purge(services: &Services, queue: &str) -> anyhow::Result<()> {
    let channel = services.connection().create_channel().await?;
    channel
        .queue_purge(queue.into(), lapin::options::QueuePurgeOptions::default())
        .await
        .with_context(|| format!("purging {queue}"))?;
    Ok(())
}

/// Messages `function` has finished (done or skipped) in this process so far.
pub(crate) fn processed_by(function: &str) -> u64 {
    metrics::count(function, "done") + metrics::count(function, "skipped")
}

/// Waits until `function` has finished `expected` messages more than `before`, at most 10
/// minutes from `started`.
pub(crate) async fn until_processed(
    function: &str,
    before: u64,
    expected: u64,
    started: Instant,
) -> anyhow::Result<()> {
    let deadline = started + Duration::from_secs(600);
    while processed_by(function) - before < expected {
        if Instant::now() > deadline {
            anyhow::bail!(
                "{function}: only {} of {expected} messages processed in 10 minutes",
                processed_by(function) - before
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// `messages` published, and consumed by `handler` in the real runtime (the local consumer,
/// prefetch = the services' setting) until every one is processed.
pub(crate) async fn through_the_broker<H: Handler>(
    services: &Services,
    handler: H,
    messages: &[OutgoingMessage],
    name: &'static str,
) -> anyhow::Result<Phase> {
    // The input comes from another system in production (the chain monitor, on hosts of its
    // own): it is published, on a connection of its own, before the clock starts, so the
    // phase times what the function's host does — deliveries, the handler's transactions,
    // acks — as the direct phase times the handler on work already in hand. Published while
    // the consumer ran, the producer's CPU sat on the core the consumer and the database
    // share (--pin-broker), a cost no production function pays.
    let producer = Publisher::new(BrokerLink::connect(&services.settings.broker).await?);
    for chunk in messages.chunks(512) {
        for result in producer.publish_events(chunk).await {
            result.context("publishing a message")?;
        }
    }
    let shutdown = CancellationToken::new();
    let mut runner = Runner::new(services.clone());
    runner.add_function(handler);
    // The counters are process-wide: count from where they stand now.
    let before = processed_by(H::FUNCTION);
    let counters = Counters::read(&services.pool).await?;
    let started = Instant::now();
    let running = tokio::spawn(runner.run(shutdown.clone()));
    until_processed(H::FUNCTION, before, messages.len() as u64, started).await?;
    let phase = Phase {
        name,
        unit: "messages",
        count: messages.len(),
        elapsed: started.elapsed(),
        statements: Some(counters.since(&services.pool).await?),
    };
    shutdown.cancel();
    running.await??;
    Ok(phase)
}

/// A confirm handler's work driven directly on the database, as the runtime would hand it
/// over: a message for each of `ids` (`message`), in chunks of `batch`, with `concurrency`
/// messages in flight; `confirm` answers one chunk (the handler's `confirm_all`). Every
/// message must come out done or skipped.
pub(crate) async fn direct<M, F, Fut>(
    services: &Services,
    ids: Vec<u64>,
    batch: usize,
    concurrency: u16,
    name: &'static str,
    message: fn(u64) -> M,
    confirm: F,
) -> anyhow::Result<Phase>
where
    M: Send + 'static,
    F: Fn(Outbox, Vec<(M, uuid::Uuid)>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Vec<Result<Outcome, HandlerError>>> + Send,
{
    let work = Arc::new(ids);
    let outbox = services.outbox.clone();
    let counters = Counters::read(&services.pool).await?;
    let concurrency = (usize::from(concurrency) / batch).max(1);
    let elapsed = drive(work.len().div_ceil(batch), concurrency as u16, {
        let work = work.clone();
        move |b| {
            let (work, outbox, confirm) = (work.clone(), outbox.clone(), confirm.clone());
            async move {
                let chunk = &work[b * batch..((b + 1) * batch).min(work.len())];
                let confirmations: Vec<_> = chunk
                    .iter()
                    .map(|&id| (message(id), uuid::Uuid::now_v7()))
                    .collect();
                for (result, id) in confirm(outbox, confirmations).await.into_iter().zip(chunk) {
                    match result {
                        Ok(Outcome::Done | Outcome::Skipped(_)) => {}
                        Ok(other) => bail!("direct confirmation of {id}: {other:?}"),
                        Err(error) => return Err(error).context("direct confirmation"),
                    }
                }
                Ok(())
            }
        }
    })
    .await?;
    Ok(Phase {
        name,
        unit: "messages",
        count: work.len(),
        elapsed,
        statements: Some(counters.since(&services.pool).await?),
    })
}

/// Each id twice, the copies next to each other so duplicates really race.
pub(crate) fn doubled(ids: &[u64]) -> Vec<u64> {
    ids.iter().flat_map(|&id| [id, id]).collect()
}

/// `rounds` rounds of a (direct, through the broker) pair of phases, which one goes first
/// alternating, so that neither always meets the other's leftovers (its purge, its flushed
/// pages).
pub(crate) async fn alternating_rounds(
    rounds: u16,
    mut direct: impl AsyncFnMut() -> anyhow::Result<Phase>,
    mut through_broker: impl AsyncFnMut() -> anyhow::Result<Phase>,
) -> anyhow::Result<Vec<(Phase, Phase)>> {
    let mut pairs = Vec::with_capacity(usize::from(rounds));
    for round in 0..rounds {
        pairs.push(if round % 2 == 0 {
            let direct = direct().await?;
            (direct, through_broker().await?)
        } else {
            let through_broker = through_broker().await?;
            (direct().await?, through_broker)
        });
    }
    Ok(pairs)
}

/// Each round's two phases, under "round N:" when there are several.
pub(crate) fn print_rounds(rounds: &[(Phase, Phase)]) {
    for (round, (direct, through_broker)) in rounds.iter().enumerate() {
        if rounds.len() > 1 {
            println!("round {}:", round + 1);
        }
        direct.print();
        through_broker.print();
    }
}

/// A W2 bench's closing lines: through the broker against direct, and the useful transitions
/// (`items`, one per entity; the rest of the messages are duplicates) end to end against the
/// write ceiling.
/// W2's ratios against their targets: through the broker ≥ 0.85× direct with the broker on a
/// core of its own (`--pin-broker`, the production topology: Amazon MQ on hosts of its own),
/// and transitions end to end ≥ 0.5× the write ceiling with every process on both cores.
/// The other topology's figure is printed as information.
///
/// With several rounds (`(direct, through the broker)` each), each ratio is the rounds' median.
pub(crate) fn print_confirmation_ratios(
    rounds: &[(Phase, Phase)],
    ceiling: &Ceiling,
    items: usize,
    pinned: bool,
) {
    let ratios: Vec<f64> = rounds
        .iter()
        .map(|(direct, through_broker)| through_broker.rate() / direct.rate())
        .collect();
    if rounds.len() > 1 {
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "through the broker / direct, each round:    {} (the median below)",
            each.join(", ")
        );
    }
    // Three decimals where a verdict is printed: "0.85 ... NOT met" was a median of 0.849.
    let ratio = median(ratios).unwrap_or(f64::NAN);
    let transitions = median(
        rounds
            .iter()
            .map(|(_, through_broker)| items as f64 / through_broker.elapsed.as_secs_f64())
            .collect(),
    )
    .unwrap_or(f64::NAN);
    let of_ceiling = transitions / ceiling.rate();
    let verdict = |target_here: bool, value: f64, target: f64| {
        if target_here {
            format!("target >= {target:.2}: {}", met(value >= target))
        } else {
            "its target is the other topology's".to_owned()
        }
    };
    println!(
        "through the broker / direct:                 {ratio:.3}  ({}; broker {})",
        verdict(pinned, ratio, 0.85),
        if pinned {
            "on a core of its own"
        } else {
            "sharing the cores"
        }
    );
    println!(
        "transitions end to end: {transitions:.0} /s = {of_ceiling:.3} x the ceiling  ({})",
        verdict(!pinned, of_ceiling, 0.5)
    );
}

/// Publishes a copy of a message the workflow already sent (the duplicate every bench
/// delivers).
pub(crate) async fn publish_copy<M: Message>(services: &Services, data: M) -> anyhow::Result<()> {
    let copy = Envelope::new(data).to_outgoing()?;
    services
        .publisher()
        .publish_event(&copy)
        .await
        .context("publishing a duplicate")?;
    Ok(())
}

/// The middle value (the mean of the two middle ones for an even count); None for none.
pub(crate) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[mid]),
        _ => Some((values[mid - 1] + values[mid]) / 2.0),
    }
}

pub(crate) fn met(yes: bool) -> &'static str {
    if yes { "met" } else { "NOT met" }
}

/// Rows of the ceiling's table, as sysbench's default `--table-size`.
const CEILING_ROWS: u64 = 100_000;

/// The connection counts the ceiling is always measured at, besides the bench's own: on these
/// two cores it plateaus at 32-64 and falls above (8,650 /s at 64, 7,200 at 128, 6,600 at
/// 192), so a ceiling measured only at a workflow's higher `--concurrency` makes the workflow
/// look closer to it than it is ("0.56 x the ceiling: met" at 192, 0.41 against the best).
const CEILING_CONNECTIONS: [u16; 3] = [16, 32, 64];

/// Transactions per level at the least. The best of several levels is the best of several
/// noisy samples, so it leans high; half-second samples (W3's 4,000) swung 6,200-8,400 /s
/// within one run, and one-second ones lean less.
const CEILING_MIN_TRANSACTIONS: usize = 10_000;

/// The database's write ceiling: the best rate of [`oltp_write_only_phase`] over
/// [`CEILING_CONNECTIONS`] and the bench's `concurrency`, each level printed beside it.
pub(crate) struct Ceiling {
    best: Phase,
    /// (connections, transactions per second), in the order measured.
    levels: Vec<(u16, f64)>,
}

impl Ceiling {
    pub(crate) fn rate(&self) -> f64 {
        self.best.rate()
    }

    pub(crate) fn print(&self) {
        self.best.print();
        let levels: Vec<String> = self
            .levels
            .iter()
            .map(|(connections, rate)| format!("{connections} connections {rate:.0} /s"))
            .collect();
        println!("    the best of: {}", levels.join(", "));
    }
}

/// sysbench `oltp_write_only`, natively, at each of [`CEILING_CONNECTIONS`] and `concurrency`:
/// `transactions` transactions (at least [`CEILING_MIN_TRANSACTIONS`]) on that many tasks, each an indexed UPDATE, a non-indexed
/// UPDATE, a DELETE and the INSERT of the deleted id, by primary key on a table of 100k rows
/// (so the table keeps its size).
pub(crate) async fn database_ceiling(
    pool: &MySqlPool,
    transactions: usize,
    concurrency: u16,
) -> anyhow::Result<Ceiling> {
    sqlx::query(
        "CREATE TABLE bench_sbtest ( \
             id  INT UNSIGNED NOT NULL PRIMARY KEY, \
             k   INT UNSIGNED NOT NULL DEFAULT 0, \
             c   CHAR(120)    NOT NULL DEFAULT '', \
             pad CHAR(60)     NOT NULL DEFAULT '', \
             KEY k_1 (k)) ENGINE=InnoDB",
    )
    .execute(pool)
    .await?;
    for start in (1..=CEILING_ROWS).step_by(5_000) {
        let mut query =
            sqlx::QueryBuilder::<sqlx::MySql>::new("INSERT INTO bench_sbtest (id, k, c, pad) ");
        query.push_values(
            start..(start + 5_000).min(CEILING_ROWS + 1),
            |mut row, id| {
                row.push_bind(id)
                    .push_bind(id % 1_000)
                    .push("REPEAT('c', 119)")
                    .push("REPEAT('p', 59)");
            },
        );
        query.build().execute(pool).await?;
    }
    let mut connections = CEILING_CONNECTIONS.to_vec();
    connections.push(concurrency);
    connections.sort_unstable();
    connections.dedup();
    // A pool of its own, as large as the largest level: the bench's is sized for its own
    // concurrency, and tasks queueing for its connections would measure fewer than named.
    let ceiling_pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(u32::from(
            connections.iter().copied().max().unwrap_or(concurrency),
        ))
        .connect_with((*pool.connect_options()).clone())
        .await?;
    let transactions = transactions.max(CEILING_MIN_TRANSACTIONS);
    let mut best: Option<Phase> = None;
    let mut levels = Vec::with_capacity(connections.len());
    for connections in connections {
        let phase = oltp_write_only_phase(&ceiling_pool, transactions, connections).await?;
        levels.push((connections, phase.rate()));
        if best.as_ref().is_none_or(|best| phase.rate() > best.rate()) {
            best = Some(phase);
        }
    }
    ceiling_pool.close().await;
    let best = best.context("the ceiling measured no level")?;
    Ok(Ceiling { best, levels })
}

/// `transactions` sysbench `oltp_write_only` transactions on `concurrency` tasks.
async fn oltp_write_only_phase(
    pool: &MySqlPool,
    transactions: usize,
    concurrency: u16,
) -> anyhow::Result<Phase> {
    let counters = Counters::read(pool).await?;
    let elapsed = drive(transactions, concurrency, {
        let pool = pool.clone();
        move |i| {
            let pool = pool.clone();
            async move {
                // Spread like sysbench's uniform distribution, without a random generator.
                let id = (i as u64).wrapping_mul(2_654_435_761) % CEILING_ROWS + 1;
                let other = (i as u64).wrapping_mul(40_503) % CEILING_ROWS + 1;
                // sysbench retries a transaction that lost a deadlock; so does this.
                loop {
                    match oltp_write_only(&pool, id, other).await {
                        Err(e) if paybus_db::error_number(&e) == Some(1213) => continue,
                        other => return other.map_err(Into::into),
                    }
                }
            }
        }
    })
    .await?;
    Ok(Phase {
        name: "database ceiling (oltp_write_only shape)",
        unit: "transactions",
        count: transactions,
        elapsed,
        statements: Some(counters.since(pool).await?),
    })
}

/// One sysbench `oltp_write_only` transaction (its four writes, by primary key).
async fn oltp_write_only(pool: &MySqlPool, id: u64, other: u64) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE bench_sbtest SET k = k + 1 WHERE id = ?")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE bench_sbtest SET c = REPEAT('u', 119) WHERE id = ?")
        .bind(other)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM bench_sbtest WHERE id = ?")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO bench_sbtest (id, k, c, pad) \
         VALUES (?, ?, REPEAT('c', 119), REPEAT('p', 59))",
    )
    .bind(id)
    .bind(id % 1_000)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}
