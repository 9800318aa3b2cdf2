//! `paybus approvals`: four-eyes for the single guarded actions (as `/v1/admin/approvals`).
//!
//! - `list [--awaiting] [--limit 50]`: newest first.
//! - `approve <id> [--actor who]`: someone other than the requester approves it.
//! - `execute <id> [--actor who]`: runs the approved action (the API's code path), or says
//!   what it did when another execution ran it.

use std::process::ExitCode;

use anyhow::Context;
use paybus_platform::{Settings, approvals, bus::Services, db};

#[derive(Debug, clap::Subcommand)]
pub enum ApprovalsCommand {
    /// Approvals, newest first.
    List {
        /// Only those waiting for a second person.
        #[arg(long)]
        awaiting: bool,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
    },
    /// Approve another person's request.
    Approve {
        id: uuid::Uuid,
        #[arg(long, env = "USER", default_value = "cli")]
        actor: String,
    },
    /// Run an approved action.
    Execute {
        id: uuid::Uuid,
        #[arg(long, env = "USER", default_value = "cli")]
        actor: String,
    },
}

pub async fn run(settings: &Settings, command: ApprovalsCommand) -> anyhow::Result<ExitCode> {
    match command {
        ApprovalsCommand::List { awaiting, limit } => {
            let pool = db::connect(&settings.database).await?;
            let mut conn = pool.acquire().await?;
            for a in approvals::list(&mut conn, awaiting, limit).await? {
                println!(
                    "{}  {:<16}  {:<24}  {:<17}  asked by {}{}",
                    a.id,
                    a.action,
                    a.subject,
                    if a.expired {
                        "EXPIRED".to_owned()
                    } else {
                        a.status.to_string()
                    },
                    a.requested_by,
                    a.approved_by
                        .as_deref()
                        .map(|b| format!(", approved by {b}"))
                        .unwrap_or_default()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        ApprovalsCommand::Approve { id, actor } => {
            let pool = db::connect(&settings.database).await?;
            let mut conn = pool.acquire().await?;
            let approved = approvals::approve(&mut conn, id, &actor)
                .await
                .context("while approving")?;
            println!(
                "approval {id} ({} on {}) approved by {actor}: run `paybus approvals execute {id}`",
                approved.action, approved.subject
            );
            Ok(ExitCode::SUCCESS)
        }
        ApprovalsCommand::Execute { id, actor } => {
            let services = Services::connect(settings.clone()).await?;
            let executed = paybus_api::approvals::execute_approval(&services.outbox, id, &actor)
                .await
                .context("while executing")?;
            let approval = &executed.approval;
            println!(
                "approval {id} ({} on {}) is {}{}: {}",
                approval.action,
                approval.subject,
                approval.status,
                if executed.ran_now {
                    String::new()
                } else {
                    format!(
                        " (run by {} before)",
                        approval
                            .executed_by
                            .as_deref()
                            .unwrap_or("another execution")
                    )
                },
                executed.result
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
