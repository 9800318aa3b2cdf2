//! `paybus approvals`: four-eyes for the single guarded actions (`/v1/admin/approvals`).
//!
//! - `list [--awaiting] [--limit 50]`: newest first (from the database).
//! - `approve <id>`: someone other than the requester approves it (the API refuses the
//!   requester).
//! - `execute <id>`: the API runs the approved action, or says what it did when another
//!   execution ran it.

use std::process::ExitCode;

use paybus_config::Settings;
use paybus_db as db;
use paybus_ops::approvals;
use serde::Deserialize;
use serde_json::Value;

use crate::api_client::{ApiArgs, ApiClient};

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
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Run an approved action.
    Execute {
        id: uuid::Uuid,
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// An approval as the admin API answers it (the fields the command prints).
#[derive(Debug, Deserialize)]
pub(crate) struct Approval {
    pub id: uuid::Uuid,
    pub action: String,
    pub subject: String,
    pub status: String,
    pub approved_by: Option<String>,
    pub executed_by: Option<String>,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

/// `POST /v1/admin/approvals/{id}/execute`'s answer.
#[derive(Debug, Deserialize)]
struct Executed {
    approval: Approval,
    result: Value,
    ran_now: bool,
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
        ApprovalsCommand::Approve { id, api } => {
            let client = ApiClient::connect(&api).await?;
            let approved: Approval = client
                .post(&format!("/v1/admin/approvals/{id}/approve"), None)
                .await?
                .parse()?;
            println!(
                "approval {id} ({} on {}) approved by {}: run `paybus approvals execute {id}`",
                approved.action,
                approved.subject,
                approved.approved_by.as_deref().unwrap_or("you")
            );
            Ok(ExitCode::SUCCESS)
        }
        ApprovalsCommand::Execute { id, api } => {
            let client = ApiClient::connect(&api).await?;
            let executed: Executed = client
                .post(&format!("/v1/admin/approvals/{id}/execute"), None)
                .await?
                .parse()?;
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
