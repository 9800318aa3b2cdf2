//! `paybus`: the operator's command line (docs/operations.md, "Commands"). It runs the platform
//! locally (`run`, `serve`), deploys what the catalog derives (`migrate`, `topology`,
//! `template`, `catalog`, `settings`, `openapi`), checks (`doctor`, `audit`, `reconcile`,
//! `ping`), and works the ops routes (`dead-letters`, `jobs`, `approvals`, `functions`,
//! `suspension`, `trace`, `ops-log`, `secrets`) as the person `paybus login` signed in.

mod api_client;
mod approvals;
mod configuration_page;
mod credentials;
mod dead_letters;
mod doctor;
mod functions;
mod jobs;
mod login;
mod oidc;
mod ops_log;
mod p2p;
mod secrets;
mod suspension;
mod trace;

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use paybus_api::ApiConfig;
use paybus_bus::{Services, shutdown_on_signal, topology as bus_topology};
use paybus_config::Settings;
use paybus_db as db;
use paybus_ops::audit;
use paybus_runtime::runner::Runner;
use paybus_telemetry as telemetry;

/// Every command that changes something calls the admin API as the person `paybus login`
/// signed in (`api_client`); what needs the database itself and moves no money (migrate,
/// doctor, topology, audit) and the reads go to the database directly.
#[derive(Parser)]
#[command(
    name = "paybus",
    version = paybus_config::build::VERSION_AND_COMMIT,
    about = "The asynchronous back office of a payments backend"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply every pending database migration (safe to repeat).
    Migrate,
    /// Secrets sealed at rest: have the API re-seal them under its current PAYBUS_SECRETS_KEY.
    #[command(subcommand)]
    Secrets(secrets::SecretsCommand),
    /// Sign in for the commands that change something: a code to enter in a browser at the
    /// API's OpenID provider (the device authorization grant); the tokens are kept in
    /// $XDG_CONFIG_HOME/paybus/credentials.json (0600) and renewed as they expire.
    Login {
        #[command(flatten)]
        api: api_client::ApiArgs,
    },
    /// Sign out: revoke the refresh token at the provider and delete the stored sign-in.
    Logout,
    /// Whom the token the commands send names, and until when (read from the token, not
    /// verified: the API verifies it on every call).
    Whoami,
    /// Check that the database and the broker answer; exits non-zero with one line per problem.
    Doctor,
    /// Declare the exchanges and every function's queues in the PAYBUS_SHARDS layout
    /// (idempotent), unbinding the queues of an earlier layout.
    Topology {
        /// Print the topology as a RabbitMQ definitions document instead of declaring it.
        #[arg(long)]
        definitions: bool,
        /// The vhost named in the definitions document.
        #[arg(long, default_value = "/")]
        vhost: String,
        /// The shard layout declared before (PAYBUS_SHARDS's earlier value; "" for none
        /// sharded): its queues that the current layout lacks are unbound and listed with what
        /// they hold.
        #[arg(long, value_name = "LAYOUT", value_parser = parse_shards, conflicts_with = "definitions")]
        previous_shards: Option<paybus_config::Shards>,
        /// Then move what those retired queues still hold back into paybus.events (run it once
        /// their consumers are gone).
        #[arg(long, requires = "previous_shards")]
        drain_retired: bool,
    },
    /// Run every function's consumer, the dead-letter recorders and the sweeper in this
    /// process until SIGTERM or Ctrl-C.
    Run,
    /// Serve the HTTP API (and its console) alone, without the consumers: where the functions
    /// run as Lambdas or in other processes.
    Serve,
    /// Print the HTTP API's OpenAPI 3 document (shipped as api/openapi.json).
    Openapi,
    /// Check every workflow's invariants (the ledger's, seed 001 §7, and more), and paybus's
    /// effects against counterparties' records (the quote service's trades) since `--since`;
    /// exits non-zero listing each violation.
    Audit {
        /// How far back the counterparty checks look, e.g. `30m`, `24h`, `7d`.
        #[arg(long, default_value = "24h", value_parser = parse_ttl)]
        since: std::time::Duration,
    },
    /// P2P deposit orders (p2p, W1): ask the quote service again about one in doubt.
    #[command(subcommand)]
    P2p(p2p::P2pCommand),
    /// Compare paybus's effects with a counterparty's own record.
    #[command(subcommand)]
    Reconcile(p2p::ReconcileCommand),
    /// Print the function catalog as the README's markdown table.
    Catalog,
    /// Print the configuration page (docs/configuration.md): every setting, its default and
    /// what it does, from the code's declarations.
    Settings,
    /// Charge-event bonus jobs (bonuses, W3): list those waiting for a retry or for ops, show one, retry
    /// a FAILED one.
    #[command(subcommand)]
    Jobs(jobs::JobsCommand),
    /// Print the AWS SAM template derived from the catalog (infra/aws/template.yaml), in the
    /// PAYBUS_SHARDS layout (one trigger per shard).
    Template {
        /// Print the template's Lambda binaries instead, one a line (infra/aws/package.sh).
        #[arg(long)]
        binaries: bool,
    },
    /// Dead letters: grouped with the money at stake, shown, dry-run, replayed (only the safe
    /// ones, rate-limited, with a progress bar) and archived.
    #[command(subcommand)]
    DeadLetters(dead_letters::DeadLettersCommand),
    /// Pause or resume a function's consumption in every process (its messages wait in its
    /// queue), or list which are paused.
    #[command(subcommand)]
    Functions(functions::FunctionsCommand),
    /// Where did this money go: one withdrawal's, deposit's, deposit order's or bonus job's
    /// timeline across functions (transitions, ledger, webhook, dead letters, ops actions).
    Trace(trace::TraceArgs),
    /// Four-eyes: list, approve and execute the guarded actions others asked for (bonus job
    /// retries, suspension re-runs, market resumes).
    #[command(subcommand)]
    Approvals(approvals::ApprovalsCommand),
    /// Every ops action (pauses, retries, suspensions, ...) with who did it, newest first; the
    /// chain of hashes that makes an edit visible is checked by `paybus audit`.
    OpsLog(ops_log::OpsLogArgs),
    /// Admin API role tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Print the `X-Paybus-Signature` value of `body` signed now with
    /// PAYBUS_CHAIN_MONITOR_SECRET, as the chain monitor signs its webhooks (for trying the
    /// intake by hand).
    Sign {
        /// The exact request body that will be sent.
        body: String,
    },
    /// A market suspension's progress (markets, W4): the tasks by state, or a live progress bar.
    #[command(subcommand)]
    Suspension(suspension::SuspensionCommand),
    /// Send a canary ping through outbox, broker and consumer, and wait for its pong.
    Ping {
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Mint a token signed with PAYBUS_ADMIN_JWT_SECRET and print it (for `Authorization:
    /// Bearer <token>`).
    Issue {
        /// OPS (reads) or ADMIN (changes and reads); repeat for several.
        #[arg(long = "role", required = true, value_parser = parse_role)]
        roles: Vec<paybus_api::role::Role>,
        /// Who the token is for (shown in the admin API's log lines).
        #[arg(long, default_value = "ops")]
        subject: String,
        /// How long it is valid, e.g. `30m`, `8h`, `7d`.
        #[arg(long, default_value = "8h", value_parser = parse_ttl)]
        ttl: std::time::Duration,
    },
}

fn parse_shards(text: &str) -> Result<paybus_config::Shards, String> {
    paybus_config::Shards::parse(text)
}

fn parse_role(text: &str) -> Result<paybus_api::role::Role, String> {
    text.to_ascii_uppercase()
        .parse()
        .map_err(|_| format!("{text:?} is not a role: OPS or ADMIN"))
}

pub(crate) fn parse_ttl(text: &str) -> Result<std::time::Duration, String> {
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 30m, 8h or 7d"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("{text:?} is not a duration like 30m, 8h or 7d")),
    };
    Ok(std::time::Duration::from_secs(
        number.saturating_mul(seconds),
    ))
}

/// The sweeper's allocator (functions/sweeper/src/main.rs): `run` hosts its passes, `serve`
/// is the API.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("paybus: {e}");
            return ExitCode::from(2);
        }
    };
    telemetry::init(settings.log_format);
    let result = match cli.command {
        Command::Migrate => migrate(&settings).await,
        Command::Doctor => doctor::run(&settings).await,
        Command::Secrets(command) => secrets::run(command).await,
        Command::Login { api } => login::login(&api).await,
        Command::Logout => login::logout().await,
        Command::Whoami => login::whoami().await,
        Command::Topology {
            definitions,
            vhost,
            previous_shards,
            drain_retired,
        } => {
            topology(
                &settings,
                definitions,
                &vhost,
                previous_shards,
                drain_retired,
            )
            .await
        }
        Command::Run => run(settings).await,
        Command::Serve => serve(settings).await,
        Command::Openapi => print_openapi(),
        Command::Audit { since } => run_audit(&settings, since).await,
        Command::P2p(command) => p2p::run(command).await,
        Command::Reconcile(command) => p2p::reconcile(&settings, command).await,
        Command::Catalog => {
            print!("{}", paybus_catalog::markdown_table());
            Ok(ExitCode::SUCCESS)
        }
        Command::Settings => configuration_page::print(),
        Command::Jobs(command) => jobs::run(&settings, command).await,
        Command::Template { binaries: false } => template(&settings),
        Command::Template { binaries: true } => {
            for lambda in paybus_catalog::sam::deployables() {
                println!("{}", lambda.binary);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::DeadLetters(command) => dead_letters::run(&settings, command).await,
        Command::Sign { body } => sign(&body),
        Command::Token(TokenCommand::Issue {
            roles,
            subject,
            ttl,
        }) => issue_token(&roles, &subject, ttl),
        Command::Ping { timeout } => ping(settings, timeout).await,
        Command::Suspension(command) => suspension::run(&settings, command).await,
        Command::Functions(command) => functions::run(&settings, command).await,
        Command::OpsLog(args) => ops_log::run(&settings, args).await,
        Command::Approvals(command) => approvals::run(&settings, command).await,
        Command::Trace(args) => trace::run(&settings, args).await,
    };
    // The spans of the last moments (the shutdown itself) would otherwise die with the
    // exporter's thread.
    if telemetry::tracing_enabled() {
        let _ = tokio::task::spawn_blocking(telemetry::shutdown).await;
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("paybus: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn migrate(settings: &Settings) -> anyhow::Result<ExitCode> {
    let pool = db::connect(&settings.database).await?;
    paybus_runtime::migrations::apply_within(&pool, settings.database.migration_lock_wait)
        .await
        .context("while applying migrations")?;
    // SQL cannot encrypt: the partners' plaintext webhook secrets are sealed here.
    let sealer = secrets::sealer_from_env()?;
    let mut conn = pool.acquire().await?;
    let sealed = paybus_partners::webhook_secrets::seal_plaintext(&mut conn, sealer.as_ref())
        .await
        .context("while sealing plaintext partner webhook secrets")?
        .sealed;
    println!(
        "migrations: {} known, all applied to {}",
        db::MIGRATOR.iter().count(),
        paybus_config::redact::url(&settings.database.url)
    );
    if sealed > 0 {
        println!("partner webhook secrets sealed: {sealed}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn topology(
    settings: &Settings,
    definitions: bool,
    vhost: &str,
    previous: Option<paybus_config::Shards>,
    drain_retired: bool,
) -> anyhow::Result<ExitCode> {
    let shards = &settings.broker.shards;
    paybus_catalog::check_shards(shards)?;
    let queues = paybus_catalog::queues(shards);
    if definitions {
        let document = bus_topology::definitions(vhost, &queues);
        println!("{}", serde_json::to_string_pretty(&document)?);
        return Ok(ExitCode::SUCCESS);
    }
    let services = Services::connect(settings.clone()).await?;
    services.declare_topology(&queues).await?;
    println!(
        "topology declared: {} function queue(s) with their dead-letter queues{}",
        queues.len(),
        if shards.is_empty() {
            String::new()
        } else {
            format!(" (PAYBUS_SHARDS={shards})")
        }
    );
    let Some(previous) = previous else {
        return Ok(ExitCode::SUCCESS);
    };
    paybus_catalog::check_shards(&previous)?;
    let retired = services
        .retire(&queues, &paybus_catalog::queues(&previous))
        .await?;
    if retired.is_empty() {
        println!("no queue of the previous layout ({previous}) is retired");
    }
    for queue in &retired {
        if drain_retired && queue.messages > 0 {
            let moved = bus_topology::drain(&services.connection(), &queue.queue)
                .await
                .with_context(|| format!("while draining {}", queue.queue))?;
            println!(
                "retired {}: {moved} message(s) moved back into paybus.events",
                queue.queue
            );
        } else {
            println!(
                "retired {} (an earlier shard layout's; unbound): {} message(s){}",
                queue.queue,
                queue.messages,
                if queue.messages > 0 {
                    ": move them with --drain-retired once its consumers are gone"
                } else {
                    ": empty, delete it when you like"
                }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn template(settings: &Settings) -> anyhow::Result<ExitCode> {
    paybus_catalog::check_shards(&settings.broker.shards)?;
    print!(
        "{}",
        paybus_catalog::sam::template_yaml_with(&settings.broker.shards)
    );
    Ok(ExitCode::SUCCESS)
}

async fn run(settings: Settings) -> anyhow::Result<ExitCode> {
    let api_config = ApiConfig::from_env()?;
    let shutdown = shutdown_on_signal();
    let api = paybus_api::process::Listening::bind(&api_config, &shutdown).await?;
    let Some(services) = api
        .connect(settings, &shutdown)
        .await
        .context("while connecting to the database and the broker")?
    else {
        api.stopped().await?;
        return Ok(ExitCode::SUCCESS);
    };
    let mut runner = Runner::new(services.clone());
    paybus_catalog::register(&mut runner)?;
    api.declare_topology(&services).await?;
    let state = paybus_api::process::catalog_state(&services, &api_config)
        .context("while building the HTTP API")?;
    api.ready(state);
    tracing::info!("paybus running; Ctrl-C or SIGTERM stops it after in-flight messages");
    let consumers = runner.run(shutdown.clone()).await;
    // Whichever stops first (a signal, or a part that could not start) stops the other.
    shutdown.cancel();
    let api = api.stopped().await;
    consumers?;
    api.context("the HTTP API stopped")?;
    Ok(ExitCode::SUCCESS)
}

fn print_openapi() -> anyhow::Result<ExitCode> {
    let document = serde_json::to_string_pretty(&paybus_api::openapi::document())?;
    println!("{document}");
    Ok(ExitCode::SUCCESS)
}

async fn serve(settings: Settings) -> anyhow::Result<ExitCode> {
    let api_config = ApiConfig::from_env()?;
    paybus_api::process::serve_until_stopped(settings, api_config, shutdown_on_signal())
        .await
        .context("the HTTP API stopped")?;
    Ok(ExitCode::SUCCESS)
}

async fn ping(settings: Settings, timeout: u64) -> anyhow::Result<ExitCode> {
    let services = Services::connect(settings).await?;
    let started = std::time::Instant::now();
    let ping_id = paybus_canary::send_ping(&services.outbox).await?;
    let deadline = started + std::time::Duration::from_secs(timeout);
    while std::time::Instant::now() < deadline {
        if paybus_canary::is_ponged(&services.pool, ping_id).await? {
            println!(
                "pong: ping {ping_id} went through outbox, broker and consumer in {:?}",
                started.elapsed()
            );
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    eprintln!(
        "no pong for ping {ping_id} within {timeout}s: is `paybus run` (or the canary function) \
         running? A ping sent before its queue was bound is an `unrouted` dead letter \
         (`paybus dead-letters list`)."
    );
    Ok(ExitCode::FAILURE)
}

fn issue_token(
    roles: &[paybus_api::role::Role],
    subject: &str,
    ttl: std::time::Duration,
) -> anyhow::Result<ExitCode> {
    let Some(secret) = ApiConfig::from_env()?.admin_jwt_secret else {
        anyhow::bail!("PAYBUS_ADMIN_JWT_SECRET is not set: nothing to sign tokens with");
    };
    println!(
        "{}",
        paybus_api::auth::issue(secret.expose(), subject, roles, ttl)?
    );
    Ok(ExitCode::SUCCESS)
}

fn sign(body: &str) -> anyhow::Result<ExitCode> {
    let Some(secret) = ApiConfig::from_env()?.chain_monitor_secret else {
        anyhow::bail!("PAYBUS_CHAIN_MONITOR_SECRET is not set: nothing to sign with");
    };
    let now = chrono::Utc::now().timestamp();
    println!(
        "{}",
        paybus_config::signature::sign(secret.expose().as_bytes(), now, body.as_bytes())
    );
    Ok(ExitCode::SUCCESS)
}

async fn run_audit(settings: &Settings, since: std::time::Duration) -> anyhow::Result<ExitCode> {
    let pool = db::connect(&settings.database).await?;
    let external = paybus_catalog::external_checks(&settings.vars)?;
    // One snapshot for every check, so they agree with each other.
    let mut tx = pool.begin().await?;
    let (from, until) = looking_back(&mut tx, since).await?;
    let mut violations = audit::run(&mut tx, &paybus_catalog::audit_checks())
        .await
        .context("while running the audit")?;
    for check in &external {
        let period = audit::Period { since: from, until };
        violations.extend(
            check
                .run(&mut tx, period)
                .await
                .with_context(|| format!("while running {}", check.name()))?,
        );
    }
    tx.rollback().await?;
    if violations.is_empty() {
        println!("audit: clean (no violations)");
        return Ok(ExitCode::SUCCESS);
    }
    for violation in &violations {
        println!("violation [{}]: {violation}", violation.check);
    }
    eprintln!("audit: {} violation(s)", violations.len());
    Ok(ExitCode::FAILURE)
}

/// `[now − since, now)` by the database's clock (the one every row's time is written with).
pub(crate) async fn looking_back(
    conn: &mut sqlx::MySqlConnection,
    since: std::time::Duration,
) -> anyhow::Result<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)> {
    let (from, now) = sqlx::query_as("SELECT NOW(6) - INTERVAL ? MICROSECOND, NOW(6)")
        .bind(paybus_retry::clock::micros(since))
        .fetch_one(conn)
        .await?;
    Ok((from, now))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every subcommand, however deep, with its path (`paybus dead-letters approve`).
    fn every_command() -> Vec<(String, clap::Command)> {
        fn walk(path: String, command: &clap::Command, into: &mut Vec<(String, clap::Command)>) {
            for sub in command.get_subcommands() {
                let sub_path = format!("{path} {}", sub.get_name());
                into.push((sub_path.clone(), sub.clone()));
                walk(sub_path, sub, into);
            }
        }
        let mut commands = Vec::new();
        let mut root = Cli::command();
        root.build();
        walk("paybus".to_owned(), &root, &mut commands);
        commands
    }

    /// The commands that change something: each is a call to the admin API.
    const CHANGING: &[&str] = &[
        "paybus dead-letters replay",
        "paybus dead-letters archive",
        "paybus dead-letters approve",
        "paybus dead-letters execute",
        "paybus approvals approve",
        "paybus approvals execute",
        "paybus jobs retry",
        "paybus functions pause",
        "paybus functions resume",
        "paybus p2p recheck",
        "paybus secrets rotate-key",
    ];

    #[test]
    fn no_command_takes_an_actor_and_no_help_mentions_one() {
        let commands = every_command();
        assert!(
            commands.len() > 40,
            "the walk found too little: {}",
            commands.len()
        );
        for (path, mut command) in commands {
            let actor_args: Vec<_> = command
                .get_arguments()
                .filter(|arg| {
                    arg.get_id() == "actor"
                        || arg.get_long() == Some("actor")
                        || arg.get_env().is_some_and(|env| env == "USER")
                })
                .map(|arg| arg.get_id().to_string())
                .collect();
            assert!(actor_args.is_empty(), "{path} takes {actor_args:?}");
            let help = command.render_long_help().to_string();
            assert!(!help.contains("--actor"), "{path} --help:\n{help}");
        }
    }

    #[test]
    fn every_changing_command_calls_the_api_and_says_which() {
        let commands = every_command();
        for changing in CHANGING {
            let (_, command) = commands
                .iter()
                .find(|(path, _)| path == changing)
                .unwrap_or_else(|| panic!("{changing} is not a command"));
            assert!(
                command
                    .get_arguments()
                    .any(|arg| arg.get_long() == Some("api")),
                "{changing} has no --api"
            );
            let help = command.clone().render_long_help().to_string();
            assert!(
                help.contains("PAYBUS_API_URL"),
                "{changing} --help:\n{help}"
            );
        }
    }
}
