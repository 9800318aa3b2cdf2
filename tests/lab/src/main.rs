//! `paybus-lab`: the benchmarks, the chaos run and the upgrade run, in a binary of their own so that the
//! operator's `paybus` (what production runs) never links the test kit, the HTTP stubs or
//! the seeds' deliberately broken designs they need.

mod bench;
mod chaos;
mod drive;
mod finished;
mod plot;
mod release;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use paybus_config::Settings;
use paybus_telemetry as telemetry;

#[derive(Parser)]
#[command(
    name = "paybus-lab",
    version,
    about = "paybus's lab: benchmarks and fault-injection runs (never deployed)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmark a workflow through the broker against the same transactions driven directly
    /// on the database (build with --release for meaningful figures).
    Bench(bench::BenchArgs),
    /// A fault-injection run on services of its own: every workflow under duplicates, malformed
    /// messages, SIGKILLed functions and broker/database restarts, then checked for exactly-once
    /// effects; exits non-zero on any violation.
    Chaos(chaos::ChaosArgs),
    /// A rolling upgrade under load, on services of its own: every workflow on an earlier
    /// release's fleet, this release's migrations applied, every process replaced one at a
    /// time and then rolled back, checked for exactly-once effects; exits non-zero on any
    /// violation.
    Upgrade(chaos::upgrade::UpgradeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before the runtime, so that it sizes its workers to the CPUs left (`bench::pin`).
    let pinned = match &cli.command {
        Command::Bench(args) => bench::pin(args),
        Command::Chaos(_) | Command::Upgrade(_) => Ok(None),
    };
    let _pinned = match pinned {
        Ok(pinned) => pinned,
        Err(e) => {
            eprintln!("paybus-lab: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(e) => {
            eprintln!("paybus-lab: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    // Read as `paybus` reads them, so a malformed variable stops the lab the same way (exit 2)
    // and the log format is the one the environment asks for.
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("paybus-lab: {e}");
            return ExitCode::from(2);
        }
    };
    telemetry::init(settings.log_format);
    let result = match cli.command {
        Command::Bench(args) => bench::run(args).await,
        Command::Chaos(args) => chaos::run(args).await,
        Command::Upgrade(args) => chaos::upgrade::run(args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("paybus-lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}
