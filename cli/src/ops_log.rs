//! `paybus ops-log [--before-seq N] [--limit N]`: the ops log, newest first, one line an action
//! (as `GET /v1/admin/ops-log`). Whether its chain holds is `paybus audit`'s (`ops_log_chain`).

use std::process::ExitCode;

use anyhow::Context;
use paybus_config::Settings;
use paybus_db as db;
use paybus_ops::ops_log;

#[derive(Debug, clap::Args)]
pub struct OpsLogArgs {
    /// Rows before this seq (the next page after a page that ended at it).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    before_seq: Option<u64>,
    /// Rows shown, newest first.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    limit: u32,
}

pub async fn run(settings: &Settings, args: OpsLogArgs) -> anyhow::Result<ExitCode> {
    let pool = db::connect(&settings.database).await?;
    let mut conn = pool.acquire().await?;
    let rows = ops_log::list(&mut conn, args.before_seq, args.limit)
        .await
        .context("while reading the ops log")?;
    if rows.is_empty() {
        println!("ops log: no entries");
        return Ok(ExitCode::SUCCESS);
    }
    for row in &rows {
        println!(
            "{:>6}  {}  {:<20} {:<26} {:<32} {}",
            row.seq,
            row.created_at.format("%Y-%m-%d %H:%M:%S%.3f"),
            row.actor,
            row.action,
            row.subject,
            row.detail
        );
    }
    if let Some(last) = rows.last().filter(|_| rows.len() == args.limit as usize) {
        println!("more: paybus ops-log --before-seq {}", last.seq);
    }
    Ok(ExitCode::SUCCESS)
}
