//! `paybus functions`: ops' switch for a function's consumption, the same as the admin API's
//! `/v1/admin/functions` (`paybus_platform::bus::pauses`), straight on the database.
//!
//! - `paybus functions list`: every catalog function, paused or consuming.
//! - `paybus functions pause <name> --reason "…" [--actor NAME]`: every process's consumers of
//!   it stop taking deliveries within a couple of seconds; its messages wait in its queue.
//! - `paybus functions resume <name> [--actor NAME]`: they take them again.

use std::process::ExitCode;

use anyhow::Context;
use paybus_platform::{Settings, bus::pauses, db};

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
        /// Who pauses it (kept with the pause).
        #[arg(long, env = "USER", default_value = "cli")]
        actor: String,
    },
    /// Consume the function's queue again.
    Resume {
        name: String,
        #[arg(long, env = "USER", default_value = "cli")]
        actor: String,
    },
}

pub async fn run(settings: &Settings, command: FunctionsCommand) -> anyhow::Result<ExitCode> {
    let pool = db::connect(&settings.database).await?;
    let mut conn = pool.acquire().await?;
    match command {
        FunctionsCommand::List => {
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
        FunctionsCommand::Pause {
            name,
            reason,
            actor,
        } => {
            let name = catalog_name(&name)?;
            if reason.trim().is_empty() {
                anyhow::bail!(
                    "say why {name} is paused (--reason): whoever finds it paused reads it"
                );
            }
            if pauses::pause(&mut conn, name, &actor, reason.trim()).await? {
                println!(
                    "{name} paused: every process stops taking its deliveries within a couple of seconds"
                );
            } else {
                println!("{name} was paused already (paybus functions list says by whom)");
            }
            Ok(ExitCode::SUCCESS)
        }
        FunctionsCommand::Resume { name, actor } => {
            let name = catalog_name(&name)?;
            if pauses::resume(&mut conn, name, &actor).await? {
                println!("{name} resumed: its queue is drained again");
            } else {
                println!("{name} was not paused");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn catalog_name(name: &str) -> anyhow::Result<&'static str> {
    paybus_catalog::FUNCTIONS
        .iter()
        .find(|function| function.name == name)
        .map(|function| function.name)
        .with_context(|| {
            let known: Vec<&str> = paybus_catalog::FUNCTIONS.iter().map(|f| f.name).collect();
            format!("no function {name:?} in the catalog ({})", known.join(", "))
        })
}
