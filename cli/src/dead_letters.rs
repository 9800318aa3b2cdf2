//! `paybus dead-letters`: the admin API's `/v1/admin/dead-letters` for ops (each subcommand is
//! in docs/operations.md, "Commands"). What changes something (replay, archive, approve,
//! execute) is a call to the API as the signed-in person (`crate::api_client`); the reads go
//! straight to the database.
//!
//! `replay` and `archive` freeze the dry run into an operation and print it, ask before acting
//! (`--yes` skips the question; without a terminal it is required), then execute it with a
//! progress bar. Under four-eyes (the API's `PAYBUS_FOUR_EYES`) they stop at the operation:
//! another person approves it (`approve <id> --hash H`) and anyone then runs `execute <id>`.
//! `recount` sets the groups' counts to what the NEW letters are, after the audit check
//! `dead_letter_group_counts` found them drifted.
//!
//! Exit 1 when a replay left letters that need a human or are already applied.

use std::{io::IsTerminal, process::ExitCode, time::Duration};

use indicatif::{ProgressBar, ProgressStyle};
use paybus_bus::dead_letter::group_counts;
use paybus_config::Settings;
use paybus_db as db;
use paybus_dead_letter_ops::{
    ListFilter, OperationAction, OperationStatus, Selection, Triager, detail, groups, letter,
    operation, replay,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api_client::{ApiArgs, ApiClient};

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

    /// The selection as the operations route takes it: `ids` or `group`.
    fn request_fields(self) -> (&'static str, Value) {
        match self.selection() {
            Selection::Group { function, reason } => {
                ("group", json!({ "function": function, "reason": reason }))
            }
            Selection::Ids(ids) => ("ids", json!(ids)),
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
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Archive the selected NEW letters.
    Archive {
        #[command(flatten)]
        select: Select,
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
        #[command(flatten)]
        api: ApiArgs,
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
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Execute (or resume) an operation until every letter has its result.
    Execute {
        id: uuid::Uuid,
        #[arg(long, default_value_t = 10.0)]
        per_second: f64,
        #[command(flatten)]
        api: ApiArgs,
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
            api,
        } => {
            let pace = Pace::new(per_second)?;
            let client = ApiClient::connect(&api).await?;
            let requested = request(&client, OperationAction::Replay, select, limit).await?;
            print_operation(&requested);
            if requested.safe == 0 {
                println!("nothing is safe to replay");
                return Ok(ExitCode::from(u8::from(
                    requested.already_applied + requested.needs_human > 0,
                )));
            }
            if requested.operation.status == OperationStatus::AwaitingApproval {
                return Ok(awaiting_approval(&requested.operation));
            }
            if !yes && !confirm(requested.safe)? {
                println!(
                    "nothing replayed (operation {} stays READY)",
                    requested.operation.id
                );
                return Ok(ExitCode::FAILURE);
            }
            execute(&client, requested.operation.id, pace).await
        }
        DeadLettersCommand::Archive { select, limit, api } => {
            let client = ApiClient::connect(&api).await?;
            let requested = request(&client, OperationAction::Archive, select, limit).await?;
            if requested.operation.status == OperationStatus::AwaitingApproval {
                print_operation(&requested);
                return Ok(awaiting_approval(&requested.operation));
            }
            execute(&client, requested.operation.id, Pace::ARCHIVE).await
        }
        DeadLettersCommand::Approve { id, hash, api } => {
            let client = ApiClient::connect(&api).await?;
            let approved: Operation = client
                .post(
                    &format!("/v1/admin/dead-letters/operations/{id}/approve"),
                    Some(&json!({ "hash": hash })),
                )
                .await?
                .parse()?;
            println!(
                "operation {id} approved by {} (requested by {}): run `paybus dead-letters \
                 execute {id}`",
                approved.approved_by.as_deref().unwrap_or("you"),
                approved.requested_by
            );
            Ok(ExitCode::SUCCESS)
        }
        DeadLettersCommand::Execute {
            id,
            per_second,
            api,
        } => {
            let pace = Pace::new(per_second)?;
            let client = ApiClient::connect(&api).await?;
            execute(&client, id, pace).await
        }
        read_only => {
            let pool = db::connect(&settings.database).await?;
            read(&pool, read_only).await
        }
    }
}

/// How an execution is paced: the API takes `per_second` letters a second, `page` letters a
/// call, so each call answers within seconds and the progress bar moves between calls.
#[derive(Debug, Clone, Copy)]
struct Pace {
    per_second: f64,
    page: u32,
}

impl Pace {
    /// Archiving sends nothing: as fast as the API paces anything (100 a second), two
    /// seconds a call.
    const ARCHIVE: Pace = Pace {
        per_second: 100.0,
        page: 200,
    };

    /// About two seconds of letters a call, 1 to 100.
    fn new(per_second: f64) -> anyhow::Result<Self> {
        if !(per_second.is_finite() && per_second > 0.0) {
            anyhow::bail!("--per-second must be above 0");
        }
        let page = (per_second * 2.0).ceil().clamp(1.0, 100.0) as u32;
        Ok(Self { per_second, page })
    }

    /// How long the API takes for one call's letters.
    fn call_work(self) -> Duration {
        Duration::from_secs_f64(f64::from(self.page) / self.per_second)
    }
}

/// An operation as the admin API answers it (the fields the command prints).
#[derive(Debug, Deserialize)]
struct Operation {
    id: uuid::Uuid,
    action: OperationAction,
    status: OperationStatus,
    letters: u32,
    letters_with_money: u32,
    content_hash: String,
    requested_by: String,
    approved_by: Option<String>,
    expires_at: chrono::DateTime<chrono::Utc>,
    done: u32,
}

/// `POST /v1/admin/dead-letters/operations`' answer: the operation's fields and its dry run's.
#[derive(Debug, Deserialize)]
struct Requested {
    #[serde(flatten)]
    operation: Operation,
    safe: u64,
    already_applied: u64,
    needs_human: u64,
    not_included: u64,
    letter_results: Vec<LetterVerdict>,
}

#[derive(Debug, Deserialize)]
struct LetterVerdict {
    dead_letter_id: u64,
    verdict: String,
    reason: String,
}

/// `POST .../operations/{id}/execute`'s answer: what this call did.
#[derive(Debug, Deserialize)]
struct Executed {
    operation: Operation,
    replayed: u64,
    archived: u64,
    already_applied: u64,
    needs_human: u64,
    results: Vec<LetterResult>,
    remaining: u64,
}

#[derive(Debug, Deserialize)]
struct LetterResult {
    id: u64,
    /// `None`: the letter was no longer NEW when its turn came.
    verdict: Option<String>,
    result: String,
    detail: String,
}

async fn request(
    client: &ApiClient,
    action: OperationAction,
    select: Select,
    limit: u32,
) -> anyhow::Result<Requested> {
    let (field, selection) = select.request_fields();
    let mut body = json!({ "action": action.to_string().to_ascii_lowercase(), "limit": limit });
    body[field] = selection;
    client
        .post("/v1/admin/dead-letters/operations", Some(&body))
        .await?
        .parse()
}

fn awaiting_approval(operation: &Operation) -> ExitCode {
    println!(
        "four-eyes: operation {} awaits a second person's approval (until {}); someone else \
         runs:\n  paybus dead-letters approve {} --hash {}\nthen:\n  paybus dead-letters \
         execute {}",
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
            let Some(detail) = detail::show(conn, &TRIAGER, id).await? else {
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

fn print_operation(detail: &Requested) {
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
/// bar (a run cut short is resumed by running this again).
async fn execute(client: &ApiClient, id: uuid::Uuid, pace: Pace) -> anyhow::Result<ExitCode> {
    let path = format!("/v1/admin/dead-letters/operations/{id}/execute");
    let body = json!({ "per_second": pace.per_second, "limit": pace.page });
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} letters, {per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let (mut done, mut unresolved) = (0_u64, 0_u64);
    loop {
        let report: Executed = client
            .post_taking(&path, Some(&body), pace.call_work())
            .await?
            .parse()?;
        bar.set_length(u64::from(report.operation.letters));
        bar.set_position(u64::from(report.operation.done));
        for result in &report.results {
            if result.verdict.as_deref().is_some_and(|v| v != "safe") {
                bar.println(format!(
                    "{:>8}  not sent ({}): {}",
                    result.id, result.result, result.detail
                ));
            }
        }
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
