//! `paybus`: the operator's command line.

mod doctor;

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use paybus_shared::{Settings, db, telemetry};

#[derive(Parser)]
#[command(
    name = "paybus",
    version,
    about = "The asynchronous back office of a payments backend"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply every pending database migration (safe to repeat).
    Migrate,
    /// Check that the database and the broker answer; exits non-zero with one line per problem.
    Doctor,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("paybus: {e}");
            return ExitCode::from(2);
        }
    };
    telemetry::init(settings.log_format);
    let result = match cli.command {
        Command::Migrate => migrate(&settings).await,
        Command::Doctor => doctor::run(&settings).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("paybus: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn migrate(settings: &Settings) -> anyhow::Result<ExitCode> {
    let pool = db::connect(&settings.database).await?;
    db::migrate(&pool)
        .await
        .context("while applying migrations")?;
    println!(
        "migrations: {} known, all applied to {}",
        db::MIGRATOR.iter().count(),
        paybus_shared::redact::url(&settings.database.url)
    );
    Ok(ExitCode::SUCCESS)
}
