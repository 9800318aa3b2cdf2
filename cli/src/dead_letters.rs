//! `paybus dead-letters`: the same operations as the admin API's `/v1/admin/dead-letters`,
//! straight on the database (and the broker, for replays).
//!
//! - `groups`: NEW letters by function and reason, with the money at stake.
//! - `list [--function F] [--reason R] [--status NEW|REPLAYED|ARCHIVED] [--before-id N] [--limit N]`
//! - `show <id>`: one letter as JSON (headers, body, referenced rows, verdict, trail).
//! - `dry-run (--id N ... | --function F --reason R)`: each letter classified; nothing written.
//! - `replay (--id N ... | --function F --reason R) [--per-second 10] [--limit 500] [--yes]`:
//!   prints the dry run first and asks before sending (`--yes` skips the question; without a
//!   terminal it is required), then replays the safe letters with a progress bar.
//! - `archive (--id N ... | --function F --reason R) [--yes]`.
//!
//! Exit 1 when a replay left letters that need a human or are already applied.

use std::{io::IsTerminal, process::ExitCode};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use paybus_dead_letter_ops::{
    ListFilter, ReplayOptions, Selection, Triager, groups, letter, replay,
};
use paybus_platform::{Settings, bus::Services, db, triage::Verdict};

#[derive(Debug, clap::Args)]
#[group(required = true, multiple = true)]
pub struct Select {
    /// A letter id (repeat for several).
    #[arg(long = "id", conflicts_with_all = ["function", "reason"])]
    ids: Vec<u64>,
    /// Every NEW letter of this function (with --reason).
    #[arg(long, requires = "reason")]
    function: Option<String>,
    /// ... and this reason.
    #[arg(long, requires = "function")]
    reason: Option<String>,
}

impl Select {
    fn selection(self) -> Selection {
        match (self.function, self.reason) {
            (Some(function), Some(reason)) => Selection::Group { function, reason },
            _ => Selection::Ids(self.ids),
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum DeadLettersCommand {
    /// NEW letters grouped by function and reason: count, first and last seen, money at stake.
    Groups,
    /// Letters, newest first.
    List {
        #[arg(long)]
        function: Option<String>,
        #[arg(long)]
        reason: Option<String>,
        /// NEW (default), REPLAYED or ARCHIVED.
        #[arg(long)]
        status: Option<paybus_dead_letter_ops::LetterStatus>,
        /// Letters older than this id (the previous page's last).
        #[arg(long)]
        before_id: Option<u64>,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
    },
    /// One letter as JSON: headers, body, the rows it refers to, the verdict, the trail.
    Show { id: u64 },
    /// Classify the selected NEW letters (already applied / safe / needs a human); writes nothing.
    DryRun {
        #[command(flatten)]
        select: Select,
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
    },
    /// Dry run, then replay the safe letters through the outbox (rate-limited).
    Replay {
        #[command(flatten)]
        select: Select,
        /// The most letters replayed a second.
        #[arg(long, default_value_t = 10.0)]
        per_second: f64,
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
        /// Do not ask before replaying.
        #[arg(long)]
        yes: bool,
        /// Who is replaying (recorded with each letter).
        #[arg(long, env = "USER", default_value = "cli")]
        actor: String,
    },
    /// Archive the selected NEW letters.
    Archive {
        #[command(flatten)]
        select: Select,
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
        #[arg(long, env = "USER", default_value = "cli")]
        actor: String,
    },
}

const TRIAGER: Triager = Triager::new(paybus_catalog::FUNCTIONS);

pub async fn run(settings: &Settings, command: DeadLettersCommand) -> anyhow::Result<ExitCode> {
    match command {
        DeadLettersCommand::Replay {
            select,
            per_second,
            limit,
            yes,
            actor,
        } => {
            if !(per_second.is_finite() && per_second > 0.0) {
                anyhow::bail!("--per-second must be above 0");
            }
            let options = ReplayOptions { per_second, limit };
            replay(settings, select.selection(), options, yes, &actor).await
        }
        DeadLettersCommand::Archive {
            select,
            limit,
            actor,
        } => {
            let services = Services::connect(settings.clone()).await?;
            let report = replay::archive(&services.outbox, &select.selection(), &actor, limit)
                .await
                .context("while archiving")?;
            println!(
                "archived {} dead letter(s); {} more NEW in the selection",
                report.archived, report.remaining
            );
            Ok(ExitCode::SUCCESS)
        }
        read_only => {
            let pool = db::connect(&settings.database).await?;
            let mut conn = pool.acquire().await?;
            read(&mut conn, read_only).await
        }
    }
}

async fn read(
    conn: &mut sqlx::MySqlConnection,
    command: DeadLettersCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        DeadLettersCommand::Groups => {
            let overview = groups::overview(conn, &TRIAGER).await?;
            if overview.groups.is_empty() {
                println!("no NEW dead letters");
            }
            for group in &overview.groups {
                println!(
                    "{:>6}  {} / {}  ({} failure(s); first {}, last {})",
                    group.count,
                    group.function,
                    group.reason,
                    group.failures,
                    group.first_failed_at.to_rfc3339(),
                    group.last_failed_at.to_rfc3339()
                );
                for sum in &group.exposure {
                    println!("        {}", exposure_line(sum));
                }
            }
            if !overview.exposure.is_empty() {
                println!("money at stake, biggest first:");
                for sum in &overview.exposure {
                    println!("  {}", exposure_line(sum));
                }
            }
            if !overview.exposure_complete {
                println!(
                    "(sums cover the oldest {} letters only)",
                    groups::EXPOSURE_SCAN_LIMIT
                );
            }
        }
        DeadLettersCommand::List {
            function,
            reason,
            status,
            before_id,
            limit,
        } => {
            let filter = ListFilter {
                function,
                reason,
                status,
                before_id,
                limit: Some(limit),
            };
            for l in letter::list(conn, &filter).await? {
                println!(
                    "{:>8}  {}  {} / {}  {}  {}",
                    l.id,
                    l.failed_at.to_rfc3339(),
                    l.function_name,
                    l.reason,
                    l.status,
                    l.error.chars().take(120).collect::<String>()
                );
            }
        }
        DeadLettersCommand::Show { id } => {
            let Some(detail) = letter::show(conn, &TRIAGER, id).await? else {
                eprintln!("dead letter {id} does not exist");
                return Ok(ExitCode::FAILURE);
            };
            println!("{}", serde_json::to_string_pretty(&detail)?);
        }
        DeadLettersCommand::DryRun { select, limit } => {
            let run = replay::dry_run(conn, &TRIAGER, &select.selection(), limit).await?;
            print_dry_run(&run);
        }
        DeadLettersCommand::Replay { .. } | DeadLettersCommand::Archive { .. } => {
            unreachable!("handled by run")
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn exposure_line(sum: &paybus_dead_letter_ops::ExposureSum) -> String {
    let partner = sum
        .partner_id
        .map_or_else(|| "members".to_owned(), |id| format!("partner {id}"));
    let waiting = if sum.needs_a_human.is_zero() {
        String::new()
    } else {
        format!(", {} of it needs a human", sum.needs_a_human)
    };
    format!(
        "{} {} — {} ({} row(s) in {} letter(s){waiting})",
        sum.amount, sum.currency, partner, sum.rows, sum.letters
    )
}

fn print_dry_run(run: &paybus_dead_letter_ops::DryRun) {
    for classified in &run.letters {
        println!(
            "{:>8}  {:<15}  {}",
            classified.letter.id,
            classified.triage.verdict.to_string(),
            classified.triage.reason
        );
    }
    println!(
        "dry run: {} safe to replay, {} already applied, {} need a human{}",
        run.safe,
        run.already_applied,
        run.needs_human,
        if run.remaining > 0 {
            format!(" ({} more not classified: raise --limit)", run.remaining)
        } else {
            String::new()
        }
    );
}

async fn replay(
    settings: &Settings,
    selection: Selection,
    options: ReplayOptions,
    yes: bool,
    actor: &str,
) -> anyhow::Result<ExitCode> {
    let services = Services::connect(settings.clone())
        .await
        .context("while connecting to the database and the broker")?;
    let run = {
        let mut conn = services.pool.acquire().await?;
        replay::dry_run(&mut conn, &TRIAGER, &selection, options.limit).await?
    };
    print_dry_run(&run);
    if run.safe == 0 {
        println!("nothing is safe to replay");
        return Ok(ExitCode::from(u8::from(
            run.already_applied + run.needs_human > 0,
        )));
    }
    if !yes && !confirm(run.safe)? {
        println!("nothing replayed");
        return Ok(ExitCode::FAILURE);
    }
    let bar = ProgressBar::new(run.letters.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} letters, {per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = replay::replay(
        &services.outbox,
        &TRIAGER,
        &selection,
        actor,
        options,
        |result| {
            bar.inc(1);
            if result.verdict != Some(Verdict::Safe) {
                bar.println(format!(
                    "{:>8}  not sent ({}): {}",
                    result.id, result.result, result.detail
                ));
            }
        },
    )
    .await
    .context("while replaying")?;
    bar.finish_and_clear();
    println!(
        "replayed {}, already applied {}, need a human {}, no longer NEW {}{}",
        report.replayed,
        report.already_applied,
        report.needs_human,
        report.skipped,
        if report.remaining > 0 {
            format!(
                "; {} more NEW in the selection: run again",
                report.remaining
            )
        } else {
            String::new()
        }
    );
    Ok(if report.already_applied + report.needs_human > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn confirm(safe: u64) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        anyhow::bail!("not a terminal: pass --yes to replay without the question");
    }
    eprint!("replay the {safe} safe letter(s)? [y/N] ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}
