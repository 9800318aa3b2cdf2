//! `paybus suspension show|watch <symbol>`: a suspension's progress from the database (docs/workflows/markets.md,
//! seed 004) — the seed's GROUP BY table, or a live progress bar until it is complete.

use std::{process::ExitCode, time::Duration};

use anyhow::Context;
use indicatif::{HumanCount, ProgressBar, ProgressStyle};
use paybus_config::Settings;
use paybus_db as db;
use paybus_markets::{
    grouped,
    progress::{self, Phase, Progress},
    task::TaskState,
};
use sqlx::MySqlPool;
use strum::IntoEnumIterator;

#[derive(clap::Subcommand)]
pub enum SuspensionCommand {
    /// Print the latest suspension's tasks by state (the seed's GROUP BY), the created count,
    /// the open orders left and whether it is complete.
    Show {
        /// The market, e.g. BTC.
        symbol: String,
    },
    /// A live progress bar until the suspension is complete (exit 0), or needs attention:
    /// nothing pending but orders still open (exit 1).
    Watch {
        symbol: String,
        /// How often to read the progress.
        #[arg(long, default_value_t = 500)]
        interval_ms: u64,
    },
}

pub async fn run(settings: &Settings, command: SuspensionCommand) -> anyhow::Result<ExitCode> {
    let pool = db::connect(&settings.database).await?;
    match command {
        SuspensionCommand::Show { symbol } => show(&pool, &symbol).await,
        SuspensionCommand::Watch {
            symbol,
            interval_ms,
        } => watch(&pool, &symbol, Duration::from_millis(interval_ms.max(50))).await,
    }
}

async fn read(pool: &MySqlPool, symbol: &str) -> anyhow::Result<Progress> {
    progress::of_symbol(pool, symbol)
        .await
        .with_context(|| format!("while reading the suspension of {symbol}"))
}

async fn show(pool: &MySqlPool, symbol: &str) -> anyhow::Result<ExitCode> {
    let progress = read(pool, symbol).await?;
    print!("{}", table(&progress));
    Ok(ExitCode::SUCCESS)
}

/// The seed's screen: `SELECT state, COUNT(*) FROM tasks WHERE batch_id = ? GROUP BY state`.
pub fn table(progress: &Progress) -> String {
    let mut out = format!(
        "market {}: {}, batch {} ({}) since {}\n",
        progress.symbol,
        progress.market_status,
        progress.batch_id,
        progress.reason,
        progress.suspended_at.format("%Y-%m-%d %H:%M:%S%.3f UTC")
    );
    if let Some(note) = &progress.note {
        out.push_str(&format!("note: {note}\n"));
    }
    let width = grouped(progress.created.max(progress.open_orders)).len();
    for state in TaskState::iter() {
        let count = grouped(progress.tasks.get(state));
        out.push_str(&format!("{:<8} {count:>width$}\n", state.to_string()));
    }
    let created = grouped(progress.created);
    let final_or_not = if progress.preparing {
        "so far: still preparing"
    } else {
        "final"
    };
    out.push_str(&format!("created  {created:>width$} ({final_or_not})\n"));
    out.push_str(&format!(
        "open orders left: {}\n{}\n",
        grouped(progress.open_orders),
        progress.summary
    ));
    out
}

async fn watch(pool: &MySqlPool, symbol: &str, interval: Duration) -> anyhow::Result<ExitCode> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} {msg}",
        )?
        .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    let mut last_summary = String::new();
    loop {
        let progress = read(pool, symbol).await?;
        bar.set_length(progress.created);
        bar.set_position(progress.tasks.settled());
        bar.set_message(match progress.phase {
            Phase::Preparing => format!(
                "preparing ({} tasks created so far)",
                HumanCount(progress.created)
            ),
            _ => format!(
                "{} DONE, {} SKIPPED, {} FAILED, {} open orders left",
                HumanCount(progress.tasks.done),
                HumanCount(progress.tasks.skipped),
                HumanCount(progress.tasks.failed),
                HumanCount(progress.open_orders)
            ),
        });
        // Not a terminal (a log, CI): one line per change instead of a bar.
        if bar.is_hidden() && progress.summary != last_summary {
            println!("{}", progress.summary);
        }
        last_summary.clone_from(&progress.summary);
        match progress.phase {
            Phase::Complete => {
                bar.finish_with_message(progress.summary);
                return Ok(ExitCode::SUCCESS);
            }
            Phase::NeedsAttention => {
                bar.abandon_with_message(progress.summary);
                return Ok(ExitCode::FAILURE);
            }
            Phase::Preparing | Phase::InProgress => tokio::time::sleep(interval).await,
        }
    }
}
