//! `paybus trace <withdrawal|deposit|deposit-order|bonus-job> <id>`: one money movement's
//! timeline (`paybus_api::trace`, what `GET /v1/admin/trace/{kind}/{id}` answers), oldest first;
//! `--json` for the whole of it.

use std::process::ExitCode;

use paybus_api::trace::{self, Traced};
use paybus_config::Settings;
use paybus_db as db;

#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// withdrawal, deposit, deposit-order or bonus-job.
    kind: String,
    id: u64,
    /// Print the trace as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn run(settings: &Settings, args: TraceArgs) -> anyhow::Result<ExitCode> {
    let Some(kind) = Traced::parse(&args.kind) else {
        anyhow::bail!(
            "{:?} cannot be traced: withdrawal, deposit, deposit-order or bonus-job",
            args.kind
        );
    };
    let pool = db::connect(&settings.database).await?;
    let mut conn = pool.acquire().await?;
    let Some(trace) = trace::trace(&mut conn, kind, args.id).await? else {
        eprintln!("no {} {}", args.kind, args.id);
        return Ok(ExitCode::FAILURE);
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&trace)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{} {}: {}", args.kind, args.id, trace.row);
    for event in &trace.events {
        let detail = if event.detail.is_null() {
            String::new()
        } else {
            format!("  {}", event.detail)
        };
        println!(
            "{}  {:<18}  {}{detail}",
            event.at.format("%Y-%m-%d %H:%M:%S%.3f"),
            event.source,
            event.what
        );
    }
    for part in &trace.unreadable {
        eprintln!("could not read the {}: {}", part.part, part.problem);
    }
    Ok(ExitCode::SUCCESS)
}
