//! `paybus jobs`: the charge-event bonus jobs ops look at (W3, seed 003) — the same views as
//! the admin API's `/v1/admin/charge-event-jobs`, read straight from the database; the retry
//! is the API's, called as the signed-in person.
//!
//! - `paybus jobs list [--status PENDING|FAILED] [--after-id N] [--limit N]`: jobs waiting for
//!   a retry or for ops (never DONE or PROCESSING), by id, one line each.
//! - `paybus jobs show <id>`: one job, any state, as JSON.
//! - `paybus jobs retry <id>`: a FAILED job back to PENDING, due now, its message published at
//!   once; exit 1 (nothing changed) when it is not FAILED. Under four-eyes (the API's
//!   `PAYBUS_FOUR_EYES`) the API holds it for a second person: `paybus approvals`.

use std::process::ExitCode;

use anyhow::Context;
use paybus_bonuses::job::{self, BonusJob, JobPage, JobStatus};
use paybus_config::Settings;
use paybus_db as db;
use reqwest::StatusCode;
use serde::Deserialize;

use crate::{
    api_client::{ApiArgs, ApiClient},
    approvals::Approval,
};

#[derive(Debug, clap::Subcommand)]
pub enum JobsCommand {
    /// Jobs waiting for a retry (PENDING) or for ops (FAILED), by id.
    List {
        /// Only this status.
        #[arg(long, value_enum)]
        status: Option<Listed>,
        /// Continue after this job id (the last one of the previous page).
        #[arg(long, default_value_t = 0)]
        after_id: u64,
        /// Jobs per page (1 to 500).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
    },
    /// One job, whatever its state, as JSON.
    Show { id: u64 },
    /// Put a FAILED job back to PENDING, due now, and publish its message (one more attempt).
    Retry {
        id: u64,
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// The statuses the list holds.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
#[value(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Listed {
    Pending,
    Failed,
}

pub async fn run(settings: &Settings, command: JobsCommand) -> anyhow::Result<ExitCode> {
    match command {
        JobsCommand::List {
            status,
            after_id,
            limit,
        } => list(settings, status, after_id, limit).await,
        JobsCommand::Show { id } => show(settings, id).await,
        JobsCommand::Retry { id, api } => retry(id, &api).await,
    }
}

async fn list(
    settings: &Settings,
    status: Option<Listed>,
    after_id: u64,
    limit: u32,
) -> anyhow::Result<ExitCode> {
    let pool = db::connect(&settings.database).await?;
    let mut conn = pool.acquire().await?;
    let status = status.map(|listed| match listed {
        Listed::Pending => JobStatus::Pending,
        Listed::Failed => JobStatus::Failed,
    });
    let jobs = job::list(
        &mut conn,
        JobPage {
            status,
            after_id,
            limit,
        },
    )
    .await
    .context("while listing bonus jobs")?;
    println!(
        "{:>8} {:<19} {:<8} {:>7} {:<27} {:>9} {:>10} {:>6}  last error",
        "id", "type", "status", "retries", "next retry", "member", "charge", "cans"
    );
    for job in &jobs {
        println!("{}", line(job));
    }
    match jobs.last() {
        Some(last) if jobs.len() == limit as usize => {
            println!("more: paybus jobs list --after-id {}", last.id);
        }
        _ => println!("{} job(s)", jobs.len()),
    }
    Ok(ExitCode::SUCCESS)
}

fn line(job: &BonusJob) -> String {
    let next = match (job.next_retry_at, job.status) {
        (Some(at), _) => at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        (None, JobStatus::Pending) => "due now".to_owned(),
        // FAILED: no automatic retry, only ops'.
        (None, _) => "-".to_owned(),
    };
    let error: String = job
        .last_error
        .as_deref()
        .unwrap_or("")
        .chars()
        .take(80)
        .collect();
    format!(
        "{:>8} {:<19} {:<8} {:>7} {:<27} {:>9} {:>10} {:>6}  {error}",
        job.id,
        job.job_type.as_str(),
        job.status.as_str(),
        job.retry_count,
        next,
        job.member_id,
        job.source_charge_id,
        job.additional_can
    )
}

async fn show(settings: &Settings, id: u64) -> anyhow::Result<ExitCode> {
    let pool = db::connect(&settings.database).await?;
    let mut conn = pool.acquire().await?;
    match job::find(&mut conn, id).await? {
        Some(job) => {
            println!("{}", serde_json::to_string_pretty(&job)?);
            Ok(ExitCode::SUCCESS)
        }
        None => {
            eprintln!("bonus job {id} not found");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// A guarded route's `202` answer: the approval a second person gives.
#[derive(Debug, Deserialize)]
pub(crate) struct Held {
    pub approval: Approval,
}

/// The retried job, as the API answers it (what the command prints of it).
#[derive(Debug, Deserialize)]
struct Retried {
    retry_count: u32,
}

async fn retry(id: u64, api: &ApiArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::connect(api).await?;
    let answer = client
        .post(&format!("/v1/admin/charge-event-jobs/{id}/retry"), None)
        .await?;
    if answer.status == StatusCode::ACCEPTED {
        let Held { approval } = answer.parse()?;
        println!(
            "four-eyes: the retry of bonus job {id} waits for a second person's approval \
             (until {}); someone else runs:\n  paybus approvals approve {}\nthen:\n  paybus \
             approvals execute {}",
            approval.expires_at.to_rfc3339(),
            approval.id,
            approval.id
        );
        return Ok(ExitCode::SUCCESS);
    }
    let job: Retried = answer.parse()?;
    println!(
        "bonus job {id} is PENDING again (retry_count {}), due now; grant-bonus attempts it at \
         once",
        job.retry_count
    );
    Ok(ExitCode::SUCCESS)
}
