//! `paybus dead-letters`: the same operations as the admin API's `/v1/admin/dead-letters`,
//! straight on the database (and the broker, for replays).
//!
//! - `groups`: NEW letters by function and reason, with the money at stake.
//! - `list [--function F] [--reason R] [--status NEW|REPLAYED|ARCHIVED] [--before-id N] [--limit N]`
//! - `show <id>`: one letter as JSON (headers, body, referenced rows, verdict, trail).
//! - `dry-run (--id N ... | --function F --reason R)`: each letter classified; nothing written.
//! - `replay (--id N ... | --function F --reason R) [--per-second 10] [--limit 500] [--yes]`:
//!   freezes the dry run into an operation and prints it, asks before sending (`--yes` skips
//!   the question; without a terminal it is required), then executes it with a progress bar.
//!   Under four-eyes (`PAYBUS_FOUR_EYES`) it stops at the operation: another person approves
//!   it (`approve <id> --hash H`) and anyone then runs `execute <id>`.
//! - `archive (--id N ... | --function F --reason R)`: the same, for an archive (four-eyes only
//!   when a letter has money at stake).
//! - `operations`, `operation <id>`, `approve <id> --hash H`, `execute <id>`: the operations,
//!   one with its letters, the second person's approval, and executing (or resuming) one.
//! - `recount`: sets the groups' counts to what the NEW letters are (after the audit check
//!   `dead_letter_group_counts` found them drifted), printing each group it corrected.
//!
//! Exit 1 when a replay left letters that need a human or are already applied.

use std::{io::IsTerminal, process::ExitCode};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use paybus_dead_letter_ops::{
    ExecuteOptions, ListFilter, OperationAction, OperationDetail, OperationStatus, Selection,
    Triager, groups, letter, operation, replay,
};
use paybus_platform::{
    Settings,
    bus::{Services, dead_letter::group_counts},
    db,
    triage::Verdict,
};

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
    /// Recent operations (frozen dry runs), newest first.
    Operations {
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
    },
    /// One operation as JSON: its letters with their verdicts and results.
    Operation { id: uuid::Uuid },
    /// Approve another person's operation (four-eyes), by the hash you saw.
    Approve {
        id: uuid::Uuid,
        #[arg(long)]
        hash: String,
        #[arg(long, env = "USER", default_value = "cli")]
        actor: String,
    },
    /// Execute (or resume) an operation until every letter has its result.
    Execute {
        id: uuid::Uuid,
        #[arg(long, default_value_t = 10.0)]
        per_second: f64,
        #[arg(long, env = "USER", default_value = "cli")]
        actor: String,
    },
    /// Set the groups' counts to what the NEW letters are, while writers keep writing (when
    /// the audit found them drifted: SQL by hand, an older paybus during a deploy).
    Recount,
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
            let options = ExecuteOptions {
                per_second: checked_rate(per_second)?,
                limit,
            };
            let services = connect(settings).await?;
            let requested =
                request(&services, OperationAction::Replay, select, limit, &actor).await?;
            print_operation(&requested);
            if requested.safe == 0 {
                println!("nothing is safe to replay");
                return Ok(ExitCode::from(u8::from(
                    requested.already_applied + requested.needs_human > 0,
                )));
            }
            if requested.operation.status == OperationStatus::AwaitingApproval {
                return Ok(awaiting_approval(&requested));
            }
            if !yes && !confirm(requested.safe)? {
                println!(
                    "nothing replayed (operation {} stays READY)",
                    requested.operation.id
                );
                return Ok(ExitCode::FAILURE);
            }
            execute(&services, requested.operation.id, options, &actor).await
        }
        DeadLettersCommand::Archive {
            select,
            limit,
            actor,
        } => {
            let services = connect(settings).await?;
            let requested =
                request(&services, OperationAction::Archive, select, limit, &actor).await?;
            if requested.operation.status == OperationStatus::AwaitingApproval {
                print_operation(&requested);
                return Ok(awaiting_approval(&requested));
            }
            let options = ExecuteOptions {
                per_second: 1_000.0,
                limit,
            };
            execute(&services, requested.operation.id, options, &actor).await
        }
        DeadLettersCommand::Approve { id, hash, actor } => {
            let pool = db::connect(&settings.database).await?;
            let mut conn = pool.acquire().await?;
            let approved = operation::approve(&mut conn, id, &actor, &hash)
                .await
                .context("while approving")?;
            println!(
                "operation {id} approved by {actor} (requested by {}): run `paybus dead-letters \
                 execute {id}`",
                approved.requested_by
            );
            Ok(ExitCode::SUCCESS)
        }
        DeadLettersCommand::Execute {
            id,
            per_second,
            actor,
        } => {
            let options = ExecuteOptions {
                per_second: checked_rate(per_second)?,
                limit: letter::MAX_PAGE,
            };
            let services = connect(settings).await?;
            execute(&services, id, options, &actor).await
        }
        read_only => {
            let pool = db::connect(&settings.database).await?;
            read(&pool, read_only).await
        }
    }
}

fn checked_rate(per_second: f64) -> anyhow::Result<f64> {
    if !(per_second.is_finite() && per_second > 0.0) {
        anyhow::bail!("--per-second must be above 0");
    }
    Ok(per_second)
}

async fn connect(settings: &Settings) -> anyhow::Result<Services> {
    Services::connect(settings.clone())
        .await
        .context("while connecting to the database and the broker")
}

async fn request(
    services: &Services,
    action: OperationAction,
    select: Select,
    limit: u32,
    actor: &str,
) -> anyhow::Result<OperationDetail> {
    let four_eyes = paybus_platform::approvals::FourEyes::from_env()?;
    Ok(operation::request(
        &services.pool,
        &TRIAGER,
        action,
        &select.selection(),
        actor,
        limit,
        &four_eyes,
    )
    .await?)
}

fn awaiting_approval(requested: &OperationDetail) -> ExitCode {
    let operation = &requested.operation;
    println!(
        "four-eyes: operation {} awaits a second person's approval (until {}):\n  paybus \
         dead-letters approve {} --hash {} --actor <someone else>\nthen:\n  paybus \
         dead-letters execute {}",
        operation.id,
        operation.expires_at.to_rfc3339(),
        operation.id,
        operation.content_hash,
        operation.id
    );
    ExitCode::SUCCESS
}

async fn read(pool: &sqlx::MySqlPool, command: DeadLettersCommand) -> anyhow::Result<ExitCode> {
    let mut conn = pool.acquire().await?;
    let conn = &mut *conn;
    match command {
        DeadLettersCommand::Groups => {
            let overview = groups::overview(pool, &TRIAGER).await?;
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
            let run = replay::dry_run(pool, &TRIAGER, &select.selection(), limit).await?;
            print_dry_run(&run);
        }
        DeadLettersCommand::Operations { limit } => {
            for op in operation::list(conn, limit).await? {
                println!(
                    "{}  {:<7}  {:<17}  {}/{} letter(s)  by {}{}  {}",
                    op.id,
                    op.action,
                    if op.expired {
                        "EXPIRED".to_owned()
                    } else {
                        op.status.to_string()
                    },
                    op.done,
                    op.letters,
                    op.requested_by,
                    op.approved_by
                        .as_deref()
                        .map(|b| format!(", approved by {b}"))
                        .unwrap_or_default(),
                    op.requested_at.to_rfc3339()
                );
            }
        }
        DeadLettersCommand::Operation { id } => {
            let Some(detail) = operation::show(conn, id).await? else {
                eprintln!("operation {id} does not exist");
                return Ok(ExitCode::FAILURE);
            };
            println!("{}", serde_json::to_string_pretty(&detail)?);
        }
        DeadLettersCommand::Recount => {
            let corrected = group_counts::recount(pool).await?;
            if corrected.is_empty() {
                println!("every group's counts were right");
            }
            for drift in &corrected {
                println!(
                    "{} / {}: {} letter(s) and {} failure(s), counted as {} and {}",
                    drift.function_name,
                    drift.reason,
                    drift.letters,
                    drift.failures,
                    drift.counted_letters,
                    drift.counted_failures
                );
            }
        }
        DeadLettersCommand::Replay { .. }
        | DeadLettersCommand::Archive { .. }
        | DeadLettersCommand::Approve { .. }
        | DeadLettersCommand::Execute { .. } => {
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

fn print_operation(detail: &OperationDetail) {
    for letter in &detail.letter_results {
        println!(
            "{:>8}  {:<15}  {}",
            letter.dead_letter_id, letter.verdict, letter.reason
        );
    }
    let operation = &detail.operation;
    println!(
        "operation {} ({}, {}): {} letter(s) — {} safe to replay, {} already applied, {} need a \
         human; {} with money at stake; hash {}{}",
        operation.id,
        operation.action,
        operation.status,
        operation.letters,
        detail.safe,
        detail.already_applied,
        detail.needs_human,
        operation.letters_with_money,
        operation.content_hash,
        if detail.not_included > 0 {
            format!(
                " ({} more NEW letter(s) not in it: raise --limit)",
                detail.not_included
            )
        } else {
            String::new()
        }
    );
}

/// Executes operation `id` call after call until every letter has its result, with a progress
/// bar (a call cut short is resumed by running this again).
async fn execute(
    services: &Services,
    id: uuid::Uuid,
    options: ExecuteOptions,
    actor: &str,
) -> anyhow::Result<ExitCode> {
    let total = {
        let mut conn = services.pool.acquire().await?;
        operation::show(&mut conn, id)
            .await?
            .with_context(|| format!("operation {id} does not exist"))?
    };
    let bar = ProgressBar::new(u64::from(total.operation.letters)).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} letters, {per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_position(u64::from(total.operation.done));
    let (mut done, mut unresolved) = (0_u64, 0_u64);
    loop {
        let report = operation::execute(&services.outbox, &TRIAGER, id, actor, options, |result| {
            bar.inc(1);
            if result.verdict.is_some_and(|v| v != Verdict::Safe) {
                bar.println(format!(
                    "{:>8}  not sent ({}): {}",
                    result.id, result.result, result.detail
                ));
            }
        })
        .await
        .context("while executing the operation")?;
        done += report.replayed + report.archived;
        unresolved += report.already_applied + report.needs_human;
        if report.remaining == 0 || report.results.is_empty() {
            bar.finish_and_clear();
            println!(
                "operation {id} {}: {done} letter(s) acted on by this run, {unresolved} left for \
                 a human or already applied; {}/{} done",
                report.operation.status, report.operation.done, report.operation.letters
            );
            break;
        }
    }
    Ok(if unresolved > 0 {
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
