//! What a function is to the platform, and the entry point of every function binary.
//!
//! A function crate declares itself once by implementing [`Function`] on its handler: its name
//! and message type (the [`Handler`]), how it is built from the [`Services`] (reading its own
//! settings: a bad one is a [`ConfigError`] naming the variable) and the sweeper jobs it owns.
//! The catalog lists every function as a [`FunctionEntry`] and derives everything else from
//! that list (docs/architecture.md, "Adding a function"). A function's `main.rs` is one line:
//! [`main::<ItsHandler>()`](main); the platform's own deployables are [`sweeper_main`] and
//! [`dead_letters_main`].
//!
//! The same binary runs as a local consumer or, when `AWS_LAMBDA_RUNTIME_API` is set, under
//! `lambda_runtime`. Start-up reads the `_FROM` references ([`secrets`]) and the settings and
//! connects to the database before the first event, so a wrong setting is an init error Lambda
//! reports; the broker connection, most of a cold start, opens in the background in a Lambda
//! ([`Services::start`]).

use std::{process::ExitCode, sync::Arc};

use aws_lambda_events::event::rabbitmq::RabbitMqEvent;
use lambda_runtime::{LambdaEvent, service_fn};
use sqlx::MySqlConnection;

use crate::{
    lambda,
    runner::{Runner, outbox_relay_job},
};
use paybus_bus::{
    Envelope, Handler, Services, StartupError, shutdown_on_signal, topology::FunctionQueue,
};
use paybus_config::{
    ConfigError, LogFormat, Setting, Settings, Shards, Vars, in_lambda,
    secrets::{self, SecretError},
    setting::SettingGroup,
};
use paybus_db as db;
use paybus_maintenance as maintenance;
use paybus_maintenance::Job;
use paybus_ops::{
    audit::ExternalCheck,
    triage::{PrepareReplayFn, PrepareReplayFuture, Triage, TriageError, TriageFn, TriageFuture},
};
use paybus_retry::WorkTable;
use paybus_telemetry as telemetry;

/// A function could not be built at start-up.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A client the function needs (e.g. its HTTP client) could not be built.
    #[error("while building {what}: {source}")]
    Client {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A workflow step as the platform runs and deploys it.
pub trait Function: Handler + Sized {
    /// Builds the handler once at start-up (clients, its own settings).
    fn build(services: &Services) -> Result<Self, BuildError>;

    /// The maintenance jobs this function owns (due retries, reapers, expiry): run by the
    /// sweeper (a scheduled Lambda in AWS) and by `paybus run`.
    fn jobs(_services: &Services) -> Result<Vec<Arc<dyn Job>>, BuildError> {
        Ok(Vec::new())
    }

    /// Checks of this function's effects against a counterparty's own record (W1's fills
    /// against the quote service's trades), built from the function's own settings: run by
    /// the continuous auditor every pass and by `paybus audit`.
    fn external_checks(_vars: &Vars) -> Result<Vec<Arc<dyn ExternalCheck>>, BuildError> {
        Ok(Vec::new())
    }

    /// The retry kit's tables this function works (their due and stuck rows are metrics).
    const WORK_TABLES: &'static [&'static WorkTable] = &[];

    /// The secrets it reads beyond the database's and the broker's: a deployment passes each
    /// as a reference to its secret store and lets the function read exactly those.
    const SECRETS: &'static [Setting] = &[];

    /// The plain settings a deployment must set for it (the rest keep their defaults).
    const DEPLOYED_SETTINGS: &'static [Setting] = &[];

    /// Its own settings, as the configuration page shows them (none: it reads only the
    /// platform's and its domain's).
    const SETTINGS: Option<SettingGroup> = None;

    /// What a replay of one of this function's dead letters would do (`paybus dead-letters`):
    /// read the row `message` refers to and classify it. Without a triage of its own a
    /// function's dead letters all need a human: nothing is replayed blind.
    fn triage(
        conn: &mut MySqlConnection,
        message: Self::Message,
    ) -> impl Future<Output = Result<Triage, TriageError>> + Send {
        let _ = (conn, message);
        std::future::ready(Ok(Triage::needs_human(format!(
            "{} has no dead-letter triage: check the row by hand before replaying",
            Self::FUNCTION
        ))))
    }

    /// What a replay of a dead letter its triage called *safe* must do to the referenced row
    /// first, in the replay's transaction (under the letter's lock, before the message is
    /// re-sent): a FAILED notification made PENDING again, so the re-sent message is delivered
    /// instead of refused. Most functions act on the row as it stands: nothing to do.
    fn prepare_replay(
        conn: &mut MySqlConnection,
        message: Self::Message,
    ) -> impl Future<Output = Result<(), TriageError>> + Send {
        let _ = (conn, message);
        std::future::ready(Ok(()))
    }
}

type AddTo = fn(&mut Runner) -> Result<(), BuildError>;
type Jobs = fn(&Services) -> Result<Vec<Arc<dyn Job>>, BuildError>;
type ExternalChecks = fn(&Vars) -> Result<Vec<Arc<dyn ExternalCheck>>, BuildError>;

/// One line of the catalog: everything the platform derives about one function.
#[derive(Clone, Copy)]
pub struct FunctionEntry {
    /// The function's name; its crate is `functions/<name>`, its queue `paybus.<name>`.
    pub name: &'static str,
    pub queue: FunctionQueue,
    /// The newest version of its message it reads ([`paybus_bus::Message::VERSION`]).
    pub message_version: u16,
    add_to: AddTo,
    jobs: Jobs,
    external_checks: ExternalChecks,
    triage: TriageFn,
    prepare_replay: PrepareReplayFn,
    /// The retry kit's tables the function works.
    pub work_tables: &'static [&'static WorkTable],
    /// What a deployment gives it ([`Function::SECRETS`], [`Function::DEPLOYED_SETTINGS`]).
    pub secrets: &'static [Setting],
    pub deployed_settings: &'static [Setting],
    /// Its own settings' group on the configuration page ([`Function::SETTINGS`]).
    pub settings: Option<SettingGroup>,
}

impl std::fmt::Debug for FunctionEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FunctionEntry")
            .field("name", &self.name)
            .field("queue", &self.queue)
            .field("message_version", &self.message_version)
            .finish()
    }
}

impl FunctionEntry {
    pub const fn of<F: Function>() -> Self {
        Self {
            name: F::FUNCTION,
            queue: FunctionQueue::new(F::FUNCTION, <F::Message as paybus_bus::Message>::TYPE),
            message_version: <F::Message as paybus_bus::Message>::VERSION,
            add_to: add_to::<F>,
            jobs: F::jobs,
            external_checks: F::external_checks,
            triage: triage_body::<F>,
            prepare_replay: prepare_replay_body::<F>,
            work_tables: F::WORK_TABLES,
            secrets: F::SECRETS,
            deployed_settings: F::DEPLOYED_SETTINGS,
            settings: F::SETTINGS,
        }
    }

    /// The function's triage of a dead letter's raw body (see [`Function::triage`]).
    pub fn triage<'c>(&self, conn: &'c mut MySqlConnection, body: &'c [u8]) -> TriageFuture<'c> {
        (self.triage)(conn, body)
    }

    /// What a replay of a *safe* letter's raw body must do first (see
    /// [`Function::prepare_replay`]).
    pub fn prepare_replay<'c>(
        &self,
        conn: &'c mut MySqlConnection,
        body: &'c [u8],
    ) -> PrepareReplayFuture<'c> {
        (self.prepare_replay)(conn, body)
    }

    /// Builds the handler and adds its consumer (and dead-letter recorder) to `runner`.
    pub fn add_to(&self, runner: &mut Runner) -> Result<(), BuildError> {
        (self.add_to)(runner)
    }

    /// The function's maintenance jobs.
    pub fn jobs(&self, services: &Services) -> Result<Vec<Arc<dyn Job>>, BuildError> {
        (self.jobs)(services)
    }

    /// The function's checks against counterparties, with its settings from `vars`.
    pub fn external_checks(&self, vars: &Vars) -> Result<Vec<Arc<dyn ExternalCheck>>, BuildError> {
        (self.external_checks)(vars)
    }
}

/// Parses `body` as the function's envelope and triages its data; a body that is not one
/// needs a human.
fn triage_body<'c, F: Function>(conn: &'c mut MySqlConnection, body: &'c [u8]) -> TriageFuture<'c> {
    Box::pin(async move {
        match serde_json::from_slice::<Envelope<F::Message>>(body) {
            Ok(envelope) => F::triage(conn, envelope.data).await,
            Err(error) => Ok(Triage::needs_human(format!(
                "the body is not a readable {} envelope ({error}): nothing to replay",
                <F::Message as paybus_bus::Message>::TYPE
            ))),
        }
    })
}

/// A body that is not the function's envelope was never *safe*: nothing to prepare.
fn prepare_replay_body<'c, F: Function>(
    conn: &'c mut MySqlConnection,
    body: &'c [u8],
) -> PrepareReplayFuture<'c> {
    Box::pin(async move {
        match serde_json::from_slice::<Envelope<F::Message>>(body) {
            Ok(envelope) => F::prepare_replay(conn, envelope.data).await,
            Err(_) => Ok(()),
        }
    })
}

fn add_to<F: Function>(runner: &mut Runner) -> Result<(), BuildError> {
    let handler = F::build(runner.services())?;
    runner.add_function(handler);
    Ok(())
}

/// Why a function binary stopped.
#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error("lambda runtime: {0}")]
    Lambda(lambda_runtime::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// The process's own service stopped with an error (e.g. the HTTP API's server).
    #[error(transparent)]
    Service(Box<dyn std::error::Error + Send + Sync>),
}

impl FunctionError {
    /// The `errorType` Lambda shows for this error when it stops the init.
    fn init_error_type(&self) -> &'static str {
        match self {
            FunctionError::Config(_)
            | FunctionError::Secret(SecretError::Both { .. })
            | FunctionError::Build(BuildError::Config(_)) => "paybus.ConfigError",
            FunctionError::Secret(SecretError::Fetch { .. }) => "paybus.SecretUnavailable",
            FunctionError::Startup(StartupError::Database(_)) => "paybus.DatabaseUnreachable",
            FunctionError::Startup(StartupError::Broker(_) | StartupError::Amqp { .. }) => {
                "paybus.BrokerUnreachable"
            }
            _ => "paybus.StartupError",
        }
    }

    /// 2 for a configuration mistake (the operator's to fix), 1 for anything else.
    fn exit_code(&self) -> ExitCode {
        match self {
            FunctionError::Config(_)
            | FunctionError::Secret(SecretError::Both { .. })
            | FunctionError::Build(BuildError::Config(_)) => ExitCode::from(2),
            _ => ExitCode::FAILURE,
        }
    }
}

/// Fetches the `_FROM` references, reads the settings and sets up logging (JSON in Lambda).
pub async fn settings() -> Result<Settings, FunctionError> {
    let vars = secrets::resolve(std::env::vars().collect()).await?;
    let settings = Settings::read(&vars)?;
    telemetry::init(if in_lambda() {
        LogFormat::Json
    } else {
        settings.log_format
    });
    Ok(settings)
}

async fn start() -> Result<Services, FunctionError> {
    Ok(Services::connect_waiting(settings().await?).await?)
}

/// Runs `work` on a fresh multi-threaded runtime and turns its error into an exit code (the
/// error on stderr: the one line an operator reads when a process will not start). In a
/// Lambda execution environment an error before the runtime took its first event (any error
/// but the runtime's own) is also reported to Lambda as the init's failure
/// ([`report_init_error`]), so the console and the invocation's error show the reason
/// instead of a bare `Runtime.ExitError`.
pub fn block_on(work: impl Future<Output = Result<(), FunctionError>>) -> ExitCode {
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(FunctionError::Runtime)
        .and_then(|runtime| {
            runtime.block_on(async {
                let result = work.await;
                if telemetry::tracing_enabled() {
                    let _ = tokio::task::spawn_blocking(telemetry::shutdown).await;
                }
                match &result {
                    Err(FunctionError::Lambda(_)) | Ok(()) => {}
                    Err(error) if in_lambda() => report_init_error(error).await,
                    Err(_) => {}
                }
                result
            })
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{error}");
            error.exit_code()
        }
    }
}

/// The Runtime API's init-error endpoint (`POST /2018-06-01/runtime/init/error` on
/// `AWS_LAMBDA_RUNTIME_API`), relative to the API's address.
pub const INIT_ERROR_PATH: &str = "/2018-06-01/runtime/init/error";

/// Tells Lambda why the init failed, as the Runtime API documents: the
/// `Lambda-Runtime-Function-Error-Type` header and a body `{"errorType", "errorMessage"}`
/// (`lambda_runtime` does this itself only for SnapStart hooks; its reporter is not public).
/// Lambda then ends the environment and shows the reason. A report that cannot be sent is
/// logged; the process exits with the error either way.
pub async fn report_init_error(error: &FunctionError) {
    let Some(api) = std::env::var_os("AWS_LAMBDA_RUNTIME_API") else {
        return;
    };
    let diagnostic = lambda_runtime::Diagnostic {
        error_type: error.init_error_type().to_owned(),
        error_message: telemetry::one_line(error),
    };
    let url = format!("http://{}{INIT_ERROR_PATH}", api.to_string_lossy());
    let sent = reqwest::Client::new()
        .post(&url)
        .header("Lambda-Runtime-Function-Error-Type", &diagnostic.error_type)
        .json(&diagnostic)
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await;
    match sent {
        Ok(answer) if answer.status().is_success() => {}
        Ok(answer) => eprintln!(
            "the Runtime API refused the init error: {}",
            answer.status()
        ),
        Err(e) => eprintln!("cannot report the init error to the Runtime API: {e}"),
    }
}

/// The whole `main` of a function binary.
pub fn main<F: Function>() -> ExitCode {
    block_on(run::<F>())
}

/// The whole `main` of the sweeper binary: the outbox relay plus `jobs`.
pub fn sweeper_main(jobs: Jobs) -> ExitCode {
    block_on(run_sweeper(jobs))
}

/// The whole `main` of the dead-letter recorder binary.
pub fn dead_letters_main(queues: fn(&Shards) -> Vec<FunctionQueue>) -> ExitCode {
    block_on(run_dead_letters(queues))
}

/// Builds the services and the handler once, then runs it until SIGTERM (locally) or for the
/// life of the Lambda execution environment.
pub async fn run<F: Function>() -> Result<(), FunctionError> {
    if in_lambda() {
        let services = Services::start(settings().await?).await?;
        return lambda::run(services, F::build)
            .await
            .map_err(FunctionError::Lambda);
    }
    let services = start().await?;
    let handler = F::build(&services)?;
    let mut runner = Runner::new(services);
    runner.add_function(handler);
    runner.run(shutdown_on_signal()).await?;
    Ok(())
}

/// The sweeper: the outbox relay plus every function's maintenance jobs. In AWS it is a
/// scheduled Lambda (EventBridge) and each invocation runs every job once, failing the
/// invocation if one failed; locally each job runs on its own timer until SIGTERM.
pub async fn run_sweeper(jobs: Jobs) -> Result<(), FunctionError> {
    let all_jobs = |services: &Services| -> Result<Vec<Arc<dyn Job>>, BuildError> {
        let mut all: Vec<Arc<dyn Job>> = vec![
            outbox_relay_job(services),
            Arc::new(paybus_maintenance::ActivityFlush::new(
                services.pool.clone(),
            )),
        ];
        all.extend(jobs(services)?);
        Ok(all)
    };
    if !in_lambda() {
        let services = start().await?;
        maintenance::run(all_jobs(&services)?, shutdown_on_signal()).await;
        return Ok(());
    }
    // As a consumer's Lambda: the broker connects while the runtime waits for its first tick.
    let services = &Services::start(settings().await?).await?;
    let built = &tokio::sync::OnceCell::new();
    let all_jobs = &all_jobs;
    lambda_runtime::run(service_fn(
        move |_: LambdaEvent<serde_json::Value>| async move {
            let services = services.ready().await?;
            let all = built
                .get_or_try_init(|| async { all_jobs(services) })
                .await?;
            let mut report = serde_json::Map::new();
            let mut failed = Vec::new();
            for (name, result) in maintenance::run_all_once(all).await {
                match result {
                    Ok(done) => {
                        report.insert(name.to_owned(), done.changed.into());
                    }
                    Err(error) => failed.push(format!("{name}: {error}")),
                }
            }
            if failed.is_empty() {
                Ok(serde_json::Value::Object(report))
            } else {
                Err(lambda_runtime::Error::from(failed.join("; ")))
            }
        },
    ))
    .await
    .map_err(FunctionError::Lambda)
}

/// The dead-letter recorder. In AWS a Lambda whose event source mappings are every function's
/// `.dlq` and `paybus.unrouted` (each message recorded in `dead_letters` once, however often
/// the batch is replayed); locally a consumer of the dead-letter queue of each of `queues`
/// and of `paybus.unrouted`, until SIGTERM.
pub async fn run_dead_letters(
    queues: fn(&Shards) -> Vec<FunctionQueue>,
) -> Result<(), FunctionError> {
    let settings = settings().await?;
    let queues = queues(&settings.broker.shards);
    if in_lambda() {
        // The database only: recording publishes nothing, so no broker connection to open.
        let pool = db::connect(&settings.database)
            .await
            .map_err(StartupError::from)?;
        let concurrency = usize::from(settings.broker.lambda_concurrency);
        let pool = &pool;
        let accepted = &lambda::recorder_queues(&queues);
        tracing::info!(
            function = lambda::DEAD_LETTER_RECORDER,
            "lambda runtime starting"
        );
        return lambda_runtime::run(service_fn(
            move |event: LambdaEvent<RabbitMqEvent>| async move {
                lambda::record_dead_letters(pool, concurrency, accepted, event.payload).await
            },
        ))
        .await
        .map_err(FunctionError::Lambda);
    }
    let mut runner = Runner::new(Services::connect_waiting(settings).await?);
    for queue in queues {
        runner.add_dead_letter_recorder(queue);
    }
    runner.run(shutdown_on_signal()).await?;
    Ok(())
}
