//! `paybus-lab bench soak`: all four workflows at a steady rate for `--minutes`, with every
//! message delivered `--copies` times and no faults, on the chaos harness's stage (a MariaDB
//! and a RabbitMQ of the run's own, every function as its own OS process). Each window prints
//! what a leak, a drift or a backlog would show: the throughput and latency of every
//! workflow, every process's RSS, every table's size, the outbox backlog, the queues and the
//! dead letters. At the end the run must go quiet and pass chaos's exactly-once checks (exit 1
//! otherwise); the summary sets RSS growth, p99 drift and the backlog against their targets as
//! information, never as a failure.

mod disk;
pub(crate) mod figures;
mod plot;
mod redo;
mod report;
mod samples;

use std::{collections::BTreeMap, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::bail;

use self::{
    figures::{Throughput, Window},
    report::{Point, Series, SoakReport, Summary},
    samples::Sampler,
};
use crate::chaos::{
    OwnServices, Profile, checks, fleet,
    load::{self, Plan, Rates},
    stage::{Schema, Stage},
};
use crate::finished::{Finished, Workflow, finished};

#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// (soak) How long the load lasts.
    #[arg(long, default_value_t = 30.0)]
    pub minutes: f64,
    /// (soak) The length of a window (0.25: 15 seconds). The first ones are the warm-up: as
    /// many as the continuous auditor's passes take to read their steady span (its interval
    /// plus its overlap, at most its window: 3 minutes by default), at least one.
    #[arg(long, default_value_t = 5.0)]
    pub window_minutes: f64,
    /// (soak) Items per second of one workflow, repeatable: `--rate p2p=38`,
    /// `confirmations=`, `bonuses=`, `markets=`. The defaults are half of what each bench
    /// measured alone (docs/benchmarks.md, latest entries): p2p 38 deposit orders/s (W1 76/s
    /// inline at 32 buyers), confirmations 800/s (W2 ~1,600 withdrawal confirmations/s and
    /// 1,700 deposit transitions/s through the broker), bonuses 300 payment completions/s
    /// (W3 617–731 grants/s end to end, ~1.1 grants a completion), markets 500 orders
    /// placed/s (W4 ~1,050 cancels/s end to end). The four at once are more than one 2-core
    /// machine does: the soak then shows where it falls behind.
    #[arg(long = "rate", value_parser = parse_rate)]
    pub rates: Vec<(Workflow, f64)>,
    /// (soak) Every message delivered this many times (the duplicator's copies).
    #[arg(long, default_value_t = 3)]
    pub copies: u32,
    /// (soak) Sample every process's RSS and the queues this often (the plot's resolution).
    #[arg(long, default_value_t = 10)]
    pub sample_seconds: u64,
    /// (soak) Give up waiting for quiescence after the load after this long (a violation).
    #[arg(long, default_value_t = 600)]
    pub quiescence_timeout_s: u64,
    /// (soak) Print the report as JSON instead of a table (the windows go to stderr as they
    /// come).
    #[arg(long)]
    pub json: bool,
    /// (soak) Where to write the plot (SVG; default `soak.svg` in the state folder).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// (soak) Where the run's MariaDB, RabbitMQ and process logs live (wiped at the start;
    /// default `.local/soak` in the repository).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// (soak) Where the function binaries are (default: next to this `paybus-lab`; build them
    /// with `cargo build --workspace --bins`).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
}

/// Every workflow's items per second and p99 in buckets of `bucket` from `started_at` to now
/// (the run is quiet: everything has finished), for the plot.
async fn series(
    pool: &sqlx::MySqlPool,
    started_at: chrono::DateTime<chrono::Utc>,
    bucket: Duration,
) -> anyhow::Result<Vec<Series>> {
    let now: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT NOW(6)").fetch_one(pool).await?;
    let bucket_us = i64::try_from(bucket.as_micros()).unwrap_or(i64::MAX).max(1);
    let mut all = Vec::with_capacity(Workflow::ALL.len());
    for workflow in Workflow::ALL {
        let mut buckets: BTreeMap<i64, Vec<Finished>> = BTreeMap::new();
        for item in finished(pool, workflow, started_at, now).await? {
            buckets
                .entry(item.at_us / bucket_us)
                .or_default()
                .push(item);
        }
        let points = buckets
            .into_iter()
            .map(|(n, items)| {
                let figures = Throughput::of(workflow, &items, bucket.as_secs_f64());
                Point {
                    // The bucket's middle.
                    at_s: (n as f64 + 0.5) * bucket.as_secs_f64(),
                    per_second: figures.per_second,
                    p99_ms: figures.p99_ms,
                }
            })
            .collect();
        all.push(Series { workflow, points });
    }
    Ok(all)
}

fn parse_rate(text: &str) -> Result<(Workflow, f64), String> {
    let (name, rate) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not WORKFLOW=PER_SECOND"))?;
    let workflow = Workflow::ALL
        .into_iter()
        .find(|w| w.name() == name)
        .ok_or_else(|| format!("{name:?}: one of p2p, confirmations, bonuses, markets"))?;
    let rate: f64 = rate
        .parse()
        .map_err(|e| format!("{rate:?} is not a rate: {e}"))?;
    if !(rate > 0.0 && rate.is_finite()) {
        return Err(format!("{name}={rate}: a rate is more than 0 per second"));
    }
    Ok((workflow, rate))
}

/// Half of each bench's figure (see `--rate`).
const DEFAULT_RATES: Rates = Rates {
    p2p: 38.0,
    confirmations: 800.0,
    bonuses: 300.0,
    markets: 500.0,
};

/// The resolved run.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct SoakPlan {
    pub(crate) rates: Rates,
    #[serde(serialize_with = "crate::chaos::report::seconds")]
    pub(crate) lasting: Duration,
    #[serde(serialize_with = "crate::chaos::report::seconds")]
    pub(crate) window: Duration,
    pub(crate) windows: u32,
    /// The first windows, not compared: until the continuous auditor's passes read their
    /// steady span (`AuditorConfig::steady_span`: a pass's cost, the sweeper's largest,
    /// grows with the rows it reads until then), and at least the first (caches, pools, the
    /// first runs of every path).
    pub(crate) warm_up_windows: u32,
    pub(crate) copies: u32,
    pub(crate) concurrency: u16,
}

impl SoakPlan {
    /// The plot's resolution: a fifth of a window, at least 10 s (fewer items than that make
    /// a p99 of noise).
    fn bucket(&self) -> Duration {
        (self.window / 5).max(Duration::from_secs(10))
    }
}

fn plan_of(args: &SoakArgs, concurrency: u16) -> anyhow::Result<SoakPlan> {
    if !(args.minutes > 0.0 && args.window_minutes > 0.0) {
        bail!("--minutes and --window-minutes must be more than 0");
    }
    if args.copies == 0 || args.sample_seconds == 0 {
        bail!("--copies and --sample-seconds must be at least 1");
    }
    let mut rates = DEFAULT_RATES;
    for (workflow, rate) in &args.rates {
        let slot = match workflow {
            Workflow::P2p => &mut rates.p2p,
            Workflow::Confirmations => &mut rates.confirmations,
            Workflow::Bonuses => &mut rates.bonuses,
            Workflow::Markets => &mut rates.markets,
        };
        *slot = *rate;
    }
    let lasting = Duration::from_secs_f64(args.minutes * 60.0);
    let window = Duration::from_secs_f64(args.window_minutes * 60.0).min(lasting);
    // The fleet inherits this process's environment: its auditor runs with these settings.
    let auditor_span = paybus_maintenance::auditor::AuditorConfig::from_env()?.steady_span();
    Ok(SoakPlan {
        rates,
        lasting,
        window,
        windows: (lasting.as_secs_f64() / window.as_secs_f64()).ceil() as u32,
        warm_up_windows: ((auditor_span.as_secs_f64() / window.as_secs_f64()).ceil() as u32).max(1),
        copies: args.copies,
        concurrency,
    })
}

pub(crate) async fn run(args: &SoakArgs, concurrency: u16) -> anyhow::Result<ExitCode> {
    let plan = plan_of(args, concurrency)?;
    crate::chaos::refuse_another_layout(
        &Default::default(),
        "the soak runs on the default topology",
    )?;
    let binaries = fleet::binaries(&fleet::bin_dir(args.bin_dir.as_deref())?, &[])?;
    let state_dir = crate::chaos::state_dir(args.state_dir.as_deref(), ".local/soak")?;
    let plot_path = match &args.plot {
        Some(path) => std::path::absolute(path)?,
        None => state_dir.join("soak.svg"),
    };
    eprintln!(
        "soak: {:.1} minutes in windows of {:.1}, starting MariaDB and RabbitMQ of its own in {}",
        plan.lasting.as_secs_f64() / 60.0,
        plan.window.as_secs_f64() / 60.0,
        state_dir.display()
    );
    let own = OwnServices::start(state_dir.clone(), 1).await?;
    let result = soak(&plan, args, &own, &binaries, &state_dir).await;
    own.shut_down().await?;
    let mut report = result?;
    // The plot is written after the services are gone: it needs nothing but the figures.
    match plot::draw(&report, &plot_path) {
        Ok(()) => report.plot = Some(plot_path),
        Err(e) => eprintln!("soak: no plot: {e:#}"),
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.summary_text());
    }
    Ok(if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn soak(
    plan: &SoakPlan,
    args: &SoakArgs,
    own: &OwnServices,
    binaries: &[fleet::Binary],
    state_dir: &std::path::Path,
) -> anyhow::Result<SoakReport> {
    let r = plan.rates;
    let profile = Profile {
        name: "soak",
        items: ((r.p2p + r.confirmations + r.bonuses + r.markets) * plan.lasting.as_secs_f64())
            as usize,
        copies: plan.copies,
        // Only duplicates: a dead letter in a soak is a finding, never an injected one.
        malformed_every: u64::MAX,
        late_trades_first: 0,
        kill_every: Duration::ZERO,
        broker_restarts: 0,
        broker_nodes: 1,
        broker_node_kills: 0,
        database_restarts: 0,
        webhook_outage: Duration::ZERO,
        late_webhooks: 0,
        network_faults: false,
        partition: Duration::ZERO,
        fault_window: Duration::ZERO,
        quiescence_timeout: Duration::from_secs(args.quiescence_timeout_s),
        seed: 0,
        concurrency: plan.concurrency,
        shards: 1,
        markets: load::MarketCadence::HUNDREDS,
    };
    // No network of its own: a soak measures, it does not break.
    let stage = Stage::start(&profile, own, binaries, state_dir, false, Schema::Current).await?;
    let pool = stage.services.pool.clone();
    let sampler = Sampler::start(
        stage.fleet.clone(),
        stage.services.clone(),
        state_dir,
        Duration::from_secs(args.sample_seconds),
    );
    let started = sampler.started();
    let echo_to_stderr = args.json;
    let windows = async {
        let mut meter = figures::Meter::start(&pool).await?;
        let mut windows: Vec<Window> = Vec::new();
        for n in 1..=plan.windows {
            let end = started + (plan.window * n).min(plan.lasting);
            tokio::time::sleep_until(end.into()).await;
            let warm_up = n <= plan.warm_up_windows;
            let window = meter.window(n, warm_up, sampler.window_end().await).await?;
            let text = window.to_string();
            if echo_to_stderr {
                eprint!("{text}");
            } else {
                print!("{text}");
            }
            windows.push(window);
        }
        anyhow::Ok((windows, meter.started_at))
    };
    let (load, windows) = tokio::join!(
        load::run_plan(
            &profile,
            &stage.api,
            &stage.outside,
            &pool,
            Plan::Paced(plan.rates, plan.lasting)
        ),
        windows
    );
    // Stopped before the ending, which takes the fleet back from it.
    let samples = sampler.stop().await;
    let load = load?;
    let (windows, started_at) = windows?;
    let load_sent = started.elapsed();
    eprintln!(
        "soak: load sent in {:.0} s; waiting for quiescence (at most {} s), then the checks",
        load_sent.as_secs_f64(),
        profile.quiescence_timeout.as_secs()
    );
    let ending = stage.finish(&load, profile.quiescence_timeout).await?;
    let stuck = checks::not_terminal(&pool).await?;
    let summary = Summary::of(&windows, &stuck);
    let series = series(&pool, started_at, plan.bucket()).await?;
    Ok(SoakReport {
        plan: plan.clone(),
        windows,
        samples,
        series,
        summary,
        load,
        load_sent,
        time_to_quiescence: ending.time_to_quiescence,
        peak_queue_depth: ending.peak_queue_depth,
        messages_seen: ending.messages_seen,
        copies_published: ending.copies_published,
        dead_letters: ending.dead_letters,
        violations: ending.violations,
        state_dir: state_dir.to_path_buf(),
        plot: None,
    })
}
