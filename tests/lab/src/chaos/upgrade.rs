//! `paybus-lab upgrade`: a rolling upgrade under load, checked as a chaos run is
//! (docs/chaos.md#upgrades). Every workflow's load runs on an earlier release's fleet and
//! schema; this release's migrations are applied; every process is replaced by this release's
//! binary one at a time, then rolled back the same way (the earlier code on the new schema).
//! The deploy is the run's only fault besides the duplicates and malformed messages every run
//! has; the same exactly-once checks decide, plus the deploy's own (a migration refused, a
//! process that did not stay up).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use super::{
    OwnServices, Profile, Schedule,
    deploy::{self, Side},
    finish_report, fleet,
    load::MarketCadence,
    refuse_another_layout, repository_dir,
    stage::Schema,
    state_dir,
};
use crate::release::{Release, THIS_VERSION};

#[derive(Debug, Clone, clap::Args)]
pub struct UpgradeArgs {
    /// The release to upgrade from: a version CHANGELOG.md lists or a commit (default: the
    /// release below this one). Its binaries are built once, in `.local/releases/`.
    #[arg(long)]
    pub from: Option<String>,
    /// Where this release's binaries are (default: next to this `paybus-lab`).
    #[arg(long)]
    pub to_bin_dir: Option<PathBuf>,
    /// Build the --from release's binaries, print their folder and stop (CI builds them
    /// before its tests run).
    #[arg(long)]
    pub build_only: bool,
    /// The CI profile: 300 items over a 75 s deploy. Without it: 3,000 items over 4 minutes.
    #[arg(long)]
    pub quick: bool,
    /// Workflow items in all (split as chaos splits them).
    #[arg(long)]
    pub items: Option<usize>,
    /// The deploy's window: the migrations at a tenth of it, the rollout over its second
    /// fifth, the rollback over the fifth after its middle; the load spreads over four fifths.
    #[arg(long)]
    pub window_s: Option<u64>,
    /// Give up waiting for quiescence after this long (a violation).
    #[arg(long)]
    pub quiescence_timeout_s: Option<u64>,
    /// SQL applied right after this release's migrations, as one more migration would be:
    /// e.g. a column dropped that the earlier release still reads, which the run must fail on.
    #[arg(long)]
    pub plant_migration: Option<PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Seed of the run's random choices (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where the run's MariaDB, RabbitMQ and process logs live (wiped at the start; default
    /// `.local/upgrade` in the repository).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Where to write the run's timeline (SVG; default `timeline.svg` in the state folder).
    #[arg(long)]
    pub timeline: Option<PathBuf>,
}

/// How long a new process must stay up before the next one is replaced.
const SETTLE: Duration = Duration::from_secs(1);

impl UpgradeArgs {
    fn profile(&self) -> anyhow::Result<Profile> {
        let (name, items, window, concurrency) = if self.quick {
            ("upgrade-quick", 300, 75, 8)
        } else {
            ("upgrade", 3_000, 240, 32)
        };
        let items = self.items.unwrap_or(items);
        if items < 20 {
            anyhow::bail!("--items must be at least 20 (every workflow gets a share)");
        }
        let window = Duration::from_secs(self.window_s.unwrap_or(window));
        Ok(Profile {
            name,
            items,
            copies: 3,
            malformed_every: 100,
            late_trades_first: 5,
            kill_every: Duration::ZERO,
            broker_restarts: 0,
            broker_nodes: 1,
            broker_node_kills: 0,
            database_restarts: 0,
            webhook_outage: Duration::ZERO,
            late_webhooks: 0,
            network_faults: false,
            partition: Duration::ZERO,
            fault_window: window,
            quiescence_timeout: Duration::from_secs(
                self.quiescence_timeout_s
                    .unwrap_or(if self.quick { 180 } else { 600 }),
            ),
            seed: self.seed.unwrap_or_else(super::seed_from_clock),
            concurrency,
            shards: 1,
            // Suspensions every twentieth of the window, so that each stretch of the deploy
            // (the shortest, the earlier code alone on the new schema, is a tenth) has some:
            // a deploy that breaks the markets' cancel shows in the stretch it broke.
            markets: MarketCadence {
                lifetime: window / 20,
                orders: 4,
            },
        })
    }
}

pub async fn run(args: UpgradeArgs) -> anyhow::Result<ExitCode> {
    let repository = repository_dir();
    let from = Release::find(&repository, args.from.as_deref())?;
    let binaries_of = |dir: &std::path::Path| fleet::binaries(dir, &[]);
    let packages = fleet::packages();
    let from_dir = tokio::task::spawn_blocking({
        let (from, repository) = (from.clone(), repository.clone());
        move || from.binaries(&repository, &packages)
    })
    .await??;
    if args.build_only {
        println!("{}", from_dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    let to_dir = fleet::bin_dir(args.to_bin_dir.as_deref())?;
    let to = Side {
        release: this_release(&to_dir).await?,
        bin_dir: to_dir.clone(),
    };
    let from = Side {
        release: from,
        bin_dir: from_dir.clone(),
    };
    // Both sides whole before anything starts: a missing binary is a build's fault, not the
    // deploy's.
    binaries_of(&to_dir)?;
    let binaries = binaries_of(&from_dir)?;
    let planted = args
        .plant_migration
        .as_deref()
        .map(std::path::absolute)
        .transpose()?;

    let profile = args.profile()?;
    let layout = profile.layout();
    refuse_another_layout(&layout, "an upgrade runs the default layout")?;
    let state_dir = state_dir(args.state_dir.as_deref(), ".local/upgrade")?;
    let timeline_path = match &args.timeline {
        Some(path) => std::path::absolute(path)?,
        None => state_dir.join("timeline.svg"),
    };
    eprintln!(
        "upgrade ({} profile, seed {}): {} → {} and back, on MariaDB and RabbitMQ of its own in {}",
        profile.name,
        profile.seed,
        from.release.version,
        to.release.version,
        state_dir.display()
    );
    let own = OwnServices::start(state_dir.clone(), profile.broker_nodes).await?;
    let plan = deploy::Plan {
        order: binaries.iter().map(|b| b.name.clone()).collect(),
        from: from.clone(),
        to,
        planted,
        window: profile.fault_window,
        settle: SETTLE,
        env: deploy::environment(&own.settings(&layout)?),
    };
    let result = super::drive(
        &profile,
        &own,
        &binaries,
        &state_dir,
        Schema::Release(&from),
        Schedule::Deploy(Box::new(plan)),
    )
    .await;
    own.shut_down().await?;
    finish_report(result?, &timeline_path, args.json)
}

/// The release of the binaries in `dir`, as their `paybus --version` says (`paybus 0.4.0
/// (commit <hex>)`); this lab's version where it says no commit.
async fn this_release(dir: &std::path::Path) -> anyhow::Result<Release> {
    let printed = deploy::paybus(&dir.join("paybus"), &["--version"], &Default::default()).await?;
    let commit = printed
        .split("(commit ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or("unknown")
        .to_owned();
    let version = printed
        .split_whitespace()
        .nth(1)
        .unwrap_or(THIS_VERSION)
        .to_owned();
    Ok(Release { version, commit })
}
