//! `paybus-lab chaos`: a fault-injection run that proves exactly-once effects across every
//! workflow (docs/chaos.md).
//!
//! It owns everything it breaks: a MariaDB server and a RabbitMQ node (or a cluster of three) of
//! its own on free ports, never the shared instances; the real function binaries as separate OS
//! processes, so a SIGKILL is a real crash; a quote service stub and a partner endpoint. It
//! drives a mixed load through the public entry points, delivers every message `--copies` times
//! plus one malformed message in `--malformed-every`, and meanwhile kills function processes,
//! restarts the broker and the database (and SIGKILLs cluster nodes), and makes the quote
//! service and the partner endpoint slow or failing for a while.
//!
//! Then it waits (bounded) for quiescence and checks, from the database and the broker, that
//! every item is terminal, the audit is clean, every malformed message and no unexplained other
//! is a dead letter, no queue holds a message and every webhook was delivered or FAILED. Exit 1
//! on any violation.

mod broker;
pub(crate) mod checks;
mod deploy;
pub(crate) mod duplicator;
mod faults;
pub(crate) mod fleet;
pub(crate) mod load;
pub(crate) mod network;
pub(crate) mod outside;
pub(crate) mod report;
pub(crate) mod stage;
pub(crate) mod timeline;
pub(crate) mod upgrade;

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use anyhow::bail;
use paybus_config::{Settings, Shards};
use paybus_lab::services::PrivateService;

use self::broker::OwnBroker;
use tokio_util::sync::CancellationToken;

use self::{
    deploy::{DeployFigures, Deployed},
    faults::Fault,
    load::MarketCadence,
    report::{Figures, Report},
    stage::{Schema, Stage},
};

/// What breaks during a run: the chaos schedule's faults, or a rolling deploy of every process
/// to another release and back (`paybus-lab upgrade`).
pub(crate) enum Schedule {
    Faults,
    Deploy(Box<deploy::Plan>),
}

/// What the schedule did.
enum Played {
    Faults(Vec<Fault>),
    Deploy(Box<(deploy::Plan, Deployed)>),
}

/// How much load and how many faults: `--quick` (CI) or the full profile, each value
/// overridable on the command line.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// The CI profile: ~200 items, a kill every 3 s, one broker and one database restart,
    /// a 6 s webhook outage, one RabbitMQ node. Without it: the full profile (10,000 items, a
    /// kill every 2 s, two broker restarts, two SIGKILLs of a broker node, one database
    /// restart, a 30 s webhook outage, a three-node RabbitMQ cluster).
    #[arg(long)]
    pub quick: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Workflow items in all (split W1 20 %, W2 30 %, W3 20 %, W4 30 %).
    #[arg(long)]
    pub items: Option<usize>,
    /// SIGKILL a random function process this often (0: never).
    #[arg(long)]
    pub kill_every_ms: Option<u64>,
    /// Broker restarts during the run (clean; on a cluster, one node at a time).
    #[arg(long)]
    pub broker_restarts: Option<u32>,
    /// RabbitMQ nodes: 1, or 3 (a cluster; every process gets every node's URL and fails
    /// over).
    #[arg(long)]
    pub broker_nodes: Option<usize>,
    /// SIGKILLs of a random broker node (started again at once) during the run; needs a
    /// cluster (`--broker-nodes 3`).
    #[arg(long)]
    pub broker_node_kills: Option<u32>,
    /// Database restarts (SIGKILL, then start: a crash) during the run.
    #[arg(long)]
    pub database_restarts: Option<u32>,
    /// How long the partner webhook endpoint answers 503.
    #[arg(long)]
    pub webhook_outage_ms: Option<u64>,
    /// Faults go on for at least this long (and until the load is sent).
    #[arg(long)]
    pub fault_window_s: Option<u64>,
    /// Give up waiting for quiescence after this long (a violation).
    #[arg(long)]
    pub quiescence_timeout_s: Option<u64>,
    /// Deliveries of every message (the original and copies published at once).
    #[arg(long, default_value_t = 3)]
    pub copies: u32,
    /// One malformed message is injected per this many messages seen.
    #[arg(long, default_value_t = 100)]
    pub malformed_every: u64,
    /// The run's first this many trades are answered after the client's timeout, having been
    /// made: the quote phases alone may come while no createTrade is in flight (a quick run's
    /// orders can all be matched before the first late phase), and a run without a late trade
    /// would pass without testing principle 12's *unknown*. Five by default, so that some of
    /// them are match-deposit's own first calls: the sweeper's due-orders job makes attempts
    /// too, and its re-asks of fills in doubt can take some of them.
    #[arg(long, default_value_t = 5)]
    pub late_trades_first: u32,
    /// Seed of the fault schedule's random choices (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where the run's MariaDB, RabbitMQ and process logs live (wiped at the start; default
    /// `.local/chaos` in the repository).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Where to write the run's timeline (SVG: throughput, queue depth and fills in doubt over
    /// time, every fault as a band; default `timeline.svg` in the state folder).
    #[arg(long)]
    pub timeline: Option<PathBuf>,
    /// Where the function binaries are (default: next to this `paybus-lab`; build them first
    /// with `cargo build --workspace --bins`).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Spread every function's messages over this many queues (PAYBUS_SHARDS for the whole
    /// run: the harness's topology and every process's): exactly-once must not depend on it.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub shards: u16,
    /// Keep the network out of it: every process on the host, no namespaces, relays or
    /// network faults (the process-level faults only).
    #[arg(long)]
    pub no_network_faults: bool,
    /// Run another binary as one function, e.g. a deliberately broken build:
    /// `--substitute confirm-withdrawal=/path/to/binary` (repeatable).
    #[arg(long = "substitute", value_parser = parse_substitute)]
    pub substitutes: Vec<(String, PathBuf)>,
}

fn parse_substitute(text: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not FUNCTION=PATH"))?;
    Ok((name.to_owned(), PathBuf::from(path)))
}

/// The resolved run: the profile with the overrides applied.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Profile {
    pub name: &'static str,
    pub items: usize,
    pub copies: u32,
    pub malformed_every: u64,
    /// `--late-trades-first`.
    pub late_trades_first: u32,
    pub kill_every: Duration,
    pub broker_restarts: u32,
    /// RabbitMQ nodes the run starts (3: a cluster).
    pub broker_nodes: usize,
    pub broker_node_kills: u32,
    pub database_restarts: u32,
    pub webhook_outage: Duration,
    /// POSTs the partners' endpoint takes and answers after the sender's timeout.
    pub late_webhooks: u64,
    /// Network faults between the functions and the database or broker (namespaces, relays).
    pub network_faults: bool,
    /// How long a network partition lasts.
    pub partition: Duration,
    pub fault_window: Duration,
    pub quiescence_timeout: Duration,
    pub seed: u64,
    /// Requests in flight per workflow driver.
    pub concurrency: u16,
    /// Queues per function (`--shards`; 1: the default topology).
    pub shards: u16,
    pub markets: MarketCadence,
}

impl Profile {
    /// The CI profile (`--quick`): one RabbitMQ node, a short fault window, every fault kind
    /// once; its seed is set by `from_args`.
    pub(crate) fn quick() -> Self {
        Self {
            name: "quick",
            items: 200,
            copies: 3,
            malformed_every: 100,
            late_trades_first: 5,
            kill_every: Duration::from_secs(3),
            broker_restarts: 1,
            broker_nodes: 1,
            broker_node_kills: 0,
            database_restarts: 1,
            webhook_outage: Duration::from_secs(6),
            late_webhooks: 3,
            network_faults: true,
            partition: Duration::from_secs(12),
            fault_window: Duration::from_secs(30),
            quiescence_timeout: Duration::from_secs(180),
            seed: 0,
            concurrency: 8,
            shards: 1,
            markets: MarketCadence::HUNDREDS,
        }
    }

    fn from_args(args: &ChaosArgs) -> anyhow::Result<Self> {
        let mut profile = if args.quick {
            Self::quick()
        } else {
            Self {
                name: "full",
                items: 10_000,
                copies: 3,
                malformed_every: 100,
                late_trades_first: 5,
                kill_every: Duration::from_secs(2),
                broker_restarts: 2,
                broker_nodes: 3,
                broker_node_kills: 2,
                database_restarts: 1,
                webhook_outage: Duration::from_secs(30),
                late_webhooks: 20,
                network_faults: true,
                partition: Duration::from_secs(20),
                fault_window: Duration::from_secs(120),
                quiescence_timeout: Duration::from_secs(600),
                seed: 0,
                concurrency: 32,
                shards: 1,
                markets: MarketCadence::HUNDREDS,
            }
        };
        if let Some(items) = args.items {
            profile.items = items;
        }
        if let Some(ms) = args.kill_every_ms {
            profile.kill_every = Duration::from_millis(ms);
        }
        if let Some(n) = args.broker_restarts {
            profile.broker_restarts = n;
        }
        if let Some(n) = args.broker_nodes {
            if !OwnBroker::NODE_COUNTS.contains(&n) {
                bail!("--broker-nodes must be 1 or 3 (a cluster whose majority survives a kill)");
            }
            profile.broker_nodes = n;
            // A single node cannot take a node kill (it can stay leaderless after it); a quick
            // run asked onto a cluster takes one.
            if args.broker_node_kills.is_none() {
                profile.broker_node_kills = match (n, profile.broker_node_kills) {
                    (1, _) => 0,
                    (_, 0) => 1,
                    (_, kills) => kills,
                };
            }
        }
        if let Some(n) = args.broker_node_kills {
            profile.broker_node_kills = n;
        }
        if profile.broker_node_kills > 0 && profile.broker_nodes == 1 {
            bail!(
                "--broker-node-kills needs a cluster (--broker-nodes 3): a single RabbitMQ node \
                 can stay without a quorum queue leader after a SIGKILL"
            );
        }
        if let Some(n) = args.database_restarts {
            profile.database_restarts = n;
        }
        if let Some(ms) = args.webhook_outage_ms {
            profile.webhook_outage = Duration::from_millis(ms);
        }
        if let Some(s) = args.fault_window_s {
            profile.fault_window = Duration::from_secs(s);
        }
        if let Some(s) = args.quiescence_timeout_s {
            profile.quiescence_timeout = Duration::from_secs(s);
        }
        profile.network_faults = !args.no_network_faults;
        profile.copies = args.copies;
        profile.malformed_every = args.malformed_every;
        profile.late_trades_first = args.late_trades_first;
        profile.shards = args.shards;
        profile.seed = args.seed.unwrap_or_else(seed_from_clock);
        if profile.items < 20 {
            bail!("--items must be at least 20 (every workflow gets a share)");
        }
        if profile.copies == 0 || profile.malformed_every == 0 {
            bail!("--copies and --malformed-every must be at least 1");
        }
        Ok(profile)
    }
}

impl Profile {
    /// Every catalog function on `shards` queues.
    pub(crate) fn layout(&self) -> Shards {
        paybus_catalog::FUNCTIONS
            .iter()
            .fold(Default::default(), |layout: Shards, f| {
                layout.with(f.name, self.shards)
            })
    }
}

/// A run's seed when none is asked for.
fn seed_from_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

/// The share of the fault window the load is spread over.
const LOAD_SHARE_OF_WINDOW: f64 = 0.8;

/// A small deterministic generator for the fault schedule (reproducible with `--seed`).
#[derive(Debug, Clone)]
pub(crate) struct Dice(u64);

impl Dice {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// A number in `0..n` (xorshift64*).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x % n.max(1) as u64) as usize
    }
}

/// The repository this binary was built from (the lab's crate is `tests/lab/`): where
/// `infra/local`'s scripts and `.local/` are.
fn repository_dir() -> PathBuf {
    let lab = Path::new(env!("CARGO_MANIFEST_DIR"));
    lab.ancestors().nth(2).unwrap_or(lab).to_path_buf()
}

/// The run's own MariaDB and RabbitMQ, in one state folder.
pub(crate) struct OwnServices {
    mariadb: Arc<PrivateService>,
    rabbitmq: Arc<OwnBroker>,
}

impl OwnServices {
    /// Kills what a previous run in `state_dir` left running, wipes it, starts both.
    pub(crate) async fn start(state_dir: PathBuf, broker_nodes: usize) -> anyhow::Result<Self> {
        tokio::task::spawn_blocking(move || {
            // A previous run killed before its end left its servers running: kill them by
            // their pid files. Everything that names a service is overridden, so that a
            // missing pid file can never make the script fall back to the default node or
            // socket (the developer's or CI's shared instances).
            let stop = repository_dir().join("infra/local/stop.sh");
            let _ = std::process::Command::new(stop)
                .args(["--kill", "mariadb", "rabbitmq"])
                .env("PAYBUS_STATE_DIR", &state_dir)
                .env(
                    "PAYBUS_RABBITMQ_NODENAME",
                    "paybus-chaos-leftover@localhost",
                )
                .env("PAYBUS_AMQP_PORT", "1")
                .env("PAYBUS_MARIADB_PORT", "1")
                .stdin(std::process::Stdio::null())
                .output();
            OwnBroker::kill_leftover_cluster(&state_dir);
            fleet::kill_leftovers(&state_dir.join("logs"));
            let _ = std::fs::remove_dir_all(&state_dir);
            std::fs::create_dir_all(state_dir.join("logs"))?;
            let mariadb = PrivateService::start_mariadb_in(state_dir.clone());
            let rabbitmq = OwnBroker::start(&state_dir, broker_nodes);
            anyhow::Ok(Self {
                mariadb: Arc::new(mariadb),
                rabbitmq: Arc::new(rabbitmq),
            })
        })
        .await?
    }

    /// Kills both, keeping the state folder (the logs) for whoever reads the report.
    pub(crate) async fn shut_down(self) -> anyhow::Result<()> {
        let Self { mariadb, rabbitmq } = self;
        tokio::task::spawn_blocking(move || {
            // The run has ended, so these are the last handles.
            if let Ok(mariadb) = Arc::try_unwrap(mariadb) {
                mariadb.kill_keeping_state();
            }
            if let Ok(rabbitmq) = Arc::try_unwrap(rabbitmq) {
                rabbitmq.kill_keeping_state();
            }
        })
        .await?;
        Ok(())
    }

    /// The harness's own settings: the run's database, the broker's nodes from node 1, and the
    /// run's queue layout.
    fn settings(&self, layout: &Shards) -> anyhow::Result<Settings> {
        let mut settings = Settings::from_vars(
            [
                ("PAYBUS_DATABASE_URL", self.mariadb.url.as_str()),
                // The harness's own reads (fixture lookups, the soak's windows, the checks):
                // the API is a process of its own with its own pool. A loaded machine (the
                // suite beside it) must slow them, not fail the run.
                ("PAYBUS_DB_MAX_CONNECTIONS", "16"),
                ("PAYBUS_DB_ACQUIRE_TIMEOUT_MS", "30000"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        )?;
        settings.broker = self.rabbitmq.settings(&settings.broker, 1);
        settings.broker.prefetch = 32;
        settings.broker.shards = layout.clone();
        Ok(settings)
    }
}

pub async fn run(args: ChaosArgs) -> anyhow::Result<ExitCode> {
    let profile = Profile::from_args(&args)?;
    // The layout is the harness's settings' (the checks ask the catalog for its queues) and
    // every function process's (their environment).
    let layout = profile.layout();
    refuse_another_layout(&layout, "run chaos with --shards instead")?;
    let binaries = fleet::binaries(&fleet::bin_dir(args.bin_dir.as_deref())?, &args.substitutes)?;
    let state_dir = state_dir(args.state_dir.as_deref(), ".local/chaos")?;
    let timeline_path = match &args.timeline {
        Some(path) => std::path::absolute(path)?,
        None => state_dir.join("timeline.svg"),
    };
    eprintln!(
        "chaos ({} profile, seed {}): starting MariaDB and RabbitMQ ({} node{}) of its own in {}",
        profile.name,
        profile.seed,
        profile.broker_nodes,
        if profile.broker_nodes == 1 { "" } else { "s" },
        state_dir.display()
    );
    let own = OwnServices::start(state_dir.clone(), profile.broker_nodes).await?;
    let result = drive(
        &profile,
        &own,
        &binaries,
        &state_dir,
        Schema::Current,
        Schedule::Faults,
    )
    .await;
    own.shut_down().await?;
    finish_report(result?, &timeline_path, args.json)
}

/// Draws the run's timeline at `path` and prints the report; the exit code.
fn finish_report(
    (mut report, timeline): (Report, timeline::Timeline),
    timeline_path: &Path,
    json: bool,
) -> anyhow::Result<ExitCode> {
    // Drawn after the services are gone (it needs nothing but the figures), and never the
    // run's failure: the report says why there is no picture.
    let bands = timeline.bands(&report);
    if let Some(why) = timeline.throughput_error() {
        eprintln!("chaos: the timeline's throughput: {why}");
    }
    match timeline.draw(&report, bands, timeline_path) {
        Ok(()) => report.timeline = Some(timeline_path.to_path_buf()),
        Err(e) => {
            eprintln!("chaos: no timeline: {e:#}");
            report.timeline_not_drawn = Some(format!("{e:#}"));
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `--state-dir`, or `default` in the repository; absolute.
/// Refuses to run when the environment's `PAYBUS_SHARDS` names another layout than the run's:
/// the processes the run starts get the run's, so the variable would mislead whoever set it.
pub(crate) fn refuse_another_layout(layout: &Shards, instead: &str) -> anyhow::Result<()> {
    match std::env::var(Shards::VARIABLE) {
        Ok(text)
            if !text.trim().is_empty() && Shards::parse(&text).ok().as_ref() != Some(layout) =>
        {
            anyhow::bail!("{}={text} is set: {instead}", Shards::VARIABLE)
        }
        _ => Ok(()),
    }
}

pub(crate) fn state_dir(asked: Option<&Path>, default: &str) -> anyhow::Result<PathBuf> {
    let dir = asked.map_or_else(|| repository_dir().join(default), Path::to_path_buf);
    Ok(std::path::absolute(&dir)?)
}

async fn drive(
    profile: &Profile,
    own: &OwnServices,
    binaries: &[fleet::Binary],
    state_dir: &Path,
    schema: Schema<'_>,
    schedule: Schedule,
) -> anyhow::Result<(Report, timeline::Timeline)> {
    let stage = Stage::start(
        profile,
        own,
        binaries,
        state_dir,
        profile.network_faults,
        schema,
    )
    .await?;
    let started = stage.started;
    let zero_on_the_wall = chrono::Utc::now() - started.elapsed();
    let pool = stage.services.pool.clone();
    let slots = stage.slots.clone();

    let faults_stop = CancellationToken::new();
    let faults = match schedule {
        Schedule::Faults => {
            let faults = faults::run(
                profile.clone(),
                stage.fleet.clone(),
                own.mariadb.clone(),
                own.rabbitmq.clone(),
                stage.outside.clone(),
                stage.network.clone().map(|network| faults::Net {
                    network,
                    slots: stage.slots.clone(),
                }),
                faults_stop.clone(),
            );
            tokio::spawn(async move { Played::Faults(faults.await) })
        }
        Schedule::Deploy(plan) => {
            stage
                .outside
                .quotes
                .answer_next_trades_after(profile.late_trades_first, faults::LATE_ANSWER);
            let deployed = deploy::run(
                (*plan).clone(),
                stage.fleet.clone(),
                stage.api.clone(),
                pool.clone(),
                started,
            );
            tokio::spawn(async move { Played::Deploy(Box::new((*plan, deployed.await))) })
        }
    };
    // The load spreads over most of the fault window, so every fault meets requests and
    // messages in flight.
    let load = load::run_plan(
        profile,
        &stage.api,
        &stage.outside,
        &stage.services.pool,
        load::Plan::Spread(
            profile.items,
            profile.fault_window.mul_f64(LOAD_SHARE_OF_WINDOW),
        ),
    )
    .await;
    let load_sent = started.elapsed();
    // The faults run at least their window, then stop.
    let window_left = profile.fault_window.saturating_sub(started.elapsed());
    tokio::time::sleep(window_left).await;
    faults_stop.cancel();
    let (fault_log, deployed) = match faults.await? {
        Played::Faults(log) => (log, None),
        Played::Deploy(played) => {
            let (plan, mut deployed) = *played;
            (std::mem::take(&mut deployed.steps), Some((plan, deployed)))
        }
    };
    let load = load?;

    let outside = stage.outside.clone();
    let ending = stage.finish(&load, profile.quiescence_timeout).await?;
    let timeline = timeline::Timeline::read(&pool, &ending.recording, started, slots).await;
    let mut violations = ending.violations;
    violations.extend(
        fault_log
            .iter()
            .filter(|fault| fault.what.ends_with("FAILED"))
            .filter(|_| deployed.is_none())
            .map(|fault| checks::violation("fault_not_applied", fault.what.clone())),
    );
    let deploy = match deployed {
        Some((plan, deployed)) => {
            violations.extend(deployed.violations);
            let mut figures =
                DeployFigures::of(&plan, &fault_log, deployed.on_new, deployed.migrations);
            let mut phases = deploy::Phase::stretches(
                &fault_log,
                started.elapsed().as_secs_f64(),
                &figures.from.version,
                &figures.to.version,
            );
            // A schema the run broke on purpose may not have the workflows' timestamps.
            if deploy::Phase::count(&mut phases, &pool, zero_on_the_wall)
                .await
                .is_ok()
            {
                figures.phases = phases;
            }
            Some(figures)
        }
        None => None,
    };
    let report = Report {
        seed: profile.seed,
        profile: profile.clone(),
        figures: Figures {
            load_sent,
            time_to_quiescence: ending.time_to_quiescence,
            total: started.elapsed(),
            peak_queue_depth: ending.peak_queue_depth,
            broker_node_kills: fault_log
                .iter()
                .filter(|fault| {
                    fault.what.starts_with(faults::BROKER_NODE_KILL)
                        && !fault.what.ends_with("FAILED")
                })
                .count() as u64,
            messages_seen: ending.messages_seen,
            copies_published: ending.copies_published,
            malformed_injected: ending.malformed_injected,
            quote_calls: outside.quotes.quote_calls(),
            trade_calls: outside.quotes.trade_calls(),
            late_trades: outside
                .quotes
                .trades_answered_after(self::outside::QUOTE_TIMEOUT),
            webhook_posts: outside.webhooks.posts(),
            webhook_refused: outside.webhooks.refused(),
            webhooks: ending.webhooks,
            network: ending.network,
            api_kills: fault_log
                .iter()
                .filter(|fault| fault.what == format!("SIGKILL {}", outside::API_PROCESS))
                .count() as u64,
        },
        load,
        faults: fault_log,
        process_exits: ending.process_exits,
        counts: ending.counts,
        dead_letters: ending.dead_letters,
        violations,
        state_dir: state_dir.to_path_buf(),
        timeline: None,
        timeline_not_drawn: None,
        deploy,
    };
    Ok((report, timeline))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        chaos: ChaosArgs,
    }

    fn profile(args: &[&str]) -> anyhow::Result<Profile> {
        let command =
            Command::try_parse_from(std::iter::once("chaos").chain(args.iter().copied()))?;
        Profile::from_args(&command.chaos)
    }

    #[test]
    fn the_full_profile_runs_on_a_cluster_and_kills_its_nodes_and_quick_on_one_node() {
        let full = profile(&[]).unwrap();
        assert_eq!((full.broker_nodes, full.broker_node_kills), (3, 2));
        let quick = profile(&["--quick"]).unwrap();
        assert_eq!((quick.broker_nodes, quick.broker_node_kills), (1, 0));
    }

    #[test]
    fn a_quick_run_asked_onto_a_cluster_kills_one_node_and_a_full_one_on_a_node_none() {
        let quick = profile(&["--quick", "--broker-nodes", "3"]).unwrap();
        assert_eq!(quick.broker_node_kills, 1);
        let full = profile(&["--broker-nodes", "1"]).unwrap();
        assert_eq!(full.broker_node_kills, 0);
    }

    #[test]
    fn shards_lay_out_every_function_and_default_to_the_unsharded_topology() {
        assert!(profile(&["--quick"]).unwrap().layout().is_empty());
        let four = profile(&["--quick", "--shards", "4"]).unwrap().layout();
        for function in paybus_catalog::FUNCTIONS {
            assert_eq!(four.of(function.name), 4, "{}", function.name);
        }
        assert!(profile(&["--quick", "--shards", "0"]).is_err());
    }

    #[test]
    fn node_kills_on_a_single_node_or_a_two_node_cluster_are_refused() {
        let error = profile(&["--quick", "--broker-node-kills", "1"]).unwrap_err();
        assert!(error.to_string().contains("--broker-nodes 3"), "{error}");
        let error = profile(&["--broker-nodes", "2"]).unwrap_err();
        assert!(error.to_string().contains("1 or 3"), "{error}");
    }
}
