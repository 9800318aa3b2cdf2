//! `paybus functions`: ops' switch for a function's consumption (`paybus_bus::pauses`).
//!
//! - `paybus functions list`: every catalog function, paused or consuming (from the database).
//! - `paybus functions pause <name> --reason "…"`: every process's consumers of it stop taking
//!   deliveries within a couple of seconds; its messages wait in its queue
//!   (`POST /v1/admin/functions/{name}/pause`, as the signed-in person).
//! - `paybus functions resume <name>`: they take them again (`.../resume`).

use std::process::ExitCode;

use anyhow::Context;
use paybus_bus::pauses;
use paybus_config::Settings;
use paybus_db as db;
use serde::Deserialize;
use serde_json::json;

use crate::api_client::{ApiArgs, ApiClient};

#[derive(Debug, clap::Subcommand)]
pub enum FunctionsCommand {
    /// Every function of the catalog, paused (who, why, since when) or consuming.
    List,
    /// Stop every process consuming the function's queue (in AWS: its trigger's `Enabled`
    /// parameter); the messages wait there.
    Pause {
        name: String,
        /// Why (kept with the pause, shown to whoever finds it).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Consume the function's queue again.
    Resume {
        name: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// The pause and resume routes' answer.
#[derive(Debug, Deserialize)]
struct Switched {
    function: String,
    paused_now: Option<bool>,
    resumed_now: Option<bool>,
}

pub async fn run(settings: &Settings, command: FunctionsCommand) -> anyhow::Result<ExitCode> {
    match command {
        FunctionsCommand::List => list(settings).await,
        FunctionsCommand::Pause { name, reason, api } => {
            let client = ApiClient::connect(&api).await?;
            let paused: Switched = client
                .post(
                    &format!("/v1/admin/functions/{}/pause", path_segment(&name)?),
                    Some(&json!({ "reason": reason })),
                )
                .await?
                .parse()?;
            if paused.paused_now == Some(true) {
                println!(
                    "{} paused: every process stops taking its deliveries within a couple of \
                     seconds",
                    paused.function
                );
            } else {
                println!(
                    "{} was paused already (paybus functions list says by whom)",
                    paused.function
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        FunctionsCommand::Resume { name, api } => {
            let client = ApiClient::connect(&api).await?;
            let resumed: Switched = client
                .post(
                    &format!("/v1/admin/functions/{}/resume", path_segment(&name)?),
                    None,
                )
                .await?
                .parse()?;
            if resumed.resumed_now == Some(true) {
                println!("{} resumed: its queue is drained again", resumed.function);
            } else {
                println!("{} was not paused", resumed.function);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn list(settings: &Settings) -> anyhow::Result<ExitCode> {
    let pool = db::connect(&settings.database).await?;
    let mut conn = pool.acquire().await?;
    let paused = pauses::list(&mut conn)
        .await
        .context("while reading the paused functions")?;
    for function in paybus_catalog::FUNCTIONS {
        match paused.iter().find(|p| p.function_name == function.name) {
            Some(pause) => println!(
                "{:<20} PAUSED since {} by {}: {}",
                function.name,
                pause.paused_at.to_rfc3339(),
                pause.paused_by,
                pause.reason
            ),
            None => println!("{:<20} consuming", function.name),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `name` as the one path segment it must be: catalog names are letters, digits and `-`, and
/// anything else (a `/`, a `..`) could name another route.
fn path_segment(name: &str) -> anyhow::Result<&str> {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Ok(name);
    }
    let known: Vec<&str> = paybus_catalog::FUNCTIONS.iter().map(|f| f.name).collect();
    anyhow::bail!("no function {name:?} in the catalog ({})", known.join(", "))
}
